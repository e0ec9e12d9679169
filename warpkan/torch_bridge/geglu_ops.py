"""torch.library custom ops of the fused GEGLU feed-forward layer, on the kernels of ``warpkan.kernels.geglu``.

Forward, by the number of rows N (``small_batch_rows`` is the switch):

- N <= small_batch_rows, float16/bfloat16, hidden and inter multiples of 8, 16-byte aligned operands
  (N <= ``TC_MAX_ROWS``): the tensor-core weight-streaming kernels (whole weight rows copied into shared
  memory with cp.async, mma.sync with float32 accumulation, one wave of warps on equal runs of the
  reduction, per-group partial sums combined in a fixed order, the gate in the first combine; on compute
  capability 9.0+ the launches after the first are programmatic dependents, so the second projection's
  warps start copying W_o while the first projection's slowest warps finish);
- N <= min(small_batch_rows, ``MAX_SMALL_ROWS``) otherwise: the SIMT weight-streaming kernels (two
  launches; every weight element read once, the gate fused into the first projection).
- otherwise: one concatenated ``[W_u | W_v]`` GEMM (cuBLAS through torch), the Warp gate kernel that reads
  ``[u | v]`` once and writes h, and the W_o GEMM.

Either way the op also returns ``uv`` (the pre-activations), which the backward needs; it is not
differentiable. Backward: ``dh = dout W_o`` (GEMM), the Warp gate-backward kernel that reads ``dh`` and
``uv`` once and writes ``duv`` and the recomputed ``h``, then the weight-gradient and ``dx`` GEMMs. GEMMs
in float16/bfloat16 accumulate in float32 (cuBLAS); the Warp kernels always compute in float32.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _checks
from ..kernels import geglu as kg
from ._common import (RecordedLaunches, check_tensor, eager_function, first_order_backward, op_or_eager,
                      warp_device)

__all__ = ["geglu_ffn", "geglu_ffn_forward", "geglu_ffn_backward", "GEGLU_DTYPES", "DEFAULT_SMALL_BATCH_ROWS"]

GEGLU_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DEFAULT_SMALL_BATCH_ROWS = kg.DEFAULT_SMALL_BATCH_ROWS  # the streaming paths serve up to this many rows
_TC_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _tensor_core_path(x: Tensor, w_uv: Tensor, w_o: Tensor) -> bool:
    """The tensor-core streaming kernels serve float16/bfloat16 with hidden and inter multiples of 8 and
    16-byte aligned operands (row strides follow from the contiguity and the shape)."""
    io_name = _TC_DTYPES.get(x.dtype)
    return (
        io_name is not None
        and kg.tc_eligible(io_name, x.shape[0], w_o.shape[0], w_o.shape[1])
        and all(t.data_ptr() % 16 == 0 for t in (x, w_uv, w_o))
    )


def _empty_like_rows(x: Tensor, cols: int) -> Tensor:
    return x.new_empty((x.shape[0], cols))


# Recorded Warp launches (see RecordedLaunches): at small batch the GPU work takes tens of microseconds, about
# what building views and packing launches costs on the host.
_launch = RecordedLaunches()


def _forward_impl(
    x: Tensor,
    w_uv: Tensor,
    b_uv: Optional[Tensor],
    w_o: Tensor,
    b_o: Optional[Tensor],
    activation: str,
    small_batch_rows: int,
) -> tuple[Tensor, Tensor]:
    """x [N, hidden], w_uv [2 inter, hidden], b_uv [2 inter] or None, w_o [hidden, inter], b_o [hidden] or
    None -> (out [N, hidden], uv [N, 2 inter])."""
    x, w_uv, w_o = x.contiguous(), w_uv.contiguous(), w_o.contiguous()
    b_uv = b_uv.contiguous() if b_uv is not None else None
    b_o = b_o.contiguous() if b_o is not None else None
    n_rows = x.shape[0]
    n_inter = w_o.shape[1]
    h = _empty_like_rows(x, n_inter)
    if 0 < n_rows <= small_batch_rows and _tensor_core_path(x, w_uv, w_o):
        uv = _empty_like_rows(x, 2 * n_inter)
        out = _empty_like_rows(x, w_o.shape[0])
        plan_up, plan_down = kg.tc_plans(w_o.shape[0], n_inter, n_rows, *kg.device_shape(warp_device(x.device)))
        partial_up = x.new_empty((plan_up.slots, n_rows, 2 * n_inter), dtype=torch.float32)
        partial_down = x.new_empty((plan_down.slots, n_rows, w_o.shape[0]), dtype=torch.float32)
        _launch(kg.launch_tc_forward, (x, w_uv, b_uv, w_o, b_o, uv, h, out, partial_up, partial_down), activation)
        return out, uv
    if 0 < n_rows <= min(small_batch_rows, kg.MAX_SMALL_ROWS):
        uv = _empty_like_rows(x, 2 * n_inter)
        out = _empty_like_rows(x, w_o.shape[0])
        _launch(kg.launch_small_forward, (x, w_uv, b_uv, w_o, b_o, uv, h, out), activation)
        return out, uv
    uv = F.linear(x, w_uv, b_uv)
    if n_rows > 0:
        _launch(kg.launch_activation, (uv, h), activation)
    return F.linear(h, w_o, b_o), uv


geglu_ffn_forward = torch.library.custom_op("warpkan::geglu_ffn_forward", _forward_impl, mutates_args=())


@geglu_ffn_forward.register_fake
def _(x, w_uv, b_uv, w_o, b_o, activation, small_batch_rows):
    return _empty_like_rows(x, w_o.shape[0]), _empty_like_rows(x, w_uv.shape[0])


def _backward_impl(
    dout: Tensor,
    x: Tensor,
    uv: Tensor,
    w_uv: Tensor,
    w_o: Tensor,
    activation: str,
    need_x: bool,
    need_params: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients (dx, d_w_uv, d_b_uv, d_w_o, d_b_o); the ones not asked for come back empty."""
    dout, x, uv = dout.contiguous(), x.contiguous(), uv.contiguous()
    n_rows, n_inter = x.shape[0], w_o.shape[1]
    dh = dout @ w_o
    duv = torch.empty_like(uv)
    h = _empty_like_rows(x, n_inter)
    if n_rows > 0:
        _launch(kg.launch_activation_backward, (dh, uv, duv, h), activation)
    dx = duv @ w_uv if need_x else _nothing(x)
    if need_params:
        # the bias gradients are row sums in the I/O dtype; torch accumulates them in float32
        return dx, duv.t() @ x, duv.sum(0), dout.t() @ h, dout.sum(0)
    return dx, _nothing(x), _nothing(x), _nothing(x), _nothing(x)


geglu_ffn_backward = torch.library.custom_op("warpkan::geglu_ffn_backward", _backward_impl, mutates_args=())


def _nothing(x: Tensor) -> Tensor:
    """A gradient not asked for: a fresh empty tensor (outputs of a custom op may not alias each other)."""
    return x.new_empty((0,))


@geglu_ffn_backward.register_fake
def _(dout, x, uv, w_uv, w_o, activation, need_x, need_params):
    dx = torch.empty_like(x) if need_x else _nothing(x)
    if need_params:
        return (
            dx, torch.empty_like(w_uv), w_uv.new_empty((w_uv.shape[0],)),
            torch.empty_like(w_o), w_o.new_empty((w_o.shape[0],)),
        )
    return dx, _nothing(x), _nothing(x), _nothing(x), _nothing(x)


def _setup_context(ctx, inputs, output):
    x, w_uv, b_uv, w_o, b_o, activation, small_batch_rows = inputs
    out, uv = output
    ctx.mark_non_differentiable(uv)
    # no zero-filled [N, 2 inter] gradient for uv (never differentiated) or for an unused out
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(x, uv, w_uv, w_o)
    ctx.activation = activation


def _backward(ctx, dout, _duv_unused, backward_op=geglu_ffn_backward):
    x, uv, w_uv, w_o = ctx.saved_tensors
    need = ctx.needs_input_grad
    need_x = need[0]
    need_params = any(need[1:5])
    if dout is None or not (need_x or need_params):
        return (None,) * 7
    dx, d_w_uv, d_b_uv, d_w_o, d_b_o = backward_op(dout, x, uv, w_uv, w_o, ctx.activation, need_x, need_params)
    return (
        dx if need_x else None,
        d_w_uv if need[1] else None,
        d_b_uv if need[2] else None,
        d_w_o if need[3] else None,
        d_b_o if need[4] else None,
        None,
        None,
    )


# how errors name the op (first-order only: see first_order_backward)
LABEL = "GEGLUFFN (warpkan::geglu_ffn_forward)"
geglu_ffn_forward.register_autograd(first_order_backward(LABEL, _backward), setup_context=_setup_context)

# The eager route: the same implementations and formula in one autograd.Function, without the custom-op
# dispatch (tens to hundreds of microseconds of host time a call on the GPU machine, about the layer's whole
# GPU time at small batch; see eager_function). Traced code sees the registered ops.
_EagerGEGLU = eager_function("_EagerGEGLU", _forward_impl, _setup_context,
                             lambda ctx, dout, duv: _backward(ctx, dout, duv, _backward_impl), label=LABEL, rows=True)


def geglu_ffn(
    x: Tensor,
    w_uv: Tensor,
    w_o: Tensor,
    b_uv: Tensor | None = None,
    b_o: Tensor | None = None,
    activation: str = "gelu",
    small_batch_rows: int = DEFAULT_SMALL_BATCH_ROWS,
) -> Tensor:
    """``(gate(x W_u^T + b_u) * (x W_v^T + b_v)) W_o^T + b_o`` on x (..., hidden).

    ``w_uv`` [2 inter, hidden] is ``W_u`` stacked on ``W_v`` (``nn.Linear`` layout), ``w_o`` [hidden,
    inter]. ``activation`` is ``"gelu"`` (erf), ``"gelu_tanh"`` or ``"gelu_sigmoid"`` (``u sigmoid(1.702
    u)``). Batches of at most ``small_batch_rows`` rows (capped at ``MAX_SMALL_ROWS``) take the
    weight-streaming Warp kernels; larger ones the concatenated GEMM and the fused Warp gate. dtypes:
    float16, bfloat16, float32, float64, the same for every tensor.
    """
    kg.activation_code(activation)  # raises ValueError naming the choices
    check_tensor("x", x, ndim_min=1, dtypes=GEGLU_DTYPES)
    check_tensor("w_o", w_o, ndim=2, dtypes=GEGLU_DTYPES, like=x)
    n_hidden, n_inter = w_o.shape
    check_tensor("x", x, last_dim=n_hidden, dtypes=GEGLU_DTYPES)
    check_tensor("w_uv", w_uv, shape=(2 * n_inter, n_hidden), dtypes=GEGLU_DTYPES, like=x)
    if b_uv is not None:
        check_tensor("b_uv", b_uv, shape=(2 * n_inter,), dtypes=GEGLU_DTYPES, like=x)
    if b_o is not None:
        check_tensor("b_o", b_o, shape=(n_hidden,), dtypes=GEGLU_DTYPES, like=x)
    small_batch_rows = _checks.non_negative_int("small_batch_rows", small_batch_rows)
    op = op_or_eager(geglu_ffn_forward, _EagerGEGLU, x)
    return op(x, w_uv, b_uv, w_o, b_o, activation, small_batch_rows)[0]
