"""Host-side cost per UKANLinear forward+backward on the CPU with small shapes (time.perf_counter, many
repeats; the median of several rounds). On the CPU device every kernel runs synchronously, so this is the
Python + launch overhead plus tiny CPU kernels; it is the floor a small layer pays per call on any device."""

import statistics
import sys
import time

import torch

from warpkan.torch_bridge import KANLinear, UKANLinear


def per_call_us(layer, x, repeats=200, rounds=5):
    for _ in range(10):
        layer(x).sum().backward()
    results = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            layer(x).sum().backward()
        results.append((time.perf_counter() - start) / repeats * 1e6)
    return statistics.median(results)


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    for n, n_in, n_out in [(8, 4, 4), (64, 8, 8)]:
        x = torch.rand(n, n_in) * 2 - 1
        ukan = UKANLinear(n_in, n_out, grid_delta=1 / 16)
        kan = KANLinear(n_in, n_out, grid_size=32, grid_range=(-1, 1))
        print(f"N={n} {n_in}->{n_out}: UKANLinear {per_call_us(ukan, x):.0f} us, "
              f"KANLinear {per_call_us(kan, x):.0f} us per forward+backward", flush=True)


if __name__ == "__main__":
    sys.exit(main())
