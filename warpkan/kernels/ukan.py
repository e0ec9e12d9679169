"""UKAN kernels in pure Warp (no torch import): a B-spline on an unbounded uniform grid whose coefficients
come from a coefficient-generator MLP (CG-MLP), evaluated without ever materialising per-sample coefficients.

Maths (K = k + 1). For input x of feature i: ``s = x / h``, cell ``c = floor(s)``, group ``g = floor(c / K)``,
offset ``r = c - g K`` (in [0, K) for negative x too), local coordinate ``u = s - c``. The CG-MLP maps
(feature i, group g) to ``C_g`` [out, K]; the K coefficients of the cell are the window
``[C_{g-1}; C_g][r : r + K]`` and ``spline_io(x) = [1 u .. u^k] M_k window`` (``M_k`` from
:func:`warpkan.kernels.bspline.uniform_basis_matrix`). In flat terms, basis ``B_b`` (support
``[b h, (b + K) h)``) has coefficient ``C_flat[b - 1]`` with ``C_flat[q] = C_{floor(q/K)}[q mod K]``.

Unbounded inputs. ``s`` is formed in float64 whatever the I/O dtype and clamped to ``[-CELL_LIMIT,
CELL_LIMIT]`` (2^39 cells) before the integer conversion, so group indices never overflow and ``u`` keeps
full precision at |x| = 1e6. Inputs past the limit (|x| > 2^39 h, and +-Inf) are evaluated at the limit and
have zero spline derivative. NaN inputs get a zero spline term.

The pipeline (the forward needs one host read-back: the size of the coefficient table):

1. **Touched pairs.** Key every element (n, i) by (i, g) in an int64 (``i * 2^41 + g + 2^40``; NaN gets a
   sentinel past every feature), stable radix sort, mark the first element of each distinct key, and give it
   one table row, plus one for (i, g - 1) when that group is not itself touched. An inclusive scan gives
   every element its table row (``slot``); the rows are sorted by (feature, group), so the row of
   ``C_{g-1}`` is always ``slot - 1``, and each row records the range of sorted elements that use it.
2. **CG-MLP** on the P table rows only: ``table [P, out, K]``. The torch bridge runs it with torch (a dense
   GEMM); the Warp-native layer uses the SIMT dense kernels at the bottom of this file.
3. **Spline forward**: one thread per (n, 4 outputs), looping over inputs, reading two table rows.
4. **Backward**: dx per (n, i); d base weight / d scaler by row chunks into partial buffers and a fixed-order
   combine; d table by threads per (split, row, output), each gathering a fixed slice of the sorted elements
   of its own row and of the next row (whose window reaches back into it), into partials that a second pass
   adds in a fixed order (the split count depends on the shapes only). No floating-point atomics anywhere
   and the sort is stable, so every gradient is bitwise reproducible (there is no separate non-deterministic mode).
"""

import functools
from dataclasses import dataclass

import numpy as np
import warp as wp

from .bspline import MAX_SPLINE_ORDER, basis_funcs, combine_rows_kernel, row_chunks, silu_func

__all__ = [
    "CELL_LIMIT",
    "UKANVariant",
    "PairBuffers",
    "get_variant",
    "get_dense_variant",
    "pair_scratch",
    "launch_pairs",
    "launch_forward",
    "launch_backward",
    "launch_features",
    "launch_dense_forward",
    "launch_dense_backward",
    "launch_embedding_backward",
    "PE_BASE",
    "table_splits",
]

CELL_LIMIT = float(2**39)  # |x / h| is clamped here: |g| < 2^39, so keys and g - 1 fit comfortably in int64
_GROUP_BIAS = 2**40  # g + bias > 0 for every clamped g (and g - 1)
_FEATURE_STRIDE = 2**41  # key = i * stride + g + bias
PE_BASE = 10000.0  # sinusoidal encoding frequencies: PE_BASE^(-2j / pe_dim)
_OUT_TILE = 4
_TARGET_TABLE_THREADS = 1 << 17  # parallelism aimed at by the d_table gather

_SCALARS = {"float32": wp.float32, "float64": wp.float64}


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
    basis_matrix: object
    module: str


@functools.lru_cache(maxsize=None)
def get_variant(order: int, scalar_name: str = "float32") -> UKANVariant:
    """Build (lazily) the kernels of one (spline order, scalar type); they share one Warp module."""
    if not 1 <= order <= MAX_SPLINE_ORDER:
        raise ValueError(f"spline_order must be in [1, {MAX_SPLINE_ORDER}], got {order}")
    if scalar_name not in _SCALARS:
        raise TypeError(f"scalar type must be one of {sorted(_SCALARS)}, got {scalar_name}")
    scalar = _SCALARS[scalar_name]
    K = order + 1
    OT = _OUT_TILE
    shared = basis_funcs(order, scalar_name)  # the matrix-form basis pieces of the B-spline kernels
    vecK, matK = shared.vec, shared.mat
    vecOT = wp.types.vector(length=OT, dtype=scalar)
    module = f"warpkan_ukan_k{order}_{scalar_name}"
    kernel = functools.partial(wp.kernel, enable_backward=False, module=module)
    zero = scalar(0.0)
    one = scalar(1.0)
    limit = wp.float64(CELL_LIMIT)
    stride = wp.int64(_FEATURE_STRIDE)
    bias = wp.int64(_GROUP_BIAS)
    # separate constants per type: converting the int constant K inside a kernel (wp.int64(K)) retypes it
    # for the rest of the function in Warp 1.19
    K64 = wp.int64(K)
    KF = wp.float64(K)

    # ------------------------------------------------------------------ per-element maths (@wp.func)
    silu_and_grad = shared.silu_and_grad
    basis = shared.uniform_basis  # (u, M) -> the K bases
    basis_grad = shared.uniform_basis_grad  # (u, du/dx, M) -> their x-derivatives

    @wp.func
    def locate(x: scalar, h: wp.float64):
        """(valid, g, r, u, du/dx): group, offset and local coordinate of x on the unbounded grid."""
        s = wp.float64(x) / h
        du_dx = scalar(wp.float64(1.0) / h)
        if wp.isnan(s):
            return int(0), wp.int64(0), int(0), zero, zero
        if s > limit:
            s = limit
            du_dx = zero
        if s < -limit:
            s = -limit
            du_dx = zero
        cf = wp.floor(s)
        u = scalar(s - cf)
        c = wp.int64(cf)
        g = wp.int64(wp.floor(cf / KF))  # exact: |c| <= 2^39 and c / K is >= 1/K from an integer
        r = int(c - g * K64)
        if r < 0:  # guards only; the float division above already rounds correctly
            r = r + K
            g = g - wp.int64(1)
        if r >= K:
            r = r - K
            g = g + wp.int64(1)
        return int(1), g, r, u, du_dx

    @wp.func
    def window_dot(table: wp.array3d(dtype=scalar), slot: int, o: int, r: int, b: vecK):
        """sum_m b_m [C_{g-1}; C_g][r + m]: rows slot - 1 and slot of the table."""
        acc = zero
        for m in range(K):
            idx = r + m
            if idx < K:
                acc = acc + b[m] * table[slot - 1, o, idx]
            else:
                acc = acc + b[m] * table[slot, o, idx - K]
        return acc

    # ------------------------------------------------------------------ 1. touched (feature, group) pairs
    @kernel
    def pair_keys(
        x: wp.array2d(dtype=scalar),
        h: wp.float64,
        keys: wp.array(dtype=wp.int64),
        elems: wp.array(dtype=wp.int32),
    ):
        # element e = i * N + n, so the stable sort orders equal keys by row index
        i, n = wp.tid()
        e = i * x.shape[0] + n
        valid, g, r, u, du_dx = locate(x[n, i], h)
        key = wp.int64(x.shape[1]) * stride  # NaN: sorts after every feature, gets no table row
        if valid:
            key = wp.int64(i) * stride + g + bias
        keys[e] = key
        elems[e] = e

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

    @kernel
    def pair_fill(
        keys: wp.array(dtype=wp.int64),
        elems: wp.array(dtype=wp.int32),
        rows_needed: wp.array(dtype=wp.int32),
        row_end: wp.array(dtype=wp.int32),
        sentinel: wp.int64,
        n_rows: int,
        n_in: int,
        sorted_elem: wp.array(dtype=wp.int32),
        slot: wp.array2d(dtype=wp.int32),
        pair_feature: wp.array(dtype=wp.int32),
        pair_group: wp.array(dtype=wp.int64),
        row_start: wp.array(dtype=wp.int32),
        row_stop: wp.array(dtype=wp.int32),
    ):
        j = wp.tid()
        key = keys[j]
        e = elems[j]
        sorted_elem[j] = e
        i = e // n_rows
        n = e - i * n_rows
        if key >= sentinel:
            slot[n, i] = -1
            return
        row = row_end[j] - 1
        slot[n, i] = row
        need = rows_needed[j]
        if need > 0:
            g = key - wp.int64(i) * stride - bias
            pair_feature[row] = i
            pair_group[row] = g
            row_start[row] = j
            if need == 2:
                pair_feature[row - 1] = i
                pair_group[row - 1] = g - wp.int64(1)
                row_start[row - 1] = j
                row_stop[row - 1] = j
        last = j == keys.shape[0] - 1
        if not last:
            last = keys[j + 1] != key
        if last:
            row_stop[row] = j + 1

    # ------------------------------------------------------------------ 3. spline forward
    @kernel
    def forward(
        x: wp.array2d(dtype=scalar),
        slot: wp.array2d(dtype=wp.int32),
        table: wp.array3d(dtype=scalar),
        base_weight_t: wp.array2d(dtype=scalar),
        scaler_t: wp.array2d(dtype=scalar),
        h: wp.float64,
        basis_matrix: matK,
        use_base: int,
        y: wp.array2d(dtype=scalar),
    ):
        tid = wp.tid()
        n_out = y.shape[1]
        n_tiles = (n_out + OT - 1) // OT
        n = tid // n_tiles
        o0 = (tid - n * n_tiles) * OT
        acc = vecOT()
        for i in range(x.shape[1]):
            xv = x[n, i]
            valid, g, r, u, du_dx = locate(xv, h)
            p = slot[n, i]
            b = basis(u, basis_matrix)
            act = zero
            if use_base:
                act, dact = silu_and_grad(xv)
            for t in range(OT):
                o = o0 + t
                if o < n_out:
                    term = zero
                    if use_base:
                        term = base_weight_t[i, o] * act
                    if valid:
                        term = term + scaler_t[i, o] * window_dot(table, p, o, r, b)
                    acc[t] = acc[t] + term
        for t in range(OT):
            if o0 + t < n_out:
                y[n, o0 + t] = acc[t]

    # ------------------------------------------------------------------ 4. backward
    @kernel
    def backward_x(
        dy: wp.array2d(dtype=scalar),
        x: wp.array2d(dtype=scalar),
        slot: wp.array2d(dtype=wp.int32),
        table: wp.array3d(dtype=scalar),
        base_weight_t: wp.array2d(dtype=scalar),
        scaler_t: wp.array2d(dtype=scalar),
        h: wp.float64,
        basis_matrix: matK,
        use_base: int,
        dx: wp.array2d(dtype=scalar),
    ):
        tid = wp.tid()
        n_in = x.shape[1]
        n = tid // n_in
        i = tid - n * n_in
        xv = x[n, i]
        valid, g, r, u, du_dx = locate(xv, h)
        p = slot[n, i]
        db = basis_grad(u, du_dx, basis_matrix)
        act = zero
        dact = zero
        if use_base:
            act, dact = silu_and_grad(xv)
        acc = zero
        for o in range(dy.shape[1]):
            grad = zero
            if use_base:
                grad = base_weight_t[i, o] * dact
            if valid:
                grad = grad + scaler_t[i, o] * window_dot(table, p, o, r, db)
            acc = acc + dy[n, o] * grad
        dx[n, i] = dx[n, i] + acc

    @kernel
    def backward_rows(
        dy: wp.array2d(dtype=scalar),
        x: wp.array2d(dtype=scalar),
        slot: wp.array2d(dtype=wp.int32),
        table: wp.array3d(dtype=scalar),
        h: wp.float64,
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
            xv = x[n, i]
            grad = dy[n, o]
            act, dact = silu_and_grad(xv)
            acc_base = acc_base + grad * act
            valid, g, r, u, du_dx = locate(xv, h)
            if valid:
                acc_scaler = acc_scaler + grad * window_dot(table, slot[n, i], o, r, basis(u, basis_matrix))
        partial_base[chunk, i, o] = acc_base
        partial_scaler[chunk, i, o] = acc_scaler

    combine_rows = combine_rows_kernel(scalar_name)

    @wp.func
    def gather_row(
        dy: wp.array2d(dtype=scalar),
        x: wp.array2d(dtype=scalar),
        sorted_elem: wp.array(dtype=wp.int32),
        start: int,
        stop: int,
        o: int,
        h: wp.float64,
        basis_matrix: matK,
        as_current: int,
        acc: vecK,
    ):
        """Add the window contributions of the sorted elements [start, stop) to the K coefficients of one
        row: as C_g (window positions >= K) when ``as_current``, else as C_{g-1} (positions < K)."""
        n_rows = x.shape[0]
        for j in range(start, stop):
            e = sorted_elem[j]
            i = e // n_rows
            n = e - i * n_rows
            valid, g, r, u, du_dx = locate(x[n, i], h)
            b = basis(u, basis_matrix) * dy[n, o]
            for m in range(K):
                idx = r + m
                if as_current:
                    if idx >= K:
                        acc[idx - K] = acc[idx - K] + b[m]
                else:
                    if idx < K:
                        acc[idx] = acc[idx] + b[m]
        return acc

    @wp.func
    def split_range(start: int, stop: int, split: int, n_splits: int):
        length = stop - start
        return start + (length * split) // n_splits, start + (length * (split + 1)) // n_splits

    @kernel
    def backward_table(
        dy: wp.array2d(dtype=scalar),
        x: wp.array2d(dtype=scalar),
        sorted_elem: wp.array(dtype=wp.int32),
        pair_feature: wp.array(dtype=wp.int32),
        pair_group: wp.array(dtype=wp.int64),
        row_start: wp.array(dtype=wp.int32),
        row_stop: wp.array(dtype=wp.int32),
        h: wp.float64,
        basis_matrix: matK,
        partial: wp.array4d(dtype=scalar),
    ):
        # partial[split, p, o, :] = this split's share of (the C_g contributions of row p's elements
        #                           + the C_{g-1} contributions of row p + 1's elements)
        split, p, o = wp.tid()
        n_splits = partial.shape[0]
        i = pair_feature[p]
        acc = vecK()
        lo, hi = split_range(row_start[p], row_stop[p], split, n_splits)
        acc = gather_row(dy, x, sorted_elem, lo, hi, o, h, basis_matrix, 1, acc)
        q = p + 1
        if q < partial.shape[1]:
            if pair_feature[q] == i and pair_group[q] == pair_group[p] + wp.int64(1):
                lo, hi = split_range(row_start[q], row_stop[q], split, n_splits)
                acc = gather_row(dy, x, sorted_elem, lo, hi, o, h, basis_matrix, 0, acc)
        for m in range(K):
            partial[split, p, o, m] = acc[m]

    @kernel
    def combine_table(
        partial: wp.array4d(dtype=scalar),
        pair_feature: wp.array(dtype=wp.int32),
        scaler_t: wp.array2d(dtype=scalar),
        d_table: wp.array3d(dtype=scalar),
    ):
        p, o, m = wp.tid()
        acc = zero
        for split in range(partial.shape[0]):  # fixed order: deterministic
            acc = acc + partial[split, p, o, m]
        d_table[p, o, m] = d_table[p, o, m] + scaler_t[pair_feature[p], o] * acc

    basis_matrix = shared.basis_matrix
    return UKANVariant(
        order=order,
        scalar=scalar,
        pair_keys=pair_keys,
        pair_mark=pair_mark,
        pair_fill=pair_fill,
        forward=forward,
        backward_x=backward_x,
        backward_rows=backward_rows,
        combine_rows=combine_rows,
        backward_table=backward_table,
        combine_table=combine_table,
        basis_matrix=basis_matrix,
        module=module,
    )


def _scalar_name(array: wp.array, name: str = "x") -> str:
    if array.dtype == wp.float32:
        return "float32"
    if array.dtype == wp.float64:
        return "float64"
    raise TypeError(f"{name} must be float32 or float64, got {wp.types.type_repr(array.dtype)}")


def _check_h(grid_delta) -> float:
    h = float(grid_delta)
    if not (h > 0.0 and np.isfinite(h)):
        raise ValueError(f"grid_delta must be a positive finite number, got {grid_delta!r}")
    return h


class _null_context:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _on(stream):
    # sync_enter=False: the caller's stream already orders our work (and stays graph-capturable)
    return wp.ScopedStream(stream, sync_enter=False) if stream is not None else _null_context()


# ---------------------------------------------------------------------- 1. pairs
@dataclass
class PairBuffers:
    """Where the touched-pair search leaves its results (allocated by the caller once P is known)."""

    sorted_elem: wp.array  # [N * in] int32: elements e = i * N + n in (feature, group, n) order
    slot: wp.array  # [N, in] int32: table row of C_g for element (n, i); -1 for NaN
    pair_feature: wp.array  # [P] int32
    pair_group: wp.array  # [P] int64
    row_start: wp.array  # [P] int32: the sorted elements of row p are sorted_elem[row_start[p]:row_stop[p]]
    row_stop: wp.array  # [P] int32


def pair_scratch(n_entries: int) -> dict:
    """Scratch arrays of :func:`launch_pairs` as name -> (shape, Warp dtype); the sort needs 2x room."""
    return {
        "keys": ((2 * n_entries,), wp.int64),
        "elems": ((2 * n_entries,), wp.int32),
        "rows_needed": ((n_entries,), wp.int32),
        "row_end": ((n_entries,), wp.int32),
    }


def launch_pairs(x, grid_delta, order, scratch: dict, allocate, stream=None) -> PairBuffers:
    """Find the distinct (feature, group) pairs that x [N, in] touches, plus the (feature, group - 1) pairs
    their windows reach back into, sorted by (feature, group).

    ``scratch`` holds the arrays named by :func:`pair_scratch`; ``allocate(name, shape, wp_dtype)`` returns a
    new array for each output once the number of rows P is known. This reads P back to the host (one
    synchronisation): the table's size depends on the data."""
    h = _check_h(grid_delta)
    variant = get_variant(order, _scalar_name(x))
    n_rows, n_in = x.shape
    n_entries = n_rows * n_in
    if n_entries >= 2**31 or n_in >= 2**21:
        raise ValueError(f"too large for the int32 pair search: {n_rows} rows x {n_in} features")
    device = x.device
    sentinel = wp.int64(n_in * _FEATURE_STRIDE)
    with _on(stream):
        if n_entries == 0:
            n_pairs = 0
        else:
            keys, elems = scratch["keys"], scratch["elems"]
            rows_needed, row_end = scratch["rows_needed"], scratch["row_end"]
            wp.launch(variant.pair_keys, dim=(n_in, n_rows), inputs=[x, h], outputs=[keys, elems],
                      device=device, record_tape=False)
            end_bit = int(n_in * _FEATURE_STRIDE).bit_length()
            wp.utils.radix_sort_pairs(keys, elems, n_entries, end_bit=end_bit)
            sorted_keys = keys[:n_entries]
            wp.launch(variant.pair_mark, dim=n_entries, inputs=[sorted_keys, sentinel], outputs=[rows_needed],
                      device=device, record_tape=False)
            wp.utils.array_scan(rows_needed, row_end, inclusive=True)
            n_pairs = int(row_end[n_entries - 1 : n_entries].numpy()[0])  # the one host read-back
        out = PairBuffers(
            sorted_elem=allocate("sorted_elem", (n_entries,), wp.int32),
            slot=allocate("slot", (n_rows, n_in), wp.int32),
            pair_feature=allocate("pair_feature", (n_pairs,), wp.int32),
            pair_group=allocate("pair_group", (n_pairs,), wp.int64),
            row_start=allocate("row_start", (n_pairs,), wp.int32),
            row_stop=allocate("row_stop", (n_pairs,), wp.int32),
        )
        if n_entries:
            wp.launch(
                variant.pair_fill,
                dim=n_entries,
                inputs=[keys[:n_entries], elems[:n_entries], rows_needed, row_end, sentinel, n_rows, n_in],
                outputs=[out.sorted_elem, out.slot, out.pair_feature, out.pair_group, out.row_start, out.row_stop],
                device=device,
                record_tape=False,
            )
    return out


# ---------------------------------------------------------------------- 3./4. spline forward and backward
def _check_spline_args(x, slot, table, base_weight_t, scaler_t, order):
    n_rows, n_in = x.shape
    n_out = scaler_t.shape[1]
    expected = {
        "slot": (n_rows, n_in),
        "table": (table.shape[0], n_out, order + 1),
        "base_weight_t": (n_in, n_out),
        "scaler_t": (n_in, n_out),
    }
    for name, arr in (("slot", slot), ("table", table), ("base_weight_t", base_weight_t), ("scaler_t", scaler_t)):
        if tuple(arr.shape) != expected[name]:
            raise ValueError(f"{name} must have shape {expected[name]}, got {tuple(arr.shape)}")
        if arr.device != x.device:
            raise ValueError(f"{name} must be on the device of x ({x.device}), got {arr.device}")
        want = wp.int32 if name == "slot" else x.dtype
        if arr.dtype != want:
            raise TypeError(f"{name} must have dtype {wp.types.type_repr(want)}, got {wp.types.type_repr(arr.dtype)}")


def launch_forward(x, slot, table, base_weight_t, scaler_t, y, grid_delta, order, use_base=True, stream=None):
    """y [N, out] = sum_i base_weight_t[i, o] silu(x) + scaler_t[i, o] spline_io(x), the spline reading its
    window from ``table`` [P, out, K] at rows slot - 1 and slot. Overwrites y."""
    h = _check_h(grid_delta)
    _check_spline_args(x, slot, table, base_weight_t, scaler_t, order)
    variant = get_variant(order, _scalar_name(x))
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
        inputs=[x, slot, table, base_weight_t, scaler_t, h, variant.basis_matrix, int(use_base)],
        outputs=[y],
        device=x.device,
        stream=stream,
        record_tape=False,
    )


def launch_backward(
    dy, x, pairs: PairBuffers, table, base_weight_t, scaler_t, grid_delta, order, use_base=True,
    dx=None, d_base_weight_t=None, d_scaler_t=None, d_table=None, partials=None, stream=None,
):
    """Accumulate (+=) the gradients of :func:`launch_forward` into whichever of dx, d_base_weight_t,
    d_scaler_t (these two together) and d_table are given. ``partials(name, shape, dtype)`` returns scratch
    for the row reductions (default: fresh Warp arrays)."""
    h = _check_h(grid_delta)
    _check_spline_args(x, pairs.slot, table, base_weight_t, scaler_t, order)
    variant = get_variant(order, _scalar_name(x))
    device = x.device
    n_rows, n_in = x.shape
    n_out = scaler_t.shape[1]
    n_pairs = table.shape[0]
    if n_rows == 0 or n_in == 0 or n_out == 0:
        return
    if tuple(dy.shape) != (n_rows, n_out):
        raise ValueError(f"dy must have shape {(n_rows, n_out)}, got {tuple(dy.shape)}")
    bm = variant.basis_matrix
    if partials is None:
        def partials(name, shape, dtype):
            return wp.empty(shape, dtype=dtype, device=device)

    with _on(stream):
        if dx is not None:
            wp.launch(variant.backward_x, dim=n_rows * n_in,
                      inputs=[dy, x, pairs.slot, table, base_weight_t, scaler_t, h, bm, int(use_base)],
                      outputs=[dx], device=device, record_tape=False)
        if d_base_weight_t is not None or d_scaler_t is not None:
            if d_base_weight_t is None or d_scaler_t is None:
                raise ValueError("d_base_weight_t and d_scaler_t must be given together")
            n_chunks, rows_per_chunk = row_chunks(n_rows, n_in, n_out)
            partial_base = partials("partial_base", (n_chunks, n_in, n_out), variant.scalar)
            partial_scaler = partials("partial_scaler", (n_chunks, n_in, n_out), variant.scalar)
            wp.launch(variant.backward_rows, dim=n_chunks * n_in * n_out,
                      inputs=[dy, x, pairs.slot, table, h, bm, rows_per_chunk],
                      outputs=[partial_base, partial_scaler], device=device, record_tape=False)
            wp.launch(variant.combine_rows, dim=(n_in, n_out),
                      inputs=[partial_base, partial_scaler, int(use_base)],
                      outputs=[d_base_weight_t, d_scaler_t], device=device, record_tape=False)
        if d_table is not None and n_pairs > 0:
            n_splits = table_splits(n_rows * n_in, n_pairs, n_out)
            partial_table = partials("partial_table", (n_splits, n_pairs, n_out, order + 1), variant.scalar)
            wp.launch(
                variant.backward_table,
                dim=(n_splits, n_pairs, n_out),
                inputs=[dy, x, pairs.sorted_elem, pairs.pair_feature, pairs.pair_group, pairs.row_start,
                        pairs.row_stop, h, bm],
                outputs=[partial_table],
                device=device,
                record_tape=False,
            )
            wp.launch(variant.combine_table, dim=(n_pairs, n_out, order + 1),
                      inputs=[partial_table, pairs.pair_feature, scaler_t], outputs=[d_table],
                      device=device, record_tape=False)


def table_splits(n_entries: int, n_pairs: int, n_out: int) -> int:
    """Splits per table row for the d_table gather: enough threads to fill a GPU, at least ~32 elements per
    split on average; a function of the shapes alone, so the summation order is fixed."""
    want = -(-_TARGET_TABLE_THREADS // max(n_pairs * n_out, 1))
    return max(1, min(want, n_entries // (32 * max(n_pairs, 1))))


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


@functools.lru_cache(maxsize=None)
def get_dense_variant(scalar_name: str = "float32") -> DenseVariant:
    """SIMT kernels of the small CG-MLP: feature rows, dense layers with optional SiLU, and their backward.
    The row counts are small (the touched pairs), so plain per-output threads suffice."""
    scalar = _SCALARS[scalar_name]
    kernel = functools.partial(wp.kernel, enable_backward=False, module=f"warpkan_ukan_mlp_{scalar_name}")
    zero = scalar(0.0)
    one = scalar(1.0)
    silu_and_grad = silu_func(scalar_name)

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
            j = a // 2
            freq = wp.pow(wp.float64(PE_BASE), -wp.float64(2 * j) / wp.float64(pe_dim))
            phase = wp.float64(pair_group[p]) * freq
            v = wp.sin(phase)
            if a - 2 * j == 1:
                v = wp.cos(phase)
            out[p, a] = scalar(v)
        else:
            out[p, a] = embedding[pair_feature[p], a - pe_dim]

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

    @wp.func
    def lower_bound(values: wp.array(dtype=wp.int32), target: int):
        lo = int(0)
        hi = values.shape[0]
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
        pe_dim: int,
        d_embedding: wp.array2d(dtype=scalar),
    ):
        # the rows of feature i are contiguous (sorted by feature): sum them in order, no atomics
        i, e = wp.tid()
        start = lower_bound(pair_feature, i)
        stop = lower_bound(pair_feature, i + 1)
        acc = zero
        for p in range(start, stop):
            acc = acc + d_features[p, pe_dim + e]
        d_embedding[i, e] = d_embedding[i, e] + acc

    return DenseVariant(scalar, features, dense_forward, dense_backward_input, dense_backward_params,
                        dense_combine, embedding_backward)


def launch_features(pair_feature, pair_group, embedding, pe_dim, out, stream=None):
    variant = get_dense_variant(_scalar_name(embedding, "embedding"))
    if out.shape[0] == 0:
        return
    wp.launch(variant.features, dim=tuple(out.shape), inputs=[pair_feature, pair_group, embedding, int(pe_dim)],
              outputs=[out], device=out.device, stream=stream, record_tape=False)


def launch_dense_forward(inp, weight, bias, apply_silu, pre, out, stream=None):
    variant = get_dense_variant(_scalar_name(inp, "inp"))
    if out.shape[0] == 0:
        return
    wp.launch(variant.dense_forward, dim=tuple(out.shape), inputs=[inp, weight, bias, int(apply_silu)],
              outputs=[pre, out], device=out.device, stream=stream, record_tape=False)


def launch_dense_backward(d_out, inp, weight, d_weight, d_bias, d_in=None, pre_in=None, silu_in=False,
                          partials=None, stream=None):
    """Accumulate d_weight, d_bias (chunked partials + fixed-order combine); write d_in (not accumulated)
    when given, multiplied by silu'(pre_in) when ``silu_in``."""
    variant = get_dense_variant(_scalar_name(inp, "inp"))
    device = inp.device
    n_rows, n_in = inp.shape
    n_out = d_out.shape[1]
    if n_rows == 0:
        return
    with _on(stream):
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


def launch_embedding_backward(d_features, pair_feature, pe_dim, d_embedding, stream=None):
    variant = get_dense_variant(_scalar_name(d_features, "d_features"))
    if d_embedding.shape[0] == 0 or d_embedding.shape[1] == 0:
        return
    wp.launch(variant.embedding_backward, dim=tuple(d_embedding.shape), inputs=[d_features, pair_feature, int(pe_dim)],
              outputs=[d_embedding], device=d_embedding.device, stream=stream, record_tape=False)
