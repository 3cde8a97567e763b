"""Positional encodings: sinusoidal values against the formula, RoPE relative-position property."""

from __future__ import annotations

import math

import pytest
import torch

from models.blocks.positional import (
    LearnedPositions,
    RotaryEmbedding,
    SinusoidalPositions,
    apply_rope,
    rope_angles,
    rope_demo,
    sinusoidal_table,
)


def test_sinusoidal_matches_formula() -> None:
    d = 10
    table = sinusoidal_table(50, d)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)  # Vaswani et al. 2017, §3.5
            assert math.isclose(float(table[pos, 2 * i]), math.sin(angle), abs_tol=1e-6)
            assert math.isclose(float(table[pos, 2 * i + 1]), math.cos(angle), abs_tol=1e-6)


def test_sinusoidal_odd_width_and_offset() -> None:
    assert sinusoidal_table(4, 5).shape == (4, 5)
    pe = SinusoidalPositions(16, 6)
    x = torch.zeros(1, 3, 6)
    torch.testing.assert_close(pe(x, offset=2)[0], sinusoidal_table(16, 6)[2:5])
    assert "table" not in pe.state_dict()  # derived, not saved


def test_learned_positions_shape_and_limit() -> None:
    pe = LearnedPositions(8, 4)
    assert pe(torch.zeros(2, 8, 4)).shape == (2, 8, 4)
    with pytest.raises(ValueError, match="9 positions"):
        pe(torch.zeros(1, 9, 4))


def test_rope_dot_product_depends_only_on_offset() -> None:
    torch.manual_seed(0)
    d = 16
    q, k = torch.randn(d), torch.randn(d)
    angles = rope_angles(64, d)

    def dot(m: int, n: int) -> float:
        qm = apply_rope(q[None], angles[m : m + 1])[0]
        kn = apply_rope(k[None], angles[n : n + 1])[0]
        return float(qm @ kn)

    for delta in (0, 1, 5, -3):
        values = [dot(m, m - delta) for m in (10, 20, 33)]
        assert max(values) - min(values) < 1e-4, (delta, values)
    assert abs(dot(10, 10) - float(q @ k)) < 1e-4  # zero offset: plain dot product


def test_rope_preserves_norm_and_module_offset() -> None:
    torch.manual_seed(1)
    x = torch.randn(2, 3, 5, 8)  # (B, H, T, d)
    rope = RotaryEmbedding(8, max_len=32)
    y = rope(x, offset=4)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(y, apply_rope(x, rope_angles(5, 8, offset=4)))
    assert rope_angles(3, 8)[0].abs().max() == 0  # position 0 is not rotated


def test_rope_demo_turns_one_pair_and_scores_depend_on_the_offset() -> None:
    rotated, scores = rope_demo(32, 16, pair=3, seed=0)
    theta = 10000.0 ** (-6 / 16)  # θ_3 for d = 16
    pos = torch.arange(32, dtype=torch.float32)
    torch.testing.assert_close(rotated, torch.stack([torch.cos(pos * theta), torch.sin(pos * theta)], 1),
                               atol=1e-5, rtol=0)
    assert scores.shape == (32, 32)
    for offset in (0, 1, 7, -5):  # Toeplitz: every diagonal is constant
        diag = torch.diagonal(scores, offset)
        torch.testing.assert_close(diag, diag[:1].expand_as(diag), atol=1e-4, rtol=0)
    torch.testing.assert_close(rope_demo(32, 16, pair=3, seed=0)[1], scores)  # seeded
    with pytest.raises(ValueError, match="pair"):
        rope_demo(8, 16, pair=8)
