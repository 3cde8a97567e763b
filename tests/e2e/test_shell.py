"""The app shell in a real browser: every tab opens, the playground draws and redraws its figures."""

from __future__ import annotations

import time

import pytest

from .helpers import figures, open_tab, plot_signature, screenshot, wait_for_change, wait_for_plots

pytestmark = pytest.mark.e2e

import app  # noqa: E402

TABS = [tab.TITLE for tab in app.TABS]  # every tab the app lists, a new one included


def test_every_tab_opens_without_errors(page) -> None:
    for name in TABS:
        open_tab(page, name)
        page.wait_for_timeout(300)
        body = page.inner_text("body")
        assert "Traceback" not in body
        screenshot(page, f"tab-{name.lower().replace(' ', '-')}")
    assert page.js_errors == []


def test_playground_draws_and_redraws(page) -> None:
    open_tab(page, "Attention playground")
    wait_for_plots(page, 2)
    steps = next(f for f in figures(page) if len(f) == 8)
    assert [t["type"] for t in steps] == ["heatmap"] * 8  # Q, K, V, output, QKᵀ, scaled, masked, softmax
    assert len(steps[7]["z"]) == 6  # default: 6 tokens
    before = plot_signature(page)
    page.get_by_label("causal").check()
    wait_for_change(page, before)
    deadline = time.monotonic() + 30  # the redraw may land in more than one step
    while True:
        weights = next(f for f in figures(page) if len(f) == 8)[7]["z"]
        if weights[0][0] == pytest.approx(1.0) or time.monotonic() > deadline:
            break
        page.wait_for_timeout(200)
    # Causal mask: query 0 may only attend to key 0, every row sums to 1.
    assert weights[0][0] == pytest.approx(1.0)
    assert all(w == 0 for w in weights[0][1:])
    for row in weights:
        assert sum(row) == pytest.approx(1.0, abs=5e-3)
    screenshot(page, "playground-causal")
    assert page.js_errors == []


def test_entropy_chart_marks_d_k_where_the_axis_has_it(page) -> None:
    """The dashed d_k line and its label sit at d_k on the log axis (they once sat at log10(d_k): 8 left of 1)."""
    open_tab(page, "Attention playground")
    wait_for_plots(page, 2)
    for _ in range(100):  # the page-load draw lands asynchronously
        where = page.evaluate("""() => { const el = [...document.querySelectorAll('.js-plotly-plot')]
              .find(e => e.offsetParent && (e._fullLayout.shapes || []).length);
            if (!el) return null;
            const xa = el._fullLayout.xaxis, line = el.querySelector('.shapelayer path').getBoundingClientRect();
            const label = el.querySelector('.annotation').getBoundingClientRect(), box = el.getBoundingClientRect();
            return {line: line.left - box.left, label: label.right - box.left, want: xa._offset + xa.d2p(8)}; }""")
        if where:
            break
        page.wait_for_timeout(100)
    assert where and abs(where["line"] - where["want"]) < 3 and abs(where["label"] - where["want"]) < 12, where
