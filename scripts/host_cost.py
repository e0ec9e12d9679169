"""Host cost of an eager training step per layer class at (1024, 32->32) against nn.Linear (and a cProfile of
each with the backward on the calling thread: --prof), the public-layout table copies of the B-spline layer at
long grids (regress), whole-model bf16 steps eager and whole-step graphed (models), and the host time of a
GroupRational's eager fwd+bwd at KAT-Tiny's two shapes under bf16 autocast, the GPU kept busy so that only the
host is timed (rational). On the GPU machine:

    python scripts/host_cost.py host [regress] [models] [rational] [grkan] [strategies] [--prof] [--cpu]
        [KANLinear] [UKANLinear] [PolyKANLinear] [GRKANLinear]

``host`` times each layer's step (of the classes named, else all four) and nn.Linear's in alternating rounds and
reports the median ratio with the rounds' range: separate processes moved nn.Linear's own step by 35% on the GPU
machine. An A/B of two checkouts runs it in alternating processes, each with its checkout first on PYTHONPATH.

On a fresh GPU machine, build the kernels first: UKANLinear's modules once took over 200 s to build cold (its
CG-MLP generator on cuBLASDx), which cut a timed call short at its UKAN row; a configuration of every family
now builds in 6-18 s.

    python -m warpkan.cli precompile --config in=32,out=32
"""
import cProfile, io, pstats, statistics, sys, time
import torch
from torch.nn import functional as F
from warpkan.bench.timing import time_fn, training_step, graphed
from warpkan.torch_bridge import KANLinear, UKANLinear, PolyKANLinear, GRKANLinear, capture_step

dev = "cpu" if "--cpu" in sys.argv else "cuda"  # --cpu: a smoke run of the script, not a measurement


def make(name):
    return {"nn.Linear": lambda: torch.nn.Linear(32, 32), "KANLinear": lambda: KANLinear(32, 32),
            "UKANLinear": lambda: UKANLinear(32, 32, table_groups=8), "PolyKANLinear": lambda: PolyKANLinear(32, 32, 8),
            "GRKANLinear": lambda: GRKANLinear(32, 32)}[name]().to(dev)


def _sync():
    if dev == "cuda":
        torch.cuda.synchronize()


def eager_round_ms(step, calls: int = 100) -> float:
    """Wall-clock ms of one eager call of ``step``, over ``calls`` calls in a loop: an eager step of a small
    layer is the host's time."""
    _sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        step()
    _sync()
    return (time.perf_counter() - t0) * 1e3 / calls


def paired_eager(step, base_step, rounds: int = 7) -> tuple:
    """(median ms of ``step``, median ms of ``base_step``, median ratio, (lowest, highest) ratio): the two
    timed in alternating rounds after 30 warm-up calls each, so that each round's ratio compares them under the
    same state of the host (separate processes, or rounds minutes apart, moved nn.Linear's step by 35%)."""
    for _ in range(30):
        step()
        base_step()
    mine, base = [], []
    for _ in range(rounds):
        mine.append(eager_round_ms(step))
        base.append(eager_round_ms(base_step))
    ratios = [m / b for m, b in zip(mine, base)]
    return statistics.median(mine), statistics.median(base), statistics.median(ratios), (min(ratios), max(ratios))


def print_profile(step, functions: int) -> None:
    """cProfile of 300 calls of ``step`` with the backward on the caller's thread (autograd's device thread
    would hide it), its ``functions`` heaviest by own time."""
    with torch.autograd.set_multithreading_enabled(False):
        pr = cProfile.Profile(); pr.enable()
        for _ in range(300): step()
        _sync(); pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(functions)
    print("\n".join(l for l in s.getvalue().splitlines() if l.strip()), flush=True)


def _layer_step(name):
    layer = make(name)
    x = torch.randn(1024, 32, device=dev, requires_grad=True)
    dy = torch.randn(1024, 32, device=dev)
    return training_step(layer, x, dy)


def host():
    """Each layer class's eager step against nn.Linear's, in alternating rounds (autograd's device thread, the
    default, and the backward on the caller's thread), and its graphed step."""
    linear = _layer_step("nn.Linear")
    classes = ["KANLinear", "UKANLinear", "PolyKANLinear", "GRKANLinear"]
    for name in [n for n in classes if n in sys.argv] or classes:  # the classes named on the command line, or all
        step = _layer_step(name)
        res = {}
        for mt in (True, False):
            with torch.autograd.set_multithreading_enabled(mt):
                res[mt] = paired_eager(step, linear)
        g = time_fn(graphed(step), dev, warmup=3, repeat=50) if dev == "cuda" else float("nan")
        (ms, base, ratio, (lo, hi)), (ms_c, base_c, ratio_c, (lo_c, hi_c)) = res[True], res[False]
        print(f"HOST {name:14s} eager {ms:.3f} ms, nn.Linear {base:.3f}: {ratio:.2f}x ({lo:.2f}-{hi:.2f}x over the "
              f"rounds)  backward on the caller's thread {ms_c:.3f} / {base_c:.3f}: {ratio_c:.2f}x ({lo_c:.2f}-"
              f"{hi_c:.2f}x)  graphed {g:.4f}", flush=True)
        if "--prof" in sys.argv:
            print_profile(step, 16)


def strategies():
    """PolyKANLinear by each strategy at small and mid shapes (rows, in, out, degree): the eager step against
    nn.Linear's (alternating rounds) and the graphed step: which strategy an eager call of the layer should
    take (``kernels.edge.strategy.single_slot_strategy``)."""
    shapes = [(1024, 32, 32, 8), (4096, 32, 32, 8), (16384, 32, 32, 8), (128, 40, 256, 8), (1024, 32, 32, 15),
              (64, 64, 128, 15), (256, 96, 96, 8), (64, 256, 512, 15)]
    for rows, n_in, n_out, degree in shapes if dev == "cuda" else shapes[:1]:
        x = torch.randn(rows, n_in, device=dev, requires_grad=True)
        dy = torch.randn(rows, n_out, device=dev)
        linear = training_step(torch.nn.Linear(n_in, n_out).to(dev), x, dy)
        for strategy in ("auto", "stencil", "gemm"):
            step = training_step(PolyKANLinear(n_in, n_out, degree, strategy=strategy).to(dev), x, dy)
            ms, base, ratio, (lo, hi) = paired_eager(step, linear)
            g = time_fn(graphed(step), dev, warmup=3, repeat=50) if dev == "cuda" else float("nan")
            print(f"STRATEGY PolyKANLinear ({rows}, {n_in} -> {n_out}, D={degree}) {strategy:8s} eager {ms:.3f} ms, "
                  f"nn.Linear {base:.3f}: {ratio:.2f}x ({lo:.2f}-{hi:.2f}x)  graphed {g:.4f} ms", flush=True)


def regress():
    for g in (2**14, 2**16, 2**18):
        for contiguous in (True, False):
            torch.manual_seed(0)
            layer = KANLinear(32, 32, g, 3, contiguous_parameters=contiguous).to(dev)
            x = (torch.rand(2**17, 32, device=dev) * 2 - 1).requires_grad_(True)
            dy = torch.randn(2**17, 32, device=dev)
            ms = time_fn(training_step(layer, x, dy), dev, warmup=3, repeat=20)
            print(f"TABLE G=2^{g.bit_length()-1} contiguous_parameters={contiguous}: fwd+bwd {ms:.3f} ms", flush=True)
            del layer, x, dy
            torch.cuda.empty_cache()


def models():
    from warpkan.models import FeedForward, MLPMixer
    from warpkan.models import PolyKANNet
    cases = {
        "MNIST kan": (lambda: FeedForward((784, 32, 10), "kan"), (128, 784), 10),
        "MNIST ukan": (lambda: FeedForward((784, 32, 10), "ukan"), (128, 784), 10),
        "MNIST efficient-kan": (lambda: FeedForward((784, 32, 10), "efficient-kan"), (128, 784), 10),
        "MNIST mlp": (lambda: FeedForward((784, 32, 10), "mlp"), (128, 784), 10),
        "Mixer kan": (lambda: MLPMixer(token_mixing="kan"), (128, 3, 32, 32), 10),
        "Mixer ukan": (lambda: MLPMixer(token_mixing="ukan"), (128, 3, 32, 32), 10),
        "Mixer mlp": (lambda: MLPMixer(token_mixing="mlp"), (128, 3, 32, 32), 10),
    }
    for name, (build, shape, classes) in cases.items():
        torch.manual_seed(0)
        model = build().to(dev)
        # the optimizer of warpkan bench models (torch's fused AdamW)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=True, fused=True)
        x = torch.rand(shape, device=dev); labels = torch.randint(0, classes, (shape[0],), device=dev)
        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), labels)
            loss.backward(); opt.step(); opt.zero_grad(set_to_none=False)
            return loss
        eager = time_fn(step, dev, warmup=3, repeat=20)
        replay = capture_step(step)
        g = time_fn(replay, dev, warmup=3, repeat=20)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            replay(); torch.cuda.synchronize()
        ev = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        top = sorted(ev, key=lambda e: -e.self_device_time_total)[:5]
        print(f"MODEL {name}: eager {eager:.3f} ms, graphed {g:.3f} ms; graphed kernels: " + "; ".join(
            f"{e.key[:50]} {e.self_device_time_total/1e3:.3f}x{e.count}" for e in top), flush=True)


def _busy_host_us(step, calls: int = 50) -> float:
    """Median host us of one call of ``step`` over 7 rounds of ``calls``, each queued behind ~0.1 s of GPU spin,
    so that only the host is timed (the rounds' GPU work must fit in the spin, and their launches in the
    launch queue)."""
    for _ in range(20): step()
    _sync()
    ts = []
    for _ in range(7):
        if dev == "cuda":
            torch.cuda._sleep(200_000_000)
        t0 = time.perf_counter()
        for _ in range(calls): step()
        ts.append((time.perf_counter() - t0) / calls * 1e6)
        _sync()
    return statistics.median(ts)


def rational():
    """The host time of one GroupRational fwd+bwd at KAT-Tiny's two shapes, against torch's GELU (what the
    GELU ViT's FFN runs there) on the same x; with --prof, a cProfile of the rational's calls with the backward
    on the caller's thread."""
    from warpkan.torch_bridge import GroupRational
    # KAT-Tiny's FFN at batch 128: the first rational sees the LayerNorm's fp32 output [25216, 192], the second
    # fc1's bf16 output [25216, 768]
    for features, dtype in ((192, torch.float32), (768, torch.bfloat16)):
        layer = GroupRational(features).to(dev)
        x = torch.randn(128 * 197, features, device=dev, dtype=dtype, requires_grad=True)
        dy = torch.randn_like(x)

        def step():
            layer(x).backward(dy)
            x.grad = layer.weight_numerator.grad = layer.weight_denominator.grad = None

        def gelu_step():
            F.gelu(x).backward(dy)
            x.grad = None

        for mt in (True, False):
            with torch.autograd.set_multithreading_enabled(mt):
                ours, gelu = _busy_host_us(step), _busy_host_us(gelu_step)
            print(f"RATIONAL [{x.shape[0]}, {features}] {str(dtype)[6:]} host us a fwd+bwd "
                  f"({'autograd device thread' if mt else 'caller thread'}): {ours:.1f}, GELU {gelu:.1f}", flush=True)
        if "--prof" in sys.argv:
            print_profile(step, 30)


def grkan():
    """The host time of one fwd+bwd of KAT-Tiny's MLP block (KATMLP, x [25216, 192] fp32, hidden 768, bf16
    autocast) and of a GRKANLinear at (1024, 32 -> 32) fp32: as one autograd node each
    (``warpkan.torch_bridge.grkan_ops``) and as their composition (a rational node and a linear layer each
    GR-KAN layer), beside the GELU ViT's FFN on the same x and nn.Linear, in alternating rounds."""
    from warpkan.models import FeedForward
    from warpkan.torch_bridge import KATMLP, rational
    rows = 128 * 197 if dev == "cuda" else 197  # --cpu: a smoke run
    cases = (("KATMLP", KATMLP(192, 768).to(dev), FeedForward((192, 768, 192), "mlp").to(dev), "GELU FFN",
              torch.randn(rows, 192, device=dev, requires_grad=True), torch.bfloat16),
             ("GRKANLinear", GRKANLinear(32, 32).to(dev), torch.nn.Linear(32, 32).to(dev), "nn.Linear",
              torch.randn(1024, 32, device=dev, requires_grad=True), None))
    for name, layer, peer, peer_name, x, autocast in cases:
        dy = torch.randn_like(x, dtype=autocast or x.dtype)

        def step(module, fused=True):
            def run():
                with rational.composed_layers(not fused), torch.autocast(dev, dtype=autocast or torch.bfloat16,
                                                                         enabled=autocast is not None):
                    y = module(x)
                y.backward(dy)
                x.grad = None
                for p in (*layer.parameters(), *peer.parameters()):
                    p.grad = None
            return run

        steps = {f"{name}, one node": step(layer), f"{name}, composed": step(layer, fused=False), peer_name: step(peer)}
        for mt in (True, False):
            with torch.autograd.set_multithreading_enabled(mt):
                rounds = {label: [] for label in steps}
                for _ in range(3):
                    for label, run in steps.items():
                        rounds[label].append(_busy_host_us(run, calls=10 if name == "KATMLP" else 50))
            print(f"GRKAN host us a fwd+bwd ({'autograd device thread' if mt else 'caller thread'}): " + ", ".join(
                f"{label} {statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})" for label, v in rounds.items()),
                flush=True)
        if "--prof" in sys.argv:  # the node's calls, queued behind GPU spin so that only the host is profiled
            with torch.autograd.set_multithreading_enabled(False):
                run = steps[f"{name}, one node"]
                run()
                _sync()
                if dev == "cuda":
                    torch.cuda._sleep(200_000_000)
                pr = cProfile.Profile(); pr.enable()
                for _ in range(30): run()
                pr.disable(); _sync()
            out = io.StringIO(); pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(28)
            print("\n".join(l for l in out.getvalue().splitlines() if l.strip()), flush=True)


if __name__ == "__main__":
    for w in sys.argv[1:]:
        if not w.startswith("-") and w not in ("KANLinear", "UKANLinear", "PolyKANLinear", "GRKANLinear"):
            globals()[w]()
