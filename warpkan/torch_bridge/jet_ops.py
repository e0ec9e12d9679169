"""The Taylor-mode op of the edge layers (``warpkan::edge_jet``): a layer's output jet from its input jet, for
every edge family with a dense basis (B-spline, polynomial), on the engine's Taylor-mode kernels
(:mod:`warpkan.kernels.edge.jet`) and cuBLAS.

``Y = edge_jet(Z, W, bias)``: Z [C, N, in] stacks the values, D first derivatives and P second derivatives of
the layer's input (C = 1 + D + P; the pairs name the directions of each second derivative), W [width, out] is
the gemm strategy's combined weight, and Y [C, N, out] the same stack for the output: ``Y = A_jet(Z)^T W`` (bias
on the values), one expansion kernel and one GEMM per chunk of rows. Its backward pass is one GEMM for
``G = W H^T``, one kernel for the input jet's gradient (which leaves the basis in G's buffer) and one GEMM for
``dW``. The op is differentiable once: a loss built from the derivatives trains by ``loss.backward()``.

The GEMMs run at full precision ("fp32": TF32 off whatever torch's setting): a residual's derivatives are
what the loss is made of.
"""

import torch
from torch import Tensor

from ..kernels.edge import launch as edge
from ..kernels.edge.dense import dense_width
from ..kernels.edge.jet import MAX_PAIRS
from ._common import RecordedLaunches, first_order_backward, keyword_launcher, matmul_precision, runs_registered_op
from .edge_driver import EdgeSpec, spec_of

__all__ = ["edge_jet", "edge_jet_op", "edge_jet_backward_op", "JET_CHUNK_BYTES", "check_pairs"]

# Scratch for one chunk of the jet's dense basis (C components of each row, side by side).
JET_CHUNK_BYTES = 512 * 2**20

_launch = RecordedLaunches()
LABEL = "Taylor mode (warpkan::edge_jet)"


def check_pairs(pairs, n_first: int) -> tuple:
    """``pairs`` as a tuple of (a, b) int pairs, each index a direction in [0, n_first); ValueError naming what
    is wrong otherwise."""
    checked = []
    for pair in pairs:
        if len(pair) != 2:
            raise ValueError(f"each second-derivative pair must be (a, b), got {pair!r}")
        a, b = (int(v) for v in pair)
        if not (0 <= a < n_first and 0 <= b < n_first):
            raise ValueError(f"pair {pair!r}: directions must be in [0, {n_first}) (the inputs' coordinates)")
        checked.append((a, b))
    if len(checked) > MAX_PAIRS:
        raise ValueError(f"at most {MAX_PAIRS} second-derivative pairs, got {len(checked)}")
    return tuple(checked)


def _chunk_rows(n_rows: int, n_comp: int, width: int, itemsize: int) -> int:
    """Rows per chunk: at most JET_CHUNK_BYTES of basis for the C components of each row."""
    return max(1, min(n_rows, JET_CHUNK_BYTES // max(1, n_comp * width * itemsize)))


def _expand_jet(z, *rest, family, make_frame, n_frame, frame_config, n_coef, use_base, n_first, pairs, row0,
                record=False):
    frame_views, (basis_t,) = rest[:n_frame], rest[n_frame:]
    return edge.launch_expand_jet(family, make_frame(*frame_views, *frame_config), z, row0, n_coef, n_first, pairs,
                                  basis_t, use_base, record=record)


def _expand_contract_jet(z, *rest, family, make_frame, n_frame, frame_config, n_coef, use_base, n_first, pairs,
                         row0, write_basis, record=False):
    frame_views, (g_basis, weight, h, dz) = rest[:n_frame], rest[n_frame:]
    return edge.launch_expand_contract_jet(family, make_frame(*frame_views, *frame_config), z, row0, n_coef, n_first,
                                           pairs, g_basis, dz, use_base, record=record, write_basis=write_basis,
                                           weight=weight, h=h)


_EXPAND_JET, _EXPAND_CONTRACT_JET = keyword_launcher(_expand_jet), keyword_launcher(_expand_contract_jet)


def _config(spec: EdgeSpec, n_first: int, pairs: tuple, row0: int) -> tuple:
    return (*spec.launch_config(), ("n_first", n_first), ("pairs", pairs), ("row0", row0))


def _check(z: Tensor, weight: Tensor, n_first: int, pairs: tuple, spec: EdgeSpec) -> None:
    if z.dim() != 3 or z.shape[0] != 1 + n_first + len(pairs):
        raise ValueError(f"{LABEL}: the input jet must be [1 + {n_first} + {len(pairs)}, N, in], got "
                         f"{tuple(z.shape)}")
    width = dense_width(z.shape[2], spec.n_coef, spec.use_base)
    if weight.dim() != 2 or weight.shape[0] != width:
        raise ValueError(f"{LABEL}: the weight must be [{width}, out], got {tuple(weight.shape)}")


def _forward_impl(z: Tensor, weight: Tensor, bias: "Tensor | None", n_first: int, pairs: tuple,
                  spec: EdgeSpec) -> tuple:
    """(Y [C, N, out], the jet's dense basis [width, C N] when the rows went in one chunk, else empty): the
    backward pass's dW GEMM reads a kept basis instead of having it written again."""
    _check(z, weight, n_first, pairs, spec)
    z, weight = z.contiguous(), weight.contiguous()
    n_comp, n_rows, _ = z.shape
    width, n_out = weight.shape
    y = z.new_empty((n_comp, n_rows, n_out))
    kept = z.new_empty((0,))
    if y.numel() == 0:
        return y, kept
    if width == 0:
        y.zero_()
    else:
        chunk = _chunk_rows(n_rows, n_comp, width, z.element_size())
        scratch = z.new_empty((n_comp * chunk * width,))
        with matmul_precision("fp32", z.device):
            for start in range(0, n_rows, chunk):
                rows = min(chunk, n_rows - start)
                basis_t = scratch[: width * n_comp * rows].view(width, n_comp * rows)
                _launch(_EXPAND_JET, (z, *spec.frame_tensors, basis_t), _config(spec, n_first, pairs, start))
                if rows == n_rows:
                    torch.mm(basis_t.t(), weight, out=y.view(n_comp * n_rows, n_out))
                    kept = basis_t
                else:
                    y[:, start:start + rows] = torch.mm(basis_t.t(), weight).view(n_comp, rows, n_out)
    if bias is not None:
        y[0] += bias
    return y, kept


def _backward_impl(h: Tensor, z: Tensor, weight: Tensor, kept: Tensor, n_first: int, pairs: tuple, spec: EdgeSpec,
                   need_z: bool, need_weight: bool, need_bias: bool) -> tuple:
    """(dz, d_weight, d_bias) of :func:`_forward_impl` (``kept``: its basis, or empty); those not asked for come
    back empty."""
    h, z, weight = h.contiguous(), z.contiguous(), weight.contiguous()
    n_comp, n_rows, _ = z.shape
    width, n_out = weight.shape
    empty = z.new_empty((0,))
    dz = torch.empty_like(z) if need_z else empty
    d_weight = z.new_empty((width, n_out)) if need_weight else empty
    d_bias = h[0].sum(0) if need_bias else empty
    if n_rows == 0 or width == 0 or n_out == 0:
        dz.zero_()
        d_weight.zero_()
        return dz, d_weight, d_bias
    if not (need_z or need_weight):
        return dz, d_weight, d_bias
    # one output: G = w h^T is never formed, the kernel reads w's windows and h (see kernels.edge.jet)
    rank_one = n_out == 1
    with matmul_precision("fp32", z.device):
        if kept.numel():  # one chunk, its basis kept: G in a buffer of its own, no basis written
            h_all = h.view(n_comp * n_rows, n_out)
            if need_z:
                g = kept if rank_one else torch.mm(weight, h_all.t())  # (kept: only its shape is read)
                _launch(_EXPAND_CONTRACT_JET, (z, *spec.frame_tensors, g, *((weight, h) if rank_one else (None, None)),
                                               dz), (*_config(spec, n_first, pairs, 0), ("write_basis", False)))
            if need_weight:
                torch.mm(kept, h_all, out=d_weight)
            return dz, d_weight, d_bias
        chunk = _chunk_rows(n_rows, n_comp, width, z.element_size())
        scratch = z.new_empty((n_comp * chunk * width,))
        for start in range(0, n_rows, chunk):
            rows = min(chunk, n_rows - start)
            part = scratch[: width * n_comp * rows].view(width, n_comp * rows)
            h_part = h[:, start:start + rows].reshape(n_comp * rows, n_out)
            config = _config(spec, n_first, pairs, start)
            if need_z:  # G = W H^T, then dz and (over G) the basis
                if not rank_one:
                    torch.mm(weight, h_part.t(), out=part)
                _launch(_EXPAND_CONTRACT_JET, (z, *spec.frame_tensors, part,
                                               *((weight, h) if rank_one else (None, None)), dz),
                        (*config, ("write_basis", True)))
            else:
                _launch(_EXPAND_JET, (z, *spec.frame_tensors, part), config)
            if need_weight:
                if start == 0:
                    torch.mm(part, h_part, out=d_weight)
                else:
                    d_weight.addmm_(part, h_part)
    return dz, d_weight, d_bias


def _jet_grads(ctx, h) -> tuple:
    z, weight, kept = ctx.saved_tensors[:3]
    need_z, need_weight, need_bias = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
    dz, d_weight, d_bias = _backward_impl(h, z, weight, kept, ctx.n_first, ctx.pairs, ctx.spec, need_z, need_weight,
                                          need_bias)
    return dz if need_z else None, d_weight if need_weight else None, d_bias if need_bias else None


class _EdgeJet(torch.autograd.Function):
    """The eager route of ``warpkan::edge_jet`` (no custom-op dispatch on the hot path)."""

    @staticmethod
    def forward(ctx, z, weight, bias, n_first, pairs, spec):
        y, kept = _forward_impl(z, weight, bias, n_first, pairs, spec)
        ctx.save_for_backward(z, weight, kept)
        ctx.n_first, ctx.pairs, ctx.spec = n_first, pairs, spec
        return y

    @staticmethod
    def backward(ctx, h):
        return *_JET_BACKWARD(ctx, h), None, None, None


_JET_BACKWARD = first_order_backward(LABEL, _jet_grads)


@torch.library.custom_op("warpkan::edge_jet", mutates_args=(),
                         schema="(Tensor z, Tensor weight, Tensor? bias, Tensor[] frame_tensors, str spec, "
                                "int n_first, int[] pairs) -> (Tensor, Tensor)")
def edge_jet_op(z, weight, bias, frame_tensors, spec, n_first, pairs):
    """``_EdgeJet`` as a registered op: the spec by its static key, the pairs flattened (a0, b0, a1, b1, ...);
    returns (Y, the kept basis or an empty tensor)."""
    return _forward_impl(z, weight, bias, n_first, _unflatten(pairs), spec_of(spec, frame_tensors))


@edge_jet_op.register_fake
def _(z, weight, bias, frame_tensors, spec, n_first, pairs):
    n_comp, n_rows = z.shape[0], z.shape[1]
    width = weight.shape[0]
    one_chunk = n_rows <= _chunk_rows(n_rows, n_comp, width, z.element_size()) and width > 0 and weight.shape[1] > 0
    kept = z.new_empty((width, n_comp * n_rows)) if one_chunk and n_rows > 0 else z.new_empty((0,))
    return z.new_empty((n_comp, n_rows, weight.shape[1])), kept


@torch.library.custom_op("warpkan::edge_jet_backward", mutates_args=(),
                         schema="(Tensor h, Tensor z, Tensor weight, Tensor kept, Tensor[] frame_tensors, str spec, "
                                "int n_first, int[] pairs, bool need_z, bool need_weight, bool need_bias) "
                                "-> (Tensor, Tensor, Tensor)")
def edge_jet_backward_op(h, z, weight, kept, frame_tensors, spec, n_first, pairs, need_z, need_weight, need_bias):
    """The backward pass of ``warpkan::edge_jet`` (see :func:`_backward_impl`)."""
    return _backward_impl(h, z, weight, kept, n_first, _unflatten(pairs), spec_of(spec, frame_tensors), need_z,
                          need_weight, need_bias)


@edge_jet_backward_op.register_fake
def _(h, z, weight, kept, frame_tensors, spec, n_first, pairs, need_z, need_weight, need_bias):
    empty = z.new_empty((0,))
    return (torch.empty_like(z) if need_z else empty, weight.new_empty(weight.shape) if need_weight else empty,
            h.new_empty((h.shape[2],)) if need_bias else empty)


def _unflatten(flat) -> tuple:
    return tuple((int(flat[k]), int(flat[k + 1])) for k in range(0, len(flat), 2))


def _setup(ctx, inputs, output):
    z, weight, bias, frame_tensors, spec, n_first, pairs = inputs
    ctx.save_for_backward(z, weight, output[1], *frame_tensors)
    ctx.static_key, ctx.n_first, ctx.flat_pairs = spec, n_first, pairs


def _registered_grads(ctx, h, h_kept):
    z, weight, kept, *frame_tensors = ctx.saved_tensors
    need_z, need_weight, need_bias = ctx.needs_input_grad[:3]
    dz, d_weight, d_bias = edge_jet_backward_op(h, z, weight, kept, frame_tensors, ctx.static_key, ctx.n_first,
                                                ctx.flat_pairs, need_z, need_weight, need_bias)
    return (dz if need_z else None, d_weight if need_weight else None, d_bias if need_bias else None,
            [None] * len(frame_tensors), None, None, None)


edge_jet_op.register_autograd(first_order_backward(LABEL, _registered_grads), setup_context=_setup)


def edge_jet(z: Tensor, weight: Tensor, bias: "Tensor | None", n_first: int, pairs: tuple, spec: EdgeSpec) -> Tensor:
    """The output jet [C, N, out] of an edge layer (combined weight ``weight``) from its input jet z [C, N, in]:
    the registered op under tracing, the eager Function otherwise. ``pairs``: checked (:func:`check_pairs`)."""
    if runs_registered_op(z):
        return edge_jet_op(z, weight, bias, list(spec.frame_tensors), spec.static_key(), n_first,
                           [v for pair in pairs for v in pair])[0]
    return _EdgeJet.apply(z, weight, bias, n_first, pairs, spec)
