"""The documentation site builds with Sphinx, warnings as errors: the guide's pages, the performance notes they
reach, and the API reference that autodoc generates from the public modules' docstrings."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# one worker builds the site: autosummary writes its stub pages into docs/api, which two builds at once would
# both rewrite (the suite runs on pytest-xdist workers, --dist loadgroup)
pytestmark = pytest.mark.xdist_group("docs")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("sphinx")
    pytest.importorskip("furo")
    pytest.importorskip("myst_parser")
    pytest.importorskip("torch")  # autodoc imports warpkan.torch_bridge, warpkan.models and warpkan.interpret
    out = tmp_path_factory.mktemp("docs-html")
    # docs/conf.py puts this checkout first on sys.path, so autodoc reads this checkout's warpkan
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS),
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"sphinx-build failed:\n{done.stdout}{done.stderr}"
    return out


def test_site_builds_without_warnings(site):
    assert (site / "index.html").is_file()


def test_every_markdown_page_is_in_the_site(site):
    # perf notes and benchmark tables included: a page left out of every toctree would be a warning, but an
    # excluded one would not
    for page in DOCS.glob("*.md"):
        assert (site / f"{page.stem}.html").is_file(), page.name


def test_api_reference_documents_every_public_name(site):
    import warpkan
    import warpkan.interpret
    import warpkan.models
    import warpkan.torch_bridge

    for module in (warpkan, warpkan.torch_bridge, warpkan.interpret, warpkan.models):
        page = (site / "api" / f"{module.__name__}.html").read_text()
        for name in module.__all__:
            if not name.startswith("_"):
                assert re.search(rf'id="{re.escape(module.__name__)}\.{name}"|href="{module.__name__}\.{name}\.html"',
                                 page), f"{module.__name__}.{name}"
