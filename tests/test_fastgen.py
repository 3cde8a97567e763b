"""models.decoding.fastgen: the serving path of generation returns what GPT.generate returns
(models/families/gpt.py), field by field:
the same token ids, texts, candidates and notices; every attention weight and probability within 1e-5, the
surprisal (bits) within 1e-5 absolute + 1e-5 relative;
for both recipes (LLaMA with grouped-query heads, GPT-2) and Qwen3's q/k norms, greedy and seeded sampling, shortened
prompts, a stop at EOS, long inputs (float16 attention), fp16-packed models as the model store serves them, and the
tiny checkpoints."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from models import limits
from models.decoding import fastgen
from models.decoding.packed import PackedLinear, pack_linears, supported
from models.families.gpt import GPT, GPTConfig
from models.outputs import GenerationResult

LLAMA_GQA = GPTConfig(recipe="llama", vocab_size=64, max_len=48, d_model=48, n_layers=2, n_heads=6, n_kv_heads=2)
CONFIGS = {
    "llama-gqa": LLAMA_GQA,
    "llama-half-qkv-bias": GPTConfig(recipe="llama", vocab_size=64, max_len=48, d_model=32, n_layers=2, n_heads=4,
                                     rope_layout="half", qkv_bias=True),
    "llama-untied": GPTConfig(recipe="llama", vocab_size=64, max_len=48, d_model=32, n_layers=3, n_heads=4,
                              n_kv_heads=1, tie_embeddings=False),
    "gpt2": GPTConfig(recipe="gpt2", vocab_size=64, max_len=48, d_model=32, n_layers=2, n_heads=4),
    # Qwen3's switches: per-head q/k RMSNorm before RoPE, a head width other than d_model / n_heads, odd layers
    "qwen3-qk-norm": GPTConfig(recipe="llama", vocab_size=64, max_len=48, d_model=32, n_layers=3, n_heads=6,
                               n_kv_heads=2, head_dim=12, qk_norm=True, rope_layout="half", rope_base=1e6),
}
SETTINGS = {
    "greedy": {},
    "sample-top-k": {"strategy": "sample", "temperature": 0.8, "top_k": 10, "seed": 3},
    "sample-top-p": {"strategy": "sample", "temperature": 1.3, "top_p": 0.9, "seed": 11},
}
TOL = 1e-5


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def random_gpt(config: GPTConfig, seed: int = 0, fp16: bool = False) -> GPT:
    torch.manual_seed(seed)
    model = GPT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # away from the initial ones and zeros (norm gains, biases)
            if fp16:  # what a checkpoint stored in fp16 loads as
                p.copy_(p.half().float())
    return model


def assert_same(fast: GenerationResult, plain: GenerationResult, atol: float = TOL) -> None:
    assert fast.ids == plain.ids
    assert fast.tokens == plain.tokens and fast.text == plain.text
    assert fast.prompt_len == plain.prompt_len and fast.notice == plain.notice
    assert set(fast.attention) == set(plain.attention) == {"decoder"}
    a, b = fast.attention["decoder"], plain.attention["decoder"]
    assert a.queries == b.queries and a.keys == b.keys
    assert a.weights.shape == b.weights.shape and a.weights.dtype == b.weights.dtype
    assert a.weights.flags.c_contiguous
    np.testing.assert_allclose(a.weights.astype(np.float32), b.weights.astype(np.float32), atol=atol, rtol=0)
    assert len(fast.steps) == len(plain.steps)
    for x, y in zip(fast.steps, plain.steps):
        assert x.candidates == y.candidates and x.chosen == y.chosen
        assert x.probs.dtype == y.probs.dtype == np.float32
        np.testing.assert_allclose(x.probs, y.probs, atol=TOL, rtol=0)
        assert abs(x.chosen_prob - y.chosen_prob) <= TOL
    assert fast.surprisal.dtype == plain.surprisal.dtype and fast.surprisal.shape == plain.surprisal.shape
    np.testing.assert_array_equal(np.isnan(fast.surprisal), np.isnan(plain.surprisal))
    # bits, up to ~20: float32 resolves about 2e-6 there, so the summation order alone moves it by ~1e-5
    np.testing.assert_allclose(fast.surprisal, plain.surprisal, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("name", CONFIGS)
def test_same_as_generate(name: str, setting: str) -> None:
    model = random_gpt(CONFIGS[name])
    assert fastgen.supports(model)
    for prompt, new in (([1, 5, 6, 7, 9, 11], 12), ([1, 9], 30)):
        kw = SETTINGS[setting]
        fast = fastgen.generate(model, prompt, max_new_tokens=new, **kw)
        assert 1 <= len(fast.steps) <= new  # fewer where a sample is the EOS id (2)
        assert_same(fast, model.generate(prompt, max_new_tokens=new, **kw))


def test_edge_lengths_shortened_prompt_and_errors() -> None:
    model = random_gpt(LLAMA_GQA)
    for prompt, new in (([7], 0), ([7], 1), ([1, 7], 1), ([1] + list(range(3, 63)), 8), (list(range(3, 60)), 47)):
        fast = fastgen.generate(model, prompt, max_new_tokens=new)
        assert_same(fast, model.generate(prompt, max_new_tokens=new))
    assert "shortened" in fastgen.generate(model, [1] + list(range(3, 63)), max_new_tokens=8).notice
    for bad in ({"strategy": "beam"}, {"temperature": 0.0}, {"top_p": 0.0}, {"top_k": -1}):
        with pytest.raises(ValueError):
            fastgen.generate(model, [1, 2], **bad)
    with pytest.raises(ValueError):
        fastgen.generate(model, [])


@pytest.mark.parametrize("name", ["llama-gqa", "gpt2"])
def test_stops_after_eos_like_generate(name: str) -> None:
    model = random_gpt(CONFIGS[name])
    free = model.generate([1, 5, 6], max_new_tokens=10)
    stopper = free.ids[3 + 4]  # the fifth token chosen becomes the end of text
    model.config.eos_id = stopper
    plain = model.generate([1, 5, 6], max_new_tokens=10)
    fast = fastgen.generate(model, [1, 5, 6], max_new_tokens=10)
    assert plain.ids[-1] == stopper and len(plain.ids) < len(free.ids)
    assert_same(fast, plain)  # the attention block of the shorter run, moved to the front of its buffer


@pytest.mark.parametrize("name", ["llama-gqa", "gpt2"])
def test_long_inputs_keep_float16_attention(name: str, monkeypatch) -> None:
    config = dataclasses.replace(CONFIGS[name], max_len=limits.LONG_TOKENS + 40)
    model = random_gpt(config)
    monkeypatch.setattr(limits, "MAX_LM_TOKENS", max(limits.MAX_LM_TOKENS, config.max_len))
    for n_prompt, new in ((limits.LONG_TOKENS - 3, 8), (limits.LONG_TOKENS + 5, 4)):  # crossing the line; above it
        prompt = [int(i) for i in torch.randint(3, 64, (n_prompt,), generator=torch.Generator().manual_seed(1))]
        plain = model.generate(prompt, max_new_tokens=new)
        fast = fastgen.generate(model, prompt, max_new_tokens=new)
        assert fast.attention["decoder"].weights.dtype == np.float16
        assert_same(fast, plain, atol=1e-3)  # float16 attention: the rounding of values equal within 1e-6
        np.testing.assert_allclose(fast.attention["decoder"].weights.astype(np.float32).sum(-1), 1, atol=2e-3)


@pytest.mark.skipif(not supported(), reason="fbgemm is not in this torch build (not x86)")
@pytest.mark.parametrize("recipe", ["llama", "gpt2"])
def test_packed_models_as_the_store_serves_them(recipe: str) -> None:
    config = GPTConfig(recipe=recipe, vocab_size=1100, max_len=64, d_model=256, n_layers=2, n_heads=4,
                       n_kv_heads=2 if recipe == "llama" else 0, d_ff=1024)
    plain_model = random_gpt(config, fp16=True)
    model = copy.deepcopy(plain_model)
    assert pack_linears(model) > 0 and isinstance(model.lm_head, PackedLinear)
    for kw in SETTINGS.values():
        fast = fastgen.generate(model, [1, 5, 6, 7], max_new_tokens=20, **kw)
        assert_same(fast, model.generate([1, 5, 6, 7], max_new_tokens=20, **kw))
        assert_same(fast, plain_model.generate([1, 5, 6, 7], max_new_tokens=20, **kw))  # and the unpacked model


def test_weights_changed_in_place_make_a_new_plan() -> None:
    model = random_gpt(CONFIGS["gpt2"])
    first = fastgen.plan(model)
    assert fastgen.plan(model) is first  # made once per model
    with torch.no_grad():
        model.blocks[1].attn.v_proj.weight.mul_(-1.0)
    assert fastgen.plan(model) is not first
    assert_same(fastgen.generate(model, [1, 5, 6], max_new_tokens=10), model.generate([1, 5, 6], max_new_tokens=10))


def test_models_it_does_not_know_go_to_generate() -> None:
    model = random_gpt(CONFIGS["gpt2"])
    model.blocks[0].attn.register_parameter("extra", torch.nn.Parameter(torch.zeros(1)))  # a part it cannot run
    assert not fastgen.supports(model) and not fastgen.supports(torch.nn.Linear(2, 2))
    assert_same(fastgen.generate(model, [1, 5, 6], max_new_tokens=5), model.generate([1, 5, 6], max_new_tokens=5))


def test_tiny_checkpoint_with_its_tokenizer(tiny_checkpoints: Path) -> None:
    import models

    model = models.load(tiny_checkpoints / "gpt-tiny")
    pack_linears(model)  # as the model store does (nothing this small qualifies)
    for kw in SETTINGS.values():
        fast = fastgen.generate(model, "A man in a blue shirt", max_new_tokens=12, **kw)
        assert fast.text and fast.tokens[0] == "<s>"
        assert_same(fast, model.generate("A man in a blue shirt", max_new_tokens=12, **kw))
