"""Polynomial KAN (PolyKAN): Warp kernels against numpy/scipy and the float64 torch reference."""

import math

import numpy as np
import pytest
import torch
import warp as wp
from numpy.polynomial import chebyshev as npcheb
from numpy.polynomial import hermite as npherm
from numpy.polynomial import legendre as npleg

import warpkan
from warpkan.kernels import poly as kp
from warpkan.reference import poly as ref
from warpkan.torch_bridge import ChebyKANLinear, PolyKANLinear, edge_backward, edge_forward, poly_kan
from warpkan.torch_bridge.poly_ops import basis_spec

BASES = ["chebyshev", "legendre", "hermite", "gegenbauer", "jacobi", "fourier"]
# parameters away from the special cases (alpha = 1/2 is Legendre, alpha = beta = 0 is Legendre, ...)
PARAMS = {"gegenbauer": (0.75, 1.0), "jacobi": (0.5, -0.25)}
EPS = {torch.float32: float(np.finfo(np.float32).eps), torch.float64: float(np.finfo(np.float64).eps)}


def params(basis):
    return PARAMS.get(basis, (1.0, 1.0))


# ---------------------------------------------------------------------------------- numpy / scipy truth
def numpy_basis(t, basis, degree, alpha=1.0, beta=1.0):
    """(P_d(t), P_d'(t)) [len(t), degree + 1] from numpy.polynomial / scipy.special / cos and sin."""
    eye = np.eye(degree + 1)
    if basis in ("chebyshev", "legendre", "hermite"):
        vander = {"chebyshev": npcheb.chebvander, "legendre": npleg.legvander, "hermite": npherm.hermvander}[basis]
        der = {"chebyshev": npcheb.chebder, "legendre": npleg.legder, "hermite": npherm.hermder}[basis]
        val = {"chebyshev": npcheb.chebval, "legendre": npleg.legval, "hermite": npherm.hermval}[basis]
        grads = np.stack([val(t, der(eye[d])) if d else np.zeros_like(t) for d in range(degree + 1)], axis=-1)
        return vander(t, degree), grads
    if basis == "fourier":
        values, grads = [np.ones_like(t)], [np.zeros_like(t)]
        for d in range(1, degree + 1):
            k = (d + 1) // 2 * math.pi
            if d % 2:
                values.append(np.cos(k * t))
                grads.append(-k * np.sin(k * t))
            else:
                values.append(np.sin(k * t))
                grads.append(k * np.cos(k * t))
        return np.stack(values, -1), np.stack(grads, -1)
    special = pytest.importorskip("scipy.special")
    if basis == "gegenbauer":  # d/dt C_n^a = 2 a C_{n-1}^{a+1}
        values = [special.eval_gegenbauer(d, alpha, t) for d in range(degree + 1)]
        grads = [2 * alpha * special.eval_gegenbauer(d - 1, alpha + 1, t) if d else 0 * t for d in range(degree + 1)]
    else:  # d/dt P_n^(a,b) = (n + a + b + 1) / 2 P_{n-1}^(a+1,b+1)
        values = [special.eval_jacobi(d, alpha, beta, t) for d in range(degree + 1)]
        grads = [(d + alpha + beta + 1) / 2 * special.eval_jacobi(d - 1, alpha + 1, beta + 1, t) if d else 0 * t
                 for d in range(degree + 1)]
    return np.stack(values, -1), np.stack(grads, -1)


@pytest.mark.parametrize("basis", BASES)
def test_exact_recurrence_matches_numpy(basis):
    degree = 32 if basis != "hermite" else 20
    alpha, beta = params(basis)
    t = np.concatenate([np.linspace(-1, 1, 101), [-1.0, 1.0, 0.0]])
    values, grads = kp.evaluate_basis(t, basis, degree, alpha, beta)
    want_values, want_grads = numpy_basis(t, basis, degree, alpha, beta)
    scale_v = np.abs(want_values).max(axis=0) + 1
    scale_g = np.abs(want_grads).max(axis=0) + 1
    # float64 recurrences lose a few digits to cancellation at degree 32 (relative to the basis' size)
    assert np.all(np.abs(values - want_values) <= 1e-11 * scale_v)
    assert np.all(np.abs(grads - want_grads) <= 1e-10 * scale_g)


@pytest.mark.parametrize("basis", BASES)
def test_exact_layer_matches_numpy(device, basis):
    alpha, beta = params(basis)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(7, 5)) * 1.5
    coeffs = rng.normal(size=(5, 7, 3))
    bias = rng.normal(size=3)
    b, _ = numpy_basis(np.tanh(x).ravel(), basis, 6, alpha, beta)
    want = np.einsum("nid,ido->no", b.reshape(7, 5, 7), coeffs) + bias
    args = [torch.tensor(a, device=device) for a in (x, coeffs, bias)]
    got = poly_kan(*args, basis=basis, alpha=alpha, beta=beta).cpu().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------- LUT mode
def _lut_values_and_grads(basis, degree, lut_size, t, dtype, device, alpha=1.0, beta=1.0):
    """P_d^lut(t) and P_d'^lut(t) read through the layer: one input, out = degree + 1 identity coefficients."""
    x = torch.tensor(np.arctanh(np.clip(t, -1 + 1e-16, 1 - 1e-16)), dtype=dtype, device=device).reshape(-1, 1)
    x.requires_grad_(True)
    coeffs = torch.eye(degree + 1, dtype=dtype, device=device).reshape(1, degree + 1, degree + 1)
    y = poly_kan(x, coeffs, basis=basis, lut_size=lut_size, alpha=alpha, beta=beta)
    grads = []
    t_used = torch.tanh(x.detach())
    for d in range(degree + 1):
        (gx,) = torch.autograd.grad(y[:, d].sum(), x, retain_graph=True)
        grads.append(gx[:, 0] / (1 - t_used[:, 0] ** 2))  # the kernel's dP/dt times dt/dx
    return t_used[:, 0].cpu().double().numpy(), y.detach().cpu().double().numpy(), torch.stack(grads, -1).cpu().double().numpy()


@pytest.mark.parametrize("basis,degree,lut_size", [("chebyshev", 8, 257), ("chebyshev", 24, 4096), ("legendre", 8, 129),
                                                   ("fourier", 8, 257), ("jacobi", 6, 101)])
def test_lut_within_documented_bound_float64(basis, degree, lut_size):
    alpha, beta = params(basis)
    h = 2 / (lut_size - 1)
    # cell mid points (where linear interpolation errs most) near both ends and the middle, plus random points
    mids = -1 + h * (np.arange(lut_size - 1) + 0.5)
    t = np.concatenate([mids[:40], mids[-40:], mids[lut_size // 2 - 20: lut_size // 2 + 20],
                        np.random.default_rng(2).uniform(-0.999, 0.999, 200)])
    t_used, values, grads = _lut_values_and_grads(basis, degree, lut_size, t, torch.float64, "cpu", alpha, beta)
    want_values, want_grads = numpy_basis(t_used, basis, degree, alpha, beta)
    value_bound, grad_bound = kp.lut_error_bound(basis, degree, lut_size, alpha, beta, "float64")
    value_err = np.abs(values - want_values).max(axis=0)
    grad_err = np.abs(grads - want_grads).max(axis=0)
    assert np.all(value_err <= value_bound), (value_err, value_bound)
    # the derivative is divided by 1 - t^2 here, which costs a few eps relative near the ends
    assert np.all(grad_err <= grad_bound + 1e-9 * (np.abs(want_grads).max(axis=0) + 1)), (grad_err, grad_bound)
    # and the bound is not vacuous: the top degree comes within a factor of 2 of it
    assert value_err[-1] >= value_bound[-1] / 2


def test_lut_bound_closed_form_chebyshev():
    degree, lut_size = 8, 4096
    h = 2 / (lut_size - 1)
    d = np.arange(degree + 1)
    closed = h * h / 8 * d**2 * (d**2 - 1) / 3
    value_bound, _ = kp.lut_error_bound("chebyshev", degree, lut_size)
    np.testing.assert_allclose(value_bound[2:], closed[2:], rtol=2e-3)
    assert value_bound[-1] == pytest.approx(4.0e-5, rel=0.01)


def test_lut_layer_float32_within_bound(device):
    degree, lut_size = 8, 1024
    rng = np.random.default_rng(3)
    x = torch.tensor(rng.normal(size=(37, 13)), dtype=torch.float32, device=device)
    coeffs = torch.tensor(rng.normal(size=(13, degree + 1, 11)) / 13, dtype=torch.float32, device=device)
    got = poly_kan(x, coeffs, lut_size=lut_size).double()
    want = ref.poly_kan(x.double(), coeffs.double())
    value_bound, _ = kp.lut_error_bound("chebyshev", degree, lut_size, scalar_name="float32", device=device)
    # |dy| <= sum_i sum_d |W| bound_d, plus the float32 rounding of the sum itself
    bound = torch.einsum("ido,d->o", coeffs.double().abs(), torch.tensor(value_bound, device=device))
    rounding = 4 * (13 * (degree + 1)) * EPS[torch.float32] * ref.poly_kan(x.double().abs() * 0 + 1, coeffs.double().abs())
    assert torch.all((got - want).abs() <= bound + rounding)


# ---------------------------------------------------------------------------------- gradients
def _inputs(device, dtype, n, n_in, n_out, degree, seed=0, nd=False):
    g = torch.Generator().manual_seed(seed)
    shape = (2, n, n_in) if nd else (n, n_in)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 1.5).to(device=device, dtype=dtype)
    coeffs = (torch.randn((n_in, degree + 1, n_out), generator=g, dtype=torch.float64) / (n_in * (degree + 1)) ** 0.5)
    bias = torch.randn((n_out,), generator=g, dtype=torch.float64)
    return [t.to(device=device, dtype=dtype).requires_grad_(True) for t in (x, coeffs, bias)]


def _check_against_reference(x, coeffs, bias, basis, lut_size, tol_scale=1.0, strategy="stencil"):
    alpha, beta = params(basis)
    y = poly_kan(x, coeffs, bias, basis=basis, lut_size=lut_size, alpha=alpha, beta=beta, strategy=strategy)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, coeffs, bias), dy)
    x64, c64, b64 = (t.detach().double().requires_grad_(True) for t in (x, coeffs, bias))
    y64 = ref.poly_kan(x64, c64, b64, basis, alpha, beta)
    grads64 = torch.autograd.grad(y64, (x64, c64, b64), dy.double(), allow_unused=True)
    grads64 = [torch.zeros_like(t) if g is None else g for t, g in zip((x64, c64, b64), grads64)]  # degree 0: y is flat in x
    # tolerance from the error the float reference itself makes in this dtype
    ref_err = [0.0] * 4
    if x.dtype != torch.float64:
        xr, cr, br = (t.detach().to(x.dtype).requires_grad_(True) for t in (x64, c64, b64))
        yr = ref.poly_kan(xr, cr, br, basis, alpha, beta)
        gr = torch.autograd.grad(yr, (xr, cr, br), dy, allow_unused=True)
        gr = [torch.zeros_like(t) if g is None else g for t, g in zip((xr, cr, br), gr)]
        ref_err = [float((a.double() - b).detach().abs().max()) if a.numel() else 0.0 for a, b in zip((yr, *gr), (y64, *grads64))]
    for name, got, want, err in zip(("y", "dx", "dcoeffs", "dbias"), (y, *grads), (y64, *grads64), ref_err):
        scale = float(want.detach().abs().max()) if want.numel() else 0.0
        tol = tol_scale * (8 * err + 64 * EPS[x.dtype] * (scale + 1))
        assert got.shape == want.shape, name
        assert float((got.double() - want).detach().abs().max()) <= tol if got.numel() else True, name


@pytest.mark.parametrize("shape", [(1, 1, 1, 0), (7, 5, 3, 1), (37, 13, 17, 5), (130, 40, 9, 8)])
def test_exact_float64_forward_and_grads(device, shape):
    n, n_in, n_out, degree = shape
    for basis in ("chebyshev", "fourier") if shape[0] < 100 else ("chebyshev",):
        _check_against_reference(*_inputs(device, torch.float64, n, n_in, n_out, degree), basis, 0)


@pytest.mark.parametrize("basis", ["chebyshev", "fourier"])
def test_exact_float32_forward_and_grads(device, basis):
    for shape in ((7, 5, 3, 1), (37, 13, 17, 5), (33, 40, 70, 24)):
        _check_against_reference(*_inputs(device, torch.float32, *shape, seed=4), basis, 0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_gemm_strategy_forward_and_grads(device, dtype):
    for shape in ((1, 1, 1, 0), (37, 13, 17, 5)):
        for basis in ("chebyshev", "fourier"):
            _check_against_reference(*_inputs(device, dtype, *shape, seed=11), basis, 0, strategy="gemm")


def test_gemm_strategy_matches_stencil(device, monkeypatch):
    from warpkan.torch_bridge import edge_driver

    monkeypatch.setattr(edge_driver, "GEMM_CHUNK_BYTES", 5 * 13 * 9 * 8)  # 5 rows a chunk: the row loop runs
    x, coeffs, bias = _inputs(device, torch.float64, 23, 13, 7, 8, seed=12)
    for lut_size in (0, 1024):
        outs = []
        for strategy in ("stencil", "gemm"):
            y = poly_kan(x, coeffs, bias, lut_size=lut_size, strategy=strategy)
            outs.append((y, *torch.autograd.grad(y, (x, coeffs, bias), torch.ones_like(y))))
        for a, b in zip(*outs):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def _strategies_run(monkeypatch, module) -> list:
    """The names of the edge driver's strategy entry points that ``module`` calls from now on, in order."""
    ran = []
    for name in ("gemm_forward", "gemm_backward", "stencil_forward", "stencil_backward"):
        def spy(*args, real=getattr(module, name), name=name, **kwargs):
            ran.append(name)
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    return ran


@pytest.mark.parametrize("shape", [(1024, 32, 64, 8), (64, 16, 32, 8)], ids=str)
def test_auto_strategy_is_gemm_on_the_cpu(monkeypatch, shape):
    """strategy="auto" took the stencil kernels on the CPU below 2^27 forward FLOPs, where they are 3-9x slower
    than the gemm strategy (scripts/cpu_strategy.py); on CUDA it always took gemm. Now gemm everywhere: the
    driver runs the gemm strategy forward and backward."""
    from warpkan.torch_bridge import edge_ops, poly_ops

    ran = _strategies_run(monkeypatch, edge_ops)
    n_rows, n_in, n_out, degree = shape
    layer = PolyKANLinear(n_in, n_out, degree)
    assert layer.strategy == "auto" and layer.coeffs.device.type == "cpu"
    layer(torch.rand(n_rows, n_in, requires_grad=True)).sum().backward()
    assert ran == ["gemm_forward", "gemm_backward"]
    assert poly_ops.AUTO_STRATEGY == "gemm"  # the CPU's and a capture's rule


def test_auto_strategy_of_an_eager_cuda_call():
    """An eager CUDA call of a small polynomial layer waits on the host, so "auto" takes the stencil kernels there
    (one launch a pass, the parameters read in place); a captured call, a large one and a CPU call take gemm."""
    from warpkan.kernels.edge.strategy import EAGER_SINGLE_SLOT_STENCIL_MAX_WORK as bound
    from warpkan.kernels.edge.strategy import single_slot_strategy

    for shape in ((1024, 32, 32, 9), (128, 40, 256, 9), (14563, 32, 32, 9)):
        assert single_slot_strategy(*shape, is_cuda=True, host_bound=True) == "stencil", shape
        assert single_slot_strategy(*shape, is_cuda=True, host_bound=False) == "gemm", shape
        assert single_slot_strategy(*shape, is_cuda=False, host_bound=True) == "gemm", shape
    assert single_slot_strategy(bound // (32 * 32 * 9) + 1, 32, 32, 9, is_cuda=True, host_bound=True) == "gemm"
    assert single_slot_strategy(65536, 256, 256, 9, is_cuda=True, host_bound=True) == "gemm"
    assert single_slot_strategy(64, 256, 512, 16, is_cuda=True, host_bound=True) == "gemm"  # a long walk


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_bf16_gemms_without_an_fp32_output_gemm_cuda(monkeypatch):
    """Where torch has no bf16 x bf16 -> fp32 GEMM (``torch.mm(..., out_dtype=)``, torch < 2.8), the bf16 path's
    float32 outputs of a GEMM (the weight gradient; y outside autocast) are the bf16 GEMM's result cast to
    fp32: the fp32 ones within a bf16 rounding; the output of a bf16 GEMM (dx, through the bf16 basis
    gradient) is the same bits."""
    from warpkan.torch_bridge import edge_driver

    x, coeffs, _ = _inputs("cuda", torch.float32, 67, 24, 20, 8, seed=5)
    dy = torch.randn(67, 20, device="cuda")

    def run():
        y = poly_kan(x, coeffs, strategy="gemm", precision="bf16")
        return (y, *torch.autograd.grad(y, (x, coeffs), dy))

    fp32_out = run()
    monkeypatch.setattr(edge_driver, "_MM_OUT_DTYPE", False)
    cast = run()
    assert torch.equal(fp32_out[1], cast[1])
    for name, a, b in zip(("y", "d_coeffs"), (fp32_out[0], fp32_out[2]), (cast[0], cast[2])):
        assert torch.equal(b, b.bfloat16().float()), name  # rounded to bf16 once
        # a bf16 rounding (2^-8 relative) and two GEMM kernels' fp32 sums apart
        torch.testing.assert_close(b, a, rtol=2.0**-7, atol=0, msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_eager_cuda_call_takes_the_stencil_kernels_cuda(monkeypatch):
    """The driver runs the rule: an eager step of a small layer runs the stencil kernels forward and backward, and
    its results match the gemm strategy's to fp32 rounding."""
    from warpkan.torch_bridge import edge_ops

    torch.manual_seed(0)
    layer = PolyKANLinear(32, 32, 8).cuda()
    twin = PolyKANLinear(32, 32, 8, strategy="gemm").cuda()
    twin.load_state_dict(layer.state_dict())
    x = torch.rand(1024, 32, device="cuda") * 2 - 1
    ran = _strategies_run(monkeypatch, edge_ops)
    y = layer(x)
    y.square().mean().backward()
    assert ran == ["stencil_forward", "stencil_backward"], ran
    y_twin = twin(x)
    y_twin.square().mean().backward()
    torch.testing.assert_close(y, y_twin, rtol=1e-5, atol=1e-5)
    for a, b in zip(layer.parameters(), twin.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("precision,unit_roundoff", [("bf16", 2.0**-9), ("tf32", 2.0**-10)])
def test_gemm_tensor_core_precisions_within_documented_bound(device, precision, unit_roundoff):
    # precision="bf16" / "tf32": each contraction A @ B of length K errs by at most (2 u + K 2^-24) (|A| @ |B|)
    # (operands off by u relative: bf16 rounds to nearest, u = 2^-9; TF32 inside cuBLAS may truncate,
    # u = 2^-10; float32 products and sums), plus the float32 basis itself
    x, coeffs, bias = _inputs(device, torch.float32, 67, 24, 20, 8, seed=13)
    n_in, n_basis, n_out = coeffs.shape
    y = poly_kan(x, coeffs, bias, strategy="gemm", precision=precision)
    dy = torch.randn_like(y)
    dx, dc, db = torch.autograd.grad(y, (x, coeffs, bias), dy)
    x64, c64, b64 = (t.detach().double().requires_grad_(True) for t in (x, coeffs, bias))
    y64 = ref.poly_kan(x64, c64, b64)
    ex, ec, eb = torch.autograd.grad(y64, (x64, c64, b64), dy.double())

    def factor(k):
        return 2 * unit_roundoff + k * 2.0**-24 + 8 * EPS[torch.float32]

    t = torch.tanh(x64.detach())
    values, grads = (torch.tensor(a, device=device).reshape(67, n_in, n_basis)
                     for a in numpy_basis(t.cpu().numpy().ravel(), "chebyshev", n_basis - 1))
    basis_abs = values.abs().reshape(67, -1)
    w_abs = c64.detach().abs().reshape(n_in * n_basis, n_out)
    bound_y = factor(n_in * n_basis) * basis_abs @ w_abs + 8 * EPS[torch.float32] * b64.detach().abs()
    bound_dc = (factor(67) * basis_abs.t() @ dy.double().abs()).reshape(n_in, n_basis, n_out)
    d_basis_abs = (dy.double().abs() @ w_abs.t()).reshape(67, n_in, n_basis)
    bound_dx = (1 - t * t) * (factor(n_out) + (n_basis + 4) * EPS[torch.float32]) * (d_basis_abs * grads.abs()).sum(-1)
    assert torch.all((y.double() - y64.detach()).abs() <= bound_y)
    assert torch.all((dc.double() - ec).abs() <= bound_dc)
    assert torch.all((dx.double() - ex).abs() <= bound_dx + 1e-6 * float(ex.abs().max()))
    torch.testing.assert_close(db.double(), eb, rtol=1e-5, atol=1e-5)
    # opt-in only: the default keeps float32 accuracy, whatever the strategy
    y32 = poly_kan(x, coeffs, bias, strategy="gemm")
    assert float((y32.double() - y64).detach().abs().max()) <= 1e-5
    with pytest.raises(ValueError, match="precision"):
        poly_kan(x.double(), coeffs.double(), precision=precision)
    with pytest.raises(ValueError, match="precision"):
        poly_kan(x, coeffs, precision="tf16")
    with pytest.raises(ValueError, match="precision"):
        PolyKANLinear(4, 2, 3, precision="half")


def test_recorded_launches_follow_new_buffers(device):
    # the fused path replays launches recorded per (pointers, shapes): new inputs of the same shape, and the
    # tables dropped and rebuilt by clear_caches, must give fresh, correct results
    x, coeffs, bias = _inputs(device, torch.float64, 33, 12, 10, 6, seed=14)
    for _ in range(3):
        _check_against_reference(x, coeffs, bias, "chebyshev", 0)
        x = (x.detach() * 0.5).requires_grad_(True)
    runs = []
    for _ in range(2):
        y = poly_kan(x, coeffs, bias, lut_size=256, deterministic=True)
        runs.append((y, *torch.autograd.grad(y, (x, coeffs, bias), torch.ones_like(y))))
        kp.clear_caches()
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_other_bases_float64_grads(device):
    for basis in ("legendre", "hermite", "gegenbauer", "jacobi"):
        _check_against_reference(*_inputs(device, torch.float64, 11, 6, 5, 4, seed=5), basis, 0)


def test_gradcheck(device):
    x, coeffs, bias = _inputs(device, torch.float64, 5, 3, 4, 4, seed=6)
    for basis, strategy in (("chebyshev", "stencil"), ("fourier", "stencil"), ("jacobi", "stencil"), ("chebyshev", "gemm")):
        alpha, beta = params(basis)
        assert torch.autograd.gradcheck(lambda a, c, b: poly_kan(a, c, b, basis, 0, alpha, beta, strategy), (x, coeffs, bias))


def test_lut_grads_close_to_exact(device):
    # LUT mode's coefficient gradient reads the value table, its input gradient the derivative table
    x, coeffs, bias = _inputs(device, torch.float64, 19, 6, 5, 8, seed=7)
    value_bound, grad_bound = kp.lut_error_bound("chebyshev", 8, 2048, device=device)
    y = poly_kan(x, coeffs, bias, lut_size=2048)
    dy = torch.randn_like(y)
    dx, dc, db = torch.autograd.grad(y, (x, coeffs, bias), dy)
    ex, ec, eb = torch.autograd.grad(ref.poly_kan(x, coeffs, bias), (x, coeffs, bias), dy)
    vb = torch.tensor(value_bound, device=device)
    gb = torch.tensor(grad_bound, device=device)
    assert torch.all((dc - ec).abs() <= dy.abs().sum(0) * vb[:, None] + 1e-12)
    assert torch.all((dx - ex).abs() <= (dy.abs() @ (coeffs.abs() * gb[:, None]).sum(1).t()) + 1e-12)
    assert torch.equal(db, eb) or torch.allclose(db, eb, rtol=1e-14, atol=1e-14)


# ---------------------------------------------------------------------------------- awkward input
def test_nd_and_non_contiguous_input(device):
    x, coeffs, bias = _inputs(device, torch.float64, 6, 5, 4, 3, nd=True)
    _check_against_reference(x, coeffs, bias, "chebyshev", 0)
    xt = x.detach().transpose(0, 1)  # (6, 2, 5), not contiguous
    assert not xt.is_contiguous()
    torch.testing.assert_close(poly_kan(xt, coeffs, bias), ref.poly_kan(xt, coeffs, bias), rtol=1e-12, atol=1e-12)


def test_layer_eager_step_has_one_autograd_node(eager_step_ops):
    """PolyKANLinear's eager route makes the kernel view of coeffs (and skips the reshape of 2-D x) inside its
    autograd node, so a step runs no view nodes (each 10-20 us of host time on the GPU machine); the coeffs
    gradient keeps the parameter's strides (taken without a copy)."""
    layer = warpkan.torch_bridge.PolyKANLinear(5, 3, 4)
    x = torch.rand(7, 5, requires_grad=True)
    ops = eager_step_ops(layer, x, torch.ones(7, 3))
    nodes = {name for name in ops if name.startswith("autograd::engine::evaluate_function")}
    assert nodes == {"autograd::engine::evaluate_function: EagerEdge_polykanBackward",
                     "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"}, nodes
    assert layer.coeffs.grad.stride() == layer.coeffs.stride()


def test_nan_row_stays_in_its_row(device):
    x, coeffs, bias = _inputs(device, torch.float32, 9, 6, 5, 4)
    x = x.detach().clone()
    x[3, 2] = float("nan")
    x[5, 1] = float("inf")
    x.requires_grad_(True)
    for lut_size, strategy in ((0, "stencil"), (512, "stencil"), (0, "gemm")):
        y = poly_kan(x, coeffs, bias, lut_size=lut_size, strategy=strategy)
        assert torch.all(torch.isnan(y[3])) and torch.all(torch.isfinite(y[torch.arange(9) != 3]))
        dx, dc = torch.autograd.grad(y, (x, coeffs), torch.ones_like(y))
        assert torch.isnan(dx[3, 2]) and torch.all(torch.isfinite(dx[torch.arange(9) != 3]))
        # as under autograd: the coefficients of input 2 see the NaN row (those of the constant P_0 too in LUT
        # mode, where P_0 is interpolated), the others do not
        assert torch.all(torch.isnan(dc[2, 1:]))
        assert torch.all(torch.isfinite(dc[torch.arange(6) != 2]))


def test_empty_batch(device):
    _, coeffs, bias = _inputs(device, torch.float32, 1, 4, 3, 2)
    x = torch.empty((0, 4), device=device, requires_grad=True)
    for strategy in ("stencil", "gemm"):
        y = poly_kan(x, coeffs, bias, strategy=strategy)
        assert y.shape == (0, 3)
        dx, dc, db = torch.autograd.grad(y.sum(), (x, coeffs, bias))
        assert dx.shape == (0, 4) and torch.all(dc == 0) and torch.all(db == 0)
    assert poly_kan(torch.empty((2, 0, 4), device=device), coeffs).shape == (2, 0, 3)


def test_bad_arguments_name_the_argument():
    coeffs = torch.zeros(4, 3, 2)
    with pytest.raises(ValueError, match="x"):
        poly_kan(torch.zeros(5, 3), coeffs)
    with pytest.raises(TypeError, match="x"):
        poly_kan(torch.zeros(5, 4, dtype=torch.int32), coeffs)
    with pytest.raises(TypeError, match="coeffs"):
        poly_kan(torch.zeros(5, 4), coeffs.double())
    with pytest.raises(ValueError, match="coeffs"):
        poly_kan(torch.zeros(5, 4), torch.zeros(4, 3))
    with pytest.raises(ValueError, match="bias"):
        poly_kan(torch.zeros(5, 4), coeffs, torch.zeros(3))
    with pytest.raises(ValueError, match="basis"):
        poly_kan(torch.zeros(5, 4), coeffs, basis="laguerre")
    with pytest.raises(ValueError, match="lut_size"):
        poly_kan(torch.zeros(5, 4), coeffs, lut_size=1)
    with pytest.raises(ValueError, match="strategy"):
        poly_kan(torch.zeros(5, 4), coeffs, strategy="cublas")
    with pytest.raises(ValueError, match="alpha"):
        poly_kan(torch.zeros(5, 4), coeffs, basis="gegenbauer", alpha=0.0)
    with pytest.raises(ValueError, match="degree"):
        PolyKANLinear(4, 2, kp.MAX_DEGREE + 1)
    with pytest.raises(ValueError, match="mode"):
        PolyKANLinear(4, 2, 3, mode="fast")
    with pytest.raises(ValueError, match="in_features"):
        PolyKANLinear(0, 2, 3)
    with pytest.raises(TypeError, match="dtype"):
        PolyKANLinear(4, 2, 3)(torch.zeros(2, 4, dtype=torch.float64))


def test_wrong_device(device):
    if device != "cuda":
        pytest.skip("needs a second device")
    with pytest.raises(ValueError, match="device"):
        poly_kan(torch.zeros(5, 4, device="cuda"), torch.zeros(4, 3, 2))


def test_reductions_are_bitwise_reproducible(device):
    # deterministic=True: the stencil backward's atomic-free kernels (the default adds by atomics on CUDA)
    x, coeffs, bias = _inputs(device, torch.float32, 130, 40, 9, 8, seed=8)
    runs = []
    for _ in range(2):
        y = poly_kan(x, coeffs, bias, lut_size=1024, strategy="stencil", deterministic=True)
        runs.append((y, *torch.autograd.grad(y, (x, coeffs, bias), torch.ones_like(y))))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------- torch integration
def test_opcheck(device):
    x, coeffs, bias = _inputs(device, torch.float64, 6, 5, 4, 3)
    dy = torch.randn(x.shape[0], coeffs.shape[2], dtype=x.dtype, device=x.device)
    for basis, lut_size, b in (("chebyshev", 0, bias), ("chebyshev", 129, bias), ("fourier", 0, None)):
        spec = basis_spec(x, basis, lut_size, 1.0, 1.0, coeffs.shape[1])
        for strategy in ("stencil", "gemm"):
            route = (spec.static_key(), strategy, "auto", False)
            frame = list(spec.frame_tensors)
            torch.library.opcheck(edge_forward, (x, frame, None, None, coeffs, b, None, *route))
            torch.library.opcheck(edge_backward, (dy, x.detach(), frame, None, None, coeffs.detach(), None, *route,
                                                  True, True, b is not None))


def test_torch_compile_fullgraph(device):
    layer = PolyKANLinear(5, 4, 6, bias=True, device=device)
    x = torch.randn(8, 5, device=device, requires_grad=True)
    compiled = torch.compile(layer, fullgraph=True)
    y = compiled(x)
    torch.testing.assert_close(y, layer(x), rtol=0, atol=0)
    (gx,) = torch.autograd.grad(y.sum(), x)
    (ex,) = torch.autograd.grad(layer(x).sum(), x)
    torch.testing.assert_close(gx, ex, rtol=0, atol=0)


def test_chebykan_state_dict_loads_and_matches(device):
    g = torch.Generator().manual_seed(9)
    state = {"cheby_coeffs": torch.randn(6, 5, 9, generator=g) / 54, "arange": torch.arange(0, 9, 1)}
    layer = ChebyKANLinear(6, 5, 8, mode="exact", device=device)
    layer.load_state_dict(state)
    assert layer.coeffs.shape == (6, 5, 9) and layer.coeffs.is_contiguous()
    x = torch.randn(4, 3, 6, generator=g).to(device)
    want = ref.chebykan_acos(x.double(), state["cheby_coeffs"].double().to(device))
    got = layer(x)
    assert got.shape == (4, 3, 5)
    # acos/cos and the recurrence agree to float32 rounding (cos(d acos t) loses ~d eps near |t| = 1)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=64 * EPS[torch.float32])
    with pytest.raises(RuntimeError, match="basis"):
        PolyKANLinear(6, 5, 8, basis="legendre").load_state_dict(state)


def test_autocast_bf16_returns_bf16():
    layer = PolyKANLinear(5, 4, 3)
    x = torch.randn(3, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), layer(x), rtol=1e-2, atol=1e-2)


def test_module_repr_and_modes():
    layer = PolyKANLinear(3, 2, 4, basis="jacobi", alpha=0.5, beta=0.25, mode="exact", bias=True)
    text = repr(layer)
    assert "jacobi" in text and "alpha=0.5" in text and "beta=0.25" in text and "exact" in text


# ---------------------------------------------------------------------------------- Warp-native
def test_native_layer_with_tape_matches_torch(device):
    layer = warpkan.PolyKANLinear(5, 4, 6, basis="chebyshev", mode="exact", bias=True, device=device, dtype=wp.float64, seed=3)
    rng = np.random.default_rng(10)
    layer.bias.assign(rng.normal(size=4))
    x_np = rng.normal(size=(9, 5))
    dy_np = rng.normal(size=(9, 4))
    x = wp.array(x_np, dtype=wp.float64, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        y = layer(x)
    tape.backward(grads={y: wp.array(dy_np, dtype=wp.float64, device=device)})

    # on the same device (a GPU machine need not have a CPU compiler)
    torch_layer = PolyKANLinear(5, 4, 6, mode="exact", bias=True, dtype=torch.float64, device=device)
    torch_layer.load_state_dict({k: torch.tensor(v) for k, v in layer.state_dict().items()})
    xt = torch.tensor(x_np, requires_grad=True, device=device)
    yt = torch_layer(xt)
    gx, gc, gb = (g.cpu() for g in torch.autograd.grad(yt, (xt, torch_layer.coeffs, torch_layer.bias),
                                                        torch.tensor(dy_np, device=device)))
    np.testing.assert_allclose(y.numpy(), yt.detach().cpu().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), gx.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(layer.coeffs.grad.numpy(), gc.permute(0, 2, 1).numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(layer.bias.grad.numpy(), gb.numpy(), rtol=1e-12, atol=1e-12)

    # ChebyKAN's state dict loads into the native layer too
    cheby = warpkan.ChebyKANLinear(5, 4, 6, mode="exact", device=device, dtype=wp.float64)
    cheby.load_state_dict({"cheby_coeffs": gc.numpy(), "arange": np.arange(7)})
    np.testing.assert_array_equal(cheby.state_dict()["coeffs"], gc.numpy())


def test_native_lut_layer_runs_without_tape(device):
    layer = warpkan.PolyKANLinear(3, 2, 5, basis="fourier", mode="lut", lut_size=512, device=device)
    x = wp.array(np.zeros((4, 3), dtype=np.float32), device=device)
    y = layer(x)
    assert y.shape == (4, 2) and y.grad is None
    with pytest.raises(ValueError, match="x"):
        layer(wp.zeros((4, 2), dtype=wp.float32, device=device))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA-graph capture needs a GPU")
@pytest.mark.parametrize("mode", ["lut", "exact"])
def test_cuda_graph_capture(mode):
    layer = PolyKANLinear(40, 24, 8, mode=mode, bias=True).cuda()
    x = torch.randn(64, 40, device="cuda", requires_grad=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up: compile kernels, build the tables
            layer(x).square().sum().backward()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    layer.zero_grad(set_to_none=False)
    x.grad = None
    with torch.cuda.graph(graph):
        y = layer(x)
        y.square().sum().backward()
    layer.zero_grad(set_to_none=False)
    graph.replay()
    torch.cuda.synchronize()
    want = layer(x)
    torch.testing.assert_close(y, want)
    (want_grad,) = torch.autograd.grad(want.square().sum(), layer.coeffs)
    torch.testing.assert_close(layer.coeffs.grad, want_grad)


def test_chebykan_example_runs_and_lut_matches_exact(tmp_path):
    """examples/chebykan_classification.py, reduced (1 epoch, 2 seeds): it trains the exact and LUT ChebyKANs
    and the MLP, prints the table, saves the curves, and exits 0 only when the LUT run's test accuracy is
    within twice the seed-to-seed spread of the exact run's."""
    import os
    import subprocess
    import sys

    pytest.importorskip("sklearn")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "curves.png"
    result = subprocess.run(
        [sys.executable, os.path.join(root, "examples", "chebykan_classification.py"), "--epochs", "1", "--seeds", "2",
         "--device", "cpu", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "ChebyKAN lut" in result.stdout and "MLP" in result.stdout and "within" in result.stdout
    assert out.exists() and out.stat().st_size > 0


def test_lut_tables_made_while_tracing_stay_out_of_the_cache(monkeypatch):
    """A LUT layer's tables asked for with traced x (fake tensors, as torch.compile's and AOTAutograd's traces of
    a create_graph=True formula or a Taylor-mode spec pass them) come from the registered op, and the cache
    holds only real tables: a later eager call (its frame read by pointer) works. Tables made while the mode was
    active had been that mode's tensors, cached, and a later eager call of the same configuration failed on
    them (no storage)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from warpkan.torch_bridge import poly_ops

    monkeypatch.setattr(poly_ops, "_tables_cache", {})
    with FakeTensorMode() as mode:
        fake_x = mode.from_tensor(torch.rand(5, 3))
        values, grads = poly_ops._tables(fake_x, "chebyshev", 5, 64, 1.0, 1.0)
        assert values.shape == grads.shape == (64, 5)
    for tables in poly_ops._tables_cache.values():
        assert all(type(t) is torch.Tensor for t in tables), [type(t) for t in tables]
    layer = warpkan.torch_bridge.PolyKANLinear(3, 2, 4, mode="lut", lut_size=64)
    x = torch.rand(5, 3, requires_grad=True)
    layer(x).sum().backward()
    assert torch.isfinite(x.grad).all()
