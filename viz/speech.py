"""Speech figures: the log-mel spectrogram with the words' spans and one word's cross-attention over time beneath it,
and the alignment matrix (tokens × time) with its DTW path. Arrays and labels in, a go.Figure out (numpy + plotly)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from viz.common import ATTENTION_SCALE, Fig, base_layout, colorbar, esc, f32

FRAME_S = 0.02  # seconds per encoder position: the spectrogram is drawn at this step (two mel frames a column)
SPAN_COLOURS = ("rgba(255, 196, 0, 0.22)", "rgba(0, 160, 120, 0.18)")


def _pooled_mel(mel: np.ndarray, duration_s: float) -> tuple[np.ndarray, np.ndarray]:
    """The recording's mel frames (padding left out), averaged in pairs: (n_mels, columns) and column times."""
    n = max(2, min(mel.shape[1], int(np.ceil(duration_s / 0.01))))
    n -= n % 2
    pooled = mel[:, :n].reshape(mel.shape[0], n // 2, 2).mean(axis=2)
    return pooled, (np.arange(n // 2) + 0.5) * FRAME_S


def listen_figure(mel: np.ndarray, duration_s: float, words: Sequence[tuple[str, float, float]],
                  attention: np.ndarray | None = None, selected: int | None = None, title: str = "",
                  attention_label: str = "cross-attention") -> go.Figure:
    """Top: the log-mel spectrogram (time × mel bin) with each word's span shaded and named. Bottom: ``attention``
    (frames,) over the same time axis, the ``selected`` word's span marked."""
    pooled, times = _pooled_mel(np.asarray(mel, dtype=np.float32), duration_s)
    fig = Fig(rows=2, cols=1, vertical_spacing=0.08)
    fig.layout["yaxis"]["domain"], fig.layout["yaxis2"]["domain"] = [0.42, 1.0], [0.0, 0.32]
    fig.add_trace(dict(type="heatmap", z=f32(pooled), x=f32(times), y=list(range(pooled.shape[0])),
                       colorscale="Magma", colorbar={**colorbar("log-mel", y=0.71), "len": 0.55},
                       hovertemplate="%{x:.2f} s · mel bin %{y}<br>%{z:.2f}<extra></extra>"), row=1, col=1)
    for k, (word, start, end) in enumerate(words):
        colour = "rgba(30, 120, 255, 0.30)" if k == selected else SPAN_COLOURS[k % 2]
        for row in (1, 2):
            fig.add_shape(type="rect", x0=start, x1=end, y0=0, y1=1, fillcolor=colour, line=dict(width=0),
                          xref="x" if row == 1 else "x2", yref=("y" if row == 1 else "y2") + " domain",
                          layer="above" if row == 1 else "below")
        fig.add_annotation(text=esc(word.strip()), x=(start + end) / 2, y=1.0, xref="x", yref="y domain",
                           yanchor="bottom", showarrow=False, font=dict(size=13))
    if attention is not None:
        a = np.asarray(attention, dtype=np.float32)[: times.size]
        fig.add_trace(dict(type="scatter", x=f32(times[: a.size]), y=f32(a), mode="lines",
                           line=dict(color="#08519c", width=2), name=attention_label,
                           hovertemplate="%{x:.2f} s: %{y:.4f}<extra></extra>"), row=2, col=1)
    fig.update_xaxes(range=[0, float(times[-1] + FRAME_S / 2)], row=1, col=1, matches="x2", showticklabels=False)
    fig.update_xaxes(range=[0, float(times[-1] + FRAME_S / 2)], title_text="time (s)", row=2, col=1)
    fig.update_yaxes(title_text="mel bin", row=1, col=1)
    fig.update_yaxes(title_text=attention_label, rangemode="tozero", row=2, col=1)
    fig.update_layout(showlegend=False)
    return base_layout(fig, title or "spectrogram and attention over time", height=560).build()


def alignment_figure(matrix: np.ndarray, tokens: Sequence[str], path: tuple[np.ndarray, np.ndarray] | None = None,
                     title: str = "") -> go.Figure:
    """The alignment matrix (rows: the rows that predict each text token, columns: time) with the DTW path."""
    m = np.asarray(matrix, dtype=np.float32)
    times = (np.arange(m.shape[1]) + 0.5) * FRAME_S
    labels = [f"{i}: {esc(t)}" for i, t in enumerate(tokens)]
    fig = Fig(dict(type="heatmap", z=f32(m), x=f32(times), y=labels, colorscale=ATTENTION_SCALE,
                   colorbar=colorbar("z-scored, filtered"),
                   hovertemplate="%{y} · %{x:.2f} s<br>%{z:.2f}<extra></extra>"))
    if path is not None:
        rows, cols = path
        fig.add_trace(dict(type="scatter", x=f32(times[cols]), y=[labels[r] for r in rows], mode="lines",
                           line=dict(color="#e6550d", width=2), name="DTW path", hoverinfo="skip"))
    fig.update_xaxes(title_text="time (s)")
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_layout(showlegend=False)
    return base_layout(fig, title or "alignment: tokens × time, and the DTW path",
                       height=max(260, 60 + 22 * len(tokens))).build()


def head_errors_figure(errors_ms: np.ndarray, alignment_heads: Sequence[tuple[int, int]] = (),
                       title: str = "") -> go.Figure:
    """(layers, heads) mean word-start error in ms of each cross-attention head aligning alone, the checkpoint's
    alignment heads outlined."""
    e = np.asarray(errors_ms, dtype=np.float32)
    xs = [f"head {h}" for h in range(e.shape[1])]
    ys = [f"layer {layer}" for layer in range(e.shape[0])]
    fig = Fig(dict(type="heatmap", z=f32(e), x=xs, y=ys, colorscale="Viridis", reversescale=True,
                   colorbar=colorbar("word-start error (ms)"), text=[[f"{v:.0f}" for v in row] for row in e],
                   texttemplate="%{text}", hovertemplate="%{y} · %{x}: %{z:.0f} ms<extra></extra>"))
    for layer, head in alignment_heads:
        fig.add_shape(type="rect", x0=head - 0.5, x1=head + 0.5, y0=layer - 0.5, y1=layer + 0.5,
                      line=dict(color="#ffffff", width=2, dash="dot"))
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(type="category")
    return base_layout(fig, title or "each head's word-start error", height=360).build()
