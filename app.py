"""Attention Atlas: see what attention does inside Transformers.

`python app.py` serves the app on 127.0.0.1:7860 (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT change that).
Each tab is one module of `tabs/` (its intro, a `build()` that lays it out, then its handlers); this file
puts them in order (the page's style and script are tabs/page.py, the start-up work tabs/startup.py). A tab is
added by writing its module and listing it in TABS (docs/ARCHITECTURE.md §8). torch is imported on first use, so
the page is served before the model stack has loaded; `main` imports that stack in a background thread once the
server is up (ATLAS_WARM=0 turns it off) and pays the first Plotly figure's cost before serving, so neither falls
on a user's first request.
"""

from __future__ import annotations

import argparse
import os
import threading

import gradio as gr

from models import limits
from serving.catalogue import configure
from tabs import (
    classify,
    describe,
    generate,
    lessons,
    listen,
    permalink,
    playground,
    positional,
    sections,
    swin,
    translate,
    vision,
)
from tabs import heads as head_atlas
from tabs.page import CSS, JS
from tabs.startup import WARM_MODULES, preload_for_zero_gpu, warm_plotly, warm_stack  # noqa: F401 (app.* in tests)

TITLE = "Attention Atlas"
# in the order shown
TABS = [translate, classify, generate, vision, describe, listen, swin, positional, playground, head_atlas, lessons]


def build_demo() -> gr.Blocks:
    # Files older than an hour are removed every hour, so a public server's temporary folder stays small.
    with gr.Blocks(title=TITLE, delete_cache=(3600, 3600)) as demo:
        gr.Markdown(f"# {TITLE}\nSee what attention does inside Transformers: pick a tab, give it input, "
                    "and move through layers and heads.")
        link_notice = gr.Markdown(visible=False, elem_classes=["notice"])  # what a permalink could not restore
        items = {}
        # every tab stays in the bar, on a second row where the page is narrow (the default menu hid some behind "…")
        with gr.Tabs(overflow_behavior="wrap") as tabs:
            for tab in TABS:
                key = permalink.tab_key(tab)
                with gr.Tab(tab.TITLE, id=key) as item:
                    items[key] = (item, tab.build())  # its Permalink, or None: what its link holds
        with gr.Accordion("Limits and safety", open=False):
            gr.Markdown(limits.describe())
        sections.register_api()  # /attention_why and /patch take text and a model name (tabs/sections/)
        # The page load restores a permalink and draws the tabs that need no trained model; every change of a
        # declared control writes the view into the URL (tabs/permalink.py).
        permalink.wire(demo, tabs, items, link_notice)
    return demo


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Attention Atlas: see what attention does inside Transformers.")
    ap.add_argument("--model", action="append", default=[], metavar="ENTRY",
                    help="also offer this model: a folder (Hugging Face or a project checkpoint), KIND:OWNER/NAME "
                         "(the Hub), PATH.gguf or ollama:NAME[:TAG] (a GGUF file, Ollama's store); repeat for more. "
                         "ATLAS_MODELS (comma-separated) does the same.")
    args = ap.parse_args(argv)
    configure([*args.model, *os.environ.get("ATLAS_MODELS", "").split(",")])
    preload_for_zero_gpu()
    demo = build_demo()
    # Host and port come from GRADIO_SERVER_NAME / GRADIO_SERVER_PORT; Gradio's default host is 127.0.0.1.
    # A bounded queue: requests beyond max_size get a "busy, try again" answer instead of piling up.
    demo.queue(default_concurrency_limit=int(os.environ.get("ATLAS_CONCURRENCY", "2")),
               max_size=int(os.environ.get("ATLAS_QUEUE", "64")))
    warm_plotly()
    demo.launch(theme=gr.themes.Soft(), css=CSS, js=JS, max_file_size=f"{limits.MAX_UPLOAD_MB}mb",
                prevent_thread_lock=True)  # returns once the page is served ...
    if os.environ.get("ATLAS_WARM", "1") != "0":  # ... then the model stack is imported beside the first visitors
        threading.Thread(target=warm_stack, name="atlas-warm", daemon=True).start()
    demo.block_thread()


if __name__ == "__main__":
    main()
