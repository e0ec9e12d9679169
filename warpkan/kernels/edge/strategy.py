"""The rule the strategy "auto" follows for the spline edge families (B-spline KANLinear, UKAN's dense range
table): measured bounds on the layer's shape, the gemm strategy's precision, and whether the call waits on the
host (an eager call) or only on the GPU (a call recorded into a CUDA graph). Pure Python (no torch): the torch
bridge and the Warp-native layers follow the same rule. The bounds were measured with the torch bridge's gemm
strategy (cuBLAS, or MKL on the CPU); the Warp-native layers' gemm strategy multiplies with ``wp.tile_matmul``
(:mod:`.tile_gemm`), whose own figures are in ``docs/perf-notes-engine.md``.

The polynomial families (one window of D + 1 bases an input) take the gemm strategy
(:data:`SINGLE_SLOT_AUTO_STRATEGY`) except in an eager CUDA call of a small layer (:func:`single_slot_strategy`);
shared-table families (UKAN's touched-pair table) have no dense basis and take the stencil kernels.
"""

__all__ = ["STRATEGIES", "choose_strategy", "single_slot_strategy", "SINGLE_SLOT_AUTO_STRATEGY",
           "EAGER_SINGLE_SLOT_STENCIL_MAX_WORK", "GEMM_MAX_COEFFICIENTS", "TILED_GEMM_MAX_COEFFICIENTS",
           "TILED_MIN_TILES", "TILED_LONG_WALK", "BF16_GEMM_MIN_OUTPUTS", "EAGER_TILED_MAX_TILES"]

STRATEGIES = ("auto", "stencil", "gemm")
# The strategy "auto" resolves to for the polynomial families on the CPU, under CUDA-graph capture, and for eager
# CUDA calls past EAGER_SINGLE_SLOT_STENCIL_MAX_WORK: it was the faster one there. CUDA: replayed from a CUDA graph
# (GPU time alone), at every PolyKAN configuration
# (H100, `warpkan bench poly`, fwd+bwd: 0.035 against 0.24 ms at (128, 40, 256, 8), 0.076 against 1.9 at
# (64, 256, 512, 15)): the engine's tiled kernels give a warp 32 rows, too few blocks for small batches, and
# their records grow with the degree.
# CPU: 2.7-30x faster at every shape of scripts/cpu_strategy.py (one thread, fwd+bwd, LUT mode: (16, 8->8, D=3)
# 0.17 against 0.45 ms, (64, 16->32, D=8) 0.32 against 1.6, (1024, 32->64, D=8) 7.0 against 63, (64, 256->512,
# D=15) 19 against 371; exact mode and float64 alike): the per-thread stencil kernels evaluate every edge's D + 1
# bases on one thread, where the GEMMs run in MKL, faster still on more threads.
SINGLE_SLOT_AUTO_STRATEGY = "gemm"
# An eager CUDA call of a small polynomial layer waits on the host, and there the stencil route (one launch a
# pass, the parameters read in place: ``torch_bridge.edge_ops.stencil_param``) beats the gemm route (the table
# copied into the GEMM's layout, the basis expanded, three GEMMs, the contraction) by more than the stencil's
# longer GPU time. H200, (rows, 32 -> 32, D = 8), an eager fwd+bwd step, stencil vs gemm, ms (graphed in
# brackets; `python scripts/host_cost.py strategies`): 1024 rows 0.381 vs 0.884 (0.230 vs 0.037), 4096 0.542 vs
# 0.875 (0.260 vs 0.056), 16384 0.591 vs 0.895 (0.390 vs 0.134). The bound is on the stencil's work, rows x in x
# out x (D + 1): 16384 rows there are 1.5 x 2^27, where its GPU time (0.39 ms) was still under the gemm route's
# host time; the bound keeps a margin below that. Long walks (TILED_LONG_WALK inputs or more) stay on gemm, as
# for the spline families: (64, 256 -> 512, D = 15), 2^27 terms, took 1.9 ms on the stencil kernels against
# 0.076 on gemm (H100, graphed, above), past any eager step's host time.
EAGER_SINGLE_SLOT_STENCIL_MAX_WORK = 2**27


# Up to this many coefficients per input the dense basis (zeros included) is cheaper to multiply on cuBLAS
# than to gather per edge with the per-thread stencil kernels (the CPU, and grids past the tiled kernels'
# capacity); beyond it the stencil kernels, whose cost does not grow with G, win. Measured on an H200 with
# `warpkan bench bspline` (fp32, fwd+bwd ms, gemm vs per-thread stencil): (2^17, 32->32, k=3) G=32 1.87 vs
# 2.25, G=64 3.69 vs 2.30; wide layers with short bases (256->256 G=8, 512->512 G=5) 6-8x faster on gemm.
# The CPU's switch is at the same place (scripts/cpu_strategy.py, one thread, fwd+bwd ms, gemm vs stencil):
# (1024, 32->32, k=3) G=45 11.7 vs 13.3, G=64 14.3 vs 12.9; (256, 64->64) G=32 6.1 vs 13.1, G=100 17.9 vs 15.3.
GEMM_MAX_COEFFICIENTS = 48
# The same bound where the warp-tiled stencil kernels run (CUDA, G + 3k within their capacity). Their cost
# grows with N in out (k + 1), the dense basis's with N in out (G + k + 1) at GEMM speed. H200, fp32, kernels
# alone (fwd + bwd ms, tiled vs gemm in the bench): (2^17, 32->32, k=3) G=32 0.84 vs 1.87; 256->256 G=8 19.9
# vs 8.5; 512->512 G=5 18.6 vs 2.9; (128, 40->256, G=5) 0.23 vs 0.05 (the tiled grid is too small to fill
# the GPU).
TILED_GEMM_MAX_COEFFICIENTS = 16
# Beyond that bound the tiled kernels still lose where their grid is small and each warp's walk long: a warp
# walks every input of its 32 rows for 32 outputs, so fewer than TILED_MIN_TILES tiles of (32 rows, 32 outputs)
# cannot fill the GPU, and with TILED_LONG_WALK inputs or more that walk is the step. H200, a graphed fwd+bwd,
# tiled vs gemm (fp32): (128, 784->32, G=21) 1.89 vs 0.084 ms; UKAN's range table (128, 784->32, 28
# coefficients) 1.86 vs 0.28. With short walks the GPU times are close ((1024, 32->32, G=21) 0.108 vs 0.064,
# (4096, 32->32, G=21) 0.126 vs 0.095) and the gemm strategy's extra launches and GEMMs cost more host time
# than that in an eager step (UKAN (1024, 32->32), 44 coefficients: an eager step 0.95 ms tiled, 1.94 gemm).
TILED_MIN_TILES = 256
TILED_LONG_WALK = 128
# Under bf16 the GEMMs run on tensor cores and the basis is half as wide in memory, so the dense basis also
# wins on layers of BF16_GEMM_MIN_OUTPUTS outputs or more (the tiled kernels' work grows with the outputs, the
# basis does not). H200, graphed fwd+bwd under bf16 autocast, tiled vs gemm: (32768, 64->256, G=21) 2.50 vs
# 0.47 ms; UKAN's range table, 44 coefficients, (8192, 256->256) 3.21 vs 1.38; at 32 outputs it does not:
# (65536, 32->32, G=21) 0.362 vs 0.383, UKAN's (65536, 32->32), 44 coefficients, 0.46 vs 0.74 (the tiled
# time at 64 outputs, twice that at 32, is past the gemm time).
BF16_GEMM_MIN_OUTPUTS = 64
# An eager step of a small layer is bound by the host, and there the tiled route's one launch a pass beats
# the gemm route's five launches and three GEMMs: so outside CUDA-graph capture, layers of fewer than
# EAGER_TILED_MAX_TILES tiles with short walks take the tiled kernels even where the gemm route's GPU time is
# shorter. H200, eager step ms, tiled vs gemm (graphed in brackets): KANLinear G=5 (1024, 32->32) 0.84 vs 1.09
# (0.105 vs 0.044); (4096, 64->64) 0.81 vs 1.31 (0.242 vs 0.083); (128, 32->10) 1.03 vs 1.17; UKANLinear
# (1024, 32->32), 36 coefficients, 1.55 vs 1.67; (128, 32->10), 28 coefficients, 1.40 vs 1.96. Captured, the
# GPU time decides (the rule above).
EAGER_TILED_MAX_TILES = 1024


def choose_strategy(n_rows: int, n_in: int, n_out: int, n_coef: int, tiled_stencil: bool = False,
                    precision: str = "fp32", host_bound: bool = False) -> str:
    """The strategy "auto" resolves to for a shape; ``tiled_stencil``: the warp-tiled stencil kernels apply
    (see :func:`warpkan.kernels.bspline.tiled_applies`); ``precision``: the gemm strategy's, resolved
    ("fp32", "tf32" or "bf16"); ``host_bound``: an eager call, whose small steps wait on the host (False
    under CUDA-graph capture, where only the GPU time counts). The bounds are measured (the constants'
    comments)."""
    if not tiled_stencil:
        return "gemm" if n_coef <= GEMM_MAX_COEFFICIENTS else "stencil"
    tiles = -(-n_rows // 32) * -(-n_out // 32)
    long_walk = n_in >= TILED_LONG_WALK
    if tiles < TILED_MIN_TILES and (long_walk or not host_bound):
        return "gemm"
    if host_bound and tiles < EAGER_TILED_MAX_TILES and not long_walk:
        return "stencil"
    if n_coef <= TILED_GEMM_MAX_COEFFICIENTS:
        return "gemm"
    if precision == "bf16" and n_coef <= GEMM_MAX_COEFFICIENTS and n_out >= BF16_GEMM_MIN_OUTPUTS:
        return "gemm"
    return "stencil"


def single_slot_strategy(n_rows: int, n_in: int, n_out: int, n_coef: int, is_cuda: bool, host_bound: bool) -> str:
    """The strategy "auto" takes for a polynomial (single-slot) family: the stencil kernels for an eager
    (``host_bound``) CUDA call of at most EAGER_SINGLE_SLOT_STENCIL_MAX_WORK edge-coefficient terms a pass and
    fewer than TILED_LONG_WALK inputs, else :data:`SINGLE_SLOT_AUTO_STRATEGY`."""
    if (is_cuda and host_bound and n_in < TILED_LONG_WALK
            and n_rows * n_in * n_out * n_coef <= EAGER_SINGLE_SLOT_STENCIL_MAX_WORK):
        return "stencil"
    return SINGLE_SLOT_AUTO_STRATEGY
