"""BERT-family encoder (Devlin et al. 2019) for the pretrained MiniLM, and a sentence classifier on top.

The weights come from sentence-transformers/all-MiniLM-L6-v2: a 6-layer, 12-head, 384-wide MiniLM
(Wang et al. 2020, distilled from a larger BERT by deep self-attention distillation) that
sentence-transformers then trained for sentence embeddings with mean pooling (Reimers & Gurevych 2019).
Its architecture is BERT's exactly, so this file is BERT written in the project's style:

    x = LayerNorm(word[ids] + position[0..N) + token_type[types])         # §3.2, learned positions
    for each layer (post-norm, as the original Transformer and BERT):
        x = LayerNorm(x + Dropout(MultiHeadAttention(x)))
        x = LayerNorm(x + Dropout(W_2 · GELU(W_1 x)))                      # GELU: Hendrycks & Gimpel 2016

``hf_to_ours`` maps the Hugging Face parameter names (``encoder.layer.3.attention.self.query.weight``,
...) onto ours, so the original safetensors load without transformers; tests/test_bert.py checks the
hidden states and attention against transformers' ``BertModel`` with the same weights.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from models.blocks.attention import LayerEdit, MultiHeadAttention, enter_layer, padding_mask
from models.blocks.layers import ACTIVATIONS
from models.families.classifier import EncoderClassifier, pool
from models.limits import MAX_TOKENS_MINILM


@dataclass
class BertConfig:
    vocab_size: int = 30522  # WordPiece vocabulary of bert-base-uncased, which MiniLM shares
    d_model: int = 384  # hidden size (MiniLM-L6-H384)
    n_layers: int = 6  # encoder layers
    n_heads: int = 12  # attention heads (d_head = 32)
    d_ff: int = 1536  # feed-forward inner width ("intermediate_size"), 4 × d_model
    max_positions: int = 512  # learned position table of the pretrained model
    type_vocab_size: int = 2  # token types (segment A / B); single sentences use type 0 only
    layer_norm_eps: float = 1e-12  # BERT's LayerNorm epsilon (not PyTorch's 1e-5)
    dropout: float = 0.1  # embedding, residual and head dropout ("hidden_dropout_prob")
    attention_dropout: float = 0.1  # on the attention probabilities ("attention_probs_dropout_prob")
    n_classes: int = 2  # SST-2: 2; AG News: 4
    pooling: str = "mean"  # "mean" over real tokens (all-MiniLM-L6-v2), "cls" ([CLS] state) or "pooler"
    # ("pooler": tanh(W h_[CLS] + b), BertForSequenceClassification's pooled output, Devlin et al. §3)
    pad_id: int = 0  # [PAD] in the WordPiece vocabulary
    max_len: int = MAX_TOKENS_MINILM  # input cap in tokens, [CLS] and [SEP] included (models/limits.py)
    origin: str = ""  # where the pretrained weights come from, with their licence (kept in config.json)
    # The switches of the BERT-shaped families read from Hugging Face folders (models/io/hf.py); the defaults are BERT.
    family: str = "bert"  # "bert", "roberta", "distilbert", "electra" or "albert": what the model view calls it
    embedding_size: int = 0  # E of factorised embeddings (ALBERT §3.1, ELECTRA small): tables of width E, then a
    # Linear E -> d_model; 0: tables of width d_model, no projection
    position_offset: int = 0  # RoBERTa counts positions from padding_idx + 1 (fairseq's make_positions): 2
    act: str = "gelu"  # feed-forward activation: "gelu" (exact, erf) or "gelu_new" (tanh approximation, ALBERT)
    pooler_act: str = "tanh"  # after the pooler's dense layer: "tanh" (BERT, ALBERT, RoBERTa's head), "gelu"
    # (ELECTRA's discriminator head), "relu" (DistilBERT's pre_classifier)
    shared_layers: bool = False  # ALBERT §3.1: one layer's weights used by every pass (n_layers passes)
    # newer than the shipped minilm checkpoints: their defaults (BERT) apply to a config.json without them
    OPTIONAL: ClassVar[tuple[str, ...]] = ("family", "embedding_size", "position_offset", "act", "pooler_act",
                                           "shared_layers")


class BertEmbeddings(nn.Module):
    """Word + learned position + token-type embeddings, then LayerNorm and dropout (Devlin et al. §3)."""

    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        e = c.embedding_size or c.d_model  # ALBERT / ELECTRA-small: narrower tables, projected by BertEncoder
        self.offset = c.position_offset
        self.word = nn.Embedding(c.vocab_size, e, padding_idx=c.pad_id)
        self.position = nn.Embedding(c.max_positions, e)
        # DistilBERT has no token types (type_vocab_size 0)
        self.token_type = nn.Embedding(c.type_vocab_size, e) if c.type_vocab_size > 0 else None
        self.norm = nn.LayerNorm(e, eps=c.layer_norm_eps)
        self.drop = nn.Dropout(c.dropout)

    def position_ids(self, n: int, device: torch.device | None = None) -> Tensor:
        """The position of each of n tokens: 0..n-1, or from ``position_offset`` (RoBERTa: padding_idx + 1).
        Padding after the text gets later positions here, which no real token sees (its keys are masked)."""
        if self.offset + n > self.position.num_embeddings:
            raise ValueError(f"sequence of {n} tokens exceeds the {self.position.num_embeddings - self.offset} "
                             "positions")
        return torch.arange(self.offset, self.offset + n, device=device)

    def type_part(self, word: Tensor, token_types: Tensor | None = None) -> Tensor | None:
        """The token-type embeddings (B, N, E) (type 0 unless given), or None for a family without them."""
        if self.token_type is None:
            return None
        types = torch.zeros(word.shape[:2], dtype=torch.long, device=word.device) if token_types is None \
            else token_types
        return self.token_type(types)

    def forward(self, ids: Tensor, token_types: Tensor | None = None) -> Tensor:  # ids: (B, N) -> (B, N, D)
        return self.embed(self.word(ids), token_types)

    def embed(self, word: Tensor, token_types: Tensor | None = None) -> Tensor:
        """The rest of ``forward`` from word embeddings (B, N, D): positions, token types, LayerNorm, dropout."""
        x = word + self.position(self.position_ids(word.size(1), word.device))
        types = self.type_part(word, token_types)
        return self.drop(self.norm(x if types is None else x + types))




class BertLayer(nn.Module):
    """One post-norm encoder layer: self-attention and a GELU feed-forward, each Add & LayerNorm."""

    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.attention_dropout)
        self.norm1 = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
        self.ff_in = nn.Linear(c.d_model, c.d_ff)
        self.ff_out = nn.Linear(c.d_ff, c.d_model)
        self.norm2 = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
        self.drop = nn.Dropout(c.dropout)
        self.act = ACTIVATIONS[c.act]

    def feed_forward(self, x: Tensor) -> Tensor:
        """W_2 · act(W_1 x) (B, N, D) -> (B, N, D), without dropout."""
        return self.ff_out(self.act(self.ff_in(x)))

    def forward(self, x: Tensor, mask: Tensor | None = None, need_weights: bool = False,
                edit: LayerEdit | None = None) -> tuple[Tensor, Tensor | None]:
        """x: (B, N, D); mask: (B, 1, 1, N) True on real keys; edit: the attention's part of an intervention
        (models/blocks/attention.py). Returns (x, weights (B, H, N, N) or None)."""
        a, w = self.self_attn(x, mask=mask, need_weights=need_weights, edit=edit)
        x = self.norm1(x + self.drop(a))
        x = self.norm2(x + self.drop(self.feed_forward(x)))  # exact (erf) GELU for BERT
        return x, w


class BertEncoder(nn.Module):
    """Embeddings and the stack of layers; the hidden states and attention of every layer on request."""

    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.embeddings = BertEmbeddings(c)
        # factorised embeddings: E -> d_model once, after the embedding LayerNorm (ALBERT §3.1, ELECTRA)
        self.project = nn.Linear(c.embedding_size, c.d_model) if c.embedding_size else None
        if c.shared_layers:  # ALBERT: the same module n_layers times (one set of weights, one pass each)
            shared = BertLayer(c)
            self.layers = nn.ModuleList([shared] * c.n_layers)
        else:
            self.layers = nn.ModuleList(BertLayer(c) for _ in range(c.n_layers))

    def forward(self, ids: Tensor, pad_mask: Tensor | None = None, token_types: Tensor | None = None,
                need_weights: bool = False) -> tuple[list[Tensor], list[Tensor]]:
        """ids: (B, N); pad_mask: (B, N) bool, True on PADDING (None: no padding).

        Returns (hidden states: embeddings output then each layer's output, L + 1 tensors (B, N, D);
        attention weights: L tensors (B, H, N, N), empty unless ``need_weights``).
        """
        return self.forward_embedded(self.embeddings.word(ids), pad_mask, token_types, need_weights)

    def forward_embedded(self, word: Tensor, pad_mask: Tensor | None = None, token_types: Tensor | None = None,
                         need_weights: bool = False,
                         edits: Sequence[LayerEdit | None] | None = None) -> tuple[list[Tensor], list[Tensor]]:
        """As ``forward`` from word embeddings (B, N, D) instead of ids (attribution, models/inspect/attribution.py).
        edits: one ``LayerEdit`` or None per layer (``models.blocks.attention.bind`` of an intervention)."""
        mask = None if pad_mask is None else padding_mask(pad_mask)  # (B, 1, 1, N), None without padding
        x = self.embeddings.embed(word, token_types)
        if self.project is not None:
            x = self.project(x)
        states, weights = [x], []
        for layer, e in zip(self.layers, edits or [None] * len(self.layers)):
            x = enter_layer(x, e)  # patched residual positions
            x, w = layer(x, mask, need_weights, e)
            states.append(x)
            if w is not None:
                weights.append(w)
        return states, weights


class BertClassifier(EncoderClassifier):
    """BERT encoder + pooled sentence vector + dropout + linear head (Devlin et al. §4.1).

    Same interface as ``TextClassifier``: ``forward(ids, pad_mask)``, ``forward_with_attention`` and
    ``classify(text) -> ClassificationResult`` with the WordPiece tokens as the model saw them,
    ``[CLS]`` and ``[SEP]`` included.
    """

    def __init__(self, config: BertConfig, tokenizer: Any | None = None) -> None:
        super().__init__()
        self.config = c = config
        if c.pooling not in ("cls", "mean", "pooler"):
            raise ValueError(f"pooling must be 'cls', 'mean' or 'pooler', got {c.pooling!r}")
        if c.act not in ACTIVATIONS or c.pooler_act not in ACTIVATIONS:
            raise ValueError(f"unknown activation {c.act!r} / {c.pooler_act!r}; known: {sorted(ACTIVATIONS)}")
        if c.max_len + c.position_offset > c.max_positions:
            raise ValueError(f"max_len={c.max_len} exceeds the {c.max_positions - c.position_offset} positions")
        self.tokenizer = tokenizer  # models.inputs.tokenizer.JsonTokenizer; set by models.load
        self.labels: list[str] = [str(i) for i in range(c.n_classes)]
        self.text: dict[str, Any] = {}
        self.bert = BertEncoder(c)
        self.pooler = nn.Linear(c.d_model, c.d_model) if c.pooling == "pooler" else None
        self.drop = nn.Dropout(c.dropout)
        self.head = nn.Linear(c.d_model, c.n_classes)
        self.apply(_init_weights)

    @property
    def reads(self) -> str:
        """What the head reads of the last layer: position 0 ("cls", the pooler too) or every token ("mean")."""
        return "mean" if self.config.pooling == "mean" else "cls"

    def token_embeddings(self, ids: Tensor) -> Tensor:
        return self.bert.embeddings.word(ids)  # (B, N, D), before positions, token types and LayerNorm

    def _run(self, ids: Tensor, pad_mask: Tensor | None, need_weights: bool,
             edits: Sequence[LayerEdit | None] | None = None) -> tuple[Tensor, list[Tensor]]:
        pad = ids == self.config.pad_id if pad_mask is None else pad_mask  # (B, N) True on padding
        return self._run_embedded(self.token_embeddings(ids), pad, need_weights, edits)

    def _run_embedded(self, embeddings: Tensor, pad: Tensor, need_weights: bool,
                      edits: Sequence[LayerEdit | None] | None = None) -> tuple[Tensor, list[Tensor]]:
        states, weights = self.bert.forward_embedded(embeddings, pad, need_weights=need_weights, edits=edits)
        x = states[-1]  # (B, N, D)
        if self.pooler is not None:  # BertPooler: dense + tanh on the [CLS] state (GELU: ELECTRA, ReLU: DistilBERT)
            return self.head(self.drop(ACTIVATIONS[self.config.pooler_act](self.pooler(x[:, 0])))), weights
        # "mean" averages over real tokens, [CLS] and [SEP] included (sentence-transformers' mean pooling)
        return self.head(self.drop(pool(x, pad, self.config.pooling))), weights


def _init_weights(m: nn.Module) -> None:
    """BERT's initialisation (normal, std 0.02; LayerNorm 1 and 0) for whatever the pretrained weights
    do not cover (the classification head), and for models built without them (tests)."""
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
        if isinstance(m, nn.Embedding) and m.padding_idx is not None:
            with torch.no_grad():
                m.weight[m.padding_idx].zero_()
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)


# ----------------------------------------------------------------------------------------------------
# Hugging Face names -> ours

_HF_EMBEDDINGS = {
    "word_embeddings": "word",
    "position_embeddings": "position",
    "token_type_embeddings": "token_type",
    "LayerNorm": "norm",
}
_HF_LAYER = {
    "attention.self.query": "self_attn.q_proj",
    "attention.self.key": "self_attn.k_proj",
    "attention.self.value": "self_attn.v_proj",
    "attention.output.dense": "self_attn.out_proj",
    "attention.output.LayerNorm": "norm1",
    "intermediate.dense": "ff_in",
    "output.dense": "ff_out",
    "output.LayerNorm": "norm2",
}
_HF_IGNORED = re.compile(r"^(pooler\.|embeddings\.position_ids$|cls\.|classifier\.)")
_EMB_KEY = re.compile(r"^embeddings\.(\w+)\.(weight|bias|gamma|beta)$")
_LAYER_KEY = re.compile(r"^encoder\.layer\.(\d+)\.(.+)\.(weight|bias|gamma|beta)$")


def hf_key(name: str) -> str | None:
    """Our BertEncoder name of a Hugging Face ``BertModel`` parameter, or None for one we do not use.

    ``embeddings.word_embeddings.weight`` -> ``embeddings.word.weight``;
    ``encoder.layer.3.attention.self.query.weight`` -> ``layers.3.self_attn.q_proj.weight``. A ``bert.``
    prefix (``BertFor...`` models) is dropped; old TensorFlow-style ``gamma``/``beta`` LayerNorm names are
    read as ``weight``/``bias``. The pooler (dense + tanh on [CLS], unused by mean pooling) and any task
    head are ignored. Raises KeyError on a name that is neither mapped nor known to be ignorable.
    """
    name = name.removeprefix("bert.")
    if _HF_IGNORED.match(name):
        return None
    suffix_of = {"gamma": "weight", "beta": "bias"}
    if m := _EMB_KEY.match(name):
        if m.group(1) in _HF_EMBEDDINGS:
            return f"embeddings.{_HF_EMBEDDINGS[m.group(1)]}.{suffix_of.get(m.group(2), m.group(2))}"
    elif (m := _LAYER_KEY.match(name)) and m.group(2) in _HF_LAYER:
        return f"layers.{m.group(1)}.{_HF_LAYER[m.group(2)]}.{suffix_of.get(m.group(3), m.group(3))}"
    raise KeyError(f"unexpected BERT parameter name {name!r}")


def hf_name(ours: str) -> str:
    """The Hugging Face ``BertModel`` name of one of our ``BertEncoder`` parameters (``hf_key``'s inverse), so that a
    message names what a folder lacks in the folder's own names: ``layers.1.self_attn.q_proj.weight`` ->
    ``encoder.layer.1.attention.self.query.weight``."""
    if m := re.match(r"^embeddings\.(\w+)\.(weight|bias)$", ours):
        theirs = {v: k for k, v in _HF_EMBEDDINGS.items()}.get(m.group(1))
        return f"embeddings.{theirs}.{m.group(2)}" if theirs else ours
    if m := re.match(r"^layers\.(\d+)\.(.+)\.(weight|bias)$", ours):
        theirs = {v: k for k, v in _HF_LAYER.items()}.get(m.group(2))
        return f"encoder.layer.{m.group(1)}.{theirs}.{m.group(3)}" if theirs else ours
    return ours


def hf_to_ours(state: dict[str, Tensor]) -> tuple[dict[str, Tensor], list[str]]:
    """Rename a Hugging Face BERT state dict for ``BertEncoder``: (mapped state, names ignored)."""
    out: dict[str, Tensor] = {}
    ignored: list[str] = []
    for name, t in state.items():
        ours = hf_key(name)
        if ours is None:
            ignored.append(name)
        else:
            out[ours] = t
    return out, ignored


def config_from_hf(hf: dict[str, Any], **overrides: Any) -> BertConfig:
    """A BertConfig from a Hugging Face BERT ``config.json`` (dict), plus our own fields as overrides."""
    if hf.get("hidden_act", "gelu") != "gelu" or hf.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError("only BERT with exact GELU and absolute (learned) positions is supported")
    overrides.setdefault("max_len", min(BertConfig.max_len, hf["max_position_embeddings"]))
    return BertConfig(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"],
        max_positions=hf["max_position_embeddings"], type_vocab_size=hf["type_vocab_size"],
        layer_norm_eps=hf["layer_norm_eps"], dropout=hf["hidden_dropout_prob"],
        attention_dropout=hf["attention_probs_dropout_prob"], pad_id=hf.get("pad_token_id", 0), **overrides,
    )


def load_hf_weights(encoder: BertEncoder, path: str | Path) -> list[str]:
    """Load a Hugging Face BERT ``model.safetensors`` into ``encoder`` (every parameter must be there).

    Returns the names in the file that were ignored (pooler, position_ids). No pickle: safetensors only.
    """
    from safetensors.torch import load_file

    state, ignored = hf_to_ours(load_file(str(path)))
    missing, unexpected = encoder.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{Path(path).name} does not fit the encoder: missing {missing}, unexpected {unexpected}")
    return ignored
