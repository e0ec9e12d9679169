"""Time each phase of the B-spline stencil backward on cuda (CUDA events, after warm-up).

    python scripts/profile_bspline_backward.py
"""

import torch
import warp as wp

wp.config.quiet = True
wp.init()

from warpkan.kernels import bspline as kb  # noqa: E402
from warpkan.torch_bridge._common import TorchWorkspace  # noqa: E402


def timed(fn, repeat=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeat


def main():
    for n_rows, n_in, n_out, grid_size in [(2**17, 32, 32, 64), (2**17, 32, 32, 1024), (2**17, 32, 32, 2**18), (65536, 256, 256, 8)]:
        order = 3
        h = 2.0 / grid_size
        knots = (torch.arange(-order, grid_size + order + 1, device="cuda") * h - 1).expand(n_in, -1).contiguous()
        x = torch.rand(n_rows, n_in, device="cuda") * 2 - 1
        dy = torch.randn(n_rows, n_out, device="cuda")
        wb, s = torch.randn(n_in, n_out, device="cuda"), torch.randn(n_in, n_out, device="cuda")
        coef = torch.randn(n_in, grid_size + order, n_out, device="cuda") * 0.1
        y = torch.empty(n_rows, n_out, device="cuda")
        w = lambda t: wp.from_torch(t)  # noqa: E731
        args = (w(dy), w(x), w(knots), w(wb), w(s), w(coef), order, True)
        dx, dwb, ds, dc = (torch.zeros_like(t) for t in (x, wb, s, coef))
        stream = wp.stream_from_torch(torch.cuda.current_stream())
        ws = TorchWorkspace(torch.device("cuda"))  # what the torch bridge passes
        variant = kb.get_variant(order, True)
        n_buckets = knots.shape[1] + 1

        def bucketing():
            with wp.ScopedStream(stream, sync_enter=False):
                kb._bucket_entries(variant, ws, w(x), w(knots), n_buckets)

        phases = {
            "bucketing (keys, stable sort, offsets)": bucketing,
            "forward": lambda: kb.launch_forward(w(x), w(knots), w(wb), w(s), w(coef), w(y), order, True, stream=stream),
            "backward dx": lambda: kb.launch_backward(*args, workspace=ws, dx=w(dx), stream=stream),
            "backward d_base+d_scaler": lambda: kb.launch_backward(*args, workspace=ws, d_base_weight_t=w(dwb), d_scaler_t=w(ds), stream=stream),
            "backward params, bucketed (base+scaler+coef)": lambda: kb.launch_backward(
                *args, workspace=ws, d_base_weight_t=w(dwb), d_scaler_t=w(ds), d_coef=w(dc), stream=stream),
            "backward params, deterministic (base+scaler+coef)": lambda: kb.launch_backward(
                *args, workspace=ws, d_base_weight_t=w(dwb), d_scaler_t=w(ds), d_coef=w(dc), deterministic=True, stream=stream),
            "backward d_coef only (gather)": lambda: kb.launch_backward(*args, workspace=ws, d_coef=w(dc), stream=stream),
        }
        print(f"\nN={n_rows} {n_in}->{n_out} G={grid_size} k={order}")
        for name, fn in phases.items():
            print(f"  {name:42s} {timed(fn):8.3f} ms", flush=True)


if __name__ == "__main__":
    main()
