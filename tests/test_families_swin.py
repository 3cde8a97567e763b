"""Hugging Face Swin folders (models/io/hf_vision.py) read into models.families.swin.Swin: a random-weight
SwinForImageClassification written by transformers (three stages of 3, 1 and 1 blocks, heads 3/2/4, a 16×16 grid in
4×4 windows, so regular, shifted and whole-grid windows all occur) gives transformers' pixels, probabilities and every
block's window attention within 1e-4; every Swin view's data (window masks, shifts, bias tables) comes with it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.test_vit_hf import photo

torch.set_num_threads(2)
LABELS = ("cat", "dog", "bird")


@pytest.fixture(scope="module")
def swin_folder(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    from transformers import SwinConfig, SwinForImageClassification, ViTImageProcessor

    folder = tmp_path_factory.mktemp("hf") / "swin"
    cfg = SwinConfig(image_size=32, patch_size=2, num_channels=3, embed_dim=12, depths=[3, 1, 1], num_heads=[3, 2, 4],
                     window_size=4, drop_path_rate=0.0, num_labels=3, id2label=dict(enumerate(LABELS)),
                     label2id={n: i for i, n in enumerate(LABELS)})
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = SwinForImageClassification(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or "relative_position_bias_table" in name or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.3)  # LayerNorms off 1/0, bias tables that shape attention
        hf.classifier.weight.mul_(40.0)
    hf.save_pretrained(folder)
    ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5, 0.4, 0.3],
                      image_std=[0.2, 0.25, 0.3]).save_pretrained(folder)
    return folder, hf


def test_swin_folder_matches_transformers(swin_folder) -> None:
    from transformers import ViTImageProcessor

    import models

    folder, hf = swin_folder
    ours = models.load(str(folder))
    assert ours.labels == list(LABELS) and ours.config.input == "processor"
    image = photo(1)
    pixels = ViTImageProcessor.from_pretrained(folder)(image, return_tensors="pt")["pixel_values"]
    result = ours.classify(image)
    seen: list[torch.Tensor] = []  # every block's window attention (transformers returns one per stage)
    blocks = [b.attention for stage in hf.swin.encoder.layers for b in stage.blocks]
    hooks = [m.register_forward_hook(lambda m, args, out: seen.append(out[1])) for m in blocks]
    with torch.no_grad():
        ref = hf(pixel_values=pixels, output_attentions=True)
    for h in hooks:
        h.remove()
    probs = torch.softmax(ref.logits[0], -1).numpy()
    assert probs.max() - probs.min() > 0.2
    np.testing.assert_allclose(result.probs, probs, atol=1e-4)
    assert len(result.windows) == len(seen) == 5 and len(ref.attentions) == 3
    shifts = [w.shift for w in result.windows]
    assert shifts[:3] == [0, 2, 0] and shifts[-1] == 0  # regular, shifted, regular; the last grid is one window
    for ours_w, theirs in zip(result.windows, seen):
        np.testing.assert_allclose(ours_w.weights, theirs.numpy(), atol=1e-4)
    tables = ours.relative_position_bias_tables()  # the Swin tab's bias tables: (heads, 2w − 1, 2w − 1) per block
    table = hf.swin.encoder.layers[0].blocks[1].attention.relative_position_bias.relative_position_bias_table
    assert len(tables) == 5 and tables[1].shape == (3, 7, 7)
    np.testing.assert_allclose(tables[1], table.detach().numpy().T.reshape(3, 7, 7))


def test_grid_not_a_multiple_of_the_window_is_refused(swin_folder, tmp_path: Path) -> None:
    import json
    import shutil

    import models
    from models.io.checkpoint import CheckpointError

    folder, _ = swin_folder
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "window_size": 3}))
    with pytest.raises(CheckpointError, match="not a multiple of the 3-token window"):
        models.load(str(bad))
