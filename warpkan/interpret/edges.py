"""Edge functions phi_{o,i}(x) of every KAN family and of symbolic layers, evaluated by the layers' own Warp
kernels, all edges at once (how: :mod:`warpkan.interpret._edge_values`), at data or at evenly spaced points.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .. import _checks
from . import _layers
from ._edge_values import edge_values
from ._symbolic_layer import SymbolicLayer, numeric_layer, single_layer

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
    layer = single_layer(layer)
    with torch.no_grad():
        points = edge_points(layer, x, x_range, n)
        return EdgeFunctions(points, layer_edge_values(layer, points))


def edge_points(layer, x, x_range, n) -> Tensor:
    """The [points, in] evaluation points of :func:`edge_functions` (see there)."""
    numeric = numeric_layer(layer)
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
    if isinstance(layer, SymbolicLayer):
        return layer.edge_values(x, numeric_only, centered)
    return edge_values(layer, x, centered)


