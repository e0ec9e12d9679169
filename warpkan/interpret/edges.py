"""Edge functions phi_{o,i}(x) of every KAN family, evaluated by the layers' own Warp kernels, all edges at once.

A KAN layer computes ``y[n, o] = sum_i phi_{o,i}(x[n, i]) (+ bias[o])``. Its kernels never form the edges
separately: they sum over i. The B-spline, UKAN and polynomial layers have a second computation of the same
map (their "gemm" strategy) that does expose them: a Warp kernel expands the inputs into their dense basis
``B [rows, in, K]`` (the SiLU base and the G + k B-splines of each input, or the D + 1 polynomials), and the
output is ``B`` contracted with the coefficients ``W [in, K, out]`` over (i, K). Contracting over K alone,
one batched GEMM over the inputs, gives every edge: ``phi[i, o, n] = sum_m W[i, m, o] B[n, i, m]``. The basis
and the combined coefficients come from the same kernels the layers run, so the edges are the layer's own
(LUT interpolation, non-uniform grids and the base path included) and sum to its output.

- ``KANLinear``: ``warpkan.kernels.bspline``'s dense-basis kernels (``launch_expand_basis``,
  ``launch_combine_weights``).
- ``UKANLinear``: its exact ``KANLinear`` on the interval the points span (``UKANLinear.to_kan``), then as
  above.
- ``PolyKANLinear`` / ``ChebyKANLinear``: ``warpkan.kernels.poly``'s dense-basis kernel, exact or LUT as the
  layer is set.
- ``GRKANLinear``: ``phi_{o,i}(x) = W[o, i] F_i(x)`` with the group-rational kernel giving F for every input.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .. import _checks
from ..kernels import bspline as kb
from ..torch_bridge import GRKANLinear, KANLinear, PolyKANLinear, UKANLinear
from ..torch_bridge._common import matmul_precision, to_warp, warp_stream
from ..torch_bridge.kan_linear import fuses_base
from ..torch_bridge.poly_ops import dense_basis as poly_dense_basis
from . import _layers

__all__ = ["EdgeFunctions", "edge_functions"]


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
        if isinstance(layer, SymbolicLayer):
            return EdgeFunctions(points, layer.edge_values(points))
        return EdgeFunctions(points, _edge_values(layer, points))


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


def _edge_values(layer, x: Tensor) -> Tensor:
    """[n, out, in] edge values at x [n, in] (contiguous, the layer's dtype and device)."""
    if isinstance(layer, KANLinear):
        return _bspline_edges(layer, x)
    if isinstance(layer, UKANLinear):
        return _ukan_edges(layer, x)
    if isinstance(layer, PolyKANLinear):
        return _poly_edges(layer, x)
    if isinstance(layer, GRKANLinear):
        return _rational_edges(layer, x)
    _layers.check_edge_layer("layer", layer)


def _per_edge(basis: Tensor, weight: Tensor) -> Tensor:
    """basis [in, K, n], weight [in, K, out] -> [n, out, in] (storage [in, out, n]): the contraction over K
    alone, one batched GEMM over the inputs, at full float32 precision."""
    with matmul_precision("fp32", basis.device):
        values = torch.bmm(weight.transpose(1, 2), basis)  # [in, out, n]
    return values.permute(2, 1, 0)


def _bspline_edges(layer: KANLinear, x: Tensor) -> Tensor:
    n_rows, n_in = x.shape
    n_out, k = layer.out_features, layer.spline_order
    n_coef = layer.grid_size + k
    # the kernels' SiLU base rows where the layer fuses its base path, as its forward does
    uniform, use_base = layer._grid_uniform, fuses_base(layer.base_activation)
    if n_rows == 0:
        return x.new_empty((0, n_out, n_in))
    width = kb.dense_width(n_in, n_coef, use_base)
    basis_t = x.new_empty((width, n_rows))
    weight = x.new_empty((width, n_out))
    base_weight_t = layer.base_weight.detach().t().contiguous()
    scaler_t = layer.spline_scaler.detach().t().contiguous()
    coef = layer.spline_weight.detach().permute(1, 2, 0).contiguous()
    stream = warp_stream(x.device)
    kb.launch_combine_weights(to_warp(base_weight_t), to_warp(scaler_t), to_warp(coef), to_warp(weight), k, uniform,
                              use_base, stream=stream)
    kb.launch_expand_basis(to_warp(x), to_warp(layer.grid.contiguous()), to_warp(basis_t), k, uniform, use_base,
                           stream=stream)
    offset = n_in if use_base else 0
    basis = basis_t[offset:].view(n_in, n_coef, n_rows)
    coefficients = weight[offset:].view(n_in, n_coef, n_out)
    if use_base:  # the SiLU row of each input as one more basis function, its weight the base weight
        basis = torch.cat([basis_t[:n_in].view(n_in, 1, n_rows), basis], dim=1)
        coefficients = torch.cat([weight[:n_in].view(n_in, 1, n_out), coefficients], dim=1)
    values = _per_edge(basis, coefficients)
    if layer.use_base and not use_base:  # any other activation runs in torch, as in the layer's forward
        activation = layer.base_activation(x).detach()  # [n, in]
        values = values + activation.unsqueeze(1) * layer.base_weight.detach().unsqueeze(0)
    return values


def _ukan_edges(layer: UKANLinear, x: Tensor) -> Tensor:
    finite = x[torch.isfinite(x)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.numel() else (0.0, 0.0)
    return _bspline_edges(layer.to_kan(lo, hi), x)


def _poly_edges(layer: PolyKANLinear, x: Tensor) -> Tensor:
    n_rows, n_in = x.shape
    n_basis = layer.degree + 1
    lut_size = layer.lut_size if layer.mode == "lut" else 0
    basis = poly_dense_basis(x, layer.basis, lut_size, layer.alpha, layer.beta, n_basis).view(n_in, n_basis, n_rows)
    coefficients = layer.coeffs.detach().permute(0, 2, 1)  # [in, D + 1, out]
    return _per_edge(basis, coefficients)


def _rational_edges(layer: GRKANLinear, x: Tensor) -> Tensor:
    activation = layer.rational(x)  # [n, in]: F_{group(i)}(x[:, i]), the layer's own kernel
    return activation.unsqueeze(1) * layer.linear.weight.detach().unsqueeze(0)
