"""Pure-torch reference of the GEGLU feed-forward layer, written from the formulas. It runs in any dtype,
float64 included, and is what the tests compare the Warp kernels against; autograd gives its gradients.
It is a reference, never a fallback.

``out = (gate(x W_u^T + b_u) * (x W_v^T + b_v)) W_o^T + b_o`` with the weights in ``nn.Linear`` layout
and ``W_u``, ``W_v`` stacked in one ``w_uv`` [2 inter, hidden].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["gate", "geglu_ffn_reference", "torch_baseline"]


def gate(u: torch.Tensor, activation: str) -> torch.Tensor:
    """The three gates from their formulas (not from torch's GELU), in the dtype of u."""
    if activation == "gelu":
        return 0.5 * u * (1.0 + torch.erf(u / math.sqrt(2.0)))
    if activation == "gelu_tanh":
        return 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u**3)))
    if activation == "gelu_sigmoid":
        return u * torch.sigmoid(1.702 * u)
    raise ValueError(f"unknown activation {activation!r}")


def geglu_ffn_reference(x, w_uv, b_uv, w_o, b_o, activation: str) -> torch.Tensor:
    """The layer on x (..., hidden); every tensor is used in its own dtype (pass float64 for a reference)."""
    n_inter = w_o.shape[1]
    uv = F.linear(x, w_uv, b_uv)
    u, v = uv[..., :n_inter], uv[..., n_inter:]
    return F.linear(gate(u, activation) * v, w_o, b_o)


def torch_baseline(x, w_u, w_v, w_o, activation: str, b_u=None, b_v=None, b_o=None) -> torch.Tensor:
    """What a PyTorch user writes: two F.linear, the gate, a multiply, F.linear (unfused, the peer)."""
    u = F.linear(x, w_u, b_u)
    if activation == "gelu":
        g = F.gelu(u)
    elif activation == "gelu_tanh":
        g = F.gelu(u, approximate="tanh")
    else:
        g = u * torch.sigmoid(1.702 * u)
    return F.linear(g * F.linear(x, w_v, b_v), w_o, b_o)
