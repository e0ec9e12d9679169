"""Warp-native group-rational layers (KAT): parameters in ``wp.array``s, differentiable under ``wp.Tape``.

The same kernels as the torch layers (``warpkan.kernels.rational``); the hand-written backward is recorded with
``Tape.record_func`` and accumulates into ``x.grad`` and the parameters' gradients (Warp's convention).
"""

import functools
import math

import numpy as np
import warp as wp

from ..kernels import rational as kr
from ..kernels._runtime import launch
from .. import _checks
from ._common import NP_DTYPES as _NP_DTYPES
from ._common import check_device, check_dtype, layer_input
from ._state import WarpState
from ._tape import active_tape, new_output, record_backward

__all__ = ["GroupRational", "GRKANLinear"]

class GroupRational(WarpState):
    """``y = F_g(x)`` for x [N, num_features] (see ``warpkan.torch_bridge.GroupRational`` for the maths, the
    variants and the inits). ``weight_numerator`` [1 or G, m + 1] and ``weight_denominator`` [G, n] are
    ``wp.array``s with ``requires_grad=True``; :meth:`state_dict` uses the torch layer's (and KAT's) names.

    Args:
        num_features: number of channels C, the last dimension of x (a positive int).
        num_groups: number of groups G sharing a denominator, a positive int that divides ``num_features``.
        order: ``(m, n)``, the numerator and denominator degrees: ints with 0 <= m <= 12 and 1 <= n <= 12.
        variant: ``"A"`` (``Q = 1 + sum_j |b_j| |x|^(j+1)``) or ``"B"`` (``Q = 1 + |sum_j b_j x^(j+1)|``).
        init: ``"identity"`` (any order), ``"swish"`` or ``"gelu"`` (the fitted orders only).
        shared_numerator: one numerator for all groups (KAT's layout) instead of one per group.
        deterministic: make the coefficient gradients bitwise reproducible.
        device: the Warp device (or its name) of the coefficients (Warp's default device when None).
        dtype: ``wp.float32`` or ``wp.float64``.
    """

    def __init__(
        self,
        num_features: int,
        num_groups: int = 8,
        order: tuple = (5, 4),
        variant: str = "A",
        init: str = "swish",
        shared_numerator: bool = True,
        deterministic: bool = False,
        device=None,
        dtype=wp.float32,
    ):
        dtype = check_dtype(dtype)
        num_features, num_groups, order, variant, init = kr.check_layer_args(num_features, num_groups, order, variant,
                                                                              init)
        numerator, denominator = kr.init_coefficients(init, order, variant)
        self.num_features, self.num_groups = num_features, num_groups
        self.order, self.variant, self.init = order, variant, init
        self.deterministic = deterministic
        self.device = check_device(device)
        self.dtype = dtype
        rows = 1 if shared_numerator else num_groups
        self.weight_numerator = self._param(np.tile(numerator, (rows, 1)))
        self.weight_denominator = self._param(np.tile(denominator, (num_groups, 1)))

    def _param(self, values) -> wp.array:
        return wp.array(np.ascontiguousarray(values, dtype=_NP_DTYPES[self.dtype]), dtype=self.dtype,
                        device=self.device, requires_grad=True)

    def parameters(self) -> list:
        return [self.weight_numerator, self.weight_denominator]

    def gain(self) -> float:
        return kr.second_moment(self.weight_numerator.numpy()[0], self.weight_denominator.numpy()[0], self.variant)

    def __call__(self, x: wp.array) -> wp.array:
        """y = F_g(x), of x's shape, for x [N, num_features] (a ``wp.array`` of the layer's dtype and device;
        strided or transposed works, and N may be 0). Under an active ``wp.Tape`` the backward is recorded:
        ``tape.backward()`` accumulates into ``x.grad`` (when x requires grad) and into the gradients of
        :meth:`parameters`."""
        tape = active_tape()
        x = layer_input(x, self.num_features, self.dtype, self.device, tape)
        y = new_output(x.shape, self.dtype, self.device, tape)
        if x.shape[0] == 0:
            return y
        a, b = self.weight_numerator, self.weight_denominator
        kr.launch_forward(x, a, b, y, self.num_groups, self.variant)

        def backward():
            kr.launch_backward(
                y.grad, x, a, b, self.num_groups, self.variant,
                dx=x.grad if x.requires_grad else None, da=a.grad, db=b.grad,
                accumulate_dx=True, deterministic=self.deterministic,
            )

        record_backward(tape, backward, [x, y, a, b])
        return y

    def state_dict(self) -> dict:
        return {"weight_numerator": self.weight_numerator.numpy().copy(),
                "weight_denominator": self.weight_denominator.numpy().copy()}

    def config(self) -> dict:
        """What ``KANNetwork.load`` checks a saved network against."""
        return {
            "type": "GroupRational", "num_features": self.num_features, "num_groups": self.num_groups,
            "order": list(self.order), "variant": self.variant,
            "shared_numerator": int(self.weight_numerator.shape[0]) == 1,
        }

    def load_state_dict(self, state: dict) -> None:
        for key, arr in (("weight_numerator", self.weight_numerator), ("weight_denominator", self.weight_denominator)):
            if key not in state:
                raise ValueError(f"state dict is missing {key!r}")
            if tuple(np.shape(state[key])) != tuple(arr.shape):
                raise ValueError(f"{key} must have shape {tuple(arr.shape)}, got {tuple(np.shape(state[key]))}")
            arr.assign(np.ascontiguousarray(state[key], dtype=_NP_DTYPES[self.dtype]))


@functools.lru_cache(maxsize=None)
def _linear_kernels(scalar_name: str):
    """A plain SIMT linear layer with a hand-written, atomics-free backward (for Warp users at modest sizes;
    the torch layer uses cuBLAS)."""
    scalar = {"float32": wp.float32, "float64": wp.float64}[scalar_name]
    kernel = functools.partial(wp.kernel, enable_backward=False, module=f"warpkan_rational_linear_{scalar_name}")

    @kernel
    def forward(h: wp.array2d(dtype=scalar), w: wp.array2d(dtype=scalar), bias: wp.array(dtype=scalar),
                use_bias: int, y: wp.array2d(dtype=scalar)):
        n, o = wp.tid()
        acc = scalar(0.0)
        if use_bias:
            acc = bias[o]
        for i in range(h.shape[1]):
            acc = acc + h[n, i] * w[o, i]
        y[n, o] = acc

    @kernel
    def backward_input(dy: wp.array2d(dtype=scalar), w: wp.array2d(dtype=scalar), dh: wp.array2d(dtype=scalar)):
        n, i = wp.tid()
        acc = scalar(0.0)
        for o in range(dy.shape[1]):
            acc = acc + dy[n, o] * w[o, i]
        dh[n, i] = dh[n, i] + acc

    @kernel
    def backward_weight(dy: wp.array2d(dtype=scalar), h: wp.array2d(dtype=scalar), use_bias: int,
                        dw: wp.array2d(dtype=scalar), dbias: wp.array(dtype=scalar)):
        o, i = wp.tid()
        acc = scalar(0.0)
        acc_bias = scalar(0.0)
        for n in range(dy.shape[0]):
            acc = acc + dy[n, o] * h[n, i]
            acc_bias = acc_bias + dy[n, o]
        dw[o, i] = dw[o, i] + acc
        if use_bias and i == 0:
            dbias[o] = dbias[o] + acc_bias

    return forward, backward_input, backward_weight


class GRKANLinear(WarpState):
    """GR-KAN layer ``y = F(x) W^T + bias`` on ``wp.array2d`` x [N, in_features], with KAT's variance-preserving
    init of W (``N(0, 1 / (in_features E[F(x)^2]))``, x ~ N(0, 1)). Differentiable under ``wp.Tape``.

    Args:
        in_features: number of inputs, the channels of the rational (a positive int).
        out_features: number of outputs (a positive int).
        num_groups: number of rational groups, a positive int that divides ``in_features``.
        order: ``(m, n)``, the rational's numerator and denominator degrees (see :class:`GroupRational`).
        variant: ``"A"`` or ``"B"`` (see :class:`GroupRational`).
        init: the rational's initial function: ``"identity"``, ``"swish"`` or ``"gelu"``.
        shared_numerator: one numerator for all groups (KAT's layout) instead of one per group.
        bias: give the linear layer a bias (zero at initialisation).
        deterministic: make the rational's coefficient gradients bitwise reproducible.
        device: the Warp device (or its name) of the parameters (Warp's default device when None).
        dtype: ``wp.float32`` or ``wp.float64``.
        seed: seed of the numpy generator that draws the initial linear weight.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        num_groups: int = 8,
        order: tuple = (5, 4),
        variant: str = "A",
        init: str = "swish",
        shared_numerator: bool = True,
        bias: bool = True,
        deterministic: bool = False,
        device=None,
        dtype=wp.float32,
        seed: int = 0,
    ):
        in_features, num_groups, order, variant, init = kr.check_layer_args(in_features, num_groups, order, variant,
                                                                             init, "in_features")
        out_features = _checks.positive_int("out_features", out_features)
        _checks.fits_index("linear.weight", (out_features, in_features), in_features=in_features,
                           out_features=out_features)
        self.rational = GroupRational(in_features, num_groups, order, variant, init, shared_numerator,
                                      deterministic, device, dtype)
        self.in_features, self.out_features = in_features, out_features
        self.device, self.dtype = self.rational.device, dtype
        rng = np.random.default_rng(seed)
        std = 1.0 / math.sqrt(in_features * max(self.rational.gain(), 1e-12))
        self.weight = self.rational._param(rng.normal(0.0, std, (out_features, in_features)))
        self.bias = self.rational._param(np.zeros(out_features)) if bias else None

    def parameters(self) -> list:
        extra = [self.weight] + ([self.bias] if self.bias is not None else [])
        return self.rational.parameters() + extra

    def __call__(self, x: wp.array) -> wp.array:
        """y [N, out_features] for x [N, in_features] (a ``wp.array`` of the layer's dtype and device; strided
        or transposed works, and N may be 0). Under an active ``wp.Tape`` the backward is recorded:
        ``tape.backward()`` accumulates into ``x.grad`` (when x requires grad) and into the gradients of
        :meth:`parameters`."""
        h = self.rational(x)
        tape = active_tape()
        y = new_output((h.shape[0], self.out_features), self.dtype, self.device, tape)
        if h.shape[0] == 0:
            return y
        forward, backward_input, backward_weight = _linear_kernels("float64" if self.dtype == wp.float64 else "float32")
        use_bias = self.bias is not None
        bias = self.bias if use_bias else self.weight.flatten()
        launch(forward, (h.shape[0], self.out_features), [h, self.weight, bias, int(use_bias)], [y],
               device=self.device)

        def backward():
            if h.grad is not None:
                launch(backward_input, (h.shape[0], self.in_features), [y.grad, self.weight], [h.grad],
                       device=self.device)
            launch(backward_weight, (self.out_features, self.in_features), [y.grad, h, int(use_bias)],
                   [self.weight.grad, self.bias.grad if use_bias else self.weight.grad.flatten()], device=self.device)

        record_backward(tape, backward, [h, y, self.weight, self.bias])
        return y

    def state_dict(self) -> dict:
        state = {f"rational.{k}": v for k, v in self.rational.state_dict().items()}
        state["linear.weight"] = self.weight.numpy().copy()
        if self.bias is not None:
            state["linear.bias"] = self.bias.numpy().copy()
        return state

    def config(self) -> dict:
        return {
            "type": "GRKANLinear", "rational": self.rational.config(), "in_features": self.in_features,
            "out_features": self.out_features, "bias": self.bias is not None,
        }

    def load_state_dict(self, state: dict) -> None:
        self.rational.load_state_dict({k[len("rational."):]: v for k, v in state.items() if k.startswith("rational.")})
        pairs = [("linear.weight", self.weight)] + ([("linear.bias", self.bias)] if self.bias is not None else [])
        for key, arr in pairs:
            if key not in state or tuple(np.shape(state[key])) != tuple(arr.shape):
                raise ValueError(f"{key} must be present with shape {tuple(arr.shape)}")
            arr.assign(np.ascontiguousarray(state[key], dtype=_NP_DTYPES[self.dtype]))
