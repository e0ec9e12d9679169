"""Polynomial edge families (PolyKAN): ``P_0 .. P_D`` of ``t = tanh x`` as the engine's ``locate`` / ``basis``.

Every input has one slot (``first = 0``, slot 0): the coefficients of input i are ``W[i, 0..D, :]``. ``locate``
maps x to ``u = t = tanh x`` with ``du/dx = 1 - t^2`` and ``d2u/dx2 = -2 t (1 - t^2)``; NaN stays NaN (a NaN
row of y, as under autograd) and +-Inf is ``t = +-1``.

The degree is a runtime quantity (``Frame.n_basis = D + 1``) under a compile-time capacity ``K`` (one of
:data:`CAPACITIES`): a family evaluates ``K`` bases, zero past ``n_basis``.

- ``exact``: the recurrence in registers. Three-term bases (``P_{d+1} = (A_d t + B_d) P_d - C_d P_{d-1}``)
  define only ``(A_d, B_d, C_d)``; differentiating the recurrence gives ``P'`` and ``P''`` in the same pass.
  Chebyshev (first kind), Legendre, Hermite (physicists'), Gegenbauer ``C^(alpha)``, Jacobi ``P^(alpha, beta)``;
  Fourier is ``1, cos(k pi t), sin(k pi t)`` (k = 1, 2, ...).
- ``lut``: the tables ``P_d`` and ``P_d'`` on a uniform grid of [-1, 1] (built once from the exact family),
  linearly interpolated. ``basis_du`` interpolates the derivative table (O(h^2) from ``P_d'``; not the
  derivative of the piecewise-linear values, which is O(h) off), and ``basis_du2`` is the derivative of that
  interpolant (the slope of the derivative table on the cell, O(h) from ``P_d''``). This family serves a LUT
  layer's forward and first-order backward passes.
- ``lut`` derivatives (:func:`lut_derivative_family`): the values from the value table (the layer's forward,
  to the bit) and every u-derivative from the exact recurrence. This family serves a LUT layer's
  ``create_graph=True`` backward and its Taylor mode, where the interpolant's second derivative (piecewise
  constant, off by up to a few percent) would be a residual's u_xx; its first derivative is the exact one too,
  so that u_xx is the derivative of the u_x it is used with (and u_x is as exact as exact mode's).
"""

import functools
import math

import warp as wp

from .._common import SCALARS
from .family import EdgeFamily

__all__ = ["CAPACITIES", "THREE_TERM", "BASES", "capacity_for", "poly_family", "lut_derivative_family",
           "poly_frame_of"]

CAPACITIES = (4, 8, 12, 16, 24, 32, 48, 65)  # bases a family evaluates (D + 1 <= 65: MAX_DEGREE 64)


def capacity_for(n_basis: int) -> int:
    """The smallest capacity holding ``n_basis`` bases."""
    for capacity in CAPACITIES:
        if n_basis <= capacity:
            return capacity
    raise ValueError(f"at most {CAPACITIES[-1]} bases (degree {CAPACITIES[-1] - 1}), got {n_basis}")


# ------------------------------------------------------------------------------ three-term coefficients
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
        return (scalar(2.0) * (n + alpha) / (n + scalar(1.0)), scalar(0.0),
                (n + scalar(2.0) * alpha - scalar(1.0)) / (n + scalar(1.0)))

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
        return ((s + one) * (s + two) * s / denom, (s + one) * (alpha * alpha - beta * beta) / denom,
                two * (n + alpha) * (n + beta) * (s + two) / denom)

    return coeffs


THREE_TERM = {"chebyshev": _chebyshev, "legendre": _legendre, "hermite": _hermite, "gegenbauer": _gegenbauer,
              "jacobi": _jacobi}
BASES = (*THREE_TERM, "fourier")


# ------------------------------------------------------------------------------ frames
@functools.lru_cache(maxsize=None)
def exact_frame(scalar_name: str):
    scalar = SCALARS[scalar_name]

    @wp.struct
    class PolyExactFrame:
        n_basis: int  # D + 1
        alpha: scalar
        beta: scalar

    return PolyExactFrame


@functools.lru_cache(maxsize=None)
def lut_frame(scalar_name: str):
    scalar = SCALARS[scalar_name]

    @wp.struct
    class PolyLutFrame:
        n_basis: int  # D + 1
        lut: wp.array2d(dtype=scalar)  # [lut_size, D + 1]: P_d on the grid of [-1, 1]
        lut_grad: wp.array2d(dtype=scalar)  # and P_d'

    return PolyLutFrame


@functools.lru_cache(maxsize=None)
def lut_derivative_frame(scalar_name: str):
    scalar = SCALARS[scalar_name]

    @wp.struct
    class PolyLutDerivativeFrame:
        n_basis: int  # D + 1
        alpha: scalar
        beta: scalar
        lut: wp.array2d(dtype=scalar)  # [lut_size, D + 1]: P_d on the grid of [-1, 1]

    return PolyLutDerivativeFrame


@functools.lru_cache(maxsize=None)
def _tanh_locate(Frame, scalar_name: str):
    scalar = SCALARS[scalar_name]
    one = scalar(1.0)
    two = scalar(2.0)

    @wp.func
    def locate(frame: Frame, n: int, i: int, x: scalar):
        t = wp.tanh(x)
        slope = one - t * t
        return int(1), int(0), t, slope, -two * t * slope

    return locate


@functools.lru_cache(maxsize=None)
def _tanh_u_dx3(scalar_name: str):
    """d3 tanh / dx3 = (1 - t^2) (6 t^2 - 2), from t = u and du/dx = 1 - t^2."""
    scalar = SCALARS[scalar_name]

    @wp.func
    def third(u: scalar, du_dx: scalar, d2u_dx2: scalar):
        return du_dx * (scalar(6.0) * u * u - scalar(2.0))

    return third


# ------------------------------------------------------------------------------ exact bases
def _three_term_funcs(basis: str, K: int, scalar_name: str, Frame):
    scalar = SCALARS[scalar_name]
    vec = wp.types.vector(length=K, dtype=scalar)
    coeffs = THREE_TERM[basis](scalar)
    zero = scalar(0.0)
    one = scalar(1.0)
    two = scalar(2.0)
    three = scalar(3.0)

    @wp.func
    def bases_du3(frame: Frame, i: int, slot: int, t: scalar):
        """P and its first three derivatives by the recurrence and its derivatives; zero past n_basis."""
        b = vec()
        db = vec()
        d2b = vec()
        d3b = vec()
        b[0] = one
        for d in range(K - 1):
            if d + 1 < frame.n_basis:
                a, c0, c = coeffs(d, frame.alpha, frame.beta)
                m = a * t + c0
                b_prev = zero
                db_prev = zero
                d2b_prev = zero
                d3b_prev = zero
                if d > 0:
                    b_prev = b[d - 1]
                    db_prev = db[d - 1]
                    d2b_prev = d2b[d - 1]
                    d3b_prev = d3b[d - 1]
                b[d + 1] = m * b[d] - c * b_prev
                db[d + 1] = m * db[d] + a * b[d] - c * db_prev
                d2b[d + 1] = m * d2b[d] + two * a * db[d] - c * d2b_prev
                d3b[d + 1] = m * d3b[d] + three * a * d2b[d] - c * d3b_prev
        return b, db, d2b, d3b

    @wp.func
    def bases_du2(frame: Frame, i: int, slot: int, t: scalar):
        b, db, d2b, d3b = bases_du3(frame, i, slot, t)
        return b, db, d2b

    return vec, bases_du2, bases_du3


def _fourier_funcs(K: int, scalar_name: str, Frame):
    scalar = SCALARS[scalar_name]
    vec = wp.types.vector(length=K, dtype=scalar)
    pi = scalar(math.pi)
    one = scalar(1.0)

    @wp.func
    def bases_du3(frame: Frame, i: int, slot: int, t: scalar):
        """1, cos(k pi t), sin(k pi t), ... and their t-derivatives up to the third; zero past n_basis."""
        b = vec()
        db = vec()
        d2b = vec()
        d3b = vec()
        b[0] = one
        for d in range(1, K):
            if d < frame.n_basis:
                w = scalar((d + 1) // 2) * pi
                c = wp.cos(w * t)
                s = wp.sin(w * t)
                if d % 2 == 1:
                    b[d] = c
                    db[d] = -w * s
                    d2b[d] = -w * w * c
                    d3b[d] = w * w * w * s
                else:
                    b[d] = s
                    db[d] = w * c
                    d2b[d] = -w * w * s
                    d3b[d] = -w * w * w * c
        return b, db, d2b, d3b

    @wp.func
    def bases_du2(frame: Frame, i: int, slot: int, t: scalar):
        b, db, d2b, d3b = bases_du3(frame, i, slot, t)
        return b, db, d2b

    return vec, bases_du2, bases_du3


def _exact_funcs(basis: str, K: int, scalar_name: str, Frame) -> tuple:
    """(vec, bases_du2, bases_du3) of the exact basis, for a frame with ``n_basis``, ``alpha`` and ``beta``."""
    if basis == "fourier":
        return _fourier_funcs(K, scalar_name, Frame)
    return _three_term_funcs(basis, K, scalar_name, Frame)


def _exact_family(basis: str, K: int, scalar_name: str) -> EdgeFamily:
    Frame = exact_frame(scalar_name)
    scalar = SCALARS[scalar_name]
    vec, bases_du2, bases_du3 = _exact_funcs(basis, K, scalar_name, Frame)

    @wp.func
    def basis_fn(frame: Frame, i: int, slot: int, u: scalar):
        b, db, d2b = bases_du2(frame, i, slot, u)
        return b

    @wp.func
    def basis_du(frame: Frame, i: int, slot: int, u: scalar):
        b, db, d2b = bases_du2(frame, i, slot, u)
        return b, db

    return EdgeFamily(f"poly_{basis}_c{K}_{scalar_name}", scalar_name, K, 0, Frame, _tanh_locate(Frame, scalar_name),
                      basis_fn, basis_du, bases_du2, single_slot=True, basis_du3=bases_du3,
                      u_dx3=_tanh_u_dx3(scalar_name))


# ------------------------------------------------------------------------------ lookup tables
def _table_reader(K: int, scalar_name: str, Frame):
    """``(lut_cell, table_values)``: the cell of t on the value table ``frame.lut`` and the interpolated values
    there, for every frame that holds that table."""
    scalar = SCALARS[scalar_name]
    vec = wp.types.vector(length=K, dtype=scalar)
    zero = scalar(0.0)
    one = scalar(1.0)
    half = scalar(0.5)

    @wp.func
    def lut_cell(frame: Frame, t: scalar):
        """(cell, fraction, 1 / spacing) of t in [-1, 1] on the table's grid. NaN gives cell 0 and a NaN
        fraction, so the interpolated value is NaN and no index leaves the table."""
        last_cell = frame.lut.shape[0] - 2
        per_unit = half * scalar(last_cell + 1)
        s = (t + one) * per_unit
        cell = int(0)
        if s >= zero:
            cell = wp.min(int(s), last_cell)
        return cell, s - scalar(cell), per_unit

    @wp.func
    def table_values(frame: Frame, u: scalar):
        cell, frac, per_unit = lut_cell(frame, u)
        b = vec()
        for d in range(K):
            if d < frame.n_basis:
                lo = frame.lut[cell, d]
                b[d] = lo + frac * (frame.lut[cell + 1, d] - lo)
        return b

    return lut_cell, table_values


def _lut_family(K: int, scalar_name: str) -> EdgeFamily:
    Frame = lut_frame(scalar_name)
    scalar = SCALARS[scalar_name]
    vec = wp.types.vector(length=K, dtype=scalar)
    lut_cell, table_values = _table_reader(K, scalar_name, Frame)

    @wp.func
    def basis_fn(frame: Frame, i: int, slot: int, u: scalar):
        return table_values(frame, u)

    @wp.func
    def basis_du2(frame: Frame, i: int, slot: int, u: scalar):
        cell, frac, per_unit = lut_cell(frame, u)
        b = vec()
        db = vec()
        d2b = vec()
        for d in range(K):
            if d < frame.n_basis:
                lo = frame.lut[cell, d]
                b[d] = lo + frac * (frame.lut[cell + 1, d] - lo)
                glo = frame.lut_grad[cell, d]
                rise = frame.lut_grad[cell + 1, d] - glo
                db[d] = glo + frac * rise
                d2b[d] = rise * per_unit  # the slope on the cell: per_unit cells per unit of t
        return b, db, d2b

    @wp.func
    def basis_du(frame: Frame, i: int, slot: int, u: scalar):
        cell, frac, per_unit = lut_cell(frame, u)
        b = vec()
        db = vec()
        for d in range(K):
            if d < frame.n_basis:
                lo = frame.lut[cell, d]
                b[d] = lo + frac * (frame.lut[cell + 1, d] - lo)
                glo = frame.lut_grad[cell, d]
                db[d] = glo + frac * (frame.lut_grad[cell + 1, d] - glo)
        return b, db

    @wp.func
    def basis_du3(frame: Frame, i: int, slot: int, u: scalar):
        """Derivatives of the interpolants: the third is zero (the second is constant on a cell)."""
        b, db, d2b = basis_du2(frame, i, slot, u)
        return b, db, d2b, vec()

    return EdgeFamily(f"poly_lut_c{K}_{scalar_name}", scalar_name, K, 0, Frame, _tanh_locate(Frame, scalar_name),
                      basis_fn, basis_du, basis_du2, single_slot=True, basis_du3=basis_du3,
                      u_dx3=_tanh_u_dx3(scalar_name))


def _lut_derivative_family(basis: str, K: int, scalar_name: str) -> EdgeFamily:
    Frame = lut_derivative_frame(scalar_name)
    scalar = SCALARS[scalar_name]
    _, bases_du2, bases_du3 = _exact_funcs(basis, K, scalar_name, Frame)
    _, table_values = _table_reader(K, scalar_name, Frame)

    @wp.func
    def basis_fn(frame: Frame, i: int, slot: int, u: scalar):
        return table_values(frame, u)

    @wp.func
    def basis_du(frame: Frame, i: int, slot: int, u: scalar):
        b, db, d2b = bases_du2(frame, i, slot, u)
        return table_values(frame, u), db

    @wp.func
    def basis_du2(frame: Frame, i: int, slot: int, u: scalar):
        b, db, d2b = bases_du2(frame, i, slot, u)
        return table_values(frame, u), db, d2b

    @wp.func
    def basis_du3(frame: Frame, i: int, slot: int, u: scalar):
        b, db, d2b, d3b = bases_du3(frame, i, slot, u)
        return table_values(frame, u), db, d2b, d3b

    return EdgeFamily(f"poly_lutd_{basis}_c{K}_{scalar_name}", scalar_name, K, 0, Frame,
                      _tanh_locate(Frame, scalar_name), basis_fn, basis_du, basis_du2, single_slot=True,
                      basis_du3=basis_du3, u_dx3=_tanh_u_dx3(scalar_name))


def _check_key(basis: str, capacity: int, scalar_name: str, bases) -> None:
    if basis not in bases:
        raise ValueError(f"basis must be one of {list(bases)}, got {basis!r}")
    if capacity not in CAPACITIES:
        raise ValueError(f"capacity must be one of {CAPACITIES}, got {capacity}")
    if scalar_name not in SCALARS:
        raise TypeError(f"scalar type must be one of {sorted(SCALARS)}, got {scalar_name}")


@functools.lru_cache(maxsize=None)
def poly_family(basis: str, capacity: int, scalar_name: str = "float32") -> EdgeFamily:
    """The polynomial edge family of one (basis or "lut", capacity, scalar type)."""
    _check_key(basis, capacity, scalar_name, (*BASES, "lut"))
    return _lut_family(capacity, scalar_name) if basis == "lut" else _exact_family(basis, capacity, scalar_name)


@functools.lru_cache(maxsize=None)
def lut_derivative_family(basis: str, capacity: int, scalar_name: str = "float32") -> EdgeFamily:
    """The family of a LUT layer's higher-order routes, of one (basis, capacity, scalar type): the values from
    the value table, every u-derivative from the basis's exact recurrence (see the module docstring).

    Not in the registry: only a ``create_graph=True`` backward and Taylor mode launch it, and only its
    dense-basis and Taylor-mode kernels (:func:`warpkan.kernels.poly.higher_order_modules`), which
    ``warpkan precompile`` builds when asked for those routes (``--create-graph``, ``--taylor``)."""
    _check_key(basis, capacity, scalar_name, BASES)
    return _lut_derivative_family(basis, capacity, scalar_name)


def poly_frame_of(family: EdgeFamily, n_basis: int, alpha: float = 1.0, beta: float = 1.0, lut=None, lut_grad=None):
    """The frame value of a layer of ``n_basis`` = D + 1 bases: (alpha, beta) for the exact families, the two
    tables for the lookup family, the value table and (alpha, beta) for a LUT-derivative family."""
    frame = family.Frame()
    if family.Frame is lut_frame(family.scalar_name):
        frame.lut, frame.lut_grad = lut, lut_grad
    else:
        frame.alpha, frame.beta = float(alpha), float(beta)
        if family.Frame is lut_derivative_frame(family.scalar_name):
            frame.lut = lut
    frame.n_basis = int(n_basis)
    return frame


# The family's builder and every compile key, as :mod:`.registry` lists them.
FAMILIES = {"poly": (poly_family, [dict(basis=basis, capacity=capacity, scalar_name=scalar)
                                   for basis in (*BASES, "lut") for capacity in CAPACITIES for scalar in SCALARS])}
