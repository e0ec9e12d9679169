"""The engine's warp-tiled CUDA kernels: one warp per (rows, outputs) tile, lanes over the outputs.

The layout of every array is the one of :mod:`.stencil`; these kernels compute the same maps for any edge
family (written below for the B-spline, where the slot is the cell and ``first = -k``), organised for the GPU:

- **Basis evaluated once per (n, i).** Lane ``l`` of a warp evaluates the k + 1 bases (and their
  derivatives, silu and silu') of row ``n0 + l`` of input ``i`` and stages them in shared memory; the warp
  then walks the 32 staged rows with lanes over 32 consecutive outputs, reading each row's record with
  16-byte broadcast loads. Every global load of ``dy``, ``y`` and the coefficient rows is one coalesced
  128-byte line per warp.
- **Scaled, padded coefficient table.** ``coef_pad[i, r, o] = scaler_t[i, o] coef[i, r - k, o]`` for
  ``k <= r < G + 2k``, zero in the ``k`` rows either side. Cell ``c``'s bases take the rows ``c .. c + k``:
  no clamp, no mask, and no multiply by the scaler per edge. It is rebuilt by one small launch per call.
- **Forward.** A warp holds 32 rows x 32 outputs of ``y`` in registers (one per lane per row) and loops
  over the inputs: no atomics, every (n, o) summed in input order.
- **Backward (dx and every parameter gradient in one pass).** A warp takes (input ``i``, 32 outputs, a
  chunk of rows). It accumulates ``A[c + m, o] = sum_n dy[n, o] B_m(x[n, i])`` in a private shared-memory
  table of ``G + 3k`` rows x 32 lanes (lane ``o`` owns column ``o``: conflict-free, no atomics), and
  ``sum_n dy[n, o] silu(x[n, i])`` in a register. At the end of its chunk it flushes
  ``d_coef[i, j, o] += s[i, o] A[j + k, o]`` and ``d_scaler[i, o] += sum_j coef[i, j, o] A[j + k, o]``
  (the spline value is linear in the bases, so the scaler's gradient comes from the same table) with one
  atomic per coefficient per chunk, or (``deterministic``) writes them to per-chunk partials that a
  fixed-order pass adds. ``dx[n, i]`` is summed over the warp's outputs by a 31-shuffle transpose
  reduction per 32 rows (lane ``l`` ends up with row ``l``).

The shared table bounds ``G + 3k`` by a compile-time capacity (:data:`CAPACITIES`). Longer grids (float32)
go in **bands of cells**, a table each (:func:`forward_plan`, :func:`backward_plan`): band ``b`` holds the
padded rows of the cells ``[b B, (b + 1) B)`` (``B`` = capacity - k cells) and a warp of band ``b`` walks
only its rows whose cell lies there. The backward scans its chunk for them (x and the cell only), queues
their row offsets and walks the queue 32 rows at a time (records in slots ``0 .. count - 1``, dy gathered
by row, dx summed by butterflies when few slots are live); neighbouring bands share k rows, which both
add by atomics (so banded runs are not deterministic). The forward skips the other rows of its walk (its
``y`` stays in registers, by constant row index). The scans (and, in the forward, the band tables) grow
with the number of bands; past the planned bands the per-thread kernels run. Off-grid inputs and NaN get
zero bases (cell 0: band 0 adds their base term), as everywhere in the B-spline family.
"""

import functools
from dataclasses import dataclass

import warp as wp

from .._common import on_stream
from .._modules import DEFAULT_BLOCK_DIM, ModuleBuild, distinct
from .._runtime import launch, workspace_for
from ._values import edge_values
from .family import EdgeFamily

__all__ = ["TiledKernels", "TablePlan", "CAPACITIES", "BANDED_CAPACITIES", "FORWARD_BANDED_CAPACITIES",
           "FORWARD_WARPS", "tiled_capacity", "tiled_applies", "forward_plan", "backward_plan", "backward_takes",
           "banded_backward_fits",
           "tiled_kernels", "tiled_modules", "planned_modules", "launch_tiled_forward",
           "launch_tiled_backward", "backward_rows_per_chunk", "coef_pad_shape", "partial_shapes"]

LANES = 32
# capacity -> backward warps a block, by scalar type (the forward always has FORWARD_WARPS). The capacity bounds the G + 3k rows of
# the padded coefficient table. Everything lives in static shared memory, at most 48 KiB a block (Warp itself
# takes 1 KiB): the forward holds two buffers of one input's rows for its 32 outputs, the backward one buffer
# plus an accumulation table per warp, and both the staged records. Longer grids take the bucketed kernels.
CAPACITIES = {
    "float32": {48: 4, 80: 3, 96: 2},
    "float64": {32: 3, 48: 1},
}
FORWARD_WARPS = 8
# Target warps of the backward pass: about 4 waves of resident warps on a large GPU (fewer, longer chunks
# mean fewer flushes; more mean a shorter tail).
_BACKWARD_TARGET_WARPS = 8192
# Rows whose table updates the backward issues together when their cells are apart (see _BACKWARD_OP), by
# scalar type (float64 spills at 4).
ROW_GROUP = {"float32": 4, "float64": 2}
_MIN_CHUNK_ROWS = 64
# static shared memory a block may declare, and what Warp's kernels declare of it themselves
_STATIC_SMEM_LIMIT = 48 * 1024
_WARP_STATIC_SMEM = 1024
# Grids past the table capacities: the backward pass splits the cells into bands of a table each
# (:func:`backward_plan`). A warp of band b scans its chunk's rows for those whose cell lies in b (x and the
# cell only), queues them, and walks the queue 32 rows at a time, so a walk step's bases, records, dy loads
# and dx sums serve 32 live rows however few a band holds; what still grows with the bands is the scan.
# (capacity, most bands) in order of preference, float32 only, each taken where it fits static shared
# memory (banded_backward_fits: the 80-row table only up to k = 3): the 48-row table runs 4 warps a block
# (16 an SM) against 3, and wins while the bands are few. Measured on the H200 at (2^17, 32->32, k=3),
# training backward ms, 48 / 80 rows (bands): G=128 0.73 (3) / 0.81 (2), G=256 0.81 (6) / 0.89 (4), G=512
# 1.05 (12) / 0.98 (7), G=1024 1.34 (23) / 1.19 (14), G=2048 2.10 (46) / 1.61 (27), G=4096 4.33 (92) /
# 2.71 (54); the per-thread kernels take 1.63-1.87 over these G, hence the limits.
BANDED_CAPACITIES = {"float32": ((48, 8), (80, 30), (48, 30))}
# The forward pass's banded tables: it holds two buffers of one table a block and no accumulation table, so
# its table can be longer (144 rows: 45 KiB with the records). A band costs each block a table load and
# each warp a walk of its row mask. Measured on the H200 at (2^17, 32->32, k=3), forward ms, banded /
# per-thread: G=128 (one band) 0.23 / 0.33, G=256 (two) 0.33 / 0.35, G=512 (four) 0.49 / 0.36.
FORWARD_BANDED_CAPACITIES = {"float32": ((144, 2),)}
# a banded step with at most this many live rows sums their dx by butterflies instead of the transpose
FEW_SLOTS = 6


@dataclass(frozen=True)
class TiledKernels:
    modules: tuple
    capacity: int
    backward_warps: int
    pad_coef: wp.Kernel
    forward: wp.Kernel
    backward: wp.Kernel
    combine: wp.Kernel


def table_fits(family: EdgeFamily, capacity: int, backward: bool) -> bool:
    """Whether a whole-table pass's static shared memory fits a block at this capacity (see _FORWARD_STEP and
    _BACKWARD_OP): the forward's two row buffers and the records of its FORWARD_WARPS warps; the backward's
    coefficient rows, one accumulation table, record row and base sum a warp. The records grow with K."""
    scalar = family.scalar_name
    size = 4 if scalar == "float32" else 8
    if backward:
        warps = CAPACITIES[scalar][capacity]
        record = _record_width(2 * family.n_bases + 3, scalar)
        used = (1 + warps) * capacity * LANES * size + warps * LANES * (record + 1) * size
    else:
        record = _record_width(family.n_bases + 2, scalar)
        used = 2 * capacity * LANES * size + FORWARD_WARPS * LANES * record * size
    return used + _WARP_STATIC_SMEM <= _STATIC_SMEM_LIMIT


@functools.lru_cache(maxsize=None)  # a function of constants alone, asked several times a layer call
def tiled_capacity(family: EdgeFamily, n_coef: int, backward: bool = False) -> int | None:
    """The smallest table capacity holding the padded table (B-spline: G + 3k rows) whose pass fits shared
    memory, or None when there is none."""
    need = family.padded_rows(n_coef)
    for cap in sorted(CAPACITIES.get(family.scalar_name, {})):
        if need <= cap and table_fits(family, cap, backward):
            return cap
    return None


def tiled_applies(family: EdgeFamily, is_cuda: bool, n_coef: int, backward: bool = False) -> bool:
    """Whether the tiled kernels can run a layer on one table: a CUDA device and the padded table within
    :data:`CAPACITIES` (and shared memory)."""
    return is_cuda and not family.shared_table and tiled_capacity(family, n_coef, backward) is not None


@dataclass(frozen=True)
class TablePlan:
    """The coefficient tables of a tiled pass: one of ``capacity`` rows holding the whole padded table, or
    ``n_bands`` of them, each holding the rows of ``band_cells`` slots."""

    capacity: int
    n_bands: int  # 1: one table holds the whole grid
    band_cells: int  # slots a band holds

    @property
    def banded(self) -> bool:
        return self.n_bands > 1


def banded_backward_fits(family: EdgeFamily, capacity: int) -> bool:
    """Whether the banded backward's static shared memory (see _BACKWARD_OP and _BAND_QUEUE) fits a block at
    this capacity: the band table, one accumulation table, record row and base sum a warp, and the warp's row
    queue, besides Warp's own 1 KiB."""
    scalar = family.scalar_name
    size = 4 if scalar == "float32" else 8
    warps = CAPACITIES[scalar][capacity]
    record = _record_width(2 * family.n_bases + 4, scalar)
    used = (1 + warps) * capacity * LANES * size + warps * LANES * (record + 1) * size + warps * (2 * LANES + 1) * 4
    return used + _WARP_STATIC_SMEM <= _STATIC_SMEM_LIMIT


def _plan(family: EdgeFamily, banded_capacities: dict, is_cuda: bool, n_coef: int, backward: bool,
          fits=lambda family, capacity: True) -> TablePlan | None:
    n_slots = family.n_slots(n_coef)
    if tiled_applies(family, is_cuda, n_coef, backward):
        return TablePlan(tiled_capacity(family, n_coef, backward), 1, n_slots)
    if family.single_slot or family.shared_table:  # one slot: no band can split it; a shared table: no tiles
        return None
    for capacity, most_bands in banded_capacities.get(family.scalar_name, ()) if is_cuda else ():
        if not fits(family, capacity):
            continue
        band_cells = capacity - (family.n_bases - 1)
        if band_cells <= 0:
            continue
        n_bands = -(-n_slots // band_cells)
        if n_bands <= most_bands:
            return TablePlan(capacity, n_bands, band_cells)
    return None


@functools.lru_cache(maxsize=None)  # a function of constants alone, asked several times a layer call
def forward_plan(family: EdgeFamily, is_cuda: bool, n_coef: int) -> TablePlan | None:
    """How the tiled forward pass runs a layer: on one table when :func:`tiled_applies`, else (float32) on
    bands of :data:`FORWARD_BANDED_CAPACITIES`; None when neither serves (the per-thread kernel does)."""
    return _plan(family, FORWARD_BANDED_CAPACITIES, is_cuda, n_coef, False,
                 lambda family, capacity: table_fits(family, capacity, False))


@functools.lru_cache(maxsize=None)  # a function of constants alone, asked several times a layer call
def backward_plan(family: EdgeFamily, is_cuda: bool, n_coef: int) -> TablePlan | None:
    """How the tiled backward pass runs a layer: on one table when :func:`tiled_applies`, else (float32) on
    bands of one of the tables of :data:`BANDED_CAPACITIES`, a band holding capacity - K + 1 slots; None when
    neither serves (the bucketed kernels do)."""
    return _plan(family, BANDED_CAPACITIES, is_cuda, n_coef, True, banded_backward_fits)


def backward_takes(n_out: int, all_params: bool, deterministic: bool, want_dx: bool, banded: bool = False) -> bool:
    """Whether the tiled backward pass can serve a call: it forms all three parameter gradients, and its dx
    is atomic-free (so deterministic) only within one tile of 32 outputs. Banded, neighbouring bands add
    into the same coefficients by atomics: not deterministic."""
    return all_params and not (deterministic and (banded or (want_dx and n_out > LANES)))


# ---------------------------------------------------------------------------------------------------- snippets
# Records: per lane (row) of the warp, RW scalars with 16-byte alignment, read back with VEC loads.
#   forward:  b_0 .. b_k, act, cell (bits)
#   backward: b_0 .. b_k, b'_0 .. b'_k, act, act', cell (bits)

_FORWARD_STEP = """
#if defined(__CUDA_ARCH__)
    // two buffers of padded coefficient rows (an input's, or a band of them: rows c0 .., for the block's 32
    // outputs, [row][lane]): step s reads buffer s & 1 while its loads for step s + 1 (rows next_c0 .. of
    // input next_i) are in flight, then stores them in the other
    __shared__ __align__(16) @T@ table[2 * @CAP@ * @LANES@];
    __shared__ __align__(16) @T@ records[@WARPS@ * @LANES@ * @RW@];
    const int n_in = coef_pad.shape[0];
    const int n_rows_pad = coef_pad.shape[1];
    const int n_out = coef_pad.shape[2];
    const int warp = threadIdx.x / @LANES@;
    const int oc = min(o0 + lane, n_out - 1);
    const int next_rows = @BANDED@ ? min(@CAP@, n_rows_pad - next_c0) : n_rows_pad;
    @T@ ahead[(@CAP@ + @WARPS@ - 1) / @WARPS@];
    if (next_i < n_in) {
        const char* src = (const char*)coef_pad.data + (size_t)next_i * coef_pad.strides[0]
                          + (size_t)next_c0 * coef_pad.strides[1] + (size_t)oc * coef_pad.strides[2];
        #pragma unroll
        for (int q = 0; q < (@CAP@ + @WARPS@ - 1) / @WARPS@; ++q) {
            const int r = warp + q * @WARPS@;
            if (r < next_rows) ahead[q] = *(const @T@*)(src + (size_t)r * coef_pad.strides[1]);
        }
    }
    if (process) {
        if (!@BANDED@ || c0 == 0) {  // an input's first band: the bands after it walk the same records
            @T@* mine = records + (warp * @LANES@ + lane) * @RW@;
            #pragma unroll
            for (int m = 0; m < @K@; ++m) mine[m] = b.c[m];
            mine[@K@] = act;
            mine[@K@ + 1] = @TO_T@(cell);
        }
        __syncwarp();
#if @BANDED@
        // only the rows whose cell lies in the band (off-grid rows have cell 0: band 0 adds their base term)
        const unsigned int in_band = __ballot_sync(0xffffffffu, cell >= c0 && cell < c0 + band_cells);
#endif
        const @T@* rows = table + (step & 1) * @CAP@ * @LANES@ + lane;
        const @T@ w = *(const @T@*)((const char*)base_weight_t.data + (size_t)i * base_weight_t.strides[0]
                                     + (size_t)oc * base_weight_t.strides[1]);
        const @T@* warp_records = records + warp * @LANES@ * @RW@;
        #pragma unroll
        for (int r = 0; r < @LANES@; ++r) {
#if @BANDED@
            if (!((in_band >> r) & 1u)) continue;
#endif
            @T@ rec[@RW@];
            #pragma unroll
            for (int v = 0; v < @RW@ / @VW@; ++v)
                *reinterpret_cast<@VEC@*>(rec + v * @VW@) = *reinterpret_cast<const @VEC@*>(warp_records + r * @RW@ + v * @VW@);
            const @T@* c = rows + (@FROM_T@(rec[@K@ + 1]) - (@BANDED@ ? c0 : 0)) * @LANES@;
            @T@ s = w * rec[@K@];
            #pragma unroll
            for (int m = 0; m < @K@; ++m) s += c[m * @LANES@] * rec[m];
            y_acc.c[r] += s;
        }
    }
    if (next_i < n_in) {
        @T@* dst = table + ((step + 1) & 1) * @CAP@ * @LANES@ + lane;
        #pragma unroll
        for (int q = 0; q < (@CAP@ + @WARPS@ - 1) / @WARPS@; ++q) {
            const int r = warp + q * @WARPS@;
            if (r < next_rows) dst[r * @LANES@] = ahead[q];
        }
    }
    __syncthreads();
#endif
    return y_acc;
"""

_STORE_ROWS = """
#if defined(__CUDA_ARCH__)
    if (o < y.shape[1]) {
        #pragma unroll
        for (int r = 0; r < @LANES@; ++r)
            if (n0 + r < y.shape[0])
                *(@T@*)((char*)y.data + (size_t)(n0 + r) * y.strides[0] + (size_t)o * y.strides[1]) = y_acc.c[r];
    }
#endif
"""

# op 0: load the block's coefficient rows, zero the warp's table; op 1: one step of 32 rows; op 2: flush.
_BACKWARD_OP = """
#if defined(__CUDA_ARCH__)
    __shared__ __align__(16) @T@ coefs[@CAP@ * @LANES@];              // the block's (input, outputs) rows
    __shared__ __align__(16) @T@ tables[@WARPS@ * @CAP@ * @LANES@];   // one accumulation table a warp
    __shared__ __align__(16) @T@ records[@WARPS@ * @LANES@ * @RW@];
    __shared__ @T@ base_sums[@WARPS@ * @LANES@];                         // sum_n dy[n, o] silu(x[n, i]) a lane
    const int warp = threadIdx.x / @LANES@;
    @T@* table = tables + warp * @CAP@ * @LANES@;
    @T@& base_sum = base_sums[warp * @LANES@ + lane];
    @VECL@ result;
    const int n_out = coef_pad.shape[2];
    const int n_coef = coef.shape[1];
    const int n_rows_pad = coef_pad.shape[1];
    const bool o_valid = o < n_out;
    const int oc = o_valid ? o : n_out - 1;
    // the band's rows c0 .. c0 + local_rows - 1 of the padded table (all of it when not banded: c0 = 0)
    if (!@BANDED@) c0 = 0;  // a compile-time 0: the whole-table code is that of a kernel without bands
    const int local_rows = min(@CAP@, n_rows_pad - c0);
    if (op == 0) {
        const char* src = (const char*)coef_pad.data + (size_t)i * coef_pad.strides[0] + (size_t)c0 * coef_pad.strides[1]
                          + (size_t)oc * coef_pad.strides[2];
        for (int r = warp; r < local_rows; r += @WARPS@) coefs[r * @LANES@ + lane] = *(const @T@*)(src + (size_t)r * coef_pad.strides[1]);
        for (int r = 0; r < local_rows; ++r) table[r * @LANES@ + lane] = ((@T@)0);
        base_sum = ((@T@)0);
        __syncthreads();
    }
    if (@BANDED@ && op == 0) return result;  // banded: dy is gathered per queued row, in the step
    if (!@BANDED@ && (op == 0 || op == 1)) {
        // dy of the rows n1 .. n1 + 31 for the next step (the first, for op 0): in flight during this one
        const int n1 = op == 0 ? n0 : n0 + @LANES@;
        const char* dy_col = (const char*)dy.data + (size_t)oc * dy.strides[1];
        #pragma unroll
        for (int r = 0; r < @LANES@; ++r)
            result.c[r] = (o_valid && n1 + r < n_end) ? *(const @T@*)(dy_col + (size_t)(n1 + r) * dy.strides[0]) : ((@T@)0);
        if (op == 0) return result;
    }
    if (op == 2) {
        if (!o_valid || n0 >= n_end) return result;
        const @T@ s = *(const @T@*)((const char*)scaler_t.data + (size_t)i * scaler_t.strides[0] + (size_t)oc * scaler_t.strides[1]);
        @T@ d_s = ((@T@)0);
        // the coefficients j whose padded row j + k lies in the band (neighbouring bands share k rows: both add)
        const int j_end = min(n_coef, c0 - @PAD@ + local_rows);
        for (int j = max(0, c0 - @PAD@); j < j_end; ++j) {
            const @T@ a = table[(j + @PAD@ - c0) * @LANES@ + lane];
            const @T@ cf = *(const @T@*)((const char*)coef.data + (size_t)i * coef.strides[0] + (size_t)j * coef.strides[1] + (size_t)oc * coef.strides[2]);
            d_s += cf * a;
            @T@* dc = deterministic
                ? (@T@*)((char*)partial_coef.data + (size_t)chunk * partial_coef.strides[0] + (size_t)i * partial_coef.strides[1]
                         + (size_t)j * partial_coef.strides[2] + (size_t)oc * partial_coef.strides[3])
                : (@T@*)((char*)d_coef.data + (size_t)i * d_coef.strides[0] + (size_t)j * d_coef.strides[1] + (size_t)oc * d_coef.strides[2]);
            if (deterministic) *dc = s * a; else atomicAdd(dc, s * a);
        }
        @T@* ds = deterministic
            ? (@T@*)((char*)partial_params.data + (size_t)chunk * partial_params.strides[0] + (size_t)i * partial_params.strides[2] + (size_t)oc * partial_params.strides[3])
            : (@T@*)((char*)d_scaler_t.data + (size_t)i * d_scaler_t.strides[0] + (size_t)oc * d_scaler_t.strides[1]);
        @T@* dbw = deterministic
            ? (@T@*)((char*)ds + partial_params.strides[1])
            : (@T@*)((char*)d_base_weight_t.data + (size_t)i * d_base_weight_t.strides[0] + (size_t)oc * d_base_weight_t.strides[1]);
        if (deterministic) { *ds = d_s; *dbw = base_sum; } else { atomicAdd(ds, d_s); atomicAdd(dbw, base_sum); }
        return result;
    }
    // op 1: stage this lane's row, then walk the warp's rows with lanes over outputs
    @T@* warp_records = records + warp * @LANES@ * @RW@;
    @T@ partial[@LANES@];
#if @BANDED@
    // The step's rows are the warp's queued rows of its band (see band_queue): slots 0 .. count - 1 are live,
    // in lane order, each with its row's offset from n0 in the record; partial[j] holds dy of slot j's row.
    const unsigned int in_band = __ballot_sync(0xffffffffu, matched != 0);
    if (in_band == 0u) return result;
    const int count = __popc(in_band);
    if (matched) {
        @T@* mine = warp_records + __popc(in_band & ((1u << lane) - 1u)) * @RW@;
        #pragma unroll
        for (int m = 0; m < @K@; ++m) { mine[m] = b.c[m]; mine[@K@ + m] = db.c[m]; }
        mine[2 * @K@] = act;
        mine[2 * @K@ + 1] = dact;
        mine[2 * @K@ + 2] = @TO_T@(cell - c0);
        mine[2 * @K@ + 3] = @TO_T@(row_offset);
    }
    __syncwarp();
    {
        const char* dy_col = (const char*)dy.data + (size_t)oc * dy.strides[1];
        #pragma unroll
        for (int j = 0; j < @LANES@; ++j) partial[j] = ((@T@)0);
        #pragma unroll
        for (int j = 0; j < @LANES@; ++j) {
            if (j >= count) break;  // warp-uniform: the loop costs the live rows only
            const int r = @FROM_T@(warp_records[j * @RW@ + 2 * @K@ + 3]);
            if (o_valid) partial[j] = *(const @T@*)(dy_col + (size_t)(n0 + r) * dy.strides[0]);
        }
    }
#else
    constexpr int count = @LANES@;
    @T@* mine = warp_records + lane * @RW@;
    #pragma unroll
    for (int m = 0; m < @K@; ++m) { mine[m] = b.c[m]; mine[@K@ + m] = db.c[m]; }
    mine[2 * @K@] = act;
    mine[2 * @K@ + 1] = dact;
    mine[2 * @K@ + 2] = @TO_T@(cell);
    // partial[r] holds dy[n0 + r, o] (loaded by the previous step) until row r is done, then its part of
    // dx[n0 + r, i]
    #pragma unroll
    for (int r = 0; r < @LANES@; ++r) partial[r] = g_now.c[r];
#endif
    __syncwarp();
    const @T@ w = *(const @T@*)((const char*)base_weight_t.data + (size_t)i * base_weight_t.strides[0] + (size_t)oc * base_weight_t.strides[1]);
    @T@ base_step = ((@T@)0);
    // Rows go in groups of @GROUP@. A row's table update is a read-modify-write of K rows, and the compiler
    // cannot tell two rows' cells apart, so row after row it would wait for the last stores before the next
    // loads. When a group's cells are K or more apart (a warp-uniform test), all its loads are issued ahead
    // of all its stores; otherwise its rows go one after the other.
    // Banded, only the first count slots are live (count is 32 otherwise, and the tests below fold away):
    // a group past them ends the walk, and a group they end in goes row by row, its dead rows skipped.
    #pragma unroll
    for (int r = 0; r < @LANES@; r += @GROUP@) {
        if (r >= count) break;
        @T@ rec[@GROUP@][@RW@];
        @T@* t[@GROUP@];
        @T@ g[@GROUP@];
        bool apart = r + @GROUP@ <= count;
        #pragma unroll
        for (int p = 0; p < @GROUP@; ++p) {
            if (r + p >= count) { t[p] = table + lane; g[p] = ((@T@)0); continue; }
            #pragma unroll
            for (int v = 0; v < @RW@ / @VW@; ++v)
                *reinterpret_cast<@VEC@*>(rec[p] + v * @VW@) = *reinterpret_cast<const @VEC@*>(warp_records + (r + p) * @RW@ + v * @VW@);
            const int cell = @FROM_T@(rec[p][2 * @K@ + 2]);
            t[p] = table + cell * @LANES@ + lane;
            g[p] = partial[r + p];
            #pragma unroll
            for (int q = 0; q < p; ++q) {
                const int gap = cell - @FROM_T@(rec[q][2 * @K@ + 2]);
                apart = apart && (gap >= @K@ || gap <= -@K@);
            }
            const @T@* c = coefs + cell * @LANES@ + lane;
            @T@ spline_grad = w * rec[p][2 * @K@ + 1];
            #pragma unroll
            for (int m = 0; m < @K@; ++m) spline_grad += c[m * @LANES@] * rec[p][@K@ + m];
            partial[r + p] = o_valid ? g[p] * spline_grad : ((@T@)0);  // a masked lane's 0 * NaN must not reach dx
            base_step += g[p] * rec[p][2 * @K@];
        }
        if (apart) {
            @T@ held[@GROUP@][@K@];
            #pragma unroll
            for (int p = 0; p < @GROUP@; ++p) {
                #pragma unroll
                for (int m = 0; m < @K@; ++m) held[p][m] = t[p][m * @LANES@];
            }
            #pragma unroll
            for (int p = 0; p < @GROUP@; ++p) {
                #pragma unroll
                for (int m = 0; m < @K@; ++m) t[p][m * @LANES@] = held[p][m] + g[p] * rec[p][m];
            }
        } else {
            #pragma unroll
            for (int p = 0; p < @GROUP@; ++p) {
                if (r + p >= count) break;
                #pragma unroll
                for (int m = 0; m < @K@; ++m) t[p][m * @LANES@] += g[p] * rec[p][m];
            }
        }
    }
    __syncwarp();
    if (want_dx) {
        // transpose reduction: after the step of width w a lane holds 2w-lane sums of w rows; at the end
        // lane l holds the sum over all lanes of row (slot) l (the steps are written out: nvcc keeps the
        // array in registers only with constant indices)
#define WARPKAN_TRANSPOSE_STEP(width) {                                                 \\
            const bool upper = (lane & (width)) != 0;                                   \\
            _Pragma("unroll")                                                           \\
            for (int j = 0; j < (width); ++j) {                                         \\
                const @T@ send = upper ? partial[j] : partial[j + (width)];             \\
                const @T@ keep = upper ? partial[j + (width)] : partial[j];             \\
                partial[j] = keep + __shfl_xor_sync(0xffffffffu, send, (width));        \\
            } }
#define WARPKAN_TRANSPOSE                                                               \\
        WARPKAN_TRANSPOSE_STEP(16) WARPKAN_TRANSPOSE_STEP(8) WARPKAN_TRANSPOSE_STEP(4)  \\
        WARPKAN_TRANSPOSE_STEP(2) WARPKAN_TRANSPOSE_STEP(1)
#if @BANDED@
        // few live slots (many bands): a 5-shuffle butterfly a slot is cheaper than the 31-shuffle transpose
        if (count <= @FEW@) {
            @T@ mine_sum = ((@T@)0);
            #pragma unroll
            for (int j = 0; j < @FEW@; ++j) {
                if (j >= count) break;
                @T@ v = partial[j];
                #pragma unroll
                for (int width = 16; width > 0; width >>= 1) v += __shfl_xor_sync(0xffffffffu, v, width);
                if (lane == j) mine_sum = v;
            }
            partial[0] = mine_sum;
        } else {
            WARPKAN_TRANSPOSE
        }
        const int n = lane < count ? n0 + @FROM_T@(warp_records[lane * @RW@ + 2 * @K@ + 3]) : n_end;
#else
        WARPKAN_TRANSPOSE
        const int n = n0 + lane;
#endif
#undef WARPKAN_TRANSPOSE_STEP
#undef WARPKAN_TRANSPOSE
        if (n < n_end) {
            @T@* d = (@T@*)((char*)dx.data + (size_t)n * dx.strides[0] + (size_t)i * dx.strides[1]);
            if (dx_write == 1) atomicAdd(d, partial[0]); else if (dx_write == 2) *d = partial[0]; else *d += partial[0];
        }
    }
    base_sum += base_step;
#endif
    return result;
"""


# The banded backward's row queue, one a warp: op 0 empties it; op 1 appends the row offsets of the lanes
# that matched (in lane order) and returns the length; op 2 hands slot ``lane`` of the first 32 to each lane
# (-1 past the length) and moves the rest to the front. A warp scans its rows 32 at a time for its band's
# and walks them 32 at a time, so the bases, records, dy loads and dx sums of a walk step serve 32 live rows
# however few a band holds.
_BAND_QUEUE = """
#if defined(__CUDA_ARCH__)
    __shared__ int queue[@WARPS@][2 * @LANES@ + 1];
    int* mine = queue[threadIdx.x / @LANES@];
    int* length = mine + 2 * @LANES@;
    if (op == 0) {
        if (lane == 0) *length = 0;
        __syncwarp();
        return 0;
    }
    const int len = *length;
    if (op == 1) {
        const unsigned int found = __ballot_sync(0xffffffffu, matched != 0);
        if (matched) mine[len + __popc(found & ((1u << lane) - 1u))] = offset;
        __syncwarp();
        if (lane == 0) *length = len + __popc(found);
        __syncwarp();
        return len + __popc(found);
    }
    const int taken = min(len, @LANES@);
    const int mine_offset = lane < taken ? mine[lane] : -1;
    __syncwarp();
    if (lane + @LANES@ < len) mine[lane] = mine[lane + @LANES@];
    __syncwarp();
    if (lane == 0) *length = len - taken;
    __syncwarp();
    return mine_offset;
#else
    return 0;
#endif
"""


def _render(snippet: str, family: EdgeFamily, rw: int, capacity: int, warps: int, banded: bool = False) -> str:
    scalar = family.scalar_name
    is_float = scalar == "float32"
    subs = {
        "@T@": "float" if is_float else "double",
        "@VEC@": "float4" if is_float else "double2",
        "@VECL@": f"wp::vec_t<{LANES}, {'wp::float32' if is_float else 'wp::float64'}>",
        "@VW@": "4" if is_float else "2",
        "@TO_T@": "__int_as_float" if is_float else "(double)",
        "@FROM_T@": "__float_as_int" if is_float else "(int)",
        "@K@": str(family.n_bases),
        "@PAD@": str(-family.first),
        "@RW@": str(rw),
        "@LANES@": str(LANES),
        "@CAP@": str(capacity),
        "@WARPS@": str(warps),
        "@GROUP@": str(ROW_GROUP[scalar]),
        "@BANDED@": "1" if banded else "0",
        "@FEW@": str(FEW_SLOTS),
    }
    for key, value in subs.items():
        snippet = snippet.replace(key, value)
    return snippet


@wp.func
def block_warp_lane(tid: int, warps: int, n_tiles: int):
    """(block / n_tiles, warp in block, lane, first output of the block's tile) of thread tid."""
    block = tid // (LANES * warps)
    in_block = tid - block * (LANES * warps)
    warp = in_block // LANES
    rest = block // n_tiles
    return rest, warp, in_block - warp * LANES, (block - rest * n_tiles) * LANES


def _record_width(values: int, scalar: str) -> int:
    per_vec = 4 if scalar == "float32" else 2
    return -(-values // per_vec) * per_vec


@functools.lru_cache(maxsize=None)
def tiled_kernels(family: EdgeFamily, capacity: int) -> TiledKernels:
    """The whole-table tiled kernels of one family at one table capacity. Warp compiles a module per block
    size, so the forward, the backward and the two small helpers have a module each (and a pass whose shared
    memory does not fit this capacity is never built: :func:`table_fits`)."""
    scalar = family.scalar_name
    if capacity not in CAPACITIES[scalar]:
        raise ValueError(f"capacity must be one of {sorted(CAPACITIES[scalar])}, got {capacity}")
    pad_coef, combine = helper_kernels(family)
    forward = _forward_kernel(family, capacity, False)
    backward = _backward_kernel(family, capacity, False)
    return TiledKernels((pad_coef.module.name, forward.module.name, backward.module.name), capacity,
                        CAPACITIES[scalar][capacity], pad_coef, forward, backward, combine)


@functools.lru_cache(maxsize=None)
def helper_kernels(family: EdgeFamily) -> tuple:
    """(pad_coef, combine): the padded-table builder and the deterministic combine, in a module of their own
    (shared by every capacity of the family)."""
    module = f"warpkan_edge_{family.key}_tiled_helpers"
    T = family.scalar
    first = family.first
    zero = T(0.0)
    kernel = functools.partial(wp.kernel, enable_backward=False, module=module)

    @kernel
    def pad_coef(coef: wp.array3d(dtype=T), scaler_t: wp.array2d(dtype=T), zero_grads: int, coef_pad: wp.array3d(dtype=T),
                 dx: wp.array2d(dtype=T), d_base_weight_t: wp.array2d(dtype=T), d_scaler_t: wp.array2d(dtype=T),
                 d_coef: wp.array3d(dtype=T)):
        # coef_pad[i, r, o] = s[i, o] C[i, r + first, o], zero outside the table. zero_grads (the backward's
        # overwrite mode): 1 zeroes the parameter gradients, 2 dx too; it saves a fill launch per gradient
        i, r, o = wp.tid()
        j = r + first
        value = zero
        inside = j >= 0 and j < coef.shape[1]
        if inside:
            value = scaler_t[i, o] * coef[i, j, o]
        coef_pad[i, r, o] = value
        if zero_grads > 0:
            if inside:
                d_coef[i, j, o] = zero
            if r == 0:
                d_scaler_t[i, o] = zero
                d_base_weight_t[i, o] = zero
        if zero_grads > 1:
            n_in = dx.shape[1]
            threads = coef_pad.shape[0] * coef_pad.shape[1] * coef_pad.shape[2]
            for e in range((i * coef_pad.shape[1] + r) * coef_pad.shape[2] + o, dx.shape[0] * n_in, threads):
                row = e // n_in
                dx[row, e - row * n_in] = zero

    @kernel
    def combine(partial_coef: wp.array4d(dtype=T), partial_params: wp.array4d(dtype=T), use_base: int,
                d_base_weight_t: wp.array2d(dtype=T), d_scaler_t: wp.array2d(dtype=T), d_coef: wp.array3d(dtype=T)):
        # fixed chunk order: bitwise reproducible. Rows j < n_coef are coefficients, row n_coef the scaler
        # and base weight.
        i, j, o = wp.tid()
        n_coef = d_coef.shape[1]
        if j < n_coef:
            acc = zero
            for chunk in range(partial_coef.shape[0]):
                acc += partial_coef[chunk, i, j, o]
            d_coef[i, j, o] = d_coef[i, j, o] + acc
        else:
            acc_s = zero
            acc_b = zero
            for chunk in range(partial_params.shape[0]):
                acc_s += partial_params[chunk, 0, i, o]
                acc_b += partial_params[chunk, 1, i, o]
            d_scaler_t[i, o] = d_scaler_t[i, o] + acc_s
            if use_base:
                d_base_weight_t[i, o] = d_base_weight_t[i, o] + acc_b

    return pad_coef, combine


def _module_name(family: EdgeFamily, capacity: int) -> str:
    return f"warpkan_edge_{family.key}_tiled_c{capacity}"


def _native(fn, snippet: str, family: EdgeFamily, kind: str, capacity: int, width: int, warps: int, banded: bool):
    """``fn`` as a native function with a name unique to (family, kind, capacity)."""
    fn.__name__ = fn.__qualname__ = f"tiled_{fn.__name__}_{kind}_{family.key}_c{capacity}"
    return wp.func_native(_render(snippet, family, width, capacity, warps, banded))(fn)


@functools.lru_cache(maxsize=None)
def _forward_kernel(family: EdgeFamily, capacity: int, banded: bool) -> wp.Kernel:
    """The tiled forward pass of one family at one table capacity, whole-table (in the capacity's module,
    with the helpers) or banded (see :func:`forward_plan`, a module of its own)."""
    T, Frame, vecK = family.scalar, family.Frame, family.vec
    vecL = wp.types.vector(length=LANES, dtype=T)
    values = edge_values(family)
    bases_at, silu = values.bases_at, values.silu
    module = _module_name(family, capacity) + ("_fwd_banded" if banded else "")
    zero = T(0.0)
    width = _record_width(family.n_bases + 2, family.scalar_name)

    def forward_step(y_acc: vecL, process: int, step: int, cell: int, b: vecK, act: T, coef_pad: wp.array3d(dtype=T),
                     base_weight_t: wp.array2d(dtype=T), i: int, c0: int, band_cells: int, next_i: int, next_c0: int,
                     o0: int, lane: int) -> vecL:
        return y_acc  # the stub's return gives Warp the native function's return type

    def store_rows(y_acc: vecL, y: wp.array2d(dtype=T), n0: int, o: int): ...

    kind = "banded" if banded else "whole"
    forward_step = _native(forward_step, _FORWARD_STEP, family, kind, capacity, width, FORWARD_WARPS, banded)
    store_rows = _native(store_rows, _STORE_ROWS, family, kind, capacity, width, FORWARD_WARPS, False)

    @functools.partial(wp.kernel, enable_backward=False, module=module)
    def forward(x: wp.array2d(dtype=T), frame: Frame, base_weight_t: wp.array2d(dtype=T), coef_pad: wp.array3d(dtype=T),
                bias: wp.array(dtype=T), use_base: int, has_bias: int, n_tiles: int, n_bands: int, band_cells: int,
                y: wp.array2d(dtype=T)):
        # block = (FORWARD_WARPS x 32 rows, 32 outputs); warp w takes rows n0 .. n0 + 31, lane the output. A
        # step is one (input, band) table: band b holds the slots [b band_cells, (b + 1) band_cells) (one
        # band, all slots, when not banded)
        row_group, warp, lane, o0 = block_warp_lane(wp.tid(), FORWARD_WARPS, n_tiles)
        n0 = (row_group * FORWARD_WARPS + warp) * LANES
        n_rows = x.shape[0]
        n = wp.min(n0 + lane, n_rows - 1)
        y_acc = vecL()
        if has_bias:
            bias_o = bias[wp.min(o0 + lane, y.shape[1] - 1)]
            for r in range(LANES):
                y_acc[r] = bias_o
        none = vecK()
        # the first step's table
        y_acc = forward_step(y_acc, 0, -1, 0, none, zero, coef_pad, base_weight_t, 0, 0, band_cells, 0, 0, o0, lane)
        step = int(0)
        for i in range(x.shape[1]):
            xv = x[n, i]
            valid, cell, b = bases_at(frame, n, i, xv)
            act = zero
            if use_base:
                act, dact, d2act = silu(xv)
            if wp.static(banded):
                for band in range(n_bands):
                    c0 = band * band_cells
                    next_i = i
                    next_c0 = c0 + band_cells
                    if band + 1 == n_bands:
                        next_i = i + 1
                        next_c0 = 0
                    y_acc = forward_step(y_acc, 1, step, cell, b, act, coef_pad, base_weight_t, i, c0, band_cells,
                                         next_i, next_c0, o0, lane)
                    step = step + 1
            else:  # step i: input i's table
                y_acc = forward_step(y_acc, 1, i, cell, b, act, coef_pad, base_weight_t, i, 0, band_cells, i + 1, 0,
                                     o0, lane)
        store_rows(y_acc, y, n0, o0 + lane)

    return forward

@functools.lru_cache(maxsize=None)
def _backward_kernel(family: EdgeFamily, capacity: int, banded: bool) -> wp.Kernel:
    """The tiled backward pass of one family at one table capacity, whole-table or banded (see
    :func:`backward_plan`), in a module of its own."""
    warps = CAPACITIES[family.scalar_name][capacity]
    T, Frame, vecK = family.scalar, family.Frame, family.vec
    vecL = wp.types.vector(length=LANES, dtype=T)
    values = edge_values(family)
    module = _module_name(family, capacity) + "_bwd"
    # a record: bases, their derivatives, silu, silu', cell (and, banded, the row's lane)
    width = _record_width(2 * family.n_bases + (4 if banded else 3), family.scalar_name)

    def backward_op(op: int, matched: int, row_offset: int, cell: int, c0: int, b: vecK, db: vecK, act: T, dact: T, g_now: vecL,
                    dy: wp.array2d(dtype=T), coef_pad: wp.array3d(dtype=T), coef: wp.array3d(dtype=T),
                    base_weight_t: wp.array2d(dtype=T), scaler_t: wp.array2d(dtype=T), i: int, o: int, lane: int,
                    n0: int, n_end: int, chunk: int, want_dx: int, dx_write: int, deterministic: int,
                    dx: wp.array2d(dtype=T), d_base_weight_t: wp.array2d(dtype=T), d_scaler_t: wp.array2d(dtype=T),
                    d_coef: wp.array3d(dtype=T), partial_coef: wp.array4d(dtype=T),
                    partial_params: wp.array4d(dtype=T)) -> vecL:
        return g_now

    def band_queue(op: int, matched: int, offset: int, lane: int) -> int:
        return 0

    kind = "banded" if banded else "whole"
    backward_op = _native(backward_op, _BACKWARD_OP, family, kind, capacity, width, warps, banded)
    band_queue = _native(band_queue, _BAND_QUEUE, family, kind, capacity, width, warps, banded)
    kernel = functools.partial(wp.kernel, enable_backward=False, module=module + ("_banded" if banded else ""))
    if banded:
        return _banded_backward(family, kernel, values, backward_op, band_queue, warps, Frame, T, vecK, vecL)
    return _whole_backward(family, kernel, values, backward_op, warps, Frame, T, vecK, vecL)


def _whole_backward(family, kernel, values, backward_op, warps, Frame, T, vecK, vecL):
    bases_dx_at, silu = values.bases_dx_at, values.silu
    zero = T(0.0)

    @kernel
    def backward(dy: wp.array2d(dtype=T), x: wp.array2d(dtype=T), frame: Frame, base_weight_t: wp.array2d(dtype=T),
                 scaler_t: wp.array2d(dtype=T), coef: wp.array3d(dtype=T), coef_pad: wp.array3d(dtype=T), use_base: int,
                 n_tiles: int, rows_per_chunk: int, n_bands: int, band_cells: int, want_dx: int, dx_write: int,
                 deterministic: int, dx: wp.array2d(dtype=T), d_base_weight_t: wp.array2d(dtype=T),
                 d_scaler_t: wp.array2d(dtype=T), d_coef: wp.array3d(dtype=T), partial_coef: wp.array4d(dtype=T),
                 partial_params: wp.array4d(dtype=T)):
        # block = (chunk group, input, output tile), laid out so that the blocks that run together share their
        # rows of dy and x; warp w takes chunk group * warps + w
        rest, warp, lane, o0 = block_warp_lane(wp.tid(), warps, n_tiles)
        o = o0 + lane
        n_in = x.shape[1]
        chunk_group = rest // n_in
        i = rest - chunk_group * n_in
        chunk = chunk_group * warps + warp
        n_rows = x.shape[0]
        n_start = chunk * rows_per_chunk
        n_end = wp.min(n_start + rows_per_chunk, n_rows)
        none = vecK()
        g = vecL()
        # op 0 loads the table (and the first step's dy; each op 1 step returns the next one's); x is read a
        # step ahead
        g = backward_op(0, 0, 0, 0, 0, none, none, zero, zero, g, dy, coef_pad, coef, base_weight_t, scaler_t, i,
                        o, lane, n_start, n_end, chunk, want_dx, dx_write, deterministic, dx, d_base_weight_t,
                        d_scaler_t, d_coef, partial_coef, partial_params)
        x_next = x[wp.min(n_start + lane, n_rows - 1), i]
        for n0 in range(n_start, n_end, LANES):
            n = n0 + lane
            xv = x_next
            x_next = x[wp.min(n + LANES, n_rows - 1), i]
            valid, cell, b, db = bases_dx_at(frame, wp.min(n, n_rows - 1), i, xv)
            act = zero
            dact = zero
            if use_base and n < n_end:  # a row past the chunk has g = 0, and 0 * silu(NaN) must not reach the sum
                act, dact, d2act = silu(xv)
            g = backward_op(1, 1, 0, cell, 0, b, db, act, dact, g, dy, coef_pad, coef, base_weight_t, scaler_t,
                            i, o, lane, n0, n_end, chunk, want_dx, dx_write, deterministic, dx, d_base_weight_t,
                            d_scaler_t, d_coef, partial_coef, partial_params)
        backward_op(2, 0, 0, 0, 0, none, none, zero, zero, g, dy, coef_pad, coef, base_weight_t, scaler_t, i, o, lane,
                    n_start, n_end, chunk, want_dx, dx_write, deterministic, dx, d_base_weight_t, d_scaler_t,
                    d_coef, partial_coef, partial_params)

    return backward


def _banded_backward(family, kernel, values, backward_op, band_queue, warps, Frame, T, vecK, vecL):
    bases_dx_at, slot_at, silu = values.bases_dx_at, values.slot_at, values.silu
    zero = T(0.0)

    @kernel
    def backward(dy: wp.array2d(dtype=T), x: wp.array2d(dtype=T), frame: Frame, base_weight_t: wp.array2d(dtype=T),
                 scaler_t: wp.array2d(dtype=T), coef: wp.array3d(dtype=T), coef_pad: wp.array3d(dtype=T), use_base: int,
                 n_tiles: int, rows_per_chunk: int, n_bands: int, band_cells: int, want_dx: int, dx_write: int,
                 deterministic: int, dx: wp.array2d(dtype=T), d_base_weight_t: wp.array2d(dtype=T),
                 d_scaler_t: wp.array2d(dtype=T), d_coef: wp.array3d(dtype=T), partial_coef: wp.array4d(dtype=T),
                 partial_params: wp.array4d(dtype=T)):
        # block = (chunk group, input, band, output tile). Band b holds the slots [b band_cells, (b + 1)
        # band_cells). A warp scans its chunk's rows for the band's (slot only), queues them, and walks the
        # queue 32 rows at a time; one more scan step past the end walks what is left.
        rest, warp, lane, o0 = block_warp_lane(wp.tid(), warps, n_tiles)
        o = o0 + lane
        n_in = x.shape[1]
        band_group = rest // n_bands
        c0 = (rest - band_group * n_bands) * band_cells
        chunk_group = band_group // n_in
        i = band_group - chunk_group * n_in
        chunk = chunk_group * warps + warp
        n_rows = x.shape[0]
        n_start = chunk * rows_per_chunk
        n_end = wp.min(n_start + rows_per_chunk, n_rows)
        none = vecK()
        g = vecL()
        g = backward_op(0, 0, 0, 0, c0, none, none, zero, zero, g, dy, coef_pad, coef, base_weight_t, scaler_t, i,
                        o, lane, n_start, n_end, chunk, want_dx, dx_write, deterministic, dx, d_base_weight_t,
                        d_scaler_t, d_coef, partial_coef, partial_params)
        queued = band_queue(0, 0, 0, lane)
        x_next = x[wp.min(n_start + lane, n_rows - 1), i]
        for n0 in range(n_start, n_end + LANES, LANES):
            n = n0 + lane
            xv = x_next
            x_next = x[wp.min(n + LANES, n_rows - 1), i]  # in flight during this step
            valid, cell = slot_at(frame, wp.min(n, n_rows - 1), i, xv)
            # invalid rows (slot 0, zero bases) fall in band 0, which adds their base term
            matched = n < n_end and cell >= c0 and cell < c0 + band_cells
            queued = band_queue(1, wp.where(matched, 1, 0), n - n_start, lane)
            if queued >= LANES or (n0 >= n_end and queued > 0):
                offset = band_queue(2, 0, 0, lane)
                live = offset >= 0
                nq = n_start + wp.max(offset, 0)
                xq = x[nq, i]
                valid, cell, b, db = bases_dx_at(frame, nq, i, xq)
                act = zero
                dact = zero
                if use_base and live:
                    act, dact, d2act = silu(xq)
                g = backward_op(1, wp.where(live, 1, 0), offset, cell, c0, b, db, act, dact, g, dy, coef_pad,
                                coef, base_weight_t, scaler_t, i, o, lane, n_start, n_end, chunk, want_dx,
                                dx_write, deterministic, dx, d_base_weight_t, d_scaler_t, d_coef, partial_coef,
                                partial_params)
        backward_op(2, 0, 0, 0, c0, none, none, zero, zero, g, dy, coef_pad, coef, base_weight_t, scaler_t, i, o, lane,
                    n_start, n_end, chunk, want_dx, dx_write, deterministic, dx, d_base_weight_t, d_scaler_t,
                    d_coef, partial_coef, partial_params)

    return backward


def _forward_build(family: EdgeFamily, capacity: int, banded: bool) -> ModuleBuild:
    return ModuleBuild(_forward_kernel(family, capacity, banded).module.name, FORWARD_WARPS * LANES)


def _backward_build(family: EdgeFamily, capacity: int, banded: bool) -> ModuleBuild:
    return ModuleBuild(_backward_kernel(family, capacity, banded).module.name,
                       CAPACITIES[family.scalar_name][capacity] * LANES)


def _helpers_build(family: EdgeFamily) -> ModuleBuild:
    return ModuleBuild(helper_kernels(family)[0].module.name, DEFAULT_BLOCK_DIM)


def tiled_modules(family: EdgeFamily) -> tuple:
    """The Warp modules (:class:`ModuleBuild`, at their launches' block sizes) of every tiled kernel a layer of
    this family may launch on CUDA: the helpers, each whole-table capacity's forward and backward where their
    shared memory fits, and the banded ones. Builds their kernels, so that ``wp.load_module`` finds them
    (``warpkan precompile``)."""
    if family.shared_table:  # never tiled (tiled_applies)
        return ()
    scalar = family.scalar_name
    builds = [_helpers_build(family)]
    for capacity in CAPACITIES.get(scalar, {}):
        if table_fits(family, capacity, False):
            builds.append(_forward_build(family, capacity, False))
        if table_fits(family, capacity, True):
            builds.append(_backward_build(family, capacity, False))
    if family.single_slot:  # no bands
        return distinct(builds)
    for capacity in sorted({capacity for capacity, _bands in FORWARD_BANDED_CAPACITIES.get(scalar, ())
                            if table_fits(family, capacity, False)}):
        # a table that needs one band of this capacity runs its whole-table kernel
        builds += [_forward_build(family, capacity, False), _forward_build(family, capacity, True)]
    for capacity in sorted({capacity for capacity, _bands in BANDED_CAPACITIES.get(scalar, ())
                            if banded_backward_fits(family, capacity)}):
        builds.append(_backward_build(family, capacity, True))
    return distinct(builds)


def planned_modules(family: EdgeFamily, n_coef: int) -> tuple:
    """The tiled modules (:class:`ModuleBuild`) one layer with ``n_coef`` coefficients per input launches on
    CUDA (forward and backward plans, and the helpers they use), building their kernels."""
    builds = []
    plan = forward_plan(family, True, n_coef)
    if plan is not None:
        builds += [_forward_build(family, plan.capacity, plan.banded), _helpers_build(family)]
    plan = backward_plan(family, True, n_coef)
    if plan is not None:
        builds += [_backward_build(family, plan.capacity, plan.banded), _helpers_build(family)]
    return distinct(builds)


def _tiles(n_out: int) -> int:
    return -(-n_out // LANES)


def _planned(family: EdgeFamily, plan_of, pass_name: str, coef) -> tuple:
    """(table plan, coefficient-padding kernel) of a tiled pass over ``coef``; raises when the pass cannot run
    it (not CUDA, or a table past its plans)."""
    if not coef.device.is_cuda:
        raise ValueError("the tiled edge kernels run on CUDA devices only")
    plan = plan_of(family, True, coef.shape[1])
    if plan is None:
        raise ValueError(f"table too long for the tiled {pass_name} pass in {family.scalar_name}: "
                         f"{family.padded_rows(coef.shape[1])} padded rows")
    return plan, _pad_kernel(family, plan)


def _pad_kernel(family: EdgeFamily, plan: TablePlan) -> wp.Kernel:
    """The coefficient-padding kernel (one for every table of the family)."""
    return helper_kernels(family)[0]


def coef_pad_shape(family: EdgeFamily, coef_shape) -> tuple:
    """Shape of the scaled, padded coefficient table for coef [in, n_coef, out]."""
    n_in, n_coef, n_out = coef_shape
    return (n_in, family.padded_rows(n_coef), n_out)


def partial_shapes(n_rows: int, n_in: int, n_coef: int, n_out: int) -> tuple:
    """Shapes of the deterministic backward's per-chunk partials: (coefficients, [scaler; base weight])."""
    n_chunks = -(-n_rows // backward_rows_per_chunk(n_rows, n_in, n_out))
    return (n_chunks, n_in, n_coef, n_out), (n_chunks, 2, n_in, n_out)


def launch_tiled_forward(family: EdgeFamily, frame, x, base_weight_t, scaler_t, coef, bias, y, use_base: bool = True,
                         stream=None, workspace=None, coef_pad=None, record: bool = False):
    """The edge forward on the tiled kernels (CUDA, a table within :func:`forward_plan`). Overwrites y.
    ``bias`` [out] or None. ``coef_pad`` (:func:`coef_pad_shape`) is scratch, taken from ``workspace`` when not
    given. ``record=True`` runs nothing and returns the recorded launches."""
    plan, pad_coef = _planned(family, forward_plan, "forward", coef)
    forward = _forward_kernel(family, plan.capacity, plan.banded)
    n_rows, n_out = x.shape[0], coef.shape[2]
    if n_rows == 0 or n_out == 0:
        return [] if record else None
    if coef_pad is None:
        coef_pad = (workspace or workspace_for(x.device, stream)).get("tiled_coef_pad",
                                                                       coef_pad_shape(family, coef.shape), coef.dtype)
    cmds = []
    with on_stream(None if record else stream):
        cmds += launch(pad_coef, tuple(coef_pad.shape), [coef, scaler_t, 0], [coef_pad, None, None, None, None],
                       x.device, stream, True) if record else []
        if not record:
            launch(pad_coef, tuple(coef_pad.shape), [coef, scaler_t, 0], [coef_pad, None, None, None, None],
                   x.device, stream)
        n_tiles = _tiles(n_out)
        block = _forward_build(family, plan.capacity, plan.banded).block_dim
        args = ([x, frame, base_weight_t, coef_pad, bias, int(use_base), int(bias is not None), n_tiles, plan.n_bands,
                 plan.band_cells], [y])
        cmds += launch(forward, -(-n_rows // block) * n_tiles * block, *args, x.device, stream, record, block) or []
    return cmds if record else None


def backward_rows_per_chunk(n_rows: int, n_in: int, n_out: int, n_bands: int = 1) -> int:
    """Rows per warp of the tiled backward pass: a function of the shapes alone (so the deterministic
    mode's summation order is fixed), a multiple of 32."""
    items = max(1, n_in * _tiles(n_out) * n_bands)
    rows = -(-n_rows * items // _BACKWARD_TARGET_WARPS)
    rows = max(_MIN_CHUNK_ROWS, -(-rows // LANES) * LANES)
    return min(rows, -(-n_rows // LANES) * LANES)


def launch_tiled_backward(family: EdgeFamily, frame, dy, x, base_weight_t, scaler_t, coef, use_base: bool = True,
                          dx=None, d_base_weight_t=None, d_scaler_t=None, d_coef=None, deterministic: bool = False,
                          stream=None, workspace=None, coef_pad=None, partial_coef=None, partial_params=None,
                          overwrite: bool = False, record: bool = False):
    """Accumulate (+=) dx (when given) and all three parameter gradients (required) of the tiled forward,
    in one pass; ``overwrite=True`` sets them instead (no zero-filled buffers needed). ``deterministic``:
    per-chunk partials added in a fixed order (dx is then exact too when out <= 32; with more outputs its
    per-tile parts are added by atomics and it is refused). Scratch (``coef_pad``, and the partials of
    :func:`partial_shapes` when deterministic) is taken from ``workspace`` when not given. ``record=True``
    runs nothing and returns the recorded launches."""
    plan, pad_coef = _planned(family, backward_plan, "backward", coef)
    backward = _backward_kernel(family, plan.capacity, plan.banded)
    warps = CAPACITIES[family.scalar_name][plan.capacity]
    n_rows, n_in = x.shape
    n_coef, n_out = coef.shape[1], coef.shape[2]
    if d_coef is None or d_base_weight_t is None or d_scaler_t is None:
        raise ValueError("the tiled backward pass forms every parameter gradient: pass d_base_weight_t, "
                         "d_scaler_t and d_coef")
    if n_rows == 0 or n_in == 0 or n_out == 0:
        if overwrite:
            if record:
                raise ValueError("nothing to record for an empty layer")
            for grad in (dx, d_base_weight_t, d_scaler_t, d_coef):
                if grad is not None:
                    grad.zero_()
        return [] if record else None
    if not backward_takes(n_out, True, deterministic, dx is not None, plan.banded):
        raise ValueError("the tiled backward pass is deterministic on one table only, and with dx for at most "
                         "32 outputs")
    n_tiles = _tiles(n_out)
    T = family.scalar
    if coef_pad is None or (deterministic and (partial_coef is None or partial_params is None)):
        ws = workspace or workspace_for(x.device, stream)
        if coef_pad is None:
            coef_pad = ws.get("tiled_coef_pad", coef_pad_shape(family, coef.shape), T)
        if deterministic:
            coef_shape, params_shape = partial_shapes(n_rows, n_in, n_coef, n_out)
            partial_coef = partial_coef if partial_coef is not None else ws.get("tiled_partial_coef", coef_shape, T)
            partial_params = (partial_params if partial_params is not None
                              else ws.get("tiled_partial_params", params_shape, T))
    rows_per_chunk = backward_rows_per_chunk(n_rows, n_in, n_out, plan.n_bands)
    n_chunks = -(-n_rows // rows_per_chunk)
    # dx: added by atomics across output tiles; with one tile, set (overwrite) or added in place
    dx_write = 1 if n_tiles > 1 else (2 if overwrite else 0)
    zero_grads = (2 if dx is not None and n_tiles > 1 else 1) if overwrite else 0
    steps = [(pad_coef, tuple(coef_pad.shape), [coef, scaler_t, zero_grads],
              [coef_pad, dx, d_base_weight_t, d_scaler_t, d_coef], _helpers_build(family).block_dim),
             # dx and the partials may be None (null arrays): the kernel does not touch what it was not asked for
             (backward, -(-n_chunks // warps) * n_in * plan.n_bands * n_tiles * warps * LANES,
              [dy, x, frame, base_weight_t, scaler_t, coef, coef_pad, int(use_base), n_tiles, rows_per_chunk,
               plan.n_bands, plan.band_cells, int(dx is not None), dx_write, int(deterministic)],
              [dx, d_base_weight_t, d_scaler_t, d_coef, partial_coef if deterministic else None,
               partial_params if deterministic else None],
              _backward_build(family, plan.capacity, plan.banded).block_dim)]
    if deterministic:  # one table (backward_takes): its capacity's module has the combine
        steps.append((helper_kernels(family)[1], (n_in, n_coef + 1, n_out),
                      [partial_coef, partial_params, int(use_base)], [d_base_weight_t, d_scaler_t, d_coef],
                      _helpers_build(family).block_dim))
    cmds = []
    with on_stream(None if record else stream):
        for kernel, dim, inputs, outputs, block in steps:
            cmds += launch(kernel, dim, inputs, outputs, x.device, stream, record, block) or []
    return cmds if record else None
