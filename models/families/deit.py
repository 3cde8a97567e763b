"""DeiT (Touvron et al. 2021, "Training data-efficient image transformers & distillation through attention"): a ViT
with a second learned prefix token, the *distillation token*, which attends and is attended to like the class token
and is trained to match a teacher's prediction (§4). At test time the distilled model averages two linear heads, one
on the class token's final features and one on the distillation token's (§4, "Classification with our approach").

Everything but the head is ``models.families.vit.ViT`` with ``prefix_tokens = 2`` (class token first, then the
distillation token: the order of Hugging Face's DeiTEmbeddings), so every Vision view (attention from CLS, rollout,
relevance, the prefix tokens skipped in every patch map) works unchanged; ``forward_head`` is what differs.

Reads Hugging Face ``deit`` folders: ``DeiTForImageClassificationWithTeacher`` (logits = mean of ``cls_classifier``
on [CLS] and ``distillation_classifier`` on the distillation token) and ``DeiTForImageClassification`` (one
``classifier`` on [CLS]; the distillation token is still in the sequence).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from models.families.vit import ViT, ViTConfig


@dataclass
class DeiTConfig(ViTConfig):
    prefix_tokens: int = 2  # [CLS], then the distillation token
    distilled: bool = True  # two heads averaged (…WithTeacher); False: one head on [CLS]
    OPTIONAL: ClassVar[tuple[str, ...]] = ("processor",)


class DeiT(ViT):
    """ViT + distillation token; the head reads [CLS] (and, distilled, the distillation token)."""

    def __init__(self, config: DeiTConfig, labels: list[str] | None = None) -> None:
        if config.prefix_tokens != 2:
            raise ValueError(f"DeiT has two prefix tokens ([CLS], distillation), got {config.prefix_tokens}")
        super().__init__(config, labels)
        self.head_dist = nn.Linear(config.dim, config.num_classes) if config.distilled else None
        if self.head_dist is not None:
            self._init(self.head_dist)

    def token_labels(self) -> list[str]:
        """"CLS", "DIST", then one label per patch ("r0c0", ...)."""
        return ["CLS", "DIST", *super().token_labels()[2:]]

    def forward_head(self, tokens: Tensor) -> Tensor:
        """Logits (B, classes) from the final tokens (B, 2 + P, D): distilled, the mean of the class head on [CLS]
        and the distillation head on the distillation token (Touvron et al. 2021, §4); else the class head alone."""
        logits = self.head(tokens[:, 0])
        if self.head_dist is None:
            return logits
        return (logits + self.head_dist(tokens[:, 1])) / 2


def from_hf(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json") -> DeiT:
    """A Hugging Face ``deit`` folder's weights in ``DeiT`` (without its preprocessing: ``models.io.hf`` adds it)."""
    from models.io.checkpoint import CheckpointError
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
