"""TextClassifier: fused vs explicit, pooling, padding, classify() result."""

from __future__ import annotations

import pytest
import torch

from models.families.classifier import ClassifierConfig, TextClassifier

torch.set_num_threads(1)


def make(pooling: str = "cls", positions: str = "learned", norm_first: bool = True) -> TextClassifier:
    torch.manual_seed(0)
    cfg = ClassifierConfig(vocab_size=50, n_classes=3, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                           dropout=0.0, pooling=pooling, positions=positions, norm_first=norm_first)
    return TextClassifier(cfg).eval()


@pytest.mark.parametrize("pooling,positions,norm_first",
                         [("cls", "learned", True), ("mean", "sinusoidal", True), ("cls", "sinusoidal", False)])
def test_explicit_equals_fused(pooling: str, positions: str, norm_first: bool) -> None:
    model = make(pooling, positions, norm_first)
    ids = torch.tensor([[1, 5, 6, 7, 8, 2], [1, 9, 10, 2, 0, 0]])
    fused = model(ids)
    explicit, attn = model.forward_with_attention(ids)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=0)
    attn = attn.detach()
    assert attn.shape == (2, 2, 4, 6, 6)
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 2, 4, 6))
    assert float(attn[1, ..., 4:].abs().max()) == 0.0  # padding keys get nothing


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_padding_does_not_change_logits(pooling: str) -> None:
    model = make(pooling)
    short = model(torch.tensor([[1, 9, 10, 2]]))
    padded = model(torch.tensor([[1, 9, 10, 2, 0, 0, 0]]))
    torch.testing.assert_close(short, padded, atol=1e-5, rtol=0)
    explicit_pad = torch.tensor([[False] * 4 + [True] * 3])
    torch.testing.assert_close(model(torch.tensor([[1, 9, 10, 2, 7, 7, 7]]), explicit_pad), short,
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_classify_says_how_the_model_pools(pooling: str) -> None:
    assert make(pooling=pooling).classify([1, 5, 6, 2]).pooling == pooling


def test_classify_ids() -> None:
    model = make()
    model.labels = ["world", "sports", "business"]
    res = model.classify([1, 5, 6, 2])
    assert res.tokens == ["1", "5", "6", "2"] and res.labels == ["world", "sports", "business"]
    assert res.probs.shape == (3,) and abs(float(res.probs.sum()) - 1) < 1e-5
    assert res.attention["encoder"].weights.shape == (2, 4, 4, 4)
    with pytest.raises(ValueError, match="tokenizer"):
        model.classify("no tokenizer here")


def test_bad_config_values() -> None:
    with pytest.raises(ValueError, match="pooling"):
        TextClassifier(ClassifierConfig(pooling="max"))


def test_long_input_is_capped_with_notice() -> None:
    model = make()
    res = model.classify([1] + [5] * 300 + [2])
    assert len(res.tokens) == model.config.max_len and "truncated" in res.notice
