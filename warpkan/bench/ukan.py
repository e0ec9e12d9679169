"""UKAN benchmark: warpkan's UKANLinear (CG-MLP on the touched (feature, group) pairs only) against the UKAN
paper's approach (the CG-MLP run for every sample and input, materialising per-sample coefficients; pure
torch, the float64 reference run in float32) and warpkan's KANLinear on the equivalent bounded grid (same
knot spacing over the data range), plus nn.Linear, in one run. Targets: UKAN fwd+bwd <= 1.5x
KANLinear and peak memory <= 1.2x KANLinear.

On CUDA each training step is also captured whole in a CUDA graph and replayed (``graphed_total_ms``): the
eager ratio of a small case measures the host, the graphed one the GPU work (target: <= 1.3x KANLinear). The
exact-table UKANLinear reads its table size back to the host on every forward, so it cannot be captured; the
fixed-table one (``table_groups``) is the capturable form. Its table is sized as a user sizes it: the groups the
case's data spans (what the exact table holds), so both compute the same layer; a fixed row whose table drops
spline terms (``table_overflow``) says so in its note."""

from __future__ import annotations

import torch

from . import register
from .timing import backward_only, graphed, peak_memory, time_fn, training_step

# (N, in, out, G): G cells of the equivalent KAN grid over the data range [-1, 1), so h = 2 / G
FULL_CASES = [(1024, 32, 32, 32), (65536, 32, 32, 32), (8192, 256, 256, 32), (65536, 32, 32, 256)]
QUICK_CASES = [(256, 8, 8, 16), (64, 16, 16, 32)]
ORDER = 3
CG = dict(pe_dim=16, embed_dim=8, hidden_dim=32)  # the CG-MLP of every UKAN row
FIXED = "warpkan UKANLinear, fixed table (table_groups = the data's span, no read-back)"
IMPLS = ["warpkan UKANLinear", FIXED, "paper: per-sample CG-MLP (pure torch)", "warpkan KANLinear (same grid)",
         "nn.Linear"]


class _PaperUKAN(torch.nn.Module):
    """The paper's method on a UKANLinear's parameters: coefficients generated per sample and input."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        from ..reference.ukan import ukan_linear

        m = self.layer
        return ukan_linear(x, m.grid_delta, m.spline_order, m.pe_dim, m.feature_embedding, m.cg_hidden.weight,
                           m.cg_hidden.bias, m.cg_out.weight, m.cg_out.bias, m.spline_scaler,
                           m.base_weight if m.use_base else None)


def data_span(x, grid_delta: float) -> int:
    """The most groups a feature of x spans (UKANLinear's exact table size, ``table_groups`` that drops no
    spline term)."""
    from ..torch_bridge.ukan_ops import group_range

    return int(group_range(x.detach(), grid_delta, ORDER)[1].max().item())


def _make(impl, n_in, n_out, grid_size, device, table_groups=None):
    from ..torch_bridge import KANLinear, UKANLinear

    h = 2.0 / grid_size
    if impl == "nn.Linear":
        return torch.nn.Linear(n_in, n_out, bias=False).to(device)
    if impl.startswith("warpkan KANLinear"):
        return KANLinear(n_in, n_out, grid_size=grid_size, spline_order=ORDER, grid_range=(-1, 1), device=device)
    table_groups = table_groups if impl == FIXED else None
    layer = UKANLinear(n_in, n_out, spline_order=ORDER, grid_delta=h, device=device, table_groups=table_groups, **CG)
    return layer if impl.startswith("warpkan") else _PaperUKAN(layer)


def _measure(layer, x, dy, device, quick) -> dict:
    def forward():
        with torch.no_grad():
            layer(x)

    train_step = training_step(layer, x, dy)

    repeat = 5 if quick else 20
    row = {"fwd_ms": time_fn(forward, device, warmup=2, repeat=repeat),
           "bwd_ms": time_fn(backward_only(layer, [x], dy), device, warmup=2, repeat=repeat),
           "total_ms": time_fn(train_step, device, warmup=2, repeat=repeat),
           "peak_MiB": peak_memory(train_step, device)}
    if device.startswith("cuda"):
        if getattr(layer, "table_groups", 0) is None:  # the exact table: one size read back a forward
            row["graphed note"] = "not capturable: the exact table reads its size back to the host"
        else:
            row["graphed_total_ms"] = time_fn(graphed(train_step), device, repeat=repeat)
    return row


LEGEND = {
    "table rows": "the UKAN spline's path: the dense range table, or the touched-pair table's rows the data "
                  "needed of its capacity",
    "time x KANLinear": "total_ms over that of KANLinear on the same grid (target: <= 1.5)",
    "graphed_total_ms": "the training step captured once in a CUDA graph and replayed: no host overhead",
    "graphed x KANLinear": "graphed_total_ms over that of KANLinear on the same grid (target: <= 1.3)",
    "graphed note": "why a row has no graphed_total_ms",
    "memory x KANLinear": "peak_MiB over that of KANLinear on the same grid (target: <= 1.2)",
}


@register("ukan", LEGEND)
def run(device: str = "cuda", quick: bool = False) -> list[dict]:
    rows = []
    for n_rows, n_in, n_out, grid_size in QUICK_CASES if quick else FULL_CASES:
        case = f"N={n_rows} {n_in}->{n_out} k={ORDER} h=2/{grid_size}"
        torch.manual_seed(0)
        x = (torch.rand(n_rows, n_in, device=device) * 2 - 1).requires_grad_()
        dy = torch.randn(n_rows, n_out, device=device)
        span = data_span(x, 2.0 / grid_size)
        results = []
        for impl in IMPLS:
            row = {"case": case, "impl": impl}
            try:
                layer = _make(impl, n_in, n_out, grid_size, device, table_groups=span)
                row.update(_measure(layer, x, dy, device, quick))
                if impl.startswith("warpkan UKANLinear"):  # which path; rows the data needed, of the capacity
                    if layer._last is None:
                        row["table rows"] = f"dense range, {span + 1} groups a feature"
                        if impl == FIXED and layer.table_overflow(x):
                            row["note"] = "table overflow: spline terms dropped, timing not comparable"
                    else:
                        needed, capacity = int(layer._last[2]), layer._last[0].shape[0]
                        row["table rows"] = f"{needed} of {capacity}"
                        if needed > capacity:
                            row["note"] = "table overflow: spline terms dropped, timing not comparable"
                del layer
            except torch.OutOfMemoryError:
                row["note"] = "out of memory"
            results.append(row)
            x.grad = None
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
        kan = next((r for r in results if r["impl"].startswith("warpkan KANLinear")), {})
        for row in results:
            if kan.get("total_ms") and "total_ms" in row:
                row["time x KANLinear"] = row["total_ms"] / kan["total_ms"]
            if kan.get("graphed_total_ms") and "graphed_total_ms" in row:
                row["graphed x KANLinear"] = row["graphed_total_ms"] / kan["graphed_total_ms"]
            if kan.get("peak_MiB") and row.get("peak_MiB") is not None:
                row["memory x KANLinear"] = row["peak_MiB"] / kan["peak_MiB"]
        rows.extend(results)
    return rows
