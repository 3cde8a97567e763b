"""The Generate tab's decoder interface for the language models whose maps come from a recurrence rather than from
softmax heads alone: Mamba (models/families/mamba.py), RWKV-4 (rwkv.py) and the Qwen3-Next hybrid (qwen3_next.py).

What does not depend on the mixer lives here once: the prompt's checks and cut, the tokens, generation through the
recurrent state, the logit lens, the repeated-token sequence, the per-token losses and the refusal of a head mask.
A subclass has ``embed``, ``norm``, ``lm_head``, ``config`` (``vocab_size``, ``max_len``, ``n_layers``, the special
ids), ``tokenizer``, a forward ``self(ids, state=None, keep_hidden=False, last_only=False, …)`` returning an output
with ``logits`` and ``hidden``, and three hooks: ``_new_state()`` (an empty recurrent state), ``_mapped(x)`` (one
read of ids x (1, T) for the maps: (output, maps (L, 1, T, T) float32)) and ``NO_HEAD_MASK`` (the words of the
refusal).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models import limits
from models.blocks.loop import Decoding, full_surprisal
from models.outputs import GenerationResult, LogitLens

STRATEGIES = ("greedy", "sample")
# The implicit attention costs T² per channel and layer where the recurrence costs T (mamba.py: mamba-130m's 24 ×
# 1,536 channels at 256 tokens did not finish in 10 min on the 2-core test machine): prompt + generated tokens at most
# MAX_TOKENS.
MAX_TOKENS = 128


class RecurrentLM(nn.Module):
    """The decoder interface over a recurrent state (module docstring)."""

    NO_HEAD_MASK = "this model has no attention heads to switch off"
    NOT_APPLICABLE = ""  # what the head views say for it (tabs.sections.text.require_heads)

    def _new_state(self) -> Any:
        raise NotImplementedError

    def _mapped(self, x: Tensor) -> tuple[Any, np.ndarray]:
        raise NotImplementedError

    def encode_prompt(self, text: str) -> tuple[list[int], list[str]]:
        return self.tokenizer.encode_prompt(text)

    def piece(self, i: int) -> str:
        return self.tokenizer.id_to_piece(int(i)) if self.tokenizer is not None else str(int(i))

    def eos_id(self) -> int:
        return int(getattr(self.tokenizer, "eos_id", self.config.eos_id) if self.tokenizer else self.config.eos_id)

    def context_limit(self) -> int:
        """Prompt + generated tokens: MAX_TOKENS (what the implicit attention costs), or the app's or the model's
        fewer."""
        return min(limits.MAX_FULL_TOKENS, self.config.max_len, MAX_TOKENS)

    def prepare_prompt(self, text: str | Sequence[int], max_new_tokens: int, strategy: str = "greedy",
                       temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> tuple[list[int], int, str]:
        """As ``GPT.prepare_prompt``: (prompt ids, new tokens, notice); a long prompt keeps its last tokens."""
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        if not temperature > 0 or not 0 < top_p <= 1 or top_k < 0:
            raise ValueError("need temperature > 0, 0 < top_p <= 1 and top_k >= 0")
        ids = list(text) if not isinstance(text, str) else self.encode_prompt(text)[0]
        if not ids:
            raise ValueError("the prompt is empty")
        limit = self.context_limit()
        new = max(0, min(int(max_new_tokens), limits.MAX_NEW_TOKENS, limit - 1))
        notice = ""
        if len(ids) + new > limit:
            keep = limit - new
            notice = f"Prompt shortened to its last {keep} tokens (it had {len(ids)})."
            ids = ids[len(ids) - keep:]
        return ids, new, notice

    def _ids(self, ids: Sequence[int]) -> Tensor:
        return torch.tensor([list(ids)], device=self.embed.weight.device)

    @torch.no_grad()
    def generate(self, text: str | Sequence[int], max_new_tokens: int = 20, strategy: str = "greedy",
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0) -> GenerationResult:
        """Continue ``text`` token by token through the recurrent state (``_new_state``: each step costs the same,
        whatever the length), then read every token once more for the maps (``_mapped``: (L, 1, T, T))."""
        run = Decoding.start(self, text, max_new_tokens, strategy, temperature, top_k, top_p, seed)
        was = self.training
        self.eval()
        state = self._new_state()

        def advance(token: int, pos: int, last: bool) -> Tensor | None:  # the state takes one more token
            return None if last else self(self._ids([token]), state).logits[0, -1]

        run.run(self(self._ids(run.ids), state, last_only=True).logits[0, -1], advance)
        full, maps = self._mapped(self._ids(run.ids))
        self.train(was)
        return run.result(maps, full_surprisal(full.logits[0], run.ids))

    @torch.no_grad()
    def next_token_probs(self, ids: Sequence[int], head_mask: Tensor | None = None) -> np.ndarray:
        """The next-token distribution after ``ids`` (V,). ``head_mask``: refused (``NO_HEAD_MASK``)."""
        if head_mask is not None:
            raise ValueError(self.NO_HEAD_MASK)
        out = self(self._ids(ids), last_only=True)
        return torch.softmax(out.logits[0, -1].float(), -1).cpu().numpy()

    @torch.no_grad()
    def token_losses(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(cross-entropy of each token given the ones before it (T−1,), the maps (L, 1, T, T))."""
        x = self._ids(ids)
        out, maps = self._mapped(x)
        loss = F.cross_entropy(out.logits[0, :-1].float(), x[0, 1:], reduction="none")
        return loss.cpu().numpy(), maps

    def head_role_scores(self, n: int = 50, seeds: Sequence[int] = (0,),
                         pieces: Sequence[int] | np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Refused: head roles score softmax heads one by one (``NOT_APPLICABLE``)."""
        raise ValueError(self.NOT_APPLICABLE)

    @torch.no_grad()
    def logit_lens(self, ids: Sequence[int], last: int | None = None) -> LogitLens:
        """Each block's residual stream through the final norm and the output projection (as ``GPT.logit_lens``)."""
        x = self._ids(ids)
        out = self(x, keep_hidden=True)
        final = out.logits[0].float()
        target = torch.cat([x[0, 1:], final[-1:].argmax(-1)])
        start = 0 if last is None else max(0, x.size(1) - int(last))
        target = target[start:]
        top_ids, top_p, target_p = [], [], []
        for h in out.hidden[1:]:
            p = torch.softmax(self.lm_head(self.norm(h[0, start:])).float(), -1)
            best = p.max(-1)
            top_ids.append(best.indices)
            top_p.append(best.values)
            target_p.append(p.gather(1, target[:, None])[:, 0])
        tops = torch.stack(top_ids).cpu().numpy()
        return LogitLens(top_tokens=[[self.piece(i) for i in row] for row in tops],
                         top_probs=torch.stack(top_p).cpu().numpy().astype(np.float32),
                         target_probs=torch.stack(target_p).cpu().numpy().astype(np.float32),
                         targets=[self.piece(i) for i in target.cpu().numpy()])

    def repeated_tokens(self, n: int, seed: int = 0, pieces: Sequence[int] | np.ndarray | None = None) -> list[int]:
        """BOS + n random non-special tokens + the same n again (as ``GPT.repeated_tokens``): the sequence on which
        the implicit attention can be compared with a Transformer's induction stripe."""
        c, tok = self.config, self.tokenizer
        if n < 2 or 2 * n + 1 > self.context_limit():
            raise ValueError(f"n must be between 2 and {(self.context_limit() - 1) // 2}, got {n}")
        special = {c.bos_id, c.eos_id, c.pad_id} | ({tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id} if tok else set())
        pool = np.array([int(i) for i in (range(c.vocab_size) if pieces is None else pieces) if i not in special])
        if not len(pool):
            raise ValueError("no ordinary token to draw from")
        x = np.random.default_rng(seed).choice(pool, n, replace=len(pool) < n).tolist()
        bos = tok.bos_id if tok is not None and tok.bos_id >= 0 else c.bos_id
        return [int(bos), *x, *x]
