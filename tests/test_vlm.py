"""The own small VLM (models/families/vlm.py), its scenes (train/scenes.py) and its pointing game (bench/grounding.py):
scenes without overlap whose boxes hold exactly the pasted items; describe()'s sequence, attention and pixel layout;
the cached generation equal to one full pass; relevance equal to its finite-difference definition; a model built to
attend to one known image token drawing its hot cell on that token's pixels; the shipped checkpoint answering about
held-out items; the bench running end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from models.families.vlm import VLM, VLMConfig
from models.inputs.tokenizer import JsonTokenizer
from models.outputs import pixel_map
from train import scenes
from train.data import FASHION_CLASSES

ROOT = Path(__file__).resolve().parents[1]
example_items = scenes.example_items  # the ten t10k images of examples/fashion, held out from training


def tiny(tmp_path: Path, **overrides) -> VLM:
    torch.manual_seed(0)
    cfg = dict(image_size=32, patch=8, vision_dim=16, vision_depth=1, vision_heads=2, vision_mlp=32,
               vocab_size=len(scenes.VOCAB), max_len=64, d_model=32, n_layers=2, n_heads=2)
    model = VLM(VLMConfig(**{**cfg, **overrides})).eval()
    model.tokenizer = JsonTokenizer(scenes.write_tokenizer(tmp_path / "tokenizer.json"), scenes.TEXT)
    return model


# ------------------------------------------------------------------------------------------------ scenes
def test_scenes_do_not_overlap_and_boxes_hold_the_pasted_items() -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(1, 256, size=(30, 28, 28), dtype=np.uint8)  # no black pixel: every item pixel shows
    labels = np.arange(30) % 10
    for i in range(150):
        scene = scenes.make_scene(images, labels, 7, i)
        items = scene.items
        assert scenes.MIN_ITEMS <= len(items) <= scenes.MAX_ITEMS
        assert [it.cell for it in items] == sorted({it.cell for it in items})  # distinct cells, reading order
        covered = np.zeros(scene.image.shape, int)
        for it in items:
            x0, y0, x1, y1 = it.box
            assert 0 <= x0 < x1 <= scenes.CANVAS and 0 <= y0 < y1 <= scenes.CANVAS
            assert x1 - x0 == y1 - y0 and scenes.MIN_SIZE <= x1 - x0 <= scenes.MAX_SIZE
            assert scenes.cell_of_box(it.box) == it.cell
            covered[y0:y1, x0:x1] += 1
            crop = scene.image[y0:y1, x0:x1]
            sources = [j for j in range(len(images)) if labels[j] == it.label]
            assert any(np.array_equal(crop, scenes._resize(images[j], x1 - x0)) for j in sources)
        assert covered.max() == 1  # no overlap
        assert not scene.image[covered == 0].any() and scene.image[covered == 1].all()
    again = scenes.make_scene(images, labels, 7, 3)
    assert np.array_equal(again.image, scenes.make_scene(images, labels, 7, 3).image)
    assert not np.array_equal(again.image, scenes.make_scene(images, labels, 8, 3).image)


def test_captions_and_questions_name_the_items_by_place(tmp_path: Path) -> None:
    items = (scenes.Item(5, (2, 2, 20, 20), 0), scenes.Item(8, (44, 24, 62, 42), 5))
    scene = scenes.Scene(np.zeros((64, 64), np.uint8), items)
    assert scenes.caption(items) == "at the top left a sandal and on the right a bag"
    rng = np.random.default_rng(0)
    asked = {scenes.task_text(scene, "what", rng) for _ in range(300)}
    assert ("what is at the top left ?", "a sandal") in asked and ("what is in the middle ?", "nothing") in asked
    assert scenes.task_text(scene, "where", np.random.default_rng(1))[1] in ("at the top left", "on the right")
    tok = JsonTokenizer(scenes.write_tokenizer(tmp_path / "tokenizer.json"), scenes.TEXT)
    enc = tok.encode("Describe the image. What is at the TOP left? a t-shirt", add_special=False)
    assert enc.pieces == ["describe", "the", "image", ".", "what", "is", "at", "the", "top", "left", "?", "a",
                          "t-shirt"] and tok.unk_id not in enc.ids
    assert tok.encode("a hat", add_special=False).ids[1] == tok.unk_id


def test_write_scenes_jsonl(tmp_path: Path) -> None:
    from tests.test_data import idx_bytes, write

    images, labels = example_items()
    base = tmp_path / "fashion-mnist"
    splits = {"train": (np.repeat(images, 501, 0), np.repeat(labels, 501)), "t10k": (images, labels)}
    for split, (x, y) in splits.items():
        write(base / f"{split}-images-idx3-ubyte", idx_bytes(x), True)
        write(base / f"{split}-labels-idx1-ubyte", idx_bytes(y.astype(np.uint8)), True)
    out = scenes.write_scenes(tmp_path / "scenes", "test", 4, 3, tmp_path)
    lines = [json.loads(line) for line in (out / "scenes.jsonl").read_text().splitlines()]
    assert [r["image"] for r in lines] == [f"scene_{i:03d}.png" for i in range(4)]
    for i, rec in enumerate(lines):
        png = np.asarray(Image.open(out / rec["image"]))
        assert np.array_equal(png, scenes.make_scene(images, labels, 3, i).image)
        for it in rec["items"]:
            assert it["class"] in FASHION_CLASSES
            x0, y0, x1, y1 = it["box"]
            assert png[y0:y1, x0:x1].any()


# ------------------------------------------------------------------------------------------------ the model
def test_describe_sequence_attention_and_pixel_layout(tmp_path: Path) -> None:
    model = tiny(tmp_path)
    c = model.config
    image = np.random.default_rng(0).integers(0, 120, size=(32, 32), dtype=np.uint8)
    r = model.describe(image, "what is at the top left ?", max_new_tokens=5)
    n, t = c.image_tokens, len(r.ids)
    assert len(r.tokens) == t and r.attention.shape == (c.n_layers, c.n_heads, t, t)
    assert 1 <= t - r.prompt_len <= 5 and r.ids[r.prompt_len:] == [model.tokenizer.tk.token_to_id(s.chosen)
                                                                     for s in r.steps]
    np.testing.assert_allclose(r.attention.sum(-1), 1.0, atol=1e-5)
    assert not np.triu(r.attention, k=1).any()  # causal
    assert r.image_positions.tolist() == list(range(n)) and all(r.ids[i] == c.image_id for i in r.image_positions)
    assert r.ids[n] == c.bos_id and r.tokens[n + 1:n + 4] == ["what", "is", "at"]
    assert r.vision_attention.shape == (c.vision_depth, c.vision_heads, n, n)
    np.testing.assert_allclose(r.vision_attention.sum(-1), 1.0, atol=1e-5)
    rows, cols = r.image_cells[:, 1], r.image_cells[:, 2]  # the tower's attention stays within its window
    w = c.vision_window
    far = (np.abs(rows[:, None] - rows[None]) > w) | (np.abs(cols[:, None] - cols[None]) > w)
    assert far.any() and not r.vision_attention[:, :, far].any()
    # every image token's pixels: its (tile, row, column) cell, and the boxes tile the canvas exactly once
    cover = np.zeros((c.image_size, c.image_size), int)
    for (tile, row, col), (x0, y0, x1, y1) in zip(r.image_cells, r.image_boxes):
        assert tile == 0 and (x0, y0, x1, y1) == (col * c.patch, row * c.patch, (col + 1) * c.patch,
                                                  (row + 1) * c.patch)
        cover[y0:y1, x0:x1] += 1
    assert (cover == 1).all() and r.image.shape == (c.image_size, c.image_size)
    assert r.tokens[5] == "<image r1c1>"
    with pytest.raises(ValueError, match="values for"):
        pixel_map(np.ones(3), r.image_boxes, (32, 32))


def test_cached_generation_equals_one_full_pass(tmp_path: Path) -> None:
    model = tiny(tmp_path)
    image = np.random.default_rng(1).integers(0, 255, size=(32, 32), dtype=np.uint8)
    r = model.describe(image, "describe the image .", max_new_tokens=6)
    n = model.config.image_tokens
    text = torch.tensor([r.ids[n:]])
    img = torch.from_numpy(r.image)[None]
    with torch.no_grad():
        full = model(img, text, need_weights=True)
        fused = model(img, text)
    att = torch.stack([a[0] for a in full.attention]).numpy()
    np.testing.assert_allclose(r.attention, att, atol=1e-5)
    torch.testing.assert_close(full.logits, fused.logits, atol=1e-5, rtol=1e-5)  # explicit vs fused attention
    chosen = full.logits[0, r.prompt_len - 1:-1].argmax(-1).tolist()
    assert chosen == r.ids[r.prompt_len:]  # greedy: each new token the argmax after the tokens before it


@pytest.mark.parametrize("at", ["tokens", "pixels"])
def test_relevance_is_gradient_times_input(tmp_path: Path, at: str) -> None:
    """Gradient × input is the derivative along the input itself: d/dt f(input with token i's part scaled by 1 + t)
    at t = 0 (on the pixels: their difference from black, over token i's patch), checked by central differences."""
    model = tiny(tmp_path).double()
    c = model.config
    image = np.random.default_rng(2).integers(0, 255, size=(32, 32), dtype=np.uint8)
    ids, _ = model.encode_text("describe the image . on the left a sandal")
    n = c.image_tokens
    p, y = n + len(ids) - 2, ids[-1]  # the position predicting "sandal", and "sandal"
    rel = model.relevance(image, ids, [p], [y], at=at)[0]
    img = torch.from_numpy(model.image_array(image)[0])[None]
    with torch.no_grad():
        e, _ = model.encode_image(img)
        x, black = model.pixels(img), model.pixels(torch.zeros_like(img))

        def f(i: int, t: float) -> float:
            if at == "tokens":
                s = torch.ones(1, n, 1, dtype=torch.float64)
                s[0, i] += t
                embeds = e * s
            else:
                s = torch.ones(1, 1, c.image_size, c.image_size, dtype=torch.float64)
                row, col = divmod(i, c.grid)
                s[..., row * c.patch:(row + 1) * c.patch, col * c.patch:(col + 1) * c.patch] += t
                embeds = model._tower(black + (x - black) * s)[0]
            logits = model(img, torch.tensor([ids]), image_embeds=embeds).logits
            return float(torch.log_softmax(logits[0, p], -1)[y])

        # central differences; the step is not tiny since RMSNorm computes in float32 whatever the weights' dtype
        fd = np.array([(f(i, 1e-2) - f(i, -1e-2)) / 2e-2 for i in range(n)])
    np.testing.assert_allclose(rel, fd, rtol=0, atol=5e-3 * np.abs(fd).max())
    assert np.abs(rel).max() > 0
    if at == "pixels":  # a black patch has no pixel that differs from black
        black_image = image.copy()
        black_image[:8, :8] = 0
        assert model.relevance(black_image, ids, [p], [y])[0][0] == 0


def test_attention_to_one_known_image_token_draws_on_its_pixels(tmp_path: Path) -> None:
    """Weights set by hand: black patches embed to 0, one bright patch to v; layer 0's keys read v along RoPE's
    slowest pair, every text query a constant there: all of layer 0's text rows go to the bright token. Fed a
    32×16 image (padded to a square, then the model's canvas), the hot pixels must be that patch's pixels."""
    model = tiny(tmp_path, pixel_mean=0.0)
    c, d_head = model.config, model.config.d_model // model.config.n_heads
    with torch.no_grad():
        for block in model.vision_blocks:  # the tower passes each patch through unchanged (residuals only)
            for lin in (block.attn.out_proj, block.mlp[3]):
                lin.weight.zero_()
                lin.bias.zero_()
        model.vision_pos.zero_()
        model.patch_embed.bias.zero_()
        model.projector[0].bias.zero_()
        model.projector[2].bias.zero_()
        model.projector[2].weight[0].zero_()  # v ⟂ e_0, so the text tokens (all e_0) have no key along v
        bright = torch.full((1, 8, 8), 200, dtype=torch.uint8)
        v = model.projector(model.vision_norm(model.patch_embed(model.pixels(bright[None])).flatten(1)))
        u = v / v.norm()
        attn = model.lm.blocks[0].attn
        attn.q_proj.weight.zero_()
        attn.k_proj.weight.zero_()
        model.lm.embed.weight.zero_()
        model.lm.embed.weight[:, 0] = 1.0
        for h in range(c.n_heads):  # the last RoPE pair turns by ~1e-3 rad over the sequence: scores ≈ q·k
            attn.q_proj.weight[h * d_head + d_head - 2, 0] = 10.0
            attn.k_proj.weight[h * d_head + d_head - 2] = 50.0 * u
    image = np.zeros((16, 32), np.uint8)  # wide: padded with 8 rows above and below, so row 0 -> canvas row 8
    image[8:16, 8:16] = 200  # canvas rows 16..23, columns 8..15: the token of row 2, column 1
    r = model.describe(image, "describe the image .", max_new_tokens=2)
    target = 2 * c.grid + 1
    assert np.array_equal(r.image > 0, np.pad(np.ones((8, 8), bool), ((16, 8), (8, 16))))
    for q in range(c.image_tokens, len(r.ids)):
        for h in range(c.n_heads):
            w = r.image_attention(q, layer=0, head=h)
            assert int(np.argmax(w)) == target and w[target] > 0.99
        hot = r.to_pixels(r.image_attention(q, layer=0)) > 0.5
        assert np.array_equal(hot, r.image > 0)


def test_image_input_conversion(tmp_path: Path) -> None:
    model = tiny(tmp_path)
    light = np.full((64, 64, 3), 250, np.uint8)
    light[20:40, 20:40] = 10
    out, notice = model.image_array(light)
    assert out.shape == (32, 32) and out[0, 0] < 10 and out[15, 15] > 200 and "inverted" in notice
    dark = np.random.default_rng(0).integers(0, 90, size=(32, 32), dtype=np.uint8)
    assert np.array_equal(model.image_array(dark)[0], dark)  # the model's own size passes unchanged
    r = model.describe(light, "describe", max_new_tokens=1)
    assert "inverted" in r.notice and np.array_equal(r.image, out)
    with pytest.raises(ValueError):
        model.describe(dark, "describe", max_new_tokens=-1)
    with pytest.raises(ValueError):
        model.describe(np.zeros((0, 5), np.uint8), "describe")


# -------------------------------------------------------------------------------------- the shipped checkpoint
def test_shipped_checkpoint_answers_about_held_out_items() -> None:
    import models

    model = models.load("vlm-fashion")  # verifies the manifest
    assert isinstance(model, VLM) and model.tokenizer is not None
    images, labels = example_items()
    right = total = 0
    for i in range(8):
        scene = scenes.make_scene(images, labels, 11, i)
        for it in scene.items:
            r = model.describe(scene.image, f"what is {scenes.PLACES[it.cell]} ?", max_new_tokens=4)
            right += r.text == f"a {it.word}"
            total += 1
        empty = next(cell for cell in range(9) if cell not in {it.cell for it in scene.items})
        right += model.describe(scene.image, f"what is {scenes.PLACES[empty]} ?", max_new_tokens=4).text == "nothing"
        total += 1
    # on 300 test scenes it names the item at a place right 67 % of the time and says "nothing" of an empty place
    # almost always (README); chance among the 11 answers is 9 %
    assert right >= 0.5 * total, f"{right} of {total}"
    first = scenes.make_scene(images, labels, 11, 0)
    place = scenes.PLACES[first.items[0].cell]
    said = model.describe(first.image, f"What is {place.capitalize()}?").text  # the same prompt once normalised
    assert said == model.describe(first.image, f"what is {place} ?").text and said.split()[0] in ("a", "nothing")


def test_grounding_bench_runs(tmp_path: Path) -> None:
    images, labels = example_items()
    lines = []
    for i in range(3):
        scene = scenes.make_scene(images, labels, 12, i)
        Image.fromarray(scene.image).save(tmp_path / f"scene_{i:03d}.png")
        lines.append(json.dumps(scenes.scene_record(scene, f"scene_{i:03d}.png")))
    (tmp_path / "scenes.jsonl").write_text("\n".join(lines) + "\n")
    proc = subprocess.run([sys.executable, "bench/grounding.py", "--scenes", str(tmp_path), "--repeats", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    n = sum(len(json.loads(line)["items"]) for line in lines)
    assert last["n"] == n and 0 <= last["attention"] <= 1 and 0 <= last["relevance"] <= 1
    for key in ("attention", "relevance"):  # accuracies over n items: multiples of 1/n
        assert abs(last[key] * n - round(last[key] * n)) < 1e-3
