"""Train the own small VLM (models/families/vlm.py) on composed Fashion-MNIST scenes, and evaluate it.

    python -m train.vlm --data-dir ../shared/data --steps 6000 --max-minutes 55 --eval-every 250 \
        --out checkpoints/vlm-fashion --run-dir runs/vlm-fashion
    python -m train.vlm --evaluate checkpoints/vlm-fashion --write   # test scenes -> metrics.json (and prints it)

Each step draws a batch of scenes of the training items (train/scenes.py: items from the first 55,000 training
images, scene i of the seed-1 stream at step s is index s·batch + j, so a resumed run sees what an uninterrupted one
would) with one task each (caption, "what is at …?", "where is the …?"). The sequence is [image tokens, <s>, prompt,
answer, </s>]; the loss is the cross-entropy of the answer's words and </s> only (the image and the prompt are given,
not predicted). Every ``--eval-every`` steps the answer loss and word accuracy on validation scenes (the last 5,000
training images, seed 2) decide the best weights (early stopping: ``--patience`` evaluations without improvement).
Resumable state (model, optimiser, step, best) goes to RUN_DIR/state.pt every ``--save-minutes`` (torch.save of
tensors and numbers, read back with weights_only=True); the log to RUN_DIR/log.jsonl. The checkpoint folder is
written once, at the end, from the best weights, with the word-level tokenizer.json.

Evaluation (on scenes of t10k items, seed 3; never used for training or selection), greedy answers:
``caption_exact`` (the whole caption right), ``caption_items`` (each item's class word and place right, counted
per item of the scene, in the caption's order), ``what_accuracy`` (answers to "what is at <place>?" for every place
of a scene, empty ones included: "nothing"), ``what_items_accuracy`` (the same for the places holding an item: the
item named right), ``where_accuracy`` ("where is the <class>?" for each class present: every place of that class).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from models.families.vlm import VLM, VLMConfig
from models.inputs.tokenizer import JsonTokenizer
from train.data import DEFAULT_DATA_DIR, FASHION_CLASSES, load_fashion
from train.scenes import (
    CAPTION_PROMPT,
    PLACES,
    SEEDS,
    TEXT,
    VOCAB,
    caption,
    make_scene,
    training_text,
    write_tokenizer,
)

IGNORE = -100


class Encoder:
    """Prompt and answer words -> (ids, the answer's mask), through the checkpoint's own tokenizer (cached)."""

    def __init__(self, tokenizer: JsonTokenizer, config: VLMConfig) -> None:
        self.tok, self.c, self.cache = tokenizer, config, {}

    def words(self, text: str) -> list[int]:
        if text not in self.cache:
            self.cache[text] = self.tok.encode(text, add_special=False, max_tokens=10_000).ids
        return self.cache[text]

    def pair(self, prompt: str, answer: str) -> tuple[list[int], list[int]]:
        """(ids <s> prompt answer </s>, labels: the next token where it is an answer word or </s>, else IGNORE)."""
        p, a = self.words(prompt), self.words(answer)
        ids = [self.c.bos_id, *p, *a, self.c.eos_id]
        # position j predicts ids[j + 1]: the answer's words and </s> are targets, the prompt's are given
        return ids, [IGNORE] * len(p) + a + [self.c.eos_id, IGNORE]


def batch(items: tuple[np.ndarray, np.ndarray], encoder: Encoder, seed: int, indices: range | list[int]
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(images uint8 (B, S, S), ids (B, T) padded, labels (B, T): what each text position predicts or IGNORE)."""
    images, rows, targets = [], [], []
    for i in indices:
        scene = make_scene(*items, seed, i)
        ids, labels = encoder.pair(*training_text(scene, seed, i))
        images.append(scene.image)
        rows.append(ids)
        targets.append(labels)
    t = max(len(r) for r in rows)
    pad = encoder.c.pad_id
    ids = torch.tensor([r + [pad] * (t - len(r)) for r in rows])
    labels = torch.tensor([r + [IGNORE] * (t - len(r)) for r in targets])
    return torch.from_numpy(np.stack(images)), ids, labels


def answer_loss(model: VLM, images: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean cross-entropy over the answer positions, correct argmax count) of one batch."""
    n = model.config.image_tokens
    logits = model(images, ids).logits[:, n:]  # (B, T, V): the text positions
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1), ignore_index=IGNORE)
    mask = labels != IGNORE
    correct = ((logits.argmax(-1) == labels) & mask).sum()
    return loss, correct


@torch.no_grad()
def validate(model: VLM, data: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    model.eval()
    total = correct = count = 0.0
    for images, ids, labels in data:
        loss, right = answer_loss(model, images, ids, labels)
        k = int((labels != IGNORE).sum())
        total += float(loss) * k
        correct += float(right)
        count += k
    model.train()
    return {"val_loss": total / count, "val_word_accuracy": correct / count}


def lr_at(step: int, total: int, peak: float, warmup: int, time_progress: float = 0.0) -> float:
    """Linear warm-up, then cosine to 5 % of the peak (Loshchilov & Hutter 2017), by steps or by the share of the time
    budget spent, whichever is further (so a run on a busy machine still ends its schedule in time)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, max((step - warmup) / max(1, total - warmup), time_progress))
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


def log(run_dir: Path, record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)
    with open(run_dir / "log.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def run_training(a: argparse.Namespace) -> None:
    torch.set_num_threads(a.threads)
    run_dir = Path(a.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tok_path = write_tokenizer(run_dir / "tokenizer.json")
    tokenizer = JsonTokenizer(tok_path, TEXT)
    overrides = dict(kv.split("=", 1) for kv in a.set)
    config = VLMConfig(vocab_size=len(VOCAB), **{k: type(getattr(VLMConfig, k))(v) for k, v in overrides.items()})
    torch.manual_seed(a.seed)
    model = VLM(config)
    model.train()
    encoder = Encoder(tokenizer, config)
    splits = load_fashion(a.data_dir)
    train_items, val_items = splits["train"], splits["val"]
    val = [batch(val_items, encoder, SEEDS["val"], range(i, i + a.batch)) for i in range(0, a.val_scenes, a.batch)]
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.98))
    state_path, best_path = run_dir / "state.pt", run_dir / "best.pt"
    step, best, stale, spent = 0, float("inf"), 0, 0.0
    if state_path.is_file():  # resume
        state = torch.load(state_path, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, best, stale = int(state["step"]), float(state["best"]), int(state["stale"])
        spent = float(state["spent"])
        log(run_dir, {"resumed": step, "best": best})
    last_save, start = time.time(), time.time()

    def save_state() -> None:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "best": best,
                    "stale": stale, "spent": spent + time.time() - start}, run_dir / "state.tmp")
        os.replace(run_dir / "state.tmp", state_path)

    while step < a.steps:
        elapsed = spent + time.time() - start
        if elapsed > 60 * a.max_minutes:
            log(run_dir, {"time_budget_spent": step})
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, a.steps, a.lr, a.warmup, elapsed / (60 * a.max_minutes))
        images, ids, labels = batch(train_items, encoder, SEEDS["train"], range(step * a.batch, (step + 1) * a.batch))
        loss, _ = answer_loss(model, images, ids, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % a.log_every == 0:
            log(run_dir, {"step": step, "loss": round(float(loss.detach()), 4), "lr": opt.param_groups[0]["lr"],
                          "elapsed_s": round(spent + time.time() - start, 1)})
        if step % a.eval_every == 0 or step == a.steps:
            v = validate(model, val)
            improved = v["val_loss"] < best
            if improved:
                best, stale = v["val_loss"], 0
                torch.save({k: t.detach().clone() for k, t in model.state_dict().items()}, best_path)
            else:
                stale += 1
            log(run_dir, {"step": step, **{k: round(x, 4) for k, x in v.items()}, "best": round(best, 4),
                          "improved": improved})
            if stale >= a.patience:
                log(run_dir, {"early_stop": step})
                break
        if time.time() - last_save > 60 * a.save_minutes:
            save_state()
            last_save = time.time()
    save_state()
    model.load_state_dict(torch.load(best_path, weights_only=True))
    if a.out:
        write_checkpoint(model, a.out, tok_path, run_dir, "python -m train.vlm " + " ".join(sys.argv[1:]))


def write_checkpoint(model: VLM, out: str, tok_path: Path, run_dir: Path, command: str) -> None:
    """The checkpoint folder from ``model`` (the best weights), with the training record of RUN_DIR/log.jsonl in
    metrics.json (the evaluation adds its figures there)."""
    import platform

    from models.io.checkpoint import save_checkpoint

    history = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines() if line.strip()]
    evals = [h for h in history if "val_loss" in h]
    best = min(evals, key=lambda h: h["val_loss"]) if evals else {}
    steps = max((h["step"] for h in history if "step" in h), default=0)
    minutes = max((h.get("elapsed_s", 0.0) for h in history), default=0.0) / 60
    record = {"command": command, "parameters": sum(p.numel() for p in model.parameters()), "steps": steps,
              "best_step": best.get("step"), "best_validation_loss": best.get("val_loss"),
              "best_validation_word_accuracy": best.get("val_word_accuracy"), "minutes": round(minutes, 1),
              "hardware": f"{platform.processor() or platform.machine()} ({os.cpu_count()} logical cores, shared), "
                          f"{torch.get_num_threads()} torch thread(s), CPU", "torch": torch.__version__,
              "config": dataclasses.asdict(model.config), "history": evals}
    save_checkpoint(out, model, labels=list(FASHION_CLASSES), text=TEXT, extra_files={"tokenizer.json": tok_path},
                    metrics={"training": record})
    print(json.dumps({"checkpoint": out}), flush=True)


# ------------------------------------------------------------------------------------------- evaluation
def answer(model: VLM, image: np.ndarray, prompt: str, max_new_tokens: int = 40) -> str:
    """The greedy answer, no attention (the evaluation's fast path)."""
    c = model.config
    with torch.no_grad():
        ids, _ = model.encode_text(prompt)
        embeds, _ = model.encode_image(torch.from_numpy(image)[None])
        text = torch.tensor([ids])
        new: list[int] = []
        for _ in range(max_new_tokens):
            ids_now = torch.cat([text, torch.tensor([new], dtype=torch.long)], 1)
            logits = model(None, ids_now, image_embeds=embeds).logits
            token = int(logits[0, -1].argmax())
            if token == c.eos_id:
                break
            new.append(token)
    return " ".join(model.piece(i) for i in new)


def evaluate(folder: str, n: int, data_dir: str, threads: int) -> dict[str, Any]:
    import models

    torch.set_num_threads(threads)
    model = models.load(folder)
    images, labels = load_fashion(data_dir)["test"]
    stats = {"caption_exact": [], "caption_items": [], "what": [], "what_items": [], "where": []}
    for i in range(n):
        scene = make_scene(images, labels, SEEDS["test"], i)
        said = answer(model, scene.image, CAPTION_PROMPT)
        stats["caption_exact"].append(said == caption(scene.items))
        parts = said.split(" and ")
        for k, it in enumerate(scene.items):
            stats["caption_items"].append(k < len(parts) and parts[k] == caption([it]))
        for cell in range(9):
            hit = [it for it in scene.items if it.cell == cell]
            truth = f"a {hit[0].word}" if hit else "nothing"
            right = answer(model, scene.image, f"what is {PLACES[cell]} ?") == truth
            stats["what"].append(right)
            if hit:
                stats["what_items"].append(right)
        for label in sorted({it.label for it in scene.items}):
            word = next(it.word for it in scene.items if it.label == label)
            truth = " and ".join(PLACES[it.cell] for it in scene.items if it.label == label)
            stats["where"].append(answer(model, scene.image, f"where is the {word} ?") == truth)
    return {"split": "test", "scenes": n, "seed": SEEDS["test"],
            "caption_exact": float(np.mean(stats["caption_exact"])),
            "caption_items": float(np.mean(stats["caption_items"])),
            "what_accuracy": float(np.mean(stats["what"])), "what_items_accuracy": float(np.mean(stats["what_items"])),
            "where_accuracy": float(np.mean(stats["where"])),
            "command": f"python -m train.vlm --evaluate {folder} --n {n}"}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--evaluate", default="", metavar="FOLDER", help="evaluate this checkpoint folder instead")
    ap.add_argument("--n", type=int, default=300, help="--evaluate: test scenes (default 300)")
    ap.add_argument("--write", action="store_true", help="--evaluate: also write the folder's metrics.json")
    ap.add_argument("--run-dir", default="runs/vlm-fashion")
    ap.add_argument("--out", default="", help="checkpoint folder written at the end (e.g. checkpoints/vlm-fashion)")
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--max-minutes", type=float, default=55.0, help="time budget; the schedule ends within it")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--val-scenes", type=int, default=512)
    ap.add_argument("--patience", type=int, default=4, help="evaluations without improvement before stopping")
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--save-minutes", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=1, help="1: two threads wait on each other on a shared machine")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", nargs="*", default=[], help="VLMConfig overrides, e.g. d_model=96")
    ap.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    a = ap.parse_args(argv)
    if not a.evaluate:
        run_training(a)
        return
    metrics = evaluate(a.evaluate, a.n, a.data_dir, a.threads)
    if a.write:
        path = Path(a.evaluate) / "metrics.json"
        old = json.loads(path.read_text()) if path.is_file() else {}
        path.write_text(json.dumps({**old, "test": metrics}, indent=2) + "\n")
    print(json.dumps(metrics))


if __name__ == "__main__":
    main()
