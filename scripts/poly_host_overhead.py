"""Host-side cost of one PolyKANLinear forward and one backward, measured on the CPU.

The Warp kernel bodies are skipped (their launch is packed and dispatched as usual, only the native call is
replaced by a no-op), so what is timed is the Python, torch-dispatch, autograd and Warp-launch work that a
GPU run pays on the host for every call, at the real shapes. torch fills (``aten::fill_`` / ``aten::zero_``)
run synchronously on the CPU but are asynchronous kernels on the GPU, and large CPU allocations page-fault
(``aten::empty`` of tens of MB): the CPU time of both is measured with the profiler and subtracted (and
reported), so the remainder is what does not depend on the tensor sizes. On the CPU, large buffers come
from fresh ``mmap``s at varying addresses, so the pointer-keyed launch cache of the torch bridge can miss
where the CUDA caching allocator would hand the same block back: the ``wp.launch`` column shows the misses. Counted per call (mean over 50 calls): Warp launches (``wp.launch``, which
includes recording a launch on a cache miss, and replays of recorded ``Launch.launch``), ``wp.from_torch`` calls, torch allocations (``aten::empty`` / ``aten::empty_strided``)
and torch fills.

    python scripts/poly_host_overhead.py [--repeat 2000] [--mode lut|exact] [--strategy fused|gemm|auto]
"""

import argparse
import contextlib
import statistics
import time
import types

import torch
import warp as wp
from warp._src import context as wp_context

from warpkan.torch_bridge import PolyKANLinear

CASES = [(128, 40, 256, 8), (64, 256, 512, 15), (32, 512, 1024, 24)]
FILL_OPS = ("aten::fill_", "aten::zero_")
ALLOC_OPS = ("aten::empty", "aten::empty_strided")


class Counters:
    def __init__(self):
        self.launches = 0
        self.recorded = 0
        self.from_torch = 0


@contextlib.contextmanager
def instrumented(counters: Counters):
    """Count launches and views; run no kernel body."""
    noop_hooks = {}

    def hooks_proxy(hooks):
        proxy = noop_hooks.get(id(hooks))
        if proxy is None:
            proxy = noop_hooks[id(hooks)] = types.SimpleNamespace(forward=lambda *a: None, backward=lambda *a: None)
        return proxy

    original = (wp_context.invoke, wp_context.invoke_cpu_blocks, wp.launch, wp_context.Launch.launch, wp.from_torch)
    invoke, invoke_blocks, launch, recorded_launch, from_torch = original

    def counted_launch(*args, **kwargs):
        counters.launches += 1
        return launch(*args, **kwargs)

    def counted_recorded(self, stream=None):
        counters.recorded += 1
        return recorded_launch(self, stream)

    def counted_from_torch(*args, **kwargs):
        counters.from_torch += 1
        return from_torch(*args, **kwargs)

    wp_context.invoke = lambda kernel, hooks, params, adjoint: invoke(kernel, hooks_proxy(hooks), params, adjoint)
    wp_context.invoke_cpu_blocks = lambda kernel, hooks, params, adjoint: invoke_blocks(kernel, hooks_proxy(hooks), params, adjoint)
    wp.launch, wp_context.Launch.launch, wp.from_torch = counted_launch, counted_recorded, counted_from_torch
    try:
        yield
    finally:
        wp_context.invoke, wp_context.invoke_cpu_blocks, wp.launch, wp_context.Launch.launch, wp.from_torch = original


def profile_ops(fn, calls: int) -> dict:
    """Per-call counts of torch allocations and fills, and the fills' CPU microseconds."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
    allocs = fills = 0
    memory_us = 0.0
    for event in prof.key_averages():
        if event.key in ALLOC_OPS:
            allocs += event.count
            memory_us += event.self_cpu_time_total
        if event.key in FILL_OPS:
            fills += event.count
            memory_us += event.self_cpu_time_total
    return {"allocs": allocs / calls, "fills": fills / calls, "memory_us": memory_us / calls}


def measure(fn, repeat: int) -> float:
    """Median over 20 batches of the mean microseconds per call."""
    batch = max(1, repeat // 20)
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        times.append((time.perf_counter() - t0) / batch * 1e6)
    return statistics.median(times)


def run_case(case, mode, strategy, repeat):
    n_rows, n_in, n_out, degree = case
    torch.manual_seed(0)
    layer = PolyKANLinear(n_in, n_out, degree, mode=mode, strategy=strategy)
    x = torch.randn(n_rows, n_in, requires_grad=True)
    dy = torch.randn(n_rows, n_out)
    params = (x, layer.coeffs)

    def forward():
        with torch.no_grad():
            layer(x)

    y = layer(x)  # compiles and builds the tables outside the measurement

    def backward():
        torch.autograd.grad(y, params, dy, retain_graph=True)

    results = {}
    for name, fn in (("forward", forward), ("backward", backward)):
        for _ in range(5):
            fn()  # kernels compiled, caches warm
        counters = Counters()
        with instrumented(counters):
            for _ in range(50):
                fn()
            per_call = (counters.launches / 50, counters.recorded / 50, counters.from_torch / 50)
            us = measure(fn, repeat)
            ops = profile_ops(fn, 50)
        results[name] = dict(us=us, host_us=us - ops["memory_us"], launches=per_call[0], recorded=per_call[1],
                             from_torch=per_call[2], **ops)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--mode", default="lut", choices=("lut", "exact"))
    parser.add_argument("--strategy", default="stencil", choices=("stencil", "gemm", "auto"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"mode={args.mode} strategy={args.strategy} warp {wp.__version__} torch {torch.__version__} (CPU, kernels skipped)")
    print("| case | pass | host us/call (fills excluded) | allocs+fills CPU us (subtracted) | wp.launch | recorded launches | "
          "wp.from_torch | torch allocs | torch fills |")
    print("|---|---|---|---|---|---|---|---|---|")
    for case in CASES:
        for name, r in run_case(case, args.mode, args.strategy, args.repeat).items():
            print(f"| {case} | {name} | {r['host_us']:.1f} | {r['memory_us']:.1f} | {r['launches']:.2f} | {r['recorded']:.2f} | "
                  f"{r['from_torch']:.2f} | {r['allocs']:.0f} | {r['fills']:.0f} |")


if __name__ == "__main__":
    main()
