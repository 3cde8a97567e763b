"""Random-weight vision-language folders written by transformers itself (test-only): LLaVA, Idefics3 / SmolVLM and
Qwen2.5-VL.

Each writer saves a folder as a user would bring one: config.json and model.safetensors from the model class, the
processor (image processor, tokenizer with the image placeholder and, for Idefics3, the tile-position tokens, the
chat template) from the processor class; it returns transformers' model (eval, eager attention) and processor. The
sizes are tiny and deliberately unusual: grouped-query attention, RoPE bases other than 10 000, CLIP's class token
dropped or kept, a list of feature layers concatenated, a SigLIP tower, tiles of 32 pixels in 4-pixel patches with a
pixel shuffle of 2; Qwen2.5-VL's window attention with windows cut by the image's edge, M-RoPE over uneven sections.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VOCAB = 352  # the borrowed byte-level tokenizer's 300 pieces, the added specials, room to spare
IMAGE = "<image>"
IDEFICS_TOKENS = ["<fake_token_around_image>", "<global-img>", "<end_of_utterance>",
                  *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))]
# a chat template in the manner of LLaVA-1.5's and SmolVLM's (content parts: image and text)
CHAT_TEMPLATE = ("{{ bos_token if bos_token else '' }}{% for message in messages %}{{ message['role'] | capitalize }}:"
                 "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>"
                 "{% else %} {{ part['text'] }}{% endif %}{% endfor %}\n{% endfor %}"
                 "{% if add_generation_prompt %}Assistant:{% endif %}")


def _tokenizer(folder: Path, extra: list[str]) -> Any:
    """The byte-level tokenizer of tests/tiny.py with ``<image>`` (and ``extra``) added as special tokens."""
    from transformers import PreTrainedTokenizerFast

    from tests.tiny_families import borrowed_tokenizer

    borrowed_tokenizer(folder)
    tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), bos_token="<|endoftext|>",
                                  eos_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": [IMAGE, *extra]})
    tok.image_token = IMAGE
    return tok


def _text_config(kind: str, **overrides: Any) -> Any:
    import transformers

    common = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=6,
                  num_key_value_heads=3, max_position_embeddings=512, bos_token_id=0, eos_token_id=0,
                  pad_token_id=0, initializer_range=0.1)
    names = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "mistral": "MistralConfig"}
    extra = {"llama": dict(rope_theta=700.0), "qwen2": dict(rope_theta=500.0),
             "mistral": dict(rope_theta=900.0, sliding_window=None)}[kind]
    return getattr(transformers, names[kind])(**{**common, **extra, **overrides})


def _perturb(model: Any) -> None:
    """Norm weights start at 1 and biases at 0: perturb every vector, so a norm or bias read wrongly shows."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)


def llava_folder(folder: Path, text: str = "llama", tower: str = "clip", select: str = "default",
                 layer: int | list[int] = -2, seed: int = 0, **overrides: Any) -> tuple[Any, Any]:
    """A random ``LlavaForConditionalGeneration`` with a CLIP (class token) or SigLIP tower of 30-pixel images in
    6-pixel patches (5 × 5), a GELU projector and a small ``text`` LM; the processor crops to 30 × 30 after resizing
    the shorter side (CLIP's preprocessing). Returns (model, processor)."""
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(folder, [])
    vision = dict(hidden_size=32, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4, image_size=30,
                  patch_size=6, initializer_range=0.1)
    if tower == "clip":
        vc = transformers.CLIPVisionConfig(**vision, projection_dim=16)
        additional = 1
    else:
        vc = transformers.SiglipVisionConfig(**vision)
        additional = 0
    cfg = transformers.LlavaConfig(vision_config=vc, text_config=_text_config(text),
                                   image_token_index=tok.convert_tokens_to_ids(IMAGE), image_seq_length=25,
                                   vision_feature_select_strategy=select, vision_feature_layer=layer,
                                   projector_hidden_act="gelu", **overrides)
    cfg._attn_implementation = "eager"
    for sub in (cfg.vision_config, cfg.text_config):
        sub._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.LlavaForConditionalGeneration(cfg).eval()
    _perturb(model)
    model.save_pretrained(folder, safe_serialization=True)
    images = transformers.CLIPImageProcessor(size={"shortest_edge": 30}, crop_size={"height": 30, "width": 30},
                                             do_center_crop=True, resample=3,
                                             image_mean=[0.48, 0.46, 0.41], image_std=[0.27, 0.26, 0.28])
    processor = transformers.LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=6,
                                            vision_feature_select_strategy=select,
                                            num_additional_image_tokens=additional, chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(folder)
    return model, processor


def idefics3_folder(folder: Path, seed: int = 0, longest: int = 64, split: bool = True,
                    **overrides: Any) -> tuple[Any, Any]:
    """A random ``Idefics3ForConditionalGeneration`` (SmolVLM's layout): a SigLIP-like tower over 32-pixel tiles in
    4-pixel patches (8 × 8), a pixel shuffle of 2 (16 image tokens per tile), a LLaMA LM; the image processor resizes
    the longest side to ``longest``, then to whole tiles, and splits it into tiles plus a global view (LANCZOS, as
    SmolVLM's). Returns (model, processor)."""
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(folder, IDEFICS_TOKENS)
    vc = transformers.Idefics3VisionConfig(hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                                           num_attention_heads=4, image_size=32, patch_size=4, initializer_range=0.1)
    cfg = transformers.Idefics3Config(vision_config=vc, text_config=_text_config("llama"), scale_factor=2,
                                      image_token_id=tok.convert_tokens_to_ids(IMAGE), **overrides)
    cfg._attn_implementation = "eager"
    for sub in (cfg.vision_config, cfg.text_config):
        sub._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.Idefics3ForConditionalGeneration(cfg).eval()
    _perturb(model)
    model.save_pretrained(folder, safe_serialization=True)
    images = transformers.Idefics3ImageProcessor(size={"longest_edge": longest}, max_image_size={"longest_edge": 32},
                                                 do_image_splitting=split, resample=1,
                                                 image_mean=[0.5, 0.45, 0.4], image_std=[0.5, 0.55, 0.6])
    processor = transformers.Idefics3Processor(image_processor=images, tokenizer=tok, image_seq_len=16,
                                               chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(folder)
    return model, processor


# ---------------------------------------------------------------------------------------------------- Qwen2.5-VL
QWEN_TOKENS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|video_pad|>"]
QWEN_IMAGE = "<|image_pad|>"
# Qwen2.5-VL's chat template, shortened (a default system turn, content parts: the image in its vision markers)
QWEN_TEMPLATE = ("{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
                 "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
                 "{% for part in message['content'] %}{% if part['type'] == 'image' %}"
                 "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ part['text'] }}{% endif %}{% endfor %}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def qwen2_5_vl_folder(folder: Path, seed: int = 2, max_pixels: int = 3500, **overrides: Any) -> tuple[Any, Any]:
    """A random ``Qwen2_5_VLForConditionalGeneration``: a tower of 4-pixel patches (two frames each, as the real
    one's), 2D rotary, RMSNorm, a gated SiLU MLP, window attention (windows of 2 × 2 merged tokens, 16 pixels) on
    blocks 0 and 2 and full attention on block 1, the 2 × 2 patch merger; a Qwen2 LM with M-RoPE over sections
    (1, 2, 3) of its 6 frequency pairs and untied output. The image processor resizes to multiples of 8 pixels with at
    most ``max_pixels`` (the tall test image goes over it, the wide one does not). Returns (model, processor)."""
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(folder, [QWEN_IMAGE, *QWEN_TOKENS])
    tok.image_token = QWEN_IMAGE
    tok.video_token = "<|video_pad|>"
    ids = {t: tok.convert_tokens_to_ids(t) for t in (QWEN_IMAGE, *QWEN_TOKENS)}
    vision = dict(depth=3, hidden_size=32, intermediate_size=40, num_heads=4, in_channels=3, patch_size=4,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=16, out_hidden_size=48,
                  fullatt_block_indexes=[1], initializer_range=0.1, rope_parameters={"rope_type": "axial",
                                                                                     "rope_theta": 300.0})
    text = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, bos_token_id=0, eos_token_id=0,
                pad_token_id=0, initializer_range=0.1,
                rope_parameters={"rope_type": "default", "rope_theta": 700.0, "mrope_section": [1, 2, 3]})
    cfg = transformers.Qwen2_5_VLConfig(vision_config=vision, text_config=text, image_token_id=ids[QWEN_IMAGE],
                                        video_token_id=ids["<|video_pad|>"],
                                        vision_start_token_id=ids["<|vision_start|>"],
                                        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False,
                                        **overrides)
    cfg._attn_implementation = "eager"
    for sub in (cfg.vision_config, cfg.text_config):
        sub._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.Qwen2_5_VLForConditionalGeneration(cfg).eval()
    _perturb(model)
    model.save_pretrained(folder, safe_serialization=True)
    images = transformers.Qwen2VLImageProcessor(size={"shortest_edge": 8 * 8 * 4, "longest_edge": max_pixels},
                                                patch_size=4, merge_size=2, temporal_patch_size=2, resample=3,
                                                image_mean=[0.48, 0.46, 0.41], image_std=[0.27, 0.26, 0.28])
    videos = transformers.Qwen2VLVideoProcessor(patch_size=4, merge_size=2, temporal_patch_size=2)
    processor = transformers.Qwen2_5_VLProcessor(image_processor=images, tokenizer=tok, video_processor=videos,
                                                 chat_template=QWEN_TEMPLATE)
    processor.save_pretrained(folder)
    return model, processor


PALIGEMMA_VOCAB = 1480  # the borrowed tokenizer, <image> and <bos>, the processor's 1,152 <locNNNN>/<segNNN> pieces


def paligemma_folder(folder: Path, seed: int = 0, tied: bool = True, text: str = "gemma",
                     **overrides: Any) -> tuple[Any, Any]:
    """A random ``PaliGemmaForConditionalGeneration``: a SigLIP tower over 28-pixel images in 4-pixel patches (7 × 7 =
    49 image tokens, its final LayerNorm), a one-Linear projector, a Gemma LM (heads of 16 over a width of 48, grouped
    key/value heads) whose prompt attends bidirectionally; the image processor resizes to 28 × 28 (bicubic, no crop),
    and the processor lays the prompt out as ``<image>``·49, ``<bos>``, the text, ``\\n``. ``text="gemma2"``:
    PaliGemma 2's Gemma 2 (sandwich norms, attention soft-capped at 3, a window of 24 tokens on layers 0 and 2, shorter
    than the prompt, which still reads itself whole). Returns (model, processor)."""
    import torch
    import transformers

    from tests.tiny_families import borrowed_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    borrowed_tokenizer(folder)
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), bos_token="<bos>",
                                               eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    vc = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=40, num_hidden_layers=3,
                                         num_attention_heads=4, image_size=28, patch_size=4, initializer_range=0.1,
                                         vision_use_head=False)
    images = transformers.SiglipImageProcessor(size={"height": 28, "width": 28}, resample=3,
                                               image_mean=[0.5, 0.45, 0.4], image_std=[0.5, 0.55, 0.6])
    images.image_seq_length = 49
    processor = transformers.PaliGemmaProcessor(image_processor=images, tokenizer=tok)
    common = dict(vocab_size=PALIGEMMA_VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                  num_attention_heads=6, num_key_value_heads=3, head_dim=16, max_position_embeddings=512,
                  rope_theta=400.0, initializer_range=0.1, bos_token_id=tok.bos_token_id,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=tied)
    if text == "gemma2":
        tc = transformers.Gemma2Config(**common, sliding_window=24, query_pre_attn_scalar=20,
                                       attn_logit_softcapping=3.0, final_logit_softcapping=20.0)
    else:
        tc = transformers.GemmaConfig(**common)
    cfg = transformers.PaliGemmaConfig(vision_config=vc, text_config=tc, projection_dim=48, hidden_size=48,
                                       vocab_size=PALIGEMMA_VOCAB, tie_word_embeddings=tied,
                                       image_token_index=processor.image_token_id, **overrides)
    cfg._attn_implementation = "eager"
    for sub in (cfg.vision_config, cfg.text_config):
        sub._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.PaliGemmaForConditionalGeneration(cfg).eval()
    _perturb(model)
    model.save_pretrained(folder, safe_serialization=True)
    processor.save_pretrained(folder)
    _bos_template(folder / "tokenizer.json", "<bos>")
    return model, processor


def _bos_template(path: Path, bos: str) -> None:
    """Make the saved tokenizer.json put ``bos`` first, as Gemma's own does (the PaliGemma processor switches that
    off and places ``<bos>`` itself: a reader that kept the tokenizer's would put it twice)."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    tok = Tokenizer.from_file(str(path))
    b = tok.token_to_id(bos)
    tok.post_processor = TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, b)])
    tok.save(str(path))
