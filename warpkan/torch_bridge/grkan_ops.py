"""GR-KAN layers (``GroupRational -> Linear``), one or a chain of them, as one eager autograd node.

Why one node. An eager step of a small or host-bound model waits on Python, and each ``autograd.Function``
costs a fixed share of it (the engine's hand-over, the context, the call into Python on autograd's device
thread) on top of what its body does. A GR-KAN layer composed of its modules is a Python rational node and a
linear layer, which is a chain of C++ nodes of its own (the addmm, the views of an N-D input, and under autocast
the casts of the weight and the bias). Here a layer, or KAT's MLP block of two layers, is one node: its forward
runs the rational launches and the products, its backward the products, the bias sums and the rational
backward launches (bound in the forward, on the caller's thread: ``rational_ops.bind_backward``).

The maths are the composition's, op for op: the same kernels on the same operands in the same layouts
(``F.linear`` on the rows of x, the backward's products as torch's ``addmm`` formulas compute them, the bias
gradient summed over the rows), so the output and the input and rational gradients are bitwise those of the
composition. One difference, under bf16 autocast: the composition rounds a float32 linear weight's and bias's
gradients to bf16 and casts them back (autocast's cast nodes), where the node takes them in float32 from the
GEMM (bf16 x bf16 -> fp32) and from a float32 sum: more accurate, and two launches fewer a layer. Under fp16
autocast the weight gradient is the composition's, the bias gradient its float32 sum. ``create_graph=True`` runs
the composition again from the node's inputs and differentiates that (the rational's own create_graph formula
included).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from . import edge_driver
from . import rational_ops as ro
from ._common import first_order_backward, forward_mode_message

__all__ = ["grkan_chain", "composed_chain"]

LABEL = "GRKANLinear / KATMLP (GroupRational and Linear layers in one node)"
PER_LAYER = 4  # a layer's inputs: numerator, denominator, linear weight, linear bias (or None)


def _cast(t: Tensor | None, dtype) -> Tensor | None:
    return t if t is None or dtype is None else t.to(dtype)


def composed_chain(x: Tensor, config: tuple, *weights) -> Tensor:
    """The layers' composition on x rows [N, C], from the node's inputs, as differentiable pieces: what the node
    computes (its create_graph route). ``config``: (cast_to, layers), ``cast_to`` the linear layers' compute
    dtype under autocast (None without), ``layers`` a (num_groups, variant, deterministic, out_dtype) per
    layer, ``out_dtype`` the rational's output dtype (None: its input's); ``weights``: (numerator,
    denominator, weight, bias) per layer."""
    cast_to, layers = config
    h = x
    for i, (groups, variant, deterministic, out_dtype) in enumerate(layers):
        wn, wd, w, b = weights[PER_LAYER * i:PER_LAYER * (i + 1)]
        a = ro.apply_checked(h, wn, wd, groups, variant, deterministic, out_dtype)
        h = F.linear(a, _cast(w, cast_to), _cast(b, cast_to))
    return h


def _weight_grad(dy: Tensor, a: Tensor, dtype: torch.dtype) -> Tensor:
    # addmm's formula for a weight read transposed (F.linear's W.t()): (dy^T a). A float32 weight under bf16
    # autocast takes the GEMM's float32 result as it is (cuBLAS's bf16 x bf16 -> fp32 GEMM, as the edge
    # layers' gemm strategy does): no bf16 rounding of the gradient and no cast launch after it. Otherwise
    # the result is cast back to the parameter's dtype, as autocast's cast node does.
    if dy.dtype == torch.bfloat16 and dtype == torch.float32:
        return edge_driver._mm_widened(dy.t(), a, dtype)
    d = torch.mm(dy.t(), a)
    return d if d.dtype == dtype else d.to(dtype)


def _bias_grad(dy: Tensor, dtype: torch.dtype) -> Tensor:
    # the sum over the broadcast rows of addmm's bias, accumulated in the parameter's dtype where that is
    # wider (a float32 bias under autocast: one reduction, no rounding to dy's dtype, no cast launch)
    if dy.dtype == dtype or dtype.itemsize < dy.dtype.itemsize:
        d = dy.sum(0)
        return d if d.dtype == dtype else d.to(dtype)
    return dy.sum(0, dtype=dtype)


def _needs(ctx) -> tuple[list, list]:
    """(need_in, need_params): per layer, whether its rational's input needs a gradient (x, or a parameter of an
    earlier layer, does) and whether its rational's coefficients do."""
    need = ctx.needs_input_grad
    need_in, need_params, upstream = [], [], need[0]
    for i in range(len(ctx.config[1])):
        base = 2 + PER_LAYER * i
        need_in.append(upstream)
        need_params.append(need[base] or need[base + 1])
        upstream = upstream or any(need[base:base + PER_LAYER])
    return need_in, need_params


class _GRKANChain(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, config, *weights):
        ctx.raw_inputs = (x, *weights)  # with their history, for create_graph=True
        ctx.config = config
        cast_to, layers = config
        ctx.lead = x.shape[:-1] if x.dim() != 2 else None
        h = x if ctx.lead is None else x.reshape(-1, x.shape[-1])
        need_in, need_params = ctx.needs = _needs(ctx)  # (the backward's too)
        saved, plans, dtypes = [], [], []
        for i, (groups, variant, deterministic, out_dtype) in enumerate(layers):
            wn, wd, w, b = weights[PER_LAYER * i:PER_LAYER * (i + 1)]
            wc = _cast(w, cast_to)
            a = ro._forward_impl(h, wn, wd, groups, variant, deterministic, out_dtype=out_dtype)
            plans.append(ro.bind_backward(h, wn, wd, groups, variant, a, need_in[i], need_params[i]))
            saved += (h, a, wc, wn, wd)
            dtypes.append((w.dtype, None if b is None else b.dtype))
            h = F.linear(a, wc, _cast(b, cast_to))
        ctx.plans, ctx.dtypes = plans, dtypes
        ctx.save_for_backward(*saved)
        return h if ctx.lead is None else h.reshape(*ctx.lead, h.shape[-1])

    @staticmethod
    def _first_order(ctx, dy):
        # the bound launches serve one backward: their gradient buffers go to autograd (AccumulateGrad takes them
        # as they are); a second backward of a retained graph takes the general path
        layers = ctx.config[1]
        plans, ctx.plans = ctx.plans or [None] * len(layers), None
        saved = ctx.saved_tensors
        need = ctx.needs_input_grad
        need_in, need_params = ctx.needs
        grads = [None] * (2 + PER_LAYER * len(layers))
        g = dy if dy.dim() == 2 else dy.reshape(-1, dy.shape[-1])
        for i in reversed(range(len(layers))):
            h, a, wc, wn, wd = saved[5 * i:5 * (i + 1)]
            base = 2 + PER_LAYER * i
            w_dtype, b_dtype = ctx.dtypes[i]
            if need[base + 2]:
                grads[base + 2] = _weight_grad(g, a, w_dtype)
            if need[base + 3] and b_dtype is not None:
                grads[base + 3] = _bias_grad(g, b_dtype)
            if not (need_in[i] or need_params[i]):
                break  # nothing before this layer's linear needs a gradient
            da = torch.mm(g, wc)  # addmm's formula for its first operand
            g, dwn, dwd = ro.run_bound_backward(plans[i], da, h, wn, wd, layers[i][:3], need_in[i], need_params[i])
            grads[base] = dwn if need[base] else None
            grads[base + 1] = dwd if need[base + 1] else None
        if need[0]:
            grads[0] = g if ctx.lead is None else g.reshape(*ctx.lead, g.shape[-1])
        return tuple(grads)

    @staticmethod
    def _higher(ctx, _op_inputs, dy):
        raw = ctx.raw_inputs
        need = ctx.needs_input_grad
        # raw holds x and the weights: the Function's inputs without the config (its second)
        wanted = [i for i, t in enumerate(raw) if t is not None and need[i if i == 0 else i + 1]]
        with torch.enable_grad():
            x = raw[0]
            y = composed_chain(x if x.dim() == 2 else x.reshape(-1, x.shape[-1]), ctx.config, *raw[1:])
            dy = dy if dy.dim() == 2 else dy.reshape(-1, dy.shape[-1])
            found = torch.autograd.grad(y, [raw[i] for i in wanted], dy, create_graph=True, allow_unused=True)
        grads = [None] * (1 + len(raw))
        for i, g in zip(wanted, found):
            grads[i if i == 0 else i + 1] = g
        return tuple(grads)

    @staticmethod
    def jvp(ctx, *tangents):
        raise NotImplementedError(forward_mode_message(LABEL))


_GRKANChain.backward = staticmethod(first_order_backward(LABEL, _GRKANChain._first_order, _GRKANChain._higher))
# the C-level apply (see EagerRoute.apply): Function.apply's Python wrapper only serves functorch transforms,
# which the callers route to the composition
_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, _GRKANChain)


def grkan_chain(x: Tensor, config: tuple, weights: tuple) -> Tensor:
    """The layers of ``config`` and ``weights`` (see :func:`composed_chain`) on x (..., C), already checked, as
    one autograd node."""
    return _apply(x, config, *weights)
