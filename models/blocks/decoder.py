"""The description of a decoder block, said once and read by every runner (docs/ARCHITECTURE.md §7).

A decoder family is LLaMA's or GPT-2's block with some switches turned (a parallel residual, partial rotary, q/k
norms, a sliding window, experts ...). ``GPTConfig.spec()`` (models/families/gpt.py) turns a config into a
``DecoderSpec``: the model-level parts (positions, embedding scale, final soft-capping) and one ``BlockSpec`` per
layer. Every code path that runs a decoder's blocks reads that description:

- the plain path, ``GPT.forward`` (models/families/gpt.py), the reference every other path is tested against;
- ``models.decoding.fastgen`` (the CPU server's decoder), ``models.decoding.ondevice`` (attention kept on a GPU),
  ``models.decoding.lockstep`` (batched requests), ``models.families.moe.expert_routes`` (the experts view) and
  ``models.inspect.walk.gpt`` (the score split).

Each of them declares what it *knows* (``Knows``: for every field, the values it computes exactly) and asks
``refusal(spec, knows, runner)`` before it runs. The check fails closed: a field a runner does not list, or a value
it does not accept, is a refusal in words, and the request goes to the plain path (or, for an analysis with no
plain path, the user reads why it does not apply). So a switch added to the description cannot reach a user as a
wrong number through a runner that was not taught it; ``tests/test_decoder_spec.py`` plants an unknown value in
every field for every runner.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

# --------------------------------------------------------------------------------------------- the description


@dataclass(frozen=True)
class BlockSpec:
    """What one decoder block computes. Widths (d_model, heads, d_head, ff width) stay on the config."""

    # the residual stream
    residual: str = "sequential"  # "sequential": x += attn(n1(x)); x += ff(n2(x)). "parallel": x += attn(n1(x)) +
    # ff(n2(x)), both reading the same x (GPT-J, GPT-NeoX: Black et al. 2022, §2)
    norm: str = "rmsnorm"  # "rmsnorm" (Zhang & Sennrich 2019) or "layernorm" (with bias)
    sandwich: bool = False  # one more norm on the attention's and the feed-forward's outputs (Gemma 2/3)
    # the attention
    qkv_bias: bool = False  # biases on the query, key and value projections (GPT-2, Qwen2, NeoX)
    o_bias: bool = False  # a bias on the output projection (GPT-2, NeoX)
    rope: str = "full"  # "none" (learned absolute positions), "full" or "partial" (the first rotary_dim dimensions
    # of each head rotate, the rest pass unrotated: GPT-NeoX, Phi-3 with partial_rotary_factor)
    rotary_dim: int = 0  # dimensions each head rotates (= d_head for "full", 0 for "none")
    rope_layout: str = "interleaved"  # pairs (2i, 2i+1), or "half": (i, i + rotary_dim/2)
    local_rope: bool = False  # rotates by the model's second (local) RoPE table (Gemma 3's sliding layers)
    mrope_section: tuple[int, ...] = ()  # M-RoPE (Qwen2-VL, Wang et al. 2024, §2.1): the rotary frequency pairs split
    # into sections turned by the temporal, height and width position ids in turn (the sizes, summing to rotary_dim/2);
    # the positions are (3, T), an image token's its frame, row and column. (): the one position of plain RoPE
    qk_norm: bool = False  # per-head RMSNorm of queries and keys, before RoPE (Qwen3, Gemma 3)
    window: int = 0  # a sliding window: query i sees keys i - window < j <= i; 0: every earlier key
    attn_scale: float = 0.0  # the score scale; 0: 1/sqrt(d_head)
    attn_softcap: float = 0.0  # scaled scores z -> cap * tanh(z / cap) before the mask and softmax (Gemma 2); 0: none
    # the feed-forward
    ff: str = "gated"  # "gated": down(act(gate x) * up x); "mlp": down(act(up x)); "experts": a router over gated
    ff_act: str = "silu"  # models.blocks.layers.ACTIVATIONS name
    ff_bias: bool = False  # biases on the feed-forward's projections (GPT-2, NeoX)
    experts: int = 0  # experts per layer (ff == "experts")
    experts_per_token: int = 0  # the router's top-k


@dataclass(frozen=True)
class DecoderSpec:
    """A decoder: the parts around the blocks, and each block's description."""

    positions: str = "rope"  # "rope" (in the blocks) or "learned" (absolute position embeddings, GPT-2)
    embed_scale: float = 0.0  # token embeddings multiplied by it (Gemma: sqrt(d_model)); 0: not scaled
    final_softcap: float = 0.0  # output logits z -> cap * tanh(z / cap) (Gemma 2/3); 0: none
    prefix_lm: bool = False  # a prefix LM (Raffel et al. 2020, §3.2.1; PaliGemma, Beyer et al. 2024): the prompt
    # attends bidirectionally, query i < P seeing every key j < P, the rest causally; P is the forward's ``prefix``
    # (GPT.generate: the whole prompt, as PaliGemma's processor marks it)
    blocks: tuple[BlockSpec, ...] = ()

    def items(self) -> Iterator[tuple[str, int | None, Any]]:
        """(field, layer or None for a model-level field, value) of every field, model level first."""
        for f in fields(self):
            if f.name != "blocks":
                yield f.name, None, getattr(self, f.name)
        for i, block in enumerate(self.blocks):
            for f in fields(block):
                yield f.name, i, getattr(block, f.name)


MODEL_FIELDS = tuple(f.name for f in fields(DecoderSpec) if f.name != "blocks")
BLOCK_FIELDS = tuple(f.name for f in fields(BlockSpec))
FIELDS = MODEL_FIELDS + BLOCK_FIELDS


# ------------------------------------------------------------------------------------------ what a runner knows
Check = frozenset | Callable[[Any], bool]
Knows = Mapping[str, Check]  # field -> the values a runner computes exactly (a set, or a test of the value)


def flag(v: Any) -> bool:
    """Either bool (not 0/1, which compare equal to them)."""
    return v is True or v is False


def off(v: Any) -> bool:
    """False only: a switch the runner does not implement."""
    return v is False


def count(v: Any) -> bool:
    """A whole number >= 0."""
    return type(v) is int and v >= 0


def zero(v: Any) -> bool:
    """0 (or 0.0): a numeric switch the runner does not implement, left at its default."""
    return type(v) in (int, float) and v == 0


def scale(v: Any) -> bool:
    """A float >= 0 (0 = the default)."""
    return type(v) in (int, float) and v >= 0


def empty(v: Any) -> bool:
    """() only: a tuple-valued switch the runner does not implement, left at its default."""
    return type(v) is tuple and v == ()


def sections(v: Any) -> bool:
    """A tuple of whole numbers > 0 (or (), the default)."""
    return type(v) is tuple and all(type(x) is int and x > 0 for x in v)


def one_of(*values: str) -> frozenset:
    return frozenset(values)


def refusal(spec: DecoderSpec, knows: Knows, runner: str) -> str | None:
    """None when ``runner`` knows every field's value in ``spec``; else why it refuses, in words (the first field it
    does not know, and on which layer)."""
    for name, layer, value in spec.items():
        check = knows.get(name)
        where = "" if layer is None else f" (layer {layer})"
        if check is None:
            return f"{runner} does not know the decoder field {name!r}"
        try:
            ok = value in check if isinstance(check, frozenset) else bool(check(value))
        except TypeError:  # an unhashable value
            ok = False
        if not ok:
            return f"{runner} does not compute {name}={value!r}{where}"
    return None


def stores_long(spec: DecoderSpec) -> bool:
    """Whether the long-context store (models/decoding/ondevice.py: its KNOWS) reads a decoder of this description
    in generation, so that a long input never holds its T × T map: every switch of the plain path but M-RoPE and a
    bidirectional prefix. Families read it here (``GPT.context_limit``), not from the runner;
    tests/test_decoder_spec.py holds it equal to ``ondevice.supports`` for every switch."""
    return not spec.prefix_lm and all(not b.mrope_section for b in spec.blocks)


def spec_of(model: Any) -> DecoderSpec | None:
    """The description of a decoder model's blocks (``GPT.spec``); None for a model that has none (Mamba, encoders)."""
    spec = getattr(model, "spec", None)
    return spec if isinstance(spec, DecoderSpec) else None
