"""Mamba: a language model with no attention, a selective state-space scan per layer (Gu & Dao 2023), and the
attention hidden in it (Ali, Zimerman & Wolf 2024, "The Hidden Attention of Mamba Models").

One block: h = x + Mixer(RMSNorm(x)); the mixer (Gu & Dao 2023, Algorithm 2 and §3.5):

    u, z = in_proj(h)                           two streams of E = expand·d_model channels
    u    = SiLU(causal depthwise conv1d(u))     kernel d_conv, each channel by itself
    Δ, B, C = x_proj(u)                         Δ (dt_rank), B and C (d_state) per position: the *selection*
    Δ    = softplus(dt_proj(Δ))                 (T, E): a step size per position and channel
    Ā_t  = exp(Δ_t · A),  B̄_t = Δ_t · B_t      A = −exp(A_log) (E, N): zero-order hold (Δ B for B̄, as Mamba's code)
    s_t  = Ā_t ⊙ s_{t−1} + B̄_t · u_t            state (E, N)
    y_t  = C_t · s_t + D ⊙ u_t
    out  = out_proj(y ⊙ SiLU(z))

Unrolled, y_t[d] = Σ_{j ≤ t} α[d, t, j] · u_j[d] + D[d] · u_t[d] with the *implicit attention* (Ali et al. 2024, eq. 12)

    α[d, t, j] = C_t · (Π_{k=j+1..t} Ā_k[d]) ⊙ B̄_j[d] = Σ_n C_t[n] · exp(A[d, n] · (S_t[d] − S_j[d])) · Δ_j[d] · B_j[n],

S_t = Σ_{k ≤ t} Δ_k (the product of exponentials is the exponential of a sum of step sizes, computed so, never as a
product of T factors). ``implicit_attention`` computes α from the layer's own Δ, B, C; the test checks that
Σ_j α · u_j + D · u_t equals the scan's output. The heatmaps show |α| averaged over the channels (or one channel), each
row divided by its sum, so that rows compare with a Transformer's softmax rows: α itself is signed and unnormalised
(nothing makes a row sum to 1), which is why a state-space model has no attention sink to look for.

Everything is plain PyTorch: the scan is a loop over positions (a few hundred at most here) of one fused multiply-add
each, every position's decay and input computed beforehand in one tensor operation; no custom kernel.
Weights come from a Hugging Face ``mamba`` folder (``MambaForCausalLM``, e.g. state-spaces/mamba-130m-hf) via
``mamba_from_state``. What does not apply to Mamba (no heads: no head roles, ablation of heads, "why" score split, sink
ablation or patching of heads) is said in words by the Generate tab (``NOT_APPLICABLE``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.families.gpt import RMSNorm
from models.families.recurrent import RecurrentLM

# The implicit attention costs T² · d_state exponentials and multiply-adds per channel and layer, where the scan
# costs T: mamba-130m's 24 × 1,536 channels at 256 tokens (39 G) did not finish in 10 min on the 2-core test machine
# (busy). So: prompt + generated tokens at most MAX_TOKENS (models/families/recurrent.py), and the averaged map over
# MAP_CHANNELS channels evenly spaced over the E (all of them where E is smaller; one channel on request, any of the
# E): mamba-130m at MAX_TOKENS = 128 tokens, 24 × 128 × 128² × 16 ≈ 0.8 G.
MAP_CHANNELS = 128
ALPHA_FLOATS = 1 << 26  # at most this many floats (256 MB) of exp(A·ΔS) at once: the channel chunk adapts to T
NOT_APPLICABLE = ("Mamba has no attention heads, so the views built on heads do not apply: head roles, head "
                  "ablation, attention sinks, \"why a head attends\" (a score split of q·k) and head patching. "
                  "Shown instead: its implicit attention α (Ali, Zimerman & Wolf 2024), the logit lens and compare.")


def notice(model: object) -> str:
    """What Mamba changes in the views, in words (the Generate tab's notice; models.registry names it)."""
    return ("· The heatmaps show Mamba's *implicit attention*: per layer α[t, j] = C_t · (Π Ā) · B̄_j, |α| averaged "
            "over the channels and each row divided by its sum (Ali, Zimerman & Wolf 2024). " + NOT_APPLICABLE)


@dataclass
class MambaConfig:
    vocab_size: int = 50280
    d_model: int = 768
    n_layers: int = 24
    d_state: int = 16  # N: state size per channel
    d_conv: int = 4  # causal depthwise convolution kernel
    expand: int = 2  # E = expand · d_model inner channels
    dt_rank: int = 0  # 0 = ceil(d_model / 16)
    norm_eps: float = 1e-5
    conv_bias: bool = True
    bias: bool = False  # in_proj / out_proj biases
    tie_embeddings: bool = True
    max_len: int = 2048  # no positions: only a cap on what the app feeds it
    bos_id: int = 0
    eos_id: int = 0
    pad_id: int = -1
    n_heads: int = 1  # the Generate tab's head range: one map per layer (channels averaged)

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def rank(self) -> int:
        return self.dt_rank or math.ceil(self.d_model / 16)


@dataclass
class MixerTrace:
    """What one mixer computed on one input, for the implicit attention: (T, E) u (conv output), Δ; (T, N) B, C;
    (T, E) y (the scan's output before the gate, D·u included)."""

    u: Tensor
    delta: Tensor
    B: Tensor
    C: Tensor
    y: Tensor


@dataclass
class MambaState:
    """Per layer: the last d_conv − 1 inputs of the convolution (B, E, d_conv − 1) and the scan state (B, E, N)."""

    conv: list[Tensor | None] = field(default_factory=list)
    ssm: list[Tensor | None] = field(default_factory=list)


class Mixer(nn.Module):
    def __init__(self, c: MambaConfig) -> None:
        super().__init__()
        e, n = c.d_inner, c.d_state
        self.c = c
        self.in_proj = nn.Linear(c.d_model, 2 * e, bias=c.bias)
        self.conv1d = nn.Conv1d(e, e, c.d_conv, groups=e, padding=c.d_conv - 1, bias=c.conv_bias)
        self.x_proj = nn.Linear(e, c.rank + 2 * n, bias=False)
        self.dt_proj = nn.Linear(c.rank, e, bias=True)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, n + 1, dtype=torch.float32)).repeat(e, 1))
        self.D = nn.Parameter(torch.ones(e))
        self.out_proj = nn.Linear(e, c.d_model, bias=c.bias)

    def select(self, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """u (B, T, E) -> Δ (B, T, E), B (B, T, N), C (B, T, N): the input-dependent (selective) parameters."""
        r, n = self.c.rank, self.c.d_state
        dt, b, c = self.x_proj(u).split([r, n, n], dim=-1)
        return F.softplus(self.dt_proj(dt)), b, c

    def forward(self, x: Tensor, state: MambaState | None = None, layer: int = 0,
                trace: list[MixerTrace] | None = None) -> Tensor:
        """x (B, T, D) -> (B, T, D). ``state``: continue from (and update) the cached convolution inputs and scan
        state (generation); ``trace``: append this call's MixerTrace (batch row 0)."""
        bsz, t, _ = x.shape
        u, z = self.in_proj(x).chunk(2, dim=-1)  # (B, T, E) each
        u = u.transpose(1, 2)  # (B, E, T)
        past = state.conv[layer] if state is not None else None
        if past is not None:  # the convolution continues over the cached last d_conv − 1 inputs
            full = torch.cat([past, u], dim=-1)
            u = F.conv1d(full, self.conv1d.weight, self.conv1d.bias, groups=self.c.d_inner)[..., -t:]
        else:
            full = u
            u = self.conv1d(u)[..., :t]  # padding d_conv − 1 on both sides: the first t outputs are causal
        if state is not None:
            keep = self.c.d_conv - 1
            state.conv[layer] = F.pad(full, (max(0, keep - full.size(-1)), 0))[..., -keep:]
        u = F.silu(u).transpose(1, 2)  # (B, T, E)
        delta, b, c = self.select(u)
        a = -torch.exp(self.A_log.float())  # (E, N)
        s = state.ssm[layer] if state is not None and state.ssm[layer] is not None else \
            x.new_zeros(bsz, self.c.d_inner, self.c.d_state)
        # s_t = exp(Δ_t A) ⊙ s_{t−1} + (Δ_t u_t) B_t ;  y_t = s_t C_t. The decays and inputs of every position are
        # computed at once and the loop does one fused multiply-add per position over unbound views (whose backward
        # is one stack): indexing [:, i] in the loop made training 8x slower on a CPU (each index's backward
        # allocates a whole (B, T, E, N) gradient).
        decay = torch.exp(delta[..., None] * a)  # (B, T, E, N): Ā
        inp = (delta * u)[..., None] * b[:, :, None, :]  # (B, T, E, N): B̄ u
        states = []
        for decay_i, inp_i in zip(decay.unbind(1), inp.unbind(1), strict=True):
            s = torch.addcmul(inp_i, decay_i, s)
            states.append(s)
        y = torch.einsum("bten,btn->bte", torch.stack(states, 1), c) + u * self.D  # (B, T, E)
        if state is not None:
            state.ssm[layer] = s
        if trace is not None:
            trace.append(MixerTrace(u[0], delta[0], b[0], c[0], y[0]))
        return self.out_proj(y * F.silu(z))


class MambaBlock(nn.Module):
    def __init__(self, c: MambaConfig) -> None:
        super().__init__()
        self.norm = RMSNorm(c.d_model, c.norm_eps)
        self.mixer = Mixer(c)

    def forward(self, x: Tensor, state: MambaState | None, layer: int, trace: list[MixerTrace] | None) -> Tensor:
        return x + self.mixer(self.norm(x), state, layer, trace)


@dataclass
class MambaForward:
    logits: Tensor  # (B, T, V)
    hidden: list[Tensor] = field(default_factory=list)  # the stream before each block and after the last
    traces: list[MixerTrace] = field(default_factory=list)  # per layer, with keep_trace


def implicit_attention(trace: MixerTrace, a: Tensor, channel: int | None = None, chunk: int = 0,
                       channels: Sequence[int] | None = None) -> Tensor:
    """α (E', T, T) of one layer (Ali et al. 2024, eq. 12): α[d, t, j] = Σ_n C_t[n] exp(A[d, n](S_t[d] − S_j[d]))
    Δ_j[d] B_j[n] for j ≤ t, 0 above the diagonal; A (E, N) = −exp(A_log). ``channel``: that channel alone (E' = 1);
    ``channels``: those; else every channel (E' = E), computed ``chunk`` channels at a time ((chunk, T, T, N) at
    once; 0: as many as ALPHA_FLOATS allows)."""
    t = trace.u.size(0)
    chunk = chunk or max(1, ALPHA_FLOATS // (t * t * trace.B.size(1)))
    chans = [channel] if channel is not None else list(channels) if channels is not None else \
        list(range(trace.u.size(1)))
    s = torch.cumsum(trace.delta, 0)  # (T, E): S_t
    causal = torch.ones(t, t, dtype=torch.bool, device=trace.u.device).tril()
    out = []
    for start in range(0, len(chans), chunk):
        d = chans[start : start + chunk]
        gap = (s[:, d].T[:, :, None] - s[:, d].T[:, None, :]).clamp_min(0)  # (d, T, T): S_t − S_j, ≥ 0 for j ≤ t
        decay = torch.exp(a[d][:, None, None, :] * gap[..., None])  # (d, T, T, N)
        alpha = torch.einsum("tn,dtjn,jn->dtj", trace.C, decay, trace.B) * trace.delta[:, d].T[:, None, :]
        out.append(alpha.masked_fill(~causal, 0.0))
    return torch.cat(out)


def heatmap(alpha: Tensor) -> Tensor:
    """|α| (E', T, T) averaged over channels, each row divided by its sum: (T, T) rows summing to 1, as attention's."""
    m = alpha.abs().mean(0)
    return m / m.sum(-1, keepdim=True).clamp_min(1e-30)


class Mamba(RecurrentLM):
    """Embedding -> Mamba blocks -> RMSNorm -> output projection (tied to the embedding by default)."""

    IMPLICIT = "Mamba: |α|, channels averaged"  # what its maps are, in the titles and notes that draw them
    NOT_APPLICABLE = NOT_APPLICABLE  # what the head views say for it (tabs.sections.text.require_heads)
    NO_HEAD_MASK = "Mamba has no attention heads to switch off"

    def __init__(self, config: MambaConfig, tokenizer: Any | None = None) -> None:
        super().__init__()
        self.config = c = config
        self.tokenizer = tokenizer
        self.labels: list[str] = []
        self.text: dict = {}
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.blocks = nn.ModuleList(MambaBlock(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.d_model, c.norm_eps)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, ids: Tensor, state: MambaState | None = None, keep_hidden: bool = False,
                keep_trace: bool = False, last_only: bool = False) -> MambaForward:
        """ids (B, T), continuing ``state`` if given (updated in place)."""
        x = self.embed(ids)
        hidden: list[Tensor] = []
        traces: list[MixerTrace] | None = [] if keep_trace else None
        for i, block in enumerate(self.blocks):
            if keep_hidden:
                hidden.append(x)
            x = block(x, state, i, traces)
        if keep_hidden:
            hidden.append(x)
        if last_only:
            x = x[:, -1:]
        return MambaForward(self.lm_head(self.norm(x)), hidden, traces or [])

    # ------------------------------------------------------------------ the hooks of RecurrentLM
    def _new_state(self) -> MambaState:
        n = self.config.n_layers
        return MambaState([None] * n, [None] * n)

    def _mapped(self, x: Tensor) -> tuple[MambaForward, np.ndarray]:
        out = self(x, keep_trace=True)
        return out, self._maps(out.traces)

    def _a(self, layer: int) -> Tensor:
        return -torch.exp(self.blocks[layer].mixer.A_log.float())

    def map_channels(self) -> list[int]:
        """The channels the averaged map reads: all E, or MAP_CHANNELS of them evenly spaced (the cost, above)."""
        e = self.config.d_inner
        return list(range(e)) if e <= MAP_CHANNELS else np.linspace(0, e - 1, MAP_CHANNELS).round().astype(int).tolist()

    def _maps(self, traces: list[MixerTrace], channel: int | None = None) -> np.ndarray:
        """(L, 1, T, T) float32: each layer's implicit-attention heatmap (``heatmap``)."""
        chans = None if channel is not None else self.map_channels()
        maps = [heatmap(implicit_attention(tr, self._a(i), channel, channels=chans))[None]
                for i, tr in enumerate(traces)]
        return np.stack([m.float().cpu().numpy() for m in maps]).astype(np.float32)

    @torch.no_grad()
    def implicit_attention(self, ids: Sequence[int], channel: int | None = None) -> np.ndarray:
        """(L, 1, T, T): every layer's implicit attention over ``ids``, channels averaged or one ``channel``."""
        if channel is not None and not 0 <= channel < self.config.d_inner:
            raise ValueError(f"channel {channel} is outside 0..{self.config.d_inner - 1}")
        return self._maps(self(self._ids(ids), keep_trace=True).traces, channel)
