"""The smallest Gradio app with the app's queue settings: the baseline of bench/latency.py.

Two endpoints that do no work, `/echo` (text in, text out) and `/upload` (a file in, its size out), give
the round-trip cost of Gradio's queue protocol and gradio_client on this machine, with and without a file
upload, measured in the same run as the app's actions.
"""

import os
from pathlib import Path

import gradio as gr


def echo(text: str) -> str:
    return text


def upload(path: str) -> str:
    return str(Path(path).stat().st_size)


with gr.Blocks() as demo:
    text, out, file = gr.Textbox(), gr.Textbox(), gr.File(type="filepath")
    gr.Button("echo").click(echo, text, out, api_name="echo")
    gr.Button("upload").click(upload, file, out, api_name="upload")

if __name__ == "__main__":
    demo.queue(default_concurrency_limit=int(os.environ.get("ATLAS_CONCURRENCY", "2")),
               max_size=int(os.environ.get("ATLAS_QUEUE", "64")))
    demo.launch()
