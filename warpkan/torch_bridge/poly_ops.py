"""torch.library custom ops of the polynomial KAN layer, on the Warp kernels of ``warpkan.kernels.poly``.

The ops take the kernel layout ``coeffs`` [in, D + 1, out] and x [N, in]; :func:`poly_kan` takes (..., in)
inputs and is what ``PolyKANLinear`` calls. ``lut_size = 0`` selects exact mode, ``lut_size >= 2`` LUT mode.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..kernels import poly as kp
from ._common import check_tensor, to_warp, warp_device, warp_stream

__all__ = ["poly_kan", "poly_forward", "poly_backward"]


def _tables(x: Tensor, basis: str, n_basis: int, lut_size: int, alpha: float, beta: float):
    if lut_size == 0:
        return None
    scalar = "float64" if x.dtype == torch.float64 else "float32"
    return kp.build_lut(basis, n_basis - 1, lut_size, alpha, beta, scalar, warp_device(x.device))


@torch.library.custom_op("warpkan::poly_forward", mutates_args=())
def poly_forward(
    x: Tensor,
    coeffs: Tensor,
    bias: Optional[Tensor],
    basis: str,
    lut_size: int,
    alpha: float,
    beta: float,
) -> Tensor:
    """x [N, in], coeffs [in, D + 1, out], bias [out] or None -> y [N, out]."""
    x, coeffs = x.contiguous(), coeffs.contiguous()
    y = x.new_empty((x.shape[0], coeffs.shape[2]))
    kp.launch_forward(
        to_warp(x), to_warp(coeffs), to_warp(y), basis,
        bias=to_warp(bias.contiguous()) if bias is not None else None,
        lut=_tables(x, basis, coeffs.shape[1], lut_size, alpha, beta), alpha=alpha, beta=beta,
        stream=warp_stream(x.device),
    )
    return y


@poly_forward.register_fake
def _(x, coeffs, bias, basis, lut_size, alpha, beta):
    return x.new_empty((x.shape[0], coeffs.shape[2]))


@torch.library.custom_op("warpkan::poly_backward", mutates_args=())
def poly_backward(
    dy: Tensor,
    x: Tensor,
    coeffs: Tensor,
    basis: str,
    lut_size: int,
    alpha: float,
    beta: float,
    need_x: bool,
    need_coeffs: bool,
    need_bias: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients (dx, d_coeffs, d_bias); the ones not asked for come back empty."""
    dy, x, coeffs = dy.contiguous(), x.contiguous(), coeffs.contiguous()
    dx, d_coeffs, d_bias = _grad_buffers(x, coeffs, need_x, need_coeffs, need_bias, torch.zeros)
    kp.launch_backward(
        to_warp(dy), to_warp(x), to_warp(coeffs), basis,
        lut=_tables(x, basis, coeffs.shape[1], lut_size, alpha, beta), alpha=alpha, beta=beta,
        dx=to_warp(dx) if need_x else None,
        d_coeffs=to_warp(d_coeffs) if need_coeffs else None,
        d_bias=to_warp(d_bias) if need_bias else None,
        stream=warp_stream(x.device),
    )
    return dx, d_coeffs, d_bias


def _grad_buffers(x, coeffs, need_x, need_coeffs, need_bias, alloc):
    def make(shape, needed):
        return alloc(shape if needed else (0,), dtype=x.dtype, device=x.device)

    return make(x.shape, need_x), make(coeffs.shape, need_coeffs), make((coeffs.shape[2],), need_bias)


@poly_backward.register_fake
def _(dy, x, coeffs, basis, lut_size, alpha, beta, need_x, need_coeffs, need_bias):
    return _grad_buffers(x, coeffs, need_x, need_coeffs, need_bias, torch.empty)


def _setup_context(ctx, inputs, output):
    x, coeffs, bias, basis, lut_size, alpha, beta = inputs
    ctx.save_for_backward(x, coeffs)
    ctx.config = (basis, lut_size, alpha, beta)
    ctx.has_bias = bias is not None


def _backward(ctx, dy):
    x, coeffs = ctx.saved_tensors
    need_x, need_coeffs = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    need_bias = ctx.has_bias and ctx.needs_input_grad[2]
    if not (need_x or need_coeffs or need_bias):
        return (None,) * 7
    dx, d_coeffs, d_bias = poly_backward(dy, x, coeffs, *ctx.config, need_x, need_coeffs, need_bias)
    return (
        dx if need_x else None,
        d_coeffs if need_coeffs else None,
        d_bias if need_bias else None,
        None, None, None, None,
    )


poly_forward.register_autograd(_backward, setup_context=_setup_context)


def poly_kan(
    x: Tensor,
    coeffs: Tensor,
    bias: Tensor | None = None,
    basis: str = "chebyshev",
    lut_size: int = 0,
    alpha: float = 1.0,
    beta: float = 1.0,
) -> Tensor:
    """``y[..., o] = sum_i sum_d coeffs[i, d, o] P_d(tanh x[..., i]) (+ bias[o])`` for x (..., in).

    coeffs [in, D + 1, out] (the kernel layout); ``lut_size = 0`` evaluates the basis exactly by its
    recurrence, ``lut_size >= 2`` reads it from tables of that many points on [-1, 1] (see
    ``warpkan.kernels.poly`` for the bases and the interpolation error bound).
    """
    check_tensor("x", x, ndim_min=1)
    check_tensor("coeffs", coeffs, ndim=3, like=x)
    n_in, n_basis, n_out = coeffs.shape
    check_tensor("x", x, last_dim=n_in)
    kp.check_basis(basis, n_basis - 1, alpha, beta)
    if isinstance(lut_size, bool) or not isinstance(lut_size, int) or lut_size < 0 or lut_size == 1:
        raise ValueError(f"lut_size must be 0 (exact) or an int >= 2, got {lut_size!r}")
    if bias is not None:
        check_tensor("bias", bias, shape=(n_out,), like=x)
    lead = x.shape[:-1]
    y = poly_forward(x.reshape(-1, n_in), coeffs, bias, basis, lut_size, float(alpha), float(beta))
    return y.reshape(*lead, n_out)
