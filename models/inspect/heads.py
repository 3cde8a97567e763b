"""What each head does over a corpus: per-query metrics of attention maps and one accumulator that streams them.

Numpy only (float32 maps in, no torch), so the functions work on any model's attention and in a notebook. Shapes
follow the result containers: weights (L, H, Q, K), rows summing to 1. A *per-query* metric returns (L, H, Q) with
NaN where the query has no such value (query 0 has no previous token); ``query_mean`` turns it into a head's score
(L, H). The accumulator (``HeadAccumulator``) sums them over a corpus one sequence at a time, so no map is kept
after its sequence (models/inspect/atlas.py runs the models; docs/ARCHITECTURE.md "Heads").

Sources of the metrics:
- decoders: previous token, induction and duplicate token on repeated random tokens (Olsson et al. 2022; Wang et
  al. 2023; ``models.analysis.head_roles``, reused), the first-token sink (Xiao et al. 2023);
- encoders: attention to [CLS] / the first token, to [SEP] / the last, to punctuation, to the next and the
  previous token, entropy (Clark et al. 2019, "What does BERT look at?", §3);
- translators: how diagonal the cross-attention is (a band around the length-scaled diagonal) and how much of the
  source it covers (the share of source tokens that receive at least half a target token's attention in total,
  the quantity coverage models keep near 1: Tu et al. 2016);
- images: mean attention distance in pixels (Dosovitskiy et al. 2021, fig. 7; ``analysis.patch_distances``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

PUNCTUATION = set(".,;:!?'\"()[]-–—…/`«»„“”‘’")


def _w(weights: np.ndarray) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float32)
    if w.ndim != 4:
        raise ValueError(f"attention must be (layers, heads, queries, keys), got shape {w.shape}")
    return w


# ------------------------------------------------------------------------------------------ per-query metrics
def previous_token(weights: np.ndarray) -> np.ndarray:
    """Weight from query i to key i − 1 (self-attention): (L, H, Q), NaN at query 0. 1 for a pure previous-token
    head; a uniform causal head gives 1/(i + 1)."""
    w = _w(weights)
    out = np.full(w.shape[:3], np.nan, dtype=np.float32)
    i = np.arange(1, w.shape[2])
    out[..., 1:] = w[..., i, i - 1]
    return out


def next_token(weights: np.ndarray) -> np.ndarray:
    """Weight from query i to key i + 1 (an encoder's self-attention): (L, H, Q), NaN at the last query."""
    w = _w(weights)
    out = np.full(w.shape[:3], np.nan, dtype=np.float32)
    i = np.arange(w.shape[2] - 1)
    out[..., :-1] = w[..., i, i + 1]
    return out


def to_keys(weights: np.ndarray, keys: np.ndarray | Sequence[bool] | Sequence[int], skip_first: bool = False
            ) -> np.ndarray:
    """Total weight each query puts on the chosen keys (a bool mask over K, or key indices): (L, H, Q). The
    first-token sink is ``to_keys(w, [0], skip_first=True)`` (query 0 can only attend to itself in a decoder)."""
    w = _w(weights)
    keys = np.asarray(keys)
    mask = keys if keys.dtype == bool else np.isin(np.arange(w.shape[3]), keys)
    if mask.shape != (w.shape[3],):
        raise ValueError(f"the key mask has {mask.shape} entries for {w.shape[3]} keys")
    out = w[..., mask].sum(-1) if mask.any() else np.zeros(w.shape[:3], np.float32)
    if skip_first:
        out = out.astype(np.float32).copy()
        out[..., 0] = np.nan
    return out.astype(np.float32)


def entropy(weights: np.ndarray, skip_first: bool = False) -> np.ndarray:
    """−Σ_k p log p per query, in nats: (L, H, Q). 0 for a head that looks at one key; log(i + 1) for a uniform
    causal head at query i. ``skip_first``: NaN at query 0 (a decoder's first query has nothing to choose from)."""
    w = _w(weights)
    out = -(w * np.log(np.where(w > 0, w, 1.0))).sum(-1)
    if skip_first:
        out[..., 0] = np.nan
    return out.astype(np.float32)


def attention_distance(weights: np.ndarray, distances: np.ndarray | None = None, skip_first: bool = False
                       ) -> np.ndarray:
    """Attention-weighted mean distance per query, Σ_j w_ij d_ij: (L, H, Q). ``distances`` (Q, K): |i − j| in tokens
    by default, or pixel distances between patch centres (``analysis.patch_distances``)."""
    w = _w(weights)
    q, k = w.shape[2:]
    d = np.abs(np.arange(q)[:, None] - np.arange(k)[None, :]) if distances is None else np.asarray(distances)
    if d.shape != (q, k):
        raise ValueError(f"distances {d.shape} do not match attention {q}×{k}")
    out = (w * d.astype(np.float32)).sum(-1)
    if skip_first:
        out[..., 0] = np.nan
    return out.astype(np.float32)


def duplicate_token(weights: np.ndarray, ids: Sequence[int] | Sequence[str]) -> np.ndarray:
    """Weight from query i on the earlier keys j < i holding the same token (a duplicate-token head, Wang et al.
    2023) in ordinary text: (L, H, Q), NaN where token i has not occurred before."""
    w = _w(weights)
    ids = np.asarray(ids)
    if ids.shape != (w.shape[2],) or w.shape[2] != w.shape[3]:
        raise ValueError(f"{len(ids)} ids for attention of shape {w.shape}")
    same = (ids[:, None] == ids[None, :]) & np.tri(len(ids), k=-1, dtype=bool)  # (Q, K): earlier copies
    out = (w * same).sum(-1).astype(np.float32)
    out[..., ~same.any(-1)] = np.nan
    return out


def diagonality(cross: np.ndarray, band: int = 1) -> np.ndarray:
    """Cross-attention (L, H, T, S) from T target to S source tokens: per target i the weight within ``band``
    source tokens of the length-scaled diagonal j* = i·(S − 1)/(T − 1): (L, H, T). A monotonic one-to-one alignment
    scores 1; a uniform row scores the band's share of the source."""
    w = _w(cross)
    t, s = w.shape[2:]
    centre = np.arange(t) * ((s - 1) / max(t - 1, 1))
    near = np.abs(np.arange(s)[None, :] - centre[:, None]) <= band + 1e-9  # (T, S)
    return (w * near).sum(-1).astype(np.float32)


def coverage(cross: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """Share of source tokens whose attention from all target tokens sums to at least ``threshold``: (L, H), one
    value per sentence. 1 when every source token is attended (a one-to-one alignment); 1/S when every target
    token looks at the same source token."""
    w = _w(cross)
    return (w.sum(2) >= threshold).mean(-1).astype(np.float32)


def query_mean(values: np.ndarray) -> tuple[np.ndarray, int]:
    """A per-query metric (L, H, Q) as each head's mean over the queries that have a value, and how many did."""
    v = np.asarray(values, dtype=np.float32)
    valid = ~np.isnan(v)
    n = int(valid.any((0, 1)).sum())
    if n == 0:
        return np.full(v.shape[:2], np.nan, np.float32), 0
    return (np.where(valid, v, 0).sum(-1) / np.maximum(valid.sum(-1), 1)).astype(np.float32), n


def is_punctuation(token: str) -> bool:
    """A token label that is punctuation once a subword marker (▁, ##) is taken off (byte-level labels are decoded,
    their space shown as ▁: models.inputs.tokenizer.readable_piece)."""
    t = token.replace("▁", "").replace("##", "").strip()
    return bool(t) and all(ch in PUNCTUATION for ch in t)


# ------------------------------------------------------------------------------------------- offsets
def offset_sums(weights: np.ndarray, max_offset: int) -> tuple[np.ndarray, np.ndarray]:
    """Attention at each offset i − j in −max_offset … max_offset (farther offsets are left out): (sums (L, H, 2D+1),
    counts (2D+1,): how many (query, key) cells each offset has), for the mean pattern by offset."""
    w = _w(weights)
    q, k = w.shape[2:]
    off = np.arange(q)[:, None] - np.arange(k)[None, :]
    sums = np.zeros(w.shape[:2] + (2 * max_offset + 1,), np.float64)
    counts = np.zeros(2 * max_offset + 1, np.int64)
    for d in range(-max_offset, max_offset + 1):
        cells = off == d
        if cells.any():
            sums[..., d + max_offset] = w[..., cells].sum(-1)
            counts[d + max_offset] = int(cells.sum())
    return sums, counts


# ------------------------------------------------------------------------------------------- accumulator
@dataclass
class HeadAccumulator:
    """Sums each metric over a corpus, a sequence at a time, and keeps every head's ``top_k`` examples.

    ``add(name, values, example)``: a per-query metric (L, H, Q), or a per-sequence score (L, H) with its
    ``weight``; NaN entries (a Swin block with fewer heads, a query without the value) count nowhere. The corpus
    score of a head is the weighted mean over everything added: a per-query metric's mean over all the corpus's
    queries. ``top`` ranks the examples by their own mean."""

    top_k: int = 3
    max_offset: int = 16
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    top_scores: dict[str, np.ndarray] = field(default_factory=dict)
    top_index: dict[str, np.ndarray] = field(default_factory=dict)
    offsets: np.ndarray | None = None
    offset_counts: np.ndarray | None = None

    def add(self, name: str, values: np.ndarray, example: int = -1, weight: float | None = None) -> None:
        v = np.asarray(values, dtype=np.float32)
        if v.ndim == 3:
            mean, n = query_mean(v)
            w = np.where(np.isnan(mean), 0.0, (~np.isnan(v)).sum(-1)).astype(np.float64)
        elif v.ndim == 2:
            mean, n = v, 1
            w = np.where(np.isnan(v), 0.0, 1.0 if weight is None else float(weight))
        else:
            raise ValueError(f"{name}: values must be (L, H, Q) or (L, H), got {v.shape}")
        if n == 0:
            return
        if name not in self.sums:
            self.sums[name] = np.zeros(mean.shape, np.float64)
            self.weights[name] = np.zeros(mean.shape, np.float64)
            self.top_scores[name] = np.full(mean.shape + (self.top_k,), -np.inf, np.float32)
            self.top_index[name] = np.full(mean.shape + (self.top_k,), -1, np.int64)
        if mean.shape != self.sums[name].shape:
            raise ValueError(f"{name}: shape {mean.shape} after {self.sums[name].shape}")
        self.sums[name] += np.where(w > 0, np.nan_to_num(mean) * w, 0.0)
        self.weights[name] += w
        if example >= 0:
            scores = np.concatenate([self.top_scores[name], np.where(np.isnan(mean), -np.inf, mean)[..., None]], -1)
            index = np.concatenate([self.top_index[name], np.full(mean.shape + (1,), example)], -1)
            order = np.argsort(-scores, -1, kind="stable")[..., : self.top_k]
            self.top_scores[name] = np.take_along_axis(scores, order, -1)
            self.top_index[name] = np.take_along_axis(index, order, -1)

    def add_offsets(self, weights: np.ndarray) -> None:
        sums, counts = offset_sums(weights, self.max_offset)
        if self.offsets is None:
            self.offsets, self.offset_counts = np.zeros_like(sums), np.zeros_like(counts)
        if sums.shape != self.offsets.shape:
            return  # a sequence of another shape (a Swin block): offsets are kept for one shape only
        self.offsets += sums
        self.offset_counts += counts

    def result(self) -> dict[str, np.ndarray]:
        """Each metric's (L, H) corpus mean, float32, NaN where a head got nothing."""
        return {name: np.where(self.weights[name] > 0, self.sums[name] / np.maximum(self.weights[name], 1e-30),
                               np.nan).astype(np.float32) for name in self.sums}

    def offset_profile(self) -> np.ndarray | None:
        """(L, H, 2D + 1): the mean weight at offsets −D … D (NaN where no cell had that offset)."""
        if self.offsets is None:
            return None
        counts = self.offset_counts.astype(np.float64)
        return np.where(counts > 0, self.offsets / np.maximum(counts, 1), np.nan).astype(np.float32)


def rank_heads(grid: np.ndarray, descending: bool = True) -> list[tuple[int, int, float]]:
    """Every head of an (L, H) grid as (layer, head, value), best first; NaN heads last."""
    g = np.asarray(grid, dtype=np.float64)
    key = np.where(np.isnan(g), -np.inf, g if descending else -g).ravel()
    order = np.argsort(-key, kind="stable")
    h = g.shape[1]
    return [(int(i // h), int(i % h), float(g.ravel()[i])) for i in order]
