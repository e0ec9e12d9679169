"""The one op pair of the edge families: ``warpkan::edge_forward`` and ``warpkan::edge_backward``.

Every edge layer is the edge engine's map for one :class:`~warpkan.torch_bridge.edge_driver.EdgeSpec` (the
family, its frame, coefficients per input, whether the SiLU base rows are fused)::

    y[n, o] = sum_i base_weight_t[i, o] silu(x[n, i])                      (the spec's use_base)
            + sum_i scaler_t[i, o] sum_m B_m(x[n, i]) coef[i, slot + m, o]  (scaler_t None: unscaled)
            + bias[o]                                                       (bias given)

KANLinear (B-spline families), PolyKANLinear / ChebyKANLinear (polynomial families, unscaled, with a bias) and
UKANLinear (its range table and its touched-pair table, a table shared by every input: ``coef`` [1, n_coef,
out]) differ only in the spec and in the layout their modules keep the parameters in. The registered ops carry
the spec as its static key (:meth:`EdgeSpec.static_key`) plus its frame tensors, as ``edge_dense_basis`` and
``edge_jet`` do; the eager routes carry the spec itself.

Schema::

    edge_forward(x, frame_tensors, base_weight_t?, scaler_t?, coef, bias?, entry_order?, spec, strategy,
                 precision, deterministic) -> y
    edge_backward(dy, x, frame_tensors, base_weight_t?, scaler_t?, coef, entry_order?, spec, strategy, precision,
                  deterministic, need_x, need_params, need_bias) -> (dx, d_base_weight_t, d_scaler_t, d_coef, d_bias)

``base_weight_t`` is given exactly when the spec fuses the base path; ``entry_order`` is the touched-pair
table's element order (the pair search's sort) that its atomic-free coefficient gradient follows. Gradients not
asked for (or of an input not given) come back empty; the parameters' in ``torch.empty_like``'s strides of each
parameter (a public-layout parameter's gradient is then taken by AccumulateGrad without a copy).

Routes. :func:`resolve_route` picks the strategy (:mod:`warpkan.kernels.edge.strategy`: the spline rule, the
polynomial families' rule, the stencil kernels for a shared table) and the gemm strategy's precision
(:func:`warpkan.torch_bridge.edge_driver.resolve_precision`). Eager calls run :func:`edge_apply`'s
``autograd.Function`` (one node a layer call, the custom-op dispatch skipped: ``_common.eager_function``),
resolving the route once for the forward and the backward; traced code (``torch.compile``, export, opcheck)
sees the registered ops. ``create_graph=True`` differentiates the engine's dense basis
(:func:`_higher_backward`), through a family's higher-order view where it has one
(:func:`register_higher_view`).
"""

from __future__ import annotations

import functools
import threading

import torch
import warp as wp
from torch import Tensor

from ..kernels.edge import tiled as edge_tiled
from ..kernels.edge.strategy import choose_strategy, single_slot_strategy
from . import _common
from ._common import (TRANSPOSED, WP_DTYPES, contiguous, copy_into, eager_function, first_order_backward, on_rows,
                      params_used_by_this_backward, refuse_transforms, warp_device)
from .edge_driver import (EdgeSpec, bind_tiled_backward, combined_weight, differentiable_backward, gemm_backward,
                          gemm_forward, load_gemm_modules, node_combined_weight, resolve_precision, spec_of,
                          split_weight_grad, stencil_backward, stencil_forward)

__all__ = ["edge_forward", "edge_backward", "edge_apply", "static_spec_maker", "resolve_route", "resolve_auto",
           "ready_for_capture", "register_higher_view", "stencil_param",
           "forward_impl", "backward_impl", "LAYOUTS"]

# the ops' inputs, by position (the eager routes take the same)
X, FRAME, BASE, SCALER, COEF, BIAS, ENTRY_ORDER, SPEC, STRATEGY, PRECISION, DETERMINISTIC = range(11)
N_INPUTS = 11
LABEL = "edge layer (warpkan::edge_forward)"
_FLOATS = (torch.float32, torch.float64)


def _auto_strategy(family, tiled: bool, x: Tensor, n_coef: int, n_out: int, precision: str, host_bound: bool) -> str:
    """The strategy "auto" takes for a call of ``family`` on x [N, in]: the polynomial families' rule
    (:func:`single_slot_strategy`) or the spline families' (:func:`choose_strategy`)."""
    if family.single_slot:
        return single_slot_strategy(x.shape[0], x.shape[1], n_out, n_coef, x.is_cuda, host_bound)
    return choose_strategy(x.shape[0], x.shape[1], n_out, n_coef, tiled, precision, host_bound)


def resolve_auto(family, tiled: bool, x: Tensor, n_coef: int, n_out: int, precision: str) -> str:
    """The strategy "auto" takes for a call of a spline or polynomial family on x [N, in]: its rule with the
    call's resolved precision, host-bound unless the call is recorded into a CUDA graph (``capture_step``,
    ``graphed_training_step``, ``torch.compile(mode="reduce-overhead")``), where only the GPU time counts;
    ``tiled``: the warp-tiled stencil kernels apply. Where an eager call takes the stencil kernels and a captured
    one would take the gemm strategy, the family's gemm module is loaded here: the capture after eager warm-up
    steps must not load one."""
    captured = x.is_cuda and torch.cuda.is_current_stream_capturing()
    strategy = _auto_strategy(family, tiled, x, n_coef, n_out, precision, not captured)
    if strategy == "stencil" and not captured and (tiled or family.single_slot):
        ready_for_capture(family, x, n_coef, n_out, precision)
    return strategy


def ready_for_capture(family, x: Tensor, n_coef: int, n_out: int, precision: str) -> None:
    """Where an eager call of a spline family runs the tiled stencil kernels (or of a polynomial family the
    stencil kernels) and a call of the same shape recorded into a CUDA graph would take the gemm strategy: that
    strategy's module loaded, and this thread's cuBLAS handles made (``edge_driver.load_gemm_modules``), so that
    a capture after eager warm-up steps does neither. The forward runs on the caller's thread and the backward
    on autograd's: each pass calls this."""
    if _auto_strategy(family, True, x, n_coef, n_out, precision, host_bound=False) == "gemm":
        load_gemm_modules(family, precision, x.device)


def resolve_route(spec: EdgeSpec, x: Tensor, n_out: int, strategy: str, precision: str) -> tuple[str, str]:
    """(strategy, precision) of one call on x [N, in]: "auto" resolved by the family's rule (module
    docstring), the precision by the gemm strategy's rule (float64: "fp32", its own dtype)."""
    precision = resolve_precision(precision, x.dtype, x.device)
    family = spec.family
    if family.shared_table:
        if strategy == "gemm":
            raise ValueError(f"strategy='gemm' needs a dense basis, which the shared-table family {family.key} "
                             "(UKAN's touched-pair table) does not have; use 'stencil' or 'auto'")
        return "stencil", precision
    if strategy == "auto":
        tiled = x.dtype in _FLOATS and edge_tiled.tiled_applies(family, x.is_cuda, spec.n_coef)
        strategy = resolve_auto(family, tiled, x, spec.n_coef, n_out, precision)
    return strategy, precision


_ONES: dict = {}


def _unit_scaler(x: Tensor, n_in: int, n_out: int) -> Tensor:
    """[in, out] ones, the stencil kernels' scaler of an unscaled family: a stride-0 view of one cached element
    (not cached while a CUDA graph is captured: its memory would belong to the graph; nor under a tracing mode
    or a torch.func transform, whatever x is: ``_common.cacheable``). The cached element comes from Warp's
    allocator, not torch's: torch.compile's reduce-overhead mode runs its warm-up calls with torch's allocations
    routed to a CUDA graph's pool, and refuses a tensor of that pool that outlives the call."""
    key = (x.dtype, x.device)
    one = _ONES.get(key)
    if one is None:
        if _common.cacheable(x) and not (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            device = warp_device(x.device)
            one = wp.to_torch(wp.ones(1, dtype=WP_DTYPES[x.dtype], device=device))[0]
            wp.synchronize_device(device)  # filled on Warp's stream; read on torch's
            if _common.cacheable(one):  # (a fake mode turns even a real x's tensor into one of its own)
                _ONES[key] = one
        else:
            one = torch.ones((), dtype=x.dtype, device=x.device)
    return one.expand(n_in, n_out)


# Public-layout parameters on the stencil strategy. The kernels index every array through its strides, so a
# parameter can be read where it lies and its gradient written in the parameter's own strides, which AccumulateGrad
# takes as it is. For a small layer that saves two copies a parameter a step: one into the kernels' layout before
# the forward, and AccumulateGrad's copy of a gradient in other strides after the backward. That is six of the
# launches of a KANLinear step, and an eager small layer waits on the host time of each. The price is uncoalesced
# access, one element a memory sector: the table's reads and the gradients' atomic adds, one add an element for
# each chunk of rows, which grows with the rows. On the GPU machine (KANLinear 32 -> 32, G = 5 and 21;
# `python scripts/in_place_params.py`, docs/perf-notes-host.md):
# - eager, an in-place step took 0.62-0.80x the copying one's time at 128 to 16384 rows (the host is the bound);
# - graphed, in place was 3-7% faster at 128 and 1024 rows, 2% slower at 4096 rows with G = 5, and 14% (4096 rows,
#   G = 21) to 39% (16384 rows) slower beyond.
# So a parameter of at most IN_PLACE_MAX_BYTES is read in place in an eager call of at most IN_PLACE_MAX_ROWS rows
# and in a call recorded into a CUDA graph (where the GPU time is all that counts) of at most
# IN_PLACE_MAX_ROWS_CAPTURED rows; larger calls copy, coalesced on both sides. The results are bitwise the same.
IN_PLACE_MAX_BYTES = 1 << 20
IN_PLACE_MAX_ROWS = 16384
IN_PLACE_MAX_ROWS_CAPTURED = 1024


def stencil_param(t: "Tensor | None", n_rows: int) -> "Tensor | None":
    """A parameter (or its op view) as the stencil kernels read it in a call of ``n_rows`` rows: in place where
    the rule above allows, else contiguous (None, an absent parameter, stays None)."""
    if t is None or t.numel() * t.element_size() <= IN_PLACE_MAX_BYTES and n_rows <= IN_PLACE_MAX_ROWS and (
            n_rows <= IN_PLACE_MAX_ROWS_CAPTURED or not (t.is_cuda and torch.cuda.is_current_stream_capturing())):
        return t
    return contiguous(t)


def _stencil_operands(spec: EdgeSpec, x: Tensor, base_weight_t, scaler_t, coef: Tensor) -> tuple:
    """What the stencil kernels read: the parameters in place or contiguous (:func:`stencil_param`; a shared
    table seen by every input through a zero input stride), ones for an unscaled family's scaler, the scaler in
    the place of an absent base weight (the kernels skip the base term)."""
    n_rows, n_in, n_out = x.shape[0], x.shape[1], coef.shape[2]
    scaler_t = _unit_scaler(x, n_in, n_out) if scaler_t is None else stencil_param(scaler_t, n_rows)
    base_weight_t = scaler_t if base_weight_t is None else stencil_param(base_weight_t, n_rows)
    coef = stencil_param(coef, n_rows)
    if spec.family.shared_table:
        coef = coef.expand(n_in, -1, -1)
    return base_weight_t, scaler_t, coef


def _strided_like(grad: Tensor, like: Tensor) -> Tensor:
    """``grad`` (contiguous) in the strides ``torch.empty_like(like)`` has: copied only where they differ (a
    public-layout parameter's, by the transpose kernel: :func:`copy_into`)."""
    if grad.numel() == 0 or like.is_contiguous():
        return grad
    out = torch.empty_like(like)
    return grad if out.stride() == grad.stride() else copy_into(grad, out)


def _spec(spec, frame_tensors) -> EdgeSpec:
    return spec if isinstance(spec, EdgeSpec) else spec_of(spec, frame_tensors)


def run_forward(spec: EdgeSpec, x: Tensor, base_weight_t, scaler_t, coef: Tensor, bias, strategy: str,
                precision: str, keep: "dict | None" = None, out_dtype: "torch.dtype | None" = None,
                side=None) -> Tensor:
    """y [N, out] on a resolved route (x contiguous); ``keep`` and ``side`` (a side stream, in a CUDA-graph capture,
    joined here; the caller's work there may write coef): see ``edge_driver.gemm_forward``. ``out_dtype``
    (default x's): y's dtype, an autocast caller's; the bf16 gemm path writes a bf16 y directly, other routes
    convert theirs."""
    out_dtype = out_dtype or x.dtype
    if side is not None and strategy != "gemm":
        side.join()  # the stencil kernels read coef from their first launch
    if strategy == "gemm":
        direct = out_dtype == x.dtype or (out_dtype == torch.bfloat16 and precision == "bf16")
        # the weight-combining kernel reads the parameters in any strides (no copy of a public-layout table); an
        # unscaled family's weight is its table as it lies
        y = gemm_forward(*spec[:4], x, scaler_t if base_weight_t is None else base_weight_t, scaler_t,
                         coef if scaler_t is not None else contiguous(coef), spec.use_base, precision, bias=bias,
                         keep=keep, out_dtype=out_dtype if direct else None, side=side)
        if side is not None:
            side.join()  # (a forward with nothing to compute returns before its own join)
    else:
        y = stencil_forward(*spec[:4], x, *_stencil_operands(spec, x, base_weight_t, scaler_t, coef), spec.use_base,
                            bias=bias)
    return y.to(out_dtype)


def run_backward(spec: EdgeSpec, dy: Tensor, x: Tensor, base_weight_t, scaler_t, coef: Tensor, entry_order,
                 strategy: str, precision: str, deterministic: bool, need_x: bool, need_params: bool,
                 need_bias: bool, kept: "dict | None" = None, side=None) -> tuple:
    """(dx, d_base_weight_t, d_scaler_t, d_coef, d_bias) on a resolved route (dy, x contiguous); ``kept``: what
    the forward kept (``run_forward(keep=)``), if anything. dy may have the dtype of a ``run_forward(out_dtype=)``
    y: the bf16 gemm path reads a bf16 dy as it is, other routes convert it. ``side`` (a side stream, in a
    CUDA-graph capture): the parameter gradients come from it (``edge_driver.gemm_backward``); the caller joins it
    before it reads them (its own work on them can follow there first)."""
    empty = x.new_empty((0,))
    d_bias = dy.sum(dim=0, dtype=x.dtype) if need_bias else empty
    if not (need_x or need_params):
        return empty, empty, empty, empty, d_bias
    if strategy == "gemm":  # cuBLAS and fixed-order kernels: deterministic as it is
        # gemm_backward converts dy to its basis dtype itself (none for a bf16 dy and basis)
        dx, d_base, d_scaler, d_coef = gemm_backward(*spec[:4], dy, x,
                                                     scaler_t if base_weight_t is None else base_weight_t, scaler_t,
                                                     coef if scaler_t is not None else contiguous(coef),
                                                     spec.use_base, precision, need_x, need_params, kept=kept,
                                                     side=side)
        if need_params and scaler_t is None:
            d_coef = _strided_like(d_coef, coef)
    else:
        dy = dy.to(x.dtype)
        shared = spec.family.shared_table  # its backward is the atomic-free one, in the pair search's order
        if x.is_cuda and not shared and not torch.cuda.is_current_stream_capturing():
            ready_for_capture(spec.family, x, spec.n_coef, coef.shape[2], precision)  # on autograd's thread
        operands = _stencil_operands(spec, x, base_weight_t, scaler_t, coef)
        dx, d_base, d_scaler, d_coef = stencil_backward(*spec[:4], dy, x, *operands, spec.use_base,
                                                        deterministic or shared, need_x, need_params,
                                                        entry_order=entry_order if shared else None)
        if need_params:
            d_coef = d_coef[:1] if shared else _strided_like(d_coef, coef)
            d_base = _strided_like(d_base, base_weight_t) if base_weight_t is not None else empty
            d_scaler = _strided_like(d_scaler, scaler_t) if scaler_t is not None else empty
    if base_weight_t is None:
        d_base = empty
    # an op's outputs must not alias one another: one empty tensor each
    grads = [dx, d_base, d_scaler, d_coef, d_bias]
    for k, grad in enumerate(grads):
        if grad.numel() == 0 and any(grad is other for other in grads[:k]):
            grads[k] = x.new_empty((0,))
    return tuple(grads)


def forward_impl(x, frame_tensors, base_weight_t, scaler_t, coef, bias, entry_order, spec, strategy, precision,
                 deterministic) -> Tensor:
    """y [N, out] (module docstring); ``spec`` a static key or the EdgeSpec itself; ``deterministic`` only
    affects the backward pass (an argument here so that autograd sees it)."""
    return _resolved_forward(_spec(spec, frame_tensors), x, base_weight_t, scaler_t, coef, bias, strategy, precision)


def _resolved_forward(spec: EdgeSpec, x, base_weight_t, scaler_t, coef, bias, strategy: str, precision: str,
                      keep: "dict | None" = None, out_dtype: "torch.dtype | None" = None) -> Tensor:
    x = x.contiguous()
    strategy, precision = resolve_route(spec, x, coef.shape[2], strategy, precision)
    return run_forward(spec, x, base_weight_t, scaler_t, coef, bias, strategy, precision, keep, out_dtype)


def backward_impl(dy, x, frame_tensors, base_weight_t, scaler_t, coef, entry_order, spec, strategy, precision,
                  deterministic, need_x, need_params, need_bias) -> tuple:
    """(dx, d_base_weight_t, d_scaler_t, d_coef, d_bias) of :func:`forward_impl` (module docstring)."""
    spec = _spec(spec, frame_tensors)
    dy, x = dy.contiguous(), x.contiguous()
    strategy, precision = resolve_route(spec, x, coef.shape[2], strategy, precision)
    return run_backward(spec, dy, x, base_weight_t, scaler_t, coef, entry_order, strategy, precision, deterministic,
                        need_x, need_params, need_bias)


_FORWARD_SCHEMA = ("(Tensor x, Tensor[] frame_tensors, Tensor? base_weight_t, Tensor? scaler_t, Tensor coef, "
                   "Tensor? bias, Tensor? entry_order, str spec, str strategy, str precision, bool deterministic) "
                   "-> Tensor")
_BACKWARD_SCHEMA = ("(Tensor dy, Tensor x, Tensor[] frame_tensors, Tensor? base_weight_t, Tensor? scaler_t, "
                    "Tensor coef, Tensor? entry_order, str spec, str strategy, str precision, bool deterministic, "
                    "bool need_x, bool need_params, bool need_bias) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")

edge_forward = torch.library.custom_op("warpkan::edge_forward", forward_impl, mutates_args=(),
                                       schema=_FORWARD_SCHEMA)
edge_backward = torch.library.custom_op("warpkan::edge_backward", backward_impl, mutates_args=(),
                                        schema=_BACKWARD_SCHEMA)


@edge_forward.register_fake
def _(x, frame_tensors, base_weight_t, scaler_t, coef, bias, entry_order, spec, strategy, precision, deterministic):
    return x.new_empty((x.shape[0], coef.shape[2]))


@edge_backward.register_fake
def _(dy, x, frame_tensors, base_weight_t, scaler_t, coef, entry_order, spec, strategy, precision, deterministic,
      need_x, need_params, need_bias):
    def grad(t, needed):  # an empty tensor each where not needed (the outputs alias nothing)
        return torch.empty_like(t) if needed and t is not None else x.new_empty((0,))

    return (grad(x, need_x), grad(base_weight_t, need_params), grad(scaler_t, need_params), grad(coef, need_params),
            x.new_empty((coef.shape[2],)) if need_bias else x.new_empty((0,)))


def _setup_context(ctx, inputs, output, kept: "dict | None" = None):
    """Saves the inputs the backward reads, and (the eager route) what the forward kept for it: as saved
    tensors, so that activation checkpointing and saved-tensor hooks treat the kept basis as they treat the
    rest."""
    x, frame_tensors, base_weight_t, scaler_t, coef, bias, entry_order, spec = inputs[:SPEC + 1]
    ctx.kept_names = tuple(kept) if kept else ()
    ctx.n_frame = len(frame_tensors)
    ctx.save_for_backward(x, base_weight_t, scaler_t, coef, entry_order, *frame_tensors,
                          *(kept[name] for name in ctx.kept_names))
    ctx.route = inputs[SPEC:]  # spec, strategy, precision, deterministic
    ctx.has_bias = bias is not None
    ctx.op_inputs = inputs  # for create_graph=True (_higher_backward): the inputs, with their history


def _input_grads(ctx, dx, d_base, d_scaler, d_coef, d_bias, n_frame: int) -> tuple:
    need = ctx.needs_input_grad
    # a registered op's Tensor[] input takes a list of gradients; the eager route's tuple of frame tensors none
    frame = [None] * n_frame if isinstance(ctx.route[0], str) else None
    return (dx if need[X] else None, frame, d_base if need[BASE] else None, d_scaler if need[SCALER] else None,
            d_coef if need[COEF] else None, d_bias if need[BIAS] else None, None, None, None, None, None)


def _backward_with(run, takes_kept: bool = False):
    def backward(ctx, dy):
        x, base_weight_t, scaler_t, coef, entry_order, *rest = ctx.saved_tensors
        frame_tensors, kept_tensors = rest[:ctx.n_frame], rest[ctx.n_frame:]
        need = ctx.needs_input_grad
        need_params = need[BASE] or need[SCALER] or need[COEF]
        need_bias = ctx.has_bias and need[BIAS]
        if not (need[X] or need_params or need_bias):
            return _input_grads(ctx, None, None, None, None, None, len(frame_tensors))
        kept = (dict(zip(ctx.kept_names, kept_tensors)),) if takes_kept else ()
        grads = run(dy, x, frame_tensors, base_weight_t, scaler_t, coef, entry_order, *ctx.route, need[X],
                    need_params, need_bias, *kept)
        return _input_grads(ctx, *grads, len(frame_tensors))

    return backward


# ------------------------------------------------------------------------------------------- create_graph=True
# make_frame -> view(spec, x, coef) -> (spec, coef): what a family's create_graph=True formula differentiates
# instead of the layer's own spec (a coefficient table made from ``coef`` by differentiable torch ops)
_HIGHER_VIEWS: dict = {}


def register_higher_view(make_frame, view) -> None:
    """The higher-order view of the specs built on ``make_frame``: ``view(spec, x, coef) -> (spec, coef)``, the
    spec and coefficient table (made from ``coef`` by differentiable torch ops) whose dense basis the
    ``create_graph=True`` formula differentiates instead of the layer's own. For families whose own spec has no
    dense basis (a shared table: UKAN's pair table, read per feature instead) or whose derivatives are taken
    elsewhere (a LUT layer's, from the exact recurrence)."""
    _HIGHER_VIEWS[make_frame] = view


def _higher_backward(ctx, inputs, dy):
    """The gradients as differentiable graphs, for ``create_graph=True`` (any strategy: the same map): the
    engine's dense basis and its x-derivatives to the third order (``edge_driver.differentiable_backward``),
    the combined weight (made once a node where the table is the layer's own) and the split of its gradient."""
    x, frame_tensors, base_weight_t, scaler_t, coef, bias, entry_order, spec = inputs[:SPEC + 1]
    spec = _spec(spec, frame_tensors)
    dy = dy.to(x.dtype)  # an autocast caller's (the eager route's out_dtype)
    need = ctx.needs_input_grad
    wanted = ([i for i in (BASE, SCALER, COEF) if need[i]] if params_used_by_this_backward(ctx) else [])
    need_bias = ctx.has_bias and need[BIAS]
    view = _HIGHER_VIEWS.get(spec.make_frame)
    view_spec, view_coef = view(spec, x, coef) if view is not None else (spec, coef)
    n_out = coef.shape[2]
    if scaler_t is None:
        weight = view_coef.reshape(-1, n_out)
    elif view_coef is coef:
        weight = node_combined_weight(ctx, spec.family, scaler_t if base_weight_t is None else base_weight_t,
                                      scaler_t, coef, spec.use_base)
    else:
        weight = combined_weight(base_weight_t, scaler_t, view_coef, spec.use_base)
    dx, d_weight = differentiable_backward(view_spec, dy, x.contiguous(), weight, need[X], bool(wanted))
    grads = [None] * N_INPUTS
    grads[X] = dx
    if wanted and view_coef is not coef:
        for i, g in zip(wanted, torch.autograd.grad(weight, [inputs[i] for i in wanted], d_weight,
                                                    create_graph=True, allow_unused=True)):
            grads[i] = g
    elif wanted and scaler_t is None:
        grads[COEF] = d_weight.view(coef.shape)
    elif wanted:
        grads[BASE], grads[SCALER], grads[COEF] = split_weight_grad(d_weight, scaler_t, coef, spec.use_base)
    if need_bias:
        grads[BIAS] = dy.sum(dim=0)
    if isinstance(inputs[SPEC], str):
        grads[FRAME] = [None] * len(frame_tensors)
    return tuple(g if k in (X, FRAME) or need[k] else None for k, g in enumerate(grads))


edge_forward.register_autograd(first_order_backward(LABEL, _backward_with(edge_backward), _higher_backward),
                               setup_context=_setup_context)


# ------------------------------------------------------------------------------------------------ eager routes
# The parameter layouts the layers keep (``eager_function`` layouts: the route takes those inputs as the module
# exposes them and makes the op's views inside the node; a view made outside would be an autograd node of its
# own, 10-20 us of a small layer's step on the GPU machine):
# - "kernel": the op's own ([in, out], [in, n_coef, out]);
# - "kanlinear": efficient-kan's [out, in] weights and [out, in, G + k] spline weight (KANLinear, and UKANLinear's
#   [out, in] weights with its range table in the kernel layout);
# - "polykan": PolyKANLinear's coefficients [in, out, D + 1];
# - "ukan_table": UKANLinear's [out, in] weights and its shared pair table [P K, out].
_PERMUTE_120 = (lambda t: t.permute(1, 2, 0), lambda g: g.permute(2, 0, 1))
_SWAP_LAST = (lambda t: t.permute(0, 2, 1), lambda g: g.permute(0, 2, 1))
_SHARED_TABLE = (lambda t: t.unsqueeze(0), lambda g: g.squeeze(0))
LAYOUTS = {
    "kernel": {},
    "kanlinear": {BASE: TRANSPOSED, SCALER: TRANSPOSED, COEF: _PERMUTE_120},
    "ukan_range": {BASE: TRANSPOSED, SCALER: TRANSPOSED},
    "polykan": {COEF: _SWAP_LAST},
    "ukan_table": {BASE: TRANSPOSED, SCALER: TRANSPOSED, COEF: _SHARED_TABLE},
}


def _prepare(inputs: tuple) -> tuple:
    """The eager route's inputs with the route resolved once for the forward and the backward (where an eager
    call resolves "auto" is where it runs both passes), and the contiguous copies of public-layout parameters
    made once a step where the kernels read the kernel layout (the stencil kernels beyond
    :func:`stencil_param`'s bounds; the GEMMs of an unscaled family, on its table as it lies, made in bf16 by the
    same launch for bf16 GEMMs; the combine kernel of a scaled family reads any strides)."""
    x, frame_tensors, base_weight_t, scaler_t, coef, bias, entry_order, spec, strategy, precision, deterministic \
        = inputs
    x = x.contiguous()
    strategy, precision = resolve_route(spec, x, coef.shape[2], strategy, precision)
    if strategy == "stencil":
        base_weight_t, scaler_t, coef = (stencil_param(t, x.shape[0]) for t in (base_weight_t, scaler_t, coef))
    elif scaler_t is None:  # an unscaled family's GEMMs read its table as it lies, in their operands' dtype
        coef = contiguous(coef, torch.bfloat16 if precision == "bf16" else None)
    _node.keep = {} if strategy == "gemm" else None  # a node is being built: its forward may keep the basis
    return (x, frame_tensors, base_weight_t, scaler_t, coef, bias, entry_order, spec, strategy, precision,
            deterministic)


# What the eager route's forward hands its node (on the thread building it): the dense basis and weight the gemm
# strategy kept for the backward (``edge_driver.gemm_forward(keep=)``). _prepare opens it (only a node's forward runs
# _prepare: a call that builds no node keeps nothing), the forward fills it, _eager_setup_context takes it.
_node = threading.local()


def _eager_forward(x, frame_tensors, base_weight_t, scaler_t, coef, bias, entry_order, spec, strategy, precision,
                   deterministic, out_dtype=None) -> Tensor:
    keep, _node.keep = getattr(_node, "keep", None), None
    y = _resolved_forward(spec, x, base_weight_t, scaler_t, coef, bias, strategy, precision, keep, out_dtype)
    _node.kept = keep or None
    return y


def _eager_setup_context(ctx, inputs, output):
    kept, _node.kept = getattr(_node, "kept", None), None
    _setup_context(ctx, inputs, output, kept)
    ctx.plan = _bound_backward(ctx, inputs, output)


# A node whose gradients are small enough to hold from its forward to its backward makes its backward's launch in
# the forward, on the caller's thread (the tiled stencil pass of a scaled family, where an eager call of a small
# layer goes): the backward runs on autograd's device thread, where Python runs at about half the caller's speed
# on the GPU machine (docs/perf-notes-host.md), and then only allocates dx and launches.
BOUND_BACKWARD_MAX_BYTES = 1 << 20


def _bound_backward(ctx, inputs, output) -> "tuple | None":
    """(launch, d_base, d_scaler, d_coef, need_x, need_bias, ready_gemm) of the node's backward made ahead
    (``edge_driver.bind_tiled_backward``; ``ready_gemm``: (family, precision) of the gemm strategy the backward
    readies for a later capture, as ``run_backward`` does, or None), or None where the backward takes the
    general path."""
    x, frame_tensors, base_weight_t, scaler_t, coef, bias, entry_order, spec, strategy, precision, deterministic \
        = inputs
    family = spec.family
    if (strategy != "stencil" or not x.is_cuda or base_weight_t is None or scaler_t is None or family.shared_table
            or family.single_slot or torch.cuda.is_current_stream_capturing()):
        return None
    need = ctx.needs_input_grad
    need_params = need[BASE] or need[SCALER] or need[COEF]
    param_bytes = (2 * base_weight_t.numel() + coef.numel()) * coef.element_size()
    if param_bytes > BOUND_BACKWARD_MAX_BYTES:  # (the parameters in any strides: stencil_param's)
        return None
    # the bound launch reads dy in x's dtype (an autocast caller's dy is converted first: _eager_node_backward)
    dy_like = output if output.dtype == x.dtype else output.new_empty(output.shape, dtype=x.dtype)
    bound = bind_tiled_backward(*spec[:4], dy_like, x, base_weight_t, scaler_t, coef, spec.use_base, deterministic,
                                need[X], need_params)
    if bound is None:
        return None
    n_out = coef.shape[2]
    gemm_later = choose_strategy(x.shape[0], x.shape[1], n_out, spec.n_coef, True, precision) == "gemm"
    return (*bound, need[X], ctx.has_bias and need[BIAS], (family, precision) if gemm_later else None)


def _eager_backward(dy, x, frame_tensors, base_weight_t, scaler_t, coef, entry_order, spec, strategy, precision,
                    deterministic, need_x, need_params, need_bias, kept) -> tuple:
    return run_backward(spec, dy.contiguous(), x, base_weight_t, scaler_t, coef, entry_order, strategy, precision,
                        deterministic, need_x, need_params, need_bias, kept)


_general_eager_backward = _backward_with(_eager_backward, True)


def _eager_node_backward(ctx, dy):
    """The eager node's backward: its bound launch (:func:`_bound_backward`) where the forward made one and dy
    lies as the forward's output did; the general path otherwise (a retained graph's second backward too: the
    bound gradients went to autograd with the first)."""
    plan, ctx.plan = ctx.plan, None
    if plan is None or not dy.is_contiguous():
        return _general_eager_backward(ctx, dy)
    x = ctx.saved_tensors[0]  # unpacked as the general path does: saved-tensor hooks and version checks run
    launch, d_base, d_scaler, d_coef, need_x, need_bias, ready_gemm = plan
    if not x.is_contiguous():
        return _general_eager_backward(ctx, dy)
    dy = dy.to(x.dtype)  # an autocast caller's (run_forward(out_dtype=))
    if ready_gemm is not None and not torch.cuda.is_current_stream_capturing():
        load_gemm_modules(*ready_gemm, x.device)  # this thread's cuBLAS handles
    dx = launch.backward(dy, x, need_x)
    return _input_grads(ctx, dx, d_base, d_scaler, d_coef, dy.sum(dim=0) if need_bias else None, ctx.n_frame)


_ROUTES: dict = {}


def _route(layout: str, label: str, out_dtype: "torch.dtype | None" = None):
    """The eager route of the parameter layout ``layout`` whose errors name the layer ``label`` and whose y
    has the dtype ``out_dtype`` (None: x's), made once a triple."""
    route = _ROUTES.get((layout, label, out_dtype))
    if route is None:
        forward = _eager_forward if out_dtype is None else functools.partial(_eager_forward, out_dtype=out_dtype)
        route = _ROUTES[(layout, label, out_dtype)] = eager_function(
            f"EagerEdge_{layout}", forward, _eager_setup_context, _eager_node_backward,
            LAYOUTS[layout], label=label, prepare=_prepare, higher=_higher_backward, rows=True)
    return route


_STATIC_SPEC_MAKERS: dict = {}  # name -> a family's static spec maker


def static_spec_maker(name: str):
    """Declare ``make(*plain arguments) -> EdgeSpec`` (without frame tensors) the static spec maker ``name`` of a
    family: cached, and called by name from :func:`edge_apply` (a name is what torch.compile's trace can carry
    to :func:`_traced_key`)."""
    def declare(make):
        cached = functools.lru_cache(maxsize=None)(make)
        _STATIC_SPEC_MAKERS[name] = cached
        return cached

    return declare


def _traced_key(maker: str, static_args: tuple) -> str:
    """The static key of a static spec maker's spec, worked out once when torch.compile traces a call: the
    family objects behind it are Warp structs and kernels, which Dynamo cannot trace."""
    return _STATIC_SPEC_MAKERS[maker](*static_args).static_key()


# torch.compiler.assume_constant_result(_traced_key), without importing torch._dynamo (and sympy) with warpkan:
# the decorator is this one attribute
_traced_key._dynamo_marked_constant = True


def edge_apply(x: Tensor, maker: str, static_args: tuple, frame_tensors: tuple, base_weight_t: "Tensor | None",
               scaler_t: "Tensor | None", coef: Tensor, bias: "Tensor | None", strategy: str, precision: str,
               deterministic: bool, entry_order: "Tensor | None" = None, layout: str = "kernel",
               label: str = LABEL, out_dtype: "torch.dtype | None" = None) -> Tensor:
    """y (..., out) of an edge layer on x (..., in), differentiable: the eager route (one autograd node, x's rows
    seen inside it), or under tracing and on meta tensors (``_common.use_registered_op``) the registered
    :func:`edge_forward` on x's rows.

    Args:
        maker: the name of the family's static spec maker (:func:`static_spec_maker`): ``maker(*static_args)``
            is its EdgeSpec without frame tensors (plain arguments only); ``frame_tensors``, the call's.
        layout: the parameters' layout (:data:`LAYOUTS`); the op's views are made inside the node.
        label: how errors (higher-order and torch.func refusals) name the layer.
        out_dtype: y's dtype, where it is not x's: an autocast caller's (a layer computes in its own dtype with
            autocast off and returns the autocast dtype). The eager route makes it inside its node: the bf16 gemm
            path's GEMM writes a bf16 y and its backward reads the bf16 dy, with no fp32 copies of either and no
            cast nodes around the layer's node (4 launches and 2 nodes a layer call); other routes convert
            inside. The registered op returns x's dtype, converted after it.
    """
    if out_dtype == x.dtype:
        out_dtype = None
    if _common.use_registered_op(x):  # read from _common: the tests patch it there
        to_op = {i: views[0] for i, views in LAYOUTS[layout].items()}
        params = [to_op[i](t) if i in to_op and t is not None else t
                  for i, t in ((BASE, base_weight_t), (SCALER, scaler_t), (COEF, coef))]
        key = _traced_key(maker, static_args)
        y = on_rows(x, x.shape[-1], lambda x2: edge_forward(x2, list(frame_tensors), *params, bias, entry_order,
                                                            key, strategy, precision, deterministic))
        return y if out_dtype is None else y.to(out_dtype)
    refuse_transforms(label)
    spec = _STATIC_SPEC_MAKERS[maker](*static_args).with_frame(frame_tensors)
    return _route(layout, label, out_dtype).run(x, frame_tensors, base_weight_t, scaler_t, coef, bias, entry_order,
                                                spec, strategy, precision, deterministic)
