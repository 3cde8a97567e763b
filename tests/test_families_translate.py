"""Marian (opus-mt) folders read into the Translator (models/io/hf_translators.py): a random-weight MarianMTModel
written by transformers, tokenised, searched and attended exactly as transformers does it: source ids equal to
MarianTokenizer's, greedy and beam-5 output identical to ``generate`` (same length limit and length penalty,
early stopping at K finished hypotheses as the Translator's search), the text decoded as transformers decodes it,
and the encoder, decoder and cross-attention of the chosen output within 1e-4."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import models
from tests.families import marian_folder

torch.set_num_threads(2)
TEXTS = ["A man in a blue shirt is riding a bicycle down the street.", "Two young girls are playing.",
         "The central bank raised interest rates again on Tuesday."]


@pytest.fixture(scope="module", params=[True, False], ids=["shared", "untied"])
def marian(request, tmp_path_factory) -> tuple[Path, object, object, bool]:
    where = tmp_path_factory.mktemp("marian")
    hf, tok = marian_folder(where, shared=request.param)
    return where, hf, tok, request.param


@pytest.mark.parametrize("beams", [1, 5])
def test_search_equals_generate(marian, beams: int) -> None:
    where, hf, tok, shared = marian
    ours = models.load(str(where))
    assert ours.config.family == "marian" and ours.config.tie_embeddings == shared
    ended_early = 0
    for text in TEXTS:
        enc = tok(text, return_tensors="pt")
        assert ours.tokenizer.encode(text).ids == enc["input_ids"][0].tolist()
        for limit, penalty in [(7, 1.0), (20, 1.0), (16, 0.0)]:
            ref = hf.generate(**enc, num_beams=beams, max_new_tokens=limit, length_penalty=penalty,
                              early_stopping=True, do_sample=False)[0].tolist()
            got = ours.translate(text, beam_size=beams, max_len=limit, length_penalty=penalty)
            ids = [ours.tokenizer.vocab[p] for p in got.target_tokens] + [ours.config.eos_id]
            assert ids == ref, (text, limit, penalty)
            assert got.text == tok.decode(ref, skip_special_tokens=True)
            ended_early += len(ref) - 1 < limit
    if shared:  # its eos bias is set so that some searches end by choosing eos, not only at their limit
        assert ended_early


def test_attention_equals_transformers(marian) -> None:
    where, hf, tok, _ = marian
    ours = models.load(str(where))
    got = ours.translate(TEXTS[0], beam_size=5, max_len=12)
    enc = tok(TEXTS[0], return_tensors="pt")
    dec = torch.tensor([[ours.tokenizer.vocab[p] for p in got.target_tokens]])
    with torch.no_grad():
        ref = hf(**enc, decoder_input_ids=dec, output_attentions=True)
    for kind, theirs in (("encoder", ref.encoder_attentions), ("decoder", ref.decoder_attentions),
                         ("cross", ref.cross_attentions)):
        want = torch.stack(theirs, 1)[0].numpy()
        assert got.attention[kind].weights.shape == want.shape
        np.testing.assert_allclose(got.attention[kind].weights, want, atol=1e-4)


def test_translate_tab_refuses_an_unknown_model_by_name() -> None:
    """The function behind /translate names an unknown model and the choices, whatever called it."""
    from tabs import translate
    from tabs.common import Error

    assert translate.translator_models()[:2] == ["translator-en-de", "Helsinki-NLP/opus-mt-en-de"]
    with pytest.raises(Error, match="no-such-model.*translator-en-de"):
        translate._model("no-such-model")
