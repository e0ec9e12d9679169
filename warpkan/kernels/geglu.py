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
