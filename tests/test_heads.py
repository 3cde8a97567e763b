"""The head atlas: each metric on constructed attention with a known answer, the streaming accumulator against the
whole corpus at once, every family's runner on tiny random checkpoints against the plain per-sentence path and
the score split, the cache, and a user's corpus checks (models/inspect/heads.py, atlas.py, serving/heads.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from models.analysis import head_roles, mean_attention_distance, patch_distances
from models.inspect import heads as hm


def uniform_causal(t: int, layers: int = 1, heads: int = 1) -> np.ndarray:
    w = np.tril(np.ones((t, t), np.float32))
    w /= w.sum(-1, keepdims=True)
    return np.broadcast_to(w, (layers, heads, t, t)).copy()


def previous_pattern(t: int) -> np.ndarray:
    w = np.zeros((1, 1, t, t), np.float32)
    w[0, 0, 0, 0] = 1
    w[0, 0, np.arange(1, t), np.arange(t - 1)] = 1
    return w


# ------------------------------------------------------------------------------------------- known answers
def test_previous_token_pattern_scores_one_and_uniform_its_known_value() -> None:
    t = 9
    score, n = hm.query_mean(hm.previous_token(previous_pattern(t)))
    assert score[0, 0] == pytest.approx(1.0) and n == t - 1
    uniform, _ = hm.query_mean(hm.previous_token(uniform_causal(t)))
    assert uniform[0, 0] == pytest.approx(np.mean([1 / (i + 1) for i in range(1, t)]), rel=1e-6)
    # the sink of a uniform causal head is the same 1/(i + 1); of a previous-token head 0 (query 1 aside: 1)
    sink, _ = hm.query_mean(hm.to_keys(uniform_causal(t), [0], skip_first=True))
    assert sink[0, 0] == pytest.approx(np.mean([1 / (i + 1) for i in range(1, t)]), rel=1e-6)
    assert hm.query_mean(hm.to_keys(previous_pattern(t), [0], skip_first=True))[0][0, 0] == pytest.approx(1 / (t - 1))


def test_entropy_and_distance_of_uniform_and_focused_heads() -> None:
    t = 7
    ent = hm.entropy(uniform_causal(t))[0, 0]
    np.testing.assert_allclose(ent, [math.log(i + 1) for i in range(t)], rtol=1e-5, atol=1e-6)
    dist = hm.attention_distance(uniform_causal(t))[0, 0]
    np.testing.assert_allclose(dist, [i / 2 for i in range(t)], rtol=1e-5)
    eye = np.eye(t, dtype=np.float32)[None, None]
    assert np.all(hm.entropy(eye) == 0) and np.all(hm.attention_distance(eye) == 0)
    assert np.isnan(hm.entropy(eye, skip_first=True)[0, 0, 0])
    # the previous-token head looks one token back at every query after the first
    assert hm.query_mean(hm.attention_distance(previous_pattern(t), skip_first=True))[0][0, 0] == pytest.approx(1)


def test_next_first_last_and_punctuation_of_an_encoder() -> None:
    t = 5
    nxt = np.zeros((1, 2, t, t), np.float32)
    nxt[..., np.arange(t - 1), np.arange(1, t)] = 1
    nxt[..., t - 1, t - 1] = 1
    assert np.allclose(hm.query_mean(hm.next_token(nxt))[0], 1)
    assert np.allclose(hm.query_mean(hm.previous_token(nxt))[0], 0)
    uniform = np.full((1, 1, t, t), 1 / t, np.float32)
    assert hm.query_mean(hm.to_keys(uniform, [0]))[0][0, 0] == pytest.approx(1 / t)
    assert hm.query_mean(hm.to_keys(uniform, [t - 1]))[0][0, 0] == pytest.approx(1 / t)
    tokens = ["[CLS]", "▁hello", ",", "##!", "[SEP]"]
    punct = np.array([hm.is_punctuation(x) for x in tokens])
    assert punct.tolist() == [False, False, True, True, False]
    assert hm.query_mean(hm.to_keys(uniform, punct))[0][0, 0] == pytest.approx(2 / t)


def test_duplicate_token_on_text() -> None:
    ids = [5, 7, 5, 9, 7, 5]
    t = len(ids)
    w = np.zeros((1, 1, t, t), np.float32)
    w[0, 0, np.arange(t), np.arange(t)] = 1
    w[0, 0, 2] = 0
    w[0, 0, 2, 0] = 1  # the second 5 looks at the first
    w[0, 0, 5] = 0
    w[0, 0, 5, [0, 2]] = 0.25  # the third 5 puts half its weight on earlier 5s
    w[0, 0, 5, 5] = 0.5
    values = hm.duplicate_token(w, ids)[0, 0]
    assert np.isnan(values[[0, 1, 3]]).all()  # first occurrences have no earlier copy
    np.testing.assert_allclose(values[[2, 4, 5]], [1.0, 0.0, 0.5])


def test_diagonality_and_coverage_of_cross_attention() -> None:
    t = s = 6
    eye = np.eye(t, dtype=np.float32)[None, None]
    assert np.allclose(hm.diagonality(eye), 1) and hm.coverage(eye)[0, 0] == 1
    # a target twice as long, each pair of targets on one source token: still on the scaled diagonal
    stretch = np.zeros((1, 1, 2 * s, s), np.float32)
    stretch[0, 0, np.arange(2 * s), np.arange(2 * s) // 2] = 1
    assert hm.query_mean(hm.diagonality(stretch))[0][0, 0] == pytest.approx(1)
    uniform = np.full((1, 1, t, s), 1 / s, np.float32)
    band = hm.diagonality(uniform, band=1)[0, 0]
    assert band[0] == pytest.approx(2 / s) and band[2] == pytest.approx(3 / s)
    first = np.zeros((1, 1, t, s), np.float32)
    first[..., 0] = 1  # every target on the first source token
    assert hm.coverage(first)[0, 0] == pytest.approx(1 / s)
    reverse = eye[..., ::-1].copy()  # a reversed alignment covers the source but is not diagonal
    assert hm.coverage(reverse)[0, 0] == 1 and hm.query_mean(hm.diagonality(reverse))[0][0, 0] < 0.5


def test_offsets_of_a_previous_token_head() -> None:
    sums, counts = hm.offset_sums(previous_pattern(6), 3)
    profile = sums[0, 0] / counts
    assert profile[3 + 1] == pytest.approx(1) and profile[3] == pytest.approx(1 / 6)  # offset 0: query 0 only
    assert profile[3 + 2] == 0 and profile[0] == 0


def test_pixel_distance_matches_the_vit_reference() -> None:
    rng = np.random.default_rng(0)
    w = rng.random((2, 3, 17, 17)).astype(np.float32)
    w /= w.sum(-1, keepdims=True)
    ref = mean_attention_distance(w, grid=(4, 4), patch=7, skip=1)
    patches = w[..., 1:, 1:] / w[..., 1:, 1:].sum(-1, keepdims=True)
    ours = hm.query_mean(hm.attention_distance(patches, patch_distances((4, 4), 7)))[0]
    np.testing.assert_allclose(ours, ref, rtol=1e-5)


def test_accumulator_streams_to_the_corpus_mean_and_keeps_the_best_examples() -> None:
    rng = np.random.default_rng(1)
    maps = []
    for t in (4, 9, 6):
        w = np.tril(rng.random((2, 3, t, t))).astype(np.float32)
        maps.append(w / w.sum(-1, keepdims=True))
    acc = hm.HeadAccumulator(top_k=2)
    for k, w in enumerate(maps):
        acc.add("previous", hm.previous_token(w), k)
    every = np.concatenate([hm.previous_token(w)[..., 1:] for w in maps], -1)  # all queries of the corpus at once
    np.testing.assert_allclose(acc.result()["previous"], every.mean(-1), rtol=1e-5)
    per_sentence = np.stack([hm.query_mean(hm.previous_token(w))[0] for w in maps], -1)  # (L, H, 3)
    np.testing.assert_array_equal(acc.top_index["previous"], np.argsort(-per_sentence, -1)[..., :2])
    # NaN heads (a Swin block with fewer heads) count nowhere
    acc.add("distance", np.array([[1.0, np.nan], [2.0, 3.0]], np.float32), weight=2)
    acc.add("distance", np.array([[3.0, np.nan], [2.0, 5.0]], np.float32), weight=2)
    res = acc.result()["distance"]
    assert res[0, 0] == 2 and np.isnan(res[0, 1]) and res[1, 1] == 4


def test_per_query_scores_average_to_the_analysis_scores() -> None:
    """The per-query values the accumulator streams average, over one sequence, to analysis.py's head scores."""
    from models.analysis import first_token_share, head_entropy, previous_token_score

    rng = np.random.default_rng(2)
    w = np.tril(rng.random((3, 2, 11, 11))).astype(np.float32)
    w /= w.sum(-1, keepdims=True)
    np.testing.assert_allclose(hm.query_mean(hm.previous_token(w))[0], previous_token_score(w), rtol=1e-5)
    np.testing.assert_allclose(hm.query_mean(hm.to_keys(w, [0], skip_first=True))[0], first_token_share(w), rtol=1e-5)
    np.testing.assert_allclose(hm.query_mean(hm.entropy(w))[0], head_entropy(w), rtol=1e-5)
    np.testing.assert_allclose(hm.query_mean(hm.attention_distance(w))[0], mean_attention_distance(w), rtol=1e-5)


def test_rank_heads_best_first_nan_last() -> None:
    grid = np.array([[0.1, np.nan], [0.9, 0.5]], np.float32)
    ranked = hm.rank_heads(grid)
    assert [(la, h) for la, h, _ in ranked] == [(1, 0), (1, 1), (0, 0), (0, 1)]


# ------------------------------------------------------------------------------------------------ runners
@pytest.fixture(scope="module")
def tiny(tiny_checkpoints: Path):
    import models

    return lambda name: models.load(tiny_checkpoints / name)


SENTENCES = ["The cat sat on the mat.", "A dog barked.", "We walked along the river until the light faded away.",
             "Rain again, and again, and again."]


def test_decoder_atlas_equals_the_plain_path_sentence_by_sentence(tiny) -> None:
    """Batched with right padding, the corpus scores equal each sentence run alone (token_losses), and induction
    and duplicate token equal GPT.head_role_scores over the same seeds."""
    from models.inspect.atlas import REPEAT_N, REPEAT_SEEDS, run_atlas, user_corpus

    model = tiny("gpt-tiny")
    atlas = run_atlas(model, user_corpus("\n".join(SENTENCES)), "tiny", batch=3)
    acc = hm.HeadAccumulator()
    for k, text in enumerate(SENTENCES):
        w = model.token_losses(model.encode_prompt(text)[0])[1]
        acc.add("previous", hm.previous_token(w), k)
        acc.add("entropy", hm.entropy(w, skip_first=True), k)
        acc.add("sink", hm.to_keys(w, [0], skip_first=True), k)
        acc.add("duplicate_text", hm.duplicate_token(w, model.encode_prompt(text)[0]), k)
    for name, ref in acc.result().items():
        np.testing.assert_allclose(atlas.metrics[name], ref, atol=2e-5, err_msg=name)
    np.testing.assert_array_equal(atlas.top["previous"], acc.top_index["previous"])
    n = min(REPEAT_N, (model.context_limit() - 1) // 2)
    roles = model.head_role_scores(n, seeds=range(REPEAT_SEEDS))
    np.testing.assert_allclose(atlas.metrics["induction"], roles["induction"], atol=2e-5)
    np.testing.assert_allclose(atlas.metrics["duplicate"], roles["duplicate"], atol=2e-5)
    assert len(atlas.writes) == model.config.n_layers and len(atlas.writes[0]) == model.config.n_heads
    assert atlas.offsets.shape == (2, 4, 33)


@pytest.mark.parametrize("name", ["gpt-tiny", "sst2"])
def test_position_share_agrees_with_the_score_split(tiny, name: str) -> None:
    """The atlas's share of position in a head's strongest score, against decompose_score of that one cell: terms
    with the ``position`` part (learned positions), or the rotation's change of the score (RoPE)."""
    from models.inputs.tokenizer import encode_input
    from models.inspect import atlas as at
    from models.inspect.decompose import decompose_score

    model = tiny(name)
    model.eval()
    text = SENTENCES[2]
    ids = model.encode_prompt(text)[0] if name == "gpt-tiny" else encode_input(model.tokenizer, text, 64)[0]
    acc = hm.HeadAccumulator()
    at._position_share(model, [ids], acc)
    share = acc.result()["position_share"]
    layer, head, query = 1, 2, len(ids) - 1
    w = model.token_losses(ids)[1] if name == "gpt-tiny" else model.classify(text).attention["encoder"].weights
    key = int(np.argmax(w[layer, head, query]))
    d = decompose_score(model, ids, layer, head, query, key)
    if d.content is not None:
        expected = abs(d.score - d.content) / (abs(d.score - d.content) + abs(d.content))
    else:
        t = np.abs(d.table)
        p = d.parts.index("position")
        expected = (t[p].sum() + t[:, p].sum() - t[p, p]) / t.sum()
    # the atlas averages over every query; recompute for the last query alone through the same function
    from models.inspect.decompose import _walk
    from models.inspect.walk import plan

    for i, attn, inp, _, weights in _walk(plan(model, ids), list(range(len(ids)))):
        if i == layer:
            one = at._layer_position_share(attn, inp, weights, len(ids))[head, query]
    assert one == pytest.approx(expected, rel=1e-6, abs=1e-9)
    assert np.isfinite(share).all() and (share >= 0).all() and (share <= 1).all()


EXPECTED = {
    "gpt-tiny": {"previous", "induction", "duplicate", "duplicate_text", "sink", "entropy", "distance",
                 "position_share"},
    "mamba-tiny": {"previous", "induction", "duplicate", "duplicate_text", "sink", "entropy", "distance"},
    "sst2": {"first", "last", "punctuation", "next", "previous", "entropy", "distance", "duplicate_text",
             "position_share"},
    "minilm-sst2": {"first", "last", "punctuation", "next", "previous", "entropy", "distance", "duplicate_text",
                    "position_share"},
    "translator-en-de": {"diagonality", "coverage", "entropy", "previous", "next", "last", "punctuation"},
    "vit-fashion": {"pixel_distance", "cls", "entropy"},
    "swin-fashion": {"pixel_distance", "entropy"},
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_every_family_has_its_grid(tiny, name: str) -> None:
    from models.inspect.atlas import builtin_corpus, example_map, modality, run_atlas

    model = tiny(name)
    corpus = builtin_corpus(modality(model))
    if corpus.kind != "images":  # a short corpus keeps the test quick; the runner is the same
        corpus = type(corpus)(corpus.kind, corpus.items[:6], "six", "d")
    atlas = run_atlas(model, corpus, name)
    assert set(atlas.metrics) == EXPECTED[name]
    for metric, grid in atlas.metrics.items():
        assert grid.ndim == 2 and np.isfinite(grid).any(), metric
        if metric in ("previous", "next", "sink", "first", "last", "cls", "diagonality", "coverage"):
            finite = grid[np.isfinite(grid)]
            assert (finite >= -1e-6).all() and (finite <= 1 + 1e-6).all(), metric
    if name == "swin-fashion":  # blocks of 2 and 4 heads: the first stage's missing heads are empty
        assert atlas.metrics["pixel_distance"].shape == (4, 4)
        assert np.isnan(atlas.metrics["pixel_distance"][:2, 2:]).all()
        assert np.isfinite(atlas.metrics["pixel_distance"][2:]).all()
    ex = example_map(model, atlas.examples[int(atlas.top[next(iter(atlas.metrics))][0, 0, 0])], 0)
    assert ex.weights.ndim == 3 and ex.weights.shape[1:] == (len(ex.queries), len(ex.keys))
    np.testing.assert_allclose(ex.weights.sum(-1), 1, atol=1e-4)


def test_vit_pixel_distance_is_the_analysis_reference(tiny) -> None:
    from models.inspect.atlas import _images, builtin_corpus, run_atlas

    model = tiny("vit-fashion")
    corpus = builtin_corpus("images")
    atlas = run_atlas(model, corpus)
    ref = []
    for _, image in _images(corpus):
        r = model.classify(image)
        ref.append(mean_attention_distance(r.attention["encoder"].weights, r.grid, r.patch, r.prefix_tokens))
    np.testing.assert_allclose(atlas.metrics["pixel_distance"], np.mean(ref, 0), rtol=1e-4)


def test_a_family_the_atlas_does_not_know_is_refused() -> None:
    from models.inspect.atlas import builtin_corpus, run_atlas

    with pytest.raises(TypeError, match="not a registered model family"):
        run_atlas(object(), builtin_corpus("text"))


# -------------------------------------------------------------------------------------------- corpus, cache
@pytest.mark.parametrize(("text", "message"), [
    ("", "empty"), ("\n \n", "empty"), ("a\n" * 2001, "2001 lines"), ("x" * 600, "Line 1 has 600"),
    ("fine\nbad \x01 line", "Line 2 holds a control character"), ("é" * 200_000, "larger than"),
])
def test_user_corpus_refused_in_words(text: str, message: str) -> None:
    from models.inspect.atlas import user_corpus

    with pytest.raises(ValueError, match=message):
        user_corpus(text)


def test_user_corpus_digest_follows_the_text() -> None:
    from models.inspect.atlas import builtin_corpus, user_corpus

    a, b = user_corpus("one\ntwo\n"), user_corpus("one\r\n\r\ntwo")
    assert a.items == ("one", "two") and a.digest == b.digest
    assert user_corpus("one\nthree").digest != a.digest
    assert len(builtin_corpus("text").items) >= 200 and len(builtin_corpus("translate").items) >= 50


def test_atlas_cache_round_trip(tiny, tmp_path: Path) -> None:
    from models.inspect.atlas import Atlas, cached_atlas, run_atlas, user_corpus

    model = tiny("gpt-tiny")
    corpus = user_corpus("\n".join(SENTENCES))
    first, was = cached_atlas("tiny", corpus, "w1", tmp_path, lambda: run_atlas(model, corpus, "tiny"))
    assert not was

    def fail() -> Atlas:
        raise AssertionError("computed again")

    again, was = cached_atlas("tiny", corpus, "w1", tmp_path, fail)
    assert was and list(again.metrics) == list(first.metrics)
    for k in first.metrics:
        np.testing.assert_array_equal(again.metrics[k], first.metrics[k])
        np.testing.assert_array_equal(again.top[k], first.top[k])
    np.testing.assert_array_equal(again.offsets, first.offsets)
    assert again.writes == first.writes and again.examples == list(corpus.items)
    with pytest.raises(AssertionError, match="computed again"):  # other weights, same corpus: computed
        cached_atlas("tiny", corpus, "w2", tmp_path, fail)


def test_serving_atlas_by_name_cached_on_disk(tiny_checkpoints: Path, tmp_path: Path, monkeypatch) -> None:
    from serving import catalogue
    from serving import heads as sh

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setenv("ATLAS_CACHE", str(tmp_path))
    sh._kept.clear()
    with pytest.raises(sh.AtlasRefused, match="No model is called 'no-such-model'"):
        sh.atlas("no-such-model")
    with pytest.raises(sh.AtlasRefused, match="empty"):
        sh.atlas("sst2", " \n ")
    atlas, cached = sh.atlas("sst2", "one line\nanother line")
    assert not cached and atlas.model == "sst2" and any(tmp_path.glob("*.safetensors"))
    sh._kept.clear()  # a new process: from the disk, without loading the model
    monkeypatch.setattr(sh.store, "get_model", lambda *a: (_ for _ in ()).throw(AssertionError("loaded")))
    again, cached = sh.atlas("sst2", "one line\nanother line")
    assert cached and np.array_equal(again.metrics["first"], atlas.metrics["first"], equal_nan=True)


def test_head_roles_reused_not_duplicated() -> None:
    """Induction and duplicate token come from analysis.head_roles (one definition): a constructed induction
    pattern scores 1 through it."""
    n = 5
    t = 2 * n + 1
    w = np.zeros((1, 1, t, t), np.float32)
    w[0, 0, np.arange(t), np.arange(t)] = 1
    for i in range(n + 1, t):
        w[0, 0, i] = 0
        w[0, 0, i, i - n + 1] = 1
    assert head_roles(w, n)["induction"][0, 0] == pytest.approx(1)


def test_a_metric_change_computes_nothing_before_a_grid_is_drawn(monkeypatch) -> None:
    """The metric dropdown redraws from the atlas drawn last, in the figures' pool; with no grid of that model drawn
    it leaves the figures as they are instead of scoring the model there."""
    import gradio as gr

    from tabs import heads as tab

    monkeypatch.setattr(tab.atlas_store, "atlas", lambda *a, **k: (_ for _ in ()).throw(AssertionError("computed")))
    for state in (None, {"model": "sst2", "layers": 2, "heads": 4}):
        out = tab.redraw("gpt-tiny", "induction", None, state)
        assert len(out) == 3 and all(x == gr.skip() for x in out)


def test_metric_titles_name_the_unit_once() -> None:
    """The Heads tab's axis and colour-bar titles read "mean attention distance in pixels (pixels)" and "[CLS] share
    (share)"; a label that says its unit now stands alone, and every other label gets its unit in brackets."""
    from models.inspect.atlas import METRICS
    from viz import heads as vh

    grid = np.arange(6, dtype=np.float32).reshape(2, 3) / 6
    for label, _, unit in METRICS.values():
        figures = [vh.head_grid(grid, label, unit), vh.head_ranking([(0, 1, 0.5), (1, 2, 0.25)], label, unit),
                   vh.by_layer(grid, label, unit)]
        axis_titles = [figures[0].data[0].colorbar.title.text, figures[1].layout.xaxis.title.text,
                       figures[2].layout.yaxis.title.text]
        for text in axis_titles:
            assert text.count(unit) == 1, text
            assert text == (label if unit in label else f"{label} ({unit})")


def test_the_card_starts_on_the_top_head_and_a_click_opens_one(tiny_checkpoints: Path, tmp_path: Path,
                                                               monkeypatch) -> None:
    """Issue 75, item 5: after scoring, the card's sliders stand on the head the finder ranks first (they stayed on
    layer 0, head 0); a click on a grid cell or a finder bar ("layer,head,click number" from the page's script) sets
    them to that head, whose change draws its card; the finder's bars carry their (layer, head)."""
    import gradio as gr

    from serving import catalogue, store
    from serving import heads as sh
    from tabs import heads as tab

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    monkeypatch.setenv("ATLAS_CACHE", str(tmp_path))
    sh._kept.clear()
    for metric in ("previous", "induction", "entropy"):
        grid, ranked, _, _, _, layer, head, state = tab.heads_grid("gpt-tiny", metric, None)
        z = np.array(grid.data[0].z, dtype=float)
        best = np.unravel_index(np.nanargmax(z), z.shape)
        assert (layer["value"], head["value"]) == (int(best[0]), int(best[1])), metric
        bars = ranked.data[0]
        for (lh, name) in zip(bars.customdata, bars.y):
            assert name == f"L{lh[0]} H{lh[1]}"
    assert tab.open_head("1,3,7", state) == (gr.update(value=1), gr.update(value=3))
    for bad, kept in (("1,3,7", None), ("2,0,1", state), ("0,4,1", state), ("x,1,1", state), ("", state)):
        assert tab.open_head(bad, kept) == (gr.skip(), gr.skip()), bad
