"""Lesson 8 · Attention is not explanation."""

from __future__ import annotations

import functools

import numpy as np
import plotly.graph_objects as go

from examples import sentences
from tabs.common import get_model
from tabs.course.engine import (
    Lesson,
    Question,
    label,
    mark,
)
from viz.common import TEMPLATE, esc


def _explained(text: str):
    return _explain(get_model("sst2"), text)


@functools.lru_cache(maxsize=16)
def _explain(net, text: str):
    from models.inspect.attribution import deletion_curves, explain

    att = explain(net, text, "attention")
    ig = explain(net, text, "integrated_gradients")
    curves, random = deletion_curves(net, text, [att, ig])
    return att, ig, curves, random


def _most_disagreeing() -> str:
    """The lesson's example: of the project's example sentences whose attention and integrated-gradients top tokens
    differ (all of them when none do), the one whose two deletion areas differ most, so that the deletion test gives
    the clearest verdict between the two rankings (a sentence whose answer survives every deletion would show two
    flat lines and teach nothing)."""
    def split(text: str) -> tuple[bool, float]:
        att, ig, curves, _ = _explained(text)
        return _top(att) != _top(ig), abs(curves[0].auc - curves[1].auc)

    scored = {text: split(text) for text in sentences.SENTIMENT}
    pool = [t for t, (differ, _) in scored.items() if differ] or list(scored)
    return max(pool, key=lambda t: scored[t][1])


def _l8_text(inp: str) -> str:
    return (inp or "").strip()[:2000] or _most_disagreeing()


def _both(att, ig) -> go.Figure:
    from viz import why as vw

    return vw.change_bars(ig.tokens, att.values, ig.values, names=("attention", "integrated gradients"),
                          title="Attention and integrated gradients per token", unit="score")


def _ig_bars(ig) -> go.Figure:
    """Integrated gradients per token alone, labelled as the choices are (attention's ranking is step 3's
    question, so it is not drawn here)."""
    shown = [j for j in range(len(ig.tokens)) if not ig.special[j]]
    values = np.asarray(ig.values, dtype=float)[shown]
    fig = go.Figure(go.Bar(x=[esc(label(ig.tokens, j)) for j in shown], y=values,
                           marker_color=["#d62728" if v < 0 else "#1f77b4" for v in values],
                           hovertemplate="%{x}: %{y:.3f}<extra>integrated gradients</extra>"))
    fig.update_layout(title=f"Integrated gradients per token (for {esc(ig.label)}; negative: against it)",
                      height=380, template=TEMPLATE, margin=dict(t=70, b=120))
    fig.update_xaxes(type="category", tickangle=-45)
    fig.update_yaxes(title="integrated gradients", zeroline=True, zerolinecolor="#444")
    return fig


def _top(attr) -> int:
    v = np.where(attr.special, -np.inf, attr.values)
    return int(np.argmax(v))


def evidence_share(ig) -> tuple[float, int]:
    """(the top token's share of the positive evidence, its index): integrated gradients' largest value over the sum
    of the positive values of the sentence's tokens (special tokens left out); 0 when nothing is positive."""
    v = np.where(ig.special, 0.0, np.asarray(ig.values, dtype=np.float64))
    positive = v[v > 0].sum()
    best = _top(ig)
    return (float(v[best] / positive) if positive > 0 else 0.0), best


def l8_ig_top(inp: str) -> Question:
    text = _l8_text(inp)
    att, ig, *_ = _explained(text)
    share, best = evidence_share(ig)
    choices = ["more than half", "between a third and a half", "less than a third"]
    answer = choices[0] if share > 0.5 else choices[1] if share >= 1 / 3 else choices[2]
    total = float(np.where(ig.special, 0, np.clip(ig.values, 0, None)).sum())
    n = int((~np.asarray(ig.special)).sum())
    return Question(f"The sentiment classifier reads *{esc(text)}* ({n} tokens) and answers **{ig.label}** "
                    f"({ig.prob:.0%}). Integrated gradients splits the evidence for that answer among the tokens (some "
                    "push for it, some against). **How much of the evidence *for* the answer does the single "
                    "strongest token carry?**", choices, answer,
                    f"integrated gradients gives {label(ig.tokens, best)} {share:.0%} of the positive evidence "
                    f"({ig.values[best]:+.2f} of {total:.2f})",
                    "Integrated gradients adds up how the answer's logit changes along a path from a blank input to "
                    "this one, token by token, so the shares are shares of one total. A short sentence often rests on "
                    "one word; a longer one spreads its evidence (step 3 sets attention beside it).",
                    lambda p: mark(_ig_bars(ig), p))


def l8_deletion(inp: str) -> Question:
    from viz import attribution as vattr

    text = _l8_text(inp)
    att, ig, curves, random = _explained(text)
    areas = {"attention": curves[0].auc, "integrated gradients": curves[1].auc, "a random order": curves[0].random_auc}
    answer = min(areas, key=areas.get)
    return Question("Delete the tokens one ranking puts first, one by one, and watch the answer's probability. **Whose "
                    "ranking makes it fall fastest?**", list(areas), answer,
                    "area under each curve (lower = faster): " + ", ".join(f"{k} {v:.2f}" for k, v in areas.items()),
                    "A faithful explanation ranks first the tokens the answer depends on, so deleting them hurts "
                    "most. Attention often loses to gradient methods here (Jain & Wallace 2019).",
                    lambda p: mark(vattr.deletion_curves(
                        [(name, c.fractions, c.probs)
                         for name, c in zip(("attention", "integrated gradients"), curves, strict=True)],
                        (curves[0].fractions, random), label=curves[0].label), p))


def l8_agree(inp: str) -> Question:

    text = _l8_text(inp)
    att, ig, *_ = _explained(text)
    choices = ["yes, the same token", "no, different tokens", "neither ranks any token"]
    answer = choices[2] if att.special.all() else choices[0] if _top(att) == _top(ig) else choices[1]
    return Question("**Does attention's top token match integrated gradients' top token on this sentence?**", choices,
                    answer, f"attention: {label(att.tokens, _top(att))}; integrated gradients: "
                    f"{label(ig.tokens, _top(ig))}",
                    "Where they disagree, the deletion curve says which to believe. Attention is a useful picture of "
                    "the computation, not a measurement of what the answer depends on.",
                    lambda p: mark(_both(att, ig), p))


LESSON = Lesson(
    "8 · Attention is not explanation", "Attention against integrated gradients, judged by deleting words.",
           "sentence (empty: the example where they disagree most)", "", (l8_ig_top, l8_deletion, l8_agree))
