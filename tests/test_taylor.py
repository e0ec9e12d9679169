"""Taylor mode (``warpkan.torch_bridge.jet``): a network's values, first derivatives along every input coordinate and
second derivatives along chosen pairs, carried forward layer by layer.

Every rule is checked in float64 against ``torch.autograd.grad(create_graph=True)`` through an independent
pure-torch network (efficient-kan's formula for KANLinear, the basis recurrences for the polynomial layers,
torch's own activations), for the jets and for the parameter gradients of a loss built from them; the edge op
``warpkan::edge_jet`` by float64 gradcheck and opcheck, its chunked rows against one chunk, and float32 against
float64 within a small factor of the float32 reference's own error."""

import pytest
import torch
from torch import nn

from warpkan.reference import bspline as ref_bspline
from warpkan.reference import poly as ref_poly
from warpkan.reference.rational import group_rational_reference
from warpkan.torch_bridge import (KATMLP, ChebyKANLinear, GRKANLinear, GroupRational, Jet, KANLinear, PolyKANLinear,
                                  elementwise_rule, jet, register_jet_rule)

DOUBLE = torch.float64


class _ReferenceKAN(nn.Module):
    """A KANLinear's parameters through efficient-kan's formula (pure torch)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        layer = self.layer
        act = layer.base_activation
        y = ref_bspline.kan_linear(x, layer.grid, layer.base_weight, layer.spline_weight, layer.spline_scaler,
                                   layer.spline_order, use_base=act is not None,
                                   base_activation=act if act is not None else torch.nn.functional.silu)
        return y


class _ReferencePoly(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        layer = self.layer
        return ref_poly.poly_kan(x, layer.coeffs.permute(0, 2, 1), layer.bias, layer.basis, layer.alpha, layer.beta)


class _ReferencePolyLut(nn.Module):
    """A LUT layer's values from its tables, its derivatives the exact basis's (``reference.poly.poly_kan_lut``)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        layer = self.layer
        return ref_poly.poly_kan_lut(x, layer.coeffs.permute(0, 2, 1), layer.lut_size, layer.bias, layer.basis,
                                     layer.alpha, layer.beta)


class _ReferenceRational(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        layer = self.layer
        return group_rational_reference(x, layer.weight_numerator, layer.weight_denominator, layer.num_groups,
                                        layer.variant)


def _reference(model):
    """The same network with every warpkan layer replaced by its pure-torch reference (same parameters)."""
    if isinstance(model, nn.Sequential):
        return nn.Sequential(*[_reference(m) for m in model])
    if isinstance(model, GroupRational):
        return _ReferenceRational(model)
    if isinstance(model, GRKANLinear):
        return nn.Sequential(_ReferenceRational(model.rational), model.linear)
    if isinstance(model, KATMLP):
        return nn.Sequential(_reference(model.fc1), _reference(model.fc2))
    if isinstance(model, KANLinear):
        return _ReferenceKAN(model)
    if isinstance(model, PolyKANLinear):
        return _ReferencePoly(model) if model.mode == "exact" else _ReferencePolyLut(model)
    return model  # torch's modules


def _autograd_jet(model, x, pairs):
    """The jet stack [1 + D + P, N, out] by autograd (create_graph=True), output by output."""
    x = x.detach().clone().requires_grad_()
    u = model(x)
    n_out, n_first = u.shape[1], x.shape[1]
    firsts = [torch.autograd.grad(u[:, o].sum(), x, create_graph=True)[0] for o in range(n_out)]
    first = torch.stack([torch.stack([firsts[o][:, a] for o in range(n_out)], 1) for a in range(n_first)])
    second = [torch.stack([torch.autograd.grad(firsts[o][:, a].sum(), x, create_graph=True)[0][:, b]
                           for o in range(n_out)], 1) for a, b in pairs]
    return torch.cat([u.unsqueeze(0), first, torch.stack(second) if second else first[:0]])


def _x(n_rows, n_in, device, lo=-1.2, hi=1.2, seed=1, dtype=DOUBLE):
    gen = torch.Generator().manual_seed(seed)
    return (lo + (hi - lo) * torch.rand(n_rows, n_in, generator=gen, dtype=dtype)).to(device)


def _perturb_grid(layer, amount=0.3, seed=3):
    """Move the knots off the uniform grid (a general-grid layer, as update_grid makes)."""
    with torch.no_grad():
        grid = layer.grid
        h = float(grid[0, 1] - grid[0, 0])
        gen = torch.Generator().manual_seed(seed)
        noise = (torch.rand(grid.shape, generator=gen, dtype=grid.dtype) - 0.5).to(grid.device) * amount * h
        grid.copy_(torch.sort(grid + noise, dim=1).values)
    layer._grid_uniform = False


def _models(device):
    def kan(*args, **kwargs):
        return KANLinear(*args, dtype=DOUBLE, device=device, **kwargs)

    general = kan(3, 4, grid_size=6, spline_order=3)
    _perturb_grid(general)
    torch.manual_seed(0)
    rationals = nn.Sequential(
        GroupRational(3, num_groups=3, variant="B", init="gelu", shared_numerator=False, dtype=DOUBLE, device=device),
        GRKANLinear(3, 4, num_groups=1, init="swish", dtype=DOUBLE, device=device),
        KATMLP(4, 6, 2, num_groups=2, dtype=DOUBLE, device=device))
    with torch.no_grad():  # groups apart from their shared init, and the identity init bent
        for module in rationals.modules():
            if isinstance(module, GroupRational):
                for weight in (module.weight_numerator, module.weight_denominator):
                    weight.add_(0.1 * torch.randn(weight.shape, dtype=DOUBLE).to(device))
    return {
        "kan silu, uniform": nn.Sequential(kan(3, 5, grid_size=5), kan(5, 2, grid_size=4, spline_order=2)),
        "kan general grid, order 5": nn.Sequential(general, kan(4, 2, grid_size=3, spline_order=5)),
        "kan without base, order 1, fine grid": nn.Sequential(kan(3, 4, grid_size=40, spline_order=1,
                                                                  base_activation=None), kan(4, 1, grid_size=9)),
        "kan tanh base (unfused), linear, gelu": nn.Sequential(kan(3, 4, base_activation=nn.Tanh),
                                                               nn.Linear(4, 2).double().to(device),
                                                               nn.GELU(approximate="tanh")),
        "cheby exact, tanh, softplus, gelu": nn.Sequential(ChebyKANLinear(3, 4, 6).double().to(device), nn.Tanh(),
                                                           nn.Linear(4, 2).double().to(device),
                                                           nn.Softplus(beta=2.0, threshold=1.0), nn.GELU()),
        "legendre lut, silu, sigmoid": nn.Sequential(
            PolyKANLinear(3, 4, 5, basis="legendre", mode="lut", lut_size=257).double().to(device), nn.SiLU(),
            nn.Identity(), nn.Sigmoid()),
        "jacobi exact with bias": nn.Sequential(
            PolyKANLinear(3, 2, 4, basis="jacobi", alpha=0.5, beta=-0.3, bias=True).double().to(device)),
        "mlp": nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 1)).double().to(
            device),
        "group rational, gr-kan, kat mlp": rationals,
    }


MODEL_NAMES = list(_models("cpu"))


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("n_rows,n_first,pairs", [(37, 3, ((0, 0), (1, 2), (2, 2))), (1, 2, ((0, 0),)),
                                                  (7, 1, ()), (11, 3, ((2, 1), (0, 1), (1, 1)))])
def test_jet_matches_autograd_of_the_reference(device, name, n_rows, n_first, pairs):
    """Values, first derivatives and second derivatives (pure and mixed pairs, in any order) against autograd
    through the pure-torch network, inputs partly outside the grids; and the parameter gradients of a loss
    built from every component. A LUT layer's values are its tables' and every derivative the exact basis's,
    its backward through the values included."""
    model = _models(device)[name]
    if n_first != 3:  # the first layer takes 3 inputs: feed it a linear map of the n_first coordinates
        model = nn.Sequential(nn.Linear(n_first, 3).double().to(device), model)
    reference = _reference(model)
    x = _x(n_rows, n_first, device)
    ours = jet(model, x, pairs=pairs)
    expected = _autograd_jet(reference, x, pairs)
    tolerance = dict(rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(ours.stack, expected, **tolerance)
    weights = torch.linspace(0.5, 1.5, expected.shape[0], dtype=DOUBLE, device=device).view(-1, 1, 1)
    params = list(model.parameters())
    grads = [torch.autograd.grad((weights * s.square()).sum(), params, allow_unused=True)
             for s in (ours.stack, expected)]
    for a, b, p in zip(*grads, params):  # a layer without a base path leaves base_weight unused in both
        torch.testing.assert_close(torch.zeros_like(p) if a is None else a, torch.zeros_like(p) if b is None else b,
                                   **tolerance)


def test_jet_accessors_and_nd_input(device):
    model = nn.Sequential(KANLinear(2, 3, dtype=DOUBLE, device=device))
    x = _x(12, 2, device).view(3, 4, 2)
    out = jet(model, x, pairs=[(1, 0)])
    flat = jet(model, x.view(12, 2), pairs=[(1, 0)])
    assert out.stack.shape == (4, 3, 4, 3) and out.value.shape == (3, 4, 3)
    torch.testing.assert_close(out.stack.view(4, 12, 3), flat.stack)
    torch.testing.assert_close(out.d2(0, 1), out.d2(1, 0))
    assert out.first.shape == (2, 3, 4, 3) and out.second.shape == (1, 3, 4, 3)
    with pytest.raises(KeyError, match=r"not \(0, 0\)"):
        out.d2(0, 0)
    with pytest.raises(IndexError, match="direction 2"):
        out.d(2)


def test_pinn_heat_residual_parameter_gradients(device):
    """The heat residual u_t - nu u_xx of a 2 -> 5 -> 1 KAN in Taylor mode: the loss and its parameter gradients
    match the autograd route through the float64 pure-torch network."""
    torch.manual_seed(0)
    model = nn.Sequential(KANLinear(2, 5, grid_size=5, dtype=DOUBLE, device=device),
                          KANLinear(5, 1, grid_size=5, dtype=DOUBLE, device=device))
    xt = _x(64, 2, device, lo=-0.9, hi=0.9)
    nu = 0.1
    u = jet(model, xt, pairs=[(0, 0)])
    loss = (u.d(1)[:, 0] - nu * u.d2(0, 0)[:, 0]).square().mean()
    ours = (loss, *torch.autograd.grad(loss, list(model.parameters())))
    x = xt.clone().requires_grad_()
    v = _reference(model)(x)
    (du,) = torch.autograd.grad(v.sum(), x, create_graph=True)
    (d2u,) = torch.autograd.grad(du[:, 0].sum(), x, create_graph=True)
    ref_loss = (du[:, 1] - nu * d2u[:, 0]).square().mean()
    expected = (ref_loss, *torch.autograd.grad(ref_loss, list(model.parameters())))
    for a, b in zip(ours, expected):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def _edge_args(kind, device, n_rows=5, n_in=3, n_out=2, n_first=2, pairs=((0, 0), (0, 1)), use_base=True, seed=0):
    """(z, weight, bias, n_first, pairs, spec) for the edge op of one family, float64."""
    from warpkan.kernels import bspline as kb
    from warpkan.kernels.edge.dense import dense_width
    from warpkan.torch_bridge.bspline_ops import _bspline_frame
    from warpkan.torch_bridge.edge_driver import EdgeSpec
    from warpkan.torch_bridge.poly_ops import _engine_args_of, derivative_engine_args

    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: (torch.rand(*shape, generator=gen, dtype=DOUBLE) * 2 - 1).to(device)  # noqa: E731
    n_comp = 1 + n_first + len(pairs)
    z = rand(n_comp, n_rows, n_in) * 1.2
    if kind.startswith("bspline"):
        order, grid_size = 3, 4
        h = 2.0 / grid_size
        grid = (torch.arange(-order, grid_size + order + 1, dtype=DOUBLE) * h - 1.0).expand(n_in, -1).clone()
        if kind == "bspline_general":
            grid += 0.4 * h * (torch.rand(grid.shape, generator=gen, dtype=DOUBLE) - 0.5)
            grid = torch.sort(grid, dim=1).values
        spec = EdgeSpec(kb.family_of(order, kind == "bspline", "float64"), _bspline_frame, (grid.to(device),), (),
                        grid_size + order, use_base)
    elif kind == "poly_lut_derivative":  # a LUT layer's Taylor-mode family: table values, exact derivatives
        spec = EdgeSpec(*derivative_engine_args(z[0], 5, "jacobi", 65, 0.5, -0.3), 5, False)
    else:
        n_basis = 5
        z0 = z[0]
        spec = EdgeSpec(*_engine_args_of(z0, n_basis, "chebyshev", 65 if kind == "poly_lut" else 0, 1.0, 1.0),
                        n_basis, False)
    weight = rand(dense_width(n_in, spec[4], spec[5]), n_out)
    bias = rand(n_out)
    return z, weight, bias, n_first, tuple(pairs), spec


JET_KINDS = ["bspline", "bspline_general", "poly", "poly_lut", "poly_lut_derivative"]


@pytest.mark.parametrize("kind", JET_KINDS)
@pytest.mark.parametrize("route", ["eager", "registered"])
@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("n_out", [2, 1])
def test_edge_jet_gradcheck(device, kind, route, chunked, n_out, monkeypatch):
    """The op's gradients in z, the weight and the bias by float64 finite differences, through the eager
    Function and the registered op, on one chunk of rows and on chunks of two rows (the forward's basis kept,
    or written again over G), with several outputs (G formed) and one (G's windows from the weight). A LUT
    family's z-gradient is not a finite difference of its values (its derivatives come from the derivative table
    or the exact recurrence, its values from the value table): only its weight and bias gradients are checked."""
    from warpkan.torch_bridge import jet_ops

    if chunked:
        monkeypatch.setattr(jet_ops, "JET_CHUNK_BYTES", 2 * 5 * 8 * 30)
    z, weight, bias, n_first, pairs, spec = _edge_args(kind, device, n_out=n_out, use_base=kind.startswith("bspline"))
    weight, bias = weight.requires_grad_(), bias.requires_grad_()
    z.requires_grad_(not kind.startswith("poly_lut"))
    if route == "eager":
        f = lambda z, w, b: jet_ops._EdgeJet.apply(z, w, b, n_first, pairs, spec)  # noqa: E731
    else:
        flat = [v for pair in pairs for v in pair]
        f = lambda z, w, b: jet_ops.edge_jet_op(z, w, b, list(spec.frame_tensors), spec.static_key(),  # noqa: E731
                                                n_first, flat)[0]
    assert torch.autograd.gradcheck(f, (z, weight, bias))


@pytest.mark.parametrize("kind", JET_KINDS)
def test_edge_jet_opcheck(device, kind):
    """opcheck (schema, fake tensor, autograd registration, AOT dispatch) of ``warpkan::edge_jet``."""
    from warpkan.torch_bridge.jet_ops import edge_jet_op

    z, weight, bias, n_first, pairs, spec = _edge_args(kind, device, use_base=kind.startswith("bspline"))
    z, weight, bias = (t.requires_grad_() for t in (z, weight, bias))
    flat = [v for pair in pairs for v in pair]
    for b in (bias, None):
        torch.library.opcheck(edge_jet_op, (z, weight, b, list(spec.frame_tensors), spec.static_key(), n_first, flat))


def test_edge_jet_chunks_match_one_chunk(device, monkeypatch):
    """Rows in chunks (the basis written again in the backward pass) give the one-chunk results."""
    from warpkan.torch_bridge import jet_ops

    torch.manual_seed(0)
    model = nn.Sequential(KANLinear(3, 5, grid_size=12, dtype=DOUBLE, device=device),
                          KANLinear(5, 2, dtype=DOUBLE, device=device), KANLinear(2, 1, dtype=DOUBLE, device=device))
    x = _x(101, 3, device)

    def run():
        out = jet(model, x, pairs=[(0, 0), (0, 1)])
        return out.stack, torch.autograd.grad(out.stack.square().sum(), list(model.parameters()))

    whole = run()
    monkeypatch.setattr(jet_ops, "JET_CHUNK_BYTES", 5 * 3 * (5 * 15) * 8 * 7)  # about 7 rows a chunk in layer 1
    chunked = run()
    torch.testing.assert_close(chunked[0], whole[0], rtol=1e-12, atol=1e-14)
    for a, b in zip(chunked[1], whole[1]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


def test_jet_float32_error_is_at_reference_level(device):
    """float32 jets and parameter gradients against float64, within a small factor of the float32 pure-torch
    autograd route's own error."""
    torch.manual_seed(0)
    model64 = nn.Sequential(KANLinear(2, 16, grid_size=5, dtype=DOUBLE, device=device),
                            KANLinear(16, 8, dtype=DOUBLE, device=device),
                            ChebyKANLinear(8, 1, 5).double().to(device))
    model32 = _reference_copy_float32(model64)
    x64 = _x(257, 2, device, lo=-0.95, hi=0.95)
    pairs = ((0, 0), (0, 1))

    def loss_and_grads(model, stack):
        loss = (stack * torch.linspace(0.5, 1.5, stack.shape[0], dtype=stack.dtype, device=device).view(-1, 1, 1)
                ).square().mean()
        return [stack.double(), *(g.double() for g in torch.autograd.grad(loss, list(model.parameters())))]

    ref64 = loss_and_grads(model64, _autograd_jet(_reference(model64), x64, pairs))
    ref32 = loss_and_grads(model32, _autograd_jet(_reference(model32), x64.float(), pairs))
    ours = loss_and_grads(model32, jet(model32, x64.float(), pairs).stack)
    for k, (a, r32, r64) in enumerate(zip(ours, ref32, ref64)):
        a, r32, r64 = a.detach(), r32.detach(), r64.detach()
        ref_err = float((r32 - r64).abs().max())
        err = float((a - r64).abs().max())
        scale = float(r64.abs().max())
        assert err <= 4 * ref_err + 1e-6 * scale, f"output {k}: error {err:.3e} vs the float32 reference's {ref_err:.3e}"


def _reference_copy_float32(model):
    import copy

    return copy.deepcopy(model).float()


def test_nan_rows_stay_in_their_rows(device):
    """A NaN coordinate gives NaN jets in its row only (the SiLU base path carries it), and the other rows are
    those of the clean input."""
    model = nn.Sequential(KANLinear(2, 3, dtype=DOUBLE, device=device), KANLinear(3, 1, dtype=DOUBLE, device=device))
    x = _x(9, 2, device)
    clean = jet(model, x, pairs=[(0, 0)]).stack
    x[4, 1] = float("nan")
    dirty = jet(model, x, pairs=[(0, 0)]).stack
    assert torch.isnan(dirty[:, 4]).all()
    rows = [r for r in range(9) if r != 4]
    torch.testing.assert_close(dirty[:, rows], clean[:, rows], rtol=0, atol=0)


def test_errors_name_the_problem(device):
    model = nn.Sequential(KANLinear(2, 3, dtype=DOUBLE, device=device))
    x = _x(4, 2, device)
    with pytest.raises(ValueError, match=r"directions must be in \[0, 2\)"):
        jet(model, x, pairs=[(0, 2)])
    with pytest.raises(ValueError, match="at most 8"):
        jet(model, x, pairs=[(0, 0)] * 9)
    with pytest.raises(TypeError, match="no Taylor-mode rule for ReLU.*register_jet_rule"):
        jet(nn.Sequential(nn.ReLU()), x)
    with pytest.raises(TypeError, match="its dtype and device"):
        jet(model, x.float())
    with pytest.raises(TypeError, match="floating-point"):
        jet(model, torch.ones(3, 2, dtype=torch.int64))
    out = jet(model, x.requires_grad_(), pairs=[(0, 0)])
    with pytest.raises(NotImplementedError, match=r"Taylor mode \(warpkan::edge_jet\): higher-order"):
        torch.autograd.grad(out.stack.sum(), x, create_graph=True)


class _Cube(nn.Module):
    def forward(self, z):
        return z ** 3


def test_register_jet_rule_for_a_custom_module(device):
    register_jet_rule(_Cube, elementwise_rule(lambda module, z: (z ** 3, 3 * z * z, 6 * z)))
    model = nn.Sequential(KANLinear(2, 3, dtype=DOUBLE, device=device), _Cube())
    x = _x(5, 2, device)
    expected = _autograd_jet(_reference(model), x, ((0, 1),))
    torch.testing.assert_close(jet(model, x, pairs=[(0, 1)]).stack, expected, rtol=1e-9, atol=1e-11)
    with pytest.raises(TypeError, match="nn.Module subclass"):
        register_jet_rule(int, lambda m, j: j)


def test_jet_is_a_frozen_dataclass():
    out = Jet(torch.zeros(2, 1, 1), 1, ())
    with pytest.raises(AttributeError):
        out.n_first = 2


def test_jet_algebra_builds_an_ansatz(device):
    """u = sin(pi x) + t (1 - x^2) N(x, t) - 0.5 t from the coordinates' jet (sums, products, constants, an
    elementwise map, columns) against autograd through the same expression."""
    import math

    torch.manual_seed(0)
    net = nn.Sequential(KANLinear(2, 4, dtype=DOUBLE, device=device), KANLinear(4, 1, dtype=DOUBLE, device=device))
    xt = _x(23, 2, device, lo=-0.9, hi=0.9)
    pairs = ((0, 0), (0, 1), (1, 1))
    from warpkan.torch_bridge import jet_of

    z = jet(nn.Identity(), xt, pairs)
    x, t = z.col(0), z.col(1)
    sine = (math.pi * x).map(lambda v: (torch.sin(v), torch.cos(v), -torch.sin(v)))
    u = sine + t * (1 - x * x) * jet_of(net, z) - 0.5 * t

    def ansatz(p):
        return torch.sin(math.pi * p[:, :1]) + p[:, 1:] * (1 - p[:, :1] ** 2) * _reference(net)(p) - 0.5 * p[:, 1:]

    expected = _autograd_jet(ansatz, xt, pairs)
    torch.testing.assert_close(u.stack, expected, rtol=1e-9, atol=1e-10)
    params = list(net.parameters())
    for a, b in zip(*(torch.autograd.grad(s.square().sum(), params) for s in (u.stack, expected))):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    with pytest.raises(ValueError, match="different directions or pairs"):
        u + jet(nn.Identity(), xt, ((0, 0),)).col(0)


@pytest.mark.parametrize("config", [dict(), dict(table_groups=40), dict(base_activation=None),
                                    dict(base_activation=nn.Tanh)])
def test_ukan_jet_matches_its_autograd_route(device, config):
    """UKANLinear on its dense-range table (the range read back, or a fixed table size; SiLU fused, no base path,
    an unfused base): jets and the parameter gradients of a loss of them against the layer's own
    create_graph=True route (checked against float64 finite differences in test_higher_order)."""
    from warpkan.torch_bridge import UKANLinear

    torch.manual_seed(0)
    model = nn.Sequential(UKANLinear(3, 4, grid_delta=0.25, dtype=DOUBLE, device=device, **config),
                          UKANLinear(4, 2, dtype=DOUBLE, device=device, **config))
    x = _x(29, 3, device, lo=-1.0, hi=1.0)
    pairs = ((0, 0), (1, 2))
    ours = jet(model, x, pairs=pairs).stack
    expected = _autograd_jet(model, x, pairs)
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12)
    params = list(model.parameters())
    grads = [torch.autograd.grad(s.square().sum(), params, allow_unused=True) for s in (ours, expected)]
    for a, b, p in zip(*grads, params):
        torch.testing.assert_close(torch.zeros_like(p) if a is None else a, torch.zeros_like(p) if b is None else b,
                                   rtol=1e-10, atol=1e-11)


def test_ukan_touched_pair_table_is_refused_by_name(device):
    from warpkan.torch_bridge import UKANLinear

    layer = UKANLinear(2, 3, grid_delta=0.01, dtype=DOUBLE, device=device)
    layer.dense_max_coefficients = 8
    with pytest.raises(NotImplementedError, match="touched-pair table.*dense_max_coefficients=8"):
        jet(layer, _x(5, 2, device, lo=-1.0, hi=1.0), pairs=[(0, 0)])
