"""Lessons: predict, then reveal. Eight short lessons over the real models and the existing figures; every
question makes the student commit to a prediction before the figure appears, and every verdict is computed from
the model's numbers on the lesson's current input (change the input and the answer follows).

A lesson is a title, an intro, an input (a seed, a sentence or an example image) and 3–6 steps; a step is a
function of that input returning a `Question`: the text, 3–4 choices, the one the numbers make correct, and the
figure to reveal with the prediction marked on it. Progress (each step's first answer) is kept in the browser
(`gr.BrowserState`); a lesson exports as one self-contained HTML page. `/lesson` and `/lesson_answer` serve the
same steps to the API, so the lessons are testable end to end."""

from __future__ import annotations

import dataclasses
import functools
import html
import random
import re
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr
import numpy as np
import plotly.graph_objects as go

from examples import sentences
from tabs.common import DOWNLOADS, EXAMPLE_IMAGES, Error, get_model, read_seed
from tabs.permalink import Permalink, chain
from viz import attention as va
from viz.common import TEMPLATE, esc

TITLE = "Lessons"
INTRO = """**Predict, then reveal.** Each lesson walks through one idea in a few steps over the app's real models.
Every question asks you to commit to a guess first; only then does the figure appear, with your guess marked, a
verdict computed from the model's actual numbers on this input, and a short explanation. Change the lesson's
input and the right answer can change with it. Your score is kept in this browser; a lesson exports as one HTML
page that works offline, for a handout."""


@dataclass(frozen=True)
class Question:
    """One step: what the student reads, what they may predict, and what the numbers say."""

    text: str  # Markdown: the context and the question
    choices: list[str]  # 3–4 predictions to pick from
    answer: str  # the one the model's numbers make correct
    fact: str  # the numbers behind the verdict, one line
    explanation: str  # two sentences: why
    reveal: Callable[[str | None], go.Figure]  # the figure, with the prediction (or None) marked on it
    before: go.Figure | None = None  # shown before predicting; never gives the answer away


@dataclass(frozen=True)
class Lesson:
    title: str
    intro: str
    input_label: str
    default: str
    steps: tuple[Callable[[str], Question], ...]


# ----------------------------------------------------------------------------------------------- helpers
def _offer(candidates: list[str], answer: str, k: int = 4) -> list[str]:
    """Up to ``k`` distinct choices, the answer always among them (their order is set by `_shuffled`)."""
    out = [c for c in dict.fromkeys(candidates) if c != answer][: k - 1]
    return [answer, *out]


def _shuffled(q: Question, number: int, step: int, inp: str) -> Question:
    """The question with its choices in an order drawn from the lesson, step and input (crc32 as the seed, so the
    same input always lists them the same way, in the page, the API and the export), so that where the right answer
    stands says nothing: a step's own list puts it first as often as not."""
    choices = list(q.choices)
    random.Random(zlib.crc32(f"{number}/{step}/{inp}".encode())).shuffle(choices)
    return dataclasses.replace(q, choices=choices)


def _mark(fig: go.Figure, prediction: str | None, x=None, y=None, *, note: str = "") -> go.Figure:
    """A copy of ``fig`` with the prediction marked: an open red square at (x, y) on the first axes when given,
    and a red line under the title."""
    fig = go.Figure(fig)
    if prediction is None:
        return fig
    if x is not None and y is not None:
        x, y = (esc(v) if isinstance(v, str) else v for v in (x, y))  # as the figures' category labels
        fig.add_trace(go.Scatter(x=[x], y=[y], mode="markers", name="your prediction", hoverinfo="skip",
                                 marker=dict(symbol="square-open", size=24, color="#d62728", line=dict(width=3))))
    said = esc(f"your prediction: {prediction}" + (f" · {note}" if note else ""))
    title = fig.layout.title.text or ""
    fig.update_layout(title=dict(text=f"{title}<br><span style='color:#d62728'>{said}</span>"),
                      margin=dict(t=max(fig.layout.margin.t or 0, 80) + 30))
    return fig


def _label(tokens: list[str], i: int) -> str:
    return f"{i} · {tokens[i]}"


def _stop(quoted: str) -> str:
    """The full stop after a quoted sentence, unless the sentence ends with its own ("… entlang.." read as a typo)."""
    return "" if quoted.rstrip().endswith((".", "!", "?", "…")) else "."


def _seed(text: str) -> int:
    return read_seed((text or "0").strip() or "0")


def _sentence(text: str, default: str) -> str:
    return (text or "").strip()[:2000] or default


@functools.lru_cache(maxsize=64)
def _losses(net, ids: tuple[int, ...]):
    return net.token_losses(list(ids))


def _lm_run(name: str, ids: tuple[int, ...]):
    """(losses, attention) of a language model on ids, kept per model object (the steps of a lesson share it)."""
    return _losses(get_model(name), ids)


# ------------------------------------------------------------------------- 1 · softmax(QKᵀ/√d_k)·V
def _steps(seed: int, mask: str = "none"):
    from viz import playground as pg

    return pg.compute_steps(seq_len=6, d_k=8, seed=seed, mask=mask, scale=True)


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

    s = _steps(_seed(inp))
    keys = [f"t{j}" for j in range(6)]
    best = int(np.argmax(s.weights[0]))
    before = _scores_bars(s.scaled[0], keys)
    order = [keys[j] for j in np.argsort(-s.scaled[0])]
    return Question(
        "Query t0 has been compared with every key: its scaled scores are drawn above. **After the softmax, which "
        "key gets the largest weight?**", _offer([order[0], order[-1], order[1], order[2]], keys[best]),
        keys[best], f"key {keys[best]} gets {s.weights[0, best]:.2f} of query t0's weight (score "
        f"{s.scaled[0, best]:.2f})",
        "Softmax is monotonic: it rescales the scores into weights that sum to 1 but never changes their order. The "
        "largest score always wins the largest weight, however small the gap.",
        lambda p: _mark(pg.playground_figure(s), p, note="row t0 of step 4"), before)


def l1_sum(inp: str) -> Question:
    from viz import playground as pg

    s = _steps(_seed(inp))
    total = float(s.weights[0].sum())
    choices = ["1", "6, one per key", "√8 ≈ 2.83", "the largest score"]
    answer = "1" if abs(total - 1) < 1e-6 else choices[1]
    return Question("**Add up query t0's six attention weights. What do they sum to?**", choices, answer,
                    f"query t0's weights sum to {total:.6f}",
                    "Softmax divides each exponentiated score by their total, so every row of weights is a probability "
                    "distribution. The output row is therefore a weighted *mean* of the value rows, never a sum.",
                    lambda p: _mark(pg.playground_figure(s), p, note="step 4, row t0"))


def l1_scale(inp: str) -> Question:
    from viz import playground as pg

    curves = pg.entropy_vs_dk(seq_len=16, seed=_seed(inp))
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
        lambda p: _mark(pg.entropy_figure(curves, current_dk=128), p))


# ------------------------------------------------------------------------------------------- 2 · masks
def l2_causal(inp: str) -> Question:
    from viz import playground as pg

    s = _steps(_seed(inp), "causal")
    seen = np.flatnonzero(s.allowed[3])
    choices = ["t0–t3", "t3–t5", "all six", "t3 only"]
    ranges = {"t0–t3": [0, 1, 2, 3], "t3–t5": [3, 4, 5], "all six": list(range(6)), "t3 only": [3]}
    answer = next(c for c, r in ranges.items() if list(seen) == r)
    return Question("A decoder uses a **causal** mask. **Which keys may query t3 attend to?**", choices, answer,
                    f"query t3 gives weight to keys {', '.join(f't{j}' for j in np.flatnonzero(s.weights[3] > 0))}",
                    "A causal mask sets every score above the diagonal to −∞ before the softmax, so a token sees only "
                    "itself and the tokens before it. That is what lets a language model be trained on all positions "
                    "at once without reading the answer.", lambda p: _mark(pg.playground_figure(s), p, note="row t3"))


def l2_padding(inp: str) -> Question:
    from viz import playground as pg

    s = _steps(_seed(inp), "padding")
    pad = ~s.allowed[0]
    share = float(s.weights[:, pad].sum(1).max())
    choices = ["none at all", "a little, less than the real keys", "as much as any real key"]
    answer = choices[0] if share == 0 else choices[1] if share < s.weights[:, ~pad].mean() else choices[2]
    return Question("The last key is **padding** (a filler that makes sentences of a batch the same length). **How "
                    "much attention does it get?**", choices, answer,
                    f"the largest weight any query gives the padding key: {share:.3g}",
                    "A padding mask removes the filler's column before the softmax, so it gets exactly zero and the "
                    "real keys share all of the weight. Without it, a sentence's answer would depend on how long the "
                    "other sentences in its batch were.", lambda p: _mark(pg.playground_figure(s), p))


def l2_model(inp: str) -> Question:
    net = get_model("gpt-tiny")
    ids, tokens = net.encode_prompt(_sentence("", sentences.TRANSLATE[0]))
    _, weights = _lm_run("gpt-tiny", tuple(ids))
    above = float(np.triu(weights, 1).max())
    choices = ["never", "only in the last layer", "often"]
    answer = choices[0] if above == 0 else choices[2]
    return Question("Now a real decoder, gpt-tiny, on one sentence. **Does any of its heads ever attend to a token "
                    "that comes later?**", choices, answer,
                    f"the largest weight above the diagonal, over {weights.shape[0]} layers × {weights.shape[1]} heads:"
                    f" {above:.3g}",
                    "The causal mask is part of every layer of a decoder, not a habit the model learns. The upper "
                    "triangle of every map is exactly empty.",
                    lambda p: _mark(va.attention_heatmap(weights, tokens, tokens, layer=weights.shape[0] - 1,
                                                         head="mean", kind="gpt-tiny · decoder self-attention"), p))


# ----------------------------------------------------------------------------------------- 3 · positions
def l3_sinusoid(inp: str) -> Question:
    from models.blocks.positional import sinusoidal_table
    from viz import positional as vp

    n = int(np.clip(_seed(inp) or 64, 8, 512))
    pe = sinusoidal_table(n, 64).numpy()
    step = np.abs(np.diff(pe, axis=0)).mean(0)
    first, last = float(step[:8].mean()), float(step[-8:].mean())
    choices = ["the first dimensions", "the last dimensions", "all at the same rate"]
    answer = choices[0] if first > 1.5 * last else choices[1] if last > 1.5 * first else choices[2]
    return Question(f"The sinusoidal encoding of {n} positions, 64 dimensions: PE(pos, 2i) = sin(pos / 10000^(2i/d)). "
                    "**Which dimensions change fastest from one position to the next?**", choices, answer,
                    f"mean change per position: {first:.3f} in the first 8 dimensions, {last:.4f} in the last 8",
                    "The wavelength grows geometrically with the dimension, from 2π to 10000·2π. Low dimensions tick "
                    "like a second hand, high ones like an hour hand, so together they tell every position apart.",
                    lambda p: _mark(vp.sinusoidal_heatmap(pe), p))


def l3_rope(inp: str) -> Question:
    from models.blocks.positional import rope_demo
    from viz import positional as vp

    _, scores = rope_demo(24, 16, 0, seed=_seed(inp))
    s = scores.numpy()
    ref = float(s[2, 5])
    pairs = ["(10, 13)", "(2, 6)", "(5, 2)", "(0, 5)"]
    close = [p for p in pairs if abs(float(s[tuple(int(v) for v in p.strip("()").split(", "))]) - ref) < 1e-4]
    answer = close[0] if close else pairs[1]
    values = ", ".join(f"{p}: {float(s[tuple(int(v) for v in p.strip('()').split(', '))]):.3f}" for p in pairs)
    return Question("RoPE rotates a query at position m and a key at position n by angles proportional to m and n. "
                    f"The same q and k at positions (2, 5) score {ref:.3f}. **Which pair of positions scores exactly "
                    "the same?**", pairs, answer, f"q·k at {values}",
                    "Rotating q by m·θ and k by n·θ leaves their dot product depending on n − m only (RoFormer §3.4). "
                    "So RoPE gives attention relative positions for free, whatever the absolute ones.",
                    lambda p: _mark(vp.rope_offset_scores(s), p))


def l3_model(inp: str) -> Question:
    from models.inspect.analysis import previous_token_score
    from models.inspect.decompose import decompose_score
    from viz import why as vw

    net = get_model("gpt-tiny")
    ids = net.repeated_tokens(20, seed=_seed(inp))
    _, weights = _lm_run("gpt-tiny", tuple(ids))
    prev = previous_token_score(weights)
    layer, head = (int(v) for v in np.unravel_index(int(np.argmax(prev)), prev.shape))
    q = len(ids) - 1
    d = decompose_score(net, ids, layer, head, q, q - 1)
    one, ten = float(d.by_offset[1]), float(d.by_offset[10])
    choices = ["one token apart", "ten tokens apart", "the same"]
    answer = choices[0] if one > ten + 1e-3 else choices[1] if ten > one + 1e-3 else choices[2]
    tokens = [net.piece(i) for i in ids]
    return Question(f"gpt-tiny's strongest previous-token head is layer {layer} head {head}. Take its query at the "
                    "last token and its key at the token before. **Would the same query and key score higher one token "
                    "apart, or ten?**", choices, answer,
                    f"score {one:.2f} one token apart, {ten:.2f} ten apart (true offset 1: {d.score:.2f})",
                    "With RoPE the same query and key score differently at different distances, and a previous-token "
                    "head has learned vectors whose score peaks at offset 1. That is position working inside the dot "
                    "product, not added to the input.",
                    lambda p: _mark(vw.score_decomposition(d.table, d.parts, d.row, d.softmax_row, tokens, q, q - 1,
                                                           title=f"Layer {layer} head {head} · last token → the one "
                                                                 "before", by_offset=d.by_offset), p))


# --------------------------------------------------------------------------------- 4 · induction heads
def _repeated(inp: str):
    from models.inspect.analysis import head_roles

    net = get_model("gpt-tiny")
    n = min(30, (net.context_limit() - 1) // 2)
    ids = net.repeated_tokens(n, seed=_seed(inp))
    loss, weights = _lm_run("gpt-tiny", tuple(ids))
    roles = head_roles(weights, n)
    return net, n, ids, loss, weights, roles["previous"], roles["induction"]


def _head_question(score: np.ndarray, text: str, fact: str, explanation: str, reveal) -> Question:
    order = [tuple(int(v) for v in np.unravel_index(int(i), score.shape)) for i in np.argsort(-score, axis=None)]
    name = [f"layer {a} head {b}" for a, b in order]
    # the best, the runner-up and two of the weakest: a real choice, not a giveaway
    choices = _offer([name[0], name[1], name[-1], name[len(name) // 2]], name[0])
    return Question(text, choices, name[0], fact.format(best=name[0], value=float(score[order[0]])),
                    explanation, reveal)


def l4_previous(inp: str) -> Question:
    from viz import stats as vs

    net, n, ids, loss, weights, prev, ind = _repeated(inp)
    roles = prev[..., None]  # the previous-token score alone: the induction score answers the next step

    def reveal(p):
        fig = vs.head_share_heatmap(roles, ["previous token"], title="Previous-token score on repeated tokens",
                                    subtitle="mean attention from each token to the one just before it",
                                    label="score")
        if p is None:
            return _mark(fig, p)
        a, b = (int(v) for v in p.replace("layer ", "").replace(" head ", ",").split(","))
        return _mark(fig, p, b, a)

    return _head_question(prev, f"BOS, then {n} random tokens, then the same {n} again, through gpt-tiny. "
                          "**Which head attends from each token to the token just before it?**",
                          "{best} puts {value:.2f} of its attention on the previous token, on average",
                          "A previous-token head copies 'what came just before me' into each position. It is the first "
                          "half of an induction circuit: a later head can then look for the token after an earlier "
                          "copy of the current one.", reveal)


def l4_induction(inp: str) -> Question:
    net, n, ids, loss, weights, prev, ind = _repeated(inp)
    tokens = [net.piece(i) for i in ids]
    best = np.unravel_index(int(np.argmax(ind)), ind.shape)

    def reveal(p):
        fig = va.attention_heatmap(weights, tokens, tokens, layer=int(best[0]), head=int(best[1]),
                                   kind=f"The strongest induction head · score {ind[best]:.2f}")
        return _mark(fig, p)

    return _head_question(ind, f"Same sequence (two copies of {n} random tokens). An *induction head* "
                          "attends from a token in the second copy to the token that followed its first occurrence. "
                          "**Which head does that?**", "{best} puts {value:.2f} of its attention there, on average",
                          "The stripe N − 1 below the diagonal is the induction head reading the first copy one step "
                          "ahead. It lets the model continue a sequence it has seen once, the simplest in-context "
                          "learning.", reveal)


def l4_loss(inp: str) -> Question:
    from viz import generate as vg

    net, n, ids, loss, weights, prev, ind = _repeated(inp)
    first, second = float(loss[:n].mean()), float(loss[n: 2 * n].mean())
    choices = ["on the first copy", "on the second copy", "about the same (within 0.1 nats)"]
    answer = choices[2] if abs(first - second) < 0.1 else choices[0] if first < second else choices[1]
    return Question("**Where is gpt-tiny's loss (its surprise at each token) lower: on the first copy of the random "
                    "tokens or on the second?**", choices, answer,
                    f"mean loss {first:.2f} nats on the first copy, {second:.2f} on the second",
                    "Random tokens cannot be predicted the first time. The second time, induction heads find the "
                    "earlier copy and predict each next token from it, so the loss drops.",
                    lambda p: _mark(vg.copy_losses(loss[:n], loss[n: 2 * n]), p))


# ------------------------------------------------------------------------------------- 5 · attention sinks
def _sink_setup(inp: str):
    net = get_model("gpt-tiny")
    ids, tokens = net.encode_prompt(_sentence(inp, sentences.TRANSLATE[0]))
    ids, tokens = ids[: net.context_limit()], tokens[: net.context_limit()]
    _, weights = _lm_run("gpt-tiny", tuple(ids))
    share = weights[:, :, 1:, 0].mean(-1)  # (L, H): attention on the first token, queries after it
    layer, head = (int(v) for v in np.unravel_index(int(np.argmax(share)), share.shape))
    return net, ids, tokens, weights, share, layer, head


def l5_target(inp: str) -> Question:
    net, ids, tokens, weights, *_ = _sink_setup(inp)
    last = weights[-1].mean(0)[-1]
    best = int(np.argmax(last))
    order = [_label(tokens, j) for j in np.argsort(-last)]
    choices = _offer([order[0], order[1], _label(tokens, 0), _label(tokens, len(tokens) - 2), order[-1]],
                     _label(tokens, best))
    return Question("gpt-tiny reads this sentence. **In its last layer (mean of the heads), which token does the last "
                    "token attend to most?**", choices, _label(tokens, best),
                    f"{_label(tokens, best)} gets {last[best]:.2f}; the first token gets {last[0]:.2f}",
                    "Softmax must spend a row's whole weight somewhere, and many heads spend what they do not need on "
                    "the first token, which every query can see. Such an *attention sink* (Xiao et al. 2023) can "
                    "outweigh every meaningful word.",
                    lambda p: _mark(va.attention_heatmap(weights, tokens, tokens, layer=weights.shape[0] - 1,
                                                         head="mean", kind="gpt-tiny"), p,
                                    p if p in choices else None, _label(tokens, len(tokens) - 1)))


def l5_renormalised(inp: str) -> Question:
    from models.inspect.decompose import decompose_score
    from viz import why as vw

    net, ids, tokens, weights, share, layer, head = _sink_setup(inp)
    q = len(ids) - 1
    row = weights[layer, head, q].astype(np.float64)
    rest = row.copy()
    rest[0] = 0
    rest = rest / rest.sum() if rest.sum() > 0 else rest
    best = int(np.argmax(rest))
    order = [_label(tokens, j) for j in np.argsort(-rest) if j != 0]
    d = decompose_score(net, ids, layer, head, q, best)
    return Question(f"Layer {layer} head {head} gives {share[layer, head]:.0%} of its attention to the first token. "
                    "Take the first token away and rescale the last token's row to sum to 1. **Which token gets the "
                    "most then?**", _offer(order[:2] + order[-2:], _label(tokens, best)), _label(tokens, best),
                    f"without the first token, {_label(tokens, best)} gets {rest[best]:.1%} (it had {row[best]:.1%})",
                    "Renormalising shows what the head looks at when it looks at anything at all. The red diamonds in "
                    "the row are that view; the bars are what the model really does.",
                    lambda p: _mark(vw.score_decomposition(d.table, d.parts, d.row, d.softmax_row, tokens, q, best,
                                                           title=f"Layer {layer} head {head}",
                                                           renormalised=d.sink_renormalised), p))


def l5_ablate(inp: str) -> Question:
    from models.inspect.patching import sink_ablation

    net, ids, tokens, weights, share, layer, head = _sink_setup(inp)
    r = sink_ablation(net, ids, layer, head)
    change = r.loss_after - r.loss_before
    choices = ["rises by more than 0.05 nats", "changes by less than 0.05 nats", "falls by more than 0.05 nats"]
    answer = choices[0] if change > 0.05 else choices[2] if change < -0.05 else choices[1]
    return Question(f"Now forbid layer {layer} head {head} its first token *inside* the forward pass, so every later "
                    "layer sees the change. **What happens to gpt-tiny's mean next-token loss on this sentence?**",
                    choices, answer, f"mean loss {r.loss_before:.3f} → {r.loss_after:.3f} nats ({change:+.3f})",
                    "If the loss barely moves, the sink was a parking place: the head's output there carried little. "
                    "If it rises, the model had come to rely on it, which is why streaming LLMs keep the first tokens "
                    "in their cache.",
                    lambda p: _mark(va.attention_heatmap(r.attention_after, tokens, tokens, head=0,
                                                         title=f"Layer {layer} head {head} with the sink ablated"), p))


# --------------------------------------------------------------------------------- 6 · cross-attention
@functools.lru_cache(maxsize=16)
def _translate(net, text: str, beam: int):
    return net.translate(text, beam_size=beam)


def _translation(text: str, beam: int):
    return _translate(get_model("translator-en-de"), text, beam)


def l6_align(inp: str) -> Question:
    from viz import text as vt

    text = _sentence(inp, sentences.TRANSLATE[0])
    r = _translation(text, 5)
    cross = r.attention["cross"]
    row = min(1, cross.weights.shape[2] - 1)
    w = cross.weights[-1].mean(0)[row]
    best = int(np.argmax(w))
    src = r.source_tokens
    produced = r.target_tokens[row + 1] if row + 1 < len(r.target_tokens) else "</s>"
    order = [_label(src, j) for j in np.argsort(-w)]
    return Question(f"The translator turns *{esc(text)}* into *{esc(r.text)}*{_stop(r.text)} At step {row} it produces "
                    f"“{esc(produced)}”. **Which English token does that step attend to most (last layer, mean of "
                    "heads)?**", _offer(order[:2] + order[-2:], _label(src, best)), _label(src, best),
                    f"{_label(src, best)} gets {w[best]:.2f} of step {row}'s cross-attention",
                    "Cross-attention lets each decoder step read the whole English sentence and pick what it needs. "
                    "In the last layers it often traces a word alignment, though nothing forces it to.",
                    lambda p: _mark(vt.cross_alignment(cross.weights, r.target_tokens, src, layer=cross.layers - 1),
                                    p))


def l6_beam(inp: str) -> Question:
    from viz import text as vt

    r = _translation(_sentence(inp, sentences.TRANSLATE[0]), 5)
    slots = beam_slots(r)
    choices = ["yes, in the top slot at every step", "it started on top, then fell behind",
               "no, it started below the top slot"]
    answer = choices[0] if not any(slots) else choices[1] if slots[0] == 0 else choices[2]
    lower = [t for t, slot in enumerate(slots) if slot]
    return Question("Beam search keeps the 5 best partial translations at every step, the most likely one in the top "
                    "slot. **Did the translation it finally chose hold the top slot at every step?**", choices,
                    answer, f"the chosen translation's slot at steps 0–{len(slots) - 1}: "
                    + " ".join(str(v) for v in slots)
                    + (f" (below the top at step{'s' if len(lower) > 1 else ''} {', '.join(map(str, lower))})"
                       if lower else ""),
                    "A greedy decoder commits to the best word at every step. Beam search keeps alternatives alive, "
                    "so a hypothesis that is behind for a while can still win on the whole sentence.",
                    lambda p: _mark(vt.beam_tree(r.beam, r.chosen, title="Beam search (beam size 5)"), p))


def beam_slots(r) -> list[int]:
    """The beam slot of the chosen hypothesis at each step: the red path the beam tree draws (slot 0 is the top)."""
    return [int(c) for c in r.chosen[: len(r.beam)]]


def l6_greedy(inp: str) -> Question:
    from viz import text as vt

    text = _sentence(inp, sentences.TRANSLATE[0])
    beam, greedy = _translation(text, 5), _translation(text, 1)
    choices = ["the same translation", "a different translation", "no translation at all"]
    answer = choices[2] if not greedy.text else choices[0] if greedy.text == beam.text else choices[1]
    return Question(f"Beam search (5) gives *{esc(beam.text)}*{_stop(beam.text)} **What does greedy search (beam 1) "
                    "give?**", choices,
                    answer, f"greedy: “{greedy.text}”",
                    "Greedy search takes the most likely word at every step, and on short captions it often agrees "
                    "with beam search. Where it does not, beam search found a sentence more likely as a whole.",
                    lambda p: _mark(vt.cross_alignment(greedy.attention["cross"].weights, greedy.target_tokens,
                                                       greedy.source_tokens, layer=greedy.attention["cross"].layers - 1,
                                                       title="Greedy translation · cross-attention"), p))


# ---------------------------------------------------------------------------------------- 7 · ViT and Swin
def _vit(inp: str):
    from models.inspect.analysis import rollout

    index = int(np.clip(_seed(inp), 0, len(EXAMPLE_IMAGES) - 1)) if (inp or "").strip() else 7
    r = get_model("vit-fashion").classify(str(EXAMPLE_IMAGES[index]))
    w = r.attention["encoder"].weights
    k = r.prefix_tokens  # the patches come after [CLS]
    return r, index, w[-1].mean(0)[0, k:], rollout(w)[-1][0, k:]


def _patch(grid: tuple[int, int], i: int) -> str:
    return f"row {i // grid[1]}, column {i % grid[1]}"


def l7_cls(inp: str) -> Question:
    from viz import images as vi

    r, index, last, _ = _vit(inp)
    best = int(np.argmax(last))
    order = [_patch(r.grid, j) for j in np.argsort(-last)]
    return Question(f"The ViT sees example image {index} (it answers **{r.labels[int(np.argmax(r.probs))]}**) as "
                    f"{r.grid[0]} × {r.grid[1]} patches plus a CLS token, which the classifier reads. **Which patch "
                    "does CLS attend to most in the last layer (mean of heads)?**",
                    _offer(order[:2] + order[-2:], _patch(r.grid, best)), _patch(r.grid, best),
                    f"{_patch(r.grid, best)} gets {last[best]:.3f} of CLS's attention",
                    "CLS gathers the image into one vector by attending to patches; the last layer shows where it "
                    "reads from just before the answer. It is often the object's outline, sometimes the empty "
                    "background.",
                    lambda p: _mark(vi.image_attention(r.image, last, r.grid, title="CLS → patches · last layer"), p))


def l7_rollout(inp: str) -> Question:
    from viz import images as vi

    r, index, last, roll = _vit(inp)
    same = int(np.argmax(last)) == int(np.argmax(roll))
    choices = ["the same patch", "a different patch", "none: rollout is uniform"]
    answer = choices[2] if np.ptp(roll) < 1e-6 else choices[0] if same else choices[1]
    return Question("*Rollout* multiplies the attention of all layers (with the residual connection) to follow "
                    "information from the input to CLS. **Does rollout's top patch sit where the last layer's does?**",
                    choices, answer, f"last layer's top: {_patch(r.grid, int(np.argmax(last)))}; rollout's top: "
                    f"{_patch(r.grid, int(np.argmax(roll)))}",
                    "One layer's attention is one hop; rollout composes every hop, so it can move the focus to where "
                    "information started. Neither proves what the answer depends on (lesson 8).",
                    lambda p: _mark(vi.image_attention(r.image, roll, r.grid, title="Attention rollout · CLS"), p))


def l7_swin(inp: str) -> Question:
    from models.families.swin import shifted_window_regions
    from viz import swin as vs

    regions = shifted_window_regions(8, 8, 4, 2).numpy()
    corner = len(np.unique(regions[4:, 4:]))
    choices = ["1", "2", "4", "9"]
    return Question("Swin attends inside 4 × 4 windows of an 8 × 8 grid; every second block shifts the windows by 2 "
                    "and rolls the grid around (the cyclic shift), so one window can hold pieces from opposite edges "
                    "of the image. Pieces that were not neighbours must not attend to each other. **How many separate "
                    "pieces (regions) does the bottom-right window hold?**", choices, str(corner),
                    f"the bottom-right window holds {corner} regions", "The −100 mask keeps each region to itself "
                    "inside a shared window, so the shift mixes information across windows without letting far-apart "
                    "pixels meet. Corner windows hold the most pieces.",
                    lambda p: _mark(vs.region_map(regions, 4), p))


# ------------------------------------------------------------------------- 8 · attention is not explanation
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
    fig = go.Figure(go.Bar(x=[esc(_label(ig.tokens, j)) for j in shown], y=values,
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


def l8_ig_top(inp: str) -> Question:

    text = _l8_text(inp)
    att, ig, *_ = _explained(text)
    best = _top(ig)
    ranked = [_label(ig.tokens, j) for j in np.argsort(-np.where(ig.special, -np.inf, ig.values))
              if not ig.special[j]]
    choices = _offer([ranked[0], _label(att.tokens, _top(att)), ranked[-1], ranked[len(ranked) // 2]],
                     _label(ig.tokens, best))
    return Question(f"The sentiment classifier reads *{esc(text)}* and answers **{ig.label}** ({ig.prob:.0%}). "
                    "**Which token does integrated gradients say the answer rests on most?**", choices,
                    _label(ig.tokens, best), f"integrated gradients ranks {_label(ig.tokens, best)} first "
                    f"({ig.values[best]:+.2f})",
                    "Integrated gradients adds up how the answer's logit changes along a path from a blank input to "
                    "this one, token by token. Attention only says where a layer looked (step 3 sets them side by "
                    "side).", lambda p: _mark(_ig_bars(ig), p))


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
                    lambda p: _mark(vattr.deletion_curves(
                        [(name, c.fractions, c.probs)
                         for name, c in zip(("attention", "integrated gradients"), curves, strict=True)],
                        (curves[0].fractions, random), label=curves[0].label), p))


def l8_agree(inp: str) -> Question:

    text = _l8_text(inp)
    att, ig, *_ = _explained(text)
    choices = ["yes, the same token", "no, different tokens", "neither ranks any token"]
    answer = choices[2] if att.special.all() else choices[0] if _top(att) == _top(ig) else choices[1]
    return Question("**Does attention's top token match integrated gradients' top token on this sentence?**", choices,
                    answer, f"attention: {_label(att.tokens, _top(att))}; integrated gradients: "
                    f"{_label(ig.tokens, _top(ig))}",
                    "Where they disagree, the deletion curve says which to believe. Attention is a useful picture of "
                    "the computation, not a measurement of what the answer depends on.",
                    lambda p: _mark(_both(att, ig), p))


LESSONS = [
    Lesson("1 · softmax(QKᵀ/√d_k)·V and why the scale", "Attention in one formula: scores, scale, softmax, mean of "
           "values.", "seed (random Q, K, V)", "0", (l1_argmax, l1_sum, l1_scale)),
    Lesson("2 · Causal and padding masks", "What a token may not see, and how a mask enforces it.",
           "seed (random Q, K, V)", "0", (l2_causal, l2_padding, l2_model)),
    Lesson("3 · Sinusoidal positions and RoPE", "Where a token is: added to the input, or turned inside q·k.",
           "number of positions (sinusoids) and seed (RoPE, repeated tokens)", "64", (l3_sinusoid, l3_rope, l3_model)),
    Lesson("4 · Previous-token and induction heads", "Two heads that together copy a sequence seen once.",
           "seed (the random tokens)", "0", (l4_previous, l4_induction, l4_loss)),
    Lesson("5 · Attention sinks", "Why so much attention lands on the first token, and whether it matters.",
           "sentence", sentences.TRANSLATE[0], (l5_target, l5_renormalised, l5_ablate)),
    Lesson("6 · Cross-attention in translation", "How each German word reads the English sentence; the beam tree.",
           "English sentence", sentences.TRANSLATE[0], (l6_align, l6_beam, l6_greedy)),
    Lesson("7 · ViT patches, rollout and Swin windows", "Images as patches; attention across layers; shifted windows.",
           "example image (0–9)", "7", (l7_cls, l7_rollout, l7_swin)),
    Lesson("8 · Attention is not explanation", "Attention against integrated gradients, judged by deleting words.",
           "sentence (empty: the example where they disagree most)", "", (l8_ig_top, l8_deletion, l8_agree)),
]


# ---------------------------------------------------------------------------------------------- handlers
def _lesson(number) -> Lesson:
    try:
        n = int(number)
    except (TypeError, ValueError, OverflowError):
        raise Error(f"The lesson must be a number from 1 to {len(LESSONS)}, got {str(number)[:40]!r}.") from None
    if not 1 <= n <= len(LESSONS):
        raise Error(f"There are {len(LESSONS)} lessons (1–{len(LESSONS)}); got {n}.")
    return LESSONS[n - 1]


def question(number, step, text: str = "") -> Question:
    """Step ``step`` (1-based) of lesson ``number`` (1-based) on the lesson's input (empty: its default)."""
    lesson = _lesson(number)
    try:
        s = int(step)
    except (TypeError, ValueError, OverflowError):
        raise Error(f"The step must be a number, got {str(step)[:40]!r}.") from None
    if not 1 <= s <= len(lesson.steps):
        raise Error(f"Lesson {number} has {len(lesson.steps)} steps (1–{len(lesson.steps)}); got {s}.")
    inp = lesson.default if text is None or not str(text).strip() else str(text)[:2000]
    try:
        return _shuffled(lesson.steps[s - 1](inp), int(number), s, inp)
    except ValueError as err:
        raise Error(f"This input does not work for the step: {err}") from None


def verdict(q: Question, answer: str) -> tuple[bool, str]:
    if answer not in q.choices:
        raise Error(f"{str(answer)[:60]!r} is not one of the choices: " + "; ".join(q.choices))
    right = answer == q.answer
    said = "**correct**" if right else f"**not quite**: the numbers say *{esc(q.answer)}*"
    return right, f"{said} — {esc(q.fact)}."


def lesson_api(number: int = 1, step: int = 1, input: str = "") -> tuple[str, str, list[str]]:
    """One lesson step: (text, the figure shown before predicting as Plotly JSON text ("" when there is none;
    `plotly.io.from_json` reads it), the choices)."""
    q = question(number, step, input)
    return q.text, "" if q.before is None else figure_text(q.before), q.choices


def lesson_answer_api(number: int = 1, step: int = 1, answer: str = "", input: str = "") -> tuple[str, str, str]:
    """A prediction judged by the model's numbers: (verdict "correct" | "not quite" and the numbers, the revealed
    figure with the prediction marked as Plotly JSON text, the explanation)."""
    q = question(number, step, input)
    right, _ = verdict(q, answer)
    return ("correct" if right else "not quite") + " — " + q.fact, figure_text(q.reveal(answer)), q.explanation


def figure_text(fig: go.Figure) -> str:
    """A figure for the API as Plotly's JSON *text*, not a JSON object: gradio_client fetches any object with a
    ``path`` key as a file, and Plotly's path shapes (the Swin region map's) have one."""
    return fig.to_json()


# -------------------------------------------------------------------------------------------------- layout
def build() -> Permalink:
    gr.Markdown(INTRO, elem_classes=["intro"])
    titles = [lesson.title for lesson in LESSONS]
    with gr.Row():
        chosen = gr.Dropdown(titles, value=titles[0], label="lesson", scale=2)
        text = gr.Textbox("", label=LESSONS[0].input_label, placeholder=LESSONS[0].default, scale=2,
                          max_length=2000, info="empty: the example shown in grey")
        start = gr.Button("Start the lesson", variant="primary", scale=1)
    about = gr.Markdown(LESSONS[0].intro)
    current = gr.State()  # the lesson number shown, for the link's step
    progress = gr.BrowserState({}, storage_key="atlas-lessons")
    where = gr.Markdown()
    with gr.Row():
        back = gr.Button("← previous step", scale=1)
        step = gr.Slider(1, max(len(lesson.steps) for lesson in LESSONS), value=1, step=1, label="step", scale=2)
        forward = gr.Button("next step →", scale=1)
    prompt = gr.Markdown()
    before = gr.Plot(label="before you predict", visible=False)
    choices = gr.Radio([], label="your prediction")
    check = gr.Button("Check my prediction", variant="primary")
    said = gr.Markdown()
    shown = gr.Plot(label="revealed")
    explanation = gr.Markdown()
    with gr.Row():
        export = gr.Button("Export this lesson as an HTML page")
        handout = gr.File(label="the lesson, one page (works offline)")

    view = [where, prompt, before, choices, said, shown, explanation]
    # the label and intro follow any change of lesson (a link's too); only a person's choice clears the input
    chosen.change(describe, [chosen], [text, about], api_name=False, show_progress="hidden")
    # a person's new lesson or input empties every output of the old one: no intro above another lesson's question,
    # no export of the previous lesson, no choices that the new input's question would refuse
    chosen.input(lambda: ("", *cleared(), None), None, [text, *view, handout], api_name=False, show_progress="hidden")
    text.input(lambda: (*cleared("The input changed: press **Start the lesson** to ask on it."), None), None,
               [*view, handout], api_name=False, show_progress="hidden")
    steps = [(lambda c, t, pr: show_step(c, 1, t, pr), [chosen, text, progress], [*view, step, current])]
    chain(start.click, steps)
    step.change(show_step, [chosen, step, text, progress], [*view, step, current], api_name=False)
    back.click(lambda s: max(1, int(s) - 1), [step], [step], api_name=False, show_progress="hidden")
    forward.click(lambda c, s: min(len(LESSONS[_number(c) - 1].steps), int(s) + 1), [chosen, step], [step],
                  api_name=False, show_progress="hidden")
    check.click(answer_step, [chosen, step, text, choices, progress], [where, said, shown, explanation, progress],
                api_name=False)
    export.click(export_lesson, [chosen, text, progress], [handout], api_name=False)
    gr.api(lesson_api, api_name="lesson")
    gr.api(lesson_answer_api, api_name="lesson_answer")
    return Permalink({"lesson": chosen, "input": text}, steps, after={"step": step}, state=current,
                     limits=lambda n: {"step": range(1, len(LESSONS[n - 1].steps) + 1)})


def _number(title: str) -> int:
    titles = [lesson.title for lesson in LESSONS]
    return titles.index(title) + 1 if title in titles else 1


def describe(title: str):
    """The input's label and example and the intro of the chosen lesson."""
    lesson = LESSONS[_number(title) - 1]
    return gr.update(label=lesson.input_label, placeholder=lesson.default), lesson.intro


def _where(number: int, step: int, progress: dict | None) -> str:
    lesson = LESSONS[number - 1]
    got = (progress or {}).get(str(number), {})
    score = sum(1 for v in got.values() if v)
    marks = " ".join("✓" if got.get(str(i)) else "✗" if str(i) in got else "·"
                     for i in range(1, len(lesson.steps) + 1))
    return (f"**{esc(lesson.title)}** · step {step} of {len(lesson.steps)} · your score {score} of "
            f"{len(lesson.steps)} (first answers: {marks})")


def cleared(where: str = "") -> tuple:
    """The step view emptied (``where`` says why): the outputs of `show_step` before its step and lesson number."""
    return where, "", gr.update(value=None, visible=False), gr.update(choices=[], value=None), "", None, ""


def show_step(title: str, step: int, text: str, progress: dict | None):
    """A step before the prediction: its question and choices; the reveal is cleared. An input the step cannot
    take empties the view and says why (a gr.Error would leave the previous question standing)."""
    number = _number(title)
    step = int(np.clip(int(step or 1), 1, len(LESSONS[number - 1].steps)))
    try:
        q = question(number, step, text)
    except Error as err:
        return (*cleared(f"**{esc(LESSONS[number - 1].title)}** · step {step}: {err.message}"),
                gr.update(value=step, maximum=len(LESSONS[number - 1].steps)), number)
    return (_where(number, step, progress), q.text, gr.update(value=q.before, visible=q.before is not None),
            gr.update(choices=q.choices, value=None), "", None, "",
            gr.update(value=step, maximum=len(LESSONS[number - 1].steps)), number)


def answer_step(title: str, step: int, text: str, answer: str | None, progress: dict | None):
    """Judge the prediction by the numbers, reveal the figure with it marked, and keep the first answer."""
    if not answer:
        raise Error("Pick a prediction first: the figure is revealed after you commit to one.")
    number = _number(title)
    q = question(number, step, text)
    right, words = verdict(q, answer)
    progress = dict(progress or {})
    got = dict(progress.get(str(number), {}))
    got.setdefault(str(step), right)  # the first answer counts
    progress[str(number)] = got
    return _where(number, int(step), progress), words, q.reveal(answer), q.explanation, progress


def export_lesson(title: str, text: str, progress: dict | None) -> str:
    """The whole lesson as one HTML page: every step's question, the answer the numbers give and the figure,
    with plotly.js inline so that it works offline."""
    from plotly.offline import get_plotlyjs

    number = _number(title)
    lesson = LESSONS[number - 1]
    parts = []
    for i in range(1, len(lesson.steps) + 1):
        q = question(number, i, text)
        listed = "".join(f"<li>{html.escape(c)}</li>" for c in q.choices)
        figure = q.reveal(None).to_html(include_plotlyjs=False, full_html=False)
        parts.append(f"<section><h2>Step {i}</h2><p>{_md(q.text)}</p><ol type='a'>{listed}</ol>"
                     f"<details><summary>Answer</summary><p><b>{html.escape(q.answer)}</b> — {html.escape(q.fact)}."
                     f"</p><p>{html.escape(q.explanation)}</p>{figure}</details></section>")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(lesson.title)}</title>"
            f"<script>{get_plotlyjs()}</script><style>body{{font-family:sans-serif;max-width:1100px;margin:auto}}"
            f"section{{border-top:1px solid #ccc;padding:1em 0}}</style></head><body><h1>{html.escape(lesson.title)}"
            f"</h1><p>{html.escape(lesson.intro)}</p><p>Input: {html.escape(text or lesson.default)}</p>"
            + "".join(parts) + "</body></html>")
    DOWNLOADS.mkdir(parents=True, exist_ok=True)
    path = DOWNLOADS / f"lesson-{number}-{uuid.uuid4().hex[:8]}.html"
    path.write_text(page, encoding="utf-8")
    return str(path)


def _md(text: str) -> str:
    """The little Markdown the step texts use (**bold**, *italic*, `code`) as HTML (what came from the input is
    escaped where the text is made)."""
    out = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)  # the step texts escape what came from the input
    out = re.sub(r"\*(.+?)\*", r"<i>\1</i>", out)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", out)
