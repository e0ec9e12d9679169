"""The bf16 dense-basis expansion (the gemm strategy's ``expand_basis`` under bf16 autocast) against a variant
that writes two rows of x per thread as one 4-byte store, and the bf16 contraction of the basis gradient into
dx (``contract_basis_grad``, which gathers each row's K-entry window with 2-byte loads) against a variant that
reads every coefficient row of two rows of x as 4-byte loads, side by side on the same buffers: an A/B for
the question of whether the shipped kernels are bound by their instruction issue rather than by memory.

Why: in the KAN-Mixer's graphed bf16 step the expansions ran at 0.5-1.0 TB/s, where a store-only kernel of the
same thread map reaches 3.7 TB/s (``docs/perf-notes-engine.md``). The shipped kernel's PTX spends about 20
instructions on each stored entry (the slot's compare-selects, the bf16 conversion, Warp's negative-index wrap,
a 64-bit address multiply-add and a 2-byte store), so in bf16 each instruction moves half the bytes it moves in
fp32. The variant shares the index and address work between two rows and stores a bf16 pair as one uint32.

Both expansions evaluate each entry with the family's own ``@wp.func``s, so the variant's basis must equal the
shipped one bit for bit; the contractions add the same products in the same order (the variant adds exact
zeros besides, over finite data here). The script checks both before timing. Times are CUDA events around ``--repeat``
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
from warpkan.kernels.edge.dense import basis_entry, dense_dim, dense_entry, dense_width
from warpkan.kernels.edge.launch import launch_contract_basis_grad, launch_expand_basis
from native_wide_timing import _timer  # CUDA events on Warp's stream (this script's folder is on sys.path)

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
    """The expansion (order 0, no scale) with rows 2p and 2p + 1 of input i in thread (p, i), the pairs mapped
    to threads as the shipped kernels map rows (``dense_entry``): each entry of the two rows one uint32 store of a
    bf16 pair."""
    scalar, first = family.scalar, family.first
    values = edge_values(family)
    bases_at, silu_order = values.bases_at, values.silu_order
    entry = basis_entry(family)

    @wp.kernel(enable_backward=False, module=f"warpkan_probe_expand_pairs_{family.key}")
    def expand_pairs(x: wp.array2d(dtype=scalar), frame: family.Frame, use_base: int, n_coef: int,
                     basis2: wp.array2d(dtype=wp.uint32)):
        n_in = x.shape[1]
        p, i = dense_entry(wp.tid(), n_in)  # the shipped kernels' thread map, over pairs of rows
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


def contract_pair_kernel(family):
    """dx of two rows of input i a thread (first order, no scale): every coefficient row of the bf16 basis
    gradient read as one uint32 (rows 2p and 2p + 1), each times the slot's dB/dx or zero."""
    scalar, first = family.scalar, family.first
    values = edge_values(family)
    bases_dx_at, silu_order = values.bases_dx_at, values.silu_order
    entry = basis_entry(family)

    @wp.kernel(enable_backward=False, module=f"warpkan_probe_contract_pairs_{family.key}")
    def contract_pairs(x: wp.array2d(dtype=scalar), frame: family.Frame, use_base: int, n_coef: int,
                       d_basis2: wp.array2d(dtype=wp.uint32), dx: wp.array2d(dtype=scalar)):
        n_in = x.shape[1]
        p, i = dense_entry(wp.tid(), n_in)  # the shipped kernels' thread map, over pairs of rows
        n0 = 2 * p
        if n0 >= x.shape[0]:
            return
        x0 = x[n0, i]
        x1 = x[n0 + 1, i]
        acc0 = scalar(0.0)
        acc1 = scalar(0.0)
        row = i * n_coef
        if use_base:
            pair = wp.cast(d_basis2[i, p], Bf16Pair)
            acc0 = scalar(pair.lo) * silu_order(x0, 1)
            acc1 = scalar(pair.hi) * silu_order(x1, 1)
            row = row + n_in
        valid0, slot0, b0, db0 = bases_dx_at(frame, n0, i, x0)
        valid1, slot1, b1, db1 = bases_dx_at(frame, n0 + 1, i, x1)
        start0 = slot0 + first
        start1 = slot1 + first
        for j in range(n_coef):
            pair = wp.cast(d_basis2[row + j, p], Bf16Pair)
            acc0 = acc0 + entry(db0, j - start0) * scalar(pair.lo)
            acc1 = acc1 + entry(db1, j - start1) * scalar(pair.hi)
        dx[n0, i] = acc0
        dx[n0 + 1, i] = acc1

    return contract_pairs


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
    kernel, contract_kernel = pair_kernel(family), contract_pair_kernel(family)
    n_pairs = n_rows // 2
    pair_dim = dense_dim(n_pairs, n_in)
    # a basis gradient (bf16, as the backward's dA GEMM writes it) and the two contractions' dx
    grad_bits = rng.integers(0, 2**16, (width, n_rows), dtype=np.uint16)
    grad_bits = ((grad_bits & 0x807F) | 0x3F00).astype(np.uint16)  # finite values in +-[0.5, 1)
    d_basis = wp.array(grad_bits, dtype=wp.uint16, device=device)
    d_basis_bf16 = wp.array(ptr=d_basis.ptr, dtype=wp.bfloat16, shape=(width, n_rows), device=device)
    d_basis_u32 = wp.array(ptr=d_basis.ptr, dtype=wp.uint32, shape=(width, n_pairs), device=device)
    dx_shipped = wp.empty((n_rows, n_in), dtype=wp.float32, device=device)
    dx_pairs = wp.empty((n_rows, n_in), dtype=wp.float32, device=device)

    def run_shipped():
        launch_expand_basis(family, frame, x, n_coef, shipped, use_base=True)

    def run_pairs():
        wp.launch(kernel, dim=pair_dim, inputs=[x, frame, 1, n_coef, paired_u32], device=device)

    def run_contract_shipped():
        launch_contract_basis_grad(family, frame, x, n_coef, d_basis_bf16, dx_shipped, use_base=True)

    def run_contract_pairs():
        wp.launch(contract_kernel, dim=pair_dim, inputs=[x, frame, 1, n_coef, d_basis_u32, dx_pairs], device=device)

    for fn in (run_shipped, run_pairs, run_contract_shipped, run_contract_pairs):
        fn()
    wp.synchronize_device(device)
    def bits(basis):  # the raw bf16 bits (numpy has no bfloat16)
        return wp.array(ptr=basis.ptr, dtype=wp.uint16, shape=basis.shape, device=device).numpy()

    a, b = bits(shipped), bits(paired)
    row = {"case": f"({n_rows}, {n_in}), {n_coef} coefficients + base, basis [{width}, {n_rows}] bf16",
           "bitwise equal": bool(np.array_equal(a, b))}
    dx_a, dx_b = dx_shipped.numpy(), dx_pairs.numpy()
    row["contract max rel diff"] = float(np.abs(dx_a - dx_b).max() / max(np.abs(dx_a).max(), 1e-30))
    if not row["bitwise equal"] or row["contract max rel diff"] > 1e-6:
        raise SystemExit(f"a paired kernel differs from the shipped one: {row}")
    if wp.get_device(device).is_cuda:
        timer = _timer(device)  # ms
        mbytes = width * n_rows * 2 / 1e6
        for name, fn in (("expand shipped", run_shipped), ("expand two rows a thread", run_pairs),
                         ("memset (store bound)", lambda: shipped.zero_()),
                         ("contract shipped", run_contract_shipped), ("contract two rows a thread", run_contract_pairs)):
            us = timer(fn, 3, repeat) * 1e3
            row[f"{name} us"] = us
            row[f"{name} TB/s"] = mbytes / us  # the basis (or its gradient) once, MB per us
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
