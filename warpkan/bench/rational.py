"""Group-rational (KAT) benchmark: warpkan's kernels against, in the same run, a pure-torch implementation of
the formula (KAT's torch reference style: explicit powers, autograd, no atomics), the same compiled with
torch.compile, nn.GELU, and a device-to-device copy of x (the bandwidth ceiling the GB/s columns are
compared with), and the mean absolute error of the coefficient gradients against a float64 reference (dy ~
N(0, 1), FlashKAT's precision measure). Then the GR-KAN layer against nn.GELU + nn.Linear at the ViT-S MLP shape.
Last, the second-order step (u_x and u_xx by create_graph=True, then the gradients of a loss of them: what a
physics-informed residual asks) of the activation against torch's double backward of the formula, and its
ratio to the first-order step of the same activation (target: at most 4x).

KAT's and FlashKAT's Triton kernels are timed when ``WARPKAN_KAT_PATH`` names a checkout of the FlashKAT
repository (``rational_kat.kernels``) or of KAT's ``rational_kat_cu`` (``kat_rational``); their code is not
part of this project.
"""

from __future__ import annotations

import os
import sys

import torch

from . import register
from .timing import HARDWARE, backward_only, peak_memory, time_fn, training_step

FULL_ACTIVATION_CASES = [((1024, 197, 768), torch.float32), ((1024, 197, 768), torch.bfloat16),
                         ((256, 197, 768), torch.float32), ((256, 197, 768), torch.bfloat16)]
QUICK_ACTIVATION_CASES = [((4, 64, 96), torch.float32), ((4, 64, 96), torch.bfloat16)]
FULL_LAYER_CASES = [((256 * 197, 384, 1536), torch.float32), ((256 * 197, 384, 1536), torch.bfloat16)]
QUICK_LAYER_CASES = [((256, 64, 128), torch.float32)]
GROUPS = 8
ORDER = (5, 4)


def torch_formula(x, weight_numerator, weight_denominator, num_groups):
    """Variant A in plain torch ops in x's dtype: what KAT's torch reference computes (atomics-free autograd)."""
    shape = x.shape
    c = shape[-1]
    z = x.reshape(-1, num_groups, c // num_groups)
    a = weight_numerator.to(x.dtype).expand(num_groups, -1)
    b = weight_denominator.to(x.dtype).abs()
    p = a[:, -1].view(1, num_groups, 1).expand_as(z)
    for i in range(a.shape[1] - 2, -1, -1):
        p = p * z + a[:, i].view(1, num_groups, 1)
    az = z.abs()
    q = b[:, -1].view(1, num_groups, 1).expand_as(z)
    for j in range(b.shape[1] - 2, -1, -1):
        q = q * az + b[:, j].view(1, num_groups, 1)
    q = q * az + 1
    return (p / q).reshape(shape)


def _triton_peers() -> dict:
    """KAT's and FlashKAT's Triton kernels, imported (never copied) from the checkout that
    ``WARPKAN_KAT_PATH`` names: the FlashKAT repository (``rational_kat.kernels``: FlashKAT's kernel and its
    copy of KAT's) or KAT's ``rational_kat_cu`` (``kat_rational``). Empty when unset or not importable."""
    path = os.environ.get("WARPKAN_KAT_PATH")
    if not path:
        return {}
    if path not in sys.path:
        sys.path.insert(0, path)
    peers = {}
    for module, label in (("rational_kat.kernels.rational_triton", "KAT Triton (atomics)"),
                          ("kat_rational.rational_triton", "KAT Triton (atomics)")):
        if label in peers:
            break
        try:
            kat = __import__(module, fromlist=["RationalTriton1DGroup"]).RationalTriton1DGroup
        except Exception:  # noqa: BLE001 - a peer that does not import is reported, not fatal
            continue
        peers[label] = lambda x, a, b, g, kat=kat: kat.apply(x, a.expand(g, -1).contiguous(), b, g)
    try:
        from rational_kat.kernels.flash_rational_triton import FlashRationalTriton1DGroup  # type: ignore
    except Exception:  # noqa: BLE001
        pass
    else:
        peers["FlashKAT Triton"] = lambda x, a, b, g: FlashRationalTriton1DGroup.apply(
            x, a.expand(g, -1).contiguous(), b)
    return peers


def _activation_impls(device):
    from ..torch_bridge import group_rational

    impls = {
        "warpkan": lambda x, a, b, g: group_rational(x, a, b, g, "A"),
        "torch formula (KAT torch reference style)": torch_formula,
        "torch formula, torch.compile": torch.compile(torch_formula),
        "nn.GELU": lambda x, a, b, g: torch.nn.functional.gelu(x),
    }
    if device.startswith("cuda"):
        impls.update(_triton_peers())
    return impls


def _float64_coefficient_grads(x, dy, a, b, num_groups, chunk_rows=4096):
    """d weight_numerator, d weight_denominator of the float64 reference, summed over row chunks in float64
    (the full tensors in float64 with autograd would not fit)."""
    from ..reference.rational import group_rational_reference

    a64 = a.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    x2 = x.reshape(-1, x.shape[-1])
    dy2 = dy.reshape(-1, x.shape[-1])
    for start in range(0, x2.shape[0], chunk_rows):
        y = group_rational_reference(x2[start:start + chunk_rows].double(), a64, b64, num_groups, "A")
        y.backward(dy2[start:start + chunk_rows].double())
    return a64.grad, b64.grad


def _copy_ms(x, device, repeat):
    out = torch.empty_like(x)
    return time_fn(lambda: out.copy_(x), device, warmup=2, repeat=repeat)


def _activation_rows(device, quick):
    from ..kernels import rational as kr

    rows = []
    repeat = 3 if quick else 20
    numerator, denominator = kr.init_coefficients("swish", ORDER, "A")
    for shape, dtype in QUICK_ACTIVATION_CASES if quick else FULL_ACTIVATION_CASES:
        case = f"x {tuple(shape)} {str(dtype).replace('torch.', '')}"
        torch.manual_seed(0)
        x = torch.randn(shape, device=device, dtype=dtype)
        dy = torch.randn(shape, device=device, dtype=dtype)
        a = torch.tensor([numerator], device=device)
        b = torch.tensor([denominator], device=device).repeat(GROUPS, 1)
        nbytes = x.numel() * x.element_size()
        copy_ms = _copy_ms(x, device, repeat)
        copy_bw = 2 * nbytes / (copy_ms * 1e-3)
        copy_row = {"case": case, "impl": "copy x (measured ceiling)", "fwd_ms": copy_ms, "fwd GB/s": copy_bw / 1e9,
                    "fwd % copy": 100.0}
        if device.startswith("cuda"):  # against the H100 / H200 copy rate in timing.HARDWARE
            copy_row["% of 4.3 TB/s"] = 100 * copy_bw / HARDWARE["hbm_bytes_per_s"]
        rows.append(copy_row)
        gelu_total = None
        da64, db64 = _float64_coefficient_grads(x, dy, a, b, GROUPS)
        for name, fn in _activation_impls(device).items():
            row = {"case": case, "impl": name}
            try:
                xg = x.clone().requires_grad_()
                ag = a.clone().requires_grad_()
                bg = b.clone().requires_grad_()

                def forward():
                    with torch.no_grad():
                        fn(x, a, b, GROUPS)

                y = fn(xg, ag, bg, GROUPS)
                params = [xg] if name == "nn.GELU" else [xg, ag, bg]

                def backward():  # the backward alone, as timing.backward_only times it
                    torch.autograd.grad(y, params, dy, retain_graph=True)

                def train_step():
                    out = fn(xg, ag, bg, GROUPS)
                    torch.autograd.grad(out, params, dy)

                fwd = time_fn(forward, device, warmup=3, repeat=repeat)
                bwd = time_fn(backward, device, warmup=3, repeat=repeat)
                row.update(fwd_ms=fwd, bwd_ms=bwd, total_ms=fwd + bwd)
                row["fwd GB/s"] = 2 * nbytes / (fwd * 1e-3) / 1e9
                row["bwd GB/s"] = 3 * nbytes / (bwd * 1e-3) / 1e9
                row["fwd % copy"] = 100 * 2 * nbytes / (fwd * 1e-3) / copy_bw
                row["bwd % copy"] = 100 * 3 * nbytes / (bwd * 1e-3) / copy_bw
                row["peak_MiB"] = peak_memory(train_step, device)
                if name == "nn.GELU":
                    gelu_total = fwd + bwd
                else:  # precision of the coefficient gradients (dy ~ N(0, 1)), as FlashKAT reports it
                    _, da, db = torch.autograd.grad(y, params, dy, retain_graph=True)
                    row["dA MAE vs fp64"] = (da.double() - da64).abs().mean().item()
                    row["dB MAE vs fp64"] = (db.double() - db64).abs().mean().item()
                del y
            except torch.OutOfMemoryError:
                row["note"] = "out of memory"
            rows.append(row)
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
        for row in rows:
            if row["case"] == case and gelu_total and "total_ms" in row:
                row["x nn.GELU"] = row["total_ms"] / gelu_total
        if not device.startswith("cuda") or not _triton_peers():
            rows.append({"case": case, "impl": "KAT Triton / FlashKAT Triton",
                         "note": "not in run (set WARPKAN_KAT_PATH to a FlashKAT or rational_kat_cu checkout, on a GPU)"})
    return rows


def _layer_rows(device, quick):
    from ..torch_bridge import GRKANLinear

    rows = []
    repeat = 3 if quick else 20
    for (n_rows, n_in, n_out), dtype in QUICK_LAYER_CASES if quick else FULL_LAYER_CASES:
        case = f"layer N={n_rows} {n_in}->{n_out} {str(dtype).replace('torch.', '')}"
        torch.manual_seed(0)
        x = torch.randn(n_rows, n_in, device=device, dtype=dtype, requires_grad=True)
        dy = torch.randn(n_rows, n_out, device=device, dtype=dtype)
        layers = {
            "warpkan GRKANLinear": GRKANLinear(n_in, n_out, GROUPS).to(device=device, dtype=dtype),
            "nn.GELU + nn.Linear": torch.nn.Sequential(torch.nn.GELU(), torch.nn.Linear(n_in, n_out)).to(
                device=device, dtype=dtype),
        }
        results = []
        for name, layer in layers.items():
            def forward():
                with torch.no_grad():
                    layer(x)

            train_step = training_step(layer, x, dy)

            results.append({"case": case, "impl": name, "fwd_ms": time_fn(forward, device, warmup=3, repeat=repeat),
                            "bwd_ms": time_fn(backward_only(layer, [x], dy), device, warmup=3, repeat=repeat),
                            "total_ms": time_fn(train_step, device, warmup=3, repeat=repeat),
                            "peak_MiB": peak_memory(train_step, device)})
        base = results[-1]["total_ms"]
        for row in results:
            row["x nn.GELU+Linear"] = row["total_ms"] / base
        rows.extend(results)
    return rows


FULL_SECOND_ORDER_CASES = [(4096, 64), (65536, 64), (8192, 768)]
QUICK_SECOND_ORDER_CASES = [(256, 64)]


def _second_order_rows(device, quick):
    from ..torch_bridge import group_rational

    rows = []
    repeat = 3 if quick else 20
    for n_rows, channels in QUICK_SECOND_ORDER_CASES if quick else FULL_SECOND_ORDER_CASES:
        case = f"second order N={n_rows} C={channels} float32"
        torch.manual_seed(0)
        x = torch.randn(n_rows, channels, device=device, requires_grad=True)
        a = (torch.randn(GROUPS, ORDER[0] + 1, device=device) * 0.5).requires_grad_()
        b = (torch.randn(GROUPS, ORDER[1], device=device) * 0.5).requires_grad_()
        results = []
        for name, f in (("warpkan group_rational", group_rational), ("torch formula (double backward)",
                                                                    lambda *args: torch_formula(*args[:4]))):
            def second():
                y = f(x, a, b, GROUPS)
                (u_x,) = torch.autograd.grad(y.sum(), x, create_graph=True)
                (u_xx,) = torch.autograd.grad(u_x.sum(), x, create_graph=True)
                (u_xx.square().mean() + u_x.square().mean()).backward()

            def first():
                f(x, a, b, GROUPS).square().mean().backward()

            row = {"case": case, "impl": name, "second_order_ms": time_fn(second, device, warmup=3, repeat=repeat),
                   "first_order_ms": time_fn(first, device, warmup=3, repeat=repeat)}
            row["second / first order"] = row["second_order_ms"] / row["first_order_ms"]
            results.append(row)
        for row in results:
            row["x warpkan"] = row["second_order_ms"] / results[0]["second_order_ms"]
        rows.extend(results)
    return rows


LEGEND = {
    "total_ms": "activation rows: fwd_ms + bwd_ms; layer rows: one training step timed as a whole, median ms "
                "(fwd_ms and bwd_ms are timed apart, each call with its own host overhead, so it need not equal "
                "their sum and can be less)",
    "fwd GB/s": "x read and y written per fwd_ms",
    "bwd GB/s": "x and dy read and dx written per bwd_ms",
    "fwd % copy": "fwd GB/s as a share of a device-to-device copy of x measured in the same run",
    "bwd % copy": "bwd GB/s as a share of the same copy rate",
    "% of 4.3 TB/s": "the copy's rate as a share of the H100 / H200 copy rate",
    "dA MAE vs fp64": "mean |error| of the numerator coefficients' gradient against a float64 reference (dy ~ "
                      "N(0, 1))",
    "dB MAE vs fp64": "the same for the denominator coefficients' gradient",
    "x nn.GELU": "total_ms over nn.GELU's on the same x",
    "x nn.GELU+Linear": "total_ms over that of nn.GELU + nn.Linear of the same shape",
    "second_order_ms": "u_x and u_xx by create_graph=True, then the gradients of a loss of them, median ms",
    "first_order_ms": "forward and backward of a loss of the activation alone, median ms",
    "second / first order": "second_order_ms over first_order_ms (target: <= 4)",
    "x warpkan": "second_order_ms over warpkan's",
}


@register("rational", LEGEND)
def run(device: str = "cuda", quick: bool = False) -> list[dict]:
    return _activation_rows(device, quick) + _layer_rows(device, quick) + _second_order_rows(device, quick)
