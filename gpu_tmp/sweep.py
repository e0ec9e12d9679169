import torch, warp as wp
wp.config.quiet = True
wp.init()
from warpkan.bench.timing import time_fn
from warpkan.kernels import bspline as kb, bspline_tiled as kbt
from warpkan.torch_bridge._common import TorchWorkspace
n_rows, n_in, n_out, order = 131072, 32, 32, 3
for G in (128, 256, 512, 1024, 2048, 4096):
    h = 2.0 / G
    knots = (torch.arange(-order, G + order + 1, device="cuda") * h - 1).expand(n_in, -1).contiguous()
    x = torch.rand(n_rows, n_in, device="cuda") * 2 - 1
    dy = torch.randn(n_rows, n_out, device="cuda")
    wb, s = torch.randn(n_in, n_out, device="cuda"), torch.randn(n_in, n_out, device="cuda")
    coef = torch.randn(n_in, G + order, n_out, device="cuda") * 0.1
    w = wp.from_torch
    dx, dwb, ds, dc = (torch.zeros_like(t) for t in (x, wb, s, coef))
    stream = wp.stream_from_torch(torch.cuda.current_stream())
    ws = TorchWorkspace(torch.device("cuda"))
    line = f"G={G}:"
    for cap in (48, 80):
        kbt.BANDED_CAPACITIES = {"float32": ((cap, 1000),)}
        plan = kbt.backward_plan(True, "float32", G + order, order)
        fn = lambda: kb.launch_backward(w(dy), w(x), w(knots), w(wb), w(s), w(coef), order, True, dx=w(dx), d_base_weight_t=w(dwb), d_scaler_t=w(ds), d_coef=w(dc), workspace=ws, stream=stream, tiled=True)
        line += f"  cap {cap} ({plan.n_bands} bands) {time_fn(fn, 'cuda'):.3f}"
    fn = lambda: kb.launch_backward(w(dy), w(x), w(knots), w(wb), w(s), w(coef), order, True, dx=w(dx), d_base_weight_t=w(dwb), d_scaler_t=w(ds), d_coef=w(dc), workspace=ws, stream=stream, tiled=False)
    line += f"  per-thread {time_fn(fn, 'cuda'):.3f}"
    print(line, flush=True)
    del coef, dc
