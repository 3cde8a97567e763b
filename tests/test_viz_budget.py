"""Every figure family stays within the 2 MB JSON budget (docs/ARCHITECTURE.md §6) at the app's input caps.

The cases are the ones ``bench/payload.py`` measures (one source of truth for "the largest inputs").
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import viz

_spec = importlib.util.spec_from_file_location("bench_payload", Path(__file__).parents[1] / "bench" / "payload.py")
payload = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(payload)

CASES = list(payload.largest_cases())


@pytest.mark.parametrize("family,name,build", CASES, ids=[c[1] for c in CASES])
def test_figure_within_budget(family, name, build):
    size = payload.payload_size(build())
    assert size <= payload.BUDGET_BYTES, f"{family}/{name}: {size / 1e6:.2f} MB"


def test_every_family_is_covered():
    assert {c[0] for c in CASES} == {"attention", "text", "images", "stats", "positional", "swin", "generate", "heads"}


def test_model_view_is_far_lighter_than_bertviz():
    w = payload.random_attention((12, 12, 128, 128), seed=128)
    toks = payload.tokens(128)
    ours = len(viz.model_view(w, toks).to_json())
    # bertviz's nested lists: ~22 characters a weight; estimate instead of building 50 MB in a test
    sample = payload.bertviz_json(w[:1, :1], toks)
    bertviz_estimate = len(sample) * 144
    assert bertviz_estimate / ours >= 25


def test_head_view_caps_lines_on_dense_attention():
    fig = viz.head_view(payload.dense_attention((12, 256, 256)), payload.tokens(256), max_segments=20000)
    lines = sum(int(np.isnan(np.asarray(t.y, dtype=float)).sum()) for t in fig.data
                if t.x is not None and len(t.x) > 1)
    assert lines == 20000
