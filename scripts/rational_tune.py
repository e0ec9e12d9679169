"""Kernel times of the group-rational forward and backward by vector width (cuda; CUDA events after warm-up).

    python scripts/rational_tune.py [--defaults | --settings 4x2,8x2,...] [--dtype float32] [--waves W]

``--defaults`` times only the shipped launch shape; ``--settings`` the given (items per step)x(blocks per
SM) pairs; ``--dtype`` one dtype only.

x of shape (1024 * 197, 768), 8 groups, orders (5, 4), variant A, 16-byte vectors; prints ms and GB/s
against a copy of x by items per step and blocks per SM (each kernel is compiled with
``__launch_bounds__(BLOCK_DIM, blocks per SM)``, so more blocks per SM means fewer registers per lane). The defaults ITEMS_PER_STEP / BLOCKS_PER_SM in
warpkan.kernels.rational come from this table (16-byte vectors beat 8- and 4-byte ones at every setting).
"""

import sys

import torch
import warp as wp

from warpkan._warp_output import start_warp  # noqa: E402

start_warp()

from warpkan.bench.timing import time_fn  # noqa: E402
from warpkan.kernels import rational as kr  # noqa: E402


def timed(fn):
    return time_fn(fn, "cuda", warmup=3, repeat=20)


def main():
    stream = wp.stream_from_torch(torch.cuda.current_stream())
    w = wp.from_torch
    num, den = kr.init_coefficients("swish", (5, 4), "A")
    a = torch.tensor([num], device="cuda")
    b = torch.tensor([den], device="cuda").repeat(8, 1)
    print("| dtype | pass | items per step | blocks per SM | ms | GB/s | % copy |")
    print("|---|---|---|---|---|---|---|")
    dtypes = (torch.float32, torch.bfloat16)
    if "--dtype" in sys.argv:
        dtypes = (getattr(torch, sys.argv[sys.argv.index("--dtype") + 1]),)
    for dtype in dtypes:
        x = torch.randn(1024 * 197, 768, device="cuda", dtype=dtype)
        dy = torch.randn_like(x)
        y, dx = torch.empty_like(x), torch.empty_like(x)
        da, db = torch.zeros_like(a), torch.zeros_like(b)
        copy_ms = timed(lambda: y.copy_(x))
        copy_bw = 2 * x.numel() * x.element_size() / copy_ms / 1e6
        per = x.element_size()
        vec = 16 // per
        shipped = ({k: dict(v) for k, v in kr.ITEMS_PER_STEP.items()}, {k: dict(v) for k, v in kr.BLOCKS_PER_SM.items()})
        settings = [None] if "--defaults" in sys.argv else [tuple(int(v) for v in item.split("x")) for item in
                                                            sys.argv[sys.argv.index("--settings") + 1].split(",")] \
            if "--settings" in sys.argv else [(1, 4), (2, 2), (2, 3), (2, 4), (4, 2), (4, 4), (1, 6), (2, 6), (1, 8), (2, 8)]
        for setting in settings:
            kr.ITEMS_PER_STEP.update({k: dict(v) for k, v in shipped[0].items()})
            kr.BLOCKS_PER_SM.update({k: dict(v) for k, v in shipped[1].items()})
            blocks_per_sm = "shipped"
            if setting is not None:
                items, blocks_per_sm = setting
                kr.ITEMS_PER_STEP.update(forward={vec: items}, backward={vec: items})
                kr.BLOCKS_PER_SM.update(forward={vec: blocks_per_sm}, backward={vec: blocks_per_sm})
            if "--waves" in sys.argv:
                waves = int(sys.argv[sys.argv.index("--waves") + 1])
                kr.WAVES.update(forward={vec: waves}, backward={vec: waves})
            kr.clear_kernel_caches()
            fwd = timed(lambda: kr.launch_forward(w(x), w(a), w(b), w(y), 8, "A", vec=vec, stream=stream))
            bwd = timed(lambda: kr.launch_backward(w(dy), w(x), w(a), w(b), 8, "A", dx=w(dx), da=w(da),
                                                   db=w(db), accumulate_dx=False, vec=vec, stream=stream))
            for name, ms, moved in (("forward", fwd, 2), ("backward", bwd, 3)):
                bw = moved * x.numel() * per / ms / 1e6
                print(f"| {str(dtype)[6:]} | {name} | {kr.launch_shape(kr.ITEMS_PER_STEP, name, vec)} | "
                      f"{kr.launch_shape(kr.BLOCKS_PER_SM, name, vec) if setting is None else blocks_per_sm} | {ms:.4f} | "
                      f"{bw:.0f} | {100 * bw / copy_bw:.1f} |")

if __name__ == "__main__":
    main()
