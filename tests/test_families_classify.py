"""Classify families read from Hugging Face folders (models/io/hf_encoders.py): RoBERTa, DistilBERT, ELECTRA and ALBERT
as switches on models/families/bert.py. Each random-weight folder written by transformers loads through
``models.load`` and equals transformers' ``*ForSequenceClassification``: the tokens its tokenizer gives, the class
probabilities and every layer's attention within 1e-4; the score split sums to each score and reproduces the
attention."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import models
from models.inspect.decompose import attention_scores, decompose_score
from tests.families import LABELS, classifier_folder

torch.set_num_threads(2)
FAMILIES = ["roberta", "distilbert", "electra", "albert"]
TEXTS = ["A warm, funny and beautifully acted film.", "the plot is thin and the jokes fall flat .",
         "The striker scored twice!"]


@pytest.fixture(scope="module", params=FAMILIES)
def folder(request, tmp_path_factory) -> tuple[str, Path, object, object]:
    where = tmp_path_factory.mktemp(request.param)
    hf, tok = classifier_folder(request.param, where)
    return request.param, where, hf, tok


def test_matches_transformers(folder) -> None:
    family, where, hf, tok = folder
    ours = models.load(str(where))
    assert ours.config.family == family and ours.labels == list(LABELS)
    for text in TEXTS:
        result = ours.classify(text)
        enc = tok(text, return_tensors="pt")
        # the tokenizer's own specials (<s> </s> for RoBERTa, [CLS] [SEP] for the others), exactly
        assert result.tokens == tok.convert_ids_to_tokens(enc["input_ids"][0].tolist()), family
        with torch.no_grad():
            ref = hf(**enc, output_attentions=True)
        probs = torch.softmax(ref.logits[0], -1).numpy()
        assert probs.max() - probs.min() > 0.2  # the scaled head: far from uniform, so a wrong head shows
        np.testing.assert_allclose(result.probs, probs, atol=1e-4)
        ref_attn = torch.stack(ref.attentions, 1)[0].numpy()
        assert ref_attn.shape[0] == 3
        np.testing.assert_allclose(result.attention["encoder"].weights, ref_attn, atol=1e-4)


def test_batched_padding_equals_one_by_one(folder) -> None:
    """Padding on the right (RoBERTa's positions counted from padding_idx + 1 included) changes no answer."""
    _, where, _, _ = folder
    ours = models.load(str(where))
    alone = [ours.classify(t) for t in TEXTS]
    together = ours.classify_many(TEXTS)
    for a, b in zip(alone, together):
        np.testing.assert_allclose(a.probs, b.probs, atol=1e-5)


def test_score_split_sums_and_reproduces_attention(folder) -> None:
    _, where, _, _ = folder
    ours = models.load(str(where))
    ids = ours.tokenizer.encode(TEXTS[0]).ids
    weights = ours.classify(TEXTS[0]).attention["encoder"].weights
    scores = attention_scores(ours, ids)
    for layer in range(3):
        for head, query, key in [(0, 0, 3), (3, 5, 1), (2, len(ids) - 1, 0)]:
            d = decompose_score(ours, ids, layer, head, query, key)
            assert abs(d.table.sum() - d.score) < 1e-4
            np.testing.assert_allclose(d.softmax_row, weights[layer, head, query], atol=1e-4)
            np.testing.assert_allclose(d.row, scores[layer, head, query], atol=1e-4)


def test_albert_shares_one_layer(tmp_path: Path) -> None:
    """ALBERT's passes run one module: the same parameters, so the model holds one layer's weights."""
    classifier_folder("albert", tmp_path)
    ours = models.load(str(tmp_path))
    layers = ours.bert.layers
    assert all(layer is layers[0] for layer in layers) and len(layers) == 3
    own = sum(p.numel() for p in ours.parameters())
    from transformers import AlbertForSequenceClassification

    assert own == sum(p.numel() for p in AlbertForSequenceClassification.from_pretrained(tmp_path).parameters())


def test_each_tab_offers_its_hub_models() -> None:
    """The Hub models each tab offers unconfigured are listed in that tab only, and their family is known before
    they are fetched (Vision offers a Swin its gradient methods only, from the start)."""
    from models import registry
    from serving import catalogue

    for kind in ("classify", "translate", "vision", "generate"):
        for name in catalogue.downloadable(kind):
            assert name in catalogue.names(kind)
            assert all(name not in catalogue.names(other) for other in registry.TABS if other != kind)
            if kind != "generate":
                assert kind in catalogue.family(name).tabs
    assert catalogue.family("microsoft/swin-tiny-patch4-window7-224").methods == registry.GRADIENT_METHODS
    assert "Helsinki-NLP/opus-mt-en-de" in catalogue.text_models()
    # issue 49: real models of two classifier families (DistilBERT, RoBERTa), a DeiT and a Swin, two translators
    assert {"distilbert/distilbert-base-uncased-finetuned-sst-2-english",
            "cardiffnlp/twitter-roberta-base-sentiment-latest"} <= set(catalogue.downloadable("classify"))
    assert catalogue.family("facebook/deit-tiny-distilled-patch16-224").name == "deit"
    assert {"Helsinki-NLP/opus-mt-en-de", "google-t5/t5-small"} <= set(catalogue.downloadable("translate"))


def test_every_explanation_and_its_deletion_curve_run(folder) -> None:
    """Each registered explanation method gives one finite value per token, and the deletion curves run: the
    Classify views' inputs for this family."""
    from models.inspect.attribution import deletion_curves, explain, methods_for

    _, where, _, _ = folder
    ours = models.load(str(where))
    n = len(ours.tokenizer.encode(TEXTS[0]).ids)
    found = [explain(ours, TEXTS[0], method, steps=16) for method in methods_for(ours)]
    assert len(found) == 5
    for a in found:
        assert len(a.values) == n and np.isfinite(a.values).all()
    curves, _ = deletion_curves(ours, TEXTS[0], found)
    assert len(curves) == 5
