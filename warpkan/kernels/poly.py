"""Polynomial KAN (PolyKAN) kernels in pure Warp (no torch import).

Maths. ``y[n, o] = sum_i sum_{d=0..D} W[i, d, o] P_d(tanh x[n, i]) (+ bias[o])``.

Layout (the innermost index is the one consecutive threads walk, so it is the coalesced one):

- ``x``      [N, in]
- ``coeffs`` [in, D + 1, out]   ChebyKAN's ``cheby_coeffs`` [in, out, D + 1] permuted (0, 2, 1): every kernel
  that reads or writes the coefficients has consecutive threads on consecutive outputs ``o``
- ``bias``   [out]
- ``lut``, ``lut_grad`` [lut_size, D + 1]: ``P_d`` and ``P_d'`` on a uniform grid of [-1, 1]; one row holds every
  degree of one grid point, so a thread walking ``d`` reads consecutive addresses
- ``y``      [N, out]

Bases. A basis is a small ``@wp.func`` recurrence: ``start`` gives the state at ``d = 0``, ``advance`` steps it
from ``d`` to ``d + 1``, and ``value`` / ``grad`` read ``P_d`` and ``dP_d/dt`` out of it. Three-term bases
(``P_{d+1} = (A_d t + B_d) P_d - C_d P_{d-1}``) only define ``(A_d, B_d, C_d)``; see :data:`BASES`. Adding a
basis means adding one entry there: the kernels are generic in it.

- ``chebyshev``: first kind, ``T_d``.
- ``legendre``: ``P_d``.
- ``hermite``: physicists' ``H_d`` (numpy's ``hermval``); on ``t = tanh x`` in [-1, 1].
- ``gegenbauer``: ``C_d^(alpha)``, ``alpha > -1/2``, ``alpha != 0``.
- ``jacobi``: ``P_d^(alpha, beta)``, ``alpha, beta > -1``.
- ``fourier``: ``P_0 = 1``, ``P_{2k-1} = cos(k pi t)``, ``P_{2k} = sin(k pi t)``: degree D gives D + 1 functions
  like every other basis (D = 8 is the constant plus cos/sin of k = 1..4).

Modes. ``exact`` runs the recurrence in registers. ``lut`` reads ``P_d`` and ``P_d'`` from tables built once per
(basis, degree, lut_size, alpha, beta, dtype, device) in float64 from the same recurrence, with linear
interpolation. Interpolation error bound (h = 2 / (lut_size - 1), the table spacing; linear interpolation of a
C^2 function errs by at most ``h^2 / 8 max|f''|`` on a cell):

    |P_d^lut(t) - P_d(t)|   <= h^2 / 8 * max_[-1,1] |P_d''|   (+ rounding of the table to the I/O dtype)
    |P_d'^lut(t) - P_d'(t)| <= h^2 / 8 * max_[-1,1] |P_d'''|

For Chebyshev, Markov's inequality gives ``max|T_d''| = T_d''(1) = d^2 (d^2 - 1) / 3``; at D = 8 and
lut_size = 4096 that is 4.0e-5. :func:`lut_error_bound` returns the bound per degree for every basis (the
maxima of ``|P_d''|`` and ``|P_d'''|`` are taken on a grid 64 times finer than the table, end points included).
The backward pass of LUT mode interpolates the derivative table: it approximates ``P_d'`` to O(h^2), and is not
the derivative of the piecewise-linear forward (which would be O(h) off ``P_d'``).

Kernels (all accumulate in the scalar type; float64 variants exist for gradcheck):

- forward: one thread per (input chunk, block of ``_ROWS`` rows, tile of ``_OUTS`` outputs). The basis of
  (n, i) is computed once per thread and reused across the tile of outputs; each coefficient load is reused
  across the block of rows. The sum over inputs is split into chunks when the (rows x outputs) grid alone has
  too few threads: each chunk writes a partial sum and a combine pass adds the chunks in a fixed order (no
  atomics).
- backward, x: one thread per (output chunk, input, tile of ``_DEG_TILE`` degrees, block of ``_ROWS`` rows):
  ``(1 - t^2) sum_d P_d'(t) sum_o dy[n, o] W[i, d, o]`` with a ``_ROWS x _DEG_TILE`` register accumulator, so
  each ``dy`` load serves the tile's degrees and each coefficient load the block's rows; the (output chunk,
  degree tile) partial sums are combined the same way.
- backward, coefficients: one thread per (row chunk, input, tile of degrees, tile of outputs) with a
  ``_DEG_TILE x _OUTS`` register accumulator; the threads of (input 0, degree tile 0) also sum the bias
  gradient from the ``dy`` values they load anyway. (A bias-only gradient has its own small kernel.)
- one ``combine_segments`` launch adds the chunks of every split sum of the backward (dx, coefficients,
  bias) in a fixed order: the backward is at most three launches, the forward at most two.

Chunk counts depend on the shapes alone, so every result is bitwise reproducible run to run.

A second strategy serves large batches (the torch bridge picks it by shape): :func:`launch_expand_basis`
writes the dense basis ``B`` [N, in (D + 1)] and cuBLAS does the three contractions (``y = B W``,
``dW = B^T dy``, ``dB = dy W^T``); :func:`launch_dx_from_dbasis` folds ``dB`` back into ``dx``. The kernel
layout [in, D + 1, out] is already the GEMM's [in (D + 1), out] matrix.

Bad input: NaN in ``x[n, i]`` makes row n of y NaN (and, as under autograd, the coefficient gradient of input i);
``+-Inf`` is ``t = +-1``.
"""

import functools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import warp as wp

from .. import _checks
from ._common import SCALARS, on_stream, scalar_name

__all__ = [
    "BASES",
    "MAX_DEGREE",
    "MODES",
    "check_layer_args",
    "PolyVariant",
    "get_variant",
    "basis_names",
    "check_basis",
    "build_lut",
    "lut_error_bound",
    "launch_forward",
    "launch_backward",
    "launch_expand_basis",
    "launch_dx_from_dbasis",
    "evaluate_basis",
    "clear_caches",
    "on_clear_caches",
    "FlatWorkspace",
    "forward_scratch_size",
    "backward_scratch_size",
]

MAX_DEGREE = 64
MODES = ("exact", "lut")  # a layer's basis evaluation: the recurrence in registers, or the lookup tables
_ROWS = 4  # rows per forward / backward-x thread: each coefficient load is reused across them
_OUTS = 4  # outputs per forward / backward-coefficient thread: each basis value is reused across them
_DEG_TILE = 8  # degrees per backward thread (accumulators _DEG_TILE x _OUTS and _ROWS x _DEG_TILE)
_TARGET_THREADS = 1 << 17  # parallelism the chunked reductions aim at
_MIN_INPUTS_PER_CHUNK = 8
_MIN_OUTPUTS_PER_CHUNK = 32
_MIN_ROWS_PER_CHUNK = 32
# The register-tiled kernels use 124-168 registers a thread on sm_90 (no spills): smaller blocks let more
# of them share an SM than Warp's default of 256.
_TILED_BLOCK_DIM = 128



# ---------------------------------------------------------------------------------------------- bases
@dataclass(frozen=True)
class Basis:
    """A polynomial (or trigonometric) basis: ``make(scalar)`` returns its Warp functions
    ``(start, advance, value, grad)`` for one scalar type (see the module docstring)."""

    name: str
    make: Callable
    uses_alpha: bool = False
    uses_beta: bool = False


def _three_term(name: str, make_coeffs: Callable, uses_alpha=False, uses_beta=False) -> Basis:
    """A basis with ``P_0 = 1`` and ``P_{d+1} = (A_d t + B_d) P_d - C_d P_{d-1}``; ``make_coeffs(scalar)``
    returns a ``@wp.func (d, alpha, beta) -> (A_d, B_d, C_d)``."""

    def make(scalar):
        vec4 = wp.types.vector(length=4, dtype=scalar)
        coeffs = make_coeffs(scalar)
        zero = scalar(0.0)
        one = scalar(1.0)

        # state = (P_{d-1}, P_d, P'_{d-1}, P'_d)
        @wp.func
        def start(t: scalar, alpha: scalar, beta: scalar):
            return vec4(zero, one, zero, zero)

        @wp.func
        def advance(d: int, t: scalar, s: vec4, alpha: scalar, beta: scalar):
            a, b, c = coeffs(d, alpha, beta)
            m = a * t + b
            # derivative of the recurrence: P'_{d+1} = m P'_d + A_d P_d - C_d P'_{d-1}
            return vec4(s[1], m * s[1] - c * s[0], s[3], m * s[3] + a * s[1] - c * s[2])

        @wp.func
        def value(d: int, s: vec4):
            return s[1]

        @wp.func
        def grad(d: int, s: vec4):
            return s[3]

        return start, advance, value, grad

    return Basis(name, make, uses_alpha, uses_beta)


def _chebyshev(scalar):
    @wp.func
    def coeffs(d: int, alpha: scalar, beta: scalar):
        a = scalar(2.0)
        if d == 0:
            a = scalar(1.0)
        return a, scalar(0.0), scalar(1.0)

    return coeffs


def _legendre(scalar):
    @wp.func
    def coeffs(d: int, alpha: scalar, beta: scalar):
        n = scalar(d)
        return (scalar(2.0) * n + scalar(1.0)) / (n + scalar(1.0)), scalar(0.0), n / (n + scalar(1.0))

    return coeffs


def _hermite(scalar):
    @wp.func
    def coeffs(d: int, alpha: scalar, beta: scalar):
        return scalar(2.0), scalar(0.0), scalar(2.0) * scalar(d)

    return coeffs


def _gegenbauer(scalar):
    @wp.func
    def coeffs(d: int, alpha: scalar, beta: scalar):
        n = scalar(d)
        return (
            scalar(2.0) * (n + alpha) / (n + scalar(1.0)),
            scalar(0.0),
            (n + scalar(2.0) * alpha - scalar(1.0)) / (n + scalar(1.0)),
        )

    return coeffs


def _jacobi(scalar):
    @wp.func
    def coeffs(d: int, alpha: scalar, beta: scalar):
        one = scalar(1.0)
        two = scalar(2.0)
        if d == 0:  # P_1 = (alpha + beta + 2) / 2 t + (alpha - beta) / 2
            return (alpha + beta + two) / two, (alpha - beta) / two, scalar(0.0)
        n = scalar(d)
        s = two * n + alpha + beta
        denom = two * (n + one) * (n + alpha + beta + one) * s
        return (
            (s + one) * (s + two) * s / denom,
            (s + one) * (alpha * alpha - beta * beta) / denom,
            two * (n + alpha) * (n + beta) * (s + two) / denom,
        )

    return coeffs


def _fourier(scalar):
    vec4 = wp.types.vector(length=4, dtype=scalar)
    pi = scalar(math.pi)

    # state = (cos k pi t, sin k pi t, cos pi t, sin pi t) with k = (d + 1) // 2
    @wp.func
    def start(t: scalar, alpha: scalar, beta: scalar):
        return vec4(scalar(1.0), scalar(0.0), wp.cos(pi * t), wp.sin(pi * t))

    @wp.func
    def advance(d: int, t: scalar, s: vec4, alpha: scalar, beta: scalar):
        if d % 2 == 1:  # P_d = cos k pi t, P_{d+1} = sin k pi t: same k
            return s
        # rotate by pi t: k -> k + 1
        return vec4(s[0] * s[2] - s[1] * s[3], s[1] * s[2] + s[0] * s[3], s[2], s[3])

    @wp.func
    def value(d: int, s: vec4):
        if d > 0 and d % 2 == 0:
            return s[1]
        return s[0]

    @wp.func
    def grad(d: int, s: vec4):
        k = scalar((d + 1) // 2) * pi
        if d > 0 and d % 2 == 0:
            return k * s[0]
        return -k * s[1]

    return start, advance, value, grad


BASES: dict[str, Basis] = {
    "chebyshev": _three_term("chebyshev", _chebyshev),
    "legendre": _three_term("legendre", _legendre),
    "hermite": _three_term("hermite", _hermite),
    "gegenbauer": _three_term("gegenbauer", _gegenbauer, uses_alpha=True),
    "jacobi": _three_term("jacobi", _jacobi, uses_alpha=True, uses_beta=True),
    "fourier": Basis("fourier", _fourier),
}


def basis_names() -> list[str]:
    return list(BASES)


def check_basis(basis: str, degree: int, alpha: float = 1.0, beta: float = 1.0) -> tuple[int, float, float]:
    """``(degree, alpha, beta)`` normalised; raises ValueError/TypeError naming the argument when (basis,
    degree, alpha, beta) is not usable."""
    if not isinstance(basis, str) or basis not in BASES:
        raise ValueError(f"basis must be one of {basis_names()}, got {basis!r}")
    degree = _checks.int_in_range("degree", degree, 0, MAX_DEGREE)
    alpha, beta = _checks.number("alpha", alpha), _checks.number("beta", beta)
    if basis == "gegenbauer" and not (alpha > -0.5 and alpha != 0.0):
        raise ValueError(f"alpha must be > -1/2 and != 0 for the gegenbauer basis, got {alpha}")
    if basis == "jacobi" and not (alpha > -1.0 and beta > -1.0):
        raise ValueError(f"alpha and beta must be > -1 for the jacobi basis, got alpha={alpha}, beta={beta}")
    return degree, alpha, beta


def check_layer_args(in_features, out_features, degree, basis, mode, lut_size, alpha, beta) -> tuple:
    """The arguments of a polynomial KAN layer (the torch and the Warp-native one), checked and normalised:
    ``(in_features, out_features, degree, mode, lut_size, alpha, beta)``. Raises TypeError/ValueError naming
    the argument (rules: :mod:`warpkan._checks`), before anything is allocated."""
    in_features = _checks.positive_int("in_features", in_features)
    out_features = _checks.positive_int("out_features", out_features)
    degree, alpha, beta = check_basis(basis, degree, alpha, beta)
    mode = _checks.one_of("mode", mode, MODES)
    lut_size = _checks.int_in_range("lut_size", lut_size, 2)
    _checks.fits_index("coeffs", (in_features, degree + 1, out_features), in_features=in_features,
                       out_features=out_features, degree=degree)
    _checks.fits_index("the basis tables", (lut_size, degree + 1), lut_size=lut_size, degree=degree)
    return in_features, out_features, degree, mode, lut_size, alpha, beta


# ---------------------------------------------------------------------------------------------- kernels
@dataclass(frozen=True)
class PolyVariant:
    """The compiled kernels of one (basis, scalar type); both modes and every degree share them."""

    basis: str
    scalar: type
    forward: wp.Kernel
    backward_x: wp.Kernel
    backward_coeffs: wp.Kernel
    backward_bias: wp.Kernel
    combine: wp.Kernel
    combine_segments: wp.Kernel
    expand_basis: wp.Kernel
    expand_basis_bf16: "wp.Kernel | None"
    dx_from_dbasis: wp.Kernel
    tabulate: wp.Kernel
    module: str


@functools.lru_cache(maxsize=None)
def get_variant(basis: str, scalar_name: str = "float32") -> PolyVariant:
    """Build (lazily) the kernels of one basis and scalar type; they all live in one Warp module."""
    if basis not in BASES:
        raise ValueError(f"basis must be one of {basis_names()}, got {basis!r}")
    if scalar_name not in SCALARS:
        raise TypeError(f"scalar type must be one of {sorted(SCALARS)}, got {scalar_name}")
    scalar = SCALARS[scalar_name]
    start, advance, value, grad = BASES[basis].make(scalar)
    R, O, DT = _ROWS, _OUTS, _DEG_TILE
    vecR = wp.types.vector(length=R, dtype=scalar)
    vecO = wp.types.vector(length=O, dtype=scalar)
    vecDT = wp.types.vector(length=DT, dtype=scalar)
    ivecR = wp.types.vector(length=R, dtype=wp.int32)
    ivecO = wp.types.vector(length=O, dtype=wp.int32)
    ivecDT = wp.types.vector(length=DT, dtype=wp.int32)
    matR4 = wp.types.matrix(shape=(R, 4), dtype=scalar)
    matRO = wp.types.matrix(shape=(R, O), dtype=scalar)
    matDTO = wp.types.matrix(shape=(DT, O), dtype=scalar)
    matRDT = wp.types.matrix(shape=(R, DT), dtype=scalar)
    module = f"warpkan_poly_{basis}_{scalar_name}"
    kernel = functools.partial(wp.kernel, enable_backward=False, module=module)
    zero = scalar(0.0)
    one = scalar(1.0)

    # ------------------------------------------------------------------ shared pieces (@wp.func)
    @wp.func
    def lut_cell(lut: wp.array2d(dtype=scalar), t: scalar):
        """(cell, fraction) of t in [-1, 1] on the table's uniform grid. NaN gives cell 0 and a NaN
        fraction, so the interpolated value is NaN and no index leaves the table."""
        last_cell = lut.shape[0] - 2
        s = (t + one) * scalar(0.5) * scalar(last_cell + 1)
        cell = int(0)
        if s >= zero:
            cell = wp.min(int(s), last_cell)
        return cell, s - scalar(cell)

    @wp.func
    def lerp(lut: wp.array2d(dtype=scalar), cell: int, frac: scalar, d: int):
        lo = lut[cell, d]
        return lo + frac * (lut[cell + 1, d] - lo)

    @wp.func
    def clamped_rows(n0: int, n_rows: int):
        rows = ivecR()
        for r in range(R):
            rows[r] = wp.min(n0 + r, n_rows - 1)  # past-the-end rows recompute the last one, never written
        return rows

    @wp.func
    def clamped_outs(o0: int, n_out: int):
        outs = ivecO()
        for t in range(O):
            outs[t] = wp.min(o0 + t, n_out - 1)
        return outs

    # ------------------------------------------------------------------ forward
    @kernel
    def forward(
        x: wp.array2d(dtype=scalar),
        coeffs: wp.array3d(dtype=scalar),
        lut: wp.array2d(dtype=scalar),
        use_lut: int,
        alpha: scalar,
        beta: scalar,
        inputs_per_chunk: int,
        bias: wp.array(dtype=scalar),
        has_bias: int,
        out: wp.array3d(dtype=scalar),
    ):
        # out[chunk, n, o] = sum over the chunk's inputs (+ bias when the chunk is the whole sum)
        tid = wp.tid()
        n_rows = x.shape[0]
        n_in = x.shape[1]
        n_basis = coeffs.shape[1]
        n_out = coeffs.shape[2]
        n_out_tiles = (n_out + O - 1) // O
        n_row_blocks = (n_rows + R - 1) // R
        o0 = (tid % n_out_tiles) * O  # consecutive threads: consecutive output tiles (coalesced coeffs)
        rest = tid // n_out_tiles
        n0 = (rest % n_row_blocks) * R
        chunk = rest // n_row_blocks
        rows = clamped_rows(n0, n_rows)
        outs = clamped_outs(o0, n_out)
        i_start = chunk * inputs_per_chunk
        i_stop = wp.min(i_start + inputs_per_chunk, n_in)
        acc = matRO()
        for i in range(i_start, i_stop):
            t = vecR()
            state = matR4()
            cells = ivecR()
            fracs = vecR()
            for r in range(R):
                t[r] = wp.tanh(x[rows[r], i])
                if use_lut:
                    cell, frac = lut_cell(lut, t[r])
                    cells[r] = cell
                    fracs[r] = frac
                else:
                    state[r] = start(t[r], alpha, beta)
            for d in range(n_basis):
                w = vecO()
                for k in range(O):
                    w[k] = coeffs[i, d, outs[k]]
                for r in range(R):
                    p = zero
                    if use_lut:
                        p = lerp(lut, cells[r], fracs[r], d)
                    else:
                        p = value(d, state[r])
                        state[r] = advance(d, t[r], state[r], alpha, beta)
                    for k in range(O):
                        acc[r, k] = acc[r, k] + p * w[k]
        for r in range(R):
            n = n0 + r
            if n < n_rows:
                for k in range(O):
                    o = o0 + k
                    if o < n_out:
                        v = acc[r, k]
                        if has_bias:
                            v = v + bias[o]
                        out[chunk, n, o] = v

    # ------------------------------------------------------------------ fixed-order combine of chunks
    @kernel
    def combine(
        partial: wp.array3d(dtype=scalar),
        bias: wp.array(dtype=scalar),
        has_bias: int,
        accumulate: int,
        out: wp.array2d(dtype=scalar),
    ):
        a, b = wp.tid()
        acc = zero
        for c in range(partial.shape[0]):  # fixed order: deterministic
            acc = acc + partial[c, a, b]
        if has_bias:
            acc = acc + bias[b]
        if accumulate:
            acc = acc + out[a, b]
        out[a, b] = acc

    @wp.func
    def combine_column(partial: wp.array2d(dtype=scalar), out: wp.array(dtype=scalar), j: int, accumulate: int):
        acc = zero
        for c in range(partial.shape[0]):  # fixed order: deterministic
            acc = acc + partial[c, j]
        if accumulate:
            acc = acc + out[j]
        out[j] = acc

    @kernel
    def combine_segments(
        partial_a: wp.array2d(dtype=scalar),
        partial_b: wp.array2d(dtype=scalar),
        partial_c: wp.array2d(dtype=scalar),
        size_a: int,
        size_b: int,
        accumulate: int,
        out_a: wp.array(dtype=scalar),
        out_b: wp.array(dtype=scalar),
        out_c: wp.array(dtype=scalar),
    ):
        # the backward's (up to) three chunked sums [chunks, M] -> [M], each in a fixed order, in one launch
        j = wp.tid()
        if j < size_a:
            combine_column(partial_a, out_a, j, accumulate)
        elif j < size_a + size_b:
            combine_column(partial_b, out_b, j - size_a, accumulate)
        else:
            combine_column(partial_c, out_c, j - size_a - size_b, accumulate)

    # ------------------------------------------------------------------ backward: x
    @kernel
    def backward_x(
        dy: wp.array2d(dtype=scalar),
        x: wp.array2d(dtype=scalar),
        coeffs: wp.array3d(dtype=scalar),
        lut_grad: wp.array2d(dtype=scalar),
        use_lut: int,
        alpha: scalar,
        beta: scalar,
        degrees_per_tile: int,
        outputs_per_chunk: int,
        accumulate: int,
        out: wp.array3d(dtype=scalar),
    ):
        # out[chunk, n, i] (+)= (1 - t^2) sum_{d in tile} P_d'(t) sum_{o in chunk} dy[n, o] W[i, d, o],
        # t = tanh x[n, i], chunk = (output chunk, degree tile). Each dy load serves the tile's degrees and
        # each coefficient load the block's rows.
        tid = wp.tid()
        n_rows = x.shape[0]
        n_in = x.shape[1]
        n_basis = coeffs.shape[1]
        n_out = coeffs.shape[2]
        n_row_blocks = (n_rows + R - 1) // R
        n_deg_tiles = (n_basis + degrees_per_tile - 1) // degrees_per_tile
        n0 = (tid % n_row_blocks) * R  # threads of a warp share (i, d): coefficient loads are broadcasts
        rest = tid // n_row_blocks
        deg_tile = rest % n_deg_tiles
        rest = rest // n_deg_tiles
        i = rest % n_in
        o_chunk = rest // n_in
        chunk = o_chunk * n_deg_tiles + deg_tile
        d0 = deg_tile * degrees_per_tile
        d_count = wp.min(degrees_per_tile, n_basis - d0)
        o_start = o_chunk * outputs_per_chunk
        o_stop = wp.min(o_start + outputs_per_chunk, n_out)
        rows = clamped_rows(n0, n_rows)
        degs = ivecDT()
        for k in range(DT):
            degs[k] = wp.min(d0 + k, n_basis - 1)  # past-the-tile degrees reread the last one, weighted 0
        g = matRDT()
        for o in range(o_start, o_stop):
            g_dy = vecR()
            for r in range(R):
                g_dy[r] = dy[rows[r], o]
            for k in range(DT):
                w = coeffs[i, degs[k], o]
                for r in range(R):
                    g[r, k] = g[r, k] + g_dy[r] * w
        for r in range(R):
            tv = wp.tanh(x[rows[r], i])
            acc = zero
            if use_lut:
                cell, frac = lut_cell(lut_grad, tv)
                for k in range(DT):
                    if k < d_count:
                        acc = acc + g[r, k] * lerp(lut_grad, cell, frac, d0 + k)
            else:
                state = start(tv, alpha, beta)
                for d in range(d0):
                    state = advance(d, tv, state, alpha, beta)
                for k in range(DT):
                    if k < d_count:
                        acc = acc + g[r, k] * grad(d0 + k, state)
                        state = advance(d0 + k, tv, state, alpha, beta)
            n = n0 + r
            if n < n_rows:
                v = acc * (one - tv * tv)
                if accumulate:
                    v = v + out[chunk, n, i]
                out[chunk, n, i] = v

    # ------------------------------------------------------------------ backward: coefficients (and bias)
    @kernel
    def backward_coeffs(
        dy: wp.array2d(dtype=scalar),
        x: wp.array2d(dtype=scalar),
        lut: wp.array2d(dtype=scalar),
        use_lut: int,
        alpha: scalar,
        beta: scalar,
        degrees_per_tile: int,
        rows_per_chunk: int,
        accumulate: int,
        with_bias: int,
        out: wp.array3d(dtype=scalar),
        bias_out: wp.array2d(dtype=scalar),
    ):
        # out[chunk, i * n_basis + d, o] (+)= sum_{n in chunk} dy[n, o] P_d(tanh x[n, i]); with_bias: the
        # threads of (i, d tile) = (0, 0) also write bias_out[chunk, o] (+)= sum_{n in chunk} dy[n, o] from the
        # dy values they load anyway (one launch for both gradients)
        tid = wp.tid()
        n_rows = x.shape[0]
        n_in = x.shape[1]
        n_basis = out.shape[1] // n_in
        n_out = out.shape[2]
        n_out_tiles = (n_out + O - 1) // O
        n_deg_tiles = (n_basis + degrees_per_tile - 1) // degrees_per_tile
        o0 = (tid % n_out_tiles) * O  # consecutive threads: consecutive output tiles (coalesced dy, out)
        rest = tid // n_out_tiles
        d0 = (rest % n_deg_tiles) * degrees_per_tile
        rest = rest // n_deg_tiles
        i = rest % n_in
        chunk = rest // n_in
        d_count = wp.min(degrees_per_tile, n_basis - d0)
        outs = clamped_outs(o0, n_out)
        n_start = chunk * rows_per_chunk
        n_stop = wp.min(n_start + rows_per_chunk, n_rows)
        acc = matDTO()
        dy_sum = vecO()
        for n in range(n_start, n_stop):
            tv = wp.tanh(x[n, i])
            p = vecDT()
            if use_lut:
                cell, frac = lut_cell(lut, tv)
                for k in range(DT):
                    if k < d_count:
                        p[k] = lerp(lut, cell, frac, d0 + k)
            else:
                state = start(tv, alpha, beta)
                for d in range(d0):
                    state = advance(d, tv, state, alpha, beta)
                for k in range(DT):
                    if k < d_count:
                        p[k] = value(d0 + k, state)
                        state = advance(d0 + k, tv, state, alpha, beta)
            g = vecO()
            for q in range(O):
                g[q] = dy[n, outs[q]]
            dy_sum = dy_sum + g
            for k in range(DT):
                for q in range(O):
                    acc[k, q] = acc[k, q] + p[k] * g[q]
        for k in range(DT):
            if k < d_count:
                row = i * n_basis + d0 + k
                for q in range(O):
                    o = o0 + q
                    if o < n_out:
                        v = acc[k, q]
                        if accumulate:
                            v = v + out[chunk, row, o]
                        out[chunk, row, o] = v
        if with_bias and i == 0 and d0 == 0:
            for q in range(O):
                o = o0 + q
                if o < n_out:
                    v = dy_sum[q]
                    if accumulate:
                        v = v + bias_out[chunk, o]
                    bias_out[chunk, o] = v

    # ------------------------------------------------------------------ backward: bias
    @kernel
    def backward_bias(
        dy: wp.array2d(dtype=scalar),
        rows_per_chunk: int,
        accumulate: int,
        out: wp.array2d(dtype=scalar),
    ):
        chunk, o = wp.tid()
        n_start = chunk * rows_per_chunk
        n_stop = wp.min(n_start + rows_per_chunk, dy.shape[0])
        acc = zero
        for n in range(n_start, n_stop):
            acc = acc + dy[n, o]
        if accumulate:
            acc = acc + out[chunk, o]
        out[chunk, o] = acc

    # ------------------------------------------------------------------ dense basis (the GEMM strategy)
    @wp.func
    def dense_column(i: int, d: int, n_in: int, n_basis: int, degree_major: int):
        """Column of (input i, degree d) in a dense basis row: i * n_basis + d (input-major, the kernel layout's
        [in (D + 1), out] weight) or d * n_in + i (degree-major: a warp's stores of one degree coalesce)."""
        if degree_major:
            return d * n_in + i
        return i * n_basis + d

    # One thread per (n, i): one pass of the recurrence gives every degree. In the degree-major layout the
    # threads of a warp (consecutive i) store each degree to consecutive columns: coalesced. In the
    # input-major layout a warp's stores stride over 32 (D + 1) columns: measured ~7x under the write
    # bandwidth on the H200 (an element-per-thread variant, coalesced but rerunning the recurrence for every
    # degree, was slower still), so large batches use the degree-major layout (see the torch bridge).
    @kernel
    def expand_basis(
        x: wp.array2d(dtype=scalar),
        lut: wp.array2d(dtype=scalar),
        use_lut: int,
        alpha: scalar,
        beta: scalar,
        n_basis: int,
        degree_major: int,
        basis_out: wp.array2d(dtype=scalar),
    ):
        # basis_out[n, dense_column(i, d)] = P_d(tanh x[n, i])
        tid = wp.tid()
        n_in = x.shape[1]
        n = tid // n_in
        i = tid - n * n_in
        tv = wp.tanh(x[n, i])
        if use_lut:
            cell, frac = lut_cell(lut, tv)
            for d in range(n_basis):
                basis_out[n, dense_column(i, d, n_in, n_basis, degree_major)] = lerp(lut, cell, frac, d)
        else:
            state = start(tv, alpha, beta)
            for d in range(n_basis):
                basis_out[n, dense_column(i, d, n_in, n_basis, degree_major)] = value(d, state)
                state = advance(d, tv, state, alpha, beta)

    def expand_basis_bf16(
        x: wp.array2d(dtype=scalar),
        lut: wp.array2d(dtype=scalar),
        use_lut: int,
        alpha: scalar,
        beta: scalar,
        n_basis: int,
        degree_major: int,
        basis_out: wp.array2d(dtype=wp.bfloat16),
    ):
        # the same, rounded to bfloat16 (to nearest even) as it is stored: the bf16 GEMM's operand directly,
        # with no float32 copy to convert
        tid = wp.tid()
        n_in = x.shape[1]
        n = tid // n_in
        i = tid - n * n_in
        tv = wp.tanh(x[n, i])
        if use_lut:
            cell, frac = lut_cell(lut, tv)
            for d in range(n_basis):
                basis_out[n, dense_column(i, d, n_in, n_basis, degree_major)] = wp.bfloat16(lerp(lut, cell, frac, d))
        else:
            state = start(tv, alpha, beta)
            for d in range(n_basis):
                basis_out[n, dense_column(i, d, n_in, n_basis, degree_major)] = wp.bfloat16(value(d, state))
                state = advance(d, tv, state, alpha, beta)

    # float32 layers only opt in to bf16 GEMMs: the float64 variants (gradcheck) do not compile it
    expand_basis_bf16 = kernel(expand_basis_bf16) if scalar_name == "float32" else None

    @kernel
    def dx_from_dbasis(
        x: wp.array2d(dtype=scalar),
        d_basis: wp.array2d(dtype=scalar),
        lut_grad: wp.array2d(dtype=scalar),
        use_lut: int,
        alpha: scalar,
        beta: scalar,
        n_basis: int,
        degree_major: int,
        accumulate: int,
        dx: wp.array2d(dtype=scalar),
    ):
        # dx[n, i] (+)= (1 - t^2) sum_d d_basis[n, dense_column(i, d)] P_d'(t), t = tanh x[n, i]
        tid = wp.tid()
        n_in = x.shape[1]
        n = tid // n_in
        i = tid - n * n_in
        tv = wp.tanh(x[n, i])
        acc = zero
        if use_lut:
            cell, frac = lut_cell(lut_grad, tv)
            for d in range(n_basis):
                acc = acc + d_basis[n, dense_column(i, d, n_in, n_basis, degree_major)] * lerp(lut_grad, cell, frac, d)
        else:
            state = start(tv, alpha, beta)
            for d in range(n_basis):
                acc = acc + d_basis[n, dense_column(i, d, n_in, n_basis, degree_major)] * grad(d, state)
                state = advance(d, tv, state, alpha, beta)
        v = acc * (one - tv * tv)
        if accumulate:
            v = v + dx[n, i]
        dx[n, i] = v

    # ------------------------------------------------------------------ tables and plain evaluation
    @kernel
    def tabulate(
        t: wp.array(dtype=scalar),
        alpha: scalar,
        beta: scalar,
        values: wp.array2d(dtype=scalar),
        grads: wp.array2d(dtype=scalar),
    ):
        # values[j, d] = P_d(t[j]), grads[j, d] = P_d'(t[j]) by the exact recurrence
        j = wp.tid()
        tv = t[j]
        state = start(tv, alpha, beta)
        for d in range(values.shape[1]):
            values[j, d] = value(d, state)
            grads[j, d] = grad(d, state)
            state = advance(d, tv, state, alpha, beta)

    return PolyVariant(
        basis=basis,
        scalar=scalar,
        forward=forward,
        backward_x=backward_x,
        backward_coeffs=backward_coeffs,
        backward_bias=backward_bias,
        combine=combine,
        combine_segments=combine_segments,
        expand_basis=expand_basis,
        expand_basis_bf16=expand_basis_bf16,
        dx_from_dbasis=dx_from_dbasis,
        tabulate=tabulate,
        module=module,
    )




# ---------------------------------------------------------------------------------------------- tables
_luts: dict[tuple, tuple] = {}


def evaluate_basis(t: np.ndarray, basis: str, degree: int, alpha: float = 1.0, beta: float = 1.0, device="cpu"):
    """(P_d(t), P_d'(t)) as float64 numpy arrays [len(t), degree + 1], by the kernels' own recurrence,
    run on ``device`` (so a machine without a CPU compiler can build tables on its GPU)."""
    check_basis(basis, degree, alpha, beta)
    variant = get_variant(basis, "float64")
    t_wp = wp.array(np.ascontiguousarray(t, dtype=np.float64).ravel(), dtype=wp.float64, device=device)
    values = wp.empty((t_wp.shape[0], degree + 1), dtype=wp.float64, device=device)
    grads = wp.empty_like(values)
    if t_wp.shape[0]:
        wp.launch(variant.tabulate, dim=t_wp.shape[0], inputs=[t_wp, alpha, beta], outputs=[values, grads],
                  device=device, record_tape=False)
    return values.numpy(), grads.numpy()


def build_lut(basis: str, degree: int, lut_size: int, alpha: float = 1.0, beta: float = 1.0,
              scalar_name: str = "float32", device="cpu") -> tuple:
    """The (values, grads) tables [lut_size, degree + 1] on ``device``, built once in float64 and cached.

    Building happens at the first call for a key (a host-to-device copy); call it before capturing a graph.
    """
    degree, alpha, beta = check_basis(basis, degree, alpha, beta)
    lut_size = _checks.int_in_range("lut_size", lut_size, 2)
    device = wp.get_device(device)
    key = (basis, int(degree), int(lut_size), float(alpha), float(beta), scalar_name, str(device))
    found = _luts.get(key)
    if found is None:
        grid = np.linspace(-1.0, 1.0, int(lut_size))
        values, grads = evaluate_basis(grid, basis, degree, alpha, beta, device)
        dtype = SCALARS[scalar_name]
        found = (wp.array(values, dtype=dtype, device=device), wp.array(grads, dtype=dtype, device=device))
        _luts[key] = found
    return found


def lut_error_bound(basis: str, degree: int, lut_size: int, alpha: float = 1.0, beta: float = 1.0,
                    scalar_name: str = "float64", device="cpu") -> tuple[np.ndarray, np.ndarray]:
    """Per-degree bounds (value_bound [D + 1], grad_bound [D + 1]) of ``|P_d^lut - P_d|`` and
    ``|P_d'^lut - P_d'|`` on [-1, 1]: ``h^2 / 8 max|P_d''|`` and ``h^2 / 8 max|P_d'''|`` with ``h = 2 / (lut_size - 1)``,
    plus the rounding of the tables and of the interpolation in ``scalar_name``.

    The maxima of ``|P_d''|`` and ``|P_d'''|`` come from differencing the exact ``P_d'`` on a grid 64 times finer
    than the table (end points included), evaluated on ``device`` (a machine without a CPU compiler uses its
    GPU)."""
    check_basis(basis, degree, alpha, beta)
    fine = np.linspace(-1.0, 1.0, 64 * (int(lut_size) - 1) + 1)
    values, grads = evaluate_basis(fine, basis, degree, alpha, beta, device)
    step = fine[1] - fine[0]
    second = np.gradient(grads, step, axis=0, edge_order=2)
    third = np.gradient(second, step, axis=0, edge_order=2)
    h = 2.0 / (int(lut_size) - 1)
    eps = float(np.finfo(np.float32 if scalar_name == "float32" else np.float64).eps)
    # the tables round to eps |P|; interpolation and the cell position add a few eps |P| (and eps |P'|
    # through the rounding of t)
    rounding_values = 4 * eps * (np.abs(values).max(axis=0) + np.abs(grads).max(axis=0))
    rounding_grads = 4 * eps * (np.abs(grads).max(axis=0) + np.abs(second).max(axis=0))
    value_bound = h * h / 8 * np.abs(second).max(axis=0) * (1 + 1e-3) + rounding_values
    grad_bound = h * h / 8 * np.abs(third).max(axis=0) * (1 + 1e-3) + rounding_grads
    return value_bound, grad_bound


def clear_caches() -> None:
    """Free the cached tables and the backward pass's scratch buffers, and forget every recorded launch that
    refers to them (the hooks of :func:`on_clear_caches`)."""
    _luts.clear()
    _workspaces.clear()
    for hook in _clear_hooks:
        hook()


_clear_hooks: list = []


def on_clear_caches(hook: Callable) -> None:
    """Call ``hook()`` from :func:`clear_caches` (a cache of recorded launches that hold the tables)."""
    _clear_hooks.append(hook)


# ---------------------------------------------------------------------------------------------- launchers
class _Workspace:
    """Scratch buffers of the chunked reductions, grown on demand and reused between calls on one stream."""

    def __init__(self, device):
        self.device = wp.get_device(device)
        self._buffers: dict[tuple, wp.array] = {}

    def get(self, name: str, shape, dtype) -> wp.array:
        size = int(np.prod(shape))
        buf = self._buffers.get((name, dtype))
        if buf is None or buf.size < size:
            buf = wp.empty(max(size, 1), dtype=dtype, device=self.device)
            self._buffers[(name, dtype)] = buf
        return buf[:size].reshape(tuple(shape))


class FlatWorkspace:
    """Scratch views carved one after the other out of one caller-owned flat array (for instance a torch
    tensor of :func:`forward_scratch_size` / :func:`backward_scratch_size` elements), so that recorded
    launches address memory whose lifetime the caller controls."""

    def __init__(self, buffer: "wp.array"):
        self.buffer = buffer
        self.offset = 0

    def get(self, name: str, shape, dtype) -> wp.array:
        size = int(np.prod(shape))
        if dtype != self.buffer.dtype or self.offset + size > self.buffer.size:
            raise ValueError(f"scratch buffer too small or of the wrong dtype for {name} {tuple(shape)}")
        view = self.buffer[self.offset: self.offset + size].reshape(tuple(shape))
        self.offset += size
        return view


_workspaces: dict[tuple, _Workspace] = {}


def _workspace(device, stream) -> _Workspace:
    # one per (device, stream): passes on different streams must not share scratch
    key = (str(wp.get_device(device)), stream.cuda_stream if stream is not None else 0)
    if key not in _workspaces:
        _workspaces[key] = _Workspace(key[0])
    return _workspaces[key]


def _chunks(total: int, threads_per_chunk: int, min_per_chunk: int) -> tuple[int, int]:
    """(n_chunks, items_per_chunk) splitting ``total`` items so that about _TARGET_THREADS threads run; a
    function of the shapes alone, so the summation order (and the result) is the same on every run."""
    n_chunks = max(1, min(-(-_TARGET_THREADS // max(threads_per_chunk, 1)), -(-total // min_per_chunk)))
    per_chunk = -(-total // n_chunks)
    return -(-total // per_chunk), per_chunk


def _degree_tiles(n_basis: int) -> tuple[int, int]:
    n_tiles = -(-n_basis // _DEG_TILE)
    per_tile = -(-n_basis // n_tiles)  # balanced tiles: 9 bases -> 5 + 4, not 8 + 1
    return -(-n_basis // per_tile), per_tile


@functools.lru_cache(maxsize=1024)
def _forward_plan(n_rows: int, n_in: int, n_out: int) -> tuple[int, int, int]:
    """(threads per chunk, n_chunks, inputs per chunk) of the forward."""
    threads = -(-n_rows // _ROWS) * -(-n_out // _OUTS)
    return (threads, *_chunks(n_in, threads, _MIN_INPUTS_PER_CHUNK))


@functools.lru_cache(maxsize=1024)
def _backward_plan(n_rows: int, n_in: int, n_basis: int, n_out: int) -> dict:
    """Chunking of the backward's three sums (dx, coefficients, bias alone): a function of the shapes."""
    row_blocks = -(-n_rows // _ROWS)
    n_deg_tiles, per_tile = _degree_tiles(n_basis)
    n_out_chunks, outs_per_chunk = _chunks(n_out, row_blocks * n_in * n_deg_tiles, _MIN_OUTPUTS_PER_CHUNK)
    coeff_threads = n_in * n_deg_tiles * -(-n_out // _OUTS)
    coeff_chunks, rows_per_chunk = _chunks(n_rows, coeff_threads, _MIN_ROWS_PER_CHUNK)
    bias_chunks, bias_rows_per_chunk = _chunks(n_rows, n_out, _MIN_ROWS_PER_CHUNK)
    return dict(row_blocks=row_blocks, per_tile=per_tile, x_chunks=n_out_chunks * n_deg_tiles,
                outs_per_chunk=outs_per_chunk, coeff_threads=coeff_threads, coeff_chunks=coeff_chunks,
                rows_per_chunk=rows_per_chunk, bias_chunks=bias_chunks, bias_rows_per_chunk=bias_rows_per_chunk)


def forward_scratch_size(n_rows: int, n_in: int, n_out: int) -> int:
    """Elements of scratch :func:`launch_forward` takes from its workspace for this shape (0: none)."""
    if n_rows == 0 or n_in == 0 or n_out == 0:
        return 0
    _, n_chunks, _ = _forward_plan(n_rows, n_in, n_out)
    return n_chunks * n_rows * n_out if n_chunks > 1 else 0


def backward_scratch_size(n_rows: int, n_in: int, n_basis: int, n_out: int, need_x: bool = True,
                          need_coeffs: bool = True, need_bias: bool = False) -> int:
    """Elements of scratch :func:`launch_backward` takes from its workspace for this shape (0: none)."""
    if n_rows == 0 or n_out == 0:
        return 0
    plan = _backward_plan(n_rows, n_in, n_basis, n_out)
    size = 0
    if need_x and n_in > 0 and plan["x_chunks"] > 1:
        size += plan["x_chunks"] * n_rows * n_in
    if need_coeffs and n_in > 0:
        if plan["coeff_chunks"] > 1:  # coefficient partials, and the bias partials computed with them
            size += plan["coeff_chunks"] * (n_in * n_basis * n_out + (n_out if need_bias else 0))
    if need_bias and (not need_coeffs or n_in == 0) and plan["bias_chunks"] > 1:
        size += plan["bias_chunks"] * n_out
    return size


def _check(x, coeffs, bias, lut_tables):
    if x.ndim != 2:
        raise ValueError(f"x must have 2 dimensions, got shape {tuple(x.shape)}")
    if coeffs.ndim != 3:
        raise ValueError(f"coeffs must have 3 dimensions [in, degree + 1, out], got shape {tuple(coeffs.shape)}")
    if coeffs.shape[0] != x.shape[1]:
        raise ValueError(f"coeffs must have shape ({x.shape[1]}, degree + 1, out), got {tuple(coeffs.shape)}")
    named = [("coeffs", coeffs)]
    if bias is not None:
        if tuple(bias.shape) != (coeffs.shape[2],):
            raise ValueError(f"bias must have shape ({coeffs.shape[2]},), got {tuple(bias.shape)}")
        named.append(("bias", bias))
    for name, arr in named:
        if arr.dtype != x.dtype:
            raise TypeError(f"{name} must have the dtype of x ({wp.types.type_repr(x.dtype)}), got {wp.types.type_repr(arr.dtype)}")
        if arr.device != x.device:
            raise ValueError(f"{name} must be on the device of x ({x.device}), got {arr.device}")
    if lut_tables is not None:
        values, grads = lut_tables
        if values.shape[1] != coeffs.shape[1] or grads.shape != values.shape:
            raise ValueError(f"lut tables must have shape (lut_size, {coeffs.shape[1]}), got {tuple(values.shape)}")
        if values.dtype != x.dtype or values.device != x.device:
            raise TypeError("lut tables must have the dtype and device of x")


def _dummy(variant: PolyVariant, device) -> wp.array:
    key = ("dummy", variant.scalar, str(device))
    found = _luts.get(key)
    if found is None:
        found = _luts[key] = wp.zeros((2, 1), dtype=variant.scalar, device=device)
    return found


def _run(kernel, dim, inputs, outputs, device, record, cmds, block_dim=256, stream=None):
    """wp.launch (on ``stream`` when given, else Warp's current one), or (record=True) a recorded
    ``wp.Launch`` appended to cmds and nothing run."""
    cmd = wp.launch(kernel, dim=dim, inputs=inputs, outputs=outputs, device=device, block_dim=block_dim,
                    stream=stream, record_tape=False, record_cmd=record)
    if record:
        cmds.append(cmd)


def launch_forward(
    x: "wp.array2d",
    coeffs: "wp.array3d",
    y: "wp.array2d",
    basis: str = "chebyshev",
    bias: "wp.array | None" = None,
    lut: "tuple | None" = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    stream: "wp.Stream | None" = None,
    workspace: "_Workspace | FlatWorkspace | None" = None,
    record: bool = False,
) -> "list | None":
    """y[n, o] = sum_i sum_d coeffs[i, d, o] P_d(tanh x[n, i]) (+ bias[o]). Overwrites y.

    ``lut``: the (values, grads) tables of :func:`build_lut` for LUT mode, None for exact mode.
    ``record=True``: run nothing and return the launches (1, or 2 when the sum over inputs is chunked) as
    ``wp.Launch`` objects to replay with ``launch(stream)``; every dimension of the shapes must be nonzero."""
    _check(x, coeffs, bias, lut)
    variant = get_variant(basis, scalar_name(x))
    device = x.device
    n_rows, n_in = x.shape
    n_out = coeffs.shape[2]
    if tuple(y.shape) != (n_rows, n_out):
        raise ValueError(f"y must have shape {(n_rows, n_out)}, got {tuple(y.shape)}")
    cmds: list = []
    if record and (n_rows == 0 or n_in == 0 or n_out == 0):
        raise ValueError(f"record=True needs nonzero shapes, got x {tuple(x.shape)} and {n_out} outputs")
    if n_rows == 0 or n_out == 0:
        return None
    dummy = _dummy(variant, device)
    bias_arr = bias if bias is not None else dummy.reshape((2,))
    with on_stream(stream):
        if n_in == 0:
            y.zero_()
            if bias is not None:
                _launch_combine(variant, wp.zeros((1, n_rows, n_out), dtype=variant.scalar, device=device),
                                bias, False, y, False, cmds)
            return None
        threads, n_chunks, per_chunk = _forward_plan(n_rows, n_in, n_out)
        if n_chunks == 1:
            target = y.reshape((1, n_rows, n_out))
        else:
            target = (workspace or _workspace(device, stream)).get("forward", (n_chunks, n_rows, n_out), variant.scalar)
        table = lut[0] if lut is not None else dummy
        _run(variant.forward, n_chunks * threads,
             [x, coeffs, table, int(lut is not None), variant.scalar(alpha), variant.scalar(beta), per_chunk,
              bias_arr, int(bias is not None and n_chunks == 1)],
             [target], device, record, cmds, _TILED_BLOCK_DIM)
        if n_chunks > 1:
            _launch_combine(variant, target, bias, False, y, record, cmds)
    return cmds if record else None


def _launch_combine(variant, partial, bias, accumulate, out, record, cmds):
    has_bias = bias is not None
    if not has_bias:
        bias = _dummy(variant, out.device).reshape((2,))
    _run(variant.combine, (out.shape[0], out.shape[1]), [partial, bias, int(has_bias), int(accumulate)], [out],
         out.device, record, cmds)


def launch_backward(
    dy: "wp.array2d",
    x: "wp.array2d",
    coeffs: "wp.array3d",
    basis: str = "chebyshev",
    lut: "tuple | None" = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    dx: "wp.array2d | None" = None,
    d_coeffs: "wp.array3d | None" = None,
    d_bias: "wp.array | None" = None,
    stream: "wp.Stream | None" = None,
    workspace: "_Workspace | FlatWorkspace | None" = None,
    accumulate: bool = True,
    record: bool = False,
) -> "list | None":
    """The gradients of :func:`launch_forward` into whichever of dx, d_coeffs, d_bias are given: added
    (``accumulate=True``, Warp's adjoint convention) or written (``accumulate=False``: the buffers need no
    zeroing; every dimension of the shapes must then be nonzero).

    At most three launches: the dx kernel, the coefficient kernel (which also sums the bias gradient), and one
    fixed-order combine of whichever of the sums were split into chunks (by shape): bitwise reproducible.
    ``record=True``: run nothing and return the launches as ``wp.Launch`` objects."""
    _check(x, coeffs, None, lut)
    variant = get_variant(basis, scalar_name(x))
    scalar = variant.scalar
    device = x.device
    n_rows, n_in = x.shape
    n_basis, n_out = coeffs.shape[1], coeffs.shape[2]
    if tuple(dy.shape) != (n_rows, n_out):
        raise ValueError(f"dy must have shape {(n_rows, n_out)}, got {tuple(dy.shape)}")
    for name, arr, shape in (("dx", dx, (n_rows, n_in)), ("d_coeffs", d_coeffs, tuple(coeffs.shape)),
                             ("d_bias", d_bias, (n_out,))):
        if arr is not None and tuple(arr.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(arr.shape)}")
    if (record or not accumulate) and (n_rows == 0 or n_in == 0 or n_out == 0):
        raise ValueError(f"record=True and accumulate=False need nonzero shapes, got x {tuple(x.shape)} and "
                         f"{n_out} outputs")
    cmds: list = []
    if n_rows == 0 or n_out == 0:
        return cmds if record else None
    ws = workspace or _workspace(device, stream)
    plan = _backward_plan(n_rows, n_in, n_basis, n_out)
    use_lut = int(lut is not None)
    dummy = _dummy(variant, device)
    dummy_partial = dummy.reshape((1, 2))
    dummy_out = dummy.reshape((2,))
    a, b = scalar(alpha), scalar(beta)
    # (partial [chunks, M], out [M]) pairs left for the one combine launch
    segments = []

    with on_stream(stream):
        if dx is not None and n_in > 0:
            n_chunks = plan["x_chunks"]
            if n_chunks == 1:
                target = dx.reshape((1, n_rows, n_in))
            else:
                target = ws.get("backward_x", (n_chunks, n_rows, n_in), scalar)
                segments.append((target.reshape((n_chunks, n_rows * n_in)), dx.reshape((n_rows * n_in,))))
            _run(variant.backward_x, n_chunks * n_in * plan["row_blocks"],
                 [dy, x, coeffs, lut[1] if lut is not None else dummy, use_lut, a, b, plan["per_tile"],
                  plan["outs_per_chunk"], int(accumulate and n_chunks == 1)],
                 [target], device, record, cmds, _TILED_BLOCK_DIM)

        if d_coeffs is not None and n_in > 0:
            n_chunks = plan["coeff_chunks"]
            with_bias = d_bias is not None
            if n_chunks == 1:
                target = d_coeffs.reshape((1, n_in * n_basis, n_out))
                bias_target = d_bias.reshape((1, n_out)) if with_bias else dummy_partial
            else:
                target = ws.get("backward_coeffs", (n_chunks, n_in * n_basis, n_out), scalar)
                segments.append((target.reshape((n_chunks, n_in * n_basis * n_out)),
                                 d_coeffs.reshape((n_in * n_basis * n_out,))))
                bias_target = dummy_partial
                if with_bias:
                    bias_target = ws.get("backward_bias", (n_chunks, n_out), scalar)
                    segments.append((bias_target, d_bias))
            _run(variant.backward_coeffs, n_chunks * plan["coeff_threads"],
                 [dy, x, lut[0] if lut is not None else dummy, use_lut, a, b, plan["per_tile"],
                  plan["rows_per_chunk"], int(accumulate and n_chunks == 1), int(with_bias)],
                 [target, bias_target], device, record, cmds, _TILED_BLOCK_DIM)
        elif d_bias is not None:
            n_chunks = plan["bias_chunks"]
            if n_chunks == 1:
                target = d_bias.reshape((1, n_out))
            else:
                target = ws.get("backward_bias", (n_chunks, n_out), scalar)
                segments.append((target, d_bias))
            _run(variant.backward_bias, (n_chunks, n_out),
                 [dy, plan["bias_rows_per_chunk"], int(accumulate and n_chunks == 1)], [target], device, record,
                 cmds)

        if segments:
            padded = segments + [(dummy_partial, dummy_out)] * (3 - len(segments))
            sizes = [out.shape[0] for _, out in segments] + [0] * (3 - len(segments))
            _run(variant.combine_segments, sum(sizes),
                 [padded[0][0], padded[1][0], padded[2][0], sizes[0], sizes[1], int(accumulate)],
                 [padded[0][1], padded[1][1], padded[2][1]], device, record, cmds)
    return cmds if record else None


def launch_expand_basis(
    x: "wp.array2d",
    basis_out: "wp.array2d",
    basis: str = "chebyshev",
    lut: "tuple | None" = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    stream: "wp.Stream | None" = None,
    degree_major: bool = False,
    record: bool = False,
) -> "list | None":
    """basis_out [N, in * (D + 1)] = P_d(tanh x[n, i]) at column i * (D + 1) + d: the dense basis of the GEMM
    strategy (``y = basis_out @ coeffs.reshape(in * (D + 1), out)``); ``degree_major=True``: at column
    d * in + i instead (``y = basis_out @ coeffs.transpose(0, 1).reshape(in * (D + 1), out)``), whose stores
    coalesce. Overwrites basis_out, which may be of x's dtype or (float32 x) bfloat16: the values are then
    rounded to nearest as they are stored.
    ``record=True``: run nothing and return the launch as a one-element list of ``wp.Launch``."""
    variant = get_variant(basis, scalar_name(x))
    n_rows, n_in = x.shape
    if basis_out.shape[0] != n_rows or (n_in and basis_out.shape[1] % n_in):
        raise ValueError(f"basis_out must have shape ({n_rows}, {n_in} * (degree + 1)), got {tuple(basis_out.shape)}")
    if basis_out.dtype == wp.bfloat16 and variant.expand_basis_bf16 is not None:
        kernel = variant.expand_basis_bf16
    elif basis_out.dtype == variant.scalar:
        kernel = variant.expand_basis
    else:
        raise TypeError(f"basis_out must have the dtype of x (or bfloat16 for float32 x), got "
                        f"{wp.types.type_repr(basis_out.dtype)}")
    cmds: list = []
    if n_rows == 0 or n_in == 0:
        return cmds if record else None
    n_basis = basis_out.shape[1] // n_in
    table = lut[0] if lut is not None else _dummy(variant, x.device)
    _run(kernel, n_rows * n_in,
         [x, table, int(lut is not None), variant.scalar(alpha), variant.scalar(beta), n_basis, int(degree_major)],
         [basis_out], x.device, record, cmds, stream=stream)
    return cmds if record else None


def launch_dx_from_dbasis(
    x: "wp.array2d",
    d_basis: "wp.array2d",
    dx: "wp.array2d",
    basis: str = "chebyshev",
    lut: "tuple | None" = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    stream: "wp.Stream | None" = None,
    accumulate: bool = True,
    degree_major: bool = False,
    record: bool = False,
) -> "list | None":
    """dx[n, i] (+)= (1 - t^2) sum_d d_basis[n, i * (D + 1) + d] P_d'(t): the input gradient of the GEMM
    strategy from ``d_basis = dy @ coeffs.reshape(in * (D + 1), out).T`` (``degree_major=True``: d_basis
    in the degree-major column order of :func:`launch_expand_basis`); added (``accumulate=True``) or
    written (the buffer then needs no zeroing). ``record=True``: return the launch, run nothing."""
    variant = get_variant(basis, scalar_name(x))
    n_rows, n_in = x.shape
    if d_basis.shape[0] != n_rows or (n_in and d_basis.shape[1] % n_in):
        raise ValueError(f"d_basis must have shape ({n_rows}, {n_in} * (degree + 1)), got {tuple(d_basis.shape)}")
    cmds: list = []
    if n_rows == 0 or n_in == 0:
        return cmds if record else None
    n_basis = d_basis.shape[1] // n_in
    table = lut[1] if lut is not None else _dummy(variant, x.device)
    _run(variant.dx_from_dbasis, n_rows * n_in,
         [x, d_basis, table, int(lut is not None), variant.scalar(alpha), variant.scalar(beta), n_basis,
          int(degree_major), int(accumulate)],
         [dx], x.device, record, cmds, stream=stream)
    return cmds if record else None
