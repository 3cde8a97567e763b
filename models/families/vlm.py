"""A small vision-language model: a ViT tower, a projector and a LLaMA-recipe decoder over [image tokens, text].

The layout of LLaVA (Liu et al. 2023, "Visual Instruction Tuning"; the two-layer GELU projector of LLaVA-1.5, Liu et
al. 2024), at the size of the project's own models:

- the vision tower is a ViT without a class token (Dosovitskiy et al. 2021, eq. 1–3): the grey image cut into P×P
  patches, each linearly embedded (a strided convolution), learned position embeddings, pre-norm encoder blocks
  (``models.families.vit.EncoderBlock``, attention through ``models.blocks.attention``) whose attention is local (a
  patch sees its neighbours within ``vision_window``, as a convolution's receptive field grows), a final LayerNorm;
- the projector maps each patch token into the decoder's width (Linear, GELU, Linear);
- the decoder is ``models.families.gpt``'s LLaMA recipe (RMSNorm, RoPE, SwiGLU) whose blocks read the sequence
  [image tokens (rows·cols, row-major), <s>, prompt words, answer words]: causal attention throughout, RoPE
  positions counting the image tokens first, as LLaVA lays them out.

``VLM.describe(image, text, max_new_tokens)`` answers greedily (a KV cache per layer) and returns a
``models.outputs.DescribeResult``: the ids the decoder saw (``<image>`` once per image token, then the prompt,
then the new tokens), their labels, the decoder's attention over all of them (layers, heads, T, T), the indices of
the image tokens and for each the pixels it came from (tile, row, column and its box on the image), and the tower's
own attention. ``VLM.relevance`` gives gradient × input on the image-token embeddings (Simonyan et al. 2014;
Shrikumar et al. 2017) for chosen positions and target tokens: the faithful view beside raw attention.

Trained by ``python -m train.vlm`` on scenes of Fashion-MNIST items (train/scenes.py); its grounding is measured by
``bench/grounding.py`` (the pointing game, Zhang et al. 2018).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.blocks.attention import KVCache
from models.blocks.loop import candidates
from models.blocks.positional import sinusoidal_table
from models.families.gpt import GPT, GPTConfig
from models.families.vit import EncoderBlock, ViTConfig
from models.inputs.images import fashion_array, scene_notice
from models.outputs import DescribeResult, GenerationStep


@dataclass
class VLMConfig:
    image_size: int = 64  # canvas side in pixels (square, grey): the composed Fashion-MNIST scenes
    patch: int = 8  # patch side: 64 / 8 = 8×8 = 64 image tokens
    pixel_mean: float = 0.1  # the scenes' mean pixel (of 1), subtracted before the tower
    pixel_std: float = 0.25  # and their spread, divided by
    vision_dim: int = 96  # the tower's token width
    vision_depth: int = 3  # the tower's encoder blocks
    vision_heads: int = 4  # its heads per block (head size 24)
    vision_mlp: int = 192  # its MLP's hidden width
    vision_window: int = 1  # a patch attends to patches at most this many rows and columns away (0: all): each image
    # token stays about its own neighbourhood (5×5 patches after two blocks), so where the decoder looks is where the
    # evidence is; an item spans at most 4×4 patches
    vocab_size: int = 34  # the word-level vocabulary (train/scenes.py VOCAB)
    max_len: int = 128  # decoder positions: the image tokens, then the text
    d_model: int = 128  # the decoder's residual width
    n_layers: int = 4  # decoder blocks
    n_heads: int = 4  # decoder heads (head size 32)
    dropout: float = 0.0  # residual and attention dropout while training
    pad_id: int = 0  # <pad>
    bos_id: int = 1  # <s>, first of the text
    eos_id: int = 2  # </s>: generation stops after it
    image_id: int = 4  # <image>: the id each image token carries in ``ids``

    @property
    def grid(self) -> int:
        """Patches per side."""
        return self.image_size // self.patch

    @property
    def image_tokens(self) -> int:
        return self.grid * self.grid

    def vision(self) -> ViTConfig:
        """The tower's blocks as ViT's config describes them."""
        return ViTConfig(image_size=self.image_size, patch=self.patch, dim=self.vision_dim, depth=self.vision_depth,
                         heads=self.vision_heads, mlp_dim=self.vision_mlp, dropout=self.dropout)

    def decoder(self) -> GPTConfig:
        """The decoder: the LLaMA recipe, tied embeddings."""
        return GPTConfig(recipe="llama", vocab_size=self.vocab_size, max_len=self.max_len, d_model=self.d_model,
                         n_layers=self.n_layers, n_heads=self.n_heads, dropout=self.dropout, bos_id=self.bos_id,
                         eos_id=self.eos_id, pad_id=self.pad_id)


@dataclass
class VLMForward:
    logits: Tensor  # (B, T, V) over the whole sequence, image positions included
    attention: list[Tensor]  # per decoder layer (B, H, T, S), with need_weights
    vision_attention: list[Tensor]  # per tower block (B, H, N, N), with need_weights


class VLM(nn.Module):
    """Vision tower -> projector -> decoder over [image tokens, text]."""

    def __init__(self, config: VLMConfig, tokenizer: Any | None = None) -> None:
        super().__init__()
        self.config = c = config
        if c.image_size % c.patch:
            raise ValueError(f"image_size {c.image_size} is not a multiple of patch {c.patch}")
        if c.image_tokens >= c.max_len:
            raise ValueError(f"{c.image_tokens} image tokens leave no room for text in {c.max_len} positions")
        self.tokenizer = tokenizer  # models.inputs.tokenizer.JsonTokenizer; set by models.load
        self.labels: list[str] = []
        self.text: dict[str, Any] = {}
        vc = c.vision()
        self.patch_embed = nn.Conv2d(1, c.vision_dim, kernel_size=c.patch, stride=c.patch)
        # learned, started from 2-D sine-cosine embeddings (half the width for the row, half for the column; MAE, He et
        # al. 2022), so each image token says where it is from the first step: the decoder finds "top left" by content
        self.vision_pos = nn.Parameter(grid_positions(c.grid, c.vision_dim)[None])
        self.vision_blocks = nn.ModuleList(EncoderBlock(vc) for _ in range(c.vision_depth))
        self.vision_norm = nn.LayerNorm(c.vision_dim, eps=vc.norm_eps)
        self.register_buffer("vision_mask", local_mask(c.grid, c.vision_window), persistent=False)  # (N, N)
        self.projector = nn.Sequential(nn.Linear(c.vision_dim, c.d_model), nn.GELU(), nn.Linear(c.d_model, c.d_model))
        self.lm = GPT(c.decoder())
        for m in (*self.vision_blocks, self.projector):
            m.apply(_init)

    # ------------------------------------------------------------------------------------------ forward
    def pixels(self, images: Tensor) -> Tensor:
        """uint8 or [0, 1] float images (B, H, W) or (B, 1, H, W) -> the tower's normalised input (B, 1, H, W)."""
        dtype = self.patch_embed.weight.dtype
        x = images.to(dtype) / 255.0 if images.dtype == torch.uint8 else images.to(dtype)
        if x.dim() == 3:
            x = x[:, None]
        return (x - self.config.pixel_mean) / self.config.pixel_std

    def encode_image(self, images: Tensor, need_weights: bool = False) -> tuple[Tensor, list[Tensor]]:
        """images (B, H, W) -> (image-token embeddings in the decoder's width (B, N, D), tower attention per
        block (B, H, N, N) with need_weights)."""
        return self._tower(self.pixels(images), need_weights)

    def decode(self, x: Tensor, caches: list[KVCache] | None = None, need_weights: bool = False
               ) -> tuple[Tensor, list[Tensor]]:
        """Embeddings (B, T, D) after any positions already in ``caches`` -> (logits (B, T, V), attention per layer
        (B, H, T, S)): the decoder's blocks as ``GPT.forward`` runs them, from embeddings instead of ids."""
        lm, start, t = self.lm, (caches[0].length if caches else 0), x.size(1)
        if start + t > self.config.max_len:
            raise ValueError(f"{start + t} positions exceed the model's {self.config.max_len}")
        angles = lm.angles[start:start + t]
        x = lm.drop(x)
        attention = []
        for i, block in enumerate(lm.blocks):
            x, w = block(x, angles, caches[i] if caches else None, need_weights, None)
            if w is not None:
                attention.append(w)
        return lm.logits_of(x), attention

    def forward(self, images: Tensor, ids: Tensor, need_weights: bool = False,
                image_embeds: Tensor | None = None) -> VLMForward:
        """images (B, H, W), text ids (B, T) -> logits over [image tokens, text] (B, N + T, V). ``image_embeds``
        (B, N, D): the image tokens given directly (relevance differentiates with respect to them)."""
        vision: list[Tensor] = []
        if image_embeds is None:
            image_embeds, vision = self.encode_image(images, need_weights)
        x = torch.cat([image_embeds, self.lm.embed(ids)], dim=1)
        logits, attention = self.decode(x, need_weights=need_weights)
        return VLMForward(logits, attention, vision)

    # ----------------------------------------------------------------------------------------- entry points
    def image_array(self, image: Any) -> tuple[np.ndarray, str]:
        """Any image (PIL, numpy array, encoded bytes or a file the app was given) -> (uint8 (S, S), S = image_size,
        notice): grey, inverted when its background is light (the model knows dark canvases only), fitted into S×S
        keeping its aspect ratio and padded with black (``models.inputs.images.fashion_array``)."""
        return fashion_array(image, self.config.image_size)

    def encode_text(self, text: str) -> tuple[list[int], list[str]]:
        """<s> and the prompt's words (the checkpoint's lower-casing and punctuation split first), no </s>."""
        if self.tokenizer is None:
            raise ValueError("this VLM has no tokenizer: load it with models.load")
        room = self.config.max_len - self.config.image_tokens - 1
        enc = self.tokenizer.encode(text, add_special=False, max_tokens=room)
        return [self.config.bos_id, *enc.ids], [self.piece(self.config.bos_id), *enc.pieces]

    def piece(self, i: int) -> str:
        return self.tokenizer.id_to_piece(int(i)) if self.tokenizer is not None else str(int(i))

    def image_layout(self) -> tuple[np.ndarray, np.ndarray]:
        """(cells (N, 3): tile, row, column of each image token; boxes (N, 4): its pixels x0, y0, x1, y1 on the
        model's image, ends exclusive). One tile, row-major, as the patch embedding flattens it."""
        c, g = self.config, self.config.grid
        rows, cols = np.divmod(np.arange(g * g), g)
        cells = np.stack([np.zeros_like(rows), rows, cols], axis=1)
        boxes = np.stack([cols * c.patch, rows * c.patch, (cols + 1) * c.patch, (rows + 1) * c.patch], axis=1)
        return cells.astype(np.int64), boxes.astype(np.int64)

    @torch.no_grad()
    def describe(self, image: Any, text: str = "describe the image .", max_new_tokens: int = 32) -> DescribeResult:
        """Answer ``text`` about ``image`` greedily (at most ``max_new_tokens``, stopping after </s>), with the
        decoder's attention over the whole sequence and the tower's."""
        if max_new_tokens < 0:
            raise ValueError("max_new_tokens must be at least 0")
        c = self.config
        pixels, converted = self.image_array(image)
        prompt, pieces = self.encode_text(text)
        n = c.image_tokens
        room = c.max_len - n - len(prompt)
        notice = " ".join(filter(None, [converted, f"At most {room} new tokens fit the model's {c.max_len} positions."
                                        if max_new_tokens > room else ""]))
        unusual = scene_notice(pixels)  # a photo or one big item: not a scene of the kind it was trained on
        notice = "\n\n".join(filter(None, [unusual, notice]))
        max_new_tokens = min(max_new_tokens, room)
        device = next(self.parameters()).device
        img = torch.from_numpy(pixels)[None].to(device)
        embeds, vision = self.encode_image(img, need_weights=True)
        caches = [KVCache() for _ in self.lm.blocks]
        x = torch.cat([embeds, self.lm.embed(torch.tensor([prompt], device=device))], dim=1)
        logits, attention = self.decode(x, caches, need_weights=True)
        rows = [[w[0].float()] for w in attention]  # per layer: blocks of rows (H, t, S)
        new: list[int] = []
        steps: list[GenerationStep] = []
        for _ in range(max_new_tokens):
            token, step = candidates(F.softmax(logits[0, -1].float(), dim=-1), self.piece)
            steps.append(step)
            new.append(token)
            if token == c.eos_id or len(new) == max_new_tokens:
                break
            logits, attention = self.decode(self.lm.embed(torch.tensor([[token]], device=device)), caches,
                                            need_weights=True)
            for r, w in zip(rows, attention):
                r.append(w[0].float())
        if new:  # the last new token's own row (</s> too: the decoder saw it), its logits unused
            _, attention = self.decode(self.lm.embed(torch.tensor([[new[-1]]], device=device)), caches,
                                       need_weights=True)
            for r, w in zip(rows, attention):
                r.append(w[0].float())
        t = n + len(prompt) + len(new)
        weights = np.zeros((c.n_layers, c.n_heads, t, t), np.float32)
        for layer, blocks in enumerate(rows):
            i = 0
            for w in blocks:  # (H, rows, S): causal, so each block fills the left S columns of its rows
                weights[layer, :, i:i + w.size(1), :w.size(2)] = w.cpu().numpy()
                i += w.size(1)
        cells, boxes = self.image_layout()
        ids = [c.image_id] * n + prompt + new
        labels = [f"<image r{r}c{col}>" for _, r, col in cells] + pieces + [self.piece(i) for i in new]
        tokens_text = [i for i in new if i not in (c.eos_id, c.pad_id, c.bos_id)]
        return DescribeResult(
            text=self.tokenizer.decode(tokens_text) if self.tokenizer is not None else " ".join(map(str, tokens_text)),
            ids=ids, tokens=labels, prompt_len=n + len(prompt), attention=weights,
            image_positions=np.arange(n, dtype=np.int64), image_cells=cells, image_boxes=boxes, image=pixels,
            grid=(c.grid, c.grid), vision_attention=torch.stack([w[0] for w in vision]).float().cpu().numpy(),
            steps=steps, notice=notice)

    def relevance(self, image: Any, ids: list[int], positions: list[int], targets: list[int],
                  at: str = "pixels") -> np.ndarray:
        """Gradient × input (Shrikumar et al. 2017) of log p(target | sequence up to position), per image token, for
        each (position, target) pair. ``at="pixels"``: on the pixels, relative to black (the canvas's background),
        summed over each token's patch: Σ_pixels ∂ log p / ∂x · (x − x_black), so a black patch gets exactly 0 and
        what the tower mixes across patches is traced back to where it came from. ``at="tokens"``: on the image-token
        embeddings the decoder reads, Σ_d e_{i,d} · ∂ log p / ∂e_{i,d}. ``ids`` are the text ids after the image
        tokens (<s> first); ``positions`` index the whole sequence (image tokens first). Returns
        (len(positions), N) float32; one backward pass per position (the model is small)."""
        if at not in ("pixels", "tokens"):
            raise ValueError(f"relevance is taken at 'pixels' or 'tokens', not {at!r}")
        c = self.config
        device = next(self.parameters()).device
        img = torch.from_numpy(self.image_array(image)[0])[None].to(device)
        with torch.no_grad():
            embeds, _ = self.encode_image(img)
            pixels = self.pixels(img)
        black = self.pixels(torch.zeros_like(img))
        out = np.zeros((len(positions), c.image_tokens), np.float32)
        text = torch.tensor([list(ids)], device=device)
        for k, (p, y) in enumerate(zip(positions, targets)):
            if at == "tokens":
                x = embeds.detach().clone().requires_grad_(True)
                logits = self.forward(img, text, image_embeds=x).logits
            else:
                x = pixels.detach().clone().requires_grad_(True)
                logits = self.forward(img, text, image_embeds=self._tower(x)[0]).logits
            logp = F.log_softmax(logits[0, p].double(), dim=-1)[int(y)]
            (grad,) = torch.autograd.grad(logp, x)
            if at == "tokens":
                r = (grad * x).sum(-1)[0]
            else:  # (1, 1, H, W) -> the sum over each P×P patch, row-major as the tokens
                r = F.avg_pool2d(grad * (x - black), c.patch).flatten() * c.patch ** 2
            out[k] = r.detach().float().cpu().numpy()
        return out

    def chat_prompt(self, question: str) -> str:
        """The prompt as the model takes it for a user's question: the checkpoint has no chat template (it was
        trained on the bare questions of train/scenes.py), and its image tokens always come first."""
        return question

    def image_relevance(self, r: DescribeResult, queries: list[int]) -> np.ndarray:
        """(len(queries), N): for each query position q of ``r``, gradient × input of log p(r.ids[q + 1]) on the
        pixels, summed per image token (``relevance``, ``at="pixels"``, the pointing game's better method)."""
        n = self.config.image_tokens
        return self.relevance(r.image, r.ids[n:], list(queries), [r.ids[q + 1] for q in queries])

    @torch.no_grad()
    def image_lens(self, r: DescribeResult) -> tuple[np.ndarray, np.ndarray]:
        """The logit lens on the image tokens (nostalgebraist 2020; on image tokens, Neo et al. 2024): the top token
        of the final norm and unembedding applied to each image token's residual stream after the embedding (row 0)
        and after each decoder layer, with its probability: ids (L + 1, N) int, probs (L + 1, N) float32. The image
        tokens come first and attention is causal, so their residuals depend on the image alone."""
        device = next(self.parameters()).device
        x, _ = self.encode_image(torch.from_numpy(self.image_array(r.image)[0])[None].to(device))
        angles = self.lm.angles[:x.size(1)]
        states = [x]
        for block in self.lm.blocks:
            x, _ = block(x, angles, None, False, None)
            states.append(x)
        probs = F.softmax(self.lm.logits_of(torch.cat(states)).float(), dim=-1)  # (L + 1, N, V)
        top = probs.max(dim=-1)
        return top.indices.cpu().numpy(), top.values.cpu().numpy().astype(np.float32)

    def _tower(self, pixels: Tensor, need_weights: bool = False) -> tuple[Tensor, list[Tensor]]:
        """Normalised pixels (B, 1, H, W) -> (image-token embeddings (B, N, D), tower attention per block). ViT's
        encoder block (Dosovitskiy et al. 2021, eq. 2–3) with the neighbourhood mask."""
        x = self.patch_embed(pixels).flatten(2).transpose(1, 2) + self.vision_pos  # (B, N, Dv), row-major
        mask = None if self.config.vision_window == 0 else self.vision_mask
        attention = []
        for block in self.vision_blocks:
            a, w = block.attn(block.ln_1(x), mask=mask, need_weights=need_weights)  # w: (B, H, N, N)
            x = x + block.drop(a)
            x = x + block.mlp(block.ln_2(x))
            if w is not None:
                attention.append(w)
        return self.projector(self.vision_norm(x)), attention


def grid_positions(grid: int, dim: int) -> Tensor:
    """(grid², dim) 2-D sine-cosine position embeddings, row-major: the first half of the width the row's
    sinusoidal table (Vaswani et al. 2017, §3.5), the second half the column's."""
    table = sinusoidal_table(grid, dim // 2)  # (grid, dim / 2)
    rows, cols = torch.div(torch.arange(grid * grid), grid, rounding_mode="floor"), torch.arange(grid * grid) % grid
    return torch.cat([table[rows], table[cols]], dim=1)


def local_mask(grid: int, window: int) -> Tensor:
    """(N, N) bool over a grid×grid of patches, row-major: True where the key patch is at most ``window`` rows and
    columns from the query patch (window 0: everywhere)."""
    rows, cols = torch.div(torch.arange(grid * grid), grid, rounding_mode="floor"), torch.arange(grid * grid) % grid
    if window == 0:
        return torch.ones(grid * grid, grid * grid, dtype=torch.bool)
    return ((rows[:, None] - rows[None]).abs() <= window) & ((cols[:, None] - cols[None]).abs() <= window)


def _init(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
