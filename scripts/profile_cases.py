"""Kernel-level breakdown of one fwd+bwd step of each family's headline cases (cuda only).

    python scripts/profile_cases.py [family ...] [--out DIR]

For each case: the eager fwd+bwd time (CUDA events, after warm-up), the same step replayed from a CUDA
graph where capture works, and torch.profiler's per-kernel GPU time (Warp's launches included: CUPTI sees
every kernel on the device), so that the gap between the sum of kernel times and the eager time (host
overhead) and the share of each kernel are visible. Writes ``<family>.txt`` under --out.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from warpkan.bench.timing import graphed, time_fn


def step_fn(layer, x, dy):
    params = [p for p in layer.parameters() if p.requires_grad]

    def step():
        y = layer(x)
        grads = torch.autograd.grad(y, [x] + params, dy)
        return grads

    return step


def time_ms(fn):
    return time_fn(fn, "cuda", warmup=5, repeat=30)


def graphed_ms(fn):
    return time_ms(graphed(fn))


def kernel_table(fn, rows=14):
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_device_time_total", row_limit=rows, max_name_column_width=70)


def cases(family):
    from warpkan.torch_bridge import GEGLUFFN, GRKANLinear, GroupRational, KANLinear, PolyKANLinear, UKANLinear

    dev = "cuda"
    if family == "bspline":
        for n, i, o, g in [(2**17, 32, 32, 64), (2**17, 32, 32, 1024), (65536, 256, 256, 8), (8192, 512, 512, 5), (128, 40, 256, 8)]:
            yield f"KANLinear N={n} {i}->{o} G={g}", KANLinear(i, o, grid_size=g).to(dev), (n, i), o, torch.float32
    elif family == "poly":
        for b, i, o, d in [(128, 40, 256, 8), (64, 256, 512, 15), (32, 512, 1024, 24), (4096, 512, 512, 8)]:
            for prec in ("fp32", "bf16") if b == 4096 else ("fp32", "tf32") if b == 32 else ("fp32",):
                yield (f"PolyKAN ({b},{i},{o},{d}) exact {prec}",
                       PolyKANLinear(i, o, d, mode="exact", precision=prec).to(dev), (b, i), o, torch.float32)
    elif family == "ukan":
        for n, i, o in [(1024, 32, 32), (65536, 32, 32), (8192, 256, 256)]:
            yield f"UKANLinear N={n} {i}->{o}", UKANLinear(i, o).to(dev), (n, i), o, torch.float32
            yield f"KANLinear N={n} {i}->{o} G=5", KANLinear(i, o, grid_size=5).to(dev), (n, i), o, torch.float32
    elif family == "rational":
        for dtype in (torch.float32, torch.bfloat16):
            yield (f"GroupRational (1024,197,768) {dtype}", GroupRational(768).to(dev, dtype), (1024, 197, 768), 768, dtype)
        for dtype in (torch.float32, torch.bfloat16):
            yield (f"GRKANLinear N=50432 384->1536 {dtype}", GRKANLinear(384, 1536).to(dev, dtype), (50432, 384), 1536, dtype)
            yield (f"GELU+Linear N=50432 384->1536 {dtype}",
                   torch.nn.Sequential(torch.nn.GELU(), torch.nn.Linear(384, 1536)).to(dev, dtype), (50432, 384), 1536, dtype)
    elif family == "geglu":
        for n in (8, 64, 128):
            yield f"GEGLUFFN batch {n} fp16", GEGLUFFN(4096, 12288).to(dev, torch.float16), (n, 4096), 4096, torch.float16


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("families", nargs="*", default=["bspline", "poly", "ukan", "rational", "geglu"])
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for family in args.families:
        path = os.path.join(args.out, f"profile-{family}.txt")
        with open(path, "w") as fh:
            for name, layer, shape, n_out, dtype in cases(family):
                torch.manual_seed(0)
                x = torch.randn(*shape, device="cuda", dtype=dtype).requires_grad_(True)
                dy = torch.randn(*shape[:-1], n_out, device="cuda", dtype=dtype)
                step = step_fn(layer, x, dy)
                try:
                    eager = time_ms(step)
                    try:
                        graph = f"{graphed_ms(step):.4f}"
                    except Exception as exc:  # capture is not supported by every path (say which)
                        graph = f"n/a ({type(exc).__name__}: {str(exc)[:80]})"
                    fwd = time_ms(lambda: layer(x))
                    text = (f"== {name}: eager fwd+bwd {eager:.4f} ms, graphed {graph} ms, eager fwd {fwd:.4f} ms\n"
                            + kernel_table(step) + "\n")
                except Exception as exc:
                    text = f"== {name}: FAILED {type(exc).__name__}: {exc}\n"
                print(text, flush=True)
                fh.write(text)
                del layer
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
