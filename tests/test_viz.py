"""viz/: figures carry the shapes and labels of their input, pooling keeps block maxima, labels and HTML
are escaped, viz stays pure (no torch / gradio / models)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import viz
from viz.common import max_pool, shorten, tile, unique_labels


def softmax_attention(shape, seed=0, temp=3.0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * temp
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


TOKENS = ["<s>", "▁the", "▁cat", "▁sat", "▁the", "▁supercalifragilistic", "<script>alert(1)</script>", "</s>"]


def test_heatmap_shapes_labels_and_look():
    w = softmax_attention((2, 3, 8, 8))
    fig = viz.attention_heatmap(w, TOKENS, layer=1, head=2, kind="Encoder self-attention")
    hm = fig.data[0]
    assert np.asarray(hm.z).shape == (8, 8)
    np.testing.assert_allclose(np.asarray(hm.z), w[1, 2], rtol=1e-6)
    assert list(hm.x) == unique_labels(TOKENS) and list(hm.y) == unique_labels(TOKENS)
    assert len(set(hm.x)) == 8  # the repeated "▁the" stays two categories
    assert (hm.zmin, hm.zmax) == (0.0, 1.0)
    assert hm.colorbar.title.text == "attention weight"
    assert "→" in hm.hovertemplate
    assert fig.layout.yaxis.autorange == "reversed"
    assert fig.layout.title.text == "Encoder self-attention · layer 1 · head 2"
    ticks = list(fig.layout.xaxis.ticktext)
    assert "▁supercalif…" in ticks  # shortened on the axis, full in the hover category
    assert any("▁supercalifragilistic" in c for c in hm.x)


def test_heatmap_fusion_autoscale_and_cross_shapes():
    w = softmax_attention((4, 5, 7))
    fig = viz.attention_heatmap(w, TOKENS[:5], TOKENS[:7], head="max", autoscale=True)
    np.testing.assert_allclose(np.asarray(fig.data[0].z), w.max(0), rtol=1e-6)
    assert fig.data[0].zmax == pytest.approx(float(w.max(0).max()))
    fig = viz.cross_alignment(w[None], TOKENS[:5], TOKENS[:7], layer=0, head="mean")
    np.testing.assert_allclose(np.asarray(fig.data[0].z), w.mean(0), rtol=1e-6)
    assert len(fig.data[1].x) == 5  # one argmax marker per target token
    with pytest.raises(ValueError):
        viz.attention_heatmap(w, TOKENS[:4], TOKENS[:7], head=0)


def test_max_pool_keeps_block_maximum():
    rng = np.random.default_rng(1)
    a = rng.random((2, 3, 130, 197)).astype(np.float32)
    pooled, re, ce = max_pool(a, 64)
    assert pooled.shape[-2:] == (len(re) - 1, len(ce) - 1)
    assert pooled.shape[-1] <= 64 and pooled.shape[-2] <= 64
    for i in range(len(re) - 1):
        for j in range(0, len(ce) - 1, 7):
            block = a[..., re[i]:re[i + 1], ce[j]:ce[j + 1]]
            np.testing.assert_array_equal(pooled[..., i, j], block.max(axis=(-2, -1)))
    assert pooled.max() == a.max()
    same, _, _ = max_pool(a[..., :40, :40], 64)
    assert same.shape == (2, 3, 40, 40)


def test_tile_layout():
    blocks = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    t = tile(blocks, ncols=2, gap=1)
    assert t.shape == (3, 9)
    np.testing.assert_array_equal(t[:, :4], blocks[0])
    np.testing.assert_array_equal(t[:, 5:], blocks[1])
    assert np.isnan(t[:, 4]).all()


@pytest.mark.parametrize("n,pooled", [(40, False), (128, True)])
def test_model_view_thumbnails(n, pooled):
    L, H = 3, 4
    w = softmax_attention((L, H, n, n), seed=2)
    toks = [f"t{i}" for i in range(n)]
    fig = viz.model_view(w, toks, kind="Encoder self-attention")
    hm = fig.data[0]
    z = np.asarray(hm.z)
    assert z.dtype == np.uint8
    p, _, _ = max_pool(w, 64)
    q = p.shape[-1]
    gap = max(1, q // 8)
    assert z.shape == (L * (q + gap) - gap, H * (q + gap) - gap)
    assert len(hm.x) == z.shape[1] and len(hm.y) == z.shape[0] and len(set(hm.x)) == len(hm.x)
    for layer in range(L):
        for h in range(H):
            thumb = z[layer * (q + gap): layer * (q + gap) + q, h * (q + gap): h * (q + gap) + q]
            np.testing.assert_array_equal(thumb, np.rint(p[layer, h] * 100).astype(np.uint8))
    assert ("max-pooled" in fig.layout.title.text) == pooled
    assert list(fig.layout.xaxis.ticktext) == [f"H{h}" for h in range(H)]
    assert list(fig.layout.yaxis.ticktext) == [f"L{i}" for i in range(L)]
    assert "attention weight" in hm.colorbar.title.text


def test_model_view_cross_attention_pools_each_axis():
    w = softmax_attention((2, 2, 130, 20), seed=8)
    fig = viz.model_view(w, [f"q{i}" for i in range(130)], [f"k{i}" for i in range(20)], kind="Cross-attention")
    z = np.asarray(fig.data[0].z)
    p, _, _ = max_pool(w, 64)
    assert p.shape[-2:] == (44, 20)
    gap = max(1, 44 // 8)
    assert z.shape == (2 * (44 + gap) - gap, 2 * (20 + gap) - gap)
    np.testing.assert_array_equal(z[:44, :20], np.rint(p[0, 0] * 100).astype(np.uint8))
    assert "max-pooled 3×1" in fig.layout.title.text


def test_head_view_lines_and_threshold():
    w = softmax_attention((2, 3, 8, 8), seed=3)
    fig = viz.head_view(w, TOKENS, layer=1, threshold=0.1)
    for h in range(3):
        segs = sum(int(np.isnan(np.asarray(t.y, dtype=float)).sum()) for t in fig.data
                   if t.legendgroup == f"h{h}" and t.x is not None and len(t.x) > 1)
        assert segs == int((w[1, h] >= 0.1).sum())
    assert len(fig.data) <= 3 * (8 + 1) + 2  # grouped traces, not one per line
    capped = viz.head_view(w, TOKENS, layer=1, threshold=0.0, max_segments=20)
    n = sum(int(np.isnan(np.asarray(t.y, dtype=float)).sum()) for t in capped.data
            if t.x is not None and len(t.x) > 1)
    assert n == 20 and "strongest 20 of" in capped.layout.title.text


def test_head_view_cross_attention_columns():
    w = softmax_attention((4, 5, 7), seed=9)
    fig = viz.head_view(w, TOKENS[:5], TOKENS[:7], threshold=0.0, kind="Cross-attention")
    cols = [t for t in fig.data if t.mode == "markers+text"]
    assert [len(c.y) for c in cols] == [5, 7]
    assert list(cols[0].customdata) == unique_labels(TOKENS[:5])


def test_beam_tree_nodes_and_chosen():
    steps = [
        dict(tokens=["▁ein", "▁der"], parents=[-1, -1], scores=[-0.5, -0.9], finished=[False, False]),
        dict(tokens=["▁Hund", "</s>"], parents=[0, 1], scores=[-1.2, -1.0], finished=[False, True]),
        dict(tokens=["."], parents=[0], scores=[-1.3], finished=[False]),
    ]
    fig = viz.beam_tree(steps, chosen=[0, 0, 0])
    nodes = [t for t in fig.data if t.mode == "markers+text"][0]
    assert len(nodes.x) == 5
    assert list(nodes.marker.symbol).count("square") == 1
    assert sum("chosen" in h for h in nodes.hovertext) == 3
    assert "&lt;/s&gt;" in "".join(nodes.text)
    edges = fig.data[0]
    assert sum(v is None for v in edges.x) == 3  # three parent links


def test_beam_tree_takes_beamstep_objects():
    from models.outputs import BeamStep  # plain dataclasses + numpy, no torch

    steps = [BeamStep(["▁a", "▁b"], [-1, -1], [-0.1, -0.2], [False, False]),
             BeamStep(["</s>", "▁c"], [0, 1], [-0.3, -0.5], [True, False])]
    fig = viz.beam_tree(steps, [0, 0])
    assert len([t for t in fig.data if t.mode == "markers+text"][0].x) == 4


def test_token_highlight_escapes_html():
    html = viz.token_highlight(TOKENS + ["<img src=x onerror=alert(1)>"], np.linspace(0, 1, 9))
    assert "<script" not in html and "<img" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert html.count("<span title=") == 9


def test_plotly_labels_are_escaped():
    w = softmax_attention((1, 2, 8, 8))
    for fig in (viz.attention_heatmap(w, TOKENS, layer=0), viz.model_view(w, TOKENS),
                viz.head_view(w, TOKENS, layer=0)):
        text = fig.to_json()
        assert "<script>" not in text and "&lt;script&gt;" in text


def test_image_figures():
    rng = np.random.default_rng(4)
    img = (rng.random((224, 224, 3)) * 255).astype(np.uint8)
    cls = softmax_attention((197,), seed=5)
    fig = viz.image_attention(img, cls[1:], (14, 14))
    assert fig.data[0].type == "image" and fig.data[0].source.startswith("data:image/png;base64,")
    np.testing.assert_allclose(np.asarray(fig.data[1].z), cls[1:].reshape(14, 14), rtol=1e-6)
    assert fig.data[1].dx == 16
    fig = viz.query_patch_attention(img, cls[1:], (14, 14), (2, 5))
    assert len(fig.layout.shapes) == 1 and "r2c5" in fig.layout.title.text
    grey = (rng.random((28, 28)) * 255).astype(np.uint8)
    maps = softmax_attention((5, 16))
    fig = viz.image_attention_grid(grey, maps, (4, 4), ncols=2)
    z = np.asarray(fig.data[1].z)
    assert z.shape == (3 * (4 + 3) - 3, 2 * (4 + 1) - 1)  # 3 rows of panels, title gap of 3 cells
    np.testing.assert_allclose(z[7:11, 5:9], maps[3].reshape(4, 4), rtol=1e-6)
    assert [a.text for a in fig.layout.annotations] == [f"head {i}" for i in range(5)]
    fig = viz.topk_bars([f"class {i}" for i in range(10)], softmax_attention((10,)), k=3)
    assert len(fig.data[0].y) == 3 and fig.layout.yaxis.autorange == "reversed"


def test_stats_figures():
    w = softmax_attention((3, 4, 8, 8))
    shares, names = viz.token_shares(w, ["[CLS]", "a", "b", "c", "d", "e", "f", "[SEP]"])
    assert shares.shape == (3, 4, 4)
    np.testing.assert_allclose(shares[..., 0], w[..., 0].mean(-1), rtol=1e-6)
    np.testing.assert_allclose(shares[..., 2], np.mean([w[..., i, i - 1] for i in range(1, 8)], axis=0), rtol=1e-6)
    fig = viz.head_share_heatmap(shares, names)
    assert len(fig.data) == 4 and np.asarray(fig.data[0].z).shape == (3, 4)
    fig = viz.head_metric_scatter(np.random.default_rng(0).random((3, 4)) * 100)
    assert len(fig.data) == 4 and all(len(t.x) == 3 for t in fig.data)
    fig = viz.entropy_heatmap(np.ones((3, 4)))
    assert np.asarray(fig.data[0].z).shape == (3, 4)


def _sinusoid(P=32, D=16):
    pos, i = np.arange(P)[:, None], np.arange(0, D, 2)
    pe = np.zeros((P, D))
    pe[:, 0::2], pe[:, 1::2] = np.sin(pos / 10000 ** (i / D)), np.cos(pos / 10000 ** (i / D))
    return pe


def test_positional_figures():
    pe = _sinusoid()
    assert np.asarray(viz.sinusoidal_heatmap(pe).data[0].z).shape == (32, 16)
    assert len(viz.sinusoidal_curves(pe, [0, 3, 7]).data) == 3
    fig = viz.position_similarity(pe, "cosine")
    np.testing.assert_allclose(np.diag(np.asarray(fig.data[0].z)), 1.0, rtol=1e-5)
    ang = np.arange(10) * 0.4
    fig = viz.rope_rotation(np.stack([np.cos(ang), np.sin(ang)], 1))
    np.testing.assert_allclose(np.asarray(fig.data[1].customdata)[:5], np.degrees(ang[:5]), atol=1e-3)
    fig = viz.rope_offset_scores(np.random.default_rng(0).random((20, 20)), [0, 5])
    assert list(np.asarray(fig.data[1].x)[:3]) == [-5, -4, -3]
    fig = viz.learned_pe_grid(np.random.default_rng(0).standard_normal((16, 8)), (4, 4))
    assert np.asarray(fig.data[0].z).shape == (4 * 5 - 1, 4 * 5 - 1)
    fig = viz.relative_bias_tables(np.random.default_rng(0).standard_normal((3, 13, 13)))
    assert len(fig.layout.annotations) == 3


def _swin_region_mask(H, W, win, s):
    img = np.zeros((H, W), int)
    cnt = 0
    for hs in (slice(0, -win), slice(-win, -s), slice(-s, None)):
        for ws in (slice(0, -win), slice(-win, -s), slice(-s, None)):
            img[hs, ws] = cnt
            cnt += 1
    return img


def test_swin_window_attention_maps_back_with_shift():
    H = W = 8
    win, s = 4, 2
    w = softmax_attention((4, 2, 16, 16), seed=6)
    ids = np.arange(H * W).reshape(H, W)
    rolled = np.roll(ids, (-s, -s), (0, 1))
    windows = rolled.reshape(2, win, 2, win).transpose(0, 2, 1, 3).reshape(4, 16)  # token ids per window
    for q in [(7, 1), (0, 0), (3, 6)]:
        qid = q[0] * W + q[1]
        win_idx, n = map(int, np.argwhere(windows == qid)[0])
        fig = viz.window_attention_grid(w, (H, W), win, s, q, head=1)
        z = np.asarray(fig.data[0].z)
        expect = np.full(H * W, np.nan, np.float32)
        expect[windows[win_idx]] = w[win_idx, 1, n]
        np.testing.assert_array_equal(z.ravel(), expect)


def test_swin_window_map_with_padding():
    # a 4×4 grid in 7×7 windows: the model pads to 7×7, one window, attention to padding is left out
    w = softmax_attention((1, 2, 49, 49), seed=7)
    amap, info = viz.window_attention_map(w, (4, 4), 7, 0, (1, 2), head=1)
    n = 1 * 7 + 2
    np.testing.assert_allclose(amap, w[0, 1, n].reshape(7, 7)[:4, :4], rtol=1e-6)
    assert info["padding_share"] == pytest.approx(1 - w[0, 1, n].reshape(7, 7)[:4, :4].sum(), abs=1e-5)
    assert len(info["cells"]) == 16
    with pytest.raises(ValueError):
        viz.window_attention_map(w, (8, 8), 7, 0, (0, 0))


def test_swin_geometry_figures():
    H = W = 8
    win, s = 4, 2
    regions = _swin_region_mask(H, W, win, s)
    ids = np.arange(H * W).reshape(H, W)
    fig = viz.cyclic_shift(ids, np.roll(ids, (-s, -s), (0, 1)), regions, win)
    np.testing.assert_array_equal(np.asarray(fig.data[1].z), regions)
    fig = viz.window_partitions((H, W), win, s)
    assert np.asarray(fig.data[1].z).shape == (H, W)
    np.testing.assert_array_equal(viz.shifted_window_ids((H, W), win, 0), np.asarray(fig.data[0].z))
    mw = regions.reshape(2, win, 2, win).transpose(0, 2, 1, 3).reshape(4, 16)
    masks = np.where(mw[:, None, :] != mw[:, :, None], -100.0, 0.0)
    assert np.asarray(viz.window_mask(masks[3], win, 3).data[0].z).shape == (16, 16)
    fig = viz.all_window_masks(masks, 2)
    assert np.asarray(fig.data[0].z).shape == (2 * 18 - 2, 2 * 18 - 2)
    assert np.asarray(viz.region_map(regions, win).data[0].z).shape == (H, W)


def test_swin_geometry_figures_mark_padding():
    """A 9 × 9 grid in windows of 4 is drawn padded to 12 × 12: the window ids are those of the padded grid rolled as
    the model rolls it (mod 12, not 9), and exactly the 63 padding cells are labelled "pad" and greyed, before and
    after the roll, on the region map and in the window mask's labels."""
    from models.families.swin import shifted_window_regions, window_geometry

    H, win, s = 9, 4, 2
    ids = viz.shifted_window_ids((H, H), win, s)
    assert ids.shape == (12, 12)
    r, c = np.mgrid[0:12, 0:12]
    np.testing.assert_array_equal(ids, ((r - s) % 12 // win) * 3 + (c - s) % 12 // win)
    fig = viz.window_partitions((H, H), win, s)
    for trace in fig.data[:2]:
        text = np.asarray(trace.text)
        assert text.shape == (12, 12) and (text == "pad").sum() == 144 - 81 and text[8, 8] == str(8 * 9 + 8)
        assert (text[9:] == "pad").all() and (text[:, 9:] == "pad").all()
    assert len([sh for sh in fig.layout.shapes if sh.fillcolor]) == 2 and "padded to 12×12" in fig.layout.title.text
    geo = window_geometry(H, win, s)
    fig = viz.cyclic_shift(geo.ids, geo.rolled, geo.regions, win, padding=geo.padding)
    before, after = (np.asarray(t.text) for t in fig.data[:2])
    assert (before == "pad").sum() == (after == "pad").sum() == 63
    np.testing.assert_array_equal(after == "pad", np.roll(geo.padding, (-s, -s), (0, 1)))
    token = after[after != "pad"].astype(int)
    assert (token // 12 < H).all() and (token % 12 < H).all()  # every labelled cell after the roll is a token
    rolled = np.roll(geo.padding, (-s, -s), (0, 1))
    fig = viz.region_map(shifted_window_regions(12, 12, win, s).numpy(), win, padding=rolled)
    assert (np.asarray(fig.data[0].text) == "pad").sum() == 63 and "padding" in fig.layout.title.text
    last = geo.windows - 1
    fig = viz.window_mask(geo.masks[last], win, last, padding=geo.window_padding(last))
    labels = list(fig.data[0].x)
    assert sum(lab.endswith(" pad") for lab in labels) == int(geo.window_padding(last).sum()) > 0
    assert "padding" in fig.layout.title.text


def test_image_attention_grid_keeps_the_image_scale_past_its_edge():
    """A Swin stage whose odd grid was padded before merging reaches past the image (5 tokens of 8 pixels over 36):
    with ``patch`` the underlay keeps the image's scale and the cells past its edge lie over white."""
    image = np.full((36, 36), 10, dtype=np.uint8)
    maps = np.ones((2, 25), dtype=np.float32) / 25
    plain = viz.image_attention_grid(image, maps, (5, 5), max_side=40)
    scaled = viz.image_attention_grid(image, maps, (5, 5), max_side=40, patch=8)
    assert plain.data[0].source != scaled.data[0].source  # the underlay differs: white past pixel 36
    import base64
    import io

    from PIL import Image

    def underlay(fig):
        return np.asarray(Image.open(io.BytesIO(base64.b64decode(fig.data[0].source.split(",", 1)[1]))))

    a, b = underlay(plain), underlay(scaled)
    assert (a[:40, :40] == 10).all()  # stretched: all image
    assert (b[:36, :36] == 10).all() and (b[36:40, :40] == 255).all() and (b[:40, 36:40] == 255).all()


def test_figures_round_trip_to_json():
    fig = viz.model_view(softmax_attention((1, 2, 5, 5)), TOKENS[:5])
    json.loads(fig.to_json())


def test_viz_imports_neither_torch_nor_gradio_nor_models():
    code = ("import sys, viz, viz.attention, viz.text, viz.images, viz.stats, viz.positional, viz.swin\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'gradio', 'models', 'torchvision')]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(__import__("pathlib").Path(__file__).parents[1]))


def test_generation_highlight_escapes_marks_and_fades() -> None:
    from viz.generate import generation_highlight, shown_token

    tokens = ["<s>", "▁a", "<img", "▁src=x>", "▁world", "↵"]
    html = generation_highlight(tokens, np.array([np.nan, 1.0, 2.0, 8.0, 0.5, 3.0]), prompt_len=3, upto=5)
    assert "<img" not in html and "&lt;img" in html  # tokens are text, never markup
    assert html.count("border-bottom:3px solid") == 3 + 1  # the three generated tokens, and the legend
    assert html.count("opacity:0.3") == 1  # the token after the replayed step
    assert "8.00 bits (generated)" in html and "dark red 8.0 bits" in html
    assert shown_token("▁world") == " world" and shown_token("▁a") == " a" and shown_token("<s>") == "<s>"
    # labels arrive decoded (models.inputs.tokenizer.readable_piece): a Ġ is then a letter (Maltese "Ġużeppi")
    assert shown_token("Ġużeppi") == "Ġużeppi"


def test_step_candidates_outline_the_chosen_token() -> None:
    from viz.generate import step_candidates

    cands = [["a", "b", "c", "d", "e"], ["x", "y", "z", "u", "v"]]
    probs = np.array([[0.5, 0.2, 0.1, 0.1, 0.1], [0.4, 0.3, 0.1, 0.1, 0.1]])
    fig = step_candidates(cands, probs, ["a", "z"], step=2)
    z = np.array(fig.data[0].z, dtype=float)
    assert z.shape == (5, 2) and np.allclose(z[:, 0], probs[0])  # one column per step, top row most likely
    chosen = [s for s in fig.layout.shapes if s.line.color == "#d62728"]
    assert [(s.x0, s.y0) for s in chosen] == [(0.5, 0.5), (1.5, 2.5)]  # step 1 rank 1, step 2 rank 3


def test_step_candidates_of_many_steps_take_their_column() -> None:
    """Issue 75, item 4: the candidates of 20 generated tokens were 1,260 px wide (52 px a step + 220) in a 1,216 px
    column, and scrolled sideways. Up to 19 steps the figure keeps its 52 px a step; more take the column's width,
    their words shortened to what a step's share of the column holds (~6 px a character), none under 24 px."""
    from viz.generate import COLUMN_PX, step_candidates

    def fig_of(n):
        cands = [[f"candidate{s}{r}" for r in range(5)] for s in range(n)]
        return step_candidates(cands, np.full((n, 5), 0.2), [c[0] for c in cands])

    few, many, most = fig_of(19), fig_of(20), fig_of(60)
    assert few.layout.width == 52 * 19 + 220 <= COLUMN_PX and few.data[0].text[0][0] == shorten("candidate00", 8)
    assert many.layout.width is None and most.layout.width is None
    per_step = (COLUMN_PX - 220) / 20
    assert all(len(t) * 6 <= per_step for row in many.data[0].text for t in row)
    assert many.data[0].textfont.size == 9
    assert all(t == "" for row in most.data[0].text for t in row)  # 16 px a step: the hover names them


def test_legends_keep_off_the_tilted_labels():
    """Issue 48, item 10: the score split's and the "what changes" chart's legends lay over their tilted x labels
    (placed below the plot at y −0.08 and −0.35, where the labels are). Each legend now sits outside the band the
    x labels take: right of the plot area (x > 1) or above it (y ≥ 1, anchored at its bottom)."""
    from viz import why as vw

    tokens = [f"▁token{i}" for i in range(14)]
    for by_offset in (None, np.linspace(-1, 1, 14)):
        table = np.random.default_rng(0).standard_normal((5, 5))
        fig = vw.score_decomposition(table, ["bias", "tok", "pos", "L0H0", "L0 MLP"], np.zeros(14),
                                     np.full(14, 1 / 14), tokens, 13, 3, title="t", by_offset=by_offset,
                                     renormalised=np.full(14, 1 / 13))
        legend = fig.layout.legend
        assert legend.x is not None and legend.x > 1 and legend.xanchor == "left"
        colorbar = fig.data[0].colorbar
        assert legend.y <= colorbar.y - colorbar.len  # under the colour bar, not across it
    fig = vw.change_bars(tokens, np.ones(14), np.ones(14), title="t", unit="bits")
    assert fig.layout.legend.y >= 1 and fig.layout.legend.yanchor == "bottom"


def test_heatmaps_side_by_side_share_one_colour_range() -> None:
    """Lesson 9's figure: each map on its own axes with its own tokens, the values as given, one colour range (the
    largest weight of both, or the zmax asked for), one colour bar; mismatched inputs are refused."""
    from viz import attention as va

    a, b = softmax_attention((5, 5), seed=1), softmax_attention((3, 3), seed=2) * 0.5
    fig = va.heatmaps_side_by_side([a, b], [TOKENS[:5], TOKENS[:3]], ["A", "B"], title="both")
    first, second = fig.data
    assert (first.xaxis, second.xaxis) == ("x", "x2") and (first.yaxis, second.yaxis) == ("y", "y2")
    np.testing.assert_allclose(np.array(first.z, dtype=float), a, atol=1e-6)
    np.testing.assert_allclose(np.array(second.z, dtype=float), b, atol=1e-6)
    top = float(max(a.max(), b.max()))
    assert first.zmax == second.zmax == pytest.approx(top) and first.zmin == second.zmin == 0
    assert [first.showscale, second.showscale] == [False, True]
    assert len(first.x) == 5 and len(second.x) == 3  # each map its own keys
    assert va.heatmaps_side_by_side([a, b], [TOKENS[:5], TOKENS[:3]], ["A", "B"], title="t", zmax=0.3).data[0].zmax \
        == pytest.approx(0.3)
    with pytest.raises(ValueError, match="as many"):
        va.heatmaps_side_by_side([a, b], [TOKENS[:5]], ["A", "B"], title="t")


# ------------------------------------------------------------------------------------ phones (issue 61, item 6)
def _phone_checks(fig, width: int = 340) -> None:
    """A figure's phone layout is readable at a phone's width: every colour bar horizontal under the plot and no
    wider than it; no dense axis with more tick labels than fit one every PHONE_TICK_PX px; subplots at most two to
    a row, inside the figure and apart; the title's plain lines short enough for the width."""
    from viz.common import PHONE_TICK_PX, apply_phone, phone

    wide = fig.to_plotly_json()
    narrow = apply_phone(phone(fig))
    assert fig.to_plotly_json()["data"] == wide["data"]  # wider screens keep the figure as it was
    lay = narrow.layout
    assert lay.height and lay.margin.l <= 10 and lay.margin.r <= 10
    for t in narrow.data:
        bar = t.colorbar if t.type == "heatmap" else None
        if bar is not None and t.showscale is not False and t.type == "heatmap":
            assert bar.orientation == "h" and bar.yref == "container" and bar.len <= 0.8, t.name
            assert bar.y * lay.height < lay.margin.b  # within the bottom margin, under the plot
    axes = [k for k in lay.to_plotly_json() if k.startswith(("xaxis", "yaxis"))]
    domain = {a: tuple(lay[a].domain or (0, 1)) for a in axes}
    cols = {domain[a] for a in axes if a.startswith("x")}
    assert len(cols) <= 2
    for a in axes:
        axis = lay[a]
        length = (domain[a][1] - domain[a][0]) * (width if a.startswith("x") else lay.height)
        if axis.tickvals is not None:
            assert len(axis.tickvals) <= length / PHONE_TICK_PX + 3, a
        assert 0 <= domain[a][0] < domain[a][1] <= 1
    ys = sorted({domain[a] for a in axes if a.startswith("y")})
    assert all(a[1] <= b[0] for a, b in zip(ys, ys[1:], strict=False))  # rows do not overlap
    for line in (lay.title.text or "").split("<br>"):
        assert "<" in line or len(line) <= width / 7.5 + 1, line


def test_phone_layout_of_a_dense_map_and_of_subplots() -> None:
    """Issue 61, item 6: at 390 px the revealed figure was a postage stamp with overlapping labels and a colour bar
    wider than the map. A 61-token map keeps about one label every 12 px; eight subplots go two to a row."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from viz.attention import heatmap_fig
    from viz.common import apply_phone, phone

    rng = np.random.default_rng(0)
    w = rng.random((61, 61)).astype(np.float32)
    tokens = [f"tok{i}" for i in range(61)]
    fig = heatmap_fig(w / w.sum(-1, keepdims=True), tokens, tokens,
                      title="A long title that would be cut at the right edge of a phone screen").build()
    _phone_checks(fig)
    narrow = apply_phone(phone(fig))
    assert len(narrow.layout.xaxis.tickvals or []) < 61 or narrow.layout.xaxis.nticks
    assert "<br>" in narrow.layout.title.text
    grid = make_subplots(2, 4, subplot_titles=[f"step {i}" for i in range(8)])
    for i in range(8):
        grid.add_trace(go.Heatmap(z=rng.random((6, 6)), showscale=i in (3, 7), texttemplate="%{z:.2f}"),
                       row=1 + i // 4, col=1 + i % 4)
    grid.update_layout(height=700, title="Every step")
    _phone_checks(grid)
    narrow = apply_phone(phone(grid))
    titles = {a.text: (a.x, a.y) for a in narrow.layout.annotations}
    assert titles["step 0"][0] < 0.5 < titles["step 1"][0] and titles["step 2"][1] < titles["step 0"][1]
    assert all(t.textfont.size == 7 for t in narrow.data)  # 6 numbers in a cell a sixth of ~140 px: small type
    assert phone(None) is None


def test_phone_layout_of_every_lesson_figure() -> None:
    """The lessons' figures (those that draw without a trained model) keep their phone layout readable."""
    from tabs import lessons

    for number in (1, 2, 3):
        for step in range(1, len(lessons.LESSONS[number - 1].steps) + 1):
            q = lessons.question(number, step)
            _phone_checks(q.reveal(q.choices[0]))
            if q.before is not None:
                _phone_checks(q.before)


# ------------------------------------------------------------------------ phones and wide screens (issue 75, item 4)
def _tick_gap(fig, axis: str) -> float:
    """Pixels between two tick labels of a square-celled map's axis, on the plot its height was laid out for."""
    lay = fig.layout
    rows = len(fig.data[0].y if axis == "yaxis" else fig.data[0].x)
    plot = lay.height - 220  # the map's height less its title and labels (heatmap_fig: cell × rows + 220)
    return plot / rows * rows / len(lay[axis].tickvals)


def test_a_zoomed_long_block_takes_its_column_and_thins_its_labels() -> None:
    """The zoomed 401 × 401 block of a long input was 2,305 px wide (5 px a cell + 300) in a 1,192 px column, which
    scrolled sideways, with a label every 4th row. Now the figure has no width of its own (the column's), its plot is
    at most MAP_PX a side, and its labels stand at least LABEL_PX apart."""
    from viz.attention import LABEL_PX, MAP_PX

    n = 600
    w = softmax_attention((1, 1, n, n), seed=3)
    tokens = [f"t{i}" for i in range(n)]
    fig = viz.attention_zoom(w, tokens, rows=(0, 401), cols=(0, 401), layer=0, head=0)
    assert np.asarray(fig.data[0].z).shape == (401, 401)
    assert fig.layout.width is None
    assert fig.layout.height <= MAP_PX + 220 + 1
    for axis in ("xaxis", "yaxis"):
        assert _tick_gap(fig, axis) >= LABEL_PX, axis
        assert len(fig.layout[axis].tickvals) >= 401 * LABEL_PX / MAP_PX / 2  # thinned, not bare
    # a 128-token map (every label on 10 px cells, 1,580 px wide) fits a column too, its labels apart
    short = viz.attention_heatmap(w[0, 0, :128, :128] / w[0, 0, :128, :128].sum(-1, keepdims=True), tokens[:128])
    assert short.layout.width is None and _tick_gap(short, "yaxis") >= LABEL_PX
    # up to 64 tokens every token keeps its label
    small = viz.attention_heatmap(softmax_attention((64, 64)), tokens[:64])
    assert len(small.layout.yaxis.tickvals) == 64 and small.layout.width is None


def test_a_pooled_long_map_takes_its_column() -> None:
    """A 2,048-token map's 512 × 512 pooled tiles were 1,324 px wide (2 px a tile + 300) in a 1,216 px column at a
    1,400 px screen: it scrolled sideways. Now it takes the column's width, on a plot of at most MAP_PX."""
    from viz.attention import LABEL_PX, MAP_PX, TILE_CELLS

    n = 2048
    w = softmax_attention((n, n), seed=4)
    fig = viz.attention_heatmap(w, [f"w{i}" for i in range(n)])
    assert "pooled" in fig.layout.title.text and np.asarray(fig.data[0].z).shape == (TILE_CELLS, TILE_CELLS)
    assert fig.layout.width is None and fig.layout.height <= MAP_PX + 240 + 1
    side = fig.layout.height - 240
    assert side / len(fig.layout.yaxis.tickvals) >= 2 * LABEL_PX


@pytest.mark.parametrize("layers,heads,n", [(2, 4, 2048), (4, 8, 19), (12, 12, 600), (1, 1, 700)])
def test_the_model_views_subtitle_fits_its_width(layers, heads, n) -> None:
    """The model view of a long input on a 2 × 4-head model was 620 px wide with a 140-character subtitle on one line:
    cut at the figure's edge. Each subtitle line now fits the figure's width (<sup> type: ~6.5 px a character, the
    title's 2 % indent), and the top margin grows by a line for each further line."""
    from viz.common import fit_subtitle

    tokens = [f"w{i}" for i in range(n)]
    w = np.full((layers, heads, n, n), 1.0 / n, dtype=np.float16)  # rows summing to 1; only the shape matters here
    fig = viz.model_view(w, tokens)
    text = fig.layout.title.text
    sub = text[text.index("<sup>") + 5:text.index("</sup>")]
    lines = sub.split("<br>")
    assert all(len(line) * 6.5 + 0.02 * fig.layout.width <= fig.layout.width - 12 for line in lines), lines
    assert f"{n}×{n} tokens" in sub and sub.count("tokens") == 1  # nothing dropped
    assert fig.layout.margin.t == 120 + 16 * (len(lines) - 1)
    assert fit_subtitle("a · b", 600) == ["a · b"]  # a short one stays one line


def test_four_maps_of_many_rows_stack_on_a_phone() -> None:
    """Lesson 4's "before you predict" figure, four 49-token maps side by side: two to a row on a phone they were
    121 × 71 px strips (2.4 px a row, labels over the next map). Maps whose rows would be under PHONE_MIN_ROW px two
    to a row go one to a row, square, as wide as the phone allows; small maps stay two to a row."""
    from viz import attention as va
    from viz.common import PHONE_MIN_ROW, PHONE_WIDTH, apply_phone, phone

    toks = [f"tok{i}" for i in range(49)]
    maps = [softmax_attention((49, 49), seed=s) for s in range(4)]
    fig = va.heatmaps_side_by_side(maps, [toks] * 4, ["a", "b", "c", "d"], title="The heads offered")
    narrow = apply_phone(phone(fig))
    lay = narrow.layout
    for s in ("", "2", "3", "4"):
        x, y = lay[f"xaxis{s}"].domain, lay[f"yaxis{s}"].domain
        assert tuple(x) == (0, 1)  # one to a row
        height = (y[1] - y[0]) * (lay.height - lay.margin.t - lay.margin.b)
        assert height / 49 >= PHONE_MIN_ROW and height >= 0.6 * PHONE_WIDTH
    _phone_checks(fig)
    small = va.heatmaps_side_by_side([softmax_attention((6, 6))] * 4, [toks[:6]] * 4, list("abcd"), title="t")
    assert len({tuple(apply_phone(phone(small)).layout[f"xaxis{s}"].domain) for s in ("", "2", "3", "4")}) == 2
