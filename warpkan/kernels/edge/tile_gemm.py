"""The gemm strategy on ``wp.array``s (pure Warp, no torch import): the engine's dense basis multiplied with
``wp.tile_matmul``, for the Warp-native layers (``warpkan.native``).

Maths: those of the torch bridge's gemm strategy (``warpkan.torch_bridge.edge_driver``). For a chunk of rows,
``A^T`` [width, rows] is the transposed dense basis the engine's dense kernels write (:mod:`.dense`: the SiLU
rows of a fused base path, then the n_coef basis rows of every input) and ``W`` [width, out] the combined weight
(``[base_weight_t; coef * scaler_t]``, or an unscaled family's coefficient table itself):

    y = A W (+ bias),    dW = A^T dy,    dA^T = W dy^T,    dx = contract(dA^T, x)

where ``contract`` is the engine's dense contraction with the bases' x-derivatives (and silu').

Why the dense basis goes through memory rather than being built in shared memory inside the GEMM kernel:

- the contractions are the work: at (65536, 256 -> 256, G = 8, k = 3), width 3072, each is 103 GFLOP, about
  3.4 ms at the 29-34 TFLOP/s tile_matmul reached in fp32 on an H200 (warp-lang 1.19, 4096^3), while writing
  and reading back a pass's basis (0.8 GB) takes about 0.4 ms at HBM speed; a fused build could save at most
  that, and would evaluate the basis of a row tile once per output tile;
- compile time: a module holding ``tile_matmul`` (cuBLASDx, linked as LTO code) takes 25-35 s to build on the
  GPU alone, and took 142-146 s with eight builds at a time. Here the three GEMM kernels
  depend on the scalar type and the tile shape alone (a short fixed list: :data:`TILE_SHAPES`), so every
  family, order, grid kind and polynomial basis shares them; a fused kernel would be one such module per family
  key and tile shape. The basis kernels are the engine's SIMT dense kernels (seconds to build), the ones the
  torch bridge's gemm strategy launches;
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
from .._runtime import launch, launch_accumulate, launch_combine_chunks, workspace_for
from . import launch as edge
from .dense import dense_width
from .family import EdgeFamily

__all__ = ["TileShape", "TILE_SHAPES", "tile_shape", "tile_gemm_kernels", "tile_gemm_module", "tile_gemm_modules",
           "chunk_rows", "weight_grad_splits", "launch_gemm_forward", "launch_gemm_backward", "GEMM_CHUNK_BYTES",
           "CPU_GEMM_CHUNK_BYTES"]


@dataclass(frozen=True)
class TileShape:
    """One block's tiles: ``rows`` rows of y (and of the basis), ``cols`` outputs, ``depth`` the step of the
    contraction loop. The output tiles are [rows, cols] (y), [rows, cols] (dW: rows of the width) and
    [rows, rows] (dA^T); shared memory holds about (rows cols + (rows + cols) depth) values at a time."""

    rows: int
    cols: int
    depth: int

    @property
    def name(self) -> str:
        return f"{self.rows}x{self.cols}x{self.depth}"


# The fixed list the tile shape is taken from (each entry of a scalar type is one module, 25-35 s or more to build
# on the GPU, once per machine: Warp's kernel cache keeps it): float32 64 x 64 tiles (32 KiB of operands and
# accumulator), 32 outputs wide for layers of at most 32 outputs (half the padding work there); float64 32 x 32
# (the same bytes as a float32 32 x 64 tile). Built for sm_90, the float32 64 x 64 kernels take 32-48 KiB of shared
# memory a block: within the 48 KiB a block gets without opting in to more.
TILE_SHAPES = {
    "float32": (TileShape(64, 64, 32), TileShape(64, 32, 32)),
    "float64": (TileShape(32, 32, 32),),
}
BLOCK_DIM = 128  # threads a block on CUDA: four warps share a tile's GEMM (the CPU runs one thread a block)
# Scratch for one chunk of the dense basis: the torch bridge's bounds (``edge_driver.GEMM_CHUNK_BYTES``, and on
# the CPU a chunk that stays in a core's cache from the kernel that writes it to the GEMM that reads it).
GEMM_CHUNK_BYTES = 128 * 2**20
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


def tile_gemm_modules(scalar: str) -> list[str]:
    """Every tile-GEMM module a layer of this scalar type may launch (one per listed tile shape), its kernels
    built: what ``warpkan precompile`` loads for the Warp-native layers' gemm strategy."""
    return [tile_gemm_kernels(scalar, tiles).module for tiles in TILE_SHAPES[scalar]]


@functools.lru_cache(maxsize=None)
def tile_gemm_kernels(scalar: str, tiles: TileShape) -> TileGemmKernels:
    """The three GEMM kernels of one scalar type and tile shape, in one module (all three run in a training
    step, so they are built together). Every tile load past an array's end reads zeros and every store past
    it is dropped (Warp's bounds-checked tiles), so any shape works."""
    dtype = SCALARS[scalar]
    tm, tn, tk = tiles.rows, tiles.cols, tiles.depth
    module = tile_gemm_module(scalar, tiles)
    # the module's own block size is the launches': a load without one (``warpkan precompile``) builds the
    # variant the launches run (Warp builds a tile module once per block size)
    wp.set_module_options({"block_dim": BLOCK_DIM}, module)
    kernel = functools.partial(wp.kernel, enable_backward=False, module=module)

    @kernel
    def forward(basis_t: wp.array2d(dtype=dtype), weight: wp.array2d(dtype=dtype), bias: wp.array2d(dtype=dtype),
                has_bias: int, y: wp.array2d(dtype=dtype)):
        # y [rows, out] = basis_t^T weight (+ bias [1, out]): one (rows, outputs) tile a block, over the width
        row_tile, col_tile = wp.tid()
        acc = wp.tile_zeros(shape=(tm, tn), dtype=dtype)
        for k in range(0, basis_t.shape[0], tk):
            a = wp.tile_load(basis_t, shape=(tk, tm), offset=(k, row_tile * tm))
            b = wp.tile_load(weight, shape=(tk, tn), offset=(k, col_tile * tn))
            wp.tile_matmul(wp.tile_transpose(a), b, acc)
        if has_bias:
            bias_row = wp.tile_load(bias, shape=(1, tn), offset=(0, col_tile * tn))
            acc += wp.tile_broadcast(bias_row, shape=(tm, tn))
        wp.tile_store(y, acc, offset=(row_tile * tm, col_tile * tn))

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
    def basis_grad(weight: wp.array2d(dtype=dtype), dy: wp.array2d(dtype=dtype), d_basis_t: wp.array2d(dtype=dtype)):
        # d_basis_t [width, rows] = weight dy^T: one (width, rows) tile a block, over the outputs
        width_tile, row_tile = wp.tid()
        acc = wp.tile_zeros(shape=(tm, tm), dtype=dtype)
        for o in range(0, weight.shape[1], tn):
            a = wp.tile_load(weight, shape=(tm, tn), offset=(width_tile * tm, o))
            b = wp.tile_load(dy, shape=(tm, tn), offset=(row_tile * tm, o))
            wp.tile_matmul(a, wp.tile_transpose(b), acc)
        wp.tile_store(d_basis_t, acc, offset=(width_tile * tm, row_tile * tm))

    return TileGemmKernels(module, forward, weight_grad, basis_grad)


def chunk_rows(n_rows: int, width: int, itemsize: int, is_cuda: bool, tiles: TileShape) -> int:
    """Rows of one chunk of the dense basis: at most GEMM_CHUNK_BYTES of it (CPU_GEMM_CHUNK_BYTES on the CPU),
    whole row tiles (every chunk but the last fills its blocks), at least one row tile."""
    limit = GEMM_CHUNK_BYTES if is_cuda else CPU_GEMM_CHUNK_BYTES
    rows = max(tiles.rows, limit // max(1, width * itemsize))
    return max(1, min(rows - rows % tiles.rows, n_rows))


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


def _block(device) -> int:
    return BLOCK_DIM if device.is_cuda else 1


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
    if n_rows == 0 or n_out == 0:
        return
    scalar = scalar_name(x)
    tiles = tile_shape(scalar, n_out)
    kernels = tile_gemm_kernels(scalar, tiles)
    device = x.device
    ws = workspace or workspace_for(device, stream)
    rows = chunk_rows(n_rows, width, wp.types.type_size_in_bytes(x.dtype), device.is_cuda, tiles)
    bias_row = bias.reshape((1, n_out)) if bias is not None else None
    with on_stream(stream):
        for start, stop in _chunks(n_rows, rows):
            basis_t = ws.get("tile_gemm_basis", (width, stop - start), x.dtype)
            edge.launch_expand_basis(family, frame, x[start:stop], n_coef, basis_t, use_base, stream)
            launch(kernels.forward, (-(-(stop - start) // tiles.rows), -(-n_out // tiles.cols)),
                   [basis_t, weight, bias_row, int(bias is not None)], [y[start:stop]], device, stream,
                   block_dim=_block(device), tiled=True)


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
    block = _block(device)
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
                launch(kernels.basis_grad, (-(-width // tiles.rows), -(-(stop - start) // tiles.rows)),
                       [weight, dy[start:stop]], [basis_t], device, stream, block_dim=block, tiled=True)
                edge.launch_contract_basis_grad(family, frame, x[start:stop], n_coef, basis_t, dx_new[start:stop],
                                                use_base, stream)
        if d_weight is not None:
            launch_combine_chunks(partial.reshape((splits, padded_width, n_out))[:, :width], d_weight,
                                  accumulate=True, stream=stream)
        if dx is not None:
            launch_accumulate(dx_new, dx, stream)
