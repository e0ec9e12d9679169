"""GEGLU FFN benchmark: warpkan's GEGLUFFN against the torch baseline (two F.linear, gelu, multiply,
F.linear) in the same run, at hidden 4096 / intermediate 12288 in float16 for batch 4 .. 128 (the small-batch range),
then 1024 and 8192 rows (training batches: there the GEMMs dominate and the gate kernel is what differs).

At small batch the layer is bound by reading its three weight matrices (3 * hidden * intermediate * 2
bytes = 302 MB), so every row reports the weight-streaming bandwidth of its forward pass, and that as a
fraction of two ceilings: the read probe measured in the same run (a Warp kernel that only reads w_uv then
w_o with 16-byte loads, two launches like the forward; 4.45 TB/s on the H200, 4.58 TB/s as one launch over
one buffer) and the device-to-device copy rate (4.3-4.8 TB/s measured on the H200, read + write). The
percentages of the copy rate are H100 / H200 figures, left out of CPU runs.

Implementations:

- ``warpkan``: the layer as shipped (weight streaming up to ``small_batch_rows`` = 8 rows, the
  concatenated GEMM plus the fused Warp gate above);
- ``warpkan streaming`` / ``warpkan GEMM+gate``: one path forced, to place the switch;
- ``torch baseline``: what a PyTorch user writes, unfused;
- the ``(CUDA graph)`` rows replay the forward from a captured graph (cuda only), which removes the host's
  launch overhead from both sides: the difference from the plain rows is that overhead.
"""

from __future__ import annotations

import torch

from . import register
from .timing import HARDWARE, backward_only, flop_rate, graphed, peak_memory, time_fn

FULL_SHAPE = (4096, 12288)
FULL_BATCHES = [4, 8, 16, 32, 64, 128, 1024, 8192]
QUICK_SHAPE = (64, 192)
QUICK_BATCHES = [4, 32]
COPY_RATE_HIGH = 4.8e12  # the best device-to-device copy rate measured on the H200; HARDWARE has the low end
ACTIVATION = "gelu"


def _baseline(w_u, w_v, w_o):
    from ..reference.geglu import torch_baseline

    def forward(x):
        return torch_baseline(x, w_u, w_v, w_o, ACTIVATION)

    return forward


def _impls(layer, batch):
    """name -> callable x -> out, for the implementations that apply at this batch."""
    from ..torch_bridge import geglu_ffn

    w_uv, w_o = layer.w_uv, layer.w_o
    impls = {"warpkan": layer}
    if batch <= 64:
        impls["warpkan streaming"] = lambda x: geglu_ffn(x, w_uv, w_o, activation=ACTIVATION, small_batch_rows=64)
    impls["warpkan GEMM+gate"] = lambda x: geglu_ffn(x, w_uv, w_o, activation=ACTIVATION, small_batch_rows=0)
    impls["torch baseline (F.linear x2 + gelu + mul + F.linear)"] = _baseline(layer.w_u, layer.w_v, w_o)
    return impls


def _read_probe(layer, device: str, repeat: int) -> float:
    """Milliseconds for the Warp read probe to read w_uv then w_o (two launches, as the forward reads them;
    8 blocks of 256 threads per SM, the best grid measured on the H200): the achievable ceiling of a
    weight-streaming forward, where a copy's rate also pays for the writes."""
    import warp as wp

    from ..kernels.geglu import launch_read_probe
    from ..torch_bridge._common import warp_stream

    sm = torch.cuda.get_device_properties(torch.device(device)).multi_processor_count if device.startswith("cuda") else 1
    sums = torch.empty(sm * 8 * 256, dtype=torch.int32, device=device)
    cmds = [cmd for w in (layer.w_uv, layer.w_o) for cmd in launch_read_probe(
        wp.from_torch(w.detach()), wp.from_torch(sums), record=True)]

    def read():
        stream = warp_stream(torch.device(device)) if device.startswith("cuda") else None
        for cmd in cmds:
            cmd.launch(stream)

    if device.startswith("cuda"):
        read = _graphed(lambda _x: read(), None)
    return time_fn(read, device, warmup=3, repeat=repeat)


def _graphed(fn, x):
    """fn(x) without autograd, captured in a CUDA graph (:func:`.timing.graphed`): its replay."""
    def call():
        with torch.no_grad():
            fn(x)

    return graphed(call)


_FWD_FLOPS = "the forward's 2 N x (weight elements) FLOPs per fwd_ms"
LEGEND = {
    "total_ms": "one forward + backward timed as a whole, median ms; fwd_ms and bwd_ms are timed apart, each "
                "call with its own host overhead, so total_ms need not equal their sum and can be less",
    "fwd_weight_GB_s": "the weights' bytes (w_uv and w_o, read once) per fwd_ms: the weight-streaming bandwidth",
    "pct_of_read_probe": "fwd_weight_GB_s as a share of the read probe's (a Warp kernel that only reads the "
                         "weights, in the same run)",
    "pct_of_copy_4.3TB_s": "fwd_weight_GB_s as a share of the H100 / H200 device-to-device copy rate, low end",
    "pct_of_copy_4.8TB_s": "fwd_weight_GB_s as a share of the best copy rate measured on the H200",
    "fwd_speedup_vs_baseline": "the torch baseline's fwd_ms over this row's (graphed rows: against the graphed "
                               "baseline): above 1, faster than the baseline",
    "total_speedup_vs_baseline": "the torch baseline's total_ms over this row's",
    "fwd GFLOP/s": _FWD_FLOPS, "fwd TFLOP/s": _FWD_FLOPS,
}


@register("geglu", LEGEND)
def run(device: str = "cuda", quick: bool = False) -> list[dict]:
    from ..torch_bridge import GEGLUFFN

    hidden, inter = QUICK_SHAPE if quick else FULL_SHAPE
    batches = QUICK_BATCHES if quick else FULL_BATCHES
    dtype = torch.float16
    torch.manual_seed(0)
    layer = GEGLUFFN(hidden, inter, activation=ACTIVATION, device=device, dtype=dtype)
    weight_bytes = 3 * hidden * inter * dtype.itemsize
    repeat = 5 if quick else 50
    rows = []
    probe_ms = _read_probe(layer, device, repeat)
    probe_rate = weight_bytes / (probe_ms * 1e-3)
    cuda = device.startswith("cuda")

    def copy_rate_columns(rate):
        if not cuda:
            return {}
        return {"pct_of_copy_4.3TB_s": 100 * rate / HARDWARE["hbm_bytes_per_s"],
                "pct_of_copy_4.8TB_s": 100 * rate / COPY_RATE_HIGH}

    rows.append({
        "case": f"{hidden}/{inter} fp16 weights", "impl": "read probe (Warp, 16-byte loads, w_uv then w_o)",
        "fwd_ms": probe_ms, "fwd_weight_GB_s": probe_rate / 1e9, "pct_of_read_probe": 100.0,
        **copy_rate_columns(probe_rate),
    })
    for batch in batches:
        case = f"N={batch} {hidden}/{inter} fp16"
        x = torch.randn(batch, hidden, device=device, dtype=dtype)
        dy = torch.randn(batch, hidden, device=device, dtype=dtype)
        x_train = x.clone().requires_grad_()
        impls = _impls(layer, batch)
        timed = []
        for name, fn in impls.items():
            def forward(fn=fn):
                with torch.no_grad():
                    fn(x)

            def train_step(fn=fn):
                fn(x_train).backward(dy)

            fwd = time_fn(forward, device, warmup=3, repeat=repeat)
            bwd = time_fn(backward_only(fn, [x_train], dy, params=[layer.w_uv, layer.w_o]), device, warmup=2,
                          repeat=max(5, repeat // 5))
            total = time_fn(train_step, device, warmup=2, repeat=max(5, repeat // 5))
            layer.zero_grad(set_to_none=True)
            timed.append((name, fwd, bwd, total, peak_memory(train_step, device)))
            layer.zero_grad(set_to_none=True)
            if device.startswith("cuda"):
                try:
                    replay = _graphed(fn, x)
                    timed.append((f"{name} (CUDA graph)", time_fn(replay, device, warmup=3, repeat=repeat), None, None,
                                  None))
                except Exception as exc:  # report, do not hide: a failed capture is a finding
                    rows.append({"case": case, "impl": f"{name} (CUDA graph)", "note": f"capture failed: {exc}"})
        baseline = {name: fwd for name, fwd, _, _, _ in timed if name.startswith("torch baseline")}
        baseline_total = {name: total for name, _, _, total, _ in timed if name.startswith("torch baseline")}
        for name, fwd, bwd, total, peak in timed:
            graphed = name.endswith("(CUDA graph)")
            peer_fwd = baseline.get(
                "torch baseline (F.linear x2 + gelu + mul + F.linear)" + (" (CUDA graph)" if graphed else "")
            )
            peer_total = baseline_total.get("torch baseline (F.linear x2 + gelu + mul + F.linear)")
            bandwidth = weight_bytes / (fwd * 1e-3)
            rows.append({
                "case": case,
                "impl": name,
                "fwd_ms": fwd,
                "bwd_ms": bwd,
                "total_ms": total,
                "fwd_speedup_vs_baseline": None if peer_fwd is None else peer_fwd / fwd,
                "total_speedup_vs_baseline": None if total is None or peer_total is None else peer_total / total,
                "fwd_weight_GB_s": bandwidth / 1e9,
                "pct_of_read_probe": 100 * bandwidth / probe_rate,
                **copy_rate_columns(bandwidth),
                **flop_rate(2 * batch * weight_bytes / dtype.itemsize, fwd, device, prefix="fwd "),
                "peak_MiB": peak,
            })
    return rows
