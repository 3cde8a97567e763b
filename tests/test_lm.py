"""train/lm.py and bench/lm_baseline.py: packing, synthetic spans, perplexity, and the Kneser–Ney trigram
against hand-computed probabilities."""

from __future__ import annotations

import importlib.util
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from train.lm import (
    REPEAT_CONTEXT,
    REPEAT_WEIGHT,
    LMTask,
    copied_targets,
    pack,
    perplexity_sums,
    phrase_groups,
    read_documents,
    repeated_spans,
    row_length,
    rows_per_batch,
    text_stream,
    training_documents,
)

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("lm_baseline", ROOT / "bench" / "lm_baseline.py")
baseline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(baseline)

B, A, BB, C, E = 0, 1, 2, 3, 4  # <s>, a, b, c, </s>
TOY = [[B, A, BB, E], [B, A, C, E]]


def test_modified_kneser_ney_discounts() -> None:
    d1, d2, d3 = baseline.discounts(Counter({1: 10, 2: 5, 3: 3, 4: 2}))
    # Y = 10 / (10 + 2·5) = 0.5; D1 = 1 − 2Y·5/10, D2 = 2 − 3Y·3/5, D3+ = 3 − 4Y·2/3
    assert (d1, d2, d3) == pytest.approx((0.5, 1.1, 3 - 4 / 3))
    assert baseline.discounts(Counter({1: 4, 2: 1})) == (0.5, 0.5, 0.5)  # no n3: plain absolute discounting


def test_kneser_ney_trigram_by_hand() -> None:
    kn = baseline.KneserNeyTrigram(TOY, vocab_size=5, bos=B)
    # Trigrams: (<s> <s> a)×2, (<s> a b), (a b </s>), (<s> a c), (a c </s>); every level has too few
    # counts for eq. 26, so D = 0.5. Continuation counts: bigrams (<s> a), (a b), (b </s>), (a c), (c </s>)
    # once each; unigrams a 1, b 1, c 1, </s> 2 (of 5), γ = 0.5·3 + 0.5·1 = 2.
    p_uni_b = (1 - 0.5) / 5 + 2 / 5 * (1 / 5)  # 0.18
    p_bi_b = (1 - 0.5) / 2 + (0.5 * 2) / 2 * p_uni_b  # history a: {b: 1, c: 1}
    assert kn.prob(BB, (B, A)) == pytest.approx((1 - 0.5) / 2 + (0.5 * 2) / 2 * p_bi_b)  # 0.42
    p_uni_e = (2 - 0.5) / 5 + 2 / 5 * (1 / 5)  # 0.38
    assert kn.prob(E, (A, BB)) == pytest.approx(0.5 + 0.5 * (0.5 + 0.5 * p_uni_e))  # 0.845
    assert kn.prob(BB, (C, C)) == pytest.approx(0.5 * p_uni_b)  # unseen history (c c): the bigram of c
    # <s> is never predicted: only the uniform floor under the unigrams gives it mass, γ/N · 1/V = 2/5 · 1/5
    assert kn.prob(B, (C, E)) == pytest.approx(2 / 5 * 1 / 5)
    nll, n = kn.nll([[B, A, BB, E]])
    assert n == 3 and nll == pytest.approx(-math.log(kn.prob(A, (B, B)) * kn.prob(BB, (B, A)) * kn.prob(E, (A, BB))))


def test_kneser_ney_distributions_sum_to_one() -> None:
    rng = np.random.default_rng(0)
    docs = [[0, *rng.integers(2, 30, int(rng.integers(3, 15))).tolist(), 1] for _ in range(300)]
    kn = baseline.KneserNeyTrigram(docs, vocab_size=30, bos=0)
    assert all(0 < x < k for level in kn.levels for k, x in zip((1, 2, 3), level.d))  # D_k in (0, k)
    for history in [(0, 0), (0, 5), (5, 7), (29, 29), (7, 1)]:
        assert sum(kn.prob(w, history) for w in range(30)) == pytest.approx(1.0, abs=1e-9)


def _blocks(row: list[int]) -> list[list[int]]:
    """A synthetic row cut at its <s>: the ``x x [x]`` blocks (the last one may be cut short)."""
    cuts = [k for k, t in enumerate(row) if t == 2] + [len(row)]
    return [row[a + 1 : b] for a, b in zip(cuts, cuts[1:], strict=False)]


def _span(block: list[int]) -> list[int] | None:
    """x if block is x twice or three times with x of 8-45 pieces, else None."""
    for k in (2, 3):
        n = len(block) // k
        if len(block) % k == 0 and 8 <= n <= 45 and block == block[:n] * k:
            return block[:n]
    return None


def test_packing_and_synthetic_spans() -> None:
    docs = [np.array([2, 10, 11, 3]), np.array([2, 12, 3]), np.array([2, 13, 14, 15, 3]), np.array([2, 16, 3])]
    rows = pack(docs, context=4)
    # every row starts at a document's <s>; the document cut at a row's end starts the next row again
    assert rows.tolist() == [[2, 10, 11, 3, 2], [2, 12, 3, 2, 13], [2, 13, 14, 15, 3]]
    long = pack([np.array([2, *range(10, 22), 3])], context=4)  # longer than a row: goes on where it was cut
    assert long.tolist() == [[2, 10, 11, 12, 13], [14, 15, 16, 17, 18]]
    # random spans: <s> x x [x] blocks of ordinary pieces (ids 4..49), the row's last block cut
    syn = repeated_spans(20, 255, vocab=50, seed=0)
    assert syn.shape == (20, 256) and bool(syn[:, 0].eq(2).all())
    assert int(syn.min()) >= 2 and not bool(((syn == 0) | (syn == 1) | (syn == 3)).any())
    spans = [_span(b) for r in syn.tolist() for b in _blocks(r)[:-1]]
    assert spans and all(x is not None and min(x) >= 4 for x in spans)
    # with the training text: every other block's span is a window of it (ids 100+), the rest random (< 100)
    docs = [np.array([2, *range(100 + 10 * d, 110 + 10 * d), 3]) for d in range(30)]
    stream = text_stream(docs)
    assert stream.tolist() == list(range(100, 400))  # <s> and </s> left out
    mixed = repeated_spans(30, 95, vocab=100, seed=1, text=stream)
    blocks = [_span(b) for r in mixed.tolist() for b in _blocks(r)[:-1]]
    text = [x for x in blocks if x and x[0] >= 100]
    assert text and all(x == list(range(x[0], x[0] + len(x))) for x in text)  # windows of the stream
    assert len(text) < len(blocks) and all(x is not None for x in blocks)
    assert all(max(x) < 100 for x in blocks if x and x[0] < 100)  # the others: random pieces


def test_synthetic_rows_join_every_batch_and_weigh_in_the_loss() -> None:
    from models.families.gpt import GPT, GPTConfig

    assert rows_per_batch(0.0, 16, 256) == 0 and rows_per_batch(0.065, 16, 256) == 3
    assert rows_per_batch(0.001, 2, 8) == 1  # at least one row when asked for any
    rng = np.random.default_rng(1)
    docs = [np.array([2, *rng.integers(10, 150, int(rng.integers(3, 10))), 3]) for _ in range(200)]
    args = dict(context=16, batch_size=8, vocab=150, seed=0, device=torch.device("cpu"))
    task, plain = LMTask(docs, {}, **args, repeat_rows=3), LMTask(docs, {}, **args)
    batches = task.train_batches(0)
    assert all(torch.equal(t, p) for (t, _), p in zip(batches, plain.train_batches(0), strict=True))
    assert row_length(16) == 16 and row_length(256) == REPEAT_CONTEXT == 96  # rows no longer than the context
    assert all(s.shape == (3, 17) and not bool((s == 3).any()) for _, s in batches)
    assert task.token_counts(4) == (4 * 3 * 16, 4 * (3 * 16 + 8 * 16))
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=150, max_len=16, d_model=16, n_layers=1, n_heads=2)).eval()
    text, short = batches[0]
    keep = copied_targets(short)
    with torch.no_grad():
        both, text_loss = task.loss(model, (text, short), 0, 0.0), task.loss(model, text, 0, 0.0)
        nll = -torch.log_softmax(model(short[:, :-1]).logits, -1).gather(-1, short[:, 1:, None])[..., 0]
    # the rows' loss is the mean over the pieces copying predicts, weighted REPEAT_WEIGHT
    assert float(both) == pytest.approx(float(text_loss + REPEAT_WEIGHT * nll[keep].mean()), rel=1e-5)


def test_copied_targets_are_the_repeats_a_copy_predicts() -> None:
    row = torch.tensor([[2, 10, 11, 12, 10, 11, 12, 10, 11, 2, 20, 21, 20, 21, 10]])
    #                   <s> x = 10 11 12, three copies (cut)   <s> y = 20 21, twice; then 10 (after 21, new)
    got = copied_targets(row)[0].tolist()  # target p + 1 predicted from the prefix up to p
    assert got == [False, False, False, False, True, True, True, True,  # 10 (2nd copy's first) is not
                   False, False, False, False, True, False]
    rows = repeated_spans(50, 64, vocab=60, seed=3, lengths=(4, 31))
    keep = copied_targets(rows)
    assert 0.2 < float(keep.float().mean()) < 0.6  # about the repeats' share of a row


def test_perplexity_sums_score_every_piece_after_bos() -> None:
    from models.families.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, max_len=8, d_model=16, n_layers=1, n_heads=2)).eval()
    docs = [np.array([1, 5, 6, 2]), np.array([1, 7, 8, 9, 10, 11, 12, 13, 14, 15, 2])]  # the 2nd > context
    nll, n = perplexity_sums(model, docs, context=8, device=torch.device("cpu"))
    assert n == 3 + 10
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([[1, 5, 6]])).logits[0], -1)
    first = -(lp[0, 5] + lp[1, 6] + lp[2, 2])
    d2 = docs[1]
    second = 0.0
    for start in (0, 8):  # windows of 8 predictions: tokens 1..8, then 9..10
        w = torch.tensor([d2[start : start + 9].tolist()])
        with torch.no_grad():
            lw = torch.log_softmax(model(w[:, :-1]).logits[0], -1)
        second -= float(lw.gather(1, w[0, 1:, None]).sum())
    assert nll == pytest.approx(float(first) + second, rel=1e-5)


def test_phrase_groups_put_each_phrase_with_the_longest_line_holding_it() -> None:
    texts = ["a good film", "good film", "film", "the plot is thin", "plot", "the plot", "lm", "good", "",
             "is thin", "thin ice"]
    assert phrase_groups(texts) == [0, 0, 0, 3, 3, 3, 6, 0, 8, 3, 10]  # whole words only: "lm" is not in "film"


class _Pieces:  # a stand-in tokeniser: one piece per word (ids from 10), <s> 2 and </s> 3
    bos_id, eos_id = 2, 3

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.sp = self

    def normalize(self, t: str) -> str:
        return t

    def encode(self, t: str) -> list[int]:
        return [self.ids.setdefault(w, 10 + len(self.ids)) for w in t.split()]


def test_grouped_documents_are_packed_together_and_oversampled_lines_repeat() -> None:
    sources = {"multi30k": ["m0", "m1", "m2", "m3"], "agnews": ["n0", "n1"],
               "sst2": ["s0 s1 s2", "s1 s2", "s0", "t0 t1", "t1", "u0"]}
    docs, groups = training_documents(_Pieces(), sources, {"agnews": 3}, group_phrases=True)
    assert len(docs) == 4 + 3 * 2 + 6 and [len(d) for d in docs[-6:]] == [5, 4, 3, 4, 3, 3]
    assert len(set(groups[:10])) == 10  # every Multi30k line and every copy of an AG News line alone
    assert docs[4].tolist() == docs[6].tolist() == docs[8].tolist() and groups[4] != groups[6]
    sst = groups[10:]
    assert sst[0] == sst[1] == sst[2] and sst[3] == sst[4] and len({sst[0], sst[3], sst[5]}) == 3
    plain_docs, plain_groups = training_documents(_Pieces(), sources)
    assert len(plain_docs) == 12 and len(set(plain_groups)) == 12

    # one row per document: rows of 1 + 2 pieces + </s>... the documents' order is the rows' order
    tagged = [np.array([2, 100 + i, 3]) for i in range(len(docs))]
    task = LMTask(tagged, {}, context=2, batch_size=1, vocab=200, seed=0, device=torch.device("cpu"), groups=groups)
    orders = []
    for epoch in range(3):
        order = [int(b[0, 1]) - 100 for b in task.train_batches(epoch)]
        assert sorted(order) == list(range(len(docs)))
        runs = [groups[i] for i in order]
        # a group's documents one after another: each group id occurs in one run
        assert len([g for k, g in enumerate(runs) if k == 0 or runs[k - 1] != g]) == len(set(groups))
        orders.append(order)
    assert orders[0] != orders[1] != orders[2]


def test_read_documents(tmp_path: Path) -> None:
    (tmp_path / "a.tsv").write_text("sentence\tlabel\nfirst one\t1\n\nsecond\t0\n")
    (tmp_path / "b.txt").write_text("one doc\n  \nanother doc\n")
    assert read_documents(tmp_path / "a.tsv") == ["first one", "second"]
    assert read_documents(tmp_path / "b.txt") == ["one doc", "another doc"]


def test_lm_heads_bench_scores_three_sources(tiny_checkpoints: Path, tmp_path: Path, capsys) -> None:
    """bench/lm_heads.py on the tiny random decoder and a tiny data folder: each source's scores are the app's
    scores averaged over its spans, recomputed here from the returned attention; a random model copies nothing."""
    import gzip
    import json

    import models
    from models.analysis import induction_score, previous_token_score

    spec = importlib.util.spec_from_file_location("lm_heads", ROOT / "bench" / "lm_heads.py")
    heads = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(heads)
    data = tmp_path / "data"
    (data / "multi30k").mkdir(parents=True)
    (data / "sst2").mkdir()
    words = "a man rides a red bike down the hill while two dogs run behind him in the rain".split()
    captions = [" ".join(words[k:] + words[:k]) for k in range(len(words))]
    with gzip.open(data / "multi30k" / "test_2016_flickr.en.gz", "wt") as f:
        f.write("\n".join(captions) + "\n")
    (data / "sst2" / "dev.tsv").write_text("sentence\tlabel\n" + "".join(f"{c} .\t1\n" for c in captions[::-1]))
    folder = tiny_checkpoints / "gpt-tiny"
    assert heads.main(["--checkpoint", str(folder), "--data-dir", str(data), "--spans", "3", "--n", "30"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert list(report["sources"]) == ["captions", "sst2", "random"]
    model = models.load(folder)
    for source, got in report["sources"].items():
        spans = heads.source_spans(model, source, data, 30, 3)
        assert len(spans) == 3 and all(len(x) == 30 for x in spans) and spans[0] != spans[1]
        bos = model.config.bos_id
        prev = np.mean([previous_token_score(model.token_losses([bos, *x] if source != "random" else
                                                                [bos, *x, *x])[1]) for x in spans], 0)
        ind = np.mean([induction_score(model.token_losses([bos, *x, *x])[1], 30) for x in spans], 0)
        assert got["previous_token"] == pytest.approx(float(prev.max()), abs=1e-4)
        assert got["induction"] == pytest.approx(float(ind.max()), abs=1e-4)
        assert got["spans"] == 3 and got["copy"] == 0  # a random model does not copy
    tok = model.tokenizer
    assert heads.source_spans(model, "captions", data, 30, 1)[0][:5] == tok.sp.encode(tok.normalize(captions[0]))[:5]
    with pytest.raises(ValueError, match="only"):  # more spans than the text holds
        heads.source_spans(model, "sst2", data, 30, 100)
