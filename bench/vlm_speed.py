"""How long a SmolVLM-256M-shaped model takes to answer about an image with every attention map (issue 63, item 6).

A random Idefics3 folder of SmolVLM-256M-Instruct's real shapes is written by transformers (a dev dependency; the app
never imports it): a SigLIP tower of 12 blocks, width 768, 12 heads over 512-pixel tiles in 16-pixel patches, a pixel
shuffle of 4 (64 image tokens a tile), and SmolLM2-135M's LLaMA (30 blocks, width 576, 9 heads over 3 key/value
heads, vocabulary 49,280); the image processor of SmolVLM (longest side to 2,048, LANCZOS, 512-pixel tiles plus
the global view). The tokenizer is tests' small byte-level one with the image tokens added (the words do not matter
to the timing). Then ``models.load`` reads it and ``describe`` answers ``--new-tokens`` tokens greedily about a
``--image`` picture, keeping the language model's attention over the whole sequence (every layer) and the tower's
attention of the global view: the figure the Image + text tab waits for.

    python bench/vlm_speed.py                       # 640 × 480: 4 × 3 tiles + the global view, 20 new tokens
    python bench/vlm_speed.py --image 300x300       # 4 × 4 tiles (the first resize scales the longest side up)

Three arms in one run by default: float32 throughout (what the parity tests hold to 1e-4), ``bf16-tiles`` (the tiles
besides the global view through a bfloat16 copy of the tower; the global view, whose attention is shown, and the
language model stay float32) and ``global-view`` (float32, no tiles: what the processor gives with do_image_splitting
off, one 512-pixel view of the whole picture). The last line is one JSON object: ``seconds`` (the first arm's fastest
of ``--repeats``; the sizes are the first arm's too), each arm's runs and sizes, the part of each that is the image
(tiles, tower and connector: ``tower_s_*``, timed once after), how far bfloat16 moves the image features (relative
error) and whether the answer stays the same, the CPU seconds of each arm's fastest run (``cpu_s_*``: the work, which
a busy machine stretches less than the wall time), the load time, the sequence's size, the machine's load average
before and after, and ``gemm_gflops_float32`` / ``gemm_gflops_bfloat16``: how fast this machine multiplies one of
the tower's largest matrices right after (the ceiling: 12 tiles' tower is about 2.1 TFLOP of matrix products).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ARMS = ("float32", "bf16-tiles", "global-view")
SMOLVLM_256M = dict(  # HuggingFaceTB/SmolVLM-256M-Instruct's config.json
    vision=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                image_size=512, patch_size=16),
    text=dict(vocab_size=49280, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
              num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
              rms_norm_eps=1e-5, tie_word_embeddings=False),
    scale_factor=4, longest_edge=2048, tile=512)
SMALL = dict(  # --small: the same layout at a size a test can afford
    vision=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, image_size=64,
                patch_size=8),
    text=dict(vocab_size=352, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
              num_key_value_heads=3, max_position_embeddings=2048, rope_theta=100000.0, rms_norm_eps=1e-5,
              tie_word_embeddings=False),
    scale_factor=4, longest_edge=256, tile=64)


def write_folder(folder: Path, shape: dict, seed: int = 0) -> int:
    """The random folder (config.json, model.safetensors, processor files); returns the parameter count."""
    import torch
    import transformers

    from tests.vlm_folders import CHAT_TEMPLATE, IDEFICS_TOKENS, _tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(folder, IDEFICS_TOKENS)
    vision = transformers.Idefics3VisionConfig(**shape["vision"])
    text = transformers.LlamaConfig(**shape["text"], bos_token_id=0, eos_token_id=0, pad_token_id=0)
    cfg = transformers.Idefics3Config(vision_config=vision, text_config=text, scale_factor=shape["scale_factor"],
                                      image_token_id=tok.convert_tokens_to_ids("<image>"))
    torch.manual_seed(seed)
    model = transformers.Idefics3ForConditionalGeneration(cfg).eval()
    model.save_pretrained(folder, safe_serialization=True)
    per_tile = (shape["vision"]["image_size"] // shape["vision"]["patch_size"] // shape["scale_factor"]) ** 2
    images = transformers.Idefics3ImageProcessor(size={"longest_edge": shape["longest_edge"]},
                                                 max_image_size={"longest_edge": shape["tile"]}, resample=1)
    transformers.Idefics3Processor(image_processor=images, tokenizer=tok, image_seq_len=per_tile,
                                   chat_template=CHAT_TEMPLATE).save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def picture(width: int, height: int):
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[:height, :width]
    rng = np.random.default_rng(0)
    img = np.stack([x * 255 / width, y * 255 / height, 128 + 100 * (((x - width / 2) ** 2 + (y - height / 3) ** 2)
                                                                    < (min(width, height) / 4) ** 2)], -1)
    return Image.fromarray(np.clip(img + rng.normal(0, 20, img.shape), 0, 255).astype(np.uint8))


def gemm_rate(dtype, shape: dict, repeats: int = 3) -> float:
    """GFLOP/s of one of the tower's largest matrix products on this machine now (12 tiles' tokens × width ×
    MLP width, the first MLP layer's): the ceiling the tower's time is set against."""
    import torch
    import torch.nn.functional as F

    v = shape["vision"]
    rows = 12 * (v["image_size"] // v["patch_size"]) ** 2
    x, w = torch.randn(rows, v["hidden_size"], dtype=dtype), torch.randn(v["intermediate_size"], v["hidden_size"],
                                                                          dtype=dtype)
    F.linear(x, w)
    t0 = time.perf_counter()
    for _ in range(repeats):
        F.linear(x, w)
    return round(2 * rows * v["hidden_size"] * v["intermediate_size"] * repeats / (time.perf_counter() - t0) / 1e9, 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--new-tokens", type=int, default=20)
    ap.add_argument("--image", default="640x480", help="WIDTHxHEIGHT of the picture asked about")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--arms", default=",".join(ARMS),
                    help="comma-separated: float32 (what the parity tests hold), bf16-tiles (the tiles besides the "
                         "global view in bfloat16), global-view (no tiles: the processor's do_image_splitting off)")
    ap.add_argument("--folder", type=Path, default=None, help="where to write the random folder (default: a "
                                                              "temporary one, removed after)")
    ap.add_argument("--small", action="store_true", help="tiny shapes, the same layout (for the tests)")
    args = ap.parse_args(argv)
    import torch

    import models

    width, height = (int(v) for v in args.image.lower().split("x"))
    shape = SMALL if args.small else SMOLVLM_256M
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder or Path(tmp) / "smolvlm-256m-random"
        params = write_folder(folder, shape)
        t0 = time.perf_counter()
        model = models.load(str(folder))
        load_s = time.perf_counter() - t0
        image = picture(width, height)
        prompt = model.chat_prompt("Can you describe this image?")
        timed: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        answers: dict[str, list[int]] = {}
        tower: dict[str, float] = {}
        features: dict[str, torch.Tensor] = {}
        arms = [a for a in args.arms.split(",") if a]
        unknown = set(arms) - set(ARMS)
        if unknown or not arms:
            ap.error(f"unknown arms {sorted(unknown)} (choose from {', '.join(ARMS)})")
        sizes: dict[str, list[int]] = {}
        first = None
        for arm in arms:
            model.bf16_tiles = arm == "bf16-tiles"
            model.image_splitting = False if arm == "global-view" else None
            timed[arm], cpu[arm] = [], []
            for _ in range(max(1, args.repeats)):
                t0, c0 = time.perf_counter(), time.process_time()
                with torch.inference_mode():
                    r = model.describe(image, prompt, max_new_tokens=args.new_tokens)
                timed[arm].append(time.perf_counter() - t0)
                cpu[arm].append(time.process_time() - c0)
                print(f"{arm}: describe {timed[arm][-1]:.2f} s, {len(r.ids) - r.prompt_len} new tokens, "
                      f"{len(r.ids)} in all", flush=True)
            answers[arm] = r.ids
            first = first or r
            sizes[arm] = [int(r.image_cells[:, 0].max()) + 1, len(r.image_positions), len(r.ids)]
            t0 = time.perf_counter()  # the part that is the image: the tiles, the tower, the connector
            with torch.inference_mode():
                features[arm] = model.features(model.layout(image).pixels, need_weights=True)[0]
            tower[arm] = time.perf_counter() - t0
    r = first
    gemm = {f"gemm_gflops_{name}": gemm_rate(dtype, shape) for name, dtype in (("float32", torch.float32),
                                                                                ("bfloat16", torch.bfloat16))}
    result = {
        "bench": "vlm_speed", "shape": "small" if args.small else "SmolVLM-256M", "params_m": round(params / 1e6, 1),
        "image": [width, height], "seen": list(r.image.shape[:2][::-1]), "tiles": int(r.image_cells[:, 0].max()) + 1,
        "image_tokens": len(r.image_positions), "prompt_tokens": r.prompt_len, "sequence": len(r.ids),
        "new_tokens": len(r.ids) - r.prompt_len, "seconds": round(min(timed[arms[0]]), 2),
        **{f"seconds_{arm}": round(min(runs), 2) for arm, runs in timed.items()},
        **{f"runs_{arm}": [round(s, 2) for s in runs] for arm, runs in timed.items()},
        **{f"cpu_s_{arm}": round(min(runs), 2) for arm, runs in cpu.items()},
        **{f"tower_s_{arm}": round(s, 2) for arm, s in tower.items()},
        "load_s": round(load_s, 2), "attention_mb": round(r.attention.nbytes / 2**20, 1),
        "vision_attention_mb": round(r.vision_attention.nbytes / 2**20, 1), "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(), "load_avg_before": round(load_before[0], 2),
        "load_avg_after": round(os.getloadavg()[0], 2)}
    result.update(gemm)
    result["tiles_image_tokens_sequence"] = sizes
    if {"float32", "bf16-tiles"} <= set(arms):  # what bfloat16 tiles change: the features, and the answer?
        a, b = features["float32"], features["bf16-tiles"]
        result["bf16_feature_rel_err"] = round(float((a - b).norm() / a.norm()), 5)
        result["bf16_same_ids"] = answers["float32"] == answers["bf16-tiles"]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
