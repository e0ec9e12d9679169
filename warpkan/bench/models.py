"""Whole models, trained: ``warpkan bench models``. The reference models of :mod:`warpkan.models` against
their twins, in one run, on synthetic inputs of the right shapes (no downloads):

| model | warpkan | twins |
|---|---|---|
| KAT-Tiny (ViT-Tiny shape, 224², B=128) | ``GRKANLinear`` FFN (``KATMLP``) | the same ViT with a GELU MLP; the same KAT with FlashKAT's Triton rational (``WARPKAN_KAT_PATH``) |
| KAN-Mixer (UKAN paper's CIFAR Mixer, 32², B=128) | ``KANLinear`` (G=5, k=3) / ``UKANLinear`` token mixing | MLP token mixing; efficient-kan's formula |
| Speech Commands net (PolyKAN, 40-256-256-12, degree 8, B=128) | ``PolyKANLinear`` Fourier / Chebyshev, LUT / exact | the torch cos/sin+einsum (Fourier) and acos/cos (Chebyshev, ChebyKAN's) forms |
| MNIST 784-32-10 (B=128) | ``KANLinear`` / ``UKANLinear`` | efficient-kan's formula; an MLP |

Each model trains in fp32 and in bf16 autocast, in five modes (:data:`MODES`). A step is what a training
loop runs: forward, cross-entropy loss, backward, ``AdamW.step()`` (torch's fused AdamW, :data:`OPTIMIZER`),
``zero_grad``; the columns are its median time (CUDA events around each of ``repeat`` back-to-back steps after
warm-up, :func:`warpkan.bench.timing.time_fn`; the median of ``rounds`` such timings, with their spread), the
samples/s it gives, the first step's wall time (compilation included) and, on cuda, the peak memory a step
allocates above the model and optimiser state (:func:`warpkan.bench.timing.peak_memory`; in the CUDA-graph
modes, that of the call that records the graphs: the memory their pool keeps). The modes:

- ``eager``;
- ``compile``: the blocks of the ViT and the Mixer compiled one by one (one block's graph compiled and reused
  by the others, as :mod:`warpkan.models` advises), the small networks whole; ``--quick`` compiles with the
  ``aot_eager`` backend (Dynamo and AOTAutograd trace the graph, nothing is generated), the full run with
  inductor;
- ``reduce-overhead``: ``torch.compile(model, mode="reduce-overhead")`` of the whole model (inductor, its
  forward and backward recorded in CUDA graphs; the loss, the optimizer and the backward's glue run from the
  host); the ``graphs``, ``graph breaks`` and ``cudagraph skips`` columns say it compiled to one graph that
  CUDA graphs took;
- ``graphed``: the whole step (forward, loss, backward, a ``capturable`` AdamW's step) replayed from one CUDA
  graph by :func:`warpkan.torch_bridge.graphed_training_step`, the batch copied into its input buffers on
  each call; the first step is its first eager warm-up step;
- ``compiled graphed``: the model compiled as in ``compile``, then its whole step graphed as in ``graphed``: the
  graph replays inductor's fused kernels for the torch ops around the layers (the first warm-up step compiles).

The last three are cuda only: on another device their rows say so and hold no figures. Before the first
measured step, every warpkan model runs one untimed step in fp32 and one in bf16 so that the Warp kernels it
launches are built (once per machine, cached on disk) and loaded: that time is its own row, and the
first-step columns are what each later process pays.

For each (model, implementation) the fastest of its rows (over both precisions and every mode) is marked,
and the issue's targets (bf16 autocast, in one mode or the best mode of each) are rows at the end. An eager
target's two configurations are then timed again in alternating rounds in one process, and the target is
judged by the median of the rounds' ratios (``paired``): an eager step is mostly the host's time, which drifts
by more than a target's margin between rows timed minutes apart. For each
target missed, both configurations it compares are profiled (torch.profiler, one step): the GPU kernels that
take the time, and the share of the step the GPU was busy at all (the rest is the host's: Python, autograd,
launches). The twins that compute
the same function as a warpkan model (FlashKAT's rational, efficient-kan's formula, the torch polynomial
forms) load their parameters into the warpkan model once, and the largest difference of the fp32 logits,
relative to the largest logit, is in the ``Δ logits`` column: the comparison is of one function, not of two
models.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch._dynamo
import torch._functorch.config
from torch import nn
from torch.nn import functional as F

from . import register
from .poly import _TorchPolyLayer
from .rational import _triton_peers
from .timing import peak_memory, time_fn

# rounds: the step is timed that many times (``repeat`` steps each) and the median round kept; on the GPU
# machine an eager KAT-Tiny step's round moved by up to 60% within one process (26.6 to 43.3 ms), so one round
# can decide a 1.15x target by noise alone, and the spread column shows how far the rounds lay apart
# paired_rounds: an eager target's two configurations are timed again in that many alternating rounds in one
# process, and the target judged by the median of the rounds' ratios: eager steps are the host's time, which
# drifts by tens of percent between processes and within one (the same code's KAT-Tiny step measured 1.03x
# and 1.39x the GELU ViT's in two processes), so rows timed minutes apart do not settle a 1.15x bound
FULL = dict(repeat=20, warmup=3, rounds=3, backend="inductor", paired_rounds=7)
QUICK = dict(repeat=2, warmup=0, rounds=1, backend="aot_eager", paired_rounds=2)
PRECISIONS = ("fp32", "bf16 autocast")
MODES = ("eager", "compile", "reduce-overhead", "graphed", "compiled graphed")
CUDA_GRAPH_MODES = ("reduce-overhead", "graphed", "compiled graphed")  # measured on cuda only
COMPILED_MODES = ("compile", "reduce-overhead", "compiled graphed")  # their rows count Dynamo's graphs

# the targets, on the bf16 autocast rows, in one mode or the best mode of each implementation (mode
# None): (model, warpkan impl, other impl, mode, bound, sense). sense "speedup": other's step time over
# warpkan's must be >= bound; "slowdown": warpkan's step time over the other's must be <= bound. An impl
# names every implementation it prefixes ("warpkan fourier": the LUT and the exact one), the fastest counts.
TARGETS = [
    ("KAT-Tiny", "warpkan GRKANLinear (KAT)", "FlashKAT Triton rational", "eager", 1.3, "speedup"),
    ("KAT-Tiny", "warpkan GRKANLinear (KAT)", "GELU MLP (ViT)", "eager", 1.15, "slowdown"),
    ("MNIST 784-32-10", "warpkan KANLinear", "efficient-kan formula", "eager", 3.0, "speedup"),
    ("KAT-Tiny", "warpkan GRKANLinear (KAT)", "FlashKAT Triton rational", None, 1.5, "speedup"),
    ("KAT-Tiny", "warpkan GRKANLinear (KAT)", "GELU MLP (ViT)", None, 1.05, "slowdown"),
    ("KAN-Mixer", "warpkan KANLinear", "efficient-kan formula", None, 2.0, "speedup"),
    ("KAN-Mixer", "warpkan KANLinear", "MLP token mixing", None, 2.0, "slowdown"),
    ("Speech Commands net", "warpkan fourier", "torch cos/sin+einsum (fourier)", None, 1.4, "speedup"),
    ("Speech Commands net", "warpkan chebyshev", "torch acos/cos (chebyshev)", None, 1.4, "speedup"),
    ("MNIST 784-32-10", "warpkan KANLinear", "MLP", "reduce-overhead", 1.1, "slowdown"),
    ("Speech Commands net", "warpkan fourier", "torch cos/sin+einsum (fourier)", "reduce-overhead", 1.1,
     "slowdown"),
    ("Speech Commands net", "warpkan chebyshev", "torch acos/cos (chebyshev)", "reduce-overhead", 1.1,
     "slowdown"),
    ("KAN-Mixer", "warpkan UKANLinear", "warpkan KANLinear", "graphed", 1.5, "slowdown"),
    ("MNIST 784-32-10", "warpkan UKANLinear", "warpkan KANLinear", "graphed", 1.5, "slowdown"),
]


class _PeerRational(nn.Module):
    """A :class:`~warpkan.torch_bridge.GroupRational`'s parameters (same names, so state dicts match) run
    through a peer's kernel ``fn(x, weight_numerator, weight_denominator, num_groups)``."""

    def __init__(self, rational, fn):
        super().__init__()
        self.weight_numerator = rational.weight_numerator
        self.weight_denominator = rational.weight_denominator
        self.num_groups = rational.num_groups
        self.fn = fn

    def forward(self, x):
        return self.fn(x, self.weight_numerator, self.weight_denominator, self.num_groups)


def _with_peer_rationals(model: nn.Module, fn) -> nn.Module:
    from ..torch_bridge import GroupRational

    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if isinstance(child, GroupRational)]
    for parent, name, child in swaps:
        setattr(parent, name, _PeerRational(child, fn))
    return model


class _TorchPolyNet(nn.Module):
    """The torch forms' twin of :class:`warpkan.models.PolyKANNet`: the polynomial benchmark's torch layers
    through ``widths``. Its forward is this module's code, so that a whole-model compile traces one graph
    (compiling a bare ``nn.Sequential`` makes Dynamo compile each layer's frame on its own)."""

    def __init__(self, widths, degree, form):
        super().__init__()
        self.layers = nn.Sequential(*[_TorchPolyLayer(a, b, degree, form) for a, b in zip(widths[:-1], widths[1:])])

    def forward(self, x):
        return self.layers(x)


def flashkat_unavailable(device: str) -> str | None:
    """Why FlashKAT's rational cannot run here, or None when it can."""
    path = os.environ.get("WARPKAN_KAT_PATH")
    if not path:
        return "not run: WARPKAN_KAT_PATH unset"
    if not device.startswith("cuda"):
        return "not run: FlashKAT's kernels are Triton (cuda only)"
    if "FlashKAT Triton" not in _triton_peers():
        return f"not run: rational_kat.kernels.flash_rational_triton did not import from WARPKAN_KAT_PATH={path}"
    return None


class _Case:
    """One model: its implementations (name -> builder), the batch, the input shape (without the batch) and
    the number of classes.
    ``same_function`` maps a twin that computes the warpkan model's function to a builder of that warpkan
    model (the twin's state dict is loaded into it)."""

    def __init__(self, name, batch, shape, classes, impls, same_function=None, unavailable=None, pixels=False):
        self.name, self.batch, self.shape, self.classes = name, batch, shape, classes
        self.impls, self.same_function, self.unavailable = impls, same_function or {}, unavailable or {}
        self.pixels = pixels

    def inputs(self, device):
        """(x, labels): x ~ N(0, 1), or uniform in [0, 1] for ``pixels``; labels uniform over the classes."""
        generator = torch.Generator(device="cpu").manual_seed(0)
        if self.pixels:
            x = torch.rand((self.batch, *self.shape), generator=generator)
        else:
            x = torch.randn((self.batch, *self.shape), generator=generator)
        labels = torch.randint(0, self.classes, (self.batch,), generator=generator)
        return x.to(device), labels.to(device)


def _cases(device: str, quick: bool) -> list[_Case]:
    from ..models import FeedForward, MLPMixer, PolyKANNet, VisionTransformer

    vit = dict(image_size=32, patch_size=8, dim=32, depth=2, heads=2, num_classes=10) if quick else {}
    mixer = dict(image_size=16, patch_size=4, dim=32, depth=2) if quick else {}
    speech_widths, degree = ((40, 32, 12) if quick else (40, 256, 256, 12)), 8
    batch = 2 if quick else 128
    small_batch = 16 if quick else 128
    image, classes = vit.get("image_size", 224), vit.get("num_classes", 1000)
    mixer_image = mixer.get("image_size", 32)

    flash_note = flashkat_unavailable(device)
    kat = _Case(
        "KAT-Tiny", batch, (3, image, image), classes,
        {"warpkan GRKANLinear (KAT)": lambda: VisionTransformer(ffn="grkan", **vit),
         "GELU MLP (ViT)": lambda: VisionTransformer(ffn="gelu", **vit),
         "FlashKAT Triton rational": lambda: _with_peer_rationals(VisionTransformer(ffn="grkan", **vit),
                                                                  _triton_peers()["FlashKAT Triton"])},
        same_function={"FlashKAT Triton rational": lambda: VisionTransformer(ffn="grkan", **vit)},
        unavailable={"FlashKAT Triton rational": flash_note} if flash_note else {},
    )
    kan_mixer = _Case(
        "KAN-Mixer", batch, (3, mixer_image, mixer_image), 10,
        {"warpkan KANLinear": lambda: MLPMixer(token_mixing="kan", **mixer),
         "warpkan UKANLinear": lambda: MLPMixer(token_mixing="ukan", **mixer),
         "efficient-kan formula": lambda: MLPMixer(token_mixing="efficient-kan", **mixer),
         "MLP token mixing": lambda: MLPMixer(token_mixing="mlp", **mixer)},
        same_function={"efficient-kan formula": lambda: MLPMixer(token_mixing="kan", **mixer)},
    )

    def torch_poly(form):
        return lambda: _TorchPolyNet(speech_widths, degree, form)

    speech = _Case(
        "Speech Commands net", small_batch, (speech_widths[0],), speech_widths[-1],
        {f"warpkan {basis} {mode}": (lambda basis=basis, mode=mode: PolyKANNet(speech_widths, degree, basis, mode))
         for basis in ("fourier", "chebyshev") for mode in ("lut", "exact")}
        | {"torch cos/sin+einsum (fourier)": torch_poly("fourier"), "torch acos/cos (chebyshev)": torch_poly("acos")},
        same_function={"torch cos/sin+einsum (fourier)": lambda: PolyKANNet(speech_widths, degree, "fourier", "exact"),
                       "torch acos/cos (chebyshev)": lambda: PolyKANNet(speech_widths, degree, "chebyshev", "exact")},
    )
    mnist = _Case(
        "MNIST 784-32-10", small_batch, (784,), 10,
        {"warpkan KANLinear": lambda: FeedForward((784, 32, 10), "kan"),
         "warpkan UKANLinear": lambda: FeedForward((784, 32, 10), "ukan"),
         "efficient-kan formula": lambda: FeedForward((784, 32, 10), "efficient-kan"),
         "MLP": lambda: FeedForward((784, 32, 10), "mlp")},
        same_function={"efficient-kan formula": lambda: FeedForward((784, 32, 10), "kan")}, pixels=True,
    )
    return [kat, kan_mixer, speech, mnist]


def _load_into(model: nn.Module, twin: nn.Module) -> nn.Module:
    """``twin``'s parameters in the warpkan ``model`` (the torch polynomial forms name theirs
    ``cheby_coeffs``, in PolyKANLinear's public [in, out, D + 1] layout; the others share the names)."""
    if isinstance(twin, _TorchPolyNet):
        with torch.no_grad():
            for layer, peer in zip(model.layers, twin.layers):
                layer.coeffs.copy_(peer.cheby_coeffs)
    else:
        model.load_state_dict(twin.state_dict())
    return model


def _logits_difference(case: _Case, impl: str, device: str) -> float:
    """max |twin logits - warpkan logits| / max |warpkan logits|, fp32, eager, the twin's parameters in both."""
    torch.manual_seed(0)
    twin = case.impls[impl]().to(device)
    warp_model = _load_into(case.same_function[impl]().to(device), twin)
    x, _ = case.inputs(device)
    with torch.no_grad():
        ours, theirs = warp_model(x), twin(x)
    return ((theirs - ours).abs().max() / ours.abs().max()).item()


def _compile(model: nn.Module, backend: str) -> None:
    """In place: each block of a model with ``.blocks`` (one graph, reused), else the whole model."""
    for module in getattr(model, "blocks", None) or [model]:
        module.compile(backend=backend)


def _synchronize(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _training_step(model, optimizer, x, labels, device, precision):
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision != "fp32")

    def step():
        with autocast:
            loss = F.cross_entropy(model(x), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


# The optimizer of every implementation's step: torch's fused AdamW updates every parameter in one kernel (two
# launches a step, with the step counts), where the default foreach form launches about 16 multi-tensor kernels.
# Those took 35-45% of the small networks' graphed steps (MNIST, Speech Commands) on the H200, for every
# implementation alike. ``{"foreach": True}`` gives torch's default form back (``scripts/bench_models_subset.py
# --foreach``).
OPTIMIZER = {"fused": True}


def _optimizer(model: nn.Module, device: str, graphed: bool = False) -> torch.optim.Optimizer:
    """The step's AdamW (:data:`OPTIMIZER`); ``graphed``: capturable, for a step replayed from a CUDA graph
    (on the GPU only: torch refuses it on the CPU, where such a step runs eagerly)."""
    return torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=graphed and device.startswith("cuda"),
                             **OPTIMIZER)


def _prepared_step(case: _Case, impl: str, precision: str, mode: str, device: str, settings: dict):
    """(model, step, warm-up calls): the implementation built from seed 0 and prepared for ``mode``, with its
    AdamW and the batch, Dynamo's caches and counters cleared first so nothing carries over from another
    configuration. The warm-up calls come before the call that records the CUDA graphs: in "graphed", the
    step's eager warm-up steps; otherwise one (the first call compiles, and reduce-overhead records on the
    second)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    model = case.impls[impl]().to(device)
    x, labels = case.inputs(device)
    if mode in ("graphed", "compiled graphed"):
        from ..torch_bridge import graphed_training_step

        if mode == "compiled graphed":  # compiled as in "compile"; the eager warm-up steps compile it
            _compile(model, settings["backend"])
        optimizer = _optimizer(model, device, graphed=True)
        graphed = graphed_training_step(model, optimizer, F.cross_entropy, x, labels,
                                        autocast_dtype=None if precision == "fp32" else torch.bfloat16)
        return model, lambda: graphed(x, labels), graphed.warmup
    if mode == "compile":
        _compile(model, settings["backend"])
    elif mode == "reduce-overhead":
        model.compile(mode="reduce-overhead")  # whole: one graph, recorded once
    optimizer = _optimizer(model, device)
    return model, _training_step(model, optimizer, x, labels, device, precision), 1


# compiled models may donate their saved activations to the backward (torch's default); the rational family
# turns that off globally for its retain_graph replays, which no training step does
_DONATED_BUFFERS = dict(donated_buffer=True)


def _measure(case: _Case, impl: str, precision: str, mode: str, device: str, settings: dict) -> dict:
    row = {"model": case.name, "impl": impl, "precision": precision, "mode": mode, "batch": case.batch}
    model, step, warm_calls = _prepared_step(case, impl, precision, mode, device, settings)
    row["params_M"] = sum(p.numel() for p in model.parameters()) / 1e6
    with torch._functorch.config.patch(**_DONATED_BUFFERS):
        _synchronize(device)
        start = time.perf_counter()
        step()
        _synchronize(device)
        row["first_step_s"] = time.perf_counter() - start
        for _ in range(warm_calls - 1):
            step()
        peak = peak_memory(step, device)  # the call after the warm-up: it records the CUDA graphs, if any
        rounds = [time_fn(step, device, warmup=settings["warmup"] if r == 0 else 0, repeat=settings["repeat"])
                  for r in range(settings["rounds"])]
    ms = statistics.median(rounds)
    row["step_ms"] = ms
    row["spread %"] = 100 * (max(rounds) - min(rounds)) / ms
    row["samples/s"] = case.batch / (ms * 1e-3)
    if peak is not None:
        row["peak_MiB"] = peak
    if mode in COMPILED_MODES:
        counters = torch._dynamo.utils.counters
        row["graphs"] = counters["stats"]["unique_graphs"]
        row["graph breaks"] = sum(counters["graph_break"].values())
        if mode == "reduce-overhead":
            row["cudagraph skips"] = counters["inductor"]["cudagraph_skips"]
    return row


def _short_name(name: str) -> str:
    """A kernel's name without its return type, template arguments, signature, namespaces and Warp's closure
    prefixes (``make_kernels__locals__``), at most 48 characters; op names (``aten::mm``) as they are."""
    if name.startswith(("aten::", "warpkan::")):
        return name[:48]
    short = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    for stop in "<(":
        short = short.split(stop, 1)[0]
    short = short.rsplit("::", 1)[-1].rsplit("__locals__", 1)[-1].strip()
    return (short or name)[:48]


def _profiled_step_times(case: _Case, impl: str, precision: str, mode: str, device: str,
                        settings: dict) -> dict[str, tuple[int, float]]:
    """{name: (calls, us)} of one training step of a configuration, by torch.profiler after its warm-up: on cuda
    the GPU kernels, on the CPU the ops' self times, grouped by :func:`_short_name`."""
    _, step, warm_calls = _prepared_step(case, impl, precision, mode, device, settings)
    cuda = device.startswith("cuda")
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch._functorch.config.patch(**_DONATED_BUFFERS):
        for _ in range(max(3, warm_calls + 1)):  # compiled, autotuned, allocated, recorded
            step()
        _synchronize(device)
        with torch.profiler.profile(activities=activities) as prof:
            step()
            _synchronize(device)
    times: dict[str, tuple[int, float]] = {}
    events = prof.key_averages()
    # a record_function range (the optimizer's step, a compiled region) is on the GPU timeline too, spanning
    # the kernels it launched: only kernels count
    host_ranges = {e.key for e in events if e.device_type == torch.autograd.DeviceType.CPU}
    for event in events:
        if cuda and event.device_type == torch.autograd.DeviceType.CUDA:
            if event.key in host_ranges or getattr(event, "is_user_annotation", False):
                continue
            key, us = _short_name(event.key), event.self_device_time_total
        elif not cuda and event.device_type == torch.autograd.DeviceType.CPU:
            key, us = _short_name(event.key), event.self_cpu_time_total
        else:
            continue
        count, total = times.get(key, (0, 0.0))
        times[key] = (count + event.count, total + us)
    return times


def _profile(case: _Case, measured: dict, device: str, settings: dict) -> dict:
    """Where one training step of a measured configuration spends its time, by torch.profiler: on cuda the
    GPU kernels (grouped by name, the top ones with their share) and how much of the step time the GPU was
    busy (a step far from 100% is bound by the host: Python, autograd, launches); on the CPU the ops' self
    times."""
    impl, precision, mode = measured["impl"], measured["precision"], measured["mode"]
    row = {"model": case.name, "impl": f"profile: {impl}", "precision": precision, "mode": mode}
    times = {key: us for key, (_, us) in _profiled_step_times(case, impl, precision, mode, device, settings).items()}
    cuda = device.startswith("cuda")
    total_ms = sum(times.values()) / 1e3
    top = sorted(times.items(), key=lambda item: -item[1])[:6]
    if cuda:
        row["GPU kernels ms"] = total_ms
        row["GPU busy %"] = 100 * total_ms / measured["step_ms"]
    row["where the time goes"] = "; ".join(f"{name} {us / 1e3:.3g} ms ({100 * us / 1e3 / total_ms:.0f}%)"
                                           for name, us in top)
    return row


def _warp_build(cases: list[_Case], device: str) -> dict:
    """One untimed fp32 and one bf16 eager step of every warpkan model at its bench shape: the Warp kernels
    those steps launch are built (or loaded from the kernel cache)."""
    start = time.perf_counter()
    for case in cases:
        for impl, build in case.impls.items():
            if not impl.startswith("warpkan"):
                continue
            torch.manual_seed(0)
            model = build().to(device)
            optimizer = _optimizer(model, device)
            x, labels = case.inputs(device)
            for precision in PRECISIONS:
                _training_step(model, optimizer, x, labels, device, precision)()
            _synchronize(device)
    return {"model": "all", "impl": "Warp kernels of every warpkan model built or loaded (once per machine)",
            "first_step_s": time.perf_counter() - start}


def _first_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"


def _progress(row: dict) -> str:
    """One line per configuration as it finishes (a full run takes minutes)."""
    what = f"{row['model']} | {row['impl']} | {row['precision']} {row['mode']}"
    if "step_ms" in row:
        return f"{what}: {row['step_ms']:.3g} ms a step, first step {row['first_step_s']:.3g} s"
    return f"{what}: {row['note']}"


def _mark_fastest(rows: list[dict]) -> None:
    """``fastest`` on the fastest measured row of each (model, impl), over every precision and mode."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        if "step_ms" in row:
            groups.setdefault((row["model"], row["impl"]), []).append(row)
    for group in groups.values():
        best = min(group, key=lambda r: r["step_ms"])
        best["fastest"] = "yes"


def _best(rows, model, impl_prefix, mode):
    """The fastest bf16 autocast row of ``model`` whose impl starts with ``impl_prefix`` (in ``mode``, or any)."""
    found = [r for r in rows if r["model"] == model and r["impl"].startswith(impl_prefix) and "step_ms" in r
             and r["precision"] == "bf16 autocast" and (mode is None or r["mode"] == mode)]
    return min(found, key=lambda r: r["step_ms"]) if found else None


def _target_ratio(ours_ms: float, theirs_ms: float, sense: str) -> float:
    """The ratio a target of ``sense`` (see :data:`TARGETS`) bounds: theirs over ours for a "speedup", ours
    over theirs for a "slowdown"."""
    return theirs_ms / ours_ms if sense == "speedup" else ours_ms / theirs_ms


def _met(ratio: float, bound: float, sense: str) -> str:
    return "yes" if (ratio >= bound if sense == "speedup" else ratio <= bound) else "no"


def _targets(rows: list[dict]) -> list[tuple[dict, list[dict]]]:
    """(target row, the measured rows it compares) for each of :data:`TARGETS`."""
    out = []
    for model, ours, theirs, mode, bound, sense in TARGETS:
        which = f"{mode}, bf16 autocast" if mode else "bf16 autocast, best mode of each"
        if sense == "speedup":
            target = f"{ours} >= {bound}x the throughput of {theirs} ({which})"
        else:
            target = f"{ours} step time <= {bound}x that of {theirs} ({which})"
        a, b = _best(rows, model, ours, mode), _best(rows, model, theirs, mode)
        row = {"model": model, "impl": "target", "target": target}
        if a is None or b is None:
            row["met"] = "not measured"
        else:
            ratio = _target_ratio(a["step_ms"], b["step_ms"], sense)
            row["measured"] = (f"{ratio:.2f}x: {a['impl']} {a['mode']} {a['step_ms']:.3g} ms, "
                               f"{b['impl']} {b['mode']} {b['step_ms']:.3g} ms")
            row["met"] = _met(ratio, bound, sense)
        out.append((row, [r for r in (a, b) if r is not None]))
    return out


LEGEND = {
    "first_step_s": "wall time of the first training step (compilation included); the all-models row: building "
                    "or loading every warpkan Warp kernel",
    "precision": "fp32, or the step under bf16 autocast",
    "mode": "eager, or torch.compile'd (see the module docstring)",
    "batch": "samples per step",
    "params_M": "trainable parameters, millions",
    "step_ms": "one training step (forward, loss, backward, AdamW step, zero_grad), median ms of the median "
               "round (each round: repeat back-to-back steps)",
    "spread %": "how far the rounds' medians lay apart: (slowest - fastest) / step_ms",
    "samples/s": "batch / step_ms",
    "graphs": "the graphs torch.compile made",
    "graph breaks": "torch.compile's graph breaks",
    "fastest": "the fastest of the model and implementation's rows (both precisions, every mode)",
    "Δ logits": "largest difference of the fp32 logits from the warpkan model's with the same parameters, "
                "relative to its largest logit",
    "target": "the aim a target row checks (bf16 autocast)",
    "measured": "the ratio of step times the target compares, and the two rows",
    "paired": "eager targets: the ratio again, as the median over alternating rounds of the two configurations "
              "in one process, and the rounds' range",
    "met": "whether the target was met (an eager target: by its paired median)",
    "GPU kernels ms": "profiled step: time in GPU kernels",
    "GPU busy %": "profiled step: GPU kernels ms as a share of step_ms (the rest is the host's)",
    "where the time goes": "profiled step: the kernels or ops that take the time",
}


@register("models", LEGEND)
def run(device: str = "cuda", quick: bool = False) -> list[dict]:
    settings = QUICK if quick else FULL
    cases = _cases(device, quick)
    rows = [_warp_build(cases, device)]
    for case in cases:
        differences = {}
        for impl in case.impls:
            note = case.unavailable.get(impl)
            if note:
                rows.append({"model": case.name, "impl": impl, "note": note})
                continue
            if impl in case.same_function:
                differences[impl] = _logits_difference(case, impl, device)
            for precision in PRECISIONS:
                for mode in MODES:
                    if mode in CUDA_GRAPH_MODES and not device.startswith("cuda"):
                        rows.append({"model": case.name, "impl": impl, "precision": precision, "mode": mode,
                                     "note": f"not applicable on {device}: CUDA graphs replay GPU work only"})
                        print(_progress(rows[-1]), flush=True)
                        continue
                    try:
                        row = _measure(case, impl, precision, mode, device, settings)
                    except torch.OutOfMemoryError:
                        row = {"model": case.name, "impl": impl, "precision": precision, "mode": mode,
                               "note": "out of memory"}
                    except Exception as exc:  # noqa: BLE001 - a failure in one mode is a row, not the end of the run
                        row = {"model": case.name, "impl": impl, "precision": precision, "mode": mode,
                               "note": f"failed: {_first_line(exc)}"}
                    if impl in differences:
                        row["Δ logits"] = differences[impl]
                    rows.append(row)
                    print(_progress(row), flush=True)
                    if device.startswith("cuda"):
                        torch.cuda.empty_cache()
    _mark_fastest(rows)
    if not device.startswith("cuda"):
        return rows  # the targets are GPU figures: a CPU table holds what was measured, nothing compared with them
    return rows + target_rows_and_profiles(rows, cases, device, settings)


def _paired_eager_ratios(case: _Case, ours: str, theirs: str, precision: str, sense: str, device: str,
                         settings: dict) -> list[float]:
    """The target's ratio (see :data:`TARGETS`) of two eager configurations of ``case``, one a round over
    ``settings["paired_rounds"]`` rounds that time ``ours`` and ``theirs`` one after the other (``repeat``
    steps each, after their warm-up): both sides of each ratio see the same state of the host."""
    steps = []
    for impl in (ours, theirs):
        _, step, warm_calls = _prepared_step(case, impl, precision, "eager", device, settings)
        for _ in range(warm_calls + settings["warmup"]):
            step()
        steps.append(step)
    ratios = []
    with torch._functorch.config.patch(**_DONATED_BUFFERS):
        for _ in range(settings["paired_rounds"]):
            mine, other = (time_fn(step, device, warmup=0, repeat=settings["repeat"]) for step in steps)
            ratios.append(_target_ratio(mine, other, sense))
    return ratios


def _judge_eager_targets_in_pairs(targets, cases, device: str, settings: dict) -> None:
    """Each measured eager target row gains ``paired`` (the median ratio of alternating rounds and their range,
    :func:`_paired_eager_ratios`) and is judged by that median."""
    by_name = {case.name: case for case in cases}
    for (row, compared), (model, _ours, _theirs, mode, bound, sense) in zip(targets, TARGETS):
        if mode != "eager" or len(compared) != 2:
            continue
        mine, other = compared
        try:
            ratios = _paired_eager_ratios(by_name[model], mine["impl"], other["impl"], mine["precision"], sense,
                                          device, settings)
        except Exception as exc:  # noqa: BLE001 - the target keeps its judgement from the rows
            row["paired"] = f"failed: {_first_line(exc)}"
            continue
        median = statistics.median(ratios)
        row["paired"] = (f"{median:.2f}x, median of {len(ratios)} alternating rounds "
                         f"({min(ratios):.2f}-{max(ratios):.2f}x)")
        row["met"] = _met(median, bound, sense)


def target_rows_and_profiles(rows: list[dict], cases, device: str, settings) -> list[dict]:
    """The target rows of the measured ``rows`` (the eager ones judged on alternating rounds) and a profile of
    each configuration a missed target compares."""
    targets = _targets(rows)
    _judge_eager_targets_in_pairs(targets, cases, device, settings)
    return [row for row, _ in targets] + _missed_target_profiles(cases, targets, device, settings)


def _missed_target_profiles(cases, targets, device, settings) -> list[dict]:
    """A profile of each configuration that a missed target compares (once each)."""
    by_name = {case.name: case for case in cases}
    profiled, out = set(), []
    for target, compared in targets:
        if target["met"] != "no":
            continue
        for measured in compared:
            key = (measured["model"], measured["impl"], measured["precision"], measured["mode"])
            if key in profiled:
                continue
            profiled.add(key)
            try:
                out.append(_profile(by_name[measured["model"]], measured, device, settings))
            except Exception as exc:  # noqa: BLE001 - the measured rows stand without it
                out.append({"model": measured["model"], "impl": f"profile: {measured['impl']}",
                            "precision": measured["precision"], "mode": measured["mode"],
                            "note": f"profile failed: {_first_line(exc)}"})
            print(f"{out[-1]['model']} | {out[-1]['impl']} | {measured['precision']} {measured['mode']}: profiled",
                  flush=True)
    return out
