"""What a compressed KV cache forgets (models/decoding/compress.py): the kept/evicted mask over layers × positions,
the divergence of the compressed answer from the full one step by step, the two answers side by side (HTML)."""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from viz.common import HEAD_COLORS, Fig, base_layout, block_edges, colorbar, esc, f32, shorten

MAX_COLUMNS = 1024  # positions drawn one a column; a longer context is drawn as the mean over blocks of positions
KEPT_SCALE = [[0.0, "#f4f4f4"], [1e-6, "#fde0c5"], [0.5, "#f59e0b"], [1.0, "#7c2d12"]]  # evicted grey → kept dark


def kept_rows(mask: np.ndarray, layer: int | None = None) -> tuple[np.ndarray, list[str]]:
    """The rows the heatmap draws from a kept mask (L, H_kv, T) bool: every layer's share of key-value heads keeping
    each position (``layer`` None), or one layer's heads, 1 kept and 0 evicted; with their labels."""
    m = np.asarray(mask, dtype=bool)
    if m.ndim != 3:
        raise ValueError(f"the kept mask must be (layers, key-value heads, positions), got shape {m.shape}")
    if layer is None:
        return m.mean(1).astype(np.float32), [f"L{i}" for i in range(m.shape[0])]
    if not 0 <= layer < m.shape[0]:
        raise ValueError(f"layer {layer} is not one of the {m.shape[0]} layers")
    return m[layer].astype(np.float32), [f"L{layer} kv{h}" for h in range(m.shape[1])]


def kept_map(mask: np.ndarray, tokens: Sequence[str], layer: int | None = None, *, title: str = "") -> go.Figure:
    """The kept/evicted heatmap: layers (or one layer's key-value heads) × context positions."""
    z, rows = kept_rows(mask, layer)
    t = z.shape[1]
    if len(tokens) != t:
        raise ValueError(f"{len(tokens)} tokens for a mask over {t} positions")
    edges = block_edges(t, MAX_COLUMNS)
    if len(edges) - 1 < t:  # a long context: the mean over each block of positions
        z = np.stack([z[:, a:b].mean(1) for a, b in zip(edges[:-1], edges[1:])], 1)
        labels = [f"{a}–{b - 1}" for a, b in zip(edges[:-1], edges[1:])]
        unit = "positions"
    else:
        labels = [f"{i} {esc(shorten(tok, 14))}" for i, tok in enumerate(tokens)]
        unit = "position"
    what = "share of key-value heads keeping it" if layer is None else "kept (1) or evicted (0)"
    fig = Fig(dict(type="heatmap", z=f32(z), x=labels, y=rows, zmin=0.0, zmax=1.0, colorscale=KEPT_SCALE,
                   colorbar=colorbar("kept"), hovertemplate=f"%{{y}} · {unit} %{{x}}<br>{what}: %{{z:.2f}}"
                                                           "<extra></extra>"))
    base_layout(fig, title or ("Kept and evicted positions · every layer" if layer is None else
                               f"Kept and evicted positions · layer {layer}, each key-value head"),
                height=max(260, 60 + 22 * len(rows)))
    fig.update_xaxes(title_text="context position", showticklabels=t <= 80, tickangle=-60)
    fig.update_yaxes(title_text="layer" if layer is None else "key-value head", autorange="reversed")
    return fig.build()


def divergence(kl: np.ndarray, agree: np.ndarray, parted: int | None, tokens: Sequence[str] = (), *,
               title: str = "") -> go.Figure:
    """Per step of the full answer: KL(full ‖ compressed) of the next token (bars, green where the two top tokens
    agree, red where not), and a line at the step where the free answers part."""
    kl, agree = np.asarray(kl, dtype=np.float32), np.asarray(agree, dtype=bool)
    if kl.shape != agree.shape or kl.ndim != 1:
        raise ValueError("KL and agreement need one value per step each")
    steps = list(range(kl.size))
    names = [esc(shorten(tokens[i], 14)) if i < len(tokens) else "" for i in steps]
    fig = Fig(dict(type="bar", x=steps, y=f32(kl), customdata=names,
                   marker=dict(color=["#16a34a" if a else "#dc2626" for a in agree]),
                   hovertemplate="step %{x} (full answer: %{customdata})<br>KL %{y:.4f} nats<extra></extra>"))
    if parted is not None:
        fig.add_vline(parted - 0.5, line=dict(color="#111", dash="dash"))
        fig.add_annotation(x=parted - 0.5, y=1, yref="paper", text=f"the answers part at step {parted}",
                           showarrow=False, xanchor="left", yanchor="bottom")
    base_layout(fig, title or "How far the compressed cache's next token is from the full cache's", height=300)
    fig.update_xaxes(title_text="step of the full answer (green: the same top token)", dtick=1)
    fig.update_yaxes(title_text="KL (nats)", rangemode="tozero")
    return fig.build()


def _answer(tokens: Sequence[str], parted: int | None, colour: str) -> str:
    spans = []
    for i, tok in enumerate(tokens):
        after = parted is not None and i >= parted
        style = f"background:{colour};border-radius:3px;padding:0 1px" if after else ""
        spans.append(f'<span style="{style}">{html.escape(str(tok), quote=False)}</span>')
    return "".join(spans) or "<i>(nothing)</i>"


def answers(full: Sequence[str], compressed: Sequence[str], parted: int | None, *, full_label: str = "full cache",
            compressed_label: str = "compressed cache") -> str:
    """The two answers side by side (HTML), the tokens from the parting step on highlighted."""
    verdict = ("the same answer" if parted is None else f"they part at step {parted}")
    cell = "flex:1;min-width:240px;border:1px solid #ddd;border-radius:6px;padding:8px;white-space:pre-wrap"
    return (f'<div class="atlas-kv-answers" style="font-family:sans-serif">'
            f'<div style="margin-bottom:4px;color:#555">{html.escape(verdict)}</div>'
            f'<div style="display:flex;gap:12px;flex-wrap:wrap">'
            f'<div style="{cell}" data-arm="full"><b>{html.escape(full_label)}</b><br>'
            f'{_answer(full, parted, "#dcfce7")}</div>'
            f'<div style="{cell}" data-arm="compressed"><b>{html.escape(compressed_label)}</b><br>'
            f'{_answer(compressed, parted, "#fee2e2")}</div></div></div>')




def accuracy_curves(rows: Sequence[dict], full_accuracy: float, *, title: str = "") -> go.Figure:
    """Accuracy against the compression ratio, one line per press (bench/kv_compression.py's rows: ``kvpress``,
    ``ratio``, ``accuracy``, ``mean_kl``, ``kept_tokens``), each starting at ratio 0 from the full cache's accuracy
    (a ratio of 0 removes nothing); the full cache's accuracy as a dashed line. Hover: KL and tokens kept."""
    if not rows:
        raise ValueError("no rows to draw")
    if not 0.0 <= float(full_accuracy) <= 1.0:
        raise ValueError(f"the full cache's accuracy must be in [0, 1], got {full_accuracy}")
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(str(r["kvpress"]), []).append(r)
    traces = []
    for i, (name, rs) in enumerate(by.items()):
        rs = sorted(rs, key=lambda r: float(r["ratio"]))
        x = [0.0] + [float(r["ratio"]) for r in rs]
        y = [float(full_accuracy)] + [float(r["accuracy"]) for r in rs]
        extra = [[0.0, "all"]] + [[float(r["mean_kl"]), f"{float(r['kept_tokens']):.0f}"] for r in rs]
        traces.append(dict(type="scatter", mode="lines+markers", x=x, y=y, name=esc(name), customdata=extra,
                           line=dict(color=HEAD_COLORS[i % len(HEAD_COLORS)], width=2),
                           hovertemplate=f"{esc(name)} · ratio %{{x:.1f}}<br>accuracy %{{y:.2f}}<br>mean KL "
                                         "%{customdata[0]:.3f} nats · tokens kept per head %{customdata[1]}"
                                         "<extra></extra>"))
    fig = Fig(traces)
    fig.add_shape(type="line", x0=0, x1=1, xref="x domain", y0=float(full_accuracy), y1=float(full_accuracy),
                  yref="y", line=dict(color="#111", dash="dash", width=1))
    fig.add_annotation(x=1, xref="x domain", y=float(full_accuracy), yref="y", showarrow=False, xanchor="right",
                       yanchor="bottom", text=f"full cache {float(full_accuracy):.2f}")
    base_layout(fig, title or "Accuracy against the compression ratio", height=420)
    fig.update_xaxes(title_text="compression ratio (share of the context's cache removed)", range=[-0.02, 0.95],
                     dtick=0.1)
    fig.update_yaxes(title_text="accuracy", range=[-0.03, 1.03])
    return fig.build()
