"""torch.library custom ops of the B-spline KAN layer, on the Warp kernels of ``warpkan.kernels.bspline``.

The ops take the kernel layout (see that module); :func:`bspline_kan` takes efficient-kan's layout and
(..., in) inputs, and is what ``KANLinear`` calls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..kernels import bspline as kb
from ._common import TorchWorkspace, check_tensor, to_warp, warp_stream

__all__ = ["bspline_kan", "bspline_forward", "bspline_backward", "choose_strategy", "STRATEGIES"]

STRATEGIES = ("auto", "stencil", "gemm")
# Scratch for one chunk of the dense basis in the "gemm" strategy: rows are processed in chunks so that
# no O(N * in * G) tensor exists, and none is kept for the backward pass.
GEMM_CHUNK_BYTES = 128 * 2**20
# Up to this many coefficients per input the dense basis (zeros included) is cheaper to multiply on cuBLAS
# than to gather per edge; beyond it the stencil kernels, whose cost does not grow with G, win. Measured on an
# H200 at (N=2^17, 32->32, k=3), fwd+bwd: G=32 gemm 3.41 ms vs stencil 4.29; G=64 gemm 5.02 vs stencil 4.31;
# wide layers with short bases (256->256 G=8, 512->512 G=5) 3-18x faster on gemm.
GEMM_MAX_COEFFICIENTS = 48


def choose_strategy(n_rows: int, n_in: int, n_out: int, n_coef: int) -> str:
    """The strategy "auto" resolves to for a shape."""
    return "gemm" if n_coef <= GEMM_MAX_COEFFICIENTS else "stencil"


def _resolve(strategy: str, x: Tensor, coef: Tensor) -> str:
    if strategy == "auto":
        return choose_strategy(x.shape[0], x.shape[1], coef.shape[2], coef.shape[1])
    return strategy


def _chunk_rows(n_in: int, n_coef: int, itemsize: int) -> int:
    return max(1, GEMM_CHUNK_BYTES // max(1, n_in * n_coef * itemsize))


def _silu_grad(x: Tensor) -> Tensor:
    sig = torch.sigmoid(x)
    return sig * (1 + x * (1 - sig))


def _gemm_forward(x, grid, base_weight_t, scaler_t, coef, spline_order, uniform, use_base, stream):
    """Dense-basis strategy: expand the bases of a chunk of rows (Warp) and multiply by the scaled
    coefficients (cuBLAS through torch)."""
    n_rows, n_in = x.shape
    n_coef, n_out = coef.shape[1], coef.shape[2]
    w_spline = (coef * scaler_t.unsqueeze(1)).reshape(n_in * n_coef, n_out)
    y = torch.matmul(F.silu(x), base_weight_t) if use_base else x.new_zeros((n_rows, n_out))
    chunk = min(_chunk_rows(n_in, n_coef, x.element_size()), max(n_rows, 1))
    basis = x.new_empty((chunk, n_in, n_coef))
    grid_w = to_warp(grid)
    for start in range(0, n_rows, chunk):
        rows = min(chunk, n_rows - start)
        part = basis[:rows]
        part.zero_()
        kb.launch_expand_basis(to_warp(x[start : start + rows]), grid_w, to_warp(part), spline_order, uniform, stream)
        y[start : start + rows].addmm_(part.view(rows, -1), w_spline)
    return y


def _gemm_backward(dy, x, grid, base_weight_t, scaler_t, coef, spline_order, uniform, use_base, need_x,
                   need_params, dx, d_base, d_scaler, d_coef, stream):
    n_rows, n_in = x.shape
    n_coef, n_out = coef.shape[1], coef.shape[2]
    w_spline = (coef * scaler_t.unsqueeze(1)).reshape(n_in * n_coef, n_out)
    d_w = x.new_zeros((n_in * n_coef, n_out)) if need_params else None
    chunk = min(_chunk_rows(n_in, n_coef, x.element_size()), max(n_rows, 1))
    basis = x.new_empty((chunk, n_in, n_coef))
    grid_w = to_warp(grid)
    for start in range(0, n_rows, chunk):
        rows = min(chunk, n_rows - start)
        x_part = to_warp(x[start : start + rows])
        dy_part = dy[start : start + rows]
        part = basis[:rows]
        part.zero_()
        kb.launch_expand_basis(x_part, grid_w, to_warp(part), spline_order, uniform, stream)
        if need_params:
            d_w.addmm_(part.view(rows, -1).t(), dy_part)
        if need_x:
            d_basis = torch.matmul(dy_part, w_spline.t()).view(rows, n_in, n_coef)
            kb.launch_contract_basis_grad(x_part, grid_w, to_warp(d_basis), to_warp(dx[start : start + rows]),
                                          spline_order, uniform, stream)
    if need_params:
        d_w = d_w.view(n_in, n_coef, n_out)
        d_coef.copy_(d_w * scaler_t.unsqueeze(1))
        d_scaler.copy_((d_w * coef).sum(1))
        if use_base:
            torch.matmul(F.silu(x).t(), dy, out=d_base)
    if need_x and use_base:
        dx.addcmul_(torch.matmul(dy, base_weight_t.t()), _silu_grad(x))


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
    strategy: str,
) -> Tensor:
    """x [N, in], grid [in, G+2k+1], base_weight_t / scaler_t [in, out], coef [in, G+k, out] -> y [N, out].

    ``deterministic`` only affects the backward pass; it is an argument here so autograd can see it.
    """
    x, grid, base_weight_t, scaler_t, coef = (t.contiguous() for t in (x, grid, base_weight_t, scaler_t, coef))
    stream = warp_stream(x.device)
    if _resolve(strategy, x, coef) == "gemm":
        return _gemm_forward(x, grid, base_weight_t, scaler_t, coef, spline_order, uniform, use_base, stream)
    y = x.new_empty((x.shape[0], coef.shape[2]))
    kb.launch_forward(
        to_warp(x), to_warp(grid), to_warp(base_weight_t), to_warp(scaler_t), to_warp(coef), to_warp(y),
        spline_order, uniform, use_base, stream=stream,
    )
    return y


@bspline_forward.register_fake
def _(x, grid, base_weight_t, scaler_t, coef, spline_order, uniform, use_base, deterministic, strategy):
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
    strategy: str,
    need_x: bool,
    need_params: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients (dx, d_base_weight_t, d_scaler_t, d_coef); the ones not asked for come back empty."""
    dy, x, grid, base_weight_t, scaler_t, coef = (
        t.contiguous() for t in (dy, x, grid, base_weight_t, scaler_t, coef)
    )
    dx, d_base, d_scaler, d_coef = _grad_buffers(x, base_weight_t, coef, need_x, need_params, torch.zeros)
    stream = warp_stream(x.device)
    if _resolve(strategy, x, coef) == "gemm":
        _gemm_backward(dy, x, grid, base_weight_t, scaler_t, coef, spline_order, uniform, use_base, need_x,
                       need_params, dx, d_base, d_scaler, d_coef, stream)
        return dx, d_base, d_scaler, d_coef
    kb.launch_backward(
        to_warp(dy), to_warp(x), to_warp(grid), to_warp(base_weight_t), to_warp(scaler_t), to_warp(coef),
        spline_order, uniform, use_base,
        dx=to_warp(dx) if need_x else None,
        d_base_weight_t=to_warp(d_base) if need_params else None,
        d_scaler_t=to_warp(d_scaler) if need_params else None,
        d_coef=to_warp(d_coef) if need_params else None,
        deterministic=deterministic,
        stream=stream,
        workspace=TorchWorkspace(x.device),
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
def _(dy, x, grid, base_weight_t, scaler_t, coef, spline_order, uniform, use_base, deterministic, strategy, need_x,
      need_params):
    return _grad_buffers(x, base_weight_t, coef, need_x, need_params, torch.empty)


def _setup_context(ctx, inputs, output):
    x, grid, base_weight_t, scaler_t, coef, spline_order, uniform, use_base, deterministic, strategy = inputs
    ctx.save_for_backward(x, grid, base_weight_t, scaler_t, coef)
    ctx.config = (spline_order, uniform, use_base, deterministic, strategy)


def _backward(ctx, dy):
    x, grid, base_weight_t, scaler_t, coef = ctx.saved_tensors
    need_x = ctx.needs_input_grad[0]
    need_params = any(ctx.needs_input_grad[2:5])
    if not (need_x or need_params):
        return (None,) * 10
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
        None, None, None, None, None,
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
    strategy: str = "auto",
) -> Tensor:
    """The KANLinear map on x (..., in) with efficient-kan's parameter layout.

    grid [in, G+2k+1]; base_weight [out, in] or None for no base path; spline_weight [out, in, G+k];
    spline_scaler [out, in]. ``uniform`` says the knots of every input are equally spaced (the matrix-form
    fast path); pass False after ``update_grid``. Inputs outside the grid get a zero spline term.

    ``strategy``: "stencil" evaluates each edge locally in Warp (cost independent of G); "gemm" expands the
    bases of row chunks in Warp and contracts them with cuBLAS (fast for short bases); "auto" picks by shape
    (:func:`choose_strategy`).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
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
        spline_order, uniform, use_base, deterministic, strategy,
    )
    return y.reshape(*lead, n_out)
