"""PolyKAN variants side by side on one GPU: eager and CUDA-graphed fwd+bwd step times of the fused and the
GEMM strategies (fp32 and bf16), a row sweep to place ``choose_strategy``'s switch, and per-kernel profiles.

    python scripts/poly_speed.py [--device cuda] [--out DIR] [--quick]
"""

import argparse
import json
import os
import time

import torch

from warpkan.bench.timing import graphed, time_fn
from warpkan.torch_bridge import PolyKANLinear

CASES = [(128, 40, 256, 8), (64, 256, 512, 15), (32, 512, 1024, 24), (4096, 512, 512, 8)]
VARIANTS = [("exact", "stencil", "fp32"), ("exact", "gemm", "fp32"), ("exact", "gemm", "bf16"), ("lut", "stencil", "fp32"),
            ("lut", "gemm", "fp32")]
SWEEP_ROWS = [16, 64, 256, 1024]
SWEEP_WIDTHS = [(40, 256, 8), (256, 512, 15), (512, 1024, 24), (512, 512, 8)]
PROFILED = [((4096, 512, 512, 8), ("exact", "gemm", "bf16")), ((4096, 512, 512, 8), ("exact", "gemm", "fp32")),
            ((32, 512, 1024, 24), ("exact", "gemm", "bf16"))]


def make(case, variant, device):
    n_rows, n_in, n_out, degree = case
    mode, strategy, precision = variant
    torch.manual_seed(0)
    layer = PolyKANLinear(n_in, n_out, degree, mode=mode, strategy=strategy, precision=precision, device=device)
    x = torch.randn(n_rows, n_in, device=device, requires_grad=True)
    dy = torch.randn(n_rows, n_out, device=device)

    def step():
        layer(x).backward(dy)

    def forward():
        with torch.no_grad():
            layer(x)

    return layer, x, step, forward


def measure(case, variant, device, repeat):
    _, _, step, forward = make(case, variant, device)
    row = {"case": case, "variant": "/".join(variant)}
    row["fwd_ms"] = time_fn(forward, device, warmup=3, repeat=repeat)
    row["eager_ms"] = time_fn(step, device, warmup=3, repeat=repeat)
    if device.startswith("cuda"):
        try:
            row["graphed_ms"] = time_fn(graphed(step), device, warmup=3, repeat=repeat)
        except Exception as exc:
            row["graphed_ms"] = f"failed: {exc}"[:100]
    return row


def check(case, device):
    """max |difference| of y and the gradients between the strategies, against fused exact fp32."""
    outs = {}
    for variant in (("exact", "stencil", "fp32"), ("exact", "gemm", "fp32"), ("exact", "gemm", "bf16")):
        layer, x, _, _ = make(case, variant, device)
        y = layer(x)
        dy = torch.randn_like(y, generator=None)
        torch.manual_seed(1)
        dy = torch.randn(y.shape, device=device)
        grads = torch.autograd.grad(y, (x, layer.coeffs), dy)
        outs[variant] = [t.detach() for t in (y, *grads)]
    base = outs[("exact", "stencil", "fp32")]
    return {"/".join(v): [float((a - b).abs().max() / (b.abs().max() + 1e-30)) for a, b in zip(o, base)]
            for v, o in outs.items()}


def fmt(v):
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-sweep", action="store_true")
    args = parser.parse_args()
    device = args.device
    cases = [(32, 16, 24, 5)] if args.quick else CASES
    repeat = 3 if args.quick else 40
    rows = []
    t0 = time.time()
    print("| case | variant | fwd ms | eager fwd+bwd ms | graphed fwd+bwd ms |")
    print("|---|---|---|---|---|")
    for case in cases:
        for variant in VARIANTS:
            row = measure(case, variant, device, repeat)
            rows.append(row)
            print(f"| {case} | {row['variant']} | {fmt(row['fwd_ms'])} | {fmt(row['eager_ms'])} | "
                  f"{fmt(row.get('graphed_ms', '-'))} |", flush=True)
    print(f"(main table {time.time() - t0:.0f} s)")
    print("relative max error vs fused exact fp32 (y, dx, dcoeffs):")
    for case in cases:
        print(case, {k: [f"{e:.1e}" for e in v] for k, v in check(case, device).items()})
    if not (args.quick or args.skip_sweep):
        print("| sweep rows | in->out D | fused eager | fused graphed | gemm eager | gemm graphed |")
        print("|---|---|---|---|---|---|")
        for n_in, n_out, degree in SWEEP_WIDTHS:
            for n_rows in SWEEP_ROWS:
                case = (n_rows, n_in, n_out, degree)
                a = measure(case, ("exact", "stencil", "fp32"), device, 20)
                b = measure(case, ("exact", "gemm", "fp32"), device, 20)
                rows += [a, b]
                print(f"| {n_rows} | {n_in}->{n_out} D={degree} | {fmt(a['eager_ms'])} | {fmt(a.get('graphed_ms'))} | "
                      f"{fmt(b['eager_ms'])} | {fmt(b.get('graphed_ms'))} |", flush=True)
        print(f"(sweep done {time.time() - t0:.0f} s)")
    if device.startswith("cuda") and not args.quick:
        for case, variant in PROFILED:
            _, _, step, _ = make(case, variant, device)
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
            print(f"== profile {case} {'/'.join(variant)} (5 eager steps)")
            print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=60))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "poly_speed.json"), "w") as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    main()
