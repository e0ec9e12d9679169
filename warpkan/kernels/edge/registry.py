"""The compile keys of every edge family, and the Warp modules each builds: what ``warpkan precompile`` walks.

A family's compile key holds only what must be compile-time (its order or degree, the scalar type, the grid
kind); everything else is a kernel argument. For one key, the modules are:

- ``warpkan_edge_<key>``: every stencil kernel (one block size: one build);
- ``warpkan_edge_combine_rows_<scalar>``: the fixed-order combine of row-chunked sums, shared by all keys;
- ``warpkan_edge_<key>_dense_<basis dtype>``: the dense-basis (GEMM) kernels, per basis dtype;
- on CUDA, the tiled kernels: ``..._tiled_helpers``, ``..._tiled_c<capacity>`` (forward) and
  ``..._c<capacity>_bwd``, and the banded tables of longer grids.

One layer configuration (a key and a table size) builds at most six of them: :func:`layer_modules`. A Taylor-mode
layer adds ``warpkan_edge_<key>_jet_d<D>_p<P>`` for its jet shape. Each is listed as a
:class:`~warpkan.kernels._modules.ModuleBuild`: the module and the block size its launches use.

Each family module declares its builder and keys (its ``FAMILIES``); this module reads them, and no family module
imports it.
"""

from .._modules import distinct
from . import bspline_family, poly_family, tiled, ukan_family
from .dense import dense_modules
from .family import EdgeFamily
from .jet import jet_modules
from .stencil import stencil_modules

__all__ = ["FAMILY_BUILDERS", "families", "family_names", "key_of", "key_matches", "family_modules",
           "layer_modules"]

# name -> (builder(**key) -> EdgeFamily, [every key as a dict]), as the family modules declare them
FAMILY_BUILDERS: dict = {name: (builder, list(keys)) for module in (bspline_family, poly_family, ukan_family)
                         for name, (builder, keys) in module.FAMILIES.items()}


def family_names() -> list[str]:
    return list(FAMILY_BUILDERS)


_KEYS: dict = {}  # family -> its compile key as a dict


def key_of(family: EdgeFamily) -> dict:
    """The compile key (as a dict of the builder's arguments) a registered family was built from."""
    return _KEYS[family.key]


def key_matches(key: dict, orders) -> bool:
    """Whether a compile key serves one of ``orders``: a spline order, or a polynomial degree (whose capacity
    holds it)."""
    if "order" in key:
        return key["order"] in orders
    if "capacity" in key:
        return key["capacity"] in {poly_family.capacity_for(degree + 1) for degree in orders}
    return True


def families(name: "str | None" = None, **match) -> list[EdgeFamily]:
    """Every registered family (of one name, and whose key has the given values)."""
    out = []
    for family_name, (builder, keys) in FAMILY_BUILDERS.items():
        if name is not None and family_name != name:
            continue
        for key in keys:
            if all(key.get(k, v) == v for k, v in match.items()):
                family = builder(**key)
                _KEYS[family.key] = key
                out.append(family)
    return out


def _dense_names(family: EdgeFamily) -> list[str]:
    if family.shared_table:  # no dense basis (see .family)
        return []
    return [family.scalar_name] + (["bfloat16"] if family.scalar_name == "float32" else [])


def family_modules(family: EdgeFamily, is_cuda: bool, jets=()) -> tuple:
    """Every module (:class:`ModuleBuild`) a layer of this key may launch (any table size, every basis dtype),
    its kernels built; and the Taylor-mode modules of each (directions, pairs) in ``jets``."""
    builds = list(stencil_modules(family))
    for basis in _dense_names(family):
        builds += dense_modules(family, basis)
    if is_cuda:
        builds += tiled.tiled_modules(family)
    for n_first, n_pairs in jets:
        builds += jet_modules(family, n_first, n_pairs)
    return distinct(builds)


def layer_modules(family: EdgeFamily, n_coef: int, is_cuda: bool, basis_dtype: "str | None" = None,
                  jets=()) -> tuple:
    """The modules (:class:`ModuleBuild`) one layer configuration (a key and ``n_coef`` coefficients per input)
    builds: the stencil kernels and their combine, the dense-basis kernels of its basis dtype (the scalar type
    unless given), on CUDA the tiled kernels its table plans pick, and the Taylor-mode modules of ``jets``."""
    builds = list(stencil_modules(family))
    if not family.shared_table:
        builds += dense_modules(family, basis_dtype or family.scalar_name)
    if is_cuda:
        builds += tiled.planned_modules(family, n_coef)
    for n_first, n_pairs in jets:
        builds += jet_modules(family, n_first, n_pairs)
    return distinct(builds)
