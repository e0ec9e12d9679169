"""Optimiser for Warp-native layers: ``warp.optim.Adam`` on flat views of the (N-D) parameters."""

import warp as wp
import warp.optim

from .. import _checks

__all__ = ["Adam"]


class Adam:
    """``Adam(params, lr)``; ``step()`` reads each parameter's ``.grad``. ``warp.optim.Adam`` takes 1-D
    arrays only, so it is given flat views that share memory with the parameters and their gradients.

    Args:
        params: the parameters to update (e.g. ``layer.parameters()``): contiguous ``wp.array``s with a
            gradient array (``requires_grad=True``).
        lr: the learning rate, a positive finite number.
        betas: ``(beta1, beta2)``, the decay rates of the first and second moment estimates, each in [0, 1).
        eps: added to the denominator for numerical stability, a positive finite number.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        if isinstance(params, (str, bytes, wp.array)) or not hasattr(params, "__iter__"):
            raise TypeError(f"params must be a list of wp.arrays, got {type(params).__name__}")
        self.params = list(params)
        for index, p in enumerate(self.params):
            if not isinstance(p, wp.array):
                raise TypeError(f"params[{index}] must be a wp.array, got {type(p).__name__}")
            if p.grad is None:
                raise ValueError(f"params[{index}] needs a gradient array (requires_grad=True), got one without")
            if not p.is_contiguous:
                raise ValueError(f"params[{index}] must be contiguous (Adam updates a flat view of it)")
        lr = _checks.positive_number("lr", lr)
        betas = tuple(_checks.number(f"betas[{i}]", b) for i, b in enumerate(_checks.sequence("betas", betas, 2)))
        for i, b in enumerate(betas):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"betas[{i}] must be in [0, 1), got {b}")
        eps = _checks.positive_number("eps", eps)
        self._flat = [p.flatten() for p in self.params]
        self._flat_grads = [p.grad.flatten() for p in self.params]
        self._adam = warp.optim.Adam(self._flat, lr=lr, betas=betas, eps=eps)

    @property
    def lr(self) -> float:
        return self._adam.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self._adam.lr = _checks.positive_number("lr", value)

    def step(self) -> None:
        self._adam.step(self._flat_grads)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad.zero_()
