"""Transformer-encoder text classifier trained from scratch (SST-2 sentiment, AG News topic).

Input is ``<s> pieces </s>`` from models.inputs.tokenizer; with CLS pooling the hidden state at position 0
(``<s>``, playing BERT's [CLS]) feeds the classifier head, with mean pooling the average over real tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from models.blocks.attention import Intervention, LayerEdit, bind, enter_layer, padding_mask
from models.blocks.layers import EncoderLayer, length_runs
from models.blocks.positional import LearnedPositions, SinusoidalPositions
from models.inputs.tokenizer import encode_input
from models.outputs import AttentionMap, ClassificationResult


@dataclass
class ClassifierConfig:
    vocab_size: int = 8000  # SentencePiece vocabulary of the training texts
    n_classes: int = 2  # SST-2: 2 (negative, positive); AG News: 4
    d_model: int = 128  # model width; small data sets need no more
    n_heads: int = 4  # attention heads (d_head = 32)
    n_layers: int = 2  # encoder layers
    d_ff: int = 512  # feed-forward inner width, 4 × d_model
    dropout: float = 0.1  # residual, embedding, attention and head dropout
    max_len: int = 128  # positions; inputs are capped here (models/limits.py)
    pooling: str = "cls"  # "cls": hidden state of position 0 (as BERT); "mean": average over real tokens
    positions: str = "learned"  # "learned" (BERT) or "sinusoidal" (Vaswani et al.)
    norm_first: bool = True  # pre-norm (True) or post-norm (False)
    pad_id: int = 0  # SentencePiece id of <pad>


def pool(x: Tensor, pad: Tensor, how: str) -> Tensor:
    """(B, N, D) hidden states -> (B, D): position 0 ("cls", as BERT) or the mean over real tokens ("mean")."""
    if how == "cls":
        return x[:, 0]
    keep = (~pad).unsqueeze(-1).to(x.dtype)  # (B, N, 1)
    return (x * keep).sum(1) / keep.sum(1).clamp_min(1.0)


@dataclass
class EditedForward:
    """What ``EncoderClassifier.forward_edited`` returns."""

    logits: Tensor  # (B, C)
    attention: list[Tensor] = field(default_factory=list)  # per layer (B, H, N, N), with need_weights
    heads: list[Tensor] = field(default_factory=list)  # per layer (B, H, N, d_head), with edit.record
    residual: list[Tensor] = field(default_factory=list)  # per layer (B, N, D) entering it, with edit.record


class EncoderClassifier(nn.Module):
    """What every text classifier shares (ours and the pretrained MiniLM): subclasses implement
    ``_run(ids, pad_mask, need_weights, edits) -> (logits, [per-layer weights])`` and ``_run_embedded`` (the
    same from word embeddings), and hold ``config`` (``max_len``, ``n_classes``, ``n_layers``), ``labels`` and
    ``tokenizer``. ``edit`` (``models.blocks.attention.Intervention``) patches heads or residual positions and
    forbids keys per call (models/inspect/patching.py), never by changing the shared model."""

    def forward(self, ids: Tensor, pad_mask: Tensor | None = None, edit: Intervention | None = None) -> Tensor:
        """ids: (B, N); pad_mask: (B, N) bool, True on PADDING (default: ids == pad_id) -> logits (B, C)."""
        return self.forward_edited(ids, pad_mask, edit).logits

    def forward_with_attention(self, ids: Tensor, pad_mask: Tensor | None = None,
                               edit: Intervention | None = None) -> tuple[Tensor, Tensor]:
        """As forward on the explicit attention path; also the weights (B, L, H, N, N)."""
        out = self.forward_edited(ids, pad_mask, edit, need_weights=True)
        return out.logits, torch.stack(out.attention, 1)

    def forward_edited(self, ids: Tensor, pad_mask: Tensor | None = None, edit: Intervention | None = None,
                       need_weights: bool = False) -> EditedForward:
        """As forward, returning everything: the logits, the attention (with ``need_weights``, explicit path)
        and, when ``edit.record``, each layer's per-head outputs and the residual stream entering it."""
        edits, recording = bind(edit, self.config.n_layers)
        logits, weights = self._run(ids, pad_mask, need_weights, edits)
        return EditedForward(logits, weights, recording.heads, recording.residual)

    def classify(self, text: str | Sequence[int]) -> ClassificationResult:
        """Class probabilities and attention for one text (or ids with specials included)."""
        return classify_text(self, text)

    def classify_many(self, texts: Sequence[str | Sequence[int]]) -> list[ClassificationResult | Exception]:
        """``classify`` of several texts in batched forward passes (padding masked): each answer equals the text's
        own ``classify``; an input the model refuses comes back as its exception, in its place."""
        return classify_texts(self, texts)

    def token_embeddings(self, ids: Tensor) -> Tensor:
        """ids (B, N) -> the word embeddings (B, N, D) before positions are added: the input that attribution
        differentiates (models/inspect/attribution.py). Subclasses implement it."""
        raise NotImplementedError

    def forward_embedded(self, embeddings: Tensor, pad_mask: Tensor | None = None,
                         need_weights: bool = True, edit: Intervention | None = None) -> tuple[Tensor, list[Tensor]]:
        """As ``forward_with_attention`` but from word embeddings (B, N, D) (``token_embeddings`` of the ids, or
        any point on a path to them); pad_mask (B, N) True on padding (None: none); edit: as ``forward`` (what
        it records comes back through ``forward_edited`` only).

        Returns (logits (B, C), per-layer attention L × (B, H, N, N), empty unless ``need_weights``). The
        weights are the very tensors the layers multiply the values with, not detached or stacked, so
        ``torch.autograd.grad(logit, weights)`` gives ∂logit/∂A (Chefer et al. 2021). Nothing on the model
        changes: concurrent requests can call it on the shared object.
        """
        pad = torch.zeros(embeddings.shape[:2], dtype=torch.bool, device=embeddings.device) if pad_mask is None \
            else pad_mask
        return self._run_embedded(embeddings, pad, need_weights, bind(edit, self.config.n_layers)[0])

    def _run(self, ids: Tensor, pad_mask: Tensor | None, need_weights: bool,
             edits: Sequence[LayerEdit | None] | None = None) -> tuple[Tensor, list[Tensor]]:
        raise NotImplementedError

    def _run_embedded(self, embeddings: Tensor, pad: Tensor, need_weights: bool,
                      edits: Sequence[LayerEdit | None] | None = None) -> tuple[Tensor, list[Tensor]]:
        raise NotImplementedError


class TextClassifier(EncoderClassifier):
    def __init__(self, config: ClassifierConfig, tokenizer: Any | None = None) -> None:
        super().__init__()
        self.config = c = config
        if c.pooling not in ("cls", "mean"):
            raise ValueError(f"pooling must be 'cls' or 'mean', got {c.pooling!r}")
        if c.positions not in ("learned", "sinusoidal"):
            raise ValueError(f"positions must be 'learned' or 'sinusoidal', got {c.positions!r}")
        self.tokenizer = tokenizer  # models.inputs.tokenizer.Tokenizer; set by models.load
        self.labels: list[str] = [str(i) for i in range(c.n_classes)]
        self.embed = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        nn.init.normal_(self.embed.weight, std=0.02)
        pos_cls = LearnedPositions if c.positions == "learned" else SinusoidalPositions
        self.positions = pos_cls(c.max_len, c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(c.d_model, c.n_heads, c.d_ff, c.dropout, c.norm_first) for _ in range(c.n_layers))
        self.norm = nn.LayerNorm(c.d_model) if c.norm_first else nn.Identity()
        self.head = nn.Linear(c.d_model, c.n_classes)

    def token_embeddings(self, ids: Tensor) -> Tensor:
        return self.embed(ids)  # (B, N, D)

    def _run(self, ids: Tensor, pad_mask: Tensor | None, need_weights: bool,
             edits: Sequence[LayerEdit | None] | None = None) -> tuple[Tensor, list[Tensor]]:
        pad = ids == self.config.pad_id if pad_mask is None else pad_mask  # (B, N) True on padding
        return self._run_embedded(self.embed(ids), pad, need_weights, edits)

    def _run_embedded(self, embeddings: Tensor, pad: Tensor, need_weights: bool,
                      edits: Sequence[LayerEdit | None] | None = None) -> tuple[Tensor, list[Tensor]]:
        mask = padding_mask(pad)  # (B, 1, 1, N), None without padding
        x = self.drop(self.positions(embeddings))
        weights = []
        for layer, e in zip(self.layers, edits or [None] * len(self.layers)):
            x = enter_layer(x, e)  # patched residual positions
            x, w = layer(x, mask, need_weights, edit=e)
            if w is not None:
                weights.append(w)
        x = self.norm(x)  # (B, N, D)
        return self.head(self.drop(pool(x, pad, self.config.pooling))), weights



def classify_text(model: nn.Module, text: str | Sequence[int]) -> ClassificationResult:
    """One text (or ids, specials included) through a text classifier with a ``config`` (``max_len``,
    ``n_classes``), ``labels``, ``tokenizer`` and ``forward_with_attention``: probabilities and (L,H,N,N)
    attention. Shared by TextClassifier and the pretrained BertClassifier."""
    result = classify_texts(model, [text])[0]
    if isinstance(result, Exception):
        raise result
    return result


@torch.no_grad()
def classify_texts(model: nn.Module, texts: Sequence[str | Sequence[int]]) -> list[ClassificationResult | Exception]:
    """Several texts through one classifier in batched forward passes, padded on the right with a key-padding mask
    (True on padding), so that each answer equals ``classify_text`` of that text alone (up to float summation
    order): padded keys get weight 0 and every position keeps its index. An input the model refuses comes back as
    its exception, in its place; the others are answered."""
    c, dev = model.config, next(model.parameters()).device
    results: list[ClassificationResult | Exception] = [ValueError("not run")] * len(texts)
    encoded: dict[int, tuple[list[int], list[str], str]] = {}
    for i, text in enumerate(texts):
        try:
            found = encode_input(model.tokenizer, text, c.max_len, type(model).__name__)
            if not found[0]:
                raise ValueError("the input has no tokens")
            encoded[i] = found
        except Exception as err:  # bad input: this request's answer, not the batch's
            results[i] = err
    labels = list(model.labels) if len(model.labels) == c.n_classes else [str(i) for i in range(c.n_classes)]
    reads = getattr(model, "reads", c.pooling)  # the position(s) the head reads: "cls" or "mean"
    keys = list(encoded)
    was_training = model.training
    model.eval()
    try:
        for run in length_runs([len(encoded[k][0]) for k in keys]):
            rows = [keys[j] for j in run]
            n = max(len(encoded[r][0]) for r in rows)
            x = torch.full((len(rows), n), c.pad_id, dtype=torch.long, device=dev)
            pad = torch.ones((len(rows), n), dtype=torch.bool, device=dev)  # True on padding
            for b, r in enumerate(rows):
                ids = encoded[r][0]
                x[b, : len(ids)] = torch.tensor(ids, device=dev)
                pad[b, : len(ids)] = False  # every id of an input is real, even one that equals pad_id
            logits, weights = model.forward_with_attention(x, pad)  # (B, C), (B, L, H, N, N)
            probs = torch.softmax(logits.float(), -1).cpu().numpy().astype(np.float32)
            weights = weights.float().cpu().numpy()
            for b, r in enumerate(rows):
                ids, tokens, notice = encoded[r]
                m = len(ids)
                attn = AttentionMap(np.ascontiguousarray(weights[b, :, :, :m, :m]), tokens, tokens)
                results[r] = ClassificationResult(tokens, labels, probs[b], {"encoder": attn}, notice, pooling=reads)
    finally:
        model.train(was_training)
    return results
