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
  (``processor_spec`` reads it as transformers reads it for the class it names): RGB as a uint8 tensor, resized with
  torchvision (antialiased) to the size transformers computes, optionally centre-cropped with transformers' box
  (``center_crop``: floor offsets, zeros around an image smaller than the crop), rescaled and normalised, as
  transformers' torchvision image processors do, to the bit (tests/test_processor_geometry.py).

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
# PIL resample codes -> torchvision modes, as transformers' torchvision image processors map them
# (image_utils.pil_torch_interpolation_mapping: PIL's NEAREST is torchvision's "nearest-exact", which samples at pixel
# centres as PIL does; torchvision's "nearest" samples at the corners, a shift of up to a pixel)
_PIL_RESAMPLE = {0: "nearest-exact", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
# transformers' image processor classes whose geometry processor_spec mirrors: the base torchvision backend's resize,
# centre crop, rescale and normalisation (ConvNeXt's crop_pct resize on top). Any other named class is refused in
# words: its own resize or crop (LeViT's, PoolFormer's, Beit's, MobileViT's...) would be guessed at.
PROCESSOR_CLASSES = ("ViTImageProcessor", "DeiTImageProcessor", "BitImageProcessor", "CLIPImageProcessor",
                     "ChineseCLIPImageProcessor", "SiglipImageProcessor", "LlavaImageProcessor",
                     "ConvNextImageProcessor")
# ... of which these read an int ``size`` as the shorter side (their class's default_to_square = False); the others,
# and a file naming no class, as a square (BaseImageProcessor's default_to_square = True)
_SHORTER_SIDE_CLASSES = ("BitImageProcessor", "CLIPImageProcessor", "ChineseCLIPImageProcessor",
                         "SiglipImageProcessor", "LlavaImageProcessor", "ConvNextImageProcessor")
CONVNEXT_CROP_PCT = 224 / 256  # ConvNextImageProcessor's crop_pct where the file is silent


def processor_class(pre: dict) -> str:
    """The transformers image processor class a ``preprocessor_config.json`` names (``image_processor_type``, or an
    older file's ``feature_extractor_type``), without the backend suffix ("Fast", "Pil"); "" where it names none."""
    name = str(pre.get("image_processor_type") or pre.get("feature_extractor_type") or "")
    name = name.replace("FeatureExtractor", "ImageProcessor")
    return name.removesuffix("Fast").removesuffix("Pil")


def processor_spec(pre: dict, image_size: int) -> dict:
    """The preprocessing a ``preprocessor_config.json`` describes, in plain terms, as transformers' image processor of
    the class it names reads it: ``size`` [h, w], or ``shortest_edge`` (with ``longest_edge``, transformers'
    ``max_size``), or ``max_hw`` [max h, max w]; ``crop`` [h, w] or None; ``interpolation``; ``rescale`` factor or None;
    ``mean``/``std`` or None. A ``size`` given as an int is a square or the shorter side as the class's
    ``default_to_square`` says (the file's own ``default_to_square`` first). ConvNeXt's ``crop_pct`` (below 384 pixels:
    the shorter side to int(shortest_edge / crop_pct), then a centre crop of shortest_edge²; from 384: a square resize)
    is written as that resize and crop. Raises ``ValueError`` on what is not supported."""
    kind = processor_class(pre)
    if kind and kind not in PROCESSOR_CLASSES:
        raise ValueError(f"image processor {kind!r} is not supported ({', '.join(PROCESSOR_CLASSES)})")
    square = pre.get("default_to_square")
    square = (kind not in _SHORTER_SIDE_CLASSES) if square is None else bool(square)

    def size_dict(value, square: bool):  # transformers' image_processing_utils.get_size_dict
        if isinstance(value, bool) or value is None:
            return None
        if isinstance(value, int):
            return {"height": value, "width": value} if square else {"shortest_edge": value}
        if isinstance(value, (list, tuple)) and len(value) == 2:
            return {"height": int(value[0]), "width": int(value[1])}
        return dict(value) if isinstance(value, dict) else None

    spec: dict = {"size": None, "shortest_edge": None, "longest_edge": None, "max_hw": None, "crop": None}
    size = size_dict(pre.get("size"), square)
    if pre.get("do_resize", True):
        keys = set(size or ())
        if size is None:
            spec["size"] = [image_size, image_size]
        elif keys == {"height", "width"}:
            spec["size"] = [int(size["height"]), int(size["width"])]
        elif keys in ({"shortest_edge"}, {"shortest_edge", "longest_edge"}):
            spec["shortest_edge"] = int(size["shortest_edge"])
            if "longest_edge" in keys:
                spec["longest_edge"] = int(size["longest_edge"])
        elif keys == {"max_height", "max_width"}:
            spec["max_hw"] = [int(size["max_height"]), int(size["max_width"])]
        else:
            raise ValueError(f"preprocessor size {pre.get('size')!r} is not supported")
    if pre.get("do_center_crop"):
        crop = size_dict(pre.get("crop_size"), True)
        if crop is None:
            spec["crop"] = [image_size, image_size]
        elif set(crop) == {"height", "width"}:
            spec["crop"] = [int(crop["height"]), int(crop["width"])]
        else:
            raise ValueError(f"preprocessor crop_size {pre.get('crop_size')!r} is not supported")
    if kind == "ConvNextImageProcessor" and pre.get("do_resize", True):
        if spec["shortest_edge"] is None or spec["longest_edge"] is not None:
            raise ValueError(f"ConvNeXt's preprocessor size {pre.get('size')!r} is not supported (shortest_edge)")
        if spec["crop"] is not None:
            raise ValueError("ConvNeXt's crop_pct resize followed by do_center_crop is not supported")
        side = spec["shortest_edge"]
        if side < 384:  # ConvNextImageProcessor.resize
            crop_pct = pre.get("crop_pct")
            spec["shortest_edge"] = int(side / (CONVNEXT_CROP_PCT if crop_pct is None else float(crop_pct)))
            spec["crop"] = [side, side]
        else:
            spec["shortest_edge"], spec["size"] = None, [side, side]
    if pre.get("do_pad") and (kind == "LlavaImageProcessor" or pre.get("pad_size") is not None):
        raise ValueError("padding (do_pad) is not supported" + (" (LLaVA's pad-to-square)"
                                                                 if kind == "LlavaImageProcessor" else ""))
    resample = pre.get("resample", 2)
    if resample not in (0, 2, 3):
        raise ValueError(f"preprocessor resample {_PIL_RESAMPLE.get(resample, resample)!r} is not supported")
    spec["interpolation"] = _PIL_RESAMPLE[resample]
    spec["rescale"] = float(pre.get("rescale_factor", 1 / 255)) if pre.get("do_rescale", True) else None
    normalise = pre.get("do_normalize", True)
    spec["mean"] = [float(v) for v in pre.get("image_mean", IMAGENET_MEAN)] if normalise else None
    spec["std"] = [float(v) for v in pre.get("image_std", IMAGENET_STD)] if normalise else None
    return spec


def processor_resize(height: int, width: int, spec: dict) -> tuple[int, int] | None:
    """The (height, width) a ``processor_spec`` resizes an image of height × width to, None for no resize: transformers'
    ``TorchvisionBackend.resize`` sizes. The shorter side to ``shortest_edge``, the longer int(shortest_edge · long /
    short), truncated (image_transforms.get_resize_output_image_size, torchvision's own rule); with ``longest_edge``
    (image_transforms.get_size_with_aspect_ratio) the shorter side lowered to round(longest · short / long) where the
    longer would pass it, and the image kept as it is where its shorter side is already that; ``max_hw``: both sides
    times the smaller of the two scales, truncated (image_utils.get_image_size_for_max_height_width)."""
    if spec.get("size") is not None:
        return int(spec["size"][0]), int(spec["size"][1])
    side = spec.get("shortest_edge")
    if side is not None:
        longest = spec.get("longest_edge")
        if longest is not None:  # get_size_with_aspect_ratio(image_size, shortest_edge, longest_edge)
            raw = None
            short, long = float(min(height, width)), float(max(height, width))
            if long / short * side > longest:
                raw = longest * short / long
                side = int(round(raw))
            if (height <= width and height == side) or (width <= height and width == side):
                return height, width
            if width < height:
                return (int(raw * height / width) if raw is not None else int(side * height / width)), side
            return side, (int(raw * width / height) if raw is not None else int(side * width / height))
        short, long = (width, height) if width <= height else (height, width)
        new_long = int(side * long / short)
        return (new_long, side) if width <= height else (side, new_long)
    if spec.get("max_hw") is not None:
        scale = min(spec["max_hw"][0] / height, spec["max_hw"][1] / width)
        return int(height * scale), int(width * scale)
    return None


def center_crop(t: torch.Tensor, size: list[int] | tuple[int, int]) -> torch.Tensor:
    """(..., H, W) -> (..., h, w) centre crop as transformers' torchvision image processors take it
    (``TorchvisionBackend.center_crop``): the box's offset floor((H − h) / 2), floor((W − w) / 2), as its PIL backend's
    image_transforms.center_crop too. An image smaller than the crop is padded with zeros first, floor(d / 2) before
    and the rest after on each short side (the PIL backend puts the odd pixel before instead).
    torchvision's own ``center_crop`` rounds the offset half to even (int(round((H − h) / 2))): one pixel
    further down or right where H − h is 3 mod 4 (the ImageNet weights' transform keeps it: ``prepare_imagenet``)."""
    import torch.nn.functional as F

    h, w = int(size[0]), int(size[1])
    height, width = t.shape[-2:]
    if h > height or w > width:  # pad (left, right, top, bottom) with zeros, as tvF.pad(image, [l, t, r, b], fill=0)
        dw, dh = max(w - width, 0), max(h - height, 0)
        t = F.pad(t, (dw // 2, (dw + 1) // 2, dh // 2, (dh + 1) // 2), value=0)
        height, width = t.shape[-2:]
    top, left = int((height - h) / 2.0), int((width - w) / 2.0)  # as transformers: int(), i.e. floor (d >= 0)
    return t[..., top:top + h, left:left + w]


def processor_normalise(t: torch.Tensor, spec: dict) -> torch.Tensor:
    """uint8 (..., C, H, W) -> float32 rescaled and normalised as transformers' image processors do it: rescale and
    normalisation fused into one normalisation by mean / rescale and std / rescale (its
    ``_fuse_mean_std_and_rescale_factor``), so the numbers are its own to the last bit, not just to rounding."""
    import torch

    x = t.to(torch.float32)
    rescale, mean, std = spec.get("rescale"), spec.get("mean"), spec.get("std")
    if mean is not None:
        m, s = torch.tensor(mean, dtype=torch.float32), torch.tensor(std, dtype=torch.float32)
        if rescale is not None:
            m, s = m * (1.0 / rescale), s * (1.0 / rescale)
        return (x - m.view(-1, 1, 1)) / s.view(-1, 1, 1)  # tvF.normalize: (x - mean) / std, per channel
    return x * rescale if rescale is not None else x


def prepare_processor(image: ImageInput, spec: dict) -> PreparedImage:
    """Any image -> what a Hugging Face image classifier expects (``spec`` from ``processor_spec``): transformers'
    torchvision image processor step by step. The resize is torchvision's v2 one on the uint8 tensor to the size
    ``processor_resize`` gives (its uint8 kernel rounds a few pixels one level differently from the v1 float path), the
    crop ``center_crop``, the rescale and normalisation ``processor_normalise``."""
    import torch
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as TF

    img, notice = open_image(image)
    t = torch.from_numpy(np.asarray(to_rgb(img), dtype=np.uint8).copy()).permute(2, 0, 1)  # (3, H, W) uint8
    mode = InterpolationMode(spec["interpolation"])
    new = processor_resize(t.shape[1], t.shape[2], spec)
    if new is not None and min(new) < 1:
        raise ValueError(f"The image ({t.shape[2]}×{t.shape[1]}) is too thin: resized for this model, a side would "
                         "be under one pixel.")
    if new is not None:
        t = TF.resize(t, list(new), interpolation=mode, antialias=True)
    if spec["crop"] is not None:
        t = center_crop(t, spec["crop"])
    shown = t.permute(1, 2, 0).numpy().copy()
    return PreparedImage(tensor=processor_normalise(t, spec).unsqueeze(0), shown=shown, notice=notice)


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


# How the built-in VLM's scenes are made (train/scenes.py, which tests/test_describe_tab.py checks these against):
# 2–4 Fashion-MNIST items, each a square of at most SCENE_ITEM pixels a side, on a black canvas, no two overlapping.
SCENE_ITEM, SCENE_ITEMS, SCENE_BLACK = 28, 4, 4  # item side at most; items at most; background: at most this bright
# share of held-out scenes (train.scenes, test split) the check flags: `python -m bench.scene_check` (README)
SCENE_FALSE_ALARMS = 0.001  # 2 of 2,000: `python bench/scene_check.py --n 2000`


def _ink_boxes(ink: np.ndarray) -> list[tuple[int, int, int, int]]:
    """The bounding boxes (x0, y0, x1, y1, ends exclusive) of the 8-connected regions of a boolean (H, W) mask."""
    seen = np.zeros_like(ink)
    h, w = ink.shape
    boxes = []
    for y, x in zip(*np.nonzero(ink)):
        if seen[y, x]:
            continue
        stack, seen[y, x] = [(y, x)], True
        y0, y1, x0, x1 = y, y, x, x
        while stack:
            cy, cx = stack.pop()
            y0, y1, x0, x1 = min(y0, cy), max(y1, cy), min(x0, cx), max(x1, cx)
            for ny in range(max(cy - 1, 0), min(cy + 2, h)):
                for nx in range(max(cx - 1, 0), min(cx + 2, w)):
                    if ink[ny, nx] and not seen[ny, nx]:
                        seen[ny, nx] = True
                        stack.append((ny, nx))
        boxes.append((int(x0), int(y0), int(x1) + 1, int(y1) + 1))
    return boxes


def scene_notice(pixels: np.ndarray, side: int = 64) -> str:
    """A notice when the image the built-in VLM saw (uint8 (S, S), after ``fashion_array``) cannot be one of its
    training scenes, empty when it can: some connected stretch of ink wider or taller than two items side by side
    (a photo, one item filling the canvas), or more ink than four items can carry. What was measured, against which
    bound of the scenes' construction, and how often held-out scenes raise it. ``side``: the canvas the bounds are
    for (the image is measured at that scale)."""
    p = np.asarray(pixels)
    scale = p.shape[0] / side
    ink = p > SCENE_BLACK
    reasons = []
    widest = max((max(x1 - x0, y1 - y0) for x0, y0, x1, y1 in _ink_boxes(ink)), default=0) / scale
    if widest > 2 * SCENE_ITEM:  # two items' boxes may touch; no three fit side by side within one stretch of ink
        reasons.append(f"one connected stretch of it is {widest:.0f} pixels across (a scene's items are at most "
                       f"{SCENE_ITEM} pixels each on black: {2 * SCENE_ITEM} for two that touch)")
    share, most = float(ink.mean()), SCENE_ITEMS * SCENE_ITEM ** 2 / side ** 2
    if share > most:
        reasons.append(f"{share:.0%} of it is not black ({SCENE_ITEMS} items of {SCENE_ITEM}×{SCENE_ITEM} cover at "
                       f"most {most:.0%} of the {side}×{side} canvas)")
    if not reasons:
        return ""
    return ("⚠️ **This image looks unlike the scenes the model was trained on**: " + "; ".join(reasons) + ". It knows "
            "2–4 Fashion-MNIST items on a black canvas, so its words and where they look say little about this "
            f"picture. (This check flags {SCENE_FALSE_ALARMS:.1%} of held-out training-style scenes.)")
