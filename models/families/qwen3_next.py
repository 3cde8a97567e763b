"""Qwen3-Next: a hybrid decoder whose layers are either Gated DeltaNet (linear attention, Yang, Kautz & Hatamizadeh
2025, "Gated Delta Networks") or gated softmax attention, with a mixture of experts and a shared expert as the
feed-forward (Qwen team 2025, Qwen3-Next; transformers' ``qwen3_next``).

Every layer: h = x + Mixer(RMSNorm(x)); out = h + FeedForward(RMSNorm(h)). The mixer is one of two kinds:

- **gated softmax attention** (``GatedAttention``): grouped-query attention whose query projection also gives an
  output gate per head and channel, out = o_proj(softmax(q·kᵀ/√d) v ⊙ σ(gate)); q and k RMS-normalised per head
  before RoPE; RoPE over the first ``rotary_dim`` dimensions of each head only (partial rotary, rotate-half);
- **Gated DeltaNet** (``GatedDeltaNet``): q, k, v through a causal depthwise convolution and SiLU, q and k
  L2-normalised (q also by 1/√d_k), a decay g_t = −exp(A_log)·softplus(a_t + dt_bias) and a write strength
  β_t = σ(b_t) per value head, and the state S (d_k × d_v per value head) updated by the gated delta rule

      S_t = g̃_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,   o_t = S_tᵀ q_t,   g̃_t = exp(g_t),

  then a gated RMSNorm per head (RMSNorm(o) ⊙ SiLU(z)) and out_proj. Several value heads share a key head (q and
  k repeated to the value heads, grouped-value attention).

Unrolled, the delta rule is a causal matrix per value head: o_t = Σ_{s ≤ t} A[t, s] v_s with

      A[t, s] = β_s k_sᵀ (T_{s+1} T_{s+2} ⋯ T_t) q_t,    T_j = g̃_j (I − β_j k_j k_jᵀ),

the *implicit attention* of the layer (the gates and the transitions folded in exactly, no approximation).
``implicit_attention`` computes it from the layer's own q, k, β and g with one backward sweep over s, carrying
T_{s+1}⋯T_t q_t for every t at once (T steps of (H, d_k, T) each: no product of T matrices is formed and nothing
is divided, so nothing overflows); tests/test_qwen3_next.py checks A·V against the recurrent output.

The norms are zero-centred, x̂·(1 + w), as Gemma's: read as stored weights + 1 (models/io/hf_qwen3_next.py), so
the project's ``RMSNorm`` computes them; the DeltaNet's gated norm is a plain x̂·w. The feed-forward of a layer is
dense (SwiGLU) or sparse: top-k of ``n_experts`` SwiGLU experts (probabilities renormalised over the k where
``norm_topk``) plus a shared SwiGLU expert scaled by σ(shared_gate(x)).

The Generate tab shows one map per layer (``heads=False`` in the registry): a softmax layer's attention averaged
over its heads, a DeltaNet layer's |A| averaged over its value heads with each row divided by its sum (A is signed
and unnormalised, as Mamba's α); each map's title names the layer's kind (``layer_kinds``). Every head of every
layer is ``layer_maps``. Everything is plain PyTorch (the recurrence is a loop over positions, as transformers'
torch fallback ``torch_recurrent_gated_delta_rule``); no custom kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.blocks.attention import KVCache, attend, causal_mask
from models.blocks.positional import apply_rope, rope_angles
from models.families.gpt import RMSNorm
from models.families.moe import Expert
from models.families.recurrent import RecurrentLM

KINDS = ("linear", "full")  # a layer's mixer: Gated DeltaNet, or gated softmax attention
KIND_NAMES = {"linear": "Gated DeltaNet (implicit attention)", "full": "gated softmax attention"}
# The implicit attention costs T² · d_k per value head and layer (the sweep), the recurrence T · d_k · d_v: prompt
# and continuation are capped as Mamba's are (MAX_TOKENS, models/families/recurrent.py)
NOT_APPLICABLE = ("Qwen3-Next's maps here are one per layer (heads averaged), and half its kinds of layer have no "
                  "softmax heads, so the views built on switching, scoring or patching heads do not apply: head "
                  "roles, head ablation, attention sinks, \"why a head attends\" and head patching. Shown instead: "
                  "each layer's map with its kind (Gated DeltaNet's implicit attention or gated softmax attention), "
                  "the logit lens and compare.")


def notice(model: Qwen3Next) -> str:
    """What Qwen3-Next changes in the views, in words (the Generate tab's notice; models.registry names it)."""
    kinds = model.config.kinds
    linear = [i for i, k in enumerate(kinds) if k == "linear"]
    full = [i for i, k in enumerate(kinds) if k == "full"]
    return (f"· A hybrid model: layers {', '.join(map(str, linear)) or 'none'} are Gated DeltaNet (linear "
            "attention; the map is its implicit attention A[t, s] = β_s k_sᵀ (Π g̃ (I − β k kᵀ)) q_t, |A| averaged "
            f"over value heads, each row divided by its sum), layers {', '.join(map(str, full)) or 'none'} gated "
            "softmax attention (heads averaged). " + NOT_APPLICABLE)


@dataclass
class Qwen3NextConfig:
    vocab_size: int = 151936
    d_model: int = 2048
    n_layers: int = 48
    n_heads: int = 16  # query heads of a softmax layer
    n_kv_heads: int = 2  # key/value heads of a softmax layer (grouped-query attention)
    d_head: int = 256  # width of a softmax layer's head
    rotary_dim: int = 64  # dimensions of each head RoPE turns (partial_rotary_factor 0.25 of 256)
    rope_base: float = 10000.0
    qkv_bias: bool = False  # attention_bias: on q, k, v and o of the softmax layers
    ff_width: int = 5632  # a dense layer's SwiGLU width
    linear_k_heads: int = 16  # Gated DeltaNet: query/key heads
    linear_v_heads: int = 32  # value heads (a multiple of the key heads)
    linear_k_dim: int = 128
    linear_v_dim: int = 128
    conv_kernel: int = 4  # the causal depthwise convolution over q, k, v
    n_experts: int = 512  # 0: every layer dense
    experts_per_token: int = 10
    expert_width: int = 512
    shared_width: int = 512  # the shared expert's width
    norm_topk: bool = True  # the kept experts' probabilities renormalised to sum to 1
    layer_types: tuple[str, ...] = ()  # KINDS per layer; (): three DeltaNet layers then one softmax layer, repeated
    sparse: tuple[bool, ...] = ()  # per layer, whether its feed-forward is the mixture; (): every layer (experts > 0)
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    max_len: int = 32768  # positions the RoPE was trained for
    bos_id: int = 0
    eos_id: int = 0
    pad_id: int = -1

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self.layer_types) or tuple("full" if (i + 1) % 4 == 0 else "linear" for i in range(self.n_layers))

    def is_sparse(self, layer: int) -> bool:
        return bool(self.sparse[layer]) if self.sparse else self.n_experts > 0

    def __post_init__(self) -> None:
        self.layer_types, self.sparse = tuple(self.layer_types), tuple(bool(s) for s in self.sparse)
        bad = set(self.layer_types) - set(KINDS)
        if bad or (self.layer_types and len(self.layer_types) != self.n_layers):
            raise ValueError(f"layer_types must be {self.n_layers} of {KINDS}, got {self.layer_types}")
        if self.sparse and len(self.sparse) != self.n_layers:
            raise ValueError(f"sparse must name each of the {self.n_layers} layers, got {len(self.sparse)}")
        if self.linear_v_heads % self.linear_k_heads or self.n_heads % self.n_kv_heads:
            raise ValueError("value heads must be a multiple of the DeltaNet's key heads, and query heads of the "
                             "key/value heads")
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.d_head:
            raise ValueError(f"rotary_dim must be even and within 2..{self.d_head}, got {self.rotary_dim}")


class GatedAttention(nn.Module):
    """Softmax attention with an output gate: q_proj gives each head's query and gate side by side (d_head each)."""

    def __init__(self, c: Qwen3NextConfig) -> None:
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.d_model, 2 * c.n_heads * c.d_head, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.d_model, c.n_kv_heads * c.d_head, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.d_model, c.n_kv_heads * c.d_head, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.n_heads * c.d_head, c.d_model, bias=c.qkv_bias)
        self.q_norm, self.k_norm = RMSNorm(c.d_head, c.norm_eps), RMSNorm(c.d_head, c.norm_eps)

    def forward(self, x: Tensor, angles: Tensor, cache: KVCache | None, need_weights: bool
                ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, D) -> (out (B, T, D), weights (B, H, T, S) or None); S = cached + T keys."""
        c, (b, t, _) = self.c, x.shape
        q, gate = self.q_proj(x).view(b, t, c.n_heads, 2 * c.d_head).chunk(2, dim=-1)  # (B, T, H, d) each
        q = self.q_norm(q).transpose(1, 2)  # (B, H, T, d)
        k = self.k_norm(self.k_proj(x).view(b, t, c.n_kv_heads, c.d_head)).transpose(1, 2)  # (B, Hkv, T, d)
        v = self.v_proj(x).view(b, t, c.n_kv_heads, c.d_head).transpose(1, 2)
        r = 0 if c.rotary_dim == c.d_head else c.rotary_dim
        q, k = apply_rope(q, angles, "half", rotary_dim=r), apply_rope(k, angles, "half", rotary_dim=r)
        if cache is not None:
            k, v = cache.extend(k, v)
        s = k.size(2)
        out, weights = attend(q, k, v, causal_mask(t, s, x.device) if t > 1 else None, need_weights=need_weights)
        out = out.transpose(1, 2).reshape(b, t, -1) * torch.sigmoid(gate.reshape(b, t, -1))
        return self.o_proj(out), weights


@dataclass
class DeltaTrace:
    """What one DeltaNet layer computed on one input (batch row 0), for its implicit attention: q and k (T, H, d_k)
    after the L2 norms (q also scaled by 1/√d_k) and repeated to the H value heads, v (T, H, d_v), β and g (T, H)
    (g the log of the decay), and o (T, H, d_v), the recurrence's output before the gated norm."""

    q: Tensor
    k: Tensor
    v: Tensor
    beta: Tensor
    g: Tensor
    o: Tensor


@dataclass
class HybridState:
    """Per layer: a softmax layer's KVCache; a DeltaNet layer's last conv_kernel − 1 convolution inputs (B, C, K − 1)
    and recurrent state (B, H, d_k, d_v)."""

    kv: list[KVCache | None] = field(default_factory=list)
    conv: list[Tensor | None] = field(default_factory=list)
    rec: list[Tensor | None] = field(default_factory=list)
    seen: int = 0  # positions read so far: the RoPE offset of the next token


def _l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """x / sqrt(Σ x² + ε) over the last axis (the ε inside the root, as the reference implementation)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class GatedDeltaNet(nn.Module):
    def __init__(self, c: Qwen3NextConfig) -> None:
        super().__init__()
        self.c = c
        kd, vd, hv = c.linear_k_heads * c.linear_k_dim, c.linear_v_heads * c.linear_v_dim, c.linear_v_heads
        self.q_proj = nn.Linear(c.d_model, kd, bias=False)
        self.k_proj = nn.Linear(c.d_model, kd, bias=False)
        self.v_proj = nn.Linear(c.d_model, vd, bias=False)
        self.z_proj = nn.Linear(c.d_model, vd, bias=False)  # the output gate of the norm
        self.b_proj = nn.Linear(c.d_model, hv, bias=False)  # β = σ(b)
        self.a_proj = nn.Linear(c.d_model, hv, bias=False)  # the step of the decay
        self.conv_dim = 2 * kd + vd
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, c.conv_kernel, groups=self.conv_dim, bias=False,
                                padding=c.conv_kernel - 1)
        self.dt_bias = nn.Parameter(torch.ones(hv))
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 16.0, hv)))
        self.norm_weight = nn.Parameter(torch.ones(c.linear_v_dim))  # the gated RMSNorm's (plain, not zero-centred)
        self.out_proj = nn.Linear(vd, c.d_model, bias=False)

    def _conv(self, mixed: Tensor, state: HybridState | None, layer: int) -> Tensor:
        """(B, C, T) -> SiLU(causal depthwise conv) (B, C, T), continuing the cached inputs (as Mamba's)."""
        t, keep = mixed.size(-1), self.c.conv_kernel - 1
        past = state.conv[layer] if state is not None else None
        if past is not None:
            full = torch.cat([past, mixed], dim=-1)
            out = F.conv1d(full, self.conv1d.weight, groups=self.conv_dim)[..., -t:]
        else:
            full = mixed
            out = self.conv1d(mixed)[..., :t]
        if state is not None:
            state.conv[layer] = F.pad(full, (max(0, keep - full.size(-1)), 0))[..., -keep:]
        return F.silu(out)

    def forward(self, x: Tensor, state: HybridState | None = None, layer: int = 0,
                trace: list[Any] | None = None) -> Tensor:
        """x (B, T, D) -> (B, T, D). ``state``: continue from (and update) the cached convolution inputs and delta
        rule state; ``trace``: append this call's DeltaTrace."""
        c, (bsz, t, _) = self.c, x.shape
        hk, hv, dk, dv = c.linear_k_heads, c.linear_v_heads, c.linear_k_dim, c.linear_v_dim
        mixed = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], -1).transpose(1, 2)
        q, k, v = self._conv(mixed, state, layer).transpose(1, 2).split([hk * dk, hk * dk, hv * dv], dim=-1)
        group = hv // hk  # grouped values: key head i serves value heads i·group … (i + 1)·group − 1
        q = q.reshape(bsz, t, hk, dk).float().repeat_interleave(group, dim=2)
        k = k.reshape(bsz, t, hk, dk).float().repeat_interleave(group, dim=2)
        v = v.reshape(bsz, t, hv, dv).float()
        q, k = _l2norm(q) * dk ** -0.5, _l2norm(k)
        beta = torch.sigmoid(self.b_proj(x).float())  # (B, T, H)
        g = -self.A_log.float().exp() * F.softplus(self.a_proj(x).float() + self.dt_bias.float())  # (B, T, H), ≤ 0
        s = state.rec[layer] if state is not None and state.rec[layer] is not None else \
            x.new_zeros(bsz, hv, dk, dv, dtype=torch.float32)
        outs = []
        for i in range(t):  # the gated delta rule, one position at a time (the recurrent form)
            s = s * g[:, i].exp()[..., None, None]
            k_i, q_i = k[:, i], q[:, i]  # (B, H, d_k)
            delta = (v[:, i] - torch.einsum("bhkv,bhk->bhv", s, k_i)) * beta[:, i, :, None]  # (B, H, d_v)
            s = s + k_i[..., None] * delta[..., None, :]
            outs.append(torch.einsum("bhkv,bhk->bhv", s, q_i))
        o = torch.stack(outs, 1)  # (B, T, H, d_v)
        if state is not None:
            state.rec[layer] = s
        if trace is not None:
            trace.append(DeltaTrace(q[0], k[0], v[0], beta[0], g[0], o[0]))
        z = self.z_proj(x).reshape(bsz, t, hv, dv).float()
        normed = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + c.norm_eps) * self.norm_weight.float()
        return self.out_proj((normed * F.silu(z)).reshape(bsz, t, -1).to(x.dtype))


def implicit_attention(trace: DeltaTrace) -> Tensor:
    """A (H, T, T) of one DeltaNet layer: o_t = Σ_s A[t, s] v_s per value head, A[t, s] = β_s k_sᵀ (T_{s+1}⋯T_t) q_t
    for s ≤ t and 0 above the diagonal, T_j = exp(g_j)(I − β_j k_j k_jᵀ). One sweep from s = T − 1 down to 0 carries
    W[:, t] = T_{s+1}⋯T_t q_t for every t ≥ s (the columns t < s are zero), so A[:, s] = β_s k_sᵀ W and W ← T_s W."""
    t, h, dk = trace.q.shape
    q, k = trace.q.transpose(0, 1).double(), trace.k.transpose(0, 1).double()  # (H, T, d_k)
    beta, decay = trace.beta.T.double(), trace.g.T.double().exp()  # (H, T)
    w = q.new_zeros(h, dk, t)
    cols = []
    for s in range(t - 1, -1, -1):
        w[:, :, s] = q[:, s]
        kw = torch.einsum("hd,hdt->ht", k[:, s], w)  # k_sᵀ W: (H, T)
        cols.append(beta[:, s, None] * kw)  # column s of A
        w = decay[:, s, None, None] * (w - (beta[:, s, None] * k[:, s])[:, :, None] * kw[:, None, :])
    a = torch.stack(cols[::-1], dim=-1)  # (H, T(t), T(s))
    return a.tril().to(trace.q.dtype)


def heatmap(a: Tensor) -> Tensor:
    """|A| (H, T, T) averaged over heads, each row divided by its sum: (T, T) rows summing to 1, as attention's."""
    m = a.abs().mean(0)
    return m / m.sum(-1, keepdim=True).clamp_min(1e-30)


class SparseExperts(nn.Module):
    """Top-k routing over SwiGLU experts plus a shared SwiGLU expert gated by σ(shared_gate(x)); x (B, T, D)."""

    def __init__(self, c: Qwen3NextConfig) -> None:
        super().__init__()
        self.k, self.norm_topk = c.experts_per_token, c.norm_topk
        self.router = nn.Linear(c.d_model, c.n_experts, bias=False)
        self.experts = nn.ModuleList(Expert(c.d_model, c.expert_width, F.silu) for _ in range(c.n_experts))
        self.shared = Expert(c.d_model, c.shared_width, F.silu)
        self.shared_gate = nn.Linear(c.d_model, 1, bias=False)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(router logits (N, E), chosen experts (N, k) most probable first, their weights (N, k))."""
        logits = self.router(x)
        top, chosen = torch.topk(torch.softmax(logits.float(), -1), self.k, dim=-1)
        if self.norm_topk:
            top = top / top.sum(-1, keepdim=True)
        return logits, chosen, top.to(x.dtype)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, x.size(-1))
        _, chosen, weights = self.route(rows)
        out = torch.zeros_like(rows)
        for e in chosen.unique().tolist():  # each expert once, on the tokens that chose it
            token, slot = torch.where(chosen == e)
            out.index_add_(0, token, self.experts[e](rows[token]) * weights[token, slot, None])
        out = out + torch.sigmoid(self.shared_gate(rows)) * self.shared(rows)
        return out.view(x.shape)


class Qwen3NextBlock(nn.Module):
    def __init__(self, c: Qwen3NextConfig, layer: int) -> None:
        super().__init__()
        self.kind = c.kinds[layer]
        self.norm1, self.norm2 = RMSNorm(c.d_model, c.norm_eps), RMSNorm(c.d_model, c.norm_eps)
        self.mixer: nn.Module = GatedDeltaNet(c) if self.kind == "linear" else GatedAttention(c)
        self.ff: nn.Module = SparseExperts(c) if c.is_sparse(layer) else Expert(c.d_model, c.ff_width, F.silu)

    def forward(self, x: Tensor, angles: Tensor, state: HybridState | None, layer: int, need_weights: bool,
                traces: list[Any] | None) -> tuple[Tensor, Tensor | None]:
        h = self.norm1(x)
        weights = None
        if self.kind == "linear":
            a = self.mixer(h, state, layer, traces)
        else:
            a, weights = self.mixer(h, angles, state.kv[layer] if state is not None else None, need_weights)
            if traces is not None:
                traces.append(None)
        x = x + a
        return x + self.ff(self.norm2(x)), weights


@dataclass
class HybridForward:
    logits: Tensor  # (B, T, V)
    hidden: list[Tensor] = field(default_factory=list)  # the stream before each block and after the last
    attention: list[Tensor | None] = field(default_factory=list)  # per layer: softmax weights (B, H, T, S) or None
    traces: list[DeltaTrace | None] = field(default_factory=list)  # per layer: a DeltaNet's trace or None


class Qwen3Next(RecurrentLM):
    """Embedding -> hybrid blocks -> RMSNorm -> output projection."""

    NOT_APPLICABLE = NOT_APPLICABLE  # the head views' refusal, in words (tabs.sections.text.require_heads)
    NO_HEAD_MASK = "Qwen3-Next's heads cannot be switched off here: " + NOT_APPLICABLE

    def __init__(self, config: Qwen3NextConfig, tokenizer: Any | None = None) -> None:
        super().__init__()
        self.config = c = config
        self.tokenizer = tokenizer
        self.labels: list[str] = []
        self.text: dict = {}
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.blocks = nn.ModuleList(Qwen3NextBlock(c, i) for i in range(c.n_layers))
        self.norm = RMSNorm(c.d_model, c.norm_eps)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, ids: Tensor, state: HybridState | None = None, need_weights: bool = False,
                keep_hidden: bool = False, keep_trace: bool = False, last_only: bool = False) -> HybridForward:
        """ids (B, T), continuing ``state`` if given (updated in place). ``need_weights``: each softmax layer's
        attention; ``keep_trace``: each DeltaNet layer's trace (its implicit attention's inputs)."""
        start = state.seen if state is not None else 0
        t = ids.size(1)
        angles = rope_angles(t, self.config.rotary_dim, self.config.rope_base, offset=start).to(ids.device)
        x = self.embed(ids)
        hidden, attention = [], []
        traces: list[Any] | None = [] if keep_trace else None
        for i, block in enumerate(self.blocks):
            if keep_hidden:
                hidden.append(x)
            x, w = block(x, angles, state, i, need_weights, traces)
            attention.append(w)
        if keep_hidden:
            hidden.append(x)
        if state is not None:
            state.seen = start + t
        if last_only:
            x = x[:, -1:]
        return HybridForward(self.lm_head(self.norm(x)), hidden, attention, traces or [])

    # ------------------------------------------------------------------ what the views read
    def layer_kinds(self) -> list[str]:
        """Each layer's kind in words (the heatmap's title): Gated DeltaNet or gated softmax attention."""
        return [KIND_NAMES[k] for k in self.config.kinds]

    @torch.no_grad()
    def layer_maps(self, ids: Sequence[int]) -> list[tuple[str, np.ndarray]]:
        """Every layer's maps over ``ids``, head by head: (kind, (H, T, T) float32): a softmax layer's attention
        (rows sum to 1) or a DeltaNet layer's implicit attention A (signed, o_t = Σ_s A[t, s] v_s)."""
        out = self(self._ids(ids), need_weights=True, keep_trace=True)
        maps = []
        for kind, w, tr in zip(self.config.kinds, out.attention, out.traces, strict=True):
            a = w[0] if kind == "full" else implicit_attention(tr)
            maps.append((kind, a.float().cpu().numpy()))
        return maps

    def _maps(self, out: HybridForward) -> np.ndarray:
        """(L, 1, T, T) float32: a softmax layer's attention averaged over heads, a DeltaNet layer's ``heatmap``."""
        maps = [w[0].float().mean(0) if w is not None else heatmap(implicit_attention(tr))
                for w, tr in zip(out.attention, out.traces, strict=True)]
        return np.stack([m[None].float().cpu().numpy() for m in maps]).astype(np.float32)

    # ------------------------------------------------------------------ the hooks of RecurrentLM
    def _new_state(self) -> HybridState:
        n = self.config.n_layers
        kinds = self.config.kinds
        return HybridState([KVCache() if k == "full" else None for k in kinds], [None] * n, [None] * n)

    def _mapped(self, x: Tensor) -> tuple[HybridForward, np.ndarray]:
        out = self(x, need_weights=True, keep_trace=True)
        return out, self._maps(out)

    @torch.no_grad()
    def implicit_attention(self, ids: Sequence[int]) -> np.ndarray:
        """(L, 1, T, T): every layer's map over ``ids`` (as Generate draws them)."""
        return self._mapped(self._ids(ids))[1]
