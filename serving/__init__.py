"""The serving side of the app, with no gradio (docs/ARCHITECTURE.md §1, §9): ``catalogue`` (every model name the
app offers, where it lives, the tab that shows it, the configured and Hub entries, the "not available" notices),
``store`` (each model loaded once per process, packed for the CPU, and its batchers), ``batcher`` (requests that
arrive together run as one batch), ``results`` (the cap on the long results kept across sessions) and ``errors``
(what the serving side raises; the tabs turn it into a message);
``classroom``, the class store. Imports go down only: tabs -> serving -> models.
"""
