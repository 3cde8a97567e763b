"""Each family's *walk*: how its residual stream is built, layer by layer, as the score split
(models/inspect/decompose.py) and its tests read it (docs/ARCHITECTURE.md §2, "why a head attends").

A walk maps a model and one input's ids to a ``Plan``: the embedding parts (token, position, constant terms, an
embedding norm) and per layer its self-attention (``Attn``: the q/k/v/o projections, heads, the pre-norm or None for
post-norm, causal or not, RoPE angles) and what follows it (a pre-norm feed-forward, or post-norm's two norms around
it). The registry names each family's walk (``models.registry.Family.walk``); ``plan`` dispatches on it, so no class
name is checked anywhere. A new family with a walk adds one function here, named in its registration.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models import registry
from models.blocks.decoder import Knows, count, empty, flag, off, one_of, refusal, scale, zero
from models.blocks.layers import ACTIVATIONS
from models.blocks.positional import ROPE_LAYOUTS, apply_rope
from models.io.bigmodel import execution_device, weight

BIAS = "bias"


def _linear(x: Tensor, m: nn.Linear, bias: bool) -> Tensor:
    """m(x) in float64 on x's device (the weights read where they are, offloaded ones too), with or without bias."""
    b = weight(m, "bias") if bias else None
    return F.linear(x, weight(m).double().to(x.device), None if b is None else b.double().to(x.device))


def _call(module: nn.Module, x: Tensor) -> Tensor:
    """A module that is not split (a feed-forward block) run on the float64 stream, in its own dtype."""
    dtype = next(module.parameters()).dtype
    return module(x.to(dtype)).double().to(x.device)  # a dispatched module answers on its own device


def _module_fn(module: nn.Module):
    return lambda x: _call(module, x)


# ------------------------------------------------------------------------------- one attention layer
@dataclass
class Attn:
    """A self-attention layer as the decomposition reads it (adapted from each model family)."""

    q: nn.Linear
    k: nn.Linear
    v: nn.Linear
    o: nn.Linear
    n_heads: int
    kv_heads: int
    norm: nn.Module | None  # the pre-norm before q/k/v (None: post-norm, the stream enters as it is)
    causal: bool
    angles: Tensor | None = None  # RoPE (positions, d/2)
    layout: str = "interleaved"
    # the later decoder families (models.families.gpt's switches): per-head RMSNorm of queries and keys (Qwen3,
    # Gemma 3), the score scale (None: 1/√d_head) and a sliding window (0: none)
    q_norm: nn.Module | None = None
    k_norm: nn.Module | None = None
    scale: float | None = None
    window: int = 0

    @property
    def score_scale(self) -> float:
        return self.scale if self.scale is not None else 1 / math.sqrt(self.d_head)

    def head_rms(self, x: Tensor, which: str) -> Tensor | None:
        """The per-head RMS (…, heads, P, 1) a q/k norm divides by, computed on the whole stream x (…, P, D): the
        scale the score split freezes (as every other norm's, decompose.Stream.normed). None without q/k norms."""
        norm = self.q_norm if which == "q" else self.k_norm
        if norm is None:
            return None
        m, n = (self.q, self.n_heads) if which == "q" else (self.k, self.kv_heads)
        y = self.heads(x, m, n, bias=True)
        return torch.sqrt(y.pow(2).mean(-1, keepdim=True) + float(norm.eps))

    @property
    def d_head(self) -> int:
        return self.q.out_features // self.n_heads

    def heads(self, x: Tensor, m: nn.Linear, n: int, bias: bool) -> Tensor:
        """(…, T, D) -> (…, n, T, d): one projection split into heads."""
        y = _linear(x, m, bias)
        return y.view(*y.shape[:-1], n, self.d_head).transpose(-3, -2)

    def queries(self, x: Tensor, positions: Sequence[int], bias: bool, rotate: bool = True,
                rms: Tensor | None = None) -> Tensor:
        """Queries at ``positions``; a q-norm divides by ``rms`` (frozen, for a part of the stream) or their own."""
        q = self.heads(x, self.q, self.n_heads, bias)  # (…, H, P, d)
        if self.q_norm is not None:
            q = _head_norm(q, self.q_norm, rms)
        if self.angles is not None and rotate:
            q = _rotate(q, self.angles[list(positions)], self.layout)
        return q

    def keys(self, x: Tensor, positions: Sequence[int], bias: bool, rotate: bool = True,
             rms: Tensor | None = None) -> Tensor:
        """Keys at ``positions`` (k-norm as ``queries``)."""
        k = self.heads(x, self.k, self.kv_heads, bias)
        if self.k_norm is not None:
            k = _head_norm(k, self.k_norm, rms)
        if self.angles is not None and rotate:
            k = _rotate(k, self.angles[list(positions)], self.layout)
        return k

    def group(self) -> int:
        return self.n_heads // self.kv_heads


def _head_norm(y: Tensor, norm: nn.Module, rms: Tensor | None) -> Tensor:
    """RMSNorm over each head's d (…, n, P, d): y / rms · g, rms its own or the one given (frozen)."""
    if rms is None:
        rms = torch.sqrt(y.pow(2).mean(-1, keepdim=True) + float(norm.eps))
    return y / rms * norm.weight.double()


def _rotate(x: Tensor, angles: Tensor, layout: str) -> Tensor:
    return apply_rope(x, angles.double().to(x.device), layout)


@dataclass
class Plan:
    """How one model is walked: the embedding parts, then per layer its attention and what follows it."""

    embed: list[tuple[str, Tensor]]  # (name, (T, D) float64)
    # (attention, what follows it): ("pre", norm2, ff) or ("post", norm1, ff, norm2); ff maps float64 (T, D)
    layers: list[tuple[Attn, tuple]]


# What the decoders' walk reads, field by field of the block description (models/blocks/decoder.py). A parallel
# residual (the feed-forward reading the block's input, not the stream after the attention) and partial rotary (the
# score split's "rotation removed" parts assume every dimension turns) are not walked yet: the split says so.
GPT_KNOWS: Knows = {
    "positions": one_of("rope", "learned"), "embed_scale": scale, "final_softcap": scale, "prefix_lm": off,
    "residual": one_of("sequential"), "norm": one_of("rmsnorm", "layernorm"), "sandwich": flag,
    "qkv_bias": flag, "o_bias": flag, "rope": one_of("none", "full"), "rotary_dim": count,
    "rope_layout": one_of(*ROPE_LAYOUTS), "local_rope": flag, "qk_norm": flag, "window": count, "attn_scale": scale,
    "attn_softcap": zero, "ff": one_of("gated", "mlp", "experts"), "ff_act": one_of(*ACTIVATIONS), "ff_bias": flag,
    "experts": count, "experts_per_token": count,
    "mrope_section": empty}


def gpt(model: nn.Module, x: Tensor) -> Plan:
    c, t, spec = model.config, x.size(1), model.spec
    why = refusal(spec, GPT_KNOWS, "the score split")
    if why:
        raise ValueError(f"{why}: this model's scores cannot be split yet (its attention and patching still work)")
    token = model.embed(x)[0].double()
    if spec.embed_scale:  # Gemma: × √d_model, in the model's dtype as its forward does
        token = token * float(torch.tensor(spec.embed_scale, dtype=model.embed.weight.dtype))
    embed = [("token", token)]
    if model.positions is not None:
        embed.append(("position", model.positions(torch.arange(t, device=x.device)).double()))
    layers = []
    for block, b in zip(model.blocks, spec.blocks):
        a = block.attn
        angles = None if model.positions is not None else model.angles_local if b.local_rope else model.angles
        attn = Attn(a.q_proj, a.k_proj, a.v_proj, a.o_proj, c.n_heads, c.kv_heads, block.norm1, causal=True,
                    angles=angles, layout=b.rope_layout, q_norm=a.q_norm if b.qk_norm else None,
                    k_norm=a.k_norm if b.qk_norm else None, scale=b.attn_scale or None, window=b.window)
        if b.sandwich:  # Gemma: norms after the attention and the feed-forward too
            ff = _module_fn(block.ff)

            def after_ff(h: Tensor, ff=ff, post=block.post_ff_norm) -> Tensor:
                return _call(post, ff(h))

            layers.append((attn, ("sandwich", block.post_attn_norm, block.norm2, after_ff)))
        elif b.ff == "experts":  # a mixture of experts: each expert's output a part of its own
            layers.append((attn, ("pre", block.norm2, _experts_fn(block.ff))))
        else:
            layers.append((attn, ("pre", block.norm2, _module_fn(block.ff))))
    return Plan(embed, layers)


def _experts_fn(moe: nn.Module):
    """A mixture-of-experts block (models/families/moe.py) run on the float64 stream (T, D), its output split by
    expert: [("E{e}", (T, D)), ...] for each expert some token chose, w_e(x_t) · E_e(x_t) on its tokens, 0 elsewhere;
    they sum to the block's output."""
    def run(x: Tensor) -> list[tuple[str, Tensor]]:
        dtype = moe.router.weight.dtype
        rows = x.to(dtype)
        _, chosen, weights = moe.route(rows)  # (T, k) each
        out = []
        for e in sorted(chosen.unique().tolist()):
            token, slot = torch.where(chosen == e)
            part = x.new_zeros(x.shape)
            part[token] = (moe.experts[e](rows[token]) * weights[token, slot, None]).double()
            out.append((f"E{e}", part))
        return out

    return run


def _encoder(encoder_layers: nn.ModuleList, embed: list[tuple[str, Tensor]]) -> Plan:
    """models.blocks.layers.EncoderLayer stacks (the from-scratch classifiers, the translator's encoder)."""
    layers = []
    for layer in encoder_layers:
        a = layer.self_attn
        pre = layer.norm_first
        attn = Attn(a.q_proj, a.k_proj, a.v_proj, a.out_proj, a.n_heads, a.n_heads,
                    layer.norm1 if pre else None, causal=False)
        ff = _module_fn(layer.ff)
        layers.append((attn, ("pre", layer.norm2, ff) if pre else ("post", layer.norm1, ff, layer.norm2)))
    return Plan(embed, layers)


def bert(model: nn.Module, x: Tensor) -> Plan:
    """BertClassifier and the families read into it (RoBERTa's offset positions, DistilBERT without token types,
    ALBERT's and ELECTRA's factorised embeddings projected after their LayerNorm, ALBERT's one shared layer walked
    once per pass)."""
    e, enc = model.bert.embeddings, model.bert
    t = x.size(1)
    word = e.word(x)
    embed = [("token", word[0].double()), ("position", e.position(e.position_ids(t, x.device)).double())]
    types = e.type_part(word)
    if types is not None:
        embed.append((BIAS, types[0].double()))
    embed.append(("__norm__", e.norm))
    if enc.project is not None:
        embed.append(("__linear__", enc.project))
    layers = []
    for layer in enc.layers:

        def ff(h: Tensor, layer=layer) -> Tensor:  # BertLayer's feed-forward with its own activation
            return _call(layer.ff_out, layer.act(_call(layer.ff_in, h)))

        a = layer.self_attn
        attn = Attn(a.q_proj, a.k_proj, a.v_proj, a.out_proj, a.n_heads, a.n_heads, None, causal=False)
        layers.append((attn, ("post", layer.norm1, ff, layer.norm2)))
    return Plan(embed, layers)


def plan(model: nn.Module, ids: Sequence[int]) -> Plan:
    """The walk of ``model`` (its family's, from the registry) over one input's ids."""
    family = registry.family_of(model)
    if family.walk is None:
        raise TypeError(f"no score decomposition for a {type(model).__name__}")
    x = torch.tensor([list(ids)], device=execution_device(model))
    return WALKS[family.walk](model, x)


def text_classifier(model: nn.Module, x: Tensor) -> Plan:
    """TextClassifier: token + position embeddings, then its encoder layers."""
    tok = model.embed(x)
    pos = model.positions(torch.zeros_like(tok))
    return _encoder(model.layers, [("token", tok[0].double()), ("position", pos[0].double())])


def translator(model: nn.Module, x: Tensor) -> Plan:
    """Translator's encoder: token embeddings scaled by √d (Vaswani et al. 2017, §3.4) + position."""
    tok = model.src_embed(x) * model.embed_scale  # Marian without scale_embedding: 1
    pos = model.positions(torch.zeros_like(tok))
    return _encoder(model.encoder, [("token", tok[0].double()), ("position", pos[0].double())])


WALKS = {"gpt": gpt, "bert": bert, "text_classifier": text_classifier, "translator": translator}
