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


# Sum over aligned groups of `width` consecutive lanes of a warp (width a power of two up to 32), by xor
# shuffles: every lane of a group gets the group's sum, in a fixed order (bitwise reproducible). The caller
# keeps every lane of the warp on the call (launch dims a multiple of 32, no divergent branch around it).
# Off the GPU a "group" is one thread (width 1): the value comes back unchanged.
_LANE_SUM_SNIPPET = """
#if defined(__CUDA_ARCH__)
    for (int offset = width >> 1; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
#endif
    return v;
"""


@functools.lru_cache(maxsize=None)
def lane_sum(scalar):
    """``@wp.func`` (v, width) -> sum of v over the aligned group of ``width`` lanes holding this thread."""

    def lane_sum(v: scalar, width: int) -> scalar:
        return v

    lane_sum.__name__ = lane_sum.__qualname__ = f"lane_sum_{wp.types.type_repr(scalar)}"
    return wp.func_native(_LANE_SUM_SNIPPET)(lane_sum)


def lane_group_width(threads_per_item: int, is_cuda: bool) -> int:
    """Width of the lane groups that share one item when ``threads_per_item`` consecutive threads work on
    it: itself when it is a power of two up to 32, 32 when it is a multiple of 32 (each warp then holds a
    part of one item), else 1 (no shuffles; each thread stands alone). Always 1 off the GPU."""
    if not is_cuda:
        return 1
    if threads_per_item <= 32 and threads_per_item & (threads_per_item - 1) == 0:
        return threads_per_item
    return 32 if threads_per_item % 32 == 0 else 1


# Four consecutive elements along the innermost index of a 2-D or 3-D float32/float64 array, in one 16-byte
# load (two for float64) when the caller says they are aligned: innermost extent a multiple of 4, base
# address a multiple of 16 bytes, contiguous. Otherwise (and off the GPU) four element loads, the index
# clamped to the last element (the caller masks what lies past the end).
_VEC4_LOAD = {
    "float32": """const float4 v = __ldg(reinterpret_cast<const float4*>(p));
        r.c[0] = v.x; r.c[1] = v.y; r.c[2] = v.z; r.c[3] = v.w;""",
    "float64": """const double2 v0 = __ldg(reinterpret_cast<const double2*>(p));
        const double2 v1 = __ldg(reinterpret_cast<const double2*>(p) + 1);
        r.c[0] = v0.x; r.c[1] = v0.y; r.c[2] = v1.x; r.c[3] = v1.y;""",
}

_LOAD4_SNIPPET = """
    const int last = a.shape[@LAST_DIM@] - 1;
    wp::vec_t<4, wp::@SCALAR@> r;
#if defined(__CUDA_ARCH__)
    if (aligned) {
        const auto* p = wp::address(a, @INDEX@k);
        @VEC_LOAD@
        return r;
    }
#endif
    for (int c = 0; c < 4; ++c)
        r.c[c] = *wp::address(a, @INDEX@(k + c < last ? k + c : last));
    return r;
"""


@functools.lru_cache(maxsize=None)
def load4_funcs(scalar_key: str):
    """(load4_2d(a, i, k, aligned), load4_3d(a, i, j, k, aligned)) -> vec4 of a[..., k .. k + 3]."""
    scalar = SCALARS[scalar_key]
    vec4 = wp.types.vector(length=4, dtype=scalar)

    def snippet(last_dim: int, index: str) -> str:
        return (_LOAD4_SNIPPET.replace("@LAST_DIM@", str(last_dim)).replace("@INDEX@", index)
                .replace("@SCALAR@", scalar_key).replace("@VEC_LOAD@", _VEC4_LOAD[scalar_key]))

    def load4_2d(a: wp.array2d(dtype=scalar), i: int, k: int, aligned: int) -> vec4:
        return vec4()

    def load4_3d(a: wp.array3d(dtype=scalar), i: int, j: int, k: int, aligned: int) -> vec4:
        return vec4()

    load4_2d.__name__ = load4_2d.__qualname__ = f"load4_2d_{scalar_key}"
    load4_3d.__name__ = load4_3d.__qualname__ = f"load4_3d_{scalar_key}"
    return (wp.func_native(snippet(1, "i, "))(load4_2d), wp.func_native(snippet(2, "i, j, "))(load4_3d))


def vec4_aligned(*arrays) -> bool:
    """Whether ``load4_funcs`` may take the 16-byte path on all ``arrays``: contiguous, innermost extent a
    multiple of 4, base address a multiple of 16 bytes."""
    for a in arrays:
        if a is None:
            continue
        if a.shape[-1] % 4 or a.ptr is None or a.ptr % 16 or not a.is_contiguous:
            return False
    return True
