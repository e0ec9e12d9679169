"""GPU time of every kernel of a UKANLinear's eager forward + backward under bf16 autocast (torch.profiler, 10
steps after 5 warm-up ones), at the MNIST 784-32-10 network's two UKAN layers (fixed tables of 6 + 1 groups,
grid_delta 0.5) and at ``warpkan bench ukan``'s (1024, 32 -> 32) (9 + 1 groups, grid_delta 2/32). Module
constants of ``warpkan.kernels.ukan`` can be set first, as NAME=int arguments, one configuration a process (the
compiled modules are keyed on them):

    python scripts/ukan_kernel_times.py [GENERATOR_MIN_BLOCKS=3] [GENERATOR_TARGET_BLOCKS=512]

The per-kernel registers and occupancy come from ncu on the same script:

    ncu --kernel-name regex:generator_ --launch-skip 12 --launch-count 4 --section LaunchStats \\
        --section Occupancy python scripts/ukan_kernel_times.py
"""
import collections
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from warpkan.kernels import ukan as ku

for arg in sys.argv[1:]:
    name, value = arg.split("=")
    setattr(ku, name, int(value))

from warpkan.torch_bridge import UKANLinear  # noqa: E402  (after the constants: the kernels read them when made)

MNIST = dict(table_groups=6, grid_delta=0.5)
SHAPES = [("MNIST layer 1", 128, 784, 32, MNIST, "randn"), ("MNIST layer 2", 128, 32, 10, MNIST, "randn"),
          ("bench ukan N=1024", 1024, 32, 32,
           dict(table_groups=8, grid_delta=2 / 32, pe_dim=16, embed_dim=8, hidden_dim=32), "uniform")]
STEPS = 10

for label, n_rows, n_in, n_out, options, data in SHAPES:
    torch.manual_seed(0)
    layer = UKANLinear(n_in, n_out, **options).cuda()
    x = (torch.randn(n_rows, n_in) if data == "randn" else torch.rand(n_rows, n_in) * 2 - 1).cuda().requires_grad_()

    def step():
        for p in layer.parameters():
            p.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = layer(x)
        y.float().sum().backward()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
    kernels = collections.defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name][0] += 1
            kernels[event.name][1] += event.device_time_total
    total = sum(us for _, us in kernels.values()) / STEPS
    print(f"== {label} ({n_rows}, {n_in} -> {n_out}) {' '.join(sys.argv[1:])}: {total:.1f} us of kernels a step")
    for name, (count, us) in sorted(kernels.items(), key=lambda item: -item[1][1]):
        print(f"   {us / STEPS:7.2f} us x{count // STEPS} {name[:100]}")
