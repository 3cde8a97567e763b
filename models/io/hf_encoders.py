"""Hugging Face sequence classifiers of the BERT-shaped families read into ``models.families.bert.BertClassifier``
(transformers is never imported here; the registry names each reader, ``models.io.hf.load_hf`` calls it).

Each family is BERT with a few switches (``BertConfig``: docs/ARCHITECTURE.md §7) and its own weight names:

- ``roberta`` (Liu et al. 2019): positions counted from ``padding_idx + 1`` (``position_offset``), one token type,
  head ``out_proj(tanh(dense(h_<s>)))`` (RobertaClassificationHead: the pooler switch with tanh).
- ``distilbert`` (Sanh et al. 2019): no token types, ``q_lin``/``k_lin``/``v_lin``/``out_lin`` names, head
  ``classifier(ReLU(pre_classifier(h_[CLS])))``; sinusoidal position tables are refused.
- ``electra`` (Clark et al. 2020): the discriminator's encoder with embeddings of width ``embedding_size``
  projected to ``hidden_size`` (``embeddings_project``) when they differ, head ``out_proj(GELU(dense(h_[CLS])))``
  (ElectraClassificationHead).
- ``albert`` (Lan et al. 2020): factorised embeddings (E, then ``embedding_hidden_mapping_in``) and one layer whose
  weights every pass shares (``shared_layers``), ``gelu_new`` feed-forward, BERT's pooler (tanh); only the
  published layout (one group, one layer in it) is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from models.io.checkpoint import CheckpointError

_LAYER = ("q_proj", "k_proj", "v_proj", "out_proj", "norm1", "ff_in", "ff_out", "norm2")


def _labels(hf: dict[str, Any]) -> tuple[int, list[str]]:
    id2label = hf.get("id2label") or {}
    n = len(id2label) or int(hf.get("num_labels", 2))
    return n, [str(id2label.get(str(i), id2label.get(i, i))) for i in range(n)]


def _check_head(hf: dict[str, Any], where: Path, architecture: str) -> None:
    if architecture not in (hf.get("architectures") or []):
        raise CheckpointError(where, f"a {hf.get('model_type')} folder needs {architecture} (a classification head)")
    if hf.get("problem_type") not in (None, "single_label_classification"):
        raise CheckpointError(where, f"problem_type {hf['problem_type']!r} is not supported (single-label)")


def _build(config: Any, ours: dict[str, Tensor], where: Path, labels: list[str], cls: type | None = None) -> Any:
    """A BertClassifier (or ``cls``) from our state dict; every parameter must be found and have its shape."""
    from models.families.bert import BertClassifier

    model = (cls or BertClassifier)(config)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(ours))
    if missing:
        raise CheckpointError(where.parent / "model.safetensors", f"no tensor for {missing[:4]} ({config.family})")
    for name, t in ours.items():
        if name in expected and tuple(t.shape) != tuple(expected[name].shape):
            raise CheckpointError(where.parent / "model.safetensors",
                                  f"tensor for {name} has shape {tuple(t.shape)}, the config says "
                                  f"{tuple(expected[name].shape)}")
    model.load_state_dict({k: v.float().contiguous() for k, v in ours.items() if k in expected}, strict=True)
    model.labels = labels
    return model


def _config(hf: dict[str, Any], where: Path, family: str, n: int, **switches: Any) -> Any:
    from models.families.bert import BertConfig
    from models.limits import MAX_TOKENS_MINILM

    offset = int(switches.get("position_offset", 0))
    positions = int(hf["max_position_embeddings"])
    act = str(hf.get("hidden_act", switches.pop("default_act", "gelu")))
    if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
        raise CheckpointError(where, f"activation {act!r} is not supported (gelu or gelu_new)")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(where, "only absolute (learned) positions are supported")
    return BertConfig(
        vocab_size=int(hf["vocab_size"]), d_model=int(hf["hidden_size"]), n_layers=int(hf["num_hidden_layers"]),
        n_heads=int(hf["num_attention_heads"]), d_ff=int(hf["intermediate_size"]), max_positions=positions,
        type_vocab_size=int(hf.get("type_vocab_size", 2)), layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
        dropout=0.0, attention_dropout=0.0, n_classes=n, pooling="pooler", pad_id=int(hf.get("pad_token_id") or 0),
        max_len=min(MAX_TOKENS_MINILM, positions - offset), origin=f"Hugging Face folder {where.parent.name}",
        family=family, act="gelu" if act == "gelu" else "gelu_new", **switches)


def _bert_layers(s: dict[str, Tensor], n_layers: int, prefix: str = "encoder.layer.") -> dict[str, Tensor]:
    names = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
             "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm")
    return {f"bert.layers.{i}.{_mine(ours)}.{kind}": s[f"{prefix}{i}.{theirs}.{kind}"]
            for i in range(n_layers) for theirs, ours in zip(names, _LAYER) for kind in ("weight", "bias")}


def _mine(name: str) -> str:
    return f"self_attn.{name}" if name.endswith("_proj") else name


def _embeddings(s: dict[str, Tensor], types: bool = True) -> dict[str, Tensor]:
    ours = {"bert.embeddings.word.weight": s["embeddings.word_embeddings.weight"],
            "bert.embeddings.position.weight": s["embeddings.position_embeddings.weight"],
            "bert.embeddings.norm.weight": s["embeddings.LayerNorm.weight"],
            "bert.embeddings.norm.bias": s["embeddings.LayerNorm.bias"]}
    if types:
        ours["bert.embeddings.token_type.weight"] = s["embeddings.token_type_embeddings.weight"]
    return ours


def _strip(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {k.removeprefix(prefix): v for k, v in state.items()}


def roberta_classifier_from_state(hf: dict[str, Any], state: dict[str, Tensor],
                                  where: Path | str = "config.json") -> Any:
    """``RobertaForSequenceClassification`` -> BertClassifier (positions from padding_idx + 1, tanh head)."""
    where = Path(where)
    _check_head(hf, where, "RobertaForSequenceClassification")
    n, labels = _labels(hf)
    pad = int(hf.get("pad_token_id", 1))
    config = _config(hf, where, "roberta", n, position_offset=pad + 1)
    s = _strip(state, "roberta.")
    ours = {**_embeddings(s), **_bert_layers(s, config.n_layers),
            "pooler.weight": s["classifier.dense.weight"], "pooler.bias": s["classifier.dense.bias"],
            "head.weight": s["classifier.out_proj.weight"], "head.bias": s["classifier.out_proj.bias"]}
    return _build(config, ours, where, labels)


def electra_classifier_from_state(hf: dict[str, Any], state: dict[str, Tensor],
                                  where: Path | str = "config.json") -> Any:
    """``ElectraForSequenceClassification`` (the discriminator's encoder and its GELU head) -> BertClassifier."""
    where = Path(where)
    _check_head(hf, where, "ElectraForSequenceClassification")
    n, labels = _labels(hf)
    e, d = int(hf.get("embedding_size") or hf["hidden_size"]), int(hf["hidden_size"])
    config = _config(hf, where, "electra", n, embedding_size=e if e != d else 0, pooler_act="gelu")
    s = _strip(state, "electra.")
    ours = {**_embeddings(s), **_bert_layers(s, config.n_layers),
            "pooler.weight": s["classifier.dense.weight"], "pooler.bias": s["classifier.dense.bias"],
            "head.weight": s["classifier.out_proj.weight"], "head.bias": s["classifier.out_proj.bias"]}
    if e != d:
        ours["bert.project.weight"], ours["bert.project.bias"] = (s["embeddings_project.weight"],
                                                                  s["embeddings_project.bias"])
    return _build(config, ours, where, labels)


def distilbert_classifier_from_state(hf: dict[str, Any], state: dict[str, Tensor],
                                     where: Path | str = "config.json") -> Any:
    """``DistilBertForSequenceClassification`` -> BertClassifier (no token types, ReLU pre_classifier head)."""
    where = Path(where)
    _check_head(hf, where, "DistilBertForSequenceClassification")
    if hf.get("sinusoidal_pos_embds"):
        raise CheckpointError(where, "sinusoidal_pos_embds is not supported (learned positions only)")
    n, labels = _labels(hf)
    act = hf.get("activation", "gelu")
    renamed = {"vocab_size": hf["vocab_size"], "hidden_size": hf["dim"], "num_hidden_layers": hf["n_layers"],
               "num_attention_heads": hf["n_heads"], "intermediate_size": hf["hidden_dim"],
               "max_position_embeddings": hf["max_position_embeddings"], "hidden_act": act,
               "type_vocab_size": 0, "layer_norm_eps": 1e-12, "pad_token_id": hf.get("pad_token_id", 0)}
    config = _config(renamed, where, "distilbert", n, pooler_act="relu")
    s = _strip(state, "distilbert.")
    names = ("attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin", "sa_layer_norm",
             "ffn.lin1", "ffn.lin2", "output_layer_norm")
    ours = {f"bert.layers.{i}.{_mine(o)}.{kind}": s[f"transformer.layer.{i}.{t}.{kind}"]
            for i in range(config.n_layers) for t, o in zip(names, _LAYER) for kind in ("weight", "bias")}
    ours.update(_embeddings(s, types=False))
    ours.update({"pooler.weight": s["pre_classifier.weight"], "pooler.bias": s["pre_classifier.bias"],
                 "head.weight": s["classifier.weight"], "head.bias": s["classifier.bias"]})
    return _build(config, ours, where, labels)


def albert_classifier_from_state(hf: dict[str, Any], state: dict[str, Tensor],
                                 where: Path | str = "config.json") -> Any:
    """``AlbertForSequenceClassification`` -> BertClassifier with factorised embeddings and one shared layer."""
    where = Path(where)
    _check_head(hf, where, "AlbertForSequenceClassification")
    if int(hf.get("num_hidden_groups", 1)) != 1 or int(hf.get("inner_group_num", 1)) != 1:
        raise CheckpointError(where, "only ALBERT's published layout is supported: num_hidden_groups = "
                                     "inner_group_num = 1 (one layer shared by every pass)")
    n, labels = _labels(hf)
    config = _config(hf, where, "albert", n, embedding_size=int(hf["embedding_size"]), shared_layers=True,
                     default_act="gelu_new")
    s = _strip(state, "albert.")
    g = "encoder.albert_layer_groups.0.albert_layers.0."
    names = ("attention.query", "attention.key", "attention.value", "attention.dense", "attention.LayerNorm",
             "ffn", "ffn_output", "full_layer_layer_norm")
    ours = {f"bert.layers.{i}.{_mine(o)}.{kind}": s[f"{g}{t}.{kind}"]  # one layer, every pass
            for i in range(config.n_layers) for t, o in zip(names, _LAYER) for kind in ("weight", "bias")}
    ours.update(_embeddings(s))
    ours.update({"bert.project.weight": s["encoder.embedding_hidden_mapping_in.weight"],
                 "bert.project.bias": s["encoder.embedding_hidden_mapping_in.bias"],
                 "pooler.weight": s["pooler.weight"], "pooler.bias": s["pooler.bias"],
                 "head.weight": s["classifier.weight"], "head.bias": s["classifier.bias"]})
    return _build(config, ours, where, labels)


def deberta_v2_classifier_from_state(hf: dict[str, Any], state: dict[str, Tensor],
                                     where: Path | str = "config.json") -> Any:
    """``DebertaV2ForSequenceClassification`` (DeBERTa-v2 and v3) -> ``models.families.deberta.DebertaClassifier``:
    relative attention with log buckets and shared projections (share_att_key) only, as the published models."""
    from models.families.deberta import DebertaClassifier, DebertaConfig
    from models.limits import MAX_TOKENS_MINILM

    where = Path(where)
    _check_head(hf, where, "DebertaV2ForSequenceClassification")
    kinds = hf.get("pos_att_type") or []
    kinds = [k.strip() for k in kinds.split("|")] if isinstance(kinds, str) else list(kinds)
    d = int(hf["hidden_size"])
    if not hf.get("relative_attention", False) or not hf.get("share_att_key", False) or set(kinds) - {"c2p", "p2c"}:
        raise CheckpointError(where, "only DeBERTa's relative attention with shared keys (share_att_key) and "
                                     "c2p / p2c terms is supported")
    head_size = int(hf.get("attention_head_size") or d // int(hf["num_attention_heads"]))
    if int(hf.get("conv_kernel_size", 0) or 0) or int(hf.get("embedding_size") or d) != d or \
            int(hf.get("pooler_hidden_size") or d) != d or head_size * int(hf["num_attention_heads"]) != d:
        raise CheckpointError(where, "a convolution layer, a projected embedding or a resized pooler or head is not "
                                     "supported")
    if hf.get("hidden_act", "gelu") != "gelu" or hf.get("pooler_hidden_act", "gelu") != "gelu":
        raise CheckpointError(where, "only GELU activations are supported")
    n, labels = _labels(hf)
    positions = int(hf["max_position_embeddings"])
    max_rel = int(hf.get("max_relative_positions", -1))
    config = DebertaConfig(
        vocab_size=int(hf["vocab_size"]), d_model=d, n_layers=int(hf["num_hidden_layers"]),
        n_heads=int(hf["num_attention_heads"]), d_ff=int(hf["intermediate_size"]), max_positions=positions,
        type_vocab_size=int(hf.get("type_vocab_size", 0)), layer_norm_eps=float(hf.get("layer_norm_eps", 1e-7)),
        dropout=0.0, attention_dropout=0.0, n_classes=n, pooling="pooler", pad_id=int(hf.get("pad_token_id") or 0),
        max_len=min(MAX_TOKENS_MINILM, positions), origin=f"Hugging Face folder {where.parent.name}",
        position_biased_input=bool(hf.get("position_biased_input", True)),
        position_buckets=int(hf.get("position_buckets", -1)),
        max_relative_positions=max_rel if max_rel >= 1 else positions, c2p="c2p" in kinds, p2c="p2c" in kinds,
        norm_rel_ebd="layer_norm" in str(hf.get("norm_rel_ebd", "none")))
    s = _strip(state, "deberta.")
    names = ("attention.self.query_proj", "attention.self.key_proj", "attention.self.value_proj",
             "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense", "output.dense",
             "output.LayerNorm")
    ours = {f"bert.layers.{i}.{_mine(o)}.{kind}": s[f"encoder.layer.{i}.{t}.{kind}"]
            for i in range(config.n_layers) for t, o in zip(names, _LAYER) for kind in ("weight", "bias")}
    ours.update({"bert.embeddings.word.weight": s["embeddings.word_embeddings.weight"],
                 "bert.embeddings.norm.weight": s["embeddings.LayerNorm.weight"],
                 "bert.embeddings.norm.bias": s["embeddings.LayerNorm.bias"],
                 "bert.rel_embeddings.weight": s["encoder.rel_embeddings.weight"],
                 "pooler.weight": s["pooler.dense.weight"], "pooler.bias": s["pooler.dense.bias"],
                 "head.weight": s["classifier.weight"], "head.bias": s["classifier.bias"]})
    if config.position_biased_input:
        ours["bert.embeddings.position.weight"] = s["embeddings.position_embeddings.weight"]
    if config.type_vocab_size > 0:
        ours["bert.embeddings.token_type.weight"] = s["embeddings.token_type_embeddings.weight"]
    if config.norm_rel_ebd:
        ours["bert.rel_norm.weight"], ours["bert.rel_norm.bias"] = s["encoder.LayerNorm.weight"], \
            s["encoder.LayerNorm.bias"]
    return _build(config, ours, where, labels, DebertaClassifier)
