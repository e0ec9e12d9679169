"""``@wp.func`` pieces every engine kernel evaluates an edge with, built from a family's two functions."""


import functools
from dataclasses import dataclass

import warp as wp

from .family import (EdgeFamily, basis_dx, basis_dx2, basis_dx3, basis_dx_orders, silu_func, silu_order_func,
                     silu_orders_func)

__all__ = ["EdgeValues", "edge_values"]


@dataclass(frozen=True)
class EdgeValues:
    slot_at: object  # (frame, n, i, x) -> (valid, slot)
    bases_at: object  # (frame, n, i, x) -> (valid, slot, b); b zero when invalid
    bases_dx_at: object  # (frame, n, i, x) -> (valid, slot, b, dB/dx)
    bases_dx2_at: object  # (frame, n, i, x) -> (valid, slot, b, dB/dx, d2B/dx2)
    coef_dot: object  # (coef, i, slot, o, v) -> sum_m v_m C[i, slot + first + m, o] over existing coefficients
    silu: object  # x -> (silu, silu', silu'')
    bases_order_at: object  # (frame, n, i, x, order) -> (valid, slot, d^order B / dx^order), order 0..3
    bases_orders_at: object  # (frame, n, i, x, order) -> (valid, slot, orders `order` and `order` + 1)
    silu_order: object  # (x, order) -> d^order silu / dx^order
    bases_dx3_at: object  # (frame, n, i, x) -> (valid, slot, B, dB/dx, d2B/dx2, d3B/dx3)
    silu_orders: object  # x -> (silu, silu', silu'', silu''')


@functools.lru_cache(maxsize=None)
def edge_values(family: EdgeFamily) -> EdgeValues:
    scalar, vec, Frame = family.scalar, family.vec, family.Frame
    K, first = family.n_bases, family.first
    locate, basis = family.locate, family.basis
    with_dx, with_dx2 = basis_dx(family), basis_dx2(family)
    of_orders = basis_dx_orders(family)
    to_dx3 = basis_dx3(family)
    zero = scalar(0.0)

    @wp.func
    def slot_at(frame: Frame, n: int, i: int, x: scalar):
        valid, slot, u, du_dx, d2u_dx2 = locate(frame, n, i, x)
        return valid, slot

    @wp.func
    def bases_at(frame: Frame, n: int, i: int, x: scalar):
        valid, slot, u, du_dx, d2u_dx2 = locate(frame, n, i, x)
        b = vec()
        if valid:
            b = basis(frame, i, slot, u)
        return valid, slot, b

    @wp.func
    def bases_dx_at(frame: Frame, n: int, i: int, x: scalar):
        valid, slot, u, du_dx, d2u_dx2 = locate(frame, n, i, x)
        b = vec()
        db = vec()
        if valid:
            b, db = with_dx(frame, i, slot, u, du_dx)
        return valid, slot, b, db

    @wp.func
    def bases_dx2_at(frame: Frame, n: int, i: int, x: scalar):
        valid, slot, u, du_dx, d2u_dx2 = locate(frame, n, i, x)
        b = vec()
        db = vec()
        d2b = vec()
        if valid:
            b, db, d2b = with_dx2(frame, i, slot, u, du_dx, d2u_dx2)
        return valid, slot, b, db, d2b

    @wp.func
    def coef_dot(coef: wp.array3d(dtype=scalar), i: int, slot: int, o: int, v: vec):
        n_coef = coef.shape[1]
        acc = zero
        for m in range(K):
            j = slot + first + m
            if j >= 0 and j < n_coef:
                acc = acc + v[m] * coef[i, j, o]
        return acc

    @wp.func
    def bases_orders_at(frame: Frame, n: int, i: int, x: scalar, order: int):
        valid, slot, u, du_dx, d2u_dx2 = locate(frame, n, i, x)
        b = vec()
        b_next = vec()
        if valid:
            b, b_next = of_orders(frame, i, slot, u, du_dx, d2u_dx2, order)
        return valid, slot, b, b_next

    @wp.func
    def bases_order_at(frame: Frame, n: int, i: int, x: scalar, order: int):
        valid, slot, b, b_next = bases_orders_at(frame, n, i, x, order)
        return valid, slot, b

    @wp.func
    def bases_dx3_at(frame: Frame, n: int, i: int, x: scalar):
        valid, slot, u, du_dx, d2u_dx2 = locate(frame, n, i, x)
        b = vec()
        db = vec()
        d2b = vec()
        d3b = vec()
        if valid:
            b, db, d2b, d3b = to_dx3(frame, i, slot, u, du_dx, d2u_dx2)
        return valid, slot, b, db, d2b, d3b

    return EdgeValues(slot_at, bases_at, bases_dx_at, bases_dx2_at, coef_dot, silu_func(family.scalar_name),
                      bases_order_at, bases_orders_at, silu_order_func(family.scalar_name), bases_dx3_at,
                      silu_orders_func(family.scalar_name))
