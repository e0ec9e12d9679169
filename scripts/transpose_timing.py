"""The transposing copies of a public-layout parameter: torch's copy against the Warp transpose kernel
(``warpkan.kernels._transpose``), both ways of the B-spline table ([out, M] -> [M, out], the forward's copy
into the kernels' layout; [M, out] -> [out, M], the gradient's copy back) and a batched one (PolyKANLinear's
[in, out, D + 1] -> [in, D + 1, out]).

    python scripts/transpose_timing.py                 # cuda when present, else the CPU
    python scripts/transpose_timing.py --device cpu --out 32 --m 1048576 --threads 1

Prints a markdown table: per copy, the fastest of --repeats runs (ms; the minimum, as other load only ever
adds time) of torch's copy of the permuted view (``out.copy_(view)``) and of the Warp kernel's (the bridge's
``copy_into(view, out)``, replayed as a layer replays it), into the same preallocated ``out``, and the
bandwidth each reaches (bytes read + written). Each result is checked bitwise against torch's.
"""

from __future__ import annotations

import argparse
import time

import torch

from warpkan.torch_bridge import _common


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def best_ms(fn, device: str, repeats: int) -> float:
    fn()  # record / compile first
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--out", type=int, default=32, help="outputs (the short side of the table)")
    parser.add_argument("--m", type=int, default=2**21, help="in * (G + k) (the long side)")
    parser.add_argument("--poly", default="512,512,9", help="in,out,D+1 of the batched case")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None, help="torch's CPU threads (torch's default if not given)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = args.device, getattr(torch, args.dtype)
    _common.WARP_TRANSPOSE_DEVICES.add(device)
    n_in, n_out, n_basis = (int(v) for v in args.poly.split(","))
    cases = [
        (f"[{args.out}, {args.m}] -> [{args.m}, {args.out}]",
         torch.randn(args.out, args.m, dtype=dtype, device=device).t()),
        (f"[{args.m}, {args.out}] -> [{args.out}, {args.m}]",
         torch.randn(args.m, args.out, dtype=dtype, device=device).t()),
        (f"[{n_in}, {n_out}, {n_basis}] -> [{n_in}, {n_basis}, {n_out}]",
         torch.randn(n_in, n_out, n_basis, dtype=dtype, device=device).permute(0, 2, 1)),
    ]
    print(f"{device}, {args.dtype}, torch threads {torch.get_num_threads()}\n")
    print("| copy | torch ms | Warp kernel ms | torch GB/s | Warp GB/s |")
    print("|---|---|---|---|---|")
    for label, view in cases:
        out = torch.empty(view.shape, dtype=dtype, device=device)
        assert _common.transpose_plan(view.shape, view.stride()) is not None
        torch_ms = best_ms(lambda: out.copy_(view), device, args.repeats)
        want = out.clone()
        warp_ms = best_ms(lambda: _common.copy_into(view, out), device, args.repeats)
        bits = torch.int32 if dtype == torch.float32 else torch.int64
        if not torch.equal(out.view(bits), want.view(bits)):
            raise SystemExit(f"{label}: the Warp kernel's copy differs from torch's")
        moved = 2 * view.numel() * view.element_size() / 1e9
        print(f"| {label} | {torch_ms:.2f} | {warp_ms:.2f} | {moved / torch_ms * 1e3:.0f} | "
              f"{moved / warp_ms * 1e3:.0f} |")


if __name__ == "__main__":
    main()
