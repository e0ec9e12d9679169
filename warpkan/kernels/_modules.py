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

__all__ = ["ModuleBuild", "DEFAULT_BLOCK_DIM", "builds", "distinct", "load"]

DEFAULT_BLOCK_DIM = 256  # what wp.launch (and _runtime.launch) use when no block size is given


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
