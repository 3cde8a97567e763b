"""Long-context figures (issue 69): one query's exact attention row over every key of a long text, with its
strongest keys named. Arrays in, go.Figure out; never imports models or gradio."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from viz.common import Fig, base_layout, block_edges, esc, f32
from viz.generate import shown_token

ROW_POINTS = 4096  # a row over more keys is drawn max-pooled to this many points (the strongest keys still marked)


def top_keys(row: np.ndarray, k: int = 10) -> list[tuple[int, float]]:
    """The ``k`` strongest keys of a row (position, weight), strongest first; keys of weight 0 left out."""
    row = np.asarray(row, dtype=np.float32)
    k = min(k, int((row > 0).sum()))
    if k <= 0:
        return []
    idx = np.argpartition(-row, k - 1)[:k]
    idx = idx[np.argsort(-row[idx], kind="stable")]
    return [(int(i), float(row[i])) for i in idx]


def context(tokens: Sequence[str], i: int, width: int = 6) -> str:
    """Tokens i − width … i + width as running text, token i in brackets: what a key reads as in its text."""
    lo, hi = max(0, i - width), min(len(tokens), i + width + 1)
    parts = [f"[{shown_token(tokens[j])}]" if j == i else shown_token(tokens[j]) for j in range(lo, hi)]
    return "".join(parts).replace("\n", "⏎").strip()


def attention_row(row: np.ndarray, tokens: Sequence[str], query: int, *, title: str, top: int = 10,
                  window: int = 0) -> go.Figure:
    """One query's weights over every key (T,): drawn whole up to ROW_POINTS keys, above that each point the
    maximum of its block of keys (the title says so); the ``top`` strongest keys marked and labelled with their
    token; ``window`` > 0 shades the keys a local layer can see (i − window < j ≤ i)."""
    row = np.asarray(row, dtype=np.float32)
    t = row.size
    if t == 0 or not 0 <= query < t:
        raise ValueError(f"query {query} is not one of the row's {t} positions")
    pooled = t > ROW_POINTS
    if pooled:
        edges = block_edges(t, ROW_POINTS)
        y = np.maximum.reduceat(row, edges[:-1])
        x = edges[:-1]
        hover = [f"keys {a}…{b - 1}<br>max {v:.4f}" for a, b, v in zip(edges[:-1], edges[1:], y)]
    else:
        x, y = np.arange(t), row
        hover = [f"key {j} {esc(tokens[j])}<br>{v:.4f}" for j, v in enumerate(y)]
    fig = Fig(dict(type="scatter", mode="lines", x=x.tolist(), y=f32(y), line=dict(width=1, color="#1f77b4"),
                   hovertext=hover, hoverinfo="text", name="weight", fill="tozeroy"))
    best = top_keys(row, top)
    if best:
        fig.add_trace(dict(type="scatter", mode="markers+text", x=[j for j, _ in best], y=[float(v) for _, v in best],
                     text=[esc(shown_token(tokens[j]).strip() or repr(tokens[j]))[:16] for j, _ in best],
                     textposition="top center", marker=dict(size=8, color="#d62728"), name="strongest keys",
                     hovertext=[f"key {j} {esc(tokens[j])}<br>{v:.4f}" for j, v in best], hoverinfo="text"))
    subtitle = (f"query {query} “{esc(shown_token(tokens[query]).strip())}” over {t:,} keys"
                + (f", each point the maximum of {int(edges[1] - edges[0])} keys" if pooled else "")
                + (f"; shaded: the local window of {window}" if window else ""))
    base_layout(fig, f"{title}<br><sup>{subtitle}</sup>", height=360, width=1100)
    fig.update_layout(margin=dict(t=80), showlegend=False)
    if window:
        fig.add_shape(type="rect", x0=max(0, query - window + 1) - 0.5, x1=query + 0.5, y0=0, y1=1, yref="paper",
                      fillcolor="rgba(255, 165, 0, 0.15)", line=dict(width=0), layer="below")
    fig.update_xaxes(title=dict(text="key position"), range=[-0.5, t - 0.5])
    fig.update_yaxes(title=dict(text="attention weight"), rangemode="tozero")
    return fig.build()
