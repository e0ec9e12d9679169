"""What the interpretability tools need to know about each numeric KAN family: which layers they take, how to
check a chain of layers and rebuild a network from one, how to build a smaller layer of the same class from a
subset of its inputs and outputs, and which parameters make up each edge (to zero an edge, or to mask its
gradient). The lowest module of the package: the symbolic layers (``_symbolic_layer``, which also lays a
network out as a chain of layers) and the edge evaluation build on it."""

from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn

from ..torch_bridge import ChebyKANLinear, GRKANLinear, KANLinear, KATMLP, PolyKANLinear, UKANLinear

EDGE_LAYERS = (KANLinear, UKANLinear, PolyKANLinear, GRKANLinear)
SUPPORTED = "KANLinear, UKANLinear, PolyKANLinear, ChebyKANLinear or GRKANLinear"


def is_edge_layer(module) -> bool:
    return isinstance(module, EDGE_LAYERS)


def check_edge_layer(name: str, module) -> None:
    if not is_edge_layer(module):
        raise TypeError(f"{name} must be a {SUPPORTED} layer (warpkan.torch_bridge), got {type(module).__name__}")


def layer_dtype_device(layer) -> tuple[torch.dtype, torch.device]:
    if isinstance(layer, KANLinear):
        ref = layer.grid
    elif isinstance(layer, UKANLinear):
        ref = layer.spline_scaler
    elif isinstance(layer, PolyKANLinear):
        ref = layer.coeffs
    else:
        ref = layer.linear.weight
    return ref.dtype, ref.device


# ------------------------------------------------------------------------------------------------ networks
def check_chain(layers: list, name: str = "model") -> None:
    for index in range(len(layers) - 1):
        n_out, n_in = layers[index].out_features, layers[index + 1].in_features
        if n_out != n_in:
            raise ValueError(f"{name}: layer {index} has {n_out} outputs but layer {index + 1} takes {n_in} inputs")


def rebuild(model, layers: list):
    """A model of the same container type as ``model`` holding ``layers`` (for prune and refine)."""
    if is_edge_layer(model):
        return layers[0]
    if isinstance(model, KATMLP):
        new = copy.deepcopy(model)
        new.fc1, new.fc2 = layers
        return new
    if isinstance(model, nn.Sequential):
        return nn.Sequential(*layers)
    raise TypeError(f"model must be a {SUPPORTED} layer, an nn.Sequential of them or a KATMLP, got "
                    f"{type(model).__name__}")


# ------------------------------------------------------------------------------------------------ Warp-native
def is_native(model) -> bool:
    """Whether ``model`` is a Warp-native layer or network (``warpkan.native``)."""
    return type(model).__module__.startswith("warpkan.native")


def from_native(model) -> list | None:
    """The torch layers equal to a Warp-native layer or ``KANNetwork`` (same parameters, copied), or None when
    ``model`` is not one."""
    if not is_native(model):
        return None
    if type(model).__name__ == "KANNetwork":
        return [layer for item in model.layers for layer in from_native(item) or [_refuse_native(item)]]
    import warp as wp

    config = model.config()
    kind = config["type"]
    device = wp.device_to_torch(model.device)
    dtype = torch.float64 if model.dtype == wp.float64 else torch.float32
    factory = dict(device=device, dtype=dtype)
    if kind == "KANLinear":
        layer = KANLinear(config["in_features"], config["out_features"], grid_size=config["grid_size"],
                          spline_order=config["spline_order"], base_activation=nn.SiLU if config["use_base"] else None,
                          **factory)
    elif kind in ("PolyKANLinear", "ChebyKANLinear"):
        layer = PolyKANLinear(config["in_features"], config["out_features"], config["degree"], basis=config["basis"],
                              mode=config["mode"], lut_size=config["lut_size"], bias=config["bias"],
                              alpha=config["alpha"], beta=config["beta"], **factory)
    elif kind == "UKANLinear":
        layer = UKANLinear(config["in_features"], config["out_features"], spline_order=config["spline_order"],
                           grid_delta=config["grid_delta"], pe_dim=config["pe_dim"], embed_dim=config["embed_dim"],
                           hidden_dim=config["hidden_dim"], base_activation="silu" if config["use_base"] else None,
                           **factory)
    elif kind == "GRKANLinear":
        rational = config["rational"]
        layer = GRKANLinear(config["in_features"], config["out_features"], num_groups=rational["num_groups"],
                            order=tuple(rational["order"]), variant=rational["variant"],
                            shared_numerator=rational["shared_numerator"], bias=config["bias"], **factory)
    else:
        _refuse_native(model)
    state = {key: torch.as_tensor(value) for key, value in model.state_dict().items()}
    layer.load_state_dict(state, strict=True)
    return [layer]


def _refuse_native(model):
    raise TypeError(f"the Warp-native {type(model).__name__} is not a KAN layer with edges (KANLinear, UKANLinear, "
                    f"PolyKANLinear, ChebyKANLinear or GRKANLinear)")


# ------------------------------------------------------------------------------------------------ per family
def default_range(layer) -> torch.Tensor | None:
    """[in, 2]: the interval each input's edges are defined on by the layer itself (a KANLinear's grid, without
    the k extension knots on each side), or None for families without a bounded domain."""
    if isinstance(layer, KANLinear):
        k = layer.spline_order
        return torch.stack([layer.grid[:, k], layer.grid[:, -k - 1]], dim=1)
    return None


def bias(layer) -> torch.Tensor | None:
    """The per-output constant a layer adds after its sum over edges (not part of any edge)."""
    if isinstance(layer, PolyKANLinear):
        return layer.bias
    if isinstance(layer, GRKANLinear):
        return layer.linear.bias
    return None


def edge_params(layer) -> list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]]:
    """(parameter name, keep [out, in] -> multiplier shaped like the parameter): multiplying each parameter by
    its multiplier makes the edges where keep is 0 identically zero and leaves the others unchanged."""
    if isinstance(layer, KANLinear):
        return [("base_weight", lambda keep: keep), ("spline_weight", lambda keep: keep.unsqueeze(-1))]
    if isinstance(layer, UKANLinear):
        return [("base_weight", lambda keep: keep), ("spline_scaler", lambda keep: keep)]
    if isinstance(layer, PolyKANLinear):
        return [("coeffs", lambda keep: keep.t().unsqueeze(-1))]
    if isinstance(layer, GRKANLinear):
        return [("linear.weight", lambda keep: keep)]
    check_edge_layer("layer", layer)


@torch.no_grad()
def zero_edges(layer, keep: torch.Tensor) -> None:
    """Make the edges where ``keep`` [out, in] is False identically zero, in place."""
    params = dict(layer.named_parameters())
    mask = keep.to(dtype=layer_dtype_device(layer)[0])
    for name, multiplier in edge_params(layer):
        params[name].mul_(multiplier(mask))


@torch.no_grad()
def live_edges(layer) -> torch.Tensor:
    """Bool [out, in]: the edges whose parameters do not make them identically zero."""
    if isinstance(layer, KANLinear):
        spline = (layer.spline_weight != 0).any(-1) & (layer.spline_scaler != 0)
        return spline | ((layer.base_weight != 0) & layer.use_base)
    if isinstance(layer, UKANLinear):
        return (layer.spline_scaler != 0) | ((layer.base_weight != 0) & layer.use_base)
    if isinstance(layer, PolyKANLinear):
        return (layer.coeffs != 0).any(-1).t()
    if isinstance(layer, GRKANLinear):
        return layer.linear.weight != 0
    check_edge_layer("layer", layer)


def _contiguous_parameters(layer: KANLinear) -> bool:
    # the kernel layout keeps the output index innermost; with one output both layouts are the same memory
    return layer.out_features > 1 and layer.spline_weight.stride(-1) == 1


def like(layer, in_features: int, out_features: int, **changes):
    """A new layer of ``layer``'s class and configuration with other sizes (parameters freshly initialised)."""
    dtype, device = layer_dtype_device(layer)
    factory = dict(device=device, dtype=dtype)
    if isinstance(layer, KANLinear):
        config = dict(grid_size=layer.grid_size, spline_order=layer.spline_order, scale_noise=layer.scale_noise,
                      scale_base=layer.scale_base, scale_spline=layer.scale_spline,
                      enable_standalone_scale_spline=layer.enable_standalone_scale_spline,
                      base_activation=copy.deepcopy(layer.base_activation), grid_eps=layer.grid_eps,
                      deterministic=layer.deterministic, strategy=layer.strategy,
                      contiguous_parameters=_contiguous_parameters(layer), precision=layer.precision)
    elif isinstance(layer, ChebyKANLinear):
        config = dict(degree=layer.degree, mode=layer.mode, lut_size=layer.lut_size, bias=layer.bias is not None,
                      strategy=layer.strategy, precision=layer.precision, deterministic=layer.deterministic)
    elif isinstance(layer, PolyKANLinear):
        config = dict(degree=layer.degree, basis=layer.basis, mode=layer.mode, lut_size=layer.lut_size,
                      bias=layer.bias is not None, alpha=layer.alpha, beta=layer.beta, strategy=layer.strategy,
                      precision=layer.precision, deterministic=layer.deterministic)
    elif isinstance(layer, UKANLinear):
        config = dict(spline_order=layer.spline_order, grid_delta=layer.grid_delta, pe_dim=layer.pe_dim,
                      embed_dim=layer.embed_dim, hidden_dim=layer.hidden_dim,
                      base_activation=copy.deepcopy(layer.base_activation), table_groups=layer.table_groups,
                      deterministic=layer.deterministic)
    elif isinstance(layer, GRKANLinear):
        rational = layer.rational
        config = dict(num_groups=rational.num_groups, order=rational.order, variant=rational.variant,
                      init=rational.init, shared_numerator=rational.shared_numerator,
                      bias=layer.linear.bias is not None, deterministic=rational.deterministic)
    else:
        check_edge_layer("layer", layer)
    config.update(changes)
    new = type(layer)(in_features, out_features, **config, **factory)
    if isinstance(layer, UKANLinear):
        new.dense_max_coefficients = layer.dense_max_coefficients
    return new


def activation_state(layer) -> dict:
    """The state of ``layer``'s base activation module (nn.PReLU's weight, say): per layer, not per edge, so a
    layer made from it (a subset of its edges, a finer grid) keeps it as it is."""
    activation = getattr(layer, "base_activation", None)
    if not isinstance(activation, nn.Module):
        return {}
    return {f"base_activation.{key}": value for key, value in activation.state_dict().items()}


@torch.no_grad()
def subset(layer, inputs, outputs):
    """A layer of the same class computing exactly the edges (o, i) of ``layer`` with o in ``outputs`` and i in
    ``inputs`` (index sequences; order kept), and the same per-output bias."""
    dtype, device = layer_dtype_device(layer)
    inputs = torch.as_tensor(inputs, dtype=torch.long, device=device).reshape(-1)
    outputs = torch.as_tensor(outputs, dtype=torch.long, device=device).reshape(-1)
    n_in, n_out = int(inputs.numel()), int(outputs.numel())
    if n_in == 0 or n_out == 0:
        raise ValueError(f"a layer needs at least one input and one output, got {n_in} inputs and {n_out} outputs")
    state = layer.state_dict()

    def edges(key):  # [out, in, ...] tensors
        return state[key][outputs][:, inputs]

    if isinstance(layer, KANLinear):
        new = like(layer, n_in, n_out)
        sliced = {"grid": state["grid"][inputs], "base_weight": edges("base_weight"),
                  "spline_weight": edges("spline_weight")}
        if layer.enable_standalone_scale_spline:
            sliced["spline_scaler"] = edges("spline_scaler")
    elif isinstance(layer, PolyKANLinear):
        new = like(layer, n_in, n_out)
        sliced = {"coeffs": state["coeffs"][inputs][:, outputs]}
        if layer.bias is not None:
            sliced["bias"] = state["bias"][outputs]
    elif isinstance(layer, UKANLinear):
        new = like(layer, n_in, n_out)
        K = layer.spline_order + 1
        rows = (outputs.unsqueeze(1) * K + torch.arange(K, device=device)).reshape(-1)
        sliced = {key: value for key, value in state.items() if key.startswith("cg_hidden.")}
        sliced.update({"feature_embedding": state["feature_embedding"][inputs],
                       "cg_out.weight": state["cg_out.weight"][rows], "cg_out.bias": state["cg_out.bias"][rows],
                       "base_weight": edges("base_weight"), "spline_scaler": edges("spline_scaler")})
    elif isinstance(layer, GRKANLinear):
        # one group per kept channel (channels of one group keep their group's coefficients): the grouping of
        # the kept channels need not be contiguous and even any more
        rational = layer.rational
        group = inputs // (rational.num_features // rational.num_groups)
        new = like(layer, n_in, n_out, num_groups=n_in)
        numerator = state["rational.weight_numerator"]
        sliced = {"rational.weight_numerator": numerator if rational.shared_numerator else numerator[group],
                  "rational.weight_denominator": state["rational.weight_denominator"][group],
                  "linear.weight": edges("linear.weight")}
        if layer.linear.bias is not None:
            sliced["linear.bias"] = state["linear.bias"][outputs]
    else:
        check_edge_layer("layer", layer)
    sliced.update(activation_state(layer))
    new.load_state_dict(sliced, strict=True)
    return new
