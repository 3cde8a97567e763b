"""Train a TextClassifier from scratch on SST-2 or AG News and write its checkpoint folder.

    python -m train.tokenizers --only sst2 agnews
    python -m train.classifier --task sst2 --out checkpoints/sst2 --run-dir runs/sst2 --epochs 6
    python -m train.classifier --task agnews --out checkpoints/agnews --run-dir runs/agnews --epochs 10

SST-2 trains on every phrase and sentence of ``train.tsv`` except the 2,000 held-out lines (its text is
lower-cased and PTB-tokenised, and the app normalises input the same way); AG News on its 10k
descriptions except 1,000 held-out lines (cased). Model selection: accuracy on the held-out lines; the
reported figure comes from ``python -m train.evaluate classification`` on SST-2 ``dev.tsv`` / AG News
``test.tsv``. SST-2's held-out lines are mostly phrases of sentences that stay in training, so their score
does not predict dev; ``--holdout grouped`` holds out 1,000 whole sentences instead and drops their phrases
from training (``train.data.grouped_holdout``; about 13 % of the training lines).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from train.data import DEFAULT_DATA_DIR, HOLDOUT_SPLITS, TextExamples, add_holdout_arg, load_text_task, task_labels
from train.loop import (
    TrainConfig,
    add_train_args,
    cached_teacher,
    cleanup_distributed,
    config_from_args,
    distillation_loss,
    dump_digest,
    load_best,
    setup_distributed,
    setup_threads,
    train,
    training_record,
)
from train.text import augment_texts, length_batches, pad
from train.tokenizers import DEFAULT_OUT, PAD_ID

DEFAULTS = TrainConfig(epochs=8, lr=1e-3, weight_decay=0.01, warmup_steps=200, label_smoothing=0.1)
TEXT_SETTINGS: dict[str, dict[str, Any]] = {
    "sst2": {"lowercase": True, "split_punct": True},  # GLUE SST-2 text is lower-cased and tokenised
    "agnews": {"lowercase": False},  # AG News keeps case
}


def encode_texts(tok: Any, texts: list[str]) -> list[list[int]]:
    return [tok.encode(t).ids for t in texts]


@torch.no_grad()
def predict(model: nn.Module, ids: list[list[int]], batch_size: int = 256, progress: bool = False) -> list[int]:
    """Predicted class per example (batched by length, returned in input order)."""
    from tqdm import tqdm

    model.eval()
    device = next(model.parameters()).device
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = [0] * len(ids)
    with tqdm(total=len(ids), disable=not progress, desc="classify", file=sys.stderr) as bar:
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            logits = model(pad([ids[j] for j in idx], PAD_ID).to(device))
            for j, p in zip(idx, logits.argmax(-1).tolist()):
                out[j] = p
            bar.update(len(idx))
    return out


def accuracy(preds: list[int], labels: list[int]) -> float:
    return sum(int(p == y) for p, y in zip(preds, labels)) / max(1, len(labels))


@torch.no_grad()
def teacher_logits(teacher: nn.Module, texts: list[str], batch_size: int = 64) -> Tensor:
    """(N, C) logits of a trained classifier checkpoint (``models.load``) over ``texts``, in input order."""
    from tqdm import tqdm

    teacher.eval()
    ids = [teacher.tokenizer.encode(t, max_tokens=teacher.config.max_len).ids for t in texts]
    pad_id = teacher.config.pad_id
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = torch.zeros(len(ids), teacher.config.n_classes)
    for i in tqdm(range(0, len(order), batch_size), desc="teacher", file=sys.stderr):
        idx = order[i:i + batch_size]
        x = pad([ids[j] for j in idx], pad_id)
        mask = torch.ones_like(x, dtype=torch.bool)
        for row, j in enumerate(idx):
            mask[row, : len(ids[j])] = False
        out[idx] = teacher(x, mask).float()
    return out


class ClassificationTask:
    """Cross-entropy on the labels, with distillation from ``teacher`` logits (``train.loop.distillation_loss``)."""

    def __init__(self, train_ids: list[list[int]], train_labels: list[int], val_ids: list[list[int]],
                 val_labels: list[int], max_tokens: int, max_sentences: int, seed: int,
                 device: torch.device, teacher: Tensor | None = None, alpha: float = 0.5,
                 temperature: float = 2.0) -> None:
        self.ids, self.labels = train_ids, torch.tensor(train_labels)
        self.val_ids, self.val_labels = val_ids, val_labels
        self.lengths = [len(s) for s in train_ids]
        self.max_tokens, self.max_sentences, self.seed, self.device = max_tokens, max_sentences, seed, device
        self.teacher, self.alpha, self.temperature = teacher, alpha, temperature

    def train_batches(self, epoch: int) -> list[list[int]]:
        return length_batches(self.lengths, self.max_tokens, self.max_sentences, self.seed, epoch)

    def loss(self, model: nn.Module, batch: list[int], step: int, label_smoothing: float) -> Tensor:
        x = pad([self.ids[i] for i in batch], PAD_ID).to(self.device)
        logits = model(x).float()
        teacher = None if self.teacher is None else self.teacher[batch].to(self.device)
        return distillation_loss(logits, self.labels[batch].to(self.device), teacher, self.alpha,
                                 self.temperature, label_smoothing)

    def validate(self, model: nn.Module) -> dict[str, float]:
        acc = accuracy(predict(model, self.val_ids), self.val_labels)
        return {"score": acc, "val_accuracy": acc}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=["sst2", "agnews"], required=True)
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="SentencePiece model (default runs/tokenizers/<task>.model)")
    ap.add_argument("--out", type=Path, required=True, help="checkpoint folder to write")
    ap.add_argument("--run-dir", type=Path, required=True, help="logs and resumable state")
    ap.add_argument("--max-tokens", type=int, default=4096, help="padded tokens per batch per process")
    ap.add_argument("--batch-size", type=int, default=128, help="max sentences per batch per process")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-ff", type=int, default=512)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--pooling", choices=["cls", "mean"], default="mean")
    ap.add_argument("--train-limit", type=int, default=None, help="use only this many examples (tests)")
    ap.add_argument("--teacher", type=Path, default=None,
                    help="checkpoint folder of a trained classifier for the same task (e.g. checkpoints/minilm-sst2):"
                         " distil its predictions into the model trained from scratch")
    ap.add_argument("--distill-alpha", type=float, default=0.5, help="weight of the distillation loss")
    ap.add_argument("--temperature", type=float, default=2.0, help="distillation temperature")
    ap.add_argument("--augment", type=int, default=0, metavar="K",
                    help="with --teacher: add K perturbed copies of each training text of 10+ words, labelled by the "
                         "teacher alone (train.text.augment_texts; Tang et al. 2019)")
    ap.add_argument("--augment-min-words", type=int, default=10, help="shortest training text that --augment copies")
    add_holdout_arg(ap)
    add_train_args(ap, DEFAULTS)
    args = ap.parse_args(argv)
    if args.augment and args.teacher is None:
        ap.error("--augment needs --teacher: the perturbed texts have no labels of their own")
    setup_threads(args.threads)
    d = setup_distributed(args.device)
    cfg = config_from_args(args)

    from models.families.classifier import ClassifierConfig, TextClassifier
    from models.inputs.tokenizer import SentencePieceTokenizer

    tok_path = args.tokenizer or DEFAULT_OUT / f"{args.task}.model"
    text = TEXT_SETTINGS[args.task]
    tok = SentencePieceTokenizer(tok_path, text)
    data = load_text_task(args.data_dir, args.task, args.holdout)
    tr, va = data["train"], data["val"]
    if args.train_limit:
        tr = TextExamples(tr.texts[:args.train_limit], tr.labels[:args.train_limit])
        va = TextExamples(va.texts[:args.train_limit], va.labels[:args.train_limit])
    soft = None
    n_aug = 0
    if args.teacher is not None:
        import models

        aug = augment_texts(tr.texts, args.augment, seed=cfg.seed, min_words=args.augment_min_words)
        n_aug = len(aug)
        soft = cached_teacher(args.run_dir, args.resume, lambda: teacher_logits(models.load(args.teacher),
                                                                                tr.texts + aug), d)
        # the perturbed texts take the teacher's answer as their label
        tr = TextExamples(tr.texts + aug, tr.labels + soft[len(tr.texts):].argmax(-1).tolist())
    task = ClassificationTask(encode_texts(tok, tr.texts), tr.labels, encode_texts(tok, va.texts), va.labels,
                              args.max_tokens, args.batch_size, cfg.seed, d.device, teacher=soft,
                              alpha=args.distill_alpha, temperature=args.temperature)

    labels = task_labels(args.task)
    torch.manual_seed(cfg.seed)
    mcfg = ClassifierConfig(vocab_size=tok.vocab_size, n_classes=len(labels), d_model=args.d_model,
                            n_heads=args.heads, n_layers=args.layers, d_ff=args.d_ff, dropout=args.dropout,
                            max_len=128, pooling=args.pooling, pad_id=PAD_ID)
    model = TextClassifier(mcfg).to(d.device)
    result = train(model, task, cfg, args.run_dir, resume=args.resume, d=d, desc=args.task)
    dump_digest(model, args.dump_digest, d)
    if result.finished and d.main:
        state, info = load_best(args.run_dir)
        model.load_state_dict(state)
        from models.io.checkpoint import save_checkpoint

        cmd = ["python", "-m", "train.classifier", *(argv if argv is not None else sys.argv[1:])]
        record = training_record(result, model, d, cfg, cmd)
        record["validation"] = {"split": HOLDOUT_SPLITS[args.holdout].format(n=len(va), task=args.task),
                                **info["metrics"]}
        if args.teacher is not None:
            record["distillation"] = {"teacher": str(args.teacher), "alpha": args.distill_alpha,
                                      "temperature": args.temperature, "augmented_texts": n_aug}
        save_checkpoint(args.out, model, labels=labels, text=text, extra_files={"tokenizer.model": tok_path},
                        metrics={"training": record})
        print(json.dumps({"checkpoint": str(args.out), "best_epoch": info["epoch"], **info["metrics"]}))
    cleanup_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
