"""The bf16 dense-basis kernels of the gemm strategy, one row a thread against two rows a thread (the pair
kernels of ``warpkan/kernels/edge/dense.py``, switched by ``launch.BF16_ROW_PAIRS``), side by side on the same
buffers: the expansion (``expand_basis``) and the contraction of the basis gradient into dx
(``contract_basis_grad``), with a Warp memset of the basis as the store bound.

Why: in the KAN-Mixer's graphed bf16 step the one-row expansions ran at 0.5-1.0 TB/s, where a store-only
kernel of the same thread map reaches 3.7 TB/s (``docs/perf-notes-engine.md``). The one-row kernel spends about
20 instructions on each stored 2-byte entry (the slot's compare-selects, the bf16 conversion, Warp's index
wrap, a 64-bit address multiply-add and the store): it is bound by instruction issue. Two rows a thread share
the index and address work, and store (load) a bf16 pair as one uint32.

The two-row contraction reads every coefficient row of a pair where the one-row kernel reads each row's window
of K, so the library takes it only for tables of at most ``PAIR_CONTRACT_COEF_PER_BASIS * K`` coefficients;
here it is forced at every grid (the longer grids are the measurement behind that rule).

Both paths must give the same bits (checked before timing). Times are CUDA events around ``--repeat`` replays of
recorded launches (as the torch bridge makes them) after a warm-up (compilation excluded), in us, with the bytes
of the basis a second.

    python scripts/expand_bf16_probe.py [--device cuda] [--repeat 50]

On the CPU it only checks the two paths agree (a smoke test, not a measurement).
"""

import argparse
import time

import numpy as np
import warp as wp

import torch

from warpkan.kernels.edge import launch as edge_launch
from warpkan.kernels.edge.dense import dense_width
from warpkan.torch_bridge import KANLinear, PolyKANLinear
from warpkan.torch_bridge._common import to_warp
from native_wide_timing import _timer  # CUDA events on Warp's stream (this script's folder is on sys.path)

# (rows, in, layer): the KAN-Mixer's token-mixing layers (batch 128 x dim 256 rows; 64 -> 256 and 256 -> 64)
# and the create_graph microbenchmark's shape of the perf notes at G = 5, k = 3; longer grids for the
# contraction's rule; a Chebyshev layer of degree 8 (its window is its whole table)
LAYERS = {"bspline G=5": lambda n_in: KANLinear(n_in, 1, grid_size=5, spline_order=3),
          "bspline G=10": lambda n_in: KANLinear(n_in, 1, grid_size=10, spline_order=3),
          "bspline G=29": lambda n_in: KANLinear(n_in, 1, grid_size=29, spline_order=3),
          "chebyshev degree 8": lambda n_in: PolyKANLinear(n_in, 1, 8, mode="exact"),
          "bspline G=4": lambda n_in: KANLinear(n_in, 1, grid_size=4, spline_order=3),
          "bspline G=12 k=2": lambda n_in: KANLinear(n_in, 1, grid_size=12, spline_order=2)}
CASES = [(32768, 256, "bspline G=5"), (32768, 64, "bspline G=5"), (65536, 32, "bspline G=5"),
         (32768, 64, "bspline G=10"), (32768, 64, "bspline G=29"), (32768, 64, "chebyshev degree 8"),
         (32768, 256, "chebyshev degree 8")]
QUICK_CASES = [(64, 8, "bspline G=5"), (130, 5, "bspline G=4"), (66, 3, "bspline G=12 k=2"),
               (34, 4, "chebyshev degree 8")]


def measure(case, device, repeat):
    n_rows, n_in, layer_name = case
    rng = np.random.default_rng(0)
    x_torch = torch.tensor(rng.uniform(-1.2, 1.2, (n_rows, n_in)).astype(np.float32))  # some out of range
    spec = LAYERS[layer_name](n_in).edge_view(x_torch).spec
    family, n_coef, use_base = spec.family, spec.n_coef, spec.use_base
    frame_tensors = [t.to(device) for t in spec.frame_tensors]  # alive while the frame points at them
    frame = spec.make_frame(*(to_warp(t) for t in frame_tensors), *spec.frame_config)
    width = dense_width(n_in, n_coef, use_base)
    x = wp.array(x_torch.numpy(), device=device)
    basis = {pairs: wp.empty((width, n_rows), dtype=wp.bfloat16, device=device) for pairs in (False, True)}
    dx = {pairs: wp.empty((n_rows, n_in), dtype=wp.float32, device=device) for pairs in (False, True)}
    # a basis gradient (bf16, as the backward's dA GEMM writes it): finite values in +-[0.5, 1)
    grad_bits = rng.integers(0, 2**16, (width, n_rows), dtype=np.uint16)
    grad_bits = ((grad_bits & 0x807F) | 0x3F00).astype(np.uint16)
    d_basis_bits = wp.array(grad_bits, dtype=wp.uint16, device=device)
    d_basis = wp.array(ptr=d_basis_bits.ptr, dtype=wp.bfloat16, shape=(width, n_rows), device=device)

    def expand(pairs, record=False):
        edge_launch.BF16_ROW_PAIRS = pairs
        return edge_launch.launch_expand_basis(family, frame, x, n_coef, basis[pairs], use_base=use_base,
                                               record=record)

    def contract(pairs, record=False):
        edge_launch.BF16_ROW_PAIRS = pairs
        return edge_launch.launch_contract_basis_grad(family, frame, x, n_coef, d_basis, dx[pairs],
                                                      use_base=use_base, record=record)

    def replay(cmds):  # a recorded launch, as the torch bridge replays them: the host's part is a few us
        return lambda: [cmd.launch() for cmd in cmds]

    def bits(array):  # the raw bf16 bits (numpy has no bfloat16)
        return wp.array(ptr=array.ptr, dtype=wp.uint16, shape=array.shape, device=device).numpy()

    rule = edge_launch.PAIR_CONTRACT_COEF_PER_BASIS
    edge_launch.PAIR_CONTRACT_COEF_PER_BASIS = 10**9  # the two-row contraction at every grid
    try:
        for pairs in (False, True):
            expand(pairs)
            contract(pairs)
        wp.synchronize_device(device)
        row = {"case": f"{layer_name} ({n_rows}, {n_in}), {n_coef} coefficients{' + base' if use_base else ''}, "
                       f"basis [{width}, {n_rows}] bf16",
               "library takes the two-row contraction": n_coef <= rule * family.n_bases,
               "expansions equal": bool(np.array_equal(bits(basis[False]), bits(basis[True]))),
               "contractions equal": bool(np.array_equal(dx[False].numpy(), dx[True].numpy()))}
        if not (row["expansions equal"] and row["contractions equal"]):
            raise SystemExit(f"the two-row kernels differ from the one-row ones: {row}")
        if wp.get_device(device).is_cuda:
            timer = _timer(device)  # ms
            mbytes = width * n_rows * 2 / 1e6
            # recorded launches: a direct launch's host time (and the two-row one's uint32 view, made each call)
            # would bound the smaller cases' times instead of the kernels
            for name, fn in (("expand one row", replay(expand(False, True))),
                             ("expand two rows", replay(expand(True, True))),
                             ("memset (store bound)", lambda: basis[False].zero_()),
                             ("contract one row", replay(contract(False, True))),
                             ("contract two rows", replay(contract(True, True)))):
                us = timer(fn, 3, repeat) * 1e3
                row[f"{name} us"] = round(us, 2)
                row[f"{name} TB/s"] = round(mbytes / us, 3)  # the basis (or its gradient) once, MB per us
    finally:
        edge_launch.PAIR_CONTRACT_COEF_PER_BASIS = rule
        edge_launch.BF16_ROW_PAIRS = True
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
