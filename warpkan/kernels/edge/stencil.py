"""The engine's per-thread ("stencil") kernels: every device, every family, every table size.

Layout (the innermost index is the one consecutive threads walk, so it is the coalesced one): ``x`` [N, in],
``base_weight_t`` and ``scaler_t`` [in, out], ``coef`` [in, n_coef, out], ``bias`` [out], ``y`` [N, out].

- forward: one thread per (``FORWARD_ROWS`` rows, ``OUT_TILE`` outputs); the bases of (n, i) are evaluated once
  per 4 outputs, the rows' load chains (x -> slot -> C) are independent. No atomics.
- backward, x: one warp per row, or per run of a row's inputs when rows are few (lanes over outputs, a
  shuffle reduction per (n, i)); fixed order.
- backward, base weight / scaler: row-chunk partials added by a fixed-order combine.
- backward, coefficients: the (n, i) entries bucketed by (input, slot) with a stable sort; either one pass over
  the sorted entries that forms every gradient with one atomic per coefficient per slot run
  (``backward_bucketed``), or (deterministic) one thread per coefficient gathering the buckets that touch it.

All of a family's stencil kernels live in one Warp module and launch with one block size, so a layer compiles
it once.
"""


import functools
from dataclasses import dataclass

import warp as wp

from .._common import SCALARS, first_at_least, lane_sum, load4_funcs
from .._modules import ModuleBuild
from ._values import edge_values
from .family import EdgeFamily

__all__ = ["StencilKernels", "stencil_kernels", "stencil_modules", "combine_rows_kernel", "FORWARD_ROWS", "OUT_TILE",
           "BLOCK_DIM", "ENTRIES_PER_CHUNK"]

OUT_TILE = 4
FORWARD_ROWS = 2
ENTRIES_PER_CHUNK = 256
BLOCK_DIM = 128  # every stencil kernel (Warp builds a module once per block size)
ROW_LANES = 32  # lanes per row of the dx kernel (one warp)


@dataclass(frozen=True)
class StencilKernels:
    module: str
    forward: wp.Kernel
    backward_x: wp.Kernel
    backward_rows: wp.Kernel
    combine_rows: wp.Kernel
    bucket_keys: wp.Kernel
    bucket_offsets: wp.Kernel
    backward_coef: wp.Kernel  # per-input tables: the gather; a shared table: the group walk
    backward_bucketed: "wp.Kernel | None"  # None for a shared table (its gradient is the atomic-free walk)
    combine_coef: "wp.Kernel | None" = None  # a shared table's second pass (see _backward_shared_coef)
    ordered_keys: "wp.Kernel | None" = None  # a shared table's keys of entries the caller grouped


def module_name(family: EdgeFamily) -> str:
    return f"warpkan_edge_{family.key}"


@functools.lru_cache(maxsize=None)
def stencil_kernels(family: EdgeFamily) -> StencilKernels:
    module = module_name(family)
    kernel = functools.partial(wp.kernel, enable_backward=False, module=module)
    forward = _forward(family, kernel)
    backward_x = _backward_x(family, kernel)
    backward_rows, combine_rows = _backward_rows(family, kernel)
    if family.shared_table:
        bucket_keys, bucket_offsets, backward_coef, combine_coef, ordered_keys = _backward_shared_coef(family, kernel)
        return StencilKernels(module, forward, backward_x, backward_rows, combine_rows, bucket_keys, bucket_offsets,
                              backward_coef, None, combine_coef, ordered_keys)
    bucket_keys, bucket_offsets, backward_coef = _backward_coef(family, kernel)
    backward_bucketed = _backward_bucketed(family, kernel)
    return StencilKernels(module, forward, backward_x, backward_rows, combine_rows, bucket_keys, bucket_offsets,
                          backward_coef, backward_bucketed)


def stencil_modules(family: EdgeFamily) -> tuple:
    """The modules (:class:`ModuleBuild`) the stencil launchers use: the family's own and the shared combine of
    row-chunked sums, both launched at ``BLOCK_DIM``."""
    return (ModuleBuild(stencil_kernels(family).module, BLOCK_DIM),
            ModuleBuild(combine_rows_kernel(family.scalar_name).module.name, BLOCK_DIM))


@functools.lru_cache(maxsize=None)
def _tile_funcs(family: EdgeFamily):
    """(slot_rows, tile_dot): the K coefficient rows of a slot for 4 outputs, and their dot with a basis."""
    scalar, vec, K, first = family.scalar, family.vec, family.n_bases, family.first
    matKO = wp.types.matrix(shape=(K, OUT_TILE), dtype=scalar)
    vecO = wp.types.vector(length=OUT_TILE, dtype=scalar)
    load4_2d, load4_3d = load4_funcs(family.scalar_name)
    zero = scalar(0.0)

    @wp.func
    def slot_rows(coef: wp.array3d(dtype=scalar), i: int, slot: int, o0: int, aligned: int):
        """[C[i, slot+first+m, o0 + c]] for m < K, c < 4, without branches: a row whose index is outside
        [0, n_coef) comes back zero (outputs past the end read the last one)."""
        n_coef = coef.shape[1]
        rows = matKO()
        for m in range(K):
            j = slot + first + m
            row = load4_3d(coef, i, wp.clamp(j, 0, n_coef - 1), o0, aligned)
            for c in range(OUT_TILE):
                rows[m, c] = wp.where(j >= 0 and j < n_coef, row[c], zero)
        return rows

    @wp.func
    def tile_dot(b: vec, rows: matKO):
        acc = vecO()
        for m in range(K):
            for c in range(OUT_TILE):
                acc[c] = acc[c] + b[m] * rows[m, c]
        return acc

    return slot_rows, tile_dot, matKO, vecO, load4_2d


def _forward(family: EdgeFamily, kernel):
    scalar, Frame = family.scalar, family.Frame
    values = edge_values(family)
    bases_at, silu = values.bases_at, values.silu
    slot_rows, tile_dot, matKO, vecO, load4_2d = _tile_funcs(family)
    matRO = wp.types.matrix(shape=(FORWARD_ROWS, OUT_TILE), dtype=scalar)
    zero = scalar(0.0)

    @kernel
    def forward(x: wp.array2d(dtype=scalar), frame: Frame, base_weight_t: wp.array2d(dtype=scalar),
                scaler_t: wp.array2d(dtype=scalar), coef: wp.array3d(dtype=scalar), bias: wp.array(dtype=scalar),
                use_base: int, has_bias: int, aligned: int, y: wp.array2d(dtype=scalar)):
        # consecutive threads take consecutive output tiles of the same rows: a warp's loads of w_b, s and C
        # are contiguous (one 16-byte load each when aligned)
        tid = wp.tid()
        n_rows = x.shape[0]
        n_out = y.shape[1]
        n_tiles = (n_out + OUT_TILE - 1) // OUT_TILE
        group = tid // n_tiles
        o0 = (tid - group * n_tiles) * OUT_TILE
        n0 = group * FORWARD_ROWS
        acc = matRO()
        for i in range(x.shape[1]):
            w_base = load4_2d(base_weight_t, i, o0, aligned)
            s = load4_2d(scaler_t, i, o0, aligned)
            for r in range(FORWARD_ROWS):
                n = wp.min(n0 + r, n_rows - 1)
                xv = x[n, i]
                valid, slot, b = bases_at(frame, n, i, xv)
                spline = tile_dot(b, slot_rows(coef, i, slot, o0, aligned))
                act, dact, d2act = silu(xv)
                if use_base == 0:
                    act = zero
                for c in range(OUT_TILE):
                    acc[r, c] = acc[r, c] + s[c] * spline[c] + w_base[c] * act
        for r in range(FORWARD_ROWS):
            for c in range(OUT_TILE):
                if n0 + r < n_rows and o0 + c < n_out:
                    v = acc[r, c]
                    if has_bias:
                        v = v + bias[o0 + c]
                    y[n0 + r, o0 + c] = v

    return forward


def _backward_x(family: EdgeFamily, kernel):
    scalar, Frame = family.scalar, family.Frame
    values = edge_values(family)
    bases_dx_at, coef_dot, silu = values.bases_dx_at, values.coef_dot, values.silu
    reduce_lanes = lane_sum(scalar)
    zero = scalar(0.0)

    @kernel
    def backward_x(dy: wp.array2d(dtype=scalar), x: wp.array2d(dtype=scalar), frame: Frame,
                   base_weight_t: wp.array2d(dtype=scalar), scaler_t: wp.array2d(dtype=scalar),
                   coef: wp.array3d(dtype=scalar), use_base: int, lanes: int, inputs_per_item: int,
                   dx: wp.array2d(dtype=scalar)):
        # dx[n, i] += sum_o dy[n, o] (w_b[i, o] silu'(x) + s[i, o] sum_m B'_m C[i, slot+first+m, o]); the lanes
        # of an item (a row's run of inputs_per_item inputs) take consecutive outputs (coalesced), one shuffle
        # reduction per (n, i), fixed order
        item, lane = wp.tid()
        n_out = dy.shape[1]
        n_in = x.shape[1]
        items_per_row = (n_in + inputs_per_item - 1) // inputs_per_item
        n = item // items_per_row
        i0 = (item - n * items_per_row) * inputs_per_item
        for i in range(i0, wp.min(i0 + inputs_per_item, n_in)):
            xv = x[n, i]
            valid, slot, b, db = bases_dx_at(frame, n, i, xv)
            act = zero
            dact = zero
            if use_base:
                act, dact, d2act = silu(xv)
            acc = zero
            for o in range(lane, n_out, lanes):
                g = zero
                if use_base:
                    g = base_weight_t[i, o] * dact
                if valid:
                    g = g + scaler_t[i, o] * coef_dot(coef, i, slot, o, db)
                acc = acc + dy[n, o] * g
            total = reduce_lanes(acc, lanes)
            if lane == 0:
                dx[n, i] = dx[n, i] + total

    return backward_x


def _backward_rows(family: EdgeFamily, kernel):
    scalar, Frame = family.scalar, family.Frame
    values = edge_values(family)
    bases_at, coef_dot, silu = values.bases_at, values.coef_dot, values.silu
    zero = scalar(0.0)

    @kernel
    def backward_rows(dy: wp.array2d(dtype=scalar), x: wp.array2d(dtype=scalar), frame: Frame,
                      coef: wp.array3d(dtype=scalar), rows_per_chunk: int, partial_base: wp.array3d(dtype=scalar),
                      partial_scaler: wp.array3d(dtype=scalar)):
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
            act, dact, d2act = silu(xv)
            acc_base = acc_base + g * act
            valid, slot, b = bases_at(frame, n, i, xv)
            if valid:
                acc_scaler = acc_scaler + g * coef_dot(coef, i, slot, o, b)
        partial_base[chunk, i, o] = acc_base
        partial_scaler[chunk, i, o] = acc_scaler

    return backward_rows, combine_rows_kernel(family.scalar_name)


@functools.lru_cache(maxsize=None)
def combine_rows_kernel(scalar_name: str = "float32") -> wp.Kernel:
    """The fixed-order combine of row-chunked reductions: d_base[i, o] += sum_chunk partial_base[chunk, i, o]
    (when use_base) and d_scaler[i, o] += sum_chunk partial_scaler[chunk, i, o]. One small module per scalar
    type, shared by every family."""
    scalar = SCALARS[scalar_name]
    zero = scalar(0.0)

    @wp.kernel(enable_backward=False, module=f"warpkan_edge_combine_rows_{scalar_name}")
    def combine_rows(partial_base: wp.array3d(dtype=scalar), partial_scaler: wp.array3d(dtype=scalar),
                     use_base: int, d_base_weight_t: wp.array2d(dtype=scalar), d_scaler_t: wp.array2d(dtype=scalar)):
        i, o = wp.tid()
        acc_base = zero
        acc_scaler = zero
        for chunk in range(partial_base.shape[0]):  # fixed order: deterministic
            acc_base = acc_base + partial_base[chunk, i, o]
            acc_scaler = acc_scaler + partial_scaler[chunk, i, o]
        if use_base:
            d_base_weight_t[i, o] = d_base_weight_t[i, o] + acc_base
        d_scaler_t[i, o] = d_scaler_t[i, o] + acc_scaler

    return combine_rows


def _bucket_kernels(family: EdgeFamily, kernel):
    """(bucket_keys, bucket_offsets): every (n, i) entry's sort key, and where each key's run starts in the
    sorted keys. Per-input tables: i * n_buckets + bucket (slot + 1, 0 when invalid). A shared table: the slot's
    group slot // K (its rows belong to one input), ``n_buckets`` (the group count, sorting last) when invalid."""
    scalar, Frame = family.scalar, family.Frame
    slot_at = edge_values(family).slot_at
    shared = family.shared_table
    group_key = _shared_group_key(family) if shared else None

    @kernel
    def bucket_keys(x: wp.array2d(dtype=scalar), frame: Frame, n_buckets: int, keys: wp.array(dtype=wp.int32),
                    rows: wp.array(dtype=wp.int32)):
        # entry e = i * N + n; a stable sort keeps the entries of a key in entry order. rows[e]: the entry's row
        # (its input is in the key), or the entry itself for a shared table
        i, n = wp.tid()
        e = i * x.shape[0] + n
        if wp.static(shared):
            keys[e] = group_key(frame, n, i, x[n, i], n_buckets)
            rows[e] = e
        else:
            valid, slot = slot_at(frame, n, i, x[n, i])
            keys[e] = i * n_buckets + wp.where(valid == 1, slot + 1, 0)
            rows[e] = n

    @kernel
    def bucket_offsets(sorted_keys: wp.array(dtype=wp.int32), n_entries: int, offsets: wp.array(dtype=wp.int32)):
        k = wp.tid()
        offsets[k] = first_at_least(sorted_keys, n_entries, k)

    return bucket_keys, bucket_offsets


def _backward_coef(family: EdgeFamily, kernel):
    scalar, Frame, K, first = family.scalar, family.Frame, family.n_bases, family.first
    bases_at = edge_values(family).bases_at
    zero = scalar(0.0)
    bucket_keys, bucket_offsets = _bucket_kernels(family, kernel)

    @kernel
    def backward_coef(dy: wp.array2d(dtype=scalar), x: wp.array2d(dtype=scalar), frame: Frame,
                      scaler_t: wp.array2d(dtype=scalar), rows: wp.array(dtype=wp.int32),
                      offsets: wp.array(dtype=wp.int32), n_buckets: int, d_coef: wp.array3d(dtype=scalar)):
        # d_coef[i, j, o] += s[i, o] sum_m sum_{n in slot j - first - m} dy[n, o] b_m(x[n, i])
        tid = wp.tid()
        n_out = d_coef.shape[2]
        n_coef = d_coef.shape[1]
        o = tid % n_out
        rest = tid // n_out
        j = rest % n_coef
        i = rest // n_coef
        acc = zero
        for m in range(K):
            slot = j - first - m
            if slot >= 0 and slot + 1 < n_buckets:
                key = i * n_buckets + slot + 1
                for e in range(offsets[key], offsets[key + 1]):
                    n = rows[e]
                    valid, s_, b = bases_at(frame, n, i, x[n, i])
                    acc = acc + dy[n, o] * b[m]
        d_coef[i, j, o] = d_coef[i, j, o] + scaler_t[i, o] * acc

    return bucket_keys, bucket_offsets, backward_coef


def _backward_shared_coef(family: EdgeFamily, kernel):
    """The coefficient gradient of a shared-table family (first = 0), atomic-free: the (n, i) entries keyed by
    the group q = s // K of their slot s (slot s reaches rows s .. s + K - 1, inside the 2K rows [qK, qK + 2K)),
    sorted, or taken in an order the caller already grouped them in; then a segmented reduction. One thread per
    (chunk of sorted entries, output) walks its chunk once (one basis per entry and output) summing
    ``s[i, o] dy[n, o] b_m`` into the 2K-window of the current group; a group wholly inside the chunk is written
    to ``group_sums[q]``, the part of one cut by a chunk boundary to the chunk's ``head`` (it began earlier) or
    ``tail`` (it goes on). The second pass adds, per (row, output), the windows of the row's two groups, each
    from its own entry or its chunk parts in chunk order: a fixed order, however the entries fall into chunks."""
    if family.first != 0:
        raise ValueError(f"a shared-table family reads its slots from row 0 (first = 0), got first={family.first}")
    bucket_keys, bucket_offsets = _bucket_kernels(family, kernel)
    group_walk = _shared_group_walk(family, kernel)
    combine_coef = _shared_group_combine(family, kernel)
    return bucket_keys, bucket_offsets, group_walk, combine_coef, _shared_ordered_keys(family, kernel)


@functools.lru_cache(maxsize=None)
def _shared_group_key(family: EdgeFamily):
    """``@wp.func (frame, n, i, x, n_groups) -> key`` of a shared table's entry: its slot's group slot // K, or
    n_groups (sorting last) when it has no spline term."""
    scalar, Frame, K = family.scalar, family.Frame, family.n_bases
    slot_at = edge_values(family).slot_at

    @wp.func
    def group_key(frame: Frame, n: int, i: int, x: scalar, n_groups: int):
        valid, slot = slot_at(frame, n, i, x)
        return wp.where(valid == 1, slot // K, n_groups)

    return group_key


def _shared_ordered_keys(family: EdgeFamily, kernel):
    """The keys of entries already grouped by the caller (``order``: entry indices e = i N + n with
    nondecreasing groups, the invalid ones last; UKAN's pair search sorts them so): no sort needed."""
    scalar, Frame = family.scalar, family.Frame
    group_key = _shared_group_key(family)

    @kernel
    def ordered_keys(x: wp.array2d(dtype=scalar), frame: Frame, n_groups: int, order: wp.array(dtype=wp.int32),
                     keys: wp.array(dtype=wp.int32), rows: wp.array(dtype=wp.int32)):
        j = wp.tid()
        e = order[j]
        i = e // x.shape[0]
        n = e - i * x.shape[0]
        keys[j] = group_key(frame, n, i, x[n, i], n_groups)
        rows[j] = e

    return ordered_keys


@functools.lru_cache(maxsize=None)
def _shared_group_funcs(family: EdgeFamily):
    """(vec2K, group_range, store, resolved): the group windows of a shared table's gradient."""
    scalar, K = family.scalar, family.n_bases
    vec2K = wp.types.vector(length=2 * K, dtype=scalar)

    @wp.func
    def group_range(offsets: wp.array(dtype=wp.int32), q: int):
        """[lo, hi): the sorted entries of group q."""
        return offsets[q], offsets[q + 1]

    @wp.func
    def store(dest: wp.array3d(dtype=scalar), at: int, o: int, acc: vec2K):
        for m in range(2 * K):
            dest[at, m, o] = acc[m]

    @wp.func
    def resolved(offsets: wp.array(dtype=wp.int32), q: int, o: int, chunk_size: int,
                 group_sums: wp.array3d(dtype=scalar), head: wp.array3d(dtype=scalar),
                 tail: wp.array3d(dtype=scalar)):
        """Group q's window: zero without entries, else its own sums or its chunk parts added in chunk order."""
        acc = vec2K()
        lo, hi = group_range(offsets, q)
        if hi > lo:
            c0 = lo // chunk_size
            c1 = (hi - 1) // chunk_size
            if c0 == c1:
                for m in range(2 * K):
                    acc[m] = group_sums[q, m, o]
            else:
                for m in range(2 * K):
                    acc[m] = tail[c0, m, o]
                for c in range(c0 + 1, c1 + 1):
                    for m in range(2 * K):
                        acc[m] = acc[m] + head[c, m, o]
        return acc

    return vec2K, group_range, store, resolved


def _shared_group_walk(family: EdgeFamily, kernel):
    scalar, Frame, K = family.scalar, family.Frame, family.n_bases
    bases_at = edge_values(family).bases_at
    slot_input = family.slot_input
    vec2K, group_range, store, resolved = _shared_group_funcs(family)

    @kernel
    def backward_coef(dy: wp.array2d(dtype=scalar), x: wp.array2d(dtype=scalar), frame: Frame,
                      scaler_t: wp.array2d(dtype=scalar), sorted_keys: wp.array(dtype=wp.int32),
                      rows: wp.array(dtype=wp.int32), offsets: wp.array(dtype=wp.int32), chunk_size: int,
                      n_groups: int, group_sums: wp.array3d(dtype=scalar), head: wp.array3d(dtype=scalar),
                      tail: wp.array3d(dtype=scalar)):
        tid = wp.tid()
        n_out = dy.shape[1]
        n_rows = x.shape[0]
        o = tid % n_out
        chunk = tid // n_out
        start = chunk * chunk_size
        stop = wp.min(start + chunk_size, sorted_keys.shape[0])
        current = int(-1)
        acc = vec2K()
        for e in range(start, stop + 1):
            q = int(-1)
            if e < stop:
                key = sorted_keys[e]
                if key < n_groups:  # n_groups: an invalid entry
                    q = key
            if q != current:  # flush the finished group
                if current >= 0:
                    lo, hi = group_range(offsets, current)
                    if lo >= start and hi <= stop:
                        store(group_sums, current, o, acc)
                    elif lo < start:
                        store(head, chunk, o, acc)
                    else:
                        store(tail, chunk, o, acc)
                current = q
                acc = vec2K()
            if q >= 0:
                entry = rows[e]
                i = entry // n_rows
                n = entry - i * n_rows
                valid, slot, b = bases_at(frame, n, i, x[n, i])
                g = scaler_t[slot_input(frame, slot), o] * dy[n, o]
                r = slot - q * K
                for m in range(K):
                    acc[r + m] = acc[r + m] + g * b[m]

    return backward_coef


def _shared_group_combine(family: EdgeFamily, kernel):
    scalar, K = family.scalar, family.n_bases
    vec2K, group_range, store, resolved = _shared_group_funcs(family)

    @kernel
    def combine_coef(offsets: wp.array(dtype=wp.int32), chunk_size: int, group_sums: wp.array3d(dtype=scalar),
                     head: wp.array3d(dtype=scalar), tail: wp.array3d(dtype=scalar),
                     d_coef: wp.array3d(dtype=scalar)):
        # row j = q K + m lies in the window of group q (position m) and of group q - 1 (position K + m)
        tid = wp.tid()
        n_out = d_coef.shape[2]
        o = tid % n_out
        j = tid // n_out
        q = j // K
        m = j - q * K
        total = resolved(offsets, q, o, chunk_size, group_sums, head, tail)[m]
        if q > 0:
            total = total + resolved(offsets, q - 1, o, chunk_size, group_sums, head, tail)[K + m]
        d_coef[0, j, o] = d_coef[0, j, o] + total

    return combine_coef


@functools.lru_cache(maxsize=None)
def _bucketed_funcs(family: EdgeFamily):
    """(flush_slot, flush_input, add_entry): the pieces of the bucketed backward's walk."""
    scalar, Frame, K, first = family.scalar, family.Frame, family.n_bases, family.first
    values = edge_values(family)
    bases_dx_at, silu = values.bases_dx_at, values.silu
    slot_rows, tile_dot, matKO, vecO, load4_2d = _tile_funcs(family)
    zero = scalar(0.0)

    @wp.func
    def flush_slot(acc: matKO, s: vecO, rows_c: matKO, acc_scaler: vecO, i: int, slot: int, o0: int,
                   d_coef: wp.array3d(dtype=scalar)):
        """Add a slot run's sums to d_coef (one atomic per coefficient) and fold sum_m C * sum into d_scaler's."""
        n_out = d_coef.shape[2]
        n_coef = d_coef.shape[1]
        for m in range(K):
            j = slot + first + m
            if j >= 0 and j < n_coef:
                for c in range(OUT_TILE):
                    if o0 + c < n_out:
                        wp.atomic_add(d_coef, i, j, o0 + c, s[c] * acc[m, c])
                    acc_scaler[c] = acc_scaler[c] + rows_c[m, c] * acc[m, c]
        return acc_scaler

    @wp.func
    def flush_input(acc_base: vecO, acc_scaler: vecO, i: int, o0: int, use_base: int,
                    d_base_weight_t: wp.array2d(dtype=scalar), d_scaler_t: wp.array2d(dtype=scalar)):
        for c in range(OUT_TILE):
            if o0 + c < d_scaler_t.shape[1]:
                if use_base != 0:
                    wp.atomic_add(d_base_weight_t, i, o0 + c, acc_base[c])
                wp.atomic_add(d_scaler_t, i, o0 + c, acc_scaler[c])

    @wp.func
    def add_entry(frame: Frame, n: int, i: int, xv: scalar, g: vecO, use_base: int, s: vecO, w_base: vecO,
                  rows_c: matKO, acc: matKO, acc_base: vecO):
        """One entry's dy * B_m and dy * silu added to the slot's and the input's sums, and its tile's share of
        dx[n, i] = sum_o dy (w_b silu' + s sum_m B'_m C): (acc, acc_base, part)."""
        valid, slot, b, db = bases_dx_at(frame, n, i, xv)
        act, dact, d2act = silu(xv)
        if use_base == 0:
            act = zero
            dact = zero
        part = zero
        for c in range(OUT_TILE):
            acc_base[c] = acc_base[c] + g[c] * act
            spline_grad = zero
            for m in range(K):
                acc[m, c] = acc[m, c] + g[c] * b[m]
                spline_grad = spline_grad + db[m] * rows_c[m, c]
            part = part + g[c] * (s[c] * spline_grad + w_base[c] * dact)
        return acc, acc_base, part

    return flush_slot, flush_input, add_entry


def _backward_bucketed(family: EdgeFamily, kernel):
    scalar, Frame = family.scalar, family.Frame
    slot_rows, tile_dot, matKO, vecO, load4_2d = _tile_funcs(family)
    flush_slot, flush_input, add_entry = _bucketed_funcs(family)
    reduce_lanes = lane_sum(scalar)
    zero = scalar(0.0)
    one = scalar(1.0)

    @kernel
    def backward_bucketed(dy: wp.array2d(dtype=scalar), x: wp.array2d(dtype=scalar), frame: Frame,
                          base_weight_t: wp.array2d(dtype=scalar), scaler_t: wp.array2d(dtype=scalar),
                          coef: wp.array3d(dtype=scalar), sorted_keys: wp.array(dtype=wp.int32),
                          rows: wp.array(dtype=wp.int32), n_entries: int, n_buckets: int, entries_per_chunk: int,
                          use_base: int, want_dx: int, lanes: int, aligned: int, dx: wp.array2d(dtype=scalar),
                          d_base_weight_t: wp.array2d(dtype=scalar), d_scaler_t: wp.array2d(dtype=scalar),
                          d_coef: wp.array3d(dtype=scalar)):
        # Every gradient in one pass over the (n, i) entries sorted by (input, slot). One thread per (chunk of
        # entries, tile of 4 outputs); the tiles of one chunk are consecutive threads walking the same entries
        # (x broadcast, dy contiguous). w_b, s (per input) and the slot's K coefficient rows are loaded when
        # the key changes. Per entry a thread adds dy * B_m into K x 4 register sums for the current slot
        # (flushed with one atomic per coefficient when the slot changes) and dy * silu for the input, and
        # forms its tile's share of dx[n, i], which the `lanes` threads of the entry add by shuffles (the only
        # add to dx[n, i] when they cover every output: reproducible). The loop runs a fixed number of steps
        # so that every lane reaches the shuffle (launch dims are whole warps).
        tid = wp.tid()
        n_out = dy.shape[1]
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
        slot_cur = int(-1)
        w_base = vecO()
        s = vecO()
        rows_c = matKO()
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
                    if slot_cur >= 0:
                        acc_scaler = flush_slot(acc, s, rows_c, acc_scaler, i_cur, slot_cur, o0, d_coef)
                    if i_next != i_cur:
                        flush_input(acc_base, acc_scaler, i_cur, o0, use_base, d_base_weight_t, d_scaler_t)
                        acc_base = vecO()
                        acc_scaler = vecO()
                    acc = matKO()
                current = key
                if key >= 0:
                    if i_next != i_cur:
                        i_cur = i_next
                        w_base = load4_2d(base_weight_t, i_cur, o0, aligned)
                        s = load4_2d(scaler_t, i_cur, o0, aligned)
                    slot_cur = key - i_cur * n_buckets - 1  # bucket 0 (invalid) -> -1
                    rows_c = slot_rows(coef, i_cur, slot_cur, o0, aligned)
            part = zero
            if live:
                acc, acc_base, part = add_entry(frame, n, i_cur, xv, g, use_base, s, w_base, rows_c, acc, acc_base)
            if want_dx != 0:
                # a fire-and-forget atomic: no load of dx on the critical path; the only add to dx[n, i] when
                # one lane group covers every output (lanes == n_tiles), so dx stays reproducible
                total = reduce_lanes(part, lanes)
                if live and tile % lanes == 0:
                    wp.atomic_add(dx, n, i_cur, total)

    return backward_bucketed
