"""DeBERTa-v2/v3 (models/families/deberta.py) from a random-weight DebertaV2ForSequenceClassification folder written by
transformers (tests/parity_folders.py: relative attention with log buckets, shared keys, no absolute positions, three
layers, nine-wide heads; its tokens, probabilities, attention and batches against transformers are
tests/test_parity.py's): the log buckets are transformers' own; each score splits into content→content,
content→position and position→content terms that sum to it (and whose rows reproduce the attention); patching runs as
for BERT."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import models
from models.families.deberta import disentangled_split, log_bucket

torch.set_num_threads(2)
TEXTS = ["A warm, funny film; the striker scored twice.",
         "the plot is thin and the jokes fall flat ."]


@pytest.fixture(scope="module")
def deberta(hf_folders):
    built = hf_folders.get("deberta-v2")
    return built.path, built.ref.model, built.ref.tokenizer


def test_log_buckets_are_transformers_own() -> None:
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    rel = torch.arange(-300, 301)[None, :]
    want = make_log_bucket_position(rel, 256, 512).long()
    assert torch.equal(log_bucket(rel, 256, 512), want)
    assert torch.equal(log_bucket(-rel, 256, 512), -want)  # odd: c2p and p2c index the same row


def test_three_terms_sum_to_the_score(deberta) -> None:
    where, _, _ = deberta
    ours = models.load(str(where))
    ids = ours.tokenizer.encode(TEXTS[0]).ids
    weights = ours.classify(TEXTS[0]).attention["encoder"].weights
    n = len(ids)
    for layer in range(3):
        for head, query, key in [(0, 0, n - 1), (3, n - 1, 0), (2, 5, 6), (1, 4, 4)]:
            d = disentangled_split(ours, ids, layer, head, query, key)
            assert abs(d.c2c + d.c2p + d.p2c - d.score) < 1e-4
            assert d.c2p != 0 and d.p2c != 0 and d.distance == query - key
            np.testing.assert_allclose(d.softmax_row, weights[layer, head, query], atol=1e-4)
    far = disentangled_split(ours, ids, 0, 0, n - 1, 0)
    assert far.bucket != 8 + (n - 1)  # a long distance shares a log bucket (k = 8)
    with pytest.raises(ValueError, match="outside"):
        disentangled_split(ours, ids, 3, 0, 0, 0)


def test_patching_runs_as_for_bert(deberta) -> None:
    """Every head of every layer patched from the clean run gives the clean logits exactly, and the sweep runs."""
    from models.blocks.attention import Intervention, LayerEdit
    from models.inspect.patching import patch_sweep

    where, _, _ = deberta
    ours = models.load(str(where))
    clean_ids = ours.tokenizer.encode("the film is warm").ids
    corrupt_ids = ours.tokenizer.encode("the film is flat").ids
    assert len(clean_ids) == len(corrupt_ids) and clean_ids != corrupt_ids
    clean, corrupt = torch.tensor([clean_ids]), torch.tensor([corrupt_ids])
    with torch.no_grad():
        rec = ours.forward_edited(clean, edit=Intervention(record=True))
        every = torch.ones(1, 4, dtype=torch.bool)
        patched = ours(corrupt, edit=Intervention({i: LayerEdit(head_values=h, head_select=every)
                                                   for i, h in enumerate(rec.heads)}))
        assert not torch.allclose(ours(corrupt), rec.logits, atol=1e-4)
    torch.testing.assert_close(patched, rec.logits, atol=1e-5, rtol=0)
    result = patch_sweep(ours, clean_ids, corrupt_ids, "heads")
    assert result.restored.shape == (3, 4) and np.isfinite(result.restored).all()


def test_the_why_section_shows_the_three_terms(deberta) -> None:
    """The text tabs' "why" section answers for DeBERTa with its three terms (summing to the score), and the
    downloads' pre-softmax scores reproduce the attention."""
    from models.inspect.decompose import attention_scores
    from tabs.sections import why

    where, _, _ = deberta
    ours = models.load(str(where))
    enc = ours.tokenizer.encode(TEXTS[1])
    summary, fig, table = why.why(ours, enc.ids, enc.pieces, 2, 1, 6, 1)
    assert "content → position" in summary and "position → content" in summary and fig is not None
    assert abs(sum(c["value"] for c in table["components"]) - table["score"]) < 1e-4
    # the figure draws the three terms and leaves position→position empty (it is no term of DeBERTa's); its
    # title's score is their sum
    z = np.array(fig.data[0].z, dtype=float)
    at = {(y.split(" (")[0], x.split(" (")[0]): (i, j) for i, y in enumerate(fig.data[0].y)
          for j, x in enumerate(fig.data[0].x)}
    for c in table["components"]:
        assert abs(z[at[c["query_part"], c["key_part"]]] - c["value"]) < 1e-6
    empty = at["relative position", "relative position"]
    assert np.isnan(z[empty]) and fig.data[0].text[empty[0]][empty[1]] == ""
    assert f"score {table['score']:.3f} = content→content" in fig.layout.annotations[0].text
    scores = attention_scores(ours, enc.ids)
    weights = ours.classify(TEXTS[1]).attention["encoder"].weights
    e = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(e / e.sum(-1, keepdims=True), weights, atol=1e-4)
    assert abs(scores[2, 1, 6, 1] - table["score"]) < 1e-4


def test_every_explanation_runs(deberta) -> None:
    from models.inspect.attribution import deletion_curves, explain, methods_for

    where, _, _ = deberta
    ours = models.load(str(where))
    found = [explain(ours, TEXTS[1], method, steps=16) for method in methods_for(ours)]
    assert len(found) == 5 and all(np.isfinite(a.values).all() for a in found)
    assert len(deletion_curves(ours, TEXTS[1], found)[0]) == 5
