"""Lesson 2 · Causal and padding masks."""

from __future__ import annotations

import numpy as np

from examples import sentences
from tabs.common import get_model
from tabs.course.engine import (
    Lesson,
    Question,
    attention_steps,
    lm_run,
    mark,
    seed_of,
    sentence,
)
from viz import attention as va


def l2_causal(inp: str) -> Question:
    from viz import playground as pg

    s = attention_steps(seed_of(inp), "causal")
    seen = np.flatnonzero(s.allowed[3])
    choices = ["t0–t3", "t3–t5", "all six", "t3 only"]
    ranges = {"t0–t3": [0, 1, 2, 3], "t3–t5": [3, 4, 5], "all six": list(range(6)), "t3 only": [3]}
    answer = next(c for c, r in ranges.items() if list(seen) == r)
    return Question("A decoder uses a **causal** mask. **Which keys may query t3 attend to?**", choices, answer,
                    f"query t3 gives weight to keys {', '.join(f't{j}' for j in np.flatnonzero(s.weights[3] > 0))}",
                    "A causal mask sets every score above the diagonal to −∞ before the softmax, so a token sees only "
                    "itself and the tokens before it. That is what lets a language model be trained on all positions "
                    "at once without reading the answer.", lambda p: mark(pg.playground_figure(s), p, note="row t3"))


def l2_padding(inp: str) -> Question:
    from viz import playground as pg

    s = attention_steps(seed_of(inp), "padding")
    pad = ~s.allowed[0]
    share = float(s.weights[:, pad].sum(1).max())
    choices = ["none at all", "a little, less than the real keys", "as much as any real key"]
    answer = choices[0] if share == 0 else choices[1] if share < s.weights[:, ~pad].mean() else choices[2]
    return Question("The last key is **padding** (a filler that makes sentences of a batch the same length). **How "
                    "much attention does it get?**", choices, answer,
                    f"the largest weight any query gives the padding key: {share:.3g}",
                    "A padding mask removes the filler's column before the softmax, so it gets exactly zero and the "
                    "real keys share all of the weight. Without it, a sentence's answer would depend on how long the "
                    "other sentences in its batch were.", lambda p: mark(pg.playground_figure(s), p))


def l2_model(inp: str) -> Question:
    net = get_model("gpt-tiny")
    ids, tokens = net.encode_prompt(sentence("", sentences.TRANSLATE[0]))
    _, weights = lm_run("gpt-tiny", tuple(ids))
    above = float(np.triu(weights, 1).max())
    choices = ["never", "only in the last layer", "often"]
    answer = choices[0] if above == 0 else choices[2]
    return Question("Now a real decoder, gpt-tiny, on one sentence. **Does any of its heads ever attend to a token "
                    "that comes later?**", choices, answer,
                    f"the largest weight above the diagonal, over {weights.shape[0]} layers × {weights.shape[1]} heads:"
                    f" {above:.3g}",
                    "The causal mask is part of every layer of a decoder, not a habit the model learns. The upper "
                    "triangle of every map is exactly empty.",
                    lambda p: mark(va.attention_heatmap(weights, tokens, tokens, layer=weights.shape[0] - 1,
                                                         head="mean", kind="gpt-tiny · decoder self-attention"), p))


LESSON = Lesson(
    "2 · Causal and padding masks", "What a token may not see, and how a mask enforces it.",
           "seed (random Q, K, V)", "0", (l2_causal, l2_padding, l2_model))
