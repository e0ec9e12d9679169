"""The polynomial KAN layer (PolyKANLinear / ChebyKANLinear's map) on the edge engine's one op pair
(:mod:`warpkan.torch_bridge.edge_ops`): its spec (the polynomial edge families of
``warpkan.kernels.edge.poly_family``; host-side tables and checks in ``warpkan.kernels.poly``) and
:func:`poly_kan`, which takes (..., in) inputs and the kernel layout ``coeffs`` [in, D + 1, out].
``lut_size = 0`` selects exact mode, ``lut_size >= 2`` LUT mode.

Two strategies compute the same map, as for every edge family (:mod:`warpkan.torch_bridge.edge_driver`, which
has their description, the ``precision`` rule of the gemm strategy and its error bound):

- ``stencil``: the engine's kernels (warp-tiled on CUDA while the degree's table and records fit shared
  memory, per-thread elsewhere); the spline scaler is fixed at one and there is no base path;
- ``gemm``: the engine writes the transposed dense basis of a chunk of rows and cuBLAS contracts it with the
  coefficient table itself ([in (D + 1), out] as it lies: no copy in fp32).

``auto`` takes the gemm strategy (:data:`AUTO_STRATEGY`), except in an eager CUDA call of a small layer, which
waits on the host and takes the stencil kernels (measured in :mod:`warpkan.kernels.edge.strategy`:
``single_slot_strategy``). The bias is added by the forward's last op and its gradient is
``dy.sum(0)``.
"""

from __future__ import annotations


import torch
import warp as wp
from torch import Tensor

from .. import _checks
from ..kernels import poly as kp
from ..kernels.edge.strategy import SINGLE_SLOT_AUTO_STRATEGY
from . import _common
from ._common import check_tensor, kernel_scalar, warp_device
from .edge_driver import PRECISIONS, STRATEGIES, EdgeSpec, check_precision, check_strategy
from .edge_ops import static_spec_maker, edge_apply, register_higher_view

__all__ = ["poly_kan", "poly_apply", "basis_spec", "derivative_spec", "poly_static_spec", "poly_lut_tables", "AUTO_STRATEGY", "BF16_ERROR_BOUND",
           "STRATEGIES", "PRECISIONS"]

BF16_ERROR_BOUND = "(2**-8 + K * 2**-24) * (|A| @ |B|) for a contraction A @ B of length K"
# The strategy "auto" resolves to on the CPU, under CUDA-graph capture and for large eager CUDA calls (measured:
# kernels.edge.strategy; small eager CUDA calls take the stencil kernels: single_slot_strategy)
AUTO_STRATEGY = SINGLE_SLOT_AUTO_STRATEGY
# how errors name the layers and their op
LABEL = "PolyKANLinear/ChebyKANLinear (warpkan::edge_forward)"


_tables_cache: dict = {}


def _tables(x, basis: str, n_basis: int, lut_size: int, alpha: float, beta: float) -> tuple:
    """The LUT tables (values, grads) as torch tensors of x's dtype and device (zero-copy views of the Warp
    tables, made once); () in exact mode. Where x is traced (``_common.runs_registered_op``: torch.compile,
    export, meta, fake and functional tensors) they come from the registered :func:`poly_lut_tables`: Dynamo
    cannot trace Warp, and tables made while a tracing mode is active would be that mode's tensors, without
    storage, and the cache would hand them to every later eager call."""
    if lut_size == 0:
        return ()
    if _common.runs_registered_op(x):
        return poly_lut_tables(x.detach(), basis, n_basis, lut_size, alpha, beta)
    return _cached_tables(x, basis, n_basis, lut_size, alpha, beta)


def _cached_tables(x, basis: str, n_basis: int, lut_size: int, alpha: float, beta: float) -> tuple:
    """The tables, made once a configuration. Not cached when made under a tracing mode or a torch.func
    transform (``_common.cacheable``: the registered :func:`poly_lut_tables` run under a fake mode with a real
    x; a layer called in a transform, which it then refuses): those tensors have no storage once the mode or
    transform is gone, and every later eager call would get them."""
    key = (basis, n_basis, lut_size, alpha, beta, x.dtype, x.device)
    found = _tables_cache.get(key)
    if found is None:
        values, grads = kp.build_lut(basis, n_basis - 1, lut_size, alpha, beta, kernel_scalar(x), warp_device(x.device))
        found = (wp.to_torch(values), wp.to_torch(grads))
        if _common.cacheable(found[0]):
            _tables_cache[key] = found
    return found


kp.on_clear_caches(_tables_cache.clear)


def _exact_frame(family, n_basis, alpha, beta):
    return kp.frame_of(family, n_basis, alpha, beta)


def _lut_frame(values, grads, family, n_basis, basis, alpha, beta):
    """The LUT frame; ``basis``, ``alpha`` and ``beta`` are what the tables were made from: the higher-order
    view (:func:`_lut_higher_view`) builds the exact recurrence's family from them."""
    return kp.frame_of(family, n_basis, lut=(values, grads))


def _lut_derivative_frame(values, family, n_basis, alpha, beta):
    return kp.frame_of(family, n_basis, alpha, beta, lut=(values, None))


def basis_spec(x: Tensor, basis: str, lut_size: int, alpha: float, beta: float, n_basis: int) -> EdgeSpec:
    """The layer's edge-engine spec for x's dtype and device (its family, tables and frame): what
    ``edge_driver.dense_basis`` takes to write P_d(tanh x[:, i]) in row i (D + 1) + d of [in (D + 1), N],
    differentiably (the x-gradient of its first-order backward: the derivative table in LUT mode)."""
    return EdgeSpec(*_engine_args_of(x, n_basis, basis, lut_size, alpha, beta), n_basis, False)


def derivative_spec(x: Tensor, basis: str, lut_size: int, alpha: float, beta: float, n_basis: int) -> EdgeSpec:
    """:func:`basis_spec` of the layer's higher-order routes (``create_graph=True``, Taylor mode): in LUT mode
    the values from the value table and every x-derivative from the exact recurrence
    (:func:`derivative_engine_args`); exact mode's own spec otherwise."""
    return EdgeSpec(*derivative_engine_args(x, n_basis, basis, lut_size, alpha, beta), n_basis, False)


def _engine_args_of(x, n_basis, basis, lut_size, alpha, beta) -> tuple:
    """(family, frame maker, frame tensors, frame config) of the layer on the edge engine."""
    family, make_frame, _, frame_config = poly_static_spec(n_basis, basis, lut_size, alpha, beta, kernel_scalar(x))[:4]
    return family, make_frame, _tables(x, basis, n_basis, lut_size, alpha, beta), frame_config


@static_spec_maker("poly")
def poly_static_spec(n_basis: int, basis: str, lut_size: int, alpha: float, beta: float, scalar: str) -> EdgeSpec:
    """The layer's spec less its LUT tables (:meth:`EdgeSpec.with_frame` adds them; exact mode has none)."""
    family = kp.family_of(n_basis, basis, lut_size > 0, scalar)
    if lut_size:
        return EdgeSpec(family, _lut_frame, (), (family, n_basis, basis, alpha, beta), n_basis, False)
    return EdgeSpec(family, _exact_frame, (), (family, n_basis, alpha, beta), n_basis, False)


def derivative_engine_args(x, n_basis, basis, lut_size, alpha, beta) -> tuple:
    """(family, frame maker, frame tensors, frame config) of the layer's higher-order routes (``create_graph=True``
    and Taylor mode): exact mode's own; in LUT mode the values from the value table (those of the layer's
    forward) and every x-derivative from the recurrence (``kernels.poly.derivative_family_of``). The
    interpolant's second derivative is piecewise constant, up to a few percent off (Legendre degree 8, 4096
    points: 0.02097 against 0.02148), and its first is O(h^2) off: a residual made of them is not the
    residual of any one function. ``docs/perf-notes-engine.md`` has what it costs."""
    if not lut_size:
        return _engine_args_of(x, n_basis, basis, 0, alpha, beta)
    return _lut_derivative_args(_tables(x, basis, n_basis, lut_size, alpha, beta)[0], n_basis, basis, alpha, beta,
                                kernel_scalar(x))


def _lut_derivative_args(values, n_basis, basis, alpha, beta, scalar) -> tuple:
    family = kp.derivative_family_of(n_basis, basis, True, scalar)
    return family, _lut_derivative_frame, (values,), (family, n_basis, alpha, beta)


def _lut_higher_view(spec: EdgeSpec, x: Tensor, coef: Tensor) -> tuple:
    """A LUT layer's create_graph=True formula differentiates the exact recurrence's x-derivatives with the
    value table's values (:func:`derivative_engine_args`); its coefficients unchanged."""
    _, n_basis, basis, alpha, beta = spec.frame_config
    values = spec.frame_tensors[0]
    return EdgeSpec(*_lut_derivative_args(values, n_basis, basis, alpha, beta, kernel_scalar(x)), n_basis, False), coef


register_higher_view(_lut_frame, _lut_higher_view)


def poly_apply(x, coeffs, bias, basis, lut_size, alpha, beta, strategy, precision="auto", deterministic=False,
               layer_layout=False, out_dtype=None):
    """The layer's map on x (..., in), differentiable (``edge_ops.edge_apply``). ``layer_layout``: coeffs come
    as PolyKANLinear exposes them, [in, out, D + 1] (the kernel layout [in, D + 1, out] is made inside the
    autograd node: a view of kernel-layout storage, or a copy of a contiguous parameter, a batched transpose
    whose gradient goes back the same way: ``_common.copy_into``). ``out_dtype``: y's dtype where it is not
    x's (an autocast caller's)."""
    n_basis = coeffs.shape[2] if layer_layout else coeffs.shape[1]
    tables = _tables(x, basis, n_basis, lut_size, alpha, beta)
    return edge_apply(x, "poly", (n_basis, basis, lut_size, alpha, beta, kernel_scalar(x)), tables, None, None,
                      coeffs, bias, strategy, precision, deterministic, layout="polykan" if layer_layout else "kernel",
                      label=LABEL, out_dtype=out_dtype)


@torch.library.custom_op("warpkan::poly_lut_tables", mutates_args=())
def poly_lut_tables(like: Tensor, basis: str, n_basis: int, lut_size: int, alpha: float, beta: float
                    ) -> tuple[Tensor, Tensor]:
    """The (values, grads) tables [lut_size, n_basis] of ``like``'s dtype and device, for traced code (copies of
    the cached ones: an op's outputs are its own)."""
    return tuple(t.clone() for t in _cached_tables(like, basis, n_basis, lut_size, alpha, beta))


@poly_lut_tables.register_fake
def _(like, basis, n_basis, lut_size, alpha, beta):
    return like.new_empty((lut_size, n_basis)), like.new_empty((lut_size, n_basis))


def poly_kan(
    x: Tensor,
    coeffs: Tensor,
    bias: Tensor | None = None,
    basis: str = "chebyshev",
    lut_size: int = 0,
    alpha: float = 1.0,
    beta: float = 1.0,
    strategy: str = "auto",
    precision: str = "auto",
    deterministic: bool = False,
) -> Tensor:
    """``y[..., o] = sum_i sum_d coeffs[i, d, o] P_d(tanh x[..., i]) (+ bias[o])`` for x (..., in).

    coeffs [in, D + 1, out] (the kernel layout); ``lut_size = 0`` evaluates the basis exactly by its
    recurrence, ``lut_size >= 2`` reads it from tables of that many points on [-1, 1] (see
    ``warpkan.kernels.poly`` for the bases and the interpolation error bound). ``strategy``: "stencil", "gemm"
    or "auto"; ``precision``: "auto", "fp32", "tf32" or "bf16" (the gemm strategy's contractions, float32 I/O
    only for tf32 and bf16: the rule and error bound of ``warpkan.torch_bridge.edge_driver``);
    ``deterministic``: the stencil strategy's backward without atomics (bitwise reproducible run to run).
    """
    check_tensor("x", x, ndim_min=1)
    check_tensor("coeffs", coeffs, ndim=3, like=x)
    n_in, n_basis, n_out = coeffs.shape
    check_tensor("x", x, last_dim=n_in)
    kp.check_basis(basis, n_basis - 1, alpha, beta)
    lut_size = _checks.non_negative_int("lut_size", lut_size)
    if lut_size == 1:
        raise ValueError(f"lut_size must be 0 (exact) or an int >= 2, got {lut_size}")
    if bias is not None:
        check_tensor("bias", bias, shape=(n_out,), like=x)
    check_strategy(strategy)
    check_precision(precision, x.dtype)
    return poly_apply(x, coeffs, bias, basis, lut_size, float(alpha), float(beta), strategy, precision, deterministic)
