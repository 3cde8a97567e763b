"""The app's views computed by nnsight (issue 73): the same trace code (models/io/nnsight_trace.py) runs here with
``remote=False`` or on NDIF (the National Deep Inference Fabric) with ``remote=True``, and only reductions come back:
pooled tiles and per-head statistics of every layer's attention, the asked rows and full maps, the head roles, the
logit lens, the token losses. A 1,024-token forward of a 405 B model has ~34 GB of attention weights (float16); one
layer's tiles of every head, its statistics, a row and the lens come back in ~5 MB, every layer's tiles in ~530 MB
(bench/remote.py computes both).

``open_model(source)`` wraps a Hugging Face folder (``remote=False``: loaded here by transformers through nnsight,
safetensors only) or a Hub id (loaded here, or named for NDIF, which has it loaded) in nnsight's ``LanguageModel``;
``trace_views(lm, ids, ...)`` runs one forward and returns ``TracedViews`` with where it ran and how many bytes
came back. Families: what ``layout`` knows (GPT-2; LLaMA, Qwen2, Mistral: RoPE, grouped-query heads, sliding
windows); any other model, or a setting that changes the attention (GPT-2's per-layer scaling, soft caps, q/k norms),
is refused in words rather than computed wrongly.

nnsight and transformers are imported here only when a model is opened: they are optional (requirements-dev.txt),
and ``python app.py`` never imports them unless ATLAS_NNSIGHT names a model.

Remote results: nnsight's own ``RemoteBackend`` loads the server's answer with torch's full unpickler (weights_only
off); ``SafeRemoteBackend`` loads it, and any binary status frame, with an unpickler that rebuilds tensors, dicts,
lists, numbers and strings only (what ``views`` saves; ``restricted_load``) and counts the bytes that came back.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.io import nnsight_trace as nt

FAMILIES = {"gpt2": "gpt2", "llama": "llama", "qwen2": "llama", "mistral": "llama"}  # model_type -> layout kind
POOL_CELLS = 64  # tiles a side (models.decoding.ondevice.POOL_CELLS: the model view's thumbnails)
LOCAL = 512  # the "local" statistic's window when the model has none (models.decoding.ondevice.LOCAL)
FULL_TOKENS = 1024  # a full (H, T, T) map travels only up to this many tokens
STATS = ("entropy", "sink", "distance", "local")  # models.decoding.ondevice.STATS, in nnsight_trace's order
ROLES = ("previous", "induction", "duplicate", "sink")  # models.analysis.HEAD_ROLES


class Refused(ValueError):
    """The model or request is one this backend would compute wrongly, or cannot run: said in words."""


@dataclass(frozen=True)
class Layout:
    """What the trace needs of a model's config.json (``layout``)."""

    kind: str  # "gpt2" or "llama"
    model_type: str
    n_layers: int
    n_heads: int
    kv_heads: int
    d_model: int
    d_head: int
    windows: tuple[int, ...]  # per layer: the sliding window (0: every earlier key)
    vocab: int

    @property
    def scale(self) -> float:
        return nt.scale_of(self.d_head)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "heads": self.n_heads, "kv_heads": self.kv_heads, "d_model": self.d_model,
                "scale": self.scale, "windows": list(self.windows)}


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    return cfg.get(name, default) if isinstance(cfg, dict) else getattr(cfg, name, default)


def layout(cfg: Any) -> Layout:
    """The ``Layout`` of a config (a dict of config.json or a transformers config); ``Refused`` for what the trace
    does not compute."""
    mt = str(_get(cfg, "model_type", ""))
    if mt not in FAMILIES:
        raise Refused(f"the nnsight backend reads {', '.join(sorted(FAMILIES))} models, not {mt or 'this model'!r}")
    if FAMILIES[mt] == "gpt2":
        if _get(cfg, "scale_attn_by_inverse_layer_idx", False) or not _get(cfg, "scale_attn_weights", True):
            raise Refused("this GPT-2 scales its attention other than by 1/√d (scale_attn_by_inverse_layer_idx or "
                          "scale_attn_weights off): the nnsight backend refuses it")
        n, h, d = int(_get(cfg, "n_layer")), int(_get(cfg, "n_head")), int(_get(cfg, "n_embd"))
        return Layout("gpt2", mt, n, h, h, d, d // h, (0,) * n, int(_get(cfg, "vocab_size")))
    for name in ("attn_logit_softcapping", "query_pre_attn_scalar"):
        if _get(cfg, name):
            raise Refused(f"config.{name} changes the attention scores: the nnsight backend refuses it")
    if float(_get(cfg, "partial_rotary_factor", 1.0) or 1.0) != 1.0:
        raise Refused("partial rotary embeddings: the nnsight backend rotates every dimension, so it refuses them")
    n, h, d = int(_get(cfg, "num_hidden_layers")), int(_get(cfg, "num_attention_heads")), int(_get(cfg, "hidden_size"))
    kv = int(_get(cfg, "num_key_value_heads", None) or h)
    d_head = int(_get(cfg, "head_dim", None) or d // h)
    if h % kv:
        raise Refused(f"{h} query heads do not split into groups over {kv} key-value heads")
    window = int(_get(cfg, "sliding_window", None) or 0)
    kinds = _get(cfg, "layer_types", None)
    if mt == "qwen2" and window and not kinds:
        raise Refused("a Qwen2 sliding window without config.layer_types: which layers slide is not said")
    if kinds:
        windows = tuple(window if k == "sliding_attention" else 0 for k in kinds)
    else:
        windows = (window,) * n
    return Layout("llama", mt, n, h, kv, d, d_head, windows, int(_get(cfg, "vocab_size")))


def check_folder(folder: Path) -> dict[str, Any]:
    """A Hugging Face folder's config.json, checked: safetensors weights only (a pickle is never read)."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise Refused(f"{folder.name}: no config.json (a Hugging Face folder is config.json, model.safetensors, "
                      "tokenizer.json)")
    if not any(folder.glob("*.safetensors")):
        raise Refused(f"{folder.name}: no .safetensors weights (pytorch_model.bin is never read: it is a pickle)")
    return json.loads((folder / "config.json").read_text())


def open_model(source: str | Path, remote: bool = False, dtype: torch.dtype | None = None) -> Any:
    """nnsight's LanguageModel over ``source``: a local folder (``remote`` must be False: NDIF runs only the models
    it hosts) or a Hub id. Local: loaded now by transformers with ``use_safetensors=True``; remote: a meta model (the
    config alone, for the module names) that traces are sent to NDIF against."""
    import warnings

    from nnsight import LanguageModel

    path = Path(str(source))
    local = path.is_dir()
    if local:
        if remote:
            raise Refused("a local folder runs here only (remote=False): NDIF runs the Hub models it hosts")
        layout(check_folder(path))
    kwargs: dict[str, Any] = {} if remote else {"dispatch": True, "use_safetensors": True}
    if dtype is not None:
        kwargs["dtype"] = dtype
    with warnings.catch_warnings():  # LanguageModel's deprecation notice: TransformersModel(task=...) is the same
        warnings.simplefilter("ignore")
        lm = LanguageModel(str(path) if local else str(source), **kwargs)
    layout(lm.config)
    return lm


# What an NDIF answer may name when unpickled (``restricted_load``): tensors rebuilt from their storages, dtypes,
# shapes, ordered dicts and nnsight's job status; anything else (a function, a class with a __reduce__) is refused.
_ALLOWED = {("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor"), ("torch", "Size"),
            ("collections", "OrderedDict"), ("nnsight.schema.response", "Status"),
            ("torch._tensor", "_rebuild_from_type_v2")}


class UnsafeAnswer(ValueError):
    """An answer that names something ``restricted_load`` does not rebuild."""


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch":
            value = getattr(torch, name, None)
            if isinstance(value, torch.dtype) or (isinstance(value, type) and issubclass(
                    value, (torch.storage.TypedStorage, torch.UntypedStorage))):
                return value
        raise UnsafeAnswer(f"the answer names {module}.{name}, which is not rebuilt (only tensors, dicts, lists, "
                           "numbers and strings)")


def _restricted_pickle_load(file: Any, **kwargs: Any) -> Any:
    """torch.load's ``pickle_module.load`` (the legacy, non-zip format reads its header through it): restricted too."""
    return _RestrictedUnpickler(file, **kwargs).load()


_restricted = types.SimpleNamespace(Unpickler=_RestrictedUnpickler, load=_restricted_pickle_load,
                                    __name__="restricted_pickle")


def restricted_load(content: bytes) -> Any:
    """``torch.load`` of an answer (torch.save's zip container, any pickle protocol) whose unpickler rebuilds only
    ``_ALLOWED`` names: nnsight's own loader is a full unpickle, and torch's ``weights_only`` loader does not read
    the protocol-4 frames nnsight's inline responses use."""
    return torch.load(io.BytesIO(content), map_location="cpu", weights_only=False, pickle_module=_restricted)


def safe_remote_backend(lm: Any, host: str | None = None, model_key: str | None = None) -> Any:
    """nnsight's RemoteBackend for ``lm`` (``model_key``: its NDIF key, default ``lm.to_model_key()``, which asks the
    Hub for the model's id), with every binary answer (the result blob, a pickled status frame) loaded by
    ``restricted_load`` and the result's size kept (``received``)."""
    from nnsight.intervention.backends.remote import RemoteBackend
    from nnsight.schema.response import ResponseModel

    class SafeRemoteBackend(RemoteBackend):
        received = 0

        @staticmethod
        def parse(message: str | bytes) -> Any:
            if isinstance(message, (bytes, bytearray)):
                return ResponseModel(**restricted_load(bytes(message)))
            return ResponseModel.model_validate_json(message)

        def finalize(self, content: bytes) -> Any:
            self.received = len(content)
            if self.compress:
                import zstandard as zstd

                content = zstd.ZstdDecompressor().decompress(content)
            return restricted_load(content)

    return SafeRemoteBackend(model_key or lm.to_model_key(), host=host, env=lm._remoteable_get_env())


@dataclass
class TracedViews:
    """What one nnsight trace gave back (numpy on the CPU) and where it ran."""

    ids: list[int]
    where: str  # "here (remote=False)", "NDIF (https://…)"
    seconds: float
    bytes_back: int  # bytes of the saved values (tensor bytes; remote: the bytes received)
    n_layers: int
    n_heads: int
    tiles: dict[str, dict[int, np.ndarray]]  # "max"/"mean" -> {layer: (H, R, C) float32} of the layers asked
    edges: np.ndarray  # block edges of the tiles (rows and columns alike)
    stats: dict[str, np.ndarray]  # STATS -> (L, H) float32: means over every query row
    rows: dict[tuple[int, int, int], np.ndarray] = field(default_factory=dict)  # (layer, head, query) -> (T,)
    maps: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> (H, T, T) float32
    roles: dict[str, np.ndarray] = field(default_factory=dict)  # ROLES -> (L, H) float32 (roles_n given)
    losses: np.ndarray | None = None  # (T − 1,) cross-entropy of each token given the ones before
    last_logits: np.ndarray | None = None  # (V,) after the last token
    lens: dict[str, Any] = field(default_factory=dict)  # top (L, T'), top_p, next_p (L, T') float32, choice

    @property
    def full_bytes(self) -> int:
        """Bytes the full (L, H, T, T) attention would take in float16: what did not travel."""
        return nt.full_bytes(self.n_layers, self.n_heads, len(self.ids))


def _bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_bytes(v) for v in obj)
    return 8


def plan(lay: Layout, t: int, cells: int = POOL_CELLS, rows: list[tuple[int, int, int]] | tuple = (),
         maps: list[int] | tuple = (), roles_n: int = 0, lens_last: int | None = None,
         chunk_bytes: int = nt.CHUNK_BYTES, tile_layers: list[int] | tuple | None = None) -> dict[str, Any]:
    """The trace's plan (plain lists and numbers: it travels with the request), checked; ``lens_last`` None: the
    lens over every position, 0: none; ``tile_layers`` None: tiles of every layer."""
    if t < 1:
        raise Refused("nothing to read: no tokens")
    if cells < 1:
        raise Refused(f"tiles need at least one cell a side, got {cells}")
    for layer, head, query in rows:
        if not (0 <= layer < lay.n_layers and 0 <= head < lay.n_heads and 0 <= query < t):
            raise Refused(f"row (layer {layer}, head {head}, query {query}) is not in a {lay.n_layers}-layer, "
                          f"{lay.n_heads}-head model over {t} tokens")
    for layer in (*maps, *(tile_layers or ())):
        if not 0 <= layer < lay.n_layers:
            raise Refused(f"layer {layer} is not one of the model's {lay.n_layers} layers")
    if maps and t > FULL_TOKENS:
        raise Refused(f"a full map over {t:,} tokens does not travel (at most {FULL_TOKENS:,}): ask for tiles or rows")
    if roles_n and (roles_n < 2 or t < 2 * roles_n + 1):
        raise Refused(f"head roles need BOS + 2·n tokens with n ≥ 2 (n={roles_n}, {t} tokens)")
    per_layer = []
    for i in range(lay.n_layers):
        per_layer.append({"cells": int(cells), "tiles": tile_layers is None or i in tile_layers,
                          "local": int(lay.windows[i] or LOCAL),
                          "rows": [[int(h), int(q)] for (layer, h, q) in rows if layer == i],
                          "full": i in maps, "roles_n": int(roles_n), "chunk_bytes": int(chunk_bytes)})
    return {"layers": per_layer, "lens_last": t if lens_last is None else int(min(lens_last, t))}


def reply_bytes(lay: Layout, t: int, cells: int = POOL_CELLS, rows: int = 0, maps: int = 0, roles_n: int = 0,
                lens_last: int | None = None, tile_layers: int | None = None) -> dict[str, int]:
    """Bytes of what ``trace_views`` saves over ``t`` tokens, per view (tensor bytes, as ``bytes_back`` counts them
    locally; ``rows``, ``maps`` and ``tile_layers``: how many, None: every layer's tiles): a model of any size,
    without running it (bench/remote.py)."""
    n = len(nt.block_edges(t, cells)) - 1
    lens = t if lens_last is None else min(lens_last, t)
    tiled = lay.n_layers if tile_layers is None else tile_layers
    out = {"tiles": 2 * tiled * lay.n_heads * n * n * 4, "stats": lay.n_layers * len(STATS) * lay.n_heads * 8,
           "rows": rows * t * 4, "maps": maps * lay.n_heads * t * t * 4,
           "roles": lay.n_layers * len(ROLES) * lay.n_heads * 8 if roles_n else 0,
           "lens": lay.n_layers * lens * (8 + 4 + 4) + 8 if lens else 0,
           "losses_logits": (t - 1) * 4 + lay.vocab * 4}
    out["total"] = sum(out.values())
    return out


def trace_views(lm: Any, ids: list[int], cells: int = POOL_CELLS, rows: list[tuple[int, int, int]] | tuple = (),
                maps: list[int] | tuple = (), roles_n: int = 0, lens_last: int | None = None,
                remote: bool | str = False, host: str | None = None, chunk_bytes: int = nt.CHUNK_BYTES,
                tile_layers: list[int] | tuple | None = None) -> TracedViews:
    """One forward of ``lm`` over ``ids`` in an nnsight trace, only reductions saved (module docstring).
    ``tile_layers``: the layers whose tiles travel (None: every layer). ``remote``: False (here), True (NDIF at
    ``host`` or NDIF_HOST, key NDIF_API_KEY) or "local" (nnsight's dry run of the remote path: the request serialised
    and rebuilt here with the project's modules hidden)."""
    import nnsight

    lay = layout(lm.config)
    ids = [int(i) for i in ids]
    if any(not 0 <= i < lay.vocab for i in ids):
        raise Refused(f"token ids must lie in 0…{lay.vocab - 1}")
    the_plan = plan(lay, len(ids), cells, rows, maps, roles_n, lens_last, chunk_bytes, tile_layers)
    the_layout = lay.as_dict()
    x = torch.tensor([ids])
    backend = None
    if remote:
        nnsight.register(nt)  # the trace code travels as source: the server needs only torch
        if remote is True:
            backend = safe_remote_backend(lm, host)
    start = time.perf_counter()
    with torch.inference_mode(), lm.trace(x, backend=backend, remote="local" if remote == "local" else False):
        out = nnsight.save(nt.views(lm, the_layout, x, the_plan))
    seconds = time.perf_counter() - start
    if backend is not None:
        where, got = f"NDIF ({backend.host})", int(backend.received)
    else:
        where, got = ("here (remote='local': serialised as for NDIF)" if remote == "local" else
                      "here (remote=False)"), _bytes(out)
    return _read(out, ids, where, seconds, got, lay, the_plan)


def _np(x: Any) -> np.ndarray:
    return x.float().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, np.float32)


def _read(out: dict, ids: list[int], where: str, seconds: float, got: int, lay: Layout, the_plan: dict
          ) -> TracedViews:
    layers = out["layers"]
    edges = np.asarray(nt.block_edges(len(ids), the_plan["layers"][0]["cells"]))
    stats = np.stack([_np(r["stats"]) for r in layers], 1)  # (4, L, H)
    views = TracedViews(
        ids=ids, where=where, seconds=seconds, bytes_back=got, edges=edges,
        n_layers=lay.n_layers, n_heads=lay.n_heads,
        tiles={how: {i: _np(r[how]) for i, r in enumerate(layers) if how in r} for how in ("max", "mean")},
        stats={name: stats[k] for k, name in enumerate(STATS)},
        rows={(i, *map(int, key.split(":"))): _np(v) for i, r in enumerate(layers) for key, v in r["rows"].items()},
        maps={i: _np(r["full"]) for i, r in enumerate(layers) if "full" in r},
        losses=_np(out["losses"]), last_logits=_np(out["last_logits"]))
    if "roles" in layers[0]:
        roles = np.stack([_np(r["roles"]) for r in layers], 1)
        views.roles = {name: roles[k] for k, name in enumerate(ROLES)}
    if "lens" in out:
        lens = out["lens"]
        views.lens = {"top": lens["top"].numpy(), "top_p": _np(lens["top_p"]), "next_p": _np(lens["next_p"]),
                      "choice": int(lens["choice"])}
    return views


def configured() -> tuple[str, bool] | None:
    """The model the server's configuration sends through nnsight: ATLAS_NNSIGHT (a Hugging Face folder or a Hub
    id; never the UI), run on NDIF when ATLAS_NNSIGHT_REMOTE=1; None when unset."""
    source = os.environ.get("ATLAS_NNSIGHT", "").strip()
    if not source:
        return None
    return source, os.environ.get("ATLAS_NNSIGHT_REMOTE", "").strip() in ("1", "true", "yes")
