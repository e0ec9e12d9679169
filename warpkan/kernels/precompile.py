"""The Warp modules ``warpkan precompile`` builds: for each layer family, every module its layers of the asked
orders, dtypes and options can load, gathered from the kernels modules' own lists (the same factories and
launch constants their launchers use), and nothing else.

- ``bspline``: the edge engine's B-spline families (:mod:`.edge.registry`): stencil, dense-basis (the scalar
  type and, for float32, bfloat16 under autocast) and on CUDA the tiled kernels of every table size, or of one
  grid's table (``grid``);
- ``ukan``: the UKAN edge families (dense range, touched pairs, shared table) and :func:`.ukan.ukan_modules`;
- ``poly``: the polynomial families of every basis (exact and LUT) and the LUT tabulation
  (:func:`.poly.lut_modules`);
- ``rational``: :func:`.rational.rational_modules` of each (m, n) order and variant;
- ``geglu``: :func:`.geglu.geglu_modules`.

Higher-order routes only when asked: ``jets`` (Taylor mode, (directions, pairs) each) and ``create_graph``
(a double backward) add the edge families' Taylor-mode modules, a LUT layer's derivative family
(:func:`.poly.higher_order_modules`) and the rational Taylor-series kernels (:func:`.rational_jet.jet_modules`).
On CUDA every family adds the transpose kernel of the torch layers' parameter copies. ``native`` adds, for
``bspline`` and ``poly``, the Warp-native layers' tile GEMMs (:func:`.edge.tile_gemm.tile_gemm_modules`: their
gemm strategy), which no torch layer loads: each is a cuBLASDx module of two to three minutes' build on the GPU
machine.
"""

import time
from dataclasses import dataclass

from . import _transpose, geglu, poly, rational, rational_jet, ukan
from ._modules import ModuleBuild, distinct, load
from .edge import registry, tile_gemm
from .edge.poly_family import BASES

__all__ = ["LAYER_FAMILIES", "PrecompileConfig", "family_modules", "modules", "load_all"]

# layer family -> the edge-registry families its layers run (none: a family of its own kernels)
LAYER_FAMILIES = {"bspline": ("bspline",), "ukan": ("ukan", "ukan_pairs", "ukan_table"), "poly": ("poly",),
                  "rational": (), "geglu": ()}


@dataclass(frozen=True)
class PrecompileConfig:
    """What to compile for. ``orders``: spline orders and polynomial degrees; ``dtypes``: parameter / I/O
    dtypes; ``grid``: a B-spline layer's grid size (only its table's tiled kernels; None: every table size);
    ``bases`` and ``poly_modes``: a polynomial layer's bases and modes ("exact", "lut"); ``rational_orders``: (m, n)
    pairs; ``rational_variants``: "A", "B"; ``group_size``: channels a rational group (None: every vector width);
    ``hidden``, ``inter``, ``small_batch_rows``: a GEGLU layer's sizes (None: every vector width and path);
    ``native``: the Warp-native layers' tile GEMMs too."""

    orders: tuple = (1, 2, 3, 4, 5)
    dtypes: tuple = ("float32",)
    uniform_only: bool = False
    grid: "int | None" = None
    jets: tuple = ()
    create_graph: bool = False
    bases: tuple = tuple(BASES)
    poly_modes: tuple = ("exact", "lut")
    rational_orders: tuple = ((5, 4),)
    rational_variants: tuple = rational.VARIANTS
    group_size: "int | None" = None
    hidden: "int | None" = None
    inter: "int | None" = None
    small_batch_rows: int = geglu.DEFAULT_SMALL_BATCH_ROWS
    native: bool = False


def _edge_family_modules(name: str, family, key: dict, config: PrecompileConfig, is_cuda: bool,
                         jets: tuple) -> list:
    """The modules of one edge family: every table size's, or (B-spline) those of the table of ``config.grid``."""
    if config.grid is None or name != "bspline":
        return list(registry.family_modules(family, is_cuda, jets))
    n_coef = config.grid + key["order"]
    basis_dtypes = [None] + (["bfloat16"] if key["scalar_name"] == "float32" and not family.shared_table else [])
    return [build for basis in basis_dtypes for build in registry.layer_modules(family, n_coef, is_cuda, basis, jets)]


def _edge_extras(name: str, key: dict, config: PrecompileConfig, is_cuda: bool) -> list:
    """The modules a layer family launches besides its edge families' (for one of their keys)."""
    higher = config.create_graph or bool(config.jets)
    if name == "ukan":
        return list(ukan.ukan_modules(key["order"], key["scalar_name"], is_cuda=is_cuda))
    if name == "poly" and key["basis"] == "lut":
        capacity, scalar = key["capacity"], key["scalar_name"]
        builds = [build for basis in config.bases for build in poly.lut_modules(capacity, basis)]
        if higher:
            builds += [build for basis in config.bases
                       for build in poly.higher_order_modules(capacity, basis, True, scalar, config.jets)]
        return builds
    return []


def _runs_taylor_mode(registry_name: str, key: dict) -> bool:
    """Whether Taylor mode runs this edge family itself: a layer family's first (UKAN: the dense range table),
    except the LUT family (a LUT layer's jets run its derivative family: :func:`_edge_extras`)."""
    return registry_name in ("bspline", "ukan") or (registry_name == "poly" and key["basis"] != "lut")


def _asked_for(key: dict, config: PrecompileConfig) -> bool:
    """Whether ``config`` asks for an edge family's compile key."""
    if not registry.key_matches(key, config.orders) or key["scalar_name"] not in config.dtypes:
        return False
    if config.uniform_only and key.get("uniform") is False:
        return False
    if "basis" in key:  # a polynomial family: the LUT one, or an exact one of an asked basis
        if key["basis"] == "lut":
            return "lut" in config.poly_modes
        return "exact" in config.poly_modes and key["basis"] in config.bases
    return True


def _edge_modules(name: str, config: PrecompileConfig, is_cuda: bool) -> list:
    builds = []
    for registry_name in LAYER_FAMILIES[name]:
        for family in registry.families(registry_name):
            key = registry.key_of(family)
            if not _asked_for(key, config):
                continue
            jets = config.jets if _runs_taylor_mode(registry_name, key) else ()
            builds += _edge_family_modules(name, family, key, config, is_cuda, jets)
            if registry_name == LAYER_FAMILIES[name][0]:
                builds += _edge_extras(name, key, config, is_cuda)
    return builds


def _rational_modules(config: PrecompileConfig) -> list:
    builds = []
    for m, n in config.rational_orders:
        for variant in config.rational_variants:
            for dtype in config.dtypes:
                # 16-bit input: a layer of that dtype, or a float32 layer under autocast
                for coef_name in dict.fromkeys((dtype, "float64" if dtype == "float64" else "float32")):
                    builds += rational.rational_modules(m, n, variant, dtype, config.group_size, coef_name)
                if dtype == "float32":  # a float32 layer's rational under a 16-bit autocast gives that dtype
                    for out_name in ("bfloat16", "float16"):
                        if out_name in config.dtypes:
                            builds += rational.rational_modules(m, n, variant, dtype, config.group_size, dtype,
                                                                out_name)
                if config.create_graph or config.jets:
                    builds += rational_jet.jet_modules(m, n, variant, "float64" if dtype == "float64" else "float32")
    return builds


def family_modules(name: str, config: PrecompileConfig, is_cuda: bool) -> tuple:
    """The modules (:class:`ModuleBuild`) layers of family ``name`` can load under ``config``, their kernels
    built (so that ``wp.load_module`` finds them). On the CPU, where every launch runs one thread a block, each
    module once (block size 1)."""
    if name not in LAYER_FAMILIES:
        raise ValueError(f"unknown layer family {name!r}; known: {', '.join(LAYER_FAMILIES)}")
    if name == "rational":
        builds = _rational_modules(config)
    elif name == "geglu":
        builds = [build for dtype in config.dtypes for build in
                  geglu.geglu_modules(dtype, config.hidden, config.inter, config.small_batch_rows)]
    else:
        builds = _edge_modules(name, config, is_cuda)
    if config.native and name in ("bspline", "poly"):  # the Warp-native layers' gemm strategy: its tile GEMMs
        builds += [ModuleBuild(module, threads) for dtype in config.dtypes
                   if dtype in tile_gemm.TILE_SHAPES for module, threads in tile_gemm.tile_gemm_modules(dtype)]
    if is_cuda:
        builds += _transpose.transpose_modules()
    return distinct(build if is_cuda else ModuleBuild(build.name, 1) for build in builds)


def modules(names, config: PrecompileConfig, is_cuda: bool) -> tuple:
    """:func:`family_modules` of every family in ``names``, each module once."""
    return distinct(build for name in names for build in family_modules(name, config, is_cuda))


# ------------------------------------------------------------------------------------------------- loading
def _timed_load(build: ModuleBuild, device: str) -> tuple:
    start = time.perf_counter()
    load(build, device)
    return build, time.perf_counter() - start


def _worker_start(names, configs, is_cuda: bool, verbose: bool, cache_dir: str) -> None:
    """A worker process's set-up: the parent's kernel cache, Warp's output as quiet as the parent's, and the
    kernels of every listed module made in this process (Warp loads a module by name from the kernels defined
    in the process)."""
    import os

    import warp as wp

    from .. import _warp_output

    # Warp's start-up puts its version's folder under the configured one: configure the parent's parent
    version_folder = os.path.basename(os.path.normpath(cache_dir)) == wp.config.version
    wp.config.kernel_cache_dir = os.path.dirname(os.path.normpath(cache_dir)) if version_folder else cache_dir
    _warp_output.set_verbose(verbose)
    _warp_output.start_warp()
    for config in configs:
        modules(names, config, is_cuda)


def load_all(builds, device: str, jobs: int, names=(), configs=(), is_cuda: bool = False, report=None) -> None:
    """Compile (or find in Warp's kernel cache) and load every module of ``builds`` on ``device``, ``jobs`` at a
    time: one after the other in this process for ``jobs`` 1, else in ``jobs`` worker processes (spawned: no
    CUDA state is inherited) that use this process's kernel cache, each making the kernels of
    ``modules(names, config, is_cuda)`` for every config first. A module's build is one compiler run (NVRTC on
    CUDA, the C++ compiler on the CPU) that Warp makes in one thread, and a configuration lists tens of them
    (UKAN's 38 took 19 s one after the other on the GPU machine, 14 s with eight workers), so separate processes
    build them side by side into the one kernel cache, each module by one process. ``report(build, seconds)``
    as each is done."""
    builds = list(builds)
    if jobs <= 1 or len(builds) <= 1:
        for build in builds:
            done = _timed_load(build, device)
            if report is not None:
                report(*done)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    import warp as wp

    from .._warp_output import is_verbose, start_warp

    start_warp()  # the kernel cache resolved, to hand to the workers
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_worker_start,
                             initargs=(tuple(names), tuple(configs), is_cuda, is_verbose(),
                                       wp.config.kernel_cache_dir)) as pool:
        for future in as_completed([pool.submit(_timed_load, build, device) for build in builds]):
            done = future.result()
            if report is not None:
                report(*done)
