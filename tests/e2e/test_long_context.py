"""A ~2,000-token input in the browser and through the API: the app started with a configured tiny LLaMA of 4,096
positions (ATLAS_MODELS) and ATLAS_MAX_TOKENS=2048, the text read into the long-context store, its heatmap drawn
from pooled tiles, a block zoomed at full resolution, every head's statistics, an exact row, a tile clicked, and the
needle search's retrieval heads."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from playwright.sync_api import expect

from tests.conftest import app_env, free_port, serving

from .helpers import click_cell, cut_titles, open_tab, screenshot, sideways_figures, titles
from .test_tabs import _panel

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def long_app(tmp_path_factory, tiny_checkpoints) -> Iterator[str]:
    from bench._long_model import long_llama_folder

    base = tmp_path_factory.mktemp("long-app")
    long_llama_folder(base / "long-llama", layers=2, heads=4, d_model=64, positions=4096, vocab=2000)
    env = app_env(free_port(), ATLAS_CHECKPOINTS=str(tiny_checkpoints), ATLAS_OFFLINE="1",
                  ATLAS_MODELS=str(base / "long-llama"), ATLAS_MAX_TOKENS="2048")
    with serving(env, base / "server.log") as url:
        yield url


@pytest.fixture(scope="module")
def app_url(long_app) -> str:
    """The page fixture opens the app started with the long-context model."""
    return long_app


def _plot(page, elem_id: str) -> dict:
    """Title and z shape of the figure drawn inside #elem_id."""
    return page.evaluate("""(id) => { const el = document.querySelector('#' + id + ' .js-plotly-plot');
        const z = el._fullData[0].z;
        return {title: el._fullLayout.title.text, rows: z.length, cols: z[0].length,
                first: Array.from(z[0]).slice(0, 3), y0: el._fullData[0].y[0]}; }""", elem_id)


def _generate_long(page):
    """Generate on long-llama from the long prompt (read into the store); the tab's panel once its notice shows."""
    from bench._long_model import long_prompt

    open_tab(page, "Generate")
    panel = _panel(page)
    panel.get_by_role("combobox", name="model").click()
    page.get_by_role("option", name="long-llama", exact=True).click()
    panel.get_by_label("prompt").fill(long_prompt())
    panel.get_by_role("button", name="Generate", exact=True).click()
    expect(panel).to_contain_text("2,048 tokens: the heatmap shows max-pooled tiles", timeout=120_000)
    return panel


def test_a_2000_token_heatmap_and_a_zoom_in_the_browser(page) -> None:
    panel = _generate_long(page)
    page.wait_for_function("() => { const el = document.querySelector('#generate-attention .js-plotly-plot');"
                           " return el && el._fullLayout && (el._fullLayout.title.text || '').includes('pooled'); }",
                           timeout=60_000)
    heat = _plot(page, "generate-attention")
    assert "max-pooled" in heat["title"] and "2048×2048 tokens" in heat["title"]
    assert heat["rows"] <= 512 and heat["cols"] <= 512 and heat["y0"].startswith("0–3 ")
    assert sideways_figures(page) == []  # issue 75, item 4: the pooled map was 1,324 px in a 1,216 px column

    page.get_by_text("Long inputs: pooled tiles and zoom").click()
    panel.get_by_label("queries from").fill("1900")
    panel.get_by_label("queries to").fill("2047")
    panel.get_by_label("keys from").fill("1890")
    panel.get_by_label("keys to").fill("2047")
    panel.get_by_role("button", name="Zoom into the block", exact=True).click()
    page.wait_for_function("() => { const el = document.querySelector('#generate-zoom .js-plotly-plot');"
                           " return el && el._fullData && el._fullData.length; }", timeout=60_000)
    zoom = _plot(page, "generate-zoom")
    assert "zoom: queries 1900–2047 × keys 1890–2047 (full resolution)" in zoom["title"]
    assert (zoom["rows"], zoom["cols"]) == (148, 158) and zoom["y0"].startswith("1900 · ")
    assert any("zoom" in t for t in titles(page))
    screenshot(page, "generate-long-zoom")
    # a click on a pooled tile asks "why" about its block's first cell (tile 300, 100 of 4 × 4 tokens: 1200 → 400)
    click_cell(page, "generate-attention", 300, 100)
    expect(panel).to_contain_text("query 1200", timeout=60_000)
    expect(panel).to_contain_text("→ key 400", timeout=30_000)
    # ... and, a long input's tile, zooms into the 8 × 8 tiles around it
    page.wait_for_function("() => { const el = document.querySelector('#generate-zoom .js-plotly-plot');"
                           " return el && (el._fullLayout.title.text || '').includes('queries 1184–1215'); }",
                           timeout=60_000)
    assert "keys 384–415" in _plot(page, "generate-zoom")["title"]
    # issue 75, item 4: a 401 × 401 block was 2,305 px wide in a 1,192 px column, a label every 4th row (5 px)
    panel.get_by_label("queries from").fill("0")
    panel.get_by_label("queries to").fill("400")
    panel.get_by_label("keys from").fill("0")
    panel.get_by_label("keys to").fill("400")
    panel.get_by_role("button", name="Zoom into the block", exact=True).click()
    page.wait_for_function("() => { const el = document.querySelector('#generate-zoom .js-plotly-plot');"
                           " return el && (el._fullLayout.title.text || '').includes('queries 0–400'); }",
                           timeout=60_000)
    page.wait_for_timeout(500)
    assert sideways_figures(page) == []
    gaps = page.evaluate("""() => { const e = document.querySelector('#generate-zoom .js-plotly-plot');
        return ['y', 'x'].map(a => { const ys = [...e.querySelectorAll('.' + a + 'tick text')]
          .map(t => t.getBoundingClientRect()).map(r => a == 'y' ? r.top : r.right).sort((p, q) => p - q);
          return Math.min(...ys.slice(1).map((v, i) => v - ys[i])); }); }""")
    assert min(gaps) >= 11, gaps  # px between labels on the drawn map (10 px type; a tilted label ends at its tick)
    screenshot(page, "generate-long-zoom-401")
    # the model view of the 2 layers × 4 heads over 2,048 tokens: its subtitle was cut at the figure's 620 px edge
    panel.get_by_label("model view").check()
    page.wait_for_function("() => { const e = document.querySelector('#generate-attention .js-plotly-plot');"
                           " return e && e._fullData && e._fullData[0].meta && e._fullData[0].meta.thumbnails; }",
                           timeout=60_000)
    page.wait_for_timeout(500)
    assert cut_titles(page) == [] and sideways_figures(page) == []
    assert page.js_errors == []


def test_every_heads_statistics_and_an_exact_row_in_the_browser(page) -> None:
    """The "Long context" section over the 2,048 tokens: the layer × head grid of a statistic over every query,
    another statistic drawn on choosing it, one head's exact row with its strongest keys named."""
    panel = _generate_long(page)
    page.get_by_text("Long context: every head over the whole text").click()
    panel.get_by_role("button", name="Statistics of every head", exact=True).click()
    page.wait_for_function("() => { const el = document.querySelector('#generate-long-stats .js-plotly-plot');"
                           " return el && (el._fullLayout.title.text || '').includes('over 2,048 tokens'); }",
                           timeout=60_000)
    grid = _plot(page, "generate-long-stats")
    assert "Sink share per head" in grid["title"] and (grid["rows"], grid["cols"]) == (2, 4)
    panel.get_by_label("entropy").check()
    page.wait_for_function("() => { const el = document.querySelector('#generate-long-stats .js-plotly-plot');"
                           " return el && (el._fullLayout.title.text || '').startsWith('Entropy per head'); }",
                           timeout=60_000)
    panel.get_by_role("combobox", name="head").first.click()
    page.get_by_role("option", name="2", exact=True).click()
    panel.get_by_label("query position (−1: the last)").first.fill("1500")
    panel.get_by_role("button", name="Exact row of the layer and head above", exact=True).click()
    page.wait_for_function("() => { const el = document.querySelector('#generate-row .js-plotly-plot');"
                           " return el && (el._fullLayout.title.text || '').includes('query 1500'); }",
                           timeout=60_000)
    expect(panel).to_contain_text("strongest keys of query 1,500", timeout=30_000)
    screenshot(page, "generate-long-context")
    # the needle search over a 1,024-token haystack: the answer's verdict and every head's retrieval score
    page.get_by_text("Retrieval heads: find the needle in a haystack").click()
    panel.get_by_role("combobox", name="haystack length (tokens)").click()
    page.get_by_role("option", name="1024", exact=True).click()
    panel.get_by_role("button", name="Search the haystack", exact=True).click()
    page.wait_for_function("() => { const el = document.querySelector('#generate-needle-scores .js-plotly-plot');"
                           " return el && (el._fullLayout.title.text || '').includes('Retrieval score per head'); }",
                           timeout=120_000)
    expect(panel).to_contain_text("tangerine-4817", timeout=30_000)
    scores = _plot(page, "generate-needle-scores")
    assert (scores["rows"], scores["cols"]) == (2, 4)
    assert page.js_errors == []


def test_a_2048_token_generation_zoom_and_npz_through_the_api(long_app) -> None:
    from gradio_client import Client

    from bench._long_model import long_prompt
    from tests.test_api import _figure_data

    client = Client(long_app, verbose=False)
    out = client.predict(long_prompt(), 1, "long-llama", api_name="/generate")
    assert "Prompt shortened to its last 2047 tokens" in out[1] and "2,048 tokens" in out[1]
    heat = _figure_data(out[4])[0]
    assert np.asarray(heat["z"]).shape == (512, 512)  # 2,048 tokens in blocks of 4
    block = np.asarray(_figure_data(client.predict(1, "2", 1000, 1099, 950, 1099, "max",
                                                   api_name="/attention_zoom"))[0]["z"])
    npz = client.predict(api_name="/attention_npz")
    with np.load(npz) as arrays:
        attention = arrays["attention"]
    assert attention.dtype == np.float16 and attention.shape == (2, 4, 2048, 2048)
    # the zoom is the store's exact float32 block; the arrays are float16
    np.testing.assert_allclose(block, attention[1, 2, 1000:1100, 950:1100].astype(np.float32), atol=1e-3)
    assert np.abs(block - attention[1, 2, 1000:1100, 950:1100]).max() > 0  # not the float16 numbers
    with pytest.raises(Exception, match="Empty block"):
        client.predict(1, "2", 1099, 1000, 950, 1099, "max", api_name="/attention_zoom")
    lens = _figure_data(client.predict(api_name="/logit_lens"))[0]
    assert np.asarray(lens["z"]).shape == (2, 256)
