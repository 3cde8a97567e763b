"""Train a ViT or Swin on Fashion-MNIST and write its checkpoint folder.

    python -m train.vision --model vit --out checkpoints/vit-fashion --run-dir runs/vit-fashion \\
        --epochs 12 --set dim=96 depth=6 heads=4 mlp_dim=192
    python -m train.vision --model swin --out checkpoints/swin-fashion --run-dir runs/swin-fashion --epochs 8
    python -m train.vision --model swin --init checkpoints/swin-fashion --out runs/swin-more/ckpt \
        --run-dir runs/swin-more --epochs 4 --lr 2e-4       # continue a trained model (its config and weights)
    python -m train.vision --model swin --init checkpoints/swin-fashion --out runs/swin-swa/ckpt \
        --run-dir runs/swin-swa --epochs 6 --lr 5e-5 --min-lr-ratio 1 --keep-last 6 --average-last 6
        # stochastic weight averaging: a constant lr, then the mean of the epochs' weights if validation prefers it
    python -m train.vision --model swin --init checkpoints/swin-fashion --out runs/swin-kd/ckpt \
        --run-dir runs/swin-kd --epochs 4 --lr 2e-4 --teacher checkpoints/vit-fashion checkpoints/swin-fashion
        # distillation from an ensemble: the mean probabilities of the teachers, each on the image and its mirror

Model selection: accuracy on the last 5,000 training images (data README); the reported figure comes
from ``python -m train.evaluate vision`` on t10k. Augmentation: random shifts of up to 2 pixels (zero
padding) and horizontal flips, drawn from a generator seeded by (seed, step), so a resumed run repeats an
uninterrupted one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models import registry
from train.data import DEFAULT_DATA_DIR, FASHION_CLASSES, load_fashion
from train.loop import (
    TrainConfig,
    add_train_args,
    cached_teacher,
    cleanup_distributed,
    config_from_args,
    distillation_loss,
    dump_digest,
    load_best,
    load_init,
    prefer_average,
    setup_distributed,
    setup_threads,
    train,
    training_record,
)

# The vision families this command trains on Fashion-MNIST (models.registry names; DeiT needs a teacher's
# distillation target and is read from Hugging Face folders instead)
TRAINABLE = ("vit", "swin")
DEFAULTS = TrainConfig(epochs=10, lr=1e-3, weight_decay=0.05, warmup_steps=300, label_smoothing=0.1)


def build_model(kind: str, overrides: dict[str, Any]) -> nn.Module:
    """A ViT or Swin for 28×28 grey images with the given config overrides."""
    if kind not in TRAINABLE:
        raise ValueError(f"unknown model {kind!r} ({' or '.join(TRAINABLE)})")
    cls, cfg_cls = registry.FAMILIES[kind].classes()
    cfg = cfg_cls(**overrides)
    return cls(cfg, labels=list(FASHION_CLASSES))


def parse_overrides(items: list[str], kind: str) -> dict[str, Any]:
    """``["dim=96", "depths=2,2"]`` -> {"dim": 96, "depths": (2, 2)} (types from the config's defaults)."""
    defaults = dataclasses.asdict(registry.FAMILIES[kind].classes()[1]())
    out: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        if key not in defaults:
            raise SystemExit(f"--set {key}: unknown config field; known: {sorted(defaults)}")
        d = defaults[key]
        if isinstance(d, tuple | list):
            out[key] = tuple(int(v) for v in value.split(","))
        elif isinstance(d, bool):
            out[key] = value.lower() in ("1", "true", "yes")
        else:
            out[key] = type(d)(value)
    return out


def to_input(images: np.ndarray | Tensor) -> Tensor:
    """uint8 (B, 28, 28) -> normalised float (B, 1, 28, 28), exactly as the models' classify() prepares it."""
    from models.inputs.images import fashion_tensor

    return fashion_tensor(images)


def augment(x: Tensor, gen: torch.Generator, max_shift: int = 2) -> Tensor:
    """Random horizontal flips and shifts of up to ``max_shift`` pixels (uint8 (B, H, W) in and out)."""
    B, H, W = x.shape
    flip = torch.rand(B, generator=gen) < 0.5
    x = torch.where(flip[:, None, None], x.flip(-1), x)
    padded = F.pad(x, (max_shift,) * 4)
    dy = torch.randint(0, 2 * max_shift + 1, (B,), generator=gen)
    dx = torch.randint(0, 2 * max_shift + 1, (B,), generator=gen)
    rows = (dy[:, None] + torch.arange(H)[None, :])[:, :, None].expand(B, H, W)
    cols = (dx[:, None] + torch.arange(W)[None, :])[:, None, :].expand(B, H, W)
    return padded[torch.arange(B)[:, None, None], rows, cols]


@torch.no_grad()
def accuracy(model: nn.Module, images: np.ndarray, labels: np.ndarray, batch_size: int = 500,
             progress: bool = False) -> float:
    from tqdm import tqdm

    model.eval()
    device = next(model.parameters()).device
    correct = 0
    for i in tqdm(range(0, len(images), batch_size), disable=not progress, desc="evaluate", file=sys.stderr):
        logits = model(to_input(images[i:i + batch_size]).to(device))
        correct += int((logits.argmax(-1).cpu() == torch.as_tensor(labels[i:i + batch_size])).sum())
    return correct / len(images)


@torch.no_grad()
def ensemble_logits(teachers: list[nn.Module], images: np.ndarray, batch_size: int = 500) -> Tensor:
    """Log of the mean class probabilities of ``teachers``, each on the images and their mirror images
    (the same horizontal flip the training augmentation draws), as (N, classes) float32 on the CPU."""
    from tqdm import tqdm

    out = []
    for i in tqdm(range(0, len(images), batch_size), desc="teacher", file=sys.stderr):
        x = to_input(images[i:i + batch_size])
        probs = [m.eval()(v.to(next(m.parameters()).device)).float().softmax(-1).cpu()
                 for m in teachers for v in (x, x.flip(-1))]
        out.append(torch.stack(probs).mean(0).log())
    return torch.cat(out)


class VisionTask:
    """Cross-entropy on the labels of augmented images; with ``teacher`` logits (one row per training image,
    from the un-augmented image) distillation as well (``train.loop.distillation_loss``)."""

    def __init__(self, data: dict[str, tuple[np.ndarray, np.ndarray]], batch_size: int, seed: int,
                 device: torch.device, augment: bool = True, teacher: Tensor | None = None,
                 alpha: float = 0.5, temperature: float = 2.0) -> None:
        self.x, self.y = (torch.from_numpy(a) for a in data["train"])
        self.val = data["val"]
        self.batch_size, self.seed, self.device, self.augment = batch_size, seed, device, augment
        self.teacher, self.alpha, self.temperature = teacher, alpha, temperature

    def train_batches(self, epoch: int) -> list[Tensor]:
        order = torch.from_numpy(np.random.default_rng((self.seed, epoch)).permutation(len(self.x)))
        n = len(order) // self.batch_size
        return [order[i * self.batch_size:(i + 1) * self.batch_size] for i in range(n)]

    def loss(self, model: nn.Module, batch: Tensor, step: int, label_smoothing: float) -> Tensor:
        x = self.x[batch]
        if self.augment:
            x = augment(x, torch.Generator().manual_seed(self.seed * 1_000_003 + step))
        logits = model(to_input(x).to(self.device)).float()
        teacher = None if self.teacher is None else self.teacher[batch].to(self.device)
        return distillation_loss(logits, self.y[batch].to(self.device), teacher, self.alpha, self.temperature,
                                 label_smoothing)

    def validate(self, model: nn.Module) -> dict[str, float]:
        acc = accuracy(model, *self.val)
        return {"score": acc, "val_accuracy": acc}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=TRAINABLE, required=True)
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    ap.add_argument("--out", type=Path, required=True, help="checkpoint folder to write")
    ap.add_argument("--run-dir", type=Path, required=True, help="logs and resumable state")
    ap.add_argument("--batch-size", type=int, default=128, help="per process")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="model config overrides, e.g. dim=96 depth=6 (ViTConfig / SwinConfig fields)")
    ap.add_argument("--no-augment", action="store_true")
    ap.add_argument("--train-limit", type=int, default=None, help="use only this many training images (tests)")
    ap.add_argument("--init", type=Path, default=None,
                    help="start from this checkpoint folder's weights and config (--set is then not allowed)")
    ap.add_argument("--average-last", type=int, default=0,
                    help="also try the mean of the last K epochs' weights (needs --keep-last K) and ship it if "
                         "its validation accuracy beats the best epoch's")
    ap.add_argument("--teacher", type=Path, nargs="+", default=None, metavar="DIR",
                    help="checkpoint folders of trained vision models: distil the mean of their predictions (each on "
                         "the image and its mirror image) into the model trained here")
    ap.add_argument("--distill-alpha", type=float, default=0.5, help="weight of the distillation loss")
    ap.add_argument("--temperature", type=float, default=2.0, help="distillation temperature")
    add_train_args(ap, DEFAULTS)
    args = ap.parse_args(argv)
    setup_threads(args.threads)
    d = setup_distributed(args.device)
    cfg = config_from_args(args)

    data = load_fashion(args.data_dir)
    if args.train_limit:
        data["train"] = (data["train"][0][:args.train_limit], data["train"][1][:args.train_limit])
        data["val"] = (data["val"][0][:args.train_limit], data["val"][1][:args.train_limit])
    torch.manual_seed(cfg.seed)
    init_record = None
    if args.init is not None:
        if args.set:
            raise SystemExit("--init takes the model config from the checkpoint; drop --set")
        model, init_record = load_init(args.init, args.model)
        model = model.to(d.device)
    else:
        model = build_model(args.model, parse_overrides(args.set, args.model)).to(d.device)
    soft = None
    if args.teacher:
        import models

        soft = cached_teacher(args.run_dir, args.resume, lambda: ensemble_logits(
            [models.load(t, device=str(d.device)) for t in args.teacher], data["train"][0]), d)
    task = VisionTask(data, args.batch_size, cfg.seed, d.device, augment=not args.no_augment, teacher=soft,
                      alpha=args.distill_alpha, temperature=args.temperature)
    result = train(model, task, cfg, args.run_dir, resume=args.resume, d=d, desc=args.model)
    dump_digest(model, args.dump_digest, d)
    if result.finished and d.main:
        state, info = load_best(args.run_dir)
        if args.average_last > 1:
            state, info = prefer_average(model, task, args.run_dir, args.average_last, state, info)
        model.load_state_dict(state)
        from models.io.checkpoint import save_checkpoint

        cmd = ["python", "-m", "train.vision", *(argv if argv is not None else sys.argv[1:])]
        record = training_record(result, model, d, cfg, cmd)
        record["batch_size"] = args.batch_size * d.world
        record["validation"] = {"split": "last 5,000 Fashion-MNIST training images", **info["metrics"]}
        record["shipped_epoch"] = info["epoch"]  # an epoch number, or "mean of [...]" (--average-last)
        if init_record is not None:
            record["init"] = init_record
        if args.teacher:
            record["distillation"] = {"teachers": [str(t) for t in args.teacher], "alpha": args.distill_alpha,
                                      "temperature": args.temperature, "views": "image and mirror image"}
        save_checkpoint(args.out, model, labels=list(FASHION_CLASSES), text={}, metrics={"training": record})
        print(json.dumps({"checkpoint": str(args.out), "best_epoch": info["epoch"], **info["metrics"]}))
    cleanup_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
