"""Vision: image classification with ViT and Swin (`checkpoints/vit-fashion`, `swin-fashion`; ImageNet ViT-B/16
and Swin-T from torchvision's cache, downloaded on first use where the network allows; configured ViT folders),
attention drawn over the image the model saw."""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import numpy as np

from models import limits
from serving import catalogue
from serving.catalogue import IMAGENET, checkpoint_labels, configured
from tabs.common import (
    EXAMPLE_IMAGES,
    EXAMPLE_NAMES,
    EXPLANATIONS,
    FAST,
    Error,
    Plot,
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
    run_layer,
    save_npz,
    target_index,
    window_figure,
)
from tabs.permalink import Field, Permalink, chain, one_of
from tabs.sections.focus import section as focus_section
from tabs.zerogpu import on_gpu
from viz import attention as va
from viz import attribution as vattr
from viz import images as vi
from viz import stats as vs
from viz import swin as vw

TITLE = "Vision"
INTRO = """**Image classification with a Vision Transformer (ViT) or a Swin Transformer.** Any image is
converted the way the model was trained (Fashion-MNIST: grey, 28×28, dark background), and attention is
drawn on exactly that image. For ViT the maps show where the CLS token, which makes the prediction, looks;
*rollout* follows it through every layer. Click a patch of *what the model saw* (the image further down the
page) to see where it looks.
Swin attends only inside local windows: its maps stay within the highlighted window.

**Attention is not explanation**: where the CLS token looks is not what the answer depends on. The
*explanation* map shows one method's signed attribution (red supports the class, blue speaks against it), and
the *deletion curve* tests every method on this image: grey out the patches a method ranks highest and watch
the class probability; the faster it falls, the more faithful the ranking.

**Real models can be picked**: ViT-B/16 and Swin-T on ImageNet (torchvision), `microsoft/swin-tiny-patch4-window7-224`
(a Hugging Face Swin) and `facebook/deit-tiny-distilled-patch16-224` (DeiT-Ti with its distillation token), both
downloaded on first use, and any ViT, DeiT or Swin classifier the server is configured with."""
SHOWN_SIDE = 336  # pixels of the clickable "what the model saw" image
PREVIEW_SIDE = 160  # pixels of the upload preview and of what the model will see
FASHION = catalogue.SHIPPED["vision"]  # the models that see 28×28 grey (the others: what their preprocessing crops)


def build() -> Permalink:
    intro(INTRO, "vit-fashion", "swin-fashion")
    with gr.Row():
        with gr.Column(scale=2):
            image = gr.File(label="image (PNG, JPEG, GIF, BMP, WebP, TIFF)", file_types=list(limits.IMAGE_TYPES),
                            type="filepath")
            gr.Examples([[p] for p in EXAMPLE_IMAGES], [image], label="Fashion-MNIST test images")
        with gr.Column(scale=1, min_width=160):
            uploaded = gr.Image(label="your image", interactive=False, height=PREVIEW_SIDE, elem_id="vision-upload")
            will_see = gr.Image(label="the model's input", interactive=False, height=PREVIEW_SIDE,
                                elem_id="vision-will-see")
        with gr.Column(scale=1):
            model = model_choice(gr.Radio(catalogue.names("vision"), value="vit-fashion", label="model"))
            top_k = gr.Slider(1, 10, value=5, step=1, label="top-k classes")
            run = gr.Button("Classify image", variant="primary")
    notice = gr.Markdown()
    layer, head, view = layer_head_view(["CLS → patches", "rollout"], "CLS → patches")
    with gr.Row():
        probs = Plot(label="top classes")
        overlay = Plot(label="attention over the image")
    with gr.Row():
        explanation = gr.Dropdown([(shown, key) for key, shown in EXPLANATIONS.items()], value="rollout",
                                  label="explanation", scale=2)
        # the model's classes, as in Classify (a free-text box ignored Enter and any class name it did not know);
        # a typed class is still taken (ImageNet's 1,000 load with the model's choice) and checked by the handler
        target = gr.Dropdown(class_choices("vit-fashion"), value="", label="explain the class", scale=1,
                             allow_custom_value=True)
    with gr.Row():
        explained = Plot(label="explanation over the image")
        curve = Plot(label="deletion curve: every explanation on this image")
    with gr.Row():
        seen = gr.Image(label="what the model saw: click a patch", interactive=False, height=SHOWN_SIDE,
                        width=SHOWN_SIDE, elem_id="seen-image")
        query = Plot(label="the clicked patch's attention")
    # The clicked patch as "row,col" ("": the centre), which a permalink carries; hidden by CSS (app.py).
    patch = gr.Textbox(elem_id="vision-patch", elem_classes=["atlas-hidden"], show_label=False, container=False)
    heads = Plot(label="every head of the layer")
    distance = Plot(label="mean attention distance")
    state = gr.State()
    download = gr.File(label="attention arrays (.npz)")
    layer_asked = run_layer()
    steps = [(classify_image, [image, model, top_k, layer_asked, head, view, explanation, target],
              [probs, overlay, heads, query, distance, seen, notice, state, download, layer, head, explained]),
             (lambda: "", None, [patch], {"show_progress": "hidden"}),  # a new image: the centre patch again
             (deletion_plot, [state, explanation], [curve])]
    chain(run.click, steps, api_name="classify_image")
    chain(target.input, steps)  # a class picked: explained at once
    model.change(target_update, [model, target], [target], api_name=False, show_progress="hidden")
    explanation.change(reexplain, [state, explanation], [explained, curve], api_name=False, show_progress="minimal")
    for control in (layer, head, view):
        control.change(redraw_image, [state, layer, head, view], [overlay, heads, query], api_name=False,
                       show_progress="hidden", **FAST)
    # what applies to the chosen model (a link's choice too): Swin has no CLS token and only gradient explanations
    model.change(offered, [model, explanation], [explanation, view], api_name=False, show_progress="hidden")
    seen.select(on_image_click, [state], [patch], api_name=False, **FAST)
    patch.change(show_patch, [state, layer, head, patch], [query, state], api_name=False, show_progress="hidden",
                 **FAST)
    for event in (image.change, model.change):
        event(preview, [image, model], [uploaded, will_see], api_name=False, show_progress="hidden", **FAST)
    # another model chosen: the figures of the one before are taken down (a model that then fails to load leaves no
    # other model's answer under its name)
    model.input(model_changed, [model, state], [probs, overlay, heads, query, distance, seen, notice, state, download,
                                         explained, curve], api_name=False, show_progress="hidden", **FAST)
    focus_section(image)  # DINOv2 ViT-S/14 (real): attention beside its saliency map (tabs/sections/focus.py)
    labels = one_of(target, lambda: checkpoint_labels("vit-fashion", "swin-fashion", *configured("vision")))
    return Permalink({"image": Field(image, read=example_path, write=example_name), "model": model, "top": top_k,
                      "explanation": explanation, "target": labels, "show": view}, steps,
                     after={"layer": layer, "head": head, "patch": patch}, state=state, limits=link_limits,
                     preset={"layer": layer_asked, "head": head}, finish=linked_patch,
                     link_run=[steps[0], *steps[2:]])  # a link keeps its patch (the button's run clears it)


def linked_patch(asked: dict, inputs: list, out: tuple) -> tuple:
    """A link's clicked patch drawn with the run's figures (the first the page shows), at the layer and head the run
    drew; a patch the result lacks keeps the centre's (the check after the run says so)."""
    state = out[7]
    if "patch" not in asked or asked["patch"] not in link_limits(state)["patch"]:
        return out
    query, state = show_patch(state, inputs[3], inputs[4], asked["patch"])
    return (*out[:3], query, *out[4:7], state, *out[8:])


def class_choices(model: str) -> list[tuple[str, str]]:
    """The classes the chosen model can be asked to explain, after "the predicted class" (the empty value): a
    checkpoint's from its config.json (no torch), ImageNet's from torchvision's weight entry."""
    if model in IMAGENET:
        try:
            from models.io.pretrained import imagenet_labels

            labels = imagenet_labels(IMAGENET[model])
        except Exception:  # noqa: BLE001 — no torchvision entry: the predicted class only, a typed one still checked
            labels = []
    else:
        labels = checkpoint_labels(model)
    return [("the predicted class", ""), *[(label, label) for label in labels]]


def target_update(model: str, target: str):
    """The class choices of the model now chosen; the chosen class stays if this model has it."""
    choices = class_choices(model)
    keep = target if target in [value for _, value in choices] else ""
    return gr.update(choices=choices, value=keep)


def offered(model: str, explanation: str):
    """The explanation choices and the view switch for a model: Swin offers only the gradient methods (its
    attention stays inside windows, so there is nothing global to read, roll out or trace) and no CLS → patches /
    rollout switch (it has no CLS token; its map is one token's attention inside its window, at the chosen block)."""
    family = catalogue.family(model)  # from its config.json (models.registry), before the model is loaded
    keys = tuple(k for k in EXPLANATIONS if family is None or k in family.methods)
    swin = "rollout" not in keys  # windowed attention: no CLS token, no global map to roll out
    value = explanation if explanation in keys else keys[0]
    view = gr.update(interactive=not swin, value=None if swin else "CLS → patches",  # Swin: neither applies
                     info="Swin has no CLS token: the map is the centre token's attention inside its window (click a "
                          "patch for another), at the block the layer slider picks; no rollout" if swin else None)
    return gr.update(choices=[(EXPLANATIONS[k], k) for k in keys], value=value), view


def preview(image: str | None, model: str):
    """The upload as a picture, and what the chosen model will see of it (Fashion-MNIST models: the 28×28 grey
    image, enlarged; the others: the upload, which their preprocessing resizes and crops); nothing for an image
    that cannot be read (classifying it says why). The upload's transparent pixels are shown on the ground the model
    puts them on (``transparent_ground``): black for a Fashion-MNIST model where the ground is see-through, white for
    the RGB models, so the two pictures agree on what is background."""
    if not image:
        return None, None
    from models.inputs.images import FASHION_DECODE, fashion_array, open_image, to_rgb, transparent_ground

    try:
        # decoded once, for both pictures; a large JPEG at reduced scale, as classifying decodes it
        img, _ = open_image(image, at_least=FASHION_DECODE)
        seen = enlarge(fashion_array(img)[0], PREVIEW_SIDE) if model in FASHION else model_input(img, model)
        img = to_rgb(img, transparent_ground(img, "fashion" if model in FASHION else "rgb"))
        img.thumbnail((2 * PREVIEW_SIDE, 2 * PREVIEW_SIDE))
        shown = enlarge(np.asarray(img), PREVIEW_SIDE)  # a 28- or 5-pixel upload, enlarged to be seen
    except ValueError:
        return None, None
    return shown, seen


def model_input(img, model: str) -> np.ndarray | None:
    """Exactly what an RGB model will see of an image: its own preprocessing's picture (models.inputs.images.prepare
    with the model's settings: a Hugging Face folder's resize, which squashes a 4:3 photo to a square, and crop;
    torchvision's resize and centre crop for the ImageNet models); None while the model cannot be had (classifying
    says why). The model is loaded on its first preview, as classifying would."""
    from models.inputs.images import prepare

    try:
        net = get_model(model)
    except gr.Error:
        return None
    cfg = net.config
    prepared = prepare(img, cfg.input, resize=getattr(cfg, "resize", 256), crop=cfg.image_size,
                       interpolation=getattr(cfg, "interpolation", "bilinear"),
                       processor=getattr(cfg, "processor", None))
    return enlarge(prepared.shown, PREVIEW_SIDE)


def model_changed(model: str, state: dict | None = None) -> tuple:
    """The outputs once another model is chosen: every figure and the kept result empty, a line saying so. Run
    queued behind a Classify image of this very model, the answer now kept is this model's and stays."""
    if state and state["model"] == IMAGENET.get(model, model):
        return tuple(gr.skip() for _ in range(11))
    return (None, None, None, None, None, None, f"*{model} chosen: press **Classify image** to see its answer.*",
            None, None, None, None)


def example_path(name: str) -> str:
    """A link's image: one of the example images, by name ("sneaker"); a link never carries a path or a file."""
    if name == "upload":
        raise ValueError("The image was an upload, which a link cannot carry: pick an example or upload it again.")
    if name not in EXAMPLE_NAMES:
        raise ValueError  # the image falls back to none, with the usual notice
    return EXAMPLE_NAMES[name]


def example_name(path: str | None) -> str | None:
    """The example an image file is (by its file name), "upload" for any other file, None for no image."""
    if not path:
        return None
    name = Path(path).name
    return next((key for key, example in EXAMPLE_NAMES.items() if Path(example).name == name), "upload")


def link_limits(state: dict) -> dict:
    """What a link's layer, head and clicked patch may be for a kept result."""
    result = state["result"]
    layers, heads = _depth(result)
    rows, cols = result.grid
    return {"layer": range(layers), "head": head_choices(heads),
            "patch": {f"{r},{c}" for r in range(rows) for c in range(cols)}}


@on_gpu  # a ZeroGPU Space attaches its GPU for this call (tabs/zerogpu.py)
def classify_image(image: str | None, model: str = "vit-fashion", top_k: int = 5, layer: int = -1,
                   head: str = "mean", view: str = "CLS → patches", explanation: str = "rollout", target: str = "",
                   progress=gr.Progress(track_tqdm=True)):
    """Classify an image; return the top classes, attention laid over what the model saw and the chosen
    explanation toward the target class (the predicted one by default)."""
    if not image:
        raise Error("Please upload an image or pick an example.")
    choices = catalogue.names("vision")
    if model not in choices:  # the API accepts any string: never turn it into a path
        raise Error(f"Unknown model {model!r}; choose one of {', '.join(choices)}.")
    method = method_id(explanation)
    name = IMAGENET.get(model, model)
    # the ImageNet weights download on first use where the network allows (torchvision's progress bar shows)
    net = get_model(name, lambda done, text: progress(done, desc=text))
    try:
        result = net.classify(image)
    except ValueError as err:  # unreadable, truncated or oversized image: the message says which
        raise Error(str(err)) from None
    n_layers, n_heads = _depth(result)
    layer, head = index(layer, n_layers, "layer"), head_index(head, n_heads)  # drawn here (layer −1: the last)
    layer_u, head_u = controls_for(n_layers, n_heads, layer, head)
    if result.attention:
        arrays = {"encoder": result.attention["encoder"].weights, "tokens": result.attention["encoder"].keys}
    else:
        arrays = {f"stage{w.stage}_block{w.block}": w.weights for w in result.windows}
    query = (result.grid[0] // 2, result.grid[1] // 2)
    # the explanations start from the model's input as it ran (not the upload decoded and converted again)
    kept = result.tensor if result.tensor is not None else image
    state = {"result": result, "query": query, "model": name, "input": kept,
             "target": target_index(target, result.labels), "attributions": {}}
    attribution = attribute(state, method, progress)
    npz = save_npz("image", image=result.image, probs=result.probs, labels=result.labels,
                   attribution=attribution.values.astype(np.float32), attribution_method=attribution.method,
                   attribution_target=attribution.label, **arrays)
    overlay, grid_fig = draw_image(result, layer, head, view)
    notice = "\n\n".join(x for x in (result.unusual, result.notice, _offered(method, attribution)) if x)
    title = "Top classes" + (f" (calibrated: logits ÷ {result.temperature:.2f})" if result.temperature != 1 else "")
    return (fit(vi.topk_bars(result.labels, result.probs, k=int(top_k), title=title)), overlay, grid_fig,
            draw_query(result, layer, head, query), distance_figure(result), enlarge(result.image),
            notice, state, npz, layer_u, head_u, explanation_figure(result, attribution))


def _offered(asked: str, attribution) -> str:
    if attribution.method == asked:
        return ""
    return (f"{EXPLANATIONS[asked]} is not offered for this model: Swin attends inside local windows only, so there "
            f"is no global attention to roll out or trace; showing {EXPLANATIONS[attribution.method]}.")


def explanation_figure(result, attribution):
    """One explanation of the kept image, signed, over what the model saw."""
    free = attribution.method in ("attention", "rollout")  # read from the attention alone: for no class
    title = (f"{EXPLANATIONS[attribution.method]} · same for all classes" if free else
             f"{EXPLANATIONS[attribution.method]} toward {attribution.label} ({attribution.prob:.1%})")
    title += completeness(attribution)
    return fit(vattr.image_attribution(result.image, attribution.values, attribution.grid, title=title,
                                       signed=not free, label="share of attention" if free else "attribution"))


@on_gpu  # a ZeroGPU Space attaches its GPU for this call (tabs/zerogpu.py)
def reexplain(state: dict | None, explanation: str, progress=gr.Progress()):
    """Another explanation: draw it (each is computed once per image) and mark it on the deletion curve."""
    if not state:
        return None, None
    attribution = attribute(state, method_id(explanation), progress)
    return explanation_figure(state["result"], attribution), deletion_plot(state, explanation, progress)


def _depth(result) -> tuple[int, int]:
    """(layers, heads) the controls offer: ViT's encoder layers, or Swin's blocks and their most heads."""
    if result.attention:
        amap = result.attention["encoder"]
        return amap.layers, amap.heads
    return len(result.windows), max(w.weights.shape[1] for w in result.windows)


def enlarge(image: np.ndarray, side: int = SHOWN_SIDE) -> np.ndarray:
    """Nearest-neighbour upscale so a 28×28 input is big enough to click a patch on."""
    factor = max(1, side // max(image.shape[:2]))
    return np.repeat(np.repeat(image, factor, axis=0), factor, axis=1)


def draw_image(result, layer: int, head: str, view: str):
    """The overlay (one head, fusion or rollout) and the every-head grid of one layer."""
    if result is None:
        return None, None
    head = parse_head(head)
    if result.attention:  # ViT: CLS → patch attention
        from models.analysis import rollout

        amap = result.attention["encoder"]
        layer, head = index(layer, amap.layers, "layer", fit=True), head_index(head, amap.heads, fit=True)
        w = amap.weights[layer]  # (H, T, T)
        if view == "rollout":
            values = rollout(amap.weights)[-1][0]
            title = "Attention rollout from CLS over all layers"
        else:
            values = va.select_head(w, None, head)[0]
            title = va.describe("CLS → patch attention", layer, head)
        k = result.prefix_tokens  # [CLS] (and any other prefix token) before the patches
        overlay = fit(vi.image_attention(result.image, values[k:], result.grid, title=title))
        grid_fig = vi.image_attention_grid(result.image, w[:, 0, k:], result.grid,
                                           titles=[f"head {h}" for h in range(w.shape[0])],
                                           title=f"CLS → patch attention, every head of layer {layer}")
        return overlay, grid_fig
    block = result.windows[index(layer, len(result.windows), "block", fit=True)]
    query = (block.grid[0] // 2, block.grid[1] // 2)
    overlay = fit(window_figure(result, block, head, query))
    heads = block.weights.shape[1]
    maps = [vw.window_attention_map(block.weights, block.grid, block.window, block.shift, query, h)[0]
            for h in range(heads)]  # one query's attention inside its window, over the stage's grid
    grid_fig = vi.image_attention_grid(
        result.image, np.stack([np.nan_to_num(m).ravel() for m in maps]), block.grid, patch=block.patch,
        titles=[f"head {h}" for h in range(heads)],
        title=f"Centre token's window attention, every head · stage {block.stage} block {block.block}")
    return overlay, grid_fig


def draw_query(result, layer: int, head: str, query: tuple[int, int]):
    """A chosen first-stage patch's attention over the image (ViT) or inside its window (Swin)."""
    if result is None:
        return None
    head = parse_head(head)
    if result.attention:
        amap = result.attention["encoder"]
        layer, head = index(layer, amap.layers, "layer", fit=True), head_index(head, amap.heads, fit=True)
        k = result.prefix_tokens  # the patches come after [CLS] (and any other prefix token)
        row = k + query[0] * result.grid[1] + query[1]
        values = va.select_head(amap.weights[layer], None, head)[row]
        return fit(vi.query_patch_attention(result.image, values[k:], result.grid, query,
                                            title=va.describe(f"Patch r{query[0]}c{query[1]} → patches", layer, head)))
    block = result.windows[index(layer, len(result.windows), "block", fit=True)]
    return fit(window_figure(result, block, head, block.token_at(*result.patch_centre(query))))


def distance_figure(result):
    """Mean attention distance per head: over the whole image (ViT), inside the windows (Swin)."""
    from models.analysis import mean_attention_distance, window_attention_distance

    if result.attention:
        amap = result.attention["encoder"]
        dist = mean_attention_distance(amap.weights, grid=result.grid, patch=result.patch, skip=result.prefix_tokens)
        return vs.head_metric_scatter(dist, metric="mean attention distance", unit="pixels",
                                      title="Mean attention distance per head (ViT paper, Fig. 7)")
    dist = window_attention_distance([(w.weights, w.window, w.patch, w.image_cells()) for w in result.windows])
    return vs.head_metric_scatter(dist, metric="mean attention distance", unit="pixels",
                                  title="Mean attention distance per head and block (inside windows)")


def on_image_click(state: dict | None, evt: gr.SelectData) -> str:
    """A click on the enlarged image: the patch it landed on, "row,col" (whose change redraws, `show_patch`)."""
    if not state:
        return ""
    result = state["result"]
    scale = enlarge(result.image).shape[0] / result.image.shape[0]
    row, col = result.patch_at(evt.index[1] / scale, evt.index[0] / scale)
    return f"{row},{col}"


def show_patch(state: dict | None, layer: int, head: str, patch: str):
    """Redraw the chosen patch's attention ("row,col"; empty: the centre) and remember the patch."""
    if not state:
        return None, state
    result = state["result"]
    rows, cols = result.grid
    try:
        query = tuple(index(v, n, "patch", fit=True) for v, n in zip(patch.split(","), (rows, cols), strict=True))
    except (ValueError, Error):  # "" (a new image) or anything else: the centre patch
        query = (rows // 2, cols // 2)
    return draw_query(result, layer, head, query), {**state, "query": query}


def redraw_image(state: dict | None, layer: int, head: str, view: str):
    """New layer, head or view: redraw from the kept result (no model run)."""
    if not state:
        return None, None, None
    result = state["result"]
    return (*draw_image(result, layer, head, view), draw_query(result, layer, head, state["query"]))
