"""The shipped decoder, checkpoints/gpt-tiny: the bars it must clear, measured from generated text and the
returned attention alone (no app head-role code, no bench code): the copy test, an induction head and a
previous-token head, and a record that says how it was trained."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "checkpoints" / "gpt-tiny"

# common English words of this test's own (not bench/lm_heads.py's list, and no training recipe reads either)
WORDS = """able above across act add age ago agree air allow almost alone along already also always among animal
answer appear apple arm army around arrive ask baby bad bag ball bank base bear beat bed begin bell best better
big bird black blood blue board boat bone book born both bottom box boy bread break bright bring brother brown
build burn busy buy call camp capital captain car card care carry catch cause cell center century chair chance
check chief church circle clean clear climb clock close cloud coast cold color column come common condition
contain corn cost cotton count course cover cow cross crowd cry current cut dance dark dead deal death decide
""".split()


@pytest.fixture(scope="module")
def model():
    import models

    return models.load(FOLDER)


def test_copy_test_on_words_of_this_tests_own(model) -> None:
    hits = []
    for seed in range(1000, 1020):
        words = random.Random(seed).sample(WORDS, 30)
        text = model.generate(" ".join(words + words[:10]), max_new_tokens=24).text
        hits.append(text.split()[:5] == words[10:15])
    assert sum(hits) >= 16, f"{sum(hits)} of 20 trials continued the copy"


def _scores(model, n: int = 50, seeds: range = range(20)) -> tuple[np.ndarray, np.ndarray]:
    c = model.config
    special = {c.bos_id, c.eos_id, c.pad_id, model.tokenizer.unk_id}
    pool = [i for i in range(c.vocab_size) if i not in special]
    ind, prev = [], []
    for seed in seeds:
        x = random.Random(seed).sample(pool, n)
        w = np.asarray(model.generate([c.bos_id, *x, *x], max_new_tokens=0).attention["decoder"].weights)
        assert np.allclose(w.sum(-1), 1.0, atol=1e-4) and np.allclose(np.triu(w, 1), 0.0)  # causal rows
        i = np.arange(n + 1, 2 * n + 1)  # the second copy; token i first occurred at i - n
        ind.append(w[:, :, i, i - n + 1].mean(-1))
        j = np.arange(1, 2 * n + 1)
        prev.append(w[:, :, j, j - 1].mean(-1))
    return np.mean(ind, 0), np.mean(prev, 0)


def test_an_induction_head_and_a_previous_token_head(model) -> None:
    induction, previous = _scores(model)
    assert induction.max() >= 0.5, induction.round(2)
    assert previous.max() >= 0.8, previous.round(2)


def test_record_says_how_it_was_trained() -> None:
    metrics = json.loads((FOLDER / "metrics.json").read_text())
    record = metrics["training"]
    assert record["command"].startswith("python -m train.lm ")
    share = record["data"]["synthetic_repeated_spans"]["up_to_shipped_weights"]["share_of_training_tokens"]
    assert 0 < share <= 0.10
    assert record["hardware"] and record["minutes"] > 0
    tests = " ".join(metrics["evaluations"])
    for name in ("test_2016_flickr.en", "sst2", "agnews"):
        assert name in tests, f"no test-split perplexity for {name} in metrics.json"
    for result in metrics["evaluations"].values():
        assert result["perplexity"] > 1 and result["tokens"] > 1000
