"""UKAN: Warp kernels (torch ops, UKANLinear, Warp-native layer) against the float64 reference that
materialises the coefficients per sample (the paper's approach)."""

import math

import numpy as np
import pytest
import torch
import warp as wp

import warpkan.torch_bridge as tb
from warpkan.kernels import ukan as ku
from warpkan.torch_bridge._common import RecordedLaunches
from warpkan.kernels.ukan import CELL_LIMIT, table_capacity
from warpkan.reference import ukan as ru
from warpkan.torch_bridge import UKANLinear

H = 0.25  # a power of two: knots k * H are exact in binary, so "exactly on a knot" means what it says


def make_layer(n_in, n_out, device, dtype=torch.float64, order=3, base="silu", seed=0, pe_dim=4, embed_dim=3,
               hidden_dim=6, table_groups=None, deterministic=False, strategy="auto"):
    torch.manual_seed(seed)
    return UKANLinear(n_in, n_out, spline_order=order, grid_delta=H, pe_dim=pe_dim, embed_dim=embed_dim,
                      hidden_dim=hidden_dim, base_activation=base, device=device, dtype=dtype,
                      table_groups=table_groups, deterministic=deterministic, strategy=strategy)


def reference(layer, x):
    return ru.ukan_linear(
        x, layer.grid_delta, layer.spline_order, layer.pe_dim, layer.feature_embedding,
        layer.cg_hidden.weight, layer.cg_hidden.bias, layer.cg_out.weight, layer.cg_out.bias,
        layer.spline_scaler, layer.base_weight if layer.use_base else None,
    )


def params_of(layer):
    return [(n, p) for n, p in layer.named_parameters() if layer.use_base or n != "base_weight"]


def forward_and_grads(fn, layer, x, dy):
    x = x.detach().requires_grad_()
    y = fn(x)
    names, params = zip(*params_of(layer))
    grads = torch.autograd.grad(y, (x, *params), dy)
    return y.detach(), dict(zip(("x", *names), grads))


def layer_in_dtype(layer, dtype):
    copy = make_layer(layer.in_features, layer.out_features, layer.spline_scaler.device, dtype=dtype,
                      order=layer.spline_order, base="silu" if layer.use_base else None, pe_dim=layer.pe_dim,
                      embed_dim=layer.embed_dim, hidden_dim=layer.hidden_dim)
    copy.load_state_dict({k: v.to(dtype) for k, v in layer.state_dict().items()})
    return copy


# ---------------------------------------------------------------------- forward and every gradient
@pytest.mark.parametrize("order,base,shape", [(3, "silu", (7, 3, 5)), (1, None, (1, 2, 3)), (2, "silu", (13, 5, 1))])
def test_matches_reference_float64(device, order, base, shape):
    n, n_in, n_out = shape
    layer = make_layer(n_in, n_out, device, order=order, base=base)
    x = torch.randn(n, n_in, dtype=torch.float64, device=device) * 2
    dy = torch.randn(n, n_out, dtype=torch.float64, device=device)
    y, grads = forward_and_grads(layer, layer, x, dy)
    y_ref, grads_ref = forward_and_grads(lambda t: reference(layer, t), layer, x, dy)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    for name in grads_ref:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=1e-11, atol=1e-12, msg=name)


def pairs_of(x, capacity=None):
    n, n_in = x.shape
    return tb.ukan_pairs(x, H, 3, capacity or table_capacity(n, n_in, 16))


def test_many_elements_per_pair_gather(device):
    # few touched groups, many rows: the table gradient gathers hundreds of elements per window (slot) and
    # rows reached from two pairs, beside a small far group of its own; sparse path forced, bitwise repeatable
    layer = make_layer(2, 3, device, base=None)
    layer.dense_max_coefficients = 0
    x = torch.rand(1500, 2, dtype=torch.float64, device=device) - 0.5
    x[:40, 1] = x[:40, 1] * 0.01 + 3.0  # a small group far from the rest
    dy = torch.randn(1500, 3, dtype=torch.float64, device=device)
    y, grads = forward_and_grads(layer, layer, x, dy)
    assert layer._last is not None  # the pair path ran
    y_ref, grads_ref = forward_and_grads(lambda t: reference(layer, t), layer, x, dy)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    for name in grads_ref:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=1e-10, atol=1e-11, msg=name)
    y2, grads2 = forward_and_grads(layer, layer, x, dy)
    assert torch.equal(y, y2) and all(torch.equal(grads[name], grads2[name]) for name in grads)


def test_float32_within_reference_error(device):
    # tolerance from the reference itself: how far the float32 reference lands from the float64 one
    layer64 = make_layer(5, 7, device, hidden_dim=16)
    layer32 = layer_in_dtype(layer64, torch.float32)
    x = torch.randn(31, 5, dtype=torch.float64, device=device) * 3
    dy = torch.randn(31, 7, dtype=torch.float64, device=device)
    y64, g64 = forward_and_grads(lambda t: reference(layer64, t), layer64, x, dy)
    yr32, gr32 = forward_and_grads(lambda t: reference(layer32, t), layer32, x.float(), dy.float())
    y32, g32 = forward_and_grads(layer32, layer32, x.float(), dy.float())

    def check(ours, ref32, exact, what):
        budget = 4 * (ref32.double() - exact).abs().max().item() + 1e-6 * exact.abs().max().item()
        assert (ours.double() - exact).abs().max().item() <= budget, what

    check(y32, yr32, y64, "y")
    for name in g64:
        check(g32[name], gr32[name], g64[name], name)


def test_gradcheck(device):
    layer = make_layer(2, 3, device, pe_dim=2, embed_dim=1, hidden_dim=3)
    x = (torch.tensor([[-1.1, 0.3], [2.2, -0.6], [0.9, 1.7]], dtype=torch.float64, device=device)).requires_grad_()
    params = [p for _, p in params_of(layer)]
    names = [n for n, _ in params_of(layer)]

    def fn(x, *values):
        return torch.func.functional_call(layer, dict(zip(names, values)), (x,))

    assert torch.autograd.gradcheck(fn, (x, *params), eps=1e-6, atol=1e-8)


def test_nd_input_and_noncontiguous(device):
    layer = make_layer(4, 3, device)
    x = torch.randn(2, 3, 5, 4, dtype=torch.float64, device=device).transpose(1, 2)  # non-contiguous
    y = layer(x)
    assert y.shape == (2, 5, 3, 3)
    torch.testing.assert_close(y, reference(layer, x), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------- grid edge cases
def test_knots_and_group_boundaries(device):
    # K = 4 cells per group: x = m * H sits on a knot, and on a group boundary when m % 4 == 0
    layer = make_layer(2, 3, device, base=None)
    knots = torch.tensor([-9, -8, -5, -4, -1, 0, 1, 3, 4, 7, 8, 12], dtype=torch.float64, device=device) * H
    x = torch.stack([knots, knots.flip(0)], dim=1)
    dy = torch.randn(x.shape[0], 3, dtype=torch.float64, device=device)
    y, grads = forward_and_grads(layer, layer, x, dy)
    y_ref, grads_ref = forward_and_grads(lambda t: reference(layer, t), layer, x, dy)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    for name in grads_ref:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=1e-11, atol=1e-12, msg=name)
    # a cubic spline is C^2: approaching each knot from the left gives the value on the knot
    left = layer(x - 1e-9)
    torch.testing.assert_close(left, y, rtol=0, atol=1e-7)


def test_group_indices_are_floored_for_negative_inputs(device):
    x = torch.tensor([[-0.01], [-1.0], [-1.01], [0.0], [0.99], [1.0]], dtype=torch.float64, device=device)
    # h = 0.25, K = 4: one group per unit interval
    _, window, _, feature, group, needed = pairs_of(x)
    slot = torch.div(window[:, 0], 4, rounding_mode="floor") + 1  # window = (slot - 1) K + r
    groups_of_rows = group[slot.long()].tolist()
    assert groups_of_rows == [-1, -1, -2, 0, 0, 1]
    assert torch.all(group[slot.long() - 1] == group[slot.long()] - 1)
    assert int(needed) == 5  # groups -2 (with -3 before it), -1, 0, 1


@pytest.mark.parametrize("base", ["silu", None])
def test_huge_inputs_finite(device, base):
    layer = make_layer(3, 4, device, base=base)
    x = torch.tensor([[1e6, -1e6, 3.0], [-7.5e5, 2e6, -1e6], [0.1, 1e7, -1e7]], dtype=torch.float64, device=device)
    dy = torch.ones(3, 4, dtype=torch.float64, device=device)
    y, grads = forward_and_grads(layer, layer, x, dy)
    assert torch.isfinite(y).all()
    assert all(torch.isfinite(g).all() for g in grads.values())
    y_ref, grads_ref = forward_and_grads(lambda t: reference(layer, t), layer, x, dy)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    for name in grads_ref:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=1e-9, atol=1e-10, msg=name)
    # float32 too: the cell is located in float64, so u keeps its precision at |x| = 1e6
    layer32 = layer_in_dtype(layer, torch.float32)
    y32, g32 = forward_and_grads(layer32, layer32, x.float(), dy.float())
    assert torch.isfinite(y32).all() and all(torch.isfinite(g).all() for g in g32.values())


def test_beyond_cell_limit_and_inf(device):
    # past |x| / h = 2^39 (and at +-Inf) the spline is evaluated at the limit: finite, zero spline slope
    layer = make_layer(2, 3, device, base=None)
    big = CELL_LIMIT * H
    x = torch.tensor([[1e30, -1e30], [math.inf, -math.inf], [big * 4, 0.5]], dtype=torch.float64, device=device)
    dy = torch.ones(3, 3, dtype=torch.float64, device=device)
    y, grads = forward_and_grads(layer, layer, x, dy)
    assert torch.isfinite(y).all() and all(torch.isfinite(g).all() for g in grads.values())
    assert torch.all(grads["x"][:2] == 0)
    torch.testing.assert_close(y[0], y[1])
    torch.testing.assert_close(y, reference(layer, x), rtol=1e-12, atol=1e-12)


def test_nan_row_stays_in_its_row(device):
    layer = make_layer(3, 4, device)
    x = torch.randn(5, 3, dtype=torch.float64, device=device)
    x[2, 1] = float("nan")
    y = layer(x)
    assert torch.isnan(y[2]).all()  # the SiLU base path carries the NaN
    clean = torch.cat([x[:2], x[3:]])
    # (not bitwise: the CG-MLP GEMM runs on a different number of pairs)
    torch.testing.assert_close(torch.cat([y[:2], y[3:]]), layer(clean), rtol=1e-12, atol=1e-12)
    layer_nb = make_layer(3, 4, device, base=None)  # no base: the NaN input just gets a zero spline term
    torch.testing.assert_close(layer_nb(x), reference(layer_nb, x), rtol=1e-12, atol=1e-12)


def test_empty_batch(device):
    layer = make_layer(3, 4, device)
    x = torch.zeros(0, 3, dtype=torch.float64, device=device, requires_grad=True)
    y = layer(x)
    assert y.shape == (0, 4)
    y.sum().backward()
    assert x.grad.shape == (0, 3)
    assert torch.all(layer.spline_scaler.grad == 0) and torch.all(layer.cg_out.weight.grad == 0)


def test_bad_input(device):
    layer = make_layer(3, 4, device)
    with pytest.raises(ValueError, match="x"):
        layer(torch.zeros(2, 5, dtype=torch.float64, device=device))
    with pytest.raises(TypeError, match="x"):
        layer(torch.zeros(2, 3, dtype=torch.float32, device=device))
    with pytest.raises(TypeError, match="x"):
        layer([[0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="grid_delta"):
        UKANLinear(3, 4, grid_delta=0.0)
    with pytest.raises(TypeError, match="grid_delta"):
        UKANLinear(3, 4, grid_delta="0.1")
    with pytest.raises(ValueError, match="pe_dim"):
        UKANLinear(3, 4, pe_dim=3)
    with pytest.raises(ValueError, match="spline_order"):
        UKANLinear(3, 4, spline_order=9)
    with pytest.raises(ValueError, match="base_activation"):
        UKANLinear(3, 4, base_activation="relu")


def _step(layer, x):
    layer.zero_grad()
    x = x.clone().requires_grad_()
    y = layer(x)
    y.square().sum().backward()
    return [y.detach().clone(), x.grad] + [p.grad.clone() for p in layer.parameters()]


@pytest.mark.parametrize("wide", [False, True])  # the dense-range path; the sparse pair path
def test_deterministic_bitwise(device, wide):
    # deterministic=True: bitwise-equal runs on both paths; the default (atomics on CUDA) agrees with it to
    # float32 rounding
    layer = make_layer(4, 5, device, dtype=torch.float32, hidden_dim=8, deterministic=True)
    x = torch.randn(257, 4, device=device) * 2
    if wide:
        x[0, 0] = 1e4
    runs = [_step(layer, x) for _ in range(2)]
    assert (layer._last is None) != wide
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    layer.deterministic = False
    for a, b in zip(_step(layer, x), runs[0]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))



@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_deterministic_sparse_path_bitwise_with_long_pair_runs_cuda():
    # deterministic=True on the sparse path with thousands of pairs per feature: the embedding's gradient sums
    # long runs of one index (where the default's F.embedding backward combines segments by atomics)
    torch.manual_seed(0)
    layer = tb.UKANLinear(4, 5, spline_order=3, grid_delta=0.005, pe_dim=4, embed_dim=3, hidden_dim=8,
                          device="cuda", deterministic=True)
    layer.dense_max_coefficients = 0
    torch.manual_seed(1)
    x = torch.randn(32768, 4, device="cuda") * 40
    runs = [_step(layer, x) for _ in range(3)]
    assert layer._last is not None and int(layer._last[2].item()) > 30000  # the pair path, many pairs
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)
    layer.deterministic = False
    for a, b in zip(_step(layer, x), runs[0]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))

# ---------------------------------------------------------------------- to_kan, regulariser
@pytest.mark.parametrize("base,lo,hi", [("silu", -2.3, 4.1), (None, -1.0, 1.0), ("silu", 0.3, 0.3)])
def test_to_kan_matches_on_interval(device, base, lo, hi):
    layer = make_layer(3, 4, device, base=base)
    kan = layer.to_kan(lo, hi)
    assert isinstance(kan, tb.KANLinear)
    x = torch.linspace(lo, hi, 97, dtype=torch.float64, device=device)
    knots = torch.arange(math.ceil(lo / H), math.floor(hi / H) + 1, dtype=torch.float64, device=device) * H
    x = torch.cat([x, knots]).unsqueeze(-1).expand(-1, 3).contiguous()
    x[:, 1] = x[:, 1].flip(0)
    torch.testing.assert_close(kan(x), layer(x), rtol=1e-12, atol=1e-12)


def test_regularization_loss(device):
    layer = make_layer(3, 4, device)
    x = torch.randn(9, 3, dtype=torch.float64, device=device) * 2
    layer(x)
    loss = layer.regularization_loss()
    # by hand: per-edge mean |s C| over the generated coefficients of the feature's touched pairs
    _, _, _, feature, group, needed = pairs_of(x)
    feature, group = feature[: int(needed)], group[: int(needed)]
    table = layer.generate_coefficients(feature, group)
    l1 = torch.stack([table[feature == i].abs().mean(dim=(0, 2)) for i in range(3)], dim=1) * layer.spline_scaler.abs()
    p = l1 / l1.sum()
    expected = l1.sum() - (p * p.log()).sum()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(layer.regularization_loss(x=x), expected)
    loss.backward()
    assert layer.cg_out.weight.grad.abs().sum() > 0 and layer.spline_scaler.grad.abs().sum() > 0


# ---------------------------------------------------------------------- torch.library checks
def test_opcheck(device):
    layer = make_layer(3, 4, device)
    x = torch.randn(6, 3, dtype=torch.float64, device=device) * 2
    torch.library.opcheck(tb.ukan_pairs, (x, H, 3, 20))
    sorted_elem, window, local_u, feature, group, _ = pairs_of(x, 20)
    table = layer._table(feature, group).detach().requires_grad_()
    spec = tb.ukan_ops.table_spec(x, window, local_u, feature, H, 3, True, table.shape[0])
    params = (layer.base_weight.t().detach().requires_grad_(), layer.spline_scaler.t().detach().requires_grad_(),
              table.unsqueeze(0))  # the shared table: coef [1, P K, out]
    route = (spec.static_key(), "auto", "auto", True)
    frame = list(spec.frame_tensors)
    torch.library.opcheck(tb.edge_forward, (x.clone().requires_grad_(), frame, *params, None, sorted_elem, *route))
    dy = torch.randn(6, 4, dtype=torch.float64, device=device)
    torch.library.opcheck(tb.edge_backward, (dy, x, frame, *(p.detach() for p in params), sorted_elem, *route,
                                             True, True, False))


def test_torch_compile_fullgraph(device):
    layer = make_layer(3, 4, device, table_groups=16)
    compiled = torch.compile(layer, fullgraph=True)
    x = torch.randn(6, 3, dtype=torch.float64, device=device, requires_grad=True)
    y = compiled(x)
    torch.testing.assert_close(y, layer(x))
    y.sum().backward()
    grad_compiled = x.grad.clone()
    x.grad = None
    layer(x).sum().backward()
    torch.testing.assert_close(grad_compiled, x.grad)


# ---------------------------------------------------------------------- exact mode: dense-range and sparse paths
@pytest.mark.parametrize("strategy", ["stencil", "gemm"])
@pytest.mark.parametrize("order,base", [(3, "silu"), (1, None), (2, "silu")])
def test_dense_range_path_matches_reference_and_sparse_path(device, order, base, strategy):
    # the dense-range path (every group between each feature's lowest and highest: the edge engine's UKAN
    # family) forced on a wide batch, with knots, group boundaries and a NaN, by either strategy: equal to the
    # reference and to the sparse touched-pair path
    layer = make_layer(4, 3, device, order=order, base=base, strategy=strategy)
    x = torch.randn(41, 4, dtype=torch.float64, device=device) * 2
    x[:12, 1] = torch.arange(-6, 6, dtype=torch.float64, device=device) * H  # knots, boundaries
    x[5, 2] = float("nan")
    dy = torch.randn(41, 3, dtype=torch.float64, device=device)
    dy[5] = 0  # the NaN row's base term would carry NaN into every parameter gradient
    layer.dense_max_coefficients = 10**6
    y, grads = forward_and_grads(layer, layer, x, dy)
    assert layer._last is None and layer._last_range_x is not None  # took the dense-range path
    layer.dense_max_coefficients = 0
    y_sparse, grads_sparse = forward_and_grads(layer, layer, x, dy)
    assert layer._last is not None
    keep = torch.arange(41, device=device) != 5
    y_ref = reference(layer, x)
    torch.testing.assert_close(y[keep], y_ref[keep], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y, y_sparse, rtol=1e-12, atol=1e-12, equal_nan=True)
    for name in grads:
        a, b = (grads[name][keep], grads_sparse[name][keep]) if name == "x" else (grads[name], grads_sparse[name])
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12, equal_nan=True, msg=name)
    if base is None:
        x_clean = x.clone()
        x_clean[5, 2] = 0.0
        _, grads_ref = forward_and_grads(lambda t: reference(layer, t), layer, x_clean, dy)
        for name in grads_ref:
            if name != "x":
                torch.testing.assert_close(grads[name], grads_ref[name], rtol=1e-11, atol=1e-12, msg=name)


@pytest.mark.parametrize("pe_dim,embed_dim", [(0, 3), (4, 0), (6, 5)])
def test_dense_range_cg_mlp_inputs(device, pe_dim, embed_dim):
    # the CG-MLP of the dense-range path forms its input rows on the device: encoding only, embedding only,
    # both; every gradient against the reference, and the table against the torch CG-MLP on the same rows
    layer = make_layer(3, 2, device, pe_dim=pe_dim, embed_dim=embed_dim)
    x = torch.randn(17, 3, dtype=torch.float64, device=device) * 3
    dy = torch.randn(17, 2, dtype=torch.float64, device=device)
    y, grads = forward_and_grads(layer, layer, x, dy)
    assert layer._last is None  # the dense-range path
    y_ref, grads_ref = forward_and_grads(lambda t: reference(layer, t), layer, x, dy)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    for name in grads_ref:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=1e-11, atol=1e-12, msg=name)
    group_lo, span = tb.ukan_ops.group_range(x, H, 3)
    rows = int(span.max()) + 1
    groups = (group_lo.unsqueeze(1) - 1 + torch.arange(rows, device=device)).reshape(-1)
    features = torch.arange(3, device=device).repeat_interleave(rows)
    table = tb.ukan_ops.ukan_range_table(group_lo, rows, pe_dim, layer.feature_embedding, layer.cg_hidden.weight,
                                         layer.cg_hidden.bias, layer.cg_out.weight, layer.cg_out.bias,
                                         layer.spline_order + 1)
    # [P, out, K] coefficients, coefficient-major in the table: row p holds C[p, o, m] at column m out + o
    expected = layer.generate_coefficients(features, groups).transpose(1, 2).reshape(3 * rows, -1)
    torch.testing.assert_close(table, expected, rtol=1e-12, atol=1e-12)


def test_dense_range_backward_twice_with_retained_graph(device):
    # the eager route keeps the CG-MLP's rows for its backward: a second backward of the same graph must
    # see them unchanged
    layer = make_layer(3, 2, device)
    x = torch.randn(9, 3, dtype=torch.float64, device=device)
    y = layer(x)
    assert layer._last is None  # the dense-range path
    params = [p for _, p in params_of(layer)]
    first = torch.autograd.grad(y.sum(), params, retain_graph=True)
    second = torch.autograd.grad(y.sum(), params)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_exact_mode_picks_the_path_by_span(device):
    layer = make_layer(3, 2, device)
    narrow = torch.rand(50, 3, dtype=torch.float64, device=device) * 2 - 1  # 2 groups of K h = 1 per feature
    torch.testing.assert_close(layer(narrow), reference(layer, narrow), rtol=1e-12, atol=1e-12)
    assert layer._last is None and layer.table_overflow() == 0
    wide = narrow.clone()
    wide[0, 0] = 1e4  # one outlier: a span of 10^4 groups takes the sparse path
    torch.testing.assert_close(layer(wide), reference(layer, wide), rtol=1e-10, atol=1e-12)
    assert layer._last is not None


def test_eager_steps_take_the_parameters_inside_their_nodes(eager_step_ops):
    """Both paths' eager routes make the [in, out] views of base_weight and spline_scaler inside their node
    (no TBackward of their own) and skip the reshape of 2-D x. The dense-range step is one node; the sparse
    step's spline is one node (not the custom op's) beside the CG-MLP's own torch nodes. The gradients keep the
    parameters' strides."""
    narrow = torch.rand(50, 3, dtype=torch.float64) * 2 - 1
    wide = narrow.clone()
    wide[0, 0] = 1e4  # the sparse path
    for x, node in ((narrow, "_EagerRangeLayerBackward"), (wide, "EagerEdge_ukan_tableBackward")):
        layer = make_layer(3, 2, "cpu")
        ops = eager_step_ops(layer, x.requires_grad_(), torch.ones(50, 2, dtype=torch.float64))
        nodes = {name.split(": ")[1] for name in ops if name.startswith("autograd::engine::evaluate_function")}
        assert node in nodes, nodes
        if node == "_EagerRangeLayerBackward":
            assert nodes == {node, "torch::autograd::AccumulateGrad"}, nodes
        for p in (layer.base_weight, layer.spline_scaler):
            assert p.grad.stride() == p.stride()


def group_range_reference(x, h, order):
    """Each feature's lowest touched group and its span (capped at 2^30), by torch in float64: NaN ignored,
    |x / h| clamped to the cell limit, a feature without valid input at group 0 with span 1."""
    s = x.double() / h
    valid = ~torch.isnan(s)
    groups = torch.div(torch.floor(s.nan_to_num(0.0).clamp(-CELL_LIMIT, CELL_LIMIT)).long(), order + 1,
                       rounding_mode="floor")
    lo = torch.where(valid, groups, 2**62).amin(0)
    hi = torch.where(valid, groups, -(2**62)).amax(0)
    empty = lo > hi
    lo, hi = lo.masked_fill(empty, 0), hi.masked_fill(empty, 0)
    return lo, (hi - lo + 1).clamp(max=2**30).int()


@pytest.mark.parametrize("search", ["block", "chunked"])
@pytest.mark.parametrize("n_rows", [1, 13, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_group_range_search_matches_reference(device, monkeypatch, search, n_rows, dtype):
    """Both searches (a block a feature for small batches, three chunked launches otherwise) against the torch
    reference: NaN, +-Inf, inputs past the cell limit (a span over the cap), a feature without valid input,
    negative groups, knots, one row."""
    monkeypatch.setattr(ku, "_RANGE_BLOCK_MAX_ROWS", 1 << 30 if search == "block" else 0)
    monkeypatch.setattr(ku, "_RANGE_BLOCK_MAX_FEATURES", 1 << 30)
    tb.ukan_ops._launch.clear()  # the records do not key on the search taken
    torch.manual_seed(n_rows)
    x = torch.randn(n_rows, 7, dtype=torch.float64) * 3
    x[:, 1] = float("nan")  # no valid input
    x[::2, 2] = float("nan")
    x[0, 2] = -float("inf")
    x[-1, 3] = float("inf")
    x[0, 4], x[-1, 4] = -1e15, 1e15  # both clamped: 2^38 groups, over the cap
    x[:, 5] = -x[:, 5].abs() - 40.0  # negative groups only
    x[:, 6] = torch.arange(n_rows, dtype=torch.float64) * H  # on knots
    x = x.to(dtype).to(device)
    for order in (1, 3):
        group_lo, span = tb.ukan_ops.group_range(x, H, order)
        lo_ref, span_ref = group_range_reference(x.cpu(), H, order)
        assert group_lo.dtype == torch.int64 and span.dtype == torch.int32 and span.shape == (7,)
        torch.testing.assert_close(group_lo.cpu(), lo_ref, rtol=0, atol=0)
        torch.testing.assert_close(span.cpu(), span_ref, rtol=0, atol=0)
    tb.ukan_ops._launch.clear()


def test_fixed_table_dense_range_overflow(device):
    # table_groups=R on the dense-range path: R groups per feature from its lowest touched one; the elements
    # past them get no spline term (as off-grid inputs of a bounded KAN), the rest are exact, and
    # table_overflow() reports the widest feature's missing groups
    layer = make_layer(2, 3, device, base=None, table_groups=2)
    assert layer._fixed_range()
    x = torch.tensor([[0.1, 0.3], [1.1, 0.6], [2.1, 1.2], [3.1, 0.9], [4.1, 0.2]], dtype=torch.float64,
                     device=device)  # feature 0: groups 0..4; feature 1: groups 0, 1
    y = layer(x)
    assert layer.table_overflow() == 3 and layer.table_overflow(x) == 3
    inside = x.clone()
    inside[2:, 0] = float("nan")  # no spline term: what the rows past the table get
    torch.testing.assert_close(y, layer(inside).nan_to_num(), rtol=1e-12, atol=1e-12)
    wide = make_layer(2, 3, device, base=None)
    wide.load_state_dict(layer.state_dict())
    torch.testing.assert_close(y[:2], wide(x)[:2], rtol=1e-12, atol=1e-12)


def test_dense_range_gemm_under_bf16_autocast(device):
    """The dense-range path's gemm strategy follows KANLinear's precision rule: under bf16 autocast the
    contractions run in bf16 (precision="auto"), close to the fp32 result; with precision="fp32" the exact fp32
    result rounded to bf16. The output has the autocast dtype either way."""
    torch.manual_seed(0)
    layer = make_layer(5, 4, device, dtype=torch.float32, table_groups=3, strategy="gemm")
    x = torch.randn(33, 5, device=device)
    exact = layer(x)
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    scale = exact.abs().max().item()
    torch.testing.assert_close(y.float(), exact, rtol=2**-6, atol=2**-6 * scale)
    layer.precision = "fp32"
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        y = layer(x)
    torch.testing.assert_close(y, exact.to(torch.bfloat16), rtol=0, atol=0)
    with pytest.raises(ValueError, match="strategy must be one of"):
        UKANLinear(3, 2, strategy="dense")
    with pytest.raises(ValueError, match="needs float32"):
        UKANLinear(3, 2, precision="bf16", dtype=torch.float64)


def test_dense_range_opcheck_and_empty(device):
    layer = make_layer(3, 4, device)
    x = torch.randn(6, 3, dtype=torch.float64, device=device)
    group_lo, span = tb.ukan_ops.group_range(x, H, 3)
    rows = int(span.max()) + 1
    groups = (group_lo.unsqueeze(1) - 1 + torch.arange(rows, device=device)).reshape(-1)
    features = torch.arange(3, device=device).repeat_interleave(rows)
    table = layer.generate_coefficients(features, groups).reshape(3 * rows, -1).detach().requires_grad_()
    spec, coef = tb.ukan_ops.range_spec(x, group_lo, table, H, 3, True)
    params = (layer.base_weight.t().detach().requires_grad_(), layer.spline_scaler.t().detach().requires_grad_(),
              coef)
    dy = torch.randn(6, 4, dtype=torch.float64, device=device)
    for strategy, precision in (("stencil", "fp32"), ("gemm", "fp32")):
        route = (spec.static_key(), strategy, precision, False)
        torch.library.opcheck(tb.edge_forward, (x.clone().requires_grad_(), [group_lo], *params, None, None, *route))
        torch.library.opcheck(tb.edge_backward, (dy, x, [group_lo], *(p.detach() for p in params), None, *route,
                                                 True, True, False))
    mlp = [p.detach().requires_grad_() for p in (layer.feature_embedding, layer.cg_hidden.weight,
                                                 layer.cg_hidden.bias, layer.cg_out.weight, layer.cg_out.bias)]
    torch.library.opcheck(tb.ukan_ops.ukan_range_table, (group_lo, rows, layer.pe_dim, *mlp, layer.spline_order + 1))
    empty = torch.zeros(0, 3, dtype=torch.float64, device=device, requires_grad=True)
    y = layer(empty)
    assert y.shape == (0, 4)
    y.sum().backward()
    assert layer.cg_out.weight.grad is not None and torch.all(layer.cg_out.weight.grad == 0)


# ---------------------------------------------------------------------- the dense range's CG-MLP generator
def cg_mlp_params(n_in, pe_dim, embed_dim, hidden_dim, n_cols, device, dtype=torch.float64, seed=0):
    """(embedding, w_hidden, b_hidden, w_out, b_out) of a CG-MLP, nn.Linear-scaled, requiring grad."""
    gen = torch.Generator().manual_seed(seed)
    n_feat = pe_dim + embed_dim

    def uniform(shape, fan_in):
        return ((torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) / math.sqrt(fan_in))

    values = (torch.randn(n_in, embed_dim, generator=gen, dtype=torch.float64), uniform((hidden_dim, n_feat), n_feat),
              uniform((hidden_dim,), n_feat), uniform((n_cols, hidden_dim), hidden_dim),
              uniform((n_cols,), hidden_dim))
    return [v.to(device=device, dtype=dtype).requires_grad_() for v in values]


def table_and_grads(make_table, params, d_table):
    table = make_table(*params)
    return table.detach(), torch.autograd.grad(table, params, d_table, allow_unused=True)


def range_table_op(group_lo, rows, pe_dim, table_k=1):
    return lambda *params: tb.ukan_ops.ukan_range_table(group_lo, rows, pe_dim, *params, table_k)


def range_table_reference(group_lo, rows, pe_dim, table_k=1):
    return lambda *params: tb.ukan_ops.range_table_torch(group_lo, rows, pe_dim, *params, table_k)


GENERATOR_SIZES = [
    # (in, rows per feature, pe_dim, embed_dim, hidden_dim, table columns, K of the coefficient-major order)
    (1, 1, 16, 8, 32, 40, 4),  # one feature, one group
    (3, 7, 2, 5, 7, 11, 1),  # prime embed, hidden and output widths
    (5, 13, 0, 3, 13, 131, 1),  # no encoding; output columns past two tile widths
    (2, 40, 6, 0, 3, 17, 1),  # no embedding
    (4, 100, 16, 8, 32, 4, 2),  # many groups: 400 rows, many blocks, features across block edges
    (3, 5, 64, 64, 48, 20, 5),  # wide tiles (64, 64, 64): past the shared memory budget in float64 (SIMT)
    (3, 5, 10, 120, 8, 33, 3),  # the widest embedding tile
    (2, 3, 4, 3, 129, 8, 4),  # hidden wider than the widest tile: the SIMT generator
    (3, 4, 6, 5, 9, 70, 2),  # 35 outputs of 2 coefficients: a column tile holding rows of both coefficients
    (2, 6, 4, 3, 11, 66, 6),  # K = 6 (order 5) over three column tiles
]


@pytest.mark.parametrize("generator", ["tile", "simt"])
@pytest.mark.parametrize("n_in,rows,pe_dim,embed_dim,hidden_dim,n_cols,table_k", GENERATOR_SIZES)
def test_range_generator_matches_torch_cg_mlp_float64(device, monkeypatch, generator, n_in, rows, pe_dim, embed_dim,
                                                      hidden_dim, n_cols, table_k):
    monkeypatch.setattr(ku, "CG_GENERATOR", generator)
    check_range_generator_float64(device, n_in, rows, pe_dim, embed_dim, hidden_dim, n_cols, seed=1, table_k=table_k)


def check_range_generator_float64(device, n_in, rows, pe_dim, embed_dim, hidden_dim, n_cols, seed, table_k=1):
    """The registered range-table op's table and every CG-MLP gradient against the torch reference, float64;
    with ``table_k`` > 1 also against the op's own table in w_out's order, its columns permuted to
    coefficient-major by hand."""
    group_lo = torch.randint(-50, 50, (n_in,), generator=torch.Generator().manual_seed(seed)).to(device)
    params = cg_mlp_params(n_in, pe_dim, embed_dim, hidden_dim, n_cols, device)
    d_table = torch.randn(n_in * rows, n_cols, dtype=torch.float64, device=device)
    table, grads = table_and_grads(range_table_op(group_lo, rows, pe_dim, table_k), params, d_table)
    expected, grads_ref = table_and_grads(range_table_reference(group_lo, rows, pe_dim, table_k), params, d_table)
    torch.testing.assert_close(table, expected, rtol=1e-12, atol=1e-12)
    for name, grad, grad_ref in zip(("embedding", "w_hidden", "b_hidden", "w_out", "b_out"), grads, grads_ref):
        torch.testing.assert_close(grad, grad_ref, rtol=1e-11, atol=1e-11, msg=name)
    check_kept_rows_backward(group_lo, rows, pe_dim, params, d_table, table_k, table, grads)
    if table_k > 1:
        n_out = n_cols // table_k
        # column m n_out + o of the coefficient-major table is column o K + m of w_out's order
        by_output = range_table_op(group_lo, rows, pe_dim)(*params).detach()
        by_coefficient = by_output.view(-1, n_out, table_k).transpose(1, 2).reshape(by_output.shape)
        assert torch.equal(table, by_coefficient)
        grads_by_output = table_and_grads(range_table_op(group_lo, rows, pe_dim), params,
                                          d_table.view(-1, table_k, n_out).transpose(1, 2).reshape(d_table.shape))[1]
        for name, grad, grad_by_output in zip(("embedding", "w_hidden", "b_hidden", "w_out", "b_out"), grads,
                                              grads_by_output):
            torch.testing.assert_close(grad, grad_by_output, rtol=1e-12, atol=1e-12, msg=name)


def check_kept_rows_backward(group_lo, rows, pe_dim, params, d_table, table_k, table, grads):
    """The eager range node's generator calls (the forward keeping its rows, the backward reading them, as
    ``_EagerRangeLayer`` runs them) give the op's table and gradients bit for bit (the op's backward forms the
    rows again), and the backward reads what was kept: kept rows changed in between change the gradients."""
    with torch.no_grad():
        kept_table, *kept = tb.ukan_ops._range_table_impl(group_lo, rows, pe_dim, *params, table_k, keep_rows=True)
        kept_grads = tb.ukan_ops._range_table_backward_impl(d_table, group_lo, pe_dim, *params[:4], table_k,
                                                            rows=kept)
        assert torch.equal(kept_table, table)
        for name, grad, kept_grad in zip(("embedding", "w_hidden", "b_hidden", "w_out", "b_out"), grads, kept_grads):
            assert torch.equal(kept_grad, grad), name
        # the eager node hands the generator its own d_table to write the hidden gradient's shares over: the
        # same gradients bit for bit, and d_table written only where the shares fit in its columns
        scratch = d_table.clone()
        scratch_grads = tb.ukan_ops._range_table_backward_impl(scratch, group_lo, pe_dim, *params[:4], table_k,
                                                               rows=kept, d_table_is_scratch=True)
        for name, grad, scratch_grad in zip(("embedding", "w_hidden", "b_hidden", "w_out", "b_out"), grads,
                                            scratch_grads):
            assert torch.equal(scratch_grad, grad), name
        n_hidden = params[1].shape[0]
        written = ku.use_tile_generator(8, pe_dim, params[0].shape[1], n_hidden) and ku.hidden_parts_in_table(
            *d_table.shape, n_hidden)
        assert torch.equal(scratch, d_table) != written
        if ku.use_tile_generator(8, pe_dim, params[0].shape[1], params[1].shape[0]):
            assert len(kept) == 1 and kept[0].shape == (group_lo.shape[0] * rows,
                                                        ku.kept_row_width(8, pe_dim, params[0].shape[1],
                                                                          params[1].shape[0]))
            kept[0].mul_(2)
            changed = tb.ukan_ops._range_table_backward_impl(d_table, group_lo, pe_dim, *params[:4], table_k,
                                                             rows=kept)
            assert not torch.equal(changed[1], grads[1])  # w_hidden's gradient reads the kept input rows


@pytest.mark.parametrize("generator", ["tile", "simt"])
def test_range_table_refuses_a_k_that_does_not_divide_the_columns(device, monkeypatch, generator):
    monkeypatch.setattr(ku, "CG_GENERATOR", generator)
    params = cg_mlp_params(2, 4, 3, 5, 10, device)
    group_lo = torch.tensor([0, 3], device=device)
    with pytest.raises(ValueError, match="table_k"):
        range_table_op(group_lo, 3, 4, 3)(*params)


def test_dense_layer_launchers_refuse_a_k_that_does_not_divide_the_columns(device):
    # the Warp-native layer's SIMT CG-MLP: forward and backward take table_k as the generators do
    w, b, inp, out = (wp.zeros(shape, dtype=wp.float32, device=device) for shape in ((10, 3), (10,), (4, 3), (4, 10)))
    with pytest.raises(ValueError, match="table_k"):
        ku.launch_dense_forward(inp, w, b, False, out, out, table_k=4)
    with pytest.raises(ValueError, match="table_k"):
        ku.launch_dense_backward(out, inp, w, wp.zeros_like(w), wp.zeros_like(b), table_k=3)


def test_generator_column_split():
    # (column blocks, columns a block): whole GENERATOR_COLS products, as few a block as reach the target
    cols = ku.GENERATOR_COLS
    target = ku.GENERATOR_TARGET_BLOCKS
    assert ku.column_split(1, 1) == (1, cols)
    assert ku.column_split(ku.GENERATOR_ROWS * target, 10 * cols) == (1, 10 * cols)  # the rows fill the target
    assert ku.column_split(ku.GENERATOR_ROWS, 5 * cols - 3) == (5, cols)  # one row block: a product a block
    row_blocks = -(-target // 2)  # two column blocks wanted: 3 + 2 products of 5
    assert ku.column_split(ku.GENERATOR_ROWS * row_blocks, 5 * cols) == (2, 3 * cols)
    for n_rows in (1, 31, 33, 400, 5488, 70000):
        for n_cols in (1, 40, 131, 1024):
            col_blocks, block_cols = ku.column_split(n_rows, n_cols)
            assert block_cols % cols == 0 and (col_blocks - 1) * block_cols < n_cols <= col_blocks * block_cols
            # the hidden gradient's shares fit in the table gradient where every column block is that wide
            for hidden_dim, tile in ((1, 8), (9, 16), (32, 32), (33, 64)):
                narrowest = min(block_cols, n_cols - (col_blocks - 1) * block_cols)
                assert ku.hidden_tile_width(hidden_dim) == tile
                assert ku.hidden_parts_in_table(n_rows, n_cols, hidden_dim) == (tile <= narrowest)


@pytest.mark.parametrize("n_in,rows,table_k", [(4, 600, 2), (3, 7, 1)])
def test_generator_combine_lanes_on_cpu_blocks_float64(monkeypatch, n_in, rows, table_k):
    # the combine's CUDA layout (COMBINE_LANES lanes an entry, their sums met by a block tile_sum) run on the CPU
    # with Warp's CPU blocks: 75 and 1 row blocks of partials (two batches a lane, a tail shorter than a
    # batch), against the float64 reference
    monkeypatch.setattr(wp.config, "enable_cpu_blocks", True)
    monkeypatch.setattr(ku, "_combine_layout", lambda is_cuda: (ku._COMBINE_LANES, ku._COMBINE_ENTRIES))
    monkeypatch.setattr(tb.ukan_ops, "_launch", RecordedLaunches())
    monkeypatch.setattr(ku, "CG_GENERATOR", "tile")
    check_range_generator_float64("cpu", n_in, rows, 16, 8, 32, 40, seed=3, table_k=table_k)


def test_generator_backward_refuses_hidden_shares_it_cannot_hold():
    # d_hidden_parts=None asks for the shares in d_table's columns: refused where a column block is narrower than
    # the hidden tile; a buffer of the wrong shape is refused too, before any launch
    n_in, rows, pe_dim, embed_dim, hidden_dim = 2, 5, 4, 3, 16
    group_lo = torch.tensor([0, 3])
    embedding, w_hidden, b_hidden, w_out, _ = (p.detach() for p in cg_mlp_params(n_in, pe_dim, embed_dim, hidden_dim,
                                                                                 40, "cpu"))

    def launch(n_cols, d_hidden_parts_shape):
        w = w_out[:n_cols].contiguous()
        shapes = ku.generator_partial_shapes(n_in * rows, n_cols, pe_dim, embed_dim, hidden_dim)
        parts = [wp.zeros(shape, dtype=wp.float64) for name, shape in shapes.items() if name != "d_hidden_parts"]
        shares = None if d_hidden_parts_shape is None else wp.zeros(d_hidden_parts_shape, dtype=wp.float64)
        grads = [wp.zeros(t.shape, dtype=wp.float64) for t in (w, w[:, 0], w_hidden, b_hidden, embedding)]
        ku.launch_generator_backward(wp.zeros((n_in * rows, n_cols), dtype=wp.float64), wp.from_torch(group_lo),
                                     *(wp.from_torch(t) for t in (embedding, w_hidden, b_hidden, w)), *parts, shares,
                                     *grads, None, pe_dim)

    assert ku.hidden_parts_in_table(n_in * rows, 20, hidden_dim) and not ku.hidden_parts_in_table(n_in * rows, 40,
                                                                                                  hidden_dim)
    launch(20, None)  # one column block of 20 >= 16 columns: the shares fit
    with pytest.raises(ValueError, match="hidden_parts_in_table"):
        launch(40, None)  # a second column block of 8 columns
    with pytest.raises(ValueError, match="d_hidden_parts must be"):
        launch(40, (n_in * rows, hidden_dim))


@pytest.mark.parametrize("target_blocks", [1, 6, 512])
def test_range_generator_column_splits_float64(device, monkeypatch, target_blocks):
    # 65 rows (3 row blocks), 131 columns (5 products): one column block of 5 products, 2 of 3 + 2, 5 of 1;
    # every split gives the reference's table and gradients
    monkeypatch.setattr(ku, "CG_GENERATOR", "tile")
    monkeypatch.setattr(ku, "GENERATOR_TARGET_BLOCKS", target_blocks)
    # a fresh launch cache: its records key on the tensors, and the split is a module constant, set once a process
    # outside tests (the eager node's hidden-gradient shares in d_table take no tensor of their own)
    monkeypatch.setattr(tb.ukan_ops, "_launch", RecordedLaunches())
    n_in, rows, pe_dim, embed_dim, hidden_dim, n_cols = 5, 13, 4, 3, 13, 131
    assert ku.column_split(n_in * rows, n_cols)[0] == {1: 1, 6: 2, 512: 5}[target_blocks]
    check_range_generator_float64(device, n_in, rows, pe_dim, embed_dim, hidden_dim, n_cols, seed=2)


def test_range_generator_float32_within_reference_error(device):
    # tolerance from the reference itself: how far the float32 torch CG-MLP lands from the float64 one
    n_in, rows, pe_dim, embed_dim, hidden_dim, n_cols = 6, 11, 16, 8, 32, 72
    group_lo = torch.tensor([-300, -7, 0, 5, 64, 1000], device=device)
    params64 = cg_mlp_params(n_in, pe_dim, embed_dim, hidden_dim, n_cols, device)
    params32 = [p.detach().float().requires_grad_() for p in params64]
    d_table = torch.randn(n_in * rows, n_cols, dtype=torch.float64, device=device)
    exact, grads64 = table_and_grads(range_table_reference(group_lo, rows, pe_dim, 4), params64, d_table)
    ref32, grads_ref32 = table_and_grads(range_table_reference(group_lo, rows, pe_dim, 4), params32, d_table.float())
    ours, grads32 = table_and_grads(range_table_op(group_lo, rows, pe_dim, 4), params32, d_table.float())

    def check(value, reference32, value64, what):
        budget = 4 * (reference32.double() - value64).abs().max().item() + 1e-6 * value64.abs().max().item()
        assert (value.double() - value64).abs().max().item() <= budget, what

    check(ours, ref32, exact, "table")
    for name, grad, grad_ref, grad64 in zip(("embedding", "w_hidden", "b_hidden", "w_out", "b_out"), grads32,
                                            grads_ref32, grads64):
        check(grad, grad_ref, grad64, name)


@pytest.mark.parametrize("generator", ["tile", "simt"])
def test_range_generator_keeps_encoding_precision_at_huge_groups(device, monkeypatch, generator):
    # |g| ~ 1e7: the encoding's phase g f_j needs float64 (in float32 g itself is off by up to 0.5, so sin and
    # cos of the low frequencies would be off by O(1)); the table and every gradient stay at float64 accuracy
    monkeypatch.setattr(ku, "CG_GENERATOR", generator)
    group_lo = torch.tensor([10_000_001, -9_999_999, 12_345_677], device=device)
    rows, pe_dim = 6, 16
    params = cg_mlp_params(3, pe_dim, 4, 9, 12, device)
    d_table = torch.randn(3 * rows, 12, dtype=torch.float64, device=device)
    table, grads = table_and_grads(range_table_op(group_lo, rows, pe_dim, 3), params, d_table)
    expected, grads_ref = table_and_grads(range_table_reference(group_lo, rows, pe_dim, 3), params, d_table)
    torch.testing.assert_close(table, expected, rtol=1e-12, atol=1e-12)
    for grad, grad_ref in zip(grads, grads_ref):
        torch.testing.assert_close(grad, grad_ref, rtol=1e-11, atol=1e-11)
    # the table rows of consecutive groups differ: the encoding did not collapse at this magnitude
    assert (table[1:rows] - table[:rows - 1]).abs().amax(dim=1).min() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tile_generator_encoding_within_its_bound(device, dtype):
    # the encoding the tile generator forms (the first pe_dim columns of the rows its forward keeps): float64
    # tables take the float64 sine (to its rounding), narrower ones the float32 sine of the phase reduced in
    # float64, within 2.4e-7 of the float64 sine at every magnitude up to |g| ~ 1e7 (kernels.ukan.encoding_at_single)
    from warpkan.torch_bridge.ukan_ops import _range_table_impl, positional_encoding

    pe_dim, rows = 16, 40
    group_lo = torch.tensor([-10_000_000, -123_457, -20, 0, 7, 65_537, 9_999_960], device=device)
    embedding, w_hidden, b_hidden, w_out, b_out = (p.detach() for p in cg_mlp_params(7, pe_dim, 8, 32, 12, device,
                                                                                      dtype=dtype))
    table, kept = _range_table_impl(group_lo, rows, pe_dim, embedding, w_hidden, b_hidden, w_out, b_out, 1,
                                    keep_rows=True)
    groups = (group_lo.unsqueeze(1) - 1 + torch.arange(rows, device=device)).reshape(-1)
    exact = positional_encoding(groups, pe_dim, torch.float64)
    error = (kept[:, :pe_dim].double() - exact).abs().max().item()
    assert error <= (1e-15 if dtype == torch.float64 else 2.4e-7)
    assert dtype == torch.float64 or error > 0  # the float32 entries are not the float64 sine rounded


def test_generator_kernels_compiled_for_three_blocks_an_sm():
    # __launch_bounds__(128, GENERATOR_MIN_BLOCKS) where that many blocks' shared memory fits an SM (the forward took
    # 222 registers, two blocks an SM, without it); the compiler's choice where it does not
    assert ku.GENERATOR_MIN_BLOCKS == 3
    for scalar, widths, bounded in (("float32", (16, 8, 32), True), ("float64", (64, 64, 64), False)):
        shared = max(ku.generator_shared_bytes(wp.types.type_size_in_bytes(getattr(wp, scalar)), widths))
        assert (3 * shared <= ku._SM_SHARED_BYTES) == bounded
        for kernel in (ku._generator_forward_kernel(scalar, widths, "range"),
                       *ku._generator_backward_kernels(scalar, widths, "range")):
            assert kernel.options.get("launch_bounds") == ((ku._GENERATOR_BLOCK_DIM, 3) if bounded else None)


def test_range_generator_gradients_bitwise_reproducible(device):
    group_lo = torch.tensor([-3, 4, 0, 9], device=device)
    params = cg_mlp_params(4, 16, 8, 32, 64, device, dtype=torch.float32)
    d_table = torch.randn(4 * 50, 64, device=device)
    first = table_and_grads(range_table_op(group_lo, 50, 16, 4), params, d_table)
    second = table_and_grads(range_table_op(group_lo, 50, 16, 4), params, d_table)
    assert torch.equal(first[0], second[0])
    assert all(torch.equal(a, b) for a, b in zip(first[1], second[1]))


def test_tile_matmul_switch_reaches_every_tile_matmul_module():
    # tile_matmul is Warp's scalar GEMM by default in every module that calls it, the UKAN generator's and the
    # Warp-native tile GEMMs' (a cuBLASDx module took 116-146 s to build on the GPU machine); set_tile_matmul
    # switches the modules already made and those made after
    from warpkan.kernels import _modules as kernel_modules
    from warpkan.kernels.edge import tile_gemm

    assert kernel_modules.TILE_MATMUL == "scalar"
    params = cg_mlp_params(2, 16, 8, 32, 12, "cpu", dtype=torch.float32)
    expected = table_and_grads(range_table_op(torch.tensor([0, 3]), 4, 16), params, torch.ones(8, 12))
    gemm_modules = [module for module, _ in tile_gemm.tile_gemm_modules("float32")]
    names = sorted(kernel_modules._tile_matmul_modules)
    assert any("generator_forward" in name for name in names) and any("generator_backward" in name for name in names)
    assert set(gemm_modules) <= set(names)

    def mathdx_options():
        return {wp.get_module(name).options["enable_mathdx_gemm"] for name in kernel_modules._tile_matmul_modules}

    assert mathdx_options() == {False}
    try:
        kernel_modules.set_tile_matmul("mathdx")
        assert mathdx_options() == {True}
        # a module named while cuBLASDx is chosen is made with it (a name no layer uses: whether the layers'
        # own modules already exist depends on the tests before)
        ku._generator_kernel_decorator("float32", (8, 8, 8), "switch_test")
        assert wp.get_module("warpkan_ukan_generator_switch_test_float32_8_8_8").options["enable_mathdx_gemm"] is True
    finally:
        kernel_modules.set_tile_matmul("scalar")
    assert mathdx_options() == {False}
    # on the CPU tile_matmul is Warp's scalar GEMM either way: the same table and gradients after the round trip
    again = table_and_grads(range_table_op(torch.tensor([0, 3]), 4, 16), params, torch.ones(8, 12))
    assert torch.equal(expected[0], again[0]) and all(torch.equal(a, b) for a, b in zip(expected[1], again[1]))
    with pytest.raises(ValueError, match="must be one of"):
        kernel_modules.set_tile_matmul("cublas")
    assert kernel_modules.TILE_MATMUL == "scalar"


def test_range_generator_choice(monkeypatch):
    assert ku.CG_GENERATOR == "tile"  # the default until the GPU A/B decides
    assert ku.use_tile_generator(4, 16, 8, 32) and ku.generator_widths(4, 16, 8, 32) == (16, 8, 32)
    assert ku.generator_widths(8, 0, 5, 33) == (8, 8, 64)
    assert not ku.use_tile_generator(4, 16, 8, ku.GENERATOR_WIDTHS[-1] + 1)
    assert ku.use_tile_generator(4, 64, 64, 64) and not ku.use_tile_generator(8, 64, 64, 64)  # shared memory
    monkeypatch.setattr(ku, "CG_GENERATOR", "simt")
    assert not ku.use_tile_generator(4, 16, 8, 32)
    monkeypatch.setattr(ku, "CG_GENERATOR", "fused")
    with pytest.raises(ValueError, match="CG_GENERATOR must be one of"):
        ku.use_tile_generator(4, 16, 8, 32)


@pytest.mark.parametrize("rows", ["range", "pairs"])
@pytest.mark.parametrize("scalar", ["float32", "float64"])
@pytest.mark.parametrize("widths", [(8, 8, 8), (16, 8, 32), (8, 128, 16), (64, 64, 64)])
def test_generator_shared_memory_bound(scalar, widths, rows):
    # the bound that picks the generator covers what Warp asks of the device for a block (its code generator's
    # estimate, the dynamic shared memory a launch configures; read here from Warp's module builder, without
    # compiling), and is close to it
    from warp._src.context import ModuleBuilder

    def warp_estimate(kernel):
        options = kernel.module.options | {"block_dim": ku._GENERATOR_BLOCK_DIM, "output_arch": None}
        meta = ModuleBuilder(kernel.module, options, target="cpu").build_meta()
        return max(v for k, v in meta.items() if k.endswith("forward_smem_bytes"))

    estimates = (warp_estimate(ku._generator_forward_kernel(scalar, widths, rows)),
                 warp_estimate(ku._generator_backward_kernels(scalar, widths, rows)[0]))  # its module: both
    bounds = ku.generator_shared_bytes(wp.types.type_size_in_bytes(getattr(wp, scalar)), widths)
    for estimate, bound in zip(estimates, bounds):
        assert estimate <= bound <= estimate + ku._GENERATOR_SHARED_SLACK


@pytest.mark.parametrize("generator", ["tile", "simt"])
def test_dense_range_layer_with_either_generator(device, monkeypatch, generator):
    # the eager range layer (the table and its rows kept for the backward, or recomputed after a retained
    # graph's first backward) on either generator: forward and every gradient against the reference
    monkeypatch.setattr(ku, "CG_GENERATOR", generator)
    layer = make_layer(4, 3, device, pe_dim=6, embed_dim=5, hidden_dim=11)
    x = torch.randn(23, 4, dtype=torch.float64, device=device) * 2
    dy = torch.randn(23, 3, dtype=torch.float64, device=device)
    x = x.requires_grad_()
    y = layer(x)
    assert layer._last is None  # the dense-range path
    names, params = zip(*params_of(layer))
    first = torch.autograd.grad(y, (x, *params), dy, retain_graph=True)
    second = torch.autograd.grad(y, (x, *params), dy)
    y_ref, grads_ref = forward_and_grads(lambda t: reference(layer, t), layer, x, dy)
    torch.testing.assert_close(y.detach(), y_ref, rtol=1e-12, atol=1e-12)
    for name, grad, again in zip(("x", *names), first, second):
        torch.testing.assert_close(grad, grads_ref[name], rtol=1e-11, atol=1e-12, msg=name)
        assert torch.equal(grad, again), name


# ---------------------------------------------------------------------- Warp-native layer
@pytest.mark.parametrize("generator", ["tile", "simt"])
def test_native_matches_torch_layer_under_tape(device, monkeypatch, generator):
    # the CG-MLP on the pair rows by either generator; a second recorded step accumulates into the gradients
    from warpkan.native.ukan import UKANLinear as NativeUKAN

    monkeypatch.setattr(ku, "CG_GENERATOR", generator)

    native = NativeUKAN(3, 4, spline_order=3, grid_delta=H, pe_dim=4, embed_dim=3, hidden_dim=6,
                        device=device, dtype=wp.float64, seed=1)
    layer = make_layer(3, 4, device)
    layer.load_state_dict({k: torch.from_numpy(v) for k, v in native.state_dict().items()})
    x_t = torch.randn(11, 3, dtype=torch.float64, device=device) * 3
    x_t[4, 0] = float("nan")
    dy_t = torch.randn(11, 4, dtype=torch.float64, device=device)
    dy_t[4] = 0
    x = wp.array(x_t.cpu().numpy(), dtype=wp.float64, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        y = native(x)
    y.grad = wp.array(dy_t.cpu().numpy(), dtype=wp.float64, device=device)
    tape.backward()
    y_ref, grads_ref = forward_and_grads(layer, layer, x_t, dy_t)
    np.testing.assert_allclose(y.numpy(), y_ref.cpu().numpy(), rtol=1e-12, atol=1e-12)
    torch_names = {"feature_embedding": "feature_embedding", "cg_hidden.weight": "w1", "cg_hidden.bias": "b1",
                   "cg_out.weight": "w2", "cg_out.bias": "b2"}
    for name, attr in torch_names.items():
        np.testing.assert_allclose(getattr(native, attr).grad.numpy(), grads_ref[name].cpu().numpy(),
                                   rtol=1e-11, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(native.scaler_t.grad.numpy().T, grads_ref["spline_scaler"].cpu().numpy(), rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(native.base_weight_t.grad.numpy().T, grads_ref["base_weight"].cpu().numpy(), rtol=1e-11, atol=1e-12)
    dx = x.grad.numpy()
    np.testing.assert_allclose(np.delete(dx, 4, 0), np.delete(grads_ref["x"].cpu().numpy(), 4, 0), rtol=1e-11, atol=1e-12)
    tape = wp.Tape()
    with tape:
        y = native(x)
    y.grad = wp.array(dy_t.cpu().numpy(), dtype=wp.float64, device=device)
    tape.backward()
    for name, attr in torch_names.items():
        np.testing.assert_allclose(getattr(native, attr).grad.numpy(), 2 * grads_ref[name].cpu().numpy(),
                                   rtol=1e-11, atol=1e-12, err_msg=name)


def test_native_bad_input_and_empty(device):
    from warpkan.native.ukan import UKANLinear as NativeUKAN

    native = NativeUKAN(3, 2, device=device, dtype=wp.float32)
    with pytest.raises(ValueError, match="x"):
        native(wp.zeros((4, 5), dtype=wp.float32, device=device))
    with pytest.raises(TypeError, match="x"):
        native(wp.zeros((4, 3), dtype=wp.float64, device=device))
    y = native(wp.zeros((0, 3), dtype=wp.float32, device=device))
    assert y.shape == (0, 2)


# ---------------------------------------------------------------------- fixed capacity, no read-back
def test_capacity_overflow_gives_zero_spline_and_is_reported(device):
    # a table too small for the data: the pairs past the capacity get no spline term (as NaN does), the
    # rest are exact, and table_overflow() says how many rows were missing
    layer = make_layer(1, 2, device, base=None)
    x = torch.tensor([[0.1], [1.1], [2.1], [3.1], [4.1]], dtype=torch.float64, device=device)  # 5 groups
    full = pairs_of(x)
    assert int(full[5]) == 6 and layer.table_overflow(x) == 0
    small = pairs_of(x, 4)
    sorted_elem, window, local_u, feature, group, needed = small
    assert int(needed) == 6 and feature.shape == (4,)
    table = layer._table(feature, group)
    y = tb.ukan_ops.spline_layer(x, sorted_elem, window, local_u, feature, table, layer.base_weight,
                                 layer.spline_scaler, H, 3, False)
    y_ref = reference(layer, x)
    torch.testing.assert_close(y[:3], y_ref[:3], rtol=1e-12, atol=1e-12)  # rows 0..3 fit: groups 0, 1, 2
    assert torch.all(y[3:] == 0)


def test_pair_search_order_serves_the_table_gradient(device):
    """The sparse spline's backward takes the elements in the pair search's sorted order (no sort of its own):
    the same gradients as the engine's own sort by group, with NaN inputs and pairs past the capacity among
    them (both invalid, last in that order)."""
    from warpkan.torch_bridge import ukan_ops
    from warpkan.torch_bridge.edge_driver import stencil_backward
    from warpkan.torch_bridge.edge_ops import backward_impl

    layer = make_layer(3, 4, device)
    x = torch.randn(40, 3, dtype=torch.float64, device=device) * 3
    x[5, 1] = float("nan")
    sorted_elem, window, local_u, feature, group, needed = pairs_of(x, 24)
    assert int(needed) > 24  # some pairs past the capacity
    table = layer._table(feature, group).detach()
    dy = torch.randn(40, 4, dtype=torch.float64, device=device)
    base_t, scaler_t = layer.base_weight.t().contiguous(), layer.spline_scaler.t().contiguous()
    spec = ukan_ops.table_spec(x, window, local_u, feature, H, 3, True, table.shape[0])
    ours = backward_impl(dy, x, spec.frame_tensors, base_t, scaler_t, table.unsqueeze(0), sorted_elem, spec, "auto",
                         "auto", False, True, True, False)
    sorted_by_engine = stencil_backward(*spec[:4], dy, x, base_t, scaler_t, table.unsqueeze(0).expand(3, -1, -1),
                                        True, True, True, True)
    for name, a, b in zip(("dx", "d_base", "d_scaler"), ours[:3], sorted_by_engine[:3]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, equal_nan=True, msg=name)  # the NaN input's row
    torch.testing.assert_close(ours[3][0], sorted_by_engine[3][0], rtol=1e-12, atol=1e-12, msg="d_table")
    assert float(ours[3].abs().max()) > 0


def test_default_table_grows_to_the_exact_need(device):
    """table_groups=None: a batch spread over more groups than the default capacity still gets every spline
    term (the table is sized from the needed row count), matching the per-sample reference."""
    layer = make_layer(1, 2, device)
    x = (torch.arange(700, dtype=torch.float64, device=device) * 2.05 - 700).unsqueeze(1)  # groups 2 apart: 1400 rows
    assert int(pairs_of(x)[5]) > layer._capacity(x.shape[0])
    torch.testing.assert_close(layer(x), reference(layer, x), rtol=1e-10, atol=1e-12)
    assert layer.table_overflow() == 0
    with pytest.raises(RuntimeError, match="table_groups"):
        torch.compile(layer, fullgraph=True)(x[:5])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA-graph capture needs a GPU")
def test_cuda_graph_capture_of_a_sparse_step_after_eager_steps():
    """A training step on the sparse pair path captured after eager steps on the default stream (the layer
    keeps nothing of a step's autograd graph for the next one, which would otherwise be freed inside the
    capture), replayed on new data: the gradients of the same step run eagerly."""
    from warpkan.torch_bridge import capture_step

    torch.manual_seed(0)
    layer = UKANLinear(6, 5, grid_delta=0.25, device="cuda", table_groups=64)
    layer.dense_max_coefficients = 0
    x = (torch.randn(97, 6, device="cuda") * 2).requires_grad_()

    def step():
        layer.zero_grad(set_to_none=False)
        x.grad = None
        y = layer(x)
        y.square().sum().backward()
        return y

    for _ in range(3):
        step()
    assert layer._last is not None  # the pair path
    replay = capture_step(step)
    x.data.copy_(torch.randn_like(x) * 3)
    y = replay()
    torch.cuda.synchronize()
    grads = [p.grad.clone() for p in layer.parameters()]
    y_eager = step()
    torch.testing.assert_close(y, y_eager, rtol=1e-6, atol=1e-6)
    for got, p in zip(grads, layer.parameters()):
        torch.testing.assert_close(got, p.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA-graph capture needs a GPU")
@pytest.mark.parametrize("strategy", ["stencil", "gemm"])
def test_cuda_graph_capture(strategy):
    # nothing is read back to the host, so forward and backward capture; the replay recomputes the
    # touched pairs of the new data. A fixed strategy: "auto" may take another route captured than eager
    torch.manual_seed(0)
    layer = UKANLinear(6, 5, grid_delta=0.25, device="cuda", table_groups=16, strategy=strategy)
    x = (torch.randn(97, 6, device="cuda") * 2).requires_grad_()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up: compile kernels
            layer(x).square().sum().backward()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    layer.zero_grad(set_to_none=False)
    x.grad = None
    with torch.cuda.graph(graph):
        y = layer(x)
        y.square().sum().backward()
    x.data.copy_(torch.randn_like(x) * 3)
    layer.zero_grad(set_to_none=False)
    graph.replay()
    torch.cuda.synchronize()
    ref_layer = UKANLinear(6, 5, grid_delta=0.25, device="cuda", table_groups=16, strategy=strategy)
    ref_layer.load_state_dict(layer.state_dict())
    x_ref = x.detach().clone().requires_grad_()
    y_ref = ref_layer(x_ref)
    y_ref.square().sum().backward()
    if strategy == "stencil":
        assert torch.equal(y, y_ref)  # same kernels, same data: bitwise
    else:  # cuBLAS may take other kernels inside a graph
        torch.testing.assert_close(y, y_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-5, atol=1e-5)
    for (name, p), p_ref in zip(layer.named_parameters(), ref_layer.parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-5, atol=1e-5, msg=name)


def _side_layer(frozen: bool):
    """A UKANLinear on the gemm strategy, 13 -> 7, its CG-MLP frozen where ``frozen``."""
    torch.manual_seed(1)
    layer = UKANLinear(13, 7, grid_delta=0.5, table_groups=4, strategy="gemm", device="cuda")
    for p in [*layer.cg_hidden.parameters(), *layer.cg_out.parameters(), layer.feature_embedding] if frozen else ():
        p.requires_grad_(False)
    return layer


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA-graph capture needs a GPU")
@pytest.mark.parametrize("case", ["1 row", "37 rows", "1024 rows", "three chunks", "bf16 autocast", "frozen",
                                  "no input gradient"])
def test_captured_side_stream_matches_one_stream_cuda(case, monkeypatch):
    """On the gemm strategy a captured UKAN step runs its parameter side on a side stream
    (``_common.gemm_side_work``): the CG-MLP and the combined weight beside the basis expansion, the weight
    gradient's split and the CG-MLP's backward beside the input gradient. Its output and every gradient equal,
    bitwise, those of the same step captured on one stream: the basis in one chunk (kept for the backward) or in
    three (the split forked after the last chunk's product), under bf16 autocast, with the CG-MLP frozen, with
    no input gradient; and the forward and the backward each fork once."""
    from warpkan.torch_bridge import _common, capture_step, edge_driver

    n_rows = {"1 row": 1, "37 rows": 37, "three chunks": 1500}.get(case, 1024)
    if case == "three chunks":  # about 600 rows a chunk of the basis (counted_chunk_rows), and none kept
        monkeypatch.setattr(edge_driver, "KEEP_BASIS_BYTES", 0)
    chunks, forks = [], []
    chunk_rows = edge_driver._chunk_rows

    def counted_chunk_rows(n, width, entry_bytes, *args, **kwargs):
        if case == "three chunks":
            monkeypatch.setattr(edge_driver, "GEMM_CHUNK_BYTES", 600 * width * entry_bytes)
        chunks.append(chunk_rows(n, width, entry_bytes, *args, **kwargs))
        return chunks[-1]

    monkeypatch.setattr(edge_driver, "_chunk_rows", counted_chunk_rows)
    fork = _common.SideStream.fork
    monkeypatch.setattr(_common.SideStream, "fork", lambda self: forks.append(1) or fork(self))
    torch.manual_seed(0)
    source = torch.rand(n_rows, 13, device="cuda") * 3.0 - 0.95
    dy = torch.randn(n_rows, 7, device="cuda")

    def captured(side: bool):
        layer = _side_layer(case == "frozen")
        x = source.clone().requires_grad_(case != "no input gradient")
        params = [p for p in layer.parameters() if p.requires_grad]

        def step():
            for p in params:
                p.grad = None
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=case == "bf16 autocast"):
                y = layer(x)
            y.backward(dy.to(y.dtype))
            return y

        real = _common.side_work
        monkeypatch.setattr(_common, "side_work", real if side else (lambda device: None))
        forks.clear()
        y = capture_step(step)().clone()
        torch.cuda.synchronize()
        monkeypatch.setattr(_common, "side_work", real)
        grads = [x.grad] + [p.grad for p in params]
        return [y] + [g.clone() for g in grads if g is not None], len(forks)

    two, side_forks = captured(True)
    one, one_forks = captured(False)
    assert max(-(-n_rows // c) for c in chunks) == (3 if case == "three chunks" else 1)
    assert side_forks == 2 and one_forks == 0
    assert len(two) == len(one) >= 3
    for a, b in zip(two, one):
        assert a.dtype == b.dtype and torch.equal(a, b), (a - b).abs().max()


def test_sparse_path_embedding_route_follows_determinism(device, monkeypatch):
    # the CG-MLP's embedding on the sparse path: F.embedding by default; indexing (sort-based backward) for a
    # deterministic layer or under torch.use_deterministic_algorithms; the same values either way
    import torch.nn.functional as F

    calls = []
    embedding = F.embedding

    def counted(*args, **kwargs):
        calls.append(1)
        return embedding(*args, **kwargs)

    monkeypatch.setattr(F, "embedding", counted)
    layer = make_layer(3, 4, device, dtype=torch.float32, hidden_dim=8)
    layer.dense_max_coefficients = 0
    x = torch.randn(300, 3, device=device) * 3
    loose = _step(layer, x)
    assert layer._last is not None and calls  # the pair path, through F.embedding
    calls.clear()
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)  # warn only: cuBLAS wants an env var to be strict
    try:
        strict = _step(layer, x)
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    layer.deterministic = True
    own = _step(layer, x)
    assert not calls
    for a, b, c in zip(strict, own, loose):
        assert torch.equal(a, b)
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5 * float(c.abs().max()))


def test_sparse_path_starts_from_the_last_batch_need(device, monkeypatch):
    # exact mode on data that needs far more table rows than the default capacity: the first forward runs the
    # pair pass twice (then grows), the next on similar data once; the outputs do not depend on the capacity
    import warpkan.torch_bridge.ukan_ops as uo

    calls = []
    impl = uo._pairs_impl

    def counted(x, grid_delta, spline_order, capacity):
        calls.append(capacity)
        return impl(x, grid_delta, spline_order, capacity)

    monkeypatch.setattr(uo, "_pairs_impl", counted)
    layer = make_layer(8, 3, device, dtype=torch.float32)
    layer.grid_delta = 0.01
    x = torch.randn(400, 8, device=device) * 2
    y1 = layer(x)
    assert layer._last is not None and len(calls) == 2 and calls[1] > calls[0]
    needed = int(layer._last[2].item())
    assert needed > calls[0]
    calls.clear()
    y2 = layer(x)
    assert len(calls) == 1 and calls[0] >= needed
    assert torch.equal(y1, y2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bench_graphs_every_capturable_row_cuda():
    """`warpkan bench ukan` captures each training step in a CUDA graph: every row but the exact-table
    UKANLinear's (which reads its table size back) has a graphed time, the paper's pure-torch method included
    (its reference once copied its basis matrix from the host on every call, which capture refuses)."""
    from warpkan.bench import ukan as bench_ukan

    rows = bench_ukan.run("cuda", quick=True)
    assert len(rows) == len(bench_ukan.QUICK_CASES) * len(bench_ukan.IMPLS)
    for row in rows:
        assert "note" not in row, row
        if row["impl"] == "warpkan UKANLinear":
            assert "graphed_total_ms" not in row and "graphed note" in row
        else:
            assert row["graphed_total_ms"] > 0, row
