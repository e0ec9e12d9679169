"""B-spline KAN benchmark: warpkan's KANLinear against efficient-kan (re-implemented in pure torch, same
algorithm), inkan (the ``inkan`` package from PyPI, cubic only, its defaults, when installed) and nn.Linear of
the same (N, in, out), forward and forward+backward, in one run.

The wide layers are also run under torch's "high" float32 matmul precision (TF32; KANLinear's gemm strategy
follows it as nn.Linear does) and under bf16 autocast, each against nn.Linear under the same setting; the
small layer also as a CUDA-graph replay (the host overhead is the difference from the eager row)."""

from __future__ import annotations

import contextlib

import torch

from . import register, register_plot
from .timing import HARDWARE, backward_only, flop_rate, peak_memory, time_fn, training_step

# (N, in, out, grid_size, order): the cases the peers were measured at, then the grid-size-independence extremes
FULL_CASES = [
    (2**16, 32, 32, 64, 1),
    (2**16, 32, 32, 64, 3),
    (2**16, 32, 32, 64, 5),
    (2**17, 32, 32, 32, 3),
    (2**17, 32, 32, 64, 3),
    (2**17, 32, 32, 256, 3),
    (2**17, 32, 32, 1024, 3),
    (2**17, 32, 32, 2**14, 3),
    (2**17, 32, 32, 2**18, 3),
    (65536, 256, 256, 8, 3),
    (8192, 512, 512, 5, 3),
    (128, 40, 256, 5, 3),
]
# (N, in, out, G, k) also run under TF32 and bf16 autocast
WIDE_CASES = {(65536, 256, 256, 8, 3), (8192, 512, 512, 5, 3)}
# (N, in, out, G, k) -> the warpkan row also replayed from a CUDA graph (with nn.Linear): the GPU time alone.
# The launch-bound layer shows its host overhead; the 32->32 layers, whose eager steps jitter with the host
# (autograd's device thread), their kernels' time.
GRAPHED_CASES = {(128, 40, 256, 5, 3): "warpkan gemm",
                 **{case: "warpkan" for case in FULL_CASES if case[1:3] == (32, 32)}}
# setting -> (context, peak FLOP/s of its GEMMs)
SETTINGS = {
    "fp32": (contextlib.nullcontext, HARDWARE["fp32_simt_flops"]),
    "tf32": (lambda: _float32_matmul_precision("high"), HARDWARE["tf32_flops"]),
    "bf16 autocast": (lambda: torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False), HARDWARE["bf16_flops"]),
}


@contextlib.contextmanager
def _float32_matmul_precision(setting: str):
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(setting)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)
QUICK_CASES = [(512, 8, 8, 8, 3), (256, 16, 16, 64, 1)]


def _make(impl, n_in, n_out, grid_size, order, device):
    from ..reference.efficient_kan import EfficientKANLinear
    from ..torch_bridge import KANLinear

    if impl == "nn.Linear":
        return torch.nn.Linear(n_in, n_out, bias=False).to(device)
    if impl == "efficient-kan (torch)":
        if grid_size > 4096:
            return None  # its init solves a dense (G+1) x (G+k) least-squares problem
        return EfficientKANLinear(n_in, n_out, grid_size, order).to(device)
    if impl == "inkan":
        try:
            from inkan import KANLayer
        except ImportError:
            return "not installed (pip install inkan)"
        if order != 3 or grid_size > 4096:
            return None  # cubic only; its dense-basis fallback would not fit beyond that
        return KANLayer(n_in, n_out, grid_size=grid_size, spline_order=3).to(device)
    strategy = impl.split()[1] if len(impl.split()) > 1 else "auto"
    if strategy == "gemm" and grid_size > 4096:
        return None  # the dense basis row would be longer than the whole input
    return KANLinear(n_in, n_out, grid_size, order, deterministic=impl.endswith("deterministic"), strategy=strategy).to(device)


IMPLS = ["warpkan", "warpkan stencil", "warpkan stencil deterministic", "warpkan gemm", "efficient-kan (torch)", "inkan",
         "nn.Linear"]


def _measure(layer, x, device, quick, graph=False) -> dict:
    """fwd_ms, bwd_ms, total_ms (one training step) and peak_MiB; a CUDA-graph replay (``graph``) times the
    forward and the step only."""
    def forward():
        with torch.no_grad():
            layer(x)

    dy = torch.randn(x.shape[0], layer(x[:1]).shape[1], device=device)
    train_step = training_step(layer, x, dy)
    repeat = 5 if quick else 20
    if graph:
        from .timing import graphed

        return {"fwd_ms": time_fn(graphed(forward), device, repeat=repeat),
                "total_ms": time_fn(graphed(train_step), device, repeat=repeat)}
    return {"fwd_ms": time_fn(forward, device, warmup=2, repeat=repeat),
            "bwd_ms": time_fn(backward_only(layer, [x], dy), device, warmup=2, repeat=repeat),
            "total_ms": time_fn(train_step, device, warmup=2, repeat=repeat),
            "peak_MiB": peak_memory(train_step, device)}


def _flops(impl: str, n_rows: int, n_in: int, n_out: int, n_coef: int) -> float | None:
    """Multiply-add FLOPs of fwd+bwd: three GEMMs over the contraction (the dense basis for warpkan's gemm
    strategy, x for nn.Linear); None where the count has no dense meaning."""
    if impl.startswith("nn.Linear"):
        return 6.0 * n_rows * n_in * n_out
    if "gemm" in impl:
        return 6.0 * n_rows * n_in * (n_coef + 1) * n_out
    return None


def _setting_rows(case, x, n_in, n_out, grid_size, order, device, quick):
    """warpkan (gemm, precision "auto") and nn.Linear under each setting, and graphed for the small layer."""
    rows = []
    key = (x.shape[0], n_in, n_out, grid_size, order)
    # fp32 eager is in the main rows already
    settings = (["fp32"] if key in GRAPHED_CASES else []) + (["tf32", "bf16 autocast"] if key in WIDE_CASES else [])
    for setting in settings:
        context, peak_flops = SETTINGS[setting]
        for graph in ((True,) if setting == "fp32" else (False,)):
            results = []
            for impl in (GRAPHED_CASES.get(key, "warpkan gemm") if graph else "warpkan gemm", "nn.Linear"):
                name = f"{impl} [{setting}{', CUDA graph' if graph else ''}]"
                row = {"case": case, "impl": name, "setting": setting}
                layer = _make(impl, n_in, n_out, grid_size, order, device)
                try:
                    with context():
                        times = _measure(layer, x, device, quick, graph=graph)
                except RuntimeError as error:  # a path that cannot be captured: say so, keep the run going
                    row["note"] = f"not capturable: {str(error).splitlines()[0][:120]}"
                    results.append(row)
                    continue
                row.update(times)
                total = times["total_ms"]
                flops = _flops(impl, x.shape[0], n_in, n_out, grid_size + order)
                if flops:
                    row.update(flop_rate(flops, total, device))
                    row["% peak FLOP/s"] = 100 * flops / (total * 1e-3) / peak_flops
                results.append(row)
                del layer
            linear = results[-1]
            for row in results:
                if "total_ms" not in row or "total_ms" not in linear:
                    continue
                row["x nn.Linear"] = row["total_ms"] / linear["total_ms"]
                if row.get("peak_MiB") is not None and linear.get("peak_MiB") is not None:
                    row["memory target met"] = row["peak_MiB"] <= 2 * linear["peak_MiB"] + 256
            rows.extend(results)
    return rows


_FLOPS = ("multiply-add FLOPs of the step's three dense GEMMs (warpkan gemm: over the dense basis, in (G + k + 1) "
          "wide; nn.Linear: over x) per total_ms; none for the stencil strategy, which has no dense count")
LEGEND = {
    "setting": "the float32 matmul setting or autocast the row ran under (nn.Linear under the same)",
    "GB/s (min traffic)": "the least a step must move (x, y, dy and dx once, each parameter read and its "
                          "gradient written once) per total_ms",
    "x nn.Linear": "total_ms over that of nn.Linear of the same (N, in, out) (and setting)",
    "GFLOP/s": _FLOPS, "TFLOP/s": _FLOPS,
    "% peak FLOP/s": "the FLOP rate as a share of the GPU's peak for the setting's GEMMs",
    "% HBM": "GB/s (min traffic) as a share of the GPU's memory bandwidth",
    "memory target met": "peak_MiB <= 2 x nn.Linear's + 256 MiB",
    "speed-up of warpkan": "the peer's total_ms over warpkan's (auto): above 1, warpkan is faster",
}


@register("bspline", LEGEND)
def run(device: str = "cuda", quick: bool = False) -> list[dict]:
    rows = []
    for n_rows, n_in, n_out, grid_size, order in QUICK_CASES if quick else FULL_CASES:
        case = f"N={n_rows} {n_in}->{n_out} G={grid_size} k={order}"
        torch.manual_seed(0)
        x = (torch.rand(n_rows, n_in, device=device) * 2 - 1).requires_grad_()
        linear_total = None
        results = []
        for impl in IMPLS:
            row = {"case": case, "impl": impl}
            try:
                layer = _make(impl, n_in, n_out, grid_size, order, device)
                if layer is None or isinstance(layer, str):
                    row["note"] = layer or "skipped: infeasible at this G or order"
                    results.append(row)
                    continue
                times = _measure(layer, x, device, quick)
                row.update(times)
                total = times["total_ms"]
                if impl == "nn.Linear":
                    linear_total = total
                # minimum traffic: x, y, dy, dx once, and each parameter read and its gradient written once
                params = sum(p.numel() for p in layer.parameters())
                bytes_moved = 4 * (2 * n_rows * (n_in + n_out) + 2 * params)
                row["GB/s (min traffic)"] = bytes_moved / (total * 1e-3) / 1e9
                flops = _flops(impl, n_rows, n_in, n_out, grid_size + order)
                if flops:
                    row.update(flop_rate(flops, total, device))
                if device.startswith("cuda"):  # fractions of the GPU's ceilings
                    if flops:
                        row["% peak FLOP/s"] = 100 * flops / (total * 1e-3) / HARDWARE["fp32_simt_flops"]
                    row["% HBM"] = 100 * bytes_moved / (total * 1e-3) / HARDWARE["hbm_bytes_per_s"]
                del layer
            except torch.OutOfMemoryError:
                row["note"] = "out of memory"
            results.append(row)
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
        linear_peak = next((r.get("peak_MiB") for r in results if r["impl"] == "nn.Linear"), None)
        for row in results:
            if linear_total and "total_ms" in row:
                row["x nn.Linear"] = row["total_ms"] / linear_total
            if linear_peak is not None and row.get("peak_MiB") is not None and row["impl"].startswith("warpkan"):
                # target: peak above parameters and inputs <= 2x nn.Linear's + a 256 MiB workspace
                row["memory target met"] = row["peak_MiB"] <= 2 * linear_peak + 256
        warp_total = next((r.get("total_ms") for r in results if r["impl"] == "warpkan"), None)
        for row in results:
            if warp_total and "total_ms" in row and row["impl"].startswith(("efficient", "inkan")):
                row["speed-up of warpkan"] = row["total_ms"] / warp_total
        if not quick or device.startswith("cuda"):
            from ..kernels.bspline import family_of
            from ..kernels.edge.tiled import backward_plan, forward_plan, tiled_applies
            from ..torch_bridge import choose_strategy

            cuda = device.startswith("cuda")
            family = family_of(order, True, "float32")
            tiled = tiled_applies(family, cuda, grid_size + order)
            auto = choose_strategy(n_rows, n_in, n_out, grid_size + order, tiled)
            kernels = ""
            if auto == "stencil" and not tiled:  # longer grids: the tiled passes in bands where they reach
                plans = {"fwd": forward_plan(family, cuda, grid_size + order),
                         "bwd": backward_plan(family, cuda, grid_size + order)}
                banded = [f"{name} {plan.n_bands} bands" for name, plan in plans.items() if plan is not None]
                kernels = f", warp-tiled {' / '.join(banded)}" if banded else ""
            elif auto == "stencil":
                kernels = ", warp-tiled"
            for row in results:
                if row["impl"] == "warpkan":
                    row["impl"] = f"warpkan (auto: {auto}{kernels})"
        rows.extend(results)
        key = (n_rows, n_in, n_out, grid_size, order)
        if device.startswith("cuda") and (key in WIDE_CASES or key in GRAPHED_CASES):
            rows.extend(_setting_rows(case, x, n_in, n_out, grid_size, order, device, quick))
    return rows


@register_plot("bspline")
def plot(rows: list[dict], path: str) -> bool:
    """fwd+bwd time against grid size at (N=2^17, 32->32, k=3): the grid-size-independence picture (the
    full run's cases; a quick run has none)."""
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        case = row["case"]
        if not case.startswith(f"N={2**17} 32->32") or "total_ms" not in row:
            continue
        grid_size = int(case.split("G=")[1].split()[0])
        series.setdefault(row["impl"].split(" (auto")[0], []).append((grid_size, row["total_ms"]))
    if not series:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in sorted(series.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("grid size G")
    ax.set_ylabel("forward + backward (ms)")
    ax.set_title("B-spline KAN, N=2^17, 32->32, k=3")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
