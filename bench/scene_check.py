"""How often the Image + text tab's unusual-input check (``models.inputs.images.scene_notice``) flags what the built-in
VLM was trained on, and how often it flags what it was not.

    python bench/scene_check.py [--data DIR] [--n 2000] [--split test]

Scenes: ``--n`` scenes composed by ``train.scenes.make_scene`` from the split's Fashion-MNIST items (the test split:
t10k, never trained on), each passed through ``fashion_array`` as an upload is; the share flagged is the false-alarm
rate the notice quotes (``SCENE_FALSE_ALARMS``). Single items: each of ``--n`` Fashion-MNIST items of the same split
uploaded alone (fitted to the 64×64 canvas, as a user uploading one garment would see it); noise: ``--n`` images of
uniform random grey (a stand-in for a photo's texture, which has no black background). Last stdout line:
``{"scenes": n, "scene_flagged": share, "item_flagged": share, "noise_flagged": share}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.inputs.images import fashion_array, scene_notice  # noqa: E402
from train.data import DEFAULT_DATA_DIR, load_fashion  # noqa: E402
from train.scenes import CANVAS, make_scene  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA_DIR))
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--split", default="test", choices=("train", "val", "test"))
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    images, labels = load_fashion(args.data)[args.split]
    flagged = [bool(scene_notice(fashion_array(make_scene(images, labels, args.seed, i).image, CANVAS)[0]))
               for i in range(args.n)]
    rng = np.random.default_rng(args.seed)
    items = [bool(scene_notice(fashion_array(images[int(k)], CANVAS)[0]))
             for k in rng.integers(0, len(images), args.n)]
    noise = [bool(scene_notice(fashion_array(rng.integers(0, 256, (96, 128), dtype=np.uint8), CANVAS)[0]))
             for _ in range(args.n)]
    print(json.dumps({"scenes": args.n, "split": args.split, "scene_flagged": float(np.mean(flagged)),
                      "item_flagged": float(np.mean(items)), "noise_flagged": float(np.mean(noise))}))


if __name__ == "__main__":
    main()
