"""``UKANLinear``: the unbounded-grid KAN layer (UKAN) with a coefficient-generator MLP, on Warp kernels."""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import ukan as ku
from ._common import (FLOAT_DTYPES, Float32Or64Module, autocast_dtype, call_precision, check_device,
                      check_input_dtype, check_tensor, layer_dtype, on_rows, refuse_transforms, use_registered_op)
from .bspline_ops import STRATEGIES, check_precision
from .edge_driver import EdgeView, check_view_rows
from .kan_linear import KANLinear, base_activation_module, l1_entropy_loss, base_repr, fuses_base, init_public, layout_parameter
from .ukan_ops import (LABEL, coefficient_major, group_range, pairs_of, positional_encoding, range_layer, range_spec,
                       range_table_torch, spline_layer)

__all__ = ["UKANLinear"]


# the table capacity per feature when table_groups is None (then grown to the exact need when exceeded)
_DEFAULT_TABLE_GROUPS = 16
# The dense-range path (the edge engine's UKAN family on each feature's contiguous range of groups: a
# B-spline on that piece of the unbounded grid, on the warp-tiled kernels on CUDA) is taken when the widest
# feature needs at most this many coefficients per input; wider spans (outliers, very fine grids) take the
# sparse touched-pair path, whose cost does not grow with the span. 280 is about what the float32 tiled
# passes reach (the forward on two bands of its 144-row table: 282 slots).
DENSE_MAX_COEFFICIENTS = 280

def _allocation_rows(rows: int) -> int:
    """``rows`` rounded up to a multiple of 1024: similar batches then reuse one allocation size."""
    return -(-rows // 1024) * 1024


class UKANLinear(Float32Or64Module):
    """y = base_weight @ act(x) + sum_i spline_scaler[o, i] * spline_{o,i}(x_i) on an unbounded uniform grid.

    ``base_activation`` (``act``) as in :class:`KANLinear`: "silu" (the default, fused into the kernels), any
    ``nn.Module`` class or instance (run in torch), or None for no base path.

    Knots lie at every multiple of ``grid_delta`` (h), from -inf to +inf; no input normalisation and no grid
    range. With K = k + 1, the cells are grouped K at a time: x falls in cell ``c = floor(x / h)``, group
    ``g = floor(c / K)``. A coefficient-generator MLP (``cg_hidden`` -> SiLU -> ``cg_out``) maps the
    concatenation of a sinusoidal encoding of g (``pe_dim``) and a learned embedding of the feature index
    (``feature_embedding``, ``embed_dim``) to ``C_g`` [out, K]; the cell's K coefficients are the window
    ``[C_{g-1}; C_g][r : r + K]`` with ``r = c mod K``.

    The CG-MLP runs only on a table of (feature, group) rows, never per sample. Two paths compute the spline
    (the same map):

    - **dense range**: per feature, every group from its lowest touched one - 1 on (a B-spline on that
      contiguous piece of the unbounded grid), on the edge engine's kernels as KANLinear's stencil strategy
      (warp-tiled on CUDA). Taken while the widest feature needs at most ``dense_max_coefficients``
      (:data:`DENSE_MAX_COEFFICIENTS`) coefficients per input.
    - **sparse pairs**: only the distinct (feature, group) pairs the batch touches and their g - 1
      neighbours (a sort of the elements by pair), its cost independent of the span: for outliers and very
      fine grids.

    In a step captured in a CUDA graph (:func:`~warpkan.torch_bridge.graphed_training_step`), the dense range
    on the gemm strategy runs the CG-MLP on a side stream of its own, beside the spline's basis work, in both
    passes (results bitwise those of one stream): the graphed step of a small batch is 14-18% shorter.

    - ``table_groups=None`` (default, exact): the table is sized from the data, which reads one integer
      back to the host per forward (the widest feature's span; then, on the sparse path, the needed row
      count), so this mode cannot run under ``torch.compile`` or CUDA-graph capture (it says so rather than
      truncating).
    - ``table_groups=R``: a fixed size, a function of the shapes alone: nothing is read back, and the layer
      compiles and captures. On the dense-range path (``(R + 1) K <= dense_max_coefficients``) each feature
      gets the R groups from its lowest touched one; elements of a feature spanning more groups get a zero
      spline term past them. Otherwise the sparse table has a fixed capacity of
      ``min(2 N in, max(in * R, 1024))`` rows shared by the features (a feature whose inputs span R groups
      uses about R + 1), and the elements of the pairs past it get a zero spline term. Like off-grid inputs
      of a bounded KAN; :meth:`table_overflow` tells (it reads a count back, so call it off the hot path).

    Inputs with ``|x| / h`` beyond 2^39 are evaluated at that limit (finite, zero spline slope); NaN gives a
    zero spline term. The spline gradients of the sparse path are bitwise reproducible (stable sort, no
    floating-point atomics); the dense-range path's backward, and the sparse path's gradient of the feature
    embedding, add by atomics on CUDA, as KANLinear's backward does, unless ``deterministic=True`` (then
    fixed-order sums everywhere: bitwise reproducible run to run).

    ``base_weight`` and ``spline_scaler`` [out, in] are stored contiguously (every torch optimiser and utility
    takes them: LBFGS, ``parameters_to_vector``, FSDP2). The kernels read them where they lie, except the
    stencil strategy on a large call, which copies them into the kernels' [in, out] layout once a step (see
    ``KANLinear``); ``contiguous_parameters=False`` stores them as views of that layout, as ``KANLinear``'s.

    dtypes: the layer computes in float32 or float64. Under bf16/fp16 autocast it computes in fp32 and returns
    the autocast dtype; ``.half()``, ``.bfloat16()`` and other conversions to a 16-bit dtype are refused with a
    TypeError (the layer is left unchanged).

    Higher-order derivatives (``create_graph=True``) work on both paths: the spline's from the edge engine's
    dense basis and its x-derivatives (to the third order; on the sparse pair path the engine reads the table
    per feature, padded to the feature with most touched groups), the CG-MLP's by its torch form. Every path
    refuses the ``torch.func`` transforms. Built with ``device="meta"``, the layer infers output shapes on meta
    inputs (then with a nominal table).

    Args:
        in_features: number of inputs (a positive int).
        out_features: number of outputs (a positive int).
        spline_order: order k of the B-splines, an int in [1, 5] (3: cubic).
        grid_delta: the knot spacing h, a positive finite number.
        pe_dim: width of the sinusoidal encoding of the group index, a non-negative even int.
        embed_dim: width of the learned embedding of the feature index, a non-negative int
            (``pe_dim + embed_dim`` must be positive: it is the CG-MLP's input width).
        hidden_dim: the CG-MLP's hidden width (a positive int).
        base_activation: the base path's activation (above): ``"silu"`` (fused), an ``nn.Module`` class or
            instance (run in torch), or None for no base path.
        deterministic: bitwise-reproducible gradients on every path (the dense-range backward then takes the
            engine's atomic-free kernels, as ``KANLinear(deterministic=True)``, and the sparse path gathers the
            feature embedding by indexing, whose backward is sort-based).
        table_groups: None for the exact, data-sized table (one integer read back per forward), or a
            positive int R for the fixed-size table (nothing read back; see above).
        strategy: how the dense-range path computes the spline, as ``KANLinear``'s: ``"stencil"`` (the edge
            engine's per-edge kernels), ``"gemm"`` (the dense basis contracted on cuBLAS) or ``"auto"`` (the
            B-spline layer's rule by shape, :func:`warpkan.torch_bridge.choose_strategy`). The sparse pair
            path always runs the stencil kernels.
        precision: ``"auto"``, ``"fp32"``, ``"tf32"`` or ``"bf16"``: the gemm strategy's contractions (as
            ``KANLinear``'s; ``"auto"`` is bf16 under bf16 autocast, else torch's float32 matmul setting).
        contiguous_parameters: store the parameters contiguously in their public shapes (the default; every
            torch optimiser and utility takes them), or as views of the kernels' layout (False).
        device: the device of the parameters (torch's default when None).
        dtype: ``torch.float32`` or ``torch.float64`` (torch's default dtype when None).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        spline_order: int = 3,
        grid_delta: float = 0.1,
        pe_dim: int = 16,
        embed_dim: int = 8,
        hidden_dim: int = 32,
        base_activation="silu",
        table_groups: int | None = None,
        contiguous_parameters: bool = True,
        deterministic: bool = False,
        strategy: str = "auto",
        precision: str = "auto",
        device=None,
        dtype=None,
    ):
        super().__init__()
        check_device(device)
        (in_features, out_features, spline_order, grid_delta, pe_dim, embed_dim, hidden_dim,
         table_groups) = ku.check_layer_args(in_features, out_features, spline_order, grid_delta, pe_dim, embed_dim,
                                             hidden_dim, table_groups)
        dtype = layer_dtype(dtype)
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        check_precision(precision, dtype)
        self.strategy, self.precision = strategy, precision
        self.in_features, self.out_features = in_features, out_features
        self.spline_order = spline_order
        self.grid_delta = grid_delta
        self.pe_dim, self.embed_dim, self.hidden_dim = pe_dim, embed_dim, hidden_dim
        self.table_groups = table_groups
        self.deterministic = bool(deterministic)
        self.base_activation = base_activation_module(base_activation, device, dtype)
        K = spline_order + 1
        factory = {"device": device, "dtype": dtype}
        self.feature_embedding = nn.Parameter(torch.empty(in_features, embed_dim, **factory))
        self.cg_hidden = nn.Linear(pe_dim + embed_dim, hidden_dim, **factory)
        self.cg_out = nn.Linear(hidden_dim, out_features * K, **factory)
        # [out, in], contiguous or (contiguous_parameters=False) views of the kernels' [in, out] layout
        self.base_weight = layout_parameter((in_features, out_features), (1, 0), device, dtype, contiguous_parameters)
        self.spline_scaler = layout_parameter((in_features, out_features), (1, 0), device, dtype,
                                              contiguous_parameters)
        # (pair_feature, pair_group, rows_needed) of the last sparse-path forward: no autograd graph, so the step's
        # table and CG-MLP activations go with its backward (regularization_loss recomputes the table), and none
        # of an earlier step's is freed inside a later one (a CUDA-graph capture after eager steps)
        self._last = None
        self._last_range_x = None  # the input of the last dense-range forward
        self._last_range_span = None  # and how many groups each of its features spanned ([in] device tensor)
        self._pair_rows_hint = 0  # the sparse path's table capacity to start from (exact mode; see _pairs)
        self.dense_max_coefficients = DENSE_MAX_COEFFICIENTS
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        nn.init.normal_(self.feature_embedding)
        self.cg_hidden.reset_parameters()
        self.cg_out.reset_parameters()
        for param in (self.base_weight, self.spline_scaler):  # the same values whatever contiguous_parameters
            init_public(param, lambda t: nn.init.kaiming_uniform_(t, a=math.sqrt(5)))
        if not self.use_base:
            self.base_weight.zero_()

    # ---------------------------------------------------------------- the coefficient generator
    def generate_coefficients(self, pair_feature: torch.Tensor, pair_group: torch.Tensor) -> torch.Tensor:
        """C_g [P, out, K] (unscaled) for the (feature, group) pairs given as two [P] integer tensors."""
        out = self.cg_out(F.silu(self.cg_hidden(self._pair_inputs(pair_feature, pair_group))))
        return out.view(-1, self.out_features, self.spline_order + 1)

    def _pair_inputs(self, pair_feature: torch.Tensor, pair_group: torch.Tensor) -> torch.Tensor:
        """The CG-MLP's input rows [P, pe_dim + embed_dim] of the pairs: the group's encoding, the feature's
        embedding. Every feature owns a run of pairs, so the embedding's gradient sums thousands of rows into
        each of a few rows. Indexing's CUDA backward (``embedding[idx]``: sorted, each index's duplicates walked
        in order by one warp) is reproducible but slow at that: 1.46 ms of a 5.05 ms sparse-path step at
        N = 65536, 32 inputs, h = 2/256 on the H200, where ``F.embedding``'s (segments of the sorted index,
        combined by atomics) takes the step to 3.66 ms. So ``F.embedding`` by default, indexing when the layer
        is ``deterministic`` or torch is set to deterministic algorithms: torch 2.11 accepts ``F.embedding``'s
        backward in that mode, but whether it then stays bitwise repeatable was not measured."""
        index = pair_feature.long()
        reproducible = self.deterministic or torch.are_deterministic_algorithms_enabled()
        embedding = self.feature_embedding[index] if reproducible else F.embedding(index, self.feature_embedding)
        return torch.cat([positional_encoding(pair_group, self.pe_dim, self.cg_hidden.weight.dtype), embedding],
                         dim=-1)

    def _table(self, pair_feature: torch.Tensor, pair_group: torch.Tensor) -> torch.Tensor:
        """The table as the kernels read it: [P * K, out] (C_g of row p is rows p K .. p K + K - 1)."""
        hidden = F.silu(self.cg_hidden(self._pair_inputs(pair_feature, pair_group)))
        # the kernels read the table as [P, K, out]: cg_out's rows (o, m) taken in (m, o) order
        out = F.linear(hidden, *coefficient_major(self.cg_out.weight, self.cg_out.bias, self.spline_order + 1))
        return out.view(-1, self.out_features)

    def _capacity(self, n_rows: int) -> int:
        return ku.table_capacity(n_rows, self.in_features, self.table_groups or _DEFAULT_TABLE_GROUPS)

    def _pairs(self, x2: torch.Tensor):
        # detached: the pair structure (local_u included) is piecewise constant data for the spline op, whose
        # own backward carries the gradient into x
        capacity = self._capacity(x2.shape[0])
        if self.table_groups is None:  # at least what the last batch needed, with headroom (see below)
            capacity = max(capacity, min(self._pair_rows_hint, 2 * x2.numel()))
        pairs = pairs_of(x2.detach(), self.grid_delta, self.spline_order, capacity)
        if self.table_groups is not None:
            return pairs
        self._refuse_capture()
        needed = int(pairs[5].item())
        if needed > capacity:  # grown, rounded up so that similar batches reuse one allocation size
            pairs = pairs_of(x2.detach(), self.grid_delta, self.spline_order, _allocation_rows(needed))
        # the next batch starts from this one's need and a quarter more: a batch of similar data then takes one
        # pair pass instead of two (a fine grid on normal data needs ~10x the default capacity every step)
        self._pair_rows_hint = _allocation_rows(needed + needed // 4)
        # the CG-MLP runs on the needed rows only: the rows past them are padding with no elements
        sorted_elem, window, local_u, feature, group, count = pairs
        return sorted_elem, window, local_u, feature[:needed], group[:needed], count

    def _fixed_range(self) -> bool:
        """Whether the fixed-size mode takes the dense-range path (else the fixed-capacity sparse one)."""
        return self.table_groups is not None and (self.table_groups + 1) * (self.spline_order + 1) <= \
            self.dense_max_coefficients

    def _refuse_capture(self):
        if torch.compiler.is_compiling() or (self.spline_scaler.is_cuda and torch.cuda.is_current_stream_capturing()):
            raise RuntimeError(
                "UKANLinear(table_groups=None) sizes its table by reading a row count back to the host, "
                "which torch.compile and CUDA-graph capture cannot do: construct it with table_groups=R"
            )

    def _range_forward(self, x2, group_lo, span, rows_per_feature, precision, out_dtype=None):
        """The dense-range path: the CG-MLP on every group from each feature's lowest touched group - 1 to
        lowest + Rt - 2 (a superset of the touched pairs and their g - 1 neighbours), then a B-spline GEMM."""
        self._last = None
        self._last_range_x = x2.detach()  # the regulariser recomputes the touched pairs from it
        self._last_range_span = span
        return range_layer(x2, group_lo, rows_per_feature, self.pe_dim, self.feature_embedding, self.cg_hidden.weight,
                           self.cg_hidden.bias, self.cg_out.weight, self.cg_out.bias, self.base_weight,
                           self.spline_scaler, self.grid_delta, self.spline_order, fuses_base(self.base_activation),
                           self.deterministic, self.strategy, precision, out_dtype)

    def edge_view(self, x: torch.Tensor, *, dense_only: bool = False) -> EdgeView:
        """The layer as the edge engine sees it at the rows ``x``: the UKAN family on the dense-range table of
        x (the CG-MLP on every group from each feature's lowest touched one - 1 on, made by torch ops), the base
        weight and scaler it combines, and a base activation run in torch (any but the fused SiLU). What
        Taylor mode and the interpretability tools evaluate the layer's edges with.

        The table holds the groups of the forward's dense-range path: ``table_groups + 1`` a feature in the
        fixed-size mode where that path is taken (groups past them get no spline term, as in the forward),
        else every group x spans (its count read back to the host: refused under ``torch.compile`` and
        CUDA-graph capture with ``table_groups=None``). Where the forward takes the touched-pair path (the
        span wider than ``dense_max_coefficients``, or a fixed size past it) the table is the same map on the
        dense range, as wide as x's span.

        Args:
            x: rows [N, in] of the layer's dtype and device.
            dense_only: raise NotImplementedError, before any table is made, where the layer's forward at x
                takes the touched-pair path: for callers that must compute what the forward computes.

        Returns:
            EdgeView: ``coef`` [in, Rt K, out] is the table (differentiable in the CG-MLP's parameters and the
            feature embedding), ``base_weight_t`` and ``scaler_t`` [in, out] views of the parameters; no bias.
        """
        check_view_rows(x, self.in_features, self.spline_scaler)
        K = self.spline_order + 1
        if self._fixed_range():
            group_lo, _ = group_range(x.detach(), self.grid_delta, self.spline_order)
            rows_per_feature = self.table_groups + 1
        else:
            if dense_only and self.table_groups is not None:
                self._refuse_pair_table(self.table_groups + 1)
            if self.table_groups is None:
                self._refuse_capture()
            group_lo, span = group_range(x.detach(), self.grid_delta, self.spline_order)
            rows_per_feature = int(span.max().item()) + 1  # groups lowest - 1 .. highest of the widest feature
            if dense_only and rows_per_feature * K > self.dense_max_coefficients:
                self._refuse_pair_table(rows_per_feature)
        table = range_table_torch(group_lo, rows_per_feature, self.pe_dim, self.feature_embedding,
                                  self.cg_hidden.weight, self.cg_hidden.bias, self.cg_out.weight, self.cg_out.bias, K)
        fused = fuses_base(self.base_activation)
        spec, coef = range_spec(x, group_lo, table, self.grid_delta, self.spline_order, fused)
        return EdgeView(spec, coef, self.base_weight.t(), self.spline_scaler.t(), None,
                        None if fused else self.base_activation)

    def _refuse_pair_table(self, rows_per_feature: int):
        raise NotImplementedError(
            f"UKANLinear: at these rows the forward takes the touched-pair table ({rows_per_feature} groups a "
            f"feature need {rows_per_feature * (self.spline_order + 1)} coefficients, more than "
            f"dense_max_coefficients={self.dense_max_coefficients}), which has no dense basis: raise "
            "dense_max_coefficients or grid_delta")

    @torch.no_grad()
    def table_overflow(self, x: torch.Tensor | None = None) -> int:
        """How many table rows the last forward (or ``x``) needed beyond the capacity (0: none; then every
        element got its spline term). Reads one integer back to the host."""
        if x is not None:
            check_tensor("x", x, ndim_min=1, last_dim=self.in_features, dtypes=())
            x2 = x.reshape(-1, self.in_features).to(self.spline_scaler.dtype)
            if self._fixed_range():
                _, span = group_range(x2, self.grid_delta, self.spline_order)
                return max(0, int(span.max().item()) - self.table_groups)
            pairs = self._pairs(x2)
            needed, capacity = pairs[5], pairs[3].shape[0]
        elif self._last is not None:
            needed, capacity = self._last[2], self._last[0].shape[0]
        elif self._last_range_x is not None:  # dense range: the widest feature's groups past the table's
            if self.table_groups is None:
                return 0  # sized from the data: covers every group
            return max(0, int(self._last_range_span.max().item()) - self.table_groups)
        else:
            raise RuntimeError("table_overflow needs a forward pass first, or pass x")
        return max(0, int(needed.item()) - capacity)

    # ---------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """y (..., out) for x (..., in): a tensor of the layer's dtype and device (any float dtype under
        autocast, the result then in the autocast dtype). With ``table_groups=None`` one integer is read back
        to size the table. Non-contiguous x works; an empty batch gives an empty output."""
        check_tensor("x", x, ndim_min=1, last_dim=self.in_features, dtypes=())
        dtype = self.spline_scaler.dtype
        if x.device != self.spline_scaler.device:
            raise ValueError(f"x must be on the layer's device {self.spline_scaler.device}, got {x.device}")
        cast_to = autocast_dtype(x.device)
        precision = call_precision(self.precision, cast_to, dtype)
        if cast_to is not None:
            with torch.autocast(x.device.type, enabled=False):
                # y in the autocast dtype from the range path's node where nothing is added to it (as
                # KANLinear's); .to is then no op
                return self._forward(x.to(dtype), precision, cast_to).to(cast_to)
        check_input_dtype(x, dtype, FLOAT_DTYPES)
        return self._forward(x, precision)

    def __getstate__(self):
        # what the last forward left for table_overflow() and regularization_loss() (tensors of its graph,
        # which deepcopy refuses) is not the layer's state: copies and pickles start without it, as a new layer
        state = dict(self.__dict__)
        state.update(_last=None, _last_range_x=None, _last_range_span=None)
        return state

    @property
    def use_base(self) -> bool:
        """Whether the layer has a base path (``base_activation`` is not None)."""
        return self.base_activation is not None

    def _forward(self, x, precision, out_dtype=None):
        activation = self.base_activation
        alone = activation is None or fuses_base(activation)  # y is the node's output as it is
        y = on_rows(x, self.in_features, lambda x2: self._forward_rows(x2, precision, out_dtype if alone else None))
        if alone:
            return y
        return y + F.linear(activation(x), self.base_weight)

    def _forward_rows(self, x2, precision, out_dtype=None):
        K = self.spline_order + 1
        if not use_registered_op(x2):
            refuse_transforms(LABEL)  # before the first Warp launch (group_range, ukan_pairs)
        if self.table_groups is None and x2.is_meta:
            # shapes only: no values to size the table from, and y's shape does not depend on it
            group_lo, span = group_range(x2, self.grid_delta, self.spline_order)
            return self._range_forward(x2, group_lo, span, 2, precision, out_dtype)
        if self.table_groups is None:
            self._refuse_capture()
            group_lo, span = group_range(x2.detach(), self.grid_delta, self.spline_order)
            rows_per_feature = int(span.max().item()) + 1  # groups lowest - 1 .. highest of the widest feature
            if rows_per_feature * K <= self.dense_max_coefficients:
                return self._range_forward(x2, group_lo, span, rows_per_feature, precision, out_dtype)
        elif self._fixed_range():
            # fixed size, nothing read back: groups past lowest + table_groups - 1 get no spline term
            group_lo, span = group_range(x2.detach(), self.grid_delta, self.spline_order)
            return self._range_forward(x2, group_lo, span, self.table_groups + 1, precision, out_dtype)
        sorted_elem, window, local_u, pair_feature, pair_group, needed = self._pairs(x2)
        table = self._table(pair_feature, pair_group)
        self._last = (pair_feature, pair_group, needed)
        self._last_range_x = None
        return spline_layer(
            x2, sorted_elem, window, local_u, pair_feature, table, self.base_weight, self.spline_scaler,
            self.grid_delta, self.spline_order, fuses_base(self.base_activation),
        )

    # ---------------------------------------------------------------- regulariser (paper App. A.2)
    def regularization_loss(self, regularize_activation: float = 1.0, regularize_entropy: float = 1.0,
                            x: torch.Tensor | None = None) -> torch.Tensor:
        """L1 + entropy on the generated coefficients of each edge (o, i), as efficient-kan does on its
        stored ones: ``l1[o, i]`` is the mean ``|spline_scaler[o, i] * C|`` over the coefficients generated for
        feature i (those of the last forward, or of ``x`` when given); the loss is
        ``regularize_activation * sum l1 + regularize_entropy * entropy(l1 / sum l1)``. Differentiable
        through the CG-MLP and the scaler."""
        if x is None and self._last is None and self._last_range_x is not None:
            x = self._last_range_x  # the dense-range table holds untouched groups too: use the touched pairs
        if x is not None:
            check_tensor("x", x, ndim_min=1, last_dim=self.in_features, dtypes=())
            pairs = self._pairs(x.reshape(-1, self.in_features).to(self.spline_scaler.dtype))
            pair_feature, table, needed = pairs[3], self._table(pairs[3], pairs[4]), pairs[5]
        elif self._last is not None:
            pair_feature, pair_group, needed = self._last
            table = self._table(pair_feature, pair_group)
        else:
            raise RuntimeError("regularization_loss needs a forward pass first, or pass x")
        K = self.spline_order + 1
        capacity = pair_feature.shape[0]
        # only the rows in use (the padding rows past the count are not coefficients of any edge)
        used = (torch.arange(capacity, device=needed.device) < needed).to(table.dtype)
        pair_feature = pair_feature.long()
        per_row = table.view(capacity, K, self.out_features).abs().sum(1) * used.unsqueeze(-1)
        sums = table.new_zeros(self.in_features, self.out_features).index_add(0, pair_feature, per_row)
        counts = table.new_zeros(self.in_features).index_add(0, pair_feature, used).clamp_min(1)
        l1 = (sums / (counts.unsqueeze(-1) * K)).t() * self.spline_scaler.abs()  # [out, in]
        return l1_entropy_loss(l1, regularize_activation, regularize_entropy)

    # ---------------------------------------------------------------- inference conversion (App. A.3)
    @torch.no_grad()
    def to_kan(self, lo: float, hi: float) -> KANLinear:
        """A ``KANLinear`` equal to this layer on [lo, hi]: the knots are this layer's (spacing h, aligned to
        multiples of h), the spline weights are the generated coefficients of every cell that meets
        [lo, hi], and the scaler and base weight are copied. Outside the returned grid the KANLinear's
        spline term is zero, as always for a bounded KAN."""
        lo, hi = float(lo), float(hi)
        if not (math.isfinite(lo) and math.isfinite(hi) and hi >= lo):
            raise ValueError(f"to_kan needs finite lo <= hi, got lo={lo}, hi={hi}")
        h, k = self.grid_delta, self.spline_order
        K = k + 1
        cell_lo, cell_hi = math.floor(lo / h), math.floor(hi / h)
        grid_size = cell_hi - cell_lo + 1
        param = self.spline_scaler
        kan = KANLinear(
            self.in_features, self.out_features, grid_size=grid_size, spline_order=k,
            grid_range=(cell_lo * h, (cell_hi + 1) * h), base_activation=copy.deepcopy(self.base_activation),
            device=param.device, dtype=param.dtype,
        )
        # knot j of the KAN is t_j = (cell_lo - k + j) h; KAN basis b' is this layer's B_{b' + cell_lo - k},
        # whose coefficient is C_flat[b' + cell_lo - k - 1]
        knots = (torch.arange(grid_size + 2 * k + 1, dtype=torch.float64) + (cell_lo - k)) * h
        kan.grid.copy_(knots.to(param.device, param.dtype).expand(self.in_features, -1))
        kan._choose_grid_path()
        flat_lo = cell_lo - k - 1
        group_lo, group_hi = flat_lo // K, (cell_hi - 1) // K
        groups = torch.arange(group_lo, group_hi + 1, device=param.device, dtype=torch.int64)
        n_groups = groups.numel()
        features = torch.arange(self.in_features, device=param.device).repeat_interleave(n_groups)
        table = self.generate_coefficients(features, groups.repeat(self.in_features))  # [in * n_groups, out, K]
        flat = table.view(self.in_features, n_groups, self.out_features, K).permute(2, 0, 1, 3)
        flat = flat.reshape(self.out_features, self.in_features, n_groups * K)
        start = flat_lo - group_lo * K
        kan.spline_weight.copy_(flat[:, :, start : start + grid_size + k])
        kan.spline_scaler.copy_(self.spline_scaler)
        kan.base_weight.copy_(self.base_weight)
        return kan

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, spline_order={self.spline_order}, "
            f"grid_delta={self.grid_delta}, pe_dim={self.pe_dim}, embed_dim={self.embed_dim}, "
            f"hidden_dim={self.hidden_dim}, base={base_repr(self.base_activation)}, "
            f"table_groups={self.table_groups}" + (", deterministic=True" if self.deterministic else "")
        )
