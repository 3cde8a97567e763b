"""The HTTP API through gradio_client against a launched server."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest

from tests.conftest import HUB_GPT2


@pytest.fixture(scope="module")
def client(app_url: str):
    from gradio_client import Client

    return Client(app_url, verbose=False)


def _figure_data(value) -> list[dict]:
    """Traces of a gr.Plot value, with Plotly's binary arrays ({dtype, bdata, shape}) decoded."""
    plot = value["plot"] if isinstance(value, dict) and "plot" in value else value
    data = json.loads(plot)["data"] if isinstance(plot, str) else plot["data"]
    for trace in data:
        for key, val in trace.items():
            if isinstance(val, dict) and "bdata" in val:
                arr = np.frombuffer(base64.b64decode(val["bdata"]), dtype=np.dtype(val["dtype"]))
                shape = val.get("shape")
                if isinstance(shape, str):
                    shape = [int(n) for n in shape.split(",")]
                trace[key] = arr.reshape(shape) if shape else arr
    return data


def test_playground_api_main_input_alone(client) -> None:
    fig, entropy, summary = client.predict(5, api_name="/playground")
    data = _figure_data(fig)
    assert [t["type"] for t in data] == ["heatmap"] * 8
    weights = np.array(data[7]["z"], dtype=float)
    assert weights.shape == (5, 5)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=5e-3)
    assert "entropy" in summary


def test_playground_api_causal_unscaled(client) -> None:
    fig, _, summary = client.predict(4, 64, 3, "causal", False, api_name="/playground")
    weights = np.array(_figure_data(fig)[7]["z"], dtype=float)
    assert np.allclose(np.triu(np.nan_to_num(weights), 1), 0)
    assert "Scale factor: **1**" in summary


def test_translate_api(client) -> None:
    out = client.predict("A man is riding a bicycle.", api_name="/translate")
    text, notice, attn, stats, tree, align = out[:6]
    assert isinstance(text, str) and "Beam size 5" in notice
    assert [t["type"] for t in _figure_data(attn)] == ["heatmap"]
    cross = np.array(_figure_data(align)[0]["z"], dtype=float)
    np.testing.assert_allclose(cross.sum(axis=1), 1.0, atol=2e-3)  # each target row over the source
    assert len(_figure_data(tree)) >= 2  # edges and nodes
    npz = next(o for o in out if isinstance(o, str) and o.endswith(".npz"))
    with np.load(npz) as arrays:  # the .npz download, fetched by the client
        n_src, n_tgt = len(arrays["source_tokens"]), len(arrays["target_tokens"])
        assert arrays["cross"].shape[-2:] == (n_tgt, n_src)
        assert arrays["encoder"].shape[-2:] == (n_src, n_src)


def test_classify_api(client) -> None:
    verdict, probs, html = client.predict("a warm , funny film .", api_name="/classify")[:3]
    assert "negative" in verdict or "positive" in verdict
    bars = _figure_data(probs)[0]
    assert sorted(bars["y"]) == ["negative", "positive"]
    assert "warm,funnyfilm." in re.sub(r"<[^>]+>|\s|▁", "", html)  # every token shown, in order
    verdict = client.predict("The bank raised rates.", "AG News topic", api_name="/classify")[0]
    assert any(label in verdict for label in ("World", "Sports", "Business", "Sci/Tech"))


def test_classify_image_api(client, tmp_path) -> None:
    from gradio_client import handle_file
    from PIL import Image

    path = tmp_path / "photo.jpg"
    Image.new("RGB", (640, 480), (240, 240, 235)).save(path)
    out = client.predict(handle_file(str(path)), api_name="/classify_image")
    bars = _figure_data(out[0])[0]
    assert len(bars["y"]) == 5
    assert out[6] == "" or isinstance(out[6], str)


def test_describe_api(client) -> None:
    """Image + text through the API: an example scene, a question, the answer and its figures, the .npz with the
    language model's attention (causal rows summing to 1) and each image token's pixels."""
    from gradio_client import handle_file

    from tabs.describe import EXAMPLE_SCENES

    out = client.predict(handle_file(EXAMPLE_SCENES[8]), "vlm-fashion", "what is at the top left ?", 6, 1,
                         api_name="/describe")
    answer, _notice, verdict, looked = out[:4]
    assert "what is at the top left ?" in answer and "**[" in answer
    assert "attention" in verdict.lower() or "disagree" in verdict
    heat = next(t for t in _figure_data(looked) if t["type"] == "heatmap")
    assert np.asarray(heat["z"]).shape == (8, 8)  # 64×64 pixels, 8-pixel patches
    with np.load(_npz(out)) as arrays:
        w, boxes = arrays["attention"], arrays["image_boxes"]
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-4)
        assert boxes.shape == (64, 4) and (boxes[:, 2:] - boxes[:, :2] == 8).all()
        assert len(arrays["ids"]) == w.shape[-1]
    with pytest.raises(Exception, match="(?i)unknown model|not in the list of choices"):  # never a path
        client.predict(handle_file(EXAMPLE_SCENES[0]), "../checkpoints/gpt-tiny", api_name="/describe")


def test_swin_windows_api(client) -> None:
    parts, rolled, regions, mask, masks, note = client.predict(8, api_name="/swin_windows")
    assert "4 windows of 4×4" in note
    z = np.array(_figure_data(mask)[0]["z"], dtype=float)
    assert z.shape == (16, 16) and set(np.unique(z)) <= {0.0, -100.0}


def test_positional_encoding_api(client) -> None:
    heat = client.predict(32, api_name="/positional_encoding")[0]
    z = np.array(_figure_data(heat)[0]["z"], dtype=float)
    assert z.shape == (32, 128)
    np.testing.assert_allclose(z[5, 0], np.sin(5.0), atol=1e-3)  # PE(pos, 0) = sin(pos)
    np.testing.assert_allclose(z[5, 1], np.cos(5.0), atol=1e-3)


def _npz(out) -> str:
    return next(o for o in out if isinstance(o, str) and o.endswith(".npz"))


@pytest.mark.parametrize("model", ["trained from scratch", "MiniLM (pretrained, fine-tuned)"])
def test_classify_api_every_explanation_and_a_target(client, model) -> None:
    """explanation and target, appended at the end of /classify: every method, toward a chosen class."""
    from models.outputs import METHODS

    for method in METHODS:
        out = client.predict("a warm , funny film .", "SST-2 sentiment", model, 0, "mean", "heatmap", method,
                             "negative", api_name="/classify")
        with np.load(_npz(out)) as arrays:
            assert str(arrays["attribution_method"]) == method and str(arrays["attribution_target"]) == "negative"
            assert arrays["attribution"].dtype == np.float32
            assert arrays["attribution"].shape == (len(arrays["tokens"]),) and np.isfinite(arrays["attribution"]).all()
        said = "· the same for every class (p(negative) = " if method in ("attention", "rollout") else "toward negative"
        assert f"{METHODS[method]} {said}" in out[2]
    with pytest.raises(Exception, match="Unknown class 'sports'"):
        client.predict("a film", "SST-2 sentiment", model, 0, "mean", "heatmap", "rollout", "sports",
                       api_name="/classify")
    with pytest.raises(Exception, match="lime is not in the list of choices"):  # Gradio checks the choice
        client.predict("a film", "SST-2 sentiment", model, 0, "mean", "heatmap", "lime", "", api_name="/classify")


def test_classify_image_api_every_explanation_and_a_target(client) -> None:
    from gradio_client import handle_file

    from models.outputs import METHODS
    from tabs.common import EXAMPLE_IMAGES

    for model, methods in (("vit-fashion", list(METHODS)), ("swin-fashion", ["gradxinput", "integrated_gradients"])):
        for method in methods:
            out = client.predict(handle_file(EXAMPLE_IMAGES[0]), model, 5, 0, "mean", "CLS → patches", method,
                                 "Sneaker", api_name="/classify_image")
            with np.load(_npz(out)) as arrays:
                assert str(arrays["attribution_method"]) == method and str(arrays["attribution_target"]) == "Sneaker"
                assert arrays["attribution"].ndim == 2 and np.isfinite(arrays["attribution"]).all()
    # Swin has no global attention: asking for rollout explains by gradient × input and says so
    out = client.predict(handle_file(EXAMPLE_IMAGES[0]), "swin-fashion", 5, 0, "mean", "CLS → patches", "rollout",
                         "", api_name="/classify_image")
    assert "not offered" in out[6]
    with np.load(_npz(out)) as arrays:
        assert str(arrays["attribution_method"]) == "gradxinput"


def test_classify_api_with_the_pretrained_minilm(client) -> None:
    verdict, probs, html, _attn, shares = client.predict("the film is warm and funny .", "SST-2 sentiment",
                                                         "MiniLM (pretrained, fine-tuned)", api_name="/classify")[:5]
    assert "negative" in verdict or "positive" in verdict
    assert "[CLS]" in html and "[SEP]" in html  # WordPiece specials, as the model saw them
    assert len(_figure_data(shares)) >= 4  # share to [CLS], [SEP], previous, next


def test_upload_over_the_size_limit_is_refused_and_the_server_keeps_serving(client, tmp_path) -> None:
    from gradio_client import handle_file

    from models.limits import MAX_UPLOAD_MB

    big = tmp_path / "big.png"
    big.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * (MAX_UPLOAD_MB * 1024 * 1024 + 1024))
    with pytest.raises(Exception, match=r"(?i)(too large|exceeds|size|413)"):
        client.predict(handle_file(str(big)), api_name="/classify_image")
    assert client.predict(3, api_name="/playground")[2].startswith("Scale factor")


def test_generate_api(client) -> None:
    out = client.predict("A man in a blue shirt", api_name="/generate")  # 20 new tokens, greedy, gpt-tiny
    text, notice, html = out[:3]
    assert isinstance(text, str) and "20 new tokens · greedy" in notice and "atlas-generation" in html
    npz = next(o for o in out if isinstance(o, str) and o.endswith(".npz"))
    with np.load(npz) as arrays:
        t = len(arrays["tokens"])
        assert arrays["attention"].shape[-2:] == (t, t) and arrays["step_probs"].shape == (20, 5)
        assert np.allclose(np.triu(arrays["attention"], 1), 0)  # causal
        np.testing.assert_allclose(arrays["attention"].sum(-1), 1.0, atol=1e-4)
    # sampling with every decoding parameter, in the documented order
    sampled = client.predict("A man in a blue shirt", 5, "gpt-tiny", "sample", 0.8, 10, 0.9, 7, api_name="/generate")
    again = client.predict("A man in a blue shirt", 5, "gpt-tiny", "sample", 0.8, 10, 0.9, 7, api_name="/generate")
    assert "5 new tokens · sample" in sampled[1] and sampled[0] == again[0]  # seeded


def test_head_roles_api(client) -> None:
    roles, stripe, losses, summary = client.predict("gpt-tiny", 30, 0, api_name="/head_roles")
    assert [t["type"] for t in _figure_data(roles)] == ["heatmap"] * 4
    z = np.array(_figure_data(stripe)[0]["z"], dtype=float)
    assert z.shape == (61, 61) and np.allclose(np.triu(z, 1), 0)
    assert [len(t["y"]) for t in _figure_data(losses)] == [30, 30] and "strongest induction" in summary


def test_ablation_trained_swin_and_vit_positions_have_api_names(client) -> None:
    """The three actions that had no api_name: head ablation (on the client's last /generate, kept in its
    session), the trained Swin and the ViT's position embeddings."""
    client.predict("A man in a blue shirt", 4, api_name="/generate")
    note, change = client.predict(0, 1, 3, api_name="/ablate_head")
    assert note.startswith("Layer 1, head 3 switched off") and "KL" in note
    assert [t["name"] for t in _figure_data(change)] == ["full model", "head switched off"]
    attention, bias, note, head = client.predict("ankle-boot", 0, 5, api_name="/trained_swin")
    assert "Head 5 does not exist in block 0" in note and _figure_data(attention) and _figure_data(bias)
    embeddings = _figure_data(client.predict(api_name="/vit_positions"))
    assert embeddings and all(t["type"] == "heatmap" for t in embeddings)


def test_generate_with_configured_models_matches_transformers(configured_app) -> None:
    import torch
    from gradio_client import Client
    from transformers import PreTrainedTokenizerFast

    url, base, refs = configured_app
    client = Client(url, verbose=False)
    for name in ("cli-gpt2", "env-gpt2", HUB_GPT2):
        hf = refs[name]
        out = client.predict("the cat sat on", 8, name, api_name="/generate")
        npz = next(o for o in out if isinstance(o, str) and o.endswith(".npz"))
        folder = base / ("hub-source" if name == HUB_GPT2 else name)
        tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
        ids = tok("the cat sat on", return_tensors="pt")["input_ids"]
        with torch.no_grad():
            want = hf.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=hf.config.eos_token_id)[0]
        with np.load(npz) as arrays:
            assert list(arrays["tokens"]) == tok.convert_ids_to_tokens(want.tolist())
        assert out[0] == tok.decode(want[ids.shape[1]:], skip_special_tokens=True)


def test_classify_with_a_configured_bert_matches_transformers(configured_app) -> None:
    import torch
    from gradio_client import Client
    from transformers import PreTrainedTokenizerFast

    url, base, refs = configured_app
    client = Client(url, verbose=False)
    text = "the film is warm and funny ."
    out = client.predict(text, "AG News topic", "my-bert", api_name="/classify")  # the task is ignored
    npz = next(o for o in out if isinstance(o, str) and o.endswith(".npz"))
    tok = PreTrainedTokenizerFast(tokenizer_file=str(base / "my-bert" / "tokenizer.json"))
    with torch.no_grad():
        probs = torch.softmax(refs["my-bert"](**tok(text, return_tensors="pt")).logits[0], -1).numpy()
    with np.load(npz) as arrays:
        assert list(arrays["labels"]) == ["negative", "neutral", "positive"]
        np.testing.assert_allclose(arrays["probs"], probs, atol=1e-4)
    assert ["negative", "neutral", "positive"][int(np.argmax(probs))] in out[0]


def test_translate_with_a_configured_marian_matches_transformers(configured_app) -> None:
    """/translate's ``model`` (its last input) picks a Marian folder: the translation is transformers' beam-5
    output and the .npz cross-attention is transformers' for it; the trained translator stays the default."""
    import torch
    from gradio_client import Client

    url, _, refs = configured_app
    hf, tok = refs["my-marian"]
    client = Client(url, verbose=False)
    text = "Two young girls are playing with a dog."
    out = client.predict(text, 5, "cross", 0, "mean", "heatmap", "my-marian", api_name="/translate")
    enc = tok(text, return_tensors="pt")
    want = hf.generate(**enc, num_beams=5, early_stopping=True, max_new_tokens=2 * enc["input_ids"].shape[1] + 10,
                       length_penalty=1.0)[0]
    assert out[0] == tok.decode(want, skip_special_tokens=True)
    npz = next(o for o in out if isinstance(o, str) and o.endswith(".npz"))
    with torch.no_grad():
        ref = hf(**enc, decoder_input_ids=want[None, :-1] if want[-1] == 0 else want[None], output_attentions=True)
    with np.load(npz) as arrays:
        np.testing.assert_allclose(arrays["cross"], torch.stack(ref.cross_attentions, 1)[0].numpy(), atol=1e-4)
    with pytest.raises(Exception, match="no-such-model"):  # refused by name
        client.predict(text, 5, "cross", 0, "mean", "heatmap", "no-such-model", api_name="/translate")
    assert "Beam size 5" in client.predict(text, api_name="/translate")[1]  # the default: the trained translator


def test_translate_with_a_configured_t5_matches_transformers(configured_app) -> None:
    """/translate with ``model`` my-t5: transformers' beam-5 output for the sentence after T5's task prefix, its
    cross-attention in the .npz, the notice naming the prefix; /translate_qk's ``model`` (its last input) draws that
    T5's encoder (5 heads: head 4 exists there, not in the trained translator, the default); /t5_bias its buckets."""
    import torch
    from gradio_client import Client

    url, _, refs = configured_app
    hf, tok = refs["my-t5"]
    client = Client(url, verbose=False)
    text = "Two young girls are playing with a dog."
    out = client.predict(text, 5, "cross", 0, "mean", "heatmap", "my-t5", api_name="/translate")
    enc = tok("translate English to German: " + text, return_tensors="pt")
    want = hf.generate(**enc, num_beams=5, early_stopping=True, max_new_tokens=2 * enc["input_ids"].shape[1] + 10,
                       length_penalty=1.0)[0]
    assert out[0] == tok.decode(want, skip_special_tokens=True)
    assert "task prefix" in out[1] and "translate English to German" in out[1]
    npz = next(o for o in out if isinstance(o, str) and o.endswith(".npz"))
    with torch.no_grad():
        ref = hf(**enc, decoder_input_ids=want[None, :-1] if want[-1] == 1 else want[None], output_attentions=True)
    with np.load(npz) as arrays:
        np.testing.assert_allclose(arrays["cross"], torch.stack(ref.cross_attentions, 1)[0].numpy(), atol=1e-4)
        np.testing.assert_allclose(arrays["encoder"], torch.stack(ref.encoder_attentions, 1)[0].numpy(), atol=1e-4)
    assert client.predict(text, 2, 4, -1, True, "my-t5", api_name="/translate_qk")[0].startswith("**Layer 2, head 4")
    with pytest.raises(Exception, match="head 4 is outside"):  # without the model: the trained translator's 4 heads
        client.predict(text, 0, 4, -1, True, api_name="/translate_qk")
    note, fig = client.predict("my-t5", api_name="/t5_bias")
    assert "**my-t5**: 8 buckets" in note
    assert {d.get("name") for d in _figure_data(fig)} >= {"encoder (bidirectional)", "decoder (causal)", "head 4"}


def test_classify_with_a_configured_albert_matches_transformers(configured_app) -> None:
    import torch
    from gradio_client import Client

    url, _, refs = configured_app
    hf, tok = refs["my-albert"]
    out = Client(url, verbose=False).predict("the film is warm and funny .", "SST-2 sentiment", "my-albert",
                                             api_name="/classify")
    npz = next(o for o in out if isinstance(o, str) and o.endswith(".npz"))
    with torch.no_grad():
        probs = torch.softmax(hf(**tok("the film is warm and funny .", return_tensors="pt")).logits[0], -1).numpy()
    with np.load(npz) as arrays:
        np.testing.assert_allclose(arrays["probs"], probs, atol=1e-4)
    assert "shares one layer's weights across all 3 passes" in out[0]  # the model view's layers are passes


def test_hub_translator_not_in_the_cache_says_offline_quickly(configured_app) -> None:
    import time

    from gradio_client import Client

    url, _, _ = configured_app
    start = time.monotonic()
    with pytest.raises(Exception, match="offline"):
        Client(url, verbose=False).predict("A dog.", 1, "cross", 0, "mean", "heatmap", "Helsinki-NLP/opus-mt-en-de",
                                           api_name="/translate")
    assert time.monotonic() - start < 5


def test_classify_image_with_a_configured_vit_matches_transformers(configured_app, tmp_path) -> None:
    import torch
    from gradio_client import Client, handle_file
    from transformers import ViTImageProcessor

    from tests.test_vit_hf import photo

    url, base, refs = configured_app
    path = tmp_path / "photo.png"
    photo(1).save(path)
    out = Client(url, verbose=False).predict(handle_file(str(path)), "my-vit", 4, api_name="/classify_image")
    npz = next(o for o in out if isinstance(o, str) and o.endswith(".npz"))
    pixels = ViTImageProcessor.from_pretrained(base / "my-vit")(photo(1), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        probs = torch.softmax(refs["my-vit"](pixel_values=pixels).logits[0], -1).numpy()
    with np.load(npz) as arrays:
        assert list(arrays["labels"]) == ["cat", "dog", "bird", "fish"]
        np.testing.assert_allclose(arrays["probs"], probs, atol=1e-4)
        assert arrays["encoder"].shape == (2, 4, 17, 17)


def test_hub_model_not_in_the_cache_says_offline_quickly(configured_app) -> None:
    import time

    from gradio_client import Client

    url, _, _ = configured_app
    start = time.monotonic()
    with pytest.raises(Exception, match="offline"):
        Client(url, verbose=False).predict("the cat", 4, "openai-community/gpt2", api_name="/generate")
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("seed", [2**70, -1, 1e30, "abc", 2.5, True])
def test_every_seed_input_refuses_what_no_generator_takes(client, seed) -> None:
    """Seeds are 0 … 2⁶⁴ − 1 on every api_name that takes one; anything else is refused in words."""
    from gradio_client.exceptions import AppError

    calls = {"/generate": ("a dog", 3, "gpt-tiny", "sample", 1.0, 0, 1.0, seed), "/head_roles": ("gpt-tiny", 5, seed),
             "/playground": (4, 8, seed)}
    for api, args in calls.items():
        with pytest.raises(AppError, match=r"(?i)seed|minimum|number"):
            client.predict(*args, api_name=api)
    assert client.predict("gpt-tiny", 5, 2**64 - 1, api_name="/head_roles")[3].startswith("strongest")


def test_attention_why_on_configured_folders_matches_transformers(configured_app) -> None:
    """/attention_why on a Hugging Face GPT-2 folder and a BERT classifier: the terms sum to the score and the
    softmax row is transformers' own attention for the same tokens."""
    import torch
    from gradio_client import Client
    from transformers import PreTrainedTokenizerFast

    url, base, refs = configured_app
    client = Client(url, verbose=False)
    for name in ("cli-gpt2", "my-bert"):
        _, table = client.predict("the cat sat on the mat", name, -1, 1, -1, 0, api_name="/attention_why")
        assert abs(sum(c["value"] for c in table["components"]) - table["score"]) < 1e-4
        tok = PreTrainedTokenizerFast(tokenizer_file=str(base / name / "tokenizer.json"))
        ids = tok("the cat sat on the mat", return_tensors="pt")["input_ids"]
        assert len(table["tokens"]) == ids.shape[1]
        with torch.no_grad():
            want = refs[name](ids, output_attentions=True).attentions[-1][0, 1, -1].numpy()
        np.testing.assert_allclose(table["softmax_row"], want, atol=1e-4)


def _title(value) -> str:
    plot = value["plot"] if isinstance(value, dict) and "plot" in value else value
    layout = json.loads(plot)["layout"] if isinstance(plot, str) else plot["layout"]
    title = layout.get("title")
    return title.get("text", "") if isinstance(title, dict) else str(title or "")


LAYER_CASES = {  # action -> (arguments before and after layer, the heatmap's output index, its array in the .npz)
    "/classify": (("a warm , funny film .", "SST-2 sentiment", "trained from scratch"), ("mean", "heatmap"), 3,
                  "encoder"),
    "/translate": (("A man is riding a bicycle.", 2, "encoder"), ("mean", "heatmap"), 2, "encoder"),
    "/generate": (("A man in a blue shirt", 3, "gpt-tiny", "greedy", 1.0, 0, 1.0, 0), ("mean", "heatmap"), 4,
                  "attention"),
}


@pytest.mark.parametrize("layer", [0, -1])
@pytest.mark.parametrize("api", [*LAYER_CASES, "/classify_image"])
def test_every_main_action_draws_the_layer_it_is_asked_for(client, api, layer) -> None:
    """``layer`` of /classify, /translate, /generate and /classify_image is the layer drawn (0 = first, −1 = last):
    the heatmap's title names it and its cells are that layer's attention from the action's own .npz (mean of
    heads). The tiny checkpoints have 2 layers, so 0 and −1 differ."""
    if api == "/classify_image":
        from gradio_client import handle_file

        from tabs.common import EXAMPLE_IMAGES

        out = client.predict(handle_file(EXAMPLE_IMAGES[0]), "vit-fashion", 5, layer, "mean", "CLS → patches",
                             "attention", "", api_name=api)
        with np.load(_npz(out)) as arrays:
            drawn = layer % arrays["encoder"].shape[0]
        assert _title(out[1]).startswith(f"CLS → patch attention · layer {drawn}"), _title(out[1])
        assert _title(out[2]).endswith(f"every head of layer {drawn}"), _title(out[2])
        return
    before, after, at, key = LAYER_CASES[api]
    out = client.predict(*before, layer, *after, api_name=api)
    with np.load(_npz(out)) as arrays:
        weights = arrays[key]
    drawn = layer % weights.shape[0]
    assert f"layer {drawn} ·" in _title(out[at]), _title(out[at])
    z = np.array(_figure_data(out[at])[0]["z"], dtype=float)
    np.testing.assert_allclose(z, weights[drawn].mean(0), atol=1e-3)
