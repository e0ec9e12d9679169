"""The transpose of contiguous memory (warpkan/kernels/_transpose.py) and the bridge's copies between public and
kernel layouts through it (warpkan/torch_bridge/_common.py: transpose_plan, copy_into, contiguous,
with_strides, and eager_function's gradients in the parameters' strides)."""

import numpy as np
import pytest
import torch
import warp as wp

from warpkan.kernels import _transpose as kt
from warpkan.torch_bridge import KANLinear, PolyKANLinear, UKANLinear
from warpkan.torch_bridge import _common, edge_ops

# (rows, cols, batch): one element, a row, a column, primes, a tile, multiples and non-multiples of it, a
# batch of awkward ones, and two large-ish ones (a long [32, M] table and its gradient's way back)
SHAPES = [(1, 1, 1), (1, 67, 1), (67, 1, 1), (37, 101, 1), (32, 32, 1), (64, 96, 1), (33, 65, 1), (31, 33, 1),
          (3, 37, 101), (7, 32, 9), (32, 40003, 1), (3001, 70, 1)]

# Warp dtype -> numpy dtype of the same size, and the unsigned integer type of its bits
NUMPY = {wp.float16: (np.float16, np.uint16), wp.float32: (np.float32, np.uint32), wp.float64: (np.float64, np.uint64)}


def _random_bits(count: int, bits_type, seed: int) -> np.ndarray:
    """Random bit patterns (NaNs with payloads, infinities, signed zeros and subnormals among them)."""
    rng = np.random.default_rng(seed)
    size = np.dtype(bits_type).itemsize
    return rng.integers(0, 256, size=count * size, dtype=np.uint8).view(bits_type)


@pytest.mark.parametrize("dtype", list(NUMPY), ids=lambda d: wp.types.type_repr(d))
@pytest.mark.parametrize("rows, cols, batch", SHAPES)
def test_kernel_is_a_bitwise_transpose(device, dtype, rows, cols, batch):
    float_type, bits_type = NUMPY[dtype]
    bits = _random_bits(batch * rows * cols, bits_type, seed=rows * 1000 + cols)
    src = wp.array(bits.view(float_type).reshape(batch * rows, cols), dtype=dtype, device=device)
    dst = wp.empty((batch * cols, rows), dtype=dtype, device=device)
    kt.launch_transpose(src, dst, rows, cols, batch)
    want = bits.reshape(batch, rows, cols).transpose(0, 2, 1).ravel()
    np.testing.assert_array_equal(dst.numpy().view(bits_type).ravel(), want)


def test_kernel_record_runs_nothing_until_replayed(device):
    src = wp.array(np.arange(37 * 45, dtype=np.float32), device=device)
    dst = wp.zeros(37 * 45, dtype=wp.float32, device=device)
    cmds = kt.launch_transpose(src, dst, 37, 45, record=True)
    assert isinstance(cmds, list) and len(cmds) == 1 and isinstance(cmds[0], wp.Launch)
    wp.synchronize_device(device)
    assert not dst.numpy().any(), "a recorded launch must not run"
    cmds[0].launch()
    np.testing.assert_array_equal(dst.numpy(), np.arange(37 * 45, dtype=np.float32).reshape(37, 45).T.ravel())


def test_kernel_empty_launches_nothing(device):
    empty = wp.empty(0, dtype=wp.float32, device=device)
    assert kt.launch_transpose(empty, empty, 0, 5) is None
    assert kt.launch_transpose(empty, empty, 5, 0, record=True) == []


def test_kernel_bad_arguments_name_the_argument():
    a = wp.zeros(12, dtype=wp.float32, device="cpu")
    with pytest.raises(TypeError, match="dst must have the dtype of src"):
        kt.launch_transpose(a, wp.zeros(12, dtype=wp.float64, device="cpu"), 3, 4)
    with pytest.raises(ValueError, match=r"dst must hold batch \* rows \* cols = 12 elements, got 10"):
        kt.launch_transpose(a, wp.zeros(10, dtype=wp.float32, device="cpu"), 3, 4)
    with pytest.raises(ValueError, match=r"src must hold batch \* rows \* cols = 24 elements"):
        kt.launch_transpose(a, a, 3, 4, batch=2)
    with pytest.raises(ValueError, match="rows must be a non-negative int, got -3"):
        kt.launch_transpose(a, a, -3, -4)
    with pytest.raises(TypeError, match="cols must be an int, got float 4.0"):
        kt.launch_transpose(a, a, 3, 4.0)
    with pytest.raises(ValueError, match="rows=65536, cols=65536 make the transposed arrays of shape"):
        kt.launch_transpose(a, a, 2**16, 2**16)
    strided = wp.zeros((4, 6), dtype=wp.float32, device="cpu")[:, 1:4]
    with pytest.raises(ValueError, match="src must be contiguous"):
        kt.launch_transpose(strided, a, 3, 4)
    with pytest.raises(TypeError, match=r"src must hold elements of \[2, 4, 8\] bytes, got uint8"):
        kt.launch_transpose(wp.zeros(12, dtype=wp.uint8, device="cpu"), wp.zeros(12, dtype=wp.uint8, device="cpu"),
                            3, 4)


def test_launch_dim_is_a_block_a_tile_on_cuda_and_a_thread_a_tile_on_the_cpu():
    assert kt.transpose_launch_dim(33, 65, 2) == (2 * 2 * 3, kt.THREADS)
    assert kt.transpose_launch_dim(33, 65, 2, is_cuda=False) == (2 * 2 * 3, 1)
    # a thin array of 2^31 - 1 elements: every index within Warp's 32-bit thread index
    tiles, threads = kt.transpose_launch_dim(2, 2**30 - 1)
    assert tiles < 2**31 and threads < 2**31 and tiles * threads >= 2**31


# ----------------------------------------------------------------------------------------- transpose_plan

def _plan(t):
    return _common.transpose_plan(t.shape, t.stride())


def test_transpose_plan():
    assert _plan(torch.empty(3, 4)) is None  # contiguous: nothing to transpose
    assert _plan(torch.empty(3, 4).t()) == (1, 3, 4)
    assert _plan(torch.empty(5, 4, 7).permute(1, 2, 0)) == (1, 5, 28)  # a B-spline table [out, in, G + k]
    assert _plan(torch.empty(4, 5, 7).permute(0, 2, 1)) == (4, 5, 7)  # a polynomial table [in, out, D + 1]
    assert _plan(torch.empty(2, 3, 4).permute(2, 0, 1)) == (1, 6, 4)  # memory [6, 4], read transposed
    assert _plan(torch.empty(5, 1, 7).permute(1, 2, 0)) == (1, 5, 7)  # an extent of 1 has no stride
    assert _plan(torch.empty(1, 4, 7).permute(1, 2, 0)) is None  # contiguous but for an extent of 1
    assert _plan(torch.empty(2, 3, 4).permute(1, 0, 2)) is None  # the innermost axis stays innermost
    assert _plan(torch.empty(4, 10)[:, :5].t()) is None  # rows with gaps
    assert _plan(torch.empty(4, 1).expand(4, 6).t()) is None  # a broadcast


# ------------------------------------------------------------------------------------ the bridge's copies

@pytest.fixture
def warp_copies(monkeypatch, device):
    """The bridge's transposing copies through the Warp kernel on ``device`` (CUDA's default; the CPU's
    default is torch's copy), whatever their size, logged: the (rows, cols, batch) of every copy the kernel
    makes. The stencil strategy copies on every call here, as on a call beyond the bounds in which it reads
    small parameters in place (``edge_ops.stencil_param``)."""
    monkeypatch.setattr(edge_ops, "IN_PLACE_MAX_ROWS", 0)
    log = []

    class Logged(_common.RecordedLaunches):
        def __call__(self, launcher, tensors, *config):
            log.append(config)
            super().__call__(launcher, tensors, *config)

    monkeypatch.setattr(_common, "WARP_TRANSPOSE_DEVICES", {"cuda", torch.device(_tdev(device)).type})
    monkeypatch.setattr(_common, "WARP_TRANSPOSE_MIN_ELEMENTS", 0)
    monkeypatch.setattr(_common, "_transpose_launches", Logged())
    return log


def _tdev(device: str) -> str:
    return "cuda" if device == "cuda" else "cpu"


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_contiguous_and_copy_back_are_torch_bitwise(device, warp_copies, dtype):
    tdev = _tdev(device)
    views = [
        (torch.empty(37, 101, dtype=dtype, device=tdev).t(), (37, 101, 1)),
        (torch.empty(33, 5, 43, dtype=dtype, device=tdev).permute(1, 2, 0), (33, 215, 1)),
        (torch.empty(6, 33, 9, dtype=dtype, device=tdev).permute(0, 2, 1), (33, 9, 6)),
    ]
    for view, plan in views:
        _bits(view.as_strided((view.numel(),), (1,))).copy_(
            torch.randint(-2**15, 2**15, (view.numel(),), dtype=torch.int64, device=tdev))
        warp_copies.clear()
        copy = _common.contiguous(view)
        assert copy.is_contiguous() and warp_copies == [plan]
        assert torch.equal(_bits(copy), _bits(view.contiguous()))
        # the way back: a contiguous gradient into the view's strides
        back = _common.with_strides(copy, view.stride())
        assert back.stride() == view.stride() and warp_copies == [plan, (plan[1], plan[0], plan[2])]
        assert torch.equal(_bits(back), _bits(view))


def test_other_copies_stay_torch(device, warp_copies):
    tdev = _tdev(device)
    sliced = torch.randn(4, 10, device=tdev)[:, :5].t()
    assert torch.equal(_common.contiguous(sliced), sliced.contiguous())
    empty = torch.empty(0, 3, device=tdev).t()
    assert _common.contiguous(empty).shape == (3, 0)
    plain = torch.randn(3, 4, device=tdev)
    assert _common.contiguous(plain) is plain
    assert _common.with_strides(plain, plain.stride()) is plain
    # a copy autograd has to see: torch's, with its history
    weight = torch.randn(3, 4, device=tdev, requires_grad=True)
    copy = _common.contiguous(weight.t())
    assert copy.grad_fn is not None
    assert warp_copies == []


def test_small_copies_stay_torch(device, warp_copies, monkeypatch):
    """Below WARP_TRANSPOSE_MIN_ELEMENTS the copies are torch's (a launch's time either way on the GPU, and
    less host time), the layers' gradients left to AccumulateGrad; from it on, the kernel's."""
    tdev = _tdev(device)
    monkeypatch.setattr(_common, "WARP_TRANSPOSE_MIN_ELEMENTS", 33 * 215)
    table = torch.randn(33, 5, 43, device=tdev).permute(1, 2, 0)
    small = torch.randn(33, 5, 42, device=tdev).permute(1, 2, 0)
    assert _common.kernel_copies(table) and not _common.kernel_copies(small)
    assert torch.equal(_common.contiguous(small), small.contiguous()) and warp_copies == []
    assert torch.equal(_common.contiguous(table), table.contiguous()) and warp_copies == [(33, 215, 1)]


# ------------------------------------------------------------------------------------------- the layers

def _kan(contiguous, tdev):
    return KANLinear(5, 33, grid_size=40, strategy="stencil", contiguous_parameters=contiguous, dtype=torch.float64,
                     device=tdev)


def _poly(contiguous, tdev):
    return PolyKANLinear(5, 33, 8, bias=True, contiguous_parameters=contiguous, dtype=torch.float64, device=tdev)


def _ukan(contiguous, tdev):
    return UKANLinear(5, 33, grid_delta=0.25, pe_dim=4, embed_dim=3, hidden_dim=6, contiguous_parameters=contiguous,
                      dtype=torch.float64, device=tdev)


# per case: (factory, x[0, 0], a transposing copy its forward makes of a public-layout parameter, in (rows,
# cols, batch), and its gradient's copy back). UKANLinear's dense-range route takes x within a few hundred
# coefficients of a feature's table (UKANLinear.dense_max_coefficients), its sparse route beyond.
LAYERS = {
    "KANLinear-stencil": (_kan, 0.5, (33, 5 * 43, 1), (5 * 43, 33, 1)),
    "PolyKANLinear": (_poly, 0.5, (33, 9, 5), (9, 33, 5)),
    "UKANLinear-range": (_ukan, 30.0, (33, 5, 1), (5, 33, 1)),
    "UKANLinear-sparse": (_ukan, 300.0, (33, 5, 1), (5, 33, 1)),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_layers_copy_public_parameters_by_the_kernel(device, warp_copies, name):
    """A training step of a layer with contiguous (public-layout) parameters copies them into the kernels'
    layout and their gradients back by the transpose kernel: the same outputs and gradients, bitwise, as the
    layer stored in the kernels' layout (which copies nothing), and gradients in the parameters' strides."""
    make, x00, forward_copy, gradient_copy = LAYERS[name]
    tdev = _tdev(device)
    torch.manual_seed(4)
    plain = make(True, tdev)
    torch.manual_seed(4)
    views = make(False, tdev)
    x = torch.rand(37, 5, dtype=torch.float64, device=tdev) * 1.6 - 0.8
    x[0, 0] = x00
    y_views = views(x)
    y_views.square().sum().backward()
    assert warp_copies == []
    y_plain = plain(x)
    y_plain.square().sum().backward()
    assert forward_copy in warp_copies and gradient_copy in warp_copies, warp_copies
    assert torch.equal(y_plain, y_views)
    for (n, a), b in zip(plain.named_parameters(), views.parameters()):
        assert torch.equal(a.grad, b.grad), n
        assert a.grad.stride() == a.stride() and b.grad.stride() == b.stride(), n


def test_registered_op_copies_by_the_kernel(device, warp_copies, monkeypatch):
    """The registered op (what torch.compile runs) copies a public-layout table into the kernels' layout in its
    forward and backward, and its gradient back into the table's strides, by the transpose kernel."""
    tdev = _tdev(device)
    torch.manual_seed(4)
    eager = _kan(True, tdev)
    torch.manual_seed(4)
    registered = _kan(True, tdev)
    x = torch.rand(37, 5, dtype=torch.float64, device=tdev) * 1.6 - 0.8
    y_eager = eager(x)
    y_eager.square().sum().backward()
    monkeypatch.setattr(_common, "use_registered_op", lambda x: True)
    warp_copies.clear()
    y = registered(x)
    y.square().sum().backward()
    assert warp_copies.count((33, 5 * 43, 1)) == 2 and warp_copies.count((5 * 43, 33, 1)) == 1, warp_copies
    assert torch.equal(y, y_eager)
    for (n, a), b in zip(registered.named_parameters(), eager.parameters()):
        assert torch.equal(a.grad, b.grad), n
        assert a.grad.stride() == a.stride(), n


def test_opcheck_on_public_layout_views(device, warp_copies):
    """The registered ops on public-layout views of the parameters, their copies made by the kernel: the fake
    implementations give the strides the real ones return (a gradient in the parameter's strides)."""
    from warpkan.torch_bridge.bspline_ops import bspline_spec
    from warpkan.torch_bridge.edge_ops import edge_backward, edge_forward

    tdev = _tdev(device)
    layer = _kan(True, tdev)
    x = torch.rand(37, 5, dtype=torch.float64, device=tdev) * 1.6 - 0.8
    public = [t.detach().clone() for t in (layer.base_weight, layer.spline_scaler, layer.spline_weight)]
    views = (public[0].t(), public[1].t(), public[2].permute(1, 2, 0))
    route = (bspline_spec(x, layer.grid, 3, True, True).static_key(), "stencil", "auto", False)
    torch.library.opcheck(edge_forward, (x, [layer.grid], *views, None, None, *route))
    dy = torch.randn(37, 33, dtype=torch.float64, device=tdev)
    torch.library.opcheck(edge_backward, (dy, x, [layer.grid], *views, None, *route, True, True, False))
    assert (33, 5 * 43, 1) in warp_copies and (5 * 43, 33, 1) in warp_copies


def test_cuda_kernels_compile_and_keep_their_loads_in_flight(tmp_path):
    """The CUDA path compiles (Warp's NVRTC, for sm_90, no GPU needed) and, in each kernel, a thread's eight
    global loads are issued together before their values go to shared memory (a load consumed right away
    would hold its warp until it returns), then one barrier, then eight stores."""
    kt.transpose_modules()
    module = kt.transpose_kernel(4).module
    (ptx,) = wp.compile_aot_module(module, device=None, arch=90, module_dir=str(tmp_path), use_ptx=True)
    text = ptx.read_text()
    for size in kt.WORDS:
        body = text[text.index(f".entry transpose_{size * 8}_"):]
        body = body[:body.index("\n}")]
        ops = [line.split()[0] for line in body.splitlines()
               if line.split() and line.split()[0].startswith(("ld.global", "st.global", "ld.shared", "st.shared",
                                                                "bar.sync"))]
        first = ops.index(f"ld.global.nc.u{size * 8}")
        assert ops[first:first + 8] == [f"ld.global.nc.u{size * 8}"] * 8, ops
        assert ops[first + 8:first + 16] == [f"st.shared.u{size * 8}"] * 8, ops
        assert ops.count("bar.sync") == 1 and ops.count(f"st.global.u{size * 8}") == 8, ops


@pytest.mark.parametrize("rows, cols, batch", SHAPES)
def test_float32_to_bfloat16_kernel_rounds_as_torch(device, rows, cols, batch):
    # every float32 bit pattern (NaNs, infinities, subnormals, halfway cases among them): torch's conversion
    # bit for bit, and a NaN for a NaN
    bits = _random_bits(batch * rows * cols, np.uint32, seed=rows * 1000 + cols + 7)
    halfway = np.arange(bits.size, dtype=np.uint32) % 3 == 0
    bits[halfway] = (bits[halfway] & np.uint32(0xFFFF0000)) | np.uint32(0x8000)  # ties: to even
    src = wp.array(bits.view(np.float32).reshape(batch * rows, cols), dtype=wp.float32, device=device)
    dst = wp.empty((batch * cols, rows), dtype=wp.bfloat16, device=device)
    kt.launch_transpose(src, dst, rows, cols, batch)
    want = torch.from_numpy(bits.view(np.float32).reshape(batch, rows, cols).transpose(0, 2, 1).copy())
    got = wp.to_torch(dst).reshape(want.shape).cpu()
    want = want.to(torch.bfloat16)
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))
    assert torch.all(got[nan].view(torch.int16) == 0x7FC0)


@pytest.mark.parametrize("by_warp", [True, False])
def test_transposing_copy_converts_to_bfloat16(device, monkeypatch, warp_copies, by_warp):
    # contiguous(t, bfloat16) of a float32 transpose of contiguous memory: one converting kernel launch where
    # the Warp transpose takes the copy, torch's copy elsewhere; the same bits either way
    tdev = _tdev(device)
    if not by_warp:
        monkeypatch.setattr(_common, "WARP_TRANSPOSE_DEVICES", set())
    public = torch.randn(37, 70, 9, device=tdev)  # [in, out, D + 1]
    view = public.permute(0, 2, 1)  # the kernels' [in, D + 1, out]
    out = _common.contiguous(view, torch.bfloat16)
    assert out.dtype == torch.bfloat16 and out.is_contiguous()
    assert torch.equal(out, view.contiguous().to(torch.bfloat16))
    assert warp_copies == ([(70, 9, 37)] if by_warp else [])
    assert _common.contiguous(view.contiguous(), torch.bfloat16).dtype == torch.bfloat16
    same = view.contiguous()
    assert _common.contiguous(same) is same and _common.contiguous(same, torch.float32) is same
