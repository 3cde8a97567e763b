"""Loaders for the training and evaluation data (see ``../shared/data/README.md``).

Every loader reads plain or gzip-compressed files (``name`` or ``name.gz``) from a data directory that
the commands take as ``--data-dir``. The validation splits follow the data README exactly: Multi30k
``val``; SST-2 and AG News hold out 2,000 and 1,000 training lines with a fixed seed; Fashion-MNIST holds
out the last 5,000 training images.
"""

from __future__ import annotations

import argparse
import gzip
import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data"

SPLIT_SEED = 0  # seed of the fixed held-out split of SST-2 and AG News
HOLDOUT = {"sst2": 2000, "agnews": 1000}  # lines of train.tsv held out for model selection
FASHION_VAL = 5000  # the last 5,000 Fashion-MNIST training images are the validation split
FASHION_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]
SST2_LABELS = ["negative", "positive"]
AGNEWS_LABELS = ["World", "Sports", "Business", "Sci/Tech"]


class DataError(RuntimeError):
    """A data file is missing or malformed; the message names the file."""


def resolve(path: str | Path) -> Path:
    """``path`` itself if it exists, else ``path.gz`` / ``path`` without ``.gz``; DataError if neither."""
    p = Path(path)
    candidates = [p, p.with_name(p.name[:-3])] if p.name.endswith(".gz") else [p, p.with_name(p.name + ".gz")]
    for c in candidates:
        if c.is_file():
            return c
    raise DataError(f"data file not found: {p} (also tried {candidates[1].name}); see ../shared/data/README.md "
                    "or fetch the originals with `python -m train.download`")


def open_bytes(path: str | Path) -> bytes:
    """The whole (decompressed) content of a plain or .gz file."""
    p = resolve(path)
    raw = p.read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


def read_lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 text file (plain or .gz), without line endings; a final empty line is dropped."""
    text = open_bytes(path).decode("utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r") for line in lines]


# ----------------------------------------------------------------------------------------------------------
# Multi30k


@dataclass(frozen=True)
class Parallel:
    """A line-aligned parallel corpus."""

    src: list[str]
    tgt: list[str]

    def __len__(self) -> int:
        return len(self.src)


def load_parallel(src_path: str | Path, tgt_path: str | Path) -> Parallel:
    """Two line-aligned files; DataError if their line counts differ."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: not line-aligned")
    return Parallel(src, tgt)


def load_multi30k(data_dir: str | Path, split: str, src: str = "en", tgt: str = "de") -> Parallel:
    """Multi30k ``split`` (train, val, test_2016_flickr) from ``data_dir/multi30k``."""
    base = Path(data_dir) / "multi30k"
    return load_parallel(base / f"{split}.{src}.gz", base / f"{split}.{tgt}.gz")


# ----------------------------------------------------------------------------------------------------------
# SST-2 and AG News


@dataclass(frozen=True)
class TextExamples:
    texts: list[str]
    labels: list[int]  # index into the label list of the task

    def __len__(self) -> int:
        return len(self.texts)


def read_tsv(path: str | Path, labels: list[str] | None = None) -> tuple[list[str], list[str]]:
    """A ``sentence\\tlabel`` TSV with that header; returns (sentences, raw label strings)."""
    lines = read_lines(path)
    if not lines or lines[0].split("\t")[:2] != ["sentence", "label"]:
        raise DataError(f"{path}: expected the header 'sentence<TAB>label'")
    texts, raw = [], []
    for i, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        parts = line.rsplit("\t", 1)
        if len(parts) != 2:
            raise DataError(f"{path}:{i}: expected 'sentence<TAB>label'")
        texts.append(parts[0])
        raw.append(parts[1].strip())
    return texts, raw


def label_ids(raw: list[str], labels: list[str], path: str | Path = "") -> list[int]:
    """Map label strings (names, or integer indices as in SST-2) to indices into ``labels``."""
    index = {name: i for i, name in enumerate(labels)}
    out = []
    for r in raw:
        if r in index:
            out.append(index[r])
        elif r.isdigit() and int(r) < len(labels):
            out.append(int(r))
        else:
            raise DataError(f"{path}: unknown label {r!r}; expected one of {labels}")
    return out


def load_tsv(path: str | Path, labels: list[str]) -> TextExamples:
    texts, raw = read_tsv(path)
    return TextExamples(texts, label_ids(raw, labels, path))


def task_labels(task: str) -> list[str]:
    return {"sst2": SST2_LABELS, "agnews": AGNEWS_LABELS}[task]


def _subset(examples: TextExamples, idx: list[int]) -> TextExamples:
    return TextExamples([examples.texts[i] for i in idx], [examples.labels[i] for i in idx])


def holdout_split(examples: TextExamples, n_val: int, seed: int = SPLIT_SEED) -> tuple[TextExamples, TextExamples]:
    """(train, val): ``n_val`` lines chosen with ``random.Random(seed)``, the rest kept in file order."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    val_idx = set(order[:n_val])
    tr = [i for i in range(len(examples)) if i not in val_idx]
    va = sorted(val_idx)
    return _subset(examples, tr), _subset(examples, va)


def grouped_holdout(examples: TextExamples, n_val: int, min_words: int = 15, min_span: int = 3,
                    seed: int = SPLIT_SEED) -> tuple[TextExamples, TextExamples]:
    """(train, val) for SST-2 without leaks between them: ``n_val`` whole sentences (lines of at least
    ``min_words`` words, chosen with ``random.Random(seed)``) are held out, and training loses every line
    that is a word span of at least ``min_span`` words of a held-out sentence (its phrases) or contains one.

    SST-2's train.tsv holds each sentence's phrases as lines of their own, so a plain random hold-out keeps
    most of a held-out phrase's parent sentence in training, and its validation score does not predict
    dev.tsv (unseen whole sentences). Shorter spans ("never", "a bit") stay: they are generic.
    """
    words = [tuple(t.split()) for t in examples.texts]
    order = [i for i, w in enumerate(words) if len(w) >= min_words]
    random.Random(seed).shuffle(order)
    val_idx = set(order[:n_val])
    held = {words[i] for i in val_idx}
    spans = {w[a:b] for w in held for a in range(len(w)) for b in range(a + min_span, len(w) + 1)}
    lengths = sorted({len(w) for w in held})

    def leaks(w: tuple[str, ...]) -> bool:
        return w in spans or any(w[a:a + n] in held for n in lengths if n < len(w) for a in range(len(w) - n + 1))

    tr = [i for i, w in enumerate(words) if i not in val_idx and not leaks(w)]
    return _subset(examples, tr), _subset(examples, sorted(val_idx))


HOLDOUT_SPLITS = {"lines": "{n} held-out lines of {task} train.tsv (seed 0)",
                  "grouped": "{n} held-out sentences of {task} train.tsv (seed 0), their phrases removed from "
                             "training (train.data.grouped_holdout)"}
GROUPED_SENTENCES = 1000  # SST-2 sentences held out by --holdout grouped


def add_holdout_arg(ap: argparse.ArgumentParser) -> None:
    """``--holdout {lines,grouped}`` for the text training commands (see :func:`load_text_task`)."""
    ap.add_argument("--holdout", choices=["lines", "grouped"], default="lines",
                    help="validation split: lines (the data README's random lines) or, SST-2 only, grouped "
                         f"({GROUPED_SENTENCES:,} whole sentences, their phrases removed from training; train.data)")


def load_text_task(data_dir: str | Path, task: str, holdout: str = "lines") -> dict[str, TextExamples]:
    """{"train", "val", "test"} for ``sst2`` (test = dev.tsv) or ``agnews`` (test = test.tsv).

    ``holdout``: "lines" (the data README's split: random lines of train.tsv) or, for SST-2 only,
    "grouped" (:func:`grouped_holdout`: whole sentences, their phrases dropped from training)."""
    base = Path(data_dir) / task
    labels = task_labels(task)
    full = load_tsv(base / "train.tsv", labels)
    if holdout == "grouped":
        if task != "sst2":
            raise ValueError("--holdout grouped is for sst2 (its training file holds phrases of its sentences)")
        train, val = grouped_holdout(full, GROUPED_SENTENCES)
    elif holdout == "lines":
        train, val = holdout_split(full, HOLDOUT[task])
    else:
        raise ValueError(f"unknown hold-out {holdout!r} (lines or grouped)")
    test = load_tsv(base / ("dev.tsv" if task == "sst2" else "test.tsv"), labels)
    return {"train": train, "val": val, "test": test}


# ----------------------------------------------------------------------------------------------------------
# Fashion-MNIST (IDX)


def read_idx(path: str | Path) -> np.ndarray:
    """An IDX file (the MNIST format: magic 0x0000 08 <ndim>, big-endian dims, uint8 data)."""
    data = open_bytes(path)
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise DataError(f"{path}: not an unsigned-byte IDX file")
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise DataError(f"{path}: expected {int(np.prod(dims))} bytes of data for shape {dims}, got {body.size}")
    return body.reshape(dims).copy()  # writable (frombuffer views are read-only)


def load_idx_pair(images: str | Path, labels: str | Path) -> tuple[np.ndarray, np.ndarray]:
    x, y = read_idx(images), read_idx(labels)
    if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
        raise DataError(f"{images} {x.shape} and {labels} {y.shape} do not form an image/label pair")
    return x, y.astype(np.int64)


def load_fashion(data_dir: str | Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{"train", "val", "test"}: (uint8 images (N, 28, 28), int64 labels (N,)); val = last 5,000 train."""
    base = Path(data_dir) / "fashion-mnist"
    x, y = load_idx_pair(base / "train-images-idx3-ubyte.gz", base / "train-labels-idx1-ubyte.gz")
    xt, yt = load_idx_pair(base / "t10k-images-idx3-ubyte.gz", base / "t10k-labels-idx1-ubyte.gz")
    n = len(x) - FASHION_VAL
    return {"train": (x[:n], y[:n]), "val": (x[n:], y[n:]), "test": (xt, yt)}


def batches(n: int, batch_size: int, shuffle: bool, seed: int = 0) -> Iterator[np.ndarray]:
    """Index batches over ``range(n)``."""
    idx = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
    for i in range(0, n, batch_size):
        yield idx[i:i + batch_size]
