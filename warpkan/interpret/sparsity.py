"""pykan's sparsity penalty (pykan 0.2.8, ``MultKAN.reg``) for every KAN family, differentiable in the model's
parameters: a training loss adds ``lamb * sparsity_penalty(model, x)`` where pykan's ``fit`` adds ``lamb * reg``.

For each layer, with h its inputs over the batch (the data for the first layer, the previous layer's outputs
after that) and phi_{o,i} its edges:

    scale[o, i] = std_n phi_{o,i}(h[n, i]) / (std_n h[n, i] + 0.1)     ("edge_forward_spline_n", the default)
    scale[o, i] = std_n phi_{o,i}(h[n, i])                            ("edge_forward_spline_u")
    penalty    += lamb_l1 sum_{o,i} scale + lamb_entropy (H_rows + H_cols),
    H_rows      = -mean_o sum_i p log2(p + 1e-4),  p = scale / (sum_i scale + 1),  and H_cols alike over o,

plus, for the B-spline layers (``KANLinear``, coefficients c [out, in, G + k]), pykan's coefficient terms
``lamb_coef sum_{i,m} mean_o |c| + lamb_coefdiff sum_{i,m} mean_o |c[..., m + 1] - c[..., m]|``. The standard
deviations are torch's (unbiased), as pykan's, but exactly zero for an edge or an input constant over the batch
(a dead node's, and its next layer's edges at it), whose computed spread would otherwise be rounding noise with
an O(1) gradient in a random direction. The edges of a ``SymbolicLayer`` are its numeric ones under
"edge_forward_spline_n" (its fixed, symbolic edges count zero, as pykan's masked splines do) and every edge
under "edge_forward_spline_u" (pykan's ``edge_actscale`` includes the symbolic part).

The edges come from :func:`~warpkan.interpret.edges.layer_edge_values`: the layers' own dense-basis kernels
and their parameters by torch ops, differentiable in both (and in the layer's inputs, so a layer's scales
reach the parameters of the layers before it, as in pykan), at about the cost of one forward and backward
pass of each layer and its [N, out, in] edge values in memory, as pykan's ``reg`` keeps them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..torch_bridge import KANLinear
from . import _layers
from ._symbolic_layer import SymbolicLayer, network_layers, numeric_layer
from .edges import edge_points, layer_edge_values

__all__ = ["sparsity_penalty", "REG_METRICS"]

# pykan's reg_metric values this penalty takes; pykan's "edge_forward_sum" is detached (no gradient), and its
# "edge_backward" and "node_backward" scores come from attribution passes
REG_METRICS = ("edge_forward_spline_n", "edge_forward_spline_u")


def sparsity_penalty(model, x: Tensor, lamb_l1: float = 1.0, lamb_entropy: float = 2.0, lamb_coef: float = 0.0,
                     lamb_coefdiff: float = 0.0, reg_metric: str = "edge_forward_spline_n") -> Tensor:
    """pykan's ``reg(reg_metric, lamb_l1, lamb_entropy, lamb_coef, lamb_coefdiff)`` of ``model`` over the batch
    ``x`` (..., in), as a differentiable scalar in the model's dtype (see the module docstring). The defaults
    are pykan's ``fit``'s.

    ``model``: a KAN layer (``KANLinear``, ``UKANLinear``, ``PolyKANLinear`` / ``ChebyKANLinear``,
    ``GRKANLinear``), an ``nn.Sequential`` of them, a ``KATMLP`` or a ``SymbolicKAN``. ``x`` needs at least 2
    samples (the scales are standard deviations). ``lamb_coef`` and ``lamb_coefdiff`` penalise B-spline
    coefficients, which only ``KANLinear`` layers have: non-zero, they refuse any other layer."""
    if _layers.is_native(model):
        raise TypeError(f"sparsity_penalty: the Warp-native {type(model).__name__}'s parameters are Warp arrays, "
                        "which no torch gradient reaches; penalise the torch layers (warpkan.torch_bridge)")
    layers = network_layers(model)
    _layers.check_chain(layers)
    weights = {name: _weight(name, value) for name, value in (("lamb_l1", lamb_l1), ("lamb_entropy", lamb_entropy),
                                                               ("lamb_coef", lamb_coef),
                                                               ("lamb_coefdiff", lamb_coefdiff))}
    if reg_metric not in REG_METRICS:
        raise ValueError(f"reg_metric must be one of {REG_METRICS}, got {reg_metric!r}")
    coefficients = weights["lamb_coef"] != 0 or weights["lamb_coefdiff"] != 0
    if coefficients:
        for index, layer in enumerate(layers):
            if not isinstance(numeric_layer(layer), KANLinear):
                raise ValueError(f"lamb_coef and lamb_coefdiff penalise B-spline coefficients (KANLinear); layer "
                                 f"{index} is a {type(numeric_layer(layer)).__name__}: set them to 0")
    h = edge_points(layers[0], x, None, 1)
    if h.shape[0] < 2:
        raise ValueError(f"sparsity_penalty needs at least 2 samples, got {h.shape[0]}")
    normalized = reg_metric == "edge_forward_spline_n"
    penalty = h.new_zeros(())
    for index, layer in enumerate(layers):
        # the numeric edges under "spline_n" (pykan's postacts_numerical), every edge under "spline_u"; less their
        # first point's values, so that a constant edge's spread is exactly zero (see layer_edge_values)
        scale = layer_edge_values(layer, h, numeric_only=normalized, centered=True).std(0)  # [out, in]
        if normalized:
            scale = scale / (_spread(h) + 0.1)
        penalty = penalty + weights["lamb_l1"] * scale.sum() + weights["lamb_entropy"] * (
            _entropy(scale, 1) + _entropy(scale, 0))
        if coefficients:
            penalty = penalty + _coefficient_terms(layer, weights["lamb_coef"], weights["lamb_coefdiff"])
        if index + 1 < len(layers):
            h = layer(h)
    return penalty


def _weight(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _spread(values: Tensor) -> Tensor:
    """torch.std over the samples (dim 0) of values less their first sample: the same, but exactly zero, with no
    gradient, for a constant column (a dead node's output), where torch.std's rounded mean would leave a spread
    of rounding noise whose gradient is O(1) in a random direction."""
    return (values - values[:1]).std(0)


def _entropy(scale: Tensor, dim: int) -> Tensor:
    """pykan's entropy of the scales normalised over ``dim`` (1: each output's edges, 0: each input's), averaged
    over the other dimension."""
    p = scale / (scale.sum(dim, keepdim=True) + 1)
    return -(p * torch.log2(p + 1e-4)).sum(dim).mean()


def _coefficient_terms(layer, lamb_coef: float, lamb_coefdiff: float) -> Tensor:
    """pykan's coefficient penalties of a B-spline layer: its coefficients [out, in, G + k] (a SymbolicLayer's
    with its fixed edges masked, as its forward uses them), averaged over the outputs and summed."""
    coef = numeric_layer(layer).spline_weight
    if isinstance(layer, SymbolicLayer):
        coef = coef * layer.keep.to(coef.dtype).unsqueeze(-1)
    return (lamb_coef * coef.abs().mean(0).sum()
            + lamb_coefdiff * torch.diff(coef, dim=-1).abs().mean(0).sum())
