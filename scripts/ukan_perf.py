"""UKAN on the GPU: eager fwd+bwd time and peak memory of each UKANLinear path (exact dense-range, exact
sparse pairs, fixed table) against KANLinear on the equivalent grid, for the issue's shapes and for wide
spans (randn data on h = 0.1, a fine grid), then torch.profiler kernel tables of chosen cases.

    python3 scripts/ukan_perf.py [--out DIR] [--profile]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from warpkan.bench.timing import peak_memory, time_fn  # noqa: E402
from warpkan.torch_bridge import KANLinear, UKANLinear  # noqa: E402

CG = dict(pe_dim=16, embed_dim=8, hidden_dim=32)


def layers(n_in, n_out, h, grid_size, lo, hi):
    yield "UKAN exact (auto)", UKANLinear(n_in, n_out, grid_delta=h, device="cuda", **CG)
    wide = UKANLinear(n_in, n_out, grid_delta=h, device="cuda", **CG)
    wide.dense_max_coefficients = 1 << 20
    yield "UKAN exact dense-range forced", wide
    sparse = UKANLinear(n_in, n_out, grid_delta=h, device="cuda", **CG)
    sparse.dense_max_coefficients = 0
    yield "UKAN exact sparse forced", sparse
    yield "UKAN table_groups=16", UKANLinear(n_in, n_out, grid_delta=h, device="cuda", table_groups=16, **CG)
    yield f"KANLinear G={grid_size}", KANLinear(n_in, n_out, grid_size=grid_size, grid_range=(lo, hi), device="cuda")


CASES = [  # (N, in, out, data, h, KAN grid size, range)
    (1024, 32, 32, "uniform", 2 / 32, 32, (-1, 1)),
    (65536, 32, 32, "uniform", 2 / 32, 32, (-1, 1)),
    (8192, 256, 256, "uniform", 2 / 32, 32, (-1, 1)),
    (8192, 256, 256, "randn", 0.1, 90, (-4.5, 4.5)),
    (65536, 32, 32, "uniform", 2 / 256, 256, (-1, 1)),
]


def step_of(layer, x, dy):
    def step():
        layer(x).backward(dy)
    return step


def profile(layer, x, dy, rows=14):
    from torch.profiler import ProfilerActivity, profile as prof_ctx

    step = step_of(layer, x, dy)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with prof_ctx(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_device_time_total", row_limit=rows, max_name_column_width=60)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lines = []
    profiles = []
    for n, n_in, n_out, data, h, grid_size, (lo, hi) in CASES:
        torch.manual_seed(0)
        x = torch.rand(n, n_in, device="cuda") * (hi - lo) + lo if data == "uniform" else torch.randn(n, n_in, device="cuda")
        x.requires_grad_()
        dy = torch.randn(n, n_out, device="cuda")
        case = f"N={n} {n_in}->{n_out} {data} h={h:.4g}"
        kan_ms = kan_mib = None
        results = []
        for name, layer in layers(n_in, n_out, h, grid_size, lo, hi):
            step = step_of(layer, x, dy)
            try:
                total = time_fn(step, "cuda", warmup=3, repeat=20)
                mib = peak_memory(step, "cuda")
                results.append((name, total, mib))
                if name.startswith("KANLinear"):
                    kan_ms, kan_mib = total, mib
                if args.profile and name == "UKAN exact (auto)" and n_in == 256 and data == "uniform":
                    profiles.append(f"== {case} {name}\n" + profile(layer, x, dy))
                if args.profile and name.startswith("KANLinear") and n_in == 256 and data == "uniform":
                    profiles.append(f"== {case} {name}\n" + profile(layer, x, dy))
                if args.profile and name == "UKAN exact (auto)" and n == 1024:
                    profiles.append(f"== {case} {name}\n" + profile(layer, x, dy))
            except Exception as exc:  # report and go on
                results.append((name, float("nan"), float("nan")))
                print(f"{case} {name}: {type(exc).__name__}: {exc}", flush=True)
            x.grad = None
            del layer
            torch.cuda.empty_cache()
        for name, total, mib in results:
            line = (f"{case:34s} {name:32s} fwd+bwd {total:8.3f} ms  x KAN {total / kan_ms:5.2f}   "
                    f"peak {mib:8.1f} MiB  x KAN {mib / kan_mib:5.2f}")
            print(line, flush=True)
            lines.append(line)
    with open(os.path.join(args.out, "ukan_perf.txt"), "w") as fh:
        fh.write("\n".join(lines) + "\n\n" + "\n".join(profiles))
    print("\n".join(profiles))
    return 0


if __name__ == "__main__":
    sys.exit(main())
