"""The torch side of the edge engine, for every edge family: the engine's forward and backward on torch tensors.

A family's op hands over its family, a frame maker and the tensors the frame holds; this module picks the
kernels (the warp-tiled ones where a table plan applies on CUDA, recorded once per signature and replayed;
the per-thread ones elsewhere, on torch's stream with scratch from torch's allocator) and allocates the
outputs. Every tensor argument must be contiguous.
"""

import torch
from torch import Tensor

from ..kernels.edge import launch as edge
from ..kernels.edge import tiled as edge_tiled
from ._common import RecordedLaunches, TorchWorkspace, to_warp, warp_stream

__all__ = ["edge_forward", "edge_backward"]

_launch = RecordedLaunches()


def _tiled_forward(x, *rest, family, make_frame, n_frame, frame_config, use_base, record=False):
    frame_views, (base_weight_t, scaler_t, coef, bias, coef_pad, y) = rest[:n_frame], rest[n_frame:]
    return edge_tiled.launch_tiled_forward(family, make_frame(*frame_views, *frame_config), x, base_weight_t, scaler_t,
                                           coef, bias, y, use_base, coef_pad=coef_pad, record=record)


def _tiled_backward(dy, x, *rest, family, make_frame, n_frame, frame_config, use_base, deterministic, record=False):
    frame_views = rest[:n_frame]
    base_weight_t, scaler_t, coef, coef_pad, dx, d_base, d_scaler, d_coef, partial_coef, partial_params = rest[n_frame:]
    return edge_tiled.launch_tiled_backward(family, make_frame(*frame_views, *frame_config), dy, x, base_weight_t,
                                            scaler_t, coef, use_base, dx=dx, d_base_weight_t=d_base, d_scaler_t=d_scaler,
                                            d_coef=d_coef, deterministic=deterministic, coef_pad=coef_pad,
                                            partial_coef=partial_coef, partial_params=partial_params, overwrite=True,
                                            record=record)


def _recorded(launcher):
    """``launcher`` with its keyword configuration moved to positions, as RecordedLaunches calls it."""
    def call(*args, record=False):
        *tensors, config = args
        return launcher(*tensors, **dict(config), record=record)

    call.__name__ = launcher.__name__
    return call


_TILED_FORWARD = _recorded(_tiled_forward)
_TILED_BACKWARD = _recorded(_tiled_backward)


def edge_forward(family, make_frame, frame_tensors: tuple, frame_config: tuple, x: Tensor, base_weight_t: Tensor,
                 scaler_t: Tensor, coef: Tensor, use_base: bool, bias: "Tensor | None" = None,
                 deterministic: bool = False) -> Tensor:
    """y [N, out] of the engine's forward (the forward is deterministic on every path)."""
    n_rows, n_out = x.shape[0], coef.shape[2]
    y = x.new_empty((n_rows, n_out))
    if n_rows == 0 or n_out == 0:
        return y
    if edge_tiled.forward_plan(family, x.is_cuda, coef.shape[1]) is not None and x.shape[1]:
        coef_pad = x.new_empty(edge_tiled.coef_pad_shape(family, coef.shape))
        config = (("family", family), ("make_frame", make_frame), ("n_frame", len(frame_tensors)),
                  ("frame_config", frame_config), ("use_base", use_base))
        _launch(_TILED_FORWARD, (x, *frame_tensors, base_weight_t, scaler_t, coef, bias, coef_pad, y), config)
        return y
    frame = make_frame(*(to_warp(t) for t in frame_tensors), *frame_config)
    edge.launch_forward(family, frame, to_warp(x), to_warp(base_weight_t), to_warp(scaler_t), to_warp(coef), to_warp(y),
                        bias=None if bias is None else to_warp(bias), use_base=use_base, stream=warp_stream(x.device),
                        tiled=False, workspace=TorchWorkspace(x.device))
    return y


def _grad_buffers(x, base_weight_t, scaler_t, coef, need_x, need_params, zero=False):
    def make(t, needed):
        if not needed:
            return x.new_empty((0,))
        return torch.zeros_like(t) if zero else torch.empty_like(t)

    return make(x, need_x), make(base_weight_t, need_params), make(scaler_t, need_params), make(coef, need_params)


def edge_backward(family, make_frame, frame_tensors: tuple, frame_config: tuple, dy: Tensor, x: Tensor,
                  base_weight_t: Tensor, scaler_t: Tensor, coef: Tensor, use_base: bool, deterministic: bool,
                  need_x: bool, need_params: bool) -> tuple:
    """(dx, d_base_weight_t, d_scaler_t, d_coef) of :func:`edge_forward`; those not asked for come back empty.
    The tiled pass (overwriting the gradients: no fill) where its plan applies and the parameter gradients are
    asked for; else the per-thread kernels into zero-filled buffers."""
    n_rows, n_in, n_coef, n_out = x.shape[0], x.shape[1], coef.shape[1], coef.shape[2]
    plan = edge_tiled.backward_plan(family, x.is_cuda, n_coef)
    if (plan is not None and edge_tiled.backward_takes(n_out, need_params, deterministic, need_x, plan.banded)
            and n_rows and n_in and n_out):
        dx, d_base, d_scaler, d_coef = _grad_buffers(x, base_weight_t, scaler_t, coef, need_x, need_params)
        coef_pad = x.new_empty(edge_tiled.coef_pad_shape(family, coef.shape))
        partial_coef = partial_params = None
        if deterministic:
            coef_shape, params_shape = edge_tiled.partial_shapes(n_rows, n_in, n_coef, n_out)
            partial_coef, partial_params = x.new_empty(coef_shape), x.new_empty(params_shape)
        config = (("family", family), ("make_frame", make_frame), ("n_frame", len(frame_tensors)),
                  ("frame_config", frame_config), ("use_base", use_base), ("deterministic", deterministic))
        _launch(_TILED_BACKWARD, (dy, x, *frame_tensors, base_weight_t, scaler_t, coef, coef_pad,
                                  dx if need_x else None, d_base, d_scaler, d_coef, partial_coef, partial_params), config)
        return dx, d_base, d_scaler, d_coef
    dx, d_base, d_scaler, d_coef = _grad_buffers(x, base_weight_t, scaler_t, coef, need_x, need_params, zero=True)
    frame = make_frame(*(to_warp(t) for t in frame_tensors), *frame_config)
    edge.launch_backward(family, frame, to_warp(dy), to_warp(x), to_warp(base_weight_t), to_warp(scaler_t),
                         to_warp(coef), use_base=use_base, dx=to_warp(dx) if need_x else None,
                         d_base_weight_t=to_warp(d_base) if need_params else None,
                         d_scaler_t=to_warp(d_scaler) if need_params else None,
                         d_coef=to_warp(d_coef) if need_params else None, deterministic=deterministic,
                         stream=warp_stream(x.device), workspace=TorchWorkspace(x.device), tiled=False)
    return dx, d_base, d_scaler, d_coef
