"""The head atlas's figures: a layer × head grid of one metric, the heads ranked, a head's mean pattern by offset,
two models' grids side by side, and a metric by layer (ViT fig. 7). Arrays in, go.Figure out."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from viz.common import ATTENTION_SCALE, VIRIDIS, Fig, base_layout, colorbar, esc, f32

SHARE_UNITS = ("share",)


def _range(values: np.ndarray, unit: str) -> tuple[float, float]:
    if unit in SHARE_UNITS:
        return 0.0, 1.0
    finite = values[np.isfinite(values)]
    return 0.0, float(finite.max()) if finite.size and finite.max() > 0 else 1.0


def with_unit(label: str, unit: str) -> str:
    """An axis or colour-bar title: the metric's label and its unit, the unit left out when the label says it
    already ("mean attention distance in pixels", "[CLS] share")."""
    return label if unit in label else f"{label} ({unit})"


def _grid_trace(grid: np.ndarray, label: str, unit: str, zrange: tuple[float, float], showscale: bool = True,
                colorscale: list | None = None) -> dict:
    g = np.asarray(grid, dtype=np.float32)
    layers, heads = g.shape
    trace = dict(type="heatmap", z=f32(g), x=list(range(heads)), y=list(range(layers)), zmin=zrange[0],
                 zmax=zrange[1], colorscale=colorscale or (ATTENTION_SCALE if unit in SHARE_UNITS else VIRIDIS),
                 showscale=showscale, colorbar=colorbar(with_unit(label, unit)), xgap=1, ygap=1,
                 hovertemplate=f"layer %{{y}} · head %{{x}}<br>{esc(label)}: %{{z:.3f}} {unit}<extra></extra>")
    if layers * heads <= 400:  # small grids carry their numbers
        trace.update(text=[[("" if not np.isfinite(v) else f"{v:.2f}") for v in row] for row in g],
                     texttemplate="%{text}", textfont=dict(size=10))
    return trace


def head_grid(grid: np.ndarray, label: str, unit: str = "share", *, title: str | None = None,
              mark: tuple[int, int] | None = None) -> go.Figure:
    """Layer × head heatmap of one metric (L, H); NaN cells (a head the model lacks there) stay empty. ``mark``
    outlines one head (the head card's)."""
    g = np.asarray(grid, dtype=np.float32)
    if g.ndim != 2:
        raise ValueError(f"a head grid is (layers, heads), got {g.shape}")
    layers, heads = g.shape
    fig = Fig(_grid_trace(g, label, unit, _range(g, unit)))
    if mark is not None:
        layer, head = mark
        fig.add_shape(type="rect", x0=head - 0.5, x1=head + 0.5, y0=layer - 0.5, y1=layer + 0.5,
                      line=dict(color="#d62728", width=3))
    base_layout(fig, title or f"{label[0].upper()}{label[1:]} per head",
                height=int(np.clip(28 * layers + 200, 320, 900)), width=int(np.clip(38 * heads + 280, 480, 1200)))
    fig.update_xaxes(title=dict(text="head"), dtick=1 if heads <= 16 else 2)
    fig.update_yaxes(title=dict(text="layer"), autorange="reversed", dtick=1 if layers <= 16 else 2)
    return fig.build()


def head_ranking(rows: Sequence[tuple[int, int, float]], label: str, unit: str = "share", *, top: int = 20,
                 title: str | None = None) -> go.Figure:
    """The ``top`` heads of a ranking (layer, head, value), best at the top, as horizontal bars."""
    rows = [r for r in rows if np.isfinite(r[2])][:top]
    names = [f"L{layer} H{head}" for layer, head, _ in rows]
    fig = Fig(dict(type="bar", orientation="h", x=f32(np.array([v for _, _, v in rows], np.float32)), y=names,
                   customdata=[[layer, head] for layer, head, _ in rows],  # a click opens the head (tabs/page.py)
                   marker=dict(color="#4c72b0"), text=[f"{v:.3f}" for _, _, v in rows], textposition="outside",
                   hovertemplate="%{y}: %{x:.3f} " + unit + "<extra></extra>"))
    base_layout(fig, title or f"Heads ranked by {label}", height=int(np.clip(22 * len(rows) + 160, 260, 700)))
    fig.update_yaxes(autorange="reversed", type="category")
    top_value = max((v for _, _, v in rows), default=1.0)
    fig.update_xaxes(title=dict(text=with_unit(label, unit)), range=[0, max(top_value, 1e-6) * 1.18])  # room for labels
    return fig.build()


def offset_profile(profile: np.ndarray, *, causal: bool = True, title: str = "Mean attention by offset"
                   ) -> go.Figure:
    """One head's mean weight at each offset i − j (profile (2D + 1,) for −D … D); a causal model shows 0 … D."""
    p = np.asarray(profile, dtype=np.float32)
    d = (len(p) - 1) // 2
    offsets = np.arange(-d, d + 1)
    keep = offsets >= 0 if causal else np.ones_like(offsets, bool)
    fig = Fig(dict(type="bar", x=offsets[keep].tolist(), y=f32(np.nan_to_num(p[keep])), marker=dict(color="#55a868"),
                   hovertemplate="offset %{x} (query − key): %{y:.3f}<extra></extra>"))
    base_layout(fig, title, height=320)
    fig.update_xaxes(title=dict(text="offset i − j (0: itself, 1: the previous token)"), dtick=1 if d <= 16 else 2)
    fig.update_yaxes(title=dict(text="mean weight"), rangemode="tozero")
    return fig.build()


def compare_grids(a: np.ndarray, b: np.ndarray, names: tuple[str, str], label: str, unit: str = "share"
                  ) -> go.Figure:
    """Two models' grids of one metric side by side on one colour scale (each its own shape), and B − A when the
    shapes agree."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    same = a.shape == b.shape
    cols = 3 if same else 2
    both = np.concatenate([a.ravel(), b.ravel()])
    zrange = _range(both, unit)
    titles = [esc(names[0]), esc(names[1])] + ([esc(f"{names[1]} − {names[0]}")] if same else [])
    fig = Fig(rows=1, cols=cols, subplot_titles=titles, horizontal_spacing=0.08)
    fig.add_trace(_grid_trace(a, label, unit, zrange, showscale=True), row=1, col=1)
    fig.add_trace(_grid_trace(b, label, unit, zrange, showscale=False), row=1, col=2)
    if same:
        diff = b - a
        m = float(np.nanmax(np.abs(diff))) if np.isfinite(diff).any() else 1.0
        trace = _grid_trace(diff, f"difference in {label}", unit, (-max(m, 1e-6), max(m, 1e-6)), showscale=False,
                            colorscale=[[0, "#2166ac"], [0.5, "#f7f7f7"], [1, "#b2182b"]])
        fig.add_trace(trace, row=1, col=3)
    for c in range(1, cols + 1):
        fig.update_xaxes(title=dict(text="head"), row=1, col=c)
        fig.update_yaxes(autorange="reversed", row=1, col=c)
    fig.update_yaxes(title=dict(text="layer"), row=1, col=1)
    layers = max(a.shape[0], b.shape[0])
    base_layout(fig, f"{label[0].upper()}{label[1:]}: two models", height=int(np.clip(28 * layers + 220, 340, 900)),
                width=int(np.clip(cols * (34 * max(a.shape[1], b.shape[1]) + 80) + 200, 640, 1500)))
    fig.update_layout(margin=dict(t=100))
    return fig.build()


def by_layer(grid: np.ndarray, label: str, unit: str) -> go.Figure:
    """Every head's value against its layer, with the layer's mean as a line (the ViT paper's fig. 7 layout)."""
    g = np.asarray(grid, dtype=np.float32)
    layers, heads = g.shape
    jitter = np.linspace(-0.15, 0.15, heads) if heads > 1 else np.zeros(1)
    xs = (np.arange(layers)[:, None] + jitter[None, :]).ravel()
    head_ids = np.tile(np.arange(heads), layers)
    fig = Fig([dict(type="scatter", mode="markers", x=f32(xs), y=f32(g.ravel()), name="heads",
                    customdata=np.stack([np.repeat(np.arange(layers), heads), head_ids], -1).tolist(),
                    marker=dict(size=8, color="#4c72b0", opacity=0.75),
                    hovertemplate="layer %{customdata[0]} · head %{customdata[1]}: %{y:.2f}<extra></extra>"),
               dict(type="scatter", mode="lines+markers", x=list(range(layers)),
                    y=f32(np.array([np.nanmean(r) if np.isfinite(r).any() else np.nan for r in g], np.float32)),
                    name="layer mean", line=dict(color="#d62728"))])
    base_layout(fig, f"{label[0].upper()}{label[1:]} by layer", height=420)
    fig.update_xaxes(title=dict(text="layer (network depth)"), dtick=1)
    fig.update_yaxes(title=dict(text=with_unit(label, unit)), rangemode="tozero")
    return fig.build()
