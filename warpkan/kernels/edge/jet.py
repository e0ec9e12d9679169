"""The engine's Taylor-mode kernels: the dense basis of an input jet, for a physics-informed loss's derivatives
in one forward pass.

An input jet of a layer is a stack ``z`` [C, N, in] of C = 1 + D + P components: the values z_0, their first
derivatives along D directions z_d (d = 1..D) and their second derivatives along P pairs of directions z_p
(pair p = (a, b): d2 z / dx_a dx_b). For one edge phi (silu base path, or the spline of any edge family),

    y_0 = phi(z_0),   y_d = phi'(z_0) z_d,   y_p = phi''(z_0) z_a z_b + phi'(z_0) z_p,

and the layer's output jet is ``Y = A_jet^T W`` [C N, out] with the combined weight W [width, out] of the gemm
strategy and ``A_jet`` [width, C N] the dense basis of the components side by side (column c N + n): for
component c the bases' derivatives of order 0, 1 or 2 at z_0, times the seed above. One expansion kernel and
one GEMM give every derivative of a layer.

The backward pass of ``Y`` with upstream ``H`` [C N, out]: ``dW = A_jet H`` (a GEMM) and, with ``G = W H^T``
[width, C N] (a GEMM), per entry (n, i), S_m(c) being column c of G contracted with the order-m bases at z_0
(silu rows included):

    dz_0 = S_1(0) + sum_d S_2(d) z_d + sum_p (S_3(p) z_a z_b + S_2(p) z_p),
    dz_d = S_1(d) + sum over the pairs p = (a, b) with a = d of S_2(p) z_b, and with b = d of S_2(p) z_a,
    dz_p = S_1(p).

One kernel evaluates the bases to the third order once per (n, i), reads G's columns and writes dz. Where the
forward pass kept its basis (rows in one chunk), the dW GEMM reads that; else the kernel writes ``A_jet`` over G's
entries of its own (each (row, column) entry of G belongs to one (n, i)), so the dW GEMM reads the basis from G's
buffer: no second buffer, no second evaluation.

Rows go in chunks (``row0``, and the chunk's row count from the basis's width); z and dz are the whole stacks.
The counts D and P are compile-time (a module ``warpkan_edge_<key>_jet_d<D>_p<P>`` per jet shape, built when a
layer runs in Taylor mode, or ahead of time by ``warpkan precompile --taylor D,P``); the pairs themselves are
kernel arguments (``PairIndex``: at most ``MAX_PAIRS``), so no device tensor is made per call.
"""


import functools
from dataclasses import dataclass

import warp as wp

from .._modules import ModuleBuild
from ._values import edge_values
from .dense import dense_entry, row_writer
from .family import EdgeFamily

__all__ = ["JetKernels", "jet_kernels", "jet_modules", "MAX_DIRECTIONS", "MAX_PAIRS", "PairIndex"]

MAX_DIRECTIONS = 8
MAX_PAIRS = 8
PairIndex = wp.types.vector(length=MAX_PAIRS, dtype=wp.int32)


@dataclass(frozen=True)
class JetKernels:
    module: str
    expand_jet: wp.Kernel
    expand_contract_jet: wp.Kernel


@dataclass(frozen=True)
class _JetFuncs:
    comps: type  # vector of the C components
    load_components: object  # (z, n, i) -> comps
    direction: object  # (zc, index) -> zc[1 + index]
    contractions: object  # (g, row, rows, local, start, n_coef, v1, v2, v3) -> (comps, comps, comps)
    write_basis: object  # (basis_t, i, row, rows, local, n_coef, start, use_base, zc, b, b1, b2, s0, s1, s2, a, b)
    weight_dots: object  # (w, row, start, n_coef, v1, v2, v3) -> three scalars


def _jet_funcs(family: EdgeFamily, D: int, P: int) -> _JetFuncs:
    """The ``@wp.func`` pieces of both Taylor-mode kernels, for C = 1 + D + P compile-time components."""
    scalar, K = family.scalar, family.n_bases
    C = 1 + D + P
    write_rows = row_writer(family, scalar)
    vec = family.vec
    comps = wp.types.vector(length=C, dtype=scalar)
    zero = scalar(0.0)
    one = scalar(1.0)

    @wp.func
    def load_components(z: wp.array3d(dtype=scalar), n: int, i: int):
        zc = comps()
        for c in range(C):
            zc[c] = z[c, n, i]
        return zc

    @wp.func
    def direction(zc: comps, index: int):
        """zc[1 + index] for a run-time direction index, by selects (registers, not a dynamic index)."""
        value = zero
        for d in range(D):
            if index == d:
                value = zc[1 + d]
        return value

    @wp.func
    def contractions(g: wp.array2d(dtype=scalar), row: int, rows: int, local: int, start: int, n_coef: int, v1: vec,
                     v2: vec, v3: vec):
        """For every component c, column c rows + local of g's rows row + start .. row + start + K - 1 (those
        that exist) dotted with v1, v2 and v3: the C K window loads in straight-line code, all in flight at
        once. (Reading whole columns instead, coalesced and independent of the slot, measured slower on the
        H200: 312 against 230 us at 65536 rows, 32 inputs, 8 coefficients, C = 4.)"""
        s1 = comps()
        s2 = comps()
        s3 = comps()
        for c in range(C):
            col = c * rows + local
            for m in range(K):
                j = start + m
                if j >= 0 and j < n_coef:
                    gj = g[row + j, col]
                    s1[c] = s1[c] + v1[m] * gj
                    s2[c] = s2[c] + v2[m] * gj
                    s3[c] = s3[c] + v3[m] * gj
        return s1, s2, s3

    @wp.func
    def weight_dots(w: wp.array2d(dtype=scalar), row: int, start: int, n_coef: int, v1: vec, v2: vec, v3: vec):
        """The window of a one-output weight's column (w [width, 1]) dotted with v1, v2 and v3."""
        s1 = zero
        s2 = zero
        s3 = zero
        for m in range(K):
            j = start + m
            if j >= 0 and j < n_coef:
                wj = w[row + j, 0]
                s1 = s1 + v1[m] * wj
                s2 = s2 + v2[m] * wj
                s3 = s3 + v3[m] * wj
        return s1, s2, s3

    @wp.func
    def write_basis(basis_t: wp.array2d(dtype=scalar), i: int, row: int, rows: int, local: int, n_coef: int,
                    start: int, use_base: int, zc: comps, b: vec, b1: vec, b2: vec, s0: scalar, s1: scalar,
                    s2: scalar, pair_a: PairIndex, pair_b: PairIndex):
        """The jet's dense basis at (n, i): for each component c, column c rows + local of the silu row i and of
        the input's coefficient rows row .. row + n_coef - 1 (see the module docstring)."""
        if use_base:
            basis_t[i, local] = s0
        write_rows(basis_t, row, local, n_coef, start, b, one)
        for d in range(D):
            col = (1 + d) * rows + local
            if use_base:
                basis_t[i, col] = s1 * zc[1 + d]
            write_rows(basis_t, row, col, n_coef, start, b1, zc[1 + d])
        for p in range(P):
            q = direction(zc, pair_a[p]) * direction(zc, pair_b[p])
            zp = zc[1 + D + p]
            col = (1 + D + p) * rows + local
            if use_base:
                basis_t[i, col] = s2 * q + s1 * zp
            write_rows(basis_t, row, col, n_coef, start, b2 * q + b1 * zp, one)

    return _JetFuncs(comps, load_components, direction, contractions, write_basis, weight_dots)


def jet_modules(family: EdgeFamily, n_first: int, n_pairs: int) -> tuple:
    """The module (:class:`ModuleBuild`) of the Taylor-mode kernels for jets of ``n_first`` directions and
    ``n_pairs`` pairs (none for a shared-table family), launched at the default block size."""
    if family.shared_table:
        return ()
    return (ModuleBuild(jet_kernels(family, n_first, n_pairs).module),)


@functools.lru_cache(maxsize=None)
def jet_kernels(family: EdgeFamily, n_first: int, n_pairs: int) -> JetKernels:
    """The Taylor-mode kernels of one family for jets of ``n_first`` directions and ``n_pairs`` pairs: both
    counts compile-time, so every loop over the components unrolls and each thread issues all its loads (the
    input jet, G's windows) before its first store. With run-time counts the backward kernel measured 3x slower
    on the H200 (705 against 230 us at 65536 rows, 32 inputs, 2 directions and 1 pair, its basis written
    separately): each component's loads then waited behind the previous component's stores, which the compiler
    must assume alias them."""
    if family.shared_table:
        raise ValueError(f"the Taylor-mode kernels write a dense basis, which a shared-table family ({family.key}) "
                         "does not have")
    if not (1 <= n_first <= MAX_DIRECTIONS and 0 <= n_pairs <= MAX_PAIRS):
        raise ValueError(f"Taylor mode takes 1 to {MAX_DIRECTIONS} directions and at most {MAX_PAIRS} pairs, got "
                         f"{n_first} and {n_pairs}")
    scalar, first, Frame = family.scalar, family.first, family.Frame
    D, P = n_first, n_pairs
    C = 1 + D + P
    module = f"warpkan_edge_{family.key}_jet_d{D}_p{P}"
    kernel = functools.partial(wp.kernel, enable_backward=False, module=module)
    values = edge_values(family)
    bases_dx2_at, bases_dx3_at, silu_orders = values.bases_dx2_at, values.bases_dx3_at, values.silu_orders
    funcs = _jet_funcs(family, D, P)
    load_components, direction, contractions, write_basis = (funcs.load_components, funcs.direction,
                                                             funcs.contractions, funcs.write_basis)
    weight_dots, comps = funcs.weight_dots, funcs.comps

    @kernel
    def expand_jet(z: wp.array3d(dtype=scalar), row0: int, frame: Frame, use_base: int, n_coef: int,
                   pair_a: PairIndex, pair_b: PairIndex, basis_t: wp.array2d(dtype=scalar)):
        rows = basis_t.shape[1] // C
        local, i = dense_entry(wp.tid(), z.shape[2])
        if local >= rows:
            return
        n = row0 + local
        zc = load_components(z, n, i)
        valid, slot, b, b1, b2 = bases_dx2_at(frame, n, i, zc[0])
        s0, s1, s2, s3 = silu_orders(zc[0])
        row = i * n_coef
        if use_base:
            row = row + z.shape[2]
        write_basis(basis_t, i, row, rows, local, n_coef, slot + first, use_base, zc, b, b1, b2, s0, s1, s2, pair_a,
                    pair_b)

    @kernel
    def expand_contract_jet(z: wp.array3d(dtype=scalar), row0: int, frame: Frame, use_base: int, n_coef: int,
                            write: int, pair_a: PairIndex, pair_b: PairIndex, g_basis: wp.array2d(dtype=scalar),
                            w: wp.array2d(dtype=scalar), h: wp.array3d(dtype=scalar), dz: wp.array3d(dtype=scalar)):
        # g_basis holds G = W H^T on entry and, with write, the jet's dense basis on exit (see the module
        # docstring); dz is overwritten at this chunk's rows. Loads first (the input jet, every component's
        # window of G), then the stores. A one-output layer passes its weight w [width, 1] and upstream h
        # [C, N, 1] instead of G (not read then): G's entries are w[r] h[c, n], so one window of w serves
        # every component.
        rows = g_basis.shape[1] // C
        local, i = dense_entry(wp.tid(), z.shape[2])
        if local >= rows:
            return
        n = row0 + local
        zc = load_components(z, n, i)
        valid, slot, b, b1, b2, b3 = bases_dx3_at(frame, n, i, zc[0])
        s0, s1, s2, s3 = silu_orders(zc[0])
        row = i * n_coef
        if use_base:
            row = row + z.shape[2]
        start = slot + first
        # S_m(c): column c of G against the order-m bases (m = 1, 2, 3), silu rows included
        sm1 = comps()
        sm2 = comps()
        sm3 = comps()
        if w.shape[0] > 0:
            wd1, wd2, wd3 = weight_dots(w, row, start, n_coef, b1, b2, b3)
            if use_base:
                wd1 = wd1 + s1 * w[i, 0]
                wd2 = wd2 + s2 * w[i, 0]
                wd3 = wd3 + s3 * w[i, 0]
            for c in range(C):
                hc = h[c, n, 0]
                sm1[c] = wd1 * hc
                sm2[c] = wd2 * hc
                sm3[c] = wd3 * hc
        else:
            sm1, sm2, sm3 = contractions(g_basis, row, rows, local, start, n_coef, b1, b2, b3)
            if use_base:
                for c in range(C):
                    g_silu = g_basis[i, c * rows + local]
                    sm1[c] = sm1[c] + s1 * g_silu
                    sm2[c] = sm2[c] + s2 * g_silu
                    sm3[c] = sm3[c] + s3 * g_silu
        dz0 = sm1[0]
        for d in range(D):
            dz0 = dz0 + sm2[1 + d] * zc[1 + d]
        for p in range(P):
            c = 1 + D + p
            za = direction(zc, pair_a[p])
            zb = direction(zc, pair_b[p])
            dz0 = dz0 + sm3[c] * za * zb + sm2[c] * zc[c]
            dz[c, n, i] = sm1[c]
        dz[0, n, i] = dz0
        for d in range(D):
            acc = sm1[1 + d]
            for p in range(P):
                if pair_a[p] == d:
                    acc = acc + sm2[1 + D + p] * direction(zc, pair_b[p])
                if pair_b[p] == d:
                    acc = acc + sm2[1 + D + p] * direction(zc, pair_a[p])
            dz[1 + d, n, i] = acc
        if write:  # else the caller kept the forward's basis
            write_basis(g_basis, i, row, rows, local, n_coef, start, use_base, zc, b, b1, b2, s0, s1, s2, pair_a,
                        pair_b)

    return JetKernels(module, expand_jet, expand_contract_jet)
