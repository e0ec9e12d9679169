"""The UKAN dense-range CG-MLP alone, old SIMT generator against the fused tile generator
(``warpkan.kernels.ukan.CG_GENERATOR``), side by side in one run: forward (the table) and forward + backward
(the table, then every parameter gradient from a table gradient), as the eager range layer runs them
(``ukan_ops._range_table_impl`` / ``_range_table_backward_impl``: the SIMT forward keeps its rows for the
backward, the tile backward recomputes them); and the same rows as the Warp-native layer's touched-pair
table, as ``warpkan.native.ukan.UKANLinear`` runs its CG-MLP (the pair search itself not timed).

Tables: the four ``warpkan bench ukan`` shapes (exact dense range: every feature's rows from the widest span
of the bench's uniform [-1, 1) data, found by the layer's own group-range search) and the UKAN layers of the
``warpkan bench models`` KAN-Mixer and MNIST networks (fixed tables of table_groups + 1 groups a feature).
Times are medians of CUDA events after a warm-up that includes the compilation
(:func:`warpkan.bench.timing.time_fn`); each case also reports the largest difference between the two
generators' tables and gradients, relative to the largest entry.

    python scripts/ukan_generator_timing.py --out DIR [--quick] [--device cuda] [--no-pairs]

Each path's first call is timed on the wall clock too: with a fresh kernel cache (``WARP_CACHE_PATH=<empty
folder>``) it includes the build of its modules, so that cuBLASDx's tile_matmul ("tile") and Warp's scalar one
("tile scalar", :data:`warpkan.kernels._modules.TILE_MATMULS`) are compared on build time as well.

``--quick``: small shapes and few repeats, runnable on the CPU (a smoke test of the script, not a measurement).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time

import torch

from warpkan.bench.models import _cases as model_cases
from warpkan.bench.timing import time_fn
from warpkan.bench.ukan import CG, FULL_CASES, ORDER, QUICK_CASES
from warpkan.kernels import _modules as kernel_modules
from warpkan.kernels import ukan as ku
from warpkan.kernels._common import on_stream
from warpkan.torch_bridge import UKANLinear
from warpkan.torch_bridge import ukan_ops
from warpkan.torch_bridge._common import to_warp, warp_stream

# "tile scalar": the tile generator with Warp's scalar tile_matmul in place of cuBLASDx (no LTO build)
GENERATORS = ["simt", "tile", "tile scalar"]


@contextlib.contextmanager
def generator(name: str):
    """The CG-MLP path ``name`` of :data:`GENERATORS` for the block; the first call's wall seconds (the build
    of modules not in the kernel cache, which a fresh ``WARP_CACHE_PATH`` makes cold) go to ``first``."""
    previous = ku.CG_GENERATOR, kernel_modules.TILE_MATMUL
    ku.CG_GENERATOR = "simt" if name == "simt" else "tile"
    kernel_modules.set_tile_matmul("scalar" if name.endswith("scalar") else "mathdx")
    try:
        yield
    finally:
        ku.CG_GENERATOR = previous[0]
        kernel_modules.set_tile_matmul(previous[1])


def first_call_s(fn, device: str) -> float:
    """Wall seconds of one call of ``fn``, its GPU work finished (and none queued before it)."""
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def bench_tables(device: str, quick: bool) -> list[dict]:
    """The range tables of the ``warpkan bench ukan`` shapes: (N, in, out, G) on uniform [-1, 1) data with
    h = 2 / G, rows a feature from the layer's group-range search."""
    cases = []
    for n_rows, n_in, n_out, grid_size in QUICK_CASES if quick else FULL_CASES:
        torch.manual_seed(0)
        x = torch.rand(n_rows, n_in, device=device) * 2 - 1
        group_lo, span = ukan_ops.group_range(x, 2.0 / grid_size, ORDER)
        cases.append(dict(case=f"bench ukan N={n_rows} {n_in}->{n_out} h=2/{grid_size}", n_in=n_in, n_out=n_out,
                          rows_per_feature=int(span.max()) + 1, group_lo=group_lo, **CG))
    return cases


def model_tables(device: str, quick: bool) -> list[dict]:
    """The range tables of the UKAN layers of the ``warpkan bench models`` KAN-Mixer and MNIST networks (one
    entry per distinct layer shape)."""
    cases, seen = [], set()
    for model_case in model_cases(device, quick):
        make = model_case.impls.get("warpkan UKANLinear")
        if make is None:
            continue
        for layer in make().modules():
            if not isinstance(layer, UKANLinear):
                continue
            key = (model_case.name, layer.in_features, layer.out_features)
            if key in seen:
                continue
            seen.add(key)
            group_lo = torch.randint(-4, 4, (layer.in_features,), device=device)
            cases.append(dict(case=f"{model_case.name} UKANLinear {layer.in_features}->{layer.out_features}",
                              n_in=layer.in_features, n_out=layer.out_features,
                              rows_per_feature=layer.table_groups + 1, group_lo=group_lo, pe_dim=layer.pe_dim,
                              embed_dim=layer.embed_dim, hidden_dim=layer.hidden_dim))
    return cases


def cg_mlp(case: dict, device: str) -> list[torch.Tensor]:
    """(embedding, w_hidden, b_hidden, w_out, b_out) of the case's CG-MLP, float32, nn.Linear-scaled."""
    torch.manual_seed(1)
    n_feat, hidden = case["pe_dim"] + case["embed_dim"], case["hidden_dim"]
    n_cols = case["n_out"] * (ORDER + 1)

    def uniform(*shape, fan_in):
        return (torch.rand(*shape, device=device) * 2 - 1) / fan_in ** 0.5

    return [torch.randn(case["n_in"], case["embed_dim"], device=device), uniform(hidden, n_feat, fan_in=n_feat),
            uniform(hidden, fan_in=n_feat), uniform(n_cols, hidden, fan_in=hidden), uniform(n_cols, fan_in=hidden)]


def measure(case: dict, device: str, repeat: int) -> dict:
    params = cg_mlp(case, device)
    group_lo, rows, pe_dim = case["group_lo"], case["rows_per_feature"], case["pe_dim"]
    embedding, w_hidden, b_hidden, w_out, b_out = params
    n_table_rows = case["n_in"] * rows
    d_table = torch.randn(n_table_rows, w_out.shape[0], device=device)

    def forward():
        return ukan_ops._range_table_impl(group_lo, rows, pe_dim, *params)

    def forward_backward():
        table, *kept = ukan_ops._range_table_impl(group_lo, rows, pe_dim, *params, keep_rows=True)
        return table, ukan_ops._range_table_backward_impl(d_table, group_lo, pe_dim, embedding, w_hidden, b_hidden,
                                                          w_out, rows=kept)

    row = {"case": case["case"], "table": f"[{n_table_rows}, {w_out.shape[0]}]",
           "CG-MLP (pe, embed, hidden)": f"({pe_dim}, {case['embed_dim']}, {case['hidden_dim']})",
           "tile applies": ku.use_tile_generator(embedding.element_size(), pe_dim, case["embed_dim"], case["hidden_dim"])}
    results = {}
    for name in GENERATORS:
        with generator(name):
            row[f"{name} first call s"] = first_call_s(forward_backward, device)
            row[f"{name} fwd ms"] = time_fn(forward, device, warmup=3, repeat=repeat)
            row[f"{name} fwd+bwd ms"] = time_fn(forward_backward, device, warmup=3, repeat=repeat)
            table, grads = forward_backward()
            results[name] = (table, *grads)
    _compare(row, results)
    return row


def measure_pairs(case: dict, device: str, repeat: int) -> dict:
    """The Warp-native layer's CG-MLP on touched-pair rows (the same (feature, group) rows as the range table,
    sorted by feature as the pair search leaves them), SIMT kernels against the tile generator, as
    ``warpkan.native.ukan.UKANLinear`` runs them (the SIMT forward keeps its rows for the backward; the
    gradients accumulate)."""
    params = [p.contiguous() for p in cg_mlp(case, device)]
    rows, pe_dim, n_in = case["rows_per_feature"], case["pe_dim"], case["n_in"]
    embedding, w_hidden, b_hidden, w_out, b_out = (to_warp(p) for p in params)
    n_pairs, n_cols, hidden = n_in * rows, params[3].shape[0], case["hidden_dim"]
    pair_feature = torch.arange(n_in, device=device, dtype=torch.int32).repeat_interleave(rows)
    pair_group = (case["group_lo"].unsqueeze(1) - 1 + torch.arange(rows, device=device)).reshape(-1)
    rows_needed = torch.tensor([n_pairs], dtype=torch.int32, device=device)
    feature_w, group_w, needed_w = to_warp(pair_feature), to_warp(pair_group), to_warp(rows_needed)
    table = torch.empty(n_pairs, n_cols, device=device)
    d_table = torch.randn(n_pairs, n_cols, device=device)
    table_w, d_table_w = to_warp(table), to_warp(d_table)  # views made once: the host cost is not the subject
    grads = [torch.zeros_like(p) for p in (params[3], params[4], params[1], params[2], params[0])]
    grads_w = [to_warp(g) for g in grads]
    scratch = {name: to_warp(torch.empty(shape, device=device)) for name, shape in (
        ("features", (n_pairs, params[1].shape[1])), ("pre", (n_pairs, hidden)), ("hidden", (n_pairs, hidden)),
        ("d_hidden", (n_pairs, hidden)), ("d_features", (n_pairs, params[1].shape[1])))}
    stream = warp_stream(torch.device(device))

    def forward(tile):
        with on_stream(stream):
            if tile:
                ku.launch_pair_generator_forward(feature_w, group_w, embedding, w_hidden, b_hidden, w_out, b_out,
                                                 table_w, pe_dim)
            else:
                ku.launch_features(feature_w, group_w, embedding, pe_dim, scratch["features"])
                ku.launch_dense_forward(scratch["features"], w_hidden, b_hidden, True, scratch["pre"],
                                        scratch["hidden"])
                ku.launch_dense_forward(scratch["hidden"], w_out, b_out, False, table_w, table_w)

    def forward_backward(tile):
        forward(tile)
        d_w_out, d_b_out, d_w_hidden, d_b_hidden, d_embedding = grads_w
        with on_stream(stream):
            if tile:
                ku.launch_pair_generator_backward(d_table_w, feature_w, group_w, needed_w, embedding, w_hidden,
                                                  b_hidden, w_out, d_w_out, d_b_out, d_w_hidden, d_b_hidden,
                                                  d_embedding, pe_dim)
            else:
                ku.launch_dense_backward(d_table_w, scratch["hidden"], w_out, d_w_out, d_b_out,
                                         d_in=scratch["d_hidden"], pre_in=scratch["pre"], silu_in=True)
                ku.launch_dense_backward(scratch["d_hidden"], scratch["features"], w_hidden, d_w_hidden, d_b_hidden,
                                         d_in=scratch["d_features"])
                ku.launch_embedding_backward(scratch["d_features"], feature_w, needed_w, pe_dim, d_embedding)

    row = {"case": f"{case['case']} (native, pair rows)", "table": f"[{n_pairs}, {n_cols}]",
           "CG-MLP (pe, embed, hidden)": f"({pe_dim}, {case['embed_dim']}, {hidden})",
           "tile applies": ku.use_tile_generator(params[0].element_size(), pe_dim, case["embed_dim"], hidden)}
    results = {}
    for name in GENERATORS:
        tile = name != "simt" and row["tile applies"]
        with generator(name):
            row[f"{name} first call s"] = first_call_s(lambda: forward_backward(tile), device)
            row[f"{name} fwd ms"] = time_fn(lambda: forward(tile), device, warmup=3, repeat=repeat)
            row[f"{name} fwd+bwd ms"] = time_fn(lambda: forward_backward(tile), device, warmup=3, repeat=repeat)
            for g in grads:
                g.zero_()
            forward_backward(tile)
            results[name] = (table.clone(), *(g.clone() for g in grads))
    _compare(row, results)
    return row


def _compare(row: dict, results: dict) -> None:
    for name in GENERATORS[1:]:
        row[f"{name} fwd+bwd speedup"] = row["simt fwd+bwd ms"] / row[f"{name} fwd+bwd ms"]
    row["max rel diff"] = max(
        ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item() if b.numel() else 0.0
        for name in GENERATORS[1:] for a, b in zip(results[name], results["simt"]))


def columns() -> list:
    return ["case", "table", "CG-MLP (pe, embed, hidden)", "tile applies"] + [
        f"{name} {what}" for what in ("first call s", "fwd ms", "fwd+bwd ms") for name in GENERATORS] + [
        f"{name} fwd+bwd speedup" for name in GENERATORS[1:]] + ["max rel diff"]


def markdown(rows: list[dict], device: str) -> str:
    def cell(value):
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    COLUMNS = columns()
    lines = [f"UKAN dense-range CG-MLP generator, SIMT vs tile, on {device} (median ms; speedup = simt / tile; "
             "first call: wall s, the build included when the kernel cache is cold)", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(row[c]) for c in COLUMNS) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for ukan_generator_timing.json and .md")
    parser.add_argument("--quick", action="store_true", help="small shapes, few repeats (runs on the CPU)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-pairs", action="store_true", help="the torch layer's dense range only (not the "
                        "Warp-native layer's touched pairs: two tile modules fewer to build)")
    parser.add_argument("--generators", default=",".join(GENERATORS),
                        help=f"comma-separated paths to time, simt first (default: {','.join(GENERATORS)}); "
                        "without \"tile\", no cuBLASDx module is built")
    parser.add_argument("--target-blocks", type=int, default=0, help="blocks a generator launch is cut into at "
                        "least, splitting the table's columns (default: ku.GENERATOR_TARGET_BLOCKS; 1: no split)")
    args = parser.parse_args()
    if args.target_blocks:
        ku.GENERATOR_TARGET_BLOCKS = args.target_blocks
    chosen = tuple(args.generators.split(","))
    if chosen[0] != "simt" or not set(chosen) <= set(GENERATORS):
        parser.error(f"--generators: simt first, then some of {GENERATORS[1:]}")
    GENERATORS[:] = chosen
    repeat = 3 if args.quick else 50
    rows = []
    for case in bench_tables(args.device, args.quick) + model_tables(args.device, args.quick):
        for measure_case in (measure,) if args.no_pairs else (measure, measure_pairs):
            rows.append(measure_case(case, args.device, repeat))
            print(markdown(rows[-1:], args.device).splitlines()[-1], flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ukan_generator_timing.json"), "w") as f:
        json.dump({"device": args.device, "torch": torch.__version__, "rows": rows}, f, indent=1)
    text = markdown(rows, args.device)
    with open(os.path.join(args.out, "ukan_generator_timing.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
