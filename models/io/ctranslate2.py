"""A reader of CTranslate2's ``model.bin`` (binary format 6), the project's own, reading only what the format says.

The file, little-endian throughout:

    uint32 version (6) · string spec name ("WhisperSpec") · uint32 spec revision · uint32 variable count
    per variable: string name · uint8 rank · uint32 × rank dims · uint8 dtype · uint32 byte count · the bytes
    uint32 alias count · per alias: string alias · string the variable it names

where a *string* is a uint16 byte count (the terminating NUL included), the UTF-8 bytes and a NUL. dtype ids: 0
float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16. Scalars (rank 0) hold the spec's settings (the
activation id, ``pre_norm``, head counts). A truncated file, another version, an unknown dtype, a byte count that
does not fit the shape, a variable named twice or an alias to nothing: each is a ``CheckpointError`` that says so.
Nothing is executed and nothing unpickled; the file is memory-mapped and each array is a copy of its bytes.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.paths import CheckpointError

VERSION = 6
DTYPES: dict[int, np.dtype] = {0: np.dtype("<f4"), 1: np.dtype("i1"), 2: np.dtype("<i2"), 3: np.dtype("<i4"),
                               4: np.dtype("<f2")}  # 5 (bfloat16) is read into float32 by _bfloat16
BFLOAT16 = 5
MAX_RANK = 8
MAX_VARIABLES = 100_000


@dataclass(frozen=True)
class CT2Model:
    """What a model.bin holds: its spec, revision and variables (aliases resolved to the arrays they name)."""

    spec: str
    revision: int
    variables: dict[str, np.ndarray]
    aliases: dict[str, str]

    def scalar(self, name: str) -> int | float:
        """A rank-0 setting as a Python number; a missing one is an error naming it."""
        if name not in self.variables:
            raise KeyError(name)
        a = self.variables[name]
        if a.size != 1:
            raise ValueError(f"{name} is not a scalar: shape {a.shape}")
        return a.reshape(-1)[0].item()


class _Reader:
    def __init__(self, data: bytes | mmap.mmap, path: Path) -> None:
        self.data, self.at, self.path = data, 0, path

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise CheckpointError(self.path, f"truncated: needs {n} bytes at offset {self.at}, the file has "
                                             f"{len(self.data)}")
        out = self.data[self.at: self.at + n]
        self.at += n
        return out

    def unpack(self, fmt: str) -> tuple:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))

    def string(self) -> str:
        (n,) = self.unpack("H")
        raw = self.take(n)
        if n == 0 or raw[-1:] != b"\0":
            raise CheckpointError(self.path, f"a string at offset {self.at - n} is not NUL-terminated")
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise CheckpointError(self.path, f"a string at offset {self.at - n} is not UTF-8") from None


def _bfloat16(raw: bytes) -> np.ndarray:
    """bfloat16 bytes as float32: each value is the upper half of a float32."""
    return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)


def parse(data: bytes | mmap.mmap, path: Path | str = "model.bin") -> CT2Model:
    """The variables of a model.bin already in memory (or mapped)."""
    path = Path(path)
    r = _Reader(data, path)
    (version,) = r.unpack("I")
    if version != VERSION:
        raise CheckpointError(path, f"CTranslate2 binary version {version}; only version {VERSION} is read")
    spec = r.string()
    (revision,) = r.unpack("I")
    (count,) = r.unpack("I")
    if count > MAX_VARIABLES:
        raise CheckpointError(path, f"{count} variables: not a model file this reader trusts")
    variables: dict[str, np.ndarray] = {}
    for _ in range(count):
        name = r.string()
        (rank,) = r.unpack("B")
        if rank > MAX_RANK:
            raise CheckpointError(path, f"variable {name!r} has rank {rank}")
        dims = r.unpack("I" * rank)
        (dtype,) = r.unpack("B")
        (nbytes,) = r.unpack("I")
        if dtype != BFLOAT16 and dtype not in DTYPES:
            raise CheckpointError(path, f"variable {name!r} has an unknown dtype id {dtype}")
        itemsize = 2 if dtype == BFLOAT16 else DTYPES[dtype].itemsize
        if nbytes != int(np.prod(dims, dtype=np.int64)) * itemsize:
            raise CheckpointError(path, f"variable {name!r}: {nbytes} bytes do not fit shape {tuple(dims)}")
        raw = r.take(nbytes)
        if name in variables:
            raise CheckpointError(path, f"variable {name!r} appears twice")
        arr = _bfloat16(raw) if dtype == BFLOAT16 else np.frombuffer(raw, dtype=DTYPES[dtype])
        variables[name] = arr.reshape(dims).copy()
    (n_alias,) = r.unpack("I")
    aliases: dict[str, str] = {}
    for _ in range(n_alias):
        alias, target = r.string(), r.string()
        if target not in variables:
            raise CheckpointError(path, f"alias {alias!r} names {target!r}, which the file does not hold")
        aliases[alias] = target
        variables[alias] = variables[target]
    if r.at != len(data):
        raise CheckpointError(path, f"{len(data) - r.at} bytes after the last alias: not a model.bin of version 6")
    return CT2Model(spec, int(revision), variables, aliases)


def read(path: Path | str) -> CT2Model:
    """Parse the model.bin at ``path`` (a file the app found itself, never a user's path)."""
    path = Path(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return parse(m, path)
    except (OSError, ValueError) as err:
        if isinstance(err, CheckpointError):
            raise
        raise CheckpointError(path, f"cannot be read: {err}") from None


def write(path: Path | str, spec: str, revision: int, variables: dict[str, np.ndarray],
          aliases: dict[str, str] | None = None) -> None:
    """Write a model.bin of version 6 (the tests' round trip and their small files; float32/16, int8/16/32)."""
    codes = {v: k for k, v in DTYPES.items()}

    def string(s: str) -> bytes:
        b = s.encode("utf-8") + b"\0"
        return struct.pack("<H", len(b)) + b

    parts = [struct.pack("<I", VERSION), string(spec), struct.pack("<II", revision, len(variables))]
    for name, a in variables.items():
        a = np.array(a, order="C")  # (ascontiguousarray would make a scalar 1-D)
        dt = a.dtype.newbyteorder("<") if a.dtype.itemsize > 1 else a.dtype
        if dt not in codes:
            raise ValueError(f"{name}: dtype {a.dtype} has no CTranslate2 id here")
        raw = a.astype(dt).tobytes()
        parts += [string(name), struct.pack("<B", a.ndim), struct.pack("<" + "I" * a.ndim, *a.shape),
                  struct.pack("<BI", codes[dt], len(raw)), raw]
    parts.append(struct.pack("<I", len(aliases or {})))
    for alias, target in (aliases or {}).items():
        parts += [string(alias), string(target)]
    Path(path).write_bytes(b"".join(parts))
