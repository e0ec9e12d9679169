"""Pure-torch reference of the UKAN layer, written from the formulas, runnable in float64.

This is the UKAN paper's own approach: it runs the coefficient-generator MLP for *every sample and input*
(for both groups g - 1 and g), materialising an O(N * in * out * 2K) coefficient tensor. It is what the
tests compare the Warp kernels against and what ``warpkan bench ukan`` times as the paper's method; it is
never a fallback.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels.bspline import uniform_basis_matrix
from ..kernels.ukan import CELL_LIMIT, PE_BASE
from ..torch_bridge._common import cacheable

__all__ = ["locate", "positional_encoding", "cg_mlp", "ukan_linear"]


def locate(x: torch.Tensor, grid_delta: float, spline_order: int):
    """(valid, g, r, u, du_dx) of x on the unbounded grid; s = x / h in float64, clamped to +-CELL_LIMIT."""
    K = spline_order + 1
    s = x.double() / grid_delta
    valid = ~torch.isnan(s)
    inside = (s.abs() <= CELL_LIMIT) & valid
    s = torch.where(valid, s, torch.zeros_like(s)).clamp(-CELL_LIMIT, CELL_LIMIT)
    c = torch.floor(s)
    u = (s - c).to(x.dtype)
    c = c.to(torch.int64)
    g = torch.div(c, K, rounding_mode="floor")
    r = c - g * K
    du_dx = torch.where(inside, 1.0 / grid_delta, 0.0).to(x.dtype)
    return valid, g, r, u, du_dx


def positional_encoding(g: torch.Tensor, pe_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """[..., pe_dim]: (sin(g f_j), cos(g f_j)) interleaved, f_j = PE_BASE^(-2j / pe_dim); phases in float64."""
    j = torch.arange(pe_dim // 2, device=g.device, dtype=torch.float64)
    freq = PE_BASE ** (-2.0 * j / pe_dim)
    phase = g.double().unsqueeze(-1) * freq
    return torch.stack([torch.sin(phase), torch.cos(phase)], dim=-1).reshape(*g.shape, pe_dim).to(dtype)


def cg_mlp(features: torch.Tensor, w1, b1, w2, b2) -> torch.Tensor:
    """The coefficient generator: Linear -> SiLU -> Linear."""
    return F.linear(F.silu(F.linear(features, w1, b1)), w2, b2)


_BASIS_MATRICES: dict = {}


def _basis_matrix(spline_order: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The uniform B-spline basis matrix on the device, made once: a host-to-device copy on every call would
    keep the reference (the paper's method in ``warpkan bench ukan``) out of a CUDA graph. Not kept when made
    under a tracing mode or a torch.func transform (``cacheable``)."""
    key = (spline_order, dtype, device)
    matrix = _BASIS_MATRICES.get(key)
    if matrix is None:
        matrix = torch.tensor(uniform_basis_matrix(spline_order), dtype=dtype, device=device)
        if cacheable(matrix):
            _BASIS_MATRICES[key] = matrix
    return matrix


def ukan_linear(x, grid_delta, spline_order, pe_dim, feature_embedding, w1, b1, w2, b2, spline_scaler,
                base_weight=None, base_activation=F.silu):
    """UKANLinear forward for x (..., in). feature_embedding [in, E]; CG-MLP weights w1 [H, pe + E], b1 [H],
    w2 [out * K, H], b2 [out * K]; spline_scaler [out, in]; base_weight [out, in] or None; base_activation:
    any callable on tensors, SiLU by default."""
    K = spline_order + 1
    n_out, n_in = spline_scaler.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, n_in)
    n_rows = x2.shape[0]
    valid, g, r, u, _ = locate(x2, grid_delta, spline_order)
    emb = feature_embedding.unsqueeze(0).expand(n_rows, -1, -1)

    def coefficients(group):  # per sample: [N, in, out, K]
        feats = torch.cat([positional_encoding(group, pe_dim, x.dtype), emb], dim=-1)
        return cg_mlp(feats, w1, b1, w2, b2).reshape(n_rows, n_in, n_out, K)

    both = torch.cat([coefficients(g - 1), coefficients(g)], dim=-1)  # [N, in, out, 2K]
    idx = (r.unsqueeze(-1) + torch.arange(K, device=x.device)).unsqueeze(2).expand(-1, -1, n_out, -1)
    window = torch.gather(both, -1, idx)  # [N, in, out, K]
    M = _basis_matrix(spline_order, x.dtype, x.device)
    powers = torch.stack([u**p for p in range(K)], dim=-1)  # [N, in, K]
    bases = powers @ M
    spline = (window * bases.unsqueeze(2)).sum(-1)  # [N, in, out]
    spline = torch.where(valid.unsqueeze(-1), spline, torch.zeros_like(spline))
    y = torch.einsum("nio,oi->no", spline, spline_scaler)
    if base_weight is not None:
        y = y + F.linear(base_activation(x2), base_weight)
    return y.reshape(*lead, n_out)
