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

from .. import _checks
from ._common import dense_vector_view, dense_vector_width, vector_io
from ._modules import DEFAULT_BLOCK_DIM, ModuleBuild, distinct
from ._dependent_launch import (DEPENDENTS_SNIPPET, WAIT_SNIPPET, DependentLaunch, allow_dependents,
                                wait_for_previous_grid)
from ._runtime import launch

__all__ = [
    "check_layer_args",
    "ACTIVATIONS",
    "MAX_SMALL_ROWS",
    "DEFAULT_SMALL_BATCH_ROWS",
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
    "TC_CONFIG",
    "TensorCoreVariant",
    "StreamPlan",
    "get_tc_variant",
    "stream_plan",
    "tc_eligible",
    "tc_n_tiles",
    "tc_plans",
    "device_shape",
    "resident_warps_per_sm",
    "launch_tc_forward",
    "geglu_modules",
    "launch_read_probe",
]

ACTIVATIONS = ("gelu", "gelu_tanh", "gelu_sigmoid")
MAX_SMALL_ROWS = 16

# Measured on an H200 (fp16, 4096/12288, CUDA-graph replay; docs/perf-notes-geglu.md): the tensor-core
# streaming path, with its last three launches as programmatic dependents, takes 0.082-0.085 ms for 4-8 rows
# (its first projection alone streams at 3.9-4.0 TB/s, the second at 3.6, against 4.35-4.45 TB/s for the
# Warp read probe over the same two buffers), 5-7% ahead of cuBLAS GEMM+gate (0.089 in the same run), and
# falls behind it from 16 rows on (the batch rows take a growing share of each copy stage and of the mma
# work). So streaming serves up to 8 rows.
DEFAULT_SMALL_BATCH_ROWS = 8

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
    return ACTIVATIONS.index(_checks.one_of("activation", activation, ACTIVATIONS))


def check_layer_args(hidden, intermediate, activation, small_batch_rows) -> tuple:
    """The arguments of the GEGLU FFN layer, checked and normalised: ``(hidden, intermediate, activation,
    small_batch_rows)``. Raises TypeError/ValueError naming the argument (rules: :mod:`warpkan._checks`),
    before anything is allocated."""
    hidden = _checks.positive_int("hidden", hidden)
    intermediate = _checks.positive_int("intermediate", intermediate)
    activation_code(activation)
    small_batch_rows = _checks.non_negative_int("small_batch_rows", small_batch_rows)
    _checks.fits_index("w_uv", (2 * intermediate, hidden), hidden=hidden, intermediate=intermediate)
    return hidden, intermediate, activation, small_batch_rows


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
    """The element-wise kernels of one I/O type and vector width (elements a thread reads with one access)."""

    io_name: str
    vec: int
    io_vector: type
    activation_forward: wp.Kernel
    activation_backward: wp.Kernel
    module: str


@functools.lru_cache(maxsize=None)
def get_variant(io_name: str, vec: int = 1) -> GEGLUVariant:
    io = _io_scalar(io_name)
    acc_name = "float64" if io_name == "float64" else "float32"
    acc = _accumulator(io_name)
    gate, gate_and_grad = _gate_funcs(acc_name)
    io_vec = wp.types.vector(length=vec, dtype=io)
    acc_vec = wp.types.vector(length=vec, dtype=acc)
    # one access a vector of `vec` elements (16 bytes at the widest) for dense rows, Warp's indexing otherwise
    load, widen, store = vector_io(io_vec)
    module = f"warpkan_geglu_{io_name}_v{vec}"
    kernel = functools.partial(wp.kernel, enable_backward=False, module=module)

    @kernel
    def activation_forward(uv: wp.array2d(dtype=io_vec), code: int, h: wp.array2d(dtype=io_vec)):
        # consecutive threads on consecutive vectors: u and v reads and the h write all coalesce
        m, j = wp.tid()
        u = widen(load(uv, m, j))
        v = widen(load(uv, m, h.shape[1] + j))
        out = acc_vec()
        for k in range(vec):
            out[k] = gate(u[k], code) * v[k]
        store(h, m, j, out)

    @kernel
    def activation_backward(
        dh: wp.array2d(dtype=io_vec),
        uv: wp.array2d(dtype=io_vec),
        code: int,
        duv: wp.array2d(dtype=io_vec),
        h: wp.array2d(dtype=io_vec),
    ):
        # du = dh v gelu'(u), dv = dh gelu(u); h = gelu(u) v is recomputed for the W_o gradient
        m, j = wp.tid()
        n_vec = h.shape[1]
        u = widen(load(uv, m, j))
        v = widen(load(uv, m, n_vec + j))
        d = widen(load(dh, m, j))
        du = acc_vec()
        dv = acc_vec()
        hv = acc_vec()
        for k in range(vec):
            g, dg = gate_and_grad(u[k], code)
            du[k] = d[k] * v[k] * dg
            dv[k] = d[k] * g
            hv[k] = g * v[k]
        store(duv, m, j, du)
        store(duv, m, n_vec + j, dv)
        store(h, m, j, hv)

    return GEGLUVariant(io_name, vec, io_vec, activation_forward, activation_backward, module)


_GATE_ARRAYS = "the gate kernels' arrays"  # what a non-contiguous array is called in the error


def gate_vector_width(arrays: "tuple[wp.array, ...]", n_inter: int) -> int:
    """Elements a thread of the gate kernels reads with one access: the widest power of two up to 16 bytes
    that divides ``n_inter`` and keeps every row of every array aligned (the launchers' vector views refuse
    non-contiguous arrays: the kernels address dense rows)."""
    return dense_vector_width(wp.types.type_size_in_bytes(arrays[0].dtype), n_inter, [a.ptr for a in arrays])


def _gate_variant_and_views(io_name: str, n_inter: int, arrays: "tuple[wp.array, ...]") -> tuple:
    """The gate kernels of ``arrays`` (at their :func:`gate_vector_width`) and the arrays as those kernels'
    vector views, in order."""
    variant = get_variant(io_name, gate_vector_width(arrays, n_inter))
    return variant, [dense_vector_view(a, variant.io_vector, _GATE_ARRAYS) for a in arrays]


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


# get_small_variant assembles a SmallVariant from the factories below, each cached on its arguments (I/O type,
# row capacity), so that a combination builds each @wp.func and kernel once. Each factory closes over the
# types and sizes of _small_config under the names its @wp.funcs and kernels use: Warp resolves those names
# when it generates code, and the names and values are part of the module's hash.


@dataclass(frozen=True, eq=False)
class _SmallConfig:
    """The types and sizes of one (I/O type, row capacity) of the weight-streaming kernels (see _small_config)."""

    io: type
    acc: type
    acc_name: str
    cols: int  # output columns per block
    up_block_dim: int
    down_block_dim: int
    ROWS: int  # the row capacity
    U: int  # unroll: the k steps whose weight loads a thread issues before using them
    UP_W: int  # weight rows per block in the first projection: the u rows then the v rows
    DOWN_W: int  # weight rows per block in the second projection
    mat_up: type  # the (weight row, row) sums of one block
    mat_down: type
    wbuf_up: type  # the weights of one step
    wbuf_down: type
    xbuf: type  # the activations of one step
    ids_up: type  # the weight rows of one block (-1: none)
    ids_down: type
    module: str


@functools.lru_cache(maxsize=None)
def _small_config(io_name: str, rows: int) -> _SmallConfig:
    """The arguments of get_small_variant checked (TypeError/ValueError naming the bad one), and what follows
    from them."""
    io = _io_scalar(io_name)
    if rows not in _SMALL_CONFIG:
        raise ValueError(f"row capacity must be one of {sorted(_SMALL_CONFIG)}, got {rows}")
    cols, unroll, up_block_dim, down_block_dim = _SMALL_CONFIG[rows]
    acc = _accumulator(io_name)
    UP_W = 2 * cols
    DOWN_W = cols
    return _SmallConfig(
        io=io,
        acc=acc,
        acc_name="float64" if io_name == "float64" else "float32",
        cols=cols,
        up_block_dim=up_block_dim,
        down_block_dim=down_block_dim,
        ROWS=rows,
        U=unroll,
        UP_W=UP_W,
        DOWN_W=DOWN_W,
        mat_up=wp.types.matrix(shape=(UP_W, rows), dtype=acc),
        mat_down=wp.types.matrix(shape=(DOWN_W, rows), dtype=acc),
        wbuf_up=wp.types.matrix(shape=(unroll, UP_W), dtype=acc),
        wbuf_down=wp.types.matrix(shape=(unroll, DOWN_W), dtype=acc),
        xbuf=wp.types.matrix(shape=(unroll, rows), dtype=acc),
        ids_up=wp.types.vector(length=UP_W, dtype=int),
        ids_down=wp.types.vector(length=DOWN_W, dtype=int),
        module=f"warpkan_geglu_small{rows}_{io_name}",
    )


def _small_kernel_decorator(cfg: _SmallConfig):
    """``wp.kernel`` without a backward pass, into the combination's module."""
    return functools.partial(wp.kernel, enable_backward=False, module=cfg.module)


@functools.lru_cache(maxsize=None)
def _stream_dot_func(io_name: str, rows: int, projection: str):
    """stream_dot of the first (``projection`` "up": UP_W weight rows) or the second ("down": DOWN_W) projection:
    a thread's share of the block's (weight row, row) sums."""
    cfg = _small_config(io_name, rows)
    io, acc, ROWS, U, xbuf = cfg.io, cfg.acc, cfg.ROWS, cfg.U, cfg.xbuf
    if projection == "up":
        W, mat_t, wbuf_t, ids_t = cfg.UP_W, cfg.mat_up, cfg.wbuf_up, cfg.ids_up
    else:
        W, mat_t, wbuf_t, ids_t = cfg.DOWN_W, cfg.mat_down, cfg.wbuf_down, cfg.ids_down

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


@functools.lru_cache(maxsize=None)
def _up_projection_kernel(io_name: str, rows: int):
    """uv = x W_uv^T (+ b_uv) and h = gate(u) v: one block per `cols` columns of u and of v."""
    cfg = _small_config(io_name, rows)
    io, acc, cols, ROWS, ids_up = cfg.io, cfg.acc, cfg.cols, cfg.ROWS, cfg.ids_up
    kernel = _small_kernel_decorator(cfg)
    gate, _ = _gate_funcs(cfg.acc_name)
    stream_up = _stream_dot_func(io_name, rows, "up")

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

    return up_projection


@functools.lru_cache(maxsize=None)
def _down_projection_kernel(io_name: str, rows: int):
    """out = h W_o^T (+ b_o): one block per `cols` output columns."""
    cfg = _small_config(io_name, rows)
    io, acc, cols, ROWS, ids_down = cfg.io, cfg.acc, cfg.cols, cfg.ROWS, cfg.ids_down
    kernel = _small_kernel_decorator(cfg)
    stream_down = _stream_dot_func(io_name, rows, "down")

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

    return down_projection


@functools.lru_cache(maxsize=None)
def get_small_variant(io_name: str, rows: int) -> SmallVariant:
    """Build (lazily) the weight-streaming kernels of one (I/O type, row capacity); they share one Warp
    module."""
    cfg = _small_config(io_name, rows)
    return SmallVariant(io_name, rows, cfg.cols, cfg.up_block_dim, cfg.down_block_dim,
                        _up_projection_kernel(io_name, rows), _down_projection_kernel(io_name, rows), cfg.module)


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
    variant, (uv_vec, h_vec) = _gate_variant_and_views(io_name, n_inter, (uv, h))
    return launch(variant.activation_forward, (n_rows, n_inter // variant.vec), [uv_vec, activation_code(activation)],
                  [h_vec], device=uv.device, stream=stream, record=record)


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
    variant, (dh_vec, uv_vec, duv_vec, h_vec) = _gate_variant_and_views(io_name, n_inter, (dh, uv, duv, h))
    return launch(variant.activation_backward, (n_rows, n_inter // variant.vec),
                  [dh_vec, uv_vec, activation_code(activation)], [duv_vec, h_vec], device=uv.device, stream=stream,
                  record=record)


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
    cmds = launch(variant.up_projection, [-(-n_inter // cols)], [x, w_uv, b_uv_arg, int(b_uv is not None), n_rows, code],
                  [uv, h], device=device, stream=stream, record=record, block_dim=variant.up_block_dim, tiled=True)
    if n_hidden == 0:
        return cmds
    down = launch(variant.down_projection, [-(-n_hidden // cols)], [h, w_o, b_o_arg, int(b_o is not None), n_rows],
                  [out], device=device, stream=stream, record=record, block_dim=variant.down_block_dim, tiled=True)
    return cmds + down if record else None


# ------------------------------------------------------------------------ tensor-core weight streaming
#
# At small batch the layer reads 3 * hidden * inter weights and does 2 * batch FLOPs per weight: plain
# float32 FMAs stop keeping up with HBM from about 8 rows on, so the streaming kernels multiply on the
# tensor cores (mma.sync m16n8k16, float16/bfloat16 in, float32 accumulation) and are bound by the weight
# reads alone. Warp has no mma or cp.async builtin, so the inner loop is a native snippet
# (``wp.func_native``); the CPU (and pre-sm_80 GPUs) run a plain loop in the same snippet that computes
# exactly the sums the lane would hold, so the kernels, their indexing and their outputs are the same
# everywhere.
#
# How the weights are read decides the speed (H200, fp16, measured with ncu):
# - registers loaded straight in mma's fragment order read 8 rows x 64 bytes per instruction. Spread over
#   whole 128-byte lines (every sector half used, the other half fetched again by the next instruction) they
#   ran at 3.7 TB/s; packed into 64 contiguous bytes per row they fell to 2.5 TB/s (DRAM read at 51% of
#   peak): HBM wants long runs of one row, not many short pieces of many rows.
# - so each warp copies whole rows of its tile into shared memory with ``cp.async`` (one 512-byte row
#   piece per instruction, nothing in registers while in flight, ``STAGES`` chunks ahead), and reads mma's
#   fragments back with 16-byte shared loads. The batch rows (x or h) ride in the same stages.
#
# A sum over k may take the k in any order, and lane (g, t) of an mma step holds, in A, the k-pairs t and
# t + 4 of rows g and g + 8 and, in B, the same k-pairs of batch row g. So lane (g, t) reads the 16-byte
# unit t of each 32-k block of rows g and g + 8 (k 8t .. 8t + 7) and of its batch row, and feeds them to two
# mma steps; A and B agree on the order. Units are stored XOR-swizzled by row parity, so a phase of 8 lanes
# (two rows, four units each) hits 32 distinct banks.
#
# Work split. The (row group of 16 * m_tiles weight rows, k chunk) items of a projection are laid out group
# by group, and each of exactly ``n_warps`` resident warps (one wave, a warp per block) takes an equal
# contiguous run of them: no tail of half-empty waves, and the copy pipeline runs on across group
# boundaries. When a warp leaves a group it writes its float32 partial sums to
# ``partial[slot, batch row, weight row]``, slot = its rank among the warps that share the group. A
# fixed-order combine kernel adds a row's slots and applies the epilogue (bias and gate for the first
# projection, bias and the cast for the second): bitwise reproducible.

TC_MAX_ROWS = 64
TC_IO = ("float16", "bfloat16")
TC_N_TILES = (1, 2, 4, 8)  # batch capacities of 8, 16, 32, 64 rows
TC_UNIT = 8  # k per 16-byte unit: hidden and inter must be multiples of it
_TC_PROJECTION_BLOCK_DIM = 32  # one warp a block (launch_tc_forward); the combines take the default
# per batch capacity (n_tiles): (m_tiles: weight rows per warp / 16, k_chunk: k per pipeline stage, stages,
# resident warps per SM). Swept on the H200 with scripts/geglu_tune.py; within 1-2% of each other at 8 rows
# with plain launches. With the dependent launches, 5 warps an SM serve 4-8 rows best (0.083 against 0.084-0.085
# ms for 4): five rings leave no room for a second-projection warp beside them, so those warps take SMs only
# as first-projection warps leave, instead of one an SM waiting from the start.
TC_CONFIG = {
    1: (2, 128, 4, 5),
    2: (2, 128, 3, 6),
    4: (2, 128, 2, 6),
    8: (2, 64, 3, 6),
}
# bytes of static shared memory the copy ring may take: a block may declare 48 KiB, and Warp's kernels
# declare 1 KiB of their own
_WARP_STATIC_SMEM = 1024
_SMEM_STATIC_LIMIT = 48 * 1024 - _WARP_STATIC_SMEM
# shared memory of an SM by compute capability (the CUDA occupancy tables), and what the driver keeps per
# block: the one-wave grid must fit, or a second wave of warps would run after the first
_SMEM_PER_SM = {90: 233472, 80: 167936, 87: 167936}
_SMEM_PER_SM_OTHER = 102400
_SMEM_RESERVED_PER_BLOCK = 1024

_TC_SNIPPET = """
    constexpr int MT = @MT@;
    constexpr int NT = @NT@;
    constexpr int KC = @KC@;
    constexpr int S = @STAGES@;
    constexpr int R = 16 * MT;          // weight rows of a group
    constexpr int XR = 8 * NT;          // batch rows held
    constexpr int CPR = KC / 8;         // 16-byte units per row of a chunk
    constexpr int STAGE_UNITS = (R + XR) * CPR;
    const int g = lane >> 2;
    const int t = lane & 3;
    const int K = x.shape[1];
    const int w_rows = w.shape[0];
    const long long total = (long long)n_groups * n_chunks;
    const long long begin = (long long)warp * total / n_warps;
    const long long end = (long long)(warp + 1) * total / n_warps;
    @ALLOW_DEPENDENTS@
    if (begin >= end) return;
    // the rank of this warp among those sharing group grp: the owner of the group's first item is slot 0
    #define TC_SLOT(grp) (warp - (int)((((long long)(grp) * n_chunks + 1) * n_warps - 1) / total))
    // mma's accumulator layout: element e of tile (mt, nt) is (weight row, batch row) below
    #define TC_WEIGHT_ROW(grp, mt, e) ((grp) * R + (mt) * 16 + g + 8 * ((e) >> 1))
    #define TC_BATCH_ROW(nt, e) ((nt) * 8 + 2 * t + ((e) & 1))
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
    // Every address below is a lane constant plus a compile-time offset, moved on by one add a stage:
    // the copies are issue-bound otherwise (the first version, which decoded each unit's row and column
    // with divisions, issued ~8x the instructions and streamed at 2.5 TB/s).
    constexpr int RPI = 32 / CPR;            // rows per copy instruction (the warp copies 512 bytes)
    constexpr int W_COPIES = R / RPI;
    constexpr int X_COPIES = XR / RPI;
    constexpr int STAGE_BYTES = STAGE_UNITS * 16;
    __shared__ __align__(128) uint4 ring[S * STAGE_UNITS];
    unsigned int ring_base;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(ring_base) : "l"(ring));
    const int c = lane % CPR;                // this lane's 16-byte unit within a row's chunk
    const int rl = lane / CPR;               // and its row within each copy instruction
    // stored unit of (row r, unit c): c ^ 4 on odd rows; copy j writes row j * RPI + rl
    const unsigned int dst_same = ring_base + 16u * (rl * CPR + (c ^ ((rl & 1) << 2)));
    const unsigned int dst_flip = ring_base + 16u * (rl * CPR + (c ^ ((~rl & 1) << 2)));
    const long long w_stride = w.strides[0];
    const long long x_stride = x.strides[0];
    const char* x_lane = (const char*)x.data + rl * x_stride + 16 * c;
    long long item_i = begin;
    int grp_i = (int)(begin / n_chunks);
    int chunk_i = (int)(begin - (long long)grp_i * n_chunks);
    const char* w_lane = (const char*)w.data + ((long long)grp_i * R + rl) * w_stride + 16 * c;
    // a stage's copies: the weight rows of item (grp_i, chunk_i), then the batch rows of a chunk
    auto issue_weights = [&](int slot) {
        const long long k_bytes = 2LL * chunk_i * KC;
        const bool k_ok = chunk_i * KC + 8 * c < K;
        const int rows_left = w_rows - grp_i * R - rl;
        const unsigned int stage_dst = slot * STAGE_BYTES;
        #pragma unroll
        for (int j = 0; j < W_COPIES; ++j) {
            const bool ok = k_ok && j * RPI < rows_left;
            const char* src = ok ? w_lane + k_bytes + j * RPI * w_stride : (const char*)w.data;
            const unsigned int dst = ((RPI & 1) && (j & 1) ? dst_flip : dst_same) + stage_dst + 16u * j * RPI * CPR;
            asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(ok ? 16 : 0));
        }
    };
    auto issue_batch = [&](int slot, int chunk) {
        const long long k_bytes = 2LL * chunk * KC;
        const bool k_ok = chunk * KC + 8 * c < K;
        const unsigned int stage_dst = slot * STAGE_BYTES;
        #pragma unroll
        for (int j = 0; j < X_COPIES; ++j) {
            const int r = R + j * RPI;
            const bool ok = k_ok && j * RPI + rl < n_rows;
            const char* src = ok ? x_lane + k_bytes + j * RPI * x_stride : (const char*)x.data;
            const unsigned int dst = ((RPI & 1) && (r & 1) ? dst_flip : dst_same) + stage_dst + 16u * r * CPR;
            asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(ok ? 16 : 0));
        }
    };
    auto next_item = [&]() {
        ++item_i;
        if (++chunk_i == n_chunks) {
            chunk_i = 0;
            ++grp_i;
            w_lane += R * w_stride;
        }
    };
    auto issue = [&](int slot) {
        issue_weights(slot);
        issue_batch(slot, chunk_i);
        next_item();
    };
    float acc[MT][NT][4];
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
        #pragma unroll
        for (int nt = 0; nt < NT; ++nt)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
    auto flush = [&](int grp) {
        const int slot = TC_SLOT(grp);
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            #pragma unroll
            for (int nt = 0; nt < NT; ++nt)
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int n = TC_BATCH_ROW(nt, e);
                    const int row = TC_WEIGHT_ROW(grp, mt, e);
                    if (n < n_rows && row < w_rows) *wp::address(partial, slot, n, row) = acc[mt][nt][e];
                    acc[mt][nt][e] = 0.0f;
                }
    };
    // The prologue's weight copies go out before the wait for the previous launch (a dependent launch
    // starts while it finishes: see kernels/_dependent_launch), its batch rows (h, which that launch
    // writes) after. Uncommitted copies join the next commit, so the first group holds every prologue
    // weight copy: the first stage waits for all of them, issued long before.
    int prologue_chunk[S - 1];
    #pragma unroll
    for (int i = 0; i < S - 1; ++i) {
        prologue_chunk[i] = -1;
        if (item_i < end) {
            prologue_chunk[i] = chunk_i;
            issue_weights(i);
            next_item();
        }
    }
    @WAIT@
    #pragma unroll
    for (int i = 0; i < S - 1; ++i) {
        if (prologue_chunk[i] >= 0) issue_batch(i, prologue_chunk[i]);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    // fragment reads: rows g (+ 8, + 16 mt) and batch rows g (+ 8 nt) all have the parity p of g, so unit
    // 4 kb + t sits at 4 (kb ^ p) + t: 4 kb + 4 p for even kb, 4 kb - 4 p for odd
    const uint4* frag_even = ring + g * CPR + t + ((g & 1) << 2);
    const uint4* frag_odd = ring + g * CPR + t - ((g & 1) << 2);
    int grp_c = (int)(begin / n_chunks);
    int chunk_c = (int)(begin - (long long)grp_c * n_chunks);
    int slot = 0;
    for (long long item = begin; item < end; ++item) {
        if (item_i < end) issue(slot == 0 ? S - 1 : slot - 1);  // refill the stage read in the previous step
        asm volatile("cp.async.commit_group;" ::: "memory");
        asm volatile("cp.async.wait_group %0;" :: "n"(S - 1) : "memory");
        __syncwarp();
        #pragma unroll
        for (int kb = 0; kb < KC / 32; ++kb) {
            const uint4* stage = (kb & 1 ? frag_odd : frag_even) + slot * STAGE_UNITS;
            uint4 a[MT][2];
            uint4 b[NT];
            #pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                #pragma unroll
                for (int h = 0; h < 2; ++h) a[mt][h] = stage[(mt * 16 + 8 * h) * CPR + 4 * kb];
            #pragma unroll
            for (int nt = 0; nt < NT; ++nt) b[nt] = stage[(R + nt * 8) * CPR + 4 * kb];
            #pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                #pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    asm("mma.sync.aligned.m16n8k16.row.col.f32.@MMA@.@MMA@.f32 "
                        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                        : "+f"(acc[mt][nt][0]), "+f"(acc[mt][nt][1]), "+f"(acc[mt][nt][2]), "+f"(acc[mt][nt][3])
                        : "r"(a[mt][0].x), "r"(a[mt][1].x), "r"(a[mt][0].y), "r"(a[mt][1].y), "r"(b[nt].x), "r"(b[nt].y));
                    asm("mma.sync.aligned.m16n8k16.row.col.f32.@MMA@.@MMA@.f32 "
                        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                        : "+f"(acc[mt][nt][0]), "+f"(acc[mt][nt][1]), "+f"(acc[mt][nt][2]), "+f"(acc[mt][nt][3])
                        : "r"(a[mt][0].z), "r"(a[mt][1].z), "r"(a[mt][0].w), "r"(a[mt][1].w), "r"(b[nt].z), "r"(b[nt].w));
                }
        }
        __syncwarp();
        slot = slot == S - 1 ? 0 : slot + 1;
        if (++chunk_c == n_chunks) {
            flush(grp_c);
            chunk_c = 0;
            ++grp_c;
        }
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    if (chunk_c != 0) flush(grp_c);
#else
    // the same items, sums and slots, one output at a time
    for (int grp = (int)(begin / n_chunks); (long long)grp * n_chunks < end; ++grp) {
        const long long first = (long long)grp * n_chunks > begin ? (long long)grp * n_chunks : begin;
        const long long last = (long long)(grp + 1) * n_chunks < end ? (long long)(grp + 1) * n_chunks : end;
        const int k_begin = (int)(first - (long long)grp * n_chunks) * KC;
        int k_end = (int)(last - (long long)grp * n_chunks) * KC;
        k_end = k_end < K ? k_end : K;
        const int slot = TC_SLOT(grp);
        for (int mt = 0; mt < MT; ++mt)
            for (int nt = 0; nt < NT; ++nt)
                for (int e = 0; e < 4; ++e) {
                    const int n = TC_BATCH_ROW(nt, e);
                    const int row = TC_WEIGHT_ROW(grp, mt, e);
                    if (n >= n_rows || row >= w_rows) continue;
                    float sum = 0.0f;
                    for (int k = k_begin; k < k_end; ++k)
                        sum += float(*wp::address(w, row, k)) * float(*wp::address(x, n, k));
                    *wp::address(partial, slot, n, row) = sum;
                }
    }
#endif
    #undef TC_SLOT
    #undef TC_WEIGHT_ROW
    #undef TC_BATCH_ROW
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


@dataclass(frozen=True)
class StreamPlan:
    """How one projection's (row group, k chunk) items are shared among ``n_warps`` warps."""

    n_groups: int
    n_chunks: int
    n_warps: int
    slots: int  # the most warps that share one group: the first dimension of its partial buffer


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
        and n_hidden % TC_UNIT == 0
        and n_inter % TC_UNIT == 0
    )


def _stage_bytes(n_tiles: int, m_tiles: int, k_chunk: int) -> int:
    return (16 * m_tiles + 8 * n_tiles) * k_chunk * 2


def _owner(item: int, n_warps: int, total: int) -> int:
    """The warp whose run of items holds ``item`` (runs: [w * total // n_warps, (w + 1) * total // n_warps))."""
    return ((item + 1) * n_warps - 1) // total


def resident_warps_per_sm(n_tiles: int, arch: int, config: tuple | None = None) -> int:
    """Warps of the streaming kernel an SM of compute capability ``arch`` (e.g. 90) holds at once: the
    configured count, capped by shared memory (one warp a block, each with its copy ring)."""
    m_tiles, k_chunk, stages, warps_per_sm = config or TC_CONFIG[n_tiles]
    ring = stages * _stage_bytes(n_tiles, m_tiles, k_chunk) + _WARP_STATIC_SMEM
    fit = _SMEM_PER_SM.get(arch, _SMEM_PER_SM_OTHER) // (ring + _SMEM_RESERVED_PER_BLOCK)
    return max(1, min(warps_per_sm, fit))


@functools.lru_cache(maxsize=None)
def stream_plan(n_weight_rows: int, k: int, n_tiles: int, sm_count: int, arch: int = 90, config: tuple | None = None) -> StreamPlan:
    """The split of one projection (``n_weight_rows`` x ``k`` weights) for a batch capacity of ``n_tiles``
    8-row tiles on a device of ``sm_count`` SMs of compute capability ``arch``."""
    m_tiles, k_chunk, _stages, _warps_per_sm = config or TC_CONFIG[n_tiles]
    rows = 16 * m_tiles
    n_groups = -(-n_weight_rows // rows)
    n_chunks = -(-k // k_chunk)
    total = n_groups * n_chunks
    n_warps = max(1, min(total, sm_count * resident_warps_per_sm(n_tiles, arch, config)))
    slots = max(_owner(gr * n_chunks + n_chunks - 1, n_warps, total) - _owner(gr * n_chunks, n_warps, total) + 1
                for gr in range(n_groups))
    return StreamPlan(n_groups, n_chunks, n_warps, slots)


def tc_plans(n_hidden: int, n_inter: int, n_rows: int, sm_count: int, arch: int, config: tuple | None = None) -> tuple:
    """(plan of the first projection, plan of the second) for ``n_rows`` batch rows on a device of
    ``sm_count`` SMs of compute capability ``arch`` (sm_count 1 for the CPU)."""
    n_tiles = tc_n_tiles(n_rows)
    return (
        stream_plan(2 * n_inter, n_hidden, n_tiles, sm_count, arch, config),
        stream_plan(n_hidden, n_inter, n_tiles, sm_count, arch, config),
    )


@functools.lru_cache(maxsize=None)
def get_tc_variant(io_name: str, n_tiles: int, config: tuple | None = None) -> TensorCoreVariant:
    if io_name not in TC_IO:
        raise TypeError(f"the tensor-core path takes float16 or bfloat16, got {io_name}")
    if n_tiles not in TC_N_TILES:
        raise ValueError(f"n_tiles must be one of {TC_N_TILES}, got {n_tiles}")
    m_tiles, k_chunk, stages, _warps_per_sm = config or TC_CONFIG[n_tiles]
    if k_chunk % 64 or stages < 2 or stages * _stage_bytes(n_tiles, m_tiles, k_chunk) > _SMEM_STATIC_LIMIT:
        raise ValueError(f"no such streaming configuration: {(m_tiles, k_chunk, stages)} for {n_tiles} tiles")
    io = _io_scalar(io_name)
    gate, _ = _gate_funcs("float32")
    module = f"warpkan_geglu_tc{n_tiles}_{m_tiles}x{k_chunk}x{stages}_{io_name}"
    kernel = functools.partial(wp.kernel, enable_backward=False, module=module)
    snippet = (
        _TC_SNIPPET.replace("@MT@", str(m_tiles)).replace("@NT@", str(n_tiles)).replace("@KC@", str(k_chunk))
        .replace("@STAGES@", str(stages)).replace("@MMA@", "f16" if io_name == "float16" else "bf16")
        .replace("@ALLOW_DEPENDENTS@", DEPENDENTS_SNIPPET).replace("@WAIT@", WAIT_SNIPPET)
    )

    GROUP_ROWS = 16 * m_tiles

    @wp.func_native(snippet)
    def stream_items(
        w: wp.array2d(dtype=io),
        x: wp.array2d(dtype=io),
        partial: wp.array3d(dtype=wp.float32),
        n_rows: int,
        n_groups: int,
        n_chunks: int,
        n_warps: int,
        warp: int,
        lane: int,
    ): ...

    @wp.func
    def slot_sum(partial: wp.array3d(dtype=wp.float32), m: int, row: int, n_chunks: int, n_warps: int, total: wp.int64):
        """Batch row m, weight row ``row``: the partial sums of the warps that shared its group, in slot
        order. Their count is owner(last item) - owner(first item) + 1 (see TC_SLOT in the snippet)."""
        first = wp.int64(row // GROUP_ROWS) * wp.int64(n_chunks)
        last = first + wp.int64(n_chunks - 1)
        nw = wp.int64(n_warps)
        one = wp.int64(1)
        slots = int(((last + one) * nw - one) // total - ((first + one) * nw - one) // total) + 1
        y = float(0.0)
        for s in range(slots):
            y += partial[s, m, row]
        return y

    @kernel
    def projection(
        x: wp.array2d(dtype=io),
        w: wp.array2d(dtype=io),
        n_rows: int,
        n_groups: int,
        n_chunks: int,
        n_warps: int,
        partial: wp.array3d(dtype=wp.float32),
    ):
        tid = wp.tid()
        stream_items(w, x, partial, n_rows, n_groups, n_chunks, n_warps, tid // 32, tid % 32)

    @kernel
    def gate_combine(
        partial: wp.array3d(dtype=wp.float32),
        b_uv: wp.array1d(dtype=io),
        use_bias: int,
        code: int,
        n_chunks: int,
        n_warps: int,
        total: wp.int64,
        uv: wp.array2d(dtype=io),
        h: wp.array2d(dtype=io),
    ):
        m, j = wp.tid()
        # a dependent launch (launch_tc_forward): the next projection's warps may start their weight
        # copies now; the partial sums are read once the first projection has finished
        allow_dependents()
        wait_for_previous_grid()
        n_inter = h.shape[1]
        u = slot_sum(partial, m, j, n_chunks, n_warps, total)
        v = slot_sum(partial, m, n_inter + j, n_chunks, n_warps, total)
        if use_bias:
            u += float(b_uv[j])
            v += float(b_uv[n_inter + j])
        uv[m, j] = io(u)
        uv[m, n_inter + j] = io(v)
        h[m, j] = io(gate(u, code) * v)

    @kernel
    def out_combine(
        partial: wp.array3d(dtype=wp.float32),
        b_o: wp.array1d(dtype=io),
        use_bias: int,
        n_chunks: int,
        n_warps: int,
        total: wp.int64,
        out: wp.array2d(dtype=io),
    ):
        m, o = wp.tid()
        wait_for_previous_grid()
        y = slot_sum(partial, m, o, n_chunks, n_warps, total)
        if use_bias:
            y += float(b_o[o])
        out[m, o] = io(y)

    return TensorCoreVariant(io_name, n_tiles, projection, gate_combine, out_combine, module)


def device_shape(device) -> tuple:
    """(SM count, compute capability as e.g. 90) of a Warp device; (1, 0) for the CPU."""
    return (device.sm_count, device.arch) if device.is_cuda else (1, 0)


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
    config: tuple | None = None,
    dependent: bool = True,
):
    """The whole layer by tensor-core weight streaming (see :func:`tc_eligible`): writes uv, h and out.
    ``partial_up`` [slots, N, 2 inter] and ``partial_down`` [slots, N, hidden] are float32 scratch with the
    slots of :func:`tc_plans`. x, w_uv, w_o and h must be contiguous and 16-byte aligned. ``config``
    overrides ``TC_CONFIG`` (for tuning).

    ``dependent``: launch the gate combine, the second projection and the output combine as programmatic
    dependents of the launch before each (compute capability 9.0+, ``kernels/_dependent_launch``), so the
    second projection's warps take SMs as the first projection's leave and start copying W_o rows while
    its slowest warps finish; False launches them plainly (the A/B switch)."""
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
    for name, a in (("x", x), ("w_uv", w_uv), ("w_o", w_o), ("h", h)):
        if a.ptr % 16 or not a.is_contiguous:
            raise ValueError(f"{name} must be contiguous and 16-byte aligned for the tensor-core path")
    device = x.device
    plan_up, plan_down = tc_plans(n_hidden, n_inter, n_rows, *device_shape(device), config)
    _check("partial_up", partial_up, (plan_up.slots, n_rows, 2 * n_inter), "float32")
    _check("partial_down", partial_down, (plan_down.slots, n_rows, n_hidden), "float32")
    variant = get_tc_variant(io_name, tc_n_tiles(n_rows), config)
    code = activation_code(activation)
    b_uv_arg = b_uv if b_uv is not None else _empty_vector(io_name, device)
    b_o_arg = b_o if b_o is not None else _empty_vector(io_name, device)
    # always recorded, then launched on ``stream`` below (plainly or as dependents, which wrap a record)
    def recorded(kernel, dim, inputs, outputs, block_dim=256):
        return launch(kernel, dim, inputs, outputs, device=device, record=True, block_dim=block_dim)[0]

    def projection(act, weight, plan, partial):
        # one warp a block: each warp's copy ring is its own (no block barrier) and fills the static limit
        return recorded(variant.projection, plan.n_warps * 32,
                        [act, weight, n_rows, plan.n_groups, plan.n_chunks, plan.n_warps], [partial],
                        block_dim=_TC_PROJECTION_BLOCK_DIM)

    def schedule(plan):
        return [plan.n_chunks, plan.n_warps, plan.n_groups * plan.n_chunks]

    cmds = [
        projection(x, w_uv, plan_up, partial_up),
        recorded(variant.gate_combine, (n_rows, n_inter),
                 [partial_up, b_uv_arg, int(b_uv is not None), code, *schedule(plan_up)], [uv, h]),
        projection(h, w_o, plan_down, partial_down),
        recorded(variant.out_combine, (n_rows, n_hidden),
                 [partial_down, b_o_arg, int(b_o is not None), *schedule(plan_down)], [out]),
    ]
    if dependent:
        cmds[1:] = [DependentLaunch(cmd) for cmd in cmds[1:]]
    if record:
        return cmds
    for cmd in cmds:
        cmd.launch(stream)
    return None


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
def geglu_modules(io_name: str, n_hidden: "int | None" = None, n_inter: "int | None" = None,
                  small_batch_rows: int = DEFAULT_SMALL_BATCH_ROWS) -> tuple:
    """The modules (:class:`ModuleBuild`, at their launches' block sizes) a layer launches for batches of any
    size, its arrays aligned: the gate kernels at the vector width of ``n_inter`` (every width when None); for
    batches of up to ``small_batch_rows`` rows, the tensor-core streaming kernels of each batch capacity where
    :func:`tc_eligible` (shapes None: where it may be; on any device, as the layer takes them), else the
    weight-streaming kernels of each row capacity."""
    itemsize = wp.types.type_size_in_bytes(_io_scalar(io_name))
    widths = ([1 << p for p in range((16 // itemsize).bit_length())] if n_inter is None
              else [dense_vector_width(itemsize, n_inter, ())])
    builds = [ModuleBuild(get_variant(io_name, vec).module, DEFAULT_BLOCK_DIM) for vec in widths]
    small_rows = range(1, small_batch_rows + 1)
    unknown = n_hidden is None or n_inter is None
    tensor_core = io_name in TC_IO and (unknown or tc_eligible(io_name, 1, n_hidden, n_inter))
    if tensor_core:
        for n_tiles in sorted({tc_n_tiles(rows) for rows in small_rows if rows <= TC_MAX_ROWS}):
            module = get_tc_variant(io_name, n_tiles).module
            builds += [ModuleBuild(module, _TC_PROJECTION_BLOCK_DIM), ModuleBuild(module, DEFAULT_BLOCK_DIM)]
    if unknown or not tensor_core:
        for rows in sorted({small_rows_bucket(rows) for rows in small_rows if rows <= MAX_SMALL_ROWS}):
            variant = get_small_variant(io_name, rows)
            builds += [ModuleBuild(variant.module, variant.up_block_dim),
                       ModuleBuild(variant.module, variant.down_block_dim)]
    return distinct(builds)


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
    return launch(_probe_kernel(), out.shape[0], [data], [out], device=data.device, stream=stream, record=record,
                  block_dim=block_dim)
