"""Cold compile cost per layer configuration: how many Warp modules ``warpkan precompile`` lists for it, how long
compiling them takes from an empty kernel cache, and the layer's first training step (forward and backward) cold
and after the precompile, side by side.

Every measurement runs in a fresh process on a fresh kernel cache (``WARP_CACHE_PATH`` in a temporary folder), so
nothing compiled earlier (in this process or in the user's cache) is reused:

- ``precompile``: compile the configuration's list (:func:`warpkan.kernels.precompile.modules`), as
  ``warpkan precompile`` does;
- ``step after``: in a second process on that cache, build the layer and run its first step: it should compile
  nothing (``compiled`` counts the modules Warp compiled);
- ``step cold``: on a cache of its own, the same first step with no precompile: what precompile saves;
- ``old``: the precompile before it listed every module with its block size (the edge families' modules of the
  configuration's keys, every table size, each at Warp's default block size of 256, and the transpose kernel on
  CUDA), then the first step on that cache: what it left to compile.

    python scripts/compile_cost.py --device cpu --out compile-cost          # every configuration
    python scripts/compile_cost.py --device cpu --quick --out compile-cost  # two small ones (a smoke run)
    python scripts/compile_cost.py --device cuda --out compile-cost

Writes ``compile_cost.json`` and ``compile_cost.md`` (a markdown table) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> (families, PrecompileConfig arguments, what the first step runs)
CASES = {
    "KANLinear G=5 k=3 fp32": (["bspline"], dict(orders=(3,), grid=5, uniform_only=True), "kan"),
    "UKANLinear k=3 fp32": (["ukan"], dict(orders=(3,)), "ukan"),
    "PolyKANLinear D=4 LUT fp32": (["poly"], dict(orders=(4,), bases=("chebyshev",), poly_modes=("lut",)), "poly_lut"),
    "PolyKANLinear D=4 exact fp32": (["poly"], dict(orders=(4,), bases=("chebyshev",), poly_modes=("exact",)),
                                     "poly_exact"),
    "GRKANLinear (5, 4) A, 8 groups fp32": (["rational"], dict(group_size=8, rational_variants=("A",)), "rational"),
    "GEGLUFFN 64/256 fp32 (4 and 64 rows)": (["geglu"], dict(hidden=64, inter=256), "geglu"),
    "Taylor mode 2-32-1 KAN (2 directions, 1 pair)": (["bspline"], dict(orders=(3,), grid=5, uniform_only=True,
                                                                         jets=((2, 1),)), "taylor"),
}
QUICK_CASES = ("KANLinear G=5 k=3 fp32", "GEGLUFFN 64/256 fp32 (4 and 64 rows)")


def _first_step(kind: str, device: str) -> None:
    """Build the layer of ``kind`` on ``device`` and run its first training step (forward and backward)."""
    import torch

    from warpkan.torch_bridge import GEGLUFFN, GRKANLinear, KANLinear, PolyKANLinear, UKANLinear, jet

    def step(layer, rows, features):
        x = (torch.rand(rows, features, device=device) * 2 - 1).requires_grad_(True)
        layer(x).square().sum().backward()

    if kind == "kan":
        step(KANLinear(64, 64, grid_size=5, spline_order=3, device=device), 256, 64)
    elif kind == "ukan":
        step(UKANLinear(64, 64, device=device), 256, 64)
    elif kind in ("poly_lut", "poly_exact"):
        step(PolyKANLinear(64, 64, 4, mode=kind[5:], device=device), 256, 64)
    elif kind == "rational":
        step(GRKANLinear(64, 64, num_groups=8, device=device), 256, 64)
    elif kind == "geglu":
        layer = GEGLUFFN(64, 256, device=device)
        step(layer, 4, 64)
        step(layer, 64, 64)
    elif kind == "taylor":
        model = torch.nn.Sequential(KANLinear(2, 32, device=device), KANLinear(32, 1, device=device))
        u = jet(model, torch.rand(256, 2, device=device) * 2 - 1, pairs=[(0, 0)])
        (u.d(1) - u.d2(0, 0)).square().mean().backward()
    else:
        raise ValueError(f"unknown step {kind!r}")
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _old_precompile(names: list, config, device: str) -> int:
    """What ``warpkan precompile`` compiled before it listed every module with its block size; the count."""
    import warp as wp

    from warpkan.kernels.edge import registry
    from warpkan.kernels.precompile import LAYER_FAMILIES

    is_cuda = wp.get_device(device).is_cuda
    modules = []
    for registry_name in [name for family in names for name in LAYER_FAMILIES[family]]:
        for family in registry.families(registry_name):
            key = registry.key_of(family)
            if not registry.key_matches(key, config.orders) or key["scalar_name"] not in config.dtypes:
                continue
            if config.uniform_only and key.get("uniform") is False:
                continue
            modules += [build.name for build in registry.family_modules(family, is_cuda)]
    if is_cuda:
        from warpkan.kernels._transpose import transpose_modules

        modules += [build.name for build in transpose_modules()]
    modules = list(dict.fromkeys(modules))
    for name in modules:
        wp.load_module(name, device=device)  # the module's default block size
    return len(modules)


def _child(case: str, phase: str, device: str) -> dict:
    """One measurement in this (fresh) process: the seconds it took and the modules Warp compiled and loaded."""
    import warp as wp
    import warp._src.context as wp_context

    from warpkan import _warp_output

    _warp_output.start_warp()
    compiled, loaded = set(), set()
    compile_module, load_module = wp_context.Module._compile, wp_context.Module.load

    def recording_compile(module, *args, **kwargs):
        done = compile_module(module, *args, **kwargs)
        if done:
            compiled.add(module.name)
        return done

    def recording_load(module, *args, **kwargs):
        loaded.add(module.name)
        return load_module(module, *args, **kwargs)

    wp_context.Module._compile, wp_context.Module.load = recording_compile, recording_load
    names, config_args, kind = CASES[case]
    listed = None
    if phase == "step":  # imported before the clock starts: the step's own cost is timed
        import torch  # noqa: F401

        import warpkan.torch_bridge  # noqa: F401
    start = time.perf_counter()
    if phase == "precompile":
        from warpkan.kernels import precompile
        from warpkan.kernels._modules import load

        is_cuda = wp.get_device(device).is_cuda
        builds = precompile.modules(names, precompile.PrecompileConfig(**config_args), is_cuda)
        for build in builds:
            load(build, device)
        listed = len(builds)
    elif phase == "old":
        from warpkan.kernels.precompile import PrecompileConfig

        listed = _old_precompile(names, PrecompileConfig(**config_args), device)
    else:
        _first_step(kind, device)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "compiled": len(compiled), "loaded": len(loaded), "listed": listed}


def _measure(case: str, phase: str, device: str, cache: str) -> dict:
    env = dict(os.environ, WARP_CACHE_PATH=cache, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    command = [sys.executable, __file__, "--child", case, "--phase", phase, "--device", device]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{case} / {phase} failed:\n{result.stdout}\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure(case: str, device: str) -> dict:
    with tempfile.TemporaryDirectory() as warm, tempfile.TemporaryDirectory() as cold, \
            tempfile.TemporaryDirectory() as old_cache:
        pre = _measure(case, "precompile", device, warm)
        after = _measure(case, "step", device, warm)
        first = _measure(case, "step", device, cold)
        old = _measure(case, "old", device, old_cache)
        after_old = _measure(case, "step", device, old_cache)
    return {"config": case, "modules": pre["listed"], "precompile_s": pre["seconds"],
            "precompile_compiled": pre["compiled"], "step_after_s": after["seconds"],
            "step_after_compiled": after["compiled"], "step_cold_s": first["seconds"],
            "step_cold_compiled": first["compiled"], "step_loaded": first["loaded"],
            "old_modules": old["listed"], "old_precompile_s": old["seconds"],
            "step_after_old_s": after_old["seconds"], "step_after_old_compiled": after_old["compiled"]}


LEGEND = {
    "modules": "Warp modules (at a block size each on CUDA) precompile lists for the configuration",
    "precompile_s": "seconds to compile and load them from an empty kernel cache",
    "step_after_s": "seconds of the first training step (layer built, forward and backward) after the precompile, "
                    "in a fresh process; compiled: the modules it still had to compile (0 expected)",
    "step_cold_s": "the same first step on an empty cache, no precompile; compiled: the modules it compiled, "
                   "loaded: the modules it loaded",
    "old_modules": "modules the earlier precompile compiled for the configuration (edge families only, every table "
                   "size, at Warp's default block size), and its seconds",
    "step_after_old_s": "the first step after that earlier precompile; compiled: the modules it still compiled",
}


def markdown(rows: list[dict], device: str) -> str:
    lines = [f"# Cold compile cost per layer configuration ({device})", "",
             "| config | modules | precompile_s | step_after_s (compiled) | step_cold_s (compiled / loaded) "
             "| old_modules (s) | step_after_old_s (compiled) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['config']} | {row['modules']} | {row['precompile_s']:.2f} | "
                     f"{row['step_after_s']:.2f} ({row['step_after_compiled']}) | "
                     f"{row['step_cold_s']:.2f} ({row['step_cold_compiled']} / {row['step_loaded']}) | "
                     f"{row['old_modules']} ({row['old_precompile_s']:.2f}) | "
                     f"{row['step_after_old_s']:.2f} ({row['step_after_old_compiled']}) |")
    lines.append("")
    lines += [f"- {column}: {text}" for column, text in LEGEND.items()]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    parser.add_argument("--out", default="compile-cost", help="folder for compile_cost.json and .md")
    parser.add_argument("--quick", action="store_true", help=f"only {' and '.join(QUICK_CASES)}")
    parser.add_argument("--case", action="append", choices=list(CASES), help="a configuration (repeatable)")
    parser.add_argument("--child", choices=list(CASES), help=argparse.SUPPRESS)
    parser.add_argument("--phase", choices=["precompile", "old", "step"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.phase, args.device)))
        return 0
    cases = args.case or (QUICK_CASES if args.quick else list(CASES))
    rows = []
    for case in cases:
        rows.append(measure(case, args.device))
        print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compile_cost.json").write_text(json.dumps({"device": args.device, "rows": rows}, indent=2) + "\n")
    table = markdown(rows, args.device)
    (out / "compile_cost.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
