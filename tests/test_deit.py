"""The DeiT family (models/families/deit.py): Hugging Face ``deit`` folders written by transformers with random
weights, read by ``models.load``, give transformers' class probabilities and every layer's attention (within 1e-4),
for the distilled model (two heads averaged) and the plain one (one head on [CLS]); the distillation token goes
through the Vision tab's views and every explanation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

LABELS = ("cat", "dog", "bird", "fish", "frog")


def deit_folder(folder: Path, distilled: bool) -> torch.nn.Module:
    """A small random DeiT classifier saved by transformers (safetensors) with its preprocessor_config.json; its
    heads scaled so the probabilities are far from uniform."""
    from transformers import (
        DeiTConfig,
        DeiTForImageClassification,
        DeiTForImageClassificationWithTeacher,
        DeiTImageProcessor,
    )

    torch.manual_seed(1 if distilled else 2)
    cfg = DeiTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=3,
                     num_attention_heads=4, intermediate_size=64, num_labels=len(LABELS),
                     id2label=dict(enumerate(LABELS)), label2id={n: i for i, n in enumerate(LABELS)})
    cfg._attn_implementation = "eager"
    cls = DeiTForImageClassificationWithTeacher if distilled else DeiTForImageClassification
    hf = cls(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "classifier" in name or "token" in name or "position" in name:
                p.normal_(0, 0.5)  # transformers initialises these to zeros or small values: make each count
    hf.save_pretrained(folder, safe_serialization=True)
    DeiTImageProcessor(size={"height": 36, "width": 36}, crop_size={"height": 32, "width": 32},
                       image_mean=[0.5, 0.4, 0.3], image_std=[0.2, 0.25, 0.3]).save_pretrained(folder)
    return hf


def photo(seed: int = 0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (50, 70, 3)).astype(np.uint8))


@pytest.mark.parametrize("distilled", [True, False])
def test_deit_folder_matches_transformers(tmp_path: Path, distilled: bool) -> None:
    from transformers import DeiTImageProcessor

    import models
    from models import registry
    from models.families.deit import DeiT
    from models.inputs.images import prepare

    hf = deit_folder(tmp_path / "deit", distilled)
    ours = models.load(str(tmp_path / "deit"))
    assert isinstance(ours, DeiT) and registry.family_of(ours).name == "deit"
    assert ours.labels == list(LABELS) and ours.num_prefix_tokens == 2 and ours.config.distilled == distilled
    for seed in range(3):
        image = photo(seed)
        theirs = DeiTImageProcessor.from_pretrained(tmp_path / "deit")(image, return_tensors="pt")["pixel_values"]
        mine = prepare(image, "processor", processor=ours.config.processor).tensor
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), atol=1e-5)
        result = ours.classify(image)
        with torch.no_grad():
            ref = hf(pixel_values=theirs, output_attentions=True)
        probs = torch.softmax(ref.logits[0], -1).numpy()
        assert 0.4 < probs.max() < 0.999  # far from uniform, not saturated: a wrong head would show
        np.testing.assert_allclose(result.probs, probs, atol=1e-4)
        attention = torch.stack(ref.attentions, 1)[0].numpy()  # (L, H, 2 + P, 2 + P)
        assert attention.shape == (3, 4, 2 + 16, 2 + 16)
        np.testing.assert_allclose(result.attention["encoder"].weights, attention, atol=1e-4)
    if distilled:  # the two heads differ: their mean is neither alone
        with torch.no_grad():
            tokens, _ = ours.forward_features(mine)
            cls_only, both = ours.head(tokens[:, 0]), ours.forward_head(tokens)
        np.testing.assert_allclose(both.numpy(), ref.logits.numpy(), atol=1e-4)
        assert (cls_only - both).abs().max() > 0.1
    assert result.attention["encoder"].keys[:3] == ["CLS", "DIST", "r0c0"] and result.prefix_tokens == 2


def test_deit_through_every_vision_view_and_explanation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A configured DeiT folder appears in Vision (the registry's tab for model_type "deit"), and the tab's handler
    draws every view and explanation over the 4 × 4 patches, the two prefix tokens skipped."""
    from models.outputs import METHODS
    from serving import catalogue, store
    from tabs import vision

    deit_folder(tmp_path / "my-deit", distilled=True)
    monkeypatch.setattr(catalogue, "CONFIGURED", {})
    monkeypatch.setattr(catalogue, "CONFIG_PROBLEMS", [])
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    catalogue.configure([str(tmp_path / "my-deit")])
    assert catalogue.configured("vision") == ["my-deit"] and catalogue.CONFIG_PROBLEMS == []
    assert catalogue.family("my-deit").name == "deit"
    image = str(tmp_path / "photo.png")
    photo().save(image)
    for method in METHODS:
        for view in ("CLS → patches", "rollout"):
            out = vision.classify_image(image, "my-deit", 3, 1, "mean", view, method, "", progress=None)
            state = out[7]
            values = state["attributions"][method].values
            assert values.shape == (4, 4) or values.size == 16, (method, values.shape)
            overlay = out[1]
            z = np.asarray([t for t in overlay.data if getattr(t, "z", None) is not None][-1].z, dtype=float)
            assert np.isfinite(z).any()
            if view == "CLS → patches":  # the overlay is layer 1's CLS row over the patches, prefix tokens skipped
                w = state["result"].attention["encoder"].weights[1].mean(0)[0, 2:]
                np.testing.assert_allclose(np.nanmax(z), w.max(), rtol=1e-3)
