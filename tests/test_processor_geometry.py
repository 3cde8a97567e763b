"""Every image processor the project reads gives transformers' own pixels: resize size, crop box, padding (issue 70).

transformers' image processors (the torchvision backend ``from_pretrained`` gives) and the project's preparation run
the same torchvision resize kernel on the same uint8 tensor, so the pixel tensors are compared to 1e-6 (they agree to
the bit: the rescale is fused into the normalisation as transformers fuses it) over many image sizes: 1 × 1 and 3 × 5,
odd and even, portrait and landscape, 1031 × 517, and sizes whose resized side minus the crop is odd (3 and 7: where
torchvision's own ``center_crop``, which rounds the offset half to even, takes its box one pixel further than
transformers' floor).

- the processors a folder may carry, written by transformers and read as the project reads them
  (``models.io.hf._with_processor`` for an image classifier, ``models.io.hf_vlm``'s reader for LLaVA and PaliGemma):
  CLIP (also with ``size`` and ``crop_size`` as ints, the shorter side; and with ``longest_edge``), BiT with a crop
  larger than the resized image (padded), DeiT with odd resize − crop margins, ConvNeXt's ``crop_pct`` below and at
  384, ViT square and ``max_height`` / ``max_width``, nearest (torchvision's "nearest-exact"), SigLIP;
- every family through its loaded random-weight folder (tests/parity_folders.py): ViT, DeiT, Swin (the classifier's
  ``prepare``), LLaVA and PaliGemma (``layout``'s pixels), Idefics3's tiles and global view, Qwen2.5-VL's patches;
- the geometry itself: an image whose pixels spell their coordinates, resized with nearest: every pixel the model
  sees is the source pixel transformers' processor puts there; ``center_crop`` against transformers'
  ``TorchvisionBackend.center_crop`` for every image and crop side up to 12, padding included; the resize sizes
  against transformers' size functions (shortest edge, with longest edge, max height and width, Idefics3's longest
  edge with its 4096 cap, Qwen2-VL's smart resize).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

transformers = pytest.importorskip("transformers")

# (width, height): tiny, odd and even, portrait and landscape, large; with shortest_edge 30 and a crop of 30,
# 30 × 33, 20 × 22 (resized to 30 × 33), 30 × 37 and their transposes leave an odd margin of 3 or 7
SIZES = [(1, 1), (3, 5), (5, 3), (2, 7), (30, 30), (31, 30), (30, 31), (30, 33), (33, 30), (20, 22), (22, 20),
         (30, 37), (37, 30), (29, 41), (23, 17), (44, 30), (64, 48), (1031, 517), (517, 1031)]
TOL = 1e-6


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def noise(w: int, h: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed + 7919 * w + h)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def coordinates(w: int, h: int) -> Image.Image:
    """An image whose pixel (x, y) spells x and y (< 4096): red x mod 256, green y mod 256, blue their high nibbles."""
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x % 256, y % 256, (x // 256) * 16 + y // 256], -1).astype(np.uint8)
    return Image.fromarray(rgb)


def decode(shown: np.ndarray) -> np.ndarray:
    """uint8 (H, W, 3) of ``coordinates`` -> int (H, W, 2): the source (x, y) of each pixel."""
    a = shown.astype(np.int64)
    return np.stack([a[..., 0] + 256 * (a[..., 2] // 16), a[..., 1] + 256 * (a[..., 2] % 16)], -1)


# ------------------------------------------------------------------------------------ processors a folder may carry
# name -> (transformers class, its settings, how the project reads the folder, the model's image side, json edits)
PROCESSORS = {
    "clip": ("CLIPImageProcessor", dict(size={"shortest_edge": 30}, crop_size={"height": 30, "width": 30}, resample=3,
                                        image_mean=[0.48, 0.46, 0.41], image_std=[0.27, 0.26, 0.28]), "square", 30, {}),
    # an older file's ints: CLIP reads size as the shorter side, crop_size as a square
    "clip-int": ("CLIPImageProcessor", dict(resample=2), "square", 30, {"size": 30, "crop_size": 30}),
    "clip-longest": ("CLIPImageProcessor", dict(size={"shortest_edge": 30, "longest_edge": 41},
                                                crop_size={"height": 30, "width": 30}, resample=3), "square", 30, {}),
    "clip-nearest": ("CLIPImageProcessor", dict(size={"shortest_edge": 30}, crop_size={"height": 30, "width": 30},
                                                resample=0), "square", 30, {}),
    "siglip": ("SiglipImageProcessor", dict(size={"height": 28, "width": 28}, resample=3), "square", 28, {}),
    # the crop larger than the resized image on one side or both: zeros around it
    "bit-padded": ("BitImageProcessor", dict(size={"shortest_edge": 17}, crop_size={"height": 30, "width": 23},
                                             resample=0), "classifier", 30, {}),
    # margins of 3 and 7 whatever the image
    "deit-odd": ("DeiTImageProcessor", dict(size={"height": 35, "width": 39}, crop_size={"height": 32, "width": 32},
                                            resample=3), "classifier", 32, {}),
    "deit-int": ("DeiTImageProcessor", dict(resample=2), "classifier", 32, {"size": 39, "crop_size": 32}),
    "convnext": ("ConvNextImageProcessor", dict(size={"shortest_edge": 30}, crop_pct=0.87), "classifier", 30, {}),
    "convnext-384": ("ConvNextImageProcessor", dict(size={"shortest_edge": 384}), "classifier", 384, {}),
    "vit-nearest": ("ViTImageProcessor", dict(size={"height": 30, "width": 31}, resample=0), "classifier", 30, {}),
    "vit-max": ("ViTImageProcessor", dict(size={"max_height": 30, "max_width": 26}), "classifier", 30, {}),
}


def _folder(tmp_path: Path, name: str) -> tuple[Path, object]:
    """The processor written by transformers into a folder (edited as the case says), and transformers' processor read
    back from it as a user's would be (``AutoImageProcessor.from_pretrained``)."""
    cls, settings, _, _, edits = PROCESSORS[name]
    folder = tmp_path / name
    getattr(transformers, cls)(**settings).save_pretrained(folder)
    if edits:
        path = folder / "preprocessor_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **edits}))
    theirs = transformers.AutoImageProcessor.from_pretrained(folder)
    assert type(theirs).__name__ == cls  # the torchvision backend, the one the project follows
    return folder, theirs


def _spec(folder: Path, name: str) -> dict:
    """The processor's spec as the project reads the folder."""
    _, _, reader, side, _ = PROCESSORS[name]
    if reader == "classifier":
        from models.io.hf import _with_processor

        model = _with_processor(SimpleNamespace(config=SimpleNamespace(image_size=side)), folder)
        return model.config.processor
    from models.io.hf_vlm import _image_processor, _square_spec

    where = folder / "config.json"
    pre, _ = _image_processor(folder, where)
    return _square_spec(pre, SimpleNamespace(image_size=side), where)


def _usable(name: str, w: int, h: int) -> bool:
    if name == "vit-max":  # a side scaled below one pixel: transformers fails too
        s = min(30 / h, 26 / w)
        return int(h * s) >= 1 and int(w * s) >= 1
    return True


@pytest.mark.parametrize("name", PROCESSORS)
def test_processor_pixels_are_transformers(tmp_path: Path, name: str) -> None:
    from models.inputs.images import prepare_processor

    folder, theirs = _folder(tmp_path, name)
    spec = _spec(folder, name)
    for w, h in SIZES:
        if not _usable(name, w, h):
            continue
        image = noise(w, h)
        want = theirs(images=image, return_tensors="pt").pixel_values
        got = prepare_processor(image, spec).tensor
        assert got.shape == want.shape, (name, (w, h))
        err = float((got - want).abs().max())
        assert err <= TOL, f"{name}: a {w}×{h} image's pixels differ by {err:.3g}"


@pytest.mark.parametrize("name", ["clip-nearest", "bit-padded", "vit-nearest", "deit-odd"])
def test_crop_box_is_transformers(tmp_path: Path, name: str) -> None:
    """With nearest resampling every pixel the model sees is one source pixel: its coordinates are transformers'
    (padding: its zeros where transformers has them)."""
    from models.inputs.images import prepare_processor

    folder, theirs = _folder(tmp_path, name)
    spec = _spec(folder, name)
    if name == "deit-odd":  # its file says bicubic: read the same folder with nearest on both sides
        theirs = transformers.AutoImageProcessor.from_pretrained(folder, resample=0)
        spec = {**spec, "interpolation": "nearest-exact"}
    for w, h in SIZES:
        image = coordinates(w, h)
        want = theirs(images=image, return_tensors="pt", do_rescale=False, do_normalize=False).pixel_values[0]
        shown = prepare_processor(image, spec).shown
        np.testing.assert_array_equal(shown, want.permute(1, 2, 0).to(torch.uint8).numpy(),
                                      err_msg=f"{name}: {w}×{h}")
        if name == "clip-nearest" and (w, h) == (30, 37):  # the margin of 7: transformers' box starts at row 3
            assert decode(shown)[0, 0].tolist() == [0, 3]


def test_torchvision_center_crop_would_be_a_pixel_off() -> None:
    """The bug this file guards: torchvision's ``center_crop`` on a 30 × 37 (margin 7) starts at row 4, transformers'
    at row 3; ``prepare_imagenet`` keeps torchvision's (the reference of the torchvision weights)."""
    from torchvision.transforms.v2 import functional as TF

    from models.inputs.images import center_crop

    t = torch.from_numpy(np.array(coordinates(30, 37))).permute(2, 0, 1)
    ours = decode(center_crop(t, [30, 30]).permute(1, 2, 0).numpy())
    torchvision = decode(TF.center_crop(t, [30, 30]).permute(1, 2, 0).numpy())
    assert ours[0, 0].tolist() == [0, 3] and torchvision[0, 0].tolist() == [0, 4]


def test_center_crop_is_transformers_for_every_small_size() -> None:
    """``center_crop`` against transformers' ``TorchvisionBackend.center_crop`` for every image and crop side from
    1 to 12 (crop larger than the image on either side: padded); and against image_transforms.center_crop (the PIL
    backend's) where no padding is needed (it pads with the extra pixel before, not after)."""
    from transformers.image_processing_backends import TorchvisionBackend
    from transformers.image_transforms import center_crop as np_center_crop
    from transformers.image_utils import ChannelDimension, SizeDict

    from models.inputs.images import center_crop

    backend = transformers.ViTImageProcessor()
    for h in range(1, 13):
        for w in range(1, 13):
            t = torch.arange(1, 3 * h * w + 1, dtype=torch.int32).reshape(3, h, w)  # every value distinct, none 0
            for ch in range(1, 13):
                for cw in range(1, 13):
                    want = TorchvisionBackend.center_crop(backend, t, SizeDict(height=ch, width=cw))
                    got = center_crop(t, [ch, cw])
                    assert torch.equal(got, want), (h, w, ch, cw)
                    if ch <= h and cw <= w:
                        np_want = np_center_crop(t.numpy(), (ch, cw), input_data_format=ChannelDimension.FIRST)
                        assert np.array_equal(got.numpy(), np_want), (h, w, ch, cw)


def test_resize_sizes_are_transformers() -> None:
    from transformers.image_transforms import get_resize_output_image_size, get_size_with_aspect_ratio
    from transformers.image_utils import ChannelDimension, get_image_size_for_max_height_width

    from models.inputs.images import processor_resize

    sides = [1, 2, 3, 5, 7, 17, 30, 31, 224, 336, 517, 1031, 4000]
    for h in sides:
        for w in sides:
            image = np.empty((3, h, w), np.uint8)
            for short in (1, 7, 30, 224, 383):
                want = get_resize_output_image_size(image, short, default_to_square=False,
                                                    input_data_format=ChannelDimension.FIRST)
                assert processor_resize(h, w, {"shortest_edge": short}) == tuple(want), (h, w, short)
                for longest in (short + 1, 2 * short + 3, 1333):
                    want = get_size_with_aspect_ratio((h, w), short, longest)
                    got = processor_resize(h, w, {"shortest_edge": short, "longest_edge": longest})
                    assert got == tuple(want), (h, w, short, longest)
            for mh, mw in ((30, 26), (224, 224), (7, 1000)):
                want = get_image_size_for_max_height_width((h, w), mh, mw)
                assert processor_resize(h, w, {"max_hw": [mh, mw]}) == tuple(want), (h, w, mh, mw)


def test_vlm_sizes_are_transformers() -> None:
    """Idefics3's first resize (its longest edge, then the 4096 cap in the proportion of that resize) and Qwen2-VL's
    smart resize, against transformers' own functions."""
    from transformers.models.idefics3.image_processing_idefics3 import get_resize_output_image_size
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize as their_smart_resize

    from models.families.hf_vlm import longest_edge_size, smart_resize

    sides = [1, 2, 3, 5, 7, 17, 30, 31, 33, 64, 199, 517, 1031, 4000, 5000]
    for h in sides:
        for w in sides:
            for longest in (32, 64, 1456, 4100, 6000):
                want = get_resize_output_image_size(torch.empty(3, h, w), longest)
                assert longest_edge_size(h, w, longest) == tuple(want), (h, w, longest)
            if max(h, w) / min(h, w) <= 200:
                for factor, lo, hi in ((8, 256, 3500), (28, 56 * 56, 28 * 28 * 1280)):
                    assert smart_resize(h, w, factor, lo, hi) == their_smart_resize(h, w, factor, lo, hi)


# ------------------------------------------------------------------------------------ every family's loaded folder
def test_image_classifier_folders_are_transformers(hf_folders) -> None:
    from models.inputs.images import prepare

    for name in ("vit", "deit", "swin-padded"):
        built = hf_folders.get(name)
        theirs = getattr(transformers, built.ref.processor).from_pretrained(built.path)
        spec = built.model.config.processor
        for w, h in SIZES:
            image = noise(w, h, 1)
            want = theirs(images=image, return_tensors="pt").pixel_values
            got = prepare(image, "processor", processor=spec).tensor
            assert got.shape == want.shape and float((got - want).abs().max()) <= TOL, (name, (w, h))


@pytest.mark.parametrize("name", ["llava", "paligemma", "idefics3", "idefics3-global", "qwen2_5_vl"])
def test_vlm_folder_pixels_are_transformers(hf_folders, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``layout``'s pixels (what the tower reads) against the folder's own image processor: LLaVA's CLIP resize and
    crop, PaliGemma's SigLIP square, Idefics3's tiles and global view, Qwen2.5-VL's patches."""
    built = hf_folders.get(name)
    ours, theirs = built.model, built.ref.multimodal.image_processor
    if name == "qwen2_5_vl":
        monkeypatch.setattr(ours, "max_image_tokens", None)  # the server's cap off: the processor's budget alone
    for w, h in SIZES:
        if name == "qwen2_5_vl" and max(w, h) / min(w, h) > 200:
            continue
        image = noise(w, h, 2)
        want = theirs(images=image, return_tensors="pt").pixel_values
        want = want[0] if want.dim() == 5 else want  # Idefics3: (1, tiles, C, S, S)
        got = ours.layout(image).pixels
        assert got.shape == want.shape, (name, (w, h), tuple(got.shape), tuple(want.shape))
        err = float((got - want).abs().max())
        assert err <= TOL, f"{name}: a {w}×{h} image's pixels differ by {err:.3g}"
