"""Where a vision-language model looks when it speaks: readings of a ``models.outputs.DescribeResult`` (the Image +
text tab, lesson 10, the tests).

- ``image_row`` / ``text_row``: one query's attention to the image tokens / to the text tokens, for a range of
  layers and the mean, the max or one head.
- ``compare``: raw attention against gradient relevance for the same token: the image token each points at, whether
  they point at the same place, and the rank correlation over the image tokens (Spearman), in words.
- ``sinks``: visual attention sinks, image tokens that take a large share of the text's attention whatever the text
  asks (Kang et al. 2025, "See What You Are Told: Visual Attention Sink in Large Multimodal Models"; the high-norm
  "register" tokens of Darcet et al. 2024 in vision towers).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.outputs import DescribeResult

SINK_FACTOR = 4.0  # a sink takes at least this many times the mean image token's share ...
SINK_ROWS = 0.9  # ... from at least this fraction of the text positions (whatever each asks)


def _reduce(w: np.ndarray, layers: tuple[int, int], head: str | int) -> np.ndarray:
    """(L, H, K) -> (K,): the mean over the layers lo..hi (inclusive), then the mean, the max or one head."""
    lo, hi = layers
    w = w[lo:hi + 1].mean(axis=0)
    if head == "mean":
        return w.mean(axis=0)
    if head == "max":
        return w.max(axis=0)
    return w[int(head)]


def check_layers(r: DescribeResult, layers: tuple[int, int]) -> tuple[int, int]:
    """(lo, hi) ordered and inside the model's layers, or ValueError in words."""
    n = r.attention.shape[0]
    lo, hi = sorted(int(v) for v in layers)
    if lo < 0 or hi >= n:
        raise ValueError(f"layers {lo}–{hi} are outside this model's 0–{n - 1}")
    return lo, hi


def image_row(r: DescribeResult, query: int, layers: tuple[int, int], head: str | int = "mean") -> np.ndarray:
    """(N,): position ``query``'s attention to each image token."""
    return _reduce(r.attention[:, :, query][:, :, r.image_positions], check_layers(r, layers), head)


def text_positions(r: DescribeResult) -> np.ndarray:
    """The indices of the text tokens (everything that is not an image token)."""
    return np.setdiff1d(np.arange(len(r.ids)), r.image_positions)


def text_row(r: DescribeResult, query: int, layers: tuple[int, int], head: str | int = "mean") -> np.ndarray:
    """(len(text_positions),): position ``query``'s attention to each text token (0 after the query: causal)."""
    return _reduce(r.attention[:, :, query][:, :, text_positions(r)], check_layers(r, layers), head)


@dataclass(frozen=True)
class Comparison:
    attention_token: int  # the image token (index among the image tokens) attention points at
    relevance_token: int  # the one relevance points at (the largest positive relevance)
    same_place: bool  # their boxes overlap (the same token, or tiles and the global view over the same pixels)
    spearman: float  # rank correlation of attention and relevance over the image tokens
    text: str  # the verdict in words


def _ranks(v: np.ndarray) -> np.ndarray:
    order = np.argsort(v, kind="stable")
    ranks = np.empty(len(v), np.float64)
    ranks[order] = np.arange(len(v))
    for value in np.unique(v):  # ties share their mean rank
        tied = v == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (ties at their mean rank); 0 where either side is constant."""
    ra, rb = _ranks(np.asarray(a, np.float64)), _ranks(np.asarray(b, np.float64))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float(np.sqrt((ra ** 2).sum() * (rb ** 2).sum()))
    return float((ra * rb).sum() / den) if den > 0 else 0.0


def compare(r: DescribeResult, attention: np.ndarray, relevance: np.ndarray) -> Comparison:
    """Where attention and relevance (both (N,) over the image tokens) point, and how far they agree."""
    a, g = int(np.argmax(attention)), int(np.argmax(relevance))
    boxes = r.image_boxes
    same = bool(boxes[a][0] < boxes[g][2] and boxes[g][0] < boxes[a][2] and boxes[a][1] < boxes[g][3]
                and boxes[g][1] < boxes[a][3])
    rho = spearman(attention, relevance)
    name = lambda k: r.tokens[int(r.image_positions[k])]  # noqa: E731
    if same:
        text = (f"Attention and relevance point at the same place ({name(a)}"
                + ("" if a == g else f" and {name(g)}") + f"); rank correlation over the image {rho:+.2f}.")
    else:
        text = (f"**They disagree**: attention points at {name(a)}, relevance at {name(g)} (rank correlation over "
                f"the image {rho:+.2f}). Attention says where the token read from; relevance, what its probability "
                "depends on: trust relevance.")
    return Comparison(a, g, same, rho, text)


@dataclass(frozen=True)
class Sinks:
    received: np.ndarray  # (L, N): the mean share each image token takes from a text position, per layer
    rows: np.ndarray  # (L, N): the fraction of text positions that give it at least SINK_FACTOR × the mean share
    tokens: list[tuple[int, int]]  # (layer, image token) of every sink

    def text(self, r: DescribeResult) -> str:
        if not self.tokens:
            return (f"No visual sink: no image token takes {SINK_FACTOR:g}× the mean image token's share from "
                    f"{SINK_ROWS:.0%} of the text positions in any layer.")
        by_token: dict[int, list[int]] = {}
        for layer, k in self.tokens:
            by_token.setdefault(k, []).append(layer)
        parts = [f"{r.tokens[int(r.image_positions[k])]} (layer{'s' if len(v) > 1 else ''} "
                 f"{', '.join(map(str, v))})" for k, v in sorted(by_token.items())[:8]]
        more = len(by_token) - len(parts)
        return (f"**Visual sinks** (≥ {SINK_FACTOR:g}× the mean image token's share from ≥ {SINK_ROWS:.0%} of the "
                f"text positions, whatever they ask): {', '.join(parts)}" + (f" and {more} more" if more > 0 else "")
                + ".")


def sinks(r: DescribeResult) -> Sinks:
    """The image tokens that take a large share of attention from nearly every text position, per layer (mean over
    heads)."""
    text = text_positions(r)
    text = text[text > r.image_positions.max()]  # the positions that can see every image token
    w = r.attention[:, :, text][:, :, :, r.image_positions].mean(axis=1)  # (L, rows, N)
    mean = w.mean(axis=2, keepdims=True)
    big = w >= SINK_FACTOR * np.maximum(mean, 1e-12)
    rows = big.mean(axis=1)  # (L, N)
    found = [(int(layer), int(k)) for layer, k in zip(*np.nonzero(rows >= SINK_ROWS))]
    return Sinks(w.mean(axis=1).astype(np.float32), rows.astype(np.float32), found)
