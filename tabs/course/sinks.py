"""Lesson 5 · Attention sinks."""

from __future__ import annotations

import functools

import numpy as np

from examples import sentences
from tabs.common import get_model
from tabs.course.engine import (
    Lesson,
    Question,
    label,
    lm_run,
    mark,
    offer,
    sentence,
)
from tabs.course.induction import MODELS
from viz import attention as va
from viz.common import esc


def _sink_setup(inp: str, name: str = MODELS[0][1]):
    net = get_model(name)
    ids, tokens = net.encode_prompt(sentence(inp, sentences.TRANSLATE[0]))
    ids, tokens = ids[: net.context_limit()], tokens[: net.context_limit()]
    _, weights = lm_run(name, tuple(ids))
    share = weights[:, :, 1:, 0].mean(-1)  # (L, H): attention on the first token, queries after it
    layer, head = (int(v) for v in np.unravel_index(int(np.argmax(share)), share.shape))
    return net, ids, tokens, weights, share, layer, head


def l5_target(inp: str, name: str = MODELS[0][1]) -> Question:
    net, ids, tokens, weights, *_ = _sink_setup(inp, name)
    last = weights[-1].mean(0)[-1]
    best = int(np.argmax(last))
    order = [label(tokens, j) for j in np.argsort(-last)]
    choices = offer([order[0], order[1], label(tokens, 0), label(tokens, len(tokens) - 2), order[-1]],
                     label(tokens, best))
    return Question(f"{esc(name)} reads this sentence. **In its last layer (mean of the heads), which token does the "
                    "last token attend to most?**", choices, label(tokens, best),
                    f"{label(tokens, best)} gets {last[best]:.2f}"
                    + (": the first token itself takes the most" if best == 0 else
                       f"; the first token gets {last[0]:.2f}"),
                    "Softmax must spend a row's whole weight somewhere, and many heads spend what they do not need on "
                    "the first token, which every query can see. Such an *attention sink* (Xiao et al. 2023) can "
                    "outweigh every meaningful word.",
                    lambda p: mark(va.attention_heatmap(weights, tokens, tokens, layer=weights.shape[0] - 1,
                                                         head="mean", kind=esc(name)), p,
                                    p if p in choices else None, label(tokens, len(tokens) - 1)))


def l5_renormalised(inp: str, name: str = MODELS[0][1]) -> Question:
    from models.inspect.decompose import decompose_score
    from viz import why as vw

    net, ids, tokens, weights, share, layer, head = _sink_setup(inp, name)
    q = len(ids) - 1
    row = weights[layer, head, q].astype(np.float64)
    rest = row.copy()
    rest[0] = 0
    rest = rest / rest.sum() if rest.sum() > 0 else rest
    best = int(np.argmax(rest))
    order = [label(tokens, j) for j in np.argsort(-rest) if j != 0]
    d = decompose_score(net, ids, layer, head, q, best)
    return Question(f"Layer {layer} head {head} gives {share[layer, head]:.0%} of its attention to the first token. "
                    "Take the first token away and rescale the last token's row to sum to 1. **Which token gets the "
                    "most then?**", offer(order[:2] + order[-2:], label(tokens, best)), label(tokens, best),
                    f"without the first token, {label(tokens, best)} gets {rest[best]:.1%} (it had {row[best]:.1%})",
                    "Renormalising shows what the head looks at when it looks at anything at all. The red diamonds in "
                    "the row are that view; the bars are what the model really does.",
                    lambda p: mark(vw.score_decomposition(d.table, d.parts, d.row, d.softmax_row, tokens, q, best,
                                                           title=f"Layer {layer} head {head}",
                                                           renormalised=d.sink_renormalised), p))


SHIFT = 0.5  # nats: a change of the mean loss this large is far beyond what one head's sink moves (lesson 5·3)


def l5_ablate(inp: str, name: str = MODELS[0][1]) -> Question:
    from models.inspect.patching import sink_ablation

    net, ids, tokens, weights, share, layer, head = _sink_setup(inp, name)
    r = sink_ablation(net, ids, layer, head, everywhere=True)
    alone = sink_ablation(net, ids, layer, head)
    change = r.loss_after - r.loss_before
    choices = [f"rises by more than {SHIFT} nats", f"changes by less than {SHIFT} nats",
               f"falls by more than {SHIFT} nats"]
    answer = choices[0] if change > SHIFT else choices[2] if change < -SHIFT else choices[1]
    return Question("Now forbid **every head of every layer** its first token *inside* the forward pass, so that each "
                    f"later layer sees the change. **What happens to {esc(name)}'s mean next-token loss on "
                    "this sentence?**", choices, answer,
                    f"mean loss {r.loss_before:.3f} → {r.loss_after:.3f} nats ({change:+.3f}); layer {layer} head "
                    f"{head} alone: {alone.loss_after - alone.loss_before:+.3f}",
                    "The heads had come to rely on the sink: forbidden it, each spreads the weight it parked there "
                    "over real tokens, and the errors add up layer by layer. That is why streaming LLMs keep the "
                    "first tokens in their cache (Xiao et al. 2023).",
                    lambda p: mark(va.attention_heatmap(r.attention_after, tokens, tokens, head=0,
                                                         title=f"Layer {layer} head {head} with every sink ablated"),
                                   p))


FORGET_TOKENS = 256  # the book of step 4 (less where the model reads less)
FORGET_NEW = 12  # answer tokens decoded
FORGET_RATIO = 0.75  # the share of the book's cache the press removes
FORGET_WINDOW = 16  # SnapKV's observation window: the prompt's last tokens, the question among them
MARGIN = 0.10  # two shares closer than this are a tie (the reveal shows both)
GROUPS = ("the first token (the attention sink)", "the password's tokens in the needle",
          "the book's other tokens (on average)")
TIE = f"two of them alike (within {MARGIN:.2f} of each other at the top)"


def _forget(name: str):
    """A needle book read by the chosen model, its cache cut by SnapKV (models/decoding/compress.py) with the question
    inside the observation window; (haystack, comparison)."""
    return _forget_run(get_model(name))


@functools.lru_cache(maxsize=4)
def _forget_run(net):  # kept per model object: a name may stand for another model later (tests, a reload)
    from models.decoding import compress as C
    from models.inspect import retrieval

    length = min(FORGET_TOKENS, net.context_limit() - FORGET_NEW - 8)
    hay = retrieval.haystack(net, length, 0.5, seed=0, **retrieval.SHORT)
    press = C.Press("snapkv", FORGET_RATIO, window=FORGET_WINDOW)
    return hay, C.compare(net, hay.ids, (), press, max_new_tokens=FORGET_NEW)


def forget_shares(mask: np.ndarray, hay) -> np.ndarray:
    """The share of (layer, key-value head) pairs that keep each group of ``GROUPS``: the first token, the password's
    tokens, the book's other tokens (the needle and the first token left out), from a kept mask (L, H_kv, T); NaN for
    a group without tokens (a model of few positions reads the needle and the question alone)."""
    a0, a1 = hay.answer_span
    n0, n1 = hay.needle_span
    c0, c1 = hay.context_span
    other = [j for j in range(max(1, c0), c1) if not n0 <= j < n1]
    groups = ([0], list(range(a0, a1)), other)
    return np.array([mask[:, :, g].mean() if g else np.nan for g in groups], dtype=np.float64)


def forget_answer(shares: np.ndarray) -> str:
    """The group kept by the most heads, or the tie when the top two are within ``MARGIN`` (groups without tokens,
    NaN, are not offered)."""
    present = [i for i in range(len(shares)) if not np.isnan(shares[i])]
    order = sorted(present, key=lambda i: -shares[i])
    if len(order) > 1 and shares[order[0]] - shares[order[1]] < MARGIN:
        return TIE
    return GROUPS[order[0]]


def l5_forget(inp: str, name: str = MODELS[0][1]) -> Question:
    from models.inspect import retrieval
    from viz import kvcache as vk

    hay, cmp = _forget(name)
    shares = forget_shares(cmp.kept.mask, hay)
    answer = forget_answer(shares)

    def said(text: str) -> str:
        text = " ".join(text.replace("⁇", "?").split())[:60]
        found = "the password" if retrieval.found_in(text, hay.answer) else "no password"
        return f"“{esc(text)}” ({found})"

    book = ("the book has no other tokens at this model's length" if np.isnan(shares[2])
            else f"the book's other tokens in {shares[2]:.0%}")
    fact = (f"SnapKV kept the first token in {shares[0]:.0%} of the (layer, key-value head) pairs, the password's "
            f"tokens in {shares[1]:.0%}, {book}; the full cache answered {said(cmp.full.text)}, the cut cache "
            f"{said(cmp.compressed.text)}")
    offered = [g for g, x in zip(GROUPS, shares) if not np.isnan(x)]
    tokens = cmp.full.tokens[:cmp.context_len]

    def reveal(p):
        fig = vk.kept_map(cmp.kept.mask, tokens, title=f"What SnapKV keeps of {len(tokens)} tokens at ratio "
                          f"{FORGET_RATIO:.2f}<br><sup>each layer's share of key-value heads keeping each position; "
                          f"the needle at {hay.needle_span[0]}–{hay.needle_span[1] - 1}</sup>")
        return mark(fig, p)

    return Question(f"{esc(name)} reads a book of {len(hay.ids)} tokens with a needle halfway (“{esc(hay.needle)}”) "
                    f"and the question “{esc(hay.question)}” at its end. Its KV cache is then cut to a quarter by "
                    f"*SnapKV*: each key-value head keeps the keys its last {FORGET_WINDOW} queries (the question "
                    "among them) attend to most, and the answer is written from what is left. **Which tokens do the "
                    "most heads keep?**", [*offered, TIE], answer, fact,
                    "A press keeps what attention points at: a sink that a head parks its weight on (steps 1–3) is "
                    "kept by that head, and the needle only where the window's queries, the question's among them, "
                    "attend to it. What no head keeps is what the model forgets, and the two answers show whether "
                    "it mattered; Generate's Compress the cache tries every press (StreamingLLM keeps the first and "
                    "the last tokens only).", reveal)


LESSON = Lesson(
    "5 · Attention sinks", "Why so much attention lands on the first token, whether it matters, and which tokens a "
    "compressed cache can forget.",
           "sentence", sentences.TRANSLATE[0], (l5_target, l5_renormalised, l5_ablate, l5_forget), models=MODELS)
