"""What every torch op of warpkan shares: Warp start-up, zero-copy views on torch's current stream,
argument checks whose messages name the argument, what was expected and what was given, the routing of
create_graph=True to each op's differentiable formula, and the policy on what the bridge does not support
(higher-order derivatives of an op without such a formula, torch.func transforms, fp16/bf16 conversion of the
float32/float64 layers, devices other than the CPU and CUDA), each refused with an error that says so."""

from __future__ import annotations

import contextlib
import ctypes
import math
import sys
import threading
from collections import OrderedDict

import torch
import warp as wp
from torch import nn

from .._warp_output import start_warp
from ..kernels import _transpose as kt

_streams: dict[tuple[int, int], wp.Stream] = {}
_devices: dict[str, wp.Device] = {}


def warp_device(device: torch.device) -> wp.Device:
    if device.type == "cuda" and device.index is None:  # "cuda": torch's current device, as torch reads it
        device = torch.device("cuda", torch.cuda.current_device())
    key = str(device)
    found = _devices.get(key)
    if found is None:
        start_warp()
        found = _devices[key] = wp.device_from_torch(device)
    return found


def _cuda_index(device: torch.device) -> int:
    """The index of a CUDA device (the current device for a bare ``cuda``)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def warp_stream(device: torch.device) -> wp.Stream | None:
    """Warp's wrapper of torch's current stream on ``device`` (None on the CPU), cached per (device, handle)
    so the hot path creates nothing: the raw handle costs ~0.1 us where ``torch.cuda.current_stream`` builds a
    Python stream object (~4 us on the GPU machine), and a layer asks once per launch."""
    if device.type != "cuda":
        return None
    index = _cuda_index(device)
    key = (index, torch._C._cuda_getCurrentRawStream(index))
    found = _streams.get(key)
    if found is None:
        start_warp()
        found = _streams[key] = wp.stream_from_torch(torch.cuda.current_stream(index))
    return found


_side_streams: dict = {}


class SideStream:
    """Work of one pass forked onto a second CUDA stream of the device, so that two independent chains of
    small kernels (a UKAN layer's CG-MLP and its spline's basis work) run side by side where one would leave
    the GPU mostly idle. ``fork()`` makes the side stream wait for the current one; work launched inside
    ``with side:`` goes on the side stream (Warp's launches too: ``warp_stream`` follows torch's current
    stream); ``join()`` makes the current stream wait for the side one. Under CUDA-graph capture the two
    become parallel branches of the graph. Tensors the side stream reads or writes that the caller would
    otherwise drop before the join are handed to ``hold()``: after the join, their memory is reused in stream
    order. One side stream a device, made the first time :func:`side_stream` is asked for it (an eager call,
    so that no stream is created during a capture)."""

    __slots__ = ("main", "side", "held", "forked", "_context")

    def __init__(self, main: "torch.cuda.Stream", side: "torch.cuda.Stream"):
        self.main, self.side, self.held, self.forked, self._context = main, side, [], False, None

    def fork(self) -> "SideStream":
        self.side.wait_stream(self.main)
        self.forked = True
        return self

    def join(self) -> None:
        """The current stream waits for the side one, if work went there since the last join (a second join does
        nothing; work on the side stream after a join forks again)."""
        if self.forked:
            self.main.wait_stream(self.side)
            self.forked = False
        self.held.clear()

    def hold(self, *tensors) -> None:
        self.held.extend(tensors)

    def __enter__(self):
        if not self.forked:  # work on the side stream always follows the main stream's so far
            self.fork()
        self._context = torch.cuda.stream(self.side)
        self._context.__enter__()
        return self

    def __exit__(self, *exc):
        context, self._context = self._context, None
        return context.__exit__(*exc)


def side_stream(device: torch.device) -> "torch.cuda.Stream":
    """The device's side stream (see :class:`SideStream`), made on first use: a stream of its own, created by
    Warp, not one of torch's pooled streams, which torch hands out in turn to every ``torch.cuda.Stream()`` (a
    caller's capture stream, or a user's stream, could otherwise be this one)."""
    index = _cuda_index(device)
    found = _side_streams.get(index)
    if found is None:
        start_warp()
        owner = wp.Stream(wp.get_device(f"cuda:{index}"))
        found = torch.cuda.ExternalStream(owner.cuda_stream, device=torch.device("cuda", index))
        _streams[(index, owner.cuda_stream)] = owner  # warp_stream's wrapper of it: Warp's own, kept alive
        _side_streams[index] = found
    return found


def side_work(device: torch.device) -> "SideStream | None":
    """A :class:`SideStream` on ``device`` (not forked yet) while a CUDA graph is being captured on its current
    stream (only the GPU time counts there, and the graph's parallel branches cost no host time at replay);
    None otherwise: an eager call pays the fork's and the join's host time (two events), which a small call,
    bound by the host, does not get back."""
    if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
        return None
    side = _side_streams.get(_cuda_index(device))
    if side is None:  # never made eagerly: not made now, during the capture
        return None
    return SideStream(torch.cuda.current_stream(device), side)


def on_side(side: "SideStream | None"):
    """``with on_side(side)``: work on the side stream (forked first if it was not), or where it is for None."""
    return side if side is not None else contextlib.nullcontext()


def gemm_side_work(x: torch.Tensor, strategy: str) -> "SideStream | None":
    """The side stream of a UKAN dense-range call on the gemm strategy (:func:`side_work`: while a CUDA graph is
    captured), else None. Any eager CUDA call makes the device's side stream first, so that a capture after eager
    calls (of another strategy, as small eager calls take) finds it made. (The other edge families do not take
    it: KANLinear's combined weight and split beside its basis work measured from 0.89x to 1.52x its one-stream
    step, graphed, and the polynomial layers have nothing to put there: docs/perf-notes-engine.md.)"""
    if not x.is_cuda:
        return None
    if x.device.index not in _side_streams and not torch.cuda.is_current_stream_capturing():
        side_stream(x.device)
    return side_work(x.device) if strategy == "gemm" else None


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


def _array_args(packed) -> list:
    """The packed Warp arrays in one packed kernel argument: itself, or (a struct, such as an edge family's
    frame) the arrays among its fields, nested structs included. ctypes hands back nested fields as views of
    the packed argument, so re-pointing one re-points the argument."""
    if not isinstance(packed, ctypes.Structure):
        return []
    if hasattr(packed, "data") and hasattr(packed, "strides"):
        return [packed]
    return [arg for name, _ in packed._fields_ for arg in _array_args(getattr(packed, name))]


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
        args = [arg for cmd in cmds for p in cmd.params[1:] for arg in _array_args(p)]
        slots = [[arg for arg in args if ptr and arg.data == ptr] for ptr in ptrs]
        if sum(len(found) for found in slots) != sum(1 for arg in args if arg.data):
            return None
        return slots

    @staticmethod
    def _signature(launcher, tensors, config) -> tuple:
        """(signature, ptrs, device) of a call: one flat key and one pass over the tensors (this runs per
        launch, often on autograd's device thread)."""
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
        return tuple(signature), ptrs, device

    def _replay(self, signature: tuple, ptrs: tuple, stream, launcher, tensors, config) -> None:
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

    def __call__(self, launcher, tensors: tuple, *config) -> None:
        signature, ptrs, device = self._signature(launcher, tensors, config)
        self._replay(signature, tuple(ptrs), warp_stream(device), launcher, tensors, config)

    def bind(self, launcher, tensors: tuple, *config, late: tuple = ()) -> "BoundLaunch":
        """The call ``self(launcher, tensors, *config)`` worked out now and made later, with the tensors at
        positions ``late`` given then (:class:`BoundLaunch`); ``tensors[i]`` for such a position stands for
        the later tensor's layout (shape, strides, dtype, device), which the caller guarantees."""
        signature, ptrs, device = self._signature(launcher, tensors, config)
        held = [None if i in late else t for i, t in enumerate(tensors)]  # not the stand-ins of late tensors
        return BoundLaunch(self, launcher, signature, ptrs, device, held, config, late)

    def clear(self) -> None:
        with self._lock:
            self._records.clear()


class BoundLaunch:
    """A :class:`RecordedLaunches` call whose signature was worked out ahead (:meth:`RecordedLaunches.bind`):
    calling it with the tensors of the ``late`` positions re-points and launches the record, with no pass over
    the other tensors. A node's forward binds its backward's launch on the caller's thread, so that the
    backward, which runs on autograd's device thread (where Python runs at about half speed on the GPU
    machine: ``docs/perf-notes-host.md``), only fills in dy, x and dx. It holds the bound tensors: bind the
    ones the backward must take from ``ctx.saved_tensors`` (x, so that saved-tensor hooks see it) late."""

    __slots__ = ("owner", "launcher", "signature", "ptrs", "device", "tensors", "config", "late")

    def __init__(self, owner, launcher, signature, ptrs, device, tensors, config, late):
        self.owner, self.launcher, self.signature, self.ptrs = owner, launcher, signature, ptrs
        self.device, self.tensors, self.config, self.late = device, tensors, config, late

    def __call__(self, *late_tensors) -> None:
        ptrs, tensors = self.ptrs.copy(), self.tensors.copy()
        for i, t in zip(self.late, late_tensors):
            ptrs[i] = t.data_ptr()
            tensors[i] = t
        self.owner._replay(self.signature, tuple(ptrs), warp_stream(self.device), self.launcher, tensors,
                           self.config)

    def backward(self, dy: torch.Tensor, x: torch.Tensor, need_x: bool) -> "torch.Tensor | None":
        """A backward pass bound with dy, x and (where ``need_x``) dx late: dx (a new tensor like x, which the
        launch writes; None without need_x) after the launch."""
        if not need_x:
            self(dy, x)
            return None
        dx = torch.empty_like(x)
        self(dy, x, dx)
        return dx


def keyword_launcher(launcher):
    """``launcher`` with its keyword configuration moved to positions, as :class:`RecordedLaunches` calls it:
    ``call(*tensors, config, record=False)`` runs ``launcher(*tensors, **dict(config), record=record)``, the
    configuration a tuple of (name, value) pairs (hashable: part of the record's signature)."""
    def call(*args, record=False):
        *tensors, config = args
        return launcher(*tensors, **dict(config), record=record)

    call.__name__ = launcher.__name__
    return call


# ---------------------------------------------------------- copies between public and kernel layouts
# A parameter stored contiguously in its public layout ([out, in, G + k], [out, in]) and read by the kernels in
# theirs ([in, G + k, out], [in, out]) is copied once a step, and its gradient back. Both copies are transposes
# of contiguous memory, which torch's generic copy serves coalesced on one side only (on an H200, about 0.74
# TB/s for a 1.07 GB table: 5.9 ms of a 10.6 ms step); the Warp kernel of warpkan.kernels._transpose is
# coalesced on both. Any other copy stays torch's.

# The device types on which the Warp kernel makes the transposing copies. Not the CPU, where it runs on one
# thread: on the 2-core CI machine (under other load, fp32) it beat torch's copy on long 2-D tables ([32,
# 2^20] either way: 23 and 19 ms against torch's 42-49 and 32-34), lost on small ones ([32, 2144]: 40 us
# against 30) and on PolyKANLinear's batched table ([512, 512, 9]: 1.2-1.3 ms against 0.4-0.8); torch's copy
# also scales with the cores (`python scripts/transpose_timing.py --device cpu`). The tests add "cpu" to run
# the kernel through the layers.
WARP_TRANSPOSE_DEVICES = {"cuda"}
# Smaller copies stay torch's: there both take a launch's time on the GPU (2^18 float32 elements move in about
# 2 us at torch's 0.74 TB/s), and torch's copy (AccumulateGrad's, for a gradient) costs less host time than
# a recorded Warp launch called from Python (about 5 us, plus a few us of Python), which is what decides a
# small layer's eager step.
WARP_TRANSPOSE_MIN_ELEMENTS = 2**18

_transpose_launches = RecordedLaunches()


def transpose_plan(shape, stride) -> tuple[int, int, int] | None:
    """(batch, rows, cols) when a tensor of ``shape`` and ``stride`` is the memory of a contiguous [batch,
    rows, cols] array read with its last two axes swapped (its row-major elements are that array transposed
    to [batch, cols, rows]); None for any other layout (contiguous included). A [out, M] parameter seen as
    [M, out] is (1, out, M); [in, out, D + 1] seen as [in, D + 1, out] is (in, out, D + 1). Extents of 1 carry
    no stride; neighbouring axes that are also neighbours in memory are merged first."""
    groups: list[list[int]] = []  # [extent, stride of its innermost axis]
    for n, s in zip(shape, stride):
        if n == 1:
            continue
        if groups and groups[-1][1] == s * n:
            groups[-1] = [groups[-1][0] * n, s]
        else:
            groups.append([n, s])
    if len(groups) == 2:
        (cols, s_cols), (rows, s_rows) = groups
        batch, s_batch = 1, rows * cols
    elif len(groups) == 3:
        (batch, s_batch), (cols, s_cols), (rows, s_rows) = groups
    else:
        return None
    if s_cols != 1 or s_rows != cols or s_batch != rows * cols:
        return None
    return batch, rows, cols


def _warp_transposes(t: torch.Tensor) -> bool:
    """Whether a transposing copy of ``t`` goes through the Warp kernel: a device of WARP_TRANSPOSE_DEVICES,
    a plain tensor (not a tracing subclass, nothing autograd would have to see) of a dtype Warp views, of at
    least WARP_TRANSPOSE_MIN_ELEMENTS elements and within the kernel's 32-bit addressing."""
    return (t.device.type in WARP_TRANSPOSE_DEVICES and WARP_TRANSPOSE_MIN_ELEMENTS <= t.numel() <= kt.MAX_ELEMENTS
            and t.numel() > 0 and type(t) in (torch.Tensor, nn.Parameter) and t.dtype in WP_DTYPES
            and not (t.requires_grad and torch.is_grad_enabled()))


def kernel_copies(t: torch.Tensor) -> bool:
    """Whether the Warp kernel copies ``t`` into contiguous memory (and a contiguous gradient back into
    ``t``'s strides): :func:`copy_into` would take it."""
    return _warp_transposes(t) and transpose_plan(t.shape, t.stride()) is not None


def _flat(t: torch.Tensor) -> torch.Tensor:
    """The dense memory under ``t`` (any strides that cover it exactly) as a 1-D tensor."""
    return t.view(-1) if t.is_contiguous() else t.as_strided((t.numel(),), (1,))


def copy_into(src: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out.copy_(src)`` for ``out`` of src's shape and device and of its dtype or (a float32 src) bfloat16 (the
    callers make it so), by the Warp transpose kernel where one of the two is contiguous and the other a
    transpose of contiguous memory (:func:`transpose_plan`, :func:`_warp_transposes`; a bfloat16 out in the same
    launch, rounded as torch rounds); torch's copy otherwise. Returns out."""
    plan = None
    if _warp_transposes(src) and (out.dtype == src.dtype or (src.dtype, out.dtype) == (torch.float32,
                                                                                          torch.bfloat16)):
        if out.is_contiguous():
            plan = transpose_plan(src.shape, src.stride())
        elif src.is_contiguous():
            plan = transpose_plan(out.shape, out.stride())
            if plan is not None:  # out's memory is [batch, rows, cols]: src's is [batch, cols, rows]
                plan = (plan[0], plan[2], plan[1])
    if plan is None:
        return out.copy_(src)
    batch, rows, cols = plan
    _transpose_launches(kt.launch_transpose, (_flat(src), _flat(out)), rows, cols, batch)
    return out


def contiguous(t: torch.Tensor, dtype: "torch.dtype | None" = None) -> torch.Tensor:
    """``t.contiguous()`` (``dtype``: ``t.to(dtype).contiguous()``), with a transpose of contiguous memory copied
    by :func:`copy_into` (to bfloat16 from float32 in the same launch)."""
    dtype = dtype or t.dtype
    if t.is_contiguous() and dtype == t.dtype:
        return t
    return copy_into(t, torch.empty(t.shape, dtype=dtype, device=t.device))


def with_strides(t: torch.Tensor, stride: tuple) -> torch.Tensor:
    """``t``, or a copy of it (:func:`copy_into`) in a dense ``stride`` of its shape."""
    if t.stride() == tuple(stride) or t.numel() == 0:
        return t
    return copy_into(t, torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device))


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


# ---------------------------------------------------------------------- what the bridge refuses, and how
_DERIVATIVES_HINT = (
    "For a physics-informed loss's derivatives in x, the KAN layers (KANLinear, UKANLinear, PolyKANLinear / "
    "ChebyKANLinear, GroupRational, GRKANLinear, KATMLP) differentiate in torch: by reverse mode with "
    "torch.autograd.grad(..., create_graph=True), or by Taylor mode with warpkan.torch_bridge.jet (u and its "
    "first and second derivatives in one forward pass)."
)


def higher_order_message(label: str) -> str:
    return (
        f"{label}: higher-order derivatives (torch.autograd.grad(..., create_graph=True), or backward(create_graph="
        "True)) are not yet supported by this op: its backward kernels are not differentiable, so "
        "the derivative would come back detached from the graph and a term of the result would be silently "
        f"lost. First-order gradients (create_graph=False) are supported. {_DERIVATIVES_HINT}"
    )


def first_order_backward(label: str, backward, higher=None):
    """``backward`` (an op's autograd formula, ``backward(ctx, *grads)``) for first-order gradients; where a
    graph of the derivative is wanted, ``higher(ctx, op_inputs, *grads)`` (a formula of differentiable pieces,
    given the op's inputs as the setup recorded them in ``ctx.op_inputs``), or, without one, a refusal.
    Autograd runs a backward with grad mode enabled exactly when ``create_graph=True``; the Warp backward
    kernels have no derivative of their own, so their result would be detached from the graph
    (``once_differentiable`` returns it without a node when the incoming gradients need none), which would drop
    a term of, e.g., a physics-informed residual without a word. One ``torch.is_grad_enabled()`` a backward
    call. Used by every op, eager route (:func:`eager_function`) and registered ``register_autograd`` formula
    alike."""

    def checked(ctx, *grads):
        if torch.is_grad_enabled():
            if higher is None:
                raise NotImplementedError(higher_order_message(label))
            return higher(ctx, getattr(ctx, "op_inputs", None), *grads)
        return backward(ctx, *grads)

    checked.__name__ = getattr(backward, "__name__", "backward")
    checked.__doc__ = getattr(backward, "__doc__", None)
    return checked


def inputs_used_by_this_backward(ctx) -> list:
    """For each tensor input of the node ``ctx`` (in order; ``ctx.next_functions`` holds one entry per tensor
    input), whether the running backward uses its gradient. ``autograd.grad(u, x, create_graph=True)`` runs only
    the nodes on a path to x, yet a node's formula is asked for all the gradients its inputs could take: a
    physics-informed step's u_x and u_xx would build every layer's parameter-gradient graph (a dense basis and a
    GEMM each) only for autograd to drop it. True wherever torch can't tell."""
    return [node is not None and _will_run(node) for node, _ in ctx.next_functions]


def _will_run(node) -> bool:
    try:
        return bool(torch._C._will_engine_execute_node(node))
    except (RuntimeError, AttributeError):  # e.g. a leaf that autograd.grad was asked for: torch can't tell
        return True


def needed_grads(ctx, inputs) -> list:
    """For a Function's leading ``inputs`` (tensors, or None), whether each needs a gradient in the running
    backward: asked for (``needs_input_grad``) and on a path autograd will take (a backward that asks for x
    alone runs no parameter branch)."""
    used = iter(inputs_used_by_this_backward(ctx))
    return [t is not None and bool(next(used)) and ctx.needs_input_grad[k] for k, t in enumerate(inputs)]


def params_used_by_this_backward(ctx) -> bool:
    """Whether the running backward uses the gradient of any tensor input of ``ctx`` after its first (x: the
    parameters); see :func:`inputs_used_by_this_backward`."""
    return any(inputs_used_by_this_backward(ctx)[1:])


# torch.func interpreter kind -> what to do instead
_TRANSFORM_ADVICE = {
    "Vmap": "the layers take x of shape (..., in): put the vmapped dimension into the leading dimensions of x "
            "instead (layer(x) on x [B, N, in] is the vmap of layer over B)",
    "Grad": "use torch.autograd (loss.backward() or torch.autograd.grad) for gradients",
    "Jvp": "use torch.autograd (reverse mode, torch.autograd.grad) for derivatives",
    "Functionalize": "call the layer outside the transform",
}
# the public torch.func transforms, as their entry points are named in torch._functorch
_TRANSFORM_NAMES = ("grad", "grad_and_value", "vjp", "jacrev", "jvp", "jacfwd", "vmap", "functionalize")


def _transforms_in_use() -> list:
    """The torch.func transforms the running call is inside, outermost first (["jacfwd", "jacrev"] under
    torch.func.hessian). Read from the Python stack: the interpreter stack tells only each level's kind (grad,
    vjp and jacrev are all a Grad level)."""
    found = []
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if "_functorch" in code.co_filename:
            # an entry point ("vjp") or the wrapper it returns ("jacrev.<locals>.wrapper_fn"), not a helper
            # nested deeper ("jacfwd.<locals>.wrapper_fn.<locals>.push_jvp")
            name, _, inner = code.co_qualname.partition(".<locals>.")
            if name in _TRANSFORM_NAMES and "." not in inner:
                found.append(name)
        frame = frame.f_back
    found.reverse()
    # jacfwd vmaps its jvp over the basis vectors: that vmap is its own
    return [t for i, t in enumerate(found) if not (t == "vmap" and i and found[i - 1] == "jacfwd")]


def _transform_description(kind: str) -> str:
    """How the user met the transform: its name ("torch.func.jacrev"), a nesting of them ("torch.func.vmap of
    torch.func.grad"), torch.func.hessian for its jacfwd of jacrev; by the interpreter kind where the stack
    names none."""
    used = _transforms_in_use()
    if not used:
        return f"the torch.func transform {kind or '(unknown)'}"
    named = " of ".join(f"torch.func.{t}" for t in used)
    return named.replace("torch.func.jacfwd of torch.func.jacrev", "torch.func.hessian (jacfwd of jacrev)")


def refuse_transforms(label: str) -> None:
    """Raise a clear error under a ``torch.func`` transform (vmap, grad, vjp, jacrev, jvp, jacfwd, hessian,
    functionalize), naming the transform used: the Warp kernels need tensors with real storage, have no
    batching rule and no forward-mode formula, so the transforms would otherwise fail deep inside with an
    internal message. Costs one ``torch._C._are_functorch_transforms_active()`` (~0.1 us) a call."""
    if torch._C._are_functorch_transforms_active():
        top = torch._C._functorch.peek_interpreter_stack()
        kind = str(top.key()).rsplit(".", 1)[-1] if top is not None else ""
        instead = _TRANSFORM_ADVICE.get(kind, "call the layer outside the transform")
        raise NotImplementedError(
            f"{label}: {_transform_description(kind)} is not supported through the torch bridge (the Warp kernels "
            f"take plain tensors with storage, and have no batching rule or forward-mode formula); {instead}. "
            f"{_DERIVATIVES_HINT if kind in ('Grad', 'Jvp') else ''}".rstrip()
        )


def forward_mode_message(label: str) -> str:
    return (f"{label}: forward-mode AD (torch.autograd.forward_ad, torch.func.jvp / jacfwd) is not supported "
            "through the torch bridge; use torch.autograd (reverse mode) for first-order derivatives.")


def use_registered_op(x: torch.Tensor) -> bool:
    """Whether a layer calls its registered custom op instead of the eager route: under tracing
    (``torch.compile``, export), and for meta tensors, where the op's fake implementation infers the shapes
    (as ``nn.Linear`` does on the meta device) and its registered formula those of the gradients."""
    return x.is_meta or torch.compiler.is_compiling()


def runs_registered_op(x: torch.Tensor) -> bool:
    """Whether a differentiable piece of a ``create_graph=True`` formula (a backward that is itself
    differentiated) runs as its registered op rather than its eager ``autograd.Function``: where the layer's op
    would (:func:`use_registered_op`), and on the tensor subclasses of tracing (fake and functional tensors, as
    torch.compile's and opcheck's traces of a registered backward pass them)."""
    return use_registered_op(x) or type(x) not in (torch.Tensor, nn.Parameter)


def cacheable(t: torch.Tensor) -> bool:
    """Whether a tensor made now may be kept in a module-level cache for later calls: not a tracing mode's
    (:func:`runs_registered_op`: fake, functional and meta tensors, or one made while compiling, without
    storage of its own) nor a ``torch.func`` transform's wrapper (made while a transform runs, a factory's
    result included; its level dies with the transform and it has no storage after)."""
    return not (runs_registered_op(t) or torch._C._functorch.is_functorch_wrapped_tensor(t))


class EagerRoute:
    """An op's eager route (see :func:`eager_function`): ``function``, the ``autograd.Function``; ``layouts``,
    the inputs it takes in a public layout; ``label``, how errors name it ("KANLinear (warpkan::edge_forward)").
    A plain object, so that traced code reads it (:func:`op_or_eager`)."""

    def __init__(self, function, forward_impl, layouts: dict, label: str, rows: bool = False):
        self.function = function
        self.forward_impl = forward_impl
        self.layouts = layouts
        self.label = label
        self.rows = rows
        # the C-level apply: ``Function.apply``'s Python wrapper only serves functorch transforms (vmap, grad),
        # which run through it still (see run), and costs a node a few microseconds of host time
        self.apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, function)

    def relayout(self, values: tuple, direction: int) -> tuple:
        """``values`` (the inputs, or their gradients) with each one the route takes in a public layout mapped
        by ``layouts[i][direction]``: 0 to the op's view, 1 back to the public layout. None stays None."""
        values = list(values)
        for i, maps in self.layouts.items():
            if values[i] is not None:
                values[i] = maps[direction](values[i])
        return tuple(values)

    def op_inputs(self, inputs: tuple) -> tuple:
        """The inputs as the op takes them: the op's views of those in a public layout."""
        return self.relayout(inputs, 0)

    def run(self, *inputs):
        """The Function where a gradient is wanted; the implementation alone, without building a node, where
        none is (inference, frozen inputs)."""
        if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs):
            if torch._C._are_functorch_transforms_active():
                return self.function.apply(*inputs)
            return self.apply(*inputs)
        if self.rows and inputs[0].dim() != 2:  # no node is built: reshapes here are no nodes either
            x = inputs[0]
            return _lead_output(self.forward_impl(*self.op_inputs((_as_rows(x), *inputs[1:]))), x.shape[:-1])
        return self.forward_impl(*self.op_inputs(inputs))


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """t (..., n) as rows [N, n] (itself when 2-D; an empty batch gives N = 0)."""
    return t if t.dim() == 2 else t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def _lead_output(output, lead):
    """An op's output on rows seen as (*lead, out): y, or the first of a tuple (the others, saved and
    non-differentiable, stay rows)."""
    if isinstance(output, tuple):
        return (output[0].reshape(*lead, output[0].shape[-1]), *output[1:])
    return output.reshape(*lead, output.shape[-1])


def _rows_in(values, lead):
    """``values`` with the first (x, or y's gradient: (*lead, n)) as rows [N, n], where ``lead`` is not None
    (a None gradient, of an unused y, stays None)."""
    if lead is None or values[0] is None:
        return values
    return (_as_rows(values[0]), *values[1:])


def _lead_back(grads, lead):
    """``grads`` with the first (x's: [N, in] rows) seen as (*lead, in)."""
    if lead is None or grads[0] is None:
        return grads
    return (grads[0].reshape(*lead, grads[0].shape[-1]), *grads[1:])


def eager_function(name: str, forward_impl, setup_context, backward, layouts: dict | None = None,
                   label: str | None = None, prepare=None, higher=None, rows: bool = False) -> EagerRoute:
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
    their own (TBackward, PermuteBackward), each 10-20 us of a step's host time on the GPU machine.

    ``label`` names the layer and op in errors. With ``higher`` (see :func:`first_order_backward`), gradients
    with ``create_graph=True`` come from it, given the op's views of the Function's own inputs (so that they
    carry the inputs' history); without it ``create_graph=True`` raises. Forward-mode AD raises.

    ``prepare(op_inputs) -> op_inputs``: run on the op's inputs before the implementation when a node is built,
    so that what it makes (a contiguous copy of a parameter the implementation would copy itself) is also what
    the backward is given, made once a step. The gradient of an input that ``prepare`` copied by the transpose
    kernel (a public-layout parameter's view, :func:`kernel_copies`) goes back in that input's strides by the
    same kernel, so that AccumulateGrad takes it as it is (its own copy of a gradient in other strides is
    torch's generic one, which stays for the other inputs).

    ``rows``: the op takes x (its first input) as rows [N, in] and gives y [N, out] (or a tuple led by y); the
    route takes x (..., in) and gives y (..., out), the rows seen inside the Function (forward, backward and
    create_graph formula alike). A reshape outside would be an autograd view node on each side of the op
    (:func:`on_rows`, which :func:`op_or_eager` applies to the registered op), 10-20 us of host time each on
    the GPU machine."""
    layouts = layouts or {}
    label = label or name
    route = None  # set below, once the Function exists

    def forward(ctx, *inputs):
        if higher is not None:
            ctx.raw_inputs = inputs  # the Function's inputs, with their history: for create_graph=True
        ctx.lead = inputs[0].shape[:-1] if rows and inputs[0].dim() != 2 else None
        inputs = route.op_inputs(_rows_in(inputs, ctx.lead))
        if prepare is not None:
            prepared = prepare(inputs)
            ctx.input_strides = [(i, t.stride()) for i, (t, p) in enumerate(zip(inputs, prepared))
                                 if p is not t and isinstance(t, torch.Tensor) and kernel_copies(t)]
            inputs = prepared
        output = forward_impl(*inputs)
        setup_context(ctx, inputs, output)
        return output if ctx.lead is None else _lead_output(output, ctx.lead)

    def public_backward(ctx, *grads):
        grads = _lead_back(backward(ctx, *_rows_in(grads, ctx.lead)), ctx.lead)
        restride = getattr(ctx, "input_strides", None)
        if restride:
            grads = list(grads)
            for i, stride in restride:
                if grads[i] is not None:
                    grads[i] = with_strides(grads[i], stride)
        return route.relayout(grads, 1) if layouts else tuple(grads)

    def jvp(ctx, *tangents):
        raise NotImplementedError(forward_mode_message(label))

    # first_order_backward calls it with grad mode off only (create_graph=True goes to ``higher``): what
    # ``once_differentiable`` would add is a no_grad block around it, a few microseconds of a node's Python
    first = public_backward if layouts or prepare or rows else backward

    def higher_backward(ctx, op_inputs, *grads):
        # the rows as differentiable reshapes, part of the graph being built
        raw, grads = _rows_in(ctx.raw_inputs, ctx.lead), _rows_in(grads, ctx.lead)
        grads = _lead_back(tuple(higher(ctx, route.op_inputs(raw), *grads)), ctx.lead)
        return route.relayout(grads, 1) if layouts else grads

    function = type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward),
        "backward": staticmethod(first_order_backward(label, first, higher_backward if higher is not None else None)),
        "jvp": staticmethod(jvp),
        "__doc__": f"{name}: eager route of a warpkan custom op (see warpkan.torch_bridge._common.eager_function).",
    })
    route = EagerRoute(function, forward_impl, layouts, label, rows)
    return route


def on_rows(x: torch.Tensor, n_in: int, apply):
    """``apply(x2)`` on x (..., n_in) seen as rows x2 [N, n_in], its [N, out] result seen as (..., out). A 2-D
    x goes as it is: a reshape is an autograd view node even when it changes nothing, 10-20 us of a step's
    host time on the GPU machine."""
    if x.dim() == 2:
        return apply(x)
    return _lead_output(apply(x.reshape(-1, n_in)), x.shape[:-1])


# ``eager_function`` layout of a parameter the module exposes as [out, in] and stores as the op's [in, out]
TRANSPOSED = (torch.t, torch.t)


def op_or_eager(op, eager: EagerRoute, x: torch.Tensor):
    """A callable on the eager route's inputs: the registered op under tracing and on meta tensors
    (:func:`use_registered_op`; on the op's views of the inputs the route takes in a public layout, and for a
    route that takes x (..., in) whole, ``eager_function(rows=True)``, on x's rows: :func:`on_rows`), the
    eager route otherwise (:meth:`EagerRoute.run`), refused under ``torch.func`` transforms
    (:func:`refuse_transforms`). ``x``: the op's first input."""
    if not use_registered_op(x):
        refuse_transforms(eager.label)
        return eager.run
    call = (lambda *inputs: op(*eager.op_inputs(inputs))) if eager.layouts else op
    if eager.rows:
        return lambda x, *rest: on_rows(x, x.shape[-1], lambda rows: call(rows, *rest))
    return call


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
    if t.layout != torch.strided:  # the kernels read dense storage
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {str(t.layout).replace('torch.', '')}: "
                        f"convert it with {name}.to_dense()")
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


def call_precision(precision: str, cast_to: torch.dtype | None, dtype: torch.dtype) -> str:
    """The gemm precision a spline layer's call asks for: its own ``precision``; "bf16" for "auto" under bf16
    autocast (``cast_to``; the layer computes in fp32 with autocast off, where the op could no longer see it);
    "fp32" for a float64 layer (it computes in float64)."""
    if dtype == torch.float64:
        return "fp32"
    if precision == "auto" and cast_to == torch.bfloat16:
        return "bf16"
    return precision


def kernel_scalar(x: torch.Tensor) -> str:
    """The scalar type the edge and UKAN kernels compute a float tensor ``x`` in: "float64" for float64, else
    "float32"."""
    return "float64" if x.dtype == torch.float64 else "float32"


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The autocast dtype active for ``device``, or None (always on the meta device, which has no autocast)."""
    if device.type != "meta" and torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return None


def check_device(device, name: str = "device") -> None:
    """A layer's ``device`` argument: None (torch's default), or a CPU, CUDA or meta (shape inference) device
    that exists on this machine. Refused with a ValueError naming the argument, before anything is allocated:
    torch's own errors for a missing CUDA device ("Torch not compiled with CUDA enabled", "Found no NVIDIA
    driver") do not say which argument asked for it."""
    if device is None:
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"{name} must be a torch.device or a device string such as 'cpu' or 'cuda', "
                         f"got {device!r}") from None
    if dev.type not in ("cpu", "cuda", "meta"):
        raise ValueError(f"{name} must be a cpu, cuda or meta device (the Warp kernels run on the CPU and on CUDA "
                         f"GPUs), got {device!r}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name}={device!r}: no CUDA device is available on this machine "
                             "(torch.cuda.is_available() is False); use device='cpu'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{name}={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")


LOW_PRECISION_POLICY = (
    "For bf16/fp16 compute use torch.autocast (e.g. `with torch.autocast('cuda', dtype=torch.bfloat16): "
    "y = layer(x)`), under which the layer computes in float32 and returns the autocast dtype."
)


# the Tensor / Module method that converts to each floating dtype
_CONVERTERS = {torch.float32: "float", torch.float64: "double", torch.float16: "half", torch.bfloat16: "bfloat16"}


def check_input_dtype(x: torch.Tensor, dtype: torch.dtype, layer_dtypes: tuple) -> None:
    """TypeError unless x has the layer's dtype ``dtype`` (outside autocast, where x of any float dtype is cast),
    saying how to make them agree: convert x, or the layer where it can take x's dtype (``layer_dtypes``), or
    for a 16-bit x that the layer cannot take, compute under autocast."""
    if x.dtype == dtype:
        return
    hint = f"convert x (x.{_CONVERTERS[dtype]}())"
    if x.dtype in layer_dtypes:
        hint += f" or the layer (layer.{_CONVERTERS[x.dtype]}())"
    elif x.dtype in (torch.float16, torch.bfloat16):
        hint += (f", or run the layer under torch.autocast(dtype={x.dtype}): it then computes in {dtype} and returns "
                 f"{x.dtype}")
    raise TypeError(f"x must have the layer's dtype {dtype}, got {x.dtype}: {hint}")


def layer_dtype(dtype) -> torch.dtype:
    """The ``dtype`` argument of a :class:`Float32Or64Module` layer: torch's default dtype when None, else
    float32 or float64 (TypeError otherwise, with the autocast policy for 16-bit compute)."""
    dtype = dtype or torch.get_default_dtype()
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be float32 or float64, got {dtype}. {LOW_PRECISION_POLICY}")
    return dtype


class Float32Or64Module(nn.Module):
    """Base of the layers that compute in float32 or float64 only (their kernels and LUTs have no fp16/bf16
    form): a conversion to another floating dtype (``.half()``, ``.bfloat16()``, ``.to(torch.float16)``,
    ``.type(...)``) is refused with a TypeError before any parameter or buffer changes, instead of being
    accepted and failing at the next forward. ``.double()``, ``.float()``, device moves and ``to_empty`` work
    as usual; bf16/fp16 compute goes through ``torch.autocast``.

    ``nn.Module._apply`` is where every such conversion goes; the override first applies its ``fn`` to an
    empty float32 tensor on the layer's device and refuses any result that is not float32/float64. (A model
    holding the layer converts its children in order: those before the layer are converted when it refuses.)"""

    def _apply(self, fn, recurse=True):
        held = next(self.parameters(), None)
        if held is None:
            held = next(self.buffers(), None)
        probe = fn(torch.empty(0, dtype=torch.float32, device=held.device if held is not None else "cpu"))
        if isinstance(probe, torch.Tensor) and probe.is_floating_point() and probe.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{type(self).__name__} computes in float32 or float64: converting it to "
                            f"{str(probe.dtype).replace('torch.', '')} is refused (the layer is unchanged). "
                            f"{LOW_PRECISION_POLICY}")
        return super()._apply(fn, recurse)
