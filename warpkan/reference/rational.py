"""Pure-torch reference of the group-rational activation, written from the formulas (run it in float64).

``F_g(x) = P(x) / Q_g(x)``, ``P = sum_i a_i x^i``; variant "A": ``Q = 1 + sum_j |b_{j-1}| |x|^j``, variant "B":
``Q = 1 + |sum_j b_{j-1} x^j|``. Autograd gives the gradients; ``|v|`` is differentiated as
``sign(v)`` with ``sign(0) = +1`` (KAT's convention, the one the Warp kernels use). Never a fallback.
"""

from __future__ import annotations

import torch

__all__ = ["group_rational_reference", "kat_abs"]


def kat_abs(v: torch.Tensor) -> torch.Tensor:
    """``|v|`` whose derivative is -1 for v < 0 and +1 otherwise (also at 0)."""
    sign = torch.where(v < 0, -1.0, 1.0).to(v.dtype).detach()
    return v * sign


def group_rational_reference(
    x: torch.Tensor,
    weight_numerator: torch.Tensor,
    weight_denominator: torch.Tensor,
    num_groups: int,
    variant: str = "A",
) -> torch.Tensor:
    """x (..., C); weight_numerator [1 or G, m+1]; weight_denominator [G, n]. Same dtype as the inputs."""
    channels = x.shape[-1]
    if channels % num_groups:
        raise ValueError(f"num_groups ({num_groups}) must divide the number of channels ({channels})")
    group_size = channels // num_groups
    a = weight_numerator.expand(num_groups, -1)
    # per-channel coefficients [C, m+1] and [C, n]
    a_c = a.repeat_interleave(group_size, dim=0)
    b_c = weight_denominator.repeat_interleave(group_size, dim=0)
    xe = x.unsqueeze(-1)
    m = a.shape[1] - 1
    n = weight_denominator.shape[1]
    powers = xe ** torch.arange(0, max(m, n) + 1, device=x.device, dtype=x.dtype)
    p = (powers[..., : m + 1] * a_c).sum(-1)
    if variant == "A":
        q = 1 + (kat_abs(b_c) * kat_abs(powers[..., 1 : n + 1])).sum(-1)
    elif variant == "B":
        q = 1 + kat_abs((b_c * powers[..., 1 : n + 1]).sum(-1))
    else:
        raise ValueError(f"variant must be 'A' or 'B', got {variant!r}")
    return p / q
