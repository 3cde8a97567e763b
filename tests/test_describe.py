"""The Image + text tab's readings and figures (issue 63): overlays land on the right pixels for any layout, the
readings equal the arrays they come from, the own VLM's lens and relevance agree with its forward pass, and the
handler answers, draws and refuses bad input in words."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from models.inspect import looking
from models.outputs import DescribeResult
from viz import describe as vd


def _result(attention: np.ndarray, n_image: int, boxes: np.ndarray, cells: np.ndarray, shape=(64, 64)):
    t = attention.shape[-1]
    return DescribeResult(text="", ids=[4] * n_image + list(range(10, 10 + t - n_image)),
                          tokens=[f"<image {i}>" for i in range(n_image)] + [f"w{i}" for i in range(t - n_image)],
                          prompt_len=t - 2, attention=attention, image_positions=np.arange(n_image),
                          image_cells=cells, image_boxes=boxes, image=np.zeros(shape, np.uint8), grid=(2, 2),
                          vision_attention=np.zeros((1, 1, 4, 4), np.float32))


def _grid_layout(rows: int, cols: int, patch: int, tile: int = 0, x: int = 0, y: int = 0, size: int | None = None):
    r, c = np.divmod(np.arange(rows * cols), cols)
    step = patch if size is None else size // cols
    boxes = np.stack([x + c * step, y + r * step, x + (c + 1) * step, y + (r + 1) * step], 1)
    return np.stack([np.full_like(r, tile), r, c], 1), boxes


def _array(value) -> np.ndarray:
    """A built figure's typed array ({"bdata": base64, "dtype", "shape"}) as numpy."""
    if isinstance(value, dict) and "bdata" in value:
        a = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        shape = value.get("shape")
        return a.reshape([int(k) for k in str(shape).split(",")] if shape else -1).astype(float)
    return np.asarray(value, dtype=float)


def _drawn_cells(fig) -> tuple[np.ndarray, float, float]:
    heat = next(t for t in fig.to_dict()["data"] if t["type"] == "heatmap")
    return _array(heat["z"]), float(heat["x0"]), float(heat["dx"])


def _hot_pixels(fig) -> tuple[int, int, int, int]:
    """The pixel box (x0, y0, x1, y1) that the drawn map's non-zero cells cover."""
    z, x0, dx = _drawn_cells(fig)
    rows, cols = np.nonzero(np.nan_to_num(z) > 0)
    left = x0 - (dx - 1) / 2  # cell k spans [left + k·dx, left + (k+1)·dx) in pixels
    return (int(left + cols.min() * dx), int(left + rows.min() * dx), int(left + (cols.max() + 1) * dx),
            int(left + (rows.max() + 1) * dx))


@pytest.mark.parametrize("token", [0, 5, 63])
def test_a_one_hot_token_lights_exactly_its_patch(token: int) -> None:
    cells, boxes = _grid_layout(8, 8, 8)
    values = np.zeros(64)
    values[token] = 1.0
    fig = vd.image_overlay(np.zeros((64, 64), np.uint8), values, boxes, title="t")
    assert _hot_pixels(fig) == tuple(boxes[token])
    z, _, dx = _drawn_cells(fig)
    assert z.shape == (8, 8) and dx == 8  # one cell per patch, not a cell per pixel


def test_a_tiled_layout_with_a_global_view_is_drawn_tile_by_tile() -> None:
    """Idefics3's layout: 2×2 tiles of 3×3 tokens over a 96×96 image, then a global view of 3×3 tokens over the same
    pixels. The tiles form one group, the global view another; a one-hot token of tile 3 lights its own 16-pixel
    square, and one of the global view its 32-pixel square."""
    parts = [_grid_layout(3, 3, 16, tile=k, x=48 * (k % 2), y=48 * (k // 2)) for k in range(4)]
    parts.append(_grid_layout(3, 3, 32, tile=4))
    cells = np.concatenate([p[0] for p in parts])
    boxes = np.concatenate([p[1] for p in parts])
    groups = vd.token_groups(cells, boxes)
    assert [len(g) for g in groups] == [36, 9] and groups[1].tolist() == list(range(36, 45))
    image = np.zeros((96, 96), np.uint8)
    values = np.zeros(45)
    values[3 * 9 + 4] = 1.0  # tile 3 (bottom right), its middle token
    fig = vd.image_overlay(image, values[groups[0]], boxes[groups[0]], title="t")
    assert _hot_pixels(fig) == (48 + 16, 48 + 16, 48 + 32, 48 + 32)
    values[:] = 0
    values[36 + 2] = 1.0  # the global view's top-right token
    fig = vd.image_overlay(image, values[groups[1]], boxes[groups[1]], title="t")
    assert _hot_pixels(fig) == (64, 0, 96, 32)


@pytest.mark.parametrize("token", [0, 14, 53])
def test_qwen_merged_blocks_on_a_non_square_image_light_their_pixels(hf_folders, token: int) -> None:
    """Qwen2.5-VL's layout of a 72 × 48 image (what its processor resized a picture to): 4-pixel patches merged
    2 × 2, so 9 × 6 image tokens of 8 × 8 pixels, row-major; a one-hot on token k lights exactly the block at row
    k // 9, column k % 9, and the tower's patch grid is 18 × 12."""
    lay = hf_folders.get("qwen2_5_vl").model.relayout(np.zeros((48, 72, 3), np.uint8))
    assert lay.grid == (6, 9) and lay.vision_grid == (12, 18) and len(lay.cells) == 54
    r, c = divmod(token, 9)
    assert tuple(lay.cells[token]) == (0, r, c) and tuple(lay.boxes[token]) == (8 * c, 8 * r, 8 * c + 8, 8 * r + 8)
    values = np.zeros(54)
    values[token] = 1.0
    fig = vd.image_overlay(lay.image, values, lay.boxes, title="t")
    assert _hot_pixels(fig) == tuple(lay.boxes[token])
    z, _, dx = _drawn_cells(fig)
    assert z.shape == (6, 9) and dx == 8


@pytest.mark.parametrize("token", [0, 17, 48])
def test_paligemma_one_hot_attention_lights_its_cell_of_the_resized_square(hf_folders, token: int) -> None:
    """PaliGemma's layout (one square resized to the tower's 28 pixels, 7 × 7 tokens of 4 pixels, no tiles, no class
    token): a model whose attention from the last word goes all to one image token draws its hot cell on exactly that
    token's pixels of the image the model saw, which the upload's pixels fill (squeezed, not cropped)."""
    ours = hf_folders.get("paligemma").model
    r = ours.describe(np.full((30, 70, 3), 90, np.uint8), "caption en", max_new_tokens=2)
    n, t = len(r.image_positions), len(r.ids)
    assert r.image.shape == (28, 28, 3) and (r.image == 90).all() and n == 49 and set(r.image_cells[:, 0]) == {0}
    w = np.zeros((1, 1, t, t), np.float32)
    w[0, 0, -1, r.image_positions[token]] = 1.0  # the last word looks at one image token
    planted = _result(w, n, r.image_boxes, r.image_cells, shape=r.image.shape)
    fig = vd.image_overlay(r.image, looking.image_row(planted, t - 1, (0, 0)), r.image_boxes, title="t")
    row, col = divmod(token, 7)
    assert tuple(r.image_cells[token]) == (0, row, col)
    assert _hot_pixels(fig) == (4 * col, 4 * row, 4 * col + 4, 4 * row + 4)


def test_a_resized_crop_whose_boxes_are_finer_than_the_cap_is_sampled_at_centres() -> None:
    """A 3×3 grid over a 301-pixel image (boxes of 100 and 101 pixels: gcd 1) is drawn at ≤ MAX_CELLS cells a side,
    each cell taking the token at its centre pixel."""
    edges = np.array([0, 100, 200, 301])
    boxes = np.array([[edges[c], edges[r], edges[c + 1], edges[r + 1]] for r in range(3) for c in range(3)])
    amap, cell = vd.box_map(np.arange(9, dtype=float), boxes, (301, 301))
    assert max(amap.shape) <= vd.MAX_CELLS and not np.isnan(amap).any()
    centres = np.arange(amap.shape[0]) * cell + cell // 2
    expected = np.digitize(np.minimum(centres, 300), edges[1:3])
    assert (amap == expected[:, None] * 3 + expected[None, :]).all()


def test_readings_equal_the_attention_they_come_from() -> None:
    rng = np.random.default_rng(0)
    n, t = 4, 9
    w = rng.random((3, 2, t, t)) * np.tril(np.ones((t, t)))
    w /= w.sum(-1, keepdims=True)
    cells, boxes = _grid_layout(2, 2, 32)
    r = _result(w.astype(np.float32), n, boxes, cells)
    np.testing.assert_allclose(looking.image_row(r, 7, (1, 2), "mean"), w[1:3, :, 7, :n].mean(0).mean(0), rtol=1e-6)
    np.testing.assert_allclose(looking.image_row(r, 7, (2, 1), "max"), w[1:3, :, 7, :n].mean(0).max(0), rtol=1e-6)
    np.testing.assert_allclose(looking.image_row(r, 7, (0, 0), 1), w[0, 1, 7, :n], rtol=1e-6)
    # a row's image and text shares add up to 1 (causal rows sum to 1)
    for q in range(n, t):
        total = looking.image_row(r, q, (0, 2)).sum() + looking.text_row(r, q, (0, 2)).sum()
        assert total == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(ValueError, match="outside this model's 0–2"):
        looking.image_row(r, 7, (0, 3))


def test_a_planted_visual_sink_is_found_and_an_even_image_has_none() -> None:
    n, t = 16, 22
    cells, boxes = _grid_layout(4, 4, 16)
    even = np.tril(np.ones((t, t)))
    even /= even.sum(-1, keepdims=True)
    w = np.tile(even, (2, 2, 1, 1)).astype(np.float32)
    assert looking.sinks(_result(w, n, boxes, cells)).tokens == []
    planted = w.copy()
    planted[1, :, n:, :] = 0.02  # layer 1: every text position gives image token 2 half its attention
    planted[1, :, n:, 2] = 0.5
    planted[1] = np.tril(planted[1])
    planted[1] /= planted[1].sum(-1, keepdims=True)
    found = looking.sinks(_result(planted, n, boxes, cells))
    assert found.tokens == [(1, 2)]
    assert "layer 1" in found.text(_result(planted, n, boxes, cells))


def test_compare_says_when_attention_and_relevance_disagree() -> None:
    cells, boxes = _grid_layout(2, 2, 32)
    r = _result(np.zeros((1, 1, 6, 6), np.float32), 4, boxes, cells)
    same = looking.compare(r, np.array([0.1, 0.7, 0.1, 0.1]), np.array([-1.0, 3.0, 0.5, 0.2]))
    assert same.same_place and same.attention_token == same.relevance_token == 1 and "same place" in same.text
    differ = looking.compare(r, np.array([0.7, 0.1, 0.1, 0.1]), np.array([0.0, 0.1, 0.2, 3.0]))
    assert not differ.same_place and "disagree" in differ.text
    assert (differ.attention_token, differ.relevance_token) == (0, 3)
    assert looking.spearman(np.arange(5), np.arange(5) ** 3) == pytest.approx(1.0)
    assert looking.spearman(np.arange(5), -np.arange(5)) == pytest.approx(-1.0)
    assert looking.spearman(np.ones(4), np.arange(4)) == 0.0


@pytest.fixture(scope="module")
def vlm():
    import models

    return models.load("checkpoints/vlm-fashion")


def test_the_own_vlm_lens_ends_at_its_own_logits_and_relevance_is_the_benchmarks(vlm) -> None:
    """The lens's last row is the argmax of the model's own logits at the image positions (the same final norm and
    unembedding, the same residual); its first row is the embeddings' read. image_relevance equals relevance at the
    pixels for the same (position, target), as the pointing game computes it."""
    import torch

    from tabs.describe import EXAMPLE_SCENES

    r = vlm.describe(EXAMPLE_SCENES[8], "describe the image .", max_new_tokens=12)
    ids, probs = vlm.image_lens(r)
    n = len(r.image_positions)
    assert ids.shape == probs.shape == (vlm.config.n_layers + 1, n)
    img = torch.from_numpy(r.image)[None]
    with torch.no_grad():
        out = vlm(img, torch.tensor([r.ids[n:]]))
        embeds, _ = vlm.encode_image(img)
        first = torch.softmax(vlm.lm.logits_of(embeds), -1)[0]
    assert (ids[-1] == out.logits[0, :n].argmax(-1).numpy()).all()
    assert (ids[0] == first.argmax(-1).numpy()).all()
    np.testing.assert_allclose(probs[0], first.max(-1).values.numpy(), rtol=1e-5)
    q = r.prompt_len  # the position choosing the second new word
    rel = vlm.image_relevance(r, [q])
    np.testing.assert_allclose(rel, vlm.relevance(r.image, r.ids[n:], [q], [r.ids[q + 1]]), rtol=1e-6)


def test_the_handler_draws_the_models_numbers(vlm) -> None:
    from tabs import describe as tab

    scene = tab.EXAMPLE_SCENES[9]
    out = tab.describe(scene, tab.MODEL, "describe the image .", 16, 3, "while choosing it", 2, 3, "mean")
    answer, state = out[0], out[13]
    r = state["result"]
    assert out[20]["visible"] is False and out[20]["choices"] == ["whole image"]  # one tile: no tile picker
    assert "**[" in answer and r.tokens[r.prompt_len + 2] in answer
    expected = r.attention[2:4, :, r.prompt_len + 1][:, :, r.image_positions].mean(0).mean(0)
    z, _, _ = _drawn_cells(out[3])
    np.testing.assert_allclose(z.ravel(), expected, rtol=1e-5)  # 8×8 patches, row-major: the model's row
    rel = state["relevance"][r.prompt_len + 1]
    zr, _, _ = _drawn_cells(out[4])
    np.testing.assert_allclose(zr.ravel(), rel, rtol=1e-5)
    with np.load(out[12]) as arrays:
        np.testing.assert_array_equal(arrays["attention"], r.attention)
        np.testing.assert_array_equal(arrays["image_boxes"], r.image_boxes)
    # the word itself, one head, one layer: redrawn from the kept result, no model run
    again = tab.redraw_token(state, 3, "the word itself", 1, 1, "2")
    z, _, _ = _drawn_cells(again[2])
    np.testing.assert_allclose(z.ravel(), r.attention[1, 2, r.prompt_len + 2, r.image_positions], rtol=1e-5)


def test_long_answers_are_kept_in_float16_under_the_servers_cap(vlm, monkeypatch) -> None:
    """A long answer (a tiled SmolVLM image: 925 tokens) is kept in float16 and counted with Generate's long results
    (ATLAS_LONG_KEEP_MB): a newer one lets the oldest go, and a redraw of the one let go says so in words."""
    from models import limits
    from serving import results
    from tabs import describe as tab
    from tabs.common import Error

    monkeypatch.setattr(limits, "LONG_TOKENS", 8)  # the own model's answers count as long
    args = ("describe the image .", 6, 1, "while choosing it", 2, 3, "mean")
    first = tab.describe(tab.EXAMPLE_SCENES[0], tab.MODEL, *args)[13]
    r = first["result"]
    size = r.attention.nbytes + r.vision_attention.nbytes
    assert r.attention.dtype == r.vision_attention.dtype == np.float16
    monkeypatch.setattr(results, "LONG_RESULTS", results.LongResults(1.5 * size / 2**20))
    first = tab.describe(tab.EXAMPLE_SCENES[0], tab.MODEL, *args)[13]
    assert results.LONG_RESULTS.total() == size
    out = tab.describe(tab.EXAMPLE_SCENES[1], tab.MODEL, *args)
    second = out[13]
    assert not first and second and results.LONG_RESULTS.total() == size
    with pytest.raises(Error, match="Describe an image first"):
        tab.redraw_token(first, 1, "while choosing it", 2, 3, "mean")
    with pytest.raises(Error, match="Describe an image first"):
        tab.redraw_lens(first, 1)
    assert tab.redraw_token(None, 1, "while choosing it", 2, 3, "mean")[0] is not None  # before any run: no error
    r = second["result"]
    again = tab.redraw_token(second, 1, "the word itself", 1, 1, "0")
    z, _, _ = _drawn_cells(again[2])
    np.testing.assert_allclose(z.ravel(), r.attention[1, 0, r.prompt_len, r.image_positions], rtol=1e-3)


@pytest.mark.parametrize("args, message", [
    ((None,), "upload an image"),
    (("SCENE", "no-such-model"), "Unknown model"),
    (("SCENE", "vlm-fashion", "   "), "type some text"),
    (("BROKEN",), "image"),
])
def test_bad_input_gets_words(args, message, tmp_path) -> None:
    from tabs import describe as tab
    from tabs.common import Error

    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\nnot an image")
    args = tuple({"SCENE": tab.EXAMPLE_SCENES[0], "BROKEN": str(broken)}.get(a, a) if isinstance(a, str) else a
                 for a in args)
    with pytest.raises(Error, match=message):
        tab.describe(*args)


def test_the_bench_reports_latency_and_figure_size(capsys) -> None:
    """bench/describe.py runs the tab's handler over every example scene and question; no figure is over 2 MB."""
    import json
    import runpy

    bench = runpy.run_path("bench/describe.py")
    bench["main"](["--repeat", "1"])
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["runs"] == 30 and line["answer_draw_p50_s"] > 0 and line["redraw_p50_s"] > 0
    assert 0 < line["largest_figure_kb"] < 2048


@pytest.mark.parametrize("name", ["llava", "llava-full-mistral", "idefics3", "paligemma", "paligemma-gemma2",
                                  "qwen2_5_vl"])
def test_the_tab_draws_each_family_on_the_right_pixels(hf_folders, name: str, monkeypatch) -> None:
    """The handler over a configured LLaVA (a crop; with CLIP's class token under "full"), a tiled Idefics3, a
    PaliGemma (one resized square, its prompt read both ways) and a Qwen2.5-VL folder (its merged 2 × 2 blocks at the
    resolution its processor chose): the attention overlay holds the model's own row for the drawn tokens (the tiles,
    not the global view over them, nor a class token), each at its box's pixels, and the tower's figure is its
    tile's."""
    import models
    from serving import catalogue, store
    from tabs import describe as tab

    folder = hf_folders.get(name).path
    monkeypatch.setitem(catalogue.CONFIGURED, name, catalogue.Configured(folder, "describe"))
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    out = tab.describe(tab.EXAMPLE_SCENES[1], name, "what is this?", 3, 1, "while choosing it", -1, -1, "mean")
    r = out[13]["result"]
    drawn = tab._groups(r)[0]
    assert not any(c in t for t in r.tokens for c in "ĠĊ")  # byte-level pieces as people read them (issue 61 item 7)
    question = out[0].split("→")[0]  # the question as asked: no image tokens, tile markers or template specials
    assert "what is this?" in question and not any(m in question for m in ("‹", "fake_token", "↵"))
    tiles = r.image_cells[drawn, 0]
    assert (r.image_cells[drawn, 1] >= 0).all() and len(set(tiles)) == tiles.max() + 1  # every tile, no global view
    q = r.prompt_len - 1
    want = r.attention[-1, :, q][:, r.image_positions].mean(0)[drawn]
    z, x0, dx = _drawn_cells(out[3])
    left = x0 - (dx - 1) / 2
    for k, value in zip(drawn, want):  # each drawn token's value sits at its box's centre cell
        bx0, by0, bx1, by1 = r.image_boxes[k]
        cy, cx = int(((by0 + by1) / 2 - left) // dx), int(((bx0 + bx1) / 2 - left) // dx)
        assert z[cy, cx] == pytest.approx(value, rel=1e-4)
    assert isinstance(models.load(folder), type(tab.get_model(name)))
    tower = out[10].to_dict()["layout"]["title"]["text"]
    assert tower.startswith("Tower layer") and out[11] is not None


def test_a_tiled_image_shows_the_tower_of_each_tile(hf_folders, monkeypatch) -> None:
    """A tiled Idefics3 image lists its tiles and the global view; picking a tile draws that tile's tower attention
    (the model's ``tower_attention``) over that tile's pixels, at the patch drawn last, and a link reopens it."""
    from serving import catalogue, store
    from tabs import describe as tab

    folder = hf_folders.get("idefics3").path
    monkeypatch.setitem(catalogue.CONFIGURED, "idefics3", catalogue.Configured(folder, "describe"))
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    out = tab.describe(tab.EXAMPLE_SCENES[1], "idefics3", "what is this?", 2, 1, "while choosing it", -1, -1,
                       "mean")
    state, picker = out[13], out[20]
    r = state["result"]
    names = tab.tile_names(r)
    assert picker["visible"] and picker["value"] == "global view" and list(names) == picker["choices"]
    assert names["global view"] == r.vision_tile and len(names) == len(np.unique(r.image_cells[:, 0])) > 2
    tab.redraw_tower(state, 1, "1,2")
    seen, one, every = tab.retile_tower(state, "tile 2", 1)
    k = names["tile 2"]
    w = tab.get_model("idefics3").tower_attention(r, k)[1]
    grid = r.vision_grid
    z = next(t for t in one.to_dict()["data"] if t["type"] == "heatmap")["z"]
    np.testing.assert_allclose(_array(z).ravel(), w.mean(0)[1 * grid[1] + 2], rtol=1e-5)
    assert "tile 2" in one.to_dict()["layout"]["title"]["text"]
    mine = r.image_boxes[r.image_cells[:, 0] == k]
    assert seen.shape[:2] == tab.enlarge(r.image[mine[:, 1].min():mine[:, 3].max(),
                                                 mine[:, 0].min():mine[:, 2].max()], tab.SHOWN_SIDE).shape[:2]
    tab.retile_tower(state, "tile 3", 1)
    assert sorted(state["towers"]) == sorted([r.vision_tile, names["tile 3"]])  # one picked tile kept at a time
    linked = tab.linked_patch({"tile": "tile 2", "patch": "1,2"}, [], out)
    assert linked[20]["value"] == "tile 2"
    np.testing.assert_allclose(_array(next(t for t in linked[10].to_dict()["data"] if t["type"] == "heatmap")["z"]),
                               _array(z))
    assert "tile 2" in tab.link_limits(state)["tile"]
