"""warpkan layers under torch.distributed: ``examples/train_distributed.py`` on 2 CPU processes (gloo), with
DDP and with FSDP2, must end with the same parameters as one process trained on the combined batch.

Each launch is a real ``torchrun`` (``--standalone`` picks a free port). Two ranks that each see half of
every step's batch, with DDP (or FSDP2) averaging the gradients, take the gradient of the mean loss over the
whole batch, which is what the single process takes; only the order of the floating-point sums differs.
Where 2 GPUs are present the same checks run with NCCL (rank r on cuda:r).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import train_distributed as example  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

WORLD = 2
STEPS = 6
BATCH_PER_RANK = 48
LEARNING_RATE = 0.3
SEED = 3
WIDTHS = [2, 8, 1]
GRID_SIZE = 5

# Both runs compute the same sums in a different order (two half-batch means averaged vs one mean). Measured
# here after 6 SGD steps: at most 1 ulp of the dtype on parameters of order 1 (2.2e-16 in float64, 1.2e-7 in
# float32), for DDP and FSDP2 alike; a run that skipped the averaging (one rank's half only) is off by 3e-3 to
# 8e-2. The tolerances leave about a hundred ulps.
TOLERANCE = {torch.float64: dict(rtol=1e-13, atol=1e-14), torch.float32: dict(rtol=1e-5, atol=1e-6)}


def _example_args(dtype: torch.dtype, backend: str) -> list[str]:
    # SGD, not Adam: Adam divides by sqrt(second moment), which amplifies rounding noise in near-zero
    # gradients and would make a tight comparison meaningless.
    return [
        "--backend", backend, "--steps", str(STEPS), "--warmup", "1", "--batch", str(BATCH_PER_RANK),
        "--widths", ",".join(map(str, WIDTHS)), "--grid-size", str(GRID_SIZE), "--dtype", str(dtype)[6:],
        "--optimizer", "sgd", "--lr", str(LEARNING_RATE), "--seed", str(SEED), "--log-every", "2",
    ]


def _single_process_state(dtype: torch.dtype, device: str) -> dict:
    """The reference: one process, no process group, the two ranks' slices combined into one batch."""
    model = example.build_model(WIDTHS, GRID_SIZE, 3, device, dtype, SEED)
    optimizer = example.make_optimizer("sgd", model.parameters(), LEARNING_RATE)
    batches = example.rank_batches(STEPS, WORLD * BATCH_PER_RANK, 0, 1, SEED, device, dtype)
    losses, _ = example.train(model, optimizer, batches)
    assert losses[-1] < losses[0]
    return {name: value.detach().cpu().clone() for name, value in model.state_dict().items()}


_warm = set()


def _warm_kernel_cache(device: str) -> None:
    """Compile the Warp kernels here once per device, so the ranks load them from the cache instead of both
    compiling at the same time."""
    if device not in _warm:
        for dtype in (torch.float32, torch.float64):
            _single_process_state(dtype, device)
        _warm.add(device)


def _torchrun(tmp_path: Path, extra: list[str]) -> tuple[str, dict]:
    state_file = tmp_path / "state.pt"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}",
        str(ROOT / "examples" / "train_distributed.py"), *extra, "--save-state", str(state_file),
    ]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return output, torch.load(state_file)


TWO_GPUS = pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.device_count() >= 2
                                    and dist.is_nccl_available()), reason="needs 2 GPUs and NCCL")


# cpu-gloo runs in CI; cuda-nccl (rank r on cuda:r, reference on cuda:0) where 2 GPUs are present
@pytest.mark.parametrize(
    "device, dtype, wrapper",
    [
        ("cpu", torch.float64, "ddp"), ("cpu", torch.float32, "ddp"), ("cpu", torch.float64, "fsdp"),
        pytest.param("cuda", torch.float64, "ddp", marks=TWO_GPUS),
        pytest.param("cuda", torch.float32, "ddp", marks=TWO_GPUS),
        pytest.param("cuda", torch.float64, "fsdp", marks=TWO_GPUS),
    ],
    ids=lambda v: {"cpu": "cpu-gloo", "cuda": "cuda-nccl"}.get(v, str(v).replace("torch.", "")),
)
def test_two_ranks_match_one_rank_with_the_combined_batch(tmp_path, device, dtype, wrapper):
    backend = "gloo" if device == "cpu" else "nccl"
    _warm_kernel_cache(device)
    extra = _example_args(dtype, backend) + (["--fsdp"] if wrapper == "fsdp" else [])
    output, distributed_state = _torchrun(tmp_path, extra)

    # the example ran on both ranks and reported its throughput
    for rank in range(WORLD):
        assert f"[rank {rank}/{WORLD}] throughput" in output
    assert "total throughput" in output
    assert ("FSDP2" if wrapper == "fsdp" else "DDP") + f" on {backend}, 2 rank(s)" in output

    reference = _single_process_state(dtype, device)
    assert distributed_state.keys() == reference.keys()
    initial = example.build_model(WIDTHS, GRID_SIZE, 3, "cpu", dtype, SEED).state_dict()
    for name, expected in reference.items():
        got = distributed_state[name]
        assert got.dtype == dtype and got.shape == expected.shape, name
        torch.testing.assert_close(got, expected, **TOLERANCE[dtype], msg=lambda m: f"{name}: {m}")
        if name.endswith("weight") or name.endswith("scaler"):
            # the comparison means something only if training moved the parameter
            assert not torch.equal(expected, initial[name]), name
