"""Calibrated probabilities and the unusual-input check of the Fashion-MNIST models (models/calibration.py):
the pieces against direct computations, and the shipped models on real photographs that a package ships."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import models
from models.calibration import (
    FILE,
    UNCHECKED,
    Calibration,
    background_share,
    enclosed_share,
    expected_calibration_error,
    fit_features,
    fit_pixels,
    fit_temperature,
    load_calibration,
    thin_share,
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
    from models.inputs.images import fashion_tensor

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
    from models.inputs.images import fashion_tensor

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
    from models.inputs.images import fashion_tensor

    logits = net(fashion_tensor(result.image[None]))[0]
    assert np.allclose(result.probs, torch.softmax(logits, -1).detach().numpy(), atol=1e-6)
    # and says that nothing was checked (issue 48 item 8: the calibration file is optional)
    assert result.temperature == 1.0 and result.unusual == UNCHECKED


def test_enclosed_share_counts_background_cut_off_from_the_border() -> None:
    img = np.zeros((28, 28), np.uint8)
    img[5:15, 5:15] = 200
    assert enclosed_share(img).tolist() == [0.0]  # a filled square encloses nothing
    img[7:13, 7:13] = 0  # a 6×6 hole inside a ring one... two pixels wide
    background = 28 * 28 - 100 + 36
    assert enclosed_share(img)[0] == pytest.approx(36 / background)
    img[10, 5:7] = 0  # a gap in the ring: the hole reaches the border
    assert enclosed_share(img)[0] == 0.0
    diagonal = np.zeros((5, 5), np.uint8)
    diagonal[[1, 1, 1, 2, 2, 3, 3, 3], [1, 2, 3, 1, 3, 1, 2, 3]] = 255
    assert enclosed_share(diagonal)[0] == pytest.approx(1 / 17)  # the one pixel the ring closes in
    assert enclosed_share(np.full((4, 4), 255, np.uint8))[0] == 0.0  # no background at all
    assert enclosed_share(np.stack([img, diagonal[:4, :4].repeat(7, 0).repeat(7, 1)])).shape == (2,)


def test_thin_share_is_the_ink_a_3x3_opening_removes() -> None:
    img = np.zeros((28, 28), np.uint8)
    img[4:14, 4:14] = 200  # solid 10×10: every pixel lies in some 3×3 block of ink
    assert thin_share(img)[0] == 0.0
    img[20, 2:26] = 255  # a one-pixel line of 24 pixels
    assert thin_share(img)[0] == pytest.approx(24 / 124)
    line2 = np.zeros((28, 28), np.uint8)
    line2[10:12, 3:25] = 90  # two pixels wide: still no 3×3 block
    assert thin_share(line2)[0] == 1.0
    assert thin_share(np.zeros((28, 28), np.uint8))[0] == 0.0


def _outline(kind: str, pen: int, seed: int) -> np.ndarray:
    """A hand-drawn-like outline (black pen on white, 512 px), converted as the app converts uploads."""
    from PIL import Image, ImageDraw

    from models.inputs.images import fashion_array

    shapes = {"shoe": [(60, 300), (200, 290), (300, 200), (380, 210), (460, 330), (460, 380), (60, 380)],
              "shirt": [(180, 60), (330, 60), (460, 160), (410, 220), (360, 180), (360, 460), (150, 460),
                        (150, 180), (100, 220), (50, 160)],
              "trousers": [(150, 40), (360, 40), (400, 470), (300, 470), (256, 180), (210, 470), (110, 470)]}
    rng = np.random.default_rng(seed)
    points = [(x + rng.uniform(-8, 8), y + rng.uniform(-8, 8)) for x, y in shapes[kind]]
    canvas = Image.new("L", (512, 512), 255)
    ImageDraw.Draw(canvas).line([*points, points[0]], fill=0, width=pen, joint="curve")
    return fashion_array(canvas)[0]


@pytest.mark.parametrize("name", FASHION)
def test_drawn_outlines_are_flagged_and_fashion_mnist_test_images_mostly_not(name) -> None:
    """Issue 48 item 8: a hand-drawn shoe outline got "Sandal 98.1 %" and no notice. Outlines drawn here (a shoe, a
    shirt, trousers; pens of 2–10 px) are flagged, named as line drawings; of Fashion-MNIST's real test images, read
    from ../shared/data, at most 3 % are (the check is fitted to flag about 2 %)."""
    from models.inputs.images import fashion_tensor
    from train.data import load_fashion

    net = models.load(name)
    drawn = [_outline(kind, pen, seed) for kind in ("shoe", "shirt", "trousers") for pen, seed in ((2, 0), (5, 1),
                                                                                                     (10, 2))]
    for image in drawn:
        notice = net.classify(image).unusual
        assert "looks unlike Fashion-MNIST" in notice and ("thin strokes" in notice or "enclose" in notice), notice
    data = ROOT.parent / "shared" / "data"
    if not (data / "fashion-mnist").is_dir():
        pytest.skip("Fashion-MNIST is not in ../shared/data")
    images = load_fashion(data)["test"][0][:2000]
    with torch.no_grad():
        features = net.pool(net.forward_features(fashion_tensor(images))[0]).double().numpy()
    assert net.calibration.flagged(images, features).mean() <= 0.03
