"""Edge and node importance from data, and pruning, with pykan's definitions (pykan 0.2.8, ``MultKAN.attribute``,
``prune_node``, ``prune_edge``, ``prune``).

Forward, over the data: ``edge_actscale[l][o, i]`` = the standard deviation of ``phi_{o,i}`` over the samples
(of the layer's inputs), and ``subnode_actscale[l][o]`` = the standard deviation of the layer's output o.
Backward, from the outputs (each output scored 1, then averaged over the outputs as pykan does):

    edge[l][o, i] = edge_actscale[l][o, i] * node[l + 1][o] / (subnode_actscale[l][o] + 1e-4)
    node[l][i]    = sum_o edge[l][o, i]

So an edge matters in proportion to its share of the spread of the node it feeds, times that node's own
importance. (pykan before 0.2 and the KAN paper scored edges by the mean |phi| instead; 0.2.8's definition is
the one used here and tested against.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from . import _layers
from ._symbolic_layer import SymbolicLayer, network_layers
from .edges import edge_points, layer_edge_values

__all__ = ["Importance", "importance", "prune"]


@dataclass
class Importance:
    """``edge[l]`` [out, in]: the score of every edge of layer l (pykan's ``edge_scores``); ``node[l]`` [n_l]: the
    score of every node, inputs first and outputs last (pykan's ``node_scores``, ``depth + 1`` entries);
    ``edge_actscale[l]`` [out, in] and ``subnode_actscale[l]`` [out]: the spreads they come from."""

    edge: list[Tensor]
    node: list[Tensor]
    edge_actscale: list[Tensor]
    subnode_actscale: list[Tensor]


@torch.no_grad()
def importance(model, x: Tensor) -> Importance:
    """pykan's attribution scores of every edge and node of ``model`` over the data ``x`` (..., in): see the
    module docstring. ``model``: a KAN layer, an ``nn.Sequential`` of them, a ``KATMLP``, a ``SymbolicKAN``
    or a Warp-native layer or network. Needs at least 2 samples (the scores are standard deviations)."""
    layers = network_layers(model)
    _layers.check_chain(layers)
    acts = edge_points(layers[0], x, None, 1)
    if acts.shape[0] < 2:
        raise ValueError(f"importance needs at least 2 samples, got {acts.shape[0]}")
    edge_actscale, subnode_actscale = [], []
    for layer in layers:
        values = layer_edge_values(layer, acts)
        edge_actscale.append(values.std(0))
        acts = layer(acts)
        subnode_actscale.append(acts.std(0))
    # pykan scores each output 1 in turn (an identity matrix of queries) and averages over them; the
    # propagation is linear, so the average of the queries is propagated directly
    score = torch.full_like(subnode_actscale[-1], 1.0 / layers[-1].out_features)
    node, edge = [score], []
    for scale, spread in zip(reversed(edge_actscale), reversed(subnode_actscale)):
        edge_score = scale * (score / (spread + 1e-4)).unsqueeze(1)
        score = edge_score.sum(0)
        edge.insert(0, edge_score)
        node.insert(0, score)
    return Importance(edge, node, edge_actscale, subnode_actscale)


@torch.no_grad()
def prune(model, x: Tensor, node_threshold: float = 1e-2, edge_threshold: float = 3e-2):
    """pykan's ``prune``: remove the hidden nodes whose :func:`importance` over ``x`` is at most
    ``node_threshold`` (the output of one layer and the matching input of the next), then, with the scores of
    the smaller network, zero the edges scoring at most ``edge_threshold``.

    Returns a new model of the same type (a layer, an ``nn.Sequential`` or a ``KATMLP``) whose layers are of
    the same classes, smaller; ``model`` is not changed. The network's own inputs and outputs are kept. Every
    surviving edge and per-output bias is copied exactly, so a kept edge computes the same function as before
    and a kept node the same sum over its kept edges."""
    layers = network_layers(model)
    for index, layer in enumerate(layers):
        if isinstance(layer, SymbolicLayer) or not _layers.is_edge_layer(layer):
            raise TypeError(f"prune takes a numeric KAN (prune before auto_symbolic); layer {index} is "
                            f"{type(layer).__name__}")
    for name, value in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise TypeError(f"{name} must be a number, got {value!r}")
    scores = importance(model, x)
    keep = [torch.arange(layers[0].in_features)]
    for depth in range(1, len(layers)):
        alive = (scores.node[depth] > node_threshold).nonzero().flatten().cpu()
        if alive.numel() == 0:
            raise ValueError(f"every node of hidden layer {depth} scores at most node_threshold={node_threshold} "
                             f"(the highest scores {float(scores.node[depth].max()):.3g}): nothing would be left")
        keep.append(alive)
    keep.append(torch.arange(layers[-1].out_features))
    smaller = [_layers.subset(layer, keep[index], keep[index + 1]) for index, layer in enumerate(layers)]
    pruned = _layers.rebuild(model, smaller)
    edge_scores = importance(pruned, x).edge
    for layer, score in zip(smaller, edge_scores):
        _layers.zero_edges(layer, score > edge_threshold)
    return pruned
