"""The Heads tab in a real browser, as a person uses it: score every head, switch the metric, open a head's card,
compare two models, and open a permalink to a head in a fresh page (tiny test checkpoints: gpt-tiny has 2 layers
of 4 heads there)."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
from playwright.sync_api import expect

from .helpers import click_cell, figures, open_tab, plot_signature, screenshot, titles, wait_for_change, wait_for_plots

pytestmark = pytest.mark.e2e


def _panel(page):
    return page.locator("div[role=tabpanel]:visible")


def _grid(page) -> list:
    return next(f for f in figures(page) if f[0]["type"] == "heatmap")[0]["z"]


def test_heads_tab_grid_metric_card_and_compare(page) -> None:
    open_tab(page, "Heads")
    panel = _panel(page)
    panel.get_by_role("button", name="Score every head").click()
    wait_for_plots(page, 5, timeout=120_000)  # grid, finder, by layer, the card's example and offsets
    expect(panel).to_contain_text("2 layers × 4 heads", timeout=60_000)
    # the card starts on the head the finder ranks first
    top = page.evaluate("() => document.querySelector('#heads-finder .js-plotly-plot').data[0].customdata[0]")
    expect(page.locator("#heads-card")).to_contain_text(f"layer {top[0]} · head {top[1]}", timeout=60_000)
    assert len(_grid(page)) == 2 and len(_grid(page)[0]) == 4
    before = plot_signature(page)
    panel.get_by_label("metric").click()
    page.get_by_role("option", name="induction", exact=True).click()
    wait_for_change(page, before)
    page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')].some(e => e._fullLayout && "
                           "(e._fullLayout.title.text || '').startsWith('Induction per head'))", timeout=60_000)
    assert any(t.startswith("Induction per head") for t in titles(page)), titles(page)
    card = page.locator("#heads-card")
    expect(card.locator("strong").filter(has_text="induction").first).to_be_visible(timeout=60_000)
    layer = panel.get_by_label("number input for layer", exact=True)
    head = panel.get_by_label("number input for head", exact=True)
    head.fill("3")
    head.press("Enter")
    expect(card).to_contain_text(f"layer {layer.input_value()} · head 3", timeout=60_000)
    # issue 75, item 5: a click on a grid cell, then on a finder bar, opens that head's card
    click_cell(page, "heads-grid", 1, 2)
    expect(card).to_contain_text("layer 1 · head 2", timeout=60_000)
    assert (layer.input_value(), head.input_value()) == ("1", "2")
    bars = page.locator("#heads-finder .js-plotly-plot .bars .point path")
    third = page.evaluate("() => document.querySelector('#heads-finder .js-plotly-plot').data[0].customdata[2]")
    bars.nth(2).scroll_into_view_if_needed()
    box = bars.nth(2).bounding_box()  # Plotly's drag layer lies over the bars: a click at the bar's place
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    expect(card).to_contain_text(f"layer {third[0]} · head {third[1]}", timeout=60_000)
    panel.get_by_label("other model").click()
    page.get_by_role("option", name="mamba-tiny", exact=True).click()
    panel.get_by_role("button", name="Compare the grids").click()
    expect(panel).to_contain_text("mamba-tiny best", timeout=120_000)
    screenshot(page, "heads")
    assert page.js_errors == []


def test_heads_permalink_opens_the_head(page, app_url: str) -> None:
    url = app_url + "?" + urlencode({"tab": "heads", "model": "sst2", "metric": "first", "layer": 1, "head": 2})
    page.goto(url, wait_until="domcontentloaded")
    card = page.locator("#heads-card")
    expect(card).to_contain_text("sst2 · layer 1 · head 2", timeout=120_000)
    expect(card.locator("strong").filter(has_text="to [CLS] / first").first).to_be_visible()
    page.wait_for_function("() => ['model=sst2', 'layer=1', 'head=2'].every(p => location.search.includes(p))",
                           timeout=60_000)  # the address bar is written by an event after the run
    # a head the model does not have falls back with a notice naming the key
    page.goto(app_url + "?" + urlencode({"tab": "heads", "model": "sst2", "layer": 1, "head": 9}),
              wait_until="domcontentloaded")
    expect(page.locator(".notice").first).to_contain_text("head is not allowed here", timeout=120_000)
    assert page.js_errors == []
