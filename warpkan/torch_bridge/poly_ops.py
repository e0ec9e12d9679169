"""torch.library custom ops of the polynomial KAN layer, on the Warp kernels of ``warpkan.kernels.poly``.

The ops take the kernel layout ``coeffs`` [in, D + 1, out] and x [N, in]; :func:`poly_kan` takes (..., in)
inputs and is what ``PolyKANLinear`` calls. ``lut_size = 0`` selects exact mode, ``lut_size >= 2`` LUT mode.

Two strategies compute the same map:

- ``fused``: the register-tiled Warp kernels (basis in registers, fixed-order chunk combines, no basis tensor);
  bitwise reproducible; best while the layer is small enough to be bound by launches and memory.
- ``gemm``: a Warp kernel writes the dense basis of a chunk of rows, cuBLAS (through torch) does the three
  contractions and a Warp kernel folds the basis gradient into dx. Once the basis outgrows the weight
  (rows >= out) it is laid out degree-major (column d * in + i: coalesced stores and loads) and the weight is
  permuted to match in the copy that converts it (bf16) or in one copy (fp32), and the coefficient gradient
  permuted back; otherwise the kernel layout is the GEMM's matrix as it is. Faster than the fused kernels at
  every measured shape once host overhead is out of the way (CUDA graphs): the contractions stream the
  weight near bandwidth (small batches) or run on cuBLAS' best kernels (large ones).

``auto`` picks by the forward's FLOP count (:func:`choose_strategy`, the switch measured on the H200).

``precision`` (GEMM strategy only; the fused kernels always compute in the I/O dtype):

- ``"fp32"`` (default): cuBLAS in the I/O dtype. In float32 it follows torch's own TF32 setting
  (``torch.backends.cuda.matmul``), exactly as ``nn.Linear`` does; by default that is full fp32.
- ``"tf32"`` (explicit opt-in, float32 I/O only): the contractions on TF32 tensor cores whatever torch's
  setting (operands rounded to a 10-bit mantissa inside cuBLAS, which may truncate: unit roundoff
  u = 2^-10; float32 sums), so each contraction of length K errs by at most (2 u + K 2^-24) (|B| |W|).
  At small batch each contraction streams the weight; TF32 streams it about twice as fast as cuBLAS'
  float32 kernels do at these shapes (scripts/poly_gemm_forms.py).
- ``"bf16"`` (explicit opt-in, float32 I/O only): the basis (computed in float32 and rounded as the expansion
  kernel stores it, with no float32 copy), the coefficients and ``dy`` are rounded to bfloat16 and the
  contractions run on bf16 tensor cores with float32 products and sums, float32 results (the basis gradient
  stays float32).
  Error bound, for every output (``K`` the contraction length: ``in (D + 1)`` for ``y``, rows for the
  coefficient gradient, ``out`` for the basis gradient):

      |y_bf16 - y| <= (2^-8 + K 2^-24) (|B| |W|)   (+ the float32 rounding of the basis itself)

  since each operand is off by at most 2^-9 relative (round to nearest), the product of two bf16 numbers is
  exact in float32, and a float32 sum of K terms errs by at most K 2^-24 of the sum of magnitudes. The
  input gradient folds the basis gradient with ``(1 - t^2) P_d'(t)`` in float32 on top.
  :data:`BF16_ERROR_BOUND` documents it and the tests check it against the float64 reference.

Host overhead. A small layer is bound by the host. Eager calls go through :class:`_EagerPoly`, an
``autograd.Function`` on the op's own implementation, instead of the custom-op dispatch (about 50 us less a
forward + backward); traced code (``torch.compile``) sees the registered ops. Every Warp launch goes through
the bridge's ``RecordedLaunches`` (recorded once into ``wp.Launch`` objects on raw-pointer views and replayed:
about 4.6 us a launch instead of 10 us, and no ``wp.from_torch``). Fused
forward: 1 launch, or 2 when the sum over inputs is split; backward: at most 3 (dx, coefficients with the
bias, one combine of every split sum), writing into uninitialised gradient buffers (no zero fills). The GEMM
path writes every gradient with its last op too (no zero fills).
"""

from __future__ import annotations

from typing import Optional

import torch
import warp as wp
from torch import Tensor

from .. import _checks
from ..kernels import poly as kp
from ._common import (RecordedLaunches, TorchWorkspace, check_tensor, eager_function, first_order_backward,
                      matmul_precision, on_rows, op_or_eager, to_warp, warp_device, warp_stream)

__all__ = ["poly_kan", "poly_forward", "poly_backward", "choose_strategy", "BF16_ERROR_BOUND"]

STRATEGIES = ("auto", "fused", "gemm")
PRECISIONS = ("fp32", "tf32", "bf16")
BF16_ERROR_BOUND = "(2**-8 + K * 2**-24) * (|A| @ |B|) for a contraction A @ B of length K"
# Forward FLOPs (2 N in (D + 1) out) from which "auto" takes the GEMM strategy. Measured on the H200
# (scripts/poly_speed.py, fp32, exact): CUDA-graphed fwd+bwd, the GEMM strategy was faster at every shape of
# the sweep (rows 16..4096; 40->256 D=8 up to 512->1024 D=24; e.g. 0.062 against 0.244 ms at (64, 256, 512,
# 15), 0.18 against 0.71 ms at (32, 512, 1024, 24)). Eager, each step is bound by the host (~0.2 ms for the
# fused path's recorded launches, ~0.3-0.45 ms for the GEMM path's torch ops), so below this size, where the
# fused kernels' GPU time is under that overhead (e.g. 0.235 against 0.35 ms eager at (128, 40, 256, 8),
# 0.086 against 0.033 graphed), the fused path's fewer launches win.
GEMM_MIN_FLOPS = 2**27
GEMM_CHUNK_BYTES = 1 << 28  # the dense basis of the GEMM strategy is built this many bytes of rows at a time


def choose_strategy(n_rows: int, n_in: int, n_basis: int, n_out: int) -> str:
    """The strategy "auto" resolves to for a shape."""
    return "gemm" if 2 * n_rows * n_in * n_basis * n_out >= GEMM_MIN_FLOPS else "fused"


def check_precision(precision: str, dtype: torch.dtype) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision in ("tf32", "bf16") and dtype != torch.float32:
        raise ValueError(f"precision={precision!r} needs float32 x and coeffs, got {dtype}")


def _resolve(strategy: str, x: Tensor, coeffs: Tensor) -> str:
    if strategy == "auto":
        return choose_strategy(x.shape[0], x.shape[1], coeffs.shape[1], coeffs.shape[2])
    return strategy


def _row_chunk(n_rows: int, width: int, itemsize: int) -> int:
    return max(1, min(n_rows, GEMM_CHUNK_BYTES // max(1, width * itemsize)))


def _mm(a: Tensor, b: Tensor, bf16: bool, out: Tensor | None = None) -> Tensor:
    """a @ b in float32 (or x's dtype). ``bf16``: a and b are already bfloat16; float32 products and sums, a
    float32 result (bf16 tensor cores on the GPU; the same rounding, in plain float32 arithmetic, on the CPU,
    which has no bf16 x bf16 -> float32 matmul)."""
    if not bf16:
        return torch.mm(a, b, out=out)
    result = torch.mm(a, b, out_dtype=torch.float32) if a.is_cuda else a.float() @ b.float()
    return out.copy_(result) if out is not None else result


def _degree_major(n_rows: int, n_out: int) -> bool:
    """Whether the GEMM strategy lays its dense basis out degree-major (coalesced stores; costs a permuted copy
    of the weight per pass and of its gradient) or input-major (the kernel layout itself: no copies, strided
    stores). The basis is [rows, in (D + 1)], the weight [in (D + 1), out]: degree-major pays off once the
    basis outgrows the weight."""
    return n_rows >= n_out


def _gemm_weight(coeffs: Tensor, degree_major: bool, dtype: torch.dtype) -> Tensor:
    """coeffs [in, D + 1, out] as the GEMM's [in (D + 1), out] (or degree-major [(D + 1) in, out]) matrix in
    ``dtype``: a view when nothing changes, else one copy kernel (permute and conversion fused). Made on
    every call: a cache keyed by the weights' version would go stale under CUDA-graph replays."""
    n_in, n_basis, n_out = coeffs.shape
    if degree_major:
        coeffs = coeffs.transpose(0, 1)
    if coeffs.dtype != dtype:
        coeffs = torch.empty(coeffs.shape, dtype=dtype, device=coeffs.device).copy_(coeffs)
    return coeffs.contiguous().view(n_in * n_basis, n_out)


def _expand(x, basis_dtype, basis, lut_size, alpha, beta, n_basis, degree_major) -> Tensor:
    """The dense basis [N, in (D + 1)] of x's rows, in ``basis_dtype``, from a recorded (cached) launch."""
    dense = torch.empty((x.shape[0], x.shape[1] * n_basis), dtype=basis_dtype, device=x.device)
    if dense.numel() == 0:
        return dense
    _launch(_record_expand, (x, dense), basis, lut_size, alpha, beta, n_basis, degree_major)
    return dense


def _dx_from_dbasis(x, d_dense, dx, basis, lut_size, alpha, beta, n_basis, degree_major) -> None:
    """dx = (1 - t^2) sum_d d_dense P_d'(t), written (no zero fill), from a recorded (cached) launch."""
    if dx.numel() == 0:
        return
    _launch(_record_dx_from_dbasis, (x, d_dense, dx), basis, lut_size, alpha, beta, n_basis, degree_major)


def _gemm_forward(x, coeffs, bias, basis, lut_size, alpha, beta, precision="fp32"):
    if precision == "tf32":
        with matmul_precision("tf32", x.device):
            return _gemm_forward(x, coeffs, bias, basis, lut_size, alpha, beta)
    n_rows, n_in = x.shape
    n_basis, n_out = coeffs.shape[1], coeffs.shape[2]
    bf16 = precision == "bf16"
    basis_dtype = torch.bfloat16 if bf16 else x.dtype
    major = _degree_major(n_rows, n_out)
    weight = _gemm_weight(coeffs, major, basis_dtype)
    chunk = _row_chunk(n_rows, n_in * n_basis, basis_dtype.itemsize)
    if chunk >= n_rows:  # one chunk (the usual case): no output buffer to copy into
        dense = _expand(x, basis_dtype, basis, lut_size, alpha, beta, n_basis, major)
        if bias is not None and not bf16:
            return torch.addmm(bias, dense, weight)
        y = _mm(dense, weight, bf16)
        return y.add_(bias) if bias is not None else y
    y = x.new_empty((n_rows, n_out))
    for start in range(0, n_rows, chunk):
        stop = min(start + chunk, n_rows)
        dense = _expand(x[start:stop], basis_dtype, basis, lut_size, alpha, beta, n_basis, major)
        _mm(dense, weight, bf16, out=y[start:stop])
    return y.add_(bias) if bias is not None else y


def _gemm_backward(dy, x, coeffs, basis, lut_size, alpha, beta, need_x, need_coeffs, need_bias, precision="fp32"):
    """(dx, d_coeffs, d_bias), each written by its last op (no zero fills)."""
    if precision == "tf32":
        with matmul_precision("tf32", x.device):
            return _gemm_backward(dy, x, coeffs, basis, lut_size, alpha, beta, need_x, need_coeffs, need_bias)
    n_rows, n_in = x.shape
    n_basis, n_out = coeffs.shape[1], coeffs.shape[2]
    bf16 = precision == "bf16"
    basis_dtype = torch.bfloat16 if bf16 else x.dtype
    empty = x.new_empty((0,))
    d_bias = dy.sum(dim=0) if need_bias else empty
    if n_rows == 0 or n_in == 0:  # gradients of an empty sum or of no rows: zeros
        dx, d_coeffs, _ = _grad_buffers(x, coeffs, need_x, need_coeffs, False, torch.zeros)
        return dx, d_coeffs, d_bias
    major = _degree_major(n_rows, n_out)
    dy_mm = dy.to(torch.bfloat16) if bf16 else dy
    weight_t = _gemm_weight(coeffs, major, basis_dtype).t() if need_x else None
    dx = x.new_empty(x.shape) if need_x else empty
    d_weight = empty  # the coefficient gradient in the GEMM's layout
    chunk = _row_chunk(n_rows, n_in * n_basis, max(basis_dtype.itemsize, x.element_size() if need_x else 0))
    for start in range(0, n_rows, chunk):
        stop = min(start + chunk, n_rows)
        x_part = x[start:stop]
        if need_coeffs:
            dense = _expand(x_part, basis_dtype, basis, lut_size, alpha, beta, n_basis, major)
            if start == 0:  # the first chunk's product is the gradient's buffer: no zero fill, no copy
                d_weight = _mm(dense.t(), dy_mm[start:stop], bf16)
            elif bf16:
                d_weight.add_(_mm(dense.t(), dy_mm[start:stop], bf16))
            else:
                d_weight.addmm_(dense.t(), dy_mm[start:stop])
            del dense
        if need_x:
            d_dense = _mm(dy_mm[start:stop], weight_t, bf16)  # float32 [rows, in (D + 1)]
            _dx_from_dbasis(x_part, d_dense, dx[start:stop], basis, lut_size, alpha, beta, n_basis, major)
    d_coeffs = empty
    if need_coeffs:
        d_coeffs = (d_weight.view(n_basis, n_in, n_out).transpose(0, 1).contiguous() if major
                    else d_weight.view(n_in, n_basis, n_out))
    return dx, d_coeffs, d_bias


def _tables(x, basis: str, n_basis: int, lut_size: int, alpha: float, beta: float):
    """The LUT tables of x's scalar type on x's device (x a tensor or a Warp array); None in exact mode."""
    if lut_size == 0:
        return None
    if isinstance(x, Tensor):
        scalar, device = ("float64" if x.dtype == torch.float64 else "float32"), warp_device(x.device)
    else:
        scalar, device = ("float64" if x.dtype == wp.float64 else "float32"), x.device
    return kp.build_lut(basis, n_basis - 1, lut_size, alpha, beta, scalar, device)


# Recorded launches (see RecordedLaunches). Records that read the LUT tables (Warp arrays of their own) or
# views into a scratch tensor cannot be re-pointed, so they are kept per exact set of addresses; the tables'
# records are dropped with the tables by kp.clear_caches().
_launch = RecordedLaunches(capacity=64)
kp.on_clear_caches(_launch.clear)


def _record_expand(x, dense, basis, lut_size, alpha, beta, n_basis, degree_major, record):
    return kp.launch_expand_basis(x, dense, basis, _tables(x, basis, n_basis, lut_size, alpha, beta), alpha, beta,
                                  degree_major=degree_major, record=record)


def _record_dx_from_dbasis(x, d_dense, dx, basis, lut_size, alpha, beta, n_basis, degree_major, record):
    return kp.launch_dx_from_dbasis(x, d_dense, dx, basis, _tables(x, basis, n_basis, lut_size, alpha, beta), alpha,
                                    beta, accumulate=False, degree_major=degree_major, record=record)


def _record_forward(x, coeffs, y, bias, scratch, basis, lut_size, alpha, beta, record):
    return kp.launch_forward(
        x, coeffs, y, basis, bias=bias, lut=_tables(x, basis, coeffs.shape[1], lut_size, alpha, beta), alpha=alpha,
        beta=beta, workspace=kp.FlatWorkspace(scratch) if scratch is not None else None, record=record,
    )


def _record_backward(dy, x, coeffs, dx, d_coeffs, d_bias, scratch, basis, lut_size, alpha, beta, record):
    return kp.launch_backward(
        dy, x, coeffs, basis, lut=_tables(x, basis, coeffs.shape[1], lut_size, alpha, beta), alpha=alpha, beta=beta,
        dx=dx, d_coeffs=d_coeffs, d_bias=d_bias,
        workspace=kp.FlatWorkspace(scratch) if scratch is not None else None, accumulate=False, record=record,
    )


def _fused_forward(x, coeffs, bias, basis, lut_size, alpha, beta):
    n_rows, n_in = x.shape
    n_out = coeffs.shape[2]
    y = x.new_empty((n_rows, n_out))
    if n_rows == 0 or n_out == 0:
        return y
    if n_in == 0:  # an empty sum: the bias alone
        return y.copy_(bias.expand(n_rows, n_out)) if bias is not None else y.zero_()
    size = kp.forward_scratch_size(n_rows, n_in, n_out)
    scratch = x.new_empty((size,)) if size else None
    _launch(_record_forward, (x, coeffs, y, bias, scratch), basis, lut_size, alpha, beta)
    return y


def _fused_backward(dy, x, coeffs, basis, lut_size, alpha, beta, need_x, need_coeffs, need_bias):
    n_rows, n_in = x.shape
    n_basis, n_out = coeffs.shape[1], coeffs.shape[2]
    if n_rows == 0 or n_in == 0 or n_out == 0:  # some gradients are all zeros (or a plain sum): the simple path
        dx, d_coeffs, d_bias = _grad_buffers(x, coeffs, need_x, need_coeffs, need_bias, torch.zeros)
        kp.launch_backward(
            to_warp(dy), to_warp(x), to_warp(coeffs), basis, lut=_tables(x, basis, n_basis, lut_size, alpha, beta),
            alpha=alpha, beta=beta, dx=to_warp(dx) if need_x else None,
            d_coeffs=to_warp(d_coeffs) if need_coeffs else None, d_bias=to_warp(d_bias) if need_bias else None,
            stream=warp_stream(x.device), workspace=TorchWorkspace(x.device),
        )
        return dx, d_coeffs, d_bias
    # every element is written (accumulate=False): no zero fills
    dx, d_coeffs, d_bias = _grad_buffers(x, coeffs, need_x, need_coeffs, need_bias, torch.empty)
    size = kp.backward_scratch_size(n_rows, n_in, n_basis, n_out, need_x, need_coeffs, need_bias)
    scratch = x.new_empty((size,)) if size else None
    _launch(_record_backward, (dy, x, coeffs, dx if need_x else None, d_coeffs if need_coeffs else None,
                               d_bias if need_bias else None, scratch), basis, lut_size, alpha, beta)
    return dx, d_coeffs, d_bias


def _forward_impl(x, coeffs, bias, basis, lut_size, alpha, beta, strategy, precision="fp32"):
    x, coeffs = x.contiguous(), coeffs.contiguous()
    bias = bias.contiguous() if bias is not None else None
    if _resolve(strategy, x, coeffs) == "gemm":
        return _gemm_forward(x, coeffs, bias, basis, lut_size, alpha, beta, precision)
    return _fused_forward(x, coeffs, bias, basis, lut_size, alpha, beta)


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
    precision: str = "fp32",
) -> Tensor:
    """x [N, in], coeffs [in, D + 1, out], bias [out] or None -> y [N, out]."""
    return _forward_impl(x, coeffs, bias, basis, lut_size, alpha, beta, strategy, precision)


@poly_forward.register_fake
def _(x, coeffs, bias, basis, lut_size, alpha, beta, strategy, precision="fp32"):
    return x.new_empty((x.shape[0], coeffs.shape[2]))


def _backward_impl(dy, x, coeffs, basis, lut_size, alpha, beta, strategy, need_x, need_coeffs, need_bias,
                   precision="fp32"):
    dy, x, coeffs = dy.contiguous(), x.contiguous(), coeffs.contiguous()
    if _resolve(strategy, x, coeffs) == "gemm":
        return _gemm_backward(dy, x, coeffs, basis, lut_size, alpha, beta, need_x, need_coeffs, need_bias, precision)
    return _fused_backward(dy, x, coeffs, basis, lut_size, alpha, beta, need_x, need_coeffs, need_bias)


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
    precision: str = "fp32",
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients (dx, d_coeffs, d_bias); the ones not asked for come back empty."""
    return _backward_impl(dy, x, coeffs, basis, lut_size, alpha, beta, strategy, need_x, need_coeffs, need_bias,
                          precision)


def _grad_buffers(x, coeffs, need_x, need_coeffs, need_bias, alloc):
    def make(shape, needed):
        return alloc(shape if needed else (0,), dtype=x.dtype, device=x.device)

    return make(x.shape, need_x), make(coeffs.shape, need_coeffs), make((coeffs.shape[2],), need_bias)


@poly_backward.register_fake
def _(dy, x, coeffs, basis, lut_size, alpha, beta, strategy, need_x, need_coeffs, need_bias, precision="fp32"):
    return _grad_buffers(x, coeffs, need_x, need_coeffs, need_bias, torch.empty)


def _setup_context(ctx, inputs, output):
    x, coeffs, bias, basis, lut_size, alpha, beta, strategy, precision = inputs
    ctx.save_for_backward(x, coeffs)
    ctx.config = (basis, lut_size, alpha, beta, strategy)
    ctx.precision = precision
    ctx.has_bias = bias is not None


def _backward(ctx, dy, backward_op=poly_backward):
    x, coeffs = ctx.saved_tensors
    need_x, need_coeffs = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    need_bias = ctx.has_bias and ctx.needs_input_grad[2]
    if not (need_x or need_coeffs or need_bias):
        return (None,) * 9
    dx, d_coeffs, d_bias = backward_op(dy, x, coeffs, *ctx.config, need_x, need_coeffs, need_bias, ctx.precision)
    return (
        dx if need_x else None,
        d_coeffs if need_coeffs else None,
        d_bias if need_bias else None,
        None, None, None, None, None, None,
    )


# how errors name the op (first-order only: see first_order_backward)
LABEL = "PolyKANLinear/ChebyKANLinear (warpkan::poly_forward)"
poly_forward.register_autograd(first_order_backward(LABEL, _backward), setup_context=_setup_context)


_EagerPoly = eager_function("_EagerPoly", _forward_impl, _setup_context,
                            lambda ctx, dy: _backward(ctx, dy, _backward_impl), label=LABEL)


# PolyKANLinear's coeffs read [in, out, D + 1]: its route takes them as the module exposes them and makes the
# kernel layout [in, D + 1, out] inside the autograd node (a permute made outside is a node of its own; see
# eager_function), once for the forward and the backward: a view of kernel-layout storage, or a copy of a
# contiguous parameter
_SWAP_LAST = (lambda t: t.permute(0, 2, 1), lambda g: g.permute(0, 2, 1))
_EagerPolyLayer = eager_function("_EagerPolyLayer", _forward_impl, _setup_context,
                                 lambda ctx, dy: _backward(ctx, dy, _backward_impl), {1: _SWAP_LAST}, LABEL,
                                 prepare=lambda inputs: (inputs[0], inputs[1].contiguous(), *inputs[2:]))


def poly_apply(x, coeffs, bias, basis, lut_size, alpha, beta, strategy, precision="fp32", layer_layout=False):
    """:func:`poly_forward` with autograd on x [N, in]: the registered op under tracing, the eager route
    otherwise. ``layer_layout``: coeffs come as PolyKANLinear exposes them, [in, out, D + 1]."""
    return op_or_eager(poly_forward, _EagerPolyLayer if layer_layout else _EagerPoly, x)(
        x, coeffs, bias, basis, lut_size, alpha, beta, strategy, precision)


def poly_kan(
    x: Tensor,
    coeffs: Tensor,
    bias: Tensor | None = None,
    basis: str = "chebyshev",
    lut_size: int = 0,
    alpha: float = 1.0,
    beta: float = 1.0,
    strategy: str = "auto",
    precision: str = "fp32",
) -> Tensor:
    """``y[..., o] = sum_i sum_d coeffs[i, d, o] P_d(tanh x[..., i]) (+ bias[o])`` for x (..., in).

    coeffs [in, D + 1, out] (the kernel layout); ``lut_size = 0`` evaluates the basis exactly by its
    recurrence, ``lut_size >= 2`` reads it from tables of that many points on [-1, 1] (see
    ``warpkan.kernels.poly`` for the bases and the interpolation error bound). ``strategy``: "fused", "gemm"
    or "auto"; ``precision``: "fp32" or "bf16" (the GEMM strategy's opt-in to bf16 tensor cores, float32
    I/O only, with the error bound in the module docstring). See the module docstring.
    """
    check_tensor("x", x, ndim_min=1)
    check_tensor("coeffs", coeffs, ndim=3, like=x)
    n_in, n_basis, n_out = coeffs.shape
    check_tensor("x", x, last_dim=n_in)
    kp.check_basis(basis, n_basis - 1, alpha, beta)
    lut_size = _checks.non_negative_int("lut_size", lut_size)
    if lut_size == 1:
        raise ValueError(f"lut_size must be 0 (exact) or an int >= 2, got {lut_size}")
    if bias is not None:
        check_tensor("bias", bias, shape=(n_out,), like=x)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    check_precision(precision, x.dtype)
    return on_rows(x, n_in, lambda x2: poly_apply(x2, coeffs, bias, basis, lut_size, float(alpha), float(beta),
                                                  strategy, precision))
