"""Warp-native layers, network and optimiser on ``wp.array``s (exported as ``warpkan.KANLinear`` and so on)."""

from .._warp_output import start_warp

start_warp()
