"""Calibrated probabilities and the unusual-input check of the Fashion-MNIST models (models/inspect/calibration.py):
the pieces against direct computations, and the shipped models on real photographs that a package ships."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import models
from models.inspect.calibration import (
    FILE,
    Calibration,
    background_share,
    expected_calibration_error,
    fit_features,
    fit_pixels,
    fit_temperature,
    load_calibration,
)
from models.io.checkpoint import CheckpointError, verify

ROOT = Path(__file__).resolve().parent.parent
FASHION = ("vit-fashion", "swin-fashion")


def test_background_share_counts_black_inside_the_object_box_only() -> None:
    img = np.zeros((28, 28), np.uint8)
    img[4:14, 6:16] = 200  # a 10×10 object ...
    img[8:10, 8:10] = 0  # ... with a 2×2 black hole: 4 of the 100 box pixels
    assert background_share(img) == pytest.approx(0.04)
    img[20, 20] = 255  # a stray bright pixel grows the box to rows 4-20, cols 6-20 (17 × 15)
    assert background_share(img) == pytest.approx((17 * 15 - 97) / (17 * 15))  # 97 bright pixels
    assert background_share(np.zeros((28, 28), np.uint8)) == 1.0


def test_temperature_fit_recovers_the_temperature_the_labels_were_drawn_at() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(20000, 10, generator=gen) * 3
    labels = torch.multinomial(torch.softmax(logits / 2.0, -1), 1, generator=gen)[:, 0]
    assert fit_temperature(logits, labels) == pytest.approx(2.0, abs=0.08)


def test_ece_against_a_hand_computed_case() -> None:
    # two bins used: confidence 0.9 (2 samples, 1 right) and 0.6 (2 samples, both right)
    probs = np.array([[0.9, 0.1], [0.9, 0.1], [0.4, 0.6], [0.4, 0.6]])
    labels = np.array([0, 1, 1, 1])
    assert expected_calibration_error(probs, labels) == pytest.approx(0.5 * abs(0.9 - 0.5) + 0.5 * abs(0.6 - 1.0))


def test_feature_distance_is_the_smallest_mahalanobis_distance_to_a_class_mean(tmp_path) -> None:
    rng = np.random.default_rng(0)
    features, labels = rng.normal(size=(600, 5)) + np.repeat(np.arange(3), 200)[:, None], np.repeat(np.arange(3), 200)
    means, precision = fit_features(features, labels, 3)
    cov = np.cov((features - means[labels]).T, bias=True)
    assert np.allclose(np.linalg.inv(precision), cov + 1e-6 * np.eye(5), atol=1e-9)
    images = rng.integers(0, 256, (50, 4, 4)).astype(np.uint8)
    pixel_mean, pixel_basis = fit_pixels(images, components=3)
    cal = Calibration(1.5, means, precision, pixel_mean, pixel_basis, feature_limit=2.0, background_limit=0.1,
                      pixel_limit=1.0, false_alarms=0.05)
    x = rng.normal(size=(4, 5))
    direct = [min((v - m) @ np.linalg.inv(cov + 1e-6 * np.eye(5)) @ (v - m) for m in means) for v in x]
    assert np.allclose(cal.feature_distance(x), np.log(direct))
    # the pixel residual: distance to the best approximation from the mean plus 3 principal directions
    centred = images.reshape(50, -1) / 255.0 - images.reshape(50, -1).mean(0) / 255.0
    basis = np.linalg.svd(centred, full_matrices=False)[2][:3]
    best = [np.linalg.norm(c - basis.T @ np.linalg.lstsq(basis.T, c, rcond=None)[0]) for c in centred]
    assert np.allclose(cal.pixel_residual(images), best)
    cal.save(tmp_path / FILE)
    back = load_calibration(tmp_path / FILE)
    assert back.temperature == 1.5 and back.false_alarms == 0.05 and back.pixel_limit == 1.0
    assert np.array_equal(back.means, means) and np.array_equal(back.pixel_basis, pixel_basis)


@pytest.mark.parametrize("name", FASHION)
def test_shipped_models_carry_a_verified_calibration(name, tmp_path) -> None:
    folder = ROOT / "checkpoints" / name
    assert FILE in verify(folder)  # listed in the manifest, so a damaged file is refused by name
    net = models.load(name)
    cal = net.calibration
    assert 0.3 < cal.temperature < 3 and 0 < cal.false_alarms < 0.1
    # classify() reports softmax(logits / T) with the argmax of the plain softmax
    example = sorted((ROOT / "examples" / "fashion").glob("*.png"))[0]
    result = net.classify(example)
    from models.io.images import fashion_tensor

    x = fashion_tensor(result.image[None])
    with torch.no_grad():
        logits = net(x)[0].double()
    assert np.allclose(result.probs, torch.softmax(logits / cal.temperature, -1).numpy(), atol=1e-5)
    assert result.temperature == cal.temperature
    broken = tmp_path / name
    import shutil

    shutil.copytree(folder, broken)
    (broken / FILE).write_bytes((broken / FILE).read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=FILE):
        models.load(broken)


def _package_photo(name: str) -> Path:
    import skimage  # ships the test photographs (requirements-dev.txt)

    return Path(skimage.__file__).parent / "data" / name


@pytest.mark.parametrize("name", FASHION)
def test_photos_are_flagged_and_fashion_mnist_examples_are_not(name) -> None:
    """Real photographs shipped by scikit-image (an astronaut, a cat, a coffee cup) get the notice; the ten
    Fashion-MNIST test images the app offers do not."""
    net = models.load(name)
    for photo in ("astronaut.png", "chelsea.png", "coffee.png"):
        result = net.classify(_package_photo(photo))
        assert "looks unlike Fashion-MNIST" in result.unusual, (photo, result.unusual)
    examples = sorted((ROOT / "examples" / "fashion").glob("*.png"))
    flagged = [p.name for p in examples if net.classify(p).unusual]
    assert flagged == []
    # the vectorised rule (train.calibrate's figures) agrees with the notice, image by image
    from models.io.images import fashion_tensor

    images = [net.classify(p).image for p in [*(_package_photo(n) for n in ("astronaut.png", "coffee.png")), *examples]]
    x = fashion_tensor(np.stack(images))
    with torch.no_grad():
        features = net.pool(net.forward_features(x)[0])
    many = net.calibration.flagged(np.stack(images), features.double().numpy())
    one = [bool(net.calibration.check(im, f)) for im, f in zip(images, features.double().numpy())]
    assert many.tolist() == one == [True, True] + [False] * len(examples)


def test_a_model_without_calibration_reports_the_plain_softmax() -> None:
    from models.families.vit import ViT, ViTConfig

    torch.manual_seed(0)
    net = ViT(ViTConfig(dim=16, depth=1, heads=2, mlp_dim=32)).eval()
    result = net.classify(np.full((28, 28), 90, np.uint8))
    from models.io.images import fashion_tensor

    logits = net(fashion_tensor(result.image[None]))[0]
    assert np.allclose(result.probs, torch.softmax(logits, -1).detach().numpy(), atol=1e-6)
    assert result.temperature == 1.0 and result.unusual == ""
