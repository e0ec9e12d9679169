"""Bad input gets a clear error (DESIGN.md, "What bad input gets").

- Every size argument of every layer, torch and Warp-native, follows one rule (``warpkan._checks``): ints
  and numpy integers are accepted, bool and floats such as 8.0 are TypeError, non-positive and absurd sizes
  are ValueError before anything is allocated; every message names the argument.
- A sweep of bad constructor arguments over every layer class raises only ValueError or TypeError, with the
  argument's name in the message (never an internal error of torch, numpy or Warp).
- The Warp-native layers take inputs as the torch layers do: an empty batch gives an empty output (forward
  and under ``wp.Tape``), a transposed or strided input works (gradients included), and a wrong type, dtype,
  shape or device is a TypeError/ValueError naming x.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import warp as wp

import warpkan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAN, INF = float("nan"), float("inf")
HUGE = 10**12

# ----------------------------------------------------------------------------- bad values, by kind of argument
WRONG_TYPES = ["8", 8.0, 2.5, None, [8], (8,), True, NAN]
BAD = {
    "size": WRONG_TYPES + [-8, 0, HUGE],  # a positive int
    "count": WRONG_TYPES + [-1, HUGE],  # a non-negative int
    "optional_size": [t for t in WRONG_TYPES if t is not None] + [-8, 0, HUGE],  # None or a positive int
    "spline_order": WRONG_TYPES + [-1, 0, 6, HUGE],
    "degree": WRONG_TYPES + [-1, 65, HUGE],
    "lut_size": WRONG_TYPES + [-1, 0, 1, HUGE],
    "pe_dim": WRONG_TYPES + [-2, 3, HUGE],
    "order": [5, 5.0, None, "54", (5,), (5, 4, 3), ("5", "4"), (5.0, 4), (-1, 4), (5, 0), (13, 4), (5, 13),
              (True, 4)],
    "range": [1.0, None, "ab", (1,), (-1, 0, 1), (1, -1), (1, 1), (NAN, 1), (-1, INF), ("a", 1), (None, 1)],
    "positive_number": ["0.1", None, [0.1], True, 0, -0.1, NAN, INF],
    "number": ["1", None, [1.0], True, NAN, INF],
    "inits": ["swish", None, 3, ("swish",), ("identity", "swish", "gelu"), ("identity", "relu"), (1, 2)],
    "wp_dtype": ["float32", None, np.float32, wp.float16, wp.int32],
    "wp_device": ["gpu", 123, "cuda:77"],
    "strategy": ["fast", "GEMM", None, 1, ("gemm",)],
}


# layer -> (valid arguments, {swept argument: kind of bad values}); the torch classes are looked up when a
# case runs, so the cases exist without torch
TORCH_LAYERS = {
    "KANLinear": (dict(in_features=4, out_features=3), {
        "in_features": "size", "out_features": "size", "grid_size": "size", "spline_order": "spline_order",
        "grid_range": "range"}),
    "UKANLinear": (dict(in_features=4, out_features=3), {
        "in_features": "size", "out_features": "size", "spline_order": "spline_order",
        "grid_delta": "positive_number", "pe_dim": "pe_dim", "embed_dim": "count", "hidden_dim": "size",
        "table_groups": "optional_size"}),
    "PolyKANLinear": (dict(in_features=4, out_features=3, degree=3), {
        "in_features": "size", "out_features": "size", "degree": "degree", "lut_size": "lut_size",
        "alpha": "number", "beta": "number"}),
    "ChebyKANLinear": (dict(in_features=4, out_features=3, degree=3), {
        "in_features": "size", "out_features": "size", "degree": "degree", "lut_size": "lut_size"}),
    "GroupRational": (dict(num_features=8, num_groups=2), {
        "num_features": "size", "num_groups": "size", "order": "order"}),
    "GRKANLinear": (dict(in_features=8, out_features=3, num_groups=2), {
        "in_features": "size", "out_features": "size", "num_groups": "size", "order": "order"}),
    "KATMLP": (dict(in_features=8, num_groups=2), {
        "in_features": "size", "hidden_features": "optional_size", "out_features": "optional_size",
        "num_groups": "size", "order": "order", "inits": "inits"}),
    "GEGLUFFN": (dict(hidden=8, intermediate=16), {
        "hidden": "size", "intermediate": "size", "small_batch_rows": "count"}),
}

NATIVE = {"device": "wp_device", "dtype": "wp_dtype"}
STRATEGY = {"strategy": "strategy"}  # the native layers with a gemm strategy
NATIVE_LAYERS = {
    "KANLinear": (dict(in_features=4, out_features=3, device="cpu"),
                  {**TORCH_LAYERS["KANLinear"][1], **NATIVE, **STRATEGY}),
    "UKANLinear": (dict(in_features=4, out_features=3, device="cpu"), {**TORCH_LAYERS["UKANLinear"][1], **NATIVE}),
    "PolyKANLinear": (dict(in_features=4, out_features=3, degree=3, device="cpu"),
                      {**TORCH_LAYERS["PolyKANLinear"][1], **NATIVE, **STRATEGY}),
    "ChebyKANLinear": (dict(in_features=4, out_features=3, degree=3, device="cpu"),
                       {**TORCH_LAYERS["ChebyKANLinear"][1], **NATIVE, **STRATEGY}),
    "GroupRational": (dict(num_features=8, num_groups=2, device="cpu"),
                      {**TORCH_LAYERS["GroupRational"][1], **NATIVE}),
    "GRKANLinear": (dict(in_features=8, out_features=3, num_groups=2, device="cpu"),
                    {**TORCH_LAYERS["GRKANLinear"][1], **NATIVE}),
}


def _cases(layers):
    return [pytest.param(name, arg, value, id=f"{name}-{arg}={value!r}")
            for name, (_, swept) in layers.items() for arg, kind in swept.items() for value in BAD[kind]]


def _expect_clear_error(build, arg, value):
    try:
        build()
    except (TypeError, ValueError) as error:
        assert arg in str(error), f"{arg}={value!r}: the message does not name the argument: {error}"
    else:
        pytest.fail(f"{arg}={value!r} was accepted")


@pytest.mark.parametrize("layer, arg, value", _cases(NATIVE_LAYERS))
def test_bad_constructor_argument_native(layer, arg, value):
    valid, _ = NATIVE_LAYERS[layer]
    _expect_clear_error(lambda: getattr(warpkan, layer)(**{**valid, arg: value}), arg, value)


@pytest.mark.parametrize("layer, arg, value", _cases(TORCH_LAYERS))
def test_bad_constructor_argument_torch(layer, arg, value):
    tb = pytest.importorskip("warpkan.torch_bridge")
    valid, _ = TORCH_LAYERS[layer]
    _expect_clear_error(lambda: getattr(tb, layer)(**{**valid, arg: value}), arg, value)


# ----------------------------------------------------------------------------- the rule, case by case
def _both(name):
    """(torch class or None, native class) of a layer name."""
    try:
        import warpkan.torch_bridge as tb
    except ImportError:
        tb = None
    return (getattr(tb, name) if tb is not None else None), getattr(warpkan, name, None)


def _build(cls, *args, **kwargs):
    if cls.__module__.startswith("warpkan.native"):
        kwargs.setdefault("device", "cpu")
    return cls(*args, **kwargs)


@pytest.mark.parametrize("side", [0, 1], ids=["torch", "native"])
def test_group_rational_refuses_non_positive_num_features(side):
    cls = _both("GroupRational")[side]
    if cls is None:
        pytest.skip("torch is absent")
    for value in (-8, 0):
        with pytest.raises(ValueError, match=f"num_features must be a positive int, got {value}"):
            _build(cls, value, num_groups=2)


def test_katmlp_zero_sizes_are_refused_not_replaced():
    tb = pytest.importorskip("warpkan.torch_bridge")
    with pytest.raises(ValueError, match="hidden_features must be a positive int, got 0"):
        tb.KATMLP(8, hidden_features=0, num_groups=2)
    with pytest.raises(ValueError, match="out_features must be a positive int, got 0"):
        tb.KATMLP(8, out_features=0, num_groups=2)
    # None (the default) still means in_features
    mlp = tb.KATMLP(8, num_groups=2)
    assert (mlp.fc1.out_features, mlp.fc2.out_features) == (8, 8)
    with pytest.raises(ValueError, match="num_groups \\(4\\) must divide hidden_features \\(6\\)"):
        tb.KATMLP(8, hidden_features=6, num_groups=4)


@pytest.mark.parametrize("name", ["KANLinear", "UKANLinear", "PolyKANLinear", "GroupRational", "GRKANLinear"])
@pytest.mark.parametrize("side", [0, 1], ids=["torch", "native"])
def test_one_rule_for_sizes(name, side):
    """The same rule on both sides: a float such as 8.0 and a bool are TypeError, numpy integers are
    accepted (and stored as Python ints), absurd sizes are ValueError naming the int32 bound."""
    cls = _both(name)[side]
    if cls is None:
        pytest.skip("torch is absent")
    extra = {"PolyKANLinear": dict(degree=3), "GroupRational": dict(num_groups=2), "GRKANLinear": dict(num_groups=2)}
    extra = extra.get(name, {})
    sizes = (8,) if name == "GroupRational" else (8, 3)
    with pytest.raises(TypeError, match="must be an int, got float 8.0"):
        _build(cls, 8.0, *sizes[1:], **extra)
    with pytest.raises(TypeError, match="must be an int, got bool True"):
        _build(cls, *sizes[:-1], True, **extra)
    with pytest.raises(ValueError, match="2147483647"):
        _build(cls, *sizes[:-1], HUGE, **extra)
    layer = _build(cls, *(np.int64(s) for s in sizes), **{k: np.int32(v) for k, v in extra.items()})
    first = "num_features" if name == "GroupRational" else "in_features"
    assert type(getattr(layer, first)) is int and getattr(layer, first) == 8


@pytest.mark.parametrize("side", [0, 1], ids=["torch", "native"])
def test_parameter_count_is_checked_before_allocating(side):
    """Sizes each within int32 whose product is not: a ValueError naming the arguments and the array,
    not an allocation failure."""
    cls = _both("KANLinear")[side]
    if cls is None:
        pytest.skip("torch is absent")
    with pytest.raises(ValueError, match=r"in_features=100000, out_features=100000.*spline_weight"):
        _build(cls, 100000, 100000)


def test_checker_rules():
    from warpkan import _checks

    assert _checks.positive_int("n", np.int16(3)) == 3 and type(_checks.positive_int("n", np.uint8(3))) is int
    assert _checks.int_in_range("k", 5, 1, 5) == 5
    assert _checks.non_negative_int("n", 0) == 0
    assert _checks.increasing_range("r", np.array([-1, 2])) == (-1.0, 2.0)
    assert _checks.increasing_range("r", [0, 1.5]) == (0.0, 1.5)
    assert _checks.positive_number("h", np.float32(0.5)) == 0.5
    for bad in (True, np.bool_(True), 8.0, "8", None, 1 + 0j):
        with pytest.raises(TypeError, match="^n must be an int, got"):
            _checks.positive_int("n", bad)
    with pytest.raises(ValueError, match=r"^k must be an int in \[1, 5\], got 6$"):
        _checks.int_in_range("k", 6, 1, 5)
    with pytest.raises(ValueError, match="must divide channels"):
        _checks.divides("groups", 3, "channels", 8)
    with pytest.raises(ValueError, match="increasing"):
        _checks.increasing_range("r", (2, 1))
    with pytest.raises(ValueError, match="more than the 2147483647"):
        _checks.fits_index("w", (2**16, 2**16), a=2**16)
    _checks.fits_index("w", (2**16, 2**15 - 1), a=2**16)


def test_old_per_layer_checks_are_gone():
    """One way to check a size: the rule lives in warpkan/_checks.py only."""
    offenders = []
    for folder, _, files in os.walk(os.path.join(ROOT, "warpkan")):
        for file in files:
            path = os.path.join(folder, file)
            if not file.endswith(".py") or path.endswith(os.path.join("warpkan", "_checks.py")):
                continue
            text = open(path).read()
            for pattern in ("must be a positive int", "isinstance(value, int)", "must be positive, got"):
                if pattern in text:
                    offenders.append(f"{os.path.relpath(path, ROOT)}: {pattern}")
    assert not offenders, offenders


def test_checks_and_native_layers_do_not_import_torch():
    code = ("import sys, warpkan._checks, warpkan.native.bspline, warpkan.native.ukan, warpkan.native.poly, "
            "warpkan.native.rational, warpkan.native.network, warpkan.native.optim; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})


def test_network_and_adam_arguments():
    layer = warpkan.KANLinear(3, 2, device="cpu")
    with pytest.raises(ValueError, match="layers must not be empty"):
        warpkan.KANNetwork([])
    with pytest.raises(TypeError, match="layers must be"):
        warpkan.KANNetwork(3)
    with pytest.raises(TypeError, match=r"layers\[1\] must be a Warp-native layer"):
        warpkan.KANNetwork([layer, "relu"])
    params = layer.parameters()
    for kwargs, error, name in ((dict(lr=0.0), ValueError, "lr"), (dict(lr="1e-3"), TypeError, "lr"),
                                (dict(lr=NAN), ValueError, "lr"), (dict(betas=0.9), TypeError, "betas"),
                                (dict(betas=(0.9, 1.0)), ValueError, r"betas\[1\]"),
                                (dict(betas=(0.9,)), ValueError, "betas"), (dict(eps=-1.0), ValueError, "eps")):
        with pytest.raises(error, match=name):
            warpkan.Adam(params, **kwargs)
    with pytest.raises(TypeError, match="params must be"):
        warpkan.Adam(params[0])
    with pytest.raises(TypeError, match=r"params\[1\] must be a wp.array"):
        warpkan.Adam([params[0], np.zeros(3)])
    with pytest.raises(ValueError, match=r"params\[0\] needs a gradient array"):
        warpkan.Adam([wp.zeros(3, device="cpu")])
    opt = warpkan.Adam(params)
    with pytest.raises(ValueError, match="lr"):
        opt.lr = -1.0


# ----------------------------------------------------------------------------- Warp-native inputs
def _native_layer(name, dtype=wp.float64):
    kwargs = dict(device="cpu", dtype=dtype)
    if name == "KANLinear":
        return warpkan.KANLinear(4, 3, grid_size=4, seed=1, **kwargs)
    if name == "UKANLinear":
        return warpkan.UKANLinear(4, 3, grid_delta=0.3, pe_dim=4, embed_dim=2, hidden_dim=6, seed=1, **kwargs)
    if name == "PolyKANLinear":
        return warpkan.PolyKANLinear(4, 3, degree=4, mode="exact", bias=True, seed=1, **kwargs)
    if name == "ChebyKANLinear":
        return warpkan.ChebyKANLinear(4, 3, degree=4, bias=True, seed=1, **kwargs)
    if name == "GroupRational":
        return warpkan.GroupRational(4, num_groups=2, order=(3, 3), **kwargs)
    if name == "GRKANLinear":
        return warpkan.GRKANLinear(4, 3, num_groups=2, order=(3, 3), seed=1, **kwargs)
    if name == "KANNetwork":
        return warpkan.KANNetwork([warpkan.KANLinear(4, 5, grid_size=4, seed=1, **kwargs),
                                   warpkan.PolyKANLinear(5, 3, degree=3, mode="exact", seed=1, **kwargs)])
    raise KeyError(name)


NATIVE_NAMES = ["KANLinear", "UKANLinear", "PolyKANLinear", "ChebyKANLinear", "GroupRational", "GRKANLinear",
                "KANNetwork"]


def _run(layer, x, dy=None):
    """(y, x.grad, parameter gradients) of one forward and, with dy, one tape backward."""
    tape = wp.Tape()
    with tape:
        y = layer(x)
    if dy is None:
        return y.numpy(), None, None
    tape.backward(grads={y: wp.array(dy, dtype=y.dtype, device="cpu")})
    grads = [p.grad.numpy().copy() for p in layer.parameters()]
    x_grad = x.grad.numpy().copy()
    tape.zero()
    return y.numpy(), x_grad, grads


@pytest.mark.parametrize("name", NATIVE_NAMES)
def test_native_empty_batch(name):
    layer = _native_layer(name)
    out = 4 if name == "GroupRational" else 3
    y = layer(wp.zeros((0, 4), dtype=wp.float64, device="cpu"))
    assert y.shape == (0, out)
    x = wp.zeros((0, 4), dtype=wp.float64, device="cpu", requires_grad=True)
    tape = wp.Tape()
    with tape:
        y = layer(x)
    assert y.shape == (0, out)
    tape.backward(grads={y: wp.zeros((0, out), dtype=wp.float64, device="cpu")})
    assert x.grad.shape == (0, 4)
    for p in layer.parameters():
        assert not np.any(p.grad.numpy())


@pytest.mark.parametrize("dims", [dict(embed_dim=0), dict(pe_dim=0)], ids=["no-embedding", "no-encoding"])
def test_native_zero_width_parameter_under_tape(dims):
    """UKAN with embed_dim=0 has an empty feature_embedding: the tape takes the layer all the same."""
    layer = warpkan.UKANLinear(3, 2, hidden_dim=4, device="cpu", **{"pe_dim": 4, "embed_dim": 2, **dims})
    x = wp.array(np.linspace(-1, 1, 15).reshape(5, 3), dtype=wp.float32, device="cpu", requires_grad=True)
    tape = wp.Tape()
    with tape:
        y = layer(x)
    tape.backward(grads={y: wp.ones(y.shape, dtype=wp.float32, device="cpu")})
    assert np.all(np.isfinite(x.grad.numpy())) and np.any(x.grad.numpy())
    warpkan.Adam(layer.parameters()).step()


@pytest.mark.parametrize("name", NATIVE_NAMES)
@pytest.mark.parametrize("view", ["transposed", "strided"])
def test_native_non_contiguous_input(name, view):
    """A transposed or strided x gives what its contiguous copy gives, and its gradient lands in the
    caller's array (the rows and columns the view covers), accumulating over uses as Warp's adjoints do."""
    rng = np.random.default_rng(3)
    x_np = rng.uniform(-1.1, 1.1, (6, 4))
    out = 4 if name == "GroupRational" else 3
    dy = rng.standard_normal((6, out))

    reference = _native_layer(name)
    x_ref = wp.array(x_np, dtype=wp.float64, device="cpu", requires_grad=True)
    y_ref, gx_ref, gp_ref = _run(reference, x_ref, dy)

    layer = _native_layer(name)
    if view == "transposed":
        base = wp.array(x_np.T.copy(), dtype=wp.float64, device="cpu", requires_grad=True)
        x = base.transpose()
    else:  # every other column of a wider array
        wide = np.zeros((6, 8))
        wide[:, ::2] = x_np
        base = wp.array(wide, dtype=wp.float64, device="cpu", requires_grad=True)
        x = base[:, ::2]
    assert not x.is_contiguous
    np.testing.assert_array_equal(layer(x).numpy(), y_ref)  # no tape

    tape = wp.Tape()
    with tape:
        y = layer(x)
    tape.backward(grads={y: wp.array(dy, dtype=wp.float64, device="cpu")})
    np.testing.assert_allclose(y.numpy(), y_ref, rtol=1e-13, atol=1e-14)
    got = base.grad.numpy()
    got = got.T if view == "transposed" else got
    np.testing.assert_allclose(got if view == "transposed" else got[:, ::2], gx_ref, rtol=1e-12, atol=1e-14)
    if view == "strided":
        assert not np.any(got[:, 1::2])  # the columns the view skips get nothing
    for p, expected in zip(layer.parameters(), gp_ref):
        np.testing.assert_allclose(p.grad.numpy(), expected, rtol=1e-12, atol=1e-14)

    # two uses of the same strided x on one tape: the gradients add up
    layer = _native_layer(name)
    base.grad.zero_()
    tape = wp.Tape()
    with tape:
        y1 = layer(x)
        y2 = layer(x)
    tape.backward(grads={y1: wp.array(dy, dtype=wp.float64, device="cpu"),
                         y2: wp.array(dy, dtype=wp.float64, device="cpu")})
    got = base.grad.numpy()
    got = got.T if view == "transposed" else got[:, ::2]
    np.testing.assert_allclose(got, 2 * gx_ref, rtol=1e-12, atol=1e-14)


def _torch_tensor():
    torch = pytest.importorskip("torch")
    return torch.zeros(5, 4, dtype=torch.float64)


BAD_INPUTS = {
    "numpy": (lambda: np.zeros((5, 4)), TypeError, "x must be a wp.array2d.*numpy.ndarray"),
    "list": (lambda: [[0.0] * 4] * 5, TypeError, "x must be a wp.array2d.*list"),
    "none": (lambda: None, TypeError, "x must be a wp.array2d.*NoneType"),
    "torch": (_torch_tensor, TypeError, "x must be a wp.array2d.*torch.Tensor.*wp.from_torch"),
    "float32": (lambda: wp.zeros((5, 4), dtype=wp.float32, device="cpu"), TypeError, "x must have dtype float64"),
    "int32": (lambda: wp.zeros((5, 4), dtype=wp.int32, device="cpu"), TypeError, "x must have dtype float64"),
    "vec4": (lambda: wp.zeros(5, dtype=wp.vec4d, device="cpu"), TypeError, "x must have dtype float64"),
    "1d": (lambda: wp.zeros(4, dtype=wp.float64, device="cpu"), ValueError, r"x must be a wp.array2d.*got shape \(4,\)"),
    "3d": (lambda: wp.zeros((1, 5, 4), dtype=wp.float64, device="cpu"), ValueError, r"got shape \(1, 5, 4\)"),
    "last_dim": (lambda: wp.zeros((5, 3), dtype=wp.float64, device="cpu"), ValueError, r"\[N, 4\], got shape \(5, 3\)"),
}


@pytest.mark.parametrize("name", NATIVE_NAMES)
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_native_bad_input_names_x(name, case):
    layer = _native_layer(name)
    make, error, message = BAD_INPUTS[case]
    with pytest.raises(error, match=message):
        layer(make())
    x = wp.array(np.zeros((2, 4)), dtype=wp.float64, device="cpu")
    assert layer(x).shape[0] == 2  # nothing was corrupted


@pytest.mark.skipif(not wp.is_cuda_available(), reason="needs a CUDA device besides the CPU")
@pytest.mark.parametrize("name", NATIVE_NAMES)
def test_native_layer_refuses_cuda_input_on_cpu(name):
    layer = _native_layer(name)
    with pytest.raises(ValueError, match="x must be on the layer's device cpu"):
        layer(wp.zeros((2, 4), dtype=wp.float64, device="cuda"))


@pytest.mark.parametrize("make", [
    lambda: warpkan.GroupRational(8, num_groups=2, order=(0, 3), init="identity", device="cpu"),
    lambda: __import__("warpkan.torch_bridge", fromlist=["GroupRational"]).GroupRational(
        8, num_groups=2, order=(0, 3), init="identity"),
], ids=["native", "torch"])
def test_identity_init_needs_a_numerator_of_degree_one(make):
    """F(x) = x cannot be a constant numerator: refused by name instead of a tensor-size error."""
    with pytest.raises(ValueError, match=r"init='identity'.*m >= 1"):
        make()


# ----------------------------------------------------------------------------- the torch layers' inputs
# name -> arguments of a small layer (in_features 8), and the dtypes it can be built in
TORCH_INPUT_LAYERS = {
    "KANLinear": (dict(in_features=8, out_features=3), "float32/64"),
    "UKANLinear": (dict(in_features=8, out_features=3), "float32/64"),
    "PolyKANLinear": (dict(in_features=8, out_features=3, degree=3), "float32/64"),
    "ChebyKANLinear": (dict(in_features=8, out_features=3, degree=3), "float32/64"),
    "GroupRational": (dict(num_features=8, num_groups=2), "any float"),
    "GRKANLinear": (dict(in_features=8, out_features=3, num_groups=2), "any float"),
    "KATMLP": (dict(in_features=8, num_groups=2), "any float"),
    "GEGLUFFN": (dict(hidden=8, intermediate=16), "any float"),
}


def _torch_layer(name):
    tb = pytest.importorskip("warpkan.torch_bridge")
    return getattr(tb, name)(**TORCH_INPUT_LAYERS[name][0])


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr"])
@pytest.mark.parametrize("name", list(TORCH_INPUT_LAYERS))
def test_torch_layers_refuse_sparse_x_by_name(name, layout):
    """A sparse x used to fail inside torch ("unsupported memory format option Contiguous")."""
    torch = pytest.importorskip("torch")
    layer = _torch_layer(name)
    x = torch.rand(5, 8)
    sparse = x.to_sparse() if layout == "sparse_coo" else x.to_sparse_csr()
    with pytest.raises(TypeError, match=r"x must be a dense \(strided\) tensor, got layout sparse_c..: .*to_dense"):
        layer(sparse)
    assert layer(sparse.to_dense()).shape[0] == 5


@pytest.mark.parametrize("name", [name for name in TORCH_INPUT_LAYERS if name != "GroupRational"])
def test_torch_layers_name_x_for_a_dtype_of_its_own(name):
    """An x whose dtype is not the layer's gets a TypeError naming x and both dtypes, and saying how to make
    them agree: convert x, or the layer where it takes x's dtype (a float64 x and a float32 layer were told to
    use autocast, or failed in torch's matmul naming mat1 and mat2, or named GEGLUFFN's w_o). GroupRational
    alone takes x of every float dtype whatever its coefficients' (it computes in float32, or float64)."""
    torch = pytest.importorskip("torch")
    layer = _torch_layer(name)
    with pytest.raises(TypeError, match=r"x must have the layer's dtype torch\.float32, got torch\.float64: convert x "
                                        r"\(x\.float\(\)\) or the layer \(layer\.double\(\)\)$"):
        layer(torch.rand(5, 8, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"x must have the layer's dtype torch\.float32, got torch\.int64: convert x "
                                        r"\(x\.float\(\)\)$"):
        layer(torch.ones(5, 8, dtype=torch.int64))
    # a 16-bit x: the layers that take 16-bit parameters say so, the float32/64 ones point to autocast
    half = r"or the layer \(layer\.half\(\)\)$" if TORCH_INPUT_LAYERS[name][1] == "any float" else r"torch\.autocast"
    with pytest.raises(TypeError, match=r"x must have the layer's dtype torch\.float32, got torch\.float16: .*" + half):
        layer(torch.rand(5, 8, dtype=torch.float16))
    assert layer(torch.rand(5, 8)).shape[0] == 5


@pytest.mark.parametrize("name", list(TORCH_INPUT_LAYERS))
def test_torch_layers_take_x_of_another_dtype_under_autocast(name):
    """Under autocast an x of another dtype than the layer's is legitimate: cast, not refused. (GroupRational
    returns x's dtype; float64, which autocast does not cast, is left to the layers' own rules.)"""
    torch = pytest.importorskip("torch")
    layer = _torch_layer(name)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            expected = dtype if name == "GroupRational" else torch.bfloat16
            assert layer(torch.rand(5, 8, dtype=dtype)).dtype == expected, dtype


@pytest.mark.parametrize("name", list(TORCH_INPUT_LAYERS))
@pytest.mark.parametrize("dtype", ["int32", "bool", "complex64"])
def test_torch_layers_refuse_non_floating_dtype_by_name(name, dtype):
    """GroupRational(dtype=torch.int32) used to fail in torch ("Only Tensors of floating point ... can require
    gradients"); every layer refuses a dtype it cannot compute in, by name."""
    torch = pytest.importorskip("torch")
    tb = pytest.importorskip("warpkan.torch_bridge")
    with pytest.raises(TypeError, match="dtype must be"):
        getattr(tb, name)(**TORCH_INPUT_LAYERS[name][0], dtype=getattr(torch, dtype))
