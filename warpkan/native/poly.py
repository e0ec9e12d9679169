"""Warp-native polynomial KAN layers: parameters in ``wp.array``s, differentiable under ``wp.Tape``.

The same kernels as the torch layers; the hand-written backward is recorded with ``Tape.record_func``.
"""

import numpy as np
import warp as wp

from ..kernels import poly as kp
from ._state import WarpState
from ._tape import active_tape, new_output, record_backward

__all__ = ["PolyKANLinear", "ChebyKANLinear"]

_NP_DTYPES = {wp.float32: np.float32, wp.float64: np.float64}
DEFAULT_LUT_SIZE = 4096
_MODES = ("exact", "lut")


class PolyKANLinear(WarpState):
    """``y[n, o] = sum_i sum_{d=0..degree} coeffs[i, d, o] P_d(tanh x[n, i]) (+ bias[o])``.

    Call it on a ``wp.array2d`` x [N, in]; it returns y [N, out]. Under an active ``wp.Tape`` the output
    carries a gradient array and ``tape.backward()`` accumulates into ``x.grad`` (when x requires grad) and
    into the gradients of :meth:`parameters`.

    ``coeffs`` is stored in the kernel layout [in, degree + 1, out]. :meth:`state_dict` / :meth:`load_state_dict`
    use the torch layer's names and public shapes (``coeffs`` [in, out, degree + 1], ``bias`` [out]) and also
    accept ChebyKAN's ``cheby_coeffs``, so a state dict moves between this layer, ``warpkan.torch_bridge``'s and
    ChebyKAN's (as numpy arrays). Bases, modes and the LUT error bound: see ``warpkan.kernels.poly``.
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
    ):
        if dtype not in _NP_DTYPES:
            raise TypeError(f"dtype must be wp.float32 or wp.float64, got {dtype}")
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        kp.check_basis(basis, degree, alpha, beta)
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
        if isinstance(lut_size, bool) or not isinstance(lut_size, int) or lut_size < 2:
            raise ValueError(f"lut_size must be an int >= 2, got {lut_size!r}")
        self.in_features, self.out_features, self.degree = in_features, out_features, degree
        self.basis, self.mode, self.lut_size = basis, mode, lut_size
        self.alpha, self.beta = float(alpha), float(beta)
        self.device = wp.get_device(device)
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
        if not isinstance(x, wp.array) or x.ndim != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"x must be a wp.array2d of shape [N, {self.in_features}], got {getattr(x, 'shape', type(x))}")
        if x.dtype != self.dtype:
            raise TypeError(f"x must have dtype {wp.types.type_repr(self.dtype)}, got {wp.types.type_repr(x.dtype)}")
        if x.device != self.device:
            raise ValueError(f"x must be on {self.device}, got {x.device}")
        tape = active_tape()
        y = new_output((x.shape[0], self.out_features), self.dtype, self.device, tape)
        tables = self._tables()
        config = dict(basis=self.basis, lut=tables, alpha=self.alpha, beta=self.beta)
        kp.launch_forward(x, self.coeffs, y, bias=self.bias, **config)

        def backward():
            kp.launch_backward(
                y.grad, x, self.coeffs, **config,
                dx=x.grad if x.requires_grad else None,
                d_coeffs=self.coeffs.grad,
                d_bias=self.bias.grad if self.bias is not None else None,
            )

        record_backward(tape, backward, [x, y, *self.parameters()])
        return y

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
    """:class:`PolyKANLinear` with the Chebyshev basis (ChebyKAN's argument order)."""

    def __init__(self, in_features: int, out_features: int, degree: int, mode: str = "lut",
                 lut_size: int = DEFAULT_LUT_SIZE, bias: bool = False, device=None, dtype=wp.float32, seed: int = 0):
        super().__init__(in_features, out_features, degree, basis="chebyshev", mode=mode, lut_size=lut_size,
                         bias=bias, device=device, dtype=dtype, seed=seed)
