"""How a generation request runs: the one place that chooses between the decoding paths (docs/ARCHITECTURE.md §9).

- "ondevice": the attention kept on the model's device (models/decoding/ondevice.py; ATLAS_ONDEVICE, CUDA models);
- "batched": decoded in lockstep with the requests for the same model that arrive meanwhile
  (models/decoding/lockstep.py through ``serving.store.batched``), for a family that batches that way;
- "fastgen": alone, through the CPU server's decoder (models/decoding/fastgen.py);
- "plain": alone, through the model's own ``generate``.

Each path is chosen only where its runner knows every field of the model's block description (``refusal`` is None,
models/blocks/decoder.py), so a model none of them knows is served by the plain path. Tabs call ``generate`` and draw.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from models import limits, registry
from serving import batcher, store

PATHS = ("ondevice", "batched", "fastgen", "plain")


def choose(model: Any, prompt_tokens: int, new_tokens: int) -> str:
    """The path a request for ``model`` with that many prompt and new tokens takes (a PATHS entry). Raises
    ValueError for a bad ATLAS_ONDEVICE."""
    from models.decoding import fastgen, lockstep

    if fastgen.keeps_on_device(model):
        return "ondevice"
    family = registry.family_of(model)
    if (family.batch == "lockstep" and prompt_tokens + new_tokens <= limits.LONG_TOKENS
            and lockstep.refusal(model) is None):  # a long input is served alone: its attention is large
        return "batched"
    return "fastgen" if fastgen.supports(model) else "plain"


def generate(name: str, model: Any, request: Any, finish: Callable[[Any], Any], pool_cells: int | None = None
             ) -> tuple[Any, str]:
    """(``finish`` of the request's result, the path it took). ``request``: a ``models.decoding.lockstep``
    GenerateRequest; ``pool_cells``: the tiles an on-device run makes while generating (the model view's)."""
    from models.decoding import fastgen, lockstep, ondevice

    kw = dict(max_new_tokens=request.max_new_tokens, strategy=request.strategy, temperature=request.temperature,
              top_k=request.top_k, top_p=request.top_p, seed=request.seed)
    text = request.text
    prompt_tokens = len(model.encode_prompt(text)[0]) if isinstance(text, str) else len(text)
    path = choose(model, prompt_tokens, request.max_new_tokens)
    if path == "batched":  # drawn in the batch's thread
        return store.batched(name, "generate", lockstep.generate_many, model, request, finish=finish), path
    with batcher.heavy():
        if path == "ondevice":
            return finish(ondevice.generate(model, request.text, pool_cells=pool_cells, **kw).kept()), path
        if path == "fastgen":
            return finish(fastgen.generate(model, request.text, **kw)), path
        return finish(model.generate(request.text, **kw)), path
