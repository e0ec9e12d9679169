"""UKANLinear's ops: the touched pairs, the CG-MLP range table, and the layer's two tables on the edge engine's
one op pair (:mod:`warpkan.torch_bridge.edge_ops`).

On the sparse touched-pair path:

- ``warpkan::ukan_pairs(x, grid_delta, spline_order, capacity)``: the distinct (feature, group) pairs x
  touches (plus the g - 1 neighbours) in a table of ``capacity`` rows, and for each element its window in
  that table. Every output size is a function of the shapes and the capacity (no host read-back), so the
  layer runs under CUDA-graph capture and ``torch.compile`` with static shapes. The number of rows the data
  needed comes back as a one-element device tensor.
- the CG-MLP between them is ordinary torch (a small dense GEMM on the table rows), so autograd carries the
  table's gradient into the MLP's parameters;
- the spline (and optional SiLU base) on the table ``[capacity * K, out]`` (:func:`spline_layer`): the op pair on
  the shared-table UKAN family (:func:`table_spec`; :func:`warpkan.kernels.edge.ukan_family.ukan_table_family`),
  each element's window from the pair search, its backward atomic-free in the search's element order.

The dense-range path (see ``warpkan.kernels.ukan``):

- ``warpkan::ukan_group_range(x, grid_delta, spline_order)``: each feature's lowest touched group and its
  span of groups, on the device;
- ``warpkan::ukan_range_table`` (backward ``warpkan::ukan_range_table_backward``): the CG-MLP itself on
  every feature's contiguous groups, in Warp (its input rows formed on the device, fixed-order gradient sums);
- the spline on the CG-MLP output ``[in * Rt, K * out]`` ((m, o) columns: the generator reads the output
  layer's (o, m) rows in that order, ``table_k`` = K), which is the edge engine's coefficient table
  ``[in, Rt K, out]`` as it lies: the op pair on the UKAN edge family (:func:`range_spec`;
  :mod:`warpkan.kernels.edge.ukan_family`), routed as KANLinear's.

Eagerly the range table and the spline run as one ``autograd.Function`` node through the same implementations
(:func:`range_layer`); under tracing, ``ukan_range_table`` then ``edge_forward``. Both take base_weight and
spline_scaler as the layer exposes them ([out, in]) and make the transposed views inside the node.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels import ukan as ku
from ..kernels.edge.ukan_family import (ukan_family, ukan_frame_of, ukan_pairs_family, ukan_pairs_frame_of,
                                        ukan_table_family, ukan_table_frame_of)
from .edge_driver import EdgeSpec, differentiable_backward, node_cached, node_combined_weight
from .edge_ops import (static_spec_maker, edge_apply, register_higher_view, resolve_route, run_backward, run_forward,
                       stencil_param)
from ._common import (RecordedLaunches, kernel_scalar, first_order_backward, forward_mode_message, kernel_copies,
                      gemm_side_work, on_side, params_used_by_this_backward, refuse_transforms, to_warp,
                      use_registered_op, warp_stream, with_strides)

# how errors name the layer and its ops
LABEL = "UKANLinear (warpkan::ukan_pairs, ukan_group_range, ukan_range_table, edge_forward)"
SPLINE_LABEL = "UKANLinear (warpkan::ukan_pairs + edge_forward)"
RANGE_TABLE_LABEL = "UKANLinear (warpkan::ukan_range_table)"
RANGE_LAYER_LABEL = "UKANLinear (warpkan::ukan_range_table + edge_forward)"

__all__ = ["ukan_pairs", "pairs_of", "group_range", "group_range_op", "ukan_range_table", "range_layer",
           "spline_layer", "range_spec", "table_spec", "range_table_torch", "coefficient_major", "positional_encoding"]

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
        zeroed((1,), dtype=torch.int32, device=x.device),  # rows_needed
    )


def _pairs_impl(x: Tensor, grid_delta: float, spline_order: int, capacity: int) -> tuple:
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


@torch.library.custom_op("warpkan::ukan_pairs", mutates_args=())
def ukan_pairs(x: Tensor, grid_delta: float, spline_order: int, capacity: int
               ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """x [N, in] -> (sorted_elem [N*in] int32, window [N, in] int32, local_u [N, in], pair_feature [C] int32,
    pair_group [C] int64, rows_needed [1] int32) for a table of C = capacity rows. See ``warpkan.kernels.ukan``."""
    return _pairs_impl(x, grid_delta, spline_order, capacity)


def pairs_of(x: Tensor, grid_delta: float, spline_order: int, capacity: int) -> tuple:
    """:func:`ukan_pairs`, without the custom-op dispatch in eager mode (it has no gradient; the dispatch
    cost its eager call about as much host time as the pair pass's launches)."""
    if use_registered_op(x):
        return ukan_pairs(x, grid_delta, spline_order, capacity)
    return _pairs_impl(x, grid_delta, spline_order, capacity)


@ukan_pairs.register_fake
def _(x, grid_delta, spline_order, capacity):
    def alloc(shape, dtype, device):
        return x.new_empty(shape, dtype=dtype)

    return _pair_outputs(x, capacity, alloc, alloc)


@static_spec_maker("ukan_table")
def table_static_spec(spline_order: int, scalar: str, grid_delta: float, n_coef: int, use_base: bool) -> EdgeSpec:
    """The touched-pair table's spec less its frame tensors: the shared-table UKAN family (each element's window
    from the pair search), whose one table [P K, out] (``n_coef`` = P K rows) every input reads (the op pair's
    shared ``coef`` [1, P K, out])."""
    family = ukan_table_family(spline_order, scalar)
    return EdgeSpec(family, _table_frame, (), (float(grid_delta), family.scalar_name), n_coef, use_base)


def table_spec(x: Tensor, window: Tensor, local_u: Tensor, pair_feature: Tensor, grid_delta: float,
               spline_order: int, use_base: bool, n_coef: int) -> EdgeSpec:
    """The spec of the touched-pair table of ``ukan_pairs(x)`` (:func:`table_static_spec`) with its frame: each
    element's window and local coordinate, each table row's feature."""
    return table_static_spec(*_table_static_args(x, grid_delta, spline_order, use_base, n_coef)).with_frame(
        _table_frame_tensors(window, local_u, pair_feature))


def _table_static_args(x: Tensor, grid_delta: float, spline_order: int, use_base: bool, n_coef: int) -> tuple:
    return spline_order, kernel_scalar(x), float(grid_delta), n_coef, use_base


def _table_frame_tensors(window: Tensor, local_u: Tensor, pair_feature: Tensor) -> tuple:
    return window.contiguous(), local_u.contiguous(), pair_feature.contiguous()


def _table_frame(window, local_u, pair_feature, h: float, scalar: str):
    return ukan_table_frame_of(window, local_u, pair_feature, h, scalar)


def _pair_args(x: Tensor, table: Tensor, grid_delta: float, spline_order: int) -> tuple:
    """(family, frame maker, frame tensors, frame config, coef) of the engine's view of the touched-pair table
    read per feature (the UKAN pairs family): coef [in, Cmax K, out] gathers each feature's rows, differentiably,
    padded with zeros to Cmax, the most rows a feature has. The pairs are those of ``ukan_pairs(x)`` again (the
    same x gives the same pairs; the op is not given their groups), and their count is read back (this view
    serves create_graph=True, which is eager)."""
    K = spline_order + 1
    n_in, n_out = x.shape[1], table.shape[1]
    capacity = table.shape[0] // K
    _, _, _, pair_feature, pair_group, needed = pairs_of(x.detach(), grid_delta, spline_order, capacity)
    used = min(int(needed.item()), capacity)
    pair_feature, pair_group = pair_feature[:used].long(), pair_group[:used].contiguous()
    count = torch.bincount(pair_feature, minlength=n_in)
    first = torch.cumsum(count, 0) - count
    width = max(int(count.max().item()) if count.numel() else 0, 2)
    pair = torch.arange(width, device=x.device)
    valid = pair < count.unsqueeze(1)  # [in, Cmax]
    start = torch.where(valid, (first.unsqueeze(1) + pair) * K, 0)
    rows = (start.unsqueeze(2) + torch.arange(K, device=x.device)).reshape(-1)  # [in, Cmax, K] table rows
    coef = torch.where(valid.repeat_interleave(K, 1).unsqueeze(2), table[rows].view(n_in, -1, n_out), 0.0)
    family = ukan_pairs_family(spline_order, kernel_scalar(x))
    frame_tensors = (pair_group, first.to(torch.int32), count.to(torch.int32))
    return family, _pairs_frame, frame_tensors, (float(grid_delta), family.scalar_name), coef


def _pairs_frame(pair_group, first, count, h: float, scalar: str):
    return ukan_pairs_frame_of(pair_group, first, count, h, scalar)


def _table_higher_view(spec: EdgeSpec, x: Tensor, coef: Tensor) -> tuple:
    """The pair table has no dense basis (one table for every input): create_graph=True differentiates it read
    per feature by the UKAN pairs family (:func:`_pair_args`), as the dense-range path reads its range table."""
    family, make_frame, frame_tensors, frame_config, per_feature = _pair_args(
        x, coef[0], spec.frame_config[0], spec.family.n_bases - 1)
    return EdgeSpec(family, make_frame, frame_tensors, frame_config, per_feature.shape[1], spec.use_base), per_feature


register_higher_view(_table_frame, _table_higher_view)


def spline_layer(x: Tensor, sorted_elem: Tensor, window: Tensor, local_u: Tensor, pair_feature: Tensor,
                 table: Tensor, base_weight: Tensor, spline_scaler: Tensor, grid_delta: float, spline_order: int,
                 use_base: bool) -> Tensor:
    """y [N, out] from x [N, in], the pairs of ``ukan_pairs(x)`` and table [C K, out], differentiable in x, the
    table, base_weight and spline_scaler [out, in] (as UKANLinear exposes them): the op pair
    (``edge_ops.edge_apply``) on the shared-table spec, its backward the engine's atomic-free kernels (every
    gradient bitwise reproducible), taking the elements in the pair search's sorted order ``sorted_elem``."""
    static_args = _table_static_args(x, grid_delta, spline_order, use_base, table.shape[0])
    frame_tensors = _table_frame_tensors(window, local_u, pair_feature)
    return edge_apply(x, "ukan_table", static_args, frame_tensors, base_weight if use_base else None,
                      spline_scaler, table, None, "stencil", "auto", True, entry_order=sorted_elem,
                      layout="ukan_table", label=SPLINE_LABEL)


# ---------------------------------------------------------------------- dense-range path

# Recorded Warp launches of the dense-range path (see RecordedLaunches): re-pointed at each call's tensors,
# replayed on torch's current stream.
_launch = RecordedLaunches()


def _group_range_impl(x: Tensor, grid_delta: float, spline_order: int) -> tuple[Tensor, Tensor]:
    x = x.contiguous()
    n_rows, n_in = x.shape
    group_lo = torch.empty(n_in, dtype=torch.int64, device=x.device)
    span = torch.empty(n_in, dtype=torch.int32, device=x.device)
    if x.numel() == 0:  # nothing to launch on an empty batch: one group per feature
        return group_lo.zero_(), span.fill_(1)
    scratch = ku.range_search_scratch(n_rows, n_in)
    group_hi = torch.empty(scratch, dtype=torch.int64, device=x.device) if scratch else None
    _launch(ku.launch_group_range, (x, group_lo, span, group_hi), grid_delta, spline_order)
    return group_lo, span


@torch.library.custom_op("warpkan::ukan_group_range", mutates_args=())
def group_range_op(x: Tensor, grid_delta: float, spline_order: int) -> tuple[Tensor, Tensor]:
    """(group_lo [in] int64, span [in] int32) of x [N, in] (see ``ku.launch_group_range``; the table's rows a
    feature are ``span.max() + 1``); no read-back, so it captures and compiles."""
    return _group_range_impl(x, grid_delta, spline_order)


def group_range(x: Tensor, grid_delta: float, spline_order: int) -> tuple[Tensor, Tensor]:
    """:func:`group_range_op`, without the custom-op dispatch in eager mode (it has no gradient)."""
    if use_registered_op(x):
        return group_range_op(x, grid_delta, spline_order)
    return _group_range_impl(x, grid_delta, spline_order)


@group_range_op.register_fake
def _(x, grid_delta, spline_order):
    return x.new_empty((x.shape[1],), dtype=torch.int64), x.new_empty((x.shape[1],), dtype=torch.int32)


def _range_table_impl(group_lo, rows_per_feature, pe_dim, embedding, w_hidden, b_hidden, w_out, b_out, table_k,
                      keep_rows=False):
    """The table, its columns w_out's rows in the order ``table_k`` gives (``kernels.ukan.output_row``); with
    ``keep_rows``, (table, *rows): what the generator's backward reads instead of forming it again, the SIMT
    generator's (features, pre, hidden) or the tile generator's kept rows (``kernels.ukan.kept_row_width``)."""
    group_lo, embedding, w_hidden, b_hidden, w_out, b_out = (
        t.contiguous() for t in (group_lo, embedding, w_hidden, b_hidden, w_out, b_out))
    n_rows = group_lo.shape[0] * rows_per_feature
    if ku.use_tile_generator(embedding.element_size(), pe_dim, embedding.shape[1], w_hidden.shape[0]):
        table = embedding.new_empty((n_rows, w_out.shape[0]))
        kept = (embedding.new_empty((n_rows, ku.kept_row_width(embedding.element_size(), pe_dim, embedding.shape[1],
                                                                w_hidden.shape[0])))
                if keep_rows and n_rows else None)
        _launch(ku.launch_generator_forward, (group_lo, embedding, w_hidden, b_hidden, w_out, b_out, table, kept),
                pe_dim, table_k)
        return (table, kept) if keep_rows else table
    features = embedding.new_empty((n_rows, w_hidden.shape[1]))
    pre = embedding.new_empty((n_rows, w_hidden.shape[0]))
    hidden = torch.empty_like(pre)
    table = embedding.new_empty((n_rows, w_out.shape[0]))
    _launch(ku.launch_range_mlp_forward,
            (group_lo, embedding, w_hidden, b_hidden, w_out, b_out, features, pre, hidden, table), pe_dim, table_k)
    return (table, features, pre, hidden) if keep_rows else table


@torch.library.custom_op("warpkan::ukan_range_table", mutates_args=())
def ukan_range_table(group_lo: Tensor, rows_per_feature: int, pe_dim: int, embedding: Tensor, w_hidden: Tensor,
                     b_hidden: Tensor, w_out: Tensor, b_out: Tensor, table_k: int) -> Tensor:
    """The CG-MLP on the dense range, [in * Rt, B]: row i Rt + j is ``w_out silu(w_hidden f + b_hidden) +
    b_out`` for the input row f = (the ``pe_dim`` encoding of group group_lo[i] - 1 + j, embedding[i]), its
    columns w_out's B = out K rows taken coefficient-major for ``table_k`` = K (column m out + o is row
    o K + m; 1: w_out's order). One Warp launch on the tile generator, three on the SIMT one, and no torch op
    (at small N the chain of torch ops it replaces cost as much host time per step as the whole spline)."""
    return _range_table_impl(group_lo, rows_per_feature, pe_dim, embedding, w_hidden, b_hidden, w_out, b_out, table_k)


@ukan_range_table.register_fake
def _(group_lo, rows_per_feature, pe_dim, embedding, w_hidden, b_hidden, w_out, b_out, table_k):
    return embedding.new_empty((group_lo.shape[0] * rows_per_feature, w_out.shape[0]))


def _range_table_grads(embedding, w_hidden, w_out, alloc):
    return (alloc(embedding.shape, dtype=embedding.dtype, device=embedding.device),
            alloc(w_hidden.shape, dtype=w_hidden.dtype, device=w_hidden.device),
            alloc(w_hidden.shape[:1], dtype=w_hidden.dtype, device=w_hidden.device),
            alloc(w_out.shape, dtype=w_out.dtype, device=w_out.device),
            alloc(w_out.shape[:1], dtype=w_out.dtype, device=w_out.device))


def _range_table_backward_impl(d_table, group_lo, pe_dim, embedding, w_hidden, b_hidden, w_out, table_k, rows=None,
                               d_table_is_scratch=False):
    """The parameter gradients, in the parameters' own layouts (``table_k``: the forward's); ``rows``: what
    the forward kept (``_range_table_impl``'s ``keep_rows``), else the generator forms its rows again;
    ``d_table_is_scratch``: the caller's own d_table, which the tile generator may overwrite with its hidden
    gradient's shares (``ku.hidden_parts_in_table``) instead of taking a buffer of their own."""
    d_table, group_lo, embedding, w_hidden, b_hidden, w_out = (
        t.contiguous() for t in (d_table, group_lo, embedding, w_hidden, b_hidden, w_out))
    d_embedding, d_w_hidden, d_b_hidden, d_w_out, d_b_out = _range_table_grads(embedding, w_hidden, w_out,
                                                                                torch.empty)
    grads = (d_embedding, d_w_hidden, d_b_hidden, d_w_out, d_b_out)
    n_rows, n_hidden = d_table.shape[0], w_hidden.shape[0]
    if ku.use_tile_generator(embedding.element_size(), pe_dim, embedding.shape[1], n_hidden):
        shapes = ku.generator_partial_shapes(n_rows, w_out.shape[0], pe_dim, embedding.shape[1], n_hidden)
        shares_in_table = d_table_is_scratch and ku.hidden_parts_in_table(n_rows, w_out.shape[0], n_hidden)
        partials = tuple(None if shares_in_table and name == "d_hidden_parts" else d_table.new_empty(shape)
                         for name, shape in shapes.items())
        kept = rows[0] if rows else None
        _launch(ku.launch_generator_backward, (d_table, group_lo, embedding, w_hidden, b_hidden, w_out, *partials,
                                               d_w_out, d_b_out, d_w_hidden, d_b_hidden, d_embedding, kept), pe_dim,
                table_k)
        return grads
    recompute = not rows
    if recompute:
        rows = (d_table.new_empty((n_rows, w_hidden.shape[1])), d_table.new_empty((n_rows, n_hidden)),
                d_table.new_empty((n_rows, n_hidden)))
    features, pre, hidden = rows
    d_pre, d_features = torch.empty_like(pre), torch.empty_like(features)
    partial = d_table.new_empty(ku.range_mlp_partial_shape(n_rows, w_out.shape[0], n_hidden, w_hidden.shape[1]))
    _launch(ku.launch_range_mlp_backward, (d_table, group_lo, embedding, w_hidden, b_hidden, w_out, features, pre,
                                           hidden, d_pre, d_features, partial, d_w_out, d_b_out, d_w_hidden, d_b_hidden,
                                           d_embedding), pe_dim, recompute, table_k)
    return grads


@torch.library.custom_op("warpkan::ukan_range_table_backward", mutates_args=())
def ukan_range_table_backward(d_table: Tensor, group_lo: Tensor, pe_dim: int, embedding: Tensor, w_hidden: Tensor,
                              b_hidden: Tensor, w_out: Tensor, table_k: int
                              ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(d_embedding, d_w_hidden, d_b_hidden, d_w_out, d_b_out) of :func:`ukan_range_table` (the hidden layer
    recomputed; fixed-order sums, deterministic)."""
    return _range_table_backward_impl(d_table, group_lo, pe_dim, embedding, w_hidden, b_hidden, w_out, table_k)


@ukan_range_table_backward.register_fake
def _(d_table, group_lo, pe_dim, embedding, w_hidden, b_hidden, w_out, table_k):
    return _range_table_grads(embedding, w_hidden, w_out, torch.empty)


def _range_table_setup_context(ctx, inputs, output):
    group_lo, rows_per_feature, pe_dim, embedding, w_hidden, b_hidden, w_out, b_out, table_k = inputs
    ctx.save_for_backward(group_lo, embedding, w_hidden, b_hidden, w_out)
    ctx.pe_dim, ctx.table_k = pe_dim, table_k
    ctx.op_inputs = inputs  # for create_graph=True (_range_table_higher)


def _range_table_higher(ctx, inputs, d_table):
    """The CG-MLP's parameter gradients as graphs (create_graph=True), by its torch form."""
    group_lo, rows, pe_dim, *params, table_k = inputs
    wanted = [i for i in range(5) if ctx.needs_input_grad[3 + i]]
    table = range_table_torch(group_lo, rows, pe_dim, *params, table_k)
    grads = torch.autograd.grad(table, [params[i] for i in wanted], d_table, create_graph=True, allow_unused=True)
    out = [None] * 9
    for i, grad in zip(wanted, grads):
        out[3 + i] = grad
    return tuple(out)


def _range_table_backward_with(backward):
    def range_table_backward(ctx, d_table):
        if not any(ctx.needs_input_grad[3:8]):
            return (None,) * 9
        grads = backward(d_table.contiguous(), ctx.saved_tensors[0], ctx.pe_dim, *ctx.saved_tensors[1:], ctx.table_k)
        return ((None, None, None) + tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad[3:8]))
                + (None,))

    return range_table_backward


ukan_range_table.register_autograd(
    first_order_backward(RANGE_TABLE_LABEL, _range_table_backward_with(ukan_range_table_backward), _range_table_higher),
    setup_context=_range_table_setup_context)


def _range_frame(group_lo, h: float, n_groups: int, scalar: str):
    return ukan_frame_of(group_lo, h, n_groups, scalar)


@static_spec_maker("ukan_range")
def range_static_spec(spline_order: int, scalar: str, grid_delta: float, n_groups: int, n_coef: int,
                      use_base: bool) -> EdgeSpec:
    """The spec of a range table of ``n_groups`` groups a feature (n_coef = n_groups K coefficients) less its
    frame tensor (each feature's lowest group): the UKAN family; ``use_base``: the SiLU base rows fused."""
    family = ukan_family(spline_order, scalar)
    return EdgeSpec(family, _range_frame, (), (float(grid_delta), n_groups, family.scalar_name), n_coef, use_base)


def _range_static_args(x: Tensor, n_groups: int, grid_delta: float, spline_order: int, use_base: bool) -> tuple:
    """:func:`range_static_spec`'s arguments for x and a table of ``n_groups`` rows a feature."""
    return spline_order, kernel_scalar(x), float(grid_delta), n_groups, n_groups * (spline_order + 1), use_base


def _range_coef(x: Tensor, table: Tensor, spline_order: int) -> Tensor:
    """table [in Rt, K out] in (m, o) column order is coef [in, Rt K, out] as it lies."""
    return table.view(x.shape[1], -1, table.shape[1] // (spline_order + 1))


def range_spec(x: Tensor, group_lo: Tensor, table: Tensor, grid_delta: float, spline_order: int,
               use_base: bool) -> tuple[EdgeSpec, Tensor]:
    """(the edge-engine spec, coef [in, Rt K, out]) of a range table [in Rt, K out] (:func:`range_table_torch`)
    from each feature's lowest group ``group_lo`` [in], for x's dtype; ``use_base``: the SiLU base rows fused."""
    spec = range_static_spec(*_range_static_args(x, table.shape[0] // x.shape[1], grid_delta, spline_order, use_base))
    return spec.with_frame((group_lo,)), _range_coef(x, table, spline_order)


class _EagerRangeLayer(torch.autograd.Function):
    """The eager route of the dense-range layer: :func:`ukan_range_table` then the op pair's spline, their
    own implementations and gradient formulas in one autograd node (see ``eager_function``).

    Autograd runs a backward node's Python on its device thread, where this interpreter ran bytecode about
    half as fast as on the calling thread (measured on the GPU machine), so at small N every node and every
    Python step of a backward shows in the step time. One node instead of two saves a node's dispatch, its
    argument handling, and the table's round trip through the engine. It also keeps the CG-MLP's input rows
    and hidden layer for the backward (a custom op cannot return them without making them outputs), which
    saves the backward two launches; they are [in Rt, H]-sized. Under tracing the two registered ops run
    instead (:func:`range_layer`)."""

    @staticmethod
    def forward(ctx, x, group_lo, rows_per_feature, pe_dim, embedding, w_hidden, b_hidden, w_out, b_out,
                base_weight, spline_scaler, grid_delta, spline_order, use_base, deterministic, strategy, precision,
                out_dtype):
        # the node's inputs with their history: for create_graph=True, and rows_per_feature for a table recompute
        ctx.raw_inputs = (x, group_lo, rows_per_feature, pe_dim, embedding, w_hidden, b_hidden, w_out, b_out,
                          base_weight, spline_scaler, grid_delta, spline_order, use_base)
        x, group_lo = x.contiguous(), group_lo.contiguous()
        spec = range_static_spec(*_range_static_args(x, rows_per_feature, grid_delta, spline_order, use_base))
        spec = spec.with_frame((group_lo,))
        # the route resolved once, for the forward and the backward
        strategy, precision = resolve_route(spec, x, w_out.shape[0] // (spline_order + 1), strategy, precision)
        side = gemm_side_work(x, strategy)
        # the table's columns coefficient-major ((m, o)), w_out's rows read in that order by the generator: the
        # engine's coefficient table [in, Rt K, out] as it lies. On the gemm strategy in a CUDA-graph capture
        # the CG-MLP runs on a side stream, beside the spline's basis expansion, which does not read the table
        with on_side(side):
            table, *rows = _range_table_impl(group_lo, rows_per_feature, pe_dim, embedding, w_hidden, b_hidden,
                                             w_out, b_out, spline_order + 1, keep_rows=True)
        coef = _range_coef(x, table, spline_order)
        # [out, in] parameters: their [in, out] operands made here, not as autograd nodes of their own, once for
        # the forward and the backward: views (the gemm strategy's combine kernel reads any strides; the stencil
        # kernels, a small call's in place), or a copy of a large contiguous parameter (edge_ops.stencil_param)
        base_weight_t = base_weight.t() if use_base else None
        scaler_t = spline_scaler.t()
        if strategy == "stencil":
            base_weight_t, scaler_t = stencil_param(base_weight_t, x.shape[0]), stencil_param(scaler_t, x.shape[0])
        keep = {}  # what the gemm strategy keeps for the backward (its weight, and its basis where it fits)
        y = run_forward(spec, x, base_weight_t, scaler_t, coef, None, strategy, precision, keep, out_dtype, side=side)
        ctx.kept = keep or None
        ctx.save_for_backward(x, group_lo, base_weight_t, scaler_t, embedding, w_hidden, b_hidden, w_out, b_out)
        ctx.config = (pe_dim, grid_delta, spline_order, use_base, deterministic)
        ctx.route = (strategy, precision)
        # the table and the rows are kept outside the saved tensors so that the backward can let them go as
        # soon as it is done with them: the table after the spline's gradients (the CG-MLP's backward does not
        # read it), which takes a table-sized buffer off the step's peak memory
        ctx.table, ctx.rows = table, rows
        return y

    @staticmethod
    def jvp(ctx, *tangents):
        raise NotImplementedError(forward_mode_message(RANGE_LAYER_LABEL))

    @staticmethod
    def backward(ctx, dy):
        if torch.is_grad_enabled():  # create_graph=True: gradients as graphs (range_layer_higher_grads)
            return _range_layer_higher(ctx, dy)
        return _EagerRangeLayer.first_order_backward(ctx, dy)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def first_order_backward(ctx, dy):
        x, group_lo, base_weight_t, scaler_t, embedding, w_hidden, b_hidden, w_out, b_out = ctx.saved_tensors
        pe_dim, grid_delta, spline_order, use_base, deterministic = ctx.config
        need = ctx.needs_input_grad
        need_mlp = any(need[4:9])
        need_x, need_params = need[0], need_mlp or need[9] or need[10]
        # a second backward of a retained graph recomputes the table and the rows
        table, rows, ctx.table, ctx.rows = ctx.table, ctx.rows, None, None
        grads = [None] * 18
        if not (need_x or need_params):
            return tuple(grads)
        if table is None:
            rows_per_feature = ctx.raw_inputs[2]
            table = _range_table_impl(group_lo, rows_per_feature, pe_dim, embedding, w_hidden, b_hidden, w_out, b_out,
                                      spline_order + 1)
        spec, coef = range_spec(x, group_lo, table, grid_delta, spline_order, use_base)
        # on the gemm strategy in a CUDA-graph capture, the parameter gradients and the CG-MLP's backward run on a
        # side stream, beside the basis gradient's product and contraction (dx)
        side = gemm_side_work(x, ctx.route[0])
        dx, d_base, d_scaler, d_coef, _ = run_backward(spec, dy.contiguous(), x, base_weight_t, scaler_t, coef, None,
                                                       *ctx.route, deterministic, need_x, need_params, False,
                                                       ctx.kept, side=side)
        d_table = d_coef.view(table.shape) if need_params else d_coef
        if side is not None:
            side.hold(table)  # the side stream's split reads it
        del table, coef
        if need_mlp:
            # d_table is this node's own (the spline's gradient of the table): the generator may write over it
            with on_side(side):
                mlp_grads = _range_table_backward_impl(d_table, group_lo, pe_dim, embedding, w_hidden, b_hidden,
                                                       w_out, spline_order + 1, rows=rows, d_table_is_scratch=True)
            for index, grad in zip(range(4, 9), mlp_grads):
                if need[index]:
                    grads[index] = grad
        if side is not None:
            side.join()
        if need_x:
            grads[0] = dx
        # in the parameters' own strides where the transpose kernel copied them (see eager_function)
        for index, grad in ((9, d_base if use_base else None), (10, d_scaler)):
            if need[index] and grad is not None:
                param_t = ctx.raw_inputs[index].t()
                grads[index] = (with_strides(grad, param_t.stride()) if kernel_copies(param_t) else grad).t()
        return tuple(grads)


def coefficient_major(w_out: Tensor, b_out: Tensor, table_k: int) -> tuple[Tensor, Tensor]:
    """The CG-MLP output layer's rows, (o, m) = o K + m, taken in the spline table's (m, o) order for
    ``table_k`` = K (what ``kernels.ukan.output_row`` reads in place), by torch ops: for the torch forms of the
    CG-MLP (differentiable to any order; the copies' backward is a copy, not an index scatter)."""
    if table_k == 1:
        return w_out, b_out
    return (w_out.view(-1, table_k, w_out.shape[1]).transpose(0, 1).reshape(w_out.shape),
            b_out.view(-1, table_k).t().reshape(b_out.shape))


def range_table_torch(group_lo, rows_per_feature: int, pe_dim: int, embedding, w_hidden, b_hidden, w_out, b_out,
                      table_k: int = 1):
    """What :func:`ukan_range_table` computes, by torch ops (differentiable to any order): the CG-MLP on the
    rows (encoding of group group_lo[i] - 1 + j, embedding[i]), w_out's rows taken coefficient-major for
    ``table_k`` = K (1: in their order)."""
    w_out, b_out = coefficient_major(w_out, b_out, table_k)
    n_in = group_lo.shape[0]
    steps = torch.arange(rows_per_feature, device=group_lo.device)
    groups = (group_lo.unsqueeze(1) - 1 + steps).reshape(-1)
    features = torch.cat([positional_encoding(groups, pe_dim, embedding.dtype),
                          embedding.repeat_interleave(rows_per_feature, dim=0)], dim=-1)
    hidden = torch.nn.functional.silu(torch.nn.functional.linear(features, w_hidden, b_hidden))
    return torch.nn.functional.linear(hidden, w_out, b_out).view(n_in * rows_per_feature, -1)


def _spline_higher_outputs(ctx, n_inputs: int, params: dict, base_index: int, use_base: bool, grads_of) -> tuple:
    """The gradient tuple of a UKAN spline node's create_graph=True backward (``n_inputs`` entries): dx first,
    and the gradients of the parameters ``params`` ({input index: tensor}) that autograd wants from this
    backward (none when it uses no parameter gradient; the base weight's, at ``base_index``, only with the base
    path). ``grads_of(wrt)`` -> (dx, gradients of the tensors ``wrt``)."""
    need = ctx.needs_input_grad
    wanted = ([i for i in params if need[i] and (i != base_index or use_base)]
              if params_used_by_this_backward(ctx) else [])
    dx, grads = grads_of([params[i] for i in wanted])
    out = [None] * n_inputs
    out[0] = dx
    for index, grad in zip(wanted, grads):
        out[index] = grad
    return tuple(out)


def range_spline_higher_grads(ctx, dy, x, group_lo, table, base_weight_t, scaler_t, grid_delta, spline_order,
                              use_base, need_x, wrt: list):
    """(dx, gradients of ``wrt``) of the range spline as differentiable graphs (create_graph=True): the
    engine's dense basis of the range table's spec (:func:`range_spec`) and its x-derivatives, and the combined
    weight made from the table (and so from what it was made from), ``base_weight_t`` and ``scaler_t``, once a
    node (``node_combined_weight``: ``wrt`` must be the parameters themselves, which every call's views lead
    to)."""
    spec, coef = range_spec(x, group_lo, table, grid_delta, spline_order, use_base)
    weight = node_combined_weight(ctx, spec.family, base_weight_t, scaler_t, coef, use_base)
    dx, d_weight = differentiable_backward(spec, dy, x.contiguous(), weight, need_x, bool(wrt))
    grads = torch.autograd.grad(weight, wrt, d_weight, create_graph=True, allow_unused=True) if wrt else ()
    return dx, grads


def _range_layer_higher(ctx, dy):
    """The eager range layer's gradients for create_graph=True: the table by torch ops from the node's inputs
    (so that every gradient carries their history), the spline by the engine's differentiable dense basis
    (:func:`range_spline_higher_grads`). The table and the combined weight are made once a node
    (``node_cached``: u_x and u_xx pass the node twice); the gradients are asked of the parameters themselves."""
    (x, group_lo, rows, pe_dim, embedding, w_hidden, b_hidden, w_out, b_out, base_weight, spline_scaler, grid_delta,
     spline_order, use_base) = ctx.raw_inputs
    mlp = (embedding, w_hidden, b_hidden, w_out, b_out)
    table = node_cached(ctx, "_range_table", mlp, lambda: range_table_torch(
        group_lo, rows, pe_dim, embedding, w_hidden, b_hidden, w_out, b_out, spline_order + 1))
    params = {4: embedding, 5: w_hidden, 6: b_hidden, 7: w_out, 8: b_out, 9: base_weight, 10: spline_scaler}
    dy = dy.to(x.dtype)  # an autocast caller's (the node's out_dtype)
    return _spline_higher_outputs(
        ctx, 18, params, 9, use_base,
        lambda wrt: range_spline_higher_grads(ctx, dy, x, group_lo, table, base_weight.t(), spline_scaler.t(),
                                              grid_delta, spline_order, use_base, ctx.needs_input_grad[0], wrt))


def range_layer(x: Tensor, group_lo: Tensor, rows_per_feature: int, pe_dim: int, embedding: Tensor,
                w_hidden: Tensor, b_hidden: Tensor, w_out: Tensor, b_out: Tensor, base_weight: Tensor,
                spline_scaler: Tensor, grid_delta: float, spline_order: int, use_base: bool,
                deterministic: bool = False, strategy: str = "stencil", precision: str = "fp32",
                out_dtype: "torch.dtype | None" = None) -> Tensor:
    """y [N, out] of the dense-range path: the CG-MLP table on each feature's rows_per_feature groups from
    group_lo - 1 (:func:`ukan_range_table`), then the spline on it (``edge_forward``); base_weight and
    spline_scaler [out, in]. Under tracing, those two registered ops; eagerly, one autograd node running the
    same implementations (refused under torch.func transforms). ``out_dtype``: y's dtype where it is not x's
    (an autocast caller's), made by the node itself as ``edge_ops.edge_apply`` makes it."""
    if out_dtype == x.dtype:
        out_dtype = None
    if use_registered_op(x):
        table = ukan_range_table(group_lo, rows_per_feature, pe_dim, embedding, w_hidden, b_hidden, w_out, b_out,
                                 spline_order + 1)
        return edge_apply(x, "ukan_range", _range_static_args(x, rows_per_feature, grid_delta, spline_order, use_base),
                          (group_lo,), base_weight if use_base else None, spline_scaler,
                          _range_coef(x, table, spline_order), None, strategy, precision, deterministic,
                          layout="ukan_range", label=RANGE_LAYER_LABEL, out_dtype=out_dtype)
    refuse_transforms(RANGE_LAYER_LABEL)
    return _EagerRangeLayer.apply(x, group_lo, rows_per_feature, pe_dim, embedding, w_hidden, b_hidden, w_out, b_out,
                                  base_weight, spline_scaler, grid_delta, spline_order, use_base, deterministic,
                                  strategy, precision, out_dtype)


def positional_encoding(group: Tensor, pe_dim: int, dtype: torch.dtype) -> Tensor:
    """[..., pe_dim] sinusoidal encoding of integer groups: (sin(g f_j), cos(g f_j)) interleaved with
    f_j = PE_BASE^(-2j / pe_dim). The phase is formed in float64 so |g| ~ 1e7 keeps its precision."""
    j = torch.arange(pe_dim // 2, device=group.device, dtype=torch.float64)
    freq = torch.pow(torch.full_like(j, ku.PE_BASE), -2.0 * j / pe_dim)
    phase = group.to(torch.float64).unsqueeze(-1) * freq
    return torch.stack([torch.sin(phase), torch.cos(phase)], dim=-1).flatten(-2).to(dtype)
