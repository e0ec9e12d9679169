"""Physics-informed KAN and UKAN for logistic growth, df/dt = f (1 - f), f(0) = 0.5 on t in [-5, 5] (the UKAN
paper, sec. 3.2.3), in pure Warp (no torch).

Both networks are 1 -> 5 -> 1 without the base path. The residual needs df/dt: the forward kernel evaluates
every edge with ``warpkan.funcs.bspline_funcs(3).spline``, which returns the spline AND its x-derivative, and
chains them (df/dt = sum_j g_j'(h_j) h_j'(t)). ``wp.Tape`` differentiates that kernel, derivative included,
with respect to the coefficients; ``warpkan.Adam`` steps them.

- KAN: each edge a cubic B-spline with its own coefficients (layer 1 on [-5, 5], layer 2 on [-2, 2]).
- UKAN: each edge a cubic B-spline on a uniform grid of spacing ``delta`` whose coefficients come from a
  coefficient-generator MLP (CG-MLP) of (sinusoidal encoding of the group index g, embedding of the input
  feature): ``C_g = W2 silu(W1 [pe(g), e_i] + b1) + b2``. A first kernel writes the CG-MLP's coefficient table
  for the groups the inputs can reach (here a window of ``[-R, R]``; the layers generate only the touched
  groups of an unbounded grid), and the same B-spline block then reads it as a uniform spline.

The result is compared with 1 / (1 + exp(-t)); the script exits non-zero when either MSE is above the target.
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

ORDER = 3
K = ORDER + 1
HIDDEN = 5
SPLINE = bspline_funcs(ORDER, wp.float32).spline
# KAN grids: (lo, h, grid size) per layer
KAN_GRIDS = ((-5.0, 1.0, 10), (-2.0, 0.4, 10))
# UKAN: grid spacing per layer, table window [-R, R], CG-MLP sizes
UKAN_DELTAS = (1.0, 0.25)
UKAN_RADIUS = (5.0, 2.5)
PE_DIM, EMBED_DIM, CG_HIDDEN = 8, 4, 16
PE_BASE = 10000.0


@wp.func
def network(t: float, c1: wp.array2d(dtype=float), c2: wp.array2d(dtype=float), grids: wp.array2d(dtype=float),
            sizes: wp.vec2i):
    """(f, df/dt) of the 1 -> HIDDEN -> 1 spline network: edge j of layer 1 is row j of c1, of layer 2 row j of c2."""
    f = float(0.0)
    dfdt = float(0.0)
    for j in range(HIDDEN):
        h, dh = SPLINE(t, grids[0, 0], grids[0, 1], sizes[0], c1, j)
        g, dg = SPLINE(h, grids[1, 0], grids[1, 1], sizes[1], c2, j)
        f += g
        dfdt += dg * dh
    return f, dfdt


@wp.kernel
def logistic_loss(ts: wp.array(dtype=float), c1: wp.array2d(dtype=float), c2: wp.array2d(dtype=float),
                  grids: wp.array2d(dtype=float), sizes: wp.vec2i, loss: wp.array(dtype=float)):
    n = wp.tid()
    f, dfdt = network(ts[n], c1, c2, grids, sizes)
    residual = dfdt - f * (1.0 - f)
    term = residual * residual / float(ts.shape[0])
    if n == 0:  # the initial condition, weighted like the whole residual
        f0, d0 = network(0.0, c1, c2, grids, sizes)
        term += (f0 - 0.5) * (f0 - 0.5)
    wp.atomic_add(loss, 0, term)


@wp.kernel
def evaluate(ts: wp.array(dtype=float), c1: wp.array2d(dtype=float), c2: wp.array2d(dtype=float),
             grids: wp.array2d(dtype=float), sizes: wp.vec2i, f: wp.array(dtype=float)):
    n = wp.tid()
    value, slope = network(ts[n], c1, c2, grids, sizes)
    f[n] = value


@wp.kernel
def cg_mlp_table(group0: int, n_out: int, embedding: wp.array2d(dtype=float), w1: wp.array2d(dtype=float),
                 b1: wp.array(dtype=float), w2: wp.array2d(dtype=float), b2: wp.array(dtype=float),
                 table: wp.array2d(dtype=float)):
    """table[i * n_out + o, (g - group0) * K + r] = CG-MLP(pe(g), embedding[i])[o * K + r]."""
    i, gi, o = wp.tid()
    g = float(group0 + gi)
    acc = wp.vector(dtype=float, length=K)
    for r in range(K):
        acc[r] = b2[o * K + r]
    for hid in range(CG_HIDDEN):
        z = b1[hid]
        for a in range(PE_DIM // 2):
            freq = wp.pow(PE_BASE, -float(2 * a) / float(PE_DIM))
            z += w1[hid, 2 * a] * wp.sin(g * freq) + w1[hid, 2 * a + 1] * wp.cos(g * freq)
        for e in range(EMBED_DIM):
            z += w1[hid, PE_DIM + e] * embedding[i, e]
        act = z / (1.0 + wp.exp(-z))
        for r in range(K):
            acc[r] = acc[r] + w2[o * K + r, hid] * act
    for r in range(K):
        table[i * n_out + o, gi * K + r] = acc[r]


class KANModel:
    """Per-edge spline coefficients in wp.arrays."""

    def __init__(self, device, seed=0):
        rng = np.random.default_rng(seed)
        (lo1, h1, g1), (lo2, h2, g2) = KAN_GRIDS
        # layer 1 starts as spread-out lines of t (in range of layer 2's grid), layer 2 as small random curves
        knots1 = lo1 + (np.arange(g1 + ORDER) - (ORDER - 1) / 2) * h1  # Greville abscissae of a cubic
        slopes = rng.uniform(-0.3, 0.3, (HIDDEN, 1))
        self.c1 = wp.array((slopes * knots1[None, :]).astype(np.float32), device=device, requires_grad=True)
        self.c2 = wp.array(rng.normal(0, 0.1, (HIDDEN, g2 + ORDER)).astype(np.float32), device=device, requires_grad=True)
        self.grids = wp.array(np.array([[lo1, h1], [lo2, h2]], np.float32), device=device)
        self.sizes = wp.vec2i(g1, g2)

    def parameters(self):
        return [self.c1, self.c2]

    def coefficients(self):
        return self.c1, self.c2


class UKANLayerCG:
    """One UKAN layer's CG-MLP parameters and the coefficient table it writes for the groups of [-R, R]."""

    def __init__(self, n_in, n_out, delta, radius, rng, device):
        self.n_in, self.n_out, self.delta = n_in, n_out, delta
        # flat coefficient q belongs to basis q + 1 (support [(q + 1) delta, (q + 1 + K) delta)); cover [-R, R]
        cell_lo, cell_hi = math.floor(-radius / delta), math.ceil(radius / delta)
        self.group0 = math.floor((cell_lo - ORDER - 1) / K)
        n_groups = math.floor(cell_hi / K) - self.group0 + 1
        self.n_groups = n_groups
        q0 = self.group0 * K
        # the table is a uniform spline of G = n_groups K - k intervals starting at knot lo = (q0 + 1 + k) delta
        self.lo = (q0 + 1 + ORDER) * delta
        self.grid_size = n_groups * K - ORDER
        n_feat = PE_DIM + EMBED_DIM

        def param(values):
            return wp.array(np.asarray(values, np.float32), device=device, requires_grad=True)

        self.embedding = param(rng.standard_normal((n_in, EMBED_DIM)))
        self.w1 = param(rng.uniform(-1, 1, (CG_HIDDEN, n_feat)) / math.sqrt(n_feat))
        self.b1 = param(rng.uniform(-1, 1, CG_HIDDEN) / math.sqrt(n_feat))
        self.w2 = param(rng.uniform(-1, 1, (n_out * K, CG_HIDDEN)) * 0.3 / math.sqrt(CG_HIDDEN))
        self.b2 = param(np.zeros(n_out * K))
        self.table = wp.zeros((n_in * n_out, n_groups * K), dtype=float, device=device, requires_grad=True)

    def parameters(self):
        return [self.embedding, self.w1, self.b1, self.w2, self.b2]

    def write_table(self):
        self.table.zero_()
        wp.launch(cg_mlp_table, dim=(self.n_in, self.n_groups, self.n_out),
                  inputs=[self.group0, self.n_out, self.embedding, self.w1, self.b1, self.w2, self.b2],
                  outputs=[self.table], device=self.table.device)
        return self.table


class UKANModel:
    def __init__(self, device, seed=0):
        rng = np.random.default_rng(seed)
        self.layers = [UKANLayerCG(1, HIDDEN, UKAN_DELTAS[0], UKAN_RADIUS[0], rng, device),
                       UKANLayerCG(HIDDEN, 1, UKAN_DELTAS[1], UKAN_RADIUS[1], rng, device)]
        self.grids = wp.array(np.array([[l.lo, l.delta] for l in self.layers], np.float32), device=device)
        self.sizes = wp.vec2i(self.layers[0].grid_size, self.layers[1].grid_size)

    def parameters(self):
        return [p for layer in self.layers for p in layer.parameters()]

    def coefficients(self):
        # layer 1: row i * HIDDEN + o = o (one input); layer 2: row i * 1 + 0 = i: both are "row j = edge j"
        return tuple(layer.write_table() for layer in self.layers)


def train(model, steps, n_points, lr, device, desc):
    ts = wp.array(np.linspace(-5, 5, n_points, dtype=np.float32), device=device)
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
    optimizer = warpkan.Adam(model.parameters(), lr=lr)
    tape = wp.Tape()
    history = []
    bar = tqdm(range(steps), desc=desc, mininterval=1.0)
    for step in bar:
        if step == int(0.6 * steps) or step == int(0.85 * steps):
            optimizer.lr = optimizer.lr * 0.3
        loss.zero_()
        with tape:
            c1, c2 = model.coefficients()
            wp.launch(logistic_loss, dim=n_points, inputs=[ts, c1, c2, model.grids, model.sizes], outputs=[loss],
                      device=device)
        tape.backward(loss=loss)
        optimizer.step()
        tape.zero()
        tape.reset()
        if step % 50 == 0 or step == steps - 1:
            history.append(float(loss.numpy()[0]))
            bar.set_postfix(loss=f"{history[-1]:.2e}")
    return history


def predict(model, ts_np, device):
    ts = wp.array(ts_np.astype(np.float32), device=device)
    f = wp.empty(len(ts_np), dtype=float, device=device)
    c1, c2 = model.coefficients()
    wp.launch(evaluate, dim=len(ts_np), inputs=[ts, c1, c2, model.grids, model.sizes], outputs=[f], device=device)
    return f.numpy().astype(np.float64)


QUICK = {"steps": 1000}  # --quick: a short run; the same target MSE applies


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"a short run: {', '.join(f'--{k} {v}' for k, v in QUICK.items())} unless given")
    parser.add_argument("--steps", type=int, default=3000, help="Adam steps per network")
    parser.add_argument("--points", type=int, default=256, help="collocation points")
    parser.add_argument("--lr", type=float, default=2e-2, help="Adam learning rate (cut to 0.3x at 60%% and 85%% of the steps)")
    parser.add_argument("--device", default=None, help="Warp device (default: Warp's default, cuda when present)")
    parser.add_argument("--out", default="pinn_logistic.png", help="where to save the plot")
    parser.add_argument("--target-mse", type=float, default=1e-5, help="the self-check's bound on the MSE against the exact solution")
    args = parser.parse_args(argv)
    if args.quick:  # the quick values as defaults, so that options given explicitly still win
        parser.set_defaults(**QUICK)
        args = parser.parse_args(argv)
    return args


def main(argv=None):
    args = parse_args(argv)
    wp.init()
    device = wp.get_device(args.device)
    t_test = np.linspace(-5, 5, 1001)
    exact = 1.0 / (1.0 + np.exp(-t_test))
    results = {}
    for name, model in (("KAN", KANModel(device)), ("UKAN", UKANModel(device))):
        history = train(model, args.steps, args.points, args.lr, device, name)
        f = predict(model, t_test, device)
        mse = float(np.mean((f - exact) ** 2))
        results[name] = (f, mse, history)
        print(f"{name}: MSE vs 1/(1+exp(-t)) = {mse:.3e} (final loss {history[-1]:.3e})")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_loss) = plt.subplots(1, 2, figsize=(11, 4))
    ax.plot(t_test, exact, "k-", lw=3, alpha=0.3, label="1 / (1 + exp(-t))")
    for name, (f, mse, history) in results.items():
        ax.plot(t_test, f, "--", label=f"{name} (MSE {mse:.1e})")
        ax_loss.semilogy(np.arange(len(history)) * 50, history, label=name)
    ax.set_xlabel("t"), ax.set_ylabel("f"), ax.legend(), ax.set_title("df/dt = f (1 - f), f(0) = 0.5")
    ax_loss.set_xlabel("step"), ax_loss.set_ylabel("physics loss"), ax_loss.legend()
    ax_loss.set_title("training loss (residual + initial condition)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"plot saved to {args.out}")
    failed = [name for name, (_, mse, _) in results.items() if not mse <= args.target_mse]
    if failed:
        print(f"FAILED: MSE above {args.target_mse:g} for {', '.join(failed)}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
