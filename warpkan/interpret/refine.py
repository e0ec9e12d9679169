"""Grid refinement of B-spline KAN layers: pykan's grid extension (``MultKAN.refine``).

The new knots interpolate the old ones: with the G + 1 knots of the old grid (the k extension knots on each
side left out) placed at evenly spaced "percentiles" p_j = j / G of [0, 1], the G' + 1 new knots are that
piecewise-linear map at p = j / G' (a uniform grid stays uniform; a grid that ``update_grid`` fitted to the
data keeps its density profile); k extension knots follow on each side at the new mean spacing. The spline
coefficients are then refitted by least squares (the layer's own refit, in float64) so the spline keeps its
values: at the data when given (pykan's way), else at points that cover every cell of both grids. When every
old knot is a new knot (G' a multiple of G on a uniform grid, or G' = 2G after ``update_grid``) the old spline
lies in the new space and is kept exactly, up to rounding. The base weights and scalers are copied.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from .. import _checks
from ..kernels import bspline as kb
from ..torch_bridge import KANLinear
from ..torch_bridge.kan_linear import refit_coefficients
from ..torch_bridge._common import to_warp, warp_stream
from . import _layers
from ._symbolic_layer import network_layers
from .edges import edge_points

__all__ = ["refine"]


@torch.no_grad()
def refine(model, new_grid_size: int, x: Tensor | None = None):
    """A copy of ``model`` whose ``KANLinear`` layers have ``new_grid_size`` cells (pykan's grid extension,
    see the module docstring): one ``KANLinear``, or an ``nn.Sequential`` / network whose ``KANLinear``
    layers are refined and other layers copied. With data ``x`` (..., in) each layer is refitted on its own
    inputs (the network's activations), else on points covering its grid interval."""
    new_grid_size = _checks.positive_int("new_grid_size", new_grid_size)
    layers = network_layers(model)
    if not any(isinstance(layer, KANLinear) for layer in layers):
        raise TypeError("refine needs KANLinear layers (the only family with a grid to refine)")
    _layers.check_chain(layers)
    acts = None if x is None else edge_points(layers[0], x, None, 1)
    refined = []
    for layer in layers:
        if isinstance(layer, KANLinear):
            refined.append(_refine_layer(layer, new_grid_size, acts))
        else:
            refined.append(copy.deepcopy(layer))
        if acts is not None:
            acts = layer(acts)
    return _layers.rebuild(model, refined)


def _basis(x: Tensor, grid: Tensor, order: int, uniform: bool) -> Tensor:
    """[in, rows, G + k]: the B-spline bases of x [rows, in] on the knots grid [in, G + 2k + 1], by the layer's
    own dense-basis kernel."""
    n_rows, n_in = x.shape
    n_coef = grid.shape[1] - order - 1
    basis_t = x.new_empty((n_in * n_coef, n_rows))
    kb.launch_expand_basis(to_warp(x.contiguous()), to_warp(grid.contiguous()), to_warp(basis_t), order, uniform,
                           False, stream=warp_stream(x.device))
    return basis_t.view(n_in, n_coef, n_rows).transpose(1, 2)


def new_knots(grid: Tensor, order: int, new_grid_size: int) -> Tensor:
    """[in, G' + 2k + 1]: pykan's refined knots for the knots ``grid`` [in, G + 2k + 1] (module docstring)."""
    interior = grid[:, order : grid.shape[1] - order]  # [in, G + 1]
    old_size = interior.shape[1] - 1
    position = torch.arange(new_grid_size + 1, dtype=grid.dtype, device=grid.device) * (old_size / new_grid_size)
    cell = position.floor().clamp(max=old_size - 1).long()
    frac = (position - cell).unsqueeze(0)
    knots = interior[:, cell] * (1 - frac) + interior[:, cell + 1] * frac
    knots[:, 0], knots[:, -1] = interior[:, 0], interior[:, -1]
    step = ((knots[:, -1] - knots[:, 0]) / new_grid_size).unsqueeze(1)
    steps = torch.arange(1, order + 1, dtype=grid.dtype, device=grid.device)
    return torch.cat([knots[:, :1] - step * steps.flip(0), knots, knots[:, -1:] + step * steps], dim=1)


def _cover(old: Tensor, new: Tensor, order: int) -> Tensor:
    """[points, in]: order + 2 points in every cell of the union of both grids' interior knots."""
    knots = torch.sort(torch.cat([old[:, order : old.shape[1] - order], new[:, order : new.shape[1] - order]], 1),
                       dim=1)[0]
    fractions = (torch.arange(order + 2, dtype=old.dtype, device=old.device) + 0.5) / (order + 2)
    left, width = knots[:, :-1].unsqueeze(-1), (knots[:, 1:] - knots[:, :-1]).unsqueeze(-1)
    return (left + width * fractions).reshape(old.shape[0], -1).t().contiguous()


def _refine_layer(layer: KANLinear, new_grid_size: int, x: Tensor | None) -> KANLinear:
    k = layer.spline_order
    old_grid = layer.grid.double()
    grid = new_knots(old_grid, k, new_grid_size)
    points = _cover(old_grid, grid, k) if x is None else x.double()
    old_uniform = kb.grid_is_uniform(old_grid.cpu().numpy())
    new_uniform = kb.grid_is_uniform(grid.cpu().numpy())
    target = torch.bmm(_basis(points, old_grid, k, old_uniform),
                       layer.spline_weight.detach().double().permute(1, 2, 0))  # [in, rows, out]: unscaled splines
    coef = refit_coefficients(_basis(points, grid, k, new_uniform), target, "refine")  # [in, G' + k, out]
    new = _layers.like(layer, layer.in_features, layer.out_features, grid_size=new_grid_size)
    dtype = layer.grid.dtype
    state = {"grid": grid.to(dtype), "base_weight": layer.base_weight.detach(),
             "spline_weight": coef.permute(2, 0, 1).to(dtype)}
    if layer.enable_standalone_scale_spline:
        state["spline_scaler"] = layer.spline_scaler.detach()
    state.update(_layers.activation_state(layer))
    new.load_state_dict(state, strict=True)
    return new
