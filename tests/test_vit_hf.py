"""A Hugging Face ViTForImageClassification folder read into models.families.vit.ViT: the same pixel values from each
side's own preprocessing, and the same logits and attention as transformers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def vit_folder(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    from tests.tiny import tiny_vit_classifier_folder

    folder = tmp_path_factory.mktemp("hf") / "vit"
    return folder, tiny_vit_classifier_folder(folder)


def photo(seed: int = 0):
    """A non-square RGB 'photo' with structure (a gradient, a disc and noise), larger than the model's input."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    h, w = 90, 130
    y, x = np.mgrid[:h, :w]
    img = np.stack([x * 255 / w, y * 255 / h, 128 + 100 * (((x - 60) ** 2 + (y - 40) ** 2) < 600)], -1)
    return Image.fromarray(np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8))


def test_vit_folder_matches_transformers(vit_folder) -> None:
    from transformers import ViTImageProcessor

    import models
    from models.inputs.images import prepare

    folder, hf = vit_folder
    ours = models.load(str(folder))
    assert ours.labels == ["cat", "dog", "bird", "fish"] and ours.config.input == "processor"
    image = photo()
    theirs = ViTImageProcessor.from_pretrained(folder)(image, return_tensors="pt")["pixel_values"]
    mine = prepare(image, "processor", processor=ours.config.processor).tensor
    assert mine.shape == theirs.shape == (1, 3, 32, 32)
    np.testing.assert_allclose(mine.numpy(), theirs.numpy(), atol=1e-5)
    result = ours.classify(image)
    with torch.no_grad():
        ref = hf(pixel_values=theirs, output_attentions=True)
    probs = torch.softmax(ref.logits[0], -1).numpy()
    assert probs.max() > 0.6  # the scaled head: far from uniform
    np.testing.assert_allclose(result.probs, probs, atol=1e-4)
    np.testing.assert_allclose(result.attention["encoder"].weights, torch.stack(ref.attentions, 1)[0].numpy(),
                               atol=1e-4)
    assert result.grid == (4, 4) and result.image.shape == (32, 32, 3)


def test_vit_folder_without_preprocessor_config_is_refused(vit_folder, tmp_path: Path) -> None:
    import shutil

    import models
    from models.io.checkpoint import CheckpointError

    folder, _ = vit_folder
    broken = tmp_path / "vit"
    shutil.copytree(folder, broken)
    (broken / "preprocessor_config.json").unlink()
    with pytest.raises(CheckpointError, match="preprocessor_config.json"):
        models.load(str(broken))
