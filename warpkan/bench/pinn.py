"""PINN benchmark in PyTorch: one training step of the 1-D heat equation u_t = 0.1 u_xx on (x, t) collocation
points, u a 2-32-32-1 network, the residual's u_t and u_xx by ``torch.autograd.grad(create_graph=True)``, then
``loss.backward()`` and an Adam step. In one run:

- the torch bridge: ``KANLinear`` layers (grid 5, cubic, SiLU base), whose second-order gradients come from the
  edge engine's dense basis and its x-derivatives;
- the same KAN in pure torch (efficient-kan's basis recursion, ``warpkan.reference.bspline``), same parameters;
- an MLP (tanh) of about the same parameter count;
- the bridge network and the MLP in Taylor mode (``warpkan.torch_bridge.jet``): u_t and u_xx carried forward
  through the layers (the KAN layers on the edge engine's Taylor-mode kernels, the MLP's by torch ops), then one
  ``loss.backward()``.

Each row also has the first-order step of the same network (a loss of u alone) and the ratio: the cost of the
second-order terms. On CUDA each network's second-order step is also captured whole in a CUDA graph (Adam with
``capturable=True``) and replayed: a step this small is bound by the host's launch and autograd overhead, which
the replay removes for every network alike (warpkan's ops launch on torch's current stream and allocate
through torch, so they are capture-safe). Targets: the bridge >= 5x faster than pure torch and no slower than the
MLP (whose best step is the autograd one: its Taylor mode in torch ops is slower); the second-order step <= 4x the
first-order one. The Warp-native PINN (a residual written as a Warp kernel) is
in ``warpkan bench native``.
"""

from __future__ import annotations

import copy

import torch

from . import register
from .timing import time_fn

COLLOCATION = (4096, 65536)
QUICK_COLLOCATION = (256,)
WIDTHS = (2, 32, 32, 1)
GRID, ORDER, NU = 5, 3, 0.1


def _bridge(device):
    from ..torch_bridge import KANLinear

    layers = [KANLinear(a, b, grid_size=GRID, spline_order=ORDER, grid_range=(-1.5, 1.5), device=device)
              for a, b in zip(WIDTHS[:-1], WIDTHS[1:])]
    return torch.nn.Sequential(*layers)


class _TorchKAN(torch.nn.Module):
    """The bridge network's parameters evaluated by efficient-kan's formula (pure torch autograd)."""

    def __init__(self, bridge):
        super().__init__()
        self.bridge = bridge

    def forward(self, z):
        from ..reference.bspline import kan_linear

        for layer in self.bridge:
            z = kan_linear(z, layer.grid, layer.base_weight, layer.spline_weight, layer.spline_scaler, layer.spline_order)
        return z


def _mlp(device, n_params):
    hidden = 1
    while hidden * hidden + 5 * hidden + 1 < n_params:
        hidden += 1
    return torch.nn.Sequential(torch.nn.Linear(2, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                               torch.nn.Tanh(), torch.nn.Linear(hidden, 1)).to(device)


def _autograd_residual(model, xt):
    """The heat residual u_t - nu u_xx by torch.autograd.grad(create_graph=True)."""
    u = model(xt)
    (du,) = torch.autograd.grad(u.sum(), xt, create_graph=True)
    (d2u,) = torch.autograd.grad(du[:, 0].sum(), xt, create_graph=True)
    return du[:, 1] - NU * d2u[:, 0]


def _taylor_residual(model, xt):
    """The same residual by Taylor mode (the collocation points need no gradient of their own there)."""
    from ..torch_bridge import jet

    u = jet(model, xt.detach(), pairs=((0, 0),))
    return u.d(1)[:, 0] - NU * u.d2(0, 0)[:, 0]


def _steps(model, xt, capturable=False, residual=_autograd_residual):
    """(second-order step, first-order step) closures: the heat residual's loss, or a loss of u alone. A
    ``capturable`` step keeps its gradient buffers (zeroed, not freed) so that a CUDA graph can replay it."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=capturable)

    def second_order():
        opt.zero_grad(set_to_none=not capturable)
        residual(model, xt).square().mean().backward()
        opt.step()

    def first_order():
        opt.zero_grad(set_to_none=not capturable)
        model(xt).square().mean().backward()
        opt.step()

    return second_order, first_order


def _taylor_steps(model, xt, capturable=False):
    """:func:`_steps` with the residual by Taylor mode."""
    return _steps(model, xt, capturable, _taylor_residual)


LEGEND = {
    "parameters": "the network's trainable parameters",
    "step_ms": "one training step of the PDE residual (u_t and u_xx, loss.backward(), Adam), median ms",
    "first_order_step_ms": "one training step of a loss of u alone (no derivatives in x), median ms",
    "second / first order": "step_ms over first_order_step_ms: the cost of the residual's derivatives",
    "graphed_step_ms": "step_ms's step captured once in a CUDA graph and replayed: no host overhead",
    "x warpkan (step_ms)": "step_ms over the torch bridge KAN's (the first row): above 1, slower than it",
    "x warpkan (graphed_step_ms)": "graphed_step_ms over the torch bridge KAN's",
}


@register("pinn", LEGEND)
def run(device: str = "cuda", quick: bool = False) -> list[dict]:
    rows = []
    for n_points in QUICK_COLLOCATION if quick else COLLOCATION:
        case = f"heat PINN step, {'-'.join(map(str, WIDTHS))}, {n_points} points"
        torch.manual_seed(0)
        xt = (torch.rand(n_points, 2, device=device) * 2 - 1).requires_grad_()
        bridge = _bridge(device)
        n_params = sum(p.numel() for p in bridge.parameters())
        mlp = _mlp(device, n_params)
        models = {"warpkan KANLinear (torch bridge)": (bridge, _steps),
                  "same KAN, pure torch (efficient-kan formula)": (_TorchKAN(bridge), _steps),
                  "MLP (tanh), same parameter count": (mlp, _steps),
                  "warpkan KANLinear, Taylor mode (torch bridge)": (bridge, _taylor_steps),
                  "MLP (tanh), Taylor mode (torch ops)": (mlp, _taylor_steps)}
        results = []
        for name, (model, steps) in models.items():
            second, first = steps(model, xt)
            repeat = 3 if quick else 20
            row = {"case": case, "impl": name, "parameters": sum(p.numel() for p in model.parameters()),
                   "step_ms": time_fn(second, device, warmup=3, repeat=repeat),
                   "first_order_step_ms": time_fn(first, device, warmup=3, repeat=repeat)}
            row["second / first order"] = row["step_ms"] / row["first_order_step_ms"]
            if device.startswith("cuda"):
                from ..torch_bridge import capture_step

                replay = capture_step(steps(copy.deepcopy(model), xt, capturable=True)[0])
                row["graphed_step_ms"] = time_fn(replay, device, warmup=3, repeat=repeat)
            results.append(row)
        for key in ("step_ms", "graphed_step_ms"):
            if key in results[0]:
                for row in results:
                    row[f"x warpkan ({key})"] = row[key] / results[0][key]
        rows.extend(results)
    return rows
