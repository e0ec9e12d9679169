"""Where an eager bf16 KAT-Tiny training step spends its host time, against the GELU ViT of the same shape:
torch.profiler's ops by self CPU time and count (with the CUDA kernels' total), and cProfile's Python functions
(backward on the calling thread, so that autograd's device thread does not hide them). On the GPU machine:

    python scripts/kat_eager_profile.py [--batch 128]
"""
import argparse
import cProfile
import io
import pstats

import torch
from torch.nn import functional as F

from warpkan.bench.timing import time_fn
from warpkan.models import VisionTransformer

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=128)
args = parser.parse_args()
dev = "cuda"

for name, ffn in (("KAT-Tiny (GRKANLinear)", "grkan"), ("ViT-Tiny (GELU)", "gelu")):
    torch.manual_seed(0)
    model = VisionTransformer(ffn=ffn).to(dev)  # KAT-Tiny's shape: ViT-Tiny, 224², 1000 classes
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.rand(args.batch, 3, 224, 224, device=dev)
    labels = torch.randint(0, 1000, (args.batch,), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    ms = time_fn(step, dev, warmup=3, repeat=10)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    cuda_total = sum(e.self_device_time_total for e in events) / 1e3
    print(f"== {name}: eager step {ms:.2f} ms, CUDA kernels {cuda_total:.2f} ms", flush=True)
    print(events.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
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
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(25)
    print(out.getvalue()[-6000:], flush=True)
