"""Forward + backward of small KAN layers, CUDA-graphed: the fused tile kernels (warpkan.kernels.edge.fused)
against the gemm strategy (edge_driver.gemm_forward / gemm_backward) and the best torch form, side by side.

    python scripts/fused_small_timing.py --out DIR            # on the GPU machine
    python scripts/fused_small_timing.py --quick --out DIR    # a CPU smoke run (eager, small sizes)

Each path runs one training step of one layer on the same float32 tensors: y and every gradient (x and the
parameters). The fused path is what a layer would launch: for KANLinear the weight combine, the fused forward,
the fused backward (and its partials' combine) and the split into the parameter gradients; for PolyKAN the
coefficient table is the weight, so the fused forward and backward alone. The torch forms are Chebyshev's
recurrence + einsum and acos/cos (warpkan.bench.poly) and efficient-kan's KANLinear
(warpkan.reference.efficient_kan). On CUDA each step is captured in a CUDA graph and replayed (CUDA events
after warm-up; compilation and capture excluded), and the eager time is given too; on the CPU it runs eagerly.
Before timing, the fused path's y, dx and dW are checked against the gemm strategy's (relative max error
printed and written).

Writes DIR/fused_small_timing.json and DIR/fused_small_timing.md. The target: the fused path at least 1.4x
faster than the best torch form (graphed) at the two PolyKAN configurations. A fused path whose outputs differ
from the gemm strategy's by more than CHECK_RTOL (relative to the largest entry) is marked MISMATCH.

Tuning on the GPU, without new modules: ``--plans TARGET_BLOCKS=512,MIN_CHUNKS_PER_SPLIT=1`` times the fused
paths at other values of the plan's constants too. Other tile configurations (a module each per family, ~30 s
or more of compilation each on the GPU: split them over several runs with ``--cases``), e.g.
``--cases 0,1 --tiles r16_w64_o32,r32_w32_o32,r64_w64_o64``.
"""

import argparse
import json
import os
import sys
import time

import torch
import warp as wp

from warpkan.bench.poly import _TorchPolyLayer
from warpkan.bench.timing import graphed, time_fn, training_step
from warpkan.kernels._runtime import Workspace
from warpkan.kernels.edge import fused
from warpkan.kernels.edge import launch as edge
from warpkan.kernels.edge.dense import dense_width
from warpkan.reference.efficient_kan import EfficientKANLinear
from warpkan.torch_bridge import edge_driver
from warpkan.torch_bridge._common import warp_stream
from warpkan.torch_bridge.bspline_ops import bspline_spec
from warpkan.torch_bridge.poly_ops import basis_spec

# (kind, rows, in, out, degree or G)
CASES = [("polykan", 128, 40, 256, 8), ("polykan", 64, 256, 512, 15), ("kanlinear", 128, 784, 32, 5),
         ("kanlinear", 1024, 32, 32, 5), ("kanlinear", 128, 32, 10, 5)]
QUICK_CASES = [("polykan", 16, 8, 12, 8), ("kanlinear", 16, 8, 6, 5)]
SPLINE_ORDER = 3
TARGET_SPEEDUP = 1.4  # fused against the best torch form, PolyKAN cases
CHECK_RTOL = 1e-4  # fused against the gemm strategy, both float32: a few roundings of sums of 10^2-10^4 terms


class Step:
    """One path's training step on fixed tensors: ``run()`` overwrites its outputs; ``outputs()`` gives
    (y, dx, dW) for the cross-check (dW in the combined weight's layout) against the ``reference`` step."""

    def __init__(self, run, outputs, reference=None):
        self.run, self.outputs, self.reference = run, outputs, reference


def parse_tiles(name: str) -> fused.FusedTiles:
    """``r32_w64_o64`` -> FusedTiles(32, 64, 64)."""
    parts = dict((p[0], int(p[1:])) for p in name.split("_"))
    return fused.FusedTiles(parts["r"], parts["w"], parts["o"])


def _tile_choices(family, n_rows, n_out, extra_tiles) -> dict:
    """{label suffix: tiles}: the launchers' own choice (suffix ""), then the ``extra_tiles`` other than it."""
    default = fused.fused_tiles(family, n_rows, n_out)
    return {"": None, **{f" [{t.name}]": t for t in extra_tiles if t != default}}


def _frame(spec):
    return spec.make_frame(*[wp.from_torch(t) for t in spec.frame_tensors], *spec.frame_config)


PLAN_CONSTANTS = ("TARGET_BLOCKS", "MIN_CHUNKS_PER_SPLIT")  # the fused plan's tunables (no new module)


def parse_plan(text: str) -> dict:
    """``TARGET_BLOCKS=512+MIN_CHUNKS_PER_SPLIT=1`` -> {name: value}, names from PLAN_CONSTANTS."""
    plan = dict(item.split("=") for item in text.split("+"))
    unknown = set(plan) - set(PLAN_CONSTANTS)
    if unknown:
        raise SystemExit(f"unknown plan constants {sorted(unknown)}; known: {PLAN_CONSTANTS}")
    return {name: int(value) for name, value in plan.items()}


class _PlanConstants:
    """The fused module's plan constants set to ``values`` inside the block ({}: left as they are)."""

    def __init__(self, values: dict):
        self.values = values

    def __enter__(self):
        self.saved = {name: getattr(fused, name) for name in self.values}
        for name, value in self.values.items():
            setattr(fused, name, value)

    def __exit__(self, *exc):
        for name, value in self.saved.items():
            setattr(fused, name, value)


def _fused_steps(spec, x, dy, weight_of, split, n_out, extra_tiles, plans, label) -> dict:
    """{name: step} of the fused path at the launchers' own tiles and each of ``extra_tiles``, each with the
    module's plan constants and each of ``plans``."""
    steps = {}
    for suffix, tiles in _tile_choices(spec.family, x.shape[0], n_out, extra_tiles).items():
        for plan in [{}, *plans]:
            name = label + suffix + "".join(f" {k.lower()}={v}" for k, v in plan.items())
            steps[name] = _fused_step(spec, x, dy, weight_of, split, n_out, tiles, plan)
    return steps


def _fused_step(spec, x, dy, weight_of, split, n_out, tiles=None, plan_constants=None) -> Step:
    """The fused kernels on torch's stream: ``weight_of(stream)`` makes (or is) the combined weight, ``split``
    turns d_weight into the parameter gradients (None: d_weight is the coefficients' own gradient); ``tiles``
    None: the launchers' own choice; ``plan_constants``: the fused module's plan constants for this path."""
    plan_constants = plan_constants or {}
    family, n_coef, use_base = spec.family, spec.n_coef, spec.use_base
    width = dense_width(x.shape[1], n_coef, use_base)
    frame, view = _frame(spec), wp.from_torch
    y = x.new_empty((x.shape[0], n_out))
    dx = torch.empty_like(x)
    d_weight = x.new_empty((width, n_out))
    # scratch sized once, before any capture (a capture must not allocate)
    workspace = Workspace(wp.device_from_torch(x.device))
    with _PlanConstants(plan_constants):
        plan = fused.fused_plan(family, x.shape[0], x.shape[1], n_coef, n_out, use_base, tiles)
    for name, shape in (("fused_forward_partial", plan.forward_partial_shape(x.shape[0], n_out)),
                        ("fused_backward_partial", plan.backward_partial_shape(n_out))):
        if shape[0]:
            workspace.get(name, shape, family.scalar)
    xv, dyv, yv, dxv, dwv = (view(t) for t in (x, dy, y, dx, d_weight))

    def run():
        stream = warp_stream(x.device)
        weight = view(weight_of(stream))
        with _PlanConstants(plan_constants):
            fused.launch_fused_forward(family, frame, xv, n_coef, weight, None, yv, use_base, stream=stream,
                                       workspace=workspace, tiles=tiles)
        fused.launch_fused_backward(family, frame, dyv, xv, n_coef, weight, dxv, dwv, use_base, stream=stream,
                                    workspace=workspace, tiles=tiles)
        if split is not None:
            split(dwv, stream)

    return Step(run, lambda: (y, dx, d_weight))


def _poly_paths(x, dy, n_out, degree, mode, extra_tiles, plans):
    lut_size = 4096 if mode == "lut" else 0
    spec = basis_spec(x, "chebyshev", lut_size, 1.0, 1.0, degree + 1)
    gen = torch.Generator(device=x.device).manual_seed(1)
    coef = torch.randn(x.shape[1], degree + 1, n_out, device=x.device, generator=gen) / (x.shape[1] * (degree + 1))
    weight = coef.view(-1, n_out)
    engine = (spec.family, spec.make_frame, spec.frame_tensors, spec.frame_config)
    result = {}

    def gemm():
        result["y"] = edge_driver.gemm_forward(*engine, x, None, None, coef, False, "fp32")
        result["grads"] = edge_driver.gemm_backward(*engine, dy, x, None, None, coef, False, "fp32", True, True)

    def gemm_outputs():
        dx, _, _, d_coef = result["grads"]
        return result["y"], dx, d_coef.view(-1, n_out)

    gemm_step = Step(gemm, gemm_outputs)
    paths = _fused_steps(spec, x, dy, lambda stream: weight, None, n_out, extra_tiles, plans, f"fused {mode}")
    for step in paths.values():
        step.reference = gemm_step
    return {**paths, f"gemm {mode}": gemm_step}


def _kanlinear_paths(x, dy, n_out, grid_size, extra_tiles, plans):
    n_in, k = x.shape[1], SPLINE_ORDER
    h = 2.0 / grid_size
    grid = (torch.arange(-k, grid_size + k + 1, device=x.device) * h - 1.0).expand(n_in, -1).contiguous()
    spec = bspline_spec(x, grid, k, True, True)
    gen = torch.Generator(device=x.device).manual_seed(1)
    base_weight_t = torch.randn(n_in, n_out, device=x.device, generator=gen) / n_in
    scaler_t = 1.0 + 0.1 * torch.randn(n_in, n_out, device=x.device, generator=gen)
    coef = torch.randn(n_in, spec.n_coef, n_out, device=x.device, generator=gen) / n_in
    family, view = spec.family, wp.from_torch
    weight = x.new_empty((dense_width(n_in, spec.n_coef, True), n_out))
    grads = [torch.empty_like(t) for t in (base_weight_t, scaler_t, coef)]
    params = [view(t) for t in (base_weight_t, scaler_t, coef)]
    weight_view, grad_views = view(weight), [view(t) for t in grads]

    def combine(stream):
        edge.launch_combine_weights(family, *params, weight_view, True, stream=stream)
        return weight

    def split(d_weight, stream):
        edge.launch_split_param_grads(family, d_weight, params[1], params[2], *grad_views, True, stream=stream)

    engine = (spec.family, spec.make_frame, spec.frame_tensors, spec.frame_config)
    result = {}

    def gemm():
        result["y"] = edge_driver.gemm_forward(*engine, x, base_weight_t, scaler_t, coef, True, "fp32")
        result["grads"] = edge_driver.gemm_backward(*engine, dy, x, base_weight_t, scaler_t, coef, True, "fp32",
                                                    True, True)

    def gemm_outputs():
        # the combined weight's gradient, rebuilt from the split: [d_base; d_coef / scaler]
        dx, d_base, _, d_coef = result["grads"]
        return result["y"], dx, torch.cat([d_base, (d_coef / scaler_t.unsqueeze(1)).reshape(-1, n_out)])

    gemm_step = Step(gemm, gemm_outputs)
    paths = _fused_steps(spec, x, dy, combine, split, n_out, extra_tiles, plans, "fused")
    for step in paths.values():
        step.reference = gemm_step
    return {**paths, "gemm": gemm_step}


def _torch_paths(kind, x, n_out, size, dy):
    def step_of(model):
        model = model.to(x.device)
        step = training_step(model, x, dy)
        return Step(step, None)

    if kind == "polykan":
        return {"torch recurrence+einsum": step_of(_TorchPolyLayer(x.shape[1], n_out, size, "recurrence")),
                "torch acos/cos": step_of(_TorchPolyLayer(x.shape[1], n_out, size, "acos"))}
    return {"torch efficient-kan": step_of(EfficientKANLinear(x.shape[1], n_out, size, SPLINE_ORDER))}


def _rel_err(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item() if b.numel() else 0.0


def _cross_check(paths) -> dict:
    """max relative error of each fused path's (y, dx, dW) against the gemm path of its mode."""
    errors = {}
    for name, step in paths.items():
        if step.reference is None:
            continue
        step.run()
        step.reference.run()
        ours, ref = step.outputs(), step.reference.outputs()
        errors[name] = {label: _rel_err(a, b) for label, a, b in zip(("y", "dx", "dW"), ours, ref)}
    return errors


def _time(step: Step, device: str, quick: bool) -> dict:
    repeat = 5 if quick else 100
    row = {"eager_ms": time_fn(step.run, device, warmup=3, repeat=repeat)}
    if device.startswith("cuda"):
        row["graphed_ms"] = time_fn(graphed(step.run), device, warmup=5, repeat=repeat)
    return row


def run_case(case, device: str, quick: bool, extra_tiles=(), plans=()) -> list[dict]:
    kind, n_rows, n_in, n_out, size = case
    torch.manual_seed(0)
    x = (torch.rand(n_rows, n_in, device=device) * 2.2 - 1.1).requires_grad_()
    dy = torch.randn(n_rows, n_out, device=device)
    xd = x.detach()
    if kind == "polykan":
        ours = {**_poly_paths(xd, dy, n_out, size, "exact", extra_tiles, plans),
                **_poly_paths(xd, dy, n_out, size, "lut", extra_tiles, plans)}
        spec = basis_spec(xd, "chebyshev", 0, 1.0, 1.0, size + 1)
    else:
        ours = _kanlinear_paths(xd, dy, n_out, size, extra_tiles, plans)
        spec = bspline_spec(xd, torch.zeros(n_in, size + 2 * SPLINE_ORDER + 1, device=device), SPLINE_ORDER, True,
                            True)
    applies = fused.fused_applies(spec.family, n_rows, n_in, spec.n_coef, n_out, spec.use_base)
    errors = _cross_check(ours)
    for name, err in errors.items():
        if max(err.values()) > CHECK_RTOL:
            print(f"MISMATCH {kind} {n_rows} {n_in}->{n_out} {name}: relative errors {err} against the gemm "
                  "strategy", flush=True)
    label = f"{kind} ({n_rows}, {n_in}->{n_out}, {'D' if kind == 'polykan' else 'G'}={size})"
    rows = []
    for name, step in {**ours, **_torch_paths(kind, x, n_out, size, dy)}.items():
        row = {"case": label, "impl": name, **_time(step, device, quick)}
        if name in errors:
            row["rel_err_vs_gemm"] = errors[name]
            row["fused_applies"] = applies
        rows.append(row)
        print(json.dumps(row), flush=True)
    key = "graphed_ms" if device.startswith("cuda") else "eager_ms"
    best_torch = min(r[key] for r in rows if r["impl"].startswith("torch"))
    for row in rows:
        row["speedup_vs_best_torch"] = best_torch / row[key]
    return rows


def _markdown(rows, device: str) -> str:
    key = "graphed_ms" if device.startswith("cuda") else "eager_ms"
    lines = [f"fwd+bwd step, float32, {device}; speedup against the best torch form ({key})", "",
             "| case | impl | graphed ms | eager ms | speedup vs best torch | rel. err vs gemm (y / dx / dW) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        err = r.get("rel_err_vs_gemm")
        err_text = " / ".join(f"{err[k]:.1e}" for k in ("y", "dx", "dW")) if err else ""
        if err and max(err.values()) > CHECK_RTOL:
            err_text += " MISMATCH"
        if "fused_applies" in r and not r["fused_applies"]:
            err_text += " (outside fused_applies)"
        graphed_ms = f"{r['graphed_ms']:.4f}" if "graphed_ms" in r else "-"
        lines.append(f"| {r['case']} | {r['impl']} | {graphed_ms} | {r['eager_ms']:.4f} | "
                     f"{r['speedup_vs_best_torch']:.2f}x | {err_text} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for fused_small_timing.json / .md")
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats (a CPU smoke run)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiles", default="",
                        help="comma-separated extra tile configurations of the fused kernels to time, e.g. "
                             "r16_w64_o32,r64_w64_o64 (a module each per family: ~30+ s of compilation on the GPU)")
    parser.add_argument("--plans", default="",
                        help="comma-separated variants of the fused plan's constants to time too, each NAME=V "
                             "joined by '+', e.g. MIN_CHUNKS_PER_SPLIT=1,TARGET_BLOCKS=512+MIN_CHUNKS_PER_SPLIT=2 "
                             f"(names: {', '.join(PLAN_CONSTANTS)}; no new module)")
    parser.add_argument("--cases", default="", help="comma-separated indices into the case list (default all)")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.device == "cpu":
        # Warp runs a CPU kernel on one thread: one torch thread too (on a shared machine torch's thread pool
        # also waits on busy cores: 100+ ms a step of these tiny layers was measured with two threads)
        torch.set_num_threads(1)
    print(f"device {args.device}, torch {torch.__version__}, warp {wp.__version__}", flush=True)
    t0 = time.perf_counter()
    rows = []
    cases = QUICK_CASES if args.quick else CASES
    if args.cases:
        cases = [cases[int(i)] for i in args.cases.split(",")]
    extra_tiles = [parse_tiles(name) for name in args.tiles.split(",") if name]
    plans = [parse_plan(text) for text in args.plans.split(",") if text]
    for case in cases:
        rows += run_case(case, args.device, args.quick, extra_tiles, plans)
    with open(os.path.join(args.out, "fused_small_timing.json"), "w") as f:
        json.dump({"device": args.device, "torch": torch.__version__, "warp": wp.__version__, "rows": rows}, f,
                  indent=1)
    table = _markdown(rows, args.device)
    with open(os.path.join(args.out, "fused_small_timing.md"), "w") as f:
        f.write(table)
    print(table)
    for row in rows:
        if row["case"].startswith("polykan") and row["impl"].startswith("fused"):
            verdict = "meets" if row["speedup_vs_best_torch"] >= TARGET_SPEEDUP else "misses"
            print(f"{row['case']} {row['impl']}: {row['speedup_vs_best_torch']:.2f}x the best torch form, "
                  f"{verdict} the {TARGET_SPEEDUP}x target")
    print(f"total {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
