"""T5 (Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer") as
the project's Translator with the few switches T5 needs; everything else (greedy and beam search over the KV cache,
the attention pass over the chosen hypothesis, ``translate``) is the Translator's.

What differs from Vaswani et al. (2017), and is built here:

- no position embeddings: each attention score gets a learned scalar per head and *bucket* of the offset key − query
  (§2.1, "relative position embeddings"). Offsets below ``num_buckets / 2`` (the encoder: per direction) each have a
  bucket; larger ones share logarithmically wider buckets up to ``max_distance``, beyond which one bucket holds all.
  The encoder's buckets are bidirectional, the decoder's causal; the bias is computed in the first layer and the
  same table is added in every layer (T5 reads ``relative_attention_bias`` only from block 0). Cross-attention has
  none;
- no 1/√d_k: the scores are q·k + bias (the initialisation absorbs the scale, Mesh TensorFlow's convention);
- RMSNorm without bias or mean (T5's "layer norm", Zhang & Sennrich 2019) before each sub-layer (pre-norm), and one
  after each stack; no biases anywhere;
- the feed-forward block: ReLU (T5) or a gated GELU, gelu(x W_0) ⊙ (x W_1) W_o (T5 v1.1 and Flan-T5, Shazeer 2020),
  named by the config's ``feed_forward_proj``;
- one embedding table for the source and the target; the output projection is that table, applied to the decoder
  output × d_model^-0.5 (original T5), or a matrix of its own without the rescale (v1.1, Flan: untied);
- decoding starts from ``<pad>`` (``decoder_start_token_id``) and ends at ``</s>``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from models.blocks.attention import KVCache, MultiHeadAttention, causal_mask, padding_mask
from models.blocks.layers import Activation
from models.families.translator import DecoderState, Translator, TranslatorConfig


@dataclass
class T5Config(TranslatorConfig):
    d_head: int = 64  # d_kv: each head's width; n_heads × d_head need not be d_model (Flan-T5-small: 6 × 64, 512)
    num_buckets: int = 32  # relative_attention_num_buckets (the encoder's: half per direction)
    max_distance: int = 128  # relative_attention_max_distance: offsets from here on share the last bucket
    gated: bool = False  # feed_forward_proj "gated-…": gelu(x W_0) ⊙ (x W_1) (v1.1, Flan); else act(x W_i)
    eps: float = 1e-6  # layer_norm_epsilon of every RMSNorm
    scale_output: bool = True  # the decoder output × d_model^-0.5 before the output projection (tied: T5)
    prefix: str = ""  # the task prefix the tokenizer puts before the text ("translate English to German: ")
    OPTIONAL: ClassVar[tuple[str, ...]] = TranslatorConfig.OPTIONAL + ("prefix",)


def relative_bucket(offset: Tensor, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """T5's bucket of each offset key − query (Raffel et al. 2020, §2.1; Mesh TensorFlow's
    ``_relative_position_bucket``). Bidirectional (the encoder): half the buckets per direction, keys after the query
    in the upper half. Causal (the decoder): only keys at or before the query count, a later key falls in bucket 0.
    Of each half, offsets 0 … n/2 − 1 get a bucket each, larger ones logarithmically wider buckets up to
    ``max_distance``, and everything beyond the last bucket."""
    buckets = torch.zeros_like(offset)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (offset > 0).long() * num_buckets
        distance = offset.abs()
    else:
        distance = -torch.clamp(offset, max=0)
    exact = num_buckets // 2
    large = exact + (torch.log(distance.float() / exact) / math.log(max_distance / exact)
                     * (num_buckets - exact)).long()
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(distance < exact, distance, large)


class RelativeBias(nn.Module):
    """The learned bias of one stack: a scalar per bucket and head, (1, H, T, S) for T queries and S keys."""

    def __init__(self, num_buckets: int, max_distance: int, n_heads: int, bidirectional: bool) -> None:
        super().__init__()
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.table = nn.Embedding(num_buckets, n_heads)  # (buckets, H): relative_attention_bias

    def buckets(self, t: int, s: int, offset: int = 0, device: torch.device | None = None) -> Tensor:
        """(T, S) bucket ids of queries at positions offset … offset + T − 1 and keys at 0 … S − 1."""
        q = torch.arange(t, device=device)[:, None] + offset
        k = torch.arange(s, device=device)[None, :]
        return relative_bucket(k - q, self.bidirectional, self.num_buckets, self.max_distance)

    def forward(self, t: int, s: int, offset: int = 0) -> Tensor:
        b = self.buckets(t, s, offset, self.table.weight.device)
        return self.table(b).permute(2, 0, 1)[None]  # (1, H, T, S)

    def by_offset(self, offsets: Sequence[int]) -> np.ndarray:
        """(H, len(offsets)) the bias each head adds at each offset key − query (the Positional tab's curves)."""
        o = torch.tensor(list(offsets), device=self.table.weight.device)
        b = relative_bucket(o, self.bidirectional, self.num_buckets, self.max_distance)
        return self.table.weight[b].T.detach().float().cpu().numpy()


class T5FeedForward(nn.Module):
    """act(x W_i) W_o, or gated: act(x W_0) ⊙ (x W_1) W_o (Shazeer 2020, "GLU Variants Improve Transformer")."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str, gated: bool) -> None:
        super().__init__()
        self.gated = gated
        self.wi = nn.Linear(d_model, d_ff, bias=False)  # W_0 when gated
        self.wi_1 = nn.Linear(d_model, d_ff, bias=False) if gated else None
        self.wo = nn.Linear(d_ff, d_model, bias=False)
        self.act = Activation(activation)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.wi(x))
        if self.wi_1 is not None:
            h = h * self.wi_1(x)
        return self.wo(self.drop(h))


def _attention(c: T5Config) -> MultiHeadAttention:
    return MultiHeadAttention(c.d_model, c.n_heads, c.dropout, bias=False, d_head=c.d_head, scale=1.0)


class T5EncoderLayer(nn.Module):
    """x + SelfAttn(RMSNorm(x)) with the stack's bias, then x + FF(RMSNorm(x))."""

    def __init__(self, c: T5Config) -> None:
        super().__init__()
        self.norm_first = True
        self.self_attn = _attention(c)
        self.ff = T5FeedForward(c.d_model, c.d_ff, c.dropout, c.activation, c.gated)
        self.norm1, self.norm2 = nn.RMSNorm(c.d_model, eps=c.eps), nn.RMSNorm(c.d_model, eps=c.eps)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: Tensor, mask: Tensor | None, need_weights: bool = False,
                bias: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        a, w = self.self_attn(self.norm1(x), mask=mask, need_weights=need_weights, bias=bias)
        x = x + self.drop(a)
        return x + self.drop(self.ff(self.norm2(x))), w


class T5DecoderLayer(nn.Module):
    """Causal self-attention with the decoder's bias, cross-attention without one, feed-forward; each pre-norm."""

    def __init__(self, c: T5Config) -> None:
        super().__init__()
        self.self_attn, self.cross_attn = _attention(c), _attention(c)
        self.ff = T5FeedForward(c.d_model, c.decoder_ff, c.dropout, c.activation, c.gated)
        self.norm1, self.norm2, self.norm3 = (nn.RMSNorm(c.d_model, eps=c.eps) for _ in range(3))
        self.drop = nn.Dropout(c.dropout)

    def forward(self, y: Tensor, memory: Tensor | None, self_mask: Tensor | None, mem_mask: Tensor | None,
                need_weights: bool = False, cache: tuple[KVCache, KVCache] | None = None,
                bias: Tensor | None = None) -> tuple[Tensor, Tensor | None, Tensor | None]:
        sc, cc = cache if cache is not None else (None, None)
        a, ws = self.self_attn(self.norm1(y), mask=self_mask, need_weights=need_weights, cache=sc, bias=bias)
        y = y + self.drop(a)
        a, wc = self.cross_attn(self.norm2(y), memory, mask=mem_mask, need_weights=need_weights, cache=cc)
        y = y + self.drop(a)
        return y + self.drop(self.ff(self.norm3(y))), ws, wc


class T5(Translator):
    """T5ForConditionalGeneration's computation under the Translator's names (src_embed, encoder, decoder,
    enc_norm, dec_norm, generator), so that its search, KV cache and attention pass run unchanged."""

    def __init__(self, config: T5Config, tokenizer=None) -> None:
        nn.Module.__init__(self)  # the Translator's modules are built here, T5's way
        self.config = c = config
        self.tokenizer = tokenizer
        self.labels: list[str] = []
        self.src_embed = nn.Embedding(c.vocab_size, c.d_model)  # "shared": encoder and decoder read one table
        self.tgt_embed = self.src_embed
        self.drop = nn.Dropout(c.dropout)
        self.enc_bias = RelativeBias(c.num_buckets, c.max_distance, c.n_heads, bidirectional=True)
        self.dec_bias = RelativeBias(c.num_buckets, c.max_distance, c.n_heads, bidirectional=False)
        self.encoder = nn.ModuleList(T5EncoderLayer(c) for _ in range(c.n_enc_layers))
        self.decoder = nn.ModuleList(T5DecoderLayer(c) for _ in range(c.n_dec_layers))
        self.enc_norm, self.dec_norm = nn.RMSNorm(c.d_model, eps=c.eps), nn.RMSNorm(c.d_model, eps=c.eps)
        self.generator = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_output:
            self.generator.weight = self.src_embed.weight

    @property
    def embed_scale(self) -> float:
        return 1.0  # T5 feeds its embeddings as they are

    def _embed(self, emb: nn.Embedding, ids: Tensor, offset: int = 0) -> Tensor:
        return self.drop(emb(ids))  # no position embedding: positions enter through the bias only

    def _project(self, y: Tensor) -> Tensor:
        """The final RMSNorm, the tied table's d_model^-0.5 rescale, the output projection."""
        y = self.dec_norm(y)
        if self.config.scale_output:
            y = y * self.config.d_model ** -0.5
        return self.generator(y)

    def encode(self, src: Tensor, need_weights: bool = False,
               src_pad: Tensor | None = None) -> tuple[Tensor, Tensor | None, list[Tensor]]:
        mask = padding_mask(src == self.config.pad_id if src_pad is None else src_pad)
        bias = self.enc_bias(src.size(1), src.size(1))  # (1, H, S, S), computed once, added in every layer
        x, weights = self._embed(self.src_embed, src), []
        for layer in self.encoder:
            x, w = layer(x, mask, need_weights, bias)
            if w is not None:
                weights.append(w)
        return self.drop(self.enc_norm(x)), mask, weights

    def decode(self, tgt: Tensor, memory: Tensor, mem_mask: Tensor | None, need_weights: bool = False,
               last_only: bool = False) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        t = tgt.size(1)
        y = self._embed(self.tgt_embed, tgt)
        self_mask, bias = causal_mask(t, device=tgt.device), self.dec_bias(t, t)
        self_ws, cross_ws = [], []
        for layer in self.decoder:
            y, ws, wc = layer(y, memory, self_mask, mem_mask, need_weights, bias=bias)
            if ws is not None and wc is not None:
                self_ws.append(ws)
                cross_ws.append(wc)
        if last_only:
            y = y[:, -1:]
        return self._project(self.drop(y)), self_ws, cross_ws

    def decode_step(self, tokens: Tensor, state: DecoderState) -> Tensor:
        n = state.length  # the new token's position: its bias row is offset n over keys 0 … n
        y = self._embed(self.tgt_embed, tokens)
        bias = self.dec_bias(1, n + 1, offset=n)
        for layer, cache in zip(self.decoder, state.caches):
            y, _, _ = layer(y, None, None, state.mem_mask, cache=cache, bias=bias)
        return torch.log_softmax(self._project(y[:, -1]).float(), dim=-1)

    def default_max_len(self, src_len: int) -> int:
        return min(self.config.max_len - 1, 2 * src_len + 10)


@dataclass(frozen=True)
class BiasSplit:
    """One encoder score of T5 split into its two terms: content q_i·k_j and the relative position bias."""

    layer: int
    head: int
    query: int
    key: int
    content: float  # q_i · k_j (no 1/√d_k in T5)
    position: float  # the head's learned bias of the offset's bucket
    bucket: int
    score: float  # the score the model computed: content + position
    row: list[float]  # the query's scores over every key
    softmax_row: list[float]  # their softmax: the attention row


@torch.no_grad()
def _encoder_scores(model: T5, ids: Sequence[int], upto: int) -> tuple[list[Tensor], list[Tensor], Tensor]:
    """Run the encoder on ids through layer ``upto``: per layer (q (H, T, d), k (H, T, d)) float32, and the bias
    (H, T, T)."""
    dev = model.src_embed.weight.device
    x = model.src_embed(torch.tensor([list(ids)], device=dev))
    bias = model.enc_bias(x.size(1), x.size(1)).float()
    qs, ks = [], []
    for i, layer in enumerate(model.encoder):
        a, h = layer.self_attn, layer.norm1(x)
        qs.append(a._split(a.q_proj(h))[0].float())
        ks.append(a._split(a.k_proj(h))[0].float())
        if i == upto:
            break
        x, _ = layer(x, None, False, bias.to(x.dtype))
    return qs, ks, bias[0]


def encoder_qk(model: T5, ids: Sequence[int], layer: int) -> tuple[Tensor, Tensor, Tensor]:
    """Layer ``layer``'s queries and keys (H, T, d) and the bias it adds to their products (H, T, T)."""
    qs, ks, bias = _encoder_scores(model, ids, layer)
    return qs[layer], ks[layer], bias


def pre_softmax_scores(model: T5, ids: Sequence[int]) -> Tensor:
    """Every encoder layer's scores q·k + bias (layers, H, T, T), float32."""
    qs, ks, bias = _encoder_scores(model, ids, len(model.encoder) - 1)
    return torch.stack([q @ k.transpose(-1, -2) + bias for q, k in zip(qs, ks)])


def bias_split(model: T5, ids: Sequence[int], layer: int, head: int, query: int, key: int) -> BiasSplit:
    """The encoder score of ``head`` in ``layer`` from token ``query`` to ``key`` as content + relative position."""
    q, k, bias = encoder_qk(model, ids, layer)
    q64, k64 = q[head].double(), k[head].double()
    row = (q64 @ k64.T)[query] + bias[head, query].double()
    content = float(q64[query] @ k64[key])
    bucket = int(relative_bucket(torch.tensor(key - query), True, model.config.num_buckets,
                                 model.config.max_distance))
    return BiasSplit(layer, head, query, key, content, float(bias[head, query, key]), bucket, float(row[key]),
                     row.tolist(), torch.softmax(row, -1).tolist())
