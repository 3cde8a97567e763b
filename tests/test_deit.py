"""The DeiT family (models/families/deit.py): Hugging Face ``deit`` folders written by transformers with random
weights (tests/parity_folders.py: the distilled model, two heads averaged, and the plain one, one head on [CLS]), whose
pixels, probabilities and every layer's attention equal transformers' in tests/test_parity.py. Here: the distillation
token and the two heads, and the token through the Vision tab's views and every explanation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.families import noise as photo


def test_distillation_token_and_the_two_heads(hf_folders) -> None:
    """The distilled model's logits are the mean of its class and distillation heads (transformers' logits), and the
    two heads differ, so their mean is neither alone; the distillation token is named in the attention's labels."""
    from transformers import DeiTImageProcessor

    from models import registry
    from models.families.deit import DeiT

    built = hf_folders.get("deit")
    ours, hf = built.model, built.ref.model
    assert isinstance(ours, DeiT) and registry.family_of(ours).name == "deit"
    image = photo(0)
    pixels = DeiTImageProcessor.from_pretrained(built.path)(image, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        ref = hf(pixel_values=pixels)
        tokens, _ = ours.forward_features(pixels)
        cls_only, both = ours.head(tokens[:, 0]), ours.forward_head(tokens)
    np.testing.assert_allclose(both.numpy(), ref.logits.numpy(), atol=1e-4)
    assert (cls_only - both).abs().max() > 0.1
    result = ours.classify(image)
    assert result.attention["encoder"].keys[:3] == ["CLS", "DIST", "r0c0"] and result.prefix_tokens == 2
    assert result.attention["encoder"].weights.shape == (3, 4, 2 + 16, 2 + 16)


def test_deit_through_every_vision_view_and_explanation(hf_folders, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A configured DeiT folder appears in Vision (the registry's tab for model_type "deit"), and the tab's handler
    draws every view and explanation over the 4 × 4 patches, the two prefix tokens skipped."""
    from models.outputs import METHODS
    from serving import catalogue, store
    from tabs import vision

    where = hf_folders.get("deit").path
    monkeypatch.setattr(catalogue, "CONFIGURED", {})
    monkeypatch.setattr(catalogue, "CONFIG_PROBLEMS", [])
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    catalogue.configure([str(where)])
    assert catalogue.configured("vision") == [where.name] and catalogue.CONFIG_PROBLEMS == []
    assert catalogue.family(where.name).name == "deit"
    image = str(tmp_path / "photo.png")
    photo().save(image)
    for method in METHODS:
        for view in ("CLS → patches", "rollout"):
            out = vision.classify_image(image, where.name, 3, 1, "mean", view, method, "", progress=None)
            state = out[7]
            values = state["attributions"][method].values
            assert values.shape == (4, 4) or values.size == 16, (method, values.shape)
            overlay = out[1]
            z = np.asarray([t for t in overlay.data if getattr(t, "z", None) is not None][-1].z, dtype=float)
            assert np.isfinite(z).any()
            if view == "CLS → patches":  # the overlay is layer 1's CLS row over the patches, prefix tokens skipped
                w = state["result"].attention["encoder"].weights[1].mean(0)[0, 2:]
                np.testing.assert_allclose(np.nanmax(z), w.max(), rtol=1e-3)


def test_the_preview_shows_what_deit_sees(hf_folders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 61, item 8: "the model's input" showed a 4:3 upload at 4:3 while DeiT's preprocessing squashes it to a
    square (resize to 36 × 36, crop 32). The preview is the model's own input, exactly the image classifying shows as
    what the model saw (enlarged by a whole factor)."""
    from PIL import Image

    from serving import catalogue, store
    from tabs import vision

    where = hf_folders.get("deit").path
    monkeypatch.setattr(catalogue, "CONFIGURED", {})
    monkeypatch.setattr(catalogue, "CONFIG_PROBLEMS", [])
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    catalogue.configure([str(where)])
    rng = np.random.default_rng(0)
    image = tmp_path / "wide.png"
    Image.fromarray(rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)).save(image)  # 4:3
    shown, seen = vision.preview(str(image), where.name)
    assert shown.shape[1] / shown.shape[0] == pytest.approx(4 / 3, rel=0.05)
    assert seen.shape[0] == seen.shape[1]
    saw = vision.classify_image(str(image), where.name, 3, 1, "mean", "CLS → patches", "rollout", "",
                                progress=None)[7]["result"].image
    assert saw.shape == (32, 32, 3)
    assert np.array_equal(seen, vision.enlarge(saw, vision.PREVIEW_SIDE))
