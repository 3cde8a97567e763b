"""bench/device.py --device cpu --quick runs end to end over the tiny checkpoints: every section reports, every
agreement check holds (the CPU against itself for the shipped models; the accelerate split across CPU and disk
against the undivided model; float32 greedy ids against transformers'); never times."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_device_bench_quick(tiny_checkpoints: Path) -> None:
    proc = subprocess.run([sys.executable, "bench/device.py", "--device", "cpu", "--quick", "--checkpoints",
                           str(tiny_checkpoints)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ok"] is True, json.dumps(report)[:3000]
    shipped = report["shipped"]
    assert set(shipped) >= {"gpt-tiny", "sst2", "minilm-sst2", "translator-en-de", "vit-fashion", "swin-fashion"}
    for name, entry in shipped.items():
        assert entry["agree"] and entry["analyses"] >= 3, name
    assert {"decompose_table", "patch_heads", "logit_lens", "fastgen_attention"} <= set(shipped["gpt-tiny"]["diffs"])
    assert "attribution_integrated_gradients" in shipped["sst2"]["diffs"]
    split = report["accelerate"]
    assert "disk" in split["device_map"].values() and split["agree"]
    big = report["big"]
    assert big["fp32"]["identical"] and big["fp32"]["plain_identical"] and big["fp32"]["max_attention_diff"] < 1e-5
    for run in big["generate"].values():
        assert 0 <= run["same_next_token"] <= 1 and run["pooled_mb"] > 0
        assert set(run["figures_ms"]) == {"heatmap_mean", "head_view", "zoom_64", "replay_model_view"}
    assert big["patching"]["tokens"] == 40 and big["split"]["agree"]
