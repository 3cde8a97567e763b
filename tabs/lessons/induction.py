"""Lesson 4 · Previous-token and induction heads."""

from __future__ import annotations

import numpy as np

from tabs.common import get_model
from tabs.lessons.engine import (
    Lesson,
    Question,
    lm_run,
    mark,
    offer,
    seed_of,
)
from viz import attention as va


def _repeated(inp: str):
    from models.analysis import head_roles

    net = get_model("gpt-tiny")
    n = min(30, (net.context_limit() - 1) // 2)
    ids = net.repeated_tokens(n, seed=seed_of(inp))
    loss, weights = lm_run("gpt-tiny", tuple(ids))
    roles = head_roles(weights, n)
    return net, n, ids, loss, weights, roles["previous"], roles["induction"]


def _head_question(score: np.ndarray, text: str, fact: str, explanation: str, reveal) -> Question:
    order = [tuple(int(v) for v in np.unravel_index(int(i), score.shape)) for i in np.argsort(-score, axis=None)]
    name = [f"layer {a} head {b}" for a, b in order]
    # the best, the runner-up and two of the weakest: a real choice, not a giveaway
    choices = offer([name[0], name[1], name[-1], name[len(name) // 2]], name[0])
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
            return mark(fig, p)
        a, b = (int(v) for v in p.replace("layer ", "").replace(" head ", ",").split(","))
        return mark(fig, p, b, a)

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
        return mark(fig, p)

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
                    lambda p: mark(vg.copy_losses(loss[:n], loss[n: 2 * n]), p))


LESSON = Lesson(
    "4 · Previous-token and induction heads", "Two heads that together copy a sequence seen once.",
           "seed (the random tokens)", "0", (l4_previous, l4_induction, l4_loss))
