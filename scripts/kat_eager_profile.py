"""Where an eager bf16 training step of a `warpkan bench models` model spends its host time (by default KAT-Tiny,
every implementation; the bench's step: AdamW, its batch): torch.profiler's ops by self CPU time and count (with
the CUDA kernels' total), and cProfile's Python functions (backward on the calling thread, so that autograd's
device thread does not hide them). On the GPU machine:

    python scripts/kat_eager_profile.py [--model KAT-Tiny] [--impl NAME ...] [--rows 25]
"""
import argparse
import cProfile
import io
import pstats

import torch

from warpkan.bench import models as bm
from warpkan.bench.timing import time_fn

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="KAT-Tiny")
parser.add_argument("--impl", nargs="*", default=None, help="implementations (default: every one available)")
parser.add_argument("--rows", type=int, default=25, help="rows of each table")
args = parser.parse_args()

case = next(c for c in bm._cases("cuda", quick=False) if c.name == args.model)
for impl in args.impl or [i for i in case.impls if i not in case.unavailable]:
    model, step, _ = bm._prepared_step(case, impl, "bf16 autocast", "eager", "cuda", bm.FULL)
    ms = time_fn(step, "cuda", warmup=3, repeat=10)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    # the kernels' own events (an op's row repeats its kernels' time as its "self CUDA")
    cuda_total = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA) / 1e3
    print(f"== {args.model} | {impl}: eager step {ms:.2f} ms, CUDA kernels {cuda_total:.2f} ms "
          f"({100 * cuda_total / ms:.0f}% busy)", flush=True)
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=60))
    with torch.autograd.set_multithreading_enabled(False):
        step()
        torch.cuda.synchronize()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(args.rows)
    print(out.getvalue()[-7000:], flush=True)
    del model, step
    torch.cuda.empty_cache()
