"""What every torch op of warpkan shares: Warp start-up, zero-copy views on torch's current stream, and
argument checks whose messages name the argument, what was expected and what was given."""

from __future__ import annotations

import contextlib

import ctypes
import threading
from collections import OrderedDict

import torch
import warp as wp

from .._warp_output import start_warp

_streams: dict[tuple[int, int], wp.Stream] = {}
_devices: dict[str, wp.Device] = {}
_ready = False


def ensure_warp() -> None:
    global _ready
    if not _ready:
        start_warp()
        _ready = True


def warp_device(device: torch.device) -> wp.Device:
    key = str(device)
    found = _devices.get(key)
    if found is None:
        ensure_warp()
        found = _devices[key] = wp.device_from_torch(device)
    return found


def warp_stream(device: torch.device) -> wp.Stream | None:
    """Warp's wrapper of torch's current stream on ``device`` (None on the CPU), cached per (device, handle)
    so the hot path creates nothing: the raw handle costs ~0.1 us where ``torch.cuda.current_stream`` builds a
    Python stream object (~4 us on the GPU machine), and a layer asks once per launch."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, torch._C._cuda_getCurrentRawStream(index))
    found = _streams.get(key)
    if found is None:
        ensure_warp()
        found = _streams[key] = wp.stream_from_torch(torch.cuda.current_stream(index))
    return found


def to_warp(t: torch.Tensor) -> wp.array:
    """Zero-copy Warp view of a contiguous tensor."""
    return wp.from_torch(t, requires_grad=False)


WP_DTYPES = {torch.float16: wp.float16, torch.bfloat16: wp.bfloat16, torch.float32: wp.float32,
             torch.float64: wp.float64, torch.int32: wp.int32, torch.int64: wp.int64}


def raw_view(t: torch.Tensor | None) -> wp.array | None:
    """A Warp view of a tensor's memory (any strides) that does not keep the tensor alive."""
    if t is None:
        return None
    return wp.array(ptr=t.data_ptr(), dtype=WP_DTYPES[t.dtype], shape=tuple(t.shape),
                    strides=tuple(st * t.element_size() for st in t.stride()), device=warp_device(t.device),
                    copy=False)


class RecordedLaunches:
    """Warp launches recorded once per signature and replayed on torch's current stream.

    At small sizes a layer's GPU work takes tens of microseconds, about what building Warp views
    (``wp.from_torch``, ~4 us a tensor) and packing a ``wp.launch`` (~10 us) cost on the host. So the launches
    of ``launcher(*views, *config, record=True)`` are recorded once per signature (launcher, config, and
    every tensor's shape, strides, dtype and device) and replayed (~5 us a launch). A replay re-points the
    recorded array arguments at the call's tensors: each tensor's address is written into the packed
    arguments that held it when recorded (one ctypes field store, no view, no packing), so a hit does not
    depend on the caching allocator handing back the same blocks. That is only done when every array
    argument of the record is one of the tensors, at its start (no internal buffer, no offset view, no two
    tensors at one address); other records are kept per exact set of addresses instead. The views behind a
    record are built from raw pointers and keep no tensor alive. Least recently used records are dropped
    beyond ``capacity``. Thread-safe: autograd runs backward on its own thread."""

    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self._records: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _slots(cmds, ptrs) -> list | None:
        """For each tensor address, the packed array arguments of ``cmds`` that hold it; None unless every
        array argument holds exactly one of the (distinct) addresses."""
        live = [p for p in ptrs if p]
        if len(set(live)) != len(live):
            return None
        args = [p for cmd in cmds for p in cmd.params[1:]
                if isinstance(p, ctypes.Structure) and hasattr(p, "data") and hasattr(p, "strides")]
        slots = [[arg for arg in args if ptr and arg.data == ptr] for ptr in ptrs]
        if sum(len(found) for found in slots) != sum(1 for arg in args if arg.data):
            return None
        return slots

    def __call__(self, launcher, tensors: tuple, *config) -> None:
        # one flat key and one pass over the tensors: this runs per launch, often on autograd's device thread
        signature = [launcher, *config]
        ptrs = []
        device = None
        for t in tensors:
            if t is None:
                signature.append(None)
                ptrs.append(0)
            else:
                signature += (t.shape, t.stride(), t.dtype)
                ptrs.append(t.data_ptr())
                if device is None:
                    device = t.device
        signature.append(device)
        signature, ptrs = tuple(signature), tuple(ptrs)
        stream = warp_stream(device)
        with self._lock:  # re-pointing and launching must not interleave with another thread's
            entry = self._records.get(signature)
            if entry is None:
                entry = self._records.get((signature, ptrs))
            if entry is None:
                cmds = launcher(*(raw_view(t) for t in tensors), *config, record=True)
                slots = self._slots(cmds, ptrs)
                entry = (cmds, slots)
                self._records[signature if slots is not None else (signature, ptrs)] = entry
                if len(self._records) > self.capacity:
                    self._records.popitem(last=False)
            else:
                cmds, slots = entry
                if slots is not None:
                    for ptr, args in zip(ptrs, slots):
                        for arg in args:
                            arg.data = ptr
            for cmd in cmds:
                cmd.launch(stream)

    def clear(self) -> None:
        with self._lock:
            self._records.clear()


@contextlib.contextmanager
def matmul_precision(precision: str, device: torch.device):
    """Run the float32 GEMMs inside at exactly ``precision`` ("fp32": full precision, "tf32": TF32 tensor
    cores), whatever torch's setting, and put torch's setting back. Anything else (bf16 operands, the CPU)
    runs as it is."""
    wanted = {"fp32": "highest", "tf32": "high"}.get(precision)
    saved = torch.get_float32_matmul_precision()
    if device.type != "cuda" or wanted is None or saved == wanted:
        yield
        return
    torch.set_float32_matmul_precision(wanted)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)


class EagerRoute:
    """An op's eager route (see :func:`eager_function`): ``function``, the ``autograd.Function``; ``layouts``,
    the inputs it takes in a public layout. A plain object, so that traced code reads it (:func:`op_or_eager`)."""

    def __init__(self, function, forward_impl, layouts: dict):
        self.function = function
        self.forward_impl = forward_impl
        self.layouts = layouts

    def relayout(self, values: tuple, direction: int) -> tuple:
        """``values`` (the inputs, or their gradients) with each one the route takes in a public layout mapped
        by ``layouts[i][direction]``: 0 to the op's view, 1 back to the public layout. None stays None."""
        layouts = self.layouts
        return tuple(layouts[i][direction](v) if i in layouts and v is not None else v for i, v in enumerate(values))

    def op_inputs(self, inputs: tuple) -> tuple:
        """The inputs as the op takes them: the op's views of those in a public layout."""
        return self.relayout(inputs, 0)

    def run(self, *inputs):
        """The Function where a gradient is wanted; the implementation alone, without building a node, where
        none is (inference, frozen inputs)."""
        if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs):
            return self.function.apply(*inputs)
        return self.forward_impl(*self.op_inputs(inputs))


def eager_function(name: str, forward_impl, setup_context, backward, layouts: dict | None = None) -> EagerRoute:
    """The eager route of a custom op: an ``autograd.Function`` that runs the op's own implementation
    (``forward_impl(*inputs)``) and autograd formula (``setup_context(ctx, inputs, output)``,
    ``backward(ctx, *grads)``) without the custom-op dispatch. A ``torch.library.custom_op`` call (schema
    default filling, the redispatch through the autograd key, the backward op's second dispatch) costs tens to
    hundreds of microseconds of host time on the GPU machine, which dominates a small layer's eager step. Call
    it through :func:`op_or_eager`, so that traced code (``torch.compile``, export, opcheck) still sees the
    registered op.

    ``layouts`` {input index: (to_op, to_public)}: the route takes those inputs in their public layout (a
    parameter as the module exposes it) and makes the op's view of them inside the Function, ``to_op(t)``;
    their gradients go back through ``to_public``. Views made outside the Function would be autograd nodes of
    their own (TBackward, PermuteBackward), each 10-20 us of a step's host time on the GPU machine."""
    layouts = layouts or {}
    route = None  # set below, once the Function exists

    def forward(ctx, *inputs):
        inputs = route.op_inputs(inputs)
        output = forward_impl(*inputs)
        setup_context(ctx, inputs, output)
        return output

    def public_backward(ctx, *grads):
        return route.relayout(backward(ctx, *grads), 1)

    function = type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward),
        "backward": staticmethod(torch.autograd.function.once_differentiable(public_backward if layouts else backward)),
        "__doc__": f"{name}: eager route of a warpkan custom op (see warpkan.torch_bridge._common.eager_function).",
    })
    route = EagerRoute(function, forward_impl, layouts)
    return route


def on_rows(x: torch.Tensor, n_in: int, apply):
    """``apply(x2)`` on x (..., n_in) seen as rows x2 [N, n_in], its [N, out] result seen as (..., out). A 2-D
    x goes as it is: a reshape is an autograd view node even when it changes nothing, 10-20 us of a step's
    host time on the GPU machine."""
    if x.dim() == 2:
        return apply(x)
    y = apply(x.reshape(-1, n_in))
    return y.reshape(*x.shape[:-1], y.shape[-1])


# ``eager_function`` layout of a parameter the module exposes as [out, in] and stores as the op's [in, out]
TRANSPOSED = (torch.t, torch.t)


def op_or_eager(op, eager: EagerRoute):
    """A callable on the eager route's inputs: the registered op under tracing (on the op's views of the
    inputs the route takes in a public layout), the eager route otherwise (:meth:`EagerRoute.run`)."""
    if not torch.compiler.is_compiling():
        return eager.run
    if eager.layouts:
        return lambda *inputs: op(*eager.op_inputs(inputs))
    return op


class TorchWorkspace:
    """Scratch buffers for Warp launchers, allocated from torch's caching allocator on the current stream:
    stream-ordered, reused across calls, and legal under CUDA-graph capture (Warp's own allocator is not
    the capture stream's)."""

    _TORCH_DTYPES = {wp.int32: torch.int32, wp.float32: torch.float32, wp.float64: torch.float64}

    def __init__(self, device: torch.device):
        self.device = device

    def get(self, name: str, shape, dtype, zero: bool = False) -> wp.array:
        make = torch.zeros if zero else torch.empty
        return to_warp(make(tuple(shape), dtype=self._TORCH_DTYPES[dtype], device=self.device))

    def sort_pairs(self, keys: wp.array, values: wp.array, count: int, key_bits: int) -> None:
        keys_t, values_t = wp.to_torch(keys)[:count], wp.to_torch(values)[:count]
        sorted_keys, order = torch.sort(keys_t, stable=True)
        values_t.copy_(values_t[order])
        keys_t.copy_(sorted_keys)


FLOAT_DTYPES = (torch.float32, torch.float64)


def check_tensor(name: str, t, *, ndim_min: int | None = None, ndim: int | None = None,
                 shape: tuple | None = None, last_dim: int | None = None,
                 dtypes: tuple = FLOAT_DTYPES, like: torch.Tensor | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if ndim_min is not None and t.dim() < ndim_min:
        raise ValueError(f"{name} must have at least {ndim_min} dimension(s), got shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if last_dim is not None and (t.dim() == 0 or t.shape[-1] != last_dim):
        raise ValueError(f"{name} must have last dimension {last_dim}, got shape {tuple(t.shape)}")
    if dtypes and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({names}), got {str(t.dtype).replace('torch.', '')}")
    if like is not None:
        if t.device != like.device:
            raise ValueError(f"{name} must be on device {like.device}, got {t.device}")
        if dtypes and t.dtype != like.dtype:
            raise TypeError(f"{name} must have dtype {like.dtype} (that of x), got {t.dtype}")


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The autocast dtype active for ``device``, or None."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return None
