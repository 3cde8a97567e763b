"""The sections the text tabs (Generate, Classify, Translate's encoder) share, each a layout function a tab calls
inside its own build() and the handlers behind it (docs/ARCHITECTURE.md §1, §2): why.py (why a head attends,
attention sinks), patching.py (activation patching), compare.py (a second input beside the first), text.py (a text
model by name, a text as that model reads it). None imports a tab."""

from __future__ import annotations

from tabs.sections import patching, why


def register_api() -> None:
    """The endpoints that take plain text rather than a tab's kept Result: /attention_why, /patch."""
    why.register_api()
    patching.register_api()
