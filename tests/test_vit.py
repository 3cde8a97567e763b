"""models/families/vit.py: fused = explicit attention, rows sum to 1, and the ImageResult of the small model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.families.vit import ViT, ViTConfig
from models.outputs import ImageResult

torch.set_num_threads(2)

CONFIGS = {
    "fashion": ViTConfig(),  # 28×28 grey, patch 4 -> 7×7 patches
    "rgb": ViTConfig(image_size=32, in_channels=3, patch=8, dim=32, depth=2, heads=2, mlp_dim=64, num_classes=5,
                     input="imagenet"),
    # a DeiT-like model: [CLS] and a second learned token (as DeiT's distillation token) before the patches
    "two_prefix": ViTConfig(dim=32, depth=2, heads=2, mlp_dim=64, prefix_tokens=2),
}


@pytest.fixture(scope="module")
def models() -> dict[str, ViT]:
    torch.manual_seed(0)
    return {name: ViT(cfg).eval() for name, cfg in CONFIGS.items()}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fused_equals_explicit(models: dict[str, ViT], name: str) -> None:
    model = models[name]
    cfg = model.config
    torch.manual_seed(1)
    x = torch.randn(3, cfg.in_channels, cfg.image_size, cfg.image_size)
    with torch.no_grad():
        fused = model(x)
        explicit, attention = model(x, need_weights=True)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=0)
    tokens = cfg.prefix_tokens + cfg.grid * cfg.grid
    assert attention.shape == (3, cfg.depth, cfg.heads, tokens, tokens)
    torch.testing.assert_close(attention.sum(-1), torch.ones(attention.shape[:-1]), atol=1e-5, rtol=0)
    assert (attention >= 0).all()


def test_classify(models: dict[str, ViT]) -> None:
    model = models["fashion"]
    model.labels = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                    "Ankle boot"]
    img = np.full((50, 80, 3), 250, np.uint8)  # a dark object on a light background
    img[10:40, 20:60] = 30
    result = model.classify(img)
    assert isinstance(result, ImageResult)
    assert result.image.shape == (28, 28) and result.image.dtype == np.uint8
    assert "inverted" in result.notice
    assert result.labels == model.labels and result.probs.shape == (10,)
    assert abs(float(result.probs.sum()) - 1) < 1e-5
    assert result.grid == (7, 7) and result.patch == 4 and result.windows == []
    enc = result.attention["encoder"]
    assert enc.weights.shape == (4, 4, 50, 50) and enc.weights.dtype == np.float32
    assert enc.queries[:3] == ["CLS", "r0c0", "r0c1"] and enc.queries[-1] == "r6c6" and enc.keys == enc.queries
    np.testing.assert_allclose(enc.weights.sum(-1), 1.0, atol=1e-5)
    assert model.training is False


def test_classify_rgb(models: dict[str, ViT]) -> None:
    result = models["rgb"].classify(np.zeros((40, 60, 3), np.uint8))
    assert result.image.shape == (32, 32, 3)
    assert result.attention["encoder"].weights.shape == (2, 2, 17, 17)
    assert result.labels == ["0", "1", "2", "3", "4"]


def test_patch_order_matches_labels() -> None:
    """Patch r{i}c{j} is the token that sees pixel block (i, j): a change there moves only its embedding."""
    torch.manual_seed(0)
    model = ViT(ViTConfig(depth=1)).eval()
    x = torch.zeros(1, 1, 28, 28)
    base = model.patch_embed(x).flatten(2).transpose(1, 2)
    x[0, 0, 8:12, 20:24] = 1.0  # patch row 2, column 5
    changed = (model.patch_embed(x).flatten(2).transpose(1, 2) - base).abs().sum(-1)[0]
    assert model.token_labels()[1 + int(changed.argmax())] == "r2c5"


def test_position_embeddings_and_patch_lookup(models: dict[str, ViT]) -> None:
    model = models["fashion"]
    pos = model.position_embeddings()
    assert pos.shape == (1 + 49, model.config.dim) and pos.dtype == np.float32
    np.testing.assert_array_equal(pos, model.pos_embed.detach().numpy()[0])
    result = model.classify(np.zeros((28, 28), np.uint8))
    # 4-pixel patches on the 28×28 image: pixel (y, x) lies in patch (y // 4, x // 4), clamped to the grid
    assert result.patch_at(0, 0) == (0, 0) and result.patch_at(21.9, 4.0) == (5, 1)
    assert result.patch_at(27.9, 27.9) == (6, 6) and result.patch_at(40, -3) == (6, 0)
    assert result.patch_centre((5, 1)) == (22.0, 6.0) and result.patch_at(*result.patch_centre((5, 1))) == (5, 1)


def test_training_step_runs() -> None:
    torch.manual_seed(0)
    model = ViT(CONFIGS["fashion"]).train()
    loss = torch.nn.functional.cross_entropy(model(torch.randn(2, 1, 28, 28)), torch.tensor([0, 9]))
    loss.backward()
    assert model.pos_embed.grad is not None and model.cls_token.grad is not None


def test_bad_config() -> None:
    with pytest.raises(ValueError, match="multiple"):
        ViT(ViTConfig(image_size=30, patch=4))


def test_two_prefix_tokens_reach_attribution_rollout_and_distance(models: dict[str, ViT]) -> None:
    """Nothing assumes exactly one [CLS]: with a second prefix token every patch map skips both, read from the
    model (``num_prefix_tokens``) and the result (``prefix_tokens``)."""
    from models.analysis import mean_attention_distance, patch_distances, pooled_rollout
    from models.inspect.attribution import explain

    model = models["two_prefix"]
    assert model.num_prefix_tokens == 2 and model.extra_tokens is not None and model.extra_tokens.shape == (1, 1, 32)
    assert "extra_tokens" not in models["fashion"].state_dict()  # one prefix token: the shipped layout, unchanged
    assert model.position_embeddings().shape == (2 + 49, 32)
    img = np.random.default_rng(0).integers(0, 255, (28, 28), dtype=np.uint8)
    result = model.classify(img)
    enc = result.attention["encoder"]
    assert result.prefix_tokens == 2
    assert enc.weights.shape == (2, 2, 51, 51) and enc.queries[:3] == ["CLS", "TOK1", "r0c0"]
    assert enc.queries[result.prefix_tokens] == "r0c0" and enc.queries[-1] == "r6c6"

    # attention and rollout: row 0 ([CLS]) over the 49 patches, computed here from the returned attention
    attention = explain(model, img, "attention")
    cls_row = enc.weights[-1].mean(0)[0]
    np.testing.assert_allclose(attention.values, cls_row[2:].reshape(7, 7), atol=1e-6)
    assert attention.values.sum() < cls_row.sum() - 1e-3  # the second prefix token's share is left out
    rollout = explain(model, img, "rollout")
    np.testing.assert_allclose(rollout.values, pooled_rollout(enc.weights, "cls")[2:].reshape(7, 7), atol=1e-6)
    relevance = explain(model, img, "relevance")
    assert relevance.values.shape == (7, 7) and np.isfinite(relevance.values).all()

    # mean attention distance over the patches alone: both prefix tokens skipped, in pixels between patch centres
    dist = mean_attention_distance(enc.weights, grid=result.grid, patch=result.patch, skip=result.prefix_tokens)
    w = enc.weights[..., 2:, 2:].astype(np.float64)
    w /= w.sum(-1, keepdims=True)
    expected = (w * patch_distances(result.grid, result.patch)).sum(-1).mean(-1)
    np.testing.assert_allclose(dist, expected, rtol=1e-5)
    with pytest.raises(ValueError, match="after skip=1"):
        mean_attention_distance(enc.weights, grid=result.grid, patch=result.patch, skip=1)


def test_a_config_without_prefix_tokens_loads_with_one() -> None:
    import dataclasses

    from models.io.checkpoint import config_from_dict

    data = dataclasses.asdict(ViTConfig())
    del data["prefix_tokens"]  # as the shipped checkpoints' config.json
    assert config_from_dict(ViTConfig, data).prefix_tokens == 1
    with pytest.raises(ValueError, match="prefix_tokens"):
        ViT(ViTConfig(prefix_tokens=0))
