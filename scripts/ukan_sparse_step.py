"""GPU time and eager time of a UKANLinear training step on the sparse pair path (forced), per case: the sum of
the step's kernel times (torch profiler), the kernel count, the eager step and the five largest kernels.
Run it from two trees (e.g. a ``git worktree`` of an older commit) on one machine to compare them.

    python scripts/ukan_sparse_step.py
"""

import json

import torch
from torch.profiler import ProfilerActivity, profile

from warpkan.bench.timing import time_fn
from warpkan.torch_bridge import UKANLinear

# (N, in, out, h, table_groups, data)
CASES = [(65536, 32, 32, 2 / 32, 64, "uniform"), (65536, 32, 32, 2 / 256, 512, "normal"),
         (8192, 256, 256, 2 / 32, 64, "uniform"), (1024, 32, 32, 2 / 32, 64, "uniform")]


def sparse_step(n, n_in, n_out, h, table_groups, data):
    torch.manual_seed(0)
    layer = UKANLinear(n_in, n_out, grid_delta=h, device="cuda", table_groups=table_groups, pe_dim=16, embed_dim=8,
                       hidden_dim=32)
    layer.dense_max_coefficients = 0  # the sparse touched-pair path
    x = torch.rand(n, n_in, device="cuda") * 2 - 1 if data == "uniform" else torch.randn(n, n_in, device="cuda")
    x.requires_grad_()
    dy = torch.randn(n, n_out, device="cuda")

    def step():
        for p in layer.parameters():
            p.grad = None
        x.grad = None
        layer(x).backward(dy)

    return step


def main():
    for case in CASES:
        step = sparse_step(*case)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        kernels = [(e.name, e.device_time) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        by_name = {}
        for name, t in kernels:
            by_name[name[:60]] = by_name.get(name[:60], 0.0) + t / 5
        top = sorted(by_name.items(), key=lambda kv: -kv[1])[:5]
        print(json.dumps({"case": list(case), "gpu_us_per_step": round(sum(t for _, t in kernels) / 5, 1),
                          "kernels_per_step": len(kernels) // 5,
                          "eager_ms": round(time_fn(step, "cuda", warmup=3, repeat=20), 3),
                          "largest_us": [(k, round(v, 1)) for k, v in top]}), flush=True)


if __name__ == "__main__":
    main()
