"""The edge engine (warpkan/kernels/edge/): each family's locate/basis maths against float64 references with
derivatives, the registry's modules (every one builds on the CPU, at most six a layer configuration), and the
size of the functions of the whole kernels package (warpkan/kernels/, the engine included).

The end-to-end checks of the engine's kernels against the B-spline torch reference are in test_bspline.py.
"""

import ast
import dataclasses
import functools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import warp as wp

from warpkan.kernels.edge import registry, tiled
from warpkan.kernels._modules import load
from warpkan.kernels.edge._values import edge_values
from warpkan.kernels.edge.bspline_family import bspline_frame_of
from warpkan.kernels.edge.dense import dense_kernels
from warpkan.kernels.edge.family import basis_dx2
from warpkan.kernels.edge.stencil import combine_rows_kernel, stencil_kernels
from warpkan.kernels.edge.ukan_family import CELL_LIMIT, ukan_frame_of
from warpkan.reference import ukan as ukan_reference
from warpkan.reference.bspline import b_splines

KERNELS_DIR = Path(__file__).resolve().parents[1] / "warpkan" / "kernels"
EDGE_DIR = KERNELS_DIR / "edge"
ALL_FAMILIES = registry.families()
BSPLINE_FAMILIES = registry.families("bspline")
UKAN_FAMILIES = registry.families("ukan")
TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64}
# float64: agreement to rounding, relative to the quantity's largest magnitude; float32: within FP32_FACTOR x
# the error the float32 reference itself makes against float64, plus FP32_FLOOR of the magnitude
RTOL64 = 1e-13  # measured: at most 5e-15
FP32_FACTOR, FP32_FLOOR = 8.0, 1e-6
MAX_MODULES_PER_LAYER = 6
MAX_FUNCTION_LINES = 120


def _key(family):
    return family.key


# ----------------------------------------------------------------------------------------------------------------
# A test kernel per family: locate, the three basis functions, the chain rule, and the engine's guarded pieces
# ----------------------------------------------------------------------------------------------------------------

# vecs[q, n, i, m] for q:
B, DB_DU, D2B_DU2, B_BASIS, B_BASIS_DU, DB_BASIS_DU, B_CHAIN, DB_DX, D2B_DX2 = range(9)
GUARDED_B0, GUARDED_B1, GUARDED_DB1, GUARDED_B2, GUARDED_DB2, GUARDED_D2B2 = range(9, 15)
N_VECS = 15
# ints[q, n, i]: locate's valid and slot, then (valid, slot) of slot_at, bases_at, bases_dx_at, bases_dx2_at
N_INTS = 10
# scalars[q, n, i]: u, du_dx, d2u_dx2
N_SCALARS = 3


@functools.cache
def _values_kernel(family):
    scalar, Frame, K = family.scalar, family.Frame, family.n_bases
    locate, basis, basis_du, basis_du2 = family.locate, family.basis, family.basis_du, family.basis_du2
    chain = basis_dx2(family)
    values = edge_values(family)
    slot_at, bases_at, bases_dx_at, bases_dx2_at = (values.slot_at, values.bases_at, values.bases_dx_at,
                                                     values.bases_dx2_at)

    @wp.kernel(enable_backward=False, module=f"test_edge_values_{family.key}")
    def edge_values_kernel(frame: Frame, x: wp.array2d(dtype=scalar), ints: wp.array3d(dtype=wp.int32),
                           scalars: wp.array3d(dtype=scalar), vecs: wp.array4d(dtype=scalar)):
        n, i = wp.tid()
        xv = x[n, i]
        valid, slot, u, du_dx, d2u_dx2 = locate(frame, n, i, xv)
        b, db, d2b = basis_du2(frame, i, slot, u)
        b_basis = basis(frame, i, slot, u)
        b_basis_du, db_basis_du = basis_du(frame, i, slot, u)
        b_chain, db_dx, d2b_dx2 = chain(frame, i, slot, u, du_dx, d2u_dx2)
        valid0, slot0 = slot_at(frame, n, i, xv)
        valid1, slot1, g_b1 = bases_at(frame, n, i, xv)
        valid2, slot2, g_b2, g_db2 = bases_dx_at(frame, n, i, xv)
        valid3, slot3, g_b3, g_db3, g_d2b3 = bases_dx2_at(frame, n, i, xv)
        ints[0, n, i] = valid
        ints[1, n, i] = slot
        ints[2, n, i] = valid0
        ints[3, n, i] = slot0
        ints[4, n, i] = valid1
        ints[5, n, i] = slot1
        ints[6, n, i] = valid2
        ints[7, n, i] = slot2
        ints[8, n, i] = valid3
        ints[9, n, i] = slot3
        scalars[0, n, i] = u
        scalars[1, n, i] = du_dx
        scalars[2, n, i] = d2u_dx2
        for m in range(K):
            vecs[0, n, i, m] = b[m]
            vecs[1, n, i, m] = db[m]
            vecs[2, n, i, m] = d2b[m]
            vecs[3, n, i, m] = b_basis[m]
            vecs[4, n, i, m] = b_basis_du[m]
            vecs[5, n, i, m] = db_basis_du[m]
            vecs[6, n, i, m] = b_chain[m]
            vecs[7, n, i, m] = db_dx[m]
            vecs[8, n, i, m] = d2b_dx2[m]
            vecs[9, n, i, m] = g_b1[m]
            vecs[10, n, i, m] = g_b2[m]
            vecs[11, n, i, m] = g_db2[m]
            vecs[12, n, i, m] = g_b3[m]
            vecs[13, n, i, m] = g_db3[m]
            vecs[14, n, i, m] = g_d2b3[m]

    return edge_values_kernel


@dataclasses.dataclass
class Located:
    """What the test kernel wrote, as float64/int64 torch tensors."""

    ints: torch.Tensor  # [N_INTS, N, in]
    scalars: torch.Tensor  # [N_SCALARS, N, in]
    vecs: torch.Tensor  # [N_VECS, N, in, K]

    @property
    def valid(self):
        return self.ints[0]

    @property
    def slot(self):
        return self.ints[1]


def _run_values(family, frame, x: np.ndarray) -> Located:
    n_rows, n_in = x.shape
    kernel = _values_kernel(family)
    xs = wp.array(x, dtype=family.scalar, device="cpu")
    ints = wp.full((N_INTS, n_rows, n_in), -7, dtype=wp.int32, device="cpu")
    scalars = wp.full((N_SCALARS, n_rows, n_in), float("nan"), dtype=family.scalar, device="cpu")
    vecs = wp.full((N_VECS, n_rows, n_in, family.n_bases), float("nan"), dtype=family.scalar, device="cpu")
    wp.launch(kernel, dim=(n_rows, n_in), inputs=[frame, xs, ints, scalars, vecs], device="cpu")
    return Located(torch.from_numpy(ints.numpy()).long(), torch.from_numpy(scalars.numpy()).double(),
                   torch.from_numpy(vecs.numpy()).double())


def _check_engine_plumbing(family, out: Located):
    """What every family must satisfy whatever its maths: valid is 0/1, slots are >= 0 and 0 when invalid, the
    engine's guarded pieces agree with locate and the basis functions where valid and are zero where not, the
    three basis functions agree on b (and db/du), and the chain rule is dB/dx = du_dx db/du,
    d2B/dx2 = du_dx^2 d2b/du2 + d2u_dx2 db/du."""
    valid, slot = out.valid, out.slot
    assert set(valid.unique().tolist()) <= {0, 1}
    assert (slot >= 0).all()
    assert (slot[valid == 0] == 0).all(), "invalid inputs must have slot 0"
    for q in range(2, N_INTS, 2):
        assert torch.equal(out.ints[q], valid), f"guarded piece {q // 2 - 1}: valid differs from locate's"
        assert torch.equal(out.ints[q + 1], slot), f"guarded piece {q // 2 - 1}: slot differs from locate's"
    ok = valid.bool()
    v = out.vecs[:, ok]  # [N_VECS, n_valid, K]
    tol = 64 * torch.finfo(TORCH_DTYPES[family.scalar_name]).eps

    def scale(t):
        return tol * max(1.0, t.abs().max().item()) if t.numel() else 0.0

    for q, name in ((B_BASIS, "basis"), (B_BASIS_DU, "basis_du's b"), (B_CHAIN, "basis_dx2's b"),
                    (GUARDED_B0, "bases_at"), (GUARDED_B1, "bases_dx_at's b"), (GUARDED_B2, "bases_dx2_at's b")):
        assert (v[q] - v[B]).abs().max().item() <= scale(v[B]), f"{name} differs from basis_du2's b"
    assert (v[DB_BASIS_DU] - v[DB_DU]).abs().max().item() <= scale(v[DB_DU]), "basis_du's db differs"
    du_dx, d2u_dx2 = out.scalars[1][ok].unsqueeze(-1), out.scalars[2][ok].unsqueeze(-1)
    want_dx = du_dx * v[DB_DU]
    want_dx2 = du_dx * du_dx * v[D2B_DU2] + d2u_dx2 * v[DB_DU]
    assert (v[DB_DX] - want_dx).abs().max().item() <= scale(want_dx), "basis_dx2: dB/dx != du_dx db/du"
    assert (v[D2B_DX2] - want_dx2).abs().max().item() <= scale(want_dx2), "basis_dx2: wrong d2B/dx2"
    for q in (GUARDED_DB1, GUARDED_DB2):
        assert (v[q] - v[DB_DX]).abs().max().item() <= scale(v[DB_DX]), "guarded dB/dx differs from the chain rule"
    assert (v[GUARDED_D2B2] - v[D2B_DX2]).abs().max().item() <= scale(v[D2B_DX2]), "guarded d2B/dx2 differs"
    off = out.vecs[GUARDED_B0:, ~ok]
    assert torch.equal(off, torch.zeros_like(off)), "the engine's bases must be zero for invalid inputs"


def _check_partition_of_unity(family, out: Located):
    """Inside the grid the K bases of a slot sum to 1, and their u- and x-derivatives to 0."""
    ok = out.valid.bool()
    assert ok.any()
    v = out.vecs[:, ok]
    tol = 16 * torch.finfo(TORCH_DTYPES[family.scalar_name]).eps  # measured: at most 3 eps
    for q, want, name in ((B, 1.0, "sum b"), (DB_DU, 0.0, "sum db/du"), (D2B_DU2, 0.0, "sum d2b/du2"),
                          (DB_DX, 0.0, "sum dB/dx"), (D2B_DX2, 0.0, "sum d2B/dx2")):
        err = (v[q].sum(-1) - want).abs().max().item()
        bound = tol * max(1.0, v[q].abs().max().item())
        assert err <= bound, f"{family.key}: {name} off by {err:.3e} (bound {bound:.3e})"


def _compare(family, name, ours, ref64, ref32_err, mask):
    """ours vs the float64 reference on mask: float64 to rounding, float32 within FP32_FACTOR x the float32
    reference's own error (``ref32_err``, its largest error against float64 over the same entries)."""
    ours, ref64 = ours[mask], ref64[mask]
    assert torch.isfinite(ref64).all(), f"{name}: reference not finite"
    err = (ours - ref64).abs().max().item() if ours.numel() else 0.0
    scale = ref64.abs().max().item() if ours.numel() else 0.0
    if family.scalar_name == "float64":
        bound = RTOL64 * max(1.0, scale)
    else:
        bound = FP32_FACTOR * ref32_err + FP32_FLOOR * max(1.0, scale)
    assert err <= bound, f"{family.key}: {name} error {err:.3e} > {bound:.3e} (float32 reference's own {ref32_err:.3e})"


# ----------------------------------------------------------------------------------------------------------------
# B-spline families against warpkan.reference.bspline.b_splines (float64, autograd for d/dx and d2/dx2)
# ----------------------------------------------------------------------------------------------------------------


def _bspline_reference(x, grid, order):
    """(b, dB/dx, d2B/dx2) [N, in, G + k] of b_splines at x [N, in] in x's dtype, by autograd (create_graph
    twice); zero outside [t_0, t_last) and for NaN."""
    inside = (x >= grid[:, 0]) & (x < grid[:, -1])
    xs = torch.where(inside, x, grid[:, 0].expand_as(x)).detach().requires_grad_()
    b = b_splines(xs, grid, order)
    db, d2b = [], []
    for j in range(b.shape[-1]):
        (g1,) = torch.autograd.grad(b[..., j].sum(), xs, create_graph=True)
        g2 = None
        if g1.requires_grad:
            (g2,) = torch.autograd.grad(g1.sum(), xs, retain_graph=True, allow_unused=True)
        db.append(g1.detach())
        d2b.append(torch.zeros_like(g1) if g2 is None else g2.detach())
    keep = inside.unsqueeze(-1)
    zero = torch.zeros((), dtype=x.dtype)
    return tuple(torch.where(keep, t, zero) for t in (b.detach(), torch.stack(db, -1), torch.stack(d2b, -1)))


def _cells(x, grid):
    """(valid, cell) of x [N, in] on the knots grid [in, n_knots], right-continuous as b_splines is."""
    n_cells = grid.shape[1] - 1
    cell = torch.stack([torch.searchsorted(grid[i].contiguous(), x[:, i].contiguous(), right=True) - 1
                        for i in range(grid.shape[0])], dim=1)
    valid = (cell >= 0) & (cell < n_cells) & ~torch.isnan(x)
    return valid.long(), torch.where(valid, cell, torch.zeros_like(cell))


def _bspline_grid(case, n_in, grid_size, order, dtype):
    """Knots [in, G + 2k + 1]: uniform (per input: [-1, 1], a dyadic spacing, a shifted interval) or with
    random spacing (0.3 .. 1.7 of the mean), float64 rounded to dtype."""
    n_knots = grid_size + 2 * order + 1
    gen = torch.Generator().manual_seed(1000 * grid_size + order)
    rows = []
    for i in range(n_in):
        lo, hi = [(-1.0, 1.0), (-0.75, -0.75 + 0.5 * grid_size), (0.3, 2.9)][i % 3]
        h = (hi - lo) / grid_size
        if case == "uniform":
            rows.append(torch.arange(-order, grid_size + order + 1, dtype=torch.float64) * h + lo)
        else:
            steps = h * (0.3 + 1.4 * torch.rand(n_knots - 1, generator=gen, dtype=torch.float64))
            rows.append(lo - order * h + torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(steps, 0)]))
    return torch.stack(rows).to(dtype)


N_RANDOM = 40  # random points first, then the knots


def _bspline_points(grid, seed):
    """x [N, in] in grid's dtype: random points over the grid and past both ends, every knot, NaN, +-inf, far
    off the grid, and the neighbours of both ends."""
    gen = torch.Generator().manual_seed(seed)
    g64 = grid.double()
    t0, t_last = g64[:, 0], g64[:, -1]
    span = t_last - t0
    rand = t0 - 0.25 * span + 1.5 * span * torch.rand(N_RANDOM, grid.shape[0], generator=gen, dtype=torch.float64)
    rand = rand.to(grid.dtype)
    knots = grid.t().contiguous()
    inf = torch.tensor(float("inf"), dtype=grid.dtype)
    special = torch.stack([
        torch.full_like(grid[:, 0], float("nan")), torch.full_like(grid[:, 0], float("inf")),
        torch.full_like(grid[:, 0], -float("inf")), grid[:, 0] - 1000.0, grid[:, -1] + 1000.0,
        torch.nextafter(grid[:, 0], -inf), torch.nextafter(grid[:, -1], -inf), torch.nextafter(grid[:, 0], inf),
    ])
    return torch.cat([rand, knots, special])


def _reference_points(x, grid, out: Located):
    """Where to evaluate the reference: x, except within rounding of a knot, where the engine may take the cell on
    either side (its uniform locate scales x - t_0 instead of comparing with the knot): there the side of the
    knot the engine took (the knot itself, or its float64 predecessor), asserted to be one of the two."""
    x64, g64 = x.double(), grid.double()
    eps = torch.finfo(x.dtype).eps
    tol = 16 * eps * (g64.abs().amax(1) + (g64[:, -1] - g64[:, 0]))  # [in]
    dist = (x64.unsqueeze(-1) - g64.unsqueeze(0)).abs()  # [N, in, n_knots]
    dist = torch.where(torch.isnan(dist), torch.full_like(dist, float("inf")), dist)
    nearest = dist.argmin(-1)
    knot = torch.gather(g64.unsqueeze(0).expand(x.shape[0], -1, -1), 2, nearest.unsqueeze(-1)).squeeze(-1)
    near = dist.amin(-1) <= tol
    left = torch.nextafter(knot, torch.tensor(-float("inf"), dtype=torch.float64))
    engine = (out.valid, out.slot)
    pick = x64.clone()
    for candidate in (left, knot):
        valid, cell = _cells(candidate, g64)
        match = near & (valid == engine[0]) & (cell == engine[1])
        pick = torch.where(match, candidate, pick)
    valid, cell = _cells(pick, g64)
    bad = (valid != out.valid) | (cell != out.slot)
    assert not bad.any(), (f"locate disagrees with the knots at x = {x64[bad][:5].tolist()}: engine (valid, slot) "
                           f"{list(zip(out.valid[bad][:5].tolist(), out.slot[bad][:5].tolist()))}, reference "
                           f"{list(zip(valid[bad][:5].tolist(), cell[bad][:5].tolist()))}")
    return pick


def _gather_bases(ref, slot, order, n_bases):
    """ref [N, in, G + k] at the engine's bases of each slot: [N, in, K] and where a basis has a coefficient."""
    j = slot.unsqueeze(-1) - order + torch.arange(n_bases)
    has = (j >= 0) & (j < ref.shape[-1])
    return torch.gather(ref, 2, j.clamp(0, ref.shape[-1] - 1)), has


BSPLINE_CASES = [("uniform", 1), ("uniform", 5), ("uniform", 7), ("random", 1), ("random", 5), ("random", 7)]


@pytest.mark.parametrize("family", BSPLINE_FAMILIES, ids=_key)
def test_bspline_family_matches_float64_reference(family):
    """locate and the bases (with d/du, d2/du2 and the chain-rule x-derivatives) of every B-spline family
    against b_splines in float64 with autograd derivatives, on awkward grid sizes, uniform and (general grids
    only) random knots; x on every knot, off the grid both sides, NaN and +-inf."""
    key = registry.key_of(family)
    order, uniform = key["order"], key["uniform"]
    dtype = TORCH_DTYPES[family.scalar_name]
    K = family.n_bases
    assert K == order + 1 and family.first == -order
    n_in = 3
    cases = [(case, grid_size) for case, grid_size in BSPLINE_CASES if case == "uniform" or not uniform]
    assert cases
    for case, grid_size in cases:
        grid = _bspline_grid(case, n_in, grid_size, order, dtype)
        x = _bspline_points(grid, seed=grid_size + 10 * order)
        frame = bspline_frame_of(wp.array(grid.numpy(), dtype=family.scalar, device="cpu"))
        out = _run_values(family, frame, x.numpy())
        _check_engine_plumbing(family, out)
        _check_partition_of_unity(family, out)
        g64 = grid.double()
        n_cells = g64.shape[1] - 1
        assert (out.slot < n_cells).all()

        x_ref = _reference_points(x, grid, out)  # also checks valid and slot
        if case == "uniform":
            # input 1 has a dyadic spacing: every locate is exact on its knots, so x on a knot lies in the cell
            # the knot opens (t_0 valid, t_last off the grid), with no rounding to excuse
            on_knots = slice(N_RANDOM, N_RANDOM + g64.shape[1])
            valid, cell = _cells(x[on_knots, 1:2].double(), g64[1:2])
            assert valid[0].item() == 1 and valid[-1].item() == 0
            assert torch.equal(out.valid[on_knots, 1:2], valid) and torch.equal(out.slot[on_knots, 1:2], cell), (
                f"G={grid_size}: on the knots of a dyadic grid, engine (valid, slot) "
                f"{list(zip(out.valid[on_knots, 1].tolist(), out.slot[on_knots, 1].tolist()))}")
        off = torch.isnan(x) | (x.double() < g64[:, 0]) | (x.double() >= g64[:, -1])
        near_end = (x.double() - g64[:, -1]).abs() <= 16 * torch.finfo(dtype).eps * g64.abs().amax(1)
        assert (out.valid[off & ~near_end] == 0).all(), "off-grid and NaN inputs must be invalid"

        ref64 = _bspline_reference(x_ref, g64, order)
        ref32 = _bspline_reference(x, grid, order) if dtype == torch.float32 else None
        ref64_at_x = _bspline_reference(x.double(), g64, order) if ref32 is not None else None
        ok = out.valid.bool()
        # the local coordinate and its chain-rule factors
        u, du_dx, d2u_dx2 = out.scalars[0][ok], out.scalars[1][ok], out.scalars[2][ok]
        assert (d2u_dx2 == 0).all()
        t0, t_last = g64[:, 0].expand_as(x_ref)[ok], g64[:, -1].expand_as(x_ref)[ok]
        if uniform:
            inv_h = n_cells / (t_last - t0)
            u_want = (x_ref[ok] - t0) * inv_h - out.slot[ok]
            tol_u = 64 * torch.finfo(dtype).eps * n_cells
            assert (u >= 0).all() and (u <= 1).all()
            assert (u - u_want).abs().max().item() <= tol_u
            assert ((du_dx - inv_h).abs() <= 8 * torch.finfo(dtype).eps * inv_h).all()
        else:
            assert torch.equal(u, x.double()[ok]) and (du_dx == 1).all()
        # bases and derivatives, where a basis has a coefficient
        du_dx_ref = (n_cells / (g64[:, -1] - g64[:, 0])).expand_as(x_ref).unsqueeze(-1) if uniform else 1.0
        ours_of = {"b": (B, 1), "dB/dx": (DB_DX, 1), "d2B/dx2": (D2B_DX2, 1), "db/du": (DB_DU, du_dx_ref),
                   "d2b/du2": (D2B_DU2, du_dx_ref * du_dx_ref)}
        for r, names in enumerate((("b",), ("dB/dx", "db/du"), ("d2B/dx2", "d2b/du2"))):
            want, has = _gather_bases(ref64[r], out.slot, order, K)
            mask = has & ok.unsqueeze(-1)
            assert mask.any()
            ref32_err = 0.0
            if ref32 is not None:
                ref32_err = (ref32[r].double() - ref64_at_x[r]).abs().max().item()
            for name in names:
                q, factor = ours_of[name]
                _compare(family, f"{case} G={grid_size} {name}", out.vecs[q] * factor, want, ref32_err, mask)


# ----------------------------------------------------------------------------------------------------------------
# UKAN: a cardinal B-spline on knots at multiples of h, read through each feature's window of groups
# ----------------------------------------------------------------------------------------------------------------

H = 0.3  # not a power of two: x / h rounds


def _cardinal_bases(u, order):
    """(b, db/du, d2b/du2) [..., K] of the uniform B-spline with unit knots at u in [0, 1): the bases
    B_{c-k} .. B_c of cell c in the local coordinate, from b_splines on the knots -k .. k + 1 (G = 1)."""
    flat = u.reshape(-1, 1)
    grid = torch.arange(-order, order + 2, dtype=u.dtype).unsqueeze(0)
    b, db, d2b = _bspline_reference(flat, grid, order)
    return tuple(t.reshape(*u.shape, order + 1) for t in (b, db, d2b))


def _ukan_reference(x, order, group_lo, n_groups):
    """valid, slot, u (float64), du_dx, ((b, db/du, d2b/du2) float64, the same from float32 u when x is
    float32) of warpkan.reference.ukan.locate plus the window: valid iff x is not NaN and
    0 <= g - group_lo[i] <= n_groups - 2; slot = (g - group_lo[i]) K + r."""
    K = order + 1
    not_nan, g, r, _u_io, _du_dx = ukan_reference.locate(x, H, order)
    s = torch.where(torch.isnan(x.double()), 0.0, x.double() / H)
    # du_dx in float64 here: the reference's own is a float32 value (torch.where of two Python floats)
    du_dx = torch.where(s.abs() <= CELL_LIMIT, torch.tensor(1.0 / H, dtype=torch.float64), 0.0)
    s = s.clamp(-CELL_LIMIT, CELL_LIMIT)
    u64 = s - torch.floor(s)
    offset = g - group_lo.unsqueeze(0)
    valid = not_nan & (offset >= 0) & (offset <= n_groups - 2)
    slot = torch.where(valid, offset * K + r, torch.zeros_like(offset))
    ref64 = _cardinal_bases(u64, order)
    ref32 = None
    if x.dtype == torch.float32:  # u rounded to float32 (kept below 1: the float32 engine's cell stays c)
        u32 = torch.minimum(u64.float(), torch.tensor(1.0 - 2.0 ** -24))
        ref32 = _cardinal_bases(u32, order)
    return valid.long(), slot, u64, du_dx, ref64, ref32


def _ukan_points(group_lo, order, n_groups, dtype, seed):
    """x [N, in]: random over the groups group_lo - 2 .. group_lo + n_groups (inside and outside each window),
    every cell boundary of the window, NaN, +-inf and |x| / h around and beyond 2^39."""
    K = order + 1
    gen = torch.Generator().manual_seed(seed)
    lo = group_lo.double()
    n_in = group_lo.shape[0]
    rand = (lo - 2) * K + (n_groups + 3) * K * torch.rand(48, n_in, generator=gen, dtype=torch.float64)
    edges = ((group_lo - 1) * K).unsqueeze(0) + torch.arange(n_groups * K + 1).unsqueeze(1)
    limit = CELL_LIMIT
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), limit, -limit, limit + 12345.5,
                            -limit - 12345.5, 4 * limit, -4 * limit, limit - 2.5, -limit + 2.5, 0.0, -0.5 / K],
                           dtype=torch.float64)
    x = torch.cat([rand, edges.double(), special.unsqueeze(1).expand(-1, n_in)]) * H
    return x.to(dtype)


@pytest.mark.parametrize("n_groups", [2, 4])
@pytest.mark.parametrize("family", UKAN_FAMILIES, ids=_key)
def test_ukan_family_matches_float64_reference(family, n_groups):
    """UKAN's locate (group, offset, window of each feature's table, clamp at 2^39 cells with a zero slope) and
    bases with derivatives against the reference locate and the cardinal B-spline in float64."""
    order = registry.key_of(family)["order"]
    K = family.n_bases
    dtype = TORCH_DTYPES[family.scalar_name]
    assert K == order + 1 and family.first == 0
    assert CELL_LIMIT == ukan_reference.CELL_LIMIT
    top = math.floor(CELL_LIMIT) // K  # the group of the cell limit
    bottom = -math.floor(CELL_LIMIT) // K
    # features: around 0, negative, the window's top offset at +limit, its bottom offset at -limit
    group_lo = torch.tensor([0, -3, top - (n_groups - 2), bottom], dtype=torch.int64)
    x = _ukan_points(group_lo, order, n_groups, dtype, seed=10 * order + n_groups)
    frame = ukan_frame_of(wp.array(group_lo.numpy(), dtype=wp.int64, device="cpu"), H, n_groups,
                          family.scalar_name)
    out = _run_values(family, frame, x.numpy())
    _check_engine_plumbing(family, out)
    _check_partition_of_unity(family, out)

    valid, slot, u64, du_dx, ref64, ref32 = _ukan_reference(x, order, group_lo, n_groups)
    assert torch.equal(out.valid, valid), f"valid differs at x = {x[out.valid != valid][:5].tolist()}"
    assert torch.equal(out.slot, slot), f"slot differs at x = {x[out.slot != slot][:5].tolist()}"
    assert (out.slot < family.n_slots(n_groups * K)).all()  # slot + m stays in the table of n_groups K coefs
    ok = valid.bool()
    # every kind of point is there: valid on each feature, invalid by the window, NaN, clamped and valid
    assert ok.any(0).all() and (~ok & ~torch.isnan(x)).any()
    clamped = x.double().abs() / H > CELL_LIMIT
    assert (ok & clamped).any() and (ok & ~clamped).any()
    # u, du_dx (0 past the cell limit), d2u_dx2
    tol_u = 4 * torch.finfo(dtype).eps
    assert (out.scalars[0][ok] - u64[ok]).abs().max().item() <= tol_u
    assert (out.scalars[0][ok] >= 0).all() and (out.scalars[0][ok] <= 1).all()
    assert (out.scalars[0][~ok] == 0).all()
    assert (out.scalars[1][ok & clamped] == 0).all(), "past 2^39 cells the slope must be zero"
    assert torch.allclose(out.scalars[1][ok & ~clamped], torch.full_like(du_dx[ok & ~clamped], 1.0 / H),
                          rtol=8 * torch.finfo(dtype).eps, atol=0)
    assert torch.allclose(du_dx[ok], out.scalars[1][ok], rtol=8 * torch.finfo(dtype).eps, atol=0)
    assert (out.scalars[2] == 0).all()
    # bases: in u, and in x by the chain rule (du_dx from the reference: 1 / h, or 0 when clamped)
    mask = ok.unsqueeze(-1).expand(-1, -1, K)
    dudx = du_dx.unsqueeze(-1)
    for r, (q_u, q_x) in enumerate(((B, B_CHAIN), (DB_DU, DB_DX), (D2B_DU2, D2B_DX2))):
        ref32_err = (ref32[r].double() - ref64[r]).abs().max().item() if ref32 is not None else 0.0
        _compare(family, f"{['b', 'db/du', 'd2b/du2'][r]}", out.vecs[q_u], ref64[r], ref32_err, mask)
        factor = dudx ** r
        _compare(family, f"{['b', 'dB/dx', 'd2B/dx2'][r]}", out.vecs[q_x], ref64[r] * factor,
                 ref32_err * (1.0 / H) ** r, mask)


# ----------------------------------------------------------------------------------------------------------------
# The registry: every module builds on the CPU, at most six a layer configuration
# ----------------------------------------------------------------------------------------------------------------


def test_registry_lists_distinct_families():
    keys = [family.key for family in ALL_FAMILIES]
    assert len(keys) == len(set(keys)), "two registered families share a compile key"
    assert set(registry.family_names()) >= {"bspline", "ukan"}
    assert BSPLINE_FAMILIES and UKAN_FAMILIES
    for family in ALL_FAMILIES:
        assert family.key.isidentifier(), f"{family.key!r} is not safe in a module name"
        assert family.scalar_name in TORCH_DTYPES
        assert registry.key_of(family)  # built through the registry


def test_module_names_belong_to_one_family():
    """Apart from the combine of row-chunked sums (one module per scalar type, shared by every key), no Warp
    module of one compile key is a module of another."""
    owner = {}
    for family in ALL_FAMILIES:
        shared = combine_rows_kernel(family.scalar_name).module.name
        for name in {build.name for build in registry.family_modules(family, is_cuda=True)}:
            if name == shared:
                continue
            assert owner.setdefault(name, family.key) == family.key, f"{name}: {owner[name]} and {family.key}"


@pytest.mark.parametrize("family", ALL_FAMILIES, ids=_key)
def test_every_registered_variant_builds_on_cpu(family):
    builds = registry.family_modules(family, is_cuda=False)
    names = [build.name for build in builds]
    assert names and len(names) == len(set(names))
    for build in builds:
        load(build, "cpu")
        name = build.name
        module = wp.get_module(name)
        assert module.kernels, f"{name}: no kernels"


def _table_sizes(family):
    """(kind, n_coef) of tables of each kind on CUDA, the shortest and the longest of a kind: 'whole' (one table
    serves both passes), 'banded' (a pass goes in bands; float32 only), 'none' (the shortest with no tiled plan:
    per-thread kernels)."""
    first, last = {}, {}
    if family.single_slot:  # one slot: the plan depends on K alone, and a table holds at most K coefficients
        fwd, bwd = tiled.forward_plan(family, True, 1), tiled.backward_plan(family, True, 1)
        kind = "none" if fwd is None and bwd is None else ("whole" if fwd and bwd else "partial")
        return [(kind, 1), (kind, family.n_bases)]
    shortest = family.n_bases  # at least one stencil's coefficients
    while family.n_slots(shortest) < 1:
        shortest += 1
    for n_coef in range(shortest, 20000):
        fwd, bwd = tiled.forward_plan(family, True, n_coef), tiled.backward_plan(family, True, n_coef)
        if fwd is None and bwd is None:
            kind = "none"
        elif (fwd is not None and fwd.banded) or (bwd is not None and bwd.banded):
            kind = "banded"
        elif fwd is not None and bwd is not None:
            kind = "whole"
        else:
            continue
        first.setdefault(kind, n_coef)
        last[kind] = n_coef
        if kind == "none":
            break
    return sorted({(kind, n) for kind in first for n in (first[kind], last[kind])})


def _kernels_of(kernels) -> list:
    return [getattr(kernels, f.name) for f in dataclasses.fields(kernels)
            if isinstance(getattr(kernels, f.name), wp.Kernel)]


@pytest.mark.parametrize("family", ALL_FAMILIES, ids=_key)
def test_layer_builds_at_most_six_modules(family):
    sizes = _table_sizes(family)
    kinds = {kind for kind, _ in sizes}
    if family.shared_table:  # never tiled, no dense basis
        assert kinds == {"none"}
    elif not family.single_slot:
        assert {"whole", "none"} <= kinds
        assert ("banded" in kinds) == (family.scalar_name == "float32")
    basis_dtypes = [None] + (["bfloat16"] if family.scalar_name == "float32" and not family.shared_table else [])
    for kind, n_coef in sizes:
        for is_cuda in (True, False):
            for basis_dtype in basis_dtypes:
                builds = registry.layer_modules(family, n_coef, is_cuda, basis_dtype)
                names = [build.name for build in builds]
                where = f"{family.key} {kind} n_coef={n_coef} cuda={is_cuda} basis={basis_dtype}"
                assert len(names) <= MAX_MODULES_PER_LAYER, f"{where}: {len(names)} modules {names}"
                assert len(names) == len(set(names)), where
                # the modules the layer's kernels live in are among them, and each name is a built module
                expected = {k.module.name for k in _kernels_of(stencil_kernels(family))}
                if not family.shared_table:
                    dense = dense_kernels(family, basis_dtype or family.scalar_name)
                    expected |= {k.module.name for k in _kernels_of(dense)}
                expected.add(combine_rows_kernel(family.scalar_name).module.name)
                assert expected <= set(names), f"{where}: {expected - set(names)} missing"
                tiled_names = set(names) - expected
                assert bool(tiled_names) == (is_cuda and kind != "none"), where
                for name in names:
                    module = wp.get_module(name)
                    assert module.kernels, f"{where}: {name} is not a module with kernels"
                    assert all(k.module.name == name for k in module.kernels.values())


# ----------------------------------------------------------------------------------------------------------------
# Function size
# ----------------------------------------------------------------------------------------------------------------


def _long_functions(path: Path, limit: int, root: "Path | None" = None) -> list[str]:
    """The functions (nested ones included) of the file over ``limit`` lines, named by the file's path relative
    to ``root`` (default: its name), line and name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    where = path.relative_to(root).as_posix() if root is not None else path.name
    return [f"{where}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > limit]


def test_long_functions_are_found(tmp_path):
    source = "def outer():\n" + "    x = 1\n" * 5 + "    def inner():\n" + "        y = 2\n" * 3 + "    return x\n"
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert _long_functions(path, 11) == []
    assert _long_functions(path, 10) == ["probe.py:1 outer (11 lines)"]
    assert _long_functions(path, 3) == ["probe.py:1 outer (11 lines)", "probe.py:7 inner (4 lines)"]


def test_kernel_functions_are_short():
    # every function of the kernels package keeps to the limit: a builder of many kernels assembles them from
    # small cached factories, one per kernel or small group of @wp.funcs (see rational.py, ukan.py, geglu.py)
    files = sorted(KERNELS_DIR.rglob("*.py"))
    names = {path.relative_to(KERNELS_DIR).as_posix() for path in files}
    assert {"edge/stencil.py", "edge/family.py", "rational.py", "ukan.py", "geglu.py", "_common.py"} <= names
    assert len(files) >= 20
    long = [entry for path in files for entry in _long_functions(path, MAX_FUNCTION_LINES, KERNELS_DIR)]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


# ----------------------------------------------------------------------------------------------------------------
# The bfloat16 dense basis two rows a thread: the same bits as the one-row kernels
# ----------------------------------------------------------------------------------------------------------------
def _pair_layers():
    from warpkan.torch_bridge import KANLinear, PolyKANLinear, UKANLinear

    return {
        "bspline G5 k3 (both pair kernels)": lambda: KANLinear(7, 3, grid_size=5, spline_order=3),
        "bspline G12 k2 (expansion only)": lambda: KANLinear(5, 2, grid_size=12, spline_order=2),
        "chebyshev degree 6, no base": lambda: PolyKANLinear(6, 3, 6, mode="exact"),
        "fourier lut degree 4": lambda: PolyKANLinear(3, 2, 4, basis="fourier"),
        "ukan dense range, fixed table": lambda: UKANLinear(4, 3, grid_delta=0.4, pe_dim=4, embed_dim=3, hidden_dim=8,
                                                             table_groups=4),
    }


@pytest.mark.parametrize("n_rows", [1, 2, 37, 64, 130])
@pytest.mark.parametrize("name", list(_pair_layers()))
def test_bf16_row_pair_kernels_match_one_row_kernels(device, monkeypatch, name, n_rows):
    """The bf16 expansion and contraction two rows a thread (``expand_basis_pairs``, ``contract_basis_grad_pairs``)
    against the one-row kernels, bit for bit, on x with out-of-range, inf and NaN entries and a basis gradient
    with non-finite entries (inside and outside rows' windows); odd row counts keep the one-row kernels."""
    from warpkan.kernels.edge import launch as edge_launch
    from warpkan.kernels.edge.dense import dense_width
    from warpkan.torch_bridge._common import to_warp

    torch.manual_seed(n_rows)
    layer = _pair_layers()[name]().to(device)
    x = torch.randn(n_rows, layer.in_features, device=device) * 1.5
    x.view(-1)[::11] = 40.0
    x.view(-1)[3::13] = float("nan")
    x.view(-1)[5::17] = float("-inf")
    spec = layer.edge_view(x).spec
    frame = spec.make_frame(*(to_warp(t) for t in spec.frame_tensors), *spec.frame_config)
    width = dense_width(x.shape[1], spec.n_coef, spec.use_base)
    g = torch.randn(width, n_rows, device=device).bfloat16()
    g.view(-1)[::23] = float("inf")
    g.view(-1)[7::29] = float("nan")
    x_wp = to_warp(x)
    if x.is_cuda:  # torch's stream has written x and g; Warp launches on its own
        torch.cuda.synchronize()
    pairable = edge_launch._bf16_row_pairs(to_warp(torch.empty(width, n_rows, dtype=torch.bfloat16, device=device)))
    assert (pairable is not None) == (n_rows % 2 == 0)

    def run(pairs: bool):
        monkeypatch.setattr(edge_launch, "BF16_ROW_PAIRS", pairs)
        basis_t = torch.empty(width, n_rows, dtype=torch.bfloat16, device=device)
        dx = torch.empty_like(x)
        edge_launch.launch_expand_basis(spec.family, frame, x_wp, spec.n_coef, to_warp(basis_t), spec.use_base)
        edge_launch.launch_contract_basis_grad(spec.family, frame, x_wp, spec.n_coef, to_warp(g), to_warp(dx),
                                               spec.use_base)
        wp.synchronize()
        return basis_t.view(torch.int16), dx

    (basis_one, dx_one), (basis_two, dx_two) = run(False), run(True)
    assert torch.equal(basis_one, basis_two)
    # every value equal, NaN where NaN (whose sign bit, meaningless, may differ)
    torch.testing.assert_close(dx_two, dx_one, rtol=0, atol=0, equal_nan=True)
    assert not torch.isfinite(dx_two).all()  # the non-finite entries reached some dx
