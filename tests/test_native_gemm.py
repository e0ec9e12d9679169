"""The Warp-native layers' gemm strategy (the engine's dense basis times the weight by ``wp.tile_matmul``,
``warpkan.kernels.edge.tile_gemm``): forward and every gradient against the float64 reference at awkward sizes
(one row, primes, widths and outputs past a whole tile), both strategies one map, deterministic gradients that
accumulate under ``wp.Tape``, and the ``strategy`` argument (its rule and its checks)."""

import copy

import numpy as np
import pytest
import warp as wp

from warpkan.kernels.edge import strategy as edge_strategy
from warpkan.kernels.edge import tile_gemm
from warpkan.native.bspline import KANLinear
from warpkan.native.poly import ChebyKANLinear, PolyKANLinear

torch = pytest.importorskip("torch")

from warpkan.reference import poly as ref_poly  # noqa: E402  (the references are torch code)
from warpkan.reference.bspline import kan_linear  # noqa: E402

EPS = {wp.float32: float(np.finfo(np.float32).eps), wp.float64: float(np.finfo(np.float64).eps)}
NP = {wp.float32: np.float32, wp.float64: np.float64}
TORCH = {wp.float32: torch.float32, wp.float64: torch.float64}

# (rows, in, out), each float32 tile shape (warpkan.kernels.edge.tile_gemm.TILE_SHAPES) in turn: one row and one
# edge; primes with 67 outputs (the 128-wide tile, 61 columns of it past the end; a second, 3-wide column tile of
# the float64 one); 131 rows past two 64-row tiles, a width (13 (G + k + 1) = 143) no tile divides; 41 outputs
# (the 64-wide tile) over 70 rows; 131 outputs, a second 128-wide column tile 3 wide
SHAPES = [(1, 1, 1), (37, 7, 67), (131, 13, 3), (70, 5, 41), (29, 3, 131)]


def _tape_run(layer, x_np, dy_np, device, strided=False):
    """(y, dx, [parameter gradients]) of one forward and backward under wp.Tape, as numpy copies."""
    dtype = layer.dtype
    if strided:  # a transposed view: the layer copies it on the tape
        x = wp.array(np.ascontiguousarray(x_np.T), dtype=dtype, device=device, requires_grad=True).transpose()
    else:
        x = wp.array(x_np, dtype=dtype, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        y = layer(x)
    tape.backward(grads={y: wp.array(dy_np, dtype=dtype, device=device)})
    return y.numpy().copy(), x.grad.numpy().copy(), [p.grad.numpy().copy() for p in layer.parameters()]


def _tolerance(want, reference_error, dtype):
    """From the error the reference itself makes in the layer's dtype (zero in float64), plus a few units of
    rounding of the result's scale."""
    return 8 * reference_error + 64 * EPS[dtype] * (float(np.abs(want).max()) + 1)


def _reference(fn, inputs64, dy64, dtype):
    """(outputs [y, *grads] in float64, each one's error when the reference runs in ``dtype``)."""
    def run(torch_dtype):
        leaves = [torch.tensor(a, dtype=torch_dtype, requires_grad=True) for a in inputs64]
        y = fn(*leaves)
        grads = torch.autograd.grad(y, leaves, torch.tensor(dy64, dtype=torch_dtype), allow_unused=True)
        grads = [torch.zeros_like(leaf) if g is None else g for leaf, g in zip(leaves, grads)]
        return [t.detach().double().numpy() for t in (y, *grads)]

    want = run(torch.float64)
    if dtype == wp.float64:
        return want, [0.0] * len(want)
    return want, [float(np.abs(a - b).max()) if a.size else 0.0 for a, b in zip(run(torch.float32), want)]


def _check(names, got, want, errors, dtype):
    for name, g, w, err in zip(names, got, want, errors):
        assert g.shape == w.shape, name
        tol = _tolerance(w, err, dtype)
        assert float(np.abs(g.astype(np.float64) - w).max()) <= tol, (name, float(np.abs(g - w).max()), tol)


def _spline_layer(n_in, n_out, dtype, device, strategy, use_base=True, uniform=True, grid_size=5, order=3):
    layer = KANLinear(n_in, n_out, grid_size=grid_size, spline_order=order, use_base=use_base, dtype=dtype,
                      device=device, seed=n_in + n_out, strategy=strategy)
    rng = np.random.default_rng(n_out)
    state = {k: rng.standard_normal(v.shape) for k, v in layer.state_dict().items() if k != "grid"}
    state["grid"] = layer.state_dict()["grid"].astype(np.float64)
    if not uniform:  # knots moved by up to 0.4 of a cell, still increasing: the general (Cox-de Boor) family
        h = state["grid"][0, 1] - state["grid"][0, 0]
        state["grid"] = np.sort(state["grid"] + 0.4 * h * rng.random(state["grid"].shape), axis=1)
    if not use_base:
        state["base_weight"] = np.zeros_like(state["base_weight"])
    layer.load_state_dict(state)
    assert layer.uniform == uniform
    return layer


def _spline_reference(layer, x_np, dy_np):
    state = {k: v.astype(np.float64) for k, v in layer.state_dict().items()}
    grid = torch.tensor(state["grid"])

    def fn(x, base_weight, spline_weight, spline_scaler):
        return kan_linear(x, grid.to(x.dtype), base_weight, spline_weight, spline_scaler, layer.spline_order,
                          use_base=layer.use_base)

    inputs = [x_np, state["base_weight"], state["spline_weight"], state["spline_scaler"]]
    return _reference(fn, inputs, dy_np, layer.dtype)


def _spline_grads_public(layer, param_grads):
    """The native gradients (kernel layout) in the reference's layout: base [out, in], coef [out, in, G + k],
    scaler [out, in]."""
    named = dict(zip(["base", "scaler", "coef"] if layer.use_base else ["scaler", "coef"], param_grads))
    base = named["base"].T if layer.use_base else np.zeros((layer.out_features, layer.in_features))
    return [base, named["coef"].transpose(2, 0, 1), named["scaler"].T]


@pytest.mark.parametrize("dtype", [wp.float64, wp.float32])
@pytest.mark.parametrize("strategy", ["gemm", "stencil"])
@pytest.mark.parametrize("shape", SHAPES)
def test_kan_linear_against_reference(device, dtype, strategy, shape):
    n_rows, n_in, n_out = shape
    rng = np.random.default_rng(n_rows)
    # the grid, its extension and beyond (zero spline term); both in the layer's dtype
    x_np = rng.uniform(-1.4, 1.4, (n_rows, n_in)).astype(NP[dtype]).astype(np.float64)
    dy_np = rng.standard_normal((n_rows, n_out)).astype(NP[dtype]).astype(np.float64)
    for use_base, uniform in ((True, True), (False, False)):
        layer = _spline_layer(n_in, n_out, dtype, device, strategy, use_base, uniform)
        y, dx, param_grads = _tape_run(layer, x_np.astype(NP[dtype]), dy_np.astype(NP[dtype]), device)
        want, errors = _spline_reference(layer, x_np, dy_np)
        got = [y, dx, *_spline_grads_public(layer, param_grads)]
        names = ["y", "dx", "d_base_weight", "d_spline_weight", "d_spline_scaler"]
        if not use_base:  # no base weight is trained: its gradient is not compared
            names, got, want, errors = (v[:2] + v[3:] for v in (names, got, want, errors))
        _check(names, got, want, errors, dtype)


def _poly_layer(n_in, n_out, degree, dtype, device, strategy, mode="exact", basis="chebyshev"):
    layer = PolyKANLinear(n_in, n_out, degree, basis=basis, mode=mode, bias=True, dtype=dtype, device=device,
                          seed=degree, strategy=strategy)
    rng = np.random.default_rng(degree)
    layer.load_state_dict({"coeffs": rng.standard_normal((n_in, n_out, degree + 1)) / np.sqrt(n_in * (degree + 1)),
                           "bias": rng.standard_normal(n_out)})
    return layer


@pytest.mark.parametrize("dtype", [wp.float64, wp.float32])
@pytest.mark.parametrize("strategy", ["gemm", "stencil"])
@pytest.mark.parametrize("shape, degree", [(SHAPES[0], 0), (SHAPES[1], 4), (SHAPES[2], 8), (SHAPES[3], 3),
                                           (SHAPES[4], 2)])
def test_poly_kan_linear_against_reference(device, dtype, strategy, shape, degree):
    n_rows, n_in, n_out = shape
    rng = np.random.default_rng(n_rows + 1)
    x_np = (1.5 * rng.standard_normal((n_rows, n_in))).astype(NP[dtype]).astype(np.float64)
    dy_np = rng.standard_normal((n_rows, n_out)).astype(NP[dtype]).astype(np.float64)
    for basis in ("chebyshev", "fourier"):
        layer = _poly_layer(n_in, n_out, degree, dtype, device, strategy, basis=basis)
        y, dx, (d_coeffs, d_bias) = _tape_run(layer, x_np.astype(NP[dtype]), dy_np.astype(NP[dtype]), device)
        state = layer.state_dict()

        def fn(x, coeffs, bias):
            return ref_poly.poly_kan(x, coeffs.permute(0, 2, 1), bias, basis)  # the reference takes [in, D + 1, out]

        want, errors = _reference(fn, [x_np, state["coeffs"].astype(np.float64),
                                       state["bias"].astype(np.float64)], dy_np, dtype)
        got = [y, dx, d_coeffs.transpose(0, 2, 1), d_bias]
        _check(["y", "dx", "d_coeffs", "d_bias"], got, want, errors, dtype)


def _strategies_agree(make, x_np, dy_np, device, dtype, strided=False):
    runs = {s: _tape_run(make(s), x_np, dy_np, device, strided) for s in ("stencil", "gemm")}
    (y_s, dx_s, grads_s), (y_g, dx_g, grads_g) = runs["stencil"], runs["gemm"]
    for name, a, b in [("y", y_s, y_g), ("dx", dx_s, dx_g)] + [(f"param {i}", a, b)
                                                            for i, (a, b) in enumerate(zip(grads_s, grads_g))]:
        # two summation orders of one sum: a few units of rounding of its scale apart
        np.testing.assert_allclose(b, a, rtol=0, atol=256 * EPS[dtype] * (float(np.abs(a).max()) + 1), err_msg=name)


@pytest.mark.parametrize("dtype", [wp.float32, wp.float64])
def test_both_strategies_one_map(device, dtype):
    rng = np.random.default_rng(5)
    n_rows, n_in, n_out = 67, 11, 41
    x_np = rng.uniform(-1.3, 1.3, (n_rows, n_in)).astype(NP[dtype])
    dy_np = rng.standard_normal((n_rows, n_out)).astype(NP[dtype])
    _strategies_agree(lambda s: KANLinear(n_in, n_out, grid_size=7, spline_order=2, dtype=dtype, device=device,
                                          seed=2, strategy=s), x_np, dy_np, device, dtype)
    _strategies_agree(lambda s: PolyKANLinear(n_in, n_out, 6, basis="legendre", mode="lut", lut_size=257, bias=True,
                                              dtype=dtype, device=device, seed=2, strategy=s),
                      x_np, dy_np, device, dtype, strided=True)


def test_gemm_chunks_and_row_splits(device, monkeypatch):
    """Several row chunks of the dense basis (a chunk bound made tiny), or one chunk cut into many row splits
    for the weight gradient, give the default cut's result to rounding, bitwise the same from run to run."""
    rng = np.random.default_rng(7)
    n_rows, n_in, n_out = 203, 5, 9
    width = n_in * (1 + 4 + 3)  # the SiLU row and G + k = 7 basis rows of every input
    x_np = rng.uniform(-1.2, 1.2, (n_rows, n_in)).astype(np.float64)
    dy_np = rng.standard_normal((n_rows, n_out))
    tiles = tile_gemm.tile_shape("float64", n_out)

    def run():
        layer = KANLinear(n_in, n_out, grid_size=4, dtype=wp.float64, device=device, seed=1, strategy="gemm")
        y, dx, grads = _tape_run(layer, x_np, dy_np, device)
        return [y, dx, *grads]

    def cut():
        rows = tile_gemm.chunk_rows(n_rows, width, 8, device == "cuda", tiles)
        return rows, tile_gemm.weight_grad_splits(rows, width, n_out, tiles)[0]

    default = run()
    assert cut() == (n_rows, 2)
    monkeypatch.setattr(tile_gemm, "MIN_SPLIT_DEPTHS", 1)
    assert cut() == (n_rows, 7)
    many_splits = run()
    monkeypatch.setattr(tile_gemm, "CPU_GEMM_CHUNK_BYTES", 1)
    monkeypatch.setattr(tile_gemm, "GEMM_CHUNK_BYTES", 1)
    assert cut() == (tiles.rows, 1)
    many_chunks = run()
    for other in (many_splits, many_chunks):
        for a, b in zip(default, other):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-13)
    for a, b in zip(many_chunks, run()):
        np.testing.assert_array_equal(a, b)


def test_weight_grad_splits_cover_the_rows():
    tiles = tile_gemm.TileShape(64, 64, 32)
    for rows in (1, 31, 32, 33, 1000, 10880):
        for width, n_out in ((3072, 256), (8, 3), (576, 64)):
            splits, per_split = tile_gemm.weight_grad_splits(rows, width, n_out, tiles)
            assert per_split % tiles.depth == 0 and splits >= 1
            assert (splits - 1) * per_split < rows <= splits * per_split, (rows, width, n_out)


def test_gemm_gradients_accumulate_and_empty_batch(device):
    layer = KANLinear(4, 6, grid_size=3, dtype=wp.float64, device=device, strategy="gemm")
    rng = np.random.default_rng(3)
    x = wp.array(rng.uniform(-1, 1, (9, 4)), dtype=wp.float64, device=device, requires_grad=True)
    dy = wp.array(rng.standard_normal((9, 6)), dtype=wp.float64, device=device)
    tape = wp.Tape()
    with tape:
        y = layer(x)
    tape.backward(grads={y: dy})
    once = [x.grad.numpy().copy()] + [p.grad.numpy().copy() for p in layer.parameters()]
    tape.backward(grads={y: dy})  # Warp's adjoint convention: gradients add up
    for a, p in zip(once, [x] + layer.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), 2 * a, rtol=1e-14, atol=1e-15)
    empty = wp.zeros((0, 4), dtype=wp.float64, device=device, requires_grad=True)
    with wp.Tape():
        y = layer(empty)
    assert y.shape == (0, 6)


def test_gemm_forward_refuses_a_bias_of_another_length():
    """The tile-GEMM forward adds the bias through a zero-stride view of it as rows of y: a bias of another length
    than the outputs would be read past its end, so the launcher refuses it by name (the layers' own launchers
    check it before)."""
    from warpkan.kernels import poly as kp

    x = wp.zeros((5, 3), dtype=wp.float32, device="cpu")
    weight = wp.zeros((3 * 4, 6), dtype=wp.float32, device="cpu")
    y = wp.zeros((5, 6), dtype=wp.float32, device="cpu")
    family = kp.family_of(4, "chebyshev", False, "float32")

    def run(bias):
        tile_gemm.launch_gemm_forward(family, kp.frame_of(family, 4, 1.0, 1.0, None), x, 4, weight, y, False,
                                      bias=bias)

    with pytest.raises(ValueError, match=r"bias must hold 6 values \(one an output\), got shape \(5,\)"):
        run(wp.zeros(5, dtype=wp.float32, device="cpu"))
    run(wp.array(np.arange(6, dtype=np.float32), device="cpu"))
    # a zero weight: y is the bias
    np.testing.assert_array_equal(y.numpy(), np.tile(np.arange(6, dtype=np.float32), (5, 1)))


def test_tile_shape_names_round_trip():
    """A tile shape's module name (with "tN" for N threads) parses back to it: the scripts take shapes by name."""
    for shapes in tile_gemm.TILE_SHAPES.values():
        for tiles in shapes:
            assert tile_gemm.TileShape.from_name(tiles.name) == tiles
    assert tile_gemm.TileShape.from_name("64x128x64t256") == tile_gemm.TileShape(64, 128, 64, threads=256)
    assert tile_gemm.TileShape.from_name("64x32x32") == tile_gemm.TileShape(64, 32, 32, threads=128)


def test_strategy_argument_is_checked():
    """What a bad strategy is told (every bad value of every layer: tests/test_bad_input.py's sweep)."""
    for make in (lambda s: KANLinear(2, 3, strategy=s, device="cpu"),
                 lambda s: PolyKANLinear(2, 3, 2, strategy=s, device="cpu"),
                 lambda s: ChebyKANLinear(2, 3, 2, strategy=s, device="cpu")):
        with pytest.raises(ValueError, match=r"strategy must be one of \('auto', 'stencil', 'gemm'\), got 'fast'"):
            make("fast")
        assert make("stencil").strategy == "stencil"
        assert copy.deepcopy(make("gemm")).strategy == "gemm"


def test_auto_follows_the_torch_layers_rule(monkeypatch):
    from warpkan.torch_bridge import bspline_ops, poly_ops

    assert bspline_ops.choose_strategy is edge_strategy.choose_strategy
    assert poly_ops.AUTO_STRATEGY == edge_strategy.SINGLE_SLOT_AUTO_STRATEGY
    # the CPU: no tiled stencil kernels, so the gemm strategy up to GEMM_MAX_COEFFICIENTS coefficients an input
    assert KANLinear(8, 8, grid_size=8, device="cpu").resolve_strategy(65536) == "gemm"
    wide_grid = KANLinear(8, 8, grid_size=edge_strategy.GEMM_MAX_COEFFICIENTS - 2, device="cpu")
    assert wide_grid.resolve_strategy(100) == "stencil"
    assert KANLinear(8, 8, grid_size=60, device="cpu", strategy="gemm").resolve_strategy(100) == "gemm"
    assert PolyKANLinear(8, 8, 3, device="cpu").resolve_strategy(5) == "gemm"
    assert PolyKANLinear(8, 8, 3, device="cpu", strategy="stencil").resolve_strategy(5) == "stencil"
    # CUDA: the tile GEMMs for wide, long calls on short grids (where they measured faster), else the stencil
    from warpkan.native.bspline import cuda_auto_strategy

    assert cuda_auto_strategy(65536, 256, 256, 11) == "gemm"
    assert cuda_auto_strategy(2**14, 512, 128, 8) == "gemm"
    assert cuda_auto_strategy(2**14 - 1, 256, 256, 11) == "stencil"  # short
    assert cuda_auto_strategy(65536, 255, 256, 11) == "stencil"  # narrow
    assert cuda_auto_strategy(65536, 256, 256, 12) == "stencil"  # a grid beyond the one measured
    assert cuda_auto_strategy(4096, 64, 64, 8) == "stencil"
    if wp.is_cuda_available():
        assert KANLinear(8, 8, grid_size=8, device="cuda").resolve_strategy(65536) == "stencil"
        assert KANLinear(256, 256, grid_size=8, device="cuda").resolve_strategy(65536) == "gemm"
        assert KANLinear(8, 8, grid_size=8, device="cuda", strategy="gemm").resolve_strategy(65536) == "gemm"
    # and the call takes the path the rule names
    from warpkan.native import bspline as native_bspline

    calls = []
    for name in ("launch_gemm_forward", "launch_forward"):
        original = getattr(native_bspline.kb, name)
        monkeypatch.setattr(native_bspline.kb, name,
                            lambda *a, _name=name, _original=original, **k: (calls.append(_name), _original(*a, **k)))
    x = wp.array(np.zeros((3, 8), np.float32), device="cpu")
    KANLinear(8, 8, grid_size=8, device="cpu")(x)
    wide_grid(x)
    assert calls == ["launch_gemm_forward", "launch_forward"]


def test_precompile_builds_the_tile_gemm_modules_when_asked(capsys):
    from warpkan.cli import main
    from warpkan.kernels import precompile

    assert main(["precompile", "--device", "cpu", "--orders", "2", "--uniform-only", "--family", "bspline",
                 "--dtype", "float32", "float64", "--native"]) == 0
    out = capsys.readouterr().out
    gemm_modules = [tile_gemm.tile_gemm_module(scalar, tiles) for scalar in ("float32", "float64")
                    for tiles in tile_gemm.TILE_SHAPES[scalar]]
    for module in gemm_modules:
        assert module in out
    # without --native (no torch layer loads them) none is listed, for either family that would add them
    config = precompile.PrecompileConfig(orders=(2,), dtypes=("float32", "float64"), uniform_only=True)
    listed = {build.name for build in precompile.modules(("bspline", "poly"), config, is_cuda=True)}
    assert listed and not listed & set(gemm_modules)
