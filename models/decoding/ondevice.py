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
(``ATTENTION_CHUNK_BYTES`` of float32 scores), so the prompt pass never holds (H, T, T) either. The pooled tiles
(max and mean, the blocks of ``viz.common.block_edges``) are computed per layer on the device after decoding,
when the number of rows is known, from q, k and lse; only they, the step candidates and the surprisal leave the
device. ``DeviceAttention.block``/``row`` move one zoomed block or row; ``full()`` materialises everything (tests,
short inputs), which is what ``LongGeneration.result()`` uses to give the app's ``GenerationResult``.

Every module is called through its own ``forward`` (norms, projections, feed-forward block), so a model dispatched
across devices by accelerate (``models/bigmodel.py``) runs here unchanged: each hook moves the stream to its
layer's device, and each layer's q, k and lse stay where that layer runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from models import limits
from models.blocks.positional import apply_rope
from models.io.bigmodel import execution_device as _device
from models.outputs import AttentionMap, GenerationResult, GenerationStep

ATTENTION_CHUNK_BYTES = 256 << 20  # float32 scores of one chunk of query rows (all heads × all keys)
LOGIT_CHUNK = 256  # prompt rows sent through the output projection at once (surprisal)
POOL_CELLS = 64  # pooled tiles: at most this many cells a side, as the app's model view


def block_edges(n: int, max_cells: int) -> np.ndarray:
    """Edges of equal blocks splitting ``n`` into ``ceil(n / ceil(n / max_cells))`` (``viz.common.block_edges``)."""
    factor = max(1, int(np.ceil(n / max_cells)))
    return np.minimum(np.arange(int(np.ceil(n / factor)) + 1) * factor, n)


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
        layer on its device; sets ``pooled`` and ``edges``."""
        t = self.length
        edges = block_edges(t, max_cells)
        n, f = len(edges) - 1, int(edges[1] - edges[0])
        maxes, means = [], []
        sizes = torch.from_numpy(np.diff(edges).astype(np.float32))
        for layer in range(len(self.q)):
            dev = self.q[layer].device
            h = self.q[layer].size(0)
            rows_per = max(f, (ATTENTION_CHUNK_BYTES // max(1, 4 * h * t)) // f * f)  # whole row blocks
            mx = torch.empty(h, n, n, device=dev)
            sm = torch.empty(h, n, n, device=dev)
            for r0 in range(0, t, rows_per):
                r1 = min(t, r0 + rows_per)
                w = self._weights(layer, torch.arange(r0, r1, device=dev), slice(0, t))  # (H, r, T)
                pad_r, pad_c = (-(r1 - r0)) % f, (-t) % f
                w = torch.nn.functional.pad(w, (0, pad_c, 0, pad_r))  # zeros: masked cells are zeros anyway
                w = w.view(h, w.size(1) // f, f, w.size(2) // f, f)
                b0 = r0 // f
                mx[:, b0 : b0 + w.size(1)] = w.amax(dim=(2, 4))
                sm[:, b0 : b0 + w.size(1)] = w.sum(dim=(2, 4))
            maxes.append(mx.cpu())
            means.append(sm.cpu() / (sizes[:, None] * sizes[None, :]))
        self.pooled = {"max": torch.stack(maxes).numpy(), "mean": torch.stack(means).numpy()}
        self.edges = edges

    def nbytes(self) -> int:
        return sum(x.numel() * x.element_size() for x in (*self.q, *self.lse))  # k is the cache's own


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

    def result(self) -> GenerationResult:
        """The app's ``GenerationResult`` with every weight materialised (only where T is small enough)."""
        weights = self.attention.full()
        return GenerationResult(text=self.text, tokens=self.tokens, ids=self.ids, prompt_len=self.prompt_len,
                                attention={"decoder": AttentionMap(weights, self.tokens, list(self.tokens))},
                                steps=self.steps, surprisal=self.surprisal, notice=self.notice)


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

    def layers(self, ids: Tensor, start: int) -> Tensor:
        """Tokens ``ids`` (T,) at positions start.. through every block; their residual stream (T, D)."""
        model, c = self.model, self.c
        t = ids.numel()
        end = start + t
        x = model.embed(ids)
        if model.positions is not None:
            x = x + model.positions(torch.arange(start, end, device=ids.device))
        h_q, h_kv, d = c.n_heads, c.kv_heads, c.d_head
        group = h_q // h_kv
        scale = 1.0 / math.sqrt(d)
        rows_per = max(1, ATTENTION_CHUNK_BYTES // (4 * h_q * end))
        rope: dict[torch.device, tuple[Tensor, Tensor]] = {}  # per device: cos and sin of this pass's angles
        for i, block in enumerate(model.blocks):
            dev = self.devices[i]
            x = x.to(dev)
            attn = block.attn
            h = block.norm1(x)
            q = attn.q_proj(h).view(t, h_q, d).transpose(0, 1)  # (H, T, d)
            k = attn.k_proj(h).view(t, h_kv, d).transpose(0, 1)  # (H_kv, T, d)
            v = attn.v_proj(h).view(t, h_kv, d).transpose(0, 1)
            if self.angles is not None:  # RoPE at the absolute positions start..end-1
                if dev not in rope:
                    angles = self.angles[start:end].to(dev)
                    rope[dev] = (angles.cos().to(q.dtype), angles.sin().to(q.dtype))
                q = apply_rope(q, None, c.rope_layout, rope[dev])
                k = apply_rope(k, None, c.rope_layout, rope[dev])
            self.q[i][:, start:end] = q
            self.k[i][:, start:end] = k
            self.v[i][:, start:end] = v
            keys = self.k[i][:, :end].transpose(1, 2)  # (H_kv, d, S) float32
            values = self.v[i][:, :end]  # (H_kv, S, d)
            out = torch.empty(h_q, t, d, device=dev, dtype=x.dtype)
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
            x = x + attn.o_proj(out.transpose(0, 1).reshape(t, h_q * d))
            x = x + block.ff(block.norm2(x))
        return x

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
        for i, block in enumerate(model.blocks):
            attn = block.attn
            h = block.norm1(x)
            q = attn.q_proj(h).view(1, h_q, d).transpose(0, 1)  # (H, 1, d)
            k = attn.k_proj(h).view(1, h_kv, d).transpose(0, 1)
            v = attn.v_proj(h).view(1, h_kv, d).transpose(0, 1)
            if cos_sin is not None:
                q, k = apply_rope(q, None, c.rope_layout, cos_sin), apply_rope(k, None, c.rope_layout, cos_sin)
            self.q[i].index_copy_(1, pos, q)
            self.k[i].index_copy_(1, pos, k.float())
            self.v[i].index_copy_(1, pos, v)
            s = torch.matmul(q.float().reshape(h_kv, group, d), self.k[i].transpose(1, 2)).mul_(scale)
            s = s.view(h_q, 1, n).masked_fill_(later, float("-inf"))  # (H, 1, n) float32
            lse = torch.logsumexp(s, -1)  # (H, 1)
            self.lse[i].index_copy_(1, pos, lse)
            w = torch.exp(s.sub_(lse[..., None]))
            out = torch.matmul(w.to(self.v[i].dtype).view(h_kv, group, n), self.v[i]).view(h_q, 1, d)
            x = x + attn.o_proj(out.transpose(0, 1).reshape(1, h_q * d))
            x = x + block.ff(block.norm2(x))
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


@torch.inference_mode()
def generate(model, text: str | Sequence[int], max_new_tokens: int = 20, strategy: str = "greedy",
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
             pool: bool = True, steps: str = "auto") -> LongGeneration:
    """``model.generate(text, ...)`` (models/gpt.py: the same ids, candidates and surprisal; the attention within
    float error) with the attention kept on the device (module docstring). ``pool``: compute the pooled tiles.
    ``steps``: how each new token runs: "pass" (``_Run.layers``, shapes growing with the sequence), "fixed"
    (``_Run.step``, fixed shapes), "graph" (fixed shapes replayed as a CUDA graph on a CUDA device), "auto" (graph
    where the model sits whole on one CUDA device without accelerate hooks, else pass)."""
    from models.families.gpt import sample

    ids, new, notice = model.prepare_prompt(text, max_new_tokens, strategy, temperature, top_k, top_p)
    prompt_len = len(ids)
    was_training = model.training
    model.eval()
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    eos = model.eos_id()
    run = _Run(model, prompt_len + new)
    dev = _device(model.embed)
    surprisal = np.full(prompt_len + new, np.nan, dtype=np.float32)
    x = run.layers(torch.tensor(ids, device=dev), 0)  # (P, D)
    target = torch.tensor(ids[1:] + [0], device=x.device)
    logits = None
    for a in range(0, prompt_len, LOGIT_CHUNK):  # vocabulary-wide logits a chunk of rows at a time
        b = min(a + LOGIT_CHUNK, prompt_len)
        logits = run.logits(x[a:b]).float()
        e = min(b, prompt_len - 1)
        if e > a:
            logp = torch.log_softmax(logits[: e - a], -1)
            surprisal[a + 1 : e + 1] = (-logp.gather(1, target[a:e, None].to(logp.device))[:, 0]).cpu().numpy()
    assert logits is not None
    logits = logits[-1]
    if steps == "auto":
        whole = len(set(run.devices)) == 1 and not any(hasattr(m, "_hf_hook") for m in model.modules())
        steps = "graph" if whole and dev.type == "cuda" else "pass"
    if steps not in ("pass", "fixed", "graph"):
        raise ValueError(f"steps must be auto, pass, fixed or graph, got {steps!r}")
    stepper = _Steps(run, dev, capture=steps == "graph") if steps != "pass" else None
    chosen: list[GenerationStep] = []
    for step in range(new):
        probs = torch.softmax(logits, -1)
        top = torch.topk(probs, min(5, probs.numel()))
        top_i, top_p_ = top.indices.cpu(), top.values.cpu()
        choice = int(top_i[0]) if strategy == "greedy" else sample(logits.cpu(), temperature, top_k, top_p, g)
        chosen.append(GenerationStep([model.piece(i) for i in top_i], top_p_.numpy().astype(np.float32),
                                     model.piece(choice), float(probs[choice])))
        surprisal[len(ids)] = -float(torch.log_softmax(logits, -1)[choice])
        ids.append(choice)
        last = choice == eos or step == new - 1
        if stepper is not None:  # its attention rows (the last token's too); the logits after it
            logits = stepper(choice, len(ids) - 1)
        else:
            x = run.layers(torch.tensor([choice], device=dev), len(ids) - 1)
            if not last:
                logits = run.logits(x)[0].float()
        if last:
            break
    model.train(was_training)
    t = len(ids)
    attention = DeviceAttention([q[:, :t] for q in run.q], [k[:, :t] for k in run.k],
                                [lse[:, :t] for lse in run.lse], t)
    if pool:
        attention.pool()
    tokens = [model.piece(i) for i in ids]
    decoding = "pass" if stepper is None else "graph" if stepper.graphed else "fixed"
    return LongGeneration(text=model.tokenizer.decode(ids[prompt_len:]) if model.tokenizer else "", tokens=tokens,
                          ids=ids, prompt_len=prompt_len, steps=chosen,
                          surprisal=surprisal[:t] / np.float32(math.log(2)), attention=attention, notice=notice,
                          decoding=decoding)
