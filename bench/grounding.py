"""The pointing game (Zhang et al. 2018, "Top-down Neural Attention by Excitation Backprop", §5.1) for the own VLM.

    python bench/grounding.py --scenes DIR [--model vlm-fashion] [--limit N] [--select VAL_DIR]

DIR/scenes.jsonl holds one scene a line, ``{"image": "scene_000.png", "items": [{"class": "Sandal", "box": [x0, y0,
x1, y1]}, …]}`` (boxes in the image's pixels, ends exclusive; ``python -m train.scenes --out DIR --split test`` writes
held-out scenes of t10k items). For each scene the model reads, teacher-forced, "describe the image ." and the
caption naming every item with its place, in reading order ("at the top left a sandal and on the right a bag"). For
each item, at its class word:

- attention: the decoder's attention over the image tokens, the mean over the heads of one layer (or of all layers),
  from one query position: ``before`` (the position that predicts the class word, the last word of its place: a
  generated token's row is the step that chose it) or ``word`` (the class word's own position);
- relevance: gradient × input of log p(class word) at the position that predicts it, on the pixels relative to black,
  summed per image token (``models.families.vlm.VLM.relevance``, ``at="pixels"``); the same on the image-token
  embeddings (``at="tokens"``) is printed beside it.

A hit is an argmax image token whose pixel cell's centre lies inside the item's box. The layer and query of the
attention are chosen on validation scenes (``--select VAL_DIR``: every layer, the mean over layers, both queries;
the best by accuracy there), never on the scenes scored; without ``--select`` the defaults below apply, which
``--select runs/vlm/val-scenes`` chose for vlm-fashion (README). Also timed (never asserted): one
``describe`` with attention, a question, the median of ``--repeats`` runs.

Last stdout line: ``{"n": items scored, "attention": accuracy, "relevance": accuracy, ...}`` with the layer and query
used and the timing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import models  # noqa: E402
from train.data import FASHION_CLASSES  # noqa: E402
from train.scenes import CAPTION_PROMPT, Item, caption, cell_of_box  # noqa: E402

# chosen on 100 validation scenes (295 items; `--select runs/vlm/val-scenes`): the last layer's mean over heads from the
# position predicting the class word, 0.912 there (the mean over layers 0.861; any layer from the class word's own
# position at most 0.231: that position goes on to say "and", which needs no look at the item)
LAYER, QUERY = "3", "before"
QUERIES = ("word", "before")


def read_scenes(folder: Path, limit: int | None) -> list[tuple[np.ndarray, list[dict]]]:
    """(grey image, items) of each line of folder/scenes.jsonl; an unknown class or a bad box is an error."""
    out = []
    for n, line in enumerate((folder / "scenes.jsonl").read_text().splitlines()):
        if limit is not None and len(out) >= limit:
            break
        if not line.strip():
            continue
        rec = json.loads(line)
        name = Path(rec["image"]).name  # a file of the folder itself, never a path elsewhere
        image = np.asarray(Image.open(folder / name).convert("L"), dtype=np.uint8)
        for it in rec["items"]:
            if it["class"] not in FASHION_CLASSES:
                raise ValueError(f"line {n + 1}: unknown class {it['class']!r}; known: {FASHION_CLASSES}")
            if len(it["box"]) != 4:
                raise ValueError(f"line {n + 1}: a box is [x0, y0, x1, y1], got {it['box']}")
        out.append((image, rec["items"]))
    return out


def score_scene(model, image: np.ndarray, items: list[dict]) -> dict[str, np.ndarray]:
    """Per item (in caption order): hits of attention for every (query, layer) and of relevance."""
    c = model.config
    h, w = image.shape
    if h != w:
        raise ValueError(f"scenes are square; got {w}×{h}")
    scale = c.image_size / w
    boxes = [np.asarray(it["box"], dtype=np.float64) * scale for it in items]
    order = sorted(range(len(items)), key=lambda k: cell_of_box(boxes[k], c.image_size))
    words, class_at = CAPTION_PROMPT.split(), []
    for k in order:  # the caption as training wrote it (train.scenes.caption): "<place> a <class>", joined by "and"
        part = caption([Item(FASHION_CLASSES.index(items[k]["class"]), (0, 0, 0, 0),
                             cell_of_box(boxes[k], c.image_size))]).split()
        words += (["and"] if class_at else []) + part
        class_at.append(len(words) - 1)  # the class word closes each part; its index in the text after <s>
    ids, pieces = model.encode_text(" ".join(words))
    if model.tokenizer.unk_id in ids:
        raise ValueError(f"a caption word is not in the model's vocabulary: {pieces}")
    n = c.image_tokens
    positions = [n + 1 + i for i in class_at]  # the class words in the whole sequence
    device = next(model.parameters()).device
    img = torch.from_numpy(model.image_array(image)[0])[None].to(device)
    with torch.no_grad():
        out = model(img, torch.tensor([ids], device=device), need_weights=True)
    att = torch.stack([a[0] for a in out.attention]).float().cpu().numpy()  # (L, H, T, T)
    _, cell_boxes = model.image_layout()
    centres = (cell_boxes[:, :2] + cell_boxes[:, 2:]) / 2  # (N, 2) x, y

    def hit(values: np.ndarray, box: np.ndarray) -> bool:
        x, y = centres[int(np.argmax(values))]
        return bool(box[0] <= x < box[2] and box[1] <= y < box[3])

    layers = [*range(c.n_layers), "mean"]
    hits = {f"{q}:{layer}": [] for q in QUERIES for layer in layers}
    targets = [ids[p - n] for p in positions]
    rel = model.relevance(image, ids, [p - 1 for p in positions], targets)
    rel_tok = model.relevance(image, ids, [p - 1 for p in positions], targets, at="tokens")
    rel_hits, tok_hits = [], []
    for k, p in enumerate(positions):
        box = boxes[order[k]]
        for q in QUERIES:
            row = att[:, :, p if q == "word" else p - 1, :n].mean(axis=1)  # (L, N): the mean over heads
            for layer in layers:
                hits[f"{q}:{layer}"].append(hit(row.mean(axis=0) if layer == "mean" else row[layer], box))
        rel_hits.append(hit(rel[k], box))
        tok_hits.append(hit(rel_tok[k], box))
    return {**{k: np.asarray(v) for k, v in hits.items()}, "relevance": np.asarray(rel_hits),
            "relevance_tokens": np.asarray(tok_hits)}


def score(model, scenes: list[tuple[np.ndarray, list[dict]]]) -> dict[str, float]:
    """Accuracy of every attention choice and of relevance over all items of ``scenes``, and the item count."""
    per: dict[str, list[np.ndarray]] = {}
    for image, items in scenes:
        for k, v in score_scene(model, image, items).items():
            per.setdefault(k, []).append(v)
    out = {k: float(np.concatenate(v).mean()) for k, v in per.items()}
    out["n"] = int(sum(len(items) for _, items in scenes))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenes", required=True, help="folder with scenes.jsonl and its images")
    ap.add_argument("--model", default="vlm-fashion", help="a checkpoint name under checkpoints/ (default vlm-fashion)")
    ap.add_argument("--limit", type=int, default=None, help="the first N scenes only")
    ap.add_argument("--select", default=None, help="validation scenes: choose the attention's layer and query there")
    ap.add_argument("--layer", default=LAYER, help=f"decoder layer or 'mean' (default {LAYER})")
    ap.add_argument("--query", default=QUERY, choices=QUERIES, help=f"default {QUERY}")
    ap.add_argument("--repeats", type=int, default=5, help="timed describe() runs")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--write", action="store_true", help="also record the result in the checkpoint's metrics.json")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    model = models.load(a.model)
    choice = f"{a.query}:{a.layer}"
    if a.select:
        val = score(model, read_scenes(Path(a.select), a.limit))
        table = {k: v for k, v in val.items() if ":" in k}
        choice = max(table, key=lambda k: (table[k], k == f"{QUERY}:{LAYER}"))
        print(json.dumps({"validation": {k: round(v, 4) for k, v in table.items()}, "chosen": choice,
                          "validation_relevance": round(val["relevance"], 4), "validation_n": val["n"]}))
    scenes = read_scenes(Path(a.scenes), a.limit)
    result = score(model, scenes)
    if choice not in result:
        raise SystemExit(f"--layer must be 0..{model.config.n_layers - 1} or 'mean', got {a.layer!r}")
    print(json.dumps({"all": {k: round(v, 4) for k, v in result.items() if ":" in k},
                      "relevance_tokens": round(result["relevance_tokens"], 4)}))
    times = []
    image = scenes[0][0]
    for _ in range(max(1, a.repeats)):
        t = time.perf_counter()
        model.describe(image, "what is at the top left ?", max_new_tokens=8)
        times.append(time.perf_counter() - t)
    caption_t = time.perf_counter()
    model.describe(image, CAPTION_PROMPT, max_new_tokens=40)
    caption_s = time.perf_counter() - caption_t
    query, layer = choice.split(":")
    last = {"n": result["n"], "attention": round(result[choice], 4), "relevance": round(result["relevance"], 4),
            "relevance_tokens": round(result["relevance_tokens"], 4), "layer": layer, "query": query,
            "describe_p50_s": round(float(np.median(times)), 4), "caption_s": round(caption_s, 4),
            "model": a.model, "scenes": len(scenes)}
    if a.write:
        path = models.resolve(a.model) / "metrics.json"
        old = json.loads(path.read_text()) if path.is_file() else {}
        command = "python bench/grounding.py " + " ".join(sys.argv[1:] if argv is None else argv)
        path.write_text(json.dumps({**old, "grounding": {**last, "command": command}}, indent=2) + "\n")
    print(json.dumps(last))


if __name__ == "__main__":
    main()
