"""Text figures: the sentence coloured by a weight (HTML), cross-attention alignment, beam-search tree."""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from viz.attention import heatmap_fig
from viz.common import (
    HEAD_COLORS,
    SPECIAL_TOKENS,
    VIRIDIS,
    Fig,
    across_pieces,
    base_layout,
    colorbar,
    esc,
    f32,
    raw_note,
    shorten,
)

# ----------------------------------------------------------------------------------------------------
# Token highlight (HTML)



def _blue(t: float) -> tuple[int, int, int]:
    """White → deep blue, the same ramp as the heatmaps."""
    lo, hi = np.array([255, 255, 255]), np.array([8, 48, 107])
    c = lo + (hi - lo) * float(np.clip(t, 0.0, 1.0))
    return int(c[0]), int(c[1]), int(c[2])


def token_highlight(
    tokens: Sequence[str],
    weights: np.ndarray,
    *,
    title: str = "",
    vmax: float | None = None,
    show_specials: bool = True,
) -> str:
    """The input as HTML, each token's background coloured by its weight (attention or rollout).

    weights: (N,) one value per token. Colours run from white (0) to deep blue (``vmax``; default the
    largest weight, since a row of attention or rollout spreads over many tokens). Every token is
    HTML-escaped, so a token such as ``<img src=x onerror=...>`` is shown as text. SentencePiece ``▁``
    and WordPiece ``##`` markers are turned into spacing; hover a token to see its exact string and weight.
    """
    w = np.nan_to_num(np.asarray(weights, dtype=np.float64).reshape(-1), nan=0.0)
    if len(w) != len(tokens):
        raise ValueError(f"{len(w)} weights for {len(tokens)} tokens")
    top = float(vmax) if vmax else float(w.max()) if len(w) and w.max() > 0 else 1.0
    spans = []
    # SentencePiece marks the start of a word with ▁ (pieces without it continue the word); WordPiece marks
    # continuations with ## instead. Join the pieces the way the tokenizer split them.
    sentencepiece = any(str(t).startswith("▁") for t in tokens)
    running, parts = across_pieces(tokens)  # a character cut over pieces shown once, where it starts
    for i, (label, val) in enumerate(zip(tokens, w)):
        tok = str(label)
        if tok in SPECIAL_TOKENS and not show_specials:
            continue
        shown, space = (tok if tok in SPECIAL_TOKENS else running[i]), " "
        if tok in SPECIAL_TOKENS:
            pass
        elif tok.startswith("▁"):
            shown = shown[1:] or "\u00a0"  # a lone ▁ is the space itself
        elif tok.startswith("##"):
            shown, space = shown[2:], ""
        elif sentencepiece:
            space = ""
        t = val / top
        r, g, b = _blue(t)
        fg = "#fff" if t > 0.55 else "#111"
        style = f"background:rgb({r},{g},{b});color:{fg};padding:1px 3px;border-radius:3px;margin:1px 0"
        if tok in SPECIAL_TOKENS:
            style += ";font-family:monospace;font-size:0.85em;outline:1px dashed #999"
        part = f", {parts[i]}" if parts[i] else ""
        tip = html.escape(f"{tok}{html.unescape(raw_note(label))}{part}: {val:.4f}", quote=True)
        spans.append(f'{space}<span title="{tip}" style="{style}">{html.escape(shown, quote=False)}</span>')
    legend = (
        '<div style="margin-top:8px;font-size:0.8em;color:#555">'
        '<span style="display:inline-block;width:120px;height:10px;vertical-align:middle;'
        'background:linear-gradient(90deg,#fff,rgb(8,48,107));border:1px solid #ccc"></span>'
        f" 0 &rarr; {top:.3g} ({'fixed scale' if vmax else 'scaled to the largest weight'})</div>"
    )
    head = f'<div style="font-weight:600;margin-bottom:6px">{html.escape(title)}</div>' if title else ""
    body = "".join(spans).lstrip()
    return (f'<div class="atlas-highlight" style="font-size:1.15em;line-height:2.0;font-family:sans-serif">'
            f"{head}<div>{body}</div>{legend}</div>")


# ----------------------------------------------------------------------------------------------------
# Cross-attention alignment


def cross_alignment(
    weights: np.ndarray,
    target_tokens: Sequence[str],
    source_tokens: Sequence[str],
    *,
    layer: int | None = None,
    head: int | str = "mean",
    autoscale: bool = False,
    mark_argmax: bool = True,
    title: str | None = None,
) -> go.Figure:
    """Target × source cross-attention heatmap (rows = target tokens, the decoder's queries) with each
    target token's strongest source token marked (the soft alignment of Bahdanau et al. 2015, Fig. 3).

    weights: (T, S), (H, T, S) or (L, H, T, S); ``head`` may be an index, "mean" or "max"."""
    fig = heatmap_fig(weights, target_tokens, source_tokens, layer=layer, head=head,
                      kind="Cross-attention (target → source)", title=title, autoscale=autoscale)
    if mark_argmax:
        hm = fig.data[0]
        best = np.asarray(hm["z"]).argmax(axis=1)
        fig.add_trace(dict(
            type="scatter", x=[hm["x"][j] for j in best], y=list(hm["y"]), mode="markers",
            marker=dict(symbol="circle-open", size=10, color="#d62728", line=dict(width=2)),
            name="strongest source", hoverinfo="skip", showlegend=True,
        ))
        fig.update_layout(legend=dict(orientation="h", y=1.0, x=1.0, yanchor="bottom", xanchor="right"))
    fig.update_xaxes(title=dict(text="source (encoder) token"))
    fig.update_yaxes(title=dict(text="target (decoder) token"))
    return fig.build()


# ----------------------------------------------------------------------------------------------------
# Beam-search tree


def _field(step, name):
    return step[name] if isinstance(step, dict) else getattr(step, name)


def beam_tree(steps: Sequence, chosen: Sequence[int] = (), *, title: str = "Beam search") -> go.Figure:
    """Beam-search tree: steps left to right, one node per surviving candidate, edges to the parent.

    steps: a list of ``BeamStep``-like objects (or dicts) with ``tokens``, ``parents`` (index into the
    previous step; −1 at step 0), ``scores`` (cumulative log-probability) and ``finished``; ``chosen``:
    the index of the chosen hypothesis in each step. Nodes are coloured by cumulative log-probability;
    finished hypotheses are squares; the chosen path is drawn thick and red.
    """
    xs, ys, labels, hover, scores, symbols = [], [], [], [], [], []
    ex, ey = [], []
    n_steps = len(steps)
    chosen = list(chosen)
    for t, step in enumerate(steps):
        toks, parents = list(_field(step, "tokens")), list(_field(step, "parents"))
        sc, fin = list(_field(step, "scores")), list(_field(step, "finished"))
        for i, tok in enumerate(toks):
            xs.append(t)
            ys.append(i)
            labels.append(esc(shorten(tok, 10)))
            scores.append(float(sc[i]))
            symbols.append("square" if fin[i] else "circle")
            state = " · finished" if fin[i] else ""
            if t < len(chosen) and chosen[t] == i:
                state += " · chosen"
            hover.append(f"step {t} · {esc(tok)}<br>cumulative log-prob {sc[i]:.3f}{state}")
            p = parents[i]
            if t > 0 and p is not None and p >= 0:
                ex += [t - 1, t, None]
                ey += [p, i, None]
    traces = [dict(type="scatter", x=ex, y=ey, mode="lines", line=dict(color="#bbb", width=1.5), hoverinfo="skip",
                   name="parent link", showlegend=False)]
    if chosen:
        cx = list(range(min(len(chosen), n_steps)))
        traces.append(dict(type="scatter", x=cx, y=chosen[: len(cx)], mode="lines", name="chosen hypothesis",
                           line=dict(color="#d62728", width=4), hoverinfo="skip"))
    traces.append(dict(
        type="scatter", x=xs, y=ys, mode="markers+text", text=labels, textposition="top center", hovertext=hover,
        hoverinfo="text", textfont=dict(size=12), name="candidate", showlegend=False,
        marker=dict(size=13, symbol=symbols, color=f32(scores), colorscale=VIRIDIS,
                    colorbar=colorbar("cumulative log-prob"), line=dict(color="#333", width=1)),
    ))
    traces.append(dict(type="scatter", x=[None], y=[None], mode="markers",
                       marker=dict(symbol="square", size=11, color=HEAD_COLORS[7]),
                       name="finished (emitted </s>)".replace("<", "&lt;").replace(">", "&gt;")))
    fig = Fig(traces)
    width = int(np.clip(90 * n_steps + 250, 600, 2400))
    beam = max((len(_field(s, "tokens")) for s in steps), default=1)
    key = "colour: cumulative log-probability (yellow: more likely) · square: finished · red: the chosen translation"
    if steps and beam > len(_field(steps[0], "tokens")):
        key += "<br>a step where hypotheses finish keeps the beam full of live ones, so it holds more slots"
    wide = " · scroll sideways for the later steps →" if width > 1100 else ""  # wider than a laptop's panel
    base_layout(fig, f"{title}<br><sup>{key}{wide}</sup>", height=int(np.clip(70 * beam + 220, 380, 920)),
                width=width)
    fig.update_xaxes(title=dict(text="decoding step"), dtick=1, range=[-0.6, max(n_steps, 1) - 0.4])
    # Slot 0 on top, down to the widest step: where hypotheses finish, the search still keeps the beam full of live
    # ones, so that step holds more nodes (rows 5–7 at beam 5, used only there, often off to the right)
    fig.update_yaxes(title=dict(text="beam slot"), range=[beam - 0.5, -0.8], dtick=1)
    return fig.build()
