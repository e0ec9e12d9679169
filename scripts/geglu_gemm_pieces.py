"""The GEMM pieces of the GEGLU layer at 16-256 rows (cuda, fp16 4096/12288, CUDA-graph replays): the concatenated
up GEMM, the down GEMM, split-K variants (batched GEMMs over K slices with fp32 outputs, and their sum), under
cuBLAS and cuBLASLt; the torch baseline and the warpkan GEMM+gate path in the same process.

    python scripts/geglu_gemm_pieces.py

Table for docs/perf-notes-geglu.md ("cuBLAS pieces at 16-256 rows"); JSON of every time under $OUT (or /tmp).
"""
import json
import os

import torch
import torch.nn.functional as F

from warpkan.bench.timing import time_fn, graphed
from warpkan.torch_bridge import geglu_ffn
from warpkan.reference.geglu import torch_baseline
torch.manual_seed(0)
dev = "cuda"; dt = torch.float16
H, I = 4096, 12288
w_uv = torch.randn(2 * I, H, device=dev, dtype=dt) * 0.02
w_o = torch.randn(H, I, device=dev, dtype=dt) * 0.02
w_u, w_v = w_uv[:I].contiguous(), w_uv[I:].contiguous()
res = {}
def T(name, fn, rep=100):
    try:
        g = graphed(fn)
        ms = min(time_fn(g, dev, warmup=5, repeat=rep) for _ in range(3))
    except Exception as e:
        print(name, "FAILED", repr(e)[:200]); return None
    res[name] = ms; print(f"{name:60s} {ms*1e3:8.1f} us", flush=True); return ms

def splitk_mm(a, b_t, s, out32=True):
    # a [M, K], b_t [N, K] -> a @ b_t.T summed over s K-slices
    M, K = a.shape; N = b_t.shape[0]; k = K // s
    A = a.view(M, s, k).transpose(0, 1)          # [s, M, k]
    B = b_t.view(N, s, k).permute(1, 2, 0)       # [s, k, N]
    if out32:
        P = torch.bmm(A, B, out_dtype=torch.float32)
    else:
        P = torch.bmm(A, B)
    return P.sum(0)

for lib in ["cublas", "cublaslt"]:
    torch.backends.cuda.preferred_blas_library(lib)
    for N in [16, 32, 64, 128, 256]:
        x = torch.randn(N, H, device=dev, dtype=dt)
        uv = F.linear(x, w_uv); h = torch.empty(N, I, device=dev, dtype=dt)
        p = f"{lib} N={N}"
        T(f"{p} torch baseline", lambda: torch_baseline(x, w_u, w_v, w_o, "gelu"))
        T(f"{p} warpkan GEMM+gate", lambda: geglu_ffn(x, w_uv, w_o, small_batch_rows=0))
        T(f"{p} up GEMM [x|w_uv]", lambda: F.linear(x, w_uv))
        T(f"{p} up GEMM u alone", lambda: F.linear(x, w_u))
        T(f"{p} down GEMM", lambda: F.linear(h, w_o))
        T(f"{p} gelu*mul torch", lambda: F.gelu(uv[:, :I]) * uv[:, I:])
        for s in [2, 3, 4, 6]:
            T(f"{p} down splitK{s} fp32 bmm", lambda s=s: torch.bmm(h.view(N, s, I // s).transpose(0, 1), w_o.view(H, s, I // s).permute(1, 2, 0), out_dtype=torch.float32))
            T(f"{p} down splitK{s} fp32 bmm+sum", lambda s=s: splitk_mm(h, w_o, s))
            T(f"{p} down splitK{s} fp16 bmm", lambda s=s: torch.bmm(h.view(N, s, I // s).transpose(0, 1), w_o.view(H, s, I // s).permute(1, 2, 0)))
        for s in [2, 4]:
            T(f"{p} up splitK{s} fp32 bmm", lambda s=s: torch.bmm(x.view(N, s, H // s).transpose(0, 1), w_uv.view(2 * I, s, H // s).permute(1, 2, 0), out_dtype=torch.float32))
        # transposed product: (W x^T) gives N-major output with weights as the "M" side
        T(f"{p} up GEMM transposed w_uv@x.T", lambda: torch.mm(w_uv, x.t()))
        T(f"{p} down GEMM transposed w_o@h.T", lambda: torch.mm(w_o, h.t()))
out = os.environ.get("OUT", "/tmp")
json.dump(res, open(f"{out}/geglu_gemm.json", "w"), indent=1)
