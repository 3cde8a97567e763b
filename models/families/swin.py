"""Swin Transformer (Liu et al. 2021, "Swin Transformer: Hierarchical Vision Transformer using Shifted
Windows", arXiv:2103.14030) that returns its window attention.

Self-attention is computed inside non-overlapping windows of ``window × window`` tokens (§3.2). Every
second block shifts the token grid cyclically by ``window // 2`` (``torch.roll``), so windows straddle the
previous block's window borders; tokens that the roll brought together from opposite image edges are kept
apart by an additive −100 mask built from the paper's 3×3 regions (§3.2, "efficient batch computation
for shifted configuration", Fig. 4). Each head adds a learned relative position bias B from a table of
(2w−1)² entries (§3.2, eq. 4). Patch merging halves the grid and doubles the channels between stages.

The layout follows torchvision's ``swin_t`` (pre-norm blocks, padding to a multiple of the window, no
shift when the window covers the whole padded grid) so its ImageNet weights load unchanged
(``models/io/pretrained.py``). The default configuration is the small Fashion-MNIST model: 28×28 grey,
patch 2 -> 14×14 tokens in 2×2 windows of 7×7, merged to 7×7 tokens in one window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.blocks.attention import attend
from models.calibration import calibrated
from models.inputs.images import ImageInput, prepare
from models.outputs import ImageResult, WindowAttention

MASK_VALUE = -100.0  # the paper's (and reference code's) additive mask for tokens of different regions


@dataclass
class SwinConfig:
    image_size: int = 28  # input side in pixels (square); Fashion-MNIST is 28×28
    in_channels: int = 1  # 1 = grey (Fashion-MNIST), 3 = RGB (ImageNet)
    patch: int = 2  # pixels per token side in stage 1: 28 / 2 = 14×14 tokens
    embed_dim: int = 48  # channels in stage 1; each patch merging doubles them
    depths: tuple[int, ...] = (2, 2)  # blocks per stage; blocks alternate regular / shifted windows
    heads: tuple[int, ...] = (3, 6)  # attention heads per stage (head size 16 here, 32 in Swin-T)
    window: int = 7  # window side in tokens: 14×14 -> 2×2 windows of 7×7 = 49 tokens
    mlp_ratio: float = 4.0  # MLP hidden size = mlp_ratio × channels
    num_classes: int = 10  # Fashion-MNIST classes
    dropout: float = 0.0  # dropout after attention projection and in the MLP
    attention_dropout: float = 0.0  # dropout on attention weights (training only)
    drop_path: float = 0.1  # stochastic depth, rising linearly to this rate over all blocks
    norm_eps: float = 1e-5  # LayerNorm epsilon (torchvision's Swin uses 1e-5)
    input: str = "fashion"  # "fashion" (grey 28×28, dark background), "imagenet" (RGB crop) or "processor"
    processor: dict | None = None  # "processor" only: a Hugging Face folder's preprocessing (images.processor_spec)
    OPTIONAL: ClassVar[tuple[str, ...]] = ("processor",)  # newer than the shipped checkpoints
    resize: int = 232  # imagenet only: shorter side before the centre crop (torchvision's Swin-T: 232)
    interpolation: str = "bicubic"  # imagenet only: resize interpolation (torchvision's Swin-T: bicubic)

    def __post_init__(self) -> None:
        # config.json stores tuples as lists
        self.depths = tuple(int(d) for d in self.depths)
        self.heads = tuple(int(h) for h in self.heads)
        if len(self.depths) != len(self.heads):
            raise ValueError(f"depths {self.depths} and heads {self.heads} need one entry per stage")

    @property
    def shift(self) -> int:
        """Cyclic shift of the shifted blocks, in tokens (the paper: ⌊window / 2⌋)."""
        return self.window // 2

    # the vocabulary every family's config speaks (models/registry.py): the widths and heads grow by stage, so the
    # last stage's, which the head reads; every block counts as a layer
    @property
    def d_model(self) -> int:
        return self.embed_dim * 2 ** (len(self.depths) - 1)

    @property
    def n_layers(self) -> int:
        return sum(self.depths)

    @property
    def n_heads(self) -> int:
        return self.heads[-1]


# ------------------------------------------------------------------------------------ window geometry
def window_partition(x: Tensor, window: int) -> Tensor:
    """(B, H, W, C) -> (B·nW, window, window, C), windows in row-major order; H and W multiples of window."""
    B, H, W, C = x.shape
    x = x.view(B, H // window, window, W // window, window, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, window, window, C)


def window_reverse(windows: Tensor, window: int, H: int, W: int) -> Tensor:
    """(B·nW, window, window, C) -> (B, H, W, C); the inverse of ``window_partition``."""
    C = windows.shape[-1]
    x = windows.view(-1, H // window, W // window, window, window, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, H, W, C)


def relative_position_index(window: int) -> Tensor:
    """(N, N) long, N = window²: entry [i, j] indexes the (2w−1)² bias table with the offset of token j
    from token i, (Δrow + w − 1)·(2w − 1) + (Δcol + w − 1) (Liu et al. 2021, §3.2)."""
    coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij"))  # (2, w, w)
    coords = coords.flatten(1)  # (2, N)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0)  # (N, N, 2): offsets in [−w+1, w−1]
    rel = rel + (window - 1)
    return rel[:, :, 0] * (2 * window - 1) + rel[:, :, 1]  # (N, N)


def _pair(shift: int | tuple[int, int]) -> tuple[int, int]:
    return (shift, shift) if isinstance(shift, int) else (int(shift[0]), int(shift[1]))


def shifted_window_regions(H: int, W: int, window: int, shift: int | tuple[int, int]) -> Tensor:
    """Region ids (Hp, Wp) long of the cyclically shifted token grid, padded up to multiples of window.

    After rolling the grid by −shift, the last ``shift`` rows and columns hold tokens from the opposite
    edges. Rows fall into three bands [0, Hp−w), [Hp−w, Hp−s), [Hp−s, Hp), and the same for columns; their
    3×3 products are the regions of Liu et al. (2021), Fig. 4. ``torch.roll(ids, shift, dims=(0, 1))``
    maps the ids back onto the unshifted image.
    """
    sh, sw = _pair(shift)
    Hp, Wp = -(-H // window) * window, -(-W // window) * window
    ids = torch.zeros(Hp, Wp, dtype=torch.long)
    bands_h = (slice(0, Hp - window), slice(Hp - window, Hp - sh), slice(Hp - sh, Hp))
    bands_w = (slice(0, Wp - window), slice(Wp - window, Wp - sw), slice(Wp - sw, Wp))
    for r, hs in enumerate(bands_h):
        for c, ws in enumerate(bands_w):
            ids[hs, ws] = 3 * r + c
    return ids


def shifted_window_mask(H: int, W: int, window: int, shift: int | tuple[int, int]) -> Tensor:
    """Additive attention mask (nW, N, N) float for the shifted windows: 0 where query and key tokens lie
    in the same region, −100 where they do not (so softmax gives them ~e^−100 ≈ 0). H and W are padded up
    to multiples of the window, as the model does; windows are in ``window_partition`` order."""
    ids = shifted_window_regions(H, W, window, shift).to(torch.float32)  # (Hp, Wp)
    ids = window_partition(ids[None, :, :, None], window).flatten(1)  # (nW, N)
    diff = ids[:, None, :] - ids[:, :, None]  # (nW, N, N): 0 where the regions match
    return torch.where(diff == 0, 0.0, MASK_VALUE)


@dataclass(frozen=True)
class WindowGeometry:
    """Everything the shifted-window construction does to a square token grid, as numpy arrays."""

    grid: int  # token grid side asked for
    side: int  # the side after padding up to a multiple of the window (what the model partitions)
    window: int
    shift: int
    regions: np.ndarray  # (side, side) region ids of the rolled grid (Fig. 4)
    masks: np.ndarray  # (windows, N, N) additive mask per window: 0 or MASK_VALUE
    ids: np.ndarray  # (side, side) token ids in image order
    rolled: np.ndarray  # (side, side) the same ids after the cyclic shift by −shift

    @property
    def windows(self) -> int:
        return int(self.masks.shape[0])

    def blocked(self, index: int) -> int:
        """How many query–key pairs of window ``index`` the mask blocks."""
        return int((self.masks[index] < 0).sum())

    @property
    def padding(self) -> np.ndarray:
        """(side, side) bool in image order: True where a cell is padding (beyond the grid), not image."""
        r, c = np.divmod(self.ids, self.side)
        return (r >= self.grid) | (c >= self.grid)

    def window_padding(self, index: int) -> np.ndarray:
        """(N,) bool: which tokens of window ``index`` (on the rolled grid, row-major) are padding."""
        rolled = np.roll(self.padding, (-self.shift, -self.shift), axis=(0, 1))
        w = self.window
        r, c = divmod(index, self.side // w)
        return rolled[r * w:(r + 1) * w, c * w:(c + 1) * w].ravel()


def window_geometry(grid: int, window: int, shift: int) -> WindowGeometry:
    """Window partition, cyclic shift, region ids and masks of a ``grid`` × ``grid`` token grid, padded up to
    a multiple of ``window`` as the model pads it; 0 <= shift < window."""
    if window < 1 or grid < 1 or not 0 <= shift < window:
        raise ValueError(f"need grid >= 1, window >= 1 and 0 <= shift < window; got {grid}, {window}, {shift}")
    side = -(-grid // window) * window
    ids = np.arange(side * side).reshape(side, side)
    return WindowGeometry(grid=grid, side=side, window=window, shift=shift,
                          regions=shifted_window_regions(side, side, window, shift).numpy(),
                          masks=shifted_window_mask(side, side, window, shift).numpy(),
                          ids=ids, rolled=np.roll(ids, (-shift, -shift), axis=(0, 1)))


# ---------------------------------------------------------------------------------------------- layers
class DropPath(nn.Module):
    """Stochastic depth (Huang et al. 2016): drop a sample's residual branch with probability p."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(1.0 - self.p)
        return x * keep / (1.0 - self.p)


class ShiftedWindowAttention(nn.Module):
    """W-MSA / SW-MSA (Liu et al. 2021, §3.2): multi-head self-attention inside each window, with a
    learned relative position bias and, for shifted blocks, a cyclic shift and the region mask."""

    def __init__(self, dim: int, heads: int, window: int, shift: int, dropout: float = 0.0,
                 attention_dropout: float = 0.0) -> None:
        super().__init__()
        self.heads, self.window, self.shift = heads, window, shift
        self.attention_dropout = attention_dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(dropout)
        # B̂ in eq. 4: one bias per head for each of the (2w−1)² relative offsets
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, heads))
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)
        # derived from the window size, so not saved with the weights
        self.register_buffer("relative_position_index", relative_position_index(window), persistent=False)
        self._masks: dict[tuple[int, int, int, int, str], Tensor] = {}

    def relative_position_bias(self) -> Tensor:
        """(heads, N, N): the bias table looked up with the relative position index."""
        N = self.window * self.window
        bias = self.relative_position_bias_table[self.relative_position_index.flatten()]  # (N·N, heads)
        return bias.view(N, N, -1).permute(2, 0, 1)

    def effective_shift(self, Hp: int, Wp: int) -> tuple[int, int]:
        """No shift along a side the window already covers (as torchvision: nothing to connect)."""
        return (0 if self.window >= Hp else self.shift, 0 if self.window >= Wp else self.shift)

    def _mask(self, Hp: int, Wp: int, shift: tuple[int, int], device: torch.device) -> Tensor:
        key = (Hp, Wp, *shift, str(device))
        if key not in self._masks:
            self._masks[key] = shifted_window_mask(Hp, Wp, self.window, shift).to(device)
        return self._masks[key]

    def forward(self, x: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None, int]:
        """x (B, H, W, C) -> (out (B, H, W, C), weights (B, nW, heads, N, N) or None, shift used)."""
        B, H, W, C = x.shape
        w = self.window
        # pad right/bottom with zeros to multiples of the window (torchvision does the same)
        x = F.pad(x, (0, 0, 0, (w - W % w) % w, 0, (w - H % w) % w))
        Hp, Wp = x.shape[1], x.shape[2]
        shift = self.effective_shift(Hp, Wp)
        if any(shift):
            x = torch.roll(x, shifts=(-shift[0], -shift[1]), dims=(1, 2))  # cyclic shift, Fig. 4
        n_windows = (Hp // w) * (Wp // w)
        tokens = window_partition(x, w).reshape(B, n_windows, w * w, C)  # (B, nW, N, C)
        qkv = self.qkv(tokens).reshape(B, n_windows, w * w, 3, self.heads, C // self.heads)
        q, k, v = qkv.permute(3, 0, 1, 4, 2, 5)  # each (B, nW, heads, N, d)

        # everything added to QKᵀ/√d before the softmax: relative position bias (eq. 4) + region mask
        bias = self.relative_position_bias().unsqueeze(0)  # (1, heads, N, N)
        if any(shift):
            bias = bias + self._mask(Hp, Wp, shift, x.device).unsqueeze(1)  # (nW, heads, N, N)
        # the kernels want 4-D (batch, heads, N, d): fold the windows into the batch, one bias per window and image
        bias = bias.to(q.dtype)
        if bias.shape[0] > 1:
            bias = bias.expand(B, -1, -1, -1, -1).reshape(B * n_windows, self.heads, w * w, w * w)
        q4, k4, v4 = (t.reshape(B * n_windows, self.heads, w * w, -1) for t in (q, k, v))
        out, weights = attend(q4, k4, v4, bias=bias, need_weights=need_weights,
                              dropout=self.attention_dropout if self.training else 0.0)
        out = out.view(B, n_windows, self.heads, w * w, -1)
        if weights is not None:  # (B, nW, heads, N, N)
            weights = weights.view(B, n_windows, self.heads, w * w, w * w)
        out = out.transpose(2, 3).reshape(B * n_windows, w, w, C)  # heads back into channels
        out = self.proj_drop(self.proj(out))
        out = window_reverse(out, w, Hp, Wp)  # (B, Hp, Wp, C)
        if any(shift):
            out = torch.roll(out, shifts=shift, dims=(1, 2))
        used = max(shift)  # the models' grids are square, so both sides shift alike
        return out[:, :H, :W, :].contiguous(), weights, used


class SwinBlock(nn.Module):
    """Pre-norm Swin block (Liu et al. 2021, eq. 3): x + (S)W-MSA(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, dim: int, heads: int, window: int, shift: int, cfg: SwinConfig, drop_path: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=cfg.norm_eps)
        self.attn = ShiftedWindowAttention(dim, heads, window, shift, cfg.dropout, cfg.attention_dropout)
        self.drop_path = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=cfg.norm_eps)
        hidden = int(dim * cfg.mlp_ratio)
        # indices 0 and 3 hold the Linear layers, as in torchvision's MLP
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(cfg.dropout),
                                 nn.Linear(hidden, dim), nn.Dropout(cfg.dropout))

    def forward(self, x: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None, int]:
        a, weights, shift = self.attn(self.norm1(x), need_weights)  # x: (B, H, W, C)
        x = x + self.drop_path(a)
        x = x + self.drop_path(self.mlp(self.norm2(x)))
        return x, weights, shift


class PatchMerging(nn.Module):
    """Concatenate each 2×2 group of neighbouring tokens (4C) and project to 2C (Liu et al. 2021, §3.1).
    An odd side is padded with zeros first, as torchvision does."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim, eps=eps)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        H, W = x.shape[1], x.shape[2]
        x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))  # (B, H', W', C), even sides
        # order of the four neighbours as in the reference code: (0,0), (1,0), (0,1), (1,1)
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], dim=-1)
        return self.reduction(self.norm(x))  # (B, H'/2, W'/2, 2C)


class BlockAttention(NamedTuple):
    """Window attention of one block as returned by ``Swin.forward(..., need_weights=True)``."""

    stage: int
    block: int
    weights: Tensor  # (B, nW, heads, N, N)
    window: int
    shift: int  # shift actually applied (0 for regular blocks and where the window covers the grid)
    grid: tuple[int, int]  # token grid (H, W) of the stage, before padding to the window
    patch: int  # input pixels per token side at this stage


# ------------------------------------------------------------------------------------------------ model
class Swin(nn.Module):
    """Patch embedding -> stages of Swin blocks with patch merging between them -> LayerNorm ->
    global average pool -> linear classifier."""

    def __init__(self, config: SwinConfig, labels: list[str] | None = None) -> None:
        super().__init__()
        self.config = cfg = config
        self.labels = list(labels) if labels is not None else [str(i) for i in range(cfg.num_classes)]
        # patch partition + linear embedding as one strided convolution, then LayerNorm (as torchvision)
        self.patch_embed = nn.Conv2d(cfg.in_channels, cfg.embed_dim, kernel_size=cfg.patch, stride=cfg.patch)
        self.patch_norm = nn.LayerNorm(cfg.embed_dim, eps=cfg.norm_eps)
        total, done = sum(cfg.depths), 0
        self.stages = nn.ModuleList()
        self.merges = nn.ModuleList()
        dim = cfg.embed_dim
        for s, (depth, heads) in enumerate(zip(cfg.depths, cfg.heads)):
            blocks = nn.ModuleList()
            for b in range(depth):
                rate = cfg.drop_path * done / max(total - 1, 1)
                shift = 0 if b % 2 == 0 else cfg.shift  # W-MSA, then SW-MSA (Fig. 3b)
                blocks.append(SwinBlock(dim, heads, cfg.window, shift, cfg, rate))
                done += 1
            self.stages.append(blocks)
            if s < len(cfg.depths) - 1:
                self.merges.append(PatchMerging(dim, cfg.norm_eps))
                dim *= 2
        self.norm = nn.LayerNorm(dim, eps=cfg.norm_eps)
        self.head = nn.Linear(dim, cfg.num_classes)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    @property
    def grid(self) -> tuple[int, int]:
        """Token grid (rows, cols) of stage 1."""
        side = self.config.image_size // self.config.patch
        return side, side

    def blocks(self) -> list[SwinBlock]:
        """Every block in order (stage by stage), as ``ImageResult.windows`` lists their attention."""
        return [block for stage in self.stages for block in stage]

    def relative_position_bias_tables(self) -> list[np.ndarray]:
        """The learned bias B̂ of every block, as (heads, 2w−1, 2w−1) float32: entry [h, Δrow + w−1,
        Δcol + w−1] is what head h adds to the score of a query and key whose offset, query − key, is
        (Δrow, Δcol) tokens (the index of ``relative_position_index``)."""
        side = 2 * self.config.window - 1
        return [b.attn.relative_position_bias_table.detach().float().cpu().numpy().T.reshape(-1, side, side)
                for b in self.blocks()]

    def forward(self, x: Tensor, need_weights: bool = False) -> Tensor | tuple[Tensor, list[BlockAttention]]:
        """x (B, C, H, W) normalised image -> logits (B, classes); with ``need_weights`` also the window
        attention of every block (explicit softmax), otherwise fused attention."""
        features, attention = self.forward_features(x, need_weights)
        logits = self.forward_head(features)
        return (logits, attention) if need_weights else logits

    def forward_features(self, x: Tensor, need_weights: bool = False) -> tuple[Tensor, list[BlockAttention]]:
        """x (B, C, H, W) -> (the final feature map (B, H/p/2^(S-1), W/p/2^(S-1), C) after the final LayerNorm; the
        window attention of every block, empty unless ``need_weights``). The head is apart (``forward_head``)."""
        cfg = self.config
        x = x.to(self.patch_embed.weight.dtype)  # the weights' dtype (ATLAS_DTYPE); differentiable, for attribution
        x = self.patch_norm(self.patch_embed(x).permute(0, 2, 3, 1))  # (B, H/p, W/p, C)
        attention: list[BlockAttention] = []
        for s, blocks in enumerate(self.stages):
            grid = (x.shape[1], x.shape[2])
            for b, block in enumerate(blocks):
                x, weights, shift = block(x, need_weights)
                if need_weights:
                    attention.append(BlockAttention(s, b, weights, cfg.window, shift, grid, cfg.patch * 2**s))
            if s < len(self.merges):
                x = self.merges[s](x)
        return self.norm(x), attention

    def pool(self, features: Tensor) -> Tensor:
        """The features the head reads, (B, C): the global average pool of the final feature map."""
        return features.mean(dim=(1, 2))

    def forward_head(self, features: Tensor) -> Tensor:
        """Logits (B, classes) from the final feature map."""
        return self.head(self.pool(features))

    @torch.no_grad()
    def classify(self, image: ImageInput) -> ImageResult:
        """Any image -> ImageResult with class probabilities and one WindowAttention per block."""
        cfg = self.config
        prepared = prepare(image, cfg.input, resize=cfg.resize, crop=cfg.image_size, interpolation=cfg.interpolation,
                           processor=cfg.processor)
        device = next(self.parameters()).device
        was_training = self.training
        self.eval()
        features, attention = self.forward_features(prepared.tensor.to(device), need_weights=True)
        logits, pooled = self.forward_head(features)[0], self.pool(features)[0]
        self.train(was_training)
        windows = [
            WindowAttention(stage=a.stage, block=a.block, weights=a.weights[0].float().cpu().numpy(),
                            window=a.window, shift=a.shift, grid=a.grid, patch=a.patch)
            for a in attention
        ]
        return ImageResult(image=prepared.shown, labels=list(self.labels), grid=self.grid, patch=cfg.patch,
                           windows=windows, notice=prepared.notice, tensor=prepared.tensor,
                           **calibrated(self, logits, pooled, prepared.shown))
