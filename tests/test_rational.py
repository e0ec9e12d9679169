"""Group-rational activation (KAT / FlashKAT): Warp kernels against the float64 torch reference."""

import numpy as np
import pytest
import torch
import warp as wp

import warpkan
from warpkan.kernels import rational as kr
from warpkan.reference.rational import group_rational_reference
from warpkan.torch_bridge import GRKANLinear, GroupRational, KATMLP, group_rational
from warpkan.torch_bridge.rational_ops import group_rational_backward, group_rational_forward

# relative error of one rounding in the I/O dtype: outputs and dx are rounded once to it
IO_EPS = {torch.float64: 2.0**-52, torch.float32: 2.0**-23, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def _coefficients(groups, shared, variant, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = 0.5 * torch.randn(1 if shared else groups, 6, generator=g, dtype=dtype)
    b = 0.5 * torch.randn(groups, 4, generator=g, dtype=dtype)
    return a, b


def _reference_grads(x, a, b, groups, variant, dy):
    """Forward and all gradients of the float64 reference at the given (already rounded) values."""
    xr, ar, br = (t.detach().double().clone().requires_grad_() for t in (x, a, b))
    y = group_rational_reference(xr, ar, br, groups, variant)
    y.backward(dy.double())
    return y.detach(), xr.grad, ar.grad, br.grad


def _kernel_grads(x, a, b, groups, variant, dy, deterministic=False):
    xk, ak, bk = (t.detach().clone().requires_grad_() for t in (x, a, b))
    y = group_rational(xk, ak, bk, groups, variant, deterministic)
    y.backward(dy)
    return y.detach(), xk.grad, ak.grad, bk.grad


def _torch_device(device):
    return torch.device("cuda" if device == "cuda" else "cpu")


@pytest.mark.parametrize("variant", ["A", "B"])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_reference(device, variant, shared, dtype):
    dev = _torch_device(device)
    groups = 4
    x = torch.randn(3, 7, 32, dtype=torch.float64).to(dtype)  # N-D input, 21 rows
    dy = torch.randn(3, 7, 32, dtype=torch.float64).to(dtype)
    a, b = _coefficients(groups, shared, variant)
    y64, dx64, da64, db64 = _reference_grads(x, a, b, groups, variant, dy)
    y, dx, da, db = _kernel_grads(x.to(dev), a.to(dtype).to(dev), b.to(dtype).to(dev), groups, variant, dy.to(dev))
    assert y.dtype == dtype and da.dtype == dtype and y.shape == x.shape
    if dtype == torch.float64:
        tol = dict(rtol=1e-11, atol=1e-12)
        for got, ref in ((y, y64), (dx, dx64), (da, da64), (db, db64)):
            torch.testing.assert_close(got.cpu(), ref, **tol)
        return
    # float32: no worse than the same formula evaluated by torch in float32 (a few roundings more at most)
    y32, dx32, da32, db32 = _reference_grads_in(torch.float32, x, a, b, groups, variant, dy)
    for got, ref32, ref in ((y, y32, y64), (dx, dx32, dx64), (da, da32, da64), (db, db32, db64)):
        err = (got.cpu().double() - ref).abs().max().item()
        err_ref = (ref32.double() - ref).abs().max().item()
        scale = ref.abs().max().item()
        assert err <= 4 * err_ref + 16 * IO_EPS[dtype] * scale, (err, err_ref, scale)


def _reference_grads_in(dtype, x, a, b, groups, variant, dy):
    xr, ar, br = (t.detach().to(dtype).clone().requires_grad_() for t in (x, a, b))
    y = group_rational_reference(xr, ar, br, groups, variant)
    y.backward(dy.to(dtype))
    return y.detach(), xr.grad, ar.grad, br.grad


def test_gradcheck_float64(device):
    dev = _torch_device(device)
    for variant, shared in (("A", True), ("B", False)):
        a, b = _coefficients(2, shared, variant)
        x = (torch.rand(5, 8, dtype=torch.float64) + 0.1) * torch.sign(torch.randn(5, 8, dtype=torch.float64))
        inputs = tuple(t.to(dev).requires_grad_() for t in (x, a, b))
        assert torch.autograd.gradcheck(lambda x_, a_, b_: group_rational(x_, a_, b_, 2, variant), inputs)


@pytest.mark.parametrize("variant", ["A", "B"])
def test_coefficient_gradient_precision_fp32(device, variant):
    """fp32 kernels vs float64: the coefficient gradients err no more than torch's own fp32 evaluation of
    the formula (the FlashKAT precision target, at a reduced ViT shape: 8 x 197 tokens x 96 channels)."""
    dev = _torch_device(device)
    groups = 8
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 197, 96, generator=g).float()
    dy = torch.randn(8, 197, 96, generator=g).float() / x[..., 0].numel()  # gradient of a mean over rows
    numerator, denominator = kr.init_coefficients("swish", (5, 4), variant)
    a = torch.tensor([numerator], dtype=torch.float32)
    b = torch.tensor([denominator], dtype=torch.float32).repeat(groups, 1) + 0.01 * torch.randn(groups, 4, generator=g)
    _, _, da64, db64 = _reference_grads(x, a, b, groups, variant, dy)
    _, _, da32, db32 = _reference_grads_in(torch.float32, x, a, b, groups, variant, dy)
    for deterministic in (True, False):
        _, _, da, db = _kernel_grads(x.to(dev), a.to(dev), b.to(dev), groups, variant, dy.to(dev), deterministic)
        for got, ref32, ref in ((da, da32, da64), (db, db32, db64)):
            mae = (got.cpu().double() - ref).abs().mean().item()
            mae_ref = (ref32.double() - ref).abs().mean().item()
            assert mae <= max(mae_ref, 4 * IO_EPS[torch.float32] * ref.abs().max().item()), (mae, mae_ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_io(device, dtype):
    """bf16/fp16 I/O: fp32 arithmetic, so y and dx are the float64 values rounded once; the coefficient
    gradients (fp32 sums) are at fp32 level."""
    dev = _torch_device(device)
    groups = 2
    x = torch.randn(9, 64).to(dtype)
    dy = torch.randn(9, 64).to(dtype)
    a, b = (t.float() for t in _coefficients(groups, True, "A"))
    y64, dx64, da64, db64 = _reference_grads(x, a, b, groups, "A", dy)
    y, dx, da, db = _kernel_grads(x.to(dev), a.to(dev), b.to(dev), groups, "A", dy.to(dev))
    assert y.dtype == dtype and dx.dtype == dtype and da.dtype == torch.float32
    eps = IO_EPS[dtype]
    for got, ref in ((y, y64), (dx, dx64)):
        assert ((got.cpu().double() - ref).abs() <= 2 * eps * ref.abs() + 1e-6 * (1 + ref.abs())).all()
    for got, ref in ((da, da64), (db, db64)):
        torch.testing.assert_close(got.cpu().double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


@pytest.mark.parametrize("x_dtype,a_dtype,b_dtype", [
    (torch.bfloat16, torch.bfloat16, torch.bfloat16),  # a module moved to bf16
    (torch.float32, torch.bfloat16, torch.bfloat16),  # bf16 weights, fp32 activations
    (torch.bfloat16, torch.float16, torch.float16),
    (torch.float32, torch.float64, torch.float64),
    (torch.float32, torch.float32, torch.float64),  # weights of two dtypes: cast to the arithmetic one
])
def test_weight_dtypes(device, x_dtype, a_dtype, b_dtype):
    """The kernels read the weights in their own dtype and write their gradients in it: the values are
    those of the float64 reference at the (rounded) weights, rounded once to the weights' dtype."""
    dev = _torch_device(device)
    groups = 2
    x = torch.randn(11, 48).to(x_dtype)
    dy = torch.randn(11, 48).to(x_dtype)
    a, b = _coefficients(groups, False, "A")
    a, b = a.to(a_dtype), b.to(b_dtype)
    y64, dx64, da64, db64 = _reference_grads(x, a, b, groups, "A", dy)
    y, dx, da, db = _kernel_grads(x.to(dev), a.to(dev), b.to(dev), groups, "A", dy.to(dev))
    assert (y.dtype, dx.dtype, da.dtype, db.dtype) == (x_dtype, x_dtype, a_dtype, b_dtype)
    eps_x = IO_EPS[x_dtype]
    for got, ref in ((y, y64), (dx, dx64)):
        assert ((got.cpu().double() - ref).abs() <= 2 * eps_x * ref.abs() + 1e-5 * (1 + ref.abs())).all()
    for got, ref in ((da, da64), (db, db64)):
        # one rounding to the weight dtype on top of fp32 sums (fp64 sums for fp64 x)
        tol = 2 * IO_EPS[got.dtype] * ref.abs() + 1e-5 * ref.abs().max()
        assert ((got.cpu().double() - ref).abs() <= tol).all(), (got, ref)


def test_eager_step_launches_no_casts_or_fills(eager_step_ops):
    """A bf16 module's fwd+bwd step runs the Warp kernels and allocations only: the casts of the weights
    and the zero fills of their gradients, each a 10-25 us torch launch of host time on the GPU machine,
    are gone (the kernels widen and narrow in place)."""
    layer = GroupRational(32, num_groups=4).to(torch.bfloat16)
    x = torch.randn(5, 32, dtype=torch.bfloat16, requires_grad=True)
    names = eager_step_ops(layer, x, torch.ones(5, 32, dtype=torch.bfloat16))
    assert not names & {"aten::_to_copy", "aten::copy_", "aten::fill_", "aten::zero_"}, sorted(names)
    assert layer.weight_denominator.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("variant", ["A", "B"])
def test_zero_huge_nan_inf(device, variant):
    dev = _torch_device(device)
    groups = 2
    a, b = _coefficients(groups, False, variant)
    x = torch.randn(6, 8, dtype=torch.float64)
    x[0, 0] = 0.0
    x[1, :] = torch.tensor([1e30, -1e30, 3e8, -3e8, 1e12, 7e3, -7e4, 1e20])
    x[2, 3] = float("nan")
    x[2, 2] = -1e30  # a huge value in the NaN's 16-byte vector: the vector still takes the homogeneous form
    x[3, 5] = float("inf")
    x[3, 6] = float("-inf")
    dy = torch.randn(6, 8, dtype=torch.float64)
    for dtype in (torch.float64, torch.float32):
        xi = x.to(dtype)
        finite = torch.ones(6, dtype=torch.bool)
        finite[2] = finite[3] = False
        y64, dx64, _, _ = _reference_grads(xi[finite], a, b, groups, variant, dy[finite].to(dtype))
        y, dx, da, db = _kernel_grads(xi.to(dev), a.to(dtype).to(dev), b.to(dtype).to(dev), groups, variant,
                                      dy.to(dtype).to(dev))
        y, dx = y.cpu(), dx.cpu()
        rtol = 1e-10 if dtype == torch.float64 else 1e-4
        torch.testing.assert_close(y[finite].double(), y64, rtol=rtol, atol=rtol)
        torch.testing.assert_close(dx[finite].double(), dx64, rtol=rtol, atol=rtol)
        # NaN stays in its element; +-inf gives the rational's limit (~ (a_m / b_{n-1}) x), not NaN
        assert torch.isnan(y[2, 3]) and torch.isnan(dx[2, 3])
        others = [0, 1, 2, 4, 5, 6, 7]
        y2_64, dx2_64, _, _ = _reference_grads(xi[2:3], a, b, groups, variant, dy[2:3].to(dtype))
        torch.testing.assert_close(y[2, others].double(), y2_64[0, others], rtol=rtol, atol=rtol)
        torch.testing.assert_close(dx[2, others].double(), dx2_64[0, others], rtol=rtol, atol=rtol)
        assert torch.isinf(y[3, 5]) and torch.isinf(y[3, 6]) and torch.isfinite(dx[3, 5])
        # the coefficient gradients sum over all rows: the NaN row makes them NaN, as in the reference
        assert torch.isnan(da).any() and torch.isnan(db).any()


def test_blocks_of_many_lanes_on_cpu():
    """The tile reduction and the lane-to-item mapping with 256-lane blocks (the GPU configuration), run on
    the CPU by enabling CPU blocks; includes a group wider than one block tile (> 1024 vectors)."""
    previous = wp.config.enable_cpu_blocks
    wp.config.enable_cpu_blocks = True
    try:
        for rows, channels, groups, shared in ((301, 24, 3, True), (9, 8400, 2, False)):
            x = torch.randn(rows, channels)
            dy = torch.randn(rows, channels)
            a, b = (t.float() for t in _coefficients(groups, shared, "A"))
            y64, dx64, da64, db64 = _reference_grads(x, a, b, groups, "A", dy)
            for deterministic in (True, False):
                y = torch.empty_like(x)
                dx = torch.zeros_like(x)
                da, db = torch.zeros_like(a), torch.zeros_like(b)
                w = wp.from_torch
                kr.launch_forward(w(x), w(a), w(b), w(y), groups, "A")
                kr.launch_backward(w(dy), w(x), w(a), w(b), groups, "A", dx=w(dx), da=w(da), db=w(db),
                                   deterministic=deterministic)
                for got, ref in ((y, y64), (dx, dx64), (da, da64), (db, db64)):
                    torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())
    finally:
        wp.config.enable_cpu_blocks = previous


def test_deterministic_is_bitwise(device):
    dev = _torch_device(device)
    x = torch.randn(50, 16, device=dev)
    dy = torch.randn(50, 16, device=dev)
    a, b = (t.float().to(dev) for t in _coefficients(4, True, "A"))
    first = _kernel_grads(x, a, b, 4, "A", dy, deterministic=True)
    second = _kernel_grads(x, a, b, 4, "A", dy, deterministic=True)
    for u, v in zip(first, second):
        assert torch.equal(u, v)


def test_awkward_sizes_and_layouts(device):
    dev = _torch_device(device)
    a, b = _coefficients(5, False, "B", dtype=torch.float32)
    a, b = a.to(dev), b.to(dev)
    # 1 row, a prime group size (3 channels per group: scalar loads), non-contiguous input
    for x in (torch.randn(1, 15), torch.randn(15, 13).t(), torch.randn(2, 3, 30)[..., ::2]):
        x = x.to(dev)
        y = group_rational(x, a, b, 5, "B")
        ref = group_rational_reference(x.double().cpu(), a.double().cpu(), b.double().cpu(), 5, "B")
        torch.testing.assert_close(y.cpu().double(), ref, rtol=1e-5, atol=1e-5)
    # empty batch
    x = torch.randn(0, 15, device=dev, requires_grad=True)
    ar, br = a.clone().requires_grad_(), b.clone().requires_grad_()
    y = group_rational(x, ar, br, 5, "B")
    assert y.shape == (0, 15)
    y.sum().backward()
    assert x.grad.shape == (0, 15) and torch.equal(ar.grad, torch.zeros_like(a))


def test_bad_input_is_refused():
    a, b = _coefficients(4, True, "A", dtype=torch.float32)
    x = torch.randn(3, 32)
    with pytest.raises(ValueError, match="uneven groups"):
        group_rational(torch.randn(3, 30), a, b, 4)
    with pytest.raises(ValueError, match="uneven groups"):
        GroupRational(30, num_groups=4)
    with pytest.raises(TypeError, match="x must have dtype"):
        group_rational(x.int(), a, b, 4)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        group_rational(x.numpy(), a, b, 4)
    with pytest.raises(ValueError, match="weight_numerator"):
        group_rational(x, torch.randn(3, 6), b, 4)
    with pytest.raises(ValueError, match="weight_denominator"):
        group_rational(x, a, torch.randn(2, 4), 4)
    with pytest.raises(ValueError, match="variant"):
        group_rational(x, a, b, 4, variant="C")
    with pytest.raises(ValueError, match="init"):
        GroupRational(32, 4, init="relu")
    with pytest.raises(ValueError, match="fitted"):
        GroupRational(32, 4, order=(7, 2), init="gelu")
    with pytest.raises(ValueError, match="last dimension 32"):
        GroupRational(32, 4)(torch.randn(3, 16))


def test_opcheck_and_compile():
    x = torch.randn(6, 16, requires_grad=True)
    a, b = (t.float().requires_grad_() for t in _coefficients(4, True, "A"))
    torch.library.opcheck(group_rational_forward, (x, a, b, 4, "A", True))
    dy = torch.randn(6, 16)
    torch.library.opcheck(group_rational_backward, (dy, x.detach(), a.detach(), b.detach(), 4, "A", True, True, True))
    layer = GroupRational(16, num_groups=4)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    y = compiled(x)
    torch.testing.assert_close(y, layer(x))
    y.sum().backward()
    assert layer.weight_denominator.grad is not None and x.grad is not None


def test_modules_inits_and_checkpoints():
    layer = GroupRational(64, num_groups=8, init="swish")
    assert tuple(layer.weight_numerator.shape) == (1, 6) and tuple(layer.weight_denominator.shape) == (8, 4)
    assert tuple(GroupRational(64, 8, shared_numerator=False).weight_numerator.shape) == (8, 6)
    x = torch.linspace(-3, 3, 64 * 4).reshape(4, 64)
    for variant in ("A", "B"):
        swish = GroupRational(64, 8, variant=variant, init="swish")(x)
        torch.testing.assert_close(swish, torch.nn.functional.silu(x), rtol=0, atol=1e-5)
        gelu = GroupRational(64, 8, variant=variant, init="gelu")(x)
        torch.testing.assert_close(gelu, torch.nn.functional.gelu(x), rtol=0, atol=1e-2)
        torch.testing.assert_close(GroupRational(64, 8, variant=variant, init="identity")(x), x)
    # a KAT KAT_Group state dict (same names and shapes) loads as it is
    kat_state = {"weight_numerator": torch.randn(1, 6), "weight_denominator": torch.randn(8, 4)}
    layer.load_state_dict(kat_state)
    torch.testing.assert_close(layer.weight_denominator, kat_state["weight_denominator"])


def test_grkan_linear_and_kat_mlp():
    torch.manual_seed(0)
    layer = GRKANLinear(96, 64, num_groups=8)
    x = torch.randn(4096, 96)
    y = layer(x)
    assert y.shape == (4096, 64)
    assert 0.85 < y.std().item() < 1.15  # variance-preserving init
    mlp = KATMLP(32, 64, num_groups=4)
    assert mlp.fc1.rational.init == "identity" and mlp.fc2.rational.init == "swish"
    out = mlp(torch.randn(3, 5, 32))
    assert out.shape == (3, 5, 32)
    out.sum().backward()
    assert mlp.fc1.rational.weight_denominator.grad is not None


@pytest.mark.parametrize("variant", ["A", "B"])
def test_native_layers_match_torch(device, variant):
    layer = warpkan.GRKANLinear(16, 5, num_groups=4, variant=variant, init="gelu", shared_numerator=False,
                                deterministic=True, dtype=wp.float64, device=device)
    # the torch layer runs on the same device, so a cuda run never needs Warp's CPU compiler
    tdev = "cuda" if str(device).startswith("cuda") else "cpu"
    torch_layer = GRKANLinear(16, 5, num_groups=4, variant=variant, init="gelu", shared_numerator=False,
                              dtype=torch.float64, device=tdev)
    torch_layer.load_state_dict({k: torch.tensor(v) for k, v in layer.state_dict().items()})
    xn = np.random.default_rng(0).normal(size=(7, 16))
    x = wp.array(xn, dtype=wp.float64, requires_grad=True, device=device)
    tape = wp.Tape()
    with tape:
        y = layer(x)
    y.grad = wp.array(np.ones((7, 5)), dtype=wp.float64, device=device)
    tape.backward()
    xt = torch.tensor(xn, requires_grad=True, device=tdev)
    torch_layer(xt).sum().backward()
    np.testing.assert_allclose(y.numpy(), torch_layer(xt).detach().cpu().numpy(), rtol=1e-12, atol=1e-12)
    pairs = [
        (x.grad, xt.grad),
        (layer.rational.weight_numerator.grad, torch_layer.rational.weight_numerator.grad),
        (layer.rational.weight_denominator.grad, torch_layer.rational.weight_denominator.grad),
        (layer.weight.grad, torch_layer.linear.weight.grad),
        (layer.bias.grad, torch_layer.linear.bias.grad),
    ]
    for got, ref in pairs:
        np.testing.assert_allclose(got.numpy(), ref.cpu().numpy(), rtol=1e-10, atol=1e-12)
    # Warp's convention: gradients accumulate (a second backward of the rational alone doubles them)
    rational = layer.rational
    h_tape = wp.Tape()
    with h_tape:
        h = rational(x)
    h.grad = wp.array(np.ones((7, 16)), dtype=wp.float64, device=device)
    h_tape.zero()
    h.grad = wp.array(np.ones((7, 16)), dtype=wp.float64, device=device)
    h_tape.backward()
    once = rational.weight_denominator.grad.numpy().copy()
    h_tape.backward()
    np.testing.assert_allclose(rational.weight_denominator.grad.numpy(), 2 * once, rtol=1e-12)


def test_misaligned_arrays_take_narrower_vectors(device):
    """A view that starts 4 bytes into its buffer cannot take 16-byte vector accesses: the launcher narrows
    the vector width (here to one channel) and the result does not change."""
    dev = _torch_device(device)
    a, b = (t.float().to(dev) for t in _coefficients(4, True, "A"))
    x = torch.randn(3 * 64 + 1, device=dev)[1:].reshape(3, 64)
    dy = torch.randn(3 * 64 + 1, device=dev)[1:].reshape(3, 64)
    assert x.data_ptr() % 16
    y = torch.empty(3 * 64 + 1, device=dev)[1:].reshape(3, 64)
    dx = torch.empty(3 * 64 + 1, device=dev)[1:].reshape(3, 64)
    w = wp.from_torch
    kr.launch_forward(w(x), w(a), w(b), w(y), 4, "A")
    kr.launch_backward(w(dy), w(x), w(a), w(b), 4, "A", dx=w(dx), accumulate_dx=False)
    y_ref, dx_ref, _, _ = _reference_grads(x, a, b, 4, "A", dy)
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dx.double(), dx_ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="aligned"):
        kr.launch_forward(w(x), w(a), w(b), w(y), 4, "A", vec=4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA-graph capture needs a GPU")
def test_cuda_graph_capture():
    layer = GroupRational(64, num_groups=4).cuda()
    x = torch.randn(33, 64, device="cuda", requires_grad=True)
    dy = torch.randn(33, 64, device="cuda")

    def step():
        return torch.autograd.grad(layer(x), [x, *layer.parameters()], dy)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eager = step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for got, ref in zip(captured, eager):
        torch.testing.assert_close(got, ref, rtol=0, atol=0)


@pytest.mark.parametrize("need_x", [True, False])
def test_eager_bound_backward_matches_the_registered_op(device, need_x):
    """The eager node makes its backward's launch in its forward (on the caller's thread); its gradients equal,
    bitwise, those of the registered op's backward; a retained graph's second backward (the general path: the
    bound gradients went to autograd with the first), a non-contiguous dy and an x that needs no gradient
    give them too."""
    from warpkan.torch_bridge import rational_ops

    dev = _torch_device(device)
    torch.manual_seed(0)
    x = torch.randn(4, 37, 24, device=dev).requires_grad_(need_x)
    a = torch.randn(1, 6, device=dev, requires_grad=True)
    b = torch.randn(4, 4, device=dev, requires_grad=True)
    dy = torch.randn(4, 24, 37, device=dev).transpose(1, 2)  # non-contiguous: the general path's
    leaves = [t for t in (x, a, b) if t.requires_grad]
    results = []
    for op in (rational_ops._EagerGroupRational.run, rational_ops.group_rational_forward):
        y2 = op(x.reshape(-1, 24), a, b, 4, "A", True)
        if op is not rational_ops.group_rational_forward:
            assert y2.grad_fn.plan is not None  # the node (its ctx) holds its bound backward
        y = y2.view(4, 37, 24)
        for grad_out in (dy.contiguous(), dy.contiguous(), dy):  # bound, retained graph's second, non-contiguous
            grads = torch.autograd.grad(y, leaves, grad_out, retain_graph=True)
            results.append(grads)
    for grads in results[1:]:
        for got, want in zip(grads, results[0]):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_eager_step_on_nd_input_is_one_autograd_node(eager_step_ops):
    """The eager route takes x (..., C) whole and views its rows inside its node: a step on a 3-D x (a
    transformer's tokens) runs no view nodes around the rational (each 10-20 us of host time on the GPU
    machine); the gradients are those of the same rows given as a 2-D x."""
    torch.manual_seed(0)
    layer = GroupRational(12, num_groups=4)
    x = torch.randn(2, 5, 12, requires_grad=True)
    dy = torch.randn(2, 5, 12)
    ops = eager_step_ops(layer, x, dy)
    nodes = {name for name in ops if name.startswith("autograd::engine::evaluate_function")}
    assert nodes == {"autograd::engine::evaluate_function: _EagerGroupRationalBackward",
                     "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"}, nodes
    grads = [t.grad.clone() for t in (x, layer.weight_numerator, layer.weight_denominator)]
    x2 = x.detach().reshape(10, 12).requires_grad_()
    for p in layer.parameters():
        p.grad = None
    layer(x2).backward(dy.reshape(10, 12))
    for got, want in zip((x2.grad.view(2, 5, 12), layer.weight_numerator.grad, layer.weight_denominator.grad), grads):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_narrower_output_dtype_is_the_cast_result_bitwise(device, out_dtype):
    """``out_dtype``: the kernel stores y in it and its backward reads dy in it. For an fp32 x and a 16-bit
    out_dtype, the output is the fp32 result rounded once to out_dtype, and every gradient is that of the same
    dy widened to fp32: what the composition ``F(x).to(out_dtype)`` computes, bitwise. Awkward sizes (3-D x, a
    prime row count), on the eager node, the registered op and the general backward (a non-contiguous dy)."""
    from warpkan.torch_bridge import rational_ops

    dev = _torch_device(device)
    torch.manual_seed(0)
    x = torch.randn(3, 37, 24, device=dev)
    a = torch.randn(1, 6, device=dev, requires_grad=True)
    b = torch.randn(4, 4, device=dev, requires_grad=True)
    dy = torch.randn(3, 24, 37, device=dev).transpose(1, 2).to(out_dtype)  # non-contiguous
    results = []
    for route in ("composition", "node", "op"):
        for grad_out in (dy.contiguous(), dy):
            xg = x.clone().requires_grad_()
            if route == "composition":
                y = group_rational(xg, a, b, 4, "A").to(out_dtype)
            elif route == "node":
                y = group_rational(xg, a, b, 4, "A", out_dtype=out_dtype)
                assert y.grad_fn.plan is not None and "ToCopy" not in type(y.grad_fn).__name__
            else:
                y = rational_ops.group_rational_forward(xg.view(-1, 24), a, b, 4, "A", False).view(3, 37, 24)
                y = y.to(out_dtype)
            assert y.dtype == out_dtype
            results.append([y.detach(), *torch.autograd.grad(y, [xg, a, b], grad_out)])
    for got in results[1:]:
        for g, w in zip(got, results[0]):
            assert g.dtype == w.dtype and torch.equal(g, w)


@pytest.mark.parametrize("x_dtype,out_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.bfloat16)])
def test_other_output_dtypes_within_one_rounding(device, x_dtype, out_dtype):
    """A wider out_dtype keeps what the fp32 arithmetic computed (the composition would round it to x's dtype
    first), and fp16 -> bf16 rounds once: y is the float64 reference at the rounded x within one rounding of
    out_dtype (and the fp32 arithmetic's error); dx and the coefficient gradients as in the x-dtype tests."""
    dev = _torch_device(device)
    torch.manual_seed(1)
    groups = 4
    x = torch.randn(29, 24, device=dev).to(x_dtype)
    a, b = (t.to(dev) for t in _coefficients(groups, True, "A", dtype=torch.float32))
    dy = torch.randn(29, 24, device=dev).to(out_dtype)
    xg, ag, bg = (t.clone().requires_grad_() for t in (x, a, b))
    y = group_rational(xg, ag, bg, groups, "A", out_dtype=out_dtype)
    assert y.dtype == out_dtype
    y.backward(dy)
    ref_y, ref_dx, ref_da, ref_db = _reference_grads(x, a, b, groups, "A", dy)
    for got, ref, eps in ((y, ref_y, IO_EPS[out_dtype]), (xg.grad, ref_dx, IO_EPS[x_dtype])):
        tol = (eps + 2.0**-20) * ref.abs() + 1e-6 * ref.abs().max()
        assert ((got.cpu().double() - ref.cpu()).abs() <= tol.cpu()).all()
    for got, ref in ((ag.grad, ref_da), (bg.grad, ref_db)):
        torch.testing.assert_close(got.cpu().double(), ref.cpu(), rtol=1e-4, atol=1e-4 * ref.abs().max().item())


def test_output_dtype_refused_across_arithmetic_types():
    a, b = _coefficients(4, True, "A", dtype=torch.float32)
    with pytest.raises(TypeError, match="out_dtype"):
        group_rational(torch.randn(3, 32), a, b, 4, out_dtype=torch.float64)
    with pytest.raises(TypeError, match="out_dtype"):
        group_rational(torch.randn(3, 32, dtype=torch.float64), a, b, 4, out_dtype=torch.float32)
    with pytest.raises(TypeError, match="out_dtype"):
        GroupRational(32, 4)(torch.randn(3, 32), out_dtype=torch.int32)
    assert group_rational(torch.randn(3, 32), a, b, 4, out_dtype=torch.float32).dtype == torch.float32


def test_grkan_under_autocast_casts_nothing(device):
    """Under bf16 autocast a GR-KAN layer's rational gives the linear its bf16 input itself (an fp32 x, as a
    LayerNorm gives it): no cast node around the rational, and the step's output and gradients equal, bitwise,
    those of the composition that casts (the rational in fp32, then autocast's cast before the linear), the
    linear's unrounded float32 gradients to within the composition's bf16 rounding."""
    dev = _torch_device(device)
    torch.manual_seed(0)
    layer = GRKANLinear(16, 8, num_groups=4, device=dev)
    x = torch.randn(5, 3, 16, device=dev)
    dy = torch.randn(5, 3, 8, device=dev).bfloat16()

    def step(composed):
        layer.zero_grad(set_to_none=True)
        xg = x.clone().requires_grad_()
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            y = layer.linear(layer.rational(xg)) if composed else layer(xg)
        y.backward(dy)
        return [y.detach(), xg.grad] + [p.grad for p in layer.parameters()]

    _assert_bitwise(step(False), step(True), _unrounded(layer, torch.bfloat16))
    # no cast node at all: the layer is one node (grkan_ops), which casts the linear's weight and bias inside
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        y = layer(x.clone().requires_grad_())
    casts, stack, seen = [], [y.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == "ToCopyBackward0":
            casts.append({type(child).__name__ for child, _ in node.next_functions})
        stack.extend(child for child, _ in node.next_functions)
    assert casts == [] and type(y.grad_fn).__name__ == "_GRKANChainBackward", casts


def test_grkan_with_another_activation_in_place_of_its_rational(device):
    """A module put in place of the rational (another implementation, as the model bench swaps in FlashKAT's)
    is called as an activation, x alone, under autocast too."""
    dev = _torch_device(device)
    layer = GRKANLinear(16, 8, num_groups=4, device=dev)
    layer.rational = torch.nn.GELU()
    x = torch.randn(5, 16, device=dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        y = layer(x)
        want = layer.linear(torch.nn.functional.gelu(x))
    assert torch.equal(y, want)


# ------------------------------------------------------------------ KATMLP: the block as one eager node
def _kat_mlp_step(mlp, x, dy, composed, autocast=None, create_graph=False):
    """(y, x.grad, every parameter's grad) of one step of ``mlp`` (a KATMLP or a GRKANLinear) on a copy of x,
    through its node or through its modules' composition (the node turned off: the layers' own composed path)."""
    from warpkan.torch_bridge import rational

    mlp.zero_grad(set_to_none=True)
    xg = x.detach().clone().requires_grad_(x.requires_grad)
    with rational.composed_layers(composed), torch.autocast(x.device.type, dtype=autocast or torch.bfloat16,
                                                             enabled=autocast is not None):
        y = mlp(xg)
    assert (type(y.grad_fn).__name__ == "_GRKANChainBackward") != composed
    y.backward(dy, create_graph=create_graph)
    return [y.detach(), xg.grad] + [p.grad for p in mlp.parameters()]


def _assert_bitwise(got, want, unrounded=()):
    """got equals want bitwise, entry by entry, except the entries ``unrounded``: a float32 gradient that the
    node takes unrounded where the composition rounds it to bf16 and casts it back (grkan_ops), which must
    round to want's value to within one bf16 step of the sum's order."""
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g is None) == (w is None)
        if g is None:
            continue
        assert g.dtype == w.dtype and g.shape == w.shape
        if i in unrounded:
            ulp = torch.finfo(torch.bfloat16).eps * w.abs().clamp_min(torch.finfo(torch.bfloat16).tiny)
            assert ((g - w).abs() <= ulp).all(), ((g - w).abs() / ulp).max()
        else:
            assert torch.equal(g, w), (g - w).abs().max()


def _unrounded(mlp, autocast) -> tuple:
    """Positions in :func:`_kat_mlp_step`'s list of the gradients the node does not round under ``autocast``:
    the linear weights' and biases' under bf16, the biases' under fp16 (a float32 sum)."""
    if autocast is None:
        return ()
    kinds = ("linear.weight", "linear.bias") if autocast == torch.bfloat16 else ("linear.bias",)
    return tuple(2 + i for i, (name, _) in enumerate(mlp.named_parameters()) if name.endswith(kinds))


@pytest.mark.parametrize("autocast", [None, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(), (7,), (1,), (3, 5), (2, 3, 5)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("block", ["KATMLP", "GRKANLinear"])
def test_kat_mlp_node_is_the_composition_bitwise(device, autocast, shape, bias, block):
    """The eager node of a KATMLP block (or of a lone GRKANLinear) runs the composition's kernels and products on
    the same operands: its output and every gradient equal, bitwise and in dtype, those of its modules' composition,
    in fp32 and under autocast, for 1-D, 2-D and N-D x, one row, and odd widths (12 -> 20 -> 6 with 2 groups);
    under autocast the linear layers' float32 gradients the node does not round (``_unrounded``) round to the
    composition's."""
    dev = _torch_device(device)
    if autocast == torch.float16 and dev.type == "cpu":
        pytest.skip("CPU autocast computes linear layers in bfloat16")
    torch.manual_seed(0)
    mlp = KATMLP(12, 20, 6, num_groups=2, bias=bias, device=dev)
    if block == "GRKANLinear":
        mlp = mlp.fc2.to(dev)
        mlp.rational.weight_numerator.data.normal_(0, 0.5)  # off the swish init: every coefficient in play
        x = torch.randn(*shape, 20, device=dev, requires_grad=True)
        dy = torch.randn(*shape, 6, device=dev, dtype=autocast or torch.float32)
        _assert_bitwise(_kat_mlp_step(mlp, x, dy, False, autocast), _kat_mlp_step(mlp, x, dy, True, autocast),
                        _unrounded(mlp, autocast))
        return
    x = torch.randn(*shape, 12, device=dev, requires_grad=True)
    dy = torch.randn(*shape, 6, device=dev, dtype=autocast or torch.float32)
    with torch.autocast(dev.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        assert type(mlp(x).grad_fn).__name__ == "_GRKANChainBackward"
    _assert_bitwise(_kat_mlp_step(mlp, x, dy, False, autocast), _kat_mlp_step(mlp, x, dy, True, autocast),
                    _unrounded(mlp, autocast))


@pytest.mark.parametrize("bias", [True, False])
def test_kat_mlp_node_linear_gradients_under_bf16_are_unrounded(device, bias):
    """Under bf16 autocast the node's float32 linear weight and bias gradients are the products and sums of the
    bf16 operands the composition uses (each linear layer's input and output gradient, taken from the
    composition by hooks: bitwise the node's) accumulated in float32: within float32 accumulation error of the
    float64 product, and no farther from it than the composition's bf16-rounded gradients."""
    dev = _torch_device(device)
    torch.manual_seed(0)
    mlp = KATMLP(24, 40, 16, num_groups=4, bias=bias, device=dev)
    x = torch.randn(4, 37, 24, device=dev, requires_grad=True)
    dy = torch.randn(4, 37, 16, device=dev, dtype=torch.bfloat16)
    operands = {}
    hooks = []
    for name in ("fc1", "fc2"):
        linear = getattr(mlp, name).linear
        hooks.append(linear.register_forward_hook(
            lambda m, args, out, name=name: operands.__setitem__((name, "a"), args[0].detach())))
        hooks.append(linear.register_full_backward_hook(
            lambda m, gin, gout, name=name: operands.__setitem__((name, "g"), gout[0].detach())))
    want = _kat_mlp_step(mlp, x, dy, True, torch.bfloat16)
    for hook in hooks:
        hook.remove()
    got = _kat_mlp_step(mlp, x, dy, False, torch.bfloat16)
    names = [name for name, _ in mlp.named_parameters()]
    for layer in ("fc1", "fc2"):
        a = operands[(layer, "a")].reshape(-1, operands[(layer, "a")].shape[-1]).double()
        g = operands[(layer, "g")].reshape(-1, operands[(layer, "g")].shape[-1]).double()
        assert operands[(layer, "a")].dtype == operands[(layer, "g")].dtype == torch.bfloat16
        refs = {f"{layer}.linear.weight": g.t() @ a, f"{layer}.linear.bias": g.sum(0)}
        for pname, ref in refs.items():
            if pname not in names:
                continue
            i = 2 + names.index(pname)
            node, composed = got[i], want[i]
            assert node.dtype == composed.dtype == torch.float32
            scale = (g.abs().t() @ a.abs()) if pname.endswith("weight") else g.abs().sum(0)
            # float32 accumulation over the rows: a few units of 2^-24 of the absolute sum, per term
            assert ((node.double() - ref).abs() <= 1e-6 * a.shape[0] ** 0.5 * scale + 1e-30).all()
            assert (node.double() - ref).abs().max() <= (composed.double() - ref).abs().max()


def test_kat_mlp_node_float64_gradcheck(device):
    """The node's first and second derivatives (create_graph=True runs the composition again) against finite
    differences in float64, every input and parameter, variant B and per-group numerators."""
    dev = _torch_device(device)
    torch.manual_seed(0)
    mlp = KATMLP(4, 6, 2, num_groups=2, variant="B", shared_numerator=False, dtype=torch.float64, device=dev)
    x = torch.randn(3, 4, dtype=torch.float64, device=dev, requires_grad=True)
    params = list(mlp.parameters())

    def f(x, *values):
        return torch.func.functional_call(mlp, dict(zip([n for n, _ in mlp.named_parameters()], values)), (x,))

    with torch.no_grad():
        for p in params:  # off the identity init, where |b| has no derivative at b = 0
            p.copy_(0.4 * torch.randn_like(p))
    assert type(f(x, *params).grad_fn).__name__ == "_GRKANChainBackward"
    assert torch.autograd.gradcheck(f, (x, *params))
    assert torch.autograd.gradgradcheck(f, (x, *params))


@pytest.mark.parametrize("frozen", ["x", "rationals", "linears", "all but fc2"])
def test_kat_mlp_node_with_some_inputs_frozen(device, frozen):
    """Gradients of a subset of the inputs (frozen x, rationals or linear layers) are the composition's, bitwise,
    and the others stay None."""
    dev = _torch_device(device)
    torch.manual_seed(0)
    mlp = KATMLP(8, 16, num_groups=2, device=dev)
    for name, p in mlp.named_parameters():
        p.requires_grad_(not ((frozen == "rationals" and "rational" in name) or (frozen == "linears" and "linear" in name)
                              or (frozen == "all but fc2" and name.startswith("fc1"))))
    x = torch.randn(5, 8, device=dev, requires_grad=frozen not in ("x", "all but fc2"))
    dy = torch.randn(5, 8, device=dev)
    got, want = _kat_mlp_step(mlp, x, dy, False), _kat_mlp_step(mlp, x, dy, True)
    _assert_bitwise(got, want)
    assert (got[1] is None) == (frozen in ("x", "all but fc2"))


def test_kat_mlp_node_second_backward_of_a_retained_graph(device):
    """A retained graph's second backward (the bound launches are spent) adds the same gradients again."""
    dev = _torch_device(device)
    torch.manual_seed(0)
    mlp = KATMLP(8, 16, num_groups=2, device=dev)
    x = torch.randn(2, 3, 8, device=dev, requires_grad=True)
    dy = torch.randn(2, 3, 8, device=dev)
    y = mlp(x)
    y.backward(dy, retain_graph=True)
    once = [t.grad.clone() for t in (x, *mlp.parameters())]
    y.backward(dy)
    for t, g in zip((x, *mlp.parameters()), once):
        torch.testing.assert_close(t.grad, 2 * g, rtol=1e-6, atol=1e-6)


def test_grkan_layers_take_the_composition_where_the_node_would_change_something():
    """Hooks on a layer's modules (forward, backward, global), a sub-module put in another's place, no gradient
    wanted, and an x the composition refuses all run the composition: hooks fire, results are the composition's,
    errors are the layers' own. (A KATMLP whose fc1 has a hook still runs fc2 as a node of its own.)"""
    torch.manual_seed(0)
    mlp = KATMLP(8, 16, num_groups=2)
    x = torch.randn(4, 8, requires_grad=True)
    fused = "_GRKANChainBackward"
    assert type(mlp(x).grad_fn).__name__ == fused and type(mlp.fc1(x).grad_fn).__name__ == fused
    want = mlp.fc2.linear(mlp.fc2.rational(mlp.fc1.linear(mlp.fc1.rational(x))))
    seen = []
    for module in (mlp.fc1, mlp.fc2.rational, mlp.fc1.linear):
        handle = module.register_forward_hook(lambda m, i, o: seen.append(m))
        assert torch.equal(mlp(x), want)
        handle.remove()
    handle = mlp.fc2.linear.register_full_backward_hook(lambda m, gi, go: seen.append(m))
    mlp(x).sum().backward()
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: seen.append(m))
    y = mlp.fc1(x)
    handle.remove()
    assert seen[:4] == [mlp.fc1, mlp.fc2.rational, mlp.fc1.linear, mlp.fc2.linear]
    assert {mlp.fc1.rational, mlp.fc1.linear} <= set(seen[4:]) and type(y.grad_fn).__name__ != fused
    with torch.no_grad():
        assert mlp(x).grad_fn is None
    swapped = KATMLP(8, 16, num_groups=2)
    swapped.fc1.rational = torch.nn.GELU()
    y = swapped.fc1(x)
    assert type(y.grad_fn).__name__ != fused and torch.equal(y, swapped.fc1.linear(torch.nn.functional.gelu(x)))
    for name in ("weight", "bias"):  # a linear tensor set as a plain attribute (not a parameter)
        plain = KATMLP(8, 16, num_groups=2).fc1
        value = getattr(plain.linear, name).detach().clone()
        delattr(plain.linear, name)
        setattr(plain.linear, name, value)
        y = plain(x)
        assert type(y.grad_fn).__name__ != fused and torch.equal(y, plain.linear(plain.rational(x)))
    with pytest.raises(TypeError, match=r"x must have the layer's dtype torch\.float32, got torch\.float64"):
        mlp(x.double())
    with pytest.raises(ValueError, match="last dimension 8"):
        mlp(torch.randn(4, 9, requires_grad=True))
    misfit = KATMLP(8, 16, num_groups=2)
    misfit.fc2 = GRKANLinear(12, 8, num_groups=2)  # can't follow fc1's 16 outputs: the composition's error
    with pytest.raises(ValueError, match="last dimension 12"):
        misfit(x)


def test_kat_mlp_eager_step_is_one_node(eager_step_ops):
    """One eager step of the block is one autograd node and the parameters' AccumulateGrad: no linear, view or
    cast node around it, under autocast too (where the composition casts each weight and bias in a node)."""
    torch.manual_seed(0)
    mlp = KATMLP(8, 16, num_groups=2)
    x = torch.randn(2, 3, 8, requires_grad=True)
    dy = torch.randn(2, 3, 8)
    for layer, dy in ((mlp, dy), (mlp.fc1, torch.randn(2, 3, 16))):
        nodes = {name for name in eager_step_ops(layer, x, dy) if name.startswith("autograd::engine::evaluate_function")}
        assert nodes == {"autograd::engine::evaluate_function: _GRKANChainBackward",
                         "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"}, nodes
