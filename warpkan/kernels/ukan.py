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

**Dense range** (``range_*`` kernels; taken by the torch layer while every feature's touched groups lie in a
short contiguous run). Per feature i, the lowest touched group ``lo_i`` and the widest span R (groups from
lowest to highest, over all features) are found by integer min/max atomics (order-independent, so
deterministic) without a read-back. The table then holds, for every feature, the Rt = R + 1 groups
``lo_i - 1 .. lo_i + R - 1``: a B-spline on that piece of the unbounded grid with W = Rt K coefficient slots,
of which the last is reached by no window (the highest window starts at (R - 1) K + K - 1 and ends at
Rt K - 2) and holds the SiLU base instead. Like KANLinear's gemm strategy, the bases of a chunk of rows are
written as a transposed dense basis ``[in W, rows]`` by coalesced stores (zeros included, no fill) and
contracted with cuBLAS; dx folds the basis gradient back per element, and one kernel splits the combined
weight's gradient into d table, d scaler and d base weight in a fixed order. The cell is located in float64
relative to ``lo_i``, so |x| = 1e6 keeps full precision here too.

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
   GEMM); the Warp-native layer uses the SIMT dense kernels at the bottom of this file.
3. **Spline forward**: one thread per (n, 4 consecutive outputs), looping over inputs; the basis of (n, i)
   is evaluated once per thread and reused across its outputs (the B-spline forward's design).
4. **Backward** (no floating-point atomics; every gradient is bitwise reproducible, there is no separate
   non-deterministic mode):
   - dx: one block per row, its threads on consecutive outputs and one block reduction per (n, i) (the
     B-spline ``backward_x`` design);
   - d base weight / d scaler: row chunks into partial buffers and a fixed-order combine;
   - d table: a segmented reduction over the sorted elements. One thread per (chunk of sorted elements,
     output) walks its chunk once (one basis per element and output, as the B-spline bucketed kernel) and
     accumulates the 2K-window of the current row; a row wholly inside the chunk is written out directly,
     a row cut by a chunk boundary leaves a head/tail partial, and a combine pass adds those partials in
     chunk order and applies the scaler.
"""

import functools
from dataclasses import dataclass
from types import SimpleNamespace

import warp as wp

from ._common import SCALARS, on_stream, scalar_name
from .. import _checks
from .edge.bspline_family import MAX_SPLINE_ORDER, uniform_basis_funcs, uniform_basis_matrix
from .edge.ukan_family import CELL_LIMIT, ukan_locate_func
from .edge.family import silu_func
from .edge.launch import row_chunks
from .edge.stencil import combine_rows_kernel

__all__ = [
    "check_layer_args",
    "CELL_LIMIT",
    "UKANVariant",
    "PairBuffers",
    "get_variant",
    "get_dense_variant",
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
    "launch_reorder_table",
    "PE_BASE",
    "table_chunk",
    "launch_group_range",
    "launch_range_mlp_forward",
    "launch_range_mlp_backward",
    "range_mlp_partial_shape",
]

_GROUP_BIAS = 2**40  # g + bias > 0 for every clamped g (and g - 1)
_FEATURE_STRIDE = 2**41  # key = i * stride + g + bias
PE_BASE = 10000.0  # sinusoidal encoding frequencies: PE_BASE^(-2j / pe_dim)
_OUT_TILE = 4
_ROW_BLOCK = 32  # threads per row in the block-per-row dx kernel (one warp)
_TARGET_TABLE_THREADS = 1 << 18  # parallelism aimed at by the d_table segmented reduction
_MIN_TABLE_CHUNK = 64
_MAX_TABLE_CHUNK = 4096
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
def group_encoding(g: wp.int64, a: int, pe_dim: int) -> wp.float64:
    """Entry a of the sinusoidal encoding of group g: sin(g f_j) for even a, cos(g f_j) for odd a, with
    f_j = PE_BASE^(-2j / pe_dim), j = a // 2; the phase in float64, so |g| ~ 1e7 keeps its precision."""
    j = a // 2
    phase = wp.float64(g) * wp.pow(wp.float64(PE_BASE), -wp.float64(2 * j) / wp.float64(pe_dim))
    if a - 2 * j == 1:
        return wp.cos(phase)
    return wp.sin(phase)

@dataclass(frozen=True)
class UKANVariant:
    order: int
    scalar: type
    pair_keys: wp.Kernel
    pair_mark: wp.Kernel
    pair_fill: wp.Kernel
    forward: wp.Kernel
    backward_x: wp.Kernel
    backward_rows: wp.Kernel
    combine_rows: wp.Kernel
    backward_table: wp.Kernel
    combine_table: wp.Kernel
    range_init: wp.Kernel
    range_partial: wp.Kernel
    range_finalize: wp.Kernel
    basis_matrix: object
    module: str


# ---------------------------------------------------------------------- spline kernel factories
# get_variant assembles a UKANVariant from the factories below, each cached on get_variant's arguments (spline
# order, scalar type), so that a combination builds each @wp.func and kernel once. Each factory closes over the
# types and constants of _config under the names its @wp.funcs and kernels use: Warp resolves those names
# when it generates code, and the names and values are part of the module's hash.

_NO_GROUP = 2**62  # above every clamped group: "no valid input yet" in the range search
_SPAN_CAP = 2**30  # the widest span the range search reports


@dataclass(frozen=True, eq=False)
class _Config:
    """The types and constants of one (spline order, scalar type), and the Warp module of its kernels."""

    scalar: type
    K: int  # coefficients of a cell, order + 1
    OT: int  # outputs per thread of the forward
    vecK: type  # the K basis values of a cell
    matK: type  # the basis matrix M_k
    vec2K: type  # the 2K-window sum of a table row (positions of C_{g-1}, then of C_g)
    vecOT: type  # the forward's tile of outputs
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
        OT=_OUT_TILE,
        vecK=wp.types.vector(length=K, dtype=scalar),
        matK=wp.types.matrix(shape=(K, K), dtype=scalar),
        vec2K=wp.types.vector(length=2 * K, dtype=scalar),
        vecOT=wp.types.vector(length=_OUT_TILE, dtype=scalar),
        zero=scalar(0.0),
        module=f"warpkan_ukan_k{order}_{scalar_name}",
    )


def _kernel_decorator(module: str):
    """``wp.kernel`` without a backward pass, into the Warp module named ``module``."""
    return functools.partial(wp.kernel, enable_backward=False, module=module)


# ---------------------------------------------------------------------- per-element maths (@wp.func)

@functools.lru_cache(maxsize=None)
def _element_funcs(order: int, scalar_name: str):
    """basis and basis_grad: the B-spline family's matrix-form bases (the kernels still pass M, unused, as an
    argument); silu_and_grad(x) = (silu(x), silu'(x)): the edge family's SiLU without its second derivative."""
    cfg = _config(order, scalar_name)
    scalar, matK = cfg.scalar, cfg.matK
    powers_basis, powers_basis_du = uniform_basis_funcs(order, scalar_name)[:2]
    silu_and_grads = silu_func(scalar_name)

    @wp.func
    def basis(u: scalar, basis_matrix: matK):
        return powers_basis(u)

    @wp.func
    def basis_grad(u: scalar, du_dx: scalar, basis_matrix: matK):
        b, db = powers_basis_du(u)
        return db * du_dx

    @wp.func
    def silu_and_grad(x: scalar):
        act, dact, d2act = silu_and_grads(x)
        return act, dact

    return SimpleNamespace(basis=basis, basis_grad=basis_grad, silu_and_grad=silu_and_grad)


@functools.lru_cache(maxsize=None)
def _window_funcs(order: int, scalar_name: str):
    """encode_window and decode_window: an element's window code; window_dot: its cell's coefficients of one
    output against its basis. Window codes: w >= 0 a window start; -1 no spline term (NaN, past the
    capacity); w <= -2 the window -2 - w of an input clamped to the cell limit (zero spline derivative)."""
    cfg = _config(order, scalar_name)
    scalar, vecK, K, zero = cfg.scalar, cfg.vecK, cfg.K, cfg.zero

    @wp.func
    def encode_window(start: int, sloped: int):
        if sloped:
            return start
        return -2 - start

    @wp.func
    def decode_window(w: int):
        """(valid, start, sloped)"""
        if w >= 0:
            return int(1), w, int(1)
        if w == -1:
            return int(0), int(0), int(0)
        return int(1), -2 - w, int(0)

    @wp.func
    def window_dot(table: wp.array2d(dtype=scalar), start: int, o: int, b: vecK):
        """sum_m b_m table[start + m, o]: the cell's K coefficients of output o."""
        acc = zero
        for m in range(K):
            acc = acc + b[m] * table[start + m, o]
        return acc

    return SimpleNamespace(encode_window=encode_window, decode_window=decode_window, window_dot=window_dot)


@functools.lru_cache(maxsize=None)
def _row_window_funcs(order: int, scalar_name: str):
    """store_window and resolved_window: the 2K-window sums of the table rows, as backward_table leaves them
    and combine_table reads them."""
    cfg = _config(order, scalar_name)
    scalar, vec2K, K = cfg.scalar, cfg.vec2K, cfg.K

    @wp.func
    def store_window(dest: wp.array3d(dtype=scalar), at: int, o: int, acc: vec2K):
        for m in range(2 * K):
            dest[at, m, o] = acc[m]

    @wp.func
    def resolved_window(
        p: int,
        o: int,
        row_start: wp.array(dtype=wp.int32),
        row_stop: wp.array(dtype=wp.int32),
        chunk_size: int,
        row_window: wp.array3d(dtype=scalar),
        head: wp.array3d(dtype=scalar),
        tail: wp.array3d(dtype=scalar),
    ):
        """W_p of backward_table: zero for a row without elements, else its own entry or its chunk partials
        added in chunk order."""
        acc = vec2K()
        lo = row_start[p]
        hi = row_stop[p]
        if hi > lo:
            c0 = lo // chunk_size
            c1 = (hi - 1) // chunk_size
            if c0 == c1:
                for m in range(2 * K):
                    acc[m] = row_window[p, m, o]
            else:
                for m in range(2 * K):
                    acc[m] = tail[c0, m, o]
                for c in range(c0 + 1, c1 + 1):
                    for m in range(2 * K):
                        acc[m] = acc[m] + head[c, m, o]
        return acc

    return SimpleNamespace(store_window=store_window, resolved_window=resolved_window)


# ---------------------------------------------------------------------- 1. touched (feature, group) pairs

@functools.lru_cache(maxsize=None)
def _pair_keys_kernel(order: int, scalar_name: str):
    """Every element's (feature, group) key for the sort, its window offset and its local coordinate."""
    cfg = _config(order, scalar_name)
    scalar = cfg.scalar
    kernel = _kernel_decorator(cfg.module)
    locate = ukan_locate_func(order, scalar_name)  # (x, h) -> (valid, g, r, u, sloped): the edge family's
    encode_window = _window_funcs(order, scalar_name).encode_window
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
    """The table rows' (feature, group) and element ranges, and every element's final window code."""
    cfg = _config(order, scalar_name)
    K = cfg.K
    kernel = _kernel_decorator(cfg.module)
    windows = _window_funcs(order, scalar_name)
    encode_window, decode_window = windows.encode_window, windows.decode_window
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
        row_start: wp.array(dtype=wp.int32),
        row_stop: wp.array(dtype=wp.int32),
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
            row_start[row - 1] = j
            row_stop[row - 1] = j
        if row >= capacity:
            return
        if need > 0:
            pair_feature[row] = i
            pair_group[row] = key - wp.int64(i) * stride - bias
            row_start[row] = j
        last = j == keys.shape[0] - 1
        if not last:
            last = keys[j + 1] != key
        if last:
            row_stop[row] = j + 1

    return pair_fill


# ---------------------------------------------------------------------- 3. spline forward

@functools.lru_cache(maxsize=None)
def _forward_kernel(order: int, scalar_name: str):
    """y = the SiLU base plus the scaled spline, one thread per (row, tile of OT outputs)."""
    cfg = _config(order, scalar_name)
    scalar, matK, vecK, vecOT, OT, zero = cfg.scalar, cfg.matK, cfg.vecK, cfg.vecOT, cfg.OT, cfg.zero
    kernel = _kernel_decorator(cfg.module)
    maths = _element_funcs(order, scalar_name)
    basis, silu_and_grad = maths.basis, maths.silu_and_grad
    windows = _window_funcs(order, scalar_name)
    decode_window, window_dot = windows.decode_window, windows.window_dot

    @kernel
    def forward(
        x: wp.array2d(dtype=scalar),
        window: wp.array2d(dtype=wp.int32),
        local_u: wp.array2d(dtype=scalar),
        table: wp.array2d(dtype=scalar),
        base_weight_t: wp.array2d(dtype=scalar),
        scaler_t: wp.array2d(dtype=scalar),
        basis_matrix: matK,
        use_base: int,
        y: wp.array2d(dtype=scalar),
    ):
        # consecutive threads take consecutive output tiles of one row: table reads coalesce
        tid = wp.tid()
        n_out = y.shape[1]
        n_tiles = (n_out + OT - 1) // OT
        n = tid // n_tiles
        o0 = (tid - n * n_tiles) * OT
        acc = vecOT()
        for i in range(x.shape[1]):
            valid, start, sloped = decode_window(window[n, i])
            b = vecK()
            if valid:
                b = basis(local_u[n, i], basis_matrix)
            act = zero
            if use_base:
                act, dact = silu_and_grad(x[n, i])
            for t in range(OT):
                o = o0 + t
                if o < n_out:
                    term = zero
                    if use_base:
                        term = base_weight_t[i, o] * act
                    if valid:
                        term = term + scaler_t[i, o] * window_dot(table, start, o, b)
                    acc[t] = acc[t] + term
        for t in range(OT):
            if o0 + t < n_out:
                y[n, o0 + t] = acc[t]

    return forward


# ---------------------------------------------------------------------- 4. backward

@functools.lru_cache(maxsize=None)
def _backward_x_kernel(order: int, scalar_name: str):
    """dx, one block per row with one block reduction per (row, input). Its module is the combination's
    plus "_rowblock": Warp compiles a module per block size."""
    cfg = _config(order, scalar_name)
    scalar, matK, vecK, zero = cfg.scalar, cfg.matK, cfg.vecK, cfg.zero
    row_block_kernel = _kernel_decorator(cfg.module + "_rowblock")
    maths = _element_funcs(order, scalar_name)
    basis_grad, silu_and_grad = maths.basis_grad, maths.silu_and_grad
    windows = _window_funcs(order, scalar_name)
    decode_window, window_dot = windows.decode_window, windows.window_dot

    @row_block_kernel
    def backward_x(
        dy: wp.array2d(dtype=scalar),
        x: wp.array2d(dtype=scalar),
        window: wp.array2d(dtype=wp.int32),
        local_u: wp.array2d(dtype=scalar),
        table: wp.array2d(dtype=scalar),
        base_weight_t: wp.array2d(dtype=scalar),
        scaler_t: wp.array2d(dtype=scalar),
        inv_h: scalar,
        basis_matrix: matK,
        use_base: int,
        dx: wp.array2d(dtype=scalar),
    ):
        # dx[n, i] += sum_o dy[n, o] (w_b[i, o] silu'(x) + s[i, o] sum_m b'_m table[window + m, o])
        # One block per row, its threads on consecutive outputs (coalesced dy, w_b, s and table loads), one
        # block reduction per (n, i) in a fixed order.
        n, lane = wp.tid()
        lanes = wp.block_dim()
        n_out = dy.shape[1]
        for i in range(x.shape[1]):
            valid, start, sloped = decode_window(window[n, i])
            db = vecK()
            if valid and sloped:
                db = basis_grad(local_u[n, i], inv_h, basis_matrix)
            dact = zero
            if use_base:
                act, dact = silu_and_grad(x[n, i])
            acc = zero
            for o in range(lane, n_out, lanes):
                g = zero
                if use_base:
                    g = base_weight_t[i, o] * dact
                if valid:
                    g = g + scaler_t[i, o] * window_dot(table, start, o, db)
                acc = acc + dy[n, o] * g
            total = wp.tile_extract(wp.tile_sum(wp.tile(acc)), 0)
            if lane == 0:
                dx[n, i] = dx[n, i] + total

    return backward_x


@functools.lru_cache(maxsize=None)
def _backward_rows_kernel(order: int, scalar_name: str):
    """The d base weight and d scaler partials of one chunk of rows (combine_rows adds them up)."""
    cfg = _config(order, scalar_name)
    scalar, matK, zero = cfg.scalar, cfg.matK, cfg.zero
    kernel = _kernel_decorator(cfg.module)
    maths = _element_funcs(order, scalar_name)
    basis, silu_and_grad = maths.basis, maths.silu_and_grad
    windows = _window_funcs(order, scalar_name)
    decode_window, window_dot = windows.decode_window, windows.window_dot

    @kernel
    def backward_rows(
        dy: wp.array2d(dtype=scalar),
        x: wp.array2d(dtype=scalar),
        window: wp.array2d(dtype=wp.int32),
        local_u: wp.array2d(dtype=scalar),
        table: wp.array2d(dtype=scalar),
        basis_matrix: matK,
        rows_per_chunk: int,
        partial_base: wp.array3d(dtype=scalar),
        partial_scaler: wp.array3d(dtype=scalar),
    ):
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
            grad = dy[n, o]
            act, dact = silu_and_grad(x[n, i])
            acc_base = acc_base + grad * act
            valid, w, sloped = decode_window(window[n, i])
            if valid:
                acc_scaler = acc_scaler + grad * window_dot(table, w, o, basis(local_u[n, i], basis_matrix))
        partial_base[chunk, i, o] = acc_base
        partial_scaler[chunk, i, o] = acc_scaler

    return backward_rows


@functools.lru_cache(maxsize=None)
def _backward_table_kernel(order: int, scalar_name: str):
    """The 2K-window sums of the table rows, one thread per (chunk of sorted elements, output)."""
    cfg = _config(order, scalar_name)
    scalar, matK, vec2K, K = cfg.scalar, cfg.matK, cfg.vec2K, cfg.K
    kernel = _kernel_decorator(cfg.module)
    basis = _element_funcs(order, scalar_name).basis
    decode_window = _window_funcs(order, scalar_name).decode_window
    store_window = _row_window_funcs(order, scalar_name).store_window

    @kernel
    def backward_table(
        dy: wp.array2d(dtype=scalar),
        sorted_elem: wp.array(dtype=wp.int32),
        window: wp.array2d(dtype=wp.int32),
        local_u: wp.array2d(dtype=scalar),
        row_start: wp.array(dtype=wp.int32),
        row_stop: wp.array(dtype=wp.int32),
        basis_matrix: matK,
        chunk_size: int,
        row_window: wp.array3d(dtype=scalar),
        head: wp.array3d(dtype=scalar),
        tail: wp.array3d(dtype=scalar),
    ):
        # The 2K-window sum of row p, W_p[r + m] = sum over its elements of dy[n, o] b_m (positions < K
        # belong to C_{g-1} = row p - 1, the rest to C_g = row p), for the rows this chunk of sorted elements
        # meets: into row_window[p] when the row lies inside the chunk, else into head[chunk] (the row began
        # in an earlier chunk) or tail[chunk] (it begins here and goes on).
        tid = wp.tid()
        n_out = dy.shape[1]
        o = tid % n_out
        chunk = tid // n_out
        n_rows = dy.shape[0]
        first = chunk * chunk_size
        stop = wp.min(first + chunk_size, sorted_elem.shape[0])
        current = int(-1)
        acc = vec2K()
        for j in range(first, stop + 1):
            p = int(-1)
            n = int(0)
            i = int(0)
            start = int(0)
            if j < stop:
                e = sorted_elem[j]
                i = e // n_rows
                n = e - i * n_rows
                valid, start, sloped = decode_window(window[n, i])
                if valid:
                    p = start // K + 1
            if p != current:  # flush the finished row (elements past the capacity or NaN end the walk)
                if current >= 0:
                    if row_start[current] >= first and row_stop[current] <= stop:
                        store_window(row_window, current, o, acc)
                    elif row_start[current] < first:
                        store_window(head, chunk, o, acc)
                    else:
                        store_window(tail, chunk, o, acc)
                current = p
                acc = vec2K()
            if p >= 0:
                b = basis(local_u[n, i], basis_matrix) * dy[n, o]
                r = start - (p - 1) * K
                for m in range(K):
                    acc[r + m] = acc[r + m] + b[m]

    return backward_table


@functools.lru_cache(maxsize=None)
def _combine_table_kernel(order: int, scalar_name: str):
    """d table from the window sums of each row and of the row after it, in chunk order."""
    cfg = _config(order, scalar_name)
    scalar, vec2K, K = cfg.scalar, cfg.vec2K, cfg.K
    kernel = _kernel_decorator(cfg.module)
    resolved_window = _row_window_funcs(order, scalar_name).resolved_window

    @kernel
    def combine_table(
        row_start: wp.array(dtype=wp.int32),
        row_stop: wp.array(dtype=wp.int32),
        pair_feature: wp.array(dtype=wp.int32),
        scaler_t: wp.array2d(dtype=scalar),
        chunk_size: int,
        row_window: wp.array3d(dtype=scalar),
        head: wp.array3d(dtype=scalar),
        tail: wp.array3d(dtype=scalar),
        d_table: wp.array2d(dtype=scalar),
    ):
        # d C_p[m, o] = s[i, o] (W_p[K + m] + W_{p+1}[m]): row p + 1, when it has elements, is (i, g + 1)
        tid = wp.tid()
        n_out = d_table.shape[1]
        o = tid % n_out
        p = tid // n_out
        own = resolved_window(p, o, row_start, row_stop, chunk_size, row_window, head, tail)
        after = vec2K()
        if p + 1 < row_start.shape[0]:
            after = resolved_window(p + 1, o, row_start, row_stop, chunk_size, row_window, head, tail)
        s = scaler_t[pair_feature[p], o]
        for m in range(K):
            d_table[p * K + m, o] = d_table[p * K + m, o] + s * (own[K + m] + after[m])

    return combine_table


# ---------------------------------------------------------------------- dense-range path (see module doc)

@functools.lru_cache(maxsize=None)
def _range_init_kernel(order: int, scalar_name: str):
    """The group-range search's starting values."""
    kernel = _kernel_decorator(_config(order, scalar_name).module)
    no_group = wp.int64(_NO_GROUP)

    @kernel
    def range_init(group_lo: wp.array(dtype=wp.int64), group_hi: wp.array(dtype=wp.int64),
                   span_max: wp.array(dtype=wp.int32)):
        i = wp.tid()
        group_lo[i] = no_group
        group_hi[i] = -no_group
        if i == 0:
            span_max[0] = 0

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
        if lo <= hi:
            wp.atomic_min(group_lo, i, lo)
            wp.atomic_max(group_hi, i, hi)

    return range_partial


@functools.lru_cache(maxsize=None)
def _range_finalize_kernel(order: int, scalar_name: str):
    """The widest span of touched groups over the features."""
    kernel = _kernel_decorator(_config(order, scalar_name).module)
    span_cap = wp.int64(_SPAN_CAP)

    @kernel
    def range_finalize(group_lo: wp.array(dtype=wp.int64), group_hi: wp.array(dtype=wp.int64),
                       span_max: wp.array(dtype=wp.int32)):
        # span = groups from the lowest to the highest touched one (a feature without valid input: 1)
        i = wp.tid()
        lo = group_lo[i]
        hi = group_hi[i]
        if lo > hi:
            lo = wp.int64(0)
            hi = wp.int64(0)
            group_lo[i] = lo
        span = wp.min(hi - lo + wp.int64(1), span_cap)
        wp.atomic_max(span_max, 0, int(span))

    return range_finalize


@functools.lru_cache(maxsize=None)
def get_variant(order: int, scalar_name: str = "float32") -> UKANVariant:
    """Build (lazily) the kernels of one (spline order, scalar type); they share one Warp module (the
    block-reduction dx kernel has a module of its own: Warp compiles a module per block size)."""
    cfg = _config(order, scalar_name)
    combination = (order, scalar_name)
    basis_matrix = cfg.matK(*[cfg.scalar(v) for row in uniform_basis_matrix(order) for v in row])
    return UKANVariant(
        order=order,
        scalar=cfg.scalar,
        pair_keys=_pair_keys_kernel(*combination),
        pair_mark=_pair_mark_kernel(*combination),
        pair_fill=_pair_fill_kernel(*combination),
        forward=_forward_kernel(*combination),
        backward_x=_backward_x_kernel(*combination),
        backward_rows=_backward_rows_kernel(*combination),
        combine_rows=combine_rows_kernel(scalar_name),
        backward_table=_backward_table_kernel(*combination),
        combine_table=_combine_table_kernel(*combination),
        range_init=_range_init_kernel(*combination),
        range_partial=_range_partial_kernel(*combination),
        range_finalize=_range_finalize_kernel(*combination),
        basis_matrix=basis_matrix,
        module=cfg.module,
    )




def _check_h(grid_delta) -> float:
    return _checks.positive_number("grid_delta", grid_delta)





# ---------------------------------------------------------------------- 1. pairs
@dataclass
class PairBuffers:
    """Where the touched-pair search leaves its results. Every size is a function of the shapes and the
    capacity; the pair arrays must be zeroed by the caller (padding rows: feature 0, group 0, no elements)."""

    sorted_elem: wp.array  # [N * in] int32: elements e = i * N + n in (feature, group, n) order
    window: wp.array  # [N, in] int32: first table row ([P * K, out] view) of the element's window, coded
    local_u: wp.array  # [N, in] scalar: local coordinate u in [0, 1)
    pair_feature: wp.array  # [capacity] int32
    pair_group: wp.array  # [capacity] int64
    row_start: wp.array  # [capacity] int32: the sorted elements of row p are sorted_elem[row_start[p]:row_stop[p]]
    row_stop: wp.array  # [capacity] int32
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
            outputs=[out.sorted_elem, out.window, out.pair_feature, out.pair_group, out.row_start,
                     out.row_stop, out.rows_needed],
            device=device,
            record_tape=False,
        )


# ---------------------------------------------------------------------- 3./4. spline forward and backward
def _check_spline_args(x, window, local_u, table, base_weight_t, scaler_t, order):
    n_rows, n_in = x.shape
    n_out = scaler_t.shape[1]
    K = order + 1
    if table.ndim != 2 or table.shape[1] != n_out or table.shape[0] % K:
        raise ValueError(f"table must have shape [P * {K}, {n_out}], got {tuple(table.shape)}")
    expected = {"window": (n_rows, n_in), "local_u": (n_rows, n_in), "base_weight_t": (n_in, n_out),
                "scaler_t": (n_in, n_out)}
    arrays = (("window", window), ("local_u", local_u), ("table", table), ("base_weight_t", base_weight_t),
              ("scaler_t", scaler_t))
    for name, arr in arrays:
        if name in expected and tuple(arr.shape) != expected[name]:
            raise ValueError(f"{name} must have shape {expected[name]}, got {tuple(arr.shape)}")
        if arr.device != x.device:
            raise ValueError(f"{name} must be on the device of x ({x.device}), got {arr.device}")
        want = wp.int32 if name == "window" else x.dtype
        if arr.dtype != want:
            raise TypeError(f"{name} must have dtype {wp.types.type_repr(want)}, got {wp.types.type_repr(arr.dtype)}")


def launch_forward(x, window, local_u, table, base_weight_t, scaler_t, y, order, use_base=True, stream=None):
    """y [N, out] = sum_i base_weight_t[i, o] silu(x) + scaler_t[i, o] spline_io(x), the spline reading its
    window from ``table`` [P * K, out] (the pair search's ``window`` and ``local_u``). Overwrites y."""
    _check_spline_args(x, window, local_u, table, base_weight_t, scaler_t, order)
    variant = get_variant(order, scalar_name(x))
    n_rows, n_in = x.shape
    n_out = y.shape[1]
    if n_rows == 0 or n_out == 0:
        return
    if n_in == 0:
        y.zero_()
        return
    n_tiles = (n_out + _OUT_TILE - 1) // _OUT_TILE
    wp.launch(
        variant.forward,
        dim=n_rows * n_tiles,
        inputs=[x, window, local_u, table, base_weight_t, scaler_t, variant.basis_matrix, int(use_base)],
        outputs=[y],
        device=x.device,
        stream=stream,
        record_tape=False,
    )


def table_chunk(n_entries: int, n_out: int) -> int:
    """Sorted elements per chunk of the d_table segmented reduction: about _TARGET_TABLE_THREADS threads
    (chunks x outputs), so the head/tail partials stay a few MiB; a function of the shapes alone."""
    want = -(-n_entries * max(n_out, 1) // _TARGET_TABLE_THREADS)
    return max(_MIN_TABLE_CHUNK, min(_MAX_TABLE_CHUNK, want))


def launch_backward(
    dy, x, pairs: PairBuffers, table, base_weight_t, scaler_t, grid_delta, order, use_base=True,
    dx=None, d_base_weight_t=None, d_scaler_t=None, d_table=None, partials=None, stream=None,
):
    """Accumulate (+=) the gradients of :func:`launch_forward` into whichever of dx, d_base_weight_t,
    d_scaler_t (these two together) and d_table ([P * K, out]) are given. ``partials(name, shape, dtype)``
    returns scratch (default: fresh Warp arrays)."""
    h = _check_h(grid_delta)
    _check_spline_args(x, pairs.window, pairs.local_u, table, base_weight_t, scaler_t, order)
    variant = get_variant(order, scalar_name(x))
    device = x.device
    n_rows, n_in = x.shape
    n_out = scaler_t.shape[1]
    K = order + 1
    capacity = table.shape[0] // K
    if n_rows == 0 or n_in == 0 or n_out == 0:
        return
    if tuple(dy.shape) != (n_rows, n_out):
        raise ValueError(f"dy must have shape {(n_rows, n_out)}, got {tuple(dy.shape)}")
    bm = variant.basis_matrix
    scalar = variant.scalar
    if partials is None:
        def partials(name, shape, dtype):
            return wp.empty(shape, dtype=dtype, device=device)

    with on_stream(stream):
        if dx is not None:
            block = _ROW_BLOCK if device.is_cuda else 1
            wp.launch(variant.backward_x, dim=(n_rows, block),
                      inputs=[dy, x, pairs.window, pairs.local_u, table, base_weight_t, scaler_t,
                              scalar(1.0 / h), bm, int(use_base)],
                      outputs=[dx], device=device, block_dim=block, record_tape=False)
        if d_base_weight_t is not None or d_scaler_t is not None:
            if d_base_weight_t is None or d_scaler_t is None:
                raise ValueError("d_base_weight_t and d_scaler_t must be given together")
            n_chunks, rows_per_chunk = row_chunks(n_rows, n_in, n_out)
            partial_base = partials("partial_base", (n_chunks, n_in, n_out), scalar)
            partial_scaler = partials("partial_scaler", (n_chunks, n_in, n_out), scalar)
            wp.launch(variant.backward_rows, dim=n_chunks * n_in * n_out,
                      inputs=[dy, x, pairs.window, pairs.local_u, table, bm, rows_per_chunk],
                      outputs=[partial_base, partial_scaler], device=device, record_tape=False)
            wp.launch(variant.combine_rows, dim=(n_in, n_out),
                      inputs=[partial_base, partial_scaler, int(use_base)],
                      outputs=[d_base_weight_t, d_scaler_t], device=device, record_tape=False)
        if d_table is not None and capacity > 0:
            n_entries = n_rows * n_in
            chunk = table_chunk(n_entries, n_out)
            n_chunks = -(-n_entries // chunk)
            row_window = partials("row_window", (capacity, 2 * K, n_out), scalar)
            head = partials("head", (n_chunks, 2 * K, n_out), scalar)
            tail = partials("tail", (n_chunks, 2 * K, n_out), scalar)
            wp.launch(variant.backward_table, dim=n_chunks * n_out,
                      inputs=[dy, pairs.sorted_elem, pairs.window, pairs.local_u, pairs.row_start,
                              pairs.row_stop, bm, chunk],
                      outputs=[row_window, head, tail], device=device, record_tape=False)
            wp.launch(variant.combine_table, dim=capacity * n_out,
                      inputs=[pairs.row_start, pairs.row_stop, pairs.pair_feature, scaler_t, chunk, row_window,
                              head, tail],
                      outputs=[d_table], device=device, record_tape=False)


# ---------------------------------------------------------------------- dense-range path
_RANGE_THREADS = 1 << 17  # parallelism aimed at by the group-range search
_MIN_RANGE_ROWS = 16


def _launch(kernel, dim, inputs, device, stream, record):
    """One launch, or (record=True) its recorded command in a list, for a caller's launch cache."""
    if record:
        return [wp.launch(kernel, dim=dim, inputs=inputs, device=device, record_tape=False, record_cmd=True)]
    wp.launch(kernel, dim=dim, inputs=inputs, device=device, stream=stream, record_tape=False)
    return []


def launch_group_range(x, group_lo, group_hi, span_max, grid_delta, order, stream=None, record=False):
    """Per feature i, the lowest group its valid inputs touch (``group_lo[i]``, int64) and, in
    ``span_max[0]`` (int32), the most groups any feature spans from its lowest to its highest touched one
    (capped at 2^30). NaN is ignored; a feature without valid input gets group 0 and span 1. ``group_hi`` is
    scratch [in] int64. Nothing is read back."""
    h = _check_h(grid_delta)
    variant = get_variant(order, scalar_name(x))
    n_rows, n_in = x.shape
    device = x.device
    if n_in == 0:
        span_max.zero_()
        return []
    rows_per_chunk = max(_MIN_RANGE_ROWS, -(-n_rows * n_in // _RANGE_THREADS))
    n_chunks = -(-n_rows // rows_per_chunk)
    cmds = []
    with on_stream(stream):
        cmds += _launch(variant.range_init, n_in, [group_lo, group_hi, span_max], device, stream, record)
        if n_chunks > 0:
            cmds += _launch(variant.range_partial, n_chunks * n_in, [x, h, rows_per_chunk, group_lo, group_hi],
                            device, stream, record)
        cmds += _launch(variant.range_finalize, n_in, [group_lo, group_hi, span_max], device, stream, record)
    return cmds


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
    reorder_table: wp.Kernel
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
    """The CG-MLP kernels' silu_and_grad: the spline kernels' (see _element_funcs), as a @wp.func of its own so
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
        pre: wp.array2d(dtype=scalar),
        out: wp.array2d(dtype=scalar),
    ):
        # pre[p, b] = bias[b] + sum_a inp[p, a] weight[b, a]; out = silu(pre) or pre
        p, b = wp.tid()
        acc = bias[b]
        for a in range(inp.shape[1]):
            acc = acc + inp[p, a] * weight[b, a]
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
        d_in: wp.array2d(dtype=scalar),
    ):
        # d_in[p, a] = (sum_b d_out[p, b] weight[b, a]) * silu'(pre_in[p, a]) when the input was a SiLU output
        p, a = wp.tid()
        acc = zero
        for b in range(d_out.shape[1]):
            acc = acc + d_out[p, b] * weight[b, a]
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
    def dense_combine(partial: wp.array3d(dtype=scalar), d_weight: wp.array2d(dtype=scalar),
                      d_bias: wp.array(dtype=scalar)):
        b, a = wp.tid()
        acc = zero
        for chunk in range(partial.shape[0]):  # fixed order: deterministic
            acc = acc + partial[chunk, b, a]
        if a < d_weight.shape[1]:
            d_weight[b, a] = d_weight[b, a] + acc
        else:
            d_bias[b] = d_bias[b] + acc

    return dense_combine


@functools.lru_cache(maxsize=None)
def _embedding_backward_kernel(scalar_name: str):
    """The feature embedding's gradient: each feature's table rows summed in order."""
    scalar = SCALARS[scalar_name]
    kernel = _mlp_kernel_decorator(scalar_name)
    zero = scalar(0.0)

    # the first index of the sorted values[:count] whose value is not below target (count when there is none)
    @wp.func
    def lower_bound(values: wp.array(dtype=wp.int32), count: int, target: int):
        lo = int(0)
        hi = count
        while lo < hi:
            mid = (lo + hi) // 2
            if values[mid] < target:
                lo = mid + 1
            else:
                hi = mid
        return lo

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
        start = lower_bound(pair_feature, used, i)
        stop = lower_bound(pair_feature, used, i + 1)
        acc = zero
        for p in range(start, stop):
            acc = acc + d_features[p, pe_dim + e]
        d_embedding[i, e] = d_embedding[i, e] + acc

    return embedding_backward


@functools.lru_cache(maxsize=None)
def _reorder_table_kernel(scalar_name: str):
    """The CG-MLP output's (o, m) order <-> the spline kernels' table layout."""
    scalar = SCALARS[scalar_name]
    kernel = _mlp_kernel_decorator(scalar_name)

    @kernel
    def reorder_table(by_output: wp.array2d(dtype=scalar), K: int, to_kernel_order: int,
                      by_basis: wp.array2d(dtype=scalar)):
        # the MLP's [P, out * K] rows in (o, m) order <-> the spline kernels' [P * K, out]
        p, b = wp.tid()
        o = b // K
        m = b - o * K
        if to_kernel_order:
            by_basis[p * K + m, o] = by_output[p, b]
        else:
            by_output[p, b] = by_basis[p * K + m, o]

    return reorder_table


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
            if q < n_b * n_h:
                d_w_out[q // n_h, q - (q // n_h) * n_h] = acc
            elif q < n_b * n_h + n_b:
                d_b_out[q - n_b * n_h] = acc
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
                        _reorder_table_kernel(scalar_name), _range_features_kernel(scalar_name),
                        _range_param_partials_kernel(scalar_name), _range_param_combine_kernel(scalar_name))


def launch_reorder_table(by_output, by_basis, order, to_kernel_order: bool, stream=None):
    """Copy the CG-MLP output [P, out * K] ((o, m) order) into the kernels' table [P * K, out], or back."""
    variant = get_dense_variant(scalar_name(by_output, "by_output"))
    if by_output.shape[0] == 0 or by_output.shape[1] == 0:
        return
    wp.launch(variant.reorder_table, dim=tuple(by_output.shape),
              inputs=[by_output, order + 1, int(to_kernel_order)], outputs=[by_basis], device=by_output.device,
              stream=stream, record_tape=False)


def launch_features(pair_feature, pair_group, embedding, pe_dim, out, stream=None):
    variant = get_dense_variant(scalar_name(embedding, "embedding"))
    if out.shape[0] == 0:
        return
    wp.launch(variant.features, dim=tuple(out.shape), inputs=[pair_feature, pair_group, embedding, int(pe_dim)],
              outputs=[out], device=out.device, stream=stream, record_tape=False)


def launch_dense_forward(inp, weight, bias, apply_silu, pre, out, stream=None):
    variant = get_dense_variant(scalar_name(inp, "inp"))
    if out.shape[0] == 0:
        return
    wp.launch(variant.dense_forward, dim=tuple(out.shape), inputs=[inp, weight, bias, int(apply_silu)],
              outputs=[pre, out], device=out.device, stream=stream, record_tape=False)


def launch_dense_backward(d_out, inp, weight, d_weight, d_bias, d_in=None, pre_in=None, silu_in=False,
                          partials=None, stream=None):
    """Accumulate d_weight, d_bias (chunked partials + fixed-order combine); write d_in (not accumulated)
    when given, multiplied by silu'(pre_in) when ``silu_in``."""
    variant = get_dense_variant(scalar_name(inp, "inp"))
    device = inp.device
    n_rows, n_in = inp.shape
    n_out = d_out.shape[1]
    if n_rows == 0:
        return
    with on_stream(stream):
        if d_in is not None:
            wp.launch(variant.dense_backward_input, dim=(n_rows, n_in),
                      inputs=[d_out, weight, pre_in if pre_in is not None else d_in, int(silu_in)],
                      outputs=[d_in], device=device, record_tape=False)
        n_chunks, rows_per_chunk = row_chunks(n_rows, n_out, n_in + 1)
        shape = (n_chunks, n_out, n_in + 1)
        partial = partials("dense_partial", shape, variant.scalar) if partials else wp.empty(shape, dtype=variant.scalar, device=device)
        wp.launch(variant.dense_backward_params, dim=shape, inputs=[d_out, inp, rows_per_chunk], outputs=[partial],
                  device=device, record_tape=False)
        wp.launch(variant.dense_combine, dim=(n_out, n_in + 1), inputs=[partial], outputs=[d_weight, d_bias],
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
            + _launch(variant.dense_forward, tuple(pre.shape), [features, w_hidden, b_hidden, 1, pre, hidden],
                      features.device, stream, record))


def launch_range_mlp_forward(group_lo, embedding, w_hidden, b_hidden, w_out, b_out, features, pre, hidden, table,
                             pe_dim, stream=None, record=False):
    """The CG-MLP on the dense range: table [in Rt, B] = w_out silu(w_hidden f + b_hidden) + b_out, where the
    input row f of row i Rt + j (``features`` [in Rt, pe_dim + E]) is (the encoding of group
    group_lo[i] - 1 + j, embedding[i]). Also writes the pre-activations and the hidden activations [in Rt, H].
    Three launches, none of them a torch op: at small N, the chain of torch ops this replaces cost as much
    host time per step as the whole spline."""
    variant = get_dense_variant(scalar_name(table, "table"))
    if table.shape[0] == 0 or table.shape[1] == 0:
        return []
    device = table.device
    return (_range_rows(variant, group_lo, embedding, w_hidden, b_hidden, features, pre, hidden, pe_dim, stream,
                        record)
            + _launch(variant.dense_forward, tuple(table.shape), [hidden, w_out, b_out, 0, table, table], device,
                      stream, record))


def launch_range_mlp_backward(d_table, group_lo, embedding, w_hidden, b_hidden, w_out, features, pre, hidden, d_pre,
                              d_features, partial, d_w_out, d_b_out, d_w_hidden, d_b_hidden, d_embedding, pe_dim,
                              recompute=True, stream=None, record=False):
    """Every parameter gradient of :func:`launch_range_mlp_forward` from d_table [in Rt, B] (Rt >= 1),
    written, not accumulated, with fixed-order sums (deterministic). ``d_pre`` and ``partial``
    (:func:`range_mlp_partial_shape`) are scratch; ``features``, ``pre`` and ``hidden`` are the forward's
    (``recompute=False``) or scratch that the forward's launches fill again (``recompute=True``).
    ``d_features`` (the input rows' gradient, shaped as ``features``) is scratch too."""
    variant = get_dense_variant(scalar_name(d_table, "d_table"))
    if d_table.shape[0] == 0:
        return []
    rows = d_table.shape[0] // group_lo.shape[0]
    device = d_table.device
    partial_args = [d_table, hidden, d_pre, features, _RANGE_ROWS_PER_CHUNK, partial]
    combine_args = [partial, d_features, rows, int(pe_dim), d_w_out, d_b_out, d_w_hidden, d_b_hidden, d_embedding]
    n_entries = partial.shape[1] + d_embedding.shape[0] * d_embedding.shape[1]
    cmds = []
    if recompute:
        cmds = _range_rows(variant, group_lo, embedding, w_hidden, b_hidden, features, pre, hidden, pe_dim, stream,
                           record)
    return (cmds
            + _launch(variant.dense_backward_input, tuple(d_pre.shape), [d_table, w_out, pre, 1, d_pre], device,
                      stream, record)
            + _launch(variant.range_param_partials, tuple(partial.shape), partial_args, device, stream, record)
            + _launch(variant.dense_backward_input, tuple(d_features.shape), [d_pre, w_hidden, d_pre, 0, d_features],
                      device, stream, record)
            + _launch(variant.range_param_combine, (n_entries,), combine_args, device, stream, record))
