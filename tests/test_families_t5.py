"""T5 folders read into ``models.families.t5.T5`` (a Translator with T5's switches): random-weight
T5ForConditionalGeneration folders written by transformers (tests/parity_folders.py: a gated-GELU v1.1 layout with an
untied head, a ReLU original layout with the tied, rescaled head; encoder and decoder of different odd depths; 5 heads ×
8 over d_model 36; 8 buckets reaching 20 positions, so long inputs reach the log buckets and the last one), whose
tokens, searches and attention equal transformers' in tests/test_parity.py. Here: the bucket function equal to
transformers'; the "why" split's content and position terms summing to the score, whose softmax is transformers'
attention row; the tabs reading a configured T5; a batch as each sentence alone."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import models
from models.io.checkpoint import CheckpointError

torch.set_num_threads(2)
TEXTS = ["A man in a blue shirt is riding a bicycle down the street.", "Two young girls are playing.",
         "The central bank raised interest rates again on Tuesday."]
CASES = {"gated-untied": "t5", "relu-tied": "t5-relu-tied"}  # tests/parity_folders.py's T5 folders


@pytest.fixture(scope="module", params=sorted(CASES))
def t5(request, hf_folders) -> tuple[Path, object, object, str]:
    built = hf_folders.get(CASES[request.param])
    return built.path, built.ref.model, built.ref.tokenizer, request.param


def test_buckets_equal_transformers() -> None:
    from transformers.models.t5.modeling_t5 import T5Attention

    from models.families.t5 import relative_bucket

    offsets = torch.arange(-300, 301)[None, :] - torch.arange(0, 3)[:, None]
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (8, 20), (16, 40)):
            want = T5Attention._relative_position_bucket(offsets, bidirectional, buckets, distance)
            got = relative_bucket(offsets, bidirectional, buckets, distance)
            assert torch.equal(got, want), (bidirectional, buckets, distance)
            assert int(got.max()) == buckets - 1  # the far offsets reach the last bucket


def test_bias_split_sums_to_the_score(t5) -> None:
    from models.families.t5 import bias_split, pre_softmax_scores

    where, hf, tok, _ = t5
    ours = models.load(str(where))
    enc = tok(ours.config.prefix + TEXTS[2], return_tensors="pt")
    ids = enc["input_ids"][0].tolist()
    with torch.no_grad():
        ref = torch.stack(hf(**enc, decoder_input_ids=torch.zeros((1, 1), dtype=torch.long),
                             output_attentions=True).encoder_attentions, 1)[0].numpy()
    scores = pre_softmax_scores(ours, ids).numpy()
    np.testing.assert_allclose(torch.softmax(torch.from_numpy(scores), -1).numpy(), ref, atol=1e-4)
    layers = ours.config.n_enc_layers
    for layer, head, query, key in ((0, 0, 0, len(ids) - 1), (layers - 1, 4, len(ids) - 1, 0), (layers - 1, 2, 3, 4)):
        d = bias_split(ours, ids, layer, head, query, key)
        assert abs(d.content + d.position - d.score) < 1e-4
        assert abs(d.score - scores[layer, head, query, key]) < 1e-4
        np.testing.assert_allclose(d.softmax_row, ref[layer, head, query], atol=1e-4)
        assert d.position == pytest.approx(float(ours.enc_bias.table.weight[d.bucket, head].detach()), abs=1e-6)
        assert d.position != 0.0 and d.content != 0.0  # both terms take part


def test_a_spiece_only_folder_is_refused_by_name(t5, tmp_path: Path) -> None:
    where, _, _, _ = t5
    folder = Path(shutil.copytree(where, tmp_path / "f", ignore=shutil.ignore_patterns("spm")))
    (folder / "tokenizer.json").unlink()
    shutil.copy(where / "spm" / "sp.model", folder / "spiece.model")
    with pytest.raises(CheckpointError, match=r"tokenizer\.json.*spiece\.model alone is not read"):
        models.load(str(folder))


def test_translate_tab_runs_every_view_on_the_chosen_t5(t5, monkeypatch) -> None:
    """The Translate tab's handlers with a configured T5 chosen: the translation (with the prefix notice), the Q/K
    section and the "why" split all read that T5 (not the trained translator): the Q/K lines' weights and the split's
    softmax row are the tab's own encoder attention, and the split's two terms sum to its score."""
    from serving import catalogue, store
    from tabs import translate
    from tabs.sections import qk as section
    from tabs.sections import why as why_api

    where, _, tok, _ = t5
    monkeypatch.setattr(catalogue, "CONFIGURED", {})
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    monkeypatch.setattr(section, "_CACHE", type(section._CACHE)())
    catalogue.configure([str(where)])
    name = where.name
    assert name in translate.translator_models()
    out = translate.translate(TEXTS[1], 3, "encoder", -1, "mean", "heatmap", name)
    result, ours = out[6], models.load(str(where))
    assert result.text == ours.translate(TEXTS[1], beam_size=3).text
    assert "task prefix" in out[1] and "translate English to German" in out[1]
    enc = tok(ours.config.prefix + TEXTS[1])["input_ids"]
    assert result.source_tokens == [ours.tokenizer.id_to_piece(i) for i in enc]
    amap = result.attention["encoder"]
    got_name, ids, tokens = translate.sequence((TEXTS[1], name))
    assert got_name == name and ids == enc and tokens == amap.queries
    layer, head = amap.layers - 1, amap.heads - 1
    note, _ = section.draw(translate.sequence, (TEXTS[1], name), layer, head, -1, True)
    assert note.startswith(f"**Layer {layer}, head {head}")
    _, _, p = section.qk_view(name, ids, tokens, layer, head, -1)
    np.testing.assert_allclose(p.weights, amap.weights[layer, head], atol=1e-5)
    summary, _, table = why_api.why(ours, ids, tokens, layer, head, 2, 0, name)
    assert abs(sum(c["value"] for c in table["components"]) - table["score"]) < 1e-4
    assert "relative position bias" in summary
    np.testing.assert_allclose(table["softmax_row"], amap.weights[layer, head, 2], atol=1e-4)


def test_positional_tab_draws_the_chosen_t5s_buckets_and_biases(t5, monkeypatch) -> None:
    """/t5_bias: the bucket of each offset is transformers' (encoder bidirectional, decoder causal), and each head's
    line is transformers' learned table read at that bucket, for the encoder and the decoder."""
    from transformers.models.t5.modeling_t5 import T5Attention

    from serving import catalogue, store
    from tabs import positional
    from tabs.common import Error

    where, hf, _, _ = t5
    monkeypatch.setattr(catalogue, "CONFIGURED", {})
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    catalogue.configure([str(where)])
    assert catalogue.t5_models() == [where.name, "google-t5/t5-small"]
    note, fig = positional.t5_bias(where.name)
    assert "8 buckets" in note and "max_distance` 20" in note
    traces = {(t.xaxis or "x", t.name): t for t in fig.data}
    enc_b, dec_b = traces["x", "encoder (bidirectional)"], traces["x", "decoder (causal)"]
    offsets = torch.tensor(np.asarray(enc_b.x, dtype=np.int64))
    assert int(offsets.min()) < -20 and int(offsets.max()) > 20  # past max_distance both ways
    for trace, bidirectional, stack, axis in ((enc_b, True, hf.encoder, "x2"), (dec_b, False, hf.decoder, "x3")):
        want = T5Attention._relative_position_bucket(offsets, bidirectional, 8, 20)
        assert np.array_equal(np.asarray(trace.y), want.numpy())
        table = stack.block[0].layer[0].SelfAttention.relative_attention_bias.weight.detach().numpy()  # (8, H)
        for h in range(table.shape[1]):
            line = traces[axis, f"head {h}"]
            keep = np.isin(offsets.numpy(), np.asarray(line.x))
            np.testing.assert_allclose(np.asarray(line.y), table[want.numpy()[keep], h], atol=1e-6)
            assert bidirectional or max(line.x) == 0  # the decoder's line: keys at or before the query
    with pytest.raises(Error, match="not a T5 model here"):
        positional.t5_bias("translator-en-de")


def test_a_batch_translates_each_sentence_as_alone(t5) -> None:
    """translate_many pads the sources on the right: the relative bias of the real tokens is unchanged, so each
    answer (text, beam tree, attention) equals the sentence's own translate."""
    where, _, _, _ = t5
    ours = models.load(str(where))
    batch = ours.translate_many(TEXTS, beam_size=3)
    for text, got in zip(TEXTS, batch):
        alone = ours.translate(text, beam_size=3)
        assert got.text == alone.text and got.target_tokens == alone.target_tokens and got.chosen == alone.chosen
        for kind in ("encoder", "decoder", "cross"):
            np.testing.assert_allclose(got.attention[kind].weights, alone.attention[kind].weights, atol=1e-5)


def test_translate_compare_runs_b_on_the_chosen_t5(t5, monkeypatch) -> None:
    """The compare toggle's B runs on the model chosen in the dropdown (it ran on the trained translator whatever
    was chosen): B's translation and attention are the configured T5's."""
    import gradio as gr

    from serving import catalogue, store
    from tabs import translate

    where, _, _, _ = t5
    monkeypatch.setattr(catalogue, "CONFIGURED", {})
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    catalogue.configure([str(where)])
    with gr.Blocks() as demo:
        translate.build()
    go = next(f.fn for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "go")
    a = translate.translate(TEXTS[0], 3, "cross", -1, "mean", "heatmap", where.name)[6]
    *_, kept = go(a, TEXTS[1], 0, "mean", "heatmap", 3, where.name)
    b = kept["b"]  # B's state, with the A it was run beside
    alone = models.load(str(where)).translate(TEXTS[1], beam_size=3)
    assert b.text == alone.text and b.source_tokens == alone.source_tokens
    np.testing.assert_allclose(b.attention["encoder"].weights, alone.attention["encoder"].weights, atol=1e-5)
