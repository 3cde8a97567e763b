"""What a push of this checkout to a Hugging Face Space would send, checked against the Hub's rules, without pushing.

    python bench/space_dry_run.py [--keep DIR] [--cpu]

Builds the Space's tree as the README's steps do: a fresh single-commit history (an orphan branch) of the tracked
files, with the repository's ``.gitattributes``, in a temporary clone, so none of the 600-odd commits of plain
weights goes with it. Then every file of that commit is checked: a file over ``LIMIT`` (10 MB) or a binary file (a NUL
byte in its first 8,000, git's own test) must be stored through large-file storage (``filter=lfs`` by
``.gitattributes``, as ``git check-attr`` reads it); the Hub refuses a push with such a file in a plain blob ("Your push
was rejected because it contains binary files"), and a text file of 10 MB or less may be plain. ``--cpu``: the Space's
requirements.txt gets the CPU wheel index of PyTorch (``CPU_INDEX``), so a CPU Space installs no CUDA wheels.
Nothing is sent anywhere; git-lfs need not be installed (the attributes decide what it would store).

Last stdout line: ``{"files", "bytes", "lfs_files", "lfs_bytes", "plain_bytes", "largest_plain", "refused": [paths],
"ok"}``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 10 * 1024 * 1024  # the Hub's largest plain (non-LFS) file
CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def lfs_paths(tree: Path, paths: list[str]) -> set[str]:
    """The paths ``.gitattributes`` sends through LFS (``filter=lfs``), read by git itself."""
    if not paths:
        return set()
    out = subprocess.run(["git", "check-attr", "filter", "--stdin"], cwd=tree, input="\n".join(paths) + "\n",
                         check=True, capture_output=True, text=True).stdout
    return {line.rsplit(": filter: ", 1)[0] for line in out.splitlines() if line.endswith(": filter: lfs")}


def binary(path: Path) -> bool:
    with open(path, "rb") as f:
        return b"\0" in f.read(8000)


def check_tree(tree: Path) -> dict:
    """The rules over the files of the commit at ``tree``."""
    paths = [p for p in _git(tree, "ls-files", "-z").split("\0") if p]
    lfs = lfs_paths(tree, paths)
    refused, sizes = [], {}
    for p in paths:
        f = tree / p
        if not f.is_file() or f.is_symlink():
            continue
        sizes[p] = f.stat().st_size
        if p not in lfs and (sizes[p] > LIMIT or binary(f)):
            refused.append(p)
    plain = {p: s for p, s in sizes.items() if p not in lfs}
    largest = max(plain, key=plain.get) if plain else ""
    return {"files": len(sizes), "bytes": sum(sizes.values()), "lfs_files": sum(p in lfs for p in sizes),
            "lfs_bytes": sum(s for p, s in sizes.items() if p in lfs), "plain_bytes": sum(plain.values()),
            "largest_plain": [largest, plain.get(largest, 0)], "refused": sorted(refused), "ok": not refused}


def build(source: Path, out: Path, cpu: bool = False) -> Path:
    """The Space's tree in ``out``: the checkout's HEAD cloned, then one orphan commit of its files (with --cpu the
    CPU index line first in requirements.txt)."""
    _git(source, "clone", "--quiet", "--no-local", "--no-checkout", str(source), str(out))
    env_args = ["-c", "user.name=space-dry-run", "-c", "user.email=dry-run@localhost", "-c", "filter.lfs.smudge=",
                "-c", "filter.lfs.clean=", "-c", "filter.lfs.process=", "-c", "filter.lfs.required=false"]
    _git(out, *env_args, "checkout", "--quiet", "--orphan", "space", "origin/HEAD" if _has_head(out) else "HEAD")
    if cpu:
        req = out / "requirements.txt"
        text = req.read_text(encoding="utf-8")
        if CPU_INDEX not in text:
            req.write_text(f"{CPU_INDEX}  # a CPU Space: PyTorch's CPU wheels, no CUDA\n{text}", encoding="utf-8")
    _git(out, *env_args, "add", "-A")
    _git(out, *env_args, "commit", "--quiet", "-m", "Space")
    return out


def _has_head(repo: Path) -> bool:
    return subprocess.run(["git", "rev-parse", "--verify", "--quiet", "origin/HEAD"], cwd=repo,
                          capture_output=True).returncode == 0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default=str(ROOT), help="the checkout to build from (its committed HEAD)")
    ap.add_argument("--keep", help="build here (an empty or new folder) and keep it, instead of a temporary one")
    ap.add_argument("--cpu", action="store_true", help="add PyTorch's CPU wheel index to requirements.txt")
    args = ap.parse_args(argv)
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="space-dry-run-")) / "space"
    try:
        tree = build(Path(args.source), tmp, args.cpu)
        report = check_tree(tree)
        commits = int(_git(tree, "rev-list", "--count", "space").strip())
        report["commits"] = commits
        for p in report["refused"]:
            print(f"refused by the Hub: {p} ({(tree / p).stat().st_size:,} bytes, not in LFS)", file=sys.stderr)
        print(json.dumps(report))
    finally:
        if not args.keep:
            shutil.rmtree(tmp.parent, ignore_errors=True)
    if not report["ok"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
