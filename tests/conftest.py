"""Shared fixtures: a launched app server on a free loopback port (for browser and API tests)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Validate every plotly figure the tests build, in this process and in the app servers they launch
# (the app itself skips validation for speed: viz.common.Fig.build).
os.environ["ATLAS_VALIDATE_FIGURES"] = "1"
# Nothing downloads in the tests (CI also sets HF_HUB_OFFLINE=1): the Hub and torchvision paths report "offline";
# tests/test_hub.py turns this off for itself where it fakes the Hub.
os.environ.setdefault("ATLAS_OFFLINE", "1")
# The class store (serving/classroom.py) of the tests and of the servers they launch lives in a temporary folder,
# never in the checkout's data/.
os.environ.setdefault("ATLAS_DATA", tempfile.mkdtemp(prefix="atlas-test-data-"))
# The head atlases the tests and their servers compute are cached in a temporary folder, never in the checkout's runs/.
os.environ.setdefault("ATLAS_CACHE", tempfile.mkdtemp(prefix="atlas-test-heads-"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(url: str, proc: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"app exited with code {proc.returncode} before serving")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (loopback only)
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.25)
    raise TimeoutError(f"app did not answer at {url} within {timeout:.0f} s")


def app_env(port: int, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "GRADIO_SERVER_NAME": "127.0.0.1",
        "GRADIO_SERVER_PORT": str(port),
        "GRADIO_ANALYTICS_ENABLED": "False",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra)
    return env


@contextlib.contextmanager
def serving(env: dict[str, str], log_path: Path, *args: str) -> Iterator[str]:
    """`python app.py ARGS` as a user would start it, with ``env``; yields its URL once it serves a page."""
    port = int(env["GRADIO_SERVER_PORT"])
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "app.py", *args], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}/"
        try:
            wait_until_serving(url, proc)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every shipped model, tiny and randomly initialised, in the real checkpoint format."""
    from tests.tiny import make_checkpoints

    return make_checkpoints(tmp_path_factory.mktemp("checkpoints"))


@pytest.fixture(scope="session")
def app_url(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoints: Path) -> Iterator[str]:
    """Start `python app.py` as a user would, on a free loopback port, over the tiny checkpoints."""
    env = app_env(free_port(), ATLAS_CHECKPOINTS=str(tiny_checkpoints),
                  TORCH_HOME=str(tmp_path_factory.mktemp("torch")))
    with serving(env, tmp_path_factory.mktemp("app") / "server.log") as url:
        yield url


HUB_GPT2 = "atlas-test/hub-gpt2"


@pytest.fixture(scope="session")
def configured_app(tmp_path_factory, tiny_checkpoints):
    """`python app.py --model DIR` and ATLAS_MODELS: Hugging Face GPT-2 folders, a BERT, an ALBERT and a ViT
    classifier, a Marian and a T5 translator, and a Hub entry whose files are in the server's (offline)
    huggingface_hub cache."""
    from tests.tiny import place_in_hub_cache, tiny_bert_classifier_folder, tiny_gpt2_folder, tiny_vit_classifier_folder

    base = tmp_path_factory.mktemp("configured")
    refs = {name: tiny_gpt2_folder(base / name) for name in ("cli-gpt2", "env-gpt2")}
    refs["my-bert"] = tiny_bert_classifier_folder(base / "my-bert")
    refs["my-vit"] = tiny_vit_classifier_folder(base / "my-vit")
    refs[HUB_GPT2] = tiny_gpt2_folder(base / "hub-source")
    from tests.families import classifier_folder, marian_folder, t5_folder

    refs["my-marian"] = marian_folder(base / "my-marian")  # (model, tokenizer): the Translate tab's Marian
    refs["my-t5"] = t5_folder(base / "my-t5")  # (model, tokenizer): the Translate tab's T5
    refs["my-albert"] = classifier_folder("albert", base / "my-albert")  # (model, tokenizer): a Classify family
    place_in_hub_cache(base / "hub-source", base / "hf" / "hub", HUB_GPT2)
    env = app_env(free_port(), ATLAS_CHECKPOINTS=str(tiny_checkpoints), HF_HOME=str(base / "hf"), ATLAS_OFFLINE="1",
                  ATLAS_MODELS=f"{base / 'env-gpt2'},{base / 'my-bert'},{base / 'my-vit'},generate:{HUB_GPT2},"
                                                 f"{base / 'my-marian'},{base / 'my-albert'},{base / 'my-t5'}")
    with serving(env, base / "server.log", "--model", str(base / "cli-gpt2")) as url:
        yield url, base, refs


@pytest.fixture(scope="session")
def hf_folders(tmp_path_factory: pytest.TempPathFactory):
    """The random-weight Hugging Face folder of each case of tests/parity_folders.py, written by transformers on first
    use and kept for the session: tests/test_parity.py and the families' own tests read the same folders."""
    from tests.parity_folders import Folders

    return Folders(tmp_path_factory.mktemp("hf-folders"))


@pytest.fixture(autouse=True)
def no_class_left_open():
    """A class that a test opened and left open holds its step's answer from every page of the process
    (tabs/course/course.py, `guarded`): every test ends with each class of the process's store closed."""
    yield
    import sys

    cr = sys.modules.get("serving.classroom")
    if cr is not None and cr._store is not None:
        with cr._store.engine.begin() as conn:
            conn.execute(cr.classes.update().values(closed=True))
