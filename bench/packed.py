"""fp16-packed linear layers (models.decoding.packed) against plain float32, same checkpoints, same run.

For each model, both versions are loaded (``models.load``, which is plain, and a copy packed by
``models.decoding.packed.pack_linears`` as the app's model store packs it) and timed interleaved on the app's
inputs: the translator on the 20-word sentence with beam 5 (``translate``: beam search plus the attention
pass), the MiniLM and from-scratch classifiers on the SST-2 sentence.
Outputs are compared as they are timed: the same translation, scores within 1e-4, attention within 1e-4.
``--sentences N`` also decodes the first N Multi30k test sentences (beam 5) both ways and reports how
many translations differ and both corpus BLEUs.

    python bench/packed.py [--repeats 20] [--threads 0] [--sentences 0] [--data-dir ../shared/data]

Last stdout line: one JSON object: ``<model>_plain_ms``, ``<model>_packed_ms`` (medians),
``<model>_speedup`` (plain / packed), ``<model>_same`` and, with --sentences, ``bleu_plain``,
``bleu_packed``, ``translations_differing``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._server import SENTENCE_20, SST2, machine_info  # noqa: E402


def same_result(a: Any, b: Any) -> bool:
    """Same translation (tokens, score within 1e-4) or class probabilities, and attention within 1e-4."""
    if hasattr(a, "target_tokens"):
        if a.target_tokens != b.target_tokens or abs(a.score - b.score) > 1e-4:
            return False
    elif not np.allclose(a.probs, b.probs, atol=1e-4):
        return False
    return a.attention.keys() == b.attention.keys() and all(
        np.allclose(a.attention[k].weights, b.attention[k].weights, atol=1e-4) for k in a.attention)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default, as the app)")
    ap.add_argument("--models", default="translator-en-de,minilm-sst2,sst2")
    ap.add_argument("--checkpoints", type=Path, default=ROOT / "checkpoints")
    ap.add_argument("--sentences", type=int, default=0, help="also decode this many Multi30k test sentences")
    ap.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--min-weights", type=int, default=None,
                    help="pack layers from this many weights (default: models.decoding.packed.MIN_WEIGHTS, as the app)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    import models
    from models.decoding.packed import MIN_WEIGHTS, PackedLinear, pack_linears, supported
    from models.families.classifier import classify_text

    report: dict[str, Any] = {"fbgemm": supported(), **machine_info()}
    plain_translator = packed_translator = None
    for name in args.models.split(","):
        plain = models.load(args.checkpoints / name)
        packed = models.load(args.checkpoints / name)
        pack_linears(packed, MIN_WEIGHTS if args.min_weights is None else args.min_weights)
        if name.startswith("translator"):
            def run(m: Any) -> Any:
                return m.translate(SENTENCE_20, beam_size=5)
            plain_translator, packed_translator = plain, packed
        else:
            def run(m: Any) -> Any:
                return classify_text(m, SST2)
        times: dict[str, list[float]] = {"plain": [], "packed": []}
        same = same_result(run(plain), run(packed))  # also the warm-up
        for _ in range(args.repeats):
            outs = []
            for label, m in (("plain", plain), ("packed", packed)):
                t0 = time.perf_counter()
                outs.append(run(m))
                times[label].append(time.perf_counter() - t0)
            same = same and same_result(*outs)
        tp, tq = (statistics.median(times[k]) * 1000 for k in ("plain", "packed"))
        n_packed = sum(type(m) is PackedLinear for m in packed.modules())
        print(f"{name:18s} plain {tp:7.1f} ms   packed {tq:7.1f} ms   x{tp / tq:.2f}   "
              f"{n_packed} layers packed   same output: {same}")
        report.update({f"{name}_plain_ms": round(tp, 1), f"{name}_packed_ms": round(tq, 1),
                       f"{name}_speedup": round(tp / tq, 2), f"{name}_same": same,
                       f"{name}_packed_layers": n_packed})

    if args.sentences and plain_translator is not None:
        import sacrebleu

        from train.data import load_multi30k

        test = load_multi30k(args.data_dir, "test_2016_flickr", "en", "de")
        src, ref_text = test.src[:args.sentences], test.tgt[:args.sentences]
        outs = {label: [m.translate(s, beam_size=5).text for s in src]
                for label, m in (("plain", plain_translator), ("packed", packed_translator))}
        report["sentences"] = len(src)
        report["translations_differing"] = sum(a != b for a, b in zip(outs["plain"], outs["packed"]))
        for label, hyp in outs.items():
            report[f"bleu_{label}"] = round(sacrebleu.corpus_bleu(hyp, [ref_text]).score, 2)
        print(f"{len(src)} test sentences: {report['translations_differing']} translations differ; "
              f"BLEU plain {report['bleu_plain']}, packed {report['bleu_packed']}")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
