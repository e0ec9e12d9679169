"""Where an eager KAT-Tiny step (bf16 autocast, `warpkan bench models`' step) spends its time, for each
implementation and with torch's fused and foreach AdamW: the step timed by CUDA events (3 rounds of 20), again with
Python's garbage collector off, the host's own time a step (perf_counter, no synchronisation inside), the garbage
collections during the timed steps, and for the fused optimizer the CUDA runtime and driver calls and the heaviest
ops of two profiled steps (a synchronising call shows there as cudaDeviceSynchronize / cudaStreamSynchronize), and
the host time of one step with about 300 ms of GPU work queued before it ("behind 300 ms"): a step that waits on
the GPU anywhere (a read-back, a synchronising free, a launch queue full of its own kernels) takes that long
there, one that does not takes its host time. On the GPU machine:

    WARPKAN_KAT_PATH=... python scripts/kat_eager_diagnose.py [MODEL ...]   # default: KAT-Tiny
"""
import gc
import statistics
import sys
import time

import torch

from warpkan.bench import models as bm
from warpkan.bench.timing import time_fn

for model_name in sys.argv[1:] or ["KAT-Tiny"]:
    case = next(c for c in bm._cases("cuda", quick=False) if c.name == model_name)
    collections = []

    def on_gc(phase, info, _start=[0.0]):
        if phase == "start":
            _start[0] = time.perf_counter()
        else:
            collections.append((info["generation"], (time.perf_counter() - _start[0]) * 1e3))

    gc.callbacks.append(on_gc)
    for impl in (i for i in case.impls if i not in case.unavailable):
        for optimizer in ({"fused": True}, {"foreach": True}):
            bm.OPTIMIZER = optimizer
            model, step, _ = bm._prepared_step(case, impl, "bf16 autocast", "eager", "cuda", bm.FULL)
            for _ in range(4):
                step()
            torch.cuda.synchronize()
            collections.clear()
            rounds = [time_fn(step, "cuda", warmup=0, repeat=20) for _ in range(3)]
            seen = list(collections)
            gc.disable()
            rounds_no_gc = [time_fn(step, "cuda", warmup=0, repeat=20) for _ in range(3)]
            gc.enable()
            torch.cuda.synchronize()
            hosts = []
            for _ in range(20):
                start = time.perf_counter()
                step()
                hosts.append((time.perf_counter() - start) * 1e3)
            torch.cuda.synchronize()
            behind = []
            for _ in range(3):
                torch.cuda._sleep(600_000_000)  # ~300 ms of one spinning kernel at the H200's clock
                start = time.perf_counter()
                step()
                behind.append((time.perf_counter() - start) * 1e3)
                torch.cuda.synchronize()
            print(f"DIAG {model_name} | {impl} | {next(iter(optimizer))} AdamW: step {' '.join(f'{r:.2f}' for r in rounds)}"
                  f" ms | gc off {' '.join(f'{r:.2f}' for r in rounds_no_gc)} | host {statistics.median(hosts):.2f}"
                  f" ({min(hosts):.2f}-{max(hosts):.2f}) | behind 300 ms {statistics.median(behind):.1f} ms | "
                  f"{len(seen)} collections, {sum(t for _, t in seen):.1f} ms", flush=True)
            if optimizer.get("fused"):
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                        torch.profiler.ProfilerActivity.CUDA]) as prof:
                    step()
                    step()
                    torch.cuda.synchronize()
                events = prof.key_averages()
                runtime = sorted((e for e in events if e.key.startswith("cu") and e.self_device_time_total == 0),
                                 key=lambda e: -e.self_cpu_time_total)
                for e in runtime[:12]:
                    print(f"    runtime {e.key[:40]:40s} x{e.count // 2:<5d} {e.self_cpu_time_total / 2e3:8.2f} ms a step")
                for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]:
                    print(f"    op {e.key[:50]:50s} x{e.count // 2:<5d} {e.self_cpu_time_total / 2e3:8.2f} ms a step",
                          flush=True)
            del model, step
            gc.collect()
            torch.cuda.empty_cache()
