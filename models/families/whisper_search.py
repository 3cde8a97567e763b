"""Whisper's decoding rules, as the released ``decoding.py`` of openai-whisper applies them, over any function that
gives next-token logits: greedy or beam search, the logit filters (suppressed ids, the begin ids, and in timestamp
mode the timestamp rules) and the ranking of finished beams.

- Filters, in openai-whisper's order, on every step's (B, V) logits:
  1. *begin*: at the first step the config's ``suppress_begin`` ids (a bare space and end-of-text) get −∞;
  2. *suppressed*: the config's ``suppress`` ids get −∞ at every step;
  3. *timestamps* (timestamp mode only): ``<|notimestamps|>`` never; timestamps come in pairs (after a lone
     timestamp only a timestamp or end-of-text, after a pair only text), never decrease, and a segment has a nonzero
     length (after a pair's closing timestamp the next may equal it; otherwise it must exceed the last); the first
     token is a timestamp no later than ``max_initial_timestamp`` seconds; and when the summed probability of all
     timestamps exceeds that of the likeliest text token, only a timestamp may follow.
- Greedy: the argmax of the filtered logits.
- Beam search (``beam_size`` k, ``patience`` p): each beam offers its k + 1 likeliest tokens, the candidates are
  ranked by summed log-probability (float32 sums, as openai-whisper keeps them), those ending in end-of-text are
  set aside as finished (up to round(k·p) of them), the best k others continue; the search stops when round(k·p)
  have finished, or after ``sample_len`` steps (then the best unfinished beams fill the finished set up to k).
  The finished beams are ranked by log-probability ÷ length (no ``length_penalty``), or ÷ ((5 + length) / 6)^α
  (Wu et al. 2016, GNMT's length penalty), length counting the tokens after the prompt before end-of-text.

Tested id for id against openai-whisper's own ``decode`` on the same weights (tests/test_whisper_decoding.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

CHUNK_S = 30  # seconds in one window


@dataclass(frozen=True)
class SearchOptions:
    beam_size: int | None = None  # None: greedy; else the number of beams (openai-whisper's --beam_size)
    patience: float | None = None  # beam search only: round(beam_size · patience) finished beams end it (1.0)
    length_penalty: float | None = None  # None: rank by log-probability / length; α in [0, 1]: GNMT's penalty
    timestamps: bool = False  # decode <|t|> timestamp tokens (the prompt then has no <|notimestamps|>)
    max_initial_timestamp: float | None = 1.0  # seconds: the first timestamp no later than this (None: any)
    sample_len: int | None = None  # most new tokens (None: half the decoder's positions, as openai-whisper)

    def check(self) -> None:
        """Refuses, in words, settings openai-whisper refuses too."""
        if self.beam_size is not None and not (isinstance(self.beam_size, int) and self.beam_size >= 1):
            raise ValueError(f"beam_size must be a whole number ≥ 1, not {self.beam_size!r}")
        if self.patience is not None:
            if self.beam_size is None:
                raise ValueError("patience needs a beam_size (it is a beam-search setting)")
            if not self.patience > 0 or round(self.beam_size * self.patience) < 1:
                raise ValueError(f"patience {self.patience} leaves no finished beam to wait for")
        if self.length_penalty is not None and not 0 <= self.length_penalty <= 1:
            raise ValueError(f"length_penalty (α) must lie in [0, 1], not {self.length_penalty}")
        if self.sample_len is not None and self.sample_len < 0:
            raise ValueError("sample_len must be ≥ 0")


@dataclass(frozen=True)
class Rules:
    """The ids the rules need (from the model's config)."""

    eot: int  # <|endoftext|>
    suppress: tuple[int, ...]  # never produced
    suppress_begin: tuple[int, ...]  # not produced first
    no_timestamps: int | None  # <|notimestamps|>; timestamps start right after it
    n_text_ctx: int  # decoder positions
    n_audio_ctx: int  # encoder positions (a timestamp step is CHUNK_S / n_audio_ctx seconds)

    @property
    def timestamp_begin(self) -> int:
        if self.no_timestamps is None:
            raise ValueError("this vocabulary has no <|notimestamps|> token, so no timestamp tokens")
        return self.no_timestamps + 1


@dataclass(frozen=True)
class Decoded:
    ids: list[int]  # the prompt, then the chosen sequence's tokens (end-of-text appended when it ended there)
    sum_logprob: float  # its summed log-probability (of the filtered distributions, end-of-text included)
    avg_logprob: float  # sum ÷ (tokens + 1), as openai-whisper reports it
    no_speech_prob: float  # the probability of <|nospeech|> at <|startoftranscript|> in the first step
    finished: bool  # whether it ended with end-of-text (not cut at sample_len)


def apply_filters(logits: Tensor, tokens: list[list[int]], sample_begin: int, rules: Rules,
                  options: SearchOptions) -> Tensor:
    """The (B, V) logits with openai-whisper's filters applied, in its order (a new tensor)."""
    logits = logits.float().clone()
    v = logits.shape[-1]
    first = len(tokens[0]) == sample_begin
    if first:
        logits[:, [i for i in rules.suppress_begin if 0 <= i < v]] = float("-inf")
    if rules.suppress:
        logits[:, [i for i in rules.suppress if 0 <= i < v]] = float("-inf")
    if not options.timestamps:
        return logits
    tb, eot = rules.timestamp_begin, rules.eot
    logits[:, rules.no_timestamps] = float("-inf")
    for k, seq in enumerate(tokens):
        sampled = seq[sample_begin:]
        last_ts = len(sampled) >= 1 and sampled[-1] >= tb
        penultimate_ts = len(sampled) < 2 or sampled[-2] >= tb
        if last_ts:
            if penultimate_ts:  # a pair just closed: text must follow
                logits[k, tb:] = float("-inf")
            else:  # a lone timestamp: another timestamp (or end-of-text) must follow
                logits[k, :eot] = float("-inf")
        stamps = [t for t in sampled if t >= tb]
        if stamps:  # never decreasing, and a segment is never empty
            last = stamps[-1] if last_ts and not penultimate_ts else stamps[-1] + 1
            logits[k, tb:last] = float("-inf")
    if first:
        logits[:, :tb] = float("-inf")
        if options.max_initial_timestamp is not None:
            index = round(options.max_initial_timestamp / (CHUNK_S / rules.n_audio_ctx))
            logits[:, tb + index + 1:] = float("-inf")
    logprobs = F.log_softmax(logits, dim=-1)
    for k in range(logits.shape[0]):  # the timestamps together likelier than any text token: a timestamp
        if logprobs[k, tb:].logsumexp(-1) > logprobs[k, :tb].max():
            logits[k, :tb] = float("-inf")
    return logits


def rank(sequences: Sequence[Sequence[int]], logprobs: Sequence[float], length_penalty: float | None) -> int:
    """The index of the best finished sequence (tokens after the prompt, end-of-text left out)."""
    scores = []
    for seq, lp in zip(sequences, logprobs, strict=True):
        n = len(seq)
        penalty = n if length_penalty is None else ((5 + n) / 6) ** length_penalty
        scores.append(lp / penalty if penalty else float("-inf"))
    return int(np.argmax(scores))


LogitsFn = Callable[[Tensor], Tensor]  # (B, T) ids -> (B, T, V) logits


def search(logits_fn: LogitsFn, prompt: Sequence[int], rules: Rules, options: SearchOptions,
           no_speech_id: int | None = None, sot_index: int = 0, device: torch.device | str = "cpu") -> Decoded:
    """Greedy or beam search from ``prompt`` with Whisper's rules; ``logits_fn`` maps (B, T) ids to (B, T, V)."""
    options.check()
    sample_begin = len(prompt)
    sample_len = options.sample_len if options.sample_len is not None else rules.n_text_ctx // 2
    n = options.beam_size or 1
    tokens = [list(prompt) for _ in range(n)]
    sum_logprobs = torch.zeros(n)  # float32, as openai-whisper keeps them
    finished: dict[tuple[int, ...], float] = {}
    max_candidates = round(n * (options.patience or 1.0))
    no_speech = float("nan")
    done = False
    for step in range(sample_len):
        full = logits_fn(torch.tensor(tokens, device=device))
        if step == 0 and no_speech_id is not None and 0 <= no_speech_id < full.shape[-1]:
            no_speech = float(full[0, sot_index].float().softmax(-1)[no_speech_id])
        logits = apply_filters(full[:, -1], tokens, sample_begin, rules, options).cpu()
        if options.beam_size is None:  # greedy
            if tokens[0][-1] == rules.eot:
                break
            nxt = int(logits[0].argmax())
            sum_logprobs[0] += F.log_softmax(logits[0], -1)[nxt]
            tokens[0].append(nxt)
            if nxt == rules.eot:
                done = True
                break
        else:
            tokens, done = _beam_step(tokens, logits, sum_logprobs, finished, n, max_candidates, rules.eot)
            if done:
                break
        if len(tokens[0]) > rules.n_text_ctx:
            break
    if options.beam_size is None:
        seq = tokens[0]
        text = seq[sample_begin:seq.index(rules.eot)] if rules.eot in seq[sample_begin:] else seq[sample_begin:]
        lp = float(sum_logprobs[0])
        return Decoded(list(prompt) + text + ([rules.eot] if done else []), lp, lp / (len(text) + 1), no_speech,
                       done)
    ended = dict(finished)
    if len(ended) < n:  # not enough finished: the best unfinished beams join them (openai-whisper's finalize)
        for j in list(np.argsort(sum_logprobs.numpy()))[::-1]:
            ended[(*tokens[j], rules.eot)] = float(sum_logprobs[j])
            if len(ended) >= n:
                break
    seqs = [list(s) for s in ended]
    texts = [s[sample_begin:s.index(rules.eot, sample_begin)] for s in seqs]
    best = rank(texts, list(ended.values()), options.length_penalty)
    chosen = seqs[best]
    lp = list(ended.values())[best]
    was_finished = tuple(chosen) in finished
    return Decoded(list(prompt) + texts[best] + [rules.eot] if was_finished else list(prompt) + texts[best], lp,
                   lp / (len(texts[best]) + 1), no_speech, was_finished)


def _beam_step(tokens: list[list[int]], logits: Tensor, sum_logprobs: Tensor, finished: dict[tuple[int, ...], float],
               beam_size: int, max_candidates: int, eot: int) -> tuple[list[list[int]], bool]:
    """One step of openai-whisper's BeamSearchDecoder.update for one audio (``sum_logprobs`` updated in place)."""
    logprobs = F.log_softmax(logits.float(), dim=-1)
    scores: dict[tuple[int, ...], float] = {}
    for j in range(beam_size):
        values, ids = logprobs[j].topk(beam_size + 1)
        for logprob, token in zip(values, ids, strict=True):
            scores[(*tokens[j], int(token))] = float(sum_logprobs[j] + logprob)
    new_tokens: list[list[int]] = []
    newly: dict[tuple[int, ...], float] = {}
    for seq in sorted(scores, key=scores.get, reverse=True):
        if seq[-1] == eot:
            newly[seq] = scores[seq]
        else:
            sum_logprobs[len(new_tokens)] = scores[seq]
            new_tokens.append(list(seq))
            if len(new_tokens) == beam_size:
                break
    for seq in sorted(newly, key=newly.get, reverse=True):
        if len(finished) >= max_candidates:
            break
        finished[seq] = newly[seq]
    return new_tokens, len(finished) >= max_candidates


def segments(ids: Sequence[int], timestamp_begin: int, eot: int, duration_s: float, step_s: float = 0.02
             ) -> list[tuple[float, float, list[int]]]:
    """The (start s, end s, text ids) segments of a timestamped sequence (the tokens after the prompt):
    ``<|a|> text <|b|>`` pairs; text after the last timestamp runs to the end of the audio."""
    out: list[tuple[float, float, list[int]]] = []
    start: float | None = None
    text: list[int] = []
    for t in ids:
        if t >= timestamp_begin:
            at = (t - timestamp_begin) * step_s
            if start is None:
                start = at
            else:  # a closing timestamp (an empty pair just moves the start)
                if text:
                    out.append((start, at, text))
                    start, text = None, []
                else:
                    start = at
        elif t < eot:
            if start is None:
                start = out[-1][1] if out else 0.0
            text.append(t)
    if text:
        out.append((start or 0.0, max(duration_s, start or 0.0), text))
    return out
