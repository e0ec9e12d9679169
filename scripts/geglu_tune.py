"""GPU tuning of the GEGLU forward at 4096/12288 fp16 (prints tables; nothing is timed on the CPU).

1. The read ceiling: the Warp read probe over the 302 MB of weights (one buffer, and w_uv + w_o as two
   launches) at several grid sizes, and the device-to-device copy rate (read + write bytes / time).
2. Correctness of the tensor-core streaming path against the GEMM path (float16, bfloat16).
3. Forward times from CUDA-graph replay: torch baseline, GEMM+gate, the streaming path as shipped and its
   configurations (``CANDIDATES``: rows a warp, k a stage, stages), and each of its four launches alone.

   Each configuration runs with its last three launches as programmatic dependents (``dependent``, the
   default) and plainly, and the two outputs are compared bitwise over repeated calls.

    python scripts/geglu_tune.py [batches] [--shipped]   (--shipped: only the configurations in TC_CONFIG)
"""

import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import warp as wp

from warpkan.kernels import geglu as kg
from warpkan.reference.geglu import torch_baseline
from warpkan.torch_bridge import geglu_ffn
from warpkan.torch_bridge._common import warp_stream


# (m_tiles, k_chunk, stages) tried per batch capacity; each runs at the most warps per SM its ring allows
CANDIDATES = {
    1: [(1, 256, 3), (1, 128, 5), (2, 128, 4), (2, 256, 2)],
    2: [(1, 128, 5), (2, 128, 3)],
    4: [(2, 64, 5), (2, 128, 2), (4, 64, 3)],
    8: [(2, 64, 3), (1, 64, 4)],
}


def graph_ms(fn, repeat=100):
    """Best-of-5 mean milliseconds of fn replayed from a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        fn()
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = 1e9
    for _ in range(5):
        start.record()
        for _ in range(repeat // 5):
            graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / (repeat // 5))
    return best


def replay(cmds, device):
    def run():
        stream = warp_stream(device)
        for cmd in cmds:
            cmd.launch(stream)

    return run


def main():
    hidden, inter = 4096, 12288
    dtype = torch.float16
    device = torch.device("cuda")
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    shipped_only = "--shipped" in sys.argv
    batches = [int(b) for b in (args[0].split(",") if args else "4,8,16,32,64".split(","))]
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    torch.manual_seed(0)
    w_uv = (torch.rand(2 * inter, hidden, device="cuda") * 2 - 1).div(hidden**0.5).to(dtype)
    w_o = (torch.rand(hidden, inter, device="cuda") * 2 - 1).div(inter**0.5).to(dtype)
    w_u, w_v = w_uv[:inter], w_uv[inter:]
    weight_bytes = 3 * hidden * inter * 2
    t0 = time.time()

    # compile the variants in parallel up front
    sweep = {nt: [cfg + (kg.resident_warps_per_sm(nt, 90, cfg + (32,)),) for cfg in CANDIDATES[nt]]
             for nt in kg.TC_N_TILES}
    if shipped_only:
        sweep = {nt: [kg.TC_CONFIG[nt]] for nt in kg.TC_N_TILES}
    jobs = [(kg.get_tc_variant("float16", nt, cfg).module, None) for nt, cfgs in sweep.items() for cfg in cfgs]
    jobs += [(kg.get_tc_variant(dt, nt).module, None) for dt in ("float16", "bfloat16") for nt in kg.TC_N_TILES]
    jobs.append((kg._probe_kernel().module, 256))
    jobs.append((kg.get_variant("float16", 8).module, None))

    def load(job):
        try:
            wp.load_module(job[0], device="cuda:0", block_dim=job[1])
            return None
        except Exception as exc:  # a failed variant is reported, the others still run
            return f"{job}: {exc}"

    with ThreadPoolExecutor(8) as pool:
        for err in pool.map(load, jobs):
            if err:
                print("COMPILE FAIL", err[:2000])
    print(f"compiled in {time.time() - t0:.1f} s", flush=True)

    # 1. read ceiling
    flat = torch.cat([w_uv.reshape(-1), w_o.reshape(-1)]).reshape(-1, 4096)
    print(f"\n== read ceiling ({weight_bytes / 1e6:.0f} MB), SMs={sm}")
    for blocks_per_sm in (2, 4, 8, 16, 32):
        out = torch.empty(sm * blocks_per_sm * 256, dtype=torch.int32, device="cuda")
        cmds = kg.launch_read_probe(wp.from_torch(flat), wp.from_torch(out), record=True)
        ms = graph_ms(replay(cmds, device))
        cmds2 = kg.launch_read_probe(wp.from_torch(w_uv), wp.from_torch(out), record=True) + kg.launch_read_probe(
            wp.from_torch(w_o), wp.from_torch(out), record=True)
        ms2 = graph_ms(replay(cmds2, device))
        print(f"probe {blocks_per_sm:>2} blocks/SM x 256: one buffer {ms:.4f} ms {weight_bytes / ms / 1e6:7.0f} GB/s | "
              f"w_uv then w_o {ms2:.4f} ms {weight_bytes / ms2 / 1e6:7.0f} GB/s", flush=True)
    dst = torch.empty_like(flat)
    ms = graph_ms(lambda: dst.copy_(flat))
    print(f"copy {ms:.4f} ms: {2 * weight_bytes / ms / 1e6:.0f} GB/s read+write")

    # 2. correctness
    for dt in (torch.float16, torch.bfloat16):
        for b in (3, 8, 13, 40, 64):
            x = torch.randn(b, hidden, device="cuda").to(dt)
            a = geglu_ffn(x, w_uv.to(dt), w_o.to(dt), small_batch_rows=64).float()
            r = geglu_ffn(x, w_uv.to(dt), w_o.to(dt), small_batch_rows=0).float()
            a2 = geglu_ffn(x, w_uv.to(dt), w_o.to(dt), small_batch_rows=64).float()
            print(f"check {dt} N={b}: max rel diff streaming vs GEMM "
                  f"{((a - r).abs().max() / r.abs().max()).item():.2e}, repeat bitwise {torch.equal(a, a2)}", flush=True)

    # 3. timing
    print(f"\n{'N':>4} {'impl':<44} {'graph ms':>9} {'GB/s':>6}")
    for batch in batches:
        x = torch.randn(batch, hidden, device="cuda", dtype=dtype)
        rows = [("torch baseline", graph_ms(lambda: torch_baseline(x, w_u, w_v, w_o, "gelu"))),
                ("GEMM+gate", graph_ms(lambda: geglu_ffn(x, w_uv, w_o, small_batch_rows=0)))]
        if batch <= kg.TC_MAX_ROWS:
            rows.append(("shipped streaming", graph_ms(lambda: geglu_ffn(x, w_uv, w_o, small_batch_rows=64))))
            uv = torch.empty(batch, 2 * inter, device="cuda", dtype=dtype)
            h = torch.empty(batch, inter, device="cuda", dtype=dtype)
            out = torch.empty(batch, hidden, device="cuda", dtype=dtype)
            for cfg in sweep[kg.tc_n_tiles(batch)]:
                plan_up, plan_down = kg.tc_plans(hidden, inter, batch, sm, 90, cfg)
                partial_up = torch.empty(plan_up.slots, batch, 2 * inter, device="cuda", dtype=torch.float32)
                partial_down = torch.empty(plan_down.slots, batch, hidden, device="cuda", dtype=torch.float32)
                results = {}
                for dependent in (False, True):
                    cmds = kg.launch_tc_forward(
                        *(wp.from_torch(t) for t in (x, w_uv)), None, wp.from_torch(w_o), None,
                        *(wp.from_torch(t) for t in (uv, h, out, partial_up, partial_down)), "gelu", record=True,
                        config=cfg, dependent=dependent)
                    name = "dependent" if dependent else "plain"
                    rows.append((f"4 launches {name}, config {cfg}", graph_ms(replay(cmds, device))))
                    if not dependent:
                        for i, part in enumerate(("up", "gate combine", "down", "out combine")):
                            rows.append((f"  {part} alone", graph_ms(replay(cmds[i:i + 1], device))))
                    # eager repeats, each compared bitwise with the first plain result
                    outs = []
                    for _ in range(50):
                        out.fill_(float("nan"))
                        h.fill_(float("nan"))
                        replay(cmds, device)()
                        outs.append(out.clone())
                    results[name] = outs
                ref = results["plain"][0]
                same = all(torch.equal(o, ref) for outs in results.values() for o in outs)
                print(f"check N={batch} {cfg}: 100 runs (plain, dependent) bitwise equal: {same}", flush=True)
        for name, ms in rows:
            print(f"{batch:>4} {name:<44} {ms:9.4f} {weight_bytes / ms / 1e6:6.0f}", flush=True)
    print(f"total {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
