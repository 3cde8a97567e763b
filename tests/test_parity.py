"""Every Hugging Face model_type the registry reads, against transformers on random weights (issue 59, item 5).

Parametrised over ``models.registry.hf_types()``, in the manner of transformers' model testers: each model_type's
folders (tests/parity_folders.py, written by transformers itself) are read by ``models.load`` and compared with
transformers by the comparison of their kind, within 1e-4:

- decoders: the logits and every layer's attention, and greedy generation gives transformers' ids;
- Mamba (no attention): the logits, every block's hidden state, greedy ids and the next-token probabilities;
- hybrids (Qwen3-Next): the logits, every hidden state, every softmax layer's attention, greedy ids;
- classifiers: the tokens the tokenizer gives, the class probabilities and every layer's attention; a padded batch
  answers as each text alone;
- translators: the source ids, greedy and beam-5 output identical to ``generate`` (length limits that cut some
  searches, length penalties 1 and 0) and the text decoded as transformers decodes it, then the encoder, decoder and
  cross-attention of the chosen output;
- vision: the pixels from each side's own preprocessing, the class probabilities, and every layer's attention (ViT,
  DeiT) or every block's window attention with transformers' window and shift (Swin);
- vision-language (LLaVA, Idefics3, Qwen2.5-VL): for a wide and a tall image, the tower's pixels, the prompt's ids
  and image positions, greedy ids, every layer's attention of the language model and of the tower
  (tests/vlm_parity.py).

A registered model_type without a folder FAILS here by name ("no random-weight folder to check model_type X"), so a
family cannot be registered unchecked; a case naming a model_type nobody reads fails too.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from models import registry
from tests.parity_folders import CASES, KINDS, WRITERS, Built

IDS = [5, 17, 33, 2, 40, 41, 7, 9, 11, 12]  # longer than every sliding window of tests/tiny_families.py
MAMBA_IDS = [5, 17, 33, 2, 40, 41, 7, 9, 11, 12, 13, 14]
CLASSIFY = ["A warm, funny and beautifully acted film.", "the plot is thin and the jokes fall flat .",
            "The striker scored twice!", "the film is warm and funny ."]
TRANSLATE = ["A man in a blue shirt is riding a bicycle down the street.", "Two young girls are playing.",
             "The central bank raised interest rates again on Tuesday."]
# (new tokens, length penalty): at 4 steps some searches are cut, and one T5 beam search finishes its 5th hypothesis at
# its very limit (its live beams must still compete, as transformers ranks them)
LIMITS = [(4, 1.0), (7, 1.0), (20, 1.0), (16, 0.0)]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors on 2 shared cores: a second thread only adds synchronisation (on a busy machine, spinning), so
    these tests run on one and give the setting back."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _params() -> list:
    """One parameter per case of each registered model_type; a model_type without a case is a parameter of its own
    that fails."""
    out = []
    for model_type in registry.hf_types():
        cases = WRITERS.get(model_type)
        if not cases:
            out.append(pytest.param(model_type, None, id=f"{model_type}-no-folder"))
        out += [pytest.param(model_type, c.name, id=c.name) for c in cases or ()]
    return out


@pytest.mark.parametrize("model_type, name", _params())
def test_parity(hf_folders, model_type: str, name: str | None) -> None:
    assert name is not None, f"no random-weight folder to check model_type {model_type!r}: add a Case to " \
                             "tests/parity_folders.py"
    built: Built = hf_folders.get(name)
    case = built.case
    assert json.loads((built.path / "config.json").read_text())["model_type"] == model_type
    ours = built.model
    assert registry.family_of(ours) is registry.by_model_type(model_type)
    for path, want in case.expect.items():
        got = ours
        for part in path.split("."):
            got = getattr(got, part)
        assert got == want, f"{name}: {path} is {got!r}, the folder says {want!r}"
    COMPARE[case.kind](built, ours)


def test_every_case_names_a_registered_model_type() -> None:
    """The table holds no folder for a model_type nobody reads (a renamed or removed family), and every kind has its
    comparison."""
    assert set(WRITERS) <= set(registry.hf_types()), sorted(set(WRITERS) - set(registry.hf_types()))
    assert {c.kind for c in CASES} <= set(KINDS) == set(COMPARE)
    assert len({c.name for c in CASES}) == len(CASES)


def test_a_model_type_without_a_folder_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A family registered with a model_type that has no case gets a parameter of its own, and that test fails by
    name (the check cannot pass silently)."""
    family = registry.Family("planted", "models.families.gpt", "GPT", "GPTConfig", ("Planted",),
                             (("planted_type", "models.io.hf:gpt2_from_state"),))
    monkeypatch.setitem(registry.FAMILIES, "planted", family)
    params = [p for p in _params() if p.values[0] == "planted_type"]
    assert [p.values for p in params] == [("planted_type", None)] and params[0].id == "planted_type-no-folder"
    with pytest.raises(AssertionError, match="no random-weight folder to check model_type 'planted_type'"):
        test_parity(None, "planted_type", None)


# ------------------------------------------------------------------------------------------------- comparisons
def decoder(built: Built, ours) -> None:
    """Logits and every layer's attention within 1e-4 of transformers', greedy ids identical (12 new tokens)."""
    hf = built.ref.model
    ids = torch.tensor([IDS])
    with torch.no_grad():
        ref = hf(ids, output_attentions=True)
        mine = ours(ids, need_weights=True)
    torch.testing.assert_close(mine.logits, ref.logits, atol=1e-4, rtol=0)
    assert len(mine.attention) == len(ref.attentions) == ours.config.n_layers
    for a, b in zip(ref.attentions, mine.attention, strict=True):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=0)
    with torch.no_grad():
        want = hf.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)[0].tolist()
    got = ours.generate(IDS, max_new_tokens=12)
    assert len(got.ids) > len(IDS) and got.ids == want[: len(got.ids)]
    assert len(set(got.ids[len(IDS):])) > 1  # the random model does not just repeat one token


def mamba(built: Built, ours) -> None:
    """Every block's hidden state and the logits within 1e-4; greedy ids identical through the recurrent state
    (prompt read at once, then one token per step with the cached convolution inputs and scan state)."""
    hf = built.ref.model
    ids = torch.tensor([MAMBA_IDS])
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True)
        mine = ours(ids, keep_hidden=True)
    torch.testing.assert_close(mine.logits, ref.logits, atol=1e-4, rtol=0)
    assert len(ref.hidden_states) == len(mine.hidden) == ours.config.n_layers + 1
    for a, b in zip(ref.hidden_states[:-1], mine.hidden[1:], strict=True):  # after each block
        torch.testing.assert_close(b, a, atol=1e-4, rtol=0)
    torch.testing.assert_close(ours.norm(mine.hidden[-1]), ref.hidden_states[-1], atol=1e-4, rtol=0)
    with torch.no_grad():
        want = hf.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)[0].tolist()
    got = ours.generate(MAMBA_IDS, max_new_tokens=12)
    assert got.ids == want[: len(got.ids)] and len(got.ids) == len(MAMBA_IDS) + 12
    np.testing.assert_allclose(ours.next_token_probs(MAMBA_IDS), torch.softmax(ref.logits[0, -1], -1).numpy(),
                               atol=1e-5)


def hybrid(built: Built, ours) -> None:
    """Qwen3-Next: the logits, every hidden state (transformers': the embeddings, each block's output but the last,
    then the final norm's) and every softmax layer's attention within 1e-4; greedy ids identical through the caches
    (the softmax layers' keys and values, the DeltaNet layers' convolution inputs and delta-rule states)."""
    hf = built.ref.model
    ids = torch.tensor([MAMBA_IDS])
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True, output_attentions=True)
        mine = ours(ids, keep_hidden=True, need_weights=True)
    torch.testing.assert_close(mine.logits, ref.logits, atol=1e-4, rtol=0)
    assert len(ref.hidden_states) == len(mine.hidden) == ours.config.n_layers + 1
    for a, b in zip(ref.hidden_states[:-1], mine.hidden[:-1], strict=True):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=0)
    torch.testing.assert_close(ours.norm(mine.hidden[-1]), ref.hidden_states[-1], atol=1e-4, rtol=0)
    softmax = [w for w in mine.attention if w is not None]
    assert len(softmax) == len(ref.attentions) == ours.config.kinds.count("full") > 0
    for a, b in zip(ref.attentions, softmax, strict=True):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=0)
    with torch.no_grad():
        want = hf.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)[0].tolist()
    got = ours.generate(MAMBA_IDS, max_new_tokens=12)
    assert got.ids == want and len(set(got.ids[len(MAMBA_IDS):])) > 1


def classifier(built: Built, ours) -> None:
    """The tokenizer's own tokens (specials included, exactly), class probabilities far from uniform and every layer's
    attention within 1e-4; the texts padded into one batch answer as each alone."""
    hf, tok = built.ref.model, built.ref.tokenizer
    longest = 0
    for text in CLASSIFY:
        result = ours.classify(text)
        enc = tok(text, return_tensors="pt")
        # the tokenizer's own pieces (a byte-level label is decoded: "▁old" for "Ġold", the piece kept as .raw)
        assert [getattr(t, "raw", t) for t in result.tokens] == tok.convert_ids_to_tokens(enc["input_ids"][0].tolist())
        longest = max(longest, len(result.tokens))
        with torch.no_grad():
            ref = hf(**enc, output_attentions=True)
        probs = torch.softmax(ref.logits[0], -1).numpy()
        assert probs.max() - probs.min() > 0.2  # the scaled head: far from uniform, so a wrong head shows
        np.testing.assert_allclose(result.probs, probs, atol=1e-4)
        want = torch.stack(ref.attentions, 1)[0].numpy()
        assert want.shape[0] == ours.config.n_layers
        np.testing.assert_allclose(result.attention["encoder"].weights, want, atol=1e-4)
    assert longest > 2 + 4  # longer than DeBERTa's ±k/2: its log buckets are used
    for text, together in zip(CLASSIFY, ours.classify_many(CLASSIFY), strict=True):
        np.testing.assert_allclose(together.probs, ours.classify(text).probs, atol=1e-5)


def _produced(ours, got) -> list[int]:
    """The chosen hypothesis as transformers returns it: decoder start, tokens, and eos when it finished."""
    ids = [ours.tokenizer.vocab[p] for p in got.target_tokens]
    finished = got.beam[len(got.chosen) - 1].finished[got.chosen[-1]]  # the step its last token was chosen at
    return ids + [ours.config.eos_id] if finished else ids


def translator(built: Built, ours) -> None:
    """Source ids equal to the tokenizer's (a task prefix included), greedy and beam-5 output identical to
    ``generate`` with the same limit and length penalty (early stopping at K finished hypotheses, as the
    Translator's search), the text decoded as transformers decodes it; then every layer's encoder, decoder and
    cross-attention of the chosen output within 1e-4, also on a source longer than T5's 20-position buckets."""
    hf, tok, c = built.ref.model, built.ref.tokenizer, ours.config
    prefix = getattr(c, "prefix", "")
    for beams in (1, 5):
        early, cut = 0, 0
        for text in TRANSLATE:
            enc = tok(prefix + text, return_tensors="pt")
            assert ours.tokenizer.encode(text).ids == enc["input_ids"][0].tolist()
            # Marian forces eos at the limit, so no search is cut short: the 4-step limit adds nothing to the 7-step one
            for limit, penalty in LIMITS[1:] if c.forced_eos else LIMITS:
                ref = hf.generate(**enc, num_beams=beams, max_new_tokens=limit, length_penalty=penalty,
                                  early_stopping=True, do_sample=False)[0].tolist()
                got = ours.translate(text, beam_size=beams, max_len=limit, length_penalty=penalty)
                assert _produced(ours, got) == ref, (text, beams, limit, penalty)
                assert got.text == tok.decode(ref, skip_special_tokens=True)
                early += ref[-1] == c.eos_id and len(ref) - 1 < limit
                cut += ref[-1] != c.eos_id
        # some searches end by choosing eos before their limit; greedy ones are also cut at it (unless eos is forced
        # there, as Marian forces it)
        assert (early or not built.case.ends_early) and (cut or beams > 1 or c.forced_eos), (beams, early, cut)
    long = " ".join(TRANSLATE[:2])  # within Marian's 64 positions, past T5's buckets
    for text, beams in ((TRANSLATE[0], 5), (long, 1)):
        got = ours.translate(text, beam_size=beams, max_len=12)
        enc = tok(prefix + text, return_tensors="pt")
        assert enc["input_ids"].size(1) > 20 or text != long
        assert got.source_tokens == [ours.tokenizer.id_to_piece(i) for i in enc["input_ids"][0].tolist()]
        dec = torch.tensor([[ours.tokenizer.vocab[p] for p in got.target_tokens]])
        with torch.no_grad():
            ref = hf(**enc, decoder_input_ids=dec, output_attentions=True)
        for kind, theirs in (("encoder", ref.encoder_attentions), ("decoder", ref.decoder_attentions),
                             ("cross", ref.cross_attentions)):
            want = torch.stack(theirs, 1)[0].numpy()  # (layers, heads, queries, keys)
            assert got.attention[kind].weights.shape == want.shape
            np.testing.assert_allclose(got.attention[kind].weights, want, atol=1e-4)


def vision(built: Built, ours) -> None:
    """For three images (two photos, one of noise): the pixels our preprocessing gives equal the folder's transformers
    image processor's, the class probabilities (far from uniform, not saturated) and every layer's attention within
    1e-4; a Swin's every block's window attention, with the window and shift transformers used."""
    import transformers

    from tests.families import noise, photo

    hf = built.ref.model
    processor = getattr(transformers, built.ref.processor).from_pretrained(built.path)
    blocks = [b for stage in hf.swin.encoder.layers for b in stage.blocks] if hasattr(hf, "swin") else []
    seen: list[torch.Tensor] = []  # every block's window attention (transformers returns one per stage)
    hooks = [b.attention.register_forward_hook(lambda m, args, out: seen.append(out[1])) for b in blocks]
    try:
        for image in (photo(0), photo(1), noise(0)):
            seen.clear()
            _compare_image(built, ours, processor, image, seen, blocks)
    finally:
        for h in hooks:
            h.remove()


def _compare_image(built: Built, ours, processor, image, seen: list, blocks: list) -> None:
    from models.inputs.images import prepare

    hf = built.ref.model
    theirs = processor(image, return_tensors="pt")["pixel_values"]
    mine = prepare(image, "processor", processor=ours.config.processor).tensor
    assert mine.shape == theirs.shape
    np.testing.assert_allclose(mine.numpy(), theirs.numpy(), atol=1e-5)
    result = ours.classify(image)
    with torch.no_grad():
        ref = hf(pixel_values=theirs, output_attentions=True)
    probs = torch.softmax(ref.logits[0], -1).numpy()
    assert probs.max() - probs.min() > 0.2 and probs.max() < 0.9999  # a wrong head or logit shows
    np.testing.assert_allclose(result.probs, probs, atol=1e-4)
    side = hf.config.image_size // hf.config.patch_size
    assert result.grid == (side, side) and result.image.shape[:2] == tuple(theirs.shape[-2:])
    if not blocks:
        want = torch.stack(ref.attentions, 1)[0].numpy()  # (layers, heads, prefix + P, prefix + P)
        assert want.shape[-1] == ours.num_prefix_tokens + side * side
        np.testing.assert_allclose(result.attention["encoder"].weights, want, atol=1e-4)
        return
    assert len(result.windows) == len(seen) == len(blocks) and len(ref.attentions) == len(hf.config.depths)
    for block, theirs_w, hf_block in zip(result.windows, seen, blocks, strict=True):
        assert (block.window, block.shift) == (hf_block.window_size, hf_block.shift_size)  # what transformers used
        np.testing.assert_allclose(block.weights, theirs_w.numpy(), atol=1e-4)


def vlm(built: Built, ours) -> None:
    """Vision-language models (tests/vlm_parity.py): for a wide and a tall image, the tower's pixels, the prompt's
    ids and image positions, greedy ids, every layer's attention of the language model and of the tower."""
    from tests.vlm_parity import compare

    compare(built.ref.model, built.ref.multimodal, ours)


COMPARE = {"decoder": decoder, "mamba": mamba, "hybrid": hybrid, "classifier": classifier, "translator": translator,
           "vision": vision, "vlm": vlm}
