"""Stack Warp-native layers into a network, train it with ``warp.optim``, save and load it as ``.npz``."""

import json

import numpy as np
import warp as wp

__all__ = ["KANNetwork"]


_LAYER_METHODS = ("parameters", "state_dict", "load_state_dict", "config")


class KANNetwork:
    """A sequence of Warp-native layers (any object with ``__call__``, ``parameters``, ``state_dict``,
    ``load_state_dict`` and ``config``). Calling it under a ``wp.Tape`` records every layer's backward.

    Args:
        layers: the layers, applied in order (a non-empty list or other iterable); each layer's output is the
            next one's input, so its width must be the next layer's input width (checked when called).
    """

    def __init__(self, layers):
        if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
            raise TypeError(f"layers must be a list of Warp-native layers, got {type(layers).__name__}")
        self.layers = list(layers)
        if not self.layers:
            raise ValueError("layers must not be empty, got an empty list")
        for index, layer in enumerate(self.layers):
            missing = [m for m in ("__call__", *_LAYER_METHODS) if not callable(getattr(layer, m, None))]
            if missing:
                raise TypeError(f"layers[{index}] must be a Warp-native layer (with __call__, "
                                f"{', '.join(_LAYER_METHODS)}), got {type(layer).__name__} without {', '.join(missing)}")

    def __call__(self, x: wp.array) -> wp.array:
        """The network's output for x [N, in] (a ``wp.array`` the first layer takes): each layer applied in
        turn. Under an active ``wp.Tape`` every layer's backward is recorded, so ``tape.backward()`` reaches
        ``x.grad`` and the gradients of :meth:`parameters`."""
        for layer in self.layers:
            x = layer(x)
        return x

    def parameters(self) -> list:
        return [p for layer in self.layers for p in layer.parameters()]

    def save(self, path) -> None:
        arrays = {f"{index}.{key}": value for index, layer in enumerate(self.layers) for key, value in layer.state_dict().items()}
        arrays["__config__"] = np.frombuffer(json.dumps([layer.config() for layer in self.layers]).encode(), dtype=np.uint8)
        np.savez(path, **arrays)

    def load(self, path) -> None:
        with np.load(path) as data:
            configs = json.loads(bytes(data["__config__"]).decode())
            if configs != [layer.config() for layer in self.layers]:
                raise ValueError(f"{path} holds a network of layers {configs}, not {[l.config() for l in self.layers]}")
            for index, layer in enumerate(self.layers):
                prefix = f"{index}."
                layer.load_state_dict({k[len(prefix):]: data[k] for k in data.files if k.startswith(prefix)})
