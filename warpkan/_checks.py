"""Argument checks shared by every layer, torch and Warp-native alike (this module imports neither torch nor
Warp), so that one argument follows one rule everywhere.

The rules:

- an int is a Python ``int`` or a numpy integer; ``bool`` is not an int, and neither is a float such as
  ``8.0`` (TypeError);
- a size is an int in [1, :data:`INDEX_MAX`] (ValueError outside): the kernels index with int32, and
  :func:`fits_index` bounds the element count of each array a layer would allocate the same way, so an
  absurd size is refused before anything is allocated;
- a number is a real number (an int, a float or a numpy scalar of either), not a bool;
- messages name the argument, say what was expected and show what was given.

Each function returns the value normalised (a Python ``int``, ``float`` or tuple), so that numpy integers
do not leak into a layer's attributes or its saved configuration.
"""

from __future__ import annotations

import math
import numbers

__all__ = [
    "INDEX_MAX",
    "integer",
    "positive_int",
    "non_negative_int",
    "int_in_range",
    "divides",
    "fits_index",
    "number",
    "positive_number",
    "increasing_range",
    "sequence",
    "one_of",
]

# the largest index (and element count) the kernels can address: they index with int32
INDEX_MAX = 2**31 - 1


def _given(value) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def integer(name: str, value) -> int:
    """``value`` as a Python int; TypeError unless it is an int or a numpy integer (bool and float refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {_given(value)}")
    return int(value)


def _at_least(name: str, value, lo: int, expected: str) -> int:
    value = integer(name, value)
    if value < lo:
        raise ValueError(f"{name} must be {expected}, got {value}")
    if value > INDEX_MAX:
        raise ValueError(f"{name} must be {expected} of at most {INDEX_MAX} (the kernels index with int32), "
                         f"got {value}")
    return value


def int_in_range(name: str, value, lo: int, hi: int | None = None) -> int:
    """An int in [lo, hi] (``hi=None``: [lo, INDEX_MAX]): TypeError for a non-int, ValueError outside."""
    if hi is None:
        return _at_least(name, value, lo, f"an int >= {lo}")
    value = integer(name, value)
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in [{lo}, {hi}], got {value}")
    return value


def positive_int(name: str, value) -> int:
    """A size: an int in [1, INDEX_MAX]."""
    return _at_least(name, value, 1, "a positive int")


def non_negative_int(name: str, value) -> int:
    """An int in [0, INDEX_MAX]."""
    return _at_least(name, value, 0, "a non-negative int")


def divides(name: str, value: int, of_name: str, of_value: int) -> None:
    """ValueError unless the (checked) int ``value`` divides ``of_value``: ``name`` splits ``of_name`` evenly."""
    if of_value % value:
        raise ValueError(f"{name} ({value}) must divide {of_name} ({of_value}): uneven groups are refused")


def fits_index(what: str, shape: tuple, **args) -> None:
    """ValueError when an array of ``shape`` (made from the checked sizes ``args``, named in the message)
    would hold more than INDEX_MAX elements, the most the kernels' int32 indices address. Call it before
    allocating, so that an absurd size gives this message rather than an allocation failure."""
    elements = math.prod(int(s) for s in shape)
    if elements > INDEX_MAX:
        given = ", ".join(f"{k}={v}" for k, v in args.items())
        raise ValueError(f"{given} make {what} of shape {tuple(int(s) for s in shape)}: {elements} elements, more than "
                         f"the {INDEX_MAX} the kernels' int32 indices address")


def number(name: str, value) -> float:
    """A finite real number as a float: TypeError for a non-number (bool included), ValueError for NaN/inf."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {_given(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    return value


def positive_number(name: str, value) -> float:
    """A finite real number > 0 as a float: TypeError for a non-number (bool included), ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {_given(value)}")
    value = float(value)
    if not 0.0 < value < math.inf:
        raise ValueError(f"{name} must be a positive finite number, got {value}")
    return value


def sequence(name: str, value, length: int) -> tuple:
    """``value`` as a tuple of ``length`` items: TypeError unless it is a list or tuple, ValueError for another
    length."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a tuple of {length} items, got {_given(value)}")
    if len(value) != length:
        raise ValueError(f"{name} must be a tuple of {length} items, got {tuple(value)!r} ({len(value)} items)")
    return tuple(value)


def increasing_range(name: str, value) -> tuple[float, float]:
    """(lo, hi): a pair of finite real numbers with lo < hi (a list, a tuple or a 1-D array of two)."""
    if hasattr(value, "tolist") and getattr(value, "ndim", None) == 1:  # a numpy array or a tensor
        value = value.tolist()
    pair = sequence(name, value, 2)
    lo, hi = (number(f"{name}[{i}]", v) for i, v in enumerate(pair))
    if not lo < hi:
        raise ValueError(f"{name} must be increasing (lo < hi), got ({lo}, {hi})")
    return lo, hi


def one_of(name: str, value, choices: tuple):
    """``value`` when it is one of ``choices`` (compared with ==), else ValueError listing them."""
    if not isinstance(value, (str, numbers.Number)) or value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value
