"""Pieces every kernel family's launchers share (no torch): the scalar types, and running on a caller's stream."""

import contextlib
import functools

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


# Warp's vector types carry no alignment, so a load of a wp.vector element compiles to one narrow load per
# component (8 x 16-bit loads for 8 bf16 values): the load/store units, not HBM, then bound an element-wise
# kernel. These native loads and stores move the whole vector in one 4/8/16-byte access. The caller
# guarantees the alignment: the array's base address is a multiple of the vector's size (the torch bridges
# check it) and so is every element (arrays of vectors are dense).
_WIDE_WORDS = {2: "unsigned short", 4: "unsigned int", 8: "uint2", 16: "uint4"}

_LOAD_SNIPPET = """
    auto* p = wp::address(x, row, col);
#if defined(__CUDA_ARCH__)
    @WORD@ bits = __ldg(reinterpret_cast<const @WORD@*>(p));
    return *reinterpret_cast<decltype(p)>(&bits);
#else
    return *p;
#endif
"""

_STORE_SNIPPET = """
    auto* p = wp::address(y, row, col);
#if defined(__CUDA_ARCH__)
    *reinterpret_cast<@WORD@*>(p) = *reinterpret_cast<const @WORD@*>(&v);
#else
    *p = v;
#endif
"""


@functools.lru_cache(maxsize=None)
def wide_access(vector_type):
    """(load(x, row, col) -> vector, store(y, row, col, v)) for 2-D arrays of ``vector_type``, each one
    memory access when the vector is 2, 4, 8 or 16 bytes; ``x[row, col]`` / ``y[row, col] = v`` otherwise."""
    word = _WIDE_WORDS.get(wp.types.type_size_in_bytes(vector_type))
    if word is None:
        @wp.func
        def load(x: wp.array2d(dtype=vector_type), row: int, col: int):
            return x[row, col]

        @wp.func
        def store(y: wp.array2d(dtype=vector_type), row: int, col: int, v: vector_type):
            y[row, col] = v

        return load, store

    def load(x: wp.array2d(dtype=vector_type), row: int, col: int) -> vector_type:
        # never run (the snippet is the body); naming the type here puts it in the closure, where Warp
        # resolves a native function's return annotation
        return vector_type()

    def store(y: wp.array2d(dtype=vector_type), row: int, col: int, v: vector_type): ...

    # one name per vector type, so that two types used in one module never meet as overloads
    tag = f"{wp.types.type_repr(vector_type._wp_scalar_type_)}x{vector_type._length_}"
    for fn in (load, store):
        fn.__name__ = fn.__qualname__ = f"wide_{fn.__name__}_{tag}"
    return (wp.func_native(_LOAD_SNIPPET.replace("@WORD@", word))(load),
            wp.func_native(_STORE_SNIPPET.replace("@WORD@", word))(store))
