"""UKAN's dense range on a side stream in a captured step (``_common.gemm_side_work``) against one stream, in one
process: the training step of `warpkan bench ukan`'s four cases and of the MNIST network's two layer shapes (fp32,
uniform data, the fixed table of the data's span), captured whole with ``_common.side_work`` on and off, timed in
alternating rounds (median of 7 rounds of 200 replays, us) with KANLinear on the same grid; and whether the two
captures' output and gradients are bitwise equal. On the GPU machine:

    python scripts/ukan_side_stream_ab.py [ROWS ...]   # only the cases of these row counts
"""
import statistics
import sys

import torch

from warpkan.bench import ukan as bu
from warpkan.bench.timing import graphed, training_step
from warpkan.torch_bridge import _common

CASES = [(1024, 32, 32, 32), (65536, 32, 32, 32), (8192, 256, 256, 32), (65536, 32, 32, 256), (128, 784, 32, 4),
         (128, 32, 10, 4)]
SIDE_WORK = _common.side_work


def replay_us(fn, n=200):
    for _ in range(10):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n * 1e3


wanted = {int(arg) for arg in sys.argv[1:]}
for n, fin, fout, g in CASES:
    if wanted and n not in wanted:
        continue
    torch.manual_seed(0)
    x = (torch.rand(n, fin, device="cuda") * 2 - 1).requires_grad_()
    dy = torch.randn(n, fout, device="cuda")
    span = bu.data_span(x, 2.0 / g)
    replays, results = {}, {}
    for label in ("side stream", "one stream"):
        torch.manual_seed(1)
        layer = bu._make(bu.FIXED, fin, fout, g, "cuda", span)
        _common.side_work = SIDE_WORK if label == "side stream" else (lambda device: None)
        replays[label] = graphed(training_step(layer, x, dy))
        _common.side_work = SIDE_WORK
        replays[label]()
        torch.cuda.synchronize()
        results[label] = [x.grad.clone()] + [p.grad.clone() for p in layer.parameters()]
    same = all(torch.equal(a, b) for a, b in zip(results["side stream"], results["one stream"]))
    replays["KANLinear"] = graphed(training_step(bu._make("warpkan KANLinear", fin, fout, g, "cuda", span), x, dy))
    times = {label: [] for label in replays}
    for _ in range(7):
        for label, replay in replays.items():
            times[label].append(replay_us(replay))
    med = {label: statistics.median(t) for label, t in times.items()}
    paired = statistics.median(a / b for a, b in zip(times["side stream"], times["one stream"]))
    print(f"CASE N={n} {fin}->{fout} G={g}: side stream {med['side stream']:.1f} us, one stream "
          f"{med['one stream']:.1f} us (paired {paired:.3f}), KANLinear {med['KANLinear']:.1f} us; UKAN / KANLinear "
          f"{med['side stream'] / med['KANLinear']:.3f} (one stream {med['one stream'] / med['KANLinear']:.3f}); "
          f"gradients bitwise equal: {same}", flush=True)
