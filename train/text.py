"""Helpers shared by the text tasks: padding, length-bucketed batches and text augmentation for distillation."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import Tensor


def pad(seqs: list[list[int]], pad_id: int) -> Tensor:
    """Right-pad id lists into a (B, N) long tensor."""
    n = max(len(s) for s in seqs)
    out = torch.full((len(seqs), n), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def length_batches(lengths: list[int], max_tokens: int, max_sentences: int, seed: int | None,
                   epoch: int = 0) -> list[list[int]]:
    """Index batches of similar length, each with at most ``max_tokens`` padded tokens.

    With a seed: lengths are jittered before sorting and the batch order is shuffled, both from
    ``(seed, epoch)``, so every epoch differs and every run (and resumed run) repeats it exactly.
    """
    lens = np.asarray(lengths, dtype=np.float64)
    if seed is not None:
        rng = np.random.default_rng((seed, epoch))
        order = np.argsort(lens + rng.uniform(0, 2.0, len(lens)), kind="stable")
    else:
        order = np.argsort(lens, kind="stable")
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order.tolist():
        longest_new = max(longest, lengths[i])
        if cur and (longest_new * (len(cur) + 1) > max_tokens or len(cur) >= max_sentences):
            batches.append(cur)
            cur, longest_new = [], lengths[i]
        cur.append(i)
        longest = longest_new
    if cur:
        batches.append(cur)
    if seed is not None:
        perm = np.random.default_rng((seed, epoch, 1)).permutation(len(batches))
        batches = [batches[j] for j in perm]
    return batches


def augment_texts(texts: list[str], copies: int, seed: int = 0, min_words: int = 10, p_delete: float = 0.1,
                  p_replace: float = 0.1, p_ngram: float = 0.25, max_ngram: int = 5) -> list[str]:
    """Perturbed copies of the longer training texts, for a teacher to label (Tang et al. 2019, §3.2).

    For each text of at least ``min_words`` words, ``copies`` variants: every word is dropped with
    probability ``p_delete`` or swapped for a word drawn from the training texts' unigram distribution with
    probability ``p_replace`` (a stand-in for the paper's masking and POS-guided swaps, needing neither a
    mask token the student lacks nor a tagger); then, with probability ``p_ngram``, only a random n-gram of
    1 to ``max_ngram`` words is kept. Variants equal to their source or empty are drawn again (up to ten
    tries). Deterministic for a seed; the words come only from ``texts``.
    """
    rng = random.Random(seed)
    words = [t.split() for t in texts]
    pool = [w for ws in words for w in ws]
    out: list[str] = []
    for ws in words:
        if len(ws) < min_words:
            continue
        for _ in range(copies):
            for _try in range(10):
                new = [rng.choice(pool) if r < p_delete + p_replace else w
                       for w in ws if (r := rng.random()) >= p_delete]
                if new and rng.random() < p_ngram:
                    n = rng.randint(1, min(max_ngram, len(new)))
                    i = rng.randrange(len(new) - n + 1)
                    new = new[i:i + n]
                if new and new != ws:
                    out.append(" ".join(new))
                    break
    return out
