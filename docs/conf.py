"""Sphinx configuration of warpkan's documentation: MyST pages, furo theme, API reference from the docstrings.

Build: ``sphinx-build -W --keep-going -b html docs docs/_build/html`` from the repository root
(``pip install -e ".[torch,interpret,docs]"`` first: autodoc imports warpkan, its torch layers and the
interpretability tools).
"""

import inspect
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's warpkan, installed or not

import warpkan  # noqa: E402
import warpkan.interpret  # noqa: E402,F401
import warpkan.models  # noqa: E402,F401
import warpkan.torch_bridge  # noqa: E402,F401
from torch.library import CustomOpDef  # noqa: E402

# autosummary writes the API pages into the source tree (docs/api, ignored by git); they are regenerated on
# every build, so a page of a name that left an __all__ does not linger
shutil.rmtree(Path(__file__).parent / "api", ignore_errors=True)

project = "warpkan"
author = "the warpkan authors"
copyright = "the warpkan authors"
release = warpkan.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
templates_path = ["_templates"]
exclude_patterns = ["_build"]

# the docstrings are Google style ("Args:", "Returns:") with reST inline markup
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# the API reference documents exactly each public module's __all__
autosummary_generate = True
autosummary_ignore_module_all = False


def _custom_op_names() -> list[str]:
    """"module.name" of every torch custom op a public module exports: the module template documents them as
    functions (signature and docstring of the function the op wraps), not as data."""
    names = []
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("warpkan") and module is not None:
            for name in getattr(module, "__all__", ()):
                if isinstance(getattr(module, name, None), CustomOpDef):
                    names.append(f"{module_name}.{name}")
    return names


autosummary_context = {"custom_ops": _custom_op_names()}
autodoc_default_options = {"members": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"

myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = f"warpkan {release}"


def _custom_op_signature(app, what, name, obj, options, signature, return_annotation):
    if isinstance(obj, CustomOpDef):  # parameter names and defaults; the docstring gives shapes and types
        wrapped = inspect.signature(obj._init_fn)
        bare = [p.replace(annotation=inspect.Parameter.empty) for p in wrapped.parameters.values()]
        return str(wrapped.replace(parameters=bare, return_annotation=inspect.Signature.empty)), None
    return None


def _docstring(app, what, name, obj, options, lines):
    if isinstance(obj, CustomOpDef):  # the wrapped function's docstring, not CustomOpDef's
        lines[:] = [*inspect.cleandoc(obj._init_fn.__doc__ or "").splitlines(), "",
                    f"The custom op ``torch.ops.{obj._qualname.replace('::', '.')}``."]
    elif what == "data" and type(obj).__module__ == "builtins":  # no docstring of dict, tuple, ... for a constant
        lines.clear()


def setup(app):
    app.connect("autodoc-process-signature", _custom_op_signature)
    app.connect("autodoc-process-docstring", _docstring)
