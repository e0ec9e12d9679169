"""A whole training step replayed from a CUDA graph.

A small network's step is bound by the host: Python, autograd and a launch per kernel cost more than the GPU
work. Captured once and replayed, the step costs its GPU time. warpkan's ops launch on torch's current stream
and allocate through torch, so they capture like torch's own.

Two ways in, one capture underneath:

- :func:`graphed_training_step`: a supervised training step (forward, loss, backward, optimizer step, with
  micro-batch accumulation and autocast) made from a model, an optimizer and a loss; the batch is copied into
  the graph's input buffers on each call. The same code runs eagerly on a device without CUDA graphs.
- :func:`capture_step`: any step function, captured as it is (a physics-informed residual's derivatives by
  ``create_graph=True``, a custom loop); the caller keeps its tensors in place.

Whole-step capture is where a small model's time goes: ``torch.compile(model, mode="reduce-overhead")``
records the model's forward and backward in CUDA graphs, but the loss, the backward's glue and the optimizer
stay outside them and run from the host on every step.

**torch.compile(mode="reduce-overhead").** Every warpkan layer compiles in one graph and records in CUDA
graphs (``UKANLinear`` needs a fixed ``table_groups``: its exact table reads its size back to the host).
Call ``torch.compiler.cudagraph_mark_step_begin()`` before each forward whose outputs of earlier calls must
not be overwritten: when accumulating gradients over micro-batches, before each micro-batch's forward
(otherwise torch fails with "accessing tensor output of CUDAGraphs that has been overwritten", for any
model). Accumulating, the gradients must also exist before the first micro-batch and be zeroed in place
(``optimizer.zero_grad(set_to_none=False)``): a first backward into ``.grad = None`` takes the recorded
backward's output tensor itself as the gradient, and the next micro-batch's replay writes over it.
:func:`graphed_training_step` with ``accumulation_steps`` needs none of this (one capture holds every
micro-batch, so nothing of one replay is overwritten by the next), and graphs the loss and the optimizer too. A
plain loop of one forward, backward and optimizer step per batch needs no mark; torch starts a new step once the
backward has run.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

__all__ = ["capture_step", "graphed_training_step"]


def _on_side_stream(fn, stream):
    """``fn()`` on ``stream``, ordered after the current stream's work and before its later work: the
    warm-up before a capture, as ``torch.cuda.graph`` asks (lazy initialisation and the caching allocator's
    blocks then belong to a stream other than the capture's)."""
    current = torch.cuda.current_stream()
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        out = fn()
    current.wait_stream(stream)
    return out


def _capture(step):
    """``step()`` captured (not run) in a CUDA graph; returns ``replay()``, which runs it and returns what the
    captured call returned, refreshed in place."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()

    def replay():
        graph.replay()
        return outputs

    return replay


def capture_step(step, warmup: int = 3):
    """Capture ``step()`` in a CUDA graph and return ``replay()``, which runs the step again on the GPU and
    returns what the captured call returned (the same tensors, refreshed in place).

    ``warmup`` eager calls come first, on a side stream, as ``torch.cuda.graph`` asks; they are training steps
    like the replays. The step must keep its tensors where they are: an optimizer made with
    ``capturable=True``, the gradients zeroed inside the step (``zero_grad()`` there: the captured backward
    then writes each gradient where the capture put it; one called between replays would set ``.grad`` to None
    and leave the graph's gradients unseen), and new inputs copied into the captured input tensors rather than
    passed as new ones. For a supervised training step, :func:`graphed_training_step` does all of this."""
    if not torch.cuda.is_available():
        raise RuntimeError("capture_step needs a CUDA device: CUDA graphs replay GPU work only")
    side = torch.cuda.Stream()
    for _ in range(warmup):
        _on_side_stream(step, side)
    return _capture(step)


# torch.optim's optimizers without a capturable mode whose step a replay would get wrong or cannot capture
_UNCAPTURABLE_OPTIMIZERS = {
    torch.optim.Adagrad: "counts its steps on the host: a replay would not advance the count (its lr_decay would "
                         "stall)",
    torch.optim.Adafactor: "reads values back to the host (.item()) in every step",
    torch.optim.LBFGS: "needs a closure and reads the loss back to the host",
    torch.optim.SparseAdam: "counts its steps in Python: every replay would repeat the captured step's bias "
                            "correction",
}


def _same_value(a, b) -> bool:
    """Whether a hyperparameter is unchanged: a tensor must be the same tensor (a replay reads its memory), a
    tuple the same items, anything else equal."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    return a == b


def _hyperparameters(optimizer) -> list[dict]:
    return [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]


def _check_capturable(optimizer, device: torch.device) -> None:
    """ValueError/TypeError unless ``optimizer.step()`` can be captured in a CUDA graph on ``device`` and
    replayed: a ``capturable`` option on, tensor hyperparameters on ``device``, no optimizer known to keep its
    state on the host."""
    name = type(optimizer).__name__
    for cls, why in _UNCAPTURABLE_OPTIMIZERS.items():
        if isinstance(optimizer, cls):
            raise TypeError(f"optimizer: torch.optim.{cls.__name__} cannot be replayed from a CUDA graph: it {why}; "
                            "use an optimizer with capturable=True (Adam, AdamW, ...) or SGD")
    for i, group in enumerate(optimizer.param_groups):
        if "capturable" in group and not group["capturable"]:
            raise ValueError(f"optimizer: {name} has capturable=False (param_groups[{i}]); a step replayed from a "
                             f"CUDA graph needs its step count on the device: make it with {name}(..., "
                             "capturable=True)")
        if isinstance(optimizer, torch.optim.SGD) and isinstance(group["lr"], torch.Tensor) and not group["fused"]:
            raise ValueError(f"optimizer: SGD with a tensor lr (param_groups[{i}]) reads it back to the host in every "
                             "step unless fused=True; give SGD(..., fused=True), or a float lr (fixed once captured)")
        for key, value in group.items():
            if key == "params":
                continue
            for t in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(t, torch.Tensor) and t.device != device:
                    raise ValueError(f"optimizer.param_groups[{i}][{key!r}] must be on device {device} (the "
                                     f"parameters'), got a tensor on {t.device}: a replay reads it from the device")


class _GraphedTrainingStep:
    """The callable :func:`graphed_training_step` returns (see there)."""

    def __init__(self, model, optimizer, loss_fn, example_batch, accumulation_steps, autocast_dtype, warmup):
        self._model, self._optimizer, self._loss_fn = model, optimizer, loss_fn
        self.accumulation_steps, self.autocast_dtype, self.warmup = accumulation_steps, autocast_dtype, warmup
        self.device = _device_of(model, optimizer)
        for i, t in enumerate(example_batch):
            if t.device != self.device:
                raise ValueError(f"example_batch[{i}] must be on device {self.device} (the parameters'), "
                                 f"got {t.device}")
        self.graphed = self.device.type == "cuda"
        if self.graphed:
            _check_capturable(optimizer, self.device)
        # the static input buffers: each call copies its batch here, and the (captured) step reads only these
        self._batch = tuple(torch.empty_like(t, requires_grad=False).copy_(t) for t in example_batch)
        self._hyperparameters = _hyperparameters(optimizer)
        self._warm_calls = 0
        self._side = torch.cuda.Stream(self.device) if self.graphed else None
        self._replay = None

    def __call__(self, *batch: torch.Tensor) -> torch.Tensor:
        """One training step on ``batch`` (the tensors of ``example_batch``'s shapes, dtypes and device, in its
        order); returns the loss (on cuda, the graph's loss tensor, overwritten by the next call)."""
        self._check_batch(batch)
        self._check_hyperparameters()
        for buffer, t in zip(self._batch, batch):
            buffer.copy_(t)
        if self._replay is not None:
            return self._replay()
        if not self.graphed:
            return self._step()
        if self._warm_calls < self.warmup:
            self._warm_calls += 1
            with warnings.catch_warnings():
                # the eager steps a capture needs first: torch warns that a capturable optimizer runs uncaptured
                warnings.filterwarnings("ignore", message="This instance was constructed with capturable=True",
                                        category=UserWarning)
                return _on_side_stream(self._step, self._side)
        try:
            self._replay = _capture(self._step)
        except RuntimeError as exc:
            raise RuntimeError(
                "capturing the training step in a CUDA graph failed: the model, the loss and the optimizer must "
                "not read values back to the host within a step (.item(), printing a tensor, a shape that depends "
                "on the data such as UKANLinear's exact table without table_groups), nor do first-time setup that "
                "the warm-up steps did not (a kernel module load, a library handle); the cause is chained below. A "
                "failed capture can leave torch's CUDA state (its random generator) unusable: restart the process "
                "after fixing it") from exc
        return self._replay()

    def _step(self) -> torch.Tensor:
        """What every call runs, and what the graph captures: the gradients set to None, forward and backward
        each micro-batch of the static batch, then the optimizer's step. Returns the sum of the micro-batches'
        (scaled) losses, detached.

        None, not zeros: the first backward then takes each gradient as ``.grad`` (later micro-batches add to
        it), where zeroed gradients cost a zeroing and one add kernel a parameter on every step (a KAT-Tiny
        step has 200 parameters). Captured, the backward allocates the gradients from the graph's pool, and
        every replay writes them at the same addresses, which the captured optimizer step reads."""
        self._optimizer.zero_grad(set_to_none=True)
        n = self.accumulation_steps
        micro_batches = zip(*(t.chunk(n) for t in self._batch)) if n > 1 else (self._batch,)
        total = None
        for x, *targets in micro_batches:
            # autocast's weight-cast cache is off: under a caller's autocast it would outlive the step, and a
            # capture would record no cast for a cached weight
            with torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None,
                                cache_enabled=False):
                loss = self._loss_fn(self._model(x), *targets)
            _check_loss(loss)
            if n > 1:
                loss = loss / n
            loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
        self._optimizer.step()
        return total

    def _check_batch(self, batch) -> None:
        if len(batch) != len(self._batch):
            raise TypeError(f"the step takes {len(self._batch)} tensor(s), as example_batch, got {len(batch)}")
        for i, (t, buffer) in enumerate(zip(batch, self._batch)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"batch[{i}] must be a torch.Tensor, got {type(t).__name__}")
            if t.shape != buffer.shape:
                raise ValueError(f"batch[{i}] must have shape {tuple(buffer.shape)} (example_batch[{i}]'s: the input "
                                 f"buffers are static), got {tuple(t.shape)}")
            if t.dtype != buffer.dtype:
                raise TypeError(f"batch[{i}] must have dtype {buffer.dtype} (example_batch[{i}]'s), got {t.dtype}")
            if t.device != buffer.device:
                raise ValueError(f"batch[{i}] must be on device {buffer.device} (example_batch[{i}]'s), got {t.device}")

    def _check_hyperparameters(self) -> None:
        """RuntimeError when a hyperparameter of the optimizer changed since the step was made: a CUDA graph
        replays the values it captured. Checked on every device, so that code run on the CPU fails there as it
        would on cuda."""
        groups = self._optimizer.param_groups
        if len(groups) != len(self._hyperparameters):
            raise RuntimeError(f"the optimizer has {len(groups)} param groups, {len(self._hyperparameters)} when the "
                               "step was made: make a new step after add_param_group")
        for i, (group, made) in enumerate(zip(groups, self._hyperparameters)):
            for key, value in made.items():
                if not _same_value(group.get(key), value):
                    raise RuntimeError(
                        f"optimizer.param_groups[{i}][{key!r}] changed from {value!r} to {group.get(key)!r} after the "
                        "step was made; a CUDA graph replays the value it captured. To schedule it, give it to the "
                        "optimizer as a tensor on the parameters' device (lr=torch.tensor(0.001, device=...), with "
                        "capturable=True): torch's LR schedulers update such a tensor in place")


def _check_loss(loss) -> None:
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"loss_fn must return a torch.Tensor, got {type(loss).__name__}")
    if loss.numel() != 1:
        raise ValueError(f"loss_fn must return a one-element tensor (the loss), got shape {tuple(loss.shape)}")


def _device_of(model: nn.Module, optimizer) -> torch.device:
    # the optimizer holds at least one parameter (torch refuses an empty list)
    devices = {p.device for p in model.parameters()}
    devices |= {p.device for group in optimizer.param_groups for p in group["params"]}
    if len(devices) > 1:
        raise ValueError(f"model and optimizer must keep their parameters on one device, "
                         f"got {sorted(map(str, devices))}")
    return devices.pop()


def graphed_training_step(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn, *example_batch: torch.Tensor,
                          accumulation_steps: int = 1, autocast_dtype: torch.dtype | None = None, warmup: int = 3):
    """A whole training step, replayed from one CUDA graph on cuda: returns ``step``, and ``step(*batch)``
    trains on ``batch`` and returns the loss.

    Each call copies ``batch`` into the step's input buffers (made like ``example_batch``: same shapes, dtypes
    and device; a batch that differs is refused by name) and runs::

        optimizer.zero_grad()  # .grad = None: the first backward's gradients become .grad, no add
        for x, *targets in the batch split in accumulation_steps micro-batches (along dim 0):
            with torch.autocast(device_type, dtype=autocast_dtype):  # when autocast_dtype is given
                loss = loss_fn(model(x), *targets)
            (loss / accumulation_steps).backward()
        optimizer.step()

    and returns the sum of the scaled micro-batch losses (the mean loss for a mean-reduced ``loss_fn``),
    detached. The first tensor of the batch is the model's input; the rest go to ``loss_fn`` after the model's
    output (``loss_fn(output)`` alone for a batch of one tensor). The gradients of the last step stay in the
    parameters' ``.grad`` until the next call zeroes them.

    On cuda, the first ``warmup`` calls run the step eagerly on a side stream (they are training steps on the
    batches given, and initialise what a capture cannot: the optimizer's state, the gradient tensors, the
    kernels' modules); the next call captures the step in a CUDA graph and every call from then on replays it.
    The returned loss is then the graph's own tensor, overwritten by the next call: read it (``.item()``) or
    ``.clone()`` it to keep it. On any other device every call runs the same step eagerly and ``step.graphed``
    is False, so the same training code runs on the CPU.

    Requirements of a captured step, checked where they can be:

    - The optimizer must replay correctly: one with a ``capturable`` option (Adam, AdamW, Adamax, NAdam, RAdam,
      RMSprop, Rprop, Adadelta, ASGD) made with ``capturable=True``, or SGD; Adagrad, Adafactor, LBFGS and
      SparseAdam are refused. ``capturable=True`` is for the GPU only (torch refuses it on the CPU): for code
      that runs on both, pass ``capturable=device.type == "cuda"``. An optimizer from elsewhere must do device
      work only in its step.
    - Hyperparameters are captured with the step. Changing a float one (``lr`` by a scheduler) afterwards
      raises RuntimeError at the next call, on every device. For a learning-rate schedule give Adam & co. the
      rate as a tensor on the parameters' device, ``AdamW(params, lr=torch.tensor(1e-3, device=device),
      capturable=True)``: torch's LR schedulers (StepLR, LambdaLR, CosineAnnealingLR, ...) write the new rate
      into that tensor in place (``fill_``), and each replay reads it; call ``scheduler.step()`` between calls
      as usual. (On the CPU a tensor lr works too, so this code runs on both.)
      SGD reads a tensor ``lr`` back to the host unless ``fused=True``: give ``SGD(..., fused=True)`` for a
      schedule. Schedulers that replace a hyperparameter (OneCycleLR's momentum cycling rebuilds ``betas``)
      are refused by the same check.
    - The model, ``loss_fn`` and the optimizer must not read values back to the host within a step
      (``.item()``, data-dependent shapes: :class:`~warpkan.torch_bridge.UKANLinear` needs a fixed
      ``table_groups``). A failing capture raises RuntimeError saying so.
    - fp16 autocast is refused: it needs loss scaling (``GradScaler``), whose inf check reads back to the host.
      bf16 needs none. The model may be compiled (``torch.compile``'s default mode), but not with
      ``mode="reduce-overhead"``, which records CUDA graphs of its own.

    A step that does more (gradient clipping, an average of the weights, derivatives of the model by
    ``create_graph=True``) is a function to write and capture with :func:`capture_step`.

    Args:
        model: the module trained (an ``nn.Module``; its parameters on one device).
        optimizer: a ``torch.optim.Optimizer`` over the model's parameters.
        loss_fn: ``loss_fn(output, *targets) -> loss``, a one-element tensor (``F.cross_entropy``, ...).
        example_batch: one batch, ``(x, *targets)``: it fixes the shapes, dtypes and device of every batch (it is
            copied; it is not trained on).
        accumulation_steps: micro-batches per step (a positive int dividing the batch size, dim 0 of every batch
            tensor): each micro-batch's loss is scaled by ``1 / accumulation_steps`` and the gradients
            accumulate before the one optimizer step.
        autocast_dtype: None (the model's dtype) or ``torch.bfloat16`` (forward and loss under
            ``torch.autocast``; the backward outside it, as torch advises).
        warmup: eager calls before the capture on cuda (a positive int); unused on other devices.

    Returns:
        ``step``, callable as ``step(*batch) -> loss``, with the attributes ``graphed`` (whether calls replay a
        CUDA graph once warmed up), ``device``, ``accumulation_steps``, ``autocast_dtype`` and ``warmup``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
    if not example_batch:
        raise ValueError("example_batch must hold at least the model's input, got no tensors")
    for i, t in enumerate(example_batch):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"example_batch[{i}] must be a torch.Tensor, got {type(t).__name__}")
    from .. import _checks

    accumulation_steps = _checks.positive_int("accumulation_steps", accumulation_steps)
    warmup = _checks.positive_int("warmup", warmup)
    if accumulation_steps > 1:
        for i, t in enumerate(example_batch):
            if t.dim() == 0:
                raise ValueError(f"example_batch[{i}] must have a batch dimension to be split in micro-batches "
                                 f"(accumulation_steps={accumulation_steps}), got a 0-dimensional tensor")
            if t.shape[0] != example_batch[0].shape[0]:
                raise ValueError(f"example_batch[{i}] must have the batch size {example_batch[0].shape[0]} "
                                 f"(example_batch[0]'s) as its first dimension to be split in micro-batches, "
                                 f"got shape {tuple(t.shape)}")
        _checks.divides("accumulation_steps", accumulation_steps, "the batch size", example_batch[0].shape[0])
    if autocast_dtype is not None and autocast_dtype != torch.bfloat16:
        if autocast_dtype == torch.float16:
            raise ValueError("autocast_dtype=torch.float16 needs loss scaling (GradScaler), whose inf check reads back "
                             "to the host in every step and cannot be captured: use torch.bfloat16")
        raise ValueError(f"autocast_dtype must be None or torch.bfloat16, got {autocast_dtype!r}")
    return _GraphedTrainingStep(model, optimizer, loss_fn, example_batch, accumulation_steps, autocast_dtype, warmup)
