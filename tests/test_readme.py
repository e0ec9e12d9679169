"""The README runs as written: every ```python block, on the CPU, and it opens with the two commands."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PYTHON_BLOCKS = re.findall(r"^```python\n(.*?)^```$", README, flags=re.S | re.M)


def test_readme_opens_with_the_two_commands():
    first_block = re.search(r"^```(\w*)\n(.*?)^```$", README, flags=re.S | re.M)
    assert README[:first_block.start()].strip() == "# warpkan"
    assert first_block.group(1) == "bash"
    lines = first_block.group(2).strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("pip install") and "warpkan demo" in lines[0]
    assert lines[1] == "python -m pytest -q"


def test_readme_has_python_blocks():
    assert len(PYTHON_BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_readme_python_block_runs_on_the_cpu(tmp_path, child_env, index):
    # no visible GPU: the snippets run as they would on a CPU-only machine, also where a GPU is present
    env = child_env(CUDA_VISIBLE_DEVICES="", MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    script = tmp_path / f"readme_block_{index}.py"
    script.write_text(PYTHON_BLOCKS[index])
    done = subprocess.run([sys.executable, script.name], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"README python block {index}:\n{PYTHON_BLOCKS[index]}\n{done.stdout}{done.stderr}"
