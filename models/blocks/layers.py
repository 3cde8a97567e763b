"""The layers the text families share: the Transformer's position-wise feed-forward block and encoder layer
(Vaswani et al. 2017, §3.1-3.3; pre- or post-norm), and how a batch of inputs is split into runs of similar
length (docs/ARCHITECTURE.md §9). The translator and the from-scratch classifier build on these, so neither
family imports the other."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from models.blocks.attention import LayerEdit, MultiHeadAttention

# The feed-forward activation by name: ReLU (eq. 2), SiLU = swish (Marian's opus-mt), exact GELU.
ACTIVATIONS = {"relu": nn.ReLU, "swish": nn.SiLU, "silu": nn.SiLU, "gelu": nn.GELU}


class FeedForward(nn.Sequential):
    """FFN(x) = max(0, xW1 + b1)W2 + b2 (eq. 2); ``activation`` swaps the ReLU (the parameter names stay)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str = "relu") -> None:
        super().__init__(nn.Linear(d_model, d_ff), ACTIVATIONS[activation](), nn.Dropout(dropout),
                         nn.Linear(d_ff, d_model))


class EncoderLayer(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, norm_first: bool = True,
                 activation: str = "relu") -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.ff = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor | None = None, need_weights: bool = False,
                rope: nn.Module | None = None, edit: LayerEdit | None = None) -> tuple[Tensor, Tensor | None]:
        """x: (B, S, D); mask: (B, 1, 1, S) or broadcastable; edit: the attention's part of an intervention
        (models/blocks/attention.py). Returns (x, weights (B, H, S, S) or None)."""
        if self.norm_first:
            a, w = self.self_attn(self.norm1(x), mask=mask, need_weights=need_weights, rope=rope, edit=edit)
            x = x + self.drop(a)
            return x + self.drop(self.ff(self.norm2(x))), w
        a, w = self.self_attn(x, mask=mask, need_weights=need_weights, rope=rope, edit=edit)
        x = self.norm1(x + self.drop(a))
        return self.norm2(x + self.drop(self.ff(x))), w


# Padded cells one forward pass may hold, rows × longest² (the (B, L, H, N, N) attention grows with it): 32 inputs of
# 128 tokens. A batch over it is split into runs of similar length (docs/ARCHITECTURE.md §9).
BATCH_CELLS = 32 * 128 * 128


def length_runs(lengths: Sequence[int], cells: int = BATCH_CELLS) -> list[list[int]]:
    """Indices of ``lengths`` grouped for batched runs: sorted by length (little padding), each run holding at most
    ``cells`` padded cells (rows × its longest²; a single input always makes a run)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    runs: list[list[int]] = []
    for i in order:
        if runs and (len(runs[-1]) + 1) * max(lengths[i], 1) ** 2 <= cells:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs
