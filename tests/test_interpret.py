"""warpkan.interpret: edge functions against float64 references written per edge, importance scores, pruning, grid
refinement and the sparsity penalty against pykan 0.2.8 on copied layers, symbolic fitting, formulas and plots."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import warpkan
from warpkan.interpret import (SymbolicFit, SymbolicKAN, SymbolicLayer, auto_symbolic, edge_functions, formula,
                               importance, plot_layer, plot_network, prune, refine, sparsity_penalty,
                               suggest_symbolic)
from warpkan.interpret import _layers
from warpkan.interpret.symbolic import SYMBOLIC_LIB, fit_function
from warpkan.reference.bspline import b_splines
from warpkan.reference.poly import basis_values
from warpkan.reference.rational import group_rational_reference
from warpkan.reference.ukan import ukan_linear
from warpkan.torch_bridge import ChebyKANLinear, GRKANLinear, KANLinear, PolyKANLinear, UKANLinear

F64 = torch.float64


def _torch_device(device):
    return torch.device("cuda" if device == "cuda" else "cpu")


def _layer(family, n_in, n_out, dtype=F64, device="cpu", seed=0):
    torch.manual_seed(seed)
    dev = _torch_device(device)
    if family == "kan":
        return KANLinear(n_in, n_out, grid_size=6, spline_order=3, dtype=dtype, device=dev)
    if family == "kan-nobase":
        return KANLinear(n_in, n_out, grid_size=4, spline_order=2, base_activation=None, dtype=dtype, device=dev)
    if family == "kan-nonuniform":
        layer = KANLinear(n_in, n_out, grid_size=5, spline_order=3, dtype=dtype, device=dev)
        layer.update_grid(torch.randn(400, n_in, dtype=dtype, device=dev) * 0.7)
        assert not layer._grid_uniform
        return layer
    if family == "kan-prelu":  # an activation run in torch beside the kernels, with a parameter of its own
        return KANLinear(n_in, n_out, grid_size=6, spline_order=3,
                         base_activation=torch.nn.PReLU(init=0.3).to(device=dev, dtype=dtype), dtype=dtype, device=dev)
    if family == "ukan":
        return UKANLinear(n_in, n_out, grid_delta=0.25, hidden_dim=8, dtype=dtype, device=dev)
    if family == "ukan-tanh":
        return UKANLinear(n_in, n_out, grid_delta=0.25, hidden_dim=8, base_activation=torch.nn.Tanh, dtype=dtype,
                          device=dev)
    if family == "cheby":
        layer = ChebyKANLinear(n_in, n_out, degree=5, mode="exact", bias=True, dtype=dtype, device=dev)
    elif family == "legendre-lut":
        layer = PolyKANLinear(n_in, n_out, degree=4, basis="legendre", mode="lut", bias=True, dtype=dtype, device=dev)
    elif family == "grkan":
        layer = GRKANLinear(n_in, n_out, num_groups=2, dtype=dtype, device=dev)
        with torch.no_grad():
            layer.rational.weight_denominator.add_(torch.rand_like(layer.rational.weight_denominator) * 0.3)
    else:
        raise AssertionError(family)
    with torch.no_grad():  # non-zero biases, so that leaving them out of the edges is tested
        bias = _layers.bias(layer)
        bias.copy_(torch.randn_like(bias))
    return layer


def _reference_edge(layer, o, i, t):
    """phi_{o,i}(t) of a float64 layer, from the formulas, one edge at a time."""
    if isinstance(layer, KANLinear):
        spline = b_splines(t.unsqueeze(1), layer.grid[i : i + 1], layer.spline_order)[:, 0] @ layer.spline_weight[o, i]
        base = layer.base_weight[o, i] * layer.base_activation(t) if layer.use_base else 0.0
        return base + layer.spline_scaler[o, i] * spline
    if isinstance(layer, UKANLinear):
        K = layer.spline_order + 1
        rows = slice(o * K, (o + 1) * K)
        return ukan_linear(t.unsqueeze(1), layer.grid_delta, layer.spline_order, layer.pe_dim,
                           layer.feature_embedding[i : i + 1], layer.cg_hidden.weight, layer.cg_hidden.bias,
                           layer.cg_out.weight[rows], layer.cg_out.bias[rows],
                           layer.spline_scaler[o : o + 1, i : i + 1],
                           layer.base_weight[o : o + 1, i : i + 1] if layer.use_base else None,
                           layer.base_activation)[:, 0]
    if isinstance(layer, PolyKANLinear):
        return basis_values(torch.tanh(t), layer.basis, layer.degree, layer.alpha, layer.beta) @ layer.coeffs[i, o]
    if isinstance(layer, GRKANLinear):
        columns = t.unsqueeze(1).expand(-1, layer.in_features)
        rational = group_rational_reference(columns, layer.rational.weight_numerator,
                                            layer.rational.weight_denominator, layer.rational.num_groups,
                                            layer.rational.variant)
        return layer.linear.weight[o, i] * rational[:, i]
    raise AssertionError(type(layer))


@pytest.mark.parametrize("family", ["kan", "kan-nobase", "kan-nonuniform", "kan-prelu", "ukan", "ukan-tanh",
                                    "cheby", "grkan"])
def test_edge_functions_match_a_float64_reference_per_edge(family, device):
    layer = _layer(family, 4, 3, device=device)
    x = torch.rand(97, 4, dtype=F64, device=_torch_device(device)) * 2.4 - 1.2
    edges = edge_functions(layer, x)
    assert edges.y.shape == (97, 3, 4) and edges.y.dtype == F64
    torch.testing.assert_close(edges.x, x)
    with torch.no_grad():
        for o in range(3):
            for i in range(4):
                torch.testing.assert_close(edges.y[:, o, i], _reference_edge(layer, o, i, x[:, i]), rtol=1e-10,
                                           atol=1e-11, msg=f"edge ({o}, {i})")


@pytest.mark.parametrize("family", ["kan", "kan-nonuniform", "kan-prelu", "ukan", "ukan-tanh", "cheby",
                                    "legendre-lut", "grkan"])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_edges_sum_to_the_layer_output(family, dtype, device):
    """The edges are the layer's own: summed over the inputs, plus the bias, they give its forward."""
    layer = _layer(family, 8, 5, dtype=dtype, device=device)
    x = torch.randn(300, 8, dtype=dtype, device=_torch_device(device))
    y = edge_functions(layer, x).y
    bias = _layers.bias(layer)
    with torch.no_grad():
        expected = layer(x)
    total = y.sum(-1) + (bias if bias is not None else 0)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == F64 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(total.detach(), expected, **tol)


def test_float32_edges_against_the_float64_reference():
    layer = _layer("kan", 3, 2, dtype=torch.float32)
    x = torch.rand(200, 3) * 2 - 1
    y = edge_functions(layer, x).y.double()
    layer64 = _layer("kan", 3, 2)
    layer64.load_state_dict({k: v.double() for k, v in layer.state_dict().items()})
    with torch.no_grad():
        for o in range(2):
            for i in range(3):
                expected = _reference_edge(layer64, o, i, x[:, i].double())
                torch.testing.assert_close(y[:, o, i], expected, rtol=2e-6, atol=2e-6)


def test_edge_functions_on_a_range():
    layer = _layer("kan", 3, 2)
    edges = edge_functions(layer, n=11)  # the layer's own grid interval [-1, 1]
    torch.testing.assert_close(edges.x[:, 0], torch.linspace(-1, 1, 11, dtype=F64))
    ranges = torch.tensor([[0.0, 1.0], [-2.0, 2.0], [0.5, 0.5]], dtype=F64)
    edges = edge_functions(layer, x_range=ranges, n=5)
    torch.testing.assert_close(edges.x[[0, -1]], ranges.t())
    assert edges.y.shape == (5, 2, 3)
    torch.testing.assert_close(edge_functions(layer, x_range=(-0.5, 0.5), n=3).x[:, 2],
                               torch.tensor([-0.5, 0.0, 0.5], dtype=F64))
    with pytest.raises(ValueError, match="no bounded domain"):
        edge_functions(_layer("ukan", 3, 2))
    with pytest.raises(ValueError, match="x_range"):
        edge_functions(layer, x_range=torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 3\)"):
        edge_functions(layer, torch.zeros(4, 2, dtype=F64))
    with pytest.raises(TypeError, match="KANLinear"):
        edge_functions(torch.nn.Linear(2, 2))


def test_native_layers_are_read_through_the_torch_layer():
    import warp as wp

    native = warpkan.KANLinear(3, 2, grid_size=5, device="cpu", dtype=wp.float64, seed=3)
    x = np.random.default_rng(0).uniform(-1, 1, (50, 3))
    y = native(wp.array(x, dtype=wp.float64, device="cpu")).numpy()
    edges = edge_functions(native, torch.from_numpy(x))
    np.testing.assert_allclose(edges.y.sum(-1).numpy(), y, rtol=1e-12, atol=1e-12)
    poly = warpkan.ChebyKANLinear(3, 2, degree=4, mode="exact", bias=True, device="cpu", dtype=wp.float64)
    y = poly(wp.array(x, dtype=wp.float64, device="cpu")).numpy()
    total = edge_functions(poly, torch.from_numpy(x)).y.sum(-1) + torch.from_numpy(poly.bias.numpy())
    np.testing.assert_allclose(total.numpy(), y, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------- pykan
@pytest.fixture
def float64_default():
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(saved)


def _pykan_copy(model, tmp_path):
    """A pykan MultKAN with the parameters of a Sequential of KANLinear (pykan's KANLayer keeps coef [in, out,
    G + k], scale_base and scale_sp [in, out]: efficient-kan's parameters transposed)."""
    from kan import MultKAN

    widths = [model[0].in_features] + [layer.out_features for layer in model]
    (tmp_path / "pykan").mkdir()  # prune and refine build models that write checkpoints there
    copy = MultKAN(width=list(widths), grid=model[0].grid_size, k=model[0].spline_order, auto_save=False,
                   ckpt_path=str(tmp_path / "pykan"), seed=0)
    with torch.no_grad():
        for ours, theirs in zip(model, copy.act_fun):
            theirs.grid.data = ours.grid.clone()
            theirs.coef.data = ours.spline_weight.permute(1, 0, 2).clone()
            theirs.scale_base.data = ours.base_weight.t().clone()
            theirs.scale_sp.data = ours.spline_scaler.t().clone()
    return copy


def _weak_network():
    """A [3, 6, 4, 2] KANLinear network with a dead hidden node, weak nodes and weak edges (so that the
    thresholds below cut through the scores)."""
    torch.manual_seed(5)
    model = torch.nn.Sequential(KANLinear(3, 6, grid_size=4), KANLinear(6, 4, grid_size=4),
                                KANLinear(4, 2, grid_size=4))
    with torch.no_grad():
        for layer in model:
            layer.spline_weight.normal_(0, 0.3)
        model[0].base_weight[2].mul_(0.01), model[0].spline_scaler[2].mul_(0.01)   # weak hidden node 2
        model[0].base_weight[4].zero_(), model[0].spline_weight[4].zero_()           # dead hidden node 4
        model[1].base_weight[:, 0].mul_(0.02), model[1].spline_scaler[:, 0].mul_(0.02)  # weak edges
        model[2].base_weight[1].mul_(0.05), model[2].spline_weight[1].mul_(0.05)
    return model


def test_importance_matches_pykan_attribute(float64_default, tmp_path):
    model = _weak_network()
    x = torch.rand(500, 3) * 2 - 1
    theirs = _pykan_copy(model, tmp_path)
    theirs(x)
    theirs.attribute(plot=False)
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), model(x), rtol=1e-12, atol=1e-12)  # the copy is the same network
    scores = importance(model, x)
    for ours, expected in zip(scores.edge, theirs.edge_scores):
        torch.testing.assert_close(ours, expected.detach(), rtol=1e-10, atol=1e-12)
    for ours, expected in zip(scores.node, theirs.node_scores):
        torch.testing.assert_close(ours, expected.detach(), rtol=1e-10, atol=1e-12)
    for ours, expected in zip(scores.edge_actscale, theirs.edge_actscale):
        torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12)


def test_prune_matches_pykan(float64_default, tmp_path):
    model = _weak_network()
    x = torch.rand(500, 3) * 2 - 1
    node_th, edge_th = 0.02, 0.03
    scores = importance(model, x)
    hidden = torch.cat(scores.node[1:-1])  # no score too close to the threshold, and some below it
    assert (hidden - node_th).abs().min() > 1e-4 and (scores.node[1] <= node_th).sum() == 2
    theirs = _pykan_copy(model, tmp_path)
    theirs(x)
    theirs = theirs.prune(node_th=node_th, edge_th=edge_th)
    ours = prune(model, x, node_threshold=node_th, edge_threshold=edge_th)
    assert isinstance(ours, torch.nn.Sequential) and all(type(layer) is KANLinear for layer in ours)
    assert [ours[0].in_features] + [layer.out_features for layer in ours] == [w[0] for w in theirs.width]
    for layer, their_layer in zip(ours, theirs.act_fun):
        assert torch.equal(_layers.live_edges(layer), their_layer.mask.t() > 0)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-12, atol=1e-12)
    assert any((~_layers.live_edges(layer)).any() for layer in ours)  # some edges were pruned


@pytest.mark.parametrize("family", ["kan", "kan-prelu", "ukan", "ukan-tanh", "cheby", "grkan"])
def test_prune_keeps_surviving_edges_and_outputs(family):
    torch.manual_seed(1)
    first, second = _layer(family, 4, 6, seed=1), _layer(family, 6, 2, seed=2)
    model = torch.nn.Sequential(first, second)
    x = torch.randn(400, 4, dtype=F64)
    scores = importance(model, x)
    node_th = float(scores.node[1].sort().values[2])  # prune the three weakest hidden nodes
    # edges are pruned on the scores of the node-pruned network (as pykan does): a threshold at the median of
    # those removes some edges and keeps others, whatever the random initial values
    node_pruned = prune(model, x, node_threshold=node_th, edge_threshold=0.0)
    edge_th = float(torch.cat([e.flatten() for e in importance(node_pruned, x).edge]).median())
    pruned = prune(model, x, node_threshold=node_th, edge_threshold=edge_th)
    assert [type(layer) for layer in pruned] == [type(first), type(second)]
    kept = (scores.node[1] > node_th).nonzero().flatten()
    assert pruned[0].out_features == 3 == kept.numel() and pruned[1].in_features == 3
    with torch.no_grad():
        hidden = first(x)
        for layer, original, inputs, outputs, acts in ((pruned[0], first, torch.arange(4), kept, x),
                                                       (pruned[1], second, kept, torch.arange(2), hidden)):
            live = _layers.live_edges(layer)
            new = edge_functions(layer, acts[:, inputs]).y
            old = edge_functions(original, acts).y[:, outputs][:, :, inputs]
            torch.testing.assert_close(new, old * live, rtol=1e-12, atol=1e-12)  # kept edges unchanged, others 0
            bias = _layers.bias(original)
            expected = (old * live).sum(-1) + (bias[outputs] if bias is not None else 0)
            torch.testing.assert_close(layer(acts[:, inputs]), expected, rtol=1e-10, atol=1e-10)
        assert (~_layers.live_edges(pruned[1])).any() or (~_layers.live_edges(pruned[0])).any()


def test_prune_of_dead_parts_leaves_the_network_unchanged():
    model = _weak_network()
    with torch.no_grad():
        model[1].base_weight[:, 4].zero_(), model[1].spline_weight[:, 4].zero_()  # node 4 dead both ways
    x = torch.rand(300, 3) * 2 - 1
    pruned = prune(model, x, node_threshold=1e-12, edge_threshold=0.0)
    assert pruned[0].out_features == 5
    with torch.no_grad():
        torch.testing.assert_close(pruned(x), model(x), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="nothing would be left"):
        prune(model, x, node_threshold=1e9)


def test_refine_matches_pykan_grid_extension(float64_default, tmp_path):
    torch.manual_seed(2)
    model = torch.nn.Sequential(KANLinear(2, 3, grid_size=5), KANLinear(3, 1, grid_size=5))
    x = torch.rand(300, 2) * 2 - 1
    with torch.no_grad():
        h = x
        for layer in model:  # non-uniform grids, as after training
            layer.update_grid(h)
            h = layer(h)
    theirs = _pykan_copy(model, tmp_path)
    theirs(x)
    theirs = theirs.refine(12)
    ours = refine(model, 12, x)
    for layer, their_layer in zip(ours, theirs.act_fun):
        assert layer.grid_size == 12
        torch.testing.assert_close(layer.grid, their_layer.grid.data, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(layer.spline_weight, their_layer.coef.data.permute(1, 0, 2), rtol=1e-7, atol=1e-9)
        assert layer._grid_uniform == False  # noqa: E712


@pytest.mark.parametrize("reg_metric,lambdas", [
    ("edge_forward_spline_n", {}),  # pykan's fit defaults
    ("edge_forward_spline_n", dict(lamb_l1=0.7, lamb_entropy=1.3, lamb_coef=0.4, lamb_coefdiff=0.9)),
    ("edge_forward_spline_u", dict(lamb_l1=1.0, lamb_entropy=2.0, lamb_coef=0.0, lamb_coefdiff=0.5)),
])
def test_sparsity_penalty_matches_pykan_reg(float64_default, tmp_path, reg_metric, lambdas):
    """The penalty and its gradients in every parameter against pykan's ``reg`` after a forward pass, on a copied
    network with weak nodes and edges and a dead edge (zero values: zero scale, no gradient). (No dead node: the
    next layer's edges would be constant over the batch, and pykan's gradient of their standard deviation rounding
    noise; see test_sparsity_penalty_of_a_dead_node.)"""
    model = _weak_network()
    with torch.no_grad():
        model[0].spline_weight[4].normal_(0, 1e-3)  # the dead hidden node weak instead
        model[0].base_weight[1, 2].zero_(), model[0].spline_weight[1, 2].zero_()  # a dead edge
    x = torch.rand(500, 3) * 2 - 1
    theirs = _pykan_copy(model, tmp_path)
    theirs(x)
    pykan_args = {"lamb_l1": 1.0, "lamb_entropy": 2.0, "lamb_coef": 0.0, "lamb_coefdiff": 0.0, **lambdas}
    expected = theirs.reg(reg_metric, **pykan_args)
    ours = sparsity_penalty(model, x, reg_metric=reg_metric, **lambdas)
    torch.testing.assert_close(ours, expected, rtol=1e-12, atol=0)
    their_params = [p for layer in theirs.act_fun for p in (layer.coef, layer.scale_base, layer.scale_sp)]
    our_params = [p for layer in model for p in (layer.spline_weight, layer.base_weight, layer.spline_scaler)]
    their_grads = torch.autograd.grad(expected, their_params)
    our_grads = torch.autograd.grad(ours, our_params)
    for k, (a, b) in enumerate(zip(our_grads, their_grads)):
        b = b.permute(1, 0, 2) if b.dim() == 3 else b.t()  # pykan's [in, out, ...]
        # rounding, amplified by the weak node's small spread (measured: at most 2e-10 of the largest entry)
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9 * float(b.abs().max()), msg=f"parameter {k}")


def test_sparsity_penalty_of_a_dead_node():
    """A dead hidden node (every edge into it zero) feeds the next layer a constant, so that layer's edges at it
    are constant over the batch: their scales are exactly zero and pass no gradient. Computed as the standard
    deviation of the contracted edge values, they were rounding noise (the float64 GEMM rounds equal columns
    differently) with an O(1) gradient in a random direction (measured: 97.8 in a coefficient of such an edge,
    whose true gradient, through the last layer's inputs, is 0.216; the values less their first point after the
    contraction still left 0.31 of error in a base weight into the node). The float64 gradients agree with the
    float32 ones."""
    x = torch.rand(500, 3, dtype=F64) * 2 - 1
    runs = []
    for dtype in (F64, torch.float32):
        model = _weak_network().to(dtype)  # hidden node 4 of layer 0 is dead
        penalty = sparsity_penalty(model, x.to(dtype))
        edges = _layers.live_edges(model[0])
        assert not edges[4].any()
        runs.append([g.double() for g in torch.autograd.grad(penalty, list(model.parameters()))])
    for name, a, b in zip([n for n, _ in _weak_network().named_parameters()], *runs):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4 * float(b.abs().max()), msg=name)


def _penalty_network(family, dtype=F64):
    if family == "katmlp":
        torch.manual_seed(3)
        mlp = warpkan.torch_bridge.KATMLP(4, 4, 2, num_groups=2, dtype=dtype)
        with torch.no_grad():  # off the identity init's zero denominator, where |.| has no derivative
            for layer in (mlp.fc1, mlp.fc2):
                layer.rational.weight_denominator.add_(torch.rand_like(layer.rational.weight_denominator) * 0.3)
        return mlp
    return torch.nn.Sequential(_layer(family, 4, 4, dtype=dtype, seed=1), _layer(family, 4, 2, dtype=dtype, seed=2))


@pytest.mark.parametrize("family", ["kan", "kan-nonuniform", "kan-prelu", "ukan", "cheby", "grkan", "katmlp"])
def test_sparsity_penalty_gradcheck(family):
    """Float64 finite differences of the penalty in every parameter of a two-layer network of each family (the
    second layer's scales depend on the first's parameters through its inputs), the coefficient terms on for the
    B-spline layers."""
    model = _penalty_network(family)
    x = torch.rand(9, 4, dtype=F64) * 2.4 - 1.2
    coefficient_terms = dict(lamb_coef=0.3, lamb_coefdiff=0.2) if family.startswith("kan") else {}
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    params = dict(model.named_parameters())

    class Penalty(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return sparsity_penalty(self.model, x, **coefficient_terms)

    penalty = Penalty()

    def f(*values):
        return torch.func.functional_call(penalty, {f"model.{n}": v for n, v in zip(names, values)}, (x,))

    inputs = tuple(params[n].detach().clone().requires_grad_() for n in names)
    assert torch.autograd.gradcheck(f, inputs)


@pytest.mark.parametrize("family", ["kan", "ukan", "cheby", "legendre-lut", "grkan"])
def test_sparsity_penalty_float32_against_float64(family):
    model64 = _penalty_network(family)
    model32 = _penalty_network(family, dtype=torch.float32)
    model32.load_state_dict({k: v.float() for k, v in model64.state_dict().items()})
    x = torch.rand(300, 4, dtype=F64) * 2.4 - 1.2
    expected = sparsity_penalty(model64, x)
    got = sparsity_penalty(model32, x.float())
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=0)


@pytest.mark.parametrize("reg_metric", ["edge_forward_spline_n", "edge_forward_spline_u"])
def test_sparsity_penalty_of_a_symbolic_kan(reg_metric):
    """A SymbolicKAN's penalty from its edge values written out: its numeric edges alone under
    "edge_forward_spline_n" (the fixed ones count zero, as pykan's masked splines), every edge under
    "edge_forward_spline_u"; the next layer's inputs are the symbolic layer's outputs. Its gradient reaches the
    fixed edges' affine parameters (through the next layer's inputs) and no masked numeric parameter."""
    model = torch.nn.Sequential(_layer("kan", 2, 3, seed=1), _layer("kan", 3, 1, seed=2))
    fit = SymbolicFit("sin", 1.5, 2.0, 0.3, 0.1, 1.0, 2, 0.0)
    symbolic = SymbolicKAN([SymbolicLayer(model[0], [(1, 0, fit), (2, 1, fit)]), SymbolicLayer(model[1])])
    x = torch.rand(200, 2, dtype=F64) * 2 - 1
    expected, h = 0.0, x
    for layer in symbolic.layers:
        with torch.no_grad():
            if reg_metric == "edge_forward_spline_n":
                scale = (edge_functions(layer.numeric, h).y * layer.keep).std(0) / (h.std(0) + 0.1)
            else:
                scale = layer.edge_values(h).std(0)
            rows, cols = scale / (scale.sum(1, keepdim=True) + 1), scale / (scale.sum(0, keepdim=True) + 1)
            entropy = -(rows * torch.log2(rows + 1e-4)).sum(1).mean() - (cols * torch.log2(cols + 1e-4)).sum(0).mean()
            expected = expected + scale.sum() + 2 * entropy
            h = layer(h)
    ours = sparsity_penalty(symbolic, x, reg_metric=reg_metric)
    torch.testing.assert_close(ours, expected, rtol=1e-12, atol=0)
    first = symbolic.layers[0]
    d_affine, d_spline = torch.autograd.grad(ours, [first.affine, first.numeric.spline_weight])
    assert (d_affine != 0).any()
    assert (d_spline[~first.keep] == 0).all()


def test_sparsity_penalty_refuses_what_it_cannot_penalise():
    model = torch.nn.Sequential(_layer("kan", 2, 3), _layer("cheby", 3, 1))
    x = torch.rand(20, 2, dtype=F64)
    with pytest.raises(ValueError, match="reg_metric must be one of"):
        sparsity_penalty(model, x, reg_metric="edge_backward")
    with pytest.raises(ValueError, match="lamb_coef and lamb_coefdiff penalise B-spline.*layer 1 is a ChebyKANLinear"):
        sparsity_penalty(model, x, lamb_coefdiff=1.0)
    with pytest.raises(TypeError, match="lamb_entropy must be a finite number"):
        sparsity_penalty(model, x, lamb_entropy=float("nan"))
    with pytest.raises(ValueError, match="at least 2 samples"):
        sparsity_penalty(model, x[:1])
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 2\)"):
        sparsity_penalty(model, torch.rand(20, 3, dtype=F64))
    with pytest.raises(TypeError, match="Warp-native KANLinear"):
        sparsity_penalty(warpkan.KANLinear(2, 3, grid_size=5, device="cpu"), x.float())


@pytest.mark.parametrize("family", ["kan", "kan-nonuniform", "kan-prelu"])
def test_refine_preserves_the_function(family):
    nonuniform = family == "kan-nonuniform"
    layer = _layer(family, 3, 2)
    lo, hi = layer.grid[:, 3], layer.grid[:, -4]
    t = torch.rand(500, 3, dtype=F64) * (hi - lo) + lo
    with torch.no_grad():
        finer = refine(layer, 2 * layer.grid_size)  # every old knot is a new knot: exact
        torch.testing.assert_close(finer(t), layer(t), rtol=1e-9, atol=1e-9)
        other = refine(layer, 7)  # not nested: a least-squares approximation
        error = (other(t) - layer(t)).abs().max()
        assert 0 < error < 0.05 * layer(t).abs().max()
    assert finer._grid_uniform == (not nonuniform)
    with pytest.raises(TypeError, match="KANLinear"):
        refine(_layer("cheby", 2, 2), 8)


# ---------------------------------------------------------------------------------------------- symbolic
@pytest.mark.parametrize("name, params", [("sin", (2.0, 3.0, 0.5, 1.0)), ("x^2", (-1.5, 1.0, 0.3, 0.2)),
                                          ("exp", (0.7, 1.3, 0.0, -2.0)), ("tanh", (1.2, 2.5, -0.4, 0.1)),
                                          ("gaussian", (1.0, 1.7, 0.2, 0.0)), ("log", (0.5, 1.0, 1.5, 0.0))])
def test_fit_function_recovers_known_parameters(name, params):
    x = np.linspace(-1, 1, 400)
    a, b, c, d = params
    y = a * SYMBOLIC_LIB[name].numpy(b * x + c) + d
    fit = fit_function(x, y, SYMBOLIC_LIB[name])
    assert fit.r2 > 1 - 1e-10
    fitted = fit.a * SYMBOLIC_LIB[name].numpy(fit.b * x + fit.c) + fit.d
    np.testing.assert_allclose(fitted, y, atol=1e-6)
    if name in ("sin", "tanh", "gaussian"):  # no normalisation: the parameters themselves (up to symmetry)
        assert abs(abs(fit.b) - b) < 1e-5
    else:  # normalised: b = 1 for powers and log, c = 0 for exp
        assert fit.b == 1.0 if name != "exp" else fit.c == 0.0


@pytest.mark.parametrize("spread", [0.01, 0.125, 1.0, 40.0])
def test_fit_function_ranges_are_relative_to_the_spread_of_x(spread):
    # the same curves on inputs of any spread and offset: b_range bounds b for x mapped onto [-1, 1], so
    # exp(3 t) and sin(4 t + 1) are found at every spread (with b = 3 / spread, 4 / spread: 300 for 0.01)
    t = np.linspace(-1, 1, 400)
    x = 3 * spread + spread * t
    for name, (a, b, c, d), scale in (("exp", (1.3, 3.0, 0.0, 0.01), 1e-6), ("sin", (0.7, 4.0, 1.0, -0.2), 1e-6)):
        y = a * SYMBOLIC_LIB[name].numpy(b * t + c) + d
        fit = fit_function(x, y, SYMBOLIC_LIB[name])
        assert fit.r2 > 1 - 1e-10, (name, fit)
        np.testing.assert_allclose(fit.a * SYMBOLIC_LIB[name].numpy(fit.b * x + fit.c) + fit.d, y, atol=scale)
        assert abs(fit.b * spread - b) < 1e-5 * b
    # so the exponential (complexity 2) is found and ranks above the tanh imitating it (complexity 3)
    fits = suggest_symbolic(_symbolic_layer([(0, 0, "exp", (1.3, 3.0 / spread, -9.0, 0.0))], _layer("kan", 1, 1)),
                            0, 0, torch.tensor(x, dtype=F64).unsqueeze(1))
    assert fits[0].name == "exp" and fits[0].r2 > 1 - 1e-10


@pytest.mark.parametrize("name, params", [("sin", (-1.5, -2.0, 2.5 + 2 * math.pi, 0.3)), ("sin", (1.0, 3.0, -3.0, 0.0)),
                                          ("tanh", (1.2, -2.5, 0.4, 0.1)), ("gaussian", (1.0, -1.7, 0.2, 0.0))])
def test_fit_function_normalises_symmetric_functions(name, params):
    # sin: b > 0 and |c| <= pi / 2 (a sin(u) = -a sin(u - pi), 2 pi periodic); tanh and the gaussian: b > 0
    x = np.linspace(-1, 1, 400)
    a, b, c, d = params
    y = a * SYMBOLIC_LIB[name].numpy(b * x + c) + d
    fit = fit_function(x, y, SYMBOLIC_LIB[name])
    assert fit.r2 > 1 - 1e-10 and fit.b > 0
    if name == "sin":
        assert abs(fit.c) <= math.pi / 2
    np.testing.assert_allclose(fit.a * SYMBOLIC_LIB[name].numpy(fit.b * x + fit.c) + fit.d, y, atol=1e-6)


def _symbolic_layer(fixed, layer=None):
    layer = layer or _layer("kan", 3, 2)
    fits = [(o, i, SymbolicFit(name, *p, r2=1.0, complexity=SYMBOLIC_LIB[name].complexity, score=0.0))
            for o, i, name, p in fixed]
    return SymbolicLayer(layer, fits)


def test_symbolic_layer_forward_gradients_and_edges():
    layer = _layer("kan", 3, 2)
    sym = _symbolic_layer([(0, 1, "sin", (2.0, 3.0, 0.5, 1.0)), (1, 2, "x^2", (0.5, 1.0, -0.2, 0.3))], layer)
    x = torch.rand(64, 3, dtype=F64) * 2 - 1
    edges = edge_functions(sym, x).y
    with torch.no_grad():
        numeric = edge_functions(layer, x).y
        torch.testing.assert_close(edges[:, 0, 1], 2 * torch.sin(3 * x[:, 1] + 0.5) + 1)
        torch.testing.assert_close(edges[:, 1, 2], 0.5 * (x[:, 2] - 0.2) ** 2 + 0.3)
        for o, i in [(0, 0), (0, 2), (1, 0), (1, 1)]:
            torch.testing.assert_close(edges[:, o, i], numeric[:, o, i])
    y = sym(x)
    torch.testing.assert_close(y.detach(), edges.sum(-1), rtol=1e-12, atol=1e-12)
    y.square().sum().backward()
    assert sym.numeric.base_weight.grad[0, 1] == 0 and sym.numeric.base_weight.grad[1, 2] == 0
    assert (sym.numeric.spline_weight.grad[0, 1] == 0).all() and (sym.numeric.spline_weight.grad[1, 2] == 0).all()
    assert sym.numeric.base_weight.grad[0, 0] != 0 and (sym.affine.grad != 0).all()
    fits = suggest_symbolic(sym, 0, 1, x_range=(-1, 1), n=300)
    assert fits[0].name == "sin" and fits[0].r2 > 1 - 1e-10
    assert {fit.name for fit in fits} == set(SYMBOLIC_LIB)
    assert all(first.score <= second.score for first, second in zip(fits, fits[1:]))


def test_suggest_symbolic_on_a_layer_edge():
    layer = _layer("kan", 3, 2)
    with torch.no_grad():  # edge (1, 2) = 0.8 silu(x) exactly: no spline term
        layer.spline_weight[1, 2].zero_()
        layer.base_weight[1, 2] = 0.8
    lib = ["x", "x^2", "tanh", "sin"]
    # on the grid interval [-1, 1]; ranked by R^2 alone
    fits = suggest_symbolic(layer, 1, 2, lib=lib, weight_simple=0.0, r2_tolerance=0.0, n=500)
    t = np.linspace(-1, 1, 500)
    values = 0.8 * t / (1 + np.exp(-t))
    expected = {name: fit_function(t, values, SYMBOLIC_LIB[name], weight_simple=0.0) for name in lib}
    assert [fit.name for fit in fits] == sorted(lib, key=lambda name: -expected[name].r2)
    for fit in fits:
        assert abs(fit.r2 - expected[fit.name].r2) < 1e-9
    # silu on [-1, 1] is nearly a parabola: a cosine with a ~ -30 fits it slightly better, within the default
    # r2_tolerance, so the parabola (3 free constants, the cosine's 4) leads; the rest keep their order
    assert fits[0].name == "sin" and abs(fits[0].a) > 10
    default = suggest_symbolic(layer, 1, 2, lib=lib, weight_simple=0.0, n=500)
    assert [fit.name for fit in default] == ["x^2"] + [fit.name for fit in fits if fit.name != "x^2"]
    with pytest.raises(ValueError, match="o must be"):
        suggest_symbolic(layer, 2, 0)
    with pytest.raises(ValueError, match="unknown function"):
        suggest_symbolic(layer, 0, 0, lib=["nope"])


def test_auto_symbolic_and_formula():
    import sympy

    inner = _symbolic_layer([(0, 0, "sin", (1.0, math.pi, 0.0, 0.0)), (0, 1, "x^2", (1.0, 1.0, 0.0, 0.0))],
                            _layer("kan", 2, 1))
    outer = _symbolic_layer([(0, 0, "exp", (1.0, 1.0, 0.0, 0.0))], _layer("kan", 1, 1))
    exact = SymbolicKAN([inner, outer])
    x = torch.rand(400, 2, dtype=F64) * 2 - 1
    with torch.no_grad():
        torch.testing.assert_close(exact(x)[:, 0], torch.exp(torch.sin(math.pi * x[:, 0]) + x[:, 1] ** 2))
    expression = formula(exact, variables=["x", "y"])[0]
    xs, ys = sympy.symbols("x y")
    assert sympy.simplify(expression - sympy.exp(sympy.sin(sympy.Float(math.pi) * xs) + ys**2)) == 0
    # auto_symbolic on the SymbolicKAN's values recovers the same functions
    recovered = auto_symbolic(exact, x, r2_threshold=0.99)
    names = [[fit.name for _, _, fit in layer.fixed_edges()] for layer in recovered.layers]
    assert names == [["sin", "x^2"], ["exp"]]
    numeric = auto_symbolic(torch.nn.Sequential(_layer("kan", 2, 2), _layer("kan", 2, 1)), x, r2_threshold=2.0)
    text = str(formula(numeric)[0])
    assert "phi_1_0_0(phi_0_0_0(x_1) + phi_0_0_1(x_2))" in text and "phi_1_0_1" in text
    evaluate = sympy.lambdify(sympy.symbols("x_1 x_2"), formula(recovered)[0], "numpy")
    np.testing.assert_allclose(evaluate(x[:, 0].numpy(), x[:, 1].numpy()), exact(x)[:, 0].detach().numpy(),
                               rtol=1e-6, atol=1e-6)
    rounded = formula(recovered, digits=3)[0]
    assert all(len(f"{float(f):.10g}".replace("-", "").replace(".", "").lstrip("0").rstrip("0")) <= 3
               for f in rounded.atoms(sympy.Float))


def test_r2_tolerance_prefers_the_simpler_function():
    # an edge that is a parabola up to a small quartic term: sin (a cos(b x) + d with small b, huge a) and the
    # gaussian fit it a little better than x^2 does; within r2_tolerance of each other x^2 is the simpler one
    x = torch.linspace(-1, 1, 400, dtype=F64).unsqueeze(1)
    y = x**2 - 0.02 * x**4
    layer = KANLinear(1, 1, grid_size=10, base_activation=None, dtype=F64)
    with torch.no_grad():
        layer.spline_scaler.fill_(1.0)
        basis = b_splines(x, layer.grid, 3)[:, 0]
        layer.spline_weight.copy_(torch.linalg.lstsq(basis, y).solution.reshape(1, 1, -1))
        assert (layer(x) - y).abs().max() < 1e-5
    by_r2 = suggest_symbolic(layer, 0, 0, x, r2_tolerance=0.0)
    assert by_r2[0].name in ("sin", "gaussian") and abs(by_r2[0].a) > 5
    parabola = next(fit for fit in by_r2 if fit.name == "x^2")
    assert 1e-6 < by_r2[0].r2 - parabola.r2 < 1e-4
    simplest = suggest_symbolic(layer, 0, 0, x)
    assert simplest[0] == parabola and simplest[1:] == [fit for fit in by_r2 if fit is not parabola]
    names = {tol: [fit.name for _, _, fit in auto_symbolic(layer, x, r2_tolerance=tol).layers[0].fixed_edges()]
             for tol in (0.0, 1e-4)}
    assert names == {0.0: [by_r2[0].name], 1e-4: ["x^2"]}
    # a tolerance below the gap keeps the best R^2
    assert suggest_symbolic(layer, 0, 0, x, r2_tolerance=1e-7)[0].name == by_r2[0].name
    for bad in (-1e-3, float("nan"), "0.1", True):
        with pytest.raises(ValueError, match="r2_tolerance"):
            auto_symbolic(layer, x, r2_tolerance=bad)


def test_symbolic_kan_fine_tunes_with_lbfgs():
    torch.manual_seed(0)
    x = torch.rand(300, 1, dtype=F64) * 2 - 1
    y = 2.0 * torch.sin(3.0 * x + 0.5) + 1.0
    sym = SymbolicKAN([_symbolic_layer([(0, 0, "sin", (1.5, 2.8, 0.4, 0.8))], _layer("kan", 1, 1))])
    opt = torch.optim.LBFGS([sym.layers[0].affine], lr=1, max_iter=50, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.mse_loss(sym(x), y)
        loss.backward()
        return loss

    opt.step(closure)
    assert F.mse_loss(sym(x), y).item() < 1e-10  # from about 0.1


# ---------------------------------------------------------------------------------------------- plots
def test_plots_save_png_and_svg(tmp_path):
    from matplotlib.collections import LineCollection

    torch.manual_seed(0)
    model = torch.nn.Sequential(_layer("kan", 2, 3, dtype=torch.float32), _layer("cheby", 3, 1, dtype=torch.float32))
    x = torch.rand(200, 2) * 2 - 1
    png, svg = tmp_path / "net.png", tmp_path / "net.svg"
    fig = plot_network(model, x, png, in_vars=["x", "y"], out_vars=["f"], title="net")
    plot_network(model, x, svg)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and b"<svg" in svg.read_bytes()[:400]
    lines = [c for c in fig.axes[0].collections if isinstance(c, LineCollection)]
    curves = [c for c in lines if len(c.get_segments()) == 2 * 3 + 3 * 1]
    assert curves, "one curve per edge"
    alphas = curves[0].get_colors()[:, 3]
    expected = np.tanh(3 * np.concatenate([s.t().reshape(-1).numpy() for s in importance(model, x).edge]))
    np.testing.assert_allclose(alphas, expected, rtol=1e-6)
    plot_layer(model[0], None, tmp_path / "layer.png")  # a KANLinear alone: its grid interval, no data
    assert (tmp_path / "layer.png").stat().st_size > 1000
    sym = _symbolic_layer([(0, 1, "sin", (1.0, 2.0, 0.0, 0.0))], _layer("kan", 2, 3, dtype=torch.float32))
    fig = plot_layer(sym, x)
    colours = [c for c in fig.axes[0].collections if isinstance(c, LineCollection) and len(c.get_segments()) == 6]
    colours = colours[0].get_colors()
    assert (colours[:, 0] > 0.5).sum() == 1  # the fixed edge is red
    with pytest.raises(ValueError, match="no bounded domain"):
        plot_network(model)
    with pytest.raises(ValueError, match="in_vars must have 2 names"):
        plot_network(model, x, in_vars=["x"])
