"""The README and the user guide run as written: every ```python block of README.md (its quick starts) and of
the guide's pages (docs/*.md), on the CPU, and the README opens with the two commands."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


# (page, index in the page, code); the guide includes the README's quick starts rather than copying them
SNIPPETS = [(page.relative_to(ROOT).as_posix(), index, code)
            for page in PAGES for index, code in enumerate(python_blocks(page.read_text()))]


def test_readme_opens_with_the_two_commands():
    first_block = re.search(r"^```(\w*)\n(.*?)^```$", README, flags=re.S | re.M)
    assert README[:first_block.start()].strip() == "# warpkan"
    assert first_block.group(1) == "bash"
    lines = first_block.group(2).strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("pip install") and "warpkan demo" in lines[0]
    assert lines[1] == "python -m pytest -q"


def test_readme_has_the_three_quick_starts():
    headings = re.findall(r"^## Quick start: (.*)$", README, flags=re.M)
    assert len(headings) == 3
    quick_starts = re.split(r"^## ", README, flags=re.M)
    for heading in headings:
        section = next(s for s in quick_starts if s.startswith(f"Quick start: {heading}"))
        assert len(python_blocks(section)) == 1, heading


def test_the_guide_has_python_blocks():
    pages = {page for page, _, _ in SNIPPETS}
    assert {"docs/pinn.md", "docs/warp-native.md", "docs/interpretability.md"} <= pages


@pytest.mark.parametrize("page, index, code", SNIPPETS, ids=[f"{page}-{index}" for page, index, _ in SNIPPETS])
def test_python_block_runs_on_the_cpu(tmp_path, child_env, page, index, code):
    # no visible GPU: the snippets run as they would on a CPU-only machine, also where a GPU is present
    env = child_env(CUDA_VISIBLE_DEVICES="", MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    script = tmp_path / f"snippet_{index}.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, script.name], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"python block {index} of {page}:\n{code}\n{done.stdout}{done.stderr}"
