"""Position information for Transformers: sinusoidal, learned and rotary (RoPE).

- Sinusoidal (Vaswani et al. 2017, §3.5): PE(pos, 2i) = sin(pos / 10000^(2i/d)),
  PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), added to the token embeddings.
- Learned (BERT, ViT): one trainable vector per position, added to the embeddings.
- Rotary (Su et al. 2021, RoFormer eq. 34): rotate each pair (x_{2i}, x_{2i+1}) of q and k by the angle
  pos · θ_i with θ_i = base^(-2i/d), so that q_m · k_n depends only on m − n.

The Swin relative position bias (table and index) lives in ``models.families.swin``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def sinusoidal_table(n_positions: int, d_model: int, base: float = 10000.0, layout: str = "interleaved") -> Tensor:
    """The (n_positions, d_model) sinusoidal table of Vaswani et al. (2017), §3.5. ``layout`` "interleaved" puts
    sin and cos of angle i at columns 2i and 2i+1 (the paper); "half" puts every sin first, then every cos
    (Marian / fairseq's table: columns i and i + ceil(d/2))."""
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]  # (N, 1)
    i2 = torch.arange(0, d_model, 2, dtype=torch.float64)  # 2i
    angle = pos / base ** (i2 / d_model)  # (N, ceil(d/2))
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    if layout == "half":
        half = angle.size(1)
        table[:, :half] = torch.sin(angle)
        table[:, half:] = torch.cos(angle[:, : d_model - half])
        return table.float()
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


class SinusoidalPositions(nn.Module):
    """Adds the fixed sinusoidal table; ``offset`` shifts positions (incremental decoding)."""

    def __init__(self, max_len: int, d_model: int, layout: str = "interleaved") -> None:
        super().__init__()
        # derived, not learned: a non-persistent buffer stays out of the checkpoint
        self.register_buffer("table", sinusoidal_table(max_len, d_model, layout=layout), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:  # x: (B, T, D)
        t = x.size(1)
        if offset + t > self.table.size(0):
            raise ValueError(f"sequence of {offset + t} positions exceeds the {self.table.size(0)} supported")
        return x + self.table[offset : offset + t].to(x.dtype)


class LearnedPositions(nn.Module):
    """One trainable vector per position (BERT, ViT), added to the embeddings."""

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=0.02)  # as in BERT / ViT

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:  # x: (B, T, D)
        t = x.size(1)
        if offset + t > self.embedding.num_embeddings:
            raise ValueError(
                f"sequence of {offset + t} positions exceeds the {self.embedding.num_embeddings} supported"
            )
        pos = torch.arange(offset, offset + t, device=x.device)
        return x + self.embedding(pos)


def rope_angles(n_positions: int, d_head: int, base: float = 10000.0, offset: int = 0) -> Tensor:
    """Rotation angles pos · θ_i, θ_i = base^(-2i/d) (RoFormer eq. 15): (n_positions, d_head // 2).

    Useful on its own for plots of how each pair of dimensions turns with position.
    """
    if d_head % 2:
        raise ValueError(f"RoPE needs an even head dimension, got {d_head}")
    theta = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)  # (d/2,)
    pos = torch.arange(offset, offset + n_positions, dtype=torch.float64)
    return (pos[:, None] * theta[None, :]).float()


def mrope_angles(positions: Tensor, d_head: int, base: float, sections: tuple[int, ...]) -> Tensor:
    """M-RoPE's angles (Qwen2-VL, Wang et al. 2024, §2.1): positions (3, T), a token's temporal, height and width ids
    (a text token: its one position three times, which is plain RoPE) -> (T, d_head // 2). Frequency pair i belongs
    to section k of ``sections`` (sizes in order, summing to d_head / 2) and turns by position ids[k mod 3] · θ_i,
    θ_i = base^(-2i/d) (transformers' ``mrope_section`` split, computed in float32 as it does)."""
    theta = 1.0 / (base ** (torch.arange(0, d_head, 2, dtype=torch.int64).float() / d_head))  # (d/2,)
    axis = torch.cat([torch.full((n,), k % 3, dtype=torch.long) for k, n in enumerate(sections)]).to(positions.device)
    pos = positions.float()[axis]  # (d/2, T): each pair's own position id row
    return pos.transpose(0, 1) * theta.to(positions.device)[None, :]


ROPE_LAYOUTS = ("interleaved", "half")


def apply_rope(x: Tensor, angles: Tensor | None, layout: str = "interleaved",
               cos_sin: tuple[Tensor, Tensor] | None = None, rotary_dim: int = 0) -> Tensor:
    """Rotate pairs of the last axis of x (..., T, d) by ``angles`` (T, r/2), the one RoPE of the project.

    ``layout`` pairs (x_{2i}, x_{2i+1}) ("interleaved", RoFormer eq. 34, this project's models) or (x_i, x_{i+r/2})
    ("half", the rotate-half layout of Hugging Face's LLaMA weights). ``rotary_dim`` r: only the first r dimensions
    rotate and the rest pass as they are (partial rotary: GPT-NeoX, Phi-3's partial_rotary_factor); 0 or d: all of
    them. Returns the rotated x, same shape and dtype.
    """
    if 0 < rotary_dim < x.size(-1):
        return torch.cat((apply_rope(x[..., :rotary_dim], angles, layout, cos_sin), x[..., rotary_dim:]), dim=-1)
    # cos_sin: (cos, sin) of ``angles`` already in x's dtype, made once for many calls (models/decoding/ondevice.py)
    if cos_sin is None:
        assert angles is not None
        cos_sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    cos, sin = cos_sin  # (T, d/2)
    if layout == "interleaved":
        x1, x2 = x[..., 0::2], x[..., 1::2]  # (..., T, d/2)
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)  # (..., T, d/2, 2) -> d
    if layout != "half":
        raise ValueError(f"RoPE layout must be one of {ROPE_LAYOUTS}, got {layout!r}")
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def rope_demo(n_positions: int, d_model: int, pair: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """The two RoPE pictures of the positional-encoding tab.

    ``rotated`` (P, 2): the same unit vector e_{2·pair} placed at every position and rotated by RoPE, its
    coordinates in dimension pair ``pair`` (a point turning on the unit circle at rate θ_pair).
    ``scores`` (P, P): q·k for one random q and k (``seed``) rotated at every pair of positions; each
    entry depends only on the offset between the two (RoFormer §3.4.2), so the matrix is Toeplitz.
    """
    if not 0 <= pair < d_model // 2:
        raise ValueError(f"dimension pair {pair} is outside 0..{d_model // 2 - 1}")
    angles = rope_angles(n_positions, d_model)  # (P, d/2)
    unit = torch.zeros(n_positions, d_model)
    unit[:, 2 * pair] = 1.0
    rotated = apply_rope(unit, angles)[:, 2 * pair : 2 * pair + 2]
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(d_model, generator=g), torch.randn(d_model, generator=g)
    scores = apply_rope(q.expand(n_positions, -1), angles) @ apply_rope(k.expand(n_positions, -1), angles).T
    return rotated, scores


class RotaryEmbedding(nn.Module):
    """RoPE as an option of ``MultiHeadAttention``: ``rope(x, offset)`` rotates q or k of shape (B, H, T, d).

    ``offset`` is the absolute position of the first of the T rows (the cache length when decoding).
    """

    def __init__(self, d_head: int, max_len: int = 2048, base: float = 10000.0) -> None:
        super().__init__()
        self.d_head, self.base = d_head, base
        self.register_buffer("angles", rope_angles(max_len, d_head, base), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        t = x.size(-2)
        if offset + t > self.angles.size(0):
            n = self.angles.size(0)
            raise ValueError(f"sequence of {offset + t} positions exceeds the {n} supported")
        return apply_rope(x, self.angles[offset : offset + t])
