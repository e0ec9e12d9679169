"""Gate kernels of the GEGLU GEMM path, one element a thread against 16-byte vectors, and the layer on that path
against the torch baseline (cuda; CUDA-graph replays after warm-up).

    python scripts/geglu_gate_check.py

Tables for docs/perf-notes-geglu.md ("The gate kernels: 16-byte vectors").
"""
import torch
import warp as wp

from warpkan.bench.timing import time_fn, graphed
from warpkan.kernels import geglu as kg
from warpkan.kernels._common import dense_vector_view
from warpkan.torch_bridge import geglu_ffn
from warpkan.reference.geglu import torch_baseline
dev = "cuda"; dt = torch.float16; H, I = 4096, 12288
code = kg.activation_code("gelu")
w = wp.from_torch
print("| rows | pass | 1 element a thread (ms) | 8 elements a thread (ms) | GB/s (8) |")
print("|---|---|---|---|---|")
for rows in [128, 256, 1024, 8192]:
    uv = torch.randn(rows, 2 * I, device=dev, dtype=dt); h = torch.empty(rows, I, device=dev, dtype=dt)
    dh = torch.randn(rows, I, device=dev, dtype=dt); duv = torch.empty_like(uv)
    res = {}
    for vec in (1, 8):
        var = kg.get_variant("float16", vec)
        vt = var.io_vector
        f = lambda: wp.launch(var.activation_forward, dim=(rows, I // vec), inputs=[dense_vector_view(w(uv), vt), code], outputs=[dense_vector_view(w(h), vt)], stream=wp.stream_from_torch(torch.cuda.current_stream()))
        b = lambda: wp.launch(var.activation_backward, dim=(rows, I // vec), inputs=[dense_vector_view(w(dh), vt), dense_vector_view(w(uv), vt), code], outputs=[dense_vector_view(w(duv), vt), dense_vector_view(w(h), vt)], stream=wp.stream_from_torch(torch.cuda.current_stream()))
        res[vec] = (min(time_fn(graphed(f), dev, 5, 50) for _ in range(3)), min(time_fn(graphed(b), dev, 5, 50) for _ in range(3)))
    for i, (name, moved) in enumerate((("forward", 3), ("backward", 6))):
        print(f"| {rows} | {name} | {res[1][i]:.4f} | {res[8][i]:.4f} | {moved * rows * I * 2 / res[8][i] / 1e6:.0f} |", flush=True)
w_uv = torch.randn(2 * I, H, device=dev, dtype=dt) * 0.02; w_o = torch.randn(H, I, device=dev, dtype=dt) * 0.02
w_u, w_v = w_uv[:I].contiguous(), w_uv[I:].contiguous()
print("\n| rows | warpkan GEMM+gate fwd (graph) | baseline fwd (graph) | ratio | warpkan step | baseline step |")
print("|---|---|---|---|---|---|")
for rows in [128, 256, 1024, 8192]:
    x = torch.randn(rows, H, device=dev, dtype=dt); dy = torch.randn(rows, H, device=dev, dtype=dt)
    ours = min(time_fn(graphed(lambda: geglu_ffn(x, w_uv, w_o, small_batch_rows=0)), dev, 5, 30) for _ in range(3))
    base = min(time_fn(graphed(lambda: torch_baseline(x, w_u, w_v, w_o, "gelu")), dev, 5, 30) for _ in range(3))
    xs = x.clone().requires_grad_()
    wu2, wo2 = w_uv.clone().requires_grad_(), w_o.clone().requires_grad_()
    wu_, wv_, wo_ = (t.clone().requires_grad_() for t in (w_u, w_v, w_o))
    step = lambda: geglu_ffn(xs, wu2, wo2, small_batch_rows=0).backward(dy)
    bstep = lambda: torch_baseline(xs, wu_, wv_, wo_, "gelu").backward(dy)
    s1 = min(time_fn(step, dev, 3, 10) for _ in range(3)); s2 = min(time_fn(bstep, dev, 3, 10) for _ in range(3))
    print(f"| {rows} | {ours:.4f} | {base:.4f} | {base / ours:.2f}x | {s1:.3f} | {s2:.3f} |", flush=True)
