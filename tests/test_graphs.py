"""Whole training steps in one CUDA graph (:func:`warpkan.torch_bridge.graphed_training_step`) and
``torch.compile(mode="reduce-overhead")`` of every warpkan layer and model.

On the CPU: the step's eager fallback trains every model of :mod:`warpkan.models` to exactly the parameters
of a hand-written loop (with and without micro-batch accumulation, with a learning-rate schedule), and every
refusal names what it refuses. On cuda (the tests with ``cuda`` in their names): the replayed step trains each
model as the eager loop does, within the eager loop's own run-to-run spread; every layer and model compiles
with ``mode="reduce-overhead"`` in one graph, CUDA graphs take it, it records once and replays from then on,
and its gradients are as accurate as eager's."""

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from torch.nn import functional as F  # noqa: E402

from warpkan import models  # noqa: E402
from warpkan.torch_bridge import (  # noqa: E402
    GEGLUFFN, ChebyKANLinear, GRKANLinear, GroupRational, KANLinear, KATMLP, PolyKANLinear, UKANLinear,
    graphed_training_step)

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="CUDA graphs need a CUDA device")

# the tiny shapes of tests/test_models.py
TINY_VIT = dict(image_size=16, patch_size=8, dim=16, depth=2, heads=2, num_classes=5)
TINY_MIXER = dict(image_size=8, patch_size=4, dim=16, depth=2, num_classes=5)

# every model of warpkan.models built of warpkan layers: (builder, input shape without the batch, classes)
MODELS = {
    "vit-grkan": (lambda: models.VisionTransformer(**TINY_VIT, ffn="grkan"), (3, 16, 16), 5),
    "mixer-kan": (lambda: models.MLPMixer(**TINY_MIXER, token_mixing="kan"), (3, 8, 8), 5),
    "mixer-ukan": (lambda: models.MLPMixer(**TINY_MIXER, token_mixing="ukan"), (3, 8, 8), 5),
    **{f"polykan-{basis}-{mode}": ((lambda basis=basis, mode=mode: models.PolyKANNet((10, 8, 4), 5, basis, mode)),
                                   (10,), 4)
       for basis in ("fourier", "chebyshev") for mode in ("lut", "exact")},
    "feedforward-kan": (lambda: models.FeedForward((12, 6, 3), "kan"), (12,), 3),
    "feedforward-ukan": (lambda: models.FeedForward((12, 6, 3), "ukan"), (12,), 3),
}

# every torch layer class of warpkan: (builder, input shape)
LAYERS = {
    "KANLinear": (lambda: KANLinear(6, 5), (32, 6)),
    "UKANLinear": (lambda: UKANLinear(6, 5, grid_delta=0.25, table_groups=16), (32, 6)),
    "PolyKANLinear": (lambda: PolyKANLinear(6, 5, 4, basis="fourier"), (32, 6)),
    "ChebyKANLinear": (lambda: ChebyKANLinear(6, 5, 4), (32, 6)),
    "GroupRational": (lambda: GroupRational(8, num_groups=2), (4, 5, 8)),
    "GRKANLinear": (lambda: GRKANLinear(8, 6, num_groups=2), (32, 8)),
    "KATMLP": (lambda: KATMLP(8, 16, 8, num_groups=2), (4, 5, 8)),
    "GEGLUFFN-streaming": (lambda: GEGLUFFN(8, 16), (4, 8)),  # at most small_batch_rows: the Warp kernels
    "GEGLUFFN-gemm": (lambda: GEGLUFFN(8, 16), (32, 8)),  # more rows: cuBLAS and the Warp gate
}

BATCH = 8


def _batches(name: str, count: int, device: str) -> list[tuple]:
    """``count`` batches (x, labels) of model ``name``, from a fixed seed."""
    _, shape, classes = MODELS[name]
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn((BATCH, *shape), generator=generator).to(device),
             torch.randint(0, classes, (BATCH,), generator=generator).to(device)) for _ in range(count)]


def _model(name: str, device: str):
    torch.manual_seed(0)
    return MODELS[name][0]().to(device)


def _sgd(model, lr=1e-2):
    """SGD with momentum (captures as it is): a parameter's change is proportional to its gradients, so a
    graphed loop's difference from an eager one measures theirs (Adam's normalised step turns a rounding in
    a near-zero gradient into a full step)."""
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def _optimizer(model, device: str, lr=1e-2):
    return torch.optim.AdamW(model.parameters(), lr=lr, capturable=device == "cuda")


def _hand_written(model, optimizer, batches, accumulation_steps=1, autocast_dtype=None, scheduler=None):
    """The loop a user writes: returns the losses (the sum of the scaled micro-batch losses)."""
    device_type = next(model.parameters()).device.type
    losses = []
    for x, labels in batches:
        optimizer.zero_grad()
        total = 0.0
        for xi, yi in zip(x.chunk(accumulation_steps), labels.chunk(accumulation_steps)):
            with torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                loss = F.cross_entropy(model(xi), yi) / accumulation_steps
            loss.backward()
            total = total + loss.detach()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(total)
    return torch.stack(losses)


def _graphed(model, optimizer, batches, accumulation_steps=1, autocast_dtype=None, scheduler=None):
    """The same training through graphed_training_step: (losses, the step)."""
    step = graphed_training_step(model, optimizer, F.cross_entropy, *batches[0],
                                 accumulation_steps=accumulation_steps, autocast_dtype=autocast_dtype)
    losses = []
    for batch in batches:
        losses.append(step(*batch).clone())
        if scheduler is not None:
            scheduler.step()
    return torch.stack(losses), step


def _parameters(model):
    return [p.detach().clone() for p in model.parameters()]


# ------------------------------------------------------------------ the eager fallback, on the CPU


@pytest.mark.parametrize("accumulation_steps", [1, 2])
@pytest.mark.parametrize("name", list(MODELS))
def test_cpu_step_trains_as_the_hand_written_loop(name, accumulation_steps):
    """On the CPU each call runs the step eagerly: the parameters and losses of three steps are bitwise those
    of the hand-written loop (the same ops in the same order), and the steps moved the parameters."""
    batches = _batches(name, 3, "cpu")
    ours, theirs = _model(name, "cpu"), _model(name, "cpu")
    start = _parameters(ours)
    losses, step = _graphed(ours, _optimizer(ours, "cpu"), batches, accumulation_steps)
    expected = _hand_written(theirs, _optimizer(theirs, "cpu"), batches, accumulation_steps)
    assert step.graphed is False and step.device == torch.device("cpu")
    assert torch.equal(losses, expected)
    for (pname, p), q, p0 in zip(ours.named_parameters(), theirs.parameters(), start):
        assert torch.equal(p, q), pname
    assert any(not torch.equal(p, p0) for p, p0 in zip(ours.parameters(), start))


def test_cpu_step_under_bf16_autocast_trains_as_the_hand_written_loop():
    batches = _batches("feedforward-kan", 3, "cpu")
    ours, theirs = _model("feedforward-kan", "cpu"), _model("feedforward-kan", "cpu")
    losses, _ = _graphed(ours, _optimizer(ours, "cpu"), batches, 2, torch.bfloat16)
    expected = _hand_written(theirs, _optimizer(theirs, "cpu"), batches, 2, torch.bfloat16)
    assert torch.equal(losses, expected)
    for p, q in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(p, q)


SCHEDULERS = {
    "StepLR": lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5),
    "LambdaLR": lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 0.8**epoch),
    "CosineAnnealingLR": lambda optimizer: torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=4),
}


@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
def test_cpu_step_follows_a_scheduled_tensor_learning_rate(scheduler):
    """AdamW with lr as a tensor: the scheduler writes each new rate into it, and the step reads it (on cuda,
    the replay reads it from the device)."""
    batches = _batches("feedforward-kan", 4, "cpu")
    runs = []
    for train in (_graphed, _hand_written):
        model = _model("feedforward-kan", "cpu")
        optimizer = torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.02))
        rate = optimizer.param_groups[0]["lr"]
        train(model, optimizer, batches, scheduler=SCHEDULERS[scheduler](optimizer))
        assert optimizer.param_groups[0]["lr"] is rate and rate.item() < 0.019  # updated in place
        runs.append(model)
    for p, q in zip(runs[0].parameters(), runs[1].parameters()):
        assert torch.equal(p, q)


def test_changed_float_hyperparameter_is_refused_on_every_device():
    """A float lr is captured with the step: a scheduler that changes it is refused at the next call (on the
    CPU as on cuda, so that the training code fails where it is written), before any work."""
    model = _model("feedforward-kan", "cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    x, labels = _batches("feedforward-kan", 1, "cpu")[0]
    step = graphed_training_step(model, optimizer, F.cross_entropy, x, labels)
    step(x, labels)
    scheduler.step()
    before = _parameters(model)
    with pytest.raises(RuntimeError, match=r"param_groups\[0\]\['lr'\] changed from 0.01 to 0.005.*as a tensor"):
        step(x, labels)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    with pytest.raises(RuntimeError, match="add_param_group"):
        step(x, labels)


def test_scheduler_that_replaces_a_hyperparameter_is_refused():
    """OneCycleLR cycles Adam's momentum by building a new betas tuple: refused, even with a tensor lr."""
    model = _model("feedforward-kan", "cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.01))
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=10)
    x, labels = _batches("feedforward-kan", 1, "cpu")[0]
    step = graphed_training_step(model, optimizer, F.cross_entropy, x, labels)
    step(x, labels)
    scheduler.step()
    with pytest.raises(RuntimeError, match=r"param_groups\[0\]\['betas'\] changed"):
        step(x, labels)


@pytest.fixture
def made():
    model = _model("feedforward-kan", "cpu")
    optimizer = _optimizer(model, "cpu")
    x, labels = _batches("feedforward-kan", 1, "cpu")[0]
    return model, optimizer, x, labels


@pytest.mark.parametrize("change, error, match", [
    (lambda a: dict(a, model=lambda x: x), TypeError, "model must be a torch.nn.Module"),
    (lambda a: dict(a, optimizer="adam"), TypeError, "optimizer must be a torch.optim.Optimizer"),
    (lambda a: dict(a, loss_fn=3), TypeError, "loss_fn must be callable"),
    (lambda a: dict(a, batch=()), ValueError, "example_batch must hold at least"),
    (lambda a: dict(a, batch=(a["batch"][0], [1, 2])), TypeError, r"example_batch\[1\] must be a torch.Tensor"),
    (lambda a: dict(a, batch=(a["batch"][0], a["batch"][1].to("meta"))), ValueError,
     r"example_batch\[1\] must be on device cpu"),
    (lambda a: dict(a, accumulation_steps=0), ValueError, "accumulation_steps must be a positive int"),
    (lambda a: dict(a, accumulation_steps=2.0), TypeError, "accumulation_steps must be an int"),
    (lambda a: dict(a, accumulation_steps=3), ValueError, r"accumulation_steps \(3\) must divide the batch size"),
    (lambda a: dict(a, accumulation_steps=2, batch=(a["batch"][0], a["batch"][1][:4])), ValueError,
     r"example_batch\[1\] must have the batch size 8"),
    (lambda a: dict(a, accumulation_steps=2, batch=(a["batch"][0], torch.tensor(1))), ValueError,
     r"example_batch\[1\] must have a batch dimension"),
    (lambda a: dict(a, warmup=0), ValueError, "warmup must be a positive int"),
    (lambda a: dict(a, autocast_dtype=torch.float16), ValueError, "float16 needs loss scaling"),
    (lambda a: dict(a, autocast_dtype=torch.float32), ValueError, "autocast_dtype must be None or torch.bfloat16"),
    (lambda a: dict(a, model=torch.nn.Sequential(a["model"], torch.nn.Linear(3, 3, device="meta"))), ValueError,
     "on one device"),
    (lambda a: dict(a, model=torch.nn.ReLU(), optimizer=torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))])),
     None, None),  # a model without parameters of its own trains what the optimizer holds: accepted
])
def test_bad_arguments_are_refused_by_name(made, change, error, match):
    model, optimizer, x, labels = made
    args = change(dict(model=model, optimizer=optimizer, loss_fn=F.cross_entropy, batch=(x, labels),
                       accumulation_steps=1, autocast_dtype=None, warmup=3))
    batch = args.pop("batch")
    if error is None:
        graphed_training_step(args.pop("model"), args.pop("optimizer"), args.pop("loss_fn"), *batch, **args)
        return
    with pytest.raises(error, match=match):
        graphed_training_step(args.pop("model"), args.pop("optimizer"), args.pop("loss_fn"), *batch, **args)


@pytest.mark.parametrize("bad, error, match", [
    (lambda x, y: (x,), TypeError, r"takes 2 tensor\(s\), as example_batch, got 1"),
    (lambda x, y: (x, y.tolist()), TypeError, r"batch\[1\] must be a torch.Tensor"),
    (lambda x, y: (x[:4], y[:4]), ValueError, r"batch\[0\] must have shape \(8, 12\).*static.*got \(4, 12\)"),
    (lambda x, y: (x.double(), y), TypeError, r"batch\[0\] must have dtype torch.float32.*got torch.float64"),
    (lambda x, y: (x, y.to("meta")), ValueError, r"batch\[1\] must be on device cpu.*got meta"),
])
def test_bad_batch_is_refused_by_name_and_trains_nothing(made, bad, error, match):
    model, optimizer, x, labels = made
    step = graphed_training_step(model, optimizer, F.cross_entropy, x, labels)
    step(x, labels)
    before = _parameters(model)
    with pytest.raises(error, match=match):
        step(*bad(x, labels))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))


@pytest.mark.parametrize("loss_fn, error, match", [
    (lambda out, labels: F.cross_entropy(out, labels, reduction="none"), ValueError,
     r"one-element tensor \(the loss\), got shape \(8,\)"),
    (lambda out, labels: 1.0, TypeError, "loss_fn must return a torch.Tensor, got float"),
])
def test_bad_loss_is_refused(made, loss_fn, error, match):
    model, optimizer, x, labels = made
    with pytest.raises(error, match=match):
        graphed_training_step(model, optimizer, loss_fn, x, labels)(x, labels)


def test_batch_of_one_tensor_gives_the_loss_the_output_alone(made):
    model, optimizer, x, _ = made
    step = graphed_training_step(model, optimizer, lambda out: out.square().mean(), x)
    assert step(x).shape == ()


def _params():
    return [torch.nn.Parameter(torch.zeros(3))]


@pytest.mark.parametrize("make, error, match", [
    (lambda: torch.optim.AdamW(_params()), ValueError, r"AdamW has capturable=False.*AdamW\(\.\.\., capturable=True\)"),
    (lambda: torch.optim.RMSprop(_params()), ValueError, r"RMSprop\(\.\.\., capturable=True\)"),
    (lambda: torch.optim.AdamW(_params(), lr=torch.tensor(0.01), capturable=True), ValueError,
     r"param_groups\[0\]\['lr'\] must be on device cuda"),
    (lambda: torch.optim.SGD(_params(), lr=torch.tensor(0.01)), ValueError, "SGD with a tensor lr.*fused=True"),
    (lambda: torch.optim.Adagrad(_params()), TypeError, "Adagrad cannot be replayed from a CUDA graph"),
    (lambda: torch.optim.LBFGS(_params()), TypeError, "LBFGS cannot be replayed"),
    (lambda: torch.optim.SparseAdam(_params()), TypeError, "SparseAdam cannot be replayed"),
    (lambda: torch.optim.AdamW(_params(), capturable=True), None, None),
    (lambda: torch.optim.Adam(_params(), capturable=True, fused=True), None, None),
    (lambda: torch.optim.SGD(_params(), lr=0.1, momentum=0.9), None, None),
    (lambda: torch.optim.SGD(_params()), None, None),
])
def test_optimizers_that_cannot_replay_are_refused(make, error, match):
    """What graphed_training_step checks of the optimizer on cuda (this machine may have no GPU: the check is
    called with the device it would be given)."""
    from warpkan.torch_bridge.graphs import _check_capturable

    if error is None:
        _check_capturable(make(), torch.device("cuda", 0))
        return
    with pytest.raises(error, match=match):
        _check_capturable(make(), torch.device("cuda", 0))


# ------------------------------------------------------------------ whole-step CUDA graphs


def _assert_within_spread(got, eager_a, eager_b, names, scales, relative):
    """``got`` equals ``eager_a`` within the eager loop's own run-to-run spread (atomics in some backward
    kernels), 4 times the largest |eager_a - eager_b| of each tensor, plus ``relative`` of its ``scales`` entry:
    the size of what the steps changed (a graph may run other cuBLAS kernels than the eager calls, whose
    roundings differ at the precision the step computes in)."""
    for name, g, a, b, scale in zip(names, got, eager_a, eager_b, scales):
        spread = (a - b).abs().max().item()
        atol = 4 * spread + relative * scale
        difference = (g - a).abs().max().item()
        assert difference <= atol, (f"{name}: graphed differs from eager by {difference:.3g} (spread {spread:.3g}, "
                                    f"allowed {atol:.3g})")


def _fixed_strategy(model):
    """``model`` with its B-spline and UKAN layers on the gemm strategy: "auto" takes the tiled kernels in an eager
    step of a small layer and the gemm strategy in a captured one (bspline_ops.choose_strategy), and the
    comparison with an eager loop is about the capture, not that choice."""
    for module in model.modules():
        if isinstance(module, (KANLinear, UKANLinear)):
            module.strategy = "gemm"
    return model


# the relative difference of a graphed step's updates from the eager loop's, by the precision the step computes
# in: float32 roundings in another order; bf16 GEMM results rounded once more (2^-8) a layer or two deep
UPDATE_TOLERANCE = {"fp32": 2.0**-16, "bf16": 2.0**-5}


STEPS = 7  # three eager warm-up steps, the capture, three more replays


def _assert_trains_as_eager(graphed, start, losses, build, batches, accumulation_steps, precision):
    """``graphed`` (its parameters ``start`` before training) trained on ``batches`` by graphed_training_step
    with these ``losses``: its parameters and losses are those of ``build()`` trained by the eager loop, within
    that loop's run-to-run spread (two eager runs) plus UPDATE_TOLERANCE[precision] of what the steps changed,
    and training changed them."""
    dtype = torch.bfloat16 if precision == "bf16" else None
    eager = []
    for _ in range(2):
        model = build()
        eager.append((model, _hand_written(model, _sgd(model), batches, accumulation_steps, dtype)))
    (eager_a, losses_a), (eager_b, losses_b) = eager
    names = [n for n, _ in graphed.named_parameters()]
    updates = [(a - p0).abs().max().item() for a, p0 in zip(eager_a.parameters(), start)]
    relative = UPDATE_TOLERANCE[precision]
    _assert_within_spread(list(graphed.parameters()), list(eager_a.parameters()), list(eager_b.parameters()), names,
                          updates, relative)
    _assert_within_spread([losses], [losses_a], [losses_b], ["losses"], [losses_a.abs().max().item()], relative)
    assert any(not torch.equal(p, p0) for p, p0 in zip(graphed.parameters(), start))


# the eager reference loops run a capturable AdamW uncaptured, which torch warns about
capturable_uncaptured = pytest.mark.filterwarnings("ignore:This instance was constructed with capturable=True")


@needs_cuda
@capturable_uncaptured
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("accumulation_steps", [1, 2])
@pytest.mark.parametrize("name", list(MODELS))
def test_graphed_step_trains_as_eager_cuda(name, accumulation_steps, precision, monkeypatch):
    """After STEPS steps, the graphed model's parameters (and losses) are the eager loop's, within the eager
    loop's run-to-run spread; the steps after the warm-up were replays of one graph."""
    replays = []
    replay = torch.cuda.CUDAGraph.replay
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda graph: replays.append(1) or replay(graph))
    dtype = torch.bfloat16 if precision == "bf16" else None
    batches = _batches(name, STEPS, "cuda")
    graphed = _fixed_strategy(_model(name, "cuda"))
    start = _parameters(graphed)
    losses, step = _graphed(graphed, _sgd(graphed), batches, accumulation_steps, dtype)
    assert step.graphed and len(replays) == STEPS - step.warmup
    _assert_trains_as_eager(graphed, start, losses, lambda: _fixed_strategy(_model(name, "cuda")), batches,
                            accumulation_steps, precision)


@needs_cuda
@pytest.mark.parametrize("name", list(MODELS))
def test_graphed_step_of_a_compiled_model_trains_as_its_eager_loop_cuda(name):
    """graphed_training_step of a model compiled by inductor (torch.compile's default mode, as the bench's
    "compiled graphed" mode runs it): after STEPS bf16 steps the parameters and losses are those of the same
    compiled model trained by the eager loop, within that loop's run-to-run spread, and Dynamo made one graph
    with no break (the warm-up steps compiled it; the capture and the replays did not compile again)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    batches = _batches(name, STEPS, "cuda")

    def compiled_model():
        model = _fixed_strategy(_model(name, "cuda"))
        model.compile()
        return model

    graphed = compiled_model()
    start = _parameters(graphed)
    losses, step = _graphed(graphed, _sgd(graphed), batches, autocast_dtype=torch.bfloat16)
    assert step.graphed
    counters = torch._dynamo.utils.counters
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"], dict(counters)
    _assert_trains_as_eager(graphed, start, losses, compiled_model, batches, 1, "bf16")


@needs_cuda
@capturable_uncaptured
@pytest.mark.parametrize("optimizer", ["adamw-tensor-lr", "sgd-fused-tensor-lr", "sgd-momentum-float-lr"])
def test_graphed_step_with_a_learning_rate_schedule_cuda(optimizer):
    """A schedule through a tensor lr on the device: each replay reads the rate the scheduler wrote (the
    rates halve every step, so a replay that kept the captured rate would be far off). SGD with momentum and
    a fixed float lr replays as well."""
    name = "feedforward-kan"
    batches = _batches(name, STEPS, "cuda")

    def make(model):
        params = model.parameters()
        if optimizer == "adamw-tensor-lr":
            opt = torch.optim.AdamW(params, lr=torch.tensor(0.02, device="cuda"), capturable=True)
        elif optimizer == "sgd-fused-tensor-lr":
            opt = torch.optim.SGD(params, lr=torch.tensor(0.2, device="cuda"), momentum=0.9, fused=True)
        else:
            return torch.optim.SGD(params, lr=0.2, momentum=0.9), None
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    runs = []
    for train in (_graphed, _hand_written, _hand_written):
        model = _fixed_strategy(_model(name, "cuda"))
        start = _parameters(model)
        opt, scheduler = make(model)
        train(model, opt, batches, scheduler=scheduler)
        runs.append(list(model.parameters()))
    updates = [(a - p0).abs().max().item() for a, p0 in zip(runs[1], start)]
    _assert_within_spread(runs[0], runs[1], runs[2], [n for n, _ in model.named_parameters()], updates,
                          UPDATE_TOLERANCE["fp32"])


@needs_cuda
def test_capture_that_reads_back_to_the_host_says_why_cuda(child_env):
    """UKANLinear's exact table (table_groups=None) reads its size back to the host in every forward: the
    eager warm-up steps run, the capture fails with a message that says what a captured step must not do.
    (In a child process: a failed capture may leave the CUDA context unusable.)"""
    code = textwrap.dedent("""
        import torch
        from torch.nn import functional as F
        from warpkan.torch_bridge import UKANLinear, graphed_training_step

        model = UKANLinear(6, 3, device="cuda")
        optimizer = torch.optim.AdamW(model.parameters(), capturable=True)
        x, labels = torch.randn(8, 6, device="cuda"), torch.randint(0, 3, (8,), device="cuda")
        step = graphed_training_step(model, optimizer, F.cross_entropy, x, labels, warmup=2)
        step(x, labels)
        step(x, labels)
        try:
            step(x, labels)
        except RuntimeError as exc:
            print("refused:", exc)
    """)
    result = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True,
                            timeout=600)
    assert "refused: capturing the training step in a CUDA graph failed" in result.stdout, result.stderr
    assert "table_groups" in result.stdout


# ------------------------------------------------------------------ torch.compile(mode="reduce-overhead")


class _CUDAGraphTreeCalls:
    """Counts the CUDA-graph recordings and replays of torch's cudagraph trees (the tree manager's
    record_function and execute_node: a recording per function and tree node, a replay per call)."""

    def __init__(self, monkeypatch):
        from torch._inductor import cudagraph_trees

        self.recorded = self.replayed = 0
        manager = cudagraph_trees.CUDAGraphTreeManager
        record, execute = manager.record_function, manager.execute_node

        def counted_record(manager_self, *args, **kwargs):
            self.recorded += 1
            return record(manager_self, *args, **kwargs)

        def counted_execute(manager_self, *args, **kwargs):
            self.replayed += 1
            return execute(manager_self, *args, **kwargs)

        monkeypatch.setattr(manager, "record_function", counted_record)
        monkeypatch.setattr(manager, "execute_node", counted_execute)


def _relative_errors(grads, reference):
    return [((g.double() - r).abs().max() / r.abs().max().clamp_min(1e-30)).item() for g, r in zip(grads, reference)]


def _assert_as_accurate_as_eager(compiled, eager, reference, names):
    """Each compiled gradient is within 4 times the eager step's worst relative error against float64 (plus
    a few float32 ulps): compiling reorders the float32 arithmetic around warpkan's ops, it does not lose
    accuracy."""
    bound = 4 * max(_relative_errors(eager, reference)) + 2**-20
    for name, error in zip(names, _relative_errors(compiled, reference)):
        assert error <= bound, f"{name}: compiled gradient's relative error {error:.3g} > {bound:.3g}"


def _gradients(module):
    return [p.grad.detach().clone() for p in module.parameters()]


def _compiled_training_check(build, inputs, loss_of, device, monkeypatch, accumulation_steps=1):
    """Train ``build()`` compiled for len(inputs) steps (an eager SGD step between them, so the parameters
    change in place as in training): on cuda with mode="reduce-overhead", on the CPU with the aot_eager
    backend (Dynamo and AOTAutograd trace the graph and its backward; nothing is generated, nothing recorded).
    Checks one graph and no break; on cuda no cudagraph skip, no recording after the third step and a replay
    on every step after it; the last step's gradients against eager's (the same module) and float64's (a
    float64 copy)."""
    torch.manual_seed(0)
    module = build().to(device)
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    cuda = device == "cuda"
    calls = _CUDAGraphTreeCalls(monkeypatch) if cuda else None
    compiled = torch.compile(module, **(dict(mode="reduce-overhead") if cuda else dict(backend="aot_eager")))
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-2)
    recorded, replayed = [], []
    accumulating = accumulation_steps > 1
    if accumulating:  # the gradients exist before the first micro-batch, zeroed in place (graphs.py docstring)
        for p in module.parameters():
            p.grad = torch.zeros_like(p)
    for i, batch in enumerate(inputs):
        optimizer.zero_grad(set_to_none=not accumulating)
        for micro in zip(*(t.chunk(accumulation_steps) for t in batch)):
            if cuda:  # before each micro-batch's forward: the last one's outputs are done with (torch needs
                # the mark when accumulating; a plain loop may leave it out)
                torch.compiler.cudagraph_mark_step_begin()
            (loss_of(compiled(micro[0]), *micro[1:]) / accumulation_steps).backward()
        if cuda:
            recorded.append(calls.recorded)
            replayed.append(calls.replayed)
        if i < len(inputs) - 1:
            optimizer.step()
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    if cuda:
        assert counters["inductor"]["cudagraph_skips"] == 0
        assert recorded[2] > 0 and all(r == recorded[2] for r in recorded[2:]), recorded
        assert all(b > a for a, b in zip(replayed[2:], replayed[3:])), replayed

    got = _gradients(module)
    module.zero_grad(set_to_none=True)
    batch = inputs[-1]
    for micro in zip(*(t.chunk(accumulation_steps) for t in batch)):
        (loss_of(module(micro[0]), *micro[1:]) / accumulation_steps).backward()
    eager = _gradients(module)
    double = build().to(device).double()
    double.load_state_dict(module.state_dict())
    for micro in zip(*(t.chunk(accumulation_steps) for t in batch)):
        (loss_of(double(micro[0].double()), *micro[1:]) / accumulation_steps).backward()
    _assert_as_accurate_as_eager(got, eager, _gradients(double), [n for n, _ in module.named_parameters()])


@needs_cuda
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_reduce_overhead_one_graph_recorded_once_cuda(name, monkeypatch):
    build, shape = LAYERS[name]
    generator = torch.Generator().manual_seed(1)
    inputs = [(torch.randn(shape, generator=generator).cuda(),) for _ in range(6)]
    _compiled_training_check(build, inputs, lambda out: out.square().mean(), "cuda", monkeypatch)


@needs_cuda
@pytest.mark.parametrize("name", list(MODELS))
def test_model_reduce_overhead_one_graph_recorded_once_cuda(name, monkeypatch):
    _compiled_training_check(MODELS[name][0], _batches(name, 6, "cuda"), F.cross_entropy, "cuda", monkeypatch)


@pytest.mark.parametrize("name", list(MODELS))
def test_model_compiles_whole_in_one_graph_on_the_cpu(name, monkeypatch):
    """The graph reduce-overhead records, traced on the CPU: each whole model in one graph, no break, its
    compiled gradients as accurate as eager's (the layers compile alone in their own test files)."""
    _compiled_training_check(MODELS[name][0], _batches(name, 3, "cpu"), F.cross_entropy, "cpu", monkeypatch)


@needs_cuda
def test_reduce_overhead_gradient_accumulation_with_step_marks_cuda(monkeypatch):
    """Micro-batches under reduce-overhead, each forward after torch.compiler.cudagraph_mark_step_begin():
    recorded once, replayed, the accumulated gradients as accurate as eager's."""
    name = "feedforward-kan"
    _compiled_training_check(MODELS[name][0], _batches(name, 6, "cuda"), F.cross_entropy, "cuda", monkeypatch,
                             accumulation_steps=4)
