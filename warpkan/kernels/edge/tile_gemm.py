"""The gemm strategy on ``wp.array``s (pure Warp, no torch import): the engine's dense basis multiplied with
``wp.tile_matmul``, for the Warp-native layers (``warpkan.native``).

Maths: those of the torch bridge's gemm strategy (``warpkan.torch_bridge.edge_driver``). For a chunk of rows,
``A^T`` [width, rows] is the transposed dense basis the engine's dense kernels write (:mod:`.dense`: the SiLU
rows of a fused base path, then the n_coef basis rows of every input) and ``W`` [width, out] the combined weight
(``[base_weight_t; coef * scaler_t]``, or an unscaled family's coefficient table itself):

    y = A W (+ bias),    dW = A^T dy,    dA^T = W dy^T,    dx = contract(dA^T, x)

where ``contract`` is the engine's dense contraction with the bases' x-derivatives (and silu').

No operand tile is a transposed view: cuBLASDx multiplied those (column-major) tiles 1.5-3.6x slower on an H200
(``python scripts/tile_gemm_probe.py``; ``docs/perf-notes-engine.md``). So the forward forms ``y^T = W^T A^T``
from ``W^T``, transposed once a call into scratch, and transposes ``y^T`` into y a chunk at a time; the basis
gradient multiplies W by ``dy^T``, transposed a chunk at a time. Those transposes move the small arrays (W, y,
dy), never the basis.

Why the dense basis goes through memory rather than being built in shared memory inside the GEMM kernel:

- the contractions are the work: at (65536, 256 -> 256, G = 8, k = 3), width 3072, each is 103 GFLOP, about
  3.6-4.1 ms at the 25-29 TFLOP/s these kernels reach in fp32 on an H200 (warp-lang 1.19), while writing
  and reading back a pass's basis (0.8 GB) takes about 0.4 ms at HBM speed; a fused build could save at most
  that, and would evaluate the basis of a row tile once per output tile;
- compile time: a module holding ``tile_matmul`` on cuBLASDx (linked as LTO code) takes 25-35 s to build on the
  GPU alone, and these took 61-146 s with three to eight builds at a time; on Warp's scalar GEMM, the default
  (:data:`.._modules.TILE_MATMUL`), 2.0-2.6 s, for steps 1.07-1.08x slower at (65536, 256 -> 256). Here the
  three GEMM kernels depend on the scalar type and the tile shape alone (a short fixed list:
  :data:`TILE_SHAPES`), so every family, order, grid kind and polynomial basis shares them; a fused kernel
  would be one such module per family key and tile shape. The basis kernels are the engine's SIMT dense
  kernels (seconds to build), the ones the torch bridge's gemm strategy launches;
- it moves the same data as the torch bridge's gemm strategy, which it is measured against.

Determinism: ``dW`` is summed over the rows without atomics. Each block owns one (width, output) tile of one
row split and adds the rows of its split in order, for every chunk in turn (stream order); the splits are then
added in a fixed order by the engine's chunk combine. The splits are a function of the shapes alone, so the
gradients are bitwise the same on every run.
"""

import functools
from dataclasses import dataclass

import warp as wp

from .._common import SCALARS, on_stream, scalar_name
from .._modules import tile_matmul_module
from .._runtime import launch, launch_accumulate, launch_combine_chunks, workspace_for
from .._transpose import launch_transpose
from . import launch as edge
from .dense import dense_width
from .family import EdgeFamily

__all__ = ["TileShape", "TILE_SHAPES", "tile_shape", "tile_gemm_kernels", "tile_gemm_module", "tile_gemm_modules",
           "chunk_rows", "weight_grad_splits", "launch_gemm_forward", "launch_gemm_backward", "GEMM_CHUNK_BYTES",
           "CPU_GEMM_CHUNK_BYTES"]


@dataclass(frozen=True)
class TileShape:
    """One block's tiles: ``rows`` rows of y (and of the basis), ``cols`` outputs, ``depth`` the step of the
    contraction loop, ``threads`` the block's threads on CUDA. The output tiles are [cols, rows] (y^T), [rows, cols]
    (dW: rows of the width) and [rows, rows] (dA^T); shared memory holds about (rows cols + (rows + cols) depth)
    values at a time."""

    rows: int
    cols: int
    depth: int
    threads: int = 128

    @property
    def name(self) -> str:
        return f"{self.rows}x{self.cols}x{self.depth}" + (f"t{self.threads}" if self.threads != 128 else "")

    @classmethod
    def from_name(cls, name: str) -> "TileShape":
        """The shape :attr:`name` names ("64x128x64t256"; 128 threads without "tN")."""
        dims, _, threads = name.partition("t")
        return cls(*(int(v) for v in dims.split("x")), threads=int(threads) if threads else 128)


# The fixed list the tile shape is taken from (each entry of a scalar type is one module, built once per machine:
# seconds on Warp's scalar GEMM, a minute or two on cuBLASDx; Warp's kernel cache keeps it; a layer builds one).
# float32: 64 rows x 128 outputs, depth 64, 256 threads, for layers of more than 64 outputs; 64 x 64 (depth 64)
# and 64 x 32 (depth 32) at 128 threads for narrower ones, whose padding a wider tile would multiply. float64:
# 32 x 32 (the bytes of a float32 32 x 64 tile). Timed one against another on an H200 (``python
# scripts/tile_gemm_probe.py``: the three kernels on one 10880-row chunk of KANLinear (65536, 256 -> 256, G = 8)),
# 64 x 128 x 64 at 256 threads took 1.81 ms for the three, 64 x 64 x 64 1.97 and 128 x 64 x 64 1.92; cuBLAS 1.18
# (on cuBLASDx). On Warp's scalar GEMM (the
# default) 64 x 128 x 64 took 1.98 ms, within 2% of the fastest of 13 shapes (128 x 64 x 64 at 256 threads, 1.94).
# The float32 64 x 128 kernels take about 80 KiB of shared memory a block (two blocks an SM), which Warp opts in to.
TILE_SHAPES = {
    "float32": (TileShape(64, 128, 64, threads=256), TileShape(64, 64, 64), TileShape(64, 32, 32)),
    "float64": (TileShape(32, 32, 32),),
}
# Scratch for one chunk of the dense basis. On the GPU twice the torch bridge's bound (its
# ``edge_driver.GEMM_CHUNK_BYTES``): a chunk's forward GEMM is a grid of few blocks ((65536, 256 -> 256, G = 8) in
# 128 MiB chunks: 294 blocks of 64 x 128 tiles, for 264 resident at a time on an H200), so its last wave runs
# the GPU part-empty, and larger chunks make that a smaller part of the work: H200, that layer's fwd+bwd took
# 14.6 ms in 128 MiB chunks, 13.0 in 256 and 13.1 in 512; at (65536, 64 -> 64, G = 8) 1.76, 1.27 and 1.29 ms
# (`python scripts/native_wide_timing.py --out DIR --chunk-mib 256 --chunk-mib 512`). On the CPU, a chunk that
# stays in a core's cache from the kernel that writes it to the GEMM that reads it.
GEMM_CHUNK_BYTES = 256 * 2**20
CPU_GEMM_CHUNK_BYTES = 2**20
# Blocks the row-split weight-gradient GEMM aims at (about eight per SM of an H200's 132): a wide layer's
# (width, output) tiles alone may not fill the GPU (3072 x 256 in 64 x 64 tiles: 192 blocks).
TARGET_WEIGHT_GRAD_BLOCKS = 1024
MIN_SPLIT_DEPTHS = 4  # a row split spans at least this many contraction steps (its partial tile costs a read and write)


def tile_shape(scalar: str, n_out: int) -> TileShape:
    """The tile shape of a layer of ``n_out`` outputs in ``scalar`` ("float32" or "float64"): the first entry of
    :data:`TILE_SHAPES` for the scalar type, or a narrower one whose columns still cover every output."""
    shapes = TILE_SHAPES[scalar]
    fitting = [s for s in shapes if s.cols >= n_out]
    return min(fitting, key=lambda s: s.cols) if fitting else shapes[0]


@dataclass(frozen=True)
class TileGemmKernels:
    module: str
    forward: wp.Kernel
    weight_grad: wp.Kernel
    basis_grad: wp.Kernel


def tile_gemm_module(scalar: str, tiles: TileShape) -> str:
    """The name of the module of :func:`tile_gemm_kernels`."""
    return f"warpkan_tile_gemm_{scalar}_{tiles.name}"


def tile_gemm_modules(scalar: str) -> list[tuple[str, int]]:
    """Every tile-GEMM module a layer of this scalar type may launch (one per listed tile shape), its kernels
    built, with its block size on CUDA: what ``warpkan precompile`` loads for the Warp-native layers' gemm
    strategy."""
    return [(tile_gemm_kernels(scalar, tiles).module, tiles.threads) for tiles in TILE_SHAPES[scalar]]


@functools.lru_cache(maxsize=None)
def tile_gemm_kernels(scalar: str, tiles: TileShape) -> TileGemmKernels:
    """The three GEMM kernels of one scalar type and tile shape, in one module (all three run in a training
    step, so they are built together). Every tile load past an array's end reads zeros and every store past
    it is dropped (Warp's bounds-checked tiles), so any shape works."""
    dtype = SCALARS[scalar]
    tm, tn, tk = tiles.rows, tiles.cols, tiles.depth
    module = tile_matmul_module(tile_gemm_module(scalar, tiles))
    # the module's own block size is the launches': a load without one (``warpkan precompile``) builds the
    # variant the launches run (Warp builds a tile module once per block size)
    wp.set_module_options({"block_dim": tiles.threads}, module)
    kernel = functools.partial(wp.kernel, enable_backward=False, module=module)

    @kernel
    def forward(weight_t: wp.array2d(dtype=dtype), basis_t: wp.array2d(dtype=dtype), y_t: wp.array2d(dtype=dtype)):
        # y_t [out, rows] = weight^T basis_t: one (outputs, rows) tile a block, over the width. The bias is added
        # after the transpose into y: adding it to the accumulator here made this kernel 1.3x slower on an H200
        col_tile, row_tile = wp.tid()
        acc = wp.tile_zeros(shape=(tn, tm), dtype=dtype)
        for k in range(0, basis_t.shape[0], tk):
            a = wp.tile_load(weight_t, shape=(tn, tk), offset=(col_tile * tn, k))
            b = wp.tile_load(basis_t, shape=(tk, tm), offset=(k, row_tile * tm))
            wp.tile_matmul(a, b, acc)
        wp.tile_store(y_t, acc, offset=(col_tile * tn, row_tile * tm))

    @kernel
    def weight_grad(basis_t: wp.array2d(dtype=dtype), dy: wp.array2d(dtype=dtype), rows_per_split: int,
                    padded_width: int, partial: wp.array2d(dtype=dtype)):
        # partial[split] [padded_width, out] += basis_t[:, split's rows] dy[split's rows]: one (width, outputs)
        # tile of one split a block, its rows in order (rows_per_split is a multiple of tk: no step reaches into
        # the next split); padded_width is a multiple of tm, so no tile reaches into the next split's partial
        width_tile, col_tile, split = wp.tid()
        row = split * padded_width + width_tile * tm
        acc = wp.tile_load(partial, shape=(tm, tn), offset=(row, col_tile * tn))
        start = split * rows_per_split
        stop = wp.min(start + rows_per_split, basis_t.shape[1])
        for r in range(start, stop, tk):
            a = wp.tile_load(basis_t, shape=(tm, tk), offset=(width_tile * tm, r))
            b = wp.tile_load(dy, shape=(tk, tn), offset=(r, col_tile * tn))
            wp.tile_matmul(a, b, acc)
        wp.tile_store(partial, acc, offset=(row, col_tile * tn))

    @kernel
    def basis_grad(weight: wp.array2d(dtype=dtype), dy_t: wp.array2d(dtype=dtype), d_basis_t: wp.array2d(dtype=dtype)):
        # d_basis_t [width, rows] = weight dy^T: one (width, rows) tile a block, over the outputs
        width_tile, row_tile = wp.tid()
        acc = wp.tile_zeros(shape=(tm, tm), dtype=dtype)
        for o in range(0, weight.shape[1], tn):
            a = wp.tile_load(weight, shape=(tm, tn), offset=(width_tile * tm, o))
            b = wp.tile_load(dy_t, shape=(tn, tm), offset=(o, row_tile * tm))
            wp.tile_matmul(a, b, acc)
        wp.tile_store(d_basis_t, acc, offset=(width_tile * tm, row_tile * tm))

    return TileGemmKernels(module, forward, weight_grad, basis_grad)


def chunk_rows(n_rows: int, width: int, itemsize: int, is_cuda: bool, tiles: TileShape) -> int:
    """Rows of one chunk of the dense basis: at most GEMM_CHUNK_BYTES of it (CPU_GEMM_CHUNK_BYTES on the CPU),
    whole row tiles, at least one row tile, and the rows shared about equally among the chunks (a last chunk of
    a few row tiles would launch GEMMs that leave most of the GPU idle)."""
    limit = GEMM_CHUNK_BYTES if is_cuda else CPU_GEMM_CHUNK_BYTES
    most = max(tiles.rows, limit // max(1, width * itemsize))
    most -= most % tiles.rows
    share = -(-n_rows // -(-n_rows // most))
    return max(1, min(-(-share // tiles.rows) * tiles.rows, n_rows))


def weight_grad_splits(rows: int, width: int, n_out: int, tiles: TileShape) -> tuple[int, int]:
    """(splits, rows_per_split) of the weight gradient of a chunk of ``rows`` rows: enough splits that about
    TARGET_WEIGHT_GRAD_BLOCKS blocks run, each at least MIN_SPLIT_DEPTHS steps long; rows_per_split a
    multiple of the tile depth. A function of the shapes alone (the summation order, hence the result, is
    the same on every run)."""
    tiles_per_split = -(-width // tiles.rows) * -(-n_out // tiles.cols)
    wanted = -(-TARGET_WEIGHT_GRAD_BLOCKS // tiles_per_split)
    by_rows = -(-rows // (MIN_SPLIT_DEPTHS * tiles.depth))
    splits = max(1, min(wanted, by_rows))
    per_split = -(-rows // splits)
    per_split = -(-per_split // tiles.depth) * tiles.depth
    return -(-rows // per_split), per_split


def _block(device, tiles: TileShape) -> int:
    return tiles.threads if device.is_cuda else 1


def _chunks(n_rows: int, rows: int):
    for start in range(0, n_rows, rows):
        yield start, min(start + rows, n_rows)


def launch_gemm_forward(family: EdgeFamily, frame, x, n_coef: int, weight, y, use_base: bool, bias=None,
                        stream=None, workspace=None) -> None:
    """y [N, out] = A(x) weight (+ bias): the engine's dense basis of x [N, in] (``n_coef`` coefficients an
    input, the SiLU rows first when ``use_base``) times ``weight`` [width, out], chunk by chunk. Overwrites y.
    All arrays contiguous, of the family's scalar type, on x's device."""
    n_rows, n_in = x.shape
    n_out = weight.shape[1]
    width = dense_width(n_in, n_coef, use_base)
    if tuple(weight.shape) != (width, n_out) or tuple(y.shape) != (n_rows, n_out):
        raise ValueError(f"weight must have shape {(width, n_out)} and y {(n_rows, n_out)}, got "
                         f"{tuple(weight.shape)} and {tuple(y.shape)}")
    if bias is not None and bias.size != n_out:
        raise ValueError(f"bias must hold {n_out} values (one an output), got shape {tuple(bias.shape)}")
    if n_rows == 0 or n_out == 0:
        return
    scalar = scalar_name(x)
    tiles = tile_shape(scalar, n_out)
    kernels = tile_gemm_kernels(scalar, tiles)
    device = x.device
    ws = workspace or workspace_for(device, stream)
    rows = chunk_rows(n_rows, width, wp.types.type_size_in_bytes(x.dtype), device.is_cuda, tiles)
    with on_stream(stream):
        weight_t = ws.get("tile_gemm_weight_t", (n_out, width), x.dtype)
        launch_transpose(weight, weight_t, width, n_out, stream=stream)
        for start, stop in _chunks(n_rows, rows):
            basis_t = ws.get("tile_gemm_basis", (width, stop - start), x.dtype)
            edge.launch_expand_basis(family, frame, x[start:stop], n_coef, basis_t, use_base, stream)
            y_t = ws.get("tile_gemm_y_t", (n_out, stop - start), x.dtype)
            launch(kernels.forward, (-(-n_out // tiles.cols), -(-(stop - start) // tiles.rows)),
                   [weight_t, basis_t], [y_t], device, stream, block_dim=_block(device, tiles), tiled=True)
            launch_transpose(y_t, y[start:stop], n_out, stop - start, stream=stream)
        if bias is not None:  # y += bias, the bias seen as [1, N, out] with zero strides: one combine launch
            rows_of_bias = wp.array(ptr=bias.ptr, shape=(1, n_rows, n_out), strides=(0, 0, bias.strides[-1]),
                                    dtype=bias.dtype, device=bias.device)
            launch_combine_chunks(rows_of_bias, y, accumulate=True, stream=stream)


def launch_gemm_backward(family: EdgeFamily, frame, dy, x, n_coef: int, weight, use_base: bool, dx=None,
                         d_weight=None, stream=None, workspace=None) -> None:
    """Accumulate (+=) the gradients of :func:`launch_gemm_forward` into whichever of dx [N, in] and d_weight
    [width, out] are given: ``d_weight += A(x)^T dy`` (row splits, fixed-order combine: deterministic) and
    ``dx += contract(weight dy^T, x)``. All arrays contiguous, of the family's scalar type, on x's device."""
    n_rows, n_in = x.shape
    n_out = weight.shape[1]
    width = dense_width(n_in, n_coef, use_base)
    if tuple(dy.shape) != (n_rows, n_out):
        raise ValueError(f"dy must have shape {(n_rows, n_out)}, got {tuple(dy.shape)}")
    if n_rows == 0 or n_out == 0 or (dx is None and d_weight is None):
        return
    scalar = scalar_name(x)
    tiles = tile_shape(scalar, n_out)
    kernels = tile_gemm_kernels(scalar, tiles)
    device = x.device
    block = _block(device, tiles)
    ws = workspace or workspace_for(device, stream)
    rows = chunk_rows(n_rows, width, wp.types.type_size_in_bytes(x.dtype), device.is_cuda, tiles)
    with on_stream(stream):
        if d_weight is not None:
            splits, rows_per_split = weight_grad_splits(rows, width, n_out, tiles)
            padded_width = -(-width // tiles.rows) * tiles.rows
            partial = ws.get("tile_gemm_partial", (splits * padded_width, n_out), x.dtype, zero=True)
        if dx is not None:
            dx_new = ws.get("tile_gemm_dx", (n_rows, n_in), x.dtype)
        for start, stop in _chunks(n_rows, rows):
            # one scratch for the basis and then its gradient: in stream order the weight-gradient GEMM has read
            # the basis before the basis-gradient GEMM overwrites it
            basis_t = ws.get("tile_gemm_basis", (width, stop - start), x.dtype)
            if d_weight is not None:
                edge.launch_expand_basis(family, frame, x[start:stop], n_coef, basis_t, use_base, stream)
                launch(kernels.weight_grad, (padded_width // tiles.rows, -(-n_out // tiles.cols), splits),
                       [basis_t, dy[start:stop], rows_per_split, padded_width], [partial], device, stream,
                       block_dim=block, tiled=True)
            if dx is not None:
                dy_t = ws.get("tile_gemm_dy_t", (n_out, stop - start), x.dtype)
                launch_transpose(dy[start:stop], dy_t, stop - start, n_out, stream=stream)
                launch(kernels.basis_grad, (-(-width // tiles.rows), -(-(stop - start) // tiles.rows)),
                       [weight, dy_t], [basis_t], device, stream, block_dim=block, tiled=True)
                edge.launch_contract_basis_grad(family, frame, x[start:stop], n_coef, basis_t, dx_new[start:stop],
                                                use_base, stream)
        if d_weight is not None:
            launch_combine_chunks(partial.reshape((splits, padded_width, n_out))[:, :width], d_weight,
                                  accumulate=True, stream=stream)
        if dx is not None:
            launch_accumulate(dx_new, dx, stream)
