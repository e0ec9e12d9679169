"""Host time of one KAT-Tiny MLP block (KATMLP, x [25216, 192], hidden 768, bf16 autocast) taken apart, against
the GELU FFN it replaces and an ``autograd.Function`` that only allocates (the floor of any Python node), with the
GPU kept busy (``torch.cuda._sleep``) so that only the host is timed: the forward without and with autograd, and
forward + backward with the backward on autograd's device thread and on the caller's. Also the host cost of the
single ops such a block makes. On the GPU machine:

    python scripts/kat_block_host.py [--rounds 9]
"""
import argparse
import statistics
import time

import torch
from torch.nn import functional as F

from warpkan.torch_bridge import KATMLP, rational_ops

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=9)
args = parser.parse_args()

DEV = "cuda"
N, C, H = 25216, 192, 768


def host_us(fn, calls=20):
    """Median host us of ``fn()`` over the rounds, each of ``calls`` calls queued behind ~100 ms of GPU sleep."""
    out = []
    for _ in range(args.rounds):
        fn()
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out), min(out), max(out)


a = torch.randn(N, H, device=DEV, dtype=torch.bfloat16)
dy = torch.randn(N, C, device=DEV, dtype=torch.bfloat16)
w = torch.randn(C, H, device=DEV)
b = torch.randn(C, device=DEV)
wb = w.bfloat16()
x32 = torch.randn(N, C, device=DEV)
wn, wd = torch.randn(1, 6, device=DEV), torch.randn(8, 4, device=DEV)
OPS = {
    "torch.empty (192, 768) fp32": lambda: torch.empty((C, H), device=DEV),
    "w.to(bf16)": lambda: w.to(torch.bfloat16),
    "torch.mm(dy.t(), a), bf16": lambda: torch.mm(dy.t(), a),
    "torch.mm(dy.t(), a, out_dtype=fp32)": lambda: torch.mm(dy.t(), a, out_dtype=torch.float32),
    "torch.mm(dy, w), bf16": lambda: torch.mm(dy, wb),
    "F.linear(a, w, b), bf16": lambda: F.linear(a, wb, b.bfloat16()),
    "dy.sum(0)": lambda: dy.sum(0),
    "rational forward (_forward_impl, bf16 out)": lambda: rational_ops._forward_impl(
        x32, wn, wd, 8, "A", False, out_dtype=torch.bfloat16),
    "F.gelu(a)": lambda: F.gelu(a),
}
for name, fn in OPS.items():
    print(f"OP {name:45s} {host_us(fn, 50)[0]:7.1f} us", flush=True)

mlp = KATMLP(C, H, num_groups=8, device=DEV)
fc1, fc2 = torch.nn.Linear(C, H, device=DEV), torch.nn.Linear(H, C, device=DEV)
x = torch.randn(N, C, device=DEV, requires_grad=True)
params = [x, *mlp.parameters(), *fc1.parameters(), *fc2.parameters()]


class AllocateOnly(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, *weights):
        ctx.save_for_backward(x, *weights)
        return torch.empty((N, C), device=DEV, dtype=torch.bfloat16)

    @staticmethod
    def backward(ctx, grad):
        return tuple(torch.empty_like(t) for t in ctx.saved_tensors)


def clear():
    for p in params:
        p.grad = None


def kat():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return mlp(x)


def gelu_ffn():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return fc2(F.gelu(fc1(x)))


def allocate_only():
    return AllocateOnly.apply(x, *mlp.parameters())


for name, forward in (("KATMLP", kat), ("GELU FFN", gelu_ffn), ("allocate-only Function", allocate_only)):
    def no_grad(forward=forward):
        with torch.no_grad():
            forward()

    def step(forward=forward):
        forward().backward(dy)
        clear()

    def step_on_caller(forward=forward):
        with torch.autograd.set_multithreading_enabled(False):
            forward().backward(dy)
        clear()

    for label, fn in (("forward, no grad", no_grad), ("forward", forward), ("fwd+bwd", step),
                      ("fwd+bwd, backward on the caller's thread", step_on_caller)):
        m, lo, hi = host_us(fn)
        print(f"HOST {name} {label}: {m:.0f} us ({lo:.0f}-{hi:.0f})", flush=True)
