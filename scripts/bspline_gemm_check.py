"""GPU check of the B-spline gemm strategy (cuda only): kernel times of the dense-basis expansion, eager /
graphed fwd+bwd of KANLinear(strategy="gemm") at each precision against nn.Linear under the same setting,
peak memory, the precision error-bound tests on the GPU, and a per-kernel profile of the wide layer.

    python scripts/bspline_gemm_check.py [--out DIR] [--skip-profile]
"""

import argparse
import contextlib
import os
import statistics
import sys
import time

import torch
import warp as wp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from warpkan.kernels import bspline as kb  # noqa: E402
from warpkan.torch_bridge import KANLinear  # noqa: E402
from warpkan.torch_bridge import bspline_ops  # noqa: E402

CASES = [(65536, 256, 256, 8), (8192, 512, 512, 5), (128, 40, 256, 8), (128, 40, 256, 5)]
SETTINGS = {"fp32": ("highest", None), "tf32": ("high", None), "bf16": ("highest", torch.bfloat16)}


@contextlib.contextmanager
def setting(name):
    matmul, autocast = SETTINGS[name]
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(matmul)
    try:
        with torch.autocast("cuda", dtype=autocast, cache_enabled=False) if autocast else contextlib.nullcontext():
            yield
    finally:
        torch.set_float32_matmul_precision(saved)


def time_ms(fn, repeat=20):
    """Back-to-back calls (host and GPU overlap, as in training), mean ms per call."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeat


def host_us(fn, repeat=200):
    """Host wall time per call with the GPU far ahead of nothing: synchronise, then time issuing calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        times.append((time.perf_counter() - t0) / repeat * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def graphed_ms(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_ms(graph.replay)


def peak_mib(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def kernel_times():
    n_rows, n_in, grid_size, order = 65536, 256, 8, 3
    width = kb.dense_width(n_in, grid_size + order, True)
    x = torch.rand(n_rows, n_in, device="cuda") * 2 - 1
    layer = KANLinear(n_in, 8, grid_size, order).cuda()
    stream = wp.stream_from_torch(torch.cuda.current_stream())
    print("\n== dense-basis kernels (N=65536 256->*, G=8, k=3, one 128 MiB chunk)")
    for dtype in (torch.float32, torch.bfloat16):
        chunk = bspline_ops._chunk_rows(n_rows, width, torch.empty((), dtype=dtype).element_size())
        basis = torch.empty(width, chunk, device="cuda", dtype=dtype)
        xs = x[:chunk]
        fn = lambda: kb.launch_expand_basis(wp.from_torch(xs), wp.from_torch(layer.grid), wp.from_torch(basis), order,  # noqa: E731
                                            True, True, stream=stream)
        ms = time_ms(fn, 20)
        mb = basis.numel() * basis.element_size() / 2**20
        print(f"expand_basis {str(dtype):15s} rows {chunk}: {ms * 1e3:7.1f} us for {mb:.0f} MiB -> "
              f"{basis.numel() * basis.element_size() / (ms * 1e-3) / 1e12:.2f} TB/s")
        if dtype == torch.float32:
            dx = torch.empty_like(xs)
            fn = lambda: kb.launch_contract_basis_grad(wp.from_torch(xs), wp.from_torch(layer.grid),  # noqa: E731
                                                       wp.from_torch(basis), wp.from_torch(dx), order, True, True,
                                                       stream=stream)
            ms = time_ms(fn, 20)
            print(f"contract_basis_grad float32 rows {chunk}: {ms * 1e3:7.1f} us "
                  f"({basis.numel() * 4 / (ms * 1e-3) / 1e12:.2f} TB/s of basis gradient read)")


def layer_rows():
    print("\n| case | setting | impl | eager fwd ms | eager fwd+bwd ms | graphed fwd+bwd ms | host us fwd+bwd | "
          "peak MiB | x nn.Linear (eager) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n_rows, n_in, n_out, grid_size in CASES:
        torch.manual_seed(0)
        x = (torch.rand(n_rows, n_in, device="cuda") * 2 - 1).requires_grad_()
        dy = torch.randn(n_rows, n_out, device="cuda")
        small = n_rows <= 1024
        for name in SETTINGS:
            results = []
            for impl in ("warpkan gemm", "nn.Linear"):
                layer = (KANLinear(n_in, n_out, grid_size, strategy="gemm") if impl != "nn.Linear"
                         else torch.nn.Linear(n_in, n_out, bias=False)).cuda()
                params = [x] + list(layer.parameters())

                def fwd():
                    with torch.no_grad():
                        layer(x)

                def step():
                    torch.autograd.grad(layer(x), params, dy)

                with setting(name):
                    row = dict(fwd=time_ms(fwd), total=time_ms(step), host=host_us(step) if small else float("nan"),
                               peak=peak_mib(step), graphed=float("nan"))
                    try:
                        row["graphed"] = graphed_ms(step) if small else float("nan")
                    except Exception as error:  # noqa: BLE001
                        print(f"graph capture of {impl} [{name}] failed: {str(error).splitlines()[0]}", flush=True)
                        torch.cuda.synchronize()
                results.append((impl, row))
                del layer, params
                torch.cuda.empty_cache()
            linear_total = results[-1][1]["total"]
            for impl, r in results:
                print(f"| N={n_rows} {n_in}->{n_out} G={grid_size} | {name} | {impl} | {r['fwd']:.3f} | {r['total']:.3f} | "
                      f"{r['graphed']:.3f} | {r['host']:.0f} | {r['peak']:.0f} | {r['total'] / linear_total:.2f} |", flush=True)


def host_profile():
    """cProfile of the small layer's eager fwd+bwd on the GPU, and how often a Warp launch was not a replay."""
    import cProfile
    import pstats

    counts = {"wp.launch": 0}
    launch = wp.launch

    def counted(*args, **kwargs):
        counts["wp.launch"] += 1
        return launch(*args, **kwargs)

    layer = KANLinear(40, 256, 8, strategy="gemm").cuda()
    x = torch.randn(128, 40, device="cuda", requires_grad=True)
    dy = torch.randn(128, 256, device="cuda")
    params = [x] + list(layer.parameters())

    def step():
        torch.autograd.grad(layer(x), params, dy)

    for _ in range(5):
        step()
    wp.launch = counted
    try:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(200):
            step()
        profiler.disable()
    finally:
        wp.launch = launch
    torch.cuda.synchronize()
    print(f"\n== host profile, N=128 40->256 G=8 fp32, 200 steps: wp.launch (cache misses) per step "
          f"{counts['wp.launch'] / 200:.2f}, cached launches {len(bspline_ops._LAUNCHES)}")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(22)


def profile(out_dir):
    n_rows, n_in, n_out, grid_size = 65536, 256, 256, 8
    x = (torch.rand(n_rows, n_in, device="cuda") * 2 - 1).requires_grad_()
    dy = torch.randn(n_rows, n_out, device="cuda")
    for name in ("fp32", "bf16"):
        layer = KANLinear(n_in, n_out, grid_size, strategy="gemm").cuda()
        params = [x] + list(layer.parameters())

        def step():
            torch.autograd.grad(layer(x), params, dy)

        with setting(name):
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70)
        print(f"\n== profile N=65536 256->256 G=8 [{name}], 3 steps\n{table}")
        if out_dir:
            with open(os.path.join(out_dir, f"profile-{name}.txt"), "w") as f:
                f.write(table)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--skip-profile", action="store_true")
    args = parser.parse_args()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "warp", wp.__version__)
    t0 = time.perf_counter()
    kernel_times()
    print(f"(kernels, compile included: {time.perf_counter() - t0:.1f} s)", flush=True)
    layer_rows()
    host_profile()
    if not args.skip_profile:
        profile(args.out)
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
