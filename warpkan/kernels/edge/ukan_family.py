"""The UKAN edge family: a uniform B-spline on the unbounded grid of knot spacing ``h``, read through each
feature's window of its generated coefficient table (the dense-range path of :mod:`warpkan.kernels.ukan`).

x falls in cell ``c = floor(x / h)``, group ``g = floor(c / K)``, offset ``r = c - g K`` (K = k + 1). The CG-MLP
generated the coefficients of the groups ``group_lo[i] - 1 ..`` of feature i; coefficient ``t`` of the table
row of feature i is that of group ``group_lo[i] - 1 + t // K``. The cell's K coefficients are the window
``[C_{g-1}; C_g][r : r + K]``, i.e. the table coefficients ``(g - group_lo[i]) K + r + m``: the slot is
``(g - group_lo[i]) K + r`` and ``first = 0``. A table of ``Rt`` groups serves ``g <= group_lo[i] + Rt - 2``. The bases are the uniform B-spline's
(:func:`.bspline_family.uniform_basis_funcs`) with ``u = x / h - c``.

Inputs with ``|x| / h`` beyond ``CELL_LIMIT`` are evaluated at that limit with a zero slope (``du_dx = 0``);
NaN, and (defensively) a window outside the feature's table, are invalid: a zero spline term.

The sparse path's touched-pair table has two readings below: per feature (``ukan_pairs``, for the dense-basis
kernels of ``create_graph=True``) and shared by every feature (``ukan_table``, the engine's stencil kernels of
the first-order layer, with each element's window from the pair search).
"""

import functools

import warp as wp

from .._common import SCALARS
from .bspline_family import MAX_SPLINE_ORDER, uniform_frame_basis
from .family import EdgeFamily, linear_u_dx3

__all__ = ["CELL_LIMIT", "ukan_family", "ukan_frame_of", "ukan_locate_func", "ukan_pairs_family",
           "ukan_pairs_frame_of", "ukan_table_family", "ukan_table_frame_of", "window_codec"]

CELL_LIMIT = float(2**39)  # |x / h| is clamped here: |g| < 2^39, so keys and g - 1 fit comfortably in int64


@functools.lru_cache(maxsize=None)
def ukan_frame(scalar_name: str):
    """The runtime parameters of a UKAN range table: each feature's lowest touched group, h, and the groups
    the table holds per feature."""

    @wp.struct
    class UKANFrame:
        group_lo: wp.array(dtype=wp.int64)
        h: wp.float64
        inv_h: wp.float64  # 1 / h, from the host: a float64 division less per element and kernel
        n_groups: int  # Rt: the table holds C_{lo-1} .. C_{lo+Rt-2} of each feature

    return UKANFrame


@functools.lru_cache(maxsize=None)
def ukan_locate_func(order: int, scalar_name: str):
    """``@wp.func (x, h) -> (valid, g, r, u, sloped)``: the group, offset and local coordinate of x on the
    unbounded grid (float64 arithmetic); sloped is 0 for inputs clamped to the cell limit."""
    scalar = SCALARS[scalar_name]
    K = order + 1
    limit = wp.float64(CELL_LIMIT)
    # separate constants per type: converting the int constant K inside a function (wp.int64(K)) retypes it
    # for the rest of the function in Warp 1.19
    K64 = wp.int64(K)
    zero = scalar(0.0)

    @wp.func
    def unbounded_cell(x: scalar, h: wp.float64):
        s = wp.float64(x) / h
        sloped = int(1)
        if wp.isnan(s):
            return int(0), wp.int64(0), int(0), zero, int(0)
        if s > limit:
            s = limit
            sloped = 0
        if s < -limit:
            s = -limit
            sloped = 0
        cf = wp.floor(s)
        u = scalar(s - cf)
        c = wp.int64(cf)
        g = c // K64  # floor division by a constant (a multiply and shifts), not a float64 division
        r = int(c - g * K64)
        return int(1), g, r, u, sloped

    return unbounded_cell


def _ukan_family(order: int, scalar_name: str) -> EdgeFamily:
    scalar = SCALARS[scalar_name]
    K = order + 1
    Frame = ukan_frame(scalar_name)
    unbounded_cell = ukan_locate_func(order, scalar_name)
    basis, basis_du, basis_du2, basis_du3 = uniform_frame_basis(Frame, order, scalar_name)
    zero = scalar(0.0)

    # locate is written out in each table family (range, pairs): one builder calling a per-table window function
    # measured 4-12% slower UKAN training steps on the H200 (the range path's tiled kernels)
    @wp.func
    def locate(frame: Frame, n: int, i: int, x: scalar):
        valid, g, r, u, sloped = unbounded_cell(x, frame.h)
        slot = int(0)
        if valid:
            # the window of group g reads C_{g-1} and C_g: both in the table while g <= lo + Rt - 2
            offset = g - frame.group_lo[i]
            if offset < wp.int64(0) or offset > wp.int64(frame.n_groups - 2):
                valid = 0
            else:
                slot = int(offset) * K + r
        du_dx = wp.where(sloped == 1, scalar(frame.inv_h), zero)
        return valid, slot, wp.where(valid == 1, u, zero), du_dx, zero

    return EdgeFamily(f"ukan_range_k{order}_{scalar_name}", scalar_name, K, 0, Frame, locate, basis, basis_du,
                      basis_du2, basis_du3=basis_du3, u_dx3=linear_u_dx3(scalar_name))


def _check_key(order: int, scalar_name: str) -> None:
    """A UKAN family's compile key, checked: ValueError / TypeError naming the bad argument."""
    if not 1 <= order <= MAX_SPLINE_ORDER:
        raise ValueError(f"spline_order must be in [1, {MAX_SPLINE_ORDER}], got {order}")
    if scalar_name not in SCALARS:
        raise TypeError(f"scalar type must be one of {sorted(SCALARS)}, got {scalar_name}")


@functools.lru_cache(maxsize=None)
def ukan_family(order: int, scalar_name: str = "float32") -> EdgeFamily:
    """The UKAN edge family of one (order, scalar type)."""
    _check_key(order, scalar_name)
    return _ukan_family(order, scalar_name)


def ukan_frame_of(group_lo: "wp.array", h: float, n_groups: int, scalar_name: str):
    """The frame value of a range table of ``n_groups`` groups per feature, ``group_lo - 1 ..``."""
    frame = ukan_frame(scalar_name)()
    frame.group_lo = group_lo
    frame.h = float(h)
    frame.inv_h = 1.0 / float(h)  # correctly rounded, as the division in float64 on the device
    frame.n_groups = int(n_groups)
    return frame


# ------------------------------------------------------------------------------ the touched-pair table
# The sparse path's table holds the touched (feature, group) pairs, sorted by feature then group, K rows a pair.
# Read per feature (pair t of feature i is its row first[i] + t, padded to the longest feature's count), the
# cell's window is the K rows from (t of group g - 1) K + r: the slot. locate finds t by a binary search of the
# feature's groups. The engine's dense-basis kernels, and so create_graph=True, read the table through this
# family; the first-order layer reads it shared (ukan_table, below), each element's window from the sort.

@functools.lru_cache(maxsize=None)
def ukan_pairs_frame(scalar_name: str):
    @wp.struct
    class UKANPairsFrame:
        pair_group: wp.array(dtype=wp.int64)  # the group of every used table row, sorted within a feature
        first: wp.array(dtype=wp.int32)  # each feature's first row
        count: wp.array(dtype=wp.int32)  # and its number of rows
        h: wp.float64
        inv_h: wp.float64  # 1 / h (see UKANFrame)

    return UKANPairsFrame


def _ukan_pairs_family(order: int, scalar_name: str) -> EdgeFamily:
    scalar = SCALARS[scalar_name]
    K = order + 1
    Frame = ukan_pairs_frame(scalar_name)
    unbounded_cell = ukan_locate_func(order, scalar_name)
    basis, basis_du, basis_du2, basis_du3 = uniform_frame_basis(Frame, order, scalar_name)
    zero = scalar(0.0)

    @wp.func
    def locate(frame: Frame, n: int, i: int, x: scalar):
        valid, g, r, u, sloped = unbounded_cell(x, frame.h)
        slot = int(0)
        if valid:
            # the first of the feature's pairs whose group is >= g - 1
            target = g - wp.int64(1)
            first = frame.first[i]
            lo = int(0)
            hi = frame.count[i]
            while lo < hi:
                mid = (lo + hi) // 2
                if frame.pair_group[first + mid] < target:
                    lo = mid + 1
                else:
                    hi = mid
            # the window reads the rows of g - 1 and g: both are in the table when x's pair was kept
            if lo + 1 < frame.count[i] and frame.pair_group[first + lo] == target:
                slot = lo * K + r
            else:
                valid = 0
        du_dx = wp.where(sloped == 1, scalar(frame.inv_h), zero)
        return valid, slot, wp.where(valid == 1, u, zero), du_dx, zero

    return EdgeFamily(f"ukan_pairs_k{order}_{scalar_name}", scalar_name, K, 0, Frame, locate, basis, basis_du,
                      basis_du2, basis_du3=basis_du3, u_dx3=linear_u_dx3(scalar_name))


@functools.lru_cache(maxsize=None)
def ukan_pairs_family(order: int, scalar_name: str = "float32") -> EdgeFamily:
    """The UKAN edge family of the touched-pair table, per feature, of one (order, scalar type)."""
    _check_key(order, scalar_name)
    return _ukan_pairs_family(order, scalar_name)


def ukan_pairs_frame_of(pair_group: "wp.array", first: "wp.array", count: "wp.array", h: float, scalar_name: str):
    """The frame value of a touched-pair table read per feature (see :func:`ukan_pairs_family`)."""
    frame = ukan_pairs_frame(scalar_name)()
    frame.pair_group = pair_group
    frame.first = first
    frame.count = count
    frame.h = float(h)
    frame.inv_h = 1.0 / float(h)
    return frame


# ------------------------------------------------------------------------------ the touched-pair table, shared
# The sparse path's own reading of the same table: one table [capacity K, out] shared by every input (each
# input's pairs are its own rows), and each element's window start and local coordinate found once by the pair
# pass (warpkan.kernels.ukan), so that locate reads them at (n, i) instead of searching. The rows of a window,
# those of C_{g-1} and C_g, belong to the input of the row of C_g: slot // K + 1.

@functools.lru_cache(maxsize=None)
def window_codec():
    """(encode_window, decode_window): an element's window code, as the pair pass writes it. w >= 0 a window
    start; -1 no spline term (NaN, a pair past the table's capacity); w <= -2 the window -2 - w of an input
    clamped to the cell limit (zero spline derivative)."""

    @wp.func
    def encode_window(start: int, sloped: int):
        if sloped:
            return start
        return -2 - start

    @wp.func
    def decode_window(w: int):
        """(valid, start, sloped)"""
        if w >= 0:
            return int(1), w, int(1)
        if w == -1:
            return int(0), int(0), int(0)
        return int(1), -2 - w, int(0)

    return encode_window, decode_window


@functools.lru_cache(maxsize=None)
def ukan_table_frame(scalar_name: str):
    scalar = SCALARS[scalar_name]

    @wp.struct
    class UKANTableFrame:
        window: wp.array2d(dtype=wp.int32)  # [N, in]: each element's window code (window_codec)
        local_u: wp.array2d(dtype=scalar)  # [N, in]: its local coordinate
        pair_feature: wp.array(dtype=wp.int32)  # [capacity]: the input owning each table row
        inv_h: wp.float64  # 1 / h (see UKANFrame)

    return UKANTableFrame


def _ukan_table_family(order: int, scalar_name: str) -> EdgeFamily:
    scalar = SCALARS[scalar_name]
    K = order + 1
    Frame = ukan_table_frame(scalar_name)
    decode_window = window_codec()[1]
    basis, basis_du, basis_du2, basis_du3 = uniform_frame_basis(Frame, order, scalar_name)
    zero = scalar(0.0)

    @wp.func
    def locate(frame: Frame, n: int, i: int, x: scalar):
        valid, start, sloped = decode_window(frame.window[n, i])
        u = zero
        du_dx = zero
        if valid:
            u = frame.local_u[n, i]
            if sloped:
                du_dx = scalar(frame.inv_h)
        return valid, start, u, du_dx, zero

    @wp.func
    def slot_input(frame: Frame, slot: int):
        return frame.pair_feature[slot // K + 1]

    return EdgeFamily(f"ukan_table_k{order}_{scalar_name}", scalar_name, K, 0, Frame, locate, basis, basis_du,
                      basis_du2, basis_du3=basis_du3, u_dx3=linear_u_dx3(scalar_name), slot_input=slot_input)


@functools.lru_cache(maxsize=None)
def ukan_table_family(order: int, scalar_name: str = "float32") -> EdgeFamily:
    """The UKAN edge family of the shared touched-pair table, of one (order, scalar type)."""
    _check_key(order, scalar_name)
    return _ukan_table_family(order, scalar_name)


def ukan_table_frame_of(window: "wp.array", local_u: "wp.array", pair_feature: "wp.array", h: float,
                        scalar_name: str):
    """The frame value of the shared touched-pair table (see :func:`ukan_table_family`)."""
    frame = ukan_table_frame(scalar_name)()
    frame.window = window
    frame.local_u = local_u
    frame.pair_feature = pair_feature
    frame.inv_h = 1.0 / float(h)
    return frame


# The families' builders and every compile key, as :mod:`.registry` lists them.
_VARIANTS = [dict(order=order, scalar_name=scalar) for order in range(1, MAX_SPLINE_ORDER + 1) for scalar in SCALARS]
FAMILIES = {"ukan": (ukan_family, _VARIANTS), "ukan_pairs": (ukan_pairs_family, _VARIANTS),
            "ukan_table": (ukan_table_family, _VARIANTS)}
