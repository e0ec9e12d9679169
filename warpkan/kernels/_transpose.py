"""A transpose of contiguous memory, coalesced on both sides: ``dst[b, c, r] = src[b, r, c]`` (pure Warp, no
torch import).

Why: the layers store their parameters in public layouts (efficient-kan's ``spline_weight`` [out, in, G + k],
``base_weight`` [out, in]) while the per-edge kernels read ``[in, G + k, out]`` and ``[in, out]``: a step
copies such a table into the kernels' layout, and its gradient back. Both are transposes of one contiguous
2-D array ([out, in (G + k)] <-> [in (G + k), out]); a generic strided copy reads or writes one of the two
sides with a stride of a whole row, so that side moves a 32-byte memory sector for every element. On an H200
at (2^17 rows, 32 -> 32, G = 2^18), torch's copies of the 1.07 GB table and its gradient took 5.9 ms of a
10.6 ms step (about 0.74 TB/s, against about 4.3 TB/s for a plain copy).

Design (CUDA). A block of 32 x 4 threads moves one tile of 32 x 32 elements:

- Load: warp ``w`` reads rows ``w, w + 4, ..., w + 28`` of the tile, lane ``l`` column ``l``: each warp
  load is 32 consecutive elements of one source row (128 bytes in float32), eight independent loads a
  thread in flight before the barrier.
- The tile goes through shared memory padded to 33 columns, so that the 32 elements of a tile column lie
  in 32 different banks: the column reads of the store are free of bank conflicts (a float64 tile's
  8-byte reads, served 16 lanes at a time, too).
- Store: warp ``w`` writes rows ``w, w + 4, ...`` of the destination tile (columns of the source tile):
  32 consecutive elements of one destination row per warp store.

A tile overlapping the end of a row or column masks its loads and stores element by element, so any shape
works (1 x 1, primes). A destination row of 32 elements (a [32, M] -> [M, 32] transpose, out = 32) makes the
destination tile one contiguous block.

Elements move as bits, in words of their size (uint16, uint32, uint64): one kernel a size serves every
dtype of that size (float16/bfloat16, float32, float64), and the copy is bitwise exact (NaN payloads, signed
zeros). A fourth kernel converts float32 to bfloat16 on the way (round to nearest even, as torch's
``Tensor.to(torch.bfloat16)`` bit for bit; a NaN becomes the quiet NaN 0x7FC0), so that a float32 parameter
becomes the bf16 operand of a GEMM in the kernels' layout in one launch, not a transpose and then a cast. The
four kernels share one module (compiled once, on first use).

Why not Warp's tile API (``wp.tile_load``, ``wp.tile_transpose``, ``wp.tile_store``): in Warp 1.19 a shared
tile is dense (no padding), and storing a transposed tile reads it 32 words apart, every lane of a warp in
the same bank (32-way conflicts, about a thirty-second of shared-memory throughput), since
``tile_shared_t::copy_to_global`` takes its scalar path for a transposed layout.

On the CPU one thread copies a whole tile (a Warp CPU thread is a call, which a thread of eight elements would
pay for every eight), walking contiguously the side whose rows are longer.
No shared memory and no barrier on that path (so any ``wp.config.enable_cpu_blocks`` block size is fine).

Sizes. The arrays are addressed as flat memory of ``batch * rows * cols < 2^31`` elements (Warp's array
shape is 32-bit), in 32-bit unsigned arithmetic.
"""

import functools

import warp as wp

from .. import _checks
from ._modules import ModuleBuild
from ._runtime import launch

__all__ = ["TILE", "BLOCK_ROWS", "THREADS", "WORDS", "MAX_ELEMENTS", "transpose_kernel", "transpose_modules",
           "launch_transpose", "transpose_launch_dim"]

TILE = 32  # a tile is TILE x TILE elements; a warp moves one row of it
BLOCK_ROWS = 4  # warps a block: each thread moves TILE / BLOCK_ROWS elements each way
THREADS = TILE * BLOCK_ROWS
# element size in bytes -> the Warp word type that moves it, and its C name
WORDS = {2: (wp.uint16, "unsigned short"), 4: (wp.uint32, "unsigned int"), 8: (wp.uint64, "unsigned long long")}
# Warp's array shape and the kernel's addressing are 32-bit
MAX_ELEMENTS = _checks.INDEX_MAX

_MOVE_TILE = """
    typedef @WORD@ word;
    typedef @DST_WORD@ dst_word;
    const unsigned int tile_index = (unsigned)tile;
    const unsigned int batch = tile_index / (unsigned)tiles_per_batch;
    const unsigned int in_batch = tile_index - batch * (unsigned)tiles_per_batch;
    const unsigned int tile_r = in_batch / (unsigned)tiles_c;
    const unsigned int r0 = tile_r * @TILE@u;
    const unsigned int c0 = (in_batch - tile_r * (unsigned)tiles_c) * @TILE@u;
    const unsigned int n_rows = (unsigned)rows, n_cols = (unsigned)cols;
    const word* s = reinterpret_cast<const word*>(src.data) + batch * n_rows * n_cols;
    dst_word* d = reinterpret_cast<dst_word*>(dst.data) + batch * n_rows * n_cols;
#if defined(__CUDA_ARCH__)
    const unsigned int tx = (unsigned)lane % @TILE@u, ty = (unsigned)lane / @TILE@u;
    __shared__ dst_word staged[@TILE@][@TILE@ + 1];
    // all of a thread's loads are issued before the first use of their values (a load consumed right away
    // would hold the warp until it returns: one load in flight a thread instead of TILE / BLOCK_ROWS)
    word v[@TILE@ / @BLOCK_ROWS@];
    {
        const unsigned int c = c0 + tx;
        #pragma unroll
        for (unsigned int k = 0; k < @TILE@u / @BLOCK_ROWS@u; ++k) {
            const unsigned int r = r0 + ty + k * @BLOCK_ROWS@u;
            v[k] = (r < n_rows && c < n_cols) ? __ldg(s + r * n_cols + c) : word(0);
        }
        #pragma unroll
        for (unsigned int k = 0; k < @TILE@u / @BLOCK_ROWS@u; ++k) {
            const word u = v[k];
            staged[ty + k * @BLOCK_ROWS@u][tx] = @CONVERT@;
        }
    }
    __syncthreads();
    {
        const unsigned int r = r0 + tx;
        #pragma unroll
        for (unsigned int k = 0; k < @TILE@u / @BLOCK_ROWS@u; ++k) {
            const unsigned int c = c0 + ty + k * @BLOCK_ROWS@u;
            if (r < n_rows && c < n_cols) d[c * n_rows + r] = staged[tx][ty + k * @BLOCK_ROWS@u];
        }
    }
#else
    const unsigned int r_end = r0 + @TILE@u < n_rows ? r0 + @TILE@u : n_rows;
    const unsigned int c_end = c0 + @TILE@u < n_cols ? c0 + @TILE@u : n_cols;
    // the inner loop walks the side whose rows are longer contiguously: its 32 lines, a row length apart,
    // would otherwise be visited in turn, an element each (and a power-of-two row length maps them all to
    // one cache set); the other side's lines are a short row apart, in a few KiB
    if (n_rows > n_cols) {
        for (unsigned int c = c0; c < c_end; ++c)
            for (unsigned int r = r0; r < r_end; ++r) {
                const word u = s[r * n_cols + c];
                d[c * n_rows + r] = @CONVERT@;
            }
    } else {
        for (unsigned int r = r0; r < r_end; ++r)
            for (unsigned int c = c0; c < c_end; ++c) {
                const word u = s[r * n_cols + c];
                d[c * n_rows + r] = @CONVERT@;
            }
    }
#endif
"""


# float32 bits ``u`` -> bfloat16 bits: round to nearest even (torch's conversion), a NaN to the quiet NaN 0x7FC0
_FLOAT32_TO_BFLOAT16 = ("((u & 0x7fffffffu) > 0x7f800000u ? (dst_word)0x7fc0u"
                        " : (dst_word)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16))")


def _render(word_c: str, dst_word_c: str, convert: str) -> str:
    return (_MOVE_TILE.replace("@WORD@", word_c).replace("@DST_WORD@", dst_word_c).replace("@CONVERT@", convert)
            .replace("@THREADS@", str(THREADS)).replace("@TILE@", str(TILE)).replace("@BLOCK_ROWS@", str(BLOCK_ROWS)))


def _kernel(size: int, dst_size: "int | None" = None) -> wp.Kernel:
    """The kernel that moves elements of ``size`` bytes, in the shared module; ``dst_size`` 2 for a size of 4:
    the float32 -> bfloat16 kernel."""
    word, word_c = WORDS[size]
    dst_word, dst_word_c = WORDS[dst_size or size]
    convert = "(dst_word)u" if dst_size is None else _FLOAT32_TO_BFLOAT16
    name = f"{size * 8}" if dst_size is None else "float32_to_bfloat16"

    def move_tile(src: wp.array(dtype=word), dst: wp.array(dtype=dst_word), rows: int, cols: int, tiles_c: int,
                  tiles_per_batch: int, tile: int, lane: int): ...

    move_tile.__name__ = move_tile.__qualname__ = f"transpose_move_tile_{name}"
    move_tile = wp.func_native(_render(word_c, dst_word_c, convert))(move_tile)

    def transpose(src: wp.array(dtype=word), dst: wp.array(dtype=dst_word), rows: int, cols: int, tiles_c: int,
                  tiles_per_batch: int):
        # launched over (tiles, THREADS) on CUDA: a block a tile, every thread of which reaches the barrier;
        # over (tiles, 1) on the CPU: a thread a tile
        tile, lane = wp.tid()
        move_tile(src, dst, rows, cols, tiles_c, tiles_per_batch, tile, lane)

    return wp.kernel(transpose, name=f"transpose_{name}", enable_backward=False, module="warpkan_transpose",
                     grid_stride=False)


@functools.lru_cache(maxsize=None)
def _kernels() -> dict:
    """(source element size, destination element size) -> kernel, all made at once so that their module
    compiles once."""
    kernels = {(size, size): _kernel(size) for size in WORDS}
    kernels[(4, 2)] = _kernel(4, 2)
    return kernels


def transpose_modules() -> tuple:
    """The kernels' module (:class:`ModuleBuild`, built), launched at ``THREADS`` a block: what the torch layers'
    copies of public-layout parameters load on CUDA."""
    return (ModuleBuild(_kernels()[(4, 4)].module.name, THREADS),)


def transpose_kernel(itemsize: int) -> wp.Kernel:
    """The kernel that moves elements of ``itemsize`` bytes (2, 4 or 8)."""
    if itemsize not in WORDS:
        raise ValueError(f"the transpose moves elements of {sorted(WORDS)} bytes, got {itemsize}")
    return _kernels()[(itemsize, itemsize)]


def transpose_launch_dim(rows: int, cols: int, batch: int = 1, is_cuda: bool = True) -> tuple[int, int]:
    """The launch's (tiles, threads a tile): a TILE x TILE tile of each of ``batch`` [rows, cols] arrays is a
    block of THREADS threads on CUDA, one thread on the CPU. Two dimensions, so that each index fits Warp's
    32-bit ``wp.tid()`` (a thin array has up to one tile per 32 elements: THREADS times that many threads would
    not)."""
    return batch * -(-rows // TILE) * -(-cols // TILE), (THREADS if is_cuda else 1)


def _word_view(a: wp.array, name: str) -> wp.array:
    """``a`` (contiguous) as a flat array of the word type of its element size, sharing memory."""
    if not a.is_contiguous:
        raise ValueError(f"{name} must be contiguous")
    size = wp.types.type_size_in_bytes(a.dtype)
    if size not in WORDS:
        raise TypeError(f"{name} must hold elements of {sorted(WORDS)} bytes, got {wp.types.type_repr(a.dtype)} "
                        f"({size} bytes)")
    word = WORDS[size][0]
    if a.dtype == word and a.ndim == 1:
        return a
    return wp.array(ptr=a.ptr, dtype=word, shape=(a.size,), device=a.device, copy=False)


def launch_transpose(src: wp.array, dst: wp.array, rows: int, cols: int, batch: int = 1, stream=None,
                     record: bool = False):
    """``dst[b, c, r] = src[b, r, c]`` for the contiguous memory of ``src`` seen as [batch, rows, cols] and of
    ``dst`` as [batch, cols, rows] (any array shapes of that many elements, one device; one dtype, or a float32
    ``src`` and a bfloat16 ``dst``, each element rounded to nearest even); returns what
    :func:`warpkan.kernels._runtime.launch` returns (``record=True``: the recorded launches). Overwrites dst.
    ValueError/TypeError naming the argument for arrays that do not fit."""
    rows, cols, batch = (_checks.non_negative_int(name, value)
                         for name, value in (("rows", rows), ("cols", cols), ("batch", batch)))
    _checks.fits_index("the transposed arrays", (batch, rows, cols), batch=batch, rows=rows, cols=cols)
    converts = src.dtype == wp.float32 and dst.dtype == wp.bfloat16
    if src.dtype != dst.dtype and not converts:
        raise TypeError(f"dst must have the dtype of src ({wp.types.type_repr(src.dtype)}) or, for a float32 src, "
                        f"bfloat16, got {wp.types.type_repr(dst.dtype)}")
    if src.device != dst.device:
        raise ValueError(f"dst must be on the device of src ({src.device}), got {dst.device}")
    count = batch * rows * cols
    for name, a in (("src", src), ("dst", dst)):
        if a.size != count:
            raise ValueError(f"{name} must hold batch * rows * cols = {count} elements, got {a.size} "
                             f"(shape {tuple(a.shape)})")
    src_words, dst_words = _word_view(src, "src"), _word_view(dst, "dst")
    if count == 0:
        return [] if record else None
    tiles_c = -(-cols // TILE)
    kernel = _kernels()[(4, 2)] if converts else transpose_kernel(wp.types.type_size_in_bytes(src.dtype))
    return launch(kernel, transpose_launch_dim(rows, cols, batch, src.device.is_cuda),
                  [src_words, dst_words, rows, cols, tiles_c, -(-rows // TILE) * tiles_c], device=src.device,
                  stream=stream, record=record, block_dim=THREADS)
