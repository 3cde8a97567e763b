"""DeBERTa-v2 / v3 (He et al. 2021, "DeBERTa: Decoding-enhanced BERT with Disentangled Attention"): BERT's post-norm
encoder whose attention keeps content and relative position apart.

Each token has a content vector h_i; each relative distance δ a learned position vector r_δ (one table shared by all
layers, LayerNorm'd once). The score of query i and key j adds three terms (§3.1, eq. 4; DeBERTa-v2's shared
projections, ``share_att_key``: the position vectors go through the layer's own W_q and W_k):

    c2c = q_i · k_j                         content → content   (q = W_q h + b_q, k = W_k h + b_k)
    c2p = q_i · (W_k r_δ(i,j) + b_k)        content → position  (the query's content reads the key's distance)
    p2c = k_j · (W_q r_δ(i,j) + b_q)        position → content  (eq. 4 writes δ(j, i); with the odd bucket map
                                                                  below it indexes the same row of r)
    score_ij = (c2c + c2p + p2c) / √(3 d)   (the scale counts the terms, §3.1)

δ(i, j) = bucket(i − j) + k, clamped to [0, 2k): distances within ±k/2 keep their own bucket, longer ones share
logarithmic buckets up to ``max_relative_positions`` (DeBERTa-v2's ``make_log_bucket_position``), k =
``position_buckets``. v3 has no absolute positions in its input (``position_biased_input`` false).

``disentangled_split`` returns the three terms of one score (they sum to it; tests/test_families_deberta.py checks
them against transformers' ``DebertaV2ForSequenceClassification``). Patching and every explanation run through
``BertClassifier``'s paths: only the encoder differs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from models.blocks.attention import (
    LayerEdit,
    MultiHeadAttention,
    attend,
    edit_heads,
    enter_layer,
    padding_mask,
    restrict_keys,
)
from models.families.bert import BertClassifier, BertConfig, BertLayer, _init_weights


@dataclass
class DebertaConfig(BertConfig):
    family: str = "deberta-v2"
    pooler_act: str = "gelu"  # ContextPooler: dense then GELU on the [CLS] state
    position_biased_input: bool = False  # absolute positions added to the input (v2: true, v3: false)
    position_buckets: int = 256  # k: relative distances kept apart (v3: 256)
    max_relative_positions: int = 512  # the longest distance the log buckets reach
    c2p: bool = True  # content → position term
    p2c: bool = True  # position → content term
    norm_rel_ebd: bool = True  # LayerNorm on the relative position table (v3's norm_rel_ebd "layer_norm")

    @property
    def span(self) -> int:
        """k: the table has 2k rows, distances −k … k − 1 after bucketing."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative_positions


def log_bucket(rel: Tensor, buckets: int, max_position: int) -> Tensor:
    """DeBERTa-v2's bucket of each relative distance (long → long): itself within ±buckets/2, else
    sign · (mid + ⌈log(|δ| / mid) / log((max_position − 1) / mid) · (mid − 1)⌉), mid = buckets // 2; odd in δ."""
    sign = torch.sign(rel)
    mid = buckets // 2
    abs_pos = torch.where((rel < mid) & (rel > -mid), torch.tensor(mid - 1).type_as(rel), torch.abs(rel))
    log_pos = torch.ceil(torch.log(abs_pos / mid) / torch.log(torch.tensor((max_position - 1) / mid))
                         * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, rel.type_as(log_pos), log_pos * sign).long()


def relative_index(n: int, c: DebertaConfig, device: torch.device | None = None) -> Tensor:
    """(n, n) row of the relative table for query i and key j: clamp(bucket(i − j) + k, 0, 2k − 1)."""
    pos = torch.arange(n, device=device)
    rel = pos[:, None] - pos[None, :]
    if c.position_buckets > 0 and c.max_relative_positions > 0:
        rel = log_bucket(rel, c.position_buckets, c.max_relative_positions)
    return (rel + c.span).clamp(0, 2 * c.span - 1)


class DisentangledAttention(MultiHeadAttention):
    """Multi-head attention with DeBERTa's content/position terms (module docstring); the q/k/v/out projections,
    masks, interventions and both attention paths are MultiHeadAttention's."""

    def __init__(self, c: DebertaConfig) -> None:
        super().__init__(c.d_model, c.n_heads, c.attention_dropout)
        self.c2p, self.p2c = c.c2p, c.p2c
        self.factor = 1 + int(c.c2p) + int(c.p2c)  # score scale √(factor · d)

    def terms(self, q: Tensor, k: Tensor, rel: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
        """(c2p, p2c), each (B, H, T, T) and already divided by √(factor · d), from per-head q, k (B, H, T, d), the
        normed relative table rel (2k, D) and the index (T, T)."""
        scale = math.sqrt(self.d_head * self.factor)
        shape = (q.size(0), q.size(1), q.size(2), index.size(-1))
        zero = q.new_zeros(shape)
        c2p = p2c = zero
        if self.c2p:  # q_i · pk[δ(i, j)]: gather each query's row of distances
            pk = self._split(self.k_proj(rel)[None])  # (1, H, 2k, d)
            c2p = (q @ pk.transpose(-1, -2)).gather(-1, index.expand(shape)) / scale
        if self.p2c:  # k_j · pq[δ(i, j)]: per key j its row of distances, gathered at δ(i, j), then (i, j)
            pq = self._split(self.q_proj(rel)[None])
            p2c = (k @ pq.transpose(-1, -2)).gather(-1, index.T.expand(shape)).transpose(-1, -2) / scale
        return c2p, p2c

    def forward(self, x: Tensor, mask: Tensor | None = None, need_weights: bool = False,
                edit: LayerEdit | None = None, rel: Tensor | None = None,
                index: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """x (B, T, D); rel (2k, D) normed relative table; index (T, T). Returns (out (B, T, D), weights or None)."""
        b, t, _ = x.shape
        q, k, v = self._split(self.q_proj(x)), self._split(self.k_proj(x)), self._split(self.v_proj(x))
        assert rel is not None and index is not None
        c2p, p2c = self.terms(q, k, rel, index)
        mask = restrict_keys(mask, edit, t, t, x.device)
        # c2c = q·k / √(factor·d): attend divides by √d, so q enters divided by √factor
        out, weights = attend(q / math.sqrt(self.factor), k, v, mask, c2p + p2c, need_weights,
                              self.dropout if self.training else 0.0)
        out = edit_heads(out, edit).transpose(1, 2).reshape(b, t, self.d_model)
        return self.out_proj(out), weights


class DebertaLayer(BertLayer):
    """BertLayer (post-norm, GELU feed-forward) with disentangled attention."""

    def __init__(self, c: DebertaConfig) -> None:
        super().__init__(c)
        self.self_attn = DisentangledAttention(c)

    def forward(self, x: Tensor, mask: Tensor | None = None, need_weights: bool = False,
                edit: LayerEdit | None = None, rel: Tensor | None = None,
                index: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        a, w = self.self_attn(x, mask=mask, need_weights=need_weights, edit=edit, rel=rel, index=index)
        x = self.norm1(x + self.drop(a))
        return self.norm2(x + self.drop(self.feed_forward(x))), w


class DebertaEmbeddings(nn.Module):
    """Word embeddings (+ absolute positions only where ``position_biased_input``, + token types where any), then
    LayerNorm and dropout."""

    def __init__(self, c: DebertaConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        self.position = nn.Embedding(c.max_positions, c.d_model) if c.position_biased_input else None
        self.token_type = nn.Embedding(c.type_vocab_size, c.d_model) if c.type_vocab_size > 0 else None
        self.norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
        self.drop = nn.Dropout(c.dropout)

    def embed(self, word: Tensor, token_types: Tensor | None = None) -> Tensor:
        x = word
        if self.position is not None:
            x = x + self.position(torch.arange(word.size(1), device=word.device))
        if self.token_type is not None:
            types = torch.zeros(word.shape[:2], dtype=torch.long, device=word.device) if token_types is None \
                else token_types
            x = x + self.token_type(types)
        return self.drop(self.norm(x))


class DebertaEncoder(nn.Module):
    """Embeddings, the relative position table (normed once, shared by every layer) and the layers."""

    def __init__(self, c: DebertaConfig) -> None:
        super().__init__()
        self.config = c
        self.embeddings = DebertaEmbeddings(c)
        self.project = None  # the BertEncoder interface: no factorised embeddings here
        self.layers = nn.ModuleList(DebertaLayer(c) for _ in range(c.n_layers))
        self.rel_embeddings = nn.Embedding(2 * c.span, c.d_model)
        self.rel_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.norm_rel_ebd else nn.Identity()

    def relative(self, n: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """(the normed table (2k, D), the index (n, n))."""
        return self.rel_norm(self.rel_embeddings.weight), relative_index(n, self.config, device)

    def forward_embedded(self, word: Tensor, pad_mask: Tensor | None = None, token_types: Tensor | None = None,
                         need_weights: bool = False,
                         edits: Sequence[LayerEdit | None] | None = None) -> tuple[list[Tensor], list[Tensor]]:
        """As ``BertEncoder.forward_embedded``: (hidden states L + 1 × (B, N, D), weights L × (B, H, N, N))."""
        mask = None if pad_mask is None else padding_mask(pad_mask)
        x = self.embeddings.embed(word, token_types)
        rel, index = self.relative(word.size(1), word.device)
        states, weights = [x], []
        for layer, e in zip(self.layers, edits or [None] * len(self.layers)):
            x = enter_layer(x, e)
            x, w = layer(x, mask, need_weights, e, rel, index)
            states.append(x)
            if w is not None:
                weights.append(w)
        return states, weights


class DebertaClassifier(BertClassifier):
    """DeBERTa encoder + ContextPooler (dense, GELU on [CLS]) + linear head: BertClassifier's interface and paths."""

    def __init__(self, config: DebertaConfig, tokenizer=None) -> None:
        super().__init__(config, tokenizer)
        self.bert = DebertaEncoder(config)
        self.apply(_init_weights)


@torch.no_grad()
def pre_softmax_scores(model: DebertaClassifier, ids: Sequence[int]) -> Tensor:
    """Every layer's pre-softmax scores (L, H, T, T) of one input, c2c + c2p + p2c, float64 (the "scores" of the
    downloads; ``models.inspect.decompose.attention_scores`` answers with these for DeBERTa)."""
    terms, _ = _terms(model, ids, model.config.n_layers - 1)
    return torch.stack([(c2c + c2p + p2c)[0] for c2c, c2p, p2c in terms])


Terms = tuple[Tensor, Tensor, Tensor]  # (c2c, c2p, p2c) of one layer


def _terms(model: DebertaClassifier, ids: Sequence[int], last: int) -> tuple[list[Terms], Tensor]:
    """(c2c, c2p, p2c), each (1, H, T, T) float64, of layers 0 … ``last`` for one input in one pass, and the
    relative index (T, T). The model runs as it is (its own dtype; nothing on it changes, so concurrent requests can
    share it); the terms are taken to float64 after."""
    enc, n = model.bert, len(ids)
    device = enc.rel_embeddings.weight.device
    x = enc.embeddings.embed(enc.embeddings.word(torch.tensor([list(ids)], device=device)))
    rel, index = enc.relative(n, device)
    found = []
    for lay in enc.layers[: last + 1]:
        a = lay.self_attn
        q, k = a._split(a.q_proj(x)), a._split(a.k_proj(x))
        c2p, p2c = a.terms(q, k, rel, index)
        c2c = (q @ k.transpose(-1, -2)) / math.sqrt(a.d_head * a.factor)
        found.append((c2c.double(), c2p.double(), p2c.double()))
        x, _ = lay(x, None, False, None, rel, index)
    return found, index


@dataclass(frozen=True)
class DisentangledSplit:
    """One pre-softmax score of a DeBERTa head split into its three terms (they sum to ``score``)."""

    layer: int
    head: int
    query: int
    key: int
    c2c: float  # content → content
    c2p: float  # content → position
    p2c: float  # position → content
    score: float  # the model's score, c2c + c2p + p2c
    distance: int  # i − j
    bucket: int  # the row of the relative table, δ(i, j)
    row: list[float]  # the query's scores over every key
    softmax_row: list[float]  # softmax(row): the attention row the model returns


@torch.no_grad()
def disentangled_split(model: DebertaClassifier, ids: Sequence[int], layer: int, head: int, query: int,
                       key: int) -> DisentangledSplit:
    """The three terms of ``head``'s score from ``query`` to ``key`` in ``layer`` for one input (ids, specials
    included), from the model's own layers (the terms in float64)."""
    c, n = model.config, len(ids)
    if not 0 <= layer < c.n_layers or not 0 <= head < c.n_heads:
        raise ValueError(f"layer {layer} or head {head} is outside 0..{c.n_layers - 1} / 0..{c.n_heads - 1}")
    if not (0 <= query < n and 0 <= key < n):
        raise ValueError(f"query {query} or key {key} is outside the {n} tokens")
    terms, index = _terms(model, ids, layer)
    c2c, c2p, p2c = terms[layer]
    scores = (c2c + c2p + p2c)[0, head]
    return DisentangledSplit(layer, head, query, key, float(c2c[0, head, query, key]), float(c2p[0, head, query, key]),
                             float(p2c[0, head, query, key]), float(scores[query, key]), query - key,
                             int(index[query, key]), scores[query].tolist(), torch.softmax(scores[query], -1).tolist())
