"""Interpretability of KAN layers and networks (torch side), for every family: edge functions evaluated by the
layers' own kernels, pykan-style plots, importance scores and pruning, pykan's sparsity penalty for training,
symbolic formulas and grid refinement.

matplotlib (plots), scipy and sympy (symbolic fitting) are optional: ``pip install warpkan[interpret]``; each is
imported when first needed.
"""

from .edges import EdgeFunctions, edge_functions
from .importance import Importance, importance, prune
from .plot import plot_layer, plot_network
from .refine import refine
from .sparsity import REG_METRICS, sparsity_penalty
from .symbolic import (SYMBOLIC_LIB, SymbolicFit, SymbolicFunction, SymbolicKAN, SymbolicLayer, auto_symbolic, formula,
                       suggest_symbolic)

__all__ = ["EdgeFunctions", "edge_functions", "Importance", "importance", "prune", "plot_layer", "plot_network",
           "refine", "sparsity_penalty", "REG_METRICS", "SYMBOLIC_LIB", "SymbolicFit", "SymbolicFunction", "SymbolicKAN", "SymbolicLayer",
           "auto_symbolic", "formula", "suggest_symbolic"]
