"""Warp-native B-spline KAN layer: parameters in ``wp.array``s, differentiable under ``wp.Tape``.

The same kernels as the torch layer; the hand-written backward is recorded with ``Tape.record_func``.
"""

import math

import numpy as np
import warp as wp

from ..kernels import bspline as kb
from ..kernels.edge import tiled as edge_tiled
from ..kernels.edge.strategy import choose_strategy
from ._common import NP_DTYPES as _NP_DTYPES
from ._common import check_device, check_dtype, check_strategy, layer_input
from ._state import WarpState
from ._tape import active_tape, new_output, record_backward

__all__ = ["KANLinear", "cuda_auto_strategy", "CUDA_GEMM_MIN_EDGES", "CUDA_GEMM_MIN_ROWS",
           "CUDA_GEMM_MAX_COEFFICIENTS"]

# "auto" on CUDA: the gemm strategy (the tile GEMMs) for layers at least this wide (in x out edges), long (rows)
# and short-gridded (coefficients an input), else the stencil kernels. Measured on an H200 (fp32 fwd+bwd ms,
# `python scripts/native_wide_timing.py --out DIR`, gemm against stencil): (65536, 256 -> 256, G = 8) 11.6
# against 19.0; (16384, 128 -> 128, G = 8) 1.25 against 1.25; (65536, 64 -> 64, G = 8) 1.27-2.54 against
# 1.39-1.41 across two runs; (4096, 64 -> 64, G = 5) 1.28-2.01 against 0.33-0.45. The gemm strategy's work grows
# with the coefficients an input (G + k, each a row of the dense basis) and the stencil kernels' does not, so
# the gemm side of the rule stops at the grid measured.
CUDA_GEMM_MIN_EDGES = 256 * 256
CUDA_GEMM_MIN_ROWS = 2**14
CUDA_GEMM_MAX_COEFFICIENTS = 11


def cuda_auto_strategy(n_rows: int, n_in: int, n_out: int, n_coef: int) -> str:
    """The strategy "auto" takes for a call on CUDA (see :data:`CUDA_GEMM_MIN_EDGES`)."""
    wide = n_in * n_out >= CUDA_GEMM_MIN_EDGES and n_rows >= CUDA_GEMM_MIN_ROWS
    return "gemm" if wide and n_coef <= CUDA_GEMM_MAX_COEFFICIENTS else "stencil"


class KANLinear(WarpState):
    """y[n, o] = sum_i base_weight[o, i] silu(x[n, i]) + spline_scaler[o, i] spline_{o,i}(x[n, i]).

    Call it on a ``wp.array2d`` x [N, in]; it returns y [N, out]. Under an active ``wp.Tape`` the output
    carries a gradient array and ``tape.backward()`` accumulates into ``x.grad`` (when x requires grad) and
    into the gradients of :meth:`parameters`.

    Parameters are stored in the kernel layout (output index innermost): ``base_weight_t`` [in, out],
    ``scaler_t`` [in, out], ``coef`` [in, G + k, out]; ``grid`` [in, G + 2k + 1] holds the knots.
    :meth:`state_dict` / :meth:`load_state_dict` use efficient-kan's names and layout, so a state dict moves
    between this layer and ``warpkan.torch_bridge.KANLinear`` (as numpy arrays).

    Args:
        in_features: number of inputs (a positive int).
        out_features: number of outputs (a positive int).
        grid_size: number of grid intervals G on ``grid_range`` (a positive int).
        spline_order: order k of the B-splines, an int in [1, 5] (3: cubic).
        grid_range: ``(lo, hi)``, finite with lo < hi: the interval the G grid intervals cover (the knots
            extend k intervals past each end).
        use_base: include the base path ``base_weight @ silu(x)`` (else no base weight is trained).
        scale_noise: scale of the initial spline coefficients, uniform in ``+-scale_noise / (2 grid_size)``.
        deterministic: make every gradient bitwise reproducible from run to run (the gemm strategy's always are).
        device: the Warp device (or its name) of the parameters (Warp's default device when None).
        dtype: ``wp.float32`` or ``wp.float64``.
        seed: seed of the numpy generator that draws the initial parameters.
        strategy: ``"stencil"`` (the engine's per-edge kernels), ``"gemm"`` (the dense basis multiplied with the
            combined weight by ``wp.tile_matmul``: :mod:`warpkan.kernels.edge.tile_gemm`) or ``"auto"``, which
            picks one per call: on CUDA by :func:`cuda_auto_strategy` (gemm for wide, long calls on short
            grids), elsewhere by the torch layer's rule (:func:`warpkan.kernels.edge.strategy.choose_strategy`).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        grid_size: int = 5,
        spline_order: int = 3,
        grid_range=(-1.0, 1.0),
        use_base: bool = True,
        scale_noise: float = 0.1,
        deterministic: bool = False,
        device=None,
        dtype=wp.float32,
        seed: int = 0,
        strategy: str = "auto",
    ):
        dtype = check_dtype(dtype)
        in_features, out_features, grid_size, spline_order, (lo, hi) = kb.check_layer_args(
            in_features, out_features, grid_size, spline_order, grid_range)
        self.strategy = check_strategy(strategy)
        self.in_features, self.out_features = in_features, out_features
        self.grid_size, self.spline_order = grid_size, spline_order
        self.use_base, self.deterministic = use_base, deterministic
        self.device = check_device(device)
        self.dtype = dtype
        np_dtype = _NP_DTYPES[dtype]
        rng = np.random.default_rng(seed)
        h = (hi - lo) / grid_size
        knots = (np.arange(-spline_order, grid_size + spline_order + 1) * h + lo).astype(np_dtype)
        kb.check_grid(knots[None], f"the knots of grid_range={tuple(grid_range)} in {np_dtype.__name__}")
        bound = 1.0 / math.sqrt(in_features)  # kaiming_uniform(a=sqrt(5)) of nn.Linear
        self.grid = wp.array(np.tile(knots, (in_features, 1)).astype(np_dtype), dtype=dtype, device=self.device)
        self.base_weight_t = self._param(rng.uniform(-bound, bound, (in_features, out_features)) * use_base)
        self.scaler_t = self._param(rng.uniform(-bound, bound, (in_features, out_features)))
        noise = (rng.uniform(-0.5, 0.5, (in_features, grid_size + spline_order, out_features))) * scale_noise / grid_size
        self.coef = self._param(noise)
        self.uniform = kb.grid_is_uniform(knots[None])

    def _param(self, values) -> wp.array:
        return wp.array(np.ascontiguousarray(values, dtype=_NP_DTYPES[self.dtype]), dtype=self.dtype,
                        device=self.device, requires_grad=True)

    def parameters(self) -> list:
        return [self.base_weight_t, self.scaler_t, self.coef] if self.use_base else [self.scaler_t, self.coef]

    def __call__(self, x: wp.array) -> wp.array:
        """y [N, out] for x [N, in] (a ``wp.array`` of the layer's dtype and device; strided or transposed
        works, and N may be 0). Under an active ``wp.Tape`` the backward is recorded: ``tape.backward()``
        accumulates into ``x.grad`` (when x requires grad) and into the gradients of :meth:`parameters`."""
        tape = active_tape()
        x = layer_input(x, self.in_features, self.dtype, self.device, tape)
        y = new_output((x.shape[0], self.out_features), self.dtype, self.device, tape)
        if x.shape[0] == 0:
            return y
        args = (x, self.grid, self.base_weight_t, self.scaler_t, self.coef)
        gemm = self.resolve_strategy(x.shape[0]) == "gemm"
        if gemm:
            kb.launch_gemm_forward(*args, y, self.spline_order, self.uniform, self.use_base)
        else:
            kb.launch_forward(*args, y, self.spline_order, self.uniform, self.use_base)

        def backward():
            grads = dict(dx=x.grad if x.requires_grad else None, d_base_weight_t=self.base_weight_t.grad,
                         d_scaler_t=self.scaler_t.grad, d_coef=self.coef.grad)
            if gemm:
                kb.launch_gemm_backward(y.grad, *args, self.spline_order, self.uniform, self.use_base, **grads)
            else:
                kb.launch_backward(y.grad, *args, self.spline_order, self.uniform, self.use_base, **grads,
                                   deterministic=self.deterministic)

        record_backward(tape, backward, [x, y, self.base_weight_t, self.scaler_t, self.coef])
        return y

    def resolve_strategy(self, n_rows: int) -> str:
        """The strategy a call on ``n_rows`` rows takes: the layer's, or for "auto" on CUDA
        :func:`cuda_auto_strategy` (the tile GEMMs for wide, long, short-gridded calls, else the stencil
        kernels), and elsewhere the torch layer's rule
        (:func:`~warpkan.kernels.edge.strategy.choose_strategy` at full fp32 precision; host-bound unless
        Warp is capturing a CUDA graph on the layer's device)."""
        if self.strategy != "auto":
            return self.strategy
        n_coef = self.grid_size + self.spline_order
        if self.device.is_cuda:
            return cuda_auto_strategy(n_rows, self.in_features, self.out_features, n_coef)
        family = kb.family_of(self.spline_order, self.uniform, self.coef)
        tiled = edge_tiled.tiled_applies(family, self.device.is_cuda, n_coef)
        return choose_strategy(n_rows, self.in_features, self.out_features, n_coef, tiled, "fp32",
                               host_bound=not self.device.is_capturing)

    # ---------------------------------------------------------------- state (efficient-kan layout)
    def state_dict(self) -> dict:
        return {
            "base_weight": self.base_weight_t.numpy().T.copy(),
            "spline_weight": self.coef.numpy().transpose(2, 0, 1).copy(),
            "spline_scaler": self.scaler_t.numpy().T.copy(),
            "grid": self.grid.numpy().copy(),
        }

    def load_state_dict(self, state: dict) -> None:
        expected = {
            "base_weight": (self.out_features, self.in_features),
            "spline_weight": (self.out_features, self.in_features, self.grid_size + self.spline_order),
            "spline_scaler": (self.out_features, self.in_features),
            "grid": (self.in_features, self.grid_size + 2 * self.spline_order + 1),
        }
        for key, shape in expected.items():
            if key not in state:
                raise ValueError(f"state dict is missing {key!r}")
            if tuple(np.shape(state[key])) != shape:
                raise ValueError(f"{key} must have shape {shape}, got {tuple(np.shape(state[key]))}")
        np_dtype = _NP_DTYPES[self.dtype]
        grid = np.ascontiguousarray(state["grid"], dtype=np_dtype)
        kb.check_grid(grid)  # before anything is assigned: a refused state leaves the layer as it was
        self.base_weight_t.assign(np.ascontiguousarray(np.asarray(state["base_weight"]).T, dtype=np_dtype))
        self.coef.assign(np.ascontiguousarray(np.asarray(state["spline_weight"]).transpose(1, 2, 0), dtype=np_dtype))
        self.scaler_t.assign(np.ascontiguousarray(np.asarray(state["spline_scaler"]).T, dtype=np_dtype))
        self.grid.assign(grid)
        # the matrix-form fast path only where every row is uniform to the rounding of the layer's dtype
        self.uniform = kb.grid_is_uniform(grid)

    def config(self) -> dict:
        return {
            "type": "KANLinear", "in_features": self.in_features, "out_features": self.out_features,
            "grid_size": self.grid_size, "spline_order": self.spline_order, "use_base": self.use_base,
        }
