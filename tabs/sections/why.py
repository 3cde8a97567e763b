"""Why a head attends (docs/ARCHITECTURE.md §2): the section under a text tab's attention figure. A clicked cell of a
head's heatmap (or the query/key boxes) splits that score into the parts of the residual stream
(`models.inspect.decompose`); "ablate the sink" forbids the head its first token. /attention_why serves the split for
plain text.

A tab calls `decomposition(...)` inside its own layout with a function that turns its kept Result into (model name,
token ids, token labels), so this section never imports a tab.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gradio as gr
import numpy as np

from models import registry
from tabs.common import FAST, Error, Plot, get_model, index, read_text, require_full
from tabs.sections.text import encode, require_heads, text_model
from tabs.zerogpu import on_gpu
from viz import why as vw
from viz.common import esc

WHY_TEXT = """### Why does this head attend there?
Click a cell of the heatmap above (one head, not the mean), or pick a query and a key below. The score
q·k/√d_k of that cell is split into the parts of the residual stream that make up the query and the key (token
and position embeddings, each earlier head, each earlier MLP, the biases), with every LayerNorm frozen at the scale
it computed on this input: the terms add up to the score exactly. It shows *which parts meet* in the dot product;
it does not say that the head would fail without them (for that, ablate or patch). DeBERTa's disentangled attention
is split into its own three terms instead: content→content, content→position and position→content."""


SINK_TEXT = """**Attention sinks.** Softmax has to put all of a row's weight somewhere, so a head with nothing useful
to read at a query parks it on a token every query can see and whose value adds little: the first token (an
*attention sink*, Xiao et al. 2023; BERT's heads do the same with `[CLS]` and `[SEP]`, Clark et al. 2019). The red
diamonds renormalise the row without it; "ablate the sink" forbids the head its first token during the forward
pass and measures what changes."""


MAX_TABLE_ROWS = 12


CLICKABLE = ("heatmap", "encoder")  # the view and the attention kind whose cells a click may split


def decomposition(tab: str, state: gr.State, sequence: Callable[[Any], tuple[str, list[int], list[str]]],
                  layer: gr.Slider, head: gr.Dropdown, shown: list, sink: bool = True) -> dict[str, Any]:
    """The "why does this head attend there" section under a tab's attention figure (whose ``elem_id`` is
    ``{tab}-attention``). ``sequence(state)`` gives the model name, ids and tokens of the kept Result; ``shown``
    are the controls that say what the figure draws (view, attention kind): a click counts only on a heatmap of
    the attention that is split (``CLICKABLE``); ``sink`` offers the sink ablation (models that have a forward
    ``edit``: the decoders and the classifiers)."""
    gr.Markdown(WHY_TEXT)
    with gr.Row():
        w_layer = gr.Slider(0, 1, value=0, step=1, label="layer")
        w_head = gr.Slider(0, 1, value=0, step=1, label="head")
        query = gr.Number(value=-1, precision=0, label="query position (−1: the last)")
        key = gr.Number(value=0, precision=0, label="key position")
        run = gr.Button("Split this score")
    summary = gr.Markdown()
    fig = Plot(label="the score split by residual-stream parts")
    gr.Markdown(SINK_TEXT if sink else sink_text_without_ablation())
    ablate = gr.Button("Ablate the sink (this head may not attend to the first token)", visible=sink)
    sink_note = gr.Markdown()
    with gr.Accordion("the score's terms as JSON", open=False):
        table = gr.JSON(label="score, components, softmax_row")
    # A click on the heatmap writes "query,key,n" here (the page script in app.py); hidden by CSS, not by visible=False,
    # so that it stays in the page for the script to find.
    cell = gr.Textbox(elem_id=f"{tab}-why-cell", elem_classes=["atlas-hidden"], show_label=False, container=False)
    # A click on a model-view thumbnail writes "layer,head,n" here: that head opens as a heatmap (its cells then split)
    thumb = gr.Textbox(elem_id=f"{tab}-open-head", elem_classes=["atlas-hidden"], show_label=False, container=False)
    if shown:  # the first control of what the figure draws is its view
        thumb.change(open_head, [thumb], [layer, head, shown[0]], api_name=False, show_progress="hidden", **FAST)

    def run_state(st, lay, hd, q, k):
        return explain(sequence, st, lay, hd, q, k)

    args = [state, w_layer, w_head, query, key]
    run.click(run_state, args, [summary, fig, table], api_name=False)
    cell.change(from_cell, [cell, layer, head, w_head, *shown], [w_layer, w_head, query, key], api_name=False,
               show_progress="hidden", **FAST).then(run_state, args, [summary, fig, table], api_name=False)
    ablate.click(lambda st, lay, hd: ablate_sink(sequence, st, lay, hd), [state, w_layer, w_head], [sink_note],
                 api_name=False)
    # the section follows the layer and the head the figure above shows, so the split and the ablation name the head
    # on screen before any cell is clicked (the mean or max of heads keeps the section's own head)
    layer.change(follow_layer, [layer], [w_layer], api_name=False, show_progress="hidden", **FAST)
    head.change(follow_head, [head], [w_head], api_name=False, show_progress="hidden", **FAST)
    return {"layer": w_layer, "head": w_head, "query": query, "cell": cell}


def follow_layer(layer) -> dict:
    """The section's layer slider set to the figure's layer."""
    try:
        return gr.update(value=int(layer))
    except (TypeError, ValueError):
        return gr.update()


def follow_head(head) -> dict:
    """The section's head slider set to the figure's head when one head is shown."""
    return gr.update(value=int(head)) if str(head).isdigit() else gr.update()


def sink_text_without_ablation() -> str:
    """The sinks paragraph for a section that offers no ablation (Translate): up to the renormalised row."""
    return SINK_TEXT.split("; \"ablate the sink\"")[0] + "."


def controls(layers: int, heads: int, tokens: int) -> tuple[dict, dict, dict]:
    """Updates of the section's layer and head sliders and query box after a model run."""
    return (gr.update(minimum=0, maximum=max(layers - 1, 1), value=layers - 1),
            gr.update(minimum=0, maximum=max(heads - 1, 1)), gr.update(value=tokens - 1))


def why(net, ids: list[int], tokens: list[str], layer, head, query, key, name: str = ""):
    """Decompose one score: (summary Markdown, figure, table dict). Positions and indices are checked here."""
    from models.inspect.decompose import decompose_score, n_layers

    require_heads(net, "\"Why a head attends\"")
    c = net.config
    layer, head = index(layer, n_layers(net), "layer"), index(head, c.n_heads, "head")
    query, key = index(query, len(ids), "query position"), index(key, len(ids), "key position")
    split = registry.family_of(net).split
    if split == "disentangled":  # DeBERTa: content and position terms, not residual parts
        return why_disentangled(net, ids, tokens, layer, head, query, key, name)
    if split == "relative_bias":  # T5: content plus the learned bias of the offset's bucket
        return why_relative_bias(net, ids, tokens, layer, head, query, key, name)
    if split is None:
        raise Error("\"Why a head attends\" has no score split for this model's family.")
    try:
        d = decompose_score(net, ids, layer, head, query, key)
    except ValueError as err:
        raise Error(str(err)) from None
    title = (f"Why layer {layer} head {head} attends from {query} · {tokens[query]} to {key} · {tokens[key]}"
             + (f" · {name}" if name else ""))
    fig = vw.score_decomposition(d.table, d.parts, d.row, d.softmax_row, tokens, query, key,
                                 title=esc(title), by_offset=d.by_offset, renormalised=d.sink_renormalised)
    table = {"score": d.score, "components": d.components(limit=400), "softmax_row": d.softmax_row.tolist(),
             "layer": layer, "head": head, "query": query, "key": key, "tokens": tokens, "parts": d.parts}
    if d.content is not None:
        table["content_score"], table["position_part"] = d.content, d.score - d.content
    return summarise(d, tokens), fig, table


def why_disentangled(net, ids: list[int], tokens: list[str], layer: int, head: int, query: int, key: int,
                     name: str = ""):
    """DeBERTa's score split into content→content, content→position and position→content (He et al. 2021, eq. 4):
    a 2 × 2 table (query part × key part; position→position is not a term of DeBERTa's: left empty), the row and its
    softmax."""
    from models.families.deberta import disentangled_split

    d = disentangled_split(net, ids, layer, head, query, key)
    intro = (f"(distance {d.distance}, relative bucket {d.bucket}). Score {d.score:.3f}, attention "
             f"{d.softmax_row[key]:.3f} after the softmax over {len(d.row)} keys. DeBERTa's disentangled attention "
             "adds three terms, each over √(3·d_head):")
    terms = [("content", "content", "content → content (q_i · k_j)", d.c2c),
             ("content", "relative position", "content → position (q_i · W_k r_δ)", d.c2p),
             ("relative position", "content", "position → content (k_j · W_q r_δ)", d.p2c)]
    return position_split(d, tokens, layer, head, query, key, name, intro, terms,
                          "content→content + content→position + position→content")


def why_relative_bias(net, ids: list[int], tokens: list[str], layer: int, head: int, query: int, key: int,
                      name: str = ""):
    """T5's encoder score split into content q_i·k_j and the head's learned bias of the offset's bucket (Raffel et al.
    2020, §2.1; no 1/√d_k): a 2 × 2 table (query part × key part, the bias on the position × position cell, the two
    cells that are not terms left empty), the row and its softmax."""
    from models.families.t5 import bias_split

    d = bias_split(net, ids, layer, head, query, key)
    intro = (f"(offset {key - query:+d}, bucket {d.bucket}). Score {d.score:.3f}, attention {d.softmax_row[key]:.3f} "
             f"after the softmax over {len(d.row)} keys. T5 adds to each query·key product (not divided by √d_k) a "
             "learned bias per head for the bucket of the offset, shared by every layer (the Positional tab draws "
             "them):")
    terms = [("content", "content", "content (q_i · k_j)", d.content),
             ("relative position", "relative position", f"relative position bias (bucket {d.bucket})", d.position)]
    return position_split(d, tokens, layer, head, query, key, name, intro, terms,
                          "content (q·k) + relative position bias")


def position_split(d, tokens: list[str], layer: int, head: int, query: int, key: int, name: str, intro: str,
                   terms: list[tuple[str, str, str, float]], split: str):
    """A score split into content and relative-position terms (DeBERTa, T5; ``d`` has score, row, softmax_row and
    bucket): ``terms`` are (query part, key part, label, value); the 2 × 2 table leaves a pair that is no term
    empty. Returns the section's (summary Markdown, figure, table dict)."""
    parts = ["content", f"relative position (bucket {d.bucket})"]
    index = {"content": 0, "relative position": 1}
    table = np.full((2, 2), np.nan)
    for q_part, k_part, _, value in terms:
        table[index[q_part], index[k_part]] = value
    title = (f"Why layer {layer} head {head} attends from {query} · {tokens[query]} to {key} · {tokens[key]}"
             + (f" · {name}" if name else ""))
    fig = vw.score_decomposition(table, parts, np.array(d.row), np.array(d.softmax_row), tokens, query, key,
                                 title=esc(title), split=split)
    summary = (f"**Layer {layer}, head {head}: query {query} `{tokens[query]}` → key {key} `{tokens[key]}`** {intro}"
               "\n\n| term | value |\n| --- | ---: |\n"
               + "".join(f"| {label} | {value:+.3f} |\n" for _, _, label, value in terms)
               + f"| **sum = score** | **{d.score:+.3f}** |")
    components = [{"query_part": q, "key_part": k, "value": v} for q, k, _, v in terms]
    return summary, fig, {"score": d.score, "components": components, "softmax_row": d.softmax_row, "layer": layer,
                          "head": head, "query": query, "key": key, "tokens": tokens, "parts": parts,
                          "bucket": d.bucket}


def summarise(d, tokens: list[str]) -> str:
    """Two or three sentences and the largest terms, in words."""
    q, k = d.query, d.key
    lines = [f"**Layer {d.layer}, head {d.head}: query {q} `{tokens[q]}` → key {k} `{tokens[k]}`.** Score "
             f"{d.score:.3f}, attention {d.softmax_row[k]:.3f} after the softmax over {np.isfinite(d.row).sum()} keys."]
    if d.content is not None:
        lines.append(f"RoPE: with the rotation removed (offset 0) the same query and key score {d.content:.3f}; the "
                     f"rotation to offset {q - k} adds {d.score - d.content:+.3f}.")
    if d.sink_renormalised is not None and k != 0:
        lines.append(f"The first token `{tokens[0]}` takes {d.softmax_row[0]:.1%} of this row; without it, "
                     f"renormalised, key {k} would get {d.sink_renormalised[k]:.1%}.")
    elif d.sink_renormalised is not None:
        top = int(np.argmax(d.sink_renormalised))
        lines.append(f"This is the first token, the usual sink: renormalised without it, the row's largest weight "
                     f"would go to key {top} `{tokens[top]}` ({d.sink_renormalised[top]:.1%}).")
    rows = d.components(limit=MAX_TABLE_ROWS)
    table = ["| query part | key part | term |", "| --- | --- | ---: |"]
    table += [f"| {r['query_part']} | {r['key_part']} | {r['value']:+.3f} |" for r in rows]
    return "\n\n".join(lines) + "\n\n" + "\n".join(table)


def explain(sequence, state, layer, head, query, key):
    """The section's button and heatmap clicks: decompose over the tab's kept input."""
    if not state:
        raise Error("Run the model first: the score is split on the tab's current input.")
    name, ids, tokens = sequence(state)
    require_full(len(ids), "Splitting a score")
    net = get_model(name)
    return why(net, ids, tokens, layer, head, query, key, name)


def open_head(cell: str):
    """A clicked model-view thumbnail "layer,head": the figure shows that layer's head as a heatmap."""
    try:
        layer, head = (int(v) for v in str(cell).split(",")[:2])
    except ValueError:
        return gr.update(), gr.update(), gr.update()
    return gr.update(value=layer), gr.update(value=str(head)), gr.update(value="heatmap")


def from_cell(cell: str, layer, head, w_head, *shown):
    """A clicked heatmap cell "query,key": the section takes the figure's layer and head (when one head is shown)."""
    if any(value not in CLICKABLE for value in shown):
        raise Error("Clicks are read on the heatmap view (of the encoder, in Translate); pick a cell there.")
    try:
        query, key = (int(v) for v in str(cell).split(",")[:2])
    except ValueError:
        raise Error(f"Not a cell: {cell!r}.") from None
    head_shown = int(head) if str(head).isdigit() else w_head
    return gr.update(value=int(layer)), gr.update(value=head_shown), gr.update(value=query), gr.update(value=key)


def ablate_sink(sequence, state, layer, head) -> str:
    """Forbid the head its first token in the forward pass: the change in loss (LM) or class probability."""
    from models.inspect.decompose import n_layers
    from models.inspect.patching import sink_ablation

    if not state:
        raise Error("Run the model first.")
    name, ids, tokens = sequence(state)
    require_full(len(ids), "Sink ablation")
    net = get_model(name)
    require_heads(net, "Sink ablation")
    if not registry.family_of(net).ablation:
        raise Error("Sink ablation is offered for the decoders of Generate and the classifiers.")
    layer, head = index(layer, n_layers(net), "layer"), index(head, net.config.n_heads, "head")
    try:
        r = sink_ablation(net, ids, layer, head)
    except ValueError as err:
        raise Error(str(err)) from None
    return sink_words(r, layer, head, tokens)


def sink_words(r, layer: int, head: int, tokens: list[str]) -> str:
    """The ablation's effect in one sentence."""
    share = float(np.mean(r.attention_before[1:, 0])) if r.attention_before.shape[0] > 1 else 0.0
    said = (f"Layer {layer}, head {head} forbidden its first token `{tokens[0]}` (which took {share:.1%} of its "
            "attention, averaged over the other queries)")
    if r.loss_before is not None:
        nxt = ("the end of the text" if r.target_label in ("<s>", "</s>", "<|endoftext|>")
               else f"`{r.target_label}`")
        return (f"{said}: mean next-token loss {r.loss_before:.3f} → {r.loss_after:.3f} nats "
                f"({r.loss_after - r.loss_before:+.3f}); the likeliest next token after the last one, {nxt} "
                f"(`{r.target_label}`), {probability_change(r.target_prob_before, r.target_prob_after)}."
                + (f" {r.notice}" if r.notice else ""))
    return f"{said}: p({r.target_label}) {probability_change(r.target_prob_before, r.target_prob_after)}."


def probability_change(before: float, after: float) -> str:
    """"p₀ → p₁ (±d percentage points)" with as many digits as the change needs to show (a sink ablation often
    moves a near-certain probability by less than 0.05 %: "100.0 % → 100.0 %" said nothing)."""
    change = (after - before) * 100  # percentage points, not a relative per cent
    digits = 1
    while digits < 6 and abs(change) < 10 ** -digits:
        digits += 1
    if change == 0:
        return f"{before * 100:.1f} % → {after * 100:.1f} % (unchanged)"
    return f"{before * 100:.{digits}f} % → {after * 100:.{digits}f} % ({change:+.{digits}f} percentage points)"


@on_gpu  # a ZeroGPU Space attaches its GPU for this call (tabs/zerogpu.py)
def attention_why(text: str, model: str = "gpt-tiny", layer: int = -1, head: int = 0, query: int = -1,
                  key: int = 0) -> tuple[str, dict]:
    """Split one attention score of a text model into residual-stream parts: (Plotly figure as JSON text, table with
    `score`, `components` (list of {query_part, key_part, value}, largest first), `softmax_row`). Negative layer
    and positions count from the end."""
    text = read_text(text)
    net = text_model(model or "gpt-tiny")
    ids, tokens, notice = encode(net, text)
    _, fig, table = why(net, ids, tokens, layer, head, query, key, model)
    if notice:
        table["notice"] = notice
    return fig.to_json(), table  # text: gradio_client would fetch an object with a "path" key as a file


def register_api() -> None:
    """/attention_why: the score split of plain text (no tab's kept Result)."""
    gr.api(attention_why, api_name="attention_why", concurrency_limit=2)
