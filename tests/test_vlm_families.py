"""LLaVA, Idefics3 / SmolVLM, PaliGemma and Qwen2.5-VL (models/families/hf_vlm.py, models/io/hf_vlm.py) against
transformers on random weights.

The parity of every folder (two images each: pixels, prompt layout and image positions, greedy ids, the language
model's and the tower's attention) runs in tests/test_parity.py (kind "vlm", tests/vlm_parity.py); here the rest of the
interface the Image + text tab calls, each against a reference:

- ``image_relevance``: gradient × input on the image-token embeddings equals the same gradient taken through
  transformers' model (its projector's output made the leaf);
- ``image_lens``: the top token and its probability at every layer equal transformers' hidden states read through
  its final norm and output projection;
- ``chat_prompt``: the processor's own ``apply_chat_template``; the plain fallback without a template (PaliGemma has
  none: its prompt is the processor's own layout of a question without a placeholder);
- PaliGemma's prefix LM: the prompt rows of ``r.attention`` reach the later prompt tokens, as transformers' do; a tied
  folder's logits and attention equal transformers';
- the overlay: a white square on black covering exactly one image token's pixels in the image the model saw; the
  token whose tower input (transformers' own ``pixel_values``) is brightest is found, and ``r.to_pixels`` of a one-hot
  on it lights exactly that square (a LLaVA crop, PaliGemma's resized square, each tile of a 2 × 2 Idefics3 layout,
  and the global view's cell covering it, Qwen2.5-VL's merged 2 × 2 patch blocks on an image its processor resized
  to 0.8 of its size);
- fail-closed: unknown settings planted in a folder are refused in words.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from models.io.checkpoint import CheckpointError
from tests.vlm_parity import PROMPT, forward_extra, images, prompt_of, theirs, tile_pixels, tower_attention

FAMILIES = ("llava", "idefics3", "paligemma", "paligemma-gemma2", "qwen2_5_vl")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _projector(hf):
    if hasattr(hf.model, "visual"):  # Qwen2.5-VL: the merger ends its tower
        return hf.model.visual.merger
    return hf.model.multi_modal_projector if hasattr(hf.model, "multi_modal_projector") else hf.model.connector


def _image_order(hf, inputs) -> torch.Tensor:
    """Where each image token's features are in the projector's output: Qwen2.5-VL's merger runs on its window
    order, which transformers undoes after it (``reverse_indices``); the others' are in token order."""
    n = int(inputs["input_ids"].eq(hf.config.image_token_id).sum())
    if not hasattr(hf.model, "visual"):
        return torch.arange(n)
    from transformers.vision_utils import get_vision_window_index

    vc = hf.config.vision_config
    window_index, _ = get_vision_window_index(inputs["image_grid_thw"], vc.spatial_merge_size, vc.window_size,
                                              vc.patch_size)
    return torch.argsort(window_index)


@pytest.mark.parametrize("name", FAMILIES)
def test_image_relevance_is_transformers_gradient(hf_folders, name: str) -> None:
    built = hf_folders.get(name)
    hf, ours, proc = built.ref.model, built.model, built.ref.multimodal
    image, prompt = images()[0], prompt_of(ours)
    r = ours.describe(image, prompt, max_new_tokens=4)
    queries = [r.prompt_len - 1, r.prompt_len + 1, int(r.image_positions[-1]) + 2]
    got = ours.image_relevance(r, queries)
    assert got.shape == (len(queries), len(r.image_positions)) and got.dtype == np.float32

    leaf: list[torch.Tensor] = []

    def as_leaf(module, args, out):  # the projector's output becomes the leaf the gradient is taken for
        leaf.append(out.detach().clone().requires_grad_(True))
        return leaf[-1]

    inputs = theirs(proc, image, prompt)
    extra = forward_extra(inputs, len(r.ids))
    order = _image_order(hf, inputs)
    handle = _projector(hf).register_forward_hook(as_leaf)
    try:
        logits = hf(input_ids=torch.tensor([r.ids]), **extra).logits[0]
    finally:
        handle.remove()
    logp = torch.log_softmax(logits.double(), -1)
    for k, q in enumerate(queries):
        (g,) = torch.autograd.grad(logp[q, r.ids[q + 1]], leaf[0], retain_graph=True)
        want = (g * leaf[0]).sum(-1).reshape(-1)[order].detach().float().numpy()
        assert np.abs(want).max() > 1e-3  # the image matters to this token
        np.testing.assert_allclose(got[k], want, atol=1e-4 * max(1.0, float(np.abs(want).max())))
    with pytest.raises(ValueError, match="no next token"):
        ours.image_relevance(r, [len(r.ids) - 1])


@pytest.mark.parametrize("name", FAMILIES)
def test_image_lens_is_transformers_hidden_states(hf_folders, name: str) -> None:
    built = hf_folders.get(name)
    hf, ours, proc = built.ref.model, built.model, built.ref.multimodal
    image, prompt = images()[1], prompt_of(ours)
    r = ours.describe(image, prompt, max_new_tokens=3)
    ids, probs = ours.image_lens(r)
    layers = ours.lm.config.n_layers
    assert ids.shape == probs.shape == (layers + 1, len(r.image_positions))
    inputs = theirs(proc, image, prompt)
    extra = forward_extra(inputs, len(r.ids))
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([r.ids]), output_hidden_states=True, **extra)
        lm = hf.model.language_model if hasattr(hf.model, "language_model") else hf.model.text_model
        pos = torch.as_tensor(r.image_positions)
        cap = getattr(hf.config.get_text_config(), "final_logit_softcapping", None)
        for layer in range(layers + 1):
            if layer < layers:  # the residual stream entering block `layer`, through the final norm and head
                logits = hf.lm_head(lm.norm(ref.hidden_states[layer][0, pos]))
                if cap:  # and Gemma 2's final soft-capping, as transformers' own logits
                    logits = torch.tanh(logits / cap) * cap
                p = torch.softmax(logits, -1)
            else:  # after the last block: the model's own logits
                p = torch.softmax(ref.logits[0, pos], -1)
            top = p.max(-1)
            np.testing.assert_array_equal(ids[layer], top.indices.numpy())
            np.testing.assert_allclose(probs[layer], top.values.numpy(), atol=1e-4)
    assert len(np.unique(ids)) > 1


@pytest.mark.parametrize("name", ["llava", "idefics3"])
def test_chat_prompt_is_the_processors(hf_folders, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    built = hf_folders.get(name)
    ours, proc = built.model, built.ref.multimodal
    question = "What colour is the disc?"
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    want = proc.apply_chat_template(messages, add_generation_prompt=True)
    assert ours.chat_prompt(question) == want and want.count(ours.placeholder) == 1
    r = ours.describe(images()[0], want, max_new_tokens=2)  # the tab's prompt runs as the processor's
    assert r.ids[: r.prompt_len] == theirs(proc, images()[0], want)["input_ids"][0].tolist()
    monkeypatch.setattr(ours.config, "chat_template", "")
    plain = ours.chat_prompt(question)
    assert plain.count(ours.placeholder) == 1 and question in plain and plain != want


@pytest.mark.parametrize("name", FAMILIES)
def test_describe_result_is_well_formed(hf_folders, name: str) -> None:
    built = hf_folders.get(name)
    ours = built.model
    r = ours.describe(images()[1], prompt_of(ours), max_new_tokens=5)
    t = len(r.ids)
    assert r.attention.dtype == np.float32 and len(r.tokens) == t and len(r.steps) == t - r.prompt_len
    np.testing.assert_allclose(r.attention.sum(-1), 1.0, atol=1e-5)
    p = r.prompt_len
    assert np.all(np.triu(r.attention[:, :, p:], p + 1) == 0)  # the new tokens: causal
    prompt = r.attention[:, :, :p, :p]  # the prompt: causal, or read both ways by a prefix LM (PaliGemma)
    assert np.all(np.triu(prompt, 1) == 0) != name.startswith("paligemma") == (prompt[..., 0, -1] > 0).all()
    assert all(r.tokens[p].startswith("<image") for p in r.image_positions)
    h, w = r.image.shape[:2]
    b = r.image_boxes
    assert r.image.dtype == np.uint8 and np.all((b[:, 0] >= 0) & (b[:, 1] >= 0) & (b[:, 2] <= w) & (b[:, 3] <= h))
    assert np.all((b[:, 2] > b[:, 0]) & (b[:, 3] > b[:, 1]))
    assert r.image_attention(t - 1).shape == (len(r.image_positions),)
    bare = ours.describe(images()[0], "no placeholder here", max_new_tokens=1)  # the image put first, said so
    assert f"no {ours.placeholder}" in bare.notice
    assert bare.ids[: bare.prompt_len] == theirs(built.ref.multimodal, images()[0],
                                                 ours.image_prompt + "no placeholder here")["input_ids"][0].tolist()
    with pytest.raises(ValueError, match="exactly once"):
        ours.describe(images()[0], ours.placeholder * 2, max_new_tokens=1)


def test_every_tiles_tower_attention_is_transformers(hf_folders) -> None:
    """``tower_attention(r, tile)`` (the Image + text tab's tile picker) for each tile of a 2 × 2 Idefics3 layout and
    its global view equals transformers' tower on that tile's pixel values, within 1e-4; the global view's is the one
    ``describe`` returned."""
    built = hf_folders.get("idefics3")
    image = images()[0]
    r = built.model.describe(image, PROMPT, max_new_tokens=1)
    inputs = theirs(built.ref.multimodal, image)
    tiles = len(tile_pixels(inputs))
    assert tiles == 5 and len(np.unique(r.image_cells[:, 0])) == tiles
    for k in range(tiles):
        got = built.model.tower_attention(r, k)
        np.testing.assert_allclose(got, tower_attention(built.ref.model, inputs, k), atol=1e-4)
    np.testing.assert_array_equal(got, r.vision_attention)
    with pytest.raises(ValueError, match="not one of"):
        built.model.tower_attention(r, tiles)
    qwen = hf_folders.get("qwen2_5_vl").model  # one image, no tiles: tile 0 is what describe returned
    r = qwen.describe(image, prompt_of(qwen), max_new_tokens=1)
    np.testing.assert_allclose(qwen.tower_attention(r, 0), r.vision_attention, atol=1e-6)
    with pytest.raises(ValueError, match="not one of"):
        qwen.tower_attention(r, 1)


def test_bf16_tiles_keep_the_global_view_exact(hf_folders, monkeypatch: pytest.MonkeyPatch) -> None:
    """Idefics3's opt-in bfloat16 tiles (the speed arm of bench/vlm_speed.py): the tiles besides the global view move a
    little, the global view's features and its tower attention (what is shown) stay exactly the float32 ones."""
    ours = hf_folders.get("idefics3").model
    pixels = ours.layout(images()[0]).pixels
    with torch.no_grad():
        exact, exact_w = ours.features(pixels, need_weights=True)
        monkeypatch.setattr(ours, "bf16_tiles", True)
        fast, fast_w = ours.features(pixels, need_weights=True)
    n = ours.config.image_seq_len
    torch.testing.assert_close(fast[-n:], exact[-n:], rtol=0, atol=0)
    torch.testing.assert_close(fast_w, exact_w, rtol=0, atol=0)
    moved = float((fast[:-n] - exact[:-n]).norm() / exact[:-n].norm())
    assert 0 < moved < 0.05


def test_global_view_alone_is_the_processors_without_splitting(hf_folders, monkeypatch: pytest.MonkeyPatch) -> None:
    """``image_splitting = False`` on a tiling folder gives what transformers' processor gives with
    do_image_splitting=False: one tile, the same ids, pixels and greedy answer."""
    built = hf_folders.get("idefics3")
    hf, ours, proc = built.ref.model, built.model, built.ref.multimodal
    monkeypatch.setattr(ours, "image_splitting", False)
    image = images()[0]
    inputs = proc(images=image, text=PROMPT, return_tensors="pt", do_image_splitting=False)
    r = ours.describe(image, PROMPT, max_new_tokens=4)
    assert r.image.shape[:2] == (32, 32) and set(r.image_cells[:, 0]) == {0}
    np.testing.assert_allclose(ours.layout(image).pixels.numpy(), tile_pixels(inputs).numpy(), atol=1e-5)
    with torch.no_grad():
        want = hf.generate(**inputs, max_new_tokens=4, do_sample=False)[0].tolist()
    assert r.ids == want and r.prompt_len == inputs["input_ids"].size(1)


def test_paligemma_chat_prompt_is_the_processors_own_layout(hf_folders) -> None:
    """PaliGemma has no chat template: ``chat_prompt`` gives the image and the question, which ``describe`` lays out
    exactly as the processor lays out a question given without a placeholder (``<image>``·n, ``<bos>``, the text,
    ``\\n``, no second ``<bos>`` from the tokenizer's own template)."""
    built = hf_folders.get("paligemma")
    ours, proc = built.model, built.ref.multimodal
    question = "caption en"
    assert ours.config.chat_template == "" and ours.chat_prompt(question) == "<image>caption en"
    r = ours.describe(images()[0], ours.chat_prompt(question), max_new_tokens=2)
    want = proc(images=images()[0], text=question, return_tensors="pt")["input_ids"][0].tolist()
    assert r.ids[: r.prompt_len] == want
    bos = proc.tokenizer.convert_tokens_to_ids("<bos>")
    assert want.count(bos) == 1 and want.index(bos) == len(r.image_positions) == 49


def test_paligemma_tied_folder_is_transformers(hf_folders, tmp_path: Path) -> None:
    """Real PaliGemma ties its output to the embeddings: a tied folder (whose random model repeats one token, so the
    parity case is untied) gives transformers' logits and every layer's attention over the prompt and new tokens."""
    import models
    from tests.vlm_folders import paligemma_folder

    hf, proc = paligemma_folder(tmp_path / "tied", seed=1, tied=True)
    ours = models.load(str(tmp_path / "tied"))
    assert ours.lm.config.tie_embeddings and ours.lm.lm_head.weight is ours.lm.embed.weight
    image = images()[1]
    r = ours.describe(image, PROMPT, max_new_tokens=3)
    extra = forward_extra(theirs(proc, image), len(r.ids))
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([r.ids]), output_attentions=True, **extra)
        out, _ = ours._forward_seen(r)
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-4, rtol=0)
    np.testing.assert_allclose(r.attention, torch.stack(ref.attentions, 1)[0].numpy(), atol=1e-4)


# ------------------------------------------------------------------------------------------------ the overlay
def _square(h: int, w: int, box: tuple[int, int, int, int]):
    from PIL import Image

    a = np.zeros((h, w, 3), np.uint8)
    x0, y0, x1, y1 = box
    a[y0:y1, x0:x1] = 255
    return Image.fromarray(a)


def _brightest(pixels: torch.Tensor, tile: int, cell: int) -> tuple[int, int]:
    """(row, col) of the brightest cell × cell block of tile ``tile`` of the processor's pixel values."""
    x = pixels[tile].mean(0)  # (S, S)
    s = x.size(0) // cell
    blocks = x.reshape(s, cell, s, cell).mean((1, 3))
    return divmod(int(blocks.argmax()), s)


def _hot(r, token: int) -> np.ndarray:
    """The pixels a one-hot on ``token`` lights, drawn over the tokens of its own tile (in a tiled layout the global
    view's boxes overlap the tiles': ``DescribeResult.to_pixels`` over every token lets the later ones win)."""
    same = r.image_cells[:, 0] == r.image_cells[token, 0]
    onehot = np.zeros(len(r.image_positions), np.float32)
    onehot[token] = 1.0
    if same.all():
        return r.to_pixels(onehot) > 0
    from models.outputs import pixel_map

    return pixel_map(onehot[same], r.image_boxes[same], r.image.shape[:2]) > 0


def test_overlay_llava_crop(hf_folders) -> None:
    """A 46 × 30 picture: CLIP's preprocessing keeps its height and crops 8 columns off the left (centre crop to 30);
    a white square over the seen image's patch (row 2, column 3) sits at x = 8 + 18 in the upload."""
    built = hf_folders.get("llava")
    ours, proc = built.model, built.ref.multimodal
    patch = ours.config.tower.patch
    upload = _square(30, 46, (8 + 3 * patch, 2 * patch, 8 + 4 * patch, 3 * patch))
    pixels = tile_pixels(theirs(proc, upload))
    row, col = _brightest(pixels, 0, patch)  # from transformers' own tower input
    assert (row, col) == (2, 3)
    r = ours.describe(upload, PROMPT, max_new_tokens=1)
    token = int(np.flatnonzero((r.image_cells[:, 1] == row) & (r.image_cells[:, 2] == col))[0])
    hot = _hot(r, token)
    white = r.image.min(-1) == 255
    assert white.sum() == patch * patch and np.array_equal(hot, white)
    np.testing.assert_array_equal(r.image, np.asarray(upload)[:, 8:38])  # the crop the model saw


def test_overlay_paligemma_resized_square(hf_folders) -> None:
    """A 84 × 56 picture is squeezed to the tower's 28 × 28 (no crop): a white block over the picture's cells (2, 3)
    of a 7 × 7 grid (12 × 8 pixels each) becomes the seen image's 4 × 4 token (2, 3), where transformers' own pixel
    values are brightest; a one-hot on that token lights exactly its box."""
    built = hf_folders.get("paligemma")
    ours, proc = built.model, built.ref.multimodal
    patch = ours.config.tower.patch
    upload = _square(56, 84, (3 * 12, 2 * 8, 4 * 12, 3 * 8))
    pixels = tile_pixels(theirs(proc, upload))
    assert pixels.shape[-2:] == (28, 28) and _brightest(pixels, 0, patch) == (2, 3)
    r = ours.describe(upload, PROMPT, max_new_tokens=1)
    assert r.image.shape == (28, 28, 3) and len(r.image_positions) == 49 and set(r.image_cells[:, 0]) == {0}
    token = int(np.flatnonzero((r.image_cells[:, 1] == 2) & (r.image_cells[:, 2] == 3))[0])
    hot = _hot(r, token)
    box = np.zeros((28, 28), bool)
    box[2 * patch:3 * patch, 3 * patch:4 * patch] = True
    assert np.array_equal(hot, box)
    seen = r.image.mean(-1)
    assert seen[box].mean() > seen[~box].max() - 1  # the block the model saw is where the hot cell is drawn


@pytest.mark.parametrize("tile", [0, 1, 2, 3])
def test_overlay_idefics3_tiles(hf_folders, tile: int) -> None:
    """A 64 × 64 picture is laid out as 2 × 2 tiles of 32 pixels (each token 8 × 8 pixels after the shuffle) and the
    global view; a white square over token (2, 1) of tile ``tile`` lights exactly that square, and the global view's
    brightest token's cell covers it."""
    built = hf_folders.get("idefics3")
    ours, proc = built.model, built.ref.multimodal
    size = ours.config.processor["tile"]
    cell = size // ours.token_grid
    r0, c0 = divmod(tile, 2)
    box = (c0 * size + 1 * cell, r0 * size + 2 * cell, c0 * size + 2 * cell, r0 * size + 3 * cell)
    upload = _square(64, 64, box)
    pixels = tile_pixels(theirs(proc, upload))
    assert pixels.size(0) == 5
    row, col = _brightest(pixels, tile, cell)
    assert (row, col) == (2, 1)
    r = ours.describe(upload, PROMPT, max_new_tokens=1)
    cells = r.image_cells
    token = int(np.flatnonzero((cells[:, 0] == tile) & (cells[:, 1] == row) & (cells[:, 2] == col))[0])
    white = r.image.min(-1) == 255
    assert white.sum() == cell * cell and np.array_equal(_hot(r, token), white)
    g_row, g_col = _brightest(pixels, 4, cell)  # the global view (the last tile): a coarser cell over the square
    g = int(np.flatnonzero((cells[:, 0] == 4) & (cells[:, 1] == g_row) & (cells[:, 2] == g_col))[0])
    hot = _hot(r, g)
    assert hot[white].all() and hot.sum() == (2 * cell) ** 2


def test_overlay_qwen_merged_blocks(hf_folders) -> None:
    """A 90 × 60 picture: the processor's pixel budget (3500) resizes it to 72 × 48 (0.8 of each side, whole 8-pixel
    merge blocks: 9 × 6 image tokens of 2 × 2 patches). A white square over the upload's pixels (50, 20)–(60, 30) is
    token (row 2, column 5) of transformers' own tower input, whose box in the image the model saw is (40, 16)–(48, 24):
    the same pixels of the upload scaled by 0.8; ``r.to_pixels`` of a one-hot on it lights exactly that box, and the
    picture's bright pixels all fall in it."""
    built = hf_folders.get("qwen2_5_vl")
    ours, proc = built.model, built.ref.multimodal
    upload = _square(60, 90, (50, 20, 60, 30))
    prompt = prompt_of(ours)
    inputs = theirs(proc, upload, prompt)
    _, gh, gw = inputs["image_grid_thw"][0].tolist()
    assert (gh, gw) == (12, 18)  # 48 × 72 pixels of 4-pixel patches
    m = ours.config.tower.merge
    per_token = inputs["pixel_values"].reshape(gh * gw // (m * m), -1).mean(-1)  # a merge block's patches in a row
    row, col = divmod(int(per_token.argmax()), gw // m)
    assert (row, col) == (2, 5)
    r = ours.describe(upload, prompt, max_new_tokens=1)
    assert r.image.shape == (48, 72, 3) and r.grid == (6, 9) and r.vision_grid == (12, 18)
    token = int(np.flatnonzero((r.image_cells[:, 1] == row) & (r.image_cells[:, 2] == col))[0])
    assert tuple(r.image_boxes[token]) == (40, 16, 48, 24)
    sy, sx = 60 / r.image.shape[0], 90 / r.image.shape[1]  # the box on the upload: the white square
    assert (40 * sx, 16 * sy, 48 * sx, 24 * sy) == (50, 20, 60, 30)
    hot = _hot(r, token)
    bright = r.image.min(-1) > 128
    assert hot.sum() == 8 * 8 and bright.sum() >= 6 * 6 and hot[bright].all()


# ------------------------------------------------------------------------------------------------ fail closed
def _planted(hf_folders, name: str, tmp_path: Path, config: dict | None = None, processor: dict | None = None,
             vision: dict | None = None, text: dict | None = None) -> Path:
    source = hf_folders.get(name).path
    folder = tmp_path / f"{name}-planted"
    shutil.copytree(source, folder)
    c = json.loads((folder / "config.json").read_text())
    c.update(config or {})
    c["vision_config"].update(vision or {})
    c["text_config"].update(text or {})
    (folder / "config.json").write_text(json.dumps(c))
    if processor:
        p = json.loads((folder / "processor_config.json").read_text())
        for key, value in processor.items():
            if isinstance(value, dict):
                p[key].update(value)
            else:
                p[key] = value
        (folder / "processor_config.json").write_text(json.dumps(p))
    return folder


@pytest.mark.parametrize("name, planted, words", [
    ("llava", dict(config={"vision_feature_select_strategy": "unknown"}),
     "vision_feature_select_strategy 'unknown' is not supported"),
    ("llava", dict(config={"projector_hidden_act": "cubic"}), "projector activation 'cubic' is not supported"),
    ("llava", dict(config={"vision_feature_layer": 9}), "vision_feature_layer 9 is not a hidden state"),
    ("llava", dict(vision={"model_type": "eva_vision"}), "vision tower 'eva_vision' is not supported"),
    ("llava", dict(vision={"hidden_act": "cubic"}), "vision tower activation 'cubic' is not supported"),
    ("llava", dict(text={"model_type": "gemma"}), "language model 'gemma' is not supported"),
    ("llava", dict(processor={"num_additional_image_tokens": 0}),
     "the processor lays out 24 image tokens, the model makes 25"),
    ("llava", dict(processor={"image_processor": {"do_pad": True}}), "pad-to-square"),
    ("llava", dict(processor={"image_processor": {"crop_size": {"height": 24, "width": 24}}}),
     "the image processor gives \\[24, 24\\]"),
    ("idefics3", dict(config={"scale_factor": 3}), "a pixel shuffle of 3 does not divide"),
    ("idefics3", dict(processor={"image_processor": {"max_image_size": {"longest_edge": 48}}}),
     "tiles of 48 pixels for a tower of 32"),
    ("idefics3", dict(processor={"image_seq_len": 10}), "lays out 10 image tokens per tile, the model makes 16"),
    ("idefics3", dict(processor={"image_processor": {"resample": 5}}), "image resampling 5 is not supported"),
    ("qwen2_5_vl", dict(text={"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "mrope_section": [1, 2, 3]}}),
     "rope type 'yarn' is not supported"),
    ("qwen2_5_vl", dict(text={"rope_parameters": {"rope_type": "default", "mrope_section": [2, 2, 3]}}),
     "mrope_section \\[2, 2, 3\\] does not split the 6 frequency pairs"),
    ("qwen2_5_vl", dict(text={"use_sliding_window": True}), "sliding-window attention"),
    ("qwen2_5_vl", dict(vision={"window_size": 4}), "a window of 4 pixels is under one merged token"),
    ("qwen2_5_vl", dict(vision={"rope_parameters": {"rope_type": "yarn"}}), "vision rope type 'yarn'"),
    ("qwen2_5_vl", dict(vision={"out_hidden_size": 40}), "the merger gives 40 features"),
    ("qwen2_5_vl", dict(processor={"image_processor": {"patch_size": 8}}),
     "the image processor's patch_size is 8, the tower's 4"),
    ("qwen2_5_vl", dict(processor={"image_processor": {"image_processor_type": "SiglipImageProcessor"}}),
     "image processor 'SiglipImageProcessor' is not supported"),
    ("paligemma", dict(text={"model_type": "llama"}),
     "language model 'llama' is not supported here \\(gemma, gemma2\\)"),
    ("paligemma", dict(config={"projection_dim": 40}), "the projector gives 40 features, the language model reads 48"),
    ("paligemma", dict(config={"image_token_index": 5000}), "the image token 5000 is outside"),
    ("paligemma", dict(vision={"model_type": "clip_vision_model"}), "no class token"),
    ("paligemma", dict(processor={"image_processor": {"image_seq_length": 50}}),
     "lays out 50 image tokens, the model makes 49"),
    ("paligemma", dict(processor={"image_processor": {"size": {"height": 24, "width": 24}}}),
     "the image processor gives \\[24, 24\\]"),
])
def test_unknown_settings_are_refused_in_words(hf_folders, tmp_path: Path, name: str, planted: dict,
                                                words: str) -> None:
    import models

    folder = _planted(hf_folders, name, tmp_path, **planted)
    with pytest.raises(CheckpointError, match=words):
        models.load(str(folder))


def test_registered_for_the_describe_tab() -> None:
    from models import registry
    from serving import catalogue

    names = [f.name for f in registry.by_tab("describe")]
    assert {"llava", "idefics3", "qwen2_5_vl", "paligemma"} <= set(names)
    assert registry.by_model_type("qwen2_5_vl").name == "qwen2_5_vl"
    assert registry.by_model_type("paligemma").name == "paligemma"
    assert "Qwen/Qwen2.5-VL-3B-Instruct" in catalogue.downloadable("describe")
    assert catalogue.family("Qwen/Qwen2.5-VL-3B-Instruct").name == "qwen2_5_vl"
    assert registry.by_model_type("llava").name == "llava" and registry.by_model_type("idefics3").name == "idefics3"
    assert "HuggingFaceTB/SmolVLM-256M-Instruct" in catalogue.downloadable("describe")
    assert catalogue.family("HuggingFaceTB/SmolVLM-256M-Instruct").name == "idefics3"
    assert "google/paligemma-3b-mix-224" in catalogue.downloadable("describe")
    assert catalogue.family("google/paligemma-3b-mix-224").name == "paligemma"
    assert "google/paligemma-3b-mix-224" in catalogue.GATED
    from models.io.hub import parse_entry

    assert parse_entry("describe:HuggingFaceTB/SmolVLM-500M-Instruct") == (
        "describe", "HuggingFaceTB/SmolVLM-500M-Instruct", None)  # a configured Hub VLM goes to the Image + text tab


def test_speed_bench_runs_at_a_small_size(capsys: pytest.CaptureFixture) -> None:
    """bench/vlm_speed.py --small: the same layout as SmolVLM-256M's (longest side 4 tiles, a pixel shuffle of 4)
    at tiny widths; a 640 × 480 picture becomes 256 × 192, 4 × 3 tiles of 64 plus the global view, 4 tokens each."""
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("bench_vlm_speed", root / "bench" / "vlm_speed.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--small", "--repeats", "1", "--new-tokens", "3"]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["seen"] == [256, 192] and last["tiles"] == 13 and last["image_tokens"] == 13 * 4
    assert 1 <= last["new_tokens"] <= 3 and last["seconds"] == last["seconds_float32"] >= 0
    assert last["seconds_bf16-tiles"] >= 0 and 0 < last["bf16_feature_rel_err"] < 0.05  # bfloat16 moves them a little
    assert last["tiles_image_tokens_sequence"]["global-view"][:2] == [1, 4]  # no tiles: the global view alone


def test_qwen_refuses_a_video_placeholder_in_words(hf_folders) -> None:
    """Images only: a prompt with the video placeholder is refused in words (transformers would need video frames)."""
    ours = hf_folders.get("qwen2_5_vl").model
    with pytest.raises(ValueError, match="video inputs are not supported"):
        ours.describe(images()[0], prompt_of(ours) + "<|vision_start|><|video_pad|><|vision_end|>", max_new_tokens=1)


def test_qwen_reads_the_hubs_folder_layout(hf_folders, tmp_path: Path) -> None:
    """The Hub's Qwen2.5-VL folders predate transformers 5's layout: the text settings at the top level of config.json
    with ``rope_scaling: {"type": "mrope", "mrope_section": …}``, the tower's channels as ``in_chans``, and
    preprocessor_config.json naming ``Qwen2_5_VLImageProcessor`` with ``min_pixels`` / ``max_pixels``. The same weights
    written that way answer exactly as the transformers 5 folder does."""
    import models

    built = hf_folders.get("qwen2_5_vl")
    folder = tmp_path / "hub-layout"
    shutil.copytree(built.path, folder)
    c = json.loads((folder / "config.json").read_text())
    text = c.pop("text_config")
    rope = text.pop("rope_parameters")
    c.update({k: v for k, v in text.items() if k != "model_type"})
    c["rope_theta"] = rope["rope_theta"]
    c["rope_scaling"] = {"type": "mrope", "mrope_section": rope["mrope_section"]}
    c["vision_config"]["in_chans"] = c["vision_config"].pop("in_channels")
    (folder / "config.json").write_text(json.dumps(c))
    p = json.loads((folder / "processor_config.json").read_text())
    pre = p.pop("image_processor")
    size = pre.pop("size")
    pre.update(image_processor_type="Qwen2_5_VLImageProcessor", min_pixels=size["shortest_edge"],
               max_pixels=size["longest_edge"])
    (folder / "preprocessor_config.json").write_text(json.dumps(pre))
    (folder / "processor_config.json").write_text(json.dumps(p))
    hub = models.load(str(folder))
    assert hub.lm.config.mrope_section == (1, 2, 3) and hub.config.processor == built.model.config.processor
    prompt = prompt_of(hub)
    for image in images():
        a, b = hub.describe(image, prompt, max_new_tokens=4), built.model.describe(image, prompt, max_new_tokens=4)
        assert a.ids == b.ids
        np.testing.assert_array_equal(a.attention, b.attention)


def test_qwen_caps_image_tokens_as_the_processors_max_pixels_does(hf_folders, monkeypatch: pytest.MonkeyPatch) -> None:
    """An image over the app's cap on image tokens is read with a smaller pixel budget, exactly as the processor reads
    it with that ``max_pixels`` (its ids, pixels and greedy answer), and the notice says so; over the tower-attention
    budget the tower's attention is left out (the tab's tower view is off), said so, and the answer is unchanged."""
    built = hf_folders.get("qwen2_5_vl")
    hf, ours, proc = built.ref.model, built.model, built.ref.multimodal
    image, prompt = images()[0], prompt_of(ours)
    full = ours.describe(image, prompt, max_new_tokens=4)
    assert len(full.image_positions) == 54 and "image tokens" not in full.notice
    monkeypatch.setattr(ours, "max_image_tokens", 20)
    r = ours.describe(image, prompt, max_new_tokens=4)
    assert len(r.image_positions) == 15 and r.image.shape[:2] == (24, 40)
    assert "40×24 pixels (15 image tokens), not the 72×48" in r.notice and "at most 20 image tokens" in r.notice
    inputs = proc(images=image, text=prompt, return_tensors="pt", size={"shortest_edge": 256, "longest_edge": 20 * 64})
    np.testing.assert_allclose(ours.layout(image).pixels.numpy(), inputs["pixel_values"].numpy(), atol=1e-5)
    with torch.no_grad():
        want = hf.generate(**inputs, max_new_tokens=4, do_sample=False)[0].tolist()
    assert r.ids == want
    monkeypatch.setattr(ours, "tower_cells", 1000)
    bare = ours.describe(image, prompt, max_new_tokens=4)
    assert bare.vision_attention.size == 0 and "tower's attention is not kept" in bare.notice
    assert bare.ids == r.ids  # the tower's fused path (no weights) moves the features by float rounding alone
    np.testing.assert_allclose(bare.attention, r.attention, atol=1e-6)
