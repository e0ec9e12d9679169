"""Time each phase of the B-spline stencil kernels on cuda (median of CUDA-event timings after warm-up): the
default kernels (warp-tiled where they apply, the backward pass on bands of cells for longer grids) and the
per-thread ones.

    python scripts/profile_bspline_backward.py [--cases N:in:out:G:k,...] [--entries-per-chunk E] [--band-table 48|80]
"""

import argparse

import torch
import warp as wp

from warpkan.bench.timing import time_fn  # noqa: E402
from warpkan.kernels import bspline as kb  # noqa: E402
from warpkan.torch_bridge._common import TorchWorkspace  # noqa: E402

DEFAULT_CASES = "131072:32:32:64:3,131072:32:32:256:3,131072:32:32:1024:3,131072:32:32:16384:3,131072:32:32:262144:3,65536:32:32:64:1,65536:32:32:64:5,65536:256:256:8:3"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default=DEFAULT_CASES)
    parser.add_argument("--entries-per-chunk", type=int, default=None)
    parser.add_argument("--band-table", type=int, default=None,
                        help="force the banded backward's table class (48 or 80 rows) for every band count")
    args = parser.parse_args()
    if args.band_table is not None:
        from warpkan.kernels.edge import tiled as kbt

        kbt.BANDED_CAPACITIES = {"float32": ((args.band_table, 10**6),)}
    if args.entries_per_chunk is not None:
        from warpkan.kernels.edge import launch as edge_launch

        edge_launch.ENTRIES_PER_CHUNK = args.entries_per_chunk
    for case in args.cases.split(","):
        n_rows, n_in, n_out, grid_size, order = (int(v) for v in case.split(":"))
        h = 2.0 / grid_size
        knots = (torch.arange(-order, grid_size + order + 1, device="cuda") * h - 1).expand(n_in, -1).contiguous()
        x = torch.rand(n_rows, n_in, device="cuda") * 2 - 1
        dy = torch.randn(n_rows, n_out, device="cuda")
        wb, s = torch.randn(n_in, n_out, device="cuda"), torch.randn(n_in, n_out, device="cuda")
        coef = torch.randn(n_in, grid_size + order, n_out, device="cuda") * 0.1
        y = torch.empty(n_rows, n_out, device="cuda")
        w = lambda t: wp.from_torch(t)  # noqa: E731
        args_ = (w(dy), w(x), w(knots), w(wb), w(s), w(coef), order, True)
        dx, dwb, ds, dc = (torch.zeros_like(t) for t in (x, wb, s, coef))
        stream = wp.stream_from_torch(torch.cuda.current_stream())
        ws = TorchWorkspace(torch.device("cuda"))  # what the torch bridge passes
        family = kb.family_of(order, True, "float32")
        n_buckets = knots.shape[1] + 1

        def bucketing():
            from warpkan.kernels.edge.launch import sort_entries

            with wp.ScopedStream(stream, sync_enter=False):
                sort_entries(family, kb.frame_of(w(knots)), ws, w(x), n_buckets)

        def backward(**grads):
            return lambda: kb.launch_backward(*args_, workspace=ws, stream=stream, **grads)

        params = dict(d_base_weight_t=w(dwb), d_scaler_t=w(ds), d_coef=w(dc))
        phases = {
            "bucketing (keys, stable sort)": bucketing,
            "forward": lambda: kb.launch_forward(w(x), w(knots), w(wb), w(s), w(coef), w(y), order, True, stream=stream),
            "forward, per-thread kernel": lambda: kb.launch_forward(w(x), w(knots), w(wb), w(s), w(coef), w(y), order,
                                                                    True, stream=stream, tiled=False),
            "backward dx only": backward(dx=w(dx)),
            "backward params only": backward(**params),
            "backward dx + params (training step)": backward(dx=w(dx), **params),
            "backward dx + params, deterministic": backward(dx=w(dx), deterministic=True, **params),
            # the training backward on the per-thread (bucketed) kernels, where the warp-tiled pass runs
            "backward dx + params, per-thread kernels": backward(dx=w(dx), tiled=False, **params),
        }
        print(f"\nN={n_rows} {n_in}->{n_out} G={grid_size} k={order}")
        total = 0.0
        for name, fn in phases.items():
            ms = time_fn(fn, "cuda")
            if name in ("forward", "backward dx + params (training step)"):
                total += ms
            print(f"  {name:42s} {ms:8.3f} ms", flush=True)
        print(f"  {'forward + training backward':42s} {total:8.3f} ms", flush=True)
        # check the bucketed training backward against the deterministic one
        grads = []
        for det in (False, True):
            for t in (dx, dwb, ds, dc):
                t.zero_()
            kb.launch_backward(*args_, workspace=ws, stream=stream, dx=w(dx), deterministic=det, **params)
            grads.append([t.clone() for t in (dx, dwb, ds, dc)])
        errs = [float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) for a, b in zip(*grads)]
        print("  bucketed vs deterministic, max rel err (dx, d_base, d_scaler, d_coef):",
              " ".join(f"{e:.1e}" for e in errs), flush=True)
        del x, dy, coef, dc, y


if __name__ == "__main__":
    main()
