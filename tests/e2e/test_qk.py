"""The Q/K scatter section (tabs/sections/qk.py) in a real browser, in each text tab: run the tab, open the section,
and the figure shows both point sets, follows the head, and a click on a point rings that query."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from .helpers import figures, generate_in_tab, open_tab, plot_signature, screenshot, titles, wait_for_change

pytestmark = pytest.mark.e2e
SECTION = "Queries and keys of one head (Q/K scatter)"


def _scatter(page) -> tuple[str, list[dict]]:
    """The drawn Q/K figure: its title and traces."""
    return next((t, f) for f, t in zip(figures(page), titles(page)) if t.startswith("Queries and keys"))


def _wait_for_scatter(page, wanted=lambda t: True) -> None:
    page.wait_for_function("""() => [...document.querySelectorAll('[id$="-qk"] .js-plotly-plot')]
        .some(e => e.offsetParent !== null && e._fullData && e._fullLayout.title
                   && e._fullLayout.title.text.startsWith('Queries and keys'))""", timeout=60_000)
    page.wait_for_timeout(200)
    assert wanted(_scatter(page)[0]), _scatter(page)[0]


def _open_and_check(page, tab: str, tokens: int | None = None) -> list[dict]:
    """Open the section (which draws), check both point sets, then move to head 1 and see the figure change."""
    section = page.locator(f"#{tab}-qk-section")
    section.get_by_text(SECTION).click()
    _wait_for_scatter(page)
    title, traces = _scatter(page)
    by_name = {t["name"]: t for t in traces}
    queries, keys = by_name["queries"], by_name["keys"]
    assert len(queries["x"]) == len(keys["x"]) > 1 and queries["text"][0].startswith("0 · ")
    if tokens is not None:
        assert len(queries["x"]) == tokens
    assert any(name.startswith("→ ") for name in by_name), by_name.keys()  # lines to the strongest keys
    before = plot_signature(page)
    head = section.get_by_label(re.compile(r"^head"))
    head.fill("1")
    wait_for_change(page, before)
    _wait_for_scatter(page, lambda t: "head 1" in t)
    return _scatter(page)[1]


def _click_point(page, tab: str, trace: str, index: int) -> None:
    """Click point ``index`` of the named trace, placed by Plotly's own axes."""
    box = page.locator(f"#{tab}-qk .js-plotly-plot").first
    box.scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    x, y = page.evaluate("""([id, name, i]) => {
        const el = document.querySelector('#' + id + ' .js-plotly-plot');
        const t = el._fullData.find(d => d.name === name);
        const xa = el._fullLayout.xaxis, ya = el._fullLayout.yaxis, r = el.getBoundingClientRect();
        return [r.left + xa._offset + xa.l2p(t.x[i]), r.top + ya._offset + ya.l2p(t.y[i])]; }""",
                         [f"{tab}-qk", trace, index])
    page.mouse.click(x, y)


def test_generate_qk_scatter(page) -> None:
    generate_in_tab(page)
    traces = _open_and_check(page, "generate")
    n = len(next(t for t in traces if t["name"] == "queries")["x"])
    assert any(t["name"].startswith(f"query {n - 1} · ") for t in traces)  # the last query is ringed by default
    before = plot_signature(page)
    _click_point(page, "generate", "queries", 2)
    wait_for_change(page, before)
    page.wait_for_function("""() => [...document.querySelectorAll('#generate-qk .js-plotly-plot')]
        .some(e => e._fullData.some(t => (t.name || '').startsWith('query 2 · ')))""", timeout=30_000)
    expect(page.locator("#generate-qk-section")).to_contain_text("Query 2", timeout=30_000)
    screenshot(page, "generate-qk")
    assert page.js_errors == []


def test_classify_and_translate_qk_scatter(page) -> None:
    open_tab(page, "Classify")
    panel = page.locator("div[role=tabpanel]:visible")
    panel.get_by_label("text", exact=True).fill("a warm , funny film .")
    panel.get_by_role("button", name="Classify", exact=True).click()
    expect(panel).to_contain_text("%", timeout=60_000)
    _open_and_check(page, "classify")
    open_tab(page, "Translate")
    panel = page.locator("div[role=tabpanel]:visible")
    panel.get_by_label("English sentence").fill("Two dogs are running on the beach.")
    panel.get_by_role("button", name="Translate", exact=True).click()
    expect(panel).to_contain_text("Beam size", timeout=60_000)
    _open_and_check(page, "translate")
    assert page.js_errors == []
