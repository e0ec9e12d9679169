"""Taylor mode: a network's output and its first and second derivatives in the inputs, in one forward pass.

A physics-informed loss needs u's derivatives in the coordinates. ``torch.autograd.grad(..., create_graph=True)``
gets them by differentiating the backward pass (every warpkan KAN layer supports that); Taylor mode instead
carries them forward, layer by layer, as a *jet*: the values, their first derivatives along every input
coordinate, and their second derivatives along the pairs of coordinates asked for. A loss built from the jet
trains with one ordinary ``loss.backward()``. For a 2-32-32-1 heat-equation PINN on the GPU machine this is
several times faster than the autograd route (``warpkan bench pinn``).

    u = jet(model, xt, pairs=[(0, 0)])              # xt [N, 2] = (x, t)
    loss = (u.d(1) - nu * u.d2(0, 0)).square().mean()   # u_t and u_xx, [N, out] each
    loss.backward()

Jets combine (``+``, ``-``, ``*`` with jets or constants, ``.map(f)`` for an elementwise function given with its
first two derivatives, ``.col(k)``), so an ansatz that builds the boundary conditions in stays in Taylor mode:
with ``z = jet(nn.Identity(), xt, pairs)`` the coordinates' own jet, ``u = z.col(0).map(sin) + z.col(1) *
jet_of(model, z)``.

Rules exist for ``nn.Sequential``, :class:`~warpkan.torch_bridge.KANLinear` (any grid, spline order and
strategy; SiLU base path fused, any other base activation with a rule of its own), ``PolyKANLinear`` /
``ChebyKANLinear`` (exact and LUT modes: a LUT layer's values are its tables', every derivative is the exact
basis's, as in its ``create_graph=True`` route), ``GroupRational``, ``GRKANLinear`` and ``KATMLP`` (F, F' and F''
from the group-rational Taylor-series kernels), ``UKANLinear`` on its dense-range table, ``nn.Linear``,
``nn.Identity`` and the elementwise activations ``nn.Tanh``, ``nn.Sigmoid``, ``nn.SiLU``, ``nn.Softplus``
(beta and threshold as set; the threshold's linear branch included) and ``nn.GELU`` (exact and tanh).
:func:`register_jet_rule` adds one for any other module, :func:`elementwise_rule` builds one from a function and
its first two derivatives. The KAN layers' rule runs the edge engine's Taylor-mode kernels (one expansion and
one GEMM per layer forward, two GEMMs and one kernel backward; :mod:`warpkan.torch_bridge.jet_ops`); the others
are torch ops.

Derivatives go up to the second order, through the layers' dtype at full precision (float32 GEMMs with TF32
off), and the jet is differentiable once (``loss.backward()``; a ``create_graph=True`` backward through it is
refused). A UKANLinear whose range needs its touched-pair table (wider than ``dense_max_coefficients``) is
refused by name: use the autograd route for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .edge_driver import EdgeView
from .jet_ops import check_pairs, edge_jet
from .kan_linear import KANLinear
from .poly import PolyKANLinear
from .rational import KATMLP, GroupRational, GRKANLinear
from .rational_higher import derivative
from .ukan import UKANLinear

__all__ = ["Jet", "jet", "jet_of", "register_jet_rule", "elementwise_rule"]


@dataclass(frozen=True)
class Jet:
    """Values and derivatives of a tensor of shape (N, d) in the network's inputs x_0 .. x_{D-1}.

    ``stack`` [1 + D + P, N, d]: the values, then d/dx_a for a = 0..D-1, then d2/dx_a dx_b for each of
    ``pairs`` (P of them) in order."""

    stack: Tensor
    n_first: int
    pairs: tuple

    @property
    def value(self) -> Tensor:
        return self.stack[0]

    @property
    def first(self) -> Tensor:
        """[D, N, d]: the first derivatives along every input coordinate."""
        return self.stack[1:1 + self.n_first]

    @property
    def second(self) -> Tensor:
        """[P, N, d]: the second derivatives along ``pairs``."""
        return self.stack[1 + self.n_first:]

    def d(self, a: int) -> Tensor:
        """d/dx_a, [N, d]."""
        if not 0 <= a < self.n_first:
            raise IndexError(f"direction {a} is not one of the {self.n_first} input coordinates")
        return self.stack[1 + a]

    def d2(self, a: int, b: int) -> Tensor:
        """d2/dx_a dx_b, [N, d]: (a, b) or (b, a) must be among the pairs the jet was made with."""
        for p, pair in enumerate(self.pairs):
            if pair in ((a, b), (b, a)):
                return self.stack[1 + self.n_first + p]
        raise KeyError(f"the jet carries the second derivatives {list(self.pairs)}, not ({a}, {b}): pass it in "
                       "pairs= to taylor.jet")

    def with_stack(self, stack: Tensor) -> Jet:
        return Jet(stack, self.n_first, self.pairs)

    def col(self, k: int) -> Jet:
        """Feature k alone (shape (N, 1)): e.g. a coordinate of ``jet(nn.Identity(), x, pairs)``."""
        return self.with_stack(self.stack[..., k:k + 1])

    def map(self, f: Callable[[Tensor], tuple]) -> Jet:
        """An elementwise function of the jet: ``f(z) -> (f(z), f'(z), f''(z))``."""
        return _elementwise(self, *f(self.value))

    # arithmetic with jets of the same directions and pairs, and with constants (tensors broadcasting to the
    # values, or numbers): an ansatz u = g(x) + h(x) N(x) that builds boundary conditions in
    def _other(self, other) -> "Jet | None":
        if isinstance(other, Jet):
            if other.n_first != self.n_first or other.pairs != self.pairs:
                raise ValueError("jets of different directions or pairs do not combine")
            return other
        return None

    def __add__(self, other) -> Jet:
        jet_other = self._other(other)
        if jet_other is not None:
            return self.with_stack(self.stack + jet_other.stack)
        return self.with_stack(torch.cat([(self.stack[0] + other).unsqueeze(0), self.stack[1:]]))

    __radd__ = __add__

    def __neg__(self) -> Jet:
        return self.with_stack(-self.stack)

    def __sub__(self, other) -> Jet:
        return self + (-other)

    def __rsub__(self, other) -> Jet:
        return (-self) + other

    def __mul__(self, other) -> Jet:
        jet_other = self._other(other)
        if jet_other is None:  # a constant scales every component
            return self.with_stack(self.stack * other)
        a, b = self, jet_other
        parts = [(a.value * b.value).unsqueeze(0), a.first * b.value + a.value * b.first]
        for p, (i, j) in enumerate(self.pairs):
            second = a.second[p] * b.value + a.value * b.second[p]
            parts.append((second + a.d(i) * b.d(j) + a.d(j) * b.d(i)).unsqueeze(0))
        return self.with_stack(torch.cat(parts))

    __rmul__ = __mul__


_RULES: dict[type, Callable[[nn.Module, Jet], Jet]] = {}


def register_jet_rule(module_type: type, rule: Callable[[nn.Module, Jet], Jet]) -> None:
    """Use ``rule(module, jet) -> Jet`` for modules of ``module_type`` (and its subclasses without a rule of
    their own)."""
    if not (isinstance(module_type, type) and issubclass(module_type, nn.Module)):
        raise TypeError(f"module_type must be an nn.Module subclass, got {module_type!r}")
    _RULES[module_type] = rule


def jet_of(module: nn.Module, x: Jet) -> Jet:
    """The output jet of ``module`` for the input jet ``x`` (by the registered rule of its type)."""
    for cls in type(module).__mro__:
        rule = _RULES.get(cls)
        if rule is not None:
            return rule(module, x)
    raise TypeError(f"taylor.jet: no Taylor-mode rule for {type(module).__name__}; rules exist for "
                    f"{sorted(c.__name__ for c in _RULES)}. Register one with warpkan.torch_bridge.taylor."
                    "register_jet_rule (elementwise_rule builds one for an activation), or use "
                    "torch.autograd.grad(..., create_graph=True), which every warpkan KAN layer supports")


def jet(model: nn.Module, x: Tensor, pairs=()) -> Jet:
    """The jet of ``model(x)`` for x [N, D] (or (..., D), flattened to rows): its values, its first derivatives
    along each of the D coordinates, and its second derivatives along ``pairs`` ((a, b) coordinate indices,
    e.g. ``[(0, 0)]`` for u_xx, ``[(0, 0), (1, 1)]`` for a 2-D Laplacian, ``(0, 1)`` for a mixed one)."""
    if not isinstance(x, Tensor) or x.dim() < 1 or not x.is_floating_point():
        raise TypeError(f"taylor.jet: x must be a floating-point tensor (..., D), got "
                        f"{type(x).__name__ if not isinstance(x, Tensor) else tuple(x.shape)}")
    n_first = x.shape[-1]
    pairs = check_pairs(pairs, n_first)
    rows = x.reshape(-1, n_first)
    seeds = torch.eye(n_first, dtype=x.dtype, device=x.device).unsqueeze(1).expand(n_first, rows.shape[0], n_first)
    stack = torch.cat([rows.unsqueeze(0), seeds, rows.new_zeros((len(pairs), rows.shape[0], n_first))])
    out = jet_of(model, Jet(stack, n_first, pairs))
    if x.dim() != 2:
        out = out.with_stack(out.stack.reshape(out.stack.shape[0], *x.shape[:-1], out.stack.shape[-1]))
    return out


# ------------------------------------------------------------------------------------------------ rules
def _sequential(module: nn.Sequential, x: Jet) -> Jet:
    for layer in module:
        x = jet_of(layer, x)
    return x


def _identity(module: nn.Module, x: Jet) -> Jet:
    return x


def _linear(module: nn.Linear, x: Jet) -> Jet:
    out = x.with_stack(torch.matmul(x.stack, module.weight.t()))
    return out if module.bias is None else out + module.bias  # a constant adds to the values alone


def _elementwise(x: Jet, value: Tensor, d1: Tensor, d2: Tensor) -> Jet:
    """y = f(z), y_a = f'(z) z_a, y_ab = f''(z) z_a z_b + f'(z) z_ab, given f, f' and f'' at the values."""
    parts = [value.unsqueeze(0), d1 * x.first]
    # pair by pair: an index tensor would be a host-to-device copy, which CUDA-graph capture refuses
    for p, (a, b) in enumerate(x.pairs):
        parts.append((d2 * x.d(a) * x.d(b) + d1 * x.second[p]).unsqueeze(0))
    return x.with_stack(torch.cat(parts))


def elementwise_rule(f: Callable[[nn.Module, Tensor], tuple]) -> Callable[[nn.Module, Jet], Jet]:
    """A rule for an elementwise activation module: ``f(module, z) -> (f(z), f'(z), f''(z))``."""

    def rule(module: nn.Module, x: Jet) -> Jet:
        return _elementwise(x, *f(module, x.value))

    return rule


def _tanh(module, z):
    t = torch.tanh(z)
    d1 = 1 - t * t
    return t, d1, -2 * t * d1


def _sigmoid(module, z):
    s = torch.sigmoid(z)
    d1 = s * (1 - s)
    return s, d1, d1 * (1 - 2 * s)


def _silu(module, z):
    s = torch.sigmoid(z)
    d1 = s * (1 + z * (1 - s))
    return z * s, d1, s * (1 - s) * (2 + z * (1 - 2 * s))


def _softplus(module, z):
    beta, threshold = module.beta, module.threshold
    bz = beta * z
    s = torch.sigmoid(bz)
    linear = bz > threshold  # torch's softplus is z itself there
    value = torch.where(linear, z, F.softplus(z, beta, threshold))
    return value, torch.where(linear, torch.ones_like(z), s), torch.where(linear, torch.zeros_like(z),
                                                                           beta * s * (1 - s))


def _gelu(module, z):
    if module.approximate == "tanh":
        c = math.sqrt(2 / math.pi)
        inner = c * (z + 0.044715 * z ** 3)
        t = torch.tanh(inner)
        d_inner = c * (1 + 3 * 0.044715 * z * z)
        sech2 = 1 - t * t
        d1 = 0.5 * (1 + t) + 0.5 * z * sech2 * d_inner
        d2 = sech2 * d_inner + 0.5 * z * (-2 * t * sech2 * d_inner * d_inner + sech2 * c * 6 * 0.044715 * z)
        return 0.5 * z * (1 + t), d1, d2
    pdf = torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + torch.erf(z / math.sqrt(2)))
    return z * cdf, cdf + z * pdf, pdf * (2 - z * z)


def _check_layer_input(name: str, x: Jet, dtype: torch.dtype, device: torch.device, in_features: int) -> None:
    if x.stack.dtype != dtype or x.stack.device != device:
        raise TypeError(f"taylor.jet: {name} needs x of its dtype and device ({dtype}, {device}), got "
                        f"{x.stack.dtype} on {x.stack.device}")
    if x.stack.shape[-1] != in_features:
        raise ValueError(f"taylor.jet: {name} takes {in_features} inputs, the jet has {x.stack.shape[-1]}")


def _rows(x: Jet) -> Tensor:
    return x.stack.contiguous()


def _edge_layer(x: Jet, z: Tensor, view: EdgeView) -> Jet:
    """An edge layer's jet from its view at the values (``layer.edge_view``): the edge op on the combined weight
    (made by the combine kernel; a SiLU base path fused), any other base activation by its own rule and a
    linear map."""
    out = x.with_stack(edge_jet(z, view.weight(by_kernel=True), view.bias, x.n_first, x.pairs, view.spec))
    if view.base_activation is None:
        return out
    base = jet_of(view.base_activation, x)
    return out.with_stack(out.stack + torch.matmul(base.stack, view.base_weight_t))


def _kan_linear(layer, x: Jet) -> Jet:
    _check_layer_input("KANLinear", x, layer.grid.dtype, layer.grid.device, layer.in_features)
    z = _rows(x)
    return _edge_layer(x, z, layer.edge_view(z[0]))


def _poly_kan_linear(layer, x: Jet) -> Jet:
    """A polynomial layer's jet; in LUT mode its values from the value table and every derivative from the
    exact recurrence (``edge_view(..., exact_derivatives=True)``), as in its ``create_graph=True`` route."""
    _check_layer_input(type(layer).__name__, x, layer.coeffs.dtype, layer.coeffs.device, layer.in_features)
    z = _rows(x)
    return _edge_layer(x, z, layer.edge_view(z[0], exact_derivatives=True))


def _ukan_linear(layer, x: Jet) -> Jet:
    """UKANLinear on its dense-range table (the CG-MLP's coefficients on each feature's groups from the lowest
    the values touch, as its forward builds them): the table by torch ops, the spline by the edge op. A layer
    whose forward takes the touched-pair table at these values (its range does not fit
    ``dense_max_coefficients``), which has no dense basis, is refused, as is the read-back of the range under
    CUDA-graph capture (``table_groups=None``)."""
    _check_layer_input("UKANLinear", x, layer.spline_scaler.dtype, layer.spline_scaler.device, layer.in_features)
    z = _rows(x)
    try:
        view = layer.edge_view(z[0], dense_only=True)
    except NotImplementedError as error:
        raise NotImplementedError(f"taylor.jet: {error}; there is no Taylor-mode rule for that table: use "
                                  "torch.autograd.grad(..., create_graph=True)") from error
    return _edge_layer(x, z, view)


def _group_rational(module, x: Jet) -> Jet:
    """F, F' and F'' of the group-rational activation at the values: its Taylor-series kernels (float32
    arithmetic for float32 and narrower layers, float64 for float64), differentiable in x and the coefficients."""
    z = x.value
    dtype = torch.float64 if z.dtype == torch.float64 else torch.float32
    zc = z.to(dtype)
    a, b = module.weight_numerator.to(dtype), module.weight_denominator.to(dtype)
    f0, f1, f2 = (derivative(zc, a, b, None, None, k, module.variant).to(z.dtype) for k in range(3))
    return _elementwise(x, f0, f1, f2)


def _register_builtin() -> None:
    register_jet_rule(nn.Sequential, _sequential)
    register_jet_rule(nn.Identity, _identity)
    register_jet_rule(nn.Linear, _linear)
    for module_type, f in ((nn.Tanh, _tanh), (nn.Sigmoid, _sigmoid), (nn.SiLU, _silu), (nn.Softplus, _softplus),
                           (nn.GELU, _gelu)):
        register_jet_rule(module_type, elementwise_rule(f))
    register_jet_rule(KANLinear, _kan_linear)
    register_jet_rule(PolyKANLinear, _poly_kan_linear)
    register_jet_rule(UKANLinear, _ukan_linear)
    register_jet_rule(GroupRational, _group_rational)
    register_jet_rule(GRKANLinear, lambda layer, x: jet_of(layer.linear, jet_of(layer.rational, x)))
    register_jet_rule(KATMLP, lambda mlp, x: jet_of(mlp.fc2, jet_of(mlp.fc1, x)))


_register_builtin()
