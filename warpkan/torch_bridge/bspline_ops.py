"""The B-spline KAN layer (KANLinear's map) on the edge engine's one op pair
(:mod:`warpkan.torch_bridge.edge_ops`): its spec (:func:`bspline_spec`: the B-spline family of the spline
order and grid kind, the knots as the frame), the checks of its arguments, and :func:`bspline_kan`, which takes
efficient-kan's layout and (..., in) inputs.

Two strategies compute the same map, as for every edge family (:mod:`warpkan.torch_bridge.edge_driver`, which
has their description, the ``precision`` rule of the gemm strategy and its error bound; "auto" follows
:mod:`warpkan.kernels.edge.strategy`):

- ``stencil``: the edge engine's kernels evaluate each edge's k + 1 bases locally; cost independent of G. On
  CUDA, for grids within their shared-memory capacity (G + 3k <= 96 rows in float32), the warp-tiled kernels of
  ``warpkan.kernels.edge.tiled``; float32 grids up to a few times longer run them on bands of cells (the
  forward up to G + 2k <= 282 cells at k = 3, the backward up to 2310: ``forward_plan``, ``backward_plan``);
  else the per-thread kernels of ``warpkan.kernels.edge.stencil``.
- ``gemm`` (dense basis): the engine writes the transposed dense basis of a chunk of rows and cuBLAS does the
  contractions with the combined weight ``W = [base_weight_t; coef * scaler_t]``.

``tests/test_bspline.py`` checks y and every gradient against the float64 reference with the gemm error bound.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor

from ..kernels import bspline as kb
from ..kernels._common import IO_SCALAR_NAMES
from ..kernels.edge.strategy import choose_strategy
from ._common import WP_DTYPES, autocast_dtype, check_tensor
from .edge_driver import PRECISION_UNIT_ROUNDOFF, PRECISIONS, STRATEGIES, EdgeSpec, check_precision, resolve_precision
from .edge_ops import static_spec_maker, edge_apply

__all__ = ["bspline_kan", "bspline_spec", "bspline_static_spec", "apply_checked", "check_knots", "choose_strategy", "resolve_precision",
           "STRATEGIES", "PRECISIONS", "PRECISION_UNIT_ROUNDOFF"]

# how errors name the layer and its op
LABEL = "KANLinear (warpkan::edge_forward)"


def _io_scalar(x: Tensor) -> str | None:
    """The kernels' scalar name of x's dtype (None for one they do not take)."""
    # two table lookups: wp.types.type_repr costs ~10 us a call, and this runs per launch
    return IO_SCALAR_NAMES.get(WP_DTYPES.get(x.dtype))


def _bspline_frame(grid):
    return kb.frame_of(grid)


@static_spec_maker("bspline")
def bspline_static_spec(spline_order: int, uniform: bool, scalar: str, n_coef: int, use_base: bool) -> EdgeSpec:
    """The spec of a B-spline layer less its knots (:meth:`EdgeSpec.with_frame` adds them): the family of the
    spline order, grid kind and scalar type, n_coef = G + k coefficients an input, the SiLU base rows fused."""
    return EdgeSpec(kb.family_of(spline_order, uniform, scalar), _bspline_frame, (), (), n_coef, use_base)


def bspline_spec(x: Tensor, grid: Tensor, spline_order: int, uniform: bool, use_base: bool) -> EdgeSpec:
    """The edge-engine spec of a B-spline layer for x's dtype: its family (order, grid kind), its knots ``grid``
    [in, G + 2k + 1] as the frame, G + k coefficients an input, and whether the SiLU base rows are fused."""
    return bspline_static_spec(*_static_args(x, grid, spline_order, uniform, use_base)).with_frame(
        (grid.contiguous(),))


def _static_args(x: Tensor, grid: Tensor, spline_order: int, uniform: bool, use_base: bool) -> tuple:
    """:func:`bspline_static_spec`'s arguments for x's dtype and the knots ``grid`` [in, G + 2k + 1]."""
    return spline_order, uniform, _io_scalar(x), grid.shape[1] - spline_order - 1, use_base


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
    (:func:`choose_strategy`, :mod:`warpkan.kernels.edge.strategy`).

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
                  spline_order: int, uniform: bool, deterministic: bool, strategy: str, precision: str,
                  out_dtype: "torch.dtype | None" = None) -> Tensor:
    """:func:`bspline_kan` on arguments already checked (``KANLinear`` checks its parameters and configuration
    once, at construction, and x per call): a small layer's eager step is host-bound. The parameters go to the
    op pair in efficient-kan's layout ("kanlinear": the op's views are made inside the autograd node).
    ``out_dtype``: y's dtype where it is not x's (an autocast caller's: ``edge_ops.edge_apply``)."""
    use_base = base_weight is not None
    static_args = _static_args(x, grid, spline_order, uniform, use_base)
    return edge_apply(x, "bspline", static_args, (grid.contiguous(),), base_weight, spline_scaler, spline_weight, None,
                      strategy, precision, deterministic, layout="kanlinear", label=LABEL, out_dtype=out_dtype)
