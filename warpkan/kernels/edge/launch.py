"""Launchers of the engine's kernels on ``wp.array``s, for any edge family: the forward, the backward (every
strategy), and the dense-basis pieces. A family's own launcher checks its arrays and builds its frame; these
pick the kernels (tiled where a plan applies on CUDA, the stencil kernels elsewhere)."""

import warp as wp

from .._common import lane_group_width, on_stream, vec4_aligned
from .._runtime import launch, workspace_for
from .._runtime import row_chunks as runtime_row_chunks
from . import tiled as tiled_pass
from .dense import dense_dim, dense_kernels
from .jet import MAX_PAIRS, PairIndex, jet_kernels
from .family import EdgeFamily
from .stencil import BLOCK_DIM, ENTRIES_PER_CHUNK, FORWARD_ROWS, OUT_TILE, ROW_LANES, stencil_kernels

__all__ = ["launch_forward", "launch_backward", "row_chunks", "take_tiled_forward", "launch_expand_basis",
           "launch_contract_basis_grad", "launch_expand_contract", "launch_combine_weights", "launch_split_param_grads",
           "launch_expand_jet", "launch_expand_contract_jet", "pair_index", "sort_entries"]

_TARGET_PARTIAL_THREADS = 1 << 19  # parallelism aimed at by the row-chunked reductions
_TARGET_DX_WARPS = 1 << 15  # and by the x-gradient: about 4 waves of resident warps on 132 SMs x 64 warps


def _block(device) -> int:
    return BLOCK_DIM if device.is_cuda else 1


def take_tiled_forward(family: EdgeFamily, tiled: "bool | None", x, coef) -> bool:
    """Whether the forward pass runs the tiled kernels (on one table, or on bands of a longer one)."""
    applies = tiled_pass.forward_plan(family, x.device.is_cuda, coef.shape[1]) is not None
    if tiled is None:
        return applies
    if tiled and not applies:
        raise ValueError("tiled=True needs a CUDA device and a table within the tiled forward's capacity, on one "
                         f"table or (float32) on bands ({family.padded_rows(coef.shape[1])} padded rows)")
    return bool(tiled)


def launch_forward(family: EdgeFamily, frame, x, base_weight_t, scaler_t, coef, y, bias=None, use_base: bool = True,
                   stream=None, tiled: "bool | None" = None, workspace=None) -> None:
    """y[n, o] = sum_i base_weight_t[i, o] silu(x[n, i]) + scaler_t[i, o] spline_io(x[n, i]) (+ bias[o]).
    Overwrites y. ``tiled`` as in :func:`take_tiled_forward` (None: wherever a plan applies)."""
    n_rows, n_out = x.shape[0], coef.shape[2]
    if n_rows == 0 or n_out == 0:
        return
    use_tiled = take_tiled_forward(family, tiled, x, coef)
    if use_tiled and x.shape[1] > 0:
        tiled_pass.launch_tiled_forward(family, frame, x, base_weight_t, scaler_t, coef, bias, y, use_base,
                                        stream=stream, workspace=workspace)
        return
    kernels = stencil_kernels(family)
    launch(kernels.forward, -(-n_rows // FORWARD_ROWS) * -(-n_out // OUT_TILE),
           [x, frame, base_weight_t, scaler_t, coef, bias, int(use_base), int(bias is not None),
            int(vec4_aligned(base_weight_t, scaler_t, coef))], [y], x.device, stream, block_dim=_block(x.device))


def row_chunks(n_rows: int, n_in: int, n_out: int) -> tuple[int, int]:
    """(n_chunks, rows_per_chunk) of the base-weight / scaler row reductions: one thread per (input, output)
    a chunk, about 2^19 threads, at least 32 rows a chunk (a function of the shapes alone: deterministic)."""
    return runtime_row_chunks(n_rows, n_in * n_out, _TARGET_PARTIAL_THREADS, 32)


def dx_inputs_per_item(n_rows: int, n_in: int) -> int:
    """Inputs per warp of the stencil x-gradient: a row's inputs split into runs (independent sums, so the
    result does not change) until about ``_TARGET_DX_WARPS`` warps share the work."""
    runs = max(1, min(n_in, -(-_TARGET_DX_WARPS // max(n_rows, 1))))
    return -(-n_in // runs)


def _tiled_backward_plan(family, tiled, x, coef, all_params, deterministic, want_dx) -> bool:
    plan = tiled_pass.backward_plan(family, x.device.is_cuda, coef.shape[1])
    if tiled and plan is None:
        raise ValueError("tiled=True needs a CUDA device and a table within the tiled backward pass's reach "
                         f"({family.padded_rows(coef.shape[1])} padded rows)")
    takes = plan is not None and tiled_pass.backward_takes(coef.shape[2], all_params, deterministic, want_dx,
                                                           plan.banded)
    if tiled and not takes:
        raise ValueError("tiled=True needs all three parameter gradients (and, when deterministic, one table and, "
                         "with dx, at most 32 outputs)")
    return takes and tiled is not False


def launch_backward(family: EdgeFamily, frame, dy, x, base_weight_t, scaler_t, coef, use_base: bool = True, dx=None,
                    d_base_weight_t=None, d_scaler_t=None, d_coef=None, deterministic: bool = False, stream=None,
                    workspace=None, tiled: "bool | None" = None, entry_order=None) -> None:
    """Accumulate (+=) the gradients of :func:`launch_forward` into whichever of dx, d_base_weight_t,
    d_scaler_t, d_coef are given (``d_base_weight_t`` and ``d_scaler_t`` go together). The tiled pass when a
    plan applies and all three parameter gradients are asked for; else the bucketed single pass (not
    deterministic), or the atomic-free kernels (``deterministic=True``, or a partial request; always for a
    shared table). ``entry_order`` (shared tables): the entries e = i N + n already grouped by their slot's group,
    the invalid ones last, which spares the sort."""
    all_params = d_coef is not None and d_base_weight_t is not None and d_scaler_t is not None
    if (d_base_weight_t is None) != (d_scaler_t is None):
        raise ValueError("d_base_weight_t and d_scaler_t must be given together")
    if _tiled_backward_plan(family, tiled, x, coef, all_params, deterministic, dx is not None):
        tiled_pass.launch_tiled_backward(family, frame, dy, x, base_weight_t, scaler_t, coef, use_base, dx=dx,
                                         d_base_weight_t=d_base_weight_t, d_scaler_t=d_scaler_t, d_coef=d_coef,
                                         deterministic=deterministic, stream=stream, workspace=workspace)
        return
    n_rows, n_in = x.shape
    n_out = coef.shape[2]
    if n_rows == 0 or n_in == 0 or n_out == 0:
        return
    ws = workspace or workspace_for(x.device, stream)
    with on_stream(stream):
        # a shared table's coefficient gradient is always gathered (atomic-free): its bucketed pass would key
        # entries by (input, slot) over the whole table
        if all_params and not deterministic and not family.shared_table:
            _bucketed_backward(family, frame, ws, dy, x, base_weight_t, scaler_t, coef, use_base, dx,
                               d_base_weight_t, d_scaler_t, d_coef, stream)
            return
        _deterministic_backward(family, frame, ws, dy, x, base_weight_t, scaler_t, coef, use_base, dx,
                                d_base_weight_t, d_scaler_t, d_coef, stream, entry_order)


def _bucketed_backward(family, frame, ws, dy, x, base_weight_t, scaler_t, coef, use_base, dx, d_base_weight_t,
                       d_scaler_t, d_coef, stream) -> None:
    kernels = stencil_kernels(family)
    device = x.device
    n_rows, n_in = x.shape
    n_out = coef.shape[2]
    n_buckets = family.n_slots(coef.shape[1]) + 1  # the slots, plus the invalid bucket 0
    rows, sorted_keys = sort_entries(family, frame, ws, x, n_buckets, stream)
    n_entries = n_rows * n_in
    n_tiles = -(-n_out // OUT_TILE)
    threads = -(-n_entries // ENTRIES_PER_CHUNK) * n_tiles
    if device.is_cuda:
        threads = -(-threads // 32) * 32  # whole warps: every lane reaches the shuffles
    launch(kernels.backward_bucketed, threads,
           [dy, x, frame, base_weight_t, scaler_t, coef, sorted_keys, rows, n_entries, n_buckets, ENTRIES_PER_CHUNK,
            int(use_base), int(dx is not None), lane_group_width(n_tiles, device.is_cuda),
            int(vec4_aligned(dy, base_weight_t, scaler_t, coef))],
           [dx, d_base_weight_t, d_scaler_t, d_coef], device, stream, block_dim=_block(device))


def _deterministic_backward(family, frame, ws, dy, x, base_weight_t, scaler_t, coef, use_base, dx, d_base_weight_t,
                            d_scaler_t, d_coef, stream, entry_order=None) -> None:
    kernels = stencil_kernels(family)
    device = x.device
    n_rows, n_in = x.shape
    n_coef, n_out = coef.shape[1], coef.shape[2]
    block = _block(device)
    if dx is not None:
        lanes = ROW_LANES if device.is_cuda else 1
        inputs_per_item = dx_inputs_per_item(n_rows, n_in)
        n_items = n_rows * -(-n_in // inputs_per_item)
        launch(kernels.backward_x, (n_items, lanes),
               [dy, x, frame, base_weight_t, scaler_t, coef, int(use_base), lanes, inputs_per_item],
               [dx], device, stream, block_dim=block)
    if d_base_weight_t is not None:
        n_chunks, rows_per_chunk = row_chunks(n_rows, n_in, n_out)
        partial_base = ws.get("partial_base", (n_chunks, n_in, n_out), family.scalar)
        partial_scaler = ws.get("partial_scaler", (n_chunks, n_in, n_out), family.scalar)
        launch(kernels.backward_rows, n_chunks * n_in * n_out, [dy, x, frame, coef, rows_per_chunk],
               [partial_base, partial_scaler], device, stream, block_dim=block)
        launch(kernels.combine_rows, (n_in, n_out), [partial_base, partial_scaler, int(use_base)],
               [d_base_weight_t, d_scaler_t], device, stream, block_dim=block)
    if d_coef is None:
        return
    if family.shared_table:
        _shared_coef_grad(family, kernels, ws, dy, x, frame, scaler_t, d_coef, entry_order, stream)
        return
    n_buckets = family.n_slots(n_coef) + 1
    rows, keys = sort_entries(family, frame, ws, x, n_buckets, stream)
    offsets = _offsets(kernels, ws, keys, _n_keys(family, n_in, n_buckets), n_rows * n_in, device, stream)
    launch(kernels.backward_coef, n_in * n_coef * n_out, [dy, x, frame, scaler_t, rows, offsets, n_buckets],
           [d_coef], device, stream, block_dim=block)


def _offsets(kernels, ws, keys, n_keys: int, n_entries: int, device, stream):
    """offsets[k], k <= n_keys: where key k's run starts in the sorted keys."""
    offsets = ws.get("offsets", (n_keys + 1,), wp.int32)
    launch(kernels.bucket_offsets, n_keys + 1, [keys, n_entries], [offsets], device, stream, block_dim=_block(device))
    return offsets


_TARGET_SHARED_THREADS = 1 << 18  # parallelism aimed at by a shared table's segmented reduction
_SHARED_CHUNK = (64, 4096)  # its least and most entries a chunk


def shared_chunk(n_entries: int, n_out: int) -> int:
    """Sorted entries per chunk of a shared table's gradient walk: about _TARGET_SHARED_THREADS threads (chunks
    x outputs), so the chunk parts stay a few MiB; a function of the shapes alone (deterministic)."""
    want = -(-n_entries * max(n_out, 1) // _TARGET_SHARED_THREADS)
    return max(_SHARED_CHUNK[0], min(_SHARED_CHUNK[1], want))


def _shared_coef_grad(family, kernels, ws, dy, x, frame, scaler_t, d_coef, entry_order, stream) -> None:
    """A shared table's gradient (see ``stencil._backward_shared_coef``): the entries keyed by group (sorted, or
    in the caller's ``entry_order``), then the walk over chunks of them and the combine."""
    device = x.device
    n_entries = x.shape[0] * x.shape[1]
    n_coef, n_out = d_coef.shape[1], d_coef.shape[2]
    K = family.n_bases
    n_groups = family.n_slots(n_coef) // K + 1  # keys 0 .. n_groups - 1; n_groups: invalid
    if entry_order is None:
        rows, keys = sort_entries(family, frame, ws, x, n_groups, stream)
    else:
        keys = ws.get("keys", (n_entries,), wp.int32)
        rows = ws.get("rows", (n_entries,), wp.int32)
        launch(kernels.ordered_keys, n_entries, [x, frame, n_groups, entry_order], [keys, rows], device, stream,
               block_dim=_block(device))
    offsets = _offsets(kernels, ws, keys, _n_keys(family, x.shape[1], n_groups), n_entries, device, stream)
    chunk = shared_chunk(n_entries, n_out)
    n_chunks = -(-n_entries // chunk)
    group_sums = ws.get("group_sums", (n_groups, 2 * K, n_out), family.scalar)
    head = ws.get("group_head", (n_chunks, 2 * K, n_out), family.scalar)
    tail = ws.get("group_tail", (n_chunks, 2 * K, n_out), family.scalar)
    block = _block(device)
    launch(kernels.backward_coef, n_chunks * n_out,
           [dy, x, frame, scaler_t, keys[:n_entries], rows, offsets, chunk, n_groups], [group_sums, head, tail], device,
           stream, block_dim=block)
    launch(kernels.combine_coef, n_coef * n_out, [offsets, chunk, group_sums, head, tail], [d_coef], device, stream,
           block_dim=block)


def _n_keys(family: EdgeFamily, n_in: int, n_buckets: int) -> int:
    """Keys of the entry sort: (input, bucket), or for a shared table its groups and the invalid key
    (``n_buckets`` is then the group count)."""
    return n_buckets + 1 if family.shared_table else n_in * n_buckets


def sort_entries(family: EdgeFamily, frame, ws, x, n_buckets: int, stream=None):
    """Sort the (n, i) entries by key i * n_buckets + bucket (for a shared table, the slot's group, n_buckets
    being the group count): returns (rows, sorted_keys), rows[e] being the row (shared table: the entry) of the
    e-th entry in key order. The sort is stable, so the order inside a key is the same on every run."""
    n_rows, n_in = x.shape
    n_keys = _n_keys(family, n_in, n_buckets)
    n_entries = n_rows * n_in
    if n_keys >= 2**31 - 1 or n_entries >= 2**31:
        raise ValueError(f"too large for int32 bucketing: {n_entries} entries, {n_keys} buckets")
    keys = ws.get("keys", (2 * n_entries,), wp.int32)
    rows = ws.get("rows", (2 * n_entries,), wp.int32)
    launch(stencil_kernels(family).bucket_keys, (n_in, n_rows), [x, frame, n_buckets], [keys, rows], x.device,
           stream, block_dim=_block(x.device))
    ws.sort_pairs(keys, rows, n_entries, max(1, int(n_keys - 1).bit_length()))
    return rows, keys


def _dense(family: EdgeFamily, basis_dtype):
    """The dense-basis kernels whose basis has ``basis_dtype`` (the family's scalar type or bfloat16)."""
    return dense_kernels(family, "bfloat16" if basis_dtype == wp.bfloat16 else wp.types.type_repr(basis_dtype))


# A bfloat16 dense basis is written and its gradient contracted two rows a thread (see .dense) wherever its
# layout allows; False keeps the one-row kernels (the A/B of scripts/expand_bf16_probe.py and of the tests). The
# two-row contraction reads a row pair's whole table where the one-row kernel reads each row's window of K, so
# it is taken only for tables of at most PAIR_CONTRACT_COEF_PER_BASIS * K coefficients (B-splines of G <= K + 1,
# polynomials of every degree): at 8 coefficients of K = 4 it measured 1.05-1.12x faster, at 13 and 32 0.94x and
# 0.83x (H200, docs/perf-notes-engine.md).
BF16_ROW_PAIRS = True
PAIR_CONTRACT_COEF_PER_BASIS = 2


def _unscaled(scale) -> bool:
    return scale is None or scale.shape[0] == 0


def _bf16_row_pairs(basis_t):
    """A bfloat16 basis_t [width, rows] seen as its uint32 pairs of rows [width, rows / 2]; None where the
    pair kernels are off, basis_t is not bfloat16, its rows are odd in number or not contiguous, or it is not
    4-byte aligned. A recorded launch keeps the choice: its replays re-point it at other buffers of the same
    layout, which the torch bridge's fresh scratch tensors are (aligned to far more than 4 bytes)."""
    if not BF16_ROW_PAIRS or basis_t.dtype != wp.bfloat16:
        return None
    width, n_rows = basis_t.shape
    row_stride, entry_stride = basis_t.strides
    if n_rows == 0 or n_rows % 2 or entry_stride != 2 or row_stride % 4 or basis_t.ptr % 4:
        return None
    return wp.array(ptr=basis_t.ptr, dtype=wp.uint32, shape=(width, n_rows // 2), strides=(row_stride, 4),
                    device=basis_t.device)


def launch_combine_weights(family: EdgeFamily, base_weight_t, scaler_t, coef, weight, use_base: bool = True,
                           stream=None, record: bool = False):
    """weight [dense_width, out] = [base_weight_t; coef * scaler_t] (the base rows only when ``use_base``), in
    weight's dtype. Overwrites weight."""
    return launch(_dense(family, weight.dtype).combine_weights, tuple(scaler_t.shape),
                  [base_weight_t, scaler_t, coef, int(use_base), weight], (), coef.device, stream, record)


def launch_expand_basis(family: EdgeFamily, frame, x, n_coef: int, basis_t, use_base: bool = True, stream=None,
                        record: bool = False, order: int = 0, scale=None):
    """basis_t [dense_width, rows] = the transposed dense basis of x [rows, in] (see :mod:`.dense`), zeros
    included (no fill needed), in basis_t's dtype; ``order`` 1..3: its x-derivative of that order; ``scale``
    [rows, in] (optional): input i's entries of row n times scale[n, i]."""
    kernels = _dense(family, basis_t.dtype)
    pairs = _bf16_row_pairs(basis_t) if order == 0 and _unscaled(scale) else None
    if pairs is not None:
        return launch(kernels.expand_basis_pairs, dense_dim(x.shape[0] // 2, x.shape[1]),
                      [x, frame, int(use_base), n_coef, pairs], (), x.device, stream, record)
    return launch(kernels.expand_basis, dense_dim(*x.shape),
                  [x, frame, int(use_base), n_coef, int(order), scale, basis_t], (), x.device, stream, record)


def launch_contract_basis_grad(family: EdgeFamily, frame, x, n_coef: int, d_basis_t, dx, use_base: bool = True,
                               stream=None, record: bool = False, order: int = 1, scale=None):
    """dx[n, i] = d_basis_t[i, n] silu'(x[n, i]) (when ``use_base``) + sum_j d_basis_t[row_ij, n] dB_j/dx over
    the K non-zero bases; ``order`` 2..3 (or 0): the derivatives of that order instead; ``scale`` [rows, in]
    (optional): dx[n, i] times scale[n, i]. Overwrites dx."""
    kernels = _dense(family, d_basis_t.dtype)
    unscaled = _unscaled(scale)
    pairs = (_bf16_row_pairs(d_basis_t) if order == 1 and unscaled
             and n_coef <= PAIR_CONTRACT_COEF_PER_BASIS * family.n_bases else None)
    if pairs is not None:
        return launch(kernels.contract_basis_grad_pairs, dense_dim(x.shape[0] // 2, x.shape[1]),
                      [x, frame, int(use_base), n_coef, pairs, dx], (), x.device, stream, record)
    kernel = kernels.contract_basis_grad if unscaled else kernels.contract_basis_grad_scaled
    return launch(kernel, dense_dim(*x.shape), [x, frame, int(use_base), n_coef, int(order), scale, d_basis_t, dx], (),
                  x.device, stream, record)


def launch_expand_contract(family: EdgeFamily, frame, x, n_coef: int, g, basis_t, dx, dx_lo, use_base: bool = True,
                           stream=None, record: bool = False, order: int = 1, scale=None, scale_lo=None,
                           lo_is_scale: bool = False):
    """In one pass: basis_t [dense_width, rows] = the order-``order`` dense basis of x times scale (as
    :func:`launch_expand_basis`), dx = the contraction of g [dense_width, rows] at order + 1 times scale and
    dx_lo = its contraction at ``order`` times scale_lo, or times scale when ``lo_is_scale`` (as
    :func:`launch_contract_basis_grad`); any of the three may be empty (not written), an empty or None scale is 1.
    Overwrites the outputs it writes."""
    return launch(_dense(family, g.dtype).expand_contract, dense_dim(*x.shape),
                  [x, frame, int(use_base), n_coef, int(order), scale, scale_lo, int(lo_is_scale), g, basis_t, dx,
                   dx_lo], (), x.device, stream, record)


def launch_split_param_grads(family: EdgeFamily, d_weight, scaler_t, coef, d_base_weight_t, d_scaler_t, d_coef,
                             use_base: bool = True, stream=None, record: bool = False):
    """The gradient d_weight [dense_width, out] of the combined weight, split into d_base_weight_t (zero
    without the base path), d_coef = d_w * scaler_t and d_scaler_t = sum_j d_w * coef. Overwrites all three."""
    return launch(_dense(family, d_weight.dtype).split_param_grads, tuple(scaler_t.shape),
                  [d_weight, scaler_t, coef, int(use_base), d_base_weight_t, d_scaler_t, d_coef], (), coef.device,
                  stream, record)


def pair_index(pairs) -> tuple:
    """(pair_a, pair_b) kernel arguments of the Taylor-mode kernels for ``pairs`` ((a, b) direction indices,
    at most ``MAX_PAIRS``)."""
    if len(pairs) > MAX_PAIRS:
        raise ValueError(f"at most {MAX_PAIRS} second-derivative pairs, got {len(pairs)}")
    padded = list(pairs) + [(0, 0)] * (MAX_PAIRS - len(pairs))
    return PairIndex(*[a for a, _ in padded]), PairIndex(*[b for _, b in padded])


def launch_expand_jet(family: EdgeFamily, frame, z, row0: int, n_coef: int, n_first: int, pairs, basis_t,
                      use_base: bool = True, stream=None, record: bool = False):
    """basis_t [dense_width, C rows] = the dense basis of the input jet z [C, N, in] at rows row0 .. row0 + rows
    (see :mod:`.jet`): C = 1 + n_first + len(pairs) components side by side. Overwrites basis_t."""
    rows = basis_t.shape[1] // z.shape[0]
    pair_a, pair_b = pair_index(pairs)
    return launch(jet_kernels(family, n_first, len(pairs)).expand_jet, dense_dim(rows, z.shape[2]),
                  [z, int(row0), frame, int(use_base), n_coef, pair_a, pair_b, basis_t], (), z.device, stream, record)


def launch_expand_contract_jet(family: EdgeFamily, frame, z, row0: int, n_coef: int, n_first: int, pairs, g_basis,
                               dz, use_base: bool = True, stream=None, record: bool = False,
                               write_basis: bool = True, weight=None, h=None):
    """The Taylor-mode backward kernel (see :mod:`.jet`): dz [C, N, in] at rows row0 .. row0 + rows from
    G = W H^T in g_basis [dense_width, C rows], which then holds the jet's dense basis (``write_basis``).
    Overwrites both. A one-output layer may pass ``weight`` [dense_width, 1] and ``h`` [C, N, 1] instead of
    forming G (g_basis is then not read)."""
    rows = g_basis.shape[1] // z.shape[0]
    pair_a, pair_b = pair_index(pairs)
    return launch(jet_kernels(family, n_first, len(pairs)).expand_contract_jet, dense_dim(rows, z.shape[2]),
                  [z, int(row0), frame, int(use_base), n_coef, int(write_basis), pair_a, pair_b,
                   g_basis, weight, h, dz], (),
                  z.device, stream, record)
