"""The model the server's configuration sends through nnsight (issue 73): ATLAS_NNSIGHT names a Hugging Face folder
or a Hub id (configuration, never the UI), ATLAS_NNSIGHT_REMOTE=1 runs it on NDIF (NDIF_API_KEY; NDIF_HOST for a
self-hosted server), else it runs here with ``remote=False``. Opened once, on first use (nnsight and transformers
are imported only then); each request is one trace of models/io/nnsight_backend.py, only reductions coming back."""

from __future__ import annotations

import threading
from typing import Any

MAX_TOKENS = 8192  # tokens one traced text may have (its rows and tiles travel; the model reads them all)
CELLS = 128  # tiles a side of the traced layer (every head): 128 heads × 128² × 2 × 4 B = 16 MB for a 405 B shape

_lock = threading.Lock()
_opened: dict[tuple[str, bool], Any] = {}


class NotConfigured(RuntimeError):
    """No model is configured for nnsight."""


def configured() -> tuple[str, bool] | None:
    from models.io.nnsight_backend import configured as read

    return read()


def shown_name(source: str) -> str:
    """What the page calls the model: a Hub id as it is, a folder by its name (the server's paths stay private)."""
    from pathlib import Path

    path = Path(source)
    return path.name if path.is_dir() else source


def model() -> tuple[str, bool, Any]:
    """(source, remote, nnsight LanguageModel) of the configured model, opened once."""
    entry = configured()
    if entry is None:
        raise NotConfigured("No model is configured for nnsight: the server sets ATLAS_NNSIGHT to a Hugging Face "
                            "folder or Hub id (and ATLAS_NNSIGHT_REMOTE=1 with NDIF_API_KEY to run it on NDIF).")
    from models.io import nnsight_backend as nb

    with _lock:
        if entry not in _opened:
            _opened[entry] = nb.open_model(*entry)
    return (*entry, _opened[entry])


def trace(text: str, layer: int, head: int) -> tuple[Any, list[str], Any]:
    """One trace of ``text``: (TracedViews with ``layer``'s tiles of every head, the exact last row of ``head``,
    the statistics of every head and the logit lens of the last 64 positions; the tokens; the layout)."""
    from models.io import nnsight_backend as nb

    _, remote, lm = model()
    lay = nb.layout(lm.config)
    ids = [int(i) for i in lm.tokenizer(text)["input_ids"]][:MAX_TOKENS]
    if not ids:
        raise nb.Refused("the text has no tokens")
    if not (0 <= layer < lay.n_layers and 0 <= head < lay.n_heads):
        raise nb.Refused(f"layer {layer}, head {head} is not in this {lay.n_layers}-layer, {lay.n_heads}-head model")
    views = nb.trace_views(lm, ids, cells=CELLS, tile_layers=[layer], rows=[(layer, head, len(ids) - 1)],
                           lens_last=64, remote=remote)
    return views, [str(t) for t in lm.tokenizer.convert_ids_to_tokens(ids)], lay
