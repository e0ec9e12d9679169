"""Fused GEGLU FFN: the Warp kernels and the torch ops against the float64 reference."""

import subprocess
import sys

import pytest
import torch

from warpkan.reference.geglu import gate, geglu_ffn_reference, torch_baseline
from warpkan.torch_bridge import GEGLUFFN, geglu_ffn, geglu_ffn_forward

ACTIVATIONS = ("gelu", "gelu_tanh", "gelu_sigmoid")
HIDDEN, INTER = 48, 80  # not powers of two; the first projection has a partial last block in every bucket

# Largest error, relative to max |reference|, over the forward and all five gradients. Each is twice the
# worst error that the same maths in plain torch makes in that dtype against float64 (measured on these
# shapes, seeds 0-2, both paths): the fused layer must be as accurate as the unfused one.
TOLERANCE = {
    (torch.float32, "gelu"): 1.5e-6,
    (torch.float32, "gelu_tanh"): 1.5e-6,
    (torch.float32, "gelu_sigmoid"): 1.5e-6,
    (torch.float16, "gelu"): 2.6e-3,
    (torch.float16, "gelu_tanh"): 3.0e-3,
    (torch.float16, "gelu_sigmoid"): 2.2e-3,
    (torch.bfloat16, "gelu"): 2.4e-2,
    (torch.bfloat16, "gelu_tanh"): 1.4e-2,
    (torch.bfloat16, "gelu_sigmoid"): 1.8e-2,
}
SMALL, LARGE = 16, 0  # small_batch_rows values that force the weight-streaming or the GEMM path


def _tensors(rows, dtype, device, seed=0, hidden=HIDDEN, inter=INTER):
    """x, w_uv, b_uv, w_o, b_o, dout, at nn.Linear's initial scale."""
    g = torch.Generator().manual_seed(seed)

    def uniform(*shape, fan_in):
        return ((torch.rand(*shape, generator=g) * 2 - 1) / fan_in**0.5).to(dtype).to(device)

    x = torch.randn(rows, hidden, generator=g).to(dtype).to(device)
    w_uv = uniform(2 * inter, hidden, fan_in=hidden)
    b_uv = uniform(2 * inter, fan_in=hidden)
    w_o = uniform(hidden, inter, fan_in=inter)
    b_o = uniform(hidden, fan_in=inter)
    dout = torch.randn(rows, hidden, generator=g).to(dtype).to(device)
    return x, w_uv, b_uv, w_o, b_o, dout


def _run(tensors, activation, small_batch_rows, bias=True):
    """(out, dx, d_w_uv, d_b_uv, d_w_o, d_b_o) of the op and of the float64 reference."""
    x, w_uv, b_uv, w_o, b_o, dout = tensors
    leaves = [t.clone().requires_grad_() for t in (x, w_uv, b_uv, w_o, b_o)]
    lx, lw_uv, lb_uv, lw_o, lb_o = leaves
    out = geglu_ffn(lx, lw_uv, lw_o, lb_uv if bias else None, lb_o if bias else None, activation, small_batch_rows)
    used = leaves if bias else [lx, lw_uv, lw_o]
    grads = torch.autograd.grad(out, used, dout)
    ref_leaves = [t.detach().double().requires_grad_() for t in (x, w_uv, b_uv, w_o, b_o)]
    rx, rw_uv, rb_uv, rw_o, rb_o = ref_leaves
    ref = geglu_ffn_reference(rx, rw_uv, rb_uv if bias else None, rw_o, rb_o if bias else None, activation)
    ref_used = ref_leaves if bias else [rx, rw_uv, rw_o]
    ref_grads = torch.autograd.grad(ref, ref_used, dout.double())
    return (out, *grads), (ref, *ref_grads)


def _rel_error(a, b):
    return ((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("path", ["small", "large"])
def test_forward_and_gradients_match_reference(device, dtype, activation, path):
    rows, small_batch_rows = (5, SMALL) if path == "small" else (37, LARGE)
    bias = activation != "gelu_tanh"
    ours, ref = _run(_tensors(rows, dtype, device), activation, small_batch_rows, bias)
    assert ours[0].dtype == dtype and ours[0].shape == (rows, HIDDEN)
    names = ["out", "dx", "d_w_uv", "d_b_uv", "d_w_o", "d_b_o"] if bias else ["out", "dx", "d_w_uv", "d_w_o"]
    tol = TOLERANCE[(dtype, activation)]
    for name, a, b in zip(names, ours, ref):
        assert a.dtype == dtype, name
        assert _rel_error(a, b) <= tol, f"{name}: {_rel_error(a, b):.3g} > {tol:.3g}"


@pytest.mark.parametrize("rows", [1, 4, 7, 16])
def test_every_small_row_bucket(device, rows):
    ours, ref = _run(_tensors(rows, torch.float32, device, seed=rows), "gelu", SMALL)
    for a, b in zip(ours, ref):
        assert _rel_error(a, b) <= TOLERANCE[(torch.float32, "gelu")]


def test_small_and_large_paths_agree(device):
    tensors = _tensors(9, torch.float32, device, seed=3)
    small, _ = _run(tensors, "gelu_sigmoid", SMALL)
    large, _ = _run(tensors, "gelu_sigmoid", LARGE)
    for a, b in zip(small, large):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("small_batch_rows", [SMALL, LARGE])
def test_gradcheck_float64(device, small_batch_rows):
    x, w_uv, b_uv, w_o, b_o, _ = _tensors(3, torch.float64, device, hidden=6, inter=5)
    inputs = [t.requires_grad_() for t in (x, w_uv, b_uv, w_o, b_o)]
    for activation in ACTIVATIONS:
        def fn(x, w_uv, b_uv, w_o, b_o):
            return geglu_ffn(x, w_uv, w_o, b_uv, b_o, activation, small_batch_rows)

        assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-8)


def test_float64_forward_is_exact(device):
    ours, ref = _run(_tensors(6, torch.float64, device), "gelu", SMALL)
    for a, b in zip(ours, ref):
        assert _rel_error(a, b) <= 1e-13


def test_gate_over_a_wide_range(device):
    """Gates and their derivatives from the element-wise kernels, far into both tails (no overflow NaN)."""
    u = torch.linspace(-40.0, 40.0, 161, dtype=torch.float64)
    n = u.numel()
    # x = [u | 1] with identity weights: uv = x, out[:n] = gate(u) * 1, and d sum(out) / du = gate'(u)
    x = torch.cat([u, torch.ones_like(u)]).reshape(1, -1).to(device).requires_grad_()
    w_uv = torch.eye(2 * n, dtype=torch.float64, device=device)
    w_o = torch.eye(2 * n, n, dtype=torch.float64, device=device)
    for activation in ACTIVATIONS:
        out = geglu_ffn(x, w_uv, w_o, activation=activation, small_batch_rows=LARGE)
        (dx,) = torch.autograd.grad(out.sum(), x)
        ref_u = u.clone().requires_grad_()
        ref = gate(ref_u, activation)
        (ref_du,) = torch.autograd.grad(ref.sum(), ref_u)
        torch.testing.assert_close(out.detach().cpu()[0, :n], ref.detach(), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(dx.cpu()[0, :n], ref_du, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(dx.cpu()[0, n:], ref.detach(), rtol=1e-12, atol=1e-14)
        assert torch.isfinite(dx).all()


def test_module_nd_input_and_from_separate(device):
    torch.manual_seed(0)
    hidden, inter = 12, 20
    w_u, w_v = torch.randn(inter, hidden, device=device), torch.randn(inter, hidden, device=device)
    w_o = torch.randn(hidden, inter, device=device)
    b_u, b_v, b_o = torch.randn(inter, device=device), torch.randn(inter, device=device), torch.randn(hidden, device=device)
    layer = GEGLUFFN.from_separate(w_u, w_v, w_o, b_u, b_v, b_o, activation="gelu_tanh")
    assert layer.w_uv.shape == (2 * inter, hidden) and torch.equal(layer.w_u, w_u) and torch.equal(layer.w_v, w_v)
    for lead in [(2, 3), (19,), ()]:
        x = torch.randn(*lead, hidden, device=device)
        expected = torch_baseline(x.double(), w_u.double(), w_v.double(), w_o.double(), "gelu_tanh",
                                  b_u.double(), b_v.double(), b_o.double())
        out = layer(x)
        assert out.shape == (*lead, hidden)
        torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-4)


def test_non_contiguous_inputs(device):
    x, w_uv, b_uv, w_o, b_o, _ = _tensors(6, torch.float32, device)
    x_nc = torch.stack([x, x], dim=2)[..., 0]  # strided view (stride 2), same values as x
    assert not x_nc.is_contiguous()
    w_uv_nc = w_uv.t().contiguous().t()  # column-major
    w_o_nc = w_o.t().contiguous().t()
    for small_batch_rows in (SMALL, LARGE):
        expected = geglu_ffn(x, w_uv, w_o, b_uv, b_o, "gelu", small_batch_rows)
        got = geglu_ffn(x_nc, w_uv_nc, w_o_nc, b_uv, b_o, "gelu", small_batch_rows)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("small_batch_rows", [SMALL, LARGE])
def test_nan_row_affects_only_that_row(device, small_batch_rows):
    x, w_uv, b_uv, w_o, b_o, dout = _tensors(5, torch.float32, device)
    clean = geglu_ffn(x, w_uv, w_o, b_uv, b_o, "gelu", small_batch_rows)
    x = x.clone()
    x[2, 7] = float("nan")
    x.requires_grad_()
    out = geglu_ffn(x, w_uv, w_o, b_uv, b_o, "gelu", small_batch_rows)
    (dx,) = torch.autograd.grad(out, x, dout)
    others = [0, 1, 3, 4]
    assert torch.isnan(out[2]).all()
    torch.testing.assert_close(out[others], clean[others], rtol=1e-6, atol=1e-6)
    assert torch.isfinite(dx[others]).all()


def test_empty_batch(device):
    layer = GEGLUFFN(8, 12, bias=True, device=device)
    x = torch.empty(0, 3, 8, device=device, requires_grad=True)
    out = layer(x)
    assert out.shape == (0, 3, 8)
    out.sum().backward()
    assert x.grad.shape == x.shape
    assert torch.equal(layer.w_uv.grad, torch.zeros_like(layer.w_uv))
    assert torch.equal(layer.b_o.grad, torch.zeros_like(layer.b_o))


def test_reproducible_bitwise(device):
    for small_batch_rows in (SMALL, LARGE):
        first, _ = _run(_tensors(11, torch.float16, device), "gelu", small_batch_rows)
        second, _ = _run(_tensors(11, torch.float16, device), "gelu", small_batch_rows)
        for a, b in zip(first, second):
            assert torch.equal(a, b)


def test_bad_inputs(device):
    x, w_uv, b_uv, w_o, b_o, _ = _tensors(4, torch.float32, device)
    with pytest.raises(ValueError, match="x"):
        geglu_ffn(x[:, :-1], w_uv, w_o)
    with pytest.raises(TypeError, match="x"):
        geglu_ffn(x.double(), w_uv, w_o)
    with pytest.raises(TypeError, match="x"):
        geglu_ffn(x.to(torch.int32), w_uv, w_o)
    with pytest.raises(TypeError, match="x"):
        geglu_ffn(x.numpy() if device == "cpu" else x.cpu().numpy(), w_uv, w_o)
    with pytest.raises(ValueError, match="w_uv"):
        geglu_ffn(x, w_uv[:-1], w_o)
    with pytest.raises(ValueError, match="w_o"):
        geglu_ffn(x, w_uv, w_o[0])
    with pytest.raises(ValueError, match="b_uv"):
        geglu_ffn(x, w_uv, w_o, b_uv[:-1])
    with pytest.raises(ValueError, match="b_o"):
        geglu_ffn(x, w_uv, w_o, b_uv, b_o[:-1])
    with pytest.raises(ValueError, match="activation"):
        geglu_ffn(x, w_uv, w_o, activation="relu")
    with pytest.raises(ValueError, match="small_batch_rows"):
        geglu_ffn(x, w_uv, w_o, small_batch_rows=-1)
    with pytest.raises(ValueError, match="device"):
        geglu_ffn(x.to("meta"), w_uv, w_o)
    with pytest.raises(ValueError, match="hidden"):
        GEGLUFFN(0, 4)
    with pytest.raises(TypeError, match="intermediate"):
        GEGLUFFN(4, 2.5)
    with pytest.raises(ValueError, match="activation"):
        GEGLUFFN(4, 4, activation="swish")
    with pytest.raises(ValueError, match="together"):
        GEGLUFFN.from_separate(w_uv[:INTER], w_uv[INTER:], w_o, b_u=b_uv[:INTER])
    with pytest.raises(ValueError, match="w_v"):
        GEGLUFFN.from_separate(w_uv[:INTER], w_uv[: INTER - 1], w_o)
    layer = GEGLUFFN(HIDDEN, INTER, device=device)
    with pytest.raises(TypeError, match="x"):
        layer(x.half())


@pytest.mark.parametrize("small_batch_rows", [SMALL, LARGE])
def test_opcheck(device, small_batch_rows):
    x, w_uv, b_uv, w_o, b_o, _ = _tensors(5, torch.float32, device, hidden=10, inter=7)
    x, w_uv, w_o, b_o = (t.requires_grad_() for t in (x, w_uv, w_o, b_o))
    torch.library.opcheck(geglu_ffn_forward, (x, w_uv, None, w_o, b_o, "gelu", small_batch_rows))
    torch.library.opcheck(geglu_ffn_forward, (x, w_uv, b_uv, w_o, None, "gelu_sigmoid", small_batch_rows))


def test_torch_compile_fullgraph(device):
    torch.manual_seed(0)
    layer = GEGLUFFN(16, 24, activation="gelu_tanh", bias=True, device=device)
    compiled = torch.compile(layer, fullgraph=True)
    for rows in (3, 40):  # both paths through the same compiled graph
        x = torch.randn(rows, 16, device=device, requires_grad=True)
        out = compiled(x)
        (dx,) = torch.autograd.grad(out.sum(), x)
        x2 = x.detach().clone().requires_grad_()
        expected = layer(x2)
        (dx2,) = torch.autograd.grad(expected.sum(), x2)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(dx, dx2)


def test_autocast(device):
    layer = GEGLUFFN(8, 12, device=device)
    x = torch.randn(3, 8, device=device)
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), layer(x), rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("small_batch_rows", [0, 8])
def test_eager_step_is_one_autograd_node(eager_step_ops, small_batch_rows):
    """Eagerly, the layer is one autograd.Function running the op's own implementations (no custom-op
    dispatch: tens to hundreds of us of host time a call on the GPU machine), x of 2 dimensions is not
    reshaped, and the backward gets no zero-filled gradient for the non-differentiable uv."""
    layer = GEGLUFFN(16, 24, small_batch_rows=small_batch_rows)
    x = torch.randn(5, 16, requires_grad=True)
    ops = eager_step_ops(layer, x, torch.ones(5, 16))
    nodes = {name for name in ops if name.startswith("autograd::engine::evaluate_function")}
    assert nodes == {"autograd::engine::evaluate_function: _EagerGEGLUBackward",
                     "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"}, nodes
    assert not ops & {"aten::zeros", "aten::zeros_like", "aten::zero_"}, sorted(ops)


def test_inference_builds_no_autograd_node():
    """Without a gradient wanted (no_grad, or frozen weights and x), the eager route calls the implementation
    alone: no autograd.Function, no node."""
    layer = GEGLUFFN(16, 24)
    x = torch.randn(5, 16)
    expected = layer(x.requires_grad_()).detach()
    for context, frozen in ((torch.no_grad, False), (torch.enable_grad, True)):
        layer.requires_grad_(not frozen)
        with context(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            y = layer(x.detach())
        assert y.grad_fn is None and "_EagerGEGLU" not in {e.key for e in prof.key_averages()}
        torch.testing.assert_close(y, expected, rtol=0, atol=0)


def test_kernels_do_not_import_torch():
    code = "import sys, warpkan.kernels.geglu; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cached_launches_follow_the_arguments(device):
    """Launches are recorded once per (pointer, shape, stride, dtype) signature and replayed: new data in
    the same buffers, new buffers and new shapes must all give fresh, correct results."""
    x, w_uv, b_uv, w_o, b_o, _ = _tensors(6, torch.float32, device, seed=7)
    for small_batch_rows in (SMALL, LARGE):
        for rows in (6, 6, 3):
            x_now = torch.randn(rows, HIDDEN, device=device)
            for _ in range(2):
                x_now.mul_(-1.5)  # same buffer, new values
                got = geglu_ffn(x_now, w_uv, w_o, b_uv, b_o, "gelu", small_batch_rows)
                expected = geglu_ffn_reference(x_now.double(), w_uv.double(), b_uv.double(), w_o.double(),
                                               b_o.double(), "gelu")
                assert _rel_error(got, expected) <= TOLERANCE[(torch.float32, "gelu")]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 5, 13, 40, 64])
@pytest.mark.parametrize("hidden, inter", [(64, 128), (72, 136)])
def test_tensor_core_streaming_path(device, dtype, rows, hidden, inter):
    """float16/bfloat16 with hidden and inter multiples of 8 take the tensor-core streaming kernels (every
    batch capacity here). 72/136 leaves a partial row group in both projections and a partial k chunk
    (zero-filled copies); several warps share each group, so the combine adds several slots. Forward and
    gradients against the float64 reference."""
    tensors = _tensors(rows, dtype, device, seed=rows, hidden=hidden, inter=inter)
    ours, ref = _run(tensors, "gelu", 64)
    tol = TOLERANCE[(dtype, "gelu")]
    for name, a, b in zip(("out", "dx", "d_w_uv", "d_b_uv", "d_w_o", "d_b_o"), ours, ref):
        assert _rel_error(a, b) <= tol, f"{name}: {_rel_error(a, b):.3g} > {tol:.3g}"


@pytest.mark.parametrize("rows", [3, 40])
def test_dependent_launches_match_plain_launches(device, rows):
    """The streaming path's last three launches run as programmatic dependents on compute capability 9.0+
    (their warps start before the launch they depend on has finished, and must wait before reading its
    outputs). Their results must be bitwise those of plain launches, call after call, with the outputs
    poisoned between calls: a read before the wait would show as NaN or a stale value. On other devices
    the dependent launch falls back to the plain one."""
    import warp as wp

    from warpkan.kernels import geglu as kg
    from warpkan.kernels._dependent_launch import DependentLaunch, dependent_launch_supported
    from warpkan.torch_bridge._common import warp_stream

    stream = warp_stream(torch.device(device))  # torch's stream: the poisoning fills run on it
    hidden, inter = 72, 136
    x, w_uv, b_uv, w_o, b_o, _ = _tensors(rows, torch.float16, device, seed=11, hidden=hidden, inter=inter)
    plans = kg.tc_plans(hidden, inter, rows, *kg.device_shape(wp.get_device(device)))
    partials = [torch.empty(plan.slots, rows, n, device=device) for plan, n in zip(plans, (2 * inter, hidden))]
    outputs = {}
    for dependent in (False, True):
        uv, h, out = (torch.empty(rows, n, device=device, dtype=torch.float16) for n in (2 * inter, inter, hidden))
        cmds = kg.launch_tc_forward(*(wp.from_torch(t) for t in (x, w_uv, b_uv, w_o, b_o, uv, h, out, *partials)),
                                    "gelu", record=True, dependent=dependent)
        assert [isinstance(c, DependentLaunch) for c in cmds] == [False] + [dependent] * 3
        if dependent and device == "cuda":
            assert all(c.enabled for c in cmds[1:]) == dependent_launch_supported(device)
        runs = []
        for _ in range(10 if dependent else 1):
            for t in (uv, h, out, *partials):
                t.fill_(float("nan"))
            for cmd in cmds:
                cmd.launch(stream)
            runs.append(tuple(t.clone() for t in (uv, h, out)))
        outputs[dependent] = runs
    expected = outputs[False][0]
    assert not any(t.isnan().any() for t in expected)
    for run in outputs[True]:
        assert all(torch.equal(a, b) for a, b in zip(run, expected))


@pytest.mark.parametrize("n_tiles", [1, 2, 4, 8])
@pytest.mark.parametrize("sm_count, arch", [(1, 0), (7, 80), (132, 90)])
def test_stream_plan_shares_every_item_once(n_tiles, sm_count, arch):
    """The streaming split: warps take equal contiguous runs of the (row group, k chunk) items, and the slot
    count covers the most warps that share a group (what the partial buffers are sized from)."""
    from warpkan.kernels import geglu as kg

    for rows, k in ((24576, 4096), (4096, 12288), (272, 72), (16, 8)):
        plan = kg.stream_plan(rows, k, n_tiles, sm_count, arch)
        total = plan.n_groups * plan.n_chunks
        runs = [(w * total // plan.n_warps, (w + 1) * total // plan.n_warps) for w in range(plan.n_warps)]
        assert runs[0][0] == 0 and runs[-1][1] == total
        assert all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
        assert max(e - b for b, e in runs) - min(e - b for b, e in runs) <= 1
        sharing = [sum(1 for b, e in runs if b < (gr + 1) * plan.n_chunks and e > gr * plan.n_chunks)
                   for gr in range(plan.n_groups)]
        assert plan.slots == max(sharing)
        assert plan.n_warps <= sm_count * kg.resident_warps_per_sm(n_tiles, arch)


# relative error of one rounding in each I/O dtype
_IO_EPS = {torch.float64: 2.0**-52, torch.float32: 2.0**-23, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def _within_arithmetic_error(got, ref64, ref_arith, eps):
    """got (I/O dtype) against the float64 value: up to 4x the largest error the reference formula itself
    makes in the kernels' arithmetic dtype (fp32 tails of the gates cancel: 1 + erf(u) for u < 0), plus one
    rounding to the I/O dtype."""
    got, ref_arith = got.double().cpu(), ref_arith.double()
    arithmetic = (ref_arith - ref64).abs().max() + 8 * 2.0**-52 * ref64.abs().max()
    return ((got - ref64).abs() <= 4 * arithmetic + 2 * eps * ref64.abs()).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_gate_kernels_every_vector_width(device, dtype):
    """The element-wise gate kernels at every vector width (16-byte vectors down to single elements: the width
    follows the intermediate size and the arrays' alignment) against the float64 formulas, forward and
    backward; non-contiguous arrays are refused."""
    import warp as wp

    from warpkan.kernels import geglu as kg

    itemsize = torch.empty(0, dtype=dtype).element_size()
    arith = torch.float64 if dtype == torch.float64 else torch.float32
    eps = _IO_EPS[dtype]
    w = wp.from_torch
    g = torch.Generator().manual_seed(1)
    for inter in (80, 84, 86, 85):
        for offset in (0, 1):  # a view one element into its buffer: narrower vectors
            rows = 3
            buffers = [torch.randn(rows * 2 * inter + offset, generator=g, dtype=torch.float64).to(dtype).to(device)
                       for _ in range(2)]
            uv = buffers[0][offset:].view(rows, 2 * inter)
            dh = buffers[1][offset:offset + rows * inter].view(rows, inter)
            h = torch.empty(rows * inter + offset, dtype=dtype, device=device)[offset:].view(rows, inter)
            duv = torch.empty(rows * 2 * inter + offset, dtype=dtype, device=device)[offset:].view(rows, 2 * inter)
            width = kg.gate_vector_width((w(uv), w(h)), inter)
            aligned = (uv.data_ptr() & -uv.data_ptr()) // itemsize
            assert width == max(1, min(16 // itemsize, inter & -inter, aligned)), (inter, offset, width)
            for activation in ACTIVATIONS:
                refs = {}
                for ref_dtype in (torch.float64, arith):
                    u = uv[:, :inter].cpu().to(ref_dtype).requires_grad_()
                    v, d = uv[:, inter:].cpu().to(ref_dtype), dh.cpu().to(ref_dtype)
                    ref_h = gate(u, activation) * v
                    (ref_du,) = torch.autograd.grad(ref_h, u, d)
                    refs[ref_dtype] = (ref_h.detach(), ref_du, gate(u.detach(), activation) * d)
                kg.launch_activation(w(uv), w(h), activation)
                assert _within_arithmetic_error(h, refs[torch.float64][0], refs[arith][0], eps)
                h.zero_()
                kg.launch_activation_backward(w(dh), w(uv), w(duv), w(h), activation)
                for got, ref64, ref_arith in zip((h, duv[:, :inter], duv[:, inter:]), refs[torch.float64], refs[arith]):
                    assert _within_arithmetic_error(got, ref64, ref_arith, eps), (inter, offset, activation)
    strided = torch.zeros(3, 2 * 160, dtype=dtype, device=device)[:, ::2]
    with pytest.raises(ValueError, match="contiguous"):
        kg.launch_activation(w(strided), w(torch.zeros(3, 80, dtype=dtype, device=device)), "gelu")
