"""KANLinear as a drop-in for efficient-kan's: bad grids refused, non-finite rows ignored by update_grid,
efficient-kan's scale_spline and base_activation semantics, the matrix-form fast path only on grids uniform
to their dtype's rounding, every torch optimiser and utility on the default parameters, and layers that copy
and pickle. Forward and gradients are compared with the float64 pure-torch reference."""

import copy
import io
import pickle

import numpy as np
import pytest
import torch
import warp as wp

import warpkan
from warpkan.kernels import bspline as kb
from warpkan.reference.bspline import kan_linear
from warpkan.reference.efficient_kan import EfficientKANLinear
from warpkan.torch_bridge import KANLinear, UKANLinear, bspline_kan

TOL64 = dict(rtol=1e-10, atol=1e-11)  # float64 kernels against the float64 reference (as in test_bspline)


def _torch_device(device):
    return torch.device("cuda" if device == "cuda" else "cpu")


def _grads(layer, x, dy, params):
    x = x.detach().clone().requires_grad_()
    y = layer(x)
    grads = torch.autograd.grad(y, [x, *params], dy)
    return y.detach(), grads


def _reference_step(layer, x, dy, activation=torch.nn.functional.silu, use_base=True):
    """The float64 reference's output and gradients (x, base_weight, spline_weight, spline_scaler) at the
    layer's own knots and parameters."""
    params = [p.detach().double().clone().requires_grad_() for p in
              (layer.base_weight, layer.spline_weight, layer.spline_scaler)]
    x = x.detach().double().clone().requires_grad_()
    y = kan_linear(x, layer.grid.double(), *params, layer.spline_order, use_base=use_base, base_activation=activation)
    grads = torch.autograd.grad(y, [x, *params], dy.double())
    return y.detach(), grads


def _spread(n_rows, n_in, device, dtype=torch.float64, seed=0, scale=1.3):
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(n_rows, n_in, generator=gen, dtype=torch.float64)).to(device=device, dtype=dtype)


# ------------------------------------------------------------------------------------ 1. update_grid, NaN / Inf
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_update_grid_ignores_non_finite_rows(device, bad):
    tdev = _torch_device(device)
    torch.manual_seed(0)
    layer = KANLinear(3, 4, grid_size=6, dtype=torch.float64).to(tdev)
    twin = KANLinear(3, 4, grid_size=6, dtype=torch.float64).to(tdev)
    twin.load_state_dict(layer.state_dict())
    x = (0.5 * torch.randn(400, 3, dtype=torch.float64) + 0.2).to(tdev)
    dirty = x.clone()
    dirty[17, 1] = bad
    dirty[200] = bad
    keep = torch.ones(400, dtype=torch.bool, device=tdev)
    keep[[17, 200]] = False
    layer.update_grid(dirty)
    twin.update_grid(x[keep])
    assert torch.isfinite(layer.grid).all()
    assert torch.equal(layer.grid, twin.grid)
    torch.testing.assert_close(layer.spline_weight, twin.spline_weight, **TOL64)
    # the spline term is still there for later inputs, and exact
    dy = torch.randn(400, 4, dtype=torch.float64, device=tdev)
    y, grads = _grads(layer, x, dy, [layer.base_weight, layer.spline_weight, layer.spline_scaler])
    y_ref, grads_ref = _reference_step(layer, x, dy)
    torch.testing.assert_close(y, y_ref, **TOL64)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, **TOL64)
    spline_only = y - torch.nn.functional.linear(torch.nn.functional.silu(x), layer.base_weight)
    assert spline_only.abs().max() > 1e-3


def test_update_grid_refuses_without_two_finite_rows_and_keeps_the_layer():
    layer = KANLinear(2, 3, grid_size=4, dtype=torch.float64)
    state = copy.deepcopy(layer.state_dict())
    nan = float("nan")
    for x, margin, match in (
        (torch.full((5, 2), nan, dtype=torch.float64), 0.01, "at least 2 rows of finite values"),
        (torch.tensor([[0.1, 0.2], [nan, 0.3], [0.4, float("inf")]], dtype=torch.float64), 0.01, "got 1"),
        (torch.tensor([[1e308, 0.0], [-1e308, 0.5], [0.0, 0.1]], dtype=torch.float64), 0.01, "refitted grid"),
        (torch.full((6, 2), 0.5, dtype=torch.float64), 0.0, "refitted grid"),  # no spread and no margin
    ):
        with pytest.raises(ValueError, match=match):
            layer.update_grid(x, margin=margin)
        for key, value in layer.state_dict().items():
            assert torch.equal(value, state[key]), key
    with pytest.raises(ValueError, match="margin"):
        layer.update_grid(torch.randn(5, 2, dtype=torch.float64), margin=float("nan"))
    assert layer._grid_uniform


def _snapshot(layer):
    """The layer's parameters, buffers and grid path, copied (to check a refused call left them bitwise equal)."""
    return {key: value.detach().clone() for key, value in layer.state_dict().items()}, layer._grid_uniform


def _assert_unchanged(layer, snapshot):
    state, uniform = snapshot
    for key, value in layer.state_dict().items():
        assert torch.equal(value, state[key]) or (value.isnan() == state[key].isnan()).all() and torch.equal(
            value.nan_to_num(), state[key].nan_to_num()), key  # bitwise, NaN included
    assert layer._grid_uniform == uniform


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_update_grid_refuses_non_finite_spline_weight_and_keeps_the_layer(bad, dtype):
    """One NaN in spline_weight used to reach torch.linalg.lstsq, where LAPACK printed "Parameter 6 was incorrect
    on entry to SGELSY" and torch raised an INTERNAL ASSERT. There is no spline to preserve: refused by name."""
    layer = KANLinear(3, 2, grid_size=5, dtype=dtype)
    with torch.no_grad():
        layer.spline_weight[1, 0, 2] = bad
    snapshot = _snapshot(layer)
    with pytest.raises(ValueError, match="update_grid: spline_weight holds NaN or Inf"):
        layer.update_grid(torch.rand(64, 3, dtype=dtype))
    _assert_unchanged(layer, snapshot)


def test_refit_refuses_a_non_finite_target_by_name():
    """The shared least-squares refit (update_grid, interpret.refine) never hands LAPACK a non-finite system."""
    from warpkan.torch_bridge.kan_linear import refit_coefficients

    bases, target = torch.rand(2, 10, 4), torch.rand(2, 10, 3)
    target[1, 3, 0] = float("nan")
    with pytest.raises(ValueError, match="refine: the refit target"):
        refit_coefficients(bases, target, "refine")


def _train_multiplication(seed, base_activation, steps, rows, max_iter):
    """efficient-kan's test_mul: a [2, 2, 1] KAN learns (u + v) / (1 + u v) with LBFGS (lr 1), its grids refitted
    to each layer's input at every closure of every 20th step. LBFGS at lr 1 diverges for some seeds (so does
    efficient-kan's own layer): every update_grid either refits or is refused by name with the layer unchanged.
    Returns the number of refusals."""
    torch.manual_seed(seed)
    layers = [KANLinear(2, 2, base_activation=base_activation), KANLinear(2, 1, base_activation=base_activation)]
    net = torch.nn.Sequential(*layers)
    optimizer = torch.optim.LBFGS(net.parameters(), lr=1, max_iter=max_iter)
    refusals = 0
    for step in range(steps):
        def closure():
            nonlocal refusals
            optimizer.zero_grad()
            x = torch.rand(rows, 2)
            if step % 20 == 0:
                h = x
                for layer in layers:
                    snapshot = _snapshot(layer)
                    try:
                        layer.update_grid(h)
                    except ValueError:  # anything else fails the test
                        refusals += 1
                        _assert_unchanged(layer, snapshot)
                    h = layer(h)
            y = net(x)
            u, v = x[:, 0], x[:, 1]
            loss = torch.nn.functional.mse_loss(y.squeeze(-1), (u + v) / (1 + u * v))
            reg_loss = sum(layer.regularization_loss(1, 0) for layer in layers)
            (loss + 1e-5 * reg_loss).backward()
            return loss + reg_loss

        optimizer.step(closure)
    return refusals


def test_update_grid_in_efficient_kans_multiplication_loop():
    """efficient-kan's test_mul loop over seeds and both of its base activations: update_grid used to die in
    LAPACK (an INTERNAL ASSERT from torch.linalg.lstsq) once the training had diverged."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny GEMMs: threads only wait on each other (30x slower on 2 busy cores)
    try:
        refusals = {(seed, activation.__name__): _train_multiplication(seed, activation, steps=21, rows=128,
                                                                       max_iter=10)
                    for activation in (torch.nn.Identity, torch.nn.SiLU) for seed in range(8)}
    finally:
        torch.set_num_threads(threads)
    assert any(refusals.values()), refusals  # the loop reaches the diverged layers this test is about


# ------------------------------------------------------------------------------------ 2. grid ranges and knots
BAD_RANGES = [(1.0, -1.0), (0.5, 0.5), (float("nan"), 1.0), (0.0, float("inf")), (-float("inf"), 0.0),
              (0.0,), (-1.0, 0.0, 1.0), "ab", 3.0]


@pytest.mark.parametrize("grid_range", BAD_RANGES, ids=repr)
def test_bad_grid_range_is_refused_by_every_layer(grid_range):
    # a value of the wrong type (a string, a scalar) is a TypeError, a wrong pair a ValueError (warpkan._checks)
    expected = TypeError if isinstance(grid_range, (str, float)) else ValueError
    with pytest.raises(expected, match="grid_range"):
        KANLinear(3, 2, grid_range=grid_range)
    with pytest.raises(expected, match="grid_range"):
        warpkan.KANLinear(3, 2, grid_range=grid_range, device="cpu")


def test_grid_range_beyond_the_dtype_is_refused():
    # finite numbers whose knots overflow (or collapse in) the layer's dtype
    with pytest.raises(ValueError, match="knots of grid_range"):
        KANLinear(3, 2, grid_range=(0.0, 1e39), dtype=torch.float32)
    with pytest.raises(ValueError, match="knots of grid_range"):
        KANLinear(3, 2, grid_range=(-1e308, 1e308), dtype=torch.float64)
    with pytest.raises(ValueError, match="knots of grid_range"):
        warpkan.KANLinear(3, 2, grid_range=(1.0, 1.0 + 1e-12), device="cpu")  # float32 knots collapse
    KANLinear(3, 2, grid_range=(1.0, 1.0 + 1e-12), dtype=torch.float64)  # float64 resolves them


def test_functional_op_refuses_bad_knots(device):
    tdev = _torch_device(device)
    layer = KANLinear(3, 2, grid_size=4, dtype=torch.float64).to(tdev)
    x = torch.randn(5, 3, dtype=torch.float64, device=tdev)
    params = (layer.base_weight, layer.spline_weight, layer.spline_scaler)
    for bad in (layer.grid.flip(1), layer.grid * float("nan"), layer.grid.clone().fill_(0.5)):
        with pytest.raises(ValueError, match="finite and strictly increasing"):
            bspline_kan(x, bad.contiguous(), *params, 3, True)
    perturbed = layer.grid.clone()
    perturbed[1, 5] += 1e-9 * 0.5
    with pytest.raises(ValueError, match="uniform=True needs knots uniform"):
        bspline_kan(x, perturbed, *params, 3, True)
    bspline_kan(x, perturbed, *params, 3, False)
    # the check follows in-place changes of the same tensor
    grid = layer.grid.clone()
    bspline_kan(x, grid, *params, 3, True)
    grid[0, 3] += 0.01
    with pytest.raises(ValueError, match="uniform=True needs knots uniform"):
        bspline_kan(x, grid, *params, 3, True)


def test_bad_loaded_grid_is_refused_and_not_loaded():
    layer = KANLinear(3, 2, grid_size=4, dtype=torch.float64)
    state = layer.state_dict()
    knots = state["grid"].clone()
    bad = dict(state, grid=knots.flip(1))
    with pytest.raises(RuntimeError, match="finite and strictly increasing"):
        layer.load_state_dict(bad)
    assert torch.equal(layer.grid, knots) and layer._grid_uniform
    native = warpkan.KANLinear(3, 2, grid_size=4, device="cpu")
    native_state = native.state_dict()
    with pytest.raises(ValueError, match="finite and strictly increasing"):
        native.load_state_dict(dict(native_state, grid=np.full_like(native_state["grid"], np.nan)))
    assert np.array_equal(native.grid.numpy(), native_state["grid"])


# ------------------------------------------------------------------------------------ 3. scale_spline
def test_scale_spline_without_standalone_scaler_matches_efficient_kan(device):
    """efficient-kan with enable_standalone_scale_spline=False uses scale_spline only to scale the initial
    spline_weight; its forward uses spline_weight unscaled. Its checkpoint must give its outputs here."""
    tdev = _torch_device(device)
    torch.manual_seed(2)
    config = dict(grid_size=6, spline_order=3, scale_spline=2.0, enable_standalone_scale_spline=False)
    peer = EfficientKANLinear(5, 4, **config).double().to(tdev)
    ours = KANLinear(5, 4, **config, dtype=torch.float64).to(tdev)
    ours.load_state_dict(peer.state_dict())
    x = _spread(37, 5, tdev)
    dy = torch.randn(37, 4, dtype=torch.float64, device=tdev)
    y, grads = _grads(ours, x, dy, [ours.base_weight, ours.spline_weight])
    y_peer, grads_peer = _grads(peer, x, dy, [peer.base_weight, peer.spline_weight])
    torch.testing.assert_close(y, y_peer, **TOL64)
    for g, g_ref in zip(grads, grads_peer):
        torch.testing.assert_close(g, g_ref, **TOL64)
    assert "spline_scaler" not in ours.state_dict()


def test_scale_spline_scales_initial_spline_weight_without_standalone_scaler():
    layers = []
    for scale in (1.0, 2.5):
        torch.manual_seed(7)
        layers.append(KANLinear(4, 3, scale_spline=scale, enable_standalone_scale_spline=False,
                                dtype=torch.float64))
    torch.testing.assert_close(layers[1].spline_weight, 2.5 * layers[0].spline_weight, rtol=1e-15, atol=0)
    assert torch.equal(layers[1].spline_scaler, torch.ones(3, 4, dtype=torch.float64))


# ------------------------------------------------------------------------------------ 6. near-uniform grids
def _layer_with_grid(grid_size, dtype, device, shift, strategy="auto", seed=3):
    torch.manual_seed(seed)
    layer = KANLinear(5, 4, grid_size=grid_size, dtype=dtype, strategy=strategy).to(device)
    state = layer.state_dict()
    grid = state["grid"].clone()
    h = (grid[0, -1] - grid[0, 0]) / (grid.shape[1] - 1)
    grid[2, grid.shape[1] // 2] += shift * h
    layer.load_state_dict(dict(state, grid=grid))
    return layer


@pytest.mark.parametrize("shift", [1e-5, 1e-7, 1e-9, 1e-12])
@pytest.mark.parametrize("strategy", ["stencil", "gemm"])
def test_near_uniform_grid_float64_matches_reference(device, shift, strategy):
    tdev = _torch_device(device)
    layer = _layer_with_grid(7, torch.float64, tdev, shift, strategy)
    assert not layer._grid_uniform  # a knot off by more than float64 rounding: the general path
    x = _spread(53, 5, tdev)
    x[:, 2] = torch.linspace(-1.5, 1.5, 53, dtype=torch.float64, device=tdev)  # around the moved knot
    dy = torch.randn(53, 4, dtype=torch.float64, device=tdev)
    y, grads = _grads(layer, x, dy, [layer.base_weight, layer.spline_weight, layer.spline_scaler])
    y_ref, grads_ref = _reference_step(layer, x, dy)
    torch.testing.assert_close(y, y_ref, **TOL64)
    for name, g, g_ref in zip(("x", "base_weight", "spline_weight", "spline_scaler"), grads, grads_ref):
        torch.testing.assert_close(g, g_ref, **TOL64, msg=lambda m: f"d{name}: {m}")


@pytest.mark.parametrize("shift", [1e-5, 1e-6])
def test_near_uniform_grid_float32_within_reference_error(device, shift):
    """In float32 a knot moved by 1e-6 h is within the knots' own rounding (the fast path); 1e-5 h is not
    (the general path). Either way the error stays at the float32 reference's level."""
    tdev = _torch_device(device)
    layer = _layer_with_grid(7, torch.float32, tdev, shift)
    assert layer._grid_uniform == (shift == 1e-6)
    x = _spread(257, 5, tdev)
    x[:, 2] = torch.linspace(-1.5, 1.5, 257, dtype=torch.float64, device=tdev)
    dy = torch.randn(257, 4, dtype=torch.float64, device=tdev)
    y, grads = _grads(layer, x.float(), dy.float(), [layer.base_weight, layer.spline_weight, layer.spline_scaler])
    y64, grads64 = _reference_step(layer, x, dy)
    ref32 = KANLinear(5, 4, grid_size=7, dtype=torch.float32).to(tdev)
    ref32.load_state_dict(layer.state_dict())
    params32 = [p.detach().clone().requires_grad_() for p in (layer.base_weight, layer.spline_weight,
                                                               layer.spline_scaler)]
    x32 = x.float().requires_grad_()
    y32 = kan_linear(x32, layer.grid, *params32, 3)
    grads32 = torch.autograd.grad(y32, [x32, *params32], dy.float())
    for ours, ref, exact in zip((y, *grads), (y32, *grads32), (y64, *grads64)):
        err = (ours.double() - exact).abs().max().item()
        ref_err = (ref.double() - exact).abs().max().item()
        assert err <= 8 * ref_err + 1e-6 * exact.abs().max().item(), (err, ref_err)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("grid_range,grid_size,order", [((-1, 1), 5, 3), ((-3.7, 11.3), 37, 2),
                                                        ((1e3, 1e3 + 0.7), 9, 5), ((-1e-3, 2e-3), 300, 1)])
def test_exactly_uniform_grids_take_the_fast_path(dtype, grid_range, grid_size, order):
    layer = KANLinear(3, 2, grid_size=grid_size, spline_order=order, grid_range=grid_range, dtype=dtype)
    assert layer._grid_uniform
    again = KANLinear(3, 2, grid_size=grid_size, spline_order=order, grid_range=grid_range, dtype=dtype)
    again.load_state_dict(layer.state_dict())
    assert again._grid_uniform
    native = warpkan.KANLinear(3, 2, grid_size=grid_size, spline_order=order, grid_range=grid_range, device="cpu",
                               dtype=wp.float64 if dtype == torch.float64 else wp.float32)
    assert native.uniform
    native.load_state_dict(native.state_dict())
    assert native.uniform
    other = torch.float64 if dtype == torch.float32 else torch.float32
    converted = copy.deepcopy(layer).to(other)
    assert converted._grid_uniform and kb.grid_is_uniform(converted.grid.numpy())


def test_efficient_kan_checkpoint_and_conversions_keep_the_fast_path(device):
    tdev = _torch_device(device)
    torch.manual_seed(1)
    peer = EfficientKANLinear(5, 4, grid_size=5)
    layer = KANLinear(5, 4, grid_size=5)
    layer.load_state_dict(peer.state_dict())
    assert layer._grid_uniform
    # float32 -> float64: the knots are re-spaced exactly (they move by float32 rounding), so the fast path
    # matches the float64 reference at the layer's own knots
    layer = layer.double().to(tdev)
    assert layer._grid_uniform
    x = _spread(41, 5, tdev)
    dy = torch.randn(41, 4, dtype=torch.float64, device=tdev)
    y, grads = _grads(layer, x, dy, [layer.base_weight, layer.spline_weight, layer.spline_scaler])
    y_ref, grads_ref = _reference_step(layer, x, dy)
    torch.testing.assert_close(y, y_ref, **TOL64)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, **TOL64)
    torch.testing.assert_close(layer.grid, peer.grid.double().to(tdev), rtol=0, atol=4e-7)
    # a float32 grid loaded into a float64 layer is kept as it is: the general path, exact at those knots
    wide = KANLinear(5, 4, grid_size=5, dtype=torch.float64).to(tdev)
    wide.load_state_dict({k: v.double() for k, v in peer.state_dict().items()})
    assert not wide._grid_uniform
    y, _ = _grads(wide, x, dy, [wide.spline_weight])
    torch.testing.assert_close(y, _reference_step(wide, x, dy)[0], **TOL64)


# ------------------------------------------------------------------------------------ 5. base activations
class _Swish(torch.nn.Module):
    """A module of one's own, with a parameter of its own."""

    def __init__(self):
        super().__init__()
        self.beta = torch.nn.Parameter(torch.tensor(1.3))

    def forward(self, x):
        return x * torch.sigmoid(self.beta.to(x.dtype) * x)


ACTIVATIONS = {
    "Identity": torch.nn.Identity, "GELU": torch.nn.GELU, "ReLU": torch.nn.ReLU, "Tanh": torch.nn.Tanh,
    "SiLU": torch.nn.SiLU, "GELU-tanh-instance": torch.nn.GELU(approximate="tanh"), "SiLU-instance": torch.nn.SiLU(),
    "custom": _Swish, "silu-string": "silu",
}


def _activation_case(name, dtype, device, strategy, shape=(29, 7, 5, 7)):
    n_rows, n_in, n_out, grid_size = shape
    torch.manual_seed(11)
    layer = KANLinear(n_in, n_out, grid_size=grid_size, base_activation=copy.deepcopy(ACTIVATIONS[name]),
                      strategy=strategy, dtype=dtype).to(device)
    x = _spread(n_rows, n_in, device, dtype=torch.float64, seed=4)
    dy = torch.randn(n_rows, n_out, dtype=torch.float64, device=device)
    return layer, x, dy


def _activation_reference(layer, x, dy):
    """float64 reference output and gradients (x, base_weight, spline_weight, spline_scaler, then the
    activation's own parameters)."""
    act = copy.deepcopy(layer.base_activation).double()
    act_params = list(act.parameters())
    params = [p.detach().double().clone().requires_grad_() for p in
              (layer.base_weight, layer.spline_weight, layer.spline_scaler)]
    x = x.detach().double().clone().requires_grad_()
    y = kan_linear(x, layer.grid.double(), *params, layer.spline_order, base_activation=act)
    return y.detach(), torch.autograd.grad(y, [x, *params, *act_params], dy.double())


@pytest.mark.parametrize("name", list(ACTIVATIONS))
@pytest.mark.parametrize("strategy", ["stencil", "gemm"])
def test_base_activation_float64_matches_reference(device, name, strategy):
    tdev = _torch_device(device)
    layer, x, dy = _activation_case(name, torch.float64, tdev, strategy)
    params = [layer.base_weight, layer.spline_weight, layer.spline_scaler, *layer.base_activation.parameters()]
    y, grads = _grads(layer, x, dy, params)
    y_ref, grads_ref = _activation_reference(layer, x, dy)
    torch.testing.assert_close(y, y_ref, **TOL64)
    assert len(grads) == len(grads_ref)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, **TOL64)
    # N-D input: the same rows
    y3 = layer(x.view(29, 7).unsqueeze(0).expand(2, -1, -1))
    torch.testing.assert_close(y3[1], y, **TOL64)


@pytest.mark.parametrize("name", ["Identity", "GELU", "ReLU", "Tanh", "SiLU", "custom"])
def test_base_activation_float32_at_reference_error(device, name):
    tdev = _torch_device(device)
    layer, x, dy = _activation_case(name, torch.float32, tdev, "auto", shape=(257, 13, 11, 9))
    params = [layer.base_weight, layer.spline_weight, layer.spline_scaler, *layer.base_activation.parameters()]
    ours = _grads(layer, x.float(), dy.float(), params)
    exact = _activation_reference(layer, x, dy)
    # the reference's own float32 error
    act32 = copy.deepcopy(layer.base_activation)
    params32 = [p.detach().clone().requires_grad_() for p in (layer.base_weight, layer.spline_weight,
                                                               layer.spline_scaler)]
    x32 = x.float().requires_grad_()
    y32 = kan_linear(x32, layer.grid, *params32, 3, base_activation=act32)
    ref32 = (y32, torch.autograd.grad(y32, [x32, *params32, *act32.parameters()], dy.float()))
    for got, ref, want in zip((ours[0], *ours[1]), (ref32[0], *ref32[1]), (exact[0], *exact[1])):
        err = (got.double() - want).abs().max().item()
        ref_err = (ref.double() - want).abs().max().item()
        assert err <= 8 * ref_err + 1e-6 * want.abs().max().item(), (err, ref_err)


def test_base_activation_trains_like_efficient_kan():
    """efficient-kan's own test trains with base_activation=torch.nn.Identity: the same checkpoint gives the
    same outputs and the same Adam steps."""
    torch.manual_seed(5)
    peer = EfficientKANLinear(4, 3, base_activation=torch.nn.Identity).double()
    ours = KANLinear(4, 3, base_activation=torch.nn.Identity, dtype=torch.float64)
    ours.load_state_dict(peer.state_dict())
    x = _spread(64, 4, "cpu", scale=0.6)
    target = torch.sin(x).sum(1, keepdim=True).expand(-1, 3)
    losses = []
    for model in (peer, ours):
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        trace = []
        for _ in range(20):
            optimizer.zero_grad()
            loss = (model(x) - target).square().mean()
            loss.backward()
            optimizer.step()
            trace.append(loss.item())
        losses.append(trace)
    assert losses[1][-1] < 0.5 * losses[1][0]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-9)


def test_bad_base_activation_is_refused():
    for bad in (torch.tanh, "relu", 3, torch.nn.functional.silu):
        with pytest.raises(ValueError, match="base_activation must be an nn.Module class or instance"):
            KANLinear(3, 2, base_activation=bad)
    assert KANLinear(3, 2, base_activation=None).base_activation is None


@pytest.mark.parametrize("name", ["Identity", "GELU", "custom", "SiLU"])
def test_ukan_base_activation_matches_reference(device, name):
    from warpkan.reference import ukan as ru

    tdev = _torch_device(device)
    torch.manual_seed(3)
    layer = UKANLinear(3, 2, grid_delta=0.25, pe_dim=4, embed_dim=3, hidden_dim=6,
                       base_activation=copy.deepcopy(ACTIVATIONS[name]), device=tdev, dtype=torch.float64)
    x = _spread(50, 3, tdev)
    x[0, 0] = 1e3  # one outlier: the sparse path too
    for rows in (x[1:], x):
        act = copy.deepcopy(layer.base_activation)
        y = layer(rows)
        y_ref = ru.ukan_linear(rows, layer.grid_delta, layer.spline_order, layer.pe_dim, layer.feature_embedding,
                               layer.cg_hidden.weight, layer.cg_hidden.bias, layer.cg_out.weight, layer.cg_out.bias,
                               layer.spline_scaler, layer.base_weight, base_activation=act)
        torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
        params = list(layer.parameters())
        grads = torch.autograd.grad(y.sum(), params)
        grads_ref = torch.autograd.grad(y_ref.sum(), params, allow_unused=True)
        for (n, p), g, g_ref in zip(layer.named_parameters(), grads, grads_ref):
            if g_ref is None:  # the reference's copy of the activation holds its parameters
                continue
            torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12, msg=lambda m: f"{n}: {m}")
    assert layer.to_kan(-1.0, 1.0).base_activation is not layer.base_activation


# ------------------------------------------------------------------------------------ 4. parameter layout
def _layers(device, dtype=torch.float64):
    """(name, layer, n_in) for every torch layer with its default parameters."""
    from warpkan.torch_bridge import GEGLUFFN, KATMLP, ChebyKANLinear, GRKANLinear, GroupRational, PolyKANLinear

    factory = dict(device=device, dtype=dtype)
    torch.manual_seed(0)
    return [
        ("KANLinear-gemm", KANLinear(5, 3, grid_size=4, strategy="gemm", **factory), 5),
        ("KANLinear-stencil", KANLinear(5, 3, grid_size=4, strategy="stencil", **factory), 5),
        ("KANLinear-no-scaler", KANLinear(5, 3, enable_standalone_scale_spline=False, **factory), 5),
        ("KANLinear-gelu", KANLinear(5, 3, base_activation=torch.nn.GELU, **factory), 5),
        ("UKANLinear", UKANLinear(5, 3, grid_delta=0.25, pe_dim=4, embed_dim=3, hidden_dim=6, **factory), 5),
        ("PolyKANLinear", PolyKANLinear(5, 3, 4, mode="exact", bias=True, **factory), 5),
        ("ChebyKANLinear", ChebyKANLinear(5, 3, 4, mode="exact", **factory), 5),
        ("GroupRational", GroupRational(8, 2, **factory), 8),
        ("GRKANLinear", GRKANLinear(8, 3, num_groups=2, **factory), 8),
        ("KATMLP", KATMLP(8, 12, 3, num_groups=2, **factory), 8),
        ("GEGLUFFN", GEGLUFFN(8, 12, bias=True, **factory), 8),
    ]


def _regression(n_in, device, dtype=torch.float64, rows=64):
    x = _spread(rows, n_in, device, dtype=dtype, seed=1, scale=0.6)
    return x, torch.tanh(x[:, :1] - 0.5 * x[:, 1:2])


@pytest.mark.parametrize("index", range(11))
def test_lbfgs_and_parameter_vectors_on_default_parameters(device, index):
    name, layer, n_in = _layers(_torch_device(device))[index]
    for p in layer.parameters():
        assert p.is_contiguous(), name
    x, target = _regression(n_in, _torch_device(device))
    loss_of = lambda: (layer(x)[:, :1] - target).square().mean()  # noqa: E731
    optimizer = torch.optim.LBFGS(layer.parameters(), lr=1, max_iter=4, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = loss_of()
        loss.backward()
        return loss

    losses = [optimizer.step(closure).item() for _ in range(4)] + [loss_of().item()]
    assert all(b <= a for a, b in zip(losses, losses[1:])), (name, losses)
    assert losses[-1] < losses[0], (name, losses)
    # parameters_to_vector / vector_to_parameters round trip
    vector = torch.nn.utils.parameters_to_vector(layer.parameters())
    y = layer(x).detach()
    torch.nn.utils.vector_to_parameters(torch.zeros_like(vector), layer.parameters())
    assert all(not p.detach().any() for p in layer.parameters())
    torch.nn.utils.vector_to_parameters(vector, layer.parameters())
    assert torch.equal(torch.nn.utils.parameters_to_vector(layer.parameters()), vector)
    assert torch.equal(layer(x), y)
    # the other optimisers and utilities on the same parameters
    for make in (lambda ps: torch.optim.Adam(ps, lr=1e-3), lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9)):
        optimizer = make(layer.parameters())
        for _ in range(2):
            optimizer.zero_grad()
            loss_of().backward()
            torch.nn.utils.clip_grad_norm_(layer.parameters(), 1.0)
            optimizer.step()
    for p in layer.parameters():
        assert p.grad.stride() == p.stride(), name


@pytest.mark.parametrize("make", [
    lambda c: KANLinear(5, 3, grid_size=4, strategy="gemm", contiguous_parameters=c, dtype=torch.float64),
    lambda c: KANLinear(5, 3, grid_size=60, strategy="stencil", contiguous_parameters=c, dtype=torch.float64),
    lambda c: UKANLinear(5, 3, grid_delta=0.25, pe_dim=4, embed_dim=3, hidden_dim=6, contiguous_parameters=c,
                         dtype=torch.float64),
    lambda c: warpkan.torch_bridge.PolyKANLinear(5, 3, 4, bias=True, contiguous_parameters=c, dtype=torch.float64),
], ids=["KANLinear-gemm", "KANLinear-stencil", "UKANLinear", "PolyKANLinear"])
def test_contiguous_parameters_only_changes_storage(make):
    """contiguous_parameters=False stores the parameters as views of the kernels' layout: the same initial
    values, outputs and gradients as the default."""
    torch.manual_seed(4)
    plain = make(True)
    torch.manual_seed(4)
    views = make(False)
    assert all(p.is_contiguous() for p in plain.parameters())
    assert not all(p.is_contiguous() for p in views.parameters())
    for a, b in zip(plain.parameters(), views.parameters()):
        assert torch.equal(a, b)
    x, _ = _regression(5, "cpu", rows=37)
    x[0, 0] = 30.0  # UKAN: the sparse path too
    y_plain, y_views = plain(x), views(x)
    torch.testing.assert_close(y_plain, y_views, rtol=0, atol=0)
    y_plain.square().sum().backward()
    y_views.square().sum().backward()
    for a, b in zip(plain.parameters(), views.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
        assert a.grad.stride() == a.stride() and b.grad.stride() == b.stride()


def test_gemm_step_copies_no_parameter(eager_step_ops):
    """The gemm strategy reads the default (public-layout) parameters and writes their gradients in place:
    a training step runs no copy, and AccumulateGrad takes the gradients as they are."""
    layer = KANLinear(5, 3, grid_size=4, strategy="gemm")
    names = eager_step_ops(layer, torch.rand(7, 5, requires_grad=True), torch.ones(7, 3))
    assert not names & {"aten::copy_", "aten::clone", "aten::contiguous"}, names


def _parameter_copies(step_ops, layer, x, dy) -> list:
    """The copies (``aten::copy_``, ``aten::clone``) of a parameter's size in one eager step of ``layer``
    (``step_ops``: the ``eager_step_ops`` fixture), (op, numel) each. Other copies (the CPU stencil backward's
    sort of its entries) are of other sizes."""
    sizes = {p.numel() for p in layer.parameters()}
    copies = []
    for name, shapes in step_ops(layer, x, dy, shapes=True):
        if name in ("aten::copy_", "aten::clone") and shapes and shapes[0]:
            numel = int(np.prod(shapes[0]))
            if numel in sizes:
                copies.append((name, numel))
    return copies


@pytest.mark.parametrize("deterministic", [False, True])
def test_small_stencil_step_reads_the_parameters_in_place(device, deterministic, eager_step_ops, monkeypatch):
    """The stencil strategy on a small call reads the public-layout parameters where they lie and writes their
    gradients in their strides (``edge_ops._stencil_param``): a step copies no parameter or gradient (no copy
    into the kernels' layout, none by AccumulateGrad), and its results are bitwise those of the same call on
    copies in the kernels' layout (a call above IN_PLACE_MAX_ROWS), which makes those copies."""
    from warpkan.torch_bridge import edge_ops

    tdev = _torch_device(device)
    torch.manual_seed(0)
    layer = KANLinear(5, 3, grid_size=4, strategy="stencil", deterministic=deterministic).to(tdev)
    x = (torch.rand(37, 5, device=tdev) * 2.4 - 1.2).requires_grad_(True)  # some rows outside the grid
    dy = torch.randn(37, 3, device=tdev)
    assert _parameter_copies(eager_step_ops, layer, x, dy) == []

    def step():
        for t in (x, *layer.parameters()):
            t.grad = None
        y = layer(x)
        y.backward(dy)
        return y, [t.grad for t in (x, *layer.parameters())]

    y_in_place, grads_in_place = step()
    for p, g in zip(layer.parameters(), grads_in_place[1:]):
        assert g.stride() == p.stride()
    monkeypatch.setattr(edge_ops, "IN_PLACE_MAX_ROWS", 0)
    assert len(_parameter_copies(eager_step_ops, layer, x, dy)) >= 3  # base weight, scaler, table (and gradients back)
    y_copied, grads_copied = step()
    torch.testing.assert_close(y_in_place, y_copied, rtol=0, atol=0)
    for a, b in zip(grads_in_place, grads_copied):
        if deterministic or tdev.type == "cpu":
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        else:  # atomic adds in another order
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_stencil_param_rule(device):
    """``edge_ops.stencil_param``: a small parameter view is read in place up to IN_PLACE_MAX_ROWS rows an eager
    call and IN_PLACE_MAX_ROWS_CAPTURED rows a call recorded into a CUDA graph, and copied contiguous beyond
    those or beyond IN_PLACE_MAX_BYTES."""
    from warpkan.torch_bridge import edge_ops

    tdev = _torch_device(device)
    view = torch.randn(3, 5, device=tdev).t()
    assert edge_ops.stencil_param(view, edge_ops.IN_PLACE_MAX_ROWS) is view
    copied = edge_ops.stencil_param(view, edge_ops.IN_PLACE_MAX_ROWS + 1)
    assert copied.is_contiguous() and torch.equal(copied, view)
    large = torch.zeros(edge_ops.IN_PLACE_MAX_BYTES // 4 + 1, 2, device=tdev).t()
    assert edge_ops.stencil_param(large, 1).is_contiguous()
    if tdev.type == "cuda":
        rows = (edge_ops.IN_PLACE_MAX_ROWS_CAPTURED, edge_ops.IN_PLACE_MAX_ROWS_CAPTURED + 1)
        edge_ops.stencil_param(view, rows[1])  # the copy's kernels loaded before the capture
        torch.cuda.synchronize()
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            in_place, captured_copy = (edge_ops.stencil_param(view, n) for n in rows)
        assert in_place is view and captured_copy.is_contiguous()


# ------------------------------------------------------------------------------------ 7. copy and pickle
def _trained(layer, x):
    """A forward and backward pass first: whatever a layer caches on its way is in place."""
    layer(x).square().mean().backward()
    return layer


@pytest.mark.parametrize("index", range(11))
def test_deepcopy_and_pickle_round_trip(device, index):
    tdev = _torch_device(device)
    name, layer, n_in = _layers(tdev)[index]
    x, _ = _regression(n_in, tdev, rows=33)
    if name == "UKANLinear":
        x[0, 0] = 40.0  # the sparse path, which keeps its last table
    _trained(layer, x)
    y = layer(x).detach()
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    copies = [copy.deepcopy(layer), pickle.loads(pickle.dumps(layer)), torch.load(buffer, weights_only=False)]
    for twin in copies:
        assert type(twin) is type(layer)
        torch.testing.assert_close(twin(x), y, rtol=0, atol=0)
        for (n, p), (n2, q) in zip(layer.named_parameters(), twin.named_parameters()):
            assert n == n2 and torch.equal(p, q) and p.data_ptr() != q.data_ptr(), (name, n)
            assert p.stride() == q.stride()
        for (n, b), (_, c) in zip(layer.named_buffers(), twin.named_buffers()):
            assert torch.equal(b, c), (name, n)
        # independent: training the copy leaves the original as it was
        with torch.no_grad():
            for q in twin.parameters():
                q.add_(0.25)
        torch.testing.assert_close(layer(x), y, rtol=0, atol=0)
        _trained(twin, x)
    if isinstance(layer, KANLinear):
        assert all(twin._grid_uniform == layer._grid_uniform for twin in copies)


def test_whole_model_save_and_load(tmp_path):
    from warpkan.torch_bridge import GRKANLinear, PolyKANLinear

    torch.manual_seed(0)
    model = torch.nn.Sequential(KANLinear(4, 8, base_activation=torch.nn.GELU), UKANLinear(8, 6, pe_dim=4),
                                PolyKANLinear(6, 8, 3), GRKANLinear(8, 2, num_groups=2))
    x = torch.rand(17, 4) * 2 - 1
    model[0].update_grid(x)
    _trained(model, x)
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    assert not loaded[0]._grid_uniform
    ema = copy.deepcopy(model)  # an EMA copy, updated from the model's parameters
    with torch.no_grad():
        for e, p in zip(ema.parameters(), model.parameters()):
            e.mul_(0.9).add_(p, alpha=0.1)
    torch.testing.assert_close(ema(x), model(x), rtol=1e-6, atol=1e-6)


NATIVE = [
    lambda d: warpkan.KANLinear(3, 4, grid_size=5, device=d),
    lambda d: warpkan.UKANLinear(3, 4, pe_dim=4, embed_dim=3, hidden_dim=6, device=d),
    lambda d: warpkan.PolyKANLinear(3, 4, 3, bias=True, device=d),
    lambda d: warpkan.GroupRational(4, 2, device=d),
    lambda d: warpkan.GRKANLinear(4, 3, num_groups=2, device=d),
]


@pytest.mark.parametrize("index", range(len(NATIVE)))
def test_native_layers_copy_and_pickle(device, index):
    layer = NATIVE[index](device)
    n_in = 4 if index >= 3 else 3
    rng = np.random.default_rng(0)
    x = wp.array(rng.uniform(-1, 1, (9, n_in)).astype(np.float32), device=device)
    tape = wp.Tape()
    with tape:
        y = layer(x)
    tape.backward(grads={y: wp.ones_like(y)})
    if index == 0:  # a non-uniform grid: the copies keep the general path
        grid = layer.state_dict()["grid"]
        grid[:, 5] += 0.01
        layer.load_state_dict(dict(layer.state_dict(), grid=grid))
        assert not layer.uniform
    want = layer(x).numpy()
    for twin in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        np.testing.assert_array_equal(twin(x).numpy(), want)
        assert twin.device == layer.device
        for p, q in zip(layer.parameters(), twin.parameters()):
            assert p.ptr != q.ptr and q.requires_grad
            np.testing.assert_array_equal(p.numpy(), q.numpy())
            np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
        for q in twin.parameters():
            q.assign(q.numpy() + 0.5)
        np.testing.assert_array_equal(layer(x).numpy(), want)
        if index == 0:
            assert twin.uniform == layer.uniform
    network = warpkan.KANNetwork([layer])
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(network))(x).numpy(), want)


@pytest.mark.parametrize("shift", [1e-5, 1e-9])
def test_native_near_uniform_grid_float64_matches_reference(device, shift):
    layer = warpkan.KANLinear(4, 3, grid_size=6, device=device, dtype=wp.float64, seed=2)
    state = layer.state_dict()
    grid = state["grid"].copy()
    grid[1, 6] += shift * (grid[0, 1] - grid[0, 0])
    layer.load_state_dict(dict(state, grid=grid))
    assert not layer.uniform
    x = _spread(41, 4, "cpu")
    x[:, 1] = torch.linspace(-1.2, 1.2, 41, dtype=torch.float64)
    y = layer(wp.array(x.numpy(), dtype=wp.float64, device=device)).numpy()
    want = kan_linear(x, torch.from_numpy(grid), *(torch.from_numpy(state[k]) for k in
                                                   ("base_weight", "spline_weight", "spline_scaler")), 3)
    torch.testing.assert_close(torch.from_numpy(y), want, **TOL64)


# ------------------------------------------------------------------------------------ regulariser on zero edges
@pytest.mark.parametrize("zeroed", ["one_edge", "all_edges"])
def test_regularization_loss_is_finite_with_zero_edges(zeroed):
    """efficient-kan's formula p * log(p) gives NaN for an edge whose spline weights are all zero (as after
    pruning); the limit 0 log 0 = 0 is taken instead, and the gradients stay finite."""
    torch.manual_seed(0)
    layer = KANLinear(3, 2, grid_size=4, dtype=torch.float64)
    with torch.no_grad():
        if zeroed == "one_edge":
            layer.spline_weight[1, 2].zero_()
        else:
            layer.spline_weight.zero_()
    loss = layer.regularization_loss()
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(layer.spline_weight.grad).all()
    l1 = layer.spline_weight.detach().abs().mean(-1)
    if zeroed == "one_edge":  # the other edges' terms are efficient-kan's
        p = l1[l1 > 0] / l1.sum()
        assert torch.allclose(loss, l1.sum() - (p * p.log()).sum(), rtol=1e-14, atol=0)
    else:
        assert loss.item() == 0.0
