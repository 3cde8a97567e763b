"""The layout of docs/ARCHITECTURE.md holds in the code: who may import whom, one module per tab, and
app.py only assembles the tabs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported_packages(path: Path) -> set[str]:
    """The top-level names a Python file imports (absolute imports; the project has no relative ones)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            names.add((node.module or "").split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            names.add(str(node.args[0].value).split(".")[0])  # models.load's registry: importlib by name
    return names


FORBIDDEN = {
    "viz": {"models", "tabs", "gradio", "train", "app", "torch"},
    "models": {"tabs", "viz", "train", "app", "gradio", "plotly"},
    "tabs": {"train"},
}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_import_graph(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    wrong = {f"{f.relative_to(ROOT)} imports {name}"
             for f in files for name in imported_packages(f) & FORBIDDEN[package]}
    assert wrong == set()


def test_the_checker_sees_every_kind_of_import(tmp_path: Path) -> None:
    f = tmp_path / "x.py"
    f.write_text("import viz.common\nfrom tabs import common\ndef f():\n    import gradio as gr\n"
                 "    importlib.import_module('train.loop')\n")
    assert imported_packages(f) == {"viz", "tabs", "gradio", "train"}


def test_every_tab_is_one_module_listed_in_app() -> None:
    import app
    import tabs

    # common.py (what every tab shares), why.py (the sections the text tabs share) and permalink.py (each tab's view in
    # the URL) are not tabs
    modules = {p.stem for p in (ROOT / "tabs").glob("*.py")} - {"__init__", "common", "why", "permalink"}
    assert {t.__name__.removeprefix("tabs.") for t in app.TABS} == modules
    for tab in app.TABS:
        assert tab.__name__.startswith(tabs.__name__ + ".")
        assert isinstance(tab.TITLE, str) and isinstance(tab.INTRO, str) and callable(tab.build)
    assert [t.TITLE for t in app.TABS] == ["Translate", "Classify", "Generate", "Vision", "Swin windows",
                                           "Positional encoding", "Attention playground", "Lessons"]


def test_app_builds_every_tab_in_order() -> None:
    import app

    demo = app.build_demo()
    config = demo.get_config_file()
    labels = [c["props"].get("label") for c in config["components"] if c.get("type") == "tabitem"]
    assert labels == [t.TITLE for t in app.TABS]
    api = {d.get("api_name") for d in config["dependencies"]} - {None, False}
    assert {"translate", "classify", "generate", "head_roles", "classify_image", "swin_windows",
            "positional_encoding", "playground", "attention_why", "patch", "lesson", "lesson_answer"} <= api
    # one page-load event restores a permalink (tabs/permalink.py); the three tabs that need no trained model are
    # drawn right after it, with the link's values
    on_load = [d for d in config["dependencies"] if any(t[1] == "load" for t in d["targets"])]
    assert len(on_load) == 1
    assert sum(1 for d in config["dependencies"] if d["trigger_after"] == on_load[0]["id"]) == 3
