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
from typing import ClassVar

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
