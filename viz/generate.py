"""Figures of a decoder-only language model: the generated text coloured by surprisal, the next-token
candidates of each step, the logit lens, a head ablation's effect on the next token, and the per-token
loss on repeated random tokens (in-context learning)."""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from viz.common import (
    ATTENTION_SCALE,
    SPECIAL_TOKENS,
    Fig,
    across_pieces,
    base_layout,
    colorbar,
    esc,
    f32,
    raw_note,
    shorten,
)

# White → orange: dark text stays readable on every cell (the lens writes each layer's guess in its cell).
LENS_SCALE = [[0.0, "#ffffff"], [0.3, "#fdd0a2"], [0.7, "#fd8d3c"], [1.0, "#e6550d"]]


def shown_token(token: str) -> str:
    """A token label as running text: its ▁ marks (SentencePiece's, and a byte-level label's, which the tokenizer
    decodes: models.inputs.tokenizer.readable_piece) are spaces; a newline stays the label's ↵."""
    t = str(token)
    if t in SPECIAL_TOKENS:
        return t
    return t.replace("▁", " ")


def cell_token(token: str) -> str:
    """A candidate as a heatmap cell shows it: as running text (``shown_token``), but a token that is only white
    space keeps its marks (▁ a space, ↵ a newline, ⇥ a tab; issue 75, item 7: such candidates were blank cells)."""
    t = shown_token(token)
    if t.strip():
        return t
    return str(token).replace(" ", "▁").replace("\n", "↵").replace("\t", "⇥") or "∅"


def generation_highlight(tokens: Sequence[str], surprisal: np.ndarray, prompt_len: int, *,
                         upto: int | None = None, title: str = "") -> str:
    """The prompt and the continuation as HTML, each token's background coloured by its surprisal
    (−log₂ p under the model, white = expected, dark red = surprising; first token uncoloured), the
    generated part underlined and tokens after ``upto`` faded (the step being replayed). Escaped."""
    s = np.nan_to_num(np.asarray(surprisal, dtype=np.float64), nan=0.0)
    if len(s) != len(tokens):
        raise ValueError(f"{len(s)} surprisal values for {len(tokens)} tokens")
    top = max(float(s.max()) if len(s) else 0.0, 1.0)
    upto = len(tokens) if upto is None else int(upto)
    spans = []
    running, parts = across_pieces(tokens)  # a character cut over pieces shown once, where it starts
    for i, (tok, val) in enumerate(zip(tokens, s)):
        t = val / top
        r, g, b = int(255 - 75 * t), int(255 - 230 * t), int(255 - 225 * t)  # white → dark red
        fg = "#fff" if t > 0.6 else "#111"
        # pre-wrap: a token keeps its spaces, and the text still wraps at them (pre never wrapped: one long line)
        style = f"background:rgb({r},{g},{b});color:{fg};padding:1px 2px;border-radius:3px;white-space:pre-wrap"
        if i >= prompt_len:
            style += ";border-bottom:3px solid #3182bd"
        if i >= upto:
            style += ";opacity:0.3"
        if str(tok) in SPECIAL_TOKENS:
            style += ";font-family:monospace;font-size:0.85em;outline:1px dashed #999"
        part = f", {parts[i]}" if parts[i] else ""
        tip = html.escape(f"{i} · {tok}{html.unescape(raw_note(tok))}{part}: {val:.2f} bits"
                          + (" (generated)" if i >= prompt_len else ""), quote=True)
        text = tok if str(tok) in SPECIAL_TOKENS else running[i]
        spans.append(f'<span title="{tip}" style="{style}">{html.escape(shown_token(text), quote=False)}</span>')
    legend = ('<div style="margin-top:8px;font-size:0.8em;color:#555">surprisal: white 0 bits &rarr; dark red '
              f'{top:.1f} bits · <span style="border-bottom:3px solid #3182bd">underlined</span> = generated</div>')
    head = f'<div style="font-weight:600;margin-bottom:6px">{html.escape(title)}</div>' if title else ""
    return (f'<div class="atlas-generation" style="font-size:1.1em;line-height:2.1;font-family:sans-serif;'
            f'overflow-wrap:anywhere">'
            f'{head}<div>{"".join(spans)}</div>{legend}</div>')


COLUMN_PX = 1216  # px: a full-width column of the app on a 1,400 px screen


def step_candidates(candidates: Sequence[Sequence[str]], probs: np.ndarray, chosen: Sequence[str], *,
                    step: int | None = None, title: str = "Next-token candidates of each step") -> go.Figure:
    """One column per generated token: its top-5 candidates (top row most likely) coloured by probability,
    the chosen one outlined; ``step`` is highlighted. probs: (steps, 5)."""
    p = np.asarray(probs, dtype=np.float32).reshape(len(candidates), -1)
    n, k = p.shape
    # 52 px a step up to a 1,216 px column (a 1,400 px screen); more steps take the column's width (a width of their
    # own scrolled sideways: 20 steps were 1,260 px), their words shorter and smaller, none under 24 px a step
    fits = 52 * n + 220 <= COLUMN_PX
    cell = 52.0 if fits else (COLUMN_PX - 220) / n
    chars, size = (8, 11) if cell >= 52 else (max(3, int(cell / 6)), 9)
    text = [[esc(shorten(cell_token(candidates[s][r]), chars)) if cell >= 24 else "" for s in range(n)]
            for r in range(k)]
    full = [[esc(candidates[s][r]) + raw_note(candidates[s][r]) for s in range(n)] for r in range(k)]
    fig = Fig(dict(
        type="heatmap", z=f32(p.T), x=list(range(1, n + 1)), y=list(range(1, k + 1)), zmin=0, zmax=1,
        colorscale=ATTENTION_SCALE, colorbar=colorbar("probability"), text=text, texttemplate="%{text}",
        textfont=dict(size=size), xgap=1, ygap=1, customdata=full,
        hovertemplate="step %{x} · rank %{y}<br>%{customdata}: %{z:.3f}<extra></extra>",
    ))
    for s in range(n):
        if chosen[s] in candidates[s][:k]:
            r = list(candidates[s][:k]).index(chosen[s])
            fig.add_shape(type="rect", x0=s + 0.5, x1=s + 1.5, y0=r + 0.5, y1=r + 1.5,
                          line=dict(color="#d62728", width=2))
    if step is not None and 1 <= step <= n:
        fig.add_shape(type="rect", x0=step - 0.5, x1=step + 0.5, y0=0.5, y1=k + 0.5,
                      line=dict(color="#111", width=2, dash="dot"))
    base_layout(fig, f"{title}<br><sup>red outline: the token taken · dotted: the step shown</sup>", height=340,
                width=max(600, 52 * n + 220) if fits else None)
    fig.update_xaxes(title=dict(text="generated token"), dtick=1 if n <= 32 else 4)
    fig.update_yaxes(title=dict(text="rank"), autorange="reversed", ticks="", dtick=1)
    fig.update_layout(margin=dict(t=90))
    return fig.build()


def logit_lens(top_tokens: Sequence[Sequence[str]], target_probs: np.ndarray, tokens: Sequence[str],
               targets: Sequence[str], *, title: str = "Logit lens") -> go.Figure:
    """Layer × position: the colour is the probability each block's residual stream already gives the token
    that comes next, the text its own top guess (nostalgebraist 2020)."""
    p = np.asarray(target_probs, dtype=np.float32)
    L, T = p.shape
    labels = [f"{i} · {esc(shorten(shown_token(t), 10))}" for i, t in enumerate(tokens)]
    text = [[esc(shorten(shown_token(top_tokens[layer][i]), 8)) for i in range(T)] for layer in range(L)]
    nxt = [esc(shown_token(t)) for t in targets]
    trace = dict(
        type="heatmap", z=f32(p), x=labels, y=[f"after block {i}" for i in range(L)], zmin=0, zmax=1,
        colorscale=LENS_SCALE, colorbar=colorbar("p(next token)"), text=text, textfont=dict(size=10),
        customdata=[nxt] * L,
        hovertemplate="%{y} · position %{x}<br>top guess %{text}<br>p(%{customdata}) = %{z:.3f}<extra></extra>",
    )
    if T <= 48:  # beyond that the cells are too narrow for words: the guesses stay in the hover text
        trace["texttemplate"] = "%{text}"
    fig = Fig(trace)
    base_layout(fig, f"{title}<br><sup>colour: probability of the token that comes next · text: the layer's "
                     "top guess</sup>", height=int(np.clip(48 * L + 240, 320, 900)),
                width=int(np.clip(34 * T + 260, 600, 4000)))
    fig.update_xaxes(tickangle=-60, tickfont=dict(size=10 if T <= 64 else 8))
    fig.update_layout(margin=dict(t=90))
    return fig.build()


def distribution_change(tokens: Sequence[str], before: np.ndarray, after: np.ndarray, *,
                        title: str = "Next-token distribution with and without the head") -> go.Figure:
    """Grouped horizontal bars: the probabilities of a few next tokens before and after an ablation."""
    b, a = np.asarray(before, dtype=np.float32), np.asarray(after, dtype=np.float32)
    names = [esc(shorten(shown_token(t), 16)) + f" ({i})" for i, t in enumerate(tokens)]
    fig = Fig([
        dict(type="bar", orientation="h", y=names, x=f32(b), name="full model", marker=dict(color="#3182bd"),
             hovertemplate="%{y}: %{x:.3f}<extra>full model</extra>"),
        dict(type="bar", orientation="h", y=names, x=f32(a), name="head switched off", marker=dict(color="#d62728"),
             hovertemplate="%{y}: %{x:.3f}<extra>head off</extra>"),
    ])
    base_layout(fig, title, height=int(120 + 44 * len(tokens) + 60))
    fig.update_xaxes(range=[0, 1.02], tickformat=".0%", title=dict(text="probability"))
    fig.update_yaxes(autorange="reversed", ticks="")
    fig.update_layout(barmode="group", legend=dict(orientation="h", y=-0.2))
    return fig.build()


def copy_losses(first: np.ndarray, second: np.ndarray, *, title: str = "Loss on each copy") -> go.Figure:
    """Per-token loss (nats) along the first and the second copy of a repeated random sequence: a model
    with induction heads predicts the second copy from the first (Olsson et al. 2022, in-context learning)."""
    f, s = np.asarray(first, dtype=np.float32), np.asarray(second, dtype=np.float32)
    fig = Fig([
        dict(type="scatter", mode="lines+markers", x=list(range(1, len(f) + 1)), y=f32(f), name="first copy",
             marker=dict(size=5, color="#7f7f7f"), hovertemplate="token %{x}: %{y:.2f} nats<extra>first</extra>"),
        dict(type="scatter", mode="lines+markers", x=list(range(1, len(s) + 1)), y=f32(s), name="second copy",
             marker=dict(size=5, color="#d62728"), hovertemplate="token %{x}: %{y:.2f} nats<extra>second</extra>"),
    ])
    sub = f"mean {f.mean():.2f} nats on the first copy, {s.mean():.2f} on the second" if len(f) and len(s) else ""
    base_layout(fig, f"{title}<br><sup>{sub}</sup>", height=380)
    fig.update_xaxes(title=dict(text="position in the copy"))
    fig.update_yaxes(title=dict(text="loss (nats)"), rangemode="tozero", showgrid=True, gridcolor="#eee")
    fig.update_layout(margin=dict(t=90))
    return fig.build()


def expert_routes(experts: np.ndarray, weights: np.ndarray, tokens: Sequence[str], *,
                  title: str = "Experts chosen per token") -> go.Figure:
    """Layer × token for a mixture-of-experts model: the text names the experts the router chose (most weighted
    first) with their weights, the colour is the first one's weight (1/k: spread evenly; 1: one expert does it all).
    experts, weights: (L, T, k)."""
    e, w = np.asarray(experts), np.asarray(weights, dtype=np.float32)
    L, T, _ = e.shape
    labels = [f"{i} · {esc(shorten(shown_token(t), 10))}" for i, t in enumerate(tokens)]
    text = [["<br>".join(f"E{int(e[l, t, j])} {w[l, t, j]:.2f}" for j in range(e.shape[2])) for t in range(T)]
            for l in range(L)]
    trace = dict(
        type="heatmap", z=f32(w[..., 0]), x=labels, y=[f"layer {i}" for i in range(L)], zmin=0, zmax=1,
        colorscale=LENS_SCALE, colorbar=colorbar("weight of the first expert"), text=text, textfont=dict(size=9),
        hovertemplate="%{y} · token %{x}<br>%{text}<extra></extra>",
    )
    if T <= 40:
        trace["texttemplate"] = "%{text}"
    fig = Fig(trace)
    base_layout(fig, f"{title}<br><sup>text: the experts the router chose and their weights · colour: the first "
                     "one's weight</sup>", height=int(np.clip(56 * L + 240, 320, 1000)),
                width=int(np.clip(48 * T + 260, 600, 4000)))
    fig.update_xaxes(tickangle=-60, tickfont=dict(size=10 if T <= 64 else 8))
    fig.update_layout(margin=dict(t=90))
    return fig.build()
