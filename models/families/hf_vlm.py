"""Hugging Face vision-language models: LLaVA (``llava``), Idefics3 / SmolVLM v1 (``idefics3``) and PaliGemma
(``paligemma``) (issue 63).

Each is a vision tower feeding a decoder (docs/ARCHITECTURE.md §12):

- the tower (``Tower``) is a ViT encoder as CLIP (Radford et al. 2021: a class token, a LayerNorm before the blocks,
  no patch bias, quick GELU) or SigLIP (Zhai et al. 2023: no class token, a patch bias, tanh GELU, a final LayerNorm)
  build it: pre-norm blocks (LayerNorm, multi-head attention through ``models.blocks.attention``, LayerNorm, an MLP);
- LLaVA (Liu et al. 2023; the two-layer projector of LLaVA-1.5, Liu et al. 2024) reads the tower's hidden state at
  ``vision_feature_layer`` (a list: those layers concatenated), drops CLIP's class token when
  ``vision_feature_select_strategy`` is "default", and maps each token through Linear, activation, Linear;
- Idefics3 (Laurençon et al. 2024; SmolVLM, Marafioti et al. 2025) splits the image into tiles plus a global view,
  reads each through the tower (its final LayerNorm applied), merges each s × s block of patch tokens into one token
  (the pixel shuffle: s² · width features) and projects it linearly;
- PaliGemma (Beyer et al. 2024) resizes the image to the tower's square (no crop), reads SigLIP's last hidden state
  through its final LayerNorm and maps each token through one Linear; its Gemma language model is a prefix LM: the
  image tokens and the prompt attend to one another both ways, the generated tokens causally
  (``DecoderSpec.prefix_lm``, which every fast runner refuses). transformers 5.24 scatters the projector's output
  unscaled into the embeddings after Gemma's √d scaling of the text tokens (the 1/√d of older versions is gone), and
  counts positions from 1, which changes no RoPE score (they depend on differences of positions only);
- the language model is ``models.families.gpt.GPT``, read by the registry's reader of the text config's model_type
  (LLaMA, Qwen2, Mistral; Gemma for PaliGemma); the image tokens' embeddings replace those of the placeholder ids
  before its first block (``models.blocks.attention.LayerEdit``), as transformers' ``masked_scatter`` does.

The prompt is laid out as the folder's processor lays it out: LLaVA's ``<image>`` repeated once per image token;
Idefics3's per tile ``<fake_token_around_image><row_r_col_c>`` and the tile's tokens, a newline after each row of
tiles, then ``\\n<fake_token_around_image><global-img>``, the global view's tokens and ``<fake_token_around_image>``;
PaliGemma's the text up to ``<image>`` (repeated once per image token), ``<bos>``, the rest of the text and ``\\n``,
tokenised without the tokenizer's own specials.
The images are prepared as the folder's image processor prepares them (models/inputs/images.py's torchvision v2
operations on the uint8 image, as transformers' torchvision image processors run them).

Each model answers ``describe(image, text, max_new_tokens)`` -> ``models.outputs.DescribeResult``, ``chat_prompt``,
``image_relevance`` (gradient × input on the image-token embeddings) and ``image_lens`` (the logit lens on the image
tokens). Transformers is never imported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models import limits
from models.blocks.attention import Intervention, KVCache, LayerEdit, MultiHeadAttention
from models.blocks.layers import ACTIVATIONS
from models.blocks.loop import candidates
from models.outputs import DescribeResult, GenerationStep

IMAGE = "<image>"


@dataclass
class TowerConfig:
    """A CLIP- or SigLIP-style vision tower."""

    image_size: int = 224  # the side (pixels) of one image or tile the tower reads
    patch: int = 16
    channels: int = 3
    dim: int = 768
    depth: int = 12
    heads: int = 12
    mlp_dim: int = 3072
    act: str = "gelu_tanh"  # an ACTIVATIONS name
    norm_eps: float = 1e-6
    class_token: bool = False  # CLIP: a learned class token first
    pre_norm: bool = False  # CLIP: a LayerNorm on the embeddings before the first block
    post_norm: bool = False  # SigLIP / Idefics3: a final LayerNorm (applied to the last block's output where read)
    patch_bias: bool = True  # CLIP's patch projection has none

    @property
    def grid(self) -> int:
        return self.image_size // self.patch


class TowerBlock(nn.Module):
    """Pre-norm encoder block: x + attn(LN x), then x + fc2(act(fc1(LN x)))."""

    def __init__(self, c: TowerConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.dim, eps=c.norm_eps)
        self.attn = MultiHeadAttention(c.dim, c.heads)
        self.ln_2 = nn.LayerNorm(c.dim, eps=c.norm_eps)
        self.fc1, self.fc2 = nn.Linear(c.dim, c.mlp_dim), nn.Linear(c.mlp_dim, c.dim)
        self.act = ACTIVATIONS[c.act]

    def forward(self, x: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        a, w = self.attn(self.ln_1(x), need_weights=need_weights)
        x = x + a
        return x + self.fc2(self.act(self.fc1(self.ln_2(x)))), w


class Tower(nn.Module):
    """Patch embedding (+ class token) + learned positions -> blocks; every hidden state kept, as transformers'
    ``hidden_states``: [the embeddings (after CLIP's pre-norm), after block 1, ..., after the last block]."""

    def __init__(self, c: TowerConfig) -> None:
        super().__init__()
        self.config = c
        self.patch_embed = nn.Conv2d(c.channels, c.dim, kernel_size=c.patch, stride=c.patch, bias=c.patch_bias)
        self.class_token = nn.Parameter(torch.zeros(c.dim)) if c.class_token else None
        self.pos_embed = nn.Parameter(torch.zeros(c.grid * c.grid + int(c.class_token), c.dim))
        self.pre_norm = nn.LayerNorm(c.dim, eps=c.norm_eps) if c.pre_norm else None
        self.blocks = nn.ModuleList(TowerBlock(c) for _ in range(c.depth))
        self.post_norm = nn.LayerNorm(c.dim, eps=c.norm_eps) if c.post_norm else None

    @property
    def prefix(self) -> int:
        """Tokens before the patches (CLIP's class token)."""
        return int(self.class_token is not None)

    def forward(self, pixels: Tensor, need_weights: bool = False) -> tuple[list[Tensor], list[Tensor]]:
        """pixels (B, C, S, S) -> (hidden states, depth + 1 of (B, prefix + P, D); attention per block (B, H, ., .)
        with need_weights)."""
        x = self.patch_embed(pixels).flatten(2).transpose(1, 2)  # (B, P, D), row-major
        if self.class_token is not None:
            x = torch.cat([self.class_token.expand(x.size(0), 1, -1).to(x.dtype), x], dim=1)
        x = x + self.pos_embed.to(x.dtype)
        if self.pre_norm is not None:
            x = self.pre_norm(x)
        hidden, attention = [x], []
        for block in self.blocks:
            x, w = block(x, need_weights)
            hidden.append(x)
            if w is not None:
                attention.append(w)
        return hidden, attention


@dataclass
class VLMLayout:
    """One image as the model reads it: the tower's input tiles, the image shown, each image token's place."""

    pixels: Tensor  # (tiles, C, S, S) normalised
    image: np.ndarray  # uint8 (H, W, 3): what the model saw (LLaVA: after resize and crop; Idefics3: the resized
    # image the tiles are cut from, of which the global view is a smaller copy)
    cells: np.ndarray  # (N, 3) tile, row, column of each image token (row = col = -1: a class token, the whole tile)
    boxes: np.ndarray  # (N, 4) its pixels on ``image``: x0, y0, x1, y1, ends exclusive
    labels: list[str]  # a label per image token
    rows: int = 0  # Idefics3: tile rows and columns (0, 0: the global view alone)
    cols: int = 0
    notice: str = ""
    grid: tuple[int, int] = (0, 0)  # image-token rows, cols where they vary with the image (Qwen2.5-VL); (0, 0): the
    # family's fixed ``token_grid``
    vision_grid: tuple[int, int] = (0, 0)  # the tower's patch rows, cols where they vary; (0, 0): the tower's grid


@dataclass
class HFVLMConfig:
    """What the reader found in the folder (models/io/hf_vlm.py)."""

    kind: str  # "llava", "idefics3" or "paligemma"
    tower: TowerConfig
    image_token_id: int
    text_type: str  # the language model's model_type
    feature_layers: tuple[int, ...] = (-2,)  # LLaVA: the tower's hidden states read (concatenated)
    select: str = "default"  # LLaVA: "default" drops the class token, "full" keeps it
    projector_act: str = "gelu"
    scale_factor: int = 1  # Idefics3's pixel shuffle
    image_seq_len: int = 0  # image tokens per tile
    processor: dict[str, Any] = field(default_factory=dict)  # the image processor's settings
    chat_template: str = ""
    specials: dict[str, str] = field(default_factory=dict)  # bos_token, eos_token for the chat template
    eos_ids: tuple[int, ...] = ()
    # the language model's shape, as every family's config names it (the registry's tests read these)
    d_model: int = 0
    n_layers: int = 0
    n_heads: int = 0


class HFVLM(nn.Module):
    """A vision tower, a projector and the project's GPT; what LLaVA, Idefics3, PaliGemma and Qwen2.5-VL share."""

    placeholder = IMAGE  # the image token of the prompt, which the processor expands
    image_prompt = IMAGE  # what goes before a prompt that has no placeholder (Qwen2.5-VL: the placeholder in markers)
    tower_class: Any = Tower
    tokenizer_specials = True  # whether the tokenizer adds its own specials (PaliGemma's processor places <bos>)

    def __init__(self, config: HFVLMConfig, projector: nn.Module, lm: Any) -> None:
        super().__init__()
        config.d_model, config.n_layers, config.n_heads = lm.config.d_model, lm.config.n_layers, lm.config.n_heads
        self.config = config
        self.tower = self.tower_class(config.tower)
        self.projector = projector
        self.lm = lm
        self.tokenizer: Any = None  # a tokenizers.Tokenizer (models/io/hf_vlm.py)
        self._byte_level: bool | None = None  # whether its pieces spell bytes (read on first use)
        self.labels: list[str] = []
        self.text: dict[str, Any] = {}

    # ---------------------------------------------------------------------------------------- the family's parts
    def layout(self, image: Any) -> VLMLayout:  # pragma: no cover - each family's own
        raise NotImplementedError

    def relayout(self, seen: np.ndarray) -> VLMLayout:  # pragma: no cover
        raise NotImplementedError

    def expand(self, text: str, layout: VLMLayout) -> str:  # pragma: no cover
        raise NotImplementedError

    def features(self, pixels: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError  # pragma: no cover

    def fallback_prompt(self, question: str) -> str:  # pragma: no cover
        raise NotImplementedError

    def image_features(self, layout: VLMLayout, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """The image tokens (N, D) of a layout and, with need_weights, the tower's attention (``features``)."""
        device = next(self.parameters()).device
        return self.features(layout.pixels.to(device), need_weights=need_weights)

    def rope_positions(self, ids: list[int], layout: VLMLayout) -> Tensor | None:
        """The language model's position ids of ``ids`` where they are not 0..T−1 (Qwen2.5-VL's M-RoPE: (3, T));
        None: the plain ones."""
        return None

    # ------------------------------------------------------------------------------------------------ shared
    def piece(self, i: int) -> str:
        """Token i as people read it (byte-level pieces decoded, the raw piece on ``.raw``: models.inputs.tokenizer)."""
        from models.inputs.tokenizer import is_byte_level, readable_piece

        if self._byte_level is None:
            self._byte_level = is_byte_level(self.tokenizer)
        return readable_piece(self.tokenizer.id_to_token(int(i)) or f"<{int(i)}>", self._byte_level)

    def context_limit(self) -> int:
        return min(self.lm.config.max_len, limits.MAX_FULL_TOKENS)

    def encode(self, text: str, layout: VLMLayout) -> tuple[list[int], np.ndarray]:
        """The prompt's ids as the processor gives them (the placeholder expanded, the tokenizer's specials), and
        where the image tokens are."""
        mark = self.placeholder
        if text.count(mark) > 1:
            raise ValueError(f"the prompt must hold the image placeholder {mark} exactly once (it holds it "
                             f"{text.count(mark)} times): one image is read")
        ids = list(self.tokenizer.encode(self.expand(text, layout), add_special_tokens=self.tokenizer_specials).ids)
        positions = np.flatnonzero(np.asarray(ids) == self.config.image_token_id).astype(np.int64)
        if len(positions) != len(layout.cells):
            raise ValueError(f"the prompt holds {len(positions)} image tokens where the image gives "
                             f"{len(layout.cells)} (an {mark} in the text beside the placeholder?)")
        return ids, positions

    def embed(self, ids: list[int], positions: np.ndarray, features: Tensor) -> Intervention:
        """The edit that puts the image features (N, D) in place of the placeholders' embeddings at layer 0."""
        t = len(ids)
        values = torch.zeros(1, t, features.size(-1), dtype=features.dtype, device=features.device)
        index = torch.as_tensor(positions, device=features.device)
        values = values.index_put((torch.zeros_like(index), index), features)
        select = torch.zeros(1, t, dtype=torch.bool, device=features.device)
        select[0, index] = True
        return Intervention({0: LayerEdit(resid_values=values, resid_select=select)})

    @torch.no_grad()
    def describe(self, image: Any, text: str, max_new_tokens: int = 20) -> DescribeResult:
        """Answer ``text`` (with the image placeholder, as the folder's processor takes it) about ``image`` greedily
        (at most ``max_new_tokens``, stopping after an end-of-sequence id), with the language model's attention
        over the whole sequence (every layer) and the tower's, every block, of one tile: LLaVA's one image (CLIP's class
        token first: ``vision_prefix``), Idefics3's global view (the last tile: ``vision_tile``), over the tower's
        patches (``vision_grid``), before the pixel shuffle merges them."""
        if max_new_tokens < 0:
            raise ValueError("max_new_tokens must be at least 0")
        layout = self.layout(image)
        notice = [layout.notice]
        if self.placeholder not in text:  # the processor would refuse it; the image goes first, as chat templates do
            text = self.image_prompt + text
            notice.append(f"The prompt had no {self.placeholder}: the image was put before it.")
        ids, positions = self.encode(text, layout)
        limit = self.context_limit()
        if len(ids) >= limit:
            raise ValueError(f"the prompt with its {len(positions)} image tokens is {len(ids)} tokens, over the "
                             f"{limit} this model serves")
        if len(ids) + max_new_tokens > limit:
            notice.append(f"At most {limit - len(ids)} new tokens fit in {limit} positions.")
            max_new_tokens = limit - len(ids)
        device = next(self.parameters()).device
        features, vision = self.image_features(layout, need_weights=True)
        caches = [KVCache() for _ in self.lm.blocks]
        at = self.rope_positions(ids, layout)  # M-RoPE's (3, T), or None
        prefix = self.prefix(len(ids))
        if prefix:
            notice.append("The image and the prompt attend to one another both ways (a prefix LM, as PaliGemma "
                          "reads its prompt); the new words attend causally.")
        out = self.lm(torch.tensor([ids], device=device), caches, need_weights=True,
                      edit=self.embed(ids, positions, features), last_only=True,
                      positions=None if at is None else at.to(device), prefix=prefix)
        rows = [[w[0]] for w in out.attention]
        logits = out.logits
        new: list[int] = []
        steps: list[GenerationStep] = []
        eos = set(self.config.eos_ids)
        for k in range(max_new_tokens):
            token, step = candidates(F.softmax(logits[0, -1].float(), dim=-1), self.piece)
            steps.append(step)
            new.append(token)
            last = token in eos or k == max_new_tokens - 1
            at = self.rope_positions(ids + new, layout)  # the new token's (transformers' rope_deltas continue it)
            out = self.lm(torch.tensor([[token]], device=device), caches, need_weights=True, last_only=True,
                          positions=None if at is None else at[:, -1:].to(device), prefix=prefix)
            for r, w in zip(rows, out.attention):  # the new token's own row (the last one's logits unused)
                r.append(w[0])
            if last:
                break
            logits = out.logits
        all_ids = ids + new
        t = len(all_ids)
        weights = assemble(rows, t, torch.float16 if t > limits.LONG_TOKENS else torch.float32)
        labels = [self.piece(i) for i in all_ids]
        for p, label in zip(positions, layout.labels):
            labels[p] = label
        shown = [i for i in new if i not in eos]
        return DescribeResult(
            text=self.tokenizer.decode(shown, skip_special_tokens=True), ids=all_ids, tokens=labels,
            prompt_len=len(ids), attention=weights, image_positions=positions, image_cells=layout.cells,
            image_boxes=layout.boxes, image=layout.image,
            grid=layout.grid if layout.grid[0] else (self.token_grid, self.token_grid),
            vision_attention=vision.cpu().numpy() if vision is not None else np.zeros((0, 0, 0, 0), np.float32),
            steps=steps, notice=" ".join(filter(None, notice)), vision_prefix=self.tower.prefix,
            vision_grid=layout.vision_grid if layout.vision_grid[0] else (self.config.tower.grid,
                                                                         self.config.tower.grid),
            vision_tile=int(layout.cells[-1, 0]))

    def prefix(self, prompt_len: int) -> int:
        """The positions that attend both ways: a prefix LM's whole prompt (PaliGemma's processor marks every prompt
        token as prefix, token_type_ids 0), else none (causal)."""
        return prompt_len if self.lm.config.prefix_lm else 0

    @property
    def token_grid(self) -> int:
        """Image tokens per side of one tile."""
        return self.config.tower.grid // max(1, self.config.scale_factor)

    def chat_prompt(self, question: str) -> str:
        """The folder's chat template applied to one user turn (the image, then ``question``), the generation prompt
        added; the family's plain prompt where the folder has no template."""
        template = self.config.chat_template
        if not template:
            return self.fallback_prompt(question)
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
        try:
            return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                                    **self.config.specials)
        except TemplateError as err:
            raise ValueError(f"the folder's chat template fails: {err}") from None

    def _forward_seen(self, r: DescribeResult, keep_hidden: bool = False, grad: bool = False) -> tuple[Any, Tensor]:
        """The whole sequence ``r.ids`` through the model again, from the image ``r.image`` the model saw: (GPT's
        Forward, the image features (N, D), a leaf that requires grad when ``grad``)."""
        layout = self.relayout(np.asarray(r.image))
        device = next(self.parameters()).device
        with torch.no_grad():
            features, _ = self.image_features(layout)
        if len(features) != len(r.image_positions):
            raise ValueError(f"{len(r.image_positions)} image positions for {len(features)} image features")
        features = features.detach().clone().requires_grad_(grad)
        at = self.rope_positions(list(r.ids), layout)
        with torch.set_grad_enabled(grad):
            out = self.lm(torch.tensor([list(r.ids)], device=device), keep_hidden=keep_hidden,
                          edit=self.embed(list(r.ids), np.asarray(r.image_positions), features),
                          positions=None if at is None else at.to(device), prefix=self.prefix(r.prompt_len))
        return out, features

    def image_relevance(self, r: DescribeResult, queries: list[int]) -> np.ndarray:
        """Gradient × input on the image-token embeddings the language model reads (Shrikumar et al. 2017), of
        log p(r.ids[q + 1] | r.ids[:q + 1]) for each query position q: (len(queries), N) float32,
        Σ_d e_{i,d} · ∂ log p / ∂e_{i,d} for image token i."""
        t = len(r.ids)
        bad = [q for q in queries if not 0 <= int(q) < t - 1]
        if bad:
            raise ValueError(f"query positions {bad} have no next token (0 to {t - 2})")
        out, features = self._forward_seen(r, grad=True)
        logp = F.log_softmax(out.logits[0].double(), dim=-1)
        result = np.zeros((len(queries), len(features)), np.float32)
        for k, q in enumerate(queries):
            (g,) = torch.autograd.grad(logp[int(q), int(r.ids[int(q) + 1])], features, retain_graph=True)
            result[k] = (g * features).sum(-1).detach().float().cpu().numpy()
        return result

    @torch.no_grad()
    def tower_attention(self, r: DescribeResult, tile: int) -> np.ndarray:
        """The tower's attention, every block, over tile ``tile`` (``r.image_cells[:, 0]``) of the image the model
        saw: (blocks, heads, prefix + P, prefix + P), as ``describe`` gives it for ``r.vision_tile``."""
        layout = self.relayout(np.asarray(r.image))
        if not 0 <= int(tile) < len(layout.pixels):
            raise ValueError(f"tile {tile} is not one of the image's 0–{len(layout.pixels) - 1}")
        pixels = layout.pixels[int(tile):int(tile) + 1].to(next(self.parameters()).device)
        _, attention = self.tower(pixels, need_weights=True)
        return stack_weights(attention).float().cpu().numpy()

    @torch.no_grad()
    def image_lens(self, r: DescribeResult) -> tuple[np.ndarray, np.ndarray]:
        """The logit lens on the image tokens (nostalgebraist 2020; Neo et al. 2024): at each layer's residual stream
        (0 = the embeddings, L = after the last block), the top token of the final norm and the output projection.
        Returns (ids (L + 1, N) int64, probs (L + 1, N) float32)."""
        out, _ = self._forward_seen(r, keep_hidden=True)
        pos = torch.as_tensor(np.asarray(r.image_positions), device=out.logits.device)
        ids = np.zeros((len(out.hidden), len(pos)), np.int64)
        probs = np.zeros((len(out.hidden), len(pos)), np.float32)
        for layer, h in enumerate(out.hidden):
            p = F.softmax(self.lm.logits_of(h[0, pos]).float(), dim=-1)
            top = p.max(dim=-1)
            ids[layer], probs[layer] = top.indices.cpu().numpy(), top.values.cpu().numpy()
        return ids, probs


# ---------------------------------------------------------------------------------------------------- LLaVA
class LlavaProjector(nn.Module):
    def __init__(self, d_in: int, d_out: int, act: str, bias: bool = True) -> None:
        super().__init__()
        self.linear_1, self.linear_2 = nn.Linear(d_in, d_out, bias=bias), nn.Linear(d_out, d_out, bias=bias)
        self.act = ACTIVATIONS[act]

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class Llava(HFVLM):
    """LLaVA: one image resized and centre-cropped to the tower's side; its patch tokens (and the class token with
    "full") each become an image token."""

    def layout(self, image: Any) -> VLMLayout:
        from models.inputs.images import prepare_processor

        prepared = prepare_processor(image, self.config.processor)
        lay = self.relayout(prepared.shown)
        lay.notice = prepared.notice
        return lay

    def relayout(self, seen: np.ndarray) -> VLMLayout:
        c, spec = self.config.tower, self.config.processor
        s = c.image_size
        if seen.shape[:2] != (s, s):
            raise ValueError(f"the image the model saw is {seen.shape[1]}×{seen.shape[0]}, the tower reads {s}×{s}")
        pixels = normalise(torch.from_numpy(np.ascontiguousarray(seen)).permute(2, 0, 1), spec)[None]
        g, p = c.grid, c.patch
        rows, cols = np.divmod(np.arange(g * g), g)
        cells = np.stack([np.zeros_like(rows), rows, cols], 1)
        boxes = np.stack([cols * p, rows * p, (cols + 1) * p, (rows + 1) * p], 1)
        labels = [f"<image r{r}c{q}>" for r, q in zip(rows, cols)]
        if c.class_token:  # CLIP's class token first: the whole image (row = col = -1)
            cells = np.concatenate([[[0, -1, -1]], cells])
            boxes = np.concatenate([[[0, 0, s, s]], boxes])
            labels = ["<image cls>", *labels]
        if self.config.select == "default":  # transformers drops the tower's first token (CLIP's class token)
            cells, boxes, labels = cells[1:], boxes[1:], labels[1:]
        return VLMLayout(pixels, seen, cells.astype(np.int64), boxes.astype(np.int64), labels)

    def expand(self, text: str, layout: VLMLayout) -> str:
        return text.replace(IMAGE, IMAGE * len(layout.cells))

    def features(self, pixels: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        hidden, attention = self.tower(pixels, need_weights)
        chosen = [hidden[i] for i in self.config.feature_layers]
        if self.config.select == "default":  # the first token dropped, as transformers drops it
            chosen = [h[:, 1:] for h in chosen]
        x = self.projector(torch.cat(chosen, dim=-1))
        weights = stack_weights(attention) if need_weights else None
        return x.reshape(-1, x.size(-1)), weights

    def fallback_prompt(self, question: str) -> str:
        return f"USER: {IMAGE}\n{question} ASSISTANT:"


# ------------------------------------------------------------------------------------------------- Idefics3
class Idefics3Connector(nn.Module):
    """The pixel shuffle (each s × s block of patch tokens -> one token of s² · width features), then a Linear."""

    def __init__(self, d_in: int, d_out: int, scale: int) -> None:
        super().__init__()
        self.scale = scale
        self.proj = nn.Linear(d_in * scale * scale, d_out, bias=False)

    def shuffle(self, x: Tensor) -> Tensor:
        """(B, n·n, D) row-major -> (B, (n/s)², s²·D), row-major over blocks; a block's features are its patches'
        in the order transformers' ``pixel_shuffle`` concatenates them (its reshapes, step by step)."""
        b, seq, d = x.shape
        n, s = math.isqrt(seq), self.scale
        x = x.reshape(b, n, n // s, d * s)  # s neighbouring columns of a row side by side
        x = x.permute(0, 2, 1, 3).reshape(b, n // s, n // s, d * s * s)  # then s neighbouring rows
        return x.permute(0, 2, 1, 3).reshape(b, seq // (s * s), d * s * s)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.shuffle(x))


class Idefics3(HFVLM):
    """Idefics3 / SmolVLM v1: the image resized (its longest side to ``size``, then up to whole tiles), split into
    rows × cols tiles of the tower's side, plus the whole image resized to one tile (the global view, last)."""

    bf16_tiles = False  # run the tiles besides the global view in bfloat16 (see ``features``)
    image_splitting: bool | None = None  # None: the processor's do_image_splitting; False: the global view alone
    # (what transformers' processor gives with do_image_splitting=False: one tile, 16× less tower work than 4 × 4)

    @property
    def splits(self) -> bool:
        """Whether the image is split into tiles besides the global view: the processor's do_image_splitting, unless
        ``image_splitting`` says otherwise."""
        return bool(self.config.processor["split"] if self.image_splitting is None else self.image_splitting)

    def layout(self, image: Any) -> VLMLayout:
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms.v2 import functional as TF

        from models.inputs.images import open_image, to_rgb

        spec = self.config.processor
        img, notice = open_image(image)
        t = torch.from_numpy(np.asarray(to_rgb(img), dtype=np.uint8).copy()).permute(2, 0, 1)
        mode = InterpolationMode(spec["interpolation"])
        if spec["resize"]:
            h, w = longest_edge_size(t.shape[1], t.shape[2], spec["longest_edge"])
            t = TF.resize(t, [h, w], interpolation=mode, antialias=True)
        if self.splits:
            h, w = whole_tiles_size(t.shape[1], t.shape[2], spec["tile"])
        else:
            h = w = spec["tile"]
        t = TF.resize(t, [h, w], interpolation=mode, antialias=True)
        lay = self.relayout(t.permute(1, 2, 0).numpy().copy())
        lay.notice = notice
        return lay

    def relayout(self, seen: np.ndarray) -> VLMLayout:
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms.v2 import functional as TF

        spec = self.config.processor
        tile = spec["tile"]
        t = torch.from_numpy(np.ascontiguousarray(seen)).permute(2, 0, 1)
        h, w = t.shape[1:]
        if h % tile or w % tile:
            raise ValueError(f"the image the model saw ({w}×{h}) is not whole {tile}-pixel tiles")
        rows, cols = (h // tile, w // tile) if h > tile or w > tile else (0, 0)
        tiles = [t[:, r * tile:(r + 1) * tile, q * tile:(q + 1) * tile] for r in range(rows) for q in range(cols)]
        if rows:
            glob = TF.resize(t, [tile, tile], interpolation=InterpolationMode(spec["interpolation"]), antialias=True)
        else:
            glob = t
        tiles.append(glob)
        pixels = normalise(torch.stack(tiles), spec)
        g = self.token_grid
        step = tile // g  # pixels per image token side on a tile
        cells, boxes, labels = [], [], []
        for k in range(len(tiles)):
            gr, gc = np.divmod(np.arange(g * g), g)
            if k < rows * cols:
                r0, c0 = divmod(k, cols)
                y0, x0 = r0 * tile + gr * step, c0 * tile + gc * step
                box = np.stack([x0, y0, x0 + step, y0 + step], 1)
                labels += [f"<image t{k} r{a}c{b}>" for a, b in zip(gr, gc)]
            else:  # the global view: its cells cover the whole image, coarser
                xs, ys = (np.arange(g + 1) * w) // g, (np.arange(g + 1) * h) // g
                box = np.stack([xs[gc], ys[gr], xs[gc + 1], ys[gr + 1]], 1)
                labels += [f"<image global r{a}c{b}>" for a, b in zip(gr, gc)]
            cells.append(np.stack([np.full_like(gr, k), gr, gc], 1))
            boxes.append(box)
        return VLMLayout(pixels, seen, np.concatenate(cells).astype(np.int64), np.concatenate(boxes).astype(np.int64),
                         labels, rows, cols)

    def expand(self, text: str, layout: VLMLayout) -> str:
        fake, glob, n = "<fake_token_around_image>", "<global-img>", self.config.image_seq_len
        tokens = IMAGE * n
        if layout.rows == 0 and layout.cols == 0:
            return text.replace(IMAGE, f"{fake}{glob}{tokens}{fake}")
        out = ""
        for r in range(layout.rows):
            for q in range(layout.cols):
                out += f"{fake}<row_{r + 1}_col_{q + 1}>{tokens}"
            out += "\n"
        out += f"\n{fake}{glob}{tokens}{fake}"
        return text.replace(IMAGE, out)

    def features(self, pixels: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """Every tile through the tower (its final LayerNorm), shuffled and projected: (tiles · n, D); the tower's
        attention of the global view (the last tile) with need_weights. The other tiles go through as one batch (the
        fused attention path); with ``bf16_tiles`` they run through a bfloat16 copy of the tower, an approximation the
        tests do not hold to 1e-4, so it is off unless asked for; the global view, whose attention is shown, and the
        connector stay float32."""
        out = []
        if pixels.size(0) > 1:
            tower = self._bf16_tower(pixels.device) if self.bf16_tiles else self.tower
            out.append(self._tiles(pixels[:-1].to(next(tower.parameters()).dtype), False, tower)[0])
        glob, weights = self._tiles(pixels[-1:], need_weights, self.tower)
        out.append(glob)
        return torch.cat(out), weights

    def _bf16_tower(self, device: torch.device) -> Tower:
        """A bfloat16 copy of the tower, made on first use and kept outside the module's parameters (the weights
        loaded are unchanged; CPU autocast instead would cast every weight again on every call)."""
        import copy

        kept = self.__dict__.get("_tower_bf16")
        if kept is None or next(kept.parameters()).device != device:
            kept = copy.deepcopy(self.tower).to(device=device, dtype=torch.bfloat16).eval()
            self.__dict__["_tower_bf16"] = kept  # a plain attribute: not a submodule, not in the state dict
        return kept

    def _tiles(self, pixels: Tensor, need_weights: bool, tower: Tower) -> tuple[Tensor, Tensor | None]:
        hidden, attention = tower(pixels, need_weights)
        x = hidden[-1]
        if tower.post_norm is not None:
            x = tower.post_norm(x)
        x = self.projector(x.float())
        weights = None
        if need_weights:
            weights = stack_weights(attention)
        return x.reshape(-1, x.size(-1)), weights

    def fallback_prompt(self, question: str) -> str:
        return f"User:{IMAGE}{question}<end_of_utterance>\nAssistant:"


# ------------------------------------------------------------------------------------------------ PaliGemma
class PaliGemma(Llava):
    """PaliGemma: LLaVA's one resized square (SigLIP: no class token, every patch an image token), the tower's final
    LayerNorm and one Linear; the prompt laid out as its processor lays it out, read both ways by the Gemma LM."""

    tokenizer_specials = False  # the processor turns the tokenizer's <bos> off and places it after the image

    def expand(self, text: str, layout: VLMLayout) -> str:
        """PaliGemmaProcessor: the text up to the (last) placeholder, ``<bos>``, the rest, ``\\n``; then each
        placeholder as the image's tokens."""
        end = text.rfind(IMAGE) + len(IMAGE)
        text = text[:end] + self.config.specials["bos_token"] + text[end:] + "\n"
        return text.replace(IMAGE, IMAGE * len(layout.cells))

    def features(self, pixels: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        hidden, attention = self.tower(pixels, need_weights)
        x = self.projector(self.tower.post_norm(hidden[-1]))  # SigLIP's last_hidden_state, projected
        weights = stack_weights(attention) if need_weights else None
        return x.reshape(-1, x.size(-1)), weights

    def fallback_prompt(self, question: str) -> str:
        """PaliGemma has no chat template: the image, then the task prompt ("caption en", "answer en …")."""
        return f"{IMAGE}{question}"


# ------------------------------------------------------------------------------------------------ helpers
def assemble(rows: list[list[Tensor]], t: int, dtype: torch.dtype) -> np.ndarray:
    """Each layer's attention blocks (H, rows, S) — the prompt's square, then one row per new token — laid into one
    (layers, H, t, t) array of ``dtype``, zeros above the diagonal. Each block is written once, cast on the way
    (torch's copy: no float32 copy of a half-precision block, no per-layer temporaries)."""
    out = torch.zeros((len(rows), rows[0][0].size(0), t, t), dtype=dtype)
    for layer, blocks in enumerate(rows):
        i = 0
        for w in blocks:  # causal: each block fills the left S columns of its rows
            out[layer, :, i:i + w.size(1), :w.size(2)].copy_(w)
            i += w.size(1)
    return out.numpy()


def stack_weights(attention: list[Tensor]) -> Tensor:
    """The tower's attention of the first image, every block (blocks, H, N, N): float32, or float16 over more than
    ``limits.LONG_TOKENS`` tokens (each block cast as it is stacked: no float32 copy of the whole stack first)."""
    dtype = torch.float16 if attention[0].size(-1) > limits.LONG_TOKENS else torch.float32
    return torch.stack([w[0].to(dtype) for w in attention])


def normalise(t: Tensor, spec: dict[str, Any]) -> Tensor:
    """uint8 (…, C, H, W) -> float32 rescaled and normalised as the image processor's settings say, in transformers' own
    arithmetic (rescale fused into the normalisation: ``models.inputs.images.processor_normalise``)."""
    from models.inputs.images import processor_normalise

    return processor_normalise(t, spec)


def longest_edge_size(height: int, width: int, longest: int) -> tuple[int, int]:
    """Idefics3's first resize: the longest side to ``longest`` (up or down), the other kept in proportion
    (truncated, then up to an even number), at most 4096 a side (transformers' ``get_resize_output_image_size`` of
    image_processing_idefics3: the cap's proportion is the first resize's, rounded sides and all, not the image's)."""
    ratio = width / height
    if width >= height:
        width = longest
        height = int(width / ratio)
        height += height % 2
    else:
        height = longest
        width = int(height * ratio)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    ratio = width / height  # _resize_output_size_scale_below_upper_bound reads the sizes just computed
    if width >= height and width > 4096:
        width, height = 4096, max(int(4096 / ratio), 1)
    elif height > width and height > 4096:
        height, width = 4096, max(int(4096 * ratio), 1)
    return height, width


def whole_tiles_size(height: int, width: int, tile: int) -> tuple[int, int]:
    """Idefics3's resize for the vision encoder: both sides up to whole tiles, the aspect ratio kept as it does."""
    ratio = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / ratio) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * ratio) / tile) * tile
    return height, width


# ------------------------------------------------------------------------------------------------ Qwen2.5-VL
QWEN_IMAGE = "<|image_pad|>"
QWEN_IMAGE_PROMPT = "<|vision_start|><|image_pad|><|vision_end|>"


@dataclass
class QwenTowerConfig:
    """Qwen2.5-VL's vision transformer (Bai et al. 2025, §2.1): any image size in whole merge blocks of patches."""

    patch: int = 14
    temporal: int = 2  # frames per patch (an image is its one frame repeated)
    channels: int = 3
    dim: int = 1280
    depth: int = 32
    heads: int = 16
    mlp_dim: int = 3420
    act: str = "silu"  # the gated MLP's activation (an ACTIVATIONS name)
    merge: int = 2  # each merge × merge block of patches becomes one image token
    window: int = 112  # window attention's side in pixels (window // merge // patch merged tokens a side)
    full_blocks: tuple[int, ...] = (7, 15, 23, 31)  # blocks with full attention; the others attend within windows
    out_dim: int = 2048  # the language model's width
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6

    @property
    def window_tokens(self) -> int:
        """Merged tokens a side of one attention window."""
        return self.window // self.merge // self.patch

    @property
    def patch_dim(self) -> int:
        return self.channels * self.temporal * self.patch * self.patch


class QwenTowerBlock(nn.Module):
    """x + proj(attn(RMSNorm x)) with 2D rotary q and k, then x + down(act(gate ·) ⊙ up ·) of RMSNorm x."""

    def __init__(self, c: QwenTowerConfig) -> None:
        super().__init__()
        from models.families.gpt import RMSNorm

        self.c = c
        self.norm1, self.norm2 = RMSNorm(c.dim, c.norm_eps), RMSNorm(c.dim, c.norm_eps)
        self.qkv, self.proj = nn.Linear(c.dim, 3 * c.dim), nn.Linear(c.dim, c.dim)
        self.gate_proj, self.up_proj = nn.Linear(c.dim, c.mlp_dim), nn.Linear(c.dim, c.mlp_dim)
        self.down_proj = nn.Linear(c.mlp_dim, c.dim)
        self.act = ACTIVATIONS[c.act]

    def forward(self, x: Tensor, angles: Tensor, mask: Tensor | None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x (N, D) in the processor's patch order; angles (N, d_head / 2); mask (N, N) True where a patch may look
        (None: every patch)."""
        from models.blocks.attention import attend
        from models.blocks.positional import apply_rope

        n, c = x.size(0), self.c
        q, k, v = self.qkv(self.norm1(x)).view(n, 3, c.heads, -1).permute(1, 2, 0, 3)  # each (H, N, d)
        q, k = apply_rope(q.float(), angles, "half").to(q.dtype), apply_rope(k.float(), angles, "half").to(k.dtype)
        out, w = attend(q[None], k[None], v[None], mask, need_weights=need_weights)  # (1, H, N, d)
        x = x + self.proj(out[0].transpose(0, 1).reshape(n, c.dim))
        h = self.norm2(x)
        return x + self.down_proj(self.act(self.gate_proj(h)) * self.up_proj(h)), None if w is None else w[0]


class QwenTower(nn.Module):
    """Patches (N, C·T·p·p) in the processor's order -> (tokens (N / merge², out_dim), attention per block).

    The processor lays the patches out merge block by merge block (each block's merge² patches row-major, the
    blocks row-major). transformers runs the blocks on the patches reordered window by window and splits the
    sequence at the window boundaries; attention does not depend on the order of its tokens (the rotary angles go
    with each patch), so here the patches keep the processor's order and a window block attends under a mask that
    keeps the patches of its own window (the same windows: window_tokens × window_tokens merged tokens from the top
    left, the last ones cut by the image's edge). The merger (RMSNorm, each block's merge² patches side by side,
    Linear, GELU, Linear) then reads each merge block's patches, as transformers' does after undoing its reordering.
    """

    def __init__(self, c: QwenTowerConfig) -> None:
        super().__init__()
        from models.families.gpt import RMSNorm

        self.config = c
        self.patch_embed = nn.Linear(c.patch_dim, c.dim, bias=False)  # the Conv3d over (C, T, p, p), flattened
        self.blocks = nn.ModuleList(QwenTowerBlock(c) for _ in range(c.depth))
        self.merger_norm = RMSNorm(c.dim, 1e-6)
        width = c.dim * c.merge * c.merge
        self.merger_fc1, self.merger_fc2 = nn.Linear(width, width), nn.Linear(width, c.out_dim)
        self.prefix = 0  # no class token

    def patch_ids(self, rows: int, cols: int) -> tuple[Tensor, Tensor]:
        """The (row, column) of each patch of a rows × cols grid in the processor's order."""
        m = self.config.merge
        r, q = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
        shape = (rows // m, m, cols // m, m)
        return r.reshape(shape).transpose(1, 2).flatten(), q.reshape(shape).transpose(1, 2).flatten()

    def angles(self, r: Tensor, q: Tensor) -> Tensor:
        """2D rotary (Su et al. 2021, one axis each half): the first quarter of each head's frequencies turned by the
        patch row, the next by its column (θ over d_head / 2, as transformers' axial rope): (N, d_head / 2)."""
        c = self.config
        half = c.dim // c.heads // 2
        theta = 1.0 / (c.rope_theta ** (torch.arange(0, half, 2, dtype=torch.float) / half))  # (d_head / 4,)
        return torch.cat([r.float()[:, None] * theta, q.float()[:, None] * theta], dim=-1)

    def windows(self, r: Tensor, q: Tensor) -> Tensor:
        """(N, N) True where two patches share an attention window."""
        side = self.config.merge * self.config.window_tokens  # patches a window side
        wid = (r // side) * (int(q.max()) // side + 1) + q // side
        return wid[:, None] == wid[None, :]

    def forward(self, patches: Tensor, rows: int, cols: int,
                need_weights: bool = False) -> tuple[Tensor, list[Tensor]]:
        c = self.config
        r, q = self.patch_ids(rows, cols)
        angles = self.angles(r, q).to(patches.device)
        local = self.windows(r, q).to(patches.device)
        x = self.patch_embed(patches)
        attention = []
        for i, block in enumerate(self.blocks):
            x, w = block(x, angles, None if i in c.full_blocks else local, need_weights)
            if w is not None:
                attention.append(w)
        x = self.merger_norm(x).reshape(-1, c.dim * c.merge * c.merge)
        return self.merger_fc2(F.gelu(self.merger_fc1(x))), attention


class Qwen25VL(HFVLM):
    """Qwen2.5-VL: the image resized to whole merge blocks of patches within a pixel budget (``smart_resize``), read
    at that resolution (no tiles), each merge × merge block of patches one image token; the language model's
    M-RoPE gives an image token its row and column (and frame) as position ids, the text after it positions that
    continue from the image's largest one (transformers' ``get_rope_index``)."""

    placeholder = QWEN_IMAGE
    image_prompt = QWEN_IMAGE_PROMPT
    tower_class = QwenTower
    # the app's caps, where the processor's pixel budget would go past what it serves: at most this many image tokens
    # (an image over it is read with a smaller max_pixels, as the processor's own max_pixels setting reads it, and
    # said so; None: the processor's budget alone), and the tower's attention kept only while blocks × heads × P²
    # (P patches) stays within tower_cells (float16 above LONG_TOKENS: 512 MB); over it the tower view is off, said so
    max_image_tokens: int | None = 1024
    tower_cells: int = 1 << 28

    def layout(self, image: Any) -> VLMLayout:
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms.v2 import functional as TF

        from models.inputs.images import open_image, to_rgb

        spec = self.config.processor
        img, notice = open_image(image)
        notes = [notice]
        t = torch.from_numpy(np.asarray(to_rgb(img), dtype=np.uint8).copy()).permute(2, 0, 1)
        f, budget = spec["factor"], spec["max_pixels"]
        h, w = smart_resize(t.shape[1], t.shape[2], f, spec["min_pixels"], budget)
        cap = self.max_image_tokens
        if cap is not None and (h // f) * (w // f) > cap:
            was = (w, h)
            budget = cap * f * f
            h, w = smart_resize(t.shape[1], t.shape[2], f, min(spec["min_pixels"], budget), budget)
            notes.append(f"The image was read at {w}×{h} pixels ({(h // f) * (w // f)} image tokens), not the "
                         f"{was[0]}×{was[1]} its processor would choose: at most {cap} image tokens are served "
                         f"(max_pixels {budget}).")
        t = TF.resize(t, [h, w], interpolation=InterpolationMode(spec["interpolation"]), antialias=True)
        lay = self.relayout(t.permute(1, 2, 0).numpy().copy())
        if not self.keeps_tower_attention(lay):
            c = self.config.tower
            notes.append(f"The tower's attention is not kept for this image ({lay.vision_grid[0] * lay.vision_grid[1]}"
                         f" patches × {c.depth} blocks × {c.heads} heads is over this server's budget): a smaller "
                         "image shows it.")
        lay.notice = " ".join(filter(None, notes))
        return lay

    def keeps_tower_attention(self, layout: VLMLayout) -> bool:
        c, (gh, gw) = self.config.tower, layout.vision_grid
        return c.depth * c.heads * (gh * gw) ** 2 <= self.tower_cells

    def relayout(self, seen: np.ndarray) -> VLMLayout:
        c, spec = self.config.tower, self.config.processor
        h, w = seen.shape[:2]
        f = spec["factor"]
        if h % f or w % f:
            raise ValueError(f"the image the model saw ({w}×{h}) is not whole {f}-pixel merge blocks")
        x = normalise(torch.from_numpy(np.ascontiguousarray(seen)).permute(2, 0, 1), spec)  # (C, H, W)
        gh, gw, m, p = h // c.patch, w // c.patch, c.merge, c.patch
        # the processor's patchify: (C, H, W) -> merge blocks row-major, their patches row-major, each (C, T, p, p)
        x = x.reshape(c.channels, gh // m, m, p, gw // m, m, p).permute(1, 4, 2, 5, 0, 3, 6)
        x = x.unsqueeze(5).expand(-1, -1, -1, -1, -1, c.temporal, -1, -1)  # the one frame, temporal times
        pixels = x.reshape(gh * gw, c.patch_dim)
        mh, mw = gh // m, gw // m
        rows, cols = np.divmod(np.arange(mh * mw), mw)
        cells = np.stack([np.zeros_like(rows), rows, cols], 1)
        boxes = np.stack([cols * f, rows * f, (cols + 1) * f, (rows + 1) * f], 1)
        labels = [f"<image r{a}c{b}>" for a, b in zip(rows, cols)]
        return VLMLayout(pixels, seen, cells.astype(np.int64), boxes.astype(np.int64), labels, grid=(mh, mw),
                         vision_grid=(gh, gw))

    def expand(self, text: str, layout: VLMLayout) -> str:
        return text.replace(QWEN_IMAGE, QWEN_IMAGE * len(layout.cells))

    def encode(self, text: str, layout: VLMLayout) -> tuple[list[int], np.ndarray]:
        ids, positions = super().encode(text, layout)
        video = self.config.processor.get("video_token_id")
        if video is not None and video in ids:
            raise ValueError("video inputs are not supported: the prompt holds the video placeholder "
                             f"{self.tokenizer.id_to_token(int(video))} (one image is read)")
        return ids, positions

    def features(self, pixels: Tensor, need_weights: bool = False, grid: tuple[int, int] = (0, 0)
                 ) -> tuple[Tensor, Tensor | None]:
        """The image tokens (N, D) of patches on a (rows, cols) patch ``grid`` and, with need_weights, the tower's
        attention of every block (blocks, H, P, P) over the patches row-major on that grid (the processor's
        merge-block order undone), so it reads as any tower's."""
        gh, gw = grid
        if gh * gw != len(pixels):
            raise ValueError(f"{len(pixels)} patches for a {gh} × {gw} patch grid")
        x, attention = self.tower(pixels, gh, gw, need_weights)
        weights = None
        if need_weights:
            r, q = self.tower.patch_ids(gh, gw)
            order = torch.argsort(r * gw + q).to(pixels.device)  # row-major patch -> its place in the processor's
            weights = stack_weights([w[:, order][:, :, order][None] for w in attention])
        return x, weights

    def image_features(self, layout: VLMLayout, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        device = next(self.parameters()).device
        keep = need_weights and self.keeps_tower_attention(layout)
        return self.features(layout.pixels.to(device), keep, layout.vision_grid)

    @torch.no_grad()
    def tower_attention(self, r: DescribeResult, tile: int) -> np.ndarray:
        """The tower's attention over the one image (tile 0), as ``describe`` gives it (or refused in words where the
        image is too large to keep it)."""
        if int(tile) != 0:
            raise ValueError(f"tile {tile} is not one of the image's 0–0: Qwen2.5-VL reads the image whole")
        _, weights = self.image_features(self.relayout(np.asarray(r.image)), need_weights=True)
        if weights is None:
            raise ValueError("the image is too large to keep the tower's attention (see the notice)")
        return weights.float().cpu().numpy()

    def rope_positions(self, ids: list[int], layout: VLMLayout) -> Tensor:
        """transformers' ``get_rope_index`` for one image: text tokens count on by one (all three ids equal); the
        image's tokens take (start, start + row, start + column), start the position after the text before it; the
        text after it continues from start + max(rows, cols)."""
        mh, mw = layout.grid
        out = torch.zeros(3, len(ids), dtype=torch.long)
        image = np.asarray(ids) == self.config.image_token_id
        at, k = 0, 0
        while k < len(ids):
            if not image[k]:
                out[:, k] = at
                at, k = at + 1, k + 1
                continue
            n = mh * mw
            rows, cols = np.divmod(np.arange(n), mw)
            out[0, k:k + n] = at
            out[1, k:k + n] = torch.as_tensor(rows) + at
            out[2, k:k + n] = torch.as_tensor(cols) + at
            at, k = at + max(mh, mw), k + n
        return out

    def fallback_prompt(self, question: str) -> str:
        return (f"<|im_start|>user\n{QWEN_IMAGE_PROMPT}{question}<|im_end|>\n<|im_start|>assistant\n")


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's dynamic resolution (Wang et al. 2024, §2.1; transformers' ``smart_resize``): both sides rounded to
    multiples of ``factor`` (patch × merge), then scaled, aspect kept, to within [min_pixels, max_pixels]."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"the image's aspect ratio ({max(height, width) / min(height, width):.0f}:1) is over the "
                         "200:1 this model reads")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar
