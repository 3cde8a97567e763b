"""checkpoints/rebuild.json, which the app's "not available" notices show: each shipped checkpoint has the
command that trained it, with every flag its metrics.json records, and local paths in place of the paths of
the machine it ran on."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENTRIES = json.loads((ROOT / "checkpoints" / "rebuild.json").read_text(encoding="utf-8"))["models"]
SHIPPED = sorted(p.name for p in (ROOT / "checkpoints").iterdir() if (p / "manifest.json").is_file())
PATH_FLAGS = {"--data-dir", "--out", "--run-dir", "--tokenizer", "--teacher", "--base", "--init"}


def flags(command: str) -> tuple[str, dict[str, list[str]]]:
    """("train.<module>", {flag: values}) of a `python -m train.<module> ...` command."""
    words = shlex.split(command)
    assert words[:2] == ["python", "-m"] and words[2].startswith("train."), command
    out: dict[str, list[str]] = {}
    flag = None
    for word in words[3:]:
        if word.startswith("--"):
            flag = word
            assert flag not in out, f"{flag} given twice in {command}"
            out[flag] = []
        else:
            assert flag is not None, f"{word!r} before any flag in {command}"
            out[flag].append(word)
    return words[2], out


def test_every_shipped_checkpoint_has_an_entry() -> None:
    assert SHIPPED and sorted(ENTRIES) == SHIPPED


def same_command(name: str, recorded: str, command: str, extra: frozenset[str] = frozenset()) -> None:
    """``command`` is ``recorded`` with local paths (and perhaps the ``extra`` flags)."""
    module, want = flags(recorded)
    got_module, got = flags(command)
    assert got_module == module and (ROOT / (module.replace(".", "/") + ".py")).is_file()
    for flag, values in want.items():  # every recorded flag, with its value unless it is a path
        assert flag in got, f"{name}: {flag} {' '.join(values)} is missing"
        if flag not in PATH_FLAGS:
            assert got[flag] == values, f"{name}: {flag} {got[flag]} but trained with {values}"
    assert set(got) - set(want) <= {"--data-dir"} | extra, f"{name}: flags it was not trained with"
    assert got["--data-dir"] == ["../shared/data"]
    assert got["--out"] == [f"checkpoints/{name}"] and got["--run-dir"] == [f"runs/{name}"]


@pytest.mark.parametrize("name", SHIPPED)
def test_a_run_resumed_under_other_flags_lists_its_earlier_commands_first(name: str) -> None:
    record = json.loads((ROOT / "checkpoints" / name / "metrics.json").read_text())["training"]
    if "commands" not in record:
        assert "--resume" not in flags(ENTRIES[name]["command"])[1]
        return
    needs = [n[n.index("python -m train."):] for n in ENTRIES[name]["needs"] if "python -m train." in n]
    earlier = record["commands"][:-1]
    assert record["commands"][-1]["command"] == record["command"] and len(needs) >= len(earlier)
    for then, need in zip(earlier, needs):  # in order, each in the same run folder (a stop flag allowed)
        same_command(name, then["command"], need, frozenset({"--stop-after"}))


@pytest.mark.parametrize("name", SHIPPED)
def test_entry_is_the_recorded_command_with_local_paths(name: str) -> None:
    record = json.loads((ROOT / "checkpoints" / name / "metrics.json").read_text())["training"]
    recorded = record["command"]
    if "commands" not in record:  # a run resumed under the same flags; its rebuild starts from scratch
        recorded = shlex.join(w for w in shlex.split(recorded) if w != "--resume")
    entry = ENTRIES[name]
    same_command(name, recorded, entry["command"])
    got = flags(entry["command"])[1]
    for flag in PATH_FLAGS & set(got):
        for path in got[flag]:
            assert path.startswith(("../shared/data", "checkpoints/", "runs/")), f"{name}: {flag} {path}"
    # a prerequisite that the command reads from runs/ (a tokenizer, a teacher) is said, with how to make it
    for flag in ("--tokenizer", "--teacher"):
        for path in got.get(flag, []):
            if path.startswith("runs/"):
                top = "/".join(path.split("/")[:2])
                assert any(top in need for need in entry["needs"]), f"{name}: nothing says how to get {path}"
    if got.get("--device") == ["cuda"]:
        assert any("GPU" in need for need in entry["needs"]), f"{name}: trained on a GPU, and the entry must say so"


@pytest.mark.parametrize("name", SHIPPED)
def test_a_command_that_adds_to_the_checkpoint_is_listed_after_training(name: str) -> None:
    """The calibration of the Fashion-MNIST models (calibration.safetensors) is rebuilt by the command its
    metrics.json records, listed under "after"."""
    folder = ROOT / "checkpoints" / name
    calibration = json.loads((folder / "metrics.json").read_text()).get("calibration")
    assert (folder / "calibration.safetensors").is_file() == (calibration is not None)
    assert ENTRIES[name].get("after") == (calibration["command"] if calibration else None)
