"""Attention beside a trained saliency map: how well DINOv2's CLS attention (one layer's heads, or the rollout) agrees
with what its saliency decoder calls salient (models/families/dinov2.py), measured on the photograph's own patches
(the padding the package adds is left out).

Two measures, both on the patch grid: Spearman's rank correlation between the attention a patch gets and the mean
saliency of its pixels, and the intersection over union of the top ``share`` of patches by each (the "top pixels"
overlap, at patch resolution, where attention lives). Plain numpy: the views and bench/dinov2.py call the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png")  # the photographs the tests and bench/dinov2.py read


def photo_paths() -> list[Path]:
    """The example photographs scikit-image ships (its data folder, found without importing it; a test-only
    dependency, so [] where it is not installed)."""
    from importlib.util import find_spec

    spec = find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(next(iter(spec.submodule_search_locations))) / "data"
    return [folder / n for n in PHOTOS if (folder / n).is_file()]


def patch_saliency(saliency: np.ndarray, grid: tuple[int, int], patch: int) -> np.ndarray:
    """The mean saliency of each patch's pixels, (rows, cols), from the (H, W) map."""
    rows, cols = grid
    s = np.asarray(saliency, np.float64)[: rows * patch, : cols * patch]
    return s.reshape(rows, patch, cols, patch).mean(axis=(1, 3))


def content_patches(box: tuple[int, int, int, int], grid: tuple[int, int], patch: int) -> np.ndarray:
    """Bool (rows, cols): the patches whose centre lies on the photograph (not on the padding around it)."""
    top, left, h, w = box
    centres_y = (np.arange(grid[0]) + 0.5) * patch
    centres_x = (np.arange(grid[1]) + 0.5) * patch
    inside_y = (centres_y >= top) & (centres_y < top + h)
    inside_x = (centres_x >= left) & (centres_x < left + w)
    return inside_y[:, None] & inside_x[None, :]


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties given their mean rank (as Spearman's coefficient needs)."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), np.float64)
    ranks[order] = np.arange(1, len(x) + 1)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two equal-length vectors (NaN where either is constant)."""
    ra, rb = _ranks(np.ravel(a)), _ranks(np.ravel(b))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / denom) if denom > 0 else float("nan")


def top_iou(a: np.ndarray, b: np.ndarray, share: float = 0.1) -> float:
    """Intersection over union of the top ``share`` of entries (at least one) by ``a`` and by ``b``."""
    a, b = np.ravel(a), np.ravel(b)
    k = max(1, int(round(share * len(a))))
    ta, tb = set(np.argsort(-a, kind="stable")[:k]), set(np.argsort(-b, kind="stable")[:k])
    return len(ta & tb) / len(ta | tb)


@dataclass(frozen=True)
class Agreement:
    spearman: float  # rank correlation over the photograph's patches
    iou: float  # overlap of the top ``share`` of those patches
    share: float
    patches: int  # how many patches were compared


def agreement(attention: np.ndarray, saliency_patches: np.ndarray, mask: np.ndarray,
              share: float = 0.1) -> Agreement:
    """Attention per patch (rows, cols) against saliency per patch, on the patches ``mask`` keeps."""
    a, s = np.asarray(attention, np.float64)[mask], np.asarray(saliency_patches, np.float64)[mask]
    return Agreement(spearman(a, s), top_iou(a, s, share), share, int(mask.sum()))


def cls_maps(result: Any) -> dict[str, np.ndarray]:
    """CLS → patch maps (rows, cols) of a FocusResult: each layer's mean over heads ("layer N") and the rollout."""
    from models.analysis import rollout

    w = result.attention["encoder"].weights  # (L, H, N, N)
    k, grid = result.prefix_tokens, result.grid
    maps = {f"layer {i}": w[i, :, 0, k:].mean(0).reshape(grid) for i in range(w.shape[0])}
    maps["rollout"] = rollout(w)[-1][0, k:].reshape(grid)
    return maps


def focus_agreement(result: Any, share: float = 0.1) -> dict[str, Agreement]:
    """Agreement of every CLS map (``cls_maps``) with the saliency decoder's map, on the photograph's patches."""
    sal = patch_saliency(result.saliency, result.grid, result.patch)
    mask = content_patches(result.box, result.grid, result.patch)
    return {name: agreement(m, sal, mask, share) for name, m in cls_maps(result).items()}
