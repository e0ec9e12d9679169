"""warpkan.models: every model builds and trains a step on the CPU at tiny sizes, the default shapes are the
issue's, the twins that claim to compute the same function do; and the ``models`` benchmark family's quick
CPU run gives a measured row for every model, implementation and CPU mode, and says why the CUDA-graph modes
are not measured there."""

import json
import re

import pytest

torch = pytest.importorskip("torch")

from warpkan import models  # noqa: E402
from warpkan.torch_bridge import GroupRational, KANLinear, KATMLP, PolyKANLinear, UKANLinear  # noqa: E402

TINY_VIT = dict(image_size=16, patch_size=8, dim=16, depth=2, heads=2, num_classes=5)
TINY_MIXER = dict(image_size=8, patch_size=4, dim=16, depth=2, num_classes=5)


def _train_step(model, x):
    """One forward and backward; every parameter gets a finite gradient."""
    y = model(x)
    y.square().mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    return y


@pytest.mark.parametrize("ffn", ["grkan", "gelu"])
def test_vision_transformer_trains_a_step(ffn):
    torch.manual_seed(0)
    model = models.VisionTransformer(**TINY_VIT, ffn=ffn)
    y = _train_step(model, torch.randn(3, 3, 16, 16))
    assert y.shape == (3, 5)
    assert isinstance(model.blocks[0].mlp, KATMLP if ffn == "grkan" else models.FeedForward)


@pytest.mark.parametrize("kind", models.LAYER_KINDS)
def test_mixer_and_feedforward_train_a_step(kind):
    torch.manual_seed(0)
    mixer = models.MLPMixer(**TINY_MIXER, token_mixing=kind)
    assert _train_step(mixer, torch.randn(2, 3, 8, 8)).shape == (2, 5)
    net = models.FeedForward((12, 6, 3), kind)
    assert _train_step(net, torch.rand(4, 12)).shape == (4, 3)
    assert _train_step(net, torch.rand(2, 5, 12)).shape == (2, 5, 3)  # (..., in) like the layers


@pytest.mark.parametrize("basis", ["fourier", "chebyshev"])
@pytest.mark.parametrize("mode", ["lut", "exact"])
def test_polykan_net_trains_a_step(basis, mode):
    torch.manual_seed(0)
    net = models.PolyKANNet((10, 8, 4), degree=5, basis=basis, mode=mode)
    assert _train_step(net, torch.randn(6, 10)).shape == (6, 4)
    assert all(layer.basis == basis and layer.mode == mode and layer.degree == 5 for layer in net.layers)


def test_kat_tiny_default_shape():
    """ViT-Tiny: 224² inputs, patch 16 (196 patches + class token), dim 192, depth 12, 3 heads, KAT's FFN
    192 -> 768 -> 192 with 8 rational groups, 1000 classes."""
    torch.manual_seed(0)
    model = models.VisionTransformer()
    assert model.patch_embed.kernel_size == (16, 16) and model.patch_embed.stride == (16, 16)
    assert model.patch_embed.out_channels == 192
    assert model.pos_embed.shape == (1, 197, 192)
    assert len(model.blocks) == 12
    for block in model.blocks:
        assert block.attn.heads == 3
        mlp = block.mlp
        assert isinstance(mlp, KATMLP)
        assert (mlp.fc1.in_features, mlp.fc1.out_features, mlp.fc2.out_features) == (192, 768, 192)
        assert [m.rational.num_groups for m in (mlp.fc1, mlp.fc2)] == [8, 8]
        assert [m.rational.init for m in (mlp.fc1, mlp.fc2)] == ["identity", "swish"]  # KAT-Tiny's act_init
    assert model.head.out_features == 1000
    gelu = models.VisionTransformer(ffn="gelu")
    assert [type(m) for m in gelu.blocks[0].mlp] == [torch.nn.Linear, torch.nn.GELU, torch.nn.Linear]
    assert gelu.blocks[0].mlp[0].out_features == 768
    # ViT-Tiny has 5.7 M parameters (timm's vit_tiny_patch16_224: 5,717,416)
    assert sum(p.numel() for p in gelu.parameters()) == 5_717_416
    with torch.no_grad():
        assert model(torch.randn(1, 3, 224, 224)).shape == (1, 1000)


def test_kan_mixer_default_shape():
    """The UKAN paper's CIFAR Mixer: 32² inputs, patch 4 (64 tokens), hidden 256, depth 16; token mixing
    64 -> 256 -> 64 (expansion 4) with KANLinear G=5, k=3; channel MLP 256 -> 128 -> 256 (expansion 0.5)."""
    torch.manual_seed(0)
    model = models.MLPMixer()
    assert model.tokens == 64 and model.patch_embed.out_channels == 256 and len(model.blocks) == 16
    for block in model.blocks:
        token = list(block.token_mixing)
        assert [type(m) for m in token] == [KANLinear, KANLinear]
        assert [(m.in_features, m.out_features) for m in token] == [(64, 256), (256, 64)]
        assert all(m.grid_size == 5 and m.spline_order == 3 for m in token)
        channel = list(block.channel_mixing)
        assert [type(m) for m in channel] == [torch.nn.Linear, torch.nn.GELU, torch.nn.Linear]
        assert [channel[0].in_features, channel[0].out_features, channel[2].out_features] == [256, 128, 256]
    assert model.head.out_features == 10
    ukan = models.MLPMixer(token_mixing="ukan")
    assert [type(m) for m in ukan.blocks[0].token_mixing] == [UKANLinear, UKANLinear]
    assert ukan.blocks[0].token_mixing[0].table_groups is not None  # fixed table: compiles and captures
    with torch.no_grad():
        assert model(torch.randn(1, 3, 32, 32)).shape == (1, 10)


def test_speech_commands_and_mnist_default_shapes():
    net = models.PolyKANNet()
    assert [(m.in_features, m.out_features) for m in net.layers] == [(40, 256), (256, 256), (256, 12)]
    assert all(isinstance(m, PolyKANLinear) and m.degree == 8 and m.basis == "fourier" for m in net.layers)
    with torch.no_grad():
        assert net(torch.randn(128, 40)).shape == (128, 12)
    for kind, layer in (("kan", KANLinear), ("ukan", UKANLinear)):
        mnist = models.FeedForward(kind=kind)
        assert [(m.in_features, m.out_features) for m in mnist] == [(784, 32), (32, 10)]
        assert all(isinstance(m, layer) for m in mnist)
    mlp = models.FeedForward(kind="mlp")
    assert [type(m) for m in mlp] == [torch.nn.Linear, torch.nn.GELU, torch.nn.Linear]


def test_efficient_kan_twin_computes_the_kan_models_function():
    torch.manual_seed(0)
    twin = models.MLPMixer(**TINY_MIXER, token_mixing="efficient-kan")
    ours = models.MLPMixer(**TINY_MIXER, token_mixing="kan")
    ours.load_state_dict(twin.state_dict())
    x = torch.randn(3, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), twin(x), rtol=1e-5, atol=1e-5)


def test_peer_rational_swap_keeps_the_function_and_the_parameters():
    """The bench's FlashKAT variant swaps each GroupRational for a peer kernel on the same parameters; with
    the torch formula of the rational family as the peer, the model computes the same logits and trains the
    same parameters (the state dict keys are unchanged, so a KAT checkpoint loads into either)."""
    from warpkan.bench.models import _with_peer_rationals
    from warpkan.bench.rational import torch_formula

    torch.manual_seed(0)
    ours = models.VisionTransformer(**TINY_VIT)
    for m in ours.modules():  # away from the identity init's zero denominators, where |b| has no derivative
        if isinstance(m, GroupRational):
            m.reset_parameters("swish")
    peer = _with_peer_rationals(models.VisionTransformer(**TINY_VIT), torch_formula)
    assert not any(isinstance(m, GroupRational) for m in peer.modules())
    assert peer.state_dict().keys() == ours.state_dict().keys()
    peer.load_state_dict(ours.state_dict())
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(peer(x), ours(x), rtol=1e-5, atol=1e-5)
    _train_step(peer, x)
    _train_step(ours, x)
    a = dict(ours.named_parameters())
    for name, p in peer.named_parameters():
        torch.testing.assert_close(p.grad, a[name].grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("bad, match", [
    (dict(ffn="relu"), "ffn"), (dict(dim=10, heads=3), "heads"), (dict(image_size=30), "patch_size"),
    (dict(depth=0), "depth"), (dict(mlp_ratio=-1.0), "mlp_ratio"),
])
def test_vision_transformer_refuses_bad_arguments(bad, match):
    with pytest.raises((TypeError, ValueError), match=match):
        models.VisionTransformer(**{**TINY_VIT, **bad})


@pytest.mark.parametrize("cls, bad, match", [
    (models.MLPMixer, dict(token_mixing="conv"), "token_mixing"), (models.MLPMixer, dict(image_size=10), "patch_size"),
    (models.MLPMixer, dict(channel_expansion=0.01), "channel_expansion"),
    (models.FeedForward, dict(widths=(4,)), "widths"), (models.FeedForward, dict(kind="gelu"), "kind"),
    (models.FeedForward, dict(widths=(4, 0)), r"widths\[1\]"),
    (models.PolyKANNet, dict(widths=(3, 2.0)), r"widths\[1\]"),
])
def test_other_models_refuse_bad_arguments(cls, bad, match):
    args = dict(TINY_MIXER) if cls is models.MLPMixer else {}
    with pytest.raises((TypeError, ValueError), match=match):
        cls(**{**args, **bad})


# ------------------------------------------------------------------ the benchmark family


@pytest.fixture(scope="module")
def quick_rows(quick_bench):
    """The rows of the quick CPU run of ``warpkan bench models`` and its output folder: the run tests/test_cli.py
    checks too, which the tests that read it share under xdist by their group mark."""
    status, out = quick_bench("models")
    assert status == 0
    return json.loads((out / "models.json").read_text())["rows"], out


@pytest.mark.xdist_group("bench_models")
def test_bench_quick_run_measures_every_model_impl_and_mode(quick_rows):
    from warpkan.bench.models import CUDA_GRAPH_MODES, MODES, PRECISIONS, _cases

    rows, out = quick_rows
    assert (out / "models.json").exists() and (out / "models.md").exists()
    for case in _cases("cpu", quick=True):
        for impl in case.impls:
            mine = [r for r in rows if r["model"] == case.name and r["impl"] == impl]
            if impl == "FlashKAT Triton rational":
                assert [r["note"] for r in mine] == ["not run: WARPKAN_KAT_PATH unset"]
                continue
            assert sorted((r["precision"], r["mode"]) for r in mine) == sorted(
                (p, m) for p in PRECISIONS for m in MODES), (case.name, impl)
            for r in mine:
                if r["mode"] in CUDA_GRAPH_MODES:
                    assert r["note"] == "not applicable on cpu: CUDA graphs replay GPU work only", r
                    assert "step_ms" not in r and "fastest" not in r
                    continue
                assert "note" not in r, r
                assert r["step_ms"] > 0 and r["samples/s"] == pytest.approx(case.batch / r["step_ms"] * 1e3)
                assert r["first_step_s"] > 0 and r["batch"] == case.batch
                if r["mode"] == "compile":  # compiled for real, one graph (a model's blocks share it)
                    assert r["graphs"] == 1 and r["graph breaks"] == 0, r
            assert sum(r.get("fastest") == "yes" for r in mine) == 1, (case.name, impl)


@pytest.mark.xdist_group("bench_models")
def test_bench_twins_compute_the_warpkan_function(quick_rows):
    rows, _ = quick_rows
    checked = {(r["model"], r["impl"]): r["Δ logits"] for r in rows if "Δ logits" in r}
    assert set(checked) == {("KAN-Mixer", "efficient-kan formula"), ("MNIST 784-32-10", "efficient-kan formula"),
                            ("Speech Commands net", "torch cos/sin+einsum (fourier)"),
                            ("Speech Commands net", "torch acos/cos (chebyshev)")}
    assert all(0 <= value < 1e-5 for value in checked.values()), checked


@pytest.fixture(scope="module")
def target_rows(quick_rows):
    """The target rows and profiles, which a CUDA run appends, made from the quick CPU rows (a CPU run's table
    leaves them out: the targets are GPU figures)."""
    from warpkan.bench.models import QUICK, _cases, target_rows_and_profiles

    rows, _ = quick_rows
    assert not any(r["impl"] == "target" or r["impl"].startswith("profile: ") for r in rows)
    return target_rows_and_profiles(rows, _cases("cpu", quick=True), "cpu", QUICK)


@pytest.mark.xdist_group("bench_models")
def test_bench_target_rows(target_rows):
    from warpkan.bench.models import CUDA_GRAPH_MODES, QUICK, TARGETS

    targets = [r for r in target_rows if r["impl"] == "target"]
    assert len(targets) == len(TARGETS)
    for row, (model, ours, theirs, mode, bound, sense) in zip(targets, TARGETS):
        assert row["model"] == model and ours in row["target"] and theirs in row["target"]
        if theirs.startswith("FlashKAT") or mode in CUDA_GRAPH_MODES:  # not run, or not on the CPU
            assert row["met"] == "not measured" and "paired" not in row
            continue
        assert row["met"] in ("yes", "no") and row["measured"].endswith("ms")
        if mode == "eager":  # judged again on alternating rounds of its two configurations, by their median
            median, rounds = re.fullmatch(r"(\d+\.\d\d)x, median of (\d+) alternating rounds "
                                          r"\(\d+\.\d\d-\d+\.\d\dx\)", row["paired"]).groups()
            assert int(rounds) == QUICK["paired_rounds"]
            assert row["met"] == ("yes" if (float(median) >= bound if sense == "speedup" else float(median) <= bound)
                                  else "no") or abs(float(median) - bound) < 0.01  # the shown median is rounded
        else:
            assert "paired" not in row


@pytest.mark.xdist_group("bench_models")
def test_bench_profiles_both_sides_of_each_missed_target(target_rows):
    from warpkan.bench.models import TARGETS

    rows = target_rows
    profiled = {(r["model"], r["impl"].removeprefix("profile: ")): r for r in rows if r["impl"].startswith("profile: ")}
    targets = [r for r in rows if r["impl"] == "target"]
    expected = set()
    for row, (model, ours, theirs, *_rest) in zip(targets, TARGETS):
        if row["met"] == "no":
            compared = row["measured"].split(": ", 1)[1].split(", ")
            for side, prefix in zip(compared, (ours, theirs)):
                impl = side.rsplit(" ", 3)[0]  # "<impl> <mode> <ms> ms"
                assert impl.startswith(prefix)
                expected.add((model, impl))
    assert set(profiled) == expected
    for row in profiled.values():
        shares = row["where the time goes"].split("; ")
        assert 1 <= len(shares) <= 6 and all(share.endswith("%)") for share in shares), row


@pytest.mark.parametrize("mode", ["graphed", "reduce-overhead", "compiled graphed"])
def test_bench_cuda_graph_modes_cuda(mode):
    """The CUDA-graph modes of the bench on cuda, for one model (the quick run above is the CPU's): a measured
    row; the compiled ones compiled to one graph with no break, and reduce-overhead's taken by CUDA graphs (no
    cudagraph skip)."""
    if not torch.cuda.is_available():
        pytest.skip("the CUDA-graph modes run on cuda only")
    from warpkan.bench.models import QUICK, _cases, _measure

    case = next(c for c in _cases("cuda", quick=True) if c.name == "MNIST 784-32-10")
    for impl in ("warpkan KANLinear", "MLP"):
        for precision in ("fp32", "bf16 autocast"):
            row = _measure(case, impl, precision, mode, "cuda", QUICK)
            assert row["step_ms"] > 0 and row["first_step_s"] > 0 and row["peak_MiB"] >= 0, row
            if mode != "graphed":
                assert (row["graphs"], row["graph breaks"]) == (1, 0), row
            if mode == "reduce-overhead":
                assert row["cudagraph skips"] == 0, row


def test_bench_graphed_step_falls_back_to_eager_on_the_cpu():
    """The bench's graphed configuration is graphed_training_step's: on the CPU (where the table has no such
    rows) it builds and trains eagerly, after the step's warm-up count of calls it would spend on cuda."""
    from warpkan.bench.models import QUICK, _cases, _prepared_step

    case = next(c for c in _cases("cpu", quick=True) if c.name == "MNIST 784-32-10")
    model, step, warm_calls = _prepared_step(case, "warpkan KANLinear", "bf16 autocast", "graphed", "cpu", QUICK)
    before = [p.detach().clone() for p in model.parameters()]
    loss = step()
    assert warm_calls == 3 and loss.shape == () and torch.isfinite(loss)
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), before))


def test_flashkat_unavailable_says_why(monkeypatch, tmp_path):
    from warpkan.bench.models import flashkat_unavailable

    monkeypatch.delenv("WARPKAN_KAT_PATH", raising=False)
    assert flashkat_unavailable("cuda") == "not run: WARPKAN_KAT_PATH unset"
    monkeypatch.setenv("WARPKAN_KAT_PATH", str(tmp_path))
    assert "cuda only" in flashkat_unavailable("cpu")
    assert "did not import" in flashkat_unavailable("cuda")  # an empty folder holds no rational_kat
