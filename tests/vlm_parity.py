"""The vision-language comparison of tests/test_parity.py (kind "vlm"), also used by tests/test_vlm_families.py.

For two images of different sizes and aspect ratios (a wide and a tall one: LLaVA resizes and crops them, Idefics3
lays them out as 2 × 2 and 2 × 1 tiles plus the global view), against the folder's own transformers processor and
model (eager attention):

- the tower's input: our tiles' pixels equal the processor's ``pixel_values`` (1e-5), and the image we return is
  what those pixels are (un-normalised);
- the prompt: our ids equal the processor's ``input_ids`` and ``r.image_positions`` are exactly where it put the
  image token;
- greedy ids equal to transformers' ``generate``;
- the language model's attention, every layer, over the whole sequence (prompt and new tokens) within 1e-4 of
  transformers' forward over the same ids;
- the tower's attention within 1e-4 (LLaVA, PaliGemma: its one image; Idefics3: the global view, which ``describe``
  returns);
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
    labels are left out."""
    extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask", "labels")}
    if "token_type_ids" in extra:
        types = extra["token_type_ids"]
        extra["token_type_ids"] = torch.cat([types, types.new_ones((1, t - types.size(1)))], 1)
    return extra


def tile_pixels(inputs: Any) -> torch.Tensor:
    """The processor's pixel values as (tiles, C, S, S)."""
    pv = inputs["pixel_values"]
    return pv[0] if pv.dim() == 5 else pv


def tower_attention(hf: Any, inputs: Any) -> np.ndarray:
    """transformers' tower attention (layers, heads, N, N): LLaVA's image, Idefics3's global view (the last tile)."""
    with torch.no_grad():
        if hasattr(hf.model, "vision_tower"):
            out = hf.model.vision_tower(inputs["pixel_values"], output_attentions=True)
        else:
            pv = tile_pixels(inputs)[-1:]
            side = pv.size(-1) // hf.config.vision_config.patch_size
            out = hf.model.vision_model(pixel_values=pv, output_attentions=True,
                                        patch_attention_mask=torch.ones(1, side, side, dtype=torch.bool))
    return torch.stack(out.attentions, 1)[0].numpy()


def compare(hf: Any, processor: Any, ours: Any) -> None:
    """Everything above, for both images."""
    layouts = set()
    for image in images():
        inputs = theirs(processor, image)
        lay = ours.layout(image)
        np.testing.assert_allclose(lay.pixels.numpy(), tile_pixels(inputs).numpy(), atol=1e-5)
        r = ours.describe(image, PROMPT, max_new_tokens=NEW_TOKENS)
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
        side = ours.config.tower.grid
        assert r.vision_grid == (side, side) and vision.shape[-1] == r.vision_prefix + side * side
        assert r.vision_tile == r.image_cells[-1, 0] == len(tile_pixels(inputs)) - 1  # the global view: the last
        layouts.add((r.image.shape, len(r.image_positions)))
        prefix = ours.lm.config.prefix_lm
        above = np.triu(np.ones((r.prompt_len, r.prompt_len), bool), 1)
        assert (r.attention[:, :, : r.prompt_len, : r.prompt_len][..., above] > 0).all() == prefix
        assert np.all(np.triu(r.attention[:, :, r.prompt_len:], r.prompt_len + 1) == 0)  # new tokens: causal
    if ours.config.kind == "idefics3" and ours.config.processor["split"]:  # 2 × 2 and 2 × 1 tiles
        assert len(layouts) == 2, layouts
