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

Backward. The (n, i) entries are bucketed by (input, cell) with a stable sort, so the grouping is the same
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

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import warp as wp

from .. import _checks
from ._common import SCALARS, lane_group_width, load4_funcs, on_stream, scalar_name, vec4_aligned
from ._common import lane_sum as _lane_sum

__all__ = [
    "MAX_SPLINE_ORDER",
    "BSplineVariant",
    "BSplineWorkspace",
    "uniform_basis_matrix",
    "basis_funcs",
    "BasisFuncs",
    "silu_func",
    "combine_rows_kernel",
    "get_variant",
    "launch_forward",
    "launch_backward",
    "grid_is_uniform",
    "uniform_knots",
    "check_grid",
    "UNIFORM_GRID_ULPS",
    "clear_workspaces",
    "row_chunks",
    "DenseKernels",
    "dense_width",
    "launch_combine_weights",
    "launch_expand_basis",
    "launch_contract_basis_grad",
    "launch_split_param_grads",
    "tiled_applies",
    "check_layer_args",
]

MAX_SPLINE_ORDER = 5
_TARGET_PARTIAL_THREADS = 1 << 19  # parallelism aimed at by the row-chunked reductions
_ROW_BLOCK = 32  # threads per row in the block-per-row dx kernel (one warp)
_DENSE_ROW_TILE = 32  # consecutive rows of one input per warp in the dense-basis kernels
# The bucketed pass (dx and every parameter gradient in one pass over the entries sorted by cell) is used
# whenever the gradients need not be reproducible, at any bucket fill: measured on an H200 at (2^17, 32->32,
# k=3) it beats the atomic-free kernels (dx, row partials, per-coefficient gather) at G = 64 (1.89 vs 5.6 ms),
# 1024 (1.96 vs 4.45), 2^14 (2.66 vs 4.93) and 2^18 (4.24 vs 9.13), where nearly every entry has a cell of its
# own.
# The stencil kernels give each thread a tile of OUT_TILE (= 4: one 16-byte load) consecutive outputs: the basis
# of an (n, i) entry is evaluated once per tile, and the tile's loads are independent (several in flight). The forward
# also takes FORWARD_ROWS rows per thread (independent x -> cell -> C load chains, w_b and s loaded once).
OUT_TILE = 4
FORWARD_ROWS = 2
_ENTRIES_PER_CHUNK = 256
_BUCKETED_BLOCK = 128  # threads per block of the bucketed pass (it holds ~100+ registers a thread)


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


@functools.lru_cache(maxsize=None)
def uniform_basis_matrix(order: int) -> tuple[tuple[float, ...], ...]:
    """Exact ``M_k`` (``k = order``) with ``B_{c-k+m}(t_c + u h) = sum_p u^p M[p][m]``.

    Derived from the cardinal B-spline ``N_k(t) = 1/k! sum_j (-1)^j C(k+1, j) (t - j)_+^k``: basis
    ``B_{c-k+m}`` is ``N_k`` on its piece ``q = k - m``, evaluated at ``t = u + q``.
    """
    if not 0 <= order <= MAX_SPLINE_ORDER + 2:
        raise ValueError(f"spline_order must be in [0, {MAX_SPLINE_ORDER + 2}], got {order}")
    k = order
    size = k + 1
    matrix = [[Fraction(0)] * size for _ in range(size)]
    for m in range(size):
        q = k - m
        for j in range(q + 1):
            sign_binom = (-1) ** j * math.comb(k + 1, j)
            shift = q - j  # (u + shift)^k = sum_p C(k, p) u^p shift^(k-p)
            for p in range(size):
                matrix[p][m] += Fraction(sign_binom * math.comb(k, p) * shift ** (k - p), math.factorial(k))
    return tuple(tuple(float(v) for v in row) for row in matrix)


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


@dataclass(frozen=True)
class BSplineVariant:
    """The compiled kernels of one (spline order, uniform-or-general, scalar type) combination."""

    order: int
    uniform: bool
    scalar: type
    forward: wp.Kernel
    backward_x: wp.Kernel
    backward_rows: wp.Kernel
    combine_rows: wp.Kernel
    bucket_keys: wp.Kernel
    bucket_offsets: wp.Kernel
    backward_coef: wp.Kernel
    backward_bucketed: wp.Kernel
    dense: dict  # the dense-basis (GEMM) strategy's kernels, by the dtype of the basis: see dense_kernels
    basis_matrix: object  # a wp matrix value passed to every kernel (unused by the general path)
    module: str
    basis_at: object  # @wp.func (grid, i, x, M) -> (valid, cell, bases): for kernels built on this variant
    basis_and_grad_at: object  # @wp.func (grid, i, x, M) -> (valid, cell, bases, their x-derivatives)
    cell_at: object  # @wp.func (grid, i, x) -> (valid, cell)

    @property
    def modules(self) -> tuple:
        return (self.module, self.module + "_rowblock", self.module + "_bucketed") + tuple(kernels.module for kernels in self.dense.values())




@dataclass(frozen=True)
class DenseKernels:
    """The dense-basis (GEMM) strategy's kernels of one variant for one basis dtype (the float32 variant also
    has a bfloat16 set: bf16 basis, weight and basis gradient; x, dx and the parameter gradients stay in the
    scalar type)."""

    module: str
    expand_basis: wp.Kernel
    combine_weights: wp.Kernel
    contract_basis_grad: wp.Kernel
    split_param_grads: wp.Kernel


@dataclass(frozen=True)
class BasisFuncs:
    """``@wp.func`` pieces shared by every kernel that evaluates uniform B-splines in matrix form (the
    B-spline, UKAN and building-block kernels), for one (order, scalar type)."""

    vec: type  # K-vector of the scalar type
    mat: type  # K x K matrix of the scalar type (the type of M_k)
    basis_matrix: object  # M_k as a value of ``mat``
    silu_and_grad: object  # x -> (silu(x), silu'(x))
    uniform_basis: object  # (u, M) -> [B_{c-k} .. B_c](u)
    uniform_basis_grad: object  # (u, 1/h, M) -> d/dx of the same


@functools.lru_cache(maxsize=None)
def silu_func(scalar_name: str = "float32"):
    """``@wp.func`` x -> (silu(x), silu'(x)) in the scalar type; the base path of every KAN layer."""
    scalar = SCALARS[scalar_name]
    one = scalar(1.0)

    @wp.func
    def silu_and_grad(x: scalar):
        sig = one / (one + wp.exp(-x))
        return x * sig, sig * (one + x * (one - sig))

    return silu_and_grad


@functools.lru_cache(maxsize=None)
def combine_rows_kernel(scalar_name: str = "float32") -> wp.Kernel:
    """The fixed-order combine pass of row-chunked reductions: d_base[i, o] += sum_chunk partial_base[chunk, i, o]
    (when use_base) and d_scaler[i, o] += sum_chunk partial_scaler[chunk, i, o]. Shared by the B-spline and
    UKAN backward passes (one small module per scalar type)."""
    scalar = SCALARS[scalar_name]

    @wp.kernel(enable_backward=False, module=f"warpkan_combine_rows_{scalar_name}")
    def combine_rows(
        partial_base: wp.array3d(dtype=scalar),
        partial_scaler: wp.array3d(dtype=scalar),
        use_base: int,
        d_base_weight_t: wp.array2d(dtype=scalar),
        d_scaler_t: wp.array2d(dtype=scalar),
    ):
        i, o = wp.tid()
        acc_base = scalar(0.0)
        acc_scaler = scalar(0.0)
        for chunk in range(partial_base.shape[0]):  # fixed order: deterministic
            acc_base = acc_base + partial_base[chunk, i, o]
            acc_scaler = acc_scaler + partial_scaler[chunk, i, o]
        if use_base:
            d_base_weight_t[i, o] = d_base_weight_t[i, o] + acc_base
        d_scaler_t[i, o] = d_scaler_t[i, o] + acc_scaler

    return combine_rows


@functools.lru_cache(maxsize=None)
def basis_funcs(order: int, scalar_name: str = "float32") -> BasisFuncs:
    if not 1 <= order <= MAX_SPLINE_ORDER:
        raise ValueError(f"spline_order must be in [1, {MAX_SPLINE_ORDER}], got {order}")
    scalar = SCALARS[scalar_name]
    K = order + 1
    vecK = wp.types.vector(length=K, dtype=scalar)
    matK = wp.types.matrix(shape=(K, K), dtype=scalar)
    one = scalar(1.0)
    silu_and_grad = silu_func(scalar_name)

    @wp.func
    def uniform_basis(u: scalar, basis_matrix: matK):
        b = vecK()
        power = one
        for p in range(K):
            for m in range(K):
                b[m] = b[m] + basis_matrix[p, m] * power
            power = power * u
        return b

    @wp.func
    def uniform_basis_grad(u: scalar, inv_h: scalar, basis_matrix: matK):
        """d/dx of the K bases: sum_p p M[p, m] u^(p-1) / h."""
        db = vecK()
        power = one
        for p in range(1, K):
            for m in range(K):
                db[m] = db[m] + scalar(p) * basis_matrix[p, m] * power
            power = power * u
        return db * inv_h

    basis_matrix = matK(*[scalar(v) for row in uniform_basis_matrix(order) for v in row])
    return BasisFuncs(vecK, matK, basis_matrix, silu_and_grad, uniform_basis, uniform_basis_grad)


@functools.lru_cache(maxsize=None)
def get_variant(order: int, uniform: bool, scalar_name: str = "float32") -> BSplineVariant:
    """Build (lazily) the kernels for one variant; all of them live in one Warp module."""
    if not 1 <= order <= MAX_SPLINE_ORDER:
        raise ValueError(f"spline_order must be in [1, {MAX_SPLINE_ORDER}], got {order}")
    if scalar_name not in SCALARS:
        raise TypeError(f"scalar type must be one of {sorted(SCALARS)}, got {scalar_name}")
    scalar = SCALARS[scalar_name]
    K = order + 1
    shared = basis_funcs(order, scalar_name)
    vecK, matK = shared.vec, shared.mat
    vecO = wp.types.vector(length=OUT_TILE, dtype=scalar)
    matRO = wp.types.matrix(shape=(FORWARD_ROWS, OUT_TILE), dtype=scalar)
    matKO = wp.types.matrix(shape=(K, OUT_TILE), dtype=scalar)
    lane_sum = _lane_sum(scalar)
    load4_2d, load4_3d = load4_funcs(scalar_name)
    module = f"warpkan_bspline_k{order}_{'uniform' if uniform else 'general'}_{scalar_name}"
    kernel = functools.partial(wp.kernel, enable_backward=False, module=module)
    # Block-reduction kernels run with their own block size; Warp compiles a module per block size, so they
    # live in a module of their own rather than recompiling the rest.
    row_block_kernel = functools.partial(wp.kernel, enable_backward=False, module=module + "_rowblock")
    bucketed_kernel = functools.partial(wp.kernel, enable_backward=False, module=module + "_bucketed")
    zero = scalar(0.0)
    one = scalar(1.0)

    # ------------------------------------------------------------------ basis evaluation (@wp.func)
    silu_and_grad = shared.silu_and_grad
    uniform_basis = shared.uniform_basis
    uniform_basis_grad = shared.uniform_basis_grad

    @wp.func
    def uniform_frame(grid: wp.array2d(dtype=scalar), i: int):
        """(t_0, 1/h) of the uniform grid of input i."""
        n_cells = grid.shape[1] - 1
        t0 = grid[i, 0]
        return t0, scalar(n_cells) / (grid[i, n_cells] - t0)

    @wp.func
    def uniform_cell(x: scalar, t0: scalar, inv_h: scalar, n_cells: int):
        """(inside, cell, u) of x in a uniform frame; cell 0 and u 0 when x is off the grid (NaN included)."""
        s = (x - t0) * inv_h
        inside = s >= zero and s < scalar(n_cells)  # false for NaN and +-Inf
        s = wp.where(inside, s, zero)
        cell = wp.min(int(s), n_cells - 1)
        return inside, cell, s - scalar(cell)

    @wp.func
    def uniform_locate(grid: wp.array2d(dtype=scalar), i: int, x: scalar):
        """(valid, cell, u, 1/h) on the uniform grid of input i."""
        t0, inv_h = uniform_frame(grid, i)
        inside, cell, u = uniform_cell(x, t0, inv_h, grid.shape[1] - 1)
        return wp.where(inside, 1, 0), cell, u, inv_h

    @wp.func
    def knot(grid: wp.array2d(dtype=scalar), i: int, idx: int):
        """Knot idx of input i, extended linearly past both ends (those knots only shape bases whose
        index lies outside [0, G + k), which carry no coefficient)."""
        last = grid.shape[1] - 1
        if idx < 0:
            return grid[i, 0] + scalar(idx) * (grid[i, 1] - grid[i, 0])
        if idx > last:
            return grid[i, last] + scalar(idx - last) * (grid[i, last] - grid[i, last - 1])
        return grid[i, idx]

    @wp.func
    def general_locate(grid: wp.array2d(dtype=scalar), i: int, x: scalar):
        """(valid, cell) by binary search in the knots of input i."""
        last = grid.shape[1] - 1
        valid = int(0)
        lo = int(0)
        if x >= grid[i, 0] and x < grid[i, last]:
            valid = 1
            hi = last
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if x >= grid[i, mid]:
                    lo = mid
                else:
                    hi = mid
        return valid, lo

    @wp.func
    def safe_div(a: scalar, b: scalar):
        if b == zero:
            return zero
        return a / b

    @wp.func
    def general_basis_and_grad(grid: wp.array2d(dtype=scalar), i: int, cell: int, x: scalar):
        """Local Cox-de Boor triangle (NURBS book A2.2): bases B_{cell-k..cell} and their x-derivatives."""
        left = vecK()
        right = vecK()
        b = vecK()
        lower = vecK()  # the degree k-1 bases, kept for the derivative
        b[0] = one
        for j in range(1, K):
            left[j] = x - knot(grid, i, cell + 1 - j)
            right[j] = knot(grid, i, cell + j) - x
            if j == K - 1:
                lower = b
            saved = zero
            for r in range(K - 1):
                if r < j:
                    temp = safe_div(b[r], right[r + 1] + left[j - r])
                    b[r] = saved + right[r + 1] * temp
                    saved = left[j - r] * temp
            b[j] = saved
        # d/dx B_{l,k} = k (B_{l,k-1} / (t_{l+k} - t_l) - B_{l+1,k-1} / (t_{l+k+1} - t_{l+1})), l = cell-k+m;
        # lower[q] is B_{cell-k+1+q, k-1}.
        db = vecK()
        kf = scalar(K - 1)
        for m in range(K):
            l = cell - (K - 1) + m
            if m >= 1:
                db[m] = db[m] + kf * safe_div(lower[m - 1], knot(grid, i, l + K - 1) - knot(grid, i, l))
            if m <= K - 2:
                db[m] = db[m] - kf * safe_div(lower[m], knot(grid, i, l + K) - knot(grid, i, l + 1))
        return b, db

    @wp.func
    def basis_at(grid: wp.array2d(dtype=scalar), i: int, x: scalar, basis_matrix: matK):
        """(valid, cell, bases) for x on input i; bases are zero when x is off the grid."""
        if wp.static(uniform):
            valid, cell, u, inv_h = uniform_locate(grid, i, x)
            b = vecK()
            if valid:
                b = uniform_basis(u, basis_matrix)
            return valid, cell, b
        else:
            valid, cell = general_locate(grid, i, x)
            b = vecK()
            if valid:
                b, db = general_basis_and_grad(grid, i, cell, x)
            return valid, cell, b

    @wp.func
    def basis_and_grad_at(grid: wp.array2d(dtype=scalar), i: int, x: scalar, basis_matrix: matK):
        if wp.static(uniform):
            valid, cell, u, inv_h = uniform_locate(grid, i, x)
            b = vecK()
            db = vecK()
            if valid:
                b = uniform_basis(u, basis_matrix)
                db = uniform_basis_grad(u, inv_h, basis_matrix)
            return valid, cell, b, db
        else:
            valid, cell = general_locate(grid, i, x)
            b = vecK()
            db = vecK()
            if valid:
                b, db = general_basis_and_grad(grid, i, cell, x)
            return valid, cell, b, db

    @wp.func
    def cell_at(grid: wp.array2d(dtype=scalar), i: int, x: scalar):
        """(valid, cell) of x on input i, without the bases (cell 0 off the grid)."""
        if wp.static(uniform):
            valid, cell, u, inv_h = uniform_locate(grid, i, x)
            return valid, cell
        else:
            return general_locate(grid, i, x)

    @wp.func
    def spline_at(coef: wp.array3d(dtype=scalar), i: int, cell: int, o: int, b: vecK):
        """sum_m b_m C[i, cell-k+m, o], skipping bases whose index is outside [0, G + k)."""
        n_coef = coef.shape[1]
        acc = zero
        for m in range(K):
            j = cell - (K - 1) + m
            if j >= 0 and j < n_coef:
                acc = acc + b[m] * coef[i, j, o]
        return acc

    @wp.func
    def cell_rows(coef: wp.array3d(dtype=scalar), i: int, cell: int, o0: int, aligned: int):
        """[C[i, cell-k+m, o0 + c]] for m < K, c < 4, without branches: a row whose basis index is outside
        [0, G + k) (every row when cell < 0) comes back zero (outputs past the end read the last one)."""
        n_coef = coef.shape[1]
        rows = matKO()
        for m in range(K):
            j = cell - (K - 1) + m
            row = load4_3d(coef, i, wp.clamp(j, 0, n_coef - 1), o0, aligned)
            for c in range(OUT_TILE):
                rows[m, c] = wp.where(j >= 0 and j < n_coef, row[c], zero)
        return rows

    @wp.func
    def spline_tile(b: vecK, rows: matKO):
        """[sum_m b_m rows[m, c] for c < 4]: the spline terms of a tile of outputs."""
        acc = vecO()
        for m in range(K):
            for c in range(OUT_TILE):
                acc[c] = acc[c] + b[m] * rows[m, c]
        return acc

    # ------------------------------------------------------------------ forward
    @kernel
    def forward(
        x: wp.array2d(dtype=scalar),
        grid: wp.array2d(dtype=scalar),
        base_weight_t: wp.array2d(dtype=scalar),
        scaler_t: wp.array2d(dtype=scalar),
        coef: wp.array3d(dtype=scalar),
        basis_matrix: matK,
        use_base: int,
        aligned: int,
        y: wp.array2d(dtype=scalar),
    ):
        # One thread per (FORWARD_ROWS rows, OUT_TILE = 4 outputs); consecutive threads take consecutive
        # output tiles of the same rows, so a warp's loads of w_b, s and C are contiguous, and each is one
        # 16-byte load when aligned. Each basis is evaluated once per 4 outputs (not once per output), w_b,
        # s and the grid frame are loaded once per FORWARD_ROWS rows, and the rows' load chains
        # (x -> cell -> C) are independent, so several are in flight per thread.
        tid = wp.tid()
        n_rows = x.shape[0]
        n_out = y.shape[1]
        n_cells = grid.shape[1] - 1
        n_tiles = (n_out + OUT_TILE - 1) // OUT_TILE
        group = tid // n_tiles
        o0 = (tid - group * n_tiles) * OUT_TILE
        n0 = group * FORWARD_ROWS
        acc = matRO()
        for i in range(x.shape[1]):
            w_base = load4_2d(base_weight_t, i, o0, aligned)
            s = load4_2d(scaler_t, i, o0, aligned)
            t0 = zero
            inv_h = zero
            if wp.static(uniform):
                t0, inv_h = uniform_frame(grid, i)
            for r in range(FORWARD_ROWS):
                xv = x[wp.min(n0 + r, n_rows - 1), i]
                cell = int(0)
                b = vecK()
                if wp.static(uniform):
                    inside, cell, u = uniform_cell(xv, t0, inv_h, n_cells)
                    b = uniform_basis(u, basis_matrix) * wp.where(inside, one, zero)
                else:
                    valid, cell, b = basis_at(grid, i, xv, basis_matrix)
                spline = spline_tile(b, cell_rows(coef, i, cell, o0, aligned))
                act, dact = silu_and_grad(xv)
                if use_base == 0:
                    act = zero
                for c in range(OUT_TILE):
                    acc[r, c] = acc[r, c] + s[c] * spline[c] + w_base[c] * act
        for r in range(FORWARD_ROWS):
            for c in range(OUT_TILE):
                if n0 + r < n_rows and o0 + c < n_out:
                    y[n0 + r, o0 + c] = acc[r, c]

    # ------------------------------------------------------------------ backward: x
    @row_block_kernel
    def backward_x(
        dy: wp.array2d(dtype=scalar),
        x: wp.array2d(dtype=scalar),
        grid: wp.array2d(dtype=scalar),
        base_weight_t: wp.array2d(dtype=scalar),
        scaler_t: wp.array2d(dtype=scalar),
        coef: wp.array3d(dtype=scalar),
        basis_matrix: matK,
        use_base: int,
        dx: wp.array2d(dtype=scalar),
    ):
        # dx[n, i] += sum_o dy[n, o] (w_b[i, o] silu'(x) + s[i, o] sum_m b'_m C[i, c-k+m, o])
        # One warp per row (a block of one thread off the GPU): its lanes take the outputs (consecutive
        # lanes, consecutive o: every load of dy, w_b, s and C is coalesced), then one shuffle reduction per
        # (n, i). The basis of (n, i) is
        # evaluated by every thread of the block (same x, no divergence); the reduction order is fixed.
        n, lane = wp.tid()
        lanes = wp.block_dim()
        n_out = dy.shape[1]
        for i in range(x.shape[1]):
            xv = x[n, i]
            valid, cell, b, db = basis_and_grad_at(grid, i, xv, basis_matrix)
            act = zero
            dact = zero
            if use_base:
                act, dact = silu_and_grad(xv)
            acc = zero
            for o in range(lane, n_out, lanes):
                g = zero
                if use_base:
                    g = base_weight_t[i, o] * dact
                if valid:
                    g = g + scaler_t[i, o] * spline_at(coef, i, cell, o, db)
                acc = acc + dy[n, o] * g
            total = lane_sum(acc, lanes)
            if lane == 0:
                dx[n, i] = dx[n, i] + total

    # ------------------------------------------------------------------ backward: base weight, scaler
    @kernel
    def backward_rows(
        dy: wp.array2d(dtype=scalar),
        x: wp.array2d(dtype=scalar),
        grid: wp.array2d(dtype=scalar),
        coef: wp.array3d(dtype=scalar),
        basis_matrix: matK,
        rows_per_chunk: int,
        partial_base: wp.array3d(dtype=scalar),
        partial_scaler: wp.array3d(dtype=scalar),
    ):
        # partial[chunk, i, o] = sum over the chunk's rows of dy[n, o] silu(x[n, i]) (resp. spline(x[n, i]))
        tid = wp.tid()
        n_out = dy.shape[1]
        n_in = x.shape[1]
        o = tid % n_out
        rest = tid // n_out
        i = rest % n_in
        chunk = rest // n_in
        start = chunk * rows_per_chunk
        stop = wp.min(start + rows_per_chunk, x.shape[0])
        acc_base = zero
        acc_scaler = zero
        for n in range(start, stop):
            xv = x[n, i]
            g = dy[n, o]
            act, dact = silu_and_grad(xv)
            acc_base = acc_base + g * act
            valid, cell, b = basis_at(grid, i, xv, basis_matrix)
            if valid:
                acc_scaler = acc_scaler + g * spline_at(coef, i, cell, o, b)
        partial_base[chunk, i, o] = acc_base
        partial_scaler[chunk, i, o] = acc_scaler

    combine_rows = combine_rows_kernel(scalar_name)

    # ------------------------------------------------------------------ backward: coefficients
    @wp.func
    def bucket_of(grid: wp.array2d(dtype=scalar), i: int, x: scalar, basis_matrix: matK):
        """Bucket of x: cell + 1 on the grid, 0 off the grid (NaN included). Buckets run 0 .. G + 2k."""
        valid, cell, b = basis_at(grid, i, x, basis_matrix)
        if valid:
            return cell + 1
        return 0

    @kernel
    def bucket_keys(
        x: wp.array2d(dtype=scalar),
        grid: wp.array2d(dtype=scalar),
        basis_matrix: matK,
        n_buckets: int,
        keys: wp.array(dtype=wp.int32),
        rows: wp.array(dtype=wp.int32),
    ):
        # entry e = i * N + n; key = i * n_buckets + bucket; the stable sort keeps n ascending per key
        i, n = wp.tid()
        e = i * x.shape[0] + n
        keys[e] = i * n_buckets + bucket_of(grid, i, x[n, i], basis_matrix)
        rows[e] = n

    @kernel
    def bucket_offsets(sorted_keys: wp.array(dtype=wp.int32), n_entries: int, offsets: wp.array(dtype=wp.int32)):
        # offsets[k] = first position whose key is >= k (a lower bound by binary search): bucket k holds
        # sorted entries offsets[k] .. offsets[k + 1] - 1. No atomics, so no contention on popular buckets.
        k = wp.tid()
        lo = int(0)
        hi = n_entries
        while lo < hi:
            mid = (lo + hi) // 2
            if sorted_keys[mid] < k:
                lo = mid + 1
            else:
                hi = mid
        offsets[k] = lo

    @kernel
    def backward_coef(
        dy: wp.array2d(dtype=scalar),
        x: wp.array2d(dtype=scalar),
        grid: wp.array2d(dtype=scalar),
        scaler_t: wp.array2d(dtype=scalar),
        basis_matrix: matK,
        rows: wp.array(dtype=wp.int32),
        offsets: wp.array(dtype=wp.int32),
        n_buckets: int,
        d_coef: wp.array3d(dtype=scalar),
    ):
        # d_coef[i, j, o] += s[i, o] sum_{m} sum_{n in cell j+k-m} dy[n, o] b_m(x[n, i])
        tid = wp.tid()
        n_out = d_coef.shape[2]
        n_coef = d_coef.shape[1]
        o = tid % n_out
        rest = tid // n_out
        j = rest % n_coef
        i = rest // n_coef
        acc = zero
        for m in range(K):
            key = i * n_buckets + (j + (K - 1) - m) + 1
            for e in range(offsets[key], offsets[key + 1]):
                n = rows[e]
                valid, cell, b = basis_at(grid, i, x[n, i], basis_matrix)
                acc = acc + dy[n, o] * b[m]
        d_coef[i, j, o] = d_coef[i, j, o] + scaler_t[i, o] * acc

    @bucketed_kernel
    def backward_bucketed(
        dy: wp.array2d(dtype=scalar),
        x: wp.array2d(dtype=scalar),
        grid: wp.array2d(dtype=scalar),
        base_weight_t: wp.array2d(dtype=scalar),
        scaler_t: wp.array2d(dtype=scalar),
        coef: wp.array3d(dtype=scalar),
        basis_matrix: matK,
        sorted_keys: wp.array(dtype=wp.int32),
        rows: wp.array(dtype=wp.int32),
        n_entries: int,
        n_buckets: int,
        entries_per_chunk: int,
        use_base: int,
        want_dx: int,
        lanes: int,
        aligned: int,
        dx: wp.array2d(dtype=scalar),
        d_base_weight_t: wp.array2d(dtype=scalar),
        d_scaler_t: wp.array2d(dtype=scalar),
        d_coef: wp.array3d(dtype=scalar),
    ):
        # Every gradient in one pass over the (n, i) entries sorted by (input, cell). One thread per (chunk of
        # entries, tile of 4 outputs); the tiles of one chunk are consecutive threads, so they walk the same
        # entries together (x broadcast, dy contiguous). What depends only on the input (grid frame, w_b, s)
        # or the cell (the K coefficient rows) is loaded when the key changes and kept in registers, and the
        # cell comes from the key, so an entry costs its row index, x, a 16-byte dy load and arithmetic.
        # Per entry a thread
        # - adds dy * B_m into K x 4 register sums for the current cell and dy * silu into 4 for the input;
        #   when the cell changes it flushes the cell's sums with one atomic per coefficient and folds
        #   sum_m C * sum into the input's d_scaler sums (d_scaler and d_base are flushed when the input
        #   changes: few atomics on those hot addresses);
        # - forms its tile's share of dx[n, i] = sum_o dy (w_b silu' + s sum_m B'_m C); the `lanes` threads
        #   of the entry add their shares with shuffles and the first adds the sum to dx (reproducible when
        #   the group covers every output: then it is the only add to that element).
        # The loop runs a fixed number of steps so that every lane of a warp reaches the shuffle together
        # (launch dims are padded to whole warps; padding threads have no entries).
        tid = wp.tid()
        n_out = dy.shape[1]
        n_coef = coef.shape[1]
        n_tiles = (n_out + OUT_TILE - 1) // OUT_TILE
        chunk = tid // n_tiles
        tile = tid - chunk * n_tiles
        o0 = tile * OUT_TILE
        out_mask = vecO()
        for c in range(OUT_TILE):
            out_mask[c] = wp.where(o0 + c < n_out, one, zero)
        start = chunk * entries_per_chunk
        stop = wp.min(start + entries_per_chunk, n_entries)
        current = int(-1)
        i_cur = int(-1)
        cell_cur = int(-1)
        t0 = zero
        inv_h = zero
        w_base = vecO()
        s = vecO()
        rows_c = matKO()  # the current cell's coefficient rows (cell_rows)
        acc = matKO()
        acc_base = vecO()
        acc_scaler = vecO()
        for step in range(entries_per_chunk + 1):
            e = start + step
            live = e < stop
            key = int(-1)
            n = int(0)
            xv = zero
            g = vecO()
            i_next = int(-1)
            if live:
                key = sorted_keys[e]
                i_next = i_cur
                if key != current:
                    i_next = key // n_buckets
                n = rows[e]
                xv = x[n, i_next]
                g = wp.cw_mul(load4_2d(dy, n, o0, aligned), out_mask)
            if key != current:
                if current >= 0:
                    if cell_cur >= 0:
                        for m in range(K):
                            j = cell_cur - (K - 1) + m
                            if j >= 0 and j < n_coef:
                                for c in range(OUT_TILE):
                                    if o0 + c < n_out:
                                        wp.atomic_add(d_coef, i_cur, j, o0 + c, s[c] * acc[m, c])
                                    acc_scaler[c] = acc_scaler[c] + rows_c[m, c] * acc[m, c]
                    if i_next != i_cur:
                        for c in range(OUT_TILE):
                            if o0 + c < n_out:
                                if use_base != 0:
                                    wp.atomic_add(d_base_weight_t, i_cur, o0 + c, acc_base[c])
                                wp.atomic_add(d_scaler_t, i_cur, o0 + c, acc_scaler[c])
                        acc_base = vecO()
                        acc_scaler = vecO()
                    acc = matKO()
                current = key
                if key >= 0:
                    if i_next != i_cur:
                        i_cur = i_next
                        w_base = load4_2d(base_weight_t, i_cur, o0, aligned)
                        s = load4_2d(scaler_t, i_cur, o0, aligned)
                        if wp.static(uniform):
                            t0, inv_h = uniform_frame(grid, i_cur)
                    cell_cur = key - i_cur * n_buckets - 1  # bucket 0 (off the grid) -> -1
                    rows_c = cell_rows(coef, i_cur, cell_cur, o0, aligned)
            part = zero
            if live:
                b = vecK()
                db = vecK()
                if cell_cur >= 0:
                    if wp.static(uniform):
                        u = (xv - t0) * inv_h - scalar(cell_cur)
                        b = uniform_basis(u, basis_matrix)
                        db = uniform_basis_grad(u, inv_h, basis_matrix)
                    else:
                        b, db = general_basis_and_grad(grid, i_cur, cell_cur, xv)
                act, dact = silu_and_grad(xv)
                if use_base == 0:
                    act = zero
                    dact = zero
                for c in range(OUT_TILE):
                    acc_base[c] = acc_base[c] + g[c] * act
                    spline_grad = zero
                    for m in range(K):
                        acc[m, c] = acc[m, c] + g[c] * b[m]
                        spline_grad = spline_grad + db[m] * rows_c[m, c]
                    part = part + g[c] * (s[c] * spline_grad + w_base[c] * dact)
            if want_dx != 0:
                # An atomic add whose result is unused is a fire-and-forget reduction: unlike dx += total it
                # puts no load of dx on the critical path. With one group per entry (lanes == n_tiles) it is
                # the only add to dx[n, i], so dx stays reproducible.
                total = lane_sum(part, lanes)
                if live and tile % lanes == 0:
                    wp.atomic_add(dx, n, i_cur, total)

    # ------------------------------------------------------------------ dense-basis (GEMM) strategy
    # The dense basis of a chunk of rows is written transposed, basis_t [width, rows] with
    # width = (in if the base path is fused) + in (G + k): row i holds silu(x[:, i]) and row
    # (base) + i (G + k) + j holds B_j(x[:, i]). Consecutive threads take consecutive rows n of one input
    # (tiles of _DENSE_ROW_TILE rows, inputs next), so every store of a warp covers consecutive addresses of
    # one basis row; every entry, zeros included, is written (no fill). y = basis_t^T W with
    # W = [base_weight_t; coef * scaler] [width, out] is then one GEMM, the base path included.
    @wp.func
    def dense_entry(tid: int, n_in: int):
        """(row, input) of thread tid in the dense-basis kernels."""
        tile_size = _DENSE_ROW_TILE * n_in
        tile = tid // tile_size
        rest = tid - tile * tile_size
        i = rest // _DENSE_ROW_TILE
        return tile * _DENSE_ROW_TILE + rest - i * _DENSE_ROW_TILE, i

    def make_dense_kernels(basis_type, module_name):
        dense_kernel = functools.partial(wp.kernel, enable_backward=False, module=module_name)

        @dense_kernel
        def expand_basis(
            x: wp.array2d(dtype=scalar),
            grid: wp.array2d(dtype=scalar),
            basis_matrix: matK,
            use_base: int,
            n_coef: int,
            basis_t: wp.array2d(dtype=basis_type),
        ):
            n, i = dense_entry(wp.tid(), x.shape[1])
            if n >= x.shape[0]:
                return
            xv = x[n, i]
            row = i * n_coef
            if use_base:
                act, dact = silu_and_grad(xv)
                basis_t[i, n] = basis_type(act)
                row = row + x.shape[1]
            valid, cell, b = basis_at(grid, i, xv, basis_matrix)
            first = cell - (K - 1)  # index of b[0]; b is all zero when x is off the grid
            # the same trip count in every thread of a warp, so each store is one coalesced row segment
            # (per-thread loop bounds around the cell diverge and measured 2.5x slower on the H200)
            for j in range(n_coef):
                value = zero
                for m in range(K):
                    if j - first == m:
                        value = b[m]
                basis_t[row + j, n] = basis_type(value)

        @dense_kernel
        def combine_weights(
            base_weight_t: wp.array2d(dtype=scalar),
            scaler_t: wp.array2d(dtype=scalar),
            coef: wp.array3d(dtype=scalar),
            use_base: int,
            weight: wp.array2d(dtype=basis_type),
        ):
            # weight = [base_weight_t; coef * scaler_t] in the basis dtype: one pass over the parameters
            i, o = wp.tid()
            n_coef = coef.shape[1]
            row = i * n_coef
            if use_base:
                weight[i, o] = basis_type(base_weight_t[i, o])
                row = row + coef.shape[0]
            s = scaler_t[i, o]
            for j in range(n_coef):
                weight[row + j, o] = basis_type(coef[i, j, o] * s)

        return expand_basis, combine_weights

    def make_dense_grad_kernels(basis_type, module_name):
        dense_kernel = functools.partial(wp.kernel, enable_backward=False, module=module_name)

        @dense_kernel
        def contract_basis_grad(
            x: wp.array2d(dtype=scalar),
            grid: wp.array2d(dtype=scalar),
            basis_matrix: matK,
            use_base: int,
            n_coef: int,
            d_basis_t: wp.array2d(dtype=basis_type),
            dx: wp.array2d(dtype=scalar),
        ):
            # dx[n, i] = d_basis_t[i, n] silu'(x) + sum_m d_basis_t[row(cell - k + m), n] dB/dx (overwrites)
            n, i = dense_entry(wp.tid(), x.shape[1])
            if n >= x.shape[0]:
                return
            xv = x[n, i]
            acc = zero
            row = i * n_coef
            if use_base:
                act, dact = silu_and_grad(xv)
                acc = scalar(d_basis_t[i, n]) * dact
                row = row + x.shape[1]
            valid, cell, b, db = basis_and_grad_at(grid, i, xv, basis_matrix)
            if valid:
                for m in range(K):
                    j = cell - (K - 1) + m
                    if j >= 0 and j < n_coef:
                        acc = acc + db[m] * scalar(d_basis_t[row + j, n])
            dx[n, i] = acc

        @dense_kernel
        def split_param_grads(
            d_weight: wp.array2d(dtype=scalar),
            scaler_t: wp.array2d(dtype=scalar),
            coef: wp.array3d(dtype=scalar),
            use_base: int,
            d_base_weight_t: wp.array2d(dtype=scalar),
            d_scaler_t: wp.array2d(dtype=scalar),
            d_coef: wp.array3d(dtype=scalar),
        ):
            # the gradient of weight = [base_weight_t; coef * scaler_t], split into its parameters (overwrites)
            i, o = wp.tid()
            n_coef = coef.shape[1]
            row = i * n_coef
            if use_base:
                d_base_weight_t[i, o] = d_weight[i, o]
                row = row + coef.shape[0]
            else:
                d_base_weight_t[i, o] = zero
            s = scaler_t[i, o]
            acc = zero
            for j in range(n_coef):
                g = d_weight[row + j, o]
                d_coef[i, j, o] = g * s
                acc = acc + g * coef[i, j, o]
            d_scaler_t[i, o] = acc

        return contract_basis_grad, split_param_grads

    # One module per basis dtype, apart from the stencil kernels: each is compiled only when used.
    dense = {}
    for basis_name, basis_type in ((scalar_name, scalar), ("bfloat16", wp.bfloat16)):
        if basis_type is wp.bfloat16 and scalar is not wp.float32:
            continue
        dense_module = f"{module}_dense_{basis_name}"
        expand_basis, combine_weights = make_dense_kernels(basis_type, dense_module)
        contract_basis_grad, split_param_grads = make_dense_grad_kernels(basis_type, dense_module)
        dense[basis_name] = DenseKernels(
            dense_module, expand_basis, combine_weights, contract_basis_grad, split_param_grads
        )

    basis_matrix = shared.basis_matrix
    return BSplineVariant(
        order=order,
        uniform=uniform,
        scalar=scalar,
        forward=forward,
        backward_x=backward_x,
        backward_rows=backward_rows,
        combine_rows=combine_rows,
        bucket_keys=bucket_keys,
        bucket_offsets=bucket_offsets,
        backward_coef=backward_coef,
        backward_bucketed=backward_bucketed,
        dense=dense,
        basis_matrix=basis_matrix,
        module=module,
        basis_at=basis_at,
        basis_and_grad_at=basis_and_grad_at,
        cell_at=cell_at,
    )




def _check_shapes(x, grid, base_weight_t, scaler_t, coef, order):
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
            raise TypeError(f"{name} must have the dtype of x ({wp.types.type_repr(x.dtype)}), got {wp.types.type_repr(arr.dtype)}")
        if arr.device != x.device:
            raise ValueError(f"{name} must be on the device of x ({x.device}), got {arr.device}")


def launch_forward(
    x: "wp.array2d",
    grid: "wp.array2d",
    base_weight_t: "wp.array2d",
    scaler_t: "wp.array2d",
    coef: "wp.array3d",
    y: "wp.array2d",
    order: int,
    uniform: bool,
    use_base: bool = True,
    stream: "wp.Stream | None" = None,
    tiled: "bool | None" = None,
    workspace: "BSplineWorkspace | None" = None,
) -> None:
    """y[n, o] = sum_i base_weight_t[i, o] silu(x[n, i]) + scaler_t[i, o] spline_io(x[n, i]). Overwrites y.

    ``tiled``: the warp-tiled CUDA kernels (:mod:`warpkan.kernels.bspline_tiled`) when True, the per-thread
    stencil kernels when False; None (default) takes the tiled ones wherever they apply: on one table
    (:func:`tiled_applies`) or, float32, on bands of a longer grid
    (:func:`warpkan.kernels.bspline_tiled.forward_plan`)."""
    _check_shapes(x, grid, base_weight_t, scaler_t, coef, order)
    if _take_tiled(tiled, x, coef, order):
        from . import bspline_tiled

        bspline_tiled.launch_tiled_forward(x, grid, base_weight_t, scaler_t, coef, y, order, uniform, use_base,
                                           stream=stream, workspace=workspace)
        return
    variant = get_variant(order, uniform, scalar_name(x))
    n_rows, n_out = x.shape[0], coef.shape[2]
    if n_rows == 0 or n_out == 0:
        return
    if x.shape[1] == 0:
        y.zero_()
        return
    wp.launch(
        variant.forward,
        dim=-(-n_rows // FORWARD_ROWS) * -(-n_out // OUT_TILE),
        inputs=[x, grid, base_weight_t, scaler_t, coef, variant.basis_matrix, int(use_base),
                int(vec4_aligned(base_weight_t, scaler_t, coef))],
        outputs=[y],
        device=x.device,
        stream=stream,
        record_tape=False,
    )


def tiled_applies(x: "wp.array2d", coef: "wp.array3d", order: int) -> bool:
    """Whether the warp-tiled kernels can run this layer: a CUDA device and G + 3k within their shared-memory
    capacity (:data:`warpkan.kernels.bspline_tiled.CAPACITIES`)."""
    from . import bspline_tiled

    return bspline_tiled.tiled_applies(x.device.is_cuda, scalar_name(x), coef.shape[1], order)


def _take_tiled(tiled: "bool | None", x, coef, order: int) -> bool:
    """Whether the forward pass runs the tiled kernels (on one table, or on bands of a longer grid)."""
    from . import bspline_tiled

    applies = bspline_tiled.forward_plan(x.device.is_cuda, scalar_name(x), coef.shape[1], order) is not None
    if tiled is None:
        return applies
    if tiled and not applies:
        raise ValueError("tiled=True needs a CUDA device and a grid within the tiled forward's capacity, on one "
                         f"table or (float32) on bands of cells (G + 3k = {coef.shape[1] + 2 * order} rows)")
    return bool(tiled)


def _dense_launch(kernel, dim, inputs, device, stream, record: bool):
    """wp.launch on ``stream``, or (record=True) the recorded launch as a one-element list, run nothing."""
    launch = wp.launch(kernel, dim=dim, inputs=inputs, device=device, stream=stream, record_tape=False,
                       record_cmd=record)
    return [launch] if record else None


def _dense_kernels(order: int, uniform: bool, scalar, basis_dtype) -> DenseKernels:
    variant = get_variant(order, uniform, scalar)
    kernels = variant.dense.get("bfloat16" if basis_dtype == wp.bfloat16 else scalar)
    if kernels is None or (basis_dtype != wp.bfloat16 and basis_dtype != SCALARS[scalar]):
        raise TypeError(f"the dense basis must be {scalar} or (for float32) bfloat16, got "
                        f"{wp.types.type_repr(basis_dtype)}")
    return kernels


def _dense_dim(x) -> int:
    """Threads of the row-tiled dense-basis kernels for x [rows, in]."""
    return -(-x.shape[0] // _DENSE_ROW_TILE) * _DENSE_ROW_TILE * x.shape[1]


def dense_width(n_in: int, n_coef: int, use_base: bool) -> int:
    """Contraction length of the dense-basis strategy: the silu rows (when the base path is fused) and the
    G + k basis rows of every input."""
    return (n_in if use_base else 0) + n_in * n_coef


def launch_combine_weights(base_weight_t, scaler_t, coef, weight, order: int, uniform: bool, use_base: bool = True,
                           stream=None, record: bool = False):
    """weight [dense_width, out] = [base_weight_t; coef * scaler_t] (the base rows only when ``use_base``), in
    weight's dtype (the scalar type, or bfloat16 for float32 parameters). Overwrites weight."""
    kernels = _dense_kernels(order, uniform, scalar_name(coef, "coef"), weight.dtype)
    return _dense_launch(kernels.combine_weights, tuple(scaler_t.shape),
                         [base_weight_t, scaler_t, coef, int(use_base), weight], coef.device, stream, record)


def launch_expand_basis(x, grid, basis_t, order: int, uniform: bool, use_base: bool = True, stream=None,
                        record: bool = False):
    """basis_t [dense_width, rows] = the transposed dense basis of x [rows, in]: silu(x[:, i]) in row i (when
    ``use_base``), then B_j(x[:, i]) for j < G + k, zeros included (no fill needed), in basis_t's dtype
    (the scalar type, or bfloat16 for float32 x). The dense-basis strategy multiplies it by the
    :func:`launch_combine_weights` matrix with a GEMM."""
    kernels = _dense_kernels(order, uniform, scalar_name(x), basis_t.dtype)
    n_coef = grid.shape[1] - order - 1
    return _dense_launch(kernels.expand_basis, _dense_dim(x),
                         [x, grid, get_variant(order, uniform, scalar_name(x)).basis_matrix, int(use_base), n_coef,
                          basis_t], x.device, stream, record)


def launch_contract_basis_grad(x, grid, d_basis_t, dx, order: int, uniform: bool, use_base: bool = True,
                               stream=None, record: bool = False):
    """dx[n, i] = d_basis_t[i, n] silu'(x[n, i]) (when ``use_base``) + sum_j d_basis_t[row_ij, n] dB_j/dx over
    the k + 1 non-zero bases; d_basis_t is the gradient of the :func:`launch_expand_basis` layout. Overwrites
    dx."""
    kernels = _dense_kernels(order, uniform, scalar_name(x), d_basis_t.dtype)
    n_coef = grid.shape[1] - order - 1
    return _dense_launch(kernels.contract_basis_grad, _dense_dim(x),
                         [x, grid, get_variant(order, uniform, scalar_name(x)).basis_matrix, int(use_base), n_coef,
                          d_basis_t, dx], x.device, stream, record)


def launch_split_param_grads(d_weight, scaler_t, coef, d_base_weight_t, d_scaler_t, d_coef, order: int,
                             uniform: bool, use_base: bool = True, stream=None, record: bool = False):
    """The gradient d_weight [dense_width, out] of the combined weight, split into d_base_weight_t (zero
    without the base path), d_coef = d_w * scaler_t and d_scaler_t = sum_j d_w * coef. Overwrites all three."""
    kernels = _dense_kernels(order, uniform, scalar_name(coef, "coef"), d_weight.dtype)
    return _dense_launch(kernels.split_param_grads, tuple(scaler_t.shape),
                         [d_weight, scaler_t, coef, int(use_base), d_base_weight_t, d_scaler_t, d_coef],
                         coef.device, stream, record)


class BSplineWorkspace:
    """Scratch buffers of the backward pass, grown on demand and reused between calls on one device, and
    the device-wide primitive the bucketing needs (a stable key-value sort).

    A host framework can pass its own workspace with the same two methods: the torch bridge allocates from
    torch's caching allocator and sorts with torch, which keeps the backward pass legal under CUDA-graph
    capture of torch's stream (``wp.utils``' sort is not, on a foreign stream)."""

    def __init__(self, device):
        self.device = wp.get_device(device)
        self._buffers: dict[str, wp.array] = {}

    def sort_pairs(self, keys: wp.array, values: wp.array, count: int, key_bits: int) -> None:
        """Stable sort of keys[:count] with values[:count]; both arrays hold at least 2 * count entries."""
        wp.utils.radix_sort_pairs(keys, values, count, end_bit=key_bits)

    def get(self, name: str, shape, dtype, zero: bool = False) -> wp.array:
        size = int(np.prod(shape)) if len(shape) else 1
        buf = self._buffers.get((name, dtype))
        if buf is None or buf.size < size:
            buf = wp.empty(max(size, 1), dtype=dtype, device=self.device)
            self._buffers[(name, dtype)] = buf
        view = buf[:size].reshape(tuple(shape)) if len(shape) > 1 else buf[:size]
        if zero:
            view.zero_()
        return view


_workspaces: dict[tuple, BSplineWorkspace] = {}


def _workspace(device, stream) -> BSplineWorkspace:
    # one workspace per (device, stream): backward passes on different streams must not share scratch
    key = (str(wp.get_device(device)), stream.cuda_stream if stream is not None else 0)
    if key not in _workspaces:
        _workspaces[key] = BSplineWorkspace(key[0])
    return _workspaces[key]


def clear_workspaces() -> None:
    """Free the backward pass's cached scratch buffers on every device."""
    _workspaces.clear()


def row_chunks(n_rows: int, n_in: int, n_out: int) -> tuple[int, int]:
    """(n_chunks, rows_per_chunk) for the row reductions: a function of the shapes alone, so that the
    summation order, and so the result, is the same on every run."""
    pairs = max(n_in * n_out, 1)
    n_chunks = max(1, min(-(-_TARGET_PARTIAL_THREADS // pairs), -(-n_rows // 32)))
    rows_per_chunk = -(-n_rows // n_chunks)
    n_chunks = -(-n_rows // rows_per_chunk)
    return n_chunks, rows_per_chunk


def launch_backward(
    dy: "wp.array2d",
    x: "wp.array2d",
    grid: "wp.array2d",
    base_weight_t: "wp.array2d",
    scaler_t: "wp.array2d",
    coef: "wp.array3d",
    order: int,
    uniform: bool,
    use_base: bool = True,
    dx: "wp.array2d | None" = None,
    d_base_weight_t: "wp.array2d | None" = None,
    d_scaler_t: "wp.array2d | None" = None,
    d_coef: "wp.array3d | None" = None,
    deterministic: bool = False,
    stream: "wp.Stream | None" = None,
    workspace: "BSplineWorkspace | None" = None,
    tiled: "bool | None" = None,
) -> None:
    """Accumulate (+=) the gradients of ``launch_forward`` into whichever of dx, d_base_weight_t,
    d_scaler_t, d_coef are given. ``d_base_weight_t`` and ``d_scaler_t`` go together.

    ``tiled`` as in :func:`launch_forward`, except that the tiled pass also takes grids past its table
    capacity, on bands of cells (:func:`warpkan.kernels.bspline_tiled.backward_plan`; not deterministic). It
    forms all three parameter gradients (so it is taken when they are all asked for), and is deterministic for
    dx up to 32 outputs."""
    _check_shapes(x, grid, base_weight_t, scaler_t, coef, order)
    from . import bspline_tiled

    all_params = d_coef is not None and d_base_weight_t is not None and d_scaler_t is not None
    # the tiled pass reaches longer grids than the forward's, on bands of cells (backward_plan)
    plan = bspline_tiled.backward_plan(x.device.is_cuda, scalar_name(x), coef.shape[1], order)
    if tiled and plan is None:
        raise ValueError("tiled=True needs a CUDA device and a grid within the tiled backward pass's reach "
                         f"(G + 3k = {coef.shape[1] + 2 * order} rows)")
    tiled_ok = plan is not None and bspline_tiled.backward_takes(coef.shape[2], all_params, deterministic,
                                                                 dx is not None, plan.banded)
    if tiled and not tiled_ok:
        raise ValueError("tiled=True needs all three parameter gradients (and, when deterministic, one table and, "
                         "with dx, at most 32 outputs)")
    if tiled_ok and tiled is not False:
        bspline_tiled.launch_tiled_backward(dy, x, grid, base_weight_t, scaler_t, coef, order, uniform, use_base,
                                            dx=dx, d_base_weight_t=d_base_weight_t, d_scaler_t=d_scaler_t,
                                            d_coef=d_coef, deterministic=deterministic, stream=stream,
                                            workspace=workspace)
        return
    dtype_name = scalar_name(x)
    variant = get_variant(order, uniform, dtype_name)
    device = x.device
    n_rows, n_in = x.shape
    n_coef, n_out = coef.shape[1], coef.shape[2]
    if n_rows == 0 or n_in == 0 or n_out == 0:
        return
    if tuple(dy.shape) != (n_rows, n_out):
        raise ValueError(f"dy must have shape {(n_rows, n_out)}, got {tuple(dy.shape)}")
    ws = workspace or _workspace(device, stream)
    bm = variant.basis_matrix
    scalar = variant.scalar

    with on_stream(stream):
        n_buckets = grid.shape[1] + 1  # G + 2k cells, plus the off-grid bucket 0
        bucketed = (
            not deterministic
            and d_coef is not None
            and d_base_weight_t is not None
            and d_scaler_t is not None
        )
        if bucketed:
            rows, sorted_keys = _sort_entries(variant, ws, x, grid, n_buckets)
            n_entries = n_rows * n_in
            n_tiles = -(-n_out // OUT_TILE)
            n_chunks = -(-n_entries // _ENTRIES_PER_CHUNK)
            threads = n_chunks * n_tiles
            if device.is_cuda:
                threads = -(-threads // 32) * 32  # whole warps: every lane reaches the shuffles
            want_dx = dx is not None
            wp.launch(
                variant.backward_bucketed,
                dim=threads,
                inputs=[dy, x, grid, base_weight_t, scaler_t, coef, bm, sorted_keys, rows, n_entries, n_buckets,
                        _ENTRIES_PER_CHUNK, int(use_base), int(want_dx), lane_group_width(n_tiles, device.is_cuda),
                        int(vec4_aligned(dy, base_weight_t, scaler_t, coef))],
                outputs=[dx, d_base_weight_t, d_scaler_t, d_coef],
                device=device,
                block_dim=_BUCKETED_BLOCK if device.is_cuda else 1,
                record_tape=False,
            )
            return

        if dx is not None:
            block = _ROW_BLOCK if device.is_cuda else 1
            wp.launch(
                variant.backward_x,
                dim=(n_rows, block),
                inputs=[dy, x, grid, base_weight_t, scaler_t, coef, bm, int(use_base)],
                outputs=[dx],
                device=device,
                block_dim=block,
                record_tape=False,
            )

        if d_base_weight_t is not None or d_scaler_t is not None:
            if d_base_weight_t is None or d_scaler_t is None:
                raise ValueError("d_base_weight_t and d_scaler_t must be given together")
            n_chunks, rows_per_chunk = row_chunks(n_rows, n_in, n_out)
            partial_base = ws.get("partial_base", (n_chunks, n_in, n_out), scalar)
            partial_scaler = ws.get("partial_scaler", (n_chunks, n_in, n_out), scalar)
            wp.launch(
                variant.backward_rows,
                dim=n_chunks * n_in * n_out,
                inputs=[dy, x, grid, coef, bm, rows_per_chunk],
                outputs=[partial_base, partial_scaler],
                device=device,
                record_tape=False,
            )
            wp.launch(
                variant.combine_rows,
                dim=(n_in, n_out),
                inputs=[partial_base, partial_scaler, int(use_base)],
                outputs=[d_base_weight_t, d_scaler_t],
                device=device,
                record_tape=False,
            )

        if d_coef is not None:
            rows, _, offsets = _bucket_entries(variant, ws, x, grid, n_buckets)
            wp.launch(
                variant.backward_coef,
                dim=n_in * n_coef * n_out,
                inputs=[dy, x, grid, scaler_t, bm, rows, offsets, n_buckets],
                outputs=[d_coef],
                device=device,
                record_tape=False,
            )


def _sort_entries(variant, ws, x, grid, n_buckets: int):
    """Sort the (n, i) entries by key i * n_buckets + bucket: returns (rows, sorted_keys), rows[e] being the
    row of the e-th entry in key order. A stable sort keeps rows ascending inside a bucket, so the grouping
    is the same on every run."""
    n_rows, n_in = x.shape
    n_keys = n_in * n_buckets
    n_entries = n_rows * n_in
    if n_keys >= 2**31 - 1 or n_entries >= 2**31:
        raise ValueError(f"too large for int32 bucketing: {n_entries} entries, {n_keys} buckets")
    keys = ws.get("keys", (2 * n_entries,), wp.int32)
    rows = ws.get("rows", (2 * n_entries,), wp.int32)
    wp.launch(variant.bucket_keys, dim=(n_in, n_rows), inputs=[x, grid, variant.basis_matrix, n_buckets],
              outputs=[keys, rows], device=x.device, record_tape=False)
    ws.sort_pairs(keys, rows, n_entries, max(1, int(n_keys - 1).bit_length()))
    return rows, keys


def _bucket_entries(variant, ws, x, grid, n_buckets: int):
    """:func:`_sort_entries` plus each key's extent: returns (rows, sorted_keys, offsets), the entries of key k
    being offsets[k] .. offsets[k + 1] - 1."""
    rows, keys = _sort_entries(variant, ws, x, grid, n_buckets)
    n_keys = x.shape[1] * n_buckets
    offsets = ws.get("offsets", (n_keys + 1,), wp.int32)
    wp.launch(variant.bucket_offsets, dim=n_keys + 1, inputs=[keys, x.shape[0] * x.shape[1]], outputs=[offsets],
              device=x.device, record_tape=False)
    return rows, keys, offsets
