"""Where a checkpoint lives: a bare name under ``checkpoints/``, or a path (no torch; ``models.resolve``); and the error
that names a file of a folder that cannot be loaded, which every reader raises."""

from __future__ import annotations

import re
from pathlib import Path

CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def resolve(name_or_path: str | Path) -> Path:
    """Where a checkpoint lives.

    A string is a bare name, meaning ``checkpoints/<name>`` (letters, digits, '.', '_', '-'), or a path
    with separators; a string with a '..' component is refused, so text that reaches here from a user
    can never climb out of a folder. A ``Path`` (from code or a CLI) is taken as given, except a
    single-component one that does not exist here, which is read as a name (``--checkpoint sst2``).
    """
    if isinstance(name_or_path, Path):
        p = name_or_path
        if len(p.parts) == 1 and not p.exists() and _NAME.match(p.name) and ".." not in p.name:
            return CHECKPOINTS / p.name
        return p
    s = str(name_or_path)
    if "/" in s or "\\" in s:
        if ".." in Path(s.replace("\\", "/")).parts:
            raise ValueError(f"checkpoint path {s!r} may not contain '..'")
        return Path(s)
    if not _NAME.match(s) or ".." in s:
        raise ValueError(f"invalid checkpoint name {s!r}: use letters, digits, '.', '_' or '-'")
    return CHECKPOINTS / s


class CheckpointError(Exception):
    """A checkpoint folder that cannot be loaded; the message names the offending file."""

    def __init__(self, file: str | Path, message: str) -> None:
        self.file = str(file)
        super().__init__(f"{Path(file).name}: {message}")


def distribution_file(dist: str, inner: str) -> Path | None:
    """The file ``inner`` (a path inside the site-packages folder, "/"-separated) of the installed distribution
    ``dist``, found through its file list (importlib.metadata: the package is never imported), or None when the
    distribution or the file is not there. The packages that ship real weights (GGUF, ONNX, CTranslate2 files)."""
    from importlib import metadata

    try:
        files = metadata.distribution(dist).files or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if str(f).replace("\\", "/") == inner:
            path = Path(f.locate()).resolve()
            return path if path.is_file() else None
    return None
