"""What a kernel family's launches load, named for ahead-of-time compilation (``warpkan precompile``).

Warp compiles a module once per block size (the size is part of the module's hash), so a module built at
Warp's default of 256 threads does not serve a launch of 128: the launch compiles its own. Each kernels module
therefore lists, for a layer configuration, every (module, block size) its launchers use, computed from the
same factories and launch constants the launchers call (one source of truth), and :func:`load` builds exactly
those. The CPU runs one thread a block whatever is asked (unless ``wp.config.enable_cpu_blocks``), as its
launches do.
"""

from typing import Iterable, NamedTuple

import warp as wp

__all__ = ["ModuleBuild", "DEFAULT_BLOCK_DIM", "builds", "distinct", "load", "TILE_MATMULS", "TILE_MATMUL",
           "set_tile_matmul", "tile_matmul_module"]

DEFAULT_BLOCK_DIM = 256  # what wp.launch (and _runtime.launch) use when no block size is given

# How ``wp.tile_matmul`` multiplies on CUDA in every module that calls it (UKAN's CG-MLP generator, the Warp-native
# layers' tile GEMMs): "scalar", Warp's cooperative scalar GEMM over the shared-memory tiles, or "mathdx",
# cuBLASDx linked as LTO code. On the H200 machine a scalar module builds in 0.2-4.6 s and a cuBLASDx one took
# 116-146 s; cuBLASDx ran the generator 1.05-2.1x and the native (65536, 256 -> 256) layers' steps 1.07-1.08x
# faster (docs/perf-notes-engine.md). So a new layer configuration does not wait minutes for its first step.
TILE_MATMULS = ("scalar", "mathdx")
TILE_MATMUL = "scalar"
_tile_matmul_modules: set[str] = set()


def _apply_tile_matmul(name: str) -> None:
    wp.set_module_options({"enable_mathdx_gemm": TILE_MATMUL == "mathdx"}, name)


def tile_matmul_module(name: str) -> str:
    """Register module ``name`` as one whose kernels call ``tile_matmul``, with its GEMM by :data:`TILE_MATMUL`
    (now and at every later :func:`set_tile_matmul`); returns the name."""
    _tile_matmul_modules.add(name)
    _apply_tile_matmul(name)
    return name


def set_tile_matmul(gemm: str) -> None:
    """How ``wp.tile_matmul`` multiplies on CUDA in warpkan's kernels (UKAN's coefficient generator, the
    Warp-native layers' tile GEMMs): ``"scalar"`` (the default; Warp's scalar GEMM, seconds to build) or
    ``"mathdx"`` (cuBLASDx: each module takes one to two minutes to build the first time on a GPU, and the
    products run up to 2x faster). For modules made before and after the call; a module built the other way is
    built again at its next launch, and Warp's kernel cache keeps both. A long run whose kernel cache is kept is
    where ``"mathdx"`` pays. The CPU runs Warp's scalar GEMM either way."""
    global TILE_MATMUL
    if gemm not in TILE_MATMULS:
        raise ValueError(f"tile_matmul's GEMM must be one of {TILE_MATMULS}, got {gemm!r}")
    TILE_MATMUL = gemm
    for name in _tile_matmul_modules:
        _apply_tile_matmul(name)


class ModuleBuild(NamedTuple):
    """One Warp module at the block size (threads a block on CUDA) its kernels are launched with."""

    name: str
    block_dim: int = DEFAULT_BLOCK_DIM


def builds(kernels: Iterable, block_dim: int = DEFAULT_BLOCK_DIM) -> tuple:
    """The :class:`ModuleBuild` of each ``wp.Kernel`` in ``kernels`` (None skipped), launched at ``block_dim``."""
    return distinct(ModuleBuild(kernel.module.name, block_dim) for kernel in kernels if kernel is not None)


def distinct(module_builds: Iterable) -> tuple:
    """``module_builds`` without repeats, in first-seen order."""
    return tuple(dict.fromkeys(module_builds))


def load(build: ModuleBuild, device) -> None:
    """Compile (or find in the kernel cache) and load ``build`` on ``device``, at the block size its launches
    resolve to there."""
    wp.load_module(build.name, device=device, block_dim=build.block_dim)
