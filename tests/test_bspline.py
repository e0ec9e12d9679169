"""B-spline KAN: Warp kernels against the float64 reference written from the formulas."""

import numpy as np

import pytest
import torch
import warp as wp

import warpkan
from warpkan.kernels import bspline as kb
from warpkan.kernels.edge import tiled as kbt
from warpkan.reference.bspline import b_splines, kan_linear
from warpkan.reference.efficient_kan import EfficientKANLinear
from warpkan.torch_bridge import KANLinear, bspline_kan, edge_backward, edge_forward
from warpkan.torch_bridge.bspline_ops import bspline_spec

# Tolerances per dtype: float64 kernels agree with the reference to rounding; float32 results are held to a
# small multiple of the error the float32 reference itself makes against float64 (see _check_fp32).
TOL64 = dict(rtol=1e-10, atol=1e-11)

def _family(order, scalar="float32", uniform=True):
    return kb.family_of(order, uniform, scalar)


def _plan(which, is_cuda, scalar, n_coef, order):
    """A tiled table plan of the B-spline family (plans depend on K and the padding, not the grid kind)."""
    return getattr(kbt, which)(_family(order, scalar), is_cuda, n_coef)


def _tiled_backward(dy, arrays, order, uniform, use_base, grads, **kwargs):
    x, grid, wb, ss, coef = arrays
    dx, dwb, dss, dcoef = grads
    return kbt.launch_tiled_backward(_family(order, wp.types.type_repr(x.dtype), uniform), kb.frame_of(grid), dy, x,
                                     wb, ss, coef, use_base, dx=dx, d_base_weight_t=dwb, d_scaler_t=dss,
                                     d_coef=dcoef, **kwargs)



def _grid(n_in, grid_size, order, lo=-1.0, hi=1.0, dtype=torch.float64, perturb=0.0, seed=0):
    h = (hi - lo) / grid_size
    knots = (torch.arange(-order, grid_size + order + 1, dtype=dtype) * h + lo).expand(n_in, -1).contiguous()
    if perturb:
        gen = torch.Generator().manual_seed(seed)
        knots = knots + perturb * h * torch.rand(knots.shape, generator=gen, dtype=dtype)
        knots = torch.sort(knots, dim=1)[0]
    return knots


def _params(n_out, n_in, n_coef, dtype=torch.float64, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=gen, dtype=dtype).to(device)  # noqa: E731
    return make(n_out, n_in), make(n_out, n_in, n_coef), make(n_out, n_in)


def _torch_device(device):
    return torch.device("cuda" if device == "cuda" else "cpu")


def _fwd_bwd(fn, x, params, dy):
    x = x.detach().clone().requires_grad_()
    params = [p.detach().clone().requires_grad_() for p in params]
    y = fn(x, *params)
    y.backward(dy)
    return y.detach(), [x.grad] + [p.grad for p in params]


@pytest.mark.parametrize("order", [1, 2, 3, 4, 5])
def test_uniform_basis_matrix_matches_cox_de_boor(order):
    u = torch.linspace(0, 1, 17, dtype=torch.float64)[:-1]
    M = torch.tensor(kb.uniform_basis_matrix(order), dtype=torch.float64)
    powers = torch.stack([u**p for p in range(order + 1)], dim=1)
    local = powers @ M  # [points, k+1]: B_{c-k+m} on cell c
    # cell c = order of a long uniform grid (all of B_0..B_order live there)
    grid = _grid(1, 4 * order + 2, order, lo=0.0, hi=4 * order + 2.0)
    x = grid[0, 2 * order] + u  # inside cell 2k of the extended grid
    full = b_splines(x.unsqueeze(1), grid, order)[:, 0, :]
    expected = full[:, order : 2 * order + 1]  # bases B_{c-k}..B_c with c = 2k
    torch.testing.assert_close(local, expected, rtol=0, atol=1e-13)
    torch.testing.assert_close(local.sum(1), torch.ones_like(u), rtol=0, atol=1e-13)  # partition of unity


@pytest.mark.parametrize("order", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("uniform", [True, False])
@pytest.mark.parametrize("strategy", ["stencil", "gemm"])
def test_forward_and_all_gradients_float64(device, order, uniform, strategy):
    n_rows, n_in, n_out, grid_size = 29, 7, 5, 7  # primes
    tdev = _torch_device(device)
    grid = _grid(n_in, grid_size, order, perturb=0.0 if uniform else 0.4).to(tdev)
    gen = torch.Generator().manual_seed(order)
    # x ~ 1.6 N(0,1): covers the grid, its extension and beyond (zero spline term there)
    x = (1.6 * torch.randn(n_rows, n_in, generator=gen, dtype=torch.float64)).to(tdev)
    params = _params(n_out, n_in, grid_size + order, device=tdev)
    dy = torch.randn(n_rows, n_out, generator=gen, dtype=torch.float64).to(tdev)
    ours = lambda x, wb, sw, ss: bspline_kan(x, grid, wb, sw, ss, order, uniform, strategy=strategy)  # noqa: E731
    ref = lambda x, wb, sw, ss: kan_linear(x, grid, wb, sw, ss, order)  # noqa: E731
    y, grads = _fwd_bwd(ours, x, params, dy)
    y_ref, grads_ref = _fwd_bwd(ref, x, params, dy)
    torch.testing.assert_close(y, y_ref, **TOL64)
    for name, g, g_ref in zip(["x", "base_weight", "spline_weight", "spline_scaler"], grads, grads_ref):
        torch.testing.assert_close(g, g_ref, **TOL64, msg=lambda m: f"d{name}: {m}")


def _check_fp32(ours32, ref32, ref64, name, factor=8.0):
    """float32 error against float64 must be within ``factor`` x the float32 reference's own error."""
    err = (ours32.double() - ref64).abs().max().item()
    ref_err = (ref32.double() - ref64).abs().max().item()
    scale = ref64.abs().max().item()
    assert err <= factor * ref_err + 1e-6 * scale, f"{name}: error {err:.3e} vs reference's own {ref_err:.3e}"


@pytest.mark.parametrize("uniform", [True, False])
@pytest.mark.parametrize("strategy", ["stencil", "gemm"])
@pytest.mark.parametrize("grid_size", [11, 300])  # 300: on CUDA the stencil's backward pass goes in bands
def test_float32_error_is_at_reference_level(device, uniform, strategy, grid_size):
    order, n_rows, n_in, n_out = 3, 257, 19, 23
    tdev = _torch_device(device)
    grid64 = _grid(n_in, grid_size, order, perturb=0.0 if uniform else 0.4).to(tdev)
    gen = torch.Generator().manual_seed(5)
    x64 = (1.3 * torch.randn(n_rows, n_in, generator=gen, dtype=torch.float64)).to(tdev)
    p64 = _params(n_out, n_in, grid_size + order, device=tdev)
    dy64 = torch.randn(n_rows, n_out, generator=gen, dtype=torch.float64).to(tdev)
    to32 = lambda t: t.float()  # noqa: E731
    grid32 = to32(grid64)
    y64, g64 = _fwd_bwd(lambda x, *p: kan_linear(x, grid64, *p, order), x64, p64, dy64)
    y32r, g32r = _fwd_bwd(lambda x, *p: kan_linear(x, grid32, *p, order), to32(x64), [to32(p) for p in p64], to32(dy64))
    y32, g32 = _fwd_bwd(lambda x, *p: bspline_kan(x, grid32, *p, order, uniform, strategy=strategy), to32(x64), [to32(p) for p in p64], to32(dy64))
    _check_fp32(y32, y32r, y64, "y")
    for name, a, b, c in zip(["x", "base_weight", "spline_weight", "spline_scaler"], g32, g32r, g64):
        _check_fp32(a, b, c, "d" + name)


@pytest.mark.parametrize("order,uniform", [(1, True), (3, True), (3, False), (5, False)])
@pytest.mark.parametrize("strategy", ["stencil", "gemm"])
def test_gradcheck_float64(device, order, uniform, strategy):
    tdev = _torch_device(device)
    n_in, n_out, grid_size = 3, 2, 4
    grid = _grid(n_in, grid_size, order, perturb=0.0 if uniform else 0.3).to(tdev)
    gen = torch.Generator().manual_seed(1)
    # keep samples off knots: gradcheck's finite differences must not straddle a kink (k=1)
    x = (torch.rand(2, 3, n_in, generator=gen, dtype=torch.float64) * 1.6 - 0.8).to(tdev).requires_grad_()
    params = [p.requires_grad_() for p in _params(n_out, n_in, grid_size + order, device=tdev, seed=2)]
    fn = lambda x, wb, sw, ss: bspline_kan(x, grid, wb, sw, ss, order, uniform, strategy=strategy)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, *params), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 3, 1, 2), (5, 1, 3, 1), (13, 17, 31, 19), (2, 3, 5, 37)])
@pytest.mark.parametrize("strategy", ["stencil", "gemm"])
def test_awkward_sizes_and_grid_sizes(device, shape, strategy):
    n_rows, n_in, n_out, grid_size = shape
    order = 3
    tdev = _torch_device(device)
    grid = _grid(n_in, grid_size, order).to(tdev)
    x = (1.2 * torch.randn(n_rows, n_in, dtype=torch.float64)).to(tdev)
    params = _params(n_out, n_in, grid_size + order, device=tdev)
    dy = torch.randn(n_rows, n_out, dtype=torch.float64).to(tdev)
    y, grads = _fwd_bwd(lambda x, *p: bspline_kan(x, grid, *p, order, True, strategy=strategy), x, params, dy)
    y_ref, grads_ref = _fwd_bwd(lambda x, *p: kan_linear(x, grid, *p, order), x, params, dy)
    torch.testing.assert_close(y, y_ref, **TOL64)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, **TOL64)


@pytest.mark.parametrize("n_out", [1, 5, 12, 37, 256])
@pytest.mark.parametrize("use_base", [True, False])
@pytest.mark.parametrize("uniform", [True, False])
def test_bucketed_parameter_gradients_float64(device, use_base, uniform, n_out):
    """Well-filled buckets (many rows per cell, so many entries per flush) through the fused bucketed kernel (dx and every parameter
    gradient in one pass, per-cell flushes). The output counts cover each way its dx is summed on the GPU:
    one output tile (1, 5: lanes of a power-of-two group, plain store), 10 tiles (37: no group, an atomic per
    thread) and 64 tiles (256: whole-warp groups, an atomic per warp); 12 outputs take the 16-byte loads
    with the forward's last 8-output tile half past the end."""
    order, n_in, grid_size = 2, 3, 4
    n_rows = 40 * (grid_size + 2 * order + 2)
    tdev = _torch_device(device)
    grid = _grid(n_in, grid_size, order, perturb=0.0 if uniform else 0.3).to(tdev)
    gen = torch.Generator().manual_seed(11)
    x = (1.4 * torch.randn(n_rows, n_in, generator=gen, dtype=torch.float64)).to(tdev)
    wb, sw, ss = _params(n_out, n_in, grid_size + order, device=tdev)
    dy = torch.randn(n_rows, n_out, generator=gen, dtype=torch.float64).to(tdev)
    base = wb if use_base else None
    ours = lambda x, sw, ss: bspline_kan(x, grid, base, sw, ss, order, uniform, strategy="stencil")  # noqa: E731
    ref = lambda x, sw, ss: kan_linear(x, grid, wb, sw, ss, order, use_base=use_base)  # noqa: E731
    y, grads = _fwd_bwd(ours, x, [sw, ss], dy)
    y_ref, grads_ref = _fwd_bwd(ref, x, [sw, ss], dy)
    torch.testing.assert_close(y, y_ref, **TOL64)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, **TOL64)
    if use_base:
        _, (_, g_base) = _fwd_bwd(lambda x, wb: bspline_kan(x, grid, wb, sw, ss, order, uniform, strategy="stencil"), x, [wb], dy)
        _, (_, g_base_ref) = _fwd_bwd(lambda x, wb: kan_linear(x, grid, wb, sw, ss, order), x, [wb], dy)
        torch.testing.assert_close(g_base, g_base_ref, **TOL64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the warp-tiled kernels run on CUDA only")
@pytest.mark.parametrize("tiled", [True, False])
@pytest.mark.parametrize("shape", [
    (1, 1, 1, 1, 1, True, True),          # one row, one edge
    (1000, 7, 37, 5, 3, True, True),      # two output tiles (dx by atomics), many row chunks, partial last step
    (513, 3, 70, 20, 1, False, False),    # three output tiles, non-uniform grid, no base path
    (300, 5, 32, 75, 5, True, True),      # G + 3k = 90: the largest float32 table class
    (97, 4, 33, 81, 5, True, True),       # G + 3k = 96 rows: the capacity exactly (float64 takes per-thread)
    (200, 3, 32, 39, 3, True, True),      # G + 3k = 48 and 80: the smaller float32 capacities exactly
    (150, 2, 40, 65, 5, False, True),
    (4099, 2, 31, 13, 2, False, True),    # a masked lane in the only tile
])
@pytest.mark.parametrize("deterministic", [False, True])
def test_tiled_and_per_thread_kernels_cuda_float64(shape, tiled, deterministic):
    """The kernel launchers on CUDA, both kernel families, against the float64 reference: forward and every
    gradient, with NaN and off-grid rows, padded row steps, masked output lanes and several row chunks."""
    n_rows, n_in, n_out, grid_size, order, uniform, use_base = shape
    for dtype, tol in ((torch.float64, TOL64), (torch.float32, None)):
        applies = kb.tiled_applies(wp.zeros((1, 1), dtype=wp.float64 if dtype == torch.float64 else wp.float32,
                                            device="cuda"), wp.zeros((1, grid_size + order, 1), device="cuda"), order)
        if tiled and not applies:
            continue
        if tiled and deterministic and n_out > 32:
            continue  # refused (see test_tiled_refusals_cuda)
        gen = torch.Generator().manual_seed(n_rows)
        grid = _grid(n_in, grid_size, order, perturb=0.0 if uniform else 0.3)
        x = 0.8 * torch.randn(n_rows, n_in, generator=gen, dtype=torch.float64)
        x[::7, 0] = float("nan")
        x[::5, -1] = 3.0  # off the grid
        wb, sw, ss = _params(n_out, n_in, grid_size + order, seed=n_in)
        dy = torch.randn(n_rows, n_out, generator=gen, dtype=torch.float64)
        ref = lambda x, wb, sw, ss: kan_linear(x, grid, wb, sw, ss, order, use_base=use_base)  # noqa: E731
        y_ref, (dx_ref, dwb_ref, dsw_ref, dss_ref) = _fwd_bwd(ref, x, [wb, sw, ss], dy)
        cuda = lambda t: t.to(device="cuda", dtype=dtype).contiguous()  # noqa: E731
        arrays = [wp.from_torch(cuda(t)) for t in (x, grid, wb.T, ss.T, sw.permute(1, 2, 0))]
        y = torch.empty(n_rows, n_out, dtype=dtype, device="cuda")
        kb.launch_forward(*arrays, wp.from_torch(y), order, uniform, use_base, tiled=tiled)
        grads = [torch.zeros(shape, dtype=dtype, device="cuda") for shape in
                 ((n_rows, n_in), (n_in, n_out), (n_in, n_out), (n_in, grid_size + order, n_out))]
        kb.launch_backward(wp.from_torch(cuda(dy)), *arrays, order, uniform, use_base, *map(wp.from_torch, grads),
                           deterministic=deterministic, tiled=tiled)
        runs = [grads]
        if tiled:  # overwrite mode (what the torch op runs): NaN-filled buffers, set rather than added into
            stale = [torch.full_like(g, float("nan")) for g in grads]
            _tiled_backward(wp.from_torch(cuda(dy)), arrays, order, uniform, use_base,
                            list(map(wp.from_torch, stale)), deterministic=deterministic, overwrite=True)
            runs.append(stale)
        refs = [y_ref, dx_ref, dwb_ref if use_base else torch.zeros(n_out, n_in, dtype=torch.float64), dsw_ref, dss_ref]
        for run in runs:
            ours = [y, run[0], run[1].T, run[3].permute(2, 0, 1), run[2].T]
            for name, a, b in zip(("y", "dx", "d_base_weight", "d_spline_weight", "d_spline_scaler"), ours, refs):
                if tol is None:  # float32 against float64: a few float32 roundings of the sums of magnitudes
                    scale = b.abs().nan_to_num(0).amax().item() + 1e-30
                    torch.testing.assert_close(a.double().cpu(), b, rtol=0, atol=2e-5 * scale, equal_nan=True, msg=name)
                else:
                    torch.testing.assert_close(a.cpu(), b, **tol, equal_nan=True, msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the warp-tiled kernels run on CUDA only")
@pytest.mark.parametrize("shape", [
    (600, 3, 32, 200, 3, True, True, 48, 5),     # five bands of 45 cells, one output tile (dx stored)
    (300, 2, 40, 700, 3, True, True, 80, 10),    # few rows a band: a short queue walked at the end, two tiles
    (2000, 2, 33, 150, 5, False, True, 48, 4),   # non-uniform grid, k = 5, a masked lane in the second tile
    (5000, 1, 16, 120, 1, True, False, 48, 3),   # k = 1, no base path, full queues (transpose dx)
    (400, 2, 32, 354, 3, True, True, 48, 8),     # the 48-row table's most bands while the 80-row one fits
    # the 80-row table's most bands; non-uniform, as the uniform path's fp32 cell coordinate (x - t0) / h
    # itself errs by ~G ulp here: dx 7x (per-thread kernels) to 9x (tiled) the float32 reference's own error
    (257, 1, 8, 2304, 3, False, True, 80, 30),
    (700, 1, 12, 600, 5, True, True, 48, 15),    # k = 5: the 80-row table does not fit, the 48-row one goes on
])
def test_banded_backward_cuda_float64(shape):
    """The tiled passes on bands of cells (grids past the whole-table capacity), float32 against the float64
    reference with the float32 reference's own error as yardstick: the forward (banded where its plan reaches)
    and every gradient, with NaN and off-grid rows (band 0 adds their base term), accumulated and in
    overwrite mode into NaN-filled buffers; deterministic calls take the bucketed kernels."""
    n_rows, n_in, n_out, grid_size, order, uniform, use_base, capacity, n_bands = shape
    plan = _plan("backward_plan", True, "float32", grid_size + order, order)
    assert plan is not None and (plan.capacity, plan.n_bands) == (capacity, n_bands) and plan.banded
    assert _plan("backward_plan", True, "float64", grid_size + order, order) is None
    gen = torch.Generator().manual_seed(n_rows)
    grid = _grid(n_in, grid_size, order, perturb=0.0 if uniform else 0.3)
    x = 0.7 * torch.randn(n_rows, n_in, generator=gen, dtype=torch.float64)
    x[::7, 0] = float("nan")
    x[::5, -1] = -3.0  # off the grid
    wb, sw, ss = _params(n_out, n_in, grid_size + order, seed=n_in)
    dy = torch.randn(n_rows, n_out, generator=gen, dtype=torch.float64)
    # the float32 reference's own error is the yardstick: dx carries B' ~ 1/h, so its float32 error grows
    # with G (about 3e-5 of its largest value at G = 200)
    refs, y_refs = {}, {}
    for dtype in (torch.float64, torch.float32):
        grid_d = grid.to(dtype)
        ref = lambda x, wb, sw, ss: kan_linear(x, grid_d, wb, sw, ss, order, use_base=use_base)  # noqa: E731
        y_refs[dtype], grads = _fwd_bwd(ref, x.to(dtype), [t.to(dtype) for t in (wb, sw, ss)], dy.to(dtype))
        if not use_base:
            grads[1] = torch.zeros(n_out, n_in, dtype=dtype)
        refs[dtype] = grads
    cuda = lambda t: t.to(device="cuda", dtype=torch.float32).contiguous()  # noqa: E731
    arrays = [wp.from_torch(cuda(t)) for t in (x, grid, wb.T, ss.T, sw.permute(1, 2, 0))]
    shapes = ((n_rows, n_in), (n_in, n_out), (n_in, n_out), (n_in, grid_size + order, n_out))
    # the forward pass on bands of its longer tables where they reach, else the per-thread kernel
    forward = _plan("forward_plan", True, "float32", grid_size + order, order)
    y = torch.empty(n_rows, n_out, dtype=torch.float32, device="cuda")
    kb.launch_forward(*arrays, wp.from_torch(y), order, uniform, use_base, tiled=forward is not None)
    y = y.cpu()
    assert torch.equal(y.isnan(), y_refs[torch.float64].isnan())
    kept = ~y.isnan()
    _check_fp32(y[kept], y_refs[torch.float32][kept], y_refs[torch.float64][kept], "y")
    added = [torch.zeros(s, dtype=torch.float32, device="cuda") for s in shapes]
    kb.launch_backward(wp.from_torch(cuda(dy)), *arrays, order, uniform, use_base, *map(wp.from_torch, added),
                       tiled=True)
    stale = [torch.full(s, float("nan"), dtype=torch.float32, device="cuda") for s in shapes]
    _tiled_backward(wp.from_torch(cuda(dy)), arrays, order, uniform, use_base, list(map(wp.from_torch, stale)),
                    overwrite=True)
    bucketed = [torch.zeros(s, dtype=torch.float32, device="cuda") for s in shapes]
    kb.launch_backward(wp.from_torch(cuda(dy)), *arrays, order, uniform, use_base, *map(wp.from_torch, bucketed),
                       deterministic=True)
    for run in (added, stale, bucketed):
        ours = [run[0], run[1].T, run[3].permute(2, 0, 1), run[2].T]
        for name, a, b32, b64 in zip(("dx", "d_base_weight", "d_spline_weight", "d_spline_scaler"), ours,
                                     refs[torch.float32], refs[torch.float64]):
            a = a.cpu()
            assert torch.equal(a.isnan(), b64.isnan()), name  # NaN rows stay in their rows
            kept = ~b64.isnan()
            if kept.any():
                _check_fp32(a[kept], b32[kept], b64[kept], name)
    with pytest.raises(ValueError, match="one table"):
        kb.launch_backward(wp.from_torch(cuda(dy)), *arrays, order, uniform, use_base, *map(wp.from_torch, added),
                           deterministic=True, tiled=True)


def test_tiled_launchers_refuse_the_cpu():
    x = wp.zeros((4, 2), dtype=wp.float32, device="cpu")
    grid = wp.zeros((2, 11 + 7), dtype=wp.float32, device="cpu")
    coef = wp.zeros((2, 14, 3), dtype=wp.float32, device="cpu")
    w = wp.zeros((2, 3), dtype=wp.float32, device="cpu")
    y = wp.zeros((4, 3), dtype=wp.float32, device="cpu")
    with pytest.raises(ValueError, match="CUDA devices only"):
        kbt.launch_tiled_forward(_family(3), kb.frame_of(grid), x, w, w, coef, None, y)
    with pytest.raises(ValueError, match="CUDA devices only"):
        _tiled_backward(y, [x, grid, w, w, coef], 3, True, True, [None, w, w, coef])


def test_table_plans():
    """Which tables the tiled passes take (no GPU needed: a plan is arithmetic)."""
    assert _plan("forward_plan", True, "float32", 64 + 3, 3) == kbt.TablePlan(80, 1, 70)  # G + 2k cells
    assert _plan("forward_plan", True, "float32", 256 + 3, 3) == kbt.TablePlan(144, 2, 141)  # 262 cells
    assert _plan("forward_plan", True, "float32", 276 + 3, 3) == kbt.TablePlan(144, 2, 141)  # 282 cells
    assert _plan("forward_plan", True, "float32", 277 + 3, 3) is None
    assert _plan("forward_plan", True, "float64", 256 + 3, 3) is None
    whole = _plan("backward_plan", True, "float32", 64 + 3, 3)
    assert (whole.capacity, whole.n_bands, whole.banded) == (80, 1, False)
    banded = _plan("backward_plan", True, "float32", 256 + 3, 3)
    assert (banded.capacity, banded.n_bands, banded.band_cells) == (48, 6, 45)  # 262 cells
    banded = _plan("backward_plan", True, "float32", 355 + 3, 3)
    assert (banded.capacity, banded.n_bands, banded.band_cells) == (80, 5, 77)  # 361 cells: 9 bands of 45
    assert _plan("backward_plan", True, "float32", 2305 + 3, 3) is None  # 31 bands of 77: the bucketed kernels
    assert _plan("backward_plan", True, "float32", 600 + 5, 5) == kbt.TablePlan(48, 15, 43)
    # the 80-row banded table with its records and row queues fits 48 KiB up to k = 3 (ptxas: 49292 bytes at k = 4)
    assert [kbt.banded_backward_fits(_family(k), 80) for k in range(1, 6)] == [True, True, True, False, False]
    assert all(kbt.banded_backward_fits(_family(k), 48) for k in range(1, 6))
    assert _plan("backward_plan", False, "float32", 256 + 3, 3) is None
    assert _plan("backward_plan", True, "float64", 256 + 3, 3) is None
    assert kbt.backward_takes(32, True, True, True, banded=False)
    assert not kbt.backward_takes(32, True, True, False, banded=True)
    assert kbt.backward_takes(64, True, False, True, banded=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the warp-tiled kernels run on CUDA only")
def test_tiled_refusals_cuda():
    x = wp.zeros((4, 2), dtype=wp.float32, device="cuda")
    grid = wp.zeros((2, 2000 + 7), dtype=wp.float32, device="cuda")  # past the banded forward too
    coef = wp.zeros((2, 2003, 40), dtype=wp.float32, device="cuda")
    w = wp.zeros((2, 40), dtype=wp.float32, device="cuda")
    y = wp.zeros((4, 40), dtype=wp.float32, device="cuda")
    with pytest.raises(ValueError, match="capacity"):
        kb.launch_forward(x, grid, w, w, coef, y, 3, True, tiled=True)
    small = wp.zeros((2, 10, 40), dtype=wp.float32, device="cuda")
    grid_small = wp.zeros((2, 14), dtype=wp.float32, device="cuda")
    with pytest.raises(ValueError, match="at most 32 outputs"):
        kb.launch_backward(y, x, grid_small, w, w, small, 3, True, dx=x, d_base_weight_t=w, d_scaler_t=w, d_coef=small,
                           deterministic=True, tiled=True)
    with pytest.raises(ValueError, match="all three parameter gradients"):
        kb.launch_backward(y, x, grid_small, w, w, small, 3, True, dx=x, tiled=True)


def test_gemm_strategy_chunks_rows(device, monkeypatch):
    """Rows are processed in chunks of the dense basis; results do not depend on the chunking."""
    from warpkan.torch_bridge import edge_driver

    order, n_in, n_out, grid_size = 2, 5, 4, 6
    tdev = _torch_device(device)
    grid = _grid(n_in, grid_size, order).to(tdev)
    x = torch.randn(103, n_in, dtype=torch.float64).to(tdev)
    params = _params(n_out, n_in, grid_size + order, device=tdev)
    dy = torch.randn(103, n_out, dtype=torch.float64).to(tdev)
    whole = _fwd_bwd(lambda x, *p: bspline_kan(x, grid, *p, order, True, strategy="gemm"), x, params, dy)
    monkeypatch.setattr(edge_driver, "GEMM_CHUNK_BYTES", 8 * n_in * (grid_size + order) * 10)  # 10 rows
    chunked = _fwd_bwd(lambda x, *p: bspline_kan(x, grid, *p, order, True, strategy="gemm"), x, params, dy)
    torch.testing.assert_close(chunked[0], whole[0], **TOL64)
    for a, b in zip(chunked[1], whole[1]):
        torch.testing.assert_close(a, b, **TOL64)


def test_gemm_chunk_stays_in_cache_on_the_cpu():
    """On the CPU the gemm strategy's chunk of dense basis is at most CPU_GEMM_CHUNK_BYTES, so it stays in cache
    from the expansion kernel to the GEMMs: one chunk of up to 128 MiB made the strategy 2.6x slower at (1024,
    32->32, G=32) and the CPU's "auto" rule pick it where the stencil kernels were faster. CUDA keeps 128 MiB."""
    from warpkan.torch_bridge import edge_driver

    n_rows, width, itemsize = 4096, 32 * 36, 4
    cpu_rows = edge_driver._chunk_rows(n_rows, width, itemsize, is_cuda=False)
    assert 0 < cpu_rows * width * itemsize <= edge_driver.CPU_GEMM_CHUNK_BYTES
    assert edge_driver._chunk_rows(n_rows, width, itemsize, is_cuda=True) == n_rows


def test_auto_strategy_choice():
    from warpkan.torch_bridge import choose_strategy

    assert choose_strategy(65536, 256, 256, 11) == "gemm"
    assert choose_strategy(2**17, 32, 32, 2**18 + 3) == "stencil"
    # where the tiled kernels apply: the shapes of the measurements behind the rule (bspline_ops' constants)
    tiled = dict(tiled_stencil=True)
    assert choose_strategy(2**16, 32, 32, 67, **tiled) == "stencil"  # bench bspline's G=64 rows
    assert choose_strategy(128, 40, 256, 8, **tiled) == "gemm"  # short basis
    assert choose_strategy(128, 784, 32, 24, **tiled) == "gemm"  # a small tiled grid, long walks
    assert choose_strategy(1024, 32, 32, 24, **tiled) == "gemm"  # captured, a small grid: the GPU time
    assert choose_strategy(16384, 32, 32, 24, **tiled) == "stencil"
    assert choose_strategy(65536, 32, 32, 24, **tiled, precision="bf16") == "stencil"
    assert choose_strategy(32768, 64, 256, 24, **tiled) == "stencil"
    assert choose_strategy(32768, 64, 256, 24, **tiled, precision="bf16") == "gemm"
    assert choose_strategy(65536, 32, 32, 44, **tiled, precision="bf16") == "stencil"
    assert choose_strategy(8192, 256, 256, 44, **tiled, precision="bf16") == "gemm"
    assert choose_strategy(32768, 256, 64, 28, **tiled, precision="bf16") == "gemm"  # the KAN-Mixer's way back
    # eager (host-bound) small layers with short walks: the tiled kernels' fewer launches
    eager = dict(tiled, host_bound=True)
    for shape in ((1024, 32, 32, 8), (4096, 64, 64, 8), (128, 32, 10, 8), (128, 40, 256, 8), (1024, 32, 32, 36)):
        assert choose_strategy(*shape, **eager) == "stencil", shape
        assert choose_strategy(*shape, **tiled) == "gemm", shape  # captured: the GPU time
    assert choose_strategy(128, 784, 32, 8, **eager) == "gemm"  # a long walk: the tiled time is the step
    assert choose_strategy(32768, 64, 256, 8, **eager) == "gemm"  # the KAN-Mixer: GPU-bound
    assert choose_strategy(65536, 32, 32, 67, **eager) == "stencil"
    with pytest.raises(ValueError, match="strategy must be one of"):
        KANLinear(3, 2, strategy="fast")


@pytest.mark.parametrize("grid_size", [1, 2**18])
def test_extreme_grid_sizes(device, grid_size):
    order, n_in, n_out = 3, 2, 3
    tdev = _torch_device(device)
    grid = _grid(n_in, grid_size, order).to(tdev)
    x = (torch.rand(11, n_in, dtype=torch.float64) * 2.4 - 1.2).to(tdev)
    params = _params(n_out, n_in, grid_size + order, device=tdev)
    dy = torch.randn(11, n_out, dtype=torch.float64).to(tdev)
    y, grads = _fwd_bwd(lambda x, *p: bspline_kan(x, grid, *p, order, True), x, params, dy)
    y_ref, grads_ref = _fwd_bwd(lambda x, *p: kan_linear(x, grid, *p, order), x, params, dy)
    # at G = 2^18 the knots are 2^-17 apart: the reference's own knot differences lose ~1e-11 relative
    tol = TOL64 if grid_size == 1 else dict(rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(y, y_ref, **tol)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, **tol)


def test_nd_input_and_noncontiguous(device):
    tdev = _torch_device(device)
    layer = KANLinear(6, 4, grid_size=5, dtype=torch.float64).to(tdev)
    base = torch.randn(6, 2, 3, 5, dtype=torch.float64, device=tdev)
    x = base.permute(1, 2, 3, 0)  # (2, 3, 5, 6), not contiguous
    assert not x.is_contiguous()
    y = layer(x)
    assert y.shape == (2, 3, 5, 4)
    ref = kan_linear(x.contiguous(), layer.grid, layer.base_weight, layer.spline_weight, layer.spline_scaler, 3)
    torch.testing.assert_close(y, ref, **TOL64)


def test_contiguous_parameters_same_layer(device):
    """contiguous_parameters only changes storage: same initial values, outputs and gradients."""
    tdev = _torch_device(device)
    layers = []
    for contiguous in (False, True):
        torch.manual_seed(5)
        layers.append(KANLinear(4, 3, grid_size=6, contiguous_parameters=contiguous, dtype=torch.float64).to(tdev))
    views, plain = layers
    assert not views.spline_weight.is_contiguous() and plain.spline_weight.is_contiguous()
    for a, b in zip(views.parameters(), plain.parameters()):
        assert torch.equal(a, b)
    x = torch.randn(9, 4, dtype=torch.float64, device=tdev)
    for layer in layers:
        layer(x).square().sum().backward()
    torch.testing.assert_close(plain(x), views(x), rtol=0, atol=0)
    for a, b in zip(views.parameters(), plain.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


def test_eager_step_has_one_autograd_node_per_layer(eager_step_ops):
    """The eager route makes the kernel-layout views of the parameters (and skips the reshape of 2-D x)
    inside its autograd node: views made outside are nodes of their own (TBackward, PermuteBackward,
    ViewBackward), 10-20 us of host time each on the GPU machine. The gradients keep the parameters'
    strides, so AccumulateGrad takes them without a copy."""
    layer = KANLinear(5, 3, grid_size=4)
    x = torch.rand(7, 5, requires_grad=True)
    ops = eager_step_ops(layer, x, torch.ones(7, 3))
    nodes = {name for name in ops if name.startswith("autograd::engine::evaluate_function")}
    assert nodes == {"autograd::engine::evaluate_function: EagerEdge_kanlinearBackward",
                     "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"}, nodes
    for p in layer.parameters():
        assert p.grad.stride() == p.stride()


def test_nan_row_stays_in_its_row(device):
    tdev = _torch_device(device)
    layer = KANLinear(5, 3, dtype=torch.float64).to(tdev)
    x = torch.randn(7, 5, dtype=torch.float64, device=tdev)
    clean = layer(x)
    x[3, 2] = float("nan")
    dirty = layer(x)
    keep = torch.arange(7, device=tdev) != 3
    assert torch.equal(dirty[keep], clean[keep])
    assert torch.isnan(dirty[3]).all()
    x.requires_grad_()
    layer(x)[keep].sum().backward()
    assert torch.isfinite(x.grad[keep]).all()


def test_out_of_range_gets_zero_spline_term(device):
    tdev = _torch_device(device)
    layer = KANLinear(2, 3, grid_size=4, spline_order=2, base_activation=None, dtype=torch.float64).to(tdev)
    x = torch.tensor([[-5.0, 9.0], [1e30, -1e30], [float("inf"), -float("inf")]], dtype=torch.float64, device=tdev)
    assert torch.equal(layer(x), torch.zeros(3, 3, dtype=torch.float64, device=tdev))


def test_empty_batch(device):
    tdev = _torch_device(device)
    layer = KANLinear(4, 3).to(tdev)
    x = torch.empty(0, 4, device=tdev, requires_grad=True)
    y = layer(x)
    assert y.shape == (0, 3)
    y.sum().backward()
    assert x.grad.shape == (0, 4)
    assert torch.equal(layer.spline_weight.grad, torch.zeros_like(layer.spline_weight))


def test_update_grid_non_uniform_path(device):
    tdev = _torch_device(device)
    torch.manual_seed(0)
    layer = KANLinear(3, 4, grid_size=6, dtype=torch.float64).to(tdev)
    x = (0.5 * torch.randn(400, 3, dtype=torch.float64) + 0.2).to(tdev)
    before = layer(x)
    layer.update_grid(x)
    assert not layer._grid_uniform
    after = layer(x)
    ref = kan_linear(x, layer.grid, layer.base_weight, layer.spline_weight, layer.spline_scaler, 3)
    torch.testing.assert_close(after, ref, **TOL64)
    # the refit preserves the layer's function on the data (spline_scaler applied once)
    assert (after - before).abs().max() < 0.05 * before.abs().max()
    dy = torch.randn_like(after)
    params = [layer.base_weight, layer.spline_weight, layer.spline_scaler]
    _, grads = _fwd_bwd(lambda x, *p: bspline_kan(x, layer.grid, *p, 3, False), x, params, dy)
    _, grads_ref = _fwd_bwd(lambda x, *p: kan_linear(x, layer.grid, *p, 3), x, params, dy)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, **TOL64)


@pytest.mark.parametrize("uniform", [True, False])
def test_deterministic_mode_is_bitwise_reproducible(device, uniform):
    tdev = _torch_device(device)
    order, n_in, n_out, grid_size = 3, 8, 16, 6
    grid = _grid(n_in, grid_size, order, dtype=torch.float32, perturb=0.0 if uniform else 0.3).to(tdev)
    x = (0.7 * torch.randn(3000, n_in)).to(tdev)
    params = [p.float() for p in _params(n_out, n_in, grid_size + order, device=tdev)]
    dy = torch.randn(3000, n_out, device=tdev)
    runs = []
    for deterministic in (True, True, False):
        runs.append(_fwd_bwd(lambda x, *p: bspline_kan(x, grid, *p, order, uniform, deterministic, "stencil"), x, params, dy)[1])
    for a, b in zip(runs[0], runs[1]):
        assert torch.equal(a, b)
    # the default mode: the same sums in another order; over 3000 float32 terms of size ~1 the rounding of
    # the two orders differs by up to ~sqrt(3000) * 2^-24 * 3000 ~ 1e-4 in absolute terms
    for a, c in zip(runs[0], runs[2]):
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-4)


def test_efficient_kan_state_dict_loads_and_matches(device):
    tdev = _torch_device(device)
    torch.manual_seed(3)
    peer = EfficientKANLinear(6, 5, grid_size=7, spline_order=3)
    ours = KANLinear(6, 5, grid_size=7, spline_order=3)
    ours.load_state_dict(peer.state_dict())
    peer, ours = peer.to(tdev), ours.to(tdev)
    x = torch.randn(33, 6, device=tdev)
    torch.testing.assert_close(ours(x), peer(x), rtol=1e-5, atol=1e-5)
    # and back: our state dict is efficient-kan's format
    again = EfficientKANLinear(6, 5, grid_size=7, spline_order=3).to(tdev)
    again.load_state_dict(ours.state_dict())
    torch.testing.assert_close(again(x), ours(x), rtol=1e-5, atol=1e-5)


def test_regularization_loss_matches_efficient_kan():
    torch.manual_seed(4)
    peer = EfficientKANLinear(4, 3)
    ours = KANLinear(4, 3)
    ours.load_state_dict(peer.state_dict())
    l1 = peer.spline_weight.abs().mean(-1)
    p = l1 / l1.sum()
    expected = 0.5 * l1.sum() + 2.0 * -(p * p.log()).sum()
    torch.testing.assert_close(ours.regularization_loss(0.5, 2.0), expected)


def test_bad_input_errors():
    layer = KANLinear(4, 3)
    with pytest.raises(ValueError, match="x must have last dimension 4"):
        layer(torch.randn(5, 3))
    with pytest.raises(TypeError, match="x must have the layer's dtype"):
        layer(torch.randn(5, 4, dtype=torch.float16))
    with pytest.raises(TypeError, match="x must have dtype"):
        bspline_kan(torch.ones(2, 4, dtype=torch.int32), layer.grid, layer.base_weight, layer.spline_weight, layer.spline_scaler, 3, True)
    with pytest.raises(ValueError, match="grid must have shape"):
        bspline_kan(torch.randn(2, 4), layer.grid[:, :-1], layer.base_weight, layer.spline_weight, layer.spline_scaler, 3, True)
    with pytest.raises(ValueError, match="must be on device"):
        bspline_kan(torch.randn(2, 4), layer.grid.to("meta"), layer.base_weight, layer.spline_weight, layer.spline_scaler, 3, True)
    with pytest.raises(ValueError, match="spline_order"):
        KANLinear(4, 3, spline_order=9)
    with pytest.raises(ValueError, match="base_activation"):
        KANLinear(4, 3, base_activation=torch.tanh)  # a function: efficient-kan takes module classes
    with pytest.raises(ValueError, match="x must be on the layer's device"):
        layer(torch.randn(2, 4, device="meta"))
    with pytest.raises(ValueError, match="x must be a wp.array2d"):
        warpkan.KANLinear(4, 3)(wp.zeros((2, 5), dtype=wp.float32))
    # nothing was corrupted: the layer still works
    assert layer(torch.randn(2, 4)).shape == (2, 3)


def test_autocast_bf16(device):
    """Under bf16 autocast: fp32 inputs and parameters, the bf16 GEMM path by default (precision="auto"),
    the exact fp32 result rounded to bf16 with precision="fp32"; the output has the autocast dtype."""
    tdev = _torch_device(device)
    torch.manual_seed(0)
    layer = KANLinear(8, 6, strategy="gemm").to(tdev)
    x = torch.randn(10, 8, device=tdev)
    exact = layer(x)
    with torch.autocast(tdev.type, dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), exact, rtol=2**-6, atol=2**-6)
    layer.precision = "fp32"
    with torch.autocast(tdev.type, dtype=torch.bfloat16):
        y = layer(x)
    torch.testing.assert_close(y, exact.to(torch.bfloat16), rtol=0, atol=0)


def test_auto_precision_follows_torch_matmul_rule():
    from warpkan.torch_bridge.bspline_ops import resolve_precision

    saved = torch.get_float32_matmul_precision()
    cpu = torch.device("cpu")
    try:
        for setting, expected in (("highest", "fp32"), ("high", "tf32"), ("medium", "bf16")):
            torch.set_float32_matmul_precision(setting)
            assert resolve_precision("auto", torch.float32, cpu) == expected
            assert resolve_precision("auto", torch.float64, cpu) == "fp32"
            assert resolve_precision("fp32", torch.float32, cpu) == "fp32"
    finally:
        torch.set_float32_matmul_precision(saved)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert resolve_precision("auto", torch.float32, cpu) == "bf16"
    with pytest.raises(ValueError, match="precision must be one of"):
        KANLinear(3, 2, precision="fp16")
    with pytest.raises(ValueError, match="needs float32"):
        KANLinear(3, 2, precision="bf16", dtype=torch.float64)


def _dense_pieces(x, grid, wb, sw, ss, order):
    """float64 dense basis A [N, in + in (G+k)] (silu, then the bases of each input), its x-derivative and the
    combined weight W [in + in (G+k), out] of the gemm strategy."""
    n_rows, n_in = x.shape
    basis = b_splines(x, grid, order)  # [N, in, G+k]
    xd = x.detach().clone().requires_grad_()
    d_basis = torch.stack(
        [torch.autograd.grad(b_splines(xd, grid, order)[:, :, j].sum(), xd)[0] for j in range(basis.shape[2])], dim=2
    )
    silu = torch.nn.functional.silu(x)
    sig = torch.sigmoid(x)
    d_silu = sig * (1 + x * (1 - sig))
    A = torch.cat([silu, basis.reshape(n_rows, -1)], dim=1)
    dA = torch.cat([d_silu, d_basis.reshape(n_rows, -1)], dim=1)
    W = torch.cat([wb.t(), (sw * ss.unsqueeze(-1)).permute(1, 2, 0).reshape(-1, wb.shape[0])], dim=0)
    return A, dA, W


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_gemm_precision_error_bound(device, precision):
    """y and every gradient of the gemm strategy against float64, within the documented bound
    (3 u + K 2^-24) (|A| |B|) of each contraction (bspline_ops' docstring), propagated through the fp32 steps
    after it, plus a small multiple of the error the float32 reference itself makes (the fp32 evaluation of
    the bases and of coef * scaler). On the CPU "tf32" runs in fp32 (no TF32 there) and "bf16" rounds the
    operands and the results to bf16 and multiplies in fp32, as the GPU's tensor cores do."""
    from warpkan.torch_bridge.bspline_ops import PRECISION_UNIT_ROUNDOFF

    order, n_rows, n_in, n_out, grid_size = 3, 97, 6, 7, 5
    tdev = _torch_device(device)
    grid64 = _grid(n_in, grid_size, order).to(tdev)
    gen = torch.Generator().manual_seed(3)
    x64 = (1.2 * torch.randn(n_rows, n_in, generator=gen, dtype=torch.float64)).to(tdev)
    p64 = _params(n_out, n_in, grid_size + order, device=tdev, seed=4)
    dy64 = torch.randn(n_rows, n_out, generator=gen, dtype=torch.float64).to(tdev)
    y64, g64 = _fwd_bwd(lambda x, *p: kan_linear(x, grid64, *p, order), x64, p64, dy64)
    to32 = lambda t: t.float()  # noqa: E731
    y32r, g32r = _fwd_bwd(lambda x, *p: kan_linear(x, to32(grid64), *p, order), to32(x64), [to32(p) for p in p64],
                          to32(dy64))
    ours = lambda x, *p: bspline_kan(x, to32(grid64), *p, order, True, strategy="gemm", precision=precision)  # noqa: E731
    y32, g32 = _fwd_bwd(ours, to32(x64), [to32(p) for p in p64], to32(dy64))

    u, eps = PRECISION_UNIT_ROUNDOFF[precision], 2.0**-24
    wb, sw, ss = p64
    A, dA, W = _dense_pieces(x64, grid64, wb, sw, ss, order)
    width = A.shape[1]
    bound_y = (3 * u + width * eps) * (A.abs() @ W.abs())
    bound_dw = (3 * u + n_rows * eps) * (A.abs().t() @ dy64.abs())  # [width, out]
    bound_da = (3 * u + n_out * eps) * (dy64.abs() @ W.abs().t())  # [N, width]
    bound_dx = (bound_da * dA.abs())[:, :n_in] + (bound_da * dA.abs())[:, n_in:].reshape(n_rows, n_in, -1).sum(2)
    bound_dw_spline = bound_dw[n_in:].reshape(n_in, -1, n_out)  # [in, G+k, out]
    bound_d_coef = (bound_dw_spline * ss.t().abs().unsqueeze(1)).permute(2, 0, 1)
    bound_d_scaler = (bound_dw_spline * sw.permute(1, 2, 0).abs()).sum(1).t()
    bounds = [bound_dx, bound_dw[:n_in].t(), bound_d_coef, bound_d_scaler]
    for name, ours32, ref32, ref64, bound in zip(
        ["y", "dx", "dbase_weight", "dspline_weight", "dspline_scaler"], [y32, *g32], [y32r, *g32r], [y64, *g64],
        [bound_y, *bounds],
    ):
        err = (ours32.double() - ref64).abs()
        ref_err = (ref32.double() - ref64).abs().max().item()
        excess = (err - bound - 8 * ref_err).max().item()
        assert excess <= 0, f"{name}: error {err.max().item():.3e} exceeds the {precision} bound by {excess:.3e}"
    if precision == "bf16":  # the bound is not vacuous: bf16 is measurably worse than fp32 here
        assert (y32.double() - y64).abs().max().item() > 16 * (y32r.double() - y64).abs().max().item()


def test_opcheck(device):
    tdev = _torch_device(device)
    order, n_in, n_out, grid_size = 3, 3, 4, 5
    grid = _grid(n_in, grid_size, order, dtype=torch.float32).to(tdev)
    wb, sw, ss = (p.float() for p in _params(n_out, n_in, grid_size + order, device=tdev))
    x = torch.randn(6, n_in, device=tdev)
    spec = bspline_spec(x, grid, order, True, True)
    params = (wb.t().contiguous().requires_grad_(), ss.t().contiguous().requires_grad_(),
              sw.permute(1, 2, 0).contiguous().requires_grad_())
    dy = torch.randn(6, n_out, device=tdev)
    for strategy, precision in (("stencil", "auto"), ("gemm", "fp32"), ("gemm", "bf16")):
        route = (spec.static_key(), strategy, precision, False)
        torch.library.opcheck(edge_forward, (x.requires_grad_(), [grid], *params, None, None, *route))
        torch.library.opcheck(edge_backward, (dy, x.detach(), [grid], *(p.detach() for p in params), None, *route,
                                              True, True, False))


def test_torch_compile_fullgraph(device):
    tdev = _torch_device(device)
    torch.manual_seed(0)
    layer = KANLinear(5, 4).to(tdev)
    x = torch.randn(3, 7, 5, device=tdev, requires_grad=True)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager" if tdev.type == "cpu" else "inductor")
    y = compiled(x)
    torch.testing.assert_close(y, layer(x))
    y.square().sum().backward()
    gx = x.grad.clone()
    x.grad = None
    layer(x).square().sum().backward()
    torch.testing.assert_close(gx, x.grad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA-graph capture needs a GPU")
@pytest.mark.parametrize("strategy,deterministic", [("gemm", False), ("stencil", False), ("stencil", True)])
def test_cuda_graph_capture(strategy, deterministic):
    layer = KANLinear(16, 8, grid_size=9, strategy=strategy, deterministic=deterministic).cuda()
    x = torch.randn(64, 16, device="cuda", requires_grad=True)
    opt = torch.optim.SGD(layer.parameters(), lr=0.0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up: compile kernels, grow the workspace
            layer(x).square().sum().backward()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=False)
    x.grad = None
    with torch.cuda.graph(graph):
        y = layer(x)
        y.square().sum().backward()
    x.data.copy_(torch.randn_like(x))
    opt.zero_grad(set_to_none=False)
    graph.replay()
    torch.cuda.synchronize()
    ref_layer = KANLinear(16, 8, grid_size=9).cuda()
    ref_layer.load_state_dict(layer.state_dict())
    x_ref = x.detach().clone().requires_grad_()
    y_ref = ref_layer(x_ref)
    y_ref.square().sum().backward()
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4)
    # the replayed backward wrote the gradients of the new input
    torch.testing.assert_close(layer.spline_weight.grad, ref_layer.spline_weight.grad, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-3, atol=1e-3)


def test_warp_native_matches_torch_gradients(device):
    tdev = _torch_device(device)
    native = warpkan.KANLinear(4, 3, grid_size=6, dtype=wp.float64, device=device, seed=7)
    layer = KANLinear(4, 3, grid_size=6, dtype=torch.float64).to(tdev)
    layer.load_state_dict({k: torch.tensor(v) for k, v in native.state_dict().items()})
    x_np = np.random.default_rng(0).normal(size=(21, 4))
    dy_np = np.random.default_rng(1).normal(size=(21, 3))
    x = wp.array(x_np, dtype=wp.float64, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        y = native(x)
    tape.backward(grads={y: wp.array(dy_np, dtype=wp.float64, device=device)})
    xt = torch.tensor(x_np, device=tdev, requires_grad=True)
    yt = layer(xt)
    yt.backward(torch.tensor(dy_np, device=tdev))
    np.testing.assert_allclose(y.numpy(), yt.detach().cpu().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.cpu().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(native.base_weight_t.grad.numpy().T, layer.base_weight.grad.cpu().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(native.scaler_t.grad.numpy().T, layer.spline_scaler.grad.cpu().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(native.coef.grad.numpy().transpose(2, 0, 1), layer.spline_weight.grad.cpu().numpy(), rtol=1e-12, atol=1e-12)


def test_warp_native_training_loop_and_npz_roundtrip(device, tmp_path):
    """A pure-Warp loop (wp.Tape + Adam) fits f(x, y) = exp(sin(pi x) + y^2)."""
    rng = np.random.default_rng(0)
    pts = rng.uniform(-1, 1, (256, 2)).astype(np.float32)
    target = np.exp(np.sin(np.pi * pts[:, :1]) + pts[:, 1:] ** 2).astype(np.float32)
    net = warpkan.KANNetwork([warpkan.KANLinear(2, 5, grid_size=8, device=device), warpkan.KANLinear(5, 1, grid_size=8, device=device, seed=1)])
    x = wp.array(pts, device=device)
    t = wp.array(target, device=device)
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)
    opt = warpkan.Adam(net.parameters(), lr=0.02)
    history = []
    for _ in range(150):
        loss.zero_()
        tape = wp.Tape()
        with tape:
            y = net(x)
            wp.launch(_mse, dim=y.shape, inputs=[y, t], outputs=[loss], device=device)
        tape.backward(loss)
        opt.step()
        tape.zero()
        history.append(float(loss.numpy()[0]))
    assert history[-1] < 0.02 * history[0]
    path = tmp_path / "net.npz"
    net.save(path)
    other = warpkan.KANNetwork([warpkan.KANLinear(2, 5, grid_size=8, device=device, seed=9), warpkan.KANLinear(5, 1, grid_size=8, device=device, seed=9)])
    other.load(path)
    np.testing.assert_array_equal(other(x).numpy(), net(x).numpy())


@wp.kernel
def _mse(y: wp.array2d(dtype=wp.float32), t: wp.array2d(dtype=wp.float32), loss: wp.array(dtype=wp.float32)):
    n, o = wp.tid()
    d = y[n, o] - t[n, o]
    wp.atomic_add(loss, 0, d * d / float(y.shape[0]))


_CAPTURE_AFTER_EAGER = r"""
import sys, torch
from warpkan.kernels.edge.strategy import single_slot_strategy
from warpkan.torch_bridge import KANLinear, PolyKANLinear, UKANLinear, bspline_ops, capture_step

kind = sys.argv[1]
torch.manual_seed(0)
make = {"kan": lambda s: KANLinear(32, 32, grid_size=5, strategy=s),
        "ukan": lambda s: UKANLinear(32, 32, grid_delta=0.25, table_groups=8, strategy=s),
        "poly": lambda s: PolyKANLinear(32, 32, 8, strategy=s)}[kind]
layer = make("auto").cuda()
twin = make("gemm").cuda()
twin.load_state_dict(layer.state_dict())
x = torch.rand(1024, 32, device="cuda") * 2 - 1
if kind == "poly":
    assert single_slot_strategy(1024, 32, 32, 9, True, host_bound=True) == "stencil"
    assert single_slot_strategy(1024, 32, 32, 9, True, host_bound=False) == "gemm"
else:
    n_coef = 8 if kind == "kan" else 36
    assert bspline_ops.choose_strategy(1024, 32, 32, n_coef, True, "fp32", host_bound=True) == "stencil"
    assert bspline_ops.choose_strategy(1024, 32, 32, n_coef, True, "fp32", host_bound=False) == "gemm"

def step():
    layer.zero_grad(set_to_none=False)
    layer(x).square().mean().backward()

replay = capture_step(step)  # eager warm-up steps (stencil), then the capture (gemm)
replay()
torch.cuda.synchronize()
twin(x).square().mean().backward()
for a, b in zip(layer.parameters(), twin.parameters()):
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)
print("ok")
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA-graph capture needs a GPU")
@pytest.mark.parametrize("kind", ["kan", "ukan", "poly"])
def test_capture_after_eager_steps_of_the_other_strategy_cuda(kind, child_env, tmp_path):
    """"auto" takes the stencil kernels in an eager step of a small layer and the gemm strategy in a captured one
    (choose_strategy's host-bound rule, and the polynomial families' single_slot_strategy). The eager warm-up
    steps load the gemm module too, so the capture launches loaded kernels only (a module load inside a capture
    invalidates it), and the replay gives the gemm strategy's gradients. A fresh process: no other test has loaded
    the module."""
    import subprocess
    import sys

    script = tmp_path / "capture_after_eager.py"
    script.write_text(_CAPTURE_AFTER_EAGER)
    done = subprocess.run([sys.executable, str(script), kind], env=child_env(), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-4000:]


def test_eager_gemm_step_keeps_the_forward_basis(monkeypatch):
    """The eager route's gemm strategy keeps the forward's combined weight and dense basis (one chunk, within
    KEEP_BASIS_BYTES) for the backward, which makes neither again: one expansion and one weight-combining
    launch a step where there were two of each. The gradients
    are those of the step that expands again (KEEP_BASIS_BYTES = 0), and a retained graph's second backward
    (which reads the kept basis again: the backward writes its basis gradient elsewhere) gives them again."""
    from warpkan.torch_bridge import edge_driver

    expansions, combines = [], []
    launch = edge_driver._launch

    def counting(launcher, *args):
        expansions.extend([1] if launcher is edge_driver._EXPAND else [])
        combines.extend([1] if launcher is edge_driver._COMBINE else [])
        return launch(launcher, *args)

    monkeypatch.setattr(edge_driver, "_launch", counting)
    grads = {}
    for keep_bytes in (edge_driver.KEEP_BASIS_BYTES, 0):
        monkeypatch.setattr(edge_driver, "KEEP_BASIS_BYTES", keep_bytes)
        torch.manual_seed(0)
        layer = KANLinear(7, 5, grid_size=6, strategy="gemm", dtype=torch.float64)
        x = (torch.rand(37, 7, dtype=torch.float64) * 2 - 1).requires_grad_()
        expansions.clear()
        combines.clear()
        y = layer(x)
        y.backward(torch.ones_like(y), retain_graph=True)
        grads[keep_bytes] = [t.grad.clone() for t in (x, *layer.parameters())]
        assert len(expansions) == (1 if keep_bytes else 2), (keep_bytes, expansions)
        assert len(combines) == 1  # the combined weight is kept whatever the basis's size
        for t in (x, *layer.parameters()):
            t.grad = None
        y.backward(torch.ones_like(y))
        for first, again in zip(grads[keep_bytes], (x.grad, *(p.grad for p in layer.parameters()))):
            torch.testing.assert_close(again, first, rtol=0, atol=0)
    for kept, expanded in zip(grads[edge_driver.KEEP_BASIS_BYTES], grads[0]):
        torch.testing.assert_close(kept, expanded, rtol=0, atol=0)


def test_kept_basis_is_a_saved_tensor():
    """What the gemm strategy keeps for the backward goes through save_for_backward, so that saved-tensor hooks
    (activation checkpointing, offloading) see the basis as they see every other saved tensor."""
    layer = KANLinear(7, 5, grid_size=6, strategy="gemm", dtype=torch.float64)
    x = torch.rand(37, 7, dtype=torch.float64, requires_grad=True)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(tuple(t.shape)) or t, lambda t: t):
        y = layer(x)
    width = 7 + 7 * (6 + 3)  # the SiLU rows and G + k basis rows of each input
    assert (width, 37) in packed and (width, 5) in packed, packed  # the basis and the combined weight
    y.sum().backward()
    assert x.grad is not None


@pytest.mark.parametrize("need_x", [True, False])
@pytest.mark.parametrize("deterministic", [False, True])
def test_eager_bound_backward_matches_the_general_path(device, need_x, deterministic, monkeypatch):
    """An eager node of a small layer makes its backward's launch in its forward, on the caller's thread
    (``edge_ops._bound_backward``: CUDA's tiled stencil pass). Its gradients are those of the general path (no
    bound launch; bitwise where deterministic), and a retained graph's second backward (the general path: the
    bound gradients went to autograd with the first) gives them again."""
    from warpkan.torch_bridge import edge_ops

    dev = torch.device(device)
    made = []
    bind = edge_ops._bound_backward

    def recording(*args):
        plan = bind(*args)
        made.append(plan is not None)
        return plan

    grads = {}
    for bound in (True, False):
        monkeypatch.setattr(edge_ops, "_bound_backward", recording if bound else lambda *args: None)
        torch.manual_seed(0)
        layer = KANLinear(13, 11, grid_size=5, strategy="stencil", deterministic=deterministic, dtype=torch.float64,
                          device=dev)
        x = (torch.rand(37, 13, dtype=torch.float64, device=dev) * 2 - 1).requires_grad_(need_x)
        dy = torch.randn(37, 11, dtype=torch.float64, device=dev)
        y = layer(x)
        y.backward(dy, retain_graph=True)
        leaves = [t for t in (x, *layer.parameters()) if t.requires_grad]
        first = [t.grad.clone() for t in leaves]
        for t in leaves:
            t.grad = None
        y.backward(dy)
        tolerance = dict(rtol=0, atol=0) if deterministic else dict(rtol=1e-12, atol=1e-12)
        for again, was in zip((t.grad for t in leaves), first):
            torch.testing.assert_close(again, was, **tolerance)
        grads[bound] = first
    assert made == [device == "cuda"]  # the tiled pass is CUDA's
    for with_bound, general in zip(grads[True], grads[False]):
        torch.testing.assert_close(with_bound, general, **(dict(rtol=0, atol=0) if deterministic else
                                                            dict(rtol=1e-12, atol=1e-12)))
