"""Warp-native polynomial KAN layers: parameters in ``wp.array``s, differentiable under ``wp.Tape``.

The same kernels as the torch layers; the hand-written backward is recorded with ``Tape.record_func``.
"""

import numpy as np
import warp as wp

from ..kernels import poly as kp
from ..kernels.edge.strategy import SINGLE_SLOT_AUTO_STRATEGY
from ._common import NP_DTYPES as _NP_DTYPES
from ._common import check_device, check_dtype, check_strategy, layer_input
from ._state import WarpState
from ._tape import active_tape, new_output, record_backward

__all__ = ["PolyKANLinear", "ChebyKANLinear"]

DEFAULT_LUT_SIZE = 4096


class PolyKANLinear(WarpState):
    """``y[n, o] = sum_i sum_{d=0..degree} coeffs[i, d, o] P_d(tanh x[n, i]) (+ bias[o])``.

    Call it on a ``wp.array2d`` x [N, in]; it returns y [N, out]. Under an active ``wp.Tape`` the output
    carries a gradient array and ``tape.backward()`` accumulates into ``x.grad`` (when x requires grad) and
    into the gradients of :meth:`parameters`.

    ``coeffs`` is stored in the kernel layout [in, degree + 1, out]. :meth:`state_dict` / :meth:`load_state_dict`
    use the torch layer's names and public shapes (``coeffs`` [in, out, degree + 1], ``bias`` [out]) and also
    accept ChebyKAN's ``cheby_coeffs``, so a state dict moves between this layer, ``warpkan.torch_bridge``'s and
    ChebyKAN's (as numpy arrays). Bases, modes and the LUT error bound: see ``warpkan.kernels.poly``.

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
        device: the Warp device (or its name) of the parameters (Warp's default device when None).
        dtype: ``wp.float32`` or ``wp.float64``.
        seed: seed of the numpy generator that draws the initial coefficients.
        strategy: ``"stencil"`` (the engine's per-edge kernels), ``"gemm"`` (the dense basis multiplied with the
            coefficient table by ``wp.tile_matmul``: :mod:`warpkan.kernels.edge.tile_gemm`) or ``"auto"``: gemm at
            every shape (:data:`warpkan.kernels.edge.strategy.SINGLE_SLOT_AUTO_STRATEGY`, the torch layer's choice
            wherever the GPU time decides; its eager small calls, which wait on torch's host work, are not
            measured for this layer).
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
        device=None,
        dtype=wp.float32,
        seed: int = 0,
        strategy: str = "auto",
    ):
        dtype = check_dtype(dtype)
        in_features, out_features, degree, mode, lut_size, alpha, beta = kp.check_layer_args(
            in_features, out_features, degree, basis, mode, lut_size, alpha, beta)
        self.strategy = check_strategy(strategy)
        self.in_features, self.out_features, self.degree = in_features, out_features, degree
        self.basis, self.mode, self.lut_size = basis, mode, lut_size
        self.alpha, self.beta = alpha, beta
        self.device = check_device(device)
        self.dtype = dtype
        rng = np.random.default_rng(seed)
        std = 1.0 / (in_features * (degree + 1))  # ChebyKAN's initialisation
        self.coeffs = self._param(rng.normal(0.0, std, (in_features, degree + 1, out_features)))
        self.bias = self._param(np.zeros(out_features)) if bias else None

    def _param(self, values) -> wp.array:
        return wp.array(np.ascontiguousarray(values, dtype=_NP_DTYPES[self.dtype]), dtype=self.dtype,
                        device=self.device, requires_grad=True)

    def parameters(self) -> list:
        return [self.coeffs] if self.bias is None else [self.coeffs, self.bias]

    def _tables(self):
        if self.mode != "lut":
            return None
        scalar = "float64" if self.dtype == wp.float64 else "float32"
        return kp.build_lut(self.basis, self.degree, self.lut_size, self.alpha, self.beta, scalar, self.device)

    def __call__(self, x: wp.array) -> wp.array:
        """y [N, out] for x [N, in] (a ``wp.array`` of the layer's dtype and device; strided or transposed
        works, and N may be 0). Under an active ``wp.Tape`` the backward is recorded: ``tape.backward()``
        accumulates into ``x.grad`` (when x requires grad) and into the gradients of :meth:`parameters`."""
        tape = active_tape()
        x = layer_input(x, self.in_features, self.dtype, self.device, tape)
        y = new_output((x.shape[0], self.out_features), self.dtype, self.device, tape)
        if x.shape[0] == 0:
            return y
        tables = self._tables()
        config = dict(basis=self.basis, lut=tables, alpha=self.alpha, beta=self.beta)
        gemm = self.resolve_strategy(x.shape[0]) == "gemm"
        (kp.launch_gemm_forward if gemm else kp.launch_forward)(x, self.coeffs, y, bias=self.bias, **config)

        def backward():
            (kp.launch_gemm_backward if gemm else kp.launch_backward)(
                y.grad, x, self.coeffs, **config,
                dx=x.grad if x.requires_grad else None,
                d_coeffs=self.coeffs.grad,
                d_bias=self.bias.grad if self.bias is not None else None,
            )

        record_backward(tape, backward, [x, y, *self.parameters()])
        return y

    def resolve_strategy(self, n_rows: int) -> str:
        """The strategy a call on ``n_rows`` rows takes: the layer's, or for "auto" gemm at every shape."""
        return SINGLE_SLOT_AUTO_STRATEGY if self.strategy == "auto" else self.strategy

    # ---------------------------------------------------------------- state (the torch layer's names)
    def state_dict(self) -> dict:
        state = {"coeffs": self.coeffs.numpy().transpose(0, 2, 1).copy()}
        if self.bias is not None:
            state["bias"] = self.bias.numpy().copy()
        return state

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        if "cheby_coeffs" in state:
            if self.basis != "chebyshev":
                raise ValueError(f"cheby_coeffs need basis='chebyshev', this layer has {self.basis!r}")
            state["coeffs"] = state.pop("cheby_coeffs")
            state.pop("arange", None)
        expected = {"coeffs": (self.in_features, self.out_features, self.degree + 1)}
        if self.bias is not None:
            expected["bias"] = (self.out_features,)
        for key, shape in expected.items():
            if key not in state:
                raise ValueError(f"state dict is missing {key!r}")
            if tuple(np.shape(state[key])) != shape:
                raise ValueError(f"{key} must have shape {shape}, got {tuple(np.shape(state[key]))}")
        np_dtype = _NP_DTYPES[self.dtype]
        self.coeffs.assign(np.ascontiguousarray(np.asarray(state["coeffs"]).transpose(0, 2, 1), dtype=np_dtype))
        if self.bias is not None:
            self.bias.assign(np.ascontiguousarray(state["bias"], dtype=np_dtype))

    def config(self) -> dict:
        return {
            "type": type(self).__name__, "in_features": self.in_features, "out_features": self.out_features,
            "degree": self.degree, "basis": self.basis, "mode": self.mode, "lut_size": self.lut_size,
            "bias": self.bias is not None, "alpha": self.alpha, "beta": self.beta,
        }


class ChebyKANLinear(PolyKANLinear):
    """:class:`PolyKANLinear` with the Chebyshev basis (ChebyKAN's argument order).

    Args:
        in_features: number of inputs (a positive int); ChebyKAN's ``input_dim``.
        out_features: number of outputs (a positive int); ChebyKAN's ``output_dim``.
        degree: the highest Chebyshev degree D, an int in [0, 64].
        mode: ``"lut"`` (interpolated tables) or ``"exact"`` (the recurrence).
        lut_size: points of each table on [-1, 1] in ``"lut"`` mode, an int >= 2.
        bias: add a learned bias [out] (zero at initialisation).
        device: the Warp device (or its name) of the parameters (Warp's default device when None).
        dtype: ``wp.float32`` or ``wp.float64``.
        seed: seed of the numpy generator that draws the initial coefficients.
        strategy: ``"auto"``, ``"stencil"`` or ``"gemm"`` (see :class:`PolyKANLinear`).
    """

    def __init__(self, in_features: int, out_features: int, degree: int, mode: str = "lut",
                 lut_size: int = DEFAULT_LUT_SIZE, bias: bool = False, device=None, dtype=wp.float32, seed: int = 0,
                 strategy: str = "auto"):
        super().__init__(in_features, out_features, degree, basis="chebyshev", mode=mode, lut_size=lut_size,
                         bias=bias, device=device, dtype=dtype, seed=seed, strategy=strategy)
