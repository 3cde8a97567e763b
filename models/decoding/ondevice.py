"""Generation with attention for long prompts and large models: attention kept on the model's device as what
produces it, never as the (L, H, T, T) array (issue 52, "8 B on one GPU").

``GPT.generate`` and ``models.decoding.fastgen`` return every attention weight as one numpy array: 32 layers × 32
heads × 4,126² cells for a LLaMA-3-8B shape after a 4,096-token prompt is 17 G weights (35 GB in float16), more
than the model's own 16 GB of bfloat16 weights; transformers' ``generate(output_attentions=True)`` keeps the same on
the GPU. A figure needs far less: pooled tiles for the overview (≤ 64 × 64 cells a head), the zoomed block, a clicked
row. So this module keeps, per layer, on the model's device:

- ``q`` (H, T, d): every position's query after RoPE, in the model's dtype;
- ``k`` (H_kv, T, d): its keys after RoPE (the KV cache's keys: no extra memory);
- ``lse`` (H, T) float32: each row's log-sum-exp of the scaled, causally masked scores,

and any attention weight is then exact on demand: a_ij = exp(q_i·k_j/√d − lse_i) for j ≤ i (Vaswani et al. 2017,
eq. 1, the softmax written with its normaliser; the same identity FlashAttention's backward pass uses, Dao et al.
2022, §3.1). The cost is 1/T of the array per layer (d + 1 numbers per row and head instead of T).

The passes compute scores, softmax and the log-sum-exp in float32 whatever the weights' dtype (the weights are cast
back to the values' dtype for A·V, as transformers' eager attention does), a chunk of query rows at a time
(``ATTENTION_CHUNK_BYTES`` of float32 scores), so the prompt pass never holds (H, T, T) either; a prompt chunk's
scores cover only the keys up to its last row (causal), and half-precision q and k are multiplied with a float32
accumulator (their products are exact in float32). The pooled tiles (max and mean, the blocks of
``viz.common.block_edges`` for prompt + new tokens) are accumulated on the device by the prompt pass from the
weights it has at hand, the new tokens' rows added after decoding (``_Tiles``; made again should the generation
stop early); only they, the step candidates and the surprisal leave the device. ``DeviceAttention.block``/``row``
move one zoomed block or row; ``full()`` materialises everything (tests, short inputs), which is what
``LongGeneration.result()`` uses to give the app's ``GenerationResult``.

What it computes is what ``KNOWS`` lists of the block description (models/blocks/decoder.py): ``supports`` refuses any
other model, whose request then takes ``GPT.generate``. Every module is called through its own ``forward`` (norms,
projections, feed-forward block), so a model dispatched
across devices by accelerate (``models/io/bigmodel.py``) runs here unchanged: each hook moves the stream to its
layer's device, and each layer's q, k and lse stay where that layer runs.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from models import limits
from models.blocks.decoder import Knows, count, empty, flag, off, one_of, spec_of, zero
from models.blocks.decoder import refusal as spec_refusal
from models.blocks.layers import ACTIVATIONS
from models.blocks.loop import Decoding
from models.blocks.positional import ROPE_LAYOUTS, apply_rope
from models.io.bigmodel import execution_device as _device
from models.outputs import AttentionMap, GenerationResult, GenerationStep

ATTENTION_CHUNK_BYTES = 256 << 20  # float32 scores of one chunk of query rows (all heads × all keys)
LOGIT_CHUNK = 256  # prompt rows sent through the output projection at once (surprisal)
POOL_CELLS = 64  # pooled tiles: at most this many cells a side, as the app's model view

# What ``_Run`` computes, field by field of the block description (models/blocks/decoder.py): the norms and the
# feed-forward (any kind, experts too) through their own modules; anything else is refused (``supports``).
KNOWS: Knows = {
    "positions": one_of("rope", "learned"), "embed_scale": zero, "final_softcap": zero, "prefix_lm": off,
    "residual": one_of("sequential", "parallel"), "norm": one_of("rmsnorm", "layernorm"), "sandwich": off,
    "qkv_bias": flag, "o_bias": flag, "rope": one_of("none", "full", "partial"), "rotary_dim": count,
    "rope_layout": one_of(*ROPE_LAYOUTS), "local_rope": off, "qk_norm": flag, "window": zero, "attn_scale": zero,
    "attn_softcap": zero, "ff": one_of("gated", "mlp", "experts"), "ff_act": one_of(*ACTIVATIONS), "ff_bias": flag,
    "experts": count, "experts_per_token": count,
    "mrope_section": empty}


def refusal(model) -> str | None:
    """None when this module computes what ``model.generate`` computes; else why not, in words."""
    spec = spec_of(model)
    if spec is None:
        return f"{type(model).__name__} has no decoder block description"
    return spec_refusal(spec, KNOWS, "the on-device path")


def supports(model) -> bool:
    return refusal(model) is None


def _project(block, spec, h: Tensor, t: int, cos_sin: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor, Tensor]:
    """A block's queries (H, T, d), keys and values (H_kv, T, d) of the normed stream h (T, D): the projections, the
    per-head q/k norms (before RoPE), RoPE over the first rotary_dim dimensions."""
    attn, c = block.attn, block.attn.c
    q = attn.q_proj(h).view(t, c.n_heads, c.d_head).transpose(0, 1)
    k = attn.k_proj(h).view(t, c.kv_heads, c.d_head).transpose(0, 1)
    v = attn.v_proj(h).view(t, c.kv_heads, c.d_head).transpose(0, 1)
    if spec.qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    if cos_sin is not None:
        q = apply_rope(q, None, spec.rope_layout, cos_sin, rotary_dim=spec.rotary_dim)
        k = apply_rope(k, None, spec.rope_layout, cos_sin, rotary_dim=spec.rotary_dim)
    return q, k, v


def _after_attention(block, spec, x: Tensor, a: Tensor) -> Tensor:
    """The block's output from its input x and its attention's output a (after o_proj): the residual as described."""
    return x + a + block.ff(block.norm2(x if spec.residual == "parallel" else x + a))


def block_edges(n: int, max_cells: int) -> np.ndarray:
    """Edges of equal blocks splitting ``n`` into ``ceil(n / ceil(n / max_cells))`` (``viz.common.block_edges``)."""
    factor = max(1, int(np.ceil(n / max_cells)))
    return np.minimum(np.arange(int(np.ceil(n / factor)) + 1) * factor, n)


def _column_tiles(e: Tensor, f: int) -> tuple[Tensor, Tensor]:
    """Max and sum of ``e`` (h, r, c), non-negative, over column blocks of ``f`` (the last one cut at c): two
    (h, r, ceil(c / f)) tensors, read from ``e`` in place (no padded copy of the chunk)."""
    c = e.size(-1)
    whole = c // f * f
    maxes, sums = [], []
    if whole:
        blocks = e[..., :whole].unflatten(-1, (whole // f, f))  # a view: (h, r, c // f, f)
        maxes.append(blocks.amax(-1))
        sums.append(blocks.sum(-1))
    if c > whole:
        maxes.append(e[..., whole:].amax(-1, keepdim=True))
        sums.append(e[..., whole:].sum(-1, keepdim=True))
    return torch.cat(maxes, -1), torch.cat(sums, -1)


class _Tiles:
    """The model view's pooled tiles (max and sum over the blocks of ``block_edges(T, cells)``) accumulated a chunk
    of rows at a time, per layer on its device: the prompt pass adds its rows while their weights are at hand, the
    new tokens' rows are added after decoding (max and sum over a block split between the two: the max of the
    parts' maxes, the sum of their sums). Masked cells are zeros (weights ≥ 0, so the zeros of the start and of any
    padding never raise a max)."""

    def __init__(self, t: int, cells: int, heads: int, devices: Sequence[torch.device]) -> None:
        self.t, self.edges = t, block_edges(t, cells)
        self.f, n = int(self.edges[1] - self.edges[0]), len(self.edges) - 1
        self.max = [torch.zeros(heads, n, n, device=dev) for dev in devices]
        self.sum = [torch.zeros(heads, n, n, device=dev) for dev in devices]

    def add(self, layer: int, r0: int, col_max: Tensor, col_sum: Tensor) -> None:
        """Rows r0.. of ``layer``, given as their column-block max and sum (h, r, c_blocks)."""
        f = self.f
        h, r, nc = col_max.shape
        front = r0 % f  # rows of the first block before r0 (another chunk's): zeros here
        back = -(front + r) % f
        m = torch.nn.functional.pad(col_max, (0, 0, front, back)).view(h, -1, f, nc).amax(2)
        s = torch.nn.functional.pad(col_sum, (0, 0, front, back)).view(h, -1, f, nc).sum(2)
        b0 = r0 // f
        span = (slice(None), slice(b0, b0 + m.size(1)), slice(0, nc))
        torch.maximum(self.max[layer][span], m, out=self.max[layer][span])
        self.sum[layer][span] += s

    def result(self) -> dict[str, np.ndarray]:
        """{"max", "mean"} -> (L, H, R, C) float32 numpy (one copy from each layer's device)."""
        sizes = torch.from_numpy(np.diff(self.edges).astype(np.float32))
        area = sizes[:, None] * sizes[None, :]
        maxes = [m.cpu() for m in self.max]
        means = [s.cpu() / area for s in self.sum]
        return {"max": torch.stack(maxes).numpy(), "mean": torch.stack(means).numpy()}


@dataclass
class DeviceAttention:
    """Per layer q (H, T, d), k (H_kv, T, d) after RoPE and lse (H, T) float32, each on its layer's device."""

    q: list[Tensor]
    k: list[Tensor]
    lse: list[Tensor]
    length: int  # T: rows (and keys) in use
    pooled: dict[str, np.ndarray] = field(default_factory=dict)  # "max"/"mean" -> (L, H, R, C) float32
    edges: np.ndarray | None = None  # block edges of the pooled tiles (rows and columns alike)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return len(self.q), self.q[0].size(0), self.length, self.length

    def _weights(self, layer: int, rows: Tensor, cols: slice, heads: slice = slice(None)) -> Tensor:
        """a (h, r, c) float32 on the layer's device for query positions ``rows`` (r,) and keys ``cols``."""
        q, k, lse = self.q[layer][heads], self.k[layer], self.lse[layer][heads]
        h, kv = self.q[layer].size(0), k.size(0)
        group = h // kv
        heads_idx = torch.arange(h, device=q.device)[heads]
        keys = k[heads_idx // group, cols].float()  # (h, c, d): each query head's key head
        scale = 1.0 / math.sqrt(q.size(-1))
        s = torch.matmul(q[:, rows].float(), keys.transpose(1, 2)) * scale  # (h, r, c)
        key_pos = torch.arange(cols.start or 0, (cols.start or 0) + keys.size(1), device=q.device)
        s = s.masked_fill(key_pos[None, None, :] > rows[None, :, None], float("-inf"))  # causal (§3.2.3)
        return torch.exp(s - lse[:, rows, None])

    def block(self, layer: int, rows: slice, cols: slice, heads: slice = slice(None)) -> np.ndarray:
        """The weights of ``heads`` for query rows and key columns (slices), (h, r, c) float32 numpy: exact."""
        dev = self.q[layer].device
        r = torch.arange(*rows.indices(self.length), device=dev)
        c0, c1, _ = cols.indices(self.length)
        return self._weights(layer, r, slice(c0, c1), heads).cpu().numpy()

    def row(self, layer: int, head: int, query: int) -> np.ndarray:
        """One attention row (T,) float32: query ``query``'s weights over every key."""
        return self.block(layer, slice(query, query + 1), slice(0, self.length), slice(head, head + 1))[0, 0]

    def full(self) -> np.ndarray:
        """Every weight (L, H, T, T) on the CPU, as ``GPT.generate`` returns it (``gpt.attention_array``): float32,
        or float16 above ``limits.LONG_TOKENS`` tokens; filled a layer at a time into one array."""
        t = self.length
        long = t > limits.LONG_TOKENS
        out = np.empty(self.shape, np.float16 if long else np.float32)
        for i in range(len(self.q)):
            w = self._weights(i, torch.arange(t, device=self.q[i].device), slice(0, t))
            out[i] = (w.half() if long else w).cpu().numpy()
        return out

    def pool(self, max_cells: int = POOL_CELLS) -> None:
        """The tiles of the model view, max and mean over ``block_edges`` blocks (masked cells count as zeros), per
        layer on its device from q, k and lse; sets ``pooled`` and ``edges``. (``generate`` accumulates them during
        its passes instead, ``_Tiles``; this recomputes them, e.g. for another number of cells.)"""
        t = self.length
        tiles = _Tiles(t, max_cells, self.q[0].size(0), [q.device for q in self.q])
        f = tiles.f
        for layer in range(len(self.q)):
            dev = self.q[layer].device
            h = self.q[layer].size(0)
            rows_per = max(f, (ATTENTION_CHUNK_BYTES // max(1, 4 * h * t)) // f * f)  # whole row blocks
            for r0 in range(0, t, rows_per):
                r1 = min(t, r0 + rows_per)
                w = self._weights(layer, torch.arange(r0, r1, device=dev), slice(0, t))  # (H, r, T)
                tiles.add(layer, r0, *_column_tiles(w, f))
        self.pooled, self.edges = tiles.result(), tiles.edges

    def add_rows(self, tiles: _Tiles, r0: int) -> None:
        """Rows r0..T of every layer into ``tiles`` (the new tokens' rows, after the prompt's)."""
        for layer in range(len(self.q)):
            w = self._weights(layer, torch.arange(r0, self.length, device=self.q[layer].device), slice(0, self.length))
            tiles.add(layer, r0, *_column_tiles(w, tiles.f))

    def nbytes(self) -> int:
        """Bytes kept: every layer's q, k and lse (k is the cache's own, kept with the result)."""
        return sum(x.numel() * x.element_size() for x in (*self.q, *self.k, *self.lse))

    def upto(self, t: int) -> DeviceAttention:
        """The attention of the first ``t`` tokens (a replayed step): causal, so their rows and keys are the first
        ``t`` of these, views of the same tensors (the pooled tiles only where ``t`` is the whole length)."""
        if t >= self.length:
            return self
        return DeviceAttention(self.q, self.k, self.lse, t)

    def to(self, device: str | torch.device) -> DeviceAttention:
        """The same attention with q, k and lse on ``device`` (a ZeroGPU Space hands its results back on the CPU)."""
        t = self.length
        return DeviceAttention([q[:, :t].to(device) for q in self.q], [k[:, :t].to(device) for k in self.k],
                               [x[:, :t].to(device) for x in self.lse], t, self.pooled, self.edges)

    def _heads(self, layer: int, head: Head) -> tuple[slice, bool]:
        """The heads ``_weights`` computes for ``head`` (an index: that one alone) and whether they are fused."""
        if head is None or head in ("mean", "max"):
            return slice(None), head is not None
        h = int(head)
        if not 0 <= h < self.q[layer].size(0):
            raise ValueError(f"head {h} is not one of the layer's {self.q[layer].size(0)} heads")
        return slice(h, h + 1), False

    def _rows_per(self, layer: int, width: int, multiple: int = 1) -> int:
        """Query rows a chunk (a multiple of ``multiple``): their float32 weights of every head over ``width``
        keys within ``ATTENTION_CHUNK_BYTES``."""
        per = ATTENTION_CHUNK_BYTES // max(1, 4 * self.q[layer].size(0) * width)
        return max(multiple, per // multiple * multiple)

    def _span(self, rows: tuple[int, int] | None, cols: tuple[int, int] | None) -> tuple[int, int, int, int]:
        (r0, r1), (c0, c1) = rows or (0, self.length), cols or (0, self.length)
        if not (0 <= r0 < r1 <= self.length and 0 <= c0 < c1 <= self.length):
            raise ValueError(f"the block queries {r0}…{r1 - 1} × keys {c0}…{c1 - 1} is not inside the map's "
                             f"{self.length} tokens (or is empty)")
        return r0, r1, c0, c1

    def fused(self, layer: int, head: Head, rows: tuple[int, int] | None = None,
              cols: tuple[int, int] | None = None) -> np.ndarray:
        """The weights of queries rows[0] … rows[1] − 1 and keys cols[0] … cols[1] − 1 (default: all) of one head
        (r, c), their mean or max over the heads ("mean", "max": fused on the device, only (r, c) leaves it), or
        every head (None: (H, r, c)); float32 numpy, exact (``viz.attention.select_head`` of the full array)."""
        r0, r1, c0, c1 = self._span(rows, cols)
        heads, fuse = self._heads(layer, head)
        dev = self.q[layer].device
        parts, step = [], self._rows_per(layer, c1 - c0)
        for a in range(r0, r1, step):
            w = self._weights(layer, torch.arange(a, min(r1, a + step), device=dev), slice(c0, c1), heads)
            parts.append(_fuse(w, head) if fuse else w)
        out = torch.cat(parts, 1).cpu().numpy()
        return out if head is None else out[0]

    def tiles(self, layer: int, head: Head, cells: int, how: str = "max", rows: tuple[int, int] | None = None,
              cols: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``viz.common.pool_blocks`` of ``fused(layer, head, rows, cols)`` computed on the device a chunk of rows
        at a time: (pooled float32 numpy, row edges, column edges), the edges relative to the block's start; a
        fused head's (r, c) tiles, every head's (H, r, c) for ``head`` None. Only the tiles leave the device."""
        if how not in ("max", "mean"):
            raise ValueError(f"pooling must be max or mean, got {how!r}")
        r0, r1, c0, c1 = self._span(rows, cols)
        re, ce = block_edges(r1 - r0, cells), block_edges(c1 - c0, cells)
        fr, fc = int(re[1] - re[0]), int(ce[1] - ce[0])
        if fr == fc == 1:  # nothing to pool: the weights themselves
            return self.fused(layer, head, (r0, r1), (c0, c1)), re, ce
        heads, fuse = self._heads(layer, head)
        dev = self.q[layer].device
        n_heads = 1 if fuse else self.q[layer][heads].size(0)
        maxes = torch.zeros(n_heads, len(re) - 1, len(ce) - 1, device=dev)
        sums = torch.zeros_like(maxes)
        step = self._rows_per(layer, c1 - c0, fr)
        for a in range(r0, r1, step):  # whole row blocks a chunk: each block's rows in one chunk
            b = min(r1, a + step)
            w = self._weights(layer, torch.arange(a, b, device=dev), slice(c0, c1), heads)
            col_max, col_sum = _column_tiles(_fuse(w, head) if fuse else w, fc)  # (h, r, blocks)
            back = -(b - a) % fr  # the last block's missing rows: zeros
            i = (a - r0) // fr
            m = torch.nn.functional.pad(col_max, (0, 0, 0, back)).unflatten(1, (-1, fr)).amax(2)
            maxes[:, i : i + m.size(1)] = m
            sums[:, i : i + m.size(1)] = torch.nn.functional.pad(col_sum, (0, 0, 0, back)).unflatten(1, (-1, fr)).sum(2)
        if how == "max":
            out = maxes
        else:
            area = torch.from_numpy(np.outer(np.diff(re), np.diff(ce)).astype(np.float32)).to(dev)
            out = sums / area
        out = out.cpu().numpy()
        return (out if head is None else out[0]), re, ce

    def lines(self, layer: int, heads: Sequence[int], threshold: float, max_segments: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, int]:
        """The head view's lines of ``layer``: every (head, query, key) of ``heads`` whose weight ≥ ``threshold``,
        or, when more than ``max_segments`` pass, the strongest ``max_segments`` of them (``viz.attention.
        strongest_lines`` of the full array), selected on the device a chunk of rows at a time. Returns (j, qi,
        ki, weights, threshold drawn, how many passed when there were too many, else 0), j indexing ``heads``,
        sorted by (j, qi, ki)."""
        t, dev = self.length, self.q[layer].device
        heads = [int(h) for h in heads]
        # consecutive heads (one, or all) are computed alone; any other choice from all of the layer's
        run = heads == list(range(heads[0], heads[0] + len(heads))) if heads else False
        span = slice(heads[0], heads[0] + len(heads)) if run else slice(None)
        pick = None if run else torch.tensor(heads, device=dev)
        flat: list[Tensor] = []
        vals: list[Tensor] = []
        passed = 0

        def strongest(keep: int) -> None:
            f, v = torch.cat(flat), torch.cat(vals)
            top = torch.topk(v, keep).indices
            flat[:], vals[:] = [f[top]], [v[top]]

        step = self._rows_per(layer, t)
        for a in range(0, t, step):
            b = min(t, a + step)
            w = self._weights(layer, torch.arange(a, b, device=dev), slice(0, t), span)  # (h, r, T)
            w = w if pick is None else w[pick]
            hit = w >= threshold
            j, r, k = hit.nonzero(as_tuple=True)
            passed += int(j.numel())
            flat.append((j * t + r + a) * t + k)
            vals.append(w[j, r, k])
            if sum(x.numel() for x in flat) > 4 * max_segments:
                strongest(max_segments)
        thr, raised = float(threshold), 0
        if passed > max_segments:
            strongest(max_segments)
            raised = passed
        f, v = torch.cat(flat), torch.cat(vals)
        order = torch.argsort(f)
        f, v = f[order].cpu().numpy(), v[order].cpu().numpy()
        if raised:
            thr = float(v.min())
        return f // (t * t), f // t % t, f % t, v, thr, raised


Head = int | str | None  # one head, "mean" or "max" of the heads, or (None) every head


def _fuse(w: Tensor, head: Head) -> Tensor:
    """(H, r, c) weights -> (1, r, c): their mean or max over the heads."""
    return w.mean(0, keepdim=True) if head == "mean" else w.amax(0, keepdim=True)


# The most bytes ``DeviceMap.weights`` materialises on the CPU (every weight, for the .npz and the comparison's
# arrays): ATLAS_ARRAYS_MAX_MB, default 4,096 (a 12 × 12-head model over 2,048 tokens in float16 takes 1.2 GB; an
# 8 B model's 32 × 32 heads over 4,126 tokens would take 35 GB).
ARRAYS_MAX_MB = max(1, int(os.environ.get("ATLAS_ARRAYS_MAX_MB", "4096")))


class ArraysTooLarge(ValueError):
    """Every weight of a device-side map would not fit under ``ARRAYS_MAX_MB`` on the CPU."""


@dataclass
class DeviceMap:
    """An ``AttentionMap`` (layers, heads, queries, keys) whose weights stay on the model's device as q, k and lse
    (``DeviceAttention``): the Generate tab draws from it, each figure moving only what it shows (tabs/common.py
    ``attention_figure``). ``weights`` materialises every weight on the CPU, for the .npz and the comparison."""

    attention: DeviceAttention
    queries: list[str]
    keys: list[str]

    @property
    def layers(self) -> int:
        return len(self.attention.q)

    @property
    def heads(self) -> int:
        return int(self.attention.q[0].size(0))

    @property
    def nbytes(self) -> int:
        return self.attention.nbytes()

    @property
    def weights(self) -> np.ndarray:
        layers, heads, t, _ = self.attention.shape
        size = layers * heads * t * t * (2 if t > limits.LONG_TOKENS else 4)
        if size > ARRAYS_MAX_MB << 20:
            raise ArraysTooLarge(
                f"Every attention weight ({layers} layers × {heads} heads × {t:,}² tokens) would take "
                f"{size / 2**30:.1f} GB on the server, over its limit of {ARRAYS_MAX_MB:,} MB (ATLAS_ARRAYS_MAX_MB): "
                "use a shorter prompt, or the zoom, which reads any block at full resolution.")
        return self.attention.full()

    def upto(self, t: int) -> DeviceMap:
        """The map of the first ``t`` tokens (a replayed step)."""
        return DeviceMap(self.attention.upto(t), self.queries[:t], self.keys[:t])

    def to(self, device: str | torch.device) -> DeviceMap:
        return DeviceMap(self.attention.to(device), self.queries, self.keys)


@dataclass
class LongGeneration:
    """What ``generate`` returns: ``GenerationResult``'s fields, with the attention kept on the device."""

    text: str
    tokens: list[str]
    ids: list[int]
    prompt_len: int
    steps: list[GenerationStep]
    surprisal: np.ndarray  # bits per token (T,), NaN first
    attention: DeviceAttention
    notice: str = ""
    decoding: str = "pass"  # how the new tokens ran: "pass", "fixed" or "graph" (``generate``'s ``steps``)
    timings: dict[str, float] = field(default_factory=dict)  # ms of each part (``_Clock``: CUDA events on a GPU)

    def result(self) -> GenerationResult:
        """The app's ``GenerationResult`` with every weight materialised (only where T is small enough)."""
        weights = self.attention.full()
        return GenerationResult(text=self.text, tokens=self.tokens, ids=self.ids, prompt_len=self.prompt_len,
                                attention={"decoder": AttentionMap(weights, self.tokens, list(self.tokens))},
                                steps=self.steps, surprisal=self.surprisal, notice=self.notice)

    def kept(self) -> GenerationResult:
        """The app's ``GenerationResult`` with the attention left on the device (``DeviceMap``)."""
        return GenerationResult(text=self.text, tokens=self.tokens, ids=self.ids, prompt_len=self.prompt_len,
                                attention={"decoder": DeviceMap(self.attention, self.tokens, list(self.tokens))},  # type: ignore[dict-item]
                                steps=self.steps, surprisal=self.surprisal, notice=self.notice)


_HALF = (torch.float16, torch.bfloat16)
_HALF_SCORES: list[str] = []  # how _scores multiplies half-precision operands on this build (decided once)


def _scores(q: Tensor, kt: Tensor, scale: float) -> Tensor:
    """Scaled scores q·kᵀ/√d (B, m, c) float32 for q (B, m, d) and kᵀ (B, d, c). Half-precision operands (bfloat16
    or float16 queries and keys) are multiplied by a half-precision matrix product that returns its float32
    accumulator (``out_dtype``, CUDA): the products of two such numbers are exact in float32 (at most 22
    significant bits), so these are the float32 scores of the same numbers, summed in another order, at the
    tensor cores' speed. Elsewhere, or where the build lacks it, float32 operands and product."""
    if q.dtype in _HALF and q.is_cuda and kt.dtype == q.dtype and "float" not in _HALF_SCORES:
        try:
            s = torch.bmm(q, kt, out_dtype=torch.float32)
            if not _HALF_SCORES:
                _HALF_SCORES.append("half")
            return s.mul_(scale)
        except (RuntimeError, TypeError):
            _HALF_SCORES.append("float")
    return torch.matmul(q.float(), kt.float()).mul_(scale)


# the prompt's attention output by F.scaled_dot_product_attention: "on", "auto" (half-precision weights) or "off"
# (from the chunks' weights). Off by default: on an H200 (LLaMA-3-8B shape, bfloat16, docs/device-h200-gen8b.json)
# it saved 2 % after 4,096 prompt tokens (0.951 s against 0.968 s: the chunk pass makes the lse and tiles either
# way), and after 512 tokens its prompt pass took 1.17 s against 0.06 s (a set-up per new length, by the look of it).
FUSED_OUTPUT = "off"


def _fused_output(q: Tensor) -> bool:
    return FUSED_OUTPUT == "on" or (FUSED_OUTPUT == "auto" and q.dtype in _HALF)


class _Run:
    """One generation's buffers: per layer the keys and values (H_kv, n, d), queries (H, n, d), lse (H, n)."""

    def __init__(self, model, n: int) -> None:
        self.model, self.c = model, model.config
        c = self.c
        self.dtype = model.embed.weight.dtype if model.embed.weight.device.type != "meta" else \
            next(p.dtype for p in model.blocks[0].parameters())
        self.devices = [_device(b) for b in model.blocks]
        d = c.d_head
        self.n = n
        # keys in float32 (the scores' dtype: no conversion of the whole cache at every step), values as the weights;
        # zeros, so that the fixed-shape step (``step``) multiplies its masked weights by zeros, never by stale memory
        self.k = [torch.zeros(c.kv_heads, n, d, device=dev, dtype=torch.float32) for dev in self.devices]
        self.v = [torch.zeros(c.kv_heads, n, d, device=dev, dtype=self.dtype) for dev in self.devices]
        self.q = [torch.empty(c.n_heads, n, d, device=dev, dtype=self.dtype) for dev in self.devices]
        self.lse = [torch.empty(c.n_heads, n, device=dev, dtype=torch.float32) for dev in self.devices]
        self.angles = model.angles if model.positions is None else None
        self.tiles: _Tiles | None = None  # the pooled tiles, accumulated by the prompt pass (``generate``)

    def layers(self, ids: Tensor, start: int) -> Tensor:
        """Tokens ``ids`` (T,) at positions start.. through every block; their residual stream (T, D)."""
        model, c = self.model, self.c
        t = ids.numel()
        end = start + t
        x = model.embed(ids)
        if model.positions is not None:
            x = x + model.positions(torch.arange(start, end, device=ids.device))
        h_q, d = c.n_heads, c.d_head
        rows_per = max(1, ATTENTION_CHUNK_BYTES // (4 * h_q * end))
        rope: dict[torch.device, tuple[Tensor, Tensor]] = {}  # per device: cos and sin of this pass's angles
        for i, (block, spec) in enumerate(zip(model.blocks, model.spec.blocks)):
            dev = self.devices[i]
            x = x.to(dev)
            if self.angles is not None and dev not in rope:  # RoPE at the absolute positions start..end-1
                angles = self.angles[start:end].to(dev)
                rope[dev] = (angles.cos().to(self.dtype), angles.sin().to(self.dtype))
            q, k, v = _project(block, spec, block.norm1(x), t, rope.get(dev))  # (H, T, d), (H_kv, T, d) twice
            self.q[i][:, start:end] = q
            self.k[i][:, start:end] = k
            self.v[i][:, start:end] = v
            if start == 0 and t > 1:  # the prompt: its own keys only, causal within
                out = self._prompt_attention(i, q, k, v)
            else:
                out = self._attend(i, q, start, end, rows_per)
            x = _after_attention(block, spec, x, block.attn.o_proj(out.transpose(0, 1).reshape(t, h_q * d)))
        return x

    def _attend(self, i: int, q: Tensor, start: int, end: int, rows_per: int) -> Tensor:
        """Layer ``i``'s attention output (H, T, d) for queries ``q`` (H, T, d) at positions start..end − 1 over
        the buffers' keys 0..end − 1 (written already), the scores in float32 a chunk of rows at a time; writes
        each row's lse. (The new tokens of ``steps="pass"``.)"""
        c = self.c
        h_q, h_kv, d = c.n_heads, c.kv_heads, c.d_head
        group = h_q // h_kv
        scale = 1.0 / math.sqrt(d)
        t = end - start
        dev = q.device
        keys = self.k[i][:, :end].transpose(1, 2)  # (H_kv, d, S) float32
        values = self.v[i][:, :end]  # (H_kv, S, d)
        out = torch.empty(h_q, t, d, device=dev, dtype=q.dtype)
        for r0 in range(0, t, rows_per):
            r1 = min(t, r0 + rows_per)
            r = r1 - r0
            # query heads h·group .. h·group + group − 1 share key/value head h: (H_kv, group·r, d)
            qg = q[:, r0:r1].float().reshape(h_kv, group * r, d)
            s = torch.matmul(qg, keys).mul_(scale).view(h_q, r, end)  # (H, r, S) float32
            if start + r0 < end - 1:  # causal: keys after a query's position masked (none for a lone last row)
                pos = torch.arange(start + r0, start + r1, device=dev)
                s.masked_fill_(torch.arange(end, device=dev)[None, None, :] > pos[None, :, None], float("-inf"))
            lse = torch.logsumexp(s, -1)  # (H, r)
            self.lse[i][:, start + r0 : start + r1] = lse
            w = torch.exp(s.sub_(lse[..., None]))  # softmax, in place of the scores
            out[:, r0:r1] = torch.matmul(w.to(values.dtype).view(h_kv, group * r, end), values).view(h_q, r, d)
        return out

    def _prompt_attention(self, i: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Layer ``i``'s attention output (H, T, d) for a prompt's q (H, T, d), k, v (H_kv, T, d) at positions
        0..T − 1, writing each row's lse and, with ``self.tiles``, adding the rows to the pooled tiles: one pass of
        float32 scores a chunk of query rows at a time, over the keys up to the chunk's last row only (causal).

        The scores of half-precision q and k are their exact products summed in float32 (``_scores``). The output
        is A·V from the chunk's weights (cast to the values' dtype, as transformers' eager attention and the other
        passes here), or with ``FUSED_OUTPUT`` ``F.scaled_dot_product_attention`` (a fused kernel), the chunk pass
        then making only the lse and tiles."""
        c = self.c
        h_q, h_kv, d = c.n_heads, c.kv_heads, c.d_head
        group, t, dev = h_q // h_kv, q.size(1), q.device
        scale = 1.0 / math.sqrt(d)
        fused = _fused_output(q)
        out = None
        if fused:  # each query head with its key/value head (h // group): (1, H, T, d)
            kk, vv = (x.repeat_interleave(group, 0)[None] for x in (k, v))
            out = torch.nn.functional.scaled_dot_product_attention(q[None], kk, vv, is_causal=True)[0]
        else:
            out = torch.empty(h_q, t, d, device=dev, dtype=v.dtype)
        tiles = self.tiles
        f = tiles.f if tiles is not None else 1
        rows_per = max(1, ATTENTION_CHUNK_BYTES // (4 * h_q * t))
        rows_per = max(f, rows_per // f * f)  # whole row blocks of the tiles
        keys = k.transpose(1, 2) if q.dtype in _HALF else self.k[i][:, :t].transpose(1, 2)  # (H_kv, d, T)
        for r0 in range(0, t, rows_per):
            r1 = min(t, r0 + rows_per)
            r = r1 - r0
            # query heads h·group .. h·group + group − 1 share key/value head h: (H_kv, group·r, d)
            qg = q[:, r0:r1].reshape(h_kv, group * r, d)
            s = _scores(qg, keys[..., :r1], scale).view(h_q, r, r1)  # (H, r, r1) float32: keys ≤ the last row
            later = torch.ones(r, r, dtype=torch.bool, device=dev).triu_(1)  # causal (§3.2.3): keys after the row
            s[..., r0:r1].masked_fill_(later, float("-inf"))
            top = s.amax(-1, keepdim=True)  # (H, r, 1): every row has its own key, so finite
            e = s.sub_(top).exp_()  # exp(s − max), in place of the scores
            if tiles is not None:
                col_max, col_sum = _column_tiles(e, f)  # (H, r, blocks)
                total = col_sum.sum(-1, keepdim=True)  # (H, r, 1): the softmax's denominator
                tiles.add(i, r0, col_max / total, col_sum / total)  # a row's weights are e / total
            else:
                total = e.sum(-1, keepdim=True)
            self.lse[i][:, r0:r1] = (top + total.log())[..., 0]  # log Σ exp(s) = max + log Σ exp(s − max)
            if not fused:
                w = torch.div(e, total, out=torch.empty(e.shape, dtype=v.dtype, device=dev))  # softmax, cast
                w = w.view(h_kv, group * r, r1)
                out[:, r0:r1] = torch.matmul(w, v[:, :r1]).view(h_q, r, d)
        return out

    def prepare_step(self) -> None:
        """Tables for ``step``: cos and sin of every position in the weights' dtype, and the key positions."""
        dev = self.devices[0]
        if self.angles is not None:
            a = self.angles[: self.n].to(dev)
            self.cos, self.sin = a.cos().to(self.dtype), a.sin().to(self.dtype)
        self.key_pos = torch.arange(self.n, device=dev)

    def step(self, token: Tensor, pos: Tensor) -> Tensor:
        """One new token ``token`` (1,) at position ``pos`` (1,), both device tensors, through every block with
        shapes that do not depend on the position (every key of the buffers, the later ones masked), so that a
        CUDA graph can replay it at each step (``_Steps``); the logits (1, V). The same numbers as ``layers``."""
        model, c = self.model, self.c
        h_q, h_kv, d, n = c.n_heads, c.kv_heads, c.d_head, self.n
        group = h_q // h_kv
        scale = 1.0 / math.sqrt(d)
        x = model.embed(token)  # (1, D)
        if model.positions is not None:
            x = x + model.positions(pos)
        later = self.key_pos > pos  # (n,): keys after this position
        cos_sin = (self.cos.index_select(0, pos), self.sin.index_select(0, pos)) if self.angles is not None else None
        for i, (block, spec) in enumerate(zip(model.blocks, model.spec.blocks)):
            q, k, v = _project(block, spec, block.norm1(x), 1, cos_sin)  # (H, 1, d), (H_kv, 1, d) twice
            self.q[i].index_copy_(1, pos, q)
            self.k[i].index_copy_(1, pos, k.float())
            self.v[i].index_copy_(1, pos, v)
            s = torch.matmul(q.float().reshape(h_kv, group, d), self.k[i].transpose(1, 2)).mul_(scale)
            s = s.view(h_q, 1, n).masked_fill_(later, float("-inf"))  # (H, 1, n) float32
            lse = torch.logsumexp(s, -1)  # (H, 1)
            self.lse[i].index_copy_(1, pos, lse)
            w = torch.exp(s.sub_(lse[..., None]))
            out = torch.matmul(w.to(self.v[i].dtype).view(h_kv, group, n), self.v[i]).view(h_q, 1, d)
            x = _after_attention(block, spec, x, block.attn.o_proj(out.transpose(0, 1).reshape(1, h_q * d)))
        return self.logits(x)

    def logits(self, x: Tensor) -> Tensor:
        model = self.model
        h = model.norm(x.to(_device(model.norm)))
        return model.lm_head(h.to(_device(model.lm_head)))


class _Steps:
    """The decoding steps through ``_Run.step``: on a CUDA device captured once as a CUDA graph and replayed at every
    step (a step of an 8 B model is ~2,000 small kernels, whose launches cost more than their work), else run as
    they are. A capture that fails falls back to running the step (``graphed`` says which ran)."""

    def __init__(self, run: _Run, device: torch.device, capture: bool) -> None:
        self.run, self.capture = run, capture and device.type == "cuda"
        run.prepare_step()
        self.token = torch.zeros(1, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: Tensor | None = None
        self.graphed = False

    def __call__(self, token: int, pos: int) -> Tensor:
        """The logits (V,) float32 after ``token`` at ``pos`` (its q, k, v and lse written into the run)."""
        self.token.fill_(token)
        self.pos.fill_(pos)
        if self.capture and self.graph is None:
            try:
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):  # warm-up: writes this position, as the replay below does again
                    self.run.step(self.token, self.pos)
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    self.out = self.run.step(self.token, self.pos)
                self.graph, self.graphed = graph, True
            except Exception:  # any capture failure: run the steps as they are
                torch.cuda.synchronize()
                self.capture = False
        if self.graph is not None:
            self.graph.replay()
            assert self.out is not None
            return self.out[0].float().clone()  # the graph's buffer is overwritten by the next replay
        return self.run.step(self.token, self.pos)[0].float()


class _Clock:
    """Where a generation's time goes: CUDA events on a CUDA device (read once at the end: no synchronisation in
    between), else the host clock. ``ms()``: {part: milliseconds since the previous mark}."""

    def __init__(self, dev: torch.device) -> None:
        self.cuda = dev.type == "cuda"
        self.marks: list[tuple[str, object]] = [("start", self._now())]

    def _now(self) -> object:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def mark(self, name: str) -> None:
        self.marks.append((name, self._now()))

    def ms(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
        out = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            out[name] = round(a.elapsed_time(b) if self.cuda else (b - a) * 1e3, 2)  # type: ignore[union-attr,operator]
        return out


@torch.inference_mode()
def generate(model, text: str | Sequence[int], max_new_tokens: int = 20, strategy: str = "greedy",
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
             pool: bool = True, steps: str = "auto", pool_cells: int | None = None) -> LongGeneration:
    """``model.generate(text, ...)`` (models/families/gpt.py: the same ids, candidates and surprisal; the attention
    within float error) with the attention kept on the device (module docstring). ``pool``: compute the pooled tiles (at
    most ``pool_cells`` a side, default ``POOL_CELLS``).
    ``steps``: how each new token runs: "pass" (``_Run.layers``, shapes growing with the sequence), "fixed"
    (``_Run.step``, fixed shapes), "graph" (fixed shapes replayed as a CUDA graph on a CUDA device), "auto" (graph
    where the model sits whole on one CUDA device without accelerate hooks, else pass)."""
    why = refusal(model)
    if why:  # fails closed: the caller serves the request through model.generate
        raise ValueError(why)
    dec = Decoding.start(model, text, max_new_tokens, strategy, temperature, top_k, top_p, seed)
    ids, prompt_len, new = dec.ids, dec.prompt_len, dec.new
    pool_cells = pool_cells or POOL_CELLS
    was_training = model.training
    model.eval()
    run = _Run(model, prompt_len + new)
    dev = _device(model.embed)
    clock = _Clock(dev)
    if pool:  # the tiles for prompt_len + new rows, filled as the rows are made (redone should it stop early)
        run.tiles = _Tiles(prompt_len + new, pool_cells, model.config.n_heads, run.devices)
    x = run.layers(torch.tensor(ids, device=dev), 0)  # (P, D)
    clock.mark("prompt_pass")
    target = torch.tensor(ids[1:] + [0], device=x.device)
    logits = None
    prompt_nll = []
    for a in range(0, prompt_len, LOGIT_CHUNK):  # vocabulary-wide logits a chunk of rows at a time
        b = min(a + LOGIT_CHUNK, prompt_len)
        logits = run.logits(x[a:b]).float()
        e = min(b, prompt_len - 1)
        if e > a:
            logp = torch.log_softmax(logits[: e - a], -1)
            prompt_nll.append(-logp.gather(1, target[a:e, None].to(logp.device))[:, 0])
    if prompt_nll:  # one copy to the host, not one a chunk
        dec.surprisal[1:prompt_len] = torch.cat(prompt_nll).cpu().numpy()
    assert logits is not None
    logits = logits[-1]
    clock.mark("prompt_logits")
    if steps == "auto":
        whole = len(set(run.devices)) == 1 and not any(hasattr(m, "_hf_hook") for m in model.modules())
        steps = "graph" if whole and dev.type == "cuda" else "pass"
    if steps not in ("pass", "fixed", "graph"):
        raise ValueError(f"steps must be auto, pass, fixed or graph, got {steps!r}")
    stepper = _Steps(run, dev, capture=steps == "graph") if steps != "pass" else None

    def advance(token: int, pos: int, last: bool) -> Tensor | None:  # its attention rows (the last token's too)
        if stepper is not None:
            return stepper(token, pos)
        x = run.layers(torch.tensor([token], device=dev), pos)
        return None if last else run.logits(x)[0].float()

    dec.run(logits, advance)
    model.train(was_training)
    clock.mark("decode")
    t = len(ids)
    attention = DeviceAttention([q[:, :t] for q in run.q], [k[:, :t] for k in run.k],
                                [lse[:, :t] for lse in run.lse], t)
    if run.tiles is not None and run.tiles.t == t:  # the new tokens' rows join the prompt's
        attention.add_rows(run.tiles, prompt_len)
        attention.pooled, attention.edges = run.tiles.result(), run.tiles.edges
    elif pool:  # stopped early (end of sequence): the blocks differ, all the tiles again
        attention.pool(pool_cells)
    clock.mark("tiles")
    decoding = "pass" if stepper is None else "graph" if stepper.graphed else "fixed"
    return LongGeneration(text=dec.text(), tokens=dec.tokens(), ids=ids, prompt_len=prompt_len, steps=dec.steps,
                          surprisal=dec.bits(), attention=attention, notice=dec.notice, decoding=decoding,
                          timings=clock.ms())
