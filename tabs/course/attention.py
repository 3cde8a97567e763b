"""Lesson 1 · softmax(QKᵀ/√d_k)·V and why the scale."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from tabs.course.engine import (
    Lesson,
    Question,
    attention_steps,
    mark,
    offer,
    seed_of,
)
from viz.common import TEMPLATE


def _scores_bars(scores: np.ndarray, keys: list[str]) -> go.Figure:
    """Query t0's scaled scores as signed bars on their own axis: scores are not weights (they may be negative and
    do not sum to 1), so they get no attention-weight colour bar."""
    fig = go.Figure(go.Bar(x=keys, y=np.asarray(scores, dtype=float), marker_color=["#d62728" if v < 0 else "#1f77b4"
                                                                                    for v in scores],
                           hovertemplate="key %{x}: score %{y:.3f}<extra></extra>"))
    fig.update_layout(title="Query t0's scores QKᵀ/√d_k (before the softmax; negative ones in red)", height=340,
                      template=TEMPLATE, margin=dict(t=70))
    fig.update_xaxes(title="key", type="category")
    fig.update_yaxes(title="scaled score QKᵀ/√d_k", zeroline=True, zerolinecolor="#444")
    return fig


def l1_argmax(inp: str) -> Question:
    from viz import playground as pg

    s = attention_steps(seed_of(inp))
    keys = [f"t{j}" for j in range(6)]
    best = int(np.argmax(s.weights[0]))
    before = _scores_bars(s.scaled[0], keys)
    order = [keys[j] for j in np.argsort(-s.scaled[0])]
    return Question(
        "Query t0 has been compared with every key: its scaled scores are drawn below. **After the softmax, which "
        "key gets the largest weight?**", offer([order[0], order[-1], order[1], order[2]], keys[best]),
        keys[best], f"key {keys[best]} gets {s.weights[0, best]:.2f} of query t0's weight (score "
        f"{s.scaled[0, best]:.2f})",
        "Softmax is monotonic: it rescales the scores into weights that sum to 1 but never changes their order. The "
        "largest score always wins the largest weight, however small the gap.",
        lambda p: mark(pg.playground_figure(s), p, note="row t0 of step 4"), before)


def l1_sum(inp: str) -> Question:
    from viz import playground as pg

    s = attention_steps(seed_of(inp))
    total = float(s.weights[0].sum())
    choices = ["1", "6, one per key", "√8 ≈ 2.83", "the largest score"]
    answer = "1" if abs(total - 1) < 1e-6 else choices[1]
    return Question("**Add up query t0's six attention weights. What do they sum to?**", choices, answer,
                    f"query t0's weights sum to {total:.6f}",
                    "Softmax divides each exponentiated score by their total, so every row of weights is a probability "
                    "distribution. The output row is therefore a weighted *mean* of the value rows, never a sum.",
                    lambda p: mark(pg.playground_figure(s), p, note="step 4, row t0"))


def l1_scale(inp: str) -> Question:
    from viz import playground as pg

    curves = pg.entropy_vs_dk(seq_len=16, seed=seed_of(inp))
    i = int(np.flatnonzero(curves["d_k"] == 128)[0])
    scaled, unscaled = float(curves["scaled"][i]), float(curves["unscaled"][i])
    choices = ["sharper (lower entropy)", "flatter (higher entropy)", "no change"]
    answer = choices[0] if unscaled < scaled - 0.05 else choices[1] if unscaled > scaled + 0.05 else choices[2]
    return Question(
        "Random queries and keys of width d_k = 128 over 16 keys. **Switch the 1/√d_k scale off: does the softmax "
        "get sharper, flatter, or stay the same?**", choices, answer,
        f"mean entropy at d_k = 128: {scaled:.2f} nats with the scale, {unscaled:.2f} without "
        f"(uniform: {np.log(16):.2f})",
        "q·k of random vectors has variance d_k, so without the scale the scores grow like √d_k and the softmax "
        "piles onto one key. Its gradient vanishes there, which is why Transformers divide by √d_k.",
        lambda p: mark(pg.entropy_figure(curves, current_dk=128), p))


LESSON = Lesson(
    "1 · softmax(QKᵀ/√d_k)·V and why the scale", "Attention in one formula: scores, scale, softmax, mean of "
           "values.", "seed (random Q, K, V)", "0", (l1_argmax, l1_sum, l1_scale))
