"""``@wp.func`` building blocks for users' own Warp kernels: a uniform B-spline, a polynomial series and a
rational function, each returning its value AND its derivative in x.

They exist for code that the layer objects do not cover: a physics-informed residual needs ``df/dx`` of the
network inside a kernel, and the training loss then needs the gradient of that derivative with respect to
the parameters. Both come from one kernel: the building blocks return the analytic derivative, and Warp's
own autodiff (``wp.Tape``, a kernel with ``enable_backward=True``, the default) differentiates the kernel,
derivative included, with respect to the coefficient arrays and to ``x``. Every loop inside them runs over a
compile-time length (the order or degree fixed by the factory), so Warp unrolls it and the adjoint is exact
(Warp unrolls loops of up to ``wp.config.max_unroll`` = 16 iterations: polynomial degrees up to 15).

Each factory is cached per argument tuple and returns the same ``@wp.func`` objects on every call::

    spline = warpkan.funcs.bspline_funcs(order=3).spline     # also .locate, .basis, .basis_dx

    @wp.kernel
    def model(t: wp.array(dtype=float), coef: wp.array2d(dtype=float), f: wp.array(dtype=float),
              dfdt: wp.array(dtype=float)):
        n = wp.tid()
        value, slope = spline(t[n], -1.0, 2.0, 8, coef, 0)   # grid [-1, 1], 8 intervals, row 0 of coef
        f[n] = value
        dfdt[n] = slope

- :func:`bspline_funcs` -- the uniform B-spline of ``warpkan.native.KANLinear`` / efficient-kan: grid size
  ``G`` on ``[lo, lo + G h]`` extended by ``k`` knots each side, ``G + k`` coefficients per curve, evaluated
  locally with the exact matrix ``M_k`` of :func:`warpkan.kernels.bspline.uniform_basis_matrix`. Inputs
  outside ``[lo - k h, lo + (G + k) h)`` (and NaN) give ``(0, 0)``, as in the layers.
- :func:`poly_funcs` -- ``sum_d c_d P_d(tanh x)`` of ``warpkan.native.PolyKANLinear``, by the recurrences of
  :data:`warpkan.kernels.poly.BASES` (the kernels' own ``@wp.func``s, not a copy), with the chain rule
  ``dP_d(tanh x)/dx = P_d'(t) (1 - t^2)``.
- :func:`rational_funcs` -- ``P(x) / Q(x)`` with the safe (PAU) denominators of the group-rational layers,
  variant ``"A"``: ``Q = 1 + sum_j |b_{j-1}| |x|^j`` and ``"B"``: ``Q = 1 + |sum_j b_{j-1} x^j|``. Written
  here (the group-rational kernel module keeps its maths inside its kernel factory), in the plain form: it
  is meant for moderate ``|x|`` (``|x|^max(m, n)`` must not overflow the scalar type), where the layer
  switches to an overflow-free form only past ``2^(64 / max(m, n))``.

Float64 versions (``scalar=wp.float64``) exist for checking derivatives by finite differences.
"""

import functools
import math
from types import SimpleNamespace

import warp as wp

from . import _checks
from ._warp_output import start_warp
from .kernels import bspline as _kb
from .kernels import poly as _kp
from .kernels import rational as _kr
from .kernels.edge.bspline_family import uniform_basis_funcs
from .kernels.edge.poly_family import THREE_TERM

start_warp()

__all__ = ["bspline_funcs", "poly_funcs", "rational_funcs"]

_SCALARS = (wp.float32, wp.float64)


def _check_scalar(scalar) -> None:
    if scalar not in _SCALARS:
        raise TypeError(f"scalar must be wp.float32 or wp.float64, got {scalar}")


@functools.lru_cache(maxsize=None)
def bspline_funcs(order: int = 3, scalar=wp.float32) -> SimpleNamespace:
    """Uniform B-spline building blocks of one order ``k`` (1..5) and scalar type. Returns a namespace of
    ``@wp.func``:

    - ``locate(x, lo, inv_h, grid_size) -> (valid: int, cell: int, u)``: the cell ``c`` in ``[0, G + 2k)``
      counted from the first extended knot ``lo - k h``, and the local coordinate ``u`` in [0, 1);
      ``valid`` is 0 outside the extended grid and for NaN.
    - ``basis(u) -> vec(k+1)``: the ``k + 1`` bases nonzero on the cell, ``B_{c-k} .. B_c``.
    - ``basis_dx(u, inv_h) -> vec(k+1)``: their derivatives in x.
    - ``spline(x, lo, h, grid_size, coef, row) -> (value, dvalue/dx)``: ``sum_j coef[row, j] B_j(x)`` with
      ``coef`` a ``wp.array2d`` of ``G + k`` columns (one curve per row).
    - ``spline_d2(x, lo, h, grid_size, coef, row) -> (value, d/dx, d^2/dx^2)``, for second-order PDE residuals.
    """
    order = _checks.int_in_range("order", order, 1, _kb.MAX_SPLINE_ORDER)
    _check_scalar(scalar)
    k = order
    K = order + 1
    two_k = 2 * order  # a Python constant: Warp cannot type the literal product `2 * k` of a closure int
    scalar_key = "float64" if scalar == wp.float64 else "float32"
    M = wp.types.matrix(shape=(K, K), dtype=scalar)(*[scalar(v) for row in _kb.uniform_basis_matrix(order) for v in row])
    powers_basis, powers_basis_du = uniform_basis_funcs(order, scalar_key)[:2]
    zero = scalar(0.0)
    one = scalar(1.0)

    @wp.func
    def locate(x: scalar, lo: scalar, inv_h: scalar, grid_size: int):
        n_cells = grid_size + two_k
        s = (x - lo) * inv_h + scalar(k)
        valid = int(0)
        cell = int(0)
        u = zero
        if s >= zero and s < scalar(n_cells):  # false for NaN and +-Inf
            cell = wp.min(int(s), n_cells - 1)
            u = s - scalar(cell)
            valid = 1
        return valid, cell, u

    @wp.func
    def basis(u: scalar):
        return powers_basis(u)

    @wp.func
    def basis_dx(u: scalar, inv_h: scalar):
        b, db = powers_basis_du(u)
        return db * inv_h

    @wp.func
    def spline(x: scalar, lo: scalar, h: scalar, grid_size: int, coef: wp.array2d(dtype=scalar), row: int):
        # Scalars only (no vector component writes), so Warp's adjoint of this function is plain code.
        inv_h = one / h
        valid, cell, u = locate(x, lo, inv_h, grid_size)
        value = zero
        slope = zero
        if valid == 1:
            for m in range(K):
                j = cell - k + m
                if j >= 0 and j < grid_size + k:
                    bm = zero
                    dbm = zero
                    power = one
                    for p in range(K):
                        bm = bm + M[p, m] * power
                        if p + 1 < K:
                            dbm = dbm + scalar(p + 1) * M[p + 1, m] * power
                        power = power * u
                    c = coef[row, j]
                    value = value + c * bm
                    slope = slope + c * dbm
        return value, slope * inv_h

    @wp.func
    def spline_d2(x: scalar, lo: scalar, h: scalar, grid_size: int, coef: wp.array2d(dtype=scalar), row: int):
        """(value, d/dx, d^2/dx^2): the second derivative is piecewise polynomial of degree k - 2 (0 for k = 1)."""
        inv_h = one / h
        valid, cell, u = locate(x, lo, inv_h, grid_size)
        value = zero
        slope = zero
        curvature = zero
        if valid == 1:
            for m in range(K):
                j = cell - k + m
                if j >= 0 and j < grid_size + k:
                    bm = zero
                    dbm = zero
                    d2bm = zero
                    power = one
                    for p in range(K):
                        bm = bm + M[p, m] * power
                        if p + 1 < K:
                            dbm = dbm + scalar(p + 1) * M[p + 1, m] * power
                        if p + 2 < K:
                            d2bm = d2bm + scalar((p + 2) * (p + 1)) * M[p + 2, m] * power
                        power = power * u
                    c = coef[row, j]
                    value = value + c * bm
                    slope = slope + c * dbm
                    curvature = curvature + c * d2bm
        return value, slope * inv_h, curvature * inv_h * inv_h

    return SimpleNamespace(order=order, scalar=scalar, locate=locate, basis=basis, basis_dx=basis_dx, spline=spline,
                           spline_d2=spline_d2)


@functools.lru_cache(maxsize=None)
def poly_funcs(basis: str = "chebyshev", degree: int = 3, scalar=wp.float32, alpha: float = 1.0,
               beta: float = 1.0) -> SimpleNamespace:
    """Polynomial-basis building blocks of one basis, degree ``D`` and scalar type. Returns a namespace of
    ``@wp.func``:

    - ``start(t, alpha, beta) -> state``, ``advance(d, t, state, alpha, beta) -> state``, ``value(d, state)``,
      ``grad(d, state)``: the recurrence of :data:`warpkan.kernels.poly.BASES` (``P_d(t)`` and ``dP_d/dt``).
    - ``series(x, coef, row) -> (value, dvalue/dx)``: ``sum_{d=0..D} coef[row, d] P_d(tanh x)`` with ``coef`` a
      ``wp.array2d`` of ``D + 1`` columns, as one edge of ``PolyKANLinear``.
    """
    degree, alpha, beta = _kp.check_basis(basis, degree, alpha, beta)
    _check_scalar(scalar)
    if degree + 1 > wp.config.max_unroll:
        raise ValueError(f"degree must be at most {wp.config.max_unroll - 1} (unrolled loops keep Warp's adjoint exact), got {degree}")
    start, advance, value, grad = _recurrence_state(basis, scalar)
    D1 = degree + 1
    a_const = scalar(alpha)
    b_const = scalar(beta)
    zero = scalar(0.0)
    one = scalar(1.0)

    @wp.func
    def series(x: scalar, coef: wp.array2d(dtype=scalar), row: int):
        t = wp.tanh(x)
        state = start(t, a_const, b_const)
        total = zero
        slope = zero
        for d in range(D1):
            c = coef[row, d]
            total = total + c * value(d, state)
            slope = slope + c * grad(d, state)
            if d + 1 < D1:
                state = advance(d, t, state, a_const, b_const)
        return total, slope * (one - t * t)

    return SimpleNamespace(basis=basis, degree=degree, scalar=scalar, start=start, advance=advance, value=value,
                           grad=grad, series=series)


# The polynomial bases as a stepped state of scalars and vec4 (state = (P_{d-1}, P_d, P'_{d-1}, P'_d)): Warp's
# adjoint of these is plain code, which the tape-differentiable building blocks need; the engine's polynomial
# families (warpkan.kernels.edge.poly_family) evaluate every degree at once and share the coefficients.
def _three_term_state(make_coeffs):
    """A basis with ``P_0 = 1`` and ``P_{d+1} = (A_d t + B_d) P_d - C_d P_{d-1}`` as a stepped state;
    ``make_coeffs(scalar)`` returns a ``@wp.func (d, alpha, beta) -> (A_d, B_d, C_d)``."""

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

    return make


def _fourier_state(scalar):
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


@functools.lru_cache(maxsize=None)
def _recurrence_state(basis: str, scalar):
    if basis == "fourier":
        return _fourier_state(scalar)
    return _three_term_state(THREE_TERM[basis])(scalar)


@functools.lru_cache(maxsize=None)
def rational_funcs(num_order: int = 5, den_order: int = 4, variant: str = "A", scalar=wp.float32) -> SimpleNamespace:
    """Rational building blocks of orders ``(m, n)``. Returns a namespace with the ``@wp.func``
    ``rational(x, a, row_a, b, row_b) -> (F, dF/dx)``: ``a`` a ``wp.array2d`` of ``m + 1`` numerator columns,
    ``b`` of ``n`` denominator columns (one group per row). Where ``|.|`` meets 0 Warp's adjoint takes
    the derivative of ``|v|`` as 0 (the layers' backward takes +1 there); elsewhere they agree."""
    variant = _checks.one_of("variant", variant, _kr.VARIANTS)
    num_order = _checks.int_in_range("num_order", num_order, 0, _kr.MAX_ORDER)
    den_order = _checks.int_in_range("den_order", den_order, 1, _kr.MAX_ORDER)
    _check_scalar(scalar)
    M = num_order + 1
    N = den_order
    is_a = variant == "A"
    zero = scalar(0.0)
    one = scalar(1.0)

    @wp.func
    def rational(x: scalar, a: wp.array2d(dtype=scalar), row_a: int, b: wp.array2d(dtype=scalar), row_b: int):
        # P and P' by ascending powers (every loop runs forwards over a compile-time length)
        p = a[row_a, 0]
        dp = zero
        power = one  # x^(i-1)
        for i in range(1, M):
            a_i = a[row_a, i]
            dp = dp + scalar(i) * a_i * power
            power = power * x
            p = p + a_i * power
        # denominator sum over j = 1..n of (|b| |x|^j) or (b x^j), and its x-derivative
        ax = wp.abs(x)
        base = x
        sign_x = one
        if wp.static(is_a):
            base = ax
            if x < zero:
                sign_x = -one
        q_sum = zero
        dq_sum = zero
        power = one  # base^j
        # `range(N)`, not `range(1, N + 1)`: Warp unrolls a loop only when its bounds are plain constants, and
        # the adjoint of a loop it does not unroll is wrong for variables the loop reassigns
        for j in range(N):
            coef = b[row_b, j]
            if wp.static(is_a):
                coef = wp.abs(coef)
            dq_sum = dq_sum + scalar(j + 1) * coef * power
            power = power * base
            q_sum = q_sum + coef * power
        q = one + q_sum
        dq = dq_sum * sign_x
        if wp.static(not is_a):
            q = one + wp.abs(q_sum)
            if q_sum < zero:
                dq = -dq_sum
        r = one / q
        return p * r, (dp - p * r * dq) * r

    return SimpleNamespace(num_order=num_order, den_order=den_order, variant=variant, scalar=scalar, rational=rational)
