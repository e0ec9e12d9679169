"""Symbolic fitting of KAN edges (pykan's ``suggest_symbolic`` / ``auto_symbolic`` / ``symbolic_formula``).

Each edge is fitted by least squares to ``a f(b x + c) + d`` for every function f of a library. For a given
(b, c) the best a and d are a linear least-squares problem, so only (b, c) is searched: a coarse grid of
(b, c) ranks starting points by R^2 and ``scipy.optimize.least_squares`` refines the best few (the residual
solves for a and d at each (b, c)), both on the edge's inputs mapped onto [-1, 1], so that the (b, c) ranges
do not depend on the spread of a hidden node's activations. Candidates are ranked as pykan ranks them: by
``weight_simple * complexity + (1 - weight_simple) * log2(1 + 1e-5 - R^2)``; then the simplest candidate whose
R^2 is within ``r2_tolerance`` of the top-ranked one takes the lead (lowest complexity, then fewest free
constants). The second rule matters because the four-constant functions reach the three-constant ones as
limits: ``a cos(b x) + d`` with b -> 0 (and a ~ 1/b^2) becomes a parabola, ``a tanh(b x + c) + d`` with
c -> -inf an exponential, so on an edge that is a parabola up to small errors the cosine's extra freedom fits
the errors and wins on R^2 alone, with huge constants.

:func:`auto_symbolic` returns a :class:`SymbolicKAN`: the network with the edges whose best fit reaches the
R^2 threshold replaced by their formulas (trainable ``a, b, c, d``; the other edges stay numeric), a torch
module that can be fine-tuned, plotted and turned into a sympy expression by :func:`formula`.

scipy and sympy are needed here (the ``interpret`` extra); they are imported when first used.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from . import _layers
from ._symbolic_layer import (SYMBOLIC_LIB, SymbolicFit, SymbolicFunction, SymbolicKAN, SymbolicLayer,
                              check_edge_index, load_sympy, network_layers, single_layer)
from .edges import edge_functions, edge_points

__all__ = ["SymbolicFunction", "SymbolicFit", "SYMBOLIC_LIB", "suggest_symbolic", "auto_symbolic", "formula",
           "SymbolicLayer", "SymbolicKAN"]


def _library(lib) -> list[SymbolicFunction]:
    if lib is None:
        return list(SYMBOLIC_LIB.values())
    functions = []
    for item in lib:
        if isinstance(item, SymbolicFunction):
            functions.append(item)
        elif item in SYMBOLIC_LIB:
            functions.append(SYMBOLIC_LIB[item])
        else:
            raise ValueError(f"lib: unknown function {item!r}; known: {sorted(SYMBOLIC_LIB)} (or pass a "
                             "SymbolicFunction)")
    if not functions:
        raise ValueError("lib must name at least one function")
    return functions


def _score(r2: float, complexity: float, weight_simple: float) -> float:
    # pykan's ranking: weight_simple * complexity + (1 - weight_simple) * log2(1 + 1e-5 - r2)
    return weight_simple * complexity + (1 - weight_simple) * math.log2(1 + 1e-5 - min(r2, 1.0))


def _affine_fit(values: np.ndarray, y: np.ndarray) -> tuple[float, float, np.ndarray]:
    """(a, d, residual) of the least-squares fit y ~ a values + d."""
    design = np.stack([values, np.ones_like(values)], axis=1)
    (a, d), *_ = np.linalg.lstsq(design, y, rcond=None)
    return float(a), float(d), design @ np.array([a, d]) - y


def fit_function(x: np.ndarray, y: np.ndarray, function: SymbolicFunction, b_range=(-10.0, 10.0),
                 c_range=(-10.0, 10.0), grid: int = 51, starts: int = 3,
                 weight_simple: float = 0.8) -> SymbolicFit:
    """Least-squares fit of y ~ a f(b x + c) + d on 1-D float arrays (finite pairs only).

    The search runs on x mapped onto [-1, 1] (by its smallest and largest values), where ``b_range`` and
    ``c_range`` bound the starting points; the result is mapped back. So the ranges are relative to the spread of
    x: an edge of a hidden node whose activations span 0.2 needs a b five times larger than on [-1, 1], which
    fixed ranges would miss (``a exp(12 x)`` on [-0.125, 0.125] would then be fitted far better by a tanh with
    huge constants, ``a tanh(b x + c)`` with c -> -inf being an exponential)."""
    from scipy.optimize import least_squares

    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    finite = np.isfinite(x) & np.isfinite(y)
    x, y = x[finite], y[finite]
    if x.size == 0:
        raise ValueError("an edge needs at least one finite point to be fitted")
    # x = centre + half t with t in [-1, 1]; b x + c = (b half) t + (c + b centre)
    lo, hi = float(x.min()), float(x.max())
    centre, half = (lo + hi) / 2, (hi - lo) / 2
    if not (math.isfinite(half) and half > 0):
        centre, half = 0.0, 1.0
    x = (x - centre) / half
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    scale = math.sqrt(ss_tot / x.size) + abs(float(y.mean())) + 1.0

    def evaluate(b, c):
        with np.errstate(all="ignore"):
            values = function.numpy(b * x + c)
        return values if np.all(np.isfinite(values)) else None

    def residual(p):
        values = evaluate(p[0], p[1])
        if values is None:  # out of f's domain somewhere: a large, flat cost the trust region backs away from
            return np.full(x.shape, 1e3 * scale)
        return _affine_fit(values, y)[2]

    # starting points: a coarse (b, c) grid on at most 256 of the points, ranked by R^2 (the squared correlation
    # of f(b x + c) with y, which is the R^2 of the best a, d)
    sub = np.linspace(0, x.size - 1, min(x.size, 256)).astype(np.int64)
    xs, ys = x[sub], y[sub] - y[sub].mean()
    bs, cs = np.linspace(*b_range, grid), np.linspace(*c_range, grid)
    with np.errstate(all="ignore"):
        values = function.numpy(bs[:, None, None] * xs + cs[None, :, None])
        values = np.broadcast_to(values, (grid, grid, xs.size))
        centred = values - values.mean(-1, keepdims=True)
        power = np.sum(centred**2, -1)
        corr2 = (centred @ ys) ** 2 / (power * float(ys @ ys))
    usable = np.all(np.isfinite(values), -1) & (power > 0) & np.isfinite(corr2)
    ranked = np.argsort(np.where(usable, -corr2, np.inf), axis=None)[: max(starts, 1)]
    candidates = [(bs[i // grid], cs[i % grid]) for i in ranked if usable.flat[i]] or [(1.0, 0.0)]

    best = None
    for b0, c0 in candidates:
        if evaluate(b0, c0) is None:
            continue
        # unit x_scale: on t in [-1, 1], b and c have like scales; scaling by the Jacobian would send a constant
        # that the residual does not depend on (exp's c, absorbed by a) on long walks that end far from the fit
        solution = least_squares(residual, np.array([b0, c0]), method="trf")
        b, c = (float(v) for v in solution.x)
        values = evaluate(b, c)
        if values is None:
            continue
        a, d, res = _affine_fit(values, y)
        ss_res = float(res @ res)
        if best is None or ss_res < best[0]:
            best = (ss_res, a, b, c, d)
    if best is None:
        return SymbolicFit(function.name, 0.0, 1.0, 0.0, float(y.mean()), -math.inf, function.complexity, math.inf)
    ss_res, a, b, c, d = best
    b, c = b / half, c - b * centre / half  # back from t to x
    if ss_tot > 0:
        r2 = 1.0 - ss_res / ss_tot
    else:  # a constant edge: every candidate that reproduces it is exact
        r2 = 1.0 if ss_res <= 1e-24 * max(1.0, float(y @ y)) else 0.0
    if function.normalize is not None:
        a, b, c, d = (float(v) for v in function.normalize(a, b, c, d))
    return SymbolicFit(function.name, a, b, c, d, r2, function.complexity,
                       _score(r2, function.complexity, weight_simple))


def _rank(x: np.ndarray, y: np.ndarray, functions, weight_simple, b_range, c_range,
          r2_tolerance: float = 0.0) -> list[SymbolicFit]:
    fits = [fit_function(x, y, f, b_range, c_range, weight_simple=weight_simple) for f in functions]
    return _simplest_first(sorted(fits, key=lambda fit: (fit.score, -fit.r2)), functions, r2_tolerance)


def _simplest_first(fits: list[SymbolicFit], functions, r2_tolerance: float) -> list[SymbolicFit]:
    """``fits`` (ranked) with the simplest fit whose R^2 is within ``r2_tolerance`` of the top-ranked one moved to
    the front: lowest complexity, then fewest free constants, then the ranking's order."""
    if not fits or r2_tolerance <= 0 or not math.isfinite(fits[0].r2):
        return fits
    constants = {f.name: f.constants for f in functions}
    close = [fit for fit in fits if fit.r2 >= fits[0].r2 - r2_tolerance]
    simplest = min(close, key=lambda fit: (fit.complexity, constants.get(fit.name, 4)))
    return [simplest] + [fit for fit in fits if fit is not simplest]


def _check_tolerance(r2_tolerance) -> float:
    if isinstance(r2_tolerance, bool) or not isinstance(r2_tolerance, (int, float)) or not r2_tolerance >= 0:
        raise ValueError(f"r2_tolerance must be a number >= 0, got {r2_tolerance!r}")
    return float(r2_tolerance)


def suggest_symbolic(layer, o: int, i: int, x: Tensor | None = None, *, x_range=None, n: int = 1000, lib=None,
                     weight_simple: float = 0.8, b_range=(-10.0, 10.0), c_range=(-10.0, 10.0),
                     r2_tolerance: float = 1e-4) -> list[SymbolicFit]:
    """Fit edge ``phi_{o,i}`` of ``layer`` to every library function as ``a f(b x + c) + d`` and return the
    candidates, best first, each with its R^2 (pykan's ranking, which trades R^2 for simplicity by
    ``weight_simple``; 0 ranks by R^2 alone). Then the simplest candidate (lowest complexity, then fewest free
    constants: see :class:`SymbolicFunction`) whose R^2 is at most ``r2_tolerance`` below the top-ranked one's
    is moved to the front (0: pykan's ranking unchanged): fits that the data cannot tell apart go to the
    simpler function, not to a cosine with huge constants imitating a parabola.

    The edge is evaluated at the data ``x`` (..., in) of the layer's inputs, or at ``n`` points of
    ``x_range`` (see :func:`warpkan.interpret.edge_functions`). ``lib``: names in :data:`SYMBOLIC_LIB` or
    :class:`SymbolicFunction` objects (default: the whole library). (b, c) starting points are searched in
    ``b_range`` x ``c_range`` for the edge's inputs mapped onto [-1, 1] (see :func:`fit_function`).
    """
    layer = single_layer(layer)
    check_edge_index(layer, o, i)
    functions = _library(lib)
    r2_tolerance = _check_tolerance(r2_tolerance)
    if isinstance(layer, SymbolicLayer):
        values = edge_functions(layer, x, x_range=x_range, n=n)
        xs, ys = values.x[:, i], values.y[:, o, i]
    else:  # only this edge: a one-edge layer of the same class
        single = _layers.subset(layer, [i], [o])
        points = None if x is None else x.reshape(-1, layer.in_features)[:, i : i + 1]
        bounds = None if x_range is None else _one_range(x_range, layer.in_features, i)
        if x is None and x_range is None:
            default = _layers.default_range(layer)
            bounds = None if default is None else default[i : i + 1]
        values = edge_functions(single, points, x_range=bounds, n=n)
        xs, ys = values.x[:, 0], values.y[:, 0, 0]
    return _rank(_numpy(xs), _numpy(ys), functions, weight_simple, b_range, c_range, r2_tolerance)


def auto_symbolic(model, x: Tensor, *, r2_threshold: float = 0.9, lib=None, weight_simple: float = 0.8,
                  b_range=(-10.0, 10.0), c_range=(-10.0, 10.0), r2_tolerance: float = 1e-4,
                  verbose: bool = False) -> "SymbolicKAN":
    """pykan's ``auto_symbolic``: for every live numeric edge of ``model``, the best library fit (as
    :func:`suggest_symbolic` ranks them, ``r2_tolerance`` included) on the edge's inputs and values over the
    data ``x`` [..., in]; edges whose best fit reaches ``r2_threshold`` are fixed to it. Identically zero edges
    (pruned ones) are left out. Returns a :class:`SymbolicKAN` (``model`` itself is not changed); on a
    ``SymbolicKAN`` the edges already fixed are kept and the numeric ones are fitted."""
    layers = [layer if isinstance(layer, SymbolicLayer) else SymbolicLayer(layer)
              for layer in network_layers(model)]
    _layers.check_chain(layers)
    functions = _library(lib)
    r2_tolerance = _check_tolerance(r2_tolerance)
    by_name = {f.name: f for f in functions}
    activations = _check_data(x, layers[0])
    new_layers = []
    for index, layer in enumerate(layers):
        with torch.no_grad():
            values = layer.edge_values(activations)
            numeric = layer.numeric_live_edges()
        fixed = list(layer.fixed_edges())
        xs = _numpy(activations)
        ys = _numpy(values)
        for o, i in numeric.nonzero().tolist():
            fits = _rank(xs[:, i], ys[:, o, i], functions, weight_simple, b_range, c_range, r2_tolerance)
            best = fits[0]
            if verbose:
                print(f"layer {index} edge ({o}, {i}): {best.name} r2={best.r2:.6f}"
                      + ("" if best.r2 >= r2_threshold else f" (below {r2_threshold}: stays numeric)"))
            if best.r2 >= r2_threshold:
                fixed.append((o, i, best))
        new_layers.append(SymbolicLayer(layer.numeric, fixed, {**layer.functions, **by_name}))
        with torch.no_grad():
            activations = layer(activations)
    return SymbolicKAN(new_layers)


def formula(model, variables=None, digits: int | None = None) -> list:
    """The network as sympy expressions, one per output (pykan's ``symbolic_formula``). A fixed edge is its
    formula ``a f(b x_i + c) + d``; a live numeric edge is an undefined function ``phi_l_o_i(x_i)`` (layer l,
    output o, input i); zero edges are left out; biases are added.

    ``variables``: names or sympy symbols of the inputs (default ``x_1 .. x_n``). ``digits``: round every
    number to that many significant digits (default: full precision).
    """
    sympy = load_sympy()
    layers = network_layers(model)
    _layers.check_chain(layers)
    n_in = layers[0].in_features
    if variables is None:
        nodes = list(sympy.symbols(f"x_1:{n_in + 1}"))
    else:
        nodes = [v if isinstance(v, sympy.Basic) else sympy.Symbol(str(v)) for v in variables]
        if len(nodes) != n_in:
            raise ValueError(f"variables must name the {n_in} inputs, got {len(nodes)}")
    for index, layer in enumerate(layers):
        layer = layer if isinstance(layer, SymbolicLayer) else SymbolicLayer(layer)
        bias = _layers.bias(layer.numeric)
        outputs = [sympy.Float(float(bias[o])) if bias is not None else sympy.Integer(0)
                   for o in range(layer.out_features)]
        for o, i, fit in layer.fixed_edges():
            inner = _times(fit.b, nodes[i]) + sympy.Float(fit.c)
            outputs[o] += _times(fit.a, layer.functions[fit.name].sympy(inner)) + sympy.Float(fit.d)
        for o, i in layer.numeric_live_edges().nonzero().tolist():
            outputs[o] += sympy.Function(f"phi_{index}_{o}_{i}")(nodes[i])
        nodes = outputs
    if digits is not None:
        nodes = [_round(expr, digits) for expr in nodes]
    return nodes


def _times(number: float, expr):
    """number * expr, without a factor of exactly 1 (the normalised b of powers, for example)."""
    return expr if number == 1 else load_sympy().Float(number) * expr


def _round(expr, digits: int):
    sympy = load_sympy()
    return expr.xreplace({f: sympy.Float(float(f"{float(f):.{digits}g}")) for f in expr.atoms(sympy.Float)})


# ------------------------------------------------------------------------------------------------ helpers
def _one_range(x_range, n_in: int, i: int):
    bounds = torch.as_tensor(x_range, dtype=torch.float64)
    if bounds.shape == (2,):
        return bounds.unsqueeze(0)
    if bounds.shape != (n_in, 2):
        raise ValueError(f"x_range must be (lo, hi) or a tensor of shape ({n_in}, 2), got shape {tuple(bounds.shape)}")
    return bounds[i : i + 1]


def _check_data(x, first_layer) -> Tensor:
    if x is None:
        raise ValueError("x (data) is needed: the edges are fitted on the values the data gives them")
    return edge_points(first_layer, x, None, 1)


def _numpy(t: Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()
