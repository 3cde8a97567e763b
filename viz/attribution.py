"""Attribution figures: the text coloured by a signed attribution (sub-word pieces merged into words), a signed
map over the image, and the deletion curves that compare the methods on the current input.

Signed values use one diverging scale everywhere (``DIVERGING_SCALE``, centred on 0): red supports the class,
blue speaks against it; attention, rollout and relevance are never negative, so they show only red.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from viz.common import DIVERGING_SCALE, HEAD_COLORS, SPECIAL_TOKENS, Fig, as_uint8_image, base_layout, colorbar, f32
from viz.images import _image_axes, _image_trace, patch_map

RED, BLUE, WHITE = np.array([178, 24, 43]), np.array([33, 102, 172]), np.array([255, 255, 255])


def merge_pieces(tokens: Sequence[str], values: np.ndarray) -> tuple[list[str], np.ndarray, list[bool]]:
    """Sub-word pieces joined into words, their values summed (attributions add up; so do attention shares):
    SentencePiece starts a word with ``▁``, WordPiece continues one with ``##``; specials stay on their own.
    Returns (words, values, is_special)."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if len(v) != len(tokens):
        raise ValueError(f"{len(v)} values for {len(tokens)} tokens")
    sentencepiece = any(str(t).startswith("▁") for t in tokens)
    words: list[str] = []
    sums: list[float] = []
    special: list[bool] = []
    for tok, val in zip(map(str, tokens), v):
        is_special = tok in SPECIAL_TOKENS
        continues = bool(words) and not special[-1] and not is_special and (
            tok.startswith("##") if not sentencepiece else not tok.startswith("▁"))
        piece = tok[2:] if tok.startswith("##") else tok.lstrip("▁") if sentencepiece else tok
        if continues:
            words[-1] += piece
            sums[-1] += float(val)
        else:
            words.append(tok if is_special else piece or "\u00a0")
            sums.append(float(val))
            special.append(is_special)
    return words, np.array(sums), special


def _tint(t: float) -> tuple[int, int, int]:
    """White at 0, deep red at +1, deep blue at -1."""
    end = RED if t >= 0 else BLUE
    c = WHITE + (end - WHITE) * min(abs(float(t)), 1.0)
    return int(c[0]), int(c[1]), int(c[2])


def signed_highlight(tokens: Sequence[str], values: np.ndarray, *, title: str = "", unit: str = "",
                     signed: bool = True) -> str:
    """The input as HTML, words (pieces merged) coloured on a diverging scale symmetric about 0 (±the largest
    magnitude). Every word is HTML-escaped; hover shows its exact value. ``signed=False``: a share that is for no
    class (attention, rollout), whose legend then runs from 0 to the largest value, with no supports/against."""
    words, v, special = merge_pieces(tokens, values)
    scale = float(np.max(np.abs(v[~np.array(special)]))) if (~np.array(special)).any() else 0.0
    scale = scale if scale > 0 else 1.0
    spans = []
    for word, val, is_special in zip(words, v, special):
        t = val / scale
        r, g, b = _tint(t)
        fg = "#fff" if abs(t) > 0.6 else "#111"
        style = f"background:rgb({r},{g},{b});color:{fg};padding:1px 3px;border-radius:3px;margin:1px 0"
        if is_special:
            style += ";font-family:monospace;font-size:0.85em;outline:1px dashed #999"
        tip = html.escape(f"{word}: {val:+.4g}{unit}", quote=True)
        spans.append(f'<span title="{tip}" style="{style}">{html.escape(word, quote=False)}</span>')
    legend = ('<div style="margin-top:8px;font-size:0.8em;color:#555">'
              '<span style="display:inline-block;width:140px;height:10px;vertical-align:middle;'
              'background:linear-gradient(90deg,rgb(33,102,172),#fff,rgb(178,24,43));border:1px solid #ccc"></span>'
              f" &minus;{scale:.3g} (against) &middot; 0 &middot; +{scale:.3g} (supports)</div>") if signed else (
        '<div style="margin-top:8px;font-size:0.8em;color:#555">'
        '<span style="display:inline-block;width:70px;height:10px;vertical-align:middle;'
        'background:linear-gradient(90deg,#fff,rgb(178,24,43));border:1px solid #ccc"></span>'
        f" 0 &middot; {scale:.3g} (share of attention; for no class in particular)</div>")
    head = f'<div style="font-weight:600;margin-bottom:6px">{html.escape(title)}</div>' if title else ""
    return (f'<div class="atlas-highlight atlas-attribution" style="font-size:1.15em;line-height:2.0;'
            f'font-family:sans-serif">{head}<div>{" ".join(spans)}</div>{legend}</div>')


def image_attribution(image: np.ndarray, values: np.ndarray, grid: tuple[int, int], *, title: str,
                      label: str = "attribution", opacity: float = 0.7, signed: bool = True) -> go.Figure:
    """A signed per-patch map over the image, on the diverging scale centred on 0 (±the largest magnitude);
    ``signed=False`` (attention, rollout: for no class) keeps the scale's upper half, 0 to the largest."""
    img = as_uint8_image(image)
    amap = patch_map(values, grid)
    patch = img.shape[0] / grid[0]
    top = float(np.nanmax(np.abs(amap))) if amap.size else 1.0
    top = top if top > 0 else 1.0
    rows, cols = amap.shape
    r, c = np.mgrid[0:rows, 0:cols]
    names = np.char.add(np.char.add("r", r.astype(str)), np.char.add("c", c.astype(str)))
    scale = DIVERGING_SCALE if signed else [[0.0, "#ffffff"], [1.0, "rgb(178,24,43)"]]
    heat = dict(type="heatmap", z=f32(amap), x0=(patch - 1) / 2, dx=patch, y0=(patch - 1) / 2, dy=patch,
                zmin=-top if signed else 0.0, zmax=top, **({"zmid": 0} if signed else {}), colorscale=scale,
                opacity=opacity, colorbar=colorbar(label),
                text=names, hovertemplate="patch %{text}<br>" + label + ": %{z:+.4g}<extra></extra>")
    fig = Fig([_image_trace(img), heat])
    base_layout(fig, title, height=560, width=620)
    _image_axes(fig, img)
    return fig.build()


CURVE_DASHES = ("solid", "dot", "dashdot", "longdash")  # one per method, unlike the random order's "dash"
CURVE_MARKERS = ("circle-open", "diamond", "square-open", "triangle-up")


def deletion_curves(curves: Sequence[tuple[str, np.ndarray, np.ndarray]], random: tuple[np.ndarray, np.ndarray],
                    *, label: str, removed: str = "tokens", chosen: str | None = None) -> go.Figure:
    """The target class's probability as each method's top-ranked items are removed (one line per method,
    ``(name, fractions, probs)``), and a random order's (dashed grey, the baseline). The chosen method is drawn
    thicker. A faithful ranking makes its line fall fastest. Lines often coincide (every ranking leaves a confident
    answer standing), so each has its own dash and marker, drawn widest first: none can hide another."""
    fig = Fig()
    x, y = random
    area = float(np.trapezoid(np.asarray(y, dtype=np.float64), np.asarray(x, dtype=np.float64)))
    fig.add_trace(dict(type="scatter", mode="lines+markers", x=f32(x), y=f32(y), name=f"random order (area {area:.2f})",
                       line=dict(color="#888", dash="dash", width=5), marker=dict(symbol="x-thin-open", size=14,
                                                                                 line=dict(width=2, color="#888")),
                       hovertemplate="random<br>%{x:.0%} removed: %{y:.1%}<extra></extra>"))
    for i, (name, x, y) in enumerate(curves):
        area = float(np.trapezoid(np.asarray(y, dtype=np.float64), np.asarray(x, dtype=np.float64)))
        fig.add_trace(dict(type="scatter", mode="lines+markers", x=f32(x), y=f32(y), name=f"{name} (area {area:.2f})",
                           line=dict(color=HEAD_COLORS[i % len(HEAD_COLORS)], dash=CURVE_DASHES[i % len(CURVE_DASHES)],
                                     width=(4 if name == chosen else 2.5) - 0.5 * min(i, 2)),
                           marker=dict(symbol=CURVE_MARKERS[i % len(CURVE_MARKERS)], size=11 - 2 * min(i, 3)),
                           hovertemplate=f"{html.escape(name)}<br>%{{x:.0%}} removed: %{{y:.1%}}<extra></extra>"))
    base_layout(fig, f"Deletion curve: P({html.escape(label)})<br><sup>as the top-ranked {removed} are removed</sup>",
                height=520)
    fig.update_xaxes(title=dict(text=f"share of the {removed} removed (highest-ranked first)"), tickformat=".0%",
                     range=[-0.02, 1.02])
    fig.update_yaxes(title=dict(text=f"P({html.escape(label)})"), tickformat=".0%", range=[-0.02, 1.02])
    fig.update_layout(legend=dict(orientation="h", x=0, y=-0.3, xanchor="left", yanchor="top"),
                      margin=dict(b=150))
    return fig.build()
