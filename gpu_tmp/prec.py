import sys, torch, warp as wp
sys.path.insert(0, "tests")
wp.config.quiet = True
from test_bspline import _grid, _params, _fwd_bwd
from warpkan.reference.bspline import kan_linear
from warpkan.kernels import bspline as kb
n_rows, n_in, n_out, G, order = 257, 1, 8, 2304, 3
gen = torch.Generator().manual_seed(n_rows)
grid = _grid(n_in, G, order)
x = 0.7 * torch.randn(n_rows, n_in, generator=gen, dtype=torch.float64)
wb, sw, ss = _params(n_out, n_in, G + order, seed=n_in)
dy = torch.randn(n_rows, n_out, generator=gen, dtype=torch.float64)
errs = {}
for dt in (torch.float64, torch.float32):
    _, g = _fwd_bwd(lambda x, wb, sw, ss: kan_linear(x, grid.to(dt), wb, sw, ss, order), x.to(dt), [t.to(dt) for t in (wb, sw, ss)], dy.to(dt))
    errs[dt] = g[0]
cuda = lambda t: t.to(device="cuda", dtype=torch.float32).contiguous()
arrays = [wp.from_torch(cuda(t)) for t in (x, grid, wb.T, ss.T, sw.permute(1, 2, 0))]
for tiled in (True, False):
    g = [torch.zeros(s, dtype=torch.float32, device="cuda") for s in ((n_rows, n_in), (n_in, n_out), (n_in, n_out), (n_in, G + order, n_out))]
    kb.launch_backward(wp.from_torch(cuda(dy)), *arrays, order, True, True, *map(wp.from_torch, g), tiled=tiled)
    print("tiled" if tiled else "per-thread", "dx err", (g[0].double().cpu() - errs[torch.float64]).abs().max().item())
print("fp32 reference dx err", (errs[torch.float32].double() - errs[torch.float64]).abs().max().item(), "scale", errs[torch.float64].abs().max().item())
