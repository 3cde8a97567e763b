"""Hugging Face model folders read into the project's own classes (transformers is never imported here).

A folder holds ``config.json`` with a ``model_type``, ``model.safetensors`` (weights only: a folder with only
``pytorch_model.bin`` is refused, since reading it means unpickling) and ``tokenizer.json``. Supported:

- ``gpt2`` causal LMs -> ``models.families.gpt.GPT`` with ``recipe="gpt2"``. GPT-2 stores its projections as
  ``Conv1D`` (y = x W + b, W of shape (in, out)), the transpose of ``nn.Linear``'s, and its q, k and v as
  one (d, 3d) matrix ``c_attn``; both are undone here.
- ``bert`` sequence classifiers (``BertForSequenceClassification``: its pooler and classifier, labels from
  ``id2label``) -> ``models.families.bert.BertClassifier`` with ``pooling="pooler"``.
- ``llama`` causal LMs (LLaMA, SmolLM2, TinyLlama...) -> ``models.families.gpt.GPT`` with ``recipe="llama"``, RoPE in
  Hugging Face's rotate-half layout (``rope_layout="half"``) and grouped-query attention from
  ``num_key_value_heads``; RoPE scaling variants are refused.
- ``vit`` image classifiers (``ViTForImageClassification``, labels from ``id2label``) -> ``models.families.vit.ViT``
  with
  the folder's ``preprocessor_config.json`` as its input preparation (``models.inputs.images.processor_spec``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from torch import Tensor
from torch.overrides import TorchFunctionMode

from models import registry
from models.io.checkpoint import CheckpointError

_ASSIGN: ContextVar[bool] = ContextVar("assign_weights", default=False)


@contextmanager
def assigning_weights() -> Iterator[None]:
    """Within it the decoder readers (``llama_from_state``, ``models.io.hf_decoders``) give the model the state
    dict's own float32 tensors as its parameters: no random initialisation first and no copy, so a model read from
    a fresh state dict (a dequantised GGUF file, a safetensors cache entry) takes its weights' memory once, not
    twice. The state dict's tensors then *are* the parameters: only for a state dict nothing else will change."""
    token = _ASSIGN.set(True)
    try:
        yield
    finally:
        _ASSIGN.reset(token)


class _NoInit(TorchFunctionMode):
    """Initialisers (``torch.nn.init.*_``, ``Tensor.normal_`` ...) left undone, for a model made on the meta device
    whose parameters are assigned next: there they would do nothing useful, and torch's meta kernel for ``normal_``
    imports its compiler (150 MB of memory). A torch function mode: this thread's only."""

    SKIP = frozenset({"normal_", "uniform_", "zero_", "zeros_", "ones_", "fill_", "constant_", "trunc_normal_",
                      "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_", "orthogonal_"})

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in self.SKIP:
            return args[0] if args else kwargs.get("tensor", kwargs.get("self"))
        return func(*args, **kwargs)


def load_gpt(config: Any, ours: dict[str, Tensor], where: Path, name: str) -> Any:
    """``models.families.gpt.GPT(config)`` holding ``ours`` (its own parameter names): float32 copies, or, within
    ``assigning_weights``, the tensors themselves (parameters created empty, then assigned; a tied output projection
    tied again). Weights that do not fit are a CheckpointError naming them."""
    from models.families.gpt import GPT

    weights = {k: v.float().contiguous() for k, v in ours.items()}
    if _ASSIGN.get():
        import torch

        with torch.device("meta"), _NoInit():  # nothing allocated or initialised (both modes: this thread's only)
            model = GPT(config)
        missing, unexpected = model.load_state_dict(weights, strict=False, assign=True)
        if config.tie_embeddings:
            model.lm_head.weight = model.embed.weight
        model.reset_buffers()  # the RoPE tables, on the CPU
        if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
            raise CheckpointError(where, f"weights do not fit {name}: some were never given")
    else:
        model = GPT(config)
        missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise CheckpointError(where, f"weights do not fit {name}: missing {missing}, unexpected {unexpected}")
    return model


def is_hf_folder(folder: Path) -> bool:
    """A Hugging Face folder: its config.json names a ``model_type`` and has no project ``format``."""
    try:
        meta = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and "model_type" in meta and "format" not in meta


def _read_config(folder: Path) -> tuple[Path, dict, str, Any]:
    """(config.json's path, its contents, its model_type, the registered family) of a Hugging Face folder, or a
    CheckpointError in words."""
    config_path = folder / "config.json"
    try:
        hf = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(config_path, f"unreadable: {err}") from None
    kind = hf.get("model_type")
    family = registry.by_model_type(kind) if isinstance(kind, str) else None
    if family is None:
        raise CheckpointError(config_path, f"model_type {kind!r} is not supported here (supported: "
                                           f"{', '.join(registry.hf_types())})")
    return config_path, hf, kind, family


def load_hf(folder: str | Path) -> Any:
    """The model of a Hugging Face folder as the project's own class, in eval mode, with its tokenizer."""
    folder = Path(folder)
    config_path, hf, kind, family = _read_config(folder)
    state = _weights(folder)
    try:
        model = family.hf_reader(kind)(hf, state, config_path)
    except KeyError as err:
        raise CheckpointError(folder / "model.safetensors", f"no tensor or config entry {err} for {kind}") from None
    if not family.text:  # an image classifier: its preprocessing from preprocessor_config.json
        return _with_processor(model, folder).float().eval()
    if getattr(model, "tokenizer", None) is not None:  # the reader attached its own (Marian's SentencePiece pair)
        return model.float().eval()
    from models.inputs.tokenizer import JsonTokenizer, folder_tokenizer

    try:  # tokenizer.json, or BERT's vocab.txt / GPT-2's vocab.json + merges.txt
        pipeline = folder_tokenizer(folder, kind)
    except (FileNotFoundError, ValueError, OSError) as err:
        raise CheckpointError(folder / "tokenizer.json", f"no usable tokenizer: {err}") from None
    if "generate" not in family.tabs:  # a text classifier: [CLS] text [SEP], as its post-processor adds them
        model.tokenizer = JsonTokenizer(folder / "tokenizer.json", {}, model.config.max_len, tokenizer=pipeline)
        model.text = {}
        return model.float().eval()
    attach_decoder_tokenizer(model, folder, hf, pipeline)
    return model.float().eval()


def attach_decoder_tokenizer(model: Any, folder: Path, hf: dict[str, Any], pipeline: Any = None) -> None:
    """A language model's tokenizer as ``load_hf`` gives it (also to one ``models.io.bigmodel`` dispatched): the
    folder's pipeline cut at the model's context, the config's BOS and EOS ids, the prompt encoded as transformers
    encodes it; with ``labels`` and ``text`` empty."""
    from models.inputs.tokenizer import JsonTokenizer, folder_tokenizer

    if pipeline is None:
        try:
            pipeline = folder_tokenizer(folder, hf.get("model_type", ""))
        except (FileNotFoundError, ValueError, OSError) as err:
            raise CheckpointError(folder / "tokenizer.json", f"no usable tokenizer: {err}") from None
    tok = JsonTokenizer(folder / "tokenizer.json", {}, model.context_limit(), tokenizer=pipeline)
    tok.bos_id = _token_id(hf, "bos_token_id", tok.bos_id)
    tok.eos_id = _token_id(hf, "eos_token_id", tok.eos_id)
    tok.adds_bos = False  # the prompt is encoded as transformers encodes it
    model.tokenizer = tok
    model.labels, model.text = [], {}


def _token_id(hf: dict[str, Any], key: str, default: int) -> int:
    """A special token id from config.json: absent or null gives ``default``; a list gives its first id."""
    value = hf.get(key)
    if isinstance(value, list):
        value = value[0] if value else None
    return default if value is None else int(value)


def rope_params(hf: dict[str, Any], where: Path, key: str | None = None, default: float = 10000.0
                ) -> tuple[float, float]:
    """The one reader of a config's RoPE: (θ, the fraction of each head that rotates). transformers 4's rope_theta /
    rope_scaling / partial_rotary_factor, 5's rope_parameters (per layer type with ``key``), GPT-NeoX's rotary_pct and
    rotary_emb_base; any rotation but the default one (linear, dynamic, YaRN, LongRoPE scaling) is refused."""
    params = hf.get("rope_parameters") or {}
    if key is not None and isinstance(params.get(key), dict):
        params = params[key]
    elif key is not None:
        params = {}
    rope = {**(hf.get("rope_scaling") or {}), **params}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise CheckpointError(where, f"RoPE scaling {rope!r} is not supported (only the default RoPE)")
    fraction = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", hf.get("rotary_pct", 1.0)))
    theta = rope.get("rope_theta") or hf.get("rope_theta") or hf.get("rotary_emb_base") or default
    return float(theta), float(fraction or 1.0)


def rotary_dim(fraction: float, d_head: int, where: Path) -> int:
    """The dimensions of each head RoPE turns, as transformers computes them (int(d_head · fraction)); 0 = all."""
    r = int(d_head * fraction)
    if r == d_head:
        return 0
    if r < 2 or r % 2:
        raise CheckpointError(where, f"a partial rotary factor of {fraction} turns {r} of {d_head} dimensions "
                                     "(an even number from 2 up is needed)")
    return r


_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
           "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def header_state(folder: Path) -> dict[str, Tensor]:
    """The folder's tensors as meta tensors (names, shapes and dtypes from the safetensors headers; no weight is
    read): what ``check_folder`` runs a reader on."""
    import struct

    import torch

    files = sorted(folder.glob("model*.safetensors"))
    if not files:
        return _weights(folder)  # its refusal names what is there instead
    state: dict[str, Tensor] = {}
    for f in files:
        try:
            with f.open("rb") as handle:
                (size,) = struct.unpack("<Q", handle.read(8))
                if size > 100 << 20:
                    raise ValueError("header over 100 MB")
                header = json.loads(handle.read(size))
            for name, info in header.items():
                if name != "__metadata__":
                    dtype = getattr(torch, _DTYPES.get(info["dtype"], "float32"))
                    state[name] = torch.empty(info["shape"], dtype=dtype, device="meta")
        except (OSError, ValueError, KeyError, TypeError, struct.error) as err:
            raise CheckpointError(f, f"unreadable safetensors file: {err}") from None
    return state


def check_folder(folder: str | Path) -> bool:
    """Raise the CheckpointError that ``load_hf`` would raise for the folder's weights and tokenizer, without reading a
    weight: the family's reader runs on meta tensors made from the safetensors headers (names and shapes), so a
    missing or misshapen tensor is named, in the folder's own names, at start-up (serving.catalogue.check_configured).
    A problem a reader finds only in the values is left to the load. Returns whether the weights were checked (False:
    the reader reads a value, as T5's tied-head scale does, so only the load can tell)."""
    import torch

    folder = Path(folder)
    config_path, hf, kind, family = _read_config(folder)
    state = header_state(folder)
    try:
        with torch.device("meta"):
            model = family.hf_reader(kind)(hf, state, config_path)
    except KeyError as err:
        raise CheckpointError(folder / "model.safetensors", f"no tensor or config entry {err} for {kind}") from None
    except CheckpointError:
        raise
    except Exception:  # noqa: BLE001 (a reader that reads values: meta tensors have none; the load will tell)
        return False
    if family.text and getattr(model, "tokenizer", None) is None:  # as load_hf: the folder's tokenizer files
        from models.inputs.tokenizer import folder_tokenizer

        try:
            folder_tokenizer(folder, kind)
        except (FileNotFoundError, ValueError, OSError) as err:
            raise CheckpointError(folder / "tokenizer.json", f"no usable tokenizer: {err}") from None
    return True


def _weights(folder: Path) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("model*.safetensors"))
    if not files:
        pickled = [p.name for p in folder.glob("*.bin")]
        why = f"only {', '.join(pickled)} (pickle, refused)" if pickled else "no model.safetensors"
        raise CheckpointError(folder / "model.safetensors", f"{why}: safetensors weights are needed")
    state: dict[str, Tensor] = {}
    for f in files:
        try:
            state.update(load_file(f))
        except Exception as err:  # a truncated or corrupt file
            raise CheckpointError(f, f"unreadable safetensors file: {err}") from None
    return state


def gpt2_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json") -> Any:
    """``models.families.gpt.GPT`` (recipe "gpt2") from a GPT-2 config dict and a transformers state dict (with or
    without the ``transformer.`` prefix), without a tokenizer."""
    from models.families.gpt import GPT, GPTConfig

    where = Path(where)
    d = int(hf["n_embd"])
    if hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise CheckpointError(where, f"activation {hf['activation_function']!r} is not supported (gelu_new)")
    if hf.get("scale_attn_by_inverse_layer_idx") or not hf.get("scale_attn_weights", True):
        raise CheckpointError(where, "only GPT-2's standard 1/√d_head attention scale is supported")
    config = GPTConfig(recipe="gpt2", vocab_size=int(hf["vocab_size"]), max_len=int(hf["n_positions"]), d_model=d,
                       n_layers=int(hf["n_layer"]), n_heads=int(hf["n_head"]), d_ff=int(hf.get("n_inner") or 4 * d),
                       norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
                       tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
                       bos_id=_token_id(hf, "bos_token_id", 50256), eos_id=_token_id(hf, "eos_token_id", 50256),
                       pad_id=-1)
    s = {k.removeprefix("transformer."): v for k, v in state.items()}
    ours: dict[str, Tensor] = {"embed.weight": s["wte.weight"], "positions.weight": s["wpe.weight"],
                               "norm.weight": s["ln_f.weight"], "norm.bias": s["ln_f.bias"]}
    for i in range(config.n_layers):
        h, o = f"h.{i}.", f"blocks.{i}."
        for a, b in (("ln_1", "norm1"), ("ln_2", "norm2")):
            ours[o + b + ".weight"], ours[o + b + ".bias"] = s[h + a + ".weight"], s[h + a + ".bias"]
        qkv_w, qkv_b = s[h + "attn.c_attn.weight"].t(), s[h + "attn.c_attn.bias"]  # Conv1D (d, 3d) -> (3d, d)
        for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
            ours[o + f"attn.{name}.weight"] = qkv_w[j * d : (j + 1) * d]
            ours[o + f"attn.{name}.bias"] = qkv_b[j * d : (j + 1) * d]
        for a, b in (("attn.c_proj", "attn.o_proj"), ("mlp.c_fc", "ff.up"), ("mlp.c_proj", "ff.down")):
            ours[o + b + ".weight"], ours[o + b + ".bias"] = s[h + a + ".weight"].t(), s[h + a + ".bias"]
    if config.tie_embeddings:
        ours["lm_head.weight"] = ours["embed.weight"]
    else:
        ours["lm_head.weight"] = state["lm_head.weight"]
    model = GPT(config)
    missing, unexpected = model.load_state_dict({k: v.float().contiguous() for k, v in ours.items()}, strict=False)
    if missing or unexpected:
        raise CheckpointError(where, f"weights do not fit GPT-2: missing {missing}, unexpected {unexpected}")
    return model


def llama_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json",
                     config_only: bool = False, keep: bool = False) -> Any:
    """``models.families.gpt.GPT`` (recipe "llama", rotate-half RoPE) from a LLaMA config dict and state dict.
    ``config_only``: just its ``GPTConfig`` (``models/io/bigmodel.py`` reads the weights itself). ``keep``: the
    weights as given, same dtype, device and storage (an 8 B model in bfloat16 on a GPU is not copied, nor
    initialised at random first); otherwise float32 copies, as the app loads them."""
    from models.families.gpt import GPT, GPTConfig

    where = Path(where)
    d, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    theta, fraction = rope_params(hf, where)
    if fraction != 1.0:
        raise CheckpointError(where, "a partial rotary factor is not supported for LLaMA (RoPE over the whole head)")
    if int(hf.get("head_dim") or d // heads) != d // heads:
        raise CheckpointError(where, "a head_dim other than hidden_size / num_attention_heads is not supported")
    if hf.get("attention_bias") or hf.get("mlp_bias") or hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(where, "only the plain LLaMA block (no biases, SiLU) is supported")
    config = GPTConfig(recipe="llama", vocab_size=int(hf["vocab_size"]), max_len=int(hf["max_position_embeddings"]),
                       d_model=d, n_layers=int(hf["num_hidden_layers"]), n_heads=heads,
                       n_kv_heads=int(hf.get("num_key_value_heads") or heads), d_ff=int(hf["intermediate_size"]),
                       norm_eps=float(hf.get("rms_norm_eps", 1e-6)), rope_base=theta,
                       rope_layout="half", tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
                       bos_id=_token_id(hf, "bos_token_id", 1), eos_id=_token_id(hf, "eos_token_id", 2), pad_id=-1)
    if config_only:
        return config
    s = {k.removeprefix("model."): v for k, v in state.items()}
    ours: dict[str, Tensor] = {"embed.weight": s["embed_tokens.weight"], "norm.weight": s["norm.weight"]}
    for i in range(config.n_layers):
        h, o = f"layers.{i}.", f"blocks.{i}."
        ours[o + "norm1.weight"] = s[h + "input_layernorm.weight"]
        ours[o + "norm2.weight"] = s[h + "post_attention_layernorm.weight"]
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            ours[o + f"attn.{name}.weight"] = s[h + f"self_attn.{name}.weight"]
        for a, b in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
            ours[o + f"ff.{b}.weight"] = s[h + f"mlp.{a}.weight"]
    ours["lm_head.weight"] = ours["embed.weight"] if config.tie_embeddings else state["lm_head.weight"]
    if keep:
        from accelerate import init_empty_weights

        with init_empty_weights():  # parameters on meta (no random initialisation), buffers real
            model = GPT(config)
        missing, unexpected = model.load_state_dict(ours, strict=False, assign=True)
        model.angles = model.angles.to(ours["embed.weight"].device)
        if config.tie_embeddings:
            model.lm_head.weight = model.embed.weight
    else:
        return load_gpt(config, ours, where, "LLaMA")
    if missing or unexpected:
        raise CheckpointError(where, f"weights do not fit LLaMA: missing {missing}, unexpected {unexpected}")
    return model


def bert_classifier_from_state(hf: dict[str, Any], state: dict[str, Tensor],
                               where: Path | str = "config.json") -> Any:
    """``models.families.bert.BertClassifier`` (pooler pooling) from a ``BertForSequenceClassification`` folder."""
    from models.families.bert import BertClassifier, config_from_hf, hf_name, hf_to_ours

    where = Path(where)
    if "BertForSequenceClassification" not in (hf.get("architectures") or []):
        raise CheckpointError(where, "a bert folder needs BertForSequenceClassification (a classification head)")
    if hf.get("problem_type") not in (None, "single_label_classification"):
        raise CheckpointError(where, f"problem_type {hf['problem_type']!r} is not supported (single-label)")
    id2label = hf.get("id2label") or {}
    n = len(id2label) or int(hf.get("num_labels", 2))
    try:
        config = config_from_hf(hf, n_classes=n, pooling="pooler", origin=f"Hugging Face folder {where.parent.name}")
    except ValueError as err:
        raise CheckpointError(where, str(err)) from None
    encoder, _ignored = hf_to_ours(state)  # the pooler and the classifier are read here, below
    ours = {f"bert.{k}": v for k, v in encoder.items()}
    ours.update({"pooler.weight": state["bert.pooler.dense.weight"], "pooler.bias": state["bert.pooler.dense.bias"],
                 "head.weight": state["classifier.weight"], "head.bias": state["classifier.bias"]})
    model = BertClassifier(config)
    expected = model.state_dict()
    for k, t in ours.items():
        if k in expected and tuple(t.shape) != tuple(expected[k].shape):
            name = f"bert.{hf_name(k.removeprefix('bert.'))}" if k.startswith("bert.") else k
            raise CheckpointError(where.parent / "model.safetensors", f"tensor {name} has shape {tuple(t.shape)}, "
                                  f"config.json says {tuple(expected[k].shape)}")
    missing, unexpected = model.load_state_dict({k: v.float().contiguous() for k, v in ours.items()}, strict=False)
    if missing:  # named as the folder names them: bert.encoder.layer.1.attention.self.query.weight
        theirs = [f"bert.{hf_name(k.removeprefix('bert.'))}" for k in missing]
        raise CheckpointError(where.parent / "model.safetensors", f"no tensor {', '.join(theirs[:4])}"
                              + (f" (and {len(theirs) - 4} more)" if len(theirs) > 4 else "") + " (bert)")
    if unexpected:
        raise CheckpointError(where, f"weights do not fit BERT: unexpected {unexpected}")
    model.labels = [str(id2label.get(str(i), id2label.get(i, i))) for i in range(n)]
    return model


def _with_processor(model: Any, folder: Path) -> Any:
    """Give an image classifier the preprocessing of the folder's ``preprocessor_config.json``."""
    from models.inputs.images import processor_spec

    path = folder / "preprocessor_config.json"
    try:
        pre = json.loads(path.read_text(encoding="utf-8"))
        model.config.processor = processor_spec(pre, model.config.image_size)
    except (OSError, ValueError, TypeError, AttributeError) as err:
        raise CheckpointError(path, f"missing or not usable: {err}") from None
    model.config.input = "processor"
    return model


def vit_classifier_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json") -> Any:
    """``models.families.vit.ViT`` from a ``ViTForImageClassification`` folder (CLS token read after the final
    LayerNorm), without its preprocessing (``load_hf`` adds it)."""
    from models.families.vit import ViT, ViTConfig

    where = Path(where)
    if "ViTForImageClassification" not in (hf.get("architectures") or []):
        raise CheckpointError(where, "a vit folder needs ViTForImageClassification (a classification head)")
    config = vit_config(ViTConfig, hf, where, prefix_tokens=1)  # ViTForImageClassification: [CLS] alone
    s = {k.removeprefix("vit."): v for k, v in state.items()}
    ours = vit_encoder_state(s, config.depth)
    ours.update({"head.weight": s["classifier.weight"], "head.bias": s["classifier.bias"]})
    return load_vit_like(ViT(config, labels=hf_labels(hf)), ours, where)


def hf_labels(hf: dict[str, Any]) -> list[str]:
    """A classifier folder's class names, in index order (``id2label``; "0", "1", ... without one)."""
    id2label = hf.get("id2label") or {}
    n = len(id2label) or int(hf.get("num_labels", 2))
    return [str(id2label.get(str(i), id2label.get(i, i))) for i in range(n)]


def vit_config(config_class: type, hf: dict[str, Any], where: Path, **fields: Any) -> Any:
    """A ViT-shaped config (``ViTConfig`` or a subclass) from a ViT-like Hugging Face config.json (vit, deit)."""
    if hf.get("hidden_act", "gelu") != "gelu" or not hf.get("qkv_bias", True):
        raise CheckpointError(where, "only the standard ViT block (exact GELU, q/k/v biases) is supported")
    return config_class(image_size=int(hf.get("image_size", 224)), in_channels=int(hf.get("num_channels", 3)),
                        patch=int(hf.get("patch_size", 16)), dim=int(hf["hidden_size"]),
                        depth=int(hf["num_hidden_layers"]), heads=int(hf["num_attention_heads"]),
                        mlp_dim=int(hf["intermediate_size"]), num_classes=len(hf_labels(hf)), dropout=0.0,
                        attention_dropout=0.0, norm_eps=float(hf.get("layer_norm_eps", 1e-12)), input="processor",
                        **fields)


def vit_encoder_state(s: dict[str, Tensor], depth: int) -> dict[str, Tensor]:
    """A ViT-like encoder's weights (the model prefix, "vit." or "deit.", removed) in ``ViT``'s names: the class
    token, position embeddings, patch projection, every block and the final LayerNorm (the head is the caller's)."""
    ours: dict[str, Tensor] = {
        "cls_token": s["embeddings.cls_token"], "pos_embed": s["embeddings.position_embeddings"],
        "patch_embed.weight": s["embeddings.patch_embeddings.projection.weight"],
        "patch_embed.bias": s["embeddings.patch_embeddings.projection.bias"],
        "norm.weight": s["layernorm.weight"], "norm.bias": s["layernorm.bias"]}
    names = {"attention.attention.query": "attn.q_proj", "attention.attention.key": "attn.k_proj",
             "attention.attention.value": "attn.v_proj", "attention.output.dense": "attn.out_proj",
             "layernorm_before": "ln_1", "layernorm_after": "ln_2", "intermediate.dense": "mlp.0",
             "output.dense": "mlp.3"}
    for i in range(depth):
        for theirs, mine in names.items():
            for kind in ("weight", "bias"):
                ours[f"blocks.{i}.{mine}.{kind}"] = s[f"encoder.layer.{i}.{theirs}.{kind}"]
    return ours


def load_vit_like(model: Any, ours: dict[str, Tensor], where: Path) -> Any:
    """``model`` with ``ours`` loaded exactly (float32), or a CheckpointError naming what does not fit."""
    missing, unexpected = model.load_state_dict({k: v.float().contiguous() for k, v in ours.items()}, strict=False)
    if missing or unexpected:
        raise CheckpointError(where, f"weights do not fit {type(model).__name__}: missing {missing}, "
                                     f"unexpected {unexpected}")
    return model
