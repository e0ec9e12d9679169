"""`warpkan bench ukan`'s four cases and the MNIST network's two layer shapes (fp32, uniform data): the
fixed-table UKANLinear against KANLinear on the same grid, the training step captured whole and replayed (median
of 5 rounds of 200 replays, us) and its peak memory after warm-up (``bench.timing.peak_memory``), in one process.
A third column bounds what a cheaper group-range search could give: the same UKAN step with ``group_range``
replaced by the result it returns (no range kernels at all).

    python scripts/ukan_graphed_and_peak.py [ROWS ...]   # only the cases of these row counts

At N=65536, h=2/256 its UKAN figure is 9% above what `warpkan bench ukan` and a separate timing of the bench's own
setup give in the same process (792 against 729 us; the other cases agree): use the bench's ratio for that case
(docs/perf-notes-engine.md, *The generator backward's hidden-gradient shares*).
"""
import statistics, sys, torch
from warpkan.bench import ukan as bu
from warpkan.bench.timing import graphed, peak_memory, training_step
import warpkan.torch_bridge.ukan as tu

CASES = [(1024, 32, 32, 32), (65536, 32, 32, 32), (8192, 256, 256, 32), (65536, 32, 32, 256), (128, 784, 32, 4),
         (128, 32, 10, 4)]

def replay_us(fn, n=200):
    for _ in range(10): fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n): fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / n * 1e3

real_group_range = tu.group_range
wanted = {int(arg) for arg in sys.argv[1:]}
for n, fin, fout, g in CASES:
    if wanted and n not in wanted:
        continue
    torch.manual_seed(0)
    x = (torch.rand(n, fin, device="cuda") * 2 - 1)
    dy = torch.randn(n, fout, device="cuda")
    span = bu.data_span(x, 2.0 / g)
    rows = {}
    for impl in (bu.FIXED, "warpkan KANLinear"):
        layer = bu._make(impl, fin, fout, g, "cuda", span)
        step = training_step(layer, x.clone().requires_grad_(), dy)
        for _ in range(3):
            step()
        peak = peak_memory(step, "cuda")
        rep = graphed(step)
        rows[impl] = (rep, peak)
        if impl == bu.FIXED:
            cached = real_group_range(x, 2.0 / g, bu.ORDER)
            tu.group_range = lambda *a, **k: cached
            rows["cached range"] = (graphed(step), peak)
            tu.group_range = real_group_range
    med = {k: statistics.median([replay_us(r) for _ in range(5)]) for k, (r, _) in rows.items()}
    f, k, c = med[bu.FIXED], med["warpkan KANLinear"], med["cached range"]
    pf, pk = rows[bu.FIXED][1], rows["warpkan KANLinear"][1]
    print(f"CASE N={n} {fin}->{fout} G={g} span={span}: ukan {f:.1f} us, kan {k:.1f} us ({f/k:.3f}x); no-range bound "
          f"{c:.1f} us ({c/k:.3f}x); peak ukan {pf:.3f} MiB kan {pk:.3f} MiB ({pf/pk:.3f}x)", flush=True)
