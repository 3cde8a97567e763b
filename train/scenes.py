"""Scenes composed of Fashion-MNIST items, their captions and questions: the own small VLM's data (issue 63).

A scene is 2–4 items on a black ``CANVAS``×``CANVAS`` canvas, each a Fashion-MNIST image resized to a square of
``MIN_SIZE``–``MAX_SIZE`` pixels, at random places, no two boxes overlapping and no two centres in the same cell
of the 3×3 grid that names places ("top left", "middle", "bottom right", …), so every place word points at one
item. Each centre keeps ``MARGIN`` pixels from the cell borders, so a place is never a matter of one pixel.

Text (a word-level vocabulary, ``VOCAB``; the checkpoint ships it as tokenizer.json, ``write_tokenizer``):

- caption: "describe the image ." -> "at the top left a sandal and on the right a bag" (items in reading order of
  their cells, each place before its item: naming the item is then a look at that place, which is what the pointing
  game measures at the class word);
- what is: "what is at the bottom left ?" -> "a sandal" (an empty place: "nothing");
- where is: "where is the bag ?" -> "on the right" (two bags: "on the right and at the bottom").

Everything is a function of (seed, index), so a scene is the same in every run and on every machine. Items come
from one split of ``train.data.load_fashion``: "train" (the first 55,000 training images) for training, "val" (the
last 5,000) for model selection, "test" (t10k) for the reported figures (data README).

    python -m train.scenes --out runs/vlm/test-scenes --split test --n 200     # held-out scenes for the bench

writes DIR/scene_000.png … and DIR/scenes.jsonl, one line per scene:
``{"image": "scene_000.png", "items": [{"class": "Sandal", "box": [x0, y0, x1, y1]}, …]}``, boxes in pixels,
x1 and y1 exclusive (the item covers columns x0 … x1 − 1), class names as Fashion-MNIST spells them.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from train.data import DEFAULT_DATA_DIR, FASHION_CLASSES, load_fashion

CANVAS = 64  # canvas side in pixels
MIN_SIZE, MAX_SIZE = 16, 28  # item side in pixels (Fashion-MNIST's own 28 at most)
MIN_ITEMS, MAX_ITEMS = 2, 4
MARGIN = 2  # pixels between an item's centre and the borders of its place cell

# one word per class (single tokens, so "the class word" is one position); Fashion-MNIST's order
CLASS_WORDS = ("t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot")
# the 3×3 cells, row-major: how a caption says each place
PLACES = ("at the top left", "at the top", "at the top right", "on the left", "in the middle", "on the right",
          "at the bottom left", "at the bottom", "at the bottom right")
CAPTION_PROMPT = "describe the image ."
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>", "<image>")
WORDS = ("a", "and", "at", "on", "in", "the", "top", "bottom", "left", "right", "middle", "describe", "image",
         "what", "where", "is", "nothing", "?", ".")
VOCAB = (*SPECIALS, *WORDS, *CLASS_WORDS)
TEXT = {"lowercase": True, "split_punct": True}  # the checkpoint's text settings (models.inputs.tokenizer)
TASKS = ("caption", "what", "where")
TASK_WEIGHTS = (0.4, 0.4, 0.2)  # how often training draws each task
ASK_OCCUPIED = 0.75  # how often "what is at …?" asks about a place that holds an item (else any place)


@dataclass(frozen=True)
class Item:
    label: int  # Fashion-MNIST class index
    box: tuple[int, int, int, int]  # x0, y0, x1, y1 (x1, y1 exclusive)
    cell: int  # place cell, row-major in the 3×3 grid

    @property
    def word(self) -> str:
        return CLASS_WORDS[self.label]

    @property
    def name(self) -> str:
        return FASHION_CLASSES[self.label]


@dataclass(frozen=True)
class Scene:
    image: np.ndarray  # uint8 (CANVAS, CANVAS)
    items: tuple[Item, ...]  # in reading order of their cells


def cell_of(x: float, y: float, side: int = CANVAS) -> int:
    """The 3×3 cell (row-major) holding the point (x, y)."""
    col, row = min(int(3 * x / side), 2), min(int(3 * y / side), 2)
    return 3 * row + col


def cell_of_box(box: Sequence[float], side: int = CANVAS) -> int:
    """The cell of a box's centre."""
    x0, y0, x1, y1 = box
    return cell_of((x0 + x1) / 2, (y0 + y1) / 2, side)


def _resize(item: np.ndarray, size: int) -> np.ndarray:
    return np.asarray(Image.fromarray(item).resize((size, size), Image.BILINEAR), dtype=np.uint8)


def _overlap(a: Sequence[int], b: Sequence[int]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _place(rng: np.random.Generator, cell: int, size: int) -> tuple[int, int] | None:
    """A top-left corner for a ``size`` square whose centre lies inside ``cell`` (MARGIN from its borders)."""
    third = CANVAS / 3
    row, col = divmod(cell, 3)
    spans = []
    for k in (col, row):
        lo = max(0, int(np.ceil(k * third + MARGIN - size / 2)))
        hi = min(CANVAS - size, int(np.floor((k + 1) * third - MARGIN - size / 2 - 1e-6)))
        if lo > hi:
            return None
        spans.append(int(rng.integers(lo, hi + 1)))
    return spans[0], spans[1]


def make_scene(images: np.ndarray, labels: np.ndarray, seed: int, index: int) -> Scene:
    """Scene ``index`` of the stream seeded by ``seed``, from these items (uint8 (N, 28, 28), labels (N,))."""
    rng = np.random.default_rng([seed, index])
    k = int(rng.integers(MIN_ITEMS, MAX_ITEMS + 1))
    while True:  # rejection sampling: a few tries at most for up to four items
        cells = sorted(rng.choice(9, size=k, replace=False).tolist())
        items: list[Item] = []
        for cell in cells:
            for _ in range(20):
                size = int(rng.integers(MIN_SIZE, MAX_SIZE + 1))
                corner = _place(rng, cell, size)
                if corner is None:
                    continue
                box = (corner[0], corner[1], corner[0] + size, corner[1] + size)
                if not any(_overlap(box, o.box) for o in items):
                    items.append(Item(-1, box, cell))
                    break
            else:
                break
        if len(items) == k:
            break
    canvas = np.zeros((CANVAS, CANVAS), np.uint8)
    picks = rng.integers(0, len(images), size=k)
    placed = []
    for item, pick in zip(items, picks):
        x0, y0, x1, y1 = item.box
        canvas[y0:y1, x0:x1] = _resize(images[pick], x1 - x0)
        placed.append(Item(int(labels[pick]), item.box, item.cell))
    return Scene(canvas, tuple(placed))


def caption(items: Sequence[Item]) -> str:
    """"at the top left a sandal and on the right a bag": every item, in the order given."""
    return " and ".join(f"{PLACES[it.cell]} a {it.word}" for it in items)


def task_text(scene: Scene, task: str, rng: np.random.Generator) -> tuple[str, str]:
    """(prompt, answer) of one task about ``scene``."""
    if task == "caption":
        return CAPTION_PROMPT, caption(scene.items)
    if task == "what":
        cell = int(rng.integers(9))
        if rng.random() < ASK_OCCUPIED:
            cell = scene.items[int(rng.integers(len(scene.items)))].cell
        hit = [it for it in scene.items if it.cell == cell]
        return f"what is {PLACES[cell]} ?", (
            f"a {hit[0].word}" if hit else "nothing")
    if task == "where":
        item = scene.items[int(rng.integers(len(scene.items)))]
        places = [PLACES[it.cell] for it in scene.items if it.label == item.label]
        return f"where is the {item.word} ?", " and ".join(places)
    raise ValueError(f"unknown task {task!r}; known: {TASKS}")


def training_text(scene: Scene, seed: int, index: int) -> tuple[str, str]:
    """The (prompt, answer) training draws for scene ``index``: a task by TASK_WEIGHTS; half the prompts without
    their final "." or "?", so a user's prompt works either way."""
    rng = np.random.default_rng([seed, index, 1])
    task = TASKS[int(rng.choice(len(TASKS), p=TASK_WEIGHTS))]
    prompt, answer = task_text(scene, task, rng)
    if rng.random() < 0.5:
        prompt = prompt.rsplit(" ", 1)[0]
    return prompt, answer


def write_tokenizer(path: str | Path) -> Path:
    """The word-level tokenizer.json (Hugging Face ``tokenizers``): whitespace-split words of VOCAB, <unk> for the
    rest. Lower-casing and splitting off "." and "?" are the checkpoint's text settings (TEXT), applied before it."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIALS))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def scene_record(scene: Scene, image: str) -> dict:
    """The scenes.jsonl line of a scene."""
    return {"image": image, "items": [{"class": it.name, "box": list(it.box)} for it in scene.items]}


EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "fashion"  # the ten committed test images


def example_items() -> tuple[np.ndarray, np.ndarray]:
    """The repository's ten example images (examples/fashion, one per class; the file name's first digit is the
    class) as items: uint8 (10, 28, 28), labels (10,). Scenes of these are the Image + text tab's examples."""
    files = sorted(EXAMPLES.glob("*.png"))
    images = np.stack([np.asarray(Image.open(f).convert("L"), dtype=np.uint8) for f in files])
    return images, np.array([int(f.name.split("-")[0]) for f in files])


def write_scenes(out: str | Path, split: str, n: int, seed: int, data_dir: str | Path = DEFAULT_DATA_DIR) -> Path:
    """DIR/scene_000.png … and DIR/scenes.jsonl: ``n`` scenes of the split's items ("examples": of the ten
    example images)."""
    images, labels = example_items() if split == "examples" else load_fashion(data_dir)[split]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        scene = make_scene(images, labels, seed, i)
        name = f"scene_{i:03d}.png"
        Image.fromarray(scene.image).save(out / name)
        lines.append(json.dumps(scene_record(scene, name)))
    (out / "scenes.jsonl").write_text("\n".join(lines) + "\n")
    return out


# the seeds of the three streams, so train, validation and test scenes never share a layout either
SEEDS = {"train": 1, "val": 2, "test": 3, "examples": 4}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for scene_NNN.png and scenes.jsonl")
    ap.add_argument("--split", choices=sorted(SEEDS), default="test", help="whose Fashion-MNIST items (default test)")
    ap.add_argument("--n", type=int, default=200, help="scenes (default 200)")
    ap.add_argument("--seed", type=int, default=None, help="default: the split's own seed")
    ap.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    a = ap.parse_args(argv)
    seed = SEEDS[a.split] if a.seed is None else a.seed
    out = write_scenes(a.out, a.split, a.n, seed, a.data_dir)
    print(json.dumps({"scenes": a.n, "split": a.split, "seed": seed, "out": str(out)}))


if __name__ == "__main__":
    main()
