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
