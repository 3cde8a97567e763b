"""Shared look and helpers for every figure: template, colour scales, label handling, pooling, tiling.

Everything here is numpy + plotly only (no torch, no models, no gradio), so figures build the same in
the app and in a notebook.
"""

from __future__ import annotations

import base64
import html
import os
import re
import struct
import zlib
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np
import plotly.graph_objects as go
from plotly.colors import get_colorscale

# ----------------------------------------------------------------------------------------------------
# Look

FONT = "Inter, 'Helvetica Neue', Arial, sans-serif"
BASE_FONT_SIZE = 14  # readable on a projector
WEIGHT_LABEL = "attention weight"

# White → deep blue: zero attention is the white page, strong attention is dark (readable in print
# and on a projector; a sequential scale for a non-negative quantity).
ATTENTION_SCALE = [
    [0.0, "#ffffff"], [0.1, "#e3eef9"], [0.25, "#b6d4ea"], [0.45, "#6baed6"],
    [0.65, "#3182bd"], [0.85, "#08519c"], [1.0, "#08306b"],
]
# For maps laid over an image: transparent at 0 (the image shows through), warm and opaque when high.
OVERLAY_SCALE = [
    [0.0, "rgba(255, 237, 160, 0)"], [0.2, "rgba(254, 217, 118, 0.35)"], [0.45, "rgba(253, 141, 60, 0.6)"],
    [0.7, "rgba(227, 26, 28, 0.8)"], [1.0, "rgba(128, 0, 38, 0.92)"],
]


def named_scale(name: str) -> list:
    """A plotly.py colour scale name ("RdBu_r") as explicit stops, the ones plotly's validator would make of
    it: figures are built unvalidated (Fig.build) and plotly.js knows only a few of the names."""
    colors = [c for _, c in get_colorscale(name)]
    return [[i / (len(colors) - 1), c] for i, c in enumerate(colors)]


# Blue ↔ white ↔ red for signed quantities (positional encodings, similarities, biases).
DIVERGING_SCALE = named_scale("RdBu_r")
VIRIDIS = named_scale("Viridis")  # perceptually uniform, for unsigned quantities that are not attention
# One colour per head (Tableau 10 followed by a second, darker set) for head view and scatter plots.
HEAD_COLORS = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd",
    "#e6550d", "#31a354", "#756bb1", "#636363", "#9c9ede", "#cedb9c", "#e7cb94", "#e7969c",
]

# A small explicit template: plotly's default template adds ~8 KB of JSON to every figure.
TEMPLATE = dict(
    layout=dict(
        font=dict(family=FONT, size=BASE_FONT_SIZE, color="#222"),
        paper_bgcolor="white",
        plot_bgcolor="white",
        title=dict(x=0.02, xanchor="left", font=dict(size=18)),
        hoverlabel=dict(font=dict(family=FONT, size=14)),
        xaxis=dict(showgrid=False, zeroline=False, linecolor="#888", ticks="outside", automargin=True),
        yaxis=dict(showgrid=False, zeroline=False, linecolor="#888", ticks="outside", automargin=True),
        margin=dict(l=70, r=30, t=70, b=60),
        colorway=HEAD_COLORS[:10],
    )
)


# ----------------------------------------------------------------------------------------------------
# Building figures


VALIDATE = os.environ.get("ATLAS_VALIDATE_FIGURES", "") == "1"


def figure_from_spec(spec: dict, validate: bool) -> go.Figure:
    """``go.Figure`` from a ``{"data": [...], "layout": {...}}`` spec, with or without plotly's validation.

    The one place that uses plotly's private ``_validate`` argument. plotly has no public way to build a
    figure without validating every property, which costs more than the 10 ms a handler may spend on it
    (bench/figures.py: ``<action>_validated_ms`` against ``<action>_handler_ms``); gr.Plot needs a figure
    object. tests/test_viz_build.py fails loudly if a plotly release renames, drops or changes the argument:
    then replace this body with ``go.Figure(spec)``, which is correct and only slower.
    """
    return go.Figure(spec, _validate=validate)


_UNDERSCORE_NAMES = ("paper_bgcolor", "plot_bgcolor", "error_x", "error_y")  # real names, not paths


def _expand(kw: dict) -> dict:
    """plotly's "magic underscore" keyword arguments (``title_text=`` → ``title=dict(text=)``). Apart from
    the few names above, plotly property names never contain an underscore. Nested dicts are taken as
    written."""
    out: dict = {}
    for key, value in kw.items():
        *path, last = [key] if key in _UNDERSCORE_NAMES else key.split("_")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        if isinstance(value, dict):
            _merge(node.setdefault(last, {}), value)
        else:
            node[last] = value
    return out


def _merge(into: dict, new: dict) -> dict:
    """Deep-merge ``new`` into ``into`` (dicts are copied, so shared constants are never modified)."""
    for key, value in new.items():
        if isinstance(value, dict):
            if not isinstance(into.get(key), dict):
                into[key] = {}
            _merge(into[key], value)
        else:
            into[key] = value
    return into


def _unit(domain: list[float]) -> list[float]:
    return [min(1.0, max(0.0, round(v, 12))) for v in domain]


class Fig:
    """A figure built as plain dicts and turned into a ``go.Figure`` once, in ``build()``.

    It offers the few ``go.Figure`` / ``make_subplots`` calls viz uses (update_layout, update_xaxes,
    update_yaxes, add_trace, add_shape, add_annotation, add_vline, with row= / col= for subplots) with the
    same meaning. The reason is speed: plotly re-validates its object tree on every incremental call, which
    cost 50–100 ms a figure on a 2-core CPU; building from the finished dicts without validation takes
    under 1 ms, with it 3–20 ms (``python bench/figures.py``). Traces are dicts such as
    ``dict(type="heatmap", z=...)``.
    """

    def __init__(self, data: Sequence[dict] | dict | None = None, *, rows: int = 1, cols: int = 1,
                 subplot_titles: Sequence[str] | None = None, horizontal_spacing: float | None = None,
                 vertical_spacing: float | None = None, shared_yaxes: bool = False) -> None:
        self.data: list[dict] = [data] if isinstance(data, dict) else list(data or [])
        self.layout: dict = {}
        self.rows, self.cols = rows, cols
        if rows * cols > 1:  # the domains and titles make_subplots would lay out (top-left start)
            hs = 0.2 / cols if horizontal_spacing is None else horizontal_spacing
            vs = (0.5 if subplot_titles else 0.3) / rows if vertical_spacing is None else vertical_spacing
            w, h = (1 - hs * (cols - 1)) / cols, (1 - vs * (rows - 1)) / rows
            titles = list(subplot_titles or [])
            for r in range(1, rows + 1):
                for c in range(1, cols + 1):
                    x, y = self._axes(r, c)
                    x0, y1 = (c - 1) * (w + hs), 1 - (r - 1) * (h + vs)
                    self.layout[x] = dict(domain=_unit([x0, x0 + w]), anchor=self._ref(y))
                    self.layout[y] = dict(domain=_unit([y1 - h, y1]), anchor=self._ref(x))
                    if shared_yaxes and c > 1:
                        self.layout[y].update(matches=self._ref(self._axes(r, 1)[1]), showticklabels=False)
                    i = (r - 1) * cols + c - 1
                    if i < len(titles) and titles[i]:
                        self.add_annotation(text=titles[i], x=x0 + w / 2, y=y1, xref="paper", yref="paper",
                                            xanchor="center", yanchor="bottom", showarrow=False,
                                            font=dict(size=16))

    def _axes(self, row: int, col: int) -> tuple[str, str]:
        k = (row - 1) * self.cols + col
        return ("xaxis", "yaxis") if k == 1 else (f"xaxis{k}", f"yaxis{k}")

    @staticmethod
    def _ref(axis: str) -> str:  # "xaxis2" -> "x2", as traces and shapes name their axes
        return axis.replace("axis", "")

    def _axis_names(self, letter: str, row: int | None, col: int | None) -> list[str]:
        rows = [row] if row is not None else range(1, self.rows + 1)
        cols = [col] if col is not None else range(1, self.cols + 1)
        return [self._axes(r, c)[letter == "y"] for r in rows for c in cols]

    def add_trace(self, trace: dict, row: int | None = None, col: int | None = None) -> Fig:
        if row is not None and col is not None:
            x, y = self._axes(row, col)
            trace = {**trace, "xaxis": self._ref(x), "yaxis": self._ref(y)}
        self.data.append(trace)
        return self

    def update_layout(self, **kw) -> Fig:
        _merge(self.layout, _expand(kw))
        return self

    def update_xaxes(self, row: int | None = None, col: int | None = None, **kw) -> Fig:
        for name in self._axis_names("x", row, col):
            _merge(self.layout.setdefault(name, {}), _expand(kw))
        return self

    def update_yaxes(self, row: int | None = None, col: int | None = None, **kw) -> Fig:
        for name in self._axis_names("y", row, col):
            _merge(self.layout.setdefault(name, {}), _expand(kw))
        return self

    def add_shape(self, row: int | None = None, col: int | None = None, **kw) -> Fig:
        shape = _expand(kw)
        if row is not None and col is not None:
            x, y = self._axes(row, col)
            shape.setdefault("xref", self._ref(x))
            shape.setdefault("yref", self._ref(y))
        self.layout.setdefault("shapes", []).append(shape)
        return self

    def add_annotation(self, **kw) -> Fig:
        self.layout.setdefault("annotations", []).append(_expand(kw))
        return self

    def add_vline(self, x: float, row: int | None = None, col: int | None = None, **kw) -> Fig:
        """A vertical line across the whole plot area at data coordinate ``x``."""
        xaxis, yaxis = self._axes(row, col) if row is not None and col is not None else ("xaxis", "yaxis")
        return self.add_shape(type="line", x0=x, x1=x, y0=0, y1=1, xref=self._ref(xaxis),
                              yref=self._ref(yaxis) + " domain", **kw)

    def build(self, validate: bool | None = None) -> go.Figure:
        """The ``go.Figure``. Unvalidated by default: the same JSON, ~10× faster (tests/test_viz_build.py
        compares both for every figure family); ``ATLAS_VALIDATE_FIGURES=1`` (set by the tests) validates
        every figure, so a misspelt property fails there."""
        return figure_from_spec(dict(data=self.data, layout=self.layout), VALIDATE if validate is None else validate)


def base_layout(fig: Fig, title: str, width: int | None = None, height: int | None = None) -> Fig:
    """Apply the shared template and title to ``fig`` (returns it for chaining)."""
    fig.update_layout(template=TEMPLATE, title=dict(text=title), width=width, height=height)
    return fig


def fit_subtitle(sub: str, width: int, px: float = 6.5) -> list[str]:
    """A subtitle's parts (split at " · ") gathered into lines that fit a figure ``width`` px wide, in the title's
    <sup> type (~``px`` px a character, the title's 2 % indent and some room taken off): a subtitle longer than its
    figure was cut at the figure's edge. A single part longer than a line is broken at spaces."""
    chars = max(16, int((width * 0.98 - 24) / px))
    words: list[str] = []
    for part in sub.split(" · "):
        while len(part) > chars:  # one part wider than the figure: break at its last space that fits
            cut = part.rfind(" ", 0, chars)
            cut = cut if cut > 0 else chars
            words.append(part[:cut])
            part = part[cut:].lstrip()
        words.append(part)
    lines: list[str] = []
    for part in words:
        if lines and len(lines[-1]) + 3 + len(part) <= chars:
            lines[-1] += " · " + part
        else:
            lines.append(part)
    return lines


def colorbar(title: str = WEIGHT_LABEL, **kw) -> dict:
    """A labelled colour bar, title on the side so it never collides with the plot title."""
    return dict(title=dict(text=title, side="right"), thickness=16, len=0.9, outlinewidth=0, **kw)


def weight_range(values: np.ndarray, autoscale: bool) -> tuple[float, float]:
    """Colour range for attention weights: fixed 0–1 by default, or 0–max when ``autoscale``."""
    if not autoscale:
        return 0.0, 1.0
    top = float(np.nanmax(values)) if values.size else 1.0
    return 0.0, top if top > 0 else 1.0


# ----------------------------------------------------------------------------------------------------
# Numbers and labels


def f32(a: np.ndarray) -> np.ndarray:
    """float32, C-contiguous: plotly.py sends numpy arrays as base64 typed arrays (4 bytes a value)."""
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


# Special tokens as the tokenizers spell them: drawn as tags, not as words.
SPECIAL_TOKENS = frozenset({"<s>", "</s>", "<pad>", "<unk>", "<|endoftext|>", "[CLS]", "[SEP]", "[PAD]", "[UNK]",
                            "[MASK]", "CLS"})


def esc(text: str) -> str:
    """Escape a label for plotly: its text is pseudo-HTML (``<b>``, ``<br>``, ``<s>``...), so a token
    like ``</s>`` or ``<img ...>`` must be sent as entities to be drawn as the literal text."""
    return html.escape(str(text), quote=False)


def shorten(text: str, max_len: int = 12) -> str:
    """Shorten a label to ``max_len`` characters with an ellipsis in the middle of the cut."""
    text = str(text)
    if len(text) <= max_len:
        return text
    return text[: max_len - 1] + "…"


def raw_note(token: str) -> str:
    """" (piece Ġold)" for a label that carries the tokenizer's own piece (``raw``: a byte-level BPE piece, whose label
    is decoded, models.inputs.tokenizer.readable_piece), else "": what hover text adds after the label. Escaped."""
    raw = getattr(token, "raw", None)
    return f" (piece {esc(raw)})" if raw is not None and raw != str(token) else ""


_BYTE = re.compile(r"<0x([0-9A-F]{2})>")


def across_pieces(tokens: Sequence[str]) -> tuple[list[str], list[str]]:
    """Characters cut over several pieces, read whole: (each label as running text, each label's note).

    A byte that is not part of a whole character within its piece is spelled ``<0xF0>`` (a byte-level label,
    models.inputs.tokenizer.readable_piece, and SentencePiece's byte pieces alike). Where consecutive labels' bytes,
    with no other text between them, make a whole character (an emoji cut as ``▁<0xF0><0x9F><0x98>`` + ``<0x80>``),
    the running text shows the character once, in the label where it starts, the others' share of it dropped
    (``▁😀`` and ``""``), and each of those labels' note says "part of 😀". Bytes that make no character stay
    escapes; a label alone keeps its text (an axis shows each piece as it is)."""
    labels = [str(t) for t in tokens]
    found = [(i, m) for i, t in enumerate(labels) for m in _BYTE.finditer(t)]
    runs: list[list[tuple[int, re.Match]]] = []
    for i, m in found:  # runs of escapes with nothing between them, across label boundaries too
        if runs:
            j, last = runs[-1][-1]
            joined = (j == i and last.end() == m.start()) or (j == i - 1 and last.end() == len(labels[j])
                                                              and m.start() == 0)
            if joined:
                runs[-1].append((i, m))
                continue
        runs.append([(i, m)])
    cuts: dict[tuple[int, int], str] = {}  # (label, escape's start) -> what the running text shows there
    notes: list[set[str]] = [set() for _ in labels]
    for run in runs:
        data = bytes(int(m.group(1), 16) for _, m in run)
        p = 0
        while p < len(data):
            for size in range(2, min(4, len(data) - p) + 1):  # a multi-byte UTF-8 character (one byte is never cut)
                try:
                    ch = data[p:p + size].decode("utf-8")
                except UnicodeDecodeError:
                    continue
                owners = {run[q][0] for q in range(p, p + size)}
                if len(ch) == 1 and len(owners) > 1 and ch.isprintable():
                    for q in range(p, p + size):
                        i, m = run[q]
                        cuts[(i, m.start())] = ch if q == p else ""
                        notes[i].add(ch)
                    p += size
                    break
            else:
                p += 1
    shown = [_BYTE.sub(lambda m, i=i: cuts.get((i, m.start()), m.group(0)), t) for i, t in enumerate(labels)]
    return shown, [f"part of {' '.join(sorted(n))}" if n else "" for n in notes]


def unique_labels(tokens: Sequence[str], start: int = 0) -> list[str]:
    """Full, escaped, position-tagged labels ("3 · the"): unique, so that repeated tokens stay separate
    categories on a categorical axis, and informative in hover text, where a decoded byte-level label also shows its
    piece ("3 · ▁old (piece Ġold)"). ``start``: the position of the first token (a zoomed block keeps the positions of
    the whole input)."""
    parts = across_pieces(tokens)[1]
    return [f"{i} · {esc(t)}{raw_note(t)}" + (f", {esc(part)}" if part else "")
            for (i, t), part in zip(enumerate(tokens, start), parts)]


def tick_labels(tokens: Sequence[str], max_len: int = 12, max_ticks: int = 64) -> tuple[list[int], list[str]]:
    """Tick positions and shortened, escaped texts; with more than ``max_ticks`` tokens, every k-th."""
    n = len(tokens)
    step = max(1, int(np.ceil(n / max_ticks)))
    idx = list(range(0, n, step))
    return idx, [esc(shorten(tokens[i], max_len)) for i in idx]


def category_ticks(categories: Sequence[str], tokens: Sequence[str], max_len: int = 12,
                   max_ticks: int = 64) -> dict:
    """Axis settings for a categorical axis whose categories are ``unique_labels(tokens)``."""
    idx, text = tick_labels(tokens, max_len, max_ticks)
    return dict(
        type="category", tickmode="array", tickvals=[categories[i] for i in idx], ticktext=text,
        categoryorder="array", categoryarray=list(categories),
    )


def axis_font_size(n: int) -> int:
    """Smaller tick font for long inputs so labels do not collide."""
    return 13 if n <= 24 else 11 if n <= 48 else 10


# ----------------------------------------------------------------------------------------------------
# Pooling and tiling


def block_edges(n: int, max_cells: int) -> np.ndarray:
    """Edges of equal-as-possible blocks that split ``n`` cells into ``ceil(n / ceil(n / max_cells))``."""
    factor = max(1, int(np.ceil(n / max_cells)))
    out = int(np.ceil(n / factor))
    return np.minimum(np.arange(out + 1) * factor, n)


def max_pool(a: np.ndarray, max_cells: int = 64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Max-pool the last two axes of ``a`` so that each is at most ``max_cells`` long.

    Blocks are ``factor × factor`` (the last block may be smaller); every block keeps its maximum, so
    a strong single weight never disappears in a thumbnail. Returns (pooled, row_edges, col_edges).
    """
    rows, cols = a.shape[-2:]
    re, ce = block_edges(rows, max_cells), block_edges(cols, max_cells)
    if len(re) - 1 == rows and len(ce) - 1 == cols:
        return a, re, ce
    fr, fc = int(re[1] - re[0]), int(ce[1] - ce[0])
    pr, pc = (len(re) - 1) * fr - rows, (len(ce) - 1) * fc - cols
    pad = [(0, 0)] * (a.ndim - 2) + [(0, pr), (0, pc)]
    padded = np.pad(a, pad, constant_values=-np.inf) if (pr or pc) else a
    shape = a.shape[:-2] + (len(re) - 1, fr, len(ce) - 1, fc)
    return padded.reshape(shape).max(axis=(-3, -1)), re, ce


POOLS = ("max", "mean")  # how a pooled attention cell summarises its block


class Pooled(NamedTuple):
    """A map pooled already (``pool_blocks``'s answer, or tiles computed where the weights are, on a GPU): the
    figures draw it as they draw a map they pooled themselves."""

    z: np.ndarray  # (..., R, C) float32
    row_edges: np.ndarray
    col_edges: np.ndarray


def pool_blocks(a: np.ndarray, max_cells: int, how: str = "max") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pool the last two axes of ``a`` (..., R, C) to at most ``max_cells`` each: (pooled float32, row_edges,
    col_edges), the blocks those of ``block_edges`` (the last one may be smaller).

    ``how``: "max" keeps each block's largest value (a single strong weight never disappears), "mean" its
    average over the block's cells (masked cells count as the zeros they are). Works one (R, C) slice at a time
    with ``ufunc.reduceat``, in float32 whatever the input's dtype, so pooling a (12, 12, 2048, 2048) float16
    tensor never holds a float32 copy of it. Equal to a direct max/mean over each block (tests/test_long_context.py).
    """
    if how not in POOLS:
        raise ValueError(f"pooling must be one of {', '.join(POOLS)}, got {how!r}")
    a = np.asarray(a)
    rows, cols = a.shape[-2:]
    if not rows or not cols:
        raise ValueError(f"nothing to pool: the map is {rows} × {cols}")
    re, ce = block_edges(rows, max_cells), block_edges(cols, max_cells)
    lead = a.shape[:-2]
    flat = a.reshape(-1, rows, cols)
    out = np.empty((flat.shape[0], len(re) - 1, len(ce) - 1), np.float32)
    reduce = np.maximum if how == "max" else np.add
    for i, m in enumerate(flat):
        m = m if how == "max" else m.astype(np.float32, copy=False)  # a max is exact in any float dtype
        out[i] = reduce.reduceat(reduce.reduceat(m, re[:-1], axis=0), ce[:-1], axis=1)
    if how == "mean":
        out /= np.outer(np.diff(re), np.diff(ce)).astype(np.float32)
    return out.reshape(lead + out.shape[1:]), re, ce


def tile(blocks: np.ndarray, ncols: int, gap: int = 1, fill: float = np.nan, row_gap: int | None = None
         ) -> np.ndarray:
    """Lay ``blocks`` (N, a, b) out in a grid of ``ncols`` columns with ``gap`` cells of ``fill`` between
    them (``row_gap`` between rows, default ``gap``): one heatmap draws a whole grid of small multiples
    (far lighter and faster than N subplots)."""
    n, a, b = blocks.shape[:3]
    rg = gap if row_gap is None else row_gap
    nrows = int(np.ceil(n / ncols))
    out = np.full((nrows * (a + rg) - rg, ncols * (b + gap) - gap) + blocks.shape[3:], fill, dtype=blocks.dtype)
    for i in range(n):
        r, c = divmod(i, ncols)
        out[r * (a + rg): r * (a + rg) + a, c * (b + gap): c * (b + gap) + b] = blocks[i]
    return out


# ----------------------------------------------------------------------------------------------------
# Images


def _png_bytes(img: np.ndarray) -> bytes:
    """Minimal PNG encoder (8-bit grey or RGB) so viz needs no imaging library."""
    img = np.ascontiguousarray(img, dtype=np.uint8)
    h, w = img.shape[:2]
    color_type = 0 if img.ndim == 2 else 2
    raw = b"".join(b"\x00" + img[r].tobytes() for r in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", w, h, 8, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(
        b"IEND", b"")


def as_uint8_image(image: np.ndarray) -> np.ndarray:
    """Validate and convert an image to uint8 (H, W) or (H, W, 3)."""
    img = np.asarray(image)
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[..., 0]
    if img.ndim == 3 and img.shape[2] == 4:
        img = img[..., :3]
    if not (img.ndim == 2 or (img.ndim == 3 and img.shape[2] == 3)):
        raise ValueError(f"image must be (H, W) grey or (H, W, 3) RGB, got shape {img.shape}")
    if img.dtype != np.uint8:
        img = np.clip(img * (255.0 if img.max() <= 1.0 else 1.0), 0, 255).astype(np.uint8)
    return img


def png_data_uri(image: np.ndarray) -> str:
    """``data:image/png;base64,...`` for a uint8 (H, W) or (H, W, 3) image. The last few are remembered:
    one request draws the same image under several figures."""
    img = as_uint8_image(image)
    return _png_uri(img.shape, img.tobytes())


@lru_cache(maxsize=16)
def _png_uri(shape: tuple[int, ...], data: bytes) -> str:
    img = np.frombuffer(data, dtype=np.uint8).reshape(shape)
    return "data:image/png;base64," + base64.b64encode(_png_bytes(img)).decode("ascii")


def rect_path(x0: float, y0: float, x1: float, y1: float) -> str:
    """SVG path of one rectangle (several can be joined into one layout shape)."""
    return f"M{x0:g},{y0:g}H{x1:g}V{y1:g}H{x0:g}Z"


# ----------------------------------------------------------------------------------------------------
# Phones: the same figure laid out for a narrow screen


PHONE_WIDTH = 340  # px: the figure's width on a 390 px phone (the page's padding taken off)
PHONE_NARROW = 600  # px: a figure box narrower than this gets the phone layout (tabs/page.py's script)
PHONE_GAP = 64  # px of each horizontal colour bar under the plot (its bar, ticks and title)
PHONE_TICK_PX = 12  # px between two tick labels of a dense axis on a phone (9 px type)
PHONE_MIN_PLOT = 140  # px: the least height of a plot on a phone
PHONE_MIN_ROW = 4  # px: the least height of a map's row when maps stand two to a row on a phone (else one to a row)


def _axis_names(layout: dict, letter: str) -> list[str]:
    return sorted((k for k in layout if re.fullmatch(fr"{letter}axis\d*", k)), key=lambda k: int(k[5:] or 1))


def _axis_labels(name: str, layout: dict, data: list[dict]) -> tuple[int | None, bool]:
    """How many labels the axis ``name`` ("xaxis2") would carry, and whether they are categories (words): the
    length of its category array, of its traces' string coordinates, or a heatmap's columns (rows) where it has
    none; None when not known (a numeric axis whose ticks Plotly spaces by its length)."""
    letter, ref = name[0], name[0] + name[5:]
    if layout[name].get("categoryarray") is not None:
        return len(layout[name]["categoryarray"]), True
    count, words = None, False
    for t in data:
        if (t.get(f"{letter}axis") or letter) != ref:
            continue
        v = t.get(letter)
        if v is not None and not isinstance(v, dict) and len(v):
            arr = np.asarray(v, dtype=object)
            if any(isinstance(x, str) for x in arr.ravel()[:50]):
                count, words = max(count or 0, len(set(arr.ravel().tolist()))), True
        elif t.get("type") == "heatmap" and t.get("z") is not None and v is None:
            shape = np.shape(t["z"])
            if len(shape) >= 2:
                count = max(count or 0, shape[-1] if letter == "x" else shape[-2])
    return count, words


def _label_px(layout: dict, data: list[dict], ys: list[str], width: int) -> int:
    """Pixels the y tick labels take beside a plot on a phone (11 px type: ~6.5 px a character; 40 px for numbers),
    from the longest label of any y axis, at most 40 % of the figure's width."""
    longest = 0
    for y in ys:
        axis, ref = layout[y], "y" + y[5:]
        if axis.get("showticklabels", True) is False:
            continue
        texts = axis.get("ticktext") if axis.get("ticktext") is not None else axis.get("categoryarray")
        if texts is None:
            texts = [v for t in data if (t.get("yaxis") or "y") == ref and t.get("y") is not None
                     and not isinstance(t.get("y"), dict) for v in np.asarray(t["y"], dtype=object).ravel()[:400]]
        longest = max([longest] + [len(re.sub(r"<[^>]*>", "", v)) for v in texts if isinstance(v, str)])
    return int(min(max(40, 6.5 * longest + 14), 0.4 * width))


def _dense_ticks(axis: dict, length_px: float, labels: tuple[int | None, bool] = (None, False)) -> dict:
    """Updates thinning an axis's tick labels to one every PHONE_TICK_PX (every k-th label kept, the first one
    included) and its font to 9 px, where it has more labels than fit (``labels``: `_axis_labels`); a numeric axis
    with a set step gets a larger one; a log axis labels its decades only; {} when the labels fit."""
    keep = max(3, int(length_px // PHONE_TICK_PX))
    vals, text = axis.get("tickvals"), axis.get("ticktext")
    if vals is not None and len(vals) > keep:
        k = -(-len(vals) // keep)
        return {"tickvals": list(vals)[::k], "ticktext": list(text)[::k] if text is not None else None,
                "tickfont.size": 9}
    if axis.get("showticklabels", True) is False:
        return {}
    if vals is not None:  # every label fits, closely: smaller type
        return {"tickfont.size": 9} if len(vals) and length_px / len(vals) < 16 else {}
    if axis.get("type") == "log":
        return {"dtick": 1}  # powers of ten only (Plotly labels every digit between them when crowded)
    count, words = labels
    if words and count is not None and count > keep:
        return {"nticks": keep, "tickfont.size": 9}
    if words and count and length_px / count < 16:  # every word fits, closely: smaller type
        return {"tickfont.size": 9}
    step = axis.get("dtick")
    if not words and count is not None and isinstance(step, (int, float)) and count / step > keep:
        return {"dtick": step * -(-count // (step * keep))}
    return {}


def _wrap_title(title: str, width: int, px: float = 7.5) -> str:
    """A title's lines wrapped at spaces to the phone's width (14 px type: ~``px`` px a character; 70 % of that in
    <sup>); a line with markup other than <sup> and <b> (a coloured span) is left as it is."""
    lines, small = [], False
    for line in title.split("<br>"):
        plain = re.sub(r"</?(sup|b)>", "", line)
        small = small or "<sup>" in line
        chars = max(16, int(width / (px * (0.7 if small else 1.0))))
        if "<" in plain or len(plain) <= chars:
            lines.append(line)
        else:  # words with their tags, measured without them
            out, n = [], 0
            for word in line.split(" "):
                size = len(re.sub(r"<[^>]*>", "", word))
                if out and n + 1 + size > chars:
                    lines.append(" ".join(out))
                    out, n = [], 0
                out.append(word)
                n += size + (1 if n else 0)
            lines.append(" ".join(out))
        small = small and "</sup>" not in line
    return "<br>".join(lines)


def _set(target: dict, path: str, value: Any) -> None:
    """``target[path] = value`` for a Plotly property path ("xaxis2.tickfont.size", "annotations[3].x"); None
    removes the property (Plotly then uses its default)."""
    parts = path.split(".")
    for part in parts[:-1]:
        name, _, i = part.partition("[")
        target = target.setdefault(name, {}) if not i else target[name][int(i[:-1])]
    if value is None:
        target.pop(parts[-1], None)
    else:
        target[parts[-1]] = value


def _legend_items(layout: dict, data: list[dict]) -> list[str]:
    """The names the legend shows (Plotly's rule: the traces not hidden from it, once there are two or more of them,
    one of them is shown explicitly, or ``layout.showlegend`` is set)."""
    if layout.get("showlegend") is False:
        return []
    shown = [t for t in data if t.get("showlegend") is not False and
             (t.get("showlegend") or t.get("type") not in ("heatmap", "contour", "histogram2d", "image"))]
    names = list(dict.fromkeys(str(t.get("name") or "trace") for t in shown))  # a legend group's traces: one entry
    explicit = any(t.get("showlegend") for t in shown)
    return names if len(shown) >= 2 or (shown and (explicit or layout.get("showlegend"))) else []


def _legend_height(names: list[str], width: int) -> int:
    """Pixels of a horizontal legend of ``names`` at ``width`` (10 px type: ~6 px a character, 40 px of symbol and
    gap an entry), its rows filled left to right."""
    rows, used = 1, 0
    for name in names:
        w = 40 + 6 * len(re.sub(r"<[^>]*>", "", name))
        if used and used + w > width:
            rows, used = rows + 1, 0
        used += w
    return 20 * rows + 8


def phone(fig: go.Figure | None, width: int = PHONE_WIDTH) -> go.Figure | None:
    """``fig`` with its phone layout attached (``layout.meta.atlas_phone``), which the page's script applies when
    the figure's box is narrower than `PHONE_NARROW` px (tabs/page.py): the figure takes the box's width; subplots
    side by side go two to a row; each colour bar lies horizontal under the plot (it stood beside a map it was wider
    than) and a legend lies horizontal under the plot too; a dense axis keeps one tick label every `PHONE_TICK_PX`
    px; a map with square cells is as tall as it is wide. The figure itself is unchanged for wider screens; the
    phone layout leaves out the layout's images (the page keeps the figure's own). Every tab's figures get it from
    ``tabs.common.Plot``. Returns ``fig``."""
    if fig is None:
        return fig
    meta = fig.layout.meta if isinstance(fig.layout.meta, dict) else {}
    if "atlas_phone" in meta:
        return fig
    layout = fig.layout.to_plotly_json()
    layout.pop("images", None)  # the page keeps the figure's own (they can be the largest part of a layout)
    data = [t.to_plotly_json() for t in fig.data]
    updates: dict[str, Any] = {"font.size": 11, "title.font.size": 14, "width": width}  # the page sets the width
    title = (layout.get("title") or {}).get("text") or ""
    wrapped = _wrap_title(title, width)
    if wrapped != title:  # a long title is wrapped rather than cut at the phone's edge
        updates["title.text"] = wrapped
    top, small = 24, False  # the title's lines (14 px type, 19 px a line; a <sup> line 14 px) and the subplot titles
    for line in wrapped.split("<br>") if wrapped else []:
        small = small or "<sup>" in line
        top += 14 if small else 19
        small = small and "</sup>" not in line
    top += 22 if layout.get("annotations") else 0
    left, right = 8, 8  # tick labels push the margins out as they need (automargin)
    xs, ys = _axis_names(layout, "x"), _axis_names(layout, "y")
    cols = sorted({tuple(layout[x].get("domain", (0, 1))) for x in xs}) or [(0, 1)]
    rows = sorted({tuple(layout[y].get("domain", (0, 1))) for y in ys}, reverse=True) or [(0, 1)]
    per_row, stacked = (2 if len(cols) > 1 else 1), False
    if per_row == 2 and len(xs) > 1:  # maps of many rows two to a row were strips of 2 px a row: one to a row
        half = (width - left - right - 2 * _label_px(layout, data, ys, width)) / 2
        heights = [np.shape(t["z"])[0] for t in data if t.get("type") in ("heatmap", "contour")
                   and t.get("z") is not None and len(np.shape(t["z"])) >= 2]
        if heights and half / max(heights) < PHONE_MIN_ROW:
            per_row, stacked = 1, True
    cells = len(cols) * len(rows) if len(xs) > 1 else 1
    new_rows = -(-cells // per_row)
    plot_w = width - left - right - _label_px(layout, data, ys, width) * per_row  # the y tick labels of each column
    cell_w = plot_w / per_row
    square = any(layout.get(y, {}).get("scaleanchor") for y in ys)
    cell_h = cell_w if (square or per_row > 1 or stacked) else 260
    if square and data:  # a map with square cells: as tall as its grid's shape over the width
        z = next((t.get("z") for t in data if t.get("z") is not None), None)
        shape = np.shape(z) if z is not None else ()
        if len(shape) >= 2 and shape[1]:  # at least PHONE_MIN_PLOT px: a colour bar under a flatter plot pushes
            cell_h = max(cell_w * shape[0] / shape[1], PHONE_MIN_PLOT)  # the margins past the figure (Plotly fails)
    titled = bool(layout.get("annotations")) and new_rows > 1
    gap = (114 if stacked else 84) if titled else 40  # subplot titles, tick labels and axis titles (more: stacked)
    bars = [i for i, t in enumerate(data) if t.get("type") in ("heatmap", "contour", "histogram2d") and
            t.get("showscale", True) is not False and "coloraxis" not in t]
    bars += [i for i, t in enumerate(data) if t.get("type") not in ("heatmap", "contour", "histogram2d") and
             (t.get("marker") or {}).get("showscale", (t.get("marker") or {}).get("colorbar") is not None)]
    legend = _legend_items(layout, data)
    legend_h = _legend_height(legend, width - 16) if legend else 0
    labels_below = 70 if any(layout[x].get("showticklabels", True) is not False for x in xs) else 10
    bottom = labels_below + PHONE_GAP * len(bars) + legend_h
    plot_h = new_rows * cell_h + (new_rows - 1) * gap
    height = int(top + plot_h + bottom + (24 if titled else 0))
    updates.update({"height": height, "margin.l": left, "margin.r": right, "margin.t": top, "margin.b": bottom})
    if legend:  # horizontal, under the plot and its colour bars (beside the plot it took the map's width)
        updates["legend"] = {**(layout.get("legend") or {}), "orientation": "h", "x": 0, "xanchor": "left",
                             "xref": "container", "yref": "container", "yanchor": "bottom",
                             "y": (4 + PHONE_GAP * len(bars)) / height, "font": {"size": 10}}
    if len(xs) > 1:  # the subplots, in reading order, two to a row
        order = sorted(zip(xs, ys, strict=False), key=lambda a: (-layout[a[1]].get("domain", (0, 1))[1],
                                                                  layout[a[0]].get("domain", (0, 1))[0]))
        moved = {}
        for k, (x, y) in enumerate(order):
            r, c = divmod(k, per_row)
            x0, x1 = c / per_row + (0.08 if c else 0), (c + 1) / per_row - (0.02 if c + 1 < per_row else 0)
            y1 = 1 - (r * (cell_h + gap)) / plot_h
            y0 = max(0.0, y1 - cell_h / plot_h)
            old_x, old_y = layout[x].get("domain", (0, 1)), layout[y].get("domain", (0, 1))
            moved[(round((old_x[0] + old_x[1]) / 2, 4), round(old_y[1], 4))] = ((x0 + x1) / 2, y1)
            updates[f"{x}.domain"], updates[f"{y}.domain"] = [x0, x1], [y0, y1]
        for i, a in enumerate(layout.get("annotations") or []):  # subplot titles follow their subplot
            where = moved.get((round(float(a.get("x", -1)), 4), round(float(a.get("y", -1)), 4)))
            if where is not None and a.get("xref", "paper") == "paper":
                updates[f"annotations[{i}].x"], updates[f"annotations[{i}].y"] = where
                updates[f"annotations[{i}].font.size"] = 10
    for names, length in ((xs, cell_w), (ys, cell_h)):
        for a in names:
            for key, value in _dense_ticks(layout[a], length, _axis_labels(a, layout, data)).items():
                updates[f"{a}.{key}"] = value
            text = ((layout[a].get("title") or {}).get("text") or "") if isinstance(layout[a].get("title"), dict) \
                else ""
            if text and _wrap_title(text, int(length), 6.2) != text:  # an axis title as long as its axis at most
                updates[f"{a}.title.text"] = _wrap_title(text, int(length), 6.2)
    for x in xs:
        if layout[x].get("tickangle") is not None:
            updates[f"{x}.tickangle"] = -90
    for y in ys:  # a map with square cells narrower than its plot's height: drawn at the top, not in the middle
        if layout[y].get("scaleanchor"):
            updates[f"{y}.constraintoward"] = "top"
    # the whole phone layout and each colour bar's trace patch: the page draws the figure anew with them (a redraw
    # from the wide layout fails in Plotly when vertical colour bars leave no room at a phone's width)
    narrow = layout
    for key, value in updates.items():
        _set(narrow, key, value)
    patches: dict[str, dict] = {}
    for n, i in enumerate(bars):  # each colour bar horizontal, under the plot, one band each from the bottom up
        heat = data[i].get("type") in ("heatmap", "contour", "histogram2d")
        bar = dict((data[i] if heat else data[i].get("marker", {})).get("colorbar") or {})
        bar["title"] = dict(bar.get("title") or {})
        bar["tickfont"] = dict(bar.get("tickfont") or {})
        for attr, value in {"orientation": "h", "x": 0.5, "xanchor": "center", "xref": "container",
                            "yref": "container", "yanchor": "bottom", "y": (6 + n * PHONE_GAP) / height,
                            "len": 0.8, "lenmode": "fraction", "thickness": 10, "title.side": "bottom",
                            "title.font.size": 11, "tickfont.size": 9,
                            "ticklabelposition": "outside top"}.items():  # ticks above the bar, its title under it
            _set(bar, attr, value)
        patches[str(i)] = {"colorbar": bar} if heat else {"marker": {"colorbar": bar}}  # merged into the marker
    for i, t in enumerate(data):  # words beside a scatter's points: none where the points stand too close
        x = t.get("x")
        if t.get("type", "scatter") == "scatter" and "text" in (t.get("mode") or "") and x is not None \
                and not isinstance(x, dict) and len(x):
            steps = len({v for v in np.asarray(x, dtype=object).ravel().tolist() if v is not None})
            if steps > 2 and cell_w / steps < 40:
                mode = "+".join(m for m in t["mode"].split("+") if m != "text") or "markers"
                patches.setdefault(str(i), {})["mode"] = mode
    for i, t in enumerate(data):  # numbers written in the cells: smaller, or none where a cell is too narrow
        z = t.get("z")
        if t.get("type") == "heatmap" and (t.get("texttemplate") or t.get("text") is not None) and z is not None:
            cell = cell_w / max(1, np.shape(z)[-1])
            if cell < 18:
                patches.setdefault(str(i), {})["texttemplate"] = ""
                patches[str(i)]["text"] = None
            elif cell < 36:
                patches.setdefault(str(i), {})["textfont"] = {**(t.get("textfont") or {}), "size": 7}
    narrow.pop("meta", None)
    narrow.pop("template", None)  # the figure's own template stays (the page keeps it)
    fig.layout.meta = {**meta, "atlas_phone": {"narrow": PHONE_NARROW, "layout": narrow, "traces": patches}}
    return fig


def apply_phone(fig: go.Figure) -> go.Figure:
    """A copy of ``fig`` as the page's script draws it on a phone (its `phone` layout and colour-bar patches), for
    tests and screenshots in Python."""
    out = go.Figure(fig)
    spec = (out.layout.meta or {}).get("atlas_phone")
    if not spec:
        return out
    out.update_layout(spec["layout"])
    for i, patch in spec["traces"].items():
        out.data[int(i)].update(patch)
    return out
