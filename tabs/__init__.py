"""The app's tabs, one module each: its TITLE and INTRO, a ``build()`` that lays the tab out (layout first)
and, for tabs that draw without a trained model, returns ``(handler, inputs, outputs)`` to draw when the page
loads; then its handlers as plain functions. ``tabs.common`` holds what they share."""
