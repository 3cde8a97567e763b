"""Helpers shared by the text tasks: padding and length-bucketed batches."""

from __future__ import annotations

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
