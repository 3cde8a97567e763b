"""Hugging Face ``rwkv`` folders (transformers' ``RwkvForCausalLM``: RWKV-4, e.g. RWKV/rwkv-4-169m-pile) read into
``models.families.rwkv.Rwkv``.

The weight map is the prefix alone (``rwkv.blocks.N.attention.time_decay`` -> ``blocks.N.attention.time_decay``), but
for block 0's ``pre_ln`` (the model's ``pre_norm``), ``embeddings``, ``ln_out`` (``norm``) and ``head`` (``lm_head``).
The weights are read as stored: the inference rescaling of ``rescale_every`` is applied by the model as it runs, not to
the weights (transformers divides its weights in place when it enters eval mode; a folder holds them undivided).
A tensor the model does not have (RWKV-5/6's ``time_faaaa``, ``ln_x``, a LoRA of the token shift) or one it lacks is an
error that names it: those are other architectures, which this reader does not guess at.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from models.io.checkpoint import CheckpointError
from models.io.hf import _token_id


def _size(hf: dict[str, Any], key: str, where: Path) -> int:
    """An optional size of config.json: absent or null gives 0 (the model's default), else a positive integer."""
    value = hf.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CheckpointError(where, f"{key} must be a positive integer, got {value!r}")
    return value


def rwkv_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json") -> Any:
    """``Rwkv`` from a Hugging Face ``rwkv`` config dict and ``RwkvForCausalLM`` state dict (``rwkv.`` names)."""
    from models.families.rwkv import Rwkv, RwkvConfig

    where = Path(where)
    every = hf.get("rescale_every", 6)
    if isinstance(every, bool) or not isinstance(every, int):
        raise CheckpointError(where, f"rescale_every must be an integer, got {every!r}")
    config = RwkvConfig(vocab_size=int(hf["vocab_size"]), d_model=int(hf["hidden_size"]),
                        n_layers=int(hf["num_hidden_layers"]), d_attention=_size(hf, "attention_hidden_size", where),
                        d_ff=_size(hf, "intermediate_size", where),
                        norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), rescale_every=max(0, every),
                        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
                        max_len=_size(hf, "context_length", where) or 1024,
                        bos_id=_token_id(hf, "bos_token_id", 0), eos_id=_token_id(hf, "eos_token_id", 0))
    s = {k.removeprefix("rwkv."): v for k, v in state.items()}
    renamed = {"embeddings.weight": "embed.weight", "blocks.0.pre_ln.weight": "pre_norm.weight",
               "blocks.0.pre_ln.bias": "pre_norm.bias", "ln_out.weight": "norm.weight", "ln_out.bias": "norm.bias",
               "head.weight": "lm_head.weight"}
    ours = {renamed.get(k, k): v for k, v in s.items()}
    if config.tie_embeddings:
        ours.setdefault("lm_head.weight", ours.get("embed.weight"))
    model = Rwkv(config)
    missing, unexpected = model.load_state_dict({k: v.float().contiguous() for k, v in ours.items() if v is not None},
                                                strict=False)
    if missing or unexpected:
        raise CheckpointError(where, f"weights do not fit RWKV-4: missing {missing}, unexpected {unexpected}")
    return model
