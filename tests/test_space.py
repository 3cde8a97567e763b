"""Issue 75, item 8: a Hugging Face Space from this repository. The dry run (bench/space_dry_run.py) builds the
Space's single-commit tree and checks every file against the Hub's rules (over 10 MB or binary: through LFS); the
shipped .gitattributes passes it, a tree without it is refused; the class's join link and QR code hold the Space's
public address when the page's own is a proxy's loopback one (forwarded headers)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("space_dry_run", ROOT / "bench" / "space_dry_run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _repo(path: Path, files: dict[str, bytes]) -> Path:
    path.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    subprocess.run(["git", "add", "-A"], cwd=path, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"], cwd=path, check=True)
    return path


def test_the_rules_refuse_plain_binaries_and_big_files(tmp_path) -> None:
    dry = _bench()
    files = {"app.py": b"print('hi')\n", "requirements.txt": b"torch==2.14.1\n",
             "w/model.safetensors": b"\0" * 100, "big.txt": b"a" * (dry.LIMIT + 1), "ok.txt": b"b" * 1000}
    tree = dry.build(_repo(tmp_path / "plain", files), tmp_path / "out-plain")
    report = dry.check_tree(tree)
    assert report["refused"] == ["big.txt", "w/model.safetensors"] and not report["ok"]
    attrs = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\nbig.txt filter=lfs diff=lfs merge=lfs -text\n"
    tree = dry.build(_repo(tmp_path / "lfs", {**files, ".gitattributes": attrs}), tmp_path / "out-lfs", cpu=True)
    report = dry.check_tree(tree)
    assert report["ok"] and report["lfs_files"] == 2 and report["lfs_bytes"] == dry.LIMIT + 101
    assert (tree / "requirements.txt").read_text().startswith(dry.CPU_INDEX)
    assert subprocess.run(["git", "rev-list", "--count", "HEAD"], cwd=tree, capture_output=True,
                          text=True).stdout.strip() == "1"


def test_this_repository_would_push(tmp_path, capsys) -> None:
    dry = _bench()
    dry.main(["--source", str(ROOT), "--keep", str(tmp_path / "space")])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["ok"] and report["commits"] == 1 and report["refused"] == []
    assert report["largest_plain"][1] <= dry.LIMIT
    shipped = [p.relative_to(ROOT).as_posix() for p in (ROOT / "checkpoints").rglob("*.safetensors")]
    assert shipped and dry.lfs_paths(tmp_path / "space", shipped) == set(shipped)


class _Request:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers


@pytest.mark.parametrize("address, headers, expected", [
    # behind a Space's proxy the app may see itself at a loopback address: the forwarded host is the public one
    ("http://0.0.0.0:7860/", {"x-forwarded-host": "owner-atlas.hf.space", "x-forwarded-proto": "https",
                              "host": "10.0.0.5:7860"}, "https://owner-atlas.hf.space/"),
    ("", {"X-Forwarded-Host": "owner-atlas.hf.space, inner", "X-Forwarded-Proto": "https"},
     "https://owner-atlas.hf.space/"),
    ("http://127.0.0.1:7860/sub/", {"x-forwarded-host": "example.org"}, "https://example.org/sub/"),
    # the browser's own public address wins; no proxy: the Host header
    ("https://owner-atlas.hf.space/", {"x-forwarded-host": "evil.example"}, "https://owner-atlas.hf.space/"),
    ("", {"host": "192.168.1.4:7860"}, "http://192.168.1.4:7860/"),
    ("http://localhost:7860/", {"x-forwarded-host": "bad host<script>"}, "http://localhost:7860/"),
])
def test_the_join_link_is_the_public_address(address, headers, expected, tmp_path, monkeypatch) -> None:
    from serving import classroom as cr
    from tabs import classroom as tc
    from tabs import lessons

    assert tc.public_address(address, _Request(headers)) == expected
    monkeypatch.setattr(cr, "_store", cr.open_store(f"sqlite:///{tmp_path / 'atlas.sqlite3'}"))
    out = tc.open_class(lessons.LESSONS[0].title, 1, "", address, _Request(headers))
    code, screen = out[2], out[9]
    assert f"{expected}?tab=lessons&amp;class={code}" in screen or f"{expected}?tab=lessons&class={code}" in screen
    assert "<svg" in screen  # the QR code of that link
