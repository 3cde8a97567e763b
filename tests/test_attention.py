"""Attention: explicit vs fused paths, vs nn.MultiheadAttention, masks, rows, KV cache."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from models.blocks.attention import (
    KVCache,
    MultiHeadAttention,
    attend,
    causal_mask,
    padding_mask,
    scaled_dot_product,
)
from models.blocks.positional import RotaryEmbedding
from models.families.gpt import CausalSelfAttention, GPTConfig


def _mha(d: int = 32, h: int = 4, seed: int = 0) -> MultiHeadAttention:
    torch.manual_seed(seed)
    return MultiHeadAttention(d, h).eval()


def test_scaled_dot_product_matches_torch_sdpa() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    mask = padding_mask(torch.tensor([7, 4]))
    out, w = scaled_dot_product(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert w.shape == (2, 3, 5, 7)


@pytest.mark.parametrize("masked", ["none", "padding", "causal", "both"])
def test_explicit_equals_fused(masked: str) -> None:
    m = _mha()
    x = torch.randn(2, 6, 32)
    pad = padding_mask(torch.tensor([6, 3]))
    mask = {"none": None, "padding": pad, "causal": causal_mask(6), "both": pad & causal_mask(6)}[masked]
    fused, none = m(x, mask=mask)
    explicit, w = m(x, mask=mask, need_weights=True)
    assert none is None and w is not None
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=0)


def test_explicit_equals_fused_with_bias_and_rope() -> None:
    m = _mha()
    x, kv = torch.randn(2, 5, 32), torch.randn(2, 9, 32)
    bias = torch.randn(4, 5, 9)
    mask = padding_mask(torch.tensor([9, 5]))
    a, _ = m(x, kv, mask=mask, bias=bias)
    b, _ = m(x, kv, mask=mask, bias=bias, need_weights=True)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    rope = RotaryEmbedding(8)
    a, _ = m(x, mask=causal_mask(5), rope=rope)
    b, _ = m(x, mask=causal_mask(5), rope=rope, need_weights=True)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def _reference(m: MultiHeadAttention) -> nn.MultiheadAttention:
    ref = nn.MultiheadAttention(m.d_model, m.n_heads, batch_first=True).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([m.q_proj.weight, m.k_proj.weight, m.v_proj.weight]))
        ref.in_proj_bias.copy_(torch.cat([m.q_proj.bias, m.k_proj.bias, m.v_proj.bias]))
        ref.out_proj.weight.copy_(m.out_proj.weight)
        ref.out_proj.bias.copy_(m.out_proj.bias)
    return ref


@pytest.mark.parametrize("need_weights", [False, True])
def test_matches_nn_multihead_attention(need_weights: bool) -> None:
    m = _mha(seed=1)
    ref = _reference(m)
    x, mem = torch.randn(3, 6, 32), torch.randn(3, 8, 32)
    # cross-attention with key padding (nn: True = padding; ours: True = keep)
    lengths = torch.tensor([8, 5, 2])
    pad = torch.arange(8)[None, :] >= lengths[:, None]
    ours, w = m(x, mem, mask=padding_mask(pad), need_weights=need_weights)
    theirs, tw = ref(x, mem, mem, key_padding_mask=pad, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    if need_weights:
        torch.testing.assert_close(w, tw, atol=1e-6, rtol=1e-5)
    # causal self-attention (nn: True = not allowed)
    ours, w = m(x, mask=causal_mask(6), need_weights=need_weights)
    theirs, tw = ref(x, x, x, attn_mask=~causal_mask(6), need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    if need_weights:
        torch.testing.assert_close(w, tw, atol=1e-6, rtol=1e-5)


def test_rows_sum_to_one_and_masked_keys_get_zero() -> None:
    m = _mha()
    x = torch.randn(2, 6, 32)
    mask = padding_mask(torch.tensor([6, 4])) & causal_mask(6)
    _, w = m(x, mask=mask, need_weights=True)
    assert w is not None
    w = w.detach()
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 6))
    blocked = ~mask.expand(2, 4, 6, 6)
    assert float(w[blocked].abs().max()) == 0.0


def test_fully_masked_row_gives_zeros_on_both_paths() -> None:
    m = _mha()
    x = torch.randn(1, 3, 32)
    mask = torch.tensor([[True, True, True], [False, False, False], [True, False, False]])
    fused, _ = m(x, mask=mask)
    explicit, w = m(x, mask=mask, need_weights=True)
    assert torch.isfinite(fused).all()
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=0)
    assert w is not None and float(w.detach()[0, :, 1].abs().sum()) == 0.0


def test_mask_builders() -> None:
    assert padding_mask(torch.tensor([2, 3])).shape == (2, 1, 1, 3)
    assert padding_mask(torch.tensor([[False, True]])).tolist() == [[[[True, False]]]]
    assert padding_mask(torch.tensor([1]), max_len=3).tolist() == [[[[True, False, False]]]]
    # no key is padding: no mask, so the encoders run the fused kernel unmasked
    assert padding_mask(torch.tensor([3, 3])) is None
    assert padding_mask(torch.tensor([[False, False]])) is None
    assert causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]


@pytest.mark.parametrize("use_rope", [False, True])
def test_kv_cache_matches_full_causal_pass(use_rope: bool) -> None:
    m = _mha(seed=2)
    rope = RotaryEmbedding(8) if use_rope else None
    x = torch.randn(2, 7, 32)
    full, _ = m(x, mask=causal_mask(7), rope=rope)
    cache = KVCache()
    steps = [m(x[:, t : t + 1], rope=rope, cache=cache)[0] for t in range(7)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
    assert cache.length == 7
    # prefill 4 tokens at once (causal mask aligned to the end), then one step
    cache = KVCache()
    first, _ = m(x[:, :4], rope=rope, cache=cache, mask=causal_mask(4, 4))
    last, _ = m(x[:, 4:5], rope=rope, cache=cache)
    torch.testing.assert_close(first, full[:, :4], atol=1e-5, rtol=0)
    torch.testing.assert_close(last, full[:, 4:5], atol=1e-5, rtol=0)


def test_static_cross_cache_projects_memory_once() -> None:
    m = _mha(seed=3)
    y, mem = torch.randn(2, 3, 32), torch.randn(2, 5, 32)
    ref, _ = m(y, mem)
    cache = KVCache(static=True)
    out1, _ = m(y[:, :1], mem, cache=cache)
    k_before = cache.k
    out2, _ = m(y[:, 1:], None, cache=cache)  # memory no longer needed
    assert cache.k is k_before and cache.length == 5
    torch.testing.assert_close(torch.cat([out1, out2], 1), ref, atol=1e-5, rtol=0)
    cache.reorder(torch.tensor([1, 1, 0]))
    assert cache.k is not None and cache.k.shape[0] == 3


@pytest.mark.parametrize("need_weights", [False, True])
def test_attend_shares_key_value_heads_between_query_heads(need_weights: bool) -> None:
    torch.manual_seed(4)
    q, k, v = torch.randn(2, 6, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    mask = causal_mask(5)
    out, w = attend(q, k, v, mask, need_weights=need_weights)
    # query heads 0-2 read key/value head 0, heads 3-5 head 1
    ref, ref_w = scaled_dot_product(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    assert (w is None) != need_weights
    if w is not None:
        torch.testing.assert_close(w, ref_w)


def test_kv_cache_extend_appends_along_positions() -> None:
    cache = KVCache()
    a, b = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 1, 4)
    k, v = cache.extend(a, -a)
    assert k is a and cache.length == 3
    k, v = cache.extend(b, -b)
    assert cache.length == 4 and torch.equal(k, torch.cat([a, b], 2)) and torch.equal(v, -k)


@pytest.mark.parametrize("need_weights", [False, True])
def test_gpt_attention_and_multi_head_attention_are_one_stack(need_weights: bool) -> None:
    """GPT-2's causal self-attention and MultiHeadAttention with the same weights compute the same thing, on
    both paths and step by step through the one KVCache."""
    torch.manual_seed(5)
    m = _mha()
    gpt = CausalSelfAttention(GPTConfig(recipe="gpt2", d_model=32, n_heads=4, n_layers=1, vocab_size=8)).eval()
    with torch.no_grad():
        for ours, theirs in ((gpt.q_proj, m.q_proj), (gpt.k_proj, m.k_proj), (gpt.v_proj, m.v_proj),
                             (gpt.o_proj, m.out_proj)):
            ours.weight.copy_(theirs.weight)
            ours.bias.copy_(theirs.bias)
    x = torch.randn(2, 6, 32)
    ref, ref_w = m(x, mask=causal_mask(6), need_weights=need_weights)
    out, w = gpt(x, None, None, need_weights, None)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    if need_weights:
        torch.testing.assert_close(w, ref_w, atol=1e-6, rtol=0)
    cache_m, cache_g = KVCache(), KVCache()
    for t in range(6):
        a, _ = m(x[:, t : t + 1], cache=cache_m, need_weights=need_weights)
        b, _ = gpt(x[:, t : t + 1], None, cache_g, need_weights, None)
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
        torch.testing.assert_close(b, ref[:, t : t + 1], atol=1e-5, rtol=0)
    torch.testing.assert_close(cache_g.k, cache_m.k)
