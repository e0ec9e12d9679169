"""Small public-layout parameters read in place by the stencil kernels (``edge_ops.stencil_param``) against
copies into the kernels' layout: the graphed fwd+bwd (GPU time) and the eager step (host time) of the same layer
in one process, in alternating rounds. On the GPU machine:

    python scripts/in_place_params.py [--cpu]

"in place" sets the row bounds beyond every case (IN_PLACE_MAX_ROWS and IN_PLACE_MAX_ROWS_CAPTURED), "copies"
sets them to 0; the ratio is in place over copies, the median of 7 rounds (the range in brackets).
"""
import statistics
import sys

import torch

from warpkan.bench.timing import graphed, time_fn, training_step
from warpkan.torch_bridge import KANLinear, UKANLinear, edge_ops

from host_cost import eager_round_ms  # scripts/host_cost.py, which reads the same --cpu switch

dev = "cpu" if "--cpu" in sys.argv else "cuda"  # --cpu: a smoke run of the script, not a measurement
BOUNDS = {"in place": 10**9, "copies": 0}


def set_bounds(bound: int) -> None:
    edge_ops.IN_PLACE_MAX_ROWS = edge_ops.IN_PLACE_MAX_ROWS_CAPTURED = bound


CASES = {"KANLinear stencil G=5": lambda: KANLinear(32, 32, 5, strategy="stencil"),
         "KANLinear stencil G=21": lambda: KANLinear(32, 32, 21, strategy="stencil"),
         "KANLinear auto G=5": lambda: KANLinear(32, 32, 5),
         "UKANLinear table_groups=8": lambda: UKANLinear(32, 32, table_groups=8)}
for rows in ((16,) if dev == "cpu" else (128, 1024, 4096, 16384)):
    for name, make in CASES.items():
        if "stencil" not in name and rows > 1024:
            continue
        torch.manual_seed(0)
        layer = make().to(dev)
        x = (torch.rand(rows, 32, device=dev) * 2 - 1).requires_grad_(True)
        dy = torch.randn(rows, 32, device=dev)
        step = training_step(layer, x, dy)
        replay_us = {}
        for mode, bound in BOUNDS.items():
            set_bounds(bound)
            for _ in range(20):
                step()
            replay_us[mode] = time_fn(graphed(step), dev, warmup=3, repeat=50) * 1e3 if dev == "cuda" else float("nan")
        eager = {mode: [] for mode in BOUNDS}
        for _ in range(7):
            for mode, bound in BOUNDS.items():
                set_bounds(bound)
                eager[mode].append(eager_round_ms(step))
        ratios = [a / b for a, b in zip(eager["in place"], eager["copies"])]
        print(f"IN-PLACE {name:26s} rows {rows:6d}: graphed {replay_us['in place']:7.1f} / {replay_us['copies']:7.1f} us"
              f" | eager {statistics.median(eager['in place']):.3f} / {statistics.median(eager['copies']):.3f} ms, "
              f"ratio {statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})", flush=True)
