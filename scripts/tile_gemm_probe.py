"""The Warp-native gemm strategy's three tile-GEMM kernels (``warpkan.kernels.edge.tile_gemm``) timed alone, one
tile shape against another, beside cuBLAS (torch, fp32, TF32 off) on the same operands: what the tile list
(``TILE_SHAPES``) is chosen by. The shapes are those of one chunk of the target layer, KANLinear (65536,
256 -> 256, G = 8): a basis of width 3072 (256 SiLU rows and 11 bases an input) over 10880 rows, 256 outputs.

    python scripts/tile_gemm_probe.py [--shapes 64x64x32,128x64x32t256,...] [--jobs 8] [--rows 10880] [--mathdx]

A shape is rows x outputs x depth, and ``tN`` for N threads a block (128 without). Each shape is a module of
its own, its ``tile_matmul`` Warp's scalar GEMM (the library's default, ``warpkan.set_tile_matmul``; seconds
to build; ``TILE_SHAPES`` was re-checked on it: ``docs/perf-notes-engine.md``) or with ``--mathdx`` cuBLASDx (a
minute or two each on the GPU: its LTO build; the list was first chosen on it), built first in ``--jobs``
processes side by side, then timed in this process by ``warpkan.bench.timing.time_fn`` (median ms of
``--repeat`` launches after ``--warmup``, CUDA events on the GPU; compilation excluded). Each row gives ms and
TFLOP/s per kernel and how far the kernel's result lies from cuBLAS's (max |diff| / max |ref|).
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys
import time

DEFAULT_SHAPES = "64x64x32,64x64x64,64x64x128,64x64x32t256,128x64x32t256,128x64x64t256,128x128x32t256,64x128x32t256"


def use_gemm(mathdx: bool) -> None:
    """The tile GEMM modules' tile_matmul for this process (each build process and the timing one)."""
    from warpkan.kernels import _modules as kernel_modules

    kernel_modules.set_tile_matmul("mathdx" if mathdx else "scalar")


def build(text: str, device: str, mathdx: bool) -> None:
    import warp as wp

    from warpkan import _warp_output
    from warpkan.kernels.edge import tile_gemm

    _warp_output.start_warp()
    use_gemm(mathdx)
    shape = tile_gemm.TileShape.from_name(text)
    kernels = tile_gemm.tile_gemm_kernels("float32", shape)
    wp.load_module(kernels.module, device=device, block_dim=shape.threads if device != "cpu" else 1)


def build_all(shapes, jobs: int, device: str, mathdx: bool) -> dict:
    """Seconds of each shape's build (its own process), ``jobs`` at a time; None where the build failed."""
    pending, running, seconds = list(shapes), {}, {}
    while pending or running:
        while pending and len(running) < jobs:
            text = pending.pop(0)
            build = subprocess.Popen([sys.executable, __file__, "--build", text, "--device", device]
                                     + (["--mathdx"] if mathdx else []))
            running[text] = (build, time.perf_counter())
        for text, (proc, start) in list(running.items()):
            if proc.poll() is not None:
                seconds[text] = time.perf_counter() - start if proc.returncode == 0 else None
                del running[text]
        time.sleep(0.2)
    return seconds


def time_all(shapes, build_seconds: dict, rows: int, warmup: int, repeat: int, device: str) -> None:
    import torch
    import warp as wp

    from warpkan import _warp_output
    from warpkan.bench.timing import time_fn
    from warpkan.kernels.edge import tile_gemm

    _warp_output.start_warp()
    torch.backends.cuda.matmul.allow_tf32 = False
    width, n_out = 3072, 256
    gen = torch.Generator(device=device).manual_seed(0)
    basis_t = torch.rand(width, rows, device=device, generator=gen)
    weight = torch.randn(width, n_out, device=device, generator=gen) * 0.05
    dy = torch.randn(rows, n_out, device=device, generator=gen)
    flop = 2.0 * rows * width * n_out
    is_cuda = device != "cpu"

    timed = functools.partial(time_fn, device=device, warmup=warmup, repeat=repeat)

    ref = {"forward": basis_t.T @ weight, "weight_grad": basis_t @ dy, "basis_grad": weight @ dy.T}
    cublas = {"forward": timed(lambda: torch.mm(basis_t.T, weight)),
              "weight_grad": timed(lambda: torch.mm(basis_t, dy)),
              "basis_grad": timed(lambda: torch.mm(weight, dy.T))}
    print(f"cuBLAS fp32 (TF32 off), {rows} rows, width {width}, {n_out} outputs: "
          + ", ".join(f"{k} {v:.3f} ms ({flop / v / 1e9:.1f} TFLOP/s)" for k, v in cublas.items()), flush=True)
    weight_t, dy_t = weight.T.contiguous(), dy.T.contiguous()  # the kernels' operands (transposed outside)
    print("| shape | build s | forward ms (TFLOP/s) | weight_grad ms (TFLOP/s) | basis_grad ms (TFLOP/s) | sum ms | "
          "sum x cuBLAS | max err |")
    print("|---|---|---|---|---|---|---|---|")
    w_stream = wp.stream_from_torch(torch.cuda.current_stream()) if is_cuda else None
    w_device = "cuda:0" if is_cuda else "cpu"
    for text in shapes:
        if build_seconds.get(text) is None:
            print(f"| {text} | failed | | | | | | |", flush=True)
            continue
        shape = tile_gemm.TileShape.from_name(text)
        k = tile_gemm.tile_gemm_kernels("float32", shape)
        splits, per_split = tile_gemm.weight_grad_splits(rows, width, n_out, shape)
        padded = -(-width // shape.rows) * shape.rows
        partial = torch.zeros(splits * padded, n_out, device=device)
        d_basis = torch.empty(width, rows, device=device)
        y_t = torch.empty(n_out, rows, device=device)
        views = {name: wp.from_torch(t) for name, t in dict(basis_t=basis_t, weight=weight, dy=dy, y_t=y_t,
                                                             partial=partial, d_basis=d_basis, weight_t=weight_t,
                                                             dy_t=dy_t).items()}
        launch = functools.partial(wp.launch_tiled, block_dim=shape.threads if is_cuda else 1, stream=w_stream,
                                   device=w_device)
        launches = {
            "forward": lambda: launch(k.forward, dim=(-(-n_out // shape.cols), -(-rows // shape.rows)),
                                      inputs=[views["weight_t"], views["basis_t"], views["y_t"]]),
            "weight_grad": lambda: launch(k.weight_grad, dim=(padded // shape.rows, -(-n_out // shape.cols), splits),
                                          inputs=[views["basis_t"], views["dy"], per_split, padded, views["partial"]]),
            "basis_grad": lambda: launch(k.basis_grad, dim=(-(-width // shape.rows), -(-rows // shape.rows)),
                                         inputs=[views["weight"], views["dy_t"], views["d_basis"]]),
        }
        ms = {name: timed(fn) for name, fn in launches.items()}
        partial.zero_()
        for fn in launches.values():
            fn()
        if is_cuda:
            torch.cuda.synchronize()
        got = {"forward": y_t.T, "weight_grad": partial.view(splits, padded, n_out)[:, :width].sum(0),
               "basis_grad": d_basis}
        err = max(float((got[n] - ref[n]).abs().max() / ref[n].abs().max()) for n in ref)
        total = sum(ms.values())
        cell = {n: f"{ms[n]:.3f} ({flop / ms[n] / 1e9:.1f})" for n in ms}
        print(f"| {text} | {build_seconds[text]:.0f} | {cell['forward']} | {cell['weight_grad']} | "
              f"{cell['basis_grad']} | {total:.3f} | {total / sum(cublas.values()):.2f} | {err:.1e} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=DEFAULT_SHAPES)
    parser.add_argument("--build", help=argparse.SUPPRESS)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--device", default="cuda:0", help="cpu: a smoke run of the script, not a measurement")
    parser.add_argument("--rows", type=int, default=10880)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--mathdx", action="store_true", help="cuBLASDx's tile_matmul instead of Warp's scalar GEMM")
    args = parser.parse_args()
    if args.build:
        build(args.build, args.device, args.mathdx)
        return
    use_gemm(args.mathdx)
    shapes = args.shapes.split(",")
    seconds = build_all(shapes, args.jobs, args.device, args.mathdx)
    time_all(shapes, seconds, args.rows, args.warmup, args.repeat, args.device)


if __name__ == "__main__":
    main()
