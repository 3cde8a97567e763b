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

Another recurrent model takes mamba-tiny's place when the input starts with its name, "my-rwkv: A man …": any Generate
model whose maps are implicit attention (``models.registry``'s ``implicit``: a configured RWKV folder, whose WKV is a
softmax per channel, models/families/rwkv.py; another Mamba). Its map is the one Generate draws for it
(``implicit_attention``, layers averaged) on its own tokens of the sentence; the verdicts set it against gpt-tiny, and
step 3 draws mamba-tiny beside both.
"""

from __future__ import annotations

import dataclasses
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


@functools.lru_cache(maxsize=32)
def implicit_rows(net, ids: tuple[int, ...]) -> np.ndarray:
    """(L, T, T) float64: the map Generate draws for a recurrent model (``implicit_attention``; rows sum to 1)."""
    return net.implicit_attention(list(ids))[:, 0].astype(np.float64)


def recurrent_choice(inp: str) -> tuple[str, str]:
    """(the recurrent model's catalogue name, the sentence): "NAME: sentence" where NAME is a Generate model whose maps
    are implicit attention (a configured RWKV folder, say), else (mamba-tiny, the input as given)."""
    from serving import catalogue

    key, sep, rest = (inp or "").partition(":")
    name = key.strip()
    if sep and name != MAMBA and name in catalogue.names("generate"):
        family = catalogue.family(name)
        if family is not None and family.implicit:
            return name, rest
    return MAMBA, inp


@dataclasses.dataclass(frozen=True)
class Pair:
    """The recurrent model (``name``) and gpt-tiny on one sentence: each one's tokens and (L, T, T) rows."""

    name: str
    tokens: list[str]
    rows: np.ndarray
    gpt_tokens: list[str]
    gpt_rows: np.ndarray

    @property
    def same_tokens(self) -> bool:
        return self.tokens == self.gpt_tokens

    @property
    def how(self) -> str:
        return HOW if self.name == MAMBA else (f"{self.name}'s map is the one Generate draws for it "
                                               f"({get_model(self.name).IMPLICIT}), layers averaged; gpt-tiny's is "
                                               "its softmax rows averaged over heads and layers")


def _cut(net, text: str) -> tuple[list[int], list[str]]:
    ids, tokens = net.encode_prompt(text)
    limit = net.context_limit() if net is not None else len(ids)
    return ids[:limit], list(tokens[:limit])


def _pair(inp: str) -> Pair:
    """The recurrent model the input names (mamba-tiny by default) and gpt-tiny on the sentence. mamba-tiny reads
    gpt-tiny's tokens (the same SentencePiece model) and is cut to what both read; another model reads its own."""
    name, text = recurrent_choice(inp)
    gpt, rec = get_model(GPT), get_model(name)
    text = sentence(text, sentences.TRANSLATE[0])
    ids, tokens = gpt.encode_prompt(text)
    if name == MAMBA:
        if rec.encode_prompt(text)[0] != ids:
            raise ValueError("mamba-tiny and gpt-tiny do not split this sentence into the same tokens")
        limit = min(gpt.context_limit(), rec.context_limit())
        ids, tokens = ids[:limit], list(tokens[:limit])
        rec_ids, rec_tokens = ids, tokens
    else:
        ids, tokens = _cut(gpt, text)
        rec_ids, rec_tokens = _cut(rec, text)
    if min(len(ids), len(rec_ids)) < 4:
        raise ValueError("the sentence needs at least three tokens after the first")
    _, weights = lm_run(GPT, tuple(ids))
    rows = mamba_rows(rec, tuple(rec_ids)) if name == MAMBA else implicit_rows(rec, tuple(rec_ids))
    return Pair(name, list(rec_tokens), rows, list(tokens), weights.astype(np.float64).mean(1))


def _setup(inp: str):
    """(tokens, the recurrent model's (L, T, T), gpt-tiny's (L, T, T)) on the sentence (mamba-tiny's: the same
    tokens as gpt-tiny's)."""
    p = _pair(inp)
    return p.tokens, p.rows, p.gpt_rows


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


def _about(p: Pair) -> tuple[str, str]:
    """(what the recurrent model is, in words; how the two read the sentence) for the steps' texts."""
    if p.name == MAMBA:
        return "mamba-tiny (a state-space model, no attention)", f"split into the same {len(p.tokens)} tokens"
    kind = f"{p.name} (a recurrent model, no attention: {get_model(p.name).IMPLICIT})"
    split = (f"split into the same {len(p.tokens)} tokens" if p.same_tokens else
             f"each split by its own tokeniser ({len(p.gpt_tokens)} tokens for gpt-tiny, {len(p.tokens)} for "
             f"{p.name})")
    return kind, split


def l9_sink(inp: str) -> Question:
    p = _pair(inp)
    name, mamba, gpt = p.name, p.rows, p.gpt_rows
    per_m, per_g = first_share(mamba), first_share(gpt)
    m, g = float(per_m.mean()), float(per_g.mean())
    choices = ["gpt-tiny's share is larger (by 5 points or more)", f"{name}'s share is larger (by 5 points or more)",
               "about the same (within 5 points)"]
    answer = _compare(g, m, choices)
    n = max(len(per_m), len(per_g))
    pad = lambda v: np.concatenate([v, np.full(n - len(v), np.nan)])  # noqa: E731 (layer counts may differ)
    labels = [f"layer {i}" for i in range(n)] + ["all layers"]
    first = "`<s>`" if p.same_tokens else "(each model's own)"
    kind, split = _about(p)

    def reveal(pr):
        fig = vw.change_bars(labels, np.append(pad(per_g), g), np.append(pad(per_m), m), unit="share of the row",
                             title=esc("Weight on the first token" + (" <s>" if p.same_tokens else "") +
                                       ", mean over the queries after it"), names=(GPT, name))
        fig.update_layout(width=820)  # room for the title and the prediction under it
        return mark(fig, pr)

    if name == MAMBA:
        hidden = "Mamba has an attention hidden in its scan (Ali et al. 2024)"
        why = ("A softmax row must spend all its weight somewhere, and Transformers learn to park what they do "
               "not need on the first token, an attention sink. Mamba's α is a product of decays that nothing "
               "forces to sum to 1, so it has no reason to keep a sink.")
    else:
        hidden = f"{name} has an attention hidden in its recurrence"
        why = ("A softmax row must spend all its weight somewhere, and Transformers learn to park what they do "
               "not need on the first token, an attention sink. A recurrence's hidden attention decays with every "
               "token read (RWKV's WKV is a softmax per channel, but each channel's score falls by its decay w per "
               "token of distance), so only its slowest channels can keep the first token.")
    return Question(f"gpt-tiny (a Transformer) and {kind} read the same sentence, {split}. {hidden}; both models' "
                    "maps here have rows summing to 1. **Averaged over the layers, which model puts more of each "
                    f"row's weight on the first token {first}?**",
                    choices, answer, f"first-token share {g:.1%} (gpt-tiny) against {m:.1%} ({name}); {p.how}",
                    why, reveal)


def l9_mamba(inp: str) -> Question:
    p = _pair(inp)
    name, tokens = p.name, p.tokens
    rows = p.rows.mean(0)
    near, far = thirds(rows)
    choices = ["the nearest third", "the farthest third", "neither (within 0.05)"]
    answer = _compare(near, far, choices)

    def reveal(pr):
        fig = va.attention_heatmap(rows, tokens, tokens, autoscale=True,
                                   title=f"{name}'s implicit attention (nearest third {near:.2f}, farthest "
                                         f"third {far:.2f})")
        return mark(fig, pr)

    why = ("Each step multiplies the state by exp(Δ·A) with A negative, so what a token wrote fades with "
           "every token after it unless the selection (a large Δ) or a slow channel keeps it. The heatmap "
           "shows that decay as weight hugging the diagonal.") if name == MAMBA else (
           "Each step decays what the state holds (RWKV: by e^−w per channel, its score falling linearly with the "
           "distance), so what a token wrote fades with every token after it unless a slow channel keeps it. The "
           "heatmap shows that decay as weight hugging the diagonal.")
    return Question(f"Now only {name}. Cut the tokens a row can see (itself included) into thirds by distance. "
                    "**Does its implicit attention put more weight on the nearest third or the farthest third?**",
                    choices, answer,
                    f"nearest third {near:.2f} against farthest third {far:.2f} of each row, on average; {p.how}",
                    why, reveal)


def l9_side_by_side(inp: str) -> Question:
    p = _pair(inp)
    name = p.name
    # step 1 measured the first token; here it is left out, so the sink cannot decide which looks farther back
    m_rows, g_rows = without_first(p.rows.mean(0)), without_first(p.gpt_rows.mean(0))
    (mn, mf), (gn, gf) = thirds(m_rows[1:, 1:]), thirds(g_rows[1:, 1:])
    choices = [f"gpt-tiny looks farther back than {name}", f"{name} looks farther back than gpt-tiny",
               "they look back about as far"]
    answer = _compare(gf - gn, mf - mn, choices)
    maps, tokens = [m_rows, g_rows], [p.tokens, p.gpt_tokens]
    titles = [f"{name}: near {mn:.2f}, far {mf:.2f}", f"gpt-tiny: near {gn:.2f}, far {gf:.2f}"]
    if name != MAMBA:  # mamba-tiny beside both, on gpt-tiny's tokens (its own)
        mamba = _pair(sentence(recurrent_choice(inp)[1], sentences.TRANSLATE[0]))
        b_rows = without_first(mamba.rows.mean(0))
        bn, bf = thirds(b_rows[1:, 1:])
        maps.insert(1, b_rows)
        tokens.insert(1, mamba.tokens)
        titles.insert(1, f"{MAMBA}: near {bn:.2f}, far {bf:.2f}")

    def reveal(pr):
        top = float(max(m[2:].max() for m in maps))
        what = ("Mamba's implicit attention and a Transformer's" if name == MAMBA else
                f"{name}'s and mamba-tiny's implicit attention and a Transformer's")
        fig = va.heatmaps_side_by_side(
            maps, tokens, titles,
            title=f"The same sentence without the first token (rows rescaled): {what}, layers averaged (colours up "
                  f"to {top:.2f})", zmax=top)
        return mark(fig, pr)

    same = "the same tokens" if p.same_tokens else "the same sentence"
    fact = (f"without the first token, farthest minus nearest third: gpt-tiny {gf:.2f} − {gn:.2f} = {gf - gn:+.2f}, "
            f"{name} {mf:.2f} − {mn:.2f} = {mf - mn:+.2f}; {p.how}")
    why = ("A Transformer can reach any earlier token at the same cost, so its heads can read far back even without "
           "the sink. " + ("Mamba carries the past in a fixed-size state that decays, so its hidden attention fades "
                           "with distance: the price of linear time." if name == MAMBA else
                           f"{name} carries the past in a fixed-size state that decays, so its hidden attention "
                           "fades with distance: the price of linear time."))
    first = " `<s>`" if p.same_tokens else ""
    return Question(f"Beside it, gpt-tiny's attention on {same} (heads and layers averaged). Leave the first "
                    f"token{first} out (step 1 measured it) and rescale each row to sum to 1; measure how far back "
                    "each model looks as the farthest third's share minus the nearest third's. **Which looks farther "
                    "back?**", choices, answer, fact, why, reveal)


LESSON = Lesson(
    "9 · Mamba's hidden attention", "What a state-space model's implicit attention looks like beside a "
    "Transformer's on the same sentence: decay with distance, and no sink. Start the sentence with the name of a "
    "configured recurrent model (\"my-rwkv: A man …\", an RWKV folder) to set it in mamba-tiny's place.", "sentence",
    sentences.TRANSLATE[0],
    (l9_sink, l9_mamba, l9_side_by_side))
