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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from models import limits
from models.blocks.decoder import Knows, count, empty, flag, off, one_of, scale, spec_of
from models.blocks.decoder import refusal as spec_refusal
from models.blocks.layers import ACTIVATIONS
from models.blocks.loop import Decoding
from models.blocks.positional import ROPE_LAYOUTS, apply_rope
from models.io.bigmodel import execution_device as _device
from models.outputs import AttentionMap, GenerationResult, GenerationStep

ATTENTION_CHUNK_BYTES = 256 << 20  # float32 scores of one chunk of query rows (all heads × all keys)
# on a CPU the chunks stay small enough for its caches: SmolLM2's 2,048-token prompt pass took 17.4 s with chunks of
# 256 MB, 10.8 s with 64, 6.9 s with 16 and 6.5 s with 4 (2-core CPU, idle, /tmp timings of ``prefill``)
CPU_CHUNK_BYTES = 8 << 20


def chunk_bytes(device: torch.device) -> int:
    """Bytes of float32 scores one chunk of query rows may take on ``device``."""
    return ATTENTION_CHUNK_BYTES if device.type == "cuda" else min(ATTENTION_CHUNK_BYTES, CPU_CHUNK_BYTES)
LOGIT_CHUNK = 256  # prompt rows sent through the output projection at once (surprisal)
POOL_CELLS = 64  # pooled tiles: at most this many cells a side, as the app's model view

# What ``_Run`` computes, field by field of the block description (models/blocks/decoder.py): the norms and the
# feed-forward (any kind, experts too) through their own modules; anything else is refused (``supports``).
KNOWS: Knows = {
    "positions": one_of("rope", "learned"), "embed_scale": scale, "final_softcap": scale, "prefix_lm": off,
    "residual": one_of("sequential", "parallel"), "norm": one_of("rmsnorm", "layernorm"), "sandwich": flag,
    "qkv_bias": flag, "o_bias": flag, "rope": one_of("none", "full", "partial"), "rotary_dim": count,
    "rope_layout": one_of(*ROPE_LAYOUTS), "local_rope": flag, "qk_norm": flag, "window": count, "attn_scale": scale,
    "attn_softcap": scale, "ff": one_of("gated", "mlp", "experts"), "ff_act": one_of(*ACTIVATIONS), "ff_bias": flag,
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
    """The block's output from its input x and its attention's output a (after o_proj), as ``Block.forward``: the
    residual as described, Gemma's sandwich norms through the block's own ``attn_output``."""
    a = block.attn_output(a)
    f = block.ff(block.ff_input(x, a))
    return x + a + (block.post_ff_norm(f) if spec.sandwich else f)


NEG = torch.finfo(torch.float32).min  # a masked score: exp(NEG − max) is 0 and 0 · NEG is 0 (no NaN in Σ w·s)


@dataclass(frozen=True)
class Geometry:
    """What a layer's weights are beyond q·k (``CausalSelfAttention.forward``): a_ij = softmax_j(cap(scale · q_i·k_j))
    over the keys query i may see: j ≤ i, within ``window`` (i − w < j, a local layer; 0: every earlier key), and
    the ``prefix`` block both ways (a prefix LM: i, j < prefix)."""

    scale: float
    window: int = 0
    softcap: float = 0.0
    prefix: int = 0

    @classmethod
    def of(cls, model, layer: int, prefix: int = 0) -> Geometry:
        spec = model.spec.blocks[layer]
        return cls(spec.attn_scale or 1.0 / math.sqrt(model.config.d_head), spec.window, spec.attn_softcap, prefix)

    def keys(self, r0: int, r1: int) -> tuple[int, int]:
        """The keys [c0, c1) that query rows r0..r1 − 1 may see (a band's, for a local layer)."""
        if self.prefix and r0 < self.prefix:
            return 0, max(r1, self.prefix)
        return (max(0, r0 - self.window + 1) if self.window else 0), r1

    def scores(self, s: Tensor, rows: Tensor, c0: int, always: bool = False) -> Tensor:
        """Raw q·k (h, r, c) float32 of query positions ``rows`` (r,) over keys c0.. -> the layer's masked scores, in
        place (a masked cell: NEG). ``always``: mask without asking whether any cell is hidden (no host sync, for a
        CUDA graph)."""
        s.mul_(self.scale)
        if self.softcap:  # Gemma 2: z -> cap · tanh(z / cap), before the mask
            s.div_(self.softcap).tanh_().mul_(self.softcap)
        i = rows[:, None]
        if always or self.prefix:  # every cell asked (a fixed-shape step; a prefix opens a block both ways)
            j = torch.arange(c0, c0 + s.size(-1), device=s.device)[None, :]
            hidden = j > i
            if self.window:
                hidden |= j <= i - self.window
            if self.prefix:
                hidden &= ~((i < self.prefix) & (j < self.prefix))
            if always or bool(hidden.any()):
                s.masked_fill_(hidden, NEG)
            return s
        # only two column ranges can hold hidden cells: keys after the first row, keys out of the last row's window
        c, first, last = s.size(-1), int(rows[0]), int(rows[-1])
        f0 = max(0, first + 1 - c0)
        if f0 < c:
            j = torch.arange(c0 + f0, c0 + c, device=s.device)[None, :]
            s[..., f0:].masked_fill_(j > i, NEG)
        if self.window:
            w1 = min(c, last - self.window + 1 - c0)
            if w1 > 0:
                j = torch.arange(c0, c0 + w1, device=s.device)[None, :]
                s[..., :w1].masked_fill_(j <= i - self.window, NEG)
        return s


def block_edges(n: int, max_cells: int) -> np.ndarray:
    """Edges of equal blocks splitting ``n`` into ``ceil(n / ceil(n / max_cells))`` (``viz.common.block_edges``)."""
    factor = max(1, int(np.ceil(n / max_cells)))
    return np.minimum(np.arange(int(np.ceil(n / factor)) + 1) * factor, n)


def _column_tiles(e: Tensor, f: int, offset: int = 0) -> tuple[Tensor, Tensor]:
    """Max and sum of ``e`` (h, r, c), non-negative, over column blocks of ``f`` (the last one cut at c), the first
    column of ``e`` being ``offset`` columns into its block (the block's earlier columns count as zeros): two
    (h, r, blocks) tensors, read from ``e`` in place (no padded copy of the chunk)."""
    maxes, sums = [], []
    if offset:
        head = e[..., : f - offset]
        maxes.append(head.amax(-1, keepdim=True))
        sums.append(head.sum(-1, keepdim=True))
        e = e[..., f - offset:]
    c = e.size(-1)
    whole = c // f * f
    if whole:
        blocks = e[..., :whole].unflatten(-1, (whole // f, f))  # a view: (h, r, c // f, f)
        maxes.append(blocks.amax(-1))
        sums.append(blocks.sum(-1))
    if c > whole:
        maxes.append(e[..., whole:].amax(-1, keepdim=True))
        sums.append(e[..., whole:].sum(-1, keepdim=True))
    return torch.cat(maxes, -1), torch.cat(sums, -1)


class _Tiles:
    """Pooled tiles (max and sum over the blocks of ``block_edges(T, cells)``) accumulated a chunk of rows at a time,
    per layer on its device: the prompt pass adds its rows while their weights are at hand, the new tokens' rows are
    added after decoding (max and sum over a block split between the two: the max of the parts' maxes, the sum of
    their sums). Masked cells are zeros (weights ≥ 0, so the zeros of the start and of any padding never raise a
    max). ``layers``: the layers kept (None: all); the others' rows are ignored."""

    def __init__(self, t: int, cells: int, heads: int, devices: Sequence[torch.device],
                 layers: Sequence[int] | None = None) -> None:
        self.t, self.edges = t, block_edges(t, cells)
        self.f, n = int(self.edges[1] - self.edges[0]), len(self.edges) - 1
        keep = range(len(devices)) if layers is None else layers
        self.max = {i: torch.zeros(heads, n, n, device=devices[i]) for i in keep}
        self.sum = {i: torch.zeros(heads, n, n, device=devices[i]) for i in keep}

    def add(self, layer: int, r0: int, col_max: Tensor, col_sum: Tensor, cb0: int = 0) -> None:
        """Rows r0.. of ``layer``, given as their column-block max and sum (h, r, c_blocks) from column block
        ``cb0`` on."""
        if layer not in self.max:
            return
        f = self.f
        h, r, nc = col_max.shape
        front = r0 % f  # rows of the first block before r0 (another chunk's): zeros here
        back = -(front + r) % f
        m = torch.nn.functional.pad(col_max, (0, 0, front, back)).view(h, -1, f, nc).amax(2)
        s = torch.nn.functional.pad(col_sum, (0, 0, front, back)).view(h, -1, f, nc).sum(2)
        b0 = r0 // f
        span = (slice(None), slice(b0, b0 + m.size(1)), slice(cb0, cb0 + nc))
        torch.maximum(self.max[layer][span], m, out=self.max[layer][span])
        self.sum[layer][span] += s

    def result(self) -> dict[str, np.ndarray]:
        """{"max", "mean"} -> (L, H, R, C) float32 numpy (one copy from each layer's device; every layer kept)."""
        out = self.layers()
        return {how: np.stack([out[i][how] for i in sorted(out)]) for how in ("max", "mean")}

    def layers(self) -> dict[int, dict[str, np.ndarray]]:
        """{layer: {"max", "mean"} -> (H, R, C) float32 numpy} of the layers kept."""
        sizes = torch.from_numpy(np.diff(self.edges).astype(np.float32))
        area = sizes[:, None] * sizes[None, :]
        return {i: {"max": self.max[i].cpu().numpy(), "mean": (self.sum[i].cpu() / area).numpy()}
                for i in self.max}


STATS = ("entropy", "sink", "distance", "local")  # per head over every query row of the context (``_Stats``)
LOCAL = 512  # the "local" statistic's window when the model has none of its own (Gemma 3's local window)


class _Stats:
    """Per layer and head, sums over query rows of: the entropy −Σ_j a_ij log a_ij (nats), the weight on key 0 (the
    sink, rows i ≥ 1, as ``analysis.first_token_share``), the distance Σ_j a_ij (i − j) in tokens and the weight
    inside the last ``local`` keys (i − local < j ≤ i); read as means over the rows (``result``). Accumulated from a
    chunk's exponentials e (h, r, c) = exp(s − max), their row sums and Σ_j e_ij s_ij: the entropy of a row is
    lse_i − Σ_j a_ij s_ij (a_ij = exp(s_ij − lse_i)), exact without a logarithm per cell."""

    def __init__(self, heads: int, devices: Sequence[torch.device], local: int) -> None:
        self.local = local
        self.sums = [torch.zeros(len(STATS), heads, dtype=torch.float64, device=dev) for dev in devices]
        self.rows = [0] * len(devices)
        self.sink_rows = [0] * len(devices)

    def add(self, layer: int, rows: Tensor, c0: int, e: Tensor, total: Tensor, lse: Tensor, es: Tensor) -> None:
        """Query positions ``rows`` (r,) of ``layer``: e (h, r, c) over keys c0.., total (h, r, 1) its row sums, lse
        (h, r) and es (h, r) = Σ_j e_ij s_ij."""
        dev = e.device
        inv = 1.0 / total[..., 0]  # (h, r)
        ej = torch.matmul(e, torch.arange(c0, c0 + e.size(-1), device=dev, dtype=torch.float32))  # Σ_j e_ij j
        mean_key = ej * inv  # (h, r): Σ_j a_ij j
        entropy = lse - es * inv
        distance = rows.float()[None, :] - mean_key
        b0 = max(0, int(rows[0]) - self.local + 1 - c0)
        band = e[..., b0:]
        j = torch.arange(c0 + b0, c0 + e.size(-1), device=dev)[None, :]
        # the mask as floats: a float × bool product takes torch's slow promoting path (90× slower on the 2-core CPU)
        near = (band * (j > rows[:, None] - self.local).to(band.dtype)).sum(-1) * inv
        sink = e[..., 0] * inv if c0 == 0 else torch.zeros_like(inv)
        first = rows >= 1
        sums = self.sums[layer]
        sums[0] += entropy.sum(-1).double()
        sums[1] += (sink * first.to(sink.dtype)).sum(-1).double()
        sums[2] += distance.sum(-1).double()
        sums[3] += near.sum(-1).double()
        self.rows[layer] += rows.numel()
        self.sink_rows[layer] += int(first.sum())

    def result(self) -> dict[str, np.ndarray]:
        """{statistic: (L, H) float32}: means over the rows."""
        out = {}
        for k, name in enumerate(STATS):
            n = [max(1, self.sink_rows[i] if name == "sink" else self.rows[i]) for i in range(len(self.sums))]
            out[name] = np.stack([(s[k] / n[i]).cpu().numpy() for i, s in enumerate(self.sums)]).astype(np.float32)
        return out


OVERVIEW_CELLS = 512  # a head's overview: at most this many tiles a side (limits.MAX_TILE_CELLS)
# a layer whose one-head overview would score more than this many q·k products (T² / 2 · d for a global layer) gets
# its overview tiles made by the prompt pass from the weights it has at hand, for every head (Gemma 3's global
# layers at 32 k tokens: 1.4e11 products a head, ~2 s on a 2-core CPU; 8 MB of tiles a layer), the others on request
OVERVIEW_PRODUCTS = int(float(os.environ.get("ATLAS_OVERVIEW_PRODUCTS", "2e10")))


@dataclass
class DeviceAttention:
    """Per layer q (H, T, d), k (H_kv, T, d) after RoPE and lse (H, T) float32, each on its layer's device, and the
    layer's ``Geometry`` (scale, window, soft cap, prefix; None: causal with 1/√d)."""

    q: list[Tensor]
    k: list[Tensor]
    lse: list[Tensor]
    length: int  # T: rows (and keys) in use
    pooled: dict[str, np.ndarray] = field(default_factory=dict)  # "max"/"mean" -> (L, H, R, C) float32
    edges: np.ndarray | None = None  # block edges of the pooled tiles (rows and columns alike)
    geometry: list[Geometry] | None = None
    stats: dict[str, np.ndarray] = field(default_factory=dict)  # STATS -> (L, H) float32 over every row
    # {layer: {"max"/"mean": (H, R, C)}}: whole-map overview tiles at OVERVIEW_CELLS (``overview``), made by the prompt
    # pass for the costly layers and kept when asked for the others
    overviews: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return len(self.q), self.q[0].size(0), self.length, self.length

    def geom(self, layer: int) -> Geometry:
        if self.geometry is None:
            return Geometry(1.0 / math.sqrt(self.q[layer].size(-1)))
        return self.geometry[layer]

    def _scores(self, layer: int, rows: Tensor, cols: slice, heads: slice = slice(None)) -> Tensor:
        """The masked scores (h, r, c) float32 on the layer's device (``Geometry.scores``) of query positions
        ``rows`` (r,) over keys ``cols``."""
        q, k = self.q[layer][heads], self.k[layer]
        h, kv = self.q[layer].size(0), k.size(0)
        group = h // kv
        heads_idx = torch.arange(h, device=q.device)[heads]
        c0 = cols.start or 0
        keys = k[:, cols].float()  # (H_kv, c, d)
        if heads_idx.numel() == 1 or kv == 1:
            kk = keys[heads_idx[:1] // group] if kv > 1 else keys  # one key head for all the query heads asked
            s = torch.matmul(q[:, rows].float(), kk.transpose(1, 2))
        else:
            s = torch.matmul(q[:, rows].float(), keys[heads_idx // group].transpose(1, 2))  # (h, r, c)
        return self.geom(layer).scores(s, rows, c0)

    def _weights(self, layer: int, rows: Tensor, cols: slice, heads: slice = slice(None)) -> Tensor:
        """a (h, r, c) float32 on the layer's device for query positions ``rows`` (r,) and keys ``cols``."""
        s = self._scores(layer, rows, cols, heads)
        return torch.exp(s.sub_(self.lse[layer][heads][:, rows, None]))

    def block(self, layer: int, rows: slice, cols: slice, heads: slice = slice(None)) -> np.ndarray:
        """The weights of ``heads`` for query rows and key columns (slices), (h, r, c) float32 numpy: exact."""
        dev = self.q[layer].device
        r = torch.arange(*rows.indices(self.length), device=dev)
        c0, c1, _ = cols.indices(self.length)
        return self._weights(layer, r, slice(c0, c1), heads).cpu().numpy()

    def row(self, layer: int, head: int, query: int) -> np.ndarray:
        """One attention row (T,) float32: query ``query``'s weights over every key (zeros where it cannot look)."""
        if not 0 <= query < self.length:
            raise ValueError(f"query {query} is not one of the {self.length:,} positions")
        self._heads(layer, head)
        out = np.zeros(self.length, np.float32)
        c0, c1 = self.geom(layer).keys(query, query + 1)
        out[c0:c1] = self.block(layer, slice(query, query + 1), slice(c0, c1), slice(head, head + 1))[0, 0]
        return out

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

    def _chunks(self, layer: int, r0: int, r1: int, c0: int, c1: int, rows_multiple: int = 1, col_align: int = 1):
        """(a, b, lo, hi): row chunks a..b − 1 of r0..r1 (a multiple of ``rows_multiple`` rows each) and the keys
        lo..hi − 1 of c0..c1 they may see (their band, causal or windowed; lo on a multiple of ``col_align`` from
        c0). Every other weight of the block is 0."""
        g = self.geom(layer)
        banded = g.window and not g.prefix
        width = min(c1 - c0, g.window + rows_multiple + col_align) if banded else c1 - c0
        step = self._rows_per(layer, width, rows_multiple)
        if banded:  # a local layer's chunk spans about a window of keys
            step = min(step, max(rows_multiple, g.window // rows_multiple * rows_multiple))
        for a in range(r0, r1, step):
            b = min(r1, a + step)
            k0, k1 = g.keys(a, b)
            lo, hi = max(c0, k0), min(c1, k1)
            lo = c0 + (lo - c0) // col_align * col_align
            if hi > lo:
                yield a, b, lo, hi

    def _each_chunk(self, layer: int, heads: slice, r0: int, r1: int, c0: int, c1: int, rows_multiple: int = 1,
                    col_align: int = 1):
        """``_chunks`` with their weights: (a, b, lo, (h, b − a, hi − lo) float32)."""
        dev = self.q[layer].device
        for a, b, lo, hi in self._chunks(layer, r0, r1, c0, c1, rows_multiple, col_align):
            yield a, b, lo, self._weights(layer, torch.arange(a, b, device=dev), slice(lo, hi), heads)

    def pool(self, max_cells: int = POOL_CELLS) -> None:
        """The tiles of the model view, max and mean over ``block_edges`` blocks (masked cells count as zeros), per
        layer on its device from q, k and lse; sets ``pooled`` and ``edges``. (``generate`` accumulates them during
        its passes instead, ``_Tiles``; this recomputes them, e.g. for another number of cells.)"""
        t = self.length
        tiles = _Tiles(t, max_cells, self.q[0].size(0), [q.device for q in self.q])
        self.add_rows(tiles, 0)
        self.pooled, self.edges = tiles.result(), tiles.edges

    def add_rows(self, tiles: _Tiles | None, r0: int, stats: _Stats | None = None) -> None:
        """Rows r0..T of every layer into ``tiles`` and ``stats`` (the new tokens' rows, after the prompt's)."""
        t = self.length
        for layer in range(len(self.q)):
            if tiles is not None and layer in tiles.max:
                for a, _, lo, w in self._each_chunk(layer, slice(None), r0, t, 0, t, 1, tiles.f):
                    tiles.add(layer, a, *_column_tiles(w, tiles.f), lo // tiles.f)
            if stats is not None:
                dev = self.q[layer].device
                for a, b, lo, hi in self._chunks(layer, r0, t, 0, t):
                    rows = torch.arange(a, b, device=dev)
                    s = self._scores(layer, rows, slice(lo, hi))
                    top = s.amax(-1, keepdim=True)
                    e = torch.exp(s - top)
                    total = e.sum(-1, keepdim=True)
                    es = torch.einsum("hrc,hrc->hr", e, s)
                    stats.add(layer, rows, lo, e, total, (top + total.log())[..., 0], es)

    def nbytes(self) -> int:
        """Bytes kept: every layer's q, k and lse (k is the cache's own, kept with the result)."""
        return sum(x.numel() * x.element_size() for x in (*self.q, *self.k, *self.lse))

    def upto(self, t: int) -> DeviceAttention:
        """The attention of the first ``t`` tokens (a replayed step): causal, so their rows and keys are the first
        ``t`` of these, views of the same tensors (the pooled tiles only where ``t`` is the whole length)."""
        if t >= self.length:
            return self
        return DeviceAttention(self.q, self.k, self.lse, t, geometry=self.geometry)

    def to(self, device: str | torch.device) -> DeviceAttention:
        """The same attention with q, k and lse on ``device`` (a ZeroGPU Space hands its results back on the CPU)."""
        t = self.length
        return DeviceAttention([q[:, :t].to(device) for q in self.q], [k[:, :t].to(device) for k in self.k],
                               [x[:, :t].to(device) for x in self.lse], t, self.pooled, self.edges, self.geometry,
                               self.stats, self.overviews)

    def _heads(self, layer: int, head: Head) -> tuple[slice, bool]:
        """The heads ``_weights`` computes for ``head`` (an index: that one alone) and whether they are fused."""
        if not 0 <= layer < len(self.q):
            raise ValueError(f"layer {layer} is not one of the model's {len(self.q)} layers")
        if head is None or head in ("mean", "max"):
            return slice(None), head is not None
        h = int(head)
        if not 0 <= h < self.q[layer].size(0):
            raise ValueError(f"head {h} is not one of the layer's {self.q[layer].size(0)} heads")
        return slice(h, h + 1), False

    def _rows_per(self, layer: int, width: int, multiple: int = 1) -> int:
        """Query rows a chunk (a multiple of ``multiple``): their float32 weights of every head over ``width``
        keys within ``ATTENTION_CHUNK_BYTES``."""
        per = chunk_bytes(self.q[layer].device) // max(1, 4 * self.q[layer].size(0) * width)
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
        n = 1 if fuse else self.q[layer][heads].size(0)
        out = torch.zeros(n, r1 - r0, c1 - c0, device=self.q[layer].device)
        for a, b, lo, w in self._each_chunk(layer, heads, r0, r1, c0, c1):
            out[:, a - r0:b - r0, lo - c0:lo - c0 + w.size(-1)] = _fuse(w, head) if fuse else w
        out = out.cpu().numpy()
        return out if head is None else out[0]

    def overview(self, layer: int, head: Head, how: str = "max", cells: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``tiles`` of the whole map at OVERVIEW_CELLS: from the prompt pass's tiles where it made them (an index
        head), else computed and kept for the layer's every head. Another number of ``cells``: ``tiles``."""
        cells = cells or OVERVIEW_CELLS
        if head is None or head in ("mean", "max") or self.length <= cells or cells != OVERVIEW_CELLS:
            return self.tiles(layer, head, cells, how)
        self._heads(layer, head)
        if how not in ("max", "mean"):
            raise ValueError(f"pooling must be max or mean, got {how!r}")
        if layer not in self.overviews:  # both poolings from one pass over the weights
            self.overviews[layer] = self._pooled(layer, None, OVERVIEW_CELLS)[0]
        edges = block_edges(self.length, OVERVIEW_CELLS)
        return self.overviews[layer][how][int(head)], edges, edges

    def tiles(self, layer: int, head: Head, cells: int, how: str = "max", rows: tuple[int, int] | None = None,
              cols: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``viz.common.pool_blocks`` of ``fused(layer, head, rows, cols)`` computed on the device a chunk of rows
        at a time: (pooled float32 numpy, row edges, column edges), the edges relative to the block's start; a
        fused head's (r, c) tiles, every head's (H, r, c) for ``head`` None. Only the tiles leave the device."""
        if how not in ("max", "mean"):
            raise ValueError(f"pooling must be max or mean, got {how!r}")
        pooled, re, ce = self._pooled(layer, head, cells, rows, cols)
        return pooled[how], re, ce

    def _pooled(self, layer: int, head: Head, cells: int, rows: tuple[int, int] | None = None,
                cols: tuple[int, int] | None = None) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """`tiles` with both poolings from one pass over the weights: ({"max": …, "mean": …}, row edges, column
        edges)."""
        r0, r1, c0, c1 = self._span(rows, cols)
        re, ce = block_edges(r1 - r0, cells), block_edges(c1 - c0, cells)
        fr, fc = int(re[1] - re[0]), int(ce[1] - ce[0])
        if fr == fc == 1:  # nothing to pool: the weights themselves
            w = self.fused(layer, head, (r0, r1), (c0, c1))
            return {"max": w, "mean": w}, re, ce
        heads, fuse = self._heads(layer, head)
        dev = self.q[layer].device
        n_heads = 1 if fuse else self.q[layer][heads].size(0)
        maxes = torch.zeros(n_heads, len(re) - 1, len(ce) - 1, device=dev)
        sums = torch.zeros_like(maxes)
        for a, b, lo, w in self._each_chunk(layer, heads, r0, r1, c0, c1, fr, fc):  # whole row blocks a chunk
            col_max, col_sum = _column_tiles(_fuse(w, head) if fuse else w, fc)  # (h, r, blocks)
            back = -(b - a) % fr  # the last block's missing rows: zeros
            i, j = (a - r0) // fr, (lo - c0) // fc
            m = torch.nn.functional.pad(col_max, (0, 0, 0, back)).unflatten(1, (-1, fr)).amax(2)
            span = (slice(None), slice(i, i + m.size(1)), slice(j, j + m.size(2)))
            torch.maximum(maxes[span], m, out=maxes[span])
            sums[span] += torch.nn.functional.pad(col_sum, (0, 0, 0, back)).unflatten(1, (-1, fr)).sum(2)
        area = torch.from_numpy(np.outer(np.diff(re), np.diff(ce)).astype(np.float32)).to(dev)
        out = {"max": maxes.cpu().numpy(), "mean": (sums / area).cpu().numpy()}
        return {k: v if head is None else v[0] for k, v in out.items()}, re, ce

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


class _Run:
    """One generation's buffers: per layer the keys and values (H_kv, n, d), queries (H, n, d), lse (H, n), and
    the reductions the passes accumulate from the weights they have at hand (``tiles``, ``overview``, ``stats``)."""

    def __init__(self, model, n: int, prefix: int = 0) -> None:
        self.model, self.c = model, model.config
        c = self.c
        self.dtype = model.embed.weight.dtype if model.embed.weight.device.type != "meta" else \
            next(p.dtype for p in model.blocks[0].parameters())
        self.devices = [_device(b) for b in model.blocks]
        d = c.d_head
        self.n = n
        self.geometry = [Geometry.of(model, i, prefix) for i in range(c.n_layers)]
        # keys in float32 (the scores' dtype: no conversion of the whole cache at every step), values as the weights;
        # zeros, so that the fixed-shape step (``step``) multiplies its masked weights by zeros, never by stale memory
        self.k = [torch.zeros(c.kv_heads, n, d, device=dev, dtype=torch.float32) for dev in self.devices]
        self.v = [torch.zeros(c.kv_heads, n, d, device=dev, dtype=self.dtype) for dev in self.devices]
        self.q = [torch.empty(c.n_heads, n, d, device=dev, dtype=self.dtype) for dev in self.devices]
        self.lse = [torch.empty(c.n_heads, n, device=dev, dtype=torch.float32) for dev in self.devices]
        self.angles = model.angles if model.positions is None else None
        self.angles_local = getattr(model, "angles_local", None)
        self.tiles: _Tiles | None = None  # the model view's tiles, accumulated by the passes (``generate``)
        self.overview: _Tiles | None = None  # the costly layers' overview tiles (OVERVIEW_PRODUCTS)
        self.stats: _Stats | None = None  # the per-head statistics over every row
        self.rows_done = 0  # rows 0..rows_done − 1 are in the reductions (``layers``; ``step`` adds none)

    def _rope(self, dev: torch.device, local: bool, start: int, end: int,
              cache: dict) -> tuple[Tensor, Tensor] | None:
        """cos and sin of the angles of positions start..end − 1 in the weights' dtype (a local layer's own base)."""
        table = self.angles_local if local else self.angles
        if table is None:
            return None
        key = (dev, local)
        if key not in cache:
            angles = table[start:end].to(dev)
            cache[key] = (angles.cos().to(self.dtype), angles.sin().to(self.dtype))
        return cache[key]

    def layers(self, ids: Tensor, start: int) -> Tensor:
        """Tokens ``ids`` (T,) at positions start.. through every block; their residual stream (T, D)."""
        model, c = self.model, self.c
        t = ids.numel()
        end = start + t
        x = model.embed(ids)
        if c.embed_scale:  # Gemma: embeddings × √d_model, as GPT.forward
            x = x * torch.tensor(c.embed_scale, dtype=x.dtype)
        if model.positions is not None:
            x = x + model.positions(torch.arange(start, end, device=ids.device))
        h_q, d = c.n_heads, c.d_head
        rope: dict = {}  # per device and base: cos and sin of this pass's angles
        for i, (block, spec) in enumerate(zip(model.blocks, model.spec.blocks)):
            dev = self.devices[i]
            x = x.to(dev)
            cos_sin = self._rope(dev, spec.local_rope, start, end, rope)
            q, k, v = _project(block, spec, block.norm1(x), t, cos_sin)  # (H, T, d), (H_kv, T, d) twice
            self.q[i][:, start:end] = q
            self.k[i][:, start:end] = k
            self.v[i][:, start:end] = v
            # a whole half-precision prompt is scored from its own keys as they came (products exact in float32; on
            # CUDA only: elsewhere _scores multiplies float32 operands, which the float32 cache already is)
            half_keys = k if start == 0 and q.dtype in _HALF and q.is_cuda else None
            out = self._attend(i, q, start, end, half_keys)
            x = _after_attention(block, spec, x, block.attn.o_proj(out.transpose(0, 1).reshape(t, h_q * d)))
        self.rows_done = max(self.rows_done, end)
        return x

    def _attend(self, i: int, q: Tensor, start: int, end: int, half_keys: Tensor | None = None) -> Tensor:
        """Layer ``i``'s attention output (H, T, d) for queries ``q`` (H, T, d) at positions start..end − 1 over the
        keys they may see (written already; ``Geometry.keys``: causal, a local layer's window, a prefix): one pass
        of float32 scores a chunk of query rows at a time, over the keys of the chunk's band only. Writes each row's
        lse and adds the rows to the tiles and statistics kept (``tiles``, ``overview``, ``stats``).

        Scores of half-precision q and k are their exact products summed in float32 (``_scores``). The output is
        A·V from the chunk's weights, cast to the values' dtype (as transformers' eager attention); torch's fused
        SDPA for it saved 2 % after 4,096 tokens on an H200 and cost 1.1 s more after 512
        (docs/device-h200-gen8b.json), so it is not used."""
        c, g = self.c, self.geometry[i]
        h_q, h_kv, d = c.n_heads, c.kv_heads, c.d_head
        group, t, dev = h_q // h_kv, end - start, q.device
        f = self.tiles.f if self.tiles is not None else 1
        banded = bool(g.window) and not g.prefix
        width = min(end, g.window + f) if banded else end
        rows_per = max(1, chunk_bytes(dev) // (4 * h_q * width))
        if self.tiles is not None and t > 1:  # whole row blocks of the tiles where the chunk has many rows
            rows_per = max(f, rows_per // f * f)
        if banded:
            rows_per = min(rows_per, max(1, g.window))
        out = torch.empty(h_q, t, d, device=dev, dtype=self.v[i].dtype)
        for r0 in range(0, t, rows_per):
            r1 = min(t, r0 + rows_per)
            r = r1 - r0
            a0, a1 = start + r0, start + r1
            c0, c1 = g.keys(a0, a1)  # the keys before c0 are out of the rows' sight: zeros in the tiles
            keys = (half_keys if half_keys is not None and c1 <= half_keys.size(1) else self.k[i])[:, c0:c1]
            # query heads h·group .. h·group + group − 1 share key/value head h: (H_kv, group·r, d)
            qg = q[:, r0:r1].reshape(h_kv, group * r, d)
            rows = torch.arange(a0, a1, device=dev)
            s = g.scores(_scores(qg, keys.transpose(1, 2), 1.0).view(h_q, r, c1 - c0), rows, c0)  # (H, r, c)
            top = s.amax(-1, keepdim=True)  # (H, r, 1): every row sees its own key, so finite
            # the statistics read the shifted scores z = s − max beside e = exp(z): Σ_j e_ij s_ij = Σ_j e_ij z_ij +
            # max · Σ_j e_ij (one pass over the chunk; a product with [k | j] instead cost 26 % more at 8,192 tokens)
            z = s.sub_(top)
            e = torch.exp(z) if self.stats is not None else z.exp_()
            total = e.sum(-1, keepdim=True)  # (H, r, 1): the softmax's denominator
            lse = (top + total.log())[..., 0]  # log Σ exp(s) = max + log Σ exp(s − max)
            self.lse[i][:, a0:a1] = lse
            for tiles in (self.tiles, self.overview):
                if tiles is not None and i in tiles.max:
                    col_max, col_sum = _column_tiles(e, tiles.f, c0 % tiles.f)  # (H, r, blocks)
                    tiles.add(i, a0, col_max / total, col_sum / total, c0 // tiles.f)  # a row's weights: e / total
            if self.stats is not None:  # a masked cell: e = 0 and z finite (NEG − max), so it adds nothing
                es = torch.linalg.vecdot(e, z) + top[..., 0] * total[..., 0]
                self.stats.add(i, rows, c0, e, total, lse, es)
            w = torch.div(e, total, out=torch.empty(e.shape, dtype=self.v[i].dtype, device=dev))  # softmax, cast
            out[:, r0:r1] = torch.matmul(w.view(h_kv, group * r, c1 - c0), self.v[i][:, c0:c1]).view(h_q, r, d)
        return out

    def prepare_step(self) -> None:
        """Tables for ``step``: cos and sin of every position in the weights' dtype (each base), key positions."""
        dev = self.devices[0]
        self.tables = {}
        for local, table in ((False, self.angles), (True, self.angles_local)):
            if table is not None:
                a = table[: self.n].to(dev)
                self.tables[local] = (a.cos().to(self.dtype), a.sin().to(self.dtype))
        self.key_pos = torch.arange(self.n, device=dev)

    def step(self, token: Tensor, pos: Tensor) -> Tensor:
        """One new token ``token`` (1,) at position ``pos`` (1,), both device tensors, through every block with
        shapes that do not depend on the position (every key of the buffers, the later ones masked), so that a
        CUDA graph can replay it at each step (``_Steps``); the logits (1, V). The same numbers as ``layers``."""
        model, c = self.model, self.c
        h_q, h_kv, d, n = c.n_heads, c.kv_heads, c.d_head, self.n
        group = h_q // h_kv
        x = model.embed(token)  # (1, D)
        if c.embed_scale:
            x = x * torch.tensor(c.embed_scale, dtype=x.dtype)
        if model.positions is not None:
            x = x + model.positions(pos)
        tables = {k: (cos.index_select(0, pos), sin.index_select(0, pos)) for k, (cos, sin) in self.tables.items()}
        for i, (block, spec) in enumerate(zip(model.blocks, model.spec.blocks)):
            g = self.geometry[i]
            q, k, v = _project(block, spec, block.norm1(x), 1, tables.get(bool(spec.local_rope)))
            self.q[i].index_copy_(1, pos, q)
            self.k[i].index_copy_(1, pos, k.float())
            self.v[i].index_copy_(1, pos, v)
            s = torch.matmul(q.float().reshape(h_kv, group, d), self.k[i].transpose(1, 2)).view(h_q, 1, n)
            s = g.scores(s, pos, 0, always=True)  # (H, 1, n) float32: the later keys (and those out of a window) masked
            lse = torch.logsumexp(s, -1)  # (H, 1)
            self.lse[i].index_copy_(1, pos, lse)
            w = torch.exp(s.sub_(lse[..., None]))
            out = torch.matmul(w.to(self.v[i].dtype).view(h_kv, group, n), self.v[i]).view(h_q, 1, d)
            x = _after_attention(block, spec, x, block.attn.o_proj(out.transpose(0, 1).reshape(1, h_q * d)))
        return self.logits(x)

    def logits(self, x: Tensor) -> Tensor:
        """The output logits of rows x (…, D): final norm, output projection, Gemma's soft cap (``GPT.logits_of``)."""
        model = self.model
        h = model.norm(x.to(_device(model.norm)))
        logits = model.lm_head(h.to(_device(model.lm_head)))
        cap = self.c.final_softcap
        return logits if not cap else torch.tanh(logits / cap) * cap


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


PREFILL_TOKENS = 4096  # a long prompt goes through the blocks this many tokens at a time (bounded activations)


class Cancelled(RuntimeError):
    """A long prefill stopped at the caller's request (``should_stop``); its buffers are released with it."""


def store_bytes(model, n: int) -> int:
    """What a run over ``n`` tokens keeps (``_Run``: float32 keys, values and queries in the weights' dtype, the
    lse) plus one chunk of scores and the overview tiles: the server's estimate before it starts (O(n · d))."""
    c = model.config
    item = next(model.parameters()).element_size()
    per_token = c.n_layers * (c.kv_heads * c.d_head * (4 + item) + c.n_heads * (c.d_head * item + 4))
    tiles = c.n_layers * c.n_heads * 2 * 4 * (POOL_CELLS ** 2 + OVERVIEW_CELLS ** 2)
    return per_token * n + 3 * ATTENTION_CHUNK_BYTES + tiles


def _costly(model, n: int) -> list[int]:
    """The layers whose one-head overview over n tokens scores more than OVERVIEW_PRODUCTS q·k products."""
    c = model.config
    out = []
    for i, spec in enumerate(model.spec.blocks):
        width = min(n, spec.window) if spec.window else n / 2
        if n > OVERVIEW_CELLS and n * width * c.d_head > OVERVIEW_PRODUCTS:
            out.append(i)
    return out


def _prefill(run: _Run, ids: list[int], dev: torch.device, chunk: int | None,
             progress: Callable[[int, int], None] | None, should_stop: Callable[[], bool] | None,
             each: Callable[[int, Tensor], None] | None = None) -> Tensor:
    """The prompt through ``run`` ``chunk`` tokens at a time (the first chunk holds a prefix LM's whole prefix);
    the last chunk's residual stream (r, D); ``each(start, x)`` with every chunk's. ``progress(done, total)`` after
    each chunk; ``should_stop()`` true: ``Cancelled``."""
    p = len(ids)
    chunk = max(1, chunk or PREFILL_TOKENS)
    first = max(chunk, run.geometry[0].prefix)
    x = None
    a = 0
    while a < p:
        if should_stop is not None and should_stop():
            raise Cancelled(f"stopped after {a:,} of {p:,} prompt tokens")
        b = min(p, a + (first if a == 0 else chunk))
        x = run.layers(torch.tensor(ids[a:b], device=dev), a)
        if each is not None:
            each(a, x)
        if progress is not None:
            progress(b, p)
        a = b
    assert x is not None
    return x


@torch.inference_mode()
def prefill(model, ids: Sequence[int], prefix: int = 0, stats: bool = True, chunk: int | None = None,
            progress: Callable[[int, int], None] | None = None,
            should_stop: Callable[[], bool] | None = None) -> tuple[DeviceAttention, Tensor]:
    """The store of ``ids`` alone (no new token): its DeviceAttention (with the statistics over every row and the
    costly layers' overview tiles) and the logits after its last token (V,). ``prefix``: a prefix LM's bidirectional
    part (``GPT.forward``'s); ``chunk``: tokens a pass (PREFILL_TOKENS)."""
    why = spec_refusal(model.spec, {**KNOWS, "prefix_lm": flag}, "the long-context store") if spec_of(model) else \
        refusal(model)
    if why:
        raise ValueError(why)
    ids = [int(i) for i in ids]
    if not ids:
        raise ValueError("nothing to read: the prompt has no tokens")
    if prefix and not model.config.prefix_lm:
        raise ValueError("a bidirectional prefix was given to a causal model (spec.prefix_lm is off)")
    t = len(ids)
    if t > model.context_limit():
        raise ValueError(f"{t:,} tokens exceed the model's {model.context_limit():,} positions")
    run = _Run(model, t, prefix)
    _reductions(run, model, t, stats)
    dev = _device(model.embed)
    x = _prefill(run, ids, dev, chunk, progress, should_stop)
    logits = run.logits(x[-1:])[0].float()
    return _attention(run, t), logits


def _reductions(run: _Run, model, n: int, stats: bool) -> None:
    """The costly layers' overview tiles and the statistics, accumulated by the passes over n rows."""
    costly = _costly(model, n)
    if costly:
        run.overview = _Tiles(n, OVERVIEW_CELLS, model.config.n_heads, run.devices, costly)
    if stats:
        c = model.config
        run.stats = _Stats(c.n_heads, run.devices, c.sliding_window or LOCAL)


def _attention(run: _Run, t: int) -> DeviceAttention:
    """The run's first t rows as a DeviceAttention, with what its passes accumulated over exactly those rows."""
    att = DeviceAttention([q[:, :t] for q in run.q], [k[:, :t] for k in run.k], [lse[:, :t] for lse in run.lse], t,
                          geometry=run.geometry)
    if run.overview is not None and run.overview.t == t:
        att.overviews = run.overview.layers()
    if run.stats is not None and run.stats.rows[0] == t:
        att.stats = run.stats.result()
    return att


@torch.inference_mode()
def generate(model, text: str | Sequence[int], max_new_tokens: int = 20, strategy: str = "greedy",
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
             pool: bool = True, steps: str = "auto", pool_cells: int | None = None, stats: bool = False,
             progress: Callable[[int, int], None] | None = None,
             should_stop: Callable[[], bool] | None = None) -> LongGeneration:
    """``model.generate(text, ...)`` (models/families/gpt.py: the same ids, candidates and surprisal; the attention
    within float error) with the attention kept on the device (module docstring). ``pool``: compute the pooled tiles (at
    most ``pool_cells`` a side, default ``POOL_CELLS``). ``stats``: the per-head statistics over every row (STATS).
    ``steps``: how each new token runs: "pass" (``_Run.layers``, shapes growing with the sequence), "fixed"
    (``_Run.step``, fixed shapes), "graph" (fixed shapes replayed as a CUDA graph on a CUDA device), "auto" (graph
    where the model sits whole on one CUDA device without accelerate hooks, else pass). The prompt runs
    PREFILL_TOKENS at a time, ``progress(done, total)`` after each chunk, ``Cancelled`` when ``should_stop()``."""
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
    _reductions(run, model, prompt_len + new, stats)
    target = torch.tensor(ids[1:] + [0], device=dev)
    last: list[Tensor] = []

    def surprisal(x0: int, x: Tensor) -> None:  # a chunk's vocabulary-wide logits, LOGIT_CHUNK rows at a time
        nll = []
        for a in range(x0, x0 + x.size(0), LOGIT_CHUNK):
            b = min(a + LOGIT_CHUNK, x0 + x.size(0))
            logits = run.logits(x[a - x0:b - x0]).float()
            e = min(b, prompt_len - 1)
            if e > a:
                logp = torch.log_softmax(logits[: e - a], -1)
                nll.append(-logp.gather(1, target[a:e, None].to(logp.device))[:, 0])
            last[:] = [logits[-1]]
        if nll:  # one copy to the host a chunk
            got = torch.cat(nll).cpu().numpy()
            dec.surprisal[1 + x0:1 + x0 + got.size] = got

    _prefill(run, ids, dev, None, progress, should_stop, surprisal)
    clock.mark("prompt_pass")
    logits = last[0]
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
    for tiles in (run.tiles, run.overview, None):  # the rows the fixed-shape steps made, or the tiles anew
        if run.rows_done < t and (tiles is None or tiles.t == t):
            DeviceAttention(run.q, run.k, run.lse, t, geometry=run.geometry).add_rows(
                tiles, run.rows_done, run.stats if tiles is None else None)
    attention = _attention(run, t)
    if run.tiles is not None and run.tiles.t == t:
        attention.pooled, attention.edges = run.tiles.result(), run.tiles.edges
    elif pool:  # stopped early (end of sequence): the blocks differ, all the tiles again
        attention.pool(pool_cells)
    clock.mark("tiles")
    decoding = "pass" if stepper is None else "graph" if stepper.graphed else "fixed"
    return LongGeneration(text=dec.text(), tokens=dec.tokens(), ids=ids, prompt_len=prompt_len, steps=dec.steps,
                          surprisal=dec.bits(), attention=attention, notice=dec.notice, decoding=decoding,
                          timings=clock.ms())
