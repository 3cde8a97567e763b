"""What the serving side raises. The tabs turn a ``ServingError`` into the page's message (``tabs.common.Error``);
the message is written for the person at the page (how to restore, rebuild or fetch the model)."""

from __future__ import annotations


class ServingError(Exception):
    """A request the serving side cannot serve; ``str(err)`` is the message to show."""


class ModelUnavailable(ServingError):
    """A model's checkpoint or weights cannot be loaded; the message says how to fix it."""
