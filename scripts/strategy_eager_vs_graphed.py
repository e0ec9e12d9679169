"""Eager (host-bound) and graphed steps of small layers by strategy, the measurements behind the eager side of
"auto" (warpkan.kernels.edge.strategy.EAGER_TILED_MAX_TILES). On the GPU machine: python scripts/strategy_eager_vs_graphed.py strategies"""
import sys
import torch
from host_cost import eager_ms  # scripts/host_cost.py
from warpkan.bench.timing import time_fn, training_step, graphed
from warpkan.torch_bridge import KANLinear, UKANLinear

dev = "cuda"


def strategies():
    cases = [("KANLinear G=5", lambda s, i, o: KANLinear(i, o, 5, strategy=s), (1024, 32, 32)),
             ("KANLinear G=21", lambda s, i, o: KANLinear(i, o, 21, strategy=s), (1024, 32, 32)),
             ("KANLinear G=5", lambda s, i, o: KANLinear(i, o, 5, strategy=s), (4096, 64, 64)),
             ("KANLinear G=5", lambda s, i, o: KANLinear(i, o, 5, strategy=s), (128, 40, 256)),
             ("KANLinear G=5", lambda s, i, o: KANLinear(i, o, 5, strategy=s), (128, 32, 10)),
             ("UKANLinear R=8", lambda s, i, o: UKANLinear(i, o, table_groups=8, strategy=s), (1024, 32, 32)),
             ("UKANLinear R=6 h=.5", lambda s, i, o: UKANLinear(i, o, grid_delta=0.5, table_groups=6, strategy=s), (128, 32, 10))]
    for name, build, (n, i, o) in cases:
        row = []
        for s in ("stencil", "gemm"):
            torch.manual_seed(0)
            layer = build(s, i, o).to(dev)
            x = torch.randn(n, i, device=dev, requires_grad=True)
            dy = torch.randn(n, o, device=dev)
            step = training_step(layer, x, dy)
            row.append(f"{s}: eager {eager_ms(step):.3f} graphed {time_fn(graphed(step), dev, warmup=3, repeat=50):.4f}")
        print(f"STRATEGY {name} ({n}, {i}->{o}): " + " | ".join(row), flush=True)


for w in sys.argv[1:]:
    globals()[w]()
