"""B-spline edge families: the maths of a B-spline KAN edge, uniform (matrix form) and general (local
Cox-de Boor), as the engine's ``locate`` / ``basis`` ``@wp.func``s (see :mod:`.family`).

Knots ``t_0 .. t_{G+2k}`` per input (``Frame.grid`` [in, G + 2k + 1]) cut the line into ``G + 2k`` cells;
cell ``c`` carries the ``K = k + 1`` bases ``B_{c-k} .. B_c``, so the slot is the cell and ``first = -k``
(bases with an index outside ``[0, G + k)`` have no coefficient). Inputs outside ``[t_0, t_{G+2k})`` and NaN
are invalid: a zero spline term, as in pykan and efficient-kan.

- uniform: ``u = (x - t_c) / h``, ``B_{c-k+m} = sum_p u^p M_k[p, m]`` with ``M_k`` exact
  (:func:`uniform_basis_matrix`); d/du and d2/du2 differentiate the powers.
- general (what ``update_grid`` produces): ``u = x``; the bases come from the local Cox-de Boor triangle on the
  ``2k`` knots around the cell (NURBS book A2.2), the derivatives from the lower-degree bases of the same
  triangle (A2.3).
"""


import functools
import math
from fractions import Fraction

import warp as wp

from .._common import SCALARS
from .family import EdgeFamily, linear_u_dx3

__all__ = ["MAX_SPLINE_ORDER", "uniform_basis_matrix", "uniform_basis_funcs", "uniform_frame_basis",
           "bspline_family"]

MAX_SPLINE_ORDER = 5


@functools.lru_cache(maxsize=None)
def uniform_basis_matrix(order: int) -> tuple[tuple[float, ...], ...]:
    """Exact ``M_k`` (``k = order``) with ``B_{c-k+m}(t_c + u h) = sum_p u^p M[p][m]``.

    Derived from the cardinal B-spline ``N_k(t) = 1/k! sum_j (-1)^j C(k+1, j) (t - j)_+^k``: basis
    ``B_{c-k+m}`` is ``N_k`` on its piece ``q = k - m``, evaluated at ``t = u + q``.
    """
    if not 0 <= order <= MAX_SPLINE_ORDER + 2:
        raise ValueError(f"spline_order must be in [0, {MAX_SPLINE_ORDER + 2}], got {order}")
    k = order
    size = k + 1
    matrix = [[Fraction(0)] * size for _ in range(size)]
    for m in range(size):
        q = k - m
        for j in range(q + 1):
            sign_binom = (-1) ** j * math.comb(k + 1, j)
            shift = q - j  # (u + shift)^k = sum_p C(k, p) u^p shift^(k-p)
            for p in range(size):
                matrix[p][m] += Fraction(sign_binom * math.comb(k, p) * shift ** (k - p), math.factorial(k))
    return tuple(tuple(float(v) for v in row) for row in matrix)



def _check(order: int, scalar_name: str) -> None:
    if not 1 <= order <= MAX_SPLINE_ORDER:
        raise ValueError(f"spline_order must be in [1, {MAX_SPLINE_ORDER}], got {order}")
    if scalar_name not in SCALARS:
        raise TypeError(f"scalar type must be one of {sorted(SCALARS)}, got {scalar_name}")


@functools.lru_cache(maxsize=None)
def bspline_frame(scalar_name: str):
    """The runtime parameters of a B-spline layer: its knots [in, G + 2k + 1]."""
    scalar = SCALARS[scalar_name]

    @wp.struct
    class BSplineFrame:
        grid: wp.array2d(dtype=scalar)

    BSplineFrame.__name__ = BSplineFrame.__qualname__ = f"BSplineFrame_{scalar_name}"
    return BSplineFrame


@functools.lru_cache(maxsize=None)
def uniform_basis_funcs(order: int, scalar_name: str):
    """(basis, basis_du, basis_du2, basis_du3) of the uniform matrix form, ``(u) -> ...``: shared with the UKAN
    family, whose unbounded grid is uniform too."""
    scalar = SCALARS[scalar_name]
    K = order + 1
    vecK = wp.types.vector(length=K, dtype=scalar)
    matK = wp.types.matrix(shape=(K, K), dtype=scalar)
    M = matK(*[scalar(v) for row in uniform_basis_matrix(order) for v in row])
    one = scalar(1.0)

    @wp.func
    def powers_basis(u: scalar):
        b = vecK()
        power = one
        for p in range(K):
            for m in range(K):
                b[m] = b[m] + M[p, m] * power
            power = power * u
        return b

    @wp.func
    def powers_basis_du(u: scalar):
        db = vecK()
        power = one
        for p in range(1, K):
            for m in range(K):
                db[m] = db[m] + scalar(p) * M[p, m] * power
            power = power * u
        return powers_basis(u), db

    @wp.func
    def powers_basis_du2(u: scalar):
        d2b = vecK()
        power = one
        for p in range(2, K):
            for m in range(K):
                d2b[m] = d2b[m] + scalar(p * (p - 1)) * M[p, m] * power
            power = power * u
        b, db = powers_basis_du(u)
        return b, db, d2b

    @wp.func
    def powers_basis_du3(u: scalar):
        d3b = vecK()
        power = one
        for p in range(3, K):
            for m in range(K):
                d3b[m] = d3b[m] + scalar(p * (p - 1) * (p - 2)) * M[p, m] * power
            power = power * u
        b, db, d2b = powers_basis_du2(u)
        return b, db, d2b, d3b

    return powers_basis, powers_basis_du, powers_basis_du2, powers_basis_du3


@functools.lru_cache(maxsize=None)
def uniform_frame_basis(Frame, order: int, scalar_name: str):
    """(basis, basis_du, basis_du2, basis_du3) of the uniform matrix form with the family signature
    ``(frame, i, slot, u)``: every uniform-grid family's (B-spline and UKAN), whatever its frame."""
    scalar = SCALARS[scalar_name]
    powers_basis, powers_basis_du, powers_basis_du2, powers_basis_du3 = uniform_basis_funcs(order, scalar_name)

    @wp.func
    def basis(frame: Frame, i: int, slot: int, u: scalar):
        return powers_basis(u)

    @wp.func
    def basis_du(frame: Frame, i: int, slot: int, u: scalar):
        return powers_basis_du(u)

    @wp.func
    def basis_du2(frame: Frame, i: int, slot: int, u: scalar):
        return powers_basis_du2(u)

    @wp.func
    def basis_du3(frame: Frame, i: int, slot: int, u: scalar):
        return powers_basis_du3(u)

    return basis, basis_du, basis_du2, basis_du3


def _uniform_family(order: int, scalar_name: str) -> EdgeFamily:
    scalar = SCALARS[scalar_name]
    Frame = bspline_frame(scalar_name)
    basis, basis_du, basis_du2, basis_du3 = uniform_frame_basis(Frame, order, scalar_name)
    zero = scalar(0.0)

    @wp.func
    def locate(frame: Frame, n: int, i: int, x: scalar):
        n_cells = frame.grid.shape[1] - 1
        t0 = frame.grid[i, 0]
        inv_h = scalar(n_cells) / (frame.grid[i, n_cells] - t0)
        s = (x - t0) * inv_h
        inside = s >= zero and s < scalar(n_cells)  # false for NaN and +-Inf
        s = wp.where(inside, s, zero)
        cell = wp.min(int(s), n_cells - 1)
        return wp.where(inside, 1, 0), cell, s - scalar(cell), inv_h, zero

    return EdgeFamily(f"bspline_uniform_k{order}_{scalar_name}", scalar_name, order + 1, -order, Frame, locate,
                      basis, basis_du, basis_du2, basis_du3=basis_du3, u_dx3=linear_u_dx3(scalar_name))


def _general_family(order: int, scalar_name: str) -> EdgeFamily:
    scalar = SCALARS[scalar_name]
    Frame = bspline_frame(scalar_name)
    K = order + 1
    vecK = wp.types.vector(length=K, dtype=scalar)
    zero = scalar(0.0)
    one = scalar(1.0)

    @wp.func
    def knot(frame: Frame, i: int, idx: int):
        """Knot idx of input i, extended linearly past both ends (those knots only shape bases whose index
        lies outside [0, G + k), which carry no coefficient)."""
        last = frame.grid.shape[1] - 1
        if idx < 0:
            return frame.grid[i, 0] + scalar(idx) * (frame.grid[i, 1] - frame.grid[i, 0])
        if idx > last:
            return frame.grid[i, last] + scalar(idx - last) * (frame.grid[i, last] - frame.grid[i, last - 1])
        return frame.grid[i, idx]

    @wp.func
    def locate(frame: Frame, n: int, i: int, x: scalar):
        """Binary search in the knots of input i; u is x itself."""
        last = frame.grid.shape[1] - 1
        valid = int(0)
        lo = int(0)
        if x >= frame.grid[i, 0] and x < frame.grid[i, last]:
            valid = 1
            hi = last
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if x >= frame.grid[i, mid]:
                    lo = mid
                else:
                    hi = mid
        return valid, lo, wp.where(valid == 1, x, zero), one, zero

    @wp.func
    def safe_div(a: scalar, b: scalar):
        if b == zero:
            return zero
        return a / b

    @wp.func
    def triangle(frame: Frame, i: int, cell: int, x: scalar, degree: int):
        """The degree-``degree`` bases B_{cell-degree .. cell} (entries 0 .. degree) by the local triangle."""
        left = vecK()
        right = vecK()
        b = vecK()
        b[0] = one
        for j in range(1, K):
            if j <= degree:
                left[j] = x - knot(frame, i, cell + 1 - j)
                right[j] = knot(frame, i, cell + j) - x
                saved = zero
                for r in range(K - 1):
                    if r < j:
                        temp = safe_div(b[r], right[r + 1] + left[j - r])
                        b[r] = saved + right[r + 1] * temp
                        saved = left[j - r] * temp
                b[j] = saved
        return b

    @wp.func
    def raise_derivative(frame: Frame, i: int, cell: int, lower: vecK, degree: int):
        """d/dx of the degree-``degree`` bases B_{l, degree}, l = cell - degree + m, from any quantity
        ``lower[q]`` attached to B_{cell-degree+1+q, degree-1} (its bases, or their derivatives):
        d B_{l,p} = p (B_{l,p-1} / (t_{l+p} - t_l) - B_{l+1,p-1} / (t_{l+p+1} - t_{l+1}))."""
        out = vecK()
        p = scalar(degree)
        for m in range(K):
            if m <= degree:
                l = cell - degree + m
                if m >= 1:
                    out[m] = out[m] + p * safe_div(lower[m - 1], knot(frame, i, l + degree) - knot(frame, i, l))
                if m <= degree - 1:
                    out[m] = out[m] - p * safe_div(lower[m], knot(frame, i, l + degree + 1) - knot(frame, i, l + 1))
        return out

    @wp.func
    def basis(frame: Frame, i: int, slot: int, u: scalar):
        return triangle(frame, i, slot, u, K - 1)

    @wp.func
    def basis_du(frame: Frame, i: int, slot: int, u: scalar):
        lower = triangle(frame, i, slot, u, K - 2)
        return triangle(frame, i, slot, u, K - 1), raise_derivative(frame, i, slot, lower, K - 1)

    @wp.func
    def basis_du2(frame: Frame, i: int, slot: int, u: scalar):
        b, db = basis_du(frame, i, slot, u)
        d2b = vecK()
        if K > 2:
            lower_d = raise_derivative(frame, i, slot, triangle(frame, i, slot, u, K - 3), K - 2)
            d2b = raise_derivative(frame, i, slot, lower_d, K - 1)
        return b, db, d2b

    @wp.func
    def basis_du3(frame: Frame, i: int, slot: int, u: scalar):
        b, db, d2b = basis_du2(frame, i, slot, u)
        d3b = vecK()
        if K > 3:
            lower_d2 = raise_derivative(frame, i, slot, triangle(frame, i, slot, u, K - 4), K - 3)
            lower_d = raise_derivative(frame, i, slot, lower_d2, K - 2)
            d3b = raise_derivative(frame, i, slot, lower_d, K - 1)
        return b, db, d2b, d3b

    return EdgeFamily(f"bspline_general_k{order}_{scalar_name}", scalar_name, K, -order, Frame, locate, basis,
                      basis_du, basis_du2, basis_du3=basis_du3, u_dx3=linear_u_dx3(scalar_name))


@functools.lru_cache(maxsize=None)
def bspline_family(order: int, uniform: bool, scalar_name: str = "float32") -> EdgeFamily:
    """The B-spline edge family of one (order, grid kind, scalar type)."""
    _check(order, scalar_name)
    return (_uniform_family if uniform else _general_family)(order, scalar_name)


def bspline_frame_of(grid: "wp.array2d"):
    """The frame value of a layer whose knots are ``grid``."""
    frame = bspline_frame("float32" if grid.dtype == wp.float32 else "float64")()
    frame.grid = grid
    return frame


# The family's builder and every compile key, as :mod:`.registry` lists them.
FAMILIES = {"bspline": (bspline_family, [dict(order=order, uniform=uniform, scalar_name=scalar)
                                         for order in range(1, MAX_SPLINE_ORDER + 1) for uniform in (True, False)
                                         for scalar in SCALARS])}
