"""What a language model's heads do on three sources it was not trained on, and (``--perplexity``) its test
perplexity against the Kneser–Ney trigram (bench/lm_baseline.py), in one command:

    python bench/lm_heads.py --checkpoint checkpoints/gpt-tiny --perplexity

Sources (each gives ``--spans`` spans x of ``--n`` pieces, in a fixed order):
- ``captions``: Multi30k ``test_2016_flickr.en``; consecutive captions, each encoded alone, joined until a span is full;
- ``sst2``: SST-2 ``dev.tsv`` sentences, the same way;
- ``random``: ordinary pieces drawn uniformly without replacement (seed = the span's index).

Per source, averaged over its spans, with the app's own scores (``models.analysis``):
- previous token: attention from each token i ≥ 1 to i − 1 on ``<s> x`` as it is (text as text; for ``random``
  on ``<s> x x``, the repeated-token test);
- induction: on ``<s> x x``, attention from each token of the second copy to the token after its first
  occurrence, i → i − n + 1 (Olsson et al. 2022);
- copy: ``<s>`` + x's first 30 pieces + its first 10 again; a span passes when greedy decoding continues with
  pieces 11-15 (``copy`` counts the spans that pass).
The best head per source and score is reported with its (layer, head). gpt-tiny's bars (issue 38,
tests/test_gpt_tiny.py): previous token ≥ 0.8, induction ≥ 0.5, copy ≥ 16 of 20, on every source; test
perplexity ≤ 0.75 × the trigram's.

Last stdout line: one JSON object, ``sources`` -> {source: {previous_token, previous_token_head, induction,
induction_head, copy, spans}}, and with ``--perplexity`` the lm_baseline report under ``perplexity``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SOURCES = {"captions": "multi30k/test_2016_flickr.en.gz", "sst2": "sst2/dev.tsv", "random": None}
COPY_PROMPT, COPY_REPEAT, COPY_CHECK = 30, 10, 5  # x[:30] + x[:10], then x[10:15] must follow


def text_spans(model, lines: list[str], n: int, count: int) -> list[list[int]]:
    """``count`` spans of ``n`` pieces: consecutive lines, each encoded alone, joined until a span is full (the
    rest of the last line is dropped; the next span starts at the next line)."""
    tok, spans, cur = model.tokenizer, [], []
    for line in lines:
        cur += tok.sp.encode(tok.normalize(line))
        if len(cur) >= n:
            spans.append(cur[:n])
            cur = []
            if len(spans) == count:
                return spans
    raise ValueError(f"the text gives only {len(spans)} spans of {n} pieces, {count} asked")


def random_spans(model, n: int, count: int) -> list[list[int]]:
    """``count`` spans of ``n`` distinct ordinary pieces (``GPT.repeated_tokens``, seed = the span's index)."""
    return [model.repeated_tokens(n, seed)[1 : n + 1] for seed in range(count)]


def source_spans(model, source: str, data_dir: Path, n: int, count: int) -> list[list[int]]:
    from train.lm import read_documents

    if SOURCES[source] is None:
        return random_spans(model, n, count)
    return text_spans(model, read_documents(data_dir / SOURCES[source]), n, count)


def score_source(model, spans: list[list[int]], plain_previous: bool) -> dict:
    """The three scores of one source's spans (see the module docstring)."""
    from models.analysis import induction_score, previous_token_score

    bos, n = model.config.bos_id, len(spans[0])
    previous, induction, copied = [], [], 0
    for x in spans:
        _, twice = model.token_losses([bos, *x, *x])
        induction.append(induction_score(twice, n))
        previous.append(previous_token_score(model.token_losses([bos, *x])[1] if plain_previous else twice))
        prompt = [bos, *x[:COPY_PROMPT], *x[:COPY_REPEAT]]
        out = model.generate(prompt, max_new_tokens=COPY_CHECK)
        copied += out.ids[len(prompt):] == x[COPY_REPEAT : COPY_REPEAT + COPY_CHECK]
    report: dict = {"spans": len(spans), "copy": int(copied)}
    for name, scores in (("previous_token", previous), ("induction", induction)):
        mean = np.mean(scores, 0)
        layer, head = np.unravel_index(int(np.argmax(mean)), mean.shape)
        report[name], report[f"{name}_head"] = round(float(mean.max()), 4), [int(layer), int(head)]
    return report


def perplexity(checkpoint: Path, data_dir: Path) -> dict:
    spec = importlib.util.spec_from_file_location("lm_baseline", ROOT / "bench" / "lm_baseline.py")
    baseline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(baseline)
    return baseline.compare(checkpoint, data_dir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=ROOT / "checkpoints" / "gpt-tiny")
    ap.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--spans", type=int, default=20, help="spans per source")
    ap.add_argument("--n", type=int, default=50, help="pieces per span (at least 30)")
    ap.add_argument("--perplexity", action="store_true", help="also the test perplexity against the trigram")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    if args.n < COPY_PROMPT or args.spans < 1:
        ap.error(f"--n must be at least {COPY_PROMPT} and --spans at least 1")
    import torch

    import models

    if args.threads:
        torch.set_num_threads(args.threads)
    model = models.load(args.checkpoint)
    report: dict = {"checkpoint": str(args.checkpoint), "n": args.n, "sources": {}}
    print("| source | previous token | induction | copy |\n|---|---|---|---|", file=sys.stderr)
    for source in SOURCES:
        spans = source_spans(model, source, args.data_dir, args.n, args.spans)
        r = report["sources"][source] = score_source(model, spans, plain_previous=SOURCES[source] is not None)
        print(f"| {source} | {r['previous_token']:.3f} (L{r['previous_token_head'][0]} H{r['previous_token_head'][1]}) "
              f"| {r['induction']:.3f} (L{r['induction_head'][0]} H{r['induction_head'][1]}) "
              f"| {r['copy']}/{r['spans']} |", file=sys.stderr)
    if args.perplexity:
        report["perplexity"] = perplexity(args.checkpoint, args.data_dir)
        p = report["perplexity"]
        print(f"test perplexity {p['model_ppl']:.2f} against the trigram's {p['trigram_ppl']:.2f}: ratio "
              f"{p['ratio']:.3f}", file=sys.stderr)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
