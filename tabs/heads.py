"""Heads: every head of a model scored over a corpus (a layer × head grid per metric), the heads ranked by a metric,
one head's card (its numbers, its best examples drawn with the attention heatmap, its mean pattern by offset), and
two models' grids compared. The atlas is computed once per model and corpus and cached on disk (serving/heads.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np

from models import registry
from models.inspect.atlas import MAX_CORPUS_BYTES, METRICS, REPEATED
from models.inspect.heads import rank_heads
from serving import heads as atlas_store
from serving.errors import ServingError
from tabs.common import FAST, Error, Plot, fit, index, intro, model_choice
from tabs.permalink import Permalink
from viz import attention as va
from viz import heads as vh

TITLE = "Heads"
DEFAULT_MODEL = "gpt-tiny"
INTRO = """**What every head of a model does, over many inputs.** Pick a model and score all its heads over a
built-in corpus (a few hundred plain sentences and repeated random tokens for language models, sentence pairs for
translators, the shipped images for vision models) or over a text file of your own. The grid colours each head by the
chosen metric; the finder ranks every head by it; a head's card shows its numbers, the inputs where it is most so,
and its mean pattern by offset. Scores are cached, so a model's second visit is instant. Try gpt-tiny's
*previous token* (layer 2) and *induction* (layer 3) heads, or vit-fashion's *mean attention distance* by layer
(DINOv2 ViT-S/14 (real), a real pretrained ViT, is scored on the example photographs)."""
TOP_RANKED = 20
MAX_INDEX = 127  # the card's layer and head sliders before a grid sets them (the API checks values against them)


def metric_choices(names: list[str] | None = None) -> list[tuple[str, str]]:
    return [(METRICS[k][0], k) for k in (names or METRICS) if k in METRICS]


def build() -> Permalink:
    """Lays the tab out; a link's run scores the heads, then sets the layer and head of the card."""
    intro(INTRO)
    names = atlas_store.model_names()
    with gr.Row():
        model = model_choice(gr.Dropdown(names, value=DEFAULT_MODEL if DEFAULT_MODEL in names else names[0],
                                         label="model"))
        metric = gr.Dropdown(metric_choices(), value="previous", label="metric")
        corpus = gr.File(label="your corpus (optional: a .txt file, one sentence a line, ≤ 2,000 lines)",
                         file_types=[".txt"], type="filepath")
    run = gr.Button("Score every head", variant="primary")
    notice = gr.Markdown()
    state = gr.State()
    with gr.Row():
        grid = Plot(label="layer × head grid (click a head to open its card)", elem_id="heads-grid")
        ranked = Plot(label="head finder: every head ranked by the metric (click a head to open its card)",
                      elem_id="heads-finder")
    layers_plot = Plot(label="the metric by layer")
    gr.Markdown("### Head card")
    with gr.Row():
        # wide until a grid is drawn (it then narrows them to the model's): the API's card takes any model's head
        layer = gr.Slider(0, MAX_INDEX, value=0, step=1, label="layer")
        head = gr.Slider(0, MAX_INDEX, value=0, step=1, label="head")
        example = gr.Radio(["1", "2", "3"], value="1", label="example (the head's best inputs for the metric)")
    with gr.Row():
        card = gr.Markdown(elem_id="heads-card")
        offsets = Plot(label="mean attention by offset")
    example_plot = Plot(label="the example, this head", elem_id="heads-example")
    # a click on the grid or the finder writes "layer,head,click number" here (tabs/page.py's script)
    clicked = gr.Textbox(elem_id="heads-open", elem_classes=["atlas-hidden"], show_label=False, container=False)
    gr.Markdown("### Compare two models")
    with gr.Row():
        other = model_choice(gr.Dropdown(names, value=next((n for n in names if n != model.value), names[0]),
                                         label="other model"))
        compare = gr.Button("Compare the grids")
    compare_note = gr.Markdown()
    compare_plot = Plot(label="two models' grids")
    gr.Markdown("### Retrieval heads")
    gr.Markdown(RETRIEVAL_TEXT)
    with gr.Row():
        needle_length = gr.Dropdown(RETRIEVAL_LENGTHS, value=1024, label="haystack length (tokens)")
        needle_run = gr.Button("Find the retrieval heads")
    needle_note = gr.Markdown()
    with gr.Row():
        needle_grid = Plot(label="retrieval score per head", elem_id="heads-retrieval")
        needle_ranked = Plot(label="heads ranked by retrieval score")

    main_in = [model, metric, corpus]
    main_out = [grid, ranked, layers_plot, notice, metric, layer, head, state]
    card_in = [model, metric, layer, head, example, corpus]
    card_out = [card, example_plot, offsets]
    steps = [(heads_grid, main_in, main_out), (head_card, card_in, card_out)]
    event = run.click(heads_grid, main_in, main_out, api_name="heads")
    event.then(head_card, card_in, card_out, api_name=False)
    metric.input(redraw, [*main_in, state], [grid, ranked, layers_plot], api_name=False, show_progress="hidden",
                 **FAST)
    metric.input(head_card, card_in, card_out, api_name=False, show_progress="hidden")
    # a change (a person's, or a link's after the run) redraws the card
    for control in (layer, head, example):
        control.change(head_card, card_in, card_out, api_name=False, show_progress="hidden",
                       trigger_mode="always_last")
    clicked.change(open_head, [clicked, state], [layer, head], api_name=False, show_progress="hidden")
    gr.Button("Draw the head card", size="sm").click(head_card, card_in, card_out, api_name="head_card")
    gr.api(head_finder, api_name="head_finder")  # the ranking as data (the page draws it as the finder's bars)
    compare.click(heads_compare, [model, other, metric], [compare_plot, compare_note], api_name="heads_compare")
    needle_run.click(retrieval_heads, [model, needle_length], [needle_note, needle_grid, needle_ranked],
                     api_name="retrieval_heads")
    # a link's run scores the heads and draws the card of its own layer and head in one step (issue 61, item 5): the
    # first card drawn is the linked one, not layer 0 head 0's before the after-keys are set
    link_steps = [(heads_linked, [*main_in, layer, head, example], main_out + card_out)]
    return Permalink({"model": model, "metric": metric}, steps, after={"layer": layer, "head": head},
                     state=state, limits=_limits, preset={"layer": layer, "head": head}, link_run=link_steps)


RETRIEVAL_TEXT = """Which heads copy a fact out of a long text? A needle (a sentence with a password) is hidden at
depths 10 %, 50 % and 90 % of a haystack of the project's own sentences and the model is asked for it; a head
*retrieves* when, while the model writes the password, its strongest attention lands on the very needle token being
copied (Wu et al. 2024, eq. 1). The scores are averaged over the runs that found the needle (all runs where none did),
as Wu et al. do. For the language models the long-context store computes; Generate's *Retrieval heads* section runs
one needle at any length and switches the heads found off."""
RETRIEVAL_LENGTHS = [256, 512, 1024, 2048, 4096]
RETRIEVAL_DEPTHS = (0.1, 0.5, 0.9)
RETRIEVAL_NEW = 24  # answer tokens decoded per run


def retrieval_heads(model: str = DEFAULT_MODEL, length: int = 1024, progress: gr.Progress = gr.Progress()):
    """Every head's retrieval score averaged over needles at RETRIEVAL_DEPTHS of a haystack of ``length`` tokens
    (``serving.runs.needle_survey``): a notice with each run's answer, the layer × head grid, the heads ranked."""
    from models.inspect import retrieval
    from serving import runs
    from tabs.common import get_model
    from viz.common import esc

    if model not in atlas_store.model_names():
        raise Error(f"Unknown model {str(model)[:60]!r}; choose one of {', '.join(atlas_store.model_names())}.")
    if str(length).strip() not in {str(n) for n in RETRIEVAL_LENGTHS}:
        raise Error(f"Choose a haystack length of {', '.join(f'{n:,}' for n in RETRIEVAL_LENGTHS)} tokens.")
    net = get_model(model, lambda done, text: progress(done, desc=text))
    if not callable(getattr(net, "context_limit", None)):
        raise Error(f"No retrieval heads for `{model}`: it is not a language model (the needle is hidden in a text "
                    "that the model reads and answers a question about).")
    asked, length = int(length), min(int(length), net.context_limit() - RETRIEVAL_NEW - 8)
    capped = f" (its context holds {net.context_limit():,} tokens, so not {asked:,})" if length < asked else ""
    words = retrieval.SHORT if length < 512 else {}  # a short context: a short needle and question leave it a haystack
    try:
        found = runs.needle_survey(net, length, RETRIEVAL_DEPTHS, RETRIEVAL_NEW,
                                   lambda d, n: progress(d / n, desc=f"needle {d} of {n}"), **words)
    except ValueError as err:
        raise Error(f"No retrieval heads for `{model}`: {str(err).rstrip('.')}.") from None
    answers = "; ".join(f"depth {r.depth:.1f}: “{esc(r.answer.strip()[:60])}” {'✓' if r.found else '✗'}"
                        for r in found.runs)
    used = (f"averaged over the {found.used} runs that found the password" if found.averaged_over == "found"
            else "averaged over every run (none found the password: the scores count the tokens copied)")
    needle = words.get("needle", retrieval.NEEDLE)
    top = retrieval.describe_heads([h for h in found.ranking[:10] if h[2] > 0]) or "none"
    note = (f"**{esc(model)}**, haystacks of about {found.runs[0].length:,} tokens{capped}, the needle "
            f"“{esc(needle)}”: {answers}. Scores {used}. Top retrieval heads: {top}.")
    label = "retrieval score"
    return (note, fit(vh.head_grid(found.scores, label, title=f"Retrieval score per head · {esc(model)}")),
            fit(vh.head_ranking(found.ranking, label, top=TOP_RANKED)))


def _limits(state: Any) -> dict:
    if not isinstance(state, dict):
        return {}
    return {"layer": range(state["layers"]), "head": range(state["heads"])}


# --------------------------------------------------------------------------------------------------- handlers
def _corpus_text(corpus: Any) -> str | None:
    """The text of an uploaded corpus file (gr.File's path, or a gradio_client file dict), or None."""
    if not corpus:
        return None
    path = Path(corpus["path"] if isinstance(corpus, dict) else str(corpus))
    try:
        if path.stat().st_size > MAX_CORPUS_BYTES:
            raise Error(f"The corpus file is larger than {MAX_CORPUS_BYTES // 1024} KB: give at most 2,000 short "
                        "lines.")
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise Error("The corpus file is not UTF-8 text.") from None
    except OSError:
        raise Error("The corpus file could not be read; upload it again.") from None


def _atlas(model: str, corpus: Any, progress: Any = None) -> tuple[Any, bool]:
    try:
        return atlas_store.atlas(model, _corpus_text(corpus), progress)
    except ServingError as err:
        raise Error(str(err)) from None


def _metric(atlas: Any, metric: str | None) -> str:
    if metric in atlas.metrics:
        return metric
    return next(iter(atlas.metrics))


def _label(metric: str) -> tuple[str, str]:
    label, _, unit = METRICS.get(metric, (metric, "", ""))
    return label, unit


def _figures(atlas: Any, metric: str, mark: tuple[int, int] | None = None) -> tuple:
    label, unit = _label(metric)
    grid = atlas.metrics[metric]
    title = f"{label[0].upper()}{label[1:]} per head · {atlas.model}"
    return (fit(vh.head_grid(grid, label, unit, title=title, mark=mark)),
            vh.head_ranking(rank_heads(grid), label, unit, top=TOP_RANKED,
                            title=f"Heads ranked by {label} (top {min(TOP_RANKED, grid.size)} of {grid.size})"),
            vh.by_layer(grid, label, unit))


def heads_grid(model: str = DEFAULT_MODEL, metric: str = "previous", corpus: Any = None,
               progress: gr.Progress = gr.Progress()):
    """Score every head of ``model`` over the built-in corpus (or an uploaded text file): the grid of ``metric``,
    the heads ranked by it, the metric by layer, a notice, and the controls the result sets."""
    atlas, cached = _atlas(model, corpus, progress)
    asked, metric = metric, _metric(atlas, metric)
    notes = "; ".join(atlas.notes)
    how = "from the cache" if cached else f"computed in {atlas.seconds:.1f} s"
    text = f"**{atlas.model}** ({atlas.family}): {atlas.layers} layers × {atlas.heads} heads over {atlas.corpus}, " \
           f"{how}. {notes}. Its metrics: {', '.join(_label(k)[0] for k in atlas.metrics)}."
    if asked != metric:
        text += f" It has no {_label(asked)[0]}, so {_label(metric)[0]} is shown."
    # the choices stay every metric's (a later call may name another model's); the value says what is drawn; the card
    # starts on the top-ranked head (issue 75, item 5: it stayed on layer 0, head 0)
    best_layer, best_head, _ = rank_heads(atlas.metrics[metric])[0]
    return (*_figures(atlas, metric), text, gr.update(value=metric),
            gr.update(maximum=max(atlas.layers - 1, 1), interactive=atlas.layers > 1, value=best_layer),
            gr.update(maximum=max(atlas.heads - 1, 1), interactive=atlas.heads > 1, value=best_head),
            {"layers": atlas.layers, "heads": atlas.heads, "model": atlas.model})


def heads_linked(model: str = DEFAULT_MODEL, metric: str = "previous", corpus: Any = None, layer: int = 0,
                 head: int = 0, example: str | int = 1, progress: gr.Progress = gr.Progress()):
    """A link's run: the grid (``heads_grid``) and the card of ``layer`` and ``head`` (``head_card``), with the card's
    sliders set to them, so the linked head is the first card drawn. A head the model does not have is refused in
    words (the link then runs again with the sliders' own values, and its notice names the key)."""
    if any(isinstance(v, (int, float)) and v < 0 for v in (layer, head)):  # index() would count from the end
        raise Error("A link's layer and head count from 0.")
    grid = heads_grid(model, metric, corpus, progress)
    card = head_card(model, metric, layer, head, example, corpus)
    layer_u, head_u = ({**u, "value": int(v)} for u, v in ((grid[5], layer), (grid[6], head)))
    return (*grid[:5], layer_u, head_u, grid[7], *card)


def open_head(clicked: str, state: Any = None):
    """The card's layer and head sliders set to a clicked head ("layer,head,click number" from the grid or the
    finder); nothing changes before a grid is drawn or for a head the drawn model does not have."""
    parts = str(clicked or "").split(",")
    if not isinstance(state, dict) or len(parts) < 2 or not all(p.strip().isdigit() for p in parts[:2]):
        return gr.skip(), gr.skip()
    layer, head = int(parts[0]), int(parts[1])
    if layer >= state["layers"] or head >= state["heads"]:
        return gr.skip(), gr.skip()
    return gr.update(value=layer), gr.update(value=head)


def redraw(model: str = DEFAULT_MODEL, metric: str = "previous", corpus: Any = None, state: Any = None):
    """The grid, the ranking and the by-layer figure of another metric, from the atlas drawn last (kept in memory or
    on disk: nothing runs); nothing changes while no grid of this model is drawn (its button scores the heads)."""
    try:
        drawn = isinstance(state, dict) and state.get("model") == atlas_store.resolve(model)
    except ServingError:
        drawn = False
    if not drawn:
        return gr.skip(), gr.skip(), gr.skip()
    atlas, _ = _atlas(model, corpus)
    return _figures(atlas, _metric(atlas, metric))


def head_finder(model: str = DEFAULT_MODEL, metric: str = "previous", corpus_text: str | None = None) -> dict:
    """Every head of ``model`` ranked by ``metric`` over the built-in corpus (or ``corpus_text``, one sentence a
    line), best first: ``{"model", "metric", "unit", "heads": [[layer, head, value], ...]}``."""
    try:
        atlas, _ = atlas_store.atlas(model, corpus_text)
    except ServingError as err:
        raise Error(str(err)) from None
    if metric not in atlas.metrics:
        raise Error(f"{atlas.model} has no metric {str(metric)[:40]!r}; it has {', '.join(atlas.metrics)}.")
    ranked = [[layer, head, round(value, 5)] for layer, head, value in rank_heads(atlas.metrics[metric])
              if np.isfinite(value)]
    return {"model": atlas.model, "metric": metric, "unit": _label(metric)[1], "heads": ranked}


def head_card(model: str = DEFAULT_MODEL, metric: str = "previous", layer: int = 0, head: int = 0,
              example: str | int = 1, corpus: Any = None):
    """One head's card: its value and rank under every metric, the tokens it writes (decoders), its best examples
    for ``metric`` (the chosen one drawn with the attention heatmap) and its mean pattern by offset."""
    atlas, _ = _atlas(model, corpus)
    metric = _metric(atlas, metric)
    grid = atlas.metrics[metric]
    layer = index(layer, grid.shape[0], "layer", default=0)
    head = index(head, grid.shape[1], "head", default=0)
    if not np.isfinite(grid[layer, head]):
        raise Error(f"Layer {layer} of {atlas.model} has no head {head}.")
    rows = [f"### {atlas.model} · layer {layer} · head {head}", "", "| metric | value | rank |", "|---|---|---|"]
    for name, values in atlas.metrics.items():
        v = values[layer, head]
        if not np.isfinite(v):
            continue
        rank = 1 + int((values[np.isfinite(values)] > v).sum())
        label, unit = _label(name)
        bold = "**" if name == metric else ""
        rows.append(f"| {bold}{label}{bold} | {v:.3f} {unit if unit != 'share' else ''} | {rank} of "
                    f"{int(np.isfinite(values).sum())} |")
    if atlas.writes:
        rows.append(f"\n**What it writes** (its mean output read by the unembedding): "
                    f"{', '.join(f'`{t}`' for t in atlas.writes[layer][head])}")
    top = atlas.top.get(metric)
    picks = [int(i) for i in top[layer, head] if i >= 0] if top is not None else []
    scores = atlas.top_scores.get(metric)
    if picks:
        rows.append(f"\n**Where it is most {_label(metric)[0]}:** " + " · ".join(
            f"{n + 1}. {atlas.examples[i][:80]} ({scores[layer, head, n]:.2f})" for n, i in enumerate(picks)))
        item = atlas.examples[picks[min(max(int(example) - 1, 0), len(picks) - 1)]]
    elif registry.FAMILIES[atlas.family].causal_lm:
        rows.append("\nThis metric is scored on repeated random tokens; the card draws the first such sequence.")
        item = REPEATED
    else:
        item = atlas.examples[0]
    try:
        ex = atlas_store.example_map(atlas.model, item, layer)
    except ServingError as err:
        raise Error(str(err)) from None
    figure = va.attention_heatmap(ex.weights, ex.queries, ex.keys, head=head, kind=ex.kind,
                                  title=f"{ex.kind} · layer {layer} · head {head}: {item[:50]}")
    offsets = None
    if atlas.offsets is not None and atlas.offsets.shape[:2] == grid.shape:
        offsets = vh.offset_profile(atlas.offsets[layer, head], causal=registry.FAMILIES[atlas.family].causal_lm,
                                    title=f"Mean attention by offset · layer {layer} · head {head}")
    return "\n".join(rows), figure, offsets


def heads_compare(model: str = DEFAULT_MODEL, other: str = "sst2", metric: str = "previous"):
    """Two models' grids of one metric side by side (and their difference when their shapes agree)."""
    a, _ = _atlas(model, None)
    b, _ = _atlas(other, None)
    if metric not in a.metrics or metric not in b.metrics:
        shared = [k for k in a.metrics if k in b.metrics]
        if not shared:
            raise Error(f"{a.model} and {b.model} share no metric ({a.family} and {b.family}).")
        metric = shared[0]
    label, unit = _label(metric)
    best = [rank_heads(x.metrics[metric])[0] for x in (a, b)]
    note = f"**{label}**: " + ", ".join(f"{x.model} best L{r[0]} H{r[1]} ({r[2]:.3f})"
                                        for x, r in zip((a, b), best, strict=True)) + "."
    return vh.compare_grids(a.metrics[metric], b.metrics[metric], (a.model, b.model), label, unit), note
