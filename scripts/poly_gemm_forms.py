"""The three products of the PolyKAN GEMM strategy at small batch, in each orientation cuBLAS offers, fp32
and TF32, against the weight-streaming floor (cuda only):

    python scripts/poly_gemm_forms.py [B in out degree ...]

At (32, 512, 1024, 24) the weight is [in (D + 1), out] = 52 MB in fp32, and each product is a matrix with
one side of 32: a weight-streaming problem. Prints each product's time and achieved bandwidth.
"""

import sys

import torch

from warpkan.bench.timing import time_fn


def main():
    args = [int(a) for a in sys.argv[1:]] or [32, 512, 1024, 24, 64, 256, 512, 15, 128, 40, 256, 8]
    for b, n_in, n_out, degree in zip(*[iter(args)] * 4):
        k = n_in * (degree + 1)
        dense = torch.randn(b, k, device="cuda")
        weight = torch.randn(k, n_out, device="cuda")
        dy = torch.randn(b, n_out, device="cuda")
        weight_bytes = weight.numel() * 4
        copy = time_fn(lambda: weight.clone(), "cuda", warmup=5, repeat=50)
        print(f"== ({b}, {n_in}, {n_out}, {degree}): weight {weight_bytes / 1e6:.1f} MB, clone {copy * 1e3:.1f} us "
              f"({2 * weight_bytes / copy / 1e9:.2f} TB/s)")
        forms = {
            "fwd  dense @ W": lambda: dense @ weight,
            "fwd  (W^T @ dense^T)^T": lambda: (weight.t() @ dense.t()).t(),
            "dW   dense^T @ dy": lambda: dense.t() @ dy,
            "dW   (dy^T @ dense)^T": lambda: (dy.t() @ dense).t(),
            "dB   dy @ W^T": lambda: dy @ weight.t(),
            "dB   (W @ dy^T)^T": lambda: (weight @ dy.t()).t(),
        }
        for tf32 in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            for name, fn in forms.items():
                ms = time_fn(fn, "cuda", warmup=5, repeat=50)
                print(f"  {'tf32' if tf32 else 'fp32'} {name:26s} {ms * 1e3:7.1f} us  "
                      f"{weight_bytes / ms / 1e9:5.2f} TB/s", flush=True)
        torch.backends.cuda.matmul.allow_tf32 = False


if __name__ == "__main__":
    sys.exit(main())
