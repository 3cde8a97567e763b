"""Train ``gpt-tiny``: a decoder-only language model (models/gpt.py, the LLaMA recipe) on the English text of
../shared/data, with its own SentencePiece tokeniser.

    python -m train.lm --data-dir ../shared/data --out checkpoints/gpt-tiny --run-dir runs/gpt-tiny \\
        --time-budget 75

Data: each line is one document, ``<s> pieces </s>`` (BOS before it, EOS predicted after it); the documents of
an epoch, shuffled, are packed end to end into fixed contexts of ``--context`` tokens, so a context holds
several documents. Training text: Multi30k ``train.en``, AG News ``train.tsv`` without its 1,000 held-out
lines, SST-2 ``train.tsv`` without the grouped hold-out (``train.data.grouped_holdout``: 1,000 whole sentences
and every phrase of them). Model selection on the per-token perplexity of Multi30k ``val.en``, those AG News
lines and those SST-2 sentences; the test splits are never read here. ``--oversample agnews=2`` reads every
AG News line twice an epoch; ``--group-phrases`` packs SST-2's phrases with their sentence's other lines
(``phrase_groups``), so that the text itself repeats spans, real pieces that reward copying from the context.

Induction heads form in two-layer models and sooner with repeated spans in the data (Olsson et al. 2022), and
in a time quadratic in the context length (in a minimal model, arXiv:2511.01033). Two kinds of synthetic rows
``<s> x x [x]`` (x a span of pieces drawn uniformly from the tokeniser's ordinary pieces; ``--span-sampling
unigram``: by their frequency in the training text; ``frequent``: uniformly from the 1,000 most frequent pieces):
- ``--repeat-share P``: about P of an epoch's rows of ``--context`` tokens, spans of 8-60 pieces (``--repeat-front
  F`` mixes them into the epoch's first F of batches only);
- ``--copy-rows R``: R short rows of ``--copy-context`` tokens (spans ``--copy-spans``) join every text batch, their
  mean loss weighted ``--copy-weight`` beside the text's, so that the copying gradient is not drowned by the text
  although these rows are few of the tokens (``--copy-source text``: short documents repeated instead; ``words``:
  lists of the text's frequent words; ``--copy-rows-from-epoch E``: from epoch E on);
  ``--copy-warmup STEPS`` puts batches of them alone at the start (or after ``--copy-warmup-at`` text batches),
  training only ``--copy-warmup-only`` parameters if given, and ``--copy-freeze`` then keeps the induction head
  they taught (``HeadFreeze``); ``--freeze-previous STEP`` keeps the best previous-token head from that step on.
The share of synthetic tokens the model saw is counted and recorded in the checkpoint's metrics.json (at most
10 %). Validation also reports ``val_copy_gain``: nats per piece saved on the second copy of 64 repeated random
pieces against the first (near 0 before induction heads form, several nats after).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from train.data import DEFAULT_DATA_DIR, holdout_split, load_multi30k, load_tsv, read_lines, task_labels
from train.data import grouped_holdout as sst2_grouped_holdout
from train.loop import (
    TrainConfig,
    add_train_args,
    cleanup_distributed,
    config_from_args,
    load_best,
    load_state,
    setup_distributed,
    setup_threads,
    train,
    training_record,
)
from train.tokenizers import BOS_ID, EOS_ID, PAD_ID, UNK_ID, train_sentencepiece

DEFAULTS = TrainConfig(epochs=20, lr=2e-3, weight_decay=0.1, betas=(0.9, 0.95), warmup_steps=200,
                       label_smoothing=0.0, log_every=50)
AGNEWS_VAL, SST2_VAL = 1000, 1000
FREQUENT = 1000  # --span-sampling frequent: spans drawn uniformly from this many most frequent pieces


def load_corpus(data_dir: Path) -> dict[str, dict[str, list[str]]]:
    """{"train": {source: lines}, "val": {source: lines}} of the three English sources."""
    m_train, m_val = load_multi30k(data_dir, "train").src, load_multi30k(data_dir, "val").src
    ag = load_tsv(Path(data_dir) / "agnews" / "train.tsv", task_labels("agnews"))
    ag_train, ag_val = holdout_split(ag, AGNEWS_VAL)
    sst = load_tsv(Path(data_dir) / "sst2" / "train.tsv", task_labels("sst2"))
    sst_train, sst_val = sst2_grouped_holdout(sst, SST2_VAL)
    return {"train": {"multi30k": m_train, "agnews": ag_train.texts, "sst2": sst_train.texts},
            "val": {"multi30k": m_val, "agnews": ag_val.texts, "sst2": sst_val.texts}}


def phrase_groups(texts: list[str]) -> list[int]:
    """For each line, the index of the longest line that holds it as a run of whole words (itself if none).

    SST-2's training file holds each sentence and many of its phrases as lines of their own; lines with the
    same index are one sentence's. ``--group-phrases`` packs them together, so that the text itself repeats
    spans a few dozen tokens apart, as natural text does, and rewards copying from the context (an induction
    head) with real pieces and no loss weighting."""
    words = [t.split() for t in texts]
    padded = [f" {' '.join(w)} " for w in words]
    freq: dict[str, int] = {}
    holders: dict[str, list[int]] = {}
    for i, w in enumerate(words):
        for x in set(w):
            freq[x] = freq.get(x, 0) + 1
            holders.setdefault(x, []).append(i)
    root = list(range(len(texts)))
    for i, w in enumerate(words):
        if w:  # candidates: the lines holding its rarest word
            for j in holders[min(set(w), key=lambda x: (freq[x], x))]:
                if len(words[j]) > len(words[root[i]]) and padded[i] in padded[j]:
                    root[i] = j
    return root


def training_documents(tok: Any, sources: dict[str, list[str]], oversample: dict[str, int] | None = None,
                       group_phrases: bool = False) -> tuple[list[np.ndarray], list[int]]:
    """(documents, a group id per document) of the training sources: every line of a source ``oversample[source]``
    times (each copy a document and a group of its own), SST-2's lines grouped by sentence (``phrase_groups``) if
    ``group_phrases``, every other line alone."""
    docs: list[np.ndarray] = []
    groups: list[int] = []
    for name, texts in sources.items():
        own = phrase_groups(texts) if group_phrases and name == "sst2" else list(range(len(texts)))
        encoded = encode_documents(tok, texts)
        for _ in range((oversample or {}).get(name, 1)):
            base = len(groups)
            docs += encoded
            groups += [base + g for g in own]
    return docs, groups


def read_documents(path: str | Path) -> list[str]:
    """One document per line of a text file (plain or .gz); a .tsv gives its first column, header skipped."""
    lines = read_lines(path)
    if str(path).endswith((".tsv", ".tsv.gz")):
        lines = [line.split("\t", 1)[0] for line in lines[1:]]
    return [line for line in lines if line.strip()]


def encode_documents(tok: Any, texts: list[str]) -> list[np.ndarray]:
    """``<s> pieces </s>`` of each document, as int32 arrays (the tokenizer's own BOS and EOS ids)."""
    return [np.array([tok.bos_id, *tok.sp.encode(tok.normalize(t)), tok.eos_id], dtype=np.int32) for t in texts]


def pack(docs: list[np.ndarray], context: int) -> Tensor:
    """Documents end to end in rows of ``context + 1`` tokens (inputs and next-token targets), each row
    starting at a document's ``<s>``: a document cut at the end of a row starts the next row again.

    Rows that start mid-stream would show a document's first tokens almost always after other documents,
    while the app (and the per-document perplexity) runs a prompt from ``<s>`` at position 0; scored alone,
    such a model was 1.8 nats a token worse than after unrelated text (docs/experiments.md, gpt-tiny).
    """
    stream = np.concatenate(docs)
    starts = np.cumsum([0] + [len(d) for d in docs[:-1]])
    rows, s = [], 0
    while s + context + 1 <= len(stream):
        rows.append(stream[s : s + context + 1])
        end = s + context + 1
        cut = int(starts[np.searchsorted(starts, end, side="right") - 1])  # start of the document at `end`
        s = cut if cut > s else end  # a document longer than a row goes on from where it was cut
    return torch.from_numpy(np.stack(rows).astype(np.int64)) if rows else torch.zeros(0, context + 1, dtype=torch.long)


def repeated_spans(n_rows: int, context: int, unigram: np.ndarray, seed: int,
                   lengths: tuple[int, int] = (8, 60), pool: int = 0) -> Tensor:
    """Synthetic ``<s> x x [x]`` rows (padded by further repeats of other spans to the context length); the
    span's ``lengths[0]``-``lengths[1]`` pieces are drawn with the probabilities ``unigram`` (zero for the specials).
    With ``pool`` > 0 each span draws uniformly from its own ``pool`` pieces (themselves drawn with ``unigram``), so
    that a piece recurs within the span and only the two pieces before a target say where the copy goes on: a
    match on one piece is ambiguous and the model needs the previous piece at every position (a previous-token
    head) to copy."""
    rng = np.random.default_rng(seed)

    def draw(size: int) -> list[int]:
        if pool:
            pieces = rng.choice(len(unigram), size=pool, replace=False, p=unigram)
            return rng.choice(pieces, size=size).tolist()
        return rng.choice(len(unigram), size=size, p=unigram).tolist()

    return _span_rows(n_rows, context, rng, lengths, draw)


def _span_rows(n_rows: int, context: int, rng: np.random.Generator, lengths: tuple[int, int],
               draw: Any) -> Tensor:
    """Rows of ``<s> x x [x]`` blocks, x = ``draw(size)`` for a size drawn from ``lengths``, cut at the context."""
    rows = np.empty((n_rows, context + 1), dtype=np.int64)
    for r in range(n_rows):
        out: list[int] = []
        while len(out) < context + 1:
            span = draw(int(rng.integers(lengths[0], lengths[1] + 1)))
            out += [BOS_ID] + span * int(rng.integers(2, 4))
        rows[r] = out[: context + 1]
    return torch.from_numpy(rows)


def repeated_text(docs: list[np.ndarray], n_rows: int, context: int, seed: int,
                  lengths: tuple[int, int] = (4, 31)) -> Tensor:
    """Short rows of real documents, each repeated: ``<s> d </s> <s> d </s> [<s> d </s>]``, then the next
    document, ``d`` a random training document of ``lengths[0]``-``lengths[1]`` pieces. A row is packed text in
    which a document happens to come again, so every target is one the text also has (a document's start after
    ``<s>``, ``</s>`` at its end); only the repeats ask for copying, and until a model copies they are ordinary
    text to predict, not random pieces that pull its next-token distribution towards uniform."""
    short = [d for d in docs if lengths[0] <= len(d) - 2 <= lengths[1]]  # length without <s> and </s>
    if not short:
        raise ValueError(f"no training document has {lengths[0]}-{lengths[1]} pieces for the short copy rows")
    rng = np.random.default_rng(seed)
    rows = np.empty((n_rows, context + 1), dtype=np.int64)
    for r in range(n_rows):
        out: list[int] = []
        while len(out) < context + 1:
            out += short[int(rng.integers(len(short)))].tolist() * int(rng.integers(2, 4))
        rows[r] = out[: context + 1]
    return torch.from_numpy(rows)


def piece_counts(docs: list[np.ndarray], vocab: int) -> np.ndarray:
    """How often each piece occurs in ``docs`` (float64, (vocab,)), the special pieces counted as 0."""
    freq = np.bincount(np.concatenate(docs), minlength=vocab).astype(np.float64)
    freq[[PAD_ID, UNK_ID, BOS_ID, EOS_ID]] = 0
    return freq


def frequent_pieces(docs: list[np.ndarray], vocab: int, n: int = FREQUENT) -> np.ndarray:
    """The ``n`` most frequent ordinary pieces of ``docs``, most frequent first (``--span-sampling frequent``)."""
    return np.argsort(-piece_counts(docs, vocab), kind="stable")[:n]


def frequent_words(texts: list[str], n: int) -> list[str]:
    """The ``n`` most frequent words (whitespace-separated, letters only, 3+ of them, lower-cased) of ``texts``,
    ties broken alphabetically."""
    counts: dict[str, int] = {}
    for t in texts:
        for w in t.lower().split():
            if len(w) >= 3 and w.isalpha():
                counts[w] = counts.get(w, 0) + 1
    return sorted(counts, key=lambda w: (-counts[w], w))[:n]


def repeated_words(words: list[np.ndarray], n_rows: int, context: int, seed: int,
                   lengths: tuple[int, int] = (4, 31)) -> Tensor:
    """Synthetic ``<s> x x [x]`` rows whose span x is a list of random words (``words``: each word's pieces, as
    the tokeniser writes it after a space) of ``lengths[0]``-``lengths[1]`` pieces: real words the text trains,
    in an order the text never predicts, so only copying from the first copy predicts the second."""
    rng = np.random.default_rng(seed)

    def draw(size: int) -> list[int]:
        span: list[int] = []
        while len(span) < size:
            span += words[int(rng.integers(len(words)))].tolist()
        return span

    return _span_rows(n_rows, context, rng, lengths, draw)


def copied_targets(rows: Tensor) -> Tensor:
    """(R, C + 1) synthetic rows -> (R, C) bool: which next-token targets copying predicts, i.e. whose pair
    (previous piece, piece) already occurred since the row's last ``<s>``. In ``<s> x x [x]`` that is every
    piece of the second and third copies but the second copy's first (after x's last piece, which came only
    once before); the first copy is random and predicts nothing."""
    x = rows.long()
    segment = torch.cumsum(x == BOS_ID, dim=1)  # which <s> a piece follows
    prev, cur, seg = x[:, :-1], x[:, 1:], segment[:, 1:]
    same = (prev[:, :, None] == prev[:, None, :]) & (cur[:, :, None] == cur[:, None, :])
    same &= seg[:, :, None] == seg[:, None, :]
    earlier = torch.ones(same.shape[1:], dtype=torch.bool, device=x.device).tril(-1)  # pair q strictly before p
    return (same & earlier).any(-1)


class HeadFreeze:
    """Keeps one head's attention pattern as training found it: the head's query rows, its key/value head's key
    rows and smear logit (and their biases), and the block's input norm stay at their values from then on.

    An induction head that the copy warm-up teaches in layer 0 reads only the embeddings; the text then
    reshapes everything and, with few repeats in it, unlearns the head within a few hundred steps, or keeps it only
    at the price of copy rows weighted against the text (docs/experiments.md, gpt-tiny). Frozen, its
    query-key match of a piece with the piece before an earlier occurrence stays; what it writes (values and
    output) goes on training, with the short rows. Gradients of the frozen entries are zeroed and, before every
    forward pass of the block, their values restored where the last optimiser step (weight decay, momentum)
    moved them."""

    def __init__(self, model: nn.Module, layer: int, head: int) -> None:
        c, block = model.config, model.blocks[layer]
        attn, d = block.attn, c.d_head
        g = head // (c.n_heads // c.kv_heads)  # the key/value head this query head reads
        rows = [(attn.q_proj, slice(head * d, (head + 1) * d)), (attn.k_proj, slice(g * d, (g + 1) * d))]
        self.frozen = [(m.weight, r) for m, r in rows] + [(m.bias, r) for m, r in rows if m.bias is not None]
        self.frozen.append((block.norm1.weight, slice(None)))
        if attn.smear is not None:
            self.frozen.append((attn.smear, slice(g, g + 1)))
        if attn.q_scale is not None:
            self.frozen.append((attn.q_scale.log_scale, slice(head, head + 1)))
        self.values = [p.detach()[r].clone() for p, r in self.frozen]
        for p, r in self.frozen:
            keep = torch.ones_like(p)
            keep[r] = 0
            p.register_hook(lambda grad, keep=keep: grad * keep)
        block.register_forward_pre_hook(lambda *_: self.restore())

    @torch.no_grad()
    def restore(self) -> None:
        for (p, r), v in zip(self.frozen, self.values, strict=True):
            if not torch.equal(p[r], v):  # once a step: a second forward pass (the short rows) may not write again,
                p[r] = v  # since backward needs the weights the first one saw


@dataclass(frozen=True)
class CopyRows:
    """Short synthetic rows (``<s> x x [x]`` of ``context`` tokens, spans of ``lengths`` pieces) beside the text.

    Induction heads take a time quadratic in the context length to form (in a minimal model, arXiv:2511.01033),
    so they are taught on short rows: ``per_batch`` of them join every text batch, their mean loss weighted by
    ``weight`` beside the text's (so that they steer the gradient although they are few of the tokens) and
    taken on the copied pieces only (``copied_targets``: learning to predict the random first copy would only
    pull the model's next-token distribution towards uniform, against the text), and
    ``warmup_steps`` batches of ``warmup_batch`` of them alone may open the run (or come after ``warmup_at`` text
    batches), their loss too on the copied pieces only, and training only the parameters named by ``warmup_only``."""

    per_batch: int = 0
    context: int = 48
    lengths: tuple[int, int] = (4, 20)
    weight: float = 1.0
    warmup_steps: int = 0
    warmup_batch: int = 32
    pool: int = 0  # pieces per span's own pool (repeated_spans): ambiguous one-piece matches
    # "random": spans of pieces drawn as the long synthetic spans are, the loss on the copied pieces only;
    # "text": short documents repeated (repeated_text), the loss on every target (the first copy is text);
    # "words": lists of frequent words repeated (repeated_words), the loss on the copied pieces only;
    # the warm-up's rows are random spans either way
    source: str = "random"
    freeze: bool = False  # after the warm-up, keep its best induction head's query and key as they are (HeadFreeze)
    warmup_only: tuple[str, ...] = ()  # parameter-name prefixes the warm-up trains (empty: all of them)
    warmup_at: int = 0  # text batches before the warm-up (first epoch)
    from_epoch: int = 1  # the first epoch (1-based) whose text batches the short rows join
    # parameter-name prefixes the short rows beside the text train (empty: all of them); the others are detached
    # in the rows' forward pass, so that the rows' gradient still flows through them but only the text moves them
    train_only: tuple[str, ...] = ()
    # layers from this one on (0: none) keep their attention patterns out of the short rows' gradient: their
    # queries and keys are detached in the rows' forward pass, so the rows can move neither those layers' query/key
    # weights nor, through them, what the layers below write; only what those heads write (values, outputs)
    fixed_patterns_from: int = 0
    fixed_patterns_below: int = 0  # the same for the layers below this one (0: none)
    # (layer, query head) pairs of those fixed layers whose query rows, and their key/value head's key rows, stay in
    # the rows' gradient: the rows may teach an induction head where to look, not its neighbours in the layer
    open_heads: tuple[tuple[int, int], ...] = ()
    open_from: int = 0  # the first step at which open_heads are open

    def fixes(self, layer: int) -> bool:
        """Whether the short rows' pass detaches ``layer``'s queries and keys (fixed_patterns_from/below)."""
        return bool(self.fixed_patterns_from and layer >= self.fixed_patterns_from) or layer < self.fixed_patterns_below


class LMTask:
    def __init__(self, train_docs: list[np.ndarray], val_docs: dict[str, list[np.ndarray]], context: int,
                 batch_size: int, repeat_share: float, vocab: int, seed: int, device: torch.device,
                 span_sampling: str = "uniform", repeat_front: float = 1.0,
                 copy: CopyRows | None = None, groups: list[int] | None = None,
                 words: list[np.ndarray] | None = None) -> None:
        """``groups``: a group id per training document; documents of one group are packed one after another
        (in an order of their own each epoch), groups in a random order (None: every document alone)."""
        self.docs, self.val_docs, self.context, self.batch_size = train_docs, val_docs, context, batch_size
        self.groups, self.words = groups, words  # words: pieces of each word of the "words" short rows
        self.copy = copy or CopyRows()
        self.repeat_share, self.repeat_front, self.seed, self.device = repeat_share, repeat_front, seed, device
        counts = np.ones(vocab)  # "uniform": every ordinary piece alike, earlier occurrences unambiguous
        if span_sampling == "unigram":  # as frequent as in the text: spans repeat common pieces within themselves
            counts = piece_counts(train_docs, vocab)
        elif span_sampling == "frequent":  # uniformly among the FREQUENT most frequent: embeddings the text trains well
            counts = np.zeros(vocab)
            counts[frequent_pieces(train_docs, vocab)] = 1.0
        counts[[PAD_ID, UNK_ID, BOS_ID, EOS_ID]] = 0  # spans of ordinary pieces only
        self.unigram = counts / counts.sum()
        self.natural_tokens = sum(len(d) for d in train_docs)
        self.freeze_file: Path | None = None  # with copy.freeze: which head was frozen, kept for --resume
        self.frozen: HeadFreeze | None = None
        self.frozen_info: dict[str, Any] = {}
        self.freeze_previous_at = 0  # from this step on, the best previous-token head frozen (0: never)
        self.freeze_previous_file: Path | None = None
        self.frozen_previous: HeadFreeze | None = None
        self.frozen_previous_info: dict[str, Any] = {}
        # (start, end) steps: smear_weight falls linearly from 1 at start to 0 at end (None: the smear as learned)
        self.smear_anneal: tuple[int, int] | None = None
        self.warming = False  # in the copy warm-up (with copy.warmup_only: the other parameters get no gradient)
        self._warm_hooks = False
        self._epoch: tuple[int, list[Tensor | tuple[Tensor, Tensor]], list[int]] | None = None

    def train_batches(self, epoch: int) -> list[Tensor | tuple[Tensor, Tensor]]:
        return self._batches(epoch)[0]

    def _batches(self, epoch: int) -> tuple[list[Tensor | tuple[Tensor, Tensor]], list[int]]:
        """The epoch's batches (with ``--copy-rows``: (text, short rows) pairs) and the number of synthetic
        tokens (targets) in each."""
        if self._epoch is not None and self._epoch[0] == epoch:
            return self._epoch[1], self._epoch[2]
        rng = np.random.default_rng((self.seed, epoch))
        order = rng.permutation(len(self.docs))
        if self.groups is not None:  # groups in a random order, each group's documents in a random order
            members: dict[int, list[int]] = {}
            for i in order:
                members.setdefault(self.groups[i], []).append(int(i))
            order = [i for g in rng.permutation(list(members)) for i in members[int(g)]]
        rows = pack([self.docs[i] for i in order], self.context)
        synthetic = torch.zeros(len(rows), dtype=torch.bool)
        if self.repeat_share > 0:  # P of all tokens: n_syn / (n_nat + n_syn) = P
            n_syn = int(round(len(rows) * self.repeat_share / (1 - self.repeat_share)))
            syn = repeated_spans(n_syn, self.context, self.unigram, seed=self.seed * 1000 + epoch)
            rows = rows[torch.from_numpy(rng.permutation(len(rows)))]
            n_front = max(n_syn, math.ceil(self.repeat_front * (len(rows) + n_syn)))  # rows of the mixed front
            front = torch.cat([syn, rows[: n_front - n_syn]])
            mix = torch.from_numpy(rng.permutation(len(front)))
            rows = torch.cat([front[mix], rows[n_front - n_syn :]])
            rest = torch.zeros(len(rows) - len(front), dtype=torch.bool)
            synthetic = torch.cat([(torch.arange(len(front)) < n_syn)[mix], rest])
        bs = self.batch_size
        starts = range(0, len(rows) - bs + 1, bs)
        batches = [rows[i : i + bs] for i in starts]
        counts = [int(synthetic[i : i + bs].sum()) * self.context for i in starts]
        c = self.copy
        if c.per_batch and epoch + 1 >= c.from_epoch:  # (text, short synthetic rows) pairs, from the warm-up on
            alone = c.warmup_at if epoch == 0 and c.warmup_steps else 0  # text batches before it stay plain
            syn = self._short_rows((len(batches) - alone) * c.per_batch, seed=self.seed * 1000 + 500 + epoch)
            pairs = [(b, s) for b, s in zip(batches[alone:], syn.split(c.per_batch), strict=True)]
            batches = batches[:alone] + pairs
            counts = counts[:alone] + [n + c.per_batch * c.context for n in counts[alone:]]
        if epoch == 0 and c.warmup_steps:  # the copy warm-up, after the first warmup_at text batches
            syn = self._short_rows(c.warmup_steps * c.warmup_batch, seed=self.seed * 1000 + 999, source="random")
            at = c.warmup_at
            batches = batches[:at] + list(syn.split(c.warmup_batch)) + batches[at:]
            counts = counts[:at] + [c.warmup_batch * c.context] * c.warmup_steps + counts[at:]
        self._epoch = (epoch, batches, counts)
        return batches, counts

    def _short_rows(self, n: int, seed: int, source: str | None = None) -> Tensor:
        c = self.copy
        if (source or c.source) == "text":
            return repeated_text(self.docs, n, c.context, seed, lengths=c.lengths)
        if (source or c.source) == "words":
            if not self.words:
                raise ValueError("--copy-source words needs the word list (LMTask words)")
            return repeated_words(self.words, n, c.context, seed, lengths=c.lengths)
        return repeated_spans(n, c.context, self.unigram, seed, lengths=c.lengths, pool=c.pool)

    def token_counts(self, step: int) -> tuple[int, int]:
        """(synthetic, all) training tokens (targets) of the first ``step`` batches of a run on one process: the
        share of synthetic repeated spans the model actually saw."""
        syn = total = epoch = 0
        while step > 0:
            batches, counts = self._batches(epoch)
            n = min(step, len(batches))
            syn += sum(counts[:n])
            total += sum(sum(t[:, 1:].numel() for t in (b if isinstance(b, tuple) else (b,))) for b in batches[:n])
            step -= n
            epoch += 1
        return syn, total

    def smear_weight(self, step: int) -> float:
        """models/gpt.py smear_weight at ``step`` under ``smear_anneal``."""
        if self.smear_anneal is None:
            return 1.0
        start, end = self.smear_anneal
        return min(1.0, max(0.0, (end - step) / (end - start)))

    def loss(self, model: nn.Module, batch: Tensor | tuple[Tensor, Tensor], step: int,
             label_smoothing: float) -> Tensor:
        c, net = self.copy, getattr(model, "module", model)
        if self.smear_anneal is not None:  # the config is shared by every block: validation sees it too
            net.config.smear_weight = self.smear_weight(step)
        self.warming = c.warmup_at <= step < c.warmup_at + c.warmup_steps
        if self.warming and c.warmup_only and not self._warm_hooks:
            for name, p in net.named_parameters():
                if not name.startswith(c.warmup_only):
                    p.register_hook(lambda grad: grad * 0 if self.warming else grad)
            self._warm_hooks = True
        if c.freeze and self.frozen is None and step >= c.warmup_at + c.warmup_steps:
            self.freeze_head(net, step)
        if self.freeze_previous_at and self.frozen_previous is None and step >= self.freeze_previous_at:
            self.freeze_head(net, step, kind="previous")
        if isinstance(batch, tuple):  # text, then short synthetic rows: their mean losses, weighted
            text, syn = batch
            syn = syn.to(self.device)
            with self._fixed_patterns(net, step):
                logits = self._rows_logits(net, model, syn)
            keep = torch.ones_like(syn[:, 1:], dtype=torch.bool)  # "text": every target is one of a document
            if c.source != "text":
                keep = copied_targets(syn)
            copied = F.cross_entropy(logits[keep].float(), syn[:, 1:][keep], label_smoothing=label_smoothing)
            return self.loss(model, text, step, label_smoothing) + c.weight * copied
        batch = batch.to(self.device)
        if self.warming:  # short rows alone: the copied pieces only, as beside the text
            logits = model(batch[:, :-1]).logits
            keep = copied_targets(batch)
            return F.cross_entropy(logits[keep].float(), batch[:, 1:][keep], label_smoothing=label_smoothing)
        logits = model(batch[:, :-1]).logits
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), batch[:, 1:].reshape(-1),
                               label_smoothing=label_smoothing)

    def _rows_logits(self, net: nn.Module, model: nn.Module, rows: Tensor) -> Tensor:
        c = self.copy
        if not c.train_only:
            return model(rows[:, :-1]).logits
        # the other parameters detached: they pass the rows' gradient on but get none of it
        params = {n: p if n.startswith(c.train_only) else p.detach() for n, p in net.named_parameters()}
        return torch.func.functional_call(net, params, (rows[:, :-1],)).logits

    @contextlib.contextmanager
    def _fixed_patterns(self, net: nn.Module, step: int = 0) -> Iterator[None]:
        """While the short rows' forward pass runs: the queries and keys of layers ``fixed_patterns_from`` and up,
        and of those below ``fixed_patterns_below``, detached, but for ``open_heads`` from step ``open_from``
        (CopyRows)."""
        model = getattr(net, "module", net)
        c, hooks = model.config, []
        for i, block in enumerate(model.blocks):
            if not self.copy.fixes(i):
                continue
            heads = [h for layer, h in self.copy.open_heads if layer == i and step >= self.copy.open_from]
            kv = {h // (c.n_heads // c.kv_heads) for h in heads}  # the key/value heads those query heads read
            attn = block.attn
            query = attn.q_scale if attn.q_scale is not None else attn.q_proj  # the queries as the logits see them
            for proj, n, units in ((query, c.n_heads, heads), (attn.k_proj, c.kv_heads, kv)):
                keep = torch.zeros(n * c.d_head, dtype=torch.bool, device=attn.q_proj.weight.device)
                for u in units:
                    keep[u * c.d_head:(u + 1) * c.d_head] = True
                hooks.append(proj.register_forward_hook(
                    lambda _m, _i, out, keep=keep: torch.where(keep, out, out.detach())))
        try:
            yield
        finally:
            for h in hooks:
                h.remove()

    def freeze_head(self, model: nn.Module, step: int, kind: str = "induction") -> None:
        """Freeze the head with the best induction (or, ``kind="previous"``, previous-token) score (HeadFreeze),
        the same one again on --resume."""
        path = self.freeze_file if kind == "induction" else self.freeze_previous_file
        if path is not None and path.is_file():
            info = json.loads(path.read_text())
        else:
            scores = model.head_role_scores(seeds=range(10))
            induction, previous = scores["induction"], scores["previous"]
            layer, head = np.unravel_index(int(np.argmax(induction if kind == "induction" else previous)),
                                           induction.shape)
            info = {"layer": int(layer), "head": int(head), "step": step,
                    "induction_score": round(float(induction[layer, head]), 4),
                    "previous_token_score": round(float(previous[layer, head]), 4)}
            if path is not None:
                path.write_text(json.dumps(info) + "\n")
        freeze = HeadFreeze(model, info["layer"], info["head"])
        if kind == "induction":
            self.frozen, self.frozen_info = freeze, info
        else:
            self.frozen_previous, self.frozen_previous_info = freeze, info
        score = info["induction_score" if kind == "induction" else "previous_token_score"]
        print(f"froze layer {info['layer']} head {info['head']}'s query and key at step {info['step']} "
              f"({kind} {score})")

    @torch.no_grad()
    def validate(self, model: nn.Module) -> dict[str, float]:
        out: dict[str, float] = {}
        total_nll = total_n = 0.0
        for name, docs in self.val_docs.items():
            nll, n = perplexity_sums(model, docs, self.context, self.device)
            if not n:  # a source without validation documents (a tiny --train-limit) has no perplexity
                continue
            out[f"val_ppl_{name}"] = math.exp(nll / n)
            total_nll, total_n = total_nll + nll, total_n + n
        out["val_ppl"] = math.exp(total_nll / total_n)
        out["score"] = -math.log(out["val_ppl"])
        out["val_copy_gain"] = copy_gain(model, self.unigram, self.device, n=min(64, (self.context - 1) // 2))
        return out


@torch.no_grad()
def copy_gain(model: nn.Module, unigram: np.ndarray, device: torch.device, n: int = 64, rows: int = 8) -> float:
    """Mean NLL (nats per piece) on the first copy of ``<s> x x`` minus that on the second, ``x`` ``n`` pieces
    drawn as the synthetic spans are (fixed seed): what the model gains by copying."""
    was = model.training
    model.eval()
    span = torch.from_numpy(np.random.default_rng(12345).choice(len(unigram), size=(rows, n), p=unigram))
    x = torch.cat([torch.full((rows, 1), BOS_ID), span, span], 1).to(device)
    nll = -torch.log_softmax(model(x[:, :-1]).logits.float(), -1).gather(-1, x[:, 1:, None])[..., 0]
    model.train(was)
    return float(nll[:, :n].mean() - nll[:, n:].mean())


@torch.no_grad()
def perplexity_sums(model: nn.Module, docs: list[np.ndarray], context: int, device: torch.device,
                    batch_size: int = 32) -> tuple[float, int]:
    """(summed negative log-likelihood in nats, number of predicted tokens) of each document on its own:
    every token after ``<s>`` is predicted, ``</s>`` included; documents longer than the context are scored
    in windows of ``context`` tokens."""
    was = model.training
    model.eval()
    windows = []
    for d in docs:
        for start in range(0, max(len(d) - 1, 1), context):
            windows.append(d[start : start + context + 1])
    nll, n = 0.0, 0
    windows.sort(key=len)
    for i in range(0, len(windows), batch_size):
        group = windows[i : i + batch_size]
        width = max(len(w) for w in group)
        x = torch.full((len(group), width), PAD_ID, dtype=torch.long)
        keep = torch.zeros(len(group), width - 1, dtype=torch.bool)
        for j, w in enumerate(group):
            x[j, : len(w)] = torch.from_numpy(w.astype(np.int64))
            keep[j, : len(w) - 1] = True
        x = x.to(device)
        logits = model(x[:, :-1]).logits.float()  # causal: the padding after a window never reaches it
        losses = F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1), reduction="none")
        mask = keep.to(device).reshape(-1)
        nll += float(losses[mask].sum())
        n += int(mask.sum())
    model.train(was)
    return nll, n


def synthetic_record(task: LMTask, args: argparse.Namespace, best_step: int, last_step: int) -> dict[str, Any]:
    """How many of the training tokens were synthetic repeated spans, up to the shipped weights and in all."""
    spans = {"uniform": "uniformly from the ordinary pieces", "unigram": "by frequency",
             "frequent": f"uniformly from the {FREQUENT} most frequent pieces"}[args.span_sampling]
    out: dict[str, Any] = {}
    for name, step in (("up_to_shipped_weights", best_step), ("whole_run", last_step)):
        syn, total = task.token_counts(step)
        out[name] = {"steps": step, "synthetic_tokens": syn, "training_tokens": total,
                     "share_of_training_tokens": round(syn / max(1, total), 4)}
    out["construction"] = f"<s> x x [x] (x repeated two or three times), x's pieces drawn {spans}"
    if args.repeat_share:
        out["rows_among_the_text"] = (f"rows of {args.context} tokens, spans of 8-60 pieces, {args.repeat_share:.0%} "
                                      f"of each epoch's rows, in its first {args.repeat_front:.0%} of batches")
    c = task.copy
    if c.per_batch:
        if c.source == "words":
            out["short_rows"] = (f"{c.per_batch} rows of {c.context} tokens in every batch: <s> x x [x], x a list of "
                                 f"random words ({c.lengths[0]}-{c.lengths[1]} pieces) from the training text's "
                                 f"{args.copy_words:,} most frequent (train.lm.repeated_words), their mean loss on "
                                 f"the copied pieces (train.lm.copied_targets) weighted {c.weight} beside the text's")
        elif c.source == "text":
            out["short_rows"] = (f"{c.per_batch} rows of {c.context} tokens in every batch: <s> d </s> <s> d </s> "
                                 f"[<s> d </s>], d a random training document of {c.lengths[0]}-{c.lengths[1]} pieces "
                                 f"(train.lm.repeated_text; all of a row's tokens counted as synthetic), their mean "
                                 f"loss on every target weighted {c.weight} beside the text's")
        else:
            pooled = f", each from its own {c.pool} pieces" if c.pool else ""
            out["short_rows"] = (f"{c.per_batch} rows of {c.context} tokens (spans of {c.lengths[0]}-{c.lengths[1]} "
                                 f"pieces{pooled}) in every batch, their mean loss on the copied pieces "
                                 f"(train.lm.copied_targets) weighted {c.weight} beside the text's")
        if c.from_epoch > 1:
            out["short_rows"] = out["short_rows"].replace("in every batch", f"in every batch from epoch {c.from_epoch}")
        if c.fixed_patterns_from:
            out["short_rows"] += (f"; the queries and keys of layers {c.fixed_patterns_from} and up detached in the "
                                  "rows' forward pass (where those heads look is learned from the text alone)")
        if c.fixed_patterns_below:
            out["short_rows"] += (f"; the queries and keys of the layers below {c.fixed_patterns_below} detached in "
                                  "the rows' forward pass (where those heads look is learned from the text alone)")
        if c.open_heads:
            heads = ", ".join(f"layer {i} head {h}" for i, h in c.open_heads)
            out["short_rows"] += (f"; but for the query rows of {heads}"
                                  + " and their key/value heads' key rows (where the rows teach those heads to look)"
                                  + (f", from step {c.open_from}" if c.open_from else ""))
        if c.train_only:
            out["short_rows"] += (f"; their loss trains only the parameters {', '.join(c.train_only)}* (the others "
                                  "pass its gradient on and learn from the text alone)")
    if c.warmup_steps:
        out["copy_warmup"] = (f"batches {c.warmup_at + 1}-{c.warmup_at + c.warmup_steps}: {c.warmup_batch} rows of "
                              f"random spans alone, {c.warmup_steps * c.warmup_batch * c.context:,} tokens, the loss "
                              "on the copied pieces")
        if c.warmup_only:
            out["copy_warmup"] += f"; only the parameters {', '.join(c.warmup_only)}* trained in it"
    return out


def run_commands(run_dir: Path, command: str, resume: bool) -> list[dict[str, Any]]:
    """Every command that trained this run, each with the step it started from, kept in RUN_DIR/commands.json:
    a ``--resume`` may change flags, and the model's record then holds them all."""
    path, state = run_dir / "commands.json", run_dir / "state.pt"
    earlier = json.loads(path.read_text()) if resume and path.is_file() else []
    step = int(load_state(state)["step"]) if resume and state.is_file() else 0
    commands = [*earlier, {"command": command, "from_step": step}]
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(commands, indent=1) + "\n")
    return commands


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    ap.add_argument("--out", type=Path, required=True, help="checkpoint folder to write")
    ap.add_argument("--run-dir", type=Path, required=True, help="logs, the tokeniser and resumable state")
    ap.add_argument("--vocab", type=int, default=8000, help="SentencePiece pieces")
    ap.add_argument("--context", type=int, default=256, help="tokens per training context (the model's positions)")
    ap.add_argument("--batch-size", type=int, default=16, help="contexts per batch per process")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=0, help="key/value heads (0: as many as heads)")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--smear-keys", action="store_true",
                    help="mix each key with its predecessor's (Olsson et al. 2022): induction heads in one layer")
    ap.add_argument("--smear-from", type=int, default=0, metavar="LAYER",
                    help="--smear-keys from this layer up only (the layers below keep plain keys)")
    ap.add_argument("--smear-anneal", type=int, nargs=2, default=None, metavar=("START", "END"),
                    help="with --smear-keys: the predecessor's share of each key falls linearly to nothing between "
                         "these steps (models/gpt.py smear_weight): smeared keys as scaffolding, plain keys after END")
    ap.add_argument("--qkv-bias", action="store_true",
                    help="query/key/value biases (models/gpt.py qkv_bias): a content-free direction, positional heads")
    ap.add_argument("--logit-scale", action="store_true",
                    help="a learned, undecayed logit scale per query head (models/gpt.py logit_scale): a head sharpens "
                         "without growing its weights")
    ap.add_argument("--repeat-share", type=float, default=0.08,
                    help="share of training tokens in synthetic repeated spans (at most 0.10)")
    ap.add_argument("--span-sampling", choices=["uniform", "unigram", "frequent"], default="uniform",
                    help="how the synthetic spans' pieces are drawn: uniformly, by their frequency in the text, or "
                         f"uniformly among the {FREQUENT} most frequent pieces")
    ap.add_argument("--repeat-front", type=float, default=1.0,
                    help="mix an epoch's synthetic rows into this first share of its batches (1: all through it)")
    ap.add_argument("--copy-rows", type=int, default=0, help="short synthetic rows joining every text batch")
    ap.add_argument("--copy-context", type=int, default=48, help="tokens per short synthetic row")
    ap.add_argument("--copy-spans", type=int, nargs=2, default=(4, 20), metavar=("MIN", "MAX"),
                    help="pieces per repeated span in the short rows")
    ap.add_argument("--copy-pool", type=int, default=0,
                    help="short rows' spans each draw from their own POOL pieces, so copying needs the previous piece")
    ap.add_argument("--copy-source", choices=["random", "text", "words"], default="random",
                    help="short rows of random pieces (loss on the copies only), of short documents repeated, or "
                         "of lists of frequent words repeated (loss on the copies only)")
    ap.add_argument("--copy-words", type=int, default=2000,
                    help="--copy-source words: the training text's this many most frequent words")
    ap.add_argument("--copy-rows-from-epoch", type=int, default=1, metavar="E",
                    help="the short rows join the text batches from epoch E (1-based) on")
    ap.add_argument("--copy-weight", type=float, default=1.0, help="weight of the short rows' mean loss")
    ap.add_argument("--copy-warmup", type=int, default=0, metavar="STEPS",
                    help="this many batches of short random-span rows alone, at the start or after --copy-warmup-at")
    ap.add_argument("--copy-freeze", action="store_true",
                    help="after the copy warm-up, keep its best induction head's query and key (train.lm.HeadFreeze)")
    ap.add_argument("--copy-warmup-at", type=int, default=0, metavar="STEPS",
                    help="text batches before the copy warm-up (within the first epoch)")
    ap.add_argument("--copy-warmup-only", nargs="+", default=(), metavar="PREFIX",
                    help="the warm-up trains only parameters whose names start so (blocks.0.attn: the first attention)")
    ap.add_argument("--copy-warmup-batch", type=int, default=32, help="rows per copy warm-up batch")
    ap.add_argument("--group-phrases", action="store_true",
                    help="pack each SST-2 sentence's phrases together (train.lm.phrase_groups): the text repeats spans")
    ap.add_argument("--oversample", nargs="+", default=(), metavar="SOURCE=K",
                    help="every line of SOURCE (multi30k, agnews, sst2) K times an epoch, e.g. agnews=2")
    ap.add_argument("--copy-train", nargs="+", default=(), metavar="PREFIX",
                    help="the short rows beside the text train only parameters whose names start so (embed "
                         "blocks.0: the embeddings and the first block); the rest learns from the text alone")
    ap.add_argument("--copy-fixed-patterns", type=int, default=0, metavar="LAYER",
                    help="the short rows' gradient moves no attention pattern of layers LAYER and up (their queries "
                         "and keys detached in the rows' pass): where those heads look is learned from the text alone")
    ap.add_argument("--copy-fixed-below", type=int, default=0, metavar="LAYER",
                    help="as --copy-fixed-patterns for the layers below LAYER (with --smear-from: the rows teach only "
                         "the smeared layers where to look)")
    ap.add_argument("--copy-open-heads", nargs="+", default=(), metavar="LAYER.HEAD",
                    help="with --copy-fixed-patterns/--copy-fixed-below: these query heads (and their key/value "
                         "heads' keys) stay in the rows' gradient, e.g. 3.6 3.7")
    ap.add_argument("--copy-open-from", type=int, default=0, metavar="STEP",
                    help="the first step at which --copy-open-heads are open")
    ap.add_argument("--freeze-previous", type=int, default=0, metavar="STEP",
                    help="at this step, freeze the head with the best previous-token score (train.lm.HeadFreeze)")
    ap.add_argument("--select", choices=["best", "last"], default="best",
                    help="the checkpoint's weights: the epoch with the best validation score, or the run's last")
    ap.add_argument("--train-limit", type=int, default=None, help="use only this many lines per source (tests)")
    add_train_args(ap, DEFAULTS)
    args = ap.parse_args(argv)
    try:
        oversample = {k: int(v) for k, v in (o.split("=") for o in args.oversample)}
    except ValueError:
        ap.error("--oversample takes SOURCE=K, K a whole number")
    if not set(oversample) <= {"multi30k", "agnews", "sst2"} or min(oversample.values(), default=1) < 1:
        ap.error("--oversample takes SOURCE=K for multi30k, agnews or sst2, K at least 1")
    try:
        open_heads = tuple((int(a), int(b)) for a, b in (h.split(".") for h in args.copy_open_heads))
    except ValueError:
        ap.error("--copy-open-heads takes LAYER.HEAD, e.g. 3.7")
    if any(not (0 <= i < args.layers and 0 <= h < args.heads) for i, h in open_heads):
        ap.error(f"--copy-open-heads: a model of {args.layers} layers and {args.heads} heads has no such head")
    fixing = CopyRows(fixed_patterns_from=args.copy_fixed_patterns, fixed_patterns_below=args.copy_fixed_below)
    if not all(fixing.fixes(i) for i, _ in open_heads):
        ap.error("--copy-open-heads names heads of layers whose patterns the rows may move anyway (see "
                 "--copy-fixed-patterns, --copy-fixed-below)")
    if args.smear_anneal is not None and not (args.smear_keys and 0 <= args.smear_anneal[0] < args.smear_anneal[1]):
        ap.error("--smear-anneal START END needs --smear-keys and 0 <= START < END")
    if not 0 <= args.repeat_share <= 0.10:
        ap.error("--repeat-share must be between 0 and 0.10")
    if not args.repeat_share <= args.repeat_front <= 1:
        ap.error("--repeat-front must be between --repeat-share and 1")
    short, text = args.copy_rows * args.copy_context, args.batch_size * args.context
    if (args.repeat_share * text + short) / (text + short) > 0.10:
        ap.error("--repeat-share with --copy-rows makes more than 10 % of every batch's tokens synthetic")
    setup_threads(args.threads)
    d = setup_distributed(args.device)
    cfg = config_from_args(args)

    from models.gpt import GPT, GPTConfig
    from models.tokenizer import SentencePieceTokenizer

    corpus = load_corpus(args.data_dir)
    if args.train_limit:
        corpus = {split: {k: v[: args.train_limit] for k, v in part.items()} for split, part in corpus.items()}
    tok_path = Path(args.run_dir) / "tokenizer.model"
    if not tok_path.is_file():  # trained on the training text only; kept in the run for --resume
        lines = [t for texts in corpus["train"].values() for t in texts]
        train_sentencepiece(lines, tok_path, args.vocab)
    text = {"lowercase": False}
    tok = SentencePieceTokenizer(tok_path, text)
    train_docs, groups = training_documents(tok, corpus["train"], oversample, args.group_phrases)
    words = None
    if args.copy_source == "words":  # each word's pieces as the tokeniser writes it after a space
        lines = [t for texts in corpus["train"].values() for t in texts]
        words = [np.array(tok.sp.encode(w), dtype=np.int64) for w in frequent_words(lines, args.copy_words)]
    val_docs = {name: encode_documents(tok, texts) for name, texts in corpus["val"].items()}
    task = LMTask(train_docs, val_docs, args.context, args.batch_size, args.repeat_share, tok.vocab_size,
                  cfg.seed, d.device, span_sampling=args.span_sampling, repeat_front=args.repeat_front,
                  copy=CopyRows(args.copy_rows, args.copy_context, tuple(args.copy_spans), args.copy_weight,
                                args.copy_warmup, args.copy_warmup_batch, args.copy_pool,
                                args.copy_source, args.copy_freeze, tuple(args.copy_warmup_only),
                                args.copy_warmup_at, args.copy_rows_from_epoch, tuple(args.copy_train),
                                args.copy_fixed_patterns, args.copy_fixed_below, open_heads, args.copy_open_from),
                  groups=groups if args.group_phrases else None, words=words)
    task.freeze_file = Path(args.run_dir) / "frozen_head.json"
    task.freeze_previous_at = args.freeze_previous
    task.freeze_previous_file = Path(args.run_dir) / "frozen_previous_head.json"
    task.smear_anneal = tuple(args.smear_anneal) if args.smear_anneal else None

    torch.manual_seed(cfg.seed)
    mcfg = GPTConfig(recipe="llama", vocab_size=tok.vocab_size, max_len=args.context, d_model=args.d_model,
                     n_layers=args.layers, n_heads=args.heads, n_kv_heads=args.kv_heads, dropout=args.dropout,
                     bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID, smear_keys=args.smear_keys,
                     smear_from=args.smear_from, qkv_bias=args.qkv_bias, logit_scale=args.logit_scale)
    model = GPT(mcfg).to(d.device)
    cmd = ["python", "-m", "train.lm", *(argv if argv is not None else sys.argv[1:])]
    commands = run_commands(Path(args.run_dir), " ".join(cmd), args.resume) if d.main else []
    result = train(model, task, cfg, args.run_dir, resume=args.resume, d=d, desc="lm")
    if result.finished and d.main:
        if args.select == "best":
            state, info = load_best(args.run_dir)
            model.load_state_dict(state)
        else:  # the weights as the run ended, with the last validation
            last = result.history[-1]
            info = {"epoch": last["epoch"], "step": result.step,
                    "metrics": {k: v for k, v in last.items() if k not in ("epoch", "step", "train_loss", "seconds")}}
        model.config.smear_weight = task.smear_weight(int(info["step"]))  # as the best weights were trained
        from models.checkpoint import save_checkpoint

        record = training_record(result, model, d, cfg, cmd)
        if args.select == "last":
            best = ("also the best validation epoch" if info["epoch"] == result.best_epoch
                    else f"not the best validation epoch ({result.best_epoch})")
            record["selection"] = f"the last weights (epoch {info['epoch']}, step {info['step']:,}), {best}"
        natural = task.natural_tokens
        record["data"] = {
            "train": {k: f"{len(v):,} lines" for k, v in corpus["train"].items()},
            "sources": "Multi30k train.en; AG News train.tsv less 1,000 held-out lines (seed 0); SST-2 train.tsv "
                       "less the grouped hold-out (train.data.grouped_holdout)",
            "natural_tokens_per_epoch": natural,
            "oversampled": {k: f"every line {v} times an epoch" for k, v in oversample.items()},
            "packing": ("documents shuffled each epoch"
                        + ("; SST-2 lines grouped by sentence (train.lm.phrase_groups: a phrase goes with the longest "
                           "line holding it), a group's lines one after another in a shuffled order"
                           if args.group_phrases else "")),
            "synthetic_repeated_spans": synthetic_record(task, args, int(info["step"]), result.step),
        }
        if len(commands) > 1:
            record["commands"] = commands  # "command" is the last of them
            record["data"]["synthetic_repeated_spans"]["flags"] = (
                "construction and short_rows say what the last command's flags set; each earlier command (see "
                "commands) set its own up to the next one's from_step")
        if task.frozen is not None:
            record["frozen_head"] = {**task.frozen_info, "what": "its query rows, its key/value head's key rows and "
                                     "smear logit (with biases) and the block's input norm, kept from that step on "
                                     "(train.lm.HeadFreeze)"}
        if task.frozen_previous is not None:
            record["frozen_previous_token_head"] = {
                **task.frozen_previous_info, "what": "the head with the best previous-token score at that step: its "
                "query rows, its key/value head's key rows and smear logit (with biases) and the block's input norm, "
                "kept from then on (train.lm.HeadFreeze)"}
        if task.smear_anneal is not None:
            start, end = task.smear_anneal
            record["smear_anneal"] = (f"smeared keys' predecessor share times a weight falling linearly from 1 at step "
                                      f"{start} to 0 at step {end} (models/gpt.py smear_weight); "
                                      f"{model.config.smear_weight:g} in these weights")
        record["validation"] = {"split": "Multi30k val.en (1,014), 1,000 held-out AG News train lines, 1,000 "
                                         "grouped-held-out SST-2 sentences; perplexity per piece, </s> included",
                                **info["metrics"]}
        share = record["data"]["synthetic_repeated_spans"]["up_to_shipped_weights"]["share_of_training_tokens"]
        if share > 0.10:
            print(f"warning: {share:.1%} of the shipped weights' training tokens were synthetic (more than 10 %)")
        save_checkpoint(args.out, model, labels=[], text=text, extra_files={"tokenizer.model": tok_path},
                        metrics={"training": record})
        print(json.dumps({"checkpoint": str(args.out), "best_epoch": info["epoch"], **info["metrics"]}))
    cleanup_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
