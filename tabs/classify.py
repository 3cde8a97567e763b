"""Classify: sentiment (SST-2) or news topic (AG News) with a Transformer encoder trained from scratch or the
pretrained MiniLM fine-tuned here (`checkpoints/sst2`, `agnews`, `minilm-sst2`, `minilm-agnews`)."""

from __future__ import annotations

import gradio as gr
import numpy as np

from examples import sentences
from tabs.common import (
    FAST,
    MAX_TEXT_CHARS,
    VIEWS,
    attention_figure,
    configured,
    controls_for,
    fit,
    get_model,
    intro,
    layer_head_view,
    parse_head,
    read_text,
    save_npz,
    stats_figure,
)
from viz import images as vi
from viz import text as vt

TITLE = "Classify"
INTRO = """**Sentiment (SST-2) or news topic (AG News) from a Transformer encoder**: a small one trained
from scratch, or MiniLM, pretrained on a billion sentence pairs and fine-tuned here. The sentence is coloured by
*attention rollout* (attention multiplied through all layers, Abnar & Zuidema 2020): roughly, which words reach
the classifier. The "where each head looks" chart finds the classic pretrained patterns: heads that park on
`[CLS]` or `[SEP]`, and heads that look at the previous or the next word (Clark et al. 2019)."""
TASKS = {"SST-2 sentiment": "sst2", "AG News topic": "agnews"}
TEXT_MODELS = {"trained from scratch": "", "MiniLM (pretrained, fine-tuned)": "minilm-"}
CHECKPOINTS = tuple(prefix + task for prefix in TEXT_MODELS.values() for task in TASKS.values())
ENCODER = "Encoder self-attention"


def build() -> None:
    intro(INTRO, *CHECKPOINTS, kind="classify")
    with gr.Row():
        text = gr.Textbox(label="text", value=sentences.SENTIMENT[0], lines=2, scale=4, max_length=MAX_TEXT_CHARS)
        with gr.Column(scale=1):
            task = gr.Radio(list(TASKS), value="SST-2 sentiment", label="task")
            model = gr.Radio([*TEXT_MODELS, *configured("classify")], value="trained from scratch", label="model")
            run = gr.Button("Classify", variant="primary")
    gr.Examples([[s, "SST-2 sentiment"] for s in sentences.SENTIMENT]
                + [[s, "AG News topic"] for s in sentences.TOPIC], [text, task])
    with gr.Row():
        verdict = gr.Markdown()
        probs = gr.Plot(label="class probabilities")
    highlight = gr.HTML(elem_classes=["highlight"])
    layer, head, view = layer_head_view(VIEWS, "heatmap")
    attn = gr.Plot(label="attention")
    stats = gr.Plot(label="where each head looks")
    state = gr.State()
    download = gr.File(label="attention arrays (.npz)")
    inputs = [text, task, model, layer, head, view]
    outputs = [verdict, probs, highlight, attn, stats, state, download, layer, head]
    run.click(classify, inputs, outputs, api_name="classify")
    text.submit(classify, inputs, outputs, api_name=False)
    for control in (layer, head, view):
        control.change(draw_classification, [state, layer, head, view], [highlight, attn, stats], api_name=False,
                       show_progress="hidden", **FAST)


def checkpoint_name(task: str, model: str) -> str:
    """The checkpoint behind the two choices: a configured model by its name (its own labels: the task is
    ignored), else the task's checkpoint of the chosen family; anything unknown (the API takes any string)
    falls back to the first choice, so no input ever becomes part of a path."""
    if model in configured("classify"):
        return model
    return TEXT_MODELS.get(model, "") + TASKS.get(task, "sst2")


def classify(text: str, task: str = "SST-2 sentiment", model: str = "trained from scratch", layer: int = -1,
             head: str = "mean", view: str = "heatmap", progress=gr.Progress()):
    """Classify a text; return the probabilities, the highlighted text and the attention figures."""
    text = read_text(text)
    name = checkpoint_name(task, model)  # a configured model's own labels replace the task's
    result = get_model(name, lambda done, what: progress(done, desc=what)).classify(text)  # Hub: fetched once
    amap = result.attention["encoder"]
    layer_u, head_u = controls_for(amap.layers, amap.heads)
    top = int(np.argmax(result.probs))
    verdict = f"**{result.labels[top]}** ({result.probs[top]:.1%})"
    if result.notice:
        verdict += f"\n\n{result.notice}"
    npz = save_npz(name, encoder=amap.weights, tokens=amap.queries, probs=result.probs, labels=result.labels)
    figs = draw_classification(result, amap.layers - 1, head, view)
    return (verdict, fit(vi.topk_bars(result.labels, result.probs, k=len(result.labels), title="Class probabilities")),
            *figs, result, npz, layer_u, head_u)


def draw_classification(result, layer: int, head: str, view: str):
    """The tokens coloured by what the classifier reads, the attention figure and where each head looks."""
    if result is None:
        return None, None, None
    from models.analysis import pooled_rollout

    amap = result.attention["encoder"]
    if result.pooling == "cls":
        what = f"rollout from {amap.queries[0]} (the position the classifier reads)"
    else:
        what = "rollout averaged over every token (the classifier reads their mean)"
    html = vt.token_highlight(amap.queries, pooled_rollout(amap.weights, result.pooling),
                              title=f"Attention rollout: {what}")
    return (html, attention_figure(amap, ENCODER, layer, parse_head(head), view), stats_figure(amap, ENCODER))
