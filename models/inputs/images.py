"""Turn any image a person uploads into exactly what a vision model expects.

Two kinds of input (docs/ARCHITECTURE.md §4):

- ``"fashion"``: the Fashion-MNIST models see 28×28 grey images of an object on a *dark* background.
  A photo is converted to grey, inverted when its background is light (judged from the border pixels),
  fitted into 28×28 keeping its aspect ratio and padded with black. An image with a transparent background is put on
  black (the model's ground), its object made light (``transparent_on_dark``), with a notice.
- ``"imagenet"``: the ImageNet models (torchvision's ViT-B/16 and Swin-T weights) see RGB resized so the
  shorter side is ``resize`` pixels, centre-cropped to 224×224 and normalised with the ImageNet mean and
  standard deviation, as torchvision's ``ImageClassification`` weight transforms do.

- ``"processor"``: a Hugging Face image classifier's own preprocessing, from its ``preprocessor_config.json``
  (``processor_spec`` reads it): RGB as a uint8 tensor, resized with torchvision (antialiased) to the given
  size, optionally centre-cropped, rescaled and normalised, as transformers' torchvision image processors do.

All return the float tensor for the model and the uint8 array shown to the user, which is exactly what
the model saw. Any PIL mode is accepted (RGBA and LA are composited on white for the RGB models, on black for the
Fashion-MNIST ones, palette images with or
without transparency, 16-bit and 32-bit integer greys, float, CMYK, YCbCr), animated images use their first
frame, and the EXIF orientation is applied. Anything that cannot be used raises ``ValueError`` with a
message meant for the user.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

if TYPE_CHECKING:  # torch is imported where a tensor is made: the upload preview (PIL and numpy only) never waits
    import torch  # for it (seconds on a cold start)

# The single pixel limit for images (docs/ARCHITECTURE.md §4). Over it, a JPEG file is decoded at a reduced
# scale (cheap: libjpeg's DCT scaling) and an image already in memory is reduced, each with a notice; any other
# file is refused before decoding. 40 megapixels covers phone cameras while keeping the decoded RGB under ~120 MB.
from models.limits import MAX_IMAGE_PIXELS  # noqa: E402 (one place for every limit)

# Pillow's decompression-bomb guard, set explicitly: Image.open refuses files over twice this many pixels
# from the header alone, before any pixel is decoded.
Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS

FASHION_SIZE = 28  # Fashion-MNIST side (Xiao et al. 2017)
FASHION_DECODE = 8 * FASHION_SIZE  # a large JPEG is decoded at no fewer pixels a side than this (open_image)
# Normalisation of Fashion-MNIST pixels in [0, 1]: the training set's mean and standard deviation.
FASHION_MEAN = 0.2860
FASHION_STD = 0.3530

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # torchvision's ImageNet normalisation
IMAGENET_STD = (0.229, 0.224, 0.225)

ImageInput = Image.Image | np.ndarray | bytes | str | os.PathLike

_ALPHA_MODES = {"RGBA", "RGBa", "LA", "La", "PA"}
_FLOAT_OR_WIDE_MODES = {"I", "F", "I;16", "I;16L", "I;16B", "I;16N"}


@dataclass(frozen=True)
class PreparedImage:
    """An image converted for one model."""

    tensor: torch.Tensor  # (1, C, H, W) float32, normalised as the model was trained
    shown: np.ndarray  # uint8 (H, W) grey or (H, W, 3) RGB: exactly the pixels the model saw
    notice: str = ""  # something the user should know (image reduced, inverted, ...)


# --------------------------------------------------------------------------------------------- loading
def open_image(image: ImageInput, at_least: int | None = None) -> tuple[Image.Image, str]:
    """Any supported input -> (PIL image with every pixel decoded, notice).

    Accepts a PIL image, a numpy array (H, W), (H, W, 1), (H, W, 3) or (H, W, 4), encoded bytes or a path.
    The first frame of an animated image is used and the EXIF orientation applied. ``at_least``: the caller only
    needs this many pixels on each side, so a JPEG file much larger than that is decoded at 1/2, 1/4 or 1/8 scale
    (libjpeg's DCT scaling: a 6000×6000 photo for a 28×28 input decodes about 8× faster), never below it.
    """
    notice = ""
    if isinstance(image, np.ndarray):
        img = _from_array(image)
    elif isinstance(image, Image.Image):
        img = image
    elif isinstance(image, (bytes, bytearray, memoryview)):
        if len(image) == 0:
            raise ValueError("The image file is empty (0 bytes).")
        img = _open_encoded(io.BytesIO(bytes(image)))
    elif isinstance(image, (str, os.PathLike)):
        try:
            with open(image, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ValueError(f"Could not read the image file: {e.strerror or e}.") from e
        if not data:
            raise ValueError("The image file is empty (0 bytes).")
        img = _open_encoded(io.BytesIO(data))
    else:
        raise ValueError(f"Expected an image (PIL image, numpy array, bytes or path), got {type(image).__name__}.")

    if getattr(img, "n_frames", 1) > 1:
        img.seek(0)  # animated GIF/PNG/WebP: the first frame
    w, h = img.size
    if w < 1 or h < 1:
        raise ValueError("The image has no pixels.")
    encoded = not isinstance(image, (np.ndarray, Image.Image))
    if w * h > MAX_IMAGE_PIXELS:
        img, notice = _reduce_large(img, encoded=encoded)
    elif at_least and encoded and img.format == "JPEG" and min(w, h) >= 2 * at_least:
        img.draft(img.mode, (at_least, at_least))  # the largest DCT reduction keeping both sides >= at_least
    try:
        img.load()  # decode now, so truncated files fail here with a clear message
        img = ImageOps.exif_transpose(img) or img
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise ValueError(f"The image could not be decoded (truncated or corrupt file?): {e}") from e
    return img, notice


def _open_encoded(buffer: io.BytesIO) -> Image.Image:
    try:
        return Image.open(buffer)  # reads the header only; pixels are decoded by load()
    except UnidentifiedImageError as e:
        raise ValueError("The file is not an image this app can read (try PNG, JPEG, GIF, WebP or BMP).") from e
    except Image.DecompressionBombError as e:
        raise ValueError(f"The image is too large: the limit is {MAX_IMAGE_PIXELS / 1e6:.0f} megapixels.") from e
    except (OSError, SyntaxError, ValueError) as e:
        raise ValueError(f"The image could not be read (truncated or corrupt file?): {e}") from e


def _reduce_large(img: Image.Image, encoded: bool) -> tuple[Image.Image, str]:
    """Bring an image over the pixel limit under it, or refuse it.

    An image already in memory (PIL image or array) is reduced by an integer factor (box filter); an
    encoded JPEG is decoded at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling, cheap); any other encoded
    file over the limit is refused before its pixels are decoded.
    """
    w, h = img.size
    limit_mp = MAX_IMAGE_PIXELS / 1e6
    factor = next((f for f in range(2, 1 + max(w, h)) if (-(-w // f)) * (-(-h // f)) <= MAX_IMAGE_PIXELS), 0)
    if factor and encoded and img.format == "JPEG" and factor <= 8:
        factor = 2 if factor <= 2 else 4 if factor <= 4 else 8
        img.draft(img.mode, (-(-w // factor), -(-h // factor)))
    elif factor and not encoded:
        try:
            img = img.reduce(factor)
        except ValueError:  # modes reduce() does not handle (palette, 1-bit, CMYK...)
            img = to_rgb(img).reduce(factor)
    else:
        raise ValueError(
            f"The image is too large: {w}×{h} = {w * h / 1e6:.1f} megapixels; the limit is {limit_mp:.0f} megapixels."
        )
    return img, f"Image of {w}×{h} pixels reduced to {img.size[0]}×{img.size[1]} (limit {limit_mp:.0f} MP)."


def _from_array(a: np.ndarray) -> Image.Image:
    """numpy (H, W[, C]) -> PIL. uint8 as is; other integer types scaled from their range; floats are
    taken as [0, 1] when their maximum is at most 1, else as [0, 255]."""
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] not in (3, 4)):
        raise ValueError(f"Expected an image array of shape (H, W), (H, W, 3) or (H, W, 4), got {a.shape}.")
    if a.size == 0:
        raise ValueError("The image has no pixels.")
    if a.dtype == np.bool_:
        a = a.astype(np.uint8) * 255
    elif np.issubdtype(a.dtype, np.integer) and a.dtype != np.uint8:
        top = float(np.iinfo(a.dtype).max) if a.max() > 255 else 255.0
        a = np.clip(a.astype(np.float64) / top * 255.0, 0, 255).round().astype(np.uint8)
    elif np.issubdtype(a.dtype, np.floating):
        a = np.nan_to_num(a.astype(np.float64))
        scale = 255.0 if a.max() <= 1.0 else 1.0
        a = np.clip(a * scale, 0, 255).round().astype(np.uint8)
    elif a.dtype != np.uint8:
        raise ValueError(f"Unsupported image array type {a.dtype}.")
    return Image.fromarray(np.ascontiguousarray(a))  # uint8: (H, W) -> L, (H, W, 3) -> RGB, (H, W, 4) -> RGBA


# ------------------------------------------------------------------------------------------ colour
WHITE, BLACK = (255, 255, 255), (0, 0, 0)


def to_rgb(img: Image.Image, ground: tuple[int, int, int] = WHITE) -> Image.Image:
    """Any PIL mode -> 8-bit RGB. Transparency is composited on ``ground``: white (what a viewer shows, and what the
    RGB models see), or the colour a model puts it on (``transparent_ground``: a preview of its input);
    16-bit, 32-bit and float greys are scaled to 8 bits; CMYK and YCbCr use PIL's conversion."""
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode in _ALPHA_MODES:
        if img.mode == "La":  # premultiplied grey+alpha: PIL converts it to RGBA only via LA
            img = img.convert("LA")
        rgba = img.convert("RGBA")
        base = Image.new("RGBA", rgba.size, (*ground, 255))
        return Image.alpha_composite(base, rgba).convert("RGB")
    if img.mode in _FLOAT_OR_WIDE_MODES:
        return _wide_to_grey(img).convert("RGB")
    try:
        return img.convert("RGB")
    except (ValueError, OSError) as e:
        raise ValueError(f"Images in colour mode {img.mode!r} are not supported.") from e


def to_grey(img: Image.Image) -> Image.Image:
    """Any PIL mode -> 8-bit grey ("L": ITU-R 601 luma)."""
    if img.mode in _FLOAT_OR_WIDE_MODES:
        return _wide_to_grey(img)
    if img.mode == "L":
        return img
    return to_rgb(img).convert("L")


def _wide_to_grey(img: Image.Image) -> Image.Image:
    a = np.asarray(img).astype(np.float64)
    if img.mode == "F":
        scale = 255.0 if a.max() <= 1.0 else 1.0  # float images are [0, 1] or [0, 255]
    elif a.max() > 255:
        scale = 255.0 / 65535.0  # 16-bit range (PNG "I;16" and 16-bit greys opened as "I")
    else:
        scale = 1.0
    return Image.fromarray(np.clip(a * scale, 0, 255).round().astype(np.uint8))  # -> "L"


# ---------------------------------------------------------------------------------------- fashion
def light_background(grey: np.ndarray) -> bool:
    """True when the border pixels of a uint8 grey image are mostly light (median above mid-grey)."""
    border = np.concatenate([grey[0, :], grey[-1, :], grey[:, 0], grey[:, -1]])
    return bool(np.median(border) > 127)


TRANSPARENT_SHARE = 0.05  # an image whose pixels are at least this share (mostly) transparent has a see-through ground


def _alpha(img: Image.Image) -> Image.Image | None:
    """The image as RGBA if it has transparency (an alpha channel, or a palette's transparent colour), else None."""
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode not in _ALPHA_MODES:
        return None
    if img.mode == "La":
        img = img.convert("LA")
    return img.convert("RGBA")


def see_through(img: Image.Image) -> bool:
    """Whether an image has a transparent ground: at least TRANSPARENT_SHARE of its pixels (mostly) transparent. A
    Fashion-MNIST model puts such a ground on black (``transparent_on_dark``); a nearly opaque image is read as any
    other (its few transparent pixels on white, ``to_rgb``)."""
    rgba = _alpha(img)
    return rgba is not None and float((np.asarray(rgba.getchannel("A")) < 128).mean()) >= TRANSPARENT_SHARE


def transparent_ground(img: Image.Image, kind: str) -> tuple[int, int, int]:
    """The colour a model whose input is ``kind`` ("fashion", "imagenet", "processor") puts an image's transparent
    pixels on: black for a Fashion-MNIST model where the image has a see-through ground (``see_through``), else white
    (``to_rgb``, as the RGB models' preprocessing does). The upload preview composites on it, so that it shows the
    ground the model sees."""
    return BLACK if kind == "fashion" and see_through(img) else WHITE


def transparent_on_dark(img: Image.Image) -> tuple[Image.Image | None, str]:
    """(grey image, notice) of an image with a transparent background, as a Fashion-MNIST model expects it: the
    object light on a black ground; (None, "") for an image without one. The transparent ground is the background
    (there is no border colour to judge), so it becomes the model's black; the object's opaque pixels keep their grey
    when they are light on average and are inverted when dark (a black drawing on a see-through ground becomes a light
    one), each pixel weighted by its opacity. Judging the composite on white instead (what a viewer shows) took a light
    object on a transparent ground for a light background and inverted it to near black."""
    if not see_through(img):
        return None, ""  # opaque, or nearly: read as any other image
    rgba = _alpha(img)
    alpha = np.asarray(rgba.getchannel("A"), dtype=np.float64) / 255.0
    luma = np.asarray(rgba.convert("RGB").convert("L"), dtype=np.float64)
    weight = alpha.sum()
    light = weight == 0 or float((luma * alpha).sum() / weight) >= 128
    grey = (luma if light else 255.0 - luma) * alpha  # over black: the ground 0, the object light
    said = ("Transparent background: put on black, the dark ground Fashion-MNIST models expect"
            + ("." if light else "; the dark object inverted to light, as Fashion-MNIST objects are."))
    return Image.fromarray(np.clip(grey, 0, 255).round().astype(np.uint8)), said


def fashion_array(image: ImageInput, size: int = FASHION_SIZE) -> tuple[np.ndarray, str]:
    """Any image -> (uint8 (size, size) grey, object light on a dark background, notice).

    Grey, inverted when the background is light, fitted into size×size keeping the aspect ratio (the
    longer side becomes ``size``) and padded with black. A 28×28 dark-background image (a Fashion-MNIST
    sample) passes through unchanged. A large JPEG is decoded at reduced scale, at least FASHION_DECODE pixels a
    side (8 source pixels per output pixel for the filter).
    """
    img, notice = open_image(image, at_least=max(FASHION_DECODE, 8 * size))
    notes = [notice] if notice else []
    grey, said = transparent_on_dark(img)
    if grey is not None:
        notes.append(said)
    else:
        grey = to_grey(img)
        if light_background(np.asarray(grey)):
            grey = ImageOps.invert(grey)
            notes.append("Light background: image inverted to match Fashion-MNIST (light object on black).")
    w, h = grey.size
    if (w, h) != (size, size):
        scale = size / max(w, h)
        new = (max(1, round(w * scale)), max(1, round(h * scale)))
        # LANCZOS with reducing_gap: a box pre-reduction for large photos, then a sharp filter.
        grey = grey.resize(new, Image.Resampling.LANCZOS, reducing_gap=3.0)
        canvas = Image.new("L", (size, size), 0)
        canvas.paste(grey, ((size - new[0]) // 2, (size - new[1]) // 2))
        grey = canvas
    return np.asarray(grey, dtype=np.uint8).copy(), " ".join(notes)


def fashion_tensor(pixels: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 (..., 28, 28) -> float32 (..., 1, 28, 28) normalised with the Fashion-MNIST statistics.

    The training code uses this function too, so a model sees the same numbers in the app as in training.
    """
    import torch

    # numpy pixels are prepared on the CPU (the caller moves the result to the model's device); a tensor stays put
    t = pixels if isinstance(pixels, torch.Tensor) else torch.as_tensor(np.asarray(pixels), device="cpu")
    t = t.to(torch.float32).div(255.0).unsqueeze(-3)  # (..., 1, H, W)
    return (t - FASHION_MEAN) / FASHION_STD


def prepare_fashion(image: ImageInput) -> PreparedImage:
    """Any image -> what a Fashion-MNIST model expects: tensor (1, 1, 28, 28) and the uint8 (28, 28) shown."""
    pixels, notice = fashion_array(image)
    return PreparedImage(tensor=fashion_tensor(pixels[None]), shown=pixels, notice=notice)


# --------------------------------------------------------------------------------------- imagenet
def prepare_imagenet(
    image: ImageInput, resize: int = 256, crop: int = 224, interpolation: str = "bilinear"
) -> PreparedImage:
    """Any image -> what an ImageNet model expects, as torchvision's ``ImageClassification`` transform:
    RGB, shorter side resized to ``resize`` (antialiased), centre crop ``crop``×``crop``, scaled to [0, 1]
    and normalised with the ImageNet mean/std. Returns tensor (1, 3, crop, crop) and the uint8 crop."""
    import torch
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF

    img, notice = open_image(image, at_least=max(resize, crop))
    rgb = to_rgb(img)
    mode = InterpolationMode(interpolation)
    rgb = TF.center_crop(TF.resize(rgb, [resize], interpolation=mode, antialias=True), [crop, crop])
    shown = np.asarray(rgb, dtype=np.uint8).copy()  # (crop, crop, 3)
    t = torch.from_numpy(shown).permute(2, 0, 1).to(torch.float32).div(255.0)  # (3, crop, crop)
    t = TF.normalize(t, IMAGENET_MEAN, IMAGENET_STD)
    return PreparedImage(tensor=t.unsqueeze(0), shown=shown, notice=notice)


# ------------------------------------------------------------------------------ Hugging Face processors
_PIL_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


def processor_spec(pre: dict, image_size: int) -> dict:
    """The preprocessing a ``preprocessor_config.json`` describes, in plain terms: ``size`` [h, w] or
    ``shortest_edge``, ``crop`` [h, w] or None, ``interpolation``, ``rescale`` factor or None, ``mean``/``std``
    or None. Raises ``ValueError`` on what is not supported."""

    def hw(value, default):
        if value is None:
            return default
        if isinstance(value, int):
            return [value, value]
        if "height" in value and "width" in value:
            return [int(value["height"]), int(value["width"])]
        return None

    size = pre.get("size")
    spec: dict = {"size": None, "shortest_edge": None, "crop": None}
    if pre.get("do_resize", True):
        spec["size"] = hw(size, [image_size, image_size])
        if spec["size"] is None:
            if not isinstance(size, dict) or "shortest_edge" not in size:
                raise ValueError(f"preprocessor size {size!r} is not supported")
            spec["shortest_edge"] = int(size["shortest_edge"])
    if pre.get("do_center_crop"):
        spec["crop"] = hw(pre.get("crop_size"), [image_size, image_size])
    resample = pre.get("resample", 2)
    if resample not in (0, 2, 3):
        raise ValueError(f"preprocessor resample {_PIL_RESAMPLE.get(resample, resample)!r} is not supported")
    spec["interpolation"] = _PIL_RESAMPLE[resample]
    spec["rescale"] = float(pre.get("rescale_factor", 1 / 255)) if pre.get("do_rescale", True) else None
    normalise = pre.get("do_normalize", True)
    spec["mean"] = [float(v) for v in pre.get("image_mean", IMAGENET_MEAN)] if normalise else None
    spec["std"] = [float(v) for v in pre.get("image_std", IMAGENET_STD)] if normalise else None
    return spec


def prepare_processor(image: ImageInput, spec: dict) -> PreparedImage:
    """Any image -> what a Hugging Face image classifier expects (``spec`` from ``processor_spec``). The
    resize is torchvision's v2 one on the uint8 tensor, as transformers' image processors run it (its uint8
    kernel rounds a few pixels one level differently from the v1 float path)."""
    import torch
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as TF

    img, notice = open_image(image)
    t = torch.from_numpy(np.asarray(to_rgb(img), dtype=np.uint8).copy()).permute(2, 0, 1)  # (3, H, W) uint8
    mode = InterpolationMode(spec["interpolation"])
    if spec["size"] is not None:
        t = TF.resize(t, spec["size"], interpolation=mode, antialias=True)
    elif spec["shortest_edge"] is not None:
        t = TF.resize(t, [spec["shortest_edge"]], interpolation=mode, antialias=True)
    if spec["crop"] is not None:
        t = TF.center_crop(t, spec["crop"])
    shown = t.permute(1, 2, 0).numpy().copy()
    x = t.to(torch.float32)
    if spec["rescale"] is not None:
        x = x * spec["rescale"]
    if spec["mean"] is not None:
        x = TF.normalize(x, spec["mean"], spec["std"])
    return PreparedImage(tensor=x.unsqueeze(0), shown=shown, notice=notice)


def prepare(image: ImageInput, kind: str, resize: int = 256, crop: int = 224,
            interpolation: str = "bilinear", processor: dict | None = None) -> PreparedImage:
    """Dispatch on the model's input kind: ``"fashion"``, ``"imagenet"`` or ``"processor"`` (with its spec)."""
    if kind == "fashion":
        return prepare_fashion(image)
    if kind == "imagenet":
        return prepare_imagenet(image, resize=resize, crop=crop, interpolation=interpolation)
    if kind == "processor" and processor is not None:
        return prepare_processor(image, processor)
    raise ValueError(f"unknown image input kind {kind!r} (expected 'fashion', 'imagenet' or 'processor')")
