"""The fused small-layer kernels (warpkan.kernels.edge.fused) against float64 references: y, dx and the combined
weight's gradient dW, for B-spline families (uniform and non-uniform knots, k = 1..3, with and without the
fused SiLU base rows) and polynomial families (exact and LUT), at awkward sizes, with x outside the grid."""

import math

import pytest
import torch
import torch.nn.functional as F
import warp as wp

from warpkan.kernels.edge import fused
from warpkan.kernels.edge.dense import dense_width
from warpkan.reference.bspline import b_splines
from warpkan.reference.poly import poly_kan
from warpkan.torch_bridge import edge_driver
from warpkan.torch_bridge.bspline_ops import bspline_spec
from warpkan.torch_bridge.poly_ops import basis_spec

RTOL64 = 1e-12  # float64: a few roundings of sums of magnitude max(1, |reference|)
FP32_FACTOR, FP32_FLOOR = 8.0, 1e-6  # float32: within 8x the float32 reference's own error (plus a floor)


# ---------------------------------------------------------------------------------------------------- helpers

def _knots(n_in: int, grid_size: int, order: int, uniform: bool, seed: int = 0) -> torch.Tensor:
    """Knots [in, G + 2k + 1] in float64: per input a different interval; uniform, or random spacing (0.3 .. 1.7
    of the mean)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n_in):
        lo, hi = [(-1.0, 1.0), (-0.75, 1.5), (0.3, 2.9)][i % 3]
        h = (hi - lo) / grid_size
        if uniform:
            rows.append(torch.arange(-order, grid_size + order + 1, dtype=torch.float64) * h + lo)
        else:
            steps = h * (0.3 + 1.4 * torch.rand(grid_size + 2 * order, generator=gen, dtype=torch.float64))
            rows.append(lo - order * h + torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(steps, 0)]))
    return torch.stack(rows)


class Layer:
    """One layer of an edge family at a dtype: its EdgeSpec (built as the torch ops build it), the float64
    reference of its dense basis A(x) [rows, width] (a differentiable torch function of x), and the inputs."""

    def __init__(self, spec_of, reference_basis, x64, n_out, bias, dtype, device, seed):
        gen = torch.Generator().manual_seed(seed)
        self.dtype, self.device = dtype, device
        self.x64 = x64
        self.reference_basis = reference_basis
        self.spec = spec_of(x64.to(dtype).to(device))
        self.use_base = self.spec.use_base
        width = dense_width(x64.shape[1], self.spec.n_coef, self.use_base)
        self.weight64 = torch.randn(width, n_out, generator=gen, dtype=torch.float64) / math.sqrt(max(width, 1))
        self.bias64 = torch.randn(n_out, generator=gen, dtype=torch.float64) if bias else None
        self.dy64 = torch.randn(x64.shape[0], n_out, generator=gen, dtype=torch.float64)

    def on_device(self, t):
        return None if t is None else t.to(self.dtype).to(self.device).contiguous()

    def frame(self):
        spec = self.spec
        return spec.make_frame(*[wp.from_torch(t) for t in spec.frame_tensors], *spec.frame_config)

    def run_fused(self):
        """(y, dx, dW) of the fused kernels, on the layer's dtype and device, as float64 on the CPU."""
        x, weight, bias, dy = (self.on_device(t) for t in (self.x64, self.weight64, self.bias64, self.dy64))
        y = torch.full((x.shape[0], weight.shape[1]), float("nan"), dtype=self.dtype, device=self.device)
        dx = torch.full_like(x, float("nan"))
        d_weight = torch.full_like(weight, float("nan"))  # the kernels overwrite every entry
        family, frame, n_coef = self.spec.family, self.frame(), self.spec.n_coef
        view = wp.from_torch
        fused.launch_fused_forward(family, frame, view(x), n_coef, view(weight), None if bias is None else view(bias),
                                   view(y), self.use_base)
        fused.launch_fused_backward(family, frame, view(dy), view(x), n_coef, view(weight), view(dx),
                                    view(d_weight), self.use_base)
        return [t.double().cpu() for t in (y, dx, d_weight)]

    def run_reference(self, dtype=torch.float64):
        """(y, dx, dW) of the reference at dtype (autograd through the reference basis), as float64."""
        x = self.x64.to(dtype).requires_grad_()
        weight = self.weight64.to(dtype).requires_grad_()
        y = self.reference_basis(x) @ weight
        if self.bias64 is not None:
            y = y + self.bias64.to(dtype)
        dx, d_weight = torch.autograd.grad(y, (x, weight), self.dy64.to(dtype))
        return [t.detach().double() for t in (y, dx, d_weight)]


def _check(layer: Layer, mask_x=None):
    ours = layer.run_fused()
    ref64 = layer.run_reference(torch.float64)
    ref32 = layer.run_reference(torch.float32) if layer.dtype == torch.float32 else None
    for name, k in (("y", 0), ("dx", 1), ("dW", 2)):
        got, want = ours[k], ref64[k]
        if name == "dx" and mask_x is not None:  # entries where the reference's derivative is defined
            got, want = got[mask_x], want[mask_x]
        assert torch.isfinite(got).all(), f"{name}: not every entry written"
        err = (got - want).abs().max().item() if got.numel() else 0.0
        scale = max(1.0, want.abs().max().item() if got.numel() else 0.0)
        if layer.dtype == torch.float64:
            bound = RTOL64 * scale
        else:
            ref_err = ref32[k]
            if name == "dx" and mask_x is not None:
                ref_err = ref_err[mask_x]
            own = (ref_err - want).abs().max().item() if got.numel() else 0.0
            bound = FP32_FACTOR * own + FP32_FLOOR * scale
        assert err <= bound, f"{layer.spec.family.key}: {name} error {err:.3e} > {bound:.3e}"


def _bspline_layer(n_rows, n_in, n_out, grid_size, order, uniform, use_base, dtype, device, seed=0, bias=True):
    knots = _knots(n_in, grid_size, order, uniform, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    lo, hi = knots[:, order], knots[:, -order - 1]
    # inside the grid, its extension and beyond (zero spline term out there)
    x64 = lo + (hi - lo) * (torch.rand(n_rows, n_in, generator=gen, dtype=torch.float64) * 2.0 - 0.5)
    x64 = x64.to(dtype).double()  # representable in the layer's dtype: the reference sees the same points

    def spec_of(x):
        return bspline_spec(x, knots.to(x.dtype).to(x.device), order, uniform, use_base)

    def reference_basis(x):
        bases = b_splines(x, knots.to(x.dtype), order).reshape(x.shape[0], -1)
        return torch.cat([F.silu(x), bases], dim=1) if use_base else bases

    return Layer(spec_of, reference_basis, x64, n_out, bias, dtype, device, seed)


def _off_knot(x64, knots, order):
    """Entries not within 1e-9 of a knot (the reference's derivative there is one-sided)."""
    gaps = (x64.unsqueeze(-1) - knots.unsqueeze(0)).abs().min(-1).values
    return gaps > 1e-9


# ---------------------------------------------------------------------------------------------------- B-spline

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("use_base", [True, False], ids=["base", "nobase"])
@pytest.mark.parametrize("uniform", [True, False], ids=["uniform", "nonuniform"])
@pytest.mark.parametrize("order", [1, 2, 3])
def test_bspline_matches_reference(device, order, uniform, use_base, dtype):
    layer = _bspline_layer(41, 11, 13, 5, order, uniform, use_base, dtype, device)  # primes
    _check(layer, _off_knot(layer.x64, _knots(11, 5, order, uniform), order))


# (rows, in, out, G): one row; rows and outputs past one tile, primes; one input; more inputs than a chunk holds
# with a last chunk partly empty; an input's columns filling most of a chunk (G + k + 1 = 60 of 64)
AWKWARD = [(1, 3, 2, 5), (67, 7, 97, 5), (33, 1, 1, 3), (5, 23, 31, 4), (3, 2, 70, 56)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("shape", AWKWARD, ids=lambda s: "x".join(map(str, s)))
def test_bspline_awkward_sizes(device, shape, dtype):
    n_rows, n_in, n_out, grid_size = shape
    layer = _bspline_layer(n_rows, n_in, n_out, grid_size, 3, True, True, dtype, device, seed=n_rows)
    _check(layer, _off_knot(layer.x64, _knots(n_in, grid_size, 3, True, n_rows), 3))


def test_bspline_split_forward_and_row_tile_partials(device):
    """A width of 9 chunks over one row tile: the forward runs chunk groups and adds their partial y; 70 rows:
    the backward adds three row tiles' partial dW."""
    for n_rows in (5, 70):
        layer = _bspline_layer(n_rows, 60, 7, 5, 3, False, True, torch.float64, device, seed=n_rows)
        plan = fused.fused_plan(layer.spec.family, n_rows, 60, layer.spec.n_coef, 7, True)
        assert plan.splits > 1 and plan.row_tiles == -(-n_rows // plan.tiles.rows)
        _check(layer, _off_knot(layer.x64, _knots(60, 5, 3, False, n_rows), 3))


def test_bspline_without_bias(device):
    _check(_bspline_layer(19, 4, 6, 5, 2, False, True, torch.float64, device, bias=False))


# ------------------------------------------------------------------------------------------------- polynomial

def _poly_layer(n_rows, n_in, n_out, degree, basis, lut_size, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x64 = (torch.randn(n_rows, n_in, generator=gen, dtype=torch.float64) * 1.5).to(dtype).double()
    alpha, beta = 1.0, 1.0
    n_basis = degree + 1

    def spec_of(x):
        return basis_spec(x, basis, lut_size, alpha, beta, n_basis)

    def reference_basis(x):
        # the layer's map as a dense basis: the identity coefficients of poly_kan, one column per (input, degree)
        eye = torch.eye(n_in * n_basis, dtype=x.dtype).reshape(n_in, n_basis, n_in * n_basis)
        return poly_kan(x, eye, basis=basis, alpha=alpha, beta=beta)

    return Layer(spec_of, reference_basis, x64, n_out, True, dtype, device, seed)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("basis,degree", [("chebyshev", 8), ("chebyshev", 15), ("legendre", 5), ("fourier", 4)])
def test_poly_exact_matches_reference(device, basis, degree, dtype):
    _check(_poly_layer(37, 13, 41, degree, basis, 0, dtype, device))  # float32: 64-row tiles


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_poly_lut_matches_dense_engine(device, dtype):
    """LUT mode: the values and derivatives are the tables' (the first-order backward reads the derivative
    table), so the reference is the engine's own dense basis and its contraction in float64 (both tested
    against the reference elsewhere)."""
    layer = _poly_layer(23, 9, 17, 8, "chebyshev", 1024, dtype, device, seed=3)

    def run_reference(dtype=torch.float64):
        # on the layer's device (a GPU machine need not have a CPU compiler), compared on the CPU
        x, weight, dy, bias = (t.to(dtype).to(layer.device) for t in (layer.x64, layer.weight64, layer.dy64,
                                                                        layer.bias64))
        spec = basis_spec(x, "chebyshev", 1024, 1.0, 1.0, 9)
        basis_t = edge_driver.expand_basis(spec.family, spec.make_frame, spec.frame_tensors, spec.frame_config, x,
                                           spec.n_coef, False)
        y = basis_t.t() @ weight + bias
        dx = edge_driver.contract_basis((weight @ dy.t()).contiguous(), x, None, 1, spec)
        return [t.double().cpu() for t in (y, dx, basis_t @ dy)]

    layer.run_reference = run_reference
    _check(layer)


@pytest.fixture
def cpu_blocks():
    """Warp's CPU blocks of BLOCK_DIM threads with barriers, as on the GPU, for the test (then restored): the
    block-wide loops run with their lanes apart and the shared tiles written by several threads."""
    saved = wp.config.enable_cpu_blocks
    wp.config.enable_cpu_blocks = True
    yield
    wp.config.enable_cpu_blocks = saved


@pytest.mark.parametrize("case", ["bspline", "poly"])
def test_block_wide_paths_with_cpu_blocks(cpu_blocks, case):
    if case == "bspline":  # split forward, three row tiles, two output tiles, a partly empty last chunk
        layer = _bspline_layer(70, 23, 37, 5, 3, False, True, torch.float64, "cpu", seed=7)
        mask = _off_knot(layer.x64, _knots(23, 5, 3, False, 7), 3)
    else:
        layer, mask = _poly_layer(45, 13, 70, 15, "chebyshev", 0, torch.float32, "cpu", seed=7), None
    _check(layer, mask)


# ------------------------------------------------------------------------------------------- partial requests

def test_backward_computes_only_what_is_asked(device):
    layer = _bspline_layer(45, 5, 9, 5, 3, True, True, torch.float64, device)
    _, dx_ref, dw_ref = layer.run_reference()
    x, weight, dy = (layer.on_device(t) for t in (layer.x64, layer.weight64, layer.dy64))
    family, frame, n_coef, view = layer.spec.family, layer.frame(), layer.spec.n_coef, wp.from_torch
    dx = torch.zeros_like(x)
    fused.launch_fused_backward(family, frame, view(dy), view(x), n_coef, view(weight), dx=view(dx), use_base=True)
    torch.testing.assert_close(dx.cpu(), dx_ref, rtol=0, atol=RTOL64)
    d_weight = torch.zeros_like(weight)
    fused.launch_fused_backward(family, frame, view(dy), view(x), n_coef, view(weight), d_weight=view(d_weight),
                                use_base=True)
    torch.testing.assert_close(d_weight.cpu(), dw_ref, rtol=0, atol=RTOL64)


def test_empty_batch_and_no_outputs(device):
    layer = _bspline_layer(4, 3, 5, 5, 3, True, True, torch.float64, device)
    family, frame, n_coef, view = layer.spec.family, layer.frame(), layer.spec.n_coef, wp.from_torch
    weight = layer.on_device(layer.weight64)
    x = torch.empty(0, 3, dtype=torch.float64, device=device)
    y = torch.empty(0, 5, dtype=torch.float64, device=device)
    fused.launch_fused_forward(family, frame, view(x), n_coef, view(weight), None, view(y), True)
    d_weight = torch.full_like(weight, float("nan"))
    fused.launch_fused_backward(family, frame, view(y), view(x), n_coef, view(weight), None, view(d_weight), True)
    assert (d_weight == 0).all(), "an empty batch's weight gradient is zero"
    x = layer.on_device(layer.x64)
    no_out = weight[:, :0].contiguous()
    dx = torch.full_like(x, float("nan"))
    fused.launch_fused_backward(family, frame, view(torch.empty(4, 0, dtype=torch.float64, device=device)), view(x),
                                n_coef, view(no_out), view(dx), None, True)
    assert (dx == 0).all(), "a layer without outputs has a zero input gradient"


# ------------------------------------------------------------------------------------------------ applicability

def test_fused_applies_to_small_per_input_tables():
    from warpkan.kernels import bspline as kb
    from warpkan.kernels import poly as kp
    cubic = kb.family_of(3, True, "float32")
    cheb = kp.family_of(16, "chebyshev", False, "float32")
    assert fused.fused_applies(cheb, 128, 40, 9, 256, use_base=False)  # PolyKAN (128, 40->256, D=8)
    assert fused.fused_applies(cheb, 64, 256, 16, 512, use_base=False)  # PolyKAN (64, 256->512, D=15)
    assert fused.fused_applies(cubic, 1024, 32, 8, 32)  # KANLinear (1024, 32->32, G=5)
    assert fused.fused_applies(cubic, 128, 784, 8, 32)  # KANLinear (128, 784->32, G=5): 112 chunks, split
    assert not fused.fused_applies(cubic, 1 << 16, 32, 8, 32)  # many rows: the GEMMs' regime
    assert not fused.fused_applies(cubic, 128, 32, 64, 32)  # an input's 65 columns exceed a chunk
    assert not fused.fused_applies(cubic, 2048, 512, 8, 512)  # 64 row tiles of a 4608 x 512 partial dW


def test_plans_split_long_widths_and_keep_short_ones_whole():
    from warpkan.kernels import poly as kp
    cheb = kp.family_of(16, "chebyshev", False, "float32")
    wide = fused.fused_plan(cheb, 64, 256, 16, 512, False)  # 8 tiles of 64 chunks: 64 rows, one row tile
    assert (wide.tiles.rows, wide.row_tiles, wide.out_tiles, wide.chunks) == (64, 1, 8, 64)
    assert wide.backward_partial_shape(512)[0] == 0
    assert wide.splits == 16 and wide.splits * wide.chunks_per_split == wide.chunks
    many_tiles = fused.fused_plan(cheb, 2048, 32, 9, 256, False)  # 256 tiles: a wave already, one kernel
    assert many_tiles.splits == 1 and many_tiles.forward_partial_shape(2048, 256)[0] == 0
    short = fused.fused_plan(cheb, 128, 40, 9, 256, False)  # 6 chunks over 16 tiles: groups of 2
    assert (short.chunks, short.splits, short.chunks_per_split) == (6, 3, 2)


def test_fused_modules_are_the_launchers_choices():
    from warpkan.kernels import bspline as kb
    for scalar, count in (("float32", 3), ("float64", 1)):  # float64 always takes 32 outputs a tile
        family = kb.family_of(3, True, scalar)
        names = fused.fused_modules(family)
        assert len(names) == len(set(names)) == count
        assert all(family.key in name for name in names)
        for n_rows in (1, 32, 33, 64, 65, fused.MAX_ROWS):
            for n_out in (1, 32, 33, fused.MAX_OUT):
                assert fused.fused_kernels(family, fused.fused_tiles(family, n_rows, n_out)).module in names


def test_shared_table_family_is_refused():
    from warpkan.kernels.edge import registry
    shared = [f for f in registry.families() if f.shared_table]
    assert shared
    assert not fused.fused_applies(shared[0], 16, 4, 8, 4)
    with pytest.raises(ValueError, match="table per input"):
        fused.fused_kernels(shared[0], fused.TILES[0])


def test_bad_arrays_name_the_argument():
    layer = _bspline_layer(4, 3, 5, 5, 3, True, True, torch.float64, "cpu")
    family, frame, n_coef, view = layer.spec.family, layer.frame(), layer.spec.n_coef, wp.from_torch
    x, weight = layer.on_device(layer.x64), layer.on_device(layer.weight64)
    y = torch.empty(4, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match="weight must have 27 rows"):
        fused.launch_fused_forward(family, frame, view(x), n_coef, view(weight[1:].contiguous()), None, view(y))
    with pytest.raises(ValueError, match=r"y must have shape \(4, 5\)"):
        fused.launch_fused_forward(family, frame, view(x), n_coef, view(weight), None, view(y[:3].contiguous()))
    with pytest.raises(TypeError, match="x must be float64"):
        fused.launch_fused_forward(family, frame, view(x.float()), n_coef, view(weight), None, view(y))
    with pytest.raises(ValueError, match="bias must have shape"):
        fused.launch_fused_forward(family, frame, view(x), n_coef, view(weight), view(torch.zeros(4).double()),
                                   view(y))
    wide = torch.zeros(3 + 3 * 64, 5, dtype=torch.float64)  # 65 columns an input: past a 64-column chunk
    with pytest.raises(ValueError, match="n_coef must be at most 63"):
        fused.launch_fused_forward(family, frame, view(x), 64, view(wide), None, view(y))
    with pytest.raises(ValueError, match=r"dx must have shape \(4, 3\)"):
        fused.launch_fused_backward(family, frame, view(y), view(x), n_coef, view(weight), dx=view(y))


def test_other_tile_configurations(device):
    """A caller's own tiles (a module of their own): smaller than every default, so rows, chunks and outputs all
    span several tiles; and tiles Warp's GEMM would not take are refused."""
    layer = _bspline_layer(37, 9, 21, 5, 2, False, True, torch.float64, device, seed=4)
    tiles = fused.FusedTiles(16, 32, 16)
    family, frame, n_coef, view = layer.spec.family, layer.frame(), layer.spec.n_coef, wp.from_torch
    x, weight, bias, dy = (layer.on_device(t) for t in (layer.x64, layer.weight64, layer.bias64, layer.dy64))
    y, dx, d_weight = torch.empty_like(dy), torch.empty_like(x), torch.empty_like(weight)
    fused.launch_fused_forward(family, frame, view(x), n_coef, view(weight), view(bias), view(y), True, tiles=tiles)
    fused.launch_fused_backward(family, frame, view(dy), view(x), n_coef, view(weight), view(dx), view(d_weight),
                                True, tiles=tiles)
    y_ref, dx_ref, dw_ref = layer.run_reference()
    mask = _off_knot(layer.x64, _knots(9, 5, 2, False, 4), 2)
    for name, got, want in (("y", y, y_ref), ("dx", dx[mask], dx_ref[mask]), ("dW", d_weight, dw_ref)):
        assert (got.cpu() - want).abs().max() <= RTOL64 * max(1.0, want.abs().max()), name
    with pytest.raises(ValueError, match="tile rows must be a multiple of 8"):
        fused.FusedTiles(12, 64, 64)
