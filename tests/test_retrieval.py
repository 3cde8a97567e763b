"""models/inspect/retrieval.py: retrieval heads (Wu et al. 2024) on tiny models. The score's definition on hand-made
argmax keys; the argmax of the answer's rows from the long-context store against the full attention map of
``model(ids, need_weights=True)`` and the score against a plain loop; a planted copying head through the store's
interface (the row that emits a token is the one read); the haystack builder's spans, depths and refusals over a
SentencePiece and a byte-level BPE tokenizer (with SmolLM2's chat template); the ablation loop against plain
forward passes with the same head mask."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import models.decoding.ondevice as od
from models.families.gpt import GPT, GPTConfig
from models.inspect import retrieval as R

# SmolLM2-135M-Instruct's tokenizer.chat_template (its GGUF file's)
SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _hay(ids: list[int], span: tuple[int, int], answer: tuple[int, int] | None = None) -> R.Haystack:
    return R.Haystack(ids=list(ids), text="", needle_span=span, answer_span=answer or span,
                      context_span=(0, len(ids)), length=len(ids), depth=0.5, at=0.5, needle="", question="",
                      answer="never said", chat=False, seed=0)


# ------------------------------------------------------------------------------------------- the definition
def test_score_on_hand_made_argmax_keys() -> None:
    """Eq. 1: a hit needs the most attended key inside the needle span and holding the emitted token."""
    prompt = [1, 5, 6, 7, 8, 9, 5, 6, 3]  # needle 5 6 7 8 9 at 1…5; the question repeats 5 6 at 6, 7
    span = (1, 6)
    generated = [5, 6, 7, 8, 9, 2]
    keys = np.array([[
        [1, 2, 3, 4, 5, 0],  # copies every needle token: 1
        [6, 7, 3, 0, 0, 0],  # 5 and 6 from the question's copy (outside the span), 7 from the needle: 1/5
        [2, 3, 4, 5, 1, 0],  # inside the span, always the wrong token: 0
        [1, 1, 1, 1, 1, 1],  # position 1 (token 5) when 5 is emitted only: 1/5
        [0, 0, 0, 0, 0, 8],  # never in the span: 0
    ]])
    np.testing.assert_allclose(R.retrieval_score(keys, generated, prompt, span), [[1.0, 0.2, 0.0, 0.2, 0.0]])
    np.testing.assert_allclose(R.retrieval_score(keys, generated, prompt, span, per_step=True),
                               [[1.0, 0.2, 0.0, 0.2, 0.0]])
    # a position copied twice counts once (a set, eq. 1); the released code's count adds each step
    twice = np.array([[[1, 1, 2]]])
    assert R.retrieval_score(twice, [5, 5, 6], prompt, span)[0, 0] == pytest.approx(2 / 5)
    assert R.retrieval_score(twice, [5, 5, 6], prompt, span, per_step=True)[0, 0] == pytest.approx(3 / 5)
    # the span's own edges: its last position counts, the one after it does not
    assert R.retrieval_score(np.array([[[5], [6]]]), [9], prompt, span)[0].tolist() == [0.2, 0.0]
    with pytest.raises(ValueError, match="steps"):
        R.retrieval_score(keys[:, :, :3], generated, prompt, span)
    with pytest.raises(ValueError, match="not inside the prompt"):
        R.retrieval_score(keys, generated, prompt, (4, 20))


def test_answer_rows_are_the_rows_that_emit_the_tokens() -> None:
    assert R.answer_rows(10, 13) == [9, 10, 11]  # tokens 10, 11, 12 are emitted by rows 9, 10, 11
    assert R.answer_rows(10, 10) == []


def test_ranking_orders_by_score_then_position() -> None:
    scores = np.array([[0.0, 0.5], [0.5, 1.0]])
    assert R.ranking(scores) == [(1, 1, 1.0), (0, 1, 0.5), (1, 0, 0.5), (0, 0, 0.0)]
    assert R.describe_heads(R.ranking(scores)[:2]) == "L1H1 1.00, L0H1 0.50"


# --------------------------------------------------------------------------------- through the store, exact
def _sharp(**kw) -> GPT:
    """A tiny random decoder whose attention is sharp (queries and keys scaled up), so each row has one clear
    argmax, over a small vocabulary, so the answer's tokens occur in the prompt."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, max_len=128, d_model=32, n_layers=3, n_heads=4, **kw)).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.q_proj.weight.mul_(12.0)
            block.attn.k_proj.weight.mul_(12.0)
    return model


@pytest.mark.parametrize("kw", [dict(n_kv_heads=2, qkv_bias=True), dict(sliding_window=16)],
                         ids=["gqa-bias", "window"])
def test_store_argmax_and_score_equal_the_full_map(kw: dict) -> None:
    model = _sharp(**kw)
    rng = np.random.default_rng(1)
    ids = [1, *rng.integers(3, 16, size=59).tolist()]
    hay = _hay(ids, (20, 40))
    got = R.run(model, hay, od.generate, max_new_tokens=12)
    full_ids = got.generation.ids
    p, t = len(ids), len(full_ids)
    with torch.no_grad():
        weights = model(torch.tensor([full_ids]), need_weights=True).attention  # per layer (1, H, T, T)
    rows = list(range(p - 1, t - 1))
    want = np.stack([w[0, :, rows].argmax(-1).numpy() for w in weights])  # (L, H, S)
    top2 = np.sort(np.stack([w[0, :, rows].numpy() for w in weights]), -1)[..., -2:]
    assert (top2[..., 1] - top2[..., 0]).min() > 1e-4  # each argmax is clear, not a near tie
    np.testing.assert_array_equal(got.keys, want)
    for span in [(20, 40), (1, p), (0, 5)]:  # the needle, the whole prompt, a span at the start
        ref = np.zeros(want.shape[:2])
        for layer in range(want.shape[0]):
            for head in range(want.shape[1]):
                copied = set()
                for s, token in enumerate(full_ids[p:]):
                    j = int(want[layer, head, s])
                    if span[0] <= j < span[1] and ids[j] == token:
                        copied.add(j)
                ref[layer, head] = len(copied) / (span[1] - span[0])
        np.testing.assert_allclose(R.score(_hay(ids, span), got.generation).scores, ref)
    assert R.score(_hay(ids, (1, p)), got.generation).scores.max() > 0  # the check saw copies, not only zeros
    assert got.generated == full_ids[p:] and got.length == p


class _Planted:
    """A store's interface (``q``, ``length``, ``_scores``) whose scores are planted: head 0 of layer 1 attends,
    from the row emitting each answer token, to the needle position holding it; head 1 does the same one row late
    (the row after, which emits the next token); head 2 attends to the question's copy outside the needle."""

    def __init__(self, ids: list[int], p: int, needle: tuple[int, int], question: int) -> None:
        t = len(ids)
        self.length, self.q = t, [torch.zeros(3, t, 1) for _ in range(2)]
        self.planted = torch.zeros(2, 3, t, t)
        for pos in range(p, t):
            j = next(i for i in range(*needle) if ids[i] == ids[pos])
            self.planted[1, 0, pos - 1, j] = 10.0
            if pos < t - 1:
                self.planted[1, 1, pos, j] = 10.0
            self.planted[1, 2, pos - 1, question + (j - needle[0])] = 10.0

    def _scores(self, layer: int, rows: torch.Tensor, cols: slice, heads: slice = slice(None)) -> torch.Tensor:
        return self.planted[layer][heads][:, rows, cols].clone()


def test_a_planted_copying_head_scores_one_and_the_others_zero() -> None:
    needle = [7, 8, 9, 10]
    prompt = [1, 3, 3, *needle, 3, 3, *needle, 4]  # the needle at 3…6, the question's copy at 9…12
    ids = prompt + needle  # the answer copies the needle
    gen = SimpleNamespace(ids=ids, prompt_len=len(prompt), text="", attention=_Planted(ids, len(prompt), (3, 7), 9))
    scores = R.score(_hay(prompt, (3, 7)), gen).scores
    assert scores[1].tolist() == [1.0, 0.0, 0.0]
    assert scores[0].tolist() == [0.0, 0.0, 0.0]  # flat rows: the first key (BOS), never the needle


def test_a_cut_prompt_is_refused() -> None:
    gen = SimpleNamespace(ids=[1, 2, 3, 4], prompt_len=3, text="", attention=None)
    with pytest.raises(ValueError, match="not the haystack's"):
        R.score(_hay([1, 2, 3, 4, 5], (1, 3)), gen)
    model = _sharp()
    with pytest.raises(ValueError, match="exceed the model's context"):
        R.fits(model, _hay(list(range(120)), (1, 3)), 20)


# ------------------------------------------------------------------------------------------------ haystack
@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory: pytest.TempPathFactory):
    import sentencepiece as spm

    from models.inputs.tokenizer import SentencePieceTokenizer

    folder = tmp_path_factory.mktemp("spm")
    lines = [*R.corpus_sentences(), R.NEEDLE, R.QUESTION, R.PROMPT]
    (folder / "corpus.txt").write_text("\n".join(lines), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(folder / "corpus.txt"), model_prefix=str(folder / "sp"), vocab_size=400,
                                   model_type="unigram", pad_id=0, bos_id=1, eos_id=2, unk_id=3,
                                   character_coverage=1.0, minloglevel=2)
    return SentencePieceTokenizer(folder / "sp.model", max_tokens=1 << 20)


@pytest.fixture(scope="module")
def byte_level():
    """A byte-level BPE with SmolLM2's specials, as a model with SmolLM2's chat template."""
    from tokenizers import ByteLevelBPETokenizer

    from models.inputs.tokenizer import JsonTokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([*R.corpus_sentences(), R.NEEDLE, R.QUESTION, R.PROMPT], vocab_size=600,
                            min_frequency=2, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok = JsonTokenizer(None, tokenizer=bpe._tokenizer, max_tokens=1 << 20)
    tok.bos_id, tok.eos_id, tok.adds_bos = 1, 2, False
    return SimpleNamespace(tokenizer=tok, chat_template=SMOL_TEMPLATE)


@pytest.mark.parametrize("which", ["sentencepiece", "byte_level"])
@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
def test_the_needle_span_decodes_to_the_needle(which: str, depth: float, request: pytest.FixtureRequest) -> None:
    source = request.getfixturevalue(which)
    tok = getattr(source, "tokenizer", source)
    hay = R.haystack(source, 900, depth, seed=3)
    assert 850 <= len(hay.ids) <= 900
    assert tok.decode(hay.needle_ids).strip() == R.NEEDLE
    assert tok.decode(hay.answer_ids).strip() == R.ANSWER
    assert hay.needle_span[0] <= hay.answer_span[0] < hay.answer_span[1] <= hay.needle_span[1]
    assert hay.context_span[0] <= hay.needle_span[0] < hay.needle_span[1] <= hay.context_span[1]
    assert hay.chat == (which == "byte_level")
    assert tok.encode_prompt(hay.text)[0] == hay.ids
    if depth == 0.0:  # first in the haystack, right after "<book>"
        assert hay.needle_span[0] == hay.context_span[0] and hay.at == 0.0
    elif depth == 1.0:  # last, right before "</book>"
        assert hay.needle_span[1] == hay.context_span[1]
    else:
        assert abs(hay.at - depth) < 0.05
    if which == "byte_level":
        assert hay.text.startswith("<|im_start|>system\n") and hay.text.endswith("<|im_start|>assistant\n")
    assert f"Question: {R.QUESTION}\nAnswer:" in hay.text


def test_the_haystack_is_seeded(sentencepiece) -> None:
    a, b = R.haystack(sentencepiece, 600, 0.5, seed=1), R.haystack(sentencepiece, 600, 0.5, seed=1)
    assert a.ids == b.ids and a.needle_span == b.needle_span
    assert R.haystack(sentencepiece, 600, 0.5, seed=2).ids != a.ids
    long = R.haystack(sentencepiece, 12_000, 0.5)  # longer than the corpus: its sentences repeat, reshuffled
    assert 11_500 <= len(long.ids) <= 12_000
    assert sentencepiece.decode(long.needle_ids).strip() == R.NEEDLE


def test_a_needle_of_ones_own(byte_level) -> None:
    needle = "The best thing to do in Ghent is to eat waffles on the castle wall."
    hay = R.haystack(byte_level, 500, 0.7, needle, "What is the best thing to do in Ghent?",
                     answer="eat waffles on the castle wall")
    assert byte_level.tokenizer.decode(hay.answer_ids).strip() == "eat waffles on the castle wall"
    plain = R.haystack(byte_level, 500, 0.7, needle, "What is it?", chat=False)
    assert not plain.chat and plain.answer == needle.rstrip(".") and plain.text.startswith("<book>\n")


def test_bad_inputs_are_refused(sentencepiece, byte_level) -> None:
    for depth in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="depth must be"):
            R.haystack(sentencepiece, 500, depth)
    with pytest.raises(ValueError, match="shorter than the needle and the question"):
        R.haystack(sentencepiece, 20, 0.5)
    with pytest.raises(ValueError, match="not a part of the needle"):
        R.haystack(sentencepiece, 500, 0.5, answer="plum-1234")
    with pytest.raises(ValueError, match="must not be empty"):
        R.haystack(sentencepiece, 500, 0.5, needle="  ")
    with pytest.raises(ValueError, match="no chat template"):
        R.haystack(sentencepiece, 500, 0.5, chat=True)
    with pytest.raises(ValueError, match="already holds the answer"):
        R.haystack(byte_level, 500, 0.5, corpus=["The password is tangerine-4817 today.", "A cat sat."])
    with pytest.raises(ValueError, match="gives the answer"):
        R.haystack(sentencepiece, 500, 0.5, question="Is it tangerine-4817?")
    with pytest.raises(ValueError, match="a language model with a tokenizer"):
        R.haystack(object(), 500, 0.5)
    with pytest.raises(ValueError, match="has no tokenizer"):
        R.haystack(_sharp(), 500, 0.5)


def test_found_reads_the_fact_case_and_spacing_aside() -> None:
    assert R.found_in("The password is  TANGERINE-4817.", "tangerine-4817")
    assert not R.found_in("The password is 4817.", "tangerine-4817")
    assert R.recall("The password is 4817.", "tangerine-4817") == 0.5
    assert R.recall("Tangerine-4817!", "tangerine-4817") == 1.0 and R.recall("no", "tangerine-4817") == 0.0


# ------------------------------------------------------------------------------------------------ ablation
def _plain_greedy(model: GPT, ids: list[int], n: int, mask: torch.Tensor | None) -> list[int]:
    """Greedy decoding by whole forward passes (no cache), ``mask`` over every position."""
    out = list(ids)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([out]), head_mask=mask).logits[0, -1]
            out.append(int(logits.argmax()))
            if out[-1] == model.eos_id():
                break
    return out[len(ids):]


def test_the_ablation_loop_equals_plain_forward_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _sharp(n_kv_heads=2)
    ids = [1, *np.random.default_rng(2).integers(3, 16, size=40).tolist()]
    monkeypatch.setattr(R, "PREFILL_CHUNK", 7)  # the prompt in several chunks
    caches = R.prefill_caches(model, ids[:-1])
    assert caches[0].length == len(ids) - 1
    whole = R.prefill_caches(model, ids[:-1], chunk=100)
    torch.testing.assert_close(caches[2].k, whole[2].k, atol=1e-5, rtol=1e-5)
    assert R.greedy(model, ids, 10) == model.generate(ids, max_new_tokens=10).ids[len(ids):]
    heads = [(0, 1), (2, 3)]
    mask = R.head_mask(model, heads)
    assert mask.sum() == 12 - 2 and mask[0, 1] == 0 and mask[2, 3] == 0
    assert R.greedy(model, ids, 10, heads, mask_prompt=True) == _plain_greedy(model, ids, 10, mask)
    # the released code's way: the prompt's cache with every head on, the heads off from the last prompt token on
    again = R.decode(model, caches, ids[-1], 10, mask)
    assert again == R.greedy(model, ids, 10, heads)
    assert caches[0].length == len(ids) - 1  # the shared caches are left as they were
    with pytest.raises(ValueError, match="not one of the model's"):
        R.head_mask(model, [(3, 0)])


def test_random_heads_avoid_the_retrieval_heads() -> None:
    scores = np.zeros((4, 5))
    scores[0, :3] = [0.9, 0.5, 0.3]
    scores[2, 4] = 0.2
    picks = R.random_heads(scores, 3, seed=0)
    assert len(set(picks)) == 3 and not set(picks) & {(0, 0), (0, 1), (0, 2), (2, 4)}
    assert picks == R.random_heads(scores, 3, seed=0) and picks != R.random_heads(scores, 3, seed=1)
    assert len(R.random_heads(scores, 10, seed=0)) == 10
    with pytest.raises(ValueError, match="do not exist"):
        R.random_heads(scores, 15)


def test_ablation_answers_each_k() -> None:
    model = _sharp()
    ids = [1, *np.random.default_rng(3).integers(3, 16, size=30).tolist()]
    hay = _hay(ids, (5, 15))
    scores = np.arange(12, dtype=float).reshape(3, 4) / 12
    out = R.ablation(model, hay, scores, ks=(1, 3), max_new_tokens=6)
    assert out.baseline.heads == [] and out.baseline.generated == R.greedy(model, ids, 6)
    assert out.top[1].heads == [(2, 3)] and out.top[3].heads == [(2, 1), (2, 2), (2, 3)]
    assert out.top[3].generated == R.greedy(model, ids, 6, [(2, 1), (2, 2), (2, 3)])
    assert len(out.random[3].heads) == 3 and not set(out.random[3].heads) & set(out.top[3].heads)
    summary = out.summary()
    assert set(summary) == {"baseline", "top", "random"} and summary["top"]["3"]["heads"] == [[2, 1], [2, 2], [2, 3]]
    with pytest.raises(ValueError, match="scores must be"):
        R.ablation(model, hay, np.zeros((2, 2)))
    with pytest.raises(ValueError, match="k must be"):
        R.ablation(model, hay, scores, ks=(13,))


def test_average_keeps_the_runs_that_found_the_needle() -> None:
    def one(value: float, found: bool) -> R.Retrieval:
        return R.Retrieval(np.full((1, 2), value), "", found, float(found), (0, 1), (0, 1), 10, 0.5, 0.5, [],
                           np.zeros((1, 2, 0)))

    got = R.average([one(1.0, True), one(0.0, False), one(0.5, True)])
    assert got.averaged_over == "found" and got.used == 2 and got.scores.tolist() == [[0.75, 0.75]]
    none = R.average([one(1.0, False), one(0.0, False)])
    assert none.averaged_over == "all" and none.used == 2 and none.scores.tolist() == [[0.5, 0.5]]
    assert R.average([one(1.0, True), one(0.0, False)], found_only=False).used == 2


def test_survey_runs_each_length_and_depth(sentencepiece) -> None:
    """The whole path on a tiny decoder reading the SentencePiece haystacks: one run per length × depth, each
    prompt whole in the store, the spans the haystack's, the mean over them."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=sentencepiece.vocab_size, max_len=256, d_model=32, n_layers=2, n_heads=4),
                tokenizer=sentencepiece).eval()
    seen = []
    got = R.survey(model, od.generate, [120, 200], [0.0, 1.0], max_new_tokens=4, progress=seen.append)
    assert [(r.length <= 120, r.depth) for r in got.runs] == [(True, 0.0), (True, 1.0), (False, 0.0), (False, 1.0)]
    assert seen == got.runs and all(r.generation is None for r in got.runs)
    assert got.scores.shape == (2, 4) and got.averaged_over == "all" and got.used == 4  # random weights find nothing
    for r in got.runs:
        hay = R.haystack(model, 120 if r.length <= 120 else 200, r.depth)
        assert r.answer_span == hay.answer_span and r.needle_span == hay.needle_span
        assert r.keys.shape == (2, 4, len(r.generated)) and not r.found


def test_the_heads_tab_and_lesson_4_read_the_survey(tiny_checkpoints, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Heads tab's retrieval section: gpt-tiny's grid is the mean of one needle run per depth made here
    directly (none finds the password, so every run counts), its ranking the same heads; what is no decoder the store
    computes is refused in words. Lesson 4 step 4's right head is the best of its needle's own scores."""
    from serving import catalogue, store
    from tabs import heads
    from tabs.common import Error, get_model
    from tabs.course import induction

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    quiet = lambda *a, **k: None  # noqa: E731 (gr.Progress's place)
    note, grid, ranked = heads.retrieval_heads("gpt-tiny", 256, progress=quiet)
    net = get_model("gpt-tiny")
    length = min(256, net.context_limit() - heads.RETRIEVAL_NEW - 8)
    assert length < 512  # the tiny model's 128 positions: the short needle
    runs = [R.run(net, R.haystack(net, length, d, **R.SHORT), od.generate, heads.RETRIEVAL_NEW)
            for d in heads.RETRIEVAL_DEPTHS]
    want = np.mean([r.scores for r in runs], axis=0)
    assert not any(r.found for r in runs) and "averaged over every run" in note
    np.testing.assert_allclose(np.array(grid["data"][0]["z"], dtype=np.float64), want, atol=1e-6)
    best = R.ranking(want)[0]
    assert ranked["data"][0]["y"][0] == f"L{best[0]} H{best[1]}"
    refused = [("gpt-tiny", 300, "Choose a haystack length"), ("no-such", 256, "Unknown model"),
               ("vit-fashion", 256, "not a language model"), ("mamba-tiny", 256, "long-context store")]
    for model, length, said in refused:
        with pytest.raises(Error, match=said):
            heads.retrieval_heads(model, length, progress=quiet)

    q = induction.l4_retrieval("3", "gpt-tiny")
    hay, found = induction._needle("gpt-tiny", 3)
    assert hay.needle == R.SHORT["needle"] and len(hay.ids) + induction.NEEDLE_NEW <= net.context_limit()
    if q.answer.startswith("layer "):
        layer, head = (int(v) for v in q.answer.replace("layer ", "").split(" head "))
        assert found.scores[layer, head] == found.scores.max() > 0
    else:  # no head stands out by the lesson's margin
        assert found.scores.max() - np.sort(found.scores, axis=None)[-3] < induction.MARGIN
