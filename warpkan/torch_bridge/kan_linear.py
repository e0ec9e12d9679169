"""``KANLinear``: a drop-in B-spline KAN layer with efficient-kan's parameters, on Warp kernels."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import bspline as kb
from ..reference.bspline import b_splines
from ._common import (FLOAT_DTYPES, Float32Or64Module, autocast_dtype, call_precision, check_device, check_input_dtype,
                      check_tensor, layer_dtype)
from .bspline_ops import STRATEGIES, apply_checked, bspline_spec, check_precision
from .edge_driver import EdgeView, check_view_rows

__all__ = ["KANLinear"]


def layout_parameter(shape_kernel: tuple, permutation: tuple, device, dtype, contiguous: bool) -> nn.Parameter:
    """A parameter of the public shape (``shape_kernel`` permuted by ``permutation``): contiguous, or (not
    ``contiguous``) a view of storage in the kernels' layout (output index innermost, the coalesced one).
    See ``KANLinear``'s ``contiguous_parameters``."""
    storage = torch.empty(shape_kernel, device=device, dtype=dtype).permute(*permutation)
    return nn.Parameter(storage.contiguous() if contiguous else storage)


@torch.no_grad()
def init_public(param: torch.Tensor, init) -> None:
    """``init`` (an in-place initialiser) drawn on a contiguous tensor of ``param``'s shape and copied in: the
    values do not depend on how the parameter is stored (torch fills a tensor in memory order)."""
    values = torch.empty(param.shape, device=param.device, dtype=param.dtype)
    init(values)
    param.copy_(values)


def l1_entropy_loss(l1: torch.Tensor, regularize_activation: float, regularize_entropy: float) -> torch.Tensor:
    """efficient-kan's regulariser on the per-edge magnitudes ``l1`` [out, in]:
    ``regularize_activation * sum l1 + regularize_entropy * entropy(l1 / sum l1)``. An edge of magnitude 0
    adds 0 to the entropy (the limit of p log p), and all-zero magnitudes give 0: finite values and gradients
    where efficient-kan's ``p * p.log()`` gives NaN (an edge whose spline weights are all zero, as after pruning
    or an ``update_grid`` on data outside the old grid)."""
    activation = l1.sum()
    tiny = torch.finfo(l1.dtype).tiny
    p = l1 / activation.clamp_min(tiny)
    entropy = -torch.sum(p * torch.log(p.clamp_min(tiny)))
    # no magnitude at all: no distribution, entropy 0 (torch.where sends its gradient only to the branch taken)
    entropy = torch.where(activation > 0, entropy, torch.zeros_like(entropy))
    return regularize_activation * activation + regularize_entropy * entropy


class KANLinear(Float32Or64Module):
    """y = base_weight @ act(x) + sum_i spline_scaler[o, i] * spline_{o,i}(x_i), for x of shape (..., in).

    ``base_activation`` (``act``), as in efficient-kan: an ``nn.Module`` class or instance (``nn.SiLU``, the
    default, ``nn.GELU``, ``nn.Identity``, ``nn.ReLU``, ``nn.Tanh``, a module of one's own), or None for no
    base path. The kernels fuse SiLU; any other activation runs in torch, ``F.linear(act(x), base_weight)``,
    added to the kernels' spline term (and its parameters, if any, are the layer's).

    Parameters and buffers follow efficient-kan's ``KANLinear`` (names and shapes), so its checkpoints load
    with ``load_state_dict`` and give the same outputs:

    - ``base_weight`` [out, in], ``spline_weight`` [out, in, G + k], ``spline_scaler`` [out, in]
      (a parameter when ``enable_standalone_scale_spline``, else a non-persistent buffer of ones);
    - ``grid`` buffer [in, G + 2k + 1]: the knots of each input.

    Inputs outside ``[grid[:, 0], grid[:, -1])`` get a zero spline term (as in efficient-kan and pykan); the
    base path still applies. While the grid is uniform to the rounding of the layer's dtype (at construction,
    or when a loaded grid is: :func:`warpkan.kernels.bspline.grid_is_uniform`), the kernels use the matrix
    form; otherwise (after :meth:`update_grid`, or a knot moved by more than that rounding) they run the
    general de Boor path. Cost per edge is O(k) either way, independent of ``grid_size``. Converting a layer
    with a uniform grid to a wider dtype (``.double()``) re-spaces its knots exactly in that dtype (they move
    by the narrower dtype's rounding at most), so it keeps the matrix form; ``load_state_dict`` keeps the
    knots it is given. ``grid_range`` must be two finite numbers lo < hi; a loaded grid must be finite and
    strictly increasing along each row.

    dtypes: the layer computes in float32 or float64. Under bf16/fp16 autocast it takes fp32 inputs and
    parameters (fp32 accumulation) and returns the autocast dtype, made inside its autograd node (the bf16
    GEMM's own output where ``precision`` resolves to bf16); ``.half()``, ``.bfloat16()`` and other
    conversions to a 16-bit dtype are refused with a TypeError (the layer is left unchanged).
    ``deterministic=True`` makes every gradient bitwise reproducible from run to run.

    Higher-order derivatives (``create_graph=True``, e.g. a physics-informed residual's u_xx and the parameter
    gradients of a loss built from it) come from the edge engine's dense basis and its x-derivatives, to the
    third order in x; the ``torch.func`` transforms raise (fold a vmapped dimension into x's leading ones).
    Built with ``device="meta"``, the layer infers output shapes on meta inputs.
    ``strategy`` picks the computation ("stencil", "gemm" or "auto"; see :func:`warpkan.torch_bridge.bspline_kan`).

    ``precision`` sets the gemm strategy's contractions: "fp32" (exact fp32), "tf32" (TF32 tensor cores),
    "bf16" (bf16 basis and weights on bf16 tensor cores, fp32 accumulation and outputs), or "auto" (default):
    "bf16" under bf16 autocast, else torch's own rule for float32 matmuls, as ``nn.Linear`` follows it:
    ``torch.get_float32_matmul_precision()`` "highest" (torch's default) -> fp32, "high" -> tf32,
    "medium" -> bf16. Error bounds: :mod:`warpkan.torch_bridge.bspline_ops`. float64 layers always compute
    in float64; the stencil strategy always in the layer's dtype.
    ``contiguous_parameters`` (default True) stores the parameters contiguously in their public shapes, which
    every torch optimiser and utility takes (``torch.optim.LBFGS``, ``parameters_to_vector``, FSDP2's
    ``fully_shard``). The gemm strategy reads them and writes their gradients in place, and so does the stencil
    strategy on a small call (a parameter of at most 1 MiB, at most 16384 rows eagerly or 1024 rows in a CUDA
    graph: ``edge_ops.stencil_param``). On larger calls the stencil strategy copies them into the kernels' layout
    (output index innermost) once a training step, and their gradients back (on CUDA by a transpose kernel
    coalesced on both sides). ``contiguous_parameters=False`` stores them as views of the kernels' layout
    instead, which saves those copies (``scripts/param_layout_cost.py`` measures them) but which LBFGS,
    ``parameters_to_vector`` and FSDP2 refuse.

    Unlike efficient-kan, the initial ``spline_weight`` is drawn directly as small uniform noise instead of a
    least-squares fit of noise, which would be an O(G^3) solve at large ``grid_size``; the distribution of the
    initial spline values is the same order (``scale_noise / grid_size``).

    Args:
        in_features: number of inputs (a positive int).
        out_features: number of outputs (a positive int).
        grid_size: number of grid intervals G on ``grid_range`` (a positive int).
        spline_order: order k of the B-splines, an int in [1, 5] (3: cubic).
        scale_noise: scale of the initial ``spline_weight`` noise, uniform in
            ``+-scale_noise / (2 grid_size)``.
        scale_base: gain of ``base_weight``'s initialisation (``kaiming_uniform_`` with
            ``a = sqrt(5) * scale_base``), as in efficient-kan.
        scale_spline: gain of ``spline_scaler``'s initialisation when ``enable_standalone_scale_spline``, else
            the constant value of the ``spline_scaler`` buffer.
        enable_standalone_scale_spline: make ``spline_scaler`` a trained parameter (else a buffer).
        base_activation: ``torch.nn.SiLU`` (the class or an instance) or ``"silu"`` for the base path
            ``base_weight @ silu(x)`` (fused in the kernels), or None for no base path; others are refused.
        grid_eps: blend of :meth:`update_grid` between the uniform grid (1) and the sample quantiles (0).
        grid_range: ``(lo, hi)``, finite with lo < hi: the interval the G grid intervals cover at
            construction (the knots extend k intervals past each end).
        deterministic: make every gradient bitwise reproducible from run to run.
        strategy: ``"stencil"``, ``"gemm"`` or ``"auto"`` (see :func:`warpkan.torch_bridge.bspline_kan`).
        contiguous_parameters: store the parameters contiguously in their public shapes (for FSDP2).
        precision: ``"auto"``, ``"fp32"``, ``"tf32"`` or ``"bf16"``: the gemm strategy's contractions (above).
        device: the device of the parameters and buffers (torch's default when None).
        dtype: ``torch.float32`` or ``torch.float64`` (torch's default dtype when None).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        grid_size: int = 5,
        spline_order: int = 3,
        scale_noise: float = 0.1,
        scale_base: float = 1.0,
        scale_spline: float = 1.0,
        enable_standalone_scale_spline: bool = True,
        base_activation=torch.nn.SiLU,
        grid_eps: float = 0.02,
        grid_range=(-1, 1),
        deterministic: bool = False,
        strategy: str = "auto",
        contiguous_parameters: bool = True,
        precision: str = "auto",
        device=None,
        dtype=None,
    ):
        super().__init__()
        check_device(device)
        in_features, out_features, grid_size, spline_order, (lo, hi) = kb.check_layer_args(
            in_features, out_features, grid_size, spline_order, grid_range)
        self.in_features = in_features
        self.out_features = out_features
        self.grid_size = grid_size
        self.spline_order = spline_order
        self.scale_noise = scale_noise
        self.scale_base = scale_base
        self.scale_spline = scale_spline
        self.enable_standalone_scale_spline = enable_standalone_scale_spline
        self.grid_eps = grid_eps
        self.deterministic = deterministic
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        self.strategy = strategy
        dtype = layer_dtype(dtype)
        check_precision(precision, dtype)
        self.precision = precision
        self.base_activation = base_activation_module(base_activation, device, dtype)

        h = (hi - lo) / grid_size
        knots = torch.arange(-spline_order, grid_size + spline_order + 1, device=device, dtype=dtype) * h + lo
        uniform = True  # on the meta device, as built
        if knots.device.type != "meta":
            host = knots.unsqueeze(0).cpu().numpy()
            kb.check_grid(host, f"the knots of grid_range={tuple(grid_range)} in {dtype}")
            uniform = kb.grid_is_uniform(host)
        self.register_buffer("grid", knots.expand(in_features, -1).contiguous())
        n_coef = grid_size + spline_order
        layout = dict(device=device, dtype=dtype, contiguous=contiguous_parameters)
        self.base_weight = layout_parameter((in_features, out_features), (1, 0), **layout)
        self.spline_weight = layout_parameter((in_features, n_coef, out_features), (2, 0, 1), **layout)
        if enable_standalone_scale_spline:
            self.spline_scaler = layout_parameter((in_features, out_features), (1, 0), **layout)
        else:
            # efficient-kan's forward uses spline_weight unscaled in this mode (scale_spline only scales the
            # initial spline_weight): the kernels' scaler is ones
            self.register_buffer(
                "spline_scaler", torch.ones((out_features, in_features), device=device, dtype=dtype), persistent=False,
            )
        self._grid_uniform = uniform
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        # drawn in the public shape: the initial values do not depend on contiguous_parameters
        init_public(self.base_weight, lambda t: nn.init.kaiming_uniform_(t, a=math.sqrt(5) * self.scale_base))
        # without a standalone scaler, efficient-kan scales the initial spline_weight by scale_spline instead
        spline_scale = self.scale_noise / self.grid_size
        if not self.enable_standalone_scale_spline:
            spline_scale *= self.scale_spline
        init_public(self.spline_weight, lambda t: t.uniform_(-0.5, 0.5).mul_(spline_scale))
        if self.enable_standalone_scale_spline:
            init_public(self.spline_scaler, lambda t: nn.init.kaiming_uniform_(t, a=math.sqrt(5) * self.scale_spline))
        if not self.use_base:
            self.base_weight.zero_()

    @property
    def use_base(self) -> bool:
        """Whether the layer has a base path (``base_activation`` is not None)."""
        return self.base_activation is not None

    @property
    def scaled_spline_weight(self) -> torch.Tensor:
        return self.spline_weight * self.spline_scaler.unsqueeze(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """y (..., out) for x (..., in): a tensor of the layer's dtype and device (any float dtype under
        autocast, the result then in the autocast dtype). Non-contiguous x works; an empty batch gives an
        empty output."""
        check_tensor("x", x, ndim_min=1, last_dim=self.in_features, dtypes=())
        if x.device != self.grid.device:
            raise ValueError(f"x must be on the layer's device {self.grid.device}, got {x.device}")
        cast_to = autocast_dtype(x.device)
        precision = call_precision(self.precision, cast_to, self.grid.dtype)
        if cast_to is not None:
            with torch.autocast(x.device.type, enabled=False):
                # y in the autocast dtype from the layer's node (edge_ops.edge_apply's out_dtype) where nothing is
                # added to it; .to is then no op
                return self._forward(x.to(self.grid.dtype), precision, cast_to).to(cast_to)
        check_input_dtype(x, self.grid.dtype, FLOAT_DTYPES)
        return self._forward(x, precision)

    def _forward(self, x, precision, out_dtype=None):
        # the parameters and the configuration were checked at construction, x by forward
        activation = self.base_activation
        fused = fuses_base(activation)
        alone = activation is None or fused  # y is the node's output as it is
        y = apply_checked(
            x, self.grid, self.base_weight if fused else None, self.spline_weight, self.spline_scaler,
            self.spline_order, self._grid_uniform, self.deterministic, self.strategy, precision,
            out_dtype if alone else None,
        )
        if alone:
            return y
        return y + F.linear(activation(x), self.base_weight)

    def edge_view(self, x: torch.Tensor) -> EdgeView:
        """The layer as the edge engine sees it at the rows ``x``: its B-spline family and knots, the
        coefficient table, base weight and scaler it combines, and a base activation run in torch (any but the
        fused SiLU). What Taylor mode and the interpretability tools evaluate the layer's edges with.

        Args:
            x: rows [N, in] of the layer's dtype and device (the family's kernels follow x's dtype).

        Returns:
            EdgeView: views of the layer's parameters (gradients reach them): ``coef`` [in, G + k, out] is
            ``spline_weight`` in the kernels' layout, ``base_weight_t`` and ``scaler_t`` [in, out]; no bias.
        """
        check_view_rows(x, self.in_features, self.grid)
        fused = fuses_base(self.base_activation)
        spec = bspline_spec(x, self.grid, self.spline_order, self._grid_uniform, fused)
        return EdgeView(spec, self.spline_weight.permute(1, 2, 0), self.base_weight.t(), self.spline_scaler.t(), None,
                        None if fused else self.base_activation)

    @torch.no_grad()
    def update_grid(self, x: torch.Tensor, margin: float = 0.01):
        """Refit the knots to the distribution of x (efficient-kan's rule: a ``grid_eps`` blend of the
        sample quantiles and a uniform grid over the data range) and refit ``spline_weight`` by least squares
        so the layer's spline output on x is preserved. The fit targets the unscaled spline, so
        ``spline_scaler`` is applied once (efficient-kan applies it twice here).

        Rows of x holding NaN or Inf are left out of the refit. ValueError, with the layer unchanged, when
        ``spline_weight`` is not finite (a diverged training run: there is no spline to preserve), when fewer
        than 2 rows are left, or when the refit would not give finite, strictly increasing knots and finite
        weights (a data range that overflows the dtype; ``margin=0`` with a constant input). The refit is
        solved in float64 (:func:`refit_coefficients`) and cast back to the layer's dtype."""
        check_tensor("x", x, ndim_min=1, last_dim=self.in_features, dtypes=())
        margin = float(margin)
        if not (math.isfinite(margin) and margin >= 0):
            raise ValueError(f"margin must be a finite number >= 0, got {margin!r}")
        if not bool(torch.isfinite(self.spline_weight).all()):
            raise ValueError("update_grid: spline_weight holds NaN or Inf (has the training diverged?), so there is "
                             "no spline to refit; the layer is unchanged")
        x = x.reshape(-1, self.in_features).to(self.grid.dtype)
        x = x[torch.isfinite(x).all(dim=1)]
        if x.shape[0] < 2:
            raise ValueError(f"update_grid needs at least 2 rows of finite values (rows with NaN or Inf are left "
                             f"out), got {x.shape[0]}")
        k, G = self.spline_order, self.grid_size
        x64 = x.double()
        bases = b_splines(x64, self.grid.double(), k).permute(1, 0, 2)  # [in, batch, G + k]
        target = torch.bmm(bases, self.spline_weight.double().permute(1, 2, 0))  # [in, batch, out], unscaled spline
        x_sorted = torch.sort(x, dim=0)[0]
        batch = x.shape[0]
        grid_adaptive = x_sorted[torch.linspace(0, batch - 1, G + 1, dtype=torch.int64, device=x.device)]
        uniform_step = (x_sorted[-1] - x_sorted[0] + 2 * margin) / G
        grid_uniform = (
            torch.arange(G + 1, dtype=x.dtype, device=x.device).unsqueeze(1) * uniform_step + x_sorted[0] - margin
        )
        grid = self.grid_eps * grid_uniform + (1 - self.grid_eps) * grid_adaptive
        steps = torch.arange(1, k + 1, device=x.device, dtype=x.dtype).unsqueeze(1)
        grid = torch.cat([grid[:1] - uniform_step * steps.flip(0), grid, grid[-1:] + uniform_step * steps], dim=0).T
        grid_host = grid.cpu().numpy()
        kb.check_grid(grid_host, "the refitted grid (is x's range within the dtype, and margin > 0 for a "
                                 "constant input?)")
        new_bases = b_splines(x64, grid.double(), k).permute(1, 0, 2)
        solution = refit_coefficients(new_bases, target, "update_grid").to(self.spline_weight.dtype)
        if not bool(torch.isfinite(solution).all()):
            raise ValueError(f"update_grid: the least-squares refit of spline_weight overflows "
                             f"{self.spline_weight.dtype} for this x; the layer is unchanged")
        self.grid.copy_(grid)
        self.spline_weight.copy_(solution.permute(2, 0, 1))
        self._grid_uniform = kb.grid_is_uniform(grid_host)

    def regularization_loss(self, regularize_activation: float = 1.0, regularize_entropy: float = 1.0):
        """efficient-kan's L1 + entropy regulariser on the mean ``|spline_weight|`` of each edge."""
        return l1_entropy_loss(self.spline_weight.abs().mean(-1), regularize_activation, regularize_entropy)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        grid = state_dict.get(prefix + "grid")
        if isinstance(grid, torch.Tensor) and grid.shape == self.grid.shape and grid.device.type != "meta":
            try:
                kb.check_grid(grid.detach().cpu().double().numpy(), prefix + "grid")
            except ValueError as error:  # not loaded: the layer keeps its knots
                error_msgs.append(str(error))
                state_dict = {key: value for key, value in state_dict.items() if key != prefix + "grid"}
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        # the loaded knots as they are: the matrix form where they are uniform to the layer dtype's rounding
        self._choose_grid_path()

    def _apply(self, fn, recurse=True):
        dtype = self.grid.dtype
        module = super()._apply(fn, recurse)
        if self.grid.dtype != dtype:
            # A uniform grid widened (float32 -> float64) is uniform to float32's rounding only: its knots are
            # re-spaced exactly (they move by float32 rounding at most), so the matrix form stays exact.
            widened = (self._grid_uniform and self.grid.is_floating_point() and dtype.is_floating_point
                       and torch.finfo(self.grid.dtype).eps < torch.finfo(dtype).eps)
            self._choose_grid_path(widened_from=dtype if widened else None)
        return module

    @torch.no_grad()
    def _choose_grid_path(self, widened_from: torch.dtype | None = None) -> None:
        """Decide the matrix-form fast path from the knots: taken only where every row is uniform to the
        rounding of the layer's dtype (:func:`warpkan.kernels.bspline.grid_is_uniform`); ``widened_from``: the
        dtype the knots were uniform in before a conversion, where they are re-spaced exactly."""
        if self.grid.device.type == "meta" or not self.grid.is_floating_point():
            return
        grid = self.grid.detach().double().cpu().numpy()  # numpy has no bfloat16: the rule gets the dtype's eps
        uniform = kb.grid_is_uniform(grid, torch.finfo(self.grid.dtype).eps)
        if not uniform and widened_from is not None and kb.grid_is_uniform(grid, torch.finfo(widened_from).eps):
            self.grid.copy_(torch.from_numpy(kb.uniform_knots(grid)))
            uniform = True
        self._grid_uniform = uniform

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, grid_size={self.grid_size}, "
            f"spline_order={self.spline_order}, base={base_repr(self.base_activation)}, "
            f"uniform_grid={self._grid_uniform}, deterministic={self.deterministic}, strategy={self.strategy!r}, "
            f"precision={self.precision!r}"
        )


def refit_coefficients(bases: torch.Tensor, target: torch.Tensor, label: str) -> torch.Tensor:
    """The spline coefficients c [in, n_coef, out] that best reproduce ``target`` [in, rows, out] from the bases
    [in, rows, n_coef] in least squares: the refit of a B-spline layer onto new knots (``KANLinear.update_grid``,
    ``warpkan.interpret.refine``), in float64, returned in float64 on the bases' device.

    Where a basis holds no row (a cell of the new knots that the data leave empty) the system is rank-deficient,
    and the minimum-norm solution is taken (that coefficient 0), not the huge coefficients a QR-based solve in
    float32 (torch's default gelsy on the CPU) gives there. A float64 QR on the bases' device reduces the system
    first (``|bases c - target| = |R c - Q^T target|`` up to a constant: the same minimiser, of the same norm),
    so only [in, n_coef, n_coef + out] go to the CPU, where LAPACK's SVD-based gelsd solves it (torch has no
    rank-revealing driver on CUDA). LAPACK's drivers fail with an internal error on non-finite input: a target
    that is not finite is a ValueError naming ``label``."""
    if not bool(torch.isfinite(target).all()):
        raise ValueError(f"{label}: the refit target (the layer's spline on the data) is not finite; the layer is "
                         "unchanged")
    q, r = torch.linalg.qr(bases.double())  # reduced: Q [in, rows, m], R [in, m, n_coef], m = min(rows, n_coef)
    rhs = q.transpose(1, 2) @ target.double()
    return torch.linalg.lstsq(r.cpu(), rhs.cpu(), driver="gelsd").solution.to(bases.device)


def base_activation_module(base_activation, device=None, dtype=None) -> nn.Module | None:
    """The base path's activation as efficient-kan takes it: an ``nn.Module`` class (instantiated with no
    arguments, as efficient-kan does, its parameters if any then put on ``device`` in ``dtype``) or instance
    (``nn.SiLU``, ``nn.GELU``, ``nn.Identity``, ``nn.ReLU``, ``nn.Tanh``, one of the user's own...), or
    ``"silu"``; ``None`` means no base path."""
    if base_activation is None:
        return None
    if isinstance(base_activation, str) and base_activation.lower() == "silu":
        return nn.SiLU()
    if isinstance(base_activation, type) and issubclass(base_activation, nn.Module):
        return base_activation().to(device=device, dtype=dtype)
    if not isinstance(base_activation, nn.Module):
        raise ValueError(
            "base_activation must be an nn.Module class or instance (nn.SiLU, nn.GELU, nn.Identity, ...), 'silu' or "
            f"None (no base path), got {base_activation!r}"
        )
    return base_activation


def fuses_base(activation: nn.Module | None) -> bool:
    """Whether the kernels compute the base path: they fuse SiLU (exactly ``nn.SiLU``); any other activation
    runs in torch, ``F.linear(activation(x), base_weight)``, added to the kernels' spline term."""
    return type(activation) is nn.SiLU


def base_repr(activation: nn.Module | None) -> str:
    if activation is None:
        return "none"
    return type(activation).__name__ + (" (fused)" if fuses_base(activation) else "")
