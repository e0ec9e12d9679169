"""What an edge family is: the two ``@wp.func``s the engine's kernels are written in, and its compile key.

Every edge family computes ``y[n, o] = sum_i sum_m B_m(x[n, i]) C[i, slot(x[n, i]) + first + m, o]``
(plus the engine's optional SiLU base path, spline scaler and bias). A family supplies

- ``Frame``: a ``@wp.struct`` of its runtime parameters (a knot array, a lookup table, ...), built on the
  host by the family's launcher and passed to every kernel;
- ``locate(frame, n, i, x) -> (valid, slot, u, du_dx, d2u_dx2)``: whether the value x = x[n, i] (row n, input
  i) has a spline term, the slot (``slot + first + m`` is the coefficient index of basis ``m``; slots are >= 0,
  and 0 when invalid), the local coordinate ``u`` and the chain-rule factors of the map x -> u. Most families
  read x alone; one whose frame holds per-element data (UKAN's sorted table) reads it at (n, i);
- ``basis(frame, i, slot, u) -> b``, ``basis_du(...) -> (b, db/du)``, ``basis_du2(...) -> (b, db/du,
  d2b/du2)``: the ``K`` bases of the slot and their u-derivatives, as ``vec`` values.

A family may share one coefficient table among all its inputs (``slot_input``: UKAN's touched-pair table,
whose rows are sorted by input): the kernels then see it as ``coef`` [in, n_coef, out] with a zero input stride,
each input's slots reaching only rows of its own, and the coefficient gradient is a segmented reduction over the
entries grouped by their slot's rows (:mod:`.stencil`; the tiled and dense-basis kernels do not take such a
family).

The kernels never see anything else of a family: they form ``dB/dx = du_dx db/du`` and ``d2B/dx2 =
du_dx^2 d2b/du2 + d2u_dx2 db/du`` themselves (:func:`basis_dx`, :func:`basis_dx2`).

Compile key. ``key`` is the only compile-time identity of a family: it names the Warp modules of its kernels
(order, scalar type, table capacity and the like go in it); every other quantity is a kernel argument.
"""


import functools
from dataclasses import dataclass

import warp as wp

from .._common import SCALARS

__all__ = ["EdgeFamily", "basis_dx", "basis_dx2", "basis_dx_orders", "basis_dx3", "silu_func", "silu_order_func",
           "silu_orders_func", "linear_u_dx3"]


@dataclass(frozen=True, eq=False)
class EdgeFamily:
    """One edge family at one compile key (see the module docstring)."""

    key: str  # compile key: unique, safe in a module name, e.g. "bspline_uniform_k3_float32"
    scalar_name: str  # "float32" or "float64": the type of x, the coefficients and every sum
    n_bases: int  # K: bases per edge
    first: int  # coefficient index of basis 0 at slot s is s + first (B-spline: -(K - 1); else 0)
    Frame: type  # @wp.struct of the runtime parameters
    locate: object  # @wp.func (frame, i, x) -> (valid, slot, u, du_dx, d2u_dx2)
    basis: object  # @wp.func (frame, i, slot, u) -> vec
    basis_du: object  # @wp.func (frame, i, slot, u) -> (vec, vec)
    basis_du2: object  # @wp.func (frame, i, slot, u) -> (vec, vec, vec)
    basis_du3: object  # @wp.func (frame, i, slot, u) -> (vec, vec, vec, vec): up to d3b/du3
    u_dx3: object  # @wp.func (u, du_dx, d2u_dx2) -> d3u/dx3 of the map x -> u
    single_slot: bool = False  # one slot per input (all of its coefficients in one window: polynomial bases)
    slot_input: object = None  # shared table: @wp.func (frame, slot) -> the input owning the slot's rows

    @property
    def shared_table(self) -> bool:
        """Whether one coefficient table serves every input (see the module docstring)."""
        return self.slot_input is not None

    @property
    def scalar(self):
        return SCALARS[self.scalar_name]

    @property
    def vec(self):
        return wp.types.vector(length=self.n_bases, dtype=self.scalar)

    def n_slots(self, n_coef: int) -> int:
        """Slots of a table of ``n_coef`` coefficients per input: the slot s reaches the coefficients
        s + first .. s + first + K - 1, and every coefficient is reached by some slot (one slot when the
        family evaluates every coefficient of an input at once)."""
        if self.single_slot:
            return 1
        return n_coef - 2 * self.first + 1 - self.n_bases

    def padded_rows(self, n_coef: int) -> int:
        """Rows of the zero-padded table in which slot s reads rows s .. s + K - 1 without a bound check."""
        return self.n_slots(n_coef) + self.n_bases - 1


@functools.lru_cache(maxsize=None)
def basis_dx(family: EdgeFamily):
    """``@wp.func (frame, i, slot, u, du_dx) -> (b, dB/dx)``: the bases and their x-derivatives."""
    basis_du = family.basis_du

    @wp.func
    def bases_and_dx(frame: family.Frame, i: int, slot: int, u: family.scalar, du_dx: family.scalar):
        b, db = basis_du(frame, i, slot, u)
        return b, db * du_dx

    return bases_and_dx


@functools.lru_cache(maxsize=None)
def basis_dx2(family: EdgeFamily):
    """``@wp.func (frame, i, slot, u, du_dx, d2u_dx2) -> (b, dB/dx, d2B/dx2)`` by the chain rule."""
    basis_du2 = family.basis_du2

    @wp.func
    def bases_and_dx2(frame: family.Frame, i: int, slot: int, u: family.scalar, du_dx: family.scalar,
                      d2u_dx2: family.scalar):
        b, db, d2b = basis_du2(frame, i, slot, u)
        return b, db * du_dx, d2b * (du_dx * du_dx) + db * d2u_dx2

    return bases_and_dx2


@functools.lru_cache(maxsize=None)
def _chain_rule(family: EdgeFamily):
    """``@wp.func (b, db, d2b, d3b, u, du_dx, d2u_dx2, order) -> d^order B / dx^order`` (order 0..3) from the
    u-derivatives, by the chain rule up to the third order: ``B^(3) = u'^3 b^(3) + 3 u' u'' b'' + u^(3) b'``."""
    u_dx3, scalar, vec = family.u_dx3, family.scalar, family.vec

    @wp.func
    def of_order(b: vec, db: vec, d2b: vec, d3b: vec, u: scalar, du_dx: scalar, d2u_dx2: scalar, order: int):
        if order == 0:
            return b
        if order == 1:
            return db * du_dx
        if order == 2:
            return d2b * (du_dx * du_dx) + db * d2u_dx2
        d3u = u_dx3(u, du_dx, d2u_dx2)
        return d3b * (du_dx * du_dx * du_dx) + d2b * (scalar(3.0) * du_dx * d2u_dx2) + db * d3u

    return of_order


@functools.lru_cache(maxsize=None)
def basis_dx_orders(family: EdgeFamily):
    """``@wp.func (frame, i, slot, u, du_dx, d2u_dx2, order) -> (d^order B / dx^order, d^(order+1) B / dx^(order+1))``
    for order 0..3 (the higher-order derivatives of the torch layers), from one evaluation of the bases and
    their u-derivatives (:func:`_chain_rule`). The second is meaningful for order + 1 <= 3 only (a caller at
    order 3 does not read it)."""
    basis_du3, of_order, scalar = family.basis_du3, _chain_rule(family), family.scalar

    @wp.func
    def bases_of_orders(frame: family.Frame, i: int, slot: int, u: scalar, du_dx: scalar, d2u_dx2: scalar,
                        order: int):
        b, db, d2b, d3b = basis_du3(frame, i, slot, u)
        return (of_order(b, db, d2b, d3b, u, du_dx, d2u_dx2, order),
                of_order(b, db, d2b, d3b, u, du_dx, d2u_dx2, order + 1))

    return bases_of_orders


@functools.lru_cache(maxsize=None)
def basis_dx3(family: EdgeFamily):
    """``@wp.func (frame, i, slot, u, du_dx, d2u_dx2) -> (B, dB/dx, d2B/dx2, d3B/dx3)`` from one evaluation of
    the bases and their u-derivatives: what the Taylor-mode backward kernel contracts with."""
    basis_du3, of_order, scalar = family.basis_du3, _chain_rule(family), family.scalar

    @wp.func
    def bases_to_dx3(frame: family.Frame, i: int, slot: int, u: scalar, du_dx: scalar, d2u_dx2: scalar):
        b, db, d2b, d3b = basis_du3(frame, i, slot, u)
        return (b, of_order(b, db, d2b, d3b, u, du_dx, d2u_dx2, 1), of_order(b, db, d2b, d3b, u, du_dx, d2u_dx2, 2),
                of_order(b, db, d2b, d3b, u, du_dx, d2u_dx2, 3))

    return bases_to_dx3


@functools.lru_cache(maxsize=None)
def silu_func(scalar_name: str = "float32"):
    """``@wp.func`` x -> (silu(x), silu'(x), silu''(x)) in the scalar type: the base path of the KAN layers."""
    scalar = SCALARS[scalar_name]
    one = scalar(1.0)
    two = scalar(2.0)

    @wp.func
    def silu_and_grads(x: scalar):
        sig = one / (one + wp.exp(-x))
        dsig = sig * (one - sig)
        return x * sig, sig * (one + x * (one - sig)), dsig * (two + x * (one - two * sig))

    return silu_and_grads


@functools.lru_cache(maxsize=None)
def silu_order_func(scalar_name: str = "float32"):
    """``@wp.func (x, order) -> d^order silu / dx^order`` for order 0..3."""
    scalar = SCALARS[scalar_name]
    one = scalar(1.0)
    two = scalar(2.0)
    six = scalar(6.0)

    @wp.func
    def silu_of_order(x: scalar, order: int):
        sig = one / (one + wp.exp(-x))
        s1 = sig * (one - sig)  # sigma'
        if order == 0:
            return x * sig
        if order == 1:
            return sig * (one + x * (one - sig))
        s2 = s1 * (one - two * sig)  # sigma''
        if order == 2:
            return two * s1 + x * s2
        s3 = s1 * (one - six * s1)  # third derivative of sigma: sigma' (1 - 6 sigma')
        return scalar(3.0) * s2 + x * s3

    return silu_of_order


@functools.lru_cache(maxsize=None)
def silu_orders_func(scalar_name: str = "float32"):
    """``@wp.func`` x -> silu and its first three derivatives (:func:`silu_order_func` at each order; the
    compiler shares the one exponential among the four inlined calls)."""
    silu_of_order = silu_order_func(scalar_name)
    scalar = SCALARS[scalar_name]

    @wp.func
    def silu_to_order3(x: scalar):
        return silu_of_order(x, 0), silu_of_order(x, 1), silu_of_order(x, 2), silu_of_order(x, 3)

    return silu_to_order3


@functools.lru_cache(maxsize=None)
def linear_u_dx3(scalar_name: str = "float32"):
    """``u_dx3`` of a family whose u is affine in x (B-spline, UKAN): zero."""
    scalar = SCALARS[scalar_name]

    @wp.func
    def zero_third(u: scalar, du_dx: scalar, d2u_dx2: scalar):
        return scalar(0.0)

    return zero_third
