"""Fused GEGLU feed-forward kernels in pure Warp (no torch import).

The layer is ``out = (gelu(x W_u^T + b_u) * (x W_v^T + b_v)) W_o^T + b_o`` with the weights in
``nn.Linear`` layout, the two input projections concatenated into one matrix:

- ``x``     [N, hidden]
- ``w_uv``  [2 * inter, hidden]   rows ``0 .. inter-1`` are W_u, rows ``inter .. 2 inter-1`` are W_v
- ``b_uv``  [2 * inter]           (optional)
- ``uv``    [N, 2 * inter]        the pre-activations ``[u | v]``
- ``h``     [N, inter]            ``gelu(u) * v``
- ``w_o``   [hidden, inter]
- ``b_o``   [hidden]              (optional)
- ``out``   [N, hidden]

I/O is float16, bfloat16, float32 or float64; every sum and every activation is evaluated in float32
(float64 for float64 I/O, so that the torch op can be gradchecked) and rounded once on the store.

Activations (``ACTIVATIONS``, chosen by a runtime code, so one compiled module serves all three):

- ``gelu``          ``0.5 u (1 + erf(u / sqrt 2))``
- ``gelu_tanh``     ``0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3)))``
- ``gelu_sigmoid``  ``u sigmoid(1.702 u)``

Two kinds of kernel:

- Element-wise (any batch): :func:`launch_activation` reads ``uv`` once and writes ``h``;
  :func:`launch_activation_backward` reads ``dh`` and ``uv`` once and writes ``duv`` and ``h`` (recomputed
  for the W_o gradient, so the forward never has to keep it). The big products around them are left to
  cuBLAS through the caller.
- Weight streaming (at most ``MAX_SMALL_ROWS`` rows): at small batch the layer is a matrix-vector product
  bound by reading the weights, so :func:`launch_small_forward` reads every weight element exactly once
  and lets all rows of the batch reuse it from registers. Each block owns a few weight rows (columns of
  the intermediate layer for the first projection, both their u and v rows; outputs for the second); its
  threads walk the reduction dimension with consecutive threads on consecutive elements (coalesced), a few
  independent loads in flight per thread, and the block's partial sums are combined by one block
  reduction. The activation and the product with v are applied in the first projection's epilogue, so
  ``h`` is written once and read once by the second projection. The sums run in a fixed order: the result
  is bitwise reproducible.
"""

import functools
from dataclasses import dataclass

import warp as wp

__all__ = [
    "ACTIVATIONS",
    "MAX_SMALL_ROWS",
    "GEGLUVariant",
    "SmallVariant",
    "activation_code",
    "get_variant",
    "get_small_variant",
    "small_rows_bucket",
    "launch_activation",
    "launch_activation_backward",
    "launch_small_forward",
    "TC_MAX_ROWS",
    "TensorCoreVariant",
    "get_tc_variant",
    "tc_eligible",
    "tc_n_tiles",
    "tc_splits",
    "launch_tc_forward",
    "launch_read_probe",
]

ACTIVATIONS = ("gelu", "gelu_tanh", "gelu_sigmoid")
MAX_SMALL_ROWS = 16

# Compile-time row capacity of the weight-streaming kernels -> (weight rows per block, unroll, block_dim of
# the first projection, block_dim of the second). The accumulator holds (weight rows x row capacity)
# values per thread; keeping that product at 64 bounds registers, and the unroll keeps a few independent
# weight loads in flight per thread.
_SMALL_CONFIG = {
    4: (8, 4, 64, 128),
    8: (4, 4, 64, 128),
    16: (2, 2, 64, 128),
}

_IO_SCALARS = {
    "float16": wp.float16,
    "bfloat16": wp.bfloat16,
    "float32": wp.float32,
    "float64": wp.float64,
}


def activation_code(activation: str) -> int:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    return ACTIVATIONS.index(activation)


def _accumulator(io_name: str):
    return wp.float64 if io_name == "float64" else wp.float32


def _io_scalar(io_name: str):
    if io_name not in _IO_SCALARS:
        raise TypeError(f"dtype must be one of {sorted(_IO_SCALARS)}, got {io_name}")
    return _IO_SCALARS[io_name]


@functools.lru_cache(maxsize=None)
def _gate_funcs(acc_name: str):
    """(gate, gate_and_grad) in the accumulation type: gate(u, code) = gelu variant of u."""
    acc = wp.float64 if acc_name == "float64" else wp.float32
    half = acc(0.5)
    one = acc(1.0)
    inv_sqrt2 = acc(0.7071067811865476)
    inv_sqrt_2pi = acc(0.3989422804014327)
    sqrt_2_over_pi = acc(0.7978845608028654)
    tanh_cubic = acc(0.044715)
    sigmoid_scale = acc(1.702)

    @wp.func
    def gate(u: acc, code: int):
        if code == 0:
            return half * u * (one + wp.erf(u * inv_sqrt2))
        if code == 1:
            return half * u * (one + wp.tanh(sqrt_2_over_pi * (u + tanh_cubic * u * u * u)))
        return u / (one + wp.exp(-sigmoid_scale * u))

    @wp.func
    def gate_and_grad(u: acc, code: int):
        if code == 0:
            cdf = half * (one + wp.erf(u * inv_sqrt2))
            return u * cdf, cdf + u * inv_sqrt_2pi * wp.exp(-half * u * u)
        if code == 1:
            t = wp.tanh(sqrt_2_over_pi * (u + tanh_cubic * u * u * u))
            dinner = sqrt_2_over_pi * (one + acc(3.0) * tanh_cubic * u * u)
            return half * u * (one + t), half * (one + t) + half * u * (one - t * t) * dinner
        sig = one / (one + wp.exp(-sigmoid_scale * u))
        return u * sig, sig + sigmoid_scale * u * sig * (one - sig)

    return gate, gate_and_grad


@dataclass(frozen=True)
class GEGLUVariant:
    """The element-wise kernels of one I/O type."""

    io_name: str
    activation_forward: wp.Kernel
    activation_backward: wp.Kernel
    module: str


@functools.lru_cache(maxsize=None)
def get_variant(io_name: str) -> GEGLUVariant:
    io = _io_scalar(io_name)
    acc_name = "float64" if io_name == "float64" else "float32"
    acc = _accumulator(io_name)
    gate, gate_and_grad = _gate_funcs(acc_name)
    module = f"warpkan_geglu_{io_name}"
    kernel = functools.partial(wp.kernel, enable_backward=False, module=module)

    @kernel
    def activation_forward(uv: wp.array2d(dtype=io), code: int, h: wp.array2d(dtype=io)):
        # consecutive threads on consecutive columns: u and v reads and the h write all coalesce
        m, j = wp.tid()
        n_inter = h.shape[1]
        u = acc(uv[m, j])
        v = acc(uv[m, n_inter + j])
        h[m, j] = io(gate(u, code) * v)

    @kernel
    def activation_backward(
        dh: wp.array2d(dtype=io),
        uv: wp.array2d(dtype=io),
        code: int,
        duv: wp.array2d(dtype=io),
        h: wp.array2d(dtype=io),
    ):
        # du = dh v gelu'(u), dv = dh gelu(u); h = gelu(u) v is recomputed for the W_o gradient
        m, j = wp.tid()
        n_inter = h.shape[1]
        u = acc(uv[m, j])
        v = acc(uv[m, n_inter + j])
        g, dg = gate_and_grad(u, code)
        d = acc(dh[m, j])
        duv[m, j] = io(d * v * dg)
        duv[m, n_inter + j] = io(d * g)
        h[m, j] = io(g * v)

    return GEGLUVariant(io_name, activation_forward, activation_backward, module)


@dataclass(frozen=True)
class SmallVariant:
    """The weight-streaming kernels of one (I/O type, row capacity)."""

    io_name: str
    rows: int
    cols_per_block: int
    up_block_dim: int
    down_block_dim: int
    up_projection: wp.Kernel
    down_projection: wp.Kernel
    module: str


def small_rows_bucket(n_rows: int) -> int:
    """The compiled row capacity that serves ``n_rows`` (1 .. MAX_SMALL_ROWS)."""
    for rows in sorted(_SMALL_CONFIG):
        if n_rows <= rows:
            return rows
    raise ValueError(f"the weight-streaming path takes at most {MAX_SMALL_ROWS} rows, got {n_rows}")


@functools.lru_cache(maxsize=None)
def get_small_variant(io_name: str, rows: int) -> SmallVariant:
    io = _io_scalar(io_name)
    if rows not in _SMALL_CONFIG:
        raise ValueError(f"row capacity must be one of {sorted(_SMALL_CONFIG)}, got {rows}")
    cols, unroll, up_block_dim, down_block_dim = _SMALL_CONFIG[rows]
    acc_name = "float64" if io_name == "float64" else "float32"
    acc = _accumulator(io_name)
    gate, _ = _gate_funcs(acc_name)
    module = f"warpkan_geglu_small{rows}_{io_name}"
    kernel = functools.partial(wp.kernel, enable_backward=False, module=module)
    ROWS = rows
    UP_W = 2 * cols  # weight rows per block in the first projection: the u rows then the v rows
    DOWN_W = cols
    U = unroll
    mat_up = wp.types.matrix(shape=(UP_W, ROWS), dtype=acc)
    mat_down = wp.types.matrix(shape=(DOWN_W, ROWS), dtype=acc)
    wbuf_up = wp.types.matrix(shape=(U, UP_W), dtype=acc)
    wbuf_down = wp.types.matrix(shape=(U, DOWN_W), dtype=acc)
    xbuf = wp.types.matrix(shape=(U, ROWS), dtype=acc)
    ids_up = wp.types.vector(length=UP_W, dtype=int)
    ids_down = wp.types.vector(length=DOWN_W, dtype=int)

    def make_stream_dot(W, mat_t, wbuf_t, ids_t):
        @wp.func
        def stream_dot(
            act: wp.array2d(dtype=io),
            weight: wp.array2d(dtype=io),
            row_ids: ids_t,
            n_rows: int,
            lane: int,
            block_dim: int,
        ):
            """This thread's share of sum_k act[r, k] weight[row_ids[c], k] for every (c, r); weight
            rows with id -1 and rows r >= n_rows contribute zero. Threads of a block take consecutive k
            (coalesced); each step issues U * W independent weight loads before using them."""
            n_k = act.shape[1]
            total = mat_t()
            step = block_dim * U
            for k0 in range(lane, n_k, step):
                w = wbuf_t()
                for u in range(U):
                    k = k0 + u * block_dim
                    if k < n_k:
                        for c in range(W):
                            if row_ids[c] >= 0:
                                w[u, c] = acc(weight[row_ids[c], k])
                xs = xbuf()
                for u in range(U):
                    k = k0 + u * block_dim
                    if k < n_k:
                        for r in range(ROWS):
                            if r < n_rows:
                                xs[u, r] = acc(act[r, k])
                for u in range(U):
                    for c in range(W):
                        for r in range(ROWS):
                            total[c, r] = total[c, r] + w[u, c] * xs[u, r]
            return total

        return stream_dot

    stream_up = make_stream_dot(UP_W, mat_up, wbuf_up, ids_up)
    stream_down = make_stream_dot(DOWN_W, mat_down, wbuf_down, ids_down)

    @kernel
    def up_projection(
        x: wp.array2d(dtype=io),
        w_uv: wp.array2d(dtype=io),
        b_uv: wp.array1d(dtype=io),
        use_bias: int,
        n_rows: int,
        code: int,
        uv: wp.array2d(dtype=io),
        h: wp.array2d(dtype=io),
    ):
        block, lane = wp.tid()
        block_dim = wp.block_dim()
        n_inter = h.shape[1]
        j0 = block * cols
        ids = ids_up()
        for c in range(cols):
            j = j0 + c
            ids[c] = -1
            ids[cols + c] = -1
            if j < n_inter:
                ids[c] = j
                ids[cols + c] = n_inter + j
        partial = stream_up(x, w_uv, ids, n_rows, lane, block_dim)
        total = wp.tile_sum(wp.tile(partial, preserve_type=True))[0]
        # epilogue: the block's threads share the (column, row) outputs
        for idx in range(lane, cols * ROWS, block_dim):
            c = idx // ROWS
            r = idx - c * ROWS
            j = j0 + c
            if r < n_rows and j < n_inter:
                u = total[c, r]
                v = total[cols + c, r]
                if use_bias:
                    u = u + acc(b_uv[j])
                    v = v + acc(b_uv[n_inter + j])
                uv[r, j] = io(u)
                uv[r, n_inter + j] = io(v)
                h[r, j] = io(gate(u, code) * v)

    @kernel
    def down_projection(
        h: wp.array2d(dtype=io),
        w_o: wp.array2d(dtype=io),
        b_o: wp.array1d(dtype=io),
        use_bias: int,
        n_rows: int,
        out: wp.array2d(dtype=io),
    ):
        block, lane = wp.tid()
        block_dim = wp.block_dim()
        n_out = out.shape[1]
        o0 = block * cols
        ids = ids_down()
        for c in range(cols):
            ids[c] = -1
            if o0 + c < n_out:
                ids[c] = o0 + c
        partial = stream_down(h, w_o, ids, n_rows, lane, block_dim)
        total = wp.tile_sum(wp.tile(partial, preserve_type=True))[0]
        for idx in range(lane, cols * ROWS, block_dim):
            c = idx // ROWS
            r = idx - c * ROWS
            o = o0 + c
            if r < n_rows and o < n_out:
                y = total[c, r]
                if use_bias:
                    y = y + acc(b_o[o])
                out[r, o] = io(y)

    return SmallVariant(io_name, rows, cols, up_block_dim, down_block_dim, up_projection, down_projection, module)


# ---------------------------------------------------------------------------------------------- launchers


def _io_name(a: wp.array) -> str:
    for name, scalar in _IO_SCALARS.items():
        if a.dtype == scalar:
            return name
    raise TypeError(f"arrays must be float16, bfloat16, float32 or float64, got {a.dtype}")


def _check(name: str, a: wp.array, shape: tuple, io_name: str) -> None:
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(a.shape)}")
    if _io_name(a) != io_name:
        raise TypeError(f"{name} must have dtype {io_name}, got {_io_name(a)}")


_empty_vectors: dict = {}


def _empty_vector(io_name: str, device) -> "wp.array1d":
    key = (io_name, str(device))
    found = _empty_vectors.get(key)
    if found is None:
        found = _empty_vectors[key] = wp.empty(0, dtype=_IO_SCALARS[io_name], device=device)
    return found


def launch_activation(
    uv: "wp.array2d", h: "wp.array2d", activation: str, stream: "wp.Stream | None" = None, record: bool = False
):
    """h[m, j] = gelu(uv[m, j]) * uv[m, inter + j]. With ``record=True`` nothing runs: the launch comes back
    as a list of ``wp.Launch`` to replay with ``.launch(stream)`` (what the torch ops cache)."""
    io_name = _io_name(uv)
    n_rows, n_inter = h.shape
    _check("uv", uv, (n_rows, 2 * n_inter), io_name)
    _check("h", h, (n_rows, n_inter), io_name)
    if n_rows == 0 or n_inter == 0:
        return [] if record else None
    variant = get_variant(io_name)
    cmd = wp.launch(
        variant.activation_forward,
        dim=(n_rows, n_inter),
        inputs=[uv, activation_code(activation)],
        outputs=[h],
        device=uv.device,
        stream=stream,
        record_tape=False,
        record_cmd=record,
    )
    return [cmd] if record else None


def launch_activation_backward(
    dh: "wp.array2d",
    uv: "wp.array2d",
    duv: "wp.array2d",
    h: "wp.array2d",
    activation: str,
    stream: "wp.Stream | None" = None,
    record: bool = False,
):
    """Writes (does not accumulate) duv = [dh v gelu'(u) | dh gelu(u)] and the recomputed h = gelu(u) v.
    Both are intermediates of the layer, never parameter gradients."""
    io_name = _io_name(uv)
    n_rows, n_inter = dh.shape
    _check("uv", uv, (n_rows, 2 * n_inter), io_name)
    _check("dh", dh, (n_rows, n_inter), io_name)
    _check("duv", duv, (n_rows, 2 * n_inter), io_name)
    _check("h", h, (n_rows, n_inter), io_name)
    if n_rows == 0 or n_inter == 0:
        return [] if record else None
    variant = get_variant(io_name)
    cmd = wp.launch(
        variant.activation_backward,
        dim=(n_rows, n_inter),
        inputs=[dh, uv, activation_code(activation)],
        outputs=[duv, h],
        device=uv.device,
        stream=stream,
        record_tape=False,
        record_cmd=record,
    )
    return [cmd] if record else None


def launch_small_forward(
    x: "wp.array2d",
    w_uv: "wp.array2d",
    b_uv: "wp.array1d | None",
    w_o: "wp.array2d",
    b_o: "wp.array1d | None",
    uv: "wp.array2d",
    h: "wp.array2d",
    out: "wp.array2d",
    activation: str,
    stream: "wp.Stream | None" = None,
    record: bool = False,
):
    """The whole layer for at most ``MAX_SMALL_ROWS`` rows by weight streaming: writes uv (the
    pre-activations, kept for the backward), h and out."""
    io_name = _io_name(x)
    n_rows, n_hidden = x.shape
    n_inter = w_o.shape[1]
    _check("w_uv", w_uv, (2 * n_inter, n_hidden), io_name)
    _check("w_o", w_o, (n_hidden, n_inter), io_name)
    if b_uv is not None:
        _check("b_uv", b_uv, (2 * n_inter,), io_name)
    if b_o is not None:
        _check("b_o", b_o, (n_hidden,), io_name)
    _check("uv", uv, (n_rows, 2 * n_inter), io_name)
    _check("h", h, (n_rows, n_inter), io_name)
    _check("out", out, (n_rows, n_hidden), io_name)
    if n_rows == 0:
        return [] if record else None
    variant = get_small_variant(io_name, small_rows_bucket(n_rows))
    device = x.device
    cols = variant.cols_per_block
    code = activation_code(activation)
    # a bias-less launch still needs an array argument of the right type; the kernels do not read it
    b_uv_arg = b_uv if b_uv is not None else _empty_vector(io_name, device)
    b_o_arg = b_o if b_o is not None else _empty_vector(io_name, device)
    up = wp.launch_tiled(
        variant.up_projection,
        dim=[-(-n_inter // cols)],
        inputs=[x, w_uv, b_uv_arg, int(b_uv is not None), n_rows, code],
        outputs=[uv, h],
        device=device,
        stream=stream,
        block_dim=variant.up_block_dim,
        record_tape=False,
        record_cmd=record,
    )
    if n_hidden == 0:
        return [up] if record else None
    down = wp.launch_tiled(
        variant.down_projection,
        dim=[-(-n_hidden // cols)],
        inputs=[h, w_o, b_o_arg, int(b_o is not None), n_rows],
        outputs=[out],
        device=device,
        stream=stream,
        block_dim=variant.down_block_dim,
        record_tape=False,
        record_cmd=record,
    )
    return [up, down] if record else None


# ------------------------------------------------------------------------ tensor-core weight streaming
#
# At small batch the layer reads 3 * hidden * inter weights and does 2 * batch FLOPs per weight: plain
# float32 FMAs stop keeping up with HBM from about 8 rows on, so the streaming kernels multiply on the
# tensor cores (mma.sync m16n8k16, float16/bfloat16 in, float32 accumulation) and are then bound by the
# weight reads alone. Warp has no mma builtin, so the inner loop is a native snippet (``wp.func_native``);
# the CPU (and pre-sm_80 GPUs) run a plain loop in the same snippet that computes exactly the values the
# lane would hold, so the kernels, their indexing and their outputs are the same everywhere.
#
# One warp owns TC_ROW_TILE rows of each of two weight tiles (the u rows j and the v rows inter + j in the
# first projection, 32 consecutive output rows in the second) and one slice of the reduction dimension.
# mma's A fragment wants, per lane, elements (row g, k 2t..2t+1) and (row g, k 2t+8..2t+9); a sum over k
# may take the k in any order, so lane (g, t) instead reads 32 contiguous bytes of rows g and g + 8 (two
# 16-byte loads each) per 64-k block and feeds them to four mma steps. x (or h) is read the same way, so
# A and B agree on the order. Each warp writes its float32 partial sums to partial[split, row, col]; a
# fixed-order combine kernel adds the splits and applies the epilogue (bias and gate for the first
# projection, bias and the cast for the second): bitwise reproducible.

TC_K_BLOCK = 64
TC_ROW_TILE = 16
TC_MAX_ROWS = 64
TC_IO = ("float16", "bfloat16")
TC_TARGET_WARPS = 2048  # warps per projection wanted in flight; the reduction is split until there are
TC_N_TILES = (1, 2, 4, 8)  # batch capacities of 8, 16, 32, 64 rows
TC_UNROLL = 2  # 64-k blocks per unrolled step of the reduction loop (more weight loads in flight)

_TC_SNIPPET = """
    const int g = lane >> 2;
    const int t = lane & 3;
    const int MT = 2;
    const int NT = @NT@;
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
    float acc[MT][NT][4];
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
        #pragma unroll
        for (int nt = 0; nt < NT; ++nt)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
    const char* wrow[MT][2];
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
        #pragma unroll
        for (int h = 0; h < 2; ++h)
            wrow[mt][h] = (const char*)w.data + (long long)(row0 + mt * row_step + g + 8 * h) * w.strides[0];
    const char* xrow[NT];
    #pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        int r = nt * 8 + g;
        r = r < n_rows ? r : n_rows - 1;  // rows past the batch only feed output columns that are dropped
        xrow[nt] = (const char*)x.data + (long long)r * x.strides[0];
    }
    #pragma unroll @UNROLL@
    for (int k = k_begin + 16 * t; k < k_end; k += 64) {
        unsigned int wa[MT][2][8];
        unsigned int xb[NT][8];
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                const char* p = wrow[mt][h] + 2 * (long long)k;
                asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                    : "=r"(wa[mt][h][0]), "=r"(wa[mt][h][1]), "=r"(wa[mt][h][2]), "=r"(wa[mt][h][3]) : "l"(p));
                asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                    : "=r"(wa[mt][h][4]), "=r"(wa[mt][h][5]), "=r"(wa[mt][h][6]), "=r"(wa[mt][h][7]) : "l"(p + 16));
            }
        #pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const char* p = xrow[nt] + 2 * (long long)k;
            asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                : "=r"(xb[nt][0]), "=r"(xb[nt][1]), "=r"(xb[nt][2]), "=r"(xb[nt][3]) : "l"(p));
            asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                : "=r"(xb[nt][4]), "=r"(xb[nt][5]), "=r"(xb[nt][6]), "=r"(xb[nt][7]) : "l"(p + 16));
        }
        #pragma unroll
        for (int s = 0; s < 4; ++s)
            #pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                #pragma unroll
                for (int nt = 0; nt < NT; ++nt)
                    asm("mma.sync.aligned.m16n8k16.row.col.f32.@MMA@.@MMA@.f32 "
                        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                        : "+f"(acc[mt][nt][0]), "+f"(acc[mt][nt][1]), "+f"(acc[mt][nt][2]), "+f"(acc[mt][nt][3])
                        : "r"(wa[mt][0][2 * s]), "r"(wa[mt][1][2 * s]), "r"(wa[mt][0][2 * s + 1]),
                          "r"(wa[mt][1][2 * s + 1]), "r"(xb[nt][2 * s]), "r"(xb[nt][2 * s + 1]));
    }
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
        #pragma unroll
        for (int nt = 0; nt < NT; ++nt)
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int n = nt * 8 + 2 * t + (e & 1);
                if (n < n_rows)
                    *wp::address(partial, split, n, row0 + mt * row_step + g + 8 * (e >> 1)) = acc[mt][nt][e];
            }
#else
    for (int mt = 0; mt < MT; ++mt)
        for (int nt = 0; nt < NT; ++nt)
            for (int e = 0; e < 4; ++e) {
                const int n = nt * 8 + 2 * t + (e & 1);
                const int row = row0 + mt * row_step + g + 8 * (e >> 1);
                if (n >= n_rows) continue;
                float total = 0.0f;
                for (int k = k_begin; k < k_end; ++k)
                    total += float(*wp::address(w, row, k)) * float(*wp::address(x, n, k));
                *wp::address(partial, split, n, row) = total;
            }
#endif
"""


@dataclass(frozen=True)
class TensorCoreVariant:
    """The tensor-core weight-streaming kernels of one (I/O type, batch capacity of 8 * n_tiles rows)."""

    io_name: str
    n_tiles: int
    projection: wp.Kernel
    gate_combine: wp.Kernel
    out_combine: wp.Kernel
    module: str


def tc_n_tiles(n_rows: int) -> int:
    """The compiled batch capacity (in 8-row tiles) that serves ``n_rows`` (1 .. TC_MAX_ROWS)."""
    for n_tiles in TC_N_TILES:
        if n_rows <= 8 * n_tiles:
            return n_tiles
    raise ValueError(f"the tensor-core streaming path takes at most {TC_MAX_ROWS} rows, got {n_rows}")


def tc_eligible(io_name: str, n_rows: int, n_hidden: int, n_inter: int) -> bool:
    """Whether the tensor-core streaming path serves this shape (the caller also checks 16-byte alignment
    of x, w_uv and w_o)."""
    return (
        io_name in TC_IO
        and 1 <= n_rows <= TC_MAX_ROWS
        and n_hidden > 0
        and n_inter > 0
        and n_hidden % TC_K_BLOCK == 0
        and n_inter % TC_K_BLOCK == 0
    )


def tc_splits(n_hidden: int, n_inter: int, target_warps: int = 0) -> tuple:
    """(splits of the first projection's reduction, splits of the second's): enough warps to keep the
    weight reads in flight, whole 64-k blocks per split."""
    target = target_warps or TC_TARGET_WARPS

    def splits(groups: int, k: int) -> int:
        blocks = k // TC_K_BLOCK
        wanted = min(blocks, max(1, -(-target // groups)))
        per = -(-blocks // wanted)
        return -(-blocks // per)  # no empty split

    return splits(n_inter // TC_ROW_TILE, n_hidden), splits(n_hidden // (2 * TC_ROW_TILE), n_inter)


@functools.lru_cache(maxsize=None)
def get_tc_variant(io_name: str, n_tiles: int, unroll: int = 0) -> TensorCoreVariant:
    if io_name not in TC_IO:
        raise TypeError(f"the tensor-core path takes float16 or bfloat16, got {io_name}")
    if n_tiles not in TC_N_TILES:
        raise ValueError(f"n_tiles must be one of {TC_N_TILES}, got {n_tiles}")
    io = _io_scalar(io_name)
    gate, _ = _gate_funcs("float32")
    unroll = unroll or TC_UNROLL
    module = f"warpkan_geglu_tc{n_tiles}_u{unroll}_{io_name}"
    kernel = functools.partial(wp.kernel, enable_backward=False, module=module)
    snippet = _TC_SNIPPET.replace("@NT@", str(n_tiles)).replace("@UNROLL@", str(unroll)).replace("@MMA@", "f16" if io_name == "float16" else "bf16")

    @wp.func_native(snippet)
    def warp_tile_product(
        w: wp.array2d(dtype=io),
        x: wp.array2d(dtype=io),
        partial: wp.array3d(dtype=wp.float32),
        row0: int,
        row_step: int,
        n_rows: int,
        k_begin: int,
        k_end: int,
        split: int,
        lane: int,
    ): ...

    @kernel
    def projection(
        x: wp.array2d(dtype=io),
        w: wp.array2d(dtype=io),
        n_rows: int,
        group_rows: int,
        row_step: int,
        n_groups: int,
        k_per_split: int,
        partial: wp.array3d(dtype=wp.float32),
    ):
        # consecutive warps share a reduction slice (so its x stays in L1) and take consecutive row groups
        tid = wp.tid()
        lane = tid % 32
        warp = tid // 32
        split = warp // n_groups
        group = warp - split * n_groups
        k_begin = split * k_per_split
        k_end = wp.min(k_begin + k_per_split, x.shape[1])
        warp_tile_product(w, x, partial, group * group_rows, row_step, n_rows, k_begin, k_end, split, lane)

    @kernel
    def gate_combine(
        partial: wp.array3d(dtype=wp.float32),
        b_uv: wp.array1d(dtype=io),
        use_bias: int,
        code: int,
        uv: wp.array2d(dtype=io),
        h: wp.array2d(dtype=io),
    ):
        m, j = wp.tid()
        n_inter = h.shape[1]
        u = float(0.0)
        v = float(0.0)
        for s in range(partial.shape[0]):
            u += partial[s, m, j]
            v += partial[s, m, n_inter + j]
        if use_bias:
            u += float(b_uv[j])
            v += float(b_uv[n_inter + j])
        uv[m, j] = io(u)
        uv[m, n_inter + j] = io(v)
        h[m, j] = io(gate(u, code) * v)

    @kernel
    def out_combine(
        partial: wp.array3d(dtype=wp.float32), b_o: wp.array1d(dtype=io), use_bias: int, out: wp.array2d(dtype=io)
    ):
        m, o = wp.tid()
        y = float(0.0)
        for s in range(partial.shape[0]):
            y += partial[s, m, o]
        if use_bias:
            y += float(b_o[o])
        out[m, o] = io(y)

    return TensorCoreVariant(io_name, n_tiles, projection, gate_combine, out_combine, module)


def launch_tc_forward(
    x: "wp.array2d",
    w_uv: "wp.array2d",
    b_uv: "wp.array1d | None",
    w_o: "wp.array2d",
    b_o: "wp.array1d | None",
    uv: "wp.array2d",
    h: "wp.array2d",
    out: "wp.array2d",
    partial_up: "wp.array3d",
    partial_down: "wp.array3d",
    activation: str,
    stream: "wp.Stream | None" = None,
    record: bool = False,
):
    """The whole layer by tensor-core weight streaming (see :func:`tc_eligible`): writes uv, h and out.
    ``partial_up`` [splits, N, 2 inter] and ``partial_down`` [splits, N, hidden] are float32 scratch whose
    first dimensions set the reduction splits (:func:`tc_splits`). x, w_uv and w_o must be 16-byte aligned
    with row strides that are multiples of 16 bytes."""
    io_name = _io_name(x)
    n_rows, n_hidden = x.shape
    n_inter = w_o.shape[1]
    if not tc_eligible(io_name, n_rows, n_hidden, n_inter):
        raise ValueError(f"the tensor-core path does not serve {io_name} [{n_rows}, {n_hidden}] x {n_inter}")
    _check("w_uv", w_uv, (2 * n_inter, n_hidden), io_name)
    _check("w_o", w_o, (n_hidden, n_inter), io_name)
    if b_uv is not None:
        _check("b_uv", b_uv, (2 * n_inter,), io_name)
    if b_o is not None:
        _check("b_o", b_o, (n_hidden,), io_name)
    _check("uv", uv, (n_rows, 2 * n_inter), io_name)
    _check("h", h, (n_rows, n_inter), io_name)
    _check("out", out, (n_rows, n_hidden), io_name)
    split_up, split_down = partial_up.shape[0], partial_down.shape[0]
    _check("partial_up", partial_up, (split_up, n_rows, 2 * n_inter), "float32")
    _check("partial_down", partial_down, (split_down, n_rows, n_hidden), "float32")
    for name, a in (("x", x), ("w_uv", w_uv), ("w_o", w_o), ("h", h)):
        if a.ptr % 16 or a.strides[0] % 16 or not a.is_contiguous:
            raise ValueError(f"{name} must be 16-byte aligned for the tensor-core path")
    variant = get_tc_variant(io_name, tc_n_tiles(n_rows), TC_UNROLL)
    device = x.device
    code = activation_code(activation)
    b_uv_arg = b_uv if b_uv is not None else _empty_vector(io_name, device)
    b_o_arg = b_o if b_o is not None else _empty_vector(io_name, device)
    common = {"device": device, "stream": stream, "record_tape": False, "record_cmd": record}
    cmds = []

    def projection(act, weight, group_rows, row_step, n_groups, splits, partial):
        k_blocks = act.shape[1] // TC_K_BLOCK
        k_per_split = -(-k_blocks // splits) * TC_K_BLOCK
        cmds.append(wp.launch(
            variant.projection, dim=n_groups * splits * 32,
            inputs=[act, weight, n_rows, group_rows, row_step, n_groups, k_per_split], outputs=[partial],
            block_dim=128, **common,
        ))

    projection(x, w_uv, TC_ROW_TILE, n_inter, n_inter // TC_ROW_TILE, split_up, partial_up)
    cmds.append(wp.launch(
        variant.gate_combine, dim=(n_rows, n_inter), inputs=[partial_up, b_uv_arg, int(b_uv is not None), code],
        outputs=[uv, h], **common,
    ))
    projection(h, w_o, 2 * TC_ROW_TILE, TC_ROW_TILE, n_hidden // (2 * TC_ROW_TILE), split_down, partial_down)
    cmds.append(wp.launch(
        variant.out_combine, dim=(n_rows, n_hidden), inputs=[partial_down, b_o_arg, int(b_o is not None)],
        outputs=[out], **common,
    ))
    return cmds if record else None


# ------------------------------------------------------------------------------- read-bandwidth probe
#
# The ceiling the weight-streaming kernels are measured against: every thread sums 16-byte words of a
# buffer (grid-stride, four independent loads in flight, no L1 allocation) and writes one value so that
# nothing is optimised away. Only reads reach HBM, unlike a device-to-device copy.

_PROBE_SNIPPET = """
#if defined(__CUDA_ARCH__)
    const uint4* p = (const uint4*)data.data;
    const long long n = (long long)data.shape[0] * data.strides[0] / 16;
    unsigned int s = 0;
    long long i = tid;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a, b, c, d;
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(a.x), "=r"(a.y), "=r"(a.z), "=r"(a.w) : "l"(p + i));
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(b.x), "=r"(b.y), "=r"(b.z), "=r"(b.w) : "l"(p + i + stride));
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(c.x), "=r"(c.y), "=r"(c.z), "=r"(c.w) : "l"(p + i + 2 * stride));
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(d.x), "=r"(d.y), "=r"(d.z), "=r"(d.w) : "l"(p + i + 3 * stride));
        s += a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        const uint4 a = p[i];
        s += a.x ^ a.y ^ a.z ^ a.w;
    }
    out.data[tid] = (int)s;
#else
    const unsigned char* p = (const unsigned char*)data.data;
    const long long n = (long long)data.shape[0] * data.strides[0];
    unsigned int s = 0;
    for (long long i = tid; i < n; i += stride) s += p[i];
    out.data[tid] = (int)s;
#endif
"""


@functools.lru_cache(maxsize=None)
def _probe_kernel():
    @wp.func_native(_PROBE_SNIPPET)
    def read_words(data: wp.array2d(dtype=wp.float16), out: wp.array1d(dtype=wp.int32), tid: int, stride: int): ...

    @wp.kernel(enable_backward=False, module="warpkan_geglu_probe")
    def read_probe(data: wp.array2d(dtype=wp.float16), out: wp.array1d(dtype=wp.int32)):
        tid = wp.tid()
        read_words(data, out, tid, out.shape[0])

    return read_probe


def launch_read_probe(data: "wp.array2d", out: "wp.array1d", block_dim: int = 256, stream=None, record: bool = False):
    """Reads every byte of the contiguous float16 matrix ``data`` once with ``out.shape[0]`` threads (a
    multiple of ``block_dim``; pick a multiple of the SM count in blocks) and writes a checksum per thread."""
    if not data.is_contiguous:
        raise ValueError("data must be contiguous")
    cmd = wp.launch(
        _probe_kernel(), dim=out.shape[0], inputs=[data], outputs=[out], device=data.device, stream=stream,
        block_dim=block_dim, record_tape=False, record_cmd=record,
    )
    return [cmd] if record else None
