"""tabs/zerogpu.py: without the ``spaces`` package the heavy handlers are the plain functions; with it (a stand-in
module here: the real one needs a Space) each is wrapped by spaces.GPU with ATLAS_GPU_SECONDS."""

from __future__ import annotations

import sys
import types

import pytest

from tabs.zerogpu import on_gpu


def test_no_spaces_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "spaces", None)  # import spaces -> ImportError

    def handler(x: int) -> int:
        return x + 1

    assert on_gpu(handler) is handler


def test_spaces_gpu_wraps_with_the_configured_duration(monkeypatch: pytest.MonkeyPatch) -> None:
    booked = []

    def gpu(duration: int):
        booked.append(duration)
        return lambda fn: lambda *a, **k: ("on gpu", fn(*a, **k))

    monkeypatch.setitem(sys.modules, "spaces", types.SimpleNamespace(GPU=gpu))
    monkeypatch.setenv("ATLAS_GPU_SECONDS", "120")
    wrapped = on_gpu(lambda x: x * 2)
    assert wrapped(3) == ("on gpu", 6) and booked == [120]


def test_heavy_handlers_are_decorated() -> None:
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    want = {"generate.py": {"logit_lens", "ablate_head_fn", "head_roles"}, "sections/patching.py": {"patch"},
            "sections/why.py": {"attention_why"}, "vision.py": {"classify_image", "reexplain"}}
    for name, fns in want.items():
        tree = ast.parse((root / "tabs" / name).read_text(encoding="utf-8"))
        decorated = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)
                     and any(getattr(d, "id", None) == "on_gpu" for d in n.decorator_list)}
        assert fns <= decorated, name
