"""Swin windows: the geometry of shifted windows (partition, cyclic shift, regions, the −100 masks), and the
trained `checkpoints/swin-fashion`'s window attention and relative-position-bias tables."""

from __future__ import annotations

import json

import gradio as gr
import numpy as np

from serving import catalogue
from tabs.common import EXAMPLE_IMAGES, EXAMPLE_NAMES, FAST, Plot, fit, get_model, index, intro, window_figure
from tabs.permalink import Field, Permalink
from viz import positional as vp
from viz import swin as vw

TITLE = "Swin windows"
MODEL = "swin-fashion"
INTRO = """**How Swin keeps attention local and still mixes windows.** Regular blocks split the
token grid into windows and attend only inside each. Shifted blocks move the windows by half a window; to
keep the same number of windows, the grid is *rolled* (cyclic shift) and tokens that came from opposite edges
are kept apart by adding −100 to their scores (the mask), so after softmax they get ~0 weight."""


def build() -> Permalink:
    """Lays the tab out; its permalink's run draws the geometry when the page loads."""
    intro(INTRO, MODEL)
    top_shift, top_index = limits_of(8, 4)  # the sliders start with the default grid's range (4 windows: 0 … 3)
    with gr.Row(equal_height=True):
        grid = gr.Slider(2, 16, value=8, step=1, label="token grid side")
        window = gr.Slider(1, 8, value=4, step=1, label="window size")
        shift = gr.Slider(0, top_shift, value=2, step=1, label="shift (window // 2 in Swin)")
        index = gr.Slider(0, top_index, value=3, step=1, label="window to inspect")
        draw = gr.Button("Draw windows", variant="primary", scale=0, min_width=140)  # above the figures it draws
    note = gr.Markdown()
    parts = Plot(label="regular and shifted windows")
    rolled = Plot(label="cyclic shift")
    with gr.Row():
        regions = Plot(label="region ids")
        mask = Plot(label="mask of one window")
    masks = Plot(label="masks of all windows")
    inputs, outputs = [grid, window, shift, index], [parts, rolled, regions, mask, masks, note]
    for control in inputs:
        control.change(swin_windows, inputs, outputs, api_name=False, show_progress="hidden", **FAST)
        # the shift and window sliders offer only what the figure can draw (it clamped them silently: shift 6 and
        # window 63 shown while it drew 3 and 8)
        control.change(window_limits, inputs, [shift, index], api_name=False, show_progress="hidden", **FAST)
    draw.click(swin_windows, inputs, outputs, api_name="swin_windows", **FAST)
    gr.Markdown(f"### The trained Swin (`{MODEL}`)")
    with gr.Row():
        example = gr.Dropdown(list(EXAMPLE_NAMES), value="ankle-boot", label="example image")
        block = gr.Slider(0, 3, value=1, step=1, label="block (odd blocks shift, where the grid holds more than one "
                                                       "window)")
        head = gr.Slider(0, 5, value=0, step=1, label="head")
        show = gr.Button("Show the trained Swin")
    trained_note = gr.Markdown()
    with gr.Row():
        win_attn = Plot(label="window attention of the centre token")
        bias = Plot(label="relative position bias")
    block.change(head_range, [block, head], [head], api_name=False, show_progress="hidden", **FAST)
    show.click(trained_swin, [example, block, head], [win_attn, bias, trained_note, head], api_name="trained_swin")
    # a link's grid and window set the sliders' range before the figures are drawn
    return Permalink({"grid": grid, "window": window, "shift": within(shift, 7), "index": within(index, MOST_WINDOWS)},
                     [(window_limits, inputs, [shift, index], FAST), (swin_windows, inputs, outputs, FAST)],
                     at_load=True)


MOST_WINDOWS = 16 * 16 - 1  # the largest window index any setting has (grid 16, windows of 1)


def within(slider: gr.Slider, most: int) -> Field:
    """A link's shift or window index: a whole number up to the most any grid and window allow (the slider's own
    range follows the grid and window, which the link sets first)."""
    def read(text: str) -> int:
        if not (text.isdigit() and int(text) <= most):
            raise ValueError
        return int(text)

    return Field(slider, read, lambda value: str(int(value)))


def swin_windows(grid: int = 8, window: int = 4, shift: int = 2, window_index: int = 3):
    """Window partition, cyclic shift, region ids and the −100 masks for a token grid."""
    from models.families.swin import window_geometry

    window = max(1, int(window))
    geo = window_geometry(max(1, int(grid)), window, max(0, min(int(shift), window - 1)))
    idx = max(0, min(int(window_index), geo.windows - 1))
    asked = int(window_index)
    note = (f"**There is no window {asked}**: this grid has {geo.windows} windows (0 … {geo.windows - 1}); showing "
            f"window {idx}. ") if asked != idx else ""
    note += (f"Grid {geo.grid}×{geo.grid} padded to {geo.side}×{geo.side} (a multiple of the window): the grey "
            f"“pad” cells are zeros the model adds, not image; the regions and the shift are computed on the padded "
            f"grid, and padding tokens are attended to like any other. ") if geo.side != geo.grid else ""
    note += (f"{geo.windows} windows of {window}×{window} = {window * window} tokens; shift {geo.shift}. "
             f"Window {idx} blocks {geo.blocked(idx)} of {geo.masks[idx].size} query–key pairs with −100.")
    rolled_padding = np.roll(geo.padding, (-geo.shift, -geo.shift), axis=(0, 1))
    return (vw.window_partitions((geo.grid, geo.grid), window, geo.shift),
            vw.cyclic_shift(geo.ids, geo.rolled, geo.regions, window, padding=geo.padding),
            fit(vw.region_map(geo.regions, window, padding=rolled_padding)),
            fit(vw.window_mask(geo.masks[idx], window, idx, padding=geo.window_padding(idx))),
            vw.all_window_masks(geo.masks, geo.side // window), note)


def window_limits(grid: int = 8, window: int = 4, shift: int = 2, window_index: int = 3):
    """The shift and window-index sliders' range for a grid and window size, their values clamped into it, as
    `swin_windows` clamps them (shift below the window, index below the number of windows)."""
    top, last = limits_of(grid, window)
    return (gr.update(maximum=max(top, 1), value=min(max(int(shift), 0), top)),
            gr.update(maximum=max(last, 1), value=min(max(int(window_index), 0), last)))


def limits_of(grid: int, window: int) -> tuple[int, int]:
    """The largest shift (below the window) and window index (below the number of windows, the grid padded to a
    multiple of the window) for a grid and window size."""
    window = max(1, int(window))
    side = -(-max(1, int(grid)) // window) * window
    return window - 1, (side // window) ** 2 - 1


def block_heads() -> list[int]:
    """Heads of each block of the trained Swin, read from its config.json without torch ([] when unreadable)."""
    try:
        config = json.loads((catalogue.CHECKPOINTS / MODEL / "config.json").read_text(encoding="utf-8"))["config"]
        return [heads for depth, heads in zip(config["depths"], config["heads"]) for _ in range(depth)]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def head_range(block: int, head: int):
    """The head slider offers the chosen block's heads only."""
    heads = block_heads()
    if not 0 <= int(block) < len(heads):
        return gr.update()
    return gr.update(maximum=heads[int(block)] - 1, value=min(int(head), heads[int(block)] - 1))


def trained_swin(example: str | None = None, block: int = 1, head: int = 0):
    """The shipped Swin's window attention on an example image and its relative-position-bias tables."""
    net = get_model(MODEL)
    result = net.classify(EXAMPLE_NAMES.get(example or "", EXAMPLE_IMAGES[-1]))  # names only, never paths
    b = index(block, len(result.windows), "block", fit=True)
    win = result.windows[b]
    heads = win.weights.shape[1]
    head = int(head)
    h = max(0, min(head, heads - 1))
    asked = f"Head {head} does not exist in block {b} ({heads} heads): showing head {h}. " if h != head else ""
    if win.shift:
        kind = "shifted windows"
    elif b % 2:  # Swin shifts odd blocks, except where one window already covers the whole grid (nothing to shift)
        kind = (f"regular windows: an odd block shifts, but at stage {win.stage} the {win.grid[0]}×{win.grid[1]} "
                f"token grid fits in one {win.window}×{win.window} window, so there is nothing to shift")
    else:
        kind = "regular windows"
    query = (win.grid[0] // 2, win.grid[1] // 2)
    tables = net.relative_position_bias_tables()[b]  # (heads, 2w−1, 2w−1)
    top = int(np.argmax(result.probs))
    return (fit(window_figure(result, win, h, query)),
            fit(vp.relative_bias_tables(tables, title=f"Relative position bias · block {b}")),
            f"{asked}Predicted **{result.labels[top]}** ({result.probs[top]:.1%}). Block {b}: stage {win.stage}, "
            f"{kind}; windows of {win.window}×{win.window} tokens.", gr.update(maximum=heads - 1, value=h))
