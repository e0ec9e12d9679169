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


# Element-wise streaming of [N, C / V] arrays of V-vectors (contiguous), as fast as the load/store units allow:
# - Warp's vector types carry no alignment, so a load of a wp.vector element compiles to one narrow load per
#   component (8 x 16-bit loads for 8 bf16 values). These loads and stores move a vector in one 4/8/16-byte
#   access. The caller guarantees the alignment (base address a multiple of the vector's size; the torch
#   bridges check it) and that the array is dense.
# - The address is ``data + row * (C / V) + col`` in unsigned 64-bit arithmetic (one wide multiply-add);
#   Warp's general indexing (signed, strided) cost ~20 integer instructions an access.
# - 16-bit vectors are widened to and narrowed from fp32 pairwise: a pair costs one shift and one mask (bf16)
#   or two cvt of the halves of one register (fp16) to widen, and one paired cvt (cvt.rn.{bf16x2,f16x2}.f32,
#   round to nearest even as Warp's casts) to narrow. Warp's casts go one component at a time, and a store
#   of a vector narrowed apart from it was split into 4-byte stores.
_WIDE_WORDS = {2: "unsigned short", 4: "unsigned int", 8: "uint2", 16: "uint4"}

_DENSE_ADDRESS = "a.data + ((unsigned long long)(unsigned)row * (unsigned)a.shape[1] + (unsigned)col)"

# The load is volatile inline PTX (read-only path, as __ldg): the compiler keeps it where the kernel issues
# it. A kernel that issues a step's loads together before their arithmetic (to keep bytes in flight) saw
# __ldg loads sunk down to their first use, one at a time.
_LOAD_PTX = {
    "unsigned short": 'asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(bits) : "l"(p));',
    "unsigned int": 'asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(bits) : "l"(p));',
    "uint2": 'asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(bits.x), "=r"(bits.y) : "l"(p));',
    "uint4": ('asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" '
              ': "=r"(bits.x), "=r"(bits.y), "=r"(bits.z), "=r"(bits.w) : "l"(p));'),
}

_LOAD_SNIPPET = """
#if defined(__CUDA_ARCH__)
    const auto* p = @ADDRESS@;
    @WORD@ bits;
    @LOAD_PTX@
    return *reinterpret_cast<decltype(a.data)>(&bits);
#else
    return *wp::address(a, row, col);
#endif
"""

_WIDEN_PAIR = {
    "bfloat16": """r.c[2 * i] = __uint_as_float(w[i] << 16);
        r.c[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);""",
    "float16": """asm("{.reg .b16 lo, hi;\\n mov.b32 {lo, hi}, %2;\\n cvt.f32.f16 %0, lo;\\n cvt.f32.f16 %1, hi;}"
            : "=f"(r.c[2 * i]), "=f"(r.c[2 * i + 1]) : "r"(w[i]));""",
}

_WIDEN_SNIPPET = """
    wp::vec_t<@V@, wp::float32> r;
#if defined(__CUDA_ARCH__)
    const unsigned int* w = reinterpret_cast<const unsigned int*>(&v);
    #pragma unroll
    for (int i = 0; i < @V@ / 2; ++i) {
        @PAIR@
    }
#else
    for (int i = 0; i < @V@; ++i) r.c[i] = wp::float32(v.c[i]);
#endif
    return r;
"""

_NARROW_PAIR = {
    "bfloat16": 'asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w[i]) : "f"(v.c[2 * i + 1]), "f"(v.c[2 * i]));',
    "float16": 'asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w[i]) : "f"(v.c[2 * i + 1]), "f"(v.c[2 * i]));',
}

_STORE_SNIPPET = """
#if defined(__CUDA_ARCH__)
    auto* p = @ADDRESS@;
    @WORD@ bits;
    @PACK@
    *reinterpret_cast<@WORD@*>(p) = bits;
#else
    auto* p = wp::address(a, row, col);
    for (int i = 0; i < @V@; ++i) p->c[i] = wp::@SCALAR@(v.c[i]);
#endif
"""

_PACK_PAIRS = """unsigned int* w = reinterpret_cast<unsigned int*>(&bits);
    #pragma unroll
    for (int i = 0; i < @V@ / 2; ++i)
        @PAIR@"""

_PACK_SAME = """wp::@SCALAR@* w = reinterpret_cast<wp::@SCALAR@*>(&bits);
    #pragma unroll
    for (int i = 0; i < @V@; ++i)
        w[i] = v.c[i];"""

# name of each floating-point scalar type an I/O array may hold
IO_SCALAR_NAMES = {wp.float32: "float32", wp.float64: "float64", wp.float16: "float16", wp.bfloat16: "bfloat16"}


@functools.lru_cache(maxsize=None)
def vector_io(vector_type):
    """(load(a, row, col) -> vector, widen(vector) -> arithmetic vector, store(a, row, col, arithmetic vector))
    for dense 2-D arrays of ``vector_type``. The arithmetic type is fp32 for bf16/fp16 vectors and the scalar
    type itself for fp32/fp64; ``store`` narrows. One memory access a vector when it is 2, 4, 8 or 16 bytes
    (16-bit vectors: of even length); Warp's indexing and casts otherwise."""
    scalar = vector_type._wp_scalar_type_
    length = vector_type._length_
    name = IO_SCALAR_NAMES.get(scalar)
    arith = scalar if scalar in (wp.float32, wp.float64) else wp.float32
    arith_vector = wp.types.vector(length=length, dtype=arith)
    word = _WIDE_WORDS.get(wp.types.type_size_in_bytes(vector_type))
    narrowing = arith != scalar
    if name is None or word is None or (narrowing and length % 2):
        @wp.func
        def load_indexed(a: wp.array2d(dtype=vector_type), row: int, col: int):
            return a[row, col]

        @wp.func
        def widen_cast(v: vector_type):
            return arith_vector(v)

        @wp.func
        def store_indexed(a: wp.array2d(dtype=vector_type), row: int, col: int, v: arith_vector):
            a[row, col] = vector_type(v)

        return load_indexed, widen_cast, store_indexed

    def load(a: wp.array2d(dtype=vector_type), row: int, col: int) -> vector_type:
        # never run (the snippet is the body); naming the type here puts it in the closure, where Warp
        # resolves a native function's return annotation
        return vector_type()

    def widen(v: vector_type) -> arith_vector:
        return arith_vector()

    def store(a: wp.array2d(dtype=vector_type), row: int, col: int, v: arith_vector): ...

    # one name per vector type, so that two types used in one module never meet as overloads
    tag = f"{name}x{length}"
    for fn in (load, widen, store):
        fn.__name__ = fn.__qualname__ = f"dense_{fn.__name__}_{tag}"
    pack = (_PACK_PAIRS.replace("@PAIR@", _NARROW_PAIR[name]) if narrowing else _PACK_SAME)
    store_snippet = (_STORE_SNIPPET.replace("@PACK@", pack).replace("@ADDRESS@", _DENSE_ADDRESS)
                     .replace("@WORD@", word).replace("@V@", str(length)).replace("@SCALAR@", name))
    load_fn = wp.func_native(_LOAD_SNIPPET.replace("@ADDRESS@", _DENSE_ADDRESS).replace("@WORD@", word)
                             .replace("@LOAD_PTX@", _LOAD_PTX[word]))(load)
    if narrowing:
        widen_snippet = _WIDEN_SNIPPET.replace("@V@", str(length)).replace("@PAIR@", _WIDEN_PAIR[name])
        widen_fn = wp.func_native(widen_snippet)(widen)
    else:
        @wp.func
        def widen_fn(v: vector_type):
            return v
    return load_fn, widen_fn, wp.func_native(store_snippet)(store)


def dense_vector_width(itemsize: int, n: int, pointers, max_bytes: int = 16) -> int:
    """Elements per vector access of dense rows of ``n`` elements (see ``vector_io``): the widest power of two
    up to ``max_bytes`` that divides ``n`` and of whose size every base address in ``pointers`` is a multiple
    (so every row stays aligned); 1 at least."""
    width = max(max_bytes // itemsize, 1)
    while width > 1 and (n % width or any(ptr % (width * itemsize) for ptr in pointers)):
        width //= 2
    return width


def dense_vector_view(arr: wp.array, vector_type, what: str = "arrays") -> wp.array:
    """A contiguous [N, C] array as [N, C / V] of ``vector_type`` (V elements), sharing memory; ValueError
    naming ``what`` for a non-contiguous one (``vector_io`` addresses dense rows)."""
    if arr.dtype == vector_type:
        return arr
    if not arr.is_contiguous:
        raise ValueError(f"{what} must be contiguous")
    length = vector_type._length_
    return wp.array(ptr=arr.ptr, dtype=vector_type, shape=(arr.shape[0], arr.shape[1] // length), device=arr.device,
                    copy=False)


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


@wp.func
def first_at_least(values: wp.array(dtype=wp.int32), count: int, target: int):
    """The first index of the sorted values[:count] whose value is not below target (count when there is none):
    a binary search, so no atomics on popular values."""
    lo = int(0)
    hi = count
    while lo < hi:
        mid = (lo + hi) // 2
        if values[mid] < target:
            lo = mid + 1
        else:
            hi = mid
    return lo


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
