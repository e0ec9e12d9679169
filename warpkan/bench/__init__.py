"""One benchmark registry and runner for every family: ``warpkan bench [family] [--device] [--quick] [--out DIR]``.

A family registers a function with :func:`register`; it returns a list of result rows (plain dicts). The
runner writes ``<out>/<family>.json`` and ``<out>/<family>.md`` (a markdown table of the rows), and
``<out>/<family>.png`` where the family also registers a plot with :func:`register_plot`, matplotlib is
installed and the rows hold what the plot draws. A row holds what was measured: keys whose value is None
are left out, and the columns that compare with GPU ceilings appear in CUDA runs only. Below each table a
legend says what its columns mean (:data:`COMMON_LEGEND` and the family's own, given to :func:`register`).
Timing helpers live in :mod:`warpkan.bench.timing`. Torch is imported by the family modules, not here.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
from typing import Callable

__all__ = ["register", "register_plot", "families", "run", "markdown_table", "COMMON_LEGEND"]

# family name -> module that registers it (imported lazily so `warpkan bench` starts fast)
_FAMILY_MODULES = {
    "bspline": "warpkan.bench.bspline",
    "geglu": "warpkan.bench.geglu",
    "models": "warpkan.bench.models",
    "native": "warpkan.bench.native",
    "pinn": "warpkan.bench.pinn",
    "poly": "warpkan.bench.poly",
    "rational": "warpkan.bench.rational",
    "ukan": "warpkan.bench.ukan",
}
_REGISTRY: dict[str, Callable] = {}
_PLOTS: dict[str, Callable] = {}
_LEGENDS: dict[str, dict] = {}

# column -> what it means, for the columns most families share (a family's own legend may say more)
COMMON_LEGEND = {
    "fwd_ms": "the forward pass alone (no autograd graph), median ms per call",
    "bwd_ms": "the backward pass alone (replayed from one forward's retained graph), median ms per call",
    "total_ms": "one training step (forward and backward) timed as a whole, median ms; fwd_ms and bwd_ms are "
                "timed apart, each call with its own host overhead, so total_ms need not equal their sum and can "
                "be less",
    "peak_MiB": "peak memory a training step allocates above what was allocated before it (CUDA only)",
    "note": "why a row has no measurement, or what to know about it",
}


def register(family: str, legend: dict | None = None):
    """Register ``fn(device, quick) -> rows`` as ``family``'s benchmark; ``legend``: {column: meaning} of the
    columns its rows add to (or mean otherwise than) :data:`COMMON_LEGEND`."""

    def wrap(fn):
        _REGISTRY[family] = fn
        _LEGENDS[family] = {**COMMON_LEGEND, **(legend or {})}
        return fn

    return wrap


def register_plot(family: str):
    """``fn(rows, path) -> bool`` draws the family's rows into the PNG at ``path``; False when the rows have
    nothing it draws (no file written)."""

    def wrap(fn):
        _PLOTS[family] = fn
        return fn

    return wrap


def families() -> list[str]:
    return sorted(_FAMILY_MODULES)


def _load(family: str) -> Callable:
    if family not in _FAMILY_MODULES:
        raise ValueError(f"unknown benchmark family {family!r}; known: {', '.join(families())}")
    importlib.import_module(_FAMILY_MODULES[family])
    return _REGISTRY[family]


def markdown_table(rows: list[dict], legend: dict | None = None) -> str:
    """The rows as a markdown table, every key a column; then, from ``legend`` ({column: meaning}), one line
    for each of its columns that the table has."""
    if not rows:
        return "(no rows)\n"
    columns: list[str] = []
    for row in rows:
        for key in row:
            if key not in columns:
                columns.append(key)

    def fmt(v):
        if v is None:
            return "–"
        if isinstance(v, float):
            if v == 0:
                return "0"
            return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.3e}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(fmt(row.get(c)) for c in columns) + " |")
    explained = [f"- {column}: {legend[column]}" for column in columns if legend and column in legend]
    if explained:
        lines += ["", *explained]
    return "\n".join(lines) + "\n"


def run(family_names: list[str] | None, device: str, quick: bool, out_dir: str) -> dict[str, list[dict]]:
    results = {}
    for family in family_names or families():
        fn = _load(family)
        rows = [{key: value for key, value in row.items() if value is not None} for row in fn(device=device, quick=quick)]
        results[family] = rows
        meta = {"family": family, "device": device, "quick": quick, "host": platform.node()}
        meta.update(_environment(device))
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, f"{family}.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2)
        table = markdown_table(rows, _LEGENDS.get(family))
        with open(os.path.join(out_dir, f"{family}.md"), "w") as f:
            f.write(f"# {family} ({meta.get('device_name', device)})\n\n{table}")
        print(f"\n## {family} on {meta.get('device_name', device)}\n\n{table}", flush=True)
        if family in _PLOTS:
            _plot(family, rows, os.path.join(out_dir, f"{family}.png"))
    return results


def _plot(family: str, rows: list[dict], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
    except ImportError:
        print(f"(no plot for {family}: matplotlib is not installed)")
        return
    if _PLOTS[family](rows, path):
        print(f"plot written to {path}")
    else:
        print(f"(no plot for {family}: these cases include none of the ones it draws)")


def _environment(device: str) -> dict:
    import warp as wp

    env = {"warp": wp.__version__}
    try:
        import torch

        env["torch"] = torch.__version__
        if device.startswith("cuda") and torch.cuda.is_available():
            env["device_name"] = torch.cuda.get_device_name(device)
    except ImportError:
        pass
    return env
