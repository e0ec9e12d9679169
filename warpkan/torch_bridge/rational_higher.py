"""create_graph=True for the group-rational activation: its gradients as differentiable graphs.

The first-order backward of ``y = F(x; a, b)`` (per channel group) is ``dx = dy F'(x)`` and
``(da, db) = sum dy dF/d(a, b)``. Written with two autograd Functions on the jet kernels
(``warpkan.kernels.rational_jet``) whose own backward is again of their form,

- ``derivative_k(x; h)``: the k-th x-derivative of F, or of ``T = dF/d(a, b) . h`` along a coefficient direction
  h; its gradient is ``g derivative_(k+1)`` in x and ``coef_grad_k(g; h)`` in the coefficients (and, with h,
  ``coef_grad_k(g)`` in h: T is linear in h);
- ``coef_grad_k(g; h)``: the per-group sums of g times the k-th x-derivative of F's (or T's) coefficient
  gradients; without h, its gradient along a cotangent c is ``derivative_k(x; c)`` in g,
  ``g derivative_(k+1)(x; c)`` in x and ``coef_grad_k(g; c)`` in the coefficients,

the gradients differentiate to the fourth x-derivative: u_xx of a physics-informed residual and the parameter
gradients of a loss built from it, and ``gradgradcheck`` in every input. The next mixed order (the gradient of
``coef_grad_k`` along a direction, third coefficient derivatives) is refused by name.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels import rational_jet as kj
from ..kernels._runtime import launch
from ._common import RecordedLaunches, needed_grads, runs_registered_op

__all__ = ["MAX_X_DERIVATIVE", "differentiable_backward", "derivative", "coef_grad", "rational_derivative",
           "rational_coef_grad"]

MAX_X_DERIVATIVE = kj.SERIES - 1

_LAUNCHES = RecordedLaunches()


def _scalar_name(t: Tensor) -> str:
    return "float64" if t.dtype == torch.float64 else "float32"


def _derivative_launch(x, a, b, ha, hb, out, group_size, order, variant, scalar_name, record=False):
    kernels = kj.jet_kernels(a.shape[1] - 1, b.shape[1], variant, scalar_name)
    return launch(kernels.rational_derivative, tuple(out.shape), [x, a, b, ha, hb, group_size, order, out], (),
                  x.device, None, record)


def _partials_launch(g, x, a, b, ha, hb, part_a, part_b, group_size, order, rows_per_chunk, variant, scalar_name,
                     record=False):
    kernels = kj.jet_kernels(a.shape[1] - 1, b.shape[1], variant, scalar_name)
    return launch(kernels.rational_coef_partials, (part_a.shape[0], x.shape[1]),
                  [g, x, a, b, ha, hb, group_size, order, rows_per_chunk, part_a, part_b], (), x.device, None,
                  record)


def _check_order(order: int) -> None:
    if order > MAX_X_DERIVATIVE:
        raise NotImplementedError(
            f"GroupRational: a derivative of order {order} in x was asked for; the group-rational activation "
            f"provides x-derivatives up to order {MAX_X_DERIVATIVE} under create_graph=True")


def _contiguous(*tensors):
    return tuple(None if t is None else t.contiguous() for t in tensors)


def _derivative(x, a, b, ha, hb, order, variant) -> Tensor:
    _check_order(order)
    out = torch.empty_like(x)
    if out.numel():
        _LAUNCHES(_derivative_launch, _contiguous(x, a, b, ha, hb) + (out,), x.shape[1] // b.shape[0], order,
                  variant, _scalar_name(x))
    return out


def _coef_grad(g, x, a, b, ha, hb, order, variant) -> tuple[Tensor, Tensor]:
    _check_order(order)
    n_rows, n_channels = x.shape
    num_groups = b.shape[0]
    chunks = kj.partial_chunks(n_rows, n_channels)
    rows_per_chunk = -(-n_rows // chunks) if n_rows else 1
    chunks = -(-n_rows // rows_per_chunk) if n_rows else 0
    part_a = x.new_empty((chunks, n_channels, a.shape[1]))
    part_b = x.new_empty((chunks, n_channels, b.shape[1]))
    if chunks:
        _LAUNCHES(_partials_launch, _contiguous(g, x, a, b, ha, hb) + (part_a, part_b), n_channels // num_groups,
                  order, rows_per_chunk, variant, _scalar_name(x))
    # a fixed order of sums (chunks, then a group's channels): deterministic
    d_a = part_a.sum(0).view(num_groups, -1, a.shape[1]).sum(1)
    d_b = part_b.sum(0).view(num_groups, -1, b.shape[1]).sum(1)
    return (d_a.sum(0, keepdim=True) if a.shape[0] == 1 else d_a), d_b


# The two pieces' autograd formulas, one for both routes (the eager Function and the registered op): ctx holds
# the piece's tensors first in saved_tensors, and ``order`` and ``variant``.
def _derivative_grads(ctx, g) -> tuple:
    x, a, b, ha, hb = ctx.saved_tensors[:5]
    need = needed_grads(ctx, (x, a, b, ha, hb))
    d_x = d_a = d_b = d_ha = d_hb = None
    if need[0]:
        d_x = g * derivative(x, a, b, ha, hb, ctx.order + 1, ctx.variant)
    if need[1] or need[2]:
        d_a, d_b = coef_grad(g, x, a, b, ha, hb, ctx.order, ctx.variant)
    if need[3] or need[4]:
        d_ha, d_hb = coef_grad(g, x, a, b, None, None, ctx.order, ctx.variant)
    return d_x, d_a, d_b, d_ha, d_hb


def _coef_grad_grads(ctx, c_a, c_b) -> tuple:
    g, x, a, b, ha = ctx.saved_tensors[:5]
    if ha is not None:
        raise NotImplementedError(
            "GroupRational: this derivative needs the third derivatives of the activation in its coefficients "
            "(a gradient of a gradient of a coefficient gradient); the group-rational activation's "
            "create_graph=True path stops at the second")
    need = needed_grads(ctx, (g, x, a, b))
    d_g = d_x = d_a = d_b = None
    if need[0]:
        d_g = derivative(x, a, b, c_a, c_b, ctx.order, ctx.variant)
    if need[1]:
        d_x = g * derivative(x, a, b, c_a, c_b, ctx.order + 1, ctx.variant)
    if need[2] or need[3]:
        d_a, d_b = coef_grad(g, x, a, b, c_a, c_b, ctx.order, ctx.variant)
    return d_g, d_x, d_a, d_b, None, None


class _Derivative(torch.autograd.Function):
    """The order-k x-derivative of F at x [N, C], or of T = dF/d(a, b) . (ha, hb) when a direction is given.
    The eager route of ``warpkan::rational_derivative``."""

    @staticmethod
    def forward(ctx, x, a, b, ha, hb, order, variant):
        ctx.save_for_backward(x, a, b, ha, hb)
        ctx.order, ctx.variant = order, variant
        return _derivative(x, a, b, ha, hb, order, variant)

    @staticmethod
    def backward(ctx, g):
        return *_derivative_grads(ctx, g), None, None


class _CoefGrad(torch.autograd.Function):
    """(sum g d^k/dx^k dF/da, same for b) per group, or of T's coefficient gradients along a direction.
    The eager route of ``warpkan::rational_coef_grad``."""

    @staticmethod
    def forward(ctx, g, x, a, b, ha, hb, order, variant):
        # ha alone marks the directed form: its gradient is refused, and its values are not needed
        ctx.save_for_backward(g, x, a, b, ha)
        ctx.order, ctx.variant = order, variant
        return _coef_grad(g, x, a, b, ha, hb, order, variant)

    @staticmethod
    def backward(ctx, c_a, c_b):
        return *_coef_grad_grads(ctx, c_a, c_b), None, None


@torch.library.custom_op("warpkan::rational_derivative", mutates_args=(),
                         schema="(Tensor x, Tensor a, Tensor b, Tensor? ha, Tensor? hb, int order, str variant) "
                                "-> Tensor")
def rational_derivative(x, a, b, ha, hb, order, variant):
    """``_Derivative`` as a registered op."""
    return _derivative(x, a, b, ha, hb, order, variant)


@rational_derivative.register_fake
def _(x, a, b, ha, hb, order, variant):
    _check_order(order)
    return torch.empty_like(x)


@torch.library.custom_op("warpkan::rational_coef_grad", mutates_args=(),
                         schema="(Tensor g, Tensor x, Tensor a, Tensor b, Tensor? ha, Tensor? hb, int order, "
                                "str variant) -> (Tensor, Tensor)")
def rational_coef_grad(g, x, a, b, ha, hb, order, variant):
    """``_CoefGrad`` as a registered op."""
    return _coef_grad(g, x, a, b, ha, hb, order, variant)


@rational_coef_grad.register_fake
def _(g, x, a, b, ha, hb, order, variant):
    _check_order(order)
    return x.new_empty(a.shape), x.new_empty(b.shape)


def _registered_setup(ctx, inputs, output):
    *tensors, order, variant = inputs
    ctx.save_for_backward(*tensors[:5])
    ctx.order, ctx.variant = order, variant


rational_derivative.register_autograd(lambda ctx, g: (*_derivative_grads(ctx, g), None, None),
                                      setup_context=_registered_setup)
rational_coef_grad.register_autograd(lambda ctx, c_a, c_b: (*_coef_grad_grads(ctx, c_a, c_b), None, None),
                                     setup_context=_registered_setup)


def derivative(x, a, b, ha, hb, order: int, variant: str) -> Tensor:
    """The order-k x-derivative (of F, or of T along (ha, hb)), differentiable: the registered op under
    tracing (:func:`runs_registered_op`), the eager Function otherwise."""
    if runs_registered_op(x):
        return rational_derivative(x, a, b, ha, hb, order, variant)
    return _Derivative.apply(x, a, b, ha, hb, order, variant)


def coef_grad(g, x, a, b, ha, hb, order: int, variant: str) -> tuple[Tensor, Tensor]:
    """The per-group coefficient gradients (of F, or of T along (ha, hb)), differentiable, routed as
    :func:`derivative`."""
    if runs_registered_op(x):
        return rational_coef_grad(g, x, a, b, ha, hb, order, variant)
    return _CoefGrad.apply(g, x, a, b, ha, hb, order, variant)


def differentiable_backward(dy: Tensor, x: Tensor, weight_numerator: Tensor, weight_denominator: Tensor,
                            variant: str, need_x: bool, need_params: bool) -> tuple:
    """(dx, d_weight_numerator, d_weight_denominator) of ``y = F(x)`` (x [N, C]) as differentiable graphs, in
    float32 (float64 for float64 x) whatever the layer's dtype, cast back to the inputs' dtypes; None where not
    asked for."""
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    xc, a, b, g = x.to(dtype), weight_numerator.to(dtype), weight_denominator.to(dtype), dy.to(dtype)
    dx = (g * derivative(xc, a, b, None, None, 1, variant)).to(x.dtype) if need_x else None
    d_a = d_b = None
    if need_params:
        d_a, d_b = coef_grad(g, xc, a, b, None, None, 0, variant)
        d_a, d_b = d_a.to(weight_numerator.dtype), d_b.to(weight_denominator.dtype)
    return dx, d_a, d_b
