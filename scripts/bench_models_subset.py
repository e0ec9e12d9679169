"""`warpkan bench models` restricted to what fits one GPU call: bf16 autocast only and the modes named on the
command line (default: eager and graphed), every model and implementation, targets and profiles of the missed
ones as the full run makes them.

    python scripts/bench_models_subset.py [--modes eager graphed reduce-overhead "compiled graphed"]
        [--models MNIST Speech ...] [--impls "warpkan chebyshev" "torch acos/cos" ...] [--foreach]

``--impls``: name prefixes of the implementations to keep (every one by default), e.g. the Speech Commands
net's Chebyshev forms in all five modes: ``--models Speech --impls "warpkan chebyshev" "torch acos/cos"
--modes eager compile reduce-overhead graphed "compiled graphed"``.

``--foreach``: torch's default foreach AdamW in every step instead of the bench's fused one (the bench's figures
before it took the fused optimizer).
"""
import argparse
import json

from warpkan.bench import markdown_table
from warpkan.bench import models as bm

parser = argparse.ArgumentParser()
parser.add_argument("--modes", nargs="*", default=["eager", "graphed"])
parser.add_argument("--models", nargs="*", default=None, help="name prefixes of the models to keep")
parser.add_argument("--impls", nargs="*", default=None, help="name prefixes of the implementations to keep")
parser.add_argument("--out", default=None)
parser.add_argument("--foreach", action="store_true", help="torch's foreach AdamW instead of the fused one")
args = parser.parse_args()
if args.foreach:
    bm.OPTIMIZER = {"foreach": True}
bm.PRECISIONS = ("bf16 autocast",)
bm.MODES = tuple(args.modes)
all_cases = bm._cases


def kept(name: str, prefixes) -> bool:
    return prefixes is None or any(name.startswith(p) for p in prefixes)


def cases(device, quick):
    chosen = [c for c in all_cases(device, quick) if kept(c.name, args.models)]
    for case in chosen:
        case.impls = {name: build for name, build in case.impls.items() if kept(name, args.impls)}
        case.same_function = {name: build for name, build in case.same_function.items() if kept(name, args.impls)}
    return chosen


bm._cases = cases
rows = bm.run("cuda", quick=False)
print(markdown_table(rows))
if args.out:
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1, default=str)
