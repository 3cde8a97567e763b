"""The layers the text families share: the Transformer's position-wise feed-forward block and encoder layer
(Vaswani et al. 2017, §3.1-3.3; pre- or post-norm), and how a batch of inputs is split into runs of similar
length (docs/ARCHITECTURE.md §9). The translator and the from-scratch classifier build on these, so neither
family imports the other."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.blocks.attention import LayerEdit, MultiHeadAttention


def _gelu_tanh(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


def _quick_gelu(x: Tensor) -> Tensor:
    return x * torch.sigmoid(1.702 * x)


# The one table of activations, by the names configs use (transformers' ACT2FN names included): ReLU (Vaswani et al.
# 2017, eq. 2), SiLU = swish (SwiGLU, Marian's opus-mt), exact GELU (BERT, ViT, GPT-NeoX), GELU's tanh approximation
# (GPT-2's gelu_new, Gemma's gelu_pytorch_tanh; "gelu_tanh" in the project's configs), tanh (BERT's pooler), CLIP's
# quick GELU x·σ(1.702x) (Radford et al. 2021's towers, LLaVA's CLIP).
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu, "silu": F.silu, "swish": F.silu, "gelu": F.gelu, "gelu_tanh": _gelu_tanh, "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh, "tanh": torch.tanh, "quick_gelu": _quick_gelu}


class Activation(nn.Module):
    """An ``ACTIVATIONS`` entry as a module (no parameters: state dicts keep their names)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        if name not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}, got {name!r}")
        self.name, self.fn = name, ACTIVATIONS[name]

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x)

    def extra_repr(self) -> str:
        return self.name


class FeedForward(nn.Sequential):
    """FFN(x) = max(0, xW1 + b1)W2 + b2 (eq. 2); ``activation`` swaps the ReLU (the parameter names stay)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str = "relu") -> None:
        super().__init__(nn.Linear(d_model, d_ff), Activation(activation), nn.Dropout(dropout),
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
