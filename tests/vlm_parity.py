"""The vision-language comparison of tests/test_parity.py (kind "vlm"), also used by tests/test_vlm_families.py.

For two images of different sizes and aspect ratios (a wide and a tall one: LLaVA resizes and crops them, Idefics3
lays them out as 2 × 2 and 2 × 1 tiles plus the global view, Qwen2.5-VL resizes them to 72 × 48 and 32 × 88 pixels:
18 × 12 and 8 × 22 patches, the tall one over its pixel budget), against the folder's own transformers processor and
model (eager attention):

- the tower's input: our tiles' pixels equal the processor's ``pixel_values`` (1e-5), and the image we return is
  what those pixels are (un-normalised);
- the prompt: our ids equal the processor's ``input_ids`` and ``r.image_positions`` are exactly where it put the
  image token;
- greedy ids equal to transformers' ``generate``;
- the language model's attention, every layer, over the whole sequence (prompt and new tokens) within 1e-4 of
  transformers' forward over the same ids;
- the tower's attention within 1e-4 (LLaVA, PaliGemma: its one image; Idefics3: the global view, which ``describe``
  returns; Qwen2.5-VL: every block, window and full, over all the patches, which transformers does not return: its
  eager attention's weights are recorded per window and laid back onto the patch grid, ``qwen_tower_attention``);
- PaliGemma: its prompt read both ways (attention above the diagonal inside the prompt, transformers' too), the new
  tokens causally.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

NEW_TOKENS = 8
PROMPT = "User:<image> What is in the picture?\nAssistant:"


def images() -> list[Any]:
    """A wide (70 × 50) and a tall (40 × 90) RGB picture with structure (gradients, a disc, noise)."""
    from PIL import Image

    out = []
    for seed, (h, w) in enumerate(((50, 70), (90, 40))):
        rng = np.random.default_rng(seed)
        y, x = np.mgrid[:h, :w]
        img = np.stack([x * 255 / w, y * 255 / h, 128 + 100 * (((x - w / 2) ** 2 + (y - h / 3) ** 2) < 150)], -1)
        out.append(Image.fromarray(np.clip(img + rng.normal(0, 20, img.shape), 0, 255).astype(np.uint8)))
    return out


def theirs(processor: Any, image: Any, text: str = PROMPT) -> Any:
    return processor(images=image, text=text, return_tensors="pt")


def forward_extra(inputs: Any, t: int) -> dict[str, Any]:
    """The processor's inputs besides the ids, for transformers' forward over ``t`` ids (the prompt and new tokens):
    PaliGemma's token_type_ids go on with 1 (the causal suffix, as its ``generate`` marks new tokens), its training
    labels are left out; Qwen2.5-VL's mm_token_type_ids go on with 0 (text), so its get_rope_index positions the new
    tokens as its generate did."""
    extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask", "labels")}
    for key, value in (("token_type_ids", 1), ("mm_token_type_ids", 0)):
        if key in extra:
            types = extra[key]
            extra[key] = torch.cat([types, types.new_full((1, t - types.size(1)), value)], 1)
    return extra


def tile_pixels(inputs: Any) -> torch.Tensor:
    """The processor's pixel values as (tiles, C, S, S)."""
    pv = inputs["pixel_values"]
    return pv[0] if pv.dim() == 5 else pv


def prompt_of(ours: Any) -> str:
    """PROMPT with the family's own image placeholder (Qwen2.5-VL's in its vision markers)."""
    return PROMPT.replace("<image>", ours.image_prompt)


def qwen_tower_attention(hf: Any, inputs: Any) -> np.ndarray:
    """transformers' Qwen2.5-VL tower attention (blocks, heads, P, P), the patches row-major on the patch grid.

    Its vision attention returns no weights; its eager attention function is called once per window (or once for
    the whole image on a full-attention block) on the patches in transformers' window order. Each call's weights are
    recorded and laid on the block diagonal of that order, which is then undone: window order -> the processor's
    merge-block order (transformers' own ``get_vision_window_index``) -> row-major (its own vision position ids)."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as mq
    from transformers.vision_utils import get_vision_position_ids, get_vision_window_index

    vc, grid = hf.config.vision_config, inputs["image_grid_thw"]
    calls: list[tuple[Any, torch.Tensor]] = []
    original = mq.eager_attention_forward

    def recording(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        out, weights = original(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
        if isinstance(module, mq.Qwen2_5_VLVisionAttention):
            calls.append((module, weights[0]))
        return out, weights

    mq.eager_attention_forward = recording
    try:
        with torch.no_grad():
            hf.model.visual(inputs["pixel_values"], grid_thw=grid)
    finally:
        mq.eager_attention_forward = original
    n, heads = inputs["pixel_values"].size(0), vc.num_heads
    blocks = [b.attn for b in hf.model.visual.blocks]
    window_index, _ = get_vision_window_index(grid, vc.spatial_merge_size, vc.window_size, vc.patch_size)
    unit = vc.spatial_merge_size ** 2
    processor_place = (window_index[:, None] * unit + torch.arange(unit)).reshape(-1)  # window order -> processor's
    hw = get_vision_position_ids(grid, vc.spatial_merge_size)  # (P, 2) row, column in the processor's order
    row_major = hw[:, 0] * int(grid[0, 2]) + hw[:, 1]
    place = row_major[processor_place]  # window order -> row-major
    out = np.zeros((len(blocks), heads, n, n), np.float32)
    for layer, attn in enumerate(blocks):
        chunks = [w for module, w in calls if module is attn]
        full = torch.zeros(heads, n, n)
        at = 0
        for w in chunks:
            full[:, at:at + w.size(-1), at:at + w.size(-1)] = w
            at += w.size(-1)
        assert at == n
        ordered = torch.zeros_like(full)
        ordered[:, place[:, None], place[None, :]] = full
        out[layer] = ordered.numpy()
    return out


def tower_attention(hf: Any, inputs: Any, tile: int = -1) -> np.ndarray:
    """transformers' tower attention (layers, heads, N, N): LLaVA's image, one tile of Idefics3's (the last: the global
    view), Qwen2.5-VL's patches."""
    if hasattr(hf.model, "visual"):
        return qwen_tower_attention(hf, inputs)
    with torch.no_grad():
        if hasattr(hf.model, "vision_tower"):
            out = hf.model.vision_tower(inputs["pixel_values"], output_attentions=True)
        else:
            pv = tile_pixels(inputs)[tile:][:1]
            side = pv.size(-1) // hf.config.vision_config.patch_size
            out = hf.model.vision_model(pixel_values=pv, output_attentions=True,
                                        patch_attention_mask=torch.ones(1, side, side, dtype=torch.bool))
    return torch.stack(out.attentions, 1)[0].numpy()


def compare(hf: Any, processor: Any, ours: Any) -> None:
    """Everything above, for both images."""
    layouts = set()
    prompt_text = prompt_of(ours)
    qwen = ours.config.kind == "qwen2_5_vl"
    for image in images():
        inputs = theirs(processor, image, prompt_text)
        lay = ours.layout(image)
        np.testing.assert_allclose(lay.pixels.numpy(), tile_pixels(inputs).numpy(), atol=1e-5)
        r = ours.describe(image, prompt_text, max_new_tokens=NEW_TOKENS)
        prompt = inputs["input_ids"][0].tolist()
        assert r.ids[: r.prompt_len] == prompt and r.prompt_len == len(prompt)
        want_pos = np.flatnonzero(np.asarray(prompt) == hf.config.image_token_id)
        np.testing.assert_array_equal(r.image_positions, want_pos)
        assert len(r.image_cells) == len(r.image_boxes) == len(want_pos) and len(r.tokens) == len(r.ids)
        with torch.no_grad():
            want = hf.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)[0].tolist()
        assert r.ids == want, (r.ids[len(prompt):], want[len(prompt):])
        assert len(set(r.ids[len(prompt):])) > 1  # the random model does not just repeat one token
        with torch.no_grad():
            ref = hf(input_ids=torch.tensor([r.ids]), output_attentions=True, **forward_extra(inputs, len(r.ids)))
        att = torch.stack(ref.attentions, 1)[0].numpy()  # (layers, heads, T, T)
        assert r.attention.shape == att.shape == (ours.lm.config.n_layers, ours.lm.config.n_heads, len(r.ids),
                                                  len(r.ids))
        np.testing.assert_allclose(r.attention, att, atol=1e-4)
        vision = tower_attention(hf, inputs)
        assert r.vision_attention.shape == vision.shape
        np.testing.assert_allclose(r.vision_attention, vision, atol=1e-4)
        if qwen:  # the patch grid the processor made; its tokens: each 2 × 2 block of it, row-major
            _, gh, gw = inputs["image_grid_thw"][0].tolist()
            m = ours.config.tower.merge
            assert r.vision_grid == (gh, gw) and vision.shape[-1] == gh * gw and r.vision_tile == r.vision_prefix == 0
            assert r.grid == (gh // m, gw // m) and r.image.shape[:2] == (gh * ours.config.tower.patch,
                                                                          gw * ours.config.tower.patch)
            np.testing.assert_allclose(vision.sum(-1), 1.0, atol=1e-5)
        else:
            side = ours.config.tower.grid
            assert r.vision_grid == (side, side) and vision.shape[-1] == r.vision_prefix + side * side
            assert r.vision_tile == r.image_cells[-1, 0] == len(tile_pixels(inputs)) - 1  # the global view: the last
        layouts.add((r.image.shape, len(r.image_positions)))
        prefix = ours.lm.config.prefix_lm
        above = np.triu(np.ones((r.prompt_len, r.prompt_len), bool), 1)
        assert (r.attention[:, :, : r.prompt_len, : r.prompt_len][..., above] > 0).all() == prefix
        assert np.all(np.triu(r.attention[:, :, r.prompt_len:], r.prompt_len + 1) == 0)  # new tokens: causal
    if qwen or (ours.config.kind == "idefics3" and ours.config.processor["split"]):  # two resolutions, two layouts
        assert len(layouts) == 2, layouts
