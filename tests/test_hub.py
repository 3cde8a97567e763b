"""Hub models (models/io/hub.py) without a network: entries, the offline message and its speed, the cache, a faked
download with its progress, and the size limit read from safetensors headers."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from models.io import hub
from serving import catalogue, store
from tabs import common

pytest.importorskip("transformers")
REPO = "atlas-test/tiny-gpt2"


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    from tests.tiny import tiny_gpt2_folder

    folder = tmp_path_factory.mktemp("hub") / "tiny-gpt2"
    return folder, tiny_gpt2_folder(folder)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty huggingface_hub cache under HF_HOME, downloads off (as in CI)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("ATLAS_OFFLINE", "1")
    return tmp_path / "hf" / "hub"


def downloads_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both switches off for this test (CI exports HF_HUB_OFFLINE=1); the network itself stays faked."""
    monkeypatch.setenv("ATLAS_OFFLINE", "0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")


def test_entries() -> None:
    assert hub.parse_entry("generate:openai-community/gpt2") == ("generate", "openai-community/gpt2", None)
    assert hub.parse_entry("vision:google/vit-base-patch16-224@v1.0") == ("vision", "google/vit-base-patch16-224",
                                                                         "v1.0")
    for folder in ("/models/my-bert", "my-bert", "./a:b/c", "C:\\models\\bert", "checkpoints/sst2"):
        assert hub.parse_entry(folder) is None
    for bad, why in (("chat:a/b", "unknown kind"), ("generate:../etc", "not a Hub model id"),
                     ("classify:a/b@../../x", "not a revision"), ("vision:a/b/c", "not a Hub model id")):
        with pytest.raises(ValueError, match=why):
            hub.parse_entry(bad)


def test_max_params_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATLAS_MAX_PARAMS", raising=False)
    assert hub.max_params() == 500_000_000
    for raw, want in (("135M", 135_000_000), ("1.5B", 1_500_000_000), ("20000", 20_000), ("64k", 64_000)):
        monkeypatch.setenv("ATLAS_MAX_PARAMS", raw)
        assert hub.max_params() == want
    monkeypatch.setenv("ATLAS_MAX_PARAMS", "lots")
    with pytest.raises(ValueError, match="not a number"):
        hub.max_params()


def test_parameter_count_from_headers_equals_the_tensors(gpt2_folder) -> None:
    from safetensors.torch import load_file

    folder, hf = gpt2_folder
    tensors = load_file(folder / "model.safetensors")
    assert hub.folder_params(folder) == sum(t.numel() for t in tensors.values()) > 1000
    (folder.parent / "junk").mkdir(exist_ok=True)
    (folder.parent / "junk" / "model.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match="not a safetensors file"):
        hub.folder_params(folder.parent / "junk")


def test_offline_message_within_five_seconds(cache: Path) -> None:
    start = time.monotonic()
    with pytest.raises(hub.HubUnavailable, match="offline") as err:
        hub.fetch("openai-community/gpt2")
    assert time.monotonic() - start < 5
    assert "hf download openai-community/gpt2" in str(err.value) and str(cache) in str(err.value)


def test_unreachable_hub_reports_offline_within_five_seconds(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Downloads on, but the Hub accepts the connection and never answers (a stalled proxy): no hang."""
    import huggingface_hub.constants

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    downloads_on(monkeypatch)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
    start = time.monotonic()
    try:
        with pytest.raises(hub.HubUnavailable, match="offline: the Hub could not be reached"):
            hub.fetch("openai-community/gpt2", timeout=2.0)
    finally:
        silent.close()
    assert time.monotonic() - start < 5


def test_cached_snapshot_loads_offline(cache: Path, gpt2_folder) -> None:
    import models
    from tests.tiny import place_in_hub_cache

    folder, hf = gpt2_folder
    snapshot = place_in_hub_cache(folder, cache, REPO)
    assert hub.fetch(REPO) == snapshot
    ours = models.load(hub.fetch(REPO))
    ids = torch.tensor([[5, 9, 2, 7]])
    with torch.no_grad():
        np.testing.assert_allclose(ours(ids).logits.numpy(), hf(ids).logits.numpy(), atol=1e-4)
    with pytest.raises(hub.HubUnavailable, match="offline"):  # another revision is not in the cache
        hub.fetch(REPO, revision="v2")


class FakeMetadata:
    def __init__(self, n: int) -> None:
        self.parameter_count = {"F32": n}


def fake_hub(monkeypatch: pytest.MonkeyPatch, source: Path, n_params: int, calls: list[str]) -> None:
    """huggingface_hub's metadata and download calls replaced by fakes that serve ``source``'s files the way
    huggingface_hub stores them (blobs, snapshot, refs) and drive the tqdm class they are given."""
    import huggingface_hub

    real = huggingface_hub.snapshot_download

    def metadata(self, repo, revision=None, timeout=None):
        calls.append(f"metadata {repo}")
        return FakeMetadata(n_params)

    def snapshot_download(repo, *, revision=None, cache_dir=None, allow_patterns=None, etag_timeout=None,
                          tqdm_class=None, endpoint=None, local_files_only=False, **kwargs):
        import fnmatch

        from tests.tiny import place_in_hub_cache

        if local_files_only:  # the cache lookup stays huggingface_hub's own
            return real(repo, revision=revision, cache_dir=cache_dir, allow_patterns=allow_patterns,
                        local_files_only=True)
        calls.append(f"download {repo}")
        files = [p for p in sorted(source.iterdir()) if any(fnmatch.fnmatch(p.name, g) for g in allow_patterns)]
        bar = tqdm_class(total=len(files), desc="Fetching files") if tqdm_class else None
        for _ in files:
            time.sleep(0.01)
            if bar is not None:
                bar.update(1)
        staged = Path(cache_dir) / "staged" / repo
        staged.mkdir(parents=True)
        for p in files:
            (staged / p.name).write_bytes(p.read_bytes())
        return str(place_in_hub_cache(staged, Path(cache_dir), repo))

    monkeypatch.setattr(huggingface_hub.HfApi, "get_safetensors_metadata", metadata)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(hub, "reachable", lambda endpoint, timeout: None)  # the fake Hub is always there


def test_faked_download_reports_progress_and_lands_in_the_cache(cache: Path, gpt2_folder,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    folder, _ = gpt2_folder
    real_snapshot_download = huggingface_hub.snapshot_download
    calls: list[str] = []
    fake_hub(monkeypatch, folder, 1000, calls)
    (folder / "pytorch_model.bin").write_bytes(b"pickle")  # never fetched
    downloads_on(monkeypatch)
    heard: list[tuple[float, str]] = []
    path = hub.fetch(REPO, progress=lambda done, what: heard.append((done, what)))
    assert calls == [f"metadata {REPO}", f"download {REPO}"]
    assert heard[0][0] == 0.0 and heard[-1] == (1.0, f"downloaded {REPO}")
    fractions = [f for f, _ in heard]
    assert fractions == sorted(fractions) and len(set(fractions)) > 3  # it moved in steps, never back
    assert path.is_relative_to(cache) and (path / "model.safetensors").is_file()
    assert not (path / "pytorch_model.bin").exists()
    # offline again, the real huggingface_hub finds the download in its cache
    monkeypatch.setattr(huggingface_hub, "snapshot_download", real_snapshot_download)
    monkeypatch.setenv("ATLAS_OFFLINE", "1")
    assert hub.fetch(REPO) == path


def test_oversized_model_is_refused_before_downloading(cache: Path, gpt2_folder,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    folder, _ = gpt2_folder
    calls: list[str] = []
    fake_hub(monkeypatch, folder, 7_000_000_000, calls)
    downloads_on(monkeypatch)
    with pytest.raises(hub.TooLarge, match="7,000 M parameters, over this server's limit of 500 M"):
        hub.fetch("big/llm")
    assert calls == ["metadata big/llm"]  # nothing downloaded
    # a cached or local model is measured from its safetensors headers before it is loaded
    from tests.tiny import place_in_hub_cache

    place_in_hub_cache(folder, cache, REPO)
    monkeypatch.setenv("ATLAS_MAX_PARAMS", "1000")
    with pytest.raises(hub.TooLarge, match="ATLAS_MAX_PARAMS"):
        hub.fetch(REPO)


def test_repository_without_safetensors_is_refused(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub
    from huggingface_hub.errors import NotASafetensorsRepoError

    def metadata(self, repo, revision=None, timeout=None):
        raise NotASafetensorsRepoError("no safetensors")

    monkeypatch.setattr(huggingface_hub.HfApi, "get_safetensors_metadata", metadata)
    monkeypatch.setattr(hub, "reachable", lambda endpoint, timeout: None)
    downloads_on(monkeypatch)
    with pytest.raises(hub.HubUnavailable, match="only pickled .bin files"):
        hub.fetch("old/bin-only")


def test_store_serves_configured_hub_entries(cache: Path, gpt2_folder, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--model generate:OWNER/NAME` through the model store: from the cache offline; not cached, a clear error."""
    import gradio as gr

    from tests.tiny import place_in_hub_cache

    folder, _ = gpt2_folder
    place_in_hub_cache(folder, cache, REPO)
    monkeypatch.setattr(catalogue, "CONFIGURED", {})
    monkeypatch.setattr(catalogue, "CONFIG_PROBLEMS", [])
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    catalogue.configure([f"generate:{REPO}", "generate:atlas-test/not-cached@main", "chat:x/y",
                      "generate:openai-community/gpt2"])
    assert catalogue.configured("generate") == [REPO, "atlas-test/not-cached"]
    problems = [p for _, p in catalogue.CONFIG_PROBLEMS]
    assert "unknown kind 'chat'" in problems[0] and "is taken" in problems[1] and len(problems) == 2
    assert common.get_model(REPO).generate("the cat", max_new_tokens=3).tokens
    with pytest.raises(gr.Error, match="offline.*not in the cache"):
        common.get_model("atlas-test/not-cached")
