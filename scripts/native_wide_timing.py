"""Wide Warp-native layers: one training pass (forward + backward under ``wp.Tape``) of ``warpkan.KANLinear`` and
``warpkan.PolyKANLinear`` with the stencil strategy (the engine's per-edge kernels) and the gemm strategy (the
dense basis times the weight with ``wp.tile_matmul``) side by side, and the torch bridge's ``KANLinear`` /
``PolyKANLinear`` with ``strategy="gemm"`` (cuBLAS) at the same shape, all fp32: the cases and passes of
``warpkan bench native``'s wide-layer rows, with what that bench does not vary.

Each row also says how far the two native strategies lie apart (y, dx and every parameter gradient, max
|difference| over max |value|): the same map, so a few float32 units.

    python scripts/native_wide_timing.py --out DIR [--device cuda] [--quick]

``--tile-shapes 64x64x32,64x128x64t256`` times the native gemm path once per float32 tile shape (rows x outputs
x depth, ``tN`` for N threads a block; each a module to build, seconds on the scalar GEMM) in place of the
layer's own pick from ``warpkan.kernels.edge.tile_gemm.TILE_SHAPES``: what a change of that list would be
measured with. ``--chunk-mib M`` (repeatable) adds the native gemm path with that bound on a chunk of basis.
``--mathdx`` adds each native gemm variant with cuBLASDx's tile_matmul in place of Warp's scalar GEMM (the
default, :data:`warpkan.kernels._modules.TILE_MATMUL`; cuBLASDx modules take minutes to build).

Target (docs/perf-notes-engine.md): the native gemm path within 1.5x of the torch bridge's gemm path at
KANLinear (65536, 256 -> 256, G = 8). On CUDA the times come from CUDA events around ``--repeat`` passes after
``--warmup`` passes (the first of which builds the Warp modules: compilation is not timed); on the CPU from
the wall clock after a synchronize.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time

import numpy as np
import warp as wp

from warpkan.bench.native import QUICK_WIDE_CASES as QUICK_CASES
from warpkan.bench.native import WIDE_CASES as CASES
from warpkan.bench.native import WIDE_TARGET as TARGET_RATIO
from warpkan.bench.native import bridge_passes, native_layer, native_passes



def _timer(device: str):
    """ms of ``repeat`` calls of ``fn`` after ``warmup`` calls: CUDA events on the device's stream, else the
    wall clock after a synchronize."""
    def run(fn, warmup: int, repeat: int) -> float:
        for _ in range(warmup):
            fn()
        wp.synchronize_device(device)
        if wp.get_device(device).is_cuda:
            start, stop = wp.Event(device, enable_timing=True), wp.Event(device, enable_timing=True)
            wp.record_event(start)
            for _ in range(repeat):
                fn()
            wp.record_event(stop)
            wp.synchronize_event(stop)
            return wp.get_event_elapsed_time(start, stop) / repeat
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        wp.synchronize_device(device)
        return (time.perf_counter() - t0) * 1e3 / repeat

    return run


def _native_results(layer, x, dy):
    """(y, dx, parameter gradients) of one pass from zeroed gradients, as numpy arrays."""
    x.grad.zero_()
    for p in layer.parameters():
        p.grad.zero_()
    tape = wp.Tape()
    with tape:
        y = layer(x)
    tape.backward(grads={y: dy})
    return [y.numpy().copy(), x.grad.numpy().copy()] + [p.grad.numpy().copy() for p in layer.parameters()]


def _torch_row(kind, n_rows, n_in, n_out, size, device, timer, warmup, repeat):
    import torch

    torch_device = "cuda" if wp.get_device(device).is_cuda else "cpu"
    forward, step = bridge_passes(kind, n_rows, n_in, n_out, size, torch_device)
    # torch runs on its own current stream; the events are recorded on Warp's stream of the device, so put
    # Warp on torch's stream for the measurement
    stream = wp.stream_from_torch(torch.cuda.current_stream()) if torch_device == "cuda" else None
    with wp.ScopedStream(stream) if stream is not None else contextlib.nullcontext():
        return {"fwd_ms": timer(forward, warmup, repeat), "step_ms": timer(step, warmup, repeat)}


@contextlib.contextmanager
def _float32_tiles(shape, gemm: str):
    """The float32 layers' tile shape for the block (None: the list as it is), their tile_matmul by ``gemm``
    (:data:`warpkan.kernels._modules.TILE_MATMULS`)."""
    from warpkan.kernels import _modules as kernel_modules
    from warpkan.kernels.edge import tile_gemm

    listed, chosen = tile_gemm.TILE_SHAPES["float32"], kernel_modules.TILE_MATMUL
    if shape is not None:
        tile_gemm.TILE_SHAPES["float32"] = (shape,)
    kernel_modules.set_tile_matmul(gemm)
    try:
        yield
    finally:
        tile_gemm.TILE_SHAPES["float32"] = listed
        kernel_modules.set_tile_matmul(chosen)


def _parse_tile_shapes(text):
    from warpkan.kernels.edge.tile_gemm import TileShape

    return [TileShape.from_name(item) for item in text.split(",")] if text else []


def _parse_case(text):
    kind, *sizes = text.split(",")
    if kind not in ("KANLinear", "PolyKANLinear") or len(sizes) != 4:
        raise SystemExit(f"--case must be LAYER,ROWS,IN,OUT,SIZE with LAYER KANLinear or PolyKANLinear, got {text!r}")
    return (kind, *(int(v) for v in sizes))


@contextlib.contextmanager
def _chunk_bytes(mib):
    """The native gemm path's bound on a chunk of dense basis for the block (None: as it is)."""
    from warpkan.kernels.edge import tile_gemm

    kept = tile_gemm.GEMM_CHUNK_BYTES
    if mib is not None:
        tile_gemm.GEMM_CHUNK_BYTES = mib * 2**20
    try:
        yield
    finally:
        tile_gemm.GEMM_CHUNK_BYTES = kept


def measure(case, device, warmup, repeat, tile_shapes=(), mathdx=False, chunk_mib=()):
    kind, n_rows, n_in, n_out, size = case
    timer = _timer(device)
    rng = np.random.default_rng(0)
    x = wp.array(rng.uniform(-1, 1, (n_rows, n_in)).astype(np.float32), device=device, requires_grad=True)
    dy = wp.array(rng.standard_normal((n_rows, n_out)).astype(np.float32), device=device)
    rows, results = [], {}
    variants = [("stencil", None, "scalar", None)] + [
        ("gemm", shape, gemm, mib) for shape in tile_shapes or [None]
        for gemm in (("scalar", "mathdx") if mathdx else ("scalar",)) for mib in [None, *chunk_mib]]
    for strategy, shape, gemm, mib in variants:
        layer = native_layer(kind, n_in, n_out, size, strategy, device)
        with _float32_tiles(shape, gemm), _chunk_bytes(mib):
            forward, step = native_passes(layer, x, dy)
            fwd = timer(forward, warmup, repeat)
            path = (f"native {strategy}" + (f" {shape.name}" if shape is not None else "")
                    + (" cuBLASDx tile_matmul" if gemm == "mathdx" else "")
                    + (f" chunks of {mib} MiB" if mib else ""))
            rows.append({"path": path, "fwd_ms": fwd, "step_ms": timer(step, warmup, repeat)})
            results.setdefault(strategy, _native_results(layer, x, dy))
    apart = max(float(np.abs(a - b).max()) / max(float(np.abs(a).max()), 1e-30)
                for a, b in zip(results["stencil"], results["gemm"]))
    rows.append({"path": "torch bridge gemm", **_torch_row(kind, n_rows, n_in, n_out, size, device, timer, warmup,
                                                            repeat)})
    label = f"{kind} ({n_rows}, {n_in}->{n_out}, {'G' if kind == 'KANLinear' else 'D'}={size})"
    for row in rows:
        row["case"] = label
        row["strategies_apart"] = apart
    return rows


def _table(rows) -> str:
    lines = ["| case | path | fwd ms | fwd+bwd ms | vs torch gemm | stencil vs gemm apart |",
             "|---|---|---|---|---|---|"]
    torch_ms = {r["case"]: r["step_ms"] for r in rows if r["path"] == "torch bridge gemm"}
    for r in rows:
        ratio = f"{r['step_ms'] / torch_ms[r['case']]:.2f}x" if r["case"] in torch_ms else "-"
        lines.append(f"| {r['case']} | {r['path']} | {r['fwd_ms']:.3f} | {r['step_ms']:.3f} | {ratio} | "
                     f"{r['strategies_apart']:.1e} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for native_wide_timing.json and .md")
    parser.add_argument("--device", default=None, help="Warp device (default: cuda when present, else cpu)")
    parser.add_argument("--quick", action="store_true", help="small shapes (a CPU check of the script)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--case", action="append", default=[], metavar="LAYER,ROWS,IN,OUT,SIZE",
                        help="time this case instead of the default list (repeatable), e.g. KANLinear,4096,64,64,5 "
                        "(SIZE: the grid size, or a PolyKANLinear's degree)")
    parser.add_argument("--tile-shapes", default="", help="float32 tile shapes to time the native gemm path with, "
                        "e.g. 64x64x32,32x64x32 (default: the layer's own pick)")
    parser.add_argument("--chunk-mib", type=int, action="append", default=[],
                        help="also time the native gemm path with this bound on a chunk of dense basis, MiB "
                        "(repeatable; default: warpkan.kernels.edge.tile_gemm.GEMM_CHUNK_BYTES)")
    parser.add_argument("--mathdx", action="store_true", help="also time each native gemm variant with "
                        "cuBLASDx's tile_matmul in place of Warp's scalar GEMM (minutes of build)")
    args = parser.parse_args(argv)
    tile_shapes = _parse_tile_shapes(args.tile_shapes)
    wp.init()
    device = args.device or ("cuda" if wp.is_cuda_available() else "cpu")
    rows = []
    cases = [_parse_case(text) for text in args.case] or (QUICK_CASES if args.quick else CASES)
    for case in cases:
        rows += measure(case, device, args.warmup, args.repeat, tile_shapes, args.mathdx, args.chunk_mib)
        print(_table(rows), flush=True)
    head = rows[0]["case"]
    gemm_ms = min(r["step_ms"] for r in rows if r["case"] == head and r["path"].startswith("native gemm"))
    times = {r["path"]: r["step_ms"] for r in rows if r["case"] == head}
    summary = {"device": str(wp.get_device(device).name), "warp": wp.config.version, "rows": rows}
    if "torch bridge gemm" in times:
        ratio = gemm_ms / times["torch bridge gemm"]
        summary["target"] = {"case": head, "native_gemm_over_torch_gemm": ratio, "target_ratio": TARGET_RATIO,
                             "met": ratio <= TARGET_RATIO}
        print(f"{head}: native gemm / torch bridge gemm = {ratio:.2f}x (target <= {TARGET_RATIO}x)")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "native_wide_timing.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(args.out, "native_wide_timing.md"), "w") as f:
        f.write(f"Warp-native wide layers, fp32, {summary['device']}\n\n{_table(rows)}\n")


if __name__ == "__main__":
    main()
