"""The engine's dense-basis kernels: the basis written out for a GEMM (cuBLAS through the host framework).

The dense basis of a chunk of rows is written transposed, ``basis_t`` [width, rows], width = (in if the base
path is fused) + in n_coef: row i holds silu(x[:, i]) and row (base) + i n_coef + j holds B_j(x[:, i]).
Consecutive threads take consecutive rows n of one input (tiles of ``ROW_TILE`` rows, inputs next), so every
store of a warp covers consecutive addresses of one basis row; every entry, zeros included, is written (no
fill). ``y = basis_t^T W`` with ``W = [base_weight_t; coef * scaler]`` [width, out] is then one GEMM.

The basis dtype is the scalar type or (float32 layers) bfloat16: a module per (family, basis dtype).

A bfloat16 basis is also written and read two rows a thread (``expand_basis_pairs``,
``contract_basis_grad_pairs``): rows 2p and 2p + 1 of an entry are one 4-byte store or load of a bf16 pair. The
one-row kernels spend about 20 instructions on each 2-byte entry (the slot's compare-selects, the conversion,
Warp's index wrap, a 64-bit address), so they are bound by instruction issue, not memory; sharing the index and
address work between two rows made the expansions 1.4-1.8x faster on the H200, and the contractions 1.05-1.12x
(B-splines) and 2.2-2.3x (a Chebyshev layer) where they are taken (``scripts/expand_bf16_probe.py``), with the
same bits.
"""


import functools
from dataclasses import dataclass

import warp as wp

from .._modules import ModuleBuild
from ._values import edge_values
from .family import EdgeFamily

__all__ = ["DenseKernels", "dense_kernels", "dense_modules", "ROW_TILE", "dense_dim", "dense_width", "basis_entry",
           "bf16_pair"]

ROW_TILE = 32  # consecutive rows of one input per warp


@dataclass(frozen=True)
class DenseKernels:
    module: str
    expand_basis: wp.Kernel
    combine_weights: wp.Kernel
    contract_basis_grad: wp.Kernel
    contract_basis_grad_scaled: wp.Kernel
    expand_contract: wp.Kernel
    split_param_grads: wp.Kernel
    expand_basis_pairs: "wp.Kernel | None"  # bfloat16 bases only
    contract_basis_grad_pairs: "wp.Kernel | None"


def dense_dim(n_rows: int, n_in: int) -> int:
    """Threads of the row-tiled dense-basis kernels for x [rows, in]."""
    return -(-n_rows // ROW_TILE) * ROW_TILE * n_in


def dense_width(n_in: int, n_coef: int, use_base: bool) -> int:
    """Contraction length: the silu rows (when the base path is fused) and the n_coef basis rows of every input."""
    return (n_in if use_base else 0) + n_in * n_coef


@wp.func
def dense_entry(tid: int, n_in: int):
    """(row, input) of thread tid in the dense-basis kernels."""
    tile_size = ROW_TILE * n_in
    tile = tid // tile_size
    rest = tid - tile * tile_size
    i = rest // ROW_TILE
    return tile * ROW_TILE + rest - i * ROW_TILE, i


def dense_modules(family: EdgeFamily, basis_name: str) -> tuple:
    """The module (:class:`ModuleBuild`) of the dense-basis kernels of ``basis_name``, launched at the default
    block size."""
    return (ModuleBuild(dense_kernels(family, basis_name).module),)


@functools.lru_cache(maxsize=None)
def dense_kernels(family: EdgeFamily, basis_name: str) -> DenseKernels:
    if family.shared_table:
        raise ValueError(f"the dense basis of a shared-table family ({family.key}) would have a column per input "
                         "and row of the whole table; its layers run the stencil kernels")
    if basis_name not in (family.scalar_name, "bfloat16") or (basis_name == "bfloat16"
                                                              and family.scalar_name != "float32"):
        raise TypeError(f"the dense basis must be {family.scalar_name} or (for float32) bfloat16, got {basis_name}")
    basis_type = family.scalar if basis_name == family.scalar_name else wp.bfloat16
    module = f"warpkan_edge_{family.key}_dense_{basis_name}"
    kernel = functools.partial(wp.kernel, enable_backward=False, module=module)
    write_rows = row_writer(family, basis_type)
    expand_basis, contract_basis_grad, contract_basis_grad_scaled = _basis_kernels(family, basis_type, kernel,
                                                                                   write_rows)
    expand_contract = _expand_contract_kernel(family, basis_type, kernel, write_rows)
    combine_weights, split_param_grads = _weight_kernels(family, basis_type, kernel)
    pairs = _pair_kernels(family, kernel) if basis_type == wp.bfloat16 else (None, None)
    return DenseKernels(module, expand_basis, combine_weights, contract_basis_grad, contract_basis_grad_scaled,
                        expand_contract, split_param_grads, *pairs)


@functools.lru_cache(maxsize=None)
def basis_entry(family: EdgeFamily):
    """``@wp.func (b, m) -> b[m]`` for 0 <= m < K, zero otherwise: the dense basis entry of the coefficient
    ``start + m`` of an edge whose K bases b start at coefficient ``start``. A loop of K compares rather than an
    index into b, so every thread of a warp runs the same instructions whatever its slot."""
    scalar, K = family.scalar, family.n_bases
    zero = scalar(0.0)

    @wp.func
    def entry(b: family.vec, m: int):
        value = zero
        for k in range(K):
            if m == k:
                value = b[k]
        return value

    return entry


def row_writer(family: EdgeFamily, basis_type):
    """``@wp.func (basis_t, row, n, n_coef, start, b, s)``: column n of input rows row .. row + n_coef - 1, the K
    values b (times s) at coefficients start .. start + K - 1 and zeros elsewhere. Every row is written with
    the same trip count in every thread of a warp, so each store is one coalesced row segment (per-thread loop
    bounds around the slot diverge and measured 2.5x slower on the H200), and no fill is needed."""
    scalar = family.scalar
    entry = basis_entry(family)

    @wp.func
    def write_rows(basis_t: wp.array2d(dtype=basis_type), row: int, n: int, n_coef: int, start: int,
                   b: family.vec, s: scalar):
        for j in range(n_coef):
            basis_t[row + j, n] = basis_type(s * entry(b, j - start))

    return write_rows


def _basis_kernels(family: EdgeFamily, basis_type, kernel, write_rows):
    scalar, Frame, K, first = family.scalar, family.Frame, family.n_bases, family.first
    values = edge_values(family)
    bases_at, bases_dx_at = values.bases_at, values.bases_dx_at
    bases_order_at, silu_order = values.bases_order_at, values.silu_order
    zero = scalar(0.0)

    @kernel
    def expand_basis(x: wp.array2d(dtype=scalar), frame: Frame, use_base: int, n_coef: int, order: int,
                     scale: wp.array2d(dtype=scalar), basis_t: wp.array2d(dtype=basis_type)):
        # order > 0: the order-th x-derivative of every entry (the higher-order derivatives of the torch layers);
        # a non-empty scale [rows, in] multiplies input i's entries of row n by scale[n, i] (the gradient of a
        # contraction, formed here rather than by a gather and a product over the whole dense basis)
        n, i = dense_entry(wp.tid(), x.shape[1])
        if n >= x.shape[0]:
            return
        xv = x[n, i]
        s = scalar(1.0)
        if scale.shape[0] > 0:
            s = scale[n, i]
        row = i * n_coef
        if use_base:
            basis_t[i, n] = basis_type(s * silu_order(xv, order))
            row = row + x.shape[1]
        valid = int(0)
        slot = int(0)
        b = family.vec()
        if order == 0:  # the first-order passes' case: the bases alone, without the derivatives' series
            valid, slot, b = bases_at(frame, n, i, xv)
        else:
            valid, slot, b = bases_order_at(frame, n, i, xv, order)
        write_rows(basis_t, row, n, n_coef, slot + first, b, s)  # b[0]'s coefficient; b is zero when invalid

    def contract_kernel(scaled: bool):
        def contract_basis_grad(x: wp.array2d(dtype=scalar), frame: Frame, use_base: int, n_coef: int, order: int,
                                scale: wp.array2d(dtype=scalar), d_basis_t: wp.array2d(dtype=basis_type),
                                dx: wp.array2d(dtype=scalar)):
            # dx[n, i] = d_basis_t[i, n] silu^(order)(x) + sum_m d_basis_t[row(slot + first + m), n] d^order B_m/dx^order
            # (overwrites), times scale[n, i] in the scaled kernel; order 1 is the gradient of expand_basis' order 0
            n, i = dense_entry(wp.tid(), x.shape[1])
            if n >= x.shape[0]:
                return
            xv = x[n, i]
            acc = zero
            row = i * n_coef
            if use_base:
                acc = scalar(d_basis_t[i, n]) * silu_order(xv, order)
                row = row + x.shape[1]
            valid = int(0)
            slot = int(0)
            db = family.vec()
            if order == 1:  # the first-order backward's case: no higher derivatives formed
                valid, slot, b, db = bases_dx_at(frame, n, i, xv)
            else:
                valid, slot, db = bases_order_at(frame, n, i, xv, order)
            if valid:
                for m in range(K):
                    j = slot + first + m
                    if j >= 0 and j < n_coef:
                        acc = acc + db[m] * scalar(d_basis_t[row + j, n])
            if wp.static(scaled):
                acc = acc * scale[n, i]
            dx[n, i] = acc

        # the scale is a kernel of its own: a run-time test in the unscaled one (the first-order backward's)
        # cost its every call ~10% at small grids on the H200
        if scaled:
            contract_basis_grad.__name__ = contract_basis_grad.__qualname__ = "contract_basis_grad_scaled"
        return kernel(contract_basis_grad)

    return expand_basis, contract_kernel(False), contract_kernel(True)


@functools.cache
def bf16_pair():
    """The struct of entry j of rows 2p (lo) and 2p + 1 (hi) of a bfloat16 basis [width, rows]: one uint32 of
    its [width, rows / 2] view. Made at first use: a ``wp.struct`` at import would start Warp (and fix its
    kernel cache) whenever the package is imported."""

    @wp.struct
    class Bf16Pair:
        lo: wp.bfloat16
        hi: wp.bfloat16

    return Bf16Pair


def _pair_kernels(family: EdgeFamily, kernel):
    """The first-order expansion (order 0, no scale) and contraction (order 1, no scale) of a bfloat16 basis, two
    rows a thread, on its uint32 view [width, rows / 2] (even rows, 4-byte aligned: the launchers check). Threads
    map to row pairs as the one-row kernels map rows; the bases are the family's own ``@wp.func``s, so the
    expansion's bits are the one-row kernel's. The contraction reads every coefficient row of the pair (one load
    for both rows) rather than each row's window of K (two loads of two bytes each), so the launcher takes it
    only where the table is short (``launch.PAIR_CONTRACT_COEF_PER_BASIS``); of each row it adds the window's
    products alone, in the one-row kernel's order: the same dx bit for bit."""
    scalar, Frame, K, first = family.scalar, family.Frame, family.n_bases, family.first
    values = edge_values(family)
    bases_at, bases_dx_at, silu_order = values.bases_at, values.bases_dx_at, values.silu_order
    entry = basis_entry(family)
    zero = scalar(0.0)
    Bf16Pair = bf16_pair()

    @wp.func
    def row_pair(x: wp.array2d(dtype=scalar), tid: int):
        # (p, i, rows 2p and 2p + 1 of x at input i, whether they exist): the one-row kernels' thread map over
        # pairs of rows (the rows are even in number: the launchers check)
        p, i = dense_entry(tid, x.shape[1])
        x0 = zero
        x1 = zero
        inside = 2 * p < x.shape[0]
        if inside:
            x0 = x[2 * p, i]
            x1 = x[2 * p + 1, i]
        return p, i, x0, x1, inside

    @kernel
    def expand_basis_pairs(x: wp.array2d(dtype=scalar), frame: Frame, use_base: int, n_coef: int,
                           basis2: wp.array2d(dtype=wp.uint32)):
        p, i, x0, x1, inside = row_pair(x, wp.tid())
        if not inside:
            return
        n0 = 2 * p
        row = i * n_coef
        pair = Bf16Pair()
        if use_base:
            pair.lo = wp.bfloat16(silu_order(x0, 0))
            pair.hi = wp.bfloat16(silu_order(x1, 0))
            basis2[i, p] = wp.cast(pair, wp.uint32)
            row = row + x.shape[1]
        valid0, slot0, b0 = bases_at(frame, n0, i, x0)
        valid1, slot1, b1 = bases_at(frame, n0 + 1, i, x1)
        start0 = slot0 + first
        start1 = slot1 + first
        for j in range(n_coef):
            pair.lo = wp.bfloat16(entry(b0, j - start0))
            pair.hi = wp.bfloat16(entry(b1, j - start1))
            basis2[row + j, p] = wp.cast(pair, wp.uint32)

    @kernel
    def contract_basis_grad_pairs(x: wp.array2d(dtype=scalar), frame: Frame, use_base: int, n_coef: int,
                                  d_basis2: wp.array2d(dtype=wp.uint32), dx: wp.array2d(dtype=scalar)):
        p, i, x0, x1, inside = row_pair(x, wp.tid())
        if not inside:
            return
        n0 = 2 * p
        acc0 = zero
        acc1 = zero
        row = i * n_coef
        if use_base:
            pair = wp.cast(d_basis2[i, p], Bf16Pair)
            acc0 = scalar(pair.lo) * silu_order(x0, 1)
            acc1 = scalar(pair.hi) * silu_order(x1, 1)
            row = row + x.shape[1]
        valid0, slot0, b0, db0 = bases_dx_at(frame, n0, i, x0)
        valid1, slot1, b1, db1 = bases_dx_at(frame, n0 + 1, i, x1)
        start0 = slot0 + first
        start1 = slot1 + first
        for j in range(n_coef):
            pair = wp.cast(d_basis2[row + j, p], Bf16Pair)
            m0 = j - start0
            m1 = j - start1
            # only the window's entries, as the one-row kernel adds them: a non-finite gradient entry outside
            # a row's window stays out of its dx
            if valid0 and m0 >= 0 and m0 < K:
                acc0 = acc0 + entry(db0, m0) * scalar(pair.lo)
            if valid1 and m1 >= 0 and m1 < K:
                acc1 = acc1 + entry(db1, m1) * scalar(pair.hi)
        dx[n0, i] = acc0
        dx[n0 + 1, i] = acc1

    return expand_basis_pairs, contract_basis_grad_pairs


def _expand_contract_kernel(family: EdgeFamily, basis_type, kernel, write_rows):
    scalar, Frame, K, first = family.scalar, family.Frame, family.n_bases, family.first
    values = edge_values(family)
    bases_orders_at, silu_order = values.bases_orders_at, values.silu_order
    zero = scalar(0.0)
    one = scalar(1.0)

    @kernel
    def expand_contract(x: wp.array2d(dtype=scalar), frame: Frame, use_base: int, n_coef: int, order: int,
                        scale: wp.array2d(dtype=scalar), scale_lo: wp.array2d(dtype=scalar), lo_is_scale: int,
                        g: wp.array2d(dtype=basis_type), basis_t: wp.array2d(dtype=basis_type),
                        dx: wp.array2d(dtype=scalar), dx_lo: wp.array2d(dtype=scalar)):
        # what the backward of a contraction (or of a dense basis) needs, from one evaluation of the bases at x
        # and one read of g's window: basis_t = A_order(x) scale, dx = contract_{order+1}(g, x) scale and
        # dx_lo = contract_order(g, x) scale_lo; an empty output is not written, an empty scale is 1;
        # lo_is_scale: scale_lo is scale (one tensor is not passed twice: a recorded launch re-points each
        # argument by its own address)
        n, i = dense_entry(wp.tid(), x.shape[1])
        if n >= x.shape[0]:
            return
        xv = x[n, i]
        s = one
        if scale.shape[0] > 0:
            s = scale[n, i]
        valid, slot, b, b_next = bases_orders_at(frame, n, i, xv, order)
        contracts = dx.shape[0] > 0 or dx_lo.shape[0] > 0
        acc = zero
        acc_lo = zero
        row = i * n_coef
        if use_base:
            silu_m = silu_order(xv, order)
            if basis_t.shape[0] > 0:
                basis_t[i, n] = basis_type(s * silu_m)
            if contracts:
                g_silu = scalar(g[i, n])
                acc_lo = g_silu * silu_m
                if dx.shape[0] > 0:
                    acc = g_silu * silu_order(xv, order + 1)
            row = row + x.shape[1]
        start = slot + first
        if basis_t.shape[0] > 0:
            write_rows(basis_t, row, n, n_coef, start, b, s)
        if valid and contracts:
            for m in range(K):
                j = start + m
                if j >= 0 and j < n_coef:
                    g_j = scalar(g[row + j, n])
                    acc = acc + b_next[m] * g_j
                    acc_lo = acc_lo + b[m] * g_j
        if dx.shape[0] > 0:
            dx[n, i] = acc * s
        if dx_lo.shape[0] > 0:
            s_lo = one
            if lo_is_scale:
                s_lo = s
            elif scale_lo.shape[0] > 0:
                s_lo = scale_lo[n, i]
            dx_lo[n, i] = acc_lo * s_lo

    return expand_contract


def _weight_kernels(family: EdgeFamily, basis_type, kernel):
    scalar = family.scalar
    zero = scalar(0.0)
    # Both kernels run a thread per (input, output) and walk the coefficients in steps of 4 whose loads come
    # before their stores. A loop that loads, then stores what it loaded, waits out one memory latency a
    # coefficient (the compiler cannot move a load above a store that may alias it): with a thread per edge
    # there are few warps to hide it, and a MNIST UKAN layer's 28 coefficients took ~9 us. The sums keep their
    # order, so the results are bitwise those of the plain loop.

    @kernel
    def combine_weights(base_weight_t: wp.array2d(dtype=scalar), scaler_t: wp.array2d(dtype=scalar),
                        coef: wp.array3d(dtype=scalar), use_base: int, weight: wp.array2d(dtype=basis_type)):
        # weight = [base_weight_t; coef * scaler_t] in the basis dtype: one pass over the parameters
        i, o = wp.tid()
        n_coef = coef.shape[1]
        row = i * n_coef
        if use_base:
            weight[i, o] = basis_type(base_weight_t[i, o])
            row = row + coef.shape[0]
        s = scaler_t[i, o]
        whole = n_coef - n_coef % 4
        for j in range(0, whole, 4):
            c0 = coef[i, j, o]
            c1 = coef[i, j + 1, o]
            c2 = coef[i, j + 2, o]
            c3 = coef[i, j + 3, o]
            weight[row + j, o] = basis_type(c0 * s)
            weight[row + j + 1, o] = basis_type(c1 * s)
            weight[row + j + 2, o] = basis_type(c2 * s)
            weight[row + j + 3, o] = basis_type(c3 * s)
        for j in range(whole, n_coef):
            weight[row + j, o] = basis_type(coef[i, j, o] * s)

    @kernel
    def split_param_grads(d_weight: wp.array2d(dtype=scalar), scaler_t: wp.array2d(dtype=scalar),
                          coef: wp.array3d(dtype=scalar), use_base: int, d_base_weight_t: wp.array2d(dtype=scalar),
                          d_scaler_t: wp.array2d(dtype=scalar), d_coef: wp.array3d(dtype=scalar)):
        # the gradient of weight = [base_weight_t; coef * scaler_t], split into its parameters (overwrites)
        i, o = wp.tid()
        n_coef = coef.shape[1]
        row = i * n_coef
        if use_base:
            d_base_weight_t[i, o] = d_weight[i, o]
            row = row + coef.shape[0]
        else:
            d_base_weight_t[i, o] = zero
        s = scaler_t[i, o]
        acc = zero
        whole = n_coef - n_coef % 4
        for j in range(0, whole, 4):
            g0 = d_weight[row + j, o]
            g1 = d_weight[row + j + 1, o]
            g2 = d_weight[row + j + 2, o]
            g3 = d_weight[row + j + 3, o]
            c0 = coef[i, j, o]
            c1 = coef[i, j + 1, o]
            c2 = coef[i, j + 2, o]
            c3 = coef[i, j + 3, o]
            d_coef[i, j, o] = g0 * s
            d_coef[i, j + 1, o] = g1 * s
            d_coef[i, j + 2, o] = g2 * s
            d_coef[i, j + 3, o] = g3 * s
            acc = acc + g0 * c0
            acc = acc + g1 * c1
            acc = acc + g2 * c2
            acc = acc + g3 * c3
        for j in range(whole, n_coef):
            g = d_weight[row + j, o]
            d_coef[i, j, o] = g * s
            acc = acc + g * coef[i, j, o]
        d_scaler_t[i, o] = acc

    return combine_weights, split_param_grads
