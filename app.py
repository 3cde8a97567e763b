"""Attention Atlas: see what attention does inside Transformers.

`python app.py` serves the app on 127.0.0.1:7860 (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT change that).
Layout first, thin handlers after: each handler runs a model (loaded lazily, once per process) or the
playground formula, keeps the result in gr.State and calls a viz/ figure builder.
"""

from __future__ import annotations

import gradio as gr

from viz import playground as pg

TITLE = "Attention Atlas"

CSS = """
.intro {font-size: 1.02rem; line-height: 1.5;}
.notice {border-left: 4px solid #e0a800; padding: 0.4rem 0.8rem; background: #fff8e1;}
footer {display: none !important;}
"""

PLAYGROUND_INTRO = """
**softmax(QKᵀ/√d_k)·V, one step at a time.** Each query row of Q is compared with every key row of K
(the dot products QKᵀ), the scores are divided by √d_k, forbidden positions are set to −∞ (the mask),
and a softmax turns each row into weights that sum to 1. The output row is the weighted mean of V's rows.
Try: switch the scale off and raise d_k — the softmax saturates onto one key (the entropy chart shows it
collapse), which is why Transformers divide by √d_k. A causal mask blanks everything above the diagonal.
"""

PENDING = {
    "Translate": "English → German translation with an encoder–decoder Transformer trained by the project: "
                 "encoder, decoder and cross-attention per layer and head, and the beam-search tree.",
    "Classify": "Sentiment (SST-2) and news topic (AG News) with Transformer encoders: class probabilities, "
                "attention per layer and head, rollout, and the sentence coloured by attention.",
    "Vision": "ViT and Swin on Fashion-MNIST (and ImageNet ViT-B/16 / Swin-T when their weights are cached): "
              "CLS→patch attention over the image, rollout, and a clicked patch's attention.",
    "Swin windows": "Window partition, cyclic shift, region ids and the −100 attention mask of shifted "
                    "windows, plus the trained Swin's per-window attention and relative-position bias.",
    "Positional encoding": "Sinusoidal encodings, RoPE rotations and the learned position embeddings of "
                           "the shipped ViT.",
}


def playground(seq_len: int = 6, d_k: int = 8, seed: int = 0, mask: str = "none", scale: bool = True):
    """Run every step of scaled dot-product attention on random Q, K, V and draw them."""
    try:
        steps = pg.compute_steps(seq_len=seq_len, d_k=d_k, seed=seed, mask=mask, scale=scale)
    except ValueError as err:
        raise gr.Error(str(err)) from None
    curves = pg.entropy_vs_dk(seq_len=int(seq_len))
    summary = (
        f"Scale factor: **{steps.scale:.4g}** · mean softmax entropy **{steps.entropy.mean():.3f}** nats "
        f"(uniform would be {float(pg.np.log(int(seq_len))):.3f}) · largest weight in a row, on average: "
        f"**{steps.weights.max(axis=1).mean():.3f}**"
    )
    return pg.playground_figure(steps), pg.entropy_figure(curves, current_dk=int(d_k)), summary


def _pending_tab(name: str) -> None:
    gr.Markdown(f"{PENDING[name]}\n\n*This tab's models are not built yet; it will appear here when they are.*",
                elem_classes=["intro", "notice"])


def build_demo() -> gr.Blocks:
    with gr.Blocks(title=TITLE) as demo:
        gr.Markdown(f"# {TITLE}\nSee what attention does inside Transformers: pick a tab, give it input, "
                    "and move through layers and heads.")
        with gr.Tabs():
            for name in ("Translate", "Classify", "Vision", "Swin windows", "Positional encoding"):
                with gr.Tab(name):
                    _pending_tab(name)
            with gr.Tab("Attention playground"):
                gr.Markdown(PLAYGROUND_INTRO, elem_classes=["intro"])
                with gr.Row():
                    pg_len = gr.Slider(1, pg.MAX_LEN, value=6, step=1, label="sequence length (tokens)")
                    pg_dk = gr.Slider(1, pg.MAX_DK, value=8, step=1, label="d_k (query/key width)")
                    pg_seed = gr.Number(value=0, precision=0, label="random seed", minimum=0)
                with gr.Row():
                    pg_mask = gr.Radio(list(pg.MASKS), value="none", label="mask")
                    pg_scale = gr.Checkbox(value=True, label="divide by √d_k")
                    pg_run = gr.Button("Run attention", variant="primary")
                pg_summary = gr.Markdown()
                pg_steps = gr.Plot(label="every step of the formula")
                pg_entropy = gr.Plot(label="softmax entropy against d_k")
                inputs = [pg_len, pg_dk, pg_seed, pg_mask, pg_scale]
                outputs = [pg_steps, pg_entropy, pg_summary]
                pg_run.click(playground, inputs, outputs, api_name="playground")
                for control in (pg_len, pg_dk, pg_mask, pg_scale):
                    control.change(playground, inputs, outputs, api_name=False, show_progress="hidden")
                demo.load(playground, inputs, outputs, api_name=False)
    return demo


def main() -> None:
    demo = build_demo()
    # Host and port come from GRADIO_SERVER_NAME / GRADIO_SERVER_PORT; Gradio's default host is 127.0.0.1.
    demo.queue(default_concurrency_limit=2, max_size=64).launch(theme=gr.themes.Soft(), css=CSS)


if __name__ == "__main__":
    main()
