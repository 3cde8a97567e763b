"""Where a served model runs and in which precision: ``ATLAS_DEVICE`` and ``ATLAS_DTYPE`` (issue 52).

``ATLAS_DTYPE``: ``float32`` (the default on the CPU), ``bfloat16`` (the default on a GPU: half the memory and
bandwidth, float32's range) or ``float16``. Only the weights take it. What the analyses compute stays float32
or wider whatever the weights' dtype (docs/ARCHITECTURE.md §4):

- attention scores, softmax and weights: ``models.blocks.attention.scaled_dot_product`` upcasts q and k to float32 and
  returns float32 weights (A·V in the values' dtype, as transformers' eager attention); ``models/decoding/ondevice.py``
  likewise; the fused kernel (no weights asked) accumulates in float32 itself;
- the score split (``models/inspect/decompose.py``) walks the stream in float64 from the weights as stored;
- RMSNorm normalises in float32 (``models.families.gpt.RMSNorm``); logits are read as float32 for probabilities, the
  surprisal, patching's logit differences and attribution's gradients' targets;
- buffers derived from the config (RoPE angles, masks, calibration) stay float32: ``place`` casts parameters only.
"""

from __future__ import annotations

import os

import torch
from torch import nn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def run_dtype(device: str | torch.device) -> torch.dtype:
    """``ATLAS_DTYPE`` if set, else float32 on the CPU and bfloat16 on any other device. Raises ValueError for a
    name not in ``DTYPES`` (a server misconfiguration, said at start-up)."""
    wanted = os.environ.get("ATLAS_DTYPE", "").strip().lower()
    if not wanted:
        return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16
    if wanted not in DTYPES:
        raise ValueError(f"ATLAS_DTYPE must be one of {', '.join(DTYPES)}, got {wanted!r}")
    return DTYPES[wanted]


def place(model: nn.Module, device: str | torch.device, dtype: torch.dtype = torch.float32) -> nn.Module:
    """``model`` on ``device`` with its floating-point parameters in ``dtype``; buffers keep their dtype (RoPE
    angles in bfloat16 would turn position 4,000 by up to 16 radians' error)."""
    model.to(device)
    for p in model.parameters():
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
    return model
