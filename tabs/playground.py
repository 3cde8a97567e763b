"""Attention playground: softmax(QKᵀ/√d_k)·V on random Q, K, V, one step at a time (no trained model)."""

from __future__ import annotations

import gradio as gr
import numpy as np

from tabs.common import FAST, Error, Plot, intro, read_seed, seed_box
from tabs.permalink import Permalink
from viz import playground as pg

TITLE = "Attention playground"
INTRO = """**softmax(QKᵀ/√d_k)·V, one step at a time.** Each query row of Q is compared
with every key row of K (the dot products QKᵀ), the scores are divided by √d_k, forbidden positions are set
to −∞ (the mask), and a softmax turns each row into weights that sum to 1. The output row is the weighted
mean of V's rows. Try: switch the scale off and raise d_k: the softmax saturates onto one key (the entropy
chart shows it collapse), which is why Transformers divide by √d_k."""


def build() -> Permalink:
    """Lays the tab out; its permalink's run draws the playground when the page loads."""
    intro(INTRO)
    with gr.Row():
        seq_len = gr.Slider(1, pg.MAX_LEN, value=6, step=1, label="sequence length (tokens)")
        d_k = gr.Slider(1, pg.MAX_DK, value=8, step=1, label="d_k (query/key width)")
        seed = seed_box("random seed")
    with gr.Row():
        mask = gr.Radio(list(pg.MASKS), value="none", label="mask")
        scale = gr.Checkbox(value=True, label="divide by √d_k")
        run = gr.Button("Run attention", variant="primary")
    summary = gr.Markdown()
    steps = Plot(label="every step of the formula")
    entropy = Plot(label="softmax entropy against d_k")
    inputs, outputs = [seq_len, d_k, seed, mask, scale], [steps, entropy, summary]
    run.click(playground, inputs, outputs, api_name="playground", **FAST)
    for control in (seq_len, d_k, mask, scale):
        control.change(playground, inputs, outputs, api_name=False, show_progress="hidden", **FAST)
    return Permalink({"tokens": seq_len, "dk": d_k, "seed": seed, "mask": mask, "scale": scale},
                     [(playground, inputs, outputs, FAST)], at_load=True)


def playground(seq_len: int = 6, d_k: int = 8, seed: int = 0, mask: str = "none", scale: bool = True):
    """Run every step of scaled dot-product attention on random Q, K, V and draw them."""
    try:
        steps = pg.compute_steps(seq_len=seq_len, d_k=d_k, seed=read_seed(seed), mask=mask, scale=scale)
    except ValueError as err:
        raise Error(str(err)) from None
    curves = pg.entropy_vs_dk(seq_len=int(seq_len))
    summary = (
        f"Scale factor: **{steps.scale:.4g}** · mean softmax entropy **{steps.entropy.mean():.3f}** nats "
        f"(uniform would be {float(np.log(int(seq_len))):.3f}) · largest weight in a row, on average: "
        f"**{steps.weights.max(axis=1).mean():.3f}**"
    )
    return pg.playground_figure(steps), pg.entropy_figure(curves, current_dk=int(d_k)), summary
