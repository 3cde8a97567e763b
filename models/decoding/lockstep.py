"""Several ``GPT.generate`` requests decoded as one batch, each answer equal to the request served alone.

A serving speed-up (docs/ARCHITECTURE.md §9), kept out of ``models/families/gpt.py``: it only calls ``GPT.forward``
(the same
modules, the same KV cache) on more rows at once. The rows advance in *lockstep by position*: every forward pass
feeds each row the token at the same absolute position, so no row ever needs a padding mask or shifted positions
(RoPE angles, learned positions and smeared keys all stay exactly those of the row alone):

- the prompts are read together up to the shortest one's length (one causal pass, as a lone prompt is read);
- then one token per row and pass: a row still inside its longer prompt is fed its next prompt token (its
  prediction is not used), a row past its prompt is fed the token it just chose (greedy, or sampled with its own
  seeded generator), and a finished row is fed a filler whose cache entries nothing reads again;
- at the end every row's whole sequence goes through the explicit path in one pass, padded after its end (the
  causal mask hides that padding from every real position), for the attention, surprisal and candidates.

Prompts of very different lengths are decoded in separate groups (a short prompt does not wait for a long one's
prompt tokens), and inputs over ``limits.LONG_TOKENS`` tokens are served alone (their float16 attention is large).

Batching is exact for what ``KNOWS`` lists of the block description (models/blocks/decoder.py): a model with anything
else (say, attention that looks ahead, which would read the padding) is served one request at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from models import limits
from models.blocks.decoder import Knows, count, empty, flag, off, one_of, scale, spec_of
from models.blocks.decoder import refusal as spec_refusal
from models.blocks.layers import ACTIVATIONS
from models.blocks.loop import Decoding, full_surprisal
from models.blocks.positional import ROPE_LAYOUTS
from models.outputs import GenerationResult

PROMPT_SPAN = 32  # prompts in one group differ by at most this many tokens (each extra one is a one-token pass)
ATTENTION_CELLS = 64 << 20  # float32 attention cells of a group's final pass, rows × layers × heads × T² (256 MB)
MAX_ROWS = 32  # rows decoded together

# What decoding rows together keeps exact: every block GPT.forward runs whose attention is causal (the padding after a
# row's end is never read) and whose every part treats each token by itself (norms, feed-forwards, routers).
KNOWS: Knows = {
    "positions": one_of("rope", "learned"), "embed_scale": scale, "final_softcap": scale, "prefix_lm": off,
    "residual": one_of("sequential", "parallel"), "norm": one_of("rmsnorm", "layernorm"), "sandwich": flag,
    "qkv_bias": flag, "o_bias": flag, "rope": one_of("none", "full", "partial"), "rotary_dim": count,
    "rope_layout": one_of(*ROPE_LAYOUTS), "local_rope": flag, "qk_norm": flag, "window": count, "attn_scale": scale,
    "attn_softcap": scale, "ff": one_of("gated", "mlp", "experts"), "ff_act": one_of(*ACTIVATIONS), "ff_bias": flag,
    "experts": count, "experts_per_token": count,
    "mrope_section": empty}


def refusal(model) -> str | None:
    """None when decoding ``model``'s requests together gives each one's lone answer; else why not."""
    spec = spec_of(model)
    if spec is None:
        return f"{type(model).__name__} has no decoder block description"
    return spec_refusal(spec, KNOWS, "batched decoding")


@dataclass(frozen=True)
class GenerateRequest:
    """The arguments of one ``GPT.generate`` call."""

    text: str | Sequence[int]
    max_new_tokens: int = 20
    strategy: str = "greedy"
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0


@dataclass
class _Row:
    index: int  # the request's place in the caller's list
    run: Decoding  # its ids (prompt, then the tokens chosen), settings and steps


def generate_many(model, requests: Sequence[GenerateRequest]) -> list[GenerationResult | Exception]:
    """``model.generate(**request)`` of each request, decoded together where they fit (see the module docstring);
    a request the model refuses (empty prompt, bad settings) comes back as its exception, in its place."""
    results: list[GenerationResult | Exception] = [ValueError("not run")] * len(requests)
    rows: list[_Row] = []
    batched = refusal(model) is None
    for i, req in enumerate(requests):
        try:
            row = _prepare(model, i, req) if batched else None
        except Exception as err:  # bad input: this request's answer, not the batch's
            results[i] = err
            continue
        if row is None or row.run.prompt_len + row.run.new > limits.LONG_TOKENS:  # served alone
            results[i] = _alone(model, req)
        else:
            rows.append(row)
    if len(rows) == 1:  # a lone request: the single-row fast path (models/decoding/fastgen.py), the same answer
        results[rows[0].index] = _alone(model, requests[rows[0].index])
    elif rows:
        was_training = model.training
        model.eval()
        try:
            for group in _groups(model, rows):
                for row, result in zip(group, _decode(model, group)):
                    results[row.index] = result
        finally:
            model.train(was_training)
    return results


def _alone(model, req: GenerateRequest) -> GenerationResult | Exception:
    """One request by itself, through ``models.decoding.fastgen`` (``model.generate``'s answer, decoded faster)."""
    from models.decoding import fastgen

    try:
        return fastgen.generate(model, req.text, max_new_tokens=req.max_new_tokens, strategy=req.strategy,
                                temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, seed=req.seed)
    except Exception as err:
        return err


def _prepare(model, index: int, req: GenerateRequest) -> _Row:
    """What ``GPT.generate`` checks and cuts before decoding (``GPT.prepare_prompt``), as a row of the batch."""
    return _Row(index, Decoding.start(model, req.text, req.max_new_tokens, req.strategy, req.temperature, req.top_k,
                                      req.top_p, req.seed))


def _groups(model, rows: list[_Row]) -> list[list[_Row]]:
    """Rows sorted by prompt length, cut where the prompts differ by over PROMPT_SPAN tokens, the final pass's
    attention would pass ATTENTION_CELLS, or MAX_ROWS rows are reached."""
    per_cell = model.config.n_layers * model.config.n_heads
    groups: list[list[_Row]] = []
    for row in sorted(rows, key=lambda r: r.run.prompt_len):
        if groups:
            g = groups[-1]
            longest = max(max(r.run.prompt_len + r.run.new for r in g), row.run.prompt_len + row.run.new)
            if (len(g) < MAX_ROWS and row.run.prompt_len - g[0].run.prompt_len <= PROMPT_SPAN
                    and (len(g) + 1) * per_cell * longest ** 2 <= ATTENTION_CELLS):
                g.append(row)
                continue
        groups.append([row])
    return groups


@torch.no_grad()
def _decode(model, group: list[_Row]) -> list[GenerationResult]:
    from models.blocks.attention import KVCache

    runs = [row.run for row in group]
    device = model.embed.weight.device
    filler = max(model.eos_id(), 0)  # what a finished row is fed: its cache entries are never read
    start = min(r.prompt_len for r in runs)
    caches = [KVCache() for _ in model.blocks]
    x = torch.tensor([r.ids[:start] for r in runs], device=device)
    logits = model(x, caches, last_only=True).logits[:, -1]  # (B, V): the prediction after position start - 1
    pos = start  # the position the next fed tokens take
    while True:
        feed = []
        for b, r in enumerate(runs):
            if pos < r.prompt_len:  # still reading its prompt: the prediction is not used
                feed.append(r.ids[pos])
                continue
            if not r.finished:  # one generation step, as a lone request takes it (models.blocks.loop)
                r.choose(logits[b])
            feed.append(filler if r.finished else r.ids[-1])
        if all(r.finished for r in runs):
            break
        logits = model(torch.tensor(feed, device=device)[:, None], caches).logits[:, -1]
        pos += 1
    del caches
    # every token through the explicit path once, padded after each row's end (causal: unseen by real positions)
    longest = max(len(r.ids) for r in runs)
    # any real id pads (the causal mask hides it); Hugging Face folders have no pad id (pad_id −1, not an index)
    fill = model.config.pad_id if model.config.pad_id >= 0 else 0
    x = torch.full((len(runs), longest), fill, dtype=torch.long, device=device)
    for b, r in enumerate(runs):
        x[b, : len(r.ids)] = torch.tensor(r.ids, device=device)
    full = model(x, need_weights=True)
    results = []
    for b, r in enumerate(runs):
        t = len(r.ids)
        weights = np.empty((len(full.attention), *full.attention[0].shape[1:2], t, t), np.float32)  # (L, H, T, T)
        for layer, w in enumerate(full.attention):
            weights[layer] = w[b, :, :t, :t].float().cpu().numpy()
        results.append(r.result(weights, full_surprisal(full.logits[b, :t], r.ids)))
    return results
