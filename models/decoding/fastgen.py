"""``GPT.generate``'s result, computed the way a server computes it (docs/ARCHITECTURE.md §2, the serving layer).

``models/families/gpt.py`` is the readable version: a KV-cache loop that uses the fused attention kernel, then one more
explicit pass over every token for the attention rows and the surprisal. This module returns the same
``GenerationResult`` (the same token ids, texts and candidates; every attention weight, probability and surprisal
equal up to summation order) in about 30 % less time on a GPT-2-small-shaped model (``bench/generate.py``):

- the attention weights are computed while decoding: the prompt pass and each new token go through the explicit
  softmax (a few hundred keys at most), so no final pass re-reads every weight matrix for every token; the last
  token chosen goes through the layers once more for its attention rows alone (no output projection, no last
  feed-forward layer);
- the surprisal of the prompt's tokens comes from the prompt pass (the output projection over the prompt's rows,
  a chunk of rows at a time), that of each generated token from the step that chose it;
- keys and values go into a cache allocated once for the whole sequence (token-major, one copy per layer and
  step), not grown by ``torch.cat``; the attention rows are written straight into the result's array; query
  heads that share a key/value head (grouped-query attention) read it through a reshape, not a copy;
- the model's own weights do the arithmetic, as plain functions made once per model (``plan``): its norms, and
  its linear layers through ``models.decoding.packed.joined``, so the layers the model store packed run on their fp16
  copies, and the query, key and value projections (and LLaMA's gate and up) are one multiply each. That costs
  one more fp16 copy of those weights per served model (GPT-2 small: 42 MB);
- everything runs under ``torch.inference_mode``.

A decoding step then reads each weight once, nearly at the machine's memory bandwidth: what is left above the
floor is the prompt pass, the last token's pass and a few hundred small operations per step.

``generate(model, text, ...)`` takes ``GPT.generate``'s arguments. It reads the model's block description
(models/blocks/decoder.py) and computes only what ``KNOWS`` lists; a model with anything else (a field value it was not
taught, or an attention or feed-forward module with more than its projections) goes to ``model.generate`` unchanged.
``tests/test_fastgen.py`` compares the two field by field.
"""

from __future__ import annotations

import functools
import math
import os
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from models import limits
from models.blocks.decoder import Knows, count, empty, flag, off, one_of, spec_of, zero
from models.blocks.decoder import refusal as spec_refusal
from models.blocks.layers import ACTIVATIONS
from models.blocks.loop import Decoding
from models.blocks.positional import ROPE_LAYOUTS, apply_rope
from models.decoding.packed import joined
from models.io.bigmodel import dispatched
from models.outputs import GenerationResult

LOGIT_CHUNK = 256  # prompt rows sent through the output projection at once (vocabulary-wide logits each)
ATTENTION_PARTS = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"})
FF_PARTS = frozenset({"up", "gate", "down"})


# What this module's loop computes, field by field of the block description (models/blocks/decoder.py); anything
# else is refused and decoded by model.generate.
KNOWS: Knows = {
    "positions": one_of("rope", "learned"), "embed_scale": zero, "final_softcap": zero, "prefix_lm": off,
    "residual": one_of("sequential", "parallel"), "norm": one_of("rmsnorm", "layernorm"), "sandwich": off,
    "qkv_bias": flag, "o_bias": flag, "rope": one_of("none", "full", "partial"), "rotary_dim": count,
    "rope_layout": one_of(*ROPE_LAYOUTS), "local_rope": off, "qk_norm": flag, "window": zero, "attn_scale": zero,
    "attn_softcap": zero, "ff": one_of("gated", "mlp"), "ff_act": one_of(*ACTIVATIONS), "ff_bias": flag,
    "experts": zero, "experts_per_token": zero,
    "mrope_section": empty}


def refusal(model) -> str | None:
    """None when this module computes what ``model.generate`` computes; else why not, in words: not a
    ``models.families.gpt.GPT``, a description field it does not know (``KNOWS``), or a module with parts beyond its
    projections (and the per-head q/k norms)."""
    spec = spec_of(model)
    if spec is None:
        return f"{type(model).__name__} has no decoder block description"
    why = spec_refusal(spec, KNOWS, "fastgen")
    if why:
        return why
    for block in model.blocks:
        for module, parts in ((block.attn, ATTENTION_PARTS), (block.ff, FF_PARTS)):
            extra = {name for name, m in module.named_children() if m is not None} - parts
            if extra or any(p is not None for p in module._parameters.values()):
                return f"fastgen does not know the parts {sorted(extra) or 'of its own'} of {type(module).__name__}"
    return None


def supports(model) -> bool:
    """Whether this module computes what ``model.generate`` computes (``refusal`` is None)."""
    return refusal(model) is None


def generate(model, text: str | Sequence[int], max_new_tokens: int = 20, strategy: str = "greedy",
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0) -> GenerationResult:
    """``model.generate(text, ...)``'s result (models/families/gpt.py), computed as the module docstring says."""
    if not supports(model):
        return model.generate(text, max_new_tokens=max_new_tokens, strategy=strategy, temperature=temperature,
                              top_k=top_k, top_p=top_p, seed=seed)
    if on_gpu(model) or dispatched(model):  # this module's loop is built for the CPU; on a GPU the on-device path, its
        # steps a CUDA graph; a model accelerate split (models/io/bigmodel.py) too: its modules' hooks place each
        # block's weights, which the plan here would read directly (offloaded ones are on the meta device)
        from models.decoding import ondevice

        if not ondevice.supports(model):
            return model.generate(text, max_new_tokens=max_new_tokens, strategy=strategy, temperature=temperature,
                                  top_k=top_k, top_p=top_p, seed=seed)
        return ondevice.generate(model, text, max_new_tokens=max_new_tokens, strategy=strategy,
                                 temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, pool=False).result()
    with torch.inference_mode():
        return _Decoder(model, plan(model)).run(text, max_new_tokens, strategy, temperature, top_k, top_p, seed)


def on_gpu(model) -> bool:
    """Whether ``generate`` hands ``model`` to ``models.decoding.ondevice`` (its weights on a CUDA device). On an
    H200 with an 8 B model that path generated 30 tokens after 512 in 0.46 s, transformers in 0.84 s
    (bench/device.py, README); this module's loop, made for the CPU, was slower than transformers there (issue 52)."""
    return model.embed.weight.device.type == "cuda"


def keeps_on_device(model) -> bool:
    """Whether the Generate tab keeps ``model``'s attention on its device (``ondevice.DeviceMap``: each figure
    computes its part there, only that part moves) rather than as the whole array in CPU memory. ATLAS_ONDEVICE:
    "auto" (default: models on a CUDA device), "1" (every model this module supports, e.g. to try it on the CPU)
    or "0" (never)."""
    mode = os.environ.get("ATLAS_ONDEVICE", "auto").strip().lower()
    if mode not in ("auto", "1", "0"):
        raise ValueError(f"ATLAS_ONDEVICE must be auto, 1 or 0, got {mode[:20]!r}")
    if mode == "0":
        return False
    from models.decoding import ondevice

    return ondevice.supports(model) and (mode == "1" or on_gpu(model))


# --------------------------------------------------------------------------------------------------- the plan
Fn = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class _Layer:
    """One block as plain functions of (T, D) rows: the model's own norms and weights, no module calls."""

    norm1: Fn
    qkv: Fn  # -> (T, (H + 2·Hkv)·d): queries, keys, values
    o: Fn
    norm2: Fn
    up: Fn  # GPT-2: the up projection; LLaMA: gate and up together -> (T, 2·F)
    down: Fn
    gated: bool
    act: Fn  # the feed-forward's activation
    parallel: bool  # the feed-forward reads the block's input, beside the attention (GPT-NeoX)
    rotary_dim: int  # RoPE over each head's first rotary_dim dimensions
    q_norm: Fn | None = None  # Qwen3: each head's query RMS-normalised over d_head, before RoPE
    k_norm: Fn | None = None  # and each key, before RoPE and before it is cached


@dataclass(frozen=True)
class Plan:
    key: tuple  # the parameters' versions and storage when it was made: a changed weight makes a new plan
    layers: list[_Layer]
    norm: Fn
    head: Fn


_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> Plan


def _version(model) -> tuple:
    return tuple((p._version, p.data_ptr()) for p in model.parameters())


def _norm(module) -> Fn:
    if type(module) is torch.nn.LayerNorm:
        return functools.partial(F.layer_norm, normalized_shape=module.normalized_shape,
                                 weight=module.weight.detach(), bias=module.bias.detach(), eps=module.eps)
    return module  # RMSNorm: its own forward


def plan(model) -> Plan:
    """The functions one generation runs, made once per model (and again after any weight changes in place): the
    model's norms, its linear layers as ``models.decoding.packed.joined`` makes them (query, key and value projections
    in one multiply, gate and up in one; fp16-packed where the model store packed them)."""
    key = _version(model)
    made = _PLANS.get(model)
    if made is not None and made.key == key:
        return made
    layers = []
    with torch.inference_mode():
        for block, spec in zip(model.blocks, model.spec.blocks):
            attn, ff = block.attn, block.ff
            gated = spec.ff == "gated"
            layers.append(_Layer(norm1=_norm(block.norm1), qkv=joined(attn.q_proj, attn.k_proj, attn.v_proj),
                                 o=joined(attn.o_proj), norm2=_norm(block.norm2),
                                 up=joined(ff.gate, ff.up) if gated else joined(ff.up), down=joined(ff.down),
                                 gated=gated, act=ACTIVATIONS[spec.ff_act], parallel=spec.residual == "parallel",
                                 rotary_dim=spec.rotary_dim, q_norm=attn.q_norm if spec.qk_norm else None,
                                 k_norm=attn.k_norm if spec.qk_norm else None))
        made = Plan(key, layers, _norm(model.norm), joined(model.lm_head))
    _PLANS[model] = made
    return made


class _Decoder:
    """One generation: the model, its plan, the preallocated caches and the attention array being filled."""

    def __init__(self, model, plan: Plan) -> None:
        self.model, self.plan = model, plan
        self.c = model.config
        self.device = model.embed.weight.device

    # ------------------------------------------------------------------------------------------------ the loop
    def run(self, text, max_new_tokens, strategy, temperature, top_k, top_p, seed) -> GenerationResult:
        run = Decoding.start(self.model, text, max_new_tokens, strategy, temperature, top_k, top_p, seed)
        self._allocate(run.prompt_len + run.new, run.prompt_len)
        # the prompt pass fills the prompt's surprisal; each step its token's; the last token: attention rows only
        run.run(self._prompt(run.ids, run.surprisal), self._step)
        return run.result(self._attention(len(run.ids)))

    # ------------------------------------------------------------------------------------------ the buffers
    def _allocate(self, n: int, prompt_len: int) -> None:
        """Caches for n positions, and the (L, H, n, n) attention array the passes write their rows into."""
        c, dev = self.c, self.device
        dtype = self.model.embed.weight.dtype
        # per layer (n, keys | values × Hkv × d): a token's keys and values side by side, as the projection gives them
        self.kv = [torch.zeros(n, 2 * c.kv_heads * c.d_head, device=dev, dtype=dtype) for _ in range(c.n_layers)]
        # GPT.generate returns float32 up to limits.LONG_TOKENS tokens and float16 above (gpt.attention_array):
        # float16 from the start when the prompt alone is longer, else float32, rounded at the end if need be
        long = prompt_len > limits.LONG_TOKENS
        # on the CPU whatever the model's device: the result is a numpy array
        self.att = torch.zeros(c.n_layers, c.n_heads, n, n, dtype=torch.float16 if long else torch.float32,
                               device="cpu")

    def _attention(self, t: int) -> np.ndarray:
        """The (L, H, t, t) block of the attention array, as GPT.generate returns it. A stop at EOS leaves the
        array's last rows unused: the block is moved to the front of the same buffer (no second copy)."""
        a = self.att.numpy()
        n = a.shape[-1]
        if t < n:
            out = a.reshape(-1)[: a.shape[0] * a.shape[1] * t * t].reshape(*a.shape[:2], t, t)
            for i in range(a.shape[0]):  # plane by plane: each lands before any plane not yet moved
                for j in range(a.shape[1]):
                    out[i, j] = a[i, j, :t, :t]
            a = out
        if t > limits.LONG_TOKENS and a.dtype != np.float16:
            a = a.astype(np.float16)
        return a

    # ---------------------------------------------------------------------------------------------- passes
    def _prompt(self, ids: list[int], surprisal: np.ndarray) -> Tensor:
        """Every prompt token at once: cache, attention rows 0..P-1, the prompt's surprisal; returns the logits
        after its last token (V,)."""
        p = len(ids)
        h = self.plan.norm(self._layers(torch.tensor(ids, device=self.device), 0, skip_last_ff=False))  # (P, D)
        target = torch.tensor(ids[1:], device=self.device)
        logits = None
        for a in range(0, p, LOGIT_CHUNK):  # vocabulary-wide logits a chunk of rows at a time
            b = min(a + LOGIT_CHUNK, p)
            logits = self.plan.head(h[a:b])
            e = min(b, p - 1)  # rows a..e-1 predict the prompt's tokens a+1..e
            if e > a:
                logp = torch.log_softmax(logits[: e - a].float(), -1)
                surprisal[a + 1 : e + 1] = (-logp.gather(1, target[a:e, None])[:, 0]).cpu().numpy()
        assert logits is not None
        return logits[-1]

    def _step(self, token: int, pos: int, last: bool) -> Tensor | None:
        """One new token at position ``pos``: cache, attention rows; its logits (V,), or None for the last."""
        x = self._layers(torch.tensor([token], device=self.device), pos, skip_last_ff=last)
        if last:
            return None
        return self.plan.head(self.plan.norm(x))[0]

    def _layers(self, ids: Tensor, start: int, skip_last_ff: bool) -> Tensor:
        """Tokens ``ids`` (T,) at positions start.. through every block; their residual stream (T, D)."""
        model, c = self.model, self.c
        t = ids.numel()
        end = start + t
        x = F.embedding(ids, model.embed.weight)
        angles = None
        if model.positions is not None:
            x = x + model.positions.weight[start:end]
        else:
            angles = model.angles[start:end]
        h_q, h_kv, d = c.n_heads, c.kv_heads, c.d_head
        group = h_q // h_kv
        scale = 1.0 / math.sqrt(d)
        mask = None
        if t > 1:  # query i (position start + i) sees keys 0..start + i
            mask = torch.ones(t, end, dtype=torch.bool, device=self.device).tril(start).logical_not_()
        last = len(self.plan.layers) - 1
        for i, layer in enumerate(self.plan.layers):
            qkv = layer.qkv(layer.norm1(x))  # (T, (H + 2·Hkv)·d)
            cache = self.kv[i][:end].view(end, 2, h_kv, d)  # (S, keys | values, Hkv, d): this pass's rows next
            cache[start:] = qkv[:, h_q * d :].view(t, 2, h_kv, d)
            q = qkv[:, : h_q * d].view(t, h_q, d)
            if layer.q_norm is not None:  # Qwen3's q/k norms: over each head's d, before RoPE
                q = layer.q_norm(q)
                cache[start:, 0] = layer.k_norm(cache[start:, 0])
            q = q.transpose(0, 1)  # (H, T, d)
            if angles is not None:  # RoPE: queries and keys turned by their positions, the keys before caching
                q = apply_rope(q, angles, c.rope_layout, rotary_dim=layer.rotary_dim)
                k = cache[start:, 0].transpose(0, 1)  # (Hkv, T, d)
                cache[start:, 0] = apply_rope(k, angles, c.rope_layout, rotary_dim=layer.rotary_dim).transpose(0, 1)
            keys, values = cache[:, 0].permute(1, 2, 0), cache[:, 1].transpose(0, 1)  # (Hkv, d, S), (Hkv, S, d)
            # the query heads h·group .. h·group + group − 1 share key/value head h: (Hkv, group·T, d)
            scores = torch.baddbmm(qkv.new_empty(()), q.reshape(h_kv, group * t, d), keys, beta=0.0, alpha=scale)
            if mask is not None:
                scores = scores.view(h_kv, group, t, end).masked_fill_(mask, float("-inf")).view(h_kv, group * t, end)
            w = torch.softmax(scores, -1)
            self.att[i, :, start:end, :end] = w.view(h_q, t, end)
            out = torch.bmm(w, values).view(h_q, t, d).transpose(0, 1).reshape(t, h_q * d)  # (T, H·d)
            a = layer.o(out)
            if skip_last_ff and i == last:
                return x + a
            h = layer.up(layer.norm2(x if layer.parallel else x + a))  # parallel: beside the attention
            x = x + a
            if layer.gated:
                gate, up = h.chunk(2, -1)
                h = layer.act(gate) * up
            else:
                h = layer.act(h)
            x = x + layer.down(h)
        return x
