"""The decoder block's one description (models/blocks/decoder.py) fails closed.

- Every runner declares every field of the description: a field added to ``BlockSpec`` or ``DecoderSpec`` and not
  taught to a runner fails here, before any runner can meet it.
- An unknown value planted in any field, model-level or on one layer, makes every fast runner refuse (fastgen, the
  on-device path, batched decoding, the score split's walk) while the plain path, ``GPT.generate``, still answers,
  and the serving entry points (``fastgen.generate``, ``lockstep.generate_many``) give its exact answer.
- For each switch the plain path computes, a model with it turned on: each fast runner either computes it (and then
  equals the plain path) or refuses (and then the request gets the plain path's answer).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from models.blocks.decoder import BLOCK_FIELDS, FIELDS, MODEL_FIELDS, BlockSpec, DecoderSpec, refusal, stores_long
from models.decoding import fastgen, lockstep, ondevice
from models.decoding.lockstep import GenerateRequest
from models.families import gpt as gpt_module
from models.families.gpt import GPT, GPTConfig
from models.inspect import walk
from tests.test_fastgen import assert_same

RUNNERS = {"plain": gpt_module.PLAIN, "fastgen": fastgen.KNOWS, "ondevice": ondevice.KNOWS,
           "lockstep": lockstep.KNOWS, "walk": walk.GPT_KNOWS}
PROMPT = [1, 5, 9, 7, 3, 11, 4]


class Unknown:
    """A value no runner was taught."""

    def __repr__(self) -> str:
        return "<unknown>"


def tiny(**switches) -> GPT:
    torch.manual_seed(0)
    base = dict(recipe="llama", vocab_size=64, max_len=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2)
    model = GPT(GPTConfig(**{**base, **switches})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def planted(spec: DecoderSpec, name: str) -> DecoderSpec:
    """``spec`` with an unknown value in field ``name`` (on layer 1 for a block field)."""
    if name in MODEL_FIELDS:
        return dataclasses.replace(spec, **{name: Unknown()})
    blocks = list(spec.blocks)
    blocks[1] = dataclasses.replace(blocks[1], **{name: Unknown()})
    return dataclasses.replace(spec, blocks=tuple(blocks))


@pytest.mark.parametrize("runner", RUNNERS)
def test_every_runner_declares_every_field(runner: str) -> None:
    assert set(RUNNERS[runner]) == set(FIELDS)
    assert set(FIELDS) == {f.name for f in dataclasses.fields(BlockSpec)} | set(MODEL_FIELDS)
    assert len(FIELDS) == len(MODEL_FIELDS) + len(BLOCK_FIELDS)


def test_a_field_a_runner_does_not_list_is_refused() -> None:
    knows = dict(fastgen.KNOWS)
    del knows["residual"]
    assert "'residual'" in refusal(tiny().spec, knows, "a runner")


@pytest.mark.parametrize("name", FIELDS)
def test_an_unknown_value_in_any_field_is_refused_and_the_plain_path_answers(name: str) -> None:
    model = tiny()
    want = model.generate(PROMPT, max_new_tokens=6)
    model.spec = planted(model.spec, name)  # what every runner reads; the modules keep what they were built from
    for runner, knows in RUNNERS.items():
        why = refusal(model.spec, knows, runner)
        assert why is not None and name in why and "<unknown>" in why, runner
    assert fastgen.refusal(model) and not fastgen.supports(model)
    assert ondevice.refusal(model) and not ondevice.supports(model)
    assert lockstep.refusal(model)
    with pytest.raises(ValueError, match=name):
        ondevice.generate(model, PROMPT, max_new_tokens=6)
    with pytest.raises(ValueError, match=name):
        walk.plan(model, PROMPT)
    # the plain path answers, and the serving entry points give exactly its answer
    assert_same(fastgen.generate(model, PROMPT, max_new_tokens=6), want)
    for got in lockstep.generate_many(model, [GenerateRequest(PROMPT, 6), GenerateRequest(PROMPT[:4], 6)]):
        assert not isinstance(got, Exception)
    assert_same(lockstep.generate_many(model, [GenerateRequest(PROMPT, 6), GenerateRequest(PROMPT, 6)])[0], want)


@pytest.mark.parametrize("name", FIELDS)
def test_the_plain_path_refuses_to_build_an_unknown_value(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tiny().spec
    monkeypatch.setattr(GPTConfig, "spec", lambda self: planted(spec, name))
    with pytest.raises(ValueError, match=name):
        tiny()


# every switch the plain path computes, one model each (3 layers, grouped-query heads)
SWITCHES = {
    "parallel-residual": dict(parallel_residual=True),
    "partial-rotary": dict(rotary_dim=4, rope_layout="half"),
    "neox": dict(recipe="neox", parallel_residual=True, rotary_dim=2, ff_act="gelu", tie_embeddings=False),
    "gpt2": dict(recipe="gpt2", n_kv_heads=0),
    "qk-norm": dict(qk_norm=True, head_dim=12),
    "sliding-window": dict(sliding_window=3),
    "local-rope": dict(sliding_window=3, layer_types=("sliding", "full", "sliding"), local_rope_base=50.0),
    "sandwich": dict(sandwich_norm=True),
    "attn-scale": dict(attn_scale=0.5),
    "embed-scale": dict(embed_scale=3.0),
    "final-softcap": dict(final_softcap=2.0),
    "geglu": dict(ff_act="gelu_tanh"),
    "experts": dict(n_experts=4, experts_per_token=2),
    "attn-softcap": dict(attn_softcap=2.0),  # Gemma 2
    "prefix-lm": dict(prefix_lm=True),  # PaliGemma's language model: its prompt attends both ways
}


@pytest.mark.parametrize("switch", SWITCHES)
def test_each_runner_computes_a_switch_or_refuses_it(switch: str) -> None:
    model = tiny(**SWITCHES[switch])
    want = model.generate(PROMPT, max_new_tokens=8)
    # fastgen: its own loop where it knows every field, else model.generate: the same answer either way
    assert_same(fastgen.generate(model, PROMPT, max_new_tokens=8), want)
    if ondevice.supports(model):
        got = ondevice.generate(model, PROMPT, max_new_tokens=8).result()
        assert got.ids == want.ids
        np.testing.assert_allclose(got.attention["decoder"].weights, want.attention["decoder"].weights, atol=1e-5)
        np.testing.assert_allclose(got.surprisal, want.surprisal, atol=1e-4)
    batch = lockstep.generate_many(model, [GenerateRequest(PROMPT, 8), GenerateRequest(PROMPT[:5], 8)])
    assert_same(batch[0], want)
    if refusal(model.spec, walk.GPT_KNOWS, "walk") is None:
        walk.plan(model, PROMPT)
    else:
        with pytest.raises(ValueError, match="cannot be split"):
            walk.plan(model, PROMPT)


def test_what_each_fast_runner_computes_is_recorded() -> None:
    """Which switches each fast runner computes itself, so that a change in what it knows is a decision."""
    computed = {name: [s for s in SWITCHES if refusal(tiny(**SWITCHES[s]).spec, knows, name) is None]
                for name, knows in RUNNERS.items()}
    assert computed["plain"] == list(SWITCHES)
    assert computed["lockstep"] == [s for s in SWITCHES if s != "prefix-lm"]  # a prefix LM is not causal
    assert computed["fastgen"] == ["parallel-residual", "partial-rotary", "neox", "gpt2", "qk-norm", "geglu"]
    # the long-context store (issue 69) computes Gemma's windows, local RoPE, sandwich norms, scales and soft caps;
    # a prefix only through ondevice.prefill (generation takes none)
    assert computed["ondevice"] == [s for s in SWITCHES if s != "prefix-lm"]
    # what GPT.context_limit reads (models.blocks.decoder.stores_long) says the same, M-RoPE included
    for kw in [*SWITCHES.values(), dict(mrope_section=(1, 1, 2), rope_layout="half")]:
        model = tiny(**kw)
        assert stores_long(model.spec) == (ondevice.refusal(model) is None), kw
    assert "parallel-residual" not in computed["walk"] and "partial-rotary" not in computed["walk"]


def test_mrope_is_refused_by_every_fast_runner_and_the_plain_path_answers() -> None:
    """M-RoPE (Qwen2.5-VL's LM: ``mrope_section``) on a real model: no fast runner computes it, so each refuses it by
    name and the serving entry points give the plain path's answer. On text alone (every position id the same on the
    three axes) M-RoPE is plain RoPE, so the plain path equals the same weights without it; with image-like position
    ids (rows and columns) it does not, so a runner that ignored the field would give a wrong number."""
    model = tiny(mrope_section=(1, 1, 2), rope_layout="half")
    assert model.spec.blocks[0].mrope_section == (1, 1, 2)
    for runner, knows in RUNNERS.items():
        why = refusal(model.spec, knows, runner)
        assert (why is None) == (runner == "plain"), runner
        if why:
            assert "mrope_section" in why
    assert fastgen.refusal(model) and ondevice.refusal(model) and lockstep.refusal(model)
    with pytest.raises(ValueError, match="mrope_section"):
        ondevice.generate(model, PROMPT, max_new_tokens=4)
    with pytest.raises(ValueError, match="mrope_section"):
        walk.plan(model, PROMPT)
    want = model.generate(PROMPT, max_new_tokens=6)
    assert_same(fastgen.generate(model, PROMPT, max_new_tokens=6), want)
    assert_same(lockstep.generate_many(model, [GenerateRequest(PROMPT, 6), GenerateRequest(PROMPT, 6)])[0], want)
    plain = tiny(rope_layout="half")
    plain.load_state_dict(model.state_dict())
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, plain(ids).logits, rtol=0, atol=1e-5)
        t = len(PROMPT)
        grid = torch.stack([torch.zeros(t, dtype=torch.long), torch.arange(t) // 3, torch.arange(t) % 3])
        assert (model(ids, positions=grid).logits - plain(ids).logits).abs().max() > 1e-3
    with pytest.raises(ValueError, match="M-RoPE"):
        plain(ids, positions=grid)


def test_a_prefix_lm_reads_its_prompt_both_ways_and_every_fast_runner_refuses_it() -> None:
    """``prefix_lm`` (PaliGemma): the plain path's prompt rows see the later prompt tokens (its attention has weight
    above the diagonal inside the prompt, none after it), the prefix changes the answer, a causal model refuses a
    prefix, and every fast runner refuses the switch in words, so the request gets the plain path's answer."""
    model = tiny(prefix_lm=True)
    causal = tiny()
    assert model.spec.prefix_lm and not causal.spec.prefix_lm
    got = model.generate(PROMPT, max_new_tokens=6)
    w = got.attention["decoder"].weights  # (L, H, T, T)
    p = len(PROMPT)
    above = np.triu_indices(p, 1)
    assert (w[:, :, :p, :p][:, :, above[0], above[1]] > 1e-4).all()  # every prompt row reads every prompt key
    assert np.all(np.triu(w[:, :, p:], p + 1) == 0)  # the new tokens: causal
    with torch.no_grad():  # the same weights read causally answer otherwise
        causal.load_state_dict(model.state_dict())
        same = causal(torch.tensor([PROMPT]), need_weights=True)
        open_ = model(torch.tensor([PROMPT]), need_weights=True, prefix=p)
    np.testing.assert_allclose(open_.attention[0][0].numpy(), w[0, :, :p, :p], atol=1e-6)
    assert not torch.allclose(same.logits, open_.logits, atol=1e-3)
    with pytest.raises(ValueError, match="causal model"):
        causal(torch.tensor([PROMPT]), prefix=3)
    for runner, knows in RUNNERS.items():
        why = refusal(model.spec, knows, runner)
        assert (why is None) == (runner == "plain"), runner
        assert runner == "plain" or "prefix_lm=True" in why
    assert fastgen.refusal(model) and ondevice.refusal(model) and lockstep.refusal(model)
    assert_same(fastgen.generate(model, PROMPT, max_new_tokens=6), got)
    assert_same(lockstep.generate_many(model, [GenerateRequest(PROMPT, 6), GenerateRequest(PROMPT, 6)])[0], got)
    with pytest.raises(ValueError, match="prefix_lm"):
        walk.plan(model, PROMPT)
