"""Swin Transformer geometry (Liu et al. 2021): window partitions, the cyclic shift, region ids, the
−100 attention mask, and one token's window attention painted back onto the token grid.

Conventions (the same as timm's ``swin_transformer.py`` and models/families/swin.py): a grid that is not a multiple of
the window is padded at the bottom and right to one (the padding cells hold zeros, not image: the figures grey them
out and label them "pad"), the shifted block rolls the padded grid by −shift on both axes
(``torch.roll(x, (-s, -s))``), windows are numbered row-major on the rolled grid, tokens row-major inside a window.
Arrays come in from the caller; nothing here imports the model code.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from viz.common import (
    ATTENTION_SCALE,
    OVERLAY_SCALE,
    WEIGHT_LABEL,
    Fig,
    as_uint8_image,
    base_layout,
    colorbar,
    f32,
    png_data_uri,
    rect_path,
    tile,
)

PAD_TEXT = "pad"  # the label of a padding cell (zeros the model adds to fill the last windows; not image)
PAD_FILL = "rgba(90, 90, 90, 0.55)"

# Pastel qualitative palette for window / region ids.
PALETTE = ["#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
           "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f"]


def _discrete_scale(n: int) -> list:
    """A stepped colour scale giving integer values 0..n-1 one palette colour each."""
    n = max(n, 1)
    out = []
    for i in range(n):
        c = PALETTE[i % len(PALETTE)]
        out += [[i / n, c], [(i + 1) / n, c]]
    return out


def padded(grid: tuple[int, int], window: int) -> tuple[int, int]:
    """The grid padded at the bottom and right to multiples of the window, as the model pads it."""
    return -(-grid[0] // window) * window, -(-grid[1] // window) * window


def shifted_window_ids(grid: tuple[int, int], window: int, shift: int) -> np.ndarray:
    """(Hp, Wp) id of the window each cell of the PADDED grid (``padded``; the token grid itself when it is a multiple
    of the window) falls into, row-major on the rolled grid; cells at row ≥ H or column ≥ W are padding."""
    Hp, Wp = padded(grid, window)
    r, c = np.mgrid[0:Hp, 0:Wp]
    rr, cc = (r - shift) % Hp, (c - shift) % Wp  # the roll is over the padded grid, as the model rolls it
    return (rr // window) * (Wp // window) + cc // window


def _padding(grid: tuple[int, int], window: int) -> np.ndarray:
    """(Hp, Wp) bool: True where a cell of the padded grid is padding, not a token of the image."""
    Hp, Wp = padded(grid, window)
    r, c = np.mgrid[0:Hp, 0:Wp]
    return (r >= grid[0]) | (c >= grid[1])


def _grid_panel(fig, z, n_ids, text, row, col, hover, padding: np.ndarray | None = None):
    """One grid of ids as coloured cells; ``padding`` (bool, z's shape) cells are labelled "pad" and greyed out."""
    text = np.asarray(text, dtype=object)
    if padding is not None and padding.any():
        text = np.where(padding, PAD_TEXT, text)
    trace = dict(type="heatmap", z=z, zmin=-0.5, zmax=n_ids - 0.5, colorscale=_discrete_scale(n_ids), showscale=False,
                 text=text, textfont=dict(size=11), xgap=1, ygap=1, hovertemplate=hover)
    if z.size <= 400:
        trace["texttemplate"] = "%{text}"
    fig.add_trace(trace, row=row, col=col)
    if padding is not None and padding.any():
        cells = "".join(rect_path(c - 0.5, r - 0.5, c + 0.5, r + 0.5) for r, c in zip(*np.nonzero(padding)))
        fig.add_shape(type="path", path=cells, fillcolor=PAD_FILL, line=dict(width=0), row=row, col=col)


def _pad_note(padding: np.ndarray | None) -> str:
    n = 0 if padding is None else int(padding.sum())
    return f"; grey “pad” cells ({n}) are padding up to whole windows, zeros, not image" if n else ""


def _lines(fig, H, W, window, offset, row, col, color="#222", width=3):
    """Window boundaries at offset + k·window on both axes (cell edges at i − 0.5), plus the border,
    as one path shape."""
    ys = sorted({-0.5, H - 0.5} | {p - 0.5 for p in range(offset % window, H + 1, window)})
    xs = sorted({-0.5, W - 0.5} | {p - 0.5 for p in range(offset % window, W + 1, window)})
    path = "".join(f"M-0.5,{y:g}H{W - 0.5:g}" for y in ys) + "".join(f"M{x:g},-0.5V{H - 0.5:g}" for x in xs)
    fig.add_shape(type="path", path=path, line=dict(color=color, width=width), row=row, col=col)


def _square_axes(fig, H, W, n):
    for i in range(1, n + 1):
        sfx = "" if i == 1 else str(i)
        fig.update_xaxes(range=[-0.5, W - 0.5], showticklabels=W <= 16, ticks="", dtick=1, showline=False,
                         constrain="domain", title=dict(text="column"), row=1, col=i)
        fig.update_yaxes(range=[H - 0.5, -0.5], showticklabels=H <= 16, ticks="", dtick=1, showline=False,
                         scaleanchor=f"x{sfx}", constrain="domain", row=1, col=i,
                         **(dict(title=dict(text="row")) if i == 1 else {}))


def window_partitions(grid: tuple[int, int], window: int, shift: int | None = None, *,
                      title: str = "Regular and shifted windows") -> go.Figure:
    """The token grid twice: the regular partition (block 2k) and the shifted one (block 2k+1, shift
    ``window // 2`` by default), cells coloured by the window they belong to. In the shifted partition
    the windows that wrap around the border (cyclic shift) share a colour across the edges. A grid that is not a
    multiple of the window is drawn padded as the model pads it, its padding cells grey and labelled "pad"."""
    H, W = grid
    Hp, Wp = padded(grid, window)
    shift = window // 2 if shift is None else shift
    reg = shifted_window_ids(grid, window, 0)
    sh = shifted_window_ids(grid, window, shift)
    n = (Hp // window) * (Wp // window)
    pad = _padding(grid, window)
    fig = Fig(rows=1, cols=2, horizontal_spacing=0.08, subplot_titles=[
        f"regular windows ({window}×{window})", f"shifted windows (shift {shift})"])
    text = (np.mgrid[0:Hp, 0:Wp][0] * W + np.mgrid[0:Hp, 0:Wp][1]).astype(str)
    _grid_panel(fig, reg, n, text, 1, 1, "token %{text}<br>window %{z}<extra></extra>", pad)
    _grid_panel(fig, sh, n, text, 1, 2, "token %{text}<br>window %{z}<extra></extra>", pad)
    _lines(fig, Hp, Wp, window, 0, 1, 1)
    _lines(fig, Hp, Wp, window, shift, 1, 2)
    _square_axes(fig, Hp, Wp, 2)
    size = f"{H}×{W} tokens" + (f" padded to {Hp}×{Wp}" if (Hp, Wp) != (H, W) else "")
    base_layout(fig, f"{title}<br><sup>{size}; colour = window; numbers = token index{_pad_note(pad)}</sup>",
                height=520, width=1000)
    fig.update_layout(margin=dict(t=130))
    return fig.build()


def cyclic_shift(ids_before: np.ndarray, ids_after: np.ndarray, regions_after: np.ndarray, window: int, *,
                 padding: np.ndarray | None = None, title: str = "Cyclic shift") -> go.Figure:
    """Token ids before and after the cyclic shift, each token coloured by the mask region it lands in
    after the shift; window boundaries drawn on the shifted grid. All arrays (H, W) of the padded grid;
    ``padding`` (bool, the ``ids_before`` layout): which cells are padding, greyed and labelled "pad" before and after
    the roll."""
    before, after, reg = (np.asarray(a) for a in (ids_before, ids_after, regions_after))
    H, W = after.shape
    region_of_id = np.empty(before.size, dtype=int)
    region_of_id[after.ravel()] = reg.ravel()  # where each id ended up
    reg_before = region_of_id[before.ravel()].reshape(H, W)
    pad_after = None
    if padding is not None:
        padding = np.asarray(padding, dtype=bool)
        pad_of_id = np.zeros(before.size, dtype=bool)
        pad_of_id[before.ravel()] = padding.ravel()
        pad_after = pad_of_id[after.ravel()].reshape(H, W)
    n = int(reg.max()) + 1
    fig = Fig(rows=1, cols=2, horizontal_spacing=0.08,
              subplot_titles=["before: original token grid", "after: rolled by −shift"])
    _grid_panel(fig, reg_before, n, before.astype(str), 1, 1, "token %{text}<br>region %{z}<extra></extra>", padding)
    _grid_panel(fig, reg, n, after.astype(str), 1, 2, "token %{text}<br>region %{z}<extra></extra>", pad_after)
    _lines(fig, H, W, window, 0, 1, 2)
    _square_axes(fig, H, W, 2)
    base_layout(fig, f"{title}<br><sup>colour = region after the shift; tokens of different regions share a window "
                f"but must not attend to each other{_pad_note(padding)}</sup>", height=520, width=1000)
    fig.update_layout(margin=dict(t=130))
    return fig.build()


def region_map(regions: np.ndarray, window: int, *, padding: np.ndarray | None = None,
               title: str = "Region ids of the shifted grid") -> go.Figure:
    """(H, W) region id per token of the rolled grid (the ``img_mask`` slices of the Swin paper's
    efficient batch computation), with the window boundaries; ``padding`` (bool, the rolled grid's layout): cells that
    are padding, greyed and labelled "pad"."""
    reg = np.asarray(regions)
    H, W = reg.shape
    n = int(reg.max()) + 1
    pad = None if padding is None else np.asarray(padding, dtype=bool)
    fig = Fig()
    _grid_panel(fig, reg, n, reg.astype(str), 1, 1, "row %{y} · col %{x}<br>region %{z}<extra></extra>", pad)
    _lines(fig, H, W, window, 0, 1, 1)
    _square_axes(fig, H, W, 1)
    note = _pad_note(pad)
    base_layout(fig, f"{title}<br><sup>{note[2:]}</sup>" if note else title, height=560, width=600)
    return fig.build()


def _mask_heatmap(z, hover, show_scale=True):
    return dict(type="heatmap", z=f32(z), zmin=-100, zmax=0,
                colorscale=[[0, "#b2182b"], [0.5, "#b2182b"], [0.5, "#f7f7f7"], [1, "#f7f7f7"]],
                colorbar=colorbar("mask value", tickvals=[-75, -25], ticktext=["−100 (blocked)", "0 (allowed)"]),
                showscale=show_scale, hoverongaps=False, hovertemplate=hover)


def window_mask(mask: np.ndarray, window: int, window_index: int = 0, *, padding: np.ndarray | None = None,
                title: str | None = None) -> go.Figure:
    """The additive mask (N × N, values 0 or −100) of one window; tokens labelled by their (row, col)
    inside the window, padding tokens (``padding``: (N,) bool) with " pad" after it."""
    m = np.asarray(mask, dtype=np.float32)
    N = m.shape[0]
    pad = np.zeros(N, dtype=bool) if padding is None else np.asarray(padding, dtype=bool).ravel()
    lab = [f"{i // window},{i % window}{' ' + PAD_TEXT if pad[i] else ''}" for i in range(N)]
    fig = Fig(dict(_mask_heatmap(m, "query %{y} → key %{x}: %{z}<extra></extra>"), x=lab, y=lab))
    note = (f"<br><sup>{int(pad.sum())} of its {N} tokens are padding (zeros, not image): the mask blocks by "
            "region only, so they are attended to like any token</sup>") if pad.any() else ""
    base_layout(fig, (title or f"Attention mask of window {window_index}") + note, height=600, width=680)
    step = max(1, N // 16)
    fs = 12 if N <= 25 else 10
    fig.update_xaxes(type="category", tickmode="array", tickvals=lab[::step], ticktext=lab[::step], tickangle=-90,
                     title=dict(text="key (row,col in window)"), tickfont=dict(size=fs))
    fig.update_yaxes(type="category", tickmode="array", tickvals=lab[::step], ticktext=lab[::step],
                     autorange="reversed", scaleanchor="x", title=dict(text="query (row,col in window)"),
                     tickfont=dict(size=fs))
    return fig.build()


def all_window_masks(masks: np.ndarray, windows_per_row: int, *, title: str = "Attention masks of all windows"
                     ) -> go.Figure:
    """Every window's mask (nW, N, N), laid out like the windows on the grid (``windows_per_row``)."""
    m = np.asarray(masks, dtype=np.float32)
    nW, N, _ = m.shape
    gap = max(1, N // 8)
    z = tile(m, ncols=windows_per_row, gap=gap)
    fig = Fig(_mask_heatmap(z, "%{z}<extra></extra>"))
    nrows = int(np.ceil(nW / windows_per_row))
    ann = [dict(x=(i % windows_per_row) * (N + gap) + (N - 1) / 2, y=(i // windows_per_row) * (N + gap) - 0.6,
                text=f"window {i}", showarrow=False, yanchor="bottom", font=dict(size=11)) for i in range(nW)]
    size = int(np.clip(140 * windows_per_row, 400, 1000))
    base_layout(fig, f"{title}<br><sup>only windows touching the bottom/right edge mix regions</sup>",
                height=int(size * nrows / windows_per_row) + 200, width=size + 220)
    fig.update_layout(annotations=ann, margin=dict(t=110))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False, autorange="reversed", scaleanchor="x")
    return fig.build()


def window_attention_map(
    weights: np.ndarray, grid: tuple[int, int], window: int, shift: int, query: tuple[int, int], head: int = 0,
) -> tuple[np.ndarray, dict]:
    """One query token's attention inside its window as an (H, W) map over the ORIGINAL token grid
    (NaN outside the window), undoing the cyclic shift and the window partition.

    weights: (nW, heads, N, N) of one block, computed on the grid padded at the bottom/right to a
    multiple of ``window`` (as models/families/swin.py and torchvision do); attention to padding tokens is left
    out of the map and reported in ``info["padding_share"]``. Returns (map, info) with info keys
    ``window`` (window index), ``token`` (index inside the window), ``cells`` (list of (row, col) of the
    window's real tokens on the original grid) and ``padding_share``."""
    w = np.asarray(weights, dtype=np.float32)
    H, W = grid
    Hp, Wp = -(-H // window) * window, -(-W // window) * window
    nW, heads, N, _ = w.shape
    if nW != (Hp // window) * (Wp // window) or N != window * window:
        raise ValueError(f"weights {w.shape} do not match a {H}×{W} grid with {window}×{window} windows")
    qr, qc = int(query[0]), int(query[1])
    if not (0 <= qr < H and 0 <= qc < W):
        raise ValueError(f"query {query} is outside the {H}×{W} grid")
    rr, rc = (qr - shift) % Hp, (qc - shift) % Wp  # position on the rolled (padded) grid
    win = (rr // window) * (Wp // window) + rc // window
    n = (rr % window) * window + rc % window
    row = w[win, head, n].reshape(window, window)
    a, b = np.mgrid[0:window, 0:window]
    orig_r = ((rr // window) * window + a + shift) % Hp  # back to the original grid
    orig_c = ((rc // window) * window + b + shift) % Wp
    real = (orig_r < H) & (orig_c < W)
    amap = np.full((H, W), np.nan, dtype=np.float32)
    amap[orig_r[real], orig_c[real]] = row[real]
    info = dict(window=int(win), token=int(n), cells=list(zip(orig_r[real].tolist(), orig_c[real].tolist())),
                padding_share=float(row[~real].sum()))
    return amap, info


def window_attention_grid(
    weights: np.ndarray,
    grid: tuple[int, int],
    window: int,
    shift: int,
    query: tuple[int, int],
    head: int = 0,
    *,
    image: np.ndarray | None = None,
    patch: float | None = None,
    autoscale: bool = True,
    title: str | None = None,
) -> go.Figure:
    """One query token's attention inside its window, painted back onto the (H, W) token grid (and over
    the image when given). weights: (nW, heads, N, N) of one block; query: (row, col) on the ORIGINAL
    grid. Tokens outside the query's window are blank; the query is outlined in red and its window's
    cells (which may wrap around the border in a shifted block) are outlined in black."""
    H, W = grid
    qr, qc = int(query[0]), int(query[1])
    amap, info = window_attention_map(weights, grid, window, shift, query, head)
    win, n = info["window"], info["token"]
    row = np.nan_to_num(amap)
    zmax = float(row.max()) if autoscale and row.max() > 0 else 1.0
    scale = 1.0 if patch is None else float(patch)
    traces = []
    if image is not None:
        traces.append(dict(type="image", source=png_data_uri(as_uint8_image(image)), hoverinfo="skip"))
    traces.append(dict(
        type="heatmap", z=amap, x0=(scale - 1) / 2, dx=scale, y0=(scale - 1) / 2, dy=scale, zmin=0, zmax=zmax,
        colorscale=OVERLAY_SCALE if image is not None else ATTENTION_SCALE, hoverongaps=False,
        colorbar=colorbar(WEIGHT_LABEL), hovertemplate="weight %{z:.4f}<extra></extra>",
    ))
    fig = Fig(traces)
    grid_lines = "".join(f"M-0.5,{r * scale - 0.5:g}H{W * scale - 0.5:g}" for r in range(H + 1)) + "".join(
        f"M{c * scale - 0.5:g},-0.5V{H * scale - 0.5:g}" for c in range(W + 1))
    fig.add_shape(type="path", path=grid_lines, line=dict(color="rgba(0, 0, 0, 0.12)", width=1))
    cells = "".join(rect_path(c * scale - 0.5, r * scale - 0.5, (c + 1) * scale - 0.5, (r + 1) * scale - 0.5)
                    for r, c in info["cells"])
    fig.add_shape(type="path", path=cells, line=dict(color="rgba(0, 0, 0, 0.6)", width=1.5))
    fig.add_shape(type="path", path=rect_path(qc * scale - 0.5, qr * scale - 0.5, (qc + 1) * scale - 0.5,
                                              (qr + 1) * scale - 0.5), line=dict(color="#d62728", width=3))
    kind = f"shifted windows (shift {shift})" if shift else "regular windows"
    if info["padding_share"] > 0.005:
        kind += f"; {info['padding_share']:.0%} of its attention goes to padding tokens (not shown)"
    base_layout(fig, title or f"Window attention of token ({qr}, {qc}) · head {head}<br><sup>{kind}; window {win}, "
                f"token {n} inside it</sup>", height=580, width=640)
    extent_h, extent_w = H * scale, W * scale
    fig.update_xaxes(range=[-0.5, extent_w - 0.5], showticklabels=False, ticks="", showline=False)
    fig.update_yaxes(range=[extent_h - 0.5, -0.5], showticklabels=False, ticks="", showline=False, scaleanchor="x")
    fig.update_layout(margin=dict(t=110))
    return fig.build()
