"""train/lm.py and bench/lm_baseline.py: packing, synthetic spans, perplexity, and the Kneser–Ney trigram
against hand-computed probabilities."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import itertools
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor

from train.lm import (
    CopyRows,
    HeadFreeze,
    LMTask,
    copied_targets,
    frequent_words,
    pack,
    perplexity_sums,
    phrase_groups,
    read_documents,
    repeated_spans,
    repeated_text,
    repeated_words,
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


def test_packing_and_synthetic_spans() -> None:
    docs = [np.array([2, 10, 11, 3]), np.array([2, 12, 3]), np.array([2, 13, 14, 15, 3]), np.array([2, 16, 3])]
    rows = pack(docs, context=4)
    # every row starts at a document's <s>; the document cut at a row's end starts the next row again
    assert rows.tolist() == [[2, 10, 11, 3, 2], [2, 12, 3, 2, 13], [2, 13, 14, 15, 3]]
    long = pack([np.array([2, *range(10, 22), 3])], context=4)  # longer than a row: goes on where it was cut
    assert long.tolist() == [[2, 10, 11, 12, 13], [14, 15, 16, 17, 18]]
    unigram = np.zeros(50)
    unigram[10:50] = 1 / 40
    syn = repeated_spans(20, 255, unigram, seed=0)
    assert syn.shape == (20, 256) and int(syn[:, 0].eq(2).all()) == 1
    row = syn[0].tolist()
    nxt = row.index(2, 1) if 2 in row[1:] else len(row)  # the first span block: <s> x x [x]
    block = row[1:nxt]
    for k in (2, 3):
        if len(block) % k == 0 and 8 <= len(block) // k <= 60:
            span = block[: len(block) // k]
            if block == span * k:
                break
    else:
        raise AssertionError(f"no repeated span in {block}")


def test_pooled_spans_repeat_pieces_within_a_span_and_copy_it_exactly() -> None:
    unigram = np.zeros(200)
    unigram[4:] = 1 / 196
    rows = repeated_spans(30, 127, unigram, seed=1, lengths=(12, 20), pool=6)
    blocks = 0
    for row in rows.tolist():
        starts = [i for i, t in enumerate(row) if t == 2] + [len(row)]
        for a, b in zip(starts[:-2], starts[1:-1], strict=True):  # whole <s> x x [x] blocks (the last may be cut)
            block = row[a + 1 : b]
            k = next(k for k in (2, 3) if len(block) % k == 0 and block == block[: len(block) // k] * k
                     and 12 <= len(block) // k <= 20)
            span = block[: len(block) // k]
            assert len(set(span)) <= 6 < len(span)  # a piece recurs: one piece alone does not say where to go on
            blocks += 1
    assert blocks >= 30
    plain = repeated_spans(30, 127, unigram, seed=1, lengths=(12, 20))
    assert len(set(plain[0, 1:13].tolist())) > 6  # without a pool the pieces come from all 196


def test_copy_warmup_opens_the_first_epoch_and_synthetic_tokens_are_counted() -> None:
    rng = np.random.default_rng(0)
    docs = [np.array([2, *rng.integers(10, 50, int(rng.integers(3, 10))), 3]) for _ in range(400)]
    warm = CopyRows(context=12, lengths=(3, 5), warmup_steps=5, warmup_batch=4)
    args = dict(context=16, batch_size=8, repeat_share=0.10, vocab=50, seed=0, device=torch.device("cpu"))
    task, plain = LMTask(docs, {}, **args, copy=warm), LMTask(docs, {}, **args)
    first, second = task.train_batches(0), task.train_batches(1)
    assert all(b.shape == (4, 13) for b in first[:5])
    assert all(torch.equal(a, b) for a, b in zip(first[5:], plain.train_batches(0), strict=True))
    assert all(b.shape == (8, 17) for b in first[5:] + second)
    assert not any(bool((b == 3).any()) for b in first[:5])  # no document in the warm-up: spans only
    # by hand: a text row holds a </s> (every document is shorter than a row), a synthetic row none
    def synthetic_tokens(batches: list[torch.Tensor]) -> int:
        return sum(int((~(b == 3).any(1)).sum()) * (b.size(1) - 1) for b in batches)

    n1, n2 = len(first), len(second)
    syn, total = task.token_counts(n1 + 3)
    assert syn == synthetic_tokens(first + second[:3])
    assert total == 5 * 4 * 12 + (n1 - 5 + 3) * 8 * 16
    text_syn, _ = task.token_counts(n1 + n2)
    assert text_syn - synthetic_tokens(first[:5]) == synthetic_tokens(first[5:] + second) > 0
    share = synthetic_tokens(second) / sum(b[:, 1:].numel() for b in second)
    assert share == pytest.approx(0.10, abs=0.03)  # within an epoch, the --repeat-share


def test_short_copy_rows_join_every_batch_and_weigh_in_the_loss() -> None:
    from models.gpt import GPT, GPTConfig

    rng = np.random.default_rng(1)
    docs = [np.array([2, *rng.integers(10, 50, int(rng.integers(3, 10))), 3]) for _ in range(200)]
    args = dict(context=16, batch_size=8, repeat_share=0.0, vocab=50, seed=0, device=torch.device("cpu"))
    task = LMTask(docs, {}, **args, copy=CopyRows(per_batch=3, context=12, lengths=(3, 5), weight=0.5))
    plain = LMTask(docs, {}, **args)
    batches = task.train_batches(0)
    assert all(torch.equal(t, p) for (t, _), p in zip(batches, plain.train_batches(0), strict=True))
    assert all(s.shape == (3, 13) and not bool((s == 3).any()) for _, s in batches)
    syn, total = task.token_counts(4)
    assert (syn, total) == (4 * 3 * 12, 4 * (3 * 12 + 8 * 16))
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, max_len=16, d_model=16, n_layers=1, n_heads=2)).eval()
    text, short = batches[0]
    keep = copied_targets(short)
    with torch.no_grad():
        both, text_loss = task.loss(model, (text, short), 0, 0.0), task.loss(model, text, 0, 0.0)
        nll = -torch.log_softmax(model(short[:, :-1]).logits, -1).gather(-1, short[:, 1:, None])[..., 0]
    # the short rows' loss is the mean over the pieces copying predicts, weighted 0.5
    assert float(both) == pytest.approx(float(text_loss + 0.5 * nll[keep].mean()), rel=1e-5)


def _rows_setup() -> tuple[list[np.ndarray], dict, CopyRows, Tensor, Tensor]:
    """Short documents, LMTask arguments, two short rows a batch, and the first (text, rows) batch; seeds torch."""
    rng = np.random.default_rng(4)
    docs = [np.array([2, *rng.integers(10, 50, int(rng.integers(3, 10))), 3]) for _ in range(100)]
    args = dict(context=16, batch_size=4, repeat_share=0.0, vocab=50, seed=0, device=torch.device("cpu"))
    copy = CopyRows(per_batch=2, context=12, lengths=(3, 5), weight=0.5)
    text, short = LMTask(docs, {}, **args, copy=copy).train_batches(0)[0]
    torch.manual_seed(0)
    return docs, args, copy, text, short


def test_short_rows_train_only_the_named_parameters_or_leave_later_attention_patterns_to_the_text() -> None:
    from models.gpt import GPT, GPTConfig

    docs, args, copy, text, short = _rows_setup()
    model = GPT(GPTConfig(vocab_size=50, max_len=16, d_model=16, n_layers=2, n_heads=2, dropout=0.0))

    def grads(batch, train_only=(), fixed_patterns_from=0, below=0) -> tuple[float, dict[str, Tensor]]:
        model.zero_grad()
        rows = dataclasses.replace(copy, train_only=train_only, fixed_patterns_from=fixed_patterns_from,
                                   fixed_patterns_below=below)
        task = LMTask(docs, {}, **args, copy=rows)
        loss = task.loss(model, batch, 0, 0.0)
        loss.backward()
        return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters()}

    text_loss, text_only = grads(text)
    full_loss, full = grads((text, short))
    loss, restricted = grads((text, short), ("embed", "blocks.0"))
    assert loss == pytest.approx(full_loss, rel=1e-6) and loss > text_loss  # the same forward pass and loss
    for name, g in restricted.items():
        if name.startswith(("embed", "blocks.0")):  # the rows' gradient, through block 1 and the final norm
            assert torch.allclose(g, full[name], atol=1e-6) and not torch.allclose(g, text_only[name], atol=1e-6)
        else:  # the text's gradient alone
            assert torch.allclose(g, text_only[name], atol=1e-7), name
    assert not torch.allclose(full["blocks.1.attn.q_proj.weight"], text_only["blocks.1.attn.q_proj.weight"])
    # layers from 1 on with their patterns out of the rows' gradient: their queries and keys learn from the text
    # alone, their values from both, and the layers below no longer get the rows' gradient through those queries
    fixed_loss, fixed = grads((text, short), fixed_patterns_from=1)
    assert fixed_loss == pytest.approx(full_loss, rel=1e-6)
    for name in ("blocks.1.attn.q_proj.weight", "blocks.1.attn.k_proj.weight"):
        assert torch.allclose(fixed[name], text_only[name], atol=1e-7)
    for name in ("blocks.1.attn.v_proj.weight", "blocks.0.attn.q_proj.weight", "blocks.0.ff.up.weight"):
        assert not torch.allclose(fixed[name], text_only[name], atol=1e-6), name
    assert not torch.allclose(fixed["blocks.0.ff.up.weight"], full["blocks.0.ff.up.weight"], atol=1e-6)
    # and the layers below 1 (layer 0): its queries and keys from the text alone, layer 1's from both
    below_loss, below = grads((text, short), below=1)
    assert below_loss == pytest.approx(full_loss, rel=1e-6)
    for name in ("blocks.0.attn.q_proj.weight", "blocks.0.attn.k_proj.weight"):
        assert torch.allclose(below[name], text_only[name], atol=1e-7)
    for name in ("blocks.1.attn.q_proj.weight", "blocks.0.attn.v_proj.weight"):
        assert not torch.allclose(below[name], text_only[name], atol=1e-6), name
    assert not any(h for m in model.modules() for h in m._forward_hooks.values())  # the hooks are gone again


def test_open_heads_keep_their_queries_and_keys_in_the_short_rows_gradient() -> None:
    """--copy-open-heads: in a fixed layer, the named query heads and the key/value heads they read learn from the
    rows as well; the layer's other heads from the text alone; from step --copy-open-from on."""
    from models.gpt import GPT, GPTConfig

    docs, args, copy, text, short = _rows_setup()
    model = GPT(GPTConfig(vocab_size=50, max_len=16, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, dropout=0.0,
                          logit_scale=True))

    def grads(batch, step=0, **rows) -> dict[str, Tensor]:
        model.zero_grad()
        LMTask(docs, {}, **args, copy=dataclasses.replace(copy, **rows)).loss(model, batch, step, 0.0).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    text_only, full = grads(text), grads((text, short))
    fixed = dict(fixed_patterns_from=1, open_heads=((1, 3),), open_from=5)
    opened, before = grads((text, short), 5, **fixed), grads((text, short), 4, **fixed)
    d = model.config.d_head
    for kind, units, open_unit in (("q", 4, 3), ("k", 2, 1)):  # query head 3 reads key/value head 3 // 2 = 1
        name = f"blocks.1.attn.{kind}_proj.weight"
        for u in range(units):
            rows = slice(u * d, (u + 1) * d)
            assert torch.allclose(before[name][rows], text_only[name][rows], atol=1e-7)  # not open yet at step 4
            if u == open_unit:  # the rows' gradient as with nothing fixed (layer 1 is the last)
                assert torch.allclose(opened[name][rows], full[name][rows], atol=1e-6)
                assert not torch.allclose(opened[name][rows], text_only[name][rows], atol=1e-6)
            else:
                assert torch.allclose(opened[name][rows], text_only[name][rows], atol=1e-7), (name, u)
    # the learned logit scales (models/gpt.py logit_scale) likewise: the open head's from both, the rest from the text
    scale = "blocks.1.attn.q_scale.log_scale"
    close = functools.partial(torch.allclose, rtol=1e-4, atol=1e-10)  # small at the start: logits near 0
    assert close(before[scale], text_only[scale]) and close(opened[scale][:3], text_only[scale][:3])
    assert close(opened[scale][3], full[scale][3]) and not close(opened[scale][3], text_only[scale][3])


def test_text_copy_rows_repeat_short_documents_and_weigh_every_target() -> None:
    from models.gpt import GPT, GPTConfig

    rng = np.random.default_rng(2)
    docs = [np.array([2, *rng.integers(10, 50, int(rng.integers(1, 40))), 3]) for _ in range(300)]
    short = {tuple(d.tolist()) for d in docs if 4 <= len(d) - 2 <= 12}
    rows = repeated_text(docs, 40, 63, seed=4, lengths=(4, 12))
    assert rows.shape == (40, 64)
    blocks = 0
    for row in rows.tolist():
        cuts = [i + 1 for i, t in enumerate(row) if t == 3]  # after each </s>
        pieces = [tuple(row[a:b]) for a, b in zip([0, *cuts], cuts, strict=False)]  # whole <s> d </s>
        assert pieces and all(d in short for d in pieces)  # a document of 4-12 pieces, as it is in the text
        runs = [len(list(g)) for _, g in itertools.groupby(pieces)]
        assert all(n in (2, 3) for n in runs[:-1])  # each document two or three times running (the last may be cut)
        blocks += len(runs) - 1
    assert blocks >= 60
    with pytest.raises(ValueError, match="no training document"):
        repeated_text([np.array([2, 11, 3])], 1, 16, seed=0)

    args = dict(context=16, batch_size=8, repeat_share=0.0, vocab=50, seed=0, device=torch.device("cpu"))
    task = LMTask(docs, {}, **args, copy=CopyRows(per_batch=2, context=20, lengths=(4, 8), weight=0.5, source="text"))
    text, rows = task.train_batches(0)[0]
    assert rows.shape == (2, 21) and int(rows[0, 0]) == 2
    warm = LMTask(docs, {}, **args, copy=CopyRows(per_batch=2, context=20, lengths=(4, 8), source="text",
                                                   warmup_steps=1, warmup_batch=3)).train_batches(0)[0]
    assert warm.shape == (3, 21) and not bool((warm == 3).any())  # a warm-up of random spans: no document in it
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, max_len=20, d_model=16, n_layers=1, n_heads=2)).eval()
    with torch.no_grad():
        both, text_loss = task.loss(model, (text, rows), 0, 0.0), task.loss(model, text, 0, 0.0)
        nll = -torch.log_softmax(model(rows[:, :-1]).logits, -1).gather(-1, rows[:, 1:, None])[..., 0]
    # every target counts, the first copy too: it is text
    assert float(both) == pytest.approx(float(text_loss + 0.5 * nll.mean()), rel=1e-5)


def test_a_frozen_head_keeps_its_query_key_and_pattern_while_the_rest_trains(tmp_path: Path) -> None:
    from models.gpt import GPT, GPTConfig
    from models.positional import apply_rope as rotate
    from models.positional import rope_angles

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=120, max_len=128, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, smear_keys=True,
                    qkv_bias=True, logit_scale=True)
    model = GPT(cfg)
    q, k = slice(24, 32), slice(8, 16)  # d_head 8: query head 3's rows, and those of key/value head 1 it reads
    attn = model.blocks[0].attn
    with torch.no_grad():  # head 3 a previous-token head by its biases alone (as in tests/test_gpt.py)
        key = torch.ones(1, 1, 1, 8)
        attn.q_proj.weight[q] = 0
        attn.k_proj.weight[k] = 0
        attn.q_proj.bias[q] = 60 * rotate(key, rope_angles(1, 8, offset=-1), cfg.rope_layout).flatten()
        attn.k_proj.bias[k] = key.flatten()
        attn.smear[1] = 12.0  # its own key, unmixed
    previous = model.head_role_scores(20, range(3))["previous"]
    assert previous[0, 3] > 0.95 and np.delete(previous[0], 3).max() < 0.5  # the scores find that head alone
    before = {name: v.clone() for name, v in model.state_dict().items()}
    HeadFreeze(model, layer=0, head=3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(5):
        x = torch.randint(4, 120, (4, 33))
        loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).logits.reshape(-1, 120), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    now = model.head_role_scores(20, range(3))["previous"]  # a forward pass: the frozen values come back before it
    after = model.state_dict()
    a = "blocks.0.attn."
    for name, frozen, free in (("q_proj.weight", q, slice(0, 24)), ("q_proj.bias", q, slice(0, 24)),
                               ("k_proj.weight", k, slice(0, 8)), ("k_proj.bias", k, slice(0, 8)),
                               ("smear", slice(1, 2), slice(0, 1)), ("q_scale.log_scale", slice(3, 4), slice(0, 3))):
        assert torch.equal(after[a + name][frozen], before[a + name][frozen]), name
        assert not torch.equal(after[a + name][free], before[a + name][free]), name
    assert torch.equal(after["blocks.0.norm1.weight"], before["blocks.0.norm1.weight"])
    for name in ("embed.weight", a + "v_proj.weight", a + "o_proj.weight", "blocks.1.attn.q_proj.weight"):
        assert not torch.equal(after[name], before[name])  # what the head writes, and everything else, trains
    assert now[0, 3] > 0.95

    # --freeze-previous: at its step the task freezes the head with the best previous-token score (and on
    # --resume the same one again, from the file)
    docs = [np.array([2, *torch.randint(4, 120, (12,)).tolist(), 3]) for _ in range(40)]
    model = GPT(cfg)
    with torch.no_grad():
        model.blocks[0].attn.load_state_dict({k[len(a):]: v for k, v in before.items() if k.startswith(a)})
        model.blocks[0].norm1.weight.copy_(before["blocks.0.norm1.weight"])
    for _ in range(2):
        task = LMTask(docs, {}, context=32, batch_size=4, repeat_share=0, vocab=120, seed=0, device=torch.device("cpu"))
        task.freeze_previous_at, task.freeze_previous_file = 3, tmp_path / "frozen_previous_head.json"
        batch = task.train_batches(0)[0]
        task.loss(model, batch, 2, 0.0)
        assert task.frozen_previous is None
        task.loss(model, batch, 3, 0.0)
        assert task.frozen_previous is not None and task.frozen is None
        assert (task.frozen_previous_info["layer"], task.frozen_previous_info["head"]) == (0, 3)
        assert task.frozen_previous_info["previous_token_score"] > 0.95 and task.freeze_previous_file.is_file()


def test_a_warmup_after_text_batches_trains_only_the_named_parameters_on_the_copies() -> None:
    from models.gpt import GPT, GPTConfig

    rng = np.random.default_rng(3)
    docs = [np.array([2, *rng.integers(10, 50, int(rng.integers(3, 10))), 3]) for _ in range(200)]
    args = dict(context=16, batch_size=4, repeat_share=0.0, vocab=50, seed=0, device=torch.device("cpu"))
    copy = CopyRows(per_batch=1, context=12, lengths=(3, 5), warmup_steps=2, warmup_batch=4, warmup_at=3,
                    warmup_only=("blocks.0.attn",))
    task, plain = LMTask(docs, {}, **args, copy=copy), LMTask(docs, {}, **args)
    batches, text = task.train_batches(0), plain.train_batches(0)
    # three text batches alone, the warm-up, then text with a short row each (and so in later epochs)
    assert all(torch.equal(a, b) for a, b in zip(batches[:3], text, strict=False))
    assert [tuple(b.shape) for b in batches[3:5]] == [(4, 13)] * 2
    assert all(torch.equal(a[0], b) and a[1].shape == (1, 13) for a, b in zip(batches[5:], text[3:], strict=True))
    assert all(isinstance(b, tuple) for b in task.train_batches(1))
    syn, total = task.token_counts(7)
    assert (syn, total) == (2 * 4 * 12 + 2 * 12, 5 * 4 * 16 + 2 * 4 * 12 + 2 * 12)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, max_len=16, d_model=16, n_layers=2, n_heads=2))

    def grads(step: int) -> tuple[float, dict[str, float]]:
        model.zero_grad()
        loss = task.loss(model, batches[step], step, 0.0)
        loss.backward()
        named = model.named_parameters()
        return float(loss.detach()), {n: float(p.grad.abs().sum()) for n, p in named if p.grad is not None}

    _, before = grads(2)
    loss, warm = grads(3)
    _, after = grads(5)
    assert all(v > 0 for v in before.values()) and all(v > 0 for v in after.values())  # all train, but in the warm-up
    assert {n for n, v in warm.items() if v > 0} == {n for n in warm if n.startswith("blocks.0.attn.")}
    with torch.no_grad():  # in the warm-up the loss is on the copied pieces alone
        rows = batches[3]
        nll = -torch.log_softmax(model(rows[:, :-1]).logits, -1).gather(-1, rows[:, 1:, None])[..., 0]
    assert loss == pytest.approx(float(nll[copied_targets(rows)].mean()), rel=1e-5)


def test_copied_targets_are_the_repeats_a_copy_predicts() -> None:
    row = torch.tensor([[2, 10, 11, 12, 10, 11, 12, 10, 11, 2, 20, 21, 20, 21, 10]])
    #                   <s> x = 10 11 12, three copies (cut)   <s> y = 20 21, twice; then 10 (after 21, new)
    got = copied_targets(row)[0].tolist()  # target p + 1 predicted from the prefix up to p
    assert got == [False, False, False, False, True, True, True, True,  # 10 (2nd copy's first) is not
                   False, False, False, False, True, False]
    rows = repeated_spans(50, 64, np.full(60, 1 / 56) * (np.arange(60) >= 4), seed=3, lengths=(4, 31))
    keep = copied_targets(rows)
    assert 0.2 < float(keep.float().mean()) < 0.6  # about the repeats' share of a row


def test_perplexity_sums_score_every_piece_after_bos() -> None:
    from models.gpt import GPT, GPTConfig

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
    task = LMTask(tagged, {}, context=2, batch_size=1, repeat_share=0, vocab=200, seed=0,
                  device=torch.device("cpu"), groups=groups)
    orders = []
    for epoch in range(3):
        order = [int(b[0, 1]) - 100 for b in task.train_batches(epoch)]
        assert sorted(order) == list(range(len(docs)))
        runs = [groups[i] for i in order]
        # a group's documents one after another: each group id occurs in one run
        assert len([g for k, g in enumerate(runs) if k == 0 or runs[k - 1] != g]) == len(set(groups))
        orders.append(order)
    assert orders[0] != orders[1] != orders[2]


def test_word_rows_repeat_lists_of_frequent_words_and_join_from_an_epoch() -> None:
    texts = ["The dog and the cat", "the dog ran", "a cat, the dog"]
    assert frequent_words(texts, 3) == ["the", "dog", "and"]  # 4, 3, then 1-1-1 ties alphabetically; "cat," not a word
    words = [np.array([10]), np.array([11, 12]), np.array([13, 14, 15])]  # one word's pieces each
    rows = repeated_words(words, 30, 40, seed=1, lengths=(4, 9))
    assert rows.shape == (30, 41) and bool(rows[:, 0].eq(2).all())
    for row in rows.tolist():
        block = row[1 : row.index(2, 1)] if 2 in row[1:] else None
        if block is None:
            continue
        for k in (3, 2):
            span = block[: len(block) // k]
            if len(block) % k == 0 and span * k == block:
                break
        else:
            raise AssertionError(block)
        i, pieces = 0, [w.tolist() for w in words]
        while i < len(span):  # the span is whole words, 4-9 pieces or one word past 4
            w = next(p for p in pieces if span[i : i + len(p)] == p)
            i += len(w)
        assert 4 <= len(span) <= 9 + 2
    docs = [np.array([2, 20 + i % 7, 21, 3]) for i in range(300)]
    late = CopyRows(per_batch=2, context=12, lengths=(4, 6), source="words", from_epoch=2)
    task = LMTask(docs, {}, context=16, batch_size=4, repeat_share=0, vocab=40, seed=0, device=torch.device("cpu"),
                  copy=late, words=words)
    first, second = task.train_batches(0), task.train_batches(1)
    assert all(isinstance(b, torch.Tensor) for b in first) and all(isinstance(b, tuple) for b in second)
    assert all(b[1].shape == (2, 13) and set(b[1].flatten().tolist()) <= {2, 10, 11, 12, 13, 14, 15} for b in second)
    syn, total = task.token_counts(len(first) + 3)
    assert syn == 3 * 2 * 12 and total == (len(first) + 3) * 4 * 16 + 3 * 2 * 12


def test_read_documents(tmp_path: Path) -> None:
    (tmp_path / "a.tsv").write_text("sentence\tlabel\nfirst one\t1\n\nsecond\t0\n")
    (tmp_path / "b.txt").write_text("one doc\n  \nanother doc\n")
    assert read_documents(tmp_path / "a.tsv") == ["first one", "second"]
    assert read_documents(tmp_path / "b.txt") == ["one doc", "another doc"]


def test_lm_heads_bench_measures_a_model(tiny_checkpoints: Path, capsys) -> None:
    """bench/lm_heads.py on the tiny random decoder: the copy test runs its trials and the scores are
    attention averages (a random model copies nothing and has no strong heads)."""
    spec = importlib.util.spec_from_file_location("lm_heads", ROOT / "bench" / "lm_heads.py")
    heads = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(heads)
    assert heads.main(["--checkpoint", str(tiny_checkpoints / "gpt-tiny"), "--trials", "3", "--n", "20"]) == 0
    report = __import__("json").loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["trials"] == 3 and 0 <= report["copy_rate"] <= 1
    assert 0 < report["induction_max"] < 0.5 and 0 < report["previous_token_max"] < 0.8
    assert len(set(heads.COPY_WORDS)) == len(heads.COPY_WORDS) >= 100


def test_induction_probe_reports_each_measurement(capsys) -> None:
    import json

    spec = importlib.util.spec_from_file_location("induction_probe", ROOT / "bench" / "induction_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    assert probe.main(["--steps", "3", "--every", "2", "--vocab", "64", "--d-model", "32", "--layers", "2",
                       "--heads", "2", "--kv-heads", "1", "--n", "20", "--seeds", "2", "--tokens-per-step", "128",
                       "--context", "16", "--spans", "2", "5"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [r["step"] for r in lines] == [0, 2] and [r["tokens"] for r in lines] == [128, 384]
    # an untrained model: attention about uniform over the ~20-40 keys, no head near a role
    assert all(0 < r["induction"] < 0.3 and 0 < r["previous_token"] < 0.3 for r in lines)
    assert lines[0]["loss"] == pytest.approx(math.log(64), abs=0.3)


@pytest.mark.parametrize("heads", [["3.9"], ["4.0"], ["three"], ["0.7"]])
def test_open_heads_outside_the_fixed_layers_are_refused(heads: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from train import lm

    with pytest.raises(SystemExit):  # layer 0 is not fixed: its patterns learn from the rows anyway
        lm.main(["--layers", "4", "--heads", "8", "--copy-fixed-patterns", "1", "--copy-open-heads", *heads])
    assert "--copy-open-heads" in capsys.readouterr().err
