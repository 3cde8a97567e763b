"""Models larger than one device: accelerate's big-model inference onto the project's own ``models.families.gpt.GPT``
(issue 52, "larger than one GPU"; https://huggingface.co/docs/accelerate/usage_guides/big_modeling).

The model is built on the meta device (``accelerate.init_empty_weights``: parameters without storage, buffers such
as the RoPE angles real), a device map says where each block goes (``infer_auto_device_map`` over the GPUs, then
the CPU, then disk, within ``ATLAS_MAX_MEMORY``; or a map given), each weight is read from the safetensors files by
name, one tensor at a time, and put where the map says (``set_module_tensor_to_device``; blocks mapped to
``"disk"`` are written to an offload folder by ``offload_state_dict``, numpy memory maps, no pickle), and
``dispatch_model`` attaches the hooks that move each block's input to its device and load offloaded weights for the
duration of its forward pass. A block is never split (``no_split_module_classes``): its attention and feed-forward
layer run on one device.

The forward pass, generation (``GPT.generate``, ``models/decoding/ondevice.py``), patching and the logit lens go
through the modules' own ``forward``, so the hooks serve them unchanged. The score split (``models/inspect/``)
reads weights directly; it reads an offloaded one through ``weight(module, name)``, which asks the module's hook for it.

The app's model store (``serving.store``) loads a decoder through ``load_gpt`` when ``ATLAS_MAX_MEMORY`` is set, or
when its weights are more than the CUDA device in ``ATLAS_DEVICE`` holds; ``describe`` says how it was split.

``ATLAS_MAX_MEMORY``: per device the most it may hold, as accelerate writes it, e.g. ``0=70GiB,1=70GiB,cpu=200GiB``
(keys: GPU indices, ``cpu``; values: ``GiB``/``MB``/... strings); unset: accelerate's own estimate of what is free.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

NO_SPLIT = ["Block"]  # models.families.gpt.Block: attention and feed-forward of one layer stay together


def max_memory(spec: str | None = None) -> dict[int | str, str] | None:
    """``ATLAS_MAX_MEMORY`` (or ``spec``) as accelerate's ``max_memory`` dict; None when unset. Raises ValueError
    naming the bad entry."""
    spec = os.environ.get("ATLAS_MAX_MEMORY", "") if spec is None else spec
    if not spec.strip():
        return None
    out: dict[int | str, str] = {}
    for entry in spec.split(","):
        key, sep, value = entry.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value or not (key.isdigit() or key in ("cpu", "disk")):
            raise ValueError(f"ATLAS_MAX_MEMORY entries are DEVICE=SIZE (0=70GiB,cpu=100GiB), got {entry!r}")
        if not _size_ok(value):
            raise ValueError(f"ATLAS_MAX_MEMORY sizes are a number and a unit (70GiB, 500MB), got {entry!r}")
        out[int(key) if key.isdigit() else key] = value
    return out


def _size_ok(value: str) -> bool:
    """Whether accelerate reads ``value`` as a size (checked here, so a bad one is said when the variable is read)."""
    from accelerate.utils import convert_file_size_to_int

    try:
        convert_file_size_to_int(value)
    except ValueError:
        return False
    return True


def _where(device_map: Mapping[str, Any], name: str) -> Any:
    """The device map's entry for parameter ``name``: its longest matching module prefix ("" = everything)."""
    best, found = -1, None
    for prefix, dev in device_map.items():
        if (prefix == "" or name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
            best, found = len(prefix), dev
    if found is None:
        raise ValueError(f"the device map places no module holding {name!r}")
    return found


def dispatch_gpt(config: Any, tensor: Callable[[str], Tensor], device_map: Mapping[str, Any] | str = "auto",
                 offload_folder: str | Path | None = None, dtype: torch.dtype = torch.float32,
                 memory: dict[int | str, str] | None = None) -> nn.Module:
    """A ``models.families.gpt.GPT`` of ``config`` whose weights ``tensor(name)`` gives (names as ``GPT.state_dict()``),
    placed by ``device_map`` ("auto": ``infer_auto_device_map`` within ``memory`` or ``ATLAS_MAX_MEMORY``) and
    dispatched by accelerate. ``offload_folder``: where blocks mapped to "disk" are written (needed then)."""
    from accelerate import dispatch_model, infer_auto_device_map, init_empty_weights
    from accelerate.utils import offload_state_dict, set_module_tensor_to_device

    from models.families.gpt import GPT

    with init_empty_weights():  # parameters on meta; buffers (RoPE angles) real, on the CPU
        model = GPT(config)
    model.eval()
    if config.tie_embeddings:  # init_empty_weights registered the output projection's own meta copy: tie again
        model.lm_head.weight = model.embed.weight
    if isinstance(device_map, str):
        if device_map != "auto":
            raise ValueError(f"device_map must be 'auto' or a dict, got {device_map!r}")
        device_map = infer_auto_device_map(model, max_memory=memory if memory is not None else max_memory(),
                                           no_split_module_classes=NO_SPLIT, dtype=dtype)
        device_map = _embedding_off_disk(dict(device_map), model, config.tie_embeddings)
    device_map = dict(device_map)
    offloaded: dict[str, Tensor] = {}
    for name, _ in model.named_parameters():  # a tied weight once (named_parameters skips the duplicate)
        value = tensor(name).to(dtype)
        where = _where(device_map, name)
        if where == "disk":
            offloaded[name] = value
        else:
            set_module_tensor_to_device(model, name, where, value=value)
    if offloaded:
        if offload_folder is None:
            raise ValueError("the device map sends blocks to disk: give an offload folder")
        offload_state_dict(str(offload_folder), offloaded)
    if config.tie_embeddings:  # placing the embedding made it a new Parameter: the output projection shares it again
        model.lm_head.weight = model.embed.weight
    main = next((d for d in device_map.values() if d not in ("cpu", "disk")), "cpu")
    return dispatch_model(model, device_map=device_map, main_device=main,
                          offload_dir=str(offload_folder) if offloaded else None)


def _embedding_off_disk(device_map: dict[str, Any], model: nn.Module, tied: bool) -> dict[str, Any]:
    """An automatic map whose embedding is not on disk: ``GPT`` makes its input ids on the embedding's device, which
    must be a real one. Where accelerate sent it to disk (a memory allowance smaller than the embedding and the
    largest block), the map is spelled out per block and the embedding (and the output projection tied to it) goes
    to the first device the map uses, or the CPU: past the allowance by that much."""
    if _where(device_map, "embed.weight") != "disk":
        return device_map
    names = [n for n, _ in model.named_children() if n != "blocks"]
    names += [f"blocks.{i}" for i in range(len(model.blocks))]
    names += [n for n, _ in model.named_parameters(recurse=False)] + [n for n, _ in model.named_buffers(recurse=False)]
    spelled = {n: _where(device_map, n) for n in names}
    home = next((d for d in device_map.values() if d != "disk"), "cpu")
    spelled["embed"] = home
    if tied:
        spelled["lm_head"] = home
    return spelled


def load_gpt(folder: str | Path, device_map: Mapping[str, Any] | str = "auto", offload_folder: str | Path | None = None,
             dtype: torch.dtype = torch.float32, memory: dict[int | str, str] | None = None,
             verify: bool = True) -> nn.Module:
    """A decoder checkpoint folder (the project's own GPT format, or a Hugging Face LLaMA folder with safetensors
    weights: ``readable(folder)``), loaded without ever holding the whole model in one place: each tensor is read
    from its file by name when it is placed (``safetensors.safe_open``). With the attributes ``models.load`` gives
    (``tokenizer``, ``labels``, ``text``); a project checkpoint's manifest is checked first, as there (``verify``)."""
    import json

    from safetensors import safe_open

    from models.families.gpt import GPTConfig
    from models.io.checkpoint import config_from_dict
    from models.io.hf import is_hf_folder
    from models.paths import resolve

    folder = resolve(folder)
    if verify and not is_hf_folder(folder):
        from models.io.checkpoint import verify as verify_manifest

        verify_manifest(folder)  # every listed file present, full size, its sha256 equal (CheckpointError names it)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder} has no safetensors weights")
    where: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as s:
            where.update({k: f for k in s.keys()})  # noqa: SIM118 (safe_open has keys(), not iteration)
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    rename: Callable[[str], str]
    if is_hf_folder(folder):
        config, rename = _hf_names(cfg, folder)
    else:
        config = config_from_dict(GPTConfig, cfg["config"], folder / "config.json")
        rename = str

    def tensor(name: str) -> Tensor:
        source = rename(name)
        with safe_open(str(where[source]), framework="pt") as s:
            t = s.get_tensor(source)
        return t.t().contiguous() if _conv1d(cfg, source) else t

    model = dispatch_gpt(config, tensor, device_map, offload_folder, dtype, memory)
    if is_hf_folder(folder):  # the tokenizer, token ids, labels and text settings models.load gives
        from models.io.hf import attach_decoder_tokenizer

        attach_decoder_tokenizer(model, folder, cfg)
    else:
        from models.inputs.tokenizer import load_tokenizer

        model.labels, model.text = list(cfg.get("labels", [])), dict(cfg.get("text", {}))
        if (folder / "tokenizer.model").is_file() or (folder / "tokenizer.json").is_file():
            model.tokenizer = load_tokenizer(folder, model.text)
    return model


def readable(folder: str | Path) -> bool:
    """Whether ``load_gpt`` reads ``folder`` (judged from its config.json, nothing loaded): a project checkpoint of
    a ``GPT``, or a Hugging Face LLaMA folder, with safetensors weights. Anything else (classifiers, translators,
    vision models, Mamba, the other Hugging Face decoders) is for ``models.load``."""
    import json

    folder = Path(folder)
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(cfg, dict) or not any(folder.glob("model*.safetensors")):
        return False
    if "format" in cfg:
        from models.io.checkpoint import FORMAT

        return cfg.get("model") == "GPT" and cfg.get("format") == FORMAT and isinstance(cfg.get("config"), dict)
    return cfg.get("model_type") == "llama"


def dispatched(model: nn.Module) -> bool:
    """Whether accelerate dispatched ``model`` (``dispatch_model`` leaves its device map on it)."""
    return isinstance(getattr(model, "hf_device_map", None), dict)


def describe(model: nn.Module) -> str:
    """How a dispatched GPT is split, in one line: its blocks per device, then where the embedding and the output
    projection are, e.g. ``24 blocks: 20 on cuda:0, 3 on cpu, 1 on disk; embedding on cuda:0, output on cpu``."""
    device_map = model.hf_device_map

    def name(dev: Any) -> str:
        return f"cuda:{dev}" if isinstance(dev, int) else str(dev)

    counts: dict[str, int] = {}
    for i in range(len(model.blocks)):
        where = name(_where(device_map, f"blocks.{i}"))
        counts[where] = counts.get(where, 0) + 1
    per = ", ".join(f"{n} on {d}" for d, n in counts.items())
    return (f"{len(model.blocks)} blocks: {per}; embedding on {name(_where(device_map, 'embed.weight'))}, "
            f"output on {name(_where(device_map, 'lm_head.weight'))}")


def _conv1d(cfg: dict, source: str) -> bool:
    """GPT-2's Conv1D weights are stored (in, out): transposed into nn.Linear's (out, in)."""
    return cfg.get("model_type") == "gpt2" and source.endswith(".weight") and any(
        p in source for p in ("c_attn", "c_proj", "c_fc"))


def _hf_names(cfg: dict, folder: Path) -> tuple[Any, Callable[[str], str]]:
    """The GPT config of a Hugging Face LLaMA folder and our parameter name -> the folder's (GPT-2: the fused
    query/key/value weight is split, so it is read whole and sliced; not offered here)."""
    from models.io.hf import llama_from_state

    if cfg.get("model_type") != "llama":
        raise ValueError("big-model loading reads LLaMA-family Hugging Face folders and the project's own GPTs")
    config = llama_from_state(cfg, {}, folder / "config.json", config_only=True)
    table = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "lm_head.weight": "lm_head.weight"}
    parts = {"norm1": "input_layernorm", "norm2": "post_attention_layernorm", "attn.q_proj": "self_attn.q_proj",
             "attn.k_proj": "self_attn.k_proj", "attn.v_proj": "self_attn.v_proj", "attn.o_proj": "self_attn.o_proj",
             "ff.gate": "mlp.gate_proj", "ff.up": "mlp.up_proj", "ff.down": "mlp.down_proj"}

    def rename(name: str) -> str:
        if name in table:
            return table[name] if not (name == "lm_head.weight" and config.tie_embeddings) else table["embed.weight"]
        _, i, rest = name.split(".", 2)  # blocks.{i}.{part}.weight
        part, _, leaf = rest.rpartition(".")
        return f"model.layers.{i}.{parts[part]}.{leaf}"

    return config, rename


def weight(module: nn.Module, name: str = "weight") -> Tensor | None:
    """``module.<name>``, also where accelerate offloaded it (a meta tensor then: read from the hook's weights
    map, which loads it from the CPU copy or the disk folder)."""
    p = getattr(module, name, None)
    if p is None or p.device.type != "meta":
        return p
    hook = getattr(module, "_hf_hook", None)
    for h in _hooks(hook):
        weights = getattr(h, "weights_map", None)
        if weights is not None and name in weights:
            return weights[name]
    raise RuntimeError(f"{type(module).__name__}.{name} is on the meta device and no accelerate hook holds it")


def _hooks(hook: Any) -> Iterable[Any]:
    if hook is None:
        return []
    return list(getattr(hook, "hooks", [hook]))  # a SequentialHook holds several


def execution_device(module: nn.Module) -> torch.device:
    """Where ``module`` computes: accelerate's execution device where it dispatched the module (its weights may
    be on meta, offloaded), else its first parameter's device (the CPU for a module without any)."""
    for m in module.modules():  # the module itself first, then its parts in order (a GPT's embedding first)
        for h in _hooks(getattr(m, "_hf_hook", None)):
            dev = getattr(h, "execution_device", None)
            if dev is not None:
                return torch.device(f"cuda:{dev}" if isinstance(dev, int) else dev)
    for p in module.parameters():
        if p.device.type != "meta":
            return p.device
    return torch.device("cpu")
