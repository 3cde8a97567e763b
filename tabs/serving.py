"""The serving side of the app: the model store (each model loaded once per process, packed for the CPU), the
models the server's configuration adds, the decoder checkpoints the Generate tab offers, and the "not available"
notices and rebuild hints, read from cheap file checks without torch (docs/ARCHITECTURE.md §2, §4).

Tabs take their models from here by name (`get_model`); nothing here draws or lays anything out.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import weakref
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Where the checkpoint folders are (configuration, never user input; tests point it at tiny models).
CHECKPOINTS = Path(os.environ.get("ATLAS_CHECKPOINTS", ROOT / "checkpoints"))
# How each shipped checkpoint was trained: read by the notices, checked by tests/test_rebuild.py.
REBUILD = ROOT / "checkpoints" / "rebuild.json"
GPT_TINY = "gpt-tiny"  # the decoder the project trains and ships: the Generate tab's default


# ----------------------------------------------------------------------------------------------- models
class ModelUnavailable(Exception):
    """A model's checkpoint or weights cannot be loaded; the message says how to fix it."""


class ModelStore:
    """Loads each model on first use, once per process; concurrent requests share it (inference only, so
    nothing a request does changes the shared model).

    Names are checkpoint folder names under ``CHECKPOINTS`` or the ImageNet models' torchvision names.
    The store is the app's serving layer: on the CPU it runs the large linear layers of each model on
    fp16-packed copies of their fp16-stored weights (``models.packed``: the same numbers up to summation
    order, 1.2-1.3× faster end to end); ``models.load`` itself returns the plain model.
    """

    def __init__(self) -> None:
        self._models: dict[str, Any] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._batchers: dict[tuple[str, str], Batcher] = {}
        self._guard = threading.Lock()

    def batcher(self, name: str, action: str, run: Callable[[list[Any]], Sequence[Any]]) -> Batcher:
        """The batcher of one model and action (made on first use with ``run``; one worker thread each)."""
        with self._guard:
            key = (name, action)
            if key not in self._batchers:
                self._batchers[key] = Batcher(run, name=f"{action}:{name}")
            return self._batchers[key]

    def get(self, name: str, progress: Any = None) -> Any:
        """The model behind ``name``; ``progress(fraction, text)`` hears about a download on first use."""
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            if name not in self._models:
                self._models[name] = self._load(name, progress)
            return self._models[name]

    @staticmethod
    def _load(name: str, progress: Any = None) -> Any:
        import torch

        import models
        from models.packed import pack_linears
        from models.placement import place, run_dtype

        if os.environ.get("ATLAS_TORCH_THREADS"):  # intra-op threads per request (default: torch's choice)
            torch.set_num_threads(max(1, int(os.environ["ATLAS_TORCH_THREADS"])))
        if name in IMAGENET_NAMES:
            from models.hub import offline
            from models.pretrained import load_imagenet

            try:  # downloads on first use where the network allows, failing within seconds where it does not
                model = load_imagenet(name, download=not offline())
            except Exception as err:  # any failure here means "not available"
                raise ModelUnavailable(
                    f"The ImageNet weights for {name} are not available: {err} Run the app once on a machine "
                    f"with a network, or copy torchvision's weight file into $TORCH_HOME/hub/checkpoints/."
                ) from None
        elif name in CONFIGURED or name in DOWNLOADABLE:
            from models.hub import HubUnavailable, TooLarge, check_size, fetch, folder_params

            entry = CONFIGURED.get(name) or DOWNLOADABLE[name]
            where = entry.folder or f"Hub {entry.repo}" + (f"@{entry.revision}" if entry.revision else "")
            try:
                if entry.folder:  # fetch() checks a Hub model's size itself, before downloading
                    check_size(folder_params(entry.folder), name)  # from the safetensors headers, before loading
                model = models.load(entry.folder or fetch(entry.repo, entry.revision, progress))
            except (HubUnavailable, TooLarge) as err:
                raise ModelUnavailable(f"{err} The other models keep working.") from None
            except Exception as err:  # a folder the configuration named: unsupported, broken or gone
                raise ModelUnavailable(f"The configured model `{name}` ({where}) cannot be loaded: {err}. The "
                                       "other models keep working.") from None
        else:
            try:
                model = models.load(CHECKPOINTS / name)
            except Exception as err:  # missing folder, bad hash, truncated file, bad config
                raise ModelUnavailable(
                    f"The model `{name}` cannot be loaded: {err}. Restore it with `git checkout -- checkpoints/{name}`"
                    f" or rebuild it with {rebuild_hint(name)}. The other tabs keep working."
                ) from None
        device = run_device()
        dtype = run_dtype(device)  # ATLAS_DTYPE: float32 on the CPU, bfloat16 on a GPU unless it says otherwise
        if device == "cpu" and dtype == torch.float32:
            pack_linears(model)  # packs only layers whose weights fp16 holds exactly (the shipped checkpoints')
            from models import fastgen

            if fastgen.supports(model):  # the decoder's joined projections, built now rather than on first use
                fastgen.plan(model)
        return place(model, device, dtype)


# ---------------------------------------------------------------------------------------------- batching
# Requests that arrive together for one model and action run as one batch (docs/ARCHITECTURE.md §9). ATLAS_BATCH=0
# serves each request alone, as before (the benchmarks' baseline).
# ATLAS_BATCH=gradio: Translate through Gradio's own batch=True instead (measured, not the default; §9).
BATCH_MODE = os.environ.get("ATLAS_BATCH", "1").strip().lower()
BATCHING = BATCH_MODE not in ("0", "gradio")
GRADIO_BATCH = BATCH_MODE == "gradio"
# Requests a batch takes at most; each batch function splits further by size (models' length runs).
BATCH_MAX = max(1, int(os.environ.get("ATLAS_BATCH_MAX", "32")))
# Handlers of a batched action that may run at once: they must reach the batcher together for it to batch them.
BATCH_CONCURRENCY = max(1, int(os.environ.get("ATLAS_BATCH_CONCURRENCY", "32")))
# The app's concurrency for everything else; work that is not batched inside a batched handler (long inputs,
# slow explanations) takes one of this many permits, so raising a handler's concurrency never multiplies it.
CONCURRENCY = max(1, int(os.environ.get("ATLAS_CONCURRENCY", "2")))
_HEAVY = threading.BoundedSemaphore(CONCURRENCY)


class Batcher:
    """Runs ``run(items) -> answers`` (one answer or exception per item, in order) over the items submitted while
    the previous batch ran: a lone request runs at once in its own thread (no batch window, no hand-over), and a
    worker thread takes everything that queued meanwhile (up to ``max_size``) the moment the running batch ends, so
    a burst is served in a few large batches, one at a time.

    Every request gets its own answer: an item whose answer is an exception gets that exception; when ``run``
    itself fails, each item of that batch is run again alone, so one bad request never fails the others. A
    request cancelled before its batch starts (``Future.cancel``) is left out; one abandoned while its batch runs
    is answered to nobody.

    A request's ``finish(answer)`` (what it makes of its answer: figures, downloads) runs in the batch's thread
    right after the batch, one request after another, and answers that request the moment it is done: 32 handler
    threads drawing at once contend for the GIL and took twice as long on 2 cores (docs/ARCHITECTURE.md §9). An
    exception in it is that request's answer alone.
    """

    def __init__(self, run: Callable[[list[Any]], Sequence[Any]], max_size: int = BATCH_MAX, name: str = "batch"):
        self.run, self.max_size, self.name = run, max(1, max_size), name
        self.sizes: Counter[int] = Counter()  # how many batches of each size ran (tests, logs)
        self._pending: deque[tuple[Any, Callable[[Any], Any] | None, Future]] = deque()
        self._cond = threading.Condition()
        self._worker: threading.Thread | None = None
        self._running = False  # a batch runs (in the worker, or alone in a caller's thread)

    def submit(self, item: Any, finish: Callable[[Any], Any] | None = None) -> Future:
        """Queue one item; its Future gets the answer (through ``finish``). When nothing runs or waits, the item
        runs at once in the calling thread (a lone request costs no hand-over); the worker then takes whatever
        queued meanwhile."""
        future: Future = Future()
        with self._cond:
            alone = not self._running and not self._pending
            if alone:
                self._running = True
            else:
                self._pending.append((item, finish, future))
                if self._worker is None:
                    self._worker = threading.Thread(target=self._loop, name=f"batcher-{self.name}", daemon=True)
                    self._worker.start()
                self._cond.notify_all()
        if alone:
            future.set_running_or_notify_cancel()
            try:
                self.sizes[1] += 1
                self._execute([(item, finish, future)])
            finally:
                with self._cond:
                    self._running = False
                    self._cond.notify_all()
        return future

    def __call__(self, item: Any, finish: Callable[[Any], Any] | None = None, timeout: float | None = None) -> Any:
        """Submit one item and wait for its answer (raising its exception)."""
        return self.submit(item, finish).result(timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._running or not self._pending:
                    self._cond.wait()
                batch = []
                while self._pending and len(batch) < self.max_size:
                    entry = self._pending.popleft()
                    if entry[2].set_running_or_notify_cancel():  # False: cancelled while it waited
                        batch.append(entry)
                self._running = bool(batch)
            if batch:
                try:
                    self.sizes[len(batch)] += 1
                    self._execute(batch)
                finally:
                    with self._cond:
                        self._running = False
                        self._cond.notify_all()

    def _execute(self, batch: list[tuple[Any, Callable[[Any], Any] | None, Future]]) -> None:
        try:
            answers = list(self.run([item for item, _, _ in batch]))
            if len(answers) != len(batch):
                raise RuntimeError(f"{self.name}: {len(answers)} answers for {len(batch)} requests")
        except BaseException as err:  # the batch as a whole failed: each request alone, so only a bad one fails
            if len(batch) == 1:
                batch[0][2].set_exception(err if isinstance(err, Exception) else RuntimeError(str(err)))
                return
            for one in batch:
                self._execute([one])
            return
        for (_, finish, future), answer in zip(batch, answers):
            if finish is not None and not isinstance(answer, BaseException):
                try:
                    answer = finish(answer)
                except Exception as err:  # this request's figures failed: its answer alone
                    answer = err
            if isinstance(answer, BaseException):
                future.set_exception(answer)
            else:
                future.set_result(answer)


def batched(name: str, action: str, run: Callable[[Any, list[Any]], Sequence[Any]], model: Any, item: Any,
            finish: Callable[[Any], Any] | None = None) -> Any:
    """``finish(run(model, [item])[0])``, served in a batch with the other requests for this model and action that
    arrive meanwhile (``Batcher``; ATLAS_BATCH=0: alone, in the calling thread). Raises the item's exception."""
    if not BATCHING:
        answer = run(model, [item])[0]
        if isinstance(answer, BaseException):
            raise answer
        return finish(answer) if finish is not None else answer
    return MODELS.batcher(name, action, lambda items: run(model, items))(item, finish)


def batch_events(action: str) -> dict[str, Any]:
    """The event options of a batched action's handler (``chain(..., **batch_events(...))``): its own pool of
    BATCH_CONCURRENCY handlers (a pool shared by the button and the textbox's submit), so that a burst reaches the
    batcher together; the app's default concurrency when batching is off."""
    return {"concurrency_limit": BATCH_CONCURRENCY, "concurrency_id": f"batched-{action}"} if BATCHING else {}


@contextlib.contextmanager
def heavy(needed: bool = True) -> Iterator[None]:
    """Hold one of ATLAS_CONCURRENCY permits while doing work that is not batched (a long input, a slow
    explanation) inside a handler whose concurrency batching raised."""
    if not needed:
        yield
        return
    with _HEAVY:
        yield


# ---------------------------------------------------------------------------------------- kept results
# A session keeps its last result for redraws, zoom and the on-request buttons; a long input's attention is large
# (12 × 12 heads over 2,048 tokens in float16: 1.2 GB), and Gradio keeps a closed tab's state for an hour. So the
# long results of all sessions together are capped: ATLAS_LONG_KEEP_MB (default 2,560: two such results).
LONG_KEEP_MB = max(0, int(os.environ.get("ATLAS_LONG_KEEP_MB", "2560")))


class Kept(dict):
    """A session's kept result (a dict that ``LongResults`` can follow without keeping it alive)."""


class LongResults:
    """The long results kept across all sessions, oldest first. ``keep`` adds one and releases (empties) the oldest
    others until their bytes fit under the cap; an emptied state reads as "no result" to every handler, which then
    asks for a new generation. The newest is always kept. A state Gradio dropped (its session ended) is forgotten."""

    def __init__(self, cap_mb: float) -> None:
        self.cap = cap_mb * 2**20
        self._kept: dict[int, tuple[Any, int]] = {}  # id -> (weak reference, bytes), oldest first
        self._lock = threading.Lock()

    def keep(self, kept: Kept, nbytes: int) -> list[Kept]:
        """Follow ``kept`` (``nbytes`` of arrays); returns the states released to make room for it."""
        key = id(kept)
        released = []
        with self._lock:
            self._kept[key] = (weakref.ref(kept, lambda _, key=key: self._forget(key)), int(nbytes))
            for other in list(self._kept):
                if self.total() <= self.cap or other == key:
                    break
                entry = self._kept.pop(other, None)  # None: collected meanwhile, nothing to release
                state = entry[0]() if entry else None
                if state is not None:
                    state.clear()
                    released.append(state)
        return released

    def total(self) -> int:
        """Bytes of the long results kept now."""
        return sum(n for ref, n in self._kept.values() if ref() is not None)

    def _forget(self, key: int) -> None:
        self._kept.pop(key, None)  # dict.pop is atomic: safe from a garbage collection in any thread


LONG_RESULTS = LongResults(LONG_KEEP_MB)


IMAGENET = {"ViT-B/16 (ImageNet)": "vit_b_16", "Swin-T (ImageNet)": "swin_t"}  # shown name -> torchvision's
IMAGENET_NAMES = tuple(IMAGENET.values())
MODELS = ModelStore()


# ------------------------------------------------------------------------------------ configured models
def run_device() -> str:
    """Where the models run: ``ATLAS_DEVICE`` ("cpu", the default, or "cuda" where a GPU is present)."""
    wanted = os.environ.get("ATLAS_DEVICE", "cpu").strip().lower() or "cpu"
    if wanted == "cpu":
        return "cpu"
    import torch

    if wanted.startswith("cuda") and torch.cuda.is_available():
        return wanted
    print(f"[attention-atlas] ATLAS_DEVICE={wanted!r} is not available here; running on the CPU", flush=True)
    return "cpu"


@dataclass(frozen=True)
class Configured:
    """A model the server's configuration names (`python app.py --model ENTRY`, ATLAS_MODELS): never the UI.
    Either a local ``folder`` or a Hub ``repo`` (at ``revision``), fetched on first use."""

    folder: Path | None
    kind: str  # the tab that shows it: "classify", "generate" or "vision"
    repo: str | None = None
    revision: str | None = None


CONFIGURED: dict[str, Configured] = {}  # display name (the folder's name or the Hub id) -> where it is
# Offered in the Generate tab without configuration; fetched from the Hub on first use (models/hub.py).
DOWNLOADABLE = {repo: Configured(None, "generate", repo) for repo in
                ("openai-community/gpt2", "HuggingFaceTB/SmolLM2-135M")}
CONFIG_PROBLEMS: list[tuple[str | None, str]] = []  # (tab or None if unknown, what is wrong): log and tab
# config.json "model_type" (Hugging Face) or "model" (the project's checkpoints) -> the tab that shows it
TAB_OF_TYPE = {"gpt2": "generate", "llama": "generate", "GPT": "generate", "bert": "classify",
               "BertClassifier": "classify", "TextClassifier": "classify", "vit": "vision", "ViT": "vision",
               "Swin": "vision"}


def configure(entries: list[str]) -> None:
    """Add the models named by the configuration. An entry is a local folder whose config.json says its kind,
    or ``KIND:OWNER/NAME[@REVISION]`` for a Hub model fetched on first use (start-up needs no network). A
    problem (unreadable, unsupported, a name that repeats another or a shipped checkpoint's) is recorded in
    CONFIG_PROBLEMS and the entry left out: the rest of the app starts and works."""
    from models.hub import parse_entry

    for entry in (e.strip() for e in entries):
        if not entry:
            continue
        try:
            hub = parse_entry(entry)
        except ValueError as err:
            _problem(None, f"`{entry}`: {err}")
            continue
        if hub is not None:
            kind, repo, revision = hub
            name, found = repo, Configured(None, kind, repo, revision)
        else:
            folder = Path(entry).expanduser()
            name, kind, why = folder.name, *_folder_kind(folder)
            if kind is None:
                _problem(None, f"`{entry}`: {why}")
                continue
            found = Configured(folder.resolve(), kind)
        if name in CONFIGURED or name in DOWNLOADABLE or name in IMAGENET_NAMES or (CHECKPOINTS / name).exists():
            _problem(kind, f"`{entry}`: the name `{name}` is taken (by another entry or a shipped model)")
        else:
            CONFIGURED[name] = found


def _folder_kind(folder: Path) -> tuple[str | None, str]:
    """(the tab a folder's config.json names, or None; why not)."""
    try:
        meta = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        kind = TAB_OF_TYPE.get(meta.get("model_type") or meta.get("model"))
    except (OSError, ValueError, AttributeError) as err:
        return None, f"no readable config.json ({type(err).__name__})"
    return kind, (f"its model type {meta.get('model_type') or meta.get('model')!r} is not supported "
                  f"({', '.join(k for k in TAB_OF_TYPE if k.islower())})")


def _problem(kind: str | None, problem: str) -> None:
    CONFIG_PROBLEMS.append((kind, problem))
    print(f"[attention-atlas] model not added: {problem}", flush=True)


def configured(kind: str) -> list[str]:
    """The configured model names shown in one tab."""
    return [name for name, c in CONFIGURED.items() if c.kind == kind]


def configuration_notice(kind: str) -> str:
    """The configured entries this tab could not add (and those no tab can), for its notice."""
    return "\n\n".join(f"**Model not added:** {p}" for k, p in CONFIG_PROBLEMS if k in (kind, None))


def checkpoint_labels(*names: str) -> list[str]:
    """The class labels that these checkpoints' (or configured folders') config.json lists, in label order, read
    without torch: the classes a model can be asked to explain, and that a permalink may name."""
    return list(dict.fromkeys(label for name in names for label in _labels_of(name)))


def _labels_of(name: str) -> list[str]:
    folder = CONFIGURED[name].folder if name in CONFIGURED else CHECKPOINTS / name
    try:  # a Hub entry has no folder until it is fetched
        meta = json.loads((folder / "config.json").read_text(encoding="utf-8")) if folder else {}
        id2label = meta.get("id2label") or {}
        labels = meta.get("labels") or [id2label[k] for k in sorted(id2label, key=int)]
    except (OSError, ValueError, TypeError):
        return []
    return [str(label) for label in labels]


def get_model(name: str, progress: Any = None) -> Any:
    """The model behind a name, or a gr.Error whose message says how to restore, rebuild or fetch it;
    ``progress`` (a gr.Progress) shows a download on first use."""
    from tabs.common import Error  # the tabs' error (escaped text); imported here, as common imports this module

    try:
        return MODELS.get(name, progress)
    except ModelUnavailable as err:
        raise Error(str(err), duration=None) from None


@cache
def rebuild_commands() -> dict[str, dict[str, Any]]:
    """``{name: {"command": ..., "needs": [...]}}`` from checkpoints/rebuild.json (no torch needed)."""
    try:
        return json.loads(REBUILD.read_text(encoding="utf-8"))["models"]
    except (OSError, ValueError, KeyError):
        return {}


def rebuild_hint(name: str) -> str:
    """`command` (needs: ...), or a pointer to the README when the model has no recorded command."""
    entry = rebuild_commands().get(name)
    if not entry:
        return "the training command in README.md"
    needs = "; ".join(entry.get("needs", []))
    after = f", then `{entry['after']}`" if entry.get("after") else ""
    return f"`{entry['command']}`" + (f" (needs {needs})" if needs else "") + after


def checkpoint_status(*names: str) -> str:
    """A notice for the tab when one of its checkpoints is missing (cheap file checks, no torch)."""
    missing = [n for n in names if not (CHECKPOINTS / n / "manifest.json").is_file()]
    if not missing:
        return ""
    return ("**Not available:** " + ", ".join(f"`checkpoints/{n}` is missing (rebuild: {rebuild_hint(n)})"
                                             for n in missing) + ". Everything else keeps working.")


def decoder_models() -> list[str]:
    """The Generate tab's models: gpt-tiny first (even when it is missing: its notice says so), the other decoder
    checkpoints under CHECKPOINTS, the downloadable and the configured ones."""
    found = _decoder_checkpoints(CHECKPOINTS)
    return [GPT_TINY, *[n for n in found if n != GPT_TINY], *DOWNLOADABLE, *configured("generate")]


@cache
def _decoder_checkpoints(folder: Path) -> tuple[str, ...]:
    """The decoder checkpoint folders under ``folder``, from their config.json: read once per process (a request
    does not rescan them; a checkpoint added while the server runs appears after a restart)."""
    found = []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []:
        try:
            meta = json.loads((sub / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and TAB_OF_TYPE.get(meta.get("model") or meta.get("model_type")) == "generate":
            found.append(sub.name)
    return tuple(found)
