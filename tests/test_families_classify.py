"""Classify families read from Hugging Face folders (models/io/hf_encoders.py): RoBERTa, DistilBERT, ELECTRA and ALBERT
as switches on models/families/bert.py. Each random-weight folder written by transformers (tests/parity_folders.py;
its tokens, class probabilities, attention and batches against transformers are tests/test_parity.py's) gives a score
split that sums to each score and reproduces the attention, one shared layer for ALBERT, and every explanation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import models
from models.inspect.decompose import attention_scores, decompose_score
from tests.families import classifier_folder

torch.set_num_threads(2)
FAMILIES = ["roberta", "distilbert", "electra", "albert"]
TEXTS = ["A warm, funny and beautifully acted film.", "the plot is thin and the jokes fall flat .",
         "The striker scored twice!"]


@pytest.fixture(scope="module", params=FAMILIES)
def folder(request, hf_folders) -> tuple[str, Path, object, object]:
    built = hf_folders.get(request.param)
    return request.param, built.path, built.ref.model, built.ref.tokenizer


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
