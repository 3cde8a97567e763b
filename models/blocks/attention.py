"""Scaled dot-product attention written out, multi-head attention with a fused and an explicit path,
the mask builders, and interventions (activation patching, key ablation) passed as forward arguments.

Masks are boolean with True = "may attend" (the convention of ``F.scaled_dot_product_attention``),
broadcastable to (B, H, T, S).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def scaled_dot_product(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, bias: Tensor | None = None,
    scale: float | None = None, softcap: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """softmax(QKᵀ/√d_k + bias, masked) · V (Vaswani et al. 2017, eq. 1).

    q: (..., T, d), k: (..., S, d), v: (..., S, d_v); mask: bool broadcastable to (..., T, S), True keeps;
    bias: additive, broadcastable to (..., T, S) (relative position bias, Swin's −100 shift mask).
    softcap: scaled scores z -> softcap · tanh(z / softcap) before the bias and the mask (Gemma 2); 0: none.
    Returns (out (..., T, d_v), weights (..., T, S)). A row whose keys are all masked gets zeros
    instead of NaN. Half-precision q and k are scored in float32 and the weights returned in float32 (A·V then in
    the values' dtype, as transformers' eager attention).
    """
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    half = q.dtype in (torch.float16, torch.bfloat16)
    if half:  # scores, softmax and the returned weights in float32 whatever the weights' dtype (ATLAS_DTYPE)
        q, k = q.float(), k.float()
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., T, S)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = torch.nan_to_num(weights, nan=0.0)
    return (weights.to(v.dtype) if half else weights) @ v, weights


# ----------------------------------------------------------------------------------------------------
# Mask builders: bool, True = may attend, broadcastable to (B, H, T, S)


def padding_mask(lengths_or_pad: Tensor, max_len: int | None = None) -> Tensor | None:
    """Key-padding mask (B, 1, 1, S), True on real tokens; None when no key is padding, so that the fused
    kernel runs without a mask (the encoders of bert.py, classifier.py and transformer.py build theirs here).

    Accepts either lengths (B,) of integer dtype, or a bool (B, S) tensor that is True on PADDING
    (the ``key_padding_mask`` convention of ``nn.MultiheadAttention``).
    """
    if lengths_or_pad.dtype == torch.bool:
        if lengths_or_pad.dim() != 2:
            raise ValueError(f"pad mask must be (B, S), got {tuple(lengths_or_pad.shape)}")
        keep = ~lengths_or_pad
    else:
        lengths = lengths_or_pad.long()
        s = int(lengths.max()) if max_len is None else max_len
        keep = torch.arange(s, device=lengths.device)[None, :] < lengths[:, None]  # (B, S)
    if bool(keep.all()):
        return None
    return keep[:, None, None, :]


def causal_mask(t: int, s: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Causal mask (T, S), True where key j ≤ query i (Vaswani et al. 2017, §3.2.3).

    With S > T the T queries are the LAST T positions of S (decoding with a cache): query i sits at
    absolute position S − T + i.
    """
    s = t if s is None else s
    i = torch.arange(t, device=device)[:, None] + (s - t)
    j = torch.arange(s, device=device)[None, :]
    return j <= i


# ----------------------------------------------------------------------------------------------------
# Interventions: what one forward pass changes, given as an argument (never hooks or switched flags on the
# shared model, docs/ARCHITECTURE.md §2). models/inspect/patching.py builds them for activation patching and sink
# ablation; the attention modules and the layer loops of GPT, TextClassifier and BertClassifier apply them.


@dataclass(frozen=True, eq=False)
class LayerEdit:
    """What changes in one layer. Every part is optional; a value tensor and its selector come together.

    - ``head_values`` (1 or B, H, T, d_head) with ``head_select`` bool (B, H): the per-head attention output
      (softmax(QKᵀ)V, before the output projection) of head h in batch row b is replaced by the value where
      ``head_select[b, h]`` (after any ``head_mask``);
    - ``resid_values`` (1 or B, T, D) with ``resid_select`` bool (B, T): the residual stream entering the
      layer is replaced at the selected (row, position)s;
    - ``forbid`` bool (H, S) (or fewer key columns; the rest stay allowed), True = head h may NOT attend to
      key s: masked before the softmax, so that key gets weight 0 and the row renormalises over the rest.
      A query left with no key at all (query 0 of a causal model when key 0 is forbidden) keeps its
      original keys instead: forbidding never makes a row empty (no NaN), it only moves weight elsewhere.
    """

    head_values: Tensor | None = None  # (1 or B, H, T, d_head)
    head_select: Tensor | None = None  # (B, H) bool
    resid_values: Tensor | None = None  # (1 or B, T, D)
    resid_select: Tensor | None = None  # (B, T) bool
    forbid: Tensor | None = None  # (H, S) bool, True = may not attend
    recording: Recording | None = None  # set by ``bind`` for one forward pass when asked to record

    def __post_init__(self) -> None:
        for values, select, name in ((self.head_values, self.head_select, "head"),
                                     (self.resid_values, self.resid_select, "resid")):
            if (values is None) != (select is None):
                raise ValueError(f"{name}_values and {name}_select come together")
            if select is not None and select.dtype != torch.bool:
                raise ValueError(f"{name}_select must be bool, got {select.dtype}")
        if self.forbid is not None and (self.forbid.dtype != torch.bool or self.forbid.dim() != 2):
            raise ValueError(f"forbid must be bool (heads, keys), got {self.forbid.dtype} {tuple(self.forbid.shape)}")


@dataclass
class Recording:
    """Filled during one forward pass, one entry per layer in order: ``heads`` (B, H, T, d_head), each
    layer's per-head attention output as it went into the output projection (after any edit), and
    ``residual`` (B, T, D), the residual stream entering each layer (after any edit)."""

    heads: list[Tensor] = field(default_factory=list)
    residual: list[Tensor] = field(default_factory=list)


@dataclass(frozen=True, eq=False)
class Intervention:
    """The ``edit`` argument of ``GPT.forward`` and of the text classifiers' forward passes: a ``LayerEdit``
    per layer index, and whether to record every layer's per-head outputs and residual input (returned by
    the forward pass: ``Forward.heads`` / ``EditedForward``). Plain data: reusable and safe to share."""

    layers: Mapping[int, LayerEdit] = field(default_factory=dict)
    record: bool = False


def bind(edit: Intervention | None, n_layers: int) -> tuple[list[LayerEdit | None], Recording]:
    """Per layer the edit to apply in this forward pass, and the (fresh) recording it fills."""
    rec = Recording()
    if edit is None:
        return [None] * n_layers, rec
    bad = [i for i in edit.layers if not 0 <= i < n_layers]
    if bad:
        raise ValueError(f"edit names layers {bad}, the model has {n_layers}")
    edits: list[LayerEdit | None] = []
    for i in range(n_layers):
        e = edit.layers.get(i)
        edits.append(replace(e or LayerEdit(), recording=rec) if edit.record else e)
    return edits, rec


def enter_layer(x: Tensor, edit: LayerEdit | None) -> Tensor:
    """The residual stream x (B, T, D) entering a layer, with the edit's positions replaced (and recorded)."""
    if edit is None:
        return x
    if edit.resid_select is not None and edit.resid_values is not None:  # on x's device (a dispatched layer's)
        x = torch.where(edit.resid_select.to(x.device)[:, :, None], edit.resid_values.to(x.device, x.dtype), x)
    if edit.recording is not None:
        edit.recording.residual.append(x)
    return x


def restrict_keys(mask: Tensor | None, edit: LayerEdit | None, t: int, s: int,
                  device: torch.device) -> Tensor | None:
    """mask (bool, True = may attend, broadcastable to (B, H, T, S), or None) without the edit's forbidden
    keys: (…, H, T, S). Rows that would be left with no key keep the original mask."""
    if edit is None or edit.forbid is None:
        return mask
    forbid = edit.forbid.to(device)
    if forbid.size(1) < s:  # fewer key columns given: the later keys stay allowed
        forbid = F.pad(forbid, (0, s - forbid.size(1)))
    base = torch.ones(t, s, dtype=torch.bool, device=device) if mask is None else mask
    keep = base & ~forbid[:, None, :]  # (…, H, T, S)
    return torch.where(keep.any(-1, keepdim=True), keep, base)


def edit_heads(out: Tensor, edit: LayerEdit | None) -> Tensor:
    """Per-head attention output (B, H, T, d_head) with the edit's heads replaced (and recorded)."""
    if edit is None:
        return out
    if edit.head_select is not None and edit.head_values is not None:
        out = torch.where(edit.head_select.to(out.device)[:, :, None, None], edit.head_values.to(out.device, out.dtype),
                          out)
    if edit.recording is not None:
        edit.recording.heads.append(out)
    return out


# ----------------------------------------------------------------------------------------------------
# The two attention paths, chosen in one place for every model (MultiHeadAttention here, gpt.CausalSelfAttention)


def attend(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, bias: Tensor | None = None,
    need_weights: bool = False, dropout: float = 0.0, scale: float | None = None, softcap: float = 0.0,
) -> tuple[Tensor, Tensor | None]:
    """Attention over per-head q (B, H, T, d), k and v (B, H_kv, S, d): (out (B, H, T, d), weights or None).

    ``need_weights``: the explicit ``scaled_dot_product``, returning the weights (B, H, T, S); dropout (training)
    applies to the probabilities that multiply V, the returned weights stay undropped. Otherwise the fused
    ``F.scaled_dot_product_attention`` (training and plain inference), with the bias and the mask folded into one
    additive mask. A row whose keys are all masked gives zeros on both paths. With fewer key/value heads than query
    heads (grouped-query attention, Ainslie et al. 2023) query head h reads key/value head h // (H / H_kv).
    ``scale`` multiplies QKᵀ (None: 1/√d; T5 scores unscaled, 1.0). ``softcap`` (Gemma 2's attention soft-capping)
    takes the explicit path whether or not the weights are asked for (the fused kernel has no such step).
    """
    if k.size(-3) != q.size(-3):
        group = q.size(-3) // k.size(-3)
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    if need_weights or softcap:
        out, weights = scaled_dot_product(q, k, v, mask=mask, bias=bias, scale=scale, softcap=softcap)
        if dropout > 0:  # dropout on the attention probabilities (Vaswani et al. 2017, §5.4)
            out = F.dropout(weights, dropout, training=True) @ v
        return out, weights if need_weights else None
    attn_mask: Tensor | None = mask
    if bias is not None:  # one additive mask: bias where allowed, −inf where masked
        attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout, scale=scale)
    if mask is not None:  # rows with every key masked: zeros, as the explicit path gives
        out = torch.nan_to_num(out, nan=0.0)
    return out, None


# ----------------------------------------------------------------------------------------------------
# Multi-head attention (Vaswani et al. 2017, §3.2.2)


@dataclass
class KVCache:
    """Keys and values of one attention module for incremental decoding, (B, H, S, d_head) each.

    Self-attention: the step's new k, v are appended (``static=False``). Cross-attention: k, v are
    projected once from the encoder memory and reused at every step (``static=True``).
    """

    k: Tensor | None = None  # (B, H, S, d_head)
    v: Tensor | None = None  # (B, H, S, d_head)
    static: bool = False  # True for cross-attention: never appended to

    @property
    def length(self) -> int:
        return 0 if self.k is None else int(self.k.size(2))

    def extend(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Self-attention: append the new positions' keys and values (B, H, T, d_head) and return every cached
        one, (B, H, S, d_head) with S = the earlier length + T."""
        if self.k is not None and self.v is not None:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` (B',) of the batch: beam search follows each survivor's parent."""
        if self.k is not None and self.v is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    Separate q/k/v/out projections (easy to read and to map from other implementations). ``attend`` chooses the
    path: ``need_weights=False`` the fused kernel (training and plain inference), ``need_weights=True``
    ``scaled_dot_product`` written out, also returning the weights. ``d_head``: a head width of its own (T5's d_kv:
    heads × d_head need not be d_model); ``scale``: the score scale (None: 1/√d_head; T5: 1.0).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True,
                 d_head: int | None = None, scale: float | None = None) -> None:
        super().__init__()
        if d_head is None and d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads = d_model, n_heads
        self.d_head = d_model // n_heads if d_head is None else d_head
        self.scale = scale
        inner = n_heads * self.d_head
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, inner, bias=bias)
        self.k_proj = nn.Linear(d_model, inner, bias=bias)
        self.v_proj = nn.Linear(d_model, inner, bias=bias)
        self.out_proj = nn.Linear(inner, d_model, bias=bias)

    def _split(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, H, T, d_head)
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_head).transpose(1, 2)

    def project_kv(self, kv: Tensor) -> KVCache:
        """Project encoder memory (B, S, D) once into a static cross-attention cache."""
        return KVCache(self._split(self.k_proj(kv)), self._split(self.v_proj(kv)), static=True)

    def forward(
        self,
        x: Tensor,
        kv: Tensor | None = None,
        mask: Tensor | None = None,
        need_weights: bool = False,
        bias: Tensor | None = None,
        rope: nn.Module | None = None,
        cache: KVCache | None = None,
        edit: LayerEdit | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """x: queries (B, T, D); kv: keys/values source (B, S, D), None for self-attention.

        mask: bool, True = may attend, broadcastable to (B, H, T, S); bias: additive float, same
        broadcasting (relative position bias); rope: a ``RotaryEmbedding`` applied to q and k at their
        absolute positions; cache: a ``KVCache`` (self-attention: appended; static: reused, ``kv`` may
        then be None); edit: forbidden keys and replaced head outputs (``LayerEdit``).
        Returns (out (B, T, D), weights (B, H, T, S) or None).
        """
        b, t, _ = x.shape
        q = self._split(self.q_proj(x))  # (B, H, T, d_head)
        offset = cache.length if cache is not None and not cache.static else 0
        if cache is not None and cache.static:
            if cache.k is None:
                if kv is None:
                    raise ValueError("an empty cross-attention cache needs the memory `kv`")
                projected = self.project_kv(kv)
                cache.k, cache.v = projected.k, projected.v
            k, v = cache.k, cache.v
        else:
            src = x if kv is None else kv
            k, v = self._split(self.k_proj(src)), self._split(self.v_proj(src))  # (B, H, S, d_head)
            if rope is not None:
                k = rope(k, offset)
            if cache is not None:
                k, v = cache.extend(k, v)
        if rope is not None:
            q = rope(q, offset)
        assert k is not None and v is not None
        mask = restrict_keys(mask, edit, t, k.size(2), x.device)
        out, weights = attend(q, k, v, mask, bias, need_weights, self.dropout if self.training else 0.0, self.scale)
        out = edit_heads(out, edit)
        out = out.transpose(1, 2).reshape(b, t, self.n_heads * self.d_head)  # (B, T, H·d_head)
        return self.out_proj(out), weights
