"""Fetch the public originals of the training data into a folder laid out like ``../shared/data``.

    python -m train.download --out data [--only multi30k sst2 agnews fashion-mnist]

Needs a network; without one it stops at once with a clear message (short connection timeout).
AG News is converted to the project's TSV (description only, HTML entities unescaped); its training file
is the first 10,000 lines of a seeded shuffle of the official 120,000, so it is *a* 10k subset, not
necessarily the one in ``../shared/data``.
"""

from __future__ import annotations

import argparse
import csv
import html
import io
import random
import sys
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from tqdm import tqdm

MULTI30K = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}"
SST2_ZIP = "https://dl.fbaipublicfiles.com/glue/data/SST-2.zip"
AGNEWS = "https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/{name}.csv"
FASHION = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/{name}"
AGNEWS_CLASSES = {"1": "World", "2": "Sports", "3": "Business", "4": "Sci/Tech"}
TIMEOUT_S = 10.0


class OfflineError(RuntimeError):
    pass


def fetch(url: str, timeout: float = TIMEOUT_S) -> bytes:
    """The body of ``url``; OfflineError with a clear message when it cannot be reached."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - fixed https/http URLs
            total = int(r.headers.get("Content-Length") or 0) or None
            buf = io.BytesIO()
            with tqdm(total=total, unit="B", unit_scale=True, desc=url.rsplit("/", 1)[-1], leave=False) as bar:
                while chunk := r.read(1 << 16):
                    buf.write(chunk)
                    bar.update(len(chunk))
            return buf.getvalue()
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        raise OfflineError(
            f"cannot download {url}: {e}. This command needs a network connection; offline, use the copies "
            "in ../shared/data (pass --data-dir to the training commands)."
        ) from e


def multi30k(out: Path) -> None:
    d = out / "multi30k"
    d.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val", "test_2016_flickr"):
        for lang in ("en", "de", "fr"):
            name = f"{split}.{lang}.gz"
            (d / name).write_bytes(fetch(MULTI30K.format(name=name)))


def sst2(out: Path) -> None:
    d = out / "sst2"
    d.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(fetch(SST2_ZIP))) as z:
        for name in ("train.tsv", "dev.tsv"):
            (d / name).write_bytes(z.read(f"SST-2/{name}"))


def _agnews_tsv(raw: bytes) -> list[str]:
    rows = []
    for cls, _title, desc in csv.reader(io.StringIO(raw.decode("utf-8"))):
        text = " ".join(html.unescape(desc.replace("\\", " ")).split())
        rows.append(f"{text}\t{AGNEWS_CLASSES[cls]}")
    return rows


def agnews(out: Path, n_train: int = 10_000, seed: int = 0) -> None:
    d = out / "agnews"
    d.mkdir(parents=True, exist_ok=True)
    train = _agnews_tsv(fetch(AGNEWS.format(name="train")))
    random.Random(seed).shuffle(train)
    test = _agnews_tsv(fetch(AGNEWS.format(name="test")))
    for name, rows in (("train.tsv", train[:n_train]), ("test.tsv", test)):
        (d / name).write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")


def fashion(out: Path) -> None:
    d = out / "fashion-mnist"
    d.mkdir(parents=True, exist_ok=True)
    for split in ("train", "t10k"):
        for kind in ("images-idx3", "labels-idx1"):
            name = f"{split}-{kind}-ubyte.gz"
            (d / name).write_bytes(fetch(FASHION.format(name=name)))


SOURCES = {"multi30k": multi30k, "sst2": sst2, "agnews": agnews, "fashion-mnist": fashion}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("data"), help="folder to write (git-ignored `data/`)")
    ap.add_argument("--only", nargs="+", choices=sorted(SOURCES), default=sorted(SOURCES))
    args = ap.parse_args(argv)
    try:
        for name in args.only:
            print(f"downloading {name} -> {args.out / name}", file=sys.stderr)
            SOURCES[name](args.out)
    except OfflineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"done: {', '.join(args.only)} in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
