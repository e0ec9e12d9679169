"""Optimiser for Warp-native layers: ``warp.optim.Adam`` on flat views of the (N-D) parameters."""

import warp.optim

__all__ = ["Adam"]


class Adam:
    """``Adam(params, lr)``; ``step()`` reads each parameter's ``.grad``. ``warp.optim.Adam`` takes 1-D
    arrays only, so it is given flat views that share memory with the parameters and their gradients."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        self.params = list(params)
        for p in self.params:
            if p.grad is None:
                raise ValueError("every parameter needs a gradient array (requires_grad=True)")
        self._flat = [p.flatten() for p in self.params]
        self._flat_grads = [p.grad.flatten() for p in self.params]
        self._adam = warp.optim.Adam(self._flat, lr=lr, betas=betas, eps=eps)

    @property
    def lr(self) -> float:
        return self._adam.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self._adam.lr = value

    def step(self) -> None:
        self._adam.step(self._flat_grads)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad.zero_()
