"""Pieces every kernel family's launchers share (no torch): the scalar types, and running on a caller's stream."""

import contextlib

import warp as wp

SCALARS = {"float32": wp.float32, "float64": wp.float64}


def scalar_name(array: wp.array, name: str = "x") -> str:
    """The key of ``SCALARS`` for ``array``'s dtype; TypeError naming the argument otherwise."""
    for key, scalar in SCALARS.items():
        if array.dtype == scalar:
            return key
    raise TypeError(f"{name} must be float32 or float64, got {wp.types.type_repr(array.dtype)}")


def on_stream(stream: "wp.Stream | None"):
    """Make ``stream`` Warp's current stream for the launches (and ``wp.utils`` calls) inside the block.

    ``sync_enter=False``: the caller's stream already orders the work; waiting on Warp's own stream would
    break CUDA-graph capture of the caller's stream. None (the CPU) changes nothing."""
    return wp.ScopedStream(stream, sync_enter=False) if stream is not None else contextlib.nullcontext()
