"""Generate's "Through nnsight" section (issue 73): the configured model (serving/traced.py: ATLAS_NNSIGHT) read by
nnsight trace code, here (``remote=False``) or on NDIF (``remote=True``), which saves only reductions: one layer's
tiles of every head, every head's statistics, the chosen head's last row and the logit lens. Shows where it ran and
how many bytes came back against the full attention's. The button is the API action ``/nnsight_views``."""

from __future__ import annotations

import gradio as gr
import numpy as np

from tabs.common import Error, Plot, read_text

TEXT = """### Through nnsight: the same views where a large model runs
A model too large for this machine runs on [NDIF](https://ndif.us) through nnsight: the trace code that computes the
attention from each layer's queries and keys (with the model's RoPE and grouped heads) runs *where the model runs*,
and only the reductions come back (a 405 B model's full attention over 1,024 tokens is ~34 GB). With no NDIF key the
same code runs here (`remote=False`), and CI holds every number to the app's own model path. The server chooses the
model: `ATLAS_NNSIGHT=<folder or Hub id>`, and `ATLAS_NNSIGHT_REMOTE=1` with `NDIF_API_KEY` for NDIF."""
STATS = {"sink share": ("sink", "share"), "entropy (bits)": ("entropy", "bits"),
         "mean distance (tokens)": ("distance", "tokens"), "local share": ("local", "share")}


def section(prompt: gr.Textbox) -> None:
    """The section, closed until opened; ``prompt`` is the tab's text."""
    with gr.Accordion("Through nnsight (here or on NDIF)", open=False, elem_id="generate-nnsight"):
        gr.Markdown(TEXT)
        with gr.Row():
            layer = gr.Number(0, precision=0, label="layer")
            head = gr.Number(0, precision=0, label="head")
            statistic = gr.Radio(list(STATS), value="sink share", label="statistic per head")
            run = gr.Button("Trace through nnsight", variant="primary")
        note = gr.Markdown(elem_id="generate-nnsight-note")
        tiles = Plot(label="the layer's attention (tiles computed where the model runs)",
                     elem_id="generate-nnsight-map")
        grid = Plot(label="per head, over every query", elem_id="generate-nnsight-stats")
        lens = Plot(label="logit lens (the last 64 positions)", elem_id="generate-nnsight-lens")
    run.click(nnsight_views, [prompt, layer, head, statistic], [note, tiles, grid, lens], api_name="nnsight_views",
              concurrency_limit=1)


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} B"


def nnsight_views(text: str, layer: float = 0, head: float = 0, statistic: str = "sink share"):
    """The configured model's views of ``text`` by one nnsight trace: (note, tiles, statistic grid, logit lens)."""
    from serving import traced
    from viz import attention as va
    from viz import generate as vg
    from viz import heads as vh
    from viz.common import Pooled

    text = read_text(text)
    if statistic not in STATS:
        raise Error(f"Unknown statistic {str(statistic)[:40]!r}; choose one of {', '.join(STATS)}.")
    try:
        layer, head = int(layer or 0), int(head or 0)
        source, _, _ = traced.model()
        source = traced.shown_name(source)
        views, tokens, lay = traced.trace(text, layer, head)
    except (traced.NotConfigured, ValueError) as err:
        raise Error(str(err)) from None
    except Exception as err:  # the network, NDIF's answer, a model nnsight cannot open: said, never a trace
        raise Error(f"nnsight could not run {str(source)[:80] if 'source' in locals() else 'the model'}: "
                    f"{type(err).__name__}: {str(err)[:300]}") from None
    t = len(tokens)
    note = (f"**{source}** ran {'on ' + views.where if views.where.startswith('NDIF') else views.where} in "
            f"{views.seconds:.2f} s over {t:,} tokens: **{_size(views.bytes_back)} came back**, against "
            f"{_size(views.full_bytes)} for the full attention of its {lay.n_layers} layers × {lay.n_heads} heads "
            "(float16). Every number below was computed where the model ran.")
    edges = views.edges
    tiles = va.attention_heatmap(Pooled(views.tiles["max"][layer][head], edges, edges), tokens, tokens, layer=layer,
                                 head=head, kind=f"Traced ({views.where.split(' (')[0]})")
    key, unit = STATS[statistic]
    grid = views.stats[key] / (np.log(2) if key == "entropy" else 1.0)
    stats = vh.head_grid(grid, statistic, unit, title=f"{statistic[0].upper()}{statistic[1:]} per head over {t:,} "
                                                      "tokens (traced)", mark=(layer, head))
    lens = views.lens
    shown = tokens[t - lens["top"].shape[1]:]
    piece = traced_piece(traced.model()[2])
    following = [*[tokens[i] for i in range(t - len(shown) + 1, t)], piece(lens["choice"])]
    lens_fig = vg.logit_lens([[piece(i) for i in row] for row in lens["top"]], lens["next_p"], shown, following,
                             title=f"Logit lens · {source} (traced)")
    return note, tiles, stats, lens_fig


def traced_piece(lm):
    """id -> the token as the model's tokenizer writes it."""
    return lambda i: str(lm.tokenizer.convert_ids_to_tokens(int(i)))
