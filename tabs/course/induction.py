"""Lesson 4 · Previous-token and induction heads."""

from __future__ import annotations

import functools

import numpy as np

from serving.catalogue import GPT_TINY, REAL_LM
from tabs.common import get_model
from tabs.course.engine import (
    Lesson,
    Question,
    lm_run,
    mark,
    seed_of,
)
from viz import attention as va
from viz.common import esc

MODEL = GPT_TINY  # the lesson's default model; every head the questions name comes from the chosen model's own scores
# gpt-tiny (trained here, 4 layers × 8 heads) or SmolLM2-135M-Instruct (real, 30 × 9, from its package's GGUF file)
MODELS = (("gpt-tiny", GPT_TINY), ("smollm2", REAL_LM))
MARGIN = 0.10  # a head offered beside the right one scores at least this much less: the reveal shows the gap
SHOWN = 24  # tokens of each copy drawn in the heads' maps before predicting (the stripes read at a glance)


def _repeated(inp: str, name: str = MODEL):
    from models.analysis import head_roles

    net = get_model(name)
    n = min(30, (net.context_limit() - 1) // 2)
    ids = net.repeated_tokens(n, seed=seed_of(inp))
    loss, weights = lm_run(name, tuple(ids))
    roles = head_roles(weights, n)
    return net, n, ids, loss, weights, roles["previous"], roles["induction"]


def head_name(layer: int, head: int) -> str:
    return f"layer {layer} head {head}"


def head_choices(score: np.ndarray, other: np.ndarray) -> tuple[list[tuple[int, int]], tuple[int, int],
                                                                  list[tuple[int, int]], bool]:
    """(the heads offered, the right one, the heads left out as near-ties, whether one head stands out) for "which
    head has the largest ``score``". The right head is the best; every other head offered scores at least `MARGIN`
    less (the strongest such head, the strongest head at the ``other`` role, the weakest), so that a choice is never
    a near-tie the figure cannot separate. Heads within the margin of the best are left out and named in the verdict.
    When fewer than two heads lie beyond the margin, no head stands out, and that is the answer."""
    flat = [tuple(int(v) for v in np.unravel_index(int(i), score.shape)) for i in np.argsort(-score, axis=None)]
    best = flat[0]
    top = float(score[best])
    far = [h for h in flat if float(score[h]) <= top - MARGIN]
    near = [h for h in flat[1:] if float(score[h]) > top - MARGIN]
    if len(far) < 2:
        return flat[:3], best, near, False
    by_other = sorted(far, key=lambda h: -float(other[h]))
    picks = list(dict.fromkeys([best, far[0], by_other[0], far[-1], far[len(far) // 2]]))[:4]
    return picks, best, near, True


def _heads_before(weights: np.ndarray, tokens: list[str], heads: list[tuple[int, int]], n: int, what: str):
    """The offered heads' attention over the first `SHOWN` tokens of each copy, side by side (in layer, head order,
    which says nothing about the answer): what the student reasons from before predicting."""
    keep = [0, *range(1, 1 + min(n, SHOWN)), *range(1 + n, 1 + n + min(n, SHOWN))]
    shown = [tokens[i] for i in keep]  # viz escapes its labels itself
    ordered = sorted(heads)
    maps = [weights[a, b][np.ix_(keep, keep)] for a, b in ordered]
    return va.heatmaps_side_by_side(maps, [shown] * len(maps), [head_name(*h) for h in ordered],
                                    title=f"The heads offered, before predicting: {what}")


def _head_question(score: np.ndarray, other: np.ndarray, weights: np.ndarray, tokens: list[str], n: int, text: str,
                   fact: str, explanation: str, reveal, what: str) -> Question:
    heads, best, near, stands_out = head_choices(score, other)
    names = [head_name(*h) for h in heads]
    none = f"none stands out: these heads score within {MARGIN:.2f} of each other"
    if not stands_out:
        answer = none
        said = ("no head stands out: " + ", ".join(f"{head_name(*h)} {float(score[h]):.2f}" for h in heads))
        return Question(text, [*names, none], answer, said, explanation, reveal,
                        _heads_before(weights, tokens, heads, n, what))
    said = fact.format(best=head_name(*best), value=float(score[best]))
    runner = max(float(score[h]) for h in heads if h != best)
    said += f"; the other heads offered score at most {runner:.2f} (each at least {MARGIN:.2f} less)"
    if near:
        said += ("; left out as too close to call: " + ", ".join(f"{head_name(*h)} {float(score[h]):.3f}"
                                                                 for h in near[:4]))
    return Question(text, names, head_name(*best), said, explanation, reveal,
                    _heads_before(weights, tokens, heads, n, what))


def l4_previous(inp: str, name: str = MODEL) -> Question:
    from viz import stats as vs

    net, n, ids, loss, weights, prev, ind = _repeated(inp, name)
    roles = prev[..., None]  # the previous-token score alone: the induction score answers the next step
    tokens = [net.piece(i) for i in ids]

    def reveal(p):
        fig = vs.head_share_heatmap(roles, ["previous token"], title="Previous-token score on repeated tokens",
                                    subtitle="mean attention from each token to the one just before it",
                                    label="score")
        if p is None or not p.startswith("layer "):
            return mark(fig, p)
        a, b = (int(v) for v in p.replace("layer ", "").replace(" head ", ",").split(","))
        return mark(fig, p, b, a)

    return _head_question(prev, ind, weights, tokens, n, f"BOS, then {n} random tokens, then the same {n} again, "
                          f"through {esc(name)}; the maps below show the heads offered (rows: queries, columns: keys). "
                          "**Which head attends from each token to the token just before it?**",
                          "{best} puts {value:.2f} of its attention on the previous token, on average",
                          "A previous-token head copies 'what came just before me' into each position: its map is "
                          "one line just below the diagonal. It is the first half of an induction circuit: a later "
                          "head can then look for the token after an earlier copy of the current one.", reveal,
                          "a previous-token head draws one line just below the diagonal")


def l4_induction(inp: str, name: str = MODEL) -> Question:
    net, n, ids, loss, weights, prev, ind = _repeated(inp, name)
    tokens = [net.piece(i) for i in ids]
    best = np.unravel_index(int(np.argmax(ind)), ind.shape)

    def reveal(p):
        fig = va.attention_heatmap(weights, tokens, tokens, layer=int(best[0]), head=int(best[1]),
                                   kind=f"The strongest induction head · score {ind[best]:.2f}")
        return mark(fig, p)

    return _head_question(ind, prev, weights, tokens, n, f"Same sequence (two copies of {n} random tokens). An "
                          "*induction head* attends from a token in the second copy to the token that followed its "
                          "first occurrence: in the maps below, a line in the lower left block, one step right of that "
                          "block's diagonal. **Which head does that?**",
                          "{best} puts {value:.2f} of its attention there, on average",
                          "The stripe N − 1 below the diagonal is the induction head reading the first copy one step "
                          "ahead. It lets the model continue a sequence it has seen once, the simplest in-context "
                          "learning.", reveal, "an induction head draws a line one step right of the lower left "
                          "block's diagonal")


def l4_loss(inp: str, name: str = MODEL) -> Question:
    from viz import generate as vg

    net, n, ids, loss, weights, prev, ind = _repeated(inp, name)
    first, second = float(loss[:n].mean()), float(loss[n: 2 * n].mean())
    choices = ["on the first copy", "on the second copy", "about the same (within 0.1 nats)"]
    answer = choices[2] if abs(first - second) < 0.1 else choices[0] if first < second else choices[1]
    return Question(f"**Where is {esc(name)}'s loss (its surprise at each token) lower: on the first copy of the "
                    "random tokens or on the second?**", choices, answer,
                    f"mean loss {first:.2f} nats on the first copy, {second:.2f} on the second",
                    "Random tokens cannot be predicted the first time. The second time, induction heads find the "
                    "earlier copy and predict each next token from it, so the loss drops.",
                    lambda p: mark(vg.copy_losses(loss[:n], loss[n: 2 * n]), p))


NEEDLE_TOKENS = 512  # the haystack of step 4 (less where the model reads less): a few seconds on a 2-core CPU
NEEDLE_NEW = 24  # answer tokens decoded


@functools.lru_cache(maxsize=8)
def _needle(name: str, seed: int):
    """A needle run (serving.runs.needle, Wu et al. 2024) on the chosen model: the haystack seeded by the lesson's
    input, the needle halfway, through the long-context store; (haystack, Retrieval)."""
    from models.inspect import retrieval
    from serving import runs

    net = get_model(name)
    length = min(NEEDLE_TOKENS, net.context_limit() - NEEDLE_NEW - 8)
    # the short needle and question: a model of a few hundred positions still reads a haystack around them
    return runs.needle(net, length, 0.5, NEEDLE_NEW, seed=seed, **retrieval.SHORT)


def l4_retrieval(inp: str, name: str = MODEL) -> Question:
    from viz import heads as vh

    hay, found = _needle(name, seed_of(inp))
    _, _, _, _, _, _, ind = _repeated(inp, name)
    scores = found.scores
    said_answer = (f"it answered “{esc(' '.join(found.answer.split())[:80])}”: the password {hay.answer} "
                   + ("found" if found.found else "not found"))

    def reveal(p):
        fig = vh.head_grid(scores, "retrieval score", title=f"Retrieval score per head · {len(hay.ids)} tokens, "
                           "the needle halfway<br><sup>the share of the password's tokens each head's strongest "
                           "attention copied from the needle (Wu et al. 2024)</sup>")
        if p is None or not p.startswith("layer "):
            return mark(fig, p)
        a, b = (int(v) for v in p.replace("layer ", "").replace(" head ", ",").split(","))
        return mark(fig, p, b, a)

    heads, best, near, stands_out = head_choices(scores, ind)
    names = [head_name(*h) for h in heads]
    none = f"none stands out: these heads score within {MARGIN:.2f} of each other"
    text = (f"{esc(name)} reads a book of {len(hay.ids)} tokens: the project's own sentences with one *needle* "
            f"hidden halfway (“{esc(hay.needle)}”), then the question “{esc(hay.question)}”. While it writes its "
            "answer, a *retrieval head* attends most strongly to the very needle token it is copying (Wu et al. "
            "2024). **Which head copies the most of the password from the book?**")
    explanation = ("A few heads do the long-range copying: they find the needle however far back it is and paste "
                   "it into the answer, and the answer depends on them (switched off, the needle is lost; Wu et al. "
                   "2024). They are not the induction heads of step 2, though both copy: try the needle search in "
                   "Generate's Retrieval heads section at 4,096 tokens.")
    if not stands_out:
        said = (f"{said_answer}; no head stands out: "
                + ", ".join(f"{head_name(*h)} {float(scores[h]):.2f}" for h in heads))
        return Question(text, [*names, none], none, said, explanation, reveal)
    said = f"{said_answer}; {head_name(*best)} copied {float(scores[best]):.0%} of the password's tokens"
    runner = max(float(scores[h]) for h in heads if h != best)
    said += f", the other heads offered at most {runner:.0%}"
    if near:
        said += "; left out as too close to call: " + ", ".join(f"{head_name(*h)} {float(scores[h]):.2f}"
                                                                for h in near[:4])
    return Question(text, names, head_name(*best), said, explanation, reveal)


LESSON = Lesson(
    "4 · Previous-token and induction heads", "Two heads that together copy a sequence seen once, and the heads "
    "that copy a needle out of a long book.",
           "seed (the random tokens)", "0", (l4_previous, l4_induction, l4_loss, l4_retrieval), models=MODELS)
