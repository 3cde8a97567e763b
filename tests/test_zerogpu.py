"""tabs/zerogpu.py: without the ``spaces`` package the heavy handlers are the plain functions; with it (a stand-in
module here: the real one needs a Space) each is wrapped by spaces.GPU with ATLAS_GPU_SECONDS. On a ZeroGPU Space
(SPACES_ZERO_GPU) the models load at start-up, requests are not batched, and a generation's attention kept on the GPU
comes back on the CPU. None of this has run on a real ZeroGPU Space."""

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
    want = {"generate.py": {"generate", "experts_view", "logit_lens", "ablate_head_fn", "head_roles"},
            "classify.py": {"classify", "recolour"}, "translate.py": {"translate", "show_sentence"},
            "sections/patching.py": {"patch"}, "sections/why.py": {"attention_why"},
            "vision.py": {"classify_image", "reexplain"}}
    for name, fns in want.items():
        tree = ast.parse((root / "tabs" / name).read_text(encoding="utf-8"))
        decorated = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)
                     and any(getattr(d, "id", None) == "on_gpu" for d in n.decorator_list)}
        assert fns <= decorated, name


def test_zero_gpu_serves_each_request_alone_unless_told() -> None:
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    run = [sys.executable, "-c", "from serving import batcher; print(batcher.BATCHING)"]
    env = {k: v for k, v in os.environ.items() if k not in ("ATLAS_BATCH", "SPACES_ZERO_GPU")}
    for extra, want in (({}, "True"), ({"SPACES_ZERO_GPU": "true"}, "False"),
                        ({"SPACES_ZERO_GPU": "true", "ATLAS_BATCH": "1"}, "True")):
        out = subprocess.run(run, cwd=root, env={**env, **extra}, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == want, extra


def test_preload_loads_every_model_and_reports_the_missing(monkeypatch, capsys, tiny_checkpoints) -> None:
    import app
    from serving import catalogue, store
    from tabs import zerogpu

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    app.preload_for_zero_gpu()  # not on ZeroGPU: nothing loads
    assert store.MODELS._models == {}
    monkeypatch.setattr(zerogpu, "ZERO_GPU", True)
    app.preload_for_zero_gpu()
    shipped = [n for names in catalogue.SHIPPED.values() for n in names]
    present = [n for n in shipped if (tiny_checkpoints / n / "config.json").is_file()]
    assert present and sorted(store.MODELS._models) == sorted(present)
    said = capsys.readouterr().out
    assert f"ZeroGPU: {len(present)} models loaded at start-up" in said
    for missing in set(shipped) - set(present):
        assert f"{missing} not: " in said


def test_host_brings_a_device_map_back_on_zero_gpu_only(monkeypatch) -> None:
    from tabs import zerogpu

    class Map:  # a DeviceMap's surface: its kept attention and ``to``
        attention = "q, k, lse"

        def __init__(self) -> None:
            self.moved: list[str] = []

        def to(self, device: str) -> str:
            self.moved.append(device)
            return f"on {device}"

    result = types.SimpleNamespace(attention={"decoder": Map()})
    kept = {"result": result}
    assert zerogpu.host(kept) is kept and not result.attention["decoder"].moved  # elsewhere: unchanged
    monkeypatch.setattr(zerogpu, "ZERO_GPU", True)
    assert zerogpu.host(kept)["result"].attention["decoder"] == "on cpu"
    assert zerogpu.host({}) == {} and zerogpu.host(None) is None
    dense = {"result": types.SimpleNamespace(attention={"decoder": types.SimpleNamespace(weights=1)})}
    assert zerogpu.host(dense)["result"].attention["decoder"].weights == 1  # a whole array stays as it is
