"""Fit and measure a Fashion-MNIST image model's calibration and unusual-input check (models/calibration.py).

    python -m train.calibrate --checkpoint checkpoints/vit-fashion --data-dir ../shared/data
    python -m train.calibrate --checkpoint checkpoints/swin-fashion --data-dir ../shared/data

Pre-registered rules (nothing is chosen after looking at the test split or the non-Fashion images):
- temperature: the NLL-minimising T on the validation split (the last 5,000 training images);
- statistics: class means and the shared covariance of the final features, and the first 50 principal directions
  of the pixels, on the training split;
- thresholds: each of the five checks' limit is the 0.4 % tail of its score (2 % / 5), so that together they flag
  at most about 2 % of Fashion-MNIST images: on the validation split for the three checks whose statistics come from
  the training split (background, pixels, features), on the training split for the two shape checks (enclosed
  background, thin strokes: plain image statistics, nothing fitted).
Then it reports, on Fashion-MNIST t10k: accuracy, ECE before and after (15 bins) and the false-alarm rate; and on
a non-Fashion set made here from the photographs scikit-image ships (each whole and 10 random crops, fixed seed)
plus 100 synthetic images (noise, gradients, discs, checkerboards): the share flagged; and on 60 line drawings
made here (closed outlines of a shoe, a shirt and a bag, pen 2–12 px on a 512 px white canvas, and 40 open
scribbles, fixed seed), the share flagged. Writes
``calibration.safetensors`` into the checkpoint (and its manifest) and the figures under "calibration" in
metrics.json; the last stdout line is the figures as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from train.data import load_fashion

TAIL = 0.02 / 5  # each check's share of Fashion-MNIST images beyond its limit (the five together: at most 2 %)


def non_fashion_images(seed: int = 0) -> tuple[np.ndarray, int]:
    """(uint8 (N, 28, 28) images converted as the app converts uploads, how many of them are photographs)."""
    import skimage
    from PIL import Image

    from models.inputs.images import fashion_array

    rng = np.random.default_rng(seed)
    folder = Path(skimage.__file__).parent / "data"
    out = []
    for path in sorted(folder.glob("*")):
        if path.suffix.lower() not in (".png", ".jpg", ".gif"):
            continue
        a = np.asarray(Image.open(path).convert("RGB"))
        H, W = a.shape[:2]
        out.append(fashion_array(a)[0])
        for _ in range(10):
            s = rng.uniform(0.3, 0.9)
            h, w = int(H * s), int(W * s)
            y, x = rng.integers(0, H - h + 1), rng.integers(0, W - w + 1)
            out.append(fashion_array(np.ascontiguousarray(a[y:y + h, x:x + w]))[0])
    photos = len(out)
    yy, xx = np.mgrid[:64, :64]
    for i in range(100):
        kind = i % 4
        if kind == 0:
            a = rng.integers(0, 256, (64, 64)).astype(np.uint8)
        elif kind == 1:
            ramp = np.linspace(0, 255, 64).astype(np.uint8)
            a = np.tile(ramp, (64, 1)) if i % 8 < 4 else np.tile(ramp[:, None], (1, 64))
        elif kind == 2:
            (cy, cx), r = rng.integers(10, 54, 2), rng.integers(5, 20)
            a = np.where((yy - cy) ** 2 + (xx - cx) ** 2 < r * r, rng.integers(100, 256), 0).astype(np.uint8)
        else:
            a = ((yy + xx) // rng.integers(2, 16) % 2 * 255).astype(np.uint8)
        out.append(fashion_array(np.ascontiguousarray(a))[0])
    return np.stack(out), photos


def drawings(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 (N, 28, 28) line drawings converted as the app converts uploads, (N,) bool: closed outline, not an
    open scribble). Outlines: a shoe, a shirt and a bag traced with a jittered pen (2, 4, 8 or 12 px wide, as a drawing
    program's) on a 512 px white canvas; scribbles: open polylines of 3–8 random points."""
    from PIL import Image, ImageDraw

    from models.inputs.images import fashion_array

    rng = np.random.default_rng(seed)
    shapes = [[(60, 300), (200, 290), (300, 200), (380, 210), (460, 330), (460, 380), (60, 380)],  # shoe
              [(180, 60), (330, 60), (460, 160), (410, 220), (360, 180), (360, 460), (150, 460), (150, 180),
               (100, 220), (50, 160)],  # shirt
              [(90, 200), (180, 200), (190, 90), (320, 90), (330, 200), (420, 200), (440, 450), (70, 450)]]  # bag
    out, closed = [], []
    for i in range(60):
        canvas = Image.new("L", (512, 512), 255)
        pen = (2, 4, 8, 12)[i % 4]
        if i < 20:
            points = [(x + rng.uniform(-12, 12), y + rng.uniform(-12, 12)) for x, y in shapes[i % 3]]
            points.append(points[0])
        else:
            points = [tuple(rng.uniform(40, 470, 2)) for _ in range(rng.integers(3, 9))]
        ImageDraw.Draw(canvas).line(points, fill=0, width=pen, joint="curve")
        out.append(fashion_array(canvas)[0])
        closed.append(i < 20)
    return np.stack(out), np.array(closed)


@torch.no_grad()
def logits_and_features(model: torch.nn.Module, images: np.ndarray, batch: int = 500
                        ) -> tuple[torch.Tensor, np.ndarray]:
    """(logits (N, C), final features (N, D) float64) of uint8 (N, 28, 28) images."""
    from models.inputs.images import fashion_tensor

    logits, features = [], []
    for i in range(0, len(images), batch):
        x = fashion_tensor(images[i:i + batch])
        final, _ = model.forward_features(x)
        features.append(model.pool(final).double())
        logits.append(model.forward_head(final).double())
    return torch.cat(logits), torch.cat(features).numpy()


def main(argv: list[str] | None = None) -> int:
    import models
    from models.calibration import (
        FILE,
        Calibration,
        background_share,
        enclosed_share,
        expected_calibration_error,
        fit_features,
        fit_pixels,
        fit_temperature,
        thin_share,
    )
    from models.io.checkpoint import add_to_manifest

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, required=True, help="a Fashion-MNIST ViT or Swin checkpoint folder")
    ap.add_argument("--data-dir", type=Path, required=True, help="the folder holding fashion-mnist/")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    model = models.load(args.checkpoint)
    model.calibration = None
    data = load_fashion(args.data_dir)
    _, train_f = logits_and_features(model, data["train"][0])
    val_l, val_f = logits_and_features(model, data["val"][0])
    test_l, test_f = logits_and_features(model, data["test"][0])
    temperature = fit_temperature(val_l, torch.as_tensor(data["val"][1]))
    means, precision = fit_features(train_f, data["train"][1], len(model.labels))

    pixel_mean, pixel_basis = fit_pixels(data["train"][0])
    fitted = dict(temperature=temperature, means=means, precision=precision, pixel_mean=pixel_mean,
                  pixel_basis=pixel_basis)
    draft = Calibration(**fitted, feature_limit=0.0, background_limit=0.0, pixel_limit=0.0, false_alarms=0.0)
    limits = dict(feature_limit=float(np.quantile(draft.feature_distance(val_f), 1 - TAIL)),
                  background_limit=float(np.quantile([background_share(im) for im in data["val"][0]], TAIL)),
                  pixel_limit=float(np.quantile(draft.pixel_residual(data["val"][0]), 1 - TAIL)),
                  enclosed_limit=float(np.quantile(enclosed_share(data["train"][0]), 1 - TAIL)),
                  thin_limit=float(np.quantile(thin_share(data["train"][0]), 1 - TAIL)))
    draft = replace(draft, **limits)
    test_flags = draft.flagged(data["test"][0], test_f)
    calibration = replace(draft, false_alarms=float(test_flags.mean()))
    calibration.save(args.checkpoint / FILE)
    add_to_manifest(args.checkpoint, FILE)

    others, photos = non_fashion_images()
    other_flags = calibration.flagged(others, logits_and_features(model, others)[1])
    drawn, outline = drawings()
    drawn_flags = calibration.flagged(drawn, logits_and_features(model, drawn)[1])
    y = data["test"][1]
    before = torch.softmax(test_l, -1).numpy()
    after = torch.softmax(test_l / temperature, -1).numpy()
    figures = {
        "temperature": round(temperature, 4),
        "accuracy": round(float((after.argmax(1) == y).mean()), 4),
        "ece_before": round(expected_calibration_error(before, y), 4),
        "ece_after": round(expected_calibration_error(after, y), 4),
        "mean_confidence_before": round(float(before.max(1).mean()), 4),
        "mean_confidence_after": round(float(after.max(1).mean()), 4),
        "false_alarms_t10k": round(float(test_flags.mean()), 4),
        "flagged_non_fashion": round(float(other_flags.mean()), 4),
        "flagged_photos": round(float(other_flags[:photos].mean()), 4),
        "non_fashion_images": len(others),
        "flagged_outlines": round(float(drawn_flags[outline].mean()), 4),
        "flagged_scribbles": round(float(drawn_flags[~outline].mean()), 4),
        **{k: round(v, 3) for k, v in limits.items()},
        "command": "python -m train.calibrate " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
    }
    metrics_path = args.checkpoint / "metrics.json"
    metrics = json.loads(metrics_path.read_text()) if metrics_path.is_file() else {}
    metrics["calibration"] = figures
    metrics_path.write_text(json.dumps(metrics, indent=2) + "\n")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
