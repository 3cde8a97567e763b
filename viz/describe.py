"""Figures of a vision-language model's answer (the Image + text tab): a value per image token laid over the pixels
it came from, the attention to the text tokens, and the logit lens read on the image tokens.

Every image figure takes the tokens' pixel boxes (``DescribeResult.image_boxes``: x0, y0, x1, y1 on the image the
model saw, ends exclusive), not a patch grid, so tiled, merged and resized layouts are drawn where their pixels are.
The map is drawn at the coarsest resolution that still holds every box edge exactly (the greatest common divisor of
the edges and the image's sides), so an 8-pixel patch grid is an 8×8 heatmap, not 64×64 cells."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import reduce

import numpy as np
import plotly.graph_objects as go

from viz.common import (
    DIVERGING_SCALE,
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
)
from viz.generate import LENS_SCALE

MAX_CELLS = 160  # cells per side of a drawn map at most: finer box edges are sampled at this many cells


def token_groups(cells: np.ndarray, boxes: np.ndarray) -> list[np.ndarray]:
    """The image tokens split into layers whose boxes do not overlap, in token order: the tiles of a tiled layout
    together, then its downscaled global view (which covers the same pixels again). One tile: one group."""
    cells, boxes = np.asarray(cells), np.asarray(boxes)
    groups: list[list[int]] = []
    for tile in dict.fromkeys(cells[:, 0].tolist()):
        members = np.flatnonzero(cells[:, 0] == tile)
        for group in groups:
            if not any(_overlap(boxes[i], boxes[j]) for i in members for j in group):
                group.extend(members.tolist())
                break
        else:
            groups.append(members.tolist())
    return [np.asarray(g, dtype=np.int64) for g in groups]


def _overlap(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3])


def box_map(values: np.ndarray, boxes: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, int]:
    """(N,) values over (N, 4) boxes -> (map (h, w) float32, pixels per cell): NaN where no box lies (the image
    shows through). Cells are the greatest common divisor of every box edge and the image's sides, so each box is
    whole cells; where that is finer than MAX_CELLS per side, cells of the largest side ÷ MAX_CELLS pixels, each
    taking the value at its centre pixel."""
    values, boxes = np.asarray(values, dtype=np.float32), np.asarray(boxes, dtype=np.int64)
    if len(values) != len(boxes):
        raise ValueError(f"{len(values)} values for {len(boxes)} image tokens")
    h, w = shape
    cell = reduce(math.gcd, [int(v) for v in boxes.ravel()], math.gcd(h, w)) or 1
    if max(h, w) / cell > MAX_CELLS:
        cell = math.ceil(max(h, w) / MAX_CELLS)
    rows, cols = math.ceil(h / cell), math.ceil(w / cell)
    out = np.full((rows, cols), np.nan, np.float32)
    centre_y = np.minimum(np.arange(rows) * cell + cell // 2, h - 1)
    centre_x = np.minimum(np.arange(cols) * cell + cell // 2, w - 1)
    for v, (x0, y0, x1, y1) in zip(values, boxes):  # later tokens win where boxes overlap (pass one group)
        r = (centre_y >= y0) & (centre_y < y1)
        c = (centre_x >= x0) & (centre_x < x1)
        out[np.ix_(r, c)] = v
    return out, cell


def image_overlay(image: np.ndarray, values: np.ndarray, boxes: np.ndarray, *, title: str,
                  label: str = WEIGHT_LABEL, signed: bool = False, names: Sequence[str] | None = None,
                  marks: Sequence[tuple[Sequence[float], str, str]] = (), width: int = 520) -> go.Figure:
    """One value per image token over the image the model saw. Unsigned (attention): transparent at 0, warm where
    high, 0 to the largest value. ``signed`` (relevance): blue against, red for, centred on 0. ``names``: each
    token's label for the hover. ``marks``: (box x0, y0, x1, y1, colour, name) outlines drawn on top (e.g. the
    cell another method points at)."""
    img = as_uint8_image(image)
    amap, cell = box_map(values, boxes, img.shape[:2])
    finite = amap[np.isfinite(amap)]
    top = float(np.abs(finite).max()) if finite.size else 0.0
    blank = top == 0  # nothing to scale (a bare image with marks): no colour bar
    top = top if top > 0 else 1.0
    hover = np.full(amap.shape, "", dtype=object)
    if names is not None:
        for name, (x0, y0, x1, y1) in zip(names, np.asarray(boxes)):
            hover[y0 // cell:-(-y1 // cell), x0 // cell:-(-x1 // cell)] = esc(name)
    heat = dict(type="heatmap", z=f32(amap), x0=(cell - 1) / 2, dx=cell, y0=(cell - 1) / 2, dy=cell,
                zmin=-top if signed else 0.0, zmax=top, colorscale=DIVERGING_SCALE if signed else OVERLAY_SCALE,
                opacity=0.7 if signed else 1.0, colorbar=colorbar(label), showscale=not blank, hoverongaps=False,
                customdata=hover.tolist(), hovertemplate="%{customdata}<br>" + esc(label)
                + (": %{z:+.4g}" if signed else ": %{z:.4f}") + "<extra></extra>")
    if signed:
        heat["zmid"] = 0
    fig = Fig([dict(type="image", source=png_data_uri(img), hoverinfo="skip", name="image"), heat])
    h, w = img.shape[:2]
    shapes = [dict(type="path", path=rect_path(x0 - 0.5, y0 - 0.5, x1 - 0.5, y1 - 0.5),
                   line=dict(color=colour, width=3), name=name) for (x0, y0, x1, y1), colour, name in marks]
    base_layout(fig, title, width=width, height=int(width * h / w) + 60)
    fig.update_layout(shapes=shapes, margin=dict(l=10, r=10, t=60, b=10))
    fig.update_xaxes(range=[-0.5, w - 0.5], showticklabels=False, ticks="", showline=False, showgrid=False)
    fig.update_yaxes(range=[h - 0.5, -0.5], showticklabels=False, ticks="", showline=False, showgrid=False,
                     scaleanchor="x")
    return fig.build()


def text_attention(tokens: Sequence[str], values: np.ndarray, *, title: str, image_share: float | None = None,
                   query: int | None = None) -> go.Figure:
    """A query's attention to each text token (the image tokens' total is given as ``image_share`` and said in the
    title); ``query``: the index among ``tokens`` of the querying token, drawn in red."""
    v = np.asarray(values, dtype=np.float32)
    if len(v) != len(tokens):
        raise ValueError(f"{len(v)} values for {len(tokens)} tokens")
    labels = [f"{i} · {esc(shorten(t, 14))}" for i, t in enumerate(tokens)]
    colours = ["#d62728" if i == query else "#3182bd" for i in range(len(v))]
    fig = Fig([dict(type="bar", x=labels, y=f32(v), marker=dict(color=colours),
                    hovertemplate="%{x}<br>" + WEIGHT_LABEL + ": %{y:.4f}<extra></extra>")])
    if image_share is not None:
        title += (f"<br><sup>the image tokens take {image_share:.0%} of this row, "
                  f"the text tokens {1 - image_share:.0%}</sup>")
    base_layout(fig, title, height=400)  # the row's width: a long chat prompt's labels thin out, never cut off
    fig.update_xaxes(type="category", tickangle=-60, categoryorder="array", categoryarray=labels)
    fig.update_yaxes(title=dict(text=WEIGHT_LABEL), rangemode="tozero")
    return fig.build()


def lens_grid(words: np.ndarray, probs: np.ndarray, *, title: str) -> go.Figure:
    """The logit lens on one grid of image tokens: each cell's top word written in it, its probability as colour.
    words: (rows, cols) str; probs: (rows, cols)."""
    words, p = np.asarray(words, dtype=object), np.asarray(probs, dtype=np.float32)
    rows, cols = p.shape
    text = [[esc(shorten(str(words[r, c]), 8)) for c in range(cols)] for r in range(rows)]
    fig = Fig([dict(type="heatmap", z=f32(p), zmin=0.0, zmax=1.0, colorscale=LENS_SCALE, text=text,
                    texttemplate="%{text}", textfont=dict(size=11 if cols <= 10 else 8),
                    colorbar=colorbar("probability of the top word"),
                    hovertemplate="row %{y}, column %{x}<br>%{text}: %{z:.2f}<extra></extra>")])
    side = int(np.clip(56 * max(rows, cols), 300, 760))
    base_layout(fig, title, width=side + 190, height=side + 130)
    fig.update_xaxes(title=dict(text="column"), dtick=1, showgrid=False, range=[-0.5, cols - 0.5])
    fig.update_yaxes(title=dict(text="row"), dtick=1, showgrid=False, range=[rows - 0.5, -0.5])
    return fig.build()
