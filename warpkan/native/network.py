"""Stack Warp-native layers into a network, train it with ``warp.optim``, save and load it as ``.npz``."""

import json

import numpy as np
import warp as wp

__all__ = ["KANNetwork"]


class KANNetwork:
    """A sequence of Warp-native layers (any object with ``__call__``, ``parameters``, ``state_dict``,
    ``load_state_dict`` and ``config``). Calling it under a ``wp.Tape`` records every layer's backward."""

    def __init__(self, layers):
        self.layers = list(layers)
        if not self.layers:
            raise ValueError("layers must not be empty")

    def __call__(self, x: wp.array) -> wp.array:
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
