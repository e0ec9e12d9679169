"""Small reference models built from warpkan's torch layers, at the shapes the peers publish model-level
figures for (``warpkan bench models`` trains each of them against its twins):

- :class:`VisionTransformer` ``ffn="grkan"``, KAT: :class:`~warpkan.torch_bridge.KATMLP` (two ``GRKANLinear``)
  as every block's FFN; by default ViT-Tiny: 224² inputs, patch 16, dim 192, depth 12, 3 heads, FFN 768, 1000
  classes.
- :class:`MLPMixer` ``token_mixing="kan"`` / ``"ukan"``: ``KANLinear`` (G=5, k=3) / ``UKANLinear`` token mixing;
  by default the UKAN paper's CIFAR Mixer: 32² inputs, patch 4 (64 tokens), hidden 256, depth 16, token
  expansion 4, channel expansion 0.5, 10 classes.
- :class:`PolyKANNet`: ``PolyKANLinear`` (Fourier or Chebyshev, LUT or exact); by default PolyKAN's Speech
  Commands network: 40 -> 256 -> 256 -> 12, degree 8.
- :class:`FeedForward` ``kind="kan"`` / ``"ukan"``: ``KANLinear`` / ``UKANLinear``; by default the UKAN paper's
  MNIST network: 784 -> 32 -> 10.

Each has its twins in the same class: ``ffn="gelu"`` is the same ViT with a GELU MLP, ``token_mixing="mlp"``
and ``kind="mlp"`` put Linear-GELU-Linear where the KAN layers were, and ``"efficient-kan"`` uses the
bundled pure-torch re-implementation of efficient-kan's ``KANLinear``
(:class:`warpkan.reference.efficient_kan.EfficientKANLinear`), the formula the B-spline layer is compared with.

Compiling: :class:`VisionTransformer` and :class:`MLPMixer` keep their repeated blocks in ``.blocks``.
``for block in model.blocks: block.compile()`` compiles one block's graph and reuses it for the others
(PyTorch's regional compilation) instead of compiling the whole network as one graph.
The UKAN layers here use a fixed-size coefficient table (``table_groups``, see
:class:`~warpkan.torch_bridge.UKANLinear`), so they compile and capture.

Every model takes float32 inputs (images (B, C, H, W) or features (B, in)) and returns logits (B, classes);
bf16 is by ``torch.autocast``, under which each warpkan layer computes in fp32 and returns bf16.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from . import _checks
from .reference.efficient_kan import EfficientKANLinear
from .torch_bridge import KATMLP, KANLinear, PolyKANLinear, UKANLinear

__all__ = ["FeedForward", "VisionTransformer", "MLPMixer", "PolyKANNet", "LAYER_KINDS"]

# what FeedForward (and so the Mixer's token mixing) can be built of
LAYER_KINDS = ("kan", "ukan", "efficient-kan", "mlp")


class FeedForward(nn.Sequential):
    """A stack of layers of one kind through ``widths``: ``"kan"`` (:class:`~warpkan.torch_bridge.KANLinear`),
    ``"ukan"`` (:class:`~warpkan.torch_bridge.UKANLinear`), ``"efficient-kan"`` (efficient-kan's formula,
    :class:`~warpkan.reference.efficient_kan.EfficientKANLinear`, the same parameters as ``"kan"``) or
    ``"mlp"`` (``nn.Linear`` with GELU between). The KAN layers have their own nonlinearity: nothing goes
    between them. Defaults: the UKAN paper's MNIST network, 784 -> 32 -> 10.

    The B-spline layers use efficient-kan's grid, ``grid_size`` intervals on [-1, 1] of order
    ``spline_order``; the UKAN layers the same order on an unbounded grid of spacing ``grid_delta``, with a
    table of ``table_groups`` groups of k + 1 cells per feature from its lowest input of the batch (inputs
    past it get no spline term, as inputs off a bounded grid; the default covers 12 units: 6 groups of
    4 cells of 0.5).

    Args:
        widths: the layer widths, a tuple of at least two positive ints (input first).
        kind: one of :data:`LAYER_KINDS`.
        grid_size: grid intervals of the ``"kan"`` and ``"efficient-kan"`` layers (a positive int).
        spline_order: B-spline order of the KAN layers, an int in [1, 5].
        grid_delta: knot spacing of the ``"ukan"`` layers, a positive number.
        table_groups: the ``"ukan"`` layers' fixed table size (a positive int).
    """

    def __init__(self, widths: tuple = (784, 32, 10), kind: str = "kan", grid_size: int = 5, spline_order: int = 3,
                 grid_delta: float = 0.5, table_groups: int = 6):
        widths = _widths("widths", widths)
        kind = _checks.one_of("kind", kind, LAYER_KINDS)
        pairs = list(zip(widths[:-1], widths[1:]))
        layers = []
        for i, (n_in, n_out) in enumerate(pairs):
            if kind == "kan":
                layers.append(KANLinear(n_in, n_out, grid_size=grid_size, spline_order=spline_order))
            elif kind == "efficient-kan":
                layers.append(EfficientKANLinear(n_in, n_out, grid_size=_checks.positive_int("grid_size", grid_size),
                                                 spline_order=_checks.int_in_range("spline_order", spline_order, 1, 5)))
            elif kind == "ukan":
                layers.append(UKANLinear(n_in, n_out, spline_order=spline_order, grid_delta=grid_delta,
                                         table_groups=table_groups))
            else:
                layers.append(nn.Linear(n_in, n_out))
                if i < len(pairs) - 1:
                    layers.append(nn.GELU())
        super().__init__(*layers)
        self.widths, self.kind = widths, kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """y (..., widths[-1]) for x (..., widths[0])."""
        return super().forward(x)

    def extra_repr(self) -> str:
        return f"widths={self.widths}, kind={self.kind!r}"


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, n, c))


class _TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, ffn: str, num_groups: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = _Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        if ffn == "grkan":  # KAT's FFN: rational (identity init) -> fc1 -> rational (swish init) -> fc2
            self.mlp = KATMLP(dim, hidden, dim, num_groups=num_groups)
        else:
            self.mlp = FeedForward((dim, hidden, dim), "mlp")

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    """A pre-norm ViT (timm's layout: patch convolution, class token, learned position embeddings, blocks of
    attention and FFN, final LayerNorm, linear head on the class token) whose FFN is KAT's group-rational one
    (``ffn="grkan"``: :class:`~warpkan.torch_bridge.KATMLP`, the rational before each linear layer, identity
    then swish initialisation, as KAT's ``KAN`` block) or a GELU MLP (``ffn="gelu"``). The defaults are
    KAT-Tiny's (ViT-Tiny's) shape. The blocks are in ``.blocks`` (see the module docstring on compiling).

    Args:
        image_size: height and width of the input images (a positive int divisible by ``patch_size``).
        patch_size: side of the square patches (a positive int).
        dim: token width (a positive int divisible by ``heads``).
        depth: number of blocks (a positive int).
        heads: attention heads (a positive int).
        mlp_ratio: FFN hidden width over ``dim`` (a positive number; the width is rounded down).
        num_classes: outputs of the head (a positive int).
        in_channels: channels of the input images (a positive int).
        ffn: ``"grkan"`` or ``"gelu"``.
        num_groups: rational groups of the ``"grkan"`` FFN (a positive int dividing ``dim`` and the hidden
            width).
    """

    def __init__(self, image_size: int = 224, patch_size: int = 16, dim: int = 192, depth: int = 12, heads: int = 3,
                 mlp_ratio: float = 4.0, num_classes: int = 1000, in_channels: int = 3, ffn: str = "grkan",
                 num_groups: int = 8):
        super().__init__()
        tokens = _patches(image_size, patch_size)
        dim = _checks.positive_int("dim", dim)
        heads = _checks.positive_int("heads", heads)
        _checks.divides("heads", heads, "dim", dim)
        depth = _checks.positive_int("depth", depth)
        mlp_ratio = _checks.positive_number("mlp_ratio", mlp_ratio)
        hidden = _checks.positive_int("int(dim * mlp_ratio)", int(dim * mlp_ratio))
        ffn = _checks.one_of("ffn", ffn, ("grkan", "gelu"))
        self.image_size, self.patch_size, self.ffn = image_size, patch_size, ffn
        self.patch_embed = nn.Conv2d(_checks.positive_int("in_channels", in_channels), dim, patch_size, patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens + 1, dim))
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=1e-6)
        self.blocks = nn.ModuleList(_TransformerBlock(dim, heads, hidden, ffn, num_groups) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, _checks.positive_int("num_classes", num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, num_classes) for images x (B, in_channels, image_size, image_size)."""
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


class _MixerBlock(nn.Module):
    def __init__(self, tokens: int, dim: int, token_hidden: int, channel_hidden: int, token_mixing: str):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mixing = FeedForward((tokens, token_hidden, tokens), token_mixing)
        self.norm2 = nn.LayerNorm(dim)
        self.channel_mixing = FeedForward((dim, channel_hidden, dim), "mlp")

    def forward(self, x):  # x (B, tokens, dim)
        x = x + self.token_mixing(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mixing(self.norm2(x))


class MLPMixer(nn.Module):
    """An MLP-Mixer whose token mixing is a KAN: each block mixes the tokens with
    ``FeedForward((tokens, token_expansion * tokens, tokens), token_mixing)`` on every channel, then the
    channels with a GELU MLP ``dim -> channel_expansion * dim -> dim`` (pre-norm, residual); the head is a
    LayerNorm, the mean over tokens and a linear layer. The defaults are the UKAN paper's CIFAR-10 Mixer
    (appendix E: hidden 256, depth 16, token expansion 4, channel expansion 0.5, 32² inputs, patch 4), the
    expansions applied as in lucidrains' ``mlp-mixer-pytorch``: the token MLP widens the 64 tokens to 256,
    the channel MLP narrows 256 channels to 128. The blocks are in ``.blocks``.

    Args:
        image_size: height and width of the input images (a positive int divisible by ``patch_size``).
        patch_size: side of the square patches (a positive int).
        dim: channels of each token (a positive int).
        depth: number of blocks (a positive int).
        token_expansion: hidden width of the token mixing over the number of tokens (a positive number; the
            width is rounded down and must be at least 1).
        channel_expansion: hidden width of the channel MLP over ``dim`` (likewise).
        num_classes: outputs of the head (a positive int).
        in_channels: channels of the input images (a positive int).
        token_mixing: one of :data:`LAYER_KINDS`, the layers of the token mixing (see :class:`FeedForward`).
    """

    def __init__(self, image_size: int = 32, patch_size: int = 4, dim: int = 256, depth: int = 16,
                 token_expansion: float = 4.0, channel_expansion: float = 0.5, num_classes: int = 10,
                 in_channels: int = 3, token_mixing: str = "kan"):
        super().__init__()
        tokens = _patches(image_size, patch_size)
        dim = _checks.positive_int("dim", dim)
        depth = _checks.positive_int("depth", depth)
        token_hidden = _checks.positive_int(
            "int(token_expansion * tokens)", int(_checks.positive_number("token_expansion", token_expansion) * tokens))
        channel_hidden = _checks.positive_int(
            "int(channel_expansion * dim)", int(_checks.positive_number("channel_expansion", channel_expansion) * dim))
        self.image_size, self.patch_size, self.tokens = image_size, patch_size, tokens
        self.token_mixing = _checks.one_of("token_mixing", token_mixing, LAYER_KINDS)
        self.patch_embed = nn.Conv2d(_checks.positive_int("in_channels", in_channels), dim, patch_size, patch_size)
        self.blocks = nn.ModuleList(_MixerBlock(tokens, dim, token_hidden, channel_hidden, token_mixing)
                                    for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, _checks.positive_int("num_classes", num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, num_classes) for images x (B, in_channels, image_size, image_size)."""
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))


class PolyKANNet(nn.Module):
    """A stack of :class:`~warpkan.torch_bridge.PolyKANLinear` layers through ``widths`` (each applies tanh to
    its inputs: nothing goes between them). The defaults are PolyKAN's Speech Commands network,
    40 -> 256 -> 256 -> 12, Fourier basis of degree 8, from lookup tables.

    Args:
        widths: the layer widths, a tuple of at least two positive ints (input first).
        degree: the basis degree of every layer (see :class:`~warpkan.torch_bridge.PolyKANLinear`).
        basis: the polynomial basis (``"fourier"``, ``"chebyshev"``, ...).
        mode: ``"lut"`` or ``"exact"``.
    """

    def __init__(self, widths: tuple = (40, 256, 256, 12), degree: int = 8, basis: str = "fourier",
                 mode: str = "lut"):
        super().__init__()
        self.widths = _widths("widths", widths)
        self.layers = nn.Sequential(*[PolyKANLinear(n_in, n_out, degree, basis=basis, mode=mode)
                                      for n_in, n_out in zip(self.widths[:-1], self.widths[1:])])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """y (..., widths[-1]) for x (..., widths[0])."""
        return self.layers(x)


def _widths(name: str, widths) -> tuple:
    if not isinstance(widths, (list, tuple)) or len(widths) < 2:
        raise ValueError(f"{name} must be a tuple of at least two positive ints, got {widths!r}")
    return tuple(_checks.positive_int(f"{name}[{i}]", w) for i, w in enumerate(widths))


def _patches(image_size, patch_size) -> int:
    """The number of patches of an image, the sizes checked."""
    image_size = _checks.positive_int("image_size", image_size)
    patch_size = _checks.positive_int("patch_size", patch_size)
    _checks.divides("patch_size", patch_size, "image_size", image_size)
    return (image_size // patch_size) ** 2
