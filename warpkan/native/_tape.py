"""How a Warp-native layer joins ``wp.Tape``: its forward launches are not recorded (the kernels have no
generated adjoint), and one hand-written backward is recorded with ``Tape.record_func`` instead."""

from __future__ import annotations

from typing import Callable

import warp as wp

__all__ = ["active_tape", "record_backward", "new_output"]


def active_tape() -> "wp.Tape | None":
    return wp._src.context.runtime.tape if wp._src.context.runtime is not None else None


def new_output(shape, dtype, device, tape) -> wp.array:
    """The layer's output: with a gradient array when a tape records, so the backward can read it."""
    return wp.empty(shape, dtype=dtype, device=device, requires_grad=tape is not None)


def record_backward(tape, backward: Callable[[], None], arrays: list) -> None:
    """Record ``backward`` on ``tape``; ``arrays`` are those whose ``.grad`` it reads or accumulates into
    (arrays without a gradient, or without elements, are left out: nothing flows to them)."""
    if tape is None:
        return
    tape.record_func(backward, [a for a in arrays if isinstance(a, wp.array) and a.grad is not None and a.size])
