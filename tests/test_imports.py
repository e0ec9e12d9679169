"""warpkan's own imports form no cycle: every module can be imported first, and none leans on a function-level
import to reach a module that imports it back (an import inside a function that closes a cycle only moves
the cycle's failure from import time to the first call)."""

import ast
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "warpkan"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imported(name: str, is_package: bool, source: str) -> set:
    """The warpkan modules ``name`` imports anywhere in its source (module level, class bodies and functions
    alike), relative imports resolved; ``from package import name`` counts the submodule where ``name`` is one,
    else the package. The parent packages Python imports first are not counted: they are not a choice of the
    module's."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                         for alias in node.names)
    return {module for module in found if module in MODULES and module != name}


def import_graph() -> dict:
    """warpkan module -> the warpkan modules it imports (see :func:`_imported`)."""
    return {name: _imported(name, path.name == "__init__.py", path.read_text()) for name, path in MODULES.items()}


def cycles(graph: dict) -> list:
    """The strongly connected components of ``graph`` with more than one module (Tarjan), each sorted."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_graph_counts_function_level_imports_and_the_finder_finds_cycles():
    source = "from .family import EdgeFamily\n\n\ndef late():\n    from . import registry\n"
    assert _imported("warpkan.kernels.edge.bspline_family", False, source) == {
        "warpkan.kernels.edge.family", "warpkan.kernels.edge.registry"}
    assert _imported("warpkan.interpret", True, "from ._layers import bias\nfrom .. import _checks\n") == {
        "warpkan.interpret._layers", "warpkan._checks"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_warpkan_imports_form_a_dag():
    graph = import_graph()
    # the graph is the real one: the engine's registry reads the family modules, interpret's layers stack up
    assert "warpkan.kernels.edge.bspline_family" in graph["warpkan.kernels.edge.registry"]
    assert "warpkan.interpret._symbolic_layer" in graph["warpkan.interpret.edges"]
    assert cycles(graph) == []


def _import_in_order(modules: list, env: dict) -> subprocess.CompletedProcess:
    code = "import importlib\nfor name in %r:\n    importlib.import_module(name)\n" % (modules,)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def _package_modules(package: str) -> list:
    return [name for name in MODULES if name.startswith(package + ".")]


@pytest.mark.parametrize("package", ["warpkan.kernels.edge", "warpkan.interpret"])
def test_each_module_imports_first_in_a_fresh_interpreter(package, child_env):
    """Each module of the package imported first, the others after it, in a fresh interpreter. (A module of
    ``warpkan.interpret`` imports the package's ``__init__`` first, whatever the module: one order covers it.)"""
    modules = _package_modules(package)
    assert len(modules) > 3
    orders = [modules] if package == "warpkan.interpret" else \
        [[first] + [m for m in modules if m != first] for first in modules]
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(lambda order: _import_in_order(order, child_env()), orders))
    for order, result in zip(orders, done):
        assert result.returncode == 0, f"importing {order[0]} first failed:\n{result.stderr[-3000:]}"
