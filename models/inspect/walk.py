"""Each family's *walk*: how its residual stream is built, layer by layer, as the score split
(models/inspect/decompose.py) and its tests read it (docs/ARCHITECTURE.md §2, "why a head attends").

A walk maps a model and one input's ids to a ``Plan``: the embedding parts (token, position, constant terms, an
embedding norm) and per layer its self-attention (``Attn``: the q/k/v/o projections, heads, the pre-norm or None for
post-norm, causal or not, RoPE angles) and what follows it (a pre-norm feed-forward, or post-norm's two norms around
it). The registry names each family's walk (``models.registry.Family.walk``); ``plan`` dispatches on it, so no class
name is checked anywhere. A new family with a walk adds one function here, named in its registration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models import registry
from models.blocks.positional import apply_rope

BIAS = "bias"


def _linear(x: Tensor, m: nn.Linear, bias: bool) -> Tensor:
    return F.linear(x, m.weight.double(), m.bias.double() if bias and m.bias is not None else None)


def _call(module: nn.Module, x: Tensor) -> Tensor:
    """A module that is not split (a feed-forward block) run on the float64 stream, in its own dtype."""
    dtype = next(module.parameters()).dtype
    return module(x.to(dtype)).double()


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

    @property
    def d_head(self) -> int:
        return self.q.out_features // self.n_heads

    def heads(self, x: Tensor, m: nn.Linear, n: int, bias: bool) -> Tensor:
        """(…, T, D) -> (…, n, T, d): one projection split into heads."""
        y = _linear(x, m, bias)
        return y.view(*y.shape[:-1], n, self.d_head).transpose(-3, -2)

    def queries(self, x: Tensor, positions: Sequence[int], bias: bool, rotate: bool = True) -> Tensor:
        q = self.heads(x, self.q, self.n_heads, bias)  # (…, H, P, d)
        if self.angles is not None and rotate:
            q = _rotate(q, self.angles[list(positions)], self.layout)
        return q

    def keys(self, x: Tensor, positions: Sequence[int], bias: bool, rotate: bool = True) -> Tensor:
        """Keys at ``positions``."""
        k = self.heads(x, self.k, self.kv_heads, bias)
        if self.angles is not None and rotate:
            k = _rotate(k, self.angles[list(positions)], self.layout)
        return k

    def group(self) -> int:
        return self.n_heads // self.kv_heads


def _rotate(x: Tensor, angles: Tensor, layout: str) -> Tensor:
    return apply_rope(x, angles.double(), layout)


@dataclass
class Plan:
    """How one model is walked: the embedding parts, then per layer its attention and what follows it."""

    embed: list[tuple[str, Tensor]]  # (name, (T, D) float64)
    # (attention, what follows it): ("pre", norm2, ff) or ("post", norm1, ff, norm2); ff maps float64 (T, D)
    layers: list[tuple[Attn, tuple]]


def gpt(model: nn.Module, x: Tensor) -> Plan:
    c, t = model.config, x.size(1)
    embed = [("token", model.embed(x)[0].double())]
    if model.positions is not None:
        embed.append(("position", model.positions(torch.arange(t, device=x.device)).double()))
    layers = []
    for block in model.blocks:
        a = block.attn
        attn = Attn(a.q_proj, a.k_proj, a.v_proj, a.o_proj, c.n_heads, c.kv_heads, block.norm1, causal=True,
                    angles=None if c.recipe != "llama" else model.angles, layout=c.rope_layout)
        layers.append((attn, ("pre", block.norm2, _module_fn(block.ff))))
    return Plan(embed, layers)


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
    x = torch.tensor([list(ids)], device=next(model.parameters()).device)
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
