"""Requests that arrive together for one model and action run as one batch (docs/ARCHITECTURE.md §9): the
``Batcher``, the batching switches, the batched events' concurrency and the permits for heavy work that is not
batched."""

from __future__ import annotations

import contextlib
import os
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

# Requests that arrive together for one model and action run as one batch (docs/ARCHITECTURE.md §9). ATLAS_BATCH=0
# serves each request alone, as before (the benchmarks' baseline).
# ATLAS_BATCH=gradio: Translate through Gradio's own batch=True instead (measured, not the default; §9).
# A ZeroGPU Space (SPACES_ZERO_GPU) serves each request alone by default: each one books its own GPU (tabs/zerogpu.py).
BATCH_MODE = os.environ.get("ATLAS_BATCH", "0" if os.environ.get("SPACES_ZERO_GPU") else "1").strip().lower()
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
