"""The head atlas served by model name (no gradio): the tab's handlers and ``bench/heads.py`` call the same
``atlas(name, corpus_text)``, so both resolve names as the app does (``serving.catalogue``, ``serving.store``).

Atlases are cached on disk under ``$ATLAS_CACHE`` (default ``runs/heads``, git-ignored), keyed by a digest of the
model's weights and of the corpus (models/inspect/atlas.py). The weights' digest comes from the model's files where
the catalogue knows its folder (each file's sha256 remembered by size and modification time, so a cached grid
answers without loading the model), else from the loaded model's tensors. The last few atlases are also kept in
memory, so moving between metrics, heads and cards costs nothing.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from serving import catalogue, store
from serving.errors import ServingError

KEEP = 8  # atlases kept in memory
_kept: OrderedDict[tuple[str, str], Any] = OrderedDict()
_locks: dict[tuple[str, str], threading.Lock] = {}
_guard = threading.Lock()


class AtlasRefused(ServingError):
    """A request the head atlas refuses in words: an unknown model, a bad corpus, a family it cannot score."""


def cache_dir() -> Path:
    """Where atlases are kept: ``ATLAS_CACHE`` or runs/heads in the checkout (read at each call)."""
    return Path(os.environ.get("ATLAS_CACHE") or catalogue.ROOT / "runs" / "heads")


def model_names() -> list[str]:
    """Every model name the app shows, in its tabs' order, once each."""
    names = [n for tab in ("generate", "classify", "translate", "vision") for n in catalogue.names(tab)]
    names += list(catalogue.PACKAGED_VISION)  # DINOv2 from its package's ONNX file: scored on the photographs
    return list(dict.fromkeys(names))


def resolve(name: str) -> str:
    """The catalogue's name for ``name`` (a shown ImageNet name to torchvision's); AtlasRefused when unknown."""
    name = (name or "").strip()
    if name in catalogue.IMAGENET:
        return catalogue.IMAGENET[name]
    if name in model_names() or name in catalogue.IMAGENET_NAMES:
        return name
    shown = ", ".join(model_names()[:12])
    raise AtlasRefused(f"No model is called {name[:80]!r} here. Models: {shown}, …")


def corpus_kind(name: str) -> str | None:
    """The corpus a model reads, from its family, without loading it (None where unknown before loading)."""
    family = catalogue.family(name)
    if family is None or not family.tabs:
        return None
    return {"generate": "text", "classify": "text", "translate": "translate", "vision": "images"}[family.tabs[0]]


def _folder(name: str) -> Path | None:
    if name in catalogue.CONFIGURED and catalogue.CONFIGURED[name].folder is not None:
        return catalogue.CONFIGURED[name].folder
    entry = catalogue.CONFIGURED.get(name) or catalogue.DOWNLOADABLE.get(name)
    if entry is not None and entry.repo:
        from models.io.hub import cached

        return cached(entry.repo, entry.revision)
    folder = catalogue.CHECKPOINTS / name
    return folder if folder.is_dir() else None


def _gguf_file(name: str) -> Path | None:
    """The GGUF file behind a catalogue name, found without reading it (None: not a GGUF model, or not there)."""
    from models.io.gguf import GGUFError, packaged_file, resolve_spec

    if name in catalogue.PACKAGED:
        return packaged_file(catalogue.PACKAGED[name])
    entry = catalogue.CONFIGURED.get(name)
    if entry is None or not entry.gguf:
        return None
    try:
        path = resolve_spec(entry.gguf)
    except (GGUFError, OSError, ValueError):
        return None
    return path if path.is_file() else None


def weights_digest(name: str) -> str | None:
    """A digest of the model's weight files (and config), without loading it; None where its files are unknown."""
    from models.inspect.atlas import file_digest

    if name in catalogue.PACKAGED_VISION:  # an ONNX file a package ships (DINOv2): the file itself
        from models.io.onnx_vit import packaged_file

        found = packaged_file()
        return file_digest([found], cache_dir() / "file-hashes.json") if found is not None else None
    gguf = _gguf_file(name)
    if gguf is not None:  # a GGUF file (SmolLM2 from its package, a --model PATH.gguf, an Ollama blob): the file itself
        return file_digest([gguf], cache_dir() / "file-hashes.json")
    folder = _folder(name)
    if folder is None:
        return None
    files = [p for p in folder.iterdir() if p.is_file() and (p.suffix == ".safetensors" or p.name in (
        "config.json", "manifest.json", "tokenizer.json", "tokenizer.model"))]
    if not any(p.suffix == ".safetensors" for p in files):
        return None
    return file_digest(files, cache_dir() / "file-hashes.json")


def corpus_for(name: str, corpus_text: str | None, kind: str | None = None) -> Any:
    """The built-in corpus of the model's modality, or the user's text (checked: models.inspect.atlas.user_corpus)."""
    from models.inspect.atlas import builtin_corpus, user_corpus

    kind = kind or corpus_kind(name) or "text"
    if name in catalogue.PACKAGED_VISION and corpus_text is None:  # a real photographic model: real photographs
        from models.inspect.atlas import photo_corpus

        try:
            return photo_corpus()
        except ValueError as err:
            raise AtlasRefused(str(err)) from None
    if corpus_text is not None:
        if kind == "images":
            raise AtlasRefused("Image models are scored on the shipped images; a corpus of your own is text.")
        try:
            return user_corpus(corpus_text, kind)
        except ValueError as err:
            raise AtlasRefused(str(err)) from None
    return builtin_corpus(kind)


def atlas(name: str, corpus_text: str | None = None, progress: Any = None) -> tuple[Any, bool]:
    """(the head atlas of model ``name`` over the built-in corpus or ``corpus_text``, whether it came from a cache).

    Raises AtlasRefused (an unknown name, a bad corpus, a family the atlas does not score) or the store's
    ModelUnavailable, each with a message in words."""
    from models.inspect.atlas import cached_atlas, modality, run_atlas, state_digest

    name = resolve(name)
    kind = corpus_kind(name)
    corpus = corpus_for(name, corpus_text, kind)
    digest = weights_digest(name) if kind else None
    if digest is not None:
        key = (digest, corpus.digest)
        with _guard:
            if key in _kept:
                _kept.move_to_end(key)
                return _kept[key], True
            lock = _locks.setdefault(key, threading.Lock())
    else:
        lock = threading.Lock()
    with lock:
        model = None

        def compute() -> Any:
            nonlocal model
            if model is None:
                model = store.get_model(name, progress)
            try:
                return run_atlas(model, corpus, name, progress=progress)
            except ValueError as err:
                raise AtlasRefused(f"The head atlas cannot score `{name}`: {err}.") from None

        if digest is None:  # files unknown before loading: the loaded model's own tensors say which weights these are
            model = store.get_model(name, progress)
            if kind is None:
                corpus = corpus_for(name, corpus_text, modality(model))
            digest = state_digest(model)
        result, was_cached = cached_atlas(name, corpus, digest, cache_dir(), compute)
        result.model = name
        with _guard:
            _kept[(digest, corpus.digest)] = result
            while len(_kept) > KEEP:
                _kept.popitem(last=False)
    return result, was_cached


def example_map(name: str, item: str, layer: int) -> Any:
    """One corpus item's attention in one layer (for a head card): models.inspect.atlas.example_map."""
    from models.inspect.atlas import example_map as run

    model = store.get_model(resolve(name))
    try:
        return run(model, item, layer)
    except ValueError as err:
        raise AtlasRefused(str(err)) from None
