"""Attention Atlas: see what attention does inside Transformers.

`python app.py` serves the app on 127.0.0.1:7860 (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT change that).
Each tab is one module of `tabs/` (its intro, a `build()` that lays it out, then its handlers); this file
puts them in order and holds what the whole app needs. A tab is added by writing its module and listing it
in TABS (docs/ARCHITECTURE.md §8). torch is imported on first use, so the page is served
before the model stack has loaded; `main` imports that stack in a background thread once the server is up (ATLAS_WARM=0
turns it off) and pays the first Plotly figure's cost before serving, so neither falls on a user's first request.
"""

from __future__ import annotations

import argparse
import importlib
import os
import threading

import gradio as gr

from models import limits
from serving.catalogue import configure
from tabs import classify, generate, lessons, permalink, playground, positional, sections, swin, translate, vision
from tabs import heads as head_atlas

TITLE = "Attention Atlas"
TABS = [translate, classify, generate, vision, swin, positional, playground, head_atlas, lessons]  # in order shown
CSS = """
.intro {font-size: 1.02rem; line-height: 1.5;}
.notice {border-left: 4px solid #e0a800; padding: 0.4rem 0.8rem; background: #fff8e1;}
.highlight {font-size: 1.15rem; line-height: 2.0;}
footer {display: none !important;}
.atlas-hidden {display: none !important;}  /* the boxes a figure click writes into (JS below) */
.block:has(> .js-plotly-plot) {overflow-x: auto !important;}  /* a figure wider than its column scrolls, not clipped */
/* and shows that it does: a styled scrollbar is drawn always (an overlay one hid the colour bar and later panels) */
.block:has(> .js-plotly-plot)::-webkit-scrollbar {height: 12px;}
.block:has(> .js-plotly-plot)::-webkit-scrollbar-thumb {background: #b8b8c8; border-radius: 6px;}
.block:has(> .js-plotly-plot)::-webkit-scrollbar-track {background: #eeeef4;}
/* A failed request says so once, in its toast: no "Error" badge over each of its outputs (Gradio's status tracker). */
[data-testid="status-tracker"]:has(> .error) {display: none !important;}
.atlas-export {display: flex; gap: 0.3rem; justify-content: flex-end; padding: 0.15rem 0.3rem;}  /* under each figure */
.atlas-export button {font-size: 0.75rem; padding: 0 0.5rem; border: 1px solid var(--border-color-primary);
  border-radius: 4px; background: var(--background-fill-secondary); cursor: pointer;}
"""
# A click on a heatmap cell of an attention figure (elem_id "<tab>-attention") or a patching sweep ("<tab>-patch")
# writes "row,col,click number" into the hidden box "<tab>-why-cell" / "<tab>-patch-cell" (a point of a Q/K scatter,
# "<tab>-qk": "position,click number" into "<tab>-qk-cell"), whose change event runs the
# handler (a script's input event is not a user's, so Gradio's .input does not fire; the click number makes a second
# click on the same cell a change too).
JS = """() => {
  const bind = () => {
    document.querySelectorAll('[id$="-attention"], [id$="-patch"], [id$="-qk"]').forEach((box) => {
      const plot = box.querySelector('.js-plotly-plot');
      if (!plot || plot._atlasBound || !plot.on) return;
      plot._atlasBound = true;
      plot.on('plotly_click', (ev) => {
        const p = ev.points && ev.points[0];
        const qk = box.id.endsWith('-qk');  // a Q/K scatter (tabs/sections/qk.py): customdata is the token position
        if (!p || (qk ? typeof p.customdata !== 'number'
                   : p.data.type !== 'heatmap' || !Array.isArray(p.pointNumber))) return;
        const target = qk ? box.id + '-cell'
                          : box.id.replace(/-attention$/, '-why-cell').replace(/-patch$/, '-patch-cell');
        const input = document.querySelector('#' + target + ' textarea, #' + target + ' input');
        if (!input) return;
        window._atlasClicks = (window._atlasClicks || 0) + 1;
        const m = p.data.meta || {};  // a pooled heatmap's cells name their blocks' first tokens (viz.attention)
        const row = m.rows ? m.rows[p.pointNumber[0]] : p.pointNumber[0];
        const col = m.cols ? m.cols[p.pointNumber[1]] : p.pointNumber[1];
        input.value = (qk ? p.customdata : row + ',' + col) + ',' + window._atlasClicks;
        input.dispatchEvent(new Event('input', {bubbles: true}));
      });
    });
  };
  // Every drawn figure gets "SVG" and "PNG" buttons under it: Plotly's own export of that figure (window.Plotly is
  // the library Gradio's plot draws with), named after the figure's title.
  const exportBar = (plot) => {
    const box = plot.parentElement;
    if (!box || !plot._fullLayout || box.querySelector(':scope > .atlas-export')) return;
    const bar = document.createElement('div');
    bar.className = 'atlas-export';
    for (const format of ['svg', 'png']) {
      const button = document.createElement('button');
      button.type = 'button';
      button.textContent = format.toUpperCase();
      button.title = 'Download this figure as ' + format.toUpperCase();
      button.addEventListener('click', () => {
        const el = box.querySelector('.js-plotly-plot');
        const title = ((el._fullLayout.title || {}).text || '').replace(/<[^>]*>/g, ' ');
        const name = title.toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-+|-+$/g, '').slice(0, 60);
        window.Plotly.downloadImage(el, {format, filename: name || 'figure', scale: format === 'png' ? 2 : 1});
      });
      bar.append(button);
    }
    box.append(bar);
  };
  // A new attempt (any button pressed outside a toast) closes the toasts of earlier ones, so errors neither stack
  // ("Error (2)") nor stay after the request that follows them has worked.
  document.addEventListener('click', (ev) => {
    if (!ev.target.closest('button') || ev.target.closest('.toast-body')) return;
    document.querySelectorAll('.toast-close').forEach((close) => close.click());
  }, true);
  new MutationObserver(() => {
    bind();
    document.querySelectorAll('.js-plotly-plot').forEach(exportBar);
  }).observe(document.body, {childList: true, subtree: true});
}"""


def build_demo() -> gr.Blocks:
    # Files older than an hour are removed every hour, so a public server's temporary folder stays small.
    with gr.Blocks(title=TITLE, delete_cache=(3600, 3600)) as demo:
        gr.Markdown(f"# {TITLE}\nSee what attention does inside Transformers: pick a tab, give it input, "
                    "and move through layers and heads.")
        link_notice = gr.Markdown(visible=False, elem_classes=["notice"])  # what a permalink could not restore
        items = {}
        with gr.Tabs() as tabs:
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


# What a first Translate, Classify, Generate or Vision request imports (measured: 5–9 s of torch and the families on
# a busy 2-core machine), imported by warm_stack in the background once the page is served.
WARM_MODULES = ("torch", "safetensors.torch", "models.io.checkpoint", "models.io.images", "models.io.placement",
                "models.io.hf", "models.families.translator", "models.families.classifier", "models.families.gpt",
                "models.families.vit", "models.families.swin", "models.decoding.loop", "models.decoding.fastgen",
                "models.decoding.packed", "models.inspect.analysis", "models.inspect.attribution",
                "models.inspect.calibration", "serving.store")


def warm_plotly() -> None:
    """Build and serialise one small figure of each trace kind the tabs draw (heatmap, bar, scatter), as gr.Plot
    does: the first figure of a process pays for Plotly's validators and JSON encoder (measured 0.2–1.2 s), which
    otherwise fell on the first Translate or Generate request's figures, seconds after its text."""
    import plotly.graph_objects as go

    fig = go.Figure([go.Heatmap(z=[[0.0, 1.0], [1.0, 0.0]], colorscale="Viridis", colorbar={"title": "w"}),
                     go.Bar(x=["a", "b"], y=[1, 2], text=["1", "2"]),
                     go.Scatter(x=[0, 1], y=[1, 0], mode="lines+markers", line={"dash": "dash"})])
    fig.update_layout(title="warm-up", xaxis={"title": "x", "tickangle": -45}, yaxis={"autorange": "reversed"},
                      legend={"orientation": "h"}, margin={"t": 40})
    gr.Plot().postprocess(fig)


def warm_stack() -> list[str]:
    """Import the model stack (WARM_MODULES) and run one small torch operation, so that the first request a user
    sends does not wait for them; returns the modules that could not be imported (an optional dependency missing:
    its request will say so itself). Safe beside requests: Python's import lock serialises a module's import."""
    failed = []
    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 (warming is best effort; the request that needs the module reports it)
            failed.append(name)
    if "torch" not in failed:
        import torch

        torch.softmax(torch.ones(2, 4) @ torch.ones(4, 3), dim=-1)  # the first op initialises torch's kernels
    return failed


def preload_for_zero_gpu() -> None:
    """On a ZeroGPU Space, load the shipped models and the configured folders now, in the main process, where
    ZeroGPU expects them moved to the GPU (tabs/zerogpu.py); elsewhere nothing (models load on first use)."""
    from serving import catalogue, store
    from tabs import zerogpu

    if not zerogpu.ZERO_GPU:
        return
    names = [n for shipped in catalogue.SHIPPED.values() for n in shipped]
    names += [n for n, entry in catalogue.CONFIGURED.items() if entry.folder is not None]
    failed = zerogpu.preload(names, store.get_model)
    print(f"[attention-atlas] ZeroGPU: {len(names) - len(failed)} models loaded at start-up"
          + "".join(f"; {n} not: {why[:200]}" for n, why in failed.items()), flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Attention Atlas: see what attention does inside Transformers.")
    ap.add_argument("--model", action="append", default=[], metavar="DIR",
                    help="also offer the model in this folder (a Hugging Face GPT-2 or LLaMA-family folder, or a "
                         "project checkpoint); repeat for more. ATLAS_MODELS (comma-separated) does the same.")
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
