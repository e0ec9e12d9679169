"""Placeholder: replaced by the shared runtime."""
import numpy as np
import warp as wp


def launch(kernel, dim, inputs, outputs=(), device=None, stream=None, record=False, block_dim=256):
    cmd = wp.launch(kernel, dim=dim, inputs=inputs, outputs=list(outputs), device=device, stream=stream,
                    block_dim=block_dim, record_tape=False, record_cmd=record)
    return [cmd] if record else None


class Workspace:
    def __init__(self, device):
        self.device = wp.get_device(device)
        self._buffers = {}

    def sort_pairs(self, keys, values, count, key_bits):
        wp.utils.radix_sort_pairs(keys, values, count, end_bit=key_bits)

    def get(self, name, shape, dtype, zero=False):
        size = int(np.prod(shape)) if len(shape) else 1
        buf = self._buffers.get((name, dtype))
        if buf is None or buf.size < size:
            buf = wp.empty(max(size, 1), dtype=dtype, device=self.device)
            self._buffers[(name, dtype)] = buf
        view = buf[:size].reshape(tuple(shape)) if len(shape) > 1 else buf[:size]
        if zero:
            view.zero_()
        return view


_workspaces = {}


def workspace_for(device, stream):
    key = (str(wp.get_device(device)), stream.cuda_stream if stream is not None else 0)
    if key not in _workspaces:
        _workspaces[key] = Workspace(key[0])
    return _workspaces[key]


def clear_workspaces():
    _workspaces.clear()
