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
    """The example image the input names (0–9; empty: 7) through vit-fashion: (result, the image shown, the image
    asked for, CLS's last-layer attention to the patches (mean of heads), rollout's). An image whose garment and
    background shares are a near-tie for 7·1 (`clear`) gives way to the next one that is not, so both steps of the
    lesson show the same image and 7·1's verdict stands clear of its line."""
    from models.analysis import rollout

    asked = int(np.clip(seed_of(inp), 0, len(EXAMPLE_IMAGES) - 1)) if (inp or "").strip() else 7
    for k in range(len(EXAMPLE_IMAGES)):
        index = (asked + k) % len(EXAMPLE_IMAGES)
        r = get_model("vit-fashion").classify(str(EXAMPLE_IMAGES[index]))
        w = r.attention["encoder"].weights
        last = w[-1].mean(0)[0, r.prefix_tokens:]  # the patches come after [CLS] (and DeiT's distillation token)
        if clear(r, last):
            break
    else:
        raise ValueError("no example image gives a clear answer")
    return r, index, asked, last, rollout(w)[-1][0, r.prefix_tokens:]


def _patch(grid: tuple[int, int], i: int) -> str:
    return f"row {i // grid[1]}, column {i % grid[1]}"


INK = 0.15  # a patch whose mean pixel (0–1) is above this is on the garment; below, plain background
CLOSE = 0.8  # per-patch shares within this ratio of each other are "about the same"
BAND = 0.05  # a ratio within this of CLOSE is a near-tie: "about the same" and "more" would both be fair


def garment_patches(image: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """(rows·cols,) bool: the patches of what the model saw (a dark-background Fashion-MNIST image) whose mean
    brightness is above `INK`, in the model's patch order."""
    img = np.asarray(image, dtype=np.float64)
    img = img.mean(-1) if img.ndim == 3 else img
    rows, cols = grid
    ph, pw = img.shape[0] // rows, img.shape[1] // cols
    means = img[: rows * ph, : cols * pw].reshape(rows, ph, cols, pw).mean((1, 3)) / 255.0
    return (means > INK).reshape(-1)


def shares(r, last: np.ndarray) -> tuple[np.ndarray, float, float]:
    """(the garment patches, CLS's mean share per garment patch, per background patch)."""
    on = garment_patches(r.image, r.grid)
    return on, float(last[on].mean()) if on.any() else 0.0, float(last[~on].mean()) if not on.all() else 0.0


def clear(r, last: np.ndarray) -> bool:
    """Whether 7·1 has a clear answer on this image: it has garment and background patches, and the ratio of their
    shares is at least BAND away from CLOSE."""
    on, g, b = shares(r, last)
    return bool(on.any() and not on.all() and max(g, b) > 0 and abs(min(g, b) / max(g, b) - CLOSE) >= BAND)


def l7_cls(inp: str) -> Question:
    from viz import images as vi

    r, index, asked, last, _ = _vit(inp)
    on, g, b = shares(r, last)
    choices = ["a patch on the garment", "a patch of plain background", "about the same (within 20 %)"]
    answer = choices[2] if min(g, b) >= CLOSE * max(g, b) else choices[0] if g > b else choices[1]
    before = vi.image_attention(r.image, on.astype(np.float32), r.grid, label="on the garment", autoscale=False,
                                opacity=0.35, title="What the ViT sees: garment patches (1) and background (0)")
    instead = (f"(Example image {asked} is a near-tie between two of the answers below, so its neighbour is "
               "shown.) ") if index != asked else ""
    said = r.labels[int(np.argmax(r.probs))]
    return Question(f"{instead}The ViT sees example image {index} (it answers **{said}**) as {r.grid[0]} × "
                    f"{r.grid[1]} patches plus a CLS token, which the classifier reads; the figure "
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

    r, _, _, last, roll = _vit(inp)
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
