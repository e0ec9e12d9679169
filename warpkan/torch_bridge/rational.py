"""Group-rational (KAT) layers on Warp kernels: ``GroupRational``, ``GRKANLinear`` and the KAT MLP block."""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn
from torch.nn.modules import module as _module_hooks

from .. import _checks
from ..kernels import rational as kr
from ._common import autocast_dtype, check_device, check_input_dtype, check_tensor, use_registered_op
from .grkan_ops import grkan_chain
from .rational_ops import IO_DTYPES, apply_checked, check_out_dtype

__all__ = ["GroupRational", "GRKANLinear", "KATMLP"]

_AUTOCAST_CASTS = (torch.float32, torch.float16, torch.bfloat16)  # what autocast casts a linear's input from


class GroupRational(nn.Module):
    """Learnable group-rational activation ``F_g(x) = P(x) / Q_g(x)`` on x (..., num_features), channels-last.

    Channels are split into ``num_groups`` contiguous groups (``num_features`` must be a multiple). Parameters
    follow KAT's ``KAT_Group`` (so its checkpoints load as they are): ``weight_numerator`` [1, m + 1] when
    ``shared_numerator`` (KAT) else [num_groups, m + 1], and ``weight_denominator`` [num_groups, n].
    ``variant`` "A": ``Q = 1 + sum_j |b_j| |x|^(j+1)`` (KAT's kernels); "B": ``Q = 1 + |sum_j b_j x^(j+1)|``
    (FlashKAT's paper). ``init`` ("identity", "swish", "gelu") loads coefficients fitted here to the exact
    activation under that variant. fp32, bf16 and fp16 inputs are computed with fp32 arithmetic and fp32
    gradient sums; ``deterministic=True`` makes the coefficient gradients bitwise reproducible. The kernels take
    fp16/bf16 natively, so ``.half()`` / ``.to(torch.bfloat16)`` are allowed (unlike the spline and polynomial
    layers, which compute in float32/float64 only).

    ``create_graph=True`` gives the gradients as differentiable graphs (Taylor-series kernels of P/Q, computed in
    float32, or float64 for float64 x): x-derivatives to the fourth order and coefficient derivatives to the
    second, e.g. a physics-informed residual's u_xx and the parameter gradients of a loss of it. The
    ``torch.func`` transforms raise. Built with ``device="meta"``, the layer infers output shapes on meta
    inputs.

    Args:
        num_features: number of channels C, the last dimension of x (a positive int).
        num_groups: number of groups G sharing a denominator, a positive int that divides ``num_features``.
        order: ``(m, n)``, the numerator and denominator degrees: ints with 0 <= m <= 12 and 1 <= n <= 12.
        variant: ``"A"`` or ``"B"``, the safe denominator (above).
        init: ``"identity"`` (any order), ``"swish"`` or ``"gelu"`` (the fitted orders only).
        shared_numerator: one numerator for all groups (KAT's layout) instead of one per group.
        deterministic: make the coefficient gradients bitwise reproducible.
        device: the device of the coefficients (torch's default when None).
        dtype: the coefficients' dtype (float32 when None).
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
        dtype=None,
    ):
        super().__init__()
        check_device(device)
        num_features, num_groups, order, variant, init = kr.check_layer_args(num_features, num_groups, order, variant,
                                                                              init)
        self.num_features = num_features
        self.num_groups = num_groups
        self.order = order
        self.variant = variant
        self.init = init
        self.shared_numerator = shared_numerator
        self.deterministic = deterministic
        if dtype is not None and dtype not in IO_DTYPES:  # e.g. an integer dtype, which cannot require grad
            names = ", ".join(str(d).replace("torch.", "") for d in IO_DTYPES)
            raise TypeError(f"dtype must be one of {names} (or None: float32), got {dtype!r}")
        factory = {"device": device, "dtype": dtype or torch.float32}
        rows = 1 if shared_numerator else num_groups
        self.weight_numerator = nn.Parameter(torch.empty(rows, self.order[0] + 1, **factory))
        self.weight_denominator = nn.Parameter(torch.empty(num_groups, self.order[1], **factory))
        self.reset_parameters()

    def reset_parameters(self, init: str | None = None) -> None:
        init = init or self.init
        numerator, denominator = kr.init_coefficients(init, self.order, self.variant)
        with torch.no_grad():
            self.weight_numerator.copy_(torch.tensor(numerator).expand_as(self.weight_numerator))
            self.weight_denominator.copy_(torch.tensor(denominator).expand_as(self.weight_denominator))
        self.init = init

    def gain(self) -> float:
        """E[F(x)^2] for x ~ N(0, 1) under the current coefficients of group 0 (on the meta device, which holds
        no values, under the ``init`` coefficients)."""
        if self.weight_denominator.is_meta:
            numerator, denominator = kr.init_coefficients(self.init, self.order, self.variant)
            return kr.second_moment(list(numerator), list(denominator), self.variant)
        return kr.second_moment(
            self.weight_numerator[0].detach().double().cpu().tolist(),
            self.weight_denominator[0].detach().double().cpu().tolist(),
            self.variant,
        )

    def forward(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """F(x), of x's shape, for x (..., num_features) in float32, float64, bfloat16 or float16 on the layer's
        device. Non-contiguous x works; an empty batch gives an empty output.

        ``out_dtype``: the result's dtype, x's when None. float32, bfloat16 and float16 go with each other's x
        (float64 with float64 only). The kernel stores it and its backward reads the gradient in it, so a
        bfloat16 layer after a float32 x takes the result with no cast on either side (what
        :class:`GRKANLinear` asks under autocast)."""
        # the weights and the configuration were checked at construction: x alone here
        check_tensor("x", x, ndim_min=1, last_dim=self.num_features, dtypes=IO_DTYPES)
        if x.device != self.weight_denominator.device:
            raise ValueError(f"x must be on the layer's device {self.weight_denominator.device}, got {x.device}")
        return apply_checked(
            x, self.weight_numerator, self.weight_denominator, self.num_groups, self.variant, self.deterministic,
            check_out_dtype(x, out_dtype),
        )

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, num_groups={self.num_groups}, order={self.order}, variant={self.variant!r}, "
            f"init={self.init!r}, shared_numerator={self.shared_numerator}"
        )


class GRKANLinear(nn.Module):
    """GR-KAN layer: ``Linear(GroupRational(x))`` for x (..., in_features).

    The linear weight gets KAT's variance-preserving init: ``W ~ N(0, 1 / (in_features * E[F(x)^2]))`` with
    ``x ~ N(0, 1)``, so unit-variance inputs give unit-variance outputs at init; the bias starts at zero.

    Args:
        in_features: number of inputs, the channels of the rational (a positive int).
        out_features: number of outputs (a positive int).
        num_groups: number of rational groups, a positive int that divides ``in_features``.
        order: ``(m, n)``, the rational's numerator and denominator degrees (see :class:`GroupRational`).
        variant: ``"A"`` or ``"B"`` (see :class:`GroupRational`).
        init: the rational's initial function: ``"identity"``, ``"swish"`` or ``"gelu"``.
        shared_numerator: one numerator for all groups (KAT's layout) instead of one per group.
        bias: give the linear layer a bias.
        deterministic: make the rational's coefficient gradients bitwise reproducible.
        device: the device of the parameters (torch's default when None).
        dtype: the parameters' dtype (float32 for the rational and torch's default for the linear layer
            when None).
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
        dtype=None,
    ):
        super().__init__()
        in_features, num_groups, order, variant, init = kr.check_layer_args(in_features, num_groups, order, variant,
                                                                             init, "in_features")
        out_features = _checks.positive_int("out_features", out_features)
        _checks.fits_index("linear.weight", (out_features, in_features), in_features=in_features,
                           out_features=out_features)
        self.rational = GroupRational(
            in_features, num_groups, order, variant, init, shared_numerator, deterministic, device=device, dtype=dtype
        )
        self.linear = nn.Linear(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.in_features = in_features
        self.out_features = out_features
        self.reset_linear()

    def reset_linear(self) -> None:
        gain = max(self.rational.gain(), 1e-12)
        with torch.no_grad():
            self.linear.weight.normal_(0.0, 1.0 / math.sqrt(self.in_features * gain))
            if self.linear.bias is not None:
                self.linear.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """y (..., out_features) = Linear(GroupRational(x)) for x (..., in_features) on the layer's device, of
        the linear layer's dtype (under autocast, any of those :meth:`GroupRational.forward` takes)."""
        fused = _chain_arguments(x, (self,), check_layers=False)
        if fused is not None:  # one autograd node, the composition below's results (grkan_ops)
            return grkan_chain(x, *fused)
        cast_to = autocast_dtype(x.device) if isinstance(x, torch.Tensor) else None
        if cast_to is None:
            # the rational returns x's dtype, which nn.Linear would refuse naming its own operands
            if isinstance(x, torch.Tensor):
                check_input_dtype(x, self.linear.weight.dtype, IO_DTYPES)
            return self.linear(self.rational(x))
        # under autocast the rational gives what autocast would cast the linear's input to (a float64 x is
        # left alone), so that no cast runs between them: an fp32 x after a LayerNorm in KAT's blocks. A module
        # put in its place (another implementation, a wrapper) is called as an activation: x alone
        if not isinstance(self.rational, GroupRational) or x.dtype not in _AUTOCAST_CASTS:
            return self.linear(self.rational(x))
        return self.linear(self.rational(x, out_dtype=cast_to))


class KATMLP(nn.Module):
    """KAT's transformer MLP with GR-KAN: ``GroupRational -> Linear -> GroupRational -> Linear``, identity init
    on the first rational and swish (by default) on the second.

    Args:
        in_features: number of inputs (a positive int).
        hidden_features: width between the two GR-KAN layers (a positive int; None: ``in_features``).
        out_features: number of outputs (a positive int; None: ``in_features``).
        num_groups: number of rational groups, a positive int that divides ``in_features`` and
            ``hidden_features``.
        order: ``(m, n)``, the rationals' numerator and denominator degrees (see :class:`GroupRational`).
        variant: ``"A"`` or ``"B"`` (see :class:`GroupRational`).
        inits: the initial functions of the two rationals, a pair of ``"identity"``, ``"swish"``, ``"gelu"``.
        shared_numerator: one numerator per rational for all its groups (KAT's layout).
        bias: give the linear layers a bias.
        deterministic: make the rationals' coefficient gradients bitwise reproducible.
        device: the device of the parameters (torch's default when None).
        dtype: the parameters' dtype (see :class:`GRKANLinear`).
    """

    def __init__(
        self,
        in_features: int,
        hidden_features: int | None = None,
        out_features: int | None = None,
        num_groups: int = 8,
        order: tuple = (5, 4),
        variant: str = "A",
        inits: tuple = ("identity", "swish"),
        shared_numerator: bool = True,
        bias: bool = True,
        deterministic: bool = False,
        device=None,
        dtype=None,
    ):
        super().__init__()
        in_features = _checks.positive_int("in_features", in_features)
        hidden_features = in_features if hidden_features is None else _checks.positive_int("hidden_features",
                                                                                           hidden_features)
        out_features = in_features if out_features is None else _checks.positive_int("out_features", out_features)
        inits = tuple(_checks.one_of(f"inits[{i}]", init, kr.init_names())
                      for i, init in enumerate(_checks.sequence("inits", inits, 2)))
        kr.check_layer_args(in_features, num_groups, order, variant, inits[0], "in_features")
        kr.check_layer_args(hidden_features, num_groups, order, variant, inits[1], "hidden_features")
        common = dict(num_groups=num_groups, order=order, variant=variant, shared_numerator=shared_numerator,
                      bias=bias, deterministic=deterministic, device=device, dtype=dtype)
        self.fc1 = GRKANLinear(in_features, hidden_features, init=inits[0], **common)
        self.fc2 = GRKANLinear(hidden_features, out_features, init=inits[1], **common)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """y (..., out_features) = fc2(fc1(x)) for x (..., in_features) on the layer's device.

        Where a gradient is wanted in eager code, the block is one autograd node
        (:mod:`warpkan.torch_bridge.grkan_ops`) with the composition's results (under bf16 autocast, the linear
        layers' weight and bias gradients unrounded); traced code (``torch.compile``), hooks on the sub-modules,
        sub-modules replaced by others, and inputs the composition refuses run the composition itself."""
        fused = _chain_arguments(x, (self._modules["fc1"], self._modules["fc2"]), check_layers=True)
        if fused is None:
            return self.fc2(self.fc1(x))
        return grkan_chain(x, *fused)


def _no_hooks(module: nn.Module) -> bool:
    return not (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or
                module._backward_pre_hooks)


_COMPOSED_ONLY = False  # composed_layers(): the modules' composition for every GR-KAN layer and KATMLP block


@contextlib.contextmanager
def composed_layers(enabled: bool = True):
    """Within the block (process-wide), GR-KAN layers and KATMLP blocks run their modules' composition instead of
    one autograd node each: what the node is tested and timed against. ``enabled=False`` changes nothing."""
    global _COMPOSED_ONLY
    previous, _COMPOSED_ONLY = _COMPOSED_ONLY, _COMPOSED_ONLY or enabled
    try:
        yield
    finally:
        _COMPOSED_ONLY = previous


def _chain_arguments(x, layers: tuple, check_layers: bool):
    """(config, weights) of :func:`~warpkan.torch_bridge.grkan_ops.grkan_chain` for GR-KAN ``layers`` on x, or
    None where their composition runs instead: inside :func:`composed_layers`, traced code (torch.compile sees
    the composition alone), no gradient wanted, a hook the node would skip, a sub-module replaced by another, an
    x the composition refuses (for its errors) and dtypes autocast would leave alone. ``check_layers``: the
    layers are sub-modules of the caller (KATMLP's), whose own type and hooks count too."""
    # traced code first: the checks below would break torch.compile's graph
    if _COMPOSED_ONLY or not isinstance(x, torch.Tensor) or use_registered_op(x) or not torch.is_grad_enabled():
        return None
    # the modules' and parameters' own dicts: nn.Module.__getattr__ is about 0.3 us a name, a call asks for 7
    # names a layer
    weights, rationals = [], []
    for layer in layers:
        rational, linear = layer._modules.get("rational"), layer._modules.get("linear")
        if type(rational) is not GroupRational or type(linear) is not nn.Linear or not (
                _no_hooks(rational) and _no_hooks(linear)) or (check_layers and not (
                type(layer) is GRKANLinear and _no_hooks(layer))):
            return None
        rp, lp = rational._parameters, linear._parameters
        layer_weights = (rp.get("weight_numerator"), rp.get("weight_denominator"), lp.get("weight"), lp.get("bias"))
        if any(w is None for w in layer_weights[:3]) or "bias" not in lp:  # a tensor set as a plain attribute
            return None
        if rationals and rational.num_features != weights[-2].shape[0]:  # a layer that can't follow the last
            return None
        weights += layer_weights
        rationals.append(rational)
    if (_module_hooks._global_forward_hooks or _module_hooks._global_forward_pre_hooks or
            _module_hooks._global_backward_hooks or _module_hooks._global_backward_pre_hooks or
            torch._C._are_functorch_transforms_active()):
        return None
    if not (x.requires_grad or any(w is not None and w.requires_grad for w in weights)):
        return None
    if (x.dtype not in IO_DTYPES or x.layout != torch.strided or not x.dim()
            or x.shape[-1] != rationals[0].num_features or not x.numel()
            or any(w is not None and w.device != x.device for w in weights)):
        return None
    cast_to = autocast_dtype(x.device)
    linear_dtypes = {w.dtype for w in weights[2::4] + weights[3::4] if w is not None}
    if cast_to is None:
        if linear_dtypes != {x.dtype}:
            return None
        out_dtype = None
    else:
        # autocast casts fp32/fp16/bf16 operands to its dtype (not fp64): the composition's other cases
        if x.dtype not in _AUTOCAST_CASTS or not linear_dtypes <= set(_AUTOCAST_CASTS):
            return None
        out_dtype = check_out_dtype(x, cast_to)
    # a later layer's rational reads the linear's output, in cast_to (or x's dtype): its own dtype out
    config = (cast_to, tuple((r.num_groups, r.variant, r.deterministic, out_dtype if i == 0 else None)
                             for i, r in enumerate(rationals)))
    return config, tuple(weights)
