"""torch.library custom ops of the polynomial KAN layer, on the edge engine (the polynomial edge families of
``warpkan.kernels.edge.poly_family``; host-side tables and checks in ``warpkan.kernels.poly``).

The ops take the kernel layout ``coeffs`` [in, D + 1, out] and x [N, in]; :func:`poly_kan` takes (..., in)
inputs and is what ``PolyKANLinear`` calls. ``lut_size = 0`` selects exact mode, ``lut_size >= 2`` LUT mode.

Two strategies compute the same map, as for every edge family (:mod:`warpkan.torch_bridge.edge_driver`, which
has their description, the ``precision`` rule of the gemm strategy and its error bound):

- ``stencil``: the engine's kernels (warp-tiled on CUDA while the degree's table and records fit shared
  memory, per-thread elsewhere); the spline scaler is fixed at one and there is no base path;
- ``gemm``: the engine writes the transposed dense basis of a chunk of rows and cuBLAS contracts it with the
  coefficient table itself ([in (D + 1), out] as it lies: no copy in fp32).

``auto`` takes the gemm strategy, on every device (measurements at :data:`AUTO_STRATEGY`). The bias is added by
the forward's last op and its gradient is ``dy.sum(0)``.

Host overhead. A small layer is bound by the host. Eager calls go through :class:`_EagerPoly`, an
``autograd.Function`` on the op's own implementation, instead of the custom-op dispatch (about 50 us less a
forward + backward); traced code (``torch.compile``) sees the registered ops. Every Warp launch is recorded once
per signature and replayed (``RecordedLaunches``).
"""

from __future__ import annotations

from typing import Optional

import torch
import warp as wp
from torch import Tensor

from .. import _checks
from ..kernels import poly as kp
from ._common import (check_tensor, contiguous, eager_function, first_order_backward, on_rows, op_or_eager,
                      params_used_by_this_backward, warp_device)
from .edge_driver import (PRECISIONS, STRATEGIES, EdgeSpec, check_precision, check_strategy, differentiable_backward,
                          edge_backward, edge_forward, gemm_backward, gemm_forward, resolve_precision)

__all__ = ["poly_kan", "poly_forward", "poly_backward", "AUTO_STRATEGY", "BF16_ERROR_BOUND", "STRATEGIES",
           "PRECISIONS"]

BF16_ERROR_BOUND = "(2**-8 + K * 2**-24) * (|A| @ |B|) for a contraction A @ B of length K"
# The strategy "auto" resolves to, on every device and at every shape: it was the faster one wherever measured.
# CUDA: replayed from a CUDA graph (GPU time alone), at every PolyKAN configuration (H100, `warpkan bench poly`,
# fwd+bwd: 0.035 against 0.24 ms at (128, 40, 256, 8), 0.076 against 1.9 at (64, 256, 512, 15)): the engine's
# tiled kernels give a warp 32 rows, too few blocks for small batches, and their records grow with the degree.
# Eager, the smallest layer is bound by the host either way (0.32-0.55 ms). CPU: 2.7-30x faster at every shape of
# scripts/cpu_strategy.py (one thread, fwd+bwd, LUT mode: (16, 8->8, D=3) 0.17 against 0.45 ms, (64, 16->32,
# D=8) 0.32 against 1.6, (1024, 32->64, D=8) 7.0 against 63, (64, 256->512, D=15) 19 against 371; exact mode and
# float64 alike): the per-thread stencil kernels evaluate every edge's D + 1 bases on one thread, where the
# GEMMs run in MKL, faster still on more threads.
AUTO_STRATEGY = "gemm"


def _resolve(strategy: str) -> str:
    return AUTO_STRATEGY if strategy == "auto" else strategy


def _scalar(x) -> str:
    return "float64" if x.dtype in (torch.float64, wp.float64) else "float32"


_tables_cache: dict = {}


def _tables(x, basis: str, n_basis: int, lut_size: int, alpha: float, beta: float) -> tuple:
    """The LUT tables (values, grads) as torch tensors of x's dtype and device (zero-copy views of the Warp
    tables); () in exact mode."""
    if lut_size == 0:
        return ()
    key = (basis, n_basis, lut_size, alpha, beta, x.dtype, x.device)
    found = _tables_cache.get(key)
    if found is None:
        values, grads = kp.build_lut(basis, n_basis - 1, lut_size, alpha, beta, _scalar(x), warp_device(x.device))
        found = _tables_cache[key] = (wp.to_torch(values), wp.to_torch(grads))
    return found


kp.on_clear_caches(_tables_cache.clear)


def _exact_frame(family, n_basis, alpha, beta):
    return kp.frame_of(family, n_basis, alpha, beta)


def _lut_frame(values, grads, family, n_basis):
    return kp.frame_of(family, n_basis, lut=(values, grads))


def _lut_derivative_frame(values, family, n_basis, alpha, beta):
    return kp.frame_of(family, n_basis, alpha, beta, lut=(values, None))


_ONES: dict = {}


def _unit_scaler(x: Tensor, n_in: int, n_out: int) -> Tensor:
    """[in, out] ones as a stride-0 view of one cached element (not cached while a CUDA graph is captured: its
    memory would belong to the graph)."""
    key = (x.dtype, x.device)
    one = _ONES.get(key)
    if one is None:
        one = torch.ones((), dtype=x.dtype, device=x.device)
        if not (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            _ONES[key] = one
    return one.expand(n_in, n_out)


def _engine_args(x, coeffs, basis, lut_size, alpha, beta) -> tuple:
    """(family, frame maker, frame tensors, frame config) of the layer on the edge engine."""
    return _engine_args_of(x, coeffs.shape[1], basis, lut_size, alpha, beta)


def basis_spec(x: Tensor, basis: str, lut_size: int, alpha: float, beta: float, n_basis: int) -> EdgeSpec:
    """The layer's edge-engine spec for x's dtype and device (its family, tables and frame): what
    ``edge_driver.dense_basis`` takes to write P_d(tanh x[:, i]) in row i (D + 1) + d of [in (D + 1), N],
    differentiably (the x-gradient of its first-order backward: the derivative table in LUT mode)."""
    return EdgeSpec(*_engine_args_of(x, n_basis, basis, lut_size, alpha, beta), n_basis, False)


def derivative_spec(x: Tensor, basis: str, lut_size: int, alpha: float, beta: float, n_basis: int) -> EdgeSpec:
    """:func:`basis_spec` of the layer's higher-order routes (``create_graph=True``, Taylor mode): in LUT mode
    the values from the value table and every x-derivative from the exact recurrence
    (:func:`derivative_engine_args`); exact mode's own spec otherwise."""
    return EdgeSpec(*derivative_engine_args(x, n_basis, basis, lut_size, alpha, beta), n_basis, False)


def _engine_args_of(x, n_basis, basis, lut_size, alpha, beta) -> tuple:
    family = kp.family_of(n_basis, basis, lut_size > 0, _scalar(x))
    if lut_size:
        return family, _lut_frame, _tables(x, basis, n_basis, lut_size, alpha, beta), (family, n_basis)
    return family, _exact_frame, (), (family, n_basis, alpha, beta)


def derivative_engine_args(x, n_basis, basis, lut_size, alpha, beta) -> tuple:
    """(family, frame maker, frame tensors, frame config) of the layer's higher-order routes (``create_graph=True``
    and Taylor mode): exact mode's own; in LUT mode the values from the value table (those of the layer's
    forward) and every x-derivative from the recurrence (``kernels.poly.derivative_family_of``). The
    interpolant's second derivative is piecewise constant, up to a few percent off (Legendre degree 8, 4096
    points: 0.02097 against 0.02148), and its first is O(h^2) off: a residual made of them is not the
    residual of any one function. ``docs/perf-notes-engine.md`` has what it costs."""
    if not lut_size:
        return _engine_args_of(x, n_basis, basis, 0, alpha, beta)
    family = kp.derivative_family_of(n_basis, basis, True, _scalar(x))
    values = _tables(x, basis, n_basis, lut_size, alpha, beta)[0]
    return family, _lut_derivative_frame, (values,), (family, n_basis, alpha, beta)


def _forward_impl(x, coeffs, bias, basis, lut_size, alpha, beta, strategy, precision="auto", deterministic=False):
    x, coeffs = x.contiguous(), contiguous(coeffs)
    bias = bias.contiguous() if bias is not None else None
    engine = _engine_args(x, coeffs, basis, lut_size, alpha, beta)
    if _resolve(strategy) == "gemm":
        return gemm_forward(*engine, x, None, None, coeffs, False, resolve_precision(precision, x.dtype, x.device),
                            bias=bias)
    ones = _unit_scaler(x, x.shape[1], coeffs.shape[2])
    return edge_forward(*engine, x, ones, ones, coeffs, False, bias=bias)


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
    precision: str = "auto",
    deterministic: bool = False,
) -> Tensor:
    """x [N, in], coeffs [in, D + 1, out], bias [out] or None -> y [N, out]."""
    return _forward_impl(x, coeffs, bias, basis, lut_size, alpha, beta, strategy, precision, deterministic)


@poly_forward.register_fake
def _(x, coeffs, bias, basis, lut_size, alpha, beta, strategy, precision="auto", deterministic=False):
    return x.new_empty((x.shape[0], coeffs.shape[2]))


def _backward_impl(dy, x, coeffs, basis, lut_size, alpha, beta, strategy, need_x, need_coeffs, need_bias,
                   precision="auto", deterministic=False):
    dy, x, coeffs = dy.contiguous(), x.contiguous(), contiguous(coeffs)
    empty = x.new_empty((0,))
    d_bias = dy.sum(dim=0) if need_bias else empty
    if not (need_x or need_coeffs):
        return empty, empty, d_bias
    engine = _engine_args(x, coeffs, basis, lut_size, alpha, beta)
    if _resolve(strategy) == "gemm":
        dx, _, _, d_coeffs = gemm_backward(*engine, dy, x, None, None, coeffs, False,
                                           resolve_precision(precision, x.dtype, x.device), need_x, need_coeffs)
    else:
        ones = _unit_scaler(x, x.shape[1], coeffs.shape[2])
        # the engine's parameter gradients come together (the scaler's and base weight's are dropped here)
        dx, _, _, d_coeffs = edge_backward(*engine, dy, x, ones, ones, coeffs, False, deterministic, need_x,
                                           need_coeffs)
    return dx, d_coeffs, d_bias


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
    precision: str = "auto",
    deterministic: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients (dx, d_coeffs, d_bias); the ones not asked for come back empty."""
    return _backward_impl(dy, x, coeffs, basis, lut_size, alpha, beta, strategy, need_x, need_coeffs, need_bias,
                          precision, deterministic)


def _grad_buffers(x, coeffs, need_x, need_coeffs, need_bias, alloc):
    def make(shape, needed):
        return alloc(shape if needed else (0,), dtype=x.dtype, device=x.device)

    return make(x.shape, need_x), make(coeffs.shape, need_coeffs), make((coeffs.shape[2],), need_bias)


@poly_backward.register_fake
def _(dy, x, coeffs, basis, lut_size, alpha, beta, strategy, need_x, need_coeffs, need_bias, precision="auto",
      deterministic=False):
    return _grad_buffers(x, coeffs, need_x, need_coeffs, need_bias, torch.empty)


def _setup_context(ctx, inputs, output):
    x, coeffs, bias, basis, lut_size, alpha, beta, strategy, precision, deterministic = inputs
    ctx.save_for_backward(x, coeffs)
    ctx.config = (basis, lut_size, alpha, beta, strategy)
    ctx.precision, ctx.deterministic = precision, deterministic
    ctx.has_bias = bias is not None
    ctx.op_inputs = inputs  # for create_graph=True (_higher_backward): the op's inputs, with their history


def _backward(ctx, dy, backward_op=poly_backward):
    x, coeffs = ctx.saved_tensors
    need_x, need_coeffs = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    need_bias = ctx.has_bias and ctx.needs_input_grad[2]
    if not (need_x or need_coeffs or need_bias):
        return (None,) * 10
    dx, d_coeffs, d_bias = backward_op(dy, x, coeffs, *ctx.config, need_x, need_coeffs, need_bias, ctx.precision,
                                       ctx.deterministic)
    return (
        dx if need_x else None,
        d_coeffs if need_coeffs else None,
        d_bias if need_bias else None,
        None, None, None, None, None, None, None,
    )


def _higher_backward(ctx, inputs, dy):
    """The gradients as differentiable graphs, for ``create_graph=True`` (any strategy and mode): the engine's
    dense basis and its x-derivatives to the third order, contracted with the coefficient table in torch. In
    LUT mode the values come from the value table (the forward's) and every x-derivative, the first included,
    from the exact recurrence (:func:`derivative_engine_args`); a first-order backward reads the derivative
    table."""
    x, coeffs, bias, basis, lut_size, alpha, beta = inputs[:7]
    need_x = ctx.needs_input_grad[0]
    need_coeffs = ctx.needs_input_grad[1] and params_used_by_this_backward(ctx)
    need_bias = ctx.has_bias and ctx.needs_input_grad[2]
    n_in, n_basis, n_out = coeffs.shape
    spec = derivative_spec(x, basis, lut_size, alpha, beta, n_basis)
    dx, d_weight = differentiable_backward(spec, dy, x.contiguous(), coeffs.reshape(n_in * n_basis, n_out), need_x,
                                           need_coeffs)
    return (dx, d_weight.view(coeffs.shape) if need_coeffs else None, dy.sum(dim=0) if need_bias else None,
            None, None, None, None, None, None, None)


# how errors name the op
LABEL = "PolyKANLinear/ChebyKANLinear (warpkan::poly_forward)"
poly_forward.register_autograd(first_order_backward(LABEL, _backward, _higher_backward), setup_context=_setup_context)


_EagerPoly = eager_function("_EagerPoly", _forward_impl, _setup_context,
                            lambda ctx, dy: _backward(ctx, dy, _backward_impl), label=LABEL, higher=_higher_backward)


# PolyKANLinear's coeffs read [in, out, D + 1]: its route takes them as the module exposes them and makes the
# kernel layout [in, D + 1, out] inside the autograd node (a permute made outside is a node of its own; see
# eager_function), once for the forward and the backward: a view of kernel-layout storage, or a copy of a
# contiguous parameter (a batched transpose, whose gradient goes back the same way: _common.copy_into)
_SWAP_LAST = (lambda t: t.permute(0, 2, 1), lambda g: g.permute(0, 2, 1))
_EagerPolyLayer = eager_function("_EagerPolyLayer", _forward_impl, _setup_context,
                                 lambda ctx, dy: _backward(ctx, dy, _backward_impl), {1: _SWAP_LAST}, LABEL,
                                 prepare=lambda inputs: (inputs[0], contiguous(inputs[1]), *inputs[2:]),
                                 higher=_higher_backward)


def poly_apply(x, coeffs, bias, basis, lut_size, alpha, beta, strategy, precision="auto", deterministic=False,
               layer_layout=False):
    """:func:`poly_forward` with autograd on x [N, in]: the registered op under tracing, the eager route
    otherwise. ``layer_layout``: coeffs come as PolyKANLinear exposes them, [in, out, D + 1]."""
    return op_or_eager(poly_forward, _EagerPolyLayer if layer_layout else _EagerPoly, x)(
        x, coeffs, bias, basis, lut_size, alpha, beta, strategy, precision, deterministic)


def poly_kan(
    x: Tensor,
    coeffs: Tensor,
    bias: Tensor | None = None,
    basis: str = "chebyshev",
    lut_size: int = 0,
    alpha: float = 1.0,
    beta: float = 1.0,
    strategy: str = "auto",
    precision: str = "auto",
    deterministic: bool = False,
) -> Tensor:
    """``y[..., o] = sum_i sum_d coeffs[i, d, o] P_d(tanh x[..., i]) (+ bias[o])`` for x (..., in).

    coeffs [in, D + 1, out] (the kernel layout); ``lut_size = 0`` evaluates the basis exactly by its
    recurrence, ``lut_size >= 2`` reads it from tables of that many points on [-1, 1] (see
    ``warpkan.kernels.poly`` for the bases and the interpolation error bound). ``strategy``: "stencil", "gemm"
    or "auto"; ``precision``: "auto", "fp32", "tf32" or "bf16" (the gemm strategy's contractions, float32 I/O
    only for tf32 and bf16: the rule and error bound of ``warpkan.torch_bridge.edge_driver``);
    ``deterministic``: the stencil strategy's backward without atomics (bitwise reproducible run to run).
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
    check_strategy(strategy)
    check_precision(precision, x.dtype)
    return on_rows(x, n_in, lambda x2: poly_apply(x2, coeffs, bias, basis, lut_size, float(alpha), float(beta),
                                                  strategy, precision, deterministic))
