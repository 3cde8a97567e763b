"""Generate's "Compress the cache" section (issue 72): a KV-cache press (models/decoding/compress.py) cuts the
context's cache at a ratio, and the model answers from the cut cache beside the full one. Shows the context shaded by
how many (layer, key-value head) pairs keep each token, the kept/evicted mask over layers × positions, the two
answers side by side and the per-step divergence. The button is the API action ``/compress_cache``; a new layer
choice redraws from the kept result without running the model."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np

from serving import batcher, runs
from tabs.common import FAST, MAX_TEXT_CHARS, Error, Plot, read_text
from viz import kvcache as vk
from viz.text import token_highlight

TEXT = """### Compress the cache: which tokens can the model forget?
Long contexts are served with a cut KV cache: after the prompt is read, a *press* keeps only part of each layer's
keys and values (per key-value head) and the answer is generated from what is left. Each press decides from the
model's own attention or keys: **StreamingLLM** keeps the first tokens (attention sinks) and the most recent ones;
**ObservedAttention** (H2O) the keys that received the most attention over the whole context; **SnapKV** and
**PyramidKV** (fewer keys in later layers) those the last *window* queries attend to; **TOVA** those the last token
attends to; **Knorm** the keys of lowest norm; **ExpectedAttention** those that future queries, modelled from the
context's own queries, are expected to attend to. *Per-head budgets* (AdaKV) spend a layer's budget unevenly across
its heads. The scores follow NVIDIA's kvpress. The question is read whole after the cut; both answers are greedy.
The bars show, at each step of the full answer, how far the compressed cache's next-token distribution is from the
full cache's (KL divergence) and whether their top tokens agree."""
EXAMPLE_CONTEXT = ("The secret word is apple. A man in a blue shirt is riding a bicycle down the street. Two dogs "
                   "play in the snow. A woman is reading a book in the park. Children are running on the beach.")
EXAMPLE_QUESTION = " The secret word is"
# the presses by their labels (models.decoding.compress.LABELS, which imports torch: the page is built without it)
CHOICES = {"StreamingLLM (sinks + recent)": "streaming_llm", "ObservedAttention (H2O)": "observed_attention",
           "SnapKV": "snapkv", "TOVA": "tova", "Knorm (key norm)": "knorm", "PyramidKV": "pyramidkv",
           "ExpectedAttention": "expected_attention"}
EVERY = "every layer"
# what bench/kv_compression.py measured, committed (a fixed file of the repository, never a user's path)
MEASURED = Path(__file__).resolve().parents[2] / "docs" / "kv-compression.json"
MODEL_NAMES = {"smollm2": "SmolLM2-135M-Instruct", "gemma3": "Gemma-3-270M"}
TASK_NAMES = {"needle": "needle in a haystack", "qa": "short QA"}


def measured(path: Path = MEASURED) -> dict[str, tuple[dict, dict, str]]:
    """The bench's results by choice label ("SmolLM2-135M-Instruct · needle in a haystack"): (model entry, task
    entry, command); empty when the file is missing or unreadable (the section then says so)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    out = {}
    models = data.get("models") or {}
    order = list(MODEL_NAMES)
    for model in sorted(models, key=lambda m: (order.index(m) if m in order else len(order), m)):
        entry = models[model]
        for task, res in (entry.get("tasks") or {}).items():
            if res.get("rows"):
                label = f"{MODEL_NAMES.get(model, model)} · {TASK_NAMES.get(task, task)}"
                out[label] = (entry, res, str(entry.get("command") or data.get("command") or ""))
    return out


def measured_view(choice: str | None, results: dict | None = None):
    """The accuracy-against-ratio figure and its caption for one (model, task) of the bench's results."""
    results = measured() if results is None else results
    if not results:
        return None, ("No measured results: `python bench/kv_compression.py --out docs/kv-compression.json` "
                      "writes them.")
    if choice not in results:
        choice = next(iter(results))
    entry, res, command = results[choice]
    fig = vk.accuracy_curves(res["rows"], res["full_accuracy"],
                             title=f"{choice}: accuracy against the compression ratio<br><sup>{res['items']} items, "
                                   f"{res['context_tokens']:.0f} context tokens on average; ratio 0 is the full "
                                   "cache</sup>")
    note = (f"**{choice}** (measured {entry.get('date', '')}): {res['items']} items, full-cache "
            f"accuracy {res['full_accuracy']:.2f}. Made by `{command}` (bench/kv_compression.py; greedy answers of "
            "at most 12 tokens, the question read whole after the cut as in kvpress). Hover a point for the mean "
            "KL and the tokens each (layer, key-value head) kept.")
    return fig, note


def section(model: gr.Dropdown, new_tokens: gr.Slider, resolve: Callable[..., Any]) -> None:
    """The section, closed until opened; ``model`` and ``new_tokens`` are the tab's controls, ``resolve(name)`` the
    tab's checked model loader."""
    with gr.Accordion("Compress the cache (KV-cache presses)", open=False, elem_id="generate-kv"):
        gr.Markdown(TEXT)
        context = gr.Textbox(label="context (compressed)", value=EXAMPLE_CONTEXT, lines=3,
                             elem_id="generate-kv-context")
        question = gr.Textbox(label="question (read whole after the cut; may be empty)", value=EXAMPLE_QUESTION)
        with gr.Row():
            press = gr.Dropdown(list(CHOICES), value="SnapKV", label="press", min_width=260)
            ratio = gr.Slider(0.0, 0.95, value=0.5, step=0.05, label="compression ratio (share removed)")
            per_head = gr.Checkbox(False, label="per-head budgets (AdaKV)")
            window = gr.Number(8, precision=0, label="observation window (SnapKV, PyramidKV; kvpress: 64)")
            run = gr.Button("Compress and answer", variant="primary")
        note = gr.Markdown(elem_id="generate-kv-note")
        answers = gr.HTML(elem_id="generate-kv-answers")
        pick = gr.Dropdown([EVERY], value=EVERY, label="kept by")
        shaded = gr.HTML(elem_id="generate-kv-text")
        mask = Plot(label="kept and evicted positions", elem_id="generate-kv-mask")
        steps = Plot(label="divergence per step", elem_id="generate-kv-kl")
        with gr.Accordion("the numbers (JSON)", open=False):
            numbers = gr.JSON(elem_id="generate-kv-json")
        state = gr.State()
        results = measured()
        with gr.Accordion("Measured: accuracy against the compression ratio (bench/kv_compression.py)", open=False,
                          elem_id="generate-kv-measured"):
            which = gr.Radio(list(results), value=next(iter(results), None), label="model and task",
                             elem_id="generate-kv-measured-choice")
            fig, caption = measured_view(which.value, results)
            measured_note = gr.Markdown(caption, elem_id="generate-kv-measured-note")
            measured_plot = Plot(fig, label="accuracy against the ratio", elem_id="generate-kv-measured-plot")
    run.click(partial(compress_cache, resolve=resolve),
              [context, question, model, press, ratio, per_head, window, new_tokens],
              [note, answers, shaded, mask, steps, pick, state, numbers], api_name="compress_cache",
              concurrency_limit=1)
    pick.input(redraw, [state, pick], [shaded, mask], api_name=False, **FAST)
    which.input(lambda c: measured_view(c)[::-1], [which], [measured_note, measured_plot], api_name=False, **FAST)


def _layer(pick: str | None, layers: int) -> int | None:
    if not pick or pick == EVERY:
        return None
    try:
        layer = int(str(pick).split()[-1])
    except ValueError:
        raise Error(f"Not a layer: {pick!r}.") from None
    if not 0 <= layer < layers:
        raise Error(f"layer {layer} is not one of the model's {layers} layers")
    return layer


def views(state: dict, pick: str | None) -> tuple[str, Any]:
    """The shaded context and the heatmap for the kept result and a layer choice."""
    mask, tokens = state["mask"], state["tokens"]
    layer = _layer(pick, mask.shape[0])
    chosen = mask if layer is None else mask[layer:layer + 1]
    counts = chosen.sum((0, 1))
    total = chosen.shape[0] * chosen.shape[1]
    who = "every layer's key-value heads" if layer is None else f"layer {layer}'s key-value heads"
    html = token_highlight(tokens, counts, vmax=float(total),
                           title=f"How many of {who} keep each context token (of {total}; hover for the count)")
    return html, vk.kept_map(mask, tokens, layer)


def redraw(state: dict | None, pick: str | None):
    if not state:
        raise Error("Compress a cache first: the views are drawn from its kept positions.")
    return views(state, pick)


def compress_cache(context: str, question: str = EXAMPLE_QUESTION, model: str = "", press: str = "SnapKV",
                   ratio: float = 0.5, per_head: bool = False, window: float = 8, new_tokens: int = 20,
                   resolve: Callable[..., Any] | None = None):
    """Read the context, cut its cache with the press, answer from both caches: (note, answers, shaded context,
    kept map, divergence, layer choices, state, numbers)."""
    from models.decoding import compress as C

    if not str(context or "").strip():
        raise Error("Give a context to compress.")
    context = read_text(context)
    name = CHOICES.get(str(press), str(press))
    if name not in C.PRESSES:
        raise Error(f"press must be one of {', '.join(CHOICES)}")
    try:
        ratio, window = float(ratio), int(window if window is not None else 64)
    except (TypeError, ValueError):
        raise Error("The ratio and the window must be numbers.") from None
    net = resolve(model) if resolve is not None else None
    if net is None:
        raise Error("No model to run.")
    p = C.Press(name, ratio, per_head=bool(per_head), window=window)
    try:
        ids = C.encode(net, context)
        runs.check_memory(net, 2 * (len(ids) + int(new_tokens or 1)))  # the store, and the full arm's copy
        with batcher.heavy():
            cmp = C.compare(net, ids, str(question or "")[:MAX_TEXT_CHARS], p, max_new_tokens=int(new_tokens or 20))
    except (ValueError, runs.TooLarge) as err:
        raise Error(str(err), duration=None) from None
    tokens = cmp.full.tokens[:cmp.context_len]
    state = {"mask": cmp.kept.mask, "tokens": tokens}
    layers = cmp.kept.mask.shape[0]
    shaded, heat = views(state, EVERY)
    n = cmp.kept.mask.shape[-1]
    kept = cmp.kept.mask.sum(-1)
    steps = len(cmp.full.steps)
    agree = int(cmp.agree.sum())
    span = f"{kept.min()}" if kept.min() == kept.max() else f"{kept.min()}–{kept.max()}"
    note = (f"**{C.LABELS[name]}{' with per-head budgets (AdaKV)' if per_head else ''}** at ratio {ratio:.2f}: of "
            f"{n} context tokens each layer keeps {span} per key-value head ({cmp.kept.share():.0%} "
            f"of the cache). Top tokens agree at {agree} of {steps} steps; mean KL {float(np.mean(cmp.kl)):.4f} nats; "
            + ("the two answers are the same." if cmp.parted is None else f"the answers part at step {cmp.parted}."))
    full_new = cmp.full.tokens[len(cmp.full.ids) - len(cmp.full.steps):]
    comp_new = cmp.compressed.tokens[len(cmp.compressed.ids) - len(cmp.compressed.steps):]
    html = vk.answers(full_new, comp_new, cmp.parted)
    choices = [EVERY] + [f"layer {i}" for i in range(layers)]
    return (note, html, shaded, heat, vk.divergence(cmp.kl, cmp.agree, cmp.parted, full_new),
            gr.update(choices=choices, value=EVERY), state, C.summary(cmp))
