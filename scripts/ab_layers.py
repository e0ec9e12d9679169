"""Old-vs-new layer timings: the default (auto) warpkan rows of `warpkan bench bspline` and `warpkan bench ukan`,
fwd+bwd training steps (CUDA events, median), printed as JSON lines. Run once per checkout with PYTHONPATH
pointing at it; compare the two in one session."""
import json, sys
import torch
from warpkan.bench.timing import time_fn, training_step
from warpkan.bench import bspline as bb
from warpkan.bench import ukan as bu

tag = sys.argv[1]
dev = "cuda"
out = {}
for (n, i, o, g, k) in bb.FULL_CASES:
    torch.manual_seed(0)
    layer = bb._make("warpkan", i, o, g, k, dev)
    x = (torch.rand(n, i, device=dev) * 2 - 1).requires_grad_(True)
    dy = torch.randn(n, o, device=dev)
    out[f"bspline {n},{i}->{o},G={g},k={k}"] = time_fn(training_step(layer, x, dy), dev, warmup=3, repeat=20)
    del layer, x, dy
    torch.cuda.empty_cache()
for (n, i, o, g) in bu.FULL_CASES:
    for impl in bu.IMPLS[:2]:
        torch.manual_seed(0)
        layer = bu._make(impl, i, o, g, dev)
        x = (torch.rand(n, i, device=dev) * 2 - 1).requires_grad_(True)
        dy = torch.randn(n, o, device=dev)
        out[f"ukan {n},{i}->{o},G={g} {impl[:30]}"] = time_fn(training_step(layer, x, dy), dev, warmup=3, repeat=20)
        del layer, x, dy
        torch.cuda.empty_cache()
print("AB " + json.dumps({"tag": tag, "rows": out}), flush=True)
