"""What a language model's heads can do: the copy test on its generated text, and the best induction and
previous-token scores (the app's own: ``GPT.head_role_scores``, i.e. ``models.analysis.head_roles``).

- Copy test: a prompt of 30 random common words (the list below, of this script's own; no training
  recipe may use it), then the first 10 of them again; a trial passes when greedy decoding continues with
  words 11-15. ``--trials`` seeded trials (default 20); ``copy_rate`` is the share that pass.
- Head scores on ``<s>`` + N random non-special tokens repeated twice (N = 50, seeds 0..trials−1), averaged
  over the seeds (``GPT.repeated_tokens``): induction = attention from each token i of the second copy to i − N + 1
  (the token after its earlier occurrence, Olsson et al. 2022); previous token = attention from i to i − 1.

    python bench/lm_heads.py --checkpoint checkpoints/gpt-tiny

``--pieces frequent`` (or ``rare``) draws the head scores' tokens from the training text's 1,000 most frequent
pieces, those ``train.lm --span-sampling frequent`` builds its short rows of (or from all the other pieces);
``--oversample`` counts a source's lines as the run did (agnews=2). A head may score differently on the two:

    python bench/lm_heads.py --checkpoint DIR --pieces frequent --oversample agnews=2

Last stdout line: one JSON object with ``copy_rate``, ``induction_max`` (and its layer, head),
``previous_token_max`` (and its layer, head). gpt-tiny's bars (tests/test_gpt_tiny.py): copy_rate ≥ 0.8,
induction_max ≥ 0.5, previous_token_max ≥ 0.8.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

COPY_WORDS = """time year people way day man thing woman life child world school state family student group
country problem hand part place case week company system program question work government number night point
home water room mother area money story fact month lot right study book eye job word business issue side kind
head house service friend father power hour game line end member law car city community name president team
minute idea kid body information back parent face others level office door health person art war history party
result change morning reason research girl guy moment air teacher force education""".split()


def copy_rate(model, trials: int = 20) -> float:
    hits = 0
    for seed in range(trials):
        words = random.Random(seed).sample(COPY_WORDS, 30)
        result = model.generate(" ".join(words + words[:10]), max_new_tokens=24)
        hits += result.text.split()[:5] == words[10:15]
    return hits / trials


def training_pieces(model, which: str, data_dir: Path | None, oversample: list[str],
                    n: int | None = None) -> np.ndarray:
    """The training text's ``n`` (default train.lm.FREQUENT) most frequent pieces under the model's tokeniser
    ("frequent"), or every other piece ("rare"; ``GPT.repeated_tokens`` leaves the special ones out)."""
    from train.data import DEFAULT_DATA_DIR
    from train.lm import FREQUENT, frequent_pieces, load_corpus, training_documents

    times = {k: int(v) for k, v in (o.split("=") for o in oversample)}
    docs, _ = training_documents(model.tokenizer, load_corpus(data_dir or DEFAULT_DATA_DIR)["train"], times)
    top = frequent_pieces(docs, model.config.vocab_size, n or FREQUENT)
    return top if which == "frequent" else np.setdiff1d(np.arange(model.config.vocab_size), top)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=ROOT / "checkpoints" / "gpt-tiny")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--n", type=int, default=50, help="tokens per copy for the head scores")
    ap.add_argument("--pieces", choices=["all", "frequent", "rare"], default="all",
                    help="the head scores' tokens: any piece, the training text's most frequent ones, or the rest")
    ap.add_argument("--data-dir", type=Path, default=None, help="with --pieces: the training data (../shared/data)")
    ap.add_argument("--oversample", nargs="+", default=(), metavar="SOURCE=K",
                    help="with --pieces: count every line of SOURCE K times, as train.lm --oversample did")
    args = ap.parse_args(argv)
    import models

    model = models.load(args.checkpoint)
    pieces = None if args.pieces == "all" else training_pieces(model, args.pieces, args.data_dir, args.oversample)
    rate = copy_rate(model, args.trials)
    scores = model.head_role_scores(args.n, range(args.trials), pieces)
    induction, previous = scores["induction"], scores["previous"]
    (il, ih), (pl, ph) = (np.unravel_index(int(np.argmax(s)), s.shape) for s in (induction, previous))
    report = {"checkpoint": str(args.checkpoint), "copy_rate": rate, "trials": args.trials, "n": args.n,
              "pieces": args.pieces,
              "induction_max": round(float(induction.max()), 4), "induction_head": [int(il), int(ih)],
              "previous_token_max": round(float(previous.max()), 4), "previous_token_head": [int(pl), int(ph)]}
    print(f"copy test {rate:.0%}; induction {induction.max():.3f} (layer {il} head {ih}); previous token "
          f"{previous.max():.3f} (layer {pl} head {ph})", file=sys.stderr)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
