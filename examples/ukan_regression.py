"""UKAN vs KAN vs MLP on the UKAN paper's regression functions I-III, on the same data.

I:   f(x, y) = exp(J0(20 x) + y^2)
II:  f(x, y) = exp(sin(pi x) + y^2)
III: f(x_1..x_16) = exp(mean_i sin^2(pi x_i / 2))   (16 inputs)

Inputs are uniform in [-1, 1]. Each model is trained with Adam on the same samples; the script prints an
RMSE table on held-out points, saves a plot of what that table measures (each model's predictions against
the target at the held-out points, one panel per function), and checks that UKAN learns every function
(test RMSE below a quarter of the target's standard deviation).

    python examples/ukan_regression.py [--quick] [--steps 600] [--samples 2000] [--device cpu|cuda]
        [--out ukan_regression.png]
"""

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from warpkan.torch_bridge import KANLinear, UKANLinear  # noqa: E402

FUNCTIONS = {
    "I: exp(J0(20x) + y^2)": (2, lambda x: torch.exp(torch.special.bessel_j0(20 * x[:, :1]) + x[:, 1:2] ** 2)),
    "II: exp(sin(pi x) + y^2)": (2, lambda x: torch.exp(torch.sin(torch.pi * x[:, :1]) + x[:, 1:2] ** 2)),
    "III: exp(mean sin^2(pi x_i / 2)), 16-d": (16, lambda x: torch.exp(torch.sin(torch.pi * x / 2).square().mean(1, keepdim=True))),
}


def make_models(n_in, device):
    width = 5
    return {
        "KAN": torch.nn.Sequential(KANLinear(n_in, width, grid_size=20), KANLinear(width, 1, grid_size=20)),
        "UKAN": torch.nn.Sequential(UKANLinear(n_in, width, grid_delta=0.1), UKANLinear(width, 1, grid_delta=0.1)),
        "MLP": torch.nn.Sequential(torch.nn.Linear(n_in, 64), torch.nn.SiLU(), torch.nn.Linear(64, 64),
                                   torch.nn.SiLU(), torch.nn.Linear(64, 1)),
    }


def train(model, x, y, steps, desc):
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    for _ in tqdm(range(steps), desc=desc, leave=False):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
    return model


QUICK = {"samples": 1000}  # --quick: half the data, all the steps (UKAN needs them); the self-check still applies
MODEL_COLORS = {"KAN": "tab:blue", "UKAN": "tab:orange", "MLP": "tab:green"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"a short run: {', '.join(f'--{k} {v}' for k, v in QUICK.items())} unless given")
    parser.add_argument("--steps", type=int, default=600, help="Adam steps per model")
    parser.add_argument("--samples", type=int, default=2000, help="training samples per function")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    parser.add_argument("--out", default="ukan_regression.png", help="where to save the plot")
    args = parser.parse_args(argv)
    if args.quick:  # the quick values as defaults, so that options given explicitly still win
        parser.set_defaults(**QUICK)
        args = parser.parse_args(argv)
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(0)
    results = {}
    fig, axes = plt.subplots(1, len(FUNCTIONS), figsize=(5 * len(FUNCTIONS), 4.6))
    for ax, (name, (n_in, fn)) in zip(axes, FUNCTIONS.items()):
        x = torch.rand(args.samples, n_in, device=args.device) * 2 - 1
        x_test = torch.rand(1000, n_in, device=args.device) * 2 - 1
        y, y_test = fn(x), fn(x_test)
        for model_name, model in make_models(n_in, args.device).items():
            model = train(model.to(args.device), x, y, args.steps, f"{name[:3]} {model_name}")
            with torch.no_grad():
                pred = model(x_test)
            results[(name, model_name)] = torch.sqrt(torch.mean((pred - y_test) ** 2)).item()
            ax.scatter(y_test.cpu(), pred.cpu(), s=3, alpha=0.5, color=MODEL_COLORS[model_name],
                       label=f"{model_name}: RMSE {results[(name, model_name)]:.4f}")
        results[(name, "std(target)")] = y_test.std().item()
        lo, hi = y_test.min().item(), y_test.max().item()
        ax.plot([lo, hi], [lo, hi], "k-", lw=1, label="prediction = target")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("target f(x) at 1000 held-out points")
        ax.set_ylabel("model prediction")
        ax.legend(fontsize=8, markerscale=3)
    fig.suptitle("UKAN vs KAN vs MLP: predictions against the target on the test points (the RMSE table's data)")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    plt.close(fig)

    columns = ["KAN", "UKAN", "MLP", "std(target)"]
    print("\n| function | " + " | ".join(f"RMSE {c}" if c != "std(target)" else c for c in columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for name in FUNCTIONS:
        print(f"| {name} | " + " | ".join(f"{results[(name, c)]:.4f}" for c in columns) + " |")
    print(f"\nplot saved to {args.out}")
    failed = False
    for name in FUNCTIONS:
        ratio = results[(name, "UKAN")] / results[(name, "std(target)")]
        if not ratio < 0.25:
            print(f"FAILED: UKAN did not learn {name}: test RMSE / std(target) = {ratio:.3f}, not below 0.25")
            failed = True
    if failed:
        return 1
    print("self-check passed: UKAN's test RMSE is below 25% of the target's spread on every function")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
