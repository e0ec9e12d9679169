"""Which edge strategy wins on the CPU: fwd+bwd step times (ms) of the stencil and gemm strategies of
KANLinear (B-spline) and PolyKANLinear at a handful of shapes, next to what ``strategy="auto"`` picks there.
UKANLinear has no strategy choice (its spline always runs the stencil kernels), so it is not in the table.

The two strategies of a shape are timed in alternating rounds and each keeps its best round's median: on a
shared machine a burst of load then slows one round of each, not one strategy. With ``--threads 1`` the clock
is the process's CPU time (``time.process_time``), which the time spent waiting for a busy core does not
inflate: the Warp CPU kernels run on one thread, so a single-threaded torch compares the strategies core for
core (more threads speed up the gemm strategy's GEMMs alone).

    python scripts/cpu_strategy.py [--family poly bspline] [--rounds 5] [--repeat 5] [--threads N]
"""

import argparse
import statistics
import time

import torch

from warpkan.torch_bridge import KANLinear, PolyKANLinear, bspline_ops, poly_ops

# (rows, in, out, degree or grid size)
POLY_CASES = [(16, 8, 8, 3), (64, 16, 32, 8), (256, 32, 32, 4), (1024, 32, 64, 8), (128, 40, 256, 8),
              (4096, 64, 64, 3), (256, 128, 128, 15), (64, 256, 512, 15)]
BSPLINE_CASES = [(64, 16, 32, 5), (1024, 32, 64, 5), (4096, 64, 64, 5), (1024, 32, 32, 16), (1024, 32, 32, 20),
                 (1024, 32, 32, 24), (1024, 32, 32, 28), (1024, 32, 32, 32), (1024, 32, 32, 45), (1024, 32, 32, 64),
                 (64, 16, 16, 24), (64, 16, 16, 32), (256, 64, 64, 24), (256, 64, 64, 32), (256, 64, 64, 100),
                 (64, 16, 16, 200)]


def poly_layer(case, strategy, mode):
    _, n_in, n_out, degree = case
    return PolyKANLinear(n_in, n_out, degree, mode=mode, strategy=strategy)


def bspline_layer(case, strategy):
    _, n_in, n_out, grid_size = case
    return KANLinear(n_in, n_out, grid_size=grid_size, strategy=strategy)


def step_fn(layer, n_rows):
    torch.manual_seed(0)
    x = torch.randn(n_rows, layer.in_features, requires_grad=True)
    dy = torch.randn(n_rows, layer.out_features)

    def step():
        layer(x).backward(dy)

    step()  # compiles the kernels
    return step


def median_ms(step, repeat, clock):
    times = []
    for _ in range(repeat):
        start = clock()
        step()
        times.append((clock() - start) * 1e3)
    return statistics.median(times)


def best_ms(steps, rounds, repeat):
    """Each step's best median over ``rounds`` alternating rounds (CPU time when single-threaded)."""
    clock = time.process_time if torch.get_num_threads() == 1 else time.perf_counter
    best = [float("inf")] * len(steps)
    for _ in range(rounds):
        for i, step in enumerate(steps):
            best[i] = min(best[i], median_ms(step, repeat, clock))
    return best


def table(title, cases, make, auto_of, rounds, repeat):
    print(f"\n{title}\n| rows | in | out | D/G | stencil ms | gemm ms | faster | auto picks |")
    print("|---:|---:|---:|---:|---:|---:|:---|:---|")
    for case in cases:
        stencil, gemm = best_ms([step_fn(make(case, s), case[0]) for s in ("stencil", "gemm")], rounds, repeat)
        faster = "gemm" if gemm < stencil else "stencil"
        ratio = max(stencil, gemm) / min(stencil, gemm)
        print(f"| {' | '.join(map(str, case))} | {stencil:.3f} | {gemm:.3f} | {faster} ({ratio:.1f}x) | {auto_of(case)} |",
              flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", nargs="+", choices=("poly", "bspline"), default=("poly", "bspline"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = "CPU" if torch.get_num_threads() == 1 else "wall"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), float32, fwd+bwd {clock} ms (best of "
          f"{args.rounds} alternating rounds of {args.repeat} steps' median)")
    for mode in ("lut", "exact") if "poly" in args.family else ():
        table(f"PolyKANLinear (chebyshev, mode={mode!r})", POLY_CASES, lambda c, s: poly_layer(c, s, mode),
              lambda c: poly_ops.AUTO_STRATEGY, args.rounds, args.repeat)
    if "bspline" in args.family:
        table("KANLinear (spline_order=3, SiLU base)", BSPLINE_CASES, bspline_layer,
              lambda c: bspline_ops.choose_strategy(c[0], c[1], c[2], c[3] + 3, tiled_stencil=False), args.rounds,
              args.repeat)


if __name__ == "__main__":
    main()
