"""Edge functions phi_{o,i}(x) of the numeric KAN layers, evaluated by the layers' own Warp kernels, all edges
at once.

A KAN layer computes ``y[n, o] = sum_i phi_{o,i}(x[n, i]) (+ bias[o])``. Its kernels never form the edges
separately: they sum over i. The B-spline, UKAN and polynomial layers have a second computation of the same
map (their "gemm" strategy) that does expose them: a Warp kernel expands the inputs into their dense basis
``B [rows, in, K]`` (the SiLU base and the G + k B-splines of each input, or the D + 1 polynomials), and the
output is ``B`` contracted with the coefficients ``W [in, K, out]`` over (i, K). Contracting over K alone,
one batched GEMM over the inputs, gives every edge: ``phi[i, o, n] = sum_m W[i, m, o] B[n, i, m]``. The basis
comes from the same kernels the layers run (the edge engine's differentiable dense basis,
``warpkan.torch_bridge.edge_driver.dense_basis``, of the spec the layer's ``edge_view`` gives) and the
coefficients from the layers' parameters by torch ops, so the edges are the layer's own (LUT interpolation,
non-uniform grids and the base path included), sum to its output, and are differentiable in the parameters and
in x (what :func:`~warpkan.interpret.sparsity_penalty` trains through; :func:`~warpkan.interpret.edge_functions`
returns them without history).

- ``KANLinear``: the B-spline family of its grid, the combined weight ``[base_weight; coef * scaler]``.
- ``UKANLinear``: the coefficient generator's table on the groups of its forward's dense-range path (as the
  layer's dense-range forward builds it, by torch ops), then as above.
- ``PolyKANLinear`` / ``ChebyKANLinear``: the polynomial family, exact or LUT as the layer is set.
- ``GRKANLinear``: ``phi_{o,i}(x) = W[o, i] F_i(x)`` with the group-rational kernel giving F for every input.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..torch_bridge import GRKANLinear
from ..torch_bridge._common import matmul_precision
from ..torch_bridge.edge_driver import EdgeView, dense_basis
from . import _layers

__all__ = ["edge_values"]


def edge_values(layer, x: Tensor, centered: bool = False) -> Tensor:
    """[n, out, in] edge values of a KAN layer at x [n, in] (contiguous, the layer's dtype and device),
    differentiable in the parameters and in x. ``centered``: each edge less its value at the first point, the
    difference taken before the contraction with the coefficients, so that an edge whose inputs are all equal is
    exactly zero (the contraction's rounding may differ from one point to the next: a spread of noise
    otherwise)."""
    _layers.check_edge_layer("layer", layer)
    if x.shape[0] == 0:
        return x.new_empty((0, layer.out_features, layer.in_features))
    if isinstance(layer, GRKANLinear):
        return _rational_edges(layer, x, centered)
    return _engine_edges(layer.edge_view(x), x, centered)


def _less_first(values: Tensor, centered: bool, dim: int) -> Tensor:
    """``values`` less their first entry along ``dim`` (the first point) when ``centered``."""
    return values - values.narrow(dim, 0, 1) if centered else values


def _per_edge(basis: Tensor, weight: Tensor) -> Tensor:
    """basis [in, K, n], weight [in, K, out] -> [n, out, in] (storage [in, out, n]): the contraction over K
    alone, one batched GEMM over the inputs, at full float32 precision."""
    with matmul_precision("fp32", basis.device):
        values = torch.bmm(weight.transpose(1, 2), basis)  # [in, out, n]
    return values.permute(2, 1, 0)


def _engine_edges(view: EdgeView, x: Tensor, centered: bool) -> Tensor:
    """The edges of a layer on the edge engine, from its view at x (``layer.edge_view(x)``): its dense basis
    against the combined weight, the SiLU row of each input (where the kernels fuse the base path) as one more
    basis function, any other base activation in torch as in the layer's forward."""
    n_rows, n_in = x.shape
    spec = view.spec
    basis_t = _less_first(dense_basis(x, None, 0, spec), centered, 1)  # [width, n]
    weight = view.weight()  # [width, out], by torch ops: differentiable in the parameters
    offset = n_in if spec.use_base else 0
    basis = basis_t[offset:].view(n_in, spec.n_coef, n_rows)
    coefficients = weight[offset:].view(n_in, spec.n_coef, weight.shape[1])
    if spec.use_base:
        basis = torch.cat([basis_t[:n_in].view(n_in, 1, n_rows), basis], dim=1)
        coefficients = torch.cat([weight[:n_in].view(n_in, 1, -1), coefficients], dim=1)
    values = _per_edge(basis, coefficients)
    if view.base_activation is not None:
        activation = _less_first(view.base_activation(x), centered, 0)
        values = values + activation.unsqueeze(1) * view.base_weight_t.t().unsqueeze(0)
    return values


def _rational_edges(layer: GRKANLinear, x: Tensor, centered: bool) -> Tensor:
    activation = _less_first(layer.rational(x), centered, 0)  # [n, in]: F_{group(i)}(x[:, i]), the layer's kernel
    return activation.unsqueeze(1) * layer.linear.weight.unsqueeze(0)
