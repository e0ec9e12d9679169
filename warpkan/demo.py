"""``warpkan demo``: a B-spline KAN, an unbounded-grid UKAN and an MLP of similar size learn
f(x, y) = exp(sin(pi x) + y^2)."""

from __future__ import annotations

import math
import os
import time


def target_function(xy):
    import torch

    return torch.exp(torch.sin(math.pi * xy[..., :1]) + xy[..., 1:] ** 2)


def build_models(device):
    import torch

    from .torch_bridge import KANLinear, UKANLinear

    kan = torch.nn.Sequential(KANLinear(2, 5, grid_size=8), KANLinear(5, 1, grid_size=8)).to(device)
    # UKAN: no grid range at all; spacing 0.25 gives the KAN's 8 cells on [-1, 1], and a small generator
    ukan = torch.nn.Sequential(
        UKANLinear(2, 5, grid_delta=0.25, pe_dim=8, embed_dim=4, hidden_dim=16),
        UKANLinear(5, 1, grid_delta=0.25, pe_dim=8, embed_dim=4, hidden_dim=16),
    ).to(device)
    hidden = 12
    mlp = torch.nn.Sequential(
        torch.nn.Linear(2, hidden), torch.nn.SiLU(), torch.nn.Linear(hidden, hidden), torch.nn.SiLU(), torch.nn.Linear(hidden, 1)
    ).to(device)
    return {"KAN [2, 5, 1], G=8, k=3": kan, "UKAN [2, 5, 1], h=0.25, k=3": ukan,
            f"MLP [2, {hidden}, {hidden}, 1], SiLU": mlp}


def run_demo(device: str = "cpu", steps: int = 1500, out_dir: str = "demo-output", seed: int = 0) -> int:
    import torch
    from tqdm import tqdm

    torch.manual_seed(seed)
    dev = torch.device(device)
    train_x = torch.rand(2048, 2, device=dev) * 2 - 1
    test_x = torch.rand(8192, 2, device=dev) * 2 - 1
    train_y, test_y = target_function(train_x), target_function(test_x)
    results = []
    models = build_models(dev)
    for name, model in models.items():
        n_params = sum(p.numel() for p in model.parameters())
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
        start = time.perf_counter()
        bar = tqdm(range(steps), desc=name, unit="step")
        for step in bar:
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(train_x), train_y)
            loss.backward()
            opt.step()
            sched.step()
            if step % 50 == 0:
                bar.set_postfix(rmse=f"{loss.sqrt().item():.4f}")
        if dev.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        with torch.no_grad():
            rmse_train = torch.nn.functional.mse_loss(model(train_x), train_y).sqrt().item()
            rmse_test = torch.nn.functional.mse_loss(model(test_x), test_y).sqrt().item()
        results.append((name, n_params, rmse_train, rmse_test, seconds))

    print(f"\nf(x, y) = exp(sin(pi x) + y^2) on [-1, 1]^2, {steps} Adam steps on {device}\n")
    print("| model | parameters | train RMSE | test RMSE | train time (s) |")
    print("|---|---|---|---|---|")
    for name, n_params, rmse_train, rmse_test, seconds in results:
        print(f"| {name} | {n_params} | {rmse_train:.4f} | {rmse_test:.4f} | {seconds:.1f} |")
    path = _plot(models, dev, out_dir)
    print(f"\nsurfaces written to {path}")
    kan_rmse = results[0][3]
    scale = test_y.std().item()
    if not kan_rmse < 0.05 * scale:
        print(f"FAILED: KAN test RMSE {kan_rmse:.4f} is not below 5% of the target's spread ({scale:.3f})")
        return 1
    return 0


def _plot(models, dev, out_dir) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    os.makedirs(out_dir, exist_ok=True)
    side = torch.linspace(-1, 1, 161, device=dev)
    gx, gy = torch.meshgrid(side, side, indexing="xy")
    pts = torch.stack([gx.reshape(-1), gy.reshape(-1)], dim=1)
    panels = [("true f(x, y)", target_function(pts))]
    with torch.no_grad():
        for name, model in models.items():
            panels.append((name, model(pts)))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.4))
    vmin, vmax = panels[0][1].min().item(), panels[0][1].max().item()
    for ax, (title, values) in zip(axes, panels):
        image = ax.imshow(values.reshape(161, 161).cpu().numpy(), origin="lower", extent=(-1, 1, -1, 1), vmin=vmin, vmax=vmax, cmap="viridis")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("x")
        ax.set_ylabel("y")
    fig.colorbar(image, ax=axes, shrink=0.8, label="f(x, y)")
    path = os.path.join(out_dir, "demo_surfaces.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
