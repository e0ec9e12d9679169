"""The symbolic side of a KAN layer, below the edge evaluation and the fitting that both take it: the library of
functions an edge can be fixed to (:class:`SymbolicFunction`, :data:`SYMBOLIC_LIB`), the record of one fit
(:class:`SymbolicFit`), the layer with some edges fixed to formulas (:class:`SymbolicLayer`) and the chain of
them (:class:`SymbolicKAN`), and how any model the tools take is laid out as a chain of layers
(:func:`network_layers`). sympy is imported when first needed."""

from __future__ import annotations

import copy
import importlib
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from .. import _checks
from ..torch_bridge import KATMLP
from . import _layers
from ._edge_values import edge_values

__all__ = ["SymbolicFunction", "SymbolicFit", "SYMBOLIC_LIB", "SymbolicLayer", "SymbolicKAN", "network_layers",
           "single_layer", "numeric_layer", "check_edge_index", "load_sympy"]


def load_sympy():
    """The sympy module (the ``interpret`` extra), imported at its first use."""
    return importlib.import_module("sympy")


@dataclass(frozen=True)
class SymbolicFunction:
    """A library function f for the fits ``a f(b x + c) + d``: its numpy form (the fits), torch form (the
    :class:`SymbolicKAN` forward), sympy form (:func:`formula`) and complexity (pykan's ranking).
    ``normalize`` optionally maps fitted (a, b, c, d) to an equal function with simpler constants (for
    example b = 1 for powers), for readable formulas. ``constants``: how many of (a, b, c, d) are free
    (fewer where f's symmetries absorb some: 3 for ``a (x + c)^2 + d``, 2 for ``a x + d``); among fits of
    equal complexity within ``r2_tolerance`` of each other, fewer constants win."""

    name: str
    numpy: Callable
    torch: Callable
    sympy: Callable
    complexity: float
    normalize: Callable | None = None
    constants: int = 4


def _power(p: float, parity: int):
    """f(s u) = s^p f(u) for s > 0; parity +1: f(-u) = f(u), -1: f(-u) = -f(u), 0: neither."""

    def normalize(a, b, c, d):
        s = abs(b)
        if s == 0:
            return a, b, c, d
        a, b, c = a * s**p, b / s, c / s
        if b < 0 and parity:
            a, b, c = a * parity, 1.0, -c
        return a, b, c, d

    return normalize


def _exp_shift(a, b, c, d):
    return a * math.exp(c), b, 0.0, d


def _log_scale(a, b, c, d):
    s = abs(b)
    if s == 0:
        return a, b, c, d
    return a, b / s, c / s, d + a * math.log(s)


def _linear(a, b, c, d):
    return a * b, 1.0, 0.0, a * c + d


def _sine(a, b, c, d):
    """a sin(b x + c) = -a sin(-b x - c) = -a sin(b x + c - pi): b > 0 and |c| <= pi / 2."""
    if b < 0:
        a, b, c = -a, -b, -c
    c = math.remainder(c, 2 * math.pi)  # in [-pi, pi]
    if abs(c) > math.pi / 2:
        a, c = -a, c - math.copysign(math.pi, c)
    return a, b, c, d


def _odd(a, b, c, d):
    """f(-u) = -f(u): b > 0."""
    return (-a, -b, -c, d) if b < 0 else (a, b, c, d)


def _even(a, b, c, d):
    """f(-u) = f(u): b > 0."""
    return (a, -b, -c, d) if b < 0 else (a, b, c, d)


def _sp(name: str):
    return lambda u: getattr(load_sympy(), name)(u)


SYMBOLIC_LIB: dict[str, SymbolicFunction] = {
    f.name: f
    for f in (
        SymbolicFunction("x", lambda u: u, lambda u: u, lambda u: u, 1, _linear, 2),
        SymbolicFunction("x^2", lambda u: u**2, lambda u: u**2, lambda u: u**2, 2, _power(2, 1), 3),
        SymbolicFunction("x^3", lambda u: u**3, lambda u: u**3, lambda u: u**3, 3, _power(3, -1), 3),
        SymbolicFunction("exp", np.exp, torch.exp, _sp("exp"), 2, _exp_shift, 3),
        SymbolicFunction("log", np.log, torch.log, _sp("log"), 2, _log_scale, 3),
        SymbolicFunction("sin", np.sin, torch.sin, _sp("sin"), 2, _sine),
        SymbolicFunction("tanh", np.tanh, torch.tanh, _sp("tanh"), 3, _odd),
        SymbolicFunction("sqrt", np.sqrt, torch.sqrt, _sp("sqrt"), 2, _power(0.5, 0), 3),
        SymbolicFunction("1/x", lambda u: 1 / u, lambda u: 1 / u, lambda u: 1 / u, 2, _power(-1, -1), 3),
        SymbolicFunction("abs", np.abs, torch.abs, _sp("Abs"), 3, _power(1, 1), 3),
        SymbolicFunction("gaussian", lambda u: np.exp(-(u**2)), lambda u: torch.exp(-(u**2)),
                         lambda u: load_sympy().exp(-(u**2)), 3, _even),
    )
}
"""The default library: pykan's functions and complexities for x, x^2, x^3, exp, log, sin, tanh, sqrt, 1/x, abs and
gaussian. Add a :class:`SymbolicFunction` to extend it, or pass ``lib``. (pykan's library also holds "0", whose
R^2 of 0 its ranking prefers to any fit below R^2 ~ 0.996; identically zero edges are left out here instead.)"""


@dataclass(frozen=True)
class SymbolicFit:
    """One candidate for an edge: ``a f(b x + c) + d`` with f = ``SYMBOLIC_LIB[name]`` (or the function
    passed in ``lib``), its R^2 on the edge's points, complexity and pykan's ranking score (lower is better)."""

    name: str
    a: float
    b: float
    c: float
    d: float
    r2: float
    complexity: float
    score: float


class SymbolicLayer(nn.Module):
    """A KAN layer with some edges replaced by formulas: ``y = numeric(x) + sum over fixed edges (o, i) of
    a f(b x_i + c) + d`` into output o, where ``numeric`` is a copy of the layer whose fixed edges are zero
    (their parameters are masked in the forward, so training does not revive them). ``affine`` [F, 4] holds
    the trainable (a, b, c, d) of the F fixed edges."""

    def __init__(self, layer, fixed: Sequence = (), functions: dict | None = None):
        super().__init__()
        _layers.check_edge_layer("layer", layer)
        self.in_features, self.out_features = layer.in_features, layer.out_features
        dtype, device = _layers.layer_dtype_device(layer)
        functions = {**SYMBOLIC_LIB, **(functions or {})}
        keep = torch.ones(self.out_features, self.in_features, dtype=torch.bool, device=device)
        outs, ins, names, affine = [], [], [], []
        for o, i, fit in fixed:
            check_edge_index(self, o, i)
            if not keep[o, i]:
                raise ValueError(f"edge ({o}, {i}) is fixed twice")
            if fit.name not in functions:
                raise ValueError(f"unknown symbolic function {fit.name!r}")
            keep[o, i] = False
            outs.append(o), ins.append(i), names.append(fit.name), affine.append((fit.a, fit.b, fit.c, fit.d))
        self.numeric = copy.deepcopy(layer)
        _layers.zero_edges(self.numeric, keep)
        self.register_buffer("keep", keep)
        self.register_buffer("fixed_out", torch.tensor(outs, dtype=torch.long, device=device))
        self.register_buffer("fixed_in", torch.tensor(ins, dtype=torch.long, device=device))
        self.names = names
        self.functions = {name: functions[name] for name in set(names)}
        self.affine = nn.Parameter(torch.tensor(affine, dtype=dtype, device=device).reshape(len(names), 4))
        self.r2 = {(o, i): fit.r2 for o, i, fit in fixed}

    def fixed_edges(self):
        """(o, i, SymbolicFit-like record) of every fixed edge, with the current (a, b, c, d)."""
        for index, (o, i, name) in enumerate(zip(self.fixed_out.tolist(), self.fixed_in.tolist(), self.names)):
            a, b, c, d = self.affine[index].tolist()
            f = self.functions[name]
            yield o, i, SymbolicFit(name, a, b, c, d, self.r2.get((o, i), math.nan), f.complexity, math.nan)

    def numeric_live_edges(self) -> Tensor:
        return _layers.live_edges(self.numeric) & self.keep

    def _symbolic_terms(self, x: Tensor):
        """(output index, [N, group] values) of each group of fixed edges with one function."""
        a, b, c, d = self.affine.unbind(1)
        for name in sorted(self.functions):
            index = torch.tensor([k for k, n in enumerate(self.names) if n == name], device=x.device)
            u = b[index] * x[:, self.fixed_in[index]] + c[index]
            yield index, a[index] * self.functions[name].torch(u) + d[index]

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        mask = self.keep.to(self.affine.dtype)
        params = dict(self.numeric.named_parameters())
        masked = {name: params[name] * multiplier(mask) for name, multiplier in _layers.edge_params(self.numeric)}
        y = torch.func.functional_call(self.numeric, masked, (x2,))
        for index, values in self._symbolic_terms(x2):
            y = y.index_add(1, self.fixed_out[index], values.to(y.dtype))
        return y.reshape(*lead, self.out_features)

    def edge_values(self, points: Tensor, numeric_only: bool = False, centered: bool = False) -> Tensor:
        """[n, out, in] edge values at points [n, in] (numeric edges by the layer's kernels, fixed ones by their
        formulas, or zero with ``numeric_only``), differentiable in the parameters and the points; ``centered``:
        see ``warpkan.interpret._edge_values.edge_values``."""
        y = edge_values(self.numeric, points, centered) * self.keep.to(points.dtype)
        if numeric_only:
            return y
        by_edge = y.permute(1, 2, 0)  # [out, in, n]
        for index, values in self._symbolic_terms(points):
            values = values - values[:1] if centered else values
            by_edge = by_edge.index_put((self.fixed_out[index], self.fixed_in[index]), values.to(y.dtype).t(),
                                        accumulate=True)
        return by_edge.permute(2, 0, 1)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fixed_edges={len(self.names)}"


class SymbolicKAN(nn.Module):
    """A chain of :class:`SymbolicLayer` (what :func:`auto_symbolic` returns); a torch module like the
    network it came from, whose fixed edges' (a, b, c, d) can be fine-tuned by any torch optimiser."""

    def __init__(self, layers: Sequence[SymbolicLayer]):
        super().__init__()
        for index, layer in enumerate(layers):
            if not isinstance(layer, SymbolicLayer):
                raise TypeError(f"layers[{index}] must be a SymbolicLayer, got {type(layer).__name__}")
        _layers.check_chain(list(layers), "layers")
        self.layers = nn.ModuleList(layers)

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


# ------------------------------------------------------------------------------------------------ networks
def network_layers(model, name: str = "model") -> list:
    """The chain of layers of ``model``: one supported layer, an ``nn.Sequential`` of them, a ``KATMLP``, a
    ``SymbolicKAN``, or a Warp-native layer / ``KANNetwork`` (converted to the torch layer with the same
    parameters)."""
    if _layers.is_edge_layer(model) or isinstance(model, SymbolicLayer):
        return [model]
    if isinstance(model, SymbolicKAN):
        return list(model.layers)
    if isinstance(model, KATMLP):
        return [model.fc1, model.fc2]
    if isinstance(model, nn.Sequential):
        layers = list(model)
        for index, layer in enumerate(layers):
            if not (_layers.is_edge_layer(layer) or isinstance(layer, SymbolicLayer)):
                raise TypeError(f"{name}[{index}] must be a {_layers.SUPPORTED} layer, got {type(layer).__name__}")
        if not layers:
            raise ValueError(f"{name} must not be empty")
        return layers
    native = _layers.from_native(model)
    if native is not None:
        return native
    raise TypeError(f"{name} must be a {_layers.SUPPORTED} layer, an nn.Sequential of them, a KATMLP, a SymbolicKAN "
                    f"or a Warp-native layer or KANNetwork, got {type(model).__name__}")


def single_layer(layer):
    """``layer`` itself when it is one edge layer or SymbolicLayer, else the one layer of a network of one
    (:func:`network_layers`); TypeError for a network of several."""
    if _layers.is_edge_layer(layer) or isinstance(layer, SymbolicLayer):
        return layer
    layers = network_layers(layer, "layer")
    if len(layers) != 1:
        raise TypeError(f"layer must be a single layer, got a network of {len(layers)} layers")
    return layers[0]


def check_edge_index(layer, o, i) -> None:
    """Edge (o, i) of ``layer``: ints in range, else an error naming o or i."""
    for name, value, size in (("o", o, layer.out_features), ("i", i, layer.in_features)):
        _checks.int_in_range(name, value, 0, size - 1)


def numeric_layer(layer):
    """The KAN layer holding a layer's numeric edges (a SymbolicLayer's copy, or the layer itself)."""
    return layer.numeric if isinstance(layer, SymbolicLayer) else layer
