"""bench/heads.py on the shipped gpt-tiny: its known heads come first (issue 62: the previous-token head in layer 2,
head 1 or 2; the induction head in layer 3, head 0 or 1), and a second run answers from the cache. Times are the
bench's to report, never asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench(*args: str, cache: Path) -> dict:
    env = {**os.environ, "ATLAS_CACHE": str(cache)}
    env.pop("ATLAS_CHECKPOINTS", None)  # the shipped checkpoints
    out = subprocess.run([sys.executable, "bench/heads.py", *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def gpt_tiny(tmp_path_factory) -> tuple[dict, dict]:
    cache = tmp_path_factory.mktemp("heads-cache")
    return _bench("--model", "gpt-tiny", cache=cache), _bench("--model", "gpt-tiny", cache=cache)


def _first(grid: list[list[float | None]]) -> tuple[int, int]:
    best = max(((v, la, h) for la, row in enumerate(grid) for h, v in enumerate(row) if v is not None))
    return best[1], best[2]


def test_gpt_tiny_known_heads_ranked_first(gpt_tiny) -> None:
    report, _ = gpt_tiny
    assert report["model"] == "gpt-tiny" and report["layers"] == 4 and report["heads"] == 8
    assert set(report) >= {"model", "layers", "heads", "metrics", "seconds"}
    metrics = report["metrics"]
    assert all(len(grid) == 4 and all(len(row) == 8 for row in grid) for grid in metrics.values())
    assert _first(metrics["previous"]) in {(2, 1), (2, 2)}
    assert _first(metrics["induction"]) in {(3, 0), (3, 1)}
    assert report["best"]["previous"][:2] == list(_first(metrics["previous"]))
    assert not report["cached"]


def test_second_run_is_cached_and_equal(gpt_tiny) -> None:
    first, second = gpt_tiny
    assert second["cached"] and second["compute_seconds"] is None
    assert second["metrics"] == first["metrics"]


def test_unknown_name_refused_in_words(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "bench/heads.py", "--model", "no-such-model"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "ATLAS_CACHE": str(tmp_path)})
    assert out.returncode == 2 and "No model is called 'no-such-model'" in out.stderr and "Traceback" not in out.stderr
