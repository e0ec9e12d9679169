"""The warpkan command line: demo, info, precompile and bench."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

from . import _warp_output

TORCH_HINT = 'pip install "warpkan[torch]"'


class CommandError(Exception):
    """A problem the command reports in one line (exit status 1, or 2 for a bad argument)."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


def _require(modules: list[str]) -> None:
    """Fail in one line, before the command does anything, when a module it needs is not installed."""
    import importlib

    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if not missing:
        return
    names = " and ".join(missing)
    installs = " ".join('"warpkan[torch]"' if name == "torch" else name for name in missing)
    raise CommandError(f"this command needs {names}, not installed here: pip install {installs}")


def _check_device(device: str, torch_needed: bool) -> str:
    """``device`` if Warp (and torch, for the commands that use it) can run on it, else a one-line error."""
    import warp as wp

    match = re.fullmatch(r"cpu|cuda(?::(\d+))?", device)
    if match is None:
        raise CommandError(f"--device {device}: expected cpu, cuda or cuda:N", status=2)
    if device == "cpu":
        return device
    index = int(match.group(1) or 0)
    if not wp.is_cuda_available():
        raise CommandError(f"--device {device}: Warp finds no CUDA device on this machine (use --device cpu)")
    if index >= wp.get_cuda_device_count():
        raise CommandError(f"--device {device}: there are {wp.get_cuda_device_count()} CUDA devices")
    if torch_needed:
        import torch

        if not torch.cuda.is_available():
            raise CommandError(f"--device {device}: this torch ({torch.__version__}) has no CUDA support "
                               "(torch.cuda.is_available() is False; use --device cpu)")
    return device


def _default_device() -> str:
    import warp as wp

    return "cuda" if wp.is_cuda_available() else "cpu"


def cmd_info(args) -> int:
    import warp as wp

    import warpkan

    print(f"warpkan {warpkan.__version__}")
    print(f"warp    {wp.__version__}")
    try:
        import torch

        cuda = f"cuda {torch.version.cuda}, available={torch.cuda.is_available()}"
        print(f"torch   {torch.__version__} ({cuda})")
    except ImportError:
        print(f"torch   not installed ({TORCH_HINT} for the PyTorch layers)")
    print("devices:")
    for device in wp.get_devices():
        print(f"  {device.alias:8s} {device.name}")
    print(f"kernel cache: {wp.config.kernel_cache_dir}")
    return 0


# precompile --config's keys: what each says of the layer (a kernel module depends on all but out)
CONFIG_KEYS = {"order": "spline order or polynomial degree, default 3",
               "grid": "a B-spline grid size: only its table's kernels", "in": "input features",
               "out": "output features", "groups": "a rational layer's groups, of in features",
               "hidden": "a GEGLU layer's hidden size", "inter": "its intermediate size",
               "rows": "its small_batch_rows"}


def _parse_config(text: str) -> dict:
    """'in=32,out=32,grid=64,order=3' -> dict of ints, every key one of CONFIG_KEYS."""
    config = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        key = key.strip()
        try:
            config[key] = int(value)
        except ValueError:
            raise CommandError(f"--config {text}: expected key=integer pairs, e.g. in=32,out=32,grid=64,order=3",
                               status=2) from None
        if key not in CONFIG_KEYS:
            raise CommandError(f"--config {text}: unknown key {key!r}; known: {', '.join(CONFIG_KEYS)}", status=2)
    return config


def _parse_pair(option: str, text: str) -> tuple:
    """'2,1' -> (2, 1) for an option of two integers."""
    try:
        first, second = (int(part) for part in text.split(","))
    except ValueError:
        raise CommandError(f"{option} {text}: expected two integers, e.g. 2,1", status=2) from None
    return first, second


def _precompile_configs(args) -> list:
    """The configurations to compile for: one per --config (its keys narrowing the options), else the options."""
    from .kernels.poly import basis_names
    from .kernels.precompile import PrecompileConfig

    unknown = [name for name in args.basis or () if name not in basis_names()]
    if unknown:
        raise CommandError(f"unknown basis {', '.join(unknown)}; known: {', '.join(basis_names())}", status=2)
    options = {"bases": args.basis, "poly_modes": args.poly_mode, "rational_variants": args.rational_variant}
    common = {name: tuple(value) for name, value in options.items() if value}  # the rest: every one
    common.update(dtypes=tuple(args.dtype), uniform_only=args.uniform_only, create_graph=args.create_graph,
                  native=args.native,
                  jets=tuple(_parse_pair("--taylor", text) for text in args.taylor or ()),
                  rational_orders=tuple(_parse_pair("--rational-order", text)
                                        for text in args.rational_order or ["5,4"]))
    if not args.config:
        return [PrecompileConfig(orders=tuple(sorted(set(args.orders))), **common)]
    configs = []
    for text in args.config:
        config = _parse_config(text)
        groups, features = config.get("groups"), config.get("in")
        if groups is not None and (features is None or groups <= 0 or features % groups):
            raise CommandError(f"--config {text}: groups must divide in (a rational layer's features)", status=2)
        configs.append(PrecompileConfig(orders=(config.get("order", 3),), grid=config.get("grid"),
                                        group_size=features // groups if groups else None,
                                        hidden=config.get("hidden"), inter=config.get("inter"),
                                        small_batch_rows=config.get("rows", PrecompileConfig.small_batch_rows),
                                        **common))
    return configs


# the default --jobs on CUDA at most: each worker process holds a CUDA context (some hundreds of MiB of GPU
# memory) while it builds
MAX_CUDA_JOBS = 8


def cmd_precompile(args) -> int:
    import warp as wp

    from .kernels import precompile
    from .kernels._modules import distinct

    devices = [_check_device(device, torch_needed=False) for device in args.device] if args.device else [_default_device()]
    names = args.family or list(precompile.LAYER_FAMILIES)
    unknown = [name for name in names if name not in precompile.LAYER_FAMILIES]
    if unknown:
        raise CommandError(f"unknown family {', '.join(unknown)}; known: {', '.join(precompile.LAYER_FAMILIES)}",
                           status=2)
    configs = _precompile_configs(args)
    for device in devices:
        is_cuda = wp.get_device(device).is_cuda
        # every module a layer of these configurations can load, at the block sizes its launches use
        builds = distinct(build for config in configs for build in precompile.modules(names, config, is_cuda))
        cores = os.cpu_count() or 1
        jobs = min(args.jobs or (min(cores, MAX_CUDA_JOBS) if is_cuda else cores), max(len(builds), 1))

        def report(build, seconds, device=device, is_cuda=is_cuda):
            block = f" ({build.block_dim} threads a block)" if is_cuda else ""  # one on the CPU
            print(f"{build.name:45s} on {device}{block}: {seconds:6.2f} s", flush=True)

        start = time.perf_counter()
        precompile.load_all(builds, device, jobs, names, configs, is_cuda, report)
        print(f"{len(builds)} modules on {device} in {time.perf_counter() - start:.1f} s "
              f"({jobs} at a time)", flush=True)
    return 0


def cmd_bench(args) -> int:
    from . import bench

    unknown = [name for name in args.family if name not in bench.families()]
    if unknown:
        raise CommandError(f"unknown benchmark family {', '.join(unknown)}; known: {', '.join(bench.families())}",
                           status=2)
    _require(["torch"])
    device = _check_device(args.device, torch_needed=True) if args.device else _default_device()
    bench.run(args.family or None, device=device, quick=args.quick, out_dir=args.out)
    print(f"\nresults written to {os.path.abspath(args.out)}")
    return 0


def cmd_demo(args) -> int:
    _require(["torch", "tqdm", "matplotlib"])
    device = _check_device(args.device, torch_needed=True) if args.device else _default_device()
    from .demo import run_demo

    return run_demo(device=device, steps=args.steps, out_dir=args.out, seed=args.seed)


def _positive(text: str) -> int:
    """An option's positive int, by the layers' rule (warpkan._checks); argparse reports the error."""
    from . import _checks

    try:
        return _checks.positive_int("the value", int(text))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def build_parser() -> argparse.ArgumentParser:
    from .bench import families

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", action="store_true",
                        help="show Warp's start-up banner and its module-load lines (as WARPKAN_VERBOSE=1 does)")

    parser = argparse.ArgumentParser(prog="warpkan", description="Kolmogorov-Arnold Network layers with NVIDIA Warp "
                                     "kernels: a demo, environment information, kernel precompilation, benchmarks.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="one of:")

    demo = sub.add_parser("demo", parents=[common], help="train a B-spline KAN, a UKAN and an MLP on exp(sin(pi x) + y^2)",
                          description="Train a B-spline KAN, an unbounded-grid UKAN and an MLP of similar size on "
                          "f(x, y) = exp(sin(pi x) + y^2); print an RMSE table and write a PNG of the learned surfaces.")
    demo.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when present, else cpu)")
    demo.add_argument("--steps", type=_positive, default=1500, help="Adam steps per model (default: 1500)")
    demo.add_argument("--seed", type=int, default=0, help="random seed of the data and the models (default: 0)")
    demo.add_argument("--out", default="demo-output",
                      help="folder for demo_surfaces.png, created when the plot is written (default: demo-output)")
    demo.set_defaults(fn=cmd_demo)

    info = sub.add_parser("info", parents=[common], help="versions, devices and the kernel cache",
                          description="Print the versions of warpkan, Warp and torch, the devices Warp sees and "
                          "Warp's kernel-cache folder.")
    info.set_defaults(fn=cmd_info)

    pre = sub.add_parser("precompile", parents=[common], help="compile the KAN layers' kernels ahead of time",
                         description="Compile every Warp kernel module the layers of the asked families, orders and "
                         "dtypes can load (B-spline KANLinear, UKAN, polynomial, group-rational, GEGLU), at the "
                         "block sizes their launches use, into Warp's kernel cache, so that the first training "
                         "step does not wait for them.")
    pre.add_argument("--family", action="append",
                     help="a layer family to compile: bspline, ukan, poly, rational or geglu (repeatable; default: "
                     "every one)")
    pre.add_argument("--device", action="append",
                     help="cpu, cuda or cuda:N to compile for (repeatable; default: cuda when present, else cpu)")
    pre.add_argument("--config", action="append",
                     help="one layer configuration, key=integer pairs, e.g. in=32,out=32,grid=64,order=3, the keys: "
                     + "; ".join(f"{key} ({text})" for key, text in CONFIG_KEYS.items())
                     + " (repeatable; overrides --orders)")
    pre.add_argument("--orders", type=int, nargs="+", default=[1, 2, 3, 4, 5], metavar="K",
                     help="spline orders (or polynomial degrees) to compile (default: 1 2 3 4 5)")
    pre.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "float64", "float16", "bfloat16"],
                     help="parameter dtypes to compile for (default: float32; float16 and bfloat16 serve the "
                     "rational and GEGLU layers, of that dtype or under autocast)")
    pre.add_argument("--uniform-only", action="store_true",
                     help="skip the non-uniform-grid kernels (used after update_grid)")
    pre.add_argument("--basis", action="append",
                     help="a polynomial layer's basis: chebyshev, legendre, ... (repeatable; default: every one)")
    pre.add_argument("--poly-mode", action="append", choices=["exact", "lut"],
                     help="a polynomial layer's mode (repeatable; default: both)")
    pre.add_argument("--rational-order", action="append", default=[], metavar="M,N",
                     help="a rational layer's (numerator, denominator) order (repeatable; default: 5,4)")
    pre.add_argument("--rational-variant", action="append", choices=["A", "B"],
                     help="a rational layer's variant (repeatable; default: both)")
    pre.add_argument("--taylor", action="append", metavar="D,P",
                     help="also the Taylor-mode kernels of jets of D directions and P second-derivative pairs, "
                     "e.g. 2,1 for u_t and u_xx of u(x, t) (repeatable)")
    pre.add_argument("--jobs", type=_positive, default=None, metavar="N",
                     help="modules to build at a time, each in a process of its own (default: one per CPU core, "
                     f"at most {MAX_CUDA_JOBS} on CUDA, where each process holds a CUDA context while it builds; 1: "
                     "one after the other, in this process)")
    pre.add_argument("--create-graph", action="store_true",
                     help="also the kernels of a create_graph=True backward (a LUT layer's derivative family, the "
                     "rational Taylor-series kernels)")
    pre.add_argument("--native", action="store_true",
                     help="also the tile GEMMs of the Warp-native layers' gemm strategy (warpkan.KANLinear, "
                     "warpkan.PolyKANLinear; no torch layer loads them)")
    pre.set_defaults(fn=cmd_precompile)

    bench = sub.add_parser("bench", parents=[common], help="benchmarks against peer implementations: JSON and markdown",
                           description="Time warpkan's layers against peer implementations and write, per family, "
                           "FAMILY.json, FAMILY.md (a markdown table) and, where a family draws one, FAMILY.png.")
    bench.add_argument("family", nargs="*", metavar="FAMILY",
                       help=f"families to run, from: {', '.join(families())} (default: all)")
    bench.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when present, else cpu)")
    bench.add_argument("--quick", action="store_true", help="small shapes and few repeats (a smoke run)")
    bench.add_argument("--out", default="bench-results", help="folder for the results (default: bench-results)")
    bench.set_defaults(fn=cmd_bench)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.verbose:
        _warp_output.set_verbose(True)
    _warp_output.start_warp()  # every command uses Warp
    try:
        return args.fn(args)
    except CommandError as error:
        print(f"warpkan {args.command}: error: {error}", file=sys.stderr)
        return error.status


if __name__ == "__main__":
    sys.exit(main())
