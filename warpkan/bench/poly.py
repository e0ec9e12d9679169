"""Polynomial KAN benchmark: warpkan's PolyKANLinear (LUT and exact modes) against the two torch forms of
ChebyKAN in the same run, eager and under torch.compile. Every row has the eager times (``total_ms``: one
``model(x).backward(dy)`` step, host overhead included) and, on cuda, ``graphed_total_ms``: the same step
captured once in a CUDA graph and replayed (no host overhead), compared with the best torch form graphed.

- the acos/cos form, ChebyKAN's own ``ChebyKANLayer.forward`` (re-implemented in pure torch, same code);
- the recurrence + einsum form.

Plus a whole network at PolyKAN's Speech Commands widths (Fourier basis, 40 -> 256 -> 256 -> 12, degree 8,
batch 128), forward + backward per batch, against the torch cos/sin + einsum form of the same network.
"""

from __future__ import annotations

import torch
from torch import nn

from . import register
from .timing import HARDWARE, backward_only, flop_rate, graphed, peak_memory, time_fn, training_step

# (B, in, out, degree): PolyKAN's three configurations, then a large one
FULL_CASES = [(128, 40, 256, 8), (64, 256, 512, 15), (32, 512, 1024, 24), (4096, 512, 512, 8)]
QUICK_CASES = [(64, 16, 32, 8)]
# fwd+bwd targets on the GPU (ms), shown in CUDA runs
TARGET_MS = {(128, 40, 256, 8): 0.10, (64, 256, 512, 15): 0.10, (32, 512, 1024, 24): 0.10, (4096, 512, 512, 8): 0.25}
SPEECH_WIDTHS, SPEECH_DEGREE, SPEECH_BATCH = (40, 256, 256, 12), 8, 128
QUICK_SPEECH_WIDTHS, QUICK_SPEECH_BATCH = (40, 32, 12), 16  # --quick: a CPU smoke run


class _TorchPolyLayer(nn.Module):
    """A peer layer in ChebyKAN's layout (``cheby_coeffs`` [in, out, D + 1]), running one of the torch forms."""

    def __init__(self, n_in, n_out, degree, form):
        super().__init__()
        self.cheby_coeffs = nn.Parameter(torch.randn(n_in, n_out, degree + 1) / (n_in * (degree + 1)))
        self.form = form

    def forward(self, x):
        from ..reference import poly as ref

        if self.form == "acos":
            return ref.chebykan_acos(x, self.cheby_coeffs)
        if self.form == "recurrence":
            return ref.chebyshev_recurrence_einsum(x, self.cheby_coeffs)
        # fourier: cos / sin of k pi t, then einsum
        b = ref.basis_values(torch.tanh(x), "fourier", self.cheby_coeffs.shape[2] - 1)
        return torch.einsum("bid,iod->bo", b, self.cheby_coeffs)


def _warp_layer(n_in, n_out, degree, mode, basis="chebyshev", strategy="auto", precision="auto"):
    from ..torch_bridge import PolyKANLinear

    return PolyKANLinear(n_in, n_out, degree, basis=basis, mode=mode, strategy=strategy, precision=precision)


LAYER_IMPLS = {
    "warpkan lut stencil": lambda *a: _warp_layer(*a, "lut", strategy="stencil"),
    "warpkan exact stencil": lambda *a: _warp_layer(*a, "exact", strategy="stencil"),
    "warpkan lut gemm": lambda *a: _warp_layer(*a, "lut", strategy="gemm"),
    "warpkan exact gemm": lambda *a: _warp_layer(*a, "exact", strategy="gemm"),
    "acos/cos (ChebyKAN, torch) eager": lambda *a: _TorchPolyLayer(*a, "acos"),
    "acos/cos (ChebyKAN, torch) compile": lambda *a: torch.compile(_TorchPolyLayer(*a, "acos")),
    "recurrence+einsum (torch) eager": lambda *a: _TorchPolyLayer(*a, "recurrence"),
    "recurrence+einsum (torch) compile": lambda *a: torch.compile(_TorchPolyLayer(*a, "recurrence")),
}
# explicit opt-ins to tensor cores (error bounds in warpkan.torch_bridge.poly_ops): CUDA runs only (on the CPU
# the bf16 GEMMs are float32 GEMMs of rounded operands and tf32 is float32, rows that measure nothing of theirs)
TENSOR_CORE_IMPLS = {
    "warpkan exact gemm tf32": lambda *a: _warp_layer(*a, "exact", strategy="gemm", precision="tf32"),
    "warpkan lut gemm bf16": lambda *a: _warp_layer(*a, "lut", strategy="gemm", precision="bf16"),
    "warpkan exact gemm bf16": lambda *a: _warp_layer(*a, "exact", strategy="gemm", precision="bf16"),
}


def _measure(model, x, n_out, device, quick) -> dict:
    """fwd_ms, bwd_ms, total_ms (one training step) and, on cuda, peak_MiB and graphed_total_ms (or a note)."""
    dy = torch.randn(x.shape[0], n_out, device=device)

    def forward():
        with torch.no_grad():
            model(x)

    train_step = training_step(model, x, dy)

    repeat = 5 if quick else 50
    times = {"fwd_ms": time_fn(forward, device, warmup=3, repeat=repeat),
             "bwd_ms": time_fn(backward_only(model, [x], dy), device, warmup=3, repeat=repeat),
             "total_ms": time_fn(train_step, device, warmup=3, repeat=repeat),
             "peak_MiB": peak_memory(train_step, device)}
    if device.startswith("cuda"):  # the same step replayed from a CUDA graph: no host overhead
        try:
            times["graphed_total_ms"] = time_fn(graphed(train_step), device, warmup=3, repeat=repeat)
        except Exception as exc:  # report, do not hide: a failed capture is a finding
            times["note"] = f"CUDA graph capture failed: {type(exc).__name__}: {str(exc)[:120]}"
    return times


def _rows_for(case, factories, x, n_out, flops_fwd, device, quick, target=None):
    """One row per implementation; ``factories`` maps its name to a function that builds the model."""
    rows = []
    for impl, factory in factories.items():
        row = {"case": case, "impl": impl}
        try:
            model = factory().to(device)
            row.update(_measure(model, x, n_out, device, quick))
            # forward + backward is three contractions of the forward's size (y, dx, d coeffs)
            row.update(flop_rate(3 * flops_fwd, row["total_ms"], device))
            if device.startswith("cuda"):
                row["% fp32 SIMT"] = 100 * row["TFLOP/s"] * 1e12 / HARDWARE["fp32_simt_flops"]
            del model
        except torch.OutOfMemoryError:
            row["note"] = "out of memory"
        rows.append(row)
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    best_torch = min((r["total_ms"] for r in rows if "total_ms" in r and "torch" in r["impl"]), default=None)
    best_torch_graphed = min((r["graphed_total_ms"] for r in rows if r.get("graphed_total_ms") and "torch" in r["impl"]),
                             default=None)
    for row in rows:
        if best_torch and "total_ms" in row:
            row["x best torch"] = row["total_ms"] / best_torch
        if best_torch_graphed and row.get("graphed_total_ms"):  # graphed against graphed
            row["graphed x best torch graphed"] = row["graphed_total_ms"] / best_torch_graphed
        if target is not None and row["impl"].startswith("warpkan") and device.startswith("cuda"):
            row["target_ms"] = target
    return rows


_FLOPS = "3 x the forward's 2 N in (D + 1) out FLOPs (the contractions of y, dx and dcoeffs) per total_ms"
LEGEND = {
    "x best torch": "total_ms over that of the fastest torch form of the same case (eager or compiled): below 1, "
                    "faster than the best torch",
    "graphed_total_ms": "total_ms's step captured once in a CUDA graph and replayed: GPU time, no host overhead",
    "graphed x best torch graphed": "graphed_total_ms over that of the fastest torch form, graphed too",
    "GFLOP/s": _FLOPS, "TFLOP/s": _FLOPS,
    "% fp32 SIMT": "TFLOP/s as a share of the GPU's fp32 SIMT peak",
    "target_ms": "the fwd+bwd time aimed at on the GPU",
}


@register("poly", LEGEND)
def run(device: str = "cuda", quick: bool = False) -> list[dict]:
    from ..torch_bridge.poly_ops import AUTO_STRATEGY

    rows = []
    for n_rows, n_in, n_out, degree in QUICK_CASES if quick else FULL_CASES:
        case = f"B={n_rows} {n_in}->{n_out} D={degree}"
        torch.manual_seed(0)
        x = torch.randn(n_rows, n_in, device=device, requires_grad=True)
        flops = 2 * n_rows * n_in * (degree + 1) * n_out
        impls = {**LAYER_IMPLS, **TENSOR_CORE_IMPLS} if device.startswith("cuda") else LAYER_IMPLS
        factories = {name: (lambda b=builder: b(n_in, n_out, degree)) for name, builder in impls.items()}
        case_rows = _rows_for(case, factories, x, n_out, flops, device, quick, TARGET_MS.get((n_rows, n_in, n_out, degree)))
        for row in case_rows:
            if row["impl"].startswith("warpkan") and row["impl"].endswith(AUTO_STRATEGY):  # the fp32 rows
                row["impl"] += " (auto)"
        rows += case_rows

    # the Speech Commands network, Fourier basis
    widths, degree = (QUICK_SPEECH_WIDTHS, SPEECH_DEGREE) if quick else (SPEECH_WIDTHS, SPEECH_DEGREE)
    batch = QUICK_SPEECH_BATCH if quick else SPEECH_BATCH
    pairs = list(zip(widths[:-1], widths[1:]))

    def network(layer, compiled=False):
        def build():
            model = nn.Sequential(*[layer(a, b) for a, b in pairs])
            return torch.compile(model) if compiled else model

        return build

    factories = {
        "warpkan fourier lut (auto)": network(lambda a, b: _warp_layer(a, b, degree, "lut", "fourier")),
        "warpkan fourier exact (auto)": network(lambda a, b: _warp_layer(a, b, degree, "exact", "fourier")),
        "cos/sin+einsum (torch) eager": network(lambda a, b: _TorchPolyLayer(a, b, degree, "fourier")),
        "cos/sin+einsum (torch) compile": network(lambda a, b: _TorchPolyLayer(a, b, degree, "fourier"), True),
    }
    torch.manual_seed(0)
    x = torch.randn(batch, widths[0], device=device, requires_grad=True)
    flops = sum(2 * batch * a * (degree + 1) * b for a, b in pairs)
    case = f"{'Speech Commands net' if not quick else 'small net'} B={batch} {'->'.join(map(str, widths))} fourier D={degree}"
    rows += _rows_for(case, factories, x, widths[-1], flops, device, quick)
    return rows
