"""Hugging Face translators read into the project's own ``models.families.translator.Translator`` (transformers is
never imported here; the registry names each reader, ``models.io.hf.load_hf`` calls it).

``marian`` (``MarianMTModel``, the opus-mt models of Tiedemann & Thottingal 2020, trained with Marian NMT) is the
Transformer of Vaswani et al. (2017) in its original post-norm form, so it is the Translator with switches
(``TranslatorConfig``): sinusoidal positions with every sine before every cosine (``positions="half"``), the
feed-forward activation of the config (swish for opus-mt), the encoder's and the decoder's own feed-forward widths
(``encoder_ffn_dim``, ``decoder_ffn_dim``: equal in the released models, not necessarily), embeddings × √d only with
``scale_embedding``, a bias on the output logits (``final_logits_bias``), decoding started from ``<pad>``
(``decoder_start_token_id``), ``<pad>`` never produced (generation_config.json ``bad_words_ids``) and eos forced at
the last allowed step (``forced_eos_token_id``), as transformers' ``generate`` does. The tokenizer is the folder's
SentencePiece pair (``models.inputs.tokenizer.MarianTokenizer``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import Tensor

from models.io.checkpoint import CheckpointError


def _generation(folder: Path) -> dict[str, Any]:
    try:
        found = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def marian_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json") -> Any:
    """``MarianMTModel`` config and weights -> Translator, with the folder's MarianTokenizer attached."""
    from models.families.translator import Translator, TranslatorConfig
    from models.inputs.tokenizer import MarianTokenizer

    where = Path(where)
    folder = where.parent
    if hf.get("encoder_attention_heads") != hf.get("decoder_attention_heads"):
        raise CheckpointError(where, "encoder and decoder of different head counts are not supported")
    if hf.get("normalize_before") or hf.get("add_final_layer_norm") or hf.get("normalize_embedding"):
        raise CheckpointError(where, "only Marian's post-norm layout is supported (no pre-norm, no extra norms)")
    act = str(hf.get("activation_function", "gelu"))
    if act not in ("relu", "swish", "silu", "gelu"):
        raise CheckpointError(where, f"activation {act!r} is not supported (relu, swish, gelu)")
    vocab, target_vocab = int(hf["vocab_size"]), int(hf.get("decoder_vocab_size") or hf["vocab_size"])
    shared = bool(hf.get("share_encoder_decoder_embeddings", True))
    if vocab != target_vocab:
        raise CheckpointError(where, "source and target vocabularies of different sizes are not supported")
    gen = {**hf, **_generation(folder)}
    pad, eos = int(hf["pad_token_id"]), int(gen.get("eos_token_id", hf.get("eos_token_id", 0)))
    blocked = sorted({int(w[0]) for w in gen.get("bad_words_ids") or [] if isinstance(w, list) and len(w) == 1})
    d = int(hf["d_model"])
    config = TranslatorConfig(
        vocab_size=vocab, d_model=d, n_heads=int(hf["encoder_attention_heads"]),
        n_enc_layers=int(hf["encoder_layers"]), n_dec_layers=int(hf["decoder_layers"]),
        d_ff=int(hf["encoder_ffn_dim"]), d_ff_dec=int(hf.get("decoder_ffn_dim") or hf["encoder_ffn_dim"]),
        dropout=0.0, tie_embeddings=shared, norm_first=False,
        max_len=int(hf.get("max_position_embeddings", 512)), pad_id=pad,
        bos_id=int(gen.get("decoder_start_token_id", hf.get("decoder_start_token_id", pad))), eos_id=eos,
        family="marian", positions="half", activation=act, scale_embedding=bool(hf.get("scale_embedding", False)),
        tie_output=bool(hf.get("tie_word_embeddings", True)), logits_bias=True, blocked_ids=tuple(blocked),
        forced_eos=gen.get("forced_eos_token_id") == eos)
    s = {k.removeprefix("model."): v for k, v in state.items()}
    src = s["shared.weight"] if "shared.weight" in s else s["encoder.embed_tokens.weight"]
    tgt = s["shared.weight"] if shared and "shared.weight" in s else s.get("decoder.embed_tokens.weight", src)
    ours: dict[str, Tensor] = {"src_embed.weight": src, "generator.bias": s["final_logits_bias"].reshape(-1)}
    if not shared:
        ours["tgt_embed.weight"] = tgt
    if not (shared or config.tie_output):
        ours["generator.weight"] = state["lm_head.weight"]
    common = {"self_attn.q_proj": "self_attn.q_proj", "self_attn.k_proj": "self_attn.k_proj",
              "self_attn.v_proj": "self_attn.v_proj", "self_attn.out_proj": "self_attn.out_proj",
              "self_attn_layer_norm": "norm1", "fc1": "ff.0", "fc2": "ff.3"}
    for i in range(config.n_enc_layers):
        for theirs, mine in {**common, "final_layer_norm": "norm2"}.items():
            for kind in ("weight", "bias"):
                ours[f"encoder.{i}.{mine}.{kind}"] = s[f"encoder.layers.{i}.{theirs}.{kind}"]
    cross = {"encoder_attn.q_proj": "cross_attn.q_proj", "encoder_attn.k_proj": "cross_attn.k_proj",
             "encoder_attn.v_proj": "cross_attn.v_proj", "encoder_attn.out_proj": "cross_attn.out_proj",
             "encoder_attn_layer_norm": "norm2", "final_layer_norm": "norm3"}
    for i in range(config.n_dec_layers):
        for theirs, mine in {**common, **cross}.items():
            for kind in ("weight", "bias"):
                ours[f"decoder.{i}.{mine}.{kind}"] = s[f"decoder.layers.{i}.{theirs}.{kind}"]
    model = Translator(config)
    missing, unexpected = _load_checked(model, ours, folder)
    missing = [m for m in missing if not _tied(m, config)]
    if missing or unexpected:
        raise CheckpointError(where, f"weights do not fit Marian: missing {missing}, unexpected {unexpected}")
    try:
        model.tokenizer = MarianTokenizer(folder, max_tokens=config.max_len)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise CheckpointError(folder / "source.spm", f"no usable Marian tokenizer (source.spm, target.spm, "
                                                     f"vocab.json): {err}") from None
    model.labels, model.text = [], {}
    return model


def _load_checked(model: Any, ours: dict[str, Tensor], folder: Path) -> tuple[list[str], list[str]]:
    """Load the mapped tensors into ``model`` (float32), refusing by name one whose shape the config contradicts;
    returns (missing, unexpected) names for the caller, who knows which are tied and may be absent."""
    expected = model.state_dict()
    for name, t in ours.items():
        if name in expected and tuple(t.shape) != tuple(expected[name].shape):
            raise CheckpointError(folder / "model.safetensors", f"tensor for {name} has shape {tuple(t.shape)}, "
                                                                f"the config says {tuple(expected[name].shape)}")
    return model.load_state_dict({k: v.float().contiguous() for k, v in ours.items()}, strict=False)


def _tied(name: str, config: Any) -> bool:
    """A parameter that is another one (tied tables): loading the other filled it."""
    if name == "tgt_embed.weight":
        return config.tie_embeddings
    return name == "generator.weight" and (config.tie_embeddings or config.tie_output)


def t5_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json") -> Any:
    """``T5ForConditionalGeneration`` config and weights -> ``models.families.t5.T5``, with the folder's
    tokenizer.json (``models.inputs.tokenizer.T5Tokenizer``) and the English → German task prefix of the config's
    ``task_specific_params`` attached. ``feed_forward_proj`` "relu" (T5) or "gated-gelu" (v1.1, Flan); the output
    projection is ``lm_head.weight`` when the folder has one (untied), else the shared table; the d_model^-0.5
    rescale as the config says (``scale_decoder_outputs``, else ``tie_word_embeddings`` not false)."""
    from models.blocks.layers import ACTIVATIONS
    from models.families.t5 import T5, T5Config
    from models.inputs.tokenizer import T5Tokenizer

    where = Path(where)
    folder = where.parent
    proj = str(hf.get("feed_forward_proj", "relu"))
    parts = proj.split("-")
    act = "gelu_new" if proj == "gated-gelu" else parts[-1]
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated") or act not in ACTIVATIONS:
        raise CheckpointError(where, f"feed_forward_proj {proj!r} is not supported (relu, gelu, silu, optionally "
                                     "gated-)")
    gen = {**hf, **_generation(folder)}
    pad, eos = int(hf.get("pad_token_id", 0)), gen.get("eos_token_id", hf.get("eos_token_id", 1))
    eos = int(eos[0] if isinstance(eos, list) else eos)
    s = {k: v for k, v in state.items() if not k.startswith("encoder.embed_tokens")
         and not k.startswith("decoder.embed_tokens")}
    untied = "lm_head.weight" in s and not _same(s["lm_head.weight"], s.get("shared.weight"))
    scale = hf.get("scale_decoder_outputs")
    scale = bool(hf.get("tie_word_embeddings", True) is not False) if scale is None else bool(scale)
    task = (hf.get("task_specific_params") or {}).get("translation_en_to_de") or {}
    n_enc = int(hf["num_layers"])
    config = T5Config(
        vocab_size=int(hf["vocab_size"]), d_model=int(hf["d_model"]), n_heads=int(hf["num_heads"]),
        n_enc_layers=n_enc, n_dec_layers=int(hf.get("num_decoder_layers") or n_enc), d_ff=int(hf["d_ff"]),
        dropout=0.0, tie_embeddings=True, norm_first=True, max_len=int(gen.get("n_positions", 512) or 512),
        pad_id=pad, bos_id=int(gen.get("decoder_start_token_id", pad)), eos_id=eos, family="t5",
        activation=act, scale_embedding=False, tie_output=not untied, d_head=int(hf.get("d_kv", 64)),
        num_buckets=int(hf.get("relative_attention_num_buckets", 32)),
        max_distance=int(hf.get("relative_attention_max_distance", 128)), gated=len(parts) == 2,
        eps=float(hf.get("layer_norm_epsilon", 1e-6)), scale_output=scale, prefix=str(task.get("prefix", "")))
    ours: dict[str, Tensor] = {"src_embed.weight": s["shared.weight"]}
    if untied:
        ours["generator.weight"] = s["lm_head.weight"]
    attn = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}
    ff = {"wi": "wi", "wo": "wo"} if not config.gated else {"wi_0": "wi", "wi_1": "wi_1", "wo": "wo"}
    for stack, n, blocks in (("encoder", config.n_enc_layers, ("SelfAttention", "ff")),
                             ("decoder", config.n_dec_layers, ("SelfAttention", "EncDecAttention", "ff"))):
        for i in range(n):
            for j, block in enumerate(blocks):
                theirs = f"{stack}.block.{i}.layer.{j}"
                ours[f"{stack}.{i}.norm{j + 1}.weight"] = s[f"{theirs}.layer_norm.weight"]
                if block == "ff":
                    for t, m in ff.items():
                        ours[f"{stack}.{i}.ff.{m}.weight"] = s[f"{theirs}.DenseReluDense.{t}.weight"]
                else:
                    mine = "self_attn" if block == "SelfAttention" else "cross_attn"
                    for t, m in attn.items():
                        ours[f"{stack}.{i}.{mine}.{m}.weight"] = s[f"{theirs}.{block}.{t}.weight"]
        bias = "enc_bias" if stack == "encoder" else "dec_bias"
        ours[f"{bias}.table.weight"] = s[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
        ours[f"{'enc' if stack == 'encoder' else 'dec'}_norm.weight"] = s[f"{stack}.final_layer_norm.weight"]
    model = T5(config)
    missing, unexpected = _load_checked(model, ours, folder)
    missing = [m for m in missing if not (m == "generator.weight" and config.tie_output)
               and not (m == "tgt_embed.weight")]
    if missing or unexpected:
        raise CheckpointError(where, f"weights do not fit T5: missing {missing}, unexpected {unexpected}")
    if not (folder / "tokenizer.json").is_file():
        spiece = " (spiece.model alone is not read: save the tokenizer with transformers to write tokenizer.json)" \
            if (folder / "spiece.model").is_file() else ""
        raise CheckpointError(folder / "tokenizer.json", f"no tokenizer.json{spiece}")
    try:
        model.tokenizer = T5Tokenizer(folder / "tokenizer.json", max_tokens=config.max_len, prefix=config.prefix)
    except Exception as err:  # tokenizers raises a bare Exception for a file it cannot parse
        raise CheckpointError(folder / "tokenizer.json", f"no usable T5 tokenizer: {err}") from None
    model.labels, model.text = [], {}
    return model


def _same(a: Tensor, b: Tensor | None) -> bool:
    """Whether an lm_head is the shared table itself (a folder that stored both)."""
    return b is not None and a.shape == b.shape and bool((a == b).all())
