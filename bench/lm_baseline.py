"""A language model against a classical baseline, same run: interpolated modified Kneser–Ney trigram.

The trigram model (Chen & Goodman 1998, "An Empirical Study of Smoothing Techniques for Language
Modeling", §3.5 and eq. 26) is trained on the model's own training text (train.lm's three sources, the
hold-outs removed) in the model's own token ids, and both are scored on the same test files with the same
convention: each line one document ``<s> pieces </s>``, every piece after ``<s>`` predicted, ``</s>``
included; the trigram's histories before the first piece are padded with ``<s>``.

Modified Kneser–Ney, per order n (trigram, bigram, unigram):
    P(w | h) = max(c(h w) − D(c(h w)), 0) / c(h) + γ(h) · P_lower(w | h′)
    γ(h) = (D1 · N1(h •) + D2 · N2(h •) + D3+ · N3+(h •)) / c(h)
    D1 = 1 − 2Y n2/n1, D2 = 2 − 3Y n3/n2, D3+ = 3 − 4Y n4/n3, Y = n1 / (n1 + 2 n2)
where c are counts at the highest order and continuation counts N1+(• h w) at the lower ones, n_k the number
of n-grams of that order with count exactly k, and the unigram level interpolates with the uniform
distribution over the vocabulary. A history never seen falls back to the lower order entirely.

    python bench/lm_baseline.py --checkpoint checkpoints/gpt-tiny [--data-dir ../shared/data]

Last stdout line: one JSON object with ``model_ppl``, ``trigram_ppl``, ``ratio`` (model / trigram; lower is
better) over all three test files together, and per file.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TEST_FILES = ("multi30k/test_2016_flickr.en.gz", "sst2/dev.tsv", "agnews/test.tsv")


def discounts(count_of_counts: Counter) -> tuple[float, float, float]:
    """(D1, D2, D3+) from the numbers of n-grams seen exactly 1..4 times (Chen & Goodman 1998, eq. 26)."""
    n1, n2, n3, n4 = (count_of_counts.get(k, 0) for k in (1, 2, 3, 4))
    if min(n1, n2, n3) == 0:  # too little data for the estimate: plain absolute discounting
        return 0.5, 0.5, 0.5
    y = n1 / (n1 + 2 * n2)
    return 1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3


class Level:
    """One order: counts c(h, w) keyed by history, with the statistics the interpolation needs."""

    def __init__(self, counts: Counter) -> None:
        self.by_history: dict[tuple, dict[int, int]] = defaultdict(dict)
        for (*h, w), c in counts.items():
            self.by_history[tuple(h)][w] = c
        self.d = discounts(Counter(counts.values()))
        self.total: dict[tuple, int] = {}
        self.gamma_mass: dict[tuple, float] = {}
        for h, ws in self.by_history.items():
            self.total[h] = sum(ws.values())
            n = Counter(min(c, 3) for c in ws.values())
            self.gamma_mass[h] = self.d[0] * n[1] + self.d[1] * n[2] + self.d[2] * n[3]

    def discount(self, c: int) -> float:
        return 0.0 if c == 0 else self.d[min(c, 3) - 1]


class KneserNeyTrigram:
    """Interpolated modified Kneser–Ney over token ids; ``prob(w, (u, v))`` is P(w | u v)."""

    def __init__(self, documents: Iterable[Sequence[int]], vocab_size: int, bos: int) -> None:
        self.vocab_size, self.bos = vocab_size, bos
        tri: Counter = Counter()
        for doc in documents:
            seq = [bos, bos, *doc[1:]]  # doc = <s> pieces </s>; two <s> give the first piece a trigram history
            tri.update(zip(seq, seq[1:], seq[2:]))
        # continuation counts: how many distinct words precede each lower-order n-gram (the KN idea)
        bi_cont = Counter((v, w) for (_u, v, w) in tri)
        uni_cont = Counter((w,) for (_v, w) in bi_cont)
        self.levels = [Level(tri), Level(bi_cont), Level(uni_cont)]

    def prob(self, w: int, history: tuple[int, int]) -> float:
        p = 1.0 / self.vocab_size  # the uniform floor below the unigrams
        for level, h in zip(reversed(self.levels), ((), history[1:], history)):
            ws = level.by_history.get(h)
            if not ws:  # unseen history: this order adds nothing, the lower order stands
                continue
            total = level.total[h]
            c = ws.get(w, 0)
            p = max(c - level.discount(c), 0.0) / total + level.gamma_mass[h] / total * p
        return p

    def nll(self, documents: Iterable[Sequence[int]]) -> tuple[float, int]:
        """(summed negative log-likelihood in nats, predicted tokens): every piece after <s>, </s> included."""
        total, n = 0.0, 0
        for doc in documents:
            seq = [self.bos, self.bos, *doc[1:]]
            for u, v, w in zip(seq, seq[1:], seq[2:]):
                total -= math.log(self.prob(w, (u, v)))
                n += 1
        return total, n


def compare(checkpoint: Path, data_dir: Path, limit: int | None = None) -> dict:
    """The model's and the trigram's perplexity on each test file and on all three together (the report)."""
    import torch

    import models
    from train.lm import encode_documents, load_corpus, perplexity_sums, read_documents

    model = models.load(checkpoint)
    tok = model.tokenizer
    t0 = time.time()
    corpus = load_corpus(data_dir)
    train_docs = [d.tolist() for texts in corpus["train"].values() for d in encode_documents(tok, texts)]
    kn = KneserNeyTrigram(train_docs, tok.vocab_size, tok.bos_id)
    fit_s = time.time() - t0
    report: dict = {"checkpoint": str(checkpoint), "trigram_training_tokens": sum(len(d) - 1 for d in train_docs),
                    "trigram_discounts": [[round(x, 4) for x in level.d] for level in kn.levels]}
    sums = {"model": [0.0, 0], "trigram": [0.0, 0]}
    for rel in TEST_FILES:
        docs = encode_documents(tok, read_documents(data_dir / rel)[:limit])
        m_nll, m_n = perplexity_sums(model, docs, model.config.max_len, torch.device("cpu"))
        k_nll, k_n = kn.nll([d.tolist() for d in docs])
        assert m_n == k_n, (m_n, k_n)  # the same predicted tokens on both sides
        name = rel.split("/")[0]
        report[f"{name}_model_ppl"] = round(math.exp(m_nll / m_n), 2)
        report[f"{name}_trigram_ppl"] = round(math.exp(k_nll / k_n), 2)
        report[f"{name}_tokens"] = m_n
        for key, (nll, n) in (("model", (m_nll, m_n)), ("trigram", (k_nll, k_n))):
            sums[key][0] += nll
            sums[key][1] += n
        print(f"{rel:36s} model {report[f'{name}_model_ppl']:8.2f}   trigram {report[f'{name}_trigram_ppl']:8.2f}   "
              f"({m_n:,} tokens)", file=sys.stderr)
    model_ppl = math.exp(sums["model"][0] / sums["model"][1])
    trigram_ppl = math.exp(sums["trigram"][0] / sums["trigram"][1])
    report.update({"model_ppl": round(model_ppl, 2), "trigram_ppl": round(trigram_ppl, 2),
                   "ratio": round(model_ppl / trigram_ppl, 3), "tokens": sums["model"][1],
                   "trigram_fit_s": round(fit_s, 1), "seconds": round(time.time() - t0, 1)})
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=ROOT / "checkpoints" / "gpt-tiny")
    ap.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--limit", type=int, default=None, help="documents per test file (tests)")
    args = ap.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    print(json.dumps(compare(args.checkpoint, args.data_dir, args.limit)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
