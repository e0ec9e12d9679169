"""Every example runs in its quick mode and passes its own self-check (exit status 0), writing its plot.

Each runs as ``python examples/NAME.py --quick`` in a fresh process, in a temporary folder (where its outputs
go), with matplotlib's Agg backend. Torch and OpenMP get one thread: these are small tensors, where more
threads gain little, and spinning worker threads can slow a run on a busy 2-core machine several times over.
"""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# example -> the files its quick run writes in the folder it runs in
OUTPUTS = {
    "chebykan_classification.py": ["chebykan_classification.png"],
    "diffsim_particles.py": ["diffsim_particles.png"],
    "pinn_heat.py": ["pinn_heat.png"],
    "pinn_torch.py": ["pinn_torch.png"],
    "pinn_logistic.py": ["pinn_logistic.png"],
    "symbolic_regression.py": ["symbolic_regression.png"],
    "train_distributed.py": [],
    "train_mixer.py": ["train_mixer.png"],
    "ukan_moons.py": ["ukan_moons.png"],
    "ukan_regression.py": ["ukan_regression.png"],
    "ukan_unbounded.py": ["ukan_unbounded.png"],
}


def test_every_example_is_listed():
    assert sorted(path.name for path in EXAMPLES.glob("*.py")) == sorted(OUTPUTS)


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_example_runs_quick_and_checks_itself(tmp_path, child_env, name):
    env = child_env(MPLBACKEND="Agg", OMP_NUM_THREADS="1", WARPKAN_VERBOSE=None)
    done = subprocess.run([sys.executable, str(EXAMPLES / name), "--quick"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(OUTPUTS[name]), output[-2000:]
    for output_file in OUTPUTS[name]:
        assert (tmp_path / output_file).stat().st_size > 10_000
