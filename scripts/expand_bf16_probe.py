"""The bf16 dense-basis expansion (the gemm strategy's ``expand_basis`` under bf16 autocast) against a variant
that writes two rows of x per thread as one 4-byte store, side by side on the same buffers: an A/B for the
question of whether the shipped kernel is bound by its instruction issue rather than by memory.

Why: in the KAN-Mixer's graphed bf16 step the expansions ran at 0.5-1.0 TB/s, where a store-only kernel of the
same thread map reaches 3.7 TB/s (``docs/perf-notes-engine.md``). The shipped kernel's PTX spends about 20
instructions on each stored entry (the slot's compare-selects, the bf16 conversion, Warp's negative-index wrap,
a 64-bit address multiply-add and a 2-byte store), so in bf16 each instruction moves half the bytes it moves in
fp32. The variant shares the index and address work between two rows and stores a bf16 pair as one uint32.

Both kernels evaluate each entry with the family's own ``@wp.func``s, so the variant's basis must equal the
shipped one bit for bit: the script checks that before timing. Times are CUDA events around ``--repeat``
launches after a warm-up (compilation excluded), in us, with the bytes written a second; a Warp memset of the
same buffer is the store bound.

    python scripts/expand_bf16_probe.py [--device cuda] [--repeat 50]

On the CPU it only checks the variant (a smoke test, not a measurement).
"""

import argparse
import time

import numpy as np
import warp as wp

import warpkan
from warpkan.kernels import bspline as kb
from warpkan.kernels.edge._values import edge_values
from warpkan.kernels.edge.dense import ROW_TILE, basis_entry, dense_width
from warpkan.kernels.edge.launch import launch_expand_basis

# (rows, in, grid size): the KAN-Mixer's token-mixing layers (batch 128 x dim 256 rows; 64 -> 256 and
# 256 -> 64), and the create_graph microbenchmark's shape of the perf notes
CASES = [(32768, 256, 5), (32768, 64, 5), (65536, 32, 5)]
QUICK_CASES = [(64, 8, 5), (130, 5, 4)]
ORDER = 3


@wp.struct
class Bf16Pair:
    lo: wp.bfloat16
    hi: wp.bfloat16


def pair_kernel(family):
    """The expansion (order 0, no scale) with rows 2p and 2p + 1 of input i in thread (p, i), ``ROW_TILE``
    consecutive pairs of one input a warp: each entry of the two rows one uint32 store of a bf16 pair."""
    scalar, first = family.scalar, family.first
    values = edge_values(family)
    bases_at, silu_order = values.bases_at, values.silu_order
    entry = basis_entry(family)

    @wp.kernel(enable_backward=False, module=f"warpkan_probe_expand_pairs_{family.key}")
    def expand_pairs(x: wp.array2d(dtype=scalar), frame: family.Frame, use_base: int, n_coef: int,
                     basis2: wp.array2d(dtype=wp.uint32)):
        n_in = x.shape[1]
        tile_size = ROW_TILE * n_in
        tid = wp.tid()
        tile = tid // tile_size
        rest = tid - tile * tile_size
        i = rest // ROW_TILE
        p = tile * ROW_TILE + rest - i * ROW_TILE
        n0 = 2 * p
        if n0 >= x.shape[0]:
            return
        x0 = x[n0, i]
        x1 = x[n0 + 1, i]  # the rows are even in number (checked by the caller)
        row = i * n_coef
        pair = Bf16Pair()
        if use_base:
            pair.lo = wp.bfloat16(silu_order(x0, 0))
            pair.hi = wp.bfloat16(silu_order(x1, 0))
            basis2[i, p] = wp.cast(pair, wp.uint32)
            row = row + n_in
        valid0, slot0, b0 = bases_at(frame, n0, i, x0)
        valid1, slot1, b1 = bases_at(frame, n0 + 1, i, x1)
        start0 = slot0 + first
        start1 = slot1 + first
        for j in range(n_coef):
            pair.lo = wp.bfloat16(entry(b0, j - start0))
            pair.hi = wp.bfloat16(entry(b1, j - start1))
            basis2[row + j, p] = wp.cast(pair, wp.uint32)

    return expand_pairs


def _timer(device):
    def run(fn, warmup, repeat):
        for _ in range(warmup):
            fn()
        wp.synchronize_device(device)
        start, stop = wp.Event(device, enable_timing=True), wp.Event(device, enable_timing=True)
        wp.record_event(start)
        for _ in range(repeat):
            fn()
        wp.record_event(stop)
        wp.synchronize_event(stop)
        return wp.get_event_elapsed_time(start, stop) / repeat * 1e3  # us

    return run


def measure(case, device, repeat):
    n_rows, n_in, grid_size = case
    layer = warpkan.KANLinear(n_in, 1, grid_size=grid_size, spline_order=ORDER, device=device)
    family = kb.family_of(ORDER, True, "float32")
    frame = kb.frame_of(layer.grid)
    n_coef = grid_size + ORDER
    width = dense_width(n_in, n_coef, True)
    rng = np.random.default_rng(0)
    x = wp.array(rng.uniform(-1.2, 1.2, (n_rows, n_in)).astype(np.float32), device=device)  # some out of range
    shipped = wp.empty((width, n_rows), dtype=wp.bfloat16, device=device)
    paired = wp.empty((width, n_rows), dtype=wp.bfloat16, device=device)
    paired_u32 = wp.array(ptr=paired.ptr, dtype=wp.uint32, shape=(width, n_rows // 2), device=device)
    kernel = pair_kernel(family)
    n_pairs = n_rows // 2
    pair_dim = -(-n_pairs // ROW_TILE) * ROW_TILE * n_in

    def run_shipped():
        launch_expand_basis(family, frame, x, n_coef, shipped, use_base=True)

    def run_pairs():
        wp.launch(kernel, dim=pair_dim, inputs=[x, frame, 1, n_coef, paired_u32], device=device)

    run_shipped()
    run_pairs()
    wp.synchronize_device(device)
    def bits(basis):  # the raw bf16 bits (numpy has no bfloat16)
        return wp.array(ptr=basis.ptr, dtype=wp.uint16, shape=basis.shape, device=device).numpy()

    a, b = bits(shipped), bits(paired)
    row = {"case": f"({n_rows}, {n_in}), {n_coef} coefficients + base, basis [{width}, {n_rows}] bf16",
           "bitwise equal": bool(np.array_equal(a, b))}
    if not row["bitwise equal"]:
        raise SystemExit(f"the paired expansion differs from the shipped one: {row['case']}")
    if wp.get_device(device).is_cuda:
        timer = _timer(device)
        mbytes = width * n_rows * 2 / 1e6
        for name, fn in (("shipped", run_shipped), ("two rows a thread", run_pairs),
                         ("memset (store bound)", lambda: shipped.zero_())):
            us = timer(fn, 3, repeat)
            row[f"{name} us"] = us
            row[f"{name} TB/s"] = mbytes / us  # MB per us
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="Warp device (default: cuda when present, else cpu)")
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    wp.init()
    device = args.device or ("cuda" if wp.is_cuda_available() else "cpu")
    cases = CASES if wp.get_device(device).is_cuda else QUICK_CASES
    t0 = time.perf_counter()
    for case in cases:
        print(measure(case, device, args.repeat), flush=True)
    print(f"done in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
