"""Positional-encoding figures: sinusoidal table and curves, position–position similarity, RoPE, learned
ViT position-embedding similarity (ViT paper, Fig. 7 centre), relative-position-bias tables."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from viz.common import DIVERGING_SCALE, HEAD_COLORS, VIRIDIS, Fig, base_layout, colorbar, f32, tile


def sinusoidal_heatmap(pe: np.ndarray, *, title: str = "Sinusoidal position encoding",
                       max_cells: int = 131072) -> go.Figure:
    """Position × dimension heatmap of a (P, D) encoding table (Vaswani et al. 2017, §3.5).

    Tables larger than ``max_cells`` show every k-th dimension pair (said in the subtitle), which keeps
    the figure well inside the 2 MB budget for any d_model."""
    p = np.asarray(pe, dtype=np.float32)
    P, D = p.shape
    pairs = max(1, int(np.ceil(P * D / max_cells)))
    dims = np.arange(D) if pairs == 1 else np.sort(np.r_[np.arange(0, D, 2 * pairs), np.arange(1, D, 2 * pairs)])
    fig = Fig(dict(
        type="heatmap", z=f32(p[:, dims]), x=dims.astype(np.int32) if pairs > 1 else None, zmin=-1, zmax=1,
        colorscale=DIVERGING_SCALE, colorbar=colorbar("encoding value"),
        hovertemplate="position %{y} · dimension %{x}<br>value %{z:.3f}<extra></extra>",
    ))
    sub = f"{P} positions × {D} dimensions; low dimensions change fast, high ones slowly"
    if pairs > 1:
        sub += f" · 1 in {pairs} sin/cos pairs shown"
    base_layout(fig, f"{title}<br><sup>{sub}</sup>", height=520)
    fig.update_xaxes(title=dict(text="dimension"))
    fig.update_yaxes(title=dict(text="position"), autorange="reversed")
    fig.update_layout(margin=dict(t=100))
    return fig.build()


def sinusoidal_curves(pe: np.ndarray, dims: Sequence[int], *, title: str = "Encoding value along positions"
                      ) -> go.Figure:
    """Chosen dimensions of a (P, D) encoding as curves over position."""
    p = np.asarray(pe, dtype=np.float32)
    pos = np.arange(p.shape[0], dtype=np.float32)
    fig = Fig([
        dict(type="scatter", x=pos, y=f32(p[:, d]), mode="lines", name=f"dim {d}",
             line=dict(width=2.5, color=HEAD_COLORS[i % len(HEAD_COLORS)]),
             hovertemplate=f"dim {d} · position %{{x}}: %{{y:.3f}}<extra></extra>")
        for i, d in enumerate(dims)
    ])
    base_layout(fig, title, height=420)
    fig.update_xaxes(title=dict(text="position"))
    fig.update_yaxes(title=dict(text="value"), range=[-1.1, 1.1], showgrid=True, gridcolor="#eee")
    return fig.build()


def similarity_matrix(x: np.ndarray, metric: str = "cosine") -> np.ndarray:
    """(P, P) dot-product or cosine similarity between the rows of a (P, D) table."""
    a = np.asarray(x, dtype=np.float64)
    if metric == "cosine":
        a = a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)
    elif metric != "dot":
        raise ValueError(f"metric must be 'cosine' or 'dot', got {metric!r}")
    return a @ a.T


def position_similarity(pe: np.ndarray, metric: str = "cosine", *, title: str | None = None) -> go.Figure:
    """Position × position similarity of a (P, D) encoding (dot product or cosine)."""
    s = similarity_matrix(pe, metric)
    lim = 1.0 if metric == "cosine" else float(np.abs(s).max() or 1.0)
    fig = Fig(dict(
        type="heatmap", z=f32(s), zmin=-lim, zmax=lim, colorscale=DIVERGING_SCALE,
        colorbar=colorbar(f"{metric} similarity"),
        hovertemplate="position %{y} · position %{x}<br>%{z:.3f}<extra></extra>",
    ))
    base_layout(fig, title or f"Position–position {metric} similarity", height=560, width=640)
    fig.update_xaxes(title=dict(text="position"))
    fig.update_yaxes(title=dict(text="position"), autorange="reversed", scaleanchor="x", constrain="domain")
    return fig.build()


def rope_rotation(vectors: np.ndarray, *, pair: int = 0, title: str | None = None) -> go.Figure:
    """One 2-D pair of a RoPE-rotated vector at each position (Su et al. 2021): position m turns the pair
    by m·θ. vectors: (P, 2). Drawn as arrows from the origin, coloured by position."""
    v = np.asarray(vectors, dtype=np.float32)
    P = v.shape[0]
    ang = np.degrees(np.arctan2(v[:, 1], v[:, 0]))
    x = np.stack([np.zeros(P), v[:, 0], np.full(P, np.nan)], 1).ravel()
    y = np.stack([np.zeros(P), v[:, 1], np.full(P, np.nan)], 1).ravel()
    r = float(np.abs(v).max() or 1.0) * 1.15
    fig = Fig([
        dict(type="scatter", x=f32(x), y=f32(y), mode="lines", line=dict(color="#bbb", width=1.5),
             hoverinfo="skip", showlegend=False),
        dict(type="scatter", x=f32(v[:, 0]), y=f32(v[:, 1]), mode="markers+text" if P <= 24 else "markers",
             text=[str(m) for m in range(P)], textposition="top center", customdata=f32(ang),
             marker=dict(size=10, color=np.arange(P), colorscale=VIRIDIS, colorbar=colorbar("position")),
             hovertemplate="position %{text}<br>angle %{customdata:.1f}°<extra></extra>", showlegend=False),
    ])
    base_layout(fig, title or f"RoPE: pair {pair} rotated by position", height=560, width=620)
    fig.update_xaxes(range=[-r, r], zeroline=True, zerolinecolor="#ddd", title=dict(text=f"component {2 * pair}"))
    fig.update_yaxes(range=[-r, r], zeroline=True, zerolinecolor="#ddd", scaleanchor="x",
                     title=dict(text=f"component {2 * pair + 1}"))
    return fig.build()


def rope_offset_scores(scores: np.ndarray, query_positions: Sequence[int] | None = None, *,
                       title: str = "RoPE: q·k depends only on the offset") -> go.Figure:
    """q_m·k_n as a function of the offset n − m, one curve per query position m. scores: (P, P) with
    scores[m, n] = ⟨RoPE(q, m), RoPE(k, n)⟩. With RoPE the curves lie on top of each other."""
    s = np.asarray(scores, dtype=np.float32)
    P = s.shape[0]
    ms = list(query_positions) if query_positions is not None else sorted({0, P // 4, P // 2, 3 * P // 4})
    traces = []
    for i, m in enumerate(ms):
        n = np.arange(P)
        traces.append(dict(type="scatter", x=f32(n - m), y=f32(s[m]), mode="lines+markers" if P <= 40 else "lines",
                           name=f"query at position {m}",
                           line=dict(width=2, color=HEAD_COLORS[i % len(HEAD_COLORS)],
                                     dash=["solid", "dash", "dot", "dashdot"][i % 4]),
                           marker=dict(size=5), hovertemplate="offset %{x}: q·k = %{y:.3f}<extra></extra>"))
    fig = Fig(traces)
    base_layout(fig, title, height=440)
    fig.update_xaxes(title=dict(text="offset n − m (key position − query position)"), zeroline=True,
                     zerolinecolor="#ccc")
    fig.update_yaxes(title=dict(text="q·k"), showgrid=True, gridcolor="#eee")
    return fig.build()


def learned_pe_grid(pos_embed: np.ndarray, grid: tuple[int, int], *,
                    title: str = "Learned position embeddings: cosine similarity") -> go.Figure:
    """ViT paper Fig. 7 (centre): for each patch (r, c) a small rows × cols image of its position
    embedding's cosine similarity to every other patch, the small images laid out in the patch grid.

    pos_embed: (rows·cols, D), the patches' embeddings only (the caller drops the prefix tokens')."""
    rows, cols = grid
    e = np.asarray(pos_embed, dtype=np.float32)
    if e.shape[0] != rows * cols:
        raise ValueError(f"{e.shape[0]} embeddings do not fit a {rows}×{cols} grid")
    sim = similarity_matrix(e, "cosine").astype(np.float32).reshape(rows * cols, rows, cols)
    z = tile(sim, ncols=cols, gap=1)
    fig = Fig(dict(
        type="heatmap", z=z, zmin=-1, zmax=1, colorscale=DIVERGING_SCALE, colorbar=colorbar("cosine similarity"),
        hoverongaps=False, hovertemplate="%{z:.3f}<extra></extra>",
    ))
    base_layout(fig, f"{title}<br><sup>tile (r, c): similarity of patch (r, c)'s embedding to every patch</sup>",
                height=680, width=700)
    step = rows + 1
    fig.update_xaxes(tickmode="array", tickvals=[c * step + (cols - 1) / 2 for c in range(cols)],
                     ticktext=[str(c) for c in range(cols)], title=dict(text="input patch column"), ticks="")
    fig.update_yaxes(tickmode="array", tickvals=[r * step + (rows - 1) / 2 for r in range(rows)],
                     ticktext=[str(r) for r in range(rows)], title=dict(text="input patch row"),
                     autorange="reversed", scaleanchor="x", ticks="")
    fig.update_layout(margin=dict(t=100))
    return fig.build()


def relative_bias_tables(tables: np.ndarray, *, title: str = "Relative position bias per head",
                         ncols: int | None = None, labels: Sequence[str] | None = None,
                         expanded: bool = False) -> go.Figure:
    """One bias table per head, tiled: Swin's B̂ of size (2M−1)×(2M−1) indexed by offset, or with
    ``expanded=True`` the N × N bias (query token × key token) that is added to the scores.

    tables: (H, a, b). Signed values: diverging colours centred on 0."""
    t = np.asarray(tables, dtype=np.float32)
    H, a, b = t.shape
    ncols = ncols or int(min(H, 6))
    gap = max(1, a // 6)
    z = tile(t, ncols=ncols, gap=gap)
    lim = float(np.abs(t).max() or 1.0)
    nrows = int(np.ceil(H / ncols))
    fig = Fig(dict(type="heatmap", z=z, zmin=-lim, zmax=lim, colorscale=DIVERGING_SCALE, colorbar=colorbar("bias"),
                   hoverongaps=False, hovertemplate="bias %{z:.3f}<extra></extra>"))
    names = list(labels) if labels is not None else [f"head {h}" for h in range(H)]
    ann = []
    for h in range(H):
        r, c = divmod(h, ncols)
        ann.append(dict(x=c * (b + gap) + (b - 1) / 2, y=r * (a + gap) - 0.6, text=names[h], showarrow=False,
                        yanchor="bottom", font=dict(size=12)))
    cell = int(np.clip(150 / max(a, b), 2, 20))
    sub = "query token × key token" if expanded else f"row/column offset −{(a - 1) // 2}…{(a - 1) // 2}"
    base_layout(fig, f"{title}<br><sup>{sub}</sup>",
                height=int(nrows * (a + gap) * cell + 180), width=int(ncols * (b + gap) * cell + 200))
    fig.update_layout(annotations=ann, margin=dict(t=110))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False, autorange="reversed", scaleanchor="x")
    return fig.build()


def t5_bias(offsets: np.ndarray, encoder_buckets: np.ndarray, decoder_buckets: np.ndarray, encoder_bias: np.ndarray,
            decoder_bias: np.ndarray, *, title: str = "T5's relative position bias") -> go.Figure:
    """T5's bucketed relative positions (Raffel et al. 2020, §2.1) in three panels over the offset key − query:
    the bucket function (the encoder's bidirectional, the decoder's causal: later keys all in bucket 0, masked
    anyway), then each head's learned bias by offset in the encoder and in the decoder (one line per head; flat
    stretches are offsets that share a bucket).

    offsets: (N,) ints; encoder_buckets, decoder_buckets: (N,) bucket ids; encoder_bias, decoder_bias: (H, N)."""
    x = np.asarray(offsets, dtype=np.int32)
    enc, dec = np.asarray(encoder_bias, np.float32), np.asarray(decoder_bias, np.float32)
    fig = Fig(rows=1, cols=3, subplot_titles=["bucket of each offset", "encoder bias per head",
                                              "decoder bias per head (keys ≤ query)"], horizontal_spacing=0.07)
    for name, b, dash in (("encoder (bidirectional)", encoder_buckets, "solid"),
                          ("decoder (causal)", decoder_buckets, "dot")):
        fig.add_trace(dict(type="scatter", x=x, y=np.asarray(b, np.int32), mode="lines", name=name,
                           line=dict(shape="hv", width=2.5, dash=dash), legendgroup="buckets",
                           hovertemplate=f"{name}<br>offset %{{x}} → bucket %{{y}}<extra></extra>"), row=1, col=1)
    causal = x <= 0
    for col, (stack, bias, keep) in enumerate((("encoder", enc, np.ones_like(causal)), ("decoder", dec, causal)), 2):
        for h in range(bias.shape[0]):
            fig.add_trace(dict(type="scatter", x=x[keep], y=f32(bias[h][keep]), mode="lines", name=f"head {h}",
                               legendgroup=f"head {h}", showlegend=col == 2,
                               line=dict(shape="hv", width=1.8, color=HEAD_COLORS[h % len(HEAD_COLORS)]),
                               hovertemplate=f"{stack} head {h}<br>offset %{{x}}: bias %{{y:.3f}}<extra></extra>"),
                          row=1, col=col)
    base_layout(fig, f"{title}<br><sup>offset = key position − query position; each bucket is one learned number "
                     "per head, added to q·k in every layer</sup>", height=440)
    for col in (1, 2, 3):
        fig.update_xaxes(title=dict(text="offset (key − query)"), zeroline=True, zerolinecolor="#bbb", row=1, col=col)
    fig.update_yaxes(title=dict(text="bucket"), row=1, col=1)
    fig.update_yaxes(title=dict(text="bias added to the score"), row=1, col=2)
    fig.update_layout(margin=dict(t=110))
    return fig.build()
