"""The attention playground: softmax(QKᵀ/√d_k + mask)·V step by step, in numpy, and its figures.

The formula is Vaswani et al. 2017, eq. 1. The computation lives here (numpy only, no torch) so the
playground answers instantly and works in a notebook; tests check it against the model package's
``scaled_dot_product``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from viz.common import Fig, base_layout, named_scale

MASKS = ("none", "causal", "padding")
MAX_LEN = 16  # tokens in the playground
MAX_DK = 128  # width of Q and K




_RDBU_R, _PUOR_R, _BLUES = named_scale("RdBu_r"), named_scale("PuOr_r"), named_scale("Blues")


@dataclass(frozen=True)
class PlaygroundSteps:
    q: np.ndarray  # (T, d_k)
    k: np.ndarray  # (T, d_k)
    v: np.ndarray  # (T, d_v)
    scores: np.ndarray  # (T, T) QKᵀ
    scaled: np.ndarray  # (T, T) QKᵀ/√d_k (or QKᵀ when the scale is off)
    masked: np.ndarray  # (T, T) with -inf where the mask forbids
    weights: np.ndarray  # (T, T) softmax, rows sum to 1
    out: np.ndarray  # (T, d_v) weights · V
    allowed: np.ndarray  # (T, T) bool, True = may attend
    scale: float  # the factor applied to QKᵀ
    entropy: np.ndarray  # (T,) softmax entropy per query, in nats


def build_mask(kind: str, seq_len: int, pad: int = 0) -> np.ndarray:
    """Boolean (T, T) mask, True = may attend. "padding" hides the last `pad` keys (default: a quarter)."""
    if kind not in MASKS:
        raise ValueError(f"mask must be one of {', '.join(MASKS)}, not {kind!r}")
    allowed = np.ones((seq_len, seq_len), dtype=bool)
    if kind == "causal":
        allowed = np.tril(allowed)  # query i sees keys 0..i (a decoder's self-attention)
    elif kind == "padding":
        pad = pad or max(1, seq_len // 4)
        pad = min(pad, seq_len - 1)  # keep at least one real key
        allowed[:, seq_len - pad:] = False
    return allowed


def _softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    return e / np.sum(e, axis=-1, keepdims=True)


def _entropy(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.sum(np.where(p > 0, p * np.log(p), 0.0), axis=-1)


def compute_steps(seq_len: int = 6, d_k: int = 8, seed: int = 0, mask: str = "none",
                  scale: bool = True, d_v: int | None = None) -> PlaygroundSteps:
    """Draw Q, K, V ~ N(0, 1) with a fixed seed and run every step of scaled dot-product attention."""
    seq_len, d_k = int(seq_len), int(d_k)
    if not 1 <= seq_len <= MAX_LEN:
        raise ValueError(f"sequence length must be between 1 and {MAX_LEN}")
    if not 1 <= d_k <= MAX_DK:
        raise ValueError(f"d_k must be between 1 and {MAX_DK}")
    d_v = min(d_k, 8) if d_v is None else int(d_v)
    rng = np.random.default_rng(int(seed))
    q = rng.standard_normal((seq_len, d_k))
    k = rng.standard_normal((seq_len, d_k))
    v = rng.standard_normal((seq_len, d_v))
    factor = 1.0 / np.sqrt(d_k) if scale else 1.0
    scores = q @ k.T
    scaled = scores * factor
    allowed = build_mask(mask, seq_len)
    masked = np.where(allowed, scaled, -np.inf)
    weights = _softmax(masked)
    return PlaygroundSteps(q=q, k=k, v=v, scores=scores, scaled=scaled, masked=masked, weights=weights,
                           out=weights @ v, allowed=allowed, scale=factor, entropy=_entropy(weights))


def entropy_vs_dk(seq_len: int = 16, dks: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
                  trials: int = 256, seed: int = 0) -> dict[str, np.ndarray]:
    """Mean softmax entropy of one query over `seq_len` random keys, with and without the 1/√d_k scale.

    With q, k ~ N(0, I) the dot product q·k has variance d_k (Vaswani et al. 2017, footnote 4), so without
    the scale the logits grow like √d_k, the softmax saturates towards one key and its entropy (and its
    gradient) collapses; with the scale the logits keep unit variance and the entropy stays put.
    """
    rng = np.random.default_rng(seed)
    scaled, unscaled = [], []
    for d in dks:
        q = rng.standard_normal((trials, 1, d))
        k = rng.standard_normal((trials, seq_len, d))
        logits = (q @ k.transpose(0, 2, 1))[:, 0, :]  # (trials, seq_len)
        unscaled.append(_entropy(_softmax(logits)).mean())
        scaled.append(_entropy(_softmax(logits / np.sqrt(d))).mean())
    return {"d_k": np.asarray(dks), "scaled": np.asarray(scaled), "unscaled": np.asarray(unscaled),
            "max": np.full(len(dks), np.log(seq_len))}


def _labels(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def playground_figure(steps: PlaygroundSteps) -> go.Figure:
    """Every step of the formula as aligned heatmaps: inputs on the top row, the T×T steps below."""
    T, d_k = steps.q.shape
    d_v = steps.v.shape[1]
    scale_txt = f"÷ √{d_k} (×{steps.scale:.3g})" if steps.scale != 1.0 else "scale off (×1)"
    # two lines where a title is wider than a quarter of a laptop-wide figure, so neighbours never overlap
    titles = ["Q (queries × d_k)", "K (keys × d_k)", "V (keys × d_v)", "output = weights · V",
              "1 · scores = QKᵀ", f"2 · scaled: QKᵀ<br>{scale_txt}", "3 · masked<br>(blank = −∞)",
              "4 · weights<br>= softmax(row)"]
    fig = Fig(rows=2, cols=4, subplot_titles=titles, horizontal_spacing=0.07, vertical_spacing=0.16)
    tok, dim_k, dim_v = _labels("t", T), _labels("d", d_k), _labels("d", d_v)

    def add(z, row, col, x, y, colorscale, zmid=None, zmin=None, zmax=None, bar=None, fmt=".2f"):
        z = np.asarray(z, dtype=float)
        zs = np.where(np.isfinite(z), np.round(z, 3), np.nan)
        trace = dict(
            type="heatmap", z=zs, x=x, y=y, colorscale=colorscale,
            hovertemplate="row %{y}, col %{x}: %{z:.3f}<extra></extra>", showscale=bar is not None,
            xgap=1, ygap=1,
        )
        trace.update({k: v for k, v in dict(zmid=zmid, zmin=zmin, zmax=zmax).items() if v is not None})
        if bar is not None:
            trace["colorbar"] = bar
        if z.shape[0] <= 8 and z.shape[1] <= (4 if row == 1 else 8):  # numbers only where cells can hold them
            trace["texttemplate"] = "%{z:" + fmt + "}"
            trace["textfont"] = {"size": 10}
        fig.add_trace(trace, row=row, col=col)
        fig.update_yaxes(autorange="reversed", row=row, col=col)

    raw = max(1e-9, float(np.nanmax(np.abs(np.concatenate([steps.q.ravel(), steps.k.ravel(), steps.v.ravel()])))))
    add(steps.q, 1, 1, dim_k, tok, _RDBU_R, zmid=0, zmin=-raw, zmax=raw)
    add(steps.k, 1, 2, dim_k, tok, _RDBU_R, zmid=0, zmin=-raw, zmax=raw)
    add(steps.v, 1, 3, dim_v, tok, _RDBU_R, zmid=0, zmin=-raw, zmax=raw)
    add(steps.out, 1, 4, dim_v, tok, _RDBU_R, zmid=0, zmin=-raw, zmax=raw,
        bar={"title": {"text": "value", "side": "right"}, "len": 0.4, "y": 0.8, "x": 1.0})
    big = max(1e-9, float(np.nanmax(np.abs(steps.scores))))
    add(steps.scores, 2, 1, tok, tok, _PUOR_R, zmid=0, zmin=-big, zmax=big, fmt=".1f")
    add(steps.scaled, 2, 2, tok, tok, _PUOR_R, zmid=0, zmin=-big, zmax=big, fmt=".1f",
        bar={"title": {"text": "score (steps 1–3)", "side": "top"}, "orientation": "h", "len": 0.36,
             "x": 0.37, "y": -0.3, "thickness": 12})  # below the key axis titles
    add(steps.masked, 2, 3, tok, tok, _PUOR_R, zmid=0, zmin=-big, zmax=big, fmt=".1f")
    add(steps.weights, 2, 4, tok, tok, _BLUES, zmin=0, zmax=1,
        bar={"title": {"text": "attention weight", "side": "right"}, "len": 0.4, "y": 0.2, "x": 1.0})
    for col in range(1, 5):
        fig.update_xaxes(title_text="key" if col > 1 else "key", row=2, col=col)
    fig.update_yaxes(title_text="query", row=2, col=1)
    fig.update_yaxes(title_text="token", row=1, col=1)
    base_layout(fig, f"softmax(QKᵀ/√d_k)·V with {T} tokens, d_k = {d_k}: "
                f"mean softmax entropy {steps.entropy.mean():.2f} nats (max {np.log(T):.2f})", height=720)
    fig.update_layout(margin={"l": 60, "r": 40, "t": 70, "b": 150}, font={"size": 13})
    for ann in fig.layout["annotations"]:  # the subplot titles
        ann["font"]["size"] = 13
    return fig.build()


def entropy_figure(curves: dict[str, np.ndarray], current_dk: int | None = None) -> go.Figure:
    """Softmax entropy against d_k, with and without the 1/√d_k scale (log-scaled x axis)."""
    fig = Fig()
    d = curves["d_k"]
    fig.add_trace(dict(type="scatter", x=d, y=np.round(curves["scaled"], 4), mode="lines+markers",
                       name="scaled: QKᵀ/√d_k", line={"color": "#1f77b4", "width": 3}))
    fig.add_trace(dict(type="scatter", x=d, y=np.round(curves["unscaled"], 4), mode="lines+markers",
                       name="unscaled: QKᵀ", line={"color": "#d62728", "width": 3}))
    fig.add_trace(dict(type="scatter", x=d, y=np.round(curves["max"], 4), mode="lines", name="uniform (log T)",
                       line={"color": "grey", "dash": "dot"}))
    if current_dk:
        # On a log axis a shape takes the data value, an annotation its log10 (plotly.js 3; a browser test reads
        # both positions back). The label sits at the line's top, to its left.
        fig.add_vline(x=float(current_dk), line={"color": "black", "dash": "dash", "width": 1})
        fig.add_annotation(text=f"d_k = {current_dk}", x=float(np.log10(current_dk)), xref="x", y=0, yref="y domain",
                           xanchor="right", yanchor="bottom", showarrow=False)  # the curves' empty corner
    base_layout(fig, "Why divide by √d_k: softmax entropy vs d_k (random q, k)", height=400)
    grid = {"showgrid": True, "gridcolor": "#eee"}
    fig.update_layout(  # the legend below the axis title, never over it
        margin={"l": 60, "r": 20, "t": 60, "b": 100}, font={"size": 13}, legend={"orientation": "h", "y": -0.4},
        xaxis={"type": "log", "title": {"text": "d_k (log scale)"}, **grid},
        yaxis={"title": {"text": "entropy (nats)"}, "rangemode": "tozero", **grid},
    )
    return fig.build()
