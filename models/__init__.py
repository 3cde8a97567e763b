"""The Attention Atlas model package: pure PyTorch, no gradio, no plotly.

``models.load(name_or_path)`` returns the plain model behind a checkpoint folder (docs/ARCHITECTURE.md
§4): in eval mode, float32, with ``.labels``, ``.text`` settings and, for text models,
``.tokenizer`` attached. Serving speed-ups (``models.decoding.packed``) are the server's choice and are applied by
whoever serves the model (the app's model store, the serving benchmarks), never here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from models import registry
from models.paths import CHECKPOINTS, resolve

if TYPE_CHECKING:  # torch is imported on first use, so `models.limits` stays cheap for the UI
    from torch import nn

def load(name_or_path: str | Path, device: str = "cpu", verify: bool = True) -> nn.Module:
    """Load the model of a checkpoint folder name (under checkpoints/) or path; a Hugging Face folder
    (config.json with a ``model_type`` and no ``format``) is read by ``models.io.hf``, without a manifest; a GGUF
    file (``*.gguf``) or an Ollama model (``ollama:NAME[:TAG]``) by ``models.io.gguf``."""
    from models.io.checkpoint import CheckpointError, config_from_dict, load_checkpoint
    from models.io.gguf import is_gguf_spec, load_gguf
    from models.io.hf import is_hf_folder, load_hf

    if is_gguf_spec(name_or_path):
        return load_gguf(name_or_path).to(device)
    folder = resolve(name_or_path)
    if is_hf_folder(folder):
        return load_hf(folder).to(device)
    meta, state = load_checkpoint(folder, verify_hashes=verify)
    kind = meta["model"]
    family = registry.by_model_name(kind) if isinstance(kind, str) else None
    if family is None:
        known = sorted(n for f in registry.FAMILIES.values() for n in f.model_names)
        raise CheckpointError(folder / "config.json", f"unknown model {kind!r}; known: {known}")
    model_class, config_class = family.classes()
    config = config_from_dict(config_class, meta["config"], folder / "config.json")
    model = model_class(config)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise CheckpointError(folder / "model.safetensors", f"weights do not fit {kind}: {e}") from e
    model.labels = list(meta["labels"])
    model.text = dict(meta["text"])
    if family.text:
        from models.inputs.tokenizer import load_tokenizer

        model.tokenizer = load_tokenizer(folder, meta["text"])
    if (folder / "calibration.safetensors").is_file():  # image models: temperature and the unusual-input check
        from models.calibration import load_calibration

        model.calibration = load_calibration(folder / "calibration.safetensors")
    return model.float().eval().to(device)


def __getattr__(name: str) -> Any:
    if name == "CheckpointError":
        from models.io.checkpoint import CheckpointError

        return CheckpointError
    raise AttributeError(f"module 'models' has no attribute {name!r}")


__all__ = ["CheckpointError", "CHECKPOINTS", "load", "resolve"]
