"""Train ``gpt-tiny``: a decoder-only language model (models/gpt.py, the LLaMA recipe) on the English text of
../shared/data, with its own SentencePiece tokeniser.

    python -m train.lm --data-dir ../shared/data --out checkpoints/gpt-tiny --run-dir runs/gpt-tiny \\
        --time-budget 75

Data: each line is one document, ``<s> pieces </s>`` (BOS before it, EOS predicted after it); the documents of
an epoch, shuffled, are packed end to end into fixed contexts of ``--context`` tokens, so a context holds
several documents. Training text: Multi30k ``train.en``, AG News ``train.tsv`` without its 1,000 held-out
lines, SST-2 ``train.tsv`` without the grouped hold-out (``train.data.grouped_holdout``: 1,000 whole sentences
and every phrase of them). Model selection on the per-token perplexity of Multi30k ``val.en``, those AG News
lines and those SST-2 sentences; the test splits are never read here.

Induction heads form in two-layer models and sooner with repeated spans in the data (Olsson et al. 2022): with
``--repeat-share P`` about P of the training tokens are synthetic contexts ``<s> x x`` (or ``<s> x x x``),
``x`` a span of 8-60 pieces drawn uniformly from the tokeniser's ordinary pieces (``--span-sampling unigram``:
by their frequency in the training text; ``frequent``: uniformly from the 1,000 most frequent pieces); the share
is recorded in the checkpoint's metrics.json. With ``--repeat-front F`` an epoch's synthetic rows are mixed into
its first F of batches only (a burst of copying at the start of every epoch, so that the heads form early; the
epoch's share stays P). Validation also reports ``val_copy_gain``: nats per piece saved on the second copy of 64
repeated random pieces against the first (near 0 before induction heads form, several nats after).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
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
    such a model was 1.8 nats a token worse than after unrelated text (runs/gpt-tiny, first attempt).
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


def repeated_spans(n_rows: int, context: int, unigram: np.ndarray, seed: int) -> Tensor:
    """Synthetic ``<s> x x [x]`` rows (padded by further repeats of other spans to the context length); the
    span's pieces are drawn with the probabilities ``unigram`` (zero for the specials)."""
    rng = np.random.default_rng(seed)
    rows = np.empty((n_rows, context + 1), dtype=np.int64)
    for r in range(n_rows):
        out: list[int] = []
        while len(out) < context + 1:
            span = rng.choice(len(unigram), size=int(rng.integers(8, 61)), p=unigram).tolist()
            out += [BOS_ID] + span * int(rng.integers(2, 4))
        rows[r] = out[: context + 1]
    return torch.from_numpy(rows)


class LMTask:
    def __init__(self, train_docs: list[np.ndarray], val_docs: dict[str, list[np.ndarray]], context: int,
                 batch_size: int, repeat_share: float, vocab: int, seed: int, device: torch.device,
                 span_sampling: str = "uniform", repeat_front: float = 1.0) -> None:
        self.docs, self.val_docs, self.context, self.batch_size = train_docs, val_docs, context, batch_size
        self.repeat_share, self.repeat_front, self.seed, self.device = repeat_share, repeat_front, seed, device
        counts = np.ones(vocab)  # "uniform": every ordinary piece alike, earlier occurrences unambiguous
        if span_sampling in ("unigram", "frequent"):
            freq = np.bincount(np.concatenate(train_docs), minlength=vocab).astype(np.float64)
            freq[[PAD_ID, UNK_ID, BOS_ID, EOS_ID]] = 0
            if span_sampling == "unigram":  # as frequent as in the text: spans repeat common pieces within themselves
                counts = freq
            else:  # uniformly among the FREQUENT most frequent pieces: embeddings the text trains well, words' pieces
                counts = np.zeros(vocab)
                counts[np.argsort(-freq, kind="stable")[:FREQUENT]] = 1.0
        counts[[PAD_ID, UNK_ID, BOS_ID, EOS_ID]] = 0  # spans of ordinary pieces only
        self.unigram = counts / counts.sum()
        self.natural_tokens = sum(len(d) for d in train_docs)
        self._epoch: tuple[int, list[Tensor]] | None = None

    def train_batches(self, epoch: int) -> list[Tensor]:
        if self._epoch is not None and self._epoch[0] == epoch:
            return self._epoch[1]
        rng = np.random.default_rng((self.seed, epoch))
        order = rng.permutation(len(self.docs))
        rows = pack([self.docs[i] for i in order], self.context)
        if self.repeat_share > 0:  # P of all tokens: n_syn / (n_nat + n_syn) = P
            n_syn = int(round(len(rows) * self.repeat_share / (1 - self.repeat_share)))
            syn = repeated_spans(n_syn, self.context, self.unigram, seed=self.seed * 1000 + epoch)
            rows = rows[torch.from_numpy(rng.permutation(len(rows)))]
            n_front = max(n_syn, math.ceil(self.repeat_front * (len(rows) + n_syn)))  # rows of the mixed front
            front = torch.cat([syn, rows[: n_front - n_syn]])
            rows = torch.cat([front[torch.from_numpy(rng.permutation(len(front)))], rows[n_front - n_syn :]])
        batches = [rows[i : i + self.batch_size] for i in range(0, len(rows) - self.batch_size + 1, self.batch_size)]
        self._epoch = (epoch, batches)
        return batches

    def loss(self, model: nn.Module, batch: Tensor, step: int, label_smoothing: float) -> Tensor:
        batch = batch.to(self.device)
        logits = model(batch[:, :-1]).logits
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), batch[:, 1:].reshape(-1),
                               label_smoothing=label_smoothing)

    @torch.no_grad()
    def validate(self, model: nn.Module) -> dict[str, float]:
        out: dict[str, float] = {}
        total_nll = total_n = 0.0
        for name, docs in self.val_docs.items():
            nll, n = perplexity_sums(model, docs, self.context, self.device)
            out[f"val_ppl_{name}"] = math.exp(nll / n)
            total_nll, total_n = total_nll + nll, total_n + n
        out["val_ppl"] = math.exp(total_nll / total_n)
        out["score"] = -math.log(out["val_ppl"])
        out["val_copy_gain"] = copy_gain(model, self.unigram, self.device)
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
    ap.add_argument("--repeat-share", type=float, default=0.08,
                    help="share of training tokens in synthetic repeated spans (at most 0.10)")
    ap.add_argument("--span-sampling", choices=["uniform", "unigram", "frequent"], default="uniform",
                    help="how the synthetic spans' pieces are drawn: uniformly, by their frequency in the text, or "
                         f"uniformly among the {FREQUENT} most frequent pieces")
    ap.add_argument("--repeat-front", type=float, default=1.0,
                    help="mix an epoch's synthetic rows into this first share of its batches (1: all through it)")
    ap.add_argument("--train-limit", type=int, default=None, help="use only this many lines per source (tests)")
    add_train_args(ap, DEFAULTS)
    args = ap.parse_args(argv)
    if not 0 <= args.repeat_share <= 0.10:
        ap.error("--repeat-share must be between 0 and 0.10")
    if not args.repeat_share <= args.repeat_front <= 1:
        ap.error("--repeat-front must be between --repeat-share and 1")
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
    train_docs = [doc for texts in corpus["train"].values() for doc in encode_documents(tok, texts)]
    val_docs = {name: encode_documents(tok, texts) for name, texts in corpus["val"].items()}
    task = LMTask(train_docs, val_docs, args.context, args.batch_size, args.repeat_share, tok.vocab_size,
                  cfg.seed, d.device, span_sampling=args.span_sampling, repeat_front=args.repeat_front)

    torch.manual_seed(cfg.seed)
    mcfg = GPTConfig(recipe="llama", vocab_size=tok.vocab_size, max_len=args.context, d_model=args.d_model,
                     n_layers=args.layers, n_heads=args.heads, n_kv_heads=args.kv_heads, dropout=args.dropout,
                     bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID)
    model = GPT(mcfg).to(d.device)
    result = train(model, task, cfg, args.run_dir, resume=args.resume, d=d, desc="lm")
    if result.finished and d.main:
        state, info = load_best(args.run_dir)
        model.load_state_dict(state)
        from models.checkpoint import save_checkpoint

        cmd = ["python", "-m", "train.lm", *(argv if argv is not None else sys.argv[1:])]
        record = training_record(result, model, d, cfg, cmd)
        natural = task.natural_tokens
        record["data"] = {
            "train": {k: f"{len(v):,} lines" for k, v in corpus["train"].items()},
            "sources": "Multi30k train.en; AG News train.tsv less 1,000 held-out lines (seed 0); SST-2 train.tsv "
                       "less the grouped hold-out (train.data.grouped_holdout)",
            "natural_tokens_per_epoch": natural,
            "synthetic_repeated_spans": {"share_of_training_tokens": args.repeat_share,
                                         "construction": "<s> x x [x], x: 8-60 pieces drawn "
                                         + {"uniform": "uniformly from the ordinary pieces", "unigram": "by frequency",
                                            "frequent": f"uniformly from the {FREQUENT} most frequent pieces"}[
                                             args.span_sampling],
                                         "placed_in_first_share_of_each_epoch": args.repeat_front},
        }
        record["validation"] = {"split": "Multi30k val.en (1,014), 1,000 held-out AG News train lines, 1,000 "
                                         "grouped-held-out SST-2 sentences; perplexity per piece, </s> included",
                                **info["metrics"]}
        save_checkpoint(args.out, model, labels=[], text=text, extra_files={"tokenizer.model": tok_path},
                        metrics={"training": record})
        print(json.dumps({"checkpoint": str(args.out), "best_epoch": info["epoch"], **info["metrics"]}))
    cleanup_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
