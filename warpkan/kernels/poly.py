"""Polynomial KAN (PolyKAN) kernels in pure Warp (no torch import).

Maths. ``y[n, o] = sum_i sum_{d=0..D} W[i, d, o] P_d(tanh x[n, i]) (+ bias[o])``.

Layout (the innermost index is the one consecutive threads walk, so it is the coalesced one):

- ``x``      [N, in]
- ``coeffs`` [in, D + 1, out]   ChebyKAN's ``cheby_coeffs`` [in, out, D + 1] permuted (0, 2, 1): every kernel
  that reads or writes the coefficients has consecutive threads on consecutive outputs ``o``
- ``bias``   [out]
- ``lut``, ``lut_grad`` [lut_size, D + 1]: ``P_d`` and ``P_d'`` on a uniform grid of [-1, 1]; one row holds every
  degree of one grid point, so a thread walking ``d`` reads consecutive addresses
- ``y``      [N, out]

Bases. A basis is a small ``@wp.func`` recurrence: ``start`` gives the state at ``d = 0``, ``advance`` steps it
from ``d`` to ``d + 1``, and ``value`` / ``grad`` read ``P_d`` and ``dP_d/dt`` out of it. Three-term bases
(``P_{d+1} = (A_d t + B_d) P_d - C_d P_{d-1}``) only define ``(A_d, B_d, C_d)``; see :data:`BASES`. Adding a
basis means adding one entry there: the kernels are generic in it.

- ``chebyshev``: first kind, ``T_d``.
- ``legendre``: ``P_d``.
- ``hermite``: physicists' ``H_d`` (numpy's ``hermval``); on ``t = tanh x`` in [-1, 1].
- ``gegenbauer``: ``C_d^(alpha)``, ``alpha > -1/2``, ``alpha != 0``.
- ``jacobi``: ``P_d^(alpha, beta)``, ``alpha, beta > -1``.
- ``fourier``: ``P_0 = 1``, ``P_{2k-1} = cos(k pi t)``, ``P_{2k} = sin(k pi t)``: degree D gives D + 1 functions
  like every other basis (D = 8 is the constant plus cos/sin of k = 1..4).

Modes. ``exact`` runs the recurrence in registers. ``lut`` reads ``P_d`` and ``P_d'`` from tables built once per
(basis, degree, lut_size, alpha, beta, dtype, device) in float64 from the same recurrence, with linear
interpolation. Interpolation error bound (h = 2 / (lut_size - 1), the table spacing; linear interpolation of a
C^2 function errs by at most ``h^2 / 8 max|f''|`` on a cell):

    |P_d^lut(t) - P_d(t)|   <= h^2 / 8 * max_[-1,1] |P_d''|   (+ rounding of the table to the I/O dtype)
    |P_d'^lut(t) - P_d'(t)| <= h^2 / 8 * max_[-1,1] |P_d'''|

For Chebyshev, Markov's inequality gives ``max|T_d''| = T_d''(1) = d^2 (d^2 - 1) / 3``; at D = 8 and
lut_size = 4096 that is 4.0e-5. :func:`lut_error_bound` returns the bound per degree for every basis (the
maxima of ``|P_d''|`` and ``|P_d'''|`` are taken on a grid 64 times finer than the table, end points included).
The backward pass of LUT mode interpolates the derivative table: it approximates ``P_d'`` to O(h^2), and is not
the derivative of the piecewise-linear forward (which would be O(h) off ``P_d'``). The slope of that
interpolant would be O(h) off ``P_d''``, too far for a physics-informed residual: a LUT layer's higher-order
routes (``create_graph=True``, Taylor mode) take every derivative from the recurrence and only the values from
the table (:func:`derivative_family_of`).

Kernels. The layer is an edge family of the edge engine (:mod:`warpkan.kernels.edge.poly_family`: one slot
per input, the degree at runtime under a compile-time capacity): its forward, backward and dense-basis kernels
are the engine's (:mod:`warpkan.kernels.edge`), the spline scaler fixed at one and no base path. This module
checks a layer's arrays, builds its tables and frame, and adds the bias and its gradient.

Bad input: NaN in ``x[n, i]`` makes row n of y NaN (and, as under autograd, the coefficient gradient of input i);
``+-Inf`` is ``t = +-1``.
"""

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import warp as wp

from .. import _checks
from ._common import SCALARS, scalar_name
from ._modules import ModuleBuild, distinct
from ._runtime import launch, launch_combine_chunks
from .edge import launch as edge
from .edge import tile_gemm
from .edge.dense import dense_modules
from .edge.jet import jet_modules
from .edge.poly_family import capacity_for, lut_derivative_family, poly_family, poly_frame_of

__all__ = [
    "BASES",
    "MAX_DEGREE",
    "MODES",
    "check_layer_args",
    "basis_names",
    "check_basis",
    "build_lut",
    "lut_error_bound",
    "family_of",
    "derivative_family_of",
    "lut_modules",
    "higher_order_modules",
    "frame_of",
    "unit_scaler",
    "launch_forward",
    "launch_backward",
    "launch_gemm_forward",
    "launch_gemm_backward",
    "evaluate_basis",
    "clear_caches",
    "on_clear_caches",
]

MAX_DEGREE = 64
MODES = ("exact", "lut")  # a layer's basis evaluation: the recurrence in registers, or the lookup tables


@dataclass(frozen=True)
class Basis:
    """A basis's name and which shape parameters it reads (its maths: :mod:`warpkan.kernels.edge.poly_family`)."""

    name: str
    uses_alpha: bool = False
    uses_beta: bool = False


BASES: dict[str, Basis] = {
    "chebyshev": Basis("chebyshev"),
    "legendre": Basis("legendre"),
    "hermite": Basis("hermite"),
    "gegenbauer": Basis("gegenbauer", uses_alpha=True),
    "jacobi": Basis("jacobi", uses_alpha=True, uses_beta=True),
    "fourier": Basis("fourier"),
}


def basis_names() -> list[str]:
    return list(BASES)


def check_basis(basis: str, degree: int, alpha: float = 1.0, beta: float = 1.0) -> tuple[int, float, float]:
    """``(degree, alpha, beta)`` normalised; raises ValueError/TypeError naming the argument when (basis,
    degree, alpha, beta) is not usable."""
    if not isinstance(basis, str) or basis not in BASES:
        raise ValueError(f"basis must be one of {basis_names()}, got {basis!r}")
    degree = _checks.int_in_range("degree", degree, 0, MAX_DEGREE)
    alpha, beta = _checks.number("alpha", alpha), _checks.number("beta", beta)
    if basis == "gegenbauer" and not (alpha > -0.5 and alpha != 0.0):
        raise ValueError(f"alpha must be > -1/2 and != 0 for the gegenbauer basis, got {alpha}")
    if basis == "jacobi" and not (alpha > -1.0 and beta > -1.0):
        raise ValueError(f"alpha and beta must be > -1 for the jacobi basis, got alpha={alpha}, beta={beta}")
    return degree, alpha, beta


def check_layer_args(in_features, out_features, degree, basis, mode, lut_size, alpha, beta) -> tuple:
    """The arguments of a polynomial KAN layer (the torch and the Warp-native one), checked and normalised:
    ``(in_features, out_features, degree, mode, lut_size, alpha, beta)``. Raises TypeError/ValueError naming
    the argument (rules: :mod:`warpkan._checks`), before anything is allocated."""
    in_features = _checks.positive_int("in_features", in_features)
    out_features = _checks.positive_int("out_features", out_features)
    degree, alpha, beta = check_basis(basis, degree, alpha, beta)
    mode = _checks.one_of("mode", mode, MODES)
    lut_size = _checks.int_in_range("lut_size", lut_size, 2)
    _checks.fits_index("coeffs", (in_features, degree + 1, out_features), in_features=in_features,
                       out_features=out_features, degree=degree)
    _checks.fits_index("the basis tables", (lut_size, degree + 1), lut_size=lut_size, degree=degree)
    return in_features, out_features, degree, mode, lut_size, alpha, beta


# ---------------------------------------------------------------------------------------------- tables
_luts: dict[tuple, tuple] = {}


def evaluate_basis(t: np.ndarray, basis: str, degree: int, alpha: float = 1.0, beta: float = 1.0, device="cpu"):
    """(P_d(t), P_d'(t)) as float64 numpy arrays [len(t), degree + 1], by the kernels' own recurrence,
    run on ``device`` (so a machine without a CPU compiler can build tables on its GPU)."""
    check_basis(basis, degree, alpha, beta)
    family = poly_family(basis, capacity_for(degree + 1), "float64")
    t_wp = wp.array(np.ascontiguousarray(t, dtype=np.float64).ravel(), dtype=wp.float64, device=device)
    values = wp.empty((t_wp.shape[0], degree + 1), dtype=wp.float64, device=device)
    grads = wp.empty_like(values)
    if t_wp.shape[0]:
        launch(_tabulate_kernel(family), t_wp.shape[0], [t_wp, poly_frame_of(family, degree + 1, alpha, beta)],
               [values, grads], device)
    return values.numpy(), grads.numpy()


@functools.lru_cache(maxsize=None)
def _tabulate_kernel(family):
    """values[j, d] = P_d(t[j]), grads[j, d] = P_d'(t[j]) by the exact family's own recurrence."""
    basis_du = family.basis_du

    @wp.kernel(enable_backward=False, module=f"warpkan_poly_tabulate_{family.key}")
    def tabulate(t: wp.array(dtype=wp.float64), frame: family.Frame, values: wp.array2d(dtype=wp.float64),
                 grads: wp.array2d(dtype=wp.float64)):
        j = wp.tid()
        b, db = basis_du(frame, 0, 0, t[j])
        for d in range(values.shape[1]):
            values[j, d] = b[d]
            grads[j, d] = db[d]

    return tabulate


def build_lut(basis: str, degree: int, lut_size: int, alpha: float = 1.0, beta: float = 1.0,
              scalar_name: str = "float32", device="cpu") -> tuple:
    """The (values, grads) tables [lut_size, degree + 1] on ``device``, built once in float64 and cached.

    Building happens at the first call for a key (a host-to-device copy); call it before capturing a graph.
    """
    degree, alpha, beta = check_basis(basis, degree, alpha, beta)
    lut_size = _checks.int_in_range("lut_size", lut_size, 2)
    device = wp.get_device(device)
    key = (basis, int(degree), int(lut_size), float(alpha), float(beta), scalar_name, str(device))
    found = _luts.get(key)
    if found is None:
        grid = np.linspace(-1.0, 1.0, int(lut_size))
        values, grads = evaluate_basis(grid, basis, degree, alpha, beta, device)
        dtype = SCALARS[scalar_name]
        found = (wp.array(values, dtype=dtype, device=device), wp.array(grads, dtype=dtype, device=device))
        _luts[key] = found
    return found


def lut_error_bound(basis: str, degree: int, lut_size: int, alpha: float = 1.0, beta: float = 1.0,
                    scalar_name: str = "float64", device="cpu") -> tuple[np.ndarray, np.ndarray]:
    """Per-degree bounds (value_bound [D + 1], grad_bound [D + 1]) of ``|P_d^lut - P_d|`` and
    ``|P_d'^lut - P_d'|`` on [-1, 1]: ``h^2 / 8 max|P_d''|`` and ``h^2 / 8 max|P_d'''|`` with ``h = 2 / (lut_size - 1)``,
    plus the rounding of the tables and of the interpolation in ``scalar_name``.

    The maxima of ``|P_d''|`` and ``|P_d'''|`` come from differencing the exact ``P_d'`` on a grid 64 times finer
    than the table (end points included), evaluated on ``device`` (a machine without a CPU compiler uses its
    GPU)."""
    check_basis(basis, degree, alpha, beta)
    fine = np.linspace(-1.0, 1.0, 64 * (int(lut_size) - 1) + 1)
    values, grads = evaluate_basis(fine, basis, degree, alpha, beta, device)
    step = fine[1] - fine[0]
    second = np.gradient(grads, step, axis=0, edge_order=2)
    third = np.gradient(second, step, axis=0, edge_order=2)
    h = 2.0 / (int(lut_size) - 1)
    eps = float(np.finfo(np.float32 if scalar_name == "float32" else np.float64).eps)
    # the tables round to eps |P|; interpolation and the cell position add a few eps |P| (and eps |P'|
    # through the rounding of t)
    rounding_values = 4 * eps * (np.abs(values).max(axis=0) + np.abs(grads).max(axis=0))
    rounding_grads = 4 * eps * (np.abs(grads).max(axis=0) + np.abs(second).max(axis=0))
    value_bound = h * h / 8 * np.abs(second).max(axis=0) * (1 + 1e-3) + rounding_values
    grad_bound = h * h / 8 * np.abs(third).max(axis=0) * (1 + 1e-3) + rounding_grads
    return value_bound, grad_bound


def clear_caches() -> None:
    """Free the cached tables and scaler arrays, and forget every recorded launch that refers to them (the hooks
    of :func:`on_clear_caches`)."""
    _luts.clear()
    _ones.clear()
    for hook in _clear_hooks:
        hook()


_clear_hooks: list = []


def on_clear_caches(hook: Callable) -> None:
    """Call ``hook()`` from :func:`clear_caches` (a cache of recorded launches that hold the tables)."""
    _clear_hooks.append(hook)


# ---------------------------------------------------------------------------------------------- launchers
def family_of(n_basis: int, basis: str, lut: bool, scalar: str):
    """The edge family of a layer of ``n_basis`` = D + 1 bases: the exact basis, or the lookup tables."""
    return poly_family("lut" if lut else basis, capacity_for(n_basis), scalar)


def derivative_family_of(n_basis: int, basis: str, lut: bool, scalar: str):
    """The edge family of a layer's higher-order routes (``create_graph=True`` and Taylor mode): the exact basis,
    or in LUT mode the values from the value table and every derivative from the recurrence
    (:func:`warpkan.kernels.edge.poly_family.lut_derivative_family`)."""
    capacity = capacity_for(n_basis)
    return lut_derivative_family(basis, capacity, scalar) if lut else poly_family(basis, capacity, scalar)


def lut_modules(n_basis: int, basis: str) -> tuple:
    """The module (:class:`ModuleBuild`) that builds a LUT layer's tables (:func:`build_lut`: the exact basis
    tabulated in float64, at the default block size)."""
    return (ModuleBuild(_tabulate_kernel(poly_family(basis, capacity_for(n_basis), "float64")).module.name),)


def higher_order_modules(n_basis: int, basis: str, lut: bool, scalar: str, jets=()) -> tuple:
    """The modules (:class:`ModuleBuild`) of a layer's higher-order routes: the dense-basis kernels of its
    :func:`derivative_family_of` (a ``create_graph=True`` backward) and its Taylor-mode kernels for each
    (directions, pairs) in ``jets``."""
    family = derivative_family_of(n_basis, basis, lut, scalar)
    return distinct([*dense_modules(family, scalar), *(build for n_first, n_pairs in jets
                                                       for build in jet_modules(family, n_first, n_pairs))])


def frame_of(family, n_basis: int, alpha: float = 1.0, beta: float = 1.0, lut=None):
    """The frame of a layer: (alpha, beta) exactly, the (values, grads) tables of :func:`build_lut` in LUT mode
    (a LUT-derivative family reads the values table and (alpha, beta))."""
    values, grads = lut if lut is not None else (None, None)
    return poly_frame_of(family, n_basis, alpha, beta, values, grads)


_ones: dict = {}


def unit_scaler(n_in: int, n_out: int, dtype, device) -> "wp.array":
    """A cached [in, out] array of ones: the engine's spline scaler, which a polynomial layer does not have."""
    key = (n_in, n_out, dtype, str(device))
    found = _ones.get(key)
    if found is None:
        found = _ones[key] = wp.full((n_in, n_out), dtype(1.0), dtype=dtype, device=device)
    return found


def _check(x, coeffs, bias, lut_tables):
    if x.ndim != 2:
        raise ValueError(f"x must have 2 dimensions, got shape {tuple(x.shape)}")
    if coeffs.ndim != 3:
        raise ValueError(f"coeffs must have 3 dimensions [in, degree + 1, out], got shape {tuple(coeffs.shape)}")
    if coeffs.shape[0] != x.shape[1]:
        raise ValueError(f"coeffs must have shape ({x.shape[1]}, degree + 1, out), got {tuple(coeffs.shape)}")
    named = [("coeffs", coeffs)]
    if bias is not None:
        if tuple(bias.shape) != (coeffs.shape[2],):
            raise ValueError(f"bias must have shape ({coeffs.shape[2]},), got {tuple(bias.shape)}")
        named.append(("bias", bias))
    for name, arr in named:
        if arr.dtype != x.dtype:
            raise TypeError(f"{name} must have the dtype of x ({wp.types.type_repr(x.dtype)}), got "
                            f"{wp.types.type_repr(arr.dtype)}")
        if arr.device != x.device:
            raise ValueError(f"{name} must be on the device of x ({x.device}), got {arr.device}")
    if lut_tables is not None:
        values, grads = lut_tables
        if values.shape[1] != coeffs.shape[1] or grads.shape != values.shape:
            raise ValueError(f"lut tables must have shape (lut_size, {coeffs.shape[1]}), got {tuple(values.shape)}")
        if values.dtype != x.dtype or values.device != x.device:
            raise TypeError("lut tables must have the dtype and device of x")


def launch_forward(x, coeffs, y, basis: str = "chebyshev", bias=None, lut=None, alpha: float = 1.0, beta: float = 1.0,
                   stream=None, workspace=None) -> None:
    """y[n, o] = sum_i sum_d coeffs[i, d, o] P_d(tanh x[n, i]) (+ bias[o]). Overwrites y. ``lut``: the (values,
    grads) tables of :func:`build_lut` for LUT mode, None for exact mode."""
    _check(x, coeffs, bias, lut)
    if tuple(y.shape) != (x.shape[0], coeffs.shape[2]):
        raise ValueError(f"y must have shape {(x.shape[0], coeffs.shape[2])}, got {tuple(y.shape)}")
    n_in, n_basis, n_out = coeffs.shape
    family = family_of(n_basis, basis, lut is not None, scalar_name(x))
    ones = unit_scaler(n_in, n_out, x.dtype, x.device)
    edge.launch_forward(family, frame_of(family, n_basis, alpha, beta, lut), x, ones, ones, coeffs, y, bias=bias,
                        use_base=False, stream=stream, workspace=workspace)


def _bias_grad(dy, d_bias, stream) -> None:
    """d_bias += the column sums of dy, by the fixed-order chunk combine (deterministic)."""
    n_rows, n_out = dy.shape
    if d_bias is not None and n_rows:
        launch_combine_chunks(dy.reshape((n_rows, 1, n_out)) if dy.is_contiguous else
                              wp.clone(dy).reshape((n_rows, 1, n_out)), d_bias.reshape((1, n_out)), accumulate=True,
                              stream=stream)


def launch_backward(dy, x, coeffs, basis: str = "chebyshev", lut=None, alpha: float = 1.0, beta: float = 1.0,
                    dx=None, d_coeffs=None, d_bias=None, stream=None, workspace=None) -> None:
    """Accumulate (+=) the gradients of :func:`launch_forward` into whichever of dx, d_coeffs, d_bias are given
    (the bias gradient by a fixed-order column sum: deterministic)."""
    _check(x, coeffs, None, lut)
    n_rows, n_in = x.shape
    n_basis, n_out = coeffs.shape[1], coeffs.shape[2]
    if tuple(dy.shape) != (n_rows, n_out):
        raise ValueError(f"dy must have shape {(n_rows, n_out)}, got {tuple(dy.shape)}")
    _bias_grad(dy, d_bias, stream)
    if dx is None and d_coeffs is None:
        return
    family = family_of(n_basis, basis, lut is not None, scalar_name(x))
    ones = unit_scaler(n_in, n_out, x.dtype, x.device)
    # the engine forms the scaler's and base weight's gradients beside the coefficients': scratch here
    d_scaler = wp.zeros((n_in, n_out), dtype=x.dtype, device=x.device) if d_coeffs is not None else None
    d_base = wp.zeros((n_in, n_out), dtype=x.dtype, device=x.device) if d_coeffs is not None else None
    edge.launch_backward(family, frame_of(family, n_basis, alpha, beta, lut), dy, x, ones, ones, coeffs,
                         use_base=False, dx=dx, d_base_weight_t=d_base, d_scaler_t=d_scaler, d_coef=d_coeffs,
                         stream=stream, workspace=workspace)


def launch_gemm_forward(x, coeffs, y, basis: str = "chebyshev", bias=None, lut=None, alpha: float = 1.0,
                        beta: float = 1.0, stream=None, workspace=None) -> None:
    """y as :func:`launch_forward` computes it, by the gemm strategy: the dense basis times the coefficient
    table [in (D + 1), out] itself with ``wp.tile_matmul`` (:mod:`warpkan.kernels.edge.tile_gemm`), then the
    bias. Overwrites y. x, coeffs and y contiguous."""
    _check(x, coeffs, bias, lut)
    if tuple(y.shape) != (x.shape[0], coeffs.shape[2]):
        raise ValueError(f"y must have shape {(x.shape[0], coeffs.shape[2])}, got {tuple(y.shape)}")
    n_in, n_basis, n_out = coeffs.shape
    family = family_of(n_basis, basis, lut is not None, scalar_name(x))
    tile_gemm.launch_gemm_forward(family, frame_of(family, n_basis, alpha, beta, lut), x, n_basis,
                                  coeffs.reshape((n_in * n_basis, n_out)), y, False, bias=bias, stream=stream,
                                  workspace=workspace)


def launch_gemm_backward(dy, x, coeffs, basis: str = "chebyshev", lut=None, alpha: float = 1.0, beta: float = 1.0,
                         dx=None, d_coeffs=None, d_bias=None, stream=None, workspace=None) -> None:
    """Accumulate (+=) the gradients of :func:`launch_gemm_forward` into whichever of dx, d_coeffs, d_bias are
    given (contiguous; every one deterministic): the coefficient gradient is the GEMM's weight gradient, summed
    straight into d_coeffs."""
    _check(x, coeffs, None, lut)
    n_in, n_basis, n_out = coeffs.shape
    if tuple(dy.shape) != (x.shape[0], n_out):
        raise ValueError(f"dy must have shape {(x.shape[0], n_out)}, got {tuple(dy.shape)}")
    _bias_grad(dy, d_bias, stream)
    family = family_of(n_basis, basis, lut is not None, scalar_name(x))
    width = n_in * n_basis
    tile_gemm.launch_gemm_backward(family, frame_of(family, n_basis, alpha, beta, lut), dy, x, n_basis,
                                   coeffs.reshape((width, n_out)), False, dx=dx,
                                   d_weight=d_coeffs.reshape((width, n_out)) if d_coeffs is not None else None,
                                   stream=stream, workspace=workspace)
