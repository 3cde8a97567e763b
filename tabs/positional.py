"""Positional encoding: sinusoidal encodings, RoPE, and the learned position embeddings of
`checkpoints/vit-fashion`."""

from __future__ import annotations

import gradio as gr
import numpy as np

from models import registry
from serving import catalogue
from tabs.common import FAST, Error, Plot, fit, get_model, intro, model_choice
from tabs.permalink import Permalink
from viz import positional as vp
from viz.common import esc, shorten

TITLE = "Positional encoding"
MODEL = "vit-fashion"
INTRO = """**Attention itself has no sense of order; positions are added.** The sinusoidal
encoding (Vaswani et al. 2017) gives each position a pattern of waves of different wavelengths, so nearby
positions look alike. RoPE (Su et al. 2021) instead rotates pairs of query/key dimensions by an angle that
grows with position, so a query–key score depends only on their distance. ViT learns its embeddings; trained,
they come to encode the 2-D patch grid. T5 adds no position to its tokens at all: each head learns a bias for each
bucket of relative offsets (the last section)."""
MAX_POSITIONS, MAX_WIDTH = 512, 1024
T5_TEXT = """### T5: relative positions in buckets
T5 (Raffel et al. 2020) adds no position vector to its tokens. Each head instead adds a learned number to the score
q·k, chosen by the *bucket* of the offset key − query: small offsets get a bucket each, larger ones share
logarithmically wider buckets, and beyond `max_distance` one bucket holds them all. The encoder's buckets are
bidirectional (keys before and after the query apart); the decoder's are causal. One table per stack is learned in
its first layer and added in every layer. Pick a T5 from the Translate tab's models (a configured folder, or
`google-t5/t5-small` from the Hub)."""


def build() -> Permalink:
    """Lays the tab out; its permalink's run draws the encodings when the page loads."""
    intro(INTRO, MODEL)
    with gr.Row():
        length = gr.Slider(2, MAX_POSITIONS, value=64, step=1, label="positions")
        d_model = gr.Slider(2, MAX_WIDTH, value=128, step=2, label="model width d")
        dims = gr.Textbox(value="0, 1, 6, 7, 32", label="dimensions to plot as curves")
        pair = gr.Slider(0, 63, value=0, step=1, label="RoPE dimension pair")
    with gr.Row():
        heat = Plot(label="sinusoidal encoding")
        sim = Plot(label="position similarity")
    curves = Plot(label="chosen dimensions")
    with gr.Row():
        rope = Plot(label="RoPE rotation")
        offsets = Plot(label="RoPE scores by offset")
    inputs, outputs = [length, d_model, dims, pair], [heat, curves, sim, rope, offsets]
    gr.Button("Draw encodings", variant="primary").click(positional_encoding, inputs, outputs,
                                                         api_name="positional_encoding", **FAST)
    for control in (length, d_model, pair):
        control.change(positional_encoding, inputs, outputs, api_name=False, show_progress="hidden", **FAST)
    dims.submit(positional_encoding, inputs, outputs, api_name=False, **FAST)
    gr.Markdown(f"### Learned position embeddings of the shipped ViT (`{MODEL}`)")
    learned = Plot(label="learned position embeddings")
    gr.Button("Show the ViT's position embeddings").click(vit_positions, [], [learned], api_name="vit_positions")
    gr.Markdown(T5_TEXT)
    with gr.Row():
        choices = catalogue.t5_models()
        t5_model = model_choice(gr.Dropdown(choices, value=choices[0] if choices else None, label="T5 model",
                                                scale=3))
        t5_run = gr.Button("Show T5's buckets and biases", scale=1)
    t5_note = gr.Markdown()
    t5_plot = Plot(label="T5 relative position bias")
    t5_run.click(t5_bias, [t5_model], [t5_note, t5_plot], api_name="t5_bias")
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


def t5_bias(model: str = ""):
    """A T5's bucket function (offset → bucket, encoder and decoder) and each head's learned bias by offset:
    (a sentence on what the figure shows, the figure)."""
    import torch

    from models.families.t5 import relative_bucket

    choices = catalogue.t5_models()
    model = model or (choices[0] if choices else "")
    if model not in choices:
        raise Error(f"{str(model)[:80]!r} is not a T5 model here; choose one of: {', '.join(choices) or 'none'}.")
    net = get_model(model)
    if registry.family_of(net).positional != "relative_bias":
        raise Error(f"{model} is not a T5 model.")
    c = net.config
    reach = int(c.max_distance * 1.25) + 2
    offsets = np.arange(-reach, reach + 1)
    o = torch.from_numpy(offsets)
    enc_b = relative_bucket(o, True, c.num_buckets, c.max_distance).numpy()
    dec_b = relative_bucket(o, False, c.num_buckets, c.max_distance).numpy()
    enc, dec = net.enc_bias.by_offset(offsets.tolist()), net.dec_bias.by_offset(offsets.tolist())
    exact = c.num_buckets // 4  # per direction in the encoder: offsets below this have a bucket each
    note = (f"**{esc(model)}**: {c.num_buckets} buckets, `max_distance` {c.max_distance}, {c.n_heads} heads. In the "
            f"encoder, offsets −{exact - 1} … {exact - 1} each have a bucket of their own; from ±{c.max_distance} on, "
            f"all share the last. Largest |bias|: encoder {np.abs(enc).max():.2f}, decoder {np.abs(dec).max():.2f}.")
    return note, vp.t5_bias(offsets, enc_b, dec_b, enc, dec, title=f"{esc(model)}: relative position bias")
