"""Head statistics: entropy and mean attention distance per layer × head (ViT paper, Fig. 7 right),
and each head's share of attention to special and neighbouring tokens."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from viz.common import ATTENTION_SCALE, HEAD_COLORS, VIRIDIS, Fig, base_layout, colorbar, esc, f32

SHARE_KINDS = ("CLS", "SEP", "previous", "next")


def token_shares(weights: np.ndarray, tokens: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """Average share of each head's attention going to [CLS]-like, [SEP]-like, the previous and the next
    token (Clark et al. 2019, "What does BERT look at?"). weights: (L, H, N, N) self-attention.

    Returns ((L, H, 4) shares in [0, 1], column names). "CLS" counts [CLS] / CLS / <s>; "SEP" counts
    [SEP] / </s>; previous/next exclude the first/last query that has no such neighbour."""
    w = np.asarray(weights, dtype=np.float64)
    n = w.shape[-1]
    toks = list(tokens)
    cls = np.array([t in ("[CLS]", "CLS", "<s>") for t in toks])
    sep = np.array([t in ("[SEP]", "</s>") for t in toks])
    out = np.zeros(w.shape[:2] + (4,))
    out[..., 0] = w[..., cls].sum(-1).mean(-1) if cls.any() else 0.0
    out[..., 1] = w[..., sep].sum(-1).mean(-1) if sep.any() else 0.0
    if n > 1:
        i = np.arange(1, n)
        out[..., 2] = w[..., i, i - 1].mean(-1)
        out[..., 3] = w[..., i - 1, i].mean(-1)
    names = ["→ [CLS] / <s>", "→ [SEP] / </s>", "→ previous token", "→ next token"]
    return out, names


def head_share_heatmap(shares: np.ndarray, names: Sequence[str] | None = None, *,
                       title: str = "Where each head looks",
                       subtitle: str = "average share of each head's attention, over all queries",
                       label: str = "share of attention") -> go.Figure:
    """One small layer × head heatmap per target kind (share of attention, 0–1). shares: (L, H, C)."""
    s = np.asarray(shares, dtype=np.float32)
    L, H, C = s.shape
    names = list(names) if names is not None else [f"→ {k}" for k in SHARE_KINDS[:C]]
    fig = Fig(rows=1, cols=C, subplot_titles=[esc(x) for x in names], horizontal_spacing=0.04, shared_yaxes=True)
    for c in range(C):
        fig.add_trace(dict(
            type="heatmap", z=f32(s[..., c]), zmin=0, zmax=1, colorscale=ATTENTION_SCALE, showscale=c == 0,
            colorbar=colorbar(label),
            hovertemplate=f"layer %{{y}} · head %{{x}}<br>{esc(names[c])}: %{{z:.3f}}<extra></extra>",
        ), row=1, col=c + 1)
        fig.update_xaxes(title=dict(text="head"), dtick=1 if H <= 12 else 2, row=1, col=c + 1)
    fig.update_yaxes(autorange="reversed", dtick=1 if L <= 12 else 2)
    fig.update_yaxes(title=dict(text="layer"), row=1, col=1)
    base_layout(fig, f"{title}<br><sup>{subtitle}</sup>",
                height=int(np.clip(36 * L + 220, 320, 720)), width=int(np.clip(C * (30 * H + 40) + 200, 600, 1500)))
    fig.update_layout(margin=dict(t=110))
    return fig.build()


def entropy_heatmap(entropy: np.ndarray, *, title: str = "Attention entropy per head",
                    unit: str = "bits", max_entropy: float | None = None, subtitle: str = "") -> go.Figure:
    """Layer × head heatmap of the mean attention entropy (low = focused head, high = broad). ``subtitle``: smaller
    lines under the title (a long title is cut where the figure is narrow; Plotly does not wrap titles)."""
    e = np.asarray(entropy, dtype=np.float32)
    L, H = e.shape
    fig = Fig(dict(
        type="heatmap", z=f32(e), zmin=0, zmax=max_entropy if max_entropy else float(max(e.max(), 1e-6)),
        colorscale=VIRIDIS,
        colorbar=colorbar(f"entropy ({unit})"),
        hovertemplate="layer %{y} · head %{x}<br>entropy %{z:.3f} " + unit + "<extra></extra>",
    ))
    base_layout(fig, f"{title}<br><sup>{subtitle}</sup>" if subtitle else title,
                height=int(np.clip(34 * L + 200, 320, 720)), width=int(np.clip(40 * H + 260, 560, 1000)))
    if subtitle:
        fig.update_layout(margin=dict(t=60 + 18 * (subtitle.count("<br>") + 1)))
    fig.update_xaxes(title=dict(text="head"), dtick=1)
    fig.update_yaxes(title=dict(text="layer"), autorange="reversed", dtick=1)
    return fig.build()


def head_metric_scatter(values: np.ndarray, *, metric: str = "mean attention distance",
                        unit: str = "pixels", title: str | None = None) -> go.Figure:
    """ViT paper Fig. 7 (right): one dot per head, x = layer (network depth), y = the metric.

    values: (L, H), e.g. mean attention distance in pixels, or entropy in bits. Heads are coloured
    consistently across layers and jittered a little sideways so dots do not hide each other."""
    v = np.asarray(values, dtype=np.float32)
    L, H = v.shape
    jitter = np.linspace(-0.18, 0.18, H) if H > 1 else np.zeros(1)
    traces = []
    for h in range(H):
        traces.append(dict(
            type="scatter", x=f32(np.arange(L) + jitter[h]), y=f32(v[:, h]), mode="markers", name=f"head {h}",
            marker=dict(size=9, color=HEAD_COLORS[h % len(HEAD_COLORS)], line=dict(color="white", width=0.5)),
            customdata=np.arange(L), hovertemplate=f"layer %{{customdata}} · head {h}<br>{metric}: "
            + "%{y:.2f} " + unit + "<extra></extra>",
        ))
    fig = Fig(traces)
    base_layout(fig, title or f"{metric[0].upper()}{metric[1:]} per head", height=480)
    fig.update_xaxes(title=dict(text="layer (network depth)"), dtick=1, range=[-0.6, L - 0.4])
    fig.update_yaxes(title=dict(text=f"{metric} ({unit})"), rangemode="tozero", showgrid=True, gridcolor="#eee")
    fig.update_layout(legend=dict(font=dict(size=11)))
    return fig.build()
