"""UKAN kernels in pure Warp (no torch import): a B-spline on an unbounded uniform grid whose coefficients
come from a coefficient-generator MLP (CG-MLP), evaluated without ever materialising per-sample coefficients.

Maths (K = k + 1). For input x of feature i: ``s = x / h``, cell ``c = floor(s)``, group ``g = floor(c / K)``,
offset ``r = c - g K`` (in [0, K) for negative x too), local coordinate ``u = s - c``. The CG-MLP maps
(feature i, group g) to ``C_g`` [K, out]; the K coefficients of the cell are the window
``[C_{g-1}; C_g][r : r + K]`` and ``spline_io(x) = [1 u .. u^k] M_k window`` (``M_k`` from
:func:`warpkan.kernels.bspline.uniform_basis_matrix`).

Table layout. The table is ``[P, K, out]``, read as the 2-D array ``[P * K, out]``: the K coefficient rows of
``C_{g-1}`` and ``C_g`` are adjacent, so the window of an element is the K consecutive rows starting at
``window = (slot - 1) K + r`` and consecutive threads read consecutive outputs (coalesced). (The torch layer
gets this order straight from the CG-MLP by permuting its output rows; its public ``[P, out, K]`` view is
unchanged.)

Unbounded inputs. ``s`` is formed in float64 whatever the I/O dtype and clamped to ``[-CELL_LIMIT,
CELL_LIMIT]`` (2^39 cells) before the integer conversion, so group indices never overflow and ``u`` keeps
full precision at |x| = 1e6. Inputs past the limit (|x| > 2^39 h, and +-Inf) are evaluated at the limit and
have zero spline derivative. NaN inputs get a zero spline term.

Two paths compute the same map.

**Dense range** (``range_*`` kernels; taken by the torch layer while every feature's touched groups lie in a short
contiguous run). Per feature i, the lowest touched group ``lo_i`` and its span (groups from lowest to highest) are
found without a read-back by integer min and max (order-independent, so deterministic): for a small batch in one
launch, a block a feature; else by atomics over chunks of rows. R is the widest span over the features (read back by
the exact table, fixed by ``table_groups`` otherwise). The table then holds, for every feature, the Rt = R + 1
groups ``lo_i - 1 .. lo_i + R - 1``: a B-spline on that piece of the unbounded grid with W = Rt K coefficient slots,
of which the last is reached by no window (the highest window starts at (R - 1) K + K - 1 and ends at Rt K - 2) and
holds the SiLU base instead. Like KANLinear's gemm strategy, the bases of a chunk of rows are written as a
transposed dense basis ``[in W, rows]`` by coalesced stores (zeros included, no fill) and contracted with cuBLAS; dx
folds the basis gradient back per element, and one kernel splits the combined weight's gradient into d table, d
scaler and d base weight in a fixed order. The cell is located in float64 relative to ``lo_i``, so |x| = 1e6 keeps
full precision here too. The CG-MLP of the range (its rows are (feature i, group lo_i - 1 + j)) runs as one fused
tile generator (``generator_*`` below: input rows, hidden layer and table rows a block in shared memory by
``wp.tile_matmul``; the backward as per-block partials and a fixed-order combine), or, where its tiles would not fit
or :data:`CG_GENERATOR` says "simt", on the SIMT kernels (``range_*``).

**Sparse pairs** (below; any span, cost independent of it). The pipeline has no host read-back: every size is a function of the shapes, so it runs under CUDA-graph
capture and ``torch.compile`` with static shapes.

1. **Touched pairs.** Key every element (n, i) by (i, g) in an int64 (``i * 2^41 + g + 2^40``; NaN gets a
   sentinel past every feature), stable radix sort, mark the first element of each distinct key, and give it
   one table row, plus one for (i, g - 1) when that group is not itself touched. An inclusive scan gives
   every element its table row; the rows are sorted by (feature, group), so the row of ``C_{g-1}`` is always
   ``slot - 1``. The table has a fixed **capacity** of rows chosen by the caller; rows past the number
   needed are padding (feature 0, group 0, no elements), and elements whose row falls past the capacity are
   treated like NaN (zero spline term). The number of rows needed is written to a one-element device array.
   The pass also records, per element, its window start and local coordinate (``window``, ``local_u``), so
   the spline kernels never locate the cell again (no float64 there).
2. **CG-MLP** on the table rows: ``table [capacity, K, out]``. The torch bridge runs it with torch (a dense
   GEMM); the Warp-native layer uses the fused tile generator at the bottom of this file (or the SIMT dense
   kernels, see :data:`CG_GENERATOR`).
3./4. **The spline and its gradients** run on the edge engine's per-thread kernels, with the shared-table UKAN
   family (:func:`warpkan.kernels.edge.ukan_family.ukan_table_family`): its ``locate`` reads each element's
   window and local coordinate from the pair pass, and the one table ``[capacity K, out]`` is the engine's
   coefficient table of every input (a zero input stride; :func:`shared_table`). The backward is the engine's
   atomic-free one (every gradient bitwise reproducible, no separate non-deterministic mode): dx one warp per
   row, d base weight / d scaler by row chunks and a fixed-order combine, and d table by a segmented reduction
   over the elements in the pair search's sorted order (grouped by table row, no second sort).
"""

import functools
import math
from dataclasses import dataclass

import warp as wp

from ._common import SCALARS, first_at_least, on_stream, scalar_name
from ._dependent_launch import as_dependents, start_as_dependent
from ._modules import ModuleBuild, builds, tile_matmul_module
from .. import _checks
from .edge.bspline_family import MAX_SPLINE_ORDER
from .edge.ukan_family import CELL_LIMIT, ukan_locate_func, ukan_table_family, ukan_table_frame_of, window_codec
from .edge.family import silu_func
from .edge import launch as edge_launch
from .edge.launch import row_chunks

__all__ = [
    "check_layer_args",
    "CELL_LIMIT",
    "UKANVariant",
    "PairBuffers",
    "get_variant",
    "get_dense_variant",
    "ukan_modules",
    "pair_scratch",
    "table_capacity",
    "launch_pairs",
    "WarpPrimitives",
    "launch_forward",
    "launch_backward",
    "launch_features",
    "launch_dense_forward",
    "launch_dense_backward",
    "launch_embedding_backward",
    "PE_BASE",
    "shared_table",
    "table_frame",
    "launch_group_range",
    "range_search_scratch",
    "launch_range_mlp_forward",
    "launch_range_mlp_backward",
    "range_mlp_partial_shape",
    "CG_GENERATOR",
    "use_tile_generator",
    "generator_widths",
    "generator_shared_bytes",
    "generator_partial_shapes",
    "hidden_parts_in_table",
    "hidden_tile_width",
    "kept_row_width",
    "launch_generator_forward",
    "launch_generator_backward",
    "launch_pair_generator_forward",
    "launch_pair_generator_backward",
]

_GROUP_BIAS = 2**40  # g + bias > 0 for every clamped g (and g - 1)
_FEATURE_STRIDE = 2**41  # key = i * stride + g + bias
PE_BASE = 10000.0  # sinusoidal encoding frequencies: PE_BASE^(-2j / pe_dim)
_MIN_CAPACITY = 1024  # table rows always available (when 2 N in allows), whatever the feature count


def check_layer_args(in_features, out_features, spline_order, grid_delta, pe_dim, embed_dim, hidden_dim,
                     table_groups) -> tuple:
    """The arguments of a UKAN layer (the torch and the Warp-native one), checked and normalised:
    ``(in_features, out_features, spline_order, grid_delta, pe_dim, embed_dim, hidden_dim, table_groups)``.
    Raises TypeError/ValueError naming the argument (rules: :mod:`warpkan._checks`), before anything is
    allocated."""
    in_features = _checks.positive_int("in_features", in_features)
    out_features = _checks.positive_int("out_features", out_features)
    spline_order = _checks.int_in_range("spline_order", spline_order, 1, MAX_SPLINE_ORDER)
    grid_delta = _checks.positive_number("grid_delta", grid_delta)
    pe_dim = _checks.non_negative_int("pe_dim", pe_dim)
    if pe_dim % 2:
        raise ValueError(f"pe_dim must be a non-negative even int (sin, cos pairs), got {pe_dim}")
    embed_dim = _checks.non_negative_int("embed_dim", embed_dim)
    if pe_dim + embed_dim == 0:
        raise ValueError("pe_dim + embed_dim must be positive: the CG-MLP needs an input, got 0 and 0")
    hidden_dim = _checks.positive_int("hidden_dim", hidden_dim)
    if table_groups is not None:
        table_groups = _checks.positive_int("table_groups", table_groups)
    sizes = dict(in_features=in_features, out_features=out_features, spline_order=spline_order, pe_dim=pe_dim,
                 embed_dim=embed_dim, hidden_dim=hidden_dim)
    _checks.fits_index("base_weight", (out_features, in_features), **sizes)
    _checks.fits_index("feature_embedding", (in_features, embed_dim), **sizes)
    _checks.fits_index("cg_hidden.weight", (hidden_dim, pe_dim + embed_dim), **sizes)
    _checks.fits_index("cg_out.weight", (out_features * (spline_order + 1), hidden_dim), **sizes)
    return in_features, out_features, spline_order, grid_delta, pe_dim, embed_dim, hidden_dim, table_groups




@wp.func
def encoding_frequency(a: int, pe_dim: int) -> wp.float64:
    """The frequency of entry a of the sinusoidal encoding, f_j = PE_BASE^(-2j / pe_dim) with j = a // 2, in
    float64: a power, which costs several times the sine that uses it, so a block of rows computes it once a
    column (:func:`encoding_at`)."""
    j = a // 2
    return wp.pow(wp.float64(PE_BASE), -wp.float64(2 * j) / wp.float64(pe_dim))


@wp.func
def encoding_at(g: wp.int64, a: int, frequency: wp.float64) -> wp.float64:
    """Entry a of the sinusoidal encoding of group g at its frequency (:func:`encoding_frequency`): sin(g f_j)
    for even a, cos(g f_j) for odd a; the phase in float64, so |g| ~ 1e7 keeps its precision."""
    phase = wp.float64(g) * frequency
    if a % 2 == 1:
        return wp.cos(phase)
    return wp.sin(phase)


_TWO_PI = 2.0 * math.pi


@wp.func
def encoding_at_single(g: wp.int64, a: int, frequency: wp.float64) -> wp.float32:
    """:func:`encoding_at` for a float32 (or narrower) table: the phase formed in float64 and reduced there to
    [-pi, pi] (so |g| ~ 1e7 keeps its precision), the sine or cosine of the reduced phase in float32. The float64
    sine and cosine carry a slow path for large arguments whose registers every generator kernel then reserves
    (222 a thread in the forward: two blocks an SM). The result is within 2.4e-7 of the float64 one: half a
    float32 ulp of the reduced phase (1.2e-7 at |phase| near pi) and CUDA's 2-ulp float32 sine (1.2e-7); 1.5e-7
    measured over |g| up to 1e7 with a correctly rounded sine. Rounding the float64 sine to float32 costs up to
    6e-8 by itself: an input row's entries move by a few float32 ulps of 1."""
    phase = wp.float64(g) * frequency
    reduced = wp.float32(phase - wp.floor(phase / wp.float64(_TWO_PI) + wp.float64(0.5)) * wp.float64(_TWO_PI))
    if a % 2 == 1:
        return wp.cos(reduced)
    return wp.sin(reduced)


@wp.func
def group_encoding(g: wp.int64, a: int, pe_dim: int) -> wp.float64:
    """Entry a of the sinusoidal encoding of group g (:func:`encoding_at` at :func:`encoding_frequency`)."""
    return encoding_at(g, a, encoding_frequency(a, pe_dim))


@wp.func
def output_row(c: int, n_cols: int, table_k: int) -> int:
    """The CG-MLP output layer's row (w_out, b_out) behind column c of a table of ``n_cols`` columns.

    The layer's rows are output-major, (o, m) = o K + m, as ``UKANLinear.cg_out`` holds them; the spline
    kernels read the table coefficient-major, (m, o) = m out + o, with K = ``table_k``. The CG-MLP kernels
    take w_out's rows in that order where they read them, so that neither the layer nor the table is
    reordered by a copy. ``table_k`` = 1: the same order. Columns past the table (a tile's padding, never
    stored) read row 0."""
    if c >= n_cols:
        return 0
    n_out = n_cols // table_k
    m = c // n_out
    return (c - m * n_out) * table_k + m


@dataclass(frozen=True)
class UKANVariant:
    order: int
    scalar: type
    pair_keys: wp.Kernel
    pair_mark: wp.Kernel
    pair_fill: wp.Kernel
    range_block: wp.Kernel
    range_init: wp.Kernel
    range_partial: wp.Kernel
    range_finalize: wp.Kernel
    module: str


# ---------------------------------------------------------------------- kernel factories
# get_variant assembles a UKANVariant from the factories below, each cached on get_variant's arguments (spline
# order, scalar type), so that a combination builds each @wp.func and kernel once. Each factory closes over the
# types and constants of _config under the names its @wp.funcs and kernels use: Warp resolves those names
# when it generates code, and the names and values are part of the module's hash.

_NO_GROUP = 2**62  # above every clamped group: "no valid input yet" in the range search
_SPAN_CAP = 2**30  # the widest span the range search reports
_RANGE_BLOCK_BATCH = 4  # rows a lane of the one-launch range search loads before it locates them


@dataclass(frozen=True, eq=False)
class _Config:
    """The types and constants of one (spline order, scalar type), and the Warp module of its kernels."""

    scalar: type
    K: int  # coefficients of a cell, order + 1
    zero: object
    module: str


@functools.lru_cache(maxsize=None)
def _config(order: int, scalar_name: str) -> _Config:
    """The arguments of get_variant checked (ValueError/TypeError naming the bad one), and what follows from
    them."""
    if not 1 <= order <= MAX_SPLINE_ORDER:
        raise ValueError(f"spline_order must be in [1, {MAX_SPLINE_ORDER}], got {order}")
    if scalar_name not in SCALARS:
        raise TypeError(f"scalar type must be one of {sorted(SCALARS)}, got {scalar_name}")
    scalar = SCALARS[scalar_name]
    K = order + 1
    return _Config(
        scalar=scalar,
        K=K,
        zero=scalar(0.0),
        module=f"warpkan_ukan_k{order}_{scalar_name}",
    )


def _kernel_decorator(module: str, **options):
    """``wp.kernel`` without a backward pass, into the Warp module named ``module`` (``options``: more of
    ``wp.kernel``'s keywords)."""
    return functools.partial(wp.kernel, enable_backward=False, module=module, **options)


# ---------------------------------------------------------------------- 1. touched (feature, group) pairs

@functools.lru_cache(maxsize=None)
def _pair_keys_kernel(order: int, scalar_name: str):
    """Every element's (feature, group) key for the sort, its window offset and its local coordinate."""
    cfg = _config(order, scalar_name)
    scalar = cfg.scalar
    kernel = _kernel_decorator(cfg.module)
    locate = ukan_locate_func(order, scalar_name)  # (x, h) -> (valid, g, r, u, sloped): the edge family's
    encode_window = window_codec()[0]
    stride = wp.int64(_FEATURE_STRIDE)
    bias = wp.int64(_GROUP_BIAS)

    @kernel
    def pair_keys(
        x: wp.array2d(dtype=scalar),
        h: wp.float64,
        keys: wp.array(dtype=wp.int64),
        elems: wp.array(dtype=wp.int32),
        window: wp.array2d(dtype=wp.int32),
        local_u: wp.array2d(dtype=scalar),
    ):
        # element e = i * N + n, so the stable sort orders equal keys by row index; window holds the offset
        # r (encoded with the slope flag) until pair_fill knows the row
        i, n = wp.tid()
        e = i * x.shape[0] + n
        valid, g, r, u, sloped = locate(x[n, i], h)
        key = wp.int64(x.shape[1]) * stride  # NaN: sorts after every feature, gets no table row
        if valid:
            key = wp.int64(i) * stride + g + bias
            window[n, i] = encode_window(r, sloped)
        else:
            window[n, i] = -1
        local_u[n, i] = u
        keys[e] = key
        elems[e] = e

    return pair_keys


@functools.lru_cache(maxsize=None)
def _pair_mark_kernel(order: int, scalar_name: str):
    """The table rows the first element of each distinct sorted key takes."""
    kernel = _kernel_decorator(_config(order, scalar_name).module)

    @kernel
    def pair_mark(keys: wp.array(dtype=wp.int64), sentinel: wp.int64, rows_needed: wp.array(dtype=wp.int32)):
        # the first element of each distinct key takes one row, two when (i, g - 1) is not itself touched
        j = wp.tid()
        key = keys[j]
        need = int(0)
        if key < sentinel:
            if j == 0:
                need = 2
            else:
                before = keys[j - 1]
                if before != key:
                    need = 1
                    if before != key - wp.int64(1):
                        need = 2
        rows_needed[j] = need

    return pair_mark


@functools.lru_cache(maxsize=None)
def _pair_fill_kernel(order: int, scalar_name: str):
    """The table rows' (feature, group), the elements in sorted order, and every element's final window code."""
    cfg = _config(order, scalar_name)
    K = cfg.K
    kernel = _kernel_decorator(cfg.module)
    encode_window, decode_window = window_codec()
    stride = wp.int64(_FEATURE_STRIDE)
    bias = wp.int64(_GROUP_BIAS)

    @kernel
    def pair_fill(
        keys: wp.array(dtype=wp.int64),
        elems: wp.array(dtype=wp.int32),
        rows_needed: wp.array(dtype=wp.int32),
        row_end: wp.array(dtype=wp.int32),
        sentinel: wp.int64,
        n_rows: int,
        sorted_elem: wp.array(dtype=wp.int32),
        window: wp.array2d(dtype=wp.int32),
        pair_feature: wp.array(dtype=wp.int32),
        pair_group: wp.array(dtype=wp.int64),
        rows_total: wp.array(dtype=wp.int32),
    ):
        j = wp.tid()
        key = keys[j]
        e = elems[j]
        sorted_elem[j] = e
        i = e // n_rows
        n = e - i * n_rows
        if j == keys.shape[0] - 1:
            rows_total[0] = row_end[j]
        if key >= sentinel:
            return
        capacity = pair_feature.shape[0]
        row = row_end[j] - 1
        valid, r, sloped = decode_window(window[n, i])
        if row < capacity:
            window[n, i] = encode_window((row - 1) * K + r, sloped)
        else:
            window[n, i] = -1  # past the capacity: no spline term
        need = rows_needed[j]
        if need == 2 and row - 1 < capacity:
            g_prev = key - wp.int64(i) * stride - bias - wp.int64(1)
            pair_feature[row - 1] = i
            pair_group[row - 1] = g_prev
        if row >= capacity:
            return
        if need > 0:
            pair_feature[row] = i
            pair_group[row] = key - wp.int64(i) * stride - bias

    return pair_fill


# ---------------------------------------------------------------------- dense-range path (see module doc)

@functools.lru_cache(maxsize=None)
def _store_range_func():
    """Where a feature's search ends: its lowest touched group and its span of groups from that one to its
    highest (capped; a feature without valid input gets group 0 and span 1)."""
    span_cap = wp.int64(_SPAN_CAP)

    @wp.func
    def store_range(group_lo: wp.array(dtype=wp.int64), span: wp.array(dtype=wp.int32), i: int, lo: wp.int64,
                    hi: wp.int64):
        if lo > hi:
            lo = wp.int64(0)
            hi = wp.int64(0)
        group_lo[i] = lo
        span[i] = int(wp.min(hi - lo + wp.int64(1), span_cap))

    return store_range


@functools.lru_cache(maxsize=None)
def _range_block_kernel(order: int, scalar_name: str):
    """A small batch's search in one launch: a block a feature, its threads over the rows, a block-wide
    min/max."""
    cfg = _config(order, scalar_name)
    scalar = cfg.scalar
    kernel = _kernel_decorator(cfg.module)
    locate = ukan_locate_func(order, scalar_name)
    store_range = _store_range_func()
    no_group = wp.int64(_NO_GROUP)

    values = wp.types.vector(_RANGE_BLOCK_BATCH, scalar)

    @kernel
    def range_block(x: wp.array2d(dtype=scalar), h: wp.float64, group_lo: wp.array(dtype=wp.int64),
                    span: wp.array(dtype=wp.int32)):
        # strided loads (a thread a row of one feature): at the batches this takes (_RANGE_BLOCK_MAX_ROWS) x is a
        # few hundred KB at most, served from L2, and a block a feature needs neither atomics nor a reset. A lane
        # issues a batch of loads before it locates any: one latency a batch, not one a row. Past the last row a
        # load reads the last row again, which leaves a min and a max as they are.
        i, lane = wp.tid()
        start_as_dependent()
        lanes = wp.block_dim()
        last = x.shape[0] - 1
        lo = no_group
        hi = -no_group
        for first in range(lane, x.shape[0], lanes * _RANGE_BLOCK_BATCH):
            batch = values()
            for k in range(wp.static(_RANGE_BLOCK_BATCH)):
                batch[k] = x[wp.min(first + k * lanes, last), i]
            for k in range(wp.static(_RANGE_BLOCK_BATCH)):
                valid, g, r, u, sloped = locate(batch[k], h)
                if valid:
                    lo = wp.min(lo, g)
                    hi = wp.max(hi, g)
        lowest = wp.tile_min(wp.tile(lo))
        highest = wp.tile_max(wp.tile(hi))
        if lane == 0:
            store_range(group_lo, span, i, lowest[0], highest[0])

    return range_block


@functools.lru_cache(maxsize=None)
def _range_init_kernel(order: int, scalar_name: str):
    """The chunked search's starting values."""
    kernel = _kernel_decorator(_config(order, scalar_name).module)
    no_group = wp.int64(_NO_GROUP)

    @kernel
    def range_init(group_lo: wp.array(dtype=wp.int64), group_hi: wp.array(dtype=wp.int64)):
        i = wp.tid()
        start_as_dependent()
        group_lo[i] = no_group
        group_hi[i] = -no_group

    return range_init


@functools.lru_cache(maxsize=None)
def _range_partial_kernel(order: int, scalar_name: str):
    """Each feature's lowest and highest touched group, by integer min/max atomics over chunks of rows."""
    cfg = _config(order, scalar_name)
    scalar = cfg.scalar
    kernel = _kernel_decorator(cfg.module)
    locate = ukan_locate_func(order, scalar_name)
    no_group = wp.int64(_NO_GROUP)

    @kernel
    def range_partial(
        x: wp.array2d(dtype=scalar),
        h: wp.float64,
        rows_per_chunk: int,
        group_lo: wp.array(dtype=wp.int64),
        group_hi: wp.array(dtype=wp.int64),
    ):
        # consecutive threads on consecutive features of one row chunk (coalesced x); integer min/max
        # atomics commute, so the result does not depend on their order
        # launched as a dependent of range_init, it scans x while range_init runs: x was written before
        # range_init started (range_init waited for its own predecessor before it let this kernel in), and
        # only the atomics touch what range_init writes
        tid = wp.tid()
        n_in = x.shape[1]
        chunk = tid // n_in
        i = tid - chunk * n_in
        start = chunk * rows_per_chunk
        stop = wp.min(start + rows_per_chunk, x.shape[0])
        lo = no_group
        hi = -no_group
        for n in range(start, stop):
            valid, g, r, u, sloped = locate(x[n, i], h)
            if valid:
                lo = wp.min(lo, g)
                hi = wp.max(hi, g)
        start_as_dependent()
        if lo <= hi:
            wp.atomic_min(group_lo, i, lo)
            wp.atomic_max(group_hi, i, hi)

    return range_partial


@functools.lru_cache(maxsize=None)
def _range_finalize_kernel(order: int, scalar_name: str):
    """Each feature's lowest group and span from the chunks' min/max."""
    kernel = _kernel_decorator(_config(order, scalar_name).module)
    store_range = _store_range_func()

    @kernel
    def range_finalize(group_lo: wp.array(dtype=wp.int64), group_hi: wp.array(dtype=wp.int64),
                       span: wp.array(dtype=wp.int32)):
        i = wp.tid()
        start_as_dependent()
        store_range(group_lo, span, i, group_lo[i], group_hi[i])

    return range_finalize


@functools.lru_cache(maxsize=None)
def get_variant(order: int, scalar_name: str = "float32") -> UKANVariant:
    """Build (lazily) the kernels of one (spline order, scalar type); they share one Warp module."""
    cfg = _config(order, scalar_name)
    combination = (order, scalar_name)
    return UKANVariant(
        order=order,
        scalar=cfg.scalar,
        pair_keys=_pair_keys_kernel(*combination),
        pair_mark=_pair_mark_kernel(*combination),
        pair_fill=_pair_fill_kernel(*combination),
        range_block=_range_block_kernel(*combination),
        range_init=_range_init_kernel(*combination),
        range_partial=_range_partial_kernel(*combination),
        range_finalize=_range_finalize_kernel(*combination),
        module=cfg.module,
    )




def ukan_modules(order: int, scalar_name: str = "float32", mlp_sizes: tuple = (16, 8, 32), is_cuda: bool = True
                 ) -> tuple:
    """The modules (:class:`ModuleBuild`) of a UKAN layer's own kernels of one (order, scalar type): the pair
    search and group-range kernels and the CG-MLP's (the default block size), and the fused tile generator's of
    the CG-MLP ``mlp_sizes`` (pe_dim, embed_dim, hidden_dim; UKANLinear's defaults) for both row maps, where the
    generator takes those sizes. Its spline runs the edge engine's UKAN families (:mod:`.edge.registry`:
    ``ukan``, ``ukan_pairs``, ``ukan_table``). ``is_cuda``: the generator's combine is laid out per device
    kind (:func:`_combine_layout`)."""
    found = [ModuleBuild(get_variant(order, scalar_name).module), *builds([get_dense_variant(scalar_name).features])]
    widths = generator_widths(8 if scalar_name == "float64" else 4, *mlp_sizes)
    if CG_GENERATOR == "tile" and widths is not None:
        for rows in ("range", "pairs"):
            found += builds([_generator_forward_kernel(scalar_name, widths, rows),
                             *_generator_backward_kernels(scalar_name, widths, rows)], _GENERATOR_BLOCK_DIM)
        layout = _combine_layout(is_cuda)
        found += builds([_generator_combine_kernel(scalar_name, layout)], layout[0] * layout[1])
    return tuple(found)


def _check_h(grid_delta) -> float:
    return _checks.positive_number("grid_delta", grid_delta)





# ---------------------------------------------------------------------- 1. pairs
@dataclass
class PairBuffers:
    """Where the touched-pair search leaves its results. Every size is a function of the shapes and the
    capacity; the pair arrays must be zeroed by the caller (padding rows: feature 0, group 0, no elements)."""

    sorted_elem: wp.array  # [N * in] int32: elements e = i * N + n in (feature, group, n) order (NaN last)
    window: wp.array  # [N, in] int32: first table row ([P * K, out] view) of the element's window, coded
    local_u: wp.array  # [N, in] scalar: local coordinate u in [0, 1)
    pair_feature: wp.array  # [capacity] int32
    pair_group: wp.array  # [capacity] int64
    rows_needed: wp.array  # [1] int32: table rows the data needed (more than capacity: some were dropped)


def table_capacity(n_rows: int, n_in: int, table_groups: int) -> int:
    """Table rows allocated for a batch of n_rows x n_in: ``table_groups`` per feature on average (shared by
    all features), at least 1024, and never more than 2 N in (each touched pair takes at most two rows).
    A function of the shapes alone: no read-back, the same size on every call of one shape."""
    return min(2 * n_rows * n_in, max(n_in * table_groups, _MIN_CAPACITY))


def pair_scratch(n_entries: int) -> dict:
    """Scratch arrays of :func:`launch_pairs` as name -> (shape, Warp dtype); the sort needs 2x room."""
    return {
        "keys": ((2 * n_entries,), wp.int64),
        "elems": ((2 * n_entries,), wp.int32),
        "rows_needed": ((n_entries,), wp.int32),
        "row_end": ((n_entries,), wp.int32),
    }


class WarpPrimitives:
    """The two device-wide primitives of the pair search, from ``wp.utils``. A host framework can pass its
    own (the torch bridge sorts and scans with torch, which stays legal under CUDA-graph capture of torch's
    stream; ``wp.utils``' are not, on a foreign stream)."""

    def sort_pairs(self, keys: wp.array, values: wp.array, count: int, key_bits: int) -> None:
        """Stable sort of keys[:count] with values[:count]; both arrays hold 2 * count entries."""
        wp.utils.radix_sort_pairs(keys, values, count, end_bit=key_bits)

    def inclusive_scan(self, values: wp.array, out: wp.array) -> None:
        wp.utils.array_scan(values, out, inclusive=True)


def launch_pairs(x, grid_delta, order, scratch: dict, out: PairBuffers, stream=None, primitives=None) -> None:
    """Find the distinct (feature, group) pairs that x [N, in] touches, plus the (feature, group - 1) pairs
    their windows reach back into, sorted by (feature, group), into ``out`` (pair arrays zeroed by the
    caller). ``scratch`` holds the arrays named by :func:`pair_scratch`; ``primitives`` sorts and scans
    (default :class:`WarpPrimitives`). No host synchronisation."""
    h = _check_h(grid_delta)
    variant = get_variant(order, scalar_name(x))
    n_rows, n_in = x.shape
    n_entries = n_rows * n_in
    if n_entries >= 2**31 or n_in >= 2**21:
        raise ValueError(f"too large for the int32 pair search: {n_rows} rows x {n_in} features")
    if out.pair_feature.shape[0] * (order + 1) >= 2**31:
        raise ValueError(f"table capacity {out.pair_feature.shape[0]} too large for int32 windows")
    device = x.device
    sentinel = wp.int64(n_in * _FEATURE_STRIDE)
    if n_entries == 0:
        return
    with on_stream(stream):
        keys, elems = scratch["keys"], scratch["elems"]
        rows_needed, row_end = scratch["rows_needed"], scratch["row_end"]
        wp.launch(variant.pair_keys, dim=(n_in, n_rows), inputs=[x, h],
                  outputs=[keys, elems, out.window, out.local_u], device=device, record_tape=False)
        end_bit = int(n_in * _FEATURE_STRIDE).bit_length()
        primitives = primitives or WarpPrimitives()
        primitives.sort_pairs(keys, elems, n_entries, end_bit)
        sorted_keys = keys[:n_entries]
        wp.launch(variant.pair_mark, dim=n_entries, inputs=[sorted_keys, sentinel], outputs=[rows_needed],
                  device=device, record_tape=False)
        primitives.inclusive_scan(rows_needed, row_end)
        wp.launch(
            variant.pair_fill,
            dim=n_entries,
            inputs=[sorted_keys, elems[:n_entries], rows_needed, row_end, sentinel, n_rows],
            outputs=[out.sorted_elem, out.window, out.pair_feature, out.pair_group, out.rows_needed],
            device=device,
            record_tape=False,
        )


# ---------------------------------------------------------------------- 3./4. the spline, on the edge engine
def shared_table(table: wp.array, n_in: int) -> wp.array:
    """table [P K, out] as the engine's coefficients [in, P K, out] of a shared-table family: the one table
    seen by every input (a zero input stride; each input's windows reach only its own rows). A view: the
    caller keeps ``table`` alive."""
    return wp.array(ptr=table.ptr, dtype=table.dtype, shape=(n_in, table.shape[0], table.shape[1]),
                    strides=(0, table.strides[0], table.strides[1]), device=table.device, copy=False)


def table_frame(pairs: PairBuffers, grid_delta, order: int, scalar: str):
    """(family, frame) of the engine's view of the pair table: :func:`.edge.ukan_family.ukan_table_family`."""
    return (ukan_table_family(order, scalar),
            ukan_table_frame_of(pairs.window, pairs.local_u, pairs.pair_feature, _check_h(grid_delta), scalar))


def _check_spline_args(x, pairs, table, base_weight_t, scaler_t, order):
    n_rows, n_in = x.shape
    n_out = scaler_t.shape[1]
    K = order + 1
    capacity = pairs.pair_feature.shape[0]
    if table.ndim != 2 or tuple(table.shape) != (capacity * K, n_out):
        raise ValueError(f"table must have shape [{capacity} * {K}, {n_out}] (the pair capacity times {K}), got "
                         f"{tuple(table.shape)}")
    expected = {"window": (n_rows, n_in), "local_u": (n_rows, n_in), "base_weight_t": (n_in, n_out),
                "scaler_t": (n_in, n_out)}
    arrays = (("window", pairs.window), ("local_u", pairs.local_u), ("table", table),
              ("base_weight_t", base_weight_t), ("scaler_t", scaler_t))
    for name, arr in arrays:
        if name in expected and tuple(arr.shape) != expected[name]:
            raise ValueError(f"{name} must have shape {expected[name]}, got {tuple(arr.shape)}")
        if arr.device != x.device:
            raise ValueError(f"{name} must be on the device of x ({x.device}), got {arr.device}")
        want = wp.int32 if name == "window" else x.dtype
        if arr.dtype != want:
            raise TypeError(f"{name} must have dtype {wp.types.type_repr(want)}, got {wp.types.type_repr(arr.dtype)}")


def launch_forward(x, pairs: PairBuffers, table, base_weight_t, scaler_t, y, grid_delta, order, use_base=True,
                   stream=None):
    """y [N, out] = sum_i base_weight_t[i, o] silu(x) + scaler_t[i, o] spline_io(x), the spline reading each
    element's window (the pair search's) from ``table`` [P * K, out]: the edge engine's per-thread forward on the
    shared-table family. Overwrites y."""
    _check_spline_args(x, pairs, table, base_weight_t, scaler_t, order)
    family, frame = table_frame(pairs, grid_delta, order, scalar_name(x))
    edge_launch.launch_forward(family, frame, x, base_weight_t, scaler_t, shared_table(table, x.shape[1]), y,
                               use_base=use_base, stream=stream, tiled=False)


def launch_backward(dy, x, pairs: PairBuffers, table, base_weight_t, scaler_t, grid_delta, order, use_base=True,
                    dx=None, d_base_weight_t=None, d_scaler_t=None, d_table=None, stream=None, workspace=None):
    """Accumulate (+=) the gradients of :func:`launch_forward` into whichever of dx, d_base_weight_t,
    d_scaler_t (these two together) and d_table ([P * K, out]) are given: the engine's atomic-free backward
    (every gradient bitwise reproducible), taking the elements in the pair search's sorted order (no sort)."""
    _check_spline_args(x, pairs, table, base_weight_t, scaler_t, order)
    family, frame = table_frame(pairs, grid_delta, order, scalar_name(x))
    n_in = x.shape[1]
    edge_launch.launch_backward(family, frame, dy, x, base_weight_t, scaler_t, shared_table(table, n_in), use_base,
                                dx=dx, d_base_weight_t=d_base_weight_t, d_scaler_t=d_scaler_t,
                                d_coef=None if d_table is None else shared_table(d_table, n_in), deterministic=True,
                                stream=stream, workspace=workspace, tiled=False, entry_order=pairs.sorted_elem)


# ---------------------------------------------------------------------- dense-range path
_RANGE_THREADS = 1 << 17  # parallelism aimed at by the chunked group-range search
_MIN_RANGE_ROWS = 4  # rows a thread at least: a small batch still spreads over threads (latency-bound there)
# Batches of at most _RANGE_BLOCK_MAX_ROWS rows and _RANGE_BLOCK_MAX_FEATURES features take the one-launch search
# (a block a feature, _RANGE_BLOCK_DIM threads over its rows); others the chunked search's three launches
# (coalesced, spread over every SM). Graphed on an H200 with a torch kernel writing x before it (block against
# chunked, us): 4.7 / 5.8 at (128, 32), 6.0 / 6.9 at (1024, 32), 7.6 / 8.2 at (2048, 32), 9.1 / 11.5 at
# (2048, 256), 6.0 / 6.7 at (128, 512); a tie at (4096, 32); but 7.4 / 6.1 at (128, 784), whose 784 blocks are
# mostly idle lanes, and 96 / 32 at (65536, 32).
_RANGE_BLOCK_MAX_ROWS = 2048
_RANGE_BLOCK_MAX_FEATURES = 512
_RANGE_BLOCK_DIM = 256


def _launch(kernel, dim, inputs, device, stream, record):
    """One launch, or (record=True) its recorded command in a list, for a caller's launch cache."""
    if record:
        return [wp.launch(kernel, dim=dim, inputs=inputs, device=device, record_tape=False, record_cmd=True)]
    wp.launch(kernel, dim=dim, inputs=inputs, device=device, stream=stream, record_tape=False)
    return []


def _block_search(n_rows: int, n_in: int) -> bool:
    return n_rows <= _RANGE_BLOCK_MAX_ROWS and n_in <= _RANGE_BLOCK_MAX_FEATURES


def range_search_scratch(n_rows: int, n_in: int) -> int:
    """The length of the int64 scratch :func:`launch_group_range` takes at x [n_rows, n_in] (0: none)."""
    return 0 if _block_search(n_rows, n_in) else n_in


def launch_group_range(x, group_lo, span, group_hi, grid_delta, order, stream=None, record=False):
    """Per feature i, the lowest group its valid inputs touch (``group_lo[i]``, int64) and how many groups it
    spans from that one to its highest touched one (``span[i]``, int32, capped at 2^30; the table's rows a
    feature are the widest span + 1). NaN is ignored; a feature without valid input gets group 0 and span 1.
    ``group_hi`` is int64 scratch of :func:`range_search_scratch`'s length (None where that is 0). Nothing is
    read back. Every result is an integer min/max, the same whichever search runs."""
    h = _check_h(grid_delta)
    variant = get_variant(order, scalar_name(x))
    n_rows, n_in = x.shape
    device = x.device
    if n_in == 0:
        return []
    with on_stream(stream):
        if _block_search(n_rows, n_in):
            cmds = _launch_tiled(variant.range_block, [n_in], [x, h, group_lo, span], device, stream, record,
                                 block_dim=_RANGE_BLOCK_DIM)
        else:
            rows_per_chunk = max(_MIN_RANGE_ROWS, -(-n_rows * n_in // _RANGE_THREADS))
            n_chunks = -(-n_rows // rows_per_chunk)
            cmds = (_launch(variant.range_init, n_in, [group_lo, group_hi], device, stream, record)
                    + _launch(variant.range_partial, n_chunks * n_in, [x, h, rows_per_chunk, group_lo, group_hi],
                              device, stream, record)
                    + _launch(variant.range_finalize, n_in, [group_lo, group_hi, span], device, stream, record))
    return as_dependents(cmds)


# ---------------------------------------------------------------------- 2. CG-MLP in Warp (native layer)
@dataclass(frozen=True)
class DenseVariant:
    scalar: type
    features: wp.Kernel
    dense_forward: wp.Kernel
    dense_backward_input: wp.Kernel
    dense_backward_params: wp.Kernel
    dense_combine: wp.Kernel
    embedding_backward: wp.Kernel
    range_features: wp.Kernel
    range_param_partials: wp.Kernel
    range_param_combine: wp.Kernel


# get_dense_variant assembles a DenseVariant from the factories below, one per kernel, each cached on the
# scalar type. Like the spline kernels' factories, each closes over the names its kernel uses.

def _mlp_kernel_decorator(scalar_name: str):
    """``wp.kernel`` without a backward pass, into the CG-MLP's module of the scalar type."""
    return _kernel_decorator(f"warpkan_ukan_mlp_{scalar_name}")


@functools.lru_cache(maxsize=None)
def _mlp_silu_and_grad_func(scalar_name: str):
    """The CG-MLP kernels' silu_and_grad: the edge family's SiLU and its derivative, as a @wp.func of its own so
    that the code generated for the CG-MLP's module does not depend on which spline variants were built before
    it (Warp numbers the native functions of one name in the order it creates them)."""
    scalar = SCALARS[scalar_name]
    silu_and_grads = silu_func(scalar_name)

    @wp.func
    def silu_and_grad(x: scalar):
        act, dact, d2act = silu_and_grads(x)
        return act, dact

    return silu_and_grad


@functools.lru_cache(maxsize=None)
def _features_kernel(scalar_name: str):
    """The CG-MLP's input rows of the touched pairs: the encoding of the row's group, its feature's embedding."""
    scalar = SCALARS[scalar_name]
    kernel = _mlp_kernel_decorator(scalar_name)

    @kernel
    def features(
        pair_feature: wp.array(dtype=wp.int32),
        pair_group: wp.array(dtype=wp.int64),
        embedding: wp.array2d(dtype=scalar),
        pe_dim: int,
        out: wp.array2d(dtype=scalar),
    ):
        # row p = [sin(g f_0), cos(g f_0), .., sin(g f_{pe/2-1}), cos(..), embedding[i]]; phases in float64
        p, a = wp.tid()
        if a < pe_dim:
            out[p, a] = scalar(group_encoding(pair_group[p], a, pe_dim))
        else:
            out[p, a] = embedding[pair_feature[p], a - pe_dim]

    return features


@functools.lru_cache(maxsize=None)
def _dense_forward_kernel(scalar_name: str):
    """A dense layer, optionally followed by SiLU."""
    scalar = SCALARS[scalar_name]
    kernel = _mlp_kernel_decorator(scalar_name)
    silu_and_grad = _mlp_silu_and_grad_func(scalar_name)

    @kernel
    def dense_forward(
        inp: wp.array2d(dtype=scalar),
        weight: wp.array2d(dtype=scalar),
        bias: wp.array(dtype=scalar),
        apply_silu: int,
        table_k: int,
        pre: wp.array2d(dtype=scalar),
        out: wp.array2d(dtype=scalar),
    ):
        # pre[p, b] = bias[w] + sum_a inp[p, a] weight[w, a] with w = output_row(b); out = silu(pre) or pre
        p, b = wp.tid()
        w = output_row(b, out.shape[1], table_k)
        acc = bias[w]
        for a in range(inp.shape[1]):
            acc = acc + inp[p, a] * weight[w, a]
        pre[p, b] = acc
        if apply_silu:
            act, dact = silu_and_grad(acc)
            out[p, b] = act
        else:
            out[p, b] = acc

    return dense_forward


@functools.lru_cache(maxsize=None)
def _dense_backward_input_kernel(scalar_name: str):
    """A dense layer's input gradient, through the SiLU that made the input when there was one."""
    scalar = SCALARS[scalar_name]
    kernel = _mlp_kernel_decorator(scalar_name)
    zero = scalar(0.0)
    silu_and_grad = _mlp_silu_and_grad_func(scalar_name)

    @kernel
    def dense_backward_input(
        d_out: wp.array2d(dtype=scalar),
        weight: wp.array2d(dtype=scalar),
        pre_in: wp.array2d(dtype=scalar),
        silu_in: int,
        table_k: int,
        d_in: wp.array2d(dtype=scalar),
    ):
        # d_in[p, a] = (sum_b d_out[p, b] weight[output_row(b), a]) * silu'(pre_in[p, a]) when the input was a
        # SiLU output
        p, a = wp.tid()
        acc = zero
        n_cols = d_out.shape[1]
        for b in range(n_cols):
            acc = acc + d_out[p, b] * weight[output_row(b, n_cols, table_k), a]
        if silu_in:
            act, dact = silu_and_grad(pre_in[p, a])
            acc = acc * dact
        d_in[p, a] = acc

    return dense_backward_input


@functools.lru_cache(maxsize=None)
def _dense_backward_params_kernel(scalar_name: str):
    """A dense layer's weight and bias gradients, as partial sums over chunks of rows."""
    scalar = SCALARS[scalar_name]
    kernel = _mlp_kernel_decorator(scalar_name)
    zero = scalar(0.0)
    one = scalar(1.0)

    @kernel
    def dense_backward_params(
        d_out: wp.array2d(dtype=scalar),
        inp: wp.array2d(dtype=scalar),
        rows_per_chunk: int,
        partial: wp.array3d(dtype=scalar),
    ):
        # partial[chunk, b, a] = sum over the chunk's rows of d_out[p, b] inp[p, a]; column a = A is the bias
        chunk, b, a = wp.tid()
        start = chunk * rows_per_chunk
        stop = wp.min(start + rows_per_chunk, d_out.shape[0])
        acc = zero
        n_in = inp.shape[1]
        for p in range(start, stop):
            v = one
            if a < n_in:
                v = inp[p, a]
            acc = acc + d_out[p, b] * v
        partial[chunk, b, a] = acc

    return dense_backward_params


@functools.lru_cache(maxsize=None)
def _dense_combine_kernel(scalar_name: str):
    """The chunks' partial sums of dense_backward_params, added in a fixed order."""
    scalar = SCALARS[scalar_name]
    kernel = _mlp_kernel_decorator(scalar_name)
    zero = scalar(0.0)

    @kernel
    def dense_combine(partial: wp.array3d(dtype=scalar), table_k: int, d_weight: wp.array2d(dtype=scalar),
                      d_bias: wp.array(dtype=scalar)):
        b, a = wp.tid()
        acc = zero
        for chunk in range(partial.shape[0]):  # fixed order: deterministic
            acc = acc + partial[chunk, b, a]
        w = output_row(b, partial.shape[1], table_k)
        if a < d_weight.shape[1]:
            d_weight[w, a] = d_weight[w, a] + acc
        else:
            d_bias[w] = d_bias[w] + acc

    return dense_combine


@functools.lru_cache(maxsize=None)
def _embedding_backward_kernel(scalar_name: str):
    """The feature embedding's gradient: each feature's table rows summed in order."""
    scalar = SCALARS[scalar_name]
    kernel = _mlp_kernel_decorator(scalar_name)
    zero = scalar(0.0)

    @kernel
    def embedding_backward(
        d_features: wp.array2d(dtype=scalar),
        pair_feature: wp.array(dtype=wp.int32),
        rows_needed: wp.array(dtype=wp.int32),
        pe_dim: int,
        d_embedding: wp.array2d(dtype=scalar),
    ):
        # the rows in use of feature i are contiguous (sorted by feature; the padding rows after them are
        # not): sum them in order, no atomics
        i, e = wp.tid()
        used = wp.min(rows_needed[0], pair_feature.shape[0])
        start = first_at_least(pair_feature, used, i)
        stop = first_at_least(pair_feature, used, i + 1)
        acc = zero
        for p in range(start, stop):
            acc = acc + d_features[p, pe_dim + e]
        d_embedding[i, e] = d_embedding[i, e] + acc

    return embedding_backward


# ---- the CG-MLP on a dense range of groups (the torch layer's dense-range path): row p = i Rt + j is
# feature i at group group_lo[i] - 1 + j. Forward: range_features, then dense_forward for each layer.
# Backward: the forward's rows again (recomputed, not kept), dense_backward_input for d_pre, then
# range_param_partials / range_param_combine for every parameter gradient: fixed-order sums.

@functools.lru_cache(maxsize=None)
def _range_features_kernel(scalar_name: str):
    """The CG-MLP's input rows of the dense range."""
    scalar = SCALARS[scalar_name]
    kernel = _mlp_kernel_decorator(scalar_name)

    @kernel
    def range_features(
        group_lo: wp.array(dtype=wp.int64),
        rows_per_feature: int,
        embedding: wp.array2d(dtype=scalar),
        pe_dim: int,
        out: wp.array2d(dtype=scalar),
    ):
        # out[p] = [encoding of group group_lo[i] - 1 + j (pe_dim entries), embedding[i]]
        p, a = wp.tid()
        i = p // rows_per_feature
        if a < pe_dim:
            g = group_lo[i] - wp.int64(1) + wp.int64(p - i * rows_per_feature)
            out[p, a] = scalar(group_encoding(g, a, pe_dim))
        else:
            out[p, a] = embedding[i, a - pe_dim]

    return range_features


@functools.lru_cache(maxsize=None)
def _range_param_partials_kernel(scalar_name: str):
    """Every parameter gradient of the range CG-MLP, as partial sums over chunks of rows."""
    scalar = SCALARS[scalar_name]
    kernel = _mlp_kernel_decorator(scalar_name)
    zero = scalar(0.0)

    @kernel
    def range_param_partials(
        d_table: wp.array2d(dtype=scalar),
        hidden: wp.array2d(dtype=scalar),
        d_pre: wp.array2d(dtype=scalar),
        features: wp.array2d(dtype=scalar),
        rows_per_chunk: int,
        partial: wp.array2d(dtype=scalar),
    ):
        # partial[chunk, q] = the chunk's rows' share of flat gradient entry q, laid out as
        # [W_out (B x H) | b_out (B) | W_hidden (H x A) | b_hidden (H)]; consecutive q: consecutive columns
        # of one weight row (coalesced reads of hidden / d_pre, a broadcast of d_table / d_pre)
        chunk, q = wp.tid()
        n_b = d_table.shape[1]
        n_h = hidden.shape[1]
        n_a = features.shape[1]
        start = chunk * rows_per_chunk
        stop = wp.min(start + rows_per_chunk, d_table.shape[0])
        acc = zero
        if q < n_b * n_h:
            b = q // n_h
            h = q - b * n_h
            for p in range(start, stop):
                acc = acc + d_table[p, b] * hidden[p, h]
        elif q < n_b * n_h + n_b:
            b = q - n_b * n_h
            for p in range(start, stop):
                acc = acc + d_table[p, b]
        elif q < n_b * n_h + n_b + n_h * n_a:
            r = q - n_b * n_h - n_b
            h = r // n_a
            a = r - h * n_a
            for p in range(start, stop):
                acc = acc + d_pre[p, h] * features[p, a]
        else:
            h = q - n_b * n_h - n_b - n_h * n_a
            for p in range(start, stop):
                acc = acc + d_pre[p, h]
        partial[chunk, q] = acc

    return range_param_partials


@functools.lru_cache(maxsize=None)
def _range_param_combine_kernel(scalar_name: str):
    """The range CG-MLP's parameter gradients from the chunks' partials, and the embedding's gradient."""
    scalar = SCALARS[scalar_name]
    kernel = _mlp_kernel_decorator(scalar_name)
    zero = scalar(0.0)

    @kernel
    def range_param_combine(
        partial: wp.array2d(dtype=scalar),
        d_features: wp.array2d(dtype=scalar),
        rows_per_feature: int,
        pe_dim: int,
        table_k: int,
        d_w_out: wp.array2d(dtype=scalar),
        d_b_out: wp.array(dtype=scalar),
        d_w_hidden: wp.array2d(dtype=scalar),
        d_b_hidden: wp.array(dtype=scalar),
        d_embedding: wp.array2d(dtype=scalar),
    ):
        # flat entry q < partial.shape[1]: the sum of the chunks' partials in order, stored in its gradient;
        # past them, d_embedding[i, e]: the sum of the input-row gradient's column pe_dim + e over the rows
        # of feature i (every one of them carries the embedding)
        q = wp.tid()
        n_b = d_w_out.shape[0]
        n_h = d_w_out.shape[1]
        n_a = d_w_hidden.shape[1]
        acc = zero
        if q < partial.shape[1]:
            for chunk in range(partial.shape[0]):
                acc = acc + partial[chunk, q]
            if q < n_b * n_h:  # partial's entries in table column order: the layer's rows by output_row
                d_w_out[output_row(q // n_h, n_b, table_k), q - (q // n_h) * n_h] = acc
            elif q < n_b * n_h + n_b:
                d_b_out[output_row(q - n_b * n_h, n_b, table_k)] = acc
            elif q < n_b * n_h + n_b + n_h * n_a:
                r = q - n_b * n_h - n_b
                d_w_hidden[r // n_a, r - (r // n_a) * n_a] = acc
            else:
                d_b_hidden[q - n_b * n_h - n_b - n_h * n_a] = acc
        else:
            n_e = d_embedding.shape[1]
            r = q - partial.shape[1]
            i = r // n_e
            e = r - i * n_e
            for j in range(rows_per_feature):
                acc = acc + d_features[i * rows_per_feature + j, pe_dim + e]
            d_embedding[i, e] = acc

    return range_param_combine


@functools.lru_cache(maxsize=None)
def get_dense_variant(scalar_name: str = "float32") -> DenseVariant:
    """SIMT kernels of the small CG-MLP: feature rows, dense layers with optional SiLU, and their backward.
    The row counts are small (the touched pairs), so plain per-output threads suffice."""
    return DenseVariant(SCALARS[scalar_name], _features_kernel(scalar_name), _dense_forward_kernel(scalar_name),
                        _dense_backward_input_kernel(scalar_name), _dense_backward_params_kernel(scalar_name),
                        _dense_combine_kernel(scalar_name), _embedding_backward_kernel(scalar_name),
                        _range_features_kernel(scalar_name),
                        _range_param_partials_kernel(scalar_name), _range_param_combine_kernel(scalar_name))


def launch_features(pair_feature, pair_group, embedding, pe_dim, out, stream=None):
    variant = get_dense_variant(scalar_name(embedding, "embedding"))
    if out.shape[0] == 0:
        return
    wp.launch(variant.features, dim=tuple(out.shape), inputs=[pair_feature, pair_group, embedding, int(pe_dim)],
              outputs=[out], device=out.device, stream=stream, record_tape=False)


def launch_dense_forward(inp, weight, bias, apply_silu, pre, out, table_k=1, stream=None):
    """pre = inp weight^T + bias, out = silu(pre) or pre; ``table_k`` = K: out's columns are the layer's rows
    (o, m) taken in the spline table's (m, o) order (:func:`output_row`; 1: as they are)."""
    variant = get_dense_variant(scalar_name(inp, "inp"))
    if out.shape[0] == 0:
        return
    table_k = _check_table_k(out.shape[1], table_k)
    wp.launch(variant.dense_forward, dim=tuple(out.shape), inputs=[inp, weight, bias, int(apply_silu), table_k],
              outputs=[pre, out], device=out.device, stream=stream, record_tape=False)


def launch_dense_backward(d_out, inp, weight, d_weight, d_bias, d_in=None, pre_in=None, silu_in=False,
                          partials=None, table_k=1, stream=None):
    """Accumulate d_weight, d_bias (chunked partials + fixed-order combine); write d_in (not accumulated)
    when given, multiplied by silu'(pre_in) when ``silu_in``. ``table_k``: d_out's columns in the order
    :func:`launch_dense_forward` wrote them with it."""
    variant = get_dense_variant(scalar_name(inp, "inp"))
    device = inp.device
    n_rows, n_in = inp.shape
    n_out = d_out.shape[1]
    if n_rows == 0:
        return
    table_k = _check_table_k(n_out, table_k)
    with on_stream(stream):
        if d_in is not None:
            wp.launch(variant.dense_backward_input, dim=(n_rows, n_in),
                      inputs=[d_out, weight, pre_in if pre_in is not None else d_in, int(silu_in), table_k],
                      outputs=[d_in], device=device, record_tape=False)
        n_chunks, rows_per_chunk = row_chunks(n_rows, n_out, n_in + 1)
        shape = (n_chunks, n_out, n_in + 1)
        partial = partials("dense_partial", shape, variant.scalar) if partials else wp.empty(shape, dtype=variant.scalar, device=device)
        wp.launch(variant.dense_backward_params, dim=shape, inputs=[d_out, inp, rows_per_chunk], outputs=[partial],
                  device=device, record_tape=False)
        wp.launch(variant.dense_combine, dim=(n_out, n_in + 1), inputs=[partial, table_k],
                  outputs=[d_weight, d_bias],
                  device=device, record_tape=False)


def launch_embedding_backward(d_features, pair_feature, rows_needed, pe_dim, d_embedding, stream=None):
    variant = get_dense_variant(scalar_name(d_features, "d_features"))
    if d_embedding.shape[0] == 0 or d_embedding.shape[1] == 0:
        return
    wp.launch(variant.embedding_backward, dim=tuple(d_embedding.shape), inputs=[d_features, pair_feature, rows_needed, int(pe_dim)],
              outputs=[d_embedding], device=d_embedding.device, stream=stream, record_tape=False)



_RANGE_ROWS_PER_CHUNK = 64  # rows summed per partial of the range CG-MLP's parameter gradients


def range_mlp_partial_shape(n_rows: int, n_table_cols: int, hidden_dim: int, n_features: int) -> tuple[int, int]:
    """Shape of the ``partial`` scratch of :func:`launch_range_mlp_backward` (``n_features`` = pe_dim +
    embed_dim): a function of the shapes alone, so the summation order is the same on every run."""
    n_chunks = max(1, -(-n_rows // _RANGE_ROWS_PER_CHUNK))
    return n_chunks, n_table_cols * hidden_dim + n_table_cols + hidden_dim * n_features + hidden_dim


def _range_rows(variant, group_lo, embedding, w_hidden, b_hidden, features, pre, hidden, pe_dim, stream, record):
    """The range CG-MLP's input rows and its hidden layer (pre-activations and SiLU)."""
    rows = features.shape[0] // group_lo.shape[0]
    return (_launch(variant.range_features, tuple(features.shape), [group_lo, rows, embedding, int(pe_dim), features],
                    features.device, stream, record)
            + _launch(variant.dense_forward, tuple(pre.shape), [features, w_hidden, b_hidden, 1, 1, pre, hidden],
                      features.device, stream, record))


def launch_range_mlp_forward(group_lo, embedding, w_hidden, b_hidden, w_out, b_out, features, pre, hidden, table,
                             pe_dim, table_k=1, stream=None, record=False):
    """The CG-MLP on the dense range: table [in Rt, B] = w_out silu(w_hidden f + b_hidden) + b_out, where the
    input row f of row i Rt + j (``features`` [in Rt, pe_dim + E]) is (the encoding of group
    group_lo[i] - 1 + j, embedding[i]); the table's columns are w_out's rows in the order ``table_k`` gives
    (:func:`output_row`). Also writes the pre-activations and the hidden activations [in Rt, H].
    Three launches, none of them a torch op: at small N, the chain of torch ops this replaces cost as much
    host time per step as the whole spline."""
    variant = get_dense_variant(scalar_name(table, "table"))
    if table.shape[0] == 0 or table.shape[1] == 0:
        return []
    device = table.device
    return (_range_rows(variant, group_lo, embedding, w_hidden, b_hidden, features, pre, hidden, pe_dim, stream,
                        record)
            + _launch(variant.dense_forward, tuple(table.shape),
                      [hidden, w_out, b_out, 0, _check_table_k(table.shape[1], table_k), table, table],
                      device, stream, record))


def launch_range_mlp_backward(d_table, group_lo, embedding, w_hidden, b_hidden, w_out, features, pre, hidden, d_pre,
                              d_features, partial, d_w_out, d_b_out, d_w_hidden, d_b_hidden, d_embedding, pe_dim,
                              recompute=True, table_k=1, stream=None, record=False):
    """Every parameter gradient of :func:`launch_range_mlp_forward` from d_table [in Rt, B] (Rt >= 1),
    written, not accumulated, with fixed-order sums (deterministic). ``d_pre`` and ``partial``
    (:func:`range_mlp_partial_shape`) are scratch; ``features``, ``pre`` and ``hidden`` are the forward's
    (``recompute=False``) or scratch that the forward's launches fill again (``recompute=True``).
    ``d_features`` (the input rows' gradient, shaped as ``features``) is scratch too. ``table_k``: the
    forward's."""
    variant = get_dense_variant(scalar_name(d_table, "d_table"))
    if d_table.shape[0] == 0:
        return []
    rows = d_table.shape[0] // group_lo.shape[0]
    device = d_table.device
    partial_args = [d_table, hidden, d_pre, features, _RANGE_ROWS_PER_CHUNK, partial]
    table_k = _check_table_k(d_table.shape[1], table_k)
    combine_args = [partial, d_features, rows, int(pe_dim), table_k, d_w_out, d_b_out, d_w_hidden, d_b_hidden,
                    d_embedding]
    n_entries = partial.shape[1] + d_embedding.shape[0] * d_embedding.shape[1]
    cmds = []
    if recompute:
        cmds = _range_rows(variant, group_lo, embedding, w_hidden, b_hidden, features, pre, hidden, pe_dim, stream,
                           record)
    return (cmds
            + _launch(variant.dense_backward_input, tuple(d_pre.shape), [d_table, w_out, pre, 1, table_k, d_pre],
                      device, stream, record)
            + _launch(variant.range_param_partials, tuple(partial.shape), partial_args, device, stream, record)
            + _launch(variant.dense_backward_input, tuple(d_features.shape), [d_pre, w_hidden, d_pre, 0, 1, d_features],
                      device, stream, record)
            + _launch(variant.range_param_combine, (n_entries,), combine_args, device, stream, record))


# ---- the CG-MLP as one fused tile generator, on the dense range's rows (p = i Rt + j: feature i, group
# group_lo[i] - 1 + j) or on the touched pairs' (the Warp-native layer). A block takes GENERATOR_ROWS
# consecutive table rows: it forms their input rows in shared memory
# (the encoding, float64 phases, and the gathered embedding rows), the hidden layer by tile_matmul and SiLU,
# and the table rows by one tile_matmul per GENERATOR_COLS output columns, without a round trip of the
# input rows or the hidden layer through global memory. The backward forms the rows again, or reads them
# where the forward kept them (``kept``: one coalesced load in place of that chain of dependent tile operations,
# for a caller that holds the forward's buffers until the backward, as the eager range node does), and each block
# writes its share of every parameter gradient as tile_matmul partials (the bias sums too, as products with
# a row of ones: a fixed summation order); one SIMT kernel adds the blocks' partials in block order and the
# embedding rows in row order. No atomics: every gradient is bitwise reproducible.
#
# The input rows are kept as two tiles, the encoding [rows, PE_W] and the embedding [rows, E_W], against the
# two column ranges of w_hidden: tiles are padded to widths from GENERATOR_WIDTHS (zeros past the real width,
# which tile_load / tile_load_indexed supply past an array's extent and the encoding writes past pe_dim), so
# one compiled module serves every size up to the next width, and the encoding's padding columns meet
# embedding weights with a zero.

# the CG-MLP of the torch layer's dense range and of the Warp-native layer: "tile" (the fused generator) or
# "simt" (the per-output kernels), both kept until the GPU measurement (scripts/ukan_generator_timing.py)
CG_GENERATOR = "tile"
CG_GENERATORS = ("tile", "simt")
GENERATOR_ROW_MAPS = ("range", "pairs")  # table row -> (feature, group): the dense range, the touched pairs
GENERATOR_ROWS = 32  # table rows a block
GENERATOR_COLS = 32  # table columns a tile_matmul of the output layer
# Blocks a generator launch is cut into, at least, where the table has columns enough: a block's rows are one
# chain of small dependent products, so a launch of a few hundred blocks (a table of a few thousand rows) leaves
# most of the GPU idle unless the columns are split across blocks too (each forms its rows' hidden layer
# again). A constant, not the device's SM count: the split sets the backward's summation order, which is a
# function of the shapes alone.
GENERATOR_TARGET_BLOCKS = 512
GENERATOR_WIDTHS = (8, 16, 32, 64, 128)  # tile widths of pe_dim, embed_dim and hidden_dim
_GENERATOR_BLOCK_DIM = 128
# Blocks an SM the generator's kernels are compiled for (__launch_bounds__(128, 3): at most 170 registers a thread),
# where their shared memory lets that many share an SM; 0: the compiler's choice. Left to itself it gave the
# forward 222 registers, two blocks an SM, so a MNIST layer's 344 blocks ran in 1.3 waves on the H200: 28.6 us,
# 19.9 with three blocks an SM, 24.6 with four (128 registers, spilled), 31.0 with six (80). The backward kernels
# took 168 and 132 registers already (docs/perf-notes-engine.md).
GENERATOR_MIN_BLOCKS = 3
_SM_SHARED_BYTES = 228 * 1024  # shared memory of an SM on the H100 / H200
_COMBINE_BATCH = 8  # partials a combine lane loads before it adds them
_COMBINE_LANES = 8  # combine threads an entry
_COMBINE_ENTRIES = 32  # entries a combine block (LANES x ENTRIES threads)


_GENERATOR_SHARED_BUDGET = 112 * 1024  # bytes of shared memory a block: two blocks an SM on the H200 (228 KiB)
_GENERATOR_SHARED_SLACK = 1024  # the row-index tiles and alignment, over the tiles counted below


def generator_shared_bytes(scalar_bytes: int, widths: tuple) -> tuple[int, int]:
    """(forward, backward): an upper bound of the shared memory a block of the generator asks for, which Warp
    sizes as the kernel's own shared tiles plus the largest frame of the functions it calls (see
    :func:`_generator_funcs_of_widths`)."""
    pe_w, embed_w, hidden_w = widths
    rows, cols = GENERATOR_ROWS, GENERATOR_COLS
    hidden_frame = hidden_w * (pe_w + embed_w + 2)  # w_hidden's two column ranges, a padding column each
    forward = rows * (pe_w + embed_w + hidden_w) + max(hidden_frame, cols * (hidden_w + 1) + rows * cols)
    backward = rows * (pe_w + embed_w + 2 * hidden_w) + max(  # either backward kernel
        hidden_frame,
        rows * cols + 2 * cols * hidden_w + rows + cols,  # output_columns_backward
        hidden_w * (pe_w + 2 * embed_w) + rows + hidden_w + rows * embed_w,  # hidden_layer_backward
    )
    return (forward * scalar_bytes + _GENERATOR_SHARED_SLACK, backward * scalar_bytes + _GENERATOR_SHARED_SLACK)


def _tile_width(size: int) -> "int | None":
    """The first of :data:`GENERATOR_WIDTHS` that holds ``size``; None past the widest."""
    return next((w for w in GENERATOR_WIDTHS if w >= size), None)


def generator_widths(scalar_bytes: int, pe_dim: int, embed_dim: int, hidden_dim: int):
    """The tile widths (pe, embed, hidden) of the fused generator for these CG-MLP sizes in a scalar type of
    ``scalar_bytes`` bytes, or None where one is wider than the widest tile or the blocks would need more shared
    memory than the budget (the SIMT kernels then run the CG-MLP)."""
    widths = tuple(_tile_width(size) for size in (pe_dim, embed_dim, hidden_dim))
    if None in widths or max(generator_shared_bytes(scalar_bytes, widths)) > _GENERATOR_SHARED_BUDGET:
        return None
    return widths


def use_tile_generator(scalar_bytes: int, pe_dim: int, embed_dim: int, hidden_dim: int) -> bool:
    """Whether a UKAN CG-MLP (the torch layer's dense range, the Warp-native layer's pairs) runs on the fused
    tile generator: :data:`CG_GENERATOR` says "tile" and the sizes fit it (:func:`generator_widths`)."""
    if CG_GENERATOR not in CG_GENERATORS:
        raise ValueError(f"CG_GENERATOR must be one of {CG_GENERATORS}, got {CG_GENERATOR!r}")
    return CG_GENERATOR == "tile" and generator_widths(scalar_bytes, pe_dim, embed_dim, hidden_dim) is not None


def _generator_kernel_decorator(scalar_name: str, widths: tuple, part: str):
    """``wp.kernel`` into a module of its own per (scalar, widths, forward or backward), its tile_matmul by
    :data:`._modules.TILE_MATMUL`: a forward-only use never builds the backward (a cuBLASDx module takes minutes)."""
    pe_w, embed_w, hidden_w = widths
    name = tile_matmul_module(f"warpkan_ukan_generator_{part}_{scalar_name}_{pe_w}_{embed_w}_{hidden_w}")
    options = {}
    if GENERATOR_MIN_BLOCKS and GENERATOR_MIN_BLOCKS * max(generator_shared_bytes(
            wp.types.type_size_in_bytes(SCALARS[scalar_name]), widths)) <= _SM_SHARED_BYTES:
        options["launch_bounds"] = (_GENERATOR_BLOCK_DIM, GENERATOR_MIN_BLOCKS)
    return _kernel_decorator(name, **options)


@functools.lru_cache(maxsize=None)
def _generator_funcs(scalar_name: str):
    """The element functions of the generator's tiles, one set per scalar type."""
    scalar = SCALARS[scalar_name]
    zero = scalar(0.0)
    silu_and_grad = _mlp_silu_and_grad_func(scalar_name)

    @wp.func
    def row_feature(r: int, first_row: int, rows_per_feature: int, n_rows: int):
        # the feature of table row first_row + r; -1 past the table (gathers read zeros there)
        p = first_row + r
        if p >= n_rows:
            return -1
        return p // rows_per_feature

    @wp.func
    def row_group(r: int, feature: int, lowest: wp.int64, first_row: int, rows_per_feature: int):
        # group lowest - 1 + j of row p = feature Rt + j
        if feature < 0:
            return wp.int64(0)
        return lowest - wp.int64(1) + wp.int64(first_row + r - feature * rows_per_feature)

    # a float64 table takes the float64 sine; a narrower one the float32 sine of the reduced phase
    encoding = encoding_at if scalar_name == "float64" else encoding_at_single

    @wp.func
    def encoding_entry(g: wp.int64, a: int, frequency: wp.float64, pe_dim: int):
        if a < pe_dim:
            return scalar(wp.static(encoding)(g, a, frequency))
        return zero

    @wp.func
    def silu(x: scalar):
        act, dact = silu_and_grad(x)
        return act

    @wp.func
    def silu_backward(d_act: scalar, x: scalar):
        act, dact = silu_and_grad(x)
        return d_act * dact

    return row_feature, row_group, encoding_entry, silu, silu_backward


@functools.lru_cache(maxsize=None)
def _generator_input_funcs(scalar_name: str, widths: tuple, rows: str):
    """The generator's block-level @wp.funcs of one (scalar, widths, row map). Each phase is a function of its
    own so that its temporary tiles live in its own frame: Warp sizes a kernel's shared memory as the sum of
    the kernel's own shared tiles plus the largest frame of the functions it calls.

    ``rows`` names the map from table row to (feature, group), from the kernels' ``row_groups`` (int64) and
    ``row_features`` (int32): "range", row p = i Rt + j is feature i at group row_groups[i] - 1 + j (the
    dense range; row_features unused); "pairs", row p is feature row_features[p] at group row_groups[p] (the
    touched pairs)."""
    if rows not in GENERATOR_ROW_MAPS:
        raise ValueError(f"rows must be one of {GENERATOR_ROW_MAPS}, got {rows!r}")
    scalar = SCALARS[scalar_name]
    PE_W, E_W, H_W = widths
    PE_PAD, E_PAD = PE_W + 1, E_W + 1  # the weight tiles' padded widths (see output_columns)
    ROWS = GENERATOR_ROWS
    row_feature, row_group, encoding_entry, silu, silu_backward = _generator_funcs(scalar_name)

    @wp.func
    def range_rows(
        first_row: int,
        row_groups: wp.array(dtype=wp.int64),
        row_features: wp.array(dtype=wp.int32),
        rows_per_feature: int,
        n_rows: int,
        feature: wp.tile(dtype=int, shape=(ROWS,), storage="shared"),
        group: wp.tile(dtype=wp.int64, shape=(ROWS,), storage="shared"),
    ):
        r = wp.tile_arange(ROWS, dtype=int)
        wp.tile_assign(feature, wp.tile_map(wp.static(row_feature), r, wp.tile_full(ROWS, first_row, dtype=int),
                                            wp.tile_full(ROWS, rows_per_feature, dtype=int),
                                            wp.tile_full(ROWS, n_rows, dtype=int)))
        lowest = wp.tile_load_indexed(row_groups, indices=feature, shape=(ROWS,), axis=0)
        wp.tile_assign(group, wp.tile_map(wp.static(row_group), r, feature, lowest,
                                          wp.tile_full(ROWS, first_row, dtype=int),
                                          wp.tile_full(ROWS, rows_per_feature, dtype=int)))

    @wp.func
    def pair_rows(
        first_row: int,
        row_groups: wp.array(dtype=wp.int64),
        row_features: wp.array(dtype=wp.int32),
        rows_per_feature: int,
        n_rows: int,
        feature: wp.tile(dtype=int, shape=(ROWS,), storage="shared"),
        group: wp.tile(dtype=wp.int64, shape=(ROWS,), storage="shared"),
    ):
        # rows past the table read feature 0, group 0: computed, never stored
        wp.tile_assign(feature, wp.tile_load(row_features, shape=(ROWS,), offset=(first_row,)))
        wp.tile_assign(group, wp.tile_load(row_groups, shape=(ROWS,), offset=(first_row,)))

    row_map = range_rows if rows == "range" else pair_rows

    @wp.func
    def input_rows(
        first_row: int,
        row_groups: wp.array(dtype=wp.int64),
        row_features: wp.array(dtype=wp.int32),
        rows_per_feature: int,
        n_rows: int,
        embedding: wp.array2d(dtype=scalar),
        pe_dim: int,
        encoding_rows: wp.tile(dtype=scalar, shape=(ROWS, PE_W), storage="shared"),
        embedding_rows: wp.tile(dtype=scalar, shape=(ROWS, E_W), storage="shared"),
    ):
        # the block's input rows: the encoding of each row's group (zeros past pe_dim) and its feature's
        # embedding (zeros past embed_dim, and in range rows past the table)
        feature = wp.tile_zeros(shape=(ROWS,), dtype=int, storage="shared")
        group = wp.tile_zeros(shape=(ROWS,), dtype=wp.int64, storage="shared")
        row_map(first_row, row_groups, row_features, rows_per_feature, n_rows, feature, group)
        groups = wp.tile_broadcast(wp.tile_reshape(group, shape=(ROWS, 1)), shape=(ROWS, PE_W))
        column = wp.tile_arange(PE_W, dtype=int)
        columns = wp.tile_broadcast(wp.tile_reshape(column, shape=(1, PE_W)), shape=(ROWS, PE_W))
        # the frequencies once a column, not once an entry (a float64 power each)
        frequency = wp.tile_map(encoding_frequency, column, wp.tile_full(PE_W, pe_dim, dtype=int))
        frequencies = wp.tile_broadcast(wp.tile_reshape(frequency, shape=(1, PE_W)), shape=(ROWS, PE_W))
        wp.tile_assign(encoding_rows, wp.tile_map(wp.static(encoding_entry), groups, columns, frequencies,
                                                  wp.tile_full(shape=(ROWS, PE_W), value=pe_dim, dtype=int)))
        wp.tile_assign(embedding_rows, wp.tile_load_indexed(embedding, indices=feature, shape=(ROWS, E_W), axis=0))

    @wp.func
    def hidden_layer(
        encoding_rows: wp.tile(dtype=scalar, shape=(ROWS, PE_W), storage="shared"),
        embedding_rows: wp.tile(dtype=scalar, shape=(ROWS, E_W), storage="shared"),
        pe_dim: int,
        w_hidden: wp.array2d(dtype=scalar),
        b_hidden: wp.array(dtype=scalar),
        pre: wp.tile(dtype=scalar, shape=(ROWS, H_W), storage="shared"),
    ):
        # pre = [encoding, embedding] w_hidden^T + b_hidden: w_hidden's encoding columns (past pe_dim, embedding
        # columns, which meet the encoding's zeros) and its embedding columns
        # (each weight tile is read through a view of a tile one column wider: see output_columns)
        w_encoding = wp.tile_load(w_hidden, shape=(H_W, PE_PAD), offset=(0, 0), storage="shared")
        w_embedding = wp.tile_load(w_hidden, shape=(H_W, E_PAD), offset=(0, pe_dim), storage="shared")
        wp.tile_assign(pre, wp.tile_broadcast(wp.tile_reshape(wp.tile_load(b_hidden, shape=(H_W,)), shape=(1, H_W)),
                                              shape=(ROWS, H_W)))
        wp.tile_matmul(encoding_rows, wp.tile_transpose(wp.tile_view(w_encoding, offset=(0, 0), shape=(H_W, PE_W))),
                       pre)
        wp.tile_matmul(embedding_rows, wp.tile_transpose(wp.tile_view(w_embedding, offset=(0, 0), shape=(H_W, E_W))),
                       pre)

    return input_rows, hidden_layer


@functools.lru_cache(maxsize=None)
def _generator_kept_funcs(scalar_name: str, widths: tuple, rows: str):
    """The generator's block-level @wp.funcs of the rows a forward keeps for its backward (``kept``: the input
    rows and the hidden pre-activations, [table rows, :func:`kept_row_width`]), one set per (scalar, widths,
    row map): storing them, and the backward's rows, read from there or formed again."""
    scalar = SCALARS[scalar_name]
    PE_W, E_W, H_W = widths
    ROWS = GENERATOR_ROWS
    input_rows, hidden_layer = _generator_input_funcs(scalar_name, widths, rows)

    @wp.func
    def keep_rows(
        kept: wp.array2d(dtype=scalar),
        first_row: int,
        encoding_rows: wp.tile(dtype=scalar, shape=(ROWS, PE_W), storage="shared"),
        embedding_rows: wp.tile(dtype=scalar, shape=(ROWS, E_W), storage="shared"),
        pre: wp.tile(dtype=scalar, shape=(ROWS, H_W), storage="shared"),
    ):
        # the block's input rows and pre-activations for the backward (kept_row_width columns: the padded tiles
        # side by side; rows past the table are not stored)
        wp.tile_store(kept, encoding_rows, offset=(first_row, 0))
        wp.tile_store(kept, embedding_rows, offset=(first_row, PE_W))
        wp.tile_store(kept, pre, offset=(first_row, PE_W + E_W))

    @wp.func
    def rows_and_pre(
        kept: wp.array2d(dtype=scalar),
        first_row: int,
        row_groups: wp.array(dtype=wp.int64),
        row_features: wp.array(dtype=wp.int32),
        rows_per_feature: int,
        n_rows: int,
        embedding: wp.array2d(dtype=scalar),
        pe_dim: int,
        w_hidden: wp.array2d(dtype=scalar),
        b_hidden: wp.array(dtype=scalar),
        encoding_rows: wp.tile(dtype=scalar, shape=(ROWS, PE_W), storage="shared"),
        embedding_rows: wp.tile(dtype=scalar, shape=(ROWS, E_W), storage="shared"),
        pre: wp.tile(dtype=scalar, shape=(ROWS, H_W), storage="shared"),
    ):
        # the backward's input rows and pre-activations: those the forward kept (a kept array with rows), else
        # formed again (the encoding, the gathers, the hidden layer's products)
        if kept.shape[0] > 0:  # the tiles as keep_rows stored them
            wp.tile_assign(encoding_rows, wp.tile_load(kept, shape=(ROWS, PE_W), offset=(first_row, 0)))
            wp.tile_assign(embedding_rows, wp.tile_load(kept, shape=(ROWS, E_W), offset=(first_row, PE_W)))
            wp.tile_assign(pre, wp.tile_load(kept, shape=(ROWS, H_W), offset=(first_row, PE_W + E_W)))
        else:
            input_rows(first_row, row_groups, row_features, rows_per_feature, n_rows, embedding, pe_dim,
                       encoding_rows, embedding_rows)
            hidden_layer(encoding_rows, embedding_rows, pe_dim, w_hidden, b_hidden, pre)

    return keep_rows, rows_and_pre


def kept_row_width(scalar_bytes: int, pe_dim: int, embed_dim: int, hidden_dim: int) -> int:
    """Columns of the rows the tile generator's forward keeps for its backward ([table rows, width]: the
    input rows' encoding and embedding and the hidden pre-activations, each at its padded tile width); 0 where
    the tile generator does not take these sizes."""
    widths = generator_widths(scalar_bytes, pe_dim, embed_dim, hidden_dim)
    return sum(widths) if widths is not None else 0


@functools.lru_cache(maxsize=None)
def _generator_layer_funcs(scalar_name: str, widths: tuple):
    """The generator's block-level @wp.funcs of the output layer and of the backward's layers, one set per
    (scalar, widths) (see :func:`_generator_input_funcs` for why each phase is a function)."""
    scalar = SCALARS[scalar_name]
    PE_W, E_W, H_W = widths
    H_PAD = H_W + 1  # w_out's padded tile width (see output_columns)
    ROWS, COLS = GENERATOR_ROWS, GENERATOR_COLS

    @wp.func
    def output_columns(
        hidden: wp.tile(dtype=scalar, shape=(ROWS, H_W), storage="shared"),
        w_out: wp.array2d(dtype=scalar),
        b_out: wp.array(dtype=scalar),
        first_row: int,
        col: int,
        table_k: int,
        table: wp.array2d(dtype=scalar),
    ):
        # w_out's rows behind the table columns col .. col + COLS - 1 (output_row). Formed here and in
        # output_columns_backward, not by a @wp.func returning the index tile: such a func passed on the CPU but
        # every generator launch then failed on CUDA (illegal memory access, Warp 1.19)
        rows = wp.tile_map(output_row, wp.tile_arange(COLS, dtype=int) + wp.tile_full(COLS, col, dtype=int),
                           wp.tile_full(COLS, table.shape[1], dtype=int), wp.tile_full(COLS, table_k, dtype=int))
        # those rows are loaded into a tile one column wider than they are and read through a view: the
        # transposed operand's row stride is then odd (H_W + 1), so the lanes of Warp's scalar GEMM, which
        # read one element from each of 16 rows, hit 16 banks, not one (a 16-way shared-memory conflict on
        # every step of the product). The extra column is never read.
        w = wp.tile_load_indexed(w_out, indices=rows, shape=(COLS, H_PAD), axis=0, storage="shared")
        out = wp.tile_zeros(shape=(ROWS, COLS), dtype=scalar, storage="shared")
        wp.tile_assign(out, wp.tile_broadcast(
            wp.tile_reshape(wp.tile_load_indexed(b_out, indices=rows, shape=(COLS,), axis=0), shape=(1, COLS)),
            shape=(ROWS, COLS)))
        wp.tile_matmul(hidden, wp.tile_transpose(wp.tile_view(w, offset=(0, 0), shape=(COLS, H_W))), out)
        wp.tile_store(table, out, offset=(first_row, col))

    @wp.func
    def output_columns_backward(
        d_table: wp.array2d(dtype=scalar),
        w_out: wp.array2d(dtype=scalar),
        hidden: wp.tile(dtype=scalar, shape=(ROWS, H_W), storage="shared"),
        block: int,
        first_row: int,
        col: int,
        table_k: int,
        d_hidden: wp.tile(dtype=scalar, shape=(ROWS, H_W), storage="shared"),
        part_w_out: wp.array3d(dtype=scalar),
        part_b_out: wp.array2d(dtype=scalar),
    ):
        # d_hidden += d_out w_out[rows of cols]; the block's partials of d w_out[rows of cols] = d_out^T hidden
        # and of d b_out (a row of ones times d_out: a fixed summation order), in table column order
        d_out = wp.tile_load(d_table, shape=(ROWS, COLS), offset=(first_row, col), storage="shared")
        rows = wp.tile_map(output_row, wp.tile_arange(COLS, dtype=int) + wp.tile_full(COLS, col, dtype=int),
                           wp.tile_full(COLS, d_table.shape[1], dtype=int), wp.tile_full(COLS, table_k, dtype=int))
        w = wp.tile_load_indexed(w_out, indices=rows, shape=(COLS, H_W), axis=0, storage="shared")
        wp.tile_matmul(d_out, w, d_hidden)
        d_w = wp.tile_matmul(wp.tile_transpose(d_out), hidden)
        wp.tile_store(part_w_out, wp.tile_reshape(d_w, shape=(1, COLS, H_W)), offset=(block, col, 0))
        ones = wp.tile_ones(shape=(1, ROWS), dtype=scalar, storage="shared")
        wp.tile_store(part_b_out, wp.tile_matmul(ones, d_out), offset=(block, col))

    @wp.func
    def hidden_layer_backward(
        d_pre: wp.tile(dtype=scalar, shape=(ROWS, H_W), storage="shared"),
        encoding_rows: wp.tile(dtype=scalar, shape=(ROWS, PE_W), storage="shared"),
        embedding_rows: wp.tile(dtype=scalar, shape=(ROWS, E_W), storage="shared"),
        w_hidden: wp.array2d(dtype=scalar),
        pe_dim: int,
        block: int,
        first_row: int,
        part_w_encoding: wp.array3d(dtype=scalar),
        part_w_embedding: wp.array3d(dtype=scalar),
        part_b_hidden: wp.array2d(dtype=scalar),
        d_embedding_rows: wp.array2d(dtype=scalar),
    ):
        d_pre_t = wp.tile_transpose(d_pre)
        wp.tile_store(part_w_encoding, wp.tile_reshape(wp.tile_matmul(d_pre_t, encoding_rows), shape=(1, H_W, PE_W)),
                      offset=(block, 0, 0))
        wp.tile_store(part_w_embedding,
                      wp.tile_reshape(wp.tile_matmul(d_pre_t, embedding_rows), shape=(1, H_W, E_W)),
                      offset=(block, 0, 0))
        ones = wp.tile_ones(shape=(1, ROWS), dtype=scalar, storage="shared")
        wp.tile_store(part_b_hidden, wp.tile_matmul(ones, d_pre), offset=(block, 0))
        w_embedding = wp.tile_load(w_hidden, shape=(H_W, E_W), offset=(0, pe_dim), storage="shared")
        wp.tile_store(d_embedding_rows, wp.tile_matmul(d_pre, w_embedding), offset=(first_row, 0))

    return output_columns, output_columns_backward, hidden_layer_backward


def _generator_funcs_of_widths(scalar_name: str, widths: tuple, rows: str):
    """(input_rows, hidden_layer, keep_rows, rows_and_pre, output_columns, output_columns_backward,
    hidden_layer_backward) of one (scalar, widths, row map): :func:`_generator_input_funcs`,
    :func:`_generator_kept_funcs` and :func:`_generator_layer_funcs`."""
    return (*_generator_input_funcs(scalar_name, widths, rows), *_generator_kept_funcs(scalar_name, widths, rows),
            *_generator_layer_funcs(scalar_name, widths))


@functools.lru_cache(maxsize=None)
def _generator_forward_kernel(scalar_name: str, widths: tuple, rows: str):
    """The fused CG-MLP forward: a block's table rows, ``block_cols`` columns of them (``rows``: the row map,
    see :func:`_generator_funcs_of_widths`; the split: :func:`column_split`). The blocks of one row block each
    form the rows' hidden layer again: a few small products, for a grid wide enough to fill the GPU when the
    table has few rows."""
    scalar = SCALARS[scalar_name]
    PE_W, E_W, H_W = widths
    ROWS, COLS = GENERATOR_ROWS, GENERATOR_COLS
    silu = _generator_funcs(scalar_name)[3]
    input_rows, hidden_layer, keep_rows, _, output_columns = _generator_funcs_of_widths(scalar_name, widths, rows)[:5]
    kernel = _generator_kernel_decorator(scalar_name, widths, f"forward_{rows}")

    @kernel
    def generator_forward(
        row_groups: wp.array(dtype=wp.int64),
        row_features: wp.array(dtype=wp.int32),
        rows_per_feature: int,
        embedding: wp.array2d(dtype=scalar),
        pe_dim: int,
        w_hidden: wp.array2d(dtype=scalar),
        b_hidden: wp.array(dtype=scalar),
        w_out: wp.array2d(dtype=scalar),
        b_out: wp.array(dtype=scalar),
        table: wp.array2d(dtype=scalar),
        block_cols: int,
        table_k: int,
        kept: wp.array2d(dtype=scalar),
    ):
        block, col_block, lane = wp.tid()
        start_as_dependent()
        first_row = block * ROWS
        encoding_rows = wp.tile_zeros(shape=(ROWS, PE_W), dtype=scalar, storage="shared")
        embedding_rows = wp.tile_zeros(shape=(ROWS, E_W), dtype=scalar, storage="shared")
        input_rows(first_row, row_groups, row_features, rows_per_feature, table.shape[0], embedding, pe_dim,
                   encoding_rows, embedding_rows)
        hidden = wp.tile_zeros(shape=(ROWS, H_W), dtype=scalar, storage="shared")
        hidden_layer(encoding_rows, embedding_rows, pe_dim, w_hidden, b_hidden, hidden)
        if kept.shape[0] > 0 and col_block == 0:  # the rows and pre-activations for the backward, once a row block
            keep_rows(kept, first_row, encoding_rows, embedding_rows, hidden)
        wp.tile_assign(hidden, wp.tile_map(wp.static(silu), hidden))
        first_col = col_block * block_cols
        for col in range(first_col, wp.min(first_col + block_cols, table.shape[1]), COLS):
            output_columns(hidden, w_out, b_out, first_row, col, table_k, table)

    return generator_forward


@functools.lru_cache(maxsize=None)
def _generator_backward_kernels(scalar_name: str, widths: tuple, rows: str):
    """The fused CG-MLP backward, two kernels. ``output``: a block's ``block_cols`` columns of the output
    layer (its rows' hidden layer formed again, or read from ``kept``), their partials of d w_out and d b_out,
    and its columns' share of the rows' hidden gradient (columns c share_cols .. + H_W of d_hidden_parts [rows,
    ...] for column block c: a buffer of their own, or the block's own columns of d_table). ``hidden``: a
    block's rows (formed again, or read from ``kept``), their hidden gradient summed over the column blocks in
    order, its partials of d w_hidden and d b_hidden, and the rows' embedding gradients. Rows past the table read
    a zero table gradient, so they add nothing."""
    scalar = SCALARS[scalar_name]
    PE_W, E_W, H_W = widths
    ROWS, COLS = GENERATOR_ROWS, GENERATOR_COLS
    silu, silu_backward = _generator_funcs(scalar_name)[3:]
    _, _, _, rows_and_pre, _, output_columns_backward, hidden_layer_backward = _generator_funcs_of_widths(
        scalar_name, widths, rows)
    kernel = _generator_kernel_decorator(scalar_name, widths, f"backward_{rows}")

    @wp.func
    def add_hidden_part(
        d_hidden: wp.tile(dtype=scalar, shape=(ROWS, H_W), storage="shared"),
        d_hidden_parts: wp.array2d(dtype=scalar),
        first_col: int,
        first_row: int,
    ):
        part = wp.tile_load(d_hidden_parts, shape=(ROWS, H_W), offset=(first_row, first_col))
        wp.tile_assign(d_hidden, d_hidden + part)

    @kernel
    def generator_backward_output(
        d_table: wp.array2d(dtype=scalar),
        row_groups: wp.array(dtype=wp.int64),
        row_features: wp.array(dtype=wp.int32),
        rows_per_feature: int,
        embedding: wp.array2d(dtype=scalar),
        pe_dim: int,
        w_hidden: wp.array2d(dtype=scalar),
        b_hidden: wp.array(dtype=scalar),
        w_out: wp.array2d(dtype=scalar),
        part_w_out: wp.array3d(dtype=scalar),
        part_b_out: wp.array2d(dtype=scalar),
        d_hidden_parts: wp.array2d(dtype=scalar),
        share_cols: int,
        block_cols: int,
        table_k: int,
        kept: wp.array2d(dtype=scalar),
    ):
        block, col_block, lane = wp.tid()
        start_as_dependent()
        first_row = block * ROWS
        encoding_rows = wp.tile_zeros(shape=(ROWS, PE_W), dtype=scalar, storage="shared")
        embedding_rows = wp.tile_zeros(shape=(ROWS, E_W), dtype=scalar, storage="shared")
        hidden = wp.tile_zeros(shape=(ROWS, H_W), dtype=scalar, storage="shared")
        rows_and_pre(kept, first_row, row_groups, row_features, rows_per_feature, d_table.shape[0], embedding,
                     pe_dim, w_hidden, b_hidden, encoding_rows, embedding_rows, hidden)
        wp.tile_assign(hidden, wp.tile_map(wp.static(silu), hidden))
        d_hidden = wp.tile_zeros(shape=(ROWS, H_W), dtype=scalar, storage="shared")
        first_col = col_block * block_cols
        for col in range(first_col, wp.min(first_col + block_cols, d_table.shape[1]), COLS):
            output_columns_backward(d_table, w_out, hidden, block, first_row, col, table_k, d_hidden, part_w_out,
                                    part_b_out)
        # after the block's last read of d_table: where d_hidden_parts is d_table, these are the block's own columns
        wp.tile_store(d_hidden_parts, d_hidden, offset=(first_row, col_block * share_cols))

    @kernel
    def generator_backward_hidden(
        d_hidden_parts: wp.array2d(dtype=scalar),
        col_blocks: int,
        share_cols: int,
        row_groups: wp.array(dtype=wp.int64),
        row_features: wp.array(dtype=wp.int32),
        rows_per_feature: int,
        embedding: wp.array2d(dtype=scalar),
        pe_dim: int,
        w_hidden: wp.array2d(dtype=scalar),
        b_hidden: wp.array(dtype=scalar),
        part_w_encoding: wp.array3d(dtype=scalar),
        part_w_embedding: wp.array3d(dtype=scalar),
        part_b_hidden: wp.array2d(dtype=scalar),
        d_embedding_rows: wp.array2d(dtype=scalar),
        kept: wp.array2d(dtype=scalar),
    ):
        block, lane = wp.tid()
        first_row = block * ROWS
        encoding_rows = wp.tile_zeros(shape=(ROWS, PE_W), dtype=scalar, storage="shared")
        embedding_rows = wp.tile_zeros(shape=(ROWS, E_W), dtype=scalar, storage="shared")
        pre = wp.tile_zeros(shape=(ROWS, H_W), dtype=scalar, storage="shared")
        # the rows while the output kernel runs: launched as its dependent, this kernel starts only once every
        # output block has passed its own wait, so what the rows are made of (the kept rows, the groups, the
        # weights) is written; only the hidden-gradient shares are the output kernel's
        rows_and_pre(kept, first_row, row_groups, row_features, rows_per_feature, d_hidden_parts.shape[0], embedding,
                     pe_dim, w_hidden, b_hidden, encoding_rows, embedding_rows, pre)
        start_as_dependent()
        d_hidden = wp.tile_zeros(shape=(ROWS, H_W), dtype=scalar, storage="shared")
        for col_block in range(col_blocks):  # in order: deterministic
            add_hidden_part(d_hidden, d_hidden_parts, col_block * share_cols, first_row)
        wp.tile_assign(pre, wp.tile_map(wp.static(silu_backward), d_hidden, pre))  # pre now holds d_pre
        hidden_layer_backward(pre, encoding_rows, embedding_rows, w_hidden, pe_dim, block, first_row, part_w_encoding,
                              part_w_embedding, part_b_hidden, d_embedding_rows)

    return generator_backward_output, generator_backward_hidden


@wp.func
def _combine_entry(q: int, n_b: int, n_h: int, n_a: int, n_e: int):
    """(section, row, col) of flat entry q of the generator's combine over [W_out (B x H) | b_out (B) | W_hidden
    (H x A) | b_hidden (H) | embedding (in x E)]: section 0 w_out (table column b, h), 1 b_out (b, 0), 2
    w_hidden (h, a), 3 b_hidden (h, 0), 4 embedding (i, e); decoded once for the sum and the store."""
    first_hidden = n_b * n_h + n_b
    first_embedding = first_hidden + n_h * n_a + n_h
    section = int(4)
    start = first_embedding
    width = n_e
    if q < n_b * n_h:
        section = 0
        start = 0
        width = n_h
    elif q < first_hidden:
        section = 1
        start = n_b * n_h
        width = 1
    elif q < first_hidden + n_h * n_a:
        section = 2
        start = first_hidden
        width = n_a
    elif q < first_embedding:
        section = 3
        start = first_hidden + n_h * n_a
        width = 1
    row = (q - start) // width
    return section, row, q - start - row * width


def _combine_layout(is_cuda: bool) -> tuple[int, int]:
    """(lanes an entry, entries a block) of the generator's combine on a CUDA device or the CPU, whose blocks are
    one thread."""
    return (_COMBINE_LANES, _COMBINE_ENTRIES) if is_cuda else (1, 1)


@functools.lru_cache(maxsize=None)
def _generator_combine_kernel(scalar_name: str, layout: tuple):
    """The generator's parameter gradients from the blocks' partials, and the embedding's from its rows, with
    ``layout`` = (lanes an entry, entries a block) (:func:`_combine_layout`). A module of its own: built the
    first time a backward runs, it would otherwise change the hash of a CG-MLP module that is already loaded and
    make Warp build all of its kernels again."""
    scalar = SCALARS[scalar_name]
    kernel = _kernel_decorator(f"warpkan_ukan_generator_combine_{scalar_name}_{layout[0]}x{layout[1]}")
    zero = scalar(0.0)

    # Few entries (a MNIST layer's ~11k) over many blocks' partials (~170): a thread an entry left most SMs idle
    # and each thread a chain of memory latencies. So COMBINE_LANES threads share an entry: lane l sums the
    # partials of blocks l, l + LANES, ... (COMBINE_BATCH loads issued before their adds), and the lanes' sums
    # meet in a block-level tile sum. The order is fixed by the shapes alone: bitwise reproducible.
    LANES, ENTRIES = layout

    @wp.func
    def lane_sum(part: wp.array2d(dtype=scalar), c: int, lane: int):
        # past the last block a load reads the last one again and adds zero: a whole batch of loads is issued
        # before its adds, the tail included
        n = part.shape[0]
        acc = zero
        for block in range(lane, n, LANES * _COMBINE_BATCH):
            for k in range(wp.static(_COMBINE_BATCH)):
                b = block + k * LANES
                value = part[wp.min(b, n - 1), c]
                acc = acc + wp.where(b < n, value, zero)
        return acc

    @kernel
    def generator_combine(
        part_w_out: wp.array2d(dtype=scalar),
        part_b_out: wp.array2d(dtype=scalar),
        part_w_encoding: wp.array2d(dtype=scalar),
        part_w_embedding: wp.array2d(dtype=scalar),
        part_b_hidden: wp.array2d(dtype=scalar),
        d_embedding_rows: wp.array2d(dtype=scalar),
        pe_dim: int,
        rows_per_feature: int,
        accumulate: int,
        table_k: int,
        n_entries: int,
        d_w_out: wp.array2d(dtype=scalar),
        d_b_out: wp.array(dtype=scalar),
        d_w_hidden: wp.array2d(dtype=scalar),
        d_b_hidden: wp.array(dtype=scalar),
        d_embedding: wp.array2d(dtype=scalar),
    ):
        # flat entry q over [W_out (B x H) | b_out (B) | W_hidden (H x A) | b_hidden (H) | embedding (in x E)]
        # (the embedding's for range rows only: n_entries stops before it otherwise); each the sum of the
        # blocks' partials (the embedding: of its feature's rows), added to the gradient with ``accumulate``,
        # else stored. The partials come flattened past the block index ([blocks, B H] for [blocks, B, H]).
        chunk, t = wp.tid()
        start_as_dependent()
        lane = t // ENTRIES
        slot = t - lane * ENTRIES
        q = chunk * ENTRIES + slot
        n_b = d_w_out.shape[0]
        n_h = d_w_out.shape[1]
        n_a = d_w_hidden.shape[1]
        n_embed = n_a - pe_dim
        section, row, col = _combine_entry(q, n_b, n_h, n_a, d_embedding.shape[1])
        value = zero
        if section == 0:  # the partials in table column order b: w_out's row output_row(b)
            value = lane_sum(part_w_out, q, lane)
        elif section == 1:
            value = lane_sum(part_b_out, row, lane)
        elif section == 2:
            if col < pe_dim:
                value = lane_sum(part_w_encoding, row * pe_dim + col, lane)
            else:
                value = lane_sum(part_w_embedding, row * n_embed + col - pe_dim, lane)
        elif section == 3:
            value = lane_sum(part_b_hidden, row, lane)
        elif q < n_entries:
            for j in range(lane, rows_per_feature, LANES):
                value = value + d_embedding_rows[row * rows_per_feature + j, col]
        lanes = wp.tile_reshape(wp.tile(value), shape=(LANES, ENTRIES))
        total = wp.tile_extract(wp.tile_sum(lanes, axis=0), slot)
        if lane == 0 and q < n_entries:
            if section == 0:
                w = output_row(row, n_b, table_k)
                if accumulate:
                    total = total + d_w_out[w, col]
                d_w_out[w, col] = total
            elif section == 1:
                w = output_row(row, n_b, table_k)
                if accumulate:
                    total = total + d_b_out[w]
                d_b_out[w] = total
            elif section == 2:
                if accumulate:
                    total = total + d_w_hidden[row, col]
                d_w_hidden[row, col] = total
            elif section == 3:
                if accumulate:
                    total = total + d_b_hidden[row]
                d_b_hidden[row] = total
            else:
                if accumulate:
                    total = total + d_embedding[row, col]
                d_embedding[row, col] = total

    return generator_combine


def generator_partial_shapes(n_rows: int, n_table_cols: int, pe_dim: int, embed_dim: int, hidden_dim: int) -> dict:
    """Shapes of the scratch of :func:`launch_generator_backward`, by argument name: a function of the shapes
    alone (so is the summation order)."""
    n_blocks = max(1, -(-n_rows // GENERATOR_ROWS))
    return {
        "part_w_out": (n_blocks, n_table_cols, hidden_dim),
        "part_b_out": (n_blocks, n_table_cols),
        "part_w_encoding": (n_blocks, hidden_dim, pe_dim),
        "part_w_embedding": (n_blocks, hidden_dim, embed_dim),
        "part_b_hidden": (n_blocks, hidden_dim),
        "d_embedding_rows": (n_rows, embed_dim),
        "d_hidden_parts": (n_rows, column_split(n_rows, n_table_cols)[0] * hidden_tile_width(hidden_dim)),
    }


def hidden_tile_width(hidden_dim: int) -> int:
    """The generator's tile width of a hidden layer of ``hidden_dim`` (the first of :data:`GENERATOR_WIDTHS`
    that holds it; the widest past it, where the tile generator does not run)."""
    return _tile_width(hidden_dim) or GENERATOR_WIDTHS[-1]


def hidden_parts_in_table(n_rows: int, n_table_cols: int, hidden_dim: int) -> bool:
    """Whether the generator backward's column blocks can leave their shares of the hidden gradient in the
    table gradient's own columns (``d_hidden_parts=None`` in :func:`launch_generator_backward`): every column
    block, the last included, at least a hidden tile wide. A block (row block r, column block c) is the only
    reader of d_table[rows of r, columns of c], and it stores its share there after its last read."""
    col_blocks, block_cols = column_split(n_rows, n_table_cols)
    return hidden_tile_width(hidden_dim) <= min(block_cols, n_table_cols - (col_blocks - 1) * block_cols)


def column_split(n_rows: int, n_table_cols: int) -> tuple[int, int]:
    """(column blocks, table columns a block) of a generator launch on a table [n_rows, n_table_cols]: the
    columns split in whole GENERATOR_COLS products over as few blocks as give GENERATOR_TARGET_BLOCKS blocks
    in all (one where the rows alone give that many)."""
    row_blocks = max(1, -(-n_rows // GENERATOR_ROWS))
    products = max(1, -(-n_table_cols // GENERATOR_COLS))
    wanted = min(products, max(1, -(-GENERATOR_TARGET_BLOCKS // row_blocks)))
    products_per_block = -(-products // wanted)
    return -(-products // products_per_block), products_per_block * GENERATOR_COLS


def _generator_config(table, embedding, w_hidden, pe_dim):
    name = scalar_name(table, "table")
    widths = generator_widths(wp.types.type_size_in_bytes(SCALARS[name]), pe_dim, embedding.shape[1], w_hidden.shape[0])
    if widths is None:
        raise ValueError(f"the tile generator takes pe_dim, embed_dim and hidden_dim up to {GENERATOR_WIDTHS[-1]} "
                         f"within {_GENERATOR_SHARED_BUDGET} bytes of shared memory a block ({name}), got "
                         f"{pe_dim}, {embedding.shape[1]} and {w_hidden.shape[0]}")
    return name, widths, -(-table.shape[0] // GENERATOR_ROWS)


def _launch_tiled(kernel, blocks: list, inputs, device, stream, record, block_dim=_GENERATOR_BLOCK_DIM):
    """One tiled launch of a grid of ``blocks``, or (record=True) its recorded command in a list, for a caller's
    launch cache."""
    cmd = wp.launch_tiled(kernel, dim=blocks, inputs=inputs, device=device, stream=stream,
                          block_dim=block_dim, record_tape=False, record_cmd=record)
    return [cmd] if record else []


def _check_table_k(n_cols: int, table_k: int) -> int:
    table_k = int(table_k)
    if table_k < 1 or n_cols % table_k:
        raise ValueError(f"table_k must be a positive divisor of the table's {n_cols} columns, got {table_k}")
    return table_k


def _generator_forward(rows, row_groups, row_features, rows_per_feature, embedding, w_hidden, b_hidden, w_out,
                       b_out, table, pe_dim, table_k, stream, record, kept=None):
    if table.shape[0] == 0 or table.shape[1] == 0:
        return []
    name, widths, n_blocks = _generator_config(table, embedding, w_hidden, pe_dim)
    col_blocks, block_cols = column_split(table.shape[0], table.shape[1])
    return _launch_tiled(_generator_forward_kernel(name, widths, rows), [n_blocks, col_blocks],
                         [row_groups, row_features, rows_per_feature, embedding, int(pe_dim), w_hidden, b_hidden, w_out,
                          b_out, table, block_cols, _check_table_k(table.shape[1], table_k),
                          _checked_kept(kept, table.shape[0], widths)], table.device, stream, record)


def _generator_backward(rows, d_table, row_groups, row_features, rows_per_feature, embedding, w_hidden, b_hidden,
                        w_out, partials, grads, pe_dim, table_k, accumulate, stream, record, kept=None):
    """The backward kernel and the combine; the combine leaves d_embedding (the last of ``grads``) to the
    caller unless the rows are a range's."""
    name, widths, n_blocks = _generator_config(d_table, embedding, w_hidden, pe_dim)
    d_w_out, d_b_out, d_w_hidden, d_b_hidden, d_embedding = grads
    n_entries = (d_w_out.shape[0] * d_w_out.shape[1] + d_b_out.shape[0] + d_w_hidden.shape[0] * d_w_hidden.shape[1]
                 + d_b_hidden.shape[0])
    if rows == "range":
        n_entries += d_embedding.shape[0] * d_embedding.shape[1]
    device = d_table.device
    part_w_out, part_b_out, part_w_encoding, part_w_embedding, part_b_hidden, d_embedding_rows, d_hidden_parts = partials
    output_kernel, hidden_kernel = _generator_backward_kernels(name, widths, rows)
    layout = _combine_layout(wp.get_device(device).is_cuda)
    rows_args = [row_groups, row_features, rows_per_feature, embedding, int(pe_dim), w_hidden, b_hidden]
    col_blocks, block_cols = column_split(d_table.shape[0], d_table.shape[1])
    d_hidden_parts, share_cols = _hidden_shares(d_table, d_hidden_parts, w_hidden.shape[0], col_blocks, block_cols)
    table_k = _check_table_k(d_table.shape[1], table_k)
    kept = _checked_kept(kept, d_table.shape[0], widths)
    return (_launch_tiled(output_kernel, [n_blocks, col_blocks],
                          [d_table, *rows_args, w_out, part_w_out, part_b_out, d_hidden_parts, share_cols, block_cols,
                           table_k, kept], device, stream, record)
            + _launch_tiled(hidden_kernel, [n_blocks], [d_hidden_parts, col_blocks, share_cols, *rows_args,
                                                       part_w_encoding, part_w_embedding, part_b_hidden,
                                                       d_embedding_rows, kept], device, stream, record)
            + _launch_tiled(_generator_combine_kernel(name, layout), [max(1, -(-n_entries // layout[1]))],
                            [*(_blocks_by_columns(part) for part in partials[:6]), int(pe_dim), rows_per_feature,
                             int(accumulate), table_k, n_entries, *grads], device, stream, record,
                            block_dim=layout[0] * layout[1]))


def _hidden_shares(d_table, d_hidden_parts, hidden_dim: int, col_blocks: int, block_cols: int):
    """(the array the column blocks leave their hidden-gradient shares in, the columns between two blocks'
    shares): ``d_hidden_parts`` [rows, column blocks x hidden tile] (generator_partial_shapes), or, where it is
    None, d_table itself, each share in its block's own columns (:func:`hidden_parts_in_table`)."""
    n_rows, n_cols = d_table.shape
    if d_hidden_parts is None:
        if not hidden_parts_in_table(n_rows, n_cols, hidden_dim):
            raise ValueError(f"a table gradient [{n_rows}, {n_cols}] cannot hold the hidden gradient's shares of "
                             f"{hidden_dim} columns (hidden_parts_in_table): pass d_hidden_parts")
        return d_table, block_cols
    width = hidden_tile_width(hidden_dim)
    if tuple(d_hidden_parts.shape) != (n_rows, col_blocks * width):
        raise ValueError(f"d_hidden_parts must be [{n_rows}, {col_blocks * width}] (generator_partial_shapes), got "
                         f"{tuple(d_hidden_parts.shape)}")
    return d_hidden_parts, width


def _checked_kept(kept, n_rows: int, widths: tuple):
    """``kept`` (the rows a forward keeps for its backward, [n_rows, sum(widths)]), checked, or None (the
    kernels then form the rows themselves)."""
    if kept is not None and tuple(kept.shape) != (n_rows, sum(widths)):
        raise ValueError(f"kept must be [{n_rows}, {sum(widths)}] (kept_row_width), got {tuple(kept.shape)}")
    return kept


def _blocks_by_columns(part: wp.array) -> wp.array:
    """A partial [blocks, ...] as [blocks, columns]: a view (the partials are contiguous scratch; an empty one,
    of a CG-MLP without encoding or embedding columns, is never read)."""
    if part.ndim == 2:
        return part
    if part.size == 0:
        return wp.empty((part.shape[0], 0), dtype=part.dtype, device=part.device)
    return part.reshape((part.shape[0], -1))


def _no_row_features(device):
    return wp.empty(0, dtype=wp.int32, device=device)


def launch_generator_forward(group_lo, embedding, w_hidden, b_hidden, w_out, b_out, table, kept, pe_dim, table_k=1,
                             stream=None, record=False):
    """The CG-MLP on the dense range by the fused tile generator: table [in Rt, B] = w_out silu(w_hidden f +
    b_hidden) + b_out, the input row f of row i Rt + j being (the encoding of group group_lo[i] - 1 + j,
    embedding[i]) (what :func:`launch_range_mlp_forward` computes, in one launch); the table's columns are
    w_out's rows in the order ``table_k`` gives (:func:`output_row`). ``kept``: None, or [in Rt,
    :func:`kept_row_width`] that the launch fills with the input rows and the hidden pre-activations, for a
    :func:`launch_generator_backward` that reads them instead of forming them again."""
    rows_per_feature = table.shape[0] // group_lo.shape[0]
    return as_dependents(_generator_forward("range", group_lo, _no_row_features(table.device), rows_per_feature,
                                            embedding, w_hidden, b_hidden, w_out, b_out, table, pe_dim, table_k,
                                            stream, record, kept))


def launch_generator_backward(d_table, group_lo, embedding, w_hidden, b_hidden, w_out, part_w_out, part_b_out,
                              part_w_encoding, part_w_embedding, part_b_hidden, d_embedding_rows, d_hidden_parts,
                              d_w_out, d_b_out, d_w_hidden, d_b_hidden, d_embedding, kept, pe_dim, table_k=1,
                              stream=None, record=False):
    """Every parameter gradient of :func:`launch_generator_forward` (with the same ``table_k``) from d_table
    [in Rt, B], written, not accumulated: the blocks' tile_matmul partials (scratch shaped by
    :func:`generator_partial_shapes`), then their fixed-order sum (bitwise reproducible). ``kept``: the rows
    the forward kept (its ``kept``), else None (the blocks form them again). ``d_hidden_parts`` None: the
    column blocks' shares of the hidden gradient go into d_table's own columns, which are then overwritten
    (only where :func:`hidden_parts_in_table`; for a caller whose d_table is scratch), a buffer of that size
    less at the step's peak."""
    if d_table.shape[0] == 0:
        return []
    rows_per_feature = d_table.shape[0] // group_lo.shape[0]
    partials = [part_w_out, part_b_out, part_w_encoding, part_w_embedding, part_b_hidden, d_embedding_rows,
                d_hidden_parts]
    return as_dependents(_generator_backward("range", d_table, group_lo, _no_row_features(d_table.device),
                                             rows_per_feature, embedding, w_hidden, b_hidden, w_out, partials,
                                             (d_w_out, d_b_out, d_w_hidden, d_b_hidden, d_embedding), pe_dim,
                                             table_k, False, stream, record, kept))


def launch_pair_generator_forward(pair_feature, pair_group, embedding, w_hidden, b_hidden, w_out, b_out, table,
                                  pe_dim, table_k=1, stream=None):
    """The CG-MLP on the touched-pair rows by the fused tile generator: table [P, B] = w_out silu(w_hidden f +
    b_hidden) + b_out, the input row f of row p being (the encoding of group pair_group[p],
    embedding[pair_feature[p]]) (what launch_features and two launch_dense_forward compute); the table's
    columns are w_out's rows in the order ``table_k`` gives (:func:`output_row`)."""
    return _generator_forward("pairs", pair_group, pair_feature, 0, embedding, w_hidden, b_hidden, w_out, b_out, table,
                              pe_dim, table_k, stream, False)


def launch_pair_generator_backward(d_table, pair_feature, pair_group, rows_needed, embedding, w_hidden, b_hidden,
                                   w_out, d_w_out, d_b_out, d_w_hidden, d_b_hidden, d_embedding, pe_dim, table_k=1,
                                   stream=None):
    """Accumulate (+=) every parameter gradient of :func:`launch_pair_generator_forward` from d_table [P, B]:
    the blocks' partials and their fixed-order sum, then the embedding's by each feature's rows in order
    (:func:`launch_embedding_backward`). Scratch allocated here."""
    if d_table.shape[0] == 0:
        return
    device = d_table.device
    shapes = generator_partial_shapes(d_table.shape[0], d_table.shape[1], int(pe_dim), embedding.shape[1],
                                      w_hidden.shape[0])
    partials = [wp.empty(shape, dtype=d_table.dtype, device=device) for shape in shapes.values()]
    with on_stream(stream):
        _generator_backward("pairs", d_table, pair_group, pair_feature, 0, embedding, w_hidden, b_hidden, w_out,
                            partials, (d_w_out, d_b_out, d_w_hidden, d_b_hidden, d_embedding), pe_dim, table_k, True,
                            None, False)
        launch_embedding_backward(partials[5], pair_feature, rows_needed, 0, d_embedding)
