"""What a compressed KV cache forgets (issue 72): KV-eviction policies ("presses") as plain functions over the
model's own attention and keys, and generation from the cut cache beside generation from the full one.

A press scores every context position of every layer and key-value head from what the long-context store keeps
(models/decoding/ondevice.py: post-RoPE queries and keys, each row's log-sum-exp, so any attention weight is exact
on demand) and the values, and keeps the best ``max(1, int(T · (1 − ratio)))`` positions per head (a ratio of 0.25
removes a quarter). The scores follow the definitions collected by NVIDIA's kvpress (0.5.5; its presses of the same
names), each after its paper:

- ``streaming_llm``: the first ``sinks`` positions and the most recent ones (Xiao et al. 2023, "Efficient Streaming
  Language Models with Attention Sinks"); no attention read.
- ``observed_attention`` (H2O, Zhang et al. 2023): the attention a key receives summed over every query of the
  context, divided by the number of queries that can see it (T − j), averaged over the query heads of a group.
- ``snapkv`` (Li et al. 2024): the attention of the last ``window`` queries, averaged over them, smoothed by a mean
  of ``kernel`` neighbours (zero-padded), averaged over the group; the window itself always kept.
- ``tova`` (Oren et al. 2024): the last query's attention averaged over every query head (one score for all key
  heads); the last position always kept.
- ``knorm`` (Devoto et al. 2024): the negated L2 norm of each key (low-norm keys draw attention).
- ``pyramidkv`` (Cai et al. 2024): SnapKV's scores with a budget per layer, falling linearly from the first layer to
  the last (``beta`` sets the slope; the mean budget is the ratio's, PyramidKV's reference formula).
- ``expected_attention`` (Devoto et al. 2025): the attention future queries are expected to pay, the queries
  modelled as a Gaussian of the context's pre-RoPE queries (the first ``sinks`` left out), rotated by RoPE averaged
  over the next ``future`` positions: E[exp(s q·k)] = exp(s μ·k + s² kᵀΣk / 2), softmaxed over the keys, averaged
  over the group, times ‖v‖; the sinks always kept.

``per_head`` (AdaKV, Feng et al. 2024): the same total budget per layer, spent across the key-value heads by one
ranking of all their scores, each head keeping at least ``alpha`` of its even share.

The cut cache is applied as a mask: an evicted key's score is set to the masked value for every row after the
context, which gives the same softmax as removing it (exp of the masked score is 0), so the kept keys keep their
RoPE positions and the new tokens continue at the original positions, as kvpress's pipeline does. The context itself
is read with the full cache (a press acts after the prompt pass). ``compare`` runs both arms greedily from one prompt
pass: each answer, per step the KL divergence of the compressed arm's next-token distribution from the full arm's
along the full answer (teacher-forced), whether their top tokens agree, and the step where the free answers part.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from models import limits
from models.blocks.loop import Decoding
from models.blocks.positional import apply_rope, rope_angles
from models.decoding.ondevice import NEG, DeviceAttention, Geometry, _prefill, _Run, refusal
from models.io.bigmodel import execution_device as _device
from models.outputs import GenerationStep

PRESSES = ("streaming_llm", "observed_attention", "snapkv", "tova", "knorm", "pyramidkv", "expected_attention")
LABELS = {"streaming_llm": "StreamingLLM (sinks + recent)", "observed_attention": "ObservedAttention (H2O)",
          "snapkv": "SnapKV", "tova": "TOVA", "knorm": "Knorm (key norm)", "pyramidkv": "PyramidKV",
          "expected_attention": "ExpectedAttention"}


@dataclass(frozen=True)
class Press:
    """A press and its settings (the defaults are kvpress's)."""

    name: str = "snapkv"  # one of PRESSES
    ratio: float = 0.5  # share of the context's key-value pairs removed, 0 <= ratio < 1
    per_head: bool = False  # AdaKV: one budget per layer, spread across the key-value heads by their scores
    alpha: float = 0.2  # AdaKV's safeguard: each head keeps at least this share of its even budget
    window: int = 64  # SnapKV / PyramidKV: the observation window (the last queries of the context)
    kernel: int = 5  # SnapKV / PyramidKV: the smoothing of the window's attention
    beta: int = 20  # PyramidKV: the pyramid's steepness (>= 1)
    sinks: int = 4  # StreamingLLM / ExpectedAttention: the first positions always kept
    future: int = 512  # ExpectedAttention: future positions RoPE is averaged over
    covariance: bool = True  # ExpectedAttention: the queries' covariance term
    vnorm: bool = True  # ExpectedAttention: scores times the value norm
    epsilon: float = 0.0  # ExpectedAttention: added to the scores before the value norm

    def check(self, t: int) -> None:
        """ValueError, in words, for settings this press cannot apply to a context of ``t`` tokens."""
        if self.name not in PRESSES:
            raise ValueError(f"press must be one of {', '.join(PRESSES)}, got {self.name!r}")
        if not 0 <= self.ratio < 1:
            raise ValueError(f"the compression ratio must be at least 0 and below 1, got {self.ratio}")
        if not 0 <= self.alpha <= 1:
            raise ValueError(f"AdaKV's safeguard alpha must be in [0, 1], got {self.alpha}")
        if self.per_head and self.name == "observed_attention":
            raise ValueError("per-head budgets (AdaKV) are not defined over ObservedAttention (as in kvpress)")
        if self.name in ("snapkv", "pyramidkv"):
            if self.window < 1 or self.kernel < 1 or self.kernel % 2 == 0:
                raise ValueError("SnapKV needs a window of at least 1 and an odd kernel")
            if t <= self.window:
                raise ValueError(f"SnapKV's window of {self.window} needs a context longer than it ({t} tokens)")
        if self.name == "pyramidkv" and self.beta < 1:
            raise ValueError(f"PyramidKV's beta must be at least 1, got {self.beta}")
        if self.name in ("streaming_llm", "expected_attention"):
            if self.sinks < 0:
                raise ValueError("the number of sinks cannot be negative")
            if t <= self.sinks:
                raise ValueError(f"{self.sinks} sinks need a context longer than them ({t} tokens)")
        if self.name == "expected_attention" and self.future < 1:
            raise ValueError("ExpectedAttention needs at least one future position")
        if self.name == "tova" and t < 2:
            raise ValueError("TOVA needs a context of at least 2 tokens")


def n_kept(t: int, ratio: float) -> int:
    """Key-value pairs a head keeps of ``t`` at ``ratio`` (never none)."""
    return max(1, int(t * (1 - ratio)))


@dataclass
class Store:
    """A context read by the long-context store: its attention (q, k, lse, geometry), the values and the model."""

    attention: DeviceAttention
    v: list[Tensor]  # (H_kv, T, d) per layer
    model: object

    @property
    def length(self) -> int:
        return self.attention.length

    def group(self) -> int:
        return self.attention.q[0].size(0) // self.attention.k[0].size(0)

    def weights(self, layer: int, r0: int, r1: int) -> Tensor:
        """Rows r0..r1 − 1 over every key (H, r, T) float32, exact (zeros where a row cannot look)."""
        a = self.attention
        rows = torch.arange(r0, r1, device=a.q[layer].device)
        return a._weights(layer, rows, slice(0, self.length))


def _by_group(s: Tensor, group: int) -> Tensor:
    """(H, T) -> (H_kv, T): the mean over each key-value head's query heads."""
    return s.view(s.size(0) // group, group, s.size(-1)).mean(1)


def _observed(store: Store, layer: int) -> Tensor:
    t, a = store.length, store.attention
    col = torch.zeros(a.q[layer].size(0), t, device=a.q[layer].device)
    for _, _, lo, w in a._each_chunk(layer, slice(None), 0, t, 0, t):  # never the whole (H, T, T)
        col[:, lo:lo + w.size(-1)] += w.sum(1)
    col /= torch.arange(t, 0, -1, device=col.device, dtype=col.dtype)  # the queries that see key j: T − j
    return _by_group(col, store.group())


def _snapkv(store: Store, layer: int, p: Press) -> Tensor:
    t, w = store.length, p.window
    s = store.weights(layer, t - w, t)[..., : t - w].mean(1)  # (H, T − w): the window's attention, averaged
    s = F.avg_pool1d(s[:, None], p.kernel, stride=1, padding=p.kernel // 2)[:, 0]  # zeros count (count_include_pad)
    s = _by_group(s, store.group())
    return F.pad(s, (0, w), value=float(s.max()) + 1)  # the window itself is always kept


def _tova(store: Store, layer: int) -> Tensor:
    t = store.length
    s = store.weights(layer, t - 1, t)[:, 0, : t - 1].mean(0)  # (T − 1,): the last query, every head
    s = s[None].expand(store.attention.k[layer].size(0), -1)
    return F.pad(s, (0, 1), value=float(s.max()) + 1)


def _knorm(store: Store, layer: int) -> Tensor:
    return -torch.linalg.vector_norm(store.attention.k[layer].float(), dim=-1)


def _angles(model, local: bool, t0: int, t1: int) -> Tensor | None:
    """The RoPE angles (t1 − t0, r/2) of positions t0..t1 − 1, from the model's own table or, past it, its formula."""
    table = getattr(model, "angles_local" if local else "angles", None) if model.positions is None else None
    if table is None:
        return None
    if t1 <= table.size(0):
        return table[t0:t1]
    c = model.config
    return rope_angles(t1 - t0, c.rotary_width, c.local_rope_base if local else c.rope_base, offset=t0)


def _expected(store: Store, layer: int, p: Press) -> Tensor:
    model, a = store.model, store.attention
    spec = model.spec.blocks[layer]
    t, n = store.length, p.sinks
    q = a.q[layer].float()  # (H, T, d) after RoPE
    d = q.size(-1)
    dev = q.device
    angles = _angles(model, bool(spec.local_rope), 0, t)
    if angles is not None:  # the pre-RoPE queries: each rotated back by its own angle
        q = apply_rope(q, -angles.to(dev).float(), spec.rope_layout, rotary_dim=spec.rotary_dim)
    q = q[:, n:]
    mu = q.mean(1)  # (H, d)
    future = _angles(model, bool(spec.local_rope), t, t + p.future)
    rt = torch.eye(d, device=dev)  # R̄ᵀ: the mean rotation of the next positions (identity without RoPE)
    if future is not None:  # row j of the mean of R(p)·e_j over p is column j of R̄
        basis = torch.eye(d, device=dev)[:, None, :].expand(d, p.future, d)
        rt = apply_rope(basis, future.to(dev).float(), spec.rope_layout, rotary_dim=spec.rotary_dim).mean(1)
    mu = mu @ rt  # R̄ μ as a row
    keys = a.k[layer][:, n:].float()  # (H_kv, T', d)
    kk = keys.repeat_interleave(store.group(), 0)  # (H, T', d)
    scale = a.geom(layer).scale
    s = torch.einsum("hd,htd->ht", mu, kk) * scale
    if p.covariance:
        centred = q - q.mean(1, keepdim=True)
        cov = torch.einsum("hti,htj->hij", centred, centred) / q.size(1)
        cov = rt.T @ cov @ rt  # R̄ Σ R̄ᵀ
        s = s + torch.einsum("hti,hij,htj->ht", kk, cov, kk) * (scale * scale / 2)
    s = _by_group(torch.softmax(s, -1), store.group())
    if p.vnorm:
        s = (s + p.epsilon) * torch.linalg.vector_norm(store.v[layer][:, n:].float(), dim=-1)
    return F.pad(s, (n, 0), value=float(s.max()) + 1)


def scores(store: Store, layer: int, press: Press) -> Tensor:
    """The press's score of every context position for each key-value head of ``layer``: (H_kv, T) float32, higher
    kept first (StreamingLLM: 1 kept, 0 evicted)."""
    t = store.length
    press.check(t)
    if press.name == "streaming_llm":
        s = torch.ones(store.attention.k[layer].shape[:2], device=store.attention.k[layer].device)
        pruned = t - int(t * (1 - press.ratio))
        s[:, press.sinks:press.sinks + pruned] = 0
        return s
    if press.name == "observed_attention":
        return _observed(store, layer)
    if press.name in ("snapkv", "pyramidkv"):
        return _snapkv(store, layer, press)
    if press.name == "tova":
        return _tova(store, layer)
    if press.name == "knorm":
        return _knorm(store, layer)
    return _expected(store, layer, press)


def pyramid_budget(t: int, layer: int, layers: int, press: Press) -> int:
    """PyramidKV's budget of ``layer`` (of ``layers``) for a context of ``t``: the layers' budgets fall linearly
    from max_num to min_num = max_num / beta-ish, their mean the ratio's (SnapKV's budget where the pyramid does not
    fit, floored to 1)."""
    w = press.window
    top = w + t * (1 - press.ratio)  # max_capacity_prompt
    low = (top - w) / press.beta
    high = (top - w) * 2 - low
    if high >= t - w:
        high = t - w
        low = (top - w) * 2 - high
    if not t >= high >= low >= w:
        return max(1, round(t * (1 - press.ratio)))
    step = (high - low) / (layers - 1) if layers > 1 else 0.0
    return round(high - layer * step)


def _keep(s: Tensor, press: Press, layer: int, layers: int) -> Tensor:
    """The kept mask (H_kv, T) bool from the scores (H_kv, T)."""
    h, t = s.shape
    keep = torch.zeros(h, t, dtype=torch.bool, device=s.device)
    if press.ratio == 0:
        return keep.fill_(True)
    if press.per_head:  # AdaKV: a safeguard per head, then the layer's lowest scores across its heads go
        kept = n_kept(t, press.ratio)
        safe = int(kept * press.alpha)
        if press.alpha > 0:
            safe = max(1, safe)
        s = s.clone()
        s.scatter_(-1, s.topk(safe, -1).indices, torch.finfo(s.dtype).max)
        pruned = (-s.reshape(-1)).topk(h * (t - kept)).indices
        keep.view(-1).fill_(True)
        keep.view(-1)[pruned] = False
        return keep
    kept = pyramid_budget(t, layer, layers, press) if press.name == "pyramidkv" else n_kept(t, press.ratio)
    return keep.scatter_(-1, s.topk(min(kept, t), -1).indices, True)


@dataclass
class Kept:
    """What a press keeps of a context: per layer and key-value head the kept mask and the scores."""

    press: Press
    mask: np.ndarray  # (L, H_kv, T) bool
    scores: np.ndarray  # (L, H_kv, T) float32

    def positions(self, layer: int, head: int) -> np.ndarray:
        """The kept positions of one layer's key-value head, ascending."""
        return np.flatnonzero(self.mask[layer, head])

    def heads_keeping(self) -> np.ndarray:
        """(T,) int: how many (layer, key-value head) pairs keep each position."""
        return self.mask.sum((0, 1))

    def share(self) -> float:
        """The share of the context's key-value pairs kept, over every layer and head."""
        return float(self.mask.mean())


def choose(store: Store, press: Press) -> Kept:
    """Every layer's scores and kept mask under ``press``."""
    layers = len(store.attention.q)
    press.check(store.length)
    masks, all_scores = [], []
    for i in range(layers):
        s = scores(store, i, press)
        masks.append(_keep(s, press, i, layers).cpu().numpy())
        all_scores.append(s.float().cpu().numpy())
    return Kept(press, np.stack(masks), np.stack(all_scores))


@dataclass(frozen=True, eq=False)
class Evicting(Geometry):
    """A layer's geometry with the cut cache: rows at or after ``context`` cannot see the ``evicted`` keys
    (H, context) bool, as if those keys and values were removed (their exp is 0)."""

    evicted: Tensor | None = None
    context: int = 0

    def scores(self, s: Tensor, rows: Tensor, c0: int, always: bool = False) -> Tensor:
        s = super().scores(s, rows, c0, always)
        ev = self.evicted
        if ev is None or c0 >= self.context or int(rows[-1]) < self.context:
            return s
        if s.size(0) != ev.size(0):
            raise ValueError("the compressed arm's attention is read for every head at once")
        c1 = min(self.context, c0 + s.size(-1))
        hide = (rows >= self.context)[None, :, None] & ev[:, None, c0:c1].to(s.device)
        s[..., : c1 - c0].masked_fill_(hide, NEG)
        return s


@dataclass
class Arm:
    """One arm's greedy answer: its ids (prompt first), tokens, text, steps and attention (q, k, lse kept)."""

    ids: list[int]
    tokens: list[str]
    text: str
    steps: list[GenerationStep]
    attention: DeviceAttention | None  # None: not kept (``compare_many(keep_attention=False)``)

    @property
    def new_ids(self) -> list[int]:
        return self.ids[len(self.ids) - len(self.steps):]


@dataclass
class Comparison:
    """The full-cache and compressed-cache answers to one prompt, and how far apart they are."""

    kept: Kept
    context_len: int  # the compressed part of the prompt (a question after it is kept whole)
    full: Arm
    compressed: Arm
    kl: np.ndarray  # (steps,) nats: KL(full ‖ compressed) of the next token along the full answer
    agree: np.ndarray  # (steps,) bool: their top tokens agree along the full answer
    parted: int | None  # the first step where the two answers differ; None: the same answer
    notice: str = ""
    extra: dict = field(default_factory=dict)


def _snapshot(run: _Run, t: int) -> DeviceAttention:
    return DeviceAttention([q[:, :t].clone() for q in run.q], [k[:, :t].clone() for k in run.k],
                           [x[:, :t].clone() for x in run.lse], t, geometry=list(run.geometry))


def _decode(run: _Run, model, prompt: list[int], context: int, new: int, context_logits: Tensor,
            dev: torch.device) -> tuple[Decoding, list[Tensor]]:
    """Greedy decoding from the run's context rows: the question (prompt[context:]) then up to ``new`` tokens; the
    decoding and the logits (V,) before each step."""
    dec = Decoding.start(model, list(prompt), new)
    logits = context_logits
    if len(prompt) > context:
        x = run.layers(torch.tensor(prompt[context:], device=dev), context)
        logits = run.logits(x[-1:])[0].float()
    seen = []
    while not dec.finished:
        seen.append(logits)
        choice = dec.choose(logits)
        x = run.layers(torch.tensor([choice], device=dev), len(dec.ids) - 1)  # its rows, the last token's too
        if not dec.finished:
            logits = run.logits(x)[0].float()
    return dec, seen


def _arm(dec: Decoding, attention: DeviceAttention) -> Arm:
    return Arm(list(dec.ids), dec.tokens(), dec.text(), list(dec.steps), attention)


def encode(model, text: str | Sequence[int]) -> list[int]:
    ids = list(text) if not isinstance(text, str) else model.encode_prompt(text)[0]
    return [int(i) for i in ids]


def compare(model, context: str | Sequence[int], question: str | Sequence[int] = (), press: Press = Press(),
            max_new_tokens: int = 20) -> Comparison:
    """The context read once with the full cache, cut by ``press``, then the question and a greedy answer from the
    full cache and from the cut one (module docstring). ``question``: text (or ids) after the context, read whole
    by both arms (kvpress's question); empty: the answer follows the context directly."""
    return compare_many(model, context, question, [press], max_new_tokens)[0]


@torch.inference_mode()
def compare_many(model, context: str | Sequence[int], question: str | Sequence[int] = (),
                 presses: Sequence[Press] = (Press(),), max_new_tokens: int = 20,
                 keep_attention: bool = True) -> list[Comparison]:
    """``compare`` for several presses from one prompt pass and one full-cache answer (the context's rows are never
    written again: each arm writes only the positions after it). Each comparison's compressed attention is its own
    copy where there are several; ``keep_attention=False``: no compressed arm keeps its attention (``None``), which
    a bench of many presses over a long context needs (each copy is the whole store's size)."""
    why = refusal(model)
    if why:
        raise ValueError(why)
    ctx = encode(model, context)
    if not ctx:
        raise ValueError("the context is empty")
    q = [] if isinstance(question, str) and not question.strip() else encode(model, question)
    if isinstance(question, str) and q and q[0] == getattr(model.config, "bos_id", None) and model._adds_bos():
        q = q[1:]  # the question continues the context: no second BOS
    presses = list(presses)
    if not presses:
        raise ValueError("no press to compare")
    for press in presses:
        press.check(len(ctx))
    limit = model.context_limit()
    new = max(1, min(int(max_new_tokens), limits.MAX_NEW_TOKENS))
    if len(ctx) + len(q) + new > limit:
        raise ValueError(f"{len(ctx) + len(q):,} prompt tokens and {new} new ones exceed the model's {limit:,}")
    was_training = model.training
    model.eval()
    try:
        return _compare(model, ctx, q, presses, new, keep_attention)
    finally:
        model.train(was_training)


def _compare(model, ctx: list[int], q: list[int], presses: list[Press], new: int,
             keep_attention: bool = True) -> list[Comparison]:
    c = len(ctx)
    prompt = ctx + q
    run = _Run(model, c + len(q) + new)
    dev = _device(model.embed)
    x = _prefill(run, ctx, dev, None, None, None)
    context_logits = run.logits(x[-1:])[0].float()
    store = Store(DeviceAttention([t[:, :c] for t in run.q], [t[:, :c] for t in run.k], [t[:, :c] for t in run.lse],
                                  c, geometry=list(run.geometry)), [t[:, :c] for t in run.v], model)
    plain = list(run.geometry)
    full_dec, full_logits = _decode(run, model, prompt, c, new, context_logits, dev)
    full = _arm(full_dec, _snapshot(run, len(full_dec.ids)))
    pf = torch.stack(full_logits).double().log_softmax(-1)
    group = model.config.n_heads // model.config.kv_heads
    steps = len(full_dec.steps)
    out = []
    for press in presses:
        kept = choose(store, press)
        run.geometry = [Evicting(**{f: getattr(g, f) for f in ("scale", "window", "softcap", "prefix")},
                                 evicted=torch.from_numpy(~kept.mask[i]).repeat_interleave(group, 0)
                                 .to(run.devices[i]), context=c) for i, g in enumerate(plain)]
        # teacher-forced along the full answer: the compressed arm's distribution at each of its steps
        forced = q + full.new_ids[:-1]
        rows: list[Tensor] = []
        if forced:
            y = run.logits(run.layers(torch.tensor(forced, device=dev), c)).float()
            rows = list(y[len(q) - 1:] if q else y)
        tf = (([] if q else [context_logits]) + rows)[:steps]
        comp_dec, _ = _decode(run, model, prompt, c, new, context_logits, dev)
        t = len(comp_dec.ids)
        attention = None if not keep_attention else _snapshot(run, t) if len(presses) > 1 else DeviceAttention(
            [v[:, :t] for v in run.q], [v[:, :t] for v in run.k], [v[:, :t] for v in run.lse], t,
            geometry=run.geometry)
        compressed = _arm(comp_dec, attention)
        pc = torch.stack(tf).double().to(pf.device).log_softmax(-1)
        kl = (pf.exp() * (pf - pc)).sum(-1).clamp_min(0).cpu().numpy()
        agree = (pf.argmax(-1) == pc.argmax(-1)).cpu().numpy()
        a, b = full.new_ids, compressed.new_ids
        parted = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
        if parted is None and len(a) != len(b):
            parted = min(len(a), len(b))
        out.append(Comparison(kept, c, full, compressed, kl, agree, parted))
    run.geometry = plain
    return out


def kvpress_name(press: Press) -> str:
    """The press's kvpress class name (for citing which scoring it follows)."""
    names = {"streaming_llm": "StreamingLLMPress", "observed_attention": "ObservedAttentionPress",
             "snapkv": "SnapKVPress", "tova": "TOVAPress", "knorm": "KnormPress", "pyramidkv": "PyramidKVPress",
             "expected_attention": "ExpectedAttentionPress"}
    name = names[press.name]
    return f"AdaKVPress({name})" if press.per_head else name


def summary(cmp: Comparison) -> dict:
    """The numbers of one comparison as plain JSON values (the API's answer, the bench's row)."""
    k = cmp.kept
    return {"press": k.press.name, "kvpress": kvpress_name(k.press), "ratio": k.press.ratio,
            "per_head": k.press.per_head,
            "context_tokens": cmp.context_len, "kept_share": round(k.share(), 6),
            "full_answer": cmp.full.text, "compressed_answer": cmp.compressed.text,
            "kl": [round(float(x), 6) for x in cmp.kl], "agree": [bool(x) for x in cmp.agree],
            "mean_kl": round(float(np.mean(cmp.kl)), 6) if cmp.kl.size else 0.0,
            "parted": cmp.parted, "same_answer": cmp.parted is None}

