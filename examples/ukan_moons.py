"""UKAN classification on two moons, 2 -> 4 -> 2, with cross-entropy.

Uses scikit-learn's ``make_moons`` when it is installed, else the same construction written out (two
interleaving half circles plus Gaussian noise). Saves the decision regions and checks the test accuracy.

    python examples/ukan_moons.py [--quick] [--steps 800] [--device cpu|cuda] [--out ukan_moons.png]
"""

import argparse
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from warpkan.torch_bridge import UKANLinear  # noqa: E402


def make_moons(n, noise, seed):
    try:
        from sklearn.datasets import make_moons as sk_make_moons

        x, y = sk_make_moons(n, noise=noise, random_state=seed)
        return torch.tensor(x, dtype=torch.float32), torch.tensor(y)
    except ImportError:
        g = torch.Generator().manual_seed(seed)
        n_out = n // 2
        t_out = torch.linspace(0, math.pi, n_out)
        t_in = torch.linspace(0, math.pi, n - n_out)
        outer = torch.stack([torch.cos(t_out), torch.sin(t_out)], 1)
        inner = torch.stack([1 - torch.cos(t_in), 0.5 - torch.sin(t_in)], 1)
        x = torch.cat([outer, inner]) + noise * torch.randn(n, 2, generator=g)
        y = torch.cat([torch.zeros(n_out, dtype=torch.long), torch.ones(n - n_out, dtype=torch.long)])
        perm = torch.randperm(n, generator=g)
        return x[perm], y[perm]


QUICK = {"steps": 300}  # --quick: a short run; the self-check still applies


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"a short run: {', '.join(f'--{k} {v}' for k, v in QUICK.items())} unless given")
    parser.add_argument("--steps", type=int, default=800, help="Adam steps")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    parser.add_argument("--out", default="ukan_moons.png", help="where to save the plot")
    args = parser.parse_args(argv)
    if args.quick:  # the quick values as defaults, so that options given explicitly still win
        parser.set_defaults(**QUICK)
        args = parser.parse_args(argv)
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(0)
    dev = args.device
    x, y = make_moons(1000, 0.1, seed=0)
    x_test, y_test = make_moons(1000, 0.1, seed=1)
    x, y, x_test, y_test = x.to(dev), y.to(dev), x_test.to(dev), y_test.to(dev)
    model = torch.nn.Sequential(UKANLinear(2, 4, grid_delta=0.2), UKANLinear(4, 2, grid_delta=0.2)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in (bar := tqdm(range(args.steps), desc="UKAN 2-4-2 on moons")):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.4f}")
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        gx, gy = torch.meshgrid(torch.linspace(-1.5, 2.5, 300), torch.linspace(-1.0, 1.5, 250), indexing="xy")
        grid = torch.stack([gx.flatten(), gy.flatten()], 1).to(dev)
        regions = model(grid).argmax(1).reshape(gx.shape).cpu()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.contourf(gx, gy, regions, levels=[-0.5, 0.5, 1.5], colors=["tab:blue", "tab:red"], alpha=0.2)
    x_test, y_test = x_test.cpu(), y_test.cpu()
    for label, color in ((0, "tab:blue"), (1, "tab:red")):
        points = x_test[y_test == label]
        ax.scatter(points[:, 0], points[:, 1], s=4, color=color, label=f"test points of class {label}")
    ax.set_xlabel("x_1")
    ax.set_ylabel("x_2")
    ax.set_title(f"UKAN 2-4-2: decision regions (shaded), test accuracy {accuracy:.3f}")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    plt.close(fig)
    print(f"test accuracy {accuracy:.4f}; plot saved to {args.out}")
    if not accuracy > 0.97:
        print(f"FAILED: test accuracy {accuracy:.3f} is not above 97%")
        return 1
    print("self-check passed: test accuracy above 97%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
