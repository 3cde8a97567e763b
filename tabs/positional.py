"""Positional encoding: sinusoidal encodings, RoPE, and the learned position embeddings of
`checkpoints/vit-fashion`."""

from __future__ import annotations

import gradio as gr

from tabs.common import FAST, fit, get_model, intro
from tabs.permalink import Permalink
from viz import positional as vp
from viz.common import esc, shorten

TITLE = "Positional encoding"
MODEL = "vit-fashion"
INTRO = """**Attention itself has no sense of order; positions are added.** The sinusoidal
encoding (Vaswani et al. 2017) gives each position a pattern of waves of different wavelengths, so nearby
positions look alike. RoPE (Su et al. 2021) instead rotates pairs of query/key dimensions by an angle that
grows with position, so a query–key score depends only on their distance. ViT learns its embeddings; trained,
they come to encode the 2-D patch grid."""
MAX_POSITIONS, MAX_WIDTH = 512, 1024


def build() -> Permalink:
    """Lays the tab out; its permalink's run draws the encodings when the page loads."""
    intro(INTRO, MODEL)
    with gr.Row():
        length = gr.Slider(2, MAX_POSITIONS, value=64, step=1, label="positions")
        d_model = gr.Slider(2, MAX_WIDTH, value=128, step=2, label="model width d")
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
    gr.Markdown(f"### Learned position embeddings of the shipped ViT (`{MODEL}`)")
    learned = gr.Plot(label="learned position embeddings")
    gr.Button("Show the ViT's position embeddings").click(vit_positions, [], [learned], api_name="vit_positions")
    return Permalink({"positions": length, "d": d_model, "dims": dims, "pair": pair},
                     [(positional_encoding, inputs, outputs, FAST)], at_load=True)


def positional_encoding(length: int = 64, d_model: int = 128, dims: str = "0, 1, 6, 7, 32",
                        rope_pair: int = 0):
    """Sinusoidal encodings, RoPE rotations and offsets, for the chosen length and width."""
    from models.blocks.positional import rope_demo, sinusoidal_table

    length, d_model = max(2, min(int(length), MAX_POSITIONS)), max(2, min(int(d_model), MAX_WIDTH))
    d_model += d_model % 2
    pe = sinusoidal_table(length, d_model).numpy()
    parts = [d.strip() for d in str(dims).replace(";", ",").split(",") if d.strip()]
    chosen = sorted({int(d) for d in parts if d.isdigit() and int(d) < d_model})
    ignored = [d for d in parts if not (d.isdigit() and int(d) < d_model)]
    curves_title = "Chosen dimensions along positions"
    if ignored or not chosen:  # say what was left out, never silently
        shown = ", ".join(ignored[:4]) + (" …" if len(ignored) > 4 else "")
        curves_title += (f"<br><sup>ignored {esc(shorten(shown, 40))}: dimensions are whole numbers 0 … {d_model - 1}"
                         + ("; showing 0 and 1" if not chosen else "") + "</sup>")
        chosen = chosen or [0, 1]
    pair = max(0, min(int(rope_pair), d_model // 2 - 1))
    rotated, scores = rope_demo(length, d_model, pair)
    return (fit(vp.sinusoidal_heatmap(pe, title=f"Sinusoidal encoding: {length} positions × {d_model} dims")),
            vp.sinusoidal_curves(pe, chosen, title=curves_title),
            fit(vp.position_similarity(pe, "cosine", title="Position–position cosine similarity")),
            fit(vp.rope_rotation(rotated.numpy(), pair=pair, title=f"RoPE: dimension pair {pair} turns with position")),
            fit(vp.rope_offset_scores(scores.numpy(), [0, length // 4, length // 2])))


def vit_positions():
    """Cosine similarity of the shipped ViT's learned position embeddings (ViT paper, Fig. 7 centre)."""
    net = get_model(MODEL)
    return vp.learned_pe_grid(net.position_embeddings()[net.num_prefix_tokens:], net.grid,
                              title=f"{MODEL}: learned position embeddings<br><sup>cosine similarity of each "
                                    "patch's embedding to every other</sup>")
