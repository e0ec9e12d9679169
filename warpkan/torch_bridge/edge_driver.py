"""The torch side of the edge engine, for every edge family (B-spline, UKAN, polynomial): the two strategies
on torch tensors, and the one precision rule of their GEMMs.

A family's op hands over its family, a frame maker and the tensors the frame holds; this module picks the
kernels and allocates the outputs. Every tensor argument must be contiguous.

- ``stencil`` (:func:`stencil_forward`, :func:`stencil_backward`): the engine's kernels evaluate each edge's K
  bases locally; the warp-tiled ones where a table plan applies on CUDA (recorded once per signature and
  replayed), the per-thread ones elsewhere (on torch's stream, scratch from torch's allocator).
- ``gemm`` (:func:`gemm_forward`, :func:`gemm_backward`): the engine writes the transposed dense basis of a
  chunk of rows, ``A^T`` [width, rows] with width = in (silu rows of a fused base path) + in n_coef, and cuBLAS
  (through torch) does the contractions with the combined weight ``W = [base_weight_t; coef * scaler_t]`` (the
  coefficients themselves for an unscaled family): ``y = A W (+ bias)``, ``dW = A^T dy``, ``dA^T = W dy^T``; the
  engine folds ``dA`` into dx and splits ``dW`` into the parameter gradients. Rows go in chunks of at most
  ``GEMM_CHUNK_BYTES`` of basis (``CPU_GEMM_CHUNK_BYTES`` on the CPU, to stay in cache): no O(N in n_coef)
  tensor exists, and none is kept for the backward pass.

``precision`` (the gemm strategy's contractions; the stencil kernels always compute in the I/O dtype, and
float64 layers always take "fp32", i.e. their own dtype):

- ``"fp32"``: full-precision cuBLAS (TF32 off for these GEMMs whatever torch's setting).
- ``"tf32"``: TF32 tensor cores (operands rounded to a 10-bit mantissa inside cuBLAS, fp32 accumulation).
- ``"bf16"``: the basis is written as bfloat16 by the expansion kernel, the weight and ``dy`` are cast once per
  call (a polynomial layer's public-layout table by the same launch that puts it in the kernels' layout), bf16
  tensor cores multiply with fp32 accumulation; the weight gradient comes out of its GEMM in fp32 (cuBLAS's
  bf16 x bf16 -> fp32 product), y in the caller's dtype.
- ``"auto"`` (resolved by :func:`resolve_precision`): bf16 under bf16 autocast, else torch's own rule for
  float32 matmuls, ``torch.get_float32_matmul_precision()``: "highest" -> fp32, "high" -> tf32,
  "medium" -> bf16 (as nn.Linear under the same setting).

Error bound of a contraction C = A B of length K (A the basis, B the weight or dy), elementwise, with u the
unit roundoff of the operands' rounding (u = 2^-24 fp32; 2^-10 tf32, whose conversion inside cuBLAS may
truncate; 2^-8 bf16, rounded to nearest; :data:`PRECISION_UNIT_ROUNDOFF`):

    |C_computed - C| <= (2 u + K 2^-24) (|A| |B|)

(each operand is off by at most u relative, their product by 2u + u^2; the fp32 sum of K terms errs by at
most K 2^-24 of the sum of magnitudes), plus u |C| under bf16 for the GEMMs that round their results to bf16
once (a bf16 y, as under autocast; the basis gradient, which stays bf16 and so halves its traffic; not the
weight gradient, written in fp32). So (3 u + K 2^-24) (|A| |B|) holds for every precision. The input
gradient adds the fp32 contraction with dB/dx on top.
"""

import threading
from typing import Callable, NamedTuple

import torch
import warp as wp
from torch import Tensor

from ..kernels.edge import launch as edge
from ..kernels.edge import tiled as edge_tiled
from ..kernels.edge.dense import dense_kernels, dense_width
from ..kernels.edge.strategy import STRATEGIES
from ._common import (RecordedLaunches, SideStream, TorchWorkspace, autocast_dtype, check_tensor, keyword_launcher,
                      matmul_precision, needed_grads, on_side, runs_registered_op, to_warp, warp_device, warp_stream)

__all__ = ["STRATEGIES", "PRECISIONS", "PRECISION_UNIT_ROUNDOFF", "check_strategy", "check_precision",
           "resolve_precision", "stencil_forward", "stencil_backward", "gemm_forward", "gemm_backward", "expand_basis",
           "EdgeSpec", "combined_weight", "node_cached", "node_combined_weight", "split_weight_grad",
           "differentiable_backward", "grad_buffers", "MAX_X_DERIVATIVE", "dense_basis", "contract_basis",
           "expand_contract", "edge_dense_basis", "edge_contract_basis", "edge_expand_contract", "spec_of",
           "EdgeView", "check_view_rows"]

PRECISIONS = ("auto", "fp32", "tf32", "bf16")
# Relative rounding of each GEMM operand under each precision (see the module docstring's error bound).
PRECISION_UNIT_ROUNDOFF = {"fp32": 2.0**-24, "tf32": 2.0**-10, "bf16": 2.0**-8}
# Scratch for one chunk of the dense basis (and its gradient) in the "gemm" strategy.
GEMM_CHUNK_BYTES = 128 * 2**20
# On the CPU at most this much: the chunk then stays in a core's L2 cache (1-2 MiB on current x86 cores) from
# the expansion kernel that writes it to the GEMMs that read it, where a chunk of up to 128 MiB went out to
# memory in between. Measured with scripts/cpu_strategy.py (one thread, fwd+bwd, KANLinear G=32 k=3):
# (1024, 32->32) 22.6 -> 8.7 ms, (4096, 32->32) 91 -> 32 ms, (4096, 16->16) 40 -> 14.5 ms.
CPU_GEMM_CHUNK_BYTES = 2**20
# A forward's dense basis of at most this many bytes, made in one chunk, is kept for its backward (the eager
# routes' gemm strategy; with the combined weight, which is small), which then reads it instead of writing it
# again: two launches and one pass over the basis fewer a step, for a basis-sized buffer held from the forward to the backward (as efficient-kan's
# autograd holds its basis). Under bf16 the KAN-Mixer's token-mixing layers hold 38 MB each.
KEEP_BASIS_BYTES = 256 * 2**20
_FLOAT32_MATMUL_RULE = {"highest": "fp32", "high": "tf32", "medium": "bf16"}


def check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    return strategy


def check_precision(precision: str, dtype: torch.dtype) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if dtype == torch.float64 and precision in ("tf32", "bf16"):
        raise ValueError(f"precision={precision!r} needs float32 x and parameters, got float64")


def resolve_precision(precision: str, dtype: torch.dtype, device: torch.device) -> str:
    """The precision "auto" resolves to (see the module docstring): "bf16" under bf16 autocast, else torch's
    float32 matmul rule; float64 always resolves to "fp32" (its own dtype)."""
    check_precision(precision, dtype)
    if dtype == torch.float64:
        return "fp32"
    if precision != "auto":
        return precision
    if autocast_dtype(device) == torch.bfloat16:
        return "bf16"
    return _FLOAT32_MATMUL_RULE[torch.get_float32_matmul_precision()]

_launch = RecordedLaunches()


def _tiled_forward(x, *rest, family, make_frame, n_frame, frame_config, use_base, record=False):
    frame_views, (base_weight_t, scaler_t, coef, bias, coef_pad, y) = rest[:n_frame], rest[n_frame:]
    return edge_tiled.launch_tiled_forward(family, make_frame(*frame_views, *frame_config), x, base_weight_t, scaler_t,
                                           coef, bias, y, use_base, coef_pad=coef_pad, record=record)


def _tiled_backward(dy, x, *rest, family, make_frame, n_frame, frame_config, use_base, deterministic, record=False):
    frame_views = rest[:n_frame]
    base_weight_t, scaler_t, coef, coef_pad, dx, d_base, d_scaler, d_coef, partial_coef, partial_params = rest[n_frame:]
    return edge_tiled.launch_tiled_backward(family, make_frame(*frame_views, *frame_config), dy, x, base_weight_t,
                                            scaler_t, coef, use_base, dx=dx, d_base_weight_t=d_base, d_scaler_t=d_scaler,
                                            d_coef=d_coef, deterministic=deterministic, coef_pad=coef_pad,
                                            partial_coef=partial_coef, partial_params=partial_params, overwrite=True,
                                            record=record)


_TILED_FORWARD = keyword_launcher(_tiled_forward)
_TILED_BACKWARD = keyword_launcher(_tiled_backward)


def stencil_forward(family, make_frame, frame_tensors: tuple, frame_config: tuple, x: Tensor, base_weight_t: Tensor,
                 scaler_t: Tensor, coef: Tensor, use_base: bool, bias: "Tensor | None" = None,
                 deterministic: bool = False) -> Tensor:
    """y [N, out] of the engine's forward (the forward is deterministic on every path)."""
    n_rows, n_out = x.shape[0], coef.shape[2]
    y = x.new_empty((n_rows, n_out))
    if n_rows == 0 or n_out == 0:
        return y
    if edge_tiled.forward_plan(family, x.is_cuda, coef.shape[1]) is not None and x.shape[1]:
        coef_pad = x.new_empty(edge_tiled.coef_pad_shape(family, coef.shape))
        config = (("family", family), ("make_frame", make_frame), ("n_frame", len(frame_tensors)),
                  ("frame_config", frame_config), ("use_base", use_base))
        _launch(_TILED_FORWARD, (x, *frame_tensors, base_weight_t, scaler_t, coef, bias, coef_pad, y), config)
        return y
    frame = make_frame(*(to_warp(t) for t in frame_tensors), *frame_config)
    edge.launch_forward(family, frame, to_warp(x), to_warp(base_weight_t), to_warp(scaler_t), to_warp(coef), to_warp(y),
                        bias=None if bias is None else to_warp(bias), use_base=use_base, stream=warp_stream(x.device),
                        tiled=False, workspace=TorchWorkspace(x.device))
    return y


def grad_buffers(x, base_weight_t, scaler_t, coef, need_x, need_params, zero=False):
    """(dx, d_base_weight_t, d_scaler_t, d_coef) buffers: each in the strides ``empty_like`` gives its tensor
    (a shared table's gradient: one table, seen with the same zero input stride), or empty where not needed;
    zero-filled with ``zero``."""
    def make(t, needed):
        if not needed:
            return x.new_empty((0,))
        if t.dim() == 3 and t.stride(0) == 0 and t.shape[0] > 1:  # a shared table (see kernels.edge.family)
            one = torch.zeros_like(t[0]) if zero else torch.empty_like(t[0])
            return one.unsqueeze(0).expand_as(t)
        return torch.zeros_like(t) if zero else torch.empty_like(t)

    return make(x, need_x), make(base_weight_t, need_params), make(scaler_t, need_params), make(coef, need_params)


def bind_tiled_backward(family, make_frame, frame_tensors: tuple, frame_config: tuple, dy_like: Tensor, x: Tensor,
                        base_weight_t: Tensor, scaler_t: Tensor, coef: Tensor, use_base: bool, deterministic: bool,
                        need_x: bool, need_params: bool) -> "tuple | None":
    """The tiled pass of :func:`stencil_backward` (overwriting the gradients: no fill) made ahead, where its plan
    applies and the parameter gradients are asked for: (launch, d_base_weight_t, d_scaler_t, d_coef), the launch
    bound (``RecordedLaunches.bind``) with dy, x and dx given when called (``launch(dy, x, dx)``, or
    ``launch(dy, x)`` without need_x; dy in the layout of ``dy_like``, dx in x's), and the parameter gradients
    it writes (empty where not asked for). None where the tiled pass does not apply."""
    n_rows, n_in, n_coef, n_out = x.shape[0], x.shape[1], coef.shape[1], coef.shape[2]
    plan = edge_tiled.backward_plan(family, x.is_cuda, n_coef)
    if not (plan is not None and edge_tiled.backward_takes(n_out, need_params, deterministic, need_x, plan.banded)
            and n_rows and n_in and n_out):
        return None
    _, d_base, d_scaler, d_coef = grad_buffers(x, base_weight_t, scaler_t, coef, False, need_params)
    coef_pad = x.new_empty(edge_tiled.coef_pad_shape(family, coef.shape))
    partial_coef = partial_params = None
    if deterministic:
        coef_shape, params_shape = edge_tiled.partial_shapes(n_rows, n_in, n_coef, n_out)
        partial_coef, partial_params = x.new_empty(coef_shape), x.new_empty(params_shape)
    config = (("family", family), ("make_frame", make_frame), ("n_frame", len(frame_tensors)),
              ("frame_config", frame_config), ("use_base", use_base), ("deterministic", deterministic))
    tensors = (dy_like, x, *frame_tensors, base_weight_t, scaler_t, coef, coef_pad, x if need_x else None, d_base,
               d_scaler, d_coef, partial_coef, partial_params)
    late = (0, 1, 6 + len(frame_tensors)) if need_x else (0, 1)
    return _launch.bind(_TILED_BACKWARD, tensors, config, late=late), d_base, d_scaler, d_coef


def stencil_backward(family, make_frame, frame_tensors: tuple, frame_config: tuple, dy: Tensor, x: Tensor,
                  base_weight_t: Tensor, scaler_t: Tensor, coef: Tensor, use_base: bool, deterministic: bool,
                  need_x: bool, need_params: bool, entry_order: "Tensor | None" = None) -> tuple:
    """(dx, d_base_weight_t, d_scaler_t, d_coef) of :func:`stencil_forward`; those not asked for come back empty.
    The tiled pass (:func:`bind_tiled_backward`) where its plan applies and the parameter gradients are asked
    for; else the per-thread kernels into zero-filled buffers. ``entry_order``: see
    ``kernels.edge.launch.launch_backward`` (shared tables)."""
    tiled = bind_tiled_backward(family, make_frame, frame_tensors, frame_config, dy, x, base_weight_t, scaler_t, coef,
                                use_base, deterministic, need_x, need_params)
    if tiled is not None:
        launch, d_base, d_scaler, d_coef = tiled
        dx = launch.backward(dy, x, need_x)
        return dx if need_x else x.new_empty((0,)), d_base, d_scaler, d_coef
    dx, d_base, d_scaler, d_coef = grad_buffers(x, base_weight_t, scaler_t, coef, need_x, need_params, zero=True)
    frame = make_frame(*(to_warp(t) for t in frame_tensors), *frame_config)
    edge.launch_backward(family, frame, to_warp(dy), to_warp(x), to_warp(base_weight_t), to_warp(scaler_t),
                         to_warp(coef), use_base=use_base, dx=to_warp(dx) if need_x else None,
                         d_base_weight_t=to_warp(d_base) if need_params else None,
                         d_scaler_t=to_warp(d_scaler) if need_params else None,
                         d_coef=to_warp(d_coef) if need_params else None, deterministic=deterministic,
                         stream=warp_stream(x.device), workspace=TorchWorkspace(x.device), tiled=False,
                         entry_order=None if entry_order is None else to_warp(entry_order))
    return dx, d_base, d_scaler, d_coef


# ---------------------------------------------------------------------------------------------- gemm strategy
# torch's bf16 x bf16 -> fp32 GEMM (``torch.mm(..., out_dtype=)``, CUDA); without it, a bf16 result and a cast
_MM_OUT_DTYPE = "dtype_out" in torch.ops.aten.mm.overloads()


def _mm(a: Tensor, b: Tensor, out: Tensor) -> None:
    """out = a @ b. bfloat16 operands: a bf16 GEMM (tensor cores, float32 accumulation; the same in float32
    arithmetic on the CPU), its float32 result rounded to bf16 once into a bfloat16 out (y under autocast, the
    basis gradient), or written into a float32 out as it is (a weight gradient, y outside autocast: cuBLAS's
    bf16 x bf16 -> fp32 GEMM, no bf16 result and no cast kernel after it)."""
    if a.dtype != torch.bfloat16:
        torch.mm(a, b, out=out)
    elif not a.is_cuda:
        out.copy_(torch.mm(a.float(), b.float()))
    elif out.dtype == torch.bfloat16:
        torch.mm(a, b, out=out)
    elif _MM_OUT_DTYPE:
        torch.mm(a, b, out_dtype=out.dtype, out=out)
    else:
        out.copy_(torch.mm(a, b))


def _mm_widened(a: Tensor, b: Tensor, dtype: torch.dtype) -> Tensor:
    """a @ b as a new float32 tensor for bfloat16 operands (``dtype`` float32; see :func:`_mm`): on CUDA one
    bf16 x bf16 -> fp32 GEMM, no bf16 result and no cast after it."""
    if a.is_cuda and _MM_OUT_DTYPE:
        return torch.mm(a, b, out_dtype=dtype)
    out = torch.empty((a.shape[0], b.shape[1]), dtype=dtype, device=a.device)
    _mm(a, b, out)
    return out


def _mm_add(c: Tensor, a: Tensor, b: Tensor) -> None:
    """c += a @ b (see :func:`_mm`; c float32 for bfloat16 operands)."""
    if a.dtype != torch.bfloat16:
        c.addmm_(a, b)
    elif not a.is_cuda:
        c.add_(torch.mm(a.float(), b.float()))
    elif _MM_OUT_DTYPE:
        c.add_(torch.mm(a, b, out_dtype=c.dtype))
    else:
        c.add_(torch.mm(a, b))


def _chunk_rows(n_rows: int, width: int, bytes_per_entry: int, is_cuda: bool, keep: bool = False) -> int:
    """Rows per chunk of the dense basis: at most GEMM_CHUNK_BYTES of scratch (CPU_GEMM_CHUNK_BYTES on the
    CPU), a multiple of 64 rows (aligned leading dimensions for the tensor-core GEMMs) when more than 64 fit.
    ``keep`` (CUDA): a basis to keep for the backward goes in one chunk of up to KEEP_BASIS_BYTES."""
    limit = GEMM_CHUNK_BYTES if is_cuda else min(GEMM_CHUNK_BYTES, CPU_GEMM_CHUNK_BYTES)
    if keep and is_cuda and n_rows * width * bytes_per_entry <= KEEP_BASIS_BYTES:
        return max(n_rows, 1)
    rows = max(1, limit // max(1, width * bytes_per_entry))
    if rows > 64:
        rows -= rows % 64
    return min(rows, max(n_rows, 1))


def _expand(x, scale, *rest, family, make_frame, n_frame, frame_config, n_coef, use_base, order=0, record=False):
    frame_views, (basis_t,) = rest[:n_frame], rest[n_frame:]
    return edge.launch_expand_basis(family, make_frame(*frame_views, *frame_config), x, n_coef, basis_t, use_base,
                                    record=record, order=order, scale=scale)


def _contract(x, scale, *rest, family, make_frame, n_frame, frame_config, n_coef, use_base, order=1, record=False):
    frame_views, (d_basis_t, dx) = rest[:n_frame], rest[n_frame:]
    return edge.launch_contract_basis_grad(family, make_frame(*frame_views, *frame_config), x, n_coef, d_basis_t, dx,
                                           use_base, record=record, order=order, scale=scale)


def _expand_contract(x, scale, scale_lo, *rest, family, make_frame, n_frame, frame_config, n_coef, use_base, order,
                     lo_is_scale, record=False):
    frame_views, (g, basis_t, dx, dx_lo) = rest[:n_frame], rest[n_frame:]
    return edge.launch_expand_contract(family, make_frame(*frame_views, *frame_config), x, n_coef, g, basis_t, dx,
                                       dx_lo, use_base, record=record, order=order, scale=scale, scale_lo=scale_lo,
                                       lo_is_scale=lo_is_scale)


def _combine(base_weight_t, scaler_t, coef, weight, family, use_base, record=False):
    return edge.launch_combine_weights(family, base_weight_t, scaler_t, coef, weight, use_base, record=record)


def _split(d_weight, scaler_t, coef, d_base, d_scaler, d_coef, family, use_base, record=False):
    return edge.launch_split_param_grads(family, d_weight, scaler_t, coef, d_base, d_scaler, d_coef, use_base,
                                         record=record)


_EXPAND, _CONTRACT, _EXPAND_CONTRACT, _COMBINE, _SPLIT = (keyword_launcher(f) for f in (_expand, _contract,
                                                                                         _expand_contract, _combine,
                                                                                         _split))


def _frame_config(family, make_frame, frame_tensors, frame_config, n_coef, use_base) -> tuple:
    return (("family", family), ("make_frame", make_frame), ("n_frame", len(frame_tensors)),
            ("frame_config", frame_config), ("n_coef", n_coef), ("use_base", use_base))


_LOADED_GEMM_MODULES: set = set()
_THREADS_WITH_CUBLAS: set = set()


def load_gemm_modules(family, precision: str, device: torch.device) -> None:
    """Make ready what the gemm strategy of ``family`` (and the basis dtype of ``precision``) launches on
    ``device``, outside a capture: its Warp module, loaded once, and this thread's cuBLAS handles (torch makes
    them at a thread's first GEMM on a device). An eager call that takes the stencil kernels where a call
    recorded into a CUDA graph would take the gemm strategy (``choose_strategy``'s host-bound rule) calls this,
    the forward on the caller's thread and the backward on autograd's: a module load or a ``cublasCreate``
    inside a stream capture invalidates the capture (the capture after eager warm-up steps)."""
    basis = "bfloat16" if precision == "bf16" else family.scalar_name
    key = (family.key, basis, str(device))
    if key not in _LOADED_GEMM_MODULES:
        wp.load_module(dense_kernels(family, basis).module, device=warp_device(device))
        _LOADED_GEMM_MODULES.add(key)
    thread = (str(device), threading.get_ident())
    if thread not in _THREADS_WITH_CUBLAS:
        one = torch.ones(1, 1, device=device)
        torch.mm(one, one)
        torch.mm(one.bfloat16(), one.bfloat16())  # the bf16 GEMMs' cuBLASLt handle too
        _THREADS_WITH_CUBLAS.add(thread)


def _gemm_weight(family, base_weight_t, scaler_t, coef, use_base, basis_dtype) -> Tensor:
    """W [width, out] in the basis dtype: [base_weight_t; coef * scaler_t] by one kernel (scaled families), or
    the coefficients [in n_coef, out] themselves (a view, or one conversion; scaler_t None)."""
    if scaler_t is None:
        weight = coef.reshape(-1, coef.shape[2])
        return weight if weight.dtype == basis_dtype else weight.to(basis_dtype)
    width = dense_width(coef.shape[0], coef.shape[1], use_base)
    weight = coef.new_empty((width, coef.shape[2]), dtype=basis_dtype)
    _launch(_COMBINE, (base_weight_t, scaler_t, coef, weight), (("family", family), ("use_base", use_base)))
    return weight


def expand_basis(family, make_frame, frame_tensors: tuple, frame_config: tuple, x: Tensor, n_coef: int,
                 use_base: bool = False, order: int = 0, scale: "Tensor | None" = None) -> Tensor:
    """The transposed dense basis [width, N] of x [N, in] in x's dtype (see :mod:`.dense` of the engine): what
    the gemm strategy contracts, for callers that inspect the bases themselves; ``order`` > 0: its x-derivative
    of that order; ``scale`` [N, in]: input i's entries of row n times scale[n, i]."""
    x = x.contiguous()
    basis_t = x.new_empty((dense_width(x.shape[1], n_coef, use_base), x.shape[0]))
    if basis_t.numel():
        config = (*_frame_config(family, make_frame, frame_tensors, frame_config, n_coef, use_base), ("order", order))
        _launch(_EXPAND, (x, None if scale is None else scale.contiguous(), *frame_tensors, basis_t), config)
    return basis_t


def gemm_forward(family, make_frame, frame_tensors: tuple, frame_config: tuple, x: Tensor, base_weight_t, scaler_t,
                 coef: Tensor, use_base: bool, precision: str, bias: "Tensor | None" = None,
                 keep: "dict | None" = None, out_dtype: "torch.dtype | None" = None,
                 side: "SideStream | None" = None) -> Tensor:
    """y [N, out] by the gemm strategy; ``precision`` resolved (not "auto"). ``scaler_t`` None: an unscaled
    family without a base path (the polynomial one), whose weight is the coefficient table itself. ``out_dtype``
    (default x's): y's dtype; bf16 with ``precision="bf16"`` is the GEMM's own output (an autocast caller's
    dtype), with no fp32 copy of it.

    ``keep`` (a dict): what :func:`gemm_backward` (``kept=``) then reads instead of making it again: the combined
    weight (``"weight"``), and, where the whole dense basis takes at most :data:`KEEP_BASIS_BYTES` (and, on the
    CPU, one cache-sized chunk), the basis written in one chunk (``"basis"``).

    ``side`` (a :class:`~._common.SideStream`, in a CUDA-graph capture): the combined weight is made on the side
    stream (after the work the caller put there, UKAN's generated table) while the first chunk's basis is
    written, and joined before the first product."""
    n_rows, n_in = x.shape
    n_coef, n_out = coef.shape[1], coef.shape[2]
    width = dense_width(n_in, n_coef, use_base)
    y = x.new_empty((n_rows, n_out), dtype=out_dtype)
    if n_rows == 0 or n_out == 0:
        return y
    if width == 0:
        return y.copy_(bias.expand(n_rows, n_out)) if bias is not None else y.zero_()
    basis_dtype = torch.bfloat16 if precision == "bf16" else x.dtype
    chunk = _chunk_rows(n_rows, width, basis_dtype.itemsize, x.is_cuda, keep is not None)
    scratch = x.new_empty((chunk * width,), dtype=basis_dtype)
    if keep is not None and chunk == n_rows and scratch.numel() * scratch.element_size() <= KEEP_BASIS_BYTES:
        keep["basis"] = scratch.view(width, n_rows)
    config = _frame_config(family, make_frame, frame_tensors, frame_config, n_coef, use_base)
    with on_side(side):
        weight = _gemm_weight(family, base_weight_t, scaler_t, coef, use_base, basis_dtype)
    if keep is not None:
        keep["weight"] = weight
    with matmul_precision(precision, x.device):
        for start in range(0, n_rows, chunk):
            stop = min(start + chunk, n_rows)
            basis_t = scratch[: width * (stop - start)].view(width, stop - start)
            _launch(_EXPAND, (x[start:stop], None, *frame_tensors, basis_t), config)
            if start == 0 and side is not None:
                side.join()
            if bias is not None and basis_dtype == x.dtype == y.dtype:
                torch.addmm(bias, basis_t.t(), weight, out=y[start:stop])
            else:
                _mm(basis_t.t(), weight, out=y[start:stop])
    return y.add_(bias) if bias is not None and not basis_dtype == x.dtype == y.dtype else y


def gemm_backward(family, make_frame, frame_tensors: tuple, frame_config: tuple, dy: Tensor, x: Tensor, base_weight_t,
                  scaler_t, coef: Tensor, use_base: bool, precision: str, need_x: bool, need_params: bool,
                  kept: "dict | None" = None, side: "SideStream | None" = None) -> tuple:
    """(dx, d_base_weight_t, d_scaler_t, d_coef) of :func:`gemm_forward`, each written by its last op (no
    zero fills); those not asked for (and, unscaled, the base and scaler ones) come back empty. ``kept``: what
    the forward kept (``gemm_forward(keep=)``): its combined weight, and the dense basis of every row, read
    instead of making them again (and not written: a retained graph's second backward reads them too).

    ``side`` (a :class:`~._common.SideStream`, in a CUDA-graph capture; the caller joins it): a scaled family's
    weight gradient is split into the parameters' on the side stream, forked once the last chunk's product is
    in, side by side with that chunk's basis gradient product and contraction (dx); the caller's own work on
    them (UKAN's CG-MLP backward) can follow there. The products stay on the current stream: torch keeps a
    cuBLAS workspace a stream, and one made on the side stream during a capture would outlive the graph's
    memory pool (torch frees the capture stream's alone)."""
    n_rows, n_in = x.shape
    n_coef, n_out = coef.shape[1], coef.shape[2]
    width = dense_width(n_in, n_coef, use_base)
    scaled = scaler_t is not None
    empty = x.new_empty((0,))
    dx = torch.empty_like(x) if need_x else empty
    # in coef's strides (a public-layout parameter's gradient is then written where AccumulateGrad takes it as it
    # is) and the layer's dtype (an unscaled family's coefficients may come as the bf16 GEMM operand: _prepare)
    d_coef = torch.empty_like(coef, dtype=x.dtype) if need_params else empty
    d_base = torch.empty_like(base_weight_t) if need_params and scaled else empty
    d_scaler = torch.empty_like(scaler_t) if need_params and scaled else empty
    if n_rows == 0 or width == 0 or n_out == 0:
        for grad in (dx, d_base, d_scaler, d_coef):
            grad.zero_()
        return dx, d_base, d_scaler, d_coef
    basis_dtype = torch.bfloat16 if precision == "bf16" else x.dtype
    dy_mm = dy.to(basis_dtype)
    basis = kept.get("basis") if kept else None
    weight = kept.get("weight") if kept else None
    if need_x and weight is None:
        weight = _gemm_weight(family, base_weight_t, scaler_t, coef, use_base, basis_dtype)
    # unscaled, the weight's gradient is the coefficients' (in their layout): written in place
    d_weight = (x.new_empty((width, n_out)) if scaled else d_coef.view(width, n_out)) if need_params else None
    # the basis gradient reuses the basis's scratch: in stream order the d_weight GEMM has read the basis before
    # the dA GEMM overwrites it
    chunk = n_rows if basis is not None else _chunk_rows(n_rows, width, basis_dtype.itemsize, x.is_cuda)
    scratch = x.new_empty((chunk * width,), dtype=basis_dtype) if need_x or basis is None else None
    config = _frame_config(family, make_frame, frame_tensors, frame_config, n_coef, use_base)
    split = need_params and scaled  # the weight gradient's split, still to launch
    with matmul_precision(precision, x.device):
        for start in range(0, n_rows, chunk):
            stop = min(start + chunk, n_rows)
            part = scratch[: width * (stop - start)].view(width, stop - start) if scratch is not None else None
            if need_params:
                if basis is None:
                    _launch(_EXPAND, (x[start:stop], None, *frame_tensors, part), config)
                kept_or_part = basis if basis is not None else part
                if start == 0:
                    _mm(kept_or_part, dy_mm[start:stop], out=d_weight)
                else:
                    _mm_add(d_weight, kept_or_part, dy_mm[start:stop])
                if split and side is not None and stop == n_rows:  # d_weight complete: split on the side stream
                    side.fork().hold(d_weight)
                    with side:
                        _split_weight_grad(family, use_base, d_weight, scaler_t, coef, d_base, d_scaler, d_coef)
                    split = False
            if need_x:
                _mm(weight, dy_mm[start:stop].t(), out=part)
                _launch(_CONTRACT, (x[start:stop], None, *frame_tensors, part, dx[start:stop]), config)
    if split:
        _split_weight_grad(family, use_base, d_weight, scaler_t, coef, d_base, d_scaler, d_coef)
    return dx, d_base, d_scaler, d_coef


def _split_weight_grad(family, use_base, d_weight, scaler_t, coef, d_base, d_scaler, d_coef) -> None:
    _launch(_SPLIT, (d_weight, scaler_t, coef, d_base, d_scaler, d_coef), (("family", family), ("use_base", use_base)))


# ---------------------------------------------------------------------------------------------- higher order
# Gradients with create_graph=True. The first-order backward of every edge family is the same two contractions
# with the dense basis A(x) [width, N] of the family's bases (and SiLU rows): dx = contract_1(W dy^T, x) and
# dW = A_0(x) dy. Written with two autograd Functions whose own backward is again of that form,
#   A_m(x):            d/dx <G, A_m(x)> = contract_{m+1}(G, x)
#   contract_m(G, x):  d/dG = A_m(x) * h (per input row), d/dx = h * contract_{m+1}(G, x),
# they can be differentiated to the order the engine's bases have (d3B/dx3): u_xx of a PINN residual and the
# parameter gradients of a loss built from it. The kernels are the engine's dense-basis kernels. Where a backward
# needs two or three of those pieces of one (G, x), a third Function, expand_contract, gives them from one launch
# (its own backward is the sum of its outputs' formulas).
MAX_X_DERIVATIVE = 3


class EdgeSpec(tuple):
    """(family, make_frame, frame tensors, frame config, n_coef, use_base): what the dense-basis kernels need."""

    __slots__ = ()

    def __new__(cls, family, make_frame, frame_tensors, frame_config, n_coef, use_base):
        return super().__new__(cls, (family, make_frame, tuple(frame_tensors), tuple(frame_config), int(n_coef),
                                     bool(use_base)))

    @property
    def family(self):
        """The edge family (an ``EdgeFamily``) whose kernels evaluate the bases."""
        return self[0]

    @property
    def make_frame(self):
        """``make_frame(*frame tensors as warp arrays, *frame_config)``: the family's frame value."""
        return self[1]

    @property
    def frame_tensors(self) -> tuple:
        return self[2]

    @property
    def frame_config(self) -> tuple:
        """The frame's arguments after its tensors (plain values)."""
        return self[3]

    @property
    def n_coef(self) -> int:
        """Coefficients (bases) per input."""
        return self[4]

    @property
    def use_base(self) -> bool:
        """Whether the dense basis leads with each input's SiLU row (the fused base path)."""
        return self[5]

    def with_frame(self, frame_tensors) -> "EdgeSpec":
        """This spec with ``frame_tensors`` as its frame's tensors (a family's static spec, made once, given a
        call's tensors)."""
        family, make_frame, _, frame_config, n_coef, use_base = self
        return EdgeSpec(family, make_frame, frame_tensors, frame_config, n_coef, use_base)

    def launch_config(self) -> tuple:
        """The spec as the keyword configuration of a recorded launch (``RecordedLaunches``)."""
        return _frame_config(*self)

    def static_key(self) -> str:
        """The spec less its frame tensors as a string, registered (:func:`spec_of`): what a custom-op schema
        can carry. Families go by their compile key, frame makers by their qualified name."""
        family, make_frame, _, frame_config, n_coef, use_base = self
        static = (family, make_frame, frame_config, n_coef, use_base)
        key = _STATIC_KEYS.get(static)  # made once a static part: this runs per traced call
        if key is None:
            key = "|".join((_static_name(family), _static_name(make_frame), ",".join(map(_static_name, frame_config)),
                            str(n_coef), str(int(use_base))))
            _STATIC_SPECS.setdefault(key, static)
            _STATIC_KEYS[static] = key
        return key


def _static_name(value) -> str:
    if hasattr(value, "key") and hasattr(value, "n_bases"):  # an EdgeFamily
        return value.key
    if callable(value):
        return f"{value.__module__}.{value.__qualname__}"
    return repr(value)


_STATIC_SPECS: dict = {}  # EdgeSpec.static_key() -> the spec's static part
_STATIC_KEYS: dict = {}  # and back


def spec_of(static_key: str, frame_tensors) -> EdgeSpec:
    """The EdgeSpec of a registered static key and its frame tensors."""
    family, make_frame, frame_config, n_coef, use_base = _STATIC_SPECS[static_key]
    return EdgeSpec(family, make_frame, frame_tensors, frame_config, n_coef, use_base)


class EdgeView(NamedTuple):
    """An edge layer as the edge engine sees it at given rows x [N, in] (what an edge layer's ``edge_view``
    returns): ``y = A_0(x)^T W (+ bias)``, with A the dense basis of ``spec`` and W the combined weight
    (:meth:`weight`), plus ``base_activation(x) @ base_weight_t`` where the layer runs its base path in torch.

    Fields: ``spec`` (:class:`EdgeSpec`: the family, its frame, n_coef and whether the dense basis leads with
    the fused SiLU rows); ``coef`` [in, n_coef, out], the coefficient table the bases multiply (a view of the
    layer's parameters, or a table made from them by differentiable torch ops); ``base_weight_t`` and
    ``scaler_t`` [in, out], a scaled family's base weight and spline scaler (None for an unscaled family, whose
    weight is ``coef`` itself); ``bias`` [out] or None; ``base_activation``, the base path's activation where
    the layer runs it in torch (one the kernels do not fuse), else None."""

    spec: EdgeSpec
    coef: Tensor
    base_weight_t: "Tensor | None"
    scaler_t: "Tensor | None"
    bias: "Tensor | None"
    base_activation: "Callable | None"

    def weight(self, by_kernel: bool = False) -> Tensor:
        """The combined weight W [width, out]: ``[base_weight_t; coef * scaler_t]`` (its base rows only where
        the spec fuses the base path), or ``coef`` as [in n_coef, out] for an unscaled family.

        Args:
            by_kernel: make a scaled family's W by the combine kernel (one launch, its gradient split by the
                split kernel; eager callers) instead of torch ops (differentiable to any order, traceable).

        Returns:
            W [width, out] with width = ``dense_width(in, n_coef, use_base)``, in the coefficients' dtype.
        """
        if self.scaler_t is None:
            return self.coef.reshape(-1, self.coef.shape[2])
        if by_kernel:
            return _CombinedWeight.apply(self.base_weight_t, self.scaler_t, self.coef, self.spec.family,
                                         self.spec.use_base)
        return combined_weight(self.base_weight_t, self.scaler_t, self.coef, self.spec.use_base)


def check_view_rows(x, in_features: int, like: Tensor) -> None:
    """An edge layer's ``edge_view`` argument: rows x [N, in_features] of ``like``'s dtype and device, else a
    TypeError or ValueError naming ``x``."""
    check_tensor("x", x, ndim=2, last_dim=in_features, dtypes=(like.dtype,))
    if x.device != like.device:
        raise ValueError(f"x must be on the layer's device {like.device}, got {x.device}")


def _order_config(spec: EdgeSpec, order: int) -> tuple:
    return (*spec.launch_config(), ("order", order))


def _check_order(order: int, label: str) -> None:
    if order > MAX_X_DERIVATIVE:
        raise NotImplementedError(
            f"{label}: a derivative of order {order} in x was asked for; the edge families provide their bases' "
            f"derivatives up to order {MAX_X_DERIVATIVE} (enough for the parameter gradients of a loss built from "
            "u_xx, and for its x-gradient)")


def _scaled(h: Tensor, scale: Tensor | None) -> Tensor:
    return h if scale is None else h * scale


def _dense_basis_impl(x: Tensor, scale: "Tensor | None", order: int, spec: EdgeSpec) -> Tensor:
    _check_order(order, "edge layer")
    family, make_frame, frame_tensors, frame_config, n_coef, use_base = spec
    return expand_basis(family, make_frame, frame_tensors, frame_config, x, n_coef, use_base, order, scale)


def _contract_basis_impl(g: Tensor, x: Tensor, scale: "Tensor | None", order: int, spec: EdgeSpec) -> Tensor:
    _check_order(order, "edge layer")
    dx = torch.empty_like(x)
    if dx.numel():
        _launch(_CONTRACT, (x.contiguous(), None if scale is None else scale.contiguous(), *spec.frame_tensors,
                            g.contiguous(), dx), _order_config(spec, order))
    return dx


def _expand_contract_impl(g: Tensor, x: Tensor, scale: "Tensor | None", scale_lo: "Tensor | None", order: int,
                          spec: EdgeSpec, need_basis: bool, need_dx: bool, need_dx_lo: bool) -> tuple:
    _check_order(order + 1 if need_dx else order, "edge layer")
    n_coef, use_base = spec.n_coef, spec.use_base
    empty = x.new_empty((0,))
    basis_t = x.new_empty((dense_width(x.shape[1], n_coef, use_base), x.shape[0])) if need_basis else empty
    dx = torch.empty_like(x) if need_dx else empty
    dx_lo = torch.empty_like(x) if need_dx_lo else empty
    if x.numel():
        scale = None if scale is None else scale.contiguous()
        scale_lo = None if scale_lo is None else scale_lo.contiguous()
        # one tensor as both scales (a contraction's backward without a scale of its own) goes once
        lo_is_scale = scale_lo is not None and scale is not None and scale_lo.data_ptr() == scale.data_ptr()
        _launch(_EXPAND_CONTRACT, (x.contiguous(), scale, None if lo_is_scale else scale_lo, *spec.frame_tensors,
                                   g.contiguous(), basis_t if need_basis else None, dx if need_dx else None,
                                   dx_lo if need_dx_lo else None), (*_order_config(spec, order),
                                                                    ("lo_is_scale", lo_is_scale)))
    return basis_t, dx, dx_lo


# The pieces' autograd formulas, one for both routes. A backward that needs two or three of a piece's
# gradients takes them from one expand_contract (one evaluation of the bases, one read of g).
def _backward_of_basis(g, x, scale, order: int, spec: EdgeSpec, need_x: bool, need_scale: bool) -> tuple:
    """(d_x, d_scale) of A_order(x) * scale given its gradient g [width, N]: contract_{order+1}(g, x) * scale and
    contract_order(g, x)."""
    if need_x and need_scale:
        _, d_x, d_scale = expand_contract(g, x, scale, None, order, spec, False, True, True)
        return d_x, d_scale
    d_x = contract_basis(g, x, scale, order + 1, spec) if need_x else None
    d_scale = contract_basis(g, x, None, order, spec) if need_scale else None
    return d_x, d_scale


def _backward_of_contraction(g, x, h, scale, order: int, spec: EdgeSpec, need_g: bool, need_x: bool,
                             need_scale: bool) -> tuple:
    """(d_g, d_x, d_scale) of contract_order(g, x) * scale given its gradient h [N, in]: A_order(x) * hs,
    contract_{order+1}(g, x) * hs and contract_order(g, x) * h, with hs = h * scale."""
    h_scaled = _scaled(h, scale) if need_g or need_x else None
    if need_g + need_x + need_scale >= 2:
        d_g, d_x, d_scale = expand_contract(g, x, h_scaled, h, order, spec, need_g, need_x, need_scale)
        return (d_g if need_g else None), (d_x if need_x else None), (d_scale if need_scale else None)
    d_g = dense_basis(x, h_scaled, order, spec) if need_g else None
    d_x = contract_basis(g, x, h_scaled, order + 1, spec) if need_x else None
    d_scale = contract_basis(g, x, h, order, spec) if need_scale else None
    return d_g, d_x, d_scale


# ctx holds (x, scale), (g, x, scale) or (g, x, scale, scale_lo) first in saved_tensors, and ``order`` and ``spec``.
def _dense_basis_grads(ctx, g) -> tuple:
    x, scale = ctx.saved_tensors[:2]
    return _backward_of_basis(g, x, scale, ctx.order, ctx.spec, *needed_grads(ctx, (x, scale)))


def _contract_basis_grads(ctx, h) -> tuple:
    g, x, scale = ctx.saved_tensors[:3]
    return _backward_of_contraction(g, x, h, scale, ctx.order, ctx.spec, *needed_grads(ctx, (g, x, scale)))


def _expand_contract_grads(ctx, g_basis, g_dx, g_dx_lo) -> tuple:
    """(d_g, d_x, d_scale, d_scale_lo) of (A_m(x) scale, contract_{m+1}(g, x) scale, contract_m(g, x) scale_lo):
    the sum of the three outputs' own formulas, for the outputs that have a gradient."""
    g, x, scale, scale_lo = ctx.saved_tensors[:4]
    need_g, need_x, need_scale, need_scale_lo = needed_grads(ctx, (g, x, scale, scale_lo))
    order, spec = ctx.order, ctx.spec
    terms = []
    if g_basis is not None and g_basis.numel():
        terms.append((None, *_backward_of_basis(g_basis, x, scale, order, spec, need_x, need_scale), None))
    if g_dx is not None and g_dx.numel():
        terms.append((*_backward_of_contraction(g, x, g_dx, scale, order + 1, spec, need_g, need_x, need_scale),
                      None))
    if g_dx_lo is not None and g_dx_lo.numel():
        d_g, d_x, d_scale_lo = _backward_of_contraction(g, x, g_dx_lo, scale_lo, order, spec, need_g, need_x,
                                                         need_scale_lo)
        terms.append((d_g, d_x, None, d_scale_lo))
    return tuple(_sum_present(term[k] for term in terms) for k in range(4))


def _sum_present(parts) -> "Tensor | None":
    present = [p for p in parts if p is not None]
    return None if not present else present[0] if len(present) == 1 else sum(present[1:], present[0])


class _DenseBasis(torch.autograd.Function):
    """A_m(x) [width, N]: the order-m x-derivative of the dense basis of x [N, in], input i's entries of row n
    times scale[n, i] when a scale [N, in] is given. The eager route of ``warpkan::edge_dense_basis``."""

    @staticmethod
    def forward(ctx, x, scale, order, spec):
        ctx.save_for_backward(x, scale)
        ctx.order, ctx.spec = order, spec
        return _dense_basis_impl(x, scale, order, spec)

    @staticmethod
    def backward(ctx, g):
        return *_dense_basis_grads(ctx, g), None, None


class _ContractBasis(torch.autograd.Function):
    """dx [N, in] = sum over each input's rows of G [width, N] times the order-m x-derivative of its bases,
    times scale [N, in] when given. The eager route of ``warpkan::edge_contract_basis``."""

    @staticmethod
    def forward(ctx, g, x, scale, order, spec):
        ctx.save_for_backward(g, x, scale)
        ctx.order, ctx.spec = order, spec
        return _contract_basis_impl(g, x, scale, order, spec)

    @staticmethod
    def backward(ctx, h):
        return *_contract_basis_grads(ctx, h), None, None


class _ExpandContract(torch.autograd.Function):
    """(A_m(x) scale, contract_{m+1}(g, x) scale, contract_m(g, x) scale_lo), those asked for (the others come
    back empty): what the backward of a contraction or of a dense basis needs, in one launch. The eager route
    of ``warpkan::edge_expand_contract``."""

    @staticmethod
    def forward(ctx, g, x, scale, scale_lo, order, spec, need_basis, need_dx, need_dx_lo):
        ctx.save_for_backward(g, x, scale, scale_lo)
        ctx.order, ctx.spec = order, spec
        ctx.set_materialize_grads(False)
        return _expand_contract_impl(g, x, scale, scale_lo, order, spec, need_basis, need_dx, need_dx_lo)

    @staticmethod
    def backward(ctx, g_basis, g_dx, g_dx_lo):
        return *_expand_contract_grads(ctx, g_basis, g_dx, g_dx_lo), None, None, None, None, None


@torch.library.custom_op("warpkan::edge_dense_basis", mutates_args=(),
                         schema="(Tensor x, Tensor? scale, Tensor[] frame_tensors, str spec, int order) -> Tensor")
def edge_dense_basis(x, scale, frame_tensors, spec, order):
    """``_DenseBasis`` as a registered op: the spec by its static key (:meth:`EdgeSpec.static_key`)."""
    return _dense_basis_impl(x, scale, order, spec_of(spec, frame_tensors))


@edge_dense_basis.register_fake
def _(x, scale, frame_tensors, spec, order):
    _check_order(order, "edge layer")
    _, _, _, n_coef, use_base = _STATIC_SPECS[spec]
    return x.new_empty((dense_width(x.shape[1], n_coef, use_base), x.shape[0]))


@torch.library.custom_op("warpkan::edge_contract_basis", mutates_args=(),
                         schema="(Tensor g, Tensor x, Tensor? scale, Tensor[] frame_tensors, str spec, int order) "
                                "-> Tensor")
def edge_contract_basis(g, x, scale, frame_tensors, spec, order):
    """``_ContractBasis`` as a registered op."""
    return _contract_basis_impl(g, x, scale, order, spec_of(spec, frame_tensors))


@edge_contract_basis.register_fake
def _(g, x, scale, frame_tensors, spec, order):
    _check_order(order, "edge layer")
    return torch.empty_like(x)


@torch.library.custom_op("warpkan::edge_expand_contract", mutates_args=(),
                         schema="(Tensor g, Tensor x, Tensor? scale, Tensor? scale_lo, Tensor[] frame_tensors, "
                                "str spec, int order, bool need_basis, bool need_dx, bool need_dx_lo) "
                                "-> (Tensor, Tensor, Tensor)")
def edge_expand_contract(g, x, scale, scale_lo, frame_tensors, spec, order, need_basis, need_dx, need_dx_lo):
    """``_ExpandContract`` as a registered op."""
    return _expand_contract_impl(g, x, scale, scale_lo, order, spec_of(spec, frame_tensors), need_basis, need_dx,
                                 need_dx_lo)


@edge_expand_contract.register_fake
def _(g, x, scale, scale_lo, frame_tensors, spec, order, need_basis, need_dx, need_dx_lo):
    _check_order(order + 1 if need_dx else order, "edge layer")
    _, _, _, n_coef, use_base = _STATIC_SPECS[spec]
    empty = x.new_empty((0,))
    return (x.new_empty((dense_width(x.shape[1], n_coef, use_base), x.shape[0])) if need_basis else empty,
            torch.empty_like(x) if need_dx else empty, torch.empty_like(x) if need_dx_lo else empty)


def _expand_contract_setup(ctx, inputs, output):
    g, x, scale, scale_lo, frame_tensors, spec, order = inputs[:7]
    ctx.save_for_backward(g, x, scale, scale_lo, *frame_tensors)
    ctx.order, ctx.static_key = order, spec
    ctx.set_materialize_grads(False)


def _expand_contract_backward(ctx, g_basis, g_dx, g_dx_lo):
    frame_tensors = ctx.saved_tensors[4:]
    ctx.spec = spec_of(ctx.static_key, frame_tensors)
    return (*_expand_contract_grads(ctx, g_basis, g_dx, g_dx_lo), [None] * len(frame_tensors), None, None, None,
            None, None)


edge_expand_contract.register_autograd(_expand_contract_backward, setup_context=_expand_contract_setup)


def _registered_setup(n_leading: int):
    def setup_context(ctx, inputs, output):
        *leading, frame_tensors, spec, order = inputs
        ctx.save_for_backward(*leading, *frame_tensors)
        ctx.order = order
        ctx.static_key, ctx.n_leading = spec, n_leading

    return setup_context


def _registered_backward(grads):
    def backward(ctx, grad):
        frame_tensors = ctx.saved_tensors[ctx.n_leading:]
        ctx.spec = spec_of(ctx.static_key, frame_tensors)  # what the shared formulas read
        return *grads(ctx, grad), [None] * len(frame_tensors), None, None

    return backward


edge_dense_basis.register_autograd(_registered_backward(_dense_basis_grads), setup_context=_registered_setup(2))
edge_contract_basis.register_autograd(_registered_backward(_contract_basis_grads),
                                      setup_context=_registered_setup(3))


def dense_basis(x: Tensor, scale: "Tensor | None", order: int, spec: EdgeSpec) -> Tensor:
    """A_m(x), differentiable: the registered op under tracing (:func:`runs_registered_op`), the eager
    Function otherwise."""
    if runs_registered_op(x):
        return edge_dense_basis(x, scale, list(spec.frame_tensors), spec.static_key(), order)
    return _DenseBasis.apply(x, scale, order, spec)


def expand_contract(g: Tensor, x: Tensor, scale: "Tensor | None", scale_lo: "Tensor | None", order: int,
                    spec: EdgeSpec, need_basis: bool, need_dx: bool, need_dx_lo: bool) -> tuple:
    """(A_m(x) scale, contract_{m+1}(g, x) scale, contract_m(g, x) scale_lo), differentiable, those not asked
    for empty; routed as :func:`dense_basis`."""
    if runs_registered_op(x):
        return edge_expand_contract(g, x, scale, scale_lo, list(spec.frame_tensors), spec.static_key(), order,
                                    need_basis, need_dx, need_dx_lo)
    return _ExpandContract.apply(g, x, scale, scale_lo, order, spec, need_basis, need_dx, need_dx_lo)


def contract_basis(g: Tensor, x: Tensor, scale: "Tensor | None", order: int, spec: EdgeSpec) -> Tensor:
    """contract_m(G, x), differentiable, routed as :func:`dense_basis`."""
    if runs_registered_op(x):
        return edge_contract_basis(g, x, scale, list(spec.frame_tensors), spec.static_key(), order)
    return _ContractBasis.apply(g, x, scale, order, spec)


def combined_weight(base_weight_t: Tensor, scaler_t: Tensor, coef: Tensor, use_base: bool) -> Tensor:
    """W [width, out] = [base_weight_t; coef * scaler_t] (coef [in, n_coef, out]) by torch ops, differentiable to
    any order: the combine kernel's weight, for the ``create_graph=True`` formulas of the scaled families."""
    spline_weight = (coef * scaler_t.unsqueeze(1)).reshape(-1, coef.shape[2])
    return torch.cat([base_weight_t, spline_weight]) if use_base else spline_weight


def split_weight_grad(g: Tensor, scaler_t: Tensor, coef: Tensor, use_base: bool) -> tuple:
    """(d_base_weight_t or None, d_scaler_t, d_coef) of W = [base_weight_t; coef * scaler_t] by torch ops:
    differentiable to any order."""
    n_in, n_coef, n_out = coef.shape
    d_spline = g[n_in if use_base else 0:].reshape(n_in, n_coef, n_out)
    return (g[:n_in] if use_base else None), (d_spline * coef).sum(1), d_spline * scaler_t.unsqueeze(1)


class _CombinedWeight(torch.autograd.Function):
    """W = [base_weight_t; coef * scaler_t] by the combine kernel, its gradient split into the parameters by the
    split kernel, each gradient in the strides ``empty_like`` gives its parameter (a public-layout parameter's
    own, which AccumulateGrad takes without a copy): one launch each way where torch takes two and three ops.
    A create_graph backward splits by torch ops (:func:`split_weight_grad`), differentiable to any order."""

    @staticmethod
    def forward(ctx, base_weight_t, scaler_t, coef, family, use_base):
        ctx.save_for_backward(base_weight_t, scaler_t, coef)
        ctx.family, ctx.use_base = family, use_base
        return _gemm_weight(family, base_weight_t, scaler_t, coef, use_base, coef.dtype)

    @staticmethod
    def backward(ctx, g):
        base_weight_t, scaler_t, coef = ctx.saved_tensors
        if torch.is_grad_enabled():
            d_base, d_scaler, d_coef = split_weight_grad(g, scaler_t, coef, ctx.use_base)
        else:  # without a base path the kernel zeroes d_base, which is dropped
            d_base, d_scaler, d_coef = (torch.empty_like(t) for t in (base_weight_t, scaler_t, coef))
            _launch(_SPLIT, (g.contiguous(), scaler_t, coef, d_base, d_scaler, d_coef),
                    (("family", ctx.family), ("use_base", ctx.use_base)))
        return (d_base if ctx.use_base else None), d_scaler, d_coef, None, None


def node_cached(ctx, name: str, sources: tuple, make):
    """``make()``, made once per autograd node (kept on ``ctx`` under ``name``) and again when a ``sources``
    tensor changed in place (its version counter) or is another tensor (its address: what was made keeps the
    earlier sources alive, so a new one cannot take their memory). A ``create_graph=True`` backward runs once per
    ``autograd.grad`` through the node (a PINN residual's u_x and u_xx each pass every layer), and what it builds
    from the node's parameters by differentiable ops is the same each time; a view made again each call (a
    transpose of a parameter) keeps the parameter's address and version. A later call must not ask autograd
    for gradients of its own views through what was made (they are not in its graph), only of the parameters
    themselves, as the B-spline and UKAN range formulas do."""
    traced = torch.compiler.is_compiling() or any(
        type(t) not in (Tensor, torch.nn.Parameter) or t.is_meta for t in sources)
    if traced:  # fake, functional or meta tensors: no address to key by, made each call
        return make()
    key = tuple((t.data_ptr(), t._version) for t in sources)
    made = getattr(ctx, name, None)
    if made is None or made[0] != key:
        made = (key, make())
        setattr(ctx, name, made)
    return made[1]


def node_combined_weight(ctx, family, base_weight_t: Tensor, scaler_t: Tensor, coef: Tensor, use_base: bool) -> Tensor:
    """:func:`combined_weight`, made once per autograd node (:func:`node_cached`). Eager: by ``_CombinedWeight``
    (a launch each way); traced (:func:`runs_registered_op`): by torch ops."""
    def make():
        if runs_registered_op(coef):
            return combined_weight(base_weight_t, scaler_t, coef, use_base)
        return _CombinedWeight.apply(base_weight_t, scaler_t, coef, family, use_base)

    return node_cached(ctx, "_combined_weight", (base_weight_t, scaler_t, coef), make)


def differentiable_backward(spec: EdgeSpec, dy: Tensor, x: Tensor, weight: Tensor, need_x: bool,
                            need_weight: bool) -> tuple:
    """(dx, dW) of ``y = A_0(x)^T W`` as differentiable torch graphs (for ``create_graph=True``): ``weight``
    [width, out] is the caller's combined weight, made from its parameters by differentiable ops
    (:func:`node_combined_weight`, or the coefficients themselves), so that dx reaches them by ordinary autograd.
    Either is None when not asked for."""
    dx = contract_basis(weight @ dy.t(), x, None, 1, spec) if need_x else None
    d_weight = dense_basis(x, None, 0, spec) @ dy if need_weight else None
    return dx, d_weight
