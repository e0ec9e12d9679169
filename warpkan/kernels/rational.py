"""Group-rational activation (KAT / FlashKAT) kernels in pure Warp (no torch import).

Maths. ``F_g(x) = P(x) / Q_g(x)`` with ``P(x) = a_0 + a_1 x + ... + a_m x^m`` and a safe (PAU) denominator:

- variant ``"A"`` (KAT's kernels):     ``Q = 1 + sum_{j=1..n} |b_{j-1}| |x|^j``
- variant ``"B"`` (FlashKAT's paper):  ``Q = 1 + |sum_{j=1..n} b_{j-1} x^j|``

Channels (the last, contiguous axis of ``x`` [N, C]) are split into ``G`` contiguous groups; the denominator
``b`` [G, n] is per group, the numerator ``a`` [GA, m+1] is shared (GA = 1, as in KAT) or per group (GA = G).
Where ``|.|`` is not differentiable its derivative is taken as ``sign(v) = -1 if v < 0 else +1`` (KAT's
convention), so zero denominator coefficients, as in the identity init, still receive a gradient.

Evaluation. For ``|x| <= T`` the powers of ``x`` are used directly. Above ``T`` (where ``x^m`` would overflow
fp32) the same quantities are evaluated in homogeneous form, ``x = u / w`` with ``u = sign(x)`` and
``w = 1 / |x|``: every polynomial is multiplied through by a power of ``w``, so nothing overflows and the
result is the limit of the rational (``F ~ (a_m / b_{n-1}) x^(m-n)``) even for ``x = +-inf``.

Layout and parallel scheme (both passes). ``x`` is viewed as [N, C / V] vectors of ``V`` channels (16-byte
loads for fp32/bf16/fp16, ``V`` divides the group size so a vector never straddles two groups). The launch
is tiled: every block works on ONE group, on a tile of that group's channel vectors and a chunk of rows.
Its lanes walk the block's (row, vector) items in row-major order, ``lane, lane + B, lane + 2B, ...``, so
consecutive lanes touch consecutive 16-byte vectors of a row (coalesced), and each lane reads the group's
coefficients once. The layout (blocks, chunks, tiles) is a function of the shapes alone.

Backward. One pass over ``x`` and ``dy``: each lane writes ``dx`` and keeps the ``m + 1 + n`` coefficient
gradient sums of its items: short fp32 runs (RUN_ELEMENTS elements) folded into fp64 lane totals, which
live in shared memory (a lane's own column), not in registers. The block reduces them with ``tile_sum`` (a
tree) and writes one fp64 partial row per block; a combine pass sums the partials of each coefficient in a
fixed order. So there is no global atomic at all, the coefficient gradients are bitwise reproducible
whatever ``deterministic`` says, and the only fp32 rounding in a sum is that of the short runs: the error
of dA and dB is that of the per-element terms themselves (about ``sqrt(N C / G) eps``), not of an fp32 sum
over ``N C / G`` terms.

Cost. The kernels are meant to run at HBM speed, so the common case is lean: for ``|x| <= T`` the value,
the derivative and the gradient factors come from one set of powers of ``x`` with per-block constants
folded in (``i a_i``, ``j |b_j|``; the sign of ``b_j`` of variant A is applied once to the block's sums),
and ``1 / Q`` (``Q >= 1``) is the hardware reciprocal (``rcp.approx``, below an ulp) on the GPU. The
homogeneous form only runs for a vector that holds an element above ``T``.
"""

import functools
import os
from dataclasses import dataclass
from types import SimpleNamespace

import warp as wp

from .. import _checks
from ._common import IO_SCALAR_NAMES, dense_vector_view, dense_vector_width, vector_io
from ._modules import ModuleBuild, distinct
from ._runtime import FlatWorkspace, launch, split_rows, workspace_for

__all__ = [
    "VARIANTS",
    "IO_TYPES",
    "RationalKernels",
    "RationalLayout",
    "get_kernels",
    "rational_modules",
    "vector_width",
    "layout",
    "large_x_threshold",
    "launch_forward",
    "launch_backward",
    "init_coefficients",
    "second_moment",
    "check_groups",
    "check_order",
    "check_layer_args",
]

VARIANTS = ("A", "B")
MAX_ORDER = 12


def check_groups(num_groups, num_channels: int, channels_name: str = "num_features") -> int:
    """``num_groups`` checked: a positive int that divides ``num_channels`` (named ``channels_name``)."""
    num_groups = _checks.positive_int("num_groups", num_groups)
    _checks.divides("num_groups", num_groups, channels_name, num_channels)
    return num_groups


def check_order(order) -> tuple[int, int]:
    """``order`` checked: a pair (m, n) of ints with 0 <= m <= MAX_ORDER (numerator degree) and
    1 <= n <= MAX_ORDER (denominator degree)."""
    m, n = _checks.sequence("order", order, 2)
    m = _checks.int_in_range("order[0] (the numerator degree m)", m, 0, MAX_ORDER)
    n = _checks.int_in_range("order[1] (the denominator degree n)", n, 1, MAX_ORDER)
    return m, n


def check_layer_args(num_features, num_groups, order, variant, init, features_name: str = "num_features") -> tuple:
    """The arguments of a group-rational layer (torch and Warp-native; ``features_name`` is the name its
    channel count goes by, e.g. ``in_features`` for GR-KAN), checked and normalised:
    ``(num_features, num_groups, (m, n), variant, init)``. Raises TypeError/ValueError naming the argument
    (rules: :mod:`warpkan._checks`), before anything is allocated."""
    num_features = _checks.positive_int(features_name, num_features)
    num_groups = check_groups(num_groups, num_features, features_name)
    order = check_order(order)
    variant = _checks.one_of("variant", variant, VARIANTS)
    init = _checks.one_of("init", init, init_names())
    return num_features, num_groups, order, variant, init
# I/O scalar type -> (Warp type, arithmetic type name, widest vector: 16 bytes)
IO_TYPES = {
    "float32": (wp.float32, "float32", 4),
    "float64": (wp.float64, "float64", 2),
    "float16": (wp.float16, "float32", 8),
    "bfloat16": (wp.bfloat16, "float32", 8),
}
_ACC_TYPES = {"float32": wp.float32, "float64": wp.float64}

BLOCK_DIM = 256
_TARGET_BLOCKS = 2048  # blocks wanted where the device does not say (the CPU)
# Launch shape of each pass on a GPU, by elements per 16-byte vector (4: fp32, 8: bf16/fp16), measured with
# scripts/rational_tune.py on an H200 at (1024 * 197, 768):
# - blocks per SM: the grid is a whole number of waves of resident blocks (a layout is a fixed split of the
#   work, so a last, part-filled wave would idle most of the GPU);
# - items per step: vectors per lane whose loads are issued together before their arithmetic (a while loop
#   is not unrolled: this is what keeps bytes in flight);
# - both are compiled into the kernel as __launch_bounds__(BLOCK_DIM, blocks per SM), so blocks per SM also
#   sets the register budget per lane (2: 128, 3: 85, 4: 64). With the fp64 lane totals in shared memory
#   and the loads kept together (see vector_io), the fastest forward runs 3 blocks of 4 (fp32, 0.311 ms) or
#   5 (bf16, 0.172 ms at 8 waves; 4: 0.175, 8 items at 2 blocks: 0.186) items, and the fastest backward
#   2 blocks of 5 (fp32) / 3 (bf16) items (0.504 / 0.399 ms); at 3 blocks the backward loses more to its
#   85-register budget than it gains.
BLOCKS_PER_SM = {"forward": {4: 3, 8: 3}, "backward": {4: 2, 8: 2}}
ITEMS_PER_STEP = {"forward": {4: 4, 8: 5}, "backward": {4: 5, 8: 3}}
# - waves: how many whole waves of resident blocks the work is split into. More, smaller blocks shorten the
#   tail in which the last blocks run alone: the fp32 forward goes from 0.348 ms at 1 wave to 0.314 at 32
#   (0.321 at 64, 0.335 at 128); the bf16 forward (4 items, 3 blocks) takes 0.189 / 0.181 / 0.175 / 0.180 ms
#   at 2 / 4 / 8 / 16 waves (5 items: 0.179 / 0.172 / 0.181 at 6 / 8 / 12). The backward's blocks each
#   write a row of fp64 partials that a fixed-order pass combines, and one wave is fastest.
WAVES = {"forward": {4: 32, 8: 8}, "backward": {4: 1, 8: 1}}


def launch_shape(table: dict, pass_name: str, vec: int) -> int:
    """The tuned value of ``table`` for a pass and vector width (the nearest tuned width for others)."""
    entries = table[pass_name]
    return entries.get(vec, entries[min(entries, key=lambda v: abs(v - vec))])


# Elements a lane sums in fp32 before folding the sums into its fp64 totals (a fold costs ~4 instructions per
# coefficient: at 32 elements, 1.3 an element in bf16)
RUN_ELEMENTS = 64
_MIN_ITEMS_PER_BLOCK = 2048  # vectors per block, so that small inputs do not spread over idle blocks
_MAX_TILE_WIDTH = 1024  # vectors of one group handled by one block side by side


def large_x_threshold(num_order: int, den_order: int) -> float:
    """|x| above which the homogeneous (overflow-free) form is used: ``T^max(m, n) = 2^64``."""
    return float(2.0 ** (64.0 / max(num_order, den_order, 1)))


# Bytes per vector access of each pass (see scripts/rational_tune.py for the H200 measurements behind them):
# the backward keeps ~10 sums and the coefficient constants live, so narrower items leave registers for
# more resident warps.
FORWARD_VECTOR_BYTES = 16
BACKWARD_VECTOR_BYTES = 16


def vector_width(io_name: str, group_size: int, max_bytes: int = 16) -> int:
    """Channels per vector access: the widest power of two up to ``max_bytes`` that divides the group size."""
    return dense_vector_width(wp.types.type_size_in_bytes(IO_TYPES[io_name][0]), group_size, (), max_bytes)


_ARRAYS = "arrays passed to the rational kernels"  # what a non-contiguous array is called in the error


@dataclass(frozen=True)
class RationalLayout:
    """How the (rows x vectors) of each group are cut into blocks; a function of the shapes alone."""

    vectors_per_group: int
    tile_width: int
    tiles_per_group: int
    chunks: int
    rows_per_chunk: int
    num_groups: int

    @property
    def blocks_per_group(self) -> int:
        return self.tiles_per_group * self.chunks

    @property
    def num_blocks(self) -> int:
        return self.num_groups * self.blocks_per_group


def layout(n_rows: int, vectors_per_group: int, num_groups: int, target_blocks: int = _TARGET_BLOCKS) -> RationalLayout:
    """At most ``target_blocks`` blocks (at least one per group and tile), fewer for small inputs."""
    tiles = max(1, -(-vectors_per_group // _MAX_TILE_WIDTH))
    tile_width = -(-vectors_per_group // tiles)
    by_target = max(1, target_blocks // (num_groups * tiles))
    by_size = -(-(n_rows * tile_width) // _MIN_ITEMS_PER_BLOCK)
    chunks, rows_per_chunk = split_rows(n_rows, min(by_target, by_size))
    return RationalLayout(vectors_per_group, tile_width, tiles, chunks, rows_per_chunk, num_groups)


_RCP_SNIPPET = """
#if defined(__CUDA_ARCH__)
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(q));
    return r;
#else
    return 1.0f / q;
#endif
"""


@wp.func_native(_RCP_SNIPPET)
def _fast_reciprocal(q: float) -> float:
    """1 / q with the GPU's rcp.approx.ftz (one MUFU instruction; relative error below 2^-23, 0 for q = inf)
    instead of IEEE division, whose slow-path checks are a large share of the element cost. The flush to
    zero of denormals cannot bite: a safe denominator is >= 1."""
    ...


@wp.func
def _exact_reciprocal(q: wp.float64):
    return wp.float64(1.0) / q


# The backward's fp64 lane totals live in shared memory, one column per lane (slot k * BLOCK_DIM + lane: a
# warp's 32 doubles are consecutive, no bank conflict), not in registers: 2 (m + 1 + n) registers a lane
# were what pushed the backward past 128 registers (a spilling frame of 100+ bytes at 2 blocks per SM). A lane
# only ever touches its own column until the block reduction, so no barrier is needed. On the CPU (one lane a
# block, launches run serially) the column is a static array.
_LANE_TOTALS_SNIPPET = """
#if defined(__CUDA_ARCH__)
    __shared__ double totals[@K@ * @LANES@];
#else
    static double totals[@K@ * @LANES@];
#endif
    double* column = totals + lane;
    if (op == 0) {
        for (int k = 0; k < @K@; ++k) column[k * @LANES@] = 0.0;
    } else if (op == 1) {
        for (int k = 0; k < @K@; ++k) column[k * @LANES@] += (double)run[k];
    } else {
        return column[index * @LANES@];
    }
    return 0.0;
"""


@functools.lru_cache(maxsize=None)
def lane_totals(run_type, lanes: int):
    """``@wp.func`` (op, run, lane, index) -> float64 on a lane's fp64 totals in shared memory: op 0 zeroes
    them, op 1 adds ``run`` (a vector of fp32 sums) to them, op 2 returns total ``index``."""
    k = run_type._length_

    def lane_totals(op: int, run: run_type, lane: int, index: int) -> wp.float64:
        return wp.float64(0.0)

    lane_totals.__name__ = lane_totals.__qualname__ = f"lane_totals_{k}_{lanes}"
    return wp.func_native(_LANE_TOTALS_SNIPPET.replace("@K@", str(k)).replace("@LANES@", str(lanes)))(lane_totals)


@dataclass(frozen=True)
class RationalKernels:
    """The compiled kernels of one (orders, variant, I/O type, vector width) combination."""

    num_order: int
    den_order: int
    variant: str
    io_name: str
    vec: int
    io_vector: type
    out_vector: type  # y's and dy's
    acc: type
    coef: type  # scalar type of the coefficient arrays and of their gradients
    grad_vector: type  # m + 1 + n accumulators
    forward: wp.Kernel
    backward: wp.Kernel
    combine: wp.Kernel
    module: str


# ---------------------------------------------------------------------- kernel factories
# Every factory below is cached on the arguments of get_kernels (a "combination"), so a combination builds each
# @wp.func and kernel once, and all its kernels land in one Warp module (_Config.module). The factories close
# over the types and constants of _config under the names the @wp.funcs and kernels use.


@dataclass(frozen=True, eq=False)
class _Config:
    """The types, sizes and launch shape of one combination (see _config), and the module its kernels go to."""

    num_order: int
    den_order: int
    is_a: bool  # variant A
    M: int  # numerator coefficients
    N: int  # denominator coefficients
    K: int  # coefficient gradients, M + N
    D: int  # powers 0 .. max(m, n)
    V: int  # channels per vector
    UF: int  # items per step of the forward
    UB: int  # items per step of the backward
    RUN: int  # steps (of UB items of V elements) summed in fp32 per fp64 fold
    BF: int  # blocks per SM of the forward
    BB: int  # blocks per SM of the backward
    acc: type  # arithmetic type
    coef: type  # scalar type of the coefficient arrays and of their gradients
    io_vec: type
    load_vec: object
    widen: object
    store_vec: object
    out_vec: type  # y's and dy's vectors (io_vec unless the combination's output type differs)
    load_out: object
    widen_out: object
    store_out: object
    matUB_out: type  # the dy vectors of one backward step
    accV: type
    matUF: type  # the vectors of one forward step
    matUB: type  # the vectors of one backward step
    vecUFi: type
    vecUBi: type
    vecM: type
    vecN: type
    vecK: type
    vecD: type
    zero: object
    one: object
    threshold: object  # large_x_threshold in the arithmetic type
    module: str


@functools.lru_cache(maxsize=None)
def _config(num_order: int, den_order: int, variant: str, io_name: str, vec: int,
            coef_name: "str | None", out_name: "str | None" = None) -> _Config:
    """The arguments of get_kernels checked (ValueError/TypeError naming the bad one), and what follows from
    them."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if not (0 <= num_order <= MAX_ORDER and 1 <= den_order <= MAX_ORDER):
        raise ValueError(f"order must be (m, n) with 0 <= m <= {MAX_ORDER}, 1 <= n <= {MAX_ORDER}, got {(num_order, den_order)}")
    if io_name not in IO_TYPES:
        raise TypeError(f"x must have a scalar type in {sorted(IO_TYPES)}, got {io_name}")
    io_scalar, acc_name, max_vec = IO_TYPES[io_name]
    if vec < 1 or vec > max_vec or vec & (vec - 1):
        raise ValueError(f"vector width must be a power of two <= {max_vec}, got {vec}")
    acc = _ACC_TYPES[acc_name]
    coef_name = coef_name or acc_name
    if coef_name not in IO_TYPES:
        raise TypeError(f"coefficients must have a scalar type in {sorted(IO_TYPES)}, got {coef_name}")
    coef = IO_TYPES[coef_name][0]
    out_name = out_name or io_name
    if out_name not in IO_TYPES or IO_TYPES[out_name][1] != acc_name:
        raise TypeError(f"y and dy must have a scalar type in {sorted(IO_TYPES)} of x's arithmetic type ({acc_name}), "
                        f"got {out_name}")
    M = num_order + 1
    N = den_order
    D = max(num_order, den_order) + 1
    UF = launch_shape(ITEMS_PER_STEP, "forward", vec)
    UB = launch_shape(ITEMS_PER_STEP, "backward", vec)
    BF = launch_shape(BLOCKS_PER_SM, "forward", vec)
    BB = launch_shape(BLOCKS_PER_SM, "backward", vec)
    io_vec = wp.types.vector(length=vec, dtype=io_scalar)
    # one 16-byte access per vector; I/O vector <-> arithmetic-type vector, pairwise for bf16/fp16 (see _common)
    load_vec, widen, store_vec = vector_io(io_vec)
    module = f"warpkan_rational_{variant}_{num_order}_{den_order}_{io_name}_v{vec}_u{UF}{UB}_b{BF}{BB}"
    if coef_name != acc_name:
        module += f"_w{coef_name}"
    if out_name != io_name:
        module += f"_o{out_name}"
    out_vec = wp.types.vector(length=vec, dtype=IO_TYPES[out_name][0])
    load_out, widen_out, store_out = vector_io(out_vec) if out_name != io_name else (load_vec, widen, store_vec)
    return _Config(
        num_order=num_order, den_order=den_order, is_a=variant == "A",
        M=M, N=N, K=M + N, D=D, V=vec,
        UF=UF, UB=UB, RUN=max(1, RUN_ELEMENTS // (vec * UB)), BF=BF, BB=BB,
        acc=acc, coef=coef, io_vec=io_vec, load_vec=load_vec, widen=widen, store_vec=store_vec,
        out_vec=out_vec, load_out=load_out, widen_out=widen_out, store_out=store_out,
        matUB_out=wp.types.matrix(shape=(UB, vec), dtype=IO_TYPES[out_name][0]),
        accV=wp.types.vector(length=vec, dtype=acc),
        matUF=wp.types.matrix(shape=(UF, vec), dtype=io_scalar),
        matUB=wp.types.matrix(shape=(UB, vec), dtype=io_scalar),
        vecUFi=wp.types.vector(length=UF, dtype=int),
        vecUBi=wp.types.vector(length=UB, dtype=int),
        vecM=wp.types.vector(length=M, dtype=acc),
        vecN=wp.types.vector(length=N, dtype=acc),
        vecK=wp.types.vector(length=M + N, dtype=acc),
        vecD=wp.types.vector(length=D, dtype=acc),
        zero=acc(0.0), one=acc(1.0), threshold=acc(large_x_threshold(num_order, den_order)),
        module=module,
    )


def _kernel_decorator(cfg: _Config, blocks_per_sm: "int | None" = None):
    """``wp.kernel`` into the combination's module. ``blocks_per_sm``: __launch_bounds__(BLOCK_DIM, blocks per
    SM), the register budget that lets the launched grid's blocks all be resident at once (a pass's grid is a
    whole number of such waves, see launch_shape)."""
    if blocks_per_sm is None:
        return functools.partial(wp.kernel, enable_backward=False, module=cfg.module)
    return functools.partial(wp.kernel, enable_backward=False, module=cfg.module,
                             launch_bounds=(BLOCK_DIM, blocks_per_sm))


# ---------------------------------------------------------------------- maths (@wp.func)
# _basic_funcs (signs and powers) -> _rational_func (any x, homogeneous form) and _plain_funcs (|x| <= T, the
# common case) -> _maths (per element, either form; what the kernels call).

@functools.lru_cache(maxsize=None)
def _basic_funcs(num_order: int, den_order: int, variant: str, io_name: str, vec: int,
                 coef_name: "str | None"):
    """sgn, powers, w_pow, negate_if_negative and ones_n: the small @wp.funcs the maths is written with."""
    combination = (num_order, den_order, variant, io_name, vec, coef_name)
    cfg = _config(*combination)
    acc, vecD, vecN, D, N, zero, one = cfg.acc, cfg.vecD, cfg.vecN, cfg.D, cfg.N, cfg.zero, cfg.one

    @wp.func
    def sgn(v: acc):
        """Derivative of |v|, with +1 at 0 (KAT's convention)."""
        if v < zero:
            return -one
        return one

    @wp.func
    def powers(v: acc):
        p = vecD()
        p[0] = one
        for k in range(1, D):
            p[k] = p[k - 1] * v
        return p

    @wp.func
    def w_pow(e: int, wpow: vecD, spow: vecD):
        """w^e for e of either sign (s = 1/w)."""
        if e >= 0:
            return wpow[e]
        return spow[-e]

    @wp.func
    def negate_if_negative(v: acc, sign_of: acc):
        """v * sgn(sign_of) with sgn(0) = +1 (one compare and one select; a -0 argument counts as +0)."""
        return wp.where(sign_of < zero, -v, v)

    @wp.func
    def ones_n():
        """The b signs handed to the homogeneous form: 1, so that it returns the raw gradient factors."""
        v = vecN()
        for j in range(N):
            v[j] = one
        return v

    return SimpleNamespace(sgn=sgn, powers=powers, w_pow=w_pow, negate_if_negative=negate_if_negative,
                           ones_n=ones_n)


@functools.lru_cache(maxsize=None)
def _rational_func(num_order: int, den_order: int, variant: str, io_name: str, vec: int,
                   coef_name: "str | None", scaled: bool, with_grad: bool):
    """The @wp.func of the rational at x = u / w; ``scaled=False`` is the plain form (w = 1, every w-power
    folded away).

    Returns (F, dF/dx, gradient factors dF/d[a_0..a_m, b_0..b_{n-1}]) or just F."""
    combination = (num_order, den_order, variant, io_name, vec, coef_name)
    cfg = _config(*combination)
    acc, vecM, vecN, vecK, vecD = cfg.acc, cfg.vecM, cfg.vecN, cfg.vecK, cfg.vecD
    M, N, is_a, zero, one = cfg.M, cfg.N, cfg.is_a, cfg.zero, cfg.one
    basics = _basic_funcs(*combination)
    sgn, powers, w_pow = basics.sgn, basics.powers, basics.w_pow

    def rational(u: acc, w: acc, s: acc, a: vecM, bcoef: vecN, bsign: vecN):
        upow = powers(u)
        aupow = powers(wp.abs(u))
        wpow = vecD()
        spow = vecD()
        if wp.static(scaled):
            wpow = powers(w)
            spow = powers(s)
        ph = zero
        dph = zero
        fi = zero  # i as a float
        for i in range(M):
            term = a[i]
            if wp.static(scaled):
                term = term * w_pow(num_order - i, wpow, spow)
            ph = ph + term * upow[i]
            if wp.static(with_grad):
                if i >= 1:
                    dph = dph + fi * term * upow[i - 1]
            fi = fi + one
        # denominator: qh = w^n Q, dqh = w^(n-1) dQ/dx
        qsum = zero
        dqsum = zero
        fj = zero
        for j in range(1, N + 1):
            fj = fj + one
            term = bcoef[j - 1]
            if wp.static(scaled):
                term = term * w_pow(den_order - j, wpow, spow)
            if wp.static(is_a):
                qsum = qsum + term * aupow[j]
                if wp.static(with_grad):
                    dqsum = dqsum + fj * term * aupow[j - 1]
            else:
                qsum = qsum + term * upow[j]
                if wp.static(with_grad):
                    dqsum = dqsum + fj * term * upow[j - 1]
        wn = one
        if wp.static(scaled):
            wn = wpow[den_order]
        q_sign = one
        if wp.static(is_a):
            qh = wn + qsum
            q_sign = sgn(u)
        else:
            q_sign = sgn(qsum)
            qh = wn + wp.abs(qsum)
        r = one / qh
        f_scale = one
        fw_scale = one
        if wp.static(scaled):
            f_scale = w_pow(den_order - num_order, wpow, spow)
            fw_scale = w_pow(den_order - num_order + 1, wpow, spow)
        f = f_scale * ph * r
        if wp.static(not with_grad):
            return f, zero, vecK()
        dfdx = fw_scale * r * (dph - ph * r * q_sign * dqsum)
        g = vecK()
        for i in range(M):
            gi = upow[i] * r
            if wp.static(scaled):
                gi = gi * w_pow(den_order - i, wpow, spow)
            g[i] = gi
        for j in range(1, N + 1):
            gj = -f * r
            if wp.static(is_a):
                gj = gj * bsign[j - 1] * aupow[j]
            else:
                gj = gj * q_sign * upow[j]
            if wp.static(scaled):
                gj = gj * w_pow(den_order - j, wpow, spow)
            g[M + j - 1] = gj
        return f, dfdx, g

    rational.__name__ = rational.__qualname__ = (
        f"rational_{'scaled' if scaled else 'plain'}_{'grad' if with_grad else 'value'}"
    )
    return wp.func(rational)


@functools.lru_cache(maxsize=None)
def _plain_funcs(num_order: int, den_order: int, variant: str, io_name: str, vec: int,
                 coef_name: "str | None"):
    """plain_value and plain_step: F and the gradient terms for |x| <= T, from the powers of x."""
    combination = (num_order, den_order, variant, io_name, vec, coef_name)
    cfg = _config(*combination)
    acc, vecM, vecN, vecK, M, N, D = cfg.acc, cfg.vecM, cfg.vecN, cfg.vecK, cfg.M, cfg.N, cfg.D
    is_a, zero, one = cfg.is_a, cfg.zero, cfg.one
    basics = _basic_funcs(*combination)
    powers, negate_if_negative = basics.powers, basics.negate_if_negative
    reciprocal = _fast_reciprocal if acc == wp.float32 else _exact_reciprocal

    @wp.func
    def plain_value(x: acc, a: vecM, bq: vecN):
        """F(x) for |x| <= T (bq = |b| for A, b for B), both polynomials by Horner's rule (one FMA a
        coefficient: the forward needs no powers)."""
        p = a[M - 1]
        for i in range(1, M):
            p = p * x + a[M - 1 - i]
        u = x
        if wp.static(is_a):
            u = wp.abs(x)
        s = bq[N - 1]
        for j in range(1, N):
            s = s * u + bq[N - 1 - j]
        q = one
        if wp.static(is_a):
            q = s * u + one  # the last Horner step adds Q's constant term: one FMA
        else:
            q = one + wp.abs(s * u)
        return p * reciprocal(q)

    @wp.func
    def plain_step(x: acc, dy: acc, a: vecM, ia: vecM, bq: vecN, jb: vecN, run: vecK):
        """(dy dF/dx, run + dy dF/d[a, b]) for |x| <= T, the sign of b_j left out for A (the caller applies
        it to the block's sums). ia[i] = i a_i and jb[j-1] = j bq[j-1] are per-block constants. Every sum
        starts from its first term (not from zero: an add of 0.0 is not an identity the compiler may drop)."""
        xp = powers(x)
        p = a[0]
        dp = zero
        if wp.static(M > 1):
            dp = ia[1]
        for i in range(1, M):
            p = p + a[i] * xp[i]
            if i >= 2:
                dp = dp + ia[i] * xp[i - 1]
        # the denominator's powers: |x|^j for A (even powers are their own absolute value), x^j for B
        qp = xp
        if wp.static(is_a):
            for j in range(1, D):
                if j % 2 == 1:
                    qp[j] = wp.abs(xp[j])
        s = bq[0] * qp[1]
        ds = jb[0]
        for j in range(2, N + 1):
            s = s + bq[j - 1] * qp[j]
            ds = ds + jb[j - 1] * qp[j - 1]
        q = one
        signed_ds = zero  # dQ/dx
        if wp.static(is_a):
            q = one + s
            signed_ds = negate_if_negative(ds, x)
        else:
            q = one + wp.abs(s)
            signed_ds = negate_if_negative(ds, s)
        r = reciprocal(q)
        f = p * r
        t = dy * r
        u = -t * f
        if wp.static(not is_a):
            u = negate_if_negative(u, s)
        out = vecK()
        out[0] = run[0] + t
        for i in range(1, M):
            out[i] = run[i] + t * xp[i]
        for j in range(1, N + 1):
            out[M + j - 1] = run[M + j - 1] + u * qp[j]
        return t * (dp - f * signed_ds), out

    return SimpleNamespace(plain_value=plain_value, plain_step=plain_step)


@functools.lru_cache(maxsize=None)
def _maths(num_order: int, den_order: int, variant: str, io_name: str, vec: int,
           coef_name: "str | None"):
    """The per-element maths the kernels call: any_large, then plain_value / plain_step, or element_value /
    element_step (the homogeneous form for the elements above T)."""
    combination = (num_order, den_order, variant, io_name, vec, coef_name)
    cfg = _config(*combination)
    acc, accV, vecM, vecN, vecK, V, threshold, one = (
        cfg.acc, cfg.accV, cfg.vecM, cfg.vecN, cfg.vecK, cfg.V, cfg.threshold, cfg.one)
    basics = _basic_funcs(*combination)
    sgn, ones_n = basics.sgn, basics.ones_n
    plain = _plain_funcs(*combination)
    plain_value, plain_step = plain.plain_value, plain.plain_step
    rational_scaled_value = _rational_func(*combination, True, False)
    rational_scaled_grad = _rational_func(*combination, True, True)

    @wp.func
    def any_large(xv: accV):
        """Whether an element of the vector needs the homogeneous form (false for NaN: max drops NaN)."""
        largest = wp.abs(xv[0])
        for k in range(1, V):
            largest = wp.max(largest, wp.abs(xv[k]))
        return largest > threshold

    @wp.func
    def element_value(x: acc, a: vecM, bq: vecN):
        """F(x) for any x: the homogeneous form above T."""
        ax = wp.abs(x)
        if ax > threshold:
            f, d, g = rational_scaled_value(sgn(x), one / ax, ax, a, bq, ones_n())
            return f
        return plain_value(x, a, bq)

    @wp.func
    def element_step(x: acc, dy: acc, a: vecM, ia: vecM, bq: vecN, jb: vecN, run: vecK):
        """plain_step for any x: the homogeneous form above T."""
        ax = wp.abs(x)
        if ax > threshold:
            f, d, g = rational_scaled_grad(sgn(x), one / ax, ax, a, bq, ones_n())
            return dy * d, run + dy * g
        return plain_step(x, dy, a, ia, bq, jb, run)

    return SimpleNamespace(any_large=any_large, plain_value=plain_value, plain_step=plain_step,
                           element_value=element_value, element_step=element_step)


# ---------------------------------------------------------------------- block decoding

@functools.lru_cache(maxsize=None)
def _block_funcs(num_order: int, den_order: int, variant: str, io_name: str, vec: int,
                 coef_name: "str | None"):
    """block_coefficients, logical_block, block_extent and next_item: what a block works on, and its lanes'
    walk over it."""
    cfg = _config(num_order, den_order, variant, io_name, vec, coef_name)
    acc, coef, vecM, vecN, M, N, is_a, zero, one = (
        cfg.acc, cfg.coef, cfg.vecM, cfg.vecN, cfg.M, cfg.N, cfg.is_a, cfg.zero, cfg.one)

    @wp.func
    def block_coefficients(blk: int, blocks_per_group: int, a: wp.array2d(dtype=coef), b: wp.array2d(dtype=coef)):
        """(group, a, i a_i, bq = |b| (A) or b (B), j bq_j) of a block."""
        g = blk // blocks_per_group
        ga = int(0)
        if a.shape[0] > 1:
            ga = g
        av = vecM()
        ia = vecM()
        fi = zero
        for i in range(M):
            av[i] = acc(a[ga, i])
            ia[i] = fi * av[i]
            fi = fi + one
        bq = vecN()
        jb = vecN()
        fj = one
        for j in range(N):
            bj = acc(b[g, j])
            if wp.static(is_a):
                bq[j] = wp.abs(bj)
            else:
                bq[j] = bj
            jb[j] = fj * bq[j]
            fj = fj + one
        return g, av, ia, bq, jb

    @wp.func
    def logical_block(hw_block: int, num_groups: int, blocks_per_group: int):
        """The group-major index (group, then tile and chunk) of a hardware block. Consecutive hardware blocks
        take the same rows of consecutive groups: launched and running together, they read neighbouring
        strips of the same rows (DRAM page locality) rather than 8 distant places."""
        g = hw_block % num_groups
        return g * blocks_per_group + hw_block // num_groups

    @wp.func
    def block_extent(
        blk: int, g: int, blocks_per_group: int, vectors_per_group: int, tile_width: int, chunks: int,
        rows_per_chunk: int, n_rows: int,
    ):
        """(first vector column, tile width, first row, end row) of a block."""
        rest = blk - g * blocks_per_group
        tile = rest // chunks
        chunk = rest - tile * chunks
        col0 = tile * tile_width
        width = wp.min(tile_width, vectors_per_group - col0)
        row0 = chunk * rows_per_chunk
        row1 = wp.min(row0 + rows_per_chunk, n_rows)
        return g * vectors_per_group + col0, width, row0, row1

    @wp.func
    def next_item(row: int, col: int, row_step: int, col_step: int, width: int):
        """The lane's next (row, column) in the block's row-major walk (stride: the block size)."""
        next_row = row + row_step
        next_col = col + col_step
        if next_col >= width:
            next_col -= width
            next_row += 1
        return next_row, next_col

    return SimpleNamespace(block_coefficients=block_coefficients, logical_block=logical_block,
                           block_extent=block_extent, next_item=next_item)


# ---------------------------------------------------------------------- kernels

@functools.lru_cache(maxsize=None)
def _forward_kernel(num_order: int, den_order: int, variant: str, io_name: str, vec: int,
                    coef_name: "str | None", out_name: "str | None" = None):
    """y = F(x), tiled (see the module docstring); y of the scalar type ``out_name`` (x's when None)."""
    combination = (num_order, den_order, variant, io_name, vec, coef_name)
    cfg = _config(*combination, out_name)
    io_vec, out_vec, coef, accV, matUF, vecUFi = cfg.io_vec, cfg.out_vec, cfg.coef, cfg.accV, cfg.matUF, cfg.vecUFi
    V, UF = cfg.V, cfg.UF
    load_vec, widen, store_out = cfg.load_vec, cfg.widen, cfg.store_out
    maths = _maths(*combination)
    any_large, element_value, plain_value = maths.any_large, maths.element_value, maths.plain_value
    blocks = _block_funcs(*combination)
    block_coefficients, logical_block = blocks.block_coefficients, blocks.logical_block
    block_extent, next_item = blocks.block_extent, blocks.next_item

    @_kernel_decorator(cfg, cfg.BF)
    def forward(
        x: wp.array2d(dtype=io_vec),
        a: wp.array2d(dtype=coef),
        b: wp.array2d(dtype=coef),
        vectors_per_group: int,
        tile_width: int,
        chunks: int,
        rows_per_chunk: int,
        blocks_per_group: int,
        y: wp.array2d(dtype=out_vec),
    ):
        hw_block, lane = wp.tid()
        lanes = wp.block_dim()
        blk = logical_block(hw_block, b.shape[0], blocks_per_group)
        g, av, ia, bq, jb = block_coefficients(blk, blocks_per_group, a, b)
        col0, width, row0, row1 = block_extent(
            blk, g, blocks_per_group, vectors_per_group, tile_width, chunks, rows_per_chunk, x.shape[0])
        # items of the block in row-major order; this lane takes lane, lane + lanes, ...
        row_step = lanes // width
        col_step = lanes - row_step * width
        row = row0 + lane // width
        col = lane - (lane // width) * width
        # UF items per step, all their loads issued before any arithmetic: UF 16-byte loads in flight per lane
        # (a while loop is not unrolled, so this is what keeps enough bytes in flight to cover HBM latency)
        while row < row1:
            rows_u = vecUFi()
            cols_u = vecUFi()
            xs = matUF()
            for u in range(UF):
                rows_u[u] = row
                cols_u[u] = col
                # unconditional (a step's items past row1 re-read the last row): a conditional load of 16-bit
                # lanes was merged into its zeroed vector half by half (PRMT), and could be sunk to its use
                xs[u] = load_vec(x, wp.min(row, row1 - 1), col0 + col)
                row, col = next_item(row, col, row_step, col_step, width)
            for u in range(UF):
                if rows_u[u] < row1:
                    xv = widen(xs[u])
                    yv = accV()
                    if any_large(xv):
                        for k in range(V):
                            yv[k] = element_value(xv[k], av, bq)
                    else:
                        for k in range(V):
                            yv[k] = plain_value(xv[k], av, bq)
                    store_out(y, rows_u[u], col0 + cols_u[u], yv)

    return forward


@functools.lru_cache(maxsize=None)
def _backward_kernel(num_order: int, den_order: int, variant: str, io_name: str, vec: int,
                     coef_name: "str | None", out_name: "str | None" = None):
    """dx and one fp64 partial row of coefficient gradients per block (see the module docstring); dy of the
    scalar type ``out_name`` (y's), dx of x's."""
    combination = (num_order, den_order, variant, io_name, vec, coef_name)
    cfg = _config(*combination, out_name)
    io_vec, out_vec, coef, acc, accV, matUB, matUB_out, vecUBi, vecK = (
        cfg.io_vec, cfg.out_vec, cfg.coef, cfg.acc, cfg.accV, cfg.matUB, cfg.matUB_out, cfg.vecUBi, cfg.vecK)
    V, UB, M, K, RUN, is_a = cfg.V, cfg.UB, cfg.M, cfg.K, cfg.RUN, cfg.is_a
    load_vec, widen, store_vec = cfg.load_vec, cfg.widen, cfg.store_vec
    load_out, widen_out = cfg.load_out, cfg.widen_out
    totals = lane_totals(vecK, BLOCK_DIM)
    sgn = _basic_funcs(*combination).sgn
    maths = _maths(*combination)
    any_large, element_step, plain_step = maths.any_large, maths.element_step, maths.plain_step
    blocks = _block_funcs(*combination)
    block_coefficients, logical_block = blocks.block_coefficients, blocks.logical_block
    block_extent, next_item = blocks.block_extent, blocks.next_item

    @_kernel_decorator(cfg, cfg.BB)
    def backward(
        dy: wp.array2d(dtype=out_vec),
        x: wp.array2d(dtype=io_vec),
        a: wp.array2d(dtype=coef),
        b: wp.array2d(dtype=coef),
        vectors_per_group: int,
        tile_width: int,
        chunks: int,
        rows_per_chunk: int,
        blocks_per_group: int,
        need_dx: int,
        accumulate_dx: int,
        need_params: int,
        dx: wp.array2d(dtype=io_vec),
        partials: wp.array2d(dtype=wp.float64),
    ):
        hw_block, lane = wp.tid()
        lanes = wp.block_dim()
        blk = logical_block(hw_block, b.shape[0], blocks_per_group)
        g, av, ia, bq, jb = block_coefficients(blk, blocks_per_group, a, b)
        col0, width, row0, row1 = block_extent(
            blk, g, blocks_per_group, vectors_per_group, tile_width, chunks, rows_per_chunk, x.shape[0])
        row_step = lanes // width
        col_step = lanes - row_step * width
        row = row0 + lane // width
        col = lane - (lane // width) * width
        run = vecK()  # short run in the arithmetic type, folded into the fp64 lane totals every RUN steps
        totals(0, run, lane, 0)
        pending = int(0)
        # UB items per step, their loads first (see the forward)
        while row < row1:
            rows_u = vecUBi()
            cols_u = vecUBi()
            xs = matUB()
            gs = matUB_out()
            for u in range(UB):
                rows_u[u] = row
                cols_u[u] = col
                xs[u] = load_vec(x, wp.min(row, row1 - 1), col0 + col)  # unconditional (see the forward)
                gs[u] = load_out(dy, wp.min(row, row1 - 1), col0 + col)
                row, col = next_item(row, col, row_step, col_step, width)
            for u in range(UB):
                if rows_u[u] < row1:
                    xv = widen(xs[u])
                    gv = widen_out(gs[u])
                    dxv = accV()
                    if any_large(xv):
                        for k in range(V):
                            d, run = element_step(xv[k], gv[k], av, ia, bq, jb, run)
                            dxv[k] = d
                    else:
                        for k in range(V):
                            d, run = plain_step(xv[k], gv[k], av, ia, bq, jb, run)
                            dxv[k] = d
                    if need_dx:
                        if accumulate_dx:
                            dxv = dxv + widen(load_vec(dx, rows_u[u], col0 + cols_u[u]))
                        store_vec(dx, rows_u[u], col0 + cols_u[u], dxv)
            pending += 1
            if pending == RUN:
                totals(1, run, lane, 0)
                run = vecK()
                pending = 0
        totals(1, run, lane, 0)
        if need_params:
            # block reduction in fp64 (a tree in shared memory; every lane takes part), then one partial row
            for k in range(K):
                block_total = wp.tile_sum(wp.tile(totals(2, run, lane, k)))
                if lane == 0:
                    value = block_total[0]
                    if wp.static(is_a):
                        if k >= M:  # the sign of b_j, left out of the element sums
                            value = value * wp.float64(sgn(acc(b[g, k - M])))
                    partials[blk, k] = value

    return backward


@functools.lru_cache(maxsize=None)
def _combine_kernel(num_order: int, den_order: int, variant: str, io_name: str, vec: int,
                    coef_name: "str | None", out_name: "str | None" = None):
    """da and db from the backward's block partials, summed in a fixed order (in the module of the
    combination's other kernels)."""
    cfg = _config(num_order, den_order, variant, io_name, vec, coef_name, out_name)
    acc, coef, M, N = cfg.acc, cfg.coef, cfg.M, cfg.N

    @_kernel_decorator(cfg)
    def combine(
        partials: wp.array2d(dtype=wp.float64),
        blocks_per_group: int,
        accumulate: int,
        da: wp.array2d(dtype=coef),
        db: wp.array2d(dtype=coef),
    ):
        # one block per coefficient: its lanes sum strided block partials, then a tree; fixed order. The sum
        # is added to da/db (accumulate, Warp's adjoint convention) or overwrites them (the torch op: no
        # zeroing launch)
        out, lane = wp.tid()
        lanes = wp.block_dim()
        n_num = da.shape[0] * M
        first = int(0)
        count = blocks_per_group
        k = int(0)
        row = int(0)
        if out < n_num:
            row = out // M
            k = out - row * M
            if da.shape[0] == 1:
                count = partials.shape[0]
            else:
                first = row * blocks_per_group
        else:
            rest = out - n_num
            row = rest // N
            k = M + rest - row * N
            first = row * blocks_per_group
        acc_sum = wp.float64(0.0)
        for i in range(lane, count, lanes):
            acc_sum = acc_sum + partials[first + i, k]
        total = wp.tile_sum(wp.tile(acc_sum))
        if lane == 0:
            value = total[0]
            if out < n_num:
                if accumulate:
                    value = value + wp.float64(acc(da[row, k]))
                da[row, k] = coef(acc(value))
            else:
                if accumulate:
                    value = value + wp.float64(acc(db[row, k - M]))
                db[row, k - M] = coef(acc(value))

    return combine


@functools.lru_cache(maxsize=None)
def get_kernels(num_order: int, den_order: int, variant: str, io_name: str, vec: int,
                coef_name: "str | None" = None, out_name: "str | None" = None) -> RationalKernels:
    """Build (lazily) the kernels of one combination; all of them live in one Warp module. ``coef_name``: the
    scalar type of the coefficient arrays and their gradients (default: the arithmetic type). The kernels
    widen the coefficients as they load them and narrow the gradients as they store them, so a bf16 module
    (weights in bf16) needs no cast launches around the kernels: each costs more host time than a small
    layer's whole kernel. ``out_name``: the scalar type of y and dy, where it is not x's (one of x's arithmetic
    type: a bf16 y for an fp32 x, that a following bf16 layer reads without a cast launch)."""
    if out_name == io_name:
        out_name = None  # one combination, one module
    combination = (num_order, den_order, variant, io_name, vec, coef_name, out_name)
    cfg = _config(*combination)
    return RationalKernels(
        num_order=num_order,
        den_order=den_order,
        variant=variant,
        io_name=io_name,
        vec=vec,
        io_vector=cfg.io_vec,
        out_vector=cfg.out_vec,
        acc=cfg.acc,
        coef=cfg.coef,
        grad_vector=cfg.vecK,
        forward=_forward_kernel(*combination),
        backward=_backward_kernel(*combination),
        combine=_combine_kernel(*combination),
        module=cfg.module,
    )


def rational_modules(num_order: int, den_order: int, variant: str, io_name: str, group_size: "int | None" = None,
                     coef_name: "str | None" = None, out_name: "str | None" = None) -> tuple:
    """The modules (:class:`ModuleBuild`, at ``BLOCK_DIM``) the forward and backward launch for groups of
    ``group_size`` channels whose arrays are aligned (a less aligned array narrows the vector width, as
    :func:`launch_forward` does); every vector width of ``io_name`` when ``group_size`` is None. ``out_name``:
    y's scalar type where it is not x's (see :func:`get_kernels`)."""
    max_vec = IO_TYPES[io_name][2]
    widths = ([1 << p for p in range(max_vec.bit_length())] if group_size is None else
              [vector_width(io_name, group_size, max_bytes) for max_bytes in (FORWARD_VECTOR_BYTES,
                                                                               BACKWARD_VECTOR_BYTES)])
    return distinct(ModuleBuild(get_kernels(num_order, den_order, variant, io_name, vec, coef_name, out_name).module,
                                BLOCK_DIM) for vec in widths)


def clear_kernel_caches() -> None:
    """Forget every built combination, so that the next get_kernels builds its kernels anew (after a change of
    the launch-shape tables, as scripts/rational_tune.py makes)."""
    for factory in (get_kernels, _config, _basic_funcs, _rational_func, _plain_funcs, _maths, _block_funcs,
                    _forward_kernel, _backward_kernel, _combine_kernel):
        factory.cache_clear()


# ---------------------------------------------------------------------- launchers

def io_name_of(dtype) -> str:
    name = IO_SCALAR_NAMES.get(dtype)
    if name is None:
        raise TypeError(f"x must be float32, float64, float16 or bfloat16, got {wp.types.type_repr(dtype)}")
    return name


def check_coefficients(num_channels: int, num_groups: int, a, b) -> tuple[int, int]:
    """(m, n) from the coefficient arrays; raises ValueError/TypeError naming the argument. The arrays share
    one floating scalar type (any of IO_TYPES: the kernels widen them to the arithmetic type)."""
    num_groups = check_groups(num_groups, num_channels, "the number of channels")
    if a.ndim != 2 or a.shape[0] not in (1, num_groups) or a.shape[1] < 1:
        raise ValueError(f"weight_numerator must have shape (1 or {num_groups}, m + 1), got {tuple(a.shape)}")
    if b.ndim != 2 or b.shape[0] != num_groups or b.shape[1] < 1:
        raise ValueError(f"weight_denominator must have shape ({num_groups}, n), got {tuple(b.shape)}")
    if a.dtype not in IO_SCALAR_NAMES:
        raise TypeError("weight_numerator must be float16, bfloat16, float32 or float64, got "
                        f"{wp.types.type_repr(a.dtype)}")
    if b.dtype != a.dtype:
        raise TypeError(f"weight_denominator must have the scalar type of weight_numerator "
                        f"({wp.types.type_repr(a.dtype)}), got {wp.types.type_repr(b.dtype)}")
    return a.shape[1] - 1, b.shape[1]


def target_blocks(device, pass_name: str, vec: int) -> int:
    """Blocks a pass is cut into on ``device``: WAVES whole waves of BLOCKS_PER_SM per SM on a GPU."""
    device = wp.get_device(device)
    if device.is_cuda:
        return device.sm_count * launch_shape(BLOCKS_PER_SM, pass_name, vec) * launch_shape(WAVES, pass_name, vec)
    return _TARGET_BLOCKS


def _prepare(x, num_groups, a, b, variant, vec, arrays=(), max_bytes=16, pass_name="forward", out=None):
    """(kernels, layout). ``arrays``: the other [N, C] arrays of the launch; the vector
    width (one memory access per vector) is narrowed until every base address is a multiple of it. ``out``:
    y (or dy), whose scalar type picks the kernels' output type."""
    n_rows, n_channels = x.shape
    io_name = io_name_of(x.dtype)
    m, n = check_coefficients(n_channels, num_groups, a, b)
    group_size = n_channels // num_groups
    itemsize = wp.types.type_size_in_bytes(x.dtype)
    pointers = [arr.ptr for arr in (x, *arrays) if arr is not None and arr.ptr]
    if vec is None:
        vec = dense_vector_width(itemsize, group_size, pointers, max_bytes)
    if group_size % vec:
        raise ValueError(f"vector width {vec} must divide the group size {group_size}")
    if any(ptr % (vec * itemsize) for ptr in pointers):
        raise ValueError(f"vector width {vec} needs arrays aligned to {vec * itemsize} bytes")
    out_name = io_name_of(out.dtype) if out is not None else None
    kernels = get_kernels(m, n, variant, io_name, vec, IO_SCALAR_NAMES[a.dtype], out_name)
    lay = layout(n_rows, group_size // vec, num_groups, target_blocks(x.device, pass_name, vec))
    return kernels, lay


def launch_forward(
    x: "wp.array2d",
    a: "wp.array2d",
    b: "wp.array2d",
    y: "wp.array2d",
    num_groups: int,
    variant: str = "A",
    vec: "int | None" = None,
    stream: "wp.Stream | None" = None,
    record: bool = False,
):
    """y = F(x) for x, y [N, C] contiguous (fp32/fp64/fp16/bf16); a [1 or G, m+1], b [G, n] of one floating
    type (any: the kernels widen them to the arithmetic type, fp32, or fp64 for fp64 x). Overwrites y, which
    may have another scalar type of x's arithmetic type (an fp32 x, a bf16 y: what a bf16 layer after it
    reads). ``record=True``: nothing runs; the launches come back as a list of ``wp.Launch`` (what the torch
    bridge replays)."""
    if tuple(y.shape) != tuple(x.shape):
        raise ValueError(f"y must have the shape of x {tuple(x.shape)}, got {tuple(y.shape)}")
    kernels, lay = _prepare(x, num_groups, a, b, variant, vec, (y,), FORWARD_VECTOR_BYTES, out=y)
    if x.shape[0] == 0 or x.shape[1] == 0:
        return [] if record else None
    xv = dense_vector_view(x, kernels.io_vector, _ARRAYS)
    yv = dense_vector_view(y, kernels.out_vector, _ARRAYS)
    return launch(
        kernels.forward,
        [lay.num_blocks],
        [xv, a, b, lay.vectors_per_group, lay.tile_width, lay.chunks, lay.rows_per_chunk, lay.blocks_per_group],
        [yv],
        device=x.device, stream=stream, record=record, block_dim=BLOCK_DIM, tiled=True,
    )


def launch_backward(
    dy: "wp.array2d",
    x: "wp.array2d",
    a: "wp.array2d",
    b: "wp.array2d",
    num_groups: int,
    variant: str = "A",
    dx: "wp.array2d | None" = None,
    da: "wp.array2d | None" = None,
    db: "wp.array2d | None" = None,
    accumulate_dx: bool = True,
    accumulate_params: bool = True,
    deterministic: bool = False,
    vec: "int | None" = None,
    stream: "wp.Stream | None" = None,
    workspace=None,
    partials: "wp.array | None" = None,
    record: bool = False,
):
    """Gradients of ``launch_forward`` (dy of y's scalar type, dx of x's). ``da`` and ``db`` (the scalar type
    and shapes of a and b) are accumulated (+=) when ``accumulate_params`` and ``dx`` when ``accumulate_dx``
    (Warp's adjoint convention); otherwise they are overwritten (the torch op: no zeroing launch, no read of
    dx). ``da`` and ``db`` go together.
    ``deterministic`` is accepted for symmetry with the other families: the coefficient gradients are always
    reduced in a fixed order (fp64 block partials and a combine pass), so they are always bitwise
    reproducible, at the cost of one small extra launch. ``workspace``: an object with
    ``get(name, shape, dtype) -> wp.array`` for the fp64 partials (a ``_runtime.Workspace``; the torch
    bridge's allocates from torch's caching allocator, which stays legal under CUDA-graph capture);
    ``_runtime.workspace_for(device, stream)`` otherwise. ``partials``: the fp64 buffer itself (at least
    :func:`backward_partials_size` values, read through a ``_runtime.FlatWorkspace``), instead.
    ``record=True``: nothing runs; the launches come back as a list of ``wp.Launch``."""
    if tuple(dy.shape) != tuple(x.shape):
        raise ValueError(f"dy must have the shape of x {tuple(x.shape)}, got {tuple(dy.shape)}")
    kernels, lay = _prepare(x, num_groups, a, b, variant, vec, (dy, dx), BACKWARD_VECTOR_BYTES, "backward", out=dy)
    if (da is None) != (db is None):
        raise ValueError("da and db must be given together")
    need_params = da is not None
    if need_params and (tuple(da.shape) != tuple(a.shape) or tuple(db.shape) != tuple(b.shape)):
        raise ValueError(f"da, db must have the shapes of a, b: {tuple(a.shape)}, {tuple(b.shape)}")
    if need_params and (da.dtype != a.dtype or db.dtype != a.dtype):
        raise TypeError(f"da, db must have the scalar type of a and b ({wp.types.type_repr(a.dtype)})")
    if dx is not None and (tuple(dx.shape) != tuple(x.shape) or dx.dtype != x.dtype):
        raise ValueError(f"dx must have the shape and dtype of x {tuple(x.shape)}, got {tuple(dx.shape)}")
    if x.shape[0] == 0 or x.shape[1] == 0 or (dx is None and not need_params):
        return [] if record else None
    xv = dense_vector_view(x, kernels.io_vector, _ARRAYS)
    dyv = dense_vector_view(dy, kernels.out_vector, _ARRAYS)
    dxv = dense_vector_view(dx, kernels.io_vector, _ARRAYS) if dx is not None else xv  # unused when not needed
    k = kernels.grad_vector._length_
    rows, cols = (lay.num_blocks, k) if need_params else (1, 1)  # (1, 1): unused
    if partials is not None:
        workspace = FlatWorkspace(partials)
    elif workspace is None:
        workspace = workspace_for(x.device, stream)
    partials = workspace.get("rational_partials", (rows, cols), wp.float64)
    options = {"device": x.device, "stream": stream, "record": record, "block_dim": BLOCK_DIM, "tiled": True}
    cmds = launch(
        kernels.backward,
        [lay.num_blocks],
        [
            dyv, xv, a, b,
            lay.vectors_per_group, lay.tile_width, lay.chunks, lay.rows_per_chunk, lay.blocks_per_group,
            int(dx is not None), int(accumulate_dx), int(need_params),
        ],
        [dxv, partials],
        **options,
    )
    if need_params:
        # not the shared plain combine (_runtime.combine_chunks_kernel): one block per coefficient sums
        # its strided block partials with a tree, and writes da and db in their own scalar type
        combined = launch(kernels.combine, [a.shape[0] * a.shape[1] + b.shape[0] * b.shape[1]],
                          [partials, lay.blocks_per_group, int(accumulate_params)], [da, db], **options)
        if record:
            cmds += combined
    return cmds


def backward_partials_size(n_rows: int, n_channels: int, num_groups: int, num_order: int, den_order: int,
                           io_name: str, device) -> int:
    """fp64 values of the backward's partial buffer for 16-byte aligned arrays of this shape (what
    :func:`launch_backward` picks for them; the torch bridge allocates it from torch's allocator)."""
    group_size = n_channels // num_groups
    vec = vector_width(io_name, group_size, BACKWARD_VECTOR_BYTES)
    lay = layout(n_rows, group_size // vec, num_groups, target_blocks(device, "backward", vec))
    return lay.num_blocks * (num_order + 1 + den_order)


def bytes_moved(n_elements: int, io_bytes: int, backward: bool) -> int:
    """HBM bytes of the ideal pass: forward reads x, writes y; backward reads x and dy, writes dx."""
    return n_elements * io_bytes * (3 if backward else 2)



# ---------------------------------------------------------------------- fitted inits (no torch)

_INITS_PATH = os.path.join(os.path.dirname(__file__), "..", "data", "rational_inits.json")


@functools.lru_cache(maxsize=1)
def _init_table() -> dict:
    import json

    with open(_INITS_PATH) as fh:
        return json.load(fh)["inits"]


def init_names() -> tuple:
    return ("identity", "swish", "gelu")


def init_coefficients(init: str, order: tuple, variant: str) -> "tuple[list[float], list[float]]":
    """(numerator [m+1], denominator [n]) of a fitted init ("identity", "swish", "gelu"), fitted to the exact
    activation under ``variant`` (see scripts/fit_rational_inits.py)."""
    if init not in init_names():
        raise ValueError(f"init must be one of {init_names()}, got {init!r}")
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    m, n = (int(v) for v in order)
    table = _init_table()
    key = f"{variant}_{m}_{n}"
    if init == "identity":
        if m < 1:
            raise ValueError(f"init='identity' (F(x) = x) needs a numerator of degree m >= 1, got order {(m, n)}")
        return [0.0, 1.0] + [0.0] * (m - 1), [0.0] * n
    if key not in table:
        fitted = sorted({k.split("_", 1)[1].replace("_", ", ") for k in table})
        raise ValueError(f"no fitted {init!r} init for order {(m, n)}; fitted orders: {', '.join('(' + f + ')' for f in fitted)}")
    entry = table[key][init]
    return list(entry["numerator"]), list(entry["denominator"])


def second_moment(numerator, denominator, variant: str, points: int = 80) -> float:
    """E[F(x)^2] for x ~ N(0, 1) (Gauss-Hermite quadrature): the gain of the variance-preserving init."""
    import numpy as np

    t, w = np.polynomial.hermite_e.hermegauss(points)
    a = np.asarray(numerator, dtype=np.float64)
    b = np.asarray(denominator, dtype=np.float64)
    p = np.polyval(a[::-1], t)
    powers = np.stack([t ** (j + 1) for j in range(len(b))])
    if variant == "A":
        q = 1.0 + (np.abs(b)[:, None] * np.abs(powers)).sum(0)
    else:
        q = 1.0 + np.abs((b[:, None] * powers).sum(0))
    return float((w * (p / q) ** 2).sum() / w.sum())
