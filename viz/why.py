"""Why a head attends and whether it matters: one attention score split by residual-stream parts (query part ×
key part), the query's whole row before and after the softmax, the RoPE score by offset, and activation-patching
sweeps (layer × head, layer × position). Arrays in, figures out."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from viz.attention import POOL_ABOVE, TILE_CELLS
from viz.common import DIVERGING_SCALE, Fig, base_layout, colorbar, esc, f32, pool_blocks, shorten, unique_labels


def grouped_table(table: np.ndarray, parts: Sequence[str], max_parts: int = 12) -> tuple[np.ndarray, list[str],
                                                                                         list[str]]:
    """The (C, C) table reduced to the ``max_parts`` query parts and key parts that move the score most
    (largest total |term|), the rest summed into an ``other`` row and column: the reduced table still sums to
    the score. A NaN (a pair that is not a term) counts as nothing, and stays NaN where a cell holds nothing else.
    Returns (table, query part names, key part names)."""
    t = np.asarray(table, dtype=np.float64)
    names = list(parts)

    def keep(weight: np.ndarray) -> list[int]:
        order = [int(i) for i in np.argsort(-weight, kind="stable")]
        return order if len(order) <= max_parts + 1 else order[:max_parts]

    rows, cols = keep(np.nansum(np.abs(t), 1)), keep(np.nansum(np.abs(t), 0))
    rest_r = [i for i in range(len(names)) if i not in rows]
    rest_c = [j for j in range(len(names)) if j not in cols]
    r_idx = [[i] for i in rows] + ([rest_r] if rest_r else [])
    c_idx = [[j] for j in cols] + ([rest_c] if rest_c else [])
    cell = lambda r, c: np.nansum(t[np.ix_(r, c)]) if np.isfinite(t[np.ix_(r, c)]).any() else np.nan  # noqa: E731
    out = np.array([[cell(r, c) for c in c_idx] for r in r_idx])
    r_names = [names[i] for i in rows] + ([f"other ({len(rest_r)})"] if rest_r else [])
    c_names = [names[j] for j in cols] + ([f"other ({len(rest_c)})"] if rest_c else [])
    return out, r_names, c_names


def score_decomposition(table: np.ndarray, parts: Sequence[str], row: np.ndarray, softmax_row: np.ndarray,
                        tokens: Sequence[str], query: int, key: int, *, title: str,
                        by_offset: np.ndarray | None = None, renormalised: np.ndarray | None = None,
                        max_parts: int = 12, split: str = "sum of query part × key part (norms frozen)") -> go.Figure:
    """Three panels, top to bottom: the score as query part × key part (signed, the terms sum to the score; a NaN
    cell is a pair that is not a term, drawn empty); the query's attention over every key, the chosen key outlined
    (and, where given, the row renormalised without the first token); for RoPE models, the score the same query
    and key would get at every offset. ``split`` names the first panel's terms."""
    small, r_names, c_names = grouped_table(table, parts, max_parts)
    score = float(np.nansum(np.asarray(table)))
    n_rows = 3 if by_offset is not None else 2
    flat = len(c_names) <= 4  # a few key parts read level; more are tilted
    height = 560 + 28 * len(r_names) + (300 if by_offset is not None else 0)
    # under the first panel: its key-part labels, its axis title, then the next panel's title (in pixels of the
    # plot area, which is the height less the top and bottom margins below)
    gap = (110 if flat else 150) / (height - 180)
    fig = Fig(rows=n_rows, cols=1, vertical_spacing=max(gap, 0.12 if n_rows == 3 else 0.16), subplot_titles=[
        f"score {score:.3f} = {split}",
        f"attention of query {query} over the keys (softmax of the scores)",
        *(["score of this query and key moved to every offset (RoPE)"] if by_offset is not None else []),
    ])
    lim = float(np.nanmax(np.abs(small))) or 1.0
    trace = dict(type="heatmap", z=f32(small), x=[esc(n) for n in c_names], y=[esc(n) for n in r_names],
                 zmin=-lim, zmax=lim, colorscale=DIVERGING_SCALE,
                 colorbar={**colorbar("term"), "len": 0.4, "y": 1.0, "yanchor": "top"},
                 hovertemplate="query part %{y} · key part %{x}: %{z:.4f}<extra></extra>")
    if small.size <= 196:
        trace.update(text=[[f"{v:.2f}" if np.isfinite(v) else "" for v in r] for r in small], texttemplate="%{text}",
                     textfont=dict(size=11))
    fig.add_trace(trace, row=1, col=1)
    fig.update_xaxes(title=dict(text=f"key part (token {key} · {esc(shorten(tokens[key], 16))})"),
                     tickangle=0 if flat else -45, row=1, col=1)
    fig.update_yaxes(title=dict(text=f"query part (token {query})"), autorange="reversed", row=1, col=1)

    labels = unique_labels([shorten(t, 12) for t in tokens])
    soft = np.nan_to_num(np.asarray(softmax_row, dtype=np.float32))
    colors = ["#08519c" if j == key else "#9ecae1" for j in range(len(soft))]
    scores = [None if not np.isfinite(s) else float(s) for s in np.asarray(row, dtype=np.float64)]
    fig.add_trace(dict(type="bar", x=labels, y=f32(soft), marker=dict(color=colors), name="attention",
                       customdata=scores, hovertemplate="%{x}: attention %{y:.3f}, score %{customdata:.3f}"
                                                        "<extra></extra>"), row=2, col=1)
    if renormalised is not None:
        fig.add_trace(dict(type="scatter", mode="markers", x=labels, y=f32(np.asarray(renormalised)),
                           name="without the first token, renormalised",
                           marker=dict(symbol="diamond", size=9, color="#d62728"),
                           hovertemplate="%{x}: %{y:.3f} without the first token<extra></extra>"), row=2, col=1)
    fig.update_yaxes(title=dict(text="attention"), range=[0, 1.02], row=2, col=1)
    fig.update_xaxes(tickangle=-60, type="category", row=2, col=1)
    if by_offset is not None:
        off = np.asarray(by_offset, dtype=np.float32)
        true = query - key
        fig.add_trace(dict(type="scatter", mode="lines", x=list(range(len(off))), y=f32(off), name="score by offset",
                           line=dict(color="#756bb1"), hovertemplate="offset %{x}: %{y:.3f}<extra></extra>"),
                      row=3, col=1)
        fig.add_trace(dict(type="scatter", mode="markers", x=[true], y=[float(off[true])], name=f"true offset {true}",
                           marker=dict(size=12, color="#d62728")), row=3, col=1)
        fig.update_xaxes(title=dict(text="offset i − j (0: rotation removed, the content score)"), row=3, col=1)
        fig.update_yaxes(title=dict(text="score"), row=3, col=1)
    base_layout(fig, title, height=int(height))
    # the legend to the right of the lower panels, under the colour bar (0.6–1.0): below the plot it lay over the
    # tilted token labels
    fig.update_layout(legend=dict(orientation="v", x=1.02, xanchor="left", y=0.56 if n_rows == 3 else 0.42,
                                  yanchor="top"), margin=dict(t=100, b=80))
    return fig.build()


def patching_heatmap(restored: np.ndarray, sweep: str, *, title: str, tokens: Sequence[str] | None = None,
                     subtitle: str = "") -> go.Figure:
    """Fraction of the clean−corrupted logit difference restored by patching one activation from the clean
    run: layer × head (``sweep="heads"``) or layer × position of the residual stream (``"positions"``).
    Signed, centred on 0; 1 = the clean answer fully restored."""
    r = np.asarray(restored, dtype=np.float32)
    L, n = r.shape
    lim = max(1.0, float(np.nanmax(np.abs(r))) if np.isfinite(r).any() else 1.0)
    if sweep == "positions" and tokens is not None:
        x = unique_labels([shorten(t, 10) for t in tokens])
        x_title, hover = "position (token)", "layer %{y} · %{x}: %{z:.3f} restored<extra></extra>"
    else:
        x = list(range(n))
        x_title, hover = "head", "layer %{y} · head %{x}: %{z:.3f} restored<extra></extra>"
    trace = dict(type="heatmap", z=f32(r), x=x, y=list(range(L)), zmin=-lim, zmax=lim, colorscale=DIVERGING_SCALE,
                 colorbar=colorbar("restored"), xgap=1, ygap=1, hovertemplate=hover)
    if r.size <= 400:
        trace.update(text=[[f"{v:.2f}" for v in row] for row in r], texttemplate="%{text}", textfont=dict(size=11))
    fig = Fig(trace)
    base_layout(fig, f"{title}<br><sup>{subtitle}</sup>" if subtitle else title,
                height=int(np.clip(40 * L + 240, 320, 900)), width=int(np.clip(46 * n + 260, 520, 1600)))
    fig.update_xaxes(title=dict(text=x_title), tickangle=-60 if sweep == "positions" else 0,
                     type="category" if sweep == "positions" else "linear", dtick=1 if sweep != "positions" else None)
    fig.update_yaxes(title=dict(text="layer"), autorange="reversed", dtick=1)
    fig.update_layout(margin=dict(t=100))
    return fig.build()


def attention_difference(a: np.ndarray, b: np.ndarray, tokens_a: Sequence[str], tokens_b: Sequence[str],
                         pairs: Sequence[tuple[int, int]], *, title: str) -> go.Figure:
    """B − A of one head's (or a fused) attention (Q, K) over the tokens the two inputs share (``pairs`` of
    indices, in order): red where B attends more, blue where A does. Tokens of only one input are left out."""
    ia = [i for i, _ in pairs]
    ib = [j for _, j in pairs]
    d = np.asarray(b, dtype=np.float32)[np.ix_(ib, ib)] - np.asarray(a, dtype=np.float32)[np.ix_(ia, ia)]
    labels = unique_labels([shorten(tokens_b[j], 12) for j in ib])
    if len(ib) > POOL_ABOVE:  # long inputs: mean tiles (a signed difference's mean keeps its balance), as heatmaps do
        d, edges, _ = pool_blocks(d, TILE_CELLS, "mean")
        labels = [f"B {ib[int(s)]}–{ib[int(e) - 1]}" for s, e in zip(edges[:-1], edges[1:])]
        title += f"<br><sup>{len(ib)} shared tokens, mean-pooled to {len(labels)}×{len(labels)} cells</sup>"
    lim = max(float(np.abs(d).max()) if d.size else 0.0, 1e-6)
    fig = Fig(dict(type="heatmap", z=f32(d), x=labels, y=labels, zmin=-lim, zmax=lim, colorscale=DIVERGING_SCALE,
                   colorbar=colorbar("B − A"), hovertemplate="%{y} → %{x}: %{z:+.3f}<extra></extra>"))
    n = max(len(labels), 1)
    base_layout(fig, title, height=int(np.clip(int(np.clip(640 / n, 4, 40)) * n + 220, 380, 1000)))
    fig.update_xaxes(title=dict(text="key (tokens of both inputs)"), tickangle=-60, type="category")
    fig.update_yaxes(title=dict(text="query"), autorange="reversed", type="category", scaleanchor="x")
    return fig.build()


def change_bars(labels: Sequence[str], a: np.ndarray, b: np.ndarray, *, title: str, unit: str,
                names: tuple[str, str] = ("A", "B")) -> go.Figure:
    """Two values side by side per token or class: input A's and input B's (surprisal, probability), or two
    methods' scores (``names``)."""
    shown = unique_labels([shorten(x, 14) for x in labels])
    fig = Fig([
        dict(type="bar", x=shown, y=f32(np.asarray(a)), name=esc(names[0]), marker=dict(color="#9ecae1"),
             hovertemplate=f"%{{x}}: %{{y:.3f}} {esc(unit)}<extra>{esc(names[0])}</extra>"),
        dict(type="bar", x=shown, y=f32(np.asarray(b)), name=esc(names[1]), marker=dict(color="#d62728"),
             hovertemplate=f"%{{x}}: %{{y:.3f}} {esc(unit)}<extra>{esc(names[1])}</extra>"),
    ])
    base_layout(fig, title, height=400, width=int(np.clip(28 * len(shown) + 300, 500, 2400)))
    # the legend above the bars, right-aligned under the title: below, it lay over the tilted labels
    fig.update_layout(barmode="group", legend=dict(orientation="h", x=1, xanchor="right", y=1.02, yanchor="bottom"))
    fig.update_xaxes(tickangle=-60, type="category")
    fig.update_yaxes(title=dict(text=unit))
    return fig.build()
