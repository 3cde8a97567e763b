"""Image + text: a vision-language model answers a question about an image, and every generated token shows where it
looked (its attention over the image, beside gradient relevance, and how far the two agree), what it read of the text,
what the image tokens read as (the logit lens), the visual sinks, and the vision tower's own attention
(`checkpoints/vlm-fashion`; configured LLaVA, Idefics3 / SmolVLM, PaliGemma and Qwen2.5-VL folders). The readings
are `models.inspect.looking`, the figures `viz.describe`."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import gradio as gr
import numpy as np

from models import limits
from serving import catalogue, results
from tabs.common import (
    Error,
    Plot,
    fit,
    get_model,
    head_choices,
    head_index,
    index,
    intro,
    model_choice,
    parse_head,
    read_text,
    run_layer,
    save_npz,
)
from tabs.permalink import Field, Permalink, chain
from tabs.vision import enlarge
from tabs.zerogpu import on_gpu
from viz import attention as va
from viz import describe as vd
from viz import images as vi

TITLE = "Image + text"
INTRO = """**Where does a vision-language model look when it speaks?** Give it an image and a question; it answers
word by word. Pick a generated word to see its attention to the image tokens drawn over the pixels each token came
from, and beside it **relevance**: how much that word's probability depends on each part of the image (gradient ×
input). Attention says where the word *read from*; relevance, what it *depends on*; the verdict says when they
disagree. Below: what the word read of the text, what each image token reads as at each layer (the *logit lens*),
the image tokens that take attention whatever is asked (*visual sinks*), and the vision tower's own attention.

The built-in model is small and trained here on scenes of 2–4 Fashion-MNIST items (64×64 pixels, 8×8 patches,
34 words): ask it to *describe the image*, *what is at the top left?* or *where is the bag?*. Its pointing game on
held-out scenes (README): attention 0.93, relevance 0.90. LLaVA, Idefics3 / SmolVLM, PaliGemma and Qwen2.5-VL
folders can be configured (PaliGemma takes task prompts such as *caption en* or *answer en what is this?*)."""
MODEL = catalogue.SHIPPED["describe"][0]
SCENES = Path(__file__).resolve().parent.parent / "examples" / "scenes"
EXAMPLE_SCENES = sorted(str(p) for p in SCENES.glob("scene_*.png"))
PROMPTS = ["describe the image .", "what is at the top left ?", "what is in the middle ?", "where is the bag ?",
           "where is the sandal ?"]
QUERIES = {"while choosing it": "choose", "the word itself": "self"}  # which row of attention speaks for a word
MAX_NEW = 40
NO_RESULT = ("Describe an image first. (A long answer's attention is let go when newer long results need the "
             "server's memory: run it again.)")
SHOWN_SIDE = 320  # pixels of the clickable "what the model saw" image
STEP_INFO = "0: the word whose choice looked most sharply at one place"


def build() -> Permalink:
    intro(INTRO, MODEL)
    with gr.Row():
        with gr.Column(scale=2):
            image = gr.File(label="image (PNG, JPEG, GIF, BMP, WebP, TIFF)", file_types=list(limits.IMAGE_TYPES),
                            type="filepath")
            preview = gr.Image(label="the image given", interactive=False, height=SHOWN_SIDE // 2,
                               elem_id="describe-preview", visible=False)
            gr.Examples([[p] for p in EXAMPLE_SCENES], [image],
                        label="scenes of the ten Fashion-MNIST example images")
        with gr.Column(scale=2):
            model = model_choice(gr.Radio(catalogue.names("describe"), value=MODEL, label="model"))
            prompt = gr.Dropdown(PROMPTS, value=PROMPTS[0], allow_custom_value=True, label="question")
            tokens = gr.Slider(1, MAX_NEW, value=24, step=1, label="new tokens at most")
            run = gr.Button("Answer", variant="primary")
    notice = gr.Markdown()
    answer = gr.Markdown(elem_classes=["highlight"])
    with gr.Row():
        # its range stays 0 … MAX_NEW whatever the answer's length (issue 75, item 6: shrunk to a shorter answer's,
        # a value the page still held from the longer one was refused by the server: "Value 21 is greater than
        # maximum value 3"); a word past the answer's end is its last word, and the slider is set back to it
        step = gr.Slider(0, MAX_NEW, value=0, step=1, label="generated word (replay: move to see each in turn)",
                         info=STEP_INFO)
        query = gr.Radio(list(QUERIES), value="while choosing it", label="its attention",
                         info="the row of the position that chose the word, or of the word itself")
    with gr.Row():
        lo = gr.Slider(0, 3, value=3, step=1, label="from layer")
        hi = gr.Slider(0, 3, value=3, step=1, label="to layer")
        head = gr.Dropdown(head_choices(4), value="mean", label="head")
    verdict = gr.Markdown()
    with gr.Row():
        looked = Plot(label="attention over the image")
        relevance = Plot(label="relevance over the image")
    read = Plot(label="attention to the text")
    with gr.Row():
        lens_layer = gr.Slider(0, 4, value=4, step=1, label="logit lens: after layer (0 = the embeddings)")
    with gr.Row():
        lens = Plot(label="what each image token reads as")
        sink = Plot(label="visual sinks")
    sink_text = gr.Markdown()
    gr.Markdown("### The vision tower\nClick a patch of the image to see where it looks inside the tower.")
    with gr.Row():
        tower_layer = gr.Slider(0, 2, value=2, step=1, label="tower layer")
        tile = gr.Dropdown([], label="which tile the tower reads", visible=False,
                           info="a tiled image: each tile goes through the tower on its own")
    with gr.Row():
        seen = gr.Image(label="what the model saw: click a patch", interactive=False, height=SHOWN_SIDE,
                        width=SHOWN_SIDE, elem_id="describe-seen")
        tower = Plot(label="the clicked patch's attention in the tower")
    tower_heads = Plot(label="every head of the tower layer")
    patch = gr.Textbox(elem_id="describe-patch", elem_classes=["atlas-hidden"], show_label=False, container=False)
    state = gr.State()
    download = gr.File(label="attention arrays (.npz)")
    views = [state, step, query, lo, hi, head]
    token_out = [answer, verdict, looked, relevance, read, state]
    # a run draws its own defaults (the sharpest word, the last layers: another model's may be fewer); the sliders
    # follow, and a link sets them after the run
    first, lo_asked, hi_asked, lens_asked, tower_asked = gr.Number(0, visible=False, precision=0), *(
        run_layer() for _ in range(4))
    steps = [(describe, [image, model, prompt, tokens, first, query, lo_asked, hi_asked, head, lens_asked,
                         tower_asked],
              [answer, notice, verdict, looked, relevance, read, lens, sink, sink_text, seen, tower, tower_heads,
               download, state, step, lo, hi, head, lens_layer, tower_layer, tile]),
             (lambda: "", None, [patch], {"show_progress": "hidden"})]  # a new image: the centre patch again
    chain(run.click, steps, api_name="describe")
    image.change(preview_image, [image], [preview, notice], api_name=False, show_progress="hidden")
    for control in (step, query, lo, hi, head):
        control.change(redraw_token, views, [*token_out, step], api_name=False, show_progress="hidden")
    for control in (lo, hi):
        control.change(redraw_sinks, [state, lo, hi], [sink], api_name=False, show_progress="hidden")
    lens_layer.change(redraw_lens, [state, lens_layer], [lens, state], api_name=False, show_progress="hidden")
    tower_layer.change(relayer_tower, [state, tower_layer], [tower, tower_heads], api_name=False,
                       show_progress="hidden")  # the patch drawn stays (kept in the state)
    tile.input(retile_tower, [state, tile, tower_layer], [seen, tower, tower_heads], api_name=False)
    seen.select(on_seen_click, [state], [patch], api_name=False)
    patch.change(redraw_tower, [state, tower_layer, patch], [tower, tower_heads], api_name=False,
                 show_progress="hidden")
    return Permalink({"image": Field(image, read=example_path, write=example_name), "model": model,
                      "prompt": Field(prompt, read=read_text, write=lambda v: v or None), "tokens": tokens,
                      "as": query}, steps,
                     after={"step": step, "from": lo, "to": hi, "head": head, "lens": lens_layer,
                            "tower": tower_layer,
                            # a tile other than the one the tower is shown for first (the global view)
                            "tile": Field(tile, read=str, write=lambda v: v if v and v.startswith("tile ") else None),
                            "patch": patch}, state=state, limits=link_limits,
                     # a link's view is the first drawn: its word, layers, head, lens and tower layer go into the run,
                     # its tile and patch are drawn with it (the patch not cleared after, as a new image's is)
                     preset={"step": first, "from": lo_asked, "to": hi_asked, "head": head, "lens": lens_asked,
                             "tower": tower_asked}, finish=linked_patch, link_run=steps[:1])


def linked_patch(asked: dict, inputs: list, out: tuple) -> tuple:
    """A link's tower tile and patch drawn with the run's figures, at the tower layer the run drew."""
    state, name = out[13], asked.get("tile", "")
    seen = out[9]
    if name in tile_names(state["result"]):
        seen = enlarge(choose_tile(state, name), SHOWN_SIDE)
    elif not asked.get("patch"):
        return out
    tower_fig, heads_fig = redraw_tower(state, out[19]["value"], asked.get("patch", ""))
    return (*out[:9], seen, tower_fig, heads_fig, *out[12:20], {**out[20], "value": state["tile_name"]})


# --------------------------------------------------------------------------------------------- links
def example_path(name: str) -> str:
    """A link's image: one of the example scenes, by name ("scene_003"); a link never carries a path or a file."""
    if name == "upload":
        raise ValueError("The image was an upload, which a link cannot carry: pick an example or upload it again.")
    found = [p for p in EXAMPLE_SCENES if Path(p).stem == name]
    if not found:
        raise ValueError
    return found[0]


def example_name(path: str | None) -> str | None:
    if not path:
        return None
    stem = Path(path).stem
    return stem if any(Path(p).stem == stem and Path(p).name == Path(path).name for p in EXAMPLE_SCENES) else "upload"


def link_limits(state: dict) -> dict:
    r = state["result"]
    layers, heads = r.attention.shape[:2]
    rows, cols = _tower_grid(r)
    return {"step": range(0, _new(r) + 1), "from": range(layers), "to": range(layers),
            "head": head_choices(heads), "lens": range(layers + 1), "tower": range(max(1, len(r.vision_attention))),
            "patch": {f"{i},{j}" for i in range(rows) for j in range(cols)}, "tile": tile_names(r)}


# --------------------------------------------------------------------------------------------- handlers
@on_gpu  # a ZeroGPU Space attaches its GPU for this call (tabs/zerogpu.py)
def describe(image: str | None, model: str = MODEL, prompt: str = PROMPTS[0], max_new_tokens: int = 24,
             step: int = 0, query: str = "while choosing it", layer_from: int = -1, layer_to: int = -1,
             head: str = "mean", lens_layer: int = -1, tower_layer: int = -1,
             progress=gr.Progress(track_tqdm=True)):
    """Answer ``prompt`` about ``image``; draw where generated word ``step`` looked (layers ``layer_from`` to
    ``layer_to``, −1: the last; ``head``: mean, max or head k), its relevance, the text it read, the logit lens on the
    image tokens, the visual sinks and the tower's attention."""
    if not image:
        raise Error("Please upload an image or pick an example scene.")
    choices = catalogue.names("describe")
    if model not in choices:  # the API accepts any string: never turn it into a path
        raise Error(f"Unknown model {model!r}; choose one of {', '.join(choices)}.")
    question = read_text(prompt)  # empty: refused in words
    net = get_model(model, lambda done, text: progress(done, desc=text))
    n_new = int(index(max_new_tokens, MAX_NEW + 1, "new tokens")) if max_new_tokens else 0
    try:
        r = net.describe(image, net.chat_prompt(question), max_new_tokens=max(1, n_new))
    except ValueError as err:  # unreadable, truncated or oversized image, a prompt too long: the message says which
        raise Error(str(err)) from None
    layers, heads = r.attention.shape[:2]
    lo = index(layer_from, layers, "from layer")
    hi = index(layer_to, layers, "to layer")
    long = len(r.ids) > limits.LONG_TOKENS
    if long:  # a tiled image (SmolVLM: 925 tokens) keeps its attention in float16, as Generate's long inputs do
        r = dataclasses.replace(r, attention=r.attention.astype(np.float16, copy=False),
                                vision_attention=r.vision_attention.astype(np.float16, copy=False))
    names = tile_names(r)
    shown = next(name for name, k in names.items() if k == r.vision_tile)
    state = results.Kept(result=r, model=model, relevance={}, lens=None, sinks=None, patch=None,
                         towers={r.vision_tile: r.vision_attention}, tile=r.vision_tile, tile_name=shown)
    if long:  # all sessions' long results together stay under ATLAS_LONG_KEEP_MB: the oldest are let go
        results.LONG_RESULTS.keep(state, r.attention.nbytes + r.vision_attention.nbytes)
    k = _step(r, step)
    token = draw_token(state, k, query, lo, hi, head)
    lens_at = index(lens_layer, layers + 1, "lens layer")
    lens_fig = draw_lens(state, lens_at)
    t_layers = len(r.vision_attention)
    t_layer = index(tower_layer, max(1, t_layers), "tower layer")
    rows, cols = _tower_grid(r)
    tower_fig, heads_fig = draw_tower(state, t_layer, (rows // 2, cols // 2))
    npz = save_npz("describe", ids=np.asarray(r.ids), tokens=np.asarray(r.tokens), attention=r.attention,
                   image_positions=r.image_positions, image_cells=r.image_cells, image_boxes=r.image_boxes,
                   image=r.image, vision_attention=r.vision_attention,
                   relevance=np.stack([state["relevance"][q] for q in sorted(state["relevance"])]),
                   relevance_queries=np.asarray(sorted(state["relevance"])))
    lo_u = gr.update(maximum=layers - 1, value=lo)
    hi_u = gr.update(maximum=layers - 1, value=hi)
    head_u = gr.update(choices=head_choices(heads), value=head_index(head, heads, fit=True))
    step_u = gr.update(value=k, info=f"{_new(r)} new tokens in this answer; {STEP_INFO}")
    found = sinks_of(state)
    answer, verdict, looked, relevance, read, state = token
    return (answer, r.notice, verdict, looked, relevance, read, lens_fig, draw_sinks(r, found, lo, hi),
            _esc(found.text(r)), enlarge(_seen(r, r.vision_tile), SHOWN_SIDE), tower_fig, heads_fig, npz, state, step_u,
            lo_u, hi_u, head_u, gr.update(maximum=layers, value=lens_at),
            gr.update(maximum=max(0, t_layers - 1), value=t_layer),
            gr.update(choices=list(names), value=shown, visible=len(names) > 1))


def _new(r) -> int:
    return len(r.ids) - r.prompt_len


def _step(r, step) -> int:
    """Generated word ``step`` (1-based), fitted into the answer; 0: the word whose choice looked most sharply at one
    place (the largest share of the choosing position's image attention on one image token, last layer, mean of
    heads): on the built-in model, mostly an object's word."""
    if not step:
        rows = r.attention[-1, :, r.prompt_len - 1:len(r.ids) - 1].mean(axis=0)[:, r.image_positions]  # (new, N)
        sharp = rows.max(axis=1) / np.maximum(rows.sum(axis=1), 1e-12)
        return int(np.argmax(sharp)) + 1 if len(sharp) else 1
    return int(np.clip(int(step), 1, max(1, _new(r))))


def query_position(r, k: int, query: str) -> int:
    """The row that speaks for generated word k: the position that chose it, or the word's own."""
    position = r.prompt_len + k - 1
    return position - 1 if QUERIES.get(query, "choose") == "choose" else position


def draw_token(state: dict, k: int, query: str, lo: int, hi: int, head: str):
    """(answer, verdict, attention overlay, relevance overlay, text attention, state) for generated word k."""
    from models.inspect import looking

    r = state["result"]
    position = r.prompt_len + k - 1
    q = query_position(r, k, query)
    lo, hi = sorted((int(lo), int(hi)))
    head = head_index(parse_head(head), r.attention.shape[1], fit=True)
    att = looking.image_row(r, q, (lo, hi), head)
    chose = q if q == position - 1 else position - 1
    if chose not in state["relevance"]:
        state["relevance"][chose] = get_model(state["model"]).image_relevance(r, [chose])[0]
    rel = state["relevance"][chose]
    cmp = looking.compare(r, att, rel)
    word = r.tokens[position]
    layers = f"layer {lo}" if lo == hi else f"layers {lo}–{hi}"
    who = "the position choosing" if q == position - 1 else "the word"
    names = [r.tokens[int(p)] for p in r.image_positions]
    group = _groups(r)[0]
    shown = {"names": [names[i] for i in group]}
    mark = lambda i, colour, name: (r.image_boxes[i], colour, name)  # noqa: E731
    looked = vd.image_overlay(r.image, att[group], r.image_boxes[group], **shown,
                              title=va.describe(f"{who} “{_esc(word)}” → image", None, head) + f" · {layers}"
                              "<br><sup>blue box: where relevance points</sup>",
                              marks=[mark(cmp.relevance_token, "#2166ac", "relevance's top token")])
    relevance = vd.image_overlay(r.image, rel[group], r.image_boxes[group], **shown, signed=True,
                                 label="relevance (gradient × input)",
                                 title=f"Relevance of “{_esc(word)}” (gradient × input)"
                                 "<br><sup>red is for the word, blue against; orange box: where attention points</sup>",
                                 marks=[mark(cmp.attention_token, "#e66101", "attention's top token")])
    text = looking.text_positions(r)
    text_w = looking.text_row(r, q, (lo, hi), head)
    keep = text <= q
    read = vd.text_attention([r.tokens[i] for i in text[keep]], text_w[keep], image_share=float(att.sum()),
                             query=int(np.flatnonzero(text[keep] == q)[0]) if q in text[keep] else None,
                             title=va.describe(f"{who} “{_esc(word)}” → text", None, head) + f" · {layers}")
    return (answer_text(r, k), _esc(cmp.text) + _group_note(r), looked, relevance, read, state)


def _esc(text: str) -> str:
    return str(text).replace("<", "‹").replace(">", "›")


def _groups(r) -> list[np.ndarray]:
    """The image tokens that are places (not a tower's class token), split into groups whose boxes do not overlap:
    the tiles, then a global view over the same pixels (viz.describe.token_groups), as indices among the image
    tokens."""
    places = np.flatnonzero(r.image_cells[:, 1] >= 0)
    return [places[g] for g in vd.token_groups(r.image_cells[places], r.image_boxes[places])]


def _group_note(r) -> str:
    groups, extra = _groups(r), int((r.image_cells[:, 1] < 0).sum())
    note = ""
    if len(groups) > 1:
        note += (f" The image was read as {len(groups)} layers of tokens over the same pixels (the tiles, then a "
                 "downscaled global view): the maps show the tiles; the .npz holds every token.")
    if extra:
        note += " The tower's class token stands for no place: it is not drawn."
    return note


# a special of the prompt's layout or chat template, not a word of the question (<fake_token_around_image>,
# <row_1_col_1>, <|im_start|>, <s>); and pieces that only break lines
LAYOUT_TOKEN = re.compile(r"<[^<>\s]+>|[↵\s]+")


def answer_text(r, k: int) -> str:
    """The question (the prompt's text without the image tokens and the layout's specials) and the answer, the chosen
    word marked; pieces that mark a space ("▁", as models.inputs.tokenizer.readable_piece shows one) are joined into
    the words they spell, whole words (the built-in model's) with spaces."""
    image = {int(p) for p in r.image_positions}
    spaced = any(t.startswith("▁") for t in r.tokens)
    join = "".join if spaced else " ".join

    def show(t: str) -> str:
        return _esc(t.replace("▁", " ") if spaced else t)

    shown = [(" " if spaced else "") if i in image or LAYOUT_TOKEN.fullmatch(t) else show(t)
             for i, t in enumerate(r.tokens[:r.prompt_len])]
    question = re.sub(r"\s+", " ", join(t for t in shown if t)).strip()
    words = [show(t) for t in r.tokens[r.prompt_len:]]
    if 0 < k <= len(words):
        w = words[k - 1]
        words[k - 1] = w[:len(w) - len(w.lstrip())] + f"**[{w.strip()}]**"
    return f"*{question}* → {join(words).strip() or '(no new token)'}"


def kept(state: dict | None) -> bool:
    """Whether there is a result to redraw: False before the first run; a long result let go since (its state
    emptied by serving.results) raises NO_RESULT, so a moved slider says why nothing changes."""
    if state is None:
        return False
    if not state:
        raise Error(NO_RESULT)
    return True


def redraw_token(state: dict | None, step: int, query: str, lo: int, hi: int, head: str):
    """The token's figures, and the replay slider set back to the answer's last word when it stands past it."""
    if not kept(state):
        return (gr.update(),) * 5 + (state, gr.update())
    k = _step(state["result"], step)
    return (*draw_token(state, k, query, lo, hi, head), gr.update(value=k) if step and k != int(step) else gr.update())


def preview_image(image: str | None):
    """The upload as it was given (a file chip alone showed nothing until answered), fitted into the preview; an
    unreadable file is said in the notice at once."""
    from models.inputs.images import open_image

    if not image:
        return gr.update(value=None, visible=False), ""
    try:
        img, said = open_image(image, at_least=SHOWN_SIDE)
    except ValueError as err:
        return gr.update(value=None, visible=False), _esc(str(err))
    img = img.convert("RGB")
    img.thumbnail((SHOWN_SIDE, SHOWN_SIDE))
    return gr.update(value=np.asarray(img), visible=True), _esc(said)


def sinks_of(state: dict):
    from models.inspect import looking

    if state["sinks"] is None:
        state["sinks"] = looking.sinks(state["result"])
    return state["sinks"]


def draw_sinks(r, found, lo: int, hi: int):
    lo, hi = sorted((int(lo), int(hi)))
    share = found.received[lo:hi + 1].mean(axis=0)
    group = _groups(r)[0]
    layers = f"layer {lo}" if lo == hi else f"layers {lo}–{hi}"
    return vd.image_overlay(r.image, share[group], r.image_boxes[group],
                            names=[r.tokens[int(r.image_positions[i])] for i in group],
                            label="mean share from a text position",
                            title=f"Share each image token takes from the text · {layers}")


def redraw_sinks(state: dict | None, lo: int, hi: int):
    if not kept(state):
        return gr.update()
    return draw_sinks(state["result"], sinks_of(state), lo, hi)


def draw_lens(state: dict, layer: int):
    """The logit lens of the first tile's image tokens after ``layer`` (0: the embeddings)."""
    r = state["result"]
    if state["lens"] is None:
        state["lens"] = get_model(state["model"]).image_lens(r)
    ids, probs = state["lens"]
    layer = int(np.clip(layer, 0, len(ids) - 1))
    tile = (r.image_cells[:, 0] == r.image_cells[0, 0]) & (r.image_cells[:, 1] >= 0)
    rows, cols = r.image_cells[tile, 1].max() + 1, r.image_cells[tile, 2].max() + 1
    words = np.full((rows, cols), "", dtype=object)
    p = np.zeros((rows, cols), np.float32)
    piece = get_model(state["model"]).piece
    for k in np.flatnonzero(tile):
        _, i, j = r.image_cells[k]
        words[i, j], p[i, j] = piece(int(ids[layer, k])), probs[layer, k]
    where = "the embeddings" if layer == 0 else f"layer {layer - 1}"
    # the half-width column's width (its own 638 px scrolled sideways in a 600 px box at 1400 px)
    return fit(vd.lens_grid(words, p, title=f"Logit lens on the image tokens · after {where}"))


def redraw_lens(state: dict | None, layer: int):
    if not kept(state):
        return gr.update(), state
    return draw_lens(state, int(layer)), state


def _tower_grid(r) -> tuple[int, int]:
    """The tower's patch rows and columns over one tile (its attention is over one tile's patches)."""
    return tuple(r.vision_grid) if r.vision_grid[0] else r.grid


def tile_names(r) -> dict[str, int]:
    """The tiles the tower reads, by the name the tab lists them under -> their index in ``image_cells[:, 0]``: one
    "whole image", or "tile 1" ... (row by row) and the "global view" over them (Idefics3)."""
    tiles = np.unique(r.image_cells[r.image_cells[:, 1] >= 0, 0])
    if len(tiles) == 1:
        return {"whole image": int(tiles[0])}
    names = {}
    for k in tiles:
        first = int(np.flatnonzero(r.image_cells[:, 0] == k)[0])
        glob = "global" in r.tokens[int(r.image_positions[first])]
        names["global view" if glob else f"tile {len(names) + 1}"] = int(k)
    return names


def _seen(r, tile: int) -> np.ndarray:
    """The pixels of one tile (the whole image for one tile or a global view)."""
    mine = (r.image_cells[:, 0] == tile) & (r.image_cells[:, 1] >= 0)
    b = r.image_boxes[mine] if mine.any() else r.image_boxes
    return r.image[b[:, 1].min():b[:, 3].max(), b[:, 0].min():b[:, 2].max()]


def choose_tile(state: dict, name: str) -> np.ndarray:
    """Make tile ``name`` the one the tower views draw, its attention computed on first use (the model's
    ``tower_attention``) and kept; returns its pixels."""
    r = state["result"]
    k = tile_names(r).get(name)
    if k is None:
        raise Error(f"This image has no {name!r}; pick one of {', '.join(tile_names(r))}.")
    if k not in state["towers"]:  # kept beside the one describe returned, in place of the tile picked before
        w = get_model(state["model"]).tower_attention(r, k)
        state["towers"] = {r.vision_tile: r.vision_attention, k: w.astype(r.vision_attention.dtype, copy=False)}
        if len(r.ids) > limits.LONG_TOKENS:  # counted with the answer under ATLAS_LONG_KEEP_MB
            results.LONG_RESULTS.keep(state, r.attention.nbytes + sum(a.nbytes for a in state["towers"].values()))
    state["tile"], state["tile_name"] = k, name
    return _seen(r, k)


def draw_tower(state: dict, layer: int, patch: tuple[int, int]):
    """The tower's attention from one patch (mean of heads) and every head's, over the chosen tile's pixels (a class
    token before the patches is left out of the map)."""
    r = state["result"]
    weights = state["towers"][state["tile"]]
    if not len(weights):
        return None, None
    grid, k = _tower_grid(r), r.vision_prefix
    w = weights[int(np.clip(layer, 0, len(weights) - 1))].astype(np.float32)  # (H, k + M, k + M)
    row = k + patch[0] * grid[1] + patch[1]
    image = _seen(r, state["tile"])
    where = "" if len(tile_names(r)) == 1 else f" · {state['tile_name']}"
    one = fit(vi.query_patch_attention(image, w.mean(axis=0)[row, k:], grid, patch,  # its column's width, as Vision
                                       title=f"Tower layer {layer}{where}: patch r{patch[0]}c{patch[1]} → patches · "
                                       "mean of heads"))
    every = vi.image_attention_grid(image, w[:, row, k:], grid, titles=[f"head {h}" for h in range(w.shape[0])],
                                    title=f"Tower layer {layer}{where}: patch r{patch[0]}c{patch[1]}, every head")
    return one, every


def on_seen_click(state: dict | None, evt: gr.SelectData) -> str:
    if not kept(state):
        return ""
    r = state["result"]
    image = _seen(r, state["tile"])
    scale = enlarge(image, SHOWN_SIDE).shape[0] / image.shape[0]
    rows, cols = _tower_grid(r)
    row = int(np.clip(evt.index[1] / scale / image.shape[0] * rows, 0, rows - 1))
    col = int(np.clip(evt.index[0] / scale / image.shape[1] * cols, 0, cols - 1))
    return f"{row},{col}"


def redraw_tower(state: dict | None, layer: int, patch: str):
    """The tower's figures for a patch ("row,col"; empty or anything else: the centre), which the state keeps."""
    if not kept(state):
        return None, None
    rows, cols = _tower_grid(state["result"])
    try:
        query = tuple(index(v, n, "patch", fit=True) for v, n in zip(patch.split(","), (rows, cols), strict=True))
    except (ValueError, Error):  # "" (a new image) or anything else: the centre patch
        query = (rows // 2, cols // 2)
    state["patch"] = query
    return draw_tower(state, int(layer), query)


def relayer_tower(state: dict | None, layer: int):
    """Another tower layer, at the patch drawn last."""
    if not kept(state):
        return None, None
    rows, cols = _tower_grid(state["result"])
    return draw_tower(state, int(layer), state.get("patch") or (rows // 2, cols // 2))


def retile_tower(state: dict | None, name: str, layer: int):
    """Another tile through the tower: (its pixels to click, the tower's figures at the patch drawn last; every tile
    has the same patch grid)."""
    if not kept(state):
        return None, None, None
    seen = choose_tile(state, name)
    return (enlarge(seen, SHOWN_SIDE), *relayer_tower(state, layer))
