"""Hugging Face ZeroGPU Spaces: the model calls ask for a GPU for the length of one call.

On a ZeroGPU Space a GPU is attached to a request only inside a function decorated with the ``spaces`` package's
``GPU`` decorator (https://huggingface.co/docs/hub/spaces-zerogpu); the Space sets ``SPACES_ZERO_GPU``. ``on_gpu``
applies the decorator when ``spaces`` can be imported (it is installed on Spaces, never required here) and returns
the function unchanged everywhere else, so the app, its tests and a CPU or dedicated-GPU Space behave exactly as
before. ``ATLAS_GPU_SECONDS`` sets the longest call the decorator books (default 60 s; ZeroGPU queues longer
bookings behind shorter ones).

What else a ZeroGPU Space changes (``ZERO_GPU``):
- the models are loaded at start-up in the main process (``preload``: ZeroGPU expects ``.to("cuda")`` there, and a
  decorated call runs in a worker that inherits them), not on first use inside a call;
- requests are not batched (``serving.batcher``: ATLAS_BATCH defaults to 0): a batch runs in its first request's
  thread, inside one request's GPU booking, while every request needs its own;
- what a decorated call returns travels back to the main process, so a generation's attention kept on the GPU
  comes back on the CPU (``host``), where every figure reads it the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

ZERO_GPU = bool(os.environ.get("SPACES_ZERO_GPU"))  # set by Hugging Face on a ZeroGPU Space


def on_gpu(fn: F) -> F:
    """``spaces.GPU(duration=ATLAS_GPU_SECONDS)(fn)`` where the ``spaces`` package is present, else ``fn``."""
    try:
        import spaces
    except ImportError:
        return fn
    return spaces.GPU(duration=int(os.environ.get("ATLAS_GPU_SECONDS", "60")))(fn)


def preload(names: Iterable[str], load: Callable[[str], Any]) -> dict[str, str]:
    """Load each model by ``load(name)`` (the model store), now; {name: why it could not be loaded} for those that
    failed (their tabs say so on first use, as anywhere else)."""
    failed = {}
    for name in names:
        try:
            load(name)
        except Exception as err:  # noqa: BLE001 (a missing checkpoint must not stop the others)
            failed[name] = str(err)
    return failed


def host(kept: Any) -> Any:
    """A kept Generate state whose attention stays on a device (``DeviceMap``) with that attention moved to the
    CPU on a ZeroGPU Space (a decorated call's answer leaves the GPU worker); anything else unchanged."""
    if not ZERO_GPU or not kept:
        return kept
    attention = kept["result"].attention
    amap = attention.get("decoder")
    if hasattr(amap, "to") and hasattr(amap, "attention"):
        attention["decoder"] = amap.to("cpu")
    return kept
