"""Checkpoint folders (docs/ARCHITECTURE.md §4): config.json, safetensors weights, tokenizer files, sha256 manifest.

Layout of a folder::

    config.json        {"model": "<class>", "format": 1, "config": {...}, "labels": [...], "text": {...}}
    model.safetensors  or model-00001-of-0000M.safetensors ... (each file <= 24 MB)
    tokenizer.model    (SentencePiece) or tokenizer.json (Hugging Face tokenizers), when the model has one
    manifest.json      {"files": {"<name>": "<sha256>", ...}, "sizes": {"<name>": bytes, ...}}
    metrics.json       written by evaluation; not in the manifest

No pickle anywhere: weights are safetensors. Floating tensors are stored in fp16 by default (halves the
size; the models run in float32 after loading). Tied parameters (shared embeddings) are stored once and
recorded as aliases in the safetensors metadata.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from models.paths import CheckpointError  # noqa: F401 (its home is below every sub-package; raised here)

FORMAT = 1
MAX_SHARD_BYTES = 24 * 1024 * 1024  # stays under the 25 MB per-file budget (docs/ARCHITECTURE.md §6)
CONFIG, MANIFEST, WEIGHTS = "config.json", "manifest.json", "model.safetensors"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _shards(tensors: dict[str, Tensor], limit: int) -> list[dict[str, Tensor]]:
    """Greedy split of the tensors, in order, into groups of at most ``limit`` bytes each."""
    groups: list[dict[str, Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        if n > limit:
            raise ValueError(f"tensor {name} ({n} bytes) is larger than one shard ({limit} bytes)")
        if size + n > limit and groups[-1]:
            groups.append({})
            size = 0
        groups[-1][name] = t
        size += n
    return groups


def _canonical_header(path: Path) -> None:
    """Rewrite a safetensors header with its metadata keys sorted (same length, data untouched). safetensors
    writes the metadata in hash-map order, which changes from run to run; sorted, a shard holding the same
    tensors is byte-identical across checkpoints (a frozen word-embedding shard shared by two checkpoints
    is then stored once in git)."""
    with path.open("r+b") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        if "__metadata__" in header:
            header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        text = json.dumps(header, separators=(",", ":")).encode()
        if len(text) > size:  # never: the same keys and values, as compact as safetensors writes them
            raise ValueError(f"{path}: header grew when sorted")
        f.seek(8)
        f.write(text.ljust(size, b" "))


def save_checkpoint(
    folder: str | Path,
    model: nn.Module,
    labels: list[str] | None = None,
    text: dict[str, Any] | None = None,
    extra_files: dict[str, str | Path] | None = None,
    fp16: bool = True,
    metrics: dict[str, Any] | None = None,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Path:
    """Write ``model`` (with a dataclass ``.config``) into ``folder`` in the format above.

    extra_files: {name in the folder: source path}, e.g. {"tokenizer.model": "runs/spm/en-de.model"}.
    metrics: written to metrics.json (outside the manifest). Returns the folder path.
    """
    config = getattr(model, "config", None)
    if config is None or not dataclasses.is_dataclass(config):
        raise TypeError(f"{type(model).__name__} needs a dataclass `config` attribute to be saved")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("model*.safetensors"):  # stale shards from an earlier save
        old.unlink()

    tensors: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}  # tied parameter -> the name it is stored under
    seen: dict[tuple[int, tuple[int, ...], tuple[int, ...]], str] = {}
    for name, t in model.state_dict().items():
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()))
        if t.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        t = t.detach().cpu()
        if fp16 and t.is_floating_point():
            t = t.half()
        tensors[name] = t.contiguous().clone()

    groups = _shards(tensors, max_shard_bytes)
    names = [WEIGHTS] if len(groups) == 1 else [
        f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))
    ]
    meta = {"format": "pt", "aliases": json.dumps(aliases)}
    for name, group in zip(names, groups):
        save_file(group, str(folder / name), metadata=meta)
        _canonical_header(folder / name)

    cfg = {
        "model": type(model).__name__,
        "format": FORMAT,
        "config": dataclasses.asdict(config),
        "labels": list(labels) if labels is not None else list(getattr(model, "labels", []) or []),
        "text": dict(text or {}),
    }
    (folder / CONFIG).write_text(json.dumps(cfg, indent=2) + "\n")
    files = [CONFIG, *names]
    for name, src in (extra_files or {}).items():
        if Path(name).name != name:
            raise ValueError(f"extra file names must be plain file names, got {name!r}")
        if Path(src).resolve() != (folder / name).resolve():
            shutil.copyfile(src, folder / name)
        files.append(name)
    manifest = {
        "files": {n: sha256(folder / n) for n in files},
        "sizes": {n: (folder / n).stat().st_size for n in files},
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    if metrics is not None:
        (folder / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return folder


def add_to_manifest(folder: str | Path, name: str) -> None:
    """List (or re-list) the file ``name`` of a checkpoint folder in its manifest, with its hash and size."""
    folder = Path(folder)
    if Path(name).name != name or not (folder / name).is_file():
        raise ValueError(f"{name!r} is not a file in {folder}")
    manifest = _read_json(folder / MANIFEST)
    manifest["files"][name] = sha256(folder / name)
    manifest.setdefault("sizes", {})[name] = (folder / name).stat().st_size
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise CheckpointError(path, f"missing from {path.parent}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(path, f"is not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise CheckpointError(path, "must hold a JSON object")
    return data


def verify(folder: str | Path) -> dict[str, str]:
    """Check every file listed in manifest.json: present, full size, sha256 equal. Returns the hashes."""
    folder = Path(folder)
    manifest = _read_json(folder / MANIFEST)
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise CheckpointError(folder / MANIFEST, "has no 'files' table")
    sizes = manifest.get("sizes", {})
    for name, digest in files.items():
        path = folder / name
        if Path(name).name != name:
            raise CheckpointError(folder / MANIFEST, f"lists a path outside the folder: {name!r}")
        if not path.is_file():
            raise CheckpointError(path, f"is listed in manifest.json but missing from {folder}")
        size = path.stat().st_size
        if name in sizes and size != sizes[name]:
            raise CheckpointError(path, f"is truncated or altered: {size} bytes, expected {sizes[name]}")
        if sha256(path) != digest:
            raise CheckpointError(path, "sha256 does not match manifest.json (file corrupted or changed)")
    return files


def load_checkpoint(
    folder: str | Path, verify_hashes: bool = True
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """Read a checkpoint folder: (meta = parsed config.json, state_dict in float32).

    Raises CheckpointError naming the file when the manifest does not match, a file is missing or
    truncated, or config.json is malformed.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(folder, "checkpoint folder not found")
    listed = verify(folder) if verify_hashes else None
    meta = _read_json(folder / CONFIG)
    for key, kind in (("model", str), ("format", int), ("config", dict)):
        if not isinstance(meta.get(key), kind):
            raise CheckpointError(folder / CONFIG, f"needs a {kind.__name__} '{key}' entry")
    if meta["format"] != FORMAT:
        raise CheckpointError(folder / CONFIG, f"format {meta['format']} is not supported, expected {FORMAT}")
    meta.setdefault("labels", [])
    meta.setdefault("text", {})

    names = sorted(n for n in (listed or {}) if n.startswith("model") and n.endswith(".safetensors"))
    if listed is None:
        names = sorted(p.name for p in folder.glob("model*.safetensors"))
    if not names:
        raise CheckpointError(folder / WEIGHTS, f"missing from {folder}")
    state: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    for name in names:
        path = folder / name
        try:
            part = load_file(str(path))
            with open(path, "rb") as f:
                header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
            aliases.update(json.loads(header.get("__metadata__", {}).get("aliases", "{}")))
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(path, f"is not a readable safetensors file ({e})") from e
        state.update({k: (v.float() if v.is_floating_point() else v) for k, v in part.items()})
    for alias, source in aliases.items():
        if source not in state:
            raise CheckpointError(folder / names[0], f"tied tensor {alias} refers to missing {source}")
        state[alias] = state[source]
    return meta, state


def config_from_dict(cls: type, data: dict[str, Any], file: str | Path = CONFIG) -> Any:
    """Build the dataclass ``cls`` from ``data``; unknown or missing keys raise CheckpointError, except the
    fields ``cls.OPTIONAL`` names (added after checkpoints were shipped: their defaults apply)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown, missing = sorted(set(data) - fields), sorted(fields - set(data) - set(getattr(cls, "OPTIONAL", ())))
    if unknown or missing:
        parts = [f"unknown keys {unknown}"] if unknown else []
        parts += [f"missing keys {missing}"] if missing else []
        raise CheckpointError(file, f"config for {cls.__name__} has " + " and ".join(parts))
    try:
        return cls(**data)
    except (TypeError, ValueError) as e:
        raise CheckpointError(file, f"invalid config for {cls.__name__}: {e}") from e
