"""Decoder-only language model in two recipes, with its attention, head ablation and the logit lens.

- ``recipe="gpt2"`` (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners"): pre-norm
  LayerNorm blocks, learned absolute positions, GELU (tanh approximation) feed-forward, biases, tied
  input and output embeddings. GPT-2 weights from a Hugging Face folder load through ``models/io/hf.py``.
- ``recipe="llama"`` (Touvron et al. 2023, "LLaMA"): pre-norm RMSNorm (Zhang & Sennrich 2019), rotary
  position embeddings on queries and keys (Su et al. 2021; ``models/blocks/positional.py``), SwiGLU feed-forward
  (Shazeer 2020), no biases, and optional grouped-query attention (Ainslie et al. 2023): ``n_kv_heads``
  key/value heads, each shared by ``n_heads / n_kv_heads`` query heads.

Attention is causal: token i sees tokens 0..i (Vaswani et al. 2017, §3.2.3). It goes through
``models.blocks.attention.attend``, the switch every model shares: with ``need_weights`` the explicit
``scaled_dot_product``, returning its weights; otherwise the fused kernel. A ``KVCache`` per layer (the one of
``models/blocks/attention.py``) makes generation incremental. ``head_mask`` (layers, heads) multiplies each head's
output before the output projection, so a head is switched off per call, never by changing the shared model.
``edit`` (``models.blocks.attention.Intervention``) goes the same way: per layer it replaces chosen heads' outputs or
the residual stream at chosen positions, forbids heads chosen keys, and records what activation patching needs
(``models/inspect/patching.py``).

``qkv_bias`` (the LLaMA recipe has no biases; Qwen2 adds them to queries, keys and values): a query/key bias is a
content-free direction, which RoPE turns into a score by offset alone, so a head can look one token back from the
first training step. gpt-tiny, the decoder the project ships, uses it (train/lm.py); the other options serve
GPT-2 and LLaMA-family folders and Hub ids (models/io/hf.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models import limits
from models.analysis import HEAD_ROLES, head_roles
from models.blocks.attention import (
    Intervention,
    KVCache,
    LayerEdit,
    attend,
    bind,
    causal_mask,
    edit_heads,
    enter_layer,
    restrict_keys,
)
from models.blocks.decoder import (
    BlockSpec,
    DecoderSpec,
    Knows,
    count,
    flag,
    one_of,
    refusal,
    scale,
    sections,
    stores_long,
)
from models.blocks.layers import ACTIVATIONS
from models.blocks.loop import Decoding, full_surprisal
from models.blocks.positional import ROPE_LAYOUTS, apply_rope, mrope_angles, rope_angles
from models.outputs import GenerationResult, LogitLens

RECIPES = ("llama", "gpt2", "neox")
STRATEGIES = ("greedy", "sample")


@dataclass
class GPTConfig:
    recipe: str = "llama"  # "llama" (RMSNorm, RoPE, SwiGLU, no biases), "gpt2" (LayerNorm, learned positions, GELU)
    # or "neox" (GPT-NeoX / Pythia: LayerNorm, RoPE, a GELU feed-forward (ff_act), biases everywhere)
    vocab_size: int = 8000  # tokenizer pieces
    max_len: int = 256  # positions: the longest context the model was trained for
    d_model: int = 256  # residual stream width
    n_layers: int = 4  # decoder blocks
    n_heads: int = 8  # query heads, d_head = d_model / n_heads
    n_kv_heads: int = 0  # key/value heads; 0 = n_heads (multi-head), fewer = grouped-query attention
    d_ff: int = 0  # feed-forward width; 0 = the recipe's: 4·d (GPT-2), 8/3·d rounded up to 64 (LLaMA)
    norm_eps: float = 1e-5  # LayerNorm / RMSNorm epsilon
    rope_base: float = 10000.0  # RoPE θ base (LLaMA recipe)
    rope_layout: str = "interleaved"  # pairs (2i, 2i+1) as models/blocks/positional.py, or "half" (rotate-half layout)
    tie_embeddings: bool = True  # output projection = input embedding (Press & Wolf 2017)
    dropout: float = 0.0  # residual and attention dropout while training
    bos_id: int = 1  # put first in every prompt of the project's own models
    eos_id: int = 2  # generation stops after it
    pad_id: int = 0
    qkv_bias: bool = False  # biases on the query/key/value projections under the LLaMA recipe too (as Qwen2)
    # Switches of the later decoder families (models/io/hf_decoders.py reads their folders); each default keeps the
    # two recipes above exactly as they were, so a config without them loads and runs unchanged.
    head_dim: int = 0  # per-head width; 0 = d_model / n_heads (Qwen3, Gemma 3 and Mistral may set their own)
    qk_norm: bool = False  # per-head RMSNorm on queries and keys, before RoPE (Qwen3, Gemma 3)
    sliding_window: int = 0  # on a local layer query i sees keys i − w < j ≤ i only (Mistral, Gemma 3); 0 = none
    layer_types: tuple[str, ...] = ()  # per layer "sliding" or "full"; () = every layer sliding when a window is set
    local_rope_base: float = 0.0  # RoPE θ base of the sliding layers (Gemma 3's local layers); 0 = rope_base
    embed_scale: float = 0.0  # token embeddings multiplied by it (Gemma: √d_model); 0 = not scaled
    sandwich_norm: bool = False  # one more norm on the attention's and the feed-forward's output (Gemma 2/3)
    attn_scale: float = 0.0  # score scale; 0 = 1/√d_head (Gemma 3: query_pre_attn_scalar^−½)
    final_softcap: float = 0.0  # output logits z -> cap·tanh(z/cap) (Gemma 2, Gemma 3 where set); 0 = none
    ff_act: str = "silu"  # the feed-forward's activation (models.blocks.layers.ACTIVATIONS): "silu" (SwiGLU),
    # "gelu_tanh" (GeGLU, Gemma), "gelu" (NeoX's plain feed-forward); GPT-2's is always gelu_tanh
    n_experts: int = 0  # mixture of experts (Mixtral, models/families/moe.py): experts per layer; 0 = dense
    experts_per_token: int = 2  # top-k experts the router picks per token
    parallel_residual: bool = False  # x + attn(n1 x) + ff(n2 x), both from the same x (GPT-J, GPT-NeoX)
    rotary_dim: int = 0  # RoPE on the first rotary_dim dimensions of each head only (NeoX, Phi-3 partial); 0 = all
    mrope_section: tuple[int, ...] = ()  # M-RoPE (Qwen2.5-VL's LM): the frequency pairs turned by the temporal,
    # height and width positions in turn (sizes summing to d_head / 2); () = plain RoPE over one position per token
    prefix_lm: bool = False  # the prompt attends bidirectionally (PaliGemma's language model; DecoderSpec.prefix_lm)
    attn_softcap: float = 0.0  # attention scores z -> cap·tanh(z/cap) before the softmax (Gemma 2); 0 = none
    # the switches above, absent from configs saved before them (models.io.checkpoint.config_from_dict: defaults apply)
    OPTIONAL: ClassVar[tuple[str, ...]] = (
        "head_dim", "qk_norm", "sliding_window", "layer_types", "local_rope_base", "embed_scale", "sandwich_norm",
        "attn_scale", "final_softcap", "ff_act", "n_experts", "experts_per_token", "parallel_residual", "rotary_dim",
        "mrope_section", "prefix_lm", "attn_softcap")

    def __post_init__(self) -> None:
        if self.recipe not in RECIPES:
            raise ValueError(f"recipe must be one of {RECIPES}, got {self.recipe!r}")
        if self.d_model % self.n_heads and not self.head_dim:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.kv_heads < 1 or self.n_heads % self.kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.rope_layout not in ROPE_LAYOUTS:
            raise ValueError(f"rope_layout must be 'interleaved' or 'half', got {self.rope_layout!r}")
        self.layer_types = tuple(self.layer_types)  # a list from config.json
        if self.layer_types and (len(self.layer_types) != self.n_layers
                                 or set(self.layer_types) - {"sliding", "full"}):
            raise ValueError(f"layer_types must name 'sliding' or 'full' for each of the {self.n_layers} layers")
        if self.ff_act not in ACTIVATIONS:
            raise ValueError(f"ff_act must be one of {tuple(ACTIVATIONS)}, got {self.ff_act!r}")
        if self.n_experts and not 0 < self.experts_per_token <= self.n_experts:
            raise ValueError(f"experts_per_token must be in 1..{self.n_experts}, got {self.experts_per_token}")
        if self.rotary_dim and (self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.d_head):
            raise ValueError(f"rotary_dim must be even and at most d_head={self.d_head}, got {self.rotary_dim}")
        self.mrope_section = tuple(self.mrope_section)  # a list from config.json
        if self.mrope_section and (sum(self.mrope_section) != self.rotary_width // 2 or self.recipe == "gpt2"
                                   or any(x < 1 for x in self.mrope_section)):
            raise ValueError(f"mrope_section {list(self.mrope_section)} must split the {self.rotary_width // 2} "
                             "rotary frequency pairs of a head (sizes > 0 summing to them)")

    def is_local(self, layer: int) -> bool:
        """Whether ``layer`` attends through the sliding window (a local layer)."""
        if not self.sliding_window:
            return False
        return not self.layer_types or self.layer_types[layer] == "sliding"

    def block_spec(self, layer: int) -> BlockSpec:
        """What block ``layer`` computes (models/blocks/decoder.py): the recipe with this config's switches."""
        layernorm = self.recipe in ("gpt2", "neox")
        rope = "none" if self.recipe == "gpt2" else "partial" if self.rotary_width < self.d_head else "full"
        return BlockSpec(
            residual="parallel" if self.parallel_residual else "sequential",
            norm="layernorm" if layernorm else "rmsnorm", sandwich=self.sandwich_norm,
            qkv_bias=layernorm or self.qkv_bias, o_bias=layernorm,
            rope=rope, rotary_dim=0 if rope == "none" else self.rotary_width, rope_layout=self.rope_layout,
            local_rope=self.is_local(layer) and bool(self.local_rope_base), mrope_section=self.mrope_section,
            qk_norm=self.qk_norm,
            window=self.sliding_window if self.is_local(layer) else 0, attn_scale=float(self.attn_scale),
            attn_softcap=float(self.attn_softcap),
            ff="experts" if self.n_experts else "mlp" if layernorm else "gated",
            ff_act="gelu_tanh" if self.recipe == "gpt2" else self.ff_act, ff_bias=layernorm,
            experts=self.n_experts, experts_per_token=self.experts_per_token if self.n_experts else 0)

    def spec(self) -> DecoderSpec:
        """The whole decoder's description, which every runner reads (models/blocks/decoder.py)."""
        return DecoderSpec(positions="learned" if self.recipe == "gpt2" else "rope",
                           embed_scale=float(self.embed_scale), final_softcap=float(self.final_softcap),
                           prefix_lm=bool(self.prefix_lm),
                           blocks=tuple(self.block_spec(i) for i in range(self.n_layers)))

    @property
    def rotary_width(self) -> int:
        """The dimensions of each head RoPE turns."""
        return self.rotary_dim or self.d_head

    @property
    def score_scale(self) -> float:
        """What q·k is multiplied by: 1/√d_head, or the family's own (Gemma 3)."""
        return self.attn_scale or 1.0 / math.sqrt(self.d_head)

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def d_head(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def ff_width(self) -> int:
        if self.d_ff:
            return self.d_ff
        return 4 * self.d_model if self.recipe == "gpt2" else 64 * math.ceil(8 * self.d_model / 3 / 64)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + ε) · g (Zhang & Sennrich 2019), computed in float32."""

    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


# What the plain path computes: every value of every field of models/blocks/decoder.py's description that the modules
# below implement. GPT refuses a description with anything else (fails closed, as every runner).
PLAIN: Knows = {
    "positions": one_of("rope", "learned"), "embed_scale": scale, "final_softcap": scale, "prefix_lm": flag,
    "residual": one_of("sequential", "parallel"), "norm": one_of("rmsnorm", "layernorm"), "sandwich": flag,
    "qkv_bias": flag, "o_bias": flag, "rope": one_of("none", "full", "partial"), "rotary_dim": count,
    "rope_layout": one_of(*ROPE_LAYOUTS), "local_rope": flag, "qk_norm": flag, "window": count, "attn_scale": scale,
    "attn_softcap": scale, "ff": one_of("gated", "mlp", "experts"), "ff_act": one_of(*ACTIVATIONS), "ff_bias": flag,
    "experts": count, "experts_per_token": count,
    "mrope_section": sections}


class CausalSelfAttention(nn.Module):
    def __init__(self, c: GPTConfig, spec: BlockSpec | None = None) -> None:
        super().__init__()
        spec = spec or c.block_spec(0)
        self.c, self.spec = c, spec
        self.window = spec.window  # 0: every earlier key (a global layer)
        # a query/key bias is a content-free direction that RoPE turns into a purely positional score, e.g. one
        # token back (a previous-token head); without one the residual stream has to learn such a direction
        qkv = spec.qkv_bias
        self.q_proj = nn.Linear(c.d_model, c.n_heads * c.d_head, bias=qkv)
        self.k_proj = nn.Linear(c.d_model, c.kv_heads * c.d_head, bias=qkv)
        self.v_proj = nn.Linear(c.d_model, c.kv_heads * c.d_head, bias=qkv)
        self.o_proj = nn.Linear(c.n_heads * c.d_head, c.d_model, bias=spec.o_bias)
        if spec.qk_norm:  # Qwen3 / Gemma 3: each head's query and key RMS-normalised over its d_head (before RoPE)
            self.q_norm, self.k_norm = RMSNorm(c.d_head, c.norm_eps), RMSNorm(c.d_head, c.norm_eps)

    def forward(self, x: Tensor, angles: Tensor | None, cache: KVCache | None, need_weights: bool,
                head_mask: Tensor | None, edit: LayerEdit | None = None,
                prefix: int = 0) -> tuple[Tensor, Tensor | None]:
        """x (B, T, D) -> (out (B, T, D), weights (B, H, T, S) or None); S = cached + T keys. prefix: the first
        ``prefix`` positions attend to one another both ways (a prefix LM, ``DecoderSpec.prefix_lm``)."""
        c, (b, t, _) = self.c, x.shape
        q = self.q_proj(x).view(b, t, c.n_heads, c.d_head).transpose(1, 2)  # (B, H, T, d)
        k = self.k_proj(x).view(b, t, c.kv_heads, c.d_head).transpose(1, 2)  # (B, Hkv, T, d)
        v = self.v_proj(x).view(b, t, c.kv_heads, c.d_head).transpose(1, 2)
        spec = self.spec
        if spec.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if angles is not None:  # angles of the T new positions, after any cached ones
            r = spec.rotary_dim
            q, k = apply_rope(q, angles, spec.rope_layout, rotary_dim=r), apply_rope(k, angles, spec.rope_layout,
                                                                                     rotary_dim=r)
        if cache is not None:
            k, v = cache.extend(k, v)  # (B, Hkv, S, d), S = cached + T
        s = k.size(2)
        mask = causal_mask(t, s, device=x.device) if t > 1 else None  # one new token sees every key
        if self.window and s > self.window:  # a local layer: the band i − w < j ≤ i (Beltagy et al. 2020)
            mask = window_mask(t, s, self.window, x.device)
        if prefix > s - t:  # a query inside the prefix: it also sees the prefix's later keys (PaliGemma's
            mask = prefix_mask(mask, t, s, prefix, x.device)  # block_sequence_ids "or" the causal or banded mask)
        mask = restrict_keys(mask, edit, t, s, x.device)  # keys a head may not attend to (sink ablation)
        if spec.attn_scale:  # attend divides by √d_head: a query rescaled first gives the family's own scale
            q = q * (spec.attn_scale * math.sqrt(c.d_head))
        # grouped-query attention inside: query head h reads key/value head h // (n_heads / kv_heads)
        out, weights = attend(q, k, v, mask, need_weights=need_weights, dropout=c.dropout if self.training else 0.0,
                              softcap=spec.attn_softcap)  # Gemma 2's soft-capped scores (0: none)
        if head_mask is not None:  # (H,): 0 switches a head's output off (ablation)
            out = out * head_mask.to(out.dtype)[None, :, None, None]
        out = edit_heads(out, edit)  # (B, H, T, d): patched heads, recorded outputs
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1)), weights


class FeedForward(nn.Module):
    """"mlp" (GPT-2, NeoX): W2 · act(W1 x + b1) + b2. "gated" (LLaMA): W_down (act(W_gate x) ⊙ W_up x) (SwiGLU with
    SiLU, GeGLU with GELU; Shazeer 2020)."""

    def __init__(self, c: GPTConfig, spec: BlockSpec | None = None) -> None:
        super().__init__()
        spec = spec or c.block_spec(0)
        self.act = ACTIVATIONS[spec.ff_act]
        self.up = nn.Linear(c.d_model, c.ff_width, bias=spec.ff_bias)
        self.gate = nn.Linear(c.d_model, c.ff_width, bias=spec.ff_bias) if spec.ff == "gated" else None
        self.down = nn.Linear(c.ff_width, c.d_model, bias=spec.ff_bias)

    def forward(self, x: Tensor) -> Tensor:
        if self.gate is not None:
            return self.down(self.act(self.gate(x)) * self.up(x))
        return self.down(self.act(self.up(x)))


class Block(nn.Module):
    """One decoder block as its description (``BlockSpec``) says: the readable reference of every runner."""

    def __init__(self, c: GPTConfig, spec: BlockSpec | None = None) -> None:
        super().__init__()
        self.spec = spec = spec or c.block_spec(0)
        norm = (lambda: nn.LayerNorm(c.d_model, eps=c.norm_eps)) if spec.norm == "layernorm" else \
            (lambda: RMSNorm(c.d_model, c.norm_eps))
        self.norm1, self.attn, self.norm2 = norm(), CausalSelfAttention(c, spec), norm()
        if spec.ff == "experts":  # a router and its experts in place of the one feed-forward block
            from models.families.moe import MixtureOfExperts

            self.ff: nn.Module = MixtureOfExperts(c, ACTIVATIONS[spec.ff_act])
        else:
            self.ff = FeedForward(c, spec)
        if spec.sandwich:  # Gemma 2/3: x + norm(attn(norm(x))), then x + norm(ff(norm(x)))
            self.post_attn_norm, self.post_ff_norm = norm(), norm()
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: Tensor, angles: Tensor | None, cache: KVCache | None, need_weights: bool,
                head_mask: Tensor | None, edit: LayerEdit | None = None,
                prefix: int = 0) -> tuple[Tensor, Tensor | None]:
        a, weights = self.attn(self.norm1(x), angles, cache, need_weights, head_mask, edit, prefix)
        a = self.attn_output(a)
        f = self.ff(self.ff_input(x, a))
        return x + a + self.drop(self.post_ff_norm(f) if self.spec.sandwich else f), weights

    def attn_output(self, a: Tensor) -> Tensor:
        """What the attention adds to the residual stream, from its output a (Gemma: normed once more)."""
        return self.drop(self.post_attn_norm(a) if self.spec.sandwich else a)

    def ff_input(self, x: Tensor, a: Tensor) -> Tensor:
        """What the feed-forward (or the router) reads, from the block's input x and ``attn_output``'s a: norm2 of x
        (parallel residual: both read the same stream) or of x + a (sequential)."""
        return self.norm2(x if self.spec.residual == "parallel" else x + a)


@dataclass
class Forward:
    """What one forward pass returns."""

    logits: Tensor  # (B, T, V)
    attention: list[Tensor] = field(default_factory=list)  # per layer (B, H, T, S), with need_weights
    hidden: list[Tensor] = field(default_factory=list)  # the residual stream before each block and after the last
    heads: list[Tensor] = field(default_factory=list)  # per layer (B, H, T, d_head), with an edit that records


class GPT(nn.Module):
    """Token embedding (+ learned positions for GPT-2) -> decoder blocks -> final norm -> output projection."""

    def __init__(self, config: GPTConfig, tokenizer: Any | None = None) -> None:
        super().__init__()
        self.config = c = config
        self.tokenizer = tokenizer  # models.inputs.tokenizer.Tokenizer; set by models.load / models.io.hf
        self.labels: list[str] = []
        self.spec = spec = c.spec()  # what every block computes, which every runner reads (models/blocks/decoder.py)
        why = refusal(spec, PLAIN, "GPT")
        if why:
            raise ValueError(why)
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.positions = nn.Embedding(c.max_len, c.d_model) if spec.positions == "learned" else None
        self.blocks = nn.ModuleList(Block(c, b) for b in spec.blocks)
        self.norm = nn.LayerNorm(c.d_model, eps=c.norm_eps) if spec.blocks[0].norm == "layernorm" else \
            RMSNorm(c.d_model, c.norm_eps)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.reset_buffers()
        self.drop = nn.Dropout(c.dropout)
        self.apply(self._init)

    def reset_buffers(self) -> None:
        """The RoPE angle tables, derived from the config (so not saved with the weights); again after a model was
        made on the meta device (``models.io.hf.load_gpt``), where they are left out (computing them there would
        run torch's Python meta kernels, which import its compiler: 150 MB)."""
        c = self.config
        if self.spec.positions == "rope" and torch.get_default_device().type != "meta":
            self.register_buffer("angles", rope_angles(c.max_len, c.rotary_width, c.rope_base), persistent=False)
            if c.local_rope_base:  # Gemma 3: the local layers rotate with their own base
                self.register_buffer("angles_local", rope_angles(c.max_len, c.rotary_width, c.local_rope_base),
                                     persistent=False)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    # ------------------------------------------------------------------------------------------ forward
    def forward(self, ids: Tensor, caches: list[KVCache] | None = None, need_weights: bool = False,
                head_mask: Tensor | None = None, keep_hidden: bool = False,
                edit: Intervention | None = None, last_only: bool = False, positions: Tensor | None = None,
                prefix: int = 0) -> Forward:
        """ids (B, T), the tokens after any already in ``caches`` (one KVCache per layer, appended to).
        positions: M-RoPE's (3, T) temporal, height and width position ids of these tokens (``mrope_section``; a
        vision-language model's image tokens: models/families/hf_vlm.py); None: the plain start..start+T−1 on all three.
        head_mask: (layers, heads), 1 keeps a head and 0 switches its output off. edit: per-layer patches
        and forbidden keys (``models.blocks.attention.Intervention``); with ``edit.record`` the result's ``heads``
        holds each layer's per-head outputs. last_only: logits of the last position only (B, 1, V).
        prefix: a prefix LM's (``spec.prefix_lm``) bidirectional part, positions 0..prefix-1 counted from the start
        of the sequence (cached tokens included); 0 (causal) for every other model."""
        c, t = self.config, ids.size(1)
        if prefix and not c.prefix_lm:
            raise ValueError("a bidirectional prefix was given to a causal model (spec.prefix_lm is off)")
        start = caches[0].length if caches else 0
        if positions is not None and (not c.mrope_section or tuple(positions.shape) != (3, t)):
            raise ValueError(f"position ids {tuple(positions.shape)} are for M-RoPE (3, {t}) and this model's "
                             f"mrope_section is {list(c.mrope_section)}")
        if start + t > c.max_len:
            raise ValueError(f"{start + t} tokens exceed the model's {c.max_len} positions")
        x = self.embed(ids)
        if c.embed_scale:  # Gemma: embeddings × √d_model (the tied output projection reads them unscaled)
            x = x * torch.tensor(c.embed_scale, dtype=x.dtype)
        angles = local = None
        if self.positions is not None:
            x = x + self.positions(torch.arange(start, start + t, device=ids.device))
        elif c.mrope_section:  # Qwen2-VL's M-RoPE: each frequency pair turned by its section's position id
            if positions is None:
                positions = torch.arange(start, start + t, device=ids.device).expand(3, t)
            angles = mrope_angles(positions, c.rotary_width, c.rope_base, c.mrope_section)
        else:
            angles = self.angles[start : start + t]
            if c.local_rope_base:
                local = self.angles_local[start : start + t]
        x = self.drop(x)
        attention, hidden = [], []
        edits, recording = bind(edit, c.n_layers)
        for i, block in enumerate(self.blocks):
            x = enter_layer(x, edits[i])  # patched residual positions
            if keep_hidden:
                hidden.append(x)
            x, w = block(x, local if block.spec.local_rope else angles,
                         caches[i] if caches else None, need_weights,
                         None if head_mask is None else head_mask[i], edits[i], prefix)
            if w is not None:  # a long input's weights are kept in half precision (limits.LONG_TOKENS)
                attention.append(w if w.shape[-1] <= limits.LONG_TOKENS else w.to(torch.float16))
        if keep_hidden:
            hidden.append(x)
        if last_only:
            x = x[:, -1:]
        return Forward(self.logits_of(x), attention, hidden, recording.heads)

    def logits_of(self, x: Tensor) -> Tensor:
        """The output logits of residual-stream rows (…, D): final norm, output projection (Gemma 2: soft-capped)."""
        logits = self.lm_head(self.norm(x))
        cap = self.config.final_softcap
        return logits if not cap else torch.tanh(logits / cap) * cap

    # ----------------------------------------------------------------------------------------- entry points
    def encode_prompt(self, text: str) -> tuple[list[int], list[str]]:
        """Prompt ids and their token labels: the project's own models put BOS first (no EOS); a Hugging
        Face tokenizer encodes exactly as transformers does (its post-processor decides the specials)."""
        return self.tokenizer.encode_prompt(text)

    def piece(self, i: int) -> str:
        return self.tokenizer.id_to_piece(int(i)) if self.tokenizer is not None else str(int(i))

    def context_limit(self) -> int:
        """Prompt + generated tokens: MAX_LM_TOKENS where the long-context store computes the model (its attention is
        then never held whole, models/decoding/ondevice.py), else MAX_FULL_TOKENS; fewer where the model has fewer
        positions."""
        cap = limits.MAX_LM_TOKENS if stores_long(self.spec) else limits.MAX_FULL_TOKENS
        return min(cap, self.config.max_len)

    def prepare_prompt(self, text: str | Sequence[int], max_new_tokens: int, strategy: str = "greedy",
                       temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> tuple[list[int], int, str]:
        """What ``generate`` checks and cuts before decoding: (prompt ids, new tokens, notice). Raises ValueError for
        bad settings or an empty prompt; a prompt too long for the context keeps its last tokens (and our BOS)."""
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        if not temperature > 0 or not 0 < top_p <= 1 or top_k < 0:
            raise ValueError("need temperature > 0, 0 < top_p <= 1 and top_k >= 0")
        ids = list(text) if not isinstance(text, str) else self.encode_prompt(text)[0]
        if not ids:
            raise ValueError("the prompt is empty")
        limit = self.context_limit()
        new = max(0, min(int(max_new_tokens), limits.MAX_NEW_TOKENS, limit - 1))
        notice = ""
        if len(ids) + new > limit:  # keep the prompt's last tokens (and the BOS of our own models)
            keep = limit - new
            head = [ids[0]] if ids[0] == self.config.bos_id and self._adds_bos() else []
            notice = f"Prompt shortened to its last {keep - len(head)} tokens (it had {len(ids)})."
            ids = head + ids[len(ids) - (keep - len(head)):]
        return ids, new, notice

    @torch.no_grad()
    def generate(self, text: str | Sequence[int], max_new_tokens: int = 20, strategy: str = "greedy",
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0) -> GenerationResult:
        """Continue ``text`` (or prompt ids) by up to ``max_new_tokens`` tokens, greedy or sampled.

        temperature > 0 divides the logits; top_k > 0 keeps the k most likely tokens; top_p < 1 keeps the
        smallest set whose probability reaches p (Holtzman et al. 2020). Each step records the model's
        own top-5 candidates (temperature 1). After generating, every token (the last generated one too)
        is run through the explicit path once, so the attention has a row for each token.
        """
        run = Decoding.start(self, text, max_new_tokens, strategy, temperature, top_k, top_p, seed)
        was_training = self.training
        self.eval()
        device = self.embed.weight.device
        caches = [KVCache() for _ in self.blocks]
        prefix = len(run.ids) if self.config.prefix_lm else 0  # a prefix LM reads its whole prompt both ways

        def advance(token: int, pos: int, last: bool) -> Tensor | None:  # the KV cache grows by one token
            return None if last else self(torch.tensor([[token]], device=device), caches, prefix=prefix).logits[0, -1]

        run.run(self(torch.tensor([run.ids], device=device), caches, last_only=True, prefix=prefix).logits[0, -1],
                advance)
        full = self(torch.tensor([run.ids], device=device), need_weights=True, prefix=prefix)
        self.train(was_training)
        return run.result(attention_array(full.attention), full_surprisal(full.logits[0], run.ids))  # (L, H, T, T)

    def _adds_bos(self) -> bool:
        return bool(getattr(self.tokenizer, "adds_bos", True))

    def eos_id(self) -> int:
        return int(getattr(self.tokenizer, "eos_id", self.config.eos_id) if self.tokenizer else self.config.eos_id)

    @torch.no_grad()
    def next_token_probs(self, ids: Sequence[int], head_mask: Tensor | None = None) -> np.ndarray:
        """The next-token distribution after ``ids`` (V,), optionally with heads switched off."""
        device = self.embed.weight.device
        out = self(torch.tensor([list(ids)], device=device),
                   head_mask=None if head_mask is None else head_mask.to(device))
        return torch.softmax(out.logits[0, -1].float(), -1).cpu().numpy()

    @torch.no_grad()
    def logit_lens(self, ids: Sequence[int], last: int | None = None) -> LogitLens:
        """Each layer's residual stream decoded through the final norm and the output projection
        (nostalgebraist 2020): the top token per layer and position, its probability, and the probability
        of the token that actually comes next (the final layer's choice at the last position). ``last``: decode
        only the last that many positions (the model still reads every token; a long input's lens costs
        layers × positions × vocabulary)."""
        device = self.embed.weight.device
        x = torch.tensor([list(ids)], device=device)
        out = self(x, keep_hidden=True)
        final = out.logits[0].float()
        target = torch.cat([x[0, 1:], final[-1:].argmax(-1)])  # (T,)
        start = 0 if last is None else max(0, x.size(1) - int(last))
        target = target[start:]
        top_ids, top_p, target_p = [], [], []
        for h in out.hidden[1:]:  # after each block; the last equals the model's own output
            p = torch.softmax(self.logits_of(h[0, start:]).float(), -1)  # (T, V), one layer at a time
            best = p.max(-1)
            top_ids.append(best.indices)
            top_p.append(best.values)
            target_p.append(p.gather(1, target[:, None])[:, 0])
        tops = torch.stack(top_ids).cpu().numpy()
        return LogitLens(top_tokens=[[self.piece(i) for i in row] for row in tops],
                         top_probs=torch.stack(top_p).cpu().numpy().astype(np.float32),
                         target_probs=torch.stack(target_p).cpu().numpy().astype(np.float32),
                         targets=[self.piece(i) for i in target.cpu().numpy()])

    def repeated_tokens(self, n: int, seed: int = 0, pieces: Sequence[int] | np.ndarray | None = None) -> list[int]:
        """BOS + n random non-special tokens + the same n again: the induction-head test sequence (Olsson et
        al. 2022). Tokens are drawn without replacement, so within a copy no token repeats; ``pieces``: draw from
        these ids only (default: every id of the vocabulary), the special ones left out either way."""
        c = self.config
        if n < 2 or 2 * n + 1 > self.context_limit():
            raise ValueError(f"n must be between 2 and {(self.context_limit() - 1) // 2}, got {n}")
        tok = self.tokenizer
        special = {c.bos_id, c.eos_id, c.pad_id} | ({tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id} if tok else set())
        pool = np.array([int(i) for i in (range(c.vocab_size) if pieces is None else pieces) if i not in special])
        if not len(pool):
            raise ValueError("no ordinary token to draw from")
        x = np.random.default_rng(seed).choice(pool, n, replace=len(pool) < n).tolist()
        bos = tok.bos_id if tok is not None and tok.bos_id >= 0 else c.bos_id
        return [int(bos), *x, *x]

    @torch.no_grad()
    def head_role_scores(self, n: int = 50, seeds: Sequence[int] = (0,),
                         pieces: Sequence[int] | np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Each head's role scores (``models.analysis.head_roles``: previous token, induction, duplicate token,
        sink; (L, H) each) on ``repeated_tokens(n, seed, pieces)``, averaged over the seeds, in eval mode."""
        was = self.training
        self.eval()
        runs = [head_roles(self.token_losses(self.repeated_tokens(n, seed, pieces))[1], n) for seed in seeds]
        self.train(was)
        return {role: np.mean([r[role] for r in runs], 0).astype(np.float32) for role in HEAD_ROLES}

    @torch.no_grad()
    def token_losses(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(cross-entropy in nats of each token given the ones before it (T−1,), attention (L, H, T, T))."""
        device = self.embed.weight.device
        x = torch.tensor([list(ids)], device=device)
        out = self(x, need_weights=True)
        loss = F.cross_entropy(out.logits[0, :-1].float(), x[0, 1:], reduction="none")
        return loss.cpu().numpy(), attention_array(out.attention)


def notice(model: GPT) -> str:
    """What this decoder's switches change in the views, in words (the Generate tab's notice): which layers attend
    through a sliding window, and a mixture of experts' view."""
    c, parts = model.config, []
    local = [i for i, b in enumerate(model.spec.blocks) if b.window]
    if local:
        window = model.spec.blocks[local[0]].window
        which = ("Local attention on every layer" if len(local) == c.n_layers else
                 f"Local attention on layers {', '.join(map(str, local))} (the other layers global)")
        parts.append(f"· {which}: a sliding window of {window} tokens (a query sees only that many keys back, its "
                     "own included; the heatmap's band).")
    experts = next((b for b in model.spec.blocks if b.ff == "experts"), None)
    if experts is not None:
        parts.append(f"· A mixture of experts: {experts.experts} experts per layer, {experts.experts_per_token} "
                     "chosen per token (\"Experts chosen per token\" below).")
    return " ".join(parts)


def window_mask(t: int, s: int, window: int, device: torch.device | str | None = None) -> Tensor:
    """Sliding-window causal mask (T, S), True where i − window < j ≤ i; the T queries are the last T of S positions."""
    i = torch.arange(t, device=device)[:, None] + (s - t)
    j = torch.arange(s, device=device)[None, :]
    return (j <= i) & (j > i - window)


def prefix_mask(mask: Tensor | None, t: int, s: int, prefix: int,
                device: torch.device | str | None = None) -> Tensor:
    """``mask`` (T, S; None: every key) with the prefix block opened: query i < prefix also sees every key j < prefix
    (a prefix LM; transformers' blockwise overlay "or" its causal or sliding mask). The T queries are the last T of
    S positions."""
    i = torch.arange(t, device=device)[:, None] + (s - t)
    j = torch.arange(s, device=device)[None, :]
    both = (i < prefix) & (j < prefix)
    return both if mask is None else mask | both


def attention_array(attention: list[Tensor]) -> np.ndarray:
    """Per-layer weights [(1, H, T, T), ...] as one numpy (L, H, T, T), copied a layer at a time while the list is
    emptied, so the peak holds one copy, not two (torch.stack, then numpy). float32, or float16 above
    limits.LONG_TOKENS tokens (12 × 12 heads over 2,048 tokens: 1.2 GB instead of 2.4; rows sum to 1 within 1e-3)."""
    shape = tuple(attention[0].shape[1:])  # (H, T, T)
    long = shape[-1] > limits.LONG_TOKENS
    out = np.empty((len(attention), *shape), np.float16 if long else np.float32)
    for i in range(len(attention)):
        out[i] = attention[i][0].to(torch.float16 if long else torch.float32).cpu().numpy()  # torch converts faster
        attention[i] = None  # freed as soon as it is copied
    return out
