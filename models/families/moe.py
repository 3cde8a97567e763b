"""Sparse mixture-of-experts feed-forward block (Shazeer et al. 2017; Mixtral: Jiang et al. 2024, §2.1).

In place of one SwiGLU feed-forward block a layer holds ``n_experts`` of them and a router, a linear map
(D -> n_experts). For each token x the router's logits are softmaxed, the ``k`` most probable experts are kept and
their probabilities renormalised to sum to 1 (Mixtral's top-2 routing), and the block returns

    y = Σ_{e ∈ top-k(x)} w_e(x) · E_e(x),    w = softmax over the kept logits,

so each token pays for k experts, whatever n_experts is. ``route`` gives the choice itself (experts and weights per
token), which the experts view reads (``expert_routes``: every layer of a ``models.families.gpt.GPT`` with experts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn


class Expert(nn.Module):
    """One expert: the family's gated feed-forward, W_down (act(W_gate x) ⊙ W_up x)."""

    def __init__(self, d_model: int, d_ff: int, act: Any) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)
        self.act = act

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.act(self.gate(x)) * self.up(x))


class MixtureOfExperts(nn.Module):
    """Router + experts; x (B, T, D) -> (B, T, D)."""

    def __init__(self, c: Any, act: Any) -> None:
        """c: the GPTConfig (d_model, ff_width, n_experts, experts_per_token); act: the experts' gate activation."""
        super().__init__()
        self.k = c.experts_per_token
        self.router = nn.Linear(c.d_model, c.n_experts, bias=False)
        self.experts = nn.ModuleList(Expert(c.d_model, c.ff_width, act) for _ in range(c.n_experts))

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(router logits (…, E), chosen experts (…, k) most probable first, their weights (…, k) summing to 1)."""
        logits = self.router(x)
        probs = torch.softmax(logits.float(), -1)
        top, chosen = torch.topk(probs, self.k, dim=-1)
        return logits, chosen, (top / top.sum(-1, keepdim=True)).to(x.dtype)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        rows = x.reshape(-1, shape[-1])  # (N, D)
        _, chosen, weights = self.route(rows)  # (N, k) each
        out = torch.zeros_like(rows)
        for e in chosen.unique().tolist():  # each expert runs once, on the tokens that chose it
            token, slot = torch.where(chosen == e)
            out.index_add_(0, token, self.experts[e](rows[token]) * weights[token, slot, None])
        return out.view(shape)


@dataclass
class ExpertRoutes:
    """For one input: each layer's chosen experts and their weights per token (the experts view)."""

    tokens: list[str]
    experts: np.ndarray  # (L, T, k) int: expert ids, the most weighted first
    weights: np.ndarray  # (L, T, k) float32: their routing weights, summing to 1 over k
    logits: np.ndarray  # (L, T, E) float32: the router's logits
    n_experts: int

    def load(self) -> np.ndarray:
        """(L, E): the share of the input's tokens each expert served, per layer (each token counted k times / k)."""
        out = np.zeros((self.experts.shape[0], self.n_experts), np.float32)
        for layer in range(out.shape[0]):
            np.add.at(out[layer], self.experts[layer].ravel(), 1.0 / self.experts[layer].size)
        return out


@torch.no_grad()
def expert_routes(model: Any, ids: Sequence[int]) -> ExpertRoutes:
    """Which experts every layer of ``model`` (a GPT with ``n_experts``) chose for each token of ``ids``, and how
    much each weighed: the router of layer l reads the stream after layer l's attention, normed (``Block``'s own
    order), exactly what its forward pass routes."""
    c = model.config
    if not any(b.ff == "experts" for b in model.spec.blocks):
        raise ValueError("this model has no mixture-of-experts layers (one feed-forward block per layer)")
    device = model.embed.weight.device
    x_ids = torch.tensor([list(ids)], device=device)
    hidden = model(x_ids, keep_hidden=True).hidden  # the stream entering each block
    t = x_ids.size(1)
    captured = []
    for i, block in enumerate(model.blocks):  # Block.forward's own steps, up to the router (no hooks, no state)
        angles = None
        if model.positions is None:
            angles = (model.angles_local if block.spec.local_rope else model.angles)[:t]
        a, _ = block.attn(block.norm1(hidden[i]), angles, None, False, None)
        captured.append(block.ff.route(block.ff_input(hidden[i], block.attn_output(a))[0]))
    logits, chosen, weights = (torch.stack([r[i] for r in captured]) for i in range(3))
    return ExpertRoutes([model.piece(i) for i in ids], chosen.cpu().numpy(), weights.float().cpu().numpy(),
                        logits.float().cpu().numpy(), c.n_experts)
