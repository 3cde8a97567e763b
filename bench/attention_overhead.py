"""What does capturing attention cost? Fused forward vs the explicit path that returns every weight.

Translator-sized model (d=256, 4 heads, 3+3 layers, 8000-piece vocabulary), one 20-token source and a
20-token target prefix, no grad, CPU. Repeats are interleaved (fused, explicit, fused, ...) so drift in
machine load hits both alike; the medians are compared. Last stdout line: one JSON object.

    python3 bench/attention_overhead.py [--repeats 50] [--tokens 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from models.families.translator import Translator, TranslatorConfig  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: steady on shared cores; 0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Translator(TranslatorConfig(dropout=0.0)).eval()
    c = model.config
    src = torch.randint(3, c.vocab_size, (1, args.tokens))
    tgt = torch.randint(3, c.vocab_size, (1, args.tokens))

    def fused() -> torch.Tensor:
        return model(src, tgt)

    def explicit() -> torch.Tensor:
        return model.forward_with_attention(src, tgt)[0]

    times: dict[str, list[float]] = {"fused": [], "explicit": []}
    with torch.no_grad():
        max_diff = float((fused() - explicit()).abs().max())
        for _ in range(5):  # warm-up
            fused()
            explicit()
        for _ in range(args.repeats):
            for name, fn in (("fused", fused), ("explicit", explicit)):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    f, e = statistics.median(times["fused"]), statistics.median(times["explicit"])
    print(f"fused    median {f * 1e3:7.2f} ms")
    print(f"explicit median {e * 1e3:7.2f} ms (returns encoder, decoder and cross attention)")
    print(json.dumps({
        "overhead": round(e / f, 3), "fused_ms": round(f * 1e3, 3), "explicit_ms": round(e * 1e3, 3),
        "tokens": args.tokens, "repeats": args.repeats, "threads": torch.get_num_threads(),
        "max_logit_diff": max_diff,
    }))


if __name__ == "__main__":
    main()
