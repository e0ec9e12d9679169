"""What the parameter layout costs a training step: KANLinear, UKANLinear and PolyKANLinear with contiguous
parameters in their public shapes (the default, which every torch optimiser and utility takes) against
parameters stored as views of the kernels' layout (``contiguous_parameters=False``): one eager step
(zero_grad, forward, backward, Adam step), both layouts built from the same seed and timed interleaved.

    python scripts/param_layout_cost.py                    # the GPU machine: the GPU cases on cuda
    python scripts/param_layout_cost.py --device cpu       # the CPU cases

Prints a markdown table: per layout, the fastest of --rounds x --repeats timed blocks of --steps steps (ms per
step; the minimum, as other load only ever adds time), and the difference. On the CPU the time is the
process's CPU time on one torch thread (``time.process_time``), which other processes' load on the machine
does not inflate the way it does wall-clock time.
"""

from __future__ import annotations

import argparse
import time

import torch

from warpkan.torch_bridge import KANLinear, PolyKANLinear, UKANLinear


def kan(n_in, n_out, grid_size, **kw):
    return lambda contiguous, device: KANLinear(n_in, n_out, grid_size=grid_size, contiguous_parameters=contiguous,
                                                device=device, **kw)


def ukan(n_in, n_out):
    return lambda contiguous, device: UKANLinear(n_in, n_out, contiguous_parameters=contiguous, device=device)


def poly(n_in, n_out, degree):
    return lambda contiguous, device: PolyKANLinear(n_in, n_out, degree, contiguous_parameters=contiguous,
                                                    device=device)


# (label, factory(contiguous, device), rows, in). On CUDA the B-spline cases with G + k <= 16 take the gemm
# strategy (no copy with either layout), the others the stencil kernels (one copy of each parameter a step,
# and of its gradient, with contiguous parameters).
CASES = {
    "cuda": [
        ("KANLinear 128, 40->256, G=5 (gemm)", kan(40, 256, 5), 128, 40),
        ("KANLinear 8192, 512->512, G=5 (gemm)", kan(512, 512, 5), 8192, 512),
        ("KANLinear 128, 40->256, G=32 (stencil)", kan(40, 256, 32), 128, 40),
        ("KANLinear 2^17, 32->32, G=64 (stencil)", kan(32, 32, 64), 2**17, 32),
        ("KANLinear 65536, 256->256, G=16 (stencil)", kan(256, 256, 16, strategy="stencil"), 65536, 256),
        ("KANLinear 4096, 64->64, G=1024 (stencil)", kan(64, 64, 1024), 4096, 64),
        ("UKANLinear 8192, 64->64", ukan(64, 64), 8192, 64),
        ("PolyKANLinear 128, 40->256, deg 8", poly(40, 256, 8), 128, 40),
        ("PolyKANLinear 4096, 512->512, deg 8", poly(512, 512, 8), 4096, 512),
    ],
    "cpu": [
        ("KANLinear 128, 40->256, G=5 (gemm)", kan(40, 256, 5), 128, 40),
        ("KANLinear 1024, 256->256, G=8 (gemm)", kan(256, 256, 8), 1024, 256),
        ("KANLinear 2048, 32->32, G=64 (stencil)", kan(32, 32, 64), 2048, 32),
        ("KANLinear 256, 64->64, G=1024 (stencil)", kan(64, 64, 1024), 256, 64),
        ("UKANLinear 1024, 32->32", ukan(32, 32), 1024, 32),
        ("PolyKANLinear 128, 40->256, deg 8", poly(40, 256, 8), 128, 40),
    ],
}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class Stepper:
    def __init__(self, layer, x):
        self.layer, self.x = layer, x
        self.optimizer = torch.optim.Adam(layer.parameters(), lr=1e-4)

    def __call__(self):
        self.optimizer.zero_grad()
        self.layer(self.x).square().mean().backward()
        self.optimizer.step()


def block_ms(step, device: str, steps: int) -> float:
    clock = time.perf_counter if device == "cuda" else time.process_time
    _sync(device)
    start = clock()
    for _ in range(steps):
        step()
    _sync(device)
    return (clock() - start) * 1e3 / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds of the two layouts")
    args = parser.parse_args()
    device = args.device
    if device == "cpu":
        torch.set_num_threads(1)
    print(f"device {device}" + (f" ({torch.cuda.get_device_name()})" if device == "cuda" else "")
          + f", torch {torch.__version__}; fastest of {args.rounds} x {args.repeats} blocks of {args.steps} steps")
    print("| case | contiguous (default) ms/step | kernel-layout views ms/step | difference |")
    print("|---|---|---|---|")
    for label, make, rows, n_in in CASES[device]:
        x = torch.rand(rows, n_in, device=device) * 2 - 1
        steppers = {}
        for contiguous in (True, False):
            torch.manual_seed(0)
            steppers[contiguous] = Stepper(make(contiguous, device), x)
            for _ in range(args.warmup):
                steppers[contiguous]()
        best = {True: float("inf"), False: float("inf")}
        for _ in range(args.rounds):
            for contiguous in (True, False):
                for _ in range(args.repeats):
                    best[contiguous] = min(best[contiguous], block_ms(steppers[contiguous], device, args.steps))
        plain, views = best[True], best[False]
        print(f"| {label} | {plain:.3f} | {views:.3f} | {plain - views:+.3f} ms ({100 * (plain / views - 1):+.1f}%) |",
              flush=True)


if __name__ == "__main__":
    main()
