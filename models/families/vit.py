"""Vision Transformer (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words", arXiv:2010.11929) that
returns its attention.

The image is cut into non-overlapping P×P patches, each linearly embedded (a strided convolution is the
same linear map, §3.1), a learned [class] token is prepended and learned 1-D position embeddings added
(eq. 1). Pre-norm Transformer encoder blocks follow (eq. 2–3: x + MSA(LN(x)), x + MLP(LN(x))), then a
final LayerNorm and a linear head on the class token (eq. 4). ``prefix_tokens`` > 1 puts more learned tokens
after the class token and before the patches (DeiT's distillation token, Touvron et al. 2021; registers, Darcet
et al. 2024); the head still reads the class token, and every attention map covers the prefix tokens first
(``ViT.num_prefix_tokens``, ``ImageResult.prefix_tokens``: timm's ``num_prefix_tokens``).

The layout follows torchvision's ``VisionTransformer`` so its ViT-B/16 ImageNet weights load with only
the fused q/k/v projection split (``models/io/pretrained.py``). The default configuration is the small
Fashion-MNIST model: 28×28 grey, patch 4 -> 7×7 = 49 patches plus the class token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from models.blocks.attention import MultiHeadAttention
from models.calibration import calibrated
from models.inputs.images import ImageInput, prepare
from models.outputs import AttentionMap, ImageResult


@dataclass
class ViTConfig:
    image_size: int = 28  # input side in pixels (square); Fashion-MNIST is 28×28
    in_channels: int = 1  # 1 = grey (Fashion-MNIST), 3 = RGB (ImageNet)
    patch: int = 4  # patch side in pixels: 28 / 4 = 7×7 = 49 patches
    dim: int = 64  # token width D
    depth: int = 4  # encoder blocks L
    heads: int = 4  # attention heads per block (head size D / heads = 16)
    mlp_dim: int = 128  # hidden width of each block's MLP
    num_classes: int = 10  # Fashion-MNIST classes
    dropout: float = 0.1  # dropout after the embeddings, attention output and in the MLP
    attention_dropout: float = 0.0  # dropout on attention weights (training only)
    norm_eps: float = 1e-6  # LayerNorm epsilon (torchvision's ViT uses 1e-6)
    input: str = "fashion"  # "fashion" (grey 28×28, dark background) or "imagenet" (RGB crop)
    resize: int = 256  # imagenet only: shorter side before the centre crop (torchvision's ViT-B/16: 256)
    interpolation: str = "bilinear"  # imagenet only: resize interpolation (torchvision's ViT-B/16: bilinear)
    processor: dict | None = None  # "processor" only: a Hugging Face folder's preprocessing (images.processor_spec)
    prefix_tokens: int = 1  # learned tokens before the patches: the class token, then any more (DeiT's distillation)
    OPTIONAL: ClassVar[tuple[str, ...]] = ("processor", "prefix_tokens")  # newer than the shipped checkpoints

    @property
    def grid(self) -> int:
        """Patches per side."""
        return self.image_size // self.patch

    # the vocabulary every family's config speaks (models/registry.py; TransformerLens's and nanoGPT's names)
    @property
    def d_model(self) -> int:
        return self.dim

    @property
    def n_layers(self) -> int:
        return self.depth

    @property
    def n_heads(self) -> int:
        return self.heads


class EncoderBlock(nn.Module):
    """Pre-norm Transformer encoder block (Dosovitskiy et al. 2021, eq. 2–3)."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.attn = MultiHeadAttention(cfg.dim, cfg.heads, dropout=cfg.attention_dropout)
        self.drop = nn.Dropout(cfg.dropout)
        self.ln_2 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        # indices 0 and 3 hold the Linear layers, as in torchvision's MLPBlock; GELU as in the paper
        self.mlp = nn.Sequential(nn.Linear(cfg.dim, cfg.mlp_dim), nn.GELU(), nn.Dropout(cfg.dropout),
                                 nn.Linear(cfg.mlp_dim, cfg.dim), nn.Dropout(cfg.dropout))

    def forward(self, x: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        a, weights = self.attn(self.ln_1(x), need_weights=need_weights)  # x: (B, T, D); weights (B, H, T, T)
        x = x + self.drop(a)
        return x + self.mlp(self.ln_2(x)), weights


class ViT(nn.Module):
    """Patch embedding + class token + position embedding -> encoder blocks -> LayerNorm -> head."""

    def __init__(self, config: ViTConfig, labels: list[str] | None = None) -> None:
        super().__init__()
        self.config = cfg = config
        if cfg.image_size % cfg.patch:
            raise ValueError(f"image_size {cfg.image_size} is not a multiple of patch {cfg.patch}")
        if cfg.prefix_tokens < 1:
            raise ValueError(f"prefix_tokens must be at least 1 (the class token), got {cfg.prefix_tokens}")
        self.labels = list(labels) if labels is not None else [str(i) for i in range(cfg.num_classes)]
        n_patches = cfg.grid * cfg.grid
        self.patch_embed = nn.Conv2d(cfg.in_channels, cfg.dim, kernel_size=cfg.patch, stride=cfg.patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.dim))
        # the prefix tokens after the class token (none by default, so the shipped state dicts are unchanged)
        self.extra_tokens = nn.Parameter(torch.empty(1, cfg.prefix_tokens - 1, cfg.dim).normal_(std=0.02)) \
            if cfg.prefix_tokens > 1 else None
        self.pos_embed = nn.Parameter(torch.empty(1, cfg.prefix_tokens + n_patches, cfg.dim).normal_(std=0.02))  # E_pos
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(EncoderBlock(cfg) for _ in range(cfg.depth))
        self.norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.num_classes)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    @property
    def grid(self) -> tuple[int, int]:
        """Patch grid (rows, cols)."""
        return self.config.grid, self.config.grid

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches in every sequence and attention map: the class token first, then any more."""
        return self.config.prefix_tokens

    def position_embeddings(self) -> np.ndarray:
        """The learned E_pos (eq. 1) as (prefix + P, D) float32: the ``num_prefix_tokens`` prefix tokens' rows
        (the class token's first), then the patches' in row-major order."""
        return self.pos_embed.detach().float().cpu().numpy()[0]

    def token_labels(self) -> list[str]:
        """"CLS", "TOK1", ... for the prefix tokens, then one label per patch in row-major order: "r0c0", "r0c1", ..."""
        rows, cols = self.grid
        prefix = ["CLS"] + [f"TOK{i}" for i in range(1, self.num_prefix_tokens)]
        return prefix + [f"r{r}c{c}" for r in range(rows) for c in range(cols)]

    def forward(self, x: Tensor, need_weights: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """x (B, C, H, W) normalised image -> logits (B, classes); with ``need_weights`` also the attention
        of every block, (B, L, heads, N, N), N = prefix + P, from the explicit softmax; otherwise fused attention."""
        logits, attention = self.forward_embedded(self.embed_patches(x), need_weights)
        return (logits, torch.stack(attention, dim=1)) if need_weights else logits

    def embed_patches(self, x: Tensor) -> Tensor:
        """x (B, C, H, W) normalised image -> patch embeddings (B, P, D), row-major (eq. 1, x_p E)."""
        # the weights' dtype (ATLAS_DTYPE); the cast is differentiable, so gradients still reach a float32 image
        return self.patch_embed(x.to(self.patch_embed.weight.dtype)).flatten(2).transpose(1, 2)

    def forward_embedded(self, patches: Tensor, need_weights: bool = True) -> tuple[Tensor, list[Tensor]]:
        """The rest of ``forward`` from patch embeddings (B, P, D): (logits (B, classes), per-block attention
        L × (B, heads, N, N), N = prefix + P, empty unless ``need_weights``). The weights are the tensors the blocks
        multiply the values with, in the autograd graph (not stacked), so attribution can take ∂logit/∂A
        (models/inspect/attribution.py) without hooks on the shared model."""
        tokens, attention = self.embedded_features(patches, need_weights)
        return self.forward_head(tokens), attention

    def forward_features(self, x: Tensor, need_weights: bool = False) -> tuple[Tensor, list[Tensor]]:
        """x (B, C, H, W) normalised image -> (every token's final features (B, prefix + P, D), after the final
        LayerNorm; the per-block attention as in ``forward_embedded``). The head is apart (``forward_head``, as
        timm's), so a family that differs only in what its head reads overrides that alone (DeiT)."""
        return self.embedded_features(self.embed_patches(x), need_weights)

    def embedded_features(self, patches: Tensor, need_weights: bool = True) -> tuple[Tensor, list[Tensor]]:
        """``forward_features`` from patch embeddings (B, P, D)."""
        prefix = self.cls_token if self.extra_tokens is None else torch.cat([self.cls_token, self.extra_tokens], 1)
        x = torch.cat([prefix.expand(patches.shape[0], -1, -1), patches], dim=1)  # (B, prefix + P, D)
        x = self.drop(x + self.pos_embed)
        attention = []
        for block in self.blocks:
            x, weights = block(x, need_weights)
            if need_weights:
                attention.append(weights)
        return self.norm(x), attention

    def pool(self, tokens: Tensor) -> Tensor:
        """The features the head reads, (B, D), from the final tokens (B, N, D): the class token's (eq. 4). The
        calibration's feature check measures these."""
        return tokens[:, 0]

    def forward_head(self, tokens: Tensor) -> Tensor:
        """Logits (B, classes) from the final tokens (B, N, D)."""
        return self.head(self.pool(tokens))

    @torch.no_grad()
    def classify(self, image: ImageInput) -> ImageResult:
        """Any image -> ImageResult with class probabilities and the encoder attention (L, H, N, N), N = prefix + P."""
        cfg = self.config
        prepared = prepare(image, cfg.input, resize=cfg.resize, crop=cfg.image_size, interpolation=cfg.interpolation,
                           processor=cfg.processor)
        device = next(self.parameters()).device
        was_training = self.training
        self.eval()
        tokens, attention = self.forward_features(prepared.tensor.to(device), need_weights=True)
        logits, features = self.forward_head(tokens)[0], self.pool(tokens)[0]
        self.train(was_training)
        attention = torch.stack(attention, dim=1)  # (1, L, heads, N, N), N = prefix + P
        tokens = self.token_labels()
        encoder = AttentionMap(weights=attention[0].float().cpu().numpy(), queries=tokens, keys=list(tokens))
        return ImageResult(image=prepared.shown, labels=list(self.labels), grid=self.grid, patch=cfg.patch,
                           attention={"encoder": encoder}, notice=prepared.notice, tensor=prepared.tensor,
                           prefix_tokens=self.num_prefix_tokens, **calibrated(self, logits, features, prepared.shown))
