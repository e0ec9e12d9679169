"""Pure-torch reference of the B-spline KAN layer, written from the formulas (efficient-kan's Cox-de Boor
recursion on the knot buffer). It runs in any dtype, float64 included, and is what the tests compare the
Warp kernels against. It materialises an O(N * in * (G + k)) basis tensor: it is a reference, never a
fallback."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["b_splines", "kan_linear", "spline_output"]


def b_splines(x: torch.Tensor, grid: torch.Tensor, spline_order: int) -> torch.Tensor:
    """B-spline bases of x [N, in] on the knots grid [in, G + 2k + 1]: [N, in, G + k].

    Zero outside [grid[:, 0], grid[:, -1]), as in efficient-kan and pykan.
    """
    x = x.unsqueeze(-1)
    bases = ((x >= grid[:, :-1]) & (x < grid[:, 1:])).to(x.dtype)
    for k in range(1, spline_order + 1):
        left = (x - grid[:, : -(k + 1)]) / (grid[:, k:-1] - grid[:, : -(k + 1)])
        right = (grid[:, k + 1 :] - x) / (grid[:, k + 1 :] - grid[:, 1:(-k)])
        bases = left * bases[:, :, :-1] + right * bases[:, :, 1:]
    # NaN inputs: the indicator is 0 but 0 * NaN propagates; off-grid means zero spline term
    return torch.where(torch.isnan(bases), torch.zeros_like(bases), bases)


def spline_output(x, grid, spline_weight, spline_scaler, spline_order):
    """sum_i s[o, i] sum_j C[o, i, j] B_j(x[n, i]) for x [N, in]."""
    bases = b_splines(x, grid, spline_order)
    scaled = spline_weight * spline_scaler.unsqueeze(-1)
    return F.linear(bases.reshape(x.shape[0], -1), scaled.reshape(scaled.shape[0], -1))


def kan_linear(x, grid, base_weight, spline_weight, spline_scaler, spline_order, use_base=True, base_activation=F.silu):
    """efficient-kan's KANLinear forward for x (..., in) with parameters in efficient-kan's layout;
    ``base_activation``: any callable on tensors (an activation module included), SiLU by default."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    out = spline_output(x2, grid, spline_weight, spline_scaler, spline_order)
    if use_base:
        out = out + F.linear(base_activation(x2), base_weight)
    return out.reshape(*lead, out.shape[-1])
