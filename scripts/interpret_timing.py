"""The two timing targets of warpkan.interpret.

1. ``edge_functions`` on a 256 -> 256 KANLinear (G = 5, k = 3), 1000 points per edge (65.5M values): target under
   1 s on the GPU. Timed on cuda when present (after one warm-up call, which also compiles or loads the
   kernels; CUDA-synchronised; median of --repeats) and on the CPU.
2. A [16, 32, 32, 1] KANLinear network fully plotted to PNG on the CPU (1568 edge panels, opacities from
   importance scores over 1000 samples): target under 20 s. Timed from the call to the written file, after
   one warm-up plot.

    python scripts/interpret_timing.py [--repeats 5] [--out-dir interpret-timing] [--gpu-only]

``--gpu-only`` times the cuda edges alone (for a GPU machine whose Warp has no CPU compiler).
"""

import argparse
import os
import statistics
import time

import torch

from warpkan.interpret import edge_functions, plot_network
from warpkan.torch_bridge import KANLinear


def time_edges(device: torch.device, repeats: int) -> tuple[float, float]:
    torch.manual_seed(0)
    layer = KANLinear(256, 256, grid_size=5, spline_order=3, device=device)

    def once() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        edges = edge_functions(layer, n=1000)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        assert edges.y.shape == (1000, 256, 256)
        return elapsed

    first = once()
    return first, statistics.median(once() for _ in range(repeats))


def time_plot(out_dir: str) -> float:
    torch.manual_seed(0)
    model = torch.nn.Sequential(KANLinear(16, 32), KANLinear(32, 32), KANLinear(32, 1))
    x = torch.rand(1000, 16) * 2 - 1
    path = os.path.join(out_dir, "network_16_32_32_1.png")
    plot_network(model, x, path)  # warm-up (kernel loads)
    start = time.perf_counter()
    plot_network(model, x, path)
    elapsed = time.perf_counter() - start
    print(f"  wrote {path} ({os.path.getsize(path) / 1e6:.1f} MB)")
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out-dir", default="interpret-timing")
    parser.add_argument("--gpu-only", action="store_true", help="skip the CPU timings (edges and the plot)")
    args = parser.parse_args()
    if args.gpu_only and not torch.cuda.is_available():
        parser.error("--gpu-only needs cuda")
    os.makedirs(args.out_dir, exist_ok=True)
    devices = [torch.device("cuda")] if torch.cuda.is_available() else []
    if not args.gpu_only:
        devices.append(torch.device("cpu"))
    for device in devices:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
        first, median = time_edges(device, args.repeats)
        target = " (target: under 1 s on the GPU)" if device.type == "cuda" else ""
        print(f"edge_functions, 256->256 KANLinear, 1000 points per edge, {name}: median {median:.3f} s "
              f"over {args.repeats} calls{target}; first call {first:.3f} s")
    if args.gpu_only:
        return
    seconds = time_plot(args.out_dir)
    print(f"[16, 32, 32, 1] network plotted to PNG on the CPU: {seconds:.2f} s (target: under 20 s)")


if __name__ == "__main__":
    main()
