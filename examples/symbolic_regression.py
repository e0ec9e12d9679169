"""Symbolic regression with a KAN: recover f(x, y) = exp(sin(pi x) + y^2) as a formula.

1. train a [2, 5, 1] KANLinear network on samples of f with pykan's sparsity penalty
   (``warpkan.interpret.sparsity_penalty``, pykan's ``reg`` with its defaults: ``lamb`` times the sum of the
   edges' scales, each the standard deviation of phi_{o,i} over the batch over that of its input (+ 0.1), plus
   twice the entropy of the scales over each node's edges): Adam first, whose small steps give the penalty
   time to empty the hidden nodes the function does not need, then L-BFGS (alone, with or without the penalty,
   L-BFGS settles for some seeds in a minimum that spreads f over several hidden nodes with non-monotonic outer
   functions, which the penalty does not leave); the knots are refitted to each layer's inputs a few times
   early on;
2. prune with pykan's default thresholds (``warpkan.interpret.prune``): f is one outer function of one sum,
   exp(g(x) + k(y)), so one hidden node should be left; while more are, another round of regularised L-BFGS and
   another prune;
3. train the pruned network without the penalty; ``auto_symbolic`` fits every edge to the function library (sin,
   x^2 and exp are expected; of fits whose R^2 differ by less than ``--r2-tolerance`` the simplest is taken) and
   returns a SymbolicKAN, whose constants are then fine-tuned by L-BFGS;
4. print the recovered formula (``formula``) and check it: its RMSE against f on held-out points must be at
   most 1e-2 and no edge may be left numeric (non-zero exit otherwise).

It saves a pykan-style plot of the trained and the pruned networks (``--out``).

    python examples/symbolic_regression.py [--quick] [--seed 1] [--out symbolic_regression.png] [--device cpu|cuda]
"""

import argparse
import math
import sys
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import sympy  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from warpkan.interpret import auto_symbolic, formula, importance, plot_network, prune, sparsity_penalty  # noqa: E402
from warpkan.torch_bridge import KANLinear  # noqa: E402


def target(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(torch.sin(math.pi * x[:, :1]) + x[:, 1:2] ** 2)


def update_grids(model, x):
    """Refit every KANLinear's knots to the inputs it sees."""
    with torch.no_grad():
        h = x
        for layer in model:
            if isinstance(layer, KANLinear):
                layer.update_grid(h)
            h = layer(h)


def fit(model, x, y, steps, desc, lamb=0.0, grid_updates=(), adam=False):
    """Minimise the mean squared error (+ ``lamb`` times the sparsity penalty) by ``steps`` Adam steps (learning
    rate 1e-2) or ``steps`` L-BFGS rounds of at most 20 iterations; knots refitted to each layer's inputs
    before the steps in ``grid_updates`` (KANLinear layers only). Returns the final mean squared error."""
    def loss_fn():
        loss = torch.nn.functional.mse_loss(model(x), y)
        return loss + lamb * sparsity_penalty(model, x) if lamb else loss

    def closure():
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        return loss

    opt = None
    bar = tqdm(range(steps), desc=desc, leave=False, mininterval=0.5)
    for step in bar:
        if step in grid_updates:
            update_grids(model, x)
            opt = None
        if opt is None:  # (re)started after a grid update: the old moments or curvature pairs no longer apply
            opt = (torch.optim.Adam(model.parameters(), lr=1e-2) if adam else
                   torch.optim.LBFGS(model.parameters(), lr=1, max_iter=20, history_size=10,
                                     line_search_fn="strong_wolfe"))
        loss = opt.step(closure)
        if not adam or step % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.2e}")
    with torch.no_grad():
        return torch.nn.functional.mse_loss(model(x), y).item()


def widths(model):
    return [model[0].in_features] + [layer.out_features for layer in model]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples and steps (a smoke run)")
    parser.add_argument("--samples", type=int, default=None, help="training samples (default 2000, quick 1000)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="symbolic_regression.png")
    parser.add_argument("--lamb", type=float, default=1e-2, help="sparsity penalty of the Adam steps (L-BFGS: a third)")
    parser.add_argument("--r2-threshold", type=float, default=0.9, help="auto_symbolic's R^2 threshold")
    parser.add_argument("--r2-tolerance", type=float, default=1e-4,
                        help="auto_symbolic's r2_tolerance: of fits within it of each other, the simplest")
    parser.add_argument("--max-rmse", type=float, default=1e-2, help="held-out RMSE the formula must reach")
    args = parser.parse_args()
    samples = args.samples or (1000 if args.quick else 2000)
    # Adam steps, regularised L-BFGS rounds (each prune round too), L-BFGS rounds of the pruned network and of the
    # formula's constants
    steps = (1000, 30, 20, 20) if args.quick else (2000, 50, 40, 40)
    start = time.perf_counter()
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # a tiny network: more threads only add synchronisation (a lot on a busy machine)
    x = torch.rand(samples, 2, device=device) * 2 - 1
    x_test = torch.rand(2000, 2, device=device) * 2 - 1
    y, y_test = target(x), target(x_test)

    # contiguous parameters: torch's L-BFGS flattens every gradient with view(-1)
    options = dict(grid_size=5, spline_order=3, contiguous_parameters=True, device=device)
    model = torch.nn.Sequential(KANLinear(2, 5, **options), KANLinear(5, 1, **options))
    fit(model, x, y, steps[0], "train [2, 5, 1], Adam + sparsity", lamb=args.lamb, adam=True,
        grid_updates=range(0, steps[0] // 2, steps[0] // 10))
    loss = fit(model, x, y, steps[1], "train [2, 5, 1], L-BFGS + sparsity", lamb=args.lamb / 3,
               grid_updates=range(0, steps[1] // 2, 5))
    hidden = importance(model, x).node[1]
    print(f"[2, 5, 1] KAN: train MSE {loss:.2e}; hidden-node importance {[round(float(v), 3) for v in hidden]}")

    # pykan's default thresholds (node 1e-2, edge 3e-2); while more than one hidden node is left, the penalty
    # gets another round to empty the weaker ones
    pruned = prune(model, x)
    for _ in range(3):
        if pruned[0].out_features == 1:
            break
        print(f"  pruned to {widths(pruned)}: another round with the penalty")
        fit(pruned, x, y, steps[1], f"train {widths(pruned)}, L-BFGS + sparsity", lamb=args.lamb / 3,
            grid_updates=range(0, steps[1] // 2, 5))
        pruned = prune(pruned, x)
    loss = fit(pruned, x, y, steps[2], f"train {widths(pruned)}", grid_updates=range(0, steps[2] // 2, 5))
    with torch.no_grad():
        kan_rmse = torch.sqrt(torch.mean((pruned(x_test) - y_test) ** 2)).item()
    print(f"pruned to {widths(pruned)}: train MSE {loss:.2e}, held-out RMSE {kan_rmse:.2e}")

    symbolic = auto_symbolic(pruned, x, r2_threshold=args.r2_threshold, r2_tolerance=args.r2_tolerance)
    for index, layer in enumerate(symbolic.layers):
        for o, i, edge in layer.fixed_edges():
            print(f"  layer {index} edge ({o}, {i}): {edge.name:8s} R^2 = {edge.r2:.6f}")
        left = layer.numeric_live_edges().sum().item()
        if left:
            print(f"  layer {index}: {left} edges stay numeric (no formula reached R^2 {args.r2_threshold})")
    loss = fit(symbolic, x, y, steps[3], "fine-tune the formula's constants")
    expression = formula(symbolic, variables=["x", "y"], digits=4)[0]
    print(f"recovered formula: f(x, y) = {expression}")

    numeric = sorted(str(f.func) for f in expression.atoms(sympy.Function) if str(f.func).startswith("phi_"))
    if numeric:
        print(f"self-check FAILED: edges {numeric} found no formula; train longer or lower --r2-threshold")
        sys.exit(1)
    variables = sympy.symbols("x y")
    evaluate = sympy.lambdify(variables, expression, "numpy")
    xt = x_test.double().cpu().numpy()
    predicted = np.broadcast_to(np.asarray(evaluate(xt[:, 0], xt[:, 1]), dtype=np.float64), xt[:, 0].shape)
    rmse = float(np.sqrt(np.mean((predicted - y_test[:, 0].double().cpu().numpy()) ** 2)))
    print(f"formula's RMSE on {len(xt)} held-out points: {rmse:.2e} (target: at most {args.max_rmse:g})")

    fig, axes = plt.subplots(1, 2, figsize=(10, 5))
    panels = ((model, "trained [2, 5, 1], sparsity penalty"), (symbolic, "pruned, symbolic (red)"))
    for ax, (net, name) in zip(axes, panels):
        diagram = plot_network(net, x, in_vars=["x", "y"], out_vars=["f"], width=5)
        diagram.canvas.draw()
        ax.imshow(np.asarray(diagram.canvas.buffer_rgba()))
        ax.set_title(name)
        ax.axis("off")
    fig.suptitle(f"f(x, y) = {expression}", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    plt.close(fig)
    print(f"plot saved to {args.out} ({time.perf_counter() - start:.0f} s in all)")
    if not rmse <= args.max_rmse:
        print(f"self-check FAILED: the formula's RMSE {rmse:.2e} is above {args.max_rmse:g}")
        sys.exit(1)
    print("self-check passed: the recovered formula matches f on held-out points")


if __name__ == "__main__":
    main()
