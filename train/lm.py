"""Train ``gpt-tiny``: a decoder-only language model (models/families/gpt.py, the LLaMA recipe with query/key/value
biases)
on the English text of ../shared/data, with its own SentencePiece tokeniser. The shipped recipe is the defaults:

    python -m train.lm --data-dir ../shared/data --out checkpoints/gpt-tiny --run-dir runs/gpt-tiny \\
        --time-budget 115 --threads 2

(``--time-budget`` sets the cosine schedule by the clock, so another machine reaches another number of steps;
``--max-steps N`` fixes it instead.) No dropout: the run sees each document about five times, and dropout 0.1
(attention probabilities included) made a step a third slower on this CPU.

Data: each line is one document, ``<s> pieces </s>`` (BOS before it, EOS predicted after it); the documents of
an epoch, shuffled, are packed end to end into fixed contexts of ``--context`` tokens, each row starting at a
document's ``<s>`` (``pack``). Training text: Multi30k ``train.en``, AG News ``train.tsv`` without its 1,000
held-out lines (read twice an epoch), SST-2 ``train.tsv`` without the grouped hold-out
(``train.data.grouped_holdout``: 1,000 whole sentences and every phrase of them), its phrases packed with their
sentence's other lines (``phrase_groups``), so that the text itself repeats spans. Model selection: none. The
checkpoint holds the run's last weights, a rule fixed before training (``--select best`` picks the epoch with the
best validation perplexity on Multi30k ``val.en``, those AG News lines and those SST-2 sentences instead). The
test splits are never read here.

Repeated spans (``--repeat-share P``, the one synthetic knob): about P of every batch's tokens are short rows
``<s> x x [x]`` of ``REPEAT_CONTEXT`` tokens (or the context, if shorter), x a span of 8-45 pieces, in turn
drawn uniformly from every ordinary piece and cut from the training text, so that copying is asked for on
text as well as on random pieces (with random spans alone, the previous gpt-tiny's induction head worked on them
and on SST-2, whose phrases repeat in the training text, but not on captions, which never repeat there). Their
mean loss is taken on the pieces copying predicts (``copied_targets``; the random first copy would pull the
next-token distribution towards uniform) and weighted ``REPEAT_WEIGHT`` beside the text's. Induction heads form
sooner with repeated spans (Olsson et al. 2022) and take a time quadratic in the context to form (in a minimal
model, arXiv:2511.01033), hence short rows. With plain keys the copy needs a previous-token head below the
induction head (K-composition), and spans of every piece and of text ask for that head everywhere: that is
what keeps a previous-token head sharp on any text, not only on the words the rows happen to hold. The
query/key biases give each head a content-free direction, so a head can score by offset alone through RoPE from
the first step.
docs/experiments.md (gpt-tiny) has the 27 attempts behind this; the options they used (smeared keys, logit
scales, copy warm-ups, frozen and open heads, ...) were last in train/lm.py and the decoder's file at commit
4da411c.

Validation also reports ``val_copy_gain``: nats per piece saved on the second copy of 64 repeated random pieces
against the first (near 0 before induction heads form, several nats after). The share of synthetic tokens the
model saw is recorded in the checkpoint's metrics.json (at most 10 %).
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
    load_state,
    setup_distributed,
    setup_threads,
    train,
    training_record,
)
from train.tokenizers import BOS_ID, EOS_ID, PAD_ID, UNK_ID, train_sentencepiece

DEFAULTS = TrainConfig(epochs=20, lr=2e-3, min_lr_ratio=0.25, weight_decay=0.1, betas=(0.9, 0.95),
                       warmup_steps=200, label_smoothing=0.0, log_every=50)
AGNEWS_VAL, SST2_VAL = 1000, 1000
REPEAT_CONTEXT = 96  # tokens per synthetic row
REPEAT_SPANS = (8, 45)  # pieces per repeated span
REPEAT_WEIGHT = 0.15  # weight of the rows' mean loss beside the text's (per copied piece about 5x a text piece)
OVERSAMPLE = {"agnews": 2}  # every AG News line twice an epoch: news is most of the test text


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


def repeated_spans(n_rows: int, context: int, vocab: int, seed: int, lengths: tuple[int, int] = REPEAT_SPANS,
                   text: np.ndarray | None = None) -> Tensor:
    """Synthetic ``<s> x x [x]`` rows of ``context + 1`` tokens (further blocks of other spans fill a row, the last
    one cut), x ``lengths[0]``-``lengths[1]`` pieces: drawn uniformly from the ordinary pieces (not the specials),
    or, for every other block when ``text`` (the training text's pieces end to end) is given, a window of it."""
    rng = np.random.default_rng(seed)
    pieces = np.setdiff1d(np.arange(vocab), [PAD_ID, UNK_ID, BOS_ID, EOS_ID])
    rows = np.empty((n_rows, context + 1), dtype=np.int64)
    block = 0
    for r in range(n_rows):
        out: list[int] = []
        while len(out) < context + 1:
            size = int(rng.integers(lengths[0], lengths[1] + 1))
            if text is not None and block % 2:
                start = int(rng.integers(0, len(text) - size))
                span = text[start : start + size].tolist()
            else:
                span = rng.choice(pieces, size=size).tolist()
            out += [BOS_ID] + span * int(rng.integers(2, 4))
            block += 1
        rows[r] = out[: context + 1]
    return torch.from_numpy(rows)


def text_stream(docs: list[np.ndarray]) -> np.ndarray:
    """The documents' ordinary pieces end to end (``<s>`` and ``</s>`` left out): where text spans are cut from."""
    return np.concatenate([d[(d != BOS_ID) & (d != EOS_ID)] for d in docs])


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


def rows_per_batch(share: float, batch_size: int, context: int) -> int:
    """Synthetic rows (of ``row_length(context)`` tokens) that make about ``share`` of a batch's tokens (at least
    one if ``share`` > 0)."""
    if share <= 0:
        return 0
    return max(1, round(share * batch_size * context / ((1 - share) * row_length(context))))


def row_length(context: int) -> int:
    """Tokens per synthetic row: REPEAT_CONTEXT, or the whole context where that is shorter."""
    return min(REPEAT_CONTEXT, context)


class LMTask:
    def __init__(self, train_docs: list[np.ndarray], val_docs: dict[str, list[np.ndarray]], context: int,
                 batch_size: int, vocab: int, seed: int, device: torch.device, repeat_rows: int = 0,
                 groups: list[int] | None = None) -> None:
        """``repeat_rows`` synthetic rows join every text batch; ``groups``: a group id per training document,
        documents of one group packed one after another (in an order of their own each epoch), groups in a
        random order (None: every document alone)."""
        self.docs, self.val_docs, self.context, self.batch_size = train_docs, val_docs, context, batch_size
        self.vocab, self.seed, self.device, self.repeat_rows, self.groups = vocab, seed, device, repeat_rows, groups
        self.text = text_stream(train_docs) if repeat_rows else None
        self._epoch: tuple[int, list[Tensor | tuple[Tensor, Tensor]]] | None = None

    def train_batches(self, epoch: int) -> list[Tensor | tuple[Tensor, Tensor]]:
        """The epoch's text batches, each paired with its synthetic rows when there are any."""
        if self._epoch is not None and self._epoch[0] == epoch:
            return self._epoch[1]
        rng = np.random.default_rng((self.seed, epoch))
        order = rng.permutation(len(self.docs))
        if self.groups is not None:  # groups in a random order, each group's documents in a random order
            members: dict[int, list[int]] = {}
            for i in order:
                members.setdefault(self.groups[i], []).append(int(i))
            order = [i for g in rng.permutation(list(members)) for i in members[int(g)]]
        rows = pack([self.docs[i] for i in order], self.context)
        bs = self.batch_size
        batches: list[Tensor | tuple[Tensor, Tensor]] = [rows[i : i + bs] for i in range(0, len(rows) - bs + 1, bs)]
        if self.repeat_rows:
            syn = repeated_spans(len(batches) * self.repeat_rows, row_length(self.context), self.vocab,
                                 self.seed * 1000 + epoch, text=self.text)
            batches = list(zip(batches, syn.split(self.repeat_rows), strict=True))
        self._epoch = (epoch, batches)
        return batches

    def token_counts(self, step: int) -> tuple[int, int]:
        """(synthetic, all) training tokens (targets) of the first ``step`` batches of a run on one process."""
        syn = step * self.repeat_rows * row_length(self.context)
        return syn, syn + step * self.batch_size * self.context

    def loss(self, model: nn.Module, batch: Tensor | tuple[Tensor, Tensor], step: int,
             label_smoothing: float) -> Tensor:
        if isinstance(batch, tuple):  # text, then synthetic rows: their mean losses, the rows' weighted
            text, syn = batch
            syn = syn.to(self.device)
            logits = model(syn[:, :-1]).logits
            keep = copied_targets(syn)
            copied = F.cross_entropy(logits[keep].float(), syn[:, 1:][keep], label_smoothing=label_smoothing)
            return self.loss(model, text, step, label_smoothing) + REPEAT_WEIGHT * copied
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
            if not n:  # a source without validation documents (a tiny --train-limit) has no perplexity
                continue
            out[f"val_ppl_{name}"] = math.exp(nll / n)
            total_nll, total_n = total_nll + nll, total_n + n
        out["val_ppl"] = math.exp(total_nll / total_n)
        out["score"] = -math.log(out["val_ppl"])
        out["val_copy_gain"] = copy_gain(model, self.vocab, self.device, n=min(64, (self.context - 1) // 2))
        return out


@torch.no_grad()
def copy_gain(model: nn.Module, vocab: int, device: torch.device, n: int = 64, rows: int = 8) -> float:
    """Mean NLL (nats per piece) on the first copy of ``<s> x x`` minus that on the second, ``x`` ``n`` ordinary
    pieces drawn uniformly (fixed seed): what the model gains by copying."""
    was = model.training
    model.eval()
    span = repeated_spans(rows, 2 * n, vocab, seed=12345, lengths=(n, n))[:, 1 : n + 1]
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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    ap.add_argument("--out", type=Path, required=True, help="checkpoint folder to write")
    ap.add_argument("--run-dir", type=Path, required=True, help="logs, the tokeniser and resumable state")
    ap.add_argument("--vocab", type=int, default=4096, help="SentencePiece pieces")
    ap.add_argument("--context", type=int, default=256, help="tokens per training context (the model's positions)")
    ap.add_argument("--batch-size", type=int, default=16, help="contexts per batch per process")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4, help="key/value heads (0: as many as heads)")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--repeat-share", type=float, default=0.065,
                    help="share of every batch's tokens in synthetic repeated spans (at most 0.10; see the docstring)")
    ap.add_argument("--select", choices=["last", "best"], default="last",
                    help="the checkpoint's weights: the run's last (fixed in advance) or the best validation epoch")
    ap.add_argument("--train-limit", type=int, default=None, help="use only this many lines per source (tests)")
    add_train_args(ap, DEFAULTS)
    args = ap.parse_args(argv)
    if not 0 <= args.repeat_share <= 0.10:
        ap.error("--repeat-share must be between 0 and 0.10")
    repeat_rows = rows_per_batch(args.repeat_share, args.batch_size, args.context)
    row = row_length(args.context)
    share = repeat_rows * row / (repeat_rows * row + args.batch_size * args.context)
    if share > 0.10:
        ap.error(f"--repeat-share {args.repeat_share} needs {repeat_rows} rows of {row} tokens a batch, "
                 f"{share:.1%} of its tokens (more than 10 %): use a larger --batch-size or --context")
    setup_threads(args.threads)
    d = setup_distributed(args.device)
    cfg = config_from_args(args)

    from models.families.gpt import GPT, GPTConfig
    from models.inputs.tokenizer import SentencePieceTokenizer
    from models.io.checkpoint import save_checkpoint

    corpus = load_corpus(args.data_dir)
    if args.train_limit:
        corpus = {split: {k: v[: args.train_limit] for k, v in part.items()} for split, part in corpus.items()}
    tok_path = Path(args.run_dir) / "tokenizer.model"
    if not tok_path.is_file():  # trained on the training text only; kept in the run for --resume
        train_sentencepiece([t for texts in corpus["train"].values() for t in texts], tok_path, args.vocab)
    text = {"lowercase": False}
    tok = SentencePieceTokenizer(tok_path, text)
    train_docs, groups = training_documents(tok, corpus["train"], OVERSAMPLE, group_phrases=True)
    val_docs = {name: encode_documents(tok, texts) for name, texts in corpus["val"].items()}
    task = LMTask(train_docs, val_docs, args.context, args.batch_size, tok.vocab_size, cfg.seed, d.device,
                  repeat_rows=repeat_rows, groups=groups)

    torch.manual_seed(cfg.seed)
    mcfg = GPTConfig(recipe="llama", vocab_size=tok.vocab_size, max_len=args.context, d_model=args.d_model,
                     n_layers=args.layers, n_heads=args.heads, n_kv_heads=args.kv_heads, dropout=args.dropout,
                     bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID, qkv_bias=True)
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
        record = training_record(result, model, d, cfg, cmd)
        best = ("also the best validation epoch" if info["epoch"] == result.best_epoch
                else f"not the best validation epoch ({result.best_epoch})")
        record["selection"] = (f"the last weights (epoch {info['epoch']}, step {info['step']:,}), {best}"
                               if args.select == "last" else f"the best validation epoch ({info['epoch']})")
        syn, total = task.token_counts(int(info["step"]))
        record["data"] = {
            "train": {k: f"{len(v):,} lines" for k, v in corpus["train"].items()},
            "sources": "Multi30k train.en; AG News train.tsv less 1,000 held-out lines (seed 0), every line twice an "
                       "epoch; SST-2 train.tsv less the grouped hold-out (train.data.grouped_holdout)",
            "natural_tokens_per_epoch": sum(len(doc) for doc in train_docs),
            "packing": "documents shuffled each epoch; SST-2 lines grouped by sentence (train.lm.phrase_groups: a "
                       "phrase goes with the longest line holding it), a group's lines one after another",
            "synthetic_repeated_spans": {
                "rows": (f"{repeat_rows} rows of {row} tokens in every batch: <s> x x [x], x "
                         f"{REPEAT_SPANS[0]}-{REPEAT_SPANS[1]} pieces, in turn drawn uniformly from the ordinary "
                         "pieces and cut from the training text (train.lm.repeated_spans), their "
                         f"mean loss on the copied pieces (train.lm.copied_targets) weighted {REPEAT_WEIGHT}"),
                "up_to_shipped_weights": {"steps": int(info["step"]), "synthetic_tokens": syn,
                                          "training_tokens": total,
                                          "share_of_training_tokens": round(syn / max(1, total), 4)}},
        }
        if len(commands) > 1:
            record["commands"] = commands  # "command" is the last of them
        record["validation"] = {"split": "Multi30k val.en (1,014), 1,000 held-out AG News train lines, 1,000 "
                                         "grouped-held-out SST-2 sentences; perplexity per piece, </s> included",
                                **info["metrics"]}
        save_checkpoint(args.out, model, labels=[], text=text, extra_files={"tokenizer.model": tok_path},
                        metrics={"training": record})
        print(json.dumps({"checkpoint": str(args.out), "epoch": info["epoch"], **info["metrics"]}))
    cleanup_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
