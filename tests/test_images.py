"""models/inputs/images.py: every kind of image a person may upload becomes exactly what the model expects."""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from models.inputs import images
from models.inputs.images import (
    FASHION_MEAN,
    FASHION_STD,
    fashion_array,
    fashion_tensor,
    open_image,
    prepare,
    prepare_fashion,
    prepare_imagenet,
    to_grey,
)


def encode(img: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def light_photo(w: int = 120, h: int = 80) -> Image.Image:
    """A dark object in the middle of a white background, like a product photo."""
    a = np.full((h, w, 3), 245, np.uint8)
    a[h // 4 : 3 * h // 4, w // 3 : 2 * w // 3] = (40, 30, 20)
    return Image.fromarray(a)


# ------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "empty"),
        (b"this is not an image at all", "not an image"),
        (encode(light_photo(), "PNG")[:200], "truncated or corrupt"),  # truncated PNG
        (encode(light_photo(), "JPEG")[:300], "truncated or corrupt"),  # truncated JPEG
    ],
    ids=["zero-byte", "non-image", "truncated-png", "truncated-jpeg"],
)
def test_unusable_bytes_raise_clear_value_error(data: bytes, message: str) -> None:
    for convert in (prepare_fashion, prepare_imagenet):
        with pytest.raises(ValueError, match=message):
            convert(data)


def test_unusable_files_raise_clear_value_error(tmp_path) -> None:
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        prepare_fashion(empty)
    with pytest.raises(ValueError, match="Could not read"):
        prepare_fashion(tmp_path / "missing.png")
    with pytest.raises(ValueError, match="Expected an image"):
        prepare_fashion(12345)  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", [(4, 4, 2), (4,), (0, 5), (2, 3, 4, 5)])
def test_bad_arrays_raise(shape) -> None:
    with pytest.raises(ValueError):
        prepare_fashion(np.zeros(shape, np.uint8))


def test_pixel_limit(monkeypatch) -> None:
    monkeypatch.setattr(images, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(ValueError, match="too large"):
        prepare_fashion(encode(Image.new("RGB", (50, 50)), "PNG"))
    # a JPEG over the limit is decoded at a reduced scale instead, with a notice
    out = prepare_imagenet(encode(light_photo(64, 64), "JPEG"))
    assert out.shown.shape == (224, 224, 3)
    assert "reduced to 16×16" in out.notice
    opened, _ = open_image(encode(light_photo(64, 64), "JPEG"))
    assert opened.size == (16, 16)
    # an image already in memory is reduced by an integer factor
    for in_memory in (np.zeros((50, 70), np.uint8), Image.new("P", (70, 50)), Image.new("CMYK", (70, 50))):
        opened, notice = open_image(in_memory)
        assert opened.size[0] * opened.size[1] <= 1000 and "reduced" in notice
        assert prepare_fashion(in_memory).shown.shape == (28, 28)


# ---------------------------------------------------------------------------------- image kinds
def test_one_pixel() -> None:
    grey, _ = fashion_array(Image.new("L", (1, 1), 200))  # light "background" -> inverted to 55
    assert grey.shape == (28, 28) and grey.dtype == np.uint8
    assert grey.max() == 55
    shown = prepare_imagenet(np.array([[[10, 20, 30]]], np.uint8)).shown
    assert shown.shape == (224, 224, 3)
    assert (shown == (10, 20, 30)).all()


def test_rgba_composited_on_white() -> None:
    a = np.zeros((30, 40, 4), np.uint8)
    a[..., 0] = 255  # red, but fully transparent ...
    a[10:20, 10:30] = (0, 0, 255, 255)  # ... except an opaque blue box
    for source in (Image.fromarray(a), a, encode(Image.fromarray(a), "PNG")):
        shown = prepare_imagenet(source).shown
        assert (shown[0, 0] == 255).all()  # transparent -> white, not red or black
        assert tuple(shown[112, 112]) == (0, 0, 255)
        grey, notice = fashion_array(source)
        assert grey[0, 0] == 0 and grey[14, 14] > 200 and "inverted" in notice


def test_a_light_object_on_a_transparent_ground_stays_light() -> None:
    """Issue 61, item 8: a light object on a transparent ground was composited on white, taken for a light background
    and inverted to near black, without a word. The transparent ground is the model's black, the object stays light
    (each pixel's grey times its opacity, known answers), and the notice says so; a dark object on a transparent
    ground is made light (255 − grey), as Fashion-MNIST objects are."""
    a = np.zeros((28, 28, 4), np.uint8)  # 28×28: no resize, so the answer is per pixel
    a[..., :3] = 255  # the ground's colour is white, but fully transparent
    a[6:22, 8:20] = (220, 220, 220, 255)  # a light-grey opaque shirt ...
    a[6:22, 20] = (220, 220, 220, 128)  # ... with a half-transparent edge
    grey, notice = fashion_array(Image.fromarray(a, "RGBA"))
    assert grey[0, 0] == 0 and grey[10, 10] == 220 and grey[10, 20] == round(220 * 128 / 255)
    assert "Transparent background" in notice and "on black" in notice and "inverted" not in notice
    a[6:22, 8:21, :3] = 30  # the same shape, dark
    grey, notice = fashion_array(Image.fromarray(a, "RGBA"))
    assert grey[0, 0] == 0 and grey[10, 10] == 255 - 30 and "inverted to light" in notice
    la = Image.fromarray(a, "RGBA").convert("LA")  # grey + alpha reads the same way
    assert np.array_equal(fashion_array(la)[0], grey)
    opaque = a.copy()
    opaque[..., 3] = 255  # no transparency: the border rule as before (a white ground: inverted)
    assert "Light background" in fashion_array(Image.fromarray(opaque, "RGBA"))[1]


def test_the_upload_preview_shows_transparency_on_the_model_s_ground(tmp_path) -> None:
    """The Vision tab's "your image" put a transparent ground on white while a Fashion-MNIST model puts it on black
    (issue 61, item 8), so the preview looked like a light background the model had not inverted. The preview now
    composites on the model's own ground: black where a Fashion-MNIST model sees a see-through ground (the model's
    input's ground, pixel for pixel), white for the RGB models (their preprocessing's) and for a nearly opaque image,
    which a Fashion-MNIST model reads on white too."""
    from tabs.vision import PREVIEW_SIDE, preview

    a = np.zeros((28, 28, 4), np.uint8)
    a[..., :3] = 255  # a white but fully transparent ground ...
    a[6:22, 8:20] = (220, 200, 180, 255)  # ... under a light opaque shirt
    path = tmp_path / "shirt.png"
    Image.fromarray(a, "RGBA").save(path)
    shown, seen = preview(str(path), "vit-fashion")
    k = PREVIEW_SIDE // 28  # both pictures enlarged pixel for pixel
    ground = a[..., 3] == 0
    assert (shown[::k, ::k][ground] == 0).all() and (seen[::k, ::k][ground] == 0).all()  # the model's black
    assert tuple(shown[10 * k, 10 * k]) == (220, 200, 180)  # the object as uploaded
    rgb, _ = preview(str(path), "ViT-B/16 (ImageNet)")  # an RGB model (its weights need not be here)
    assert (rgb[::k, ::k][ground] == 255).all() and (prepare_imagenet(Image.open(path)).shown[0, 0] == 255).all()
    a[..., 3] = 255
    a[0, 0, 3] = 0  # one transparent pixel: read as any other image, on white (to_grey), by the model as well
    Image.fromarray(a, "RGBA").save(path)
    shown, _ = preview(str(path), "vit-fashion")
    assert (shown[0, 0] == 255).all() and np.asarray(to_grey(Image.open(path)))[0, 0] == 255


def test_palette_with_and_without_transparency() -> None:
    p = light_photo().convert("P", palette=Image.Palette.ADAPTIVE, colors=8)
    assert prepare_imagenet(encode(p, "PNG")).shown.shape == (224, 224, 3)
    p.info["transparency"] = 0
    grey, _ = fashion_array(encode(p, "GIF", transparency=0))
    assert grey.shape == (28, 28)


def test_sixteen_bit_grey() -> None:
    a = np.zeros((20, 20), np.uint16)
    a[5:15, 5:15] = 65535
    img = Image.fromarray(a)  # mode I;16
    reopened = Image.open(io.BytesIO(encode(img, "PNG")))
    assert reopened.mode in ("I;16", "I")
    for source in (img, reopened, a):
        grey, notice = fashion_array(source)
        assert grey.max() == 255 and grey[0, 0] == 0 and notice == ""  # dark background: not inverted
    assert prepare_imagenet(reopened).shown.max() == 255


def test_float_and_bool_arrays() -> None:
    f = np.zeros((28, 28), np.float32)
    f[10:18, 10:18] = 1.0
    assert fashion_array(f)[0].max() == 255
    assert fashion_array(f > 0.5)[0].max() == 255
    assert fashion_array(np.zeros((28, 28, 1), np.uint8))[0].max() == 0


def test_cmyk_jpeg() -> None:
    cmyk = Image.new("CMYK", (64, 48), (0, 255, 255, 0))  # pure red in CMYK
    data = encode(cmyk, "JPEG", quality=95)
    assert Image.open(io.BytesIO(data)).mode == "CMYK"
    r, g, b = prepare_imagenet(data).shown[112, 112].astype(int)
    assert r > 200 and g < 60 and b < 60


@pytest.mark.parametrize("mode", ["1", "LA", "La", "PA", "RGBa", "YCbCr", "HSV", "LAB", "I", "F", "I;16B"])
def test_other_modes(mode: str) -> None:
    img = Image.new(mode, (7, 5))
    assert fashion_array(img)[0].shape == (28, 28)
    assert prepare_imagenet(img).shown.shape == (224, 224, 3)


def test_animated_gif_uses_first_frame() -> None:
    frames = [Image.new("RGB", (32, 32), colour) for colour in ((0, 0, 0), (255, 255, 255))]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    img = Image.open(io.BytesIO(data))
    assert img.n_frames == 2
    img.seek(1)  # even when the caller left it on a later frame
    assert prepare_imagenet(img).shown.max() == 0
    assert prepare_imagenet(data).shown.max() == 0


def test_exif_orientation_applied() -> None:
    img = Image.new("L", (40, 20), 0)  # landscape as stored ...
    img.paste(255, (0, 0, 10, 20))  # ... with a white band on the left
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° clockwise to display"
    data = encode(img, "JPEG", exif=exif.tobytes(), quality=95)
    opened, _ = open_image(data)
    assert opened.size == (20, 40)  # portrait as displayed
    grey, _ = fashion_array(data)
    cols = np.nonzero(grey.max(axis=0) > 0)[0]
    assert cols.min() >= 6 and cols.max() <= 21  # fitted: 14 columns wide, centred in 28


# ---------------------------------------------------------------------------------------- fashion
def test_light_background_photo_is_inverted_and_fitted() -> None:
    grey, notice = fashion_array(light_photo(120, 80))
    assert "inverted" in notice
    assert grey.shape == (28, 28)
    # the aspect ratio is kept: 120×80 -> 28×19 rows padded with black above and below
    assert (grey[:4] == 0).all() and (grey[-4:] == 0).all()
    assert grey[14, 14] > 200  # the dark object became bright
    assert grey[6, 1] < 30  # the white background became dark


def test_dark_background_not_inverted() -> None:
    a = np.zeros((60, 60), np.uint8)
    a[20:40, 20:40] = 220
    grey, notice = fashion_array(a)
    assert notice == "" and grey[0, 0] == 0 and grey[14, 14] > 200


def test_fashion_mnist_sample_passes_unchanged() -> None:
    rng = np.random.default_rng(0)
    sample = np.zeros((28, 28), np.uint8)
    sample[4:24, 6:22] = rng.integers(0, 256, (20, 16), dtype=np.uint8)
    out = prepare_fashion(sample)
    np.testing.assert_array_equal(out.shown, sample)
    assert out.tensor.shape == (1, 1, 28, 28) and out.tensor.dtype == torch.float32
    expected = (torch.from_numpy(sample).float() / 255 - FASHION_MEAN) / FASHION_STD
    torch.testing.assert_close(out.tensor[0, 0], expected)
    assert fashion_tensor(np.stack([sample, sample])).shape == (2, 1, 28, 28)


FASHION_T10K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "fashion-mnist" / \
    "t10k-images-idx3-ubyte.gz"


@pytest.mark.skipif(not FASHION_T10K.is_file(), reason="Fashion-MNIST not in ../shared/data")
def test_real_fashion_mnist_images_pass_unchanged() -> None:
    """The border rule never inverts a real Fashion-MNIST image (checked on 2,000 t10k images)."""
    with gzip.open(FASHION_T10K) as f:
        data = f.read(16 + 2000 * 28 * 28)
    samples = np.frombuffer(data, np.uint8, offset=16).reshape(-1, 28, 28)
    assert not any(images.light_background(a) for a in samples)
    for sample in samples[:50]:
        np.testing.assert_array_equal(fashion_array(sample)[0], sample)


# --------------------------------------------------------------------------------------- imagenet
@pytest.mark.parametrize("weights_name", ["ViT_B_16_Weights", "Swin_T_Weights"])
def test_imagenet_matches_torchvision_transforms(weights_name: str) -> None:
    import torchvision.models as tvm

    weights = getattr(tvm, weights_name).IMAGENET1K_V1
    transform = weights.transforms()
    rng = np.random.default_rng(1)
    img = Image.fromarray(rng.integers(0, 256, (300, 410, 3), dtype=np.uint8))
    out = prepare_imagenet(img, resize=transform.resize_size[0], crop=transform.crop_size[0],
                           interpolation=transform.interpolation.value)
    assert out.shown.shape == (224, 224, 3) and out.shown.dtype == np.uint8
    torch.testing.assert_close(out.tensor, transform(img).unsqueeze(0), atol=1e-5, rtol=0)


def test_prepare_dispatch() -> None:
    assert prepare(light_photo(), "fashion").shown.shape == (28, 28)
    assert prepare(light_photo(), "imagenet").tensor.shape == (1, 3, 224, 224)
    with pytest.raises(ValueError, match="unknown"):
        prepare(light_photo(), "cifar")


def test_a_large_jpeg_is_decoded_at_reduced_scale_for_a_small_input(tmp_path) -> None:
    """Issue 48, item 11: a 6000×6000 photo took seconds to preview and classify, decoded in full for a 28×28
    input. A JPEG much larger than what the model needs is decoded at 1/2, 1/4 or 1/8 scale (never below the
    needed side); the 28×28 image barely changes, and other formats and small JPEGs are decoded in full."""
    from PIL import Image, ImageDraw

    from models.inputs.images import FASHION_DECODE, fashion_array, open_image

    big = Image.new("RGB", (4000, 3000), (250, 250, 250))
    ImageDraw.Draw(big).ellipse((800, 600, 3200, 2400), fill=(40, 40, 120))
    path = tmp_path / "big.jpg"
    big.save(path, quality=90)
    assert open_image(str(path))[0].size == (4000, 3000)
    assert open_image(str(path), at_least=FASHION_DECODE)[0].size == (500, 375)  # 1/8: both sides >= 224
    assert open_image(str(path), at_least=400)[0].size == (1000, 750)  # 1/4: 1/8 would give 375 < 400
    reduced = fashion_array(str(path))[0]
    full = fashion_array(Image.open(path).convert("RGB"))[0]  # in memory: decoded in full
    assert np.abs(reduced.astype(int) - full.astype(int)).mean() < 2.0
    png = tmp_path / "big.png"
    big.save(png)
    assert open_image(str(png), at_least=FASHION_DECODE)[0].size == (4000, 3000)


def test_the_upload_preview_does_not_import_torch() -> None:
    """Issue 48, item 11: the upload preview waited for torch's import (seconds on a fresh server) though it only
    needs PIL and numpy; models.inputs.images imports torch where it makes a tensor."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    code = ("import sys; import app; from tabs.common import EXAMPLE_IMAGES; from tabs.vision import preview; "
            "shown, seen = preview(str(EXAMPLE_IMAGES[0]), 'vit-fashion'); assert shown is not None; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "ATLAS_WARM": "0"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
