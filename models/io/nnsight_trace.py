"""The code that runs where the model runs, inside an nnsight trace (issue 73): this machine (``remote=False``) or an
NDIF server (``remote=True``), which rebuilds this module from its source (``nnsight.register``; it imports torch and
math only, both on every NDIF server). models/io/nnsight_backend.py opens the model, builds the plan and reads what
comes back; this module reads the model's own modules through nnsight's envoys and saves only reductions.

Servers load models with sdpa, so ``attn.output[1]`` (the weights) is None: each layer's attention is computed here
from its projections, as ``CausalSelfAttention.forward`` and transformers' eager attention do (Vaswani et al. 2017,
eq. 1): a_ij = softmax_j(q_i·k_j / √d) over the keys query i may see (j ≤ i; within the window on a sliding layer),
with the model's own RoPE (its rotary module's cos and sin, rope scaling included) on q and k and one key head
shared by each group of query heads (grouped-query attention). Scores and softmax in float32 whatever the weights'
dtype, a chunk of query rows at a time (``CHUNK_BYTES`` of scores), so no layer holds (H, T, T) unless its full map
was asked for.

What a layer gives back (``reduce_layer``), the definitions of models/decoding/ondevice.py (the long-context store)
and models/analysis.py, which tests/test_nnsight.py holds them to on the same weights:

- ``max``/``mean`` (H, R, C), of the layers asked: tiles pooled over the blocks of ``block_edges(T, cells)`` (masked
  cells are zeros);
- ``stats`` (4, H) float64 sums over the rows of: entropy (nats), weight on key 0 (rows ≥ 1), distance Σ_j a_ij (i − j)
  and weight within the last ``local`` keys; read as means by the backend;
- ``rows``: the asked (head, query) rows (T,); ``full``: every weight (H, T, T) of an asked layer;
- ``roles`` (4, H): previous token, induction, duplicate token and first-token sink (``analysis.head_roles``) on
  BOS + n tokens repeated twice.

``views`` walks the layers in the order the model runs them (an envoy's output is read as its module runs) and adds
the logit lens (each layer's stream through the final norm and the output projection: top token, its probability and
the probability of the next token) and the token losses.
"""

from __future__ import annotations

import math

import torch

NEG = torch.finfo(torch.float32).min
CHUNK_BYTES = 64 << 20  # float32 scores of one chunk of query rows (all heads × all keys)
N_STATS = 4  # entropy, sink, distance, local (models.decoding.ondevice.STATS)
N_ROLES = 4  # previous, induction, duplicate, sink (models.analysis.HEAD_ROLES)


def block_edges(n: int, cells: int) -> list[int]:
    """Edges of equal blocks splitting ``n`` into ceil(n / ceil(n / cells)) (``viz.common.block_edges``)."""
    factor = max(1, -(-n // cells))
    return [min(i * factor, n) for i in range(-(-n // factor) + 1)]


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(T, heads · d) -> (heads, T, d)."""
    t = x.size(0)
    return x.reshape(t, heads, -1).transpose(0, 1)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (Su et al. 2021, transformers' ``apply_rotary_pos_emb``) of x (H, T, d) with the model's
    cos, sin (T, d), in x's dtype as transformers applies it."""
    half = x.size(-1) // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


def weights(q: torch.Tensor, k: torch.Tensor, scale: float, window: int, r0: int, r1: int) -> torch.Tensor:
    """Query rows r0..r1 − 1 of every head (H, r, T) float32: softmax of scale · q·k over the visible keys."""
    h, kv = q.size(0), k.size(0)
    keys = k.float().repeat_interleave(h // kv, 0)  # one key head for each group of query heads
    s = torch.matmul(q[:, r0:r1].float(), keys.transpose(1, 2)) * scale
    i = torch.arange(r0, r1, device=s.device)[:, None]
    j = torch.arange(k.size(1), device=s.device)[None, :]
    hidden = j > i
    if window:
        hidden = hidden | (j <= i - window)
    return torch.softmax(s.masked_fill(hidden, NEG), -1)


def reduce_layer(q: torch.Tensor, k: torch.Tensor, scale: float, window: int, plan: dict) -> dict:
    """One layer's reductions (module docstring) from q (H, T, d) and k (H_kv, T, d) after RoPE. ``plan``: cells,
    tiles (bool), local, rows [(head, query)], full (bool), roles_n (0: none), chunk_bytes."""
    h, t = q.size(0), q.size(1)
    dev = q.device
    edges = block_edges(t, int(plan["cells"]))
    f, n = edges[1] - edges[0], len(edges) - 1
    stats = torch.zeros(N_STATS, h, dtype=torch.float64, device=dev)
    local, roles_n, tiles = int(plan["local"]), int(plan.get("roles_n", 0)), bool(plan.get("tiles", True))
    maxes = torch.zeros(h, n, n, device=dev) if tiles else None
    sums = torch.zeros(h, n, n, device=dev) if tiles else None
    roles = torch.zeros(N_ROLES, h, dtype=torch.float64, device=dev)
    rows_out, full = {}, []
    per = max(f, int(plan.get("chunk_bytes", CHUNK_BYTES)) // max(1, 4 * h * t) // f * f)
    for r0 in range(0, t, per):
        r1 = min(t, r0 + per)
        w = weights(q, k, scale, window, r0, r1)  # (h, r, T)
        r = r1 - r0
        if tiles:  # chunks start on a row block's edge (``per`` is a multiple of f): each block is written once
            cols = torch.nn.functional.pad(w, (0, n * f - t)).unflatten(-1, (n, f))  # (h, r, n, f)
            col_max, col_sum = cols.amax(-1), cols.sum(-1)
            back = -r % f
            b0 = r0 // f
            m = torch.nn.functional.pad(col_max, (0, 0, 0, back)).unflatten(1, (-1, f)).amax(2)
            s = torch.nn.functional.pad(col_sum, (0, 0, 0, back)).unflatten(1, (-1, f)).sum(2)
            maxes[:, b0:b0 + m.size(1)] = m
            sums[:, b0:b0 + s.size(1)] = s
        i = torch.arange(r0, r1, device=dev)
        j = torch.arange(t, device=dev)
        ent = -torch.where(w > 0, w * torch.log(w.clamp_min(1e-45)), torch.zeros_like(w)).sum(-1)  # (h, r)
        dist = i.float() - torch.matmul(w, j.float())
        near = (w * (j[None, :] > i[:, None] - local)).sum(-1)
        first = (i >= 1).float()
        stats[0] += ent.double().sum(-1)
        stats[1] += (w[..., 0] * first).double().sum(-1)
        stats[2] += dist.double().sum(-1)
        stats[3] += near.double().sum(-1)
        if roles_n:
            back1 = torch.clamp(i - 1, min=0)
            roles[0] += (w.gather(2, back1[None, :, None].expand(h, r, 1))[..., 0] * first).double().sum(-1)
            second = ((i >= roles_n + 1) & (i <= 2 * roles_n)).float()
            for slot, offset in ((1, roles_n - 1), (2, roles_n)):
                key = torch.clamp(i - offset, min=0)
                roles[slot] += (w.gather(2, key[None, :, None].expand(h, r, 1))[..., 0] * second).double().sum(-1)
            roles[3] += (w[..., 0] * first).double().sum(-1)
        for head, query in plan.get("rows", ()):
            if r0 <= query < r1:
                rows_out[f"{head}:{query}"] = w[head, query - r0].cpu()
        if plan.get("full"):
            full.append(w)
    sizes = torch.tensor([b - a for a, b in zip(edges[:-1], edges[1:])], dtype=torch.float32, device=dev)
    out = {"stats": (stats / torch.tensor([t, max(1, t - 1), t, t], dtype=torch.float64, device=dev)[:, None]).cpu(),
           "rows": rows_out}
    if tiles:
        out["max"], out["mean"] = maxes.cpu(), (sums / (sizes[:, None] * sizes[None, :])).cpu()
    if roles_n:
        out["roles"] = (roles / torch.tensor([max(1, t - 1), roles_n, roles_n, max(1, t - 1)],
                                             dtype=torch.float64, device=dev)[:, None]).cpu()
    if plan.get("full"):
        out["full"] = torch.cat(full, 1).cpu()
    return out


def views(lm, layout: dict, ids: torch.Tensor, plan: dict) -> dict:
    """Inside ``lm.trace(ids)``: every layer's ``reduce_layer`` (``plan["layers"]``: the plan of each layer), the
    logit lens over the last ``plan["lens_last"]`` positions (0: none) and the token losses. ``layout``:
    kind ("gpt2" or "llama"), heads, kv_heads, d_model, scale, windows (one per layer)."""
    gpt2 = layout["kind"] == "gpt2"
    base = lm.transformer if gpt2 else lm.model
    blocks = base.h if gpt2 else base.layers
    final_norm = base.ln_f if gpt2 else base.norm
    heads, kv, width = int(layout["heads"]), int(layout["kv_heads"]), int(layout["d_model"])
    cos = sin = None
    if not gpt2:
        cos, sin = base.rotary_emb.output
        cos, sin = cos[0], sin[0]  # (T, d)
    x = ids[0].to(torch.long)
    t = x.size(0)
    lens_last = int(plan.get("lens_last", 0))
    start = max(0, t - lens_last)
    layers, tops, top_p, next_p, last_p = [], [], [], [], []
    for i, layer_plan in enumerate(plan["layers"]):
        block = blocks[i]
        if gpt2:
            q, k, _ = block.attn.c_attn.output[0].split(width, -1)
        else:
            q, k = block.self_attn.q_proj.output[0], block.self_attn.k_proj.output[0]
        q, k = split_heads(q, heads), split_heads(k, kv)
        if cos is not None:
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        layers.append(reduce_layer(q, k, float(layout["scale"]), int(layout["windows"][i]), layer_plan))
        if lens_last:
            stream = block.output
            stream = stream[0] if isinstance(stream, tuple) else stream
            p = torch.softmax(lm.lm_head(final_norm(stream))[0, start:].float(), -1)  # (T', V), a layer at a time
            best = p.max(-1)
            tops.append(best.indices.cpu())
            top_p.append(best.values.cpu())
            following = x[start + 1:].to(p.device)
            next_p.append(p[:-1].gather(1, following[:, None])[:, 0].cpu())
            last_p.append(p[-1])
    logits = lm.output.logits[0].float()
    out = {"layers": layers, "last_logits": logits[-1].cpu(),
           "losses": torch.nn.functional.cross_entropy(logits[:-1], x[1:].to(logits.device), reduction="none").cpu()}
    if lens_last:
        choice = int(logits[-1].argmax())
        chosen = torch.stack([p[choice].cpu() for p in last_p])[:, None]  # (L, 1): the final layer's choice
        out["lens"] = {"top": torch.stack(tops), "top_p": torch.stack(top_p),
                       "next_p": torch.cat([torch.stack(next_p), chosen], 1), "choice": choice}
    return out


def full_bytes(layers: int, heads: int, tokens: int, item: int = 2) -> int:
    """Bytes of every attention weight of one forward over ``tokens`` (L, H, T, T) at ``item`` bytes a weight."""
    return layers * heads * tokens * tokens * item


def scale_of(d_head: int) -> float:
    return 1.0 / math.sqrt(d_head)
