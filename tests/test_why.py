"""The "why a head attends / whether it matters" handlers (tabs/why.py) over the tiny checkpoints, called directly
and through the API: the decomposition sums to the score and its softmax row is the attention the tab shows, for
every text model the app serves; patching answers with the documented JSON; hostile parameters get words."""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import numpy as np
import pytest

from serving import catalogue, store
from tabs import why
from tabs.classify import classify
from tabs.classify import sequence as classify_sequence
from tabs.generate import generate
from tabs.generate import sequence as generate_sequence

TEXT = "a dog runs on the grass"


@pytest.fixture()
def tiny(tiny_checkpoints: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    return tiny_checkpoints


@pytest.mark.parametrize("model", ["gpt-tiny", "sst2", "minilm-sst2", "translator-en-de"])
def test_attention_why_sums_and_reproduces_the_row(tiny, model: str) -> None:
    fig, table = why.attention_why(TEXT, model, layer=-1, head=1, query=-1, key=0)
    assert abs(sum(c["value"] for c in table["components"]) - table["score"]) < 1e-4
    assert {"query_part", "key_part", "value"} <= set(table["components"][0])
    row = np.array(table["softmax_row"])
    assert abs(row.sum() - 1) < 1e-5 and fig["data"]
    net = store.get_model(model)
    ids, _, _ = why.encode(net, TEXT)
    from models.inspect.decompose import attention_scores

    scores = attention_scores(net, ids)[-1, 1, -1]
    np.testing.assert_allclose(row, np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum(), atol=1e-5)


def test_generate_tab_split_matches_the_drawn_attention(tiny) -> None:
    """The section splits the tab's kept generation; its softmax row is the attention row the tab draws."""
    out = generate("a dog", 5)
    state = out[6]
    amap = state["result"].attention["decoder"]
    summary, fig, table = why.explain(generate_sequence, state, 1, 3, -1, 2)
    np.testing.assert_allclose(table["softmax_row"], amap.weights[1, 3, -1], atol=1e-4)
    assert summary.startswith("**Layer 1, head 3") and "RoPE" in summary
    assert "position_part" in table and abs(table["content_score"] + table["position_part"] - table["score"]) < 1e-9


def test_classify_tab_split_and_sink(tiny) -> None:
    state = classify("a fine film .")[5]
    amap = state["result"].attention["encoder"]
    _, _, table = why.explain(classify_sequence, state, 0, 2, 0, 3)
    np.testing.assert_allclose(table["softmax_row"], amap.weights[0, 2, 0], atol=1e-4)
    assert table["tokens"] == amap.queries
    note = why.ablate_sink(classify_sequence, state, 1, 0)
    assert "forbidden its first token" in note and "→" in note
    gen_state = generate("a dog", 3)[6]
    assert "next-token loss" in why.ablate_sink(generate_sequence, gen_state, 0, 0)


@pytest.mark.parametrize("args,message", [
    (dict(layer=9), "layer 9 is outside"), (dict(head=-9), "head -9 is outside"),
    (dict(query=500), "query position 500 is outside"), (dict(key="x"), "whole number"),
    (dict(query=1, key=4), "causal"), (dict(model="../../etc/passwd"), "Unknown model"),
    (dict(text=""), "type some text"),
])
def test_hostile_parameters_answer_in_words(tiny, args: dict, message: str) -> None:
    call = dict(text=TEXT, model="gpt-tiny", layer=0, head=0, query=-1, key=0) | args
    with pytest.raises(gr.Error, match=message):
        why.attention_why(**call)


def test_enormous_input_is_capped_with_a_notice(tiny) -> None:
    _, table = why.attention_why("word " * 20_000, "gpt-tiny", 0, 0, -1, 0)
    assert "shortened" in table["notice"] and len(table["softmax_row"]) == 128
    _, table = why.attention_why("word " * 20_000, "sst2", 0, 0, -1, 0)
    assert len(table["softmax_row"]) == 128


def test_patch_answers_and_refuses_different_lengths(tiny) -> None:
    fig, table = why.patch("a dog runs on the grass", "a man runs on the grass", "gpt-tiny", "", "heads")
    restored = np.array(table["restored"])
    assert restored.shape == (2, 4) and np.isfinite(restored).all() and fig["data"][0]["type"] == "heatmap"
    assert table["logit_diff_clean"] != table["logit_diff_corrupted"]
    _, table = why.patch("a fine film .", "a bad film .", "sst2", "positive", "positions")
    assert np.array(table["restored"]).shape == (2, len(table["clean_tokens"])) and table["target"] == "positive"
    with pytest.raises(gr.Error, match=r"has \d+ tokens and the corrupted one \d+"):
        why.patch("a dog", "a dog runs on and on and on", "gpt-tiny")
    with pytest.raises(gr.Error, match="Unknown sweep"):
        why.patch("a dog runs on the grass", "a man runs on the grass", "gpt-tiny", "", "everything")
    with pytest.raises(gr.Error, match="Unknown class"):
        why.patch("a fine film .", "a bad film .", "sst2", "maybe")


def test_clicked_cells(tiny) -> None:
    """A heatmap click ("query,key,n") moves the section's controls; a click on another view is refused."""
    layer_u, head_u, query_u, key_u = why.from_cell("5,2,7", 1, "3", 0, "heatmap")
    assert (layer_u["value"], head_u["value"], query_u["value"], key_u["value"]) == (1, 3, 5, 2)
    assert why.from_cell("5,2,8", 1, "mean", 2, "heatmap")[1]["value"] == 2  # the mean: keep the section's head
    with pytest.raises(gr.Error, match="heatmap view"):
        why.from_cell("5,2,9", 1, "3", 0, "model view")
    with pytest.raises(gr.Error, match="heatmap view"):
        why.from_cell("5,2,9", 1, "3", 0, "heatmap", "cross")
    net = store.get_model("gpt-tiny")
    ids = [why.encode(net, t)[0] for t in ("a dog runs on the grass", "a man runs on the grass")]
    _, _, _, kept = why.run_patch("gpt-tiny", *ids, None, "heads")
    fig, summary, layer_u, head_u = why.patched_head("1,2,1", kept)
    assert fig is not None and "Layer 1, head 2" in summary and (layer_u["value"], head_u["value"]) == (1, 2)


def test_api_attention_why_and_patch(client) -> None:
    fig, table = client.predict("a dog runs on the grass", "gpt-tiny", -1, 0, -1, 0, api_name="/attention_why")
    assert abs(sum(c["value"] for c in table["components"]) - table["score"]) < 1e-4
    fig, table = client.predict("a fine film .", "a bad film .", "sst2", "", "heads", api_name="/patch")
    assert np.array(table["restored"]).shape == (2, 4)
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="outside"):
        client.predict("a dog", "gpt-tiny", 0, 0, 99, 0, api_name="/attention_why")


@pytest.fixture(scope="module")
def client(app_url: str):
    from gradio_client import Client

    return Client(app_url, verbose=False)


def test_compare_two_inputs(tiny) -> None:
    """B beside A: B − A over the shared tokens, the change per class or token, both inputs in the .npz."""
    from tabs import classify as tab_classify
    from tabs import generate as tab_generate

    a, b = classify("a fine film .")[5], classify("a bad film .")[5]
    note, fig_b, diff, change = why.compared(tab_classify.compare_view, a, b, 1, "2", "heatmap")
    wa, wb = a["result"].attention["encoder"].weights[1, 2], b["result"].attention["encoder"].weights[1, 2]
    from models.inspect.analysis import align_tokens

    pairs = align_tokens(a["result"].tokens, b["result"].tokens)
    assert 0 < len(pairs) < len(b["result"].tokens)  # "fine" and "bad" are not shared
    ia, ib = [i for i, _ in pairs], [j for _, j in pairs]
    np.testing.assert_allclose(np.array(diff.data[0].z, dtype=float), wb[np.ix_(ib, ib)] - wa[np.ix_(ia, ia)],
                               atol=1e-6)
    assert "p(" in note and [t.name for t in change.data] == ["A", "B"]
    path = why.both_arrays("classify", tab_classify.compare_view, a, b)
    with np.load(path) as z:
        assert z["attention_a"].shape[-1] == len(a["result"].tokens) and z["shared"].shape == (len(pairs), 2)
    g_a, g_b = generate("a dog", 4)[6], generate("a cat", 4)[6]
    note, *_ = why.compared(tab_generate.compare_view, g_a, g_b, 0, "mean", "model view")
    assert "surprisal" in note
    with pytest.raises(gr.Error, match="first input"):
        why.compared(tab_generate.compare_view, None, g_b, 0, "mean", "heatmap")


def test_translate_compare_and_encoder_scores(tiny) -> None:
    from tabs import translate as tab

    a, b = tab.translate("A dog runs.")[6], tab.translate("A cat runs.")[6]
    note, fig_b, diff, change = why.compared(tab.compare_view, a, b, 0, "mean", "heatmap")
    assert "cross-attention received" in note and fig_b is not None
    with np.load(tab.translate("A dog runs.")[7]) as z:
        enc = z["encoder"]
        scores = z["encoder_scores"]
        soft = np.exp(scores - scores.max(-1, keepdims=True))
        np.testing.assert_allclose(soft / soft.sum(-1, keepdims=True), enc, atol=1e-5)
