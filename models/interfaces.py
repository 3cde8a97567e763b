"""What a model must provide to appear in a tab, written as ``typing.Protocol`` classes (docs/ARCHITECTURE.md §7).

``Decoder``: the decoder-only language models of the Generate tab (its generation, replay, ablation, logit lens and
head roles, and the lessons over it). ``models.families.gpt.GPT`` is one, and so is every Hugging Face GPT-2 or
LLaMA-family
folder, which ``models/io/hf.py`` reads into it; a new decoder family either maps its weights into ``GPT`` or implements
this interface. tests/test_interfaces.py checks that ``GPT`` satisfies it method by method, parameters included.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np
    from torch import Tensor

    from models.blocks.attention import Intervention, KVCache
    from models.families.gpt import Forward
    from models.outputs import GenerationResult, LogitLens


class DecoderConfig(Protocol):
    """The configuration fields the Generate tab reads."""

    n_layers: int  # decoder blocks: the layer slider's range
    n_heads: int  # query heads per block: the head slider's range, head masks (layers, heads)
    max_len: int  # positions the model was trained for
    bos_id: int  # put first in every prompt of the project's own models


@runtime_checkable
class Decoder(Protocol):
    """A decoder-only language model as the Generate tab uses it; every array is numpy on the CPU."""

    config: DecoderConfig
    tokenizer: Any  # models.inputs.tokenizer: id_to_piece, decode, encode_prompt, bos_id / eos_id

    def encode_prompt(self, text: str) -> tuple[list[int], list[str]]:
        """Prompt ids and their token labels, exactly as the model sees them (BOS first for our own models)."""
        ...

    def piece(self, i: int) -> str:
        """The token label of id ``i``."""
        ...

    def eos_id(self) -> int:
        """Generation stops after this id."""
        ...

    def context_limit(self) -> int:
        """Prompt + generated tokens the model may see (models.limits.MAX_LM_TOKENS or its positions)."""
        ...

    def generate(self, text: str | Sequence[int], max_new_tokens: int = 20, strategy: str = "greedy",
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0) -> GenerationResult:
        """The continuation with the attention over every token and the top-5 candidates per step (§3)."""
        ...

    def next_token_probs(self, ids: Sequence[int], head_mask: Tensor | None = None) -> np.ndarray:
        """The next-token distribution (V,), with heads switched off by ``head_mask`` (layers, heads): ablation."""
        ...

    def logit_lens(self, ids: Sequence[int], last: int | None = None) -> LogitLens:
        """Each block's residual stream read through the final norm and the output projection (``last``: only the
        last that many positions, for a long input)."""
        ...

    def repeated_tokens(self, n: int, seed: int = 0, pieces: Sequence[int] | np.ndarray | None = None) -> list[int]:
        """BOS + n random ordinary tokens + the same n again: the head-role test sequence."""
        ...

    def token_losses(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(each token's loss given the ones before it (T−1,), attention (L, H, T, T))."""
        ...

    def head_role_scores(self, n: int = 50, seeds: Sequence[int] = (0,),
                         pieces: Sequence[int] | np.ndarray | None = None) -> dict[str, np.ndarray]:
        """``models.analysis.head_roles`` on ``repeated_tokens``, averaged over the seeds: (L, H) per role."""
        ...

    def forward(self, ids: Tensor, caches: list[KVCache] | None = None, need_weights: bool = False,
                head_mask: Tensor | None = None, keep_hidden: bool = False, edit: Intervention | None = None,
                last_only: bool = False, positions: Tensor | None = None, prefix: int = 0) -> Forward:
        """Logits (and on request attention, hidden states, per-head outputs) of ids (B, T); ``edit`` patches heads
        or positions and forbids keys (activation patching, sink ablation: models/inspect/patching.py);
        ``positions``: M-RoPE's (3, T) position ids; ``prefix``: a prefix LM's bidirectional positions."""
        ...
