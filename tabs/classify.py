"""Classify: sentiment (SST-2) or news topic (AG News) with a Transformer encoder trained from scratch or the
pretrained MiniLM fine-tuned here (`checkpoints/sst2`, `agnews`, `minilm-sst2`, `minilm-agnews`)."""

from __future__ import annotations

from functools import partial

import gradio as gr
import numpy as np

from examples import sentences
from serving import catalogue
from serving.batcher import batch_events, heavy
from serving.catalogue import checkpoint_labels, offered
from serving.store import batched
from tabs.common import (
    EXPLANATIONS,
    FAST,
    MAX_TEXT_CHARS,
    VIEWS,
    Error,
    Plot,
    attention_figure,
    attribute,
    completeness,
    controls_for,
    deletion_plot,
    fit,
    get_model,
    head_choices,
    head_index,
    index,
    intro,
    layer_head_view,
    method_id,
    model_choice,
    parse_head,
    read_text,
    run_layer,
    save_npz,
    stats_figure,
    target_index,
)
from tabs.permalink import Permalink, chain, one_of
from tabs.sections import compare as compare_section
from tabs.sections import patching as patch_section
from tabs.sections import qk, why
from tabs.sections import text as text_section
from tabs.zerogpu import on_gpu
from viz import attribution as vattr
from viz import images as vi

TITLE = "Classify"
INTRO = """**Sentiment (SST-2) or news topic (AG News) from a Transformer encoder**: a small one trained
from scratch, or MiniLM, pretrained on a billion sentence pairs and fine-tuned here. The sentence is coloured by
*attention rollout* (attention multiplied through all layers, Abnar & Zuidema 2020): roughly, which words reach
the classifier. The "where each head looks" chart finds the classic pretrained patterns: heads that park on
`[CLS]` or `[SEP]`, and heads that look at the previous or the next word (Clark et al. 2019).

**Attention is not explanation** (Jain & Wallace 2019): it shows where the model looks, not what its answer
depends on. Attribution (gradient × input, integrated gradients, gradient-weighted relevance) measures how the
answer changes with each word, and the *deletion curve* tests every method on this very input: delete the words
a method ranks highest and watch the class probability; the faster it falls, the more faithful the ranking.

*Why* (under the attention map) splits one cell's score into the parts of the model that make its query and its
key: it shows which parts meet, not that the head matters. *Patching* copies one head's output (or one position of
the residual stream) from a clean into a corrupted sentence and measures how much of the clean class comes back:
it shows where the difference between the two sentences is carried, not what the head does elsewhere.

**Real classifiers can be picked as the model**: `distilbert/distilbert-base-uncased-finetuned-sst-2-english`
(DistilBERT fine-tuned on SST-2) and `cardiffnlp/twitter-roberta-base-sentiment-latest` (RoBERTa, negative / neutral /
positive), downloaded from the Hugging Face Hub on first use, and any RoBERTa, DistilBERT,
ELECTRA, ALBERT, BERT or DeBERTa-v2/v3 sequence classifier the server is configured with. For ALBERT the layers of the
model view are passes of one shared layer; for DeBERTa *why* splits a score into content and relative-position terms."""
TASKS = {"SST-2 sentiment": "sst2", "AG News topic": "agnews"}
TEXT_MODELS = {"trained from scratch": "", "MiniLM (pretrained, fine-tuned)": "minilm-"}
CHECKPOINTS = catalogue.SHIPPED["classify"]  # each is TEXT_MODELS[model] + TASKS[task] (checkpoint_name)
ENCODER = "Encoder self-attention"
# [clean, corrupted]: one word swapped, the same number of tokens for every model of the task
PATCH_EXAMPLES = [["a warm , funny and beautifully acted film", "a cold , dull and badly acted film"],
                  ["The team won the championship game on Sunday night",
                   "The company won the contract deal on Sunday night"]]


def build() -> Permalink:
    intro(INTRO, *CHECKPOINTS, kind="classify")
    with gr.Row():
        text = gr.Textbox(label="text", value=sentences.SENTIMENT[0], lines=2, scale=4, max_length=MAX_TEXT_CHARS)
        with gr.Column(scale=1):
            task = gr.Radio(list(TASKS), value="SST-2 sentiment", label="task")
            model = model_choice(gr.Radio([*TEXT_MODELS, *offered("classify")], value="trained from scratch",
                                         label="model"))
            run = gr.Button("Classify", variant="primary")
    gr.Examples([[s, "SST-2 sentiment"] for s in sentences.SENTIMENT]
                + [[s, "AG News topic"] for s in sentences.TOPIC], [text, task])
    with gr.Row():
        verdict = gr.Markdown()
        probs = Plot(label="class probabilities")
    with gr.Row():
        explanation = gr.Dropdown([(shown, key) for key, shown in EXPLANATIONS.items()], value="rollout",
                                  label="explanation (colours the text)", scale=2)
        target = gr.Dropdown(class_choices("SST-2 sentiment", "trained from scratch"), value="", scale=1,
                             allow_custom_value=True,  # the API names any class; the handler checks it
                             label="explain the class")
    highlight = gr.HTML(elem_classes=["highlight"])
    curve = Plot(label="deletion curve: every explanation on this input")
    layer, head, view = layer_head_view(VIEWS, "heatmap")
    attn = Plot(label="attention", elem_id="classify-attention")
    state = gr.State()
    clear_b = compare_section.comparison("classify", state, compare_view, lambda text, *v: classify(text, *v)[5],
                                         [task, model], layer, head, view)
    why_section = why.decomposition("classify", state, sequence, layer, head, [view])
    qk_section = qk.section("classify", state, sequence, query_default=0)  # the query the classifier reads
    stats = Plot(label="where each head looks")
    patch_section.patching("classify", checkpoint_name, [task, model], PATCH_EXAMPLES, why_section)
    download = gr.File(label="attention arrays (.npz)")
    layer_asked = run_layer()
    inputs = [text, task, model, layer_asked, head, view, explanation, target]
    outputs = [verdict, probs, highlight, attn, stats, state, download, layer, head]
    why_controls = [why_section["layer"], why_section["head"], why_section["query"]]
    steps = [(classify, inputs, outputs), clear_b,  # the answer first; then every method's deletion curve
             (why_controls_for, [state], why_controls, {"show_progress": "hidden"}), qk_section.follow,
             (deletion_plot, [state, explanation], [curve])]
    chain(run.click, steps, api_name="classify", **batch_events("classify"))
    chain(text.submit, steps, **batch_events("classify"))
    for control in (layer, head, view):
        control.change(draw_attention, [state, layer, head, view], [attn, stats], api_name=False,
                       show_progress="hidden", **FAST)
    explanation.change(recolour, [state, explanation], [highlight, curve], api_name=False, show_progress="minimal")
    # the classes offered follow the model (a link's choice included, so .change); a person's choice re-explains
    for control in (task, model):
        control.change(target_update, [task, model, target], [target], api_name=False, show_progress="hidden")
    # a configured or Hub classifier has its own labels: the SST-2 / AG News choice does not apply to it
    model.change(task_shown, [model], [task], api_name=False, show_progress="hidden", **FAST)
    chain(target.input, steps)
    # another model or task chosen: the figures of the one before are taken down (a model that then fails to load
    # leaves no other model's verdict under its name)
    for control in (task, model):
        control.input(model_changed, [task, model, state],
                      [verdict, probs, highlight, attn, stats, state, download, curve], api_name=False,
                      show_progress="hidden", **FAST)
    return Permalink({"text": text, "task": task, "model": model, "explanation": explanation,
                      "target": one_of(target, lambda: checkpoint_labels(*CHECKPOINTS, *offered("classify"))),
                      "show": view}, steps, after={"layer": layer, "head": head}, state=state, limits=link_limits,
                     preset={"layer": layer_asked, "head": head})


def model_changed(task: str, model: str, state: dict | None = None) -> tuple:
    """The outputs once another model or task is chosen: a line saying so, every figure and the kept result empty.
    Run queued behind a Classify of this very choice (a loaded server: the click came before this event ran), the
    answer now kept is this choice's and stays (the state is read when the event runs)."""
    try:
        answered = bool(state) and state["model"] == checkpoint_name(task, model)
    except Error:
        answered = False
    if answered:
        return tuple(gr.skip() for _ in range(8))
    said = f"*{model} · {task} chosen: press **Classify** to see its answer.*"
    return said, None, "", None, None, None, None, None


def link_limits(state: dict) -> dict:
    """What a link's layer and head may be for a kept result."""
    amap = state["result"].attention["encoder"]
    return {"layer": range(amap.layers), "head": head_choices(amap.heads)}


def sequence(state: dict) -> tuple[str, list[int], list[str]]:
    """What the "why" section splits: the kept input, encoded exactly as the classifier read it."""
    ids, tokens, _ = text_section.encode(get_model(state["model"]), state["input"])
    return state["model"], ids, tokens


def compare_view(state: dict) -> dict:
    """What the compare toggle draws of a kept result: its attention and the class probabilities."""
    result = state["result"]
    return {"amap": result.attention["encoder"], "values": result.probs, "classes": list(result.labels),
            "kind": ENCODER}


def why_controls_for(state: dict | None):
    """The "why" section's layer, head and query follow the last result ([CLS] / <s> as the query)."""
    if not state:
        return gr.update(), gr.update(), gr.update()
    amap = state["result"].attention["encoder"]
    layer_u, head_u, _ = why.controls(amap.layers, amap.heads, len(amap.queries))
    return layer_u, head_u, gr.update(value=0)


def class_choices(task: str, model: str) -> list[tuple[str, str]]:
    """The classes the chosen model can be asked to explain (read from its config.json, no torch), after "the
    predicted class" (the empty value)."""
    labels = checkpoint_labels(checkpoint_name(task, model))
    return [("the predicted class", ""), *[(label, label) for label in labels]]


def target_update(task: str, model: str, target: str):
    """The class choices of the model now chosen; the chosen class stays if this model has it."""
    choices = class_choices(task, model)
    keep = target if target in [value for _, value in choices] else ""
    return gr.update(choices=choices, value=keep)


def task_shown(model: str):
    """The task choice is shown for the project's own models (a checkpoint per task) and hidden for the others,
    which read their own labels (``checkpoint_name`` ignores the task for them)."""
    return gr.update(visible=model in TEXT_MODELS)


def checkpoint_name(task: str, model: str) -> str:
    """The checkpoint behind the two choices: a configured model by its name (its own labels: the task is
    ignored), else the task's checkpoint of the chosen family. An unknown model or task (the API, a link or a caller
    may pass any string) is refused by name, so no input ever becomes part of a path or another model's answer."""
    if model in offered("classify"):  # configured, or a Hub model offered for download on first use
        return model
    if model not in TEXT_MODELS:
        known = ", ".join([*TEXT_MODELS, *offered("classify")])
        raise Error(f"Unknown model {str(model)[:60]!r}; choose one of {known}.")
    if task not in TASKS:
        raise Error(f"Unknown task {str(task)[:60]!r}; choose one of {', '.join(TASKS)}.")
    return TEXT_MODELS[model] + TASKS[task]


@on_gpu  # a ZeroGPU Space attaches its GPU for this call (tabs/zerogpu.py)
def classify(text: str, task: str = "SST-2 sentiment", model: str = "trained from scratch", layer: int = -1,
             head: str = "mean", view: str = "heatmap", explanation: str = "rollout", target: str = "",
             progress=gr.Progress()):
    """Classify a text; return the probabilities, the text coloured by the chosen explanation toward the target
    class (the predicted one by default), and the attention figures."""
    text = read_text(text)
    method = method_id(explanation)
    name = checkpoint_name(task, model)  # a configured model's own labels replace the task's
    net = get_model(name, lambda done, what: progress(done, desc=what))  # a Hub model is fetched once
    finish = partial(_classified, net, name, text, method, target, layer, head, view, progress)
    if method in CHEAP:  # drawn in the batch's thread (serving.store.batched), with the requests arriving now
        return batched(name, "classify", classify_batch, net, text, finish=finish)
    result = batched(name, "classify", classify_batch, net, text)
    with heavy():  # a gradient explanation is not batched: ATLAS_CONCURRENCY at once
        return finish(result)


def _classified(net, name: str, text: str, method: str, target: str, layer: int | None, head: str, view: str,
                progress, result):
    """classify's outputs for one result: the verdict, the explanation, the figures (at ``layer``, −1: the last)
    and the download."""
    amap = result.attention["encoder"]
    layer, head = index(layer, amap.layers, "layer"), head_index(head, amap.heads)
    layer_u, head_u = controls_for(amap.layers, amap.heads, layer, head)
    top = int(np.argmax(result.probs))
    verdict = f"**{result.labels[top]}** ({result.probs[top]:.1%})"
    if result.notice:
        verdict += f"\n\n{result.notice}"
    if getattr(net.config, "shared_layers", False):  # ALBERT: say it where the layers are shown
        verdict += (f"\n\n*{net.config.family.upper()} shares one layer's weights across all {net.config.n_layers} "
                    "passes: the layers of the model view, the head statistics and the head roles are passes of the "
                    "same weights, repeated.*")
    state = {"result": result, "model": name, "input": text, "target": target_index(target, result.labels),
             "attributions": {}}
    attribution = attribute(state, method, progress)
    from models.inspect.decompose import attention_scores

    ids, _, _ = text_section.encode(net, text)
    npz = save_npz(name, encoder=amap.weights, scores=attention_scores(net, ids), tokens=amap.queries,
                   probs=result.probs, labels=result.labels,
                   attribution=attribution.values.astype(np.float32), attribution_method=method,
                   attribution_target=attribution.label)
    return (verdict, fit(vi.topk_bars(result.labels, result.probs, k=len(result.labels), title="Class probabilities")),
            colouring(attribution), *draw_attention(state, layer, head, view), state, npz, layer_u, head_u)


CHEAP = ("attention", "rollout")  # explanations read from the kept attention (no model run)


def classify_batch(model, texts: list[str]) -> list:
    """Several texts through one classifier in batched passes (``EncoderClassifier.classify_many``); each answer
    equals that text's own ``classify``, a refused input's answer is its exception."""
    if hasattr(model, "classify_many"):
        return model.classify_many(texts)
    answers: list = []
    for text in texts:
        try:
            answers.append(model.classify(text))
        except Exception as err:
            answers.append(err)
    return answers


def draw_attention(state, layer: int, head: str, view: str):
    """The attention figure and where each head looks, from the kept result (no model run)."""
    if not state:
        return None, None
    amap = state["result"].attention["encoder"]
    return attention_figure(amap, ENCODER, layer, parse_head(head), view), stats_figure(amap, ENCODER)


def colouring(attribution) -> str:
    """The text, sub-word pieces merged into words, coloured by one explanation toward its class (attention and
    rollout are for no class: they say so, on a one-sided scale)."""
    free = attribution.method in CLASS_FREE
    title = (f"{EXPLANATIONS[attribution.method]} · the same for every class (p({attribution.label}) = "
             f"{attribution.prob:.1%})" if free else
             f"{EXPLANATIONS[attribution.method]} toward {attribution.label} ({attribution.prob:.1%})")
    if attribution.method in ("rollout", "attention", "relevance"):
        title += " · read from " + ("the position the classifier reads" if attribution.pooling == "cls"
                                    else "every token (the classifier reads their mean)")
    title += completeness(attribution)
    return vattr.signed_highlight(attribution.tokens, attribution.values, title=title, signed=not free)


CLASS_FREE = ("attention", "rollout")  # read from the attention alone: the same map whatever class is asked about


@on_gpu  # a ZeroGPU Space attaches its GPU for this call (tabs/zerogpu.py)
def recolour(state, explanation: str, progress=gr.Progress()):
    """Another explanation: colour the text by it (each is computed once per input) and mark it on the curve."""
    if not state:
        return None, None
    attribution = attribute(state, method_id(explanation), progress)
    return colouring(attribution), deletion_plot(state, explanation, progress)
