"""Physics-informed training in PyTorch: the 2-D Poisson equation -(u_xx + u_yy) = 2 pi^2 sin(pi x) sin(pi y) on
[-1, 1]^2 with u = 0 on the boundary (exact solution sin(pi x) sin(pi y)), with warpkan's torch layers.

The residual is ordinary torch: u_xx and u_yy by ``torch.autograd.grad(create_graph=True)`` through the layers
(warpkan's KAN layers differentiate to second order and beyond), then ``loss.backward()``. The boundary
condition is built into the ansatz u = (1 - x^2)(1 - y^2) N(x, y), so the loss is the PDE residual alone.
Three networks N, trained the same way and compared in one table: a KANLinear KAN, a ChebyKANLinear KAN and
an MLP. The script exits non-zero when a KAN's relative L2 error against the exact solution is above the
target.
"""

import argparse
import math
import os
import sys
import time

import torch
from tqdm import tqdm

from warpkan.torch_bridge import ChebyKANLinear, KANLinear

QUICK = {"steps": 150, "points": 256}  # --quick: a short run; the same target error applies


def exact(x, y):
    return torch.sin(math.pi * x) * torch.sin(math.pi * y)


def networks():
    """name -> N(x, y): the two KANs and an MLP of a similar size."""
    return {
        "KANLinear 2-8-1 (G=5, cubic)": torch.nn.Sequential(KANLinear(2, 8, grid_size=5, grid_range=(-1, 1)),
                                                            KANLinear(8, 1, grid_size=5, grid_range=(-2, 2))),
        "ChebyKANLinear 2-8-1 (D=4, exact)": torch.nn.Sequential(ChebyKANLinear(2, 8, 4, mode="exact"),
                                                                 ChebyKANLinear(8, 1, 4, mode="exact")),
        "MLP 2-16-16-1 (tanh)": torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                                                    torch.nn.Tanh(), torch.nn.Linear(16, 1)),
    }


def solution(net, xy):
    """u(x, y) of the ansatz that is zero on the boundary."""
    x, y = xy[:, :1], xy[:, 1:]
    return (1 - x * x) * (1 - y * y) * net(xy)


def residual_loss(net, xy):
    u = solution(net, xy)
    (du,) = torch.autograd.grad(u.sum(), xy, create_graph=True)  # (u_x, u_y)
    (u_xx,) = torch.autograd.grad(du[:, 0].sum(), xy, create_graph=True)
    (u_yy,) = torch.autograd.grad(du[:, 1].sum(), xy, create_graph=True)
    forcing = 2 * math.pi**2 * exact(xy[:, 0], xy[:, 1])
    return (u_xx[:, 0] + u_yy[:, 1] + forcing).square().mean()


def train(name, net, xy, steps, lr):
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    history = []
    start = time.perf_counter()
    bar = tqdm(range(steps), desc=name[:24], mininterval=1.0)
    for step in bar:
        optimizer.zero_grad(set_to_none=True)
        loss = residual_loss(net, xy)
        loss.backward()
        optimizer.step()
        if step % 10 == 0 or step == steps - 1:
            history.append(float(loss))
            bar.set_postfix(loss=f"{history[-1]:.2e}")
    return history, (time.perf_counter() - start) / steps


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"a short run: {', '.join(f'--{k} {v}' for k, v in QUICK.items())} unless given")
    parser.add_argument("--steps", type=int, default=1000, help="Adam steps")
    parser.add_argument("--points", type=int, default=2048, help="collocation points")
    parser.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    parser.add_argument("--out", default="pinn_poisson_torch.png", help="where to save the plot")
    parser.add_argument("--target-error", type=float, default=0.05,
                        help="the self-check's bound on each KAN's relative L2 error against the exact solution")
    args = parser.parse_args(argv)
    if args.quick:  # the quick values as defaults, so that options given explicitly still win
        parser.set_defaults(**QUICK)
        args = parser.parse_args(argv)
    return args


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(0)
    xy = (torch.rand(args.points, 2, device=device) * 2 - 1).requires_grad_()
    xs, ys = torch.meshgrid(torch.linspace(-1, 1, 101, device=device), torch.linspace(-1, 1, 101, device=device),
                            indexing="xy")
    grid = torch.stack([xs.ravel(), ys.ravel()], 1)
    truth = exact(xs, ys)
    results = {}
    for name, net in networks().items():
        net = net.to(device)
        history, step_s = train(name, net, xy, args.steps, args.lr)
        with torch.no_grad():
            pred = solution(net, grid).reshape(xs.shape)
        error = float((pred - truth).norm() / truth.norm())
        results[name] = (history, step_s, error, pred.cpu())

    print(f"\n| network | parameters | final residual loss | relative L2 error | ms / step ({device.type}) |")
    print("|---|---|---|---|---|")
    for name, net in networks().items():
        history, step_s, error, _ = results[name]
        n_params = sum(p.numel() for p in net.parameters())
        print(f"| {name} | {n_params} | {history[-1]:.2e} | {error:.2e} | {1e3 * step_s:.1f} |")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    kan = results[next(iter(results))]
    im = axes[0].imshow(kan[3], origin="lower", extent=(-1, 1, -1, 1), aspect="auto", cmap="coolwarm")
    axes[0].set_xlabel("x"), axes[0].set_ylabel("y"), axes[0].set_title("KANLinear u(x, y)")
    fig.colorbar(im, ax=axes[0], label="u")
    im = axes[1].imshow(kan[3] - truth.cpu(), origin="lower", extent=(-1, 1, -1, 1), aspect="auto", cmap="coolwarm")
    axes[1].set_xlabel("x"), axes[1].set_ylabel("y"), axes[1].set_title("KANLinear u - exact u")
    fig.colorbar(im, ax=axes[1], label="error")
    for name, (history, _, error, _) in results.items():
        axes[2].semilogy(torch.arange(len(history)) * 10, history, label=f"{name}: L2 error {error:.1e}")
    axes[2].set_xlabel("step"), axes[2].set_ylabel("PDE residual loss"), axes[2].legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"plot saved to {args.out}")
    failed = [name for name, result in results.items() if "KAN" in name and not result[2] <= args.target_error]
    if failed:
        print(f"FAILED: relative L2 error above {args.target_error:g} for {', '.join(failed)}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
