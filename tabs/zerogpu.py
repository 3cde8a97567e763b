"""Hugging Face ZeroGPU Spaces: the heavy handlers ask for a GPU for the length of one call.

On a ZeroGPU Space a GPU is attached to a request only inside a function decorated with the ``spaces`` package's
``GPU`` decorator (https://huggingface.co/docs/hub/spaces-zerogpu). ``on_gpu`` applies it when ``spaces`` can be
imported (it is installed on Spaces, never required here) and returns the function unchanged everywhere else, so
the app, its tests and a CPU or dedicated-GPU Space behave exactly as before. ``ATLAS_GPU_SECONDS`` sets the
longest call the decorator books (default 60 s; ZeroGPU queues longer bookings behind shorter ones).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def on_gpu(fn: F) -> F:
    """``spaces.GPU(duration=ATLAS_GPU_SECONDS)(fn)`` where the ``spaces`` package is present, else ``fn``."""
    try:
        import spaces
    except ImportError:
        return fn
    return spaces.GPU(duration=int(os.environ.get("ATLAS_GPU_SECONDS", "60")))(fn)
