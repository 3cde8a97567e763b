"""Translate: English → German with the encoder–decoder Transformer (`checkpoints/translator-en-de`)."""

from __future__ import annotations

import re

import gradio as gr

from examples import sentences
from models.outputs import AttentionMap
from serving import catalogue
from serving.batcher import BATCH_MAX, GRADIO_BATCH, batch_events, heavy
from serving.catalogue import offered
from serving.store import batched
from tabs.common import (
    FAST,
    MAX_TEXT_CHARS,
    VIEWS,
    Error,
    Plot,
    attention_figure,
    controls_for,
    get_model,
    head_choices,
    head_index,
    index,
    intro,
    layer_head_view,
    model_choice,
    parse_head,
    read_text,
    run_layer,
    save_npz,
    stats_figure,
)
from tabs.permalink import Field, Permalink, chain
from tabs.sections import compare as compare_section
from tabs.sections import qk, why
from tabs.sections import text as text_section
from tabs.zerogpu import on_gpu
from viz import text as vt
from viz.common import esc

TITLE = "Translate"
MODEL = catalogue.SHIPPED["translate"][0]
INTRO = """**English → German with an encoder–decoder Transformer trained by the project on Multi30k.**
The *encoder* attends over the English sentence, the *decoder* over the German words produced so far
(causal: nothing above the diagonal), and *cross-attention* links each German word to the English words it
was produced from; in the last layers it often traces a rough word alignment. A head that attends to the
previous token draws a diagonal just below the main one.

**A real translator** can be picked as the model: `Helsinki-NLP/opus-mt-en-de` (Marian, trained on OPUS by the
University of Helsinki) or `google-t5/t5-small` (**T5**, Raffel et al. 2020: no position embeddings, a learned bias
per head for each bucket of relative offsets instead; it reads the sentence after its task prefix
"translate English to German: ", which the notice and the encoder's tokens show), both downloaded from the Hugging
Face Hub on first use, or a Marian or T5 folder the server is configured with; every view below works for them as for
the project's own (the Positional tab draws T5's buckets and biases)."""
KINDS = {"encoder": "Encoder self-attention", "decoder": "Decoder self-attention (causal)",
         "cross": "Cross-attention (target → source)"}
MAX_BEAM = 8


def build() -> Permalink:
    intro(INTRO, MODEL)
    with gr.Row():
        text = gr.Textbox(label="English sentence", value=sentences.TRANSLATE[0], lines=2, scale=4,
                          max_length=MAX_TEXT_CHARS)
        with gr.Column(scale=1):
            beam = gr.Slider(1, MAX_BEAM, value=5, step=1, label="beam size (1 = greedy)")
            model = model_choice(gr.Dropdown(translator_models(), value=MODEL, label="model"))
            run = gr.Button("Translate", variant="primary")
    gr.Examples([[s] for s in sentences.TRANSLATE], [text])
    out = gr.Textbox(label="German translation", interactive=False)
    notice = gr.Markdown()
    # a text of several sentences is translated sentence by sentence; the figures show the one picked here
    shown = gr.Dropdown([], value=None, label="sentence the figures show", visible=False, interactive=True)
    # its number ("": the first), which a permalink carries (the picker's choices come with each run); hidden by CSS
    sentence = gr.Textbox(elem_id="translate-sentence", elem_classes=["atlas-hidden"], show_label=False,
                          container=False, max_length=4)
    which = gr.State("")  # "sentence 2 of 5", the figures' title prefix
    with gr.Row():
        kind = gr.Radio(list(KINDS), value="cross", label="attention")
    layer, head, view = layer_head_view(VIEWS, "heatmap")
    attn = Plot(label="attention", elem_id="translate-attention")
    state = gr.State()
    # B runs on the model chosen above, as A did
    clear_b = compare_section.comparison("translate", state, compare_view,
                               lambda text, b, m: translate(text, b, model_name=m)[6], [beam, model],
                               layer, head, view, shows="encoder self-attention")
    source = gr.State()  # the English input, for the "why" section (which splits encoder scores)
    gr.Markdown("The split below is of the **encoder**'s self-attention (choose \"encoder\" above to click its cells).")
    why_section = why.decomposition("translate", source, sequence, layer, head, [view, kind], sink=False)
    # the encoder's queries and keys of the English text, in the chosen model (/translate_qk: model last)
    qk_section = qk.section("translate", text, sequence, extra=[model])
    stats = Plot(label="head statistics")
    align = Plot(label="cross-attention of the chosen translation (last layer, mean of heads)")
    tree = Plot(label="beam-search tree")
    download = gr.File(label="attention arrays (.npz)")
    layer_asked = run_layer()
    inputs = [text, beam, kind, layer_asked, head, view, model]  # model last: API callers' positions stay
    outputs = [out, notice, attn, stats, tree, align, state, download, layer, head]
    why_controls = [why_section["layer"], why_section["head"], why_section["query"]]
    steps = [(translate, inputs, outputs), clear_b,
             (sentence_picker, [text], [shown, which], {"show_progress": "hidden"}),
             (lambda t, m: why_controls_for(t, "", m), [text, model], [source, *why_controls],
              {"show_progress": "hidden"}), qk_section.follow]
    if GRADIO_BATCH:  # the measured alternative to the model store's batcher (docs/ARCHITECTURE.md §9)
        steps[0] = (translate_gradio_batch, inputs, outputs,
                    {"batch": True, "max_batch_size": BATCH_MAX, "concurrency_limit": 1})
    chain(run.click, steps, api_name="translate", **batch_events("translate"))
    chain(text.submit, steps, **batch_events("translate"))
    # a link's run: the figures of the sentence it names are the first drawn, at the link's layer and head
    link_steps = [(translate_linked, [*inputs, sentence], [*outputs, which]),
                  (sentence_picker, [text, sentence], [shown, which], {"show_progress": "hidden"}),
                  (why_controls_for, [text, shown, model], [source, *why_controls], {"show_progress": "hidden"}),
                  qk_section.follow]
    for control in (kind, layer, head, view):
        control.change(draw_translation, [state, kind, layer, head, view, which], [attn, stats], api_name=False,
                       show_progress="hidden", **FAST)
    shown.change(sentence_number, [shown], [sentence], api_name=False, show_progress="hidden", **FAST)
    shown.input(show_sentence, [text, shown, beam, kind, head, view, model],
                [notice, attn, stats, tree, align, state, download, layer, head, which], api_name=False).then(
        lambda t, sh, m: why_controls_for(t, sh, m), [text, shown, model], [source, *why_controls], api_name=False,
        show_progress="hidden")
    return Permalink({"text": text, "beam": beam, "kind": kind, "show": view, "model": model,
                      "sentence": Field(sentence, read=read_sentence, write=lambda v: v or None)}, steps,
                     after={"layer": layer, "head": head}, state=state, limits=link_limits,
                     preset={"layer": layer_asked, "head": head}, link_run=link_steps)


def read_sentence(text: str) -> str:
    """A link's ``sentence``: the number of the sentence the figures show (2 … 99; 1 is the default)."""
    if not (text.isascii() and text.isdigit() and 2 <= int(text) <= 99):
        raise ValueError
    return str(int(text))


def sentence_number(picked: str | None) -> str:
    """The picked sentence's number for the link ("" for the first, which the link leaves out)."""
    number = str(picked or "").split(" · ")[0]
    return number if number.isdigit() and number != "1" else ""


def translate_linked(text: str, beam_size: int, kind: str, layer: int, head: str, view: str, model_name: str,
                     number: str = ""):
    """A link's Translate: the whole text translated, and the figures of the sentence the link names (its
    ``number``; the first when it has no such sentence) drawn at once. Outputs: translate's, then "sentence k of n"."""
    out = translate(text, beam_size, kind, layer, head, view, model_name)
    parts = sentences_of(read_text(text))
    if len(parts) < 2:
        return (*out, "")
    if not (str(number).isdigit() and 1 < int(number) <= len(parts)):
        return (*out, f"sentence 1 of {len(parts)}")
    return (out[0], *show_sentence(text, str(number), beam_size, kind, head, view, model_name, layer))


def link_limits(result) -> dict:
    """What a link's layer and head may be for a kept translation (the sliders follow cross-attention)."""
    cross = result.attention["cross"]
    return {"layer": range(cross.layers), "head": head_choices(cross.heads)}


def translator_models() -> list[str]:
    """The Translate tab's models: the project's own, then the Hub's and the configured translators."""
    return [MODEL, *offered("translate")]


def _model(name: str | None, progress=None):
    """The translator behind a name the tab offers (an unknown name is refused by name, never guessed)."""
    name = MODEL if name in (None, "") else name
    choices = translator_models()
    if name not in choices:
        raise Error(f"Unknown model {str(name)[:80]!r}; choose one of {', '.join(choices)}.")
    report = None if progress is None else (lambda done, what: progress(done, desc=what))
    return name, get_model(name, report)  # a Hub model is downloaded on first use, with its progress shown


@on_gpu  # a ZeroGPU Space attaches its GPU for this call (tabs/zerogpu.py)
def translate(text: str, beam_size: int = 5, kind: str = "cross", layer: int = -1, head: str = "mean",
              view: str = "heatmap", model_name: str = MODEL, progress=gr.Progress()):
    """Translate English to German; return the translation and every attention figure."""
    text = read_text(text)
    name, model = _model(model_name, progress)
    beam = max(1, min(int(beam_size), MAX_BEAM))
    text, rest, split_notice = split_long(model, text)
    which = f"sentence 1 of {1 + len(rest)}" if rest else ""
    # with the requests arriving now; each one's figures are drawn in the batch's thread (serving.store.batched)
    out = batched(name, "translate", translate_batch, model, (text, beam),
                  finish=lambda result: _translated(model, text, beam, split_notice, result, kind, layer, head,
                                                    view, which))
    if rest:  # the other sentences, as one batched search (it holds one of the app's permits meanwhile)
        with heavy():
            return with_rest(model, out, rest, beam)
    return out


def with_rest(model, out: tuple, rest: list[str], beam: int) -> tuple:
    """translate's outputs with the text's other sentences translated (one batch) after the first one's."""
    results = model.translate_many(rest, beam_size=beam)
    for r in results:
        if isinstance(r, Exception):
            raise r
    return (" ".join([out[0], *(r.text for r in results)]), *out[1:])


def sentences_of(text: str) -> list[str]:
    """The sentences of a text (split after . ! ? …, a closing quote kept with its sentence)."""
    return [s.strip() for s in SENTENCE_END.split(text) if s.strip()] or [text]


def sentence_picker(text: str, number: str = ""):
    """The picker of the sentence the figures show: one choice per sentence, visible when there are several; a
    link's ``number`` picks that sentence (whose figures `translate_linked` drew)."""
    parts = sentences_of(read_text(text)) if (text or "").strip() else []
    choices = [f"{i} · {s[:70]}{'…' if len(s) > 70 else ''}" for i, s in enumerate(parts, 1)]
    many = len(choices) > 1
    k = int(number) - 1 if str(number or "").isdigit() and 0 < int(number) <= len(choices) else 0
    return (gr.update(choices=choices, value=choices[k] if many else None, visible=many),
            f"sentence {k + 1} of {len(choices)}" if many else "")


@on_gpu  # a ZeroGPU Space attaches its GPU for this call (tabs/zerogpu.py)
def show_sentence(text: str, picked: str, beam_size: int = 5, kind: str = "cross", head: str = "mean",
                  view: str = "heatmap", model_name: str = MODEL, layer: int = -1):
    """The figures of the picked sentence (the translation itself stays): that sentence translated alone, as the
    whole text's translation translated it."""
    parts = sentences_of(read_text(text))
    try:
        i = int(str(picked).split(" · ")[0]) - 1
    except ValueError:
        i = 0
    if not 0 <= i < len(parts):
        raise Error(f"The text has {len(parts)} sentences; pick one of them.")
    _, model = _model(model_name)
    beam = max(1, min(int(beam_size), MAX_BEAM))
    which = f"sentence {i + 1} of {len(parts)}"
    result = model.translate(parts[i], beam_size=beam)
    out = _translated(model, parts[i], beam, f"The figures show {which}: “{esc(parts[i])}” → “{esc(result.text)}”.",
                      result, kind, layer, head, view, which)
    return (*out[1:], which)


def _translated(model, text: str, beam: int, split_notice: str, result, kind: str, layer: int | None, head: str,
                view: str, which: str = ""):
    """translate's outputs for one result (the translation of ``text``, one sentence of a longer text: ``which``
    names it in the figures' titles), its attention drawn at ``layer`` (−1: the last)."""
    cross = result.attention["cross"]
    layer, head = index(layer, cross.layers, "layer"), head_index(head, cross.heads)
    layer_u, head_u = controls_for(cross.layers, cross.heads, layer, head)
    said = f"{which.capitalize()} · " if which else ""
    from models.inspect.decompose import attention_scores

    ids, _, _ = text_section.encode(model, text)
    npz = save_npz("translation", **{k: a.weights for k, a in result.attention.items()},
                   encoder_scores=attention_scores(model, ids),
                   source_tokens=result.source_tokens, target_tokens=result.target_tokens)
    notice = " ".join(x for x in (split_notice, result.notice) if x) or \
        f"Beam size {beam} · score {result.score:.3f} · {len(result.target_tokens)} decoder steps"
    notice = " ".join(x for x in (notice, prefix_notice(model)) if x)
    return (result.text, notice, *draw_translation(result, kind, layer, head, view, which),
            vt.beam_tree(result.beam, result.chosen, title=esc(f"{said}Beam search (beam size {beam})")),
            vt.cross_alignment(cross.weights, produced(result), cross.keys, layer=cross.layers - 1, head="mean",
                               **({"title": esc(f"{said}Cross-attention of the chosen translation")} if which else {})),
            result, npz, layer_u, head_u)


def translate_gradio_batch(texts: list[str], beams: list[int], kinds: list[str], layers: list[int], heads: list[str],
                           views: list[str], names: list[str] | None = None):
    """The measured alternative (ATLAS_BATCH=gradio, docs/ARCHITECTURE.md §9): Gradio's ``batch=True`` hands the
    queued requests over as lists; one batched search, then every request's figures in this one thread. A request
    that fails fails the whole batch (a batch function returns no per-request errors)."""
    if len(set(names or [MODEL])) > 1:  # one batch runs one model
        raise Error("A batch mixes translators; ATLAS_BATCH=gradio serves one model per batch.")
    _, model = _model((names or [MODEL])[0])
    prepared = []
    for text, beam_size in zip(texts, beams):
        beam = max(1, min(int(beam_size), MAX_BEAM))
        prepared.append((*split_long(model, read_text(text)), beam))
    results = translate_batch(model, [(text, beam) for text, _, _, beam in prepared])
    outputs = []
    for (text, rest, notice, beam), result, kind, layer, head, view in zip(prepared, results, kinds, layers, heads,
                                                                           views):
        if isinstance(result, Exception):
            raise result
        outputs.append(with_rest(model, _translated(model, text, beam, notice, result, kind, layer, head, view), rest,
                                 beam))
    return [list(column) for column in zip(*outputs)]


def translate_batch(model, items: list[tuple[str, int]]) -> list:
    """Several (text, beam size) requests: one batched search per beam size (``Translator.translate_many``); each
    answer equals that text's own ``translate``, a refused input's answer is its exception."""
    answers: list = [None] * len(items)
    for beam in sorted({b for _, b in items}):
        rows = [i for i, (_, b) in enumerate(items) if b == beam]
        for i, answer in zip(rows, model.translate_many([items[i][0] for i in rows], beam_size=beam)):
            answers[i] = answer
    return answers


SENTENCE_END = re.compile(r"(?:(?<=[.!?…])|(?<=[.!?…][\"'»”)\]]))\s+")  # the space after . ! ? … (and a quote)


def split_long(model, text: str) -> tuple[str, list[str], str]:
    """A text of several sentences is translated sentence by sentence, whatever its length (the model was trained on
    single captions of ~13 words: given five sentences at once it answers with one, silently dropping the rest):
    (the first sentence, which the figures show first; the other sentences; a notice saying so). A single sentence
    comes back whole, with no notice; one still too long is cut by the model (its notice)."""
    sentences = sentences_of(text)
    if len(sentences) == 1:
        return text, [], ""
    longer = (f"The text is longer than the model's {model.config.max_len} positions, so each"
              if model.tokenizer.encode(text, max_tokens=model.config.max_len).notice else "Each")
    return sentences[0], sentences[1:], (
        f"{longer} of its {len(sentences)} sentences was translated on its own (the model was trained on single "
        "captions; given several at once it drops sentences). The figures show the first sentence; pick another "
        "under the translation.")


def prefix_notice(model) -> str:
    """What a model with a task prefix (T5) reads: the notice under the translation says so."""
    prefix = getattr(model.tokenizer, "prefix", "")
    if not prefix:
        return ""
    return (f"T5 translates with its task prefix: the encoder reads “{esc(prefix.strip())}” before the sentence (from "
            "the model's config), so its tokens begin with it in the encoder and cross-attention figures.")


def compare_view(result) -> dict:
    """What the compare toggle draws: the encoder's attention, and how much cross-attention (last layer, mean of
    heads, summed over the German words) each English token receives."""
    cross = result.attention["cross"].weights[-1].mean(0)  # (T, S)
    return {"amap": result.attention["encoder"], "values": cross.sum(0), "kind": KINDS["encoder"],
            "what": "cross-attention received", "unit": "attention"}


def sequence(source: tuple[str, str] | str) -> tuple[str, list[int], list[str]]:
    """What the "why" section splits: the English sentence as the chosen translator's encoder read it."""
    text, name = source if isinstance(source, (tuple, list)) else (source, MODEL)
    name, net = _model(name)
    ids, tokens, _ = text_section.encode(net, text)
    return name, ids, tokens


def why_controls_for(text: str, picked: str = "", model_name: str = MODEL):
    """Keep the source and the translator for the "why" section (the sentence the figures show); its sliders follow
    the encoder (last layer, last token)."""
    name, net = _model(model_name)
    parts = sentences_of(read_text(text))
    try:
        source = parts[int(str(picked).split(" · ")[0]) - 1] if picked else parts[0]
    except (ValueError, IndexError):
        source = parts[0]
    ids, _, _ = text_section.encode(net, source)
    c = net.config
    return ((source, name), *why.controls(c.n_enc_layers, c.n_heads, len(ids)))


def draw_translation(result, kind: str, layer: int, head: str, view: str, which: str = ""):
    """The attention figure and head statistics of one kind, from the kept result (no model run); ``which`` ("sentence
    2 of 5") prefixes the titles when the text had several sentences."""
    if result is None:
        return None, None
    amap = result.attention[kind]
    title = f"{which.capitalize()} · {KINDS[kind]}" if which else KINDS[kind]
    if kind == "cross":  # row t is the step that produced the next German token: label it by that token
        amap = AttentionMap(amap.weights, produced(result), amap.keys)
    return attention_figure(amap, title, layer, parse_head(head), view), stats_figure(amap, title)


def produced(result) -> list[str]:
    """Each decoder step's output: row t of "decoder"/"cross" reads target token t and produces token t + 1 (the
    last produces </s>), so cross-attention rows are labelled "→ produced token"."""
    out = [*result.target_tokens[1:], "</s>"]
    return [f"→ {t}" for t in out[: len(result.target_tokens)]]
