"""Where a small layer's eager fwd+bwd step spends host time (cuda): cProfile over repeated steps, the
top functions by own time, and the wall time per step with and without the profiler.

    python scripts/host_profile.py [ukan|kan|poly|linear ...] [--n N] [--steps S]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch


def make(name, n):
    from warpkan.torch_bridge import KANLinear, PolyKANLinear, UKANLinear

    if name == "ukan":
        return UKANLinear(32, 32, grid_delta=2 / 32, pe_dim=16, embed_dim=8, hidden_dim=32, device="cuda"), (n, 32), 32
    if name == "kan":
        return KANLinear(32, 32, grid_size=32, device="cuda"), (n, 32), 32
    if name == "poly":
        return PolyKANLinear(512, 1024, 24, mode="exact").cuda(), (32, 512), 1024
    return torch.nn.Linear(32, 32, device="cuda"), (n, 32), 32


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("layers", nargs="*", default=["linear", "kan", "ukan"])
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    for name in args.layers:
        layer, shape, n_out = make(name, args.n)
        x = (torch.rand(*shape, device="cuda") * 2 - 1).requires_grad_(True)
        dy = torch.randn(shape[0], n_out, device="cuda")

        def step():
            layer(x).backward(dy)

        for _ in range(20):
            step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / args.steps * 1e3
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(22)
        print(f"===== {name}: {wall:.3f} ms per eager fwd+bwd step (no profiler), {args.steps} steps")
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000])


if __name__ == "__main__":
    main()
