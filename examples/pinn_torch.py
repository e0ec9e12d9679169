"""Physics-informed training in PyTorch with warpkan's torch layers, on two problems with exact solutions:

- heat: u_t = 0.1 u_xx on x in [-1, 1], t in [0, 1], u(x, 0) = sin(pi x), u(+-1, t) = 0;
  exact exp(-0.1 pi^2 t) sin(pi x);
- poisson: -(u_xx + u_yy) = 2 pi^2 sin(pi x) sin(pi y) on [-1, 1]^2, u = 0 on the boundary;
  exact sin(pi x) sin(pi y).

The residual is ordinary torch. Its derivatives come by Taylor mode (the default, ``--derivatives taylor``:
``warpkan.torch_bridge.jet`` carries u_x, u_t and the second derivatives forward through the network, the
ansatz included) or by ``torch.autograd.grad(create_graph=True)`` through the layers (``--derivatives
autograd``: warpkan's KAN layers differentiate to second order and beyond); then ``loss.backward()``. The initial
and boundary conditions are built into each problem's ansatz, so the loss is the PDE residual alone. Three
networks N, trained the same way and compared in one table a problem: a KANLinear KAN, a ChebyKANLinear KAN
and an MLP. The script exits non-zero when a KAN's relative L2 error against the exact solution is above the
problem's target.
"""

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch
from tqdm import tqdm

from warpkan.torch_bridge import ChebyKANLinear, Jet, KANLinear, capture_step, jet, jet_of

NU = 0.1
QUICK = {"steps": 150, "points": 256}  # --quick: a short run; the same target errors apply


def _col(z, k):
    """Coordinate k of the points [N, 2], or of their jet."""
    return z.col(k) if isinstance(z, Jet) else z[:, k:k + 1]


def _sin(v):
    return v.map(lambda w: (torch.sin(w), torch.cos(w), -torch.sin(w))) if isinstance(v, Jet) else torch.sin(v)


@dataclass(frozen=True)
class Problem:
    exact: Callable  # (a, b) -> u, a the first coordinate (x), b the second (t or y)
    ansatz: Callable  # (net, z) -> u(z) satisfying the initial and boundary conditions exactly (z: points or jet)
    residual: Callable  # (z, du, [d2u/dz_c2 for c in second]) -> the PDE residual
    second: tuple  # the coordinates whose second derivative the PDE has
    b_range: tuple  # the second coordinate's interval
    b_label: str
    target_error: float  # the self-check's bound on each KAN's relative L2 error


HEAT = Problem(
    exact=lambda x, t: torch.exp(-NU * math.pi**2 * t) * torch.sin(math.pi * x),
    ansatz=lambda net, z: _sin(math.pi * _col(z, 0)) + _col(z, 1) * (1 - _col(z, 0) * _col(z, 0)) * net(z),
    residual=lambda z, du, second: du[:, 1] - NU * second[0], second=(0,),
    b_range=(0.0, 1.0), b_label="t", target_error=0.02)
POISSON = Problem(
    exact=lambda x, y: torch.sin(math.pi * x) * torch.sin(math.pi * y),
    ansatz=lambda net, z: (1 - _col(z, 0) * _col(z, 0)) * (1 - _col(z, 1) * _col(z, 1)) * net(z),
    residual=lambda z, du, second: second[0] + second[1] + 2 * math.pi**2 * POISSON.exact(z[:, 0], z[:, 1]),
    second=(0, 1), b_range=(-1.0, 1.0), b_label="y", target_error=0.05)
PROBLEMS = {"heat": HEAT, "poisson": POISSON}


def networks():
    """name -> N(a, b): the two KANs and an MLP of a similar size."""
    return {
        "KANLinear 2-8-1 (G=5, cubic)": torch.nn.Sequential(KANLinear(2, 8, grid_size=5, grid_range=(-1, 1)),
                                                            KANLinear(8, 1, grid_size=5, grid_range=(-2, 2))),
        "ChebyKANLinear 2-8-1 (D=4, exact)": torch.nn.Sequential(ChebyKANLinear(2, 8, 4, mode="exact"),
                                                                 ChebyKANLinear(8, 1, 4, mode="exact")),
        "MLP 2-16-16-1 (tanh)": torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                                                    torch.nn.Tanh(), torch.nn.Linear(16, 1)),
    }


def residual_loss(problem, net, z, derivatives):
    if derivatives == "taylor":
        pairs = [(c, c) for c in problem.second]
        u = problem.ansatz(lambda coords: jet_of(net, coords), jet(torch.nn.Identity(), z.detach(), pairs))
        du = torch.cat([u.d(0), u.d(1)], 1)
        second = [u.d2(c, c)[:, 0] for c in problem.second]
    else:
        u = problem.ansatz(net, z)
        (du,) = torch.autograd.grad(u.sum(), z, create_graph=True)
        second = [torch.autograd.grad(du[:, c].sum(), z, create_graph=True)[0][:, c] for c in problem.second]
    return problem.residual(z, du, second).square().mean()


def train(problem, name, net, z, steps, lr, graph, derivatives):
    """Adam on the residual loss; with ``graph`` (CUDA) the whole step is captured once and replayed
    (``capture_step``): a step this small is bound by the host's Python and launches, not by the GPU."""
    optimizer = torch.optim.Adam(net.parameters(), lr=lr, capturable=graph)

    def step():
        optimizer.zero_grad(set_to_none=not graph)
        loss = residual_loss(problem, net, z, derivatives)
        loss.backward()
        optimizer.step()
        return loss.detach()

    history = []
    start = time.perf_counter()
    warmup = min(3, steps)
    if graph:
        step = capture_step(step, warmup)  # the warm-up calls are training steps too
    bar = tqdm(range(warmup if graph else 0, steps), desc=name[:24], mininterval=1.0)
    for index in bar:
        loss = step()
        if index % 10 == 0 or index == steps - 1:
            history.append(float(loss))
            bar.set_postfix(loss=f"{history[-1]:.2e}")
    return history, (time.perf_counter() - start) / steps


def solve(problem, args, device):
    """Train the three networks on one problem: name -> (history, seconds a step, L2 error, prediction), and
    the exact solution on the evaluation grid."""
    torch.manual_seed(0)
    lo, hi = problem.b_range
    z = torch.rand(args.points, 2)  # drawn on the CPU: the same points (and results) on every device
    z[:, 0] = z[:, 0] * 2 - 1
    z[:, 1] = lo + (hi - lo) * z[:, 1]
    z = z.to(device).requires_grad_()
    a, b = torch.meshgrid(torch.linspace(-1, 1, 101, device=device), torch.linspace(lo, hi, 51, device=device),
                          indexing="xy")
    grid = torch.stack([a.ravel(), b.ravel()], 1)
    truth = problem.exact(a, b)
    results = {}
    for name, net in networks().items():
        net = net.to(device)
        graph = device.type == "cuda" and not args.no_graph
        history, step_s = train(problem, name, net, z, args.steps, args.lr, graph, args.derivatives)
        with torch.no_grad():
            pred = problem.ansatz(net, grid).reshape(a.shape)
        results[name] = (history, step_s, float((pred - truth).norm() / truth.norm()), pred.cpu())
    return results, truth.cpu()


def print_table(problem_name, results, device):
    print(f"\n{problem_name}:\n| network | parameters | final residual loss | relative L2 error | ms / step "
          f"({device.type}) |\n|---|---|---|---|---|")
    for name, net in networks().items():
        history, step_s, error, _ = results[name]
        n_params = sum(p.numel() for p in net.parameters())
        print(f"| {name} | {n_params} | {history[-1]:.2e} | {error:.2e} | {1e3 * step_s:.1f} |")


def plot(solved, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, rows = plt.subplots(len(solved), 3, figsize=(15, 4 * len(solved)), squeeze=False)
    for axes, (problem_name, (problem, results, truth)) in zip(rows, solved.items()):
        kan = results[next(iter(results))][3]
        extent = (-1, 1, *problem.b_range)
        for ax, data, title in ((axes[0], kan, "KANLinear u"), (axes[1], kan - truth, "KANLinear u - exact u")):
            im = ax.imshow(data, origin="lower", extent=extent, aspect="auto", cmap="coolwarm")
            ax.set_xlabel("x"), ax.set_ylabel(problem.b_label), ax.set_title(f"{problem_name}: {title}")
            fig.colorbar(im, ax=ax)
        for name, (history, _, error, _) in results.items():
            axes[2].semilogy(torch.arange(len(history)) * 10, history, label=f"{name}: L2 error {error:.1e}")
        axes[2].set_xlabel("step"), axes[2].set_ylabel("PDE residual loss"), axes[2].legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=120)
    print(f"plot saved to {out}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"a short run: {', '.join(f'--{k} {v}' for k, v in QUICK.items())} unless given")
    parser.add_argument("--problem", choices=[*PROBLEMS, "both"], default="both", help="which PDE to solve")
    parser.add_argument("--steps", type=int, default=1000, help="Adam steps")
    parser.add_argument("--points", type=int, default=2048, help="collocation points")
    parser.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    parser.add_argument("--out", default="pinn_torch.png", help="where to save the plot")
    parser.add_argument("--derivatives", choices=["taylor", "autograd"], default="taylor",
                        help="the residual's derivatives by Taylor mode (warpkan.torch_bridge.jet) or by "
                             "torch.autograd.grad(create_graph=True)")
    parser.add_argument("--no-graph", action="store_true",
                        help="on CUDA, run every step eagerly instead of replaying a captured CUDA graph")
    args = parser.parse_args(argv)
    if args.quick:  # the quick values as defaults, so that options given explicitly still win
        parser.set_defaults(**QUICK)
        args = parser.parse_args(argv)
    return args


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    names = list(PROBLEMS) if args.problem == "both" else [args.problem]
    solved = {}
    for problem_name in names:
        problem = PROBLEMS[problem_name]
        results, truth = solve(problem, args, device)
        print_table(f"{problem_name} (derivatives: {args.derivatives})", results, device)
        solved[problem_name] = (problem, results, truth)
    plot(solved, args.out)
    failed = [f"{problem_name}: {name}" for problem_name, (problem, results, _) in solved.items()
              for name, result in results.items() if "KAN" in name and not result[2] <= problem.target_error]
    if failed:
        print(f"FAILED: relative L2 error above the problem's target for {', '.join(failed)}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
