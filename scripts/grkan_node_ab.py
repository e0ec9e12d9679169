"""GR-KAN layers and KATMLP blocks as one eager autograd node each (``warpkan.torch_bridge.grkan_ops``) against
their composition (a rational node and a linear layer a GR-KAN layer), in an eager bf16 KAT-Tiny training
step (`warpkan bench models`' step: AdamW, batch 128), with the GELU ViT and FlashKAT's KAT (when
WARPKAN_KAT_PATH names a checkout of it) timed in the same rounds. Rounds alternate between the four so that each
round's ratios compare them under the same state of the host (separate processes moved these steps by 30%).
Also: the GPU-busy share of each warpkan step (the kernels' total time under torch.profiler over the step's
time). On the GPU machine:

    WARPKAN_KAT_PATH=... python scripts/grkan_node_ab.py [--rounds 7] [--steps 10]
"""
import argparse
import statistics

import torch

from warpkan.bench import models as bm
from warpkan.bench.timing import time_fn
from warpkan.torch_bridge import rational

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=7)
parser.add_argument("--steps", type=int, default=10)
args = parser.parse_args()

case = next(c for c in bm._cases("cuda", quick=False) if c.name == "KAT-Tiny")
warpkan_impl = next(i for i in case.impls if i.startswith("warpkan"))
runs = {}
for impl in (i for i in case.impls if i not in case.unavailable):
    model, step, _ = bm._prepared_step(case, impl, "bf16 autocast", "eager", "cuda", bm.FULL)
    if impl == warpkan_impl:
        def with_layers(composed, step=step):
            def run():
                with rational.composed_layers(composed):
                    step()
            return run
        runs["GR-KAN, one node a block"] = with_layers(False)
        runs["GR-KAN, composed"] = with_layers(True)
    else:
        runs[impl] = step
for run in runs.values():
    for _ in range(3):
        run()
torch.cuda.synchronize()

times = {name: [] for name in runs}
for _ in range(args.rounds):
    for name, run in runs.items():
        times[name].append(time_fn(run, "cuda", warmup=1, repeat=args.steps))
for name, ms in times.items():
    print(f"STEP {name:30s} {statistics.median(ms):7.2f} ms ({min(ms):.2f}-{max(ms):.2f})", flush=True)
names = list(runs)
for a in names:
    for b in names:
        if a != b and not (a.startswith("GR-KAN") and b.startswith("GR-KAN") and a > b):
            ratios = [x / y for x, y in zip(times[a], times[b])]
            print(f"PAIRED {a} / {b}: {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")

for name in names:
    if not name.startswith("GR-KAN"):
        continue
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            runs[name]()
        torch.cuda.synchronize()
    kernels = sum(e.self_device_time_total for e in prof.key_averages()) / 3e3
    step_ms = statistics.median(times[name])
    print(f"BUSY {name}: {kernels:.2f} ms of kernels a step, {100 * kernels / step_ms:.1f}% of the median step")
