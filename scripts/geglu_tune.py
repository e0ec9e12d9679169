"""GPU tuning of the GEGLU forward at 4096/12288 fp16: correctness of the tensor-core streaming path
against the GEMM path, then forward times (CUDA graph replay and plain calls) of streaming (per split
target), GEMM+gate and the torch baseline for batch 1..128. Prints a table."""

import sys
import time

import torch

from warpkan.kernels import geglu as kg
from warpkan.reference.geglu import torch_baseline
from warpkan.torch_bridge import geglu_ffn


def timed(fn, repeat=200):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        fn()
    res = []
    for run in (graph.replay, fn):
        for _ in range(10):
            run()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        best = 1e9
        for _ in range(5):
            start.record()
            with torch.no_grad():
                for _ in range(repeat // 5):
                    run()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / (repeat // 5))
        res.append(best)
    return res  # graphed ms, plain ms


def main():
    hidden, inter = 4096, 12288
    dtype = torch.float16
    torch.manual_seed(0)
    w_uv = (torch.rand(2 * inter, hidden, device="cuda") * 2 - 1).div(hidden**0.5).to(dtype)
    w_o = (torch.rand(hidden, inter, device="cuda") * 2 - 1).div(inter**0.5).to(dtype)
    w_u, w_v = w_uv[:inter], w_uv[inter:]
    weight_bytes = 3 * hidden * inter * 2
    batches = [int(b) for b in (sys.argv[1].split(",") if len(sys.argv) > 1 else "1,4,8,16,32,64,128".split(","))]
    targets = [int(t) for t in (sys.argv[2].split(",") if len(sys.argv) > 2 else "1024,2048,4096".split(","))]
    unrolls = [int(u) for u in (sys.argv[3].split(",") if len(sys.argv) > 3 else "2".split(","))]
    for dt in (torch.float16, torch.bfloat16)[: 0 if len(sys.argv) > 4 else 2]:
        for b in (3, 8, 13, 40, 64):
            x = torch.randn(b, hidden, device="cuda").to(dt)
            a = geglu_ffn(x, w_uv.to(dt), w_o.to(dt), small_batch_rows=64).float()
            r = geglu_ffn(x, w_uv.to(dt), w_o.to(dt), small_batch_rows=0).float()
            print(f"check {dt} N={b}: max rel diff streaming vs GEMM {((a - r).abs().max() / r.abs().max()).item():.2e}")
    rows = []
    for batch in batches:
        x = torch.randn(batch, hidden, device="cuda", dtype=dtype)
        cases = {"torch baseline": lambda: torch_baseline(x, w_u, w_v, w_o, "gelu"),
                 "GEMM+gate": lambda: geglu_ffn(x, w_uv, w_o, small_batch_rows=0)}
        for name, fn in cases.items():
            g, p = timed(fn)
            rows.append((batch, name, g, p))
        if batch <= kg.TC_MAX_ROWS:
            for unroll in unrolls:
                for target in targets:
                    kg.TC_TARGET_WARPS, kg.TC_UNROLL = target, unroll
                    g, p = timed(lambda: geglu_ffn(x, w_uv, w_o, small_batch_rows=64))
                    rows.append((batch, f"TC u{unroll} target={target} splits={kg.tc_splits(hidden, inter)}", g, p))
            kg.TC_TARGET_WARPS, kg.TC_UNROLL = 2048, 2
    print(f"{'N':>4} {'impl':<50} {'graph ms':>9} {'plain ms':>9} {'GB/s(graph)':>11}")
    for batch, name, g, p in rows:
        print(f"{batch:>4} {name:<50} {g:9.4f} {p:9.4f} {weight_bytes / g / 1e6:11.0f}")


if __name__ == "__main__":
    main()
