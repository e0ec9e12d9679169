import os
from pathlib import Path

import pytest
import warp as wp

from warpkan._warp_output import start_warp

# pyproject's addopts run the suite on pytest-xdist workers (`-n auto`), one a CPU up to MAX_WORKERS: each
# worker is a whole process (its own torch, Warp runtime, CUDA context and loaded kernels; up to 1.5 GB on the
# CPU). PYTEST_XDIST_AUTO_NUM_WORKERS or `-n N` sets the count; `-n 0` runs the tests in this process.
MAX_WORKERS = 8


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# The workers share Warp's kernel cache: Warp builds a module in a folder named by its process and thread and
# renames it into place (warp/_src/context.py, Module._compile), so two workers compiling one module at once
# both succeed and the cache keeps one copy.


def pytest_xdist_auto_num_workers(config):
    # xdist's own rule counts physical cores where psutil is installed: 1 on a 2-vCPU machine whose vCPUs are
    # hyperthreads of one core. The CPUs this process may run on are what the workers share.
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's rule reads it
    return min(_cpus(), MAX_WORKERS)


def _share_the_cpus_between_workers() -> None:
    """Under xdist, each worker keeps to its share of the CPUs: torch's intra-op threads, in this process and in
    the processes the tests start (OMP_NUM_THREADS), and torch.compile's C++ compile pool
    (TORCHINDUCTOR_COMPILE_THREADS; 1 compiles in-process instead of starting a pool). With every worker busy,
    more threads than CPUs only add synchronisation: on a loaded 2-CPU machine, the demo's 600 training steps
    of a [2, 5, 1] KAN took 25 s with torch's default of 2 threads against 1.4 s with 1. A variable already
    set is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2:
        return
    threads = max(1, _cpus() // workers)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(threads))
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


_share_the_cpus_between_workers()
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
    cleared, as ``zero_grad()`` leaves them (before the warm-up too: it adds into no gradient a caller holds).
    With ``shapes=True``, the step's ops in order instead, (name, input shapes) each. The host-cost tests read
    what a step runs from it."""
    import torch

    def ops(layer, x, dy, shapes=False):
        for warm_up in (True, False):
            for t in (x, *layer.parameters()):
                t.grad = None
            if warm_up:
                layer(x).backward(dy)  # compile and record first
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=shapes) as prof:
            layer(x).backward(dy)
        if shapes:
            return [(event.name, event.input_shapes) for event in prof.events()]
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


@pytest.fixture(scope="session")
def quick_bench(tmp_path_factory):
    """``quick_bench(family)``: ``(exit status, output folder)`` of ``warpkan bench FAMILY --device cpu --quick``,
    run once a session (each family in a folder of its own), with WARPKAN_KAT_PATH unset so that the optional
    FlashKAT peer's row says the same whatever the environment. The tests that read one family's run carry
    ``@pytest.mark.xdist_group("bench_<family>")``, so that under xdist they share one worker and one run."""
    from warpkan.cli import main

    runs = {}

    def run(family):
        if family not in runs:
            out = tmp_path_factory.mktemp(f"bench_{family}")
            with pytest.MonkeyPatch.context() as mp:
                mp.delenv("WARPKAN_KAT_PATH", raising=False)
                runs[family] = main(["bench", family, "--device", "cpu", "--quick", "--out", str(out)]), out
        return runs[family]

    return run
