"""Long contexts (2,048 tokens): pooled tiles equal a direct pooling of the full arrays, a zoom is exactly the full
array's block, every figure of a 2,048-token input stays ≤ 3 MB (the model view at 12 × 12 heads included), the
server's token cap, and hostile zoom, prompt and patching parameters answered or refused in words."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import gradio as gr
import numpy as np
import pytest

import viz
from models import limits
from serving import catalogue, store
from viz.attention import POOL_ABOVE, TILE_CELLS, attention_block, select_head
from viz.common import block_edges, pool_blocks

LONG_BUDGET = 3_000_000  # bytes of JSON a figure of a 2,048-token input may take
ROOT = Path(__file__).resolve().parents[1]


def direct_pool(a: np.ndarray, max_cells: int, how: str) -> np.ndarray:
    """The reference: a plain loop over blocks with numpy's max / mean, in float64."""
    re, ce = block_edges(a.shape[-2], max_cells), block_edges(a.shape[-1], max_cells)
    out = np.empty(a.shape[:-2] + (len(re) - 1, len(ce) - 1))
    for i in range(len(re) - 1):
        for j in range(len(ce) - 1):
            block = a[..., re[i]:re[i + 1], ce[j]:ce[j + 1]].astype(np.float64)
            out[..., i, j] = block.max(axis=(-2, -1)) if how == "max" else block.mean(axis=(-2, -1))
    return out


def causal(heads: int, n: int, seed: int = 0, dtype=np.float32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = np.tril(rng.random((heads, n, n), dtype=np.float32) ** 4)
    return (w / w.sum(-1, keepdims=True)).astype(dtype)


# ------------------------------------------------------------------------------------------- tiles and zoom
@pytest.mark.parametrize("shape,cells", [((3, 37, 53), 8), ((2, 2, 100, 100), 7), ((1031, 1030), 512),
                                         ((5, 5), 64), ((2049, 17), 512)])
@pytest.mark.parametrize("how", ["max", "mean"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_tiles_are_the_full_array_pooled_block_by_block(shape, cells, how, dtype) -> None:
    a = np.random.default_rng(sum(shape)).random(shape).astype(dtype)
    pooled, re, ce = pool_blocks(a, cells, how)
    assert pooled.dtype == np.float32 and pooled.shape[-2:] == (len(re) - 1, len(ce) - 1)
    assert max(pooled.shape[-2:]) <= cells and re[-1] == shape[-2] and ce[-1] == shape[-1]
    np.testing.assert_allclose(pooled, direct_pool(a, cells, how), rtol=1e-6, atol=1e-7)


def test_pooling_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="pooling must be one of max, mean"):
        pool_blocks(np.ones((4, 4)), 2, "median")
    with pytest.raises(ValueError, match="nothing to pool"):
        pool_blocks(np.ones((0, 4)), 2)


@pytest.mark.parametrize("how", ["max", "mean"])
def test_a_long_heatmap_is_drawn_from_the_pooled_map_and_says_so(how) -> None:
    n = 2049
    w = causal(2, n, dtype=np.float16)[None]  # (1 layer, 2 heads, n, n), float16 as the app keeps a long input
    tokens = [f"t{i}" for i in range(n)]
    fig = viz.attention_heatmap(w, tokens, layer=0, head="max", pool=how)
    z = np.asarray(fig.data[0].z)
    want = direct_pool(select_head(w, 0, "max"), TILE_CELLS, how)
    assert z.shape == want.shape and max(z.shape) <= TILE_CELLS
    np.testing.assert_allclose(z, want, rtol=1e-6, atol=1e-7)
    title = fig.layout.title.text
    assert f"{how}-pooled" in title and "2049×2049 tokens" in title and "zoom" in title
    assert len(fig.to_json()) <= LONG_BUDGET
    # the first tile covers tokens 0-4 (2049 tokens in blocks of 5), labelled by position
    assert fig.data[0].y[0].startswith("0–4 t0")


def test_short_inputs_keep_full_resolution_and_readable_labels() -> None:
    """Up to POOL_ABOVE tokens every cell is drawn; past 64 tokens the labels are every k-th, as many as fit its
    plot LABEL_PX apart (issue 75, item 4: 128 labels on 10 px cells made a 1,580 px figure that scrolled sideways)."""
    from viz.attention import LABEL_PX, MAP_PX

    w = causal(1, 128)[0]
    fig = viz.attention_heatmap(w, [f"w{i}" for i in range(128)])
    assert np.asarray(fig.data[0].z).shape == (128, 128) and "pooled" not in fig.layout.title.text
    ticks = fig.layout.xaxis.tickvals
    assert ticks == tuple(fig.data[0].x[::2]) and MAP_PX / len(ticks) >= LABEL_PX  # every other token
    at_limit = viz.attention_heatmap(causal(1, POOL_ABOVE)[0], [f"w{i}" for i in range(POOL_ABOVE)])
    assert np.asarray(at_limit.data[0].z).shape == (POOL_ABOVE, POOL_ABOVE)


@pytest.mark.parametrize("head", [3, "mean", "max"])
def test_a_zoom_is_exactly_the_full_arrays_block(head) -> None:
    n = 2048
    w = np.stack([causal(4, n, seed=1, dtype=np.float16), causal(4, n, seed=2, dtype=np.float16)])  # (2, 4, n, n)
    tokens = [f"t{i}" for i in range(n)]
    fig = viz.attention_zoom(w, tokens, rows=(1700, 2048), cols=(1000, 1400), layer=1, head=head)
    z = np.asarray(fig.data[0].z)
    np.testing.assert_array_equal(z, select_head(w[1], None, head)[1700:2048, 1000:1400].astype(np.float32))
    assert fig.data[0].y[0] == "1700 · t1700" and fig.data[0].x[-1] == "1399 · t1399"
    assert fig.layout.yaxis.ticktext[0] == "1700 t1700"  # ticks say positions in the whole input
    assert "zoom: queries 1700–2047 × keys 1000–1399 (full resolution)" in fig.layout.title.text
    assert len(fig.to_json()) <= LONG_BUDGET
    # a block wider than POOL_ABOVE is pooled itself, and says so
    wide = viz.attention_zoom(w, tokens, rows=(0, 2048), cols=(0, 2048), layer=0, head=0, pool="mean")
    assert "mean-pooled" in wide.layout.title.text and max(np.asarray(wide.data[0].z).shape) <= TILE_CELLS


@pytest.mark.parametrize("rows,cols", [((0, 2049), (0, 10)), ((-1, 5), (0, 5)), ((10, 5), (0, 5)), ((5, 5), (0, 5)),
                                       ((0, 5), (3, 3))])
def test_a_zoom_outside_the_map_reversed_or_empty_is_a_value_error(rows, cols) -> None:
    with pytest.raises(ValueError, match="is not inside the map"):
        attention_block(np.zeros((2048, 2048), np.float16), rows, cols)


def test_every_figure_of_a_2048_token_input_fits_3_mb() -> None:
    """GPT-2 small's 12 × 12 heads over 2,048 tokens, float16 (1.2 GB, built a layer at a time): the pooled
    heatmap, a zoomed block, the head view and the model view, each ≤ 3 MB of JSON."""
    n, rng = 2048, np.random.default_rng(0)
    w = np.empty((12, 12, n, n), np.float16)
    for layer in range(12):
        w[layer] = np.tril(rng.random((12, n, n), dtype=np.float32))  # uniform noise: the worst case to encode
    tokens = [f"▁token{i}" for i in range(n)]
    sizes = {
        "heatmap": len(viz.attention_heatmap(w, tokens, layer=11, head="mean").to_json()),
        "zoom": len(viz.attention_zoom(w, tokens, rows=(1536, 2048), cols=(0, 512), layer=5, head=7).to_json()),
        "head view": len(viz.head_view(w, tokens, layer=11).to_json()),
        "model view": len(viz.model_view(w, tokens).to_json()),
    }
    assert all(size <= LONG_BUDGET for size in sizes.values()), sizes


# ------------------------------------------------------------------------------------------------ the token cap
def test_the_token_cap_is_the_models_context_capped_by_atlas_max_tokens() -> None:
    from models.families.gpt import GPT, GPTConfig

    assert limits.MAX_LM_TOKENS == int(os.environ.get("ATLAS_MAX_TOKENS") or 32_768)
    assert limits.MAX_FULL_TOKENS == min(2048, limits.MAX_LM_TOKENS)
    assert limits.LONG_TOKENS == POOL_ABOVE and limits.MAX_TILE_CELLS == TILE_CELLS
    small = GPT(GPTConfig(vocab_size=50, max_len=256, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32))
    large = GPT(GPTConfig(vocab_size=50, max_len=65536, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32))
    assert small.context_limit() == 256 and large.context_limit() == limits.MAX_LM_TOKENS
    # a model the long-context store does not compute (M-RoPE) keeps its whole map: the full-map cap
    mrope = GPT(GPTConfig(vocab_size=50, max_len=65536, d_model=16, n_layers=1, n_heads=2, mrope_section=(1, 1, 2)))
    assert mrope.context_limit() == limits.MAX_FULL_TOKENS
    run = [sys.executable, "-c", "from models import limits; print(limits.MAX_LM_TOKENS)"]
    env = dict(os.environ, ATLAS_MAX_TOKENS="4096")
    assert subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True).stdout.strip() == "4096"
    for bad in ("lots", "12", "-5"):
        out = subprocess.run(run, cwd=ROOT, env=dict(env, ATLAS_MAX_TOKENS=bad), capture_output=True, text=True)
        assert out.returncode != 0 and "ATLAS_MAX_TOKENS must be a whole number of tokens, at least 64" in out.stderr
    assert "2,048 tokens" in limits.describe() or f"{limits.MAX_LM_TOKENS:,} tokens" in limits.describe()


# ------------------------------------------------------------------------------ the Generate tab, long and hostile
@pytest.fixture(scope="module")
def long_tab(tiny_checkpoints: Path, tmp_path_factory):
    """Generate over a tiny random LLaMA with 4,096 positions (bench/_long_model.py at a small size), in process."""
    from bench._long_model import long_llama_folder

    root = tmp_path_factory.mktemp("long") / "checkpoints"
    shutil.copytree(tiny_checkpoints / "gpt-tiny", root / "gpt-tiny")
    long_llama_folder(root / "long-llama", layers=2, heads=4, d_model=64, positions=4096, vocab=2000)
    mp = pytest.MonkeyPatch()
    mp.setattr(limits, "MAX_LM_TOKENS", 2048)  # a 2,048-token input: read into the long-context store
    mp.setattr(catalogue, "CHECKPOINTS", root)
    mp.setattr(store, "MODELS", store.ModelStore())
    from tabs import generate as tab

    yield tab
    mp.undo()


@pytest.fixture(scope="module")
def long_run(long_tab):
    from bench._long_model import long_prompt

    out = long_tab.generate(long_prompt(), 1, "long-llama", progress=None)
    return out


def exact(state: dict) -> np.ndarray:
    """Every weight of the kept long result in float32, from its store (the .npz's are float16)."""
    kept = state["result"].attention["decoder"].attention
    return np.stack([kept.fused(i, None) for i in range(kept.shape[0])])


def test_a_2048_token_generation_is_drawn_pooled_from_the_store(long_tab, long_run) -> None:
    """Over LONG_TOKENS the generation is read into the long-context store (never the T × T map); the figures are
    its tiles, equal to a direct pooling of the exact map; the whole array (float16) only on request."""
    text, notice, html, cand, attn, lens, state, npz = long_run[:8]
    result = state["result"]
    t = len(result.tokens)
    assert t == limits.MAX_LM_TOKENS and result.prompt_len == t - 1
    assert "Prompt shortened to its last 2047 tokens" in notice and "max-pooled tiles" in notice
    assert long_tab.on_device(state) and result.attention["decoder"].nbytes < 2 * 4 * t * t  # q, k and lse only
    full = exact(state)
    np.testing.assert_allclose(full.sum(-1), 1.0, atol=1e-5)
    weights = result.attention["decoder"].weights
    assert weights.dtype == np.float16 and weights.shape == (2, 4, t, t)
    np.testing.assert_allclose(weights, full, atol=1e-3)
    z = np.asarray(attn.data[0].z)
    assert max(z.shape) <= TILE_CELLS and "max-pooled" in attn.layout.title.text
    np.testing.assert_allclose(z, direct_pool(select_head(full, 1, "mean"), TILE_CELLS, "max"), rtol=1e-5,
                               atol=1e-7)
    assert lens is None and npz is None  # made on request
    assert len(attn.to_json()) <= LONG_BUDGET
    # mean tiles on a redraw, without running the model
    _, _, mean_fig = long_tab.draw_generation(state, 0, 1, "2", "heatmap", "mean")
    np.testing.assert_allclose(np.asarray(mean_fig.data[0].z), direct_pool(full[1, 2], TILE_CELLS, "mean"),
                               rtol=1e-5, atol=1e-7)


def test_zoom_lens_and_npz_of_the_kept_long_generation(long_tab, long_run) -> None:
    state = long_run[6]
    weights, full = state["result"].attention["decoder"].weights, exact(state)
    fig = long_tab.zoom(state, 1, "3", 1800, 2047, 1790, 2047)
    np.testing.assert_allclose(np.asarray(fig.data[0].z), full[1, 3, 1800:2048, 1790:2048], atol=1e-7)
    assert "full resolution" in fig.layout.title.text
    last = long_tab.zoom(state, -1, "mean", -10, -1, -10, -1)  # −1 counts from the end
    np.testing.assert_allclose(np.asarray(last.data[0].z), full[1, :, -10:, -10:].mean(0), rtol=1e-5)
    lens = long_tab.logit_lens(state)
    assert np.asarray(lens.data[0].z).shape == (2, long_tab.LENS_LAST) and "last 256 of 2048" in lens.layout.title.text
    path = long_tab.attention_npz(state)
    with zipfile.ZipFile(path) as archive:
        assert all(info.compress_type == zipfile.ZIP_DEFLATED for info in archive.infolist())
    with np.load(path) as arrays:
        assert arrays["attention"].dtype == np.float16 and "scores" not in arrays
        np.testing.assert_array_equal(arrays["attention"], weights)
        assert len(arrays["tokens"]) == weights.shape[-1]


@pytest.mark.parametrize("args,message", [
    ((0, "mean", 0, 5000, 0, 10), "The last query 5000 is outside 0 … 2047"),
    ((0, "mean", 100, 50, 0, 10), "Empty block: queries 100 … 50"),
    ((0, "mean", 0, 10, 30, 20), "Empty block"),
    ((0, "mean", 1.5, 10, 0, 10), "The first query must be a whole number"),
    ((0, "mean", "ten", 10, 0, 10), "The first query must be a whole number"),
    ((0, "mean", -5000, 10, 0, 10), "outside 0 … 2047"),
    ((0, "mean", 0, 1e300, 0, 10), "outside 0 … 2047"),
    ((0, "mean", 0, float("nan"), 0, 10), "must be a whole number"),
    ((0, "7", 0, 10, 0, 10), "This model has heads 0 … 3; got 7"),
    ((0, "sum", 0, 10, 0, 10), "Unknown head 'sum'"),
    ((9, "mean", 0, 10, 0, 10), "The layer 9 is outside 0 … 1"),
])
def test_hostile_zoom_parameters_are_refused_in_words(long_tab, long_run, args, message) -> None:
    with pytest.raises(gr.Error, match=message.replace("(", r"\(").replace(")", r"\)")):
        long_tab.zoom(long_run[6], *args)


def test_hostile_requests_around_long_inputs(long_tab, long_run) -> None:
    with pytest.raises(gr.Error, match="Generate a continuation first"):
        long_tab.zoom(None, 0, "mean", 0, 10, 0, 10)
    with pytest.raises(gr.Error, match="Generate a continuation first"):
        long_tab.attention_npz({})
    with pytest.raises(gr.Error, match="Unknown pooling 'median'"):
        long_tab.zoom(long_run[6], 0, "mean", 0, 10, 0, 10, "median")
    with pytest.raises(gr.Error, match="Unknown pooling"):
        long_tab.generate("hello", 1, "long-llama", pooling="<script>", progress=None)
    # empty ranges mean the whole axis: a 2,048 × 2,048 block is pooled like the whole map
    whole = long_tab.zoom(long_run[6], 0, "0", None, "", None, None)
    assert "max-pooled" in whole.layout.title.text
    # a huge prompt (a million characters) is read up to 20,000 characters, then cut to the context, in words
    out = long_tab.generate("word " * 200_000, 2, "long-llama", progress=None)
    assert len(out[6]["result"].tokens) == limits.MAX_LM_TOKENS and "Prompt shortened to its last 2046" in out[1]
    # repeated random tokens stay a short input whatever N is asked for
    roles = long_tab.head_roles("long-llama", 10_000, 0)[0]
    assert "N = 255" in roles.layout.title.text
    # patching would run a forward per head or position: more than 256 tokens is refused in words
    from tabs.sections import patching as patch_section

    # the corrupted text swaps two words of the first sentence, so both inputs hold the same words and the same number
    # of tokens whatever BPE merges the long model's tokenizer learnt (it is trained on the repository's own files,
    # which change: "dog" for "cat" once added a token)
    long_text = "the cat sat on the mat " * 200
    swapped = "the mat sat on the cat " + long_text[len("the cat sat on the mat "):]
    with pytest.raises(gr.Error, match="Patching reads at most 256 tokens"):
        patch_section.patch_texts("long-llama", long_text, swapped, "", "heads")


def test_a_long_previous_result_is_released_before_the_next_run(long_tab) -> None:
    from bench._long_model import long_prompt

    first = long_tab.generate(long_prompt(), 1, "long-llama", progress=None)[6]
    second = long_tab.generate("A short prompt", 2, "long-llama", "greedy", 1.0, 0, 1.0, 0, -1, "mean", "heatmap",
                               "max", first, progress=None)[6]
    assert first == {} and len(second["result"].tokens) < limits.LONG_TOKENS
    with pytest.raises(gr.Error, match="Generate a continuation first"):
        long_tab.zoom(first, 0, "mean", 0, 10, 0, 10)
    assert long_tab.draw_generation(first, 0, 0, "mean", "heatmap") == (None, None, None)


def test_all_sessions_long_results_stay_under_the_cap(long_tab, monkeypatch) -> None:
    """Three sessions generate long inputs under a cap of two and a half results: the oldest is let go (its state
    empty, its zoom asks for a new generation), the two newest keep zooming; a short result is never counted."""
    from bench._long_model import long_prompt
    from serving import results

    states = [long_tab.generate(long_prompt(), 1, "long-llama", progress=None)[6]]
    size = states[0]["result"].attention["decoder"].nbytes  # a long result is its store: counted as device-side
    monkeypatch.setattr(results, "DEVICE_RESULTS", results.LongResults(2.5 * size / 2**20))
    states = [long_tab.generate(long_prompt(), 1, "long-llama", progress=None)[6] for _ in range(3)]
    short = long_tab.generate("A short prompt", 2, "long-llama", progress=None)[6]
    assert states[0] == {} and all(s["result"] for s in states[1:]) and short["result"]
    assert results.DEVICE_RESULTS.total() == 2 * size
    with pytest.raises(gr.Error, match="let go when newer long results need"):
        long_tab.zoom(states[0], 0, "mean", 0, 10, 0, 10)
    assert long_tab.zoom(states[2], 0, "mean", 0, 10, 0, 10).data[0].z is not None


def test_a_dropped_session_leaves_the_count_of_long_results() -> None:
    import gc

    from serving.results import Kept, LongResults

    kept = LongResults(cap_mb=3)
    a, b = Kept(result=1), Kept(result=2)
    assert kept.keep(a, 2**20) == [] and kept.keep(b, 2**20) == [] and kept.total() == 2 * 2**20
    del a
    gc.collect()
    assert kept.total() == 2**20
    c = Kept(result=3)
    assert kept.keep(c, 2 * 2**20) == [] and b == {"result": 2}  # 3 MB: both fit
    d = Kept(result=4)
    assert kept.keep(d, 2**20) == [b] and b == {} and c and d  # the oldest goes first
    huge = Kept(result=5)
    assert kept.keep(huge, 10 * 2**20) == [c, d] and huge  # the newest is kept even alone over the cap


def test_comparing_two_long_inputs_stays_light(long_tab) -> None:
    """The compare toggle on two 2,048-token inputs: B's figure and B − A are tiles (≤ 3 MB each), B − A is the
    mean of the aligned difference over each block, and the .npz of both is float16 and deflated."""
    from bench._long_model import long_prompt
    from models.analysis import align_tokens
    from tabs.sections import compare as compare_section

    a = long_tab.generate(long_prompt(), 1, "long-llama", progress=None)[6]
    b = long_tab.generate(long_prompt().replace("the", "a"), 1, "long-llama", progress=None)[6]
    note, fig_b, diff, change = compare_section.compared(long_tab.compare_view, a, b, 1, "0", "heatmap")
    assert "tokens of B are shared with A" in note
    for fig in (fig_b, diff, change):
        assert len(fig.to_json()) <= LONG_BUDGET
    wa, wb = (exact(s)[1, 0] for s in (a, b))
    pairs = align_tokens(a["result"].tokens, b["result"].tokens)
    ia, ib = [i for i, _ in pairs], [j for _, j in pairs]
    full = wb[np.ix_(ib, ib)] - wa[np.ix_(ia, ia)]
    np.testing.assert_allclose(np.asarray(diff.data[0].z), direct_pool(full, TILE_CELLS, "mean"), atol=1e-6)
    assert "mean-pooled" in diff.layout.title.text
    path = compare_section.both_arrays("generate", long_tab.compare_view, a, b)
    with zipfile.ZipFile(path) as archive:
        assert all(info.compress_type == zipfile.ZIP_DEFLATED for info in archive.infolist())
    with np.load(path) as arrays:
        assert arrays["attention_a"].dtype == np.float16 and arrays["attention_b"].shape[-1] == len(b["result"].tokens)


# ------------------------------------------------------------------------- the long-context views (issue 69)
def test_the_long_context_views_are_the_stores_exact_numbers(long_tab, long_run, monkeypatch) -> None:
    """Statistics of every head equal models.analysis on the exact map; an exact row and its strongest keys; a click
    on a tile zooms into the tiles around it and opens its query's row; the views that run the whole model again
    refuse in words above MAX_FULL_TOKENS; a short result gets the long views' refusal."""
    from models import analysis

    state = long_run[6]
    full = exact(state)
    t = full.shape[-1]
    for label, (key, _unit) in long_tab.LONG_STATS.items():
        fig = long_tab.long_stats(state, label)
        z = np.asarray(fig.data[0].z, dtype=np.float64)
        want = {"sink": analysis.first_token_share(full), "entropy": analysis.head_entropy(full) / np.log(2),
                "distance": analysis.mean_attention_distance(full)}.get(key)
        if want is not None:
            np.testing.assert_allclose(z, want, rtol=1e-4, atol=1e-5)
        assert f"over {t:,} tokens" in fig.layout.title.text
    fig, table = long_tab.attention_row(state, 1, "2", 1500)
    np.testing.assert_allclose(np.asarray(fig.data[0].y, dtype=np.float32), full[1, 2, 1500], atol=1e-7)
    top = np.argsort(-full[1, 2, 1500])[:3]
    assert all(f"| {j:,} |" in table for j in top) and "strongest keys of query 1,500" in table
    with pytest.raises(gr.Error, match="pick a head"):
        long_tab.attention_row(state, 1, "mean", 10)
    with pytest.raises(gr.Error, match="query position"):
        long_tab.attention_row(state, 1, "0", t + 5)
    q0, q1, k0, k1, zoomed, query, row_fig, _ = long_tab.long_click(state, "1200,400,1", 1, "3", "max")
    assert (q0, q1, k0, k1, query) == (1184, 1215, 384, 415, 1200)  # 8 × 8 tiles of 4 tokens around the click
    np.testing.assert_allclose(np.asarray(zoomed.data[0].z), full[1, 3, q0:q1 + 1, k0:k1 + 1], atol=1e-7)
    np.testing.assert_allclose(np.asarray(row_fig.data[0].y, dtype=np.float32), full[1, 3, 1200], atol=1e-7)
    monkeypatch.setattr(limits, "MAX_FULL_TOKENS", 1000)
    for call in (lambda: long_tab.logit_lens(state), lambda: long_tab.ablate_head_fn(state, 0, 0, 0)):
        with pytest.raises(gr.Error, match="reads at most 1,000 tokens; this one has 2,048"):
            call()
    short = long_tab.generate("A short prompt", 2, "long-llama", progress=None)[6]
    with pytest.raises(gr.Error, match="generate from a longer text"):
        long_tab.long_stats(short, "sink share")
    assert long_tab.long_click(short, "1,0,1", 0, "0") == (gr.skip(),) * 8


def test_a_long_reading_stops_when_asked_and_an_oversized_one_is_refused(long_tab, monkeypatch) -> None:
    """"Stop reading" between the prompt's chunks: the run ends with a notice and keeps nothing; a text whose store
    would not fit in the server's memory is refused in words before it starts."""
    from bench._long_model import long_prompt
    from models.decoding import ondevice
    from serving import runs

    monkeypatch.setattr(ondevice, "PREFILL_TOKENS", 256)
    real = runs.reading

    class Request:
        session_hash = "s1"

    def reading(session):  # the session presses "Stop reading" as soon as its run has started
        ctx = real(session)
        flag = ctx.__enter__()
        assert runs.stop("s1") and flag.is_set()
        return _Entered(ctx, flag)

    class _Entered:
        def __init__(self, ctx, flag):
            self.ctx, self.flag = ctx, flag

        def __enter__(self):
            return self.flag

        def __exit__(self, *exc):
            return self.ctx.__exit__(*exc)

    monkeypatch.setattr(runs, "reading", reading)
    with pytest.raises(gr.Error, match="Stopped: stopped after 0 of 2,047 prompt tokens; its memory is freed"):
        long_tab.generate(long_prompt(), 1, "long-llama", progress=None, request=Request())
    monkeypatch.setattr(runs, "reading", real)
    assert not runs.stop("s1")  # nothing runs for the session any more
    monkeypatch.setenv("ATLAS_MEMORY_MB", "1")
    with pytest.raises(gr.Error, match="would keep about .* GB of queries and keys"):
        long_tab.generate(long_prompt(), 1, "long-llama", progress=None)


def test_the_needle_search_and_its_ablation(long_tab) -> None:
    """Retrieval heads in Generate: the haystack read into the store, the answer and its verdict, every head's score
    (equal to models.inspect.retrieval's on the same run), the top-k and k random heads switched off; refusals."""
    from models.inspect import retrieval

    note, grid, state = long_tab.needle_search("long-llama", 1024, 0.3, progress=None)
    hay = state["hay"]
    assert 900 < len(hay.ids) <= 1024 and f"{len(hay.ids):,} tokens" in note and "tangerine-4817" in note
    assert ("**found**" in note) or ("**not found**" in note)
    z = np.asarray(grid.data[0].z, dtype=np.float32)
    assert z.shape == (2, 4) and np.array_equal(z, state["scores"]) and ((0 <= z) & (z <= 1)).all()
    assert "Retrieval score per head" in grid.layout.title.text
    table = long_tab.needle_ablate_fn(state, 3)
    assert table.count("\n| ") == 5 and "the top 3 retrieval heads" in table and "3 random heads" in table
    top = [f"L{l_}H{h_}" for l_, h_, _ in retrieval.ranking(state["scores"])[:3]]
    assert all(h in table for h in top)
    with pytest.raises(gr.Error, match="Search a haystack first"):
        long_tab.needle_ablate_fn(None, 3)
    with pytest.raises(gr.Error, match="at most 2,024"):
        long_tab.needle_search("long-llama", 4096, 0.5, progress=None)
    with pytest.raises(gr.Error, match="Choose a haystack length"):
        long_tab.needle_search("long-llama", 999, 0.5, progress=None)
