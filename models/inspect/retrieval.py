"""Retrieval heads (Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context Factuality",
arXiv 2404.15574): the heads that copy a needle's tokens out of a long context into the answer, found with a
needle in a haystack, and what the answer becomes with them switched off.

**The haystack** (``haystack``): sentences of the project's own corpus (examples/corpus/text.txt, shuffled and
repeated with a seed) up to about ``length`` prompt tokens, a needle sentence put in at the sentence boundary nearest
the fractional depth ``depth`` (0: first, 1: last), then a question asking for the needle's fact, in Wu et al.'s
words (their needle_in_haystack code): ``<book> … </book> Based on the content of the book, Question: … Answer:``;
a model with a chat template (SmolLM2-135M-Instruct's GGUF file carries one, ``models.io.gguf.chat_prompt``) gets
that as one user turn. The builder returns the prompt's ids with the needle's token span and its answer's (the fact
the question asks for, "tangerine-4817" in the default needle).

**The retrieval score** (Wu et al. §2, eq. 1). The needle k (here: its answer tokens, what Wu et al.'s released
code scores as ``real_needle``) sits at prompt positions i_k. While the model decodes, let w be the token it emits at
a step and a ∈ R^|x| a head's attention at that step (the row of the query that produces w, over the whole context:
prompt and the tokens generated so far). The head *copies and pastes* w when

  (1) w ∈ k, and (2) x_j = w for j = argmax(a), j ∈ i_k

(the key it attends to most is a needle position holding the very token emitted). With g_h the set of needle
tokens head h copied and pasted over the answer,

  retrieval score of h = |g_h ∩ k| / |k|                                                    (Wu et al., eq. 1)

a token-level recall of the needle by the head's most attended key. ``retrieval_score`` computes it from the argmax
keys (a needle position counts once however often it is copied; ``per_step=True`` counts every step that copies, as
the released ``retrieval_calculate`` adds 1/|k| per step: the two agree unless a position is copied twice). The scores
of several lengths × depths are averaged (``survey``) over the runs that found the needle, as the released code
accumulates only answers whose ROUGE-1 recall of the needle passes 50 % (here: the answer contains the fact).

**Where the argmax comes from.** The run prefills the prompt into the long-context store and decodes greedily
(``models.decoding.ondevice.generate``, handed in as ``generate``: models/inspect/ may not import
models/decoding/, docs/ARCHITECTURE.md §1); its ``DeviceAttention`` keeps every layer's post-RoPE queries and keys, so
the answer's rows alone (a few rows × every head over the whole context) are scored from them a layer at a time
(``argmax_keys``): a row's argmax over the keys it may see is the argmax of its masked scores, the softmax being
monotone. No (L, H, T, T) array is ever made.

**Ablation** (Wu et al. §4, their needle_in_haystack_with_mask code): the top-k retrieval heads switched off against
k random non-retrieval heads (seeded), each answer decoded greedily through ``GPT.forward``'s ``head_mask`` with
``KVCache`` caches (fused attention, no weights). As the released code, the prompt's cache is made with every head on
and the heads are off from the last prompt token on, while the answer is decoded (``mask_prompt=True``: over the
prompt too, one prefill per variant).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "examples" / "corpus" / "text.txt"
NEEDLE = "The secret password for the blue door is tangerine-4817."
QUESTION = "What is the secret password for the blue door?"
ANSWER = "tangerine-4817"  # the fact the question asks for (the default needle's)
# a shorter needle and question (``haystack``'s keywords), for a model of a few hundred positions: a haystack still fits
SHORT = {"needle": "The password is tangerine-4817.", "question": "What is the password?", "answer": ANSWER}
# Wu et al.'s question and answer cue (their needle_in_haystack code), the haystack inside <book> tags
PROMPT = "<book>\n{context}\n</book>\nBased on the content of the book, Question: {question}\nAnswer:"
RETRIEVAL = 0.1  # Wu et al.: a head whose score exceeds 0.1 is a retrieval head (the random control avoids them)
NEW_TOKENS = 32  # answer tokens decoded by default
PREFILL_CHUNK = 1024  # prompt tokens a fused forward pass reads at once in the ablation loop (bounded memory)
ROW_BYTES = 64 << 20  # float32 scores of one chunk of answer rows (all heads × all keys) in ``argmax_keys``

Span = tuple[int, int]


# ---------------------------------------------------------------------------------------------------- haystack
@dataclass(frozen=True)
class Haystack:
    """A needle-in-a-haystack prompt: ``ids`` (what the model reads, specials and chat turn included) and where its
    parts are, as [start, end) token positions in ``ids``."""

    ids: list[int]
    text: str  # the prompt as text (the chat turn rendered)
    needle_span: Span  # the needle sentence's tokens
    answer_span: Span  # the answer's tokens inside it (k of Wu et al.'s score)
    context_span: Span  # the haystack's tokens, needle included (between "<book>" and "</book>")
    length: int  # the prompt length asked for (``len(ids)`` is at most this)
    depth: float  # the depth asked for, 0 … 1
    at: float  # where the needle landed: its start's fraction of the context's tokens
    needle: str
    question: str
    answer: str
    chat: bool  # wrapped in the model's chat template
    seed: int

    @property
    def answer_ids(self) -> list[int]:
        """The needle's answer tokens as the prompt holds them."""
        return self.ids[self.answer_span[0]:self.answer_span[1]]

    @property
    def needle_ids(self) -> list[int]:
        return self.ids[self.needle_span[0]:self.needle_span[1]]


def corpus_sentences(path: Path = CORPUS) -> list[str]:
    """The corpus's sentences, one a line (blank lines skipped)."""
    return [s.strip() for s in path.read_text(encoding="utf-8").splitlines() if s.strip()]


def _tokenizer_of(model_or_tokenizer: Any) -> tuple[Any, str | None]:
    if not hasattr(model_or_tokenizer, "tokenizer"):  # a tokenizer itself (models/inputs/tokenizer.py's interface)
        if not hasattr(model_or_tokenizer, "encode_prompt"):
            raise ValueError("haystack needs a language model with a tokenizer, or a tokenizer")
        return model_or_tokenizer, None
    if model_or_tokenizer.tokenizer is None:
        raise ValueError("the model has no tokenizer: a haystack is made of text")
    return model_or_tokenizer.tokenizer, getattr(model_or_tokenizer, "chat_template", None)


def _norm(text: str) -> str:
    return " ".join(text.casefold().split())


def _position(tok: Any, text: str, ids: list[int], char: int, end: bool) -> int:
    """The token boundary of ``ids`` (the encoding of ``text``) at character ``char``: the encoding of the text before
    it is a prefix of ``ids`` where the tokenizer splits there; otherwise a token straddles the boundary and is counted
    in the span (``end``: the span ends after it; else it starts with it)."""
    before = tok.encode_prompt(text[:char])[0]
    common = 0
    for a, b in zip(before, ids):
        if a != b:
            break
        common += 1
    if common == len(before) or not end:
        return common
    return min(len(ids), common + 1)


def _render(tok: Any, template: str | None, content: str) -> tuple[str, int]:
    """The prompt text of one user message and where the message starts in it."""
    if template is None:
        return content, 0
    from models.io.gguf import chat_prompt

    bos = tok.id_to_piece(tok.bos_id) if getattr(tok, "bos_id", -1) >= 0 else ""
    eos = tok.id_to_piece(tok.eos_id) if getattr(tok, "eos_id", -1) >= 0 else ""
    text = chat_prompt(template, content, bos, eos)
    at = text.find(content)
    if at < 0:
        raise ValueError("the model's chat template changes the message's text: the needle cannot be located")
    return text, at


def haystack(model_or_tokenizer: Any, length: int, depth: float = 0.5, needle: str = NEEDLE,
             question: str = QUESTION, seed: int = 0, answer: str | None = None, chat: bool | None = None,
             corpus: Sequence[str] | None = None) -> Haystack:
    """A prompt of at most ``length`` tokens (about that many: whole sentences): the corpus's sentences (``corpus``,
    default examples/corpus/text.txt) shuffled and repeated with ``seed``, ``needle`` inserted at the sentence
    boundary nearest the fractional depth ``depth`` of the haystack's tokens (0: before every sentence, 1: after
    them all), then ``question`` (``PROMPT``). ``answer``: the fact the question asks for, a part of the needle
    (default: "tangerine-4817" for the default needle, else the needle itself). ``chat``: the model's chat template
    around it (None: when the model has one). ValueError for a depth outside [0, 1], a length that cannot hold the
    needle and the question, an answer not in the needle or one the question or the corpus already holds."""
    tok, template = _tokenizer_of(model_or_tokenizer)
    if chat and not template:
        raise ValueError("this model has no chat template (a GGUF file carries one in tokenizer.chat_template)")
    template = template if chat is not False else None
    depth = float(depth)
    if not 0.0 <= depth <= 1.0:  # NaN fails too
        raise ValueError(f"depth must be a fraction of the haystack from 0 (first) to 1 (last), got {depth}")
    needle, question = " ".join(needle.split()), " ".join(question.split())
    if not needle or not question:
        raise ValueError("the needle and the question must not be empty")
    if answer is None:
        answer = ANSWER if needle == NEEDLE else needle.rstrip(".!?")
    answer = " ".join(answer.split())
    if not answer or answer not in needle:
        raise ValueError(f"the answer {answer[:80]!r} is not a part of the needle {needle[:120]!r}")
    if _norm(answer) in _norm(question):
        raise ValueError(f"the question gives the answer {answer[:80]!r} away")
    sentences = list(corpus_sentences() if corpus is None else [" ".join(s.split()) for s in corpus if s.strip()])
    if not sentences:
        raise ValueError("the corpus has no sentences")
    if any(_norm(answer) in _norm(s) for s in sentences):
        raise ValueError(f"the corpus already holds the answer {answer!r}: it would be found without the needle")
    length = int(length)

    def build(parts: list[str]) -> tuple[str, int, int]:
        context = " ".join(parts)
        text, at = _render(tok, template, PROMPT.format(context=context, question=question))
        start = at + PROMPT.index("{context}")
        return text, start, start + len(context)

    bare = len(tok.encode_prompt(build([needle])[0])[0])  # the needle, the question and the wrapper alone
    if length < bare:
        raise ValueError(f"a length of {length:,} tokens is shorter than the needle and the question: they alone take "
                         f"{bare:,} tokens with this model's tokenizer")
    cost: dict[str, int] = {}  # tokens of each sentence, as it reads after a space (an estimate of its share)

    def tokens(s: str) -> int:
        if s not in cost:
            cost[s] = max(1, len(tok.encode(" " + s, add_special=False, max_tokens=1 << 30).ids))
        return cost[s]

    rng = np.random.default_rng(seed)
    order: list[str] = []
    budget, total = length - bare, 0
    while True:  # whole shuffled passes over the corpus until the estimate fills the budget
        for i in rng.permutation(len(sentences)):
            s = sentences[int(i)]
            if total + tokens(s) > budget:
                break
            order.append(s)
            total += tokens(s)
        else:
            continue
        break
    while True:
        cum = np.concatenate([[0], np.cumsum([tokens(s) for s in order])])
        b = int(np.argmin(np.abs(cum - depth * cum[-1])))  # the boundary nearest the depth (first of a tie)
        parts = [*order[:b], needle, *order[b:]]
        text, c0, c1 = build(parts)
        ids = tok.encode_prompt(text)[0]
        if len(ids) <= length or not order:
            break
        excess, drop = len(ids) - length, 0  # the estimate was short: drop sentences from the end and try again
        while order and drop < excess:
            drop += tokens(order.pop())
    if len(ids) > length:
        raise ValueError(f"a length of {length:,} tokens is shorter than the needle and the question "
                         f"({len(ids):,} tokens with this model's tokenizer)")
    n0 = c0 + sum(len(s) + 1 for s in parts[:b])  # the needle's first character
    a0 = n0 + needle.index(answer)
    context = (_position(tok, text, ids, c0, False), _position(tok, text, ids, c1, True))
    span = (_position(tok, text, ids, n0, False), _position(tok, text, ids, n0 + len(needle), True))
    ans = (_position(tok, text, ids, a0, False), _position(tok, text, ids, a0 + len(answer), True))
    width = max(1, context[1] - context[0])
    return Haystack(ids=ids, text=text, needle_span=span, answer_span=ans, context_span=context, length=length,
                    depth=depth, at=(span[0] - context[0]) / width, needle=needle, question=question, answer=answer,
                    chat=template is not None, seed=int(seed))


def found_in(answer_text: str, fact: str) -> bool:
    """Whether an answer states the fact (case and spacing aside)."""
    return _norm(fact) in _norm(answer_text)


def recall(answer_text: str, fact: str) -> float:
    """The share of the fact's words (letters and digits, case aside) the answer holds: ROUGE-1 recall, which Wu et
    al.'s released code asks to pass 0.5 ("tangerine-4817" against "4817": 0.5)."""
    want = Counter(re.findall(r"\w+", fact.casefold()))
    got = Counter(re.findall(r"\w+", answer_text.casefold()))
    total = sum(want.values())
    return sum(min(n, got[w]) for w, n in want.items()) / total if total else 0.0


# ------------------------------------------------------------------------------------------------------ score
def answer_rows(prompt_len: int, total: int) -> list[int]:
    """The query rows that produce the generated tokens prompt_len … total − 1: row p − 1 emits token p."""
    return list(range(prompt_len - 1, total - 1))


def retrieval_score(argmax_keys: np.ndarray, generated_ids: Sequence[int], prompt_ids: Sequence[int], span: Span,
                    per_step: bool = False) -> np.ndarray:
    """Wu et al.'s eq. 1 for every head (module docstring): ``argmax_keys`` (L, H, S) the key each head attends to
    most at the step emitting ``generated_ids[s]`` (S,); ``span`` [start, end) the needle's positions in
    ``prompt_ids``. A head copies and pastes at a step when that key is in the span and holds the emitted token; its
    score is the number of span positions so copied / the span's length (``per_step``: the copying steps / the span's
    length, as the released code counts). (L, H) float64."""
    keys = np.asarray(argmax_keys)
    gen = np.asarray(list(generated_ids), dtype=np.int64)
    prompt = np.asarray(list(prompt_ids), dtype=np.int64)
    start, end = int(span[0]), int(span[1])
    if keys.ndim != 3 or keys.shape[2] != gen.size:
        raise ValueError(f"argmax_keys must be (layers, heads, {gen.size} steps), got {keys.shape}")
    if not 0 <= start < end <= prompt.size:
        raise ValueError(f"the needle span {start}…{end} is not inside the prompt's {prompt.size} tokens")
    inside = (keys >= start) & (keys < end)
    token = np.where(inside, prompt[np.clip(keys, 0, prompt.size - 1)], -1)
    hit = inside & (token == gen[None, None, :])  # (L, H, S)
    if per_step:
        return hit.sum(-1) / (end - start)
    layers, heads, _ = keys.shape
    out = np.zeros((layers, heads))
    for l_ in range(layers):  # the distinct needle positions each head copied
        for h_ in range(heads):
            out[l_, h_] = np.unique(keys[l_, h_][hit[l_, h_]]).size
    return out / (end - start)


@torch.inference_mode()
def argmax_keys(attention: Any, rows: Sequence[int]) -> np.ndarray:
    """(L, H, R) int64: for each of query ``rows`` the key every head attends to most, over every key it may see,
    from a long-context store (``DeviceAttention`` of models/decoding/ondevice.py: its masked scores, a few rows at a
    time, each layer on its own device). Ties go to the first key."""
    rows = [int(r) for r in rows]
    layers = len(attention.q)
    heads = attention.q[0].size(0)
    out = np.zeros((layers, heads, len(rows)), np.int64)
    if not rows:
        return out
    if min(rows) < 0 or max(rows) >= attention.length:
        raise ValueError(f"rows {min(rows)}…{max(rows)} are not all among the store's {attention.length} positions")
    width = max(rows) + 1  # every key a causal row among them may see
    per = max(1, ROW_BYTES // max(1, 4 * heads * width))
    for layer in range(layers):
        dev = attention.q[layer].device
        for a in range(0, len(rows), per):
            r = torch.tensor(rows[a:a + per], device=dev)
            s = attention._scores(layer, r, slice(0, width))  # (H, r, width), masked keys at the float32 minimum
            out[layer, :, a:a + per] = s.argmax(-1).cpu().numpy()
    return out


@dataclass
class Retrieval:
    """One needle run: every head's retrieval score (L, H), the answer and whether it holds the fact."""

    scores: np.ndarray  # (L, H) float64, Wu et al.'s eq. 1 over the answer span
    answer: str  # the generated text
    found: bool  # the answer states the needle's fact
    recall: float  # the share of the fact's words it holds (``recall``)
    needle_span: Span
    answer_span: Span  # k: the span the score reads
    length: int  # the prompt's tokens
    depth: float  # the depth asked for (``at``: where the needle landed)
    at: float
    generated: list[int]  # the new token ids
    keys: np.ndarray  # (L, H, S) each head's most attended key at each answer step
    generation: Any = None  # the LongGeneration (its attention kept on the device: drawn by the Generate views)

    @property
    def ranking(self) -> list[tuple[int, int, float]]:
        return ranking(self.scores)


def ranking(scores: np.ndarray) -> list[tuple[int, int, float]]:
    """Every head as (layer, head, score), highest first (ties: lower layer, then lower head, first)."""
    flat = np.asarray(scores, dtype=np.float64).ravel()
    order = np.argsort(-flat, kind="stable")
    heads = scores.shape[1]
    return [(int(i // heads), int(i % heads), float(flat[i])) for i in order]


def score(hay: Haystack, generation: Any, span: str = "answer", per_step: bool = False) -> Retrieval:
    """The retrieval scores of one generation from ``hay.ids`` (a ``LongGeneration``: ``ids``, ``prompt_len``,
    ``text``, ``attention``). ``span``: "answer" (k = the needle's answer tokens, as the released code's
    ``real_needle``) or "needle" (the whole needle sentence)."""
    if span not in ("answer", "needle"):
        raise ValueError(f"span must be 'answer' or 'needle', got {span!r}")
    p = int(generation.prompt_len)
    if p != len(hay.ids) or list(generation.ids[:p]) != list(hay.ids):
        raise ValueError(f"the generation's prompt is not the haystack's ({p:,} tokens against {len(hay.ids):,}): "
                         "was it cut to the model's context (ATLAS_MAX_TOKENS)?")
    ids = [int(i) for i in generation.ids]
    generated = ids[p:]
    keys = argmax_keys(generation.attention, answer_rows(p, len(ids)))
    k = hay.answer_span if span == "answer" else hay.needle_span
    scores = retrieval_score(keys, generated, hay.ids, k, per_step)
    return Retrieval(scores=scores, answer=generation.text, found=found_in(generation.text, hay.answer),
                     recall=recall(generation.text, hay.answer), needle_span=hay.needle_span, answer_span=k,
                     length=len(hay.ids), depth=hay.depth, at=hay.at, generated=generated, keys=keys,
                     generation=generation)


def fits(model: Any, hay: Haystack, max_new_tokens: int) -> None:
    """ValueError unless the prompt and ``max_new_tokens`` fit the model's context whole (a cut prompt would move
    the needle)."""
    from models import limits

    limit = model.context_limit()
    new = min(int(max_new_tokens), limits.MAX_NEW_TOKENS)
    if len(hay.ids) + new > limit:
        raise ValueError(f"{len(hay.ids):,} prompt tokens and {new} new ones exceed the model's context of "
                         f"{limit:,} tokens (its positions, or ATLAS_MAX_TOKENS={limits.MAX_LM_TOKENS:,})")


def run(model: Any, hay: Haystack, generate: Callable[..., Any], max_new_tokens: int = NEW_TOKENS,
        span: str = "answer", per_step: bool = False, **kw: Any) -> Retrieval:
    """Prefill ``hay`` into the long-context store and decode greedily (``generate``:
    models.decoding.ondevice.generate, called as ``generate(model, ids, max_new_tokens=…, stats=False, pool=False,
    **kw)``), then score every head (``score``)."""
    fits(model, hay, max_new_tokens)
    gen = generate(model, list(hay.ids), max_new_tokens=int(max_new_tokens), stats=False,
                   **{"pool": False, **kw})
    return score(hay, gen, span, per_step)


@dataclass
class Survey:
    """Retrieval scores over several haystacks (lengths × depths), averaged as Wu et al. do."""

    scores: np.ndarray  # (L, H) the mean over ``used`` runs
    runs: list[Retrieval]
    averaged_over: str  # "found" (the runs whose answer held the fact) or "all" (none did, or found_only=False)
    used: int

    @property
    def ranking(self) -> list[tuple[int, int, float]]:
        return ranking(self.scores)


def average(runs: Sequence[Retrieval], found_only: bool = True) -> Survey:
    """The mean score over the runs that found the needle (Wu et al.'s released code keeps only those), or over all
    of them where none did or ``found_only`` is off."""
    if not runs:
        raise ValueError("no runs to average")
    chosen = [r for r in runs if r.found] if found_only else list(runs)
    how = "found" if found_only and chosen else "all"
    chosen = chosen or list(runs)
    return Survey(np.mean([r.scores for r in chosen], axis=0), list(runs), how, len(chosen))


def survey(model: Any, generate: Callable[..., Any], lengths: Sequence[int], depths: Sequence[float],
           needle: str = NEEDLE, question: str = QUESTION, answer: str | None = None, seed: int = 0,
           max_new_tokens: int = NEW_TOKENS, found_only: bool = True, keep: bool = False,
           progress: Callable[[Retrieval], None] | None = None) -> Survey:
    """``run`` over every length × depth (each haystack seeded by ``seed``), averaged (``average``). ``lengths``
    count prompt tokens; ``keep``: keep each run's LongGeneration (its store: memory), else drop it."""
    runs = []
    for n in lengths:
        for d in depths:
            hay = haystack(model, int(n), float(d), needle, question, seed, answer)
            r = run(model, hay, generate, max_new_tokens)
            if not keep:
                r.generation = None
            runs.append(r)
            if progress is not None:
                progress(r)
    return average(runs, found_only)


# --------------------------------------------------------------------------------------------------- ablation
@torch.inference_mode()
def prefill_caches(model: Any, ids: Sequence[int], head_mask: torch.Tensor | None = None,
                   chunk: int | None = None) -> list[Any]:
    """One ``KVCache`` per layer holding ``ids``, read ``chunk`` (PREFILL_CHUNK) tokens a fused forward pass
    (``GPT.forward``)."""
    from models.blocks.attention import KVCache

    chunk = max(1, int(chunk or PREFILL_CHUNK))
    dev = model.embed.weight.device
    caches = [KVCache() for _ in model.blocks]
    ids = [int(i) for i in ids]
    for a in range(0, len(ids), chunk):
        model(torch.tensor([ids[a:a + chunk]], device=dev), caches, head_mask=head_mask, last_only=True)
    return caches


@torch.inference_mode()
def decode(model: Any, caches: list[Any], last: int, max_new_tokens: int,
           head_mask: torch.Tensor | None = None) -> list[int]:
    """Greedy tokens after ``caches`` (the prompt but its last token) and that last token ``last``, each step through
    ``GPT.forward`` with ``head_mask`` (fused attention, no weights); stops after the end-of-sequence token. The caches
    are extended by copies (``KVCache.extend`` concatenates), so the caller's stay as they were."""
    from models.blocks.attention import KVCache

    dev = model.embed.weight.device
    own = [KVCache(c.k, c.v) for c in caches]
    eos, token, out = model.eos_id(), int(last), []
    for _ in range(int(max_new_tokens)):
        logits = model(torch.tensor([[token]], device=dev), own, head_mask=head_mask).logits[0, -1]
        token = int(torch.argmax(logits.float()))
        out.append(token)
        if token == eos:
            break
    return out


def head_mask(model: Any, heads: Sequence[tuple[int, int]]) -> torch.Tensor:
    """(layers, heads) ones with a 0 at each (layer, head) of ``heads``: ``GPT.forward``'s head_mask."""
    c = model.config
    mask = torch.ones(c.n_layers, c.n_heads, device=model.embed.weight.device)
    for layer, head in heads:
        if not (0 <= layer < c.n_layers and 0 <= head < c.n_heads):
            raise ValueError(f"head ({layer}, {head}) is not one of the model's {c.n_layers} × {c.n_heads}")
        mask[layer, head] = 0.0
    return mask


def greedy(model: Any, ids: Sequence[int], max_new_tokens: int = NEW_TOKENS,
           heads: Sequence[tuple[int, int]] = (), mask_prompt: bool = False) -> list[int]:
    """The greedy answer to ``ids`` with ``heads`` switched off while it is decoded (``mask_prompt``: over the prompt
    too)."""
    ids = [int(i) for i in ids]
    if not ids:
        raise ValueError("the prompt is empty")
    mask = head_mask(model, heads) if heads else None
    caches = prefill_caches(model, ids[:-1], mask if mask_prompt else None)
    return decode(model, caches, ids[-1], max_new_tokens, mask)


@dataclass
class Ablated:
    """One answer with some heads switched off."""

    heads: list[tuple[int, int]]
    generated: list[int]
    answer: str
    found: bool
    recall: float


@dataclass
class Ablation:
    """The answer with no head off, with the top-k retrieval heads off and with k random non-retrieval heads off."""

    baseline: Ablated
    top: dict[int, Ablated] = field(default_factory=dict)
    random: dict[int, Ablated] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Plain numbers and words (JSON)."""
        def one(a: Ablated) -> dict[str, Any]:
            return {"heads": [list(h) for h in a.heads], "answer": a.answer, "found": a.found,
                    "recall": round(a.recall, 3)}

        return {"baseline": one(self.baseline), "top": {str(k): one(v) for k, v in self.top.items()},
                "random": {str(k): one(v) for k, v in self.random.items()}}


def random_heads(scores: np.ndarray, k: int, seed: int = 0, threshold: float = RETRIEVAL) -> list[tuple[int, int]]:
    """``k`` heads drawn (seeded by ``seed`` and ``k``) among those outside the top k whose score is under
    ``threshold`` (non-retrieval heads, as Wu et al.'s control), or among all outside the top k if too few are."""
    order = ranking(scores)
    top = {(l_, h_) for l_, h_, _ in order[:k]}
    pool = [(l_, h_) for l_, h_, s in order if (l_, h_) not in top and s < threshold]
    if len(pool) < k:
        pool = [(l_, h_) for l_, h_, _ in order if (l_, h_) not in top]
    if len(pool) < k:
        raise ValueError(f"the model has {len(order)} heads: {k} random ones outside the top {k} do not exist")
    pick = np.random.default_rng([int(seed), int(k)]).choice(len(pool), size=k, replace=False)
    return sorted(pool[int(i)] for i in pick)


def ablation(model: Any, hay: Haystack, scores: np.ndarray, ks: Sequence[int] = (5, 10, 20), seed: int = 0,
             max_new_tokens: int = NEW_TOKENS, mask_prompt: bool = False,
             threshold: float = RETRIEVAL) -> Ablation:
    """The needle's answer with the ``k`` best-scoring heads of ``scores`` (L, H) switched off, and with ``k`` random
    non-retrieval heads (``random_heads``) off, for each k of ``ks``; ``baseline``: every head on, by the same loop."""
    fits(model, hay, max_new_tokens)
    c = model.config
    if tuple(np.shape(scores)) != (c.n_layers, c.n_heads):
        raise ValueError(f"scores must be (layers, heads) = ({c.n_layers}, {c.n_heads}), got {np.shape(scores)}")
    ids = list(hay.ids)
    tok = model.tokenizer
    shared = None if mask_prompt else prefill_caches(model, ids[:-1])

    def answer(heads: list[tuple[int, int]]) -> Ablated:
        mask = head_mask(model, heads) if heads else None
        caches = shared if shared is not None else prefill_caches(model, ids[:-1], mask)
        new = decode(model, caches, ids[-1], max_new_tokens, mask)
        text = tok.decode(new) if tok is not None else ""
        return Ablated(list(heads), new, text, found_in(text, hay.answer), recall(text, hay.answer))

    out = Ablation(answer([]))
    order = ranking(scores)
    for k in ks:
        k = int(k)
        if not 0 < k <= len(order):
            raise ValueError(f"k must be in 1…{len(order)} (the model's heads), got {k}")
        out.top[k] = answer(sorted((l_, h_) for l_, h_, _ in order[:k]))
        out.random[k] = answer(random_heads(scores, k, seed, threshold))
    return out


def describe_heads(heads: Sequence[tuple[int, int, float]]) -> str:
    """"L16H0 0.57, L20H3 0.43": heads and scores in words."""
    return ", ".join(f"L{l_}H{h_} {s:.2f}" for l_, h_, s in heads)


__all__ = ["ANSWER", "NEEDLE", "QUESTION", "Ablated", "Ablation", "Haystack", "Retrieval", "Survey", "ablation",
           "answer_rows", "argmax_keys", "average", "corpus_sentences", "decode", "describe_heads", "found_in",
           "greedy", "haystack", "head_mask", "prefill_caches", "random_heads", "ranking", "recall", "retrieval_score",
           "run", "score", "survey"]
