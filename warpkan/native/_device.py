"""The ``device`` argument of a Warp-native layer."""

from __future__ import annotations

import warp as wp

__all__ = ["layer_device"]


def layer_device(device, name: str = "device") -> wp.Device:
    """``device`` (None for Warp's default, a ``wp.Device`` or a name such as "cpu", "cuda", "cuda:1") as a
    ``wp.Device``, refused with a ValueError naming the argument when it does not exist here (Warp's own
    error for a missing GPU names no argument and prints driver errors first)."""
    if isinstance(device, wp.Device):
        return device
    if device is not None and str(device).startswith("cuda") and not wp.is_cuda_available():
        raise ValueError(f"{name}={device!r}: no CUDA device is available on this machine "
                         "(warp.is_cuda_available() is False); use device='cpu'")
    try:
        return wp.get_device(device)
    except (RuntimeError, ValueError, TypeError) as error:
        raise ValueError(f"{name} must name a Warp device such as 'cpu' or 'cuda:0', got {device!r} "
                         f"({error})") from None
