"""Higher-order derivatives of the group-rational activation: truncated Taylor series in x.

``F(x) = P(x) / Q(x)`` with ``P = sum_i a_i x^i`` and Q of variant "A" (``1 + sum_j |b_j| |x|^(j+1)``) or "B"
(``1 + |sum_j b_j x^(j+1)|``). Near a point x, ``|v|`` is ``sign(v) v`` (``sign(0) = +1``, KAT's convention), so
P, Q and every derivative of F in the coefficients are polynomials or rational functions of ``x + t`` whose
Taylor coefficients in t the kernels carry (``SERIES`` of them: derivatives to order ``SERIES - 1``). The k-th
x-derivative is k! times the t^k coefficient. With ``phi_i = (x + t)^i`` and ``psi_j = dQ/db_j`` (``sign(S)
phi_(j+1)`` for "B", ``sign(b_j) sign(x)^(j+1) phi_(j+1)`` for "A"):

- ``dF/da_i = phi_i / Q`` and ``dF/db_j = -F psi_j / Q``;
- along a coefficient direction h = (ha, hb): ``T = dF.h = (Ha - F Hb) / Q``, ``Ha = sum ha_i phi_i``,
  ``Hb = sum hb_j psi_j``;
- and T's own coefficient gradients: ``dT/da_i = -phi_i Hb / Q^2``, ``dT/db_j = psi_j (2 F Hb - Ha) / Q^2``
  (Q is piecewise linear in b, so its second b-derivatives vanish).

Two kernels a (orders, variant, scalar) module, both for the torch bridge's ``create_graph=True`` path:
``rational_derivative`` (per element: the k-th x-derivative of F, or of T along h) and
``rational_coef_partials`` (per channel and chunk of rows: the sums of g times the k-th x-derivative of F's, or
T's, coefficient gradients; the caller adds the chunks and a group's channels, in a fixed order).
"""

import functools
from dataclasses import dataclass

import warp as wp

from ._modules import ModuleBuild

__all__ = ["SERIES", "JetKernels", "jet_kernels", "jet_modules", "partial_chunks"]

SERIES = 5  # Taylor coefficients carried: x-derivatives to the fourth order
_SCALARS = {"float32": wp.float32, "float64": wp.float64}
_TARGET_THREADS = 1 << 16  # threads of rational_coef_partials worth filling a GPU


@dataclass(frozen=True)
class JetKernels:
    module: str
    rational_derivative: wp.Kernel
    rational_coef_partials: wp.Kernel


def partial_chunks(n_rows: int, n_channels: int) -> int:
    """Row chunks of ``rational_coef_partials``: enough (channel, chunk) threads to fill a GPU."""
    return max(1, min(n_rows, -(-_TARGET_THREADS // max(1, n_channels))))


@functools.lru_cache(maxsize=None)
def _series_funcs(scalar_name: str):
    """Truncated Taylor-series arithmetic on vectors of SERIES coefficients."""
    scalar = _SCALARS[scalar_name]
    series = wp.types.vector(length=SERIES, dtype=scalar)
    zero, one = scalar(0.0), scalar(1.0)

    # Every loop has constant bounds and every index is a loop constant, so Warp unrolls them and the series
    # stay in registers; an index that depends on the runtime order would put them in local memory (the
    # derivative order is picked by comparison instead).
    @wp.func
    def times_linear(p: series, x: scalar):
        """p(t) (x + t)."""
        out = series()
        out[0] = x * p[0]
        for r in range(1, SERIES):
            out[r] = x * p[r] + p[r - 1]
        return out

    @wp.func
    def times(p: series, q: series):
        out = series()
        for r in range(SERIES):
            acc = zero
            for s in range(SERIES):
                if s <= r:
                    acc = acc + p[s] * q[r - s]
            out[r] = acc
        return out

    @wp.func
    def reciprocal(q: series):
        """1 / q(t); q(0) != 0 (Q >= 1)."""
        out = series()
        out[0] = one / q[0]
        for r in range(1, SERIES):
            acc = zero
            for s in range(1, SERIES):
                if s <= r:
                    acc = acc + q[s] * out[r - s]
            out[r] = -acc * out[0]
        return out

    @wp.func
    def coefficient(p: series, q: series, k: int):
        """The t^k coefficient of p(t) q(t)."""
        acc = zero
        for s in range(SERIES):
            for r in range(SERIES):
                if s + r == k:
                    acc = acc + p[s] * q[r]
        return acc

    @wp.func
    def factorial(k: int):
        out = one
        for r in range(2, SERIES):
            if r <= k:
                out = out * scalar(r)
        return out

    @wp.func
    def pick(p: series, k: int):
        """p's t^k coefficient times k!: the k-th derivative."""
        value = zero
        for r in range(SERIES):
            if r == k:
                value = p[r]
        return value * factorial(k)

    @wp.func
    def sign(v: scalar):
        if v < zero:
            return -one
        return one

    return series, times_linear, times, reciprocal, coefficient, pick, factorial, sign


@functools.lru_cache(maxsize=None)
def _rational_funcs(num_order: int, den_order: int, variant: str, scalar_name: str):
    """The series of P, Q and of a direction's Ha, Hb at one element, and the factor psi_j / phi_(j+1)."""
    scalar = _SCALARS[scalar_name]
    series, times_linear, _, _, _, _, _, sign = _series_funcs(scalar_name)
    D = max(num_order, den_order) + 1  # powers 0 .. max(m, n)
    M, N = num_order + 1, den_order
    is_a = variant == "A"
    one = scalar(1.0)

    @wp.func
    def sign_power(x: scalar, power: int):
        """sign(x)^power: |x + t|^power = sign_power(x, power) (x + t)^power near x."""
        factor = one
        if x < scalar(0.0) and power % 2 == 1:
            factor = -one
        return factor

    @wp.func
    def psi_factor(x: scalar, b: wp.array2d(dtype=scalar), row: int, j: int, sign_s: scalar):
        """dQ/db_j = psi_factor phi_(j+1)."""
        if wp.static(is_a):
            return sign(b[row, j]) * sign_power(x, j + 1)
        return sign_s

    @wp.func
    def direction(x: scalar, ha: wp.array2d(dtype=scalar), row_a: int, hb: wp.array2d(dtype=scalar), row_b: int,
                  b: wp.array2d(dtype=scalar), sign_s: scalar):
        """(Ha, Hb) = (sum_i ha_i phi_i, sum_j hb_j psi_j) as series in t."""
        h_a = series()
        h_b = series()
        phi = series()
        phi[0] = one
        for i in range(D):
            if i < M:
                h_a = h_a + ha[row_a, i] * phi
            if i >= 1 and i <= N:
                h_b = h_b + (hb[row_b, i - 1] * psi_factor(x, b, row_b, i - 1, sign_s)) * phi
            phi = times_linear(phi, x)
        return h_a, h_b

    @wp.func
    def numerator_and_denominator(x: scalar, a: wp.array2d(dtype=scalar), row_a: int,
                                  b: wp.array2d(dtype=scalar), row_b: int):
        """(P, Q, sign of S(x)) as series in t: P = Ha and Q - 1 = Hb along h = (a, b) itself (b_j psi_j is
        |b_j| |x + t|^(j+1) for "A" and sign(S) b_j phi_(j+1) for "B")."""
        sign_s = one
        if wp.static(not is_a):
            s = scalar(0.0)
            power = x
            for j in range(N):
                s = s + b[row_b, j] * power
                power = power * x
            sign_s = sign(s)
        p, q = direction(x, a, row_a, b, row_b, b, sign_s)
        q[0] = q[0] + one
        return p, q, sign_s

    return numerator_and_denominator, direction, psi_factor


def jet_modules(num_order: int, den_order: int, variant: str, scalar_name: str) -> tuple:
    """The module (:class:`ModuleBuild`) of the Taylor-series kernels of one combination, which Taylor mode and a
    ``create_graph=True`` backward launch at the default block size."""
    return (ModuleBuild(jet_kernels(num_order, den_order, variant, scalar_name).module),)


@functools.lru_cache(maxsize=None)
def jet_kernels(num_order: int, den_order: int, variant: str, scalar_name: str) -> JetKernels:
    if scalar_name not in _SCALARS:
        raise TypeError(f"the jet kernels compute in float32 or float64, got {scalar_name}")
    module = f"warpkan_rational_jet_{variant}_{num_order}_{den_order}_{scalar_name}"
    kernel = functools.partial(wp.kernel, enable_backward=False, module=module)
    return JetKernels(module, _derivative_kernel(num_order, den_order, variant, scalar_name, kernel),
                      _partials_kernel(num_order, den_order, variant, scalar_name, kernel))


def _derivative_kernel(num_order, den_order, variant, scalar_name, kernel):
    scalar = _SCALARS[scalar_name]
    _, _, times, reciprocal, _, pick, _, _ = _series_funcs(scalar_name)
    numerator_and_denominator, direction, _ = _rational_funcs(num_order, den_order, variant, scalar_name)

    @kernel
    def rational_derivative(x: wp.array2d(dtype=scalar), a: wp.array2d(dtype=scalar), b: wp.array2d(dtype=scalar),
                            ha: wp.array2d(dtype=scalar), hb: wp.array2d(dtype=scalar), group_size: int, order: int,
                            out: wp.array2d(dtype=scalar)):
        # out[n, c] = d^order/dx^order of F (ha empty) or of T = dF/d(a, b) . (ha, hb), at x[n, c]
        n, c = wp.tid()
        group = c // group_size
        row_a = int(0)
        if a.shape[0] > 1:
            row_a = group
        xv = x[n, c]
        p, q, sign_s = numerator_and_denominator(xv, a, row_a, b, group)
        inv_q = reciprocal(q)
        f = times(p, inv_q)
        if ha.shape[0] > 0:
            h_a, h_b = direction(xv, ha, row_a, hb, group, b, sign_s)
            f = times(h_a - times(f, h_b), inv_q)
        out[n, c] = pick(f, order)

    return rational_derivative


def _partials_kernel(num_order, den_order, variant, scalar_name, kernel):
    scalar = _SCALARS[scalar_name]
    series, times_linear, times, reciprocal, coefficient, _, factorial_of, _ = _series_funcs(scalar_name)
    numerator_and_denominator, direction, psi_factor = _rational_funcs(num_order, den_order, variant, scalar_name)
    D = max(num_order, den_order) + 1
    M, N = num_order + 1, den_order
    vec_m = wp.types.vector(length=M, dtype=scalar)
    vec_n = wp.types.vector(length=N, dtype=scalar)
    one, two = scalar(1.0), scalar(2.0)

    @kernel
    def rational_coef_partials(g: wp.array2d(dtype=scalar), x: wp.array2d(dtype=scalar),
                               a: wp.array2d(dtype=scalar), b: wp.array2d(dtype=scalar), ha: wp.array2d(dtype=scalar),
                               hb: wp.array2d(dtype=scalar), group_size: int, order: int, rows_per_chunk: int,
                               part_a: wp.array3d(dtype=scalar), part_b: wp.array3d(dtype=scalar)):
        # part_a[chunk, c, i] = sum over the chunk's rows n of g[n, c] d^order/dx^order dF/da_i (dT/da_i when ha
        # is not empty) at x[n, c]; part_b likewise for b_j. Consecutive threads take consecutive channels.
        chunk, c = wp.tid()
        group = c // group_size
        row_a = int(0)
        if a.shape[0] > 1:
            row_a = group
        acc_a = vec_m()
        acc_b = vec_n()
        factorial = factorial_of(order)
        start = chunk * rows_per_chunk
        stop = wp.min(start + rows_per_chunk, x.shape[0])
        for n in range(start, stop):
            xv = x[n, c]
            weight = factorial * g[n, c]
            p, q, sign_s = numerator_and_denominator(xv, a, row_a, b, group)
            inv_q = reciprocal(q)
            f = times(p, inv_q)
            w_a = inv_q
            w_b = -times(f, inv_q)
            if ha.shape[0] > 0:
                h_a, h_b = direction(xv, ha, row_a, hb, group, b, sign_s)
                inv_q2 = times(inv_q, inv_q)
                w_a = -times(h_b, inv_q2)
                w_b = times(two * times(f, h_b) - h_a, inv_q2)
            phi = series()
            phi[0] = one
            for i in range(D):
                if i < M:
                    acc_a[i] = acc_a[i] + weight * coefficient(phi, w_a, order)
                if i >= 1 and i <= N:
                    acc_b[i - 1] = acc_b[i - 1] + weight * psi_factor(xv, b, group, i - 1, sign_s) * coefficient(
                        phi, w_b, order)
                phi = times_linear(phi, xv)
        for i in range(M):
            part_a[chunk, c, i] = acc_a[i]
        for j in range(N):
            part_b[chunk, c, j] = acc_b[j]

    return rational_coef_partials
