"""Copying and pickling the Warp-native layers: ``copy.deepcopy`` (an EMA copy of a model), ``pickle`` and
``multiprocessing``. A ``wp.array`` holds device pointers (ctypes) and a ``wp.Device`` a driver handle, neither
of which pickles: the layers' state carries each array's values (and its gradient's), dtype, device alias and
``requires_grad`` instead, and new arrays are made from them on load, on the device of the same alias."""

from __future__ import annotations

import numpy as np
import warp as wp

__all__ = ["WarpState"]


class _ArrayState:
    """A picklable stand-in for a ``wp.array``."""

    __slots__ = ("values", "dtype", "device", "requires_grad", "grad")

    def __init__(self, array: wp.array):
        self.values = array.numpy().copy()
        self.dtype = array.dtype
        self.device = array.device.alias
        self.requires_grad = array.requires_grad
        self.grad = array.grad.numpy().copy() if array.grad is not None else None

    def __getstate__(self):
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state):
        for name, value in state.items():
            setattr(self, name, value)

    def array(self) -> wp.array:
        array = wp.array(np.ascontiguousarray(self.values), dtype=self.dtype, device=self.device,
                         requires_grad=self.requires_grad)
        if self.grad is not None:
            array.grad.assign(np.ascontiguousarray(self.grad))
        return array


class _DeviceState:
    """A picklable stand-in for a ``wp.Device``: its alias."""

    __slots__ = ("alias",)

    def __init__(self, device: wp.Device):
        self.alias = device.alias

    def __getstate__(self):
        return {"alias": self.alias}

    def __setstate__(self, state):
        self.alias = state["alias"]


def _pack(value):
    if isinstance(value, wp.array):
        return _ArrayState(value)
    if isinstance(value, wp.Device):
        return _DeviceState(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_pack(v) for v in value)
    if isinstance(value, dict):
        return {k: _pack(v) for k, v in value.items()}
    return value


def _unpack(value):
    if isinstance(value, _ArrayState):
        return value.array()
    if isinstance(value, _DeviceState):
        return wp.get_device(value.alias)
    if isinstance(value, (list, tuple)):
        return type(value)(_unpack(v) for v in value)
    if isinstance(value, dict):
        return {k: _unpack(v) for k, v in value.items()}
    return value


class WarpState:
    """Mixin: the layer's attributes with every ``wp.array`` and ``wp.Device`` (also inside lists, tuples and
    dicts) replaced by picklable stand-ins, restored as new arrays on load. ``copy.deepcopy`` goes through the
    same state, so the copy's parameters are arrays of their own."""

    def __getstate__(self):
        return {name: _pack(value) for name, value in self.__dict__.items()}

    def __setstate__(self, state):
        self.__dict__.update({name: _unpack(value) for name, value in state.items()})
