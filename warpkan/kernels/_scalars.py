"""The scalar types the float kernels are built for, shared by every kernel family (no torch)."""

import warp as wp

SCALARS = {"float32": wp.float32, "float64": wp.float64}


def scalar_name(array: wp.array, name: str = "x") -> str:
    """The key of ``SCALARS`` for ``array``'s dtype; TypeError naming the argument otherwise."""
    for key, scalar in SCALARS.items():
        if array.dtype == scalar:
            return key
    raise TypeError(f"{name} must be float32 or float64, got {wp.types.type_repr(array.dtype)}")
