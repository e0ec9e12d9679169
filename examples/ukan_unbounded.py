"""UKAN on an unbounded domain: inputs spread over [-50, 50], used as they are (no normalisation).

A fixed-grid KAN (grid on [-1, 1], the usual default) sees almost every input off its grid, where only the
SiLU base path is left; UKAN's grid has no ends, and its coefficient generator makes coefficients for
whichever groups the data reaches. Both are trained on the same samples of

    f(x) = sin(x / 4) + 0.3 cos(x / 1.5) + 0.02 x

The script saves a plot and checks that UKAN fits the target (and beats the fixed-grid KAN).

    python examples/ukan_unbounded.py [--quick] [--steps 800] [--samples 4000] [--device cpu|cuda]
        [--out ukan_unbounded.png]
"""

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from warpkan.torch_bridge import KANLinear, UKANLinear  # noqa: E402


def target(x):
    return torch.sin(x / 4) + 0.3 * torch.cos(x / 1.5) + 0.02 * x


def train(model, x, y, steps, desc):
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    for _ in tqdm(range(steps), desc=desc):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
    return model


QUICK = {"steps": 300, "samples": 2000}  # --quick: a short run; the self-check still applies


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"a short run: {', '.join(f'--{k} {v}' for k, v in QUICK.items())} unless given")
    parser.add_argument("--steps", type=int, default=800, help="Adam steps per model")
    parser.add_argument("--samples", type=int, default=4000, help="training samples, uniform in [-50, 50]")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    parser.add_argument("--out", default="ukan_unbounded.png", help="where to save the plot")
    args = parser.parse_args(argv)
    if args.quick:  # the quick values as defaults, so that options given explicitly still win
        parser.set_defaults(**QUICK)
        args = parser.parse_args(argv)
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(0)
    dev = args.device
    x = (torch.rand(args.samples, 1, device=dev) * 100 - 50)
    x_test = torch.linspace(-50, 50, 2001, device=dev).unsqueeze(1)
    y, y_test = target(x), target(x_test)
    models = {
        "KAN, grid on [-1, 1]": torch.nn.Sequential(KANLinear(1, 8, grid_size=20), KANLinear(8, 1, grid_size=20)),
        "UKAN (h = 0.5)": torch.nn.Sequential(UKANLinear(1, 8, grid_delta=0.5, hidden_dim=64),
                                              UKANLinear(8, 1, grid_delta=0.25)),
    }
    rmse = {}
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(x_test.cpu(), y_test.cpu(), "k", lw=2, label="target")
    for name, model in models.items():
        model = train(model.to(dev), x, y, args.steps, name)
        with torch.no_grad():
            pred = model(x_test)
        rmse[name] = torch.sqrt(torch.mean((pred - y_test) ** 2)).item()
        ax.plot(x_test.cpu(), pred.cpu(), "--", label=f"{name}: test RMSE {rmse[name]:.3f}")
    ax.legend()
    ax.set_xlabel("x (not normalised)")
    ax.set_ylabel("f(x)")
    ax.set_title("f(x) = sin(x / 4) + 0.3 cos(x / 1.5) + 0.02 x on [-50, 50]: fits on the test grid")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    plt.close(fig)
    for name, value in rmse.items():
        print(f"{name:24s} test RMSE {value:.4f}")
    print(f"target std {y_test.std().item():.4f}; plot saved to {args.out}")
    ukan, kan = rmse["UKAN (h = 0.5)"], rmse["KAN, grid on [-1, 1]"]
    failures = []
    if not ukan < 0.15 * y_test.std().item():
        failures.append(f"UKAN did not fit the target: RMSE {ukan:.4f} is not below 15% of the target's spread")
    if not ukan < 0.5 * kan:
        failures.append(f"UKAN ({ukan:.4f}) does not clearly beat the fixed-grid KAN ({kan:.4f})")
    for failure in failures:
        print(f"FAILED: {failure}")
    if failures:
        return 1
    print("self-check passed: UKAN fits the unbounded target and beats the fixed-grid KAN")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
