"""Activation patching's cost (models/inspect/patching.py): each sweep beside one plain forward pass of the same input,
in the same run.

- gpt-tiny (the shipped checkpoint, its large linear layers fp16-packed as the app's model store runs them):
  the heads sweep and the positions sweep on ``repeated_pair(model, n)``, 2n = ``--tokens`` tokens (40);
- a GPT-2-small-shaped model (recipe gpt2, 12 layers, 12 heads, d_model 768, vocabulary 50257, 1024 positions;
  random weights from a fixed seed, float32, not packed): the heads sweep on the same length.

    python bench/patching.py
    python bench/patching.py --checkpoint DIR --no-gpt2 --repeats 1    # a quick run (the tests)

Targets on a 2-core CPU: gpt-tiny heads sweep ≤ 3 s, GPT-2 small heads sweep ≤ 30 s. Last stdout line: one JSON
object with, per model, ``<model>_<sweep>_s`` (median seconds), ``<model>_forward_s`` (one plain forward) and
``<model>_<sweep>_ratio`` (sweep / forward), plus ``tokens`` and ``threads``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name: str, model, clean: list[int], corrupted: list[int], sweeps: tuple[str, ...],
            repeats: int) -> dict[str, float]:
    import torch

    from models.inspect.patching import patch_sweep

    ids = torch.tensor([corrupted])
    with torch.inference_mode():
        model(ids)  # warm-up: packing, allocator
        forward = median_seconds(lambda: model(ids), max(10, repeats))
    out = {f"{name}_forward_s": round(forward, 4)}
    for sweep in sweeps:
        patch_sweep(model, clean, corrupted, sweep)  # warm-up
        s = median_seconds(lambda sweep=sweep: patch_sweep(model, clean, corrupted, sweep), repeats)
        out[f"{name}_{sweep}_s"] = round(s, 4)
        out[f"{name}_{sweep}_ratio"] = round(s / forward, 1)
        print(f"{name} {sweep}: {s:.3f} s ({s / forward:.1f}x one forward of {forward * 1000:.1f} ms)", flush=True)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "gpt-tiny"), help="gpt-tiny's folder")
    ap.add_argument("--tokens", type=int, default=40, help="input length (even): BOS + A + A[:-1]")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per sweep (median)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the 2-core budget machine)")
    ap.add_argument("--no-gpt2", action="store_true", help="skip the GPT-2-small-shaped model")
    args = ap.parse_args(argv)

    import torch

    import models
    from models.decoding.packed import pack_linears
    from models.families.gpt import GPT, GPTConfig
    from models.inspect.patching import repeated_pair

    torch.set_num_threads(args.threads)
    n = args.tokens // 2
    report: dict = {"tokens": 2 * n, "threads": args.threads}

    tiny = models.load(args.checkpoint)
    report["gpt_tiny_packed_layers"] = pack_linears(tiny)
    clean, corrupted = repeated_pair(tiny, n, seed=0)
    report.update(measure("gpt_tiny", tiny, clean, corrupted, ("heads", "positions"), args.repeats))

    if not args.no_gpt2:
        torch.manual_seed(0)
        gpt2 = GPT(GPTConfig(recipe="gpt2", vocab_size=50257, max_len=1024, d_model=768, n_layers=12,
                             n_heads=12)).eval()
        clean2, corrupted2 = repeated_pair(gpt2, n, seed=0)
        report.update(measure("gpt2_small", gpt2, clean2, corrupted2, ("heads",), max(1, args.repeats - 1)))
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
