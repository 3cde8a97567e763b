"""Hugging Face vision-language folders read into ``models.families.hf_vlm`` (``llava``, ``idefics3``, ``paligemma``,
``qwen2_5_vl``; issue 63).

A folder holds config.json (``vision_config`` and ``text_config`` inside), model.safetensors, tokenizer.json, the
image processor's settings (preprocessor_config.json, or the ``image_processor`` of transformers 5's
processor_config.json), the processor's (processor_config.json) and a chat template (chat_template.jinja,
chat_template.json, or in processor_config.json / tokenizer_config.json). The tensors are named as transformers 5
saves them (``model.vision_tower.``, ``model.language_model.``, ``model.multi_modal_projector.``; Idefics3's
``model.vision_model.``, ``model.text_model.``, ``model.connector.``) or as the older LLaVA folders on the Hub (and
transformers 5's own PaliGemma folders) do (``vision_tower.``, ``language_model.model.``, ``language_model.lm_head.``,
``multi_modal_projector.``).

The language model is read by the registry's reader of the text config's model_type (``llama``, ``qwen2``, ``mistral``;
PaliGemma's ``gemma`` or PaliGemma 2's ``gemma2``, as a prefix LM: ``models.families.gpt.GPT``). Sub-configs that list
only what differs from transformers' defaults (the older Hub configs do) are completed with those defaults, stated
below. Everything this reader does not implement is refused in words (a CheckpointError), never guessed: other towers or
text models, feature-select strategies other than "default" and "full", feature layers out of range, projector
activations outside ``models.blocks.layers.ACTIVATIONS``, LLaVA's pad-to-square preprocessing, a processor whose
image-token count disagrees with the tower's, Idefics3 tiles of another size than the tower's image (transformers'
fractional position ids for partial tiles), a pixel shuffle that does not divide the grid, a PaliGemma language model
other than Gemma or Gemma 2, a PaliGemma projection wider or narrower than the language model, an image token outside
the vocabulary.

Qwen2.5-VL (``qwen2_5_vl``) has its own tower (``visual.`` or ``model.visual.``: the Conv3d patch embedding, blocks, the
merger) and a Qwen2 LM (``model.`` or ``model.language_model.``) with M-RoPE, read by
``models.io.hf_decoders.qwen2_mrope_from_state``; transformers 5's nested ``text_config`` or the Hub's top-level text
settings with ``rope_scaling: {"type": "mrope"}``; Qwen2VLImageProcessor's pixel budget (``size`` or ``min_pixels`` /
``max_pixels``). Refused in words: rope types other than the default and M-RoPE, sections that do not split a head's
frequency pairs, a sliding-window LM, a vision rope other than axial, windows under one merged token, an image processor
whose patch, merge or frame size differs from the tower's, a merger width that is not the LM's; a prompt holding the
video placeholder is refused by the model (images only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from models import registry
from models.io.checkpoint import CheckpointError

TEXT_TYPES = ("llama", "qwen2", "mistral")  # LLaVA's and Idefics3's language models; PaliGemma's is Gemma
# transformers' config defaults, for sub-configs saved as differences only (LLaVA-1.5's text_config on the Hub)
TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                  num_attention_heads=32, max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=10000.0),
    "qwen2": dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=32768, rms_norm_eps=1e-6,
                  rope_theta=10000.0),
    "mistral": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096 * 32,
                    rms_norm_eps=1e-6, rope_theta=10000.0, sliding_window=4096),
    # GemmaConfig's defaults under PaliGemmaConfig's own for its text sub-config (paligemma-3b's config.json lists
    # only hidden_size, intermediate_size, heads, layers, key/value heads and the vocabulary)
    "gemma": dict(vocab_size=257152, hidden_size=2048, intermediate_size=16384, num_hidden_layers=18,
                  num_attention_heads=8, num_key_value_heads=1, head_dim=256, hidden_act="gelu_pytorch_tanh",
                  max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0),
    # Gemma2Config's (PaliGemma 2's text config lists most of them itself)
    "gemma2": dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                   num_attention_heads=8, num_key_value_heads=4, head_dim=256, hidden_act="gelu_pytorch_tanh",
                   max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0, query_pre_attn_scalar=256,
                   sliding_window=4096, final_logit_softcapping=30.0, attn_logit_softcapping=50.0),
}
# PaliGemmaConfig's SigLIP defaults (paligemma-3b's vision_config does not say its image size)
PALIGEMMA_TOWER = dict(hidden_size=1152, intermediate_size=4096, num_hidden_layers=27, num_attention_heads=16,
                       image_size=224, patch_size=14)
TOWER_DEFAULTS: dict[str, dict[str, Any]] = {
    "clip_vision_model": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                              image_size=224, patch_size=32, hidden_act="quick_gelu", layer_norm_eps=1e-5,
                              num_channels=3),
    "siglip_vision_model": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                num_attention_heads=12, image_size=224, patch_size=16,
                                hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, num_channels=3),
    "idefics3_vision": dict(hidden_size=1152, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=16,
                            image_size=224, patch_size=32, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6,
                            num_channels=3),
}
# image processor defaults by class (what transformers' class uses where the file is silent)
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
PROCESSOR_DEFAULTS: dict[str, dict[str, Any]] = {
    "CLIPImageProcessor": dict(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224},
                               do_center_crop=True, resample=3, image_mean=CLIP_MEAN, image_std=CLIP_STD),
    "LlavaImageProcessor": dict(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224},
                                do_center_crop=True, resample=3, image_mean=CLIP_MEAN, image_std=CLIP_STD,
                                do_pad=False),
    "SiglipImageProcessor": dict(size={"height": 224, "width": 224}, resample=3, image_mean=[0.5] * 3,
                                 image_std=[0.5] * 3, do_center_crop=False),
    "Idefics3ImageProcessor": dict(size={"longest_edge": 4 * 364}, max_image_size={"longest_edge": 364}, resample=1,
                                   image_mean=[0.5] * 3, image_std=[0.5] * 3, do_image_splitting=True),
}
# PIL resample codes -> torchvision modes, as transformers maps them (NEAREST is "nearest-exact": pixel centres)
_RESAMPLE = {0: "nearest-exact", 1: "lanczos", 2: "bilinear", 3: "bicubic"}


# ------------------------------------------------------------------------------------------------ the folder
def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(path, f"unreadable: {err}") from None
    return data if isinstance(data, dict) else {}


def _square_spec(pre: dict[str, Any], tower: Any, where: Path) -> dict[str, Any]:
    """The image processor's settings for a tower that reads one square image (LLaVA, PaliGemma), or refused in words
    where they give another size."""
    from models.inputs.images import processor_spec

    try:
        spec = processor_spec(pre, tower.image_size)
    except ValueError as err:
        raise CheckpointError(where, str(err)) from None
    side = spec["crop"] or spec["size"]
    if side != [tower.image_size, tower.image_size]:
        raise CheckpointError(where, f"the image processor gives {side or 'images of varying size'}, the tower reads "
                                     f"{tower.image_size}×{tower.image_size}")
    return spec


def _image_processor(folder: Path, where: Path) -> tuple[dict[str, Any], str]:
    """(the image processor's settings with its class's defaults filled in, its class name)."""
    pre = _json(folder / "preprocessor_config.json") or _json(folder / "processor_config.json").get(
        "image_processor") or {}
    if not pre:
        raise CheckpointError(folder / "preprocessor_config.json", "no image processor settings in the folder")
    kind = str(pre.get("image_processor_type", "")).removesuffix("Fast")
    if kind not in PROCESSOR_DEFAULTS:
        raise CheckpointError(where, f"image processor {kind or 'of no type'!r} is not supported "
                                     f"({', '.join(PROCESSOR_DEFAULTS)})")
    return {**PROCESSOR_DEFAULTS[kind], **pre}, kind


def _chat_template(folder: Path) -> str:
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    for name in ("chat_template.json", "processor_config.json", "tokenizer_config.json"):
        value = _json(folder / name).get("chat_template")
        if isinstance(value, list):  # named templates: the default one
            value = next((t.get("template") for t in value if isinstance(t, dict) and t.get("name") == "default"),
                         None)
        if isinstance(value, str) and value:
            return value
    return ""


def _specials(folder: Path) -> dict[str, str]:
    config = _json(folder / "tokenizer_config.json")
    out = {}
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        out[key] = value if isinstance(value, str) else ""
    return out


def _tokenizer(folder: Path) -> Any:
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as err:  # missing or unreadable
        raise CheckpointError(path, f"no usable tokenizer: {err}") from None
    tok.no_truncation()
    tok.no_padding()
    return tok


def _eos_ids(folder: Path, hf: dict[str, Any], text: dict[str, Any]) -> tuple[int, ...]:
    """The ids generation stops after: generation_config.json's (transformers' generate reads it), else the
    config's."""
    for source in (_json(folder / "generation_config.json"), text, hf):
        value = source.get("eos_token_id")
        if value is not None:
            return tuple(int(v) for v in (value if isinstance(value, list) else [value]))
    return ()


# ------------------------------------------------------------------------------------------------ the parts
def _split_state(state: dict[str, Tensor], tower: tuple[str, ...], lm: tuple[str, ...], head: tuple[str, ...],
                 projector: tuple[str, ...]) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, Tensor]]:
    """(tower tensors without prefix, the LM's as a causal LM names them (``model.`` + …, ``lm_head.weight``),
    the projector's without prefix)."""
    t, m, p = {}, {}, {}
    for key, value in state.items():
        if any(key.startswith(x) for x in tower):
            t[key[len(next(x for x in tower if key.startswith(x))):]] = value
        elif any(key.startswith(x) for x in projector):
            p[key[len(next(x for x in projector if key.startswith(x))):]] = value
        elif key in head:
            m["lm_head.weight"] = value
        elif any(key.startswith(x) for x in lm):
            m["model." + key[len(next(x for x in lm if key.startswith(x))):]] = value
    return t, m, p


def _tower_config(vision: dict[str, Any], where: Path, post_norm: bool) -> Any:
    from models.blocks.layers import ACTIVATIONS
    from models.families.hf_vlm import TowerConfig

    kind = vision.get("model_type", "clip_vision_model")
    if kind not in TOWER_DEFAULTS:
        raise CheckpointError(where, f"vision tower {kind!r} is not supported ({', '.join(TOWER_DEFAULTS)})")
    v = {**TOWER_DEFAULTS[kind], **vision}
    if v["hidden_act"] not in ACTIVATIONS:
        raise CheckpointError(where, f"vision tower activation {v['hidden_act']!r} is not supported")
    act = v["hidden_act"]
    size, patch = int(v["image_size"]), int(v["patch_size"])
    if size % patch:
        raise CheckpointError(where, f"a tower image of {size} pixels is not whole {patch}-pixel patches")
    clip = kind == "clip_vision_model"
    return TowerConfig(image_size=size, patch=patch, channels=int(v["num_channels"]), dim=int(v["hidden_size"]),
                       depth=int(v["num_hidden_layers"]), heads=int(v["num_attention_heads"]),
                       mlp_dim=int(v["intermediate_size"]), act=act, norm_eps=float(v["layer_norm_eps"]),
                       class_token=clip, pre_norm=clip, post_norm=post_norm, patch_bias=not clip)


def _tower_state(s: dict[str, Tensor], c: Any) -> dict[str, Tensor]:
    s = {k.removeprefix("vision_model."): v for k, v in s.items()}
    ours = {"patch_embed.weight": s["embeddings.patch_embedding.weight"],
            "pos_embed": s["embeddings.position_embedding.weight"]}
    if c.patch_bias:
        ours["patch_embed.bias"] = s["embeddings.patch_embedding.bias"]
    if c.class_token:
        ours["class_token"] = s["embeddings.class_embedding"]
    if c.pre_norm:
        for kind in ("weight", "bias"):
            ours[f"pre_norm.{kind}"] = s[f"pre_layrnorm.{kind}"]
    if c.post_norm:
        for kind in ("weight", "bias"):
            ours[f"post_norm.{kind}"] = s[f"post_layernorm.{kind}"]
    names = {"layer_norm1": "ln_1", "layer_norm2": "ln_2", "self_attn.q_proj": "attn.q_proj",
             "self_attn.k_proj": "attn.k_proj", "self_attn.v_proj": "attn.v_proj",
             "self_attn.out_proj": "attn.out_proj", "mlp.fc1": "fc1", "mlp.fc2": "fc2"}
    for i in range(c.depth):
        for theirs, mine in names.items():
            for kind in ("weight", "bias"):
                ours[f"blocks.{i}.{mine}.{kind}"] = s[f"encoder.layers.{i}.{theirs}.{kind}"]
    return {f"tower.{k}": v for k, v in ours.items()}


def _language_model(hf: dict[str, Any], lm_state: dict[str, Tensor], where: Path,
                    types: tuple[str, ...] = TEXT_TYPES) -> tuple[Any, dict[str, Any]]:
    text = dict(hf.get("text_config") or {})
    kind = text.get("model_type", types[0])
    if kind not in types:
        raise CheckpointError(where, f"language model {kind!r} is not supported here ({', '.join(types)})")
    text = {**TEXT_DEFAULTS[kind], **text}
    tied = bool(hf.get("tie_word_embeddings") or text.get("tie_word_embeddings"))
    text["tie_word_embeddings"] = tied
    if not tied and "lm_head.weight" not in lm_state:
        raise CheckpointError(where, "the config says the output projection is its own, and the folder has none")
    if kind in ("gemma", "gemma2"):  # PaliGemma's (1, 2): its prompt attends both ways (use_bidirectional_attention)
        from models.io.hf_decoders import gemma2_from_state, gemma_from_state

        reader = gemma_from_state if kind == "gemma" else gemma2_from_state
        return reader(text, lm_state, where, prefix_lm=True), text
    family = registry.by_model_type(kind)
    assert family is not None
    lm = family.hf_reader(kind)(text, lm_state, where)
    return lm, text


def _load(model: Any, ours: dict[str, Tensor], where: Path, name: str) -> Any:
    missing, unexpected = model.load_state_dict({k: v.float().contiguous() for k, v in ours.items()}, strict=False)
    missing = [k for k in missing if not k.startswith("lm.")]  # the GPT was loaded by its own reader
    if missing or unexpected:
        raise CheckpointError(where, f"weights do not fit {name}: missing {missing}, unexpected {unexpected}")
    return model.float().eval()


def _attach(model: Any, folder: Path) -> Any:
    model.tokenizer = _tokenizer(folder)
    return model


# ------------------------------------------------------------------------------------------------ LLaVA
def llava_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json") -> Any:
    """``LlavaForConditionalGeneration`` config and weights -> ``models.families.hf_vlm.Llava`` with its tokenizer,
    image preprocessing and chat template (read from the folder beside ``where``)."""
    from models.blocks.layers import ACTIVATIONS
    from models.families.hf_vlm import HFVLMConfig, Llava, LlavaProjector

    where = Path(where)
    folder = where.parent
    tower = _tower_config(dict(hf.get("vision_config") or {}), where, post_norm=False)
    select = hf.get("vision_feature_select_strategy", "default")
    if select not in ("default", "full"):
        raise CheckpointError(where, f"vision_feature_select_strategy {select!r} is not supported ('default' drops "
                                     "the first token, 'full' keeps every token)")
    layer = hf.get("vision_feature_layer", -2)
    layers = [layer] if isinstance(layer, int) else list(layer) if isinstance(layer, list) else None
    if not layers or any(not isinstance(x, int) or not -(tower.depth + 1) <= x <= tower.depth for x in layers):
        raise CheckpointError(where, f"vision_feature_layer {layer!r} is not a hidden state of the "
                                     f"{tower.depth}-block tower (-{tower.depth + 1} to {tower.depth})")
    act = hf.get("projector_hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise CheckpointError(where, f"projector activation {act!r} is not supported ({', '.join(ACTIVATIONS)})")
    pre, kind = _image_processor(folder, where)
    if pre.get("do_pad"):
        raise CheckpointError(where, "LLaVA's pad-to-square preprocessing (do_pad) is not supported")
    spec = _square_spec(pre, tower, where)
    tokens = tower.grid ** 2 + int(tower.class_token) - (select == "default")
    proc = _json(folder / "processor_config.json")
    if "patch_size" in proc and proc.get("patch_size") is not None:
        says = (tower.image_size // int(proc["patch_size"])) ** 2 + int(proc.get("num_additional_image_tokens", 0))
        says -= proc.get("vision_feature_select_strategy") == "default"
        if says != tokens:
            raise CheckpointError(folder / "processor_config.json",
                                  f"the processor lays out {says} image tokens, the model makes {tokens}")
    tower_state, lm_state, proj_state = _split_state(
        state, ("model.vision_tower.", "vision_tower."), ("model.language_model.", "language_model.model."),
        ("lm_head.weight", "language_model.lm_head.weight"), ("model.multi_modal_projector.", "multi_modal_projector."))
    lm, text = _language_model(hf, lm_state, where)
    d_in = tower.dim * len(layers)
    config = HFVLMConfig(kind="llava", tower=tower, image_token_id=int(hf.get("image_token_index",
                                                                               hf.get("image_token_id", 32000))),
                         text_type=text.get("model_type", "llama"), feature_layers=tuple(layers), select=select,
                         projector_act=act, processor=spec, chat_template=_chat_template(folder),
                         specials=_specials(folder), eos_ids=_eos_ids(folder, hf, text))
    bias = bool(hf.get("multimodal_projector_bias", True))
    model = Llava(config, LlavaProjector(d_in, lm.config.d_model, act, bias), lm)
    ours = _tower_state(tower_state, tower)
    for k, v in proj_state.items():
        ours[f"projector.{k}"] = v
    return _attach(_load(model, ours, where, "LLaVA"), folder)


# ------------------------------------------------------------------------------------------------ Idefics3
def idefics3_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json") -> Any:
    """``Idefics3ForConditionalGeneration`` (SmolVLM v1) config and weights -> ``models.families.hf_vlm.Idefics3``
    with its tokenizer, tiling and chat template."""
    from models.families.hf_vlm import HFVLMConfig, Idefics3, Idefics3Connector

    where = Path(where)
    folder = where.parent
    # the tower of an Idefics3 model is always its SigLIP-like vision transformer (SmolVLM's sub-config names the
    # model_type "idefics3" or "idefics3_vision")
    tower = _tower_config({**(hf.get("vision_config") or {}), "model_type": "idefics3_vision"}, where,
                          post_norm=True)
    scale = int(hf.get("scale_factor", 2))
    if scale < 1 or tower.grid % scale:
        raise CheckpointError(where, f"a pixel shuffle of {scale} does not divide the tower's {tower.grid}-patch grid")
    pre, _ = _image_processor(folder, where)
    tile = int((pre.get("max_image_size") or {}).get("longest_edge", 0))
    if tile != tower.image_size:
        raise CheckpointError(where, f"tiles of {tile} pixels for a tower of {tower.image_size} (transformers' "
                                     "fractional positions for such tiles are not implemented)")
    resample = pre.get("resample", 1)
    if resample not in _RESAMPLE:
        raise CheckpointError(where, f"image resampling {resample!r} is not supported ({_RESAMPLE})")
    size = pre.get("size") or {}
    if pre.get("do_resize", True) and "longest_edge" not in size:
        raise CheckpointError(where, f"image processor size {size!r} is not supported (longest_edge)")
    normalise = pre.get("do_normalize", True)
    spec = {"resize": bool(pre.get("do_resize", True)), "longest_edge": int(size.get("longest_edge", 0)),
            "split": bool(pre.get("do_image_splitting", True)), "tile": tile, "interpolation": _RESAMPLE[resample],
            "rescale": float(pre.get("rescale_factor", 1 / 255)) if pre.get("do_rescale", True) else None,
            "mean": [float(v) for v in pre["image_mean"]] if normalise else None,
            "std": [float(v) for v in pre["image_std"]] if normalise else None}
    per_tile = (tower.grid // scale) ** 2
    seq = int(_json(folder / "processor_config.json").get("image_seq_len", per_tile))
    if seq != per_tile:
        raise CheckpointError(where, f"the processor lays out {seq} image tokens per tile, the model makes "
                                     f"{per_tile}")
    tower_state, lm_state, proj_state = _split_state(
        state, ("model.vision_model.",), ("model.text_model.",), ("lm_head.weight",), ("model.connector.",))
    lm, text = _language_model(hf, lm_state, where)
    config = HFVLMConfig(kind="idefics3", tower=tower, image_token_id=int(hf.get("image_token_id", 128257)),
                         text_type=text.get("model_type", "llama"), scale_factor=scale, image_seq_len=per_tile,
                         processor=spec, chat_template=_chat_template(folder), specials=_specials(folder),
                         eos_ids=_eos_ids(folder, hf, text))
    model = Idefics3(config, Idefics3Connector(tower.dim, lm.config.d_model, scale), lm)
    ours = _tower_state({f"vision_model.{k}": v for k, v in tower_state.items()}, tower)
    ours["projector.proj.weight"] = proj_state["modality_projection.proj.weight"]
    return _attach(_load(model, ours, where, "Idefics3"), folder)


# ------------------------------------------------------------------------------------------------ Qwen2.5-VL
QWEN_PROCESSORS = ("Qwen2VLImageProcessor", "Qwen2_5_VLImageProcessor")  # the second: the Hub's older name
# transformers' defaults (Qwen2VLImageProcessor, Qwen2_5_VLVisionConfig, Qwen2_5_VLTextConfig) where a file is silent
QWEN_PROCESSOR_DEFAULTS: dict[str, Any] = dict(size={"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280},
                                               resample=3, image_mean=CLIP_MEAN, image_std=CLIP_STD, patch_size=14,
                                               temporal_patch_size=2, merge_size=2)
QWEN_VISION_DEFAULTS: dict[str, Any] = dict(depth=32, hidden_size=3584, hidden_act="silu", intermediate_size=3420,
                                            num_heads=16, in_channels=3, patch_size=14, spatial_merge_size=2,
                                            temporal_patch_size=2, window_size=112, out_hidden_size=3584,
                                            fullatt_block_indexes=[7, 15, 23, 31])
QWEN_TEXT_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps", "use_sliding_window",
                  "sliding_window", "max_window_layers", "layer_types", "rope_parameters", "rope_scaling",
                  "rope_theta", "bos_token_id", "eos_token_id", "tie_word_embeddings", "attention_dropout")
QWEN_TEXT_DEFAULTS: dict[str, Any] = dict(vocab_size=152064, hidden_size=8192, intermediate_size=29568,
                                          num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                                          max_position_embeddings=32768, rms_norm_eps=1e-5)


def _qwen_text(hf: dict[str, Any], where: Path) -> tuple[dict[str, Any], tuple[int, ...]]:
    """(the text config as a ``qwen2`` one, its M-RoPE sections). transformers 5 nests it in ``text_config``; the
    Hub's folders keep it at the top level with ``rope_scaling: {"type": "mrope", "mrope_section": …}``."""
    text = dict(hf.get("text_config") or {k: hf[k] for k in QWEN_TEXT_KEYS if k in hf})
    text = {**QWEN_TEXT_DEFAULTS, **text}
    rope = {**(text.pop("rope_scaling", None) or {}), **(text.pop("rope_parameters", None) or {})}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", "mrope"):
        raise CheckpointError(where, f"rope type {kind!r} is not supported (M-RoPE over the default rotation only)")
    sections = rope.get("mrope_section", [16, 24, 24])
    if not isinstance(sections, list) or not sections or any(not isinstance(x, int) or x < 1 for x in sections):
        raise CheckpointError(where, f"mrope_section {sections!r} is not a list of sizes")
    if text.get("use_sliding_window"):
        raise CheckpointError(where, "sliding-window attention in the language model is not supported (transformers "
                                     "does not run it outside flash attention either)")
    theta = rope.get("rope_theta") or text.get("rope_theta") or 1000000.0
    extra = {k: v for k, v in rope.items() if k not in ("rope_type", "type", "rope_theta", "mrope_section")}
    if extra:
        raise CheckpointError(where, f"rope settings {sorted(extra)} are not supported")
    text.update(model_type="qwen2", rope_theta=float(theta), use_sliding_window=False)
    text.pop("layer_types", None)
    d_half = int(text.get("head_dim") or int(text["hidden_size"]) // int(text["num_attention_heads"])) // 2
    if sum(sections) != d_half:
        raise CheckpointError(where, f"mrope_section {sections} does not split the {d_half} frequency pairs of a head")
    return text, tuple(sections)


def _qwen_processor(folder: Path, where: Path, tower: Any) -> dict[str, Any]:
    pre = _json(folder / "preprocessor_config.json") or _json(folder / "processor_config.json").get(
        "image_processor") or {}
    if not pre:
        raise CheckpointError(folder / "preprocessor_config.json", "no image processor settings in the folder")
    kind = str(pre.get("image_processor_type", "")).removesuffix("Fast").removesuffix("Pil")
    if kind not in QWEN_PROCESSORS:
        raise CheckpointError(where, f"image processor {kind or 'of no type'!r} is not supported "
                                     f"({', '.join(QWEN_PROCESSORS)})")
    pre = {**QWEN_PROCESSOR_DEFAULTS, **pre}
    size = dict(pre.get("size") or {})
    for key, name in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):  # they override size
        if pre.get(key) is not None:
            size[name] = pre[key]
    if not pre.get("do_resize", True):
        raise CheckpointError(where, "an image processor without resizing (do_resize false) is not supported")
    if not size.get("shortest_edge") or not size.get("longest_edge"):
        raise CheckpointError(where, f"image processor size {size!r} needs shortest_edge and longest_edge (the pixel "
                                     "budget)")
    for key, ours in (("patch_size", tower.patch), ("merge_size", tower.merge),
                      ("temporal_patch_size", tower.temporal)):
        if int(pre[key]) != ours:
            raise CheckpointError(where, f"the image processor's {key} is {pre[key]}, the tower's {ours}")
    resample = pre.get("resample", 3)
    if resample not in (0, 2, 3):
        raise CheckpointError(where, f"image resampling {resample!r} is not supported (nearest, bilinear, bicubic)")
    normalise = pre.get("do_normalize", True)
    return {"factor": tower.patch * tower.merge, "min_pixels": int(size["shortest_edge"]),
            "max_pixels": int(size["longest_edge"]), "interpolation": _RESAMPLE[resample],
            "rescale": float(pre.get("rescale_factor", 1 / 255)) if pre.get("do_rescale", True) else None,
            "mean": [float(v) for v in pre["image_mean"]] if normalise else None,
            "std": [float(v) for v in pre["image_std"]] if normalise else None}


def qwen2_5_vl_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json") -> Any:
    """``Qwen2_5_VLForConditionalGeneration`` config and weights -> ``models.families.hf_vlm.Qwen25VL`` with its
    tokenizer, dynamic-resolution preprocessing and chat template. Images only: video inputs (the tower reads them,
    the reader does not) are refused where asked for (a prompt's video placeholder is plain text here)."""
    from models.blocks.layers import ACTIVATIONS
    from models.families.hf_vlm import HFVLMConfig, Qwen25VL, QwenTowerConfig
    from models.io.hf_decoders import qwen2_mrope_from_state

    where = Path(where)
    folder = where.parent
    v = {**QWEN_VISION_DEFAULTS, **(hf.get("vision_config") or {})}
    vrope = v.get("rope_parameters") or {}
    if vrope.get("rope_type", "axial") != "axial":
        raise CheckpointError(where, f"vision rope type {vrope.get('rope_type')!r} is not supported (axial)")
    if v["hidden_act"] not in ACTIVATIONS:
        raise CheckpointError(where, f"vision tower activation {v['hidden_act']!r} is not supported")
    tower = QwenTowerConfig(patch=int(v["patch_size"]), temporal=int(v["temporal_patch_size"]),
                            channels=int(v.get("in_chans", v["in_channels"])), dim=int(v["hidden_size"]),
                            depth=int(v["depth"]),
                            heads=int(v["num_heads"]), mlp_dim=int(v["intermediate_size"]), act=v["hidden_act"],
                            merge=int(v["spatial_merge_size"]), window=int(v["window_size"]),
                            full_blocks=tuple(int(i) for i in v["fullatt_block_indexes"]),
                            out_dim=int(v["out_hidden_size"]), rope_theta=float(vrope.get("rope_theta", 10000.0)))
    if tower.window_tokens < 1:
        raise CheckpointError(where, f"a window of {tower.window} pixels is under one merged token "
                                     f"({tower.merge * tower.patch} pixels)")
    if tower.dim % tower.heads or (tower.dim // tower.heads) % 4:
        raise CheckpointError(where, f"tower heads of {tower.dim / tower.heads:g} dimensions cannot be split into "
                                     "the row and column rotations")
    text, sections = _qwen_text(hf, where)
    if int(text["hidden_size"]) != tower.out_dim:
        raise CheckpointError(where, f"the merger gives {tower.out_dim} features, the language model reads "
                                     f"{text['hidden_size']}")
    text["tie_word_embeddings"] = bool(hf.get("tie_word_embeddings") or text.get("tie_word_embeddings"))
    spec = _qwen_processor(folder, where, tower)
    spec["video_token_id"] = int(hf.get("video_token_id", 151656))  # refused in a prompt: images only
    tower_state, lm_state, _ = _split_state(state, ("model.visual.", "visual."), ("model.language_model.", "model."),
                                            ("lm_head.weight",), ())
    if not text["tie_word_embeddings"] and "lm_head.weight" not in lm_state:
        raise CheckpointError(where, "the config says the output projection is its own, and the folder has none")
    lm = qwen2_mrope_from_state(text, lm_state, where, sections)
    config = HFVLMConfig(kind="qwen2_5_vl", tower=tower, image_token_id=int(hf.get("image_token_id", 151655)),
                         text_type="qwen2", processor=spec, chat_template=_chat_template(folder),
                         specials=_specials(folder), eos_ids=_eos_ids(folder, hf, text), scale_factor=tower.merge)
    model = Qwen25VL(config, nn.Identity(), lm)  # no projector: the merger ends the tower
    t = tower_state
    ours = {"tower.patch_embed.weight": t["patch_embed.proj.weight"].reshape(tower.dim, -1),
            "tower.merger_norm.weight": t["merger.ln_q.weight"],
            "tower.merger_fc1.weight": t["merger.mlp.0.weight"], "tower.merger_fc1.bias": t["merger.mlp.0.bias"],
            "tower.merger_fc2.weight": t["merger.mlp.2.weight"], "tower.merger_fc2.bias": t["merger.mlp.2.bias"]}
    names = ("norm1.weight", "norm2.weight", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
             "attn.proj.bias", "mlp.gate_proj.weight", "mlp.gate_proj.bias", "mlp.up_proj.weight", "mlp.up_proj.bias",
             "mlp.down_proj.weight", "mlp.down_proj.bias")
    try:
        for i in range(tower.depth):
            for name in names:
                ours[f"tower.blocks.{i}.{name.removeprefix('attn.').removeprefix('mlp.')}"] = t[f"blocks.{i}.{name}"]
    except KeyError as err:
        raise CheckpointError(where, f"the tower's weights lack {err}") from None
    return _attach(_load(model, ours, where, "Qwen2.5-VL"), folder)


# ------------------------------------------------------------------------------------------------ PaliGemma
def paligemma_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json") -> Any:
    """``PaliGemmaForConditionalGeneration`` (a SigLIP tower, one Linear, Gemma (PaliGemma 1) or Gemma 2 (2)) ->
    ``models.families.hf_vlm.PaliGemma`` with its tokenizer and image preprocessing."""
    from torch import nn

    from models.families.hf_vlm import HFVLMConfig, PaliGemma

    where = Path(where)
    folder = where.parent
    text_type = (hf.get("text_config") or {}).get("model_type", "gemma")
    vision = {**PALIGEMMA_TOWER, **(hf.get("vision_config") or {})}
    tower = _tower_config({**vision, "model_type": vision.get("model_type", "siglip_vision_model")}, where,
                          post_norm=True)
    if tower.class_token:
        raise CheckpointError(where, "PaliGemma's tower is SigLIP's (no class token), the folder names CLIP's")
    pre, _ = _image_processor(folder, where)
    spec = _square_spec(pre, tower, where)
    tokens = tower.grid ** 2
    says = pre.get("image_seq_length", tokens)
    if says != tokens:
        raise CheckpointError(where, f"the processor lays out {says} image tokens, the model makes {tokens}")
    specials = _specials(folder)
    if not specials["bos_token"]:
        raise CheckpointError(folder / "tokenizer_config.json", "no bos_token: PaliGemma's processor puts it after "
                                                                "the image")
    tower_state, lm_state, proj_state = _split_state(
        state, ("model.vision_tower.", "vision_tower."), ("model.language_model.", "language_model.model."),
        ("lm_head.weight", "language_model.lm_head.weight"), ("model.multi_modal_projector.", "multi_modal_projector."))
    lm, text = _language_model(hf, lm_state, where, ("gemma", "gemma2"))
    width = int(hf.get("projection_dim", vision.get("projection_dim", 2048)))
    if width != lm.config.d_model:
        raise CheckpointError(where, f"the projector gives {width} features, the language model reads "
                                     f"{lm.config.d_model}")
    image_token = int(hf.get("image_token_index", hf.get("image_token_id", 256000)))
    if not 0 <= image_token < lm.config.vocab_size:
        raise CheckpointError(where, f"the image token {image_token} is outside the {lm.config.vocab_size}-token "
                                     "vocabulary (transformers then embeds it as the padding id; not implemented)")
    config = HFVLMConfig(kind="paligemma", tower=tower, image_token_id=image_token, text_type=text_type,
                         feature_layers=(-1,), select="full", projector_act="", processor=spec,
                         chat_template=_chat_template(folder), specials=specials, eos_ids=_eos_ids(folder, hf, text))
    model = PaliGemma(config, nn.Linear(tower.dim, width), lm)
    ours = _tower_state(tower_state, tower)
    for kind in ("weight", "bias"):
        ours[f"projector.{kind}"] = proj_state[f"linear.{kind}"]
    return _attach(_load(model, ours, where, "PaliGemma"), folder)
