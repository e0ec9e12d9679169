"""The fused GEGLU feed-forward layer as an ``nn.Module``: the MLP baseline that KAN layers are compared
with, optimised as seriously as they are."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..kernels.geglu import check_layer_args
from ._common import autocast_dtype, check_device, check_input_dtype, check_tensor
from .geglu_ops import DEFAULT_SMALL_BATCH_ROWS, GEGLU_DTYPES, geglu_ffn

__all__ = ["GEGLUFFN"]


class GEGLUFFN(nn.Module):
    """``out = (gate(x W_u^T + b_u) * (x W_v^T + b_v)) W_o^T + b_o`` on x (..., hidden).

    Parameters: ``w_uv`` [2 intermediate, hidden] (``W_u`` stacked on ``W_v``, ``nn.Linear`` layout, so the
    two input projections are one GEMM), ``w_o`` [hidden, intermediate], and with ``bias=True`` ``b_uv``
    [2 intermediate] and ``b_o`` [hidden]. ``activation``: ``"gelu"`` (erf), ``"gelu_tanh"`` or
    ``"gelu_sigmoid"`` (``u sigmoid(1.702 u)``). Works in float16, bfloat16, float32 and float64 (x must
    have the parameters' dtype; under autocast everything is cast to the autocast dtype).

    Batches of at most ``small_batch_rows`` rows run the Warp weight-streaming kernels (the layer is bound
    by reading the weights there); larger ones the concatenated cuBLAS GEMM plus the fused Warp gate.
    Initialisation is ``nn.Linear``'s: uniform in ``+-1/sqrt(fan_in)``.

    Args:
        hidden: the model width, x's last dimension and the output's (a positive int).
        intermediate: the width of the gated projection (a positive int).
        activation: ``"gelu"``, ``"gelu_tanh"`` or ``"gelu_sigmoid"``.
        bias: give the three projections biases.
        small_batch_rows: batches of at most this many rows (a non-negative int; 0: never) take the Warp
            weight-streaming kernels.
        device: the device of the parameters (torch's default when None).
        dtype: float16, bfloat16, float32 or float64 (torch's default dtype when None).
    """

    def __init__(
        self,
        hidden: int,
        intermediate: int,
        activation: str = "gelu",
        bias: bool = False,
        small_batch_rows: int = DEFAULT_SMALL_BATCH_ROWS,
        device=None,
        dtype=None,
    ):
        super().__init__()
        check_device(device)
        hidden, intermediate, activation, small_batch_rows = check_layer_args(hidden, intermediate, activation,
                                                                              small_batch_rows)
        if dtype is not None and dtype not in GEGLU_DTYPES:
            raise TypeError(f"dtype must be one of {GEGLU_DTYPES}, got {dtype}")
        self.hidden = hidden
        self.intermediate = intermediate
        self.activation = activation
        self.small_batch_rows = small_batch_rows
        factory = {"device": device, "dtype": dtype}
        self.w_uv = nn.Parameter(torch.empty(2 * intermediate, hidden, **factory))
        self.w_o = nn.Parameter(torch.empty(hidden, intermediate, **factory))
        if bias:
            self.b_uv = nn.Parameter(torch.empty(2 * intermediate, **factory))
            self.b_o = nn.Parameter(torch.empty(hidden, **factory))
        else:
            self.register_parameter("b_uv", None)
            self.register_parameter("b_o", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            for weight, bias, fan_in in ((self.w_uv, self.b_uv, self.hidden), (self.w_o, self.b_o, self.intermediate)):
                bound = 1.0 / math.sqrt(fan_in)
                weight.uniform_(-bound, bound)
                if bias is not None:
                    bias.uniform_(-bound, bound)

    @classmethod
    def from_separate(
        cls,
        w_u: Tensor,
        w_v: Tensor,
        w_o: Tensor,
        b_u: Tensor | None = None,
        b_v: Tensor | None = None,
        b_o: Tensor | None = None,
        activation: str = "gelu",
        small_batch_rows: int = DEFAULT_SMALL_BATCH_ROWS,
    ) -> "GEGLUFFN":
        """A layer holding copies of separate weights in ``nn.Linear`` layout: ``w_u``, ``w_v``
        [intermediate, hidden], ``w_o`` [hidden, intermediate]; biases all given or all None."""
        check_tensor("w_u", w_u, ndim=2, dtypes=GEGLU_DTYPES)
        intermediate, hidden = w_u.shape
        check_tensor("w_v", w_v, shape=(intermediate, hidden), dtypes=GEGLU_DTYPES, like=w_u)
        check_tensor("w_o", w_o, shape=(hidden, intermediate), dtypes=GEGLU_DTYPES, like=w_u)
        biases = (b_u, b_v, b_o)
        has_bias = b_u is not None
        if any((b is not None) != has_bias for b in biases):
            raise ValueError("b_u, b_v and b_o must be given together or not at all")
        if has_bias:
            check_tensor("b_u", b_u, shape=(intermediate,), dtypes=GEGLU_DTYPES, like=w_u)
            check_tensor("b_v", b_v, shape=(intermediate,), dtypes=GEGLU_DTYPES, like=w_u)
            check_tensor("b_o", b_o, shape=(hidden,), dtypes=GEGLU_DTYPES, like=w_u)
        layer = cls(hidden, intermediate, activation, has_bias, small_batch_rows, device=w_u.device, dtype=w_u.dtype)
        with torch.no_grad():
            layer.w_uv.copy_(torch.cat([w_u, w_v], dim=0))
            layer.w_o.copy_(w_o)
            if has_bias:
                layer.b_uv.copy_(torch.cat([b_u, b_v]))
                layer.b_o.copy_(b_o)
        return layer

    @property
    def w_u(self) -> Tensor:
        return self.w_uv[: self.intermediate]

    @property
    def w_v(self) -> Tensor:
        return self.w_uv[self.intermediate :]

    def forward(self, x: Tensor) -> Tensor:
        """out (..., hidden) for x (..., hidden) of the parameters' dtype and device (under autocast, x and the
        parameters are cast to the autocast dtype). An empty batch gives an empty output."""
        params = (self.w_uv, self.w_o, self.b_uv, self.b_o)
        cast = autocast_dtype(x.device) if isinstance(x, Tensor) else None
        if cast is not None:
            x = x.to(cast)
            params = tuple(p.to(cast) if p is not None else None for p in params)
        elif isinstance(x, Tensor):
            check_input_dtype(x, self.w_o.dtype, GEGLU_DTYPES)  # before geglu_ffn, whose message names w_o
        w_uv, w_o, b_uv, b_o = params
        return geglu_ffn(x, w_uv, w_o, b_uv, b_o, self.activation, self.small_batch_rows)

    def extra_repr(self) -> str:
        return (
            f"hidden={self.hidden}, intermediate={self.intermediate}, activation={self.activation!r}, "
            f"bias={self.b_uv is not None}, small_batch_rows={self.small_batch_rows}"
        )

