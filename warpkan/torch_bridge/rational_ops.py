"""torch.library custom ops of the group-rational activation, on the Warp kernels of ``warpkan.kernels.rational``.

The ops take x [N, C]; :func:`group_rational` takes (..., C) channels-last inputs and is what
``GroupRational`` calls. Arithmetic and the coefficient-gradient sums run in fp32 for fp32/bf16/fp16 x (fp64
for fp64 x); the coefficient gradients come back in the dtype of the weights.

Host cost. A small layer's eager step is host-bound, and on the GPU machine every torch launch (a cast, a
zero fill) costs 10-25 us of host time, more than these kernels take at (64, 384). So the weights go to the
kernels as they are (they widen them on load), the gradient kernels overwrite dx, d_numerator and
d_denominator in the weights' own dtype (no zero fill, no cast back), and the only torch calls left are
allocations.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from .. import _checks
from ..kernels import rational as kr
from . import rational_higher
from ._common import (WP_DTYPES, RecordedLaunches, check_tensor, eager_function, first_order_backward,
                      op_or_eager, params_used_by_this_backward, warp_device)

__all__ = ["group_rational", "group_rational_forward", "group_rational_backward"]

IO_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_IO_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _arith_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernels compute in for I/O of ``dtype``."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _aligned(t: Tensor) -> Tensor:
    """Contiguous, with a 16-byte aligned start (the kernels load 16-byte vectors)."""
    t = t.contiguous()
    if t.numel() and t.data_ptr() % 16:
        t = t.clone()
    return t


def _coefficient_dtype(x: Tensor, weight_numerator: Tensor, weight_denominator: Tensor) -> torch.dtype:
    """The dtype the kernels read the weights in: their own when they share one, else x's arithmetic one."""
    if weight_numerator.dtype == weight_denominator.dtype:
        return weight_numerator.dtype
    return _arith_dtype(x.dtype)


def _coefficients(x: Tensor, weight_numerator: Tensor, weight_denominator: Tensor) -> tuple[Tensor, Tensor]:
    dtype = _coefficient_dtype(x, weight_numerator, weight_denominator)
    # the weights as they are where they already fit (the usual case): no conversion call, a few us of a
    # node's host time
    return tuple(w if w.dtype == dtype and w.is_contiguous() else w.to(dtype).contiguous()
                 for w in (weight_numerator, weight_denominator))


@functools.lru_cache(maxsize=256)
def _partials_size(n_rows, n_channels, num_groups, num_order, den_order, dtype, device) -> int:
    return kr.backward_partials_size(n_rows, n_channels, num_groups, num_order, den_order,
                                     kr.io_name_of(WP_DTYPES[dtype]), warp_device(device))


# Recorded launches (see RecordedLaunches): the host cost of a call is a few microseconds a launch.
_LAUNCHES = RecordedLaunches()


def _record_forward(x, a, b, y, num_groups, variant, record):
    return kr.launch_forward(x, a, b, y, num_groups, variant, record=record)


def _record_backward(dy, x, a, b, dx, da, db, partials, num_groups, variant, record):
    # the coefficient gradients are always reduced in a fixed order (see the kernels), so ``deterministic``
    # needs no launch of its own
    return kr.launch_backward(dy, x, a, b, num_groups, variant, dx=dx, da=da, db=db, accumulate_dx=False,
                              accumulate_params=False, partials=partials, record=record)


def _forward_impl(x, weight_numerator, weight_denominator, num_groups, variant, deterministic, out_dtype=None):
    x = _aligned(x)
    a, b = _coefficients(x, weight_numerator, weight_denominator)
    y = torch.empty_like(x) if out_dtype is None else torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if x.numel():
        _LAUNCHES(_record_forward, (x, a, b, y), num_groups, variant)
    return y


@torch.library.custom_op("warpkan::group_rational_forward", mutates_args=())
def group_rational_forward(
    x: Tensor, weight_numerator: Tensor, weight_denominator: Tensor, num_groups: int, variant: str, deterministic: bool
) -> Tensor:
    """x [N, C] -> F(x) [N, C]. ``deterministic`` only affects the backward pass (autograd sees it here)."""
    return _forward_impl(x, weight_numerator, weight_denominator, num_groups, variant, deterministic)


@group_rational_forward.register_fake
def _(x, weight_numerator, weight_denominator, num_groups, variant, deterministic):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _backward_impl(dy, x, weight_numerator, weight_denominator, num_groups, variant, deterministic, need_x,
                   need_params):
    x = _aligned(x)
    dy = _aligned(dy.to(x.dtype))
    a, b = _coefficients(x, weight_numerator, weight_denominator)
    # the kernels overwrite every gradient (nothing to zero), except on an empty x
    dx, da, db = _grad_buffers(x, weight_numerator, weight_denominator, need_x, need_params,
                               torch.empty if x.numel() else torch.zeros)
    if x.numel() and (need_x or need_params):
        size = _partials_size(x.shape[0], x.shape[1], num_groups, a.shape[1] - 1, b.shape[1], x.dtype,
                              x.device) if need_params else 1
        partials = torch.empty(size, dtype=torch.float64, device=x.device)
        _LAUNCHES(_record_backward, (dy, x, a, b, dx if need_x else None, da if need_params else None,
                                     db if need_params else None, partials), num_groups, variant)
    return dx, da, db


@torch.library.custom_op("warpkan::group_rational_backward", mutates_args=())
def group_rational_backward(
    dy: Tensor,
    x: Tensor,
    weight_numerator: Tensor,
    weight_denominator: Tensor,
    num_groups: int,
    variant: str,
    deterministic: bool,
    need_x: bool,
    need_params: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, d_weight_numerator, d_weight_denominator); dx in x's dtype, the others in the weights' dtype
    when the two weights share one (else in the arithmetic dtype: fp32, or fp64 for fp64 x). The ones not
    asked for come back empty."""
    return _backward_impl(dy, x, weight_numerator, weight_denominator, num_groups, variant, deterministic, need_x,
                          need_params)


def _grad_buffers(x, weight_numerator, weight_denominator, need_x, need_params, alloc):
    dtype = _coefficient_dtype(x, weight_numerator, weight_denominator)
    # dx is overwritten by the kernel: no need to zero it
    dx = torch.empty(x.shape if need_x else (0,), dtype=x.dtype, device=x.device)
    da = alloc(weight_numerator.shape if need_params else (0,), dtype=dtype, device=x.device)
    db = alloc(weight_denominator.shape if need_params else (0,), dtype=dtype, device=x.device)
    return dx, da, db


@group_rational_backward.register_fake
def _(dy, x, weight_numerator, weight_denominator, num_groups, variant, deterministic, need_x, need_params):
    return _grad_buffers(x, weight_numerator, weight_denominator, need_x, need_params, torch.empty)


def _setup_context(ctx, inputs, output):
    x, weight_numerator, weight_denominator, num_groups, variant, deterministic = inputs
    ctx.save_for_backward(x, weight_numerator, weight_denominator)
    ctx.config = (num_groups, variant, deterministic)
    ctx.op_inputs = inputs  # for create_graph=True (_higher_backward): the op's inputs, with their history


def _backward(ctx, dy):
    x, weight_numerator, weight_denominator = ctx.saved_tensors
    need_x = ctx.needs_input_grad[0]
    need_params = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
    if not (need_x or need_params):
        return None, None, None, None, None, None
    dx, da, db = group_rational_backward(
        dy, x, weight_numerator, weight_denominator, *ctx.config, need_x, need_params
    )
    return (
        dx if need_x else None,
        da.to(weight_numerator.dtype) if ctx.needs_input_grad[1] else None,
        db.to(weight_denominator.dtype) if ctx.needs_input_grad[2] else None,
        None, None, None,
    )


def _higher_backward(ctx, inputs, dy):
    """The gradients as differentiable graphs, for ``create_graph=True``: the jet kernels' x-derivatives and
    coefficient gradients (``rational_higher``), which differentiate again to the fourth x-derivative."""
    x, weight_numerator, weight_denominator, num_groups, variant, deterministic = inputs
    need_x = ctx.needs_input_grad[0]
    need_params = (ctx.needs_input_grad[1] or ctx.needs_input_grad[2]) and params_used_by_this_backward(ctx)
    dx, da, db = rational_higher.differentiable_backward(dy.to(x.dtype), x, weight_numerator, weight_denominator,
                                                         variant, need_x, need_params)
    return (dx, da if need_params and ctx.needs_input_grad[1] else None,
            db if need_params and ctx.needs_input_grad[2] else None, None, None, None)


# how errors name the op
LABEL = "GroupRational (warpkan::group_rational_forward)"
group_rational_forward.register_autograd(first_order_backward(LABEL, _backward, _higher_backward),
                                         setup_context=_setup_context)


# Where a small layer's step waits on the host, the backward's Python is what costs most: it runs on autograd's
# device thread, at about half the caller's speed on the GPU machine (docs/perf-notes-host.md). So an eager node
# makes its backward's launch in its forward, on the caller's thread: the coefficient views, the coefficient
# gradients and partial sums (a few KiB), and the launch's signature, with dy, x and dx bound late
# (``RecordedLaunches.bind``). The backward then checks dy and x, allocates dx and launches. A second backward of
# a retained graph, an unaligned dy and create_graph=True take the general path.
def bind_backward(x, weight_numerator, weight_denominator, num_groups, variant, y, need_x, need_params):
    """The backward launch of a rational node that gave ``y`` from x, worked out in its forward (see above):
    a plan for :func:`run_bound_backward`, or None where the general path must run (nothing to compute, or an
    x the kernels can't read in place)."""
    if not (x.numel() and (need_x or need_params) and x.is_contiguous()) or x.data_ptr() % 16:
        return None
    a, b = _coefficients(x, weight_numerator, weight_denominator)
    dtype = a.dtype  # _coefficient_dtype's
    da = torch.empty(weight_numerator.shape if need_params else (0,), dtype=dtype, device=x.device)
    db = torch.empty(weight_denominator.shape if need_params else (0,), dtype=dtype, device=x.device)
    size = _partials_size(x.shape[0], x.shape[1], num_groups, a.shape[1] - 1, b.shape[1], x.dtype,
                          x.device) if need_params else 1
    partials = torch.empty(size, dtype=torch.float64, device=x.device)
    # y stands for dy (contiguous, in y's dtype: x's, or the route's out_dtype) and x for dx (empty_like x) in
    # the signature
    launch = _LAUNCHES.bind(_record_backward, (y, x, a, b, x if need_x else None, da if need_params else None,
                                               db if need_params else None, partials), num_groups, variant,
                            late=(0, 1, 4) if need_x else (0, 1))
    return launch, da, db, need_x, need_params, y.dtype


def run_bound_backward(plan, dy, x, weight_numerator, weight_denominator, config, need_x, need_params):
    """(dx, d_numerator, d_denominator) of a rational node, by its bound launch (``plan`` of
    :func:`bind_backward`, made with the same ``need_x`` and ``need_params``) where dy and x allow it, else by
    the general path; ``config`` is (num_groups, variant, deterministic). The parameter gradients come back in
    the weights' dtypes; None where not asked."""
    if (plan is None or dy.dtype != plan[-1] or not (dy.is_contiguous() and x.is_contiguous())
            or dy.data_ptr() % 16 or x.data_ptr() % 16):
        dx, da, db = _backward_impl(dy, x, weight_numerator, weight_denominator, *config, need_x, need_params)
    else:
        launch, da, db = plan[:3]
        dx = launch.backward(dy, x, need_x)
    if not need_params:
        da = db = None
    if da is not None and da.dtype != weight_numerator.dtype:
        da = da.to(weight_numerator.dtype)
    if db is not None and db.dtype != weight_denominator.dtype:
        db = db.to(weight_denominator.dtype)
    return dx if need_x else None, da, db


def _eager_setup_context(ctx, inputs, output):
    _setup_context(ctx, inputs, output)
    x, weight_numerator, weight_denominator, num_groups, variant, deterministic = inputs
    need = ctx.needs_input_grad
    ctx.plan = bind_backward(x, weight_numerator, weight_denominator, num_groups, variant, output, need[0],
                             need[1] or need[2])


def _eager_backward(ctx, dy):
    plan, ctx.plan = ctx.plan, None  # the buffers go to autograd alone (AccumulateGrad takes them as they are)
    x, weight_numerator, weight_denominator = ctx.saved_tensors
    need = ctx.needs_input_grad
    dx, da, db = run_bound_backward(plan, dy, x, weight_numerator, weight_denominator, ctx.config, need[0],
                                    need[1] or need[2])
    return dx, da if need[1] else None, db if need[2] else None, None, None, None


_EagerGroupRational = eager_function(
    "_EagerGroupRational", _forward_impl, _eager_setup_context, _eager_backward, label=LABEL,
    higher=_higher_backward, rows=True)
# out_dtype -> the eager route whose y has that dtype; made here, not on first use, so that torch.compile never
# traces the making of one (a graph break)
_EAGER_OUT_ROUTES = {
    dtype: eager_function(f"_EagerGroupRational_{_IO_NAMES[dtype]}", functools.partial(_forward_impl, out_dtype=dtype),
                          _eager_setup_context, _eager_backward, label=LABEL, higher=_higher_backward, rows=True)
    for dtype in IO_DTYPES}


def _eager_route(out_dtype):
    """The eager route whose node gives y in ``out_dtype`` (x's when None): the forward kernel stores it, the
    backward kernel reads dy in it. For an fp32 x before a bf16 layer (a GR-KAN layer's rational under
    autocast), that is half the bytes of y and dy, and no cast launch on either side."""
    return _EagerGroupRational if out_dtype is None else _EAGER_OUT_ROUTES[out_dtype]


def group_rational(
    x: Tensor,
    weight_numerator: Tensor,
    weight_denominator: Tensor,
    num_groups: int,
    variant: str = "A",
    deterministic: bool = False,
    out_dtype: "torch.dtype | None" = None,
) -> Tensor:
    """The group-rational activation on x (..., C), channels-last, fp32/bf16/fp16/fp64.

    weight_numerator [1 (shared, as in KAT) or num_groups, m + 1]; weight_denominator [num_groups, n].
    Group g covers channels [g C/G, (g + 1) C/G). Variant "A": ``Q = 1 + sum_j |b_j| |x|^(j+1)`` (KAT's
    kernels); "B": ``Q = 1 + |sum_j b_j x^(j+1)|`` (FlashKAT's paper). ``out_dtype``: the result's dtype
    (x's when None; see :func:`check_out_dtype`).
    """
    check_tensor("x", x, ndim_min=1, dtypes=IO_DTYPES)
    out_dtype = check_out_dtype(x, out_dtype)
    num_groups = kr.check_groups(num_groups, x.shape[-1], "the last dimension of x")
    variant = _checks.one_of("variant", variant, kr.VARIANTS)
    weight_dtypes = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
    check_tensor("weight_numerator", weight_numerator, ndim=2, dtypes=weight_dtypes)
    check_tensor("weight_denominator", weight_denominator, ndim=2, dtypes=weight_dtypes)
    if weight_numerator.shape[0] not in (1, num_groups) or not 1 <= weight_numerator.shape[1] <= kr.MAX_ORDER + 1:
        raise ValueError(
            f"weight_numerator must have shape (1 or {num_groups}, m + 1) with m <= {kr.MAX_ORDER}, "
            f"got {tuple(weight_numerator.shape)}"
        )
    if weight_denominator.shape[0] != num_groups or not 1 <= weight_denominator.shape[1] <= kr.MAX_ORDER:
        raise ValueError(
            f"weight_denominator must have shape ({num_groups}, n) with 1 <= n <= {kr.MAX_ORDER}, "
            f"got {tuple(weight_denominator.shape)}"
        )
    for name, w in (("weight_numerator", weight_numerator), ("weight_denominator", weight_denominator)):
        if w.device != x.device:
            raise ValueError(f"{name} must be on device {x.device} (that of x), got {w.device}")
    return apply_checked(x, weight_numerator, weight_denominator, num_groups, variant, deterministic, out_dtype)


def check_out_dtype(x: Tensor, out_dtype) -> "torch.dtype | None":
    """``out_dtype`` checked against x: None (x's dtype), or a dtype of ``IO_DTYPES`` that x's arithmetic runs
    in (float32, bfloat16 or float16 for those x; float64 for float64 x). Returns None for x's own dtype."""
    if out_dtype is None or out_dtype == x.dtype:
        return None
    if out_dtype not in IO_DTYPES or _arith_dtype(out_dtype) != _arith_dtype(x.dtype):
        raise TypeError(f"out_dtype must be None or a dtype of {[str(d) for d in IO_DTYPES]} computed like x's "
                        f"({x.dtype}: float32, bfloat16 and float16 together, float64 alone), got {out_dtype!r}")
    return out_dtype


def apply_checked(x: Tensor, weight_numerator: Tensor, weight_denominator: Tensor, num_groups: int, variant: str,
                  deterministic: bool, out_dtype: "torch.dtype | None" = None) -> Tensor:
    """:func:`group_rational` on arguments already checked (``GroupRational`` checks its weights and
    configuration once, at construction, and x per call): a small layer's eager step is host-bound.
    ``out_dtype`` (checked, None for x's): eagerly the node's own output dtype; the registered op (traced code)
    keeps x's and converts after it."""
    op = op_or_eager(group_rational_forward, _eager_route(out_dtype), x)
    y = op(x, weight_numerator, weight_denominator, num_groups, variant, deterministic)
    return y if out_dtype is None else y.to(out_dtype)  # no op where the node made it
