"""Word timings from cross-attention, the way Whisper's released code finds them (its ``timing.py``; the method
is described in the Whisper repository's notes on word-level timestamps), re-implemented here from that description:

1. the cross-attention of the chosen heads (the checkpoint's *alignment heads*, or any head, layer or set) for the
   rows that predict the text: the ``<|notimestamps|>`` row (it predicts the first text token) through the last text
   token's row (it predicts end-of-text); each row renormalised over the encoder positions that hold audio (the
   padding after the recording is left out, as a softmax over those positions alone would be);
2. z-normalised per head and frame over the tokens (mean 0, standard deviation 1 down each column), so a frame that
   every token attends to does not win every token;
3. a median filter of width 7 along time (reflection at the ends);
4. averaged over the heads, and a dynamic-time-warping path through the negated matrix (``dtw``: steps down,
   right or diagonal, ties broken towards a horizontal step, as the released code does);
5. a token's start is the frame where the path first reaches its row; a word (tokens split on leading spaces and
   punctuation, multi-byte characters kept whole) runs from its first token's start to the next word's start, the
   last word to the start of the end-of-text row. Leading punctuation joins the following word and trailing
   punctuation the previous one, keeping that word's times.

Times are in seconds: one encoder position is 20 ms. The DTW is tested against a brute-force search over all paths,
the median filter against ``scipy.ndimage`` (tests/test_word_timing.py).
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

FRAME_S = 0.02  # seconds per encoder position
MEDFILT = 7  # width of the median filter along time
PREPENDED = "\"'“¿([{-"  # punctuation that belongs to the next word
APPENDED = "\"'.。,，!！?？:：”)]}、"  # punctuation that belongs to the word before


@dataclass(frozen=True)
class WordTiming:
    word: str  # as decoded, with its leading space
    start: float  # seconds
    end: float  # seconds
    tokens: tuple[int, ...]  # indices into the text tokens (0 = the first generated token)


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotone path from (0, 0) to (N − 1, M − 1) through ``cost`` (N, M) with steps (1, 1), (1, 0)
    and (0, 1): (row indices, column indices) along it. Ties prefer the horizontal step, then the vertical one
    (a diagonal step only when strictly cheaper than both)."""
    cost = np.asarray(cost, dtype=np.float64)
    n, m = cost.shape
    acc = np.full((n + 1, m + 1), np.inf)
    acc[0, 0] = 0.0
    trace = np.full((n + 1, m + 1), -1, dtype=np.int8)
    for j in range(1, m + 1):
        for i in range(1, n + 1):
            c0, c1, c2 = acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1]
            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            acc[i, j] = cost[i - 1, j - 1] + c
            trace[i, j] = t
    trace[0, :], trace[:, 0] = 2, 1
    i, j, rows, cols = n, m, [], []
    while i > 0 or j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        t = trace[i, j]
        if t == 0:
            i, j = i - 1, j - 1
        elif t == 1:
            i -= 1
        else:
            j -= 1
    return np.array(rows[::-1]), np.array(cols[::-1])


def median_filter(x: np.ndarray, width: int = MEDFILT) -> np.ndarray:
    """The median of each ``width`` window along the last axis, the ends padded by reflection (without repeating
    the edge sample); a series shorter than the padding is left as it is."""
    x = np.asarray(x)
    pad = width // 2
    if width <= 1 or x.shape[-1] <= pad:
        return x.copy()
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)
    return np.median(windows, axis=-1).astype(x.dtype)


def alignment_matrix(cross: np.ndarray, heads: Sequence[tuple[int, int]], rows: slice, n_frames: int,
                     medfilt: int = MEDFILT) -> np.ndarray:
    """(tokens, frames): steps 1-4's matrix before the path, from cross-attention (L, H, T, S)."""
    if not heads:
        raise ValueError("no heads to align with")
    w = np.stack([cross[layer, head, rows, :n_frames] for layer, head in heads]).astype(np.float64)
    w = w / np.maximum(w.sum(-1, keepdims=True), 1e-12)  # the softmax over the audio's positions alone
    mean, std = w.mean(axis=-2, keepdims=True), w.std(axis=-2, keepdims=True)
    w = (w - mean) / np.maximum(std, 1e-12)
    return median_filter(w, medfilt).mean(axis=0)


def split_words(tokens: Sequence[int], decode: Any, eot: int) -> list[tuple[str, list[int]]]:
    """Text tokens -> words (str, token indices): a token that starts with a space, is punctuation or is special
    starts a word; tokens that decode to part of a multi-byte character stay with the ones that complete it."""
    pieces: list[tuple[str, list[int]]] = []
    current: list[int] = []
    for k in range(len(tokens)):
        current.append(k)
        text = decode([tokens[i] for i in current])
        if "\ufffd" not in text or k == len(tokens) - 1:
            pieces.append((text, current))
            current = []
    words: list[tuple[str, list[int]]] = []
    for text, idx in pieces:
        special = tokens[idx[0]] >= eot
        if special or text.startswith(" ") or text.strip() in string.punctuation or not words:
            words.append((text, list(idx)))
        else:
            words[-1] = (words[-1][0] + text, words[-1][1] + idx)
    return words


def _merge_punctuation(words: list[WordTiming]) -> list[WordTiming]:
    out = list(words)
    for i in range(len(out) - 2, -1, -1):  # leading punctuation joins the word after it
        w = out[i]
        if w.word.startswith(" ") and w.word.strip() in PREPENDED and i + 1 < len(out) and w.word.strip():
            nxt = out[i + 1]
            out[i + 1] = WordTiming(w.word + nxt.word, nxt.start, nxt.end, w.tokens + nxt.tokens)
            out[i] = WordTiming("", w.start, w.start, ())
    out = [w for w in out if w.word]
    merged: list[WordTiming] = []
    for w in out:  # trailing punctuation joins the word before it
        if merged and not merged[-1].word.endswith(" ") and w.word in APPENDED:
            p = merged[-1]
            merged[-1] = WordTiming(p.word + w.word, p.start, p.end, p.tokens + w.tokens)
        else:
            merged.append(w)
    return merged


def text_ids(result: Any, eot: int) -> list[int]:
    """The generated text tokens of a ``SpeechResult``: after the prompt, up to end-of-text or any special token."""
    text = list(result.ids[result.prompt_len:])
    return text[: next((k for k, t in enumerate(text) if t >= eot), len(text))]


def audio_frames(result: Any) -> int:
    """Encoder positions that hold the recording (the rest of the 30 s window is padding)."""
    return max(1, min(int(round(result.duration_s / FRAME_S)), result.attention["cross"].weights.shape[-1]))


def alignment(result: Any, eot: int, heads: Sequence[tuple[int, int]] | None = None, medfilt: int = MEDFILT
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(matrix (len(text) + 1, frames), the DTW path's rows and columns) of a ``SpeechResult``: its rows are the
    ``<|notimestamps|>`` row and each text token's row (row k predicts text token k; the last, end-of-text)."""
    heads = list(result.alignment_heads if heads is None else heads)
    p, n = result.prompt_len, len(text_ids(result, eot))
    matrix = alignment_matrix(result.attention["cross"].weights, heads, slice(p - 1, p + n), audio_frames(result),
                              medfilt)
    rows, cols = dtw(-matrix)
    return matrix, rows, cols


def word_timings(result: Any, decode: Any, eot: int, heads: Sequence[tuple[int, int]] | None = None,
                 medfilt: int = MEDFILT) -> list[WordTiming]:
    """The words of a ``SpeechResult`` with their start and end in seconds, aligned by ``heads`` (default: the
    checkpoint's alignment heads). ``decode`` turns token ids into text (the model's tokenizer)."""
    text = text_ids(result, eot)
    if not text:
        return []
    _, rows, cols = alignment(result, eot, heads, medfilt)
    jumps = np.r_[True, np.diff(rows) > 0]
    starts = cols[jumps] * FRAME_S  # (len(text) + 1,): when each row begins
    out = []
    for word, idx in split_words(text, decode, eot):
        out.append(WordTiming(word, float(starts[idx[0]]), float(starts[idx[-1] + 1]), tuple(idx)))
    return _merge_punctuation(out)


def token_attention(cross: np.ndarray, heads: Sequence[tuple[int, int]], n_frames: int) -> np.ndarray:
    """(T, frames): each token's cross-attention over the audio's positions, averaged over ``heads`` (a head, a
    layer's heads or the alignment heads), each row renormalised over those positions."""
    w = np.stack([cross[layer, head, :, :n_frames] for layer, head in heads]).mean(axis=0)
    return (w / np.maximum(w.sum(-1, keepdims=True), 1e-12)).astype(np.float32)


def boundary_errors(words: Sequence[WordTiming], truth: Sequence[float]) -> list[float]:
    """|predicted − true| start, in seconds, of every word after the first (the path pins the first word to 0 s);
    ``truth``: each word's true start. Words and truth must pair up one to one."""
    if len(words) != len(truth):
        raise ValueError(f"{len(words)} words heard for {len(truth)} spoken")
    return [abs(w.start - t) for w, t in zip(words[1:], truth[1:])]


def score_heads(clips: Sequence[tuple[Any, Sequence[float]]], decode: Any, eot: int, n_layers: int, n_heads: int
                ) -> np.ndarray:
    """(n_layers, n_heads) mean word-start error in seconds of each cross-attention head aligning alone, over
    ``clips``: (SpeechResult, the true start of each of its words). Lower is better."""
    scores = np.zeros((n_layers, n_heads))
    for layer in range(n_layers):
        for head in range(n_heads):
            errs = [e for result, truth in clips
                    for e in boundary_errors(word_timings(result, decode, eot, [(layer, head)]), truth)]
            scores[layer, head] = float(np.mean(errs)) if errs else np.inf
    return scores


def find_heads(clips: Sequence[tuple[Any, Sequence[float]]], decode: Any, eot: int, n_layers: int, n_heads: int,
               max_heads: int = 8) -> tuple[list[tuple[int, int]], np.ndarray]:
    """The heads that align best together: heads ranked by ``score_heads``, then the best k of them (k ≤
    ``max_heads``) whose average aligns ``clips`` with the smallest mean error. Returns (heads, the scores)."""
    scores = score_heads(clips, decode, eot, n_layers, n_heads)
    ranked = [(int(i // n_heads), int(i % n_heads)) for i in np.argsort(scores, axis=None)]
    best, best_err = ranked[:1], np.inf
    for k in range(1, max_heads + 1):
        errs = [e for result, truth in clips
                for e in boundary_errors(word_timings(result, decode, eot, ranked[:k]), truth)]
        if errs and np.mean(errs) < best_err:
            best, best_err = ranked[:k], float(np.mean(errs))
    return best, scores
