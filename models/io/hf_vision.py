"""Hugging Face Swin folders (``SwinForImageClassification``: microsoft/swin-tiny-patch4-window7-224 and relatives)
read into ``models.families.swin.Swin`` (transformers is never imported here; the registry names the reader,
``models.io.hf.load_hf`` calls it and adds the folder's preprocessing).

Hugging Face's Swin is the paper's, as torchvision's (which ``Swin`` follows): a patch convolution and LayerNorm, stages
of pre-norm blocks alternating regular and shifted windows with a learned relative position bias per head, a patch
merging (the four 2 × 2 neighbours concatenated in the same order, LayerNorm, a linear reduction without bias) after
every stage but the last, a final LayerNorm, the mean over tokens and a linear classifier. Its q, k and v are three
matrices, joined here into ``qkv``. A grid that is not a multiple of the window is padded at the bottom and right to
one (zeros after the block's first LayerNorm, attended to as keys like any token; the shifted blocks' regions computed
on the padded grid), as both do, and a stage whose grid is exactly the window drops its shift. Where a stage's grid is
smaller than the window, transformers shrinks the window to the grid but keeps the full window's bias table (and fails
on the shapes) while torchvision pads, so such a folder is refused (the published models' last grid is their window).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from models.io.checkpoint import CheckpointError


def swin_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json") -> Any:
    """``SwinForImageClassification`` config and weights -> Swin, without its preprocessing (load_hf adds it)."""
    from models.families.swin import Swin, SwinConfig

    where = Path(where)
    if "SwinForImageClassification" not in (hf.get("architectures") or []):
        raise CheckpointError(where, "a swin folder needs SwinForImageClassification (a classification head)")
    if hf.get("use_absolute_embeddings") or not hf.get("qkv_bias", True) or hf.get("hidden_act", "gelu") != "gelu":
        raise CheckpointError(where, "only the standard Swin is supported (no absolute embeddings, q/k/v biases, "
                                     "exact GELU)")
    size, patch, window = int(hf.get("image_size", 224)), int(hf.get("patch_size", 4)), int(hf.get("window_size", 7))
    depths, heads = [int(d) for d in hf["depths"]], [int(h) for h in hf["num_heads"]]
    if size % patch:  # transformers pads the image to a whole number of patches; Swin's convolution would drop them
        raise CheckpointError(where, f"an image side of {size} pixels is not a whole number of {patch}-pixel patches "
                                     "(not supported)")
    side = size // patch
    for stage in range(len(depths)):
        if side < window:  # transformers shrinks the window to the grid here, but keeps the window's bias table and
            # fails on the shapes; nothing defines what such a folder computes
            raise CheckpointError(where, f"stage {stage}'s grid of {side}×{side} tokens is smaller than the "
                                         f"{window}-token window (transformers cannot run such a model either)")
        side = -(-side // 2)  # patch merging pads an odd side
    id2label = hf.get("id2label") or {}
    n = len(id2label) or int(hf.get("num_labels", 2))
    config = SwinConfig(image_size=size, in_channels=int(hf.get("num_channels", 3)), patch=patch,
                        embed_dim=int(hf["embed_dim"]), depths=tuple(depths), heads=tuple(heads), window=window,
                        mlp_ratio=float(hf.get("mlp_ratio", 4.0)), num_classes=n, dropout=0.0, attention_dropout=0.0,
                        drop_path=0.0, norm_eps=float(hf.get("layer_norm_eps", 1e-5)), input="processor")
    s = {k.removeprefix("swin."): v for k, v in state.items()}
    ours: dict[str, Tensor] = {
        "patch_embed.weight": s["embeddings.patch_embeddings.projection.weight"],
        "patch_embed.bias": s["embeddings.patch_embeddings.projection.bias"],
        "patch_norm.weight": s["embeddings.norm.weight"], "patch_norm.bias": s["embeddings.norm.bias"],
        "norm.weight": s["layernorm.weight"], "norm.bias": s["layernorm.bias"],
        "head.weight": s["classifier.weight"], "head.bias": s["classifier.bias"]}
    for st, depth in enumerate(depths):
        for b in range(depth):
            h, o = f"encoder.layers.{st}.blocks.{b}.", f"stages.{st}.{b}."
            a = h + "attention."
            for kind in ("weight", "bias"):
                ours[o + f"attn.qkv.{kind}"] = torch.cat([s[a + f"self.{x}.{kind}"] for x in ("query", "key", "value")])
                for theirs, mine in (("attention.output.dense", "attn.proj"), ("layernorm_before", "norm1"),
                                     ("layernorm_after", "norm2"), ("intermediate.dense", "mlp.0"),
                                     ("output.dense", "mlp.3")):
                    ours[o + f"{mine}.{kind}"] = s[h + f"{theirs}.{kind}"]
            ours[o + "attn.relative_position_bias_table"] = s[a + "self.relative_position_bias_table"]
        if st < len(depths) - 1:
            d = f"encoder.layers.{st}.downsample."
            ours[f"merges.{st}.reduction.weight"] = s[d + "reduction.weight"]
            ours[f"merges.{st}.norm.weight"], ours[f"merges.{st}.norm.bias"] = s[d + "norm.weight"], s[d + "norm.bias"]
    labels = [str(id2label.get(str(i), id2label.get(i, i))) for i in range(n)]
    model = Swin(config, labels=labels)
    expected = model.state_dict()
    for name, t in ours.items():
        if name in expected and tuple(t.shape) != tuple(expected[name].shape):
            raise CheckpointError(where.parent / "model.safetensors", f"tensor for {name} has shape "
                                  f"{tuple(t.shape)}, the config says {tuple(expected[name].shape)}")
    missing, unexpected = model.load_state_dict({k: v.float().contiguous() for k, v in ours.items()}, strict=False)
    if missing or unexpected:
        raise CheckpointError(where, f"weights do not fit Swin: missing {missing}, unexpected {unexpected}")
    return model


def deit_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json") -> Any:
    """A Hugging Face ``deit`` folder's weights in ``DeiT`` (without its preprocessing: ``models.io.hf`` adds it)."""
    from models.families.deit import DeiT, DeiTConfig
    from models.io.hf import hf_labels, load_vit_like, vit_config, vit_encoder_state

    where = Path(where)
    architectures = hf.get("architectures") or []
    distilled = "DeiTForImageClassificationWithTeacher" in architectures
    if not distilled and "DeiTForImageClassification" not in architectures:
        raise CheckpointError(where, "a deit folder needs DeiTForImageClassification(WithTeacher) (a classification "
                                     "head)")
    config = vit_config(DeiTConfig, hf, where, prefix_tokens=2, distilled=distilled)
    s = {k.removeprefix("deit."): v for k, v in state.items()}
    ours = vit_encoder_state(s, config.depth)
    ours["extra_tokens"] = s["embeddings.distillation_token"]
    if distilled:
        ours.update({"head.weight": s["cls_classifier.weight"], "head.bias": s["cls_classifier.bias"],
                     "head_dist.weight": s["distillation_classifier.weight"],
                     "head_dist.bias": s["distillation_classifier.bias"]})
    else:
        ours.update({"head.weight": s["classifier.weight"], "head.bias": s["classifier.bias"]})
    with torch.no_grad():
        return load_vit_like(DeiT(config, labels=hf_labels(hf)), ours, where)
