"""The layout of docs/ARCHITECTURE.md holds in the code: who may import whom, one module per tab, and
app.py only assembles the tabs."""

from __future__ import annotations

import ast
import re
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


# Imports only go down: app -> tabs -> serving -> models; viz stands alone (docs/ARCHITECTURE.md §1)
FORBIDDEN = {
    "viz": {"models", "serving", "tabs", "gradio", "train", "app", "torch"},
    "models": {"serving", "tabs", "viz", "train", "app", "gradio", "plotly"},
    "serving": {"tabs", "viz", "train", "app", "gradio", "plotly"},
    "tabs": {"train"},
}
PACKAGES = ("app", "tabs", "serving", "models", "viz", "train", "examples")  # what the app and training are made of


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


def module_name(path: Path, root: Path) -> str:
    """``models/families/gpt.py`` -> ``models.families.gpt``; a package's ``__init__.py`` -> the package."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the project modules it imports, every import counted (a function's own, too: a lazy import is how
    a circle hides). ``from a.b import c`` reaches ``a.b.c`` when that is a module, else ``a.b``."""
    files = [p for name in packages for p in ([root / f"{name}.py"] if (root / f"{name}.py").is_file()
                                               else sorted((root / name).rglob("*.py")))]
    modules = {module_name(p, root): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                            for a in node.names}
        # importing a.b.c runs the package a.b's __init__ first: an edge to each package on the way that is not one
        # of the importer's own (a module of tabs/ importing tabs.course.course runs tabs/course/__init__.py)
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        targets |= {".".join(t.split(".")[:i]) for t in list(targets) for i in range(1, t.count(".") + 1)} - own
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of a graph: its strongly connected components of more than one module (Tarjan 1972)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle() -> None:
    graph = import_graph(ROOT)
    assert {"app", "tabs.common", "serving.store", "models.registry", "models.families.gpt"} <= set(graph)
    assert "models.registry" in graph["models.io.hf"]  # the graph sees `from models import registry`
    assert circles(graph) == []


def test_the_circle_checker_sees_a_planted_circle(tmp_path: Path) -> None:
    """Three modules importing one another in a ring, one of them lazily inside a function, and a fourth
    outside it: one circle of exactly the three."""
    pkg = tmp_path / "models"
    (pkg / "families").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "families" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from models.families import b\n")
    (pkg / "families" / "b.py").write_text("import models.c\n")
    (pkg / "c.py").write_text("def f():\n    from models.a import thing\n")
    (pkg / "d.py").write_text("from models import a\n")
    graph = import_graph(tmp_path, ("models",))
    assert circles(graph) == [["models.a", "models.c", "models.families.b"]]
    # a package whose __init__ imports a module that imports one of the package's modules back: a circle too (the
    # Lessons tab in tabs/lessons/__init__.py and tabs.classroom, which read tabs.lessons.course, were one)
    tabs = tmp_path / "tabs"
    (tabs / "lessons").mkdir(parents=True)
    (tabs / "__init__.py").write_text("")
    (tabs / "lessons" / "__init__.py").write_text("from tabs import classroom\n")
    (tabs / "lessons" / "course.py").write_text("")
    (tabs / "classroom.py").write_text("def f():\n    from tabs.lessons import course\n")
    assert circles(import_graph(tmp_path, ("tabs",))) == [["tabs.classroom", "tabs.lessons"]]
    (pkg / "c.py").write_text("def f():\n    pass\n")
    assert circles(import_graph(tmp_path, ("models",))) == []


def defines_title(path: Path) -> bool:
    """Whether a module assigns TITLE at its top level: what makes a module of tabs/ a tab (the shared modules,
    such as common.py and permalink.py, and the sections under tabs/sections/, have none)."""
    return any(isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "TITLE" for t in node.targets)
               for node in ast.parse(path.read_text(encoding="utf-8")).body)


def test_every_tab_is_one_module_listed_in_app() -> None:
    import app
    import tabs

    # a tab is a module of tabs/ with a top-level TITLE: a file (tabs/translate.py, tabs/lessons.py) or a package
    # whose __init__.py is the tab; the modules of a package (tabs/course/: the lessons) are never tabs
    modules = {p.stem for p in (ROOT / "tabs").glob("*.py") if defines_title(p)} | {
        p.parent.name for p in (ROOT / "tabs").glob("*/__init__.py") if defines_title(p)}
    assert "lessons" in modules and not any(defines_title(p) for p in (ROOT / "tabs").glob("*/[!_]*.py"))
    assert {t.__name__.removeprefix("tabs.") for t in app.TABS} == modules
    for tab in app.TABS:
        assert tab.__name__.startswith(tabs.__name__ + ".")
        assert isinstance(tab.TITLE, str) and tab.TITLE and isinstance(tab.INTRO, str) and callable(tab.build)
    titles = [t.TITLE for t in app.TABS]
    assert len(set(titles)) == len(titles)


def public_api(blocks) -> list[str]:
    """The api_names a Blocks serves, in order (events with ``api_name=False`` are private)."""
    return [d["api_name"] for d in blocks.get_config_file()["dependencies"] if d.get("api_visibility") == "public"]


@pytest.fixture(scope="module")
def built() -> tuple[dict, dict, list[str], object]:
    """Each tab of app.TABS built on its own (its API names and its Permalink), the API of the shared sections
    (tabs/sections/), and the whole app."""
    import gradio as gr

    import app
    from tabs import sections

    apis, links = {}, {}
    for tab in app.TABS:
        with gr.Blocks() as alone:
            links[tab] = tab.build()
        apis[tab] = public_api(alone)
    with gr.Blocks() as shared:
        sections.register_api()
    return apis, links, public_api(shared), app.build_demo()


def test_app_builds_every_tab_in_order(built) -> None:
    import app

    apis, links, shared, demo = built
    config = demo.get_config_file()
    labels = [c["props"].get("label") for c in config["components"] if c.get("type") == "tabitem"]
    assert labels == [t.TITLE for t in app.TABS]
    # the app serves exactly the API its tabs declare, each tab's main action named, and no name twice (Gradio would
    # serve a second "classify" as "classify_1")
    assert all(apis[tab] for tab in app.TABS), [tab.__name__ for tab in app.TABS if not apis[tab]]
    declared = [name for tab in app.TABS for name in apis[tab]] + shared
    assert len(set(declared)) == len(declared)
    assert public_api(demo) == declared
    # one page-load event restores a permalink (tabs/permalink.py); the tabs that need no trained model (their
    # Permalink's at_load) are drawn right after it, with the link's values
    on_load = [d for d in config["dependencies"] if any(t[1] == "load" for t in d["targets"])]
    assert len(on_load) == 1
    at_load = [tab for tab, link in links.items() if link is not None and link.at_load]
    assert sum(1 for d in config["dependencies"] if d["trigger_after"] == on_load[0]["id"]) == len(at_load)



def test_the_app_starts_without_torch() -> None:
    """app, tabs and the serving side read the registry at start-up (the tabs of configured folders, the catalogue)
    without importing torch: the page is served before the model stack loads (docs/ARCHITECTURE.md §2)."""
    import subprocess
    import sys

    code = "import sys, app; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


# ------------------------------------------------------------------------------------ issue 59: the house's rules
# models/'s sub-packages in the order they may import (docs/ARCHITECTURE.md §1): a sub-package imports only those of a
# lower level; the top-level modules (limits, outputs, registry, paths, analysis, calibration) are below them all,
# the package itself (models.load) and models.interfaces above them all.
MODEL_LEVELS = {"blocks": 0, "inputs": 0, "families": 1, "io": 2, "decoding": 3, "inspect": 3}


def model_edges(graph: dict[str, set[str]]) -> set[tuple[str, str, str, str]]:
    """(importing sub-package, imported sub-package, module, module) for every import between two of models/'s
    sub-packages."""
    def sub(m: str) -> str | None:
        parts = m.split(".")
        return parts[1] if parts[0] == "models" and len(parts) > 2 else None

    return {(sub(a), sub(b), a, b) for a, targets in graph.items() for b in targets
            if sub(a) and sub(b) and sub(a) != sub(b)}


def test_models_sub_packages_depend_one_way() -> None:
    edges = model_edges(import_graph(ROOT))
    assert {a for a, *_ in edges} | {b for _, b, *_ in edges} <= set(MODEL_LEVELS)
    wrong = sorted(f"{m} -> {n}" for a, b, m, n in edges if MODEL_LEVELS[a] <= MODEL_LEVELS[b])
    assert wrong == []
    assert not {(a, b) for a, b, *_ in edges} & {(b, a) for a, b, *_ in edges}  # no two-way pair


def test_the_level_checker_sees_an_upward_import() -> None:
    graph = {"models.families.gpt": {"models.inspect.walk"}, "models.inspect.walk": {"models.families.gpt"}}
    edges = model_edges(graph)
    assert {(a, b) for a, b, *_ in edges} == {("families", "inspect"), ("inspect", "families")}
    assert [f"{m} -> {n}" for a, b, m, n in edges if MODEL_LEVELS[a] <= MODEL_LEVELS[b]] == [
        "models.families.gpt -> models.inspect.walk"]


def family_name_checks(path: Path, names: set[str]) -> list[str]:
    """Where a file tests a model family by its name: ``is_family(...)`` calls, and comparisons with a registered
    family name or model_type (``x == "mamba"``, ``x in ("gpt", "t5")``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "is_family":
            found.append(f"{path.name}:{node.lineno} is_family")
        elif isinstance(node, ast.Compare):
            consts = {c.value for part in [node.left, *node.comparators] for c in ast.walk(part)
                      if isinstance(c, ast.Constant) and isinstance(c.value, str)}
            if consts & names:
                found.append(f"{path.name}:{node.lineno} compares with {sorted(consts & names)}")
    return found


def test_no_family_is_tested_by_name_outside_the_registry(tmp_path: Path) -> None:
    """What a family can do is on its registration (models/registry.py); app.py, tabs/ and serving/ read that."""
    from models import registry

    names = set(registry.FAMILIES) | set(registry.hf_types())
    files = [ROOT / "app.py", *sorted((ROOT / "tabs").rglob("*.py")), *sorted((ROOT / "serving").rglob("*.py"))]
    assert [hit for f in files for hit in family_name_checks(f, names)] == []
    planted = tmp_path / "planted.py"
    planted.write_text("if registry.is_family(net, 'mamba'):\n    pass\nok = kind in ('t5', 'x')\n"
                       "fine = tab == 'classify'\n")
    assert len(family_name_checks(planted, names)) == 2


def test_app_py_only_assembles() -> None:
    assert len((ROOT / "app.py").read_text(encoding="utf-8").splitlines()) <= 150


# Module paths the docs and docstrings cite: files (models/families/gpt.py, bench/_server.py), dotted modules and
# their attributes (models.inspect.walk.plan). docs/experiments.md is left out: a dated record of past runs, it cites
# the code as it was then.
CITED_FILE = re.compile(r"(?<![\w./-])((?:models|tabs|serving|viz|train|bench|tests|docs|examples)/[\w./-]*\w)")
CITED_MODULE = re.compile(r"(?<![\w./-])((?:models|tabs|serving|viz|train)(?:\.[A-Za-z_]\w*)+)")
DATA_SUFFIXES = {"en", "de", "tsv", "json", "txt", "jsonl", "csv", "npz", "png"}


def _module_file(parts: list[str]) -> Path | None:
    p = ROOT.joinpath(*parts)
    return p.with_suffix(".py") if p.with_suffix(".py").is_file() else p / "__init__.py" if (
        p / "__init__.py").is_file() else None


def _defines(path: Path, name: str) -> bool:
    return re.search(rf"(^|\W){re.escape(name)}\b", path.read_text(encoding="utf-8")) is not None


def unresolved(text: str) -> set[str]:
    """The module paths cited in ``text`` that name no file, module or attribute of this repository."""
    bad = set()
    for m in CITED_FILE.finditer(text):
        cited = m.group(1).rstrip(".")
        if cited.endswith("/test_") or cited.endswith("_"):  # a prefix ("tests/test_families_*")
            continue
        path, _, attr = cited.partition(".py.") if ".py." in cited else (cited, "", "")
        if (ROOT / path).exists() or (ROOT / (path + ".py")).exists() if not attr else (
                (ROOT / (path + ".py")).is_file() and _defines(ROOT / (path + ".py"), attr.split(".")[0])):
            continue
        head, _, attr = cited.rpartition(".")  # bench/_server.PageClient: a file's attribute
        if "/" in head and (ROOT / (head + ".py")).is_file() and _defines(ROOT / (head + ".py"), attr):
            continue
        bad.add(cited)
    for m in CITED_MODULE.finditer(text):
        parts = m.group(1).split(".")
        if parts[-1] in DATA_SUFFIXES:  # a data file's name (train.tsv, train.en)
            continue
        k = next((k for k in range(len(parts), 0, -1) if _module_file(parts[:k])), 0)
        if not k or (parts[k:] and not _defines(_module_file(parts[:k]), parts[k])):
            bad.add(m.group(1))
    return bad


def test_cited_module_paths_resolve() -> None:
    texts = {p: p.read_text(encoding="utf-8") for p in [ROOT / "README.md", ROOT / "docs" / "ARCHITECTURE.md"]}
    for pkg in ("app.py", "models", "tabs", "serving", "viz", "train", "bench"):
        for p in ([ROOT / pkg] if pkg.endswith(".py") else sorted((ROOT / pkg).rglob("*.py"))):
            source = p.read_text(encoding="utf-8")
            tree = ast.parse(source)
            docs = [ast.get_docstring(n) or "" for n in ast.walk(tree)
                    if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
            texts[p] = "\n".join(docs + re.findall(r"#[^\n]*", source))
    wrong = {str(p.relative_to(ROOT)): sorted(bad) for p, text in texts.items() if (bad := unresolved(text))}
    assert wrong == {}


def test_the_path_checker_sees_stale_paths() -> None:
    assert unresolved("see models/gpt.py, models.decompose.plan and models.inspect.walk.nothing_here") == {
        "models/gpt.py", "models.decompose.plan", "models.inspect.walk.nothing_here"}
    assert unresolved("models/families/gpt.py, models.inspect.walk.plan, bench/_server.PageClient, train.tsv") == set()
