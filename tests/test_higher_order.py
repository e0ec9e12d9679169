"""Higher-order derivatives through the torch bridge: create_graph=True for the edge families on the engine.

KANLinear (every strategy, uniform and general grids, deterministic or not) and PolyKANLinear / poly_kan (exact
and LUT, whose derivatives there are the exact basis's) give gradients as differentiable graphs: u_x, u_xx and
the parameter gradients of a loss built from them (a physics-informed residual) are checked against float64
pure-torch references, and float64 ``gradgradcheck`` against finite differences. The engine's bases carry x-derivatives to the third order; a
fourth is refused by name."""

import pytest
import torch

from warpkan.reference import bspline as ref_bspline
from warpkan.reference import poly as ref_poly
from warpkan.torch_bridge import KANLinear, PolyKANLinear, bspline_kan, poly_kan

DOUBLE = torch.float64


def _grid(n_in, grid_size, order, perturb=0.0, seed=0):
    h = 2.0 / grid_size
    knots = torch.arange(-order, grid_size + order + 1, dtype=DOUBLE) * h - 1.0
    grid = knots.expand(n_in, -1).clone()
    if perturb:
        gen = torch.Generator().manual_seed(seed)
        grid += perturb * h * (torch.rand(grid.shape, generator=gen, dtype=DOUBLE) - 0.5)
        grid = torch.sort(grid, dim=1).values
    return grid


def _params(n_out, n_in, n_coef, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    make = lambda *shape: (torch.randn(*shape, generator=gen, dtype=DOUBLE) * 0.5).to(device).requires_grad_()  # noqa: E731
    return make(n_out, n_in), make(n_out, n_in, n_coef), make(n_out, n_in)


def _x(n_rows, n_in, device, lo=-0.9, hi=0.9, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return (lo + (hi - lo) * torch.rand(n_rows, n_in, generator=gen, dtype=DOUBLE)).to(device).requires_grad_()


def _derivatives(f, x):
    """(y, u_x, u_xx, loss) with u = sum of f's outputs, its first and second x-derivatives as graphs."""
    y = f(x)
    (u_x,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    (u_xx,) = torch.autograd.grad(u_x.sum(), x, create_graph=True)
    loss = (u_xx.square() * 0.3 + u_x.square() + y.square().sum(-1, keepdim=True)).mean()
    return y, u_x, u_xx, loss


@pytest.mark.parametrize("strategy", ["stencil", "gemm"])
@pytest.mark.parametrize("uniform,use_base,deterministic,order,grid_size", [
    (True, True, False, 3, 7), (False, True, True, 3, 7), (True, False, False, 2, 7), (False, False, False, 5, 7),
    (True, True, True, 1, 7),
    # fine grids: windows far from most of an input's coefficient rows
    (True, True, False, 3, 40), (False, False, False, 2, 45),
])
def test_kan_second_derivatives_and_their_parameter_gradients(device, strategy, uniform, use_base, deterministic,
                                                               order, grid_size):
    n_in, n_out = 3, 4
    grid = _grid(n_in, grid_size, order, perturb=0.0 if uniform else 0.4).to(device)
    base_weight, spline_weight, spline_scaler = _params(n_out, n_in, grid_size + order, device)
    params = [spline_weight, spline_scaler] + ([base_weight] if use_base else [])
    x = _x(29, n_in, device)

    def ours(x):
        return bspline_kan(x, grid, base_weight if use_base else None, spline_weight, spline_scaler, order, uniform,
                           deterministic=deterministic, strategy=strategy)

    def reference(x):
        return ref_bspline.kan_linear(x, grid, base_weight, spline_weight, spline_scaler, order, use_base=use_base)

    runs = []
    for f in (ours, reference):
        y, u_x, u_xx, loss = _derivatives(f, x)
        grads = torch.autograd.grad(loss, params + [x])
        runs.append((y, u_x, u_xx, *grads))
    names = ["y", "u_x", "u_xx"] + [f"d loss / d {p}" for p in ("spline_weight", "spline_scaler", "base_weight")[:len(params)]] + ["d loss / d x"]
    for name, a, b in zip(names, *runs):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)


@pytest.mark.parametrize("strategy", ["stencil", "gemm"])
def test_kan_gradgradcheck(device, strategy):
    n_in, n_out, grid_size, order = 2, 3, 4, 3
    grid = _grid(n_in, grid_size, order).to(device)
    base_weight, spline_weight, spline_scaler = _params(n_out, n_in, grid_size + order, device, seed=3)
    x = _x(6, n_in, device, seed=4)
    f = lambda x, bw, sw, ss: bspline_kan(x, grid, bw, sw, ss, order, True, strategy=strategy)  # noqa: E731
    assert torch.autograd.gradgradcheck(f, (x, base_weight, spline_weight, spline_scaler))


@pytest.mark.parametrize("strategy", ["stencil", "gemm"])
@pytest.mark.parametrize("basis", ["chebyshev", "legendre", "hermite", "gegenbauer", "jacobi", "fourier"])
def test_poly_exact_second_derivatives_and_gradgradcheck(device, basis, strategy):
    alpha, beta = {"gegenbauer": (1.5, 1.0), "jacobi": (0.5, -0.3)}.get(basis, (1.0, 1.0))
    gen = torch.Generator().manual_seed(5)
    coeffs = (torch.randn(3, 6, 4, generator=gen, dtype=DOUBLE) * 0.3).to(device).requires_grad_()
    bias = torch.randn(4, generator=gen, dtype=DOUBLE).to(device).requires_grad_()
    x = _x(17, 3, device, lo=-2.0, hi=2.0, seed=6)
    ours = lambda x: poly_kan(x, coeffs, bias, basis, 0, alpha, beta, strategy)  # noqa: E731
    reference = lambda x: ref_poly.poly_kan(x, coeffs, bias, basis, alpha, beta)  # noqa: E731
    runs = []
    for f in (ours, reference):
        y, u_x, u_xx, loss = _derivatives(f, x)
        runs.append((y, u_x, u_xx, *torch.autograd.grad(loss, [coeffs, bias, x])))
    for name, a, b in zip(["y", "u_x", "u_xx", "d coeffs", "d bias", "d x"], *runs):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=name)
    small = _x(4, 3, device, seed=7)
    f = lambda x, c, b: poly_kan(x, c, b, basis, 0, alpha, beta, strategy)  # noqa: E731
    assert torch.autograd.gradgradcheck(f, (small, coeffs, bias))


LUT_BASES = [("chebyshev", 1.0, 1.0), ("legendre", 1.0, 1.0), ("jacobi", 0.5, -0.3), ("fourier", 1.0, 1.0)]


def _x_derivatives(layer, x, route):
    """(u_x, u_xx, d loss / d coeffs) of u = the sum of the layer's outputs (u_xx: the diagonal of the Hessian,
    which is all of it: each edge reads one input), by create_graph=True or by Taylor mode, with loss =
    mean(u_x^2 + 0.3 u_xx^2), the parameter gradient of a residual built from the derivatives alone."""
    from warpkan.torch_bridge import jet

    if route == "jet":
        out = jet(layer, x.detach(), pairs=[(a, a) for a in range(x.shape[1])])
        u_x = torch.stack([out.d(a).sum(-1) for a in range(x.shape[1])], -1)
        u_xx = torch.stack([out.d2(a, a).sum(-1) for a in range(x.shape[1])], -1)
    else:
        x = x.detach().requires_grad_()
        (u_x,) = torch.autograd.grad(layer(x).sum(), x, create_graph=True)
        (u_xx,) = torch.autograd.grad(u_x.sum(), x, create_graph=True)
    loss = (u_x.square() + 0.3 * u_xx.square()).mean()
    (d_coeffs,) = torch.autograd.grad(loss, [layer.coeffs])
    return u_x.detach(), u_xx.detach(), d_coeffs


class _ReferencePolyLayer(torch.nn.Module):
    """A polynomial layer's parameters in float64 pure torch (``warpkan.reference.poly``)."""

    def __init__(self, layer):
        super().__init__()
        self.basis, self.alpha, self.beta = layer.basis, layer.alpha, layer.beta
        self.coeffs = torch.nn.Parameter(layer.coeffs.detach().double().clone())

    def forward(self, x):
        return ref_poly.poly_kan(x, self.coeffs.permute(0, 2, 1), None, self.basis, self.alpha, self.beta)


@pytest.mark.parametrize("route", ["create_graph", "jet"])
@pytest.mark.parametrize("basis,alpha,beta", LUT_BASES)
def test_poly_lut_derivatives_are_exact(device, route, basis, alpha, beta):
    """A LUT layer's x-derivatives by create_graph=True and by Taylor mode (u_x, u_xx, and the coefficient
    gradient of a loss made of them) are the exact basis's: against the float64 reference they err no more than
    the same layer in exact mode does in float32. (The interpolant's are off by O(h) in u_xx and O(h^2) in u_x:
    a few percent and ~1e-5 at degree 8 and 4096 points, hundreds of times exact mode's float32 error.)"""
    torch.manual_seed(0)
    lut = PolyKANLinear(3, 4, 8, basis=basis, alpha=alpha, beta=beta, mode="lut", device=device)
    exact = PolyKANLinear(3, 4, 8, basis=basis, alpha=alpha, beta=beta, mode="exact", device=device)
    exact.load_state_dict(lut.state_dict())
    reference = _ReferencePolyLayer(lut)
    x64 = _x(257, 3, device, lo=-2.5, hi=2.5).detach()
    x32 = x64.float()
    ref64 = _x_derivatives(reference, x64, "create_graph")
    exact32 = _x_derivatives(exact, x32, route)
    ours = _x_derivatives(lut, x32, route)
    for name, a, e32, r64 in zip(["u_x", "u_xx", "d loss / d coeffs"], ours, exact32, ref64):
        exact_err = float((e32.double() - r64).abs().max())
        err = float((a.double() - r64).abs().max())
        scale = float(r64.abs().max())
        assert err <= 2 * exact_err + 1e-7 * scale, (
            f"{name}: error {err:.3e} against float64, exact mode's float32 error {exact_err:.3e} (scale {scale:.2e})")


def test_poly_lut_network_derivatives_match_the_lut_reference(device):
    """A 2 -> 4 -> 1 network of LUT layers (the second reads the first's table values) by create_graph=True:
    u, u_x, the second derivatives, and the parameter gradients of a loss made of the derivatives, against
    ``reference.poly.poly_kan_lut`` (the tables' values, the exact basis's derivatives) in float64."""
    torch.manual_seed(0)
    layers = [PolyKANLinear(2, 4, 6, basis="legendre", mode="lut", lut_size=257, bias=True, dtype=DOUBLE,
                            device=device),
              PolyKANLinear(4, 1, 5, basis="jacobi", alpha=0.5, beta=-0.3, mode="lut", lut_size=513, dtype=DOUBLE,
                            device=device)]
    params = [p for layer in layers for p in layer.parameters()]

    def ours(z):
        return layers[1](layers[0](z))

    def reference(z):
        for layer in layers:
            z = ref_poly.poly_kan_lut(z, layer.coeffs.permute(0, 2, 1), layer.lut_size, layer.bias, layer.basis,
                                      layer.alpha, layer.beta)
        return z

    x = _x(41, 2, device, lo=-2.0, hi=2.0)
    runs = []
    for f in (ours, reference):
        y = f(x)
        (u_x,) = torch.autograd.grad(y.sum(), x, create_graph=True)
        (u_xx,) = torch.autograd.grad(u_x[:, 0].sum(), x, create_graph=True)
        loss = (u_x.square().sum(-1) + u_xx.square().sum(-1)).mean()
        runs.append((y, u_x, u_xx, *torch.autograd.grad(loss, params)))
    names = ["u", "u_x", "d u_x / dx"] + [f"d loss / d {name}" for name in ("coeffs 0", "bias 0", "coeffs 1")]
    for name, a, b in zip(names, *runs):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=name)


def test_pinn_heat_residual_parameter_gradients(device):
    """A 2 -> 5 -> 1 KAN u(x, t) and the heat residual u_t - nu u_xx: the loss's parameter gradients match the
    float64 pure-torch (efficient-kan formula) network with the same parameters."""
    torch.manual_seed(0)
    layers = [KANLinear(2, 5, grid_size=5, dtype=DOUBLE, device=device),
              KANLinear(5, 1, grid_size=5, dtype=DOUBLE, device=device)]
    xt = _x(64, 2, device)
    nu = 0.1

    def ours(z):
        return layers[1](layers[0](z))

    def reference(z):
        for layer in layers:
            z = ref_bspline.kan_linear(z, layer.grid, layer.base_weight, layer.spline_weight, layer.spline_scaler,
                                       layer.spline_order)
        return z

    runs = []
    for f in (ours, reference):
        u = f(xt)
        (du,) = torch.autograd.grad(u.sum(), xt, create_graph=True)
        (d2u,) = torch.autograd.grad(du[:, 0].sum(), xt, create_graph=True)
        residual = du[:, 1] - nu * d2u[:, 0]
        loss = residual.square().mean()
        params = [p for layer in layers for p in layer.parameters()]
        runs.append((loss, *torch.autograd.grad(loss, params)))
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_fourth_x_derivative_is_refused_by_name(device):
    layer = KANLinear(1, 1, grid_size=5, dtype=DOUBLE, device=device)
    x = _x(5, 1, device)
    u = layer(x).sum()
    g = x
    grads = []
    for _ in range(3):
        (g,) = torch.autograd.grad(u if not grads else grads[-1].sum(), x, create_graph=True)
        grads.append(g)
    with pytest.raises(NotImplementedError, match="order 4 in x"):
        torch.autograd.grad(grads[-1].sum(), x, create_graph=True)


@pytest.mark.parametrize("path", ["range", "pairs"])
@pytest.mark.parametrize("registered", [False, True])
@pytest.mark.parametrize("base", ["silu", None])
def test_ukan_second_derivatives(device, base, registered, path, monkeypatch):
    """UKANLinear on either path: the dense range (the default while the data's span is short) and the sparse
    touched pairs (an outlier, here forced), whose table the engine reads per feature. u_x, u_xx and the
    parameter gradients of a loss of them (the CG-MLP's included) against the float64 reference, on the eager
    route and through the registered ops."""
    from warpkan.reference import ukan as ref_ukan
    from warpkan.torch_bridge import UKANLinear

    torch.manual_seed(0)
    layer = UKANLinear(3, 2, spline_order=3, grid_delta=0.3, pe_dim=4, embed_dim=3, hidden_dim=6,
                       base_activation=base, table_groups=None if not registered else 6, dtype=DOUBLE, device=device)
    if path == "pairs":
        layer.table_groups = None if not registered else 64
        layer.dense_max_coefficients = 0
    if registered:
        import warpkan.torch_bridge._common as common
        import warpkan.torch_bridge.ukan as ukan_layer
        import warpkan.torch_bridge.ukan_ops as ukan_ops

        for module in (common, ukan_layer, ukan_ops):
            monkeypatch.setattr(module, "use_registered_op", lambda x: True)
    x = _x(13, 3, device, lo=-1.2, hi=1.4)
    if path == "pairs":
        with torch.no_grad():
            x[0, 1] = 7.5  # far from the rest: the pairs of its groups only
    params = list(layer.parameters())

    def reference(x):
        return ref_ukan.ukan_linear(x, layer.grid_delta, layer.spline_order, layer.pe_dim, layer.feature_embedding,
                                    layer.cg_hidden.weight, layer.cg_hidden.bias, layer.cg_out.weight, layer.cg_out.bias,
                                    layer.spline_scaler, layer.base_weight if base else None)

    runs = []
    for f in (layer, reference):
        y, u_x, u_xx, loss = _derivatives(f, x)
        runs.append((y, u_x, u_xx, *torch.autograd.grad(loss, params + [x], allow_unused=True)))
    assert (layer._last is None) == (path == "range")
    for index, (a, b) in enumerate(zip(*runs)):
        if a is None or b is None:
            assert a is None or float(a.abs().max()) == 0, index
            continue
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=f"output {index}")


def test_ukan_range_table_made_once_per_node_and_again_after_an_in_place_change(device, monkeypatch):
    """UKANLinear's dense-range node makes the CG-MLP table of its create_graph backward once (u_x and u_xx both
    pass it) and again after an in-place change of a CG-MLP parameter; the gradients are those of the parameters
    as they are."""
    from warpkan.torch_bridge import UKANLinear, ukan_ops

    made = []
    table = ukan_ops.range_table_torch
    monkeypatch.setattr(ukan_ops, "range_table_torch", lambda *args: made.append(1) or table(*args))
    tdev = "cuda" if device == "cuda" else "cpu"
    torch.manual_seed(0)
    layer = UKANLinear(3, 2, grid_delta=0.3, pe_dim=4, embed_dim=3, hidden_dim=6, dtype=DOUBLE, device=tdev)
    x = _x(11, 3, device)
    y = layer(x)
    (u_x,) = torch.autograd.grad(y.sum(), x, create_graph=True, retain_graph=True)
    (u_xx,) = torch.autograd.grad(u_x.sum(), x, create_graph=True, retain_graph=True)
    assert layer._last is None and len(made) == 1  # the dense range, its table made by the u_x pass alone
    with torch.no_grad():
        layer.cg_out.weight.mul_(2.0)
    (u_x_changed,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    assert len(made) == 2
    (expected,) = torch.autograd.grad(layer(x).sum(), x)
    torch.testing.assert_close(u_x_changed, expected, rtol=1e-12, atol=1e-12)


def _edge_spec(kind, x, use_base):
    """An EdgeSpec of one edge family for x [N, in] (float64): the B-spline's (uniform or general grid), the
    polynomial's (exact, LUT, or a LUT layer's higher-order family: table values, exact derivatives) and UKAN's
    (range table or touched pairs)."""
    from warpkan.kernels import bspline as kb
    from warpkan.torch_bridge import ukan_ops
    from warpkan.torch_bridge.bspline_ops import _bspline_frame
    from warpkan.torch_bridge.edge_driver import EdgeSpec
    from warpkan.torch_bridge.poly_ops import _engine_args_of, derivative_engine_args

    n_in, grid_size, order = x.shape[1], 4, 3
    if kind in ("bspline", "bspline_general"):
        uniform = kind == "bspline"
        grid = _grid(n_in, grid_size, order, perturb=0.0 if uniform else 0.4).to(x.device)
        return EdgeSpec(kb.family_of(order, uniform, "float64"), _bspline_frame, (grid,), (), grid_size + order,
                        use_base)
    if kind in ("poly", "poly_lut"):
        return EdgeSpec(*_engine_args_of(x, 5, "chebyshev", 64 if kind == "poly_lut" else 0, 1.0, 1.0), 5, use_base)
    if kind == "poly_lut_derivative":
        return EdgeSpec(*derivative_engine_args(x, 5, "jacobi", 64, 0.5, -0.3), 5, use_base)
    n_out = 2
    if kind == "ukan":
        group_lo, span = ukan_ops.group_range(x.detach(), 0.3, order)
        n_groups = int(span.max()) + 1
        table = torch.zeros(n_in * n_groups, (order + 1) * n_out, dtype=x.dtype, device=x.device)
        return ukan_ops.range_spec(x, group_lo, table, 0.3, order, use_base)[0]
    else:
        table = torch.zeros(64 * (order + 1), n_out, dtype=x.dtype, device=x.device)
        family, make_frame, frame_tensors, frame_config, coef = ukan_ops._pair_args(x.detach(), table, 0.3, order)
    return EdgeSpec(family, make_frame, frame_tensors, frame_config, coef.shape[1], use_base)


OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
EDGE_KINDS = ["bspline", "bspline_general", "poly", "poly_lut", "poly_lut_derivative", "ukan", "ukan_pairs"]


@pytest.mark.parametrize("route", ["eager", "registered"])
@pytest.mark.parametrize("use_base", [True, False])
@pytest.mark.parametrize("scaled", [True, False])
def test_dense_basis_and_contraction_gradcheck(device, use_base, scaled, route):
    """The engine's differentiable dense basis A_m(x) (scaled per input row) and its contraction, the pieces
    every create_graph=True backward is built of: first and second derivatives in all inputs by float64
    finite differences, third x-derivatives included; through the eager Functions and the registered ops
    (``warpkan::edge_dense_basis``, ``warpkan::edge_contract_basis``), whose own gradients are the ops again."""
    from warpkan.torch_bridge.edge_driver import (_ContractBasis, _DenseBasis, dense_width, edge_contract_basis,
                                                  edge_dense_basis)

    x = _x(5, 2, device, seed=7)
    spec = _edge_spec("bspline", x, use_base)
    scale = _x(5, 2, device, lo=0.5, hi=1.5, seed=8) if scaled else None
    gen = torch.Generator().manual_seed(9)
    g = torch.randn(dense_width(2, spec[4], use_base), 5, generator=gen, dtype=DOUBLE).to(device).requires_grad_()
    if route == "eager":
        dense = lambda x, *s: _DenseBasis.apply(x, s[0] if s else None, 1, spec)  # noqa: E731
        contract = lambda g, x, *s: _ContractBasis.apply(g, x, s[0] if s else None, 1, spec)  # noqa: E731
    else:
        frame, key = list(spec.frame_tensors), spec.static_key()
        dense = lambda x, *s: edge_dense_basis(x, s[0] if s else None, frame, key, 1)  # noqa: E731
        contract = lambda g, x, *s: edge_contract_basis(g, x, s[0] if s else None, frame, key, 1)  # noqa: E731
    extra = (scale,) if scaled else ()
    assert torch.autograd.gradcheck(dense, (x, *extra))
    assert torch.autograd.gradgradcheck(dense, (x, *extra))
    assert torch.autograd.gradcheck(contract, (g, x, *extra))
    assert torch.autograd.gradgradcheck(contract, (g, x, *extra))


@pytest.mark.parametrize("kind", EDGE_KINDS)
def test_edge_pieces_opcheck(device, kind):
    """opcheck (schema, fake tensor, autograd registration, AOT dispatch) of the two registered pieces, for
    every edge family, at every x-derivative order they serve, with and without a scale."""
    from warpkan.torch_bridge.edge_driver import dense_width, edge_contract_basis, edge_dense_basis

    x = _x(6, 3, device, lo=-1.1, hi=1.2, seed=12)
    spec = _edge_spec(kind, x, use_base=kind.startswith("bspline"))
    frame, key = list(spec.frame_tensors), spec.static_key()
    scale = _x(6, 3, device, lo=0.5, hi=1.5, seed=13)
    g = _x(dense_width(3, spec[4], spec[5]), 6, device, lo=-1.0, hi=1.0, seed=14)
    for order in range(4):
        # the third order's gradient would need a fourth x-derivative (refused by name): its forward alone
        utils = ("test_schema", "test_faketensor") if order == 3 else OPCHECK_UTILS
        for s in (None, scale):
            torch.library.opcheck(edge_dense_basis, (x, s, frame, key, order), test_utils=utils)
            torch.library.opcheck(edge_contract_basis, (g, x, s, frame, key, order), test_utils=utils)


@pytest.mark.parametrize("kind", EDGE_KINDS)
def test_edge_pieces_registered_match_eager(device, kind):
    """The registered pieces give the eager Functions' values, and their first and second gradients."""
    from warpkan.torch_bridge.edge_driver import (_ContractBasis, _DenseBasis, dense_width, edge_contract_basis,
                                                  edge_dense_basis)

    x = _x(7, 3, device, lo=-1.1, hi=1.2, seed=15)
    spec = _edge_spec(kind, x, use_base=True)
    frame, key = list(spec.frame_tensors), spec.static_key()
    g = _x(dense_width(3, spec[4], True), 7, device, lo=-1.0, hi=1.0, seed=16)
    runs = []
    for dense, contract in ((lambda x: _DenseBasis.apply(x, None, 0, spec),
                             lambda g, x: _ContractBasis.apply(g, x, None, 1, spec)),
                            (lambda x: edge_dense_basis(x, None, frame, key, 0),
                             lambda g, x: edge_contract_basis(g, x, None, frame, key, 1))):
        a, dx = dense(x), contract(g, x)
        (ax,) = torch.autograd.grad((a * g).sum(), x, create_graph=True)
        gx, xx = torch.autograd.grad((dx.square()).sum() + ax.square().sum(), [g, x])
        runs.append((a, dx, ax, gx, xx))
    for name, ours, ref in zip(["A_0", "contract_1", "d<A_0, G>/dx", "d/dG", "d/dx"], *runs):
        torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12, msg=name)


@pytest.mark.parametrize("kind", EDGE_KINDS)
def test_expand_contract_matches_the_separate_pieces(device, kind):
    """The one-launch backward piece gives what the separate dense basis and contractions give: every subset of
    its three outputs, at every order a formula asks it for, with and without each scale, base path on and off."""
    import itertools

    from warpkan.torch_bridge.edge_driver import _expand_contract_impl, contract_basis, dense_basis, dense_width

    x = _x(37, 3, device, lo=-1.1, hi=1.2, seed=21)
    for use_base in (True, False):
        spec = _edge_spec(kind, x, use_base=use_base)
        g = _x(dense_width(3, spec[4], use_base), 37, device, lo=-1.0, hi=1.0, seed=22)
        scale = _x(37, 3, device, lo=0.5, hi=1.5, seed=23)
        scale_lo = _x(37, 3, device, lo=-1.5, hi=-0.5, seed=24)
        for order, s, s_lo in itertools.product(range(3), (None, scale), (None, scale_lo)):
            with torch.no_grad():
                expected = (dense_basis(x, s, order, spec), contract_basis(g, x, s, order + 1, spec),
                            contract_basis(g, x, s_lo, order, spec))
                for wanted in itertools.product((False, True), repeat=3):
                    got = _expand_contract_impl(g, x, s, s_lo, order, spec, *wanted)
                    for name, want, ours, ref in zip(("basis", "dx", "dx_lo"), wanted, got, expected):
                        if want:
                            torch.testing.assert_close(ours, ref, rtol=1e-13, atol=1e-13,
                                                       msg=f"{name} order {order} base {use_base}")
                        else:
                            assert ours.numel() == 0, name
        with torch.no_grad():  # one tensor as both scales (a contraction's backward without a scale of its own)
            got = _expand_contract_impl(g, x, scale, scale, 1, spec, True, True, True)
            expected = (dense_basis(x, scale, 1, spec), contract_basis(g, x, scale, 2, spec),
                        contract_basis(g, x, scale, 1, spec))
        for ours, ref in zip(got, expected):
            torch.testing.assert_close(ours, ref, rtol=1e-13, atol=1e-13)
    with pytest.raises(NotImplementedError, match="order 4"):
        _expand_contract_impl(g, x, None, None, 3, spec, False, True, False)


def test_pinn_step_reuses_its_recorded_launches(device):
    """A second heat-PINN step of the same shapes records no new launch: every launch of the create_graph
    formulas is re-pointed at its new tensors (a recorded launch keyed by addresses would grow the cache every
    step and pay a recording each time)."""
    from warpkan.torch_bridge import edge_driver

    torch.manual_seed(0)
    model = torch.nn.Sequential(KANLinear(2, 5, grid_size=4, dtype=DOUBLE, device=device),
                                KANLinear(5, 1, grid_size=4, dtype=DOUBLE, device=device))
    xt = _x(23, 2, device, seed=32)

    def step():
        _, u_x, u_xx, loss = _derivatives(model, xt)
        loss.backward()

    step()
    before = dict(edge_driver._launch._records)
    step()
    assert set(edge_driver._launch._records) <= set(before)


@pytest.mark.parametrize("route", ["eager", "registered"])
def test_expand_contract_gradcheck(device, route):
    """The one-launch piece's own gradients (the sum of its outputs' formulas, themselves built of it) by float64
    finite differences, first and second (at order 0: the second gradients reach the third x-derivative), with
    both scales and all three outputs, and with two of them."""
    from warpkan.torch_bridge.edge_driver import _ExpandContract, dense_width, edge_expand_contract

    x = _x(5, 2, device, seed=25)
    spec = _edge_spec("bspline", x, True)
    g = _x(dense_width(2, spec[4], True), 5, device, lo=-1.0, hi=1.0, seed=26)
    scale = _x(5, 2, device, lo=0.5, hi=1.5, seed=27)
    scale_lo = _x(5, 2, device, lo=-1.5, hi=-0.5, seed=28)
    frame, key = list(spec.frame_tensors), spec.static_key()
    for wanted in ((True, True, True), (True, True, False), (False, True, True)):
        def piece(g, x, s, s_lo, wanted=wanted):
            if route == "eager":
                outs = _ExpandContract.apply(g, x, s, s_lo, 0, spec, *wanted)
            else:
                outs = edge_expand_contract(g, x, s, s_lo, frame, key, 0, *wanted)
            return tuple(out for out, want in zip(outs, wanted) if want)

        assert torch.autograd.gradcheck(piece, (g, x, scale, scale_lo))
        assert torch.autograd.gradgradcheck(piece, (g, x, scale, scale_lo))


@pytest.mark.parametrize("kind", EDGE_KINDS)
def test_expand_contract_opcheck(device, kind):
    from warpkan.torch_bridge.edge_driver import dense_width, edge_expand_contract

    x = _x(6, 3, device, lo=-1.1, hi=1.2, seed=29)
    spec = _edge_spec(kind, x, use_base=kind.startswith("bspline"))
    frame, key = list(spec.frame_tensors), spec.static_key()
    g = _x(dense_width(3, spec[4], spec[5]), 6, device, lo=-1.0, hi=1.0, seed=30)
    scale = _x(6, 3, device, lo=0.5, hi=1.5, seed=31)
    for order in range(3):
        # at order 2 the gradient of the order-3 contraction would need a fourth x-derivative: no autograd test
        utils = ("test_schema", "test_faketensor") if order == 2 else OPCHECK_UTILS
        for wanted in ((True, True, True), (True, True, False), (False, True, True), (True, False, True)):
            torch.library.opcheck(edge_expand_contract, (g, x, scale, None, frame, key, order, *wanted),
                                  test_utils=utils)


def test_registered_create_graph_runs_the_registered_pieces(device, monkeypatch):
    """Where the layers run their registered ops (torch.compile, export, meta tensors), a create_graph=True
    backward builds its graph of the registered pieces, not the eager Functions."""
    import warpkan.torch_bridge._common as common
    from warpkan.torch_bridge import edge_driver, rational_higher

    monkeypatch.setattr(common, "use_registered_op", lambda x: True)

    def refused(*args):
        raise AssertionError("an eager Function ran under the registered route")

    for function in (edge_driver._DenseBasis, edge_driver._ContractBasis, edge_driver._ExpandContract,
                     rational_higher._Derivative, rational_higher._CoefGrad):
        monkeypatch.setattr(function, "apply", refused)
    torch.manual_seed(0)
    from warpkan.torch_bridge import GroupRational

    layers = [KANLinear(3, 2, dtype=DOUBLE, device=device), PolyKANLinear(3, 2, degree=4, dtype=DOUBLE, device=device),
              GroupRational(4, num_groups=2, dtype=DOUBLE, device=device)]
    for layer in layers:
        x = _x(9, 4 if isinstance(layer, GroupRational) else 3, device)
        _, u_x, u_xx, loss = _derivatives(layer, x)
        loss.backward()
        assert all(p.grad is not None for p in layer.parameters())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("route", ["autograd", "taylor"])
def test_pinn_step_replays_from_a_cuda_graph(route):
    """The heat PINN's whole training step (u_t and u_xx by create_graph=True, or by Taylor mode; loss.backward,
    a capturable Adam step) captured in a CUDA graph: each replay takes the step the eager code takes, so the
    layers' ops launch on torch's capture stream and allocate through torch."""
    import copy

    from warpkan.bench import pinn
    from warpkan.torch_bridge import capture_step

    _steps = pinn._steps if route == "autograd" else pinn._taylor_steps

    torch.manual_seed(0)
    model = torch.nn.Sequential(KANLinear(2, 6, grid_size=5, device="cuda"), KANLinear(6, 1, grid_size=5, device="cuda"))
    xt = (torch.rand(300, 2, device="cuda") * 2 - 1).requires_grad_()
    graphed, eager = copy.deepcopy(model), copy.deepcopy(model)
    replay = capture_step(_steps(graphed, xt, capturable=True)[0], warmup=3)  # three eager steps, then capture
    step = _steps(eager, xt, capturable=True)[0]
    for _ in range(3):
        step()
    for _ in range(4):
        replay()
        step()
    torch.cuda.synchronize()
    for a, b in zip(graphed.parameters(), eager.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layer", ["kan", "poly"])
def test_x_gradient_alone_builds_no_parameter_gradient(device, layer, monkeypatch):
    """autograd.grad(u, x, create_graph=True) runs only the nodes on a path to x: the layers' formulas build no
    parameter-gradient graph (no order-0 dense basis), which they do when the parameters are asked for too.
    (The values after the pruning are the reference's: the PINN and second-derivative tests ask for x alone
    first.)"""
    from warpkan.torch_bridge import edge_driver

    counted = []
    apply = edge_driver._DenseBasis.apply
    monkeypatch.setattr(edge_driver._DenseBasis, "apply",
                        lambda x, s, order, spec: counted.append(order) or apply(x, s, order, spec))
    torch.manual_seed(0)
    tdev = "cuda" if device == "cuda" else "cpu"

    def make(n_in, n_out):
        if layer == "kan":
            return KANLinear(n_in, n_out, grid_size=5, dtype=DOUBLE, device=tdev, strategy="stencil")
        return PolyKANLinear(n_in, n_out, degree=4, mode="exact", dtype=DOUBLE, device=tdev, strategy="stencil")

    model = torch.nn.Sequential(make(2, 4), make(4, 1))
    x = _x(17, 2, device)
    (u_x,) = torch.autograd.grad(model(x).sum(), x, create_graph=True)
    assert counted == []
    counted.clear()
    grads = torch.autograd.grad(model(x).sum(), [x, *model.parameters()], create_graph=True)
    assert counted == [0, 0] and all(g.requires_grad for g in grads)
    torch.testing.assert_close(grads[0], u_x, rtol=0, atol=0)


def test_kan_combined_weight_made_once_per_node_and_again_after_an_in_place_change(device, monkeypatch):
    """Each create_graph backward through a KANLinear node reads the combined weight [base; coef * scaler] the
    node made the first time (a PINN's u_x and u_xx pass every layer twice), and makes it again when a parameter
    changed in place since: the gradient is then that of the parameters as they are, as without the cache. (The
    values of the weight's own gradients, the split kernel's and torch's, are the PINN and gradgradcheck tests'.)"""
    from warpkan.torch_bridge import edge_driver, edge_ops

    made = []
    combined = edge_driver._CombinedWeight.apply
    monkeypatch.setattr(edge_driver._CombinedWeight, "apply", lambda *args: made.append(1) or combined(*args))
    tdev = "cuda" if device == "cuda" else "cpu"
    torch.manual_seed(0)
    layer = KANLinear(3, 2, grid_size=4, dtype=DOUBLE, device=tdev, strategy="gemm")
    x = _x(11, 3, device)
    y = layer(x)
    (u_x,) = torch.autograd.grad(y.sum(), x, create_graph=True, retain_graph=True)
    (u_xx,) = torch.autograd.grad(u_x.sum(), x, create_graph=True, retain_graph=True)
    assert len(made) == 1  # u_xx passed the layer's node a second time, and took the weight it had made
    with torch.no_grad():
        layer.spline_scaler.mul_(2.0)
    (u_x_changed,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    assert len(made) == 2
    (expected,) = torch.autograd.grad(layer(x).sum(), x)
    torch.testing.assert_close(u_x_changed, expected, rtol=1e-12, atol=1e-12)
    assert edge_ops.node_combined_weight is edge_driver.node_combined_weight


# ------------------------------------------------------------------------------------------ group-rational
def _rational_params(shared, num_groups, m, n, device, dtype=DOUBLE, seed=5):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(1 if shared else num_groups, m + 1, generator=gen, dtype=DOUBLE) * 0.7
    b = torch.randn(num_groups, n, generator=gen, dtype=DOUBLE) * 0.7
    return a.to(device, dtype).requires_grad_(), b.to(device, dtype).requires_grad_()


@pytest.mark.parametrize("variant", ["A", "B"])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("registered", [False, True])
def test_group_rational_second_derivatives_and_their_parameter_gradients(device, variant, shared, registered,
                                                                        monkeypatch):
    """y, u_x, u_xx and the gradients of a loss of them in x and both coefficient tables: the jet kernels
    against torch's double backward of the float64 reference, on the eager route and the registered op."""
    from warpkan.reference.rational import group_rational_reference
    from warpkan.torch_bridge import group_rational

    if registered:
        import warpkan.torch_bridge._common as common

        monkeypatch.setattr(common, "use_registered_op", lambda x: True)
    num_groups, channels, m, n = 3, 9, 5, 4
    a, b = _rational_params(shared, num_groups, m, n, device)
    x = _x(11, channels, device, lo=-2.0, hi=2.0)
    runs = []
    for f in (group_rational, group_rational_reference):
        y, u_x, u_xx, loss = _derivatives(lambda x: f(x, a, b, num_groups, variant), x)
        runs.append((y, u_x, u_xx, *torch.autograd.grad(loss, [a, b, x])))
    for name, ours, ref in zip(["y", "u_x", "u_xx", "d loss / d a", "d loss / d b", "d loss / d x"], *runs):
        torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10, msg=name)


@pytest.mark.parametrize("variant", ["A", "B"])
@pytest.mark.parametrize("shared", [True, False])
def test_group_rational_gradgradcheck(device, variant, shared):
    from warpkan.torch_bridge import group_rational

    a, b = _rational_params(shared, 2, 3, 2, device, seed=6)
    x = _x(5, 4, device, lo=-1.5, hi=1.5, seed=7)
    f = lambda x, a, b: group_rational(x, a, b, 2, variant)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, a, b))
    assert torch.autograd.gradgradcheck(f, (x, a, b))


@pytest.mark.parametrize("route", ["eager", "registered"])
@pytest.mark.parametrize("variant", ["A", "B"])
def test_group_rational_jet_pieces_gradcheck(device, variant, route):
    """The two differentiable pieces of the create_graph=True path, directions included: the x-derivative (of
    F, or of F's coefficient derivative along h) and the coefficient gradient, by float64 finite
    differences, to the second derivative where they close; through the eager Functions and the registered
    ops (``warpkan::rational_derivative``, ``warpkan::rational_coef_grad``)."""
    from warpkan.torch_bridge.rational_higher import _CoefGrad, _Derivative, rational_coef_grad, rational_derivative

    a, b = _rational_params(False, 2, 3, 2, device, seed=8)
    ha, hb = _rational_params(False, 2, 3, 2, device, seed=9)
    x = _x(4, 4, device, lo=-1.5, hi=1.5, seed=10)
    g = _x(4, 4, device, lo=-1.0, hi=1.0, seed=11)
    derivative, coef_grad = ((_Derivative.apply, _CoefGrad.apply) if route == "eager"
                             else (rational_derivative, rational_coef_grad))
    for order in (0, 1, 2):
        plain = lambda x, a, b: derivative(x, a, b, None, None, order, variant)  # noqa: E731
        directed = lambda x, a, b, ha, hb: derivative(x, a, b, ha, hb, order, variant)  # noqa: E731
        coef = lambda g, x, a, b: coef_grad(g, x, a, b, None, None, order, variant)  # noqa: E731
        assert torch.autograd.gradcheck(plain, (x, a, b))
        assert torch.autograd.gradgradcheck(plain, (x, a, b))
        assert torch.autograd.gradcheck(directed, (x, a, b, ha, hb))
        assert torch.autograd.gradcheck(coef, (g, x, a, b))


@pytest.mark.parametrize("variant", ["A", "B"])
@pytest.mark.parametrize("shared", [True, False])
def test_group_rational_pieces_opcheck(device, variant, shared):
    """opcheck of the two registered rational pieces at every x-derivative order they serve, with and without
    a coefficient direction."""
    from warpkan.torch_bridge.rational_higher import MAX_X_DERIVATIVE, rational_coef_grad, rational_derivative

    a, b = _rational_params(shared, 2, 3, 2, device, seed=17)
    ha, hb = _rational_params(shared, 2, 3, 2, device, seed=18)
    x = _x(5, 4, device, lo=-1.5, hi=1.5, seed=19)
    g = _x(5, 4, device, lo=-1.0, hi=1.0, seed=20)
    for order in range(MAX_X_DERIVATIVE + 1):
        # a gradient past the last order, or of a directed coefficient gradient, is refused: forward alone there
        last = order == MAX_X_DERIVATIVE
        utils = ("test_schema", "test_faketensor") if last else OPCHECK_UTILS
        torch.library.opcheck(rational_derivative, (x, a, b, None, None, order, variant), test_utils=utils)
        torch.library.opcheck(rational_derivative, (x, a, b, ha, hb, order, variant), test_utils=utils)
        torch.library.opcheck(rational_coef_grad, (g, x, a, b, None, None, order, variant), test_utils=utils)
        torch.library.opcheck(rational_coef_grad, (g, x, a, b, ha, hb, order, variant),
                              test_utils=("test_schema", "test_faketensor"))


def test_group_rational_float32_error_is_at_reference_level(device):
    """The float32 create_graph=True path (the jet kernels in float32) against float64, within a small factor
    of the float32 reference's own error."""
    from warpkan.reference.rational import group_rational_reference
    from warpkan.torch_bridge import group_rational

    a64, b64 = _rational_params(False, 2, 5, 4, device, seed=12)
    x64 = _x(64, 8, device, lo=-2.0, hi=2.0, seed=13)
    results = {}
    for name, f, dtype in (("ours", group_rational, torch.float32), ("ref32", group_rational_reference, torch.float32),
                           ("ref64", group_rational_reference, DOUBLE)):
        a, b = a64.detach().to(dtype).requires_grad_(), b64.detach().to(dtype).requires_grad_()
        x = x64.detach().to(dtype).requires_grad_()
        y, u_x, u_xx, loss = _derivatives(lambda x: f(x, a, b, 2, "A"), x)
        results[name] = [t.double() for t in (y, u_x, u_xx, *torch.autograd.grad(loss, [a, b, x]))]
    for i, name in enumerate(["y", "u_x", "u_xx", "d loss / d a", "d loss / d b", "d loss / d x"]):
        ref_err = float((results["ref32"][i] - results["ref64"][i]).detach().abs().max())
        err = float((results["ours"][i] - results["ref64"][i]).detach().abs().max())
        scale = float(results["ref64"][i].detach().abs().max())
        assert err <= 4 * ref_err + 1e-6 * scale, f"{name}: error {err:.3e} vs the float32 reference's {ref_err:.3e}"


def test_group_rational_order_limits_are_named(device):
    """x-derivatives to the fourth; the fifth, and the third coefficient derivatives, raise by name."""
    from warpkan.torch_bridge import group_rational

    a, b = _rational_params(False, 1, 3, 2, device)
    x = _x(5, 2, device)
    g = group_rational(x, a, b, 1, "B")
    for _ in range(4):
        (g,) = torch.autograd.grad(g.sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="order 5 in x"):
        torch.autograd.grad(g.sum(), x, create_graph=True)
    (d_a,) = torch.autograd.grad(group_rational(x, a, b, 1, "B").sum(), a, create_graph=True)
    (dd_a,) = torch.autograd.grad(d_a.sum(), x, create_graph=True)  # mixed second derivative: fine
    (d_b,) = torch.autograd.grad(d_a.square().sum(), b, create_graph=True)
    with pytest.raises(NotImplementedError, match="third derivatives of the activation in its coefficients"):
        torch.autograd.grad(d_b.sum(), b)
    assert dd_a.requires_grad


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_capture_step_without_cuda_says_why():
    from warpkan.torch_bridge import capture_step

    with pytest.raises(RuntimeError, match="capture_step needs a CUDA device"):
        capture_step(lambda: None)


def test_ukan_pairs_overflow_drops_the_same_terms_at_every_order(device):
    """A fixed-capacity pair table the data overflows: the spline terms of the pairs past the capacity are
    dropped (as documented); create_graph=True reads the table through the engine and must drop exactly the
    same ones: u_x agrees with the first-order kernels', and u_xx comes out finite."""
    from warpkan.torch_bridge import UKANLinear

    torch.manual_seed(0)
    layer = UKANLinear(3, 2, spline_order=3, grid_delta=0.002, pe_dim=4, embed_dim=3, hidden_dim=6, table_groups=4,
                       dtype=DOUBLE, device=device)
    layer.dense_max_coefficients = 0
    x = _x(700, 3, device, lo=-1.5, hi=1.5)
    u = layer(x)
    pair_feature, pair_group, needed = layer._last
    assert int(needed) > pair_feature.shape[0]  # overflowed
    (first_order,) = torch.autograd.grad(u.sum(), x, retain_graph=True)
    (u_x,) = torch.autograd.grad(u.sum(), x, create_graph=True)
    torch.testing.assert_close(u_x, first_order, rtol=1e-10, atol=1e-10)
    (u_xx,) = torch.autograd.grad(u_x.sum(), x)
    assert bool(torch.isfinite(u_xx).all())


@pytest.mark.parametrize("path", ["range", "pairs"])
def test_ukan_gradgradcheck(device, path):
    """UKANLinear's first and second derivatives in x and in the scaler, base weight and CG-MLP output layer, by
    float64 finite differences, on both paths."""
    from torch.func import functional_call

    from warpkan.torch_bridge import UKANLinear

    torch.manual_seed(0)
    layer = UKANLinear(2, 2, spline_order=3, grid_delta=0.4, pe_dim=4, embed_dim=3, hidden_dim=5, dtype=DOUBLE,
                       device=device)
    if path == "pairs":
        layer.dense_max_coefficients = 0
    names = ["spline_scaler", "base_weight", "cg_out.weight"]
    params = {n: p.detach().clone().requires_grad_() for n, p in layer.named_parameters() if n in names}
    x = _x(4, 2, device, lo=-1.0, hi=1.0, seed=21)

    def f(x, *values):
        return functional_call(layer, dict(zip(params, values)), (x,))

    assert torch.autograd.gradcheck(f, (x, *params.values()))
    assert torch.autograd.gradgradcheck(f, (x, *params.values()))
    assert (layer._last is None) == (path == "range")
