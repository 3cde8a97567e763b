"""Lesson 3 · Sinusoidal positions and RoPE."""

from __future__ import annotations

import numpy as np

from tabs.common import get_model
from tabs.course.engine import (
    Lesson,
    Question,
    lm_run,
    mark,
    seed_of,
)


def l3_sinusoid(inp: str) -> Question:
    from models.blocks.positional import sinusoidal_table
    from viz import positional as vp

    n = int(np.clip(seed_of(inp) or 64, 8, 512))
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
                    lambda p: mark(vp.sinusoidal_heatmap(pe), p))


def l3_rope(inp: str) -> Question:
    from models.blocks.positional import rope_demo
    from viz import positional as vp

    _, scores = rope_demo(24, 16, 0, seed=seed_of(inp))
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
                    lambda p: mark(vp.rope_offset_scores(s), p))


def l3_model(inp: str) -> Question:
    from models.analysis import previous_token_score
    from models.inspect.decompose import decompose_score
    from viz import why as vw

    net = get_model("gpt-tiny")
    ids = net.repeated_tokens(20, seed=seed_of(inp))
    _, weights = lm_run("gpt-tiny", tuple(ids))
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
                    lambda p: mark(vw.score_decomposition(d.table, d.parts, d.row, d.softmax_row, tokens, q, q - 1,
                                                           title=f"Layer {layer} head {head} · last token → the one "
                                                                 "before", by_offset=d.by_offset), p))


LESSON = Lesson(
    "3 · Sinusoidal positions and RoPE", "Where a token is: added to the input, or turned inside q·k.",
           "number of positions (sinusoids) and seed (RoPE, repeated tokens)", "64", (l3_sinusoid, l3_rope, l3_model))
