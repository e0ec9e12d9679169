"""What the torch layers do with what they do not support: higher-order derivatives, torch.func transforms,
fp16/bf16 conversion, meta tensors and a CUDA device that is not there. Each gets a clear error (or, for
meta tensors, shape inference) instead of a silently wrong result or a raw internal error."""

import pytest
import torch
import warp as wp

import warpkan
from warpkan.torch_bridge import (GEGLUFFN, KATMLP, ChebyKANLinear, GRKANLinear, GroupRational, KANLinear,
                                  PolyKANLinear, UKANLinear, poly_kan)


def _poly_kan_functional(device=None, dtype=None):
    """poly_kan on its own eager route (the functional one, not PolyKANLinear's)."""
    coeffs = torch.nn.Parameter(torch.randn(3, 4, 4, device=device, dtype=dtype or torch.float32) * 0.1)
    return lambda x: poly_kan(x, coeffs, basis="chebyshev")


def _ukan_pairs(device=None, dtype=None):
    layer = UKANLinear(3, 4, table_groups=64, device=device, dtype=dtype)
    layer.dense_max_coefficients = 0  # the sparse touched-pair path (warpkan::ukan_pairs + edge_forward)
    return layer


# name -> (factory(device, dtype), in_features, out_features, what the error names)
LAYERS = {
    "KANLinear": (lambda **kw: KANLinear(3, 4, **kw), 3, 4, r"KANLinear \(warpkan::edge_forward\)"),
    "KANLinear-gemm": (lambda **kw: KANLinear(3, 4, strategy="gemm", **kw), 3, 4, r"KANLinear \(warpkan::edge_forward"),
    "UKANLinear": (lambda **kw: UKANLinear(3, 4, **kw), 3, 4, r"UKANLinear \(warpkan::ukan_"),
    "UKANLinear-fixed": (lambda **kw: UKANLinear(3, 4, table_groups=8, **kw), 3, 4, r"UKANLinear \(warpkan::ukan_"),
    "UKANLinear-pairs": (_ukan_pairs, 3, 4, r"UKANLinear \(warpkan::ukan_"),
    "PolyKANLinear": (lambda **kw: PolyKANLinear(3, 4, degree=3, **kw), 3, 4,
                      r"PolyKANLinear.*\(warpkan::edge_forward\)"),
    "ChebyKANLinear": (lambda **kw: ChebyKANLinear(3, 4, degree=3, mode="exact", **kw), 3, 4,
                       r"ChebyKANLinear \(warpkan::edge_forward\)"),
    "poly_kan": (_poly_kan_functional, 3, 4, r"warpkan::edge_forward"),
    "GroupRational": (lambda **kw: GroupRational(8, num_groups=2, **kw), 8, 8,
                      r"GroupRational \(warpkan::group_rational_forward\)"),
    "GRKANLinear": (lambda **kw: GRKANLinear(8, 4, num_groups=2, **kw), 8, 4,
                    r"GroupRational \(warpkan::group_rational"),
    "KATMLP": (lambda **kw: KATMLP(8, 8, num_groups=2, **kw), 8, 8, r"GroupRational \(warpkan::group_rational"),
    "GEGLUFFN": (lambda **kw: GEGLUFFN(8, 16, **kw), 8, 8, r"GEGLUFFN \(warpkan::geglu_ffn_forward\)"),
}
MODULES = [name for name in LAYERS if name != "poly_kan"]
# the edge families on the engine's differentiable backward and the group-rational layers on the jet kernels
# (tests/test_higher_order.py checks their values)
HIGHER_ORDER_SUPPORTED = ["KANLinear", "KANLinear-gemm", "UKANLinear", "UKANLinear-fixed", "UKANLinear-pairs",
                          "PolyKANLinear", "ChebyKANLinear", "poly_kan", "GroupRational", "GRKANLinear", "KATMLP"]
REFUSED = [name for name in LAYERS if name not in HIGHER_ORDER_SUPPORTED]
# the layers that compute in float32/float64 only (the group-rational family and GEGLUFFN take fp16/bf16)
WIDE_FLOAT_ONLY = ["KANLinear", "UKANLinear", "PolyKANLinear", "ChebyKANLinear"]
HIGHER_ORDER = r"higher-order derivatives .* not yet supported by this op.*create_graph=True.*jet"


def _make(name, device):
    factory, n_in, n_out, label = LAYERS[name]
    return factory(device=torch.device(device)), n_in, n_out, label


def _x(n_in, device, *lead, requires_grad=True):
    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(*lead, 5, n_in, generator=gen) * 1.6 - 0.8).to(device)
    return x.requires_grad_(requires_grad)


# ------------------------------------------------------------------ higher-order derivatives
@pytest.mark.parametrize("name", REFUSED)
def test_create_graph_refused(device, name):
    """create_graph=True used to return a derivative detached from the graph (a physics-informed residual
    silently lost a term); the layers without a differentiable backward refuse, naming the layer and its op."""
    layer, n_in, _, label = _make(name, device)
    x = _x(n_in, device)
    with pytest.raises(NotImplementedError, match=label + ".*" + HIGHER_ORDER):
        torch.autograd.grad(layer(x).square().sum(), x, create_graph=True)
    # also when only parameters are differentiated (x constant)
    if isinstance(layer, torch.nn.Module):
        params = [p for p in layer.parameters() if p.requires_grad]
        with pytest.raises(NotImplementedError, match=HIGHER_ORDER):
            torch.autograd.grad(layer(x.detach()).sum(), params, create_graph=True)


@pytest.mark.parametrize("name", REFUSED)
def test_create_graph_refused_by_registered_op(device, name, monkeypatch):
    """The same refusal in the registered ops' autograd formulas (``register_autograd``, what traced code
    differentiates): the layers call the registered ops whenever use_registered_op says so."""
    layer, n_in, _, label = _make(name, device)
    if name == "UKANLinear":
        pytest.skip("table_groups=None reads a row count back: it refuses tracing (covered by UKANLinear-fixed)")
    # the layers' own predicate, not torch.compiler.is_compiling: patching that one while torch builds its
    # Dynamo trace rules (on a first custom-op call) leaves Dynamo unable to trace the real one afterwards
    import warpkan.torch_bridge._common as common
    import warpkan.torch_bridge.ukan as ukan_layer
    import warpkan.torch_bridge.ukan_ops as ukan_ops

    for module in (common, ukan_layer, ukan_ops):
        monkeypatch.setattr(module, "use_registered_op", lambda x: True)
    x = _x(n_in, device)
    with pytest.raises(NotImplementedError, match=label + ".*" + HIGHER_ORDER):
        torch.autograd.grad(layer(x).square().sum(), x, create_graph=True)
    monkeypatch.undo()
    (dx,) = torch.autograd.grad(layer(x).square().sum(), x)  # first order still works
    assert dx.shape == x.shape


@pytest.mark.parametrize("name", HIGHER_ORDER_SUPPORTED)
@pytest.mark.parametrize("registered", [False, True])
def test_create_graph_supported(device, name, registered, monkeypatch):
    """The edge families on the engine give gradients as graphs with create_graph=True, on the eager route and
    through the registered ops' formulas alike: the derivative of a first derivative is what torch's own
    double backward of the float64 reference would give (tests/test_higher_order.py), here checked to be
    connected: a loss of dx has a gradient in x and in every parameter."""
    layer, n_in, _, _ = _make(name, device)
    if registered:
        if name == "UKANLinear":
            pytest.skip("table_groups=None reads a row count back: it refuses tracing (covered by UKANLinear-fixed)")
        import warpkan.torch_bridge._common as common
        import warpkan.torch_bridge.ukan as ukan_layer
        import warpkan.torch_bridge.ukan_ops as ukan_ops

        for module in (common, ukan_layer, ukan_ops):
            monkeypatch.setattr(module, "use_registered_op", lambda x: True)
    x = _x(n_in, device)
    (dx,) = torch.autograd.grad(layer(x).square().sum(), x, create_graph=True)
    assert dx.requires_grad
    params = [p for p in layer.parameters() if p.requires_grad] if isinstance(layer, torch.nn.Module) else []
    grads = torch.autograd.grad(dx.square().sum(), [x, *params], allow_unused=True)
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
    assert any(float(g.abs().sum()) > 0 for g in grads)


@pytest.mark.parametrize("name", list(LAYERS))
def test_first_order_unchanged(device, name):
    """Plain backward and torch.autograd.grad without create_graph: gradients as before, equal to each other."""
    layer, n_in, _, _ = _make(name, device)
    x = _x(n_in, device)
    (dx,) = torch.autograd.grad(layer(x).square().sum(), x)
    assert not dx.requires_grad
    layer(x).square().sum().backward()
    torch.testing.assert_close(x.grad, dx, rtol=0, atol=0)
    if isinstance(layer, torch.nn.Module):
        assert all(p.grad is not None for p in layer.parameters() if p.requires_grad)


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("name", ["KANLinear", "UKANLinear", "PolyKANLinear", "GRKANLinear", "GEGLUFFN"])
def test_activation_checkpointing_still_works(name, reentrant):
    """Activation checkpointing recomputes the forward with grad mode on, inside the backward pass: the
    first-order check must not mistake that for create_graph."""
    from torch.utils.checkpoint import checkpoint

    layer, n_in, _, _ = _make(name, "cpu")
    x = _x(n_in, "cpu")
    (expected,) = torch.autograd.grad(layer(x).square().sum(), x)
    x2 = x.detach().requires_grad_()
    checkpoint(layer, x2, use_reentrant=reentrant).square().sum().backward()
    torch.testing.assert_close(x2.grad, expected, rtol=0, atol=0)


def test_create_graph_through_torch_compile_is_not_silent():
    """Traced code differentiates a compiled graph, whose double backward torch itself refuses: at the latest
    when the derivative is differentiated again."""
    layer = KANLinear(3, 4)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x = _x(3, "cpu")
    with pytest.raises(RuntimeError):
        (dx,) = torch.autograd.grad(compiled(x).square().sum(), x, create_graph=True)
        torch.autograd.grad(dx.sum(), x)


# ------------------------------------------------------------------ torch.func transforms
# name -> (the transform applied to f at x, how the error names it)
TRANSFORMS = {
    "vmap": (lambda f, x: torch.func.vmap(f)(x.unsqueeze(0).expand(2, *x.shape)), r"torch\.func\.vmap is.*leading"),
    "grad": (lambda f, x: torch.func.grad(lambda t: f(t).sum())(x), r"torch\.func\.grad is"),
    "grad_and_value": (lambda f, x: torch.func.grad_and_value(lambda t: f(t).sum())(x),
                       r"torch\.func\.grad_and_value is"),
    "vjp": (lambda f, x: torch.func.vjp(f, x), r"torch\.func\.vjp is"),
    "jacrev": (lambda f, x: torch.func.jacrev(f)(x), r"torch\.func\.jacrev is"),
    "jvp": (lambda f, x: torch.func.jvp(f, (x,), (torch.ones_like(x),)), r"torch\.func\.jvp is"),
    "jacfwd": (lambda f, x: torch.func.jacfwd(f)(x), r"torch\.func\.jacfwd is"),
    "hessian": (lambda f, x: torch.func.hessian(lambda t: f(t).sum())(x), r"torch\.func\.hessian \(jacfwd of jacrev\) is"),
    "vmap-of-grad": (lambda f, x: torch.func.vmap(torch.func.grad(lambda t: f(t).sum()))(x.unsqueeze(0)),
                     r"torch\.func\.vmap of torch\.func\.grad is"),
}
# the transforms of derivatives, whose error points to the torch routes that give them
DERIVATIVE_TRANSFORMS = ["grad", "vjp", "jacrev", "jvp", "jacfwd", "hessian"]


@pytest.mark.parametrize("transform", list(TRANSFORMS))
@pytest.mark.parametrize("name", list(LAYERS))
def test_functorch_transforms_refused(name, transform):
    """torch.func transforms cannot run the Warp kernels (no batching rule, no forward-mode formula, and the
    kernels need real storage); they get an error naming the transform and the layer, not an internal one."""
    layer, n_in, _, label = _make(name, "cpu")
    run, names = TRANSFORMS[transform]
    x = _x(n_in, "cpu", requires_grad=False)
    with pytest.raises(NotImplementedError, match=label + r"[^:]*: " + names):
        run(layer, x)


def test_tensors_made_under_tracing_or_transforms_are_not_cached():
    """The module-level tensor caches (a LUT layer's tables, the stencil kernels' unit scaler, the UKAN
    reference's basis matrix) keep no tensor made under a fake mode (the registered poly_lut_tables runs its
    implementation there with a real x in a cold inductor cache's compile) or a torch.func transform (a layer
    called in one makes its tables before it refuses): those have no storage once the mode or transform is
    gone, and the next eager call failed on them ("Cannot access data pointer"), which made the suite flaky."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from warpkan.reference import ukan as ukan_ref
    from warpkan.torch_bridge import edge_ops, poly_ops

    caches = (poly_ops._tables_cache, edge_ops._ONES, ukan_ref._BASIS_MATRICES)

    def cached():
        return [t for cache in caches for value in cache.values() for t in (value if isinstance(value, tuple)
                                                                             else (value,))]

    for cache in caches:
        cache.clear()
    layer = PolyKANLinear(4, 3, 5, mode="lut", lut_size=64)
    x = torch.randn(5, 4)
    with FakeTensorMode():
        poly_ops._cached_tables(x, "chebyshev", 6, 64, 1.0, 1.0)
        edge_ops._unit_scaler(x, 4, 3)
        ukan_ref._basis_matrix(3, torch.float32, torch.device("cpu"))
    with pytest.raises(NotImplementedError, match="torch.func"):
        torch.func.grad(lambda x: layer(x).sum())(x)
    torch.func.grad(lambda t: (ukan_ref._basis_matrix(2, torch.float32, torch.device("cpu")) * t).sum())(x[0, 0])
    assert not cached()
    layer(x).sum().backward()  # the eager calls make and cache real tensors, and run on them
    layer.strategy = "stencil"
    layer(x).sum().backward()
    ukan_ref._basis_matrix(3, torch.float32, torch.device("cpu"))
    assert cached() and all(type(t) is torch.Tensor and t.data_ptr() for t in cached())


@pytest.mark.parametrize("transform", DERIVATIVE_TRANSFORMS)
def test_derivative_transform_error_points_to_the_torch_routes(transform):
    """The refusal of a derivative transform names what gives those derivatives through the layers in torch
    (autograd with create_graph=True, Taylor mode), not a Warp-native detour."""
    run, _ = TRANSFORMS[transform]
    with pytest.raises(NotImplementedError) as caught:
        run(KANLinear(3, 1), _x(3, "cpu", requires_grad=False))
    message = str(caught.value)
    assert "create_graph=True" in message and "warpkan.torch_bridge.jet" in message
    assert "Warp-native" not in message


def test_vmap_error_suggests_the_leading_dimensions():
    layer = KANLinear(3, 4)
    with pytest.raises(NotImplementedError, match=r"\(\.\.\., in\)"):
        torch.func.vmap(layer)(torch.rand(2, 5, 3))
    # the suggested form: the vmapped dimension as a leading dimension of x
    x = torch.rand(2, 5, 3)
    torch.testing.assert_close(layer(x), torch.stack([layer(x[0]), layer(x[1])]))


def test_forward_mode_ad_refused():
    import torch.autograd.forward_ad as fwAD

    layer = KANLinear(3, 4)
    with fwAD.dual_level():
        x = fwAD.make_dual(torch.rand(5, 3), torch.rand(5, 3))
        with pytest.raises(NotImplementedError, match=r"KANLinear \(warpkan::edge_forward\).*forward-mode"):
            layer(x)


# ------------------------------------------------------------------ fp16 / bf16
CONVERSIONS = {
    "half": lambda m: m.half(),
    "bfloat16": lambda m: m.bfloat16(),
    "to(bfloat16)": lambda m: m.to(torch.bfloat16),
    "to(dtype=float16)": lambda m: m.to(dtype=torch.float16),
    "type(float16)": lambda m: m.type(torch.float16),
}


@pytest.mark.parametrize("conversion", list(CONVERSIONS))
@pytest.mark.parametrize("name", WIDE_FLOAT_ONLY)
def test_half_conversion_refused_and_state_unchanged(device, name, conversion):
    layer, n_in, _, _ = _make(name, device)
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    strides = {k: v.stride() for k, v in layer.named_parameters()}
    with pytest.raises(TypeError, match=rf"{type(layer).__name__} computes in float32 or float64.*torch\.autocast"):
        CONVERSIONS[conversion](layer)
    after = layer.state_dict()
    assert before.keys() == after.keys()
    for key, value in before.items():
        assert after[key].dtype == value.dtype, key
        torch.testing.assert_close(after[key], value, rtol=0, atol=0)
    assert {k: v.stride() for k, v in layer.named_parameters()} == strides
    layer(_x(n_in, device))  # still usable


@pytest.mark.parametrize("layer", [KANLinear, UKANLinear, PolyKANLinear, ChebyKANLinear])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_dtype_refused_at_construction(layer, dtype):
    with pytest.raises(TypeError, match="dtype must be float32 or float64"):
        layer(3, 4, degree=3, dtype=dtype) if issubclass(layer, PolyKANLinear) else layer(3, 4, dtype=dtype)


@pytest.mark.parametrize("name", WIDE_FLOAT_ONLY)
def test_double_float_and_autocast_still_work(device, name):
    layer, n_in, n_out, _ = _make(name, device)
    x = _x(n_in, device)
    y32 = layer(x)
    layer.double()
    assert all(p.dtype == torch.float64 for p in layer.parameters())
    y64 = layer(x.double())
    assert y64.dtype == torch.float64
    torch.testing.assert_close(y64.float(), y32, rtol=1e-4, atol=1e-5)
    layer.float()
    assert all(p.dtype == torch.float32 for p in layer.parameters())
    layer.to(torch.device(device), torch.float32)
    with torch.autocast(device, dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16 and y.shape == (5, n_out)
    y.float().sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float32


@pytest.mark.parametrize("name", ["GroupRational", "GRKANLinear", "KATMLP", "GEGLUFFN"])
def test_native_half_layers_still_convert(name):
    """The group-rational layers and GEGLUFFN compute fp16/bf16 natively (fp32 arithmetic inside): their
    conversion stays allowed."""
    layer, _, _, _ = _make(name, "cpu")
    layer.to(torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in layer.parameters())
    layer.half()
    assert all(p.dtype == torch.float16 for p in layer.parameters())


# ------------------------------------------------------------------ meta tensors
@pytest.mark.parametrize("name", MODULES)
def test_meta_device_infers_shapes(name):
    """Built on the meta device, a layer infers output shapes (as nn.Linear does), gradients included."""
    layer, n_in, n_out, _ = _make(name, "meta")
    assert all(p.is_meta for p in layer.parameters())
    x = torch.empty(2, 7, n_in, device="meta", requires_grad=True)
    y = layer(x)
    assert y.is_meta and y.shape == (2, 7, n_out) and y.dtype == torch.float32
    y.sum().backward()
    assert x.grad.is_meta and x.grad.shape == x.shape
    assert all(p.grad is not None and p.grad.is_meta for p in layer.parameters() if p.requires_grad)
    with pytest.raises(ValueError, match="device"):
        layer(torch.zeros(5, n_in))  # a real x on a meta layer


@pytest.mark.parametrize("name", WIDE_FLOAT_ONLY)
def test_meta_layer_to_empty(name):
    """The deferred-initialisation pattern: build on meta, then allocate on a real device."""
    layer, n_in, n_out, _ = _make(name, "meta")
    layer.to_empty(device="cpu")
    assert all(p.device.type == "cpu" for p in layer.parameters())


# ------------------------------------------------------------------ a CUDA device that is not there
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("name", MODULES)
def test_cuda_device_without_cuda(name):
    with pytest.raises(ValueError, match=r"device='cuda'.*no CUDA device is available"):
        LAYERS[name][0](device="cuda")


@pytest.mark.skipif(wp.is_cuda_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("make", [
    lambda: warpkan.KANLinear(2, 3, device="cuda"),
    lambda: warpkan.UKANLinear(2, 3, device="cuda"),
    lambda: warpkan.PolyKANLinear(2, 3, degree=3, device="cuda"),
    lambda: warpkan.ChebyKANLinear(2, 3, degree=3, device="cuda"),
    lambda: warpkan.GroupRational(8, num_groups=2, device="cuda"),
    lambda: warpkan.GRKANLinear(8, 4, num_groups=2, device="cuda"),
], ids=["KANLinear", "UKANLinear", "PolyKANLinear", "ChebyKANLinear", "GroupRational", "GRKANLinear"])
def test_native_cuda_device_without_cuda(make):
    with pytest.raises(ValueError, match=r"device='cuda'.*no CUDA device is available"):
        make()


@pytest.mark.parametrize("bad", ["mps", "nonsense", 3.5])
def test_unsupported_device_named(bad):
    with pytest.raises(ValueError, match=r"device"):
        KANLinear(3, 4, device=bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_warp_device_and_stream_of_an_indexless_cuda_device():
    """torch.device("cuda") (no index) means torch's current device, for the Warp device and stream alike."""
    from warpkan.torch_bridge._common import warp_device, warp_stream

    indexed = torch.device("cuda", torch.cuda.current_device())
    assert warp_device(torch.device("cuda")) is warp_device(indexed)
    assert warp_stream(torch.device("cuda")) is warp_stream(indexed)


_ROWS_LAYERS = {
    "KANLinear": lambda dev: KANLinear(4, 3, grid_size=5, dtype=torch.float64, device=dev),
    "PolyKANLinear": lambda dev: warpkan.torch_bridge.PolyKANLinear(4, 3, 5, dtype=torch.float64, device=dev),
    "PolyKANLinear lut": lambda dev: warpkan.torch_bridge.PolyKANLinear(4, 3, 5, mode="lut", dtype=torch.float64,
                                                                         device=dev),
    "GroupRational": lambda dev: GroupRational(4, num_groups=2, dtype=torch.float64, device=dev),
}


@pytest.mark.parametrize("name", list(_ROWS_LAYERS))
def test_nd_input_is_seen_as_rows_inside_the_node(device, name, eager_step_ops):
    """The eager routes take x (..., in) whole and see its rows inside their autograd node (no view node on
    either side): the output, the gradients, and with create_graph=True the first and second x-derivatives and
    the parameter gradients of a loss built from them are those of the same rows given as a 2-D x."""
    dev = torch.device(device)
    torch.manual_seed(0)
    layer = _ROWS_LAYERS[name](dev)
    x3 = (torch.rand(2, 5, 4, dtype=torch.float64, device=dev) * 1.6 - 0.8).requires_grad_()
    x2 = x3.detach().reshape(10, 4).requires_grad_()
    results = []
    for x in (x3, x2):
        y = layer(x)
        dx, = torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)
        dxx, = torch.autograd.grad(dx.sum(), x, create_graph=True)
        loss = dx.pow(2).sum() + dxx.pow(2).sum()
        params = torch.autograd.grad(loss, list(layer.parameters()), allow_unused=True)
        results.append([y.reshape(10, -1), dx.reshape(10, 4), dxx.reshape(10, 4),
                        *(p for p in params if p is not None)])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    if device == "cpu":  # the node count is host bookkeeping: the same on every device
        ops = eager_step_ops(layer, x3, torch.ones(2, 5, layer(x2).shape[-1], dtype=torch.float64))
        nodes = {op for op in ops if op.startswith("autograd::engine::evaluate_function")}
        assert not any("View" in node or "Reshape" in node for node in nodes), nodes
        assert len(nodes) == 2, nodes  # the layer's node and AccumulateGrad


_AUTOCAST_LAYERS = {
    "KANLinear gemm": lambda dev: KANLinear(8, 6, grid_size=4, strategy="gemm", device=dev),
    "KANLinear stencil": lambda dev: KANLinear(8, 6, grid_size=4, strategy="stencil", device=dev),
    "KANLinear gemm, torch base": lambda dev: KANLinear(8, 6, grid_size=4, strategy="gemm",
                                                       base_activation=torch.nn.GELU, device=dev),
    "PolyKANLinear": lambda dev: PolyKANLinear(8, 6, 5, bias=True, device=dev),
    "PolyKANLinear lut": lambda dev: PolyKANLinear(8, 6, 5, mode="lut", bias=True, device=dev),
    # the dense-range path, on either strategy (its node runs the CG-MLP too)
    "UKANLinear gemm": lambda dev: UKANLinear(8, 6, grid_delta=0.5, table_groups=6, strategy="gemm", device=dev),
    "UKANLinear stencil": lambda dev: UKANLinear(8, 6, grid_delta=0.5, table_groups=6, strategy="stencil",
                                                 device=dev),
}


@pytest.mark.parametrize("name", list(_AUTOCAST_LAYERS))
def test_autocast_output_is_made_inside_the_node(device, name, eager_step_ops):
    """Under bf16 autocast an edge layer computes in fp32 (autocast off) and returns bf16. Its node gives y in
    bf16 itself (the bf16 GEMM's own output on the gemm path; a conversion inside on the other routes) and
    takes the bf16 dy: no fp32 copy of y or dy, no cast nodes around it. The results are those of the layer
    run outside autocast at the precision "auto" resolves to (bf16), its y rounded to bf16: bitwise, but for
    the bias gradient (an fp32 sum of the same values, whose order the reduction kernel picks by dtype). And
    "auto" is the bf16 path: not the fp32 result rounded (PolyKANLinear once resolved it with autocast off)."""
    dev = torch.device(device)
    torch.manual_seed(0)
    layer = _AUTOCAST_LAYERS[name](dev)
    x = torch.randn(10, 8, device=dev)
    dy = torch.randn(10, 6, device=dev).bfloat16()

    def run(precision, autocast):
        layer.precision = precision
        xg = x.clone().requires_grad_()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
            y = layer(xg)
        layer.zero_grad(set_to_none=True)
        y.backward(dy if autocast else dy.float())
        return [y.detach(), xg.grad] + [p.grad.clone() for p in layer.parameters()]

    y, *grads = run("auto", True)
    assert y.dtype == torch.bfloat16
    want, *want_grads = run("bf16", False)
    assert torch.equal(y, want.to(torch.bfloat16))
    for (param_name, _), got, expected in zip([("x", None), *layer.named_parameters()], grads, want_grads):
        if param_name == "bias":
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-5)
        else:
            assert torch.equal(got, expected), param_name
    exact = run("fp32", False)[0]
    # no bf16 path on the stencil kernels (an eager CUDA call of a small polynomial layer takes them:
    # single_slot_strategy); elsewhere the GEMM's rounding is added to fp32
    stencil = "stencil" in name or (name.startswith("PolyKANLinear") and dev.type == "cuda")
    if not stencil and "torch base" not in name:
        assert not torch.equal(y, exact.to(torch.bfloat16))
    assert torch.equal(run("fp32", True)[0], exact.to(torch.bfloat16))
    if device == "cpu":  # the node count is host bookkeeping: the same on every device
        layer.precision = "auto"
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ops = eager_step_ops(layer, x.clone().requires_grad_(), dy)
        nodes = {op for op in ops if op.startswith("autograd::engine::evaluate_function")}
        assert not any("ToCopy" in node for node in nodes) or "torch base" in name, nodes


@pytest.mark.parametrize("small_batch_rows", [0, 64])  # the concatenated GEMM path, the weight-streaming one
def test_geglu_nd_input_is_seen_as_rows_inside_the_node(device, small_batch_rows, eager_step_ops):
    """GEGLUFFN's eager route takes x (..., hidden) whole, as the edge layers' do: the output and gradients of a
    3-D x are those of its rows as a 2-D x, and a step runs no view node."""
    dev = torch.device(device)
    torch.manual_seed(0)
    layer = GEGLUFFN(8, 12, bias=True, small_batch_rows=small_batch_rows, dtype=torch.float64, device=dev)
    x3 = torch.randn(2, 5, 8, dtype=torch.float64, device=dev, requires_grad=True)
    x2 = x3.detach().reshape(10, 8).requires_grad_()
    dy = torch.randn(10, 8, dtype=torch.float64, device=dev)
    results = []
    for x in (x3, x2):
        y = layer(x)
        grads = torch.autograd.grad(y, [x, *layer.parameters()], dy.view(y.shape))
        results.append([y.reshape(10, 8), grads[0].reshape(10, 8), *grads[1:]])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    if device == "cpu":
        ops = eager_step_ops(layer, x3, dy.view(2, 5, 8))
        nodes = {op for op in ops if op.startswith("autograd::engine::evaluate_function")}
        assert not any("View" in node or "Reshape" in node for node in nodes), nodes
