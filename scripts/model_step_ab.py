"""One model implementation of `warpkan bench models` (bf16 autocast, one mode) under a library switch, timed
as the bench times it, with every GPU kernel of one profiled step: the A/B of a kernel change by its switch,
one configuration per process (a recorded launch keeps the choice it was recorded with).

    python scripts/model_step_ab.py --model KAN-Mixer --impl "warpkan KANLinear" [--mode graphed]
        [--no-row-pairs] [--strategy stencil|gemm|auto] [--precision auto|fp32|tf32|bf16] [--min-share 0.5]
        [--foreach]

``--no-row-pairs``: the bf16 dense basis one row a thread (``launch.BF16_ROW_PAIRS = False``); ``--strategy``:
every edge layer's strategy (KANLinear, UKANLinear, PolyKANLinear) instead of its own, ``--precision`` its gemm
precision; ``--foreach``: torch's foreach AdamW instead of the bench's fused one.
"""
import argparse

from warpkan.bench import models as bm
from warpkan.kernels.edge import launch as edge_launch

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="KAN-Mixer")
parser.add_argument("--impl", default="warpkan KANLinear")
parser.add_argument("--mode", default="graphed", choices=bm.MODES)
parser.add_argument("--no-row-pairs", action="store_true")
parser.add_argument("--strategy", default=None)
parser.add_argument("--precision", default=None)
parser.add_argument("--min-share", type=float, default=0.5, help="kernels listed: at least this %% of the step")
parser.add_argument("--foreach", action="store_true", help="torch's foreach AdamW instead of the fused one")
parser.add_argument("--cpu", action="store_true", help="a smoke run of the script on the quick shapes (ops, not kernels)")
args = parser.parse_args()

edge_launch.BF16_ROW_PAIRS = not args.no_row_pairs
if args.foreach:
    bm.OPTIMIZER = {"foreach": True}
device, precision, settings = ("cpu", "bf16 autocast", bm.QUICK) if args.cpu else ("cuda", "bf16 autocast", bm.FULL)
case = next(c for c in bm._cases(device, quick=args.cpu) if c.name == args.model)
if args.strategy or args.precision:
    build = case.impls[args.impl]

    def with_switches():
        model = build()
        for module in model.modules():
            for name in ("strategy", "precision"):
                if getattr(args, name) and hasattr(module, name):
                    setattr(module, name, getattr(args, name))
        return model

    case.impls[args.impl] = with_switches
row = bm._measure(case, args.impl, precision, args.mode, device, settings)
label = f"{args.model} | {args.impl} | {args.mode} | row pairs {not args.no_row_pairs} | strategy {args.strategy} | precision {args.precision}"
print(f"STEP {label}: {row['step_ms']:.3f} ms (spread {row['spread %']:.2f}%), peak {row.get('peak_MiB', 0):.0f} MiB",
      flush=True)

times = bm._profiled_step_times(case, args.impl, precision, args.mode, device, settings)
total = sum(us for _, us in times.values())
print(f"{'OPS' if args.cpu else 'KERNELS'} {label}: {total / 1e3:.3f} ms")
for key, (count, us) in sorted(times.items(), key=lambda item: -item[1][1]):
    if 100 * us / total >= args.min_share:
        print(f"  {us / 1e3:8.3f} ms {100 * us / total:5.1f}%  x{count:<4d} {key[:90]}")
