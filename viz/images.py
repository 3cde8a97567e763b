"""Image figures: attention over patches laid on the image, a head grid, a clicked patch's attention,
and the top-k probability bars."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from viz.common import (
    OVERLAY_SCALE,
    WEIGHT_LABEL,
    Fig,
    as_uint8_image,
    base_layout,
    colorbar,
    esc,
    f32,
    png_data_uri,
    rect_path,
    shorten,
    tile,
    weight_range,
)


def patch_map(values: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """(rows, cols) map out of a per-patch vector of rows·cols values (the caller drops [CLS] and any other
    prefix token: ``ImageResult.prefix_tokens`` says how many there are)."""
    v = np.asarray(values, dtype=np.float32).reshape(-1)
    rows, cols = grid
    if v.size != rows * cols:
        raise ValueError(f"{v.size} values do not fit a {rows}×{cols} patch grid")
    return v.reshape(rows, cols)


def _image_trace(image: np.ndarray) -> dict:
    # The image travels once as a PNG data URI (a 224×224 photo is ~100 KB); an image trace draws pixels
    # unsmoothed, so a 28×28 Fashion-MNIST image stays crisp.
    return dict(type="image", source=png_data_uri(image), hoverinfo="skip", name="image")


def _patch_heatmap(amap: np.ndarray, patch: float, zmin: float, zmax: float, opacity: float,
                   hover: str, show_scale: bool = True) -> dict:
    rows, cols = amap.shape
    r, c = np.mgrid[0:rows, 0:cols]
    labels = np.char.add(np.char.add("r", r.astype(str)), np.char.add("c", c.astype(str)))
    return dict(
        type="heatmap", z=f32(amap), x0=(patch - 1) / 2, dx=patch, y0=(patch - 1) / 2, dy=patch, zmin=zmin, zmax=zmax,
        colorscale=OVERLAY_SCALE, opacity=opacity, showscale=show_scale,
        colorbar=colorbar(hover), text=labels, hovertemplate="patch %{text}<br>" + hover
        + ": %{z:.4f}<extra></extra>",
    )


def _image_axes(fig: Fig, image: np.ndarray, row: int | None = None, col: int | None = None) -> None:
    h, w = image.shape[:2]
    fig.update_xaxes(range=[-0.5, w - 0.5], showticklabels=False, ticks="", showline=False, row=row, col=col)
    fig.update_yaxes(range=[h - 0.5, -0.5], showticklabels=False, ticks="", showline=False, row=row, col=col,
                     **({} if row else dict(scaleanchor="x")))


def image_attention(
    image: np.ndarray,
    values: np.ndarray,
    grid: tuple[int, int],
    *,
    title: str = "CLS → patch attention",
    label: str = WEIGHT_LABEL,
    opacity: float = 1.0,
    autoscale: bool = True,
) -> go.Figure:
    """A per-patch map (CLS → patch attention of one head, or rollout) laid over the image.

    image: uint8 (H, W) grey or (H, W, 3) RGB, exactly what the model saw; values: rows·cols, one
    per patch (no prefix tokens); grid: (rows, cols). A CLS row spreads over ~200 patches,
    so the colour scale runs 0–max by default (``autoscale=False`` for fixed 0–1)."""
    return _image_attention(image, values, grid, title=title, label=label, opacity=opacity,
                            autoscale=autoscale).build()


def _image_attention(image: np.ndarray, values: np.ndarray, grid: tuple[int, int], *, title: str,
                     label: str = WEIGHT_LABEL, opacity: float = 1.0, autoscale: bool = True) -> Fig:
    img = as_uint8_image(image)
    amap = patch_map(values, grid)
    patch = img.shape[0] / grid[0]
    zmin, zmax = weight_range(amap, autoscale)
    fig = Fig([_image_trace(img), _patch_heatmap(amap, patch, zmin, zmax, opacity, label)])
    base_layout(fig, title, height=560, width=620)
    _image_axes(fig, img)
    return fig


def image_attention_grid(
    image: np.ndarray,
    maps: np.ndarray,
    grid: tuple[int, int],
    *,
    titles: Sequence[str] | None = None,
    ncols: int = 4,
    title: str = "CLS → patch attention per head",
    autoscale: bool = True,
    max_side: int = 112,
    patch: float | None = None,
) -> go.Figure:
    """Small multiples of per-patch maps over the image (e.g. every head of one layer, every layer ×
    head, or rollout after each layer). maps: (N, rows·cols) or (N, rows, cols); colour scale shared.
    ``patch``: pixels per patch side; where the grid reaches past the image (a Swin stage whose odd grid was padded
    before merging) the image keeps its scale and the cells past its edge lie over white. None: the grid spans the
    image exactly.

    Drawn as ONE tiled greyscale underlay (the image shrunk to ≤ ``max_side`` px, repeated) and ONE
    tiled heatmap with blank gaps, not N subplots: 144 panels stay light and build in well under a second.
    """
    m = np.asarray(maps, dtype=np.float32)
    n = m.shape[0]
    rows, cols = grid
    amaps = np.stack([patch_map(m[i], grid) for i in range(n)])
    titles = list(titles) if titles is not None else [f"head {i}" for i in range(n)]
    ncols = max(1, min(ncols, n))
    nrows = int(np.ceil(n / ncols))
    if n > 16:  # many panels: smaller underlays keep the figure light
        max_side = min(max_side, 56)
    img = as_uint8_image(image)
    grey = img if img.ndim == 2 else img.mean(axis=2).astype(np.uint8)
    cell = max(1, int(round(max_side / max(rows, cols))))  # underlay pixels per patch
    extent = grey.shape if patch is None else (rows * patch, cols * patch)  # pixels the grid covers
    ri = (np.arange(rows * cell) * extent[0] / (rows * cell)).astype(int)
    ci = (np.arange(cols * cell) * extent[1] / (cols * cell)).astype(int)
    small = np.full((ri.size, ci.size), 255, dtype=np.uint8)  # nearest-neighbour resample to rows·cell × cols·cell
    inside_r, inside_c = ri < grey.shape[0], ci < grey.shape[1]
    small[np.ix_(inside_r, inside_c)] = grey[ri[inside_r]][:, ci[inside_c]]
    row_gap = 3  # patch cells between panel rows: room for the panel titles
    under = tile(np.repeat(small[None], n, axis=0), ncols, gap=cell, fill=255, row_gap=row_gap * cell)
    z = tile(amaps, ncols, gap=1, row_gap=row_gap)
    zmin, zmax = weight_range(amaps, autoscale)
    fig = Fig([
        dict(type="image", source=png_data_uri(under), hoverinfo="skip"),
        dict(type="heatmap", z=z, x0=(cell - 1) / 2, dx=cell, y0=(cell - 1) / 2, dy=cell, zmin=zmin, zmax=zmax,
             colorscale=OVERLAY_SCALE, colorbar=colorbar(WEIGHT_LABEL), hoverongaps=False,
             hovertemplate=WEIGHT_LABEL + ": %{z:.4f}<extra></extra>"),
    ])
    ann = [dict(x=(i % ncols) * (cols + 1) * cell + cols * cell / 2 - 0.5,
                y=(i // ncols) * (rows + row_gap) * cell - 0.5, text=esc(titles[i]), showarrow=False,
                yanchor="bottom", font=dict(size=12 if ncols <= 6 else 10)) for i in range(n)]
    panel = int(np.clip(900 / ncols, 60, 220))
    base_layout(fig, title, width=panel * ncols + 200, height=int(panel * nrows * (rows + row_gap) / rows) + 130)
    fig.update_layout(annotations=ann)
    _image_axes(fig, under)
    return fig.build()


def query_patch_attention(
    image: np.ndarray,
    values: np.ndarray,
    grid: tuple[int, int],
    query: int | tuple[int, int],
    *,
    title: str | None = None,
    autoscale: bool = True,
    opacity: float = 1.0,
) -> go.Figure:
    """Attention of one chosen query patch over all patches, on the image, with the query outlined.

    values: that query's attention row over the patches (rows·cols); query: the patch
    as (row, col) or its index in the rows·cols grid."""
    rows, cols = grid
    qr, qc = divmod(int(query), cols) if np.ndim(query) == 0 else (int(query[0]), int(query[1]))
    if not (0 <= qr < rows and 0 <= qc < cols):
        raise ValueError(f"query patch {(qr, qc)} is outside the {rows}×{cols} grid")
    img = as_uint8_image(image)
    patch = img.shape[0] / rows
    fig = _image_attention(img, values, grid, title=title or f"Attention of query patch r{qr}c{qc}",
                           autoscale=autoscale, opacity=opacity)
    fig.add_shape(type="path", path=rect_path(qc * patch - 0.5, qr * patch - 0.5, (qc + 1) * patch - 0.5,
                                              (qr + 1) * patch - 0.5), line=dict(color="#d62728", width=3))
    return fig.build()


def topk_bars(labels: Sequence[str], probs: np.ndarray, k: int = 5, *, title: str = "Top classes") -> go.Figure:
    """Horizontal bars of the ``k`` most probable classes, the most probable on top."""
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    if len(p) != len(labels):
        raise ValueError(f"{len(p)} probabilities for {len(labels)} labels")
    order = np.argsort(-p)[: max(1, k)]
    names = [esc(shorten(labels[i], 28)) for i in order]
    fig = Fig(dict(
        type="bar", x=f32(p[order]), y=names, orientation="h", marker=dict(color="#3182bd"),
        text=[f"{v:.1%}" for v in p[order]], textposition="outside", cliponaxis=False,
        hovertext=[esc(labels[i]) for i in order], hovertemplate="%{hovertext}: %{x:.2%}<extra></extra>",
    ))
    base_layout(fig, title, height=int(60 + 46 * len(order) + 80))
    fig.update_xaxes(range=[0, 1.12], tickformat=".0%", title=dict(text="probability"))
    fig.update_yaxes(autorange="reversed", ticks="")
    fig.update_layout(margin=dict(l=20, r=30, t=60, b=50))
    return fig.build()
