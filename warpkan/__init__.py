"""warpkan: Kolmogorov-Arnold Network layers with NVIDIA Warp kernels.

``import warpkan`` imports Warp and numpy only. The Warp-native layers below are loaded on first use; the
PyTorch layers live in :mod:`warpkan.torch_bridge` (which needs torch). Warp's banner and per-module load
lines are hidden unless ``WARPKAN_VERBOSE=1`` is set (:mod:`warpkan._warp_output`).
"""

from importlib import import_module

from . import _warp_output  # noqa: F401 (sets Warp's log level)

__version__ = "0.1.0"

# public name -> module that defines it (imported lazily)
_LAZY = {
    "KANLinear": "warpkan.native.bspline",
    "KANNetwork": "warpkan.native.network",
    "UKANLinear": "warpkan.native.ukan",
    "Adam": "warpkan.native.optim",
    "PolyKANLinear": "warpkan.native.poly",
    "ChebyKANLinear": "warpkan.native.poly",
    "bspline_funcs": "warpkan.funcs",
    "poly_funcs": "warpkan.funcs",
    "rational_funcs": "warpkan.funcs",
    "GroupRational": "warpkan.native.rational",
    "GRKANLinear": "warpkan.native.rational",
    "set_tile_matmul": "warpkan.kernels._modules",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'warpkan' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
