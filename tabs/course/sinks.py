"""Lesson 5 · Attention sinks."""

from __future__ import annotations

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


LESSON = Lesson(
    "5 · Attention sinks", "Why so much attention lands on the first token, and whether it matters.",
           "sentence", sentences.TRANSLATE[0], (l5_target, l5_renormalised, l5_ablate), models=MODELS)
