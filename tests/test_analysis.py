"""models.analysis against hand-computed tiny cases."""

from __future__ import annotations

import numpy as np
import pytest

from models.analysis import (
    duplicate_token_score,
    first_token_share,
    head_entropy,
    head_roles,
    induction_score,
    mean_attention_distance,
    patch_distances,
    pooled_rollout,
    previous_token_score,
    rollout,
    window_attention_distance,
)


def test_rollout_hand_computed() -> None:
    a1 = np.array([[1.0, 0.0], [0.5, 0.5]])
    a2 = np.array([[0.0, 1.0], [0.0, 1.0]])
    w = np.stack([np.stack([a1, a1]), np.stack([a2, a2])])  # (L=2, H=2, 2, 2)
    # Ã = 0.5 A + 0.5 I (rows already sum to 1): Ã1 = [[1, 0], [.25, .75]], Ã2 = [[.5, .5], [0, 1]]
    r = rollout(w)
    np.testing.assert_allclose(r[0], [[1.0, 0.0], [0.25, 0.75]], atol=1e-6)
    np.testing.assert_allclose(r[1], [[0.625, 0.375], [0.25, 0.75]], atol=1e-6)  # Ã2 · Ã1
    np.testing.assert_allclose(r.sum(-1), 1.0, atol=1e-6)


def test_rollout_head_fusion_and_discard() -> None:
    h1 = np.array([[0.9, 0.1, 0.0], [0.2, 0.3, 0.5], [0.1, 0.1, 0.8]])
    h2 = np.array([[0.1, 0.2, 0.7], [0.6, 0.2, 0.2], [0.3, 0.3, 0.4]])
    w = np.stack([h1, h2])[None]  # (1, 2, 3, 3)
    mx = np.maximum(h1, h2)
    expected = 0.5 * mx + 0.5 * np.eye(3)
    np.testing.assert_allclose(rollout(w, "max")[0], expected / expected.sum(-1, keepdims=True), atol=1e-6)
    # discard the smallest third of each row (keeping the diagonal), then residual and renormalise
    mean = (h1 + h2) / 2
    kept = mean.copy()
    for i, row in enumerate(mean):
        j = int(np.argmin(row))
        if j != i:
            kept[i, j] = 0.0
    expected = 0.5 * kept + 0.5 * np.eye(3)
    np.testing.assert_allclose(rollout(w, discard_ratio=0.34)[0], expected / expected.sum(-1, keepdims=True),
                               atol=1e-6)
    with pytest.raises(ValueError):
        rollout(w, "median")


def test_entropy() -> None:
    w = np.zeros((1, 2, 2, 4))
    w[0, 0] = 0.25  # uniform over 4 keys
    w[0, 1, :, 0] = 1.0  # one-hot
    ent = head_entropy(w)
    np.testing.assert_allclose(ent, [[np.log(4), 0.0]], atol=1e-6)
    np.testing.assert_allclose(head_entropy(w, normalize=True)[0, 0], 1.0, atol=1e-6)


def test_mean_attention_distance_tokens_and_pixels() -> None:
    w = np.zeros((1, 1, 3, 3))
    w[0, 0, 0, 2] = 1.0  # distance 2
    w[0, 0, 1, 1] = 1.0  # 0
    w[0, 0, 2, [0, 2]] = 0.5  # 1
    np.testing.assert_allclose(mean_attention_distance(w), [[1.0]], atol=1e-6)
    # 2×2 grid of 16-pixel patches after a CLS token
    w = np.zeros((1, 1, 5, 5))
    w[0, 0, :, 0] = 0.5  # half of every row to CLS: dropped and renormalised
    w[0, 0, 1:, 4] = 0.5  # patches attend to the bottom-right patch (r1c1)
    d = mean_attention_distance(w, grid=(2, 2), patch=16, skip=1)
    np.testing.assert_allclose(d, [[(16 * np.sqrt(2) + 16 + 16 + 0) / 4]], atol=1e-5)
    assert patch_distances((1, 3), 2.0)[0, 2] == 4.0


def test_pooled_rollout_reads_what_the_head_reads() -> None:
    a1 = np.array([[1.0, 0.0], [0.5, 0.5]])
    a2 = np.array([[0.0, 1.0], [0.0, 1.0]])
    w = np.stack([np.stack([a1, a1]), np.stack([a2, a2])])
    # last rollout (hand-computed above): [[0.625, 0.375], [0.25, 0.75]]
    np.testing.assert_allclose(pooled_rollout(w, "cls"), [0.625, 0.375], atol=1e-6)
    np.testing.assert_allclose(pooled_rollout(w, "mean"), [0.4375, 0.5625], atol=1e-6)
    with pytest.raises(ValueError, match="pooling"):
        pooled_rollout(w, "max")


def test_window_attention_distance_pads_blocks_with_fewer_heads() -> None:
    n = 4  # 2×2 windows: each token's neighbours lie 1 or √2 tokens away
    to_first = np.zeros((3, 2, n, n))
    to_first[..., 0] = 1.0  # every query attends to the window's first token
    self_only = np.broadcast_to(np.eye(n), (1, 3, n, n))
    dist = window_attention_distance([(to_first, 2, 4.0), (self_only, 2, 8.0)])
    assert dist.shape == (2, 3) and dist.dtype == np.float32
    # distances to token (0, 0) from (0, 0), (0, 1), (1, 0), (1, 1): 0, 1, 1, √2 tokens of 4 pixels
    np.testing.assert_allclose(dist[0, :2], 4.0 * (0 + 1 + 1 + np.sqrt(2)) / 4, atol=1e-5)
    assert np.isnan(dist[0, 2])
    np.testing.assert_allclose(dist[1], 0.0, atol=1e-6)


def test_head_roles_on_hand_built_patterns() -> None:
    n = 5
    t = 2 * n + 1  # BOS + n tokens + the same n again
    prev = np.zeros((t, t))
    prev[0, 0] = 1
    prev[np.arange(1, t), np.arange(t - 1)] = 1  # every token looks at the one before it
    induction = np.zeros((t, t))
    induction[:, 0] = 1
    for i in range(n + 1, t):  # the second copy looks at what followed the earlier occurrence
        induction[i] = 0
        induction[i, i - n + 1] = 1
    duplicate = np.zeros((t, t))
    duplicate[:, 0] = 1
    for i in range(n + 1, t):
        duplicate[i] = 0
        duplicate[i, i - n] = 1
    uniform = np.full((t, t), 1 / t)
    w = np.stack([np.stack([prev, induction, duplicate, uniform])])  # (L=1, H=4, T, T)
    # query 1's only earlier token is token 0: the patterns parked on token 0 score there once in 10 queries
    np.testing.assert_allclose(previous_token_score(w)[0], [1, 0.1, 0.1, 1 / t], atol=1e-6)
    np.testing.assert_allclose(induction_score(w, n)[0], [0, 1, 0, 1 / t], atol=1e-6)
    np.testing.assert_allclose(duplicate_token_score(w, n)[0], [0, 0, 1, 1 / t], atol=1e-6)
    # the induction and duplicate patterns park their first copy on token 0: 5 of the 10 queries; the
    # previous-token head's query 1 looks at token 0 too
    np.testing.assert_allclose(first_token_share(w)[0], [0.1, 0.5, 0.5, 1 / t], atol=1e-6)
    with pytest.raises(ValueError, match="2·n"):
        induction_score(w, n + 1)
    # all four at once, as the app, training and bench/lm_heads.py read them
    roles = head_roles(w, n)
    assert list(roles) == ["previous", "induction", "duplicate", "sink"]
    np.testing.assert_allclose(np.stack([roles[k][0] for k in roles]).diagonal(), [1, 1, 1, 1 / t], atol=1e-6)
