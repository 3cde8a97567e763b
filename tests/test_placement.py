"""ATLAS_DTYPE (models/io/placement.py): weights in bfloat16 while scores, softmax, attention and the score split stay
float32 or wider; the split still sums to the score and reproduces the bfloat16 model's own attention row."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.families.gpt import GPT, GPTConfig
from models.inspect.decompose import decompose_score
from models.io.placement import place, run_dtype


def test_run_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATLAS_DTYPE", raising=False)
    assert run_dtype("cpu") == torch.float32 and run_dtype("cuda:1") == torch.bfloat16
    monkeypatch.setenv("ATLAS_DTYPE", "bfloat16")
    assert run_dtype("cpu") == torch.bfloat16
    monkeypatch.setenv("ATLAS_DTYPE", "int8")
    with pytest.raises(ValueError, match="ATLAS_DTYPE must be one of"):
        run_dtype("cpu")


def _gpt() -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, max_len=64, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2,
                          qkv_bias=True)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return model


def test_bfloat16_weights_float32_scores_and_split() -> None:
    model = place(_gpt(), "cpu", torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert model.angles.dtype == torch.float32  # RoPE angles stay float32 (a buffer)
    ids = list(range(3, 30))
    with torch.no_grad():
        out = model(torch.tensor([ids]), need_weights=True)
    assert all(w.dtype == torch.float32 for w in out.attention)  # the scores and softmax ran in float32
    for layer, head, query, key in ((0, 1, 20, 3), (2, 3, 26, 25), (1, 0, 13, 0)):
        split = decompose_score(model, ids, layer, head, query, key)
        # the split's terms sum to the score within 1e-3 relative (float64 walk over the bfloat16 weights)
        assert abs(split.table.sum() - split.score) <= 1e-3 * abs(split.score)
        # and the walk's softmax row is the attention the bfloat16 model itself computed
        np.testing.assert_allclose(split.softmax_row, out.attention[layer][0, head, query].numpy(), atol=2e-2)
