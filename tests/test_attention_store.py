"""The long-context store (models/decoding/ondevice.py, issue 69): per layer the queries and keys after RoPE and norms
and each row's log-sum-exp, from which every row, block, pooled tile, overview and per-head statistic is recomputed
exactly. Held against the model's own full attention (GPT.forward with need_weights, float32) for Gemma-3-like
local/global layers (windows shorter than the input, their own RoPE base, sandwich norms, scaled queries, q/k norms),
grouped-query heads, soft-capped scores, GPT-2, and a prefix LM; the prompt read in chunks of a few tokens, the
score chunks a few rows; generation continued from the store equal to GPT.generate; 2,048 tokens within 1e-5; and
transformers' eager Gemma 3 at 4,096 tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import models.decoding.ondevice as od
from models import analysis, limits
from models.families.gpt import GPT, GPTConfig
from viz.common import pool_blocks

GEMMA = dict(recipe="llama", n_kv_heads=2, head_dim=12, qk_norm=True, sliding_window=5,
             layer_types=("sliding", "full", "sliding"), local_rope_base=300.0, rope_base=5000.0, embed_scale=6.9,
             sandwich_norm=True, attn_scale=0.2, final_softcap=25.0, ff_act="gelu_tanh", rope_layout="half")
FAMILIES = {
    "gemma3-like": GEMMA,
    "gqa-softcap": dict(recipe="llama", n_kv_heads=3, attn_softcap=2.5, qkv_bias=True),
    "mistral-window": dict(recipe="llama", n_kv_heads=1, sliding_window=7),
    "gpt2": dict(recipe="gpt2"),
}


def _model(max_len: int = 128, **kw) -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, max_len=max_len, d_model=48, n_layers=3, n_heads=6, **kw)).eval()
    with torch.no_grad():  # norm gains away from 1, so a norm read wrongly shows
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
    return model


def _full(model: GPT, ids: list[int], prefix: int = 0) -> np.ndarray:
    """The model's own weights (L, H, T, T) float32: the explicit path of GPT.forward."""
    with torch.no_grad():
        f = model(torch.tensor([ids]), need_weights=True, prefix=prefix)
    return np.stack([w[0].float().numpy() for w in f.attention])


def _local_share(w: np.ndarray, local: int) -> np.ndarray:
    t = w.shape[-1]
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    return (w * ((j > i - local) & (j <= i))).sum(-1).mean(-1)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Score chunks of a few rows, so every chunk boundary and band edge is crossed."""
    monkeypatch.setattr(od, "ATTENTION_CHUNK_BYTES", 6 * 4 * 60 * 5)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("chunk", [7, 1000])  # the prompt read 7 tokens a pass, or in one
def test_every_reduction_equals_the_full_map(family: str, chunk: int) -> None:
    model = _model(**FAMILIES[family])
    ids = [int(i) for i in torch.randint(3, 64, (53,), generator=torch.Generator().manual_seed(1))]
    full = _full(model, ids)
    att, logits = od.prefill(model, ids, chunk=chunk)
    with torch.no_grad():
        np.testing.assert_allclose(logits.numpy(), model(torch.tensor([ids])).logits[0, -1].numpy(), atol=1e-4)
    np.testing.assert_allclose(att.full(), full, atol=1e-6)
    for layer, head, query in [(0, 0, 0), (1, 5, 52), (2, 3, 30)]:
        np.testing.assert_allclose(att.row(layer, head, query), full[layer, head, query], atol=1e-6)
    np.testing.assert_allclose(att.block(2, slice(10, 31), slice(4, 17)), full[2, :, 10:31, 4:17], atol=1e-6)
    for layer in range(3):
        for cells in (4, 9, 64):  # tiles of the whole map and of a zoomed block of another shape
            for how in ("max", "mean"):
                got, re, ce = att.tiles(layer, 4, cells, how)
                want, wre, wce = pool_blocks(full[layer, 4], cells, how)
                np.testing.assert_allclose(got, want, atol=1e-6)
                np.testing.assert_array_equal(re, wre)
                got, _, _ = att.tiles(layer, "mean", cells, how, rows=(9, 50), cols=(2, 23))
                want, _, _ = pool_blocks(full[layer].mean(0)[9:50, 2:23], cells, how)
                np.testing.assert_allclose(got, want, atol=1e-6)
        np.testing.assert_allclose(att.fused(layer, "max", (3, 40), (0, 20)), full[layer].max(0)[3:40, :20], atol=1e-6)
    # the statistics over every row, against models.analysis on the full map
    local = model.config.sliding_window or od.LOCAL
    np.testing.assert_allclose(att.stats["entropy"], analysis.head_entropy(full), atol=1e-4)
    np.testing.assert_allclose(att.stats["sink"], analysis.first_token_share(full), atol=1e-5)
    np.testing.assert_allclose(att.stats["distance"], analysis.mean_attention_distance(full), atol=1e-4)
    np.testing.assert_allclose(att.stats["local"], _local_share(full, local), atol=1e-5)
    if model.config.sliding_window:  # a local layer never looks past its window
        assert np.allclose(att.stats["local"][0], 1.0, atol=1e-5)


@pytest.mark.parametrize("family", ["gemma3-like", "gqa-softcap"])
@pytest.mark.parametrize("steps", ["pass", "fixed"])
def test_generation_continues_from_the_store(family: str, steps: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prompt read 9 tokens a pass, then 12 new tokens: GPT.generate's ids, candidates and surprisal, its every
    weight, and the statistics and overview tiles over prompt + new rows."""
    monkeypatch.setattr(od, "PREFILL_TOKENS", 9)
    monkeypatch.setattr(od, "OVERVIEW_PRODUCTS", 0)  # every layer's overview tiles made by the passes
    monkeypatch.setattr(od, "OVERVIEW_CELLS", 16)
    model = _model(**FAMILIES[family])
    ids = list(range(3, 43))
    ref = model.generate(ids, max_new_tokens=12)
    done: list[tuple[int, int]] = []
    lazy = od.generate(model, ids, max_new_tokens=12, steps=steps, stats=True,
                       progress=lambda a, b: done.append((a, b)))
    assert done == [(9, 40), (18, 40), (27, 40), (36, 40), (40, 40)]
    got = lazy.result()
    assert got.ids == ref.ids and [s.candidates for s in got.steps] == [s.candidates for s in ref.steps]
    np.testing.assert_allclose(got.surprisal, ref.surprisal, atol=1e-5)
    full = ref.attention["decoder"].weights
    np.testing.assert_allclose(got.attention["decoder"].weights, full, atol=1e-6)
    att = lazy.attention
    assert sorted(att.overviews) == [0, 1, 2]
    for how in ("max", "mean"):
        np.testing.assert_allclose(att.overview(1, 2, how)[0], pool_blocks(full[1, 2], 16, how)[0], atol=1e-6)
        np.testing.assert_allclose(att.pooled[how], pool_blocks(full, od.POOL_CELLS, how)[0], atol=1e-6)
    np.testing.assert_allclose(att.stats["entropy"], analysis.head_entropy(full), atol=1e-4)
    np.testing.assert_allclose(att.stats["distance"], analysis.mean_attention_distance(full), atol=1e-4)


def test_a_prefix_lm() -> None:
    """PaliGemma's language model: the first 11 positions see one another both ways; a window of 4 on layer 0."""
    model = _model(prefix_lm=True, sliding_window=4, layer_types=("sliding", "full", "full"), n_kv_heads=2)
    ids = list(range(5, 35))
    full = _full(model, ids, prefix=11)
    att, _ = od.prefill(model, ids, prefix=11, chunk=4)  # the first pass holds the whole prefix
    np.testing.assert_allclose(att.full(), full, atol=1e-6)
    assert full[1, 0, 2, 10] > 0  # a prefix row sees a later prefix key
    np.testing.assert_allclose(att.row(0, 1, 3), full[0, 1, 3], atol=1e-6)
    np.testing.assert_allclose(att.tiles(0, 1, 7, "max")[0], pool_blocks(full[0, 1], 7, "max")[0], atol=1e-6)
    with pytest.raises(ValueError, match="causal model"):
        od.prefill(_model(), ids, prefix=3)


def test_refusals_and_cancel() -> None:
    model = _model(**GEMMA)
    with pytest.raises(ValueError, match="no tokens"):
        od.prefill(model, [])
    with pytest.raises(ValueError, match="exceed the model's 128 positions"):
        od.prefill(model, list(range(3, 60)) * 3)
    calls: list[int] = []
    with pytest.raises(od.Cancelled, match="after 8 of 40"):
        od.prefill(model, list(range(3, 43)), chunk=8, should_stop=lambda: len(calls) >= 1,
                   progress=lambda a, b: calls.append(a))
    att, _ = od.prefill(model, list(range(3, 43)))
    with pytest.raises(ValueError, match="not one of the layer's 6 heads"):
        att.row(0, 6, 3)
    with pytest.raises(ValueError, match="not one of the 40 positions"):
        att.row(0, 0, 40)
    # a description the store does not know (M-RoPE) is refused in words: the plain path answers
    mrope = GPT(GPTConfig(vocab_size=64, max_len=64, d_model=48, n_layers=1, n_heads=6, mrope_section=(1, 1, 2)))
    with pytest.raises(ValueError, match="mrope_section"):
        od.prefill(mrope, [3, 4, 5])
    assert od.store_bytes(model, 2000) < od.store_bytes(model, 4000) < 2 * od.store_bytes(model, 2000)


def test_2048_tokens_within_1e5(monkeypatch: pytest.MonkeyPatch) -> None:
    """2,048 tokens (windowed and global layers): the store's rows, tiles and statistics equal the model's float32
    map within 1e-5 (GPT.forward keeps float32 when LONG_TOKENS is raised past the input)."""
    monkeypatch.setattr(od, "ATTENTION_CHUNK_BYTES", 64 << 20)
    monkeypatch.setattr(limits, "LONG_TOKENS", 4096)
    model = _model(max_len=2048, **{**GEMMA, "sliding_window": 100})
    ids = [int(i) for i in torch.randint(3, 64, (2048,), generator=torch.Generator().manual_seed(2))]
    full = _full(model, ids)
    att, _ = od.prefill(model, ids, chunk=700)
    for layer in range(3):
        np.testing.assert_allclose(att.row(layer, 3, 2047), full[layer, 3, 2047], atol=1e-5)
        np.testing.assert_allclose(att.row(layer, 0, 901), full[layer, 0, 901], atol=1e-5)
        for how in ("max", "mean"):
            np.testing.assert_allclose(att.overview(layer, 5, how)[0], pool_blocks(full[layer, 5], 512, how)[0],
                                       atol=1e-5)
    np.testing.assert_allclose(att.stats["sink"], analysis.first_token_share(full), atol=1e-5)
    np.testing.assert_allclose(att.stats["local"], _local_share(full, 100), atol=1e-5)
    np.testing.assert_allclose(att.stats["entropy"], analysis.head_entropy(full), atol=1e-4)


def test_transformers_gemma3_eager_at_4096_tokens(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A random Gemma 3 folder written by transformers (a window of 64 on the local layers, their own RoPE base,
    query_pre_attn_scalar, final soft cap): its eager attention over 4,096 tokens equals the store's rows and
    blocks, read from the folder by the project's reader (within 2e-5: the two sum q·k in different orders, and
    the layers' inputs already differ by float rounding after 4,096 tokens of residual stream)."""
    from models.io.hf import load_hf
    from tests.tiny_families import VOCAB, decoder_folder

    monkeypatch.setattr(limits, "MAX_LM_TOKENS", 4200)

    ref = decoder_folder(tmp_path / "g", "gemma3_text", max_position_embeddings=4200, sliding_window=64,
                         num_attention_heads=2, num_key_value_heads=1)
    ours = load_hf(tmp_path / "g").eval()
    ids = [int(i) for i in torch.randint(1, VOCAB, (4096,), generator=torch.Generator().manual_seed(3))]
    with torch.no_grad():
        out = ref(torch.tensor([ids]), output_attentions=True)
    att, logits = od.prefill(ours, ids)
    np.testing.assert_allclose(logits.numpy(), out.logits[0, -1].numpy(), atol=1e-3)
    for layer, a in enumerate(out.attentions):
        a = a[0].float().numpy()  # (H, T, T)
        for query in (0, 63, 64, 2000, 4095):
            np.testing.assert_allclose(att.row(layer, 1, query), a[1, query], atol=2e-5)
        np.testing.assert_allclose(att.block(layer, slice(3000, 3100), slice(2950, 3100)), a[:, 3000:3100, 2950:3100],
                                   atol=2e-5)
        got = att.overview(layer, 0, "max")[0]
        np.testing.assert_allclose(got, pool_blocks(a[0], 512, "max")[0], atol=2e-5)
