"""models/io/pretrained.py: torchvision's ViT-B/16 and Swin-T, randomly initialised and converted, give
torchvision's logits; the ImageNet loader works offline from torchvision's cache and fails fast without it.

One ViT-B and one Swin-T (torchvision's, module-scoped) serve every test; ours are built from them."""

from __future__ import annotations

import socket
import urllib.request

import numpy as np
import pytest
import torch
import torchvision.models as tvm
from torchvision.models.swin_transformer import SwinTransformer
from torchvision.models.vision_transformer import VisionTransformer

from models.families.swin import Swin, SwinConfig
from models.families.vit import ViT, ViTConfig
from models.io import pretrained
from models.io.pretrained import (
    WeightsUnavailableError,
    convert_swin,
    convert_vit,
    imagenet_labels,
    load_imagenet,
    swin_from_torchvision,
    vit_from_torchvision,
    weights_path,
)

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def image() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(1, 3, 224, 224)


@pytest.fixture(scope="module")
def tv_vit() -> VisionTransformer:
    torch.manual_seed(0)
    model = tvm.vit_b_16().eval()
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)  # torchvision zero-initialises the head
    return model


@pytest.fixture(scope="module")
def tv_swin() -> SwinTransformer:
    torch.manual_seed(0)
    return tvm.swin_t().eval()


def check_same_logits(reference: torch.nn.Module, ours: ViT | Swin, x: torch.Tensor, fused: bool = True) -> None:
    """Our explicit path (and fused path, unless skipped to save time on the big models: fused = explicit
    is tested on every architecture in test_vit.py / test_swin.py and on the small ones here) gives the
    reference's logits."""
    with torch.no_grad():
        expected = reference(x)
        explicit, attention = ours(x, need_weights=True)
        if fused:
            fast = ours(x)
            torch.testing.assert_close(fast, expected, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(fast, explicit, atol=1e-5, rtol=0)
    assert expected.abs().max() > 1e-2  # not a trivially zero comparison
    torch.testing.assert_close(explicit, expected, atol=1e-4, rtol=1e-4)
    for weights in attention if isinstance(attention, list) else [attention]:
        w = weights.weights if hasattr(weights, "weights") else weights
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-5, rtol=0)


def test_vit_b_16_matches_torchvision(tv_vit: VisionTransformer, image: torch.Tensor) -> None:
    ours = vit_from_torchvision(tv_vit.state_dict())
    assert ours.config.patch == 16 and ours.grid == (14, 14)
    check_same_logits(tv_vit, ours, image, fused=False)


def test_swin_t_matches_torchvision(tv_swin: SwinTransformer, image: torch.Tensor) -> None:
    ours = swin_from_torchvision(tv_swin.state_dict())
    assert ours.grid == (56, 56)
    check_same_logits(tv_swin, ours, image, fused=False)


def test_small_swin_with_padding_matches_torchvision() -> None:
    """A grid that is not a multiple of the window and odd sides at patch merging: both padded as
    torchvision does."""
    torch.manual_seed(0)
    reference = SwinTransformer(patch_size=[2, 2], embed_dim=16, depths=[2, 2, 2], num_heads=[2, 2, 4],
                                window_size=[4, 4], num_classes=7).eval()
    cfg = SwinConfig(image_size=22, in_channels=3, patch=2, embed_dim=16, depths=(2, 2, 2), heads=(2, 2, 4),
                     window=4, num_classes=7, input="imagenet")
    ours = swin_from_torchvision(reference.state_dict(), config=cfg)
    check_same_logits(reference, ours, torch.randn(2, 3, 22, 22))  # 11×11 -> 6×6 -> 3×3 tokens


def test_small_vit_matches_torchvision() -> None:
    torch.manual_seed(0)
    reference = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
                                  mlp_dim=64, num_classes=5).eval()
    torch.nn.init.normal_(reference.heads.head.weight, std=0.2)
    cfg = ViTConfig(image_size=32, in_channels=3, patch=8, dim=32, depth=2, heads=2, mlp_dim=64, num_classes=5,
                    input="imagenet")
    check_same_logits(reference, vit_from_torchvision(reference.state_dict(), config=cfg),
                      torch.randn(2, 3, 32, 32))


def test_conversion_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match="unexpected key"):
        convert_vit({"encoder.something": torch.zeros(1)})
    with pytest.raises(ValueError, match="unexpected key"):
        convert_swin({"classifier.weight": torch.zeros(1)})


def test_labels() -> None:
    labels = imagenet_labels("vit_b_16")
    assert len(labels) == 1000 and labels[0] == "tench"
    assert imagenet_labels("swin_t") == labels
    with pytest.raises(ValueError, match="unknown"):
        imagenet_labels("resnet50")  # type: ignore[arg-type]


# -------------------------------------------------------------------------------------- offline loader
@pytest.fixture
def offline(monkeypatch, tmp_path):
    """A fresh TORCH_HOME and no network: any connection attempt fails at once."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))

    def refuse(*args, **kwargs):
        raise OSError("network disabled in tests")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    return tmp_path


def test_weights_path_follows_torch_home(offline) -> None:
    path = weights_path("vit_b_16")
    assert path == offline / "hub" / "checkpoints" / "vit_b_16-c867db91.pth"
    assert weights_path("swin_t").name == "swin_t-704ceda3.pth"


def test_load_imagenet_from_cache_offline(offline, tv_swin: SwinTransformer) -> None:
    path = weights_path("swin_t")
    path.parent.mkdir(parents=True)
    torch.save(tv_swin.state_dict(), path)
    model = load_imagenet("swin_t")
    assert isinstance(model, Swin) and not model.training
    assert model.labels == imagenet_labels("swin_t")
    assert model.config.resize == 232 and model.config.interpolation == "bicubic"
    expected = convert_swin(tv_swin.state_dict())  # whose logits test_swin_t_matches_torchvision checks
    for name, value in model.state_dict().items():
        assert torch.equal(value, expected[name]), name
    result = model.classify(np.full((300, 200, 3), 128, np.uint8))
    assert result.image.shape == (224, 224, 3) and result.probs.shape == (1000,)
    assert len(result.windows) == 12 and result.grid == (56, 56) and result.patch == 4


def test_load_imagenet_not_cached_fails_without_network(offline) -> None:
    with pytest.raises(WeightsUnavailableError, match="not cached") as info:
        load_imagenet("vit_b_16")
    assert str(weights_path("vit_b_16")) in str(info.value)


def test_load_imagenet_download_offline_fails_clearly(offline) -> None:
    with pytest.raises(WeightsUnavailableError, match="Could not reach"):
        load_imagenet("vit_b_16", download=True, timeout=1.0)
    assert not weights_path("vit_b_16").exists()


def test_load_imagenet_corrupt_cache(offline) -> None:
    path = weights_path("swin_t")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(WeightsUnavailableError, match="could not be read") as info:
        load_imagenet("swin_t")
    assert str(path) in str(info.value)


def test_download_uses_torch_hub_with_hash_prefix(offline, monkeypatch) -> None:
    """With download=True and the network reachable, torch.hub's downloader fetches into the cache
    (stubbed here: the test never touches the network)."""
    calls = []

    class Reachable:
        def close(self) -> None:
            pass

    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: Reachable())

    def fake_download(url: str, dst: str, hash_prefix: str | None, progress: bool = True) -> None:
        calls.append((url, dst, hash_prefix, socket.getdefaulttimeout()))
        raise RuntimeError("stop here")

    monkeypatch.setattr(pretrained.torch.hub, "download_url_to_file", fake_download)
    with pytest.raises(WeightsUnavailableError, match="failed"):
        load_imagenet("swin_t", download=True, timeout=3.0)
    assert calls == [("https://download.pytorch.org/models/swin_t-704ceda3.pth",
                      str(weights_path("swin_t")), "704ceda3", 3.0)]
    assert socket.getdefaulttimeout() is None  # restored
