"""Differentiable simulation in pure Warp (no torch): particles on a line move under a force law that is a
KAN edge (a cubic B-spline, ``warpkan.funcs.bspline_funcs(3).spline``), learned by back-propagating through
the whole rollout with ``wp.Tape`` until the simulated trajectories match those of a known law,
``F(r) = -k r + c r^3``.

Each step is one Warp kernel (symplectic Euler: v += dt F(x), x += dt v) writing a fresh state array, so the
tape can replay every step backwards. The script plots the learned law against the true one and exits
non-zero when they differ by more than the tolerance on the range the particles visit.
"""

import argparse
import os
import sys

import numpy as np
import warp as wp
from tqdm import tqdm

import warpkan
from warpkan.funcs import bspline_funcs

K_SPRING, C_CUBIC = 2.0, 0.5
GRID_LO, GRID_H, GRID_SIZE = -2.0, 0.5, 8
SPLINE = bspline_funcs(3, wp.float32).spline


@wp.func
def true_force(r: float):
    return -K_SPRING * r + C_CUBIC * r * r * r


@wp.kernel
def step_true(x: wp.array(dtype=float), v: wp.array(dtype=float), dt: float,
              x_new: wp.array(dtype=float), v_new: wp.array(dtype=float)):
    n = wp.tid()
    vn = v[n] + dt * true_force(x[n])
    v_new[n] = vn
    x_new[n] = x[n] + dt * vn


@wp.kernel
def step_learned(x: wp.array(dtype=float), v: wp.array(dtype=float), dt: float, coef: wp.array2d(dtype=float),
                 x_new: wp.array(dtype=float), v_new: wp.array(dtype=float)):
    n = wp.tid()
    force, dforce = SPLINE(x[n], GRID_LO, GRID_H, GRID_SIZE, coef, 0)
    vn = v[n] + dt * force
    v_new[n] = vn
    x_new[n] = x[n] + dt * vn


@wp.kernel
def trajectory_loss(x: wp.array(dtype=float), target: wp.array(dtype=float), scale: float, loss: wp.array(dtype=float)):
    n = wp.tid()
    d = x[n] - target[n]
    wp.atomic_add(loss, 0, scale * d * d)


@wp.kernel
def evaluate_law(r: wp.array(dtype=float), coef: wp.array2d(dtype=float), out: wp.array(dtype=float)):
    n = wp.tid()
    force, dforce = SPLINE(r[n], GRID_LO, GRID_H, GRID_SIZE, coef, 0)
    out[n] = force


def rollout(x0, v0, steps, dt, device, coef=None):
    """All states [x_0 .. x_T] (fresh arrays, so the tape can replay the steps backwards)."""
    xs, vs = [x0], [v0]
    for _ in range(steps):
        x_new = wp.empty_like(x0, requires_grad=coef is not None)
        v_new = wp.empty_like(v0, requires_grad=coef is not None)
        if coef is None:
            wp.launch(step_true, dim=len(x0), inputs=[xs[-1], vs[-1], dt], outputs=[x_new, v_new], device=device)
        else:
            wp.launch(step_learned, dim=len(x0), inputs=[xs[-1], vs[-1], dt, coef], outputs=[x_new, v_new], device=device)
        xs.append(x_new)
        vs.append(v_new)
    return xs


def fit_force_law(coef, x0, v0, targets, iters, lr, dt, device):
    """Adam on the spline's coefficients ``coef``, each iteration through a whole rollout from (x0, v0) against
    the target states; yields each iteration's trajectory loss.

    Each iteration records on a fresh ``wp.Tape``: a rollout writes fresh state arrays, and a tape that is
    only reset keeps the gradient of every array it has recorded (and zeroes them all in ``zero()``), so the
    memory and the time of an iteration would grow with the iteration count."""
    optimizer = warpkan.Adam([coef], lr=lr)
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
    sim_steps = len(targets) - 1
    scale = 1.0 / (len(x0) * sim_steps)
    for it in range(iters):
        if it == int(0.7 * iters):
            optimizer.lr = optimizer.lr * 0.2
        loss.zero_()
        tape = wp.Tape()
        with tape:
            states = rollout(x0, v0, sim_steps, dt, device, coef)
            for state, target in zip(states[1:], targets[1:]):
                wp.launch(trajectory_loss, dim=len(x0), inputs=[state, target, scale], outputs=[loss], device=device)
        tape.backward(loss=loss)
        optimizer.step()
        tape.zero()
        yield float(loss.numpy()[0])


QUICK = {"iters": 300}  # --quick: a short run; the same tolerance applies


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"a short run: {', '.join(f'--{k} {v}' for k, v in QUICK.items())} unless given")
    parser.add_argument("--iters", type=int, default=500, help="optimisation steps, each through a whole rollout")
    parser.add_argument("--particles", type=int, default=64, help="particles simulated")
    parser.add_argument("--sim-steps", type=int, default=60, help="time steps per rollout")
    parser.add_argument("--dt", type=float, default=0.03, help="time step")
    parser.add_argument("--lr", type=float, default=5e-2, help="Adam learning rate (cut to 0.2x at 70%% of the steps)")
    parser.add_argument("--device", default=None, help="Warp device (default: Warp's default, cuda when present)")
    parser.add_argument("--out", default="diffsim_particles.png", help="where to save the plot")
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="the self-check's bound on max |learned - true| / max |true|")
    args = parser.parse_args(argv)
    if args.quick:  # the quick values as defaults, so that options given explicitly still win
        parser.set_defaults(**QUICK)
        args = parser.parse_args(argv)
    return args


def main(argv=None):
    args = parse_args(argv)
    wp.init()
    device = wp.get_device(args.device)
    rng = np.random.default_rng(0)
    x0 = wp.array(rng.uniform(-1.6, 1.6, args.particles).astype(np.float32), device=device)
    v0 = wp.array(rng.uniform(-0.5, 0.5, args.particles).astype(np.float32), device=device)
    targets = rollout(x0, v0, args.sim_steps, args.dt, device)
    visited = np.concatenate([t.numpy() for t in targets])

    coef = wp.zeros((1, GRID_SIZE + 3), dtype=float, device=device, requires_grad=True)
    history = []
    bar = tqdm(fit_force_law(coef, x0, v0, targets, args.iters, args.lr, args.dt, device), total=args.iters,
               desc="learning the force law", mininterval=1.0)
    for value in bar:
        history.append(value)
        bar.set_postfix(loss=f"{value:.2e}")

    # the law is identifiable where the particles go: compare on the central 98% of the visited positions
    r = np.linspace(*np.quantile(visited, [0.01, 0.99]), 400)
    learned = wp.empty(len(r), dtype=float, device=device)
    wp.launch(evaluate_law, dim=len(r), inputs=[wp.array(r.astype(np.float32), device=device), coef], outputs=[learned],
              device=device)
    learned = learned.numpy()
    true = -K_SPRING * r + C_CUBIC * r ** 3
    error = float(np.abs(learned - true).max() / np.abs(true).max())
    print(f"trajectory loss {history[-1]:.3e}; max |learned - true| / max |true| on [{r[0]:.2f}, {r[-1]:.2f}] = {error:.3e}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_loss) = plt.subplots(1, 2, figsize=(11, 4))
    ax.plot(r, true, "k-", lw=3, alpha=0.3, label=f"true F(r) = -{K_SPRING:g} r + {C_CUBIC:g} r^3")
    ax.plot(r, learned, "r--", label="learned KAN edge")
    ax.set_xlabel("r"), ax.set_ylabel("F"), ax.legend(), ax.set_title(f"force law (max rel. error {error:.1e})")
    ax_loss.semilogy(history, label="mean squared distance to the true trajectories")
    ax_loss.set_xlabel("iteration"), ax_loss.set_ylabel("trajectory MSE"), ax_loss.legend()
    ax_loss.set_title("training loss")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"plot saved to {args.out}")
    if not error <= args.tolerance:
        print(f"FAILED: force law error {error:.3e} above {args.tolerance:g}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
