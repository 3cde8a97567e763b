"""Every analysis keeps its tensors on the model's device (issue 52: the causal mask of the score split was made on
the CPU, so "why a head attends" failed on every decoder on a GPU).

CI has no GPU, so the default device is set to ``meta`` while the analyses run on a CPU model: a tensor an analysis
makes without ``device=`` then lands on ``meta``, and the first operation that meets the model's CPU tensors fails
("Tensor on device meta is not on the expected device cpu"). A tensor made with the model's device (or deliberately
``device="cpu"``, for numpy) is unaffected. ``test_meta_default_catches_a_cpu_mask`` shows the check fails on the
mask as ``decompose._scores`` made it before the fix.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import models
from bench._analyses import run_all

NAMES = ("gpt-tiny", "mamba-tiny", "sst2", "minilm-sst2", "translator-en-de", "vit-fashion", "swin-fashion")


@pytest.fixture(scope="module")
def loaded(tiny_checkpoints: Path) -> dict[str, torch.nn.Module]:
    return {name: models.load(tiny_checkpoints / name) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_every_analysis_keeps_the_model_device(loaded: dict, name: str) -> None:
    model = loaded[name]
    plain = run_all(model)  # on the CPU, default device CPU: the reference
    with torch.device("meta"):  # anything made without device= now lands on meta
        strict = run_all(model)
    assert set(strict) == set(plain)
    for key in plain:
        np.testing.assert_allclose(strict[key], plain[key], rtol=0, atol=1e-6, err_msg=key)


def test_meta_default_catches_a_cpu_mask() -> None:
    """The check itself: the pre-fix mask line (``torch.ones(t, t, dtype=torch.bool).triu(1)``, no device) fails
    under it, the fixed one (device of the scores) passes."""
    s = torch.randn(2, 4, 4)
    with torch.device("meta"), pytest.raises(RuntimeError, match="meta"):
        s.masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(1), float("-inf"))
    with torch.device("meta"):
        fixed = s.masked_fill(torch.ones(4, 4, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    assert fixed.device.type == "cpu" and torch.isinf(fixed[0, 0, 1])
