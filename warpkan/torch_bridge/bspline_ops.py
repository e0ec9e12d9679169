"""torch.library custom ops of the B-spline KAN layer, on the Warp kernels of ``warpkan.kernels.bspline``.

The ops take the kernel layout (see that module); :func:`bspline_kan` takes efficient-kan's layout and
(..., in) inputs, and is what ``KANLinear`` calls.

Two strategies compute the same map, as for every edge family (:mod:`warpkan.torch_bridge.edge_driver`, which
has their description, the ``precision`` rule of the gemm strategy and its error bound):

- ``stencil``: the edge engine's kernels evaluate each edge's k + 1 bases locally; cost independent of G. On
  CUDA, for grids within their shared-memory capacity (G + 3k <= 96 rows in float32), the warp-tiled kernels of
  ``warpkan.kernels.edge.tiled``; float32 grids up to a few times longer run them on bands of cells (the
  forward up to G + 2k <= 282 cells at k = 3, the backward up to 2310: ``forward_plan``, ``backward_plan``);
  else the per-thread kernels of ``warpkan.kernels.edge.stencil``.
- ``gemm`` (dense basis): the engine writes the transposed dense basis of a chunk of rows and cuBLAS does the
  contractions with the combined weight ``W = [base_weight_t; coef * scaler_t]``.

``tests/test_bspline.py`` checks y and every gradient against the float64 reference with the gemm error bound.

Host overhead. Each Warp launch is recorded once per (shapes, dtypes) signature and replayed, re-pointed at
the call's tensors by one ctypes store per tensor (no Warp view, no argument packing); gradient buffers are
written in full by the kernels (no zero fills); forward: 2 launches + 1 GEMM per row chunk, backward:
2 launches + 2 GEMMs per chunk + 2.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor

from ..kernels import bspline as kb
from ..kernels.edge import tiled as edge_tiled
# the rule and its measured bounds live where the Warp-native layers (no torch) read them too
from ..kernels.edge.strategy import choose_strategy
from .edge_driver import (PRECISION_UNIT_ROUNDOFF, PRECISIONS, STRATEGIES, EdgeSpec, check_precision,
                          differentiable_backward, edge_backward, edge_forward, gemm_backward, gemm_forward,
                          load_gemm_modules,
                          grad_buffers, node_combined_weight, resolve_precision, split_weight_grad)
from ..kernels._common import IO_SCALAR_NAMES
from ._common import (TRANSPOSED, WP_DTYPES, RecordedLaunches, autocast_dtype, check_tensor, contiguous,
                      copy_into, eager_function, first_order_backward, on_rows, op_or_eager,
                      params_used_by_this_backward)

__all__ = ["bspline_kan", "bspline_forward", "bspline_backward", "choose_strategy", "resolve_precision",
           "STRATEGIES", "PRECISIONS", "PRECISION_UNIT_ROUNDOFF"]


def _io_scalar(x: Tensor) -> str | None:
    """The kernels' scalar name of x's dtype (None for one they do not take)."""
    # two table lookups: wp.types.type_repr costs ~10 us a call, and this runs per launch
    return IO_SCALAR_NAMES.get(WP_DTYPES.get(x.dtype))


def _tiled(x: Tensor, coef: Tensor, spline_order: int) -> bool:
    """The stencil strategy runs the warp-tiled kernels on one table (CUDA, grid within their capacity)."""
    scalar = _io_scalar(x)
    return scalar in ("float32", "float64") and edge_tiled.tiled_applies(kb.family_of(spline_order, True, scalar),
                                                                         x.is_cuda, coef.shape[1])


def resolve_auto(family, tiled: bool, x: Tensor, n_coef: int, n_out: int, precision: str) -> str:
    """The strategy "auto" takes for a call of a spline family (B-spline, UKAN's range table) on x [N, in]:
    :func:`choose_strategy` with the call's resolved precision, and host-bound unless the call is recorded
    into a CUDA graph (``capture_step``, ``graphed_training_step``, ``torch.compile(mode="reduce-overhead")``),
    where only the GPU time counts; ``tiled``: the warp-tiled stencil kernels apply. Where an eager call takes
    the stencil kernels and a captured one would take the gemm strategy, the family's gemm module is loaded
    here: the capture after eager warm-up steps must not load one."""
    captured = x.is_cuda and torch.cuda.is_current_stream_capturing()
    strategy = choose_strategy(x.shape[0], x.shape[1], n_out, n_coef, tiled, precision, not captured)
    if (strategy == "stencil" and not captured and tiled
            and choose_strategy(x.shape[0], x.shape[1], n_out, n_coef, tiled, precision) == "gemm"):
        load_gemm_modules(family, precision, x.device)
    return strategy


def _resolve(strategy: str, x: Tensor, coef: Tensor, spline_order: int, uniform: bool,
             precision: str) -> tuple[str, str]:
    """(strategy, precision) resolved for one call (as ``ukan_ops._range_route`` does for UKAN's range table)."""
    precision = resolve_precision(precision, x.dtype, x.device)
    if strategy == "auto":
        tiled = _tiled(x, coef, spline_order)
        family = kb.family_of(spline_order, uniform, _io_scalar(x)) if tiled else None
        strategy = resolve_auto(family, tiled, x, coef.shape[1], coef.shape[2], precision)
    return strategy, precision


# Recorded Warp launches (see RecordedLaunches): re-pointed at each call's tensors, replayed on torch's stream.
_launch = RecordedLaunches()


def _gemm_forward(x, grid, base_weight_t, scaler_t, coef, spline_order, uniform, use_base, precision):
    return gemm_forward(kb.family_of(spline_order, uniform, _io_scalar(x)), _bspline_frame, (grid,), (), x,
                        base_weight_t, scaler_t, coef, use_base, precision)


def _gemm_backward(dy, x, grid, base_weight_t, scaler_t, coef, spline_order, uniform, use_base, need_x,
                   need_params, precision):
    return gemm_backward(kb.family_of(spline_order, uniform, _io_scalar(x)), _bspline_frame, (grid,), (), dy, x,
                         base_weight_t, scaler_t, coef, use_base, precision, need_x, need_params)


def _forward_impl(
    x: Tensor,
    grid: Tensor,
    base_weight_t: Tensor,
    scaler_t: Tensor,
    coef: Tensor,
    spline_order: int,
    uniform: bool,
    use_base: bool,
    deterministic: bool,
    strategy: str,
    precision: str = "auto",
) -> Tensor:
    """x [N, in], grid [in, G+2k+1], base_weight_t / scaler_t [in, out], coef [in, G+k, out] -> y [N, out].

    ``deterministic`` only affects the backward pass; it is an argument here so autograd can see it.
    ``precision`` applies to the gemm strategy (module docstring).
    """
    x, grid = x.contiguous(), grid.contiguous()
    strategy, precision = _resolve(strategy, x, coef, spline_order, uniform, precision)
    if strategy == "gemm":
        # the weight-combining kernel reads the parameters in any strides (no copy of a public-layout table)
        return _gemm_forward(x, grid, base_weight_t, scaler_t, coef, spline_order, uniform, use_base, precision)
    base_weight_t, scaler_t, coef = (contiguous(t) for t in (base_weight_t, scaler_t, coef))
    return edge_forward(kb.family_of(spline_order, uniform, _io_scalar(x)), _bspline_frame, (grid,), (), x,
                        base_weight_t, scaler_t, coef, use_base)


def _bspline_frame(grid):
    return kb.frame_of(grid)


def bspline_spec(x: Tensor, grid: Tensor, spline_order: int, uniform: bool, use_base: bool) -> EdgeSpec:
    """The edge-engine spec of a B-spline layer for x's dtype: its family (order, grid kind), its knots ``grid``
    [in, G + 2k + 1] as the frame, G + k coefficients an input, and whether the SiLU base rows are fused."""
    return EdgeSpec(kb.family_of(spline_order, uniform, _io_scalar(x)), _bspline_frame, (grid.contiguous(),), (),
                    grid.shape[1] - spline_order - 1, use_base)


bspline_forward = torch.library.custom_op("warpkan::bspline_forward", _forward_impl, mutates_args=())


@bspline_forward.register_fake
def _(x, grid, base_weight_t, scaler_t, coef, spline_order, uniform, use_base, deterministic, strategy,
      precision="auto"):
    return x.new_empty((x.shape[0], coef.shape[2]))


def _backward_impl(
    dy: Tensor,
    x: Tensor,
    grid: Tensor,
    base_weight_t: Tensor,
    scaler_t: Tensor,
    coef: Tensor,
    spline_order: int,
    uniform: bool,
    use_base: bool,
    deterministic: bool,
    strategy: str,
    need_x: bool,
    need_params: bool,
    precision: str = "auto",
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients (dx, d_base_weight_t, d_scaler_t, d_coef), the parameters' in the parameters' own strides
    (a public-layout parameter's gradient is then taken by AccumulateGrad without a copy); the ones not asked
    for come back empty."""
    dy, x, grid = dy.contiguous(), x.contiguous(), grid.contiguous()
    strategy, precision = _resolve(strategy, x, coef, spline_order, uniform, precision)
    if strategy == "gemm":
        return _gemm_backward(dy, x, grid, base_weight_t, scaler_t, coef, spline_order, uniform, use_base, need_x,
                              need_params, precision)
    grads = _stencil_backward(dy, x, grid, *(contiguous(t) for t in (base_weight_t, scaler_t, coef)), spline_order,
                              uniform, use_base, deterministic, need_x, need_params)
    return grads[:1] + tuple(_strided_like(g, t) for g, t in zip(grads[1:], (base_weight_t, scaler_t, coef)))


def _strided_like(grad: Tensor, like: Tensor) -> Tensor:
    """``grad`` (contiguous) in the strides ``torch.empty_like(like)`` has: copied only where they differ (a
    public-layout parameter's, by the transpose kernel: :func:`copy_into`)."""
    if grad.numel() == 0 or like.is_contiguous():
        return grad
    out = torch.empty_like(like)
    return grad if out.stride() == grad.stride() else copy_into(grad, out)


def _stencil_backward(dy, x, grid, base_weight_t, scaler_t, coef, spline_order, uniform, use_base, deterministic,
                      need_x, need_params):
    """The stencil strategy's gradients, on contiguous arguments (contiguous gradients)."""
    return edge_backward(kb.family_of(spline_order, uniform, _io_scalar(x)), _bspline_frame, (grid,), (), dy, x,
                         base_weight_t, scaler_t, coef, use_base, deterministic, need_x, need_params)


bspline_backward = torch.library.custom_op("warpkan::bspline_backward", _backward_impl, mutates_args=())


@bspline_backward.register_fake
def _(dy, x, grid, base_weight_t, scaler_t, coef, spline_order, uniform, use_base, deterministic, strategy, need_x,
      need_params, precision="auto"):
    return grad_buffers(x.contiguous(), base_weight_t, scaler_t, coef, need_x, need_params)


def _setup_context(ctx, inputs, output):
    x, grid, base_weight_t, scaler_t, coef, spline_order, uniform, use_base, deterministic, strategy, precision = inputs
    ctx.save_for_backward(x, grid, base_weight_t, scaler_t, coef)
    ctx.config = (spline_order, uniform, use_base, deterministic, strategy)
    ctx.precision = precision
    ctx.op_inputs = inputs  # for create_graph=True (_higher_backward): the op's inputs, with their history


def _backward(ctx, dy):
    x, grid, base_weight_t, scaler_t, coef = ctx.saved_tensors
    need_x = ctx.needs_input_grad[0]
    need_params = any(ctx.needs_input_grad[2:5])
    if not (need_x or need_params):
        return (None,) * 11
    dx, d_base, d_scaler, d_coef = bspline_backward(
        dy, x, grid, base_weight_t, scaler_t, coef, *ctx.config, need_x, need_params, ctx.precision
    )
    return _input_grads(ctx, dx, d_base, d_scaler, d_coef, need_x, need_params)


def _input_grads(ctx, dx, d_base, d_scaler, d_coef, need_x, need_params):
    use_base = ctx.config[2]
    return (
        dx if need_x else None,
        None,
        d_base if need_params and use_base and ctx.needs_input_grad[2] else None,
        d_scaler if need_params and ctx.needs_input_grad[3] else None,
        d_coef if need_params and ctx.needs_input_grad[4] else None,
        None, None, None, None, None, None,
    )


def _higher_backward(ctx, inputs, dy):
    """The gradients as differentiable graphs, for ``create_graph=True`` (any strategy: the same map): the
    engine's dense basis and its x-derivatives to the third order (``edge_driver.differentiable_backward``), the
    combined weight (made once a node) and the split of its gradient."""
    x, grid, base_weight_t, scaler_t, coef, spline_order, uniform, use_base = inputs[:8]
    need_x = ctx.needs_input_grad[0]
    need_params = any(ctx.needs_input_grad[2:5]) and params_used_by_this_backward(ctx)
    if not (need_x or need_params):
        return (None,) * 11
    spec = bspline_spec(x, grid, spline_order, uniform, use_base)
    weight = node_combined_weight(ctx, spec.family, base_weight_t, scaler_t, coef, use_base)
    dx, d_weight = differentiable_backward(spec, dy, x.contiguous(), weight, need_x, need_params)
    d_base = d_scaler = d_coef = None
    if need_params:
        d_base, d_scaler, d_coef = split_weight_grad(d_weight, scaler_t, coef, use_base)
    return _input_grads(ctx, dx, d_base, d_scaler, d_coef, need_x, need_params)


# how errors name the op
LABEL = "KANLinear (warpkan::bspline_forward)"
bspline_forward.register_autograd(first_order_backward(LABEL, _backward, _higher_backward), setup_context=_setup_context)


def _eager_backward(ctx, dy):
    x, grid, base_weight_t, scaler_t, coef = ctx.saved_tensors
    need_x = ctx.needs_input_grad[0]
    need_params = any(ctx.needs_input_grad[2:5])
    if not (need_x or need_params):
        return (None,) * 11
    dx, d_base, d_scaler, d_coef = _backward_impl(
        dy, x, grid, base_weight_t, scaler_t, coef, *ctx.config, need_x, need_params, ctx.precision
    )
    return _input_grads(ctx, dx, d_base, d_scaler, d_coef, need_x, need_params)


# In eager mode each custom-op call cost about 0.3 ms of host time on the GPU machine (torch 2.11, mostly
# inside torch's custom-op wrapper), which dominated small layers. The eager route takes the parameters in
# their public layout ([out, in], [out, in, G + k]) and makes the kernel-layout views inside (see
# eager_function). The gemm strategy reads them and writes their gradients in the parameters' own strides, so
# AccumulateGrad takes the gradients as they are; the stencil strategy reads a contiguous kernel-layout copy
# of a public-layout parameter (made once a step, _stencil_operands), and the route copies its gradient back
# into the parameter's strides (both copies by the transpose kernel on CUDA: _common.copy_into; none of them
# for KANLinear(contiguous_parameters=False), whose storage is the kernel layout).
_PUBLIC_LAYOUTS = {2: TRANSPOSED, 3: TRANSPOSED, 4: (lambda t: t.permute(1, 2, 0), lambda g: g.permute(2, 0, 1))}


def _stencil_operands(inputs: tuple) -> tuple:
    """The stencil strategy reads the parameters in the kernels' layout: made contiguous once, for the forward
    and the backward pass (the gemm strategy reads them in any strides)."""
    x, grid, base_weight_t, scaler_t, coef, spline_order, *config = inputs
    if _resolve(config[3], x, coef, spline_order, config[0], config[4])[0] == "gemm":
        return inputs
    return (x, grid, contiguous(base_weight_t), contiguous(scaler_t), contiguous(coef), spline_order, *config)


_EagerBSpline = eager_function("_EagerBSpline", _forward_impl, _setup_context, _eager_backward, _PUBLIC_LAYOUTS,
                               LABEL, prepare=_stencil_operands, higher=_higher_backward)


def bspline_kan(
    x: Tensor,
    grid: Tensor,
    base_weight: Tensor | None,
    spline_weight: Tensor,
    spline_scaler: Tensor,
    spline_order: int,
    uniform: bool,
    deterministic: bool = False,
    strategy: str = "auto",
    precision: str = "auto",
) -> Tensor:
    """The KANLinear map on x (..., in) with efficient-kan's parameter layout.

    grid [in, G+2k+1]; base_weight [out, in] or None for no base path; spline_weight [out, in, G+k];
    spline_scaler [out, in]. ``uniform`` says the knots of every input are equally spaced (the matrix-form
    fast path); pass False after ``update_grid``. Inputs outside the grid get a zero spline term. ValueError
    for knots that are not finite and strictly increasing, and for ``uniform=True`` with knots that are not
    uniform to the rounding of their dtype (:func:`check_knots`: read once per grid tensor and version).

    ``strategy``: "stencil" evaluates each edge locally in Warp (cost independent of G); "gemm" expands the
    bases of row chunks in Warp and contracts them with cuBLAS (fast for short bases); "auto" picks by shape
    (:func:`choose_strategy`).

    ``precision`` (gemm strategy): "fp32", "tf32", "bf16", or "auto": bf16 under bf16 autocast, else torch's
    ``torch.get_float32_matmul_precision()`` rule ("highest" -> fp32, "high" -> tf32, "medium" -> bf16), as
    nn.Linear follows it. Error bounds: module docstring. float64 always computes in float64.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    check_tensor("x", x, ndim_min=1)
    check_tensor("spline_weight", spline_weight, ndim=3, like=x)
    n_out, n_in, n_coef = spline_weight.shape
    if not 1 <= spline_order <= kb.MAX_SPLINE_ORDER:
        raise ValueError(f"spline_order must be in [1, {kb.MAX_SPLINE_ORDER}], got {spline_order}")
    check_tensor("x", x, last_dim=n_in)
    check_tensor("grid", grid, shape=(n_in, n_coef + spline_order + 1), like=x)
    check_tensor("spline_scaler", spline_scaler, shape=(n_out, n_in), like=x)
    if base_weight is not None:
        check_tensor("base_weight", base_weight, shape=(n_out, n_in), like=x)
    check_knots(grid, uniform)
    check_precision(precision, x.dtype)
    if precision == "auto" and autocast_dtype(x.device) == torch.bfloat16:
        precision = "bf16"  # torch's matmul rule is read inside the op, at run time (torch.compile cannot trace it)
    return apply_checked(x, grid, base_weight, spline_weight, spline_scaler, spline_order, uniform, deterministic,
                         strategy, precision)


# grid tensors whose knots were checked: id -> (weak reference, version counter, uniform to its dtype's rounding)
_checked_grids: dict = {}


def check_knots(grid: Tensor, uniform: bool) -> None:
    """ValueError unless every row of ``grid`` is finite and strictly increasing, and (``uniform``) uniform to
    the rounding of its dtype (:func:`warpkan.kernels.bspline.grid_is_uniform`: the matrix form evaluates
    the spline on exactly uniform knots). The knots are read to the host once per tensor and in-place
    version; not under tracing or CUDA-graph capture, which cannot read them."""
    if (torch.compiler.is_compiling() or grid.device.type == "meta"
            or isinstance(grid, FakeTensor)
            or (grid.is_cuda and torch.cuda.is_current_stream_capturing())):
        return
    key = id(grid)
    version = None if grid.is_inference() else grid._version  # inference tensors keep no version: read each call
    entry = _checked_grids.get(key)
    if entry is None or entry[0]() is not grid or version is None or entry[1] != version:
        host = grid.detach().cpu().numpy()
        kb.check_grid(host)
        entry = (weakref.ref(grid), version, kb.grid_is_uniform(host))
        if version is not None:
            if len(_checked_grids) > 1024:
                _checked_grids.clear()
            _checked_grids[key] = entry
    if uniform and not entry[2]:
        raise ValueError("uniform=True needs knots uniform to the rounding of grid's dtype (see "
                         "warpkan.kernels.bspline.grid_is_uniform); pass uniform=False for this grid")


def apply_checked(x: Tensor, grid: Tensor, base_weight: Tensor | None, spline_weight: Tensor, spline_scaler: Tensor,
                  spline_order: int, uniform: bool, deterministic: bool, strategy: str, precision: str) -> Tensor:
    """:func:`bspline_kan` on arguments already checked (``KANLinear`` checks its parameters and configuration
    once, at construction, and x per call): a small layer's eager step is host-bound."""
    n_in = spline_scaler.shape[1]
    use_base = base_weight is not None
    if not use_base:
        base_weight = spline_scaler  # any [out, in] tensor: the kernels skip the base term
    op = op_or_eager(bspline_forward, _EagerBSpline, x)
    return on_rows(x, n_in, lambda x2: op(x2, grid, base_weight, spline_scaler, spline_weight, spline_order, uniform,
                                          use_base, deterministic, strategy, precision))
