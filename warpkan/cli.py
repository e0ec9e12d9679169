"""The ``warpkan`` command line: ``demo``, ``info``, ``precompile`` and ``bench``."""

from __future__ import annotations

import argparse
import os
import sys


def _default_device() -> str:
    import warp as wp

    wp.init()
    return "cuda" if wp.is_cuda_available() else "cpu"


def cmd_info(args) -> int:
    import warp as wp

    wp.config.quiet = True
    wp.init()
    import warpkan

    print(f"warpkan {warpkan.__version__}")
    print(f"warp    {wp.__version__}")
    try:
        import torch

        cuda = f"cuda {torch.version.cuda}, available={torch.cuda.is_available()}"
        print(f"torch   {torch.__version__} ({cuda})")
    except ImportError:
        print("torch   not installed (pip install 'warpkan[torch]' for the PyTorch layers)")
    print("devices:")
    for device in wp.get_devices():
        print(f"  {device.alias:8s} {device.name}")
    print(f"kernel cache: {wp.config.kernel_cache_dir}")
    return 0


def _parse_config(text: str) -> dict:
    """'in=32,out=32,grid=64,order=3,uniform=1' -> dict of ints."""
    config = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        config[key.strip()] = int(value)
    return config


def cmd_precompile(args) -> int:
    import time

    import warp as wp

    from .kernels import bspline as kb
    from .kernels import bspline_tiled as kbt

    wp.init()
    devices = args.device or [_default_device()]
    orders = sorted({_parse_config(c).get("order", 3) for c in args.config} if args.config else set(args.orders))
    for device in devices:
        for order in orders:
            for uniform in (True, False) if not args.uniform_only else (True,):
                for scalar in args.dtype:
                    variant = kb.get_variant(order, uniform, scalar)
                    # every module the layer can launch: the stencil kernels, the row-block backward and the
                    # dense-basis (gemm) kernels of each basis dtype, and on CUDA the warp-tiled kernels
                    modules = variant.modules
                    if wp.get_device(device).is_cuda:
                        modules += kbt.tiled_modules(order, uniform, scalar)
                    for module in modules:
                        start = time.perf_counter()
                        wp.load_module(module, device=device)
                        print(f"{module:45s} on {device}: {time.perf_counter() - start:6.2f} s", flush=True)
    return 0


def cmd_bench(args) -> int:
    from . import bench

    device = args.device or _default_device()
    bench.run(args.family or None, device=device, quick=args.quick, out_dir=args.out)
    print(f"\nresults written to {os.path.abspath(args.out)}")
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(device=args.device or _default_device(), steps=args.steps, out_dir=args.out, seed=args.seed)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="warpkan", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="train a B-spline KAN and an MLP on exp(sin(pi x) + y^2)")
    demo.add_argument("--device", help="cpu or cuda (default: cuda when present)")
    demo.add_argument("--steps", type=int, default=1500)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--out", default="demo-output")
    demo.set_defaults(fn=cmd_demo)

    info = sub.add_parser("info", help="versions, devices and the kernel cache")
    info.set_defaults(fn=cmd_info)

    pre = sub.add_parser("precompile", help="compile kernels ahead of time")
    pre.add_argument("--device", action="append", help="device to compile for (repeatable; default: cuda if present)")
    pre.add_argument("--config", action="append", help="layer configuration, e.g. in=32,out=32,grid=64,order=3")
    pre.add_argument("--orders", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    pre.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "float64"])
    pre.add_argument("--uniform-only", action="store_true", help="skip the non-uniform (after update_grid) path")
    pre.set_defaults(fn=cmd_precompile)

    from .bench import families

    bench = sub.add_parser("bench", help="benchmarks: JSON + markdown table")
    bench.add_argument("family", nargs="*", choices=families() + [[]], help="families (default: all)")
    bench.add_argument("--device", help="cpu or cuda (default: cuda when present)")
    bench.add_argument("--quick", action="store_true", help="small shapes, few repeats")
    bench.add_argument("--out", default="bench-results")
    bench.set_defaults(fn=cmd_bench)

    args = parser.parse_args(argv)
    import warp as wp

    wp.config.quiet = True  # the banner and per-module load lines would drown the command's own output
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
