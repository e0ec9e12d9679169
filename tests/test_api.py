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
}

EXPECTED_TORCH_BRIDGE = {
    "KANLinear",
    "bspline_kan",
    "bspline_forward",
    "bspline_backward",
    "choose_strategy",
    "UKANLinear",
    "ukan_pairs",
    "ukan_spline",
    "ukan_spline_backward",
    "GEGLUFFN",
    "geglu_ffn",
    "geglu_ffn_forward",
    "geglu_ffn_backward",
    "PolyKANLinear",
    "ChebyKANLinear",
    "poly_kan",
    "poly_forward",
    "poly_backward",
    "GroupRational",
    "GRKANLinear",
    "KATMLP",
    "group_rational",
    "group_rational_forward",
    "group_rational_backward",
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


def test_import_warpkan_does_not_import_torch():
    code = "import sys, warpkan; import warpkan.kernels.bspline; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


EXPECTED_INTERPRET = {
    "EdgeFunctions",
    "edge_functions",
    "Importance",
    "importance",
    "prune",
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
