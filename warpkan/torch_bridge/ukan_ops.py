"""torch.library custom ops of the UKAN layer, on the Warp kernels of ``warpkan.kernels.ukan``.

Two ops do the Warp work; the CG-MLP between them is ordinary torch (a small dense GEMM on the table rows),
so autograd carries the table's gradient into the MLP's parameters:

- ``warpkan::ukan_pairs(x, grid_delta, spline_order, capacity)``: the distinct (feature, group) pairs x
  touches (plus the g - 1 neighbours) in a table of ``capacity`` rows, and for each element its window in
  that table. Every output size is a function of the shapes and the capacity (no host read-back), so the
  layer runs under CUDA-graph capture and ``torch.compile`` with static shapes. The number of rows the data
  needed comes back as a one-element device tensor.
- ``warpkan::ukan_spline(x, ..., table, ...)``: the spline (and optional SiLU base) on the table
  ``[capacity * K, out]``, differentiable in x, table, base weight and scaler
  (``warpkan::ukan_spline_backward``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels import ukan as ku
from ._common import to_warp, warp_stream

__all__ = ["ukan_pairs", "ukan_spline", "ukan_spline_backward", "ukan_range_spline", "ukan_range_spline_backward",
           "group_range", "range_encoding", "positional_encoding"]

_TORCH_INT = {ku.wp.int32: torch.int32, ku.wp.int64: torch.int64}


class _TorchPrimitives:
    """Sort and scan with torch on torch's current stream: legal under CUDA-graph capture."""

    @staticmethod
    def sort_pairs(keys, values, count, key_bits):
        keys_t, values_t = ku.wp.to_torch(keys)[:count], ku.wp.to_torch(values)[:count]
        sorted_keys, order = torch.sort(keys_t, stable=True)
        values_t.copy_(values_t[order])
        keys_t.copy_(sorted_keys)

    @staticmethod
    def inclusive_scan(values, out):
        torch.cumsum(ku.wp.to_torch(values), 0, dtype=torch.int32, out=ku.wp.to_torch(out))


_PRIMITIVES = _TorchPrimitives()


def _pair_outputs(x: Tensor, capacity: int, alloc, zeroed) -> tuple:
    n_rows, n_in = x.shape
    return (
        alloc((n_rows * n_in,), dtype=torch.int32, device=x.device),  # sorted_elem
        alloc((n_rows, n_in), dtype=torch.int32, device=x.device),  # window
        alloc((n_rows, n_in), dtype=x.dtype, device=x.device),  # local_u
        zeroed((capacity,), dtype=torch.int32, device=x.device),  # pair_feature (padding rows: 0)
        zeroed((capacity,), dtype=torch.int64, device=x.device),  # pair_group
        zeroed((capacity,), dtype=torch.int32, device=x.device),  # row_start
        zeroed((capacity,), dtype=torch.int32, device=x.device),  # row_stop
        zeroed((1,), dtype=torch.int32, device=x.device),  # rows_needed
    )


@torch.library.custom_op("warpkan::ukan_pairs", mutates_args=())
def ukan_pairs(x: Tensor, grid_delta: float, spline_order: int, capacity: int
               ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """x [N, in] -> (sorted_elem [N*in] int32, window [N, in] int32, local_u [N, in], pair_feature [C] int32,
    pair_group [C] int64, row_start [C] int32, row_stop [C] int32, rows_needed [1] int32) for a table of
    C = capacity rows. See ``warpkan.kernels.ukan``."""
    x = x.contiguous()
    outputs = _pair_outputs(x, capacity, torch.empty, torch.zeros)
    scratch = {
        name: to_warp(torch.empty(shape, dtype=_TORCH_INT[dtype], device=x.device))
        for name, (shape, dtype) in ku.pair_scratch(x.shape[0] * x.shape[1]).items()
    }
    buffers = ku.PairBuffers(*(to_warp(t) for t in outputs))
    ku.launch_pairs(to_warp(x), grid_delta, spline_order, scratch, buffers, stream=warp_stream(x.device),
                    primitives=_PRIMITIVES)
    return outputs


@ukan_pairs.register_fake
def _(x, grid_delta, spline_order, capacity):
    def alloc(shape, dtype, device):
        return x.new_empty(shape, dtype=dtype)

    return _pair_outputs(x, capacity, alloc, alloc)


@torch.library.custom_op("warpkan::ukan_spline", mutates_args=())
def ukan_spline(
    x: Tensor,
    sorted_elem: Tensor,
    window: Tensor,
    local_u: Tensor,
    pair_feature: Tensor,
    row_start: Tensor,
    row_stop: Tensor,
    table: Tensor,
    base_weight_t: Tensor,
    scaler_t: Tensor,
    grid_delta: float,
    spline_order: int,
    use_base: bool,
) -> Tensor:
    """y [N, out] from x [N, in], the pair structure of ``ukan_pairs(x)`` and table [C * K, out];
    base_weight_t / scaler_t [in, out]."""
    x, window, local_u, table, base_weight_t, scaler_t = (
        t.contiguous() for t in (x, window, local_u, table, base_weight_t, scaler_t))
    y = x.new_empty((x.shape[0], scaler_t.shape[1]))
    ku.launch_forward(
        to_warp(x), to_warp(window), to_warp(local_u), to_warp(table), to_warp(base_weight_t),
        to_warp(scaler_t), to_warp(y), spline_order, use_base, stream=warp_stream(x.device),
    )
    return y


@ukan_spline.register_fake
def _(x, sorted_elem, window, local_u, pair_feature, row_start, row_stop, table, base_weight_t, scaler_t,
      grid_delta, spline_order, use_base):
    return x.new_empty((x.shape[0], scaler_t.shape[1]))


@torch.library.custom_op("warpkan::ukan_spline_backward", mutates_args=())
def ukan_spline_backward(
    dy: Tensor,
    x: Tensor,
    sorted_elem: Tensor,
    window: Tensor,
    local_u: Tensor,
    pair_feature: Tensor,
    row_start: Tensor,
    row_stop: Tensor,
    table: Tensor,
    base_weight_t: Tensor,
    scaler_t: Tensor,
    grid_delta: float,
    spline_order: int,
    use_base: bool,
    need_x: bool,
    need_params: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, d_base_weight_t, d_scaler_t, d_table); the ones not asked for come back empty."""
    dy, x, table, base_weight_t, scaler_t = (t.contiguous() for t in (dy, x, table, base_weight_t, scaler_t))
    dx, d_base, d_scaler, d_table = _grad_buffers(x, base_weight_t, table, need_x, need_params, torch.zeros)
    device = x.device

    def partials(name, shape, dtype):
        return to_warp(torch.empty(shape, dtype=x.dtype, device=device))

    pairs = ku.PairBuffers(
        *(to_warp(t.contiguous()) for t in (sorted_elem, window, local_u, pair_feature)),
        None, to_warp(row_start.contiguous()), to_warp(row_stop.contiguous()), None,
    )
    ku.launch_backward(
        to_warp(dy), to_warp(x), pairs, to_warp(table), to_warp(base_weight_t), to_warp(scaler_t), grid_delta,
        spline_order, use_base,
        dx=to_warp(dx) if need_x else None,
        d_base_weight_t=to_warp(d_base) if need_params else None,
        d_scaler_t=to_warp(d_scaler) if need_params else None,
        d_table=to_warp(d_table) if need_params else None,
        partials=partials,
        stream=warp_stream(device),
    )
    return dx, d_base, d_scaler, d_table


def _grad_buffers(x, base_weight_t, table, need_x, need_params, alloc):
    def make(shape, needed):
        return alloc(shape if needed else (0,), dtype=x.dtype, device=x.device)

    return (
        make(x.shape, need_x),
        make(base_weight_t.shape, need_params),
        make(base_weight_t.shape, need_params),
        make(table.shape, need_params),
    )


@ukan_spline_backward.register_fake
def _(dy, x, sorted_elem, window, local_u, pair_feature, row_start, row_stop, table, base_weight_t, scaler_t,
      grid_delta, spline_order, use_base, need_x, need_params):
    return _grad_buffers(x, base_weight_t, table, need_x, need_params, torch.empty)


def _setup_context(ctx, inputs, output):
    (x, sorted_elem, window, local_u, pair_feature, row_start, row_stop, table, base_weight_t, scaler_t,
     grid_delta, spline_order, use_base) = inputs
    ctx.save_for_backward(x, sorted_elem, window, local_u, pair_feature, row_start, row_stop, table,
                          base_weight_t, scaler_t)
    ctx.config = (grid_delta, spline_order, use_base)


def _backward(ctx, dy):
    saved = ctx.saved_tensors
    need_x = ctx.needs_input_grad[0]
    need_params = any(ctx.needs_input_grad[7:10])
    if not (need_x or need_params):
        return (None,) * 13
    dx, d_base, d_scaler, d_table = ukan_spline_backward(dy, *saved, *ctx.config, need_x, need_params)
    use_base = ctx.config[2]
    return (
        dx if need_x else None,
        None, None, None, None, None, None,
        d_table if need_params and ctx.needs_input_grad[7] else None,
        d_base if need_params and use_base and ctx.needs_input_grad[8] else None,
        d_scaler if need_params and ctx.needs_input_grad[9] else None,
        None, None, None,
    )


ukan_spline.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------------- dense-range path
# Rows of the dense basis per chunk: as the B-spline GEMM strategy, rows are processed in chunks so that no
# O(N * in * W) tensor exists, and none is kept for the backward pass.
RANGE_CHUNK_BYTES = 128 * 2**20


def group_range(x: Tensor, grid_delta: float, spline_order: int) -> tuple[Tensor, Tensor]:
    """(group_lo [in] int64, span_max [1] int32) of x [N, in] (see ``ku.launch_group_range``); no read-back.
    A plain function, not an op: only the exact (read-back) mode uses it, which refuses torch.compile."""
    x = x.contiguous()
    n_in = x.shape[1]
    group_lo = torch.empty(n_in, dtype=torch.int64, device=x.device)
    group_hi = torch.empty(n_in, dtype=torch.int64, device=x.device)
    span_max = torch.empty(1, dtype=torch.int32, device=x.device)
    ku.launch_group_range(to_warp(x), grid_delta, spline_order, to_warp(group_lo), to_warp(group_hi),
                          to_warp(span_max), stream=warp_stream(x.device))
    return group_lo, span_max


def range_encoding(group_lo: Tensor, rows_per_feature: int, pe_dim: int, spline_order: int,
                   dtype: torch.dtype) -> Tensor:
    """[in * Rt, pe_dim]: the sinusoidal encoding of group group_lo[i] - 1 + j in row i Rt + j (one launch;
    equal to :func:`positional_encoding` of those groups)."""
    out = torch.empty((group_lo.shape[0] * rows_per_feature, pe_dim), dtype=dtype, device=group_lo.device)
    ku.launch_range_encoding(to_warp(group_lo), rows_per_feature, spline_order, to_warp(out),
                             stream=warp_stream(group_lo.device))
    return out


def _range_chunk(n_rows: int, n_in: int, width: int, itemsize: int) -> int:
    return min(max(1, RANGE_CHUNK_BYTES // max(1, n_in * width * itemsize)), max(n_rows, 1))


def _range_weights(table, scaler_t, base_weight_t, spline_order, use_base, width, stream):
    n_in, n_out = scaler_t.shape
    weights = table.new_empty((n_in, width, n_out))
    ku.launch_range_weights(to_warp(table), to_warp(scaler_t), to_warp(base_weight_t), spline_order,
                            to_warp(weights), use_base, stream=stream)
    return weights


@torch.library.custom_op("warpkan::ukan_range_spline", mutates_args=())
def ukan_range_spline(
    x: Tensor,
    group_lo: Tensor,
    table: Tensor,
    base_weight_t: Tensor,
    scaler_t: Tensor,
    grid_delta: float,
    spline_order: int,
    use_base: bool,
) -> Tensor:
    """y [N, out] from x [N, in] on a dense per-feature table: ``table`` [in * Rt, out * K] is the CG-MLP
    output for the groups group_lo[i] - 1 .. group_lo[i] + Rt - 2 of every feature i, in (o, m) column
    order, and must cover every group x touches (``group_range``). The bases of a chunk of rows are expanded
    densely (Warp; SiLU in the one coefficient slot no window reaches) and multiplied by the scaled
    coefficients and base weight with cuBLAS."""
    x, group_lo, table, base_weight_t, scaler_t = (
        t.contiguous() for t in (x, group_lo, table, base_weight_t, scaler_t))
    n_rows, n_in = x.shape
    n_out = scaler_t.shape[1]
    width = table.shape[0] // max(n_in, 1) * (spline_order + 1)
    stream = warp_stream(x.device)
    if n_rows == 0 or n_in == 0:
        return x.new_zeros((n_rows, n_out))
    weights = _range_weights(table, scaler_t, base_weight_t, spline_order, use_base, width, stream).view(-1, n_out)
    y = x.new_empty((n_rows, n_out))
    chunk = _range_chunk(n_rows, n_in, width, x.element_size())
    basis = x.new_empty((chunk, n_in, width))
    x_w, lo_w = to_warp(x), to_warp(group_lo)
    for start in range(0, n_rows, chunk):
        rows = min(chunk, n_rows - start)
        part = basis[:rows]
        ku.launch_range_expand(x_w, lo_w, grid_delta, spline_order, start, to_warp(part), use_base, stream)
        torch.mm(part.view(rows, -1), weights, out=y[start : start + rows])
    return y


@ukan_range_spline.register_fake
def _(x, group_lo, table, base_weight_t, scaler_t, grid_delta, spline_order, use_base):
    return x.new_empty((x.shape[0], scaler_t.shape[1]))


@torch.library.custom_op("warpkan::ukan_range_spline_backward", mutates_args=())
def ukan_range_spline_backward(
    dy: Tensor,
    x: Tensor,
    group_lo: Tensor,
    table: Tensor,
    base_weight_t: Tensor,
    scaler_t: Tensor,
    grid_delta: float,
    spline_order: int,
    use_base: bool,
    need_x: bool,
    need_params: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, d_base_weight_t, d_scaler_t, d_table) of :func:`ukan_range_spline`; the ones not asked for come
    back empty. The bases are expanded again chunk by chunk (nothing O(N * in * W) was kept)."""
    dy, x, group_lo, table, base_weight_t, scaler_t = (
        t.contiguous() for t in (dy, x, group_lo, table, base_weight_t, scaler_t))
    n_rows, n_in = x.shape
    n_out = scaler_t.shape[1]
    width = table.shape[0] // max(n_in, 1) * (spline_order + 1)
    dx, d_base, d_scaler, d_table = _grad_buffers(x, base_weight_t, table, need_x, need_params, torch.empty)
    stream = warp_stream(x.device)
    if n_in == 0:
        return dx, d_base.zero_(), d_scaler.zero_(), d_table.zero_()
    weights = _range_weights(table, scaler_t, base_weight_t, spline_order, use_base, width, stream).view(-1, n_out)
    d_weights = x.new_zeros((n_in * width, n_out)) if need_params and n_rows == 0 else None
    chunk = _range_chunk(n_rows, n_in, width, x.element_size())
    basis = x.new_empty((chunk, n_in, width)) if need_params else None
    d_basis = x.new_empty((chunk, n_in * width)) if need_x else None
    x_w, lo_w = to_warp(x), to_warp(group_lo)
    dx_w = to_warp(dx) if need_x else None
    for start in range(0, n_rows, chunk):
        rows = min(chunk, n_rows - start)
        dy_part = dy[start : start + rows]
        if need_params:
            part = basis[:rows]
            ku.launch_range_expand(x_w, lo_w, grid_delta, spline_order, start, to_warp(part), use_base, stream)
            if d_weights is None:
                d_weights = torch.mm(part.view(rows, -1).t(), dy_part)
            else:
                d_weights.addmm_(part.view(rows, -1).t(), dy_part)
        if need_x:
            grad_part = d_basis[:rows]
            torch.mm(dy_part, weights.t(), out=grad_part)
            ku.launch_range_contract(x_w, lo_w, grid_delta, spline_order, start,
                                     to_warp(grad_part.view(rows, n_in, width)), dx_w, use_base, stream)
    if need_params:
        ku.launch_range_param_grads(to_warp(d_weights.view(n_in, width, n_out)), to_warp(table), to_warp(scaler_t),
                                    spline_order, to_warp(d_table), to_warp(d_scaler), to_warp(d_base), use_base,
                                    stream=stream)
    return dx, d_base, d_scaler, d_table


@ukan_range_spline_backward.register_fake
def _(dy, x, group_lo, table, base_weight_t, scaler_t, grid_delta, spline_order, use_base, need_x, need_params):
    return _grad_buffers(x, base_weight_t, table, need_x, need_params, torch.empty)


def _range_setup_context(ctx, inputs, output):
    x, group_lo, table, base_weight_t, scaler_t, grid_delta, spline_order, use_base = inputs
    ctx.save_for_backward(x, group_lo, table, base_weight_t, scaler_t)
    ctx.config = (grid_delta, spline_order, use_base)


def _range_backward(ctx, dy):
    need_x = ctx.needs_input_grad[0]
    need_params = any(ctx.needs_input_grad[2:5])
    if not (need_x or need_params):
        return (None,) * 8
    dx, d_base, d_scaler, d_table = ukan_range_spline_backward(dy, *ctx.saved_tensors, *ctx.config, need_x,
                                                               need_params)
    use_base = ctx.config[2]
    return (
        dx if need_x else None,
        None,
        d_table if need_params and ctx.needs_input_grad[2] else None,
        d_base if need_params and use_base and ctx.needs_input_grad[3] else None,
        d_scaler if need_params and ctx.needs_input_grad[4] else None,
        None, None, None,
    )


ukan_range_spline.register_autograd(_range_backward, setup_context=_range_setup_context)


def positional_encoding(group: Tensor, pe_dim: int, dtype: torch.dtype) -> Tensor:
    """[..., pe_dim] sinusoidal encoding of integer groups: (sin(g f_j), cos(g f_j)) interleaved with
    f_j = PE_BASE^(-2j / pe_dim). The phase is formed in float64 so |g| ~ 1e7 keeps its precision."""
    j = torch.arange(pe_dim // 2, device=group.device, dtype=torch.float64)
    freq = torch.pow(torch.full_like(j, ku.PE_BASE), -2.0 * j / pe_dim)
    phase = group.to(torch.float64).unsqueeze(-1) * freq
    return torch.stack([torch.sin(phase), torch.cos(phase)], dim=-1).flatten(-2).to(dtype)


def check_grid_delta(grid_delta) -> float:
    if isinstance(grid_delta, bool) or not isinstance(grid_delta, (int, float)):
        raise TypeError(f"grid_delta must be a number, got {type(grid_delta).__name__}")
    h = float(grid_delta)
    if not (h > 0 and h < float("inf")):
        raise ValueError(f"grid_delta must be a positive finite number, got {grid_delta!r}")
    return h
