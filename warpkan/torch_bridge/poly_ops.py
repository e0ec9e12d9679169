"""torch.library custom ops of the polynomial KAN layer, on the Warp kernels of ``warpkan.kernels.poly``.

The ops take the kernel layout ``coeffs`` [in, D + 1, out] and x [N, in]; :func:`poly_kan` takes (..., in)
inputs and is what ``PolyKANLinear`` calls. ``lut_size = 0`` selects exact mode, ``lut_size >= 2`` LUT mode.

Two strategies compute the same map:

- ``fused``: the register-tiled Warp kernels (basis in registers, fixed-order chunk combines, no basis tensor);
  bitwise reproducible; best while the layer is small enough to be bound by launches and memory.
- ``gemm``: a Warp kernel writes the dense basis of a chunk of rows, cuBLAS (through torch) does the three
  contractions and a Warp kernel folds the basis gradient into dx. Large batches are FLOP-bound, and cuBLAS
  is the fastest fp32 (or TF32, when torch allows it) contraction there.

``auto`` picks by the forward's FLOP count (:func:`choose_strategy`).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..kernels import poly as kp
from ._common import TorchWorkspace, check_tensor, to_warp, warp_device, warp_stream

__all__ = ["poly_kan", "poly_forward", "poly_backward", "choose_strategy"]

STRATEGIES = ("auto", "fused", "gemm")
# Forward FLOPs (2 N in (D + 1) out) from which "auto" takes the GEMM strategy. A first guess from the FLOP
# rates in DESIGN.md (fused SIMT well under cuBLAS' fp32 rate): retune on the GPU machine with
# `warpkan bench poly`.
GEMM_MIN_FLOPS = 2**31
GEMM_CHUNK_BYTES = 1 << 28  # the dense basis of the GEMM strategy is built this many bytes of rows at a time


def choose_strategy(n_rows: int, n_in: int, n_basis: int, n_out: int) -> str:
    """The strategy "auto" resolves to for a shape."""
    return "gemm" if 2 * n_rows * n_in * n_basis * n_out >= GEMM_MIN_FLOPS else "fused"


def _resolve(strategy: str, x: Tensor, coeffs: Tensor) -> str:
    if strategy == "auto":
        return choose_strategy(x.shape[0], x.shape[1], coeffs.shape[1], coeffs.shape[2])
    return strategy


def _row_chunk(n_rows: int, width: int, itemsize: int) -> int:
    return max(1, min(n_rows, GEMM_CHUNK_BYTES // max(1, width * itemsize)))


def _gemm_forward(x, coeffs, bias, basis, tables, alpha, beta, stream):
    n_rows, n_in = x.shape
    n_basis, n_out = coeffs.shape[1], coeffs.shape[2]
    weight = coeffs.reshape(n_in * n_basis, n_out)
    y = x.new_empty((n_rows, n_out))
    chunk = _row_chunk(n_rows, n_in * n_basis, x.element_size())
    buffer = x.new_empty((chunk, n_in * n_basis))
    for start in range(0, n_rows, chunk):
        stop = min(start + chunk, n_rows)
        dense = buffer[: stop - start]
        kp.launch_expand_basis(to_warp(x[start:stop]), to_warp(dense), basis, tables, alpha, beta, stream)
        if bias is not None:
            torch.addmm(bias, dense, weight, out=y[start:stop])
        else:
            torch.mm(dense, weight, out=y[start:stop])
    return y


def _gemm_backward(dy, x, coeffs, basis, tables, alpha, beta, dx, d_coeffs, d_bias, stream):
    n_rows, n_in = x.shape
    n_basis, n_out = coeffs.shape[1], coeffs.shape[2]
    weight = coeffs.reshape(n_in * n_basis, n_out)
    need_x, need_coeffs = dx.numel() > 0, d_coeffs.numel() > 0
    if d_bias.numel():
        torch.sum(dy, dim=0, out=d_bias)
    if not (need_x or need_coeffs) or n_rows == 0:
        return
    chunk = _row_chunk(n_rows, n_in * n_basis, x.element_size())
    buffer = x.new_empty((chunk, n_in * n_basis))
    d_buffer = x.new_empty((chunk, n_in * n_basis)) if need_x else None
    for start in range(0, n_rows, chunk):
        stop = min(start + chunk, n_rows)
        dense = buffer[: stop - start]
        kp.launch_expand_basis(to_warp(x[start:stop]), to_warp(dense), basis, tables, alpha, beta, stream)
        if need_coeffs:
            d_coeffs.view(n_in * n_basis, n_out).addmm_(dense.t(), dy[start:stop])
        if need_x:
            d_dense = d_buffer[: stop - start]
            torch.mm(dy[start:stop], weight.t(), out=d_dense)
            kp.launch_dx_from_dbasis(to_warp(x[start:stop]), to_warp(d_dense), to_warp(dx[start:stop]), basis,
                                     tables, alpha, beta, stream)


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
    strategy: str,
) -> Tensor:
    """x [N, in], coeffs [in, D + 1, out], bias [out] or None -> y [N, out]."""
    x, coeffs = x.contiguous(), coeffs.contiguous()
    bias = bias.contiguous() if bias is not None else None
    tables = _tables(x, basis, coeffs.shape[1], lut_size, alpha, beta)
    stream = warp_stream(x.device)
    if _resolve(strategy, x, coeffs) == "gemm":
        return _gemm_forward(x, coeffs, bias, basis, tables, alpha, beta, stream)
    y = x.new_empty((x.shape[0], coeffs.shape[2]))
    kp.launch_forward(
        to_warp(x), to_warp(coeffs), to_warp(y), basis,
        bias=to_warp(bias) if bias is not None else None,
        lut=tables, alpha=alpha, beta=beta,
        stream=stream,
        workspace=TorchWorkspace(x.device),
    )
    return y


@poly_forward.register_fake
def _(x, coeffs, bias, basis, lut_size, alpha, beta, strategy):
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
    strategy: str,
    need_x: bool,
    need_coeffs: bool,
    need_bias: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients (dx, d_coeffs, d_bias); the ones not asked for come back empty."""
    dy, x, coeffs = dy.contiguous(), x.contiguous(), coeffs.contiguous()
    dx, d_coeffs, d_bias = _grad_buffers(x, coeffs, need_x, need_coeffs, need_bias, torch.zeros)
    tables = _tables(x, basis, coeffs.shape[1], lut_size, alpha, beta)
    stream = warp_stream(x.device)
    if _resolve(strategy, x, coeffs) == "gemm":
        _gemm_backward(dy, x, coeffs, basis, tables, alpha, beta, dx, d_coeffs, d_bias, stream)
        return dx, d_coeffs, d_bias
    kp.launch_backward(
        to_warp(dy), to_warp(x), to_warp(coeffs), basis,
        lut=tables, alpha=alpha, beta=beta,
        dx=to_warp(dx) if need_x else None,
        d_coeffs=to_warp(d_coeffs) if need_coeffs else None,
        d_bias=to_warp(d_bias) if need_bias else None,
        stream=stream,
        workspace=TorchWorkspace(x.device),
    )
    return dx, d_coeffs, d_bias


def _grad_buffers(x, coeffs, need_x, need_coeffs, need_bias, alloc):
    def make(shape, needed):
        return alloc(shape if needed else (0,), dtype=x.dtype, device=x.device)

    return make(x.shape, need_x), make(coeffs.shape, need_coeffs), make((coeffs.shape[2],), need_bias)


@poly_backward.register_fake
def _(dy, x, coeffs, basis, lut_size, alpha, beta, strategy, need_x, need_coeffs, need_bias):
    return _grad_buffers(x, coeffs, need_x, need_coeffs, need_bias, torch.empty)


def _setup_context(ctx, inputs, output):
    x, coeffs, bias, basis, lut_size, alpha, beta, strategy = inputs
    ctx.save_for_backward(x, coeffs)
    ctx.config = (basis, lut_size, alpha, beta, strategy)
    ctx.has_bias = bias is not None


def _backward(ctx, dy):
    x, coeffs = ctx.saved_tensors
    need_x, need_coeffs = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    need_bias = ctx.has_bias and ctx.needs_input_grad[2]
    if not (need_x or need_coeffs or need_bias):
        return (None,) * 8
    dx, d_coeffs, d_bias = poly_backward(dy, x, coeffs, *ctx.config, need_x, need_coeffs, need_bias)
    return (
        dx if need_x else None,
        d_coeffs if need_coeffs else None,
        d_bias if need_bias else None,
        None, None, None, None, None,
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
    strategy: str = "auto",
) -> Tensor:
    """``y[..., o] = sum_i sum_d coeffs[i, d, o] P_d(tanh x[..., i]) (+ bias[o])`` for x (..., in).

    coeffs [in, D + 1, out] (the kernel layout); ``lut_size = 0`` evaluates the basis exactly by its
    recurrence, ``lut_size >= 2`` reads it from tables of that many points on [-1, 1] (see
    ``warpkan.kernels.poly`` for the bases and the interpolation error bound). ``strategy``: "fused", "gemm"
    or "auto" (see the module docstring).
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
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    lead = x.shape[:-1]
    y = poly_forward(x.reshape(-1, n_in), coeffs, bias, basis, lut_size, float(alpha), float(beta), strategy)
    return y.reshape(*lead, n_out)
