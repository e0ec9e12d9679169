"""``PolyKANLinear`` (and ``ChebyKANLinear``): polynomial KAN layers on Warp kernels."""

from __future__ import annotations

import torch
from torch import nn

from ..kernels import poly as kp
from ._common import (FLOAT_DTYPES, Float32Or64Module, autocast_dtype, call_precision, check_device,
                      check_input_dtype, check_tensor, layer_dtype)
from .edge_driver import EdgeView, check_view_rows
from .kan_linear import init_public, layout_parameter
from .poly_ops import PRECISIONS, STRATEGIES, basis_spec, derivative_spec, poly_apply

__all__ = ["PolyKANLinear", "ChebyKANLinear"]

DEFAULT_LUT_SIZE = 4096


class PolyKANLinear(Float32Or64Module):
    """``y[..., o] = sum_i sum_{d=0..degree} coeffs[i, o, d] P_d(tanh x[..., i]) (+ bias[o])`` for x (..., in).

    ``basis``: ``chebyshev`` (first kind), ``legendre``, ``hermite``, ``gegenbauer`` (parameter ``alpha``),
    ``jacobi`` (``alpha``, ``beta``) or ``fourier`` (``1, cos(pi t), sin(pi t), cos(2 pi t), ...``: degree + 1
    functions like the others); see ``warpkan.kernels.poly``.

    ``mode="exact"`` runs the basis recurrence in registers; ``mode="lut"`` interpolates tables of
    ``lut_size`` points on [-1, 1] (a derivative table serves the backward pass). The interpolation error of
    ``P_d`` is at most ``h^2 / 8 max|P_d''|`` with ``h = 2 / (lut_size - 1)``; for Chebyshev that is
    ``h^2 d^2 (d^2 - 1) / 24``, e.g. 4.0e-5 at degree 8 and 3.3e-3 at degree 24 with the default 4096 points.
    ``warpkan.kernels.poly.lut_error_bound`` gives it for every basis.

    ``coeffs`` has ChebyKAN's ``cheby_coeffs`` shape [in, out, degree + 1], stored contiguously (every torch
    optimiser and utility takes it: LBFGS, ``parameters_to_vector``, FSDP2); each step copies it into the
    kernels' layout [in, degree + 1, out] (output index innermost, the coalesced one) once (with bf16 GEMMs,
    into their bf16 operand by the same launch), and its gradient back. ``contiguous_parameters=False`` stores
    it as a view of that layout instead, which saves the copies (``scripts/param_layout_cost.py``) but which
    LBFGS, ``parameters_to_vector`` and FSDP2 refuse.
    A state dict of ChebyKAN's ``ChebyKANLayer`` (``cheby_coeffs``, ``arange``) loads through a load hook and,
    in exact mode, gives the same outputs (to rounding: ``cos(d acos t)`` and the recurrence differ there).

    ``strategy``: ``"stencil"`` (the edge engine's kernels: warp-tiled on CUDA where the degree fits, per-thread
    elsewhere; their backward adds by atomics on CUDA), ``"gemm"`` (the engine writes the dense basis and cuBLAS
    contracts it) or ``"auto"`` (gemm, the faster wherever the GPU time decides:
    ``warpkan.torch_bridge.poly_ops.AUTO_STRATEGY``; an eager CUDA call of a small layer, which waits on the host,
    takes the stencil kernels: ``warpkan.kernels.edge.strategy.single_slot_strategy``. Pass
    ``deterministic=True`` for bitwise reproducible gradients there).
    ``precision`` is the gemm strategy's, with KANLinear's rule (``warpkan.torch_bridge.edge_driver``): "auto"
    follows bf16 autocast and torch's float32 matmul setting, "fp32", "tf32" and "bf16" force one (tf32 and bf16
    for float32 layers only); the stencil kernels ignore it.

    dtypes: the layer computes in float32 or float64. Under bf16/fp16 autocast it takes x in fp32 (its
    parameters stay fp32; the gemm strategy's contractions follow ``precision``, bf16 for "auto" under bf16
    autocast) and returns the autocast dtype, made inside its autograd node; ``.half()``, ``.bfloat16()`` and
    other conversions to a 16-bit dtype are refused with a TypeError (the layer is left unchanged). NaN in one
    row of x makes that row of the output NaN; as under autograd, it also makes the coefficient gradients of
    that input NaN.

    Higher-order derivatives (``create_graph=True``, and Taylor mode: ``warpkan.torch_bridge.jet``) come from the
    edge engine's bases and their x-derivatives, to the third order; the ``torch.func`` transforms raise. In LUT
    mode those routes take the values from the value table (the forward's) and every x-derivative, u_x included,
    from the exact recurrence: the interpolant's second derivative is piecewise constant and a few percent off
    (Legendre degree 8: 0.02097 against 0.02148), wrong for a physics-informed residual, and a u_x from the
    derivative table (O(h^2) off) would not be the derivative u_xx is taken of. The first-order backward of plain
    training keeps reading the derivative table (the fast path); after ``create_graph`` it is also what carries
    a loss's gradient back through the layer's values (a loss term in u, the points later layers' derivatives are
    taken at), where Taylor mode's backward uses the exact ``P_d'``: the two routes' parameter gradients differ
    by the derivative table's error (``lut_error_bound``'s second bound). ``docs/perf-notes-engine.md`` has the
    measurements (a 2-32-32-1 PINN step on the CPU: create_graph at 0.87x exact mode's time, Taylor mode at
    0.99x). Built with ``device="meta"``, the layer infers output shapes on meta inputs.

    Args:
        in_features: number of inputs (a positive int).
        out_features: number of outputs (a positive int).
        degree: the highest basis degree D, an int in [0, 64] (D + 1 basis functions per edge).
        basis: ``"chebyshev"``, ``"legendre"``, ``"hermite"``, ``"gegenbauer"``, ``"jacobi"`` or ``"fourier"``.
        mode: ``"lut"`` (interpolated tables) or ``"exact"`` (the recurrence).
        lut_size: points of each table on [-1, 1] in ``"lut"`` mode, an int >= 2.
        bias: add a learned bias [out] (zero at initialisation).
        alpha: the gegenbauer (> -1/2, != 0) and jacobi (> -1) parameter, a finite number; ignored by the
            other bases.
        beta: the jacobi parameter (> -1), a finite number; ignored by the other bases.
        strategy: ``"stencil"``, ``"gemm"`` or ``"auto"`` (above).
        precision: ``"auto"``, ``"fp32"``, ``"tf32"`` or ``"bf16"``: the gemm strategy's contractions (above).
        deterministic: the stencil strategy's backward without atomics (bitwise reproducible run to run; the
            gemm strategy's cuBLAS contractions are reproducible on one device already).
        contiguous_parameters: store the parameters contiguously in their public shapes (the default; every
            torch optimiser and utility takes them), or as views of the kernels' layout (False).
        device: the device of the parameters (torch's default when None).
        dtype: the parameters' dtype, float32 or float64 (torch's default dtype when None).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        degree: int,
        basis: str = "chebyshev",
        mode: str = "lut",
        lut_size: int = DEFAULT_LUT_SIZE,
        bias: bool = False,
        alpha: float = 1.0,
        beta: float = 1.0,
        strategy: str = "auto",
        precision: str = "auto",
        deterministic: bool = False,
        contiguous_parameters: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        check_device(device)
        in_features, out_features, degree, mode, lut_size, alpha, beta = kp.check_layer_args(
            in_features, out_features, degree, basis, mode, lut_size, alpha, beta)
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        dtype = layer_dtype(dtype)
        self.strategy, self.precision, self.deterministic = strategy, precision, bool(deterministic)
        self.in_features, self.out_features, self.degree = in_features, out_features, degree
        self.basis, self.mode, self.lut_size = basis, mode, lut_size
        self.alpha, self.beta = alpha, beta
        self.coeffs = layout_parameter((in_features, degree + 1, out_features), (0, 2, 1), device, dtype,
                                       contiguous_parameters)
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype)) if bias else None
        self.reset_parameters()
        self.register_load_state_dict_pre_hook(_load_chebykan_state)

    def reset_parameters(self) -> None:
        # ChebyKAN's initialisation
        std = 1.0 / (self.in_features * (self.degree + 1))
        init_public(self.coeffs, lambda t: nn.init.normal_(t, mean=0.0, std=std))  # whatever contiguous_parameters
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """y (..., out) for x (..., in): a tensor of the layer's dtype and device (any float dtype under
        autocast, the result then in the autocast dtype). Non-contiguous x works; an empty batch gives an
        empty output."""
        check_tensor("x", x, ndim_min=1, last_dim=self.in_features, dtypes=())
        if x.device != self.coeffs.device:
            raise ValueError(f"x must be on the layer's device {self.coeffs.device}, got {x.device}")
        cast_to = autocast_dtype(x.device)
        # resolved here: inside, autocast is off and the op could no longer see it ("auto" is bf16 under it)
        precision = call_precision(self.precision, cast_to, self.coeffs.dtype)
        if cast_to is not None:
            with torch.autocast(x.device.type, enabled=False):
                # y comes back in the autocast dtype from the layer's node (edge_ops.edge_apply's out_dtype)
                return self._forward(x.to(self.coeffs.dtype), precision, cast_to)
        check_input_dtype(x, self.coeffs.dtype, FLOAT_DTYPES)
        return self._forward(x, precision)

    def _forward(self, x, precision, out_dtype=None):
        # the configuration was checked at construction and x above: the op directly, no per-call re-checks
        if self.precision in ("tf32", "bf16") and x.dtype != torch.float32:
            raise ValueError(f"precision={self.precision!r} needs a float32 layer, got {x.dtype}")
        lut_size = self.lut_size if self.mode == "lut" else 0
        return poly_apply(x, self.coeffs, self.bias, self.basis, lut_size, self.alpha, self.beta, self.strategy,
                          precision, self.deterministic, layer_layout=True, out_dtype=out_dtype)

    def edge_view(self, x: torch.Tensor, *, exact_derivatives: bool = False) -> EdgeView:
        """The layer as the edge engine sees it at the rows ``x``: its polynomial family (exact or LUT) and
        frame, the coefficient table and the bias. What Taylor mode and the interpretability tools evaluate
        the layer's edges with.

        Args:
            x: rows [N, in] of the layer's dtype and device (the family's kernels and tables follow x's
                dtype).
            exact_derivatives: the spec of the layer's higher-order routes (``create_graph=True``, Taylor
                mode): in LUT mode the values from the value table and every x-derivative from the basis's
                exact recurrence, where the forward's spec (False) takes the first derivative from the
                derivative table. The same spec in exact mode.

        Returns:
            EdgeView: ``coef`` [in, D + 1, out] is ``coeffs`` in the kernels' layout (a view: gradients reach
            it), ``bias`` the layer's; no base path or scaler (the weight is ``coef`` itself).
        """
        check_view_rows(x, self.in_features, self.coeffs)
        lut_size = self.lut_size if self.mode == "lut" else 0
        make_spec = derivative_spec if exact_derivatives else basis_spec
        spec = make_spec(x, self.basis, lut_size, self.alpha, self.beta, self.degree + 1)
        return EdgeView(spec, self.coeffs.permute(0, 2, 1), None, None, self.bias, None)

    def extra_repr(self) -> str:
        extra = f", alpha={self.alpha}" if kp.BASES[self.basis].uses_alpha else ""
        extra += f", beta={self.beta}" if kp.BASES[self.basis].uses_beta else ""
        lut = f", lut_size={self.lut_size}" if self.mode == "lut" else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, degree={self.degree}, "
                f"basis={self.basis!r}{extra}, mode={self.mode!r}{lut}, bias={self.bias is not None}, "
                f"strategy={self.strategy!r}" + (f", precision={self.precision!r}" if self.precision != "auto" else "")
                + (", deterministic=True" if self.deterministic else ""))


class ChebyKANLinear(PolyKANLinear):
    """:class:`PolyKANLinear` with the Chebyshev basis: ChebyKAN's ``ChebyKANLayer(input_dim, output_dim,
    degree)`` argument order, and its state dicts load.

    Args:
        in_features: number of inputs (a positive int); ChebyKAN's ``input_dim``.
        out_features: number of outputs (a positive int); ChebyKAN's ``output_dim``.
        degree: the highest Chebyshev degree D, an int in [0, 64].
        mode: ``"lut"`` (interpolated tables) or ``"exact"`` (the recurrence).
        lut_size: points of each table on [-1, 1] in ``"lut"`` mode, an int >= 2.
        bias: add a learned bias [out] (zero at initialisation).
        strategy: ``"stencil"``, ``"gemm"`` or ``"auto"`` (see :class:`PolyKANLinear`).
        precision: ``"auto"``, ``"fp32"``, ``"tf32"`` or ``"bf16"`` (see :class:`PolyKANLinear`).
        deterministic: bitwise-reproducible gradients (see :class:`PolyKANLinear`).
        contiguous_parameters: store the parameters contiguously in their public shapes (the default; every
            torch optimiser and utility takes them), or as views of the kernels' layout (False).
        device: the device of the parameters (torch's default when None).
        dtype: the parameters' dtype, float32 or float64 (torch's default dtype when None).
    """

    def __init__(self, in_features: int, out_features: int, degree: int, mode: str = "lut",
                 lut_size: int = DEFAULT_LUT_SIZE, bias: bool = False, strategy: str = "auto",
                 precision: str = "auto", deterministic: bool = False, contiguous_parameters: bool = True,
                 device=None, dtype=None):
        super().__init__(in_features, out_features, degree, basis="chebyshev", mode=mode, lut_size=lut_size,
                         bias=bias, strategy=strategy, precision=precision, deterministic=deterministic,
                         contiguous_parameters=contiguous_parameters, device=device, dtype=dtype)


def _load_chebykan_state(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                         error_msgs):
    """ChebyKAN's ``cheby_coeffs`` [in, out, D + 1] is our ``coeffs`` (same public shape); its ``arange``
    buffer is implied by the degree."""
    key = prefix + "cheby_coeffs"
    if key not in state_dict:
        return
    if module.basis != "chebyshev":
        error_msgs.append(f"{key}: ChebyKAN coefficients need basis='chebyshev', this layer has {module.basis!r}")
        return
    state_dict[prefix + "coeffs"] = state_dict.pop(key)
    state_dict.pop(prefix + "arange", None)
