"""Warp's console output: hidden by default (``import warpkan``, the torch bridge, the command line), shown with
WARPKAN_VERBOSE=1 or ``--verbose``. Each case is a fresh process, since Warp prints its banner once per process."""

import subprocess
import sys

import pytest
import warp as wp

BANNER = f"Warp {wp.config.version} initialized"
NO_DRIVER = "Could not find or load the NVIDIA CUDA driver"

NATIVE = """
import numpy as np, warp as wp, warpkan
layer = warpkan.KANLinear(2, 3, grid_size=4, device="cpu")
y = layer(wp.array(np.random.rand(8, 2).astype(np.float32), device="cpu"))
print("result", y.shape)
"""
TORCH = """
import torch
from warpkan.torch_bridge import KANLinear
print("result", tuple(KANLinear(2, 3, grid_size=4)(torch.rand(8, 2)).shape))
"""


def _run(args, env, timeout=600):
    done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, done.stderr


@pytest.mark.parametrize("code", [NATIVE, TORCH], ids=["native", "torch"])
def test_layers_are_quiet_by_default(child_env, code):
    out, err = _run(["-c", code], child_env(WARPKAN_VERBOSE=None))
    assert out.splitlines() == [line for line in out.splitlines() if line.startswith("result")] and "result" in out, out
    assert err == "", err  # no banner, no module-load lines, no no-driver warning


@pytest.mark.parametrize("code", [NATIVE, TORCH], ids=["native", "torch"])
def test_warpkan_verbose_shows_warps_output(child_env, code):
    out, err = _run(["-c", code], child_env(WARPKAN_VERBOSE="1"))
    assert BANNER in out
    assert "Module warpkan_edge_bspline_uniform_k3_float32" in out and " took " in out
    if not wp.is_cuda_available():  # Warp's native library says so on a machine without a driver
        assert NO_DRIVER in err


def test_a_programs_own_log_level_is_kept(child_env):
    code = "import warp as wp; wp.config.log_level = wp.LOG_DEBUG; import warpkan; print(wp.config.log_level)"
    out, _ = _run(["-c", code], child_env(WARPKAN_VERBOSE=None))
    assert out.split() == [str(wp.LOG_DEBUG)]


def test_command_line_is_quiet_unless_verbose(child_env):
    command = ["-m", "warpkan.cli", "precompile", "--device", "cpu", "--family", "bspline", "--orders", "3",
               "--uniform-only"]
    out, err = _run(command, child_env(WARPKAN_VERBOSE=None))
    assert "warpkan_edge_bspline_uniform_k3_float32 " in out  # the command's own lines
    assert BANNER not in out and "Module " not in out and err == "", out + err
    out, err = _run(command + ["--verbose"], child_env(WARPKAN_VERBOSE=None))
    assert BANNER in out and "Module warpkan_edge_bspline_uniform_k3_float32" in out
