"""One head's queries and keys in one picture, AttentionViz-style (Yeh et al. 2023, "AttentionViz: A Global View
of Transformer Attention", §4: a joint embedding of the query and key vectors of a head).

For a layer and head, the query vectors q_i and key vectors k_j of an input exactly as the model computes them
(after the projection biases, after RoPE for RoPE models; for post-norm models the projection reads the stream
as it leaves the previous layer's LayerNorm) are read from the model's walk (``models.inspect.walk.plan``: the same
walk whose softmax reproduces the model's attention, tests/test_decompose.py). Two changes make the picture
readable without changing the attention (AttentionViz §4.2):

- scaling: q_i → α q_i and k_j → k_j / α leaves every q_i·k_j as it was. α² = mean_j ‖k_j − k̄‖ / mean_i ‖q_i − q̄‖,
  so both clouds have the same mean spread about their own centroid (AttentionViz equalises the mean norms; about
  the centroids, so that a key bias, which translation removes anyway, does not set the scale);
- translation: every scaled key moves by c = α q̄ − k̄ / α, so both centroids coincide. (α q_i)·(k_j / α + c) =
  q_i·k_j + α q_i·c: a constant added to row i of the scores, which the softmax ignores.

The stacked, shown vectors [α q; k / α + c] (2T, d) are then projected on their first two principal axes (PCA by
SVD of the centred stack). A query lands near the keys it attends to most only as far as two axes can say;
``explained`` reports how much of the spread they carry.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from models.inspect.decompose import _walk, n_layers
from models.inspect.walk import plan


@dataclass(frozen=True)
class QKProjection:
    """One head's queries and keys over an input of T tokens, and their joint 2-D projection (float32)."""

    layer: int
    head: int
    queries: np.ndarray  # (T, d) q_i as the model computes them: biases and RoPE included, before any change here
    keys: np.ndarray  # (T, d) k_j of the head's key-value group (grouped-query attention shares them)
    alpha: float  # queries are shown × alpha, keys ÷ alpha (1.0 when not scaled)
    shift: np.ndarray  # (d,) added to every key / alpha: the key centroid onto the query centroid
    points: np.ndarray  # (2T, 2) the shown vectors on the two principal axes: queries (rows 0..T−1), then keys
    axes: np.ndarray  # (2, d) the principal axes (unit rows; zeros where the stack has fewer dimensions)
    explained: np.ndarray  # (2,) the fraction of the stack's variance along each axis
    scores: np.ndarray  # (T, T) q_i·k_j/√d_k, the model's pre-softmax scores (masked cells −inf)
    weights: np.ndarray  # (T, T) softmax of each row: the head's attention
    causal: bool  # whether a query sees only the keys up to its own position

    @property
    def shown_queries(self) -> np.ndarray:
        """(T, d) α q_i: the query points before the projection."""
        return self.queries * np.float32(self.alpha)

    @property
    def shown_keys(self) -> np.ndarray:
        """(T, d) k_j / α + c: the key points before the projection (centroid on the shown queries' one)."""
        return self.keys / np.float32(self.alpha) + self.shift

    @property
    def d_head(self) -> int:
        return int(self.queries.shape[1])


def check(model: nn.Module, ids: Sequence[int], layer: int, head: int) -> None:
    """Refuse, in words, an empty input or a layer or head outside the model (ValueError)."""
    layers, heads = n_layers(model), int(model.config.n_heads)
    if len(ids) < 1:
        raise ValueError("the input is empty")
    if not 0 <= layer < layers:
        raise ValueError(f"layer {layer} is outside 0..{layers - 1}")
    if not 0 <= head < heads:
        raise ValueError(f"head {head} is outside 0..{heads - 1}")


@torch.no_grad()
def qk_vectors(model: nn.Module, ids: Sequence[int], layer: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Every head's queries (H, T, d) and keys (H, T, d) of ``layer`` (a key-value group's keys repeated for each
    of its query heads), float64 on the model's device, and whether the layer is causal. The walk stops at
    ``layer``: nothing after it runs. Raises ValueError as ``check``."""
    check(model, ids, layer, 0)
    if getattr(model.config, "family", "") == "t5":  # T5's encoder: RMSNorm, no biases (models/families/t5.py)
        from models.families.t5 import encoder_qk

        q, k, _ = encoder_qk(model, ids, layer)
        return q.double(), k.double(), False
    positions = range(len(ids))
    for i, attn, inp, _, _ in _walk(plan(model, ids), []):
        if i == layer:
            q = attn.queries(inp.total, positions, bias=True)  # (H, T, d), RoPE at each position
            k = attn.keys(inp.total, positions, bias=True).repeat_interleave(attn.group(), 0)
            return q, k, attn.causal
    raise AssertionError("unreachable: check() bounds the layer")


def project(queries: np.ndarray, keys: np.ndarray, scale: bool = True
            ) -> tuple[float, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """AttentionViz's normalisation and a joint PCA of ``queries`` (T, d) and ``keys`` (T, d), in float64:
    (alpha, shift (d,), points (2T, 2), axes (2, d), explained (2,)). Each axis's sign is fixed so that its
    largest loading is positive, so the picture does not flip between calls on similar inputs."""
    q, k = np.asarray(queries, np.float64), np.asarray(keys, np.float64)
    alpha = 1.0
    if scale:
        spread_q = np.linalg.norm(q - q.mean(0), axis=1).mean()
        spread_k = np.linalg.norm(k - k.mean(0), axis=1).mean()
        if spread_q > 0 and spread_k > 0:
            alpha = math.sqrt(spread_k / spread_q)
    shift = alpha * q.mean(0) - k.mean(0) / alpha
    stack = np.concatenate([alpha * q, k / alpha + shift])  # (2T, d)
    centred = stack - stack.mean(0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)  # rows of vt: principal axes, s descending
    axes = np.zeros((2, q.shape[1]))
    n = min(2, vt.shape[0])
    axes[:n] = vt[:n]
    for a in axes:
        top = int(np.argmax(np.abs(a)))
        if a[top] < 0:
            a *= -1
    total = float((s**2).sum())
    explained = np.zeros(2)
    if total > 0:
        explained[:n] = s[:n] ** 2 / total
    return alpha, shift, centred @ axes.T, axes, explained


def qk_projection(model: nn.Module, ids: Sequence[int], layer: int, head: int, scale: bool = True) -> QKProjection:
    """The queries and keys of ``head`` in ``layer`` over ``ids`` (the token ids exactly as the model reads them:
    BOS / [CLS] included; the translator's encoder for a Translator) and their AttentionViz projection.

    ``scale``: AttentionViz's q × α, k ÷ α (module docstring); False keeps α = 1 (translation only). Raises
    ValueError in words for an empty input or a layer or head outside the model."""
    check(model, ids, layer, head)
    q, k, causal = qk_vectors(model, ids, layer)
    return from_vectors(q[head], k[head], layer, head, causal, scale)


def from_vectors(q: torch.Tensor, k: torch.Tensor, layer: int, head: int, causal: bool,
                 scale: bool = True, score_scale: float | None = None,
                 bias: torch.Tensor | None = None) -> QKProjection:
    """A ``QKProjection`` from one head's queries (T, d) and keys (T, d) (any float dtype, any device); the scores
    and their softmax in float64, returned as float32. ``score_scale``: the model's (None: 1/√d; T5: 1); ``bias``
    (T, T): what the model adds to q·k (T5's relative position bias)."""
    t, d = q.shape
    s = q.double() @ k.double().T * (1 / math.sqrt(d) if score_scale is None else score_scale)  # (T, T)
    if bias is not None:
        s = s + bias.to(s.device, s.dtype)
    if causal:
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    w = torch.softmax(s, -1)
    queries, keys = q.double().cpu().numpy(), k.double().cpu().numpy()
    alpha, shift, points, axes, explained = project(queries, keys, scale)
    f = np.float32
    return QKProjection(layer, head, queries.astype(f), keys.astype(f), float(alpha), shift.astype(f),
                        points.astype(f), axes.astype(f), explained.astype(f), s.float().cpu().numpy(),
                        w.float().cpu().numpy(), bool(causal))
