"""Physics-informed KAN for the 1-D heat equation u_t = alpha u_xx on x in [-1, 1], t in [0, 1], with
u(x, 0) = sin(pi x) and u(+-1, t) = 0 (exact solution exp(-alpha pi^2 t) sin(pi x)), in pure Warp (no torch).

The network is a 2 -> H -> 1 KAN without base path: h_j = phi_j(x) + psi_j(t), u = sum_j g_j(h_j). The PDE
residual is computed in one Warp kernel from the analytic derivatives of the B-spline building block
(``warpkan.funcs.bspline_funcs(3).spline_d2``: value, first and second derivative), chained by hand:
u_t = sum_j g_j'(h_j) psi_j'(t), u_xx = sum_j g_j''(h_j) phi_j'(x)^2 + g_j'(h_j) phi_j''(x). No finite
differences; ``wp.Tape`` differentiates the kernel (derivatives included) with respect to the coefficients.
The script exits non-zero when the relative L2 error against the exact solution is above the target.
"""

import argparse
import math
import os
import sys

import numpy as np
import warp as wp
from tqdm import tqdm

import warpkan
from warpkan.funcs import bspline_funcs

ALPHA = 0.1
HIDDEN = 8
ORDER = 3
SPLINE = bspline_funcs(ORDER, wp.float32).spline_d2
# (lo, h, grid size) of the x edges, t edges and output edges
X_GRID = (-1.0, 0.25, 8)
T_GRID = (0.0, 0.25, 4)
G_GRID = (-3.0, 0.5, 12)
X_LO, X_H, X_SIZE = X_GRID  # Warp kernels read plain constants, not tuple items
T_LO, T_H, T_SIZE = T_GRID
G_LO, G_H, G_SIZE = G_GRID


@wp.func
def heat_network(x: float, t: float, cx: wp.array2d(dtype=float), ct: wp.array2d(dtype=float),
                 cg: wp.array2d(dtype=float)):
    """(u, u_t, u_xx) at (x, t)."""
    u = float(0.0)
    u_t = float(0.0)
    u_xx = float(0.0)
    for j in range(HIDDEN):
        px, px1, px2 = SPLINE(x, X_LO, X_H, X_SIZE, cx, j)
        pt, pt1, pt2 = SPLINE(t, T_LO, T_H, T_SIZE, ct, j)
        g, g1, g2 = SPLINE(px + pt, G_LO, G_H, G_SIZE, cg, j)
        u += g
        u_t += g1 * pt1
        u_xx += g2 * px1 * px1 + g1 * px2
    return u, u_t, u_xx


@wp.kernel
def heat_loss(points: wp.array(dtype=wp.vec2), kind: wp.array(dtype=int), weight: wp.array(dtype=float),
              cx: wp.array2d(dtype=float), ct: wp.array2d(dtype=float), cg: wp.array2d(dtype=float),
              loss: wp.array(dtype=float)):
    """kind 0: PDE residual; 1: initial condition; 2: boundary condition. weight = 1 / count of that kind."""
    n = wp.tid()
    x = points[n][0]
    t = points[n][1]
    u, u_t, u_xx = heat_network(x, t, cx, ct, cg)
    r = float(0.0)
    if kind[n] == 0:
        r = u_t - ALPHA * u_xx
    elif kind[n] == 1:
        r = u - wp.sin(wp.pi * x)
    else:
        r = u
    wp.atomic_add(loss, 0, weight[n] * r * r)


@wp.kernel
def heat_eval(points: wp.array(dtype=wp.vec2), cx: wp.array2d(dtype=float), ct: wp.array2d(dtype=float),
              cg: wp.array2d(dtype=float), out: wp.array(dtype=float)):
    n = wp.tid()
    u, u_t, u_xx = heat_network(points[n][0], points[n][1], cx, ct, cg)
    out[n] = u


def exact(x, t):
    return np.exp(-ALPHA * math.pi ** 2 * t) * np.sin(math.pi * x)


def collocation(n_interior, n_edge, rng):
    interior = np.stack([rng.uniform(-1, 1, n_interior), rng.uniform(0, 1, n_interior)], 1)
    initial = np.stack([np.linspace(-1, 1, n_edge), np.zeros(n_edge)], 1)
    boundary = np.stack([np.repeat([-1.0, 1.0 - 1e-6], n_edge // 2), np.tile(np.linspace(0, 1, n_edge // 2), 2)], 1)
    points = np.concatenate([interior, initial, boundary]).astype(np.float32)
    kind = np.concatenate([np.zeros(n_interior), np.ones(n_edge), np.full(len(boundary), 2)]).astype(np.int32)
    weight = np.concatenate([np.full(n_interior, 1.0 / n_interior), np.full(n_edge, 1.0 / n_edge),
                             np.full(len(boundary), 1.0 / len(boundary))]).astype(np.float32)
    return points, kind, weight


QUICK = {"steps": 1000}  # --quick: a short run; the same target error applies


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"a short run: {', '.join(f'--{k} {v}' for k, v in QUICK.items())} unless given")
    parser.add_argument("--steps", type=int, default=3000, help="Adam steps")
    parser.add_argument("--points", type=int, default=1024, help="interior collocation points")
    parser.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate (cut to 0.3x at 60%% and 85%% of the steps)")
    parser.add_argument("--device", default=None, help="Warp device (default: Warp's default, cuda when present)")
    parser.add_argument("--out", default="pinn_heat.png", help="where to save the plot")
    parser.add_argument("--target-error", type=float, default=2e-2,
                        help="the self-check's bound on the relative L2 error against the exact solution")
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
    points, kind, weight = collocation(args.points, 128, rng)
    points = wp.array(points, dtype=wp.vec2, device=device)
    kind = wp.array(kind, device=device)
    weight = wp.array(weight, device=device)

    def param(values):
        return wp.array(np.asarray(values, np.float32), device=device, requires_grad=True)

    greville = lambda lo, h, g: lo + (np.arange(g + ORDER) - (ORDER - 1) / 2) * h  # noqa: E731 (identity coefficients)
    cx = param(rng.uniform(-1, 1, (HIDDEN, 1)) * greville(*X_GRID)[None, :])
    ct = param(rng.uniform(-1, 1, (HIDDEN, 1)) * greville(*T_GRID)[None, :])
    cg = param(rng.normal(0, 0.1, (HIDDEN, G_GRID[2] + ORDER)))
    optimizer = warpkan.Adam([cx, ct, cg], lr=args.lr)
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
    tape = wp.Tape()
    history = []
    bar = tqdm(range(args.steps), desc="heat PINN", mininterval=1.0)
    for step in bar:
        if step in (int(0.6 * args.steps), int(0.85 * args.steps)):
            optimizer.lr = optimizer.lr * 0.3
        loss.zero_()
        with tape:
            wp.launch(heat_loss, dim=len(points), inputs=[points, kind, weight, cx, ct, cg], outputs=[loss], device=device)
        tape.backward(loss=loss)
        optimizer.step()
        tape.zero()
        tape.reset()
        if step % 20 == 0 or step == args.steps - 1:
            history.append(float(loss.numpy()[0]))
            bar.set_postfix(loss=f"{history[-1]:.2e}")

    xs, ts = np.meshgrid(np.linspace(-1, 1, 101), np.linspace(0, 1, 51))
    grid = np.stack([xs.ravel(), ts.ravel()], 1).astype(np.float32)
    pred = wp.empty(len(grid), dtype=float, device=device)
    wp.launch(heat_eval, dim=len(grid), inputs=[wp.array(grid, dtype=wp.vec2, device=device), cx, ct, cg], outputs=[pred],
              device=device)
    pred = pred.numpy().reshape(xs.shape).astype(np.float64)
    truth = exact(xs, ts)
    error = float(np.linalg.norm(pred - truth) / np.linalg.norm(truth))
    print(f"final loss {history[-1]:.3e}; relative L2 error vs exp(-alpha pi^2 t) sin(pi x) = {error:.3e}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, data, title, label in ((axes[0], pred, "KAN u(x, t)", "u"),
                                   (axes[1], pred - truth, "KAN u - exact u", "error")):
        im = ax.imshow(data, origin="lower", extent=(-1, 1, 0, 1), aspect="auto", cmap="coolwarm")
        ax.set_xlabel("x"), ax.set_ylabel("t"), ax.set_title(title)
        fig.colorbar(im, ax=ax, label=label)
    axes[2].semilogy(np.arange(len(history)) * 20, history, label="PDE + initial + boundary residuals")
    axes[2].set_xlabel("step"), axes[2].set_ylabel("loss"), axes[2].legend()
    axes[2].set_title(f"training loss; relative L2 error {error:.1e}")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"plot saved to {args.out}")
    if not error <= args.target_error:
        print(f"FAILED: relative L2 error {error:.3e} above {args.target_error:g}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
