"""Lesson 9 · Mamba's hidden attention against a Transformer's.

mamba-tiny (a selective state-space model, no attention) and gpt-tiny (a Transformer) were trained on the same text
with the same tokeniser, so they read the same pieces of a sentence. Mamba's *implicit attention* (Ali, Zimerman &
Wolf 2024) is α[d, t, j] = C_t · (Π_{k=j+1..t} Ā_k[d]) · B̄_j[d]: signed and unnormalised. What this lesson draws and
measures for Mamba is |α| averaged over **all** its channels, each layer's row then divided by its sum, and the
layers averaged (``mamba_rows``); for gpt-tiny, the softmax rows averaged over heads and layers. Both are (T, T) maps
whose rows sum to 1, and every verdict is a sum of the cells the figures draw:

- first-token share: the mean, over the queries after the first token, of the row's weight on position 0 (``<s>``);
- nearest and farthest third: for a query at t with t + 1 visible keys (itself included) and k = ⌊(t + 1)/3⌋, the
  row's weight on its k nearest keys and on its k farthest, averaged over the queries with at least three keys.
"""

from __future__ import annotations

import functools

import numpy as np

from examples import sentences
from tabs.common import get_model
from tabs.course.engine import Lesson, Question, lm_run, mark, sentence
from viz import attention as va
from viz import why as vw
from viz.common import esc

MAMBA, GPT = "mamba-tiny", "gpt-tiny"
MARGIN = 0.05  # shares closer than this are "about the same"
HOW = ("Mamba's map is |α| averaged over all its channels, each row divided by its sum, layers averaged; gpt-tiny's "
       "is its softmax rows averaged over heads and layers")


@functools.lru_cache(maxsize=32)
def mamba_rows(net, ids: tuple[int, ...]) -> np.ndarray:
    """(L, T, T) float64: per layer, |α| averaged over every channel, each row divided by its sum (the raw α is
    signed and no row of it sums to anything in particular)."""
    import torch

    from models.families.mamba import heatmap, implicit_attention

    with torch.no_grad():
        traces = net(torch.tensor([list(ids)], device=net.embed.weight.device), keep_trace=True).traces
        maps = [heatmap(implicit_attention(tr, net._a(i))) for i, tr in enumerate(traces)]
    return np.stack([m.double().cpu().numpy() for m in maps])


def _setup(inp: str):
    """(tokens, Mamba's (L, T, T), gpt-tiny's (L, T, T)) on the sentence, cut to what both models read."""
    gpt, mamba = get_model(GPT), get_model(MAMBA)
    text = sentence(inp, sentences.TRANSLATE[0])
    ids, tokens = gpt.encode_prompt(text)
    if mamba.encode_prompt(text)[0] != ids:
        raise ValueError("mamba-tiny and gpt-tiny do not split this sentence into the same tokens")
    limit = min(gpt.context_limit(), mamba.context_limit())
    ids, tokens = ids[:limit], tokens[:limit]
    if len(ids) < 4:
        raise ValueError("the sentence needs at least three tokens after the first")
    _, weights = lm_run(GPT, tuple(ids))
    return list(tokens), mamba_rows(mamba, tuple(ids)), weights.astype(np.float64).mean(1)


def first_share(rows: np.ndarray) -> np.ndarray:
    """(..., T, T) -> (...): mean weight on position 0 over the queries after it."""
    return rows[..., 1:, 0].mean(-1)


def thirds(rows: np.ndarray) -> tuple[float, float]:
    """(T, T) rows -> (nearest third's share, farthest third's share), averaged over queries with ≥ 3 keys."""
    near, far = [], []
    for t in range(2, rows.shape[0]):
        k = (t + 1) // 3
        near.append(rows[t, t + 1 - k : t + 1].sum())
        far.append(rows[t, :k].sum())
    return float(np.mean(near)), float(np.mean(far))


def without_first(rows: np.ndarray) -> np.ndarray:
    """(T, T) rows with the first key left out and each row from query 1 on divided by its new sum: how the rest is
    spread once the first-token sink (step 1's question) is set aside. Row 0, which sees only key 0, becomes 0."""
    out = np.array(rows, dtype=np.float64)
    out[:, 0] = 0.0
    sums = out.sum(-1, keepdims=True)
    return np.divide(out, sums, out=np.zeros_like(out), where=sums > 0)


def _compare(a: float, b: float, choices: list[str]) -> str:
    """choices[0] when a exceeds b by MARGIN or more, choices[1] when b exceeds a so, else choices[2]."""
    return choices[0] if a - b >= MARGIN else choices[1] if b - a >= MARGIN else choices[2]


def l9_sink(inp: str) -> Question:
    tokens, mamba, gpt = _setup(inp)
    per_m, per_g = first_share(mamba), first_share(gpt)
    m, g = float(per_m.mean()), float(per_g.mean())
    choices = ["gpt-tiny's share is larger (by 5 points or more)", "mamba-tiny's share is larger (by 5 points or more)",
               "about the same (within 5 points)"]
    answer = _compare(g, m, choices)
    n = max(len(per_m), len(per_g))
    pad = lambda v: np.concatenate([v, np.full(n - len(v), np.nan)])  # noqa: E731 (layer counts may differ)
    labels = [f"layer {i}" for i in range(n)] + ["all layers"]

    def reveal(p):
        fig = vw.change_bars(labels, np.append(pad(per_g), g), np.append(pad(per_m), m), unit="share of the row",
                             title=esc("Weight on the first token <s>, mean over the queries after it"),
                             names=(GPT, MAMBA))
        fig.update_layout(width=820)  # room for the title and the prediction under it
        return mark(fig, p)

    return Question("gpt-tiny (a Transformer) and mamba-tiny (a state-space model, no attention) read the same "
                    f"sentence, split into the same {len(tokens)} tokens. Mamba has an attention hidden in its scan "
                    "(Ali et al. 2024); both models' maps here have rows summing to 1. **Averaged over the layers, "
                    "which model puts more of each row's weight on the first token `<s>`?**", choices, answer,
                    f"first-token share {g:.1%} (gpt-tiny) against {m:.1%} (mamba-tiny); {HOW}",
                    "A softmax row must spend all its weight somewhere, and Transformers learn to park what they do "
                    "not need on the first token, an attention sink. Mamba's α is a product of decays that nothing "
                    "forces to sum to 1, so it has no reason to keep a sink.", reveal)


def l9_mamba(inp: str) -> Question:
    tokens, mamba, _ = _setup(inp)
    rows = mamba.mean(0)
    near, far = thirds(rows)
    choices = ["the nearest third", "the farthest third", "neither (within 0.05)"]
    answer = _compare(near, far, choices)

    def reveal(p):
        fig = va.attention_heatmap(rows, tokens, tokens, autoscale=True,
                                   title=f"mamba-tiny's implicit attention (nearest third {near:.2f}, farthest "
                                         f"third {far:.2f})")
        return mark(fig, p)

    return Question("Now only mamba-tiny. Cut the tokens a row can see (itself included) into thirds by distance. "
                    "**Does its implicit attention put more weight on the nearest third or the farthest third?**",
                    choices, answer,
                    f"nearest third {near:.2f} against farthest third {far:.2f} of each row, on average; {HOW}",
                    "Each step multiplies the state by exp(Δ·A) with A negative, so what a token wrote fades with "
                    "every token after it unless the selection (a large Δ) or a slow channel keeps it. The heatmap "
                    "shows that decay as weight hugging the diagonal.", reveal)


def l9_side_by_side(inp: str) -> Question:
    tokens, mamba, gpt = _setup(inp)
    # step 1 measured the first token; here it is left out, so the sink cannot decide which looks farther back
    m_rows, g_rows = without_first(mamba.mean(0)), without_first(gpt.mean(0))
    (mn, mf), (gn, gf) = thirds(m_rows[1:, 1:]), thirds(g_rows[1:, 1:])
    choices = ["gpt-tiny looks farther back than mamba-tiny", "mamba-tiny looks farther back than gpt-tiny",
               "they look back about as far"]
    answer = _compare(gf - gn, mf - mn, choices)

    def reveal(p):
        top = float(max(m_rows[2:].max(), g_rows[2:].max()))
        fig = va.heatmaps_side_by_side(
            [m_rows, g_rows], [tokens, tokens],
            [f"mamba-tiny: near {mn:.2f}, far {mf:.2f}", f"gpt-tiny: near {gn:.2f}, far {gf:.2f}"],
            title="The same sentence without the first token (rows rescaled): Mamba's implicit attention and a "
                  f"Transformer's, layers averaged (colours up to {top:.2f})", zmax=top)
        return mark(fig, p)

    return Question("Beside it, gpt-tiny's attention on the same tokens (heads and layers averaged). Leave the first "
                    "token `<s>` out (step 1 measured it) and rescale each row to sum to 1; measure how far back each "
                    "model looks as the farthest third's share minus the nearest third's. **Which looks farther "
                    "back?**", choices, answer,
                    f"without the first token, farthest minus nearest third: gpt-tiny {gf:.2f} − {gn:.2f} = "
                    f"{gf - gn:+.2f}, mamba-tiny {mf:.2f} − {mn:.2f} = {mf - mn:+.2f}; {HOW}",
                    "A Transformer can reach any earlier token at the same cost, so its heads can read far back even "
                    "without the sink. Mamba carries the past in a fixed-size state that decays, so its hidden "
                    "attention fades with distance: the price of linear time.", reveal)


LESSON = Lesson(
    "9 · Mamba's hidden attention", "What a state-space model's implicit attention looks like beside a "
    "Transformer's on the same sentence: decay with distance, and no sink.", "sentence", sentences.TRANSLATE[0],
    (l9_sink, l9_mamba, l9_side_by_side))
