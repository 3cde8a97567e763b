"""Controls that apply to the chosen model only, in a real browser (issue 61, item 9): Generate's head choice, head
switch-off, head roles and Experts view follow the model; a model-view thumbnail opens its head; the Swin windows
slider offers the grid's windows and its Draw button stands above the figures it draws."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from .helpers import open_tab, screenshot, titles, wait_for_plots

pytestmark = pytest.mark.e2e


def _panel(page):
    return page.locator("div[role=tabpanel]:visible")


def _choose_model(page, name: str) -> None:
    _panel(page).get_by_label("model", exact=True).click()
    page.get_by_role("option", name=name, exact=True).click()


def _heads_controls(page) -> dict[str, bool]:
    panel = _panel(page)
    return {"head": panel.get_by_label("head (or fusion of heads)").is_visible(),
            "ablate": panel.get_by_role("button", name="Switch the head off").is_visible(),
            "roles": panel.get_by_role("button", name="Repeated random tokens").is_visible(),
            "experts": panel.get_by_role("button", name="Experts chosen per token (this model is a mixture of "
                                                        "experts)").is_visible()}


def test_generate_shows_the_controls_the_model_has(page) -> None:
    """mamba-tiny has no heads: no head choice, switch-off or head roles; gpt-tiny has them; neither has experts (the
    Experts view is never on screen for them: it gave a red Error)."""
    open_tab(page, "Generate")
    expect(_panel(page).get_by_role("button", name="Switch the head off")).to_be_visible(timeout=30_000)
    assert _heads_controls(page) == {"head": True, "ablate": True, "roles": True, "experts": False}
    _choose_model(page, "mamba-tiny")
    expect(_panel(page).get_by_role("button", name="Switch the head off")).to_be_hidden(timeout=30_000)
    assert _heads_controls(page) == {"head": False, "ablate": False, "roles": False, "experts": False}
    _panel(page).get_by_role("button", name="Generate", exact=True).click()
    wait_for_plots(page, 2)
    page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')].some(e => e.offsetParent "
                           "&& ((e._fullLayout.title || {}).text || '').startsWith('Implicit attention'))",
                           timeout=60_000)
    implicit = next(t for t in titles(page) if t.startswith("Implicit attention"))
    assert "heads" not in implicit  # one map per layer: no "mean of heads"
    assert _heads_controls(page)["head"] is False
    screenshot(page, "generate-mamba-controls")
    _choose_model(page, "gpt-tiny")
    expect(_panel(page).get_by_role("button", name="Switch the head off")).to_be_visible(timeout=30_000)
    assert _heads_controls(page) == {"head": True, "ablate": True, "roles": True, "experts": False}
    assert page.js_errors == []


def test_a_model_view_thumbnail_opens_its_head(page) -> None:
    """A click on the thumbnail of layer 1, head 2 shows that head's heatmap (it gave an Error); the model view's
    colour bar reads 0–1 as the heatmaps' do."""
    open_tab(page, "Generate")
    _panel(page).get_by_role("button", name="Generate", exact=True).click()
    wait_for_plots(page, 3)
    _panel(page).get_by_label("model view").check()
    page.wait_for_function("() => { const e = document.querySelector('#generate-attention .js-plotly-plot'); "
                           "return e && e._fullData && e._fullData[0].meta && e._fullData[0].meta.thumbnails; }",
                           timeout=30_000)
    ticks = page.evaluate("() => document.querySelector('#generate-attention .js-plotly-plot')._fullData[0]"
                          ".colorbar.ticktext")
    assert ticks[0] == "0" and ticks[-1] == "1"
    at = page.evaluate("""() => { const e = document.querySelector('#generate-attention .js-plotly-plot');
        const [q, k, gap] = e._fullData[0].meta.thumbnails; const xa = e._fullLayout.xaxis, ya = e._fullLayout.yaxis;
        const r = e.getBoundingClientRect();
        const row = 1 * (q + gap) + Math.floor(q / 2), col = 2 * (k + gap) + Math.floor(k / 2);
        return {x: r.left + xa._offset + xa.l2p(col), y: r.top + ya._offset + ya.l2p(row)}; }""")
    page.mouse.click(at["x"], at["y"])
    page.wait_for_function("() => ((document.querySelector('#generate-attention .js-plotly-plot')._fullLayout.title"
                           " || {}).text || '').includes('layer 1 · head 2')", timeout=30_000)
    assert _panel(page).get_by_label("heatmap").is_checked()
    assert page.locator(".toast-body:visible").count() == 0
    assert page.js_errors == []


def test_swin_slider_offers_the_grid_s_windows_and_draw_stands_above(page) -> None:
    """At load the window slider runs over the default grid's 4 windows (0 … 3, it ran to 63 and clamped), follows a
    new window size, and the Draw button stands above the figures it redraws."""
    open_tab(page, "Swin windows")
    wait_for_plots(page, 5)
    index = _panel(page).get_by_label("range slider for window to inspect")
    assert index.get_attribute("max") == "3"
    box = _panel(page).get_by_label("number input for window size")
    box.fill("2")
    box.press("Enter")
    expect(index).to_have_attribute("max", "15", timeout=30_000)
    draw = _panel(page).get_by_role("button", name="Draw windows").bounding_box()
    first = page.locator(".js-plotly-plot:visible").first.bounding_box()
    assert draw["y"] + draw["height"] <= first["y"]
    screenshot(page, "swin-windows-controls")
    assert page.js_errors == []
