"""Attention figures over token sequences: one head as a heatmap, every layer × head at once (model
view), and the bertviz-style head view (two token columns joined by lines)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import plotly.graph_objects as go

from viz.common import (
    ATTENTION_SCALE,
    HEAD_COLORS,
    WEIGHT_LABEL,
    Fig,
    Pooled,
    axis_font_size,
    base_layout,
    category_ticks,
    colorbar,
    esc,
    f32,
    fit_subtitle,
    pool_blocks,
    rect_path,
    shorten,
    tile,
    unique_labels,
    weight_range,
)

Head = int | str  # a head index, or "mean" / "max" to fuse all heads


def select_head(weights: np.ndarray, layer: int | None = None, head: Head = 0) -> np.ndarray:
    """(Q, K) map out of (Q, K), (H, Q, K) or (L, H, Q, K); ``head`` may be "mean" or "max" (fusion)."""
    w = np.asarray(weights)
    if w.ndim == 4:
        if layer is None:
            raise ValueError("weights are (layers, heads, queries, keys): pass layer=")
        w = w[layer]
    if w.ndim == 3:
        if head == "mean":
            w = w.mean(axis=0)
        elif head == "max":
            w = w.max(axis=0)
        elif isinstance(head, (int, np.integer)):
            w = w[int(head)]
        else:
            raise ValueError(f"head must be an index, 'mean' or 'max', got {head!r}")
    if w.ndim != 2:
        raise ValueError(f"expected attention of 2 to 4 dimensions, got shape {np.shape(weights)}")
    return w


def describe(kind: str, layer: int | None, head: Head | None) -> str:
    """Title text such as "Encoder self-attention · layer 2 · head 5"."""
    parts = [kind]
    if layer is not None:
        parts.append(f"layer {layer}")
    if head is not None:
        parts.append(f"{head} of heads" if head in ("mean", "max") else f"head {head}")
    return " · ".join(parts)


def _check_labels(w: np.ndarray, queries: Sequence[str], keys: Sequence[str]) -> None:
    if w.shape[-2] != len(queries) or w.shape[-1] != len(keys):
        raise ValueError(f"attention {w.shape} does not match {len(queries)} query and {len(keys)} key labels")


def attention_heatmap(
    weights: np.ndarray,
    queries: Sequence[str],
    keys: Sequence[str] | None = None,
    *,
    layer: int | None = None,
    head: Head = 0,
    kind: str = "Self-attention",
    title: str | None = None,
    autoscale: bool = False,
    max_label: int = 12,
    pool: str = "max",
) -> go.Figure:
    """Query × key heatmap of one head (or the mean/max over heads), at full resolution up to POOL_ABOVE tokens.

    weights: (Q, K), (H, Q, K) or (L, H, Q, K) (then ``layer`` selects). Query 0 is at the top; tick
    labels are shortened, hover shows "i · query → j · key: weight" with the full tokens. A longer input is
    drawn from tiles: the map pooled to at most TILE_CELLS × TILE_CELLS cells by ``pool`` ("max" or "mean", the
    title says which); ``attention_zoom`` draws any block of it at full resolution.
    """
    return heatmap_fig(weights, queries, keys, layer=layer, head=head, kind=kind, title=title,
                       autoscale=autoscale, max_label=max_label, pool=pool).build()


READABLE = 128  # tokens up to which a heatmap labels every one (the scratch models' whole input)
POOL_ABOVE = 512  # tokens above which a heatmap is drawn from pooled tiles (models.limits.LONG_TOKENS)
TILE_CELLS = 512  # cells a side of a pooled heatmap (models.limits.MAX_TILE_CELLS): ≤ 1.1 MB of float32
MAP_PX = 880  # px: the most a long map's plot takes a side (with its labels and colour bar it fits a 1,192 px column)
LABEL_PX = 12  # px: the least distance between two tick labels of a map's axis (10 px type)


def heatmap_fig(weights: np.ndarray, queries: Sequence[str], keys: Sequence[str] | None = None, *,
                layer: int | None = None, head: Head = 0, kind: str = "Self-attention", title: str | None = None,
                autoscale: bool = False, max_label: int = 12, pool: str = "max", start: tuple[int, int] = (0, 0),
                ) -> Fig:
    """``attention_heatmap`` before it is built, for figures that draw on top of it. ``start``: the positions of
    the first query and key (a zoomed block keeps the whole input's positions in its labels). ``weights`` may be
    ``Pooled`` tiles of the (Q, K) map (made where the weights are kept): drawn as the map pooled here."""
    keys = queries if keys is None else keys
    if isinstance(weights, Pooled):  # tiles pooled where the weights are (a map kept on a GPU)
        return _pooled_heatmap(weights, queries, keys, title or describe(kind, layer, head), autoscale, pool, start)
    w = select_head(weights, layer, head)
    _check_labels(w, queries, keys)
    if max(len(queries), len(keys)) > POOL_ABOVE:
        pooled = Pooled(*pool_blocks(w, TILE_CELLS, pool))
        return _pooled_heatmap(pooled, queries, keys, title or describe(kind, layer, head), autoscale, pool, start)
    zmin, zmax = weight_range(w, autoscale)
    qcat, kcat = unique_labels(queries, start[0]), unique_labels(keys, start[1])
    fig = Fig(dict(
        type="heatmap", z=f32(w), x=kcat, y=qcat, zmin=zmin, zmax=zmax, colorscale=ATTENTION_SCALE,
        colorbar=colorbar(WEIGHT_LABEL), xgap=0, ygap=0, hovertemplate="%{y} → %{x}: %{z:.3f}<extra></extra>",
    ))
    n = max(len(queries), len(keys))
    # Up to 64 tokens every token keeps a label on cells of 10–40 px (a plot of at most 640 px). A longer input's map
    # takes the column's width (no width of its own: one wider than its column scrolled sideways) on a plot of at
    # most MAP_PX a side, and labels every k-th token, `LABEL_PX` px apart at least.
    cell = float(np.clip(640 / n, 10, 40)) if n <= 64 else min(10.0, MAP_PX / n)
    height = int(max(cell * len(queries) + 220, 380))
    base_layout(fig, title or describe(kind, layer, head), height=height)
    fs = axis_font_size(n)
    if start != (0, 0):  # a zoomed block: each tick says its position in the whole input
        queries = [f"{i} {t}" for i, t in enumerate(queries, start[0])]
        keys = [f"{i} {t}" for i, t in enumerate(keys, start[1])]
        max_label += 5
    most = READABLE if n <= 64 else max(8, int(cell * n / LABEL_PX))  # the tick labels an axis holds
    fig.update_xaxes(**category_ticks(kcat, keys, max_label, most), tickangle=-60, tickfont=dict(size=fs),
                     title=dict(text="key"), side="bottom")
    fig.update_yaxes(**category_ticks(qcat, queries, max_label, most), autorange="reversed",
                     tickfont=dict(size=fs), title=dict(text="query"), scaleanchor="x", constrain="domain")
    return fig


def heatmaps_side_by_side(maps: Sequence[np.ndarray], tokens: Sequence[Sequence[str]], titles: Sequence[str], *,
                          title: str, zmax: float | None = None) -> go.Figure:
    """Two or more (Q, K) maps beside each other, each drawn by ``heatmap_fig`` (same cells, labels and hover), on
    one shared colour range (0 to ``zmax``, by default the largest weight of any of them), so that equal colours
    are equal weights: a Mamba's implicit attention beside a Transformer's on the same sentence."""
    if not maps or len(maps) != len(tokens) or len(maps) != len(titles):
        raise ValueError("need as many token lists and titles as maps")
    top = zmax or max(float(np.nanmax(m)) if m.size else 0.0 for m in maps) or 1.0
    parts = [heatmap_fig(np.asarray(m), list(t), list(t), autoscale=True) for m, t in zip(maps, tokens, strict=True)]
    n = len(parts)
    fig = Fig(rows=1, cols=n, subplot_titles=[esc(t) for t in titles], horizontal_spacing=0.12)
    for c, part in enumerate(parts, 1):
        trace = {**part.data[0], "zmin": 0.0, "zmax": top, "showscale": c == n}
        fig.add_trace(trace, row=1, col=c)
        x, y = fig._axes(1, c)
        for mine, theirs in ((x, "xaxis"), (y, "yaxis")):
            axis = {k: v for k, v in part.layout.get(theirs, {}).items() if k not in ("scaleanchor", "domain")}
            fig.layout[mine].update(axis)
    size = max(len(t) for t in tokens)
    cell = int(np.clip(420 / max(size, 1), 8, 32))
    # the width follows the page (a fixed one wider than the column clipped the right map and its colour bar)
    base_layout(fig, title, height=cell * size + 300)
    return fig.build()


def _block_labels(tokens: Sequence[str], edges: np.ndarray, prefix: str, offset: int = 0) -> list[str]:
    out = []
    for a, b in zip(edges[:-1], edges[1:]):
        a, b = int(a), int(b)
        if b - a == 1:
            out.append(f"{prefix}{a + offset} {esc(shorten(tokens[a], 16))}")
        else:
            out.append(f"{prefix}{a + offset}–{b - 1 + offset} {esc(shorten(tokens[a], 10))} … "
                       f"{esc(shorten(tokens[b - 1], 10))}")
    return out


def _pooled_heatmap(tiles: Pooled, queries: Sequence[str], keys: Sequence[str], head_title: str, autoscale: bool,
                    pool: str, start: tuple[int, int]) -> Fig:
    """A long input's (Q, K) map as at most TILE_CELLS × TILE_CELLS pooled cells: the browser never holds the
    whole map (2,048 tokens: 16.8 MB of float32; the tiles: ≤ 1.1 MB), the title says how it was pooled and
    where the full resolution is (zoom)."""
    Q, K = len(queries), len(keys)
    pooled, qe, ke = tiles  # (q, k) float32
    q, k = pooled.shape
    if (qe[-1], ke[-1]) != (Q, K):
        raise ValueError(f"tiles of a {qe[-1]}×{ke[-1]} map do not match {Q} query and {K} key labels")
    zmin, zmax = weight_range(pooled, autoscale)
    qcat, kcat = _block_labels(queries, qe, "", start[0]), _block_labels(keys, ke, "", start[1])
    fig = Fig(dict(
        type="heatmap", z=pooled, x=kcat, y=qcat, zmin=zmin, zmax=zmax, colorscale=ATTENTION_SCALE,
        colorbar=colorbar(f"{pool} attention weight"), xgap=0, ygap=0,
        hovertemplate=f"queries %{{y}}<br>keys %{{x}}<br>{pool} weight: %{{z:.3f}}<extra></extra>",
        # the first query and key of each tile: app.py's click handler turns a clicked tile into that cell
        meta=dict(rows=(qe[:-1] + start[0]).tolist(), cols=(ke[:-1] + start[1]).tolist()),
    ))
    fq, fk = int(qe[1] - qe[0]), int(ke[1] - ke[0])
    sub = (f"{Q}×{K} tokens, {pool}-pooled to {q}×{k} cells of {fq}×{fk} tokens · zoom into any block for full "
           "resolution")
    # the column's width (a width of its own, 2 px a cell, was wider than a 1,216 px column and scrolled sideways),
    # on a plot of at most MAP_PX a side: ~1.7 px a cell for 512 cells
    cell = min(2.0, MAP_PX / max(q, k))
    base_layout(fig, f"{head_title} · {pool}-pooled<br><sup>{sub}</sup>", height=int(max(cell * q + 240, 380)))
    most_x, most_y = (max(8, min(32, int(cell * m / (2 * LABEL_PX)))) for m in (k, q))  # ≥ 24 px apart
    fig.update_xaxes(**_block_ticks(kcat, keys, ke, start[1], most_x), tickangle=-60, tickfont=dict(size=10),
                     title=dict(text="key"), side="bottom")
    fig.update_yaxes(**_block_ticks(qcat, queries, qe, start[0], most_y), autorange="reversed", tickfont=dict(size=10),
                     title=dict(text="query"), scaleanchor="x", constrain="domain")
    fig.update_layout(margin=dict(t=100))
    return fig


def _block_ticks(categories: list[str], tokens: Sequence[str], edges: np.ndarray, offset: int,
                 max_ticks: int = 32) -> dict:
    """Ticks of a pooled axis: every k-th block, labelled by the position and token it starts with."""
    n = len(categories)
    idx = list(range(0, n, max(1, int(np.ceil(n / max_ticks)))))
    return dict(type="category", tickmode="array", tickvals=[categories[i] for i in idx],
                ticktext=[f"{int(edges[i]) + offset} {esc(shorten(tokens[int(edges[i])], 10))}" for i in idx],
                categoryorder="array", categoryarray=list(categories))


def attention_block(weights: np.ndarray, rows: tuple[int, int], cols: tuple[int, int], *, layer: int | None = None,
                    head: Head = 0) -> np.ndarray:
    """The (rows[1] − rows[0], cols[1] − cols[0]) block of one head's (or a fusion's) map, exactly as in the whole
    map: queries rows[0] … rows[1] − 1, keys cols[0] … cols[1] − 1. Only the block is read, so a zoom into a long
    input costs the block, not the whole map. Ranges outside the map, reversed or empty are a ValueError."""
    w = np.asarray(weights)
    Q, K = w.shape[-2:]
    (r0, r1), (c0, c1) = (int(rows[0]), int(rows[1])), (int(cols[0]), int(cols[1]))
    if not (0 <= r0 < r1 <= Q and 0 <= c0 < c1 <= K):
        raise ValueError(f"the block queries {r0}…{r1 - 1} × keys {c0}…{c1 - 1} is not inside the map's {Q} queries "
                         f"and {K} keys (or is empty)")
    return select_head(w[..., r0:r1, c0:c1], layer, head)


def attention_zoom(weights: np.ndarray, queries: Sequence[str], keys: Sequence[str] | None = None, *,
                   rows: tuple[int, int], cols: tuple[int, int], layer: int | None = None, head: Head = 0,
                   kind: str = "Self-attention", pool: str = "max", autoscale: bool = False,
                   block: np.ndarray | Pooled | None = None) -> go.Figure:
    """One block of a (long) attention map at full resolution: queries ``rows[0] … rows[1] − 1`` against keys
    ``cols[0] … cols[1] − 1`` (half-open, as Python slices), labelled with their positions in the whole input. A
    block larger than POOL_ABOVE a side is itself pooled (the title says so); zoom further for single tokens.
    ``block``: that block read already (a map kept on a GPU: its (r, c) weights, or ``Pooled`` tiles of it),
    ``weights`` then unused."""
    keys = queries if keys is None else keys
    if block is None:
        block = attention_block(weights, rows, cols, layer=layer, head=head)
    r0, r1, c0, c1 = int(rows[0]), int(rows[1]), int(cols[0]), int(cols[1])
    title = describe(kind, layer, head) + f" · zoom: queries {r0}–{r1 - 1} × keys {c0}–{c1 - 1}"
    if max(r1 - r0, c1 - c0) <= POOL_ABOVE:
        title += " (full resolution)"
    return heatmap_fig(block, list(queries[r0:r1]), list(keys[c0:c1]), title=title, pool=pool, start=(r0, c0),
                       autoscale=autoscale).build()


def model_view(
    weights: np.ndarray,
    queries: Sequence[str],
    keys: Sequence[str] | None = None,
    *,
    kind: str = "Self-attention",
    max_cells: int = 64,
    autoscale: bool = False,
    title: str | None = None,
    max_total_cells: int = 1_000_000,
    tiles: Pooled | None = None,
    layer_names: Sequence[str] | None = None,
) -> go.Figure:
    """Every layer × head of one attention kind in one figure (rows = layers, columns = heads).

    weights: (L, H, Q, K). Each thumbnail is max-pooled to at most ``max_cells`` × ``max_cells`` when
    larger (the title says so), and smaller still when the model has so many heads that all thumbnails
    together would pass ``max_total_cells`` (1 byte each: the figure stays under the 2 MB budget at
    GPT-2 medium's 24 × 16 heads). All thumbnails are tiled into ONE heatmap with blank gaps between them:
    one trace and one pair of axes instead of L·H subplots, so the JSON is small and the browser draws it
    quickly. Weights travel as hundredths in a uint8 typed array (1 byte per cell; the colour needs no more
    precision, and the single-head heatmap shows exact values); the colour bar reads 0–1 as the heatmaps' do.
    ``tiles``: the (L, H, q, k) max-pooled thumbnails made already, at ``model_view_cells`` cells a side (a map
    kept on a GPU), ``weights`` then unused. ``layer_names``: a word per layer beside its row label (a hybrid
    model's kind of layer).
    """
    keys = queries if keys is None else keys
    if tiles is None:
        w = np.asarray(weights)  # float16 for long inputs: pooled slice by slice, never copied whole
        if w.ndim != 4:
            raise ValueError(f"model view needs (layers, heads, queries, keys), got {w.shape}")
        _check_labels(w, queries, keys)
        tiles = Pooled(*pool_blocks(w, model_view_cells(*w.shape[:2], max_cells, max_total_cells), "max"))
    pooled, qe, ke = tiles
    L, H, q, k = pooled.shape
    Q, K = len(queries), len(keys)
    if (qe[-1], ke[-1]) != (Q, K):
        raise ValueError(f"thumbnails of a {qe[-1]}×{ke[-1]} map do not match {Q} query and {K} key labels")
    is_pooled = (q, k) != (Q, K)
    pct = np.clip(np.rint(pooled * 100.0), 0, 100).astype(np.uint8)  # (L, H, q, k)
    gap = max(1, max(q, k) // 8)
    z = tile(pct.reshape(L * H, q, k), ncols=H, gap=gap, fill=0)

    qlab, klab = _block_labels(queries, qe, "q"), _block_labels(keys, ke, "k")
    xcat, xticks = [], []
    for h in range(H):
        xcat += [f"head {h} · {lab}" for lab in klab]
        xticks.append(xcat[-1 - k // 2])
        if h < H - 1:
            xcat += [f"(gap {h}|{h + 1} #{g})" for g in range(gap)]  # categories must be unique
    ycat, yticks = [], []
    for layer in range(L):
        ycat += [f"layer {layer} · {lab}" for lab in qlab]
        yticks.append(ycat[-1 - q // 2])
        if layer < L - 1:
            ycat += [f"(gap {layer}|{layer + 1} #{g})" for g in range(gap)]

    zmax = 100.0
    if autoscale:
        zmax = float(max(1, pct.max()))
    # the cells travel in hundredths (1 byte each); the colour bar reads 0–1 as every other attention map's does, and
    # the hover says hundredths (a Plotly template cannot divide)
    what = "max attention weight" if is_pooled else WEIGHT_LABEL
    ticks = [v for v in (0, 20, 40, 60, 80, 100) if v <= zmax]
    fig = Fig(dict(
        type="heatmap", z=z, x=xcat, y=ycat, zmin=0, zmax=zmax, colorscale=_thumb_scale(),
        colorbar=colorbar(what, tickmode="array", tickvals=ticks, ticktext=[f"{v / 100:g}" for v in ticks]),
        hovertemplate="%{y}<br>→ %{x}<br>" + ("max weight" if is_pooled else "weight") + ": %{z}/100<extra></extra>",
        # where each thumbnail is, for the page script: a click opens that layer's head as a heatmap (tabs/page.py)
        meta={"thumbnails": [q, k, gap]},
    ))
    sub = f"rows: {L} layers, columns: {H} heads · {Q}×{K} tokens"
    if is_pooled:
        fq, fk = int(qe[1] - qe[0]), int(ke[1] - ke[0])
        sub += f" · each thumbnail max-pooled {fq}×{fk} to {q}×{k} cells (the single-head view is full size)"
    head_title = title or f"{kind} · all layers and heads"
    size = int(np.clip(78 * max(L, H), 420, 1100))
    width = int(size * H / max(L, H)) + 200
    lines = fit_subtitle(sub, width)  # wrapped to the figure's width (one line of it was cut at the figure's edge)
    extra = 16 * (len(lines) - 1)  # px of each further subtitle line, above the plot
    base_layout(fig, f"{head_title}<br><sup>{'<br>'.join(lines)}</sup>", height=int(size * L / max(L, H)) + 160 + extra,
                width=width)
    fig.update_xaxes(type="category", tickmode="array", tickvals=xticks, ticktext=[f"H{h}" for h in range(H)],
                     categoryorder="array", categoryarray=xcat, side="top", ticks="", showline=False)
    rows_named = [f"L{i}" + (f" {layer_names[i]}" if layer_names else "") for i in range(L)]
    fig.update_yaxes(type="category", tickmode="array", tickvals=yticks, ticktext=rows_named,
                     categoryorder="array", categoryarray=ycat, autorange="reversed", ticks="",
                     showline=False, scaleanchor="x", constrain="domain")
    # Paint the gaps white (uint8 cannot hold NaN): one path shape in category-index coordinates.
    W, Ht = len(xcat), len(ycat)
    # Two shapes (columns, rows): crossing bands inside one path would cancel out under the even-odd rule.
    cols = [rect_path(h * (k + gap) + k - 0.5, -0.5, (h + 1) * (k + gap) - 0.5, Ht - 0.5) for h in range(H - 1)]
    rows = [rect_path(-0.5, i * (q + gap) + q - 0.5, W - 0.5, (i + 1) * (q + gap) - 0.5) for i in range(L - 1)]
    for bands in (cols, rows):
        if bands:
            fig.add_shape(type="path", path="".join(bands), fillcolor="white", line=dict(width=0), layer="above")
    fig.update_layout(margin=dict(t=120 + extra))
    return fig.build()


def model_view_cells(layers: int, heads: int, max_cells: int = 64, max_total_cells: int = 1_000_000) -> int:
    """Cells a side of each model-view thumbnail: ``max_cells``, fewer when layers × heads thumbnails of that size
    would pass ``max_total_cells``."""
    return min(max_cells, max(8, int((max_total_cells / (layers * heads)) ** 0.5)))


def _thumb_scale() -> list:
    # Thumbnails start at a faint blue-grey so each square stands out from the white gaps.
    return [[0.0, "#eef2f7"]] + ATTENTION_SCALE[1:]


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i: i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r}, {g}, {b}, {alpha:.2f})"


HEAD_VIEW_SEGMENTS = 20000  # the most lines a head view draws (the strongest)


class HeadLines(NamedTuple):
    """The head view's lines: for each, the index into the drawn heads (j), query, key and weight; sorted by
    (j, query, key). ``threshold``: the least weight drawn; ``raised``: how many lines passed the asked threshold
    when there were more than could be drawn (else 0)."""

    j: np.ndarray
    qi: np.ndarray
    ki: np.ndarray
    vals: np.ndarray
    threshold: float
    raised: int


def strongest_lines(sel: np.ndarray, threshold: float, max_segments: int) -> HeadLines:
    """Every (head, query, key) of ``sel`` (h, Q, K) whose weight ≥ ``threshold``; when more than ``max_segments``
    pass, exactly the strongest ``max_segments`` and the least weight among them."""
    keep = sel >= threshold
    thr, raised = float(threshold), 0
    if int(keep.sum()) > max_segments:
        cand = np.flatnonzero(keep)  # partition only the lines that passed (a whole long map is slow to sort)
        top = cand[np.argpartition(sel.ravel()[cand], -max_segments)[-max_segments:]]
        raised = int(keep.sum())
        keep = np.zeros(sel.size, bool)
        keep[top] = True
        keep = keep.reshape(sel.shape)
        thr = float(sel[keep].min())
    j, qi, ki = np.nonzero(keep)
    return HeadLines(j, qi, ki, sel[j, qi, ki], thr, raised)


def head_view(
    weights: np.ndarray,
    queries: Sequence[str],
    keys: Sequence[str] | None = None,
    *,
    layer: int | None = None,
    heads: Sequence[int] | None = None,
    threshold: float = 0.05,
    max_segments: int = HEAD_VIEW_SEGMENTS,
    kind: str = "Self-attention",
    buckets: int = 8,
    title: str | None = None,
    lines: HeadLines | None = None,
) -> go.Figure:
    """bertviz-style head view for one layer: queries on the left, keys on the right, one line per
    (query, key) pair whose weight ≥ ``threshold``; line opacity = weight, one colour per head.

    weights: (H, Q, K), or (L, H, Q, K) with ``layer``. Lines are grouped per head and per opacity
    bucket into a few traces with NaN breaks (not one trace per line). If more than ``max_segments``
    lines pass the threshold, the threshold is raised to keep the strongest ones (the title says so).
    Click a head in the legend to hide or show it. ``lines``: the lines of ``heads`` selected already
    (``strongest_lines``, or the same on a GPU where the weights are kept), ``weights`` then unused.
    """
    keys = queries if keys is None else keys
    if lines is None:
        w = np.asarray(weights)
        if w.ndim == 4:
            if layer is None:
                raise ValueError("weights are (layers, heads, queries, keys): pass layer=")
            w = w[layer]
        if w.ndim != 3:
            raise ValueError(f"head view needs (heads, queries, keys), got {w.shape}")
        _check_labels(w, queries, keys)
        heads = list(range(w.shape[0])) if heads is None else [int(h) for h in heads]
        # one layer's heads only, in float32: a long input's float16 tensor is never copied whole
        lines = strongest_lines(w[heads].astype(np.float32, copy=False), threshold, max_segments)
    elif heads is None:
        raise ValueError("lines selected already need the heads they were selected from (heads=)")
    Q, K = len(queries), len(keys)
    thr, raised = lines.threshold, lines.raised
    edges = np.linspace(thr, 1.0, buckets + 1)
    traces = []
    for j, h in enumerate(heads):
        color = HEAD_COLORS[h % len(HEAD_COLORS)]
        mine = lines.j == j
        qi, ki, vals = lines.qi[mine], lines.ki[mine], lines.vals[mine]
        bucket = np.clip(np.searchsorted(edges, vals, side="right") - 1, 0, buckets - 1)
        # A legend-only entry in the full head colour (the line traces themselves are faint).
        traces.append(dict(type="scatter", x=[None], y=[None], mode="lines", line=dict(color=color, width=3),
                                 legendgroup=f"h{h}", name=f"head {h}", hoverinfo="skip"))
        for b in range(buckets):
            m = bucket == b
            if not m.any():
                continue
            nseg = int(m.sum())
            x = np.tile(np.array([0.0, 1.0, np.nan], dtype=np.float32), nseg)
            y = np.empty(nseg * 3, dtype=np.float32)
            y[0::3], y[1::3], y[2::3] = qi[m], ki[m], np.nan
            alpha = float(np.clip((edges[b] + edges[b + 1]) / 2, 0.12, 1.0))
            traces.append(dict(
                type="scatter", x=x, y=y, mode="lines", line=dict(color=_rgba(color, alpha), width=2), hoverinfo="skip",
                legendgroup=f"h{h}", name=f"head {h}", showlegend=False,
            ))
    n = max(Q, K)
    px = int(np.clip(1400 / n, 6, 20))
    fs = int(np.clip(px - 4, 7, 14))
    step_q = max(1, int(np.ceil(10 / px)))  # label every k-th token when rows are thinner than ~10 px
    qy = np.arange(Q, dtype=np.float32)
    ky = np.arange(K, dtype=np.float32)
    qtext = [esc(shorten(t, 14)) if i % step_q == 0 else "" for i, t in enumerate(queries)]
    ktext = [esc(shorten(t, 14)) if i % step_q == 0 else "" for i, t in enumerate(keys)]
    traces.append(dict(type="scatter", x=np.zeros(Q, np.float32), y=qy, mode="markers+text", text=qtext,
                             textposition="middle left", customdata=unique_labels(queries),
                             marker=dict(size=5, color="#444"), textfont=dict(size=fs),
                             hovertemplate="query %{customdata}<extra></extra>", showlegend=False))
    traces.append(dict(type="scatter", x=np.ones(K, np.float32), y=ky, mode="markers+text", text=ktext,
                             textposition="middle right", customdata=unique_labels(keys),
                             marker=dict(size=5, color="#444"), textfont=dict(size=fs),
                             hovertemplate="key %{customdata}<extra></extra>", showlegend=False))
    fig = Fig(traces)
    sub = f"lines for weights ≥ {thr:.3g}; opacity = weight"
    if raised:
        sub = f"opacity = weight · only the strongest {max_segments} of {raised} lines ≥ {threshold:g} are drawn"
    head_title = title or describe(kind, layer, None) + " · head view"
    base_layout(fig, f"{head_title}<br><sup>{sub}</sup>", height=int(np.clip(px * n + 170, 420, 4200)),
                width=720)
    fig.add_annotation(x=0, y=-0.9, text="<b>query</b>", showarrow=False, yanchor="bottom", xanchor="right")
    fig.add_annotation(x=1, y=-0.9, text="<b>key</b>", showarrow=False, yanchor="bottom", xanchor="left")
    fig.update_xaxes(visible=False, range=[-0.9, 1.9])
    fig.update_yaxes(visible=False, autorange="reversed")
    fig.update_layout(legend=dict(title=dict(text="heads (click to toggle)"), itemsizing="constant"),
                      margin=dict(l=20, r=20, t=100, b=20), hovermode="closest")
    return fig.build()
