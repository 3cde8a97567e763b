"""models/decoding/ondevice.py: attention kept on the device as post-RoPE queries, keys and each row's log-sum-exp gives
GPT.generate's answer (ids, candidates, surprisal) and, on demand, its every attention weight, block, row and
pooled tile (against viz.common.pool_blocks of the full array), for the LLaMA recipe (grouped-query heads, biases,
both RoPE layouts) and GPT-2; with chunked passes (the prompt's rows a few at a time) and sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import models.decoding.ondevice as od
from models.families.gpt import GPT, GPTConfig
from viz.common import pool_blocks

FAMILIES = {"llama-gqa-bias": dict(recipe="llama", n_kv_heads=2, qkv_bias=True), "gpt2": dict(recipe="gpt2"),
            "llama-half": dict(recipe="llama", rope_layout="half")}


def _model(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=64, max_len=128, d_model=48, n_layers=3, n_heads=6, **kw)).eval()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("chunk", [od.ATTENTION_CHUNK_BYTES, 6 * 4 * 50 * 7])  # one chunk; a few rows a chunk
@pytest.mark.parametrize("steps", ["pass", "fixed"])  # new tokens: growing shapes, or the fixed-shape step
def test_equals_gpt_generate(family: str, chunk: int, steps: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(od, "ATTENTION_CHUNK_BYTES", chunk)
    model = _model(**FAMILIES[family])
    ids = list(range(3, 40))
    ref = model.generate(ids, max_new_tokens=10)
    lazy = od.generate(model, ids, max_new_tokens=10, steps=steps)
    got = lazy.result()
    assert got.ids == ref.ids and got.tokens == ref.tokens and got.prompt_len == ref.prompt_len
    assert [s.chosen for s in got.steps] == [s.chosen for s in ref.steps]
    assert [s.candidates for s in got.steps] == [s.candidates for s in ref.steps]
    for a, b in zip(got.steps, ref.steps):
        np.testing.assert_allclose(a.probs, b.probs, atol=1e-6)
    np.testing.assert_allclose(got.surprisal, ref.surprisal, atol=1e-5)
    full = ref.attention["decoder"].weights
    np.testing.assert_allclose(got.attention["decoder"].weights, full, atol=1e-6)
    att = lazy.attention
    np.testing.assert_allclose(att.row(1, 2, 30), full[1, 2, 30], atol=1e-6)
    np.testing.assert_allclose(att.block(2, slice(10, 20), slice(5, 15)), full[2, :, 10:20, 5:15], atol=1e-6)
    for cells in (8, 64):
        att.pool(cells)
        for how in ("max", "mean"):
            want, edges, _ = pool_blocks(full, cells, how)
            np.testing.assert_allclose(att.pooled[how], want, atol=1e-6)
            np.testing.assert_array_equal(att.edges, edges)
    # what stays on the device: queries, keys and log-sum-exps, (H + H_kv)·d + H numbers a row against H·T weights
    assert att.nbytes() < full.nbytes / 2


@pytest.mark.parametrize("steps", ["pass", "graph"])  # "graph" on the CPU: the fixed-shape step, not captured
def test_eos_stop_and_sampling(steps: str) -> None:
    model = _model(recipe="llama", n_kv_heads=3)
    ids = [5, 9, 11, 4, 7]
    ref = model.generate(ids, max_new_tokens=12, strategy="sample", temperature=1.5, top_k=20, seed=3)
    got = od.generate(model, ids, max_new_tokens=12, strategy="sample", temperature=1.5, top_k=20, seed=3,
                      steps=steps).result()
    assert got.ids == ref.ids
    np.testing.assert_allclose(got.attention["decoder"].weights, ref.attention["decoder"].weights, atol=1e-6)
    # an EOS choice ends the generation early, with the EOS token's own attention row, as GPT.generate
    eos = ref.ids[len(ids)]
    model.config.eos_id = eos
    ref = model.generate(ids, max_new_tokens=12, strategy="sample", temperature=1.5, top_k=20, seed=3)
    got = od.generate(model, ids, max_new_tokens=12, strategy="sample", temperature=1.5, top_k=20, seed=3,
                      steps=steps).result()
    assert got.ids == ref.ids == ids + [eos]
    np.testing.assert_allclose(got.attention["decoder"].weights, ref.attention["decoder"].weights, atol=1e-6)


@pytest.mark.parametrize("prompt", [30, 515])  # the second over limits.LONG_TOKENS: float16 weights, as GPT.generate
def test_fastgen_hands_gpu_models_to_ondevice(prompt: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """models.decoding.fastgen.generate on a GPU model (here: the check forced on the CPU) answers through
    models.decoding.ondevice, with GPT.generate's result: ids, candidates, surprisal and the attention array
    in its dtype."""
    from models.decoding import fastgen

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, max_len=600, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2)).eval()
    ids = [int(i) for i in torch.randint(3, 64, (prompt,))]
    ref = model.generate(ids, max_new_tokens=4)
    called = []
    real = od.generate
    monkeypatch.setattr(fastgen, "on_gpu", lambda m: True)
    monkeypatch.setattr(od, "generate", lambda *a, **k: called.append(1) or real(*a, **k))
    got = fastgen.generate(model, ids, max_new_tokens=4)
    assert called and got.ids == ref.ids and [s.candidates for s in got.steps] == [s.candidates for s in ref.steps]
    np.testing.assert_allclose(got.surprisal, ref.surprisal, atol=1e-5)
    want = ref.attention["decoder"].weights
    assert got.attention["decoder"].weights.dtype == want.dtype == (np.float16 if prompt > 512 else np.float32)
    np.testing.assert_allclose(got.attention["decoder"].weights.astype(np.float32), want.astype(np.float32),
                               atol=1e-3 if prompt > 512 else 1e-6)


@pytest.mark.parametrize("cells", [8, 5, 64])  # blocks of 6, 10 and 1 rows over 47 tokens: the prompt ends mid-block
@pytest.mark.parametrize("chunk", [od.ATTENTION_CHUNK_BYTES, 6 * 4 * 37 * 7])  # one chunk; a block or two a chunk
def test_tiles_made_during_the_passes(cells: int, chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pooled tiles ``generate`` accumulates (the prompt's rows in its pass, the new rows after decoding) equal
    viz.common.pool_blocks of GPT.generate's full array, as does the lse."""
    monkeypatch.setattr(od, "ATTENTION_CHUNK_BYTES", chunk)
    monkeypatch.setattr(od, "POOL_CELLS", cells)
    model = _model(recipe="llama", n_kv_heads=2)
    ids = list(range(3, 40))
    ref = model.generate(ids, max_new_tokens=10)
    lazy = od.generate(model, ids, max_new_tokens=10, steps="fixed")
    assert lazy.ids == ref.ids and set(lazy.timings) == {"prompt_pass", "prompt_logits", "decode", "tiles"}
    np.testing.assert_allclose(lazy.surprisal, ref.surprisal, atol=1e-5)
    full = ref.attention["decoder"].weights
    np.testing.assert_allclose(lazy.attention.full(), full, atol=1e-6)
    for how in ("max", "mean"):
        want, edges, _ = pool_blocks(full, cells, how)
        np.testing.assert_allclose(lazy.attention.pooled[how], want, atol=1e-6)
        np.testing.assert_array_equal(lazy.attention.edges, edges)


def test_tiles_after_an_early_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A generation that ends at its end-of-sequence token has fewer rows than the tiles were laid out for: they are
    made again over the rows there are."""
    monkeypatch.setattr(od, "POOL_CELLS", 8)
    model = _model(recipe="llama", n_kv_heads=3)
    ids = [5, 9, 11, 4, 7, 12, 30, 2, 8]
    model.config.eos_id = model.generate(ids, max_new_tokens=3).ids[len(ids) + 1]
    ref = model.generate(ids, max_new_tokens=12)
    got = od.generate(model, ids, max_new_tokens=12)
    assert got.ids == ref.ids and len(got.ids) < len(ids) + 12  # stopped early
    want, edges, _ = pool_blocks(ref.attention["decoder"].weights, 8, "max")
    np.testing.assert_allclose(got.attention.pooled["max"], want, atol=1e-6)
    np.testing.assert_array_equal(got.attention.edges, edges)


HEADS = [0, 4, "mean", "max", None]  # one head, a fusion over the heads, or every head


@pytest.mark.parametrize("chunk", [od.ATTENTION_CHUNK_BYTES, 6 * 4 * 47 * 3])  # one chunk; three rows a chunk
def test_figure_parts_computed_on_the_device_equal_the_full_arrays(chunk: int, monkeypatch) -> None:
    """What the Generate tab reads of a map kept on the device (``DeviceAttention.fused``, ``tiles``, ``lines``, and
    ``upto`` for a replayed step) equals viz's own select_head, pool_blocks and strongest_lines of GPT.generate's
    full array: every head and fusion, square and rectangular blocks, blocks that split the chunks."""
    from viz.attention import select_head, strongest_lines

    monkeypatch.setattr(od, "ATTENTION_CHUNK_BYTES", chunk)
    model = _model(recipe="llama", n_kv_heads=2)
    ids = list(range(3, 40))
    full = model.generate(ids, max_new_tokens=10).attention["decoder"].weights  # (3, 6, 47, 47)
    att = od.generate(model, ids, max_new_tokens=10, pool=False).attention

    def dense(layer: int, head, rows=slice(None), cols=slice(None)) -> np.ndarray:
        w = full[layer][:, rows, cols]
        return w if head is None else select_head(w, None, head)

    for head in HEADS:
        np.testing.assert_allclose(att.fused(2, head), dense(2, head), atol=1e-6)
        np.testing.assert_allclose(att.fused(1, head, (10, 33), (4, 21)), dense(1, head, slice(10, 33), slice(4, 21)),
                                   atol=1e-6)
        for cells, rows, cols in ((8, None, None), (5, (3, 46), (0, 17)), (64, (1, 9), (2, 30))):
            r, c = slice(*(rows or (0, 47))), slice(*(cols or (0, 47)))
            for how in ("max", "mean"):
                got, re, ce = att.tiles(0, head, cells, how, rows, cols)
                want, we, wc = pool_blocks(dense(0, head, r, c), cells, how)
                np.testing.assert_allclose(got, want, atol=1e-6)
                np.testing.assert_array_equal(re, we)
                np.testing.assert_array_equal(ce, wc)
    for heads, threshold, cap in (([0, 3, 5], 0.05, 20000), ([1], 0.0, 40), (list(range(6)), 0.02, 300)):
        got = att.lines(1, heads, threshold, cap)
        want = strongest_lines(full[1][heads], threshold, cap)
        for a, b in zip(got[:3], want[:3]):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(got[3], want.vals, atol=1e-6)
        assert got[4] == pytest.approx(want.threshold, abs=1e-6) and got[5] == want.raised
        assert len(got[0]) == min(cap, int((full[1][heads] >= threshold).sum()))
    # a replayed step: the first 41 tokens' map, the same tensors read up to there
    early = att.upto(41)
    np.testing.assert_allclose(early.fused(0, "max"), select_head(full[0, :, :41, :41], None, "max"), atol=1e-6)
    np.testing.assert_allclose(early.tiles(2, 3, 8, "mean")[0], pool_blocks(full[2, 3, :41, :41], 8, "mean")[0],
                               atol=1e-6)
    with pytest.raises(ValueError, match="not inside the map"):
        att.fused(0, 0, (40, 48))
    with pytest.raises(ValueError, match="head 6 is not one of"):
        att.tiles(0, 6, 8)


def test_a_device_map_materialises_its_arrays_only_under_the_cap(monkeypatch) -> None:
    """``DeviceMap.weights`` is every weight (the .npz), refused in words over ATLAS_ARRAYS_MAX_MB; ``to`` moves the
    kept tensors (a ZeroGPU Space's results come back on the CPU) and keeps every answer."""
    model = _model(recipe="llama", n_kv_heads=3)
    ids = list(range(3, 30))
    ref = model.generate(ids, max_new_tokens=4).attention["decoder"]
    dmap = od.generate(model, ids, max_new_tokens=4).kept().attention["decoder"]
    assert (dmap.layers, dmap.heads, dmap.queries) == (ref.layers, ref.heads, ref.queries)
    np.testing.assert_allclose(dmap.weights, ref.weights, atol=1e-6)
    moved = dmap.to("cpu")
    np.testing.assert_allclose(moved.upto(20).attention.fused(1, 2), ref.weights[1, 2, :20, :20], atol=1e-6)
    assert moved.nbytes == dmap.nbytes < ref.weights.nbytes
    monkeypatch.setattr(od, "ARRAYS_MAX_MB", 0)
    with pytest.raises(od.ArraysTooLarge, match="ATLAS_ARRAYS_MAX_MB"):
        dmap.weights  # noqa: B018
