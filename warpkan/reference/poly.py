"""Pure-torch reference of the polynomial KAN layer, written from the formulas; it runs in any dtype, float64
included, and is what the tests compare the Warp kernels against. It materialises an O(N * in * (D + 1)) basis
tensor: it is a reference, never a fallback.

Also the two torch forms the benchmarks compare against, in ChebyKAN's parameter layout ``cheby_coeffs``
[in, out, D + 1]: ChebyKAN's own acos/cos form and the recurrence + einsum form.
"""

from __future__ import annotations

import math

import torch

__all__ = ["basis_values", "poly_kan", "table_values", "poly_kan_lut", "chebykan_acos", "chebyshev_recurrence_einsum"]


def basis_values(t: torch.Tensor, basis: str, degree: int, alpha: float = 1.0, beta: float = 1.0) -> torch.Tensor:
    """``P_0(t)`` to ``P_degree(t)`` stacked on a new last dimension (see ``warpkan.kernels.poly`` for the bases)."""
    if basis == "fourier":
        values = [torch.ones_like(t)]
        for d in range(1, degree + 1):
            k = (d + 1) // 2
            values.append(torch.cos(k * math.pi * t) if d % 2 == 1 else torch.sin(k * math.pi * t))
        return torch.stack(values, dim=-1)
    values = [torch.ones_like(t)]
    if degree >= 1:
        if basis == "chebyshev":
            first = t
        elif basis == "legendre":
            first = t
        elif basis == "hermite":
            first = 2 * t
        elif basis == "gegenbauer":
            first = 2 * alpha * t
        elif basis == "jacobi":
            first = (alpha - beta) / 2 + (alpha + beta + 2) / 2 * t
        else:
            raise ValueError(f"unknown basis {basis!r}")
        values.append(first)
    for n in range(1, degree):
        p, q = values[n], values[n - 1]
        if basis == "chebyshev":  # T_{n+1} = 2 t T_n - T_{n-1}
            nxt = 2 * t * p - q
        elif basis == "legendre":  # (n+1) P_{n+1} = (2n+1) t P_n - n P_{n-1}
            nxt = ((2 * n + 1) * t * p - n * q) / (n + 1)
        elif basis == "hermite":  # H_{n+1} = 2 t H_n - 2 n H_{n-1}
            nxt = 2 * t * p - 2 * n * q
        elif basis == "gegenbauer":  # (n+1) C_{n+1} = 2 (n + a) t C_n - (n + 2a - 1) C_{n-1}
            nxt = (2 * (n + alpha) * t * p - (n + 2 * alpha - 1) * q) / (n + 1)
        else:  # jacobi, the classical three-term recurrence
            a, b = alpha, beta
            s = 2 * n + a + b
            c1 = 2 * (n + 1) * (n + a + b + 1) * s
            c2 = (s + 1) * (a * a - b * b)
            c3 = s * (s + 1) * (s + 2)
            c4 = 2 * (n + a) * (n + b) * (s + 2)
            nxt = ((c2 + c3 * t) * p - c4 * q) / c1
        values.append(nxt)
    return torch.stack(values, dim=-1)


def poly_kan(x, coeffs, bias=None, basis="chebyshev", alpha=1.0, beta=1.0):
    """``y[..., o] = sum_i sum_d coeffs[i, d, o] P_d(tanh x[..., i]) (+ bias[o])`` for x (..., in)."""
    degree = coeffs.shape[1] - 1
    b = basis_values(torch.tanh(x), basis, degree, alpha, beta)
    y = torch.einsum("...id,ido->...o", b, coeffs)
    return y + bias if bias is not None else y


def table_values(t: torch.Tensor, basis: str, degree: int, lut_size: int, alpha: float = 1.0,
                 beta: float = 1.0) -> torch.Tensor:
    """``P_0(t)`` to ``P_degree(t)`` as LUT mode reads them: linearly interpolated in a table of ``lut_size`` points
    on [-1, 1] (the cell of t is ``floor((t + 1) (lut_size - 1) / 2)``, the last cell's right end included)."""
    grid = torch.linspace(-1.0, 1.0, lut_size, dtype=t.dtype, device=t.device)
    table = basis_values(grid, basis, degree, alpha, beta)  # [lut_size, degree + 1]
    s = (t + 1) * ((lut_size - 1) / 2)
    cell = torch.floor(s).clamp(0, lut_size - 2)
    frac = (s - cell).unsqueeze(-1)
    lo, hi = table[cell.long()], table[cell.long() + 1]
    return lo + frac * (hi - lo)


def poly_kan_lut(x, coeffs, lut_size, bias=None, basis="chebyshev", alpha=1.0, beta=1.0):
    """A LUT-mode layer as its ``create_graph=True`` backward and Taylor mode see it.

    The values are ``sum_i sum_d coeffs[i, d, o] P_d^lut(tanh x[..., i])`` (:func:`table_values`), every
    x-derivative (of any order) the exact basis's. (Its first-order backward reads a table of ``P_d'``
    instead, O(h^2) off.)"""
    t = torch.tanh(x)
    exact = basis_values(t, basis, coeffs.shape[1] - 1, alpha, beta)
    # the table's values, the exact basis's derivatives in x (the coefficients see the table's values)
    b = exact + (table_values(t.detach(), basis, coeffs.shape[1] - 1, lut_size, alpha, beta) - exact).detach()
    y = torch.einsum("...id,ido->...o", b, coeffs)
    return y + bias if bias is not None else y


def chebykan_acos(x, cheby_coeffs):
    """ChebyKAN's ``ChebyKANLayer.forward``: ``T_d(t) = cos(d acos t)``; cheby_coeffs [in, out, D + 1]."""
    n_in, n_out, n_basis = cheby_coeffs.shape
    t = torch.tanh(x.reshape(-1, n_in))
    arange = torch.arange(n_basis, device=x.device, dtype=x.dtype)
    b = torch.cos(torch.acos(t).unsqueeze(-1) * arange)
    return torch.einsum("bid,iod->bo", b, cheby_coeffs).reshape(*x.shape[:-1], n_out)


def chebyshev_recurrence_einsum(x, cheby_coeffs):
    """The recurrence + einsum form of the same layer; cheby_coeffs [in, out, D + 1]."""
    n_in, n_out, n_basis = cheby_coeffs.shape
    b = basis_values(torch.tanh(x.reshape(-1, n_in)), "chebyshev", n_basis - 1)
    return torch.einsum("bid,iod->bo", b, cheby_coeffs).reshape(*x.shape[:-1], n_out)
