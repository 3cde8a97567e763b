"""train/data.py reads tiny plain and gzip files written here, and splits exactly as the data README says."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from train import data


def write(path: Path, content: bytes, gz: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(content))
    else:
        path.write_bytes(content)
    return path


def idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


@pytest.mark.parametrize("gz", [False, True])
def test_multi30k_line_aligned(tmp_path: Path, gz: bool) -> None:
    base = tmp_path / "multi30k"
    write(base / "val.en", b"A dog runs.\nTwo men talk.\n", gz)
    write(base / "val.de", "Ein Hund rennt.\nZwei Männer reden.\n".encode(), gz)
    pairs = data.load_multi30k(tmp_path, "val")
    assert pairs.src == ["A dog runs.", "Two men talk."]
    assert pairs.tgt == ["Ein Hund rennt.", "Zwei Männer reden."]
    # a path named with .gz finds the plain file and the reverse
    name = "val.en" if gz else "val.en.gz"
    assert data.read_lines(base / name) == pairs.src


def test_multi30k_misaligned_is_an_error(tmp_path: Path) -> None:
    write(tmp_path / "multi30k" / "train.en", b"a\nb\n", False)
    write(tmp_path / "multi30k" / "train.de", b"a\n", False)
    with pytest.raises(data.DataError, match="not line-aligned"):
        data.load_multi30k(tmp_path, "train")


def test_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(data.DataError, match="test_2016_flickr.en"):
        data.load_multi30k(tmp_path, "test_2016_flickr")


@pytest.mark.parametrize("gz", [False, True])
def test_tsv_and_holdout(tmp_path: Path, gz: bool) -> None:
    rows = [f"sentence {i} , fine\t{i % 2}" for i in range(2500)]
    write(tmp_path / "sst2" / "train.tsv", ("sentence\tlabel\n" + "\n".join(rows) + "\n").encode(), gz)
    write(tmp_path / "sst2" / "dev.tsv", b"sentence\tlabel\na good film .\t1\n", gz)
    splits = data.load_text_task(tmp_path, "sst2")
    assert len(splits["val"]) == 2000 and len(splits["train"]) == 500 and len(splits["test"]) == 1
    assert splits["test"].labels == [1]
    assert set(splits["train"].texts).isdisjoint(splits["val"].texts)
    again = data.load_text_task(tmp_path, "sst2")
    assert again["val"].texts == splits["val"].texts  # fixed seed: the same split every time


def test_grouped_holdout_keeps_a_held_out_sentence_s_phrases_out_of_training() -> None:
    texts, labels = [], []
    for k in range(6):  # six 16-word sentences, each with a phrase, a 2-word span and a line containing it
        w = [f"w{k}x{j}" for j in range(16)]
        sent = " ".join(w)
        texts += [sent + " ", " ".join(w[2:9]), " ".join(w[:2]), f"well , {sent} indeed"]  # SST-2's trailing space
        labels += [k % 2] * 4
    texts.append("a phrase of its own here")
    labels.append(1)
    examples = data.TextExamples(texts, labels)
    train, val = data.grouped_holdout(examples, 3)
    assert len(val) == 3 and all(len(t.split()) >= 15 for t in val.texts)

    def words(t: str) -> str:
        return " " + " ".join(t.split()) + " "

    def related(line: str) -> bool:  # a span of 3+ words of a held-out line, or a line containing one
        n = len(line.split())
        return any((n >= 3 and words(line) in words(h)) or words(h) in words(line) for h in val.texts)

    assert not any(related(t) for t in train.texts)
    dropped = [t for t in texts if t not in train.texts and t not in val.texts]
    assert dropped and all(related(t) for t in dropped)  # nothing else is lost
    assert len(train) + len(val) + len(dropped) == len(texts)
    assert "a phrase of its own here" in train.texts
    two = [t for t in texts if len(t.split()) == 2]
    assert len(two) == 6 and all(t in train.texts for t in two)  # 2-word spans are generic: all kept
    again_train, again_val = data.grouped_holdout(examples, 3)
    assert again_val.texts == val.texts and again_train.texts == train.texts


def test_grouped_holdout_is_for_sst2_only(tmp_path: Path) -> None:
    rows = [f"Story {i}\t{data.AGNEWS_LABELS[i % 4]}" for i in range(1200)]
    write(tmp_path / "agnews" / "train.tsv", ("sentence\tlabel\n" + "\n".join(rows)).encode(), False)
    write(tmp_path / "agnews" / "test.tsv", b"sentence\tlabel\nStocks fell.\tBusiness\n", False)
    with pytest.raises(ValueError, match="sst2"):
        data.load_text_task(tmp_path, "agnews", "grouped")


def test_agnews_named_labels(tmp_path: Path) -> None:
    rows = [f"Story {i}\t{data.AGNEWS_LABELS[i % 4]}" for i in range(1200)]
    write(tmp_path / "agnews" / "train.tsv", ("sentence\tlabel\n" + "\n".join(rows)).encode(), False)
    write(tmp_path / "agnews" / "test.tsv", b"sentence\tlabel\nStocks fell.\tBusiness\n", False)
    splits = data.load_text_task(tmp_path, "agnews")
    assert len(splits["val"]) == 1000 and len(splits["train"]) == 200
    assert splits["test"].labels == [2]


def test_tsv_bad_header_and_label(tmp_path: Path) -> None:
    bad = write(tmp_path / "x.tsv", b"text\tlabel\nhi\t0\n", False)
    with pytest.raises(data.DataError, match="header"):
        data.read_tsv(bad)
    odd = write(tmp_path / "y.tsv", b"sentence\tlabel\nhi\tMaybe\n", False)
    with pytest.raises(data.DataError, match="unknown label"):
        data.load_tsv(odd, data.SST2_LABELS)


@pytest.mark.parametrize("gz", [False, True])
def test_fashion_idx(tmp_path: Path, gz: bool) -> None:
    n = data.FASHION_VAL + 7
    images = (np.arange(n * 28 * 28) % 251).reshape(n, 28, 28).astype(np.uint8)
    labels = (np.arange(n) % 10).astype(np.uint8)
    base = tmp_path / "fashion-mnist"
    write(base / "train-images-idx3-ubyte", idx_bytes(images), gz)
    write(base / "train-labels-idx1-ubyte", idx_bytes(labels), gz)
    write(base / "t10k-images-idx3-ubyte", idx_bytes(images[:3]), gz)
    write(base / "t10k-labels-idx1-ubyte", idx_bytes(labels[:3]), gz)
    splits = data.load_fashion(tmp_path)
    x, y = splits["train"]
    assert x.shape == (7, 28, 28) and x.dtype == np.uint8 and y.tolist() == list(range(7))
    xv, yv = splits["val"]
    assert len(xv) == data.FASHION_VAL and np.array_equal(xv, images[7:])  # the last 5,000
    assert splits["test"][0].shape == (3, 28, 28)
    assert x.flags.writeable


def test_idx_truncated(tmp_path: Path) -> None:
    raw = idx_bytes(np.zeros((2, 28, 28), np.uint8))[:-5]
    path = write(tmp_path / "bad-idx3-ubyte", raw, False)
    with pytest.raises(data.DataError, match="expected"):
        data.read_idx(path)


def test_download_offline_fails_fast(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import urllib.request

    from train import download

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("Network is unreachable")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    assert download.main(["--out", str(tmp_path), "--only", "sst2"]) == 2


def test_augment_texts_perturbs_only_the_longer_texts() -> None:
    from train.text import augment_texts

    long_a = " ".join(f"a{i}" for i in range(12))
    long_b = " ".join(f"b{i}" for i in range(15))
    texts = [long_a, "too short here", long_b]
    out = augment_texts(texts, 3, seed=1)
    assert len(out) == 6 and out == augment_texts(texts, 3, seed=1) and out != augment_texts(texts, 3, seed=2)
    pool = {w for t in texts for w in t.split()}
    assert all(o and o not in texts and set(o.split()) <= pool for o in out)

    def is_subsequence(small: list[str], big: list[str]) -> bool:
        it = iter(big)
        return all(w in it for w in small)

    # deletions alone keep the source's order; n-grams alone keep a contiguous span of 1..5 words
    src = long_b.split()
    for o in augment_texts([long_b], 20, p_replace=0, p_ngram=0):
        assert is_subsequence(o.split(), src) and len(o.split()) < len(src)
    for o in augment_texts([long_b], 20, p_delete=0, p_replace=0, p_ngram=1):
        w = o.split()
        assert 1 <= len(w) <= 5 and o in long_b and w == src[src.index(w[0]):src.index(w[0]) + len(w)]
    # swaps alone keep the length
    assert all(len(o.split()) == len(src) for o in augment_texts([long_b], 20, p_delete=0, p_ngram=0))
