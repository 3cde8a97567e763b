"""models/inspect/qk.py: one head's queries and keys (AttentionViz). From the vectors the view returns, q·k/√d_k is
the model's pre-softmax score, and after the scaling and translation the view applies the softmax is still the
model's own attention, for every family the text tabs run (LLaMA recipe with GQA, RoPE and q/k/v biases; GPT-2;
pre- and post-norm classifiers; BERT; the translator's encoder; Hugging Face GPT-2, LLaMA and BERT folders against
transformers' own query and key projections); the 2-D points are the PCA of the stacked vectors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from models.inspect.decompose import attention_scores
from models.inspect.qk import QKProjection, project, qk_projection
from tests.test_decompose import FAMILIES, IDS, _attention

torch.set_num_threads(2)


def softmax(s: np.ndarray) -> np.ndarray:
    s = np.asarray(s, np.float64)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def shown_scores(p: QKProjection) -> np.ndarray:
    """q'·k'/√d_k of the translated, scaled vectors the view projects (float64), the causal mask applied."""
    q, k = p.shown_queries.astype(np.float64), p.shown_keys.astype(np.float64)
    s = q @ k.T / math.sqrt(p.d_head)
    if p.causal:
        s[np.triu_indices(len(s), 1)] = -np.inf
    return s


def raw_scores(p: QKProjection) -> np.ndarray:
    s = p.queries.astype(np.float64) @ p.keys.astype(np.float64).T / math.sqrt(p.d_head)
    if p.causal:
        s[np.triu_indices(len(s), 1)] = -np.inf
    return s


def check_view(p: QKProjection, scores: np.ndarray, weights: np.ndarray) -> None:
    """The view's vectors against the model's pre-softmax ``scores`` (T, T) and attention ``weights`` (T, T)."""
    finite = np.isfinite(scores)
    assert (np.isfinite(p.scores) == finite).all()
    # before translation: q·k/√d_k is the score
    np.testing.assert_allclose(raw_scores(p)[finite], scores[finite], atol=1e-5, rtol=0)
    np.testing.assert_allclose(p.scores[finite], scores[finite], atol=1e-5, rtol=0)
    # after scaling and translation: the score plus a constant per row (α q_i·c), so the softmax is the model's
    shifted = shown_scores(p)
    row_constant = p.shown_queries.astype(np.float64) @ p.shift.astype(np.float64) / math.sqrt(p.d_head)
    np.testing.assert_allclose((shifted - row_constant[:, None])[finite], scores[finite], atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(softmax(shifted), weights, atol=1e-5)
    np.testing.assert_allclose(p.weights, weights, atol=1e-5)
    # the two centroids coincide, and (scaled) both clouds have the same mean spread about them
    np.testing.assert_allclose(p.shown_keys.mean(0), p.shown_queries.mean(0), atol=1e-4)
    spread = [np.linalg.norm(v - v.mean(0), axis=1).mean() for v in (p.shown_queries, p.shown_keys)]
    assert abs(spread[0] - spread[1]) < 1e-4 * max(spread)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_view_vectors_give_the_models_scores_and_attention(family: str) -> None:
    model = FAMILIES[family]()
    weights = _attention(model, IDS)  # the model's own attention, its explicit path
    scores = attention_scores(model, IDS)  # the model's pre-softmax scores (the walk)
    layers, heads = weights.shape[:2]
    for layer in range(layers):
        for head in range(heads):
            p = qk_projection(model, IDS, layer, head)
            assert p.queries.dtype == p.keys.dtype == p.points.dtype == np.float32
            assert p.queries.shape == p.keys.shape == (len(IDS), model.config.d_model // model.config.n_heads)
            assert p.points.shape == (2 * len(IDS), 2)
            check_view(p, scores[layer, head], weights[layer, head])
    assert p.causal == (family.startswith(("llama", "gpt2")))


def test_grouped_query_heads_share_their_keys() -> None:
    """LLaMA with 6 heads over 2 key-value heads: heads 0-2 read one set of keys, 3-5 the other."""
    model = FAMILIES["llama-gqa"]()
    keys = [qk_projection(model, IDS, 1, h).keys for h in range(6)]
    np.testing.assert_array_equal(keys[0], keys[2])
    np.testing.assert_array_equal(keys[3], keys[5])
    assert not np.allclose(keys[0], keys[3])


def test_points_are_the_pca_of_the_stacked_vectors() -> None:
    """The 2-D points against numpy: the eigenvectors of the stack's covariance (another route than the SVD the
    view uses), each axis up to its sign; the explained fractions are the top eigenvalues over their sum."""
    p = qk_projection(FAMILIES["gpt2"](), IDS, 2, 1)
    stack = np.concatenate([p.shown_queries, p.shown_keys]).astype(np.float64)
    centred = stack - stack.mean(0)
    values, vectors = np.linalg.eigh(centred.T @ centred)  # ascending
    top = vectors[:, ::-1][:, :2]
    expected = centred @ top
    for axis in range(2):
        sign = np.sign(expected[:, axis] @ p.points[:, axis])
        np.testing.assert_allclose(p.points[:, axis], sign * expected[:, axis], atol=1e-4)
        assert abs(abs(p.axes[axis] @ top[:, axis]) - 1) < 1e-5
        assert p.axes[axis][np.abs(p.axes[axis]).argmax()] > 0  # the sign convention: the largest loading is +
    np.testing.assert_allclose(p.explained, values[::-1][:2] / values.sum(), atol=1e-5)
    # queries first, keys after: the points are the projections of those rows
    np.testing.assert_allclose(p.points[: len(IDS)], (p.shown_queries - stack.mean(0)) @ p.axes.T, atol=1e-4)


def test_unscaled_view_only_translates() -> None:
    model = FAMILIES["bert"]()
    p = qk_projection(model, IDS, 1, 2, scale=False)
    assert p.alpha == 1.0
    np.testing.assert_allclose(p.shown_queries, p.queries)
    np.testing.assert_allclose(p.shift, p.queries.mean(0) - p.keys.mean(0), atol=1e-5)
    check_view_softmax = softmax(shown_scores(p))
    np.testing.assert_allclose(check_view_softmax, _attention(model, IDS)[1, 2], atol=1e-5)


def test_projection_of_degenerate_inputs() -> None:
    """One token (a query and a key that translation puts on the same point) and a 1-dimensional head."""
    alpha, shift, points, axes, explained = project(np.ones((1, 4)), np.full((1, 4), 3.0))
    assert alpha == 1.0 and np.allclose(points, 0) and np.allclose(explained, 0)
    np.testing.assert_allclose(shift, 1.0 - 3.0)
    _, _, points, axes, explained = project(np.arange(3.0)[:, None], np.arange(3.0)[:, None] * 2)
    assert points.shape == (6, 2) and np.allclose(points[:, 1], 0) and explained[0] == pytest.approx(1.0)


@pytest.mark.parametrize("bad,message", [(dict(layer=3), "layer 3 is outside 0..2"),
                                         (dict(layer=-1), "layer -1"), (dict(head=6), "head 6 is outside 0..5"),
                                         (dict(ids=[]), "empty")])
def test_out_of_range_is_refused_in_words(bad: dict, message: str) -> None:
    args = dict(ids=IDS, layer=0, head=0) | bad
    with pytest.raises(ValueError, match=message):
        qk_projection(FAMILIES["gpt2"](), args["ids"], args["layer"], args["head"])


def test_half_precision_weights_give_float32() -> None:
    """A bfloat16 model: the vectors are read in float64 from its own (bf16) weights and returned as float32; the
    scores are the walk's scores of that model."""
    model = FAMILIES["llama-half-qkv-bias"]().to(torch.bfloat16)
    p = qk_projection(model, IDS, 2, 4)
    assert p.queries.dtype == np.float32 and np.isfinite(p.points).all()
    scores = attention_scores(model, IDS)[2, 4]
    finite = np.isfinite(scores)
    np.testing.assert_allclose(raw_scores(p)[finite], scores[finite], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device here"))])
def test_follows_the_models_device(device: str) -> None:
    """The walk runs where the model's weights are (its vectors come back on that device) and the view equals the
    CPU one; a bfloat16 copy there still answers in float32, near the float32 view."""
    from models.inspect.qk import qk_vectors

    model = FAMILIES["llama-gqa-qkv-bias"]()
    reference = qk_projection(model, IDS, 1, 4)
    moved = model.to(device)
    q, k, _ = qk_vectors(moved, IDS, 1)
    assert q.device.type == k.device.type == device
    p = qk_projection(moved, IDS, 1, 4)
    np.testing.assert_allclose(p.queries, reference.queries, atol=1e-5)
    np.testing.assert_allclose(p.points, reference.points, atol=1e-4)
    np.testing.assert_allclose(p.weights, reference.weights, atol=1e-5)
    half = qk_projection(moved.to(torch.bfloat16), IDS, 1, 4)
    assert half.points.dtype == half.weights.dtype == np.float32
    np.testing.assert_allclose(half.weights, reference.weights, atol=0.05)  # bf16 weights: ~3 significant digits


# ------------------------------------------------------------------------- transformers as the reference
def _hf_qk(hf, kind: str, ids: list[int], layer: int) -> tuple[np.ndarray, np.ndarray]:
    """transformers' own queries and keys (heads, T, d) of ``layer``, from its hidden states and its modules."""
    x = torch.tensor([ids])
    with torch.no_grad():
        if kind == "gpt2":
            out = hf(x, output_hidden_states=True)
            block = hf.transformer.h[layer]
            q, k, _ = block.attn.c_attn(block.ln_1(out.hidden_states[layer])).split(hf.config.n_embd, dim=2)
            h = hf.config.n_head
            heads = [t.view(1, len(ids), h, -1).transpose(1, 2)[0] for t in (q, k)]
            return heads[0].numpy(), heads[1].numpy()
        if kind == "bert":
            out = hf(x, output_hidden_states=True)
            att = hf.bert.encoder.layer[layer].attention.self
            h = hf.config.num_attention_heads
            q, k = (m(out.hidden_states[layer]).view(1, len(ids), h, -1).transpose(1, 2)[0] for m in (att.query,
                                                                                                   att.key))
            return q.numpy(), k.numpy()
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        out = hf(x, output_hidden_states=True)
        block = hf.model.layers[layer]
        hidden = block.input_layernorm(out.hidden_states[layer])
        c = hf.config
        d = c.hidden_size // c.num_attention_heads
        q = block.self_attn.q_proj(hidden).view(1, len(ids), -1, d).transpose(1, 2)
        k = block.self_attn.k_proj(hidden).view(1, len(ids), -1, d).transpose(1, 2)
        cos, sin = hf.model.rotary_emb(hidden, torch.arange(len(ids))[None])
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k = k.repeat_interleave(c.num_attention_heads // c.num_key_value_heads, 1)
        return q[0].numpy(), k[0].numpy()


def test_hugging_face_folders_against_transformers(tmp_path) -> None:
    """GPT-2, LLaMA (GQA, rotate-half RoPE) and BERT folders written by transformers, read into the project's
    classes: the view's queries and keys are transformers' own projections (after its RoPE), and their softmax is
    transformers' attention."""
    import models
    from models.inputs.tokenizer import encode_input
    from tests.tiny import tiny_bert_classifier_folder, tiny_gpt2_folder, tiny_llama_folder

    ids = [5, 17, 33, 2, 40, 41, 7, 9, 11, 12]
    folders = {"gpt2": tiny_gpt2_folder, "llama": tiny_llama_folder, "bert": tiny_bert_classifier_folder}
    for kind, make in folders.items():
        hf = make(tmp_path / kind)
        model = models.load(str(tmp_path / kind))
        seq = ids if kind != "bert" else encode_input(model.tokenizer, "the cat sat on the mat", 32,
                                                      type(model).__name__)[0]
        with torch.no_grad():
            reference = torch.stack(hf(torch.tensor([seq]), output_attentions=True).attentions, 1)[0].numpy()
        for layer in range(reference.shape[0]):
            q_ref, k_ref = _hf_qk(hf, kind, list(seq), layer)
            for head in range(reference.shape[1]):
                p = qk_projection(model, seq, layer, head)
                np.testing.assert_allclose(p.queries, q_ref[head], atol=1e-5, err_msg=f"{kind} {layer} {head}")
                np.testing.assert_allclose(p.keys, k_ref[head], atol=1e-5, err_msg=f"{kind} {layer} {head}")
                np.testing.assert_allclose(softmax(shown_scores(p)), reference[layer, head], atol=1e-5)


@pytest.mark.parametrize("name", ["gpt-tiny", "sst2", "agnews", "minilm-sst2", "translator-en-de"])
def test_shipped_checkpoints(name: str) -> None:
    """The shipped models of the three text tabs, fp16-packed as the app serves them, on a real sentence."""
    import models
    from models.decoding.packed import pack_linears
    from models.families.gpt import GPT
    from models.inputs.tokenizer import encode_input

    model = models.load(name)
    pack_linears(model)
    text = "a man in a blue shirt is riding a bicycle down the street"
    if isinstance(model, GPT):
        ids = model.encode_prompt(text)[0]
    else:
        ids = encode_input(model.tokenizer, text, model.config.max_len, type(model).__name__)[0]
    weights, scores = _attention(model, ids), attention_scores(model, ids)
    for layer in range(weights.shape[0]):
        for head in (0, weights.shape[1] - 1):
            check_view(qk_projection(model, ids, layer, head), scores[layer, head], weights[layer, head])


# ------------------------------------------------------------------------------------------------ the figure
def _trace(fig, name: str):
    return next(d for d in fig.data if d.name == name)


def test_figure_draws_both_sets_labels_and_the_chosen_querys_keys() -> None:
    from viz.qk import qk_scatter

    rng = np.random.default_rng(0)
    tokens = ["<s>", "the", "cat", "</s>", "<img src=x>", "sat"]
    w = softmax(rng.normal(size=(6, 6)))
    points = rng.normal(size=(12, 2))
    fig = qk_scatter(points, tokens, w, title="Queries and keys", query=2, explained=[0.6, 0.25], top_k=3)
    q, k = _trace(fig, "queries"), _trace(fig, "keys")
    np.testing.assert_allclose(np.c_[q.x, q.y], points[:6], atol=1e-6)
    np.testing.assert_allclose(np.c_[k.x, k.y], points[6:], atol=1e-6)
    assert q.marker.symbol != k.marker.symbol and q.marker.color != k.marker.color
    assert list(q.customdata) == list(range(6)) and "&lt;/s&gt;" in q.text[3] and "<img" not in "".join(q.text)
    lines = [d for d in fig.data if d.mode == "lines"]
    top = list(np.argsort(-w[2])[:3])
    assert len(lines) == 3
    for line, j in zip(lines, top):  # from the query's point to each strongest key's point, strongest first
        np.testing.assert_allclose([line.x[0], line.y[0], line.x[1], line.y[1]], [*points[2], *points[6 + j]],
                                   atol=1e-6)
        assert f"{w[2, j]:.2f}" in line.name
    assert lines[0].line.width >= lines[-1].line.width
    assert "60% of the variance" in fig.layout.xaxis.title.text and "25%" in fig.layout.yaxis.title.text
    assert fig.layout.yaxis.scaleanchor == "x"
    with pytest.raises(ValueError, match="points must be"):
        qk_scatter(points[:5], tokens, w, title="x")


def test_long_input_is_capped_within_the_figure_budget() -> None:
    """5,000 tokens: one in three drawn (the subtitle says so), the chosen query and its keys always among them, the
    figure well under 2 MB."""
    from viz.qk import qk_scatter

    t = 5000
    rng = np.random.default_rng(1)
    w = np.zeros((t, t), np.float32)
    w[:, 4001] = 1.0
    fig = qk_scatter(rng.normal(size=(2 * t, 2)), [f"token{i}" for i in range(t)], w, title="long", query=4000)
    q = _trace(fig, "queries")
    assert 4000 in q.customdata and 4001 in _trace(fig, "keys").customdata and len(q.customdata) < 2000
    assert "one in 3 drawn" in fig.layout.title.text
    assert len(fig.to_json()) < 2_000_000


# ------------------------------------------------------------------------------------- the tabs' section
@pytest.fixture()
def tiny(tiny_checkpoints, monkeypatch: pytest.MonkeyPatch):
    from serving import catalogue, store
    from tabs.sections import qk as section

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    monkeypatch.setattr(section, "_CACHE", type(section._CACHE)())
    return tiny_checkpoints


def _tab_states() -> dict:
    """Each text tab's kept state after its own handler ran, what its section reads, and the attention it keeps."""
    from tabs import classify, generate, translate

    gen = generate.generate("a dog runs on the", 4)[6]
    cls = classify.classify("a warm , funny film .")[5]
    tr = translate.translate("A man rides a bike.")[6]
    return {"generate": (generate.sequence, gen, gen["result"].attention["decoder"]),
            "classify": (classify.sequence, cls, cls["result"].attention["encoder"]),
            "translate": (translate.sequence, "A man rides a bike.", tr.attention["encoder"])}


def test_section_draws_each_tabs_kept_input(tiny) -> None:
    """Generate, Classify and Translate (its encoder): the points are the view of the kept input, and the weights
    the lines come from are the attention the tab itself keeps and draws."""
    from tabs.sections import qk as section

    for tab, (sequence, state, amap) in _tab_states().items():
        name, ids, tokens = sequence(state)
        assert tokens == amap.queries, tab
        for layer, head in [(0, 0), (amap.layers - 1, amap.heads - 1)]:
            note, fig, p = section.qk_view(name, ids, tokens, layer, head, -1)
            np.testing.assert_allclose(p.weights, amap.weights[layer, head], atol=1e-5, err_msg=tab)
            reference = qk_projection(section.get_model(name), ids, layer, head)
            np.testing.assert_allclose(p.points, reference.points, atol=1e-5)
            q = _trace(fig, "queries")
            np.testing.assert_allclose(np.c_[q.x, q.y], p.points[: len(ids)], atol=1e-6)
            assert f"Layer {layer}, head {head}" in note and f"layer {layer} · head {head}" in fig.layout.title.text
        drawn = section.draw(sequence, state, 0, 1, 0, False)
        assert "not scaled" in drawn[1].layout.title.text


def test_section_keeps_a_layers_vectors(tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another head or query of the same layer and input runs no model; another layer does."""
    import models.inspect.qk as mq
    from tabs.sections import qk as section

    sequence, state, _ = _tab_states()["generate"]
    calls = []
    real = mq.qk_vectors
    monkeypatch.setattr(mq, "qk_vectors", lambda *a: calls.append(a[2]) or real(*a))
    for layer, head, query in [(1, 0, -1), (1, 3, 2), (1, 2, 0), (0, 1, -1)]:
        section.draw(sequence, state, layer, head, query, True)
    assert calls == [1, 0]


def test_section_follows_a_run(tiny) -> None:
    """After a run the layer and head boxes name the model's range; a drawn figure is drawn again."""
    from tabs.sections import qk as section

    sequence, state, amap = _tab_states()["classify"]
    layer_u, head_u, query_u, note, fig = section.follow(sequence, state, False, 7, 1, -1, True)
    assert (layer_u["value"], head_u["value"]) == (amap.layers - 1, 1)
    assert layer_u["label"] == f"layer (0–{amap.layers - 1})" and head_u["label"] == f"head (0–{amap.heads - 1})"
    assert note == {"__type__": "update"} and fig == {"__type__": "update"} and query_u["value"] == -1
    _, _, query_u, note, fig = section.follow(sequence, state, True, 0, 1, 99, True)  # 99: past this input's end
    assert query_u["value"] == -1 and note.startswith("**Layer 0, head 1") and _trace(fig, "keys") is not None
    assert section.follow(sequence, None, True, 0, 0, -1, True) == tuple({"__type__": "update"} for _ in range(5))


@pytest.mark.parametrize("args,message", [
    (dict(state=None), "Run the model first"), (dict(state="  "), "Run the model first"),
    (dict(layer=9), "layer 9 is outside"),
    (dict(head=-9), "head -9 is outside"), (dict(query=500), "query position 500 is outside"),
    (dict(head="x"), "whole number"),
])
def test_bad_input_is_refused_in_words(tiny, args: dict, message: str) -> None:
    import gradio as gr

    from tabs.sections import qk as section

    sequence, state, _ = _tab_states()["generate"]
    call = dict(state=state, layer=0, head=0, query=-1) | args
    with pytest.raises(gr.Error, match=message):
        section.draw(sequence, call["state"], call["layer"], call["head"], call["query"], True)
    with pytest.raises(gr.Error, match="Not a point"):
        section.clicked("nothing")
    assert section.clicked("7,3") == 7


def test_api_draws_after_the_tabs_own_action(app_url) -> None:
    """/generate_qk and /classify_qk in the client's session after that tab's action; /translate_qk on a text."""
    from gradio_client import Client

    client = Client(app_url, verbose=False)
    client.predict("a dog runs on the", 4, api_name="/generate")
    note, fig = client.predict(1, 2, -1, True, api_name="/generate_qk")
    assert note.startswith("**Layer 1, head 2")
    from tests.test_api import _figure_data

    traces = {d.get("name"): d for d in _figure_data(fig)}
    assert len(traces["queries"]["x"]) == len(traces["keys"]["x"]) == len(traces["queries"]["customdata"])
    client.predict("a warm , funny film .", api_name="/classify")
    assert client.predict(0, 0, 0, False, api_name="/classify_qk")[0].startswith("**Layer 0, head 0")
    assert client.predict("A man rides a bike.", 0, 1, -1, True, api_name="/translate_qk")[0].startswith(
        "**Layer 0, head 1")
    with pytest.raises(Exception, match="head 99 is outside"):
        client.predict("A man rides a bike.", 0, 99, -1, True, api_name="/translate_qk")
    with pytest.raises(Exception, match="Run the model first"):
        client.predict("", 0, 0, -1, True, api_name="/translate_qk")
