"""The Q/K scatter section that the text tabs (Translate's encoder, Classify, Generate) include: one head's queries
and keys as two point sets in one plane, AttentionViz-style (`models.inspect.qk`, `viz.qk`).

A tab calls ``section(tab, state, sequence)`` inside its layout, with the function that turns its kept Result into
(model name, token ids, token labels), the same one its "why" section uses (Translate passes its English text box:
the state its "why" section reads is set by the page's run chain, which an API call does not run), and adds
``section(...).follow`` to the steps its main button chains, so the section's ranges follow each run (and a figure
already drawn is redrawn on the new input). Nothing runs until the section is opened or its button pressed; the
vectors of a layer are kept for the last few inputs (``CACHE_MB``), so choosing another head or query runs no model.
The button is the API action ``/<tab>_qk``: after the tab's own action in the same session (as ``/ablate_head``
after ``/generate``); Translate's takes the English text first."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gradio as gr
import numpy as np

from models import registry
from tabs.common import Error, Plot, get_model, index, read_text, require_full
from viz import qk as vq
from viz.common import esc

TEXT = """### Queries and keys of one head
Each token's **query** (circle) and **key** (diamond) of the chosen head, as the model computes them (after the
projection biases; after RoPE in LLaMA-family models), drawn in one plane (AttentionViz, Yeh et al. 2023). Two
changes that leave the attention as it is make the picture readable: queries are multiplied and keys divided by the
same α, so both clouds spread alike, and every key is moved by one vector so the two centres coincide (which adds
a constant to a whole row of scores; the softmax ignores it). The plane is the first two principal axes of all the
points together. Click a point, or give a query position, to ring that query and draw lines to the keys it attends
to most. A query's score with a key is their dot product, not their distance: a key that lies far out in the
query's direction can get more weight than a nearer one, and two axes hold only part of the spread (the axis titles
say how much)."""
CACHE_MB = 256  # the vectors kept for recent (model, input, layer)s, all sessions together


@dataclass
class Section:
    """The section's controls and the step a tab's run chain adds (``follow``, its inputs and outputs)."""

    layer: gr.Number
    head: gr.Number
    query: gr.Number
    follow: tuple


# ------------------------------------------------------------------------------------------------ layout
def section(tab: str, state: gr.State, sequence: Callable[[Any], tuple[str, list[int], list[str]]],
            query_default: int = -1, extra: list | None = None) -> Section:
    """The section, closed until opened. ``state`` is the tab's kept input (what ``sequence`` reads);
    ``query_default``: the query ringed at first (−1: the last token; a classifier's [CLS] / <s> is 0); ``extra``:
    more of the tab's controls that say what to run (Translate's model), appended to the API action's inputs and
    handed to ``sequence`` with the state as one tuple ``(state, *extra)``."""
    extra = list(extra or [])

    def joined(st, ex):  # the state and the extra controls' values, as ``sequence`` reads them
        if not extra or not st or (isinstance(st, str) and not st.strip()):
            return st
        return (read_text(st) if isinstance(st, str) else st, *ex)

    drawn = gr.State(False)  # whether a figure is shown, so a new run redraws it
    with gr.Accordion("Queries and keys of one head (Q/K scatter)", open=False, elem_id=f"{tab}-qk-section") as box:
        gr.Markdown(TEXT)
        with gr.Row():
            # numbers, not sliders: an API call (/<tab>_qk) runs without the run chain that would set a slider's
            # range, and Gradio refuses a value over a slider's maximum; the handler checks the range in words
            layer = gr.Number(value=0, precision=0, label="layer")
            head = gr.Number(value=0, precision=0, label="head")
            query = gr.Number(value=query_default, precision=0, label="query position (−1: the last)")
            scale = gr.Checkbox(True, label="scale queries and keys to the same spread")
            run = gr.Button("Draw queries and keys")
        note = gr.Markdown()
        plot = Plot(label="queries and keys of the head", elem_id=f"{tab}-qk")
        # a click on a point writes "position,n" here (app.py's page script); hidden by CSS so the script finds it
        cell = gr.Textbox(elem_id=f"{tab}-qk-cell", elem_classes=["atlas-hidden"], show_label=False, container=False)

    def draw_state(st, lay, hd, q, sc, *ex):
        return (*draw(sequence, joined(st, ex), lay, hd, q, sc), True)

    args, outs = [state, layer, head, query, scale, *extra], [note, plot, drawn]
    run.click(draw_state, args, outs, api_name=f"{tab}_qk", concurrency_limit=2)
    def on_open(st, dr, *values):
        if not st:
            return gr.update(value="Run the model first: the view is drawn for the tab's current input."), None, False
        return draw_state(st, *values) if not dr else (gr.update(),) * 3

    def redraw(st, lay, hd, q, sc, *ex):  # a box being typed in (empty for a moment) waits for its number
        if not st or lay is None or hd is None or q is None:
            return (gr.update(),) * 3
        return draw_state(st, lay, hd, q, sc, *ex)

    box.expand(on_open, [state, drawn, layer, head, query, scale, *extra], outs, api_name=False,
               show_progress="minimal")
    for event in (layer.input, head.input, query.submit, scale.input):
        event(redraw, args, outs, api_name=False, show_progress="hidden")
    cell.change(lambda c: gr.update(value=clicked(c)), [cell], [query], api_name=False, show_progress="hidden"
                ).then(draw_state, args, outs, api_name=False, show_progress="hidden")

    def follow_state(st, dr, lay, hd, q, sc, *ex):
        return follow(sequence, joined(st, ex), dr, lay, hd, q, sc)

    return Section(layer, head, query, (follow_state, [state, drawn, layer, head, query, scale, *extra],
                                        [layer, head, query, note, plot], {"show_progress": "hidden"}))


# ---------------------------------------------------------------------------------------------- handlers


def clicked(cell: str) -> int:
    """The token position a click on a point wrote ("position,n")."""
    try:
        return int(str(cell).split(",")[0])
    except ValueError:
        raise Error(f"Not a point: {cell!r}.") from None


_CACHE: OrderedDict[tuple, tuple] = OrderedDict()
_LOCK = threading.Lock()


def layer_vectors(name: str, net: Any, ids: list[int], layer: int) -> tuple:
    """Every head's queries and keys of ``layer`` (H, T, d) and whether it is causal, kept for the last inputs."""
    from models.inspect.qk import qk_vectors

    key = (name, tuple(ids), layer)
    with _LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    try:
        q, k, causal = qk_vectors(net, ids, layer)
    except ValueError as err:
        raise Error(str(err)) from None
    value = (q.cpu(), k.cpu(), causal)
    with _LOCK:
        _CACHE[key] = value
        while len(_CACHE) > 1 and sum(v[0].nbytes + v[1].nbytes for v in _CACHE.values()) > CACHE_MB * 2**20:
            _CACHE.popitem(last=False)
    return value


def qk_view(name: str, ids: list[int], tokens: list[str], layer: Any, head: Any, query: Any,
            scale: bool = True) -> tuple[str, Any, Any]:
    """(note Markdown, figure, the QKProjection) of one head over a kept input."""
    from models.inspect.decompose import n_layers
    from models.inspect.qk import from_vectors

    net = get_model(name)
    if not ids:
        raise Error("The input has no tokens.")
    layer, head = index(layer, n_layers(net), "layer"), index(head, int(net.config.n_heads), "head")
    query = index(query, len(ids), "query position")
    q, k, causal = layer_vectors(name, net, list(ids), layer)
    terms = {}
    if registry.family_of(net).split == "relative_bias":  # T5: unscaled q·k plus each offset's bucket bias
        from models.families.t5 import encoder_qk

        terms = {"score_scale": 1.0, "bias": encoder_qk(net, list(ids), 0)[2][head]}
    p = from_vectors(q[head], k[head], layer, head, causal, bool(scale), **terms)
    subtitle = (f"{esc(name)} · {len(ids)} tokens · queries × α, keys ÷ α + c (α = {p.alpha:.2f}), PCA of both"
                if scale else f"{esc(name)} · {len(ids)} tokens · keys + c, not scaled, PCA of both")
    fig = vq.qk_scatter(p.points, tokens, p.weights, query=query, explained=p.explained, subtitle=subtitle,
                        title=f"Queries and keys · layer {layer} · head {head}")
    return words(p, tokens, query), fig, p


def words(p: Any, tokens: list[str], query: int) -> str:
    """What the figure shows, in two sentences: the axes' share and the chosen query's strongest keys."""
    row = p.weights[query]
    top = [int(j) for j in np.argsort(-row, kind="stable")[:3]]
    strongest = ", ".join(f"{j} `{tokens[j]}` ({row[j]:.2f})" for j in top)
    q_norm = float(np.linalg.norm(p.queries, axis=1).mean())
    k_norm = float(np.linalg.norm(p.keys, axis=1).mean())
    return (f"**Layer {p.layer}, head {p.head}** ({p.d_head} dimensions per vector; mean norms |q| {q_norm:.2f}, "
            f"|k| {k_norm:.2f}). The two axes hold {p.explained[0]:.0%} and {p.explained[1]:.0%} of the spread of "
            f"all {2 * len(tokens)} points. Query {query} `{tokens[query]}` attends most to {strongest}.")


def draw(sequence: Callable, state: Any, layer: Any, head: Any, query: Any, scale: bool) -> tuple[str, Any]:
    """The section's button (and redraws): the scatter over the tab's kept input (Translate: its English text)."""
    if not state or (isinstance(state, str) and not state.strip()):
        raise Error("Run the model first: queries and keys are drawn for the tab's current input.")
    name, ids, tokens = sequence(read_text(state) if isinstance(state, str) else state)
    require_full(len(ids), "The queries and keys view")
    note, fig, _ = qk_view(name, ids, tokens, layer, head, query, scale)
    return note, fig


def follow(sequence: Callable, state: Any, drawn: bool, layer: Any, head: Any, query: Any, scale: bool) -> tuple:
    """After a run: the layer and head boxes name the model's range and keep their values where they fit; a figure
    already drawn is drawn again on the new input."""
    from models.inspect.decompose import n_layers

    if not state or (isinstance(state, str) and not state.strip()):
        return (gr.update(),) * 5
    name, ids, tokens = sequence(read_text(state) if isinstance(state, str) else state)
    net = get_model(name)
    layers, heads = n_layers(net), int(net.config.n_heads)
    layer = index(layer, layers, "layer", default=0, fit=True)
    head = index(head, heads, "head", default=0, fit=True)
    updates = (gr.update(value=layer, label=f"layer (0–{layers - 1})"),
               gr.update(value=head, label=f"head (0–{heads - 1})"))
    query = query if query is not None and -len(ids) <= int(query) < len(ids) else -1  # kept where it fits
    if not drawn:
        return (*updates, gr.update(value=query), gr.update(), gr.update())
    note, fig, _ = qk_view(name, ids, tokens, layer, head, query, scale)
    return (*updates, gr.update(value=query), note, fig)
