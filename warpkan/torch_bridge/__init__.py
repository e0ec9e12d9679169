"""PyTorch layers and ops backed by warpkan's Warp kernels (``torch.library`` custom ops)."""

from .._warp_output import start_warp

start_warp()

from .bspline_ops import bspline_kan, choose_strategy  # noqa: E402
from .edge_ops import edge_backward, edge_forward  # noqa: E402
from .geglu import GEGLUFFN  # noqa: E402
from .geglu_ops import geglu_ffn, geglu_ffn_backward, geglu_ffn_forward  # noqa: E402
from .graphs import capture_step, graphed_training_step  # noqa: E402
from .kan_linear import KANLinear  # noqa: E402
from .poly import ChebyKANLinear, PolyKANLinear  # noqa: E402
from .poly_ops import poly_kan  # noqa: E402
from .rational import GRKANLinear, GroupRational, KATMLP  # noqa: E402
from .rational_ops import group_rational, group_rational_backward, group_rational_forward  # noqa: E402
from .taylor import Jet, elementwise_rule, jet, jet_of, register_jet_rule  # noqa: E402
from .ukan import UKANLinear  # noqa: E402
from .ukan_ops import ukan_pairs  # noqa: E402

__all__ = ["edge_forward", "edge_backward", "KANLinear", "bspline_kan", "choose_strategy",
           "GEGLUFFN", "geglu_ffn", "geglu_ffn_forward", "geglu_ffn_backward",
           "UKANLinear", "ukan_pairs",
           "PolyKANLinear", "ChebyKANLinear", "poly_kan",
           "GroupRational", "GRKANLinear", "KATMLP", "group_rational", "group_rational_forward",
           "group_rational_backward", "capture_step", "graphed_training_step", "Jet", "jet", "jet_of",
           "register_jet_rule", "elementwise_rule"]
