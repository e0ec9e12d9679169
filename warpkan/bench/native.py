"""Warp-native benchmarks: the logistic-ODE PINN step, and wide layers on their two strategies.

One training step of the logistic-ODE PINN (examples/pinn_logistic.py: a 1 -> 5 -> 1
B-spline KAN, residual df/dt - f (1 - f) from the splines' analytic derivatives, wp.Tape backward, Adam), at
useful collocation counts, against in the same run:

- the same network in pure torch (efficient-kan's basis recursion; df/dt by autograd with create_graph);
- an MLP of similar size (1 -> 10 -> 10 -> 1, tanh), df/dt by autograd;
- the same KAN through the torch bridge (``warpkan.torch_bridge.KANLinear``, no base path), df/dt by
  autograd with create_graph=True (``warpkan bench pinn`` times it on a PDE residual).

On CUDA the torch steps are also captured whole in a CUDA graph and replayed (``graphed_step_ms``,
``warpkan.torch_bridge.capture_step``, Adam with ``capturable=True``): a step this small is bound by the
host, which the replay removes. The Warp step (a residual kernel, its adjoint and Adam) runs eagerly: its
capture with ``wp.ScopedCapture`` fails to instantiate (the tape's backward and ``warp.optim.Adam`` are not
written for replay).

The Warp-native step needs the repository's ``examples/`` folder (the PINN lives there); from an installed
package without it the Warp rows say so.

Wide layers: one fp32 forward + backward (under ``wp.Tape``) of ``warpkan.KANLinear`` and
``warpkan.PolyKANLinear`` on the stencil kernels and on the gemm strategy (the dense basis times the weight by
``wp.tile_matmul``), beside the torch bridge's layer on its gemm strategy (cuBLAS) at the same shape, with the
FLOP rate of the gemm strategy's three contractions and, at the first case, the target: native gemm within
:data:`WIDE_TARGET` of the torch bridge's gemm. ``scripts/native_wide_timing.py`` times other tile shapes and
chunk bounds with the same passes.
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
WIDE_CASES = [  # (layer, rows, in, out, grid size or degree)
    ("KANLinear", 65536, 256, 256, 8),
    ("PolyKANLinear", 65536, 256, 256, 8),
    ("KANLinear", 4096, 64, 64, 5),
]
QUICK_WIDE_CASES = [("KANLinear", 256, 16, 16, 5), ("PolyKANLinear", 256, 16, 16, 4)]
WIDE_TARGET = 1.5  # native gemm's fwd+bwd over the torch bridge's gemm, at the first case


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


def _torch_kan_step(device: str, n_points: int, capturable: bool = False):
    from ..reference.bspline import kan_linear

    (lo1, h1, g1), (lo2, h2, g2) = ((-5.0, 1.0, 10), (-2.0, 0.4, 10))
    k = 3

    def knots(lo, h, g, n_in):
        return (torch.arange(-k, g + k + 1, device=device, dtype=torch.float32) * h + lo).expand(n_in, -1).contiguous()

    grid1, grid2 = knots(lo1, h1, g1, 1), knots(lo2, h2, g2, 5)
    w1 = (0.1 * torch.randn(5, 1, g1 + k, device=device)).requires_grad_()
    w2 = (0.1 * torch.randn(1, 5, g2 + k, device=device)).requires_grad_()
    ones1, ones2 = torch.ones(5, 1, device=device), torch.ones(1, 5, device=device)

    def net(x):
        h = kan_linear(x, grid1, None, w1, ones1, k, use_base=False)
        return kan_linear(h, grid2, None, w2, ones2, k, use_base=False)

    return _torch_step(net, [w1, w2], device, n_points, capturable), w1.numel() + w2.numel()


def _torch_step(net, params, device: str, n_points: int, capturable: bool):
    """One logistic-residual step of a torch network, df/dt by autograd (create_graph=True); with
    ``capturable``, captured in a CUDA graph (see capture_step)."""
    t = torch.linspace(-5, 5, n_points, device=device).unsqueeze(1).requires_grad_()
    t0 = torch.zeros(1, 1, device=device)
    opt = torch.optim.Adam(params, lr=1e-3, capturable=capturable)

    def step():
        opt.zero_grad(set_to_none=not capturable)
        f = net(t)
        (dfdt,) = torch.autograd.grad(f.sum(), t, create_graph=True)
        loss = ((dfdt - f * (1 - f)) ** 2).mean() + (net(t0) - 0.5).pow(2).sum()
        loss.backward()
        opt.step()

    if capturable:
        from ..torch_bridge import capture_step

        return capture_step(step)
    return step


def _torch_mlp_step(device: str, n_points: int, capturable: bool = False):
    mlp = torch.nn.Sequential(
        torch.nn.Linear(1, 10), torch.nn.Tanh(), torch.nn.Linear(10, 10), torch.nn.Tanh(), torch.nn.Linear(10, 1)
    ).to(device)
    return _torch_step(mlp, list(mlp.parameters()), device, n_points, capturable), sum(
        p.numel() for p in mlp.parameters())


def _bridge_step(device: str, n_points: int, capturable: bool = False):
    """The same 1 -> 5 -> 1 KAN (grids, order, no base path) as warpkan's torch layers."""
    from ..torch_bridge import KANLinear

    net = torch.nn.Sequential(
        KANLinear(1, 5, grid_size=10, spline_order=3, grid_range=(-5.0, 5.0), base_activation=None, device=device),
        KANLinear(5, 1, grid_size=10, spline_order=3, grid_range=(-2.0, 2.0), base_activation=None, device=device))
    params = list(net.parameters())
    return _torch_step(net, params, device, n_points, capturable), sum(p.numel() for p in params)


def native_layer(kind: str, n_in: int, n_out: int, size: int, strategy: str, device: str):
    """A Warp-native wide-layer case's layer (fp32): KANLinear of grid ``size`` or PolyKANLinear of degree
    ``size``."""
    import warpkan

    if kind == "KANLinear":
        return warpkan.KANLinear(n_in, n_out, grid_size=size, device=device, strategy=strategy)
    return warpkan.PolyKANLinear(n_in, n_out, size, device=device, strategy=strategy)


def native_passes(layer, x, dy):
    """(forward, forward + backward) of a Warp-native layer: the forward alone, and one pass under a fresh tape
    whose backward accumulates into x.grad and the parameters' gradients."""
    import warp as wp

    def forward():
        layer(x)

    def step():
        tape = wp.Tape()
        with tape:
            y = layer(x)
        tape.backward(grads={y: dy})

    return forward, step


def bridge_passes(kind: str, n_rows: int, n_in: int, n_out: int, size: int, device: str):
    """(forward, forward + backward) of the torch bridge's layer of a wide-layer case, on its gemm strategy at
    full fp32 (cuBLAS)."""
    from .. import torch_bridge as tb

    torch.manual_seed(0)
    if kind == "KANLinear":
        layer = tb.KANLinear(n_in, n_out, grid_size=size, strategy="gemm", precision="fp32", device=device)
    else:
        layer = tb.PolyKANLinear(n_in, n_out, size, strategy="gemm", precision="fp32", device=device)
    x = (torch.rand(n_rows, n_in, device=device) * 2 - 1).requires_grad_(True)
    dy = torch.randn(n_rows, n_out, device=device)

    def forward():
        with torch.no_grad():
            layer(x)

    def step():
        layer(x).backward(dy)

    return forward, step


def gemm_flop(layer, n_rows: int) -> float:
    """FLOP of the gemm strategy's three contractions in one fwd+bwd (y = A W, dW = A^T dy, dA = dy W^T) of a
    Warp-native layer over ``n_rows`` rows: the dense basis is a B-spline layer's SiLU rows (with its base path)
    and G + k bases an input, a polynomial layer's D + 1."""
    from ..kernels.edge.dense import dense_width

    if hasattr(layer, "grid_size"):
        width = dense_width(layer.in_features, layer.grid_size + layer.spline_order, layer.use_base)
    else:
        width = dense_width(layer.in_features, layer.degree + 1, False)
    return 3 * 2.0 * n_rows * width * layer.out_features


def _wide_rows(device: str, quick: bool) -> list[dict]:
    import warp as wp

    from ..kernels._common import on_stream
    from .timing import flop_rate

    stream = wp.stream_from_torch(torch.cuda.current_stream()) if device.startswith("cuda") else None
    rows = []
    cases = QUICK_WIDE_CASES if quick else WIDE_CASES
    repeat = 3 if quick else 10
    for index, (kind, n_rows, n_in, n_out, size) in enumerate(cases):
        case = (f"wide layer: {kind} ({n_rows}, {n_in}->{n_out}, {'G' if kind == 'KANLinear' else 'D'}={size}), "
                "fp32")
        rng = np.random.default_rng(0)
        x = wp.array(rng.uniform(-1, 1, (n_rows, n_in)).astype(np.float32), device=device, requires_grad=True)
        dy = wp.array(rng.standard_normal((n_rows, n_out)).astype(np.float32), device=device)
        results = []
        auto = native_layer(kind, n_in, n_out, size, "auto", device).resolve_strategy(n_rows)
        for strategy in ("stencil", "gemm"):
            layer = native_layer(kind, n_in, n_out, size, strategy, device)
            forward, step = native_passes(layer, x, dy)
            wp.synchronize_device(device)  # x, dy and the parameters were written on Warp's own stream
            with on_stream(stream):  # Warp's launches on torch's stream, where the events are recorded
                row = {"case": case, "impl": f"warpkan native {strategy}" + (" (tile GEMMs)" if strategy == "gemm"
                                                                              else " (per-edge kernels)"),
                       "fwd_ms": time_fn(forward, device, warmup=3, repeat=repeat),
                       "step_ms": time_fn(step, device, warmup=3, repeat=repeat)}
            row["auto picks"] = "yes" if auto == strategy else "no"
            if strategy == "gemm":
                row.update(flop_rate(gemm_flop(layer, n_rows), row["step_ms"], device))
            results.append(row)
        forward, step = bridge_passes(kind, n_rows, n_in, n_out, size, device)
        results.append({"case": case, "impl": "torch bridge gemm (cuBLAS)",
                        "fwd_ms": time_fn(forward, device, warmup=3, repeat=repeat),
                        "step_ms": time_fn(step, device, warmup=3, repeat=repeat)})
        reference = results[-1]["step_ms"]
        for row in results:
            row["x torch bridge gemm (step_ms)"] = row["step_ms"] / reference
        if index == 0 and device.startswith("cuda"):  # the target is the GPU's
            ratio = results[1]["x torch bridge gemm (step_ms)"]
            results[1]["target"] = f"<= {WIDE_TARGET}x torch bridge gemm: {'met' if ratio <= WIDE_TARGET else 'no'}"
        rows.extend(results)
    return rows


LEGEND = {
    "step_ms": "one training step (PINN: residual, backward, Adam; wide layers: forward + backward), median ms",
    "fwd_ms": "a wide layer's forward alone, median ms",
    "auto picks": "whether strategy='auto' takes this strategy at this shape",
    "TFLOP/s": "the gemm strategy's three contractions (y = A W, dW = A^T dy, dA = dy W^T) over step_ms",
    "GFLOP/s": "the gemm strategy's three contractions (y = A W, dW = A^T dy, dA = dy W^T) over step_ms",
    "x torch bridge gemm (step_ms)": "step_ms over the torch bridge's gemm strategy's (cuBLAS, fp32)",
    "target": f"the wide-layer target: native gemm's step within {WIDE_TARGET}x the torch bridge's gemm",
    "graphed_step_ms": "the torch step captured once in a CUDA graph and replayed: no host overhead",
    "parameters": "the network's trainable parameters",
    "x warpkan native (step_ms)": "step_ms over the Warp-native step's: above 1, slower than it",
    "x warpkan native (graphed_step_ms)": "graphed_step_ms over the Warp-native step's step_ms",
}


@register("native", LEGEND)
def run(device: str = "cuda", quick: bool = False) -> list[dict]:
    example = _load_example()
    rows = []
    for n_points in QUICK_COLLOCATION if quick else COLLOCATION:
        case = f"logistic PINN step, {n_points} points"
        results = []
        impls = {
            "warpkan native (fused Warp kernel, wp.Tape, Adam)":
                (lambda c: None if c else _warp_step(example, device, n_points)) if example else None,
            "same KAN via torch bridge (KANLinear, create_graph=True)": lambda c: _bridge_step(device, n_points, c),
            "same KAN, pure torch (efficient-kan basis, autograd)": lambda c: _torch_kan_step(device, n_points, c),
            "MLP 1-10-10-1 tanh (torch autograd)": lambda c: _torch_mlp_step(device, n_points, c),
        }
        repeat = 5 if quick else 30
        for name, make in impls.items():
            row = {"case": case, "impl": name}
            if make is None:
                row["note"] = "examples/pinn_logistic.py not found (run from a source checkout)"
            else:
                step, n_params = make(False)
                row["step_ms"] = time_fn(step, device, warmup=5, repeat=repeat)
                row["parameters"] = n_params
                graphed = make(True) if device.startswith("cuda") else None
                if graphed is not None:
                    row["graphed_step_ms"] = time_fn(graphed[0], device, warmup=3, repeat=repeat)
            results.append(row)
        for key in ("step_ms", "graphed_step_ms"):
            reference = next((r.get(key) for r in results if r["impl"].startswith("warpkan")), None)
            for row in results:
                if reference and row.get(key):
                    row[f"x warpkan native ({key})"] = row[key] / reference
        rows.extend(results)
    return rows + _wide_rows(device, quick)
