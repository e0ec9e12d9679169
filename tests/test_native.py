"""Warp-native pipelines: the ``@wp.func`` building blocks inside a user's kernel (against numpy/scipy and
finite differences), gradient equality of every Warp-native layer with its torch layer, a mixed network
saved to and loaded from ``.npz``, and a short run of each example script."""

import os
import subprocess
import sys

import numpy as np
import pytest
import warp as wp

from warpkan import funcs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------------------- building blocks in a user kernel
SPLINE = funcs.bspline_funcs(3, wp.float64)
CHEB = funcs.poly_funcs("chebyshev", 5, wp.float64)
LEG = funcs.poly_funcs("legendre", 4, wp.float64)
RAT_A = funcs.rational_funcs(3, 2, "A", wp.float64)
RAT_B = funcs.rational_funcs(3, 2, "B", wp.float64)
GRID_LO, GRID_H, GRID_SIZE = -1.0, 0.25, 8
N_BLOCK_OUTPUTS = 10


@wp.kernel
def user_kernel(
    x: wp.array(dtype=wp.float64),
    spline_coef: wp.array2d(dtype=wp.float64),
    cheb_coef: wp.array2d(dtype=wp.float64),
    leg_coef: wp.array2d(dtype=wp.float64),
    num: wp.array2d(dtype=wp.float64),
    den: wp.array2d(dtype=wp.float64),
    out: wp.array2d(dtype=wp.float64),
):
    # a user's own kernel: each building block's value and x-derivative side by side
    n = wp.tid()
    v, dv = SPLINE.spline(x[n], wp.float64(GRID_LO), wp.float64(GRID_H), GRID_SIZE, spline_coef, 1)
    out[n, 0] = v
    out[n, 1] = dv
    v, dv = CHEB.series(x[n], cheb_coef, 0)
    out[n, 2] = v
    out[n, 3] = dv
    v, dv = LEG.series(x[n], leg_coef, 0)
    out[n, 4] = v
    out[n, 5] = dv
    v, dv = RAT_A.rational(x[n], num, 0, den, 0)
    out[n, 6] = v
    out[n, 7] = dv
    v, dv = RAT_B.rational(x[n], num, 0, den, 0)
    out[n, 8] = v
    out[n, 9] = dv


@wp.kernel
def user_loss(out: wp.array2d(dtype=wp.float64), loss: wp.array(dtype=wp.float64)):
    # a loss on values AND derivatives: its gradient runs through the analytic derivatives
    n, c = wp.tid()
    wp.atomic_add(loss, 0, wp.float64(c + 1) * out[n, c] * out[n, c])


def _numpy_blocks(x, spline_coef, cheb_coef, leg_coef, num, den):
    from numpy.polynomial import chebyshev, legendre
    from scipy.interpolate import BSpline

    k = 3
    knots = GRID_LO + (np.arange(GRID_SIZE + 2 * k + 1) - k) * GRID_H
    # every basis on its own support, so the partial bases of the extended grid count too (as in the layers)
    spline_v = np.zeros_like(x)
    spline_d = np.zeros_like(x)
    for j, c in enumerate(spline_coef[1]):
        element = BSpline.basis_element(knots[j: j + k + 2], extrapolate=False)
        spline_v += c * np.nan_to_num(element(x))
        spline_d += c * np.nan_to_num(element.derivative()(x))
    t = np.tanh(x)
    cols = [spline_v, spline_d]
    cols += [chebyshev.chebval(t, cheb_coef[0]), chebyshev.chebval(t, chebyshev.chebder(cheb_coef[0])) * (1 - t * t)]
    cols += [legendre.legval(t, leg_coef[0]), legendre.legval(t, legendre.legder(leg_coef[0])) * (1 - t * t)]

    def rational(z, variant):
        p = np.polyval(num[0][::-1], z)
        powers = np.stack([z ** j for j in range(1, den.shape[1] + 1)])
        if variant == "A":
            q = 1 + (np.abs(den[0])[:, None] * np.abs(powers)).sum(0)
        else:
            q = 1 + np.abs((den[0][:, None] * powers).sum(0))
        return p / q

    eps = 1e-6
    for variant in ("A", "B"):
        cols += [rational(x, variant), (rational(x + eps, variant) - rational(x - eps, variant)) / (2 * eps)]
    return np.stack(cols, axis=1)


def _block_inputs(seed=0):
    rng = np.random.default_rng(seed)
    # points inside the grid, past its ends, and away from the cell boundaries (for finite differences)
    x = np.concatenate([np.linspace(-2.3, 2.1, 23), [-1.9, 0.37, 1.13]]) + 1e-3
    return {
        "x": x,
        "spline_coef": rng.standard_normal((2, GRID_SIZE + 3)),
        "cheb_coef": rng.standard_normal((1, 6)),
        "leg_coef": rng.standard_normal((1, 5)),
        "num": rng.standard_normal((1, 4)),
        "den": rng.standard_normal((1, 2)),
    }


def _run_blocks(arrays, device, tape=None):
    wp_arrays = {k: wp.array(v, dtype=wp.float64, device=device, requires_grad=tape is not None) for k, v in arrays.items()}
    out = wp.zeros((len(arrays["x"]), N_BLOCK_OUTPUTS), dtype=wp.float64, device=device, requires_grad=tape is not None)
    loss = wp.zeros(1, dtype=wp.float64, device=device, requires_grad=tape is not None)
    inputs = [wp_arrays[k] for k in ("x", "spline_coef", "cheb_coef", "leg_coef", "num", "den")]
    if tape is None:
        wp.launch(user_kernel, dim=len(arrays["x"]), inputs=inputs, outputs=[out], device=device)
        return out.numpy()
    with tape:
        wp.launch(user_kernel, dim=len(arrays["x"]), inputs=inputs, outputs=[out], device=device)
        wp.launch(user_loss, dim=out.shape, inputs=[out], outputs=[loss], device=device)
    tape.backward(loss=loss)
    return {k: a.grad.numpy() for k, a in wp_arrays.items()}


def test_building_blocks_value_and_derivative(device):
    arrays = _block_inputs()
    got = _run_blocks(arrays, device)
    expected = _numpy_blocks(**arrays)
    # float64 throughout: the finite-difference columns (rational derivative) err by about 1e-9
    np.testing.assert_allclose(got, expected, rtol=1e-7, atol=1e-7)


def test_building_blocks_tape_gradient_through_derivative(device):
    """wp.Tape through a kernel that uses the blocks: the gradient of a loss on values AND x-derivatives
    equals central finite differences of the same kernel (float64)."""
    arrays = _block_inputs(1)
    grads = _run_blocks(arrays, device, tape=wp.Tape())

    def loss_of(values):
        out = _run_blocks(values, device)
        return float((out ** 2 * np.arange(1, N_BLOCK_OUTPUTS + 1)).sum())

    eps = 1e-6
    probes = [("x", (3,)), ("x", (12,)), ("x", (24,)), ("spline_coef", (1, 4)), ("spline_coef", (0, 4)),
              ("cheb_coef", (0, 3)), ("leg_coef", (0, 2)), ("num", (0, 1)), ("den", (0, 0)), ("den", (0, 1))]
    for name, index in probes:
        plus = {k: v.copy() for k, v in arrays.items()}
        minus = {k: v.copy() for k, v in arrays.items()}
        plus[name][index] += eps
        minus[name][index] -= eps
        numeric = (loss_of(plus) - loss_of(minus)) / (2 * eps)
        assert abs(grads[name][index] - numeric) <= 1e-5 * max(1.0, abs(numeric)), (name, index, grads[name][index], numeric)


def test_building_block_factories_check_arguments():
    with pytest.raises(ValueError, match="order"):
        funcs.bspline_funcs(0)
    with pytest.raises(TypeError, match="scalar"):
        funcs.bspline_funcs(3, wp.float16)
    with pytest.raises(ValueError, match="variant"):
        funcs.rational_funcs(3, 2, "C")
    with pytest.raises(ValueError):
        funcs.poly_funcs("no-such-basis", 3)
    assert funcs.bspline_funcs(3) is funcs.bspline_funcs(3)


# ---------------------------------------------------------------------------- Warp-native == torch gradients
def _native_and_torch(family):
    """(native layer, torch layer, in_features) in float64 with the same parameters; None when the family's
    native module is absent."""
    import importlib

    import torch

    from warpkan import torch_bridge as tb

    modules = {"bspline": "warpkan.native.bspline", "poly": "warpkan.native.poly", "ukan": "warpkan.native.ukan",
               "rational": "warpkan.native.rational"}
    try:
        native_module = importlib.import_module(modules[family])
    except ImportError:
        return None
    if family == "bspline":
        native = native_module.KANLinear(5, 3, grid_size=4, spline_order=3, dtype=wp.float64, device="cpu", seed=1)
        torch_layer = tb.KANLinear(5, 3, grid_size=4, spline_order=3).double()
    elif family == "poly":
        native = native_module.PolyKANLinear(5, 3, degree=4, mode="exact", bias=True, dtype=wp.float64, device="cpu", seed=1)
        torch_layer = tb.PolyKANLinear(5, 3, degree=4, mode="exact", bias=True, dtype=torch.float64)
    elif family == "ukan":
        native = native_module.UKANLinear(5, 3, grid_delta=0.3, pe_dim=4, embed_dim=2, hidden_dim=6, dtype=wp.float64,
                                          device="cpu", seed=1)
        torch_layer = tb.UKANLinear(5, 3, grid_delta=0.3, pe_dim=4, embed_dim=2, hidden_dim=6).double()
    else:
        native = native_module.GRKANLinear(8, 3, num_groups=2, order=(3, 3), dtype=wp.float64, device="cpu")
        torch_layer = tb.GRKANLinear(8, 3, num_groups=2, order=(3, 3), dtype=torch.float64)
    state = {k: torch.as_tensor(np.asarray(v)) for k, v in native.state_dict().items()}
    torch_layer.load_state_dict(state, strict=False)
    return native, torch_layer, native.in_features


@pytest.mark.parametrize("family", ["bspline", "poly", "ukan", "rational"])
def test_native_gradients_equal_torch(family):
    torch = pytest.importorskip("torch")
    pair = _native_and_torch(family)
    if pair is None:
        pytest.skip(f"warpkan.native.{family} is absent")
    native, torch_layer, n_in = pair
    rng = np.random.default_rng(2)
    x_np = rng.uniform(-1.2, 1.2, (7, n_in))
    dy_np = rng.standard_normal((7, torch_layer(torch.as_tensor(x_np)).shape[1]))

    x = wp.array(x_np, dtype=wp.float64, device="cpu", requires_grad=True)
    tape = wp.Tape()
    with tape:
        y = native(x)
    tape.backward(grads={y: wp.array(dy_np, dtype=wp.float64, device="cpu")})

    x_t = torch.tensor(x_np, requires_grad=True)
    y_t = torch_layer(x_t)
    y_t.backward(torch.as_tensor(dy_np))
    np.testing.assert_allclose(y.numpy(), y_t.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), x_t.grad.numpy(), rtol=1e-9, atol=1e-12)

    # the native gradients in the torch layout: load them as the parameters and read the state dict back
    for p in native.parameters():
        p.assign(p.grad)
    native_grads = native.state_dict()
    compared = 0
    for name, param in torch_layer.named_parameters():
        key = name if name in native_grads else name.split(".")[-1]
        if param.grad is None or key not in native_grads:
            continue
        np.testing.assert_allclose(native_grads[key], param.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)
        compared += 1
    assert compared == len([p for p in torch_layer.parameters() if p.grad is not None])


def test_mixed_network_npz_roundtrip(tmp_path):
    import warpkan

    def build(seed):
        layers = [warpkan.KANLinear(3, 4, grid_size=5, device="cpu", seed=seed),
                  warpkan.PolyKANLinear(4, 4, degree=3, mode="exact", device="cpu", seed=seed),
                  warpkan.GRKANLinear(4, 4, num_groups=2, device="cpu", seed=seed),
                  warpkan.UKANLinear(4, 2, pe_dim=4, embed_dim=2, hidden_dim=8, device="cpu", seed=seed)]
        return warpkan.KANNetwork(layers)

    net = build(0)
    x = wp.array(np.random.default_rng(0).uniform(-1, 1, (6, 3)).astype(np.float32), device="cpu")
    path = tmp_path / "net.npz"
    net.save(path)
    other = build(1)
    assert not np.allclose(other(x).numpy(), net(x).numpy())
    other.load(path)
    np.testing.assert_array_equal(other(x).numpy(), net(x).numpy())
    with pytest.raises(ValueError, match="holds a network"):
        warpkan.KANNetwork([warpkan.KANLinear(3, 4, grid_size=6, device="cpu")]).load(path)


# ---------------------------------------------------------------------------- examples, reduced
@pytest.mark.parametrize("script, args", [
    ("pinn_logistic.py", ["--steps", "60", "--target-mse", "1"]),
    ("pinn_heat.py", ["--steps", "30", "--points", "128", "--target-error", "10"]),
    ("diffsim_particles.py", ["--iters", "3", "--sim-steps", "10", "--particles", "16", "--tolerance", "100"]),
])
def test_example_runs_and_plots(script, args, tmp_path):
    """A short run of each example (tolerances opened: this checks that it runs, checks and plots; the
    default settings reach the documented accuracy)."""
    out = tmp_path / "plot.png"
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *args, "--out", str(out),
                             "--device", "cpu"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "torch" not in result.stdout
    assert out.exists() and out.stat().st_size > 0


def test_diffsim_iterations_let_each_rollout_go():
    """The diffsim example's training loop keeps no earlier iteration's arrays: each rollout writes fresh state
    arrays, which a tape only reset (not replaced) would keep, with their gradients, zeroing them all at every
    iteration, so that the time and the memory of an iteration grew with the iteration count."""
    import gc
    import importlib.util

    path = os.path.join(ROOT, "examples", "diffsim_particles.py")
    spec = importlib.util.spec_from_file_location("diffsim_particles", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    x0 = wp.array(np.linspace(-1.5, 1.5, 8, dtype=np.float32), device="cpu")
    v0 = wp.zeros(8, dtype=float, device="cpu")
    targets = example.rollout(x0, v0, 5, 0.03, "cpu")
    coef = wp.zeros((1, example.GRID_SIZE + 3), dtype=float, device="cpu", requires_grad=True)
    live_arrays = []  # after the second and the fourth iteration (the first makes the optimizer's state)
    for iteration, _ in enumerate(example.fit_force_law(coef, x0, v0, targets, iters=4, lr=0.05, dt=0.03,
                                                        device="cpu")):
        if iteration in (1, 3):
            gc.collect()
            live_arrays.append(sum(type(o) is wp.array for o in gc.get_objects()))
    assert live_arrays[0] == live_arrays[1], live_arrays


def test_examples_do_not_import_torch():
    for script in ("pinn_logistic.py", "pinn_heat.py", "diffsim_particles.py"):
        code = f"import runpy, sys; sys.argv = ['x', '--help']\ntry:\n    runpy.run_path({os.path.join(ROOT, 'examples', script)!r}, run_name='__main__')\nexcept SystemExit:\n    pass\nprint('torch' in sys.modules)"
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert result.stdout.strip().endswith("False"), (script, result.stdout, result.stderr[-1000:])
