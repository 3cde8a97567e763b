"""What the server does around start-up, so that no first request pays for it: the first Plotly figure's cost before
serving, the model stack imported in a background thread after (app.main), and on a ZeroGPU Space the models loaded in
the main process."""

from __future__ import annotations

import importlib

import gradio as gr

from serving import catalogue

# What a first Translate, Classify, Generate or Vision request imports (measured: 5–9 s of torch and the families on
# a busy 2-core machine), imported by warm_stack in the background once the page is served.
WARM_MODULES = ("torch", "safetensors.torch", "models.io.checkpoint", "models.inputs.images", "models.io.placement",
                "models.io.hf", "models.families.translator", "models.families.classifier", "models.families.gpt",
                "models.families.vit", "models.families.swin", "models.blocks.loop", "models.decoding.fastgen",
                "models.decoding.packed", "models.analysis", "models.inspect.attribution",
                "models.calibration", "serving.store")


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
        try:  # the configured folders checked as their loads would (no weight read): a broken one refused now
            catalogue.check_configured()
        except Exception:  # noqa: BLE001 (best effort: the folder's own load reports it)
            pass
    return failed


def preload_for_zero_gpu() -> None:
    """On a ZeroGPU Space, load the shipped models and the configured folders now, in the main process, where
    ZeroGPU expects them moved to the GPU (tabs/zerogpu.py); elsewhere nothing (models load on first use)."""
    from serving import catalogue, store
    from tabs import zerogpu

    if not zerogpu.ZERO_GPU:
        return
    names = [n for shipped in catalogue.SHIPPED.values() for n in shipped]
    names += [n for n, entry in catalogue.CONFIGURED.items() if entry.folder is not None or entry.gguf]
    failed = zerogpu.preload(names, store.get_model)
    print(f"[attention-atlas] ZeroGPU: {len(names) - len(failed)} models loaded at start-up"
          + "".join(f"; {n} not: {why[:200]}" for n, why in failed.items()), flush=True)
