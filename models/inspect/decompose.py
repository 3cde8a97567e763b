"""Why a head attends: one pre-softmax attention score split into the parts of the residual stream.

The residual stream entering a layer is a sum of parts: the token embedding, the position embedding (models
with learned or sinusoidal positions), every earlier head's output (through its slice of the output
projection), every earlier feed-forward block's output, and the constant terms (biases, LayerNorm shifts)
gathered as ``bias``. The query of position i and the key of position j are affine in that stream once each
LayerNorm / RMSNorm is frozen at the scale it computed on the real input (Elhage et al. 2021, "A Mathematical
Framework for Transformer Circuits", §"Freezing attention patterns"; the standard simplification of
TransformerLens' ``decompose_resid``), so

    s_ij = q_i · k_j / √d_k = Σ_a Σ_b q_i(a) · k_j(b) / √d_k

exactly, one term per (query part a, key part b). Post-norm layers (BERT, post-norm classifiers) freeze each
LayerNorm on the way, so every part keeps being carried through them. RoPE rotates every part of q_i by
position i and every part of k_j by position j (linear), so the same split holds for LLaMA-family models;
``content`` is the score with the rotation removed (both at offset 0) and ``by_offset`` the score the same
q_i and k_j would get at every offset i − j (RoFormer §3.4.2: RoPE scores depend on the offset only).

Only the positions asked about are split (i and j); the stream itself is computed
for all positions, in float64, from the model's own modules. The whole row of scores comes from the same
walk, so softmax(row) reproduces the attention the model returns (tests/test_decompose.py, every family).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from models.inspect.walk import BIAS, Attn, Plan, _rotate, plan
from models.io.bigmodel import weight


# ------------------------------------------------------------------------------------------ the stream
class Stream:
    """The residual stream: ``total`` (T, D) at every position and its ``parts`` (C, P, D) at the P positions
    ``at``, float64; the parts sum to ``total[at]``. Part 0 is always ``bias`` (every constant term)."""

    def __init__(self, total: Tensor, at: Sequence[int]) -> None:
        self.at = list(at)
        self.total = total
        self.names = [BIAS]
        self.parts = total.new_zeros(1, len(self.at), total.size(-1))

    def add(self, name: str, full: Tensor) -> None:
        """Add ``full`` (T, D) to the stream as the part ``name`` (``bias``: into the constant part)."""
        self.total = self.total + full
        if name == BIAS:
            self.parts[0] = self.parts[0] + full[self.at]
        else:
            self.names.append(name)
            self.parts = torch.cat([self.parts, full[self.at][None]])

    def merge(self, other: Stream) -> None:
        """Add a stream of the same positions (a sub-block's output carried through its own frozen norm): its
        constant part into ``bias``, its other parts as parts of their own."""
        self.total = self.total + other.total
        self.parts = torch.cat([self.parts, other.parts[1:]])
        self.parts[0] = self.parts[0] + other.parts[0]
        self.names = self.names + other.names[1:]

    def projected(self, linear: nn.Linear) -> Stream:
        """The stream through a Linear layer: each part by W, the bias into the constant part (linear exactly)."""
        out = Stream.__new__(Stream)
        out.at, out.names = self.at, list(self.names)
        w = linear.weight.double()
        out.total = self.total @ w.T
        out.parts = self.parts @ w.T
        if linear.bias is not None:
            out.total = out.total + linear.bias.double()
            out.parts[0] = out.parts[0] + linear.bias.double()
        return out

    def normed(self, norm: nn.Module) -> Stream:
        """The stream after ``norm`` (LayerNorm or RMSNorm), its scale frozen at the one computed on ``total``."""
        x = self.total
        g = weight(norm)  # an accelerate-offloaded norm's too (models/io/bigmodel.py)
        gain = g.double().to(x.device) if g is not None else torch.ones_like(x[0])
        eps = float(getattr(norm, "eps", 1e-5))
        out = Stream.__new__(Stream)
        out.at, out.names = self.at, list(self.names)
        if isinstance(norm, nn.LayerNorm):
            sd = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)  # (T, 1)
            b = weight(norm, "bias")
            bias = b.double().to(x.device) if b is not None else torch.zeros_like(gain)
            out.total = (x - x.mean(-1, keepdim=True)) / sd * gain + bias
            out.parts = (self.parts - self.parts.mean(-1, keepdim=True)) / sd[self.at] * gain
            out.parts[0] = out.parts[0] + bias
        elif type(norm).__name__ == "RMSNorm":  # models.families.gpt.RMSNorm: x / rms(x) · g
            rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
            out.total, out.parts = x / rms * gain, self.parts / rms[self.at] * gain
        else:
            raise TypeError(f"cannot freeze a {type(norm).__name__}")
        return out


def _scores(attn: Attn, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Full scores (H, T, T) (masked −inf), weights and values (H, T, d) from the normed stream x (T, D)."""
    t = x.size(0)
    pos = range(t)
    q = attn.queries(x, pos, bias=True)
    k = attn.keys(x, pos, bias=True).repeat_interleave(attn.group(), 0)
    v = attn.heads(x, attn.v, attn.kv_heads, bias=True).repeat_interleave(attn.group(), 0)
    s = q @ k.transpose(-1, -2) * attn.score_scale
    if attn.causal:
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    if attn.window:  # a local layer: keys at or before i − window are masked too
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=s.device).tril(-attn.window), float("-inf"))
    return s, torch.softmax(s, -1), v


def _start(p: Plan, at: Sequence[int]) -> Stream:
    t, d = p.embed[0][1].shape
    stream = Stream(p.embed[0][1].new_zeros(t, d), at)
    for name, value in p.embed:
        if name == "__norm__":  # BERT's embedding LayerNorm
            stream = stream.normed(value)
        elif name == "__linear__":  # factorised embeddings' projection E -> d (ALBERT, ELECTRA)
            stream = stream.projected(value)
        else:
            stream.add(name, value)
    return stream


def _finish(stream: Stream, attn: Attn, after: tuple, heads_out: Tensor, layer: int) -> Stream:
    """Add the layer's head outputs (H, T, D), the output bias, then the feed-forward block (and post-norms)."""
    if after[0] == "sandwich":  # x + norm(Σ heads + b), its scale frozen; then x + norm'(FF(norm2(x)))
        _, post, norm2, ff = after
        sub = Stream(stream.total.new_zeros(stream.total.shape), stream.at)
        for h in range(attn.n_heads):
            sub.add(f"L{layer}H{h}", heads_out[h])
        o_bias = weight(attn.o, "bias")
        if o_bias is not None:
            sub.add(BIAS, o_bias.double().to(sub.total.device).expand_as(sub.total))
        stream.merge(sub.normed(post))
        stream.add(f"L{layer} MLP", ff(stream.normed(norm2).total))
        return stream
    for h in range(attn.n_heads):
        stream.add(f"L{layer}H{h}", heads_out[h])
    o_bias = weight(attn.o, "bias")
    if o_bias is not None:
        stream.add(BIAS, o_bias.double().to(stream.total.device).expand_as(stream.total))
    if after[0] == "pre":  # x + FF(norm2(x))
        _, norm2, ff = after
        _add_ff(stream, layer, ff(stream.normed(norm2).total))
        return stream
    _, norm1, ff, norm2 = after  # norm2(y + FF(y)), y = norm1(x + attention)
    stream = stream.normed(norm1)
    stream.add(f"L{layer} MLP", ff(stream.total))
    return stream.normed(norm2)


def _add_ff(stream: Stream, layer: int, out) -> None:
    """The feed-forward block's output as one part, ``L{layer} MLP``; a mixture of experts' as one part per expert
    that wrote anything (``L{layer} E{e}``, a list of (name, (T, D)) from its walk), which sum to the block's output."""
    if isinstance(out, list):
        for name, value in out:
            stream.add(f"L{layer} {name}", value)
    else:
        stream.add(f"L{layer} MLP", out)


def _head_outputs(attn: Attn, weights: Tensor, v: Tensor) -> Tensor:
    """Each head's write into the residual stream, (H, T, D): (A_h V_h) W_O[:, h]ᵀ, without the output bias."""
    d = attn.d_head
    w_o = weight(attn.o).double().to(v.device).view(attn.o.out_features, attn.n_heads, d)  # (D, H, d)
    return torch.einsum("htd,ehd->hte", weights @ v, w_o)


# --------------------------------------------------------------------------------------------- results
@dataclass(frozen=True)
class ScoreDecomposition:
    """One attention score s = q_i·k_j/√d_k split into (query part, key part) terms that sum to it."""

    layer: int
    head: int
    query: int
    key: int
    score: float  # the pre-softmax score the model computed (the walk's own, equal within float error)
    parts: list[str]  # names of the residual-stream parts, ``bias`` first
    table: np.ndarray  # (C, C) float64: table[a, b] = q_i(a)·k_j(b)/√d_k, summing to ``score``
    row: np.ndarray  # (T,) the query's pre-softmax scores over every key (masked: −inf)
    softmax_row: np.ndarray  # (T,) softmax(row): the attention row the model returns
    content: float | None = None  # RoPE: the score with the rotation removed (q and k both at offset 0)
    by_offset: np.ndarray | None = None  # RoPE: the same q_i, k_j scored at offsets 0..T−1 (true one: i − j)
    sink_renormalised: np.ndarray | None = None  # (T,) the row without key 0, rescaled to sum to 1

    def components(self, limit: int | None = None) -> list[dict]:
        """The terms largest |value| first, as ``{query_part, key_part, value}``; with ``limit``, the rest
        are summed into one last term (``other``), so the list still sums to ``score``."""
        order = np.argsort(-np.abs(self.table), axis=None)
        rows = [{"query_part": self.parts[a], "key_part": self.parts[b], "value": float(self.table[a, b])}
                for a, b in zip(*np.unravel_index(order, self.table.shape))]
        if limit is not None and len(rows) > limit:
            rest = sum(r["value"] for r in rows[limit:])
            rows = rows[:limit] + [{"query_part": f"other ({len(rows) - limit} terms)", "key_part": "other",
                                    "value": float(rest)}]
        return rows


def n_layers(model: nn.Module) -> int:
    """The self-attention layers a decomposition walks: the translator's encoder, every other model's stack."""
    return int(model.config.n_layers)  # the translator's: its encoder's


def _check(model: nn.Module, ids: Sequence[int], layer: int, head: int, query: int, key: int) -> int:
    layers, heads, t = n_layers(model), int(model.config.n_heads), len(ids)
    if t < 1:
        raise ValueError("the input is empty")
    if not 0 <= layer < layers:
        raise ValueError(f"layer {layer} is outside 0..{layers - 1}")
    if not 0 <= head < heads:
        raise ValueError(f"head {head} is outside 0..{heads - 1}")
    if not 0 <= query < t:
        raise ValueError(f"query {query} is outside the {t} tokens (0..{t - 1})")
    if not 0 <= key < t:
        raise ValueError(f"key {key} is outside the {t} tokens (0..{t - 1})")
    return t


def _walk(p: Plan, at: Sequence[int]):
    """Layer by layer: (layer, its attention, the stream entering it (normed for pre-norm layers), the scores and
    weights), the stream then carried on through the layer; parts are kept at the positions ``at``."""
    stream = _start(p, at)
    for i, (attn, after) in enumerate(p.layers):
        inp = stream.normed(attn.norm) if attn.norm is not None else stream
        scores, weights, v = _scores(attn, inp.total)
        yield i, attn, inp, scores, weights
        stream = _finish(stream, attn, after, _head_outputs(attn, weights, v), i)


@torch.no_grad()
def decompose_score(model: nn.Module, ids: Sequence[int], layer: int, head: int, query: int,
                    key: int) -> ScoreDecomposition:
    """Split the score of ``head`` in ``layer`` from token ``query`` to token ``key`` by residual parts.

    ids: the token ids exactly as the model sees them (BOS / [CLS] included). Raises ValueError for a
    layer, head or position outside the model or the input, and for a masked cell (a causal model's key
    after its query).
    """
    t = _check(model, ids, layer, head, query, key)
    p = plan(model, ids)
    attn0 = p.layers[layer][0]
    if attn0.causal and key > query:
        raise ValueError(f"key {key} comes after query {query}: a causal model masks that cell (score −inf)")
    if attn0.window and query - key >= attn0.window:
        raise ValueError(f"key {key} is outside layer {layer}'s sliding window of {attn0.window} tokens before "
                         f"query {query}: the model masks that cell (score −inf)")
    for i, attn, inp, scores, weights in _walk(p, [query, key]):
        if i == layer:
            return _split(attn, inp, scores, weights, layer, head, query, key, t)
    raise AssertionError("unreachable")


def _split(attn: Attn, inp: Stream, scores: Tensor, weights: Tensor, layer: int, head: int, query: int, key: int,
           t: int) -> ScoreDecomposition:
    kv = head // attn.group()
    scale = attn.score_scale
    parts = inp.parts  # (C, P, D)
    # q/k norms (Qwen3, Gemma 3) frozen at the scale they compute on the whole stream: then q (and k) stay a sum of
    # the parts' projections, each divided by the same per-head RMS
    rms = {"q": attn.head_rms(inp.total[query : query + 1], "q"), "k": attn.head_rms(inp.total[key : key + 1], "k")}

    def project(fn, col: int, pos: int, rotate: bool = True) -> Tensor:
        # every part projected without the layer's bias, the bias part with it: the parts sum to q (or k)
        r = rms["q" if fn == attn.queries else "k"]
        plain = fn(parts[:, col : col + 1], [pos], bias=False, rotate=rotate, rms=r)
        with_bias = fn(parts[:1, col : col + 1], [pos], bias=True, rotate=rotate, rms=r)
        return torch.cat([with_bias, plain[1:]])  # (C, heads, 1, d)

    def key_parts(rotate: bool) -> Tensor:
        return project(attn.keys, 1, key, rotate)[:, kv, 0]  # (C, d)

    q = project(attn.queries, 0, query)[:, head, 0]  # (C, d)
    table = (q @ key_parts(True).T * scale).cpu().numpy()
    row = scores[head, query].cpu().numpy()
    soft = weights[head, query].cpu().numpy()
    content = by_offset = None
    if attn.angles is not None:
        q0 = project(attn.queries, 0, query, rotate=False)[:, head, 0].sum(0)  # (d,)
        k0 = key_parts(False).sum(0)
        content = float(q0 @ k0 * scale)
        qs = _rotate(q0.expand(t, -1), attn.angles[:t], attn.layout)  # q at offsets 0..T−1 from an unrotated k
        by_offset = (qs @ k0 * scale).cpu().numpy()
    renorm = None
    if t > 1 and np.isfinite(row[1:]).any():
        rest = soft.copy()
        rest[0] = 0.0
        total = rest.sum()
        renorm = rest / total if total > 0 else None
    return ScoreDecomposition(layer, head, query, key, float(row[key]), list(inp.names), table, row, soft,
                              content, by_offset, renorm)


@torch.no_grad()
def attention_scores(model: nn.Module, ids: Sequence[int]) -> np.ndarray:
    """Every layer's pre-softmax scores (layers, heads, T, T), float32, masked cells −inf."""
    from models import registry

    if registry.family_of(model).split == "disentangled":  # DeBERTa: its own three-term scores (no walk)
        from models.families.deberta import pre_softmax_scores

        return pre_softmax_scores(model, ids).float().cpu().numpy()
    if getattr(model.config, "family", "") == "t5":  # T5: q·k + the relative position bias, its own (no walk)
        from models.families.t5 import pre_softmax_scores as t5_scores

        return t5_scores(model, ids).float().cpu().numpy()
    return np.stack([scores.float().cpu().numpy() for _, _, _, scores, _ in _walk(plan(model, ids), [])])
