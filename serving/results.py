"""The results sessions keep for redraws, zoom and the on-request buttons, and the cap on the long ones
(docs/ARCHITECTURE.md §2)."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

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
# A result whose attention stays on the model's device (models/decoding/ondevice.py: each layer's queries, keys and
# log-sum-exps) holds that device's memory: an 8 B model's after 4,096 tokens about 1.6 GB. All sessions' together
# are capped likewise: ATLAS_DEVICE_KEEP_MB (default 4,096).
DEVICE_RESULTS = LongResults(max(0, int(os.environ.get("ATLAS_DEVICE_KEEP_MB", "4096"))))
