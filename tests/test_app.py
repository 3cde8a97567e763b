"""The app's handlers called directly: damaged checkpoints disable only their tab; bad input is refused politely."""

from __future__ import annotations

import shutil
from pathlib import Path

import gradio as gr
import numpy as np
import pytest

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
    monkeypatch.setattr(common, "CHECKPOINTS", root)
    monkeypatch.setattr(common, "MODELS", common.ModelStore())
    return root


def test_missing_and_damaged_checkpoints_disable_only_their_tab(damaged: Path) -> None:
    with pytest.raises(gr.Error, match=r"translator-en-de.*git checkout -- checkpoints/translator-en-de"):
        translate("A dog runs.")
    with pytest.raises(gr.Error, match=r"sst2.*(sha256|hash).*python -m train.classifier --task sst2"):
        classify("a fine film .")
    verdict = classify("Stocks fell sharply.", "AG News topic")[0]  # the other models keep working
    assert any(label in verdict for label in ("World", "Sports", "Business", "Sci/Tech"))
    assert playground(4)[2].startswith("Scale factor")
    assert "translator-en-de" in common.checkpoint_status("translator-en-de", "agnews")
    assert common.checkpoint_status("agnews") == ""


@pytest.mark.parametrize("text", ["", "   \n\t  ", None])
def test_empty_text_is_refused_with_a_message(text) -> None:
    with pytest.raises(gr.Error, match="type some text"):
        classify(text)


def test_model_names_from_the_api_never_become_paths(tiny_checkpoints: Path, monkeypatch) -> None:
    monkeypatch.setattr(common, "CHECKPOINTS", tiny_checkpoints)
    with pytest.raises(gr.Error, match="Unknown model"):
        classify_image(common.EXAMPLE_IMAGES[0], "../../etc")
    # An unknown task or model choice falls back to a known checkpoint, never a path built from input.
    assert classify("a fine film .", "../../../x", "nope")[0]


def test_long_text_is_truncated_with_a_notice(tiny_checkpoints: Path, monkeypatch) -> None:
    monkeypatch.setattr(common, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(common, "MODELS", common.ModelStore())
    verdict, *_rest, state, npz, _layer, _head = classify("good " * 10_000)
    assert "truncated" in verdict.lower()
    assert len(state.tokens) <= 128
    with np.load(npz) as arrays:
        assert arrays["encoder"].shape[-1] == len(state.tokens)


def test_swin_windows_pads_the_grid_to_the_window() -> None:
    *_figs, note = swin_windows(grid=9, window=4, shift=2)
    assert "padded to 12×12" in note and "9 windows of 4×4" in note


def test_imagenet_choice_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not cached: a clear message within seconds. Cached (a random torchvision Swin-T): every figure."""
    import time

    import torch
    from torchvision.models import swin_t

    from models.pretrained import weights_path

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(common, "MODELS", common.ModelStore())
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

    monkeypatch.setattr(common, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(common, "MODELS", common.ModelStore())
    _verdict, _probs, highlight, *_rest, state, _npz, _layer, _head = classify("a fine film .", "SST-2 sentiment",
                                                                             model)
    assert state.pooling == pooling
    label = f"rollout from {state.tokens[0]}" if pooling == "cls" else "rollout averaged over every token"
    assert label in html.unescape(highlight)
    shown = [float(v) for v in re.findall(r'title="[^"]*: (-?[0-9.]+)"', highlight)]
    want = pooled_rollout(state.attention["encoder"].weights, pooling)
    np.testing.assert_allclose(shown, want, atol=1e-4)
    other = pooled_rollout(state.attention["encoder"].weights, "mean" if pooling == "cls" else "cls")
    assert not np.allclose(shown, other, atol=1e-4)


def test_the_model_store_serves_packed_layers(monkeypatch) -> None:
    """models.load returns the plain model; the app's store packs the large layers (models.packed)."""
    import models
    from models.packed import PackedLinear, supported

    monkeypatch.setattr(common, "CHECKPOINTS", common.ROOT / "checkpoints")
    plain = models.load(common.ROOT / "checkpoints" / "translator-en-de")
    served = common.ModelStore().get("translator-en-de")
    assert not any(type(m) is PackedLinear for m in plain.modules())
    c = plain.config
    assert sum(type(m) is PackedLinear for m in served.modules()) == ((2 * (c.n_enc_layers + c.n_dec_layers) + 1)
                                                                     if supported() else 0)


def test_rebuild_hints_come_from_the_committed_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(common, "CHECKPOINTS", tmp_path)  # nothing there: every checkpoint is missing
    notice = common.checkpoint_status("sst2")
    entry = common.rebuild_commands()["sst2"]
    assert entry["command"] in notice and "runs/mgB/ckpt" in notice  # the teacher it needs is named
    assert "the training command in README.md" in common.checkpoint_status("no-such-model")
