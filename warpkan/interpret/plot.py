"""pykan-style diagrams of KAN layers and networks: nodes in rows (inputs at the bottom), one small panel per edge
with its learned function, a sum node per output, and each edge drawn with opacity tanh(beta * importance).

The whole figure is a handful of matplotlib collections (all curves in one ``LineCollection``, all panel
frames in another), not an axes per edge, so a network of thousands of edges draws in seconds. matplotlib is
optional (the ``interpret`` extra) and imported when a plot is made.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from . import _layers
from ._symbolic_layer import SymbolicLayer, network_layers, numeric_layer
from .edges import edge_functions, edge_points
from .importance import importance

__all__ = ["plot_layer", "plot_network"]

_ROW, _GAP = 0.3, 0.1  # pykan's heights: node row to sum row, sum row to the next node row
_NUMERIC, _SYMBOLIC = (0.0, 0.0, 0.0), (0.85, 0.1, 0.1)


def plot_layer(layer, x: Tensor | None = None, path=None, **options):
    """:func:`plot_network` of a single layer."""
    if not (_layers.is_edge_layer(layer) or isinstance(layer, SymbolicLayer)):
        layers = network_layers(layer, "layer")
        if len(layers) != 1:
            raise TypeError(f"layer must be a single layer, got a network of {len(layers)} layers (use plot_network)")
    return plot_network(layer, x, path, **options)


def plot_network(model, x: Tensor | None = None, path=None, *, n: int = 100, beta: float = 3.0, in_vars=None,
                 out_vars=None, title: str | None = None, width: float | None = None, dpi: int = 100):
    """Draw ``model`` (a layer, an ``nn.Sequential`` of layers, a ``KATMLP``, a ``SymbolicKAN`` or a Warp-native
    layer or network) as pykan does and return the matplotlib ``Figure``; with ``path``, save it there too
    (the format from the suffix: ``.png``, ``.svg``, ``.pdf``).

    With data ``x`` (..., in), each edge is drawn over the range its input takes on the data and with opacity
    ``tanh(beta * score)``, the score being pykan's edge importance (:func:`warpkan.interpret.importance`).
    Without data, edges are drawn over their layer's own interval (``KANLinear`` grids; the other families
    need data) and fully opaque. Numeric edges are black, edges fixed to a formula red, zero edges hidden.
    ``n``: points per edge curve; ``in_vars`` / ``out_vars``: labels of the inputs and outputs; ``width``:
    figure width in inches (default: grows with the widest layer).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure

    layers = network_layers(model)
    _layers.check_chain(layers)
    widths = [layers[0].in_features] + [layer.out_features for layer in layers]
    depth = len(layers)
    ranges, alphas = _ranges_and_alphas(layers, model, x, beta, importance)

    n_edges = [layer.in_features * layer.out_features for layer in layers]
    most = max(max(n_edges), 5)
    fig_width = width if width is not None else float(np.clip(0.12 * most, 6.0, 60.0))
    bottom = -(0.35 if in_vars is not None else 0.1) * (_ROW + _GAP)
    top = (depth + (0.2 if out_vars is not None else 0.1) + (0.25 if title is not None else 0.0)) * (_ROW + _GAP)
    y_span = top - bottom
    fig_height = float(np.clip(0.9 * fig_width * y_span, 3.0, 40.0))
    fig = Figure(figsize=(fig_width, fig_height))
    FigureCanvasAgg(fig)  # a canvas of its own: no pyplot state, drawable and savable in any backend setting
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set_xlim(0, 1)
    ax.set_ylim(bottom, top)
    ax.axis("off")
    half_w = 0.4 / most  # pykan's panel half size, in x data units, the same for every layer
    half_h = half_w * fig_width / fig_height * (ax.get_ylim()[1] - ax.get_ylim()[0])  # square on the page

    curves, frames, links, colours = [], [], [], []
    for index, layer in enumerate(layers):
        n_in, n_out = layer.in_features, layer.out_features
        values = edge_functions(layer, x_range=ranges[index], n=n).y  # [n, out, in]
        y = values.permute(2, 1, 0).reshape(n_in * n_out, n).to("cpu", torch.float64).numpy()  # (i, o) order
        symbolic = (~layer.keep).t().reshape(-1).cpu().numpy() if isinstance(layer, SymbolicLayer) else \
            np.zeros(n_in * n_out, dtype=bool)
        alpha = alphas[index].T.reshape(-1)
        base = index * (_ROW + _GAP)
        centre_x = (np.arange(n_in * n_out) + 0.5) / (n_in * n_out)
        centre_y = base + _ROW / 2
        t = np.linspace(-0.85, 0.85, n)
        low, high = np.nanmin(y, 1, keepdims=True), np.nanmax(y, 1, keepdims=True)
        spread = np.where(high - low > 1e-12 * np.maximum(1.0, np.abs(high)), high - low, np.inf)
        v = np.where(np.isfinite(spread), (y - low) / spread * 1.7 - 0.85, 0.0)
        curves.append(np.stack([np.broadcast_to(centre_x[:, None] + t * half_w, v.shape), centre_y + v * half_h], -1))
        corner_x = centre_x[:, None] + np.array([-1, 1, 1, -1, -1]) * half_w
        corner_y = np.broadcast_to(centre_y + np.array([-1, -1, 1, 1, -1]) * half_h, corner_x.shape)
        frames.append(np.stack([corner_x, corner_y], -1))
        node_x = (np.arange(n_in) + 0.5) / n_in
        sum_x = (np.arange(n_out) + 0.5) / n_out
        inputs, outputs = np.divmod(np.arange(n_in * n_out), n_out)
        below = np.stack([np.stack([node_x[inputs], np.full(inputs.shape, base)], -1),
                          np.stack([centre_x, np.full(inputs.shape, centre_y - half_h)], -1)], 1)
        above = np.stack([np.stack([centre_x, np.full(inputs.shape, centre_y + half_h)], -1),
                          np.stack([sum_x[outputs], np.full(inputs.shape, base + _ROW)], -1)], 1)
        links.extend([below, above])
        colour = np.where(symbolic[:, None], _SYMBOLIC, _NUMERIC)
        rgba = np.concatenate([colour, alpha[:, None]], 1)
        colours.append(rgba)
        # sum nodes and the link from each to the next row of nodes
        ax.scatter(sum_x, np.full(n_out, base + _ROW), s=_marker(n_out, fig_width), marker="s", color="0.35",
                   zorder=3)
        ax.add_collection(LineCollection(np.stack([np.stack([sum_x, np.full(n_out, base + _ROW)], -1),
                                                   np.stack([sum_x, np.full(n_out, base + _ROW + _GAP)], -1)], 1),
                                         colors="black", linewidths=0.8))
    for index, count in enumerate(widths):
        ax.scatter((np.arange(count) + 0.5) / count, np.full(count, index * (_ROW + _GAP)),
                   s=_marker(count, fig_width) * 2, color="black", zorder=3)
    rgba = np.concatenate(colours)
    ax.add_collection(LineCollection(np.concatenate(curves), colors=rgba, linewidths=1.2))
    ax.add_collection(LineCollection(np.concatenate(frames), colors=rgba, linewidths=0.6))
    link_colours = np.concatenate([c for c in colours for _ in ("below", "above")])  # the order of links
    ax.add_collection(LineCollection(np.concatenate(links), colors=link_colours, linewidths=0.6))
    _labels(ax, in_vars, widths[0], -0.2 * (_ROW + _GAP), "in_vars")
    _labels(ax, out_vars, widths[-1], (depth + 0.12) * (_ROW + _GAP), "out_vars")
    if title is not None:
        ax.text(0.5, top - 0.12 * (_ROW + _GAP), title, ha="center", va="center", fontsize=13)
    if path is not None:
        fig.savefig(path, dpi=dpi)
    return fig


def _marker(count: int, fig_width: float) -> float:
    spacing_points = 72.0 * fig_width / max(count, 5)
    return float(np.clip(0.15 * spacing_points, 1.0, 12.0) ** 2)


def _labels(ax, names, count, y, what):
    if names is None:
        return
    names = list(names)
    if len(names) != count:
        raise ValueError(f"{what} must have {count} names, got {len(names)}")
    for index, name in enumerate(names):
        ax.text((index + 0.5) / count, y, str(name), ha="center", va="center", fontsize=11)


@torch.no_grad()
def _ranges_and_alphas(layers, model, x, beta, importance):
    """Per layer: the [in, 2] interval each input's edges are drawn over and the [out, in] opacity."""
    def live(layer):
        if isinstance(layer, SymbolicLayer):
            return layer.numeric_live_edges() | ~layer.keep
        return _layers.live_edges(layer)

    if x is None:
        ranges = []
        for index, layer in enumerate(layers):
            numeric = numeric_layer(layer)
            bounds = _layers.default_range(numeric)
            if bounds is None:
                raise ValueError(f"layer {index} ({type(numeric).__name__}) has no bounded domain: pass data x")
            ranges.append(bounds)
        return ranges, [live(layer).to("cpu", torch.float64).numpy() for layer in layers]
    scores = importance(model, x)
    acts = edge_points(layers[0], x, None, 1)
    ranges = []
    for layer in layers:
        finite = torch.where(torch.isfinite(acts), acts, torch.nan)
        ranges.append(torch.stack([_nan_reduce(finite, torch.amin), _nan_reduce(finite, torch.amax)], 1))
        acts = layer(acts)
    alphas = [(np.tanh(beta * score.to("cpu", torch.float64).numpy()) * live(layer).cpu().numpy())
              for score, layer in zip(scores.edge, layers)]
    return ranges, alphas


def _nan_reduce(values: Tensor, reduce) -> Tensor:
    fill = torch.inf if reduce is torch.amin else -torch.inf
    result = reduce(torch.nan_to_num(values, nan=fill), 0)
    return torch.where(torch.isfinite(result), result, torch.zeros_like(result))
