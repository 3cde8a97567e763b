"""What the tabs share on the page: the intro and its notices, the layer/head/view controls, reading text and seeds,
the attention figures every model tab draws, the explanations and the `.npz` download. The models come from
`serving/`.

Nothing here imports torch at module level: the page is served before the model stack has loaded, and the
first request that needs a model imports it (docs/ARCHITECTURE.md §2).
"""

from __future__ import annotations

import html
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np

from models import limits
from models.outputs import METHODS
from serving import catalogue, store
from serving.catalogue import checkpoint_status, configuration_notice
from serving.errors import ServingError
from viz import attention as va
from viz import stats as vs
from viz import swin as vw
from viz.common import Pooled, block_edges, phone

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_IMAGES = sorted(str(p) for p in (ROOT / "examples" / "fashion").glob("*.png"))
EXAMPLE_NAMES = {Path(p).stem.split("-t10k")[0].split("-", 1)[1]: p for p in EXAMPLE_IMAGES}  # "sneaker": path
# Attention downloads go into Gradio's own temporary folder (uploads live there too), and are deleted with it.
DOWNLOADS = Path(os.environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio") / "attention-atlas"
MAX_TEXT_CHARS = limits.MAX_TEXT_CHARS
HEADS_DEFAULT = ["mean", "max"]


class Error(gr.Error):
    """gr.Error with its message shown as text: Gradio renders an error's message as HTML, so a model name, a
    token or a library's "<urlopen error ...>" in it would be eaten or interpreted. Every handler raises this. Its
    toast closes by itself after ``duration`` seconds (and on the next button press, app.py's page script)."""

    def __init__(self, message: str, duration: float = 12, **kw: Any) -> None:
        super().__init__(html.escape(str(message), quote=False), duration=duration, **kw)


def _plot_class() -> type[gr.Plot]:
    """gr.Plot whose every figure carries its phone layout (``viz.common.phone``), which the page's script draws in
    a box narrower than 600 px (tabs/page.py): every tab lays out its figures for a phone through this one
    component, whatever built them. Wider screens get the figure as it was built. Its block carries the class
    "atlas-plot": on a phone a row's figures take the whole width, one under another (tabs/page.py's style sheet).

    A subclass, as Gradio makes a new instance of an output's class for each update (a wrapped instance would lose
    its wrapper); Gradio writes a .pyi stub beside the module of any component subclass it sees defined (for custom
    component packages), which is turned off while this one is defined."""
    from gradio import component_meta

    def postprocess(self: gr.Plot, value: Any) -> Any:
        if value is not None and type(value).__name__ == "Figure" and "plotly" in type(value).__module__:
            phone(value)
        return gr.Plot.postprocess(self, value)

    def get_config(self: gr.Plot) -> dict[str, Any]:  # gr.Plot's __init__ stays: Gradio reads its signature
        config = gr.Plot.get_config(self)
        classes = config.get("elem_classes") or []
        config["elem_classes"] = [*([classes] if isinstance(classes, str) else classes), "atlas-plot"]
        return config

    stub, component_meta.create_or_modify_pyi = component_meta.create_or_modify_pyi, lambda *args: None
    try:
        return type(gr.Plot)("Plot", (gr.Plot,), {"__module__": __name__, "__doc__": _plot_class.__doc__,
                                                  "postprocess": postprocess, "get_config": get_config})
    finally:
        component_meta.create_or_modify_pyi = stub


Plot = _plot_class()


VIEWS = ["heatmap", "head view", "model view"]
# Figure-only events (no model run) share their own small pool, so they never wait behind model calls.
FAST = {"concurrency_limit": 4, "concurrency_id": "figures"}


# --------------------------------------------------------------------------------------------- layout
def get_model(name: str, progress: Any = None) -> Any:
    """The model behind a catalogue name (``serving.store``), or an Error whose message says how to restore, rebuild
    or fetch it; ``progress`` (a gr.Progress) shows a download on first use."""
    try:
        return store.get_model(name, progress)
    except ServingError as err:
        raise Error(str(err), duration=None) from None


MODEL_CHOICE = "atlas_model_choice"  # the mark model_choice puts on a control (tabs/permalink.wire reads it)


def model_choice(control: Any) -> Any:
    """Mark a model choice (a Radio or Dropdown that lists configured folders) and return it. The folders the start-up
    check refuses (``catalogue.refused``) are left out of it: now, for those refused before the page was built, and at
    each page load (``tabs.permalink.wire``: the check runs after the server is up), where a link cannot name them
    either; the page's notice says why."""
    setattr(control, MODEL_CHOICE, True)
    shown = without_refused(control)
    if shown is not None:
        control.choices, control.value = shown["choices"], shown.get("value", control.value)
    return control


def without_refused(control: Any) -> dict | None:
    """A model choice's choices and value with the refused folders left out (the value: the first remaining one if
    it was refused), or None when it lists none of them."""
    left = catalogue.refused()
    if not left or not getattr(control, MODEL_CHOICE, False):
        return None
    kept = [(label, value) for label, value in control.choices if value not in left]
    if len(kept) == len(control.choices):
        return None
    shown: dict = {"choices": kept}
    if control.value in left:
        shown["value"] = kept[0][1] if kept else None
    return shown


def intro(text: str, *checkpoints: str, kind: str = "", notice: str = "") -> None:
    """The tab's intro paragraph, and a notice when one of its checkpoints is missing, (for a tab that offers
    configured models, ``kind``) a configured model could not be added, or the tab has more to say (``notice``)."""
    gr.Markdown(text, elem_classes=["intro"])
    status = "\n\n".join(x for x in (notice, checkpoint_status(*checkpoints),
                                      configuration_notice(kind) if kind else "") if x)
    if status:
        gr.Markdown(status, elem_classes=["notice"])


def layer_head_view(views: list[str], view: str) -> tuple[gr.Slider, gr.Dropdown, gr.Radio]:
    """The layer slider, the head (or fusion) choice and the view, on one row."""
    with gr.Row():
        layer = gr.Slider(0, 1, value=0, step=1, label="layer (0 = first)")
        head = gr.Dropdown(HEADS_DEFAULT, value="mean", label="head (or fusion of heads)")
        view_r = gr.Radio(views, value=view, label="view")
    return layer, head, view_r


def head_choices(heads: int) -> list[str]:
    """The head choices of a model with ``heads`` heads: the fusions, then each head's index."""
    return HEADS_DEFAULT + [str(h) for h in range(heads)]


def controls_for(layers: int, heads: int, layer: int | None = None, head: str | int | None = None) -> tuple[dict, dict]:
    """Updates for the layer slider (set to ``layer``, the drawn one; the last by default) and the head choices
    (set to ``head``, the drawn one, when given), after a model run. Both controls say what the run drew, so the
    redraws their change events start draw that view again: a link's run draws its own head, and a head left at
    the page's "mean" redrew the mean over the linked head (issue 61)."""
    value = layers - 1 if layer is None else layer
    chosen = {} if head is None else {"value": str(head)}
    return (gr.update(minimum=0, maximum=max(layers - 1, 1), value=value, interactive=layers > 1),
            gr.update(choices=head_choices(heads), **chosen))


def run_layer() -> gr.Number:
    """The layer a run draws, as the main action's input: hidden on the page, where a run draws the last layer
    (−1) and the slider follows; the API's ``layer`` (0 = first, −1 = last) is checked by ``index``."""
    return gr.Number(-1, visible=False, precision=0, label="layer")


def index(value: Any, n: int, name: str, default: int | None = None, fit: bool = False) -> int:
    """The one check of a layer, head or token position from the UI, the API or a link: empty is ``default`` (the
    last when None), −k counts from the end, anything outside 0 … n − 1 or not a whole number is refused in words.
    ``fit``: a redraw from the app's own slider, whose range may not yet be the new result's (its update is on the
    way when a model with fewer layers answers): a value past either end is brought inside rather than refused."""
    if value is None or value == "":
        return n - 1 if default is None else default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise Error(f"The {name} must be a whole number, got {str(value)[:40]!r}.") from None
    if not number.is_integer():
        raise Error(f"The {name} must be a whole number, got {str(value)[:40]}.")
    i = int(number)
    if -n <= i < 0:
        i += n
    if not 0 <= i < n:
        if fit:
            return min(max(i, 0), n - 1)
        raise Error(f"The {name} {int(number)} is outside 0 … {n - 1} (there are {n}).")
    return i


def head_index(value: Any, heads: int, fit: bool = False) -> str | int:
    """A head from the UI or the API: a fusion ("mean", "max"; empty is "mean") or an index checked by ``index``
    (``fit``: as there, a redraw from the app's own control)."""
    if value is None or value == "" or value in HEADS_DEFAULT:
        return value or "mean"
    return index(value, heads, "head", fit=fit)


# ------------------------------------------------------------------------------------------- handlers
def read_text(text: str | None) -> str:
    """The text a handler works on: stripped, capped at MAX_TEXT_CHARS; empty text is refused."""
    text = (text or "").strip()
    if not text:
        raise Error("Please type some text first.")
    return text[:MAX_TEXT_CHARS]


MAX_SEED = 2**64 - 1  # what torch.Generator.manual_seed and numpy's default_rng both take


def seed_box(label: str = "seed") -> gr.Number:
    """A seed input. No precision or minimum of its own: gr.Number's preprocessing would round 2.5 and fail on text
    with a bare TypeError, so every value reaches ``read_seed`` (in the handler), which refuses it in words."""
    return gr.Number(value=0, label=label, step=1)


def read_seed(seed: Any) -> int:
    """A random seed from the UI or the API: a whole number from 0 to 2⁶⁴ − 1 (empty: 0); anything else is
    refused in words (a seed of 2⁷⁰ used to reach torch and fail there)."""
    if seed is None or seed == "":
        return 0
    refuse = Error(f"The seed must be a whole number from 0 to 2⁶⁴ − 1 ({MAX_SEED}), got {str(seed)[:40]}.")
    if isinstance(seed, bool):
        raise refuse
    if isinstance(seed, int):
        whole = seed
    else:
        try:
            value = float(seed)
        except (TypeError, ValueError):
            raise refuse from None
        if not value.is_integer():
            raise refuse
        text = str(seed).strip()
        whole = int(text) if text.isdigit() else int(value)  # digits exactly, beyond a float's precision
    if not 0 <= whole <= MAX_SEED:
        raise refuse
    return whole


def parse_head(head: str | int | None) -> str | int:
    """A head index from the dropdown ("3" -> 3), or a fusion name ("mean", "max")."""
    return int(head) if str(head).isdigit() else (head or "mean")


def fit(fig):
    """Let a figure take its column's width (the viz builders size figures for a full-width page)."""
    if fig is not None:
        fig.update_layout(width=None, autosize=True)
    return fig


def pieces_apart(arrays: dict[str, Any]) -> dict[str, Any]:
    """Token labels that carry the tokenizer's own pieces (byte-level BPE, models.inputs.tokenizer.Piece) written as
    two arrays: ``<key>`` the pieces exactly as the model saw them (transformers' ``convert_ids_to_tokens``),
    ``<key>_readable`` the labels the figures show. Other values unchanged."""
    out: dict[str, Any] = {}
    for key, value in arrays.items():
        if isinstance(value, (list, tuple)) and any(hasattr(t, "raw") for t in value):
            out[key] = np.asarray([getattr(t, "raw", t) for t in value])
            out[f"{key}_readable"] = np.asarray([str(t) for t in value])
        else:
            out[key] = value
    return out


def save_npz(prefix: str, compressed: bool = False, **arrays: Any) -> str:
    """Write the arrays behind the current figures for download; returns the file's path. ``compressed``: deflate
    each array (a long input's attention), at zlib level 1 — the same .npz as np.savez_compressed (np.load reads
    it), a third faster at nearly the same size, streamed in chunks so nothing is copied whole."""
    DOWNLOADS.mkdir(parents=True, exist_ok=True)
    path = DOWNLOADS / f"{prefix}-{uuid.uuid4().hex[:8]}.npz"
    arrays = pieces_apart(arrays)
    if not compressed:
        np.savez(path, **{k: np.asarray(v) for k, v in arrays.items()})  # stored, not deflated: ~30 ms less a call
        return str(path)
    import zipfile

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for name, value in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asarray(value), allow_pickle=False)
    return str(path)


def require_full(n_tokens: int, what: str) -> None:
    """Refuse, in words, a view that runs a plain forward over the whole input above ``limits.MAX_FULL_TOKENS``
    tokens (its T × T mask and maps would not fit: a long input's attention lives in the store)."""
    if n_tokens > limits.MAX_FULL_TOKENS:
        raise Error(f"{what} runs the model once more over the whole input with its full attention, which reads at "
                    f"most {limits.MAX_FULL_TOKENS:,} tokens; this one has {n_tokens:,}. The long-context views "
                    "(statistics, exact rows, zoom) read any length.")


HEAD_VIEW_MAX = 4096  # tokens up to which the head view (a line per weight above its threshold) is drawn


def attention_figure(amap, kind_title: str, layer: int, head: str | int, view: str, pool: str = "max",
                     layer_names: list[str] | None = None):
    """One AttentionMap as a heatmap (one layer, one head or a fusion), head view or model view. ``pool``: how a
    long input's heatmap tiles summarise their blocks ("max" or "mean", viz.attention.POOL_ABOVE); ``layer_names``:
    the model view's word per layer (a hybrid model's kinds)."""
    layer, head = index(layer, amap.layers, "layer", fit=True), head_index(head, amap.heads, fit=True)
    kept = getattr(amap, "attention", None)  # a DeviceMap (models/decoding/ondevice.py): each figure's part only
    if view == "model view":
        if kept is None:
            return va.model_view(amap.weights, amap.queries, amap.keys, kind=kind_title, layer_names=layer_names)
        cells = va.model_view_cells(amap.layers, amap.heads)
        if kept.pooled and kept.edges is not None and np.array_equal(kept.edges, block_edges(kept.length, cells)):
            tiles = (kept.pooled["max"], kept.edges, kept.edges)  # made while generating
        else:
            parts = [kept.tiles(i, None, cells, "max") for i in range(amap.layers)]
            tiles = (np.stack([p[0] for p in parts]), parts[0][1], parts[0][2])
        return va.model_view(None, amap.queries, amap.keys, kind=kind_title, tiles=Pooled(*tiles))
    if view == "head view":
        if len(amap.keys) > HEAD_VIEW_MAX:
            raise Error(f"The head view draws a line per strong weight and reads at most {HEAD_VIEW_MAX:,} tokens; "
                        f"this text has {len(amap.keys):,}: use the heatmap (its tiles, zoom and exact rows).")
        heads = list(range(amap.heads)) if isinstance(head, str) else [head]
        # Only lines clearly above a uniform spread (1/keys) are drawn, so the structure stands out.
        threshold = max(0.05, 2.0 / max(len(amap.keys), 1))
        lines = None if kept is None else va.HeadLines(*kept.lines(layer, heads, threshold, va.HEAD_VIEW_SEGMENTS))
        return va.head_view(None if kept else amap.weights, amap.queries, amap.keys, layer=layer, heads=heads,
                            kind=kind_title, threshold=threshold, lines=lines)
    # one map per layer (Mamba's implicit attention, channels averaged): no head to pick or fuse, none named
    head, named = (0, None) if amap.heads == 1 else (head, head)
    if kept is None:
        return va.attention_heatmap(amap.weights, amap.queries, amap.keys, layer=layer, head=head, kind=kind_title,
                                    pool=pool, title=va.describe(kind_title, layer, named))
    return va.attention_heatmap(device_block(kept, layer, head, pool), amap.queries, amap.keys, kind=kind_title,
                                title=va.describe(kind_title, layer, named), pool=pool)


def device_block(kept, layer: int, head: str | int, pool: str, rows: tuple[int, int] | None = None,
                 cols: tuple[int, int] | None = None):
    """A block (default: all) of one head's or a fusion's map kept on the device (``ondevice.DeviceAttention``),
    as a figure draws it: the (r, c) weights, or over viz.attention.POOL_ABOVE a side its ``Pooled`` tiles, made
    there (only they leave the device)."""
    r0, r1 = rows or (0, kept.length)
    c0, c1 = cols or (0, kept.length)
    whole = (r0, r1, c0, c1) == (0, kept.length, 0, kept.length)
    if whole and kept.length > va.POOL_ABOVE:  # the whole map's tiles: made by the prompt pass, or kept once made
        return Pooled(*kept.overview(layer, head, pool, va.TILE_CELLS))
    if max(r1 - r0, c1 - c0) > va.POOL_ABOVE:
        return Pooled(*kept.tiles(layer, head, va.TILE_CELLS, pool, (r0, r1), (c0, c1)))
    return kept.fused(layer, head, (r0, r1), (c0, c1))


def head_map(amap, layer: int, head: str | int) -> np.ndarray:
    """One head's (or a fusion's) (Q, K) map of ``layer``, of an AttentionMap or of a DeviceMap (fused on the
    device: only the (Q, K) map leaves it)."""
    kept = getattr(amap, "attention", None)
    return va.select_head(amap.weights, layer, head) if kept is None else kept.fused(layer, head)


def stats_figure(amap, kind_title: str):
    """Where each head looks (self-attention) or each head's entropy in bits (cross-attention)."""
    from models.analysis import head_entropy

    # the kind in the subtitle, under a short title: a long title was cut where the figure is narrow
    if amap.queries == amap.keys:
        shares, names = vs.token_shares(amap.weights, amap.queries)
        return fit(vs.head_share_heatmap(shares, names, title="Where each head looks",
                                         subtitle=f"{kind_title}<br>each head's share, over all queries"))
    return fit(vs.entropy_heatmap(head_entropy(amap.weights) / np.log(2), title="Entropy per head",
                                  subtitle=f"{kind_title}<br>low: a focused head, high: a broad one"))


def window_figure(result, block, head: str | int, query: tuple[int, int]):
    """One Swin token's attention inside its window, over the image: one head, or the mean or max of the block's
    heads (each window's rows fused over heads, as the ViT maps fuse them)."""
    weights = block.weights  # (windows, H, N, N)
    if isinstance(head, str):
        weights = weights.max(1, keepdims=True) if head == "max" else weights.mean(1, keepdims=True)
        h, said = 0, f"{'max' if head == 'max' else 'mean'} of {block.weights.shape[1]} heads"
    else:
        h = index(head, block.weights.shape[1], "head", fit=True)
        said = f"head {h}"
    title = (f"Token r{query[0]}c{query[1]} → its window · stage {block.stage} block {block.block} · {said}"
             f"{' · shifted' if block.shift else ''}")
    return vw.window_attention_grid(weights, block.grid, block.window, block.shift, query, head=h,
                                    image=result.image, patch=block.patch, title=title)


# ------------------------------------------------------------------------------------------ explanations
EXPLANATIONS = METHODS  # id -> display name, for the explanation choices of Classify and Vision


def method_id(choice: str | None) -> str:
    """An explanation id from its id or display name (the API takes either); anything else is refused."""
    choice = (choice or "rollout").strip()
    for key, shown in EXPLANATIONS.items():
        if choice in (key, shown):
            return key
    raise Error(f"Unknown explanation {choice!r}; choose one of {', '.join(EXPLANATIONS)}.")


def target_index(target: str | None, labels: list[str]) -> int | None:
    """The class to explain from its label name (case-insensitive); empty means the predicted class."""
    target = (target or "").strip()
    if not target:
        return None
    for i, label in enumerate(labels):
        if target.lower() == str(label).lower():
            return i
    shown = ", ".join(labels[:12]) + (", …" if len(labels) > 12 else "")
    raise Error(f"Unknown class {target!r}; this model's classes are {shown}.")


IG_TOKEN_BUDGET = 2048  # integrated-gradients steps × tokens per request: 32 steps up to 64 tokens, 8 at 256


def ig_steps(tokens: int) -> int:
    """Integrated-gradients steps for an input of ``tokens`` tokens in the app: 32 (the method's default) up to
    64 tokens, fewer for longer inputs so that a request stays within seconds on a CPU (at least 8; the
    completeness gap shown beside the colouring says how close the sum came)."""
    return int(np.clip(IG_TOKEN_BUDGET // max(int(tokens), 1), 8, 32))


GAP_WARN = 0.05  # an integrated-gradients completeness gap above this is refined once, then said to be rough


def completeness(attribution) -> str:
    """What an explanation's completeness gap means, for its figure title ("" for methods without one)."""
    gap = attribution.completeness_gap
    if gap is None:
        return ""
    text = f" · completeness gap {gap:.1%}"
    if gap > GAP_WARN:
        text += (f"<br><sup>The colours should add up to the change in the class score from the baseline (Sundararajan "
                 f"et al. 2017); with {attribution.steps} integration steps they miss it by {gap:.0%}, so read them "
                 "as rough.</sup>")
    return text


def attribute(state: dict, method: str, progress: Any = None):
    """The explanation ``method`` of the kept input toward the kept target, computed once and kept in the
    state. A model that does not offer it (Swin: gradient methods only) gets gradient × input, with a notice."""
    from models.inspect.attribution import explain, methods_for

    kept = state["attributions"]
    if method not in kept:
        net = get_model(state["model"])
        offered = methods_for(net)
        chosen = method if method in offered else offered[0]
        if chosen not in kept:
            steps = ig_steps(len(state["result"].attention["encoder"].keys)) if state["result"].attention else 32
            if progress is not None and chosen == "integrated_gradients":
                progress(0.5, desc=f"integrated gradients, {steps} steps")
            try:
                found = explain(net, state["input"], chosen, target=state["target"], steps=steps)
                if (found.completeness_gap or 0) > GAP_WARN:  # one finer integral (twice the steps) before warning
                    found = explain(net, state["input"], chosen, target=state["target"], steps=2 * steps)
            except ValueError as err:
                raise Error(str(err)) from None
            kept[chosen] = found
        kept[method] = kept[chosen]
    return kept[method]


def deletion_plot(state: dict | None, explanation: str, progress: Any = None):
    """Every offered explanation's deletion curve on the kept input, against a random order (computes the
    explanations not asked for yet; the curves are kept in the state)."""
    if not state:
        return None
    from models.inspect.attribution import deletion_curves, methods_for
    from viz import attribution as vattr

    net = get_model(state["model"])
    methods = methods_for(net)
    if "curves" not in state:
        attributions = [attribute(state, m, progress) for m in methods]
        state["curves"] = deletion_curves(net, state["input"], attributions)
    curves, random = state["curves"]
    removed = "patches" if state["attributions"][methods[0]].grid else "tokens"
    chosen = EXPLANATIONS.get(method_id(explanation))
    return fit(vattr.deletion_curves([(EXPLANATIONS[c.method], c.fractions, c.probs) for c in curves],
                                     (curves[0].fractions, random), label=curves[0].label, removed=removed,
                                     chosen=chosen))
