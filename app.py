"""Attention Atlas: see what attention does inside Transformers.

`python app.py` serves the app on 127.0.0.1:7860 (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT change that).
Layout first, thin handlers after: each handler runs a model (loaded lazily, once per process) or the
playground formula, keeps the result in gr.State, and calls a viz/ figure builder. Changing a layer, head
or view redraws from the state without running the model again. torch is imported on first use, so the
page is served before the model stack has loaded.
"""

from __future__ import annotations

import os
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np

from examples import sentences
from models import limits
from viz import attention as va
from viz import images as vi
from viz import playground as pg
from viz import positional as vp
from viz import stats as vs
from viz import swin as vw
from viz import text as vt

TITLE = "Attention Atlas"
ROOT = Path(__file__).resolve().parent
# Where the checkpoint folders are (configuration, never user input; tests point it at tiny models).
CHECKPOINTS = Path(os.environ.get("ATLAS_CHECKPOINTS", ROOT / "checkpoints"))
EXAMPLE_IMAGES = sorted(str(p) for p in (ROOT / "examples" / "fashion").glob("*.png"))
EXAMPLE_NAMES = {Path(p).stem.split("-t10k")[0].split("-", 1)[1]: p for p in EXAMPLE_IMAGES}  # "sneaker": path
# Attention downloads go into Gradio's own temporary folder (uploads live there too), and are deleted with it.
DOWNLOADS = Path(os.environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio") / "attention-atlas"
MAX_TEXT_CHARS = limits.MAX_TEXT_CHARS

CSS = """
.intro {font-size: 1.02rem; line-height: 1.5;}
.notice {border-left: 4px solid #e0a800; padding: 0.4rem 0.8rem; background: #fff8e1;}
.highlight {font-size: 1.15rem; line-height: 2.0;}
footer {display: none !important;}
.block:has(> .js-plotly-plot) {overflow-x: auto !important;}  /* a figure wider than its column scrolls, not clipped */
"""

# How to get each checkpoint back when it is missing or damaged.
FIX = {
    name: f"python -m train.{cmd} --data-dir ../shared/data --out checkpoints/{name} --run-dir runs/{name}"
    for name, cmd in {"translator-en-de": "translation", "sst2": "classifier --task sst2",
                      "agnews": "classifier --task agnews", "vit-fashion": "vision --model vit",
                      "swin-fashion": "vision --model swin", "minilm-sst2": "minilm --task sst2",
                      "minilm-agnews": "minilm --task agnews"}.items()
}
IMAGENET = {"ViT-B/16 (ImageNet)": "vit_b_16", "Swin-T (ImageNet)": "swin_t"}
VISION_MODELS = ["vit-fashion", "swin-fashion", *IMAGENET]
TASKS = {"SST-2 sentiment": "sst2", "AG News topic": "agnews"}
TEXT_MODELS = {"trained from scratch": "", "MiniLM (pretrained, fine-tuned)": "minilm-"}
KINDS = {"encoder": "Encoder self-attention", "decoder": "Decoder self-attention (causal)",
         "cross": "Cross-attention (target → source)"}
VIEWS = ["heatmap", "head view", "model view"]
HEADS_DEFAULT = ["mean", "max"]


# ----------------------------------------------------------------------------------------- models
class ModelUnavailable(Exception):
    """A model's checkpoint or weights cannot be loaded; the message says how to fix it."""


class ModelStore:
    """Loads each model on first use, once per process; concurrent requests share it (inference only)."""

    def __init__(self) -> None:
        self._models: dict[str, Any] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def get(self, name: str) -> Any:
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            if name not in self._models:
                self._models[name] = self._load(name)
            return self._models[name]

    @staticmethod
    def _load(name: str) -> Any:
        import models  # the entry points (translate, classify) run under torch.no_grad themselves

        if os.environ.get("ATLAS_TORCH_THREADS"):  # intra-op threads per request (default: torch's choice)
            import torch

            torch.set_num_threads(max(1, int(os.environ["ATLAS_TORCH_THREADS"])))

        if name in IMAGENET.values():
            from models.pretrained import load_imagenet

            try:
                return load_imagenet(name)  # fails within seconds when the weights are not cached
            except Exception as err:  # any failure here means "not available"
                raise ModelUnavailable(
                    f"The ImageNet weights for {name} are not available: {err} Run the app once on a machine "
                    f"with a network, or copy torchvision's weight file into $TORCH_HOME/hub/checkpoints/."
                ) from None
        try:
            return models.load(CHECKPOINTS / name)
        except Exception as err:  # missing folder, bad hash, truncated file, bad config
            fix = FIX.get(name, "restore the folder")
            raise ModelUnavailable(
                f"The model `{name}` cannot be loaded: {err}. Restore it with `git checkout -- checkpoints/{name}` "
                f"or rebuild it with `{fix}`. The other tabs keep working."
            ) from None


MODELS = ModelStore()


def _model(name: str) -> Any:
    try:
        return MODELS.get(name)
    except ModelUnavailable as err:
        raise gr.Error(str(err), duration=None) from None


def checkpoint_status(*names: str) -> str:
    """A notice for the tab when one of its checkpoints is missing (cheap file checks, no torch)."""
    missing = [n for n in names if not (CHECKPOINTS / n / "manifest.json").is_file()]
    if not missing:
        return ""
    return ("**Not available:** " + ", ".join(f"`checkpoints/{n}` is missing (rebuild: `{FIX.get(n, '')}`)"
                                             for n in missing) + ". Everything else keeps working.")


def _text(text: str | None) -> str:
    text = (text or "").strip()
    if not text:
        raise gr.Error("Please type some text first.")
    return text[:MAX_TEXT_CHARS]


def _head(head: str | int | None) -> str | int:
    return int(head) if str(head).isdigit() else (head or "mean")


def _controls(layers: int, heads: int, layer: int | None = None) -> tuple[dict, dict]:
    layer = layers - 1 if layer is None else min(int(layer), layers - 1)
    return (gr.update(minimum=0, maximum=max(layers - 1, 1), value=layer, interactive=layers > 1),
            gr.update(choices=HEADS_DEFAULT + [str(h) for h in range(heads)]))


def _fit(fig):
    """Let a figure take its column's width (the viz builders size figures for a full-width page)."""
    if fig is not None:
        fig.update_layout(width=None, autosize=True)
    return fig


def _save_npz(prefix: str, **arrays: Any) -> str:
    DOWNLOADS.mkdir(parents=True, exist_ok=True)
    path = DOWNLOADS / f"{prefix}-{uuid.uuid4().hex[:8]}.npz"
    np.savez(path, **{k: np.asarray(v) for k, v in arrays.items()})  # stored, not deflated: ~30 ms less a call
    return str(path)


def _attention_figure(amap, kind_title: str, layer: int, head: str | int, view: str):
    layer = min(int(layer), amap.layers - 1)
    if view == "model view":
        return va.model_view(amap.weights, amap.queries, amap.keys, kind=kind_title)
    if view == "head view":
        heads = None if isinstance(head, str) else [head]
        # Only lines clearly above a uniform spread (1/keys) are drawn, so the structure stands out.
        threshold = max(0.05, 2.0 / max(len(amap.keys), 1))
        return va.head_view(amap.weights, amap.queries, amap.keys, layer=layer, heads=heads, kind=kind_title,
                            threshold=threshold)
    return va.attention_heatmap(amap.weights, amap.queries, amap.keys, layer=layer, head=head, kind=kind_title)


def _stats_figure(amap, kind_title: str):
    from models.analysis import head_entropy

    if amap.queries == amap.keys:
        shares, names = vs.token_shares(amap.weights, amap.queries)
        return _fit(vs.head_share_heatmap(shares, names, title=f"Where each head looks · {kind_title}"))
    return vs.entropy_heatmap(head_entropy(amap.weights) / np.log(2), title=f"Entropy per head · {kind_title}")


# -------------------------------------------------------------------------------------- Translate
def translate(text: str, beam_size: int = 5, kind: str = "cross", layer: int = 0, head: str = "mean",
              view: str = "heatmap"):
    """Translate English to German; return the translation and every attention figure."""
    text = _text(text)
    model = _model("translator-en-de")
    beam = max(1, min(int(beam_size), 8))
    result = model.translate(text, beam_size=beam)
    cross = result.attention["cross"]
    layer_u, head_u = _controls(cross.layers, cross.heads)
    npz = _save_npz("translation", **{k: a.weights for k, a in result.attention.items()},
                    source_tokens=result.source_tokens, target_tokens=result.target_tokens)
    notice = result.notice or f"Beam size {beam} · score {result.score:.3f} · {len(result.target_tokens)} decoder steps"
    return (result.text, notice, *draw_translation(result, kind, cross.layers - 1, head, view),
            vt.beam_tree(result.beam, result.chosen, title=f"Beam search (beam size {beam})"),
            vt.cross_alignment(cross.weights, cross.queries, cross.keys, layer=cross.layers - 1, head="mean"),
            result, npz, layer_u, head_u)


def draw_translation(result, kind: str, layer: int, head: str, view: str):
    if result is None:
        return None, None
    amap = result.attention[kind]
    title = KINDS[kind]
    return _attention_figure(amap, title, layer, _head(head), view), _stats_figure(amap, title)


# --------------------------------------------------------------------------------------- Classify
def classify(text: str, task: str = "SST-2 sentiment", model: str = "trained from scratch", layer: int = -1,
             head: str = "mean", view: str = "heatmap"):
    """Classify a text; return the probabilities, the highlighted text and the attention figures."""
    text = _text(text)
    name = TEXT_MODELS.get(model, "") + TASKS.get(task, "sst2")
    result = _model(name).classify(text)
    amap = result.attention["encoder"]
    layer_u, head_u = _controls(amap.layers, amap.heads)
    top = int(np.argmax(result.probs))
    verdict = f"**{result.labels[top]}** ({result.probs[top]:.1%})"
    if result.notice:
        verdict += f"\n\n{result.notice}"
    npz = _save_npz(name, encoder=amap.weights, tokens=amap.queries, probs=result.probs, labels=result.labels)
    figs = draw_classification(result, amap.layers - 1, head, view)
    return (verdict, _fit(vi.topk_bars(result.labels, result.probs, k=len(result.labels), title="Class probabilities")),
            *figs, result, npz, layer_u, head_u)


def draw_classification(result, layer: int, head: str, view: str):
    if result is None:
        return None, None, None
    from models.analysis import rollout

    amap = result.attention["encoder"]
    roll = rollout(amap.weights)[-1]  # (N, N) after the last layer
    first = amap.queries[0] if amap.queries else ""
    if first in ("[CLS]", "<s>", "<cls>", "CLS"):
        weights, what = roll[0], f"rollout from {first} (what the classifier reads)"
    else:
        weights, what = roll.mean(0), "rollout averaged over tokens (mean pooling)"
    html = vt.token_highlight(amap.queries, weights, title=f"Attention rollout: {what}")
    title = "Encoder self-attention"
    return html, _attention_figure(amap, title, layer, _head(head), view), _stats_figure(amap, title)


# ----------------------------------------------------------------------------------------- Vision
def _vision_model(name: str):
    if name not in VISION_MODELS:  # the API accepts any string: never turn it into a path
        raise gr.Error(f"Unknown model {name!r}; choose one of {', '.join(VISION_MODELS)}.")
    return _model(IMAGENET.get(name, name))


def classify_image(image: str | None, model: str = "vit-fashion", top_k: int = 5, layer: int = -1,
                   head: str = "mean", view: str = "CLS → patches"):
    """Classify an image; return the top classes and attention laid over what the model saw."""
    if not image:
        raise gr.Error("Please upload an image or pick an example.")
    net = _vision_model(model)
    try:
        result = net.classify(image)
    except ValueError as err:  # unreadable, truncated or oversized image: the message says which
        raise gr.Error(str(err)) from None
    n_layers, n_heads = _vision_depth(result)
    layer_u, head_u = _controls(n_layers, n_heads)
    if result.attention:
        arrays = {"encoder": result.attention["encoder"].weights, "tokens": result.attention["encoder"].keys}
    else:
        arrays = {f"stage{w.stage}_block{w.block}": w.weights for w in result.windows}
    npz = _save_npz("image", image=result.image, probs=result.probs, labels=result.labels, **arrays)
    query = (result.grid[0] // 2, result.grid[1] // 2)
    overlay, grid_fig = draw_image(result, n_layers - 1, head, view)
    seen = _enlarge(result.image)
    return (_fit(vi.topk_bars(result.labels, result.probs, k=int(top_k))), overlay, grid_fig,
            draw_query(result, n_layers - 1, head, query), _distance_figure(result), seen,
            result.notice or "", {"result": result, "query": query}, npz, layer_u, head_u)


def _vision_depth(result) -> tuple[int, int]:
    if result.attention:
        amap = result.attention["encoder"]
        return amap.layers, amap.heads
    return len(result.windows), max(w.weights.shape[1] for w in result.windows)


def _enlarge(image: np.ndarray, side: int = 336) -> np.ndarray:
    """Nearest-neighbour upscale so a 28×28 input is big enough to click a patch on."""
    factor = max(1, side // max(image.shape[:2]))
    return np.repeat(np.repeat(image, factor, axis=0), factor, axis=1)


def draw_image(result, layer: int, head: str, view: str):
    """The overlay (one head, fusion or rollout) and the every-head grid of one layer."""
    if result is None:
        return None, None
    head = _head(head)
    if result.attention:  # ViT: CLS → patch attention
        from models.analysis import rollout

        amap = result.attention["encoder"]
        layer = min(int(layer), amap.layers - 1)
        w = amap.weights[layer]  # (H, T, T)
        if view == "rollout":
            values = rollout(amap.weights)[-1][0]
            title = "Attention rollout from CLS over all layers"
        else:
            values = va.select_head(w, None, head)[0]
            title = va.describe("CLS → patch attention", layer, head)
        overlay = _fit(vi.image_attention(result.image, values[1:], result.grid, title=title))
        grid_fig = vi.image_attention_grid(result.image, w[:, 0, 1:], result.grid,
                                           titles=[f"head {h}" for h in range(w.shape[0])],
                                           title=f"CLS → patch attention, every head of layer {layer}")
        return overlay, grid_fig
    block = result.windows[min(int(layer), len(result.windows) - 1)]
    query = (block.grid[0] // 2, block.grid[1] // 2)
    overlay = _fit(_window_figure(result, block, head, query))
    heads = block.weights.shape[1]
    grid_fig = vi.image_attention_grid(
        result.image, np.stack([_window_map(block, h, query) for h in range(heads)]), block.grid,
        titles=[f"head {h}" for h in range(heads)],
        title=f"Centre token's window attention, every head · stage {block.stage} block {block.block}")
    return overlay, grid_fig


def _window_map(block, head: int, query: tuple[int, int]) -> np.ndarray:
    """One query token's attention inside its window as a flat (H·W) map over the stage's grid."""
    values, _ = vw.window_attention_map(block.weights, block.grid, block.window, block.shift, query, head)
    return np.nan_to_num(values).ravel()


def _window_figure(result, block, head: str | int, query: tuple[int, int]):
    h = 0 if isinstance(head, str) else min(int(head), block.weights.shape[1] - 1)
    title = (f"Token r{query[0]}c{query[1]} · stage {block.stage} block {block.block} · head {h}"
             f"{' · shifted' if block.shift else ''}")
    return vw.window_attention_grid(block.weights, block.grid, block.window, block.shift, query, head=h,
                                    image=result.image, patch=block.patch, title=title)


def draw_query(result, layer: int, head: str, query: tuple[int, int]):
    """A chosen patch's attention over the image (ViT) or inside its window (Swin)."""
    if result is None:
        return None
    head = _head(head)
    if result.attention:
        amap = result.attention["encoder"]
        layer = min(int(layer), amap.layers - 1)
        index = 1 + query[0] * result.grid[1] + query[1]  # token 0 is CLS
        values = va.select_head(amap.weights[layer], None, head)[index]
        return _fit(vi.query_patch_attention(result.image, values[1:], result.grid, query,
                                             title=va.describe(f"Patch r{query[0]}c{query[1]} → patches", layer, head)))
    block = result.windows[min(int(layer), len(result.windows) - 1)]
    scale = result.patch / block.patch  # stage-1 patch grid → this stage's grid
    q = (min(int(query[0] * scale), block.grid[0] - 1), min(int(query[1] * scale), block.grid[1] - 1))
    return _fit(_window_figure(result, block, head, q))


def _distance_figure(result):
    from models.analysis import mean_attention_distance

    if result.attention:
        amap = result.attention["encoder"]
        dist = mean_attention_distance(amap.weights, grid=result.grid, patch=result.patch, skip=1)
        return vs.head_metric_scatter(dist, metric="mean attention distance", unit="pixels",
                                      title="Mean attention distance per head (ViT paper, Fig. 7)")
    rows = []
    for w in result.windows:  # distance inside each window, in pixels of the image the model saw
        d = mean_attention_distance(w.weights, grid=(w.window, w.window), patch=w.patch)  # (windows, heads)
        rows.append(d.mean(0))
    width = max(len(r) for r in rows)
    dist = np.full((len(rows), width), np.nan)
    for i, r in enumerate(rows):
        dist[i, : len(r)] = r
    return vs.head_metric_scatter(dist, metric="mean attention distance", unit="pixels",
                                  title="Mean attention distance per head and block (inside windows)")


def on_image_click(state: dict | None, layer: int, head: str, evt: gr.SelectData):
    if not state:
        return None, state
    result = state["result"]
    x, y = evt.index[0], evt.index[1]
    shown = _enlarge(result.image).shape
    scale = shown[0] / result.image.shape[0]
    query = (min(int(y / scale) // result.patch, result.grid[0] - 1),
             min(int(x / scale) // result.patch, result.grid[1] - 1))
    return draw_query(result, layer, head, query), {"result": result, "query": query}


def redraw_image(state: dict | None, layer: int, head: str, view: str):
    if not state:
        return None, None, None
    result = state["result"]
    return (*draw_image(result, layer, head, view), draw_query(result, layer, head, state["query"]))


# ------------------------------------------------------------------------------------ Swin windows
def swin_windows(grid: int = 8, window: int = 4, shift: int = 2, window_index: int = 3):
    """Window partition, cyclic shift, region ids and the −100 masks for a token grid."""
    from models.swin import shifted_window_mask, shifted_window_regions

    grid, window = int(grid), max(1, int(window))
    shift = max(0, min(int(shift), window - 1))
    side = -(-grid // window) * window  # Swin pads the grid up to a multiple of the window
    note = f"Grid {grid}×{grid} padded to {side}×{side} (a multiple of the window). " if side != grid else ""
    regions = shifted_window_regions(side, side, window, shift).numpy()
    masks = shifted_window_mask(side, side, window, shift).numpy()  # (nW, N, N)
    n_windows = masks.shape[0]
    idx = max(0, min(int(window_index), n_windows - 1))
    ids = np.arange(side * side).reshape(side, side)
    rolled = np.roll(ids, (-shift, -shift), axis=(0, 1))
    masked = int((masks[idx] < 0).sum())
    note += (f"{n_windows} windows of {window}×{window} = {window * window} tokens; shift {shift}. "
             f"Window {idx} blocks {masked} of {masks[idx].size} query–key pairs with −100.")
    return (vw.window_partitions((side, side), window, shift),
            vw.cyclic_shift(ids, rolled, regions, window),
            _fit(vw.region_map(regions, window)),
            _fit(vw.window_mask(masks[idx], window, idx)),
            vw.all_window_masks(masks, side // window), note)


def trained_swin(example: str | None = None, block: int = 1, head: int = 0):
    """The shipped Swin's window attention on an example image and its relative-position-bias tables."""
    net = _model("swin-fashion")
    result = net.classify(EXAMPLE_NAMES.get(example or "", EXAMPLE_IMAGES[-1]))  # names only, never paths
    blocks = [b for stage in net.stages for b in stage]
    b = max(0, min(int(block), len(blocks) - 1))
    win = result.windows[b]
    h = max(0, min(int(head), win.weights.shape[1] - 1))
    query = (win.grid[0] // 2, win.grid[1] // 2)
    table = blocks[b].attn.relative_position_bias_table.detach().float().numpy()  # ((2w−1)², heads)
    side = 2 * win.window - 1
    tables = table.T.reshape(-1, side, side)
    top = int(np.argmax(result.probs))
    return (_fit(_window_figure(result, win, h, query)),
            _fit(vp.relative_bias_tables(tables, title=f"Relative position bias · block {b}")),
            f"Predicted **{result.labels[top]}** ({result.probs[top]:.1%}). Block {b}: stage {win.stage}, "
            f"{'shifted' if win.shift else 'regular'} windows of {win.window}×{win.window} tokens.")


# ----------------------------------------------------------------------------- Positional encoding
def positional_encoding(length: int = 64, d_model: int = 128, dims: str = "0, 1, 6, 7, 32",
                        rope_pair: int = 0):
    """Sinusoidal encodings, RoPE rotations and offsets, for the chosen length and width."""
    import torch

    from models.positional import apply_rope, rope_angles, sinusoidal_table

    length, d_model = max(2, min(int(length), 512)), max(2, min(int(d_model), 1024))
    d_model += d_model % 2
    pe = sinusoidal_table(length, d_model).numpy()
    chosen = sorted({int(d) for d in str(dims).replace(";", ",").split(",") if d.strip().isdigit()
                     and int(d) < d_model}) or [0, 1]
    pair = max(0, min(int(rope_pair), d_model // 2 - 1))
    angles = rope_angles(length, d_model)  # (P, d/2)
    unit = torch.zeros(length, d_model)
    unit[:, 2 * pair] = 1.0  # the same vector at every position, then rotated by RoPE
    rotated = apply_rope(unit, angles).numpy()[:, 2 * pair: 2 * pair + 2]
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(d_model, generator=g), torch.randn(d_model, generator=g)
    scores = (apply_rope(q.expand(length, -1), angles) @ apply_rope(k.expand(length, -1), angles).T).numpy()
    return (_fit(vp.sinusoidal_heatmap(pe, title=f"Sinusoidal encoding: {length} positions × {d_model} dims")),
            vp.sinusoidal_curves(pe, chosen, title="Chosen dimensions along positions"),
            _fit(vp.position_similarity(pe, "cosine", title="Position–position cosine similarity")),
            _fit(vp.rope_rotation(rotated, pair=pair, title=f"RoPE: dimension pair {pair} turns with position")),
            _fit(vp.rope_offset_scores(scores, [0, length // 4, length // 2])))


def vit_positions():
    """Cosine similarity of the shipped ViT's learned position embeddings (ViT paper, Fig. 7 centre)."""
    net = _model("vit-fashion")
    pos = net.pos_embed.detach().float().numpy()[0]  # (1 + P, D)
    return vp.learned_pe_grid(pos, net.grid, title="vit-fashion: learned position embeddings, cosine "
                                                   "similarity of each patch's embedding to every other")


# ------------------------------------------------------------------------------------- Playground
def playground(seq_len: int = 6, d_k: int = 8, seed: int = 0, mask: str = "none", scale: bool = True):
    """Run every step of scaled dot-product attention on random Q, K, V and draw them."""
    try:
        steps = pg.compute_steps(seq_len=seq_len, d_k=d_k, seed=seed, mask=mask, scale=scale)
    except ValueError as err:
        raise gr.Error(str(err)) from None
    curves = pg.entropy_vs_dk(seq_len=int(seq_len))
    summary = (
        f"Scale factor: **{steps.scale:.4g}** · mean softmax entropy **{steps.entropy.mean():.3f}** nats "
        f"(uniform would be {float(np.log(int(seq_len))):.3f}) · largest weight in a row, on average: "
        f"**{steps.weights.max(axis=1).mean():.3f}**"
    )
    return pg.playground_figure(steps), pg.entropy_figure(curves, current_dk=int(d_k)), summary


# ----------------------------------------------------------------------------------------- layout
INTRO = {
    "Translate": """**English → German with an encoder–decoder Transformer trained by the project on Multi30k.**
The *encoder* attends over the English sentence, the *decoder* over the German words produced so far
(causal: nothing above the diagonal), and *cross-attention* links each German word to the English words it
was produced from; in the last layers it often traces a rough word alignment. A head that attends to the
previous token draws a diagonal just below the main one.""",
    "Classify": """**Sentiment (SST-2) or news topic (AG News) from a Transformer encoder**: a small one trained
from scratch, or MiniLM, pretrained on a billion sentence pairs and fine-tuned here. The sentence is coloured by
*attention rollout* (attention multiplied through all layers, Abnar & Zuidema 2020): roughly, which words reach
the classifier. The "where each head looks" chart finds the classic pretrained patterns: heads that park on
`[CLS]` or `[SEP]`, and heads that look at the previous or the next word (Clark et al. 2019).""",
    "Vision": """**Image classification with a Vision Transformer (ViT) or a Swin Transformer.** Any image is
converted the way the model was trained (Fashion-MNIST: grey, 28×28, dark background), and attention is
drawn on exactly that image. For ViT the maps show where the CLS token, which makes the prediction, looks;
*rollout* follows it through every layer. Click a patch of the image on the right to see where it looks.
Swin attends only inside local windows: its maps stay within the highlighted window.""",
    "Swin windows": """**How Swin keeps attention local and still mixes windows.** Regular blocks split the
token grid into windows and attend only inside each. Shifted blocks move the windows by half a window; to
keep the same number of windows, the grid is *rolled* (cyclic shift) and tokens that came from opposite edges
are kept apart by adding −100 to their scores (the mask), so after softmax they get ~0 weight.""",
    "Positional encoding": """**Attention itself has no sense of order; positions are added.** The sinusoidal
encoding (Vaswani et al. 2017) gives each position a pattern of waves of different wavelengths, so nearby
positions look alike. RoPE (Su et al. 2021) instead rotates pairs of query/key dimensions by an angle that
grows with position, so a query–key score depends only on their distance. ViT learns its embeddings; trained,
they come to encode the 2-D patch grid.""",
    "Attention playground": """**softmax(QKᵀ/√d_k)·V, one step at a time.** Each query row of Q is compared
with every key row of K (the dot products QKᵀ), the scores are divided by √d_k, forbidden positions are set
to −∞ (the mask), and a softmax turns each row into weights that sum to 1. The output row is the weighted
mean of V's rows. Try: switch the scale off and raise d_k: the softmax saturates onto one key (the entropy
chart shows it collapse), which is why Transformers divide by √d_k.""",
}


# Figure-only events (no model run) share their own small pool, so they never wait behind model calls.
FAST = {"concurrency_limit": 4, "concurrency_id": "figures"}


def _intro(name: str, *checkpoints: str) -> None:
    gr.Markdown(INTRO[name], elem_classes=["intro"])
    status = checkpoint_status(*checkpoints)
    if status:
        gr.Markdown(status, elem_classes=["notice"])


def _layer_head_view(views: list[str], view: str) -> tuple[gr.Slider, gr.Dropdown, gr.Radio]:
    with gr.Row():
        layer = gr.Slider(0, 1, value=0, step=1, label="layer (0 = first)")
        head = gr.Dropdown(HEADS_DEFAULT, value="mean", label="head (or fusion of heads)")
        view_r = gr.Radio(views, value=view, label="view")
    return layer, head, view_r


def _translate_tab() -> None:
    _intro("Translate", "translator-en-de")
    with gr.Row():
        text = gr.Textbox(label="English sentence", value=sentences.TRANSLATE[0], lines=2, scale=4,
                          max_length=MAX_TEXT_CHARS)
        with gr.Column(scale=1):
            beam = gr.Slider(1, 8, value=5, step=1, label="beam size (1 = greedy)")
            run = gr.Button("Translate", variant="primary")
    gr.Examples([[s] for s in sentences.TRANSLATE], [text])
    out = gr.Textbox(label="German translation", interactive=False)
    notice = gr.Markdown()
    with gr.Row():
        kind = gr.Radio(list(KINDS), value="cross", label="attention")
    layer, head, view = _layer_head_view(VIEWS, "heatmap")
    attn = gr.Plot(label="attention")
    stats = gr.Plot(label="head statistics")
    align = gr.Plot(label="cross-attention of the chosen translation (last layer, mean of heads)")
    tree = gr.Plot(label="beam-search tree")
    state = gr.State()
    download = gr.File(label="attention arrays (.npz)")
    run.click(translate, [text, beam, kind, layer, head, view],
              [out, notice, attn, stats, tree, align, state, download, layer, head], api_name="translate")
    text.submit(translate, [text, beam, kind, layer, head, view],
                [out, notice, attn, stats, tree, align, state, download, layer, head], api_name=False)
    for control in (kind, layer, head, view):
        control.change(draw_translation, [state, kind, layer, head, view], [attn, stats], api_name=False,
                       show_progress="hidden", **FAST)


def _classify_tab() -> None:
    _intro("Classify", "sst2", "agnews", "minilm-sst2", "minilm-agnews")
    with gr.Row():
        text = gr.Textbox(label="text", value=sentences.SENTIMENT[0], lines=2, scale=4, max_length=MAX_TEXT_CHARS)
        with gr.Column(scale=1):
            task = gr.Radio(list(TASKS), value="SST-2 sentiment", label="task")
            model = gr.Radio(list(TEXT_MODELS), value="trained from scratch", label="model")
            run = gr.Button("Classify", variant="primary")
    gr.Examples([[s, "SST-2 sentiment"] for s in sentences.SENTIMENT]
                + [[s, "AG News topic"] for s in sentences.TOPIC], [text, task])
    with gr.Row():
        verdict = gr.Markdown()
        probs = gr.Plot(label="class probabilities")
    highlight = gr.HTML(elem_classes=["highlight"])
    layer, head, view = _layer_head_view(VIEWS, "heatmap")
    attn = gr.Plot(label="attention")
    stats = gr.Plot(label="where each head looks")
    state = gr.State()
    download = gr.File(label="attention arrays (.npz)")
    outputs = [verdict, probs, highlight, attn, stats, state, download, layer, head]
    run.click(classify, [text, task, model, layer, head, view], outputs, api_name="classify")
    text.submit(classify, [text, task, model, layer, head, view], outputs, api_name=False)
    for control in (layer, head, view):
        control.change(draw_classification, [state, layer, head, view], [highlight, attn, stats], api_name=False,
                       show_progress="hidden", **FAST)


def _vision_tab() -> None:
    _intro("Vision", "vit-fashion", "swin-fashion")
    with gr.Row():
        with gr.Column(scale=2):
            image = gr.File(label="image (PNG, JPEG, GIF, BMP, WebP, TIFF)", file_types=list(limits.IMAGE_TYPES),
                            type="filepath")
            gr.Examples([[p] for p in EXAMPLE_IMAGES], [image], label="Fashion-MNIST test images")
        with gr.Column(scale=1):
            model = gr.Radio(VISION_MODELS, value="vit-fashion", label="model")
            top_k = gr.Slider(1, 10, value=5, step=1, label="top-k classes")
            run = gr.Button("Classify image", variant="primary")
    notice = gr.Markdown()
    layer, head, view = _layer_head_view(["CLS → patches", "rollout"], "CLS → patches")
    with gr.Row():
        probs = gr.Plot(label="top classes")
        overlay = gr.Plot(label="attention over the image")
    with gr.Row():
        seen = gr.Image(label="what the model saw: click a patch", interactive=False, height=336, width=336,
                        elem_id="seen-image")
        query = gr.Plot(label="the clicked patch's attention")
    heads = gr.Plot(label="every head of the layer")
    distance = gr.Plot(label="mean attention distance")
    state = gr.State()
    download = gr.File(label="attention arrays (.npz)")
    run.click(classify_image, [image, model, top_k, layer, head, view],
              [probs, overlay, heads, query, distance, seen, notice, state, download, layer, head],
              api_name="classify_image")
    for control in (layer, head, view):
        control.change(redraw_image, [state, layer, head, view], [overlay, heads, query], api_name=False,
                       show_progress="hidden", **FAST)
    seen.select(on_image_click, [state, layer, head], [query, state], api_name=False, **FAST)


def _swin_tab() -> None:
    _intro("Swin windows", "swin-fashion")
    with gr.Row():
        grid = gr.Slider(2, 16, value=8, step=1, label="token grid side")
        window = gr.Slider(1, 8, value=4, step=1, label="window size")
        shift = gr.Slider(0, 7, value=2, step=1, label="shift (window // 2 in Swin)")
        index = gr.Slider(0, 63, value=3, step=1, label="window to inspect")
    note = gr.Markdown()
    parts = gr.Plot(label="regular and shifted windows")
    rolled = gr.Plot(label="cyclic shift")
    with gr.Row():
        regions = gr.Plot(label="region ids")
        mask = gr.Plot(label="mask of one window")
    masks = gr.Plot(label="masks of all windows")
    inputs, outputs = [grid, window, shift, index], [parts, rolled, regions, mask, masks, note]
    for control in inputs:
        control.change(swin_windows, inputs, outputs, api_name=False, show_progress="hidden", **FAST)
    gr.Button("Draw windows", variant="primary").click(swin_windows, inputs, outputs, api_name="swin_windows", **FAST)
    gr.Markdown("### The trained Swin (`swin-fashion`)")
    with gr.Row():
        example = gr.Dropdown(list(EXAMPLE_NAMES), value="ankle-boot", label="example image")
        block = gr.Slider(0, 3, value=1, step=1, label="block (odd = shifted windows)")
        head = gr.Slider(0, 5, value=0, step=1, label="head")
        show = gr.Button("Show the trained Swin")
    trained_note = gr.Markdown()
    with gr.Row():
        win_attn = gr.Plot(label="window attention of the centre token")
        bias = gr.Plot(label="relative position bias")
    show.click(trained_swin, [example, block, head], [win_attn, bias, trained_note], api_name=False)
    return inputs, outputs


def _positional_tab() -> None:
    _intro("Positional encoding", "vit-fashion")
    with gr.Row():
        length = gr.Slider(2, 512, value=64, step=1, label="positions")
        d_model = gr.Slider(2, 1024, value=128, step=2, label="model width d")
        dims = gr.Textbox(value="0, 1, 6, 7, 32", label="dimensions to plot as curves")
        pair = gr.Slider(0, 63, value=0, step=1, label="RoPE dimension pair")
    with gr.Row():
        heat = gr.Plot(label="sinusoidal encoding")
        sim = gr.Plot(label="position similarity")
    curves = gr.Plot(label="chosen dimensions")
    with gr.Row():
        rope = gr.Plot(label="RoPE rotation")
        offsets = gr.Plot(label="RoPE scores by offset")
    inputs, outputs = [length, d_model, dims, pair], [heat, curves, sim, rope, offsets]
    gr.Button("Draw encodings", variant="primary").click(positional_encoding, inputs, outputs,
                                                         api_name="positional_encoding", **FAST)
    for control in (length, d_model, pair):
        control.change(positional_encoding, inputs, outputs, api_name=False, show_progress="hidden", **FAST)
    dims.submit(positional_encoding, inputs, outputs, api_name=False, **FAST)
    gr.Markdown("### Learned position embeddings of the shipped ViT (`vit-fashion`)")
    learned = gr.Plot(label="learned position embeddings")
    gr.Button("Show the ViT's position embeddings").click(vit_positions, [], [learned], api_name=False)
    return inputs, outputs


def _playground_tab():
    _intro("Attention playground")
    with gr.Row():
        seq_len = gr.Slider(1, pg.MAX_LEN, value=6, step=1, label="sequence length (tokens)")
        d_k = gr.Slider(1, pg.MAX_DK, value=8, step=1, label="d_k (query/key width)")
        seed = gr.Number(value=0, precision=0, label="random seed", minimum=0)
    with gr.Row():
        mask = gr.Radio(list(pg.MASKS), value="none", label="mask")
        scale = gr.Checkbox(value=True, label="divide by √d_k")
        run = gr.Button("Run attention", variant="primary")
    summary = gr.Markdown()
    steps = gr.Plot(label="every step of the formula")
    entropy = gr.Plot(label="softmax entropy against d_k")
    inputs, outputs = [seq_len, d_k, seed, mask, scale], [steps, entropy, summary]
    run.click(playground, inputs, outputs, api_name="playground", **FAST)
    for control in (seq_len, d_k, mask, scale):
        control.change(playground, inputs, outputs, api_name=False, show_progress="hidden", **FAST)
    return inputs, outputs


def build_demo() -> gr.Blocks:
    # Files older than an hour are removed every hour, so a public server's temporary folder stays small.
    with gr.Blocks(title=TITLE, delete_cache=(3600, 3600)) as demo:
        gr.Markdown(f"# {TITLE}\nSee what attention does inside Transformers: pick a tab, give it input, "
                    "and move through layers and heads.")
        with gr.Tabs():
            with gr.Tab("Translate"):
                _translate_tab()
            with gr.Tab("Classify"):
                _classify_tab()
            with gr.Tab("Vision"):
                _vision_tab()
            with gr.Tab("Swin windows"):
                swin_io = _swin_tab()
            with gr.Tab("Positional encoding"):
                pos_io = _positional_tab()
            with gr.Tab("Attention playground"):
                play_io = _playground_tab()
        with gr.Accordion("Limits and safety", open=False):
            gr.Markdown(limits.describe())
        # Figures that need no trained model are drawn as soon as the page opens.
        for fn, (inputs, outputs) in ((playground, play_io), (swin_windows, swin_io), (positional_encoding, pos_io)):
            demo.load(fn, inputs, outputs, api_name=False, **FAST)
    return demo


def main() -> None:
    demo = build_demo()
    # Host and port come from GRADIO_SERVER_NAME / GRADIO_SERVER_PORT; Gradio's default host is 127.0.0.1.
    # A bounded queue: requests beyond max_size get a "busy, try again" answer instead of piling up.
    demo.queue(default_concurrency_limit=int(os.environ.get("ATLAS_CONCURRENCY", "2")),
               max_size=int(os.environ.get("ATLAS_QUEUE", "64")))
    demo.launch(theme=gr.themes.Soft(), css=CSS, max_file_size=f"{limits.MAX_UPLOAD_MB}mb")


if __name__ == "__main__":
    main()
