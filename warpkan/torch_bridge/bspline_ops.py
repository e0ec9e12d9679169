"""torch.library custom ops of the B-spline KAN layer, on the Warp kernels of ``warpkan.kernels.bspline``.

The ops take the kernel layout (see that module); :func:`bspline_kan` takes efficient-kan's layout and
(..., in) inputs, and is what ``KANLinear`` calls.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels import bspline as kb
from ._common import check_tensor, to_warp, warp_stream

__all__ = ["bspline_kan", "bspline_forward", "bspline_backward"]


@torch.library.custom_op("warpkan::bspline_forward", mutates_args=())
def bspline_forward(
    x: Tensor,
    grid: Tensor,
    base_weight_t: Tensor,
    scaler_t: Tensor,
    coef: Tensor,
    spline_order: int,
    uniform: bool,
    use_base: bool,
    deterministic: bool,
) -> Tensor:
    """x [N, in], grid [in, G+2k+1], base_weight_t / scaler_t [in, out], coef [in, G+k, out] -> y [N, out].

    ``deterministic`` only affects the backward pass; it is an argument here so autograd can see it.
    """
    x, grid, base_weight_t, scaler_t, coef = (t.contiguous() for t in (x, grid, base_weight_t, scaler_t, coef))
    y = x.new_empty((x.shape[0], coef.shape[2]))
    kb.launch_forward(
        to_warp(x), to_warp(grid), to_warp(base_weight_t), to_warp(scaler_t), to_warp(coef), to_warp(y),
        spline_order, uniform, use_base, stream=warp_stream(x.device),
    )
    return y


@bspline_forward.register_fake
def _(x, grid, base_weight_t, scaler_t, coef, spline_order, uniform, use_base, deterministic):
    return x.new_empty((x.shape[0], coef.shape[2]))


@torch.library.custom_op("warpkan::bspline_backward", mutates_args=())
def bspline_backward(
    dy: Tensor,
    x: Tensor,
    grid: Tensor,
    base_weight_t: Tensor,
    scaler_t: Tensor,
    coef: Tensor,
    spline_order: int,
    uniform: bool,
    use_base: bool,
    deterministic: bool,
    need_x: bool,
    need_params: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients (dx, d_base_weight_t, d_scaler_t, d_coef); the ones not asked for come back empty."""
    dy, x, grid, base_weight_t, scaler_t, coef = (
        t.contiguous() for t in (dy, x, grid, base_weight_t, scaler_t, coef)
    )
    dx, d_base, d_scaler, d_coef = _grad_buffers(x, base_weight_t, coef, need_x, need_params, torch.zeros)
    kb.launch_backward(
        to_warp(dy), to_warp(x), to_warp(grid), to_warp(base_weight_t), to_warp(scaler_t), to_warp(coef),
        spline_order, uniform, use_base,
        dx=to_warp(dx) if need_x else None,
        d_base_weight_t=to_warp(d_base) if need_params else None,
        d_scaler_t=to_warp(d_scaler) if need_params else None,
        d_coef=to_warp(d_coef) if need_params else None,
        deterministic=deterministic,
        stream=warp_stream(x.device),
    )
    return dx, d_base, d_scaler, d_coef


def _grad_buffers(x, base_weight_t, coef, need_x, need_params, alloc):
    def make(shape, needed):
        return alloc(shape if needed else (0,), dtype=x.dtype, device=x.device)

    return (
        make(x.shape, need_x),
        make(base_weight_t.shape, need_params),
        make(base_weight_t.shape, need_params),
        make(coef.shape, need_params),
    )


@bspline_backward.register_fake
def _(dy, x, grid, base_weight_t, scaler_t, coef, spline_order, uniform, use_base, deterministic, need_x, need_params):
    return _grad_buffers(x, base_weight_t, coef, need_x, need_params, torch.empty)


def _setup_context(ctx, inputs, output):
    x, grid, base_weight_t, scaler_t, coef, spline_order, uniform, use_base, deterministic = inputs
    ctx.save_for_backward(x, grid, base_weight_t, scaler_t, coef)
    ctx.config = (spline_order, uniform, use_base, deterministic)


def _backward(ctx, dy):
    x, grid, base_weight_t, scaler_t, coef = ctx.saved_tensors
    need_x = ctx.needs_input_grad[0]
    need_params = any(ctx.needs_input_grad[2:5])
    if not (need_x or need_params):
        return (None,) * 9
    dx, d_base, d_scaler, d_coef = bspline_backward(
        dy, x, grid, base_weight_t, scaler_t, coef, *ctx.config, need_x, need_params
    )
    use_base = ctx.config[2]
    return (
        dx if need_x else None,
        None,
        d_base if need_params and use_base and ctx.needs_input_grad[2] else None,
        d_scaler if need_params and ctx.needs_input_grad[3] else None,
        d_coef if need_params and ctx.needs_input_grad[4] else None,
        None, None, None, None,
    )


bspline_forward.register_autograd(_backward, setup_context=_setup_context)


def bspline_kan(
    x: Tensor,
    grid: Tensor,
    base_weight: Tensor | None,
    spline_weight: Tensor,
    spline_scaler: Tensor,
    spline_order: int,
    uniform: bool,
    deterministic: bool = False,
) -> Tensor:
    """The KANLinear map on x (..., in) with efficient-kan's parameter layout.

    grid [in, G+2k+1]; base_weight [out, in] or None for no base path; spline_weight [out, in, G+k];
    spline_scaler [out, in]. ``uniform`` says the knots of every input are equally spaced (the matrix-form
    fast path); pass False after ``update_grid``. Inputs outside the grid get a zero spline term.
    """
    check_tensor("x", x, ndim_min=1)
    check_tensor("spline_weight", spline_weight, ndim=3, like=x)
    n_out, n_in, n_coef = spline_weight.shape
    if not 1 <= spline_order <= kb.MAX_SPLINE_ORDER:
        raise ValueError(f"spline_order must be in [1, {kb.MAX_SPLINE_ORDER}], got {spline_order}")
    check_tensor("x", x, last_dim=n_in)
    check_tensor("grid", grid, shape=(n_in, n_coef + spline_order + 1), like=x)
    check_tensor("spline_scaler", spline_scaler, shape=(n_out, n_in), like=x)
    use_base = base_weight is not None
    if use_base:
        check_tensor("base_weight", base_weight, shape=(n_out, n_in), like=x)
    else:
        base_weight = spline_scaler  # any [out, in] tensor: the kernels skip the base term
    lead = x.shape[:-1]
    x2 = x.reshape(-1, n_in)
    y = bspline_forward(
        x2, grid, base_weight.t(), spline_scaler.t(), spline_weight.permute(1, 2, 0),
        spline_order, uniform, use_base, deterministic,
    )
    return y.reshape(*lead, n_out)
