"""Translator: fused vs explicit, greedy vs beam 1, cached batched beam search vs a naive reference."""

from __future__ import annotations

import pytest
import torch

from models.families.translator import Translator, TranslatorConfig

EOS = 2
torch.set_num_threads(1)  # tiny tensors on 2 shared cores: threads only add overhead


def make_model(seed: int = 0, d: int = 32, heads: int = 4, layers: int = 2, vocab: int = 40,
               tie: bool = False, norm_first: bool = True, eos_bias: float = 0.0) -> Translator:
    torch.manual_seed(seed)
    cfg = TranslatorConfig(vocab_size=vocab, d_model=d, n_heads=heads, n_enc_layers=layers,
                           n_dec_layers=layers, d_ff=2 * d, dropout=0.0, tie_embeddings=tie,
                           norm_first=norm_first, max_len=64)
    model = Translator(cfg).eval()
    if eos_bias and norm_first and not tie:
        # random models rarely stop: point the final LayerNorm's bias and the </s> output row the same
        # way, so </s> gets likelier (by a hypothesis-dependent amount) and finishing is exercised
        with torch.no_grad():
            v = torch.randn(d)
            v /= v.norm()
            model.dec_norm.bias.copy_(v)
            model.generator.weight[EOS] += eos_bias * v
    return model


@torch.no_grad()
def naive_beam_search(model: Translator, src: torch.Tensor, k: int, max_len: int,
                      length_penalty: float = 1.0, min_len: int = 0) -> tuple[list[int], float, list]:
    """The tutorial version: one hypothesis at a time, re-decoding its whole prefix every step, same
    selection rule as Translator.beam_search (2K best continuations; eos in the first K ranks finishes;
    K live beams; stop at K finished or max_len)."""
    c = model.config
    memory, mask, _ = model.encode(src)
    beams: list[tuple[list[int], torch.Tensor]] = [([], torch.tensor(0.0))]
    finals: list[tuple[list[int], float]] = []
    for t in range(max_len):
        cands = []
        for b, (toks, score) in enumerate(beams):
            logits = model.decode(torch.tensor([[c.bos_id, *toks]]), memory, mask)[0][0, -1]
            logp = torch.log_softmax(logits.float(), -1)
            if t < min_len:
                logp[c.eos_id] = float("-inf")
            for tok, s in enumerate((score + logp).tolist()):
                cands.append((s, b, tok))
        cands.sort(key=lambda x: -x[0])
        new: list[tuple[list[int], torch.Tensor]] = []
        for rank, (s, b, tok) in enumerate(cands[: 2 * k]):
            if tok == c.eos_id:
                if rank < k:
                    finals.append((beams[b][0] + [tok], s))
                continue
            new.append((beams[b][0] + [tok], torch.tensor(s)))
            if len(new) == k:
                break
        beams = new
        if len(finals) >= k:
            break
    else:
        finals += [(toks, float(s)) for toks, s in beams]
    normed = [s / len(h) ** length_penalty for h, s in finals]
    best = max(range(len(finals)), key=lambda j: normed[j])
    return finals[best][0], normed[best], [(h, n) for (h, _), n in zip(finals, normed)]


@pytest.mark.parametrize("norm_first", [True, False])
def test_explicit_equals_fused(norm_first: bool) -> None:
    model = make_model(norm_first=norm_first, tie=True)
    src = torch.tensor([[1, 5, 6, 7, 8, 2], [1, 9, 10, 2, 0, 0]])
    tgt = torch.tensor([[1, 11, 12, 13], [1, 14, 2, 0]])
    fused = model(src, tgt)
    explicit, attn = model.forward_with_attention(src, tgt)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=0)
    attn = {k: w.detach() for k, w in attn.items()}
    assert attn["encoder"].shape == (2, 2, 4, 6, 6)
    assert attn["decoder"].shape == (2, 2, 4, 4, 4)
    assert attn["cross"].shape == (2, 2, 4, 4, 6)
    for w in attn.values():
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
    assert float(attn["cross"][1, ..., 4:].abs().max()) == 0.0  # padded source keys
    assert float(attn["decoder"].triu(1).abs().max()) == 0.0  # causal


def test_tied_embeddings_share_one_matrix() -> None:
    model = make_model(tie=True)
    assert model.generator.weight is model.src_embed.weight is model.tgt_embed.weight
    untied = make_model(tie=False)
    assert untied.generator.weight is not untied.tgt_embed.weight


@pytest.mark.parametrize("seed,bias", [(0, 0.8), (4, 0.8), (7, 0.5), (3, 1.2)])
def test_beam_size_one_equals_greedy(seed: int, bias: float) -> None:
    model = make_model(seed, eos_bias=bias)  # these finish at mixed lengths, some hit max_len
    torch.manual_seed(seed)
    src = torch.randint(3, 40, (3, 6))
    greedy = model.greedy(src, max_len=15)
    beam = model.beam_search(src, beam_size=1, max_len=15)
    for g, b in zip(greedy, beam):
        assert g.tokens == b.tokens
        assert abs(g.score - b.score) < 1e-4


CASES = [  # (seed, d_model, heads, layers, beam, length_penalty, source length, eos bias, pre-norm)
    (0, 32, 4, 1, 3, 1.0, 5, 1.5, True),
    (1, 32, 2, 2, 4, 0.6, 8, 2.0, True),
    (2, 48, 4, 2, 5, 1.0, 11, 2.5, True),
    (3, 64, 8, 3, 2, 0.0, 4, 1.5, True),
    (4, 32, 4, 2, 5, 1.0, 7, 0.0, True),
    (5, 32, 4, 2, 4, 1.0, 6, 0.0, False),
]


@pytest.mark.parametrize("case", CASES)
def test_cached_beam_search_equals_naive_reference(case: tuple) -> None:
    seed, d, heads, layers, k, lp, s, bias, norm_first = case
    model = make_model(seed, d, heads, layers, norm_first=norm_first, eos_bias=bias)
    src = torch.cat([torch.tensor([[1]]), torch.randint(3, 40, (1, s - 2)), torch.tensor([[2]])], 1)
    out = model.beam_search(src, beam_size=k, max_len=12, length_penalty=lp)[0]
    ref_tokens, ref_score, ref_hyps = naive_beam_search(model, src, k, 12, lp)
    assert out.tokens == ref_tokens
    assert abs(out.score - ref_score) < 1e-4
    assert [h for h, _ in out.hypotheses] == [h for h, _ in ref_hyps]
    for (_, a), (_, b) in zip(out.hypotheses, ref_hyps):
        assert abs(a - b) < 1e-4


def test_batched_sources_with_padding_equal_one_by_one() -> None:
    model = make_model(0, eos_bias=0.8)
    a, b = [1, 5, 9, 13, 17, 21, 2], [1, 8, 30, 2]
    src = torch.tensor([a, b + [0] * (len(a) - len(b))])
    batched = model.beam_search(src, beam_size=3, max_len=10)
    for out, ids in zip(batched, (a, b)):
        ref_tokens, ref_score, _ = naive_beam_search(model, torch.tensor([ids]), 3, 10)
        assert out.tokens == ref_tokens and abs(out.score - ref_score) < 1e-4


def test_min_len_forces_length() -> None:
    model = make_model(6, eos_bias=5.0)
    src = torch.tensor([[1, 5, 6, 2]])
    out = model.beam_search(src, beam_size=3, max_len=9, min_len=9)[0]
    assert len(out.tokens) == 9 and EOS not in out.tokens
    ref_tokens, ref_score, _ = naive_beam_search(model, src, 3, 9, min_len=9)
    assert out.tokens == ref_tokens and abs(out.score - ref_score) < 1e-4


def test_beam_tree_is_consistent() -> None:
    model = make_model(0, eos_bias=0.8)  # finishes at step 6, with finished siblings on the way
    out = model.beam_search(torch.tensor([[1, 4, 5, 6, 2]]), beam_size=4, max_len=12)[0]
    assert out.steps[0]["parents"] == [-1] * len(out.steps[0]["tokens"])
    for prev, step in zip(out.steps, out.steps[1:]):
        for p in step["parents"]:
            assert 0 <= p < len(prev["tokens"]) and not prev["finished"][p]
    # the chosen path spells out the chosen hypothesis
    assert [out.steps[t]["tokens"][i] for t, i in enumerate(out.chosen)] == out.tokens
    for t in range(1, len(out.chosen)):
        assert out.steps[t]["parents"][out.chosen[t]] == out.chosen[t - 1]


def test_translate_with_ids_returns_attention_and_tree() -> None:
    model = make_model(0, eos_bias=1.0)
    res = model.translate([1, 7, 8, 9, 2], beam_size=3, max_len=10)
    s, t = len(res.source_tokens), len(res.target_tokens)
    assert res.source_tokens == ["1", "7", "8", "9", "2"] and res.target_tokens[0] == "1"
    assert res.attention["encoder"].weights.shape == (2, 4, s, s)
    assert res.attention["decoder"].weights.shape == (2, 4, t, t)
    assert res.attention["cross"].weights.shape == (2, 4, t, s)
    for m in res.attention.values():
        assert abs(m.weights.sum(-1) - 1).max() < 1e-5
    assert len(res.chosen) <= len(res.beam) and res.beam[0].parents[0] == -1
    greedy = model.translate([1, 7, 8, 9, 2], beam_size=1, max_len=10)
    assert len(greedy.beam) == len(greedy.chosen) and all(len(b.tokens) == 1 for b in greedy.beam)
