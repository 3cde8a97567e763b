"""The app's handlers called directly: damaged checkpoints disable only their tab; bad input is refused politely."""

from __future__ import annotations

import shutil
from pathlib import Path

import gradio as gr
import numpy as np
import pytest

from serving import catalogue, store
from tabs import common
from tabs.classify import classify
from tabs.playground import playground
from tabs.swin import swin_windows
from tabs.translate import translate
from tabs.vision import classify_image


@pytest.fixture()
def damaged(tiny_checkpoints: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the tiny checkpoints with the translator missing and the SST-2 weights altered."""
    root = tmp_path / "checkpoints"
    shutil.copytree(tiny_checkpoints, root)
    shutil.rmtree(root / "translator-en-de")
    weights = next((root / "sst2").glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    monkeypatch.setattr(catalogue, "CHECKPOINTS", root)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    return root


def test_missing_and_damaged_checkpoints_disable_only_their_tab(damaged: Path) -> None:
    with pytest.raises(gr.Error, match=r"translator-en-de.*git checkout -- checkpoints/translator-en-de"):
        translate("A dog runs.")
    with pytest.raises(gr.Error, match=r"sst2.*(sha256|hash).*python -m train.classifier --task sst2"):
        classify("a fine film .")
    verdict = classify("Stocks fell sharply.", "AG News topic")[0]  # the other models keep working
    assert any(label in verdict for label in ("World", "Sports", "Business", "Sci/Tech"))
    assert playground(4)[2].startswith("Scale factor")
    assert "translator-en-de" in catalogue.checkpoint_status("translator-en-de", "agnews")
    assert catalogue.checkpoint_status("agnews") == ""


@pytest.mark.parametrize("text", ["", "   \n\t  ", None])
def test_empty_text_is_refused_with_a_message(text) -> None:
    with pytest.raises(gr.Error, match="type some text"):
        classify(text)


def test_model_names_from_the_api_never_become_paths(tiny_checkpoints: Path, monkeypatch) -> None:
    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    with pytest.raises(gr.Error, match="Unknown model"):
        classify_image(common.EXAMPLE_IMAGES[0], "../../etc")
    # An unknown task or model choice is refused by name (issue 47: it used to fall back to sst2), never a path
    with pytest.raises(gr.Error, match="Unknown model 'nope'"):
        classify("a fine film .", "SST-2 sentiment", "nope")
    with pytest.raises(gr.Error, match="Unknown task '../../../x'"):
        classify("a fine film .", "../../../x", "trained from scratch")


def test_long_text_is_truncated_with_a_notice(tiny_checkpoints: Path, monkeypatch) -> None:
    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    verdict, *_rest, state, npz, _layer, _head = classify("good " * 10_000)
    assert "truncated" in verdict.lower()
    assert len(state["result"].tokens) <= 128
    with np.load(npz) as arrays:
        assert arrays["encoder"].shape[-1] == len(state["result"].tokens) == len(arrays["attribution"])


def test_swin_windows_pads_the_grid_to_the_window() -> None:
    parts, rolled, regions, mask, _, note = swin_windows(grid=9, window=4, shift=2, window_index=8)
    assert "padded to 12×12" in note and "9 windows of 4×4" in note and "not image" in note
    for fig in (parts, rolled, regions):  # the padding cells are labelled as such on every grid
        assert any((np.asarray(t.text) == "pad").any() for t in fig.data if getattr(t, "text", None) is not None)
    assert any(label.endswith(" pad") for label in mask.data[0].x)


def test_imagenet_choice_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not cached: a clear message within seconds. Cached (a random torchvision Swin-T): every figure."""
    import time

    import torch
    from torchvision.models import swin_t

    from models.io.pretrained import weights_path

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    start = time.monotonic()
    with pytest.raises(gr.Error, match="ImageNet weights for swin_t are not available"):
        classify_image(common.EXAMPLE_IMAGES[0], "Swin-T (ImageNet)")
    assert time.monotonic() - start < 30  # never a hang (generous: a busy CI machine)
    path = weights_path("swin_t")
    path.parent.mkdir(parents=True)
    torch.manual_seed(0)
    torch.save(swin_t().state_dict(), path)
    probs, overlay, heads, patch, distance, seen, *_ = classify_image(common.EXAMPLE_IMAGES[0], "Swin-T (ImageNet)")
    assert len(probs.data[0].y) == 5 and seen.shape[:2] == (224, 224)  # the RGB centre crop the model saw
    assert overlay is not None and heads is not None and patch is not None and distance is not None


@pytest.mark.parametrize("model,pooling", [("trained from scratch", "cls"),
                                           ("MiniLM (pretrained, fine-tuned)", "mean")])
def test_the_colouring_follows_how_the_model_pools(tiny_checkpoints: Path, monkeypatch, model: str,
                                                    pooling: str) -> None:
    """The tiny classifiers pool as their configs' defaults say (from scratch: [CLS]-like <s>; MiniLM: mean),
    the shipped ones all by the mean: the highlight's label and weights follow the model, not the first token."""
    import html
    import re

    from models.analysis import pooled_rollout

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    _verdict, _probs, highlight, *_rest, state, _npz, _layer, _head = classify("a fine film .", "SST-2 sentiment",
                                                                             model)
    from viz.attribution import merge_pieces

    result = state["result"]
    assert result.pooling == pooling
    label = "the position the classifier reads" if pooling == "cls" else "every token (the classifier reads their mean)"
    top = result.labels[int(np.argmax(result.probs))]
    assert f"Attention rollout · the same for every class (p({top}) = " in html.unescape(highlight)
    assert f"read from {label}" in html.unescape(highlight)
    shown = [float(v) for v in re.findall(r'title="[^"]*: ([-+][0-9.e+-]+)"', highlight)]
    want = pooled_rollout(result.attention["encoder"].weights, pooling)
    np.testing.assert_allclose(state["attributions"]["rollout"].values, want, atol=1e-6)
    np.testing.assert_allclose(shown, merge_pieces(result.tokens, want)[1], rtol=1e-3, atol=1e-6)  # words, summed
    other = pooled_rollout(result.attention["encoder"].weights, "mean" if pooling == "cls" else "cls")
    assert not np.allclose(shown, merge_pieces(result.tokens, other)[1], atol=1e-4)


def test_the_model_store_serves_packed_layers(monkeypatch) -> None:
    """models.load returns the plain model; the app's store packs the large layers (models.decoding.packed)."""
    import models
    from models.decoding.packed import PackedLinear, supported

    monkeypatch.setattr(catalogue, "CHECKPOINTS", common.ROOT / "checkpoints")
    plain = models.load(common.ROOT / "checkpoints" / "translator-en-de")
    served = store.ModelStore().get("translator-en-de")
    assert not any(type(m) is PackedLinear for m in plain.modules())
    c = plain.config
    assert sum(type(m) is PackedLinear for m in served.modules()) == ((2 * (c.n_enc_layers + c.n_dec_layers) + 1)
                                                                     if supported() else 0)


def test_rebuild_hints_come_from_the_committed_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(catalogue, "CHECKPOINTS", tmp_path)  # nothing there: every checkpoint is missing
    notice = catalogue.checkpoint_status("sst2")
    entry = catalogue.rebuild_commands()["sst2"]
    assert entry["command"] in notice and "runs/mgB/ckpt" in notice  # the teacher it needs is named
    assert "the training command in README.md" in catalogue.checkpoint_status("no-such-model")


# ------------------------------------------------------------------------------------------------ Generate
@pytest.fixture()
def lm(tiny_checkpoints: Path, monkeypatch):
    from tabs import generate as tab

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    return tab


def test_generate_returns_text_figures_and_arrays(lm) -> None:
    text, notice, html, cand, attn, lens, state, npz, *_updates = lm.generate("A man rides a bike", 8)
    result = state["result"]
    assert isinstance(text, str) and "8 new tokens · greedy" in notice
    assert len(result.steps) == 8 and len(result.tokens) == result.prompt_len + 8
    assert result.tokens[0] == "<s>"  # the project's own models put BOS first
    with np.load(npz) as arrays:
        t = len(result.tokens)
        assert arrays["attention"].shape == (2, 4, t, t) and arrays["attention"].dtype == np.float32
        assert list(arrays["tokens"]) == result.tokens and int(arrays["prompt_len"]) == result.prompt_len
        assert arrays["step_candidates"].shape == (8, 5) and arrays["step_probs"].shape == (8, 5)
    z = np.array(attn.data[0].z, dtype=float)
    assert z.shape == (t, t) and np.allclose(np.triu(z, 1), 0)  # the causal mask: nothing above the diagonal
    # replaying step 3 shows the prompt and 3 generated tokens
    _html, _cand, attn3 = lm.draw_generation(state, 3, 1, "0", "heatmap")
    assert np.array(attn3.data[0].z).shape == (result.prompt_len + 3,) * 2
    assert len(lens.data[0].z) == 2 and len(lens.data[0].z[0]) == t


def test_generate_bad_input(lm) -> None:
    with pytest.raises(gr.Error, match="type some text"):
        lm.generate("   ")
    with pytest.raises(gr.Error, match="Unknown model"):
        lm.generate("hello", 4, "../../etc/passwd")
    with pytest.raises(gr.Error, match="Unknown strategy"):
        lm.generate("hello", 4, "gpt-tiny", "beam")
    with pytest.raises(gr.Error, match="seed must be a whole number"):  # seeds are refused, not clamped
        lm.generate("hello", 4, "gpt-tiny", "sample", 1.0, 0, 1.0, -1)
    # out-of-range decoding values are clamped, never a crash
    *_a, notice, _html, _c, _at, _l, state, _npz = lm.generate("hello", 1000, "gpt-tiny", "sample", -3, -5, 7, 0)[:8]
    assert len(state["result"].steps) <= 64
    long = lm.generate("the film is " * 300, 10)  # 128 positions in the tiny model: the prompt keeps its end
    result = long[6]["result"]
    assert "shortened" in long[1] and len(result.tokens) <= 128 and result.tokens[0] == "<s>"


def test_ablation_and_head_roles(lm) -> None:
    state = lm.generate("A man rides a bike", 4)[6]
    note, fig = lm.ablate_head_fn(state, 2, 1, 3)
    assert "Layer 1, head 3 switched off" in note and "KL" in note
    assert [t.name for t in fig.data] == ["full model", "head switched off"]
    with pytest.raises(gr.Error, match="Generate a continuation first"):
        lm.ablate_head_fn(None, 0, 0, 0)
    roles, stripe, losses, summary = lm.head_roles("gpt-tiny", 20, 1)
    assert [np.array(t.z).shape for t in roles.data] == [(2, 4)] * 4
    assert np.array(stripe.data[0].z).shape == (41, 41)
    assert [len(t.y) for t in losses.data] == [20, 20] and "strongest induction" in summary


def test_generate_tab_says_when_gpt_tiny_is_missing(tmp_path: Path, monkeypatch) -> None:
    from tabs import generate as tab

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tmp_path)
    notice = tab.availability()
    assert "`git checkout -- checkpoints/gpt-tiny`" in notice and "`openai-community/gpt2`" in notice
    assert tab.decoder_models() == ["gpt-tiny", *catalogue.PACKAGED, *catalogue.downloadable("generate")]
    with pytest.raises(gr.Error, match="`checkpoints/gpt-tiny` is missing: restore it with `git checkout"):
        tab.generate("hello")


def test_a_hugging_face_gpt2_folder_in_checkpoints_works_in_the_tab(tiny_checkpoints: Path, tmp_path: Path,
                                                                     monkeypatch) -> None:
    from tabs import generate as tab
    from tests.tiny import tiny_gpt2_folder

    root = tmp_path / "checkpoints"
    shutil.copytree(tiny_checkpoints / "gpt-tiny", root / "gpt-tiny")
    tiny_gpt2_folder(root / "my-gpt2")
    monkeypatch.setattr(catalogue, "CHECKPOINTS", root)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    assert tab.decoder_models() == ["gpt-tiny", "my-gpt2", *catalogue.PACKAGED, *catalogue.downloadable("generate")]
    text, notice, *_rest = tab.generate("the cat sat", 5, "my-gpt2")
    result = _rest[4]["result"]
    assert result.tokens[0] != "<s>" and result.prompt_len == len(result.tokens) - len(result.steps)
    roles = tab.head_roles("my-gpt2", 10, 0)[0]
    assert [np.array(t.z).shape for t in roles.data] == [(3, 4)] * 4


def test_configured_models_are_checked_and_named(tiny_checkpoints: Path, tmp_path: Path, monkeypatch) -> None:
    from tabs import generate as tab
    from tests.tiny import tiny_gpt2_folder

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(catalogue, "CONFIGURED", {})
    monkeypatch.setattr(catalogue, "CONFIG_PROBLEMS", [])
    tiny_gpt2_folder(tmp_path / "my-gpt2")
    (tmp_path / "gpt-tiny").mkdir()  # the shipped checkpoint's name
    shutil.copy(tmp_path / "my-gpt2" / "config.json", tmp_path / "gpt-tiny" / "config.json")
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    catalogue.configure([str(tmp_path / "my-gpt2"), "", str(tmp_path / "my-gpt2"), str(tmp_path / "gpt-tiny"),
                      str(tmp_path / "bert"), str(tmp_path / "nowhere")])
    assert list(catalogue.CONFIGURED) == ["my-gpt2", "bert"] and catalogue.configured("generate") == ["my-gpt2"]
    assert catalogue.configured("classify") == ["bert"]
    problems = "\n".join(p for _kind, p in catalogue.CONFIG_PROBLEMS)
    assert len(catalogue.CONFIG_PROBLEMS) == 3 and problems.count("is taken") == 2
    assert "no readable config.json" in problems
    assert list(catalogue.CONFIGURED.items())[1][0] == "bert"  # a bert folder goes to Classify (loaded on use)
    assert tab.decoder_models() == ["gpt-tiny", "mamba-tiny", *catalogue.PACKAGED, *catalogue.downloadable("generate"),
                                    "my-gpt2"]
    assert "Model not added" in catalogue.configuration_notice("generate")  # the intro shows it (tabs.common.intro)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    assert tab.generate("the cat sat", 3, "my-gpt2")[6]["model"] == "my-gpt2"
    from tabs.classify import classify

    with pytest.raises(gr.Error, match=r"configured model `bert` .* cannot be loaded"):  # no weights there
        classify("a fine film .", "SST-2 sentiment", "bert")


def test_generation_says_how_it_ended() -> None:
    """An empty continuation is explained; a stop at the end-of-text token is said (synthetic results)."""
    from models.outputs import GenerationStep
    from tabs.generate import ending

    class R:  # the two fields ending() reads
        def __init__(self, chosen: list[str], text: str) -> None:
            self.steps = [GenerationStep(["x"], np.ones(1, np.float32), c, 1.0) for c in chosen]
            self.text = text

    assert ending(R(["</s>"], ""), "</s>", "greedy").startswith("The continuation is empty")
    assert "stopped at `</s>`" in ending(R(["▁a", "▁dog", "</s>"], " a dog"), "</s>", "greedy")
    assert ending(R(["▁a", "▁dog"], " a dog"), "</s>", "greedy") == "2 new tokens · greedy"


def test_ablation_by_default_measures_the_first_prediction(lm) -> None:
    state = lm.generate("A man rides a bike", 4)[6]
    note, _ = lm.ablate_head_fn(state, 0, 1, 2)
    assert "after the prompt" in note and "when none is replayed" in note
    before = lm._model("gpt-tiny").next_token_probs(state["result"].ids[: state["result"].prompt_len])
    top = int(np.argmax(before))
    assert f"{before[top]:.1%}" in note  # the distribution after the prompt, not after the whole text


# ---------------------------------------------------------------------------------- what a teacher sees
def test_a_text_over_the_translator_positions_is_translated_sentence_by_sentence(tiny_checkpoints: Path,
                                                                                 monkeypatch) -> None:
    from tabs.translate import split_long

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    net = store.get_model("translator-en-de")
    first = "A man in a blue shirt is riding a bicycle down the street."
    rest = ["Two young girls are playing with a dog in the park!", "A dog runs."]
    long = " ".join([first, *rest] * 8)  # far over 128 tokens
    assert net.tokenizer.encode(long, max_tokens=net.config.max_len).notice  # the model alone would cut it
    text, others, notice = split_long(net, long)
    assert text == first and others == ([*rest, first] * 8)[:-1] and len(others) == 23
    assert "each of its 24 sentences was translated on its own" in notice
    out, shown = translate(long, 1)[:2]
    solo = [net.translate(s, beam_size=1).text for s in [first, *others]]
    assert out == " ".join(solo) and "figures show the first sentence" in shown
    assert split_long(net, first) == (first, [], "")  # a text that fits is left whole


def test_every_sentence_of_a_short_paragraph_is_translated_and_the_figures_say_which(tiny_checkpoints: Path,
                                                                                      monkeypatch) -> None:
    """Issue 48, item 1: a 5-sentence paragraph under 128 tokens came back as one German sentence, silently (the
    model was trained on single captions). Every multi-sentence text is translated sentence by sentence, the output
    keeps every sentence (each equal to that sentence translated alone), the figures' titles say which sentence
    they show, and the picker draws any other sentence's figures."""
    from tabs import translate as tab

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    net = store.get_model("translator-en-de")
    parts = ["The old woman sells fresh bread.", "Many people carry baskets!", "A child eats an apple.",
             "Two dogs sleep under a table?", "The sun sets."]
    text = " ".join(parts)
    assert not net.tokenizer.encode(text, max_tokens=net.config.max_len).notice  # it fits the positions
    out = tab.translate(text, 2)
    solo = [net.translate(s, beam_size=2) for s in parts]
    assert out[0] == " ".join(r.text for r in solo)
    assert "Each of its 5 sentences was translated on its own" in out[1]
    assert out[2].layout.title.text.startswith("Sentence 1 of 5 · ")
    assert out[4].layout.title.text.startswith("Sentence 1 of 5 · Beam search")
    picker, which = tab.sentence_picker(text)
    assert picker["visible"] and len(picker["choices"]) == 5 and which == "sentence 1 of 5"
    shown = tab.show_sentence(text, picker["choices"][2], 2)
    assert "sentence 3 of 5" in shown[0] and shown[1].layout.title.text.startswith("Sentence 3 of 5")
    cross = shown[5].attention["cross"]  # the kept result: the third sentence's own
    assert cross.keys == solo[2].attention["cross"].keys and shown[-1] == "sentence 3 of 5"
    assert tab.why_controls_for(text, picker["choices"][2])[0] == (parts[2], "translator-en-de")  # and its model
    assert not tab.sentence_picker(parts[0])[0]["visible"]
    with pytest.raises(gr.Error, match="5 sentences"):
        tab.show_sentence(text, "9 · nothing", 2)


def test_trained_swin_names_the_blocks_and_heads_it_shows(tiny_checkpoints: Path, monkeypatch) -> None:
    from tabs import swin as tab

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    heads = tab.block_heads()
    net = store.get_model("swin-fashion")
    result = net.classify(common.EXAMPLE_IMAGES[0])
    assert heads == [w.weights.shape[1] for w in result.windows]  # read from config.json, without torch
    *_figs, note, update = tab.trained_swin("sneaker", 0, 99)
    assert f"Head 99 does not exist in block 0 ({heads[0]} heads): showing head {heads[0] - 1}" in note
    assert update["maximum"] == heads[0] - 1 and update["value"] == heads[0] - 1
    for b, win in enumerate(result.windows):
        note = tab.trained_swin("sneaker", b, 0)[2]
        if win.shift:
            assert "shifted windows" in note
        elif b % 2:  # an odd block that does not shift says why
            assert "nothing to shift" in note
        else:
            assert "regular windows" in note
    assert tab.head_range(len(heads) - 1, 99)["maximum"] == heads[-1] - 1


def test_positional_says_which_dimensions_it_ignored() -> None:
    from tabs.positional import positional_encoding

    curves = positional_encoding(64, 128, "0, abc, 500, 7")[1]
    assert "ignored abc, 500" in curves.layout.title.text and [t.name for t in curves.data] == ["dim 0", "dim 7"]
    curves = positional_encoding(64, 128, "<b>x</b>")[1]
    assert "&lt;b&gt;x&lt;/b&gt;" in curves.layout.title.text and "showing 0 and 1" in curves.layout.title.text
    assert "ignored" not in positional_encoding(64, 128, "0, 1")[1].layout.title.text


def test_ablation_refuses_a_head_the_model_does_not_have(lm) -> None:
    state = lm.generate("A man rides a bike", 4)[6]
    with pytest.raises(gr.Error, match=r"layers 0 … 1 and heads 0 … 3; got layer 0, head 5"):
        lm.ablate_head_fn(state, 0, 0, 5)


def test_a_rough_integral_is_refined_once_and_then_said_to_be_rough() -> None:
    from models.outputs import Attribution

    def attribution(gap):
        return Attribution(values=np.zeros(3), method="integrated_gradients", target=0, label="x", prob=0.5,
                           tokens=["a", "b", "c"], special=np.zeros(3, bool), completeness_gap=gap, steps=16)

    assert common.completeness(attribution(0.01)) == " · completeness gap 1.0%"
    rough = common.completeness(attribution(0.42))
    assert "with 16 integration steps they miss it by 42%" in rough and "read them as rough" in rough
    assert common.completeness(Attribution(values=np.zeros(3), method="rollout", target=0, label="x", prob=0.5,
                                           tokens=["a", "b", "c"], special=np.zeros(3, bool))) == ""


def test_attribute_doubles_the_steps_once_when_the_gap_is_large(monkeypatch) -> None:
    from dataclasses import replace

    import models.inspect.attribution as attribution_module
    from models.outputs import Attribution

    calls = []
    base = Attribution(values=np.zeros(3), method="integrated_gradients", target=0, label="x", prob=0.5,
                       tokens=["a", "b", "c"], special=np.zeros(3, bool))

    def explain(net, inputs, method, target=None, steps=32):
        calls.append(steps)
        return replace(base, completeness_gap=0.5 if steps < 64 else 0.3, steps=steps)

    monkeypatch.setattr(attribution_module, "explain", explain)
    monkeypatch.setattr(attribution_module, "methods_for", lambda net: ("integrated_gradients",))
    monkeypatch.setattr(common, "get_model", lambda name, progress=None: None)  # the name common.attribute calls
    state = {"model": "m", "input": "x", "target": None, "attributions": {},
             "result": type("R", (), {"attention": {}})()}
    found = common.attribute(state, "integrated_gradients")
    assert calls == [32, 64] and found.steps == 64 and "with 64 integration steps" in common.completeness(found)
    common.attribute(state, "integrated_gradients")  # kept: no third run
    assert calls == [32, 64]


def test_the_upload_preview_shows_the_picture_and_what_the_model_will_see(tmp_path: Path) -> None:
    from PIL import Image

    from models.inputs.images import fashion_array
    from tabs.vision import PREVIEW_SIDE, enlarge, preview

    shown, seen = preview(common.EXAMPLE_IMAGES[0], "vit-fashion")
    # the example is 28×28: enlarged to be seen (issue 48, item 12: it was shown at 28 pixels), pixel for pixel
    assert shown.shape == (28 * (PREVIEW_SIDE // 28), 28 * (PREVIEW_SIDE // 28), 3)
    assert np.array_equal(shown[:: PREVIEW_SIDE // 28, :: PREVIEW_SIDE // 28],
                          np.asarray(Image.open(common.EXAMPLE_IMAGES[0]).convert("RGB")))
    assert np.array_equal(seen, enlarge(fashion_array(common.EXAMPLE_IMAGES[0])[0], PREVIEW_SIDE))
    big = tmp_path / "big.png"
    Image.new("RGB", (2000, 1000), (200, 30, 30)).save(big)
    shown, seen = preview(str(big), "ViT-B/16 (ImageNet)")
    assert shown.shape == (2 * PREVIEW_SIDE // 2, 2 * PREVIEW_SIDE, 3)  # a thumbnail, aspect kept
    # the model's input is its own preprocessing's picture (issue 61, item 8; tests/test_deit.py): none while the
    # model cannot be had (no ImageNet weights offline), never the upload in its stead
    assert seen is None
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    assert preview(str(tmp_path / "broken.png"), "vit-fashion") == (None, None)  # classifying it says why


def test_class_free_explanations_say_so(tiny_checkpoints: Path, monkeypatch) -> None:
    """Issue 48, item 7: rollout was titled "toward negative" on a supports/against scale, though it does not
    depend on the class ("charming" shown supporting *negative*). Attention and rollout are the same map for every
    class, titled so, on a one-sided legend; a gradient method keeps its signed scale and target."""
    import re

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())

    def values(highlight: str) -> list[float]:
        return [float(v) for v in re.findall(r'title="[^"]*: ([-+][0-9.e+-]+)"', highlight)]

    for method in ("rollout", "attention"):
        shown = {target: classify("a charming film .", "SST-2 sentiment", "trained from scratch", 0, "mean",
                                  "heatmap", method, target)[2] for target in ("negative", "positive")}
        assert values(shown["negative"]) == values(shown["positive"])
        for text in shown.values():
            assert "the same for every class" in text and "toward" not in text and "(supports)" not in text
    gradient = classify("a charming film .", "SST-2 sentiment", "trained from scratch", 0, "mean", "heatmap",
                        "gradxinput", "negative")[2]
    assert "toward negative" in gradient and "(supports)" in gradient


def test_swin_overlay_follows_the_mean_and_max_of_heads(tiny_checkpoints: Path, monkeypatch) -> None:
    """Issue 48, item 7: Vision with Swin drew head 0 for "mean" and "max" and kept "CLS → patches" selected. The
    overlay is the window attention fused over the block's heads (checked against the mean and max written out),
    titled so, and the view switch holds no value for Swin."""
    from tabs import vision
    from tabs.common import EXAMPLE_IMAGES
    from viz.swin import window_attention_map

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    out = classify_image(str(EXAMPLE_IMAGES[0]), "swin-fashion", 3, 0, "mean", "CLS → patches", "gradxinput")
    state = out[7]
    result = state["result"]
    block = result.windows[0]
    query = (block.grid[0] // 2, block.grid[1] // 2)
    drawn = {}
    for head, fuse in (("mean", np.mean), ("max", np.max), ("1", None)):
        overlay = vision.draw_image(result, 0, head, None)[0]
        z = np.array(next(t for t in overlay.data if t.type == "heatmap").z, dtype=float)
        w = block.weights if fuse is None else fuse(block.weights, axis=1, keepdims=True)
        want, _ = window_attention_map(w, block.grid, block.window, block.shift, query, 1 if fuse is None else 0)
        np.testing.assert_allclose(np.nan_to_num(z), np.nan_to_num(want), atol=1e-5)
        drawn[head] = z
        assert (f"{head} of" if fuse else "head 1") in overlay.layout.title.text
    assert not np.allclose(np.nan_to_num(drawn["mean"]), np.nan_to_num(drawn["1"]))
    _, view = vision.offered("swin-fashion", "gradxinput")
    assert view["value"] is None and view["interactive"] is False
    assert vision.offered("vit-fashion", "rollout")[1]["value"] == "CLS → patches"


def test_swin_window_sliders_show_what_the_figure_draws() -> None:
    """Issue 48, item 7: the Swin windows sliders showed shift 6 and window 63 while the figures used 3 and 8. The
    sliders are clamped to the same values the figures use (read back from the note) and offer no more."""
    import re

    from tabs.swin import window_limits

    for grid, window, shift, index in [(8, 4, 6, 63), (16, 8, 7, 63), (5, 8, 7, 3), (16, 1, 0, 63), (9, 4, 3, 20)]:
        shift_u, index_u = window_limits(grid, window, shift, index)
        note = swin_windows(grid, window, shift, index)[-1]
        drawn_shift = int(re.search(r"shift (\d+)", note).group(1))
        drawn_index = int(re.search(r"Window (\d+) blocks", note).group(1))
        n_windows = int(re.search(r"(\d+) windows of", note).group(1))
        assert (shift_u["value"], index_u["value"]) == (drawn_shift, drawn_index), note
        assert index_u["maximum"] == max(n_windows - 1, 1) and shift_u["maximum"] == max(window - 1, 1)


def test_generate_zoom_head_switch_and_model_change(tiny_checkpoints: Path, monkeypatch) -> None:
    """Issue 48, items 4, 7 and 12: "Zoom into the block" kept its 0–63 boxes and failed on a 16-token text; "Switch
    the head off" ablated layer 3 head 0 while head 1 was on screen; a new model's error stood under the last
    model's continuation. The zoom's end follows the text, the ablation sliders follow the heatmap's layer and
    head, and choosing another model empties the last one's outputs."""
    from tabs import generate as tab

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    state = tab.generate("a dog", 3)[6]
    t = len(state["result"].tokens)
    assert t < 63
    ends = [u["value"] for u in tab.zoom_defaults(state)]
    assert ends == [t - 1, t - 1]  # the boxes follow the text (they kept 63)
    fig = tab.zoom(state, 0, "0", 0, ends[0], 0, ends[1])
    assert len(fig.data[0].z) == t  # the whole text, not an error
    with pytest.raises(gr.Error, match="last query 63 is outside"):
        tab.zoom(state, 0, "0", 0, 63, 0, 63)  # asked outright, still refused in words
    with gr.Blocks() as demo:
        tab.build()
    boxes = [b for b in demo.blocks.values() if getattr(b, "label", None) in ("queries to", "keys to")]
    assert any(set(boxes) <= set(fn.outputs) and fn.fn is tab.zoom_defaults for fn in demo.fns.values())
    sliders = {getattr(b, "label", None): b for b in demo.blocks.values()}
    followers = [fn for fn in demo.fns.values() if len(fn.outputs) == 1 and fn.outputs[0] in
                 (sliders["layer of the head"], sliders["head"]) and len(fn.inputs) == 1]
    by_output = {fn.outputs[0].label: fn for fn in followers}
    assert by_output["layer of the head"].fn(3)["value"] == 3 and by_output["head"].fn("1")["value"] == 1
    plots = [b for b in demo.blocks.values() if isinstance(b, gr.Plot)]
    clearing = [fn for fn in demo.fns.values() if not fn.inputs and any(k == "input" for _, k in fn.targets)
                and sum(o in plots for o in fn.outputs) >= 3]
    assert clearing and all(v in ("", None) for v in clearing[0].fn())


def test_vision_preview_and_class_choices(tiny_checkpoints: Path, monkeypatch, tmp_path: Path) -> None:
    """Issue 48, items 8 and 12: a transparent PNG was previewed on another ground than the model's; 28- and 5-pixel
    uploads were shown at their size; the target class was a free-text box. The preview composites on the ground the
    model puts transparency on (a Fashion-MNIST model's black since issue 61, item 8: tests/test_images.py) and
    enlarges small images; the target is a dropdown of the chosen model's classes, and picking one explains it at
    once."""
    from PIL import Image

    from tabs import vision

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    rgba = np.zeros((40, 40, 4), dtype=np.uint8)
    rgba[10:30, 18:22] = (0, 0, 0, 255)  # a black bar on a fully transparent ground
    path = tmp_path / "clear.png"
    Image.fromarray(rgba, "RGBA").save(path)
    shown, seen = vision.preview(str(path), "vit-fashion")
    assert (shown[0, 0] == 0).all() and seen[0, 0].max() == 0  # the transparent ground on black in both
    assert seen[seen.shape[0] // 2, seen.shape[1] // 2].min() > 200  # the model's input: the dark bar made light
    for side in (28, 5):
        small = tmp_path / f"small{side}.png"
        Image.fromarray(np.full((side, side, 3), 200, np.uint8)).save(small)
        shown, _ = vision.preview(str(small), "vit-fashion")
        assert shown.shape[0] >= vision.PREVIEW_SIDE - side and shown.shape[0] % side == 0
    labels = catalogue.checkpoint_labels("vit-fashion")
    assert vision.class_choices("vit-fashion") == [("the predicted class", ""), *[(x, x) for x in labels]]
    assert vision.target_update("swin-fashion", labels[1])["value"] == labels[1]
    with gr.Blocks() as demo:
        vision.build()
    drop = next(b for b in demo.blocks.values() if getattr(b, "label", None) == "explain the class")
    assert isinstance(drop, gr.Dropdown)
    assert any((drop._id, "input") in [(i, k) for i, k in fn.targets] and fn.fn is not None and
               "classify_image" in getattr(fn.fn, "__name__", "") for fn in demo.fns.values())
    with pytest.raises(gr.Error, match="Unknown class 'banana'"):
        classify_image(vision.EXAMPLE_IMAGES[0], "vit-fashion", 3, 0, "mean", "CLS → patches", "rollout", "banana")


def test_readme_has_a_path_for_teachers() -> None:
    """Issue 48, item 14: a short "for teachers" path: every tab of the app and every lesson named in it, the links
    per slide and the export; its promises (sentence-by-sentence translation with a picker, sideways scrolling with
    a scrollbar) are kept by the code (tested above and in tests/e2e)."""
    import app
    from tabs import lessons

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = text.split("## For teachers", 1)[1].split("\n## ", 1)[0]
    for tab in app.TABS:
        assert tab.TITLE in section, tab.TITLE
    for number in range(1, len(lessons.LESSONS) + 1):
        assert f"lesson {number}" in section or f"lessons {number}" in section or f"–{number}" in section, number
    assert "Export this lesson as an HTML page" in section and "link" in section
    assert "sentence by sentence" in section and "scrollbar" in section
    assert "-webkit-scrollbar" in app.CSS  # the promise of a drawn scrollbar


def test_vision_explains_the_input_it_classified(tiny_checkpoints: Path, monkeypatch, tmp_path: Path) -> None:
    """Issue 48, item 11: every explanation decoded and converted the upload again (slow for a large photo). The
    state keeps the model's input tensor, so a later explanation is of exactly what was classified, even when the
    file has changed since (here overwritten with another picture)."""
    from PIL import Image

    from models.inputs.images import fashion_tensor
    from models.inspect.attribution import explain
    from tabs import vision

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    upload = tmp_path / "upload.png"
    shutil.copy(common.EXAMPLE_IMAGES[0], upload)
    state = classify_image(str(upload), "vit-fashion", 3, 0, "mean", "CLS → patches", "rollout")[7]
    assert np.array_equal(state["input"].numpy(), fashion_tensor(state["result"].image[None]).numpy())
    Image.open(common.EXAMPLE_IMAGES[1]).save(upload)  # the file changes after classifying
    vision.reexplain(state, "gradxinput")
    kept = state["attributions"]["gradxinput"]
    want = explain(common.get_model("vit-fashion"), common.EXAMPLE_IMAGES[0], "gradxinput",
                   target=state["target"])
    np.testing.assert_allclose(kept.values, want.values, atol=1e-6)


@pytest.mark.parametrize("warm", ["1", "0"])
def test_main_serves_then_warms_the_model_stack_in_the_background(monkeypatch, warm: str) -> None:
    """Issue 48, item 11: the first Vision classify waited seconds for torch's import and the first figures of
    Translate and Generate for Plotly's. main pays for the first figure before serving, launches without blocking,
    starts the model stack's import in a background thread (not with ATLAS_WARM=0), then blocks."""
    import threading

    import app

    calls: list[str] = []

    class Demo:
        def queue(self, **kwargs):
            calls.append("queue")

        def launch(self, **kwargs):
            calls.append(f"launch prevent_thread_lock={kwargs.get('prevent_thread_lock')}")

        def block_thread(self):
            calls.append("block")

    started: list[str] = []
    monkeypatch.setenv("ATLAS_WARM", warm)
    monkeypatch.setattr(app, "build_demo", Demo)
    monkeypatch.setattr(app, "configure", lambda names: None)
    monkeypatch.setattr(app, "warm_plotly", lambda: calls.append("plotly"))
    monkeypatch.setattr(app, "warm_stack", lambda: started.append(threading.current_thread().name))
    app.main([])
    for t in threading.enumerate():
        if t.name == "atlas-warm":
            t.join(timeout=10)
    assert calls == ["queue", "plotly", "launch prevent_thread_lock=True", "block"]
    assert started == (["atlas-warm"] if warm == "1" else [])


def test_warm_stack_imports_what_a_first_request_needs() -> None:
    import subprocess
    import sys

    code = ("import sys, app; assert 'torch' not in sys.modules; app.warm_plotly(); print(app.warm_stack()); "
            "print(all(m in sys.modules for m in app.WARM_MODULES))")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["[]", "True"]


def test_every_figure_of_every_tab_carries_its_phone_layout() -> None:
    """Issue 61, item 6: every plot of the app is tabs.common.Plot, so every tab's figures (not only the lessons')
    carry their phone layout, also when a handler sends an update (Gradio then makes a new instance of the output's
    class), and their blocks the class the phone style sheet stacks; defining it wrote no .pyi beside tabs/common.py
    (Gradio writes one for a component subclass)."""
    import json

    import plotly.graph_objects as go

    import app

    plots = [b for b in app.build_demo().blocks.values() if isinstance(b, gr.Plot)]
    assert len(plots) > 40 and {type(b) for b in plots} == {common.Plot}
    assert all("atlas-plot" in b.get_config()["elem_classes"] for b in plots)
    for block in (plots[0], type(plots[0])(**{**plots[0].constructor_args, "render": False})):
        fig = go.Figure(go.Heatmap(z=np.eye(30), x=[f"t{i}" for i in range(30)], y=[f"t{i}" for i in range(30)]))
        sent = json.loads(block.postprocess(fig).plot)
        assert sent["layout"]["meta"]["atlas_phone"]["narrow"] == 600
        assert "width" not in sent["layout"] or sent["layout"]["width"] != 340  # the wide figure is sent as built
    assert block.postprocess(None) is None
    assert not Path(common.__file__).with_suffix(".pyi").exists()
