"""Calibrated probabilities and an out-of-distribution check for the Fashion-MNIST image models.

Two problems a user meets with a model trained on 28×28 clothing images:

- **Over- and under-confidence.** The shipped models were trained with label smoothing 0.1, which caps every
  softmax near 92 %, right or wrong. Temperature scaling (Guo et al. 2017, "On Calibration of Modern Neural
  Networks", §4.2) divides the logits by one scalar T, fitted by minimising the negative log-likelihood on a
  held-out split; the predicted class never changes, only how sure the model says it is.
- **Inputs unlike anything it was trained on.** A photo of a cat or a drawn shoe outline still gets one of ten
  clothing classes. Five measurements of the input, each with a threshold set on Fashion-MNIST images, raise a
  notice:
  *background*: Fashion-MNIST objects sit on an exactly black background, so inside the box around the object a
  good share of pixels is near black; a photo fitted into 28×28 has a grey, textured background instead.
  *pixels*: the distance of the image from the 50-dimensional subspace that the training images' principal
  components span (the reconstruction residual; Fashion-MNIST images are close to it, a photo's textures are not).
  *features*: the Mahalanobis distance of the model's final feature vector to the nearest class mean, with one
  covariance shared by the classes (Lee et al. 2018, "A Simple Unified Framework for Detecting Out-of-
  Distribution Samples", eq. 2), measured on the training split.
  *enclosed*: the share of the background that the ink encloses (background pixels not reachable from the image's
  border through background). A drawn outline of a shoe or a shirt encloses its inside; a Fashion-MNIST garment is
  filled, so its background is almost all outside it.
  *thin*: the share of the ink that lies in thin strokes (ink pixels not covered by any 3×3 square of ink, i.e.
  removed by a morphological opening). A pen line fitted into 28×28 is one or two pixels wide; a garment's ink is
  mostly solid, thin only along its rim.
  The two shape checks are plain image statistics with nothing learned, so their limits are set on the training
  split; the three others' on the validation split (their statistics were fitted on the training split).

The fitted numbers live in ``calibration.safetensors`` in the checkpoint folder (listed in its manifest), written
by ``python -m train.calibrate``; ``models.load`` attaches them as ``model.calibration``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

FILE = "calibration.safetensors"
ARRAYS = ("means", "precision", "pixel_mean", "pixel_basis")  # Calibration's arrays, stored as tensors
NUMBERS = ("temperature", "feature_limit", "background_limit", "pixel_limit", "false_alarms")  # and its numbers
# the shape checks' limits; a file written before them lacks these and loads with the checks off (limit 1: a share
# is never above it)
SHAPE_NUMBERS = ("enclosed_limit", "thin_limit")
BLACK = 4  # a pixel at most this bright (of 255) counts as background black in Fashion-MNIST's sense


def background_share(pixels: np.ndarray) -> float:
    """Share of near-black pixels inside the bounding box of the brighter ones, of a uint8 (H, W) image (the
    letterbox bars of a fitted photo fall outside the box, so they do not count). A blank image gives 1."""
    bright = pixels > BLACK
    rows, cols = np.flatnonzero(bright.any(1)), np.flatnonzero(bright.any(0))
    if not len(rows):
        return 1.0
    box = pixels[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
    return float((box <= BLACK).mean())


def _batch(pixels: np.ndarray) -> np.ndarray:
    p = np.asarray(pixels)
    return p[None] if p.ndim == 2 else p


def enclosed_share(pixels: np.ndarray) -> np.ndarray:
    """Share of the background (pixels at most BLACK) that cannot be reached from the image's border through
    background (4-connected), per uint8 image (N, H, W) or of one (H, W) (then an array of one). An image with no
    background gives 0."""
    background = _batch(pixels) <= BLACK
    outside = np.zeros_like(background)
    for edge in (np.s_[:, 0, :], np.s_[:, -1, :], np.s_[:, :, 0], np.s_[:, :, -1]):
        outside[edge] = background[edge]
    while True:  # grow the outside through background until it stops (at most H·W steps; ~30 for 28×28)
        grown = outside.copy()
        grown[:, 1:] |= outside[:, :-1]
        grown[:, :-1] |= outside[:, 1:]
        grown[:, :, 1:] |= outside[:, :, :-1]
        grown[:, :, :-1] |= outside[:, :, 1:]
        grown &= background
        if np.array_equal(grown, outside):
            break
        outside = grown
    total = background.sum((1, 2))
    return (background & ~outside).sum((1, 2)) / np.maximum(total, 1)


def _any_3x3(mask: np.ndarray, every: bool) -> np.ndarray:
    """Per pixel of (N, H, W) bool: whether every (erosion) or any (dilation) pixel of its 3×3 square is set."""
    H, W = mask.shape[1:]
    padded = np.pad(mask, ((0, 0), (1, 1), (1, 1)), constant_values=False)
    out = np.full(mask.shape, every)
    for dy in range(3):
        for dx in range(3):
            window = padded[:, dy:dy + H, dx:dx + W]
            out = (out & window) if every else (out | window)
    return out


def thin_share(pixels: np.ndarray) -> np.ndarray:
    """Share of the ink (pixels brighter than BLACK) that no 3×3 square of ink covers (what a 3×3 opening
    removes), per uint8 image (N, H, W) or of one (H, W). An image with no ink gives 0."""
    ink = _batch(pixels) > BLACK
    solid = _any_3x3(_any_3x3(ink, every=True), every=False)  # the opening: ink inside some 3×3 block of ink
    return (ink & ~solid).sum((1, 2)) / np.maximum(ink.sum((1, 2)), 1)


@dataclass(frozen=True)
class Calibration:
    """What ``train.calibrate`` fitted for one model."""

    temperature: float  # logits / T before the softmax (Guo et al. 2017)
    means: np.ndarray  # (classes, D) float64: class means of the final features on the training split
    precision: np.ndarray  # (D, D) float64: inverse of the shared (within-class) covariance
    pixel_mean: np.ndarray  # (H·W,) float64: mean training image, pixels in [0, 1]
    pixel_basis: np.ndarray  # (K, H·W) float64: the training images' first K principal directions (orthonormal rows)
    feature_limit: float  # log Mahalanobis distance above which the features count as unusual
    background_limit: float  # background share below which the background counts as unusual
    pixel_limit: float  # reconstruction residual above which the pixels count as unusual
    false_alarms: float  # share of held-out Fashion-MNIST images flagged by any check (measured when fitted)
    enclosed_limit: float = 1.0  # enclosed background share above which the image counts as an outline drawing
    thin_limit: float = 1.0  # thin-stroke share of the ink above which the image counts as a line drawing

    def probs(self, logits: torch.Tensor) -> np.ndarray:
        """Calibrated softmax of one logit vector (C,), float32, sums to 1."""
        return torch.softmax(logits.double() / self.temperature, dim=-1).float().cpu().numpy()

    def feature_distance(self, features: np.ndarray) -> np.ndarray:
        """log of the smallest Mahalanobis distance² to a class mean, per row of features (N, D)."""
        d = np.asarray(features, dtype=np.float64)[:, None, :] - self.means[None]  # (N, C, D)
        return np.log(np.einsum("ncd,de,nce->nc", d, self.precision, d).min(1))

    def pixel_residual(self, pixels: np.ndarray) -> np.ndarray:
        """Distance of each uint8 image (N, H, W) from the principal subspace: ‖c − Bᵀ B c‖, c = x − mean."""
        c = np.asarray(pixels, dtype=np.float64).reshape(len(pixels), -1) / 255.0 - self.pixel_mean
        return np.linalg.norm(c - (c @ self.pixel_basis.T) @ self.pixel_basis, axis=1)

    def measure(self, pixels: np.ndarray, features: np.ndarray) -> dict[str, np.ndarray]:
        """The five checks' scores of uint8 images (N, H, W) with their final features (N, D)."""
        return {"background": np.array([background_share(im) for im in pixels]),
                "residual": self.pixel_residual(pixels), "distance": self.feature_distance(features),
                "enclosed": enclosed_share(pixels), "thin": thin_share(pixels)}

    def flagged(self, pixels: np.ndarray, features: np.ndarray) -> np.ndarray:
        """(N,) bool: the images any check flags (the rule of ``check``, for many images at once)."""
        m = self.measure(pixels, features)
        return ((m["background"] < self.background_limit) | (m["residual"] > self.pixel_limit)
                | (m["distance"] > self.feature_limit) | (m["enclosed"] > self.enclosed_limit)
                | (m["thin"] > self.thin_limit))

    def check(self, pixels: np.ndarray, features: np.ndarray) -> str:
        """A notice when one image (H, W) with its features (D,) looks unlike Fashion-MNIST (empty when it looks
        like it): what was measured, against which threshold, and how often held-out Fashion-MNIST images raise it."""
        m = {k: float(v[0]) for k, v in self.measure(pixels[None], features[None]).items()}
        reasons = []
        if m["background"] < self.background_limit:
            reasons.append(f"only {m['background']:.0%} of the object's box is black background (Fashion-MNIST "
                           f"images: {self.background_limit:.0%} or more)")
        if m["residual"] > self.pixel_limit:
            reasons.append(f"its pixels are far from the patterns Fashion-MNIST images are made of (residual "
                           f"{m['residual']:.1f}, threshold {self.pixel_limit:.1f})")
        if m["distance"] > self.feature_limit:
            reasons.append(f"its features lie far from every class the model learned (log Mahalanobis distance "
                           f"{m['distance']:.1f}, threshold {self.feature_limit:.1f})")
        if m["enclosed"] > self.enclosed_limit:
            reasons.append(f"its lines enclose {m['enclosed']:.0%} of the background, as an outline drawing does "
                           f"(Fashion-MNIST garments are filled: {self.enclosed_limit:.0%} or less)")
        if m["thin"] > self.thin_limit:
            reasons.append(f"{m['thin']:.0%} of it is thin strokes, as in a line drawing (Fashion-MNIST images: "
                           f"{self.thin_limit:.0%} or less)")
        if not reasons:
            return ""
        return ("⚠️ **This image looks unlike Fashion-MNIST**: " + "; ".join(reasons) + ". The model only knows ten "
                "kinds of clothing on a black background, so its answer says little about this picture. (This check "
                f"flags {self.false_alarms:.1%} of real Fashion-MNIST test images.)")

    def save(self, path: str | Path) -> None:
        tensors = {k: torch.from_numpy(np.ascontiguousarray(getattr(self, k))) for k in ARRAYS}
        numbers = {k: float(getattr(self, k)) for k in (*NUMBERS, *SHAPE_NUMBERS)}
        save_file(tensors, str(path), metadata={"numbers": json.dumps(numbers)})


UNCHECKED = ("This model has no calibration file (`calibration.safetensors`, written by `python -m train.calibrate`): "
             "its probabilities are the plain softmax and unusual inputs (photos, drawings) are not checked.")


def load_calibration(path: str | Path) -> Calibration:
    """Read ``calibration.safetensors`` (safetensors: no pickle)."""
    tensors = load_file(str(path))
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    numbers = json.loads(header["__metadata__"]["numbers"])
    return Calibration(**{k: tensors[k].double().numpy() for k in ARRAYS}, **{k: float(numbers[k]) for k in NUMBERS},
                       **{k: float(numbers[k]) for k in SHAPE_NUMBERS if k in numbers})


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The T > 0 minimising the mean negative log-likelihood of softmax(logits / T) (Guo et al. 2017, §4.2),
    by L-BFGS on log T (so T stays positive)."""
    logits, labels = logits.double(), labels.long()
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.5, max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(logits / log_t.exp(), labels)
        loss.backward()
        return loss

    opt.step(closure)
    return float(log_t.detach().exp())


def fit_features(features: np.ndarray, labels: np.ndarray, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Class means (C, D) and the precision of the shared within-class covariance (Lee et al. 2018, eq. 1)."""
    f = np.asarray(features, dtype=np.float64)
    means = np.stack([f[labels == c].mean(0) for c in range(classes)])
    centred = f - means[labels]
    cov = centred.T @ centred / len(f) + 1e-6 * np.eye(f.shape[1])  # a small ridge keeps it invertible
    return means, np.linalg.inv(cov)


def fit_pixels(images: np.ndarray, components: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Mean image (H·W,) and the first ``components`` principal directions (K, H·W) of uint8 images (N, H, W)."""
    x = np.asarray(images, dtype=np.float64).reshape(len(images), -1) / 255.0
    mean = x.mean(0)
    return mean, np.linalg.svd(x - mean, full_matrices=False)[2][:components]


def expected_calibration_error(probs: np.ndarray, labels: np.ndarray, bins: int = 15) -> float:
    """ECE (Guo et al. 2017, eq. 3): |accuracy − confidence| averaged over 15 equal-width confidence bins,
    weighted by the share of samples in each."""
    confidence, correct = probs.max(1), probs.argmax(1) == labels
    edges = np.linspace(0.0, 1.0, bins + 1)
    ece = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = (confidence > lo) & (confidence <= hi)
        if inside.any():
            ece += inside.mean() * abs(confidence[inside].mean() - correct[inside].mean())
    return float(ece)


def calibrated(model: torch.nn.Module, logits: torch.Tensor, features: torch.Tensor, shown: np.ndarray) -> dict:
    """What an image model's ``classify`` reports from its logits (classes,), the final features its head reads
    (D,: the family's ``pool``) and the image it saw: ``probs`` (temperature-scaled where the model carries a
    calibration, plain softmax otherwise), ``temperature`` and ``unusual`` (the out-of-distribution notice, empty
    when there is nothing to say or no calibration). The logits come from the family's own ``forward_head``, which
    need not read one vector (DeiT averages two heads)."""
    calibration: Calibration | None = getattr(model, "calibration", None)
    if calibration is None:
        fashion = getattr(getattr(model, "config", None), "input", "") == "fashion"
        return {"probs": torch.softmax(logits.float(), dim=-1).cpu().numpy().astype(np.float32), "temperature": 1.0,
                "unusual": UNCHECKED if fashion else ""}
    return {"probs": calibration.probs(logits), "temperature": calibration.temperature,
            "unusual": calibration.check(shown, features.double().cpu().numpy())}
