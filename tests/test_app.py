"""The app's handlers called directly: damaged checkpoints disable only their tab; bad input is refused politely."""

from __future__ import annotations

import shutil
from pathlib import Path

import gradio as gr
import numpy as np
import pytest

import app


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
    monkeypatch.setattr(app, "CHECKPOINTS", root)
    monkeypatch.setattr(app, "MODELS", app.ModelStore())
    return root


def test_missing_and_damaged_checkpoints_disable_only_their_tab(damaged: Path) -> None:
    with pytest.raises(gr.Error, match=r"translator-en-de.*git checkout -- checkpoints/translator-en-de"):
        app.translate("A dog runs.")
    with pytest.raises(gr.Error, match=r"sst2.*(sha256|hash).*python -m train.classifier --task sst2"):
        app.classify("a fine film .")
    verdict = app.classify("Stocks fell sharply.", "AG News topic")[0]  # the other models keep working
    assert any(label in verdict for label in ("World", "Sports", "Business", "Sci/Tech"))
    assert app.playground(4)[2].startswith("Scale factor")
    assert "translator-en-de" in app.checkpoint_status("translator-en-de", "agnews")
    assert app.checkpoint_status("agnews") == ""


@pytest.mark.parametrize("text", ["", "   \n\t  ", None])
def test_empty_text_is_refused_with_a_message(text) -> None:
    with pytest.raises(gr.Error, match="type some text"):
        app.classify(text)


def test_model_names_from_the_api_never_become_paths(tiny_checkpoints: Path, monkeypatch) -> None:
    monkeypatch.setattr(app, "CHECKPOINTS", tiny_checkpoints)
    with pytest.raises(gr.Error, match="Unknown model"):
        app.classify_image(app.EXAMPLE_IMAGES[0], "../../etc")
    # An unknown task or model choice falls back to a known checkpoint, never a path built from input.
    assert app.classify("a fine film .", "../../../x", "nope")[0]


def test_long_text_is_truncated_with_a_notice(tiny_checkpoints: Path, monkeypatch) -> None:
    monkeypatch.setattr(app, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(app, "MODELS", app.ModelStore())
    verdict, *_rest, state, npz, _layer, _head = app.classify("good " * 10_000)
    assert "truncated" in verdict.lower()
    assert len(state.tokens) <= 128
    with np.load(npz) as arrays:
        assert arrays["encoder"].shape[-1] == len(state.tokens)


def test_swin_windows_pads_the_grid_to_the_window() -> None:
    *_figs, note = app.swin_windows(grid=9, window=4, shift=2)
    assert "padded to 12×12" in note and "9 windows of 4×4" in note


def test_imagenet_choice_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not cached: a clear message within seconds. Cached (a random torchvision Swin-T): every figure."""
    import time

    import torch
    from torchvision.models import swin_t

    from models.pretrained import weights_path

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(app, "MODELS", app.ModelStore())
    start = time.monotonic()
    with pytest.raises(gr.Error, match="ImageNet weights for swin_t are not available"):
        app.classify_image(app.EXAMPLE_IMAGES[0], "Swin-T (ImageNet)")
    assert time.monotonic() - start < 30  # never a hang (generous: a busy CI machine)
    path = weights_path("swin_t")
    path.parent.mkdir(parents=True)
    torch.manual_seed(0)
    torch.save(swin_t().state_dict(), path)
    probs, overlay, heads, patch, distance, seen, *_ = app.classify_image(app.EXAMPLE_IMAGES[0], "Swin-T (ImageNet)")
    assert len(probs.data[0].y) == 5 and seen.shape[:2] == (224, 224)  # the RGB centre crop the model saw
    assert overlay is not None and heads is not None and patch is not None and distance is not None
