"""``edge_view(x)`` of the edge layers: the engine's view of a layer (spec, coefficient table, base weight and
scaler, bias, an unfused base activation) computes the layer's own forward, its tensors reach the parameters,
and bad rows are refused by name."""

import pytest
import torch
from torch import nn

from warpkan.interpret import edge_functions
from warpkan.torch_bridge import ChebyKANLinear, KANLinear, PolyKANLinear, UKANLinear
from warpkan.torch_bridge.edge_driver import EdgeView, dense_basis

F64 = torch.float64


def _layer(kind, n_in, n_out, device):
    torch.manual_seed(0)
    factory = dict(dtype=F64, device=device)
    if kind == "kan":
        return KANLinear(n_in, n_out, grid_size=5, **factory)
    if kind == "kan-tanh":
        return KANLinear(n_in, n_out, grid_size=5, base_activation=nn.Tanh, **factory)
    if kind == "kan-nobase":
        return KANLinear(n_in, n_out, grid_size=4, spline_order=2, base_activation=None, **factory)
    if kind == "ukan":
        return UKANLinear(n_in, n_out, grid_delta=0.25, hidden_dim=8, **factory)
    if kind == "ukan-fixed":
        return UKANLinear(n_in, n_out, grid_delta=0.25, hidden_dim=8, table_groups=3, **factory)
    if kind == "ukan-tanh":
        return UKANLinear(n_in, n_out, grid_delta=0.25, hidden_dim=8, base_activation=nn.Tanh, **factory)
    if kind == "cheby":
        layer = ChebyKANLinear(n_in, n_out, degree=4, mode="exact", bias=True, **factory)
    else:
        layer = PolyKANLinear(n_in, n_out, degree=4, basis="legendre", mode="lut", bias=True, **factory)
    with torch.no_grad():
        layer.bias.normal_()
    return layer


def _output_of(view: EdgeView, x):
    """y of the view by torch ops: the dense basis against the combined weight, the bias, the torch base path."""
    y = dense_basis(x, None, 0, view.spec).t() @ view.weight()
    if view.bias is not None:
        y = y + view.bias
    if view.base_activation is not None:
        y = y + view.base_activation(x) @ view.base_weight_t
    return y


KINDS = ["kan", "kan-tanh", "kan-nobase", "ukan", "ukan-fixed", "ukan-tanh", "cheby", "legendre-lut"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_view_computes_the_layer_forward(kind, device):
    layer = _layer(kind, 3, 4, device)
    x = torch.rand(41, 3, dtype=F64, device=device) * 3 - 1.5  # the fixed UKAN table's 3 groups cut some off
    view = layer.edge_view(x)
    assert isinstance(view, EdgeView) and view.coef.shape[::2] == (3, 4)
    assert view.spec.n_coef == view.coef.shape[1]
    with torch.no_grad():
        torch.testing.assert_close(_output_of(view, x), layer(x), rtol=1e-12, atol=1e-12)
    # the kernel-made combined weight is the torch one
    torch.testing.assert_close(view.weight(by_kernel=True), view.weight(), rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["kan", "ukan", "cheby"])
def test_the_view_reaches_the_parameters(kind, device):
    layer = _layer(kind, 2, 3, device)
    x = torch.rand(9, 2, dtype=F64, device=device) - 0.5
    _output_of(layer.edge_view(x), x).square().sum().backward()
    grads = [p.grad for p in layer.parameters() if p.requires_grad]
    assert grads and all(g is not None for g in grads)


def test_poly_exact_derivatives_keep_the_values_and_change_only_a_lut_layer_spec(device):
    lut = _layer("legendre-lut", 2, 3, device)
    exact = _layer("cheby", 2, 3, device)
    x = torch.rand(7, 2, dtype=F64, device=device) - 0.5
    assert lut.edge_view(x, exact_derivatives=True).spec.family != lut.edge_view(x).spec.family
    assert exact.edge_view(x, exact_derivatives=True).spec == exact.edge_view(x).spec
    with torch.no_grad():  # the values come from the value table either way
        torch.testing.assert_close(_output_of(lut.edge_view(x, exact_derivatives=True), x), lut(x), rtol=1e-12,
                                   atol=1e-12)


def test_fixed_ukan_table_edges_sum_to_the_forward_past_its_groups(device):
    """A fixed-size UKAN table (table_groups=R) gives no spline term to groups past the lowest touched + R - 1;
    the interpretability edges are the forward's (they sum to it) on data spanning more groups than that."""
    layer = _layer("ukan-fixed", 2, 3, device)
    x = torch.linspace(-2, 2, 50, dtype=F64, device=device).unsqueeze(1).expand(50, 2).contiguous()
    assert layer.table_overflow(x) > 0
    with torch.no_grad():
        expected = layer(x)
    torch.testing.assert_close(edge_functions(layer, x).y.sum(-1), expected, rtol=1e-12, atol=1e-12)


def test_ukan_dense_only_refuses_the_touched_pair_path_by_name(device):
    layer = _layer("ukan", 2, 3, device)
    layer.dense_max_coefficients = 8
    x = torch.rand(5, 2, dtype=F64, device=device) * 4 - 2
    with pytest.raises(NotImplementedError, match="touched-pair table.*dense_max_coefficients=8"):
        layer.edge_view(x, dense_only=True)
    assert layer.edge_view(x).spec.n_coef > 8  # the same map on the dense range, as wide as x's span
    fixed = UKANLinear(2, 3, table_groups=4, dtype=F64, device=device)
    fixed.dense_max_coefficients = 8  # (4 + 1) 4 coefficients: the fixed-capacity pair table
    with pytest.raises(NotImplementedError, match="5 groups a feature need 20 coefficients"):
        fixed.edge_view(x, dense_only=True)


@pytest.mark.parametrize("kind", ["kan", "ukan", "cheby"])
def test_bad_rows_are_refused_by_name(kind, device):
    layer = _layer(kind, 3, 2, device)
    with pytest.raises(TypeError, match="x must have dtype in \\(float64\\), got float32"):
        layer.edge_view(torch.zeros(4, 3, device=device))
    with pytest.raises(ValueError, match="x must have 2 dimensions"):
        layer.edge_view(torch.zeros(2, 4, 3, dtype=F64, device=device))
    with pytest.raises(ValueError, match="x must have last dimension 3"):
        layer.edge_view(torch.zeros(4, 2, dtype=F64, device=device))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        layer.edge_view([[0.0, 0.0, 0.0]])
