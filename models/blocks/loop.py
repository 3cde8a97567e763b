"""The one decoding loop (docs/ARCHITECTURE.md §9): what every generator shares, specialised by how a token is run.

A generation is: check and cut the prompt, then (choose a token from the logits, run it) until the end-of-sequence
token or the last new token, then the result. The project's generators differ only in how the tokens are run:

- ``GPT.generate`` (models/families/gpt.py): the model's own forward with a KV cache, the readable reference;
- ``Mamba.generate`` (models/families/mamba.py): the recurrent state, one token at a time;
- ``models.decoding.fastgen``: plain functions over caches allocated once, attention rows written while decoding
  (the CPU's fast path);
- ``models.decoding.ondevice``: the attention kept on the device as queries, keys and log-sum-exps;
- ``models.decoding.lockstep``: several requests as the rows of one batch, advancing by position.

Each keeps one ``Decoding`` per request and calls ``Decoding.choose`` with the logits after its last token, so
the checks, the choice (greedy, or sampled with the request's own seeded generator), each step's candidates and
surprisal, the stopping rule and the result are written once. A single-request generator runs ``Decoding.run``
with its own ``advance(token, position, last) -> logits``; lockstep, whose rows share passes, calls ``choose`` per
row itself. ``tests/test_fastgen.py``, ``tests/test_batching.py`` and ``tests/test_ondevice.py`` hold the
specialisations equal to ``GPT.generate`` field by field.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from models.outputs import AttentionMap, GenerationResult, GenerationStep

CANDIDATES = 5  # the model's most likely next tokens recorded at each step (temperature 1)


def candidates(probs: Tensor, piece: Callable[[int], str], choice: int | None = None) -> tuple[int, GenerationStep]:
    """One step's record: the CANDIDATES most likely next tokens of ``probs`` (V,) and ``choice`` (None: the most
    likely) as a GenerationStep, and the choice. Every generator's steps are recorded by it."""
    top = torch.topk(probs, min(CANDIDATES, probs.numel()))
    top_i, top_v = top.indices.cpu(), top.values.cpu()
    choice = int(top_i[0]) if choice is None else int(choice)
    return choice, GenerationStep([piece(int(i)) for i in top_i], top_v.numpy().astype(np.float32), piece(choice),
                                  float(probs[choice]))

# advance(token, position, last): run the token just chosen at that position; the logits (V,) after it, or None
# when it is the last one (a generator may still run it, for its attention rows)
Advance = Callable[[int, int, bool], "Tensor | None"]


def sample(logits: Tensor, temperature: float, top_k: int, top_p: float, generator: torch.Generator) -> int:
    """One token id from logits (V,) after temperature, top-k and nucleus (top-p, Holtzman et al. 2020) filtering."""
    logits = logits / temperature
    if 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = torch.softmax(sorted_logits, -1).cumsum(-1)
        drop = cum - torch.softmax(sorted_logits, -1) >= top_p  # keep tokens until the mass reaches p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator))


@dataclass
class Decoding:
    """One request being decoded: its ids so far (prompt first), its settings and what each step recorded."""

    model: object  # a decoder with prepare_prompt, eos_id, piece and tokenizer (GPT, Mamba)
    ids: list[int]
    prompt_len: int
    new: int  # tokens to generate at most
    strategy: str
    temperature: float
    top_k: int
    top_p: float
    generator: torch.Generator
    notice: str = ""
    steps: list[GenerationStep] = field(default_factory=list)
    # nats per position (prompt_len + new,): NaN until known; a generator's prompt pass may fill the prompt's part
    surprisal: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    finished: bool = False

    @classmethod
    def start(cls, model, text: str | Sequence[int], max_new_tokens: int = 20, strategy: str = "greedy",
              temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0) -> Decoding:
        """The model's checks and cut (``prepare_prompt``: ValueError for bad settings or an empty prompt)."""
        ids, new, notice = model.prepare_prompt(text, max_new_tokens, strategy, temperature, top_k, top_p)
        return cls(model, ids, len(ids), new, strategy, temperature, top_k, top_p,
                   torch.Generator(device="cpu").manual_seed(int(seed)), notice,
                   surprisal=np.full(len(ids) + new, np.nan, dtype=np.float32), finished=new == 0)

    def choose(self, logits: Tensor) -> int:
        """One step from the logits (V,) after the last token, on any device: the model's top candidates, the
        choice, its surprisal; finished at the end-of-sequence token or the last new token."""
        scores = logits.float()
        sampled = None if self.strategy == "greedy" else sample(scores.cpu(), self.temperature, self.top_k,
                                                                   self.top_p, self.generator)
        choice, step = candidates(torch.softmax(scores, -1), self.model.piece, sampled)
        self.steps.append(step)
        self.surprisal[len(self.ids)] = -float(torch.log_softmax(scores, -1)[choice])
        self.ids.append(choice)
        self.finished = choice == self.model.eos_id() or len(self.steps) == self.new
        return choice

    def run(self, logits: Tensor, advance: Advance) -> None:
        """The loop of a lone request: ``logits`` after the prompt, then choose and advance until finished."""
        while not self.finished:
            choice = self.choose(logits)
            logits = advance(choice, len(self.ids) - 1, self.finished)

    def tokens(self) -> list[str]:
        return [self.model.piece(i) for i in self.ids]

    def text(self) -> str:
        tokenizer = self.model.tokenizer
        return tokenizer.decode(self.ids[self.prompt_len:]) if tokenizer else ""

    def bits(self, surprisal: np.ndarray | None = None) -> np.ndarray:
        """Surprisal in bits per token (T,), NaN for the first: ``surprisal`` (nats) if given, else what the steps
        and the prompt pass recorded."""
        nats = self.surprisal[: len(self.ids)] if surprisal is None else surprisal
        return nats / np.float32(math.log(2))

    def result(self, attention: np.ndarray, surprisal: np.ndarray | None = None) -> GenerationResult:
        """The ``GenerationResult``: ``attention`` (L, H, T, T) over prompt + generated tokens."""
        tokens = self.tokens()
        return GenerationResult(text=self.text(), tokens=tokens, ids=self.ids, prompt_len=self.prompt_len,
                                attention={"decoder": AttentionMap(attention, tokens, list(tokens))},
                                steps=self.steps, surprisal=self.bits(surprisal), notice=self.notice)


def full_surprisal(logits: Tensor, ids: Sequence[int]) -> np.ndarray:
    """Nats of each token after the first under one pass's logits (T, V), NaN first: the surprisal of the
    generators that read every token once more at the end (GPT.generate, Mamba.generate, lockstep)."""
    logp = torch.log_softmax(logits.float(), -1)
    out = np.full(len(ids), np.nan, dtype=np.float32)
    target = torch.tensor(list(ids[1:]), device=logits.device)[:, None]
    out[1:] = (-logp[: len(ids) - 1].gather(1, target)[:, 0]).cpu().numpy()
    return out
