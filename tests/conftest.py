import os

import pytest
import warp as wp

wp.config.quiet = True
wp.init()


def _devices():
    devices = ["cpu"]
    if wp.is_cuda_available():
        devices.append("cuda")
    only = os.environ.get("WARPKAN_TEST_DEVICES")
    if only:
        devices = [d for d in devices if d in only.split(",")]
    return devices


DEVICES = _devices()


@pytest.fixture(params=DEVICES)
def device(request):
    """Each test that takes ``device`` runs on Warp's CPU device and, when present, on cuda."""
    return request.param


@pytest.fixture
def eager_step_ops():
    """``ops(layer, x, dy)``: the names torch.profiler records (aten ops, autograd nodes) on the CPU for one
    eager training step ``layer(x).backward(dy)``, taken after a warm-up step and with the gradients
    cleared, as ``zero_grad()`` leaves them. The host-cost tests read what a step runs from it."""
    import torch

    def ops(layer, x, dy):
        layer(x).backward(dy)  # compile and record first
        for t in (x, *layer.parameters()):
            t.grad = None
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            layer(x).backward(dy)
        return {event.key for event in prof.key_averages()}

    return ops
