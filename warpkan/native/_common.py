"""What every Warp-native layer shares: the checks of its ``dtype``, ``device`` and ``strategy`` arguments, and the
handling of its input (checked like the torch layers check theirs; a strided input copied to a contiguous
one on the tape, so its gradient still reaches the caller's array; an empty batch)."""

from __future__ import annotations

from typing import Any

import numpy as np
import warp as wp

from .. import _checks
from ..kernels.edge.strategy import STRATEGIES

__all__ = ["NP_DTYPES", "check_dtype", "check_device", "check_strategy", "layer_input"]

# the floating types the Warp-native layers compute in, and their numpy twins (parameters are made in numpy)
NP_DTYPES = {wp.float32: np.float32, wp.float64: np.float64}


def check_dtype(dtype):
    """``dtype`` when it is ``wp.float32`` or ``wp.float64``, else TypeError naming the argument."""
    if not any(dtype is d for d in NP_DTYPES):
        given = wp.types.type_repr(dtype) if isinstance(dtype, type) else repr(dtype)
        raise TypeError(f"dtype must be wp.float32 or wp.float64, got {given}")
    return dtype


def check_device(device) -> wp.Device:
    """The Warp device ``device`` names (None: Warp's default device); ValueError naming the argument for a
    name Warp does not know or a device this machine does not have."""
    if isinstance(device, wp.Device):
        return device
    if device is not None and str(device).startswith("cuda") and not wp.is_cuda_available():
        # Warp's own error names no argument and prints driver errors first
        raise ValueError(f"device={device!r}: no CUDA device is available on this machine "
                         "(warp.is_cuda_available() is False); use device='cpu'")
    try:
        return wp.get_device(device)
    except (ValueError, RuntimeError, TypeError) as error:
        available = ", ".join(str(d) for d in wp.get_devices())
        raise ValueError(f"device must be a Warp device or the name of one (here: {available}), got {device!r} "
                         f"({error})") from None


def check_strategy(strategy) -> str:
    """``strategy`` when it is "auto", "stencil" or "gemm", else ValueError naming the argument."""
    return _checks.one_of("strategy", strategy, STRATEGIES)


def _type_name(value) -> str:
    kind = type(value)
    module = kind.__module__.split(".")[0]
    return kind.__name__ if module == "builtins" else f"{module}.{kind.__name__}"


@wp.kernel(enable_backward=False)
def _copy_2d(src: wp.array2d(dtype=Any), dst: wp.array2d(dtype=Any)):
    i, j = wp.tid()
    dst[i, j] = src[i, j]


@wp.kernel(enable_backward=False)
def _accumulate_2d(src: wp.array2d(dtype=Any), dst: wp.array2d(dtype=Any)):
    i, j = wp.tid()
    dst[i, j] = dst[i, j] + src[i, j]


def layer_input(x, features: int, dtype, device: wp.Device, tape, name: str = "x") -> wp.array:
    """``x`` checked as a layer's input: a ``wp.array`` [N, features] of ``dtype`` on ``device``, else
    TypeError (not a Warp array; another dtype) or ValueError (another ndim, last dimension or device), the
    message naming the argument. Returns x itself when it is contiguous; otherwise a contiguous copy that,
    under ``tape``, carries a gradient which the tape's backward adds into ``x.grad`` (a transposed or
    strided x works like a contiguous one, gradients included)."""
    if not isinstance(x, wp.array):
        hint = " (wrap it with wp.from_torch, or use warpkan.torch_bridge)" if type(x).__module__.startswith("torch") \
            else " (make one with wp.array)" if isinstance(x, (np.ndarray, list, tuple)) else ""
        raise TypeError(f"{name} must be a wp.array2d of shape [N, {features}], got {_type_name(x)}{hint}")
    if x.dtype is not dtype:
        raise TypeError(f"{name} must have dtype {wp.types.type_repr(dtype)} (the layer's), got "
                        f"{wp.types.type_repr(x.dtype)}")
    if x.ndim != 2 or x.shape[1] != features:
        raise ValueError(f"{name} must be a wp.array2d of shape [N, {features}], got shape {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} must be on the layer's device {device}, got {x.device}")
    if x.is_contiguous or x.size == 0:
        return x
    with_grad = tape is not None and x.requires_grad and x.grad is not None
    copy = wp.empty(x.shape, dtype=dtype, device=device, requires_grad=with_grad)
    wp.launch(_copy_2d, dim=x.shape, inputs=[x], outputs=[copy], device=device, record_tape=False)
    if with_grad:
        def backward():
            wp.launch(_accumulate_2d, dim=x.shape, inputs=[copy.grad], outputs=[x.grad], device=device,
                      record_tape=False)
            copy.grad.zero_()  # consumed, as a kernel's adjoint consumes its output's gradient

        tape.record_func(backward, [x, copy])
    return copy
