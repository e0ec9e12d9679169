"""The engine's fused small-layer kernels: the gemm strategy of a small layer in one forward kernel (two when
its width is split) and at most two backward kernels, written with Warp's tile API.

Why: at small shapes the gemm strategy (:mod:`.dense` and cuBLAS through the host framework) is a chain of
7-10 launches of a few microseconds each (weight combine, basis expansion, GEMMs, contraction, split), and
the layer is bound by their count, not by its arithmetic. These kernels compute the same maps,

    y = A W (+ bias),   dA = dy W^T (contracted with dA/dx into dx),   dW = A^T dy,

with A [rows, width] the dense basis of :mod:`.dense` (the silu column of each input when the base path is
fused, then its n_coef bases) and W [width, out] the gemm strategy's combined weight (``[base_weight_t;
coef * scaler_t]``, or the coefficient table [in n_coef, out] of an unscaled family). A is built in shared
memory a chunk at a time, never in global memory, and the products are Warp's ``tile_matmul``.

Chunks of whole inputs. A block takes the width in chunks of ``tiles.width`` columns, each holding whole
inputs: with ``stride = n_coef + use_base`` columns an input (its silu column first, then its bases), chunk c
holds the inputs ``c P .. c P + P - 1``, P = width // stride, and its columns past ``P stride`` are zero. The
chunk's rows of W are gathered in that order through an index tile (``tile_load_indexed``; -1, the padding,
reads zero) and dW's rows scattered through the same tile (``tile_store_indexed``; -1 is skipped). Whole
inputs a chunk: every x-gradient entry dx[n, i] lies in one chunk, so one thread contracts it and writes it
once (no atomics, no sum across chunks or blocks).

- **Forward** (one kernel, and a combine when split): a block per (row tile, output tile). Per chunk: the
  basis tile A [rows, width] in shared memory (a thread per (row, input) entry evaluates the family's bases
  once, :mod:`._values`, and writes its stride columns), W's chunk rows [width, outs], ``acc += A W``
  (``tile_matmul``). Then ``y = acc + bias``. A layer of few tiles and many chunks splits its chunks into
  groups, a block each (:data:`TARGET_BLOCKS`), whose partial y a second launch adds in group order.
- **Backward** (at most two kernels): (1) a block per (row tile, chunk): ``dA = dy W_chunk^T`` over the output
  tiles, contracted per entry with dB/dx (and silu') into dx, and the row tile's partial ``A^T dy`` of the
  chunk's rows of dW; (2) ``d_weight`` = the sum of the row tiles' partials in row-tile order
  (``launch_combine_chunks``), skipped when one row tile writes ``d_weight`` itself. Deterministic: every sum
  has a fixed order. Splitting ``d_weight`` into the parameters is the caller's (``launch_split_param_grads``).

Per-thread writes into a shared tile go through ``tile_scatter_masked``, which synchronises the block after
each call: a chunk costs about rows x width / block threads barriers to build (every thread writes stride
columns per step of its entries).

Compile keys: a module per (family key, tile configuration), from the short list :data:`TILES` (a module with
``tile_matmul`` takes ~30 s to compile on the GPU). Compiled ahead of time for sm_90 (NVRTC, no GPU), the
module of tiles r32_w64_o64 at float32 uses cuBLASDx for its three products and declares 41 KB of shared
memory a block in the forward kernel, 66 KB in the backward kernel.
"""

import functools
from dataclasses import dataclass

import warp as wp

from .._runtime import launch, launch_combine_chunks, workspace_for
from ._values import edge_values
from .dense import basis_entry, dense_width
from .family import EdgeFamily

__all__ = ["FusedTiles", "FusedPlan", "TILES", "BLOCK_DIM", "MAX_ROWS", "MAX_OUT", "MAX_PARTIAL",
           "TARGET_BLOCKS", "MIN_CHUNKS_PER_SPLIT", "FusedKernels", "fused_kernels", "fused_modules", "fused_tiles",
           "fused_plan", "fused_applies", "launch_fused_forward", "launch_fused_backward"]


@dataclass(frozen=True)
class FusedTiles:
    """One tile configuration: rows of x a block, width of a basis chunk, outputs of a y / dy tile."""

    rows: int
    width: int
    outs: int

    def __post_init__(self):
        for name in ("rows", "width", "outs"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 8 <= value <= 128 or value % 8:
                raise ValueError(f"tile {name} must be a multiple of 8 in 8 .. 128, got {value!r}")

    @property
    def name(self) -> str:
        return f"r{self.rows}_w{self.width}_o{self.outs}"


# The tile configurations the launchers choose from (one module each per family key, :func:`fused_tiles`):
# 64 outputs a tile, or 32 for narrow layers and float64 (half the shared memory of a float32 tile per
# element); 64 rows for a float32 batch of 33-64 rows, which then takes one row tile: the backward writes dW
# itself, without partials (PolyKAN (64, 256 -> 512, D=15): 16 MB of partial dW written and read back
# otherwise). A caller may pass another FusedTiles (a module of its own): the timing script measures
# candidates that way.
TILES = (FusedTiles(32, 64, 64), FusedTiles(32, 64, 32), FusedTiles(64, 64, 64))
BLOCK_DIM = 128  # threads a block on the GPU (Warp runs one on the CPU)
# Where the fused kernels are meant to run (:func:`fused_applies`): few enough rows and outputs for a small
# layer (the backward loops over the output tiles), and per-row-tile partials of dW of at most MAX_PARTIAL
# elements. Where the kernels' shape is meant to hold, not measured crossovers.
MAX_ROWS = 2048
MAX_OUT = 1024
MAX_PARTIAL = 1 << 22
# The forward splits its chunks into groups, a block each, until about TARGET_BLOCKS blocks run (a wave on a
# large GPU), keeping at least MIN_CHUNKS_PER_SPLIT chunks a group: a layer of few row and output tiles and a
# long width (PolyKAN 256 -> 512 at batch 64: 16 tiles of 64 chunks) would otherwise run its whole width on a
# few SMs, one chunk after the other. The groups' partial y are then added in group order by a second launch
# (a few microseconds in a CUDA graph, about what a chunk's step of loads, barriers and GEMM is expected to
# cost: hence groups of two chunks or more). Both are estimates, not yet measured on the GPU
# (scripts/fused_small_timing.py --plans sweeps them).
TARGET_BLOCKS = 128
MIN_CHUNKS_PER_SPLIT = 2


@dataclass(frozen=True)
class FusedKernels:
    module: str
    tiles: FusedTiles
    forward: wp.Kernel
    backward: wp.Kernel


@dataclass(frozen=True)
class FusedPlan:
    """How the fused kernels cover one layer: the tiles, the grid, and the scratch of the partial sums."""

    tiles: FusedTiles
    width: int  # columns of the dense basis (rows of W)
    row_tiles: int  # at least 1 (an empty batch still writes a zero dW)
    out_tiles: int
    chunks: int  # chunks of whole inputs (see the module docstring)
    splits: int  # the forward's chunk groups (1: the forward kernel writes y itself)

    @property
    def chunks_per_split(self) -> int:
        return -(-self.chunks // self.splits)

    def forward_partial_shape(self, n_rows: int, n_out: int) -> tuple:
        """[splits, rows, out] partial y of the forward's chunk groups; none (leading 0) for one group."""
        return (self.splits if self.splits > 1 else 0, n_rows, n_out)

    def backward_partial_shape(self, n_out: int) -> tuple:
        """[row tiles, width, out] partial dW of the backward's row tiles; none (leading 0) for one row tile."""
        return (self.row_tiles if self.row_tiles > 1 else 0, self.width, n_out)


def fused_tiles(family: EdgeFamily, n_rows: int, n_out: int) -> FusedTiles:
    """The tile configuration of a layer (see :data:`TILES`): 32 outputs a tile for float64 or at most 32
    outputs; else 64, on 64 rows for a batch of 33-64 rows."""
    if family.scalar_name == "float64" or n_out <= 32:
        return TILES[1]
    return TILES[2] if 32 < n_rows <= 64 else TILES[0]


def fused_plan(family: EdgeFamily, n_rows: int, n_in: int, n_coef: int, n_out: int, use_base: bool,
               tiles: "FusedTiles | None" = None) -> FusedPlan:
    """The plan of a layer (``tiles`` default: :func:`fused_tiles`)."""
    tiles = tiles or fused_tiles(family, n_rows, n_out)
    per_chunk = tiles.width // (n_coef + int(use_base))
    if per_chunk < 1:
        raise ValueError(f"n_coef must be at most {tiles.width - int(use_base)} (an input's columns within one "
                         f"chunk), got {n_coef}")
    chunks = -(-n_in // per_chunk)
    row_tiles, out_tiles = max(1, -(-n_rows // tiles.rows)), -(-n_out // tiles.outs)
    splits = max(1, min(-(-TARGET_BLOCKS // max(1, row_tiles * out_tiles)), chunks // MIN_CHUNKS_PER_SPLIT))
    splits = -(-chunks // -(-chunks // splits)) if chunks else 1  # no empty group
    return FusedPlan(tiles, dense_width(n_in, n_coef, use_base), row_tiles, out_tiles, chunks, splits)


def fused_applies(family: EdgeFamily, n_rows: int, n_in: int, n_coef: int, n_out: int, use_base: bool = True) -> bool:
    """Whether the fused kernels take this layer: a family with a table per input (not a shared table, whose
    dense basis would have a column per row of the whole table), an input's columns within one chunk, and a
    small layer (:data:`MAX_ROWS`, :data:`MAX_OUT`, :data:`MAX_PARTIAL`), where the gemm strategy's launches
    dominate."""
    if family.shared_table or n_coef < 1 or n_coef + int(use_base) > fused_tiles(family, n_rows, n_out).width:
        return False
    plan = fused_plan(family, n_rows, n_in, n_coef, n_out, use_base)
    partial = plan.backward_partial_shape(n_out)
    return n_rows <= MAX_ROWS and n_out <= MAX_OUT and partial[0] * partial[1] * partial[2] <= MAX_PARTIAL


@functools.lru_cache(maxsize=None)
def fused_kernels(family: EdgeFamily, tiles: FusedTiles) -> FusedKernels:
    if family.shared_table:
        raise ValueError(f"the fused kernels take a table per input; {family.key} shares one table among its "
                         "inputs (its layers run the stencil kernels)")
    if not isinstance(tiles, FusedTiles):
        raise TypeError(f"tiles must be a FusedTiles, got {type(tiles).__name__}")
    module = f"warpkan_edge_{family.key}_fused_{tiles.name}"
    kernel = functools.partial(wp.kernel, enable_backward=False, module=module)
    weight_rows, basis_tile, contract_tile = _tile_funcs(family, tiles)
    forward = _forward_kernel(family, tiles, kernel, weight_rows, basis_tile)
    backward = _backward_kernel(family, tiles, kernel, weight_rows, basis_tile, contract_tile)
    return FusedKernels(module, tiles, forward, backward)


def fused_modules(family: EdgeFamily) -> list[str]:
    """The Warp modules the launchers may choose for a family (each of :data:`TILES` that
    :func:`fused_tiles` picks for some layer), built: what a precompile step loads."""
    if family.shared_table:
        return []
    chosen = {fused_tiles(family, n_rows, n_out) for n_rows in (1, 64, MAX_ROWS) for n_out in (1, MAX_OUT)}
    return [fused_kernels(family, tiles).module for tiles in TILES if tiles in chosen]


def _tile_funcs(family: EdgeFamily, tiles: FusedTiles):
    """The block-wide pieces of a chunk: the index tile of its rows of W, its basis tile, and the contraction of
    its basis gradient into dx (see the module docstring for the chunk layout)."""
    scalar, Frame, first = family.scalar, family.Frame, family.first
    ROWS, WIDTH = tiles.rows, tiles.width
    values = edge_values(family)
    bases_at, bases_dx_at, silu = values.bases_at, values.bases_dx_at, values.silu
    entry = basis_entry(family)
    zero = scalar(0.0)

    @wp.func
    def weight_rows(i0: int, per_chunk: int, stride: int, n_in: int, n_coef: int, use_base: int, lane: int):
        # column c of the chunk is column j of input i0 + c // stride: W's row of that input's silu (j = 0 when
        # use_base) or of its coefficient j - use_base; -1 past the chunk's inputs
        rows = wp.tile_zeros(shape=(WIDTH,), dtype=wp.int32, storage="shared")
        n_threads = wp.block_dim()
        for step in range((WIDTH + n_threads - 1) // n_threads):
            c = step * n_threads + lane
            k = c // stride
            j = c - k * stride
            i = i0 + k
            row = int(-1)
            if k < per_chunk and i < n_in:
                if use_base != 0 and j == 0:
                    row = i
                else:
                    row = use_base * n_in + i * n_coef + j - use_base
            wp.tile_scatter_masked(rows, c, row, c < WIDTH)
        return rows

    @wp.func
    def basis_tile(x: wp.array2d(dtype=scalar), frame: Frame, row0: int, i0: int, per_chunk: int, stride: int,
                   use_base: int, lane: int, needed: bool):
        # A[r, k stride + j]: entry (row0 + r, input i0 + k) of the dense basis (zero past the rows or inputs);
        # all zero, without its barriers, when not needed
        a = wp.tile_zeros(shape=(ROWS, WIDTH), dtype=scalar, storage="shared")
        n_threads = wp.block_dim()
        n_entries = int(0)
        if needed:
            n_entries = ROWS * per_chunk
        for step in range((n_entries + n_threads - 1) // n_threads):
            e = step * n_threads + lane
            r = e // per_chunk
            k = e - r * per_chunk
            n = row0 + r
            i = i0 + k
            b = family.vec()
            start = int(0)
            base_value = zero
            if e < n_entries and n < x.shape[0] and i < x.shape[1]:
                xv = x[n, i]
                valid, slot, b = bases_at(frame, n, i, xv)
                start = slot + first + use_base  # the column of b[0]; b is zero when invalid
                if use_base != 0:
                    base_value, d_silu, d2_silu = silu(xv)
            for j in range(stride):
                value = entry(b, j - start)
                if use_base != 0 and j == 0:
                    value = base_value
                wp.tile_scatter_masked(a, r, k * stride + j, value, e < n_entries)
        return a

    @wp.func
    def contract_tile(x: wp.array2d(dtype=scalar), frame: Frame, row0: int, i0: int, per_chunk: int, stride: int,
                      use_base: int, lane: int, d_a: wp.tile(dtype=scalar, shape=(ROWS, WIDTH)),
                      dx: wp.array2d(dtype=scalar)):
        # dx[n, i] = dA[r, k stride] silu'(x) (use_base) + sum_j dA[r, k stride + j] dB/dx: one thread an entry,
        # written once (overwrites)
        n_threads = wp.block_dim()
        n_entries = ROWS * per_chunk
        for step in range((n_entries + n_threads - 1) // n_threads):
            e = step * n_threads + lane
            r = e // per_chunk
            k = e - r * per_chunk
            n = row0 + r
            i = i0 + k
            if e < n_entries and n < x.shape[0] and i < x.shape[1]:
                xv = x[n, i]
                valid, slot, b, db = bases_dx_at(frame, n, i, xv)
                start = slot + first + use_base
                col = k * stride
                acc = zero
                for j in range(use_base, stride):
                    acc = acc + d_a[r, col + j] * entry(db, j - start)
                if use_base != 0:
                    silu_value, d_silu, d2_silu = silu(xv)
                    acc = acc + d_a[r, col] * d_silu
                dx[n, i] = acc

    return weight_rows, basis_tile, contract_tile


def _forward_kernel(family: EdgeFamily, tiles: FusedTiles, kernel, weight_rows, basis_tile):
    scalar, Frame = family.scalar, family.Frame
    ROWS, WIDTH, OUTS = tiles.rows, tiles.width, tiles.outs

    @kernel
    def fused_forward(x: wp.array2d(dtype=scalar), frame: Frame, weight: wp.array2d(dtype=scalar),
                      bias: wp.array(dtype=scalar), use_base: int, n_coef: int, chunks_per_split: int,
                      y: wp.array3d(dtype=scalar)):
        # y [splits, rows, out]: the sum over chunk group `split` (y itself for one group); the bias in group 0
        row_tile, out_tile, split, lane = wp.tid()
        row0 = row_tile * ROWS
        out0 = out_tile * OUTS
        n_in = x.shape[1]
        stride = n_coef + use_base
        per_chunk = WIDTH // stride
        first_chunk = split * chunks_per_split
        end_chunk = wp.min(first_chunk + chunks_per_split, (n_in + per_chunk - 1) // per_chunk)
        acc = wp.tile_zeros(shape=(ROWS, OUTS), dtype=scalar, storage="shared")
        for chunk in range(first_chunk, end_chunk):
            i0 = chunk * per_chunk
            rows = weight_rows(i0, per_chunk, stride, n_in, n_coef, use_base, lane)
            a = basis_tile(x, frame, row0, i0, per_chunk, stride, use_base, lane, True)
            w = wp.tile_load_indexed(weight, indices=rows, shape=(WIDTH, OUTS), offset=(0, out0), axis=0,
                                     storage="shared")
            wp.tile_matmul(a, w, acc)
        # out = acc (+ bias), element by element: consecutive threads take consecutive outputs of a row
        out = y[split]
        with_bias = split == 0 and bias.shape[0] > 0
        n_threads = wp.block_dim()
        for step in range((ROWS * OUTS + n_threads - 1) // n_threads):
            e = step * n_threads + lane
            r = e // OUTS
            c = e - r * OUTS
            n = row0 + r
            o = out0 + c
            if e < ROWS * OUTS and n < out.shape[0] and o < out.shape[1]:
                value = acc[r, c]
                if with_bias:
                    value = value + bias[o]
                out[n, o] = value

    return fused_forward


def _backward_kernel(family: EdgeFamily, tiles: FusedTiles, kernel, weight_rows, basis_tile, contract_tile):
    scalar, Frame = family.scalar, family.Frame
    ROWS, WIDTH, OUTS = tiles.rows, tiles.width, tiles.outs

    @kernel
    def fused_backward(dy: wp.array2d(dtype=scalar), x: wp.array2d(dtype=scalar), frame: Frame,
                       weight: wp.array2d(dtype=scalar), use_base: int, n_coef: int, dx: wp.array2d(dtype=scalar),
                       d_partial: wp.array3d(dtype=scalar)):
        # d_partial [row tiles, width, out]: this row tile's A^T dy in rows of W (d_weight itself for one row
        # tile); an empty dx or d_partial is not computed
        row_tile, chunk, lane = wp.tid()
        row0 = row_tile * ROWS
        n_in = x.shape[1]
        stride = n_coef + use_base
        per_chunk = WIDTH // stride
        i0 = chunk * per_chunk
        rows = weight_rows(i0, per_chunk, stride, n_in, n_coef, use_base, lane)
        a = basis_tile(x, frame, row0, i0, per_chunk, stride, use_base, lane, d_partial.shape[0] > 0)
        d_a = wp.tile_zeros(shape=(ROWS, WIDTH), dtype=scalar, storage="shared")
        for out_tile in range((dy.shape[1] + OUTS - 1) // OUTS):
            out0 = out_tile * OUTS
            g = wp.tile_load(dy, shape=(ROWS, OUTS), offset=(row0, out0), storage="shared")
            if dx.shape[0] > 0:
                w = wp.tile_load_indexed(weight, indices=rows, shape=(WIDTH, OUTS), offset=(0, out0), axis=0,
                                         storage="shared")
                wp.tile_matmul(g, wp.tile_transpose(w), d_a)
            if d_partial.shape[0] > 0:
                part = wp.tile_matmul(wp.tile_transpose(a), g)
                wp.tile_store_indexed(d_partial[row_tile], indices=rows, t=part, offset=(0, out0), axis=0)
        if dx.shape[0] > 0:
            contract_tile(x, frame, row0, i0, per_chunk, stride, use_base, lane, d_a, dx)

    return fused_backward


def _block(device) -> int:
    """Threads a block: BLOCK_DIM on the GPU, and on the CPU where ``wp.config.enable_cpu_blocks`` runs Warp's
    blocks as threads with barriers (the tests run the block-wide code paths that way); else one (Warp's CPU
    default: a block is one thread, which walks every entry itself)."""
    return BLOCK_DIM if device.is_cuda or wp.config.enable_cpu_blocks else 1


def _check_layer(family: EdgeFamily, x, n_coef: int, weight, use_base: bool) -> tuple:
    """(width, out) of the combined weight; ValueError/TypeError naming the argument for arrays that do not make
    one layer of ``family``."""
    for name, arr in (("x", x), ("weight", weight)):
        if arr.dtype != family.scalar:
            raise TypeError(f"{name} must be {family.scalar_name} (the family's scalar), got "
                            f"{wp.types.type_repr(arr.dtype)}")
        if arr.ndim != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(arr.shape)}")
    if family.shared_table:
        raise ValueError(f"family must have a table per input; {family.key} shares one")
    if n_coef < 1:  # the upper bound is the tiles' (fused_plan)
        raise ValueError(f"n_coef must be at least 1, got {n_coef}")
    width = dense_width(x.shape[1], n_coef, use_base)
    if weight.shape[0] != width:
        raise ValueError(f"weight must have {width} rows for x {tuple(x.shape)}, n_coef {n_coef}, use_base "
                         f"{use_base}, got shape {tuple(weight.shape)}")
    return width, weight.shape[1]


def _check_out(name: str, arr, shape: tuple, family: EdgeFamily) -> None:
    if arr is None:
        return
    if arr.dtype != family.scalar:
        raise TypeError(f"{name} must be {family.scalar_name}, got {wp.types.type_repr(arr.dtype)}")
    if tuple(arr.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(arr.shape)}")


def launch_fused_forward(family: EdgeFamily, frame, x, n_coef: int, weight, bias, y, use_base: bool = True,
                         stream=None, record: bool = False, workspace=None, tiles: "FusedTiles | None" = None):
    """y [rows, out] = A(x) weight (+ bias) (see the module docstring): x [rows, in], weight the combined weight
    [dense_width(in, n_coef, use_base), out], bias [out] or None. One kernel, plus the fixed-order sum of the
    chunk groups' partial y when the plan splits the width (scratch from ``workspace``,
    ``FusedPlan.forward_partial_shape``; a recording caller passes a workspace whose buffers outlive the
    recording). ``tiles``: the tile configuration (default :func:`fused_tiles`). Overwrites y. Returns what
    ``launch`` returns (a list of the recorded launches when ``record``; None otherwise)."""
    width, n_out = _check_layer(family, x, n_coef, weight, use_base)
    n_rows = x.shape[0]
    _check_out("y", y, (n_rows, n_out), family)
    _check_out("bias", bias, (n_out,), family)
    recorded = []
    if n_rows == 0 or n_out == 0:
        return recorded if record else None
    plan = fused_plan(family, n_rows, x.shape[1], n_coef, n_out, use_base, tiles)
    partial_shape = plan.forward_partial_shape(n_rows, n_out)
    if partial_shape[0]:
        partial = (workspace or workspace_for(x.device, stream)).get("fused_forward_partial", partial_shape,
                                                                      family.scalar)
    else:
        partial = y.reshape((1, n_rows, n_out))
    recorded += launch(fused_kernels(family, plan.tiles).forward, (plan.row_tiles, plan.out_tiles, plan.splits),
                       [x, frame, weight, bias, int(use_base), int(n_coef), plan.chunks_per_split], [partial],
                       x.device, stream, record, block_dim=_block(x.device), tiled=True) or []
    if partial_shape[0]:
        recorded += launch_combine_chunks(partial, y, accumulate=False, stream=stream, record=record) or []
    return recorded if record else None


def launch_fused_backward(family: EdgeFamily, frame, dy, x, n_coef: int, weight, dx=None, d_weight=None,
                          use_base: bool = True, stream=None, record: bool = False, workspace=None,
                          tiles: "FusedTiles | None" = None):
    """dx [rows, in] and d_weight [width, out] (either may be None: not computed) of
    :func:`launch_fused_forward`, in one kernel, plus the fixed-order sum of the row tiles' partials of
    d_weight when there are several (scratch from ``workspace``, ``FusedPlan.backward_partial_shape``).
    Overwrites dx and d_weight. Returns what ``launch`` returns (a list of the recorded launches when
    ``record``; None otherwise)."""
    width, n_out = _check_layer(family, x, n_coef, weight, use_base)
    n_rows, n_in = x.shape
    _check_out("dy", dy, (n_rows, n_out), family)
    _check_out("dx", dx, (n_rows, n_in), family)
    _check_out("d_weight", d_weight, (width, n_out), family)
    recorded = []
    if n_out == 0:
        d_weight = None  # nothing to write; dx is written (zeros)
    if (dx is None and d_weight is None) or n_in == 0:
        return recorded if record else None
    plan = fused_plan(family, n_rows, n_in, n_coef, n_out, use_base, tiles)
    partial_shape = plan.backward_partial_shape(n_out)
    partial = None
    if d_weight is not None:
        if partial_shape[0]:
            partial = (workspace or workspace_for(x.device, stream)).get("fused_backward_partial", partial_shape,
                                                                          family.scalar)
        else:
            partial = d_weight.reshape((1, width, n_out))
    recorded += launch(fused_kernels(family, plan.tiles).backward, (plan.row_tiles, plan.chunks),
                       [dy, x, frame, weight, int(use_base), int(n_coef)], [dx, partial], x.device, stream, record,
                       block_dim=_block(x.device), tiled=True) or []
    if d_weight is not None and partial_shape[0]:
        recorded += launch_combine_chunks(partial, d_weight, accumulate=False, stream=stream, record=record) or []
    return recorded if record else None
