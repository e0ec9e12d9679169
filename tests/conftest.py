import os
from pathlib import Path

import pytest
import warp as wp

from warpkan._warp_output import start_warp

start_warp()

REPO_ROOT = Path(__file__).resolve().parents[1]


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


@pytest.fixture
def child_env():
    """``child_env(**variables)``: this process's environment for a child Python, with the repository root
    first on PYTHONPATH (so the child imports this checkout's warpkan, installed or not), and the given
    variables set (a value of None removes the variable)."""

    def make(**variables):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        for name, value in variables.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env

    return make

