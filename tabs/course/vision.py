"""Lesson 7 · ViT patches, rollout and Swin windows."""

from __future__ import annotations

import numpy as np

from tabs.common import EXAMPLE_IMAGES, get_model
from tabs.course.engine import (
    Lesson,
    Question,
    mark,
    seed_of,
)


def _vit(inp: str):
    from models.analysis import rollout

    index = int(np.clip(seed_of(inp), 0, len(EXAMPLE_IMAGES) - 1)) if (inp or "").strip() else 7
    r = get_model("vit-fashion").classify(str(EXAMPLE_IMAGES[index]))
    w = r.attention["encoder"].weights
    k = r.prefix_tokens  # the patches come after [CLS]
    return r, index, w[-1].mean(0)[0, k:], rollout(w)[-1][0, k:]


def _patch(grid: tuple[int, int], i: int) -> str:
    return f"row {i // grid[1]}, column {i % grid[1]}"


INK = 0.15  # a patch whose mean pixel (0–1) is above this is on the garment; below, plain background
CLOSE = 0.8  # per-patch shares within this ratio of each other are "about the same"


def garment_patches(image: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """(rows·cols,) bool: the patches of what the model saw (a dark-background Fashion-MNIST image) whose mean
    brightness is above `INK`, in the model's patch order."""
    img = np.asarray(image, dtype=np.float64)
    img = img.mean(-1) if img.ndim == 3 else img
    rows, cols = grid
    ph, pw = img.shape[0] // rows, img.shape[1] // cols
    means = img[: rows * ph, : cols * pw].reshape(rows, ph, cols, pw).mean((1, 3)) / 255.0
    return (means > INK).reshape(-1)


def l7_cls(inp: str) -> Question:
    from viz import images as vi

    r, index, last, _ = _vit(inp)
    on = garment_patches(r.image, r.grid)
    if on.all() or not on.any():
        raise ValueError("this image has no plain background to compare with")
    g, b = float(last[on].mean()), float(last[~on].mean())
    choices = ["a patch on the garment", "a patch of plain background", "about the same (within 20 %)"]
    answer = choices[2] if min(g, b) >= CLOSE * max(g, b) else choices[0] if g > b else choices[1]
    before = vi.image_attention(r.image, on.astype(np.float32), r.grid, label="on the garment", autoscale=False,
                                opacity=0.35, title="What the ViT sees: garment patches (1) and background (0)")
    return Question(f"The ViT sees example image {index} (it answers **{r.labels[int(np.argmax(r.probs))]}**) as "
                    f"{r.grid[0]} × {r.grid[1]} patches plus a CLS token, which the classifier reads; the figure "
                    "below marks which patches show the garment. **In the last layer (mean of heads), which does CLS "
                    "attend to more, per patch: a patch on the garment or a patch of plain background?**", choices,
                    answer, f"per patch, CLS gives {g:.4f} to the {int(on.sum())} garment patches and {b:.4f} to the "
                    f"{int((~on).sum())} background patches (the top one: {_patch(r.grid, int(np.argmax(last)))}, "
                    f"{float(last.max()):.3f})",
                    "CLS gathers the image into one vector by attending to patches; the last layer shows where it "
                    "reads from just before the answer. It is often the garment's outline, sometimes the empty "
                    "background, which some heads use as a place to park attention.",
                    lambda p: mark(vi.image_attention(r.image, last, r.grid, title="CLS → patches · last layer"), p),
                    before)


def l7_rollout(inp: str) -> Question:
    from viz import images as vi

    r, index, last, roll = _vit(inp)
    same = int(np.argmax(last)) == int(np.argmax(roll))
    choices = ["the same patch", "a different patch", "none: rollout is uniform"]
    answer = choices[2] if np.ptp(roll) < 1e-6 else choices[0] if same else choices[1]
    return Question("*Rollout* multiplies the attention of all layers (with the residual connection) to follow "
                    "information from the input to CLS. **Does rollout's top patch sit where the last layer's does?**",
                    choices, answer, f"last layer's top: {_patch(r.grid, int(np.argmax(last)))}; rollout's top: "
                    f"{_patch(r.grid, int(np.argmax(roll)))}",
                    "One layer's attention is one hop; rollout composes every hop, so it can move the focus to where "
                    "information started. Neither proves what the answer depends on (lesson 8).",
                    lambda p: mark(vi.image_attention(r.image, roll, r.grid, title="Attention rollout · CLS"), p))


def l7_swin(inp: str) -> Question:
    from models.families.swin import shifted_window_regions
    from viz import swin as vs

    regions = shifted_window_regions(8, 8, 4, 2).numpy()
    corner = len(np.unique(regions[4:, 4:]))
    choices = ["1", "2", "4", "9"]
    return Question("Swin attends inside 4 × 4 windows of an 8 × 8 grid; every second block shifts the windows by 2 "
                    "and rolls the grid around (the cyclic shift), so one window can hold pieces from opposite edges "
                    "of the image. Pieces that were not neighbours must not attend to each other. **How many separate "
                    "pieces (regions) does the bottom-right window hold?**", choices, str(corner),
                    f"the bottom-right window holds {corner} regions", "The −100 mask keeps each region to itself "
                    "inside a shared window, so the shift mixes information across windows without letting far-apart "
                    "pixels meet. Corner windows hold the most pieces.",
                    lambda p: mark(vs.region_map(regions, 4), p))


LESSON = Lesson(
    "7 · ViT patches, rollout and Swin windows", "Images as patches; attention across layers; shifted windows.",
           "example image (0–9)", "7", (l7_cls, l7_rollout, l7_swin))
