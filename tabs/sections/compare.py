"""The compare toggle the text tabs share (docs/ARCHITECTURE.md §2): a second input run with the tab's settings,
drawn under the first at the same layer, head and view, with B − A over the tokens both share and the change per
token or class; the .npz holds both."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gradio as gr
import numpy as np

from models import limits
from tabs.common import FAST, Error, Plot, read_text
from tabs.sections.text import MAX_PATCH_CHARS
from viz import why as vw
from viz.common import esc


def comparison(tab: str, state: gr.State, view_of: Callable[[Any], dict], run_b: Callable[..., Any],
               inputs: list, layer: gr.Slider, head: gr.Dropdown, view: gr.Radio, shows: str = "") -> tuple:
    """The compare toggle: a second input (B) run with the tab's current settings (``run_b(text, *inputs)`` returns
    its kept state), drawn under the first at the same layer, head and view, with B − A over the tokens they
    share and the change per token or class. ``view_of(state)`` says what to draw: ``amap`` (the AttentionMap),
    ``values`` (per token, or per class with ``classes``), ``kind`` (the figure's title), optionally ``what`` and
    ``unit`` (default surprisal in bits). ``shows``: which attention the comparison draws when it is not the one the
    figure above shows (Translate compares the encoder's, whichever attention is chosen above).

    Returns the step the tab appends to its run's chain (``tabs.permalink.chain``): a new A (another input, model or
    setting) clears B, its figures and its arrays, so B is never drawn against an A it was not run beside."""
    on = gr.Checkbox(False, label="compare with a second input (B)")
    with gr.Column(visible=False) as box:
        if shows:
            gr.Markdown(f"The comparison draws the **{shows}** of A and B, whichever attention is chosen above.")
        with gr.Row():
            text_b = gr.Textbox(label="input B", lines=2, scale=4, max_length=MAX_PATCH_CHARS)
            run = gr.Button("Compare", scale=1)
        note = gr.Markdown()
        # one under the other, each the page's width as A's figure is (side by side, each had half of it: a
        # 41-token map's cells shrank to a few pixels)
        plot_b = Plot(label=f"B · {shows}, same layer, head and view" if shows else "B, same layer, head and view")
        plot_d = Plot(label=f"B − A · {shows}, over the tokens both inputs share" if shows else
                         "B − A over the tokens both inputs share")
        change = Plot(label="what changes")
        download = gr.File(label="both inputs' arrays (.npz)")
    state_b = gr.State()
    on.change(lambda v: gr.update(visible=bool(v)), [on], [box], api_name=False, show_progress="hidden")

    def go(a, text, lay, hd, vw_, *values):
        return beside(tab, view_of, run_b, a, text, lay, hd, vw_, *values)

    run.click(go, [state, text_b, layer, head, view, *inputs], [note, plot_b, plot_d, change, download, state_b],
              api_name=False)
    for control in (layer, head, view):
        control.change(lambda a, b, lay, hd, vw_: compared(view_of, a, b, lay, hd, vw_) if a and b else
                       (gr.update(),) * 4, [state, state_b, layer, head, view], [note, plot_b, plot_d, change],
                       api_name=False, show_progress="hidden", **FAST)
    cleared = (gr.update(value=""), None, None, None, None, None)
    return (lambda: cleared, [], [note, plot_b, plot_d, change, download, state_b], {"show_progress": "hidden"})


def beside(tab: str, view_of, run_b, a, text: str, layer, head, view, *values) -> tuple:
    """The Compare button: B run with the tab's settings beside the kept A (marked with the A it was run beside),
    drawn; (note, B's figure, B − A, the change, the .npz of both or None, B's state)."""
    if not a:
        raise Error("Run the first input (A) first: B is compared with it.")
    b = run_b(read_text(text), *values)
    kept = {"b": b, "against": against(view_of, a)}  # B with the A it was run beside (``compared`` checks it)
    # maps kept on a GPU (a DeviceMap) are compared there, without writing their every weight to a file
    device_side = any(hasattr(view_of(s)["amap"], "attention") for s in (a, b) if s)
    return (*compared(view_of, a, kept, layer, head, view),
            None if device_side else both_arrays(tab, view_of, a, b), kept)


def against(view_of, state) -> tuple:
    """What identifies a kept A for its comparison: the model, its tokens and its values (probabilities or
    surprisal), so a rerun of the same input with other settings counts as another A."""
    v = view_of(state)
    model = state.get("model") if isinstance(state, dict) else getattr(state, "model", None)
    return model, tuple(v["amap"].queries), np.asarray(v["values"], dtype=np.float32).tobytes()


def compared(view_of, state_a, state_b, layer, head, view):
    """(note, B's figure, B − A, the change per token or class) from two kept states: no model runs."""
    from models.analysis import align_tokens
    from tabs.common import attention_figure, head_map, index, parse_head

    if not state_a:
        raise Error("Run the first input (A) first: B is compared with it.")
    # a B the Compare button ran carries the A it was run beside: it is not drawn beside another A
    if isinstance(state_b, dict) and "against" in state_b:
        if state_b["against"] != against(view_of, state_a):
            raise Error("A has changed since B was compared (another input, model or setting): press Compare again.")
        state_b = state_b["b"]
    a, b = view_of(state_a), view_of(state_b)
    amap_a, amap_b = a["amap"], b["amap"]
    layer = index(layer, min(amap_a.layers, amap_b.layers), "layer", fit=True)
    hd = parse_head(head)
    fig_b = attention_figure(amap_b, f"B · {a['kind']}", layer, hd, view)
    pairs = align_tokens(amap_a.queries, amap_b.queries)
    wa, wb = head_map(amap_a, layer, hd), head_map(amap_b, layer, hd)
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
    from models.analysis import align_tokens
    from tabs.common import save_npz

    a, b = view_of(state_a), view_of(state_b)
    pairs = align_tokens(a["amap"].queries, b["amap"].queries)
    long = max(len(a["amap"].keys), len(b["amap"].keys)) > limits.LONG_TOKENS  # float16 arrays, deflated
    return save_npz(f"{tab}-compare", compressed=long, attention_a=a["amap"].weights, attention_b=b["amap"].weights,
                    tokens_a=list(a["amap"].queries), tokens_b=list(b["amap"].queries),
                    values_a=np.asarray(a["values"], dtype=np.float32), values_b=np.asarray(b["values"], np.float32),
                    shared=np.array(pairs, dtype=np.int64).reshape(-1, 2))
