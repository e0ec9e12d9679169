"""The public API is locked: adding or removing a public name is a deliberate change to this file."""

import subprocess
import sys

import warpkan

EXPECTED_WARPKAN = {
    "__version__",
    "KANLinear",
    "KANNetwork",
    "UKANLinear",
    "Adam",
    "PolyKANLinear",
    "ChebyKANLinear",
    "bspline_funcs",
    "poly_funcs",
    "rational_funcs",
    "GroupRational",
    "GRKANLinear",
    "set_tile_matmul",
}

EXPECTED_TORCH_BRIDGE = {
    "edge_forward",
    "edge_backward",
    "KANLinear",
    "bspline_kan",
    "choose_strategy",
    "UKANLinear",
    "ukan_pairs",
    "GEGLUFFN",
    "geglu_ffn",
    "geglu_ffn_forward",
    "geglu_ffn_backward",
    "PolyKANLinear",
    "ChebyKANLinear",
    "poly_kan",
    "GroupRational",
    "GRKANLinear",
    "KATMLP",
    "group_rational",
    "group_rational_forward",
    "group_rational_backward",
    "capture_step",
    "graphed_training_step",
    "Jet",
    "jet",
    "jet_of",
    "register_jet_rule",
    "elementwise_rule",
}


def test_warpkan_all_is_locked():
    assert set(warpkan.__all__) == EXPECTED_WARPKAN
    for name in warpkan.__all__:
        assert getattr(warpkan, name) is not None, name


def test_torch_bridge_all_is_locked():
    import warpkan.torch_bridge as tb

    assert set(tb.__all__) == EXPECTED_TORCH_BRIDGE
    for name in tb.__all__:
        assert getattr(tb, name) is not None, name


EXPECTED_MODELS = {"FeedForward", "VisionTransformer", "MLPMixer", "PolyKANNet", "LAYER_KINDS"}


def test_models_all_is_locked():
    import pytest

    pytest.importorskip("torch")
    import warpkan.models as models

    assert set(models.__all__) == EXPECTED_MODELS
    for name in models.__all__:
        assert getattr(models, name) is not None, name


def test_import_warpkan_does_not_import_torch():
    code = "import sys, warpkan; import warpkan.kernels.bspline; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def _documented_args(cls) -> set:
    """The argument names of the ``Args:`` section of a class docstring."""
    import re

    doc = cls.__doc__ or ""
    if "Args:" not in doc:
        return set()
    section = doc.split("Args:", 1)[1]
    return set(re.findall(r"^\s{8}(\w+):", section, flags=re.MULTILINE))


def _layer_classes():
    import pytest

    classes = [getattr(warpkan, name) for name in ("KANLinear", "UKANLinear", "PolyKANLinear", "ChebyKANLinear",
                                                   "GroupRational", "GRKANLinear", "KANNetwork", "Adam")]
    try:
        import warpkan.torch_bridge as tb
    except ImportError:
        pytest.skip("torch is absent")
    return classes + [getattr(tb, name) for name in ("KANLinear", "UKANLinear", "PolyKANLinear", "ChebyKANLinear",
                                                     "GroupRational", "GRKANLinear", "KATMLP", "GEGLUFFN")]


def _model_classes():
    import pytest

    pytest.importorskip("torch")
    import warpkan.models as models

    return [getattr(models, name) for name in ("FeedForward", "VisionTransformer", "MLPMixer", "PolyKANNet")]


def test_layers_document_every_argument_and_their_call():
    import inspect

    missing = []
    for cls in _layer_classes() + _model_classes():
        where = f"{cls.__module__}.{cls.__name__}"
        params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        undocumented = set(params) - _documented_args(cls)
        if undocumented:
            missing.append(f"{where}: Args lacks {sorted(undocumented)}")
        call = cls.__dict__.get("forward") or cls.__dict__.get("__call__")
        if call is None and cls.__name__ not in ("Adam", "ChebyKANLinear"):
            missing.append(f"{where}: no forward or __call__")
        if call is not None and not (call.__doc__ or "").strip():
            missing.append(f"{where}.{call.__name__}: no docstring")
    assert not missing, "\n".join(missing)


EXPECTED_INTERPRET = {
    "EdgeFunctions",
    "edge_functions",
    "Importance",
    "importance",
    "prune",
    "sparsity_penalty",
    "REG_METRICS",
    "plot_layer",
    "plot_network",
    "refine",
    "SYMBOLIC_LIB",
    "SymbolicFit",
    "SymbolicFunction",
    "SymbolicKAN",
    "SymbolicLayer",
    "auto_symbolic",
    "formula",
    "suggest_symbolic",
}


def test_interpret_all_is_locked():
    import warpkan.interpret as interpret

    assert set(interpret.__all__) == EXPECTED_INTERPRET
    for name in interpret.__all__:
        assert getattr(interpret, name) is not None, name


def test_interpret_imports_without_its_optional_packages():
    code = ("import sys, warpkan.interpret; "
            "assert not {'matplotlib', 'scipy', 'sympy'} & set(sys.modules), 'an optional package was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
