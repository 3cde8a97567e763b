"""bench/long_context.py --quick runs end to end on a tiny Gemma-3-shaped model: every figure reported per length, the
store equal to the model's own float32 attention and to transformers' eager attention on the same weights, the
Gemma 3 reader's config the one the bench builds directly, the reference skipped in words past its memory cap;
never times."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"prefill_s", "peak_rss_mb", "store_mb", "tile_s", "row_s", "stats_s", "max_diff_vs_full"}


@pytest.mark.slow
def test_long_context_bench_quick() -> None:
    # a cap of 1 MB: 96 tokens' (6, 4, 96, 96) float32 map fits (0.88 MB), 600 tokens' does not
    proc = subprocess.run([sys.executable, "bench/long_context.py", "--quick", "--reference-max-gb", "0.001"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["model"] == "tiny-gemma-3" and report["dtype"] == "bfloat16" and report["layers"] == 6
    assert set(report["lengths"]) == {"96", "600"}
    for n, row in report["lengths"].items():
        assert KEYS <= set(row), n
        assert row["max_diff_vs_full"] < 1e-5 and row["logits_diff_vs_full"] < 1e-4, n
        assert 0 < row["max_diff_dtype_vs_float32"] < 0.05, n  # the bfloat16 store: near, not equal
        assert row["stats_diff"] < 1e-4 and row["peak_rss_mb"] >= row["model_rss_mb"] > 0, n
        assert row["global_layer"] == 5 and row["local_layer"] == 0 and row["store_mb"] > 0, n
    # at 600 tokens (over the 512 cells) the global layer's overview came from the prompt pass
    assert report["lengths"]["600"]["tile_precomputed"] and report["lengths"]["600"]["precomputed_overviews"] == [5]
    ref = report["reference"]
    assert ref["96"]["config_matches"] and ref["96"]["config_differs"] == {}
    assert ref["96"]["max_diff_vs_transformers"] < 1e-5 and ref["96"]["attention_mb"] > 0
    assert ref["600"] == {"skipped": "would need 0.0346 GB"}
