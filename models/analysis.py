"""Attention statistics: numpy arrays in, numpy arrays out (no torch, usable from viz/ and notebooks).

Shapes follow the result containers: weights (L, H, Q, K), rows summing to 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

HEAD_FUSIONS = ("mean", "max", "min")


def rollout(weights: np.ndarray, head_fusion: str = "mean", discard_ratio: float = 0.0,
            residual: bool = True) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema 2020, §3): cumulative token-to-token attention per layer.

    weights: (L, H, N, N) self-attention. Per layer the heads are fused (mean, or max/min as in
    vit-explain), optionally the smallest ``discard_ratio`` share of each row is zeroed (keeping the
    diagonal), the residual connection is modelled as Ã = 0.5·A + 0.5·I, rows are renormalised, and
    the layers are multiplied: R_l = Ã_l · R_{l−1}, R_0 = Ã_0.
    Returns (L, N, N): R_l for every layer l (the last one is the usual rollout); rows sum to 1.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 4 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"rollout needs self-attention (L, H, N, N), got {w.shape}")
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}")
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    n = w.shape[-1]
    fused = getattr(w, head_fusion)(axis=1)  # (L, N, N)
    eye = np.eye(n)
    if discard_ratio > 0:
        drop = int(n * discard_ratio)
        if drop:
            order = np.argsort(fused, axis=-1)[..., :drop]  # smallest entries of each row
            cut = np.zeros_like(fused, dtype=bool)
            np.put_along_axis(cut, order, True, axis=-1)
            fused = np.where(cut & (eye == 0), 0.0, fused)
    a = 0.5 * fused + 0.5 * eye if residual else fused
    a = a / np.maximum(a.sum(-1, keepdims=True), 1e-12)
    out = np.empty_like(a)
    acc = eye
    for layer in range(a.shape[0]):
        acc = a[layer] @ acc
        out[layer] = acc
    return out.astype(np.float32)


def head_entropy(weights: np.ndarray, normalize: bool = False) -> np.ndarray:
    """Mean over queries of the attention entropy −Σ_k p log p (nats) per layer and head: (L, H).

    With ``normalize`` each row is divided by log(number of keys it can see), so 1 = uniform.
    Low entropy: a focused head; high: a head that averages (Clark et al. 2019, §3).
    """
    p = np.asarray(weights, dtype=np.float64)
    ent = -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)  # (L, H, Q)
    if normalize:
        support = np.maximum((p > 0).sum(-1), 2)
        ent = ent / np.log(support)
    return ent.mean(-1).astype(np.float32)


def token_distances(n_queries: int, n_keys: int | None = None) -> np.ndarray:
    """|i − j| in tokens: (Q, K)."""
    n_keys = n_queries if n_keys is None else n_keys
    return np.abs(np.arange(n_queries)[:, None] - np.arange(n_keys)[None, :]).astype(np.float64)


def patch_distances(grid: tuple[int, int], patch: float) -> np.ndarray:
    """Euclidean distance in pixels between patch centres on a (rows, cols) grid: (P, P), P = rows·cols."""
    rows, cols = grid
    r, c = np.divmod(np.arange(rows * cols), cols)
    dr, dc = r[:, None] - r[None, :], c[:, None] - c[None, :]
    return np.hypot(dr, dc) * float(patch)


def mean_attention_distance(weights: np.ndarray, grid: tuple[int, int] | None = None,
                            patch: float = 1.0, skip: int = 0) -> np.ndarray:
    """Attention-weighted mean distance per layer and head: (L, H).

    Text (grid None): distance |i − j| in tokens. Images: pixel distance between patch centres, as in
    the ViT paper (Dosovitskiy et al. 2021, Fig. 7 and App. D.7). ``skip`` leading tokens (a ViT's prefix tokens,
    ``ImageResult.prefix_tokens``: [CLS] and any more) are dropped as queries and keys and each row is
    renormalised over the remaining keys.
    """
    w = np.asarray(weights, dtype=np.float64)[..., skip:, skip:]  # (L, H, Q', K')
    w = w / np.maximum(w.sum(-1, keepdims=True), 1e-12)
    q, k = w.shape[-2:]
    if grid is None:
        d = token_distances(q, k)
    else:
        d = patch_distances(grid, patch)
        if d.shape != (q, k):
            raise ValueError(f"grid {grid} gives {d.shape[0]} patches, attention has {q}×{k} after skip={skip}")
    return (w * d).sum(-1).mean(-1).astype(np.float32)


POOLINGS = ("cls", "mean")


def pooled_rollout(weights: np.ndarray, pooling: str) -> np.ndarray:
    """What a classifier head reads, traced back to the input tokens through every layer: (N,), sums to 1.

    The last layer's rollout R (N, N) says how much each output position draws on each input token; a
    head on position 0 ([CLS], ``pooling="cls"``) reads row 0, a head on the mean of every position
    (``pooling="mean"``, as sentence-transformers' MiniLM and the project's classifiers) reads the mean
    of the rows.
    """
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    last = rollout(weights)[-1]
    return last[0] if pooling == "cls" else last.mean(0)


def window_attention_distance(blocks: Sequence[tuple]) -> np.ndarray:
    """Mean attention distance inside the windows of each Swin block: (blocks, max heads), NaN-padded.

    blocks: per block ``(weights (windows, heads, N, N), window side in tokens, pixels per token)``, optionally with a
    fourth item, ``(windows, N)`` bool: which cells of each window are tokens of the grid (``WindowAttention.
    image_cells``); cells that are padding up to whole windows (zeros, not image) are then dropped as queries and keys
    and each row renormalised over the remaining keys, as ``mean_attention_distance`` drops prefix tokens. Distances
    are in pixels of the image the model saw, averaged over every (image) query of the block, so blocks of later
    stages (fewer, larger tokens) are on the same scale as the first.
    """
    rows = []
    for block in blocks:
        w, side, patch = np.asarray(block[0], dtype=np.float64), int(block[1]), float(block[2])
        cells = np.ones((w.shape[0], w.shape[-1]), dtype=bool) if len(block) < 4 else np.asarray(block[3], dtype=bool)
        w = np.where(cells[:, None, None, :], w, 0.0)  # (windows, heads, N, N): padding keys out
        w = w / np.maximum(w.sum(-1, keepdims=True), 1e-12)
        per_query = (w * patch_distances((side, side), patch)).sum(-1)  # (windows, heads, N)
        queries = cells[:, None, :]
        rows.append(((per_query * queries).sum((0, 2)) / np.maximum(queries.sum((0, 2)), 1)).astype(np.float32))
    out = np.full((len(rows), max((len(r) for r in rows), default=0)), np.nan, dtype=np.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


# ----------------------------------------------------------------------------------------------------
# Head roles of a causal LM (Olsson et al. 2022; Wang et al. 2023; Xiao et al. 2023). weights: (L, H, T, T).


def previous_token_score(weights: np.ndarray) -> np.ndarray:
    """Mean attention from token i to token i−1, over i ≥ 1: (L, H); 1 for a pure previous-token head."""
    w = np.asarray(weights, dtype=np.float64)
    i = np.arange(1, w.shape[-1])
    return w[..., i, i - 1].mean(-1).astype(np.float32)


def _second_copy(weights: np.ndarray, n: int, offset: int) -> np.ndarray:
    """Mean over the queries i of the second copy of ``BOS x_1..x_n x_1..x_n`` of the weight on key i − offset."""
    w = np.asarray(weights, dtype=np.float64)
    if w.shape[-1] < 2 * n + 1 or n < 2:
        raise ValueError(f"need BOS + 2·n tokens with n >= 2 (n={n}), got {w.shape[-1]}")
    i = np.arange(n + 1, 2 * n + 1)  # positions of the second copy
    return w[..., i, i - offset].mean(-1).astype(np.float32)


def induction_score(weights: np.ndarray, n: int) -> np.ndarray:
    """On BOS + n tokens repeated twice: mean attention from each token of the second copy to the token
    that followed its earlier occurrence, i → i − n + 1 (Olsson et al. 2022): (L, H)."""
    return _second_copy(weights, n, n - 1)


def duplicate_token_score(weights: np.ndarray, n: int) -> np.ndarray:
    """On BOS + n tokens repeated twice: mean attention from each token of the second copy to its own
    earlier occurrence, i → i − n (a duplicate-token head, Wang et al. 2023): (L, H)."""
    return _second_copy(weights, n, n)


def first_token_share(weights: np.ndarray) -> np.ndarray:
    """Mean attention to token 0 over the queries i ≥ 1: the "attention sink" (Xiao et al. 2023): (L, H)."""
    w = np.asarray(weights, dtype=np.float64)
    return w[..., 1:, 0].mean(-1).astype(np.float32)


HEAD_ROLES = ("previous", "induction", "duplicate", "sink")


def head_roles(weights: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """Every head-role score of a causal LM's attention (L, H, T, T) on BOS + n tokens repeated twice
    (``GPT.repeated_tokens``): ``HEAD_ROLES`` -> (L, H): previous token, induction, duplicate token, first-token
    sink. The one place these are computed; ``GPT.head_role_scores`` averages them over seeds (training,
    ``bench/lm_heads.py``)."""
    return {"previous": previous_token_score(weights), "induction": induction_score(weights, n),
            "duplicate": duplicate_token_score(weights, n), "sink": first_token_share(weights)}


def align_tokens(a: Sequence[str], b: Sequence[str]) -> list[tuple[int, int]]:
    """Index pairs (i, j) with a[i] == b[j] along the longest matching blocks of two token sequences (difflib's
    Ratcliff/Obershelp matching), in order: the tokens two inputs share, for a difference of their attention."""
    from difflib import SequenceMatcher

    blocks = SequenceMatcher(a=list(a), b=list(b), autojunk=False).get_matching_blocks()
    return [(m.a + k, m.b + k) for m in blocks for k in range(m.size)]
