"""Cached, batched beam search vs the naive reference, on the same model in the same run.

Translator-sized model (d=256, 4 heads, 3+3 layers, 8000 pieces, random weights), a 20-token source,
beam 5, exactly 30 output tokens (eos blocked until then: min_len = max_len = 30), CPU, no grad.

- cached: ``Translator.beam_search``: all beams in one batch, encoder memory projected to K/V once,
  decoder self-attention K/V appended per step.
- naive: the tutorial version: one hypothesis at a time, the whole prefix re-decoded every step,
  the same selection rule (2K best continuations, eos in the first K ranks finishes, K live beams).

Both must return the same hypotheses with scores within 1e-4 ("identical"). Last stdout line: JSON.

    python3 bench/beam_search.py [--repeats 3] [--threads 1]
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


@torch.no_grad()
def naive_beam_search(model: Translator, src: torch.Tensor, k: int, max_len: int, length_penalty: float = 1.0,
                      min_len: int = 0, last_only: bool = False) -> list[tuple[list[int], float]]:
    """One hypothesis at a time, whole prefix re-decoded per step. Returns (tokens, normalised score),
    finished ones in order, the winner first. ``last_only``: the output projection runs on the last
    position only (the leaner tutorial variant); otherwise on the whole prefix, as a plain forward does."""
    c = model.config
    memory, mask, _ = model.encode(src)
    beams: list[tuple[list[int], float]] = [([], 0.0)]
    finals: list[tuple[list[int], float]] = []
    for t in range(max_len):
        rows = []
        for toks, score in beams:
            logits = model.decode(torch.tensor([[c.bos_id, *toks]]), memory, mask, last_only=last_only)[0][0, -1]
            logp = torch.log_softmax(logits.float(), -1)
            if t < min_len:
                logp[c.eos_id] = float("-inf")
            rows.append(torch.tensor(score, dtype=torch.float32) + logp)
        cand = torch.stack(rows).view(-1)  # (beams * V,)
        top_s, top_i = cand.topk(2 * k)
        new: list[tuple[list[int], float]] = []
        for rank, (s, flat) in enumerate(zip(top_s.tolist(), top_i.tolist())):
            b, tok = divmod(flat, cand.numel() // len(beams))
            if tok == c.eos_id:
                if rank < k:
                    finals.append((beams[b][0] + [tok], s))
                continue
            new.append((beams[b][0] + [tok], s))
            if len(new) == k:
                break
        beams = new
        if len(finals) >= k:
            break
    else:
        finals += beams
    normed = [(h, s / len(h) ** length_penalty) for h, s in finals]
    best = max(range(len(normed)), key=lambda j: normed[j][1])
    return [normed[best], *normed[:best], *normed[best + 1 :]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--out-tokens", type=int, default=30)
    ap.add_argument("--src-tokens", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: steady on shared cores; 0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Translator(TranslatorConfig(dropout=0.0)).eval()
    c = model.config
    src = torch.randint(3, c.vocab_size, (1, args.src_tokens))
    n, k = args.out_tokens, args.beam

    def cached() -> list[tuple[list[int], float]]:
        out = model.beam_search(src, beam_size=k, max_len=n, min_len=n)[0]
        best = (out.tokens, out.score)
        return [best, *[h for h in out.hypotheses if h[0] != out.tokens]]

    def naive() -> list[tuple[list[int], float]]:
        return naive_beam_search(model, src, k, n, min_len=n)

    def naive_last() -> list[tuple[list[int], float]]:
        return naive_beam_search(model, src, k, n, min_len=n, last_only=True)

    runs = (("cached", cached), ("naive", naive), ("naive_last", naive_last))
    times: dict[str, list[float]] = {name: [] for name, _ in runs}
    results = {}
    cached()  # warm-up
    for _ in range(args.repeats):
        for name, fn in runs:
            t0 = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - t0)
    a, b = results["cached"], results["naive"]

    def same(x: list[tuple[list[int], float]], y: list[tuple[list[int], float]]) -> bool:
        return len(x) == len(y) and all(
            hx == hy and abs(sx - sy) < 1e-4 for (hx, sx), (hy, sy) in zip(sorted(x), sorted(y)))

    identical = same(a, b) and same(a, results["naive_last"])
    tc, tn, tl = (statistics.median(times[name]) for name, _ in runs)
    print(f"cached batched beam search:        {tc * 1e3:8.1f} ms (median of {args.repeats})")
    print(f"naive reference:                   {tn * 1e3:8.1f} ms")
    print(f"naive, output layer on last token: {tl * 1e3:8.1f} ms")
    print(f"best hypothesis: {len(a[0][0])} tokens, score {a[0][1]:.4f} (naive {b[0][1]:.4f})")
    print(json.dumps({
        "speedup": round(tn / tc, 2), "speedup_vs_last_only": round(tl / tc, 2), "identical": identical,
        "cached_s": round(tc, 4), "naive_s": round(tn, 4), "naive_last_only_s": round(tl, 4),
        "beam": k, "out_tokens": n, "src_tokens": args.src_tokens, "repeats": args.repeats,
        "threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main()
