"""B-spline KAN kernels in pure Warp (no torch import).

Layout (the innermost index is the one consecutive threads walk, so it is the coalesced one):

- ``x``             [N, in]
- ``grid``          [in, G + 2k + 1]   knots per input (efficient-kan's ``grid`` buffer)
- ``base_weight_t`` [in, out]          transpose of efficient-kan's ``base_weight``
- ``scaler_t``      [in, out]          transpose of efficient-kan's ``spline_scaler``
- ``coef``          [in, G + k, out]   efficient-kan's ``spline_weight`` permuted (1, 2, 0)
- ``y``             [N, out]

Maths. Knots ``t_0 .. t_{G+2k}`` cut the line into ``G + 2k`` cells. Cell ``c`` carries the ``k + 1``
bases ``B_{c-k} .. B_c``; bases with an index outside ``[0, G + k)`` do not exist (zero coefficient).
On a uniform grid the local coordinate is ``u = (x - t_c) / h`` and ``B_{c-k+m}(x) = sum_p u^p M_k[p, m]``
with ``M_k`` generated exactly by :func:`uniform_basis_matrix`; a non-uniform grid (what ``update_grid``
produces) runs the local Cox-de Boor triangle on the ``2k`` knots around the cell instead. Either way the
cost per edge is O(k) and does not depend on ``G``.

Inputs outside ``[t_0, t_{G+2k})`` (and NaN) get a zero spline term, as in pykan and efficient-kan.

The kernels are the edge engine's (:mod:`warpkan.kernels.edge`), on the B-spline families of
:mod:`warpkan.kernels.edge.bspline_family`; this module checks a layer's arrays, builds its frame and picks the
family. Backward. The (n, i) entries are bucketed by (input, cell) with a stable sort, so the grouping is the same
on every run. Then either

- (default) one pass over the bucketed entries (``backward_bucketed``) forms every gradient: it accumulates
  ``dy * B`` for the current cell and ``dy * silu`` for the current input in registers and flushes them with
  one atomic per coefficient per cell run (d coef, d spline_scaler, d base_weight), and sums each entry's
  ``dx`` over the outputs with warp shuffles; the cell's coefficient rows are loaded once per run; or
- (``deterministic=True``, or when dx alone is wanted) atomic-free kernels: ``dx`` with one warp
  per row (lanes over outputs, a shuffle reduction per (n, i)); one thread per coefficient (i, j, o)
  gathering the rows of the ``k + 1`` cells that touch basis ``j`` (a binary search gives each bucket's
  extent); and d base_weight / d spline_scaler as row-chunk partials added by a fixed-order combine pass:
  bitwise-reproducible gradients.
"""

import numpy as np
import warp as wp

from .. import _checks
from ._common import scalar_name
from ._runtime import Workspace, clear_workspaces, launch_accumulate, workspace_for
from .edge import launch as edge
from .edge import tile_gemm
from .edge import tiled as edge_tiled
from .edge.bspline_family import MAX_SPLINE_ORDER, bspline_family, bspline_frame_of, uniform_basis_matrix
from .edge.dense import dense_width

__all__ = [
    "MAX_SPLINE_ORDER",
    "BSplineWorkspace",
    "uniform_basis_matrix",
    "family_of",
    "frame_of",
    "launch_forward",
    "launch_backward",
    "launch_gemm_forward",
    "launch_gemm_backward",
    "grid_is_uniform",
    "uniform_knots",
    "check_grid",
    "UNIFORM_GRID_ULPS",
    "clear_workspaces",
    "row_chunks",
    "dense_width",
    "launch_combine_weights",
    "launch_expand_basis",
    "launch_contract_basis_grad",
    "launch_split_param_grads",
    "tiled_applies",
    "check_layer_args",
]

BSplineWorkspace = Workspace  # the backward pass's scratch: see warpkan.kernels._runtime.Workspace
row_chunks = edge.row_chunks


def check_layer_args(in_features, out_features, grid_size, spline_order, grid_range) -> tuple:
    """The arguments of a B-spline KAN layer (the torch and the Warp-native one), checked and normalised:
    ``(in_features, out_features, grid_size, spline_order, (lo, hi))``. Raises TypeError/ValueError naming
    the argument (rules: :mod:`warpkan._checks`), before anything is allocated."""
    in_features = _checks.positive_int("in_features", in_features)
    out_features = _checks.positive_int("out_features", out_features)
    grid_size = _checks.positive_int("grid_size", grid_size)
    spline_order = _checks.int_in_range("spline_order", spline_order, 1, MAX_SPLINE_ORDER)
    grid_range = _checks.increasing_range("grid_range", grid_range)
    sizes = dict(in_features=in_features, out_features=out_features, grid_size=grid_size, spline_order=spline_order)
    _checks.fits_index("spline_weight", (out_features, in_features, grid_size + spline_order), **sizes)
    _checks.fits_index("grid", (in_features, grid_size + 2 * spline_order + 1), **sizes)
    return in_features, out_features, grid_size, spline_order, grid_range


# How far (in units of the knots' own rounding) a knot may lie from exactly uniform spacing for the grid to be
# evaluated in matrix form. Grids built as ``lo + j h`` in float32 or float64 (torch, numpy, efficient-kan, a
# float64 grid rounded to float32) lie within 2.8 units of it (measured over 20000 random ranges, sizes and
# orders); 8 leaves a margin, and keeps the matrix form within the rounding the knots themselves carry.
UNIFORM_GRID_ULPS = 8


def _uniform_deviation(grid: np.ndarray):
    """(the exactly uniform knots t_0 + j h of each row, h = (t_last - t_0) / (n - 1), and |grid - those|), in
    float64."""
    grid = np.asarray(grid, dtype=np.float64)
    n = grid.shape[1] - 1
    h = (grid[:, -1:] - grid[:, :1]) / n
    uniform = grid[:, :1] + np.arange(n + 1, dtype=np.float64) * h
    uniform[:, -1:] = grid[:, -1:]  # the end knots exactly
    return uniform, np.abs(grid - uniform)


def grid_is_uniform(grid: np.ndarray, eps: float | None = None) -> bool:
    """True when every row of ``grid`` [in, n_knots] is uniform to the rounding of its dtype: finite,
    increasing, and each knot within ``UNIFORM_GRID_ULPS * eps * max(|t_0|, |t_last|)`` of ``t_0 + j h`` with
    ``h = (t_last - t_0) / (n_knots - 1)``. ``eps``: the machine epsilon of ``grid``'s dtype unless given
    (float32 for a non-float array).

    The matrix form evaluates the spline on exactly those uniform knots (it reads ``t_0`` and ``t_last``
    alone), so it is taken only where that changes nothing beyond the rounding the knots already carry: a
    float64 grid with one knot moved by 1e-9 h runs the general path, and matches the float64 reference."""
    grid = np.asarray(grid)
    if eps is None:
        eps = float(np.finfo(grid.dtype if grid.dtype in (np.float32, np.float64) else np.float32).eps)
    if grid.ndim != 2 or grid.shape[1] < 2 or not np.all(np.isfinite(grid)):
        return False
    grid = grid.astype(np.float64)
    if np.any(grid[:, -1] <= grid[:, 0]):
        return False
    _, deviation = _uniform_deviation(grid)
    scale = np.maximum(np.abs(grid[:, :1]), np.abs(grid[:, -1:]))
    return bool(np.all(deviation <= UNIFORM_GRID_ULPS * eps * scale))


def uniform_knots(grid: np.ndarray) -> np.ndarray:
    """The exactly uniform knots ``t_0 + j h`` (float64) with each row's end knots: what the matrix form
    evaluates on. A grid uniform to the rounding of a narrower dtype is re-spaced with it when widened."""
    return _uniform_deviation(grid)[0]


def check_grid(grid: np.ndarray, name: str = "grid") -> None:
    """ValueError unless every row of ``grid`` [in, n_knots] is finite and strictly increasing."""
    grid = np.asarray(grid, dtype=np.float64)
    bad = ~np.all(np.isfinite(grid), axis=1)
    if grid.shape[1] > 1:
        with np.errstate(invalid="ignore"):
            bad |= ~np.all(np.diff(grid, axis=1) > 0, axis=1)
    if np.any(bad):
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} must be finite and strictly increasing along each row; row {row} is "
                         f"{np.array2string(grid[row], precision=6, threshold=12)}")



def family_of(order: int, uniform: bool, x_or_scalar) -> "object":
    """The edge family of a B-spline layer: (order, grid kind) and the scalar type of ``x`` (an array, or a
    scalar name)."""
    scalar = x_or_scalar if isinstance(x_or_scalar, str) else scalar_name(x_or_scalar)
    return bspline_family(order, uniform, scalar)


frame_of = bspline_frame_of


def check_shapes(x, grid, base_weight_t, scaler_t, coef, order):
    n_in = x.shape[1]
    n_out = coef.shape[2]
    n_coef = coef.shape[1]
    expected = {
        "grid": (n_in, n_coef + order + 1),
        "base_weight_t": (n_in, n_out),
        "scaler_t": (n_in, n_out),
        "coef": (n_in, n_coef, n_out),
    }
    for name, arr in (("grid", grid), ("base_weight_t", base_weight_t), ("scaler_t", scaler_t), ("coef", coef)):
        if tuple(arr.shape) != expected[name]:
            raise ValueError(f"{name} must have shape {expected[name]}, got {tuple(arr.shape)}")
        if arr.dtype != x.dtype:
            raise TypeError(f"{name} must have the dtype of x ({wp.types.type_repr(x.dtype)}), got "
                            f"{wp.types.type_repr(arr.dtype)}")
        if arr.device != x.device:
            raise ValueError(f"{name} must be on the device of x ({x.device}), got {arr.device}")


def launch_forward(x, grid, base_weight_t, scaler_t, coef, y, order: int, uniform: bool, use_base: bool = True,
                   stream=None, tiled=None, workspace=None) -> None:
    """y[n, o] = sum_i base_weight_t[i, o] silu(x[n, i]) + scaler_t[i, o] spline_io(x[n, i]). Overwrites y.

    ``tiled``: the warp-tiled CUDA kernels when True, the per-thread stencil kernels when False; None (default)
    takes the tiled ones wherever a plan applies (one table, or float32 bands of a longer grid)."""
    check_shapes(x, grid, base_weight_t, scaler_t, coef, order)
    edge.launch_forward(family_of(order, uniform, x), frame_of(grid), x, base_weight_t, scaler_t, coef, y,
                        use_base=use_base, stream=stream, tiled=tiled, workspace=workspace)


def launch_backward(dy, x, grid, base_weight_t, scaler_t, coef, order: int, uniform: bool, use_base: bool = True,
                    dx=None, d_base_weight_t=None, d_scaler_t=None, d_coef=None, deterministic: bool = False,
                    stream=None, workspace=None, tiled=None) -> None:
    """Accumulate (+=) the gradients of :func:`launch_forward` into whichever of dx, d_base_weight_t,
    d_scaler_t, d_coef are given (see :func:`warpkan.kernels.edge.launch.launch_backward`)."""
    check_shapes(x, grid, base_weight_t, scaler_t, coef, order)
    if tuple(dy.shape) != (x.shape[0], coef.shape[2]):
        raise ValueError(f"dy must have shape {(x.shape[0], coef.shape[2])}, got {tuple(dy.shape)}")
    edge.launch_backward(family_of(order, uniform, x), frame_of(grid), dy, x, base_weight_t, scaler_t, coef,
                         use_base=use_base, dx=dx, d_base_weight_t=d_base_weight_t, d_scaler_t=d_scaler_t,
                         d_coef=d_coef, deterministic=deterministic, stream=stream, workspace=workspace, tiled=tiled)


def _combined_weight(family, ws, base_weight_t, scaler_t, coef, use_base: bool, stream):
    """W = [base_weight_t; coef * scaler_t] [dense_width, out] in scratch (the gemm strategy's weight)."""
    n_in, n_coef, n_out = coef.shape
    weight = ws.get("gemm_weight", (dense_width(n_in, n_coef, use_base), n_out), coef.dtype)
    edge.launch_combine_weights(family, base_weight_t, scaler_t, coef, weight, use_base, stream)
    return weight


def launch_gemm_forward(x, grid, base_weight_t, scaler_t, coef, y, order: int, uniform: bool, use_base: bool = True,
                        stream=None, workspace=None) -> None:
    """y as :func:`launch_forward` computes it, by the gemm strategy (the dense basis times the combined weight
    with ``wp.tile_matmul``: :mod:`warpkan.kernels.edge.tile_gemm`). Overwrites y. x and y contiguous."""
    check_shapes(x, grid, base_weight_t, scaler_t, coef, order)
    family = family_of(order, uniform, x)
    ws = workspace or workspace_for(x.device, stream)
    weight = _combined_weight(family, ws, base_weight_t, scaler_t, coef, use_base, stream)
    tile_gemm.launch_gemm_forward(family, frame_of(grid), x, coef.shape[1], weight, y, use_base, stream=stream,
                                  workspace=ws)


def launch_gemm_backward(dy, x, grid, base_weight_t, scaler_t, coef, order: int, uniform: bool, use_base: bool = True,
                         dx=None, d_base_weight_t=None, d_scaler_t=None, d_coef=None, stream=None,
                         workspace=None) -> None:
    """Accumulate (+=) the gradients of :func:`launch_gemm_forward` into whichever of dx, d_base_weight_t,
    d_scaler_t, d_coef are given (contiguous): the combined weight's gradient (deterministic), split into the
    parameters' (the engine's split kernel) and added into theirs."""
    check_shapes(x, grid, base_weight_t, scaler_t, coef, order)
    n_in, n_coef, n_out = coef.shape
    if tuple(dy.shape) != (x.shape[0], n_out):
        raise ValueError(f"dy must have shape {(x.shape[0], n_out)}, got {tuple(dy.shape)}")
    family = family_of(order, uniform, x)
    ws = workspace or workspace_for(x.device, stream)
    weight = _combined_weight(family, ws, base_weight_t, scaler_t, coef, use_base, stream)
    params = (d_base_weight_t, d_scaler_t, d_coef)
    d_weight = None
    if any(p is not None for p in params):
        d_weight = ws.get("gemm_d_weight", tuple(weight.shape), x.dtype, zero=True)
    tile_gemm.launch_gemm_backward(family, frame_of(grid), dy, x, n_coef, weight, use_base, dx=dx, d_weight=d_weight,
                                   stream=stream, workspace=ws)
    if d_weight is None:
        return
    split = (ws.get("gemm_d_base", (n_in, n_out), x.dtype), ws.get("gemm_d_scaler", (n_in, n_out), x.dtype),
             ws.get("gemm_d_coef", (n_in, n_coef, n_out), x.dtype))
    edge.launch_split_param_grads(family, d_weight, scaler_t, coef, *split, use_base, stream)
    for part, grad in zip(split, params):
        if grad is not None:
            launch_accumulate(part, grad, stream)


def tiled_applies(x, coef, order: int, uniform: bool = True) -> bool:
    """Whether the warp-tiled kernels can run this layer on one table (a CUDA device, G + 3k within capacity)."""
    return edge_tiled.tiled_applies(family_of(order, uniform, x), x.device.is_cuda, coef.shape[1])


def launch_combine_weights(base_weight_t, scaler_t, coef, weight, order: int, uniform: bool, use_base: bool = True,
                           stream=None, record: bool = False):
    """weight [dense_width, out] = [base_weight_t; coef * scaler_t] in weight's dtype (see
    :mod:`warpkan.kernels.edge.dense`). Overwrites weight."""
    return edge.launch_combine_weights(family_of(order, uniform, coef), base_weight_t, scaler_t, coef, weight,
                                       use_base, stream, record)


def launch_expand_basis(x, grid, basis_t, order: int, uniform: bool, use_base: bool = True, stream=None,
                        record: bool = False):
    """basis_t [dense_width, rows] = the transposed dense basis of x [rows, in]. Overwrites basis_t."""
    return edge.launch_expand_basis(family_of(order, uniform, x), frame_of(grid), x, grid.shape[1] - order - 1,
                                    basis_t, use_base, stream, record)


def launch_contract_basis_grad(x, grid, d_basis_t, dx, order: int, uniform: bool, use_base: bool = True,
                               stream=None, record: bool = False):
    """dx from the gradient of the dense basis (see :func:`launch_expand_basis`). Overwrites dx."""
    return edge.launch_contract_basis_grad(family_of(order, uniform, x), frame_of(grid), x,
                                           grid.shape[1] - order - 1, d_basis_t, dx, use_base, stream, record)


def launch_split_param_grads(d_weight, scaler_t, coef, d_base_weight_t, d_scaler_t, d_coef, order: int,
                             uniform: bool, use_base: bool = True, stream=None, record: bool = False):
    """The gradient of the combined weight split into its parameters. Overwrites all three."""
    return edge.launch_split_param_grads(family_of(order, uniform, coef), d_weight, scaler_t, coef, d_base_weight_t,
                                         d_scaler_t, d_coef, use_base, stream, record)
