"""SentencePiece tokenisers trained by the project.

    python -m train.tokenizers [--data-dir DIR] [--out runs/tokenizers] [--only multi30k sst2 agnews]

- ``multi30k.model``: one joint en+de unigram model (8k pieces) on Multi30k train, shared by the
  translator's source and target side (tied embeddings).
- ``sst2.model`` and ``agnews.model``: one per text classifier, trained on that task's training lines
  only (the held-out validation lines and the test file are never seen).

Special ids are fixed for every model: ``<pad>`` 0, ``<unk>`` 1, ``<s>`` 2, ``</s>`` 3.
"""

from __future__ import annotations

import argparse
import io
from collections.abc import Iterable
from pathlib import Path

from train.data import DEFAULT_DATA_DIR, REPO_ROOT, load_multi30k, load_text_task

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SPECIALS = {"pad_id": PAD_ID, "unk_id": UNK_ID, "bos_id": BOS_ID, "eos_id": EOS_ID}
DEFAULT_OUT = REPO_ROOT / "runs" / "tokenizers"
VOCAB = {"multi30k": 8000, "sst2": 8000, "agnews": 8000}


def train_sentencepiece(sentences: Iterable[str], out: Path, vocab_size: int, model_type: str = "unigram",
                        character_coverage: float = 1.0) -> Path:
    """Train a SentencePiece model on ``sentences`` and write it to ``out`` (a ``.model`` path)."""
    import sentencepiece as spm

    out.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(list(sentences)), model_writer=buf, vocab_size=vocab_size,
        model_type=model_type, character_coverage=character_coverage,
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
        pad_piece="<pad>", unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
        input_sentence_size=2_000_000, shuffle_input_sentence=True, num_threads=1, minloglevel=2,
        hard_vocab_limit=False,
    )
    out.write_bytes(buf.getvalue())
    return out


def train_all(data_dir: Path, out_dir: Path, only: list[str]) -> dict[str, Path]:
    done = {}
    for name in only:
        if name == "multi30k":
            tr = load_multi30k(data_dir, "train")
            sents = tr.src + tr.tgt
        else:
            sents = load_text_task(data_dir, name)["train"].texts
        done[name] = train_sentencepiece(sents, out_dir / f"{name}.model", VOCAB[name])
        print(f"{name}: {done[name]}")
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", nargs="+", choices=sorted(VOCAB), default=sorted(VOCAB))
    args = ap.parse_args(argv)
    train_all(args.data_dir, args.out, args.only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
