"""Edge functions phi_{o,i}(x) of every KAN family, evaluated by the layers' own Warp kernels, all edges at once.

A KAN layer computes ``y[n, o] = sum_i phi_{o,i}(x[n, i]) (+ bias[o])``. Its kernels never form the edges
separately: they sum over i. The B-spline, UKAN and polynomial layers have a second computation of the same
map (their "gemm" strategy) that does expose them: a Warp kernel expands the inputs into their dense basis
``B [rows, in, K]`` (the SiLU base and the G + k B-splines of each input, or the D + 1 polynomials), and the
output is ``B`` contracted with the coefficients ``W [in, K, out]`` over (i, K). Contracting over K alone,
one batched GEMM over the inputs, gives every edge: ``phi[i, o, n] = sum_m W[i, m, o] B[n, i, m]``. The basis
comes from the same kernels the layers run (the edge engine's differentiable dense basis,
``warpkan.torch_bridge.edge_driver.dense_basis``) and the coefficients from the layers' parameters by torch
ops, so the edges are the layer's own (LUT interpolation, non-uniform grids and the base path included), sum
to its output, and are differentiable in the parameters and in x (what :func:`~warpkan.interpret.
sparsity_penalty` trains through; :func:`edge_functions` returns them without history).

- ``KANLinear``: the B-spline family of its grid, the combined weight ``[base_weight; coef * scaler]``.
- ``UKANLinear``: the coefficient generator's table on the groups the points span (as the layer's dense-range
  forward builds it, by torch ops), then as above.
- ``PolyKANLinear`` / ``ChebyKANLinear``: the polynomial family, exact or LUT as the layer is set.
- ``GRKANLinear``: ``phi_{o,i}(x) = W[o, i] F_i(x)`` with the group-rational kernel giving F for every input.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .. import _checks
from ..kernels import bspline as kb
from ..torch_bridge import GRKANLinear, KANLinear, PolyKANLinear, UKANLinear
from ..torch_bridge._common import matmul_precision
from ..torch_bridge.edge_driver import EdgeSpec, combined_weight, dense_basis
from ..torch_bridge.kan_linear import fuses_base
from ..torch_bridge.poly_ops import basis_spec
from . import _layers

__all__ = ["EdgeFunctions", "edge_functions", "layer_edge_values"]


class EdgeFunctions(NamedTuple):
    """``x`` [n, in]: the points of each input; ``y`` [n, out, in]: ``y[p, o, i] = phi_{o,i}(x[p, i])`` (pykan's
    ``spline_postacts`` layout; a strided view of storage laid out [in, out, n], each edge's curve contiguous)."""

    x: Tensor
    y: Tensor


def edge_functions(layer, x: Tensor | None = None, *, x_range=None, n: int = 1000) -> EdgeFunctions:
    """Every edge function ``phi_{o,i}`` of ``layer`` (base path included, bias excluded: the bias is a
    per-output constant, not part of an edge), evaluated by the layer's own kernels in one batch.

    Where: at the data ``x`` (..., in) when given (each input's edges at that input's values), else at ``n``
    evenly spaced points of ``x_range``: ``(lo, hi)`` for every input or a tensor [in, 2] of per-input
    intervals. Without either, a ``KANLinear``'s own grid interval is used; the other families have no bounded
    domain and need one of them.

    ``layer``: a ``KANLinear``, ``UKANLinear``, ``PolyKANLinear`` / ``ChebyKANLinear``, ``GRKANLinear``, a
    ``SymbolicLayer`` (its numeric edges and its fixed symbolic ones) or a Warp-native layer of those families.
    Returns :class:`EdgeFunctions` ``(x [n, in], y [n, out, in])`` on the layer's device, in its dtype, without
    autograd history.
    """
    from .symbolic import SymbolicLayer

    if not (_layers.is_edge_layer(layer) or isinstance(layer, SymbolicLayer)):
        layers = _layers.network_layers(layer, "layer")
        if len(layers) != 1:
            raise TypeError(f"layer must be a single layer, got a network of {len(layers)} layers")
        layer = layers[0]
    with torch.no_grad():
        points = edge_points(layer, x, x_range, n)
        return EdgeFunctions(points, layer_edge_values(layer, points))


def edge_points(layer, x, x_range, n) -> Tensor:
    """The [points, in] evaluation points of :func:`edge_functions` (see there)."""
    from .symbolic import SymbolicLayer

    numeric = layer.numeric if isinstance(layer, SymbolicLayer) else layer
    dtype, device = _layers.layer_dtype_device(numeric)
    n_in = layer.in_features
    if x is not None:
        if x_range is not None:
            raise ValueError("pass x (data) or x_range, not both")
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.ndim < 1 or x.shape[-1] != n_in:
            raise ValueError(f"x must have shape (..., {n_in}), got {tuple(x.shape)}")
        if x.device != device:
            raise ValueError(f"x must be on the layer's device {device}, got {x.device}")
        if not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
        return x.detach().reshape(-1, n_in).to(dtype).contiguous()
    n = _checks.positive_int("n", n)
    if x_range is None:
        bounds = _layers.default_range(numeric)
        if bounds is None:
            raise ValueError(f"{type(numeric).__name__} has no bounded domain: pass x (data) or x_range")
    else:
        bounds = torch.as_tensor(x_range, dtype=dtype, device=device)
        if bounds.shape == (2,):
            bounds = bounds.expand(n_in, 2)
        if bounds.shape != (n_in, 2):
            raise ValueError(f"x_range must be (lo, hi) or a tensor of shape ({n_in}, 2), got shape "
                             f"{tuple(bounds.shape)}")
        if not (torch.isfinite(bounds).all() and (bounds[:, 1] >= bounds[:, 0]).all()):
            raise ValueError("x_range must be finite intervals with lo <= hi")
    steps = torch.linspace(0, 1, n, dtype=dtype, device=device).unsqueeze(1)
    return (bounds[:, 0] + steps * (bounds[:, 1] - bounds[:, 0])).contiguous()


def layer_edge_values(layer, x: Tensor, numeric_only: bool = False, centered: bool = False) -> Tensor:
    """[n, out, in] edge values of a KAN layer or a ``SymbolicLayer`` at x [n, in] (contiguous, the layer's dtype
    and device), differentiable in the parameters and in x; ``numeric_only``: a SymbolicLayer's numeric edges
    alone (its fixed ones zero). ``centered``: each edge less its value at the first point, the difference taken
    before the contraction with the coefficients, so that an edge whose inputs are all equal is exactly zero
    (the contraction's rounding may differ from one point to the next: a spread of noise otherwise)."""
    from .symbolic import SymbolicLayer

    if isinstance(layer, SymbolicLayer):
        return layer.edge_values(x, numeric_only, centered)
    return _edge_values(layer, x, centered)


def _edge_values(layer, x: Tensor, centered: bool = False) -> Tensor:
    """[n, out, in] edge values of a KAN layer at x [n, in] (see :func:`layer_edge_values`)."""
    if x.shape[0] == 0:
        return x.new_empty((0, layer.out_features, layer.in_features))
    if isinstance(layer, KANLinear):
        return _bspline_edges(layer, x, centered)
    if isinstance(layer, UKANLinear):
        return _ukan_edges(layer, x, centered)
    if isinstance(layer, PolyKANLinear):
        return _poly_edges(layer, x, centered)
    if isinstance(layer, GRKANLinear):
        return _rational_edges(layer, x, centered)
    _layers.check_edge_layer("layer", layer)


def _less_first(values: Tensor, centered: bool, dim: int) -> Tensor:
    """``values`` less their first entry along ``dim`` (the first point) when ``centered``."""
    return values - values.narrow(dim, 0, 1) if centered else values


def _per_edge(basis: Tensor, weight: Tensor) -> Tensor:
    """basis [in, K, n], weight [in, K, out] -> [n, out, in] (storage [in, out, n]): the contraction over K
    alone, one batched GEMM over the inputs, at full float32 precision."""
    with matmul_precision("fp32", basis.device):
        values = torch.bmm(weight.transpose(1, 2), basis)  # [in, out, n]
    return values.permute(2, 1, 0)


def _scaled_edges(layer, x: Tensor, spec: EdgeSpec, coef: Tensor, centered: bool) -> Tensor:
    """The edges of a scaled edge layer (KANLinear, UKANLinear: base_weight, spline_scaler, the coefficients
    ``coef`` [in, n_coef, out] of the family in ``spec``): its dense basis against the combined weight, the SiLU
    row of each input (where the kernels fuse the base path) as one more basis function, any other base
    activation in torch as in the layer's forward."""
    n_rows, n_in = x.shape
    n_coef, use_base = spec[4], spec[5]
    basis_t = _less_first(dense_basis(x, None, 0, spec), centered, 1)  # [width, n]
    weight = combined_weight(layer.base_weight.t(), layer.spline_scaler.t(), coef, use_base)  # [width, out]
    offset = n_in if use_base else 0
    basis = basis_t[offset:].view(n_in, n_coef, n_rows)
    coefficients = weight[offset:].view(n_in, n_coef, weight.shape[1])
    if use_base:
        basis = torch.cat([basis_t[:n_in].view(n_in, 1, n_rows), basis], dim=1)
        coefficients = torch.cat([weight[:n_in].view(n_in, 1, -1), coefficients], dim=1)
    values = _per_edge(basis, coefficients)
    if layer.use_base and not use_base:
        activation = _less_first(layer.base_activation(x), centered, 0)
        values = values + activation.unsqueeze(1) * layer.base_weight.unsqueeze(0)
    return values


def _bspline_edges(layer: KANLinear, x: Tensor, centered: bool) -> Tensor:
    from ..torch_bridge.bspline_ops import _bspline_frame, _io_scalar

    family = kb.family_of(layer.spline_order, layer._grid_uniform, _io_scalar(x))
    coef = layer.spline_weight.permute(1, 2, 0)  # [in, G + k, out]
    spec = EdgeSpec(family, _bspline_frame, (layer.grid.contiguous(),), (), coef.shape[1],
                    fuses_base(layer.base_activation))
    return _scaled_edges(layer, x, spec, coef, centered)


def _ukan_edges(layer: UKANLinear, x: Tensor, centered: bool) -> Tensor:
    from ..torch_bridge.ukan_ops import _range_args, coefficient_major, group_range, range_table_torch

    group_lo, span = group_range(x.detach(), layer.grid_delta, layer.spline_order)
    w_out, b_out = coefficient_major(layer.cg_out.weight, layer.cg_out.bias, layer.spline_order)
    table = range_table_torch(group_lo, int(span.item()) + 1, layer.pe_dim, layer.feature_embedding,
                              layer.cg_hidden.weight, layer.cg_hidden.bias, w_out, b_out)
    family, make_frame, frame_tensors, frame_config, coef = _range_args(x, group_lo, table, layer.grid_delta,
                                                                        layer.spline_order)
    spec = EdgeSpec(family, make_frame, frame_tensors, frame_config, coef.shape[1], fuses_base(layer.base_activation))
    return _scaled_edges(layer, x, spec, coef, centered)


def _poly_edges(layer: PolyKANLinear, x: Tensor, centered: bool) -> Tensor:
    n_rows, n_in = x.shape
    n_basis = layer.degree + 1
    lut_size = layer.lut_size if layer.mode == "lut" else 0
    spec = basis_spec(x, layer.basis, lut_size, layer.alpha, layer.beta, n_basis)
    basis = _less_first(dense_basis(x, None, 0, spec), centered, 1).view(n_in, n_basis, n_rows)
    return _per_edge(basis, layer.coeffs.permute(0, 2, 1))  # coefficients [in, D + 1, out]


def _rational_edges(layer: GRKANLinear, x: Tensor, centered: bool) -> Tensor:
    activation = _less_first(layer.rational(x), centered, 0)  # [n, in]: F_{group(i)}(x[:, i]), the layer's kernel
    return activation.unsqueeze(1) * layer.linear.weight.unsqueeze(0)
