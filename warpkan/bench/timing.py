"""Timing and memory helpers shared by the benchmark families (torch needed)."""

from __future__ import annotations

import statistics
import time

import torch
import torch._functorch.config

# backward_only replays one recorded graph (retain_graph=True); compiled peers donate their saved buffers by
# default, which forbids that.
torch._functorch.config.donated_buffer = False

__all__ = ["time_fn", "peak_memory", "graphed", "training_step", "backward_only", "flop_rate", "HARDWARE"]

# Ceilings of the H100 / H200 GPUs (measured there with warp-lang 1.19 and torch 2.11 where not the datasheet's):
# used for the roofline columns of CUDA runs only.
HARDWARE = {
    "hbm_bytes_per_s": 4.3e12,  # device-to-device copy, read + write
    "fp32_simt_flops": 60e12,  # H100/H200 SXM fp32 non-tensor peak (datasheet, ~67 TFLOP/s)
    "tf32_flops": 400e12,
    "bf16_flops": 730e12,  # cuBLAS fp16 measured
}


def time_fn(fn, device: str, warmup: int = 3, repeat: int = 20) -> float:
    """Median milliseconds of ``fn()`` after warm-up; CUDA events on cuda, perf_counter on the CPU.
    Compilation happens during warm-up, so it is excluded.

    On cuda the calls run back to back, as in a training loop: each call is bracketed by its own pair of
    events and the host synchronises once, at the end. Where the GPU is the bottleneck the host runs ahead
    and a call's events measure its GPU time; where the host is (a small layer's Python and launch
    overhead), the GPU waits between the events and the measured time is the host's. Either way it is the
    steady-state time per call (as ``triton.testing.do_bench`` measures it), not a cold single call."""
    for _ in range(warmup):
        fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeat)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(start.elapsed_time(end) for start, end in events)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def flop_rate(flops: float, ms: float, device: str, prefix: str = "") -> dict:
    """The column of ``flops`` done in ``ms``: ``{prefix}TFLOP/s`` on CUDA, ``{prefix}GFLOP/s`` on the CPU (whose
    rates would read 0.000826 in TFLOP/s)."""
    if device.startswith("cuda"):
        return {f"{prefix}TFLOP/s": flops / (ms * 1e-3) / 1e12}
    return {f"{prefix}GFLOP/s": flops / (ms * 1e-3) / 1e9}


def peak_memory(fn, device: str) -> float | None:
    """Peak MiB allocated by ``fn()`` above what was allocated before it (cuda only). A step of
    :func:`training_step` frees the last step's gradients before it runs; they are freed here before the
    baseline is taken, or the step's peak would come out short by their size (by the layer's parameter
    gradients and x's: a layer with large parameters would look lighter than one that makes its
    coefficients in the step, such as UKAN)."""
    if not device.startswith("cuda"):
        return None
    clear = getattr(fn, "clear_gradients", None)
    if clear is not None:
        clear()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def graphed(fn, warmup: int = 3):
    """``fn()`` captured once in a CUDA graph (:func:`warpkan.torch_bridge.capture_step`: warm-up calls on a
    side stream first, so lazy initialisation, compilation and the caching allocator's blocks stay out of the
    capture); returns the replay (time it with :func:`time_fn`). The replay removes the host's launch and
    Python overhead: the difference from the eager time is that overhead. ``fn`` runs its own autograd calls,
    if any (a captured ``loss.backward()`` accumulates into the ``.grad`` tensors on every replay)."""
    from ..torch_bridge import capture_step

    return capture_step(fn, warmup)


def training_step(model, x: torch.Tensor, dy: torch.Tensor):
    """``model(x).backward(dy)`` as a training loop runs it: the gradients are cleared first, as
    ``optimizer.zero_grad()`` does (it sets them to None), so the backward writes them rather than adding
    into the last step's. Without that, every timed step after the first pays a read-add-write of each
    gradient that no training loop pays: for PolyKAN's 52 MB weight at (32, 512, 1024, 24), about 40 us on
    the GPU machine, half its step. Under CUDA-graph capture the clearing runs once, at capture, and each
    replay writes the gradients again. The same step is timed for every implementation of a case."""
    params = list(model.parameters())

    def clear_gradients():
        for p in params:
            p.grad = None
        x.grad = None

    def step():
        clear_gradients()
        model(x).backward(dy)

    step.clear_gradients = clear_gradients  # for peak_memory's baseline
    return step


def backward_only(fn, inputs: list, dy: torch.Tensor, params=None):
    """The backward pass alone, to time with :func:`time_fn`: ``fn(*inputs)`` runs once here, and each call
    of the returned function replays its graph (``torch.autograd.grad(y, ..., retain_graph=True)``) for the
    inputs that require grad and ``params`` (default: ``fn``'s parameters when it is a module), writing fresh
    gradients as a step after ``zero_grad()`` does. The forward is not in the timing, so the backward's time
    is measured, not taken as the difference of two separately timed medians (which can come out negative
    where the host's time varies)."""
    y = fn(*inputs)
    if params is None:
        params = fn.parameters() if isinstance(fn, torch.nn.Module) else ()
    wrt = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    wrt += [p for p in params if p.requires_grad]

    def backward():
        torch.autograd.grad(y, wrt, dy, retain_graph=True)

    return backward
