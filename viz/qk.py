"""One head's queries and keys as two point sets in one plane (AttentionViz, Yeh et al. 2023): arrays in, a figure
out. The points come from ``models.inspect.qk`` (keys translated onto the query centroid, both scaled, the stack
projected on its two principal axes); the chosen query is ringed, with lines to the keys it attends to most."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from viz.common import Fig, base_layout, esc, f32, raw_note, shorten, unique_labels

QUERY_COLOR, KEY_COLOR = "#1b9e77", "#d95f9e"  # AttentionViz's green queries and pink keys (told apart by marker too)
LINE_COLOR = "#08306b"
MAX_POINTS = 2048  # per set: an input longer than this shows every k-th token (and the chosen query's top keys)
TOP_K = 5  # lines from the chosen query


def shown_tokens(n: int, max_points: int, keep: Sequence[int] = ()) -> np.ndarray:
    """The token positions drawn: all of them up to ``max_points``, else every k-th plus ``keep``, sorted."""
    if n <= max_points:
        return np.arange(n)
    step = int(np.ceil(n / max_points))
    return np.union1d(np.arange(0, n, step), np.asarray(list(keep), dtype=int))


def qk_scatter(points: np.ndarray, tokens: Sequence[str], weights: np.ndarray, *, title: str,
               query: int | None = None, explained: Sequence[float] | None = None, subtitle: str = "",
               top_k: int = TOP_K, max_points: int = MAX_POINTS) -> go.Figure:
    """Queries (circles) and keys (diamonds) of one head, ``points`` (2T, 2): rows 0..T−1 the queries, T..2T−1 the
    keys of the same T ``tokens``; ``weights`` (T, T) the head's attention. ``query`` (a position): ringed, with a
    line to each of its ``top_k`` strongest keys, thicker for more weight. Each point's ``customdata`` is its token
    position (a click on it chooses that query, app.py's page script). ``explained``: the variance fraction of each
    axis, named in the axis titles. Over ``max_points`` tokens every k-th token is drawn (the subtitle says so)."""
    pts = np.asarray(points, dtype=np.float32)
    t = len(tokens)
    if pts.shape != (2 * t, 2):
        raise ValueError(f"points must be (2·{t}, 2) for {t} tokens, got {pts.shape}")
    w = np.asarray(weights, dtype=np.float32)
    top: list[int] = []
    if query is not None:
        if not 0 <= query < t:
            raise ValueError(f"query {query} is outside 0..{t - 1}")
        row = np.nan_to_num(w[query], nan=0.0)
        top = [int(j) for j in np.argsort(-row, kind="stable")[:top_k] if row[j] > 0]
    shown = shown_tokens(t, max_points, [*top, *([query] if query is not None else [])])
    labels = [label + raw_note(tok) for label, tok in zip(unique_labels([shorten(tok, 24) for tok in tokens]), tokens)]
    fig = Fig()
    for name, offset, color, symbol in (("queries", 0, QUERY_COLOR, "circle"), ("keys", t, KEY_COLOR, "diamond")):
        kind = name[:-1]
        fig.add_trace(dict(type="scatter", mode="markers", name=name, x=f32(pts[offset + shown, 0]),
                           y=f32(pts[offset + shown, 1]), customdata=shown.tolist(),
                           text=[labels[i] for i in shown],
                           marker=dict(color=color, symbol=symbol, size=9 if len(shown) <= 256 else 6, opacity=0.8,
                                       line=dict(width=0.5, color="white")),
                           hovertemplate=f"{kind} %{{text}}<extra></extra>"))
    if query is not None:
        for j in top:
            x0, y0 = pts[query]
            x1, y1 = pts[t + j]
            fig.add_trace(dict(type="scatter", mode="lines", x=[float(x0), float(x1)], y=[float(y0), float(y1)],
                               line=dict(color=LINE_COLOR, width=1 + 7 * float(w[query, j])),
                               opacity=0.35 + 0.6 * float(w[query, j]), legendgroup="top",
                               name=f"→ {labels[j]}: {w[query, j]:.2f}", showlegend=True,
                               hovertemplate=f"query {labels[query]} → key {labels[j]}: attention "
                                             f"{w[query, j]:.3f}<extra></extra>"))
        fig.add_trace(dict(type="scatter", mode="markers+text", name=f"query {labels[query]}",
                           x=[float(pts[query, 0])], y=[float(pts[query, 1])], customdata=[query],
                           text=[esc(shorten(tokens[query], 16))], textposition="top center",
                           marker=dict(color=QUERY_COLOR, size=16, symbol="circle",
                                       line=dict(width=2.5, color="black")),
                           hovertemplate=f"query {labels[query]} (chosen)<extra></extra>"))
        if top:
            fig.add_trace(dict(type="scatter", mode="markers+text", name="its strongest keys", showlegend=False,
                               x=f32(pts[t + np.array(top), 0]), y=f32(pts[t + np.array(top), 1]), customdata=top,
                               text=[esc(shorten(tokens[j], 16)) for j in top], textposition="bottom center",
                               marker=dict(color=KEY_COLOR, size=13, symbol="diamond",
                                           line=dict(width=2, color=LINE_COLOR)),
                               hovertemplate=[f"key {labels[j]}: attention {w[query, j]:.3f} from the chosen query"
                                              "<extra></extra>" for j in top]))
    notes = [subtitle] if subtitle else []
    if len(shown) < t:
        notes.append(f"{t} tokens: one in {int(np.ceil(t / max_points))} drawn ({len(shown)} of each set)")
    base_layout(fig, title + (f"<br><sup>{' · '.join(notes)}</sup>" if notes else ""), height=620)
    ex = list(explained) if explained is not None else [None, None]
    for axis, letter in enumerate("xy"):
        share = f" ({ex[axis]:.0%} of the variance)" if ex[axis] is not None else ""
        (fig.update_xaxes if letter == "x" else fig.update_yaxes)(
            title=dict(text=f"principal axis {axis + 1}{share}"), zeroline=True, zerolinecolor="#ddd",
            showgrid=True, gridcolor="#f2f2f2")
    # one unit is the same length on both axes: distances in the plane are distances in the projection
    fig.update_yaxes(scaleanchor="x", scaleratio=1)
    fig.update_layout(legend=dict(orientation="v", x=1.02, y=1, xanchor="left"), hovermode="closest",
                      margin=dict(t=90, r=30))
    return fig.build()
