"""Score a checkpoint on any held-out file; the last stdout line is one JSON object.

    python -m train.evaluate translation --checkpoint checkpoints/translator-en-de \\
        --src ../shared/data/multi30k/test_2016_flickr.en.gz \\
        --ref ../shared/data/multi30k/test_2016_flickr.de.gz --beam 5
    python -m train.evaluate classification --checkpoint checkpoints/sst2 --tsv ../shared/data/sst2/dev.tsv
    python -m train.evaluate vision --checkpoint checkpoints/vit-fashion \\
        --images ../shared/data/fashion-mnist/t10k-images-idx3-ubyte.gz \\
        --labels ../shared/data/fashion-mnist/t10k-labels-idx1-ubyte.gz
    python -m train.evaluate lm --checkpoint checkpoints/gpt-tiny --text ../shared/data/multi30k/test_2016_flickr.en.gz

Translation: sacreBLEU (default 13a tokenisation, cased) of the detokenised output against the raw
references, one sentence per line (plain or .gz); prints ``{"bleu": …, "sentences": …}`` (0–100).
Classification (``sentence<TAB>label`` TSV with header) and vision (IDX images and labels) print
``{"accuracy": …, "examples": …}`` (a fraction). Language models (``--text``: one document per line, plain,
.gz, or a TSV's first column) print ``{"perplexity": …, "tokens": …}``: per tokeniser piece, each document
``<s> pieces </s>`` scored on its own with every piece after ``<s>`` predicted, ``</s>`` included.
``--write-metrics`` records the result and the exact command under ``"evaluations"`` in the checkpoint's
``metrics.json`` (keyed by the data file, so each held-out set keeps its own entry).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch

from train.data import label_ids, load_idx_pair, read_lines, read_tsv


def evaluate_translation(model: Any, src: list[str], ref: list[str], beam: int, batch_size: int,
                         length_penalty: float = 1.0) -> tuple[dict[str, Any], list[str]]:
    from train.translation import bleu, translate_batch

    if len(src) != len(ref):
        raise SystemExit(f"--src has {len(src)} lines but --ref has {len(ref)}: not line-aligned")
    hyps = translate_batch(model, model.tokenizer, src, beam=beam, batch_size=batch_size, progress=True,
                           length_penalty=length_penalty)
    return {"bleu": round(bleu(hyps, ref), 2), "sentences": len(src)}, hyps


def evaluate_classification(model: Any, tsv: Path, batch_size: int) -> dict[str, Any]:
    from train.classifier import accuracy, encode_texts, predict

    texts, raw = read_tsv(tsv)
    labels = label_ids(raw, list(model.labels), tsv)
    preds = predict(model, encode_texts(model.tokenizer, texts), batch_size=batch_size, progress=True)
    return {"accuracy": round(accuracy(preds, labels), 4), "examples": len(labels)}


def evaluate_vision(model: Any, images: Path, labels: Path, batch_size: int) -> dict[str, Any]:
    from train.vision import accuracy

    x, y = load_idx_pair(images, labels)
    if x.shape[1:] != (28, 28):
        raise SystemExit(f"{images}: expected 28x28 images, got {x.shape[1:]}")
    acc = accuracy(model, x, y, batch_size=batch_size, progress=True)
    return {"accuracy": round(acc, 4), "examples": int(len(y))}


def write_metrics(folder: Path, key: str, result: dict[str, Any], extra: dict[str, Any]) -> None:
    path = folder / "metrics.json"
    metrics = json.loads(path.read_text()) if path.is_file() else {}
    metrics.setdefault("evaluations", {})[key] = {**result, **extra}
    path.write_text(json.dumps(metrics, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="kind", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--checkpoint", type=Path, required=True, help="checkpoint folder (or name under checkpoints/)")
    common.add_argument("--batch-size", type=int, default=None)
    common.add_argument("--threads", type=int, default=None)
    common.add_argument("--write-metrics", action="store_true", help="record the result in metrics.json")
    t = sub.add_parser("translation", parents=[common], help="sacreBLEU on a source/reference pair")
    t.add_argument("--src", type=Path, required=True)
    t.add_argument("--ref", type=Path, required=True)
    t.add_argument("--beam", type=int, default=5)
    t.add_argument("--length-penalty", type=float, default=1.0)
    t.add_argument("--limit", type=int, default=None, help="score only the first N sentences")
    t.add_argument("--hyps", type=Path, default=None, help="also write the translations to this file")
    c = sub.add_parser("classification", parents=[common], help="accuracy on a sentence<TAB>label TSV")
    c.add_argument("--tsv", type=Path, required=True)
    v = sub.add_parser("vision", parents=[common], help="accuracy on IDX images and labels")
    v.add_argument("--images", type=Path, required=True)
    v.add_argument("--labels", type=Path, required=True)
    lm = sub.add_parser("lm", parents=[common], help="perplexity per piece on one document per line")
    lm.add_argument("--text", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    import models

    folder = models.resolve(args.checkpoint)
    model = models.load(folder)
    t0 = time.time()
    if args.kind == "translation":
        src, ref = read_lines(args.src), read_lines(args.ref)
        if args.limit:
            src, ref = src[:args.limit], ref[:args.limit]
        result, hyps = evaluate_translation(model, src, ref, args.beam, args.batch_size or 32,
                                            args.length_penalty)
        if args.hyps:
            args.hyps.write_text("\n".join(hyps) + "\n", encoding="utf-8")
        key, extra = f"{Path(args.ref).name}", {"beam": args.beam, "metric": _sacrebleu_signature()}
    elif args.kind == "classification":
        result = evaluate_classification(model, args.tsv, args.batch_size or 256)
        key, extra = Path(args.tsv).parent.name + "/" + Path(args.tsv).name, {}
    elif args.kind == "lm":
        result = evaluate_lm(model, args.text, args.batch_size or 32)
        key, extra = Path(args.text).parent.name + "/" + Path(args.text).name, {}
    else:
        result = evaluate_vision(model, args.images, args.labels, args.batch_size or 500)
        key, extra = Path(args.images).name, {}
    seconds = time.time() - t0
    if args.write_metrics:
        from train.loop import hardware

        command = "python -m train.evaluate " + " ".join(
            shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
        write_metrics(folder, key, result, {**extra, "command": command, "seconds": round(seconds, 1),
                                            "hardware": hardware(), "torch": torch.__version__})
    print(json.dumps(result))
    return 0


def evaluate_lm(model: Any, path: Path, batch_size: int) -> dict[str, Any]:
    """Perplexity per piece of the documents in ``path`` (train.lm's convention)."""
    import math

    from train.lm import encode_documents, perplexity_sums, read_documents

    docs = encode_documents(model.tokenizer, read_documents(path))
    nll, n = perplexity_sums(model, docs, model.config.max_len, next(model.parameters()).device, batch_size)
    return {"perplexity": round(math.exp(nll / n), 3), "tokens": n, "documents": len(docs)}


def _sacrebleu_signature() -> str:
    import sacrebleu

    return f"sacreBLEU {sacrebleu.__version__}, tokenize 13a, cased"


if __name__ == "__main__":
    raise SystemExit(main())
