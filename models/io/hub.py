"""Hugging Face Hub models, fetched on first use into huggingface_hub's own cache, and the size limit.

``fetch(repo, revision)`` returns a local folder that ``models.io.hf.load_hf`` reads. It looks in the cache first
(``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``: the same place transformers uses)
and only then, unless downloads are off (``ATLAS_OFFLINE=1`` or ``HF_HUB_OFFLINE=1``), asks the Hub: first
the safetensors headers (the parameter count is checked against ``ATLAS_MAX_PARAMS`` before anything is
downloaded; a repository without safetensors weights is refused, since ``.bin`` files are pickles), then
the files the loaders read. Every network step has a timeout of a few seconds, so an offline machine gets
``HubUnavailable`` with what to do instead of a hang. ``HF_TOKEN`` works for private or gated repositories,
as huggingface_hub reads it itself. Nothing here runs at start-up.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from collections.abc import Callable
from pathlib import Path

# What the loaders read (models/io/hf.py): never the pickled *.bin weights.
FILES = ["config.json", "model.safetensors", "model-*.safetensors", "model.safetensors.index.json",
         "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "preprocessor_config.json",
         "vocab.txt", "vocab.json", "merges.txt", "generation_config.json",
         "processor_config.json", "chat_template.json", "chat_template.jinja",  # vision-language processors
         "source.spm", "target.spm", "target_vocab.json"]  # Marian's SentencePiece pair and vocabularies
KINDS = ("classify", "generate", "vision", "translate", "describe")  # describe: Image + text (issue 63)
DEFAULT_MAX_PARAMS = 500_000_000  # Qwen2.5-0.5B (494 M, 2 GB in float32) fits
TIMEOUT_S = 4.0  # per network step: "offline" is reported within about 5 s
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,99}")

Progress = Callable[[float, str], None]  # (fraction done, what is happening)


class HubUnavailable(RuntimeError):
    """The model cannot be had from the Hub now (offline, not found, refused); the message says what to do."""


class TooLarge(ValueError):
    """A model has more parameters than ATLAS_MAX_PARAMS allows."""


def offline() -> bool:
    """Downloads are off: ``ATLAS_OFFLINE`` or ``HF_HUB_OFFLINE`` set to 1/true/yes/on (read at each call)."""
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in ("ATLAS_OFFLINE", "HF_HUB_OFFLINE"))


def cache_dir() -> Path:
    """huggingface_hub's cache folder, resolved from the environment at call time."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    return Path(home).expanduser() / "hub"


def parse_entry(entry: str) -> tuple[str, str, str | None] | None:
    """``KIND:OWNER/NAME[@REVISION]`` -> (kind, repo, revision); None when the entry is a local folder. Raises
    ``ValueError`` for a Hub entry with an unknown kind or a malformed id or revision."""
    m = re.fullmatch(r"([A-Za-z]{2,}):([^/\\].*)", entry)  # "C:\\x", "/a:b" and "./x:y" stay folders
    if m is None or "/" not in m.group(2):
        return None
    kind, (repo, _, revision) = m.group(1), m.group(2).partition("@")
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r} (expected one of {', '.join(KINDS)})")
    if not _REPO.fullmatch(repo) or ".." in repo:
        raise ValueError(f"{repo!r} is not a Hub model id (OWNER/NAME)")
    if revision and (not _REVISION.fullmatch(revision) or ".." in revision):
        raise ValueError(f"{revision!r} is not a revision (a branch, tag or commit)")
    return kind, repo, revision or None


def max_params() -> int:
    """``ATLAS_MAX_PARAMS`` (a number, or with a K/M/B suffix: 400M), default 500 M."""
    raw = os.environ.get("ATLAS_MAX_PARAMS", "").strip().upper().replace("_", "")
    if not raw:
        return DEFAULT_MAX_PARAMS
    scale = {"K": 1e3, "M": 1e6, "B": 1e9}.get(raw[-1], 1)
    try:
        return int(float(raw[:-1] if scale != 1 else raw) * scale)
    except ValueError:
        raise ValueError(f"ATLAS_MAX_PARAMS={os.environ['ATLAS_MAX_PARAMS']!r} is not a number") from None


def safetensors_params(path: Path) -> int:
    """Parameters in one safetensors file, from its header alone (8-byte little-endian length, then JSON)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path.name} is not a safetensors file (too short)")
        (size,) = struct.unpack("<Q", head)
        if size > 100_000_000:
            raise ValueError(f"{path.name} has an implausible header of {size} bytes")
        header = json.loads(f.read(size))
    return sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")


def folder_params(folder: Path) -> int:
    """Parameters of a folder's ``model*.safetensors`` files, from their headers."""
    return sum(safetensors_params(p) for p in sorted(Path(folder).glob("model*.safetensors")))


def check_size(n_params: int, name: str) -> None:
    """Refuse a model over ATLAS_MAX_PARAMS, before it is loaded (or downloaded)."""
    limit = max_params()
    if n_params > limit:
        raise TooLarge(f"`{name}` has {n_params / 1e6:,.0f} M parameters, over this server's limit of "
                       f"{limit / 1e6:,.0f} M (ATLAS_MAX_PARAMS); raise it where the machine has the memory.")


def how_to_get(repo: str, revision: str | None) -> str:
    at = f" --revision {revision}" if revision else ""
    return (f"On a machine with a network run `hf download {repo}{at} --include '*.safetensors' '*.json' "
            f"'*.txt'` (or start this app there once) and copy the cache ({cache_dir()}) here, or point "
            f"`--model` at a local folder with the same files.")


def cached(repo: str, revision: str | None = None) -> Path | None:
    """The cached snapshot of ``repo`` at ``revision`` if it holds a config.json and safetensors weights."""
    from huggingface_hub import snapshot_download

    try:
        path = Path(snapshot_download(repo, revision=revision, cache_dir=cache_dir(), local_files_only=True,
                                      allow_patterns=FILES))
    except Exception:  # not cached (LocalEntryNotFoundError and relatives), or an unusable cache entry
        return None
    return path if (path / "config.json").is_file() and any(path.glob("model*.safetensors")) else None


def fetch(repo: str, revision: str | None = None, progress: Progress | None = None,
          timeout: float = TIMEOUT_S) -> Path:
    """A local folder with ``repo``'s files: the cache's, or downloaded now (``progress`` hears how far)."""
    name = f"{repo}@{revision}" if revision else repo
    folder = cached(repo, revision)
    if folder is not None:
        check_size(folder_params(folder), name)
        return folder
    if offline():
        raise HubUnavailable(f"offline: `{name}` is not in the cache and downloads are off (ATLAS_OFFLINE / "
                             f"HF_HUB_OFFLINE). {how_to_get(repo, revision)}")
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub import errors as hub_errors

    endpoint = os.environ.get("HF_ENDPOINT") or None  # read now, not at import: a mirror can be set at any time
    try:
        reachable(endpoint or "https://huggingface.co", timeout)  # one quick request, no retries: never a hang
        meta = HfApi(endpoint=endpoint).get_safetensors_metadata(repo, revision=revision, timeout=timeout)
        check_size(sum(meta.parameter_count.values()), name)
        if progress is not None:
            progress(0.0, f"downloading {name}")
        path = Path(snapshot_download(repo, revision=revision, cache_dir=cache_dir(), allow_patterns=FILES,
                                      etag_timeout=timeout, tqdm_class=_progress_class(progress, name),
                                      endpoint=endpoint))
    except TooLarge:
        raise
    except hub_errors.NotASafetensorsRepoError:
        raise HubUnavailable(f"`{name}` has no safetensors weights (only pickled .bin files, which this app "
                             "does not load).") from None
    except (hub_errors.GatedRepoError, hub_errors.RepositoryNotFoundError, hub_errors.RevisionNotFoundError) as e:
        raise HubUnavailable(f"`{name}` was not found or needs access ({type(e).__name__}); for a private or "
                             "gated repository set HF_TOKEN.") from None
    except Exception as e:  # no route, DNS failure, timeout, proxy refusal: all mean "offline" here
        raise HubUnavailable(f"offline: the Hub could not be reached for `{name}` within {timeout:.0f} s "
                             f"({type(e).__name__}). {how_to_get(repo, revision)}") from None
    if progress is not None:
        progress(1.0, f"downloaded {name}")
    return path


def reachable(endpoint: str, timeout: float) -> None:
    """Raise ``OSError`` unless ``endpoint`` answers an HTTP request within ``timeout`` seconds (any status)."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(urllib.request.Request(endpoint.rstrip("/") + "/api/models", method="HEAD"),
                               timeout=timeout).close()
    except urllib.error.HTTPError:
        return  # it answered
    except (urllib.error.URLError, TimeoutError, ValueError) as err:
        raise OSError(f"{endpoint} did not answer: {err}") from None


def _progress_class(progress: Progress | None, name: str):
    """A tqdm class that reports the bars huggingface_hub opens (files done, bytes of each file) to
    ``progress``; None when nobody listens (huggingface_hub's own bars then)."""
    if progress is None:
        return None
    from tqdm.auto import tqdm

    class Reporting(tqdm):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            self.label = kwargs.get("desc") or "files"
            kwargs["disable"] = True  # nothing on the server's terminal; the user sees it in the page
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            self.n += n or 0
            if self.total:
                progress(min(self.n / self.total, 1.0), f"downloading {name}: {self.label}")

    return Reporting
