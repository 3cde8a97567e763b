"""How a generation request runs: the one place that chooses between the decoding paths (docs/ARCHITECTURE.md §9).

- "ondevice": the attention kept on the model's device (models/decoding/ondevice.py; ATLAS_ONDEVICE, CUDA models),
  and every input over ``limits.LONG_TOKENS`` tokens of a model it supports, on any device: the long-context store
  (queries, keys and row normalisers; never the T × T map), with its statistics over every row;
- "batched": decoded in lockstep with the requests for the same model that arrive meanwhile
  (models/decoding/lockstep.py through ``serving.store.batched``), for a family that batches that way;
- "fastgen": alone, through the CPU server's decoder (models/decoding/fastgen.py);
- "plain": alone, through the model's own ``generate``.

Each path is chosen only where its runner knows every field of the model's block description (``refusal`` is None,
models/blocks/decoder.py), so a model none of them knows is served by the plain path. Tabs call ``generate`` and draw.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from models import limits, registry
from serving import batcher, store

PATHS = ("ondevice", "batched", "fastgen", "plain")


def choose(model: Any, prompt_tokens: int, new_tokens: int) -> str:
    """The path a request for ``model`` with that many prompt and new tokens takes (a PATHS entry). Raises
    ValueError for a bad ATLAS_ONDEVICE."""
    from models.decoding import fastgen, lockstep

    if fastgen.keeps_on_device(model) or long_store(model, prompt_tokens + new_tokens):
        return "ondevice"
    family = registry.family_of(model)
    if (family.batch == "lockstep" and prompt_tokens + new_tokens <= limits.LONG_TOKENS
            and lockstep.refusal(model) is None):  # a long input is served alone: its attention is large
        return "batched"
    return "fastgen" if fastgen.supports(model) else "plain"


def long_store(model: Any, tokens: int) -> bool:
    """Whether a request of ``tokens`` (prompt + new) is read into the long-context store: over LONG_TOKENS, for a
    model the store computes exactly (``ondevice.refusal`` is None; ATLAS_ONDEVICE=0 keeps every model off it)."""
    import os

    from models.decoding import ondevice

    if tokens <= limits.LONG_TOKENS or os.environ.get("ATLAS_ONDEVICE", "auto").strip().lower() == "0":
        return False
    return ondevice.supports(model)


class Stopped(RuntimeError):
    """A long prompt's reading stopped by its session's "Stop reading" (``stop``); its buffers are let go."""


_READING: dict[str, threading.Event] = {}  # session -> the stop flag of the generation it is running
_READING_LOCK = threading.Lock()


@contextlib.contextmanager
def reading(session: str) -> Iterator[threading.Event]:
    """The stop flag of one session's generation while it runs (``stop`` sets it; the run checks it between the
    prompt's chunks). An empty session (a direct call) gets a flag nobody else can set."""
    flag = threading.Event()
    with _READING_LOCK:
        if session:
            _READING[session] = flag
    try:
        yield flag
    finally:
        with _READING_LOCK:
            if session and _READING.get(session) is flag:
                del _READING[session]


def stop(session: str) -> bool:
    """Ask the session's running generation to stop reading; False when it runs none."""
    with _READING_LOCK:
        flag = _READING.get(session) if session else None
    if flag is None:
        return False
    flag.set()
    return True


class TooLarge(ValueError):
    """A long request whose store would not fit in the server's memory (said in words before it starts)."""


def available_bytes() -> int:
    """Memory the server can still use: MemAvailable (Linux), else the physical memory; ATLAS_MEMORY_MB overrides."""
    import os

    raw = os.environ.get("ATLAS_MEMORY_MB", "").strip()
    if raw.isdigit():
        return int(raw) << 20
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) << 10
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_memory(model: Any, tokens: int) -> None:
    """Refuse, in words, a long request whose store (``ondevice.store_bytes``) would not fit in what is available."""
    from models.decoding import ondevice

    need, have = ondevice.store_bytes(model, tokens), available_bytes()
    if need > have:
        raise TooLarge(f"Reading {tokens:,} tokens would keep about {need / 2**30:.1f} GB of queries and keys (every "
                       f"layer's, for every view to be computed exactly), more than the {have / 2**30:.1f} GB the "
                       "server has free now: use a shorter text, or try again when other results have been let go.")


def generate(name: str, model: Any, request: Any, finish: Callable[[Any], Any], pool_cells: int | None = None,
             progress: Callable[[int, int], None] | None = None, should_stop: Callable[[], bool] | None = None
             ) -> tuple[Any, str]:
    """(``finish`` of the request's result, the path it took). ``request``: a ``models.decoding.lockstep``
    GenerateRequest; ``pool_cells``: the tiles an on-device run makes while generating (the model view's).
    A long input (``long_store``) is checked against the memory first (``TooLarge``), read with ``progress(done,
    total)`` after each prompt chunk and stopped when ``should_stop()`` (``ondevice.Cancelled``)."""
    from models.decoding import fastgen, lockstep, ondevice

    kw = dict(max_new_tokens=request.max_new_tokens, strategy=request.strategy, temperature=request.temperature,
              top_k=request.top_k, top_p=request.top_p, seed=request.seed)
    text = request.text
    prompt_tokens = len(model.encode_prompt(text)[0]) if isinstance(text, str) else len(text)
    path = choose(model, prompt_tokens, request.max_new_tokens)
    if path == "batched":  # drawn in the batch's thread
        return store.batched(name, "generate", lockstep.generate_many, model, request, finish=finish), path
    with batcher.heavy():
        if path == "ondevice":
            long = long_store(model, prompt_tokens + request.max_new_tokens)
            if long:
                check_memory(model, prompt_tokens + request.max_new_tokens)
            try:
                run = ondevice.generate(model, request.text, pool_cells=pool_cells, stats=long, progress=progress,
                                        should_stop=should_stop, **kw)
            except ondevice.Cancelled as err:
                raise Stopped(str(err)) from None
            return finish(run.kept()), path
        if path == "fastgen":
            return finish(fastgen.generate(model, request.text, **kw)), path
        return finish(model.generate(request.text, **kw)), path


def needle(model: Any, length: int, depth: float, new_tokens: int, progress: Callable[[int, int], None] | None = None,
           should_stop: Callable[[], bool] | None = None, seed: int = 0, **needle: str) -> tuple[Any, Any]:
    """A needle-in-a-haystack run (models.inspect.retrieval, Wu et al. 2024) through the long-context store:
    (the haystack, its sentences shuffled by ``seed``, ``needle`` its needle, question and answer where given, as
    ``retrieval.haystack`` takes them; its Retrieval: the answer and every head's retrieval score).
    Checked against the memory first; served alone (``batcher.heavy``). ValueError (in words) for what cannot run."""
    from models.decoding import ondevice
    from models.inspect import retrieval

    why = ondevice.refusal(model)
    if why:
        raise ValueError(f"The needle search reads the text into the long-context store, which does not compute this "
                         f"model ({why}).")
    hay = retrieval.haystack(model, int(length), float(depth), seed=int(seed), **needle)
    check_memory(model, len(hay.ids) + new_tokens)
    with batcher.heavy():
        try:
            found = retrieval.run(model, hay, ondevice.generate, max_new_tokens=new_tokens, progress=progress,
                                  should_stop=should_stop)
        except ondevice.Cancelled as err:
            raise Stopped(str(err)) from None
    return hay, found


def needle_survey(model: Any, length: int, depths: Sequence[float], new_tokens: int,
                  progress: Callable[[int, int], None] | None = None, **needle: str) -> Any:
    """Retrieval scores averaged over needles at several ``depths`` of one haystack length (``retrieval.survey``,
    Wu et al.: over the runs that found the needle, or all where none did), checked against the memory first and
    served alone. ``progress(done, total)`` after each run; ``needle``: its needle, question and answer where given
    (``retrieval.haystack``'s keywords). ValueError (in words) for what cannot run."""
    from models.decoding import ondevice
    from models.inspect import retrieval

    why = ondevice.refusal(model)
    if why:
        raise ValueError(f"The retrieval-head survey reads each haystack into the long-context store, which does not "
                         f"compute this model ({why}).")
    check_memory(model, int(length) + new_tokens)
    done = []

    def each(_: Any) -> None:
        done.append(1)
        if progress is not None:
            progress(len(done), len(depths))

    with batcher.heavy():
        return retrieval.survey(model, ondevice.generate, [int(length)], [float(d) for d in depths],
                                max_new_tokens=new_tokens, progress=each, **needle)


def needle_ablation(model: Any, hay: Any, scores: Any, k: int, new_tokens: int, seed: int = 0) -> Any:
    """The needle's answer with the k best retrieval heads switched off against k random ones
    (``retrieval.ablation``), served alone."""
    from models.inspect import retrieval

    with batcher.heavy():
        return retrieval.ablation(model, hay, scores, ks=(int(k),), seed=seed, max_new_tokens=new_tokens)
