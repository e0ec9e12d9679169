"""Warp-native benchmark: one training step of the logistic-ODE PINN (examples/pinn_logistic.py: a 1 -> 5 -> 1
B-spline KAN, residual df/dt - f (1 - f) from the splines' analytic derivatives, wp.Tape backward, Adam), at
useful collocation counts, against in the same run:

- the same network in pure torch (efficient-kan's basis recursion; df/dt by autograd with create_graph);
- an MLP of similar size (1 -> 10 -> 10 -> 1, tanh), df/dt by autograd;
- the torch bridge (``warpkan.torch_bridge.KANLinear``): whether its layers take the residual's df/dt
  (create_graph=True); ``warpkan bench pinn`` times the bridge on a PDE residual.

The Warp-native step needs the repository's ``examples/`` folder (the PINN lives there); from an installed
package without it the Warp rows say so.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import torch

from . import register
from .timing import time_fn

COLLOCATION = (4096, 65536)
QUICK_COLLOCATION = (1024,)


def _load_example():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "pinn_logistic.py")
    if not os.path.exists(path):
        return None
    spec = importlib.util.spec_from_file_location("warpkan_example_pinn_logistic", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _warp_step(example, device: str, n_points: int):
    import warp as wp

    import warpkan
    from warpkan.kernels._common import on_stream

    model = example.KANModel(device)
    ts = wp.array(np.linspace(-5, 5, n_points, dtype=np.float32), device=device)
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
    optimizer = warpkan.Adam(model.parameters(), lr=1e-3)
    tape = wp.Tape()
    stream = wp.stream_from_torch(torch.cuda.current_stream()) if device.startswith("cuda") else None

    def step():
        with on_stream(stream):
            loss.zero_()
            with tape:
                c1, c2 = model.coefficients()
                wp.launch(example.logistic_loss, dim=n_points, inputs=[ts, c1, c2, model.grids, model.sizes],
                          outputs=[loss], device=device)
            tape.backward(loss=loss)
            optimizer.step()
            tape.zero()
            tape.reset()

    return step, sum(p.size for p in model.parameters())



def _torch_kan_step(device: str, n_points: int):
    from ..reference.bspline import kan_linear

    (lo1, h1, g1), (lo2, h2, g2) = ((-5.0, 1.0, 10), (-2.0, 0.4, 10))
    k = 3

    def knots(lo, h, g, n_in):
        return (torch.arange(-k, g + k + 1, device=device, dtype=torch.float32) * h + lo).expand(n_in, -1).contiguous()

    grid1, grid2 = knots(lo1, h1, g1, 1), knots(lo2, h2, g2, 5)
    w1 = (0.1 * torch.randn(5, 1, g1 + k, device=device)).requires_grad_()
    w2 = (0.1 * torch.randn(1, 5, g2 + k, device=device)).requires_grad_()
    ones1, ones2 = torch.ones(5, 1, device=device), torch.ones(1, 5, device=device)
    t = torch.linspace(-5, 5, n_points, device=device).unsqueeze(1).requires_grad_()
    t0 = torch.zeros(1, 1, device=device)
    opt = torch.optim.Adam([w1, w2], lr=1e-3)

    def net(x):
        h = kan_linear(x, grid1, None, w1, ones1, k, use_base=False)
        return kan_linear(h, grid2, None, w2, ones2, k, use_base=False)

    def step():
        opt.zero_grad(set_to_none=True)
        f = net(t)
        (dfdt,) = torch.autograd.grad(f.sum(), t, create_graph=True)
        loss = ((dfdt - f * (1 - f)) ** 2).mean() + (net(t0) - 0.5).pow(2).sum()
        loss.backward()
        opt.step()

    return step, w1.numel() + w2.numel()


def _torch_mlp_step(device: str, n_points: int):
    mlp = torch.nn.Sequential(
        torch.nn.Linear(1, 10), torch.nn.Tanh(), torch.nn.Linear(10, 10), torch.nn.Tanh(), torch.nn.Linear(10, 1)
    ).to(device)
    t = torch.linspace(-5, 5, n_points, device=device).unsqueeze(1).requires_grad_()
    t0 = torch.zeros(1, 1, device=device)
    opt = torch.optim.Adam(mlp.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        f = mlp(t)
        (dfdt,) = torch.autograd.grad(f.sum(), t, create_graph=True)
        loss = ((dfdt - f * (1 - f)) ** 2).mean() + (mlp(t0) - 0.5).pow(2).sum()
        loss.backward()
        opt.step()

    return step, sum(p.numel() for p in mlp.parameters())


def _bridge_supports_second_order(device: str) -> str | None:
    from ..torch_bridge import KANLinear

    layer = KANLinear(1, 1, base_activation=None).to(device)
    t = torch.linspace(-0.5, 0.5, 8, device=device).unsqueeze(1).requires_grad_()
    try:
        (dfdt,) = torch.autograd.grad(layer(t).sum(), t, create_graph=True)
        dfdt.sum().backward()
    except (RuntimeError, NotImplementedError) as error:
        return f"not supported: {str(error).splitlines()[0][:90]}"
    return None


@register("native")
def run(device: str = "cuda", quick: bool = False) -> list[dict]:
    example = _load_example()
    rows = []
    bridge_note = _bridge_supports_second_order(device)
    for n_points in QUICK_COLLOCATION if quick else COLLOCATION:
        case = f"logistic PINN step, {n_points} points"
        results = []
        impls = {
            "warpkan native (fused Warp kernel, wp.Tape, Adam)": (lambda: _warp_step(example, device, n_points)) if example else None,
            "same KAN, pure torch (efficient-kan basis, autograd)": lambda: _torch_kan_step(device, n_points),
            "MLP 1-10-10-1 tanh (torch autograd)": lambda: _torch_mlp_step(device, n_points),
        }
        for name, make in impls.items():
            row = {"case": case, "impl": name}
            if make is None:
                row["note"] = "examples/pinn_logistic.py not found (run from a source checkout)"
            else:
                step, n_params = make()
                row["step_ms"] = time_fn(step, device, warmup=5, repeat=5 if quick else 30)
                row["parameters"] = n_params
            results.append(row)
        results.append({"case": case, "impl": "same KAN via torch bridge (KANLinear)",
                        "note": bridge_note or "supported (timed in warpkan bench pinn)"})
        reference = next((r.get("step_ms") for r in results if r["impl"].startswith("warpkan")), None)
        for row in results:
            if reference and row.get("step_ms"):
                row["x warpkan native"] = row["step_ms"] / reference
        rows.extend(results)
    return rows
