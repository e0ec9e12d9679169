"""Host-side cost of one KANLinear forward and one backward, measured on the CPU.

The Warp kernel bodies are skipped (launches are packed and dispatched as usual, only the native call is a
no-op; see scripts/poly_host_overhead.py, whose instrumentation this reuses), so what is timed is the Python,
torch-dispatch, autograd and Warp-launch work that a GPU run pays on the host for every call, at the real
shapes. The CPU time of the torch GEMMs, fills and allocations is measured with the profiler and subtracted
(on the GPU they are asynchronous launches of a few microseconds; their counts are reported), so the
remainder does not depend on the tensor sizes.

    python scripts/bspline_host_overhead.py [--repeat 2000] [--strategy gemm|stencil|auto]
"""

import argparse
import os
import sys

import torch
import warp as wp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from poly_host_overhead import Counters, instrumented, measure  # noqa: E402

from warpkan.torch_bridge import KANLinear  # noqa: E402

CASES = [(128, 40, 256, 8), (2, 40, 256, 8)]
SUBTRACTED = {"aten::fill_": "fills", "aten::zero_": "fills", "aten::empty": "allocs", "aten::empty_strided": "allocs",
              "aten::mm": "gemms", "aten::addmm": "gemms", "aten::addmm_": "gemms"}


def profile_ops(fn, calls: int) -> dict:
    """Per-call counts of the subtracted torch ops, and their self CPU microseconds."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
    counts = {"fills": 0, "allocs": 0, "gemms": 0}
    subtracted_us = 0.0
    for event in prof.key_averages():
        kind = SUBTRACTED.get(event.key)
        if kind:
            counts[kind] += event.count / calls
            subtracted_us += event.self_cpu_time_total / calls
    return dict(counts, subtracted_us=subtracted_us)


def run_case(case, strategy, repeat):
    n_rows, n_in, n_out, grid_size = case
    torch.manual_seed(0)
    layer = KANLinear(n_in, n_out, grid_size, strategy=strategy)
    x = torch.randn(n_rows, n_in, requires_grad=True)
    dy = torch.randn(n_rows, n_out)
    params = (x, *layer.parameters())

    def forward():
        with torch.no_grad():
            layer(x)

    y = layer(x)  # compiles outside the measurement

    def backward():
        torch.autograd.grad(y, params, dy, retain_graph=True)

    results = {}
    for name, fn in (("forward", forward), ("backward", backward)):
        for _ in range(5):
            fn()
        counters = Counters()
        with instrumented(counters):
            for _ in range(50):
                fn()
            launches, recorded, from_torch = counters.launches / 50, counters.recorded / 50, counters.from_torch / 50
            us = measure(fn, repeat)
            ops = profile_ops(fn, 50)
        results[name] = dict(us=us, host_us=us - ops["subtracted_us"], launches=launches, recorded=recorded,
                             from_torch=from_torch, **ops)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--strategy", default="auto", choices=("auto", "gemm", "stencil"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"strategy={args.strategy} warp {wp.__version__} torch {torch.__version__} (CPU, kernels skipped)")
    print("| case (N, in, out, G) | pass | host us/call (subtracted ops excluded) | GEMM/fill/alloc CPU us (subtracted) | "
          "wp.launch | recorded launches | wp.from_torch | torch GEMMs | torch allocs | torch fills |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for case in CASES:
        for name, r in run_case(case, args.strategy, args.repeat).items():
            print(f"| {case} | {name} | {r['host_us']:.1f} | {r['subtracted_us']:.1f} | {r['launches']:.2f} | "
                  f"{r['recorded']:.2f} | {r['from_torch']:.2f} | {r['gemms']:.0f} | {r['allocs']:.0f} | {r['fills']:.0f} |")


if __name__ == "__main__":
    main()
