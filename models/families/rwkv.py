"""RWKV-4 (Peng et al. 2023, "RWKV: Reinventing RNNs for the Transformer Era"): a language model with no attention, a
time-mixing recurrence (WKV) and a channel-mixing feed-forward per layer, and the attention its WKV is (Zimerman, Ali &
Wolf 2024, "Explaining Modern Gated-Linear RNNs via a Unified Implicit Attention Formulation").

One block (Peng et al. 2023, eqs. 11–17); h_{t−1} is the normed stream one position back (zeros before the first):

    x     = LN_pre(embedding)                                  before block 0 only
    h     = LN1(x);   mix(μ)_t = μ ⊙ h_t + (1 − μ) ⊙ h_{t−1}      the token shift
    r, k, v = W_r mix(μ_r), W_k mix(μ_k), W_v mix(μ_v)          A channels each
    wkv_t = (Σ_{j<t} e^{k_j − (t−1−j)·w} ⊙ v_j + e^{u + k_t} ⊙ v_t) / (Σ_{j<t} e^{k_j − (t−1−j)·w} + e^{u + k_t})
    x     = x + W_o (σ(r_t) ⊙ wkv_t)                              w = exp(time_decay) > 0, u = time_first, per channel
    h     = LN2(x);   x = x + σ(W_r' mix(μ_r')) ⊙ W_v' relu(W_k' mix(μ_k'))²
    logits = head(LN_out(x))

WKV runs as a recurrence (``wkv_scan``): a numerator and a denominator per channel, decayed by e^{−w} at each step and
kept beside their largest exponent so that nothing overflows; the same loop reads a prompt at once and one token per
step (generation), its state being what the loop carries.

Unrolled, wkv_t[c] = Σ_{j ≤ t} α[c, t, j] · v_j[c] with the *implicit attention* (``implicit_attention``)

    α[c, t, ·] = softmax_j s[c, t, j],   s[c, t, j] = k_j[c] − (t − 1 − j) · w[c]  (j < t),   u[c] + k_t[c]  (j = t),

a causal softmax per channel, exactly (the test checks α · v against the recurrence and against transformers' own
WKV): its score is the key alone plus a penalty linear in the distance (ALiBi's shape, Press et al. 2022, with one
slope w per channel) and a bonus u for the current token; there is no query. Unlike Mamba's α
(models/families/mamba.py), every row of it is positive and sums to 1 by construction, so the heatmaps (α averaged
over the channels, or one channel) need no renormalisation. The receptance σ(r_t) then gates each channel's output;
it scales a row, it does not move weight within it, and is not part of α. RWKV-4 has no heads: each channel is a head
of its own (width 1, one decay), so "per head" here is per channel; the Generate tab draws one map per layer, as for
Mamba.

``rescale_every`` R: at inference transformers (as RWKV's own code) halves the stream after every R blocks and divides
block b's two output projections by 2^(b // R), which keeps float16 in range. The model runs the same (halving is
exact in floating point), so its hidden states are transformers' own.

Weights come from a Hugging Face ``rwkv`` folder (``RwkvForCausalLM``, e.g. RWKV/rwkv-4-169m-pile) via
``models.io.hf_rwkv.rwkv_from_state``. What does not apply (no heads: head roles, head ablation, the "why" score split,
sink ablation and head patching) is said in words (``NOT_APPLICABLE``), as for Mamba.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from models.families.recurrent import RecurrentLM

# α costs T² per channel and layer (the scan costs T): rwkv-4-169m's 12 × 768 channels at 256 tokens are 0.6 G scores,
# 18–36 s on the busy 2-core test machine (load 2.4–6.8; `python bench/rwkv_map.py`), at 128 a quarter of them. So
ALPHA_FLOATS = 1 << 24  # at most this many floats (64 MB) of scores at once: the channel chunk adapts to T
NOT_APPLICABLE = ("RWKV has no attention heads, so the views built on heads do not apply: head roles, head "
                  "ablation, attention sinks, \"why a head attends\" (a score split of q·k) and head patching. "
                  "Shown instead: the attention its WKV recurrence is, per channel (Peng et al. 2023; Zimerman, Ali & "
                  "Wolf 2024), the logit lens and compare.")


def notice(model: object) -> str:
    """What RWKV changes in the views, in words (the Generate tab's notice; models.registry names it)."""
    return ("· The heatmaps show RWKV's *implicit attention*: per channel its WKV is exactly a causal softmax over "
            "the keys with a decay linear in the distance, α[t, j] ∝ exp(k_j − (t−1−j)·w) and exp(u + k_t) for the "
            "token itself; averaged over the channels (rows sum to 1 as they are). " + NOT_APPLICABLE)


@dataclass
class RwkvConfig:
    vocab_size: int = 50277
    d_model: int = 768
    n_layers: int = 12
    d_attention: int = 0  # A: channels of r, k, v and the WKV (0: d_model)
    d_ff: int = 0  # the channel mix's hidden width (0: 4 · d_model)
    norm_eps: float = 1e-5  # the blocks' LayerNorms (the final one is built with 1e-5, as transformers builds it)
    rescale_every: int = 6  # halve the stream after every this many blocks at inference (0: never)
    tie_embeddings: bool = False  # RWKV-4's head is its own matrix
    max_len: int = 1024  # context_length: what it was trained on (no positions: only a cap on what the app feeds it)
    bos_id: int = 0
    eos_id: int = 0
    pad_id: int = -1
    n_heads: int = 1  # the Generate tab's head range: one map per layer (channels averaged)

    @property
    def d_att(self) -> int:
        return self.d_attention or self.d_model

    @property
    def d_hidden(self) -> int:
        return self.d_ff or 4 * self.d_model


@dataclass
class WkvTrace:
    """What one time mix computed on one input, for the implicit attention: (T, A) k, v, the receptance σ(r) and the
    WKV output (before the gate)."""

    k: Tensor
    v: Tensor
    r: Tensor
    wkv: Tensor


@dataclass
class RwkvState:
    """Per layer: the last normed inputs of the time mix and the channel mix (B, D) (the token shift), and the WKV
    numerator, denominator and their exponent (B, A), float32."""

    att: list[Tensor | None] = field(default_factory=list)
    ffn: list[Tensor | None] = field(default_factory=list)
    wkv: list[tuple[Tensor, Tensor, Tensor] | None] = field(default_factory=list)


def wkv_scan(time_decay: Tensor, time_first: Tensor, k: Tensor, v: Tensor,
             state: tuple[Tensor, Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
    """The WKV recurrence: k, v (B, T, A) -> (wkv (B, T, A) in v's dtype, the state after the last position).

    The state is (num, den, p): the real numerator and denominator are num·e^p and den·e^p. Output at t mixes the
    state with the current token's e^{u + k_t}; then the state decays by e^{−w} and takes e^{k_t}. Each sum is formed
    against the larger of its two exponents, so every exp is of a number ≤ 0."""
    neg_w = -torch.exp(time_decay.float())  # (A,): −w, the log decay of one step
    u = time_first.float()
    b, _, a = k.shape
    if state is None:
        zero = k.new_zeros(b, a, dtype=torch.float32)
        num, den, p = zero, zero, torch.full_like(zero, -1e38)
    else:
        num, den, p = state
    out = []
    for k_t, v_t in zip(k.float().unbind(1), v.float().unbind(1), strict=True):
        q = torch.maximum(p, u + k_t)
        e1, e2 = torch.exp(p - q), torch.exp(u + k_t - q)
        out.append((e1 * num + e2 * v_t) / (e1 * den + e2))
        q = torch.maximum(p + neg_w, k_t)
        e1, e2 = torch.exp(p + neg_w - q), torch.exp(k_t - q)
        num, den, p = e1 * num + e2 * v_t, e1 * den + e2, q
    return torch.stack(out, 1).to(v.dtype), (num, den, p)


def _shifted(h: Tensor, last: Tensor | None) -> Tensor:
    """h (B, T, D) one position back: h_{t−1}, the first from ``last`` (the previous call's last) or zeros."""
    first = last[:, None].to(h.dtype) if last is not None else h.new_zeros(h.size(0), 1, h.size(2))
    return torch.cat([first, h[:, :-1]], 1)


def _mix(h: Tensor, prev: Tensor, mu: Tensor) -> Tensor:
    return h * mu + prev * (1 - mu)


class TimeMix(nn.Module):
    """The time mix: token shift, r, k, v, the WKV recurrence, the receptance gate, the output projection."""

    def __init__(self, c: RwkvConfig) -> None:
        super().__init__()
        d, a = c.d_model, c.d_att
        self.time_decay = nn.Parameter(torch.zeros(a))  # w = exp(time_decay)
        self.time_first = nn.Parameter(torch.zeros(a))  # u: the current token's bonus
        self.time_mix_key = nn.Parameter(torch.full((1, 1, d), 0.5))
        self.time_mix_value = nn.Parameter(torch.full((1, 1, d), 0.5))
        self.time_mix_receptance = nn.Parameter(torch.full((1, 1, d), 0.5))
        self.key = nn.Linear(d, a, bias=False)
        self.value = nn.Linear(d, a, bias=False)
        self.receptance = nn.Linear(d, a, bias=False)
        self.output = nn.Linear(a, d, bias=False)

    def forward(self, h: Tensor, state: RwkvState | None, layer: int, trace: list[WkvTrace] | None) -> Tensor:
        prev = _shifted(h, state.att[layer] if state is not None else None)
        k = self.key(_mix(h, prev, self.time_mix_key))
        v = self.value(_mix(h, prev, self.time_mix_value))
        r = torch.sigmoid(self.receptance(_mix(h, prev, self.time_mix_receptance)))
        wkv, after = wkv_scan(self.time_decay, self.time_first, k, v, state.wkv[layer] if state is not None else None)
        if state is not None:
            state.att[layer], state.wkv[layer] = h[:, -1], after
        if trace is not None:
            trace.append(WkvTrace(k[0], v[0], r[0], wkv[0]))
        return self.output(r * wkv)


class ChannelMix(nn.Module):
    """The channel mix: token shift, then σ(receptance) ⊙ value(relu(key)²)."""

    def __init__(self, c: RwkvConfig) -> None:
        super().__init__()
        d = c.d_model
        self.time_mix_key = nn.Parameter(torch.full((1, 1, d), 0.5))
        self.time_mix_receptance = nn.Parameter(torch.full((1, 1, d), 0.5))
        self.key = nn.Linear(d, c.d_hidden, bias=False)
        self.receptance = nn.Linear(d, d, bias=False)
        self.value = nn.Linear(c.d_hidden, d, bias=False)

    def forward(self, h: Tensor, state: RwkvState | None, layer: int) -> Tensor:
        prev = _shifted(h, state.ffn[layer] if state is not None else None)
        if state is not None:
            state.ffn[layer] = h[:, -1]
        key = torch.square(torch.relu(self.key(_mix(h, prev, self.time_mix_key))))
        return torch.sigmoid(self.receptance(_mix(h, prev, self.time_mix_receptance))) * self.value(key)


class RwkvBlock(nn.Module):
    def __init__(self, c: RwkvConfig, scale: float) -> None:
        super().__init__()
        self.scale = scale  # 2^−(b // R): the inference rescaling of both outputs (1 where R is 0)
        self.ln1 = nn.LayerNorm(c.d_model, eps=c.norm_eps)
        self.ln2 = nn.LayerNorm(c.d_model, eps=c.norm_eps)
        self.attention = TimeMix(c)
        self.feed_forward = ChannelMix(c)

    def forward(self, x: Tensor, state: RwkvState | None, layer: int, trace: list[WkvTrace] | None) -> Tensor:
        x = x + self.attention(self.ln1(x), state, layer, trace) * self.scale
        return x + self.feed_forward(self.ln2(x), state, layer) * self.scale


@dataclass
class RwkvForward:
    logits: Tensor  # (B, T, V)
    hidden: list[Tensor] = field(default_factory=list)  # the stream before each block and after the last
    traces: list[WkvTrace] = field(default_factory=list)  # per layer, with keep_trace


def implicit_attention(trace: WkvTrace, time_decay: Tensor, time_first: Tensor, channel: int | None = None,
                       channels: Sequence[int] | None = None, chunk: int = 0) -> Tensor:
    """α (A', T, T) of one layer: per channel c, row t is softmax_j of k_j[c] − (t−1−j)·w[c] for j < t and
    u[c] + k_t[c] for j = t (0 above the diagonal), so that α[c] @ v[:, c] is the WKV output. ``channel``: that channel
    alone; ``channels``: those; else all A, ``chunk`` channels at a time (0: as many as ALPHA_FLOATS allows)."""
    t = trace.k.size(0)
    chunk = chunk or max(1, ALPHA_FLOATS // (t * t))
    chans = [channel] if channel is not None else list(channels) if channels is not None else \
        list(range(trace.k.size(1)))
    pos = torch.arange(t, device=trace.k.device)
    back = (pos[:, None] - 1 - pos[None, :]).float()  # (T, T): t − 1 − j
    diagonal = torch.eye(t, dtype=torch.bool, device=trace.k.device)
    future = pos[None, :] > pos[:, None]
    w, u, k = torch.exp(time_decay.float()), time_first.float(), trace.k.float()
    out = []
    for start in range(0, len(chans), chunk):
        d = chans[start : start + chunk]
        bias = torch.where(diagonal, u[d][:, None, None], -w[d][:, None, None] * back)  # (d, T, T)
        scores = (k[:, d].T[:, None, :] + bias).masked_fill(future, float("-inf"))  # the key k_j, column j
        out.append(torch.softmax(scores, -1))
    return torch.cat(out)


def heatmap(alpha: Tensor) -> Tensor:
    """α (A', T, T) averaged over its channels: (T, T), rows summing to 1 (each channel's already do)."""
    return alpha.mean(0)


def mean_attention(trace: WkvTrace, time_decay: Tensor, time_first: Tensor) -> Tensor:
    """``heatmap`` of every channel's α (T, T), summed a chunk of channels at a time (memory: one chunk's α, not A)."""
    t, a = trace.k.shape
    chunk = max(1, ALPHA_FLOATS // (t * t))
    total = trace.k.new_zeros(t, t, dtype=torch.float32)
    for start in range(0, a, chunk):
        total += implicit_attention(trace, time_decay, time_first, channels=range(start, min(a, start + chunk))).sum(0)
    return total / a


class Rwkv(RecurrentLM):
    """Embedding -> LayerNorm -> RWKV blocks -> LayerNorm -> output projection."""

    IMPLICIT = "RWKV: WKV's softmax per channel, channels averaged"  # what its maps are, in titles and notes
    NOT_APPLICABLE = NOT_APPLICABLE  # what the head views say for it (tabs.sections.text.require_heads)
    NO_HEAD_MASK = "RWKV has no attention heads to switch off"

    def __init__(self, config: RwkvConfig, tokenizer: Any | None = None) -> None:
        super().__init__()
        self.config = c = config
        self.tokenizer = tokenizer
        self.labels: list[str] = []
        self.text: dict = {}
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pre_norm = nn.LayerNorm(c.d_model, eps=c.norm_eps)
        every = c.rescale_every
        self.blocks = nn.ModuleList(RwkvBlock(c, 2.0 ** -(i // every) if every > 0 else 1.0)
                                    for i in range(c.n_layers))
        self.norm = nn.LayerNorm(c.d_model, eps=1e-5)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, ids: Tensor, state: RwkvState | None = None, keep_hidden: bool = False,
                keep_trace: bool = False, last_only: bool = False) -> RwkvForward:
        """ids (B, T), continuing ``state`` if given (updated in place)."""
        x = self.pre_norm(self.embed(ids))
        every = self.config.rescale_every
        hidden: list[Tensor] = []
        traces: list[WkvTrace] | None = [] if keep_trace else None
        for i, block in enumerate(self.blocks):
            if keep_hidden:
                hidden.append(x)
            x = block(x, state, i, traces)
            if every > 0 and (i + 1) % every == 0:
                x = x / 2
        if keep_hidden:
            hidden.append(x)
        if last_only:
            x = x[:, -1:]
        return RwkvForward(self.lm_head(self.norm(x)), hidden, traces or [])

    # ------------------------------------------------------------------ the hooks of RecurrentLM
    def _new_state(self) -> RwkvState:
        n = self.config.n_layers
        return RwkvState([None] * n, [None] * n, [None] * n)

    def _mapped(self, x: Tensor) -> tuple[RwkvForward, np.ndarray]:
        out = self(x, keep_trace=True)
        return out, self._maps(out.traces)

    def alpha(self, trace: WkvTrace, layer: int, channel: int | None = None) -> Tensor:
        """Layer ``layer``'s α (A', T, T) from its trace (``implicit_attention`` with the layer's own w and u)."""
        mix = self.blocks[layer].attention
        return implicit_attention(trace, mix.time_decay, mix.time_first, channel)

    def _maps(self, traces: list[WkvTrace], channel: int | None = None) -> np.ndarray:
        """(L, 1, T, T) float32: each layer's α averaged over all channels (``mean_attention``), or one channel's."""
        mixes = [block.attention for block in self.blocks]
        maps = [(mean_attention(tr, m.time_decay, m.time_first) if channel is None else
                 heatmap(self.alpha(tr, i, channel)))[None] for i, (tr, m) in enumerate(zip(traces, mixes))]
        return np.stack([m.float().cpu().numpy() for m in maps]).astype(np.float32)

    @torch.no_grad()
    def implicit_attention(self, ids: Sequence[int], channel: int | None = None) -> np.ndarray:
        """(L, 1, T, T): every layer's implicit attention over ``ids``, channels averaged or one ``channel``."""
        if channel is not None and not 0 <= channel < self.config.d_att:
            raise ValueError(f"channel {channel} is outside 0..{self.config.d_att - 1}")
        return self._maps(self(self._ids(ids), keep_trace=True).traces, channel)
