"""Why a head attends, and whether it matters: the sections that the text tabs (Generate, Classify, Translate's
encoder) share. A clicked cell of a head's heatmap (or the query/key boxes) splits that score into the parts of
the residual stream (`models.inspect.decompose`); "ablate the sink" forbids the head its first token; activation
patching between a clean and a corrupted input (`models.inspect.patching`) measures which heads and positions carry
the answer.

Each tab calls `decomposition(...)` (and Generate/Classify `patching(...)`) inside its own layout, with a
function that turns its kept Result into (model name, token ids, token labels). The API endpoints
`/attention_why` and `/patch` take plain text and a model name (`register_api`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import gradio as gr
import numpy as np

from models import limits
from models.registry import is_family
from tabs.common import FAST, Error, get_model, read_text
from viz import attention as va
from viz import why as vw
from viz.common import esc

WHY_TEXT = """### Why does this head attend there?
Click a cell of the heatmap above (one head, not the mean), or pick a query and a key below. The score
q·k/√d_k of that cell is split into the parts of the residual stream that make up the query and the key (token
and position embeddings, each earlier head, each earlier MLP, the biases), with every LayerNorm frozen at the scale
it computed on this input: the terms add up to the score exactly. It shows *which parts meet* in the dot product;
it does not say that the head would fail without them (for that, ablate or patch)."""
SINK_TEXT = """**Attention sinks.** Softmax has to put all of a row's weight somewhere, so a head with nothing useful
to read at a query parks it on a token every query can see and whose value adds little: the first token (an
*attention sink*, Xiao et al. 2023; BERT's heads do the same with `[CLS]` and `[SEP]`, Clark et al. 2019). The red
diamonds renormalise the row without it; "ablate the sink" forbids the head its first token during the forward
pass and measures what changes."""
PATCH_TEXT = """### Does it matter? Activation patching
Run a *clean* and a *corrupted* input of the same length in tokens, then run the corrupted one again with a single
activation copied from the clean run: one head's output, or the residual stream at one layer and position. The
heatmap shows the fraction of the clean − corrupted logit difference that this one copy restores (1: the clean
answer is back, 0: no effect; Meng et al. 2022, Heimersheim & Nanda 2024). It shows where the information that
separates the two inputs is carried; it says nothing about what a head does on other inputs. Click a head to see
its attention on the clean input."""
SWEEPS = {"heads (layer × head)": "heads", "residual stream (layer × position)": "positions"}
MAX_TABLE_ROWS = 12
CLICKABLE = ("heatmap", "encoder")  # the view and the attention kind whose cells a click may split
MAX_PATCH_CHARS = 4000  # each patching input; the model's token cap applies after


# ------------------------------------------------------------------------------------------------ layout
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
    fig = gr.Plot(label="the score split by residual-stream parts")
    gr.Markdown(SINK_TEXT if sink else SINK_TEXT.split(" \"ablate the sink\"")[0] + ".")
    ablate = gr.Button("Ablate the sink (this head may not attend to the first token)", visible=sink)
    sink_note = gr.Markdown()
    with gr.Accordion("the score's terms as JSON", open=False):
        table = gr.JSON(label="score, components, softmax_row")
    # A click on the heatmap writes "query,key,n" here (the page script in app.py); hidden by CSS, not by visible=False,
    # so that it stays in the page for the script to find.
    cell = gr.Textbox(elem_id=f"{tab}-why-cell", elem_classes=["atlas-hidden"], show_label=False, container=False)

    def run_state(st, lay, hd, q, k):
        return explain(sequence, st, lay, hd, q, k)

    args = [state, w_layer, w_head, query, key]
    run.click(run_state, args, [summary, fig, table], api_name=False)
    cell.change(from_cell, [cell, layer, head, w_head, *shown], [w_layer, w_head, query, key], api_name=False,
               show_progress="hidden", **FAST).then(run_state, args, [summary, fig, table], api_name=False)
    ablate.click(lambda st, lay, hd: ablate_sink(sequence, st, lay, hd), [state, w_layer, w_head], [sink_note],
                 api_name=False)
    return {"layer": w_layer, "head": w_head, "query": query}


def controls(layers: int, heads: int, tokens: int) -> tuple[dict, dict, dict]:
    """Updates of the section's layer and head sliders and query box after a model run."""
    return (gr.update(minimum=0, maximum=max(layers - 1, 1), value=layers - 1),
            gr.update(minimum=0, maximum=max(heads - 1, 1)), gr.update(value=tokens - 1))


def patching(tab: str, resolve: Callable[..., str], model_inputs: list, examples: list[list[str]],
             why_section: dict[str, Any], repeated: bool = False) -> None:
    """The activation-patching section. ``resolve(*values of model_inputs)`` is the model's name; ``examples``
    are [clean, corrupted] pairs; ``repeated`` adds the induction example (repeated random tokens, first copy
    replaced) for language models."""
    gr.Markdown(PATCH_TEXT)
    with gr.Row():
        clean = gr.Textbox(label="clean input", value=examples[0][0] if examples else "", lines=2,
                           max_length=MAX_PATCH_CHARS)
        corrupted = gr.Textbox(label="corrupted input (same number of tokens)", lines=2, max_length=MAX_PATCH_CHARS,
                               value=examples[0][1] if examples else "")
    with gr.Row():
        target = gr.Textbox("", label="target (empty: the clean answer)")
        sweep = gr.Radio(list(SWEEPS), value=list(SWEEPS)[0], label="patch")
        run = gr.Button("Patch", variant="primary")
        rep = gr.Button("Induction example: first copy replaced") if repeated else None
    if examples:
        gr.Examples(examples, [clean, corrupted])
    note = gr.Markdown()
    fig = gr.Plot(label="fraction of the logit difference restored", elem_id=f"{tab}-patch")
    with gr.Row():
        head_attn = gr.Plot(label="the clicked head's attention on the clean input")
    head_note = gr.Markdown()
    kept = gr.State()
    cell = gr.Textbox(elem_id=f"{tab}-patch-cell", elem_classes=["atlas-hidden"], show_label=False, container=False)

    def run_text(*values, progress=gr.Progress()):
        *model_values, c, k, t, sw = values
        return patch_texts(resolve(*model_values), c, k, t, sw, progress)

    outputs = [note, fig, kept]
    run.click(run_text, [*model_inputs, clean, corrupted, target, sweep], outputs, api_name=False)
    if rep is not None:
        rep.click(lambda *v: patch_repeated(resolve(*v[:-1]), v[-1]), [*model_inputs, sweep],
                  [note, fig, kept, clean, corrupted], api_name=False)
    cell.change(patched_head, [cell, kept], [head_attn, head_note, why_section["layer"], why_section["head"]],
               api_name=False)


def comparison(tab: str, state: gr.State, view_of: Callable[[Any], dict], run_b: Callable[..., Any],
               inputs: list, layer: gr.Slider, head: gr.Dropdown, view: gr.Radio) -> None:
    """The compare toggle: a second input (B) run with the tab's current settings (``run_b(text, *inputs)`` returns
    its kept state), drawn beside the first at the same layer, head and view, with B − A over the tokens they
    share and the change per token or class. ``view_of(state)`` says what to draw: ``amap`` (the AttentionMap),
    ``values`` (per token, or per class with ``classes``), ``kind`` (the figure's title), optionally ``what`` and
    ``unit`` (default surprisal in bits)."""
    on = gr.Checkbox(False, label="compare with a second input (B)")
    with gr.Column(visible=False) as box:
        with gr.Row():
            text_b = gr.Textbox(label="input B", lines=2, scale=4, max_length=MAX_PATCH_CHARS)
            run = gr.Button("Compare", scale=1)
        note = gr.Markdown()
        with gr.Row():
            plot_b = gr.Plot(label="B, same layer, head and view")
            plot_d = gr.Plot(label="B − A over the tokens both inputs share")
        change = gr.Plot(label="what changes")
        download = gr.File(label="both inputs' arrays (.npz)")
    state_b = gr.State()
    on.change(lambda v: gr.update(visible=bool(v)), [on], [box], api_name=False, show_progress="hidden")

    def go(a, text, lay, hd, vw_, *values):
        b = run_b(read_text(text), *values)
        return (*compared(view_of, a, b, lay, hd, vw_), both_arrays(tab, view_of, a, b), b)

    run.click(go, [state, text_b, layer, head, view, *inputs], [note, plot_b, plot_d, change, download, state_b],
              api_name=False)
    for control in (layer, head, view):
        control.change(lambda a, b, lay, hd, vw_: compared(view_of, a, b, lay, hd, vw_) if a and b else
                       (gr.update(),) * 4, [state, state_b, layer, head, view], [note, plot_b, plot_d, change],
                       api_name=False, show_progress="hidden", **FAST)


def compared(view_of, state_a, state_b, layer, head, view):
    """(note, B's figure, B − A, the change per token or class) from two kept states: no model runs."""
    from models.inspect.analysis import align_tokens
    from tabs.common import attention_figure, parse_head

    if not state_a:
        raise Error("Run the first input (A) first: B is compared with it.")
    a, b = view_of(state_a), view_of(state_b)
    amap_a, amap_b = a["amap"], b["amap"]
    layer = min(int(layer), amap_a.layers - 1, amap_b.layers - 1)
    hd = parse_head(head)
    fig_b = attention_figure(amap_b, f"B · {a['kind']}", layer, hd, view)
    pairs = align_tokens(amap_a.queries, amap_b.queries)
    wa, wb = va.select_head(amap_a.weights, layer, hd), va.select_head(amap_b.weights, layer, hd)
    shown = f"layer {layer} · " + (f"head {hd}" if isinstance(hd, int) else f"{hd} of heads")
    diff = vw.attention_difference(wa, wb, amap_a.queries, amap_b.queries, pairs, title=esc(f"B − A · {shown}"))
    if a.get("classes"):
        labels = a["classes"]
        change = vw.change_bars(labels, a["values"], b["values"], title="Class probabilities, A and B",
                                unit="probability")
        top = int(np.argmax(a["values"]))
        note = (f"{len(pairs)} of {len(amap_b.queries)} tokens of B are shared with A. p({labels[top]}): "
                f"{a['values'][top]:.1%} (A) → {b['values'][top]:.1%} (B).")
    else:
        keep = [(i, j) for i, j in pairs if np.isfinite(a["values"][i]) and np.isfinite(b["values"][j])]
        sa = np.asarray(a["values"])[[i for i, _ in keep]]
        sb = np.asarray(b["values"])[[j for _, j in keep]]
        what, unit = a.get("what", "surprisal"), a.get("unit", "bits")
        change = vw.change_bars([amap_b.queries[j] for _, j in keep], sa, sb,
                                title=esc(f"{what.capitalize()} of the shared tokens, A and B"), unit=unit)
        means = f"{sa.mean():.2f} {unit} (A), {sb.mean():.2f} (B)" if keep else "none shared"
        note = (f"{len(pairs)} of {len(amap_b.queries)} tokens of B are shared with A. Mean {what} of the shared "
                f"tokens: {means}.")
    return note, fig_b, diff, change


def both_arrays(tab: str, view_of, state_a, state_b) -> str:
    """The .npz of both inputs: attention, tokens, the per-token or per-class values, the shared-token pairs."""
    from models.inspect.analysis import align_tokens
    from tabs.common import save_npz

    a, b = view_of(state_a), view_of(state_b)
    pairs = align_tokens(a["amap"].queries, b["amap"].queries)
    long = max(len(a["amap"].keys), len(b["amap"].keys)) > limits.LONG_TOKENS  # float16 arrays, deflated
    return save_npz(f"{tab}-compare", compressed=long, attention_a=a["amap"].weights, attention_b=b["amap"].weights,
                    tokens_a=np.array(a["amap"].queries), tokens_b=np.array(b["amap"].queries),
                    values_a=np.asarray(a["values"], dtype=np.float32), values_b=np.asarray(b["values"], np.float32),
                    shared=np.array(pairs, dtype=np.int64).reshape(-1, 2))


# ---------------------------------------------------------------------------------------------- handlers
def _model_for(name: str):
    """A text model by name: any decoder of Generate, any classifier checkpoint or the translator."""
    from tabs import classify, generate, translate

    names = [*generate.decoder_models(), *classify.CHECKPOINTS, *classify.offered("classify"),
             *translate.translator_models()]
    if name not in names:
        raise Error(f"Unknown model {name!r}; choose one of {', '.join(names)}.")
    return get_model(name)


def encode(net, text: str) -> tuple[list[int], list[str], str]:
    """Ids and tokens of a text exactly as the model reads it (specials included), capped at its limit."""
    if type(net).__name__ == "GPT":
        ids, tokens = net.encode_prompt(text)
        limit = net.context_limit()
        if not ids:
            raise Error("The text has no tokens.")
        if len(ids) > limit:  # keep the start: BOS and the first tokens, as a reader would
            return ids[:limit], tokens[:limit], f"Input shortened to its first {limit} tokens (it had {len(ids)})."
        return ids, tokens, ""
    from models.io.tokenizer import encode_input

    ids, tokens, notice = encode_input(net.tokenizer, text, net.config.max_len, type(net).__name__)
    return list(ids), list(tokens), notice


def _index(value, n: int, name: str) -> int:
    """A position or index from the UI or the API: −1 counts from the end; anything outside is refused in words."""
    try:
        i = int(value)
    except (TypeError, ValueError, OverflowError):
        raise Error(f"The {name} must be a whole number, got {value!r}.") from None
    if i < 0:
        i += n
    if not 0 <= i < n:
        raise Error(f"The {name} {value} is outside 0..{n - 1}.")
    return i


def why(net, ids: list[int], tokens: list[str], layer, head, query, key, name: str = ""):
    """Decompose one score: (summary Markdown, figure, table dict). Positions and indices are checked here."""
    from models.inspect.decompose import decompose_score, n_layers

    c = net.config
    layer, head = _index(layer, n_layers(net), "layer"), _index(head, c.n_heads, "head")
    query, key = _index(query, len(ids), "query position"), _index(key, len(ids), "key position")
    if is_family(net, "deberta"):  # disentangled attention: content and position terms, not residual parts
        return why_disentangled(net, ids, tokens, layer, head, query, key, name)
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
    a 2 × 2 table (query part × key part; position→position is not in DeBERTa), the row and its softmax."""
    from models.families.deberta import disentangled_split

    d = disentangled_split(net, ids, layer, head, query, key)
    parts = ["content", f"relative position (bucket {d.bucket})"]
    table = np.array([[d.c2c, d.c2p], [d.p2c, 0.0]])
    row, soft = np.array(d.row), np.array(d.softmax_row)
    title = (f"Why layer {layer} head {head} attends from {query} · {tokens[query]} to {key} · {tokens[key]}"
             + (f" · {name}" if name else ""))
    fig = vw.score_decomposition(table, parts, row, soft, tokens, query, key, title=esc(title))
    summary = (f"**Layer {layer}, head {head}: query {query} `{tokens[query]}` → key {key} `{tokens[key]}`** "
               f"(distance {d.distance}, relative bucket {d.bucket}). Score {d.score:.3f}, attention {soft[key]:.3f} "
               f"after the softmax over {len(row)} keys. DeBERTa's disentangled attention adds three terms, each over "
               "√(3·d_head):\n\n| term | value |\n| --- | ---: |\n"
               f"| content → content (q_i · k_j) | {d.c2c:+.3f} |\n"
               f"| content → position (q_i · W_k r_δ) | {d.c2p:+.3f} |\n"
               f"| position → content (k_j · W_q r_δ) | {d.p2c:+.3f} |\n| **sum = score** | **{d.score:+.3f}** |")
    components = [{"query_part": "content", "key_part": "content", "value": d.c2c},
                  {"query_part": "content", "key_part": "relative position", "value": d.c2p},
                  {"query_part": "relative position", "key_part": "content", "value": d.p2c}]
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
    net = get_model(name)
    return why(net, ids, tokens, layer, head, query, key, name)


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
    net = get_model(name)
    if type(net).__name__ == "Translator":
        raise Error("Sink ablation is offered for the decoders of Generate and the classifiers.")
    layer, head = _index(layer, n_layers(net), "layer"), _index(head, net.config.n_heads, "head")
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
        return (f"{said}: mean next-token loss {r.loss_before:.3f} → {r.loss_after:.3f} nats "
                f"({r.loss_after - r.loss_before:+.3f}); p(`{r.target_label}` next) {r.target_prob_before:.1%} → "
                f"{r.target_prob_after:.1%}." + (f" {r.notice}" if r.notice else ""))
    return (f"{said}: p({r.target_label}) {r.target_prob_before:.1%} → {r.target_prob_after:.1%} "
            f"({r.target_prob_after - r.target_prob_before:+.1%}).")


def _target(net, target: str) -> int | None:
    """The user's target answer: a class name (classifiers) or a token (language models; its first piece)."""
    target = (target or "").strip()
    if not target:
        return None
    if type(net).__name__ != "GPT":
        from tabs.common import target_index

        return target_index(target, list(net.labels))
    ids, _ = net.encode_prompt(target)
    bos = getattr(net.tokenizer, "bos_id", net.config.bos_id)
    ids = [i for i in ids if i != bos]
    if not ids:
        raise Error(f"The target {target!r} has no tokens.")
    return int(ids[0])


def run_patch(name: str, clean_ids: list[int], corrupted_ids: list[int], target: int | None, sweep: str,
              progress=None):
    """The sweep over ids: (note, figure, JSON dict, kept state)."""
    from models.inspect.patching import patch_sweep

    net = get_model(name)
    if type(net).__name__ == "Translator":
        raise Error("Patching is offered for the decoders of Generate and the classifiers.")
    sweep = SWEEPS.get(sweep, sweep)
    if sweep not in SWEEPS.values():
        raise Error(f"Unknown sweep {sweep!r}; choose heads or positions.")
    report = None if progress is None else (lambda done, text: progress(done, desc=f"patching: {text}"))
    try:
        r = patch_sweep(net, clean_ids, corrupted_ids, sweep=sweep, target=target, progress=report)
    except ValueError as err:
        raise Error(str(err)) from None
    unit = "head" if sweep == "heads" else "position"
    best = np.unravel_index(int(np.nanargmax(r.restored)), r.restored.shape)
    shown = r.clean_tokens if sweep == "positions" else None
    sub = (f"target `{r.target_label}` against `{r.foil_label}` · logit difference {r.logit_diff_clean:.2f} clean, "
           f"{r.logit_diff_corrupted:.2f} corrupted")
    fig = vw.patching_heatmap(r.restored, sweep, tokens=shown, title=esc(f"Activation patching · {name} · by {unit}"),
                              subtitle=esc(sub))
    what = f"head {best[1]}" if sweep == "heads" else f"position {best[1]} `{r.clean_tokens[best[1]]}`"
    note = (f"{len(clean_ids)} tokens each. Logit difference `{r.target_label}` − `{r.foil_label}`: "
            f"{r.logit_diff_clean:.3f} on the clean input, {r.logit_diff_corrupted:.3f} on the corrupted one. "
            f"The strongest single patch is layer {best[0]} {what}, restoring {r.restored[best]:.0%}."
            + (" Click a head to see its attention on the clean input." if sweep == "heads" else ""))
    table = {"restored": r.restored.tolist(), "sweep": sweep, "logit_diff_clean": r.logit_diff_clean,
             "logit_diff_corrupted": r.logit_diff_corrupted, "target": r.target_label, "foil": r.foil_label,
             "clean_tokens": r.clean_tokens, "corrupted_tokens": r.corrupted_tokens}
    return note, fig, table, {"model": name, "ids": list(clean_ids), "tokens": r.clean_tokens, "sweep": sweep}


def _pair(net, clean: str, corrupted: str, target: str) -> tuple[int | None, list[int], list[int]]:
    """The target answer and both texts' ids as the model reads them; lengths in tokens must agree."""
    clean, corrupted = read_text(clean), read_text(corrupted)
    wanted = _target(net, target)
    a, _, _ = encode(net, clean)
    b, _, _ = encode(net, corrupted)
    if len(a) != len(b):
        raise Error(f"The clean input has {len(a)} tokens and the corrupted one {len(b)}: patching needs the same "
                    "number of tokens (change a word for one of the same length in tokens).")
    if len(a) > limits.MAX_PATCH_TOKENS:  # a sweep runs a forward per head or per position
        raise Error(f"Patching reads at most {limits.MAX_PATCH_TOKENS} tokens; these inputs have {len(a)}. Shorten "
                    "both texts the same way.")
    return wanted, a, b


def patch_texts(name: str, clean: str, corrupted: str, target: str, sweep: str, progress=None):
    """Patching between two texts: each encoded as the model reads it; lengths must agree."""
    net = get_model(name)
    wanted, a, b = _pair(net, clean, corrupted, target)
    note, fig, _, kept = run_patch(name, a, b, wanted, sweep, progress)
    return note, fig, kept


def patch_repeated(name: str, sweep: str, n: int = 19, seed: int = 0):
    """The induction example: BOS + A + A[:−1] against BOS + B + A[:−1] (models.inspect.patching.repeated_pair)."""
    from models.inspect.patching import repeated_pair

    net = get_model(name)
    try:
        clean, corrupted = repeated_pair(net, n, seed)
    except ValueError as err:
        raise Error(str(err)) from None
    note, fig, _, kept = run_patch(name, clean, corrupted, None, sweep)
    shown = [" ".join(net.piece(i) for i in ids) for ids in (clean, corrupted)]
    note = ("Repeated random tokens: the clean input repeats its first copy, so an induction head can predict the "
            "next token from the earlier occurrence; the corrupted input replaces the first copy. " + note)
    return note, fig, kept, *shown


def patched_head(cell: str, kept):
    """A clicked cell of the head sweep: that head's attention on the clean input, the score of its last query
    on the key it attends to most split by parts, and the section's sliders set to it."""
    from models.inspect.decompose import attention_scores

    if not kept or kept.get("sweep") != "heads":
        raise Error("Clicks open a head: run the sweep by head (layer × head) first.")
    try:
        layer, head = (int(v) for v in str(cell).split(",")[:2])
    except ValueError:
        raise Error(f"Not a cell: {cell!r}.") from None
    net = get_model(kept["model"])
    ids, tokens = kept["ids"], kept["tokens"]
    scores = attention_scores(net, ids)[layer, head]  # (T, T)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    fig = va.attention_heatmap(weights, tokens, tokens, title=esc(f"Clean input · layer {layer} · head {head}"))
    key = int(np.argmax(weights[-1]))
    summary, _, _ = why(net, ids, tokens, layer, head, len(ids) - 1, key, kept["model"])
    return fig, summary, gr.update(value=layer), gr.update(value=head)


def patch(clean: str, corrupted: str, model: str = "gpt-tiny", target: str = "", sweep: str = "heads"
          ) -> tuple[dict, dict]:
    """Activation patching between two texts of the same token length: (Plotly figure as JSON, {restored (layer ×
    head or layer × position), logit_diff_clean, logit_diff_corrupted, target, foil, tokens}). sweep: "heads" or
    "positions"; target: a token or class (empty: the clean answer)."""
    net = _model_for(model or "gpt-tiny")
    wanted, a, b = _pair(net, clean, corrupted, target)
    _, fig, table, _ = run_patch(model or "gpt-tiny", a, b, wanted, sweep)
    return json.loads(fig.to_json()), table


def attention_why(text: str, model: str = "gpt-tiny", layer: int = -1, head: int = 0, query: int = -1,
                  key: int = 0) -> tuple[dict, dict]:
    """Split one attention score of a text model into residual-stream parts: (Plotly figure as JSON, table with
    `score`, `components` (list of {query_part, key_part, value}, largest first), `softmax_row`). Negative layer
    and positions count from the end."""
    text = read_text(text)
    net = _model_for(model or "gpt-tiny")
    ids, tokens, notice = encode(net, text)
    _, fig, table = why(net, ids, tokens, layer, head, query, key, model)
    if notice:
        table["notice"] = notice
    return json.loads(fig.to_json()), table


def register_api() -> None:
    """The endpoints that take plain text rather than a tab's kept Result."""
    gr.api(attention_why, api_name="attention_why", concurrency_limit=2)
    gr.api(patch, api_name="patch", concurrency_limit=2)

