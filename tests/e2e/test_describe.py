"""The Image + text tab in a real browser (issue 63): an example scene answered, a word replayed, a patch of the tower
clicked, and the view's link reopened in a fresh page with the same figures. The server runs the tiny test
checkpoints (a random vlm-fashion of 2 layers, 2 heads, 64×64 scenes in 8-pixel patches)."""

from __future__ import annotations

import time

import pytest

from .helpers import (
    figures,
    open_tab,
    plot_signature,
    screenshot,
    sideways_figures,
    titles,
    wait_for_change,
    wait_for_plots,
)
from .test_permalink import _expect_tab, _link, assert_linked_view_first, opened  # noqa: F401 (a fixture)

pytestmark = pytest.mark.e2e


def _panel(page):
    return page.locator("div[role=tabpanel]:visible")


def _wait_for_title(page, wanted, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not any(wanted(t) for t in titles(page)) and time.monotonic() < deadline:
        page.wait_for_timeout(250)
    assert any(wanted(t) for t in titles(page)), titles(page)


def _stale_urls(page) -> list[str]:
    """url(...#id) references in the drawn figures (colour-bar gradients, clip paths) that do not point at the page's
    present address: Chromium does not resolve them, and the colour bars drew blank after a link rewrote the
    address."""
    return page.evaluate("""() => { const here = location.href.split('#')[0];
        return [...document.querySelectorAll('.js-plotly-plot [style*="url("], .js-plotly-plot [clip-path*="url("]')]
          .flatMap(e => [e.getAttribute('style') || '', e.getAttribute('clip-path') || ''])
          .flatMap(v => [...v.matchAll(/url\\(['"]?([^#'")]*)#/g)].map(m => m[1]))
          .filter(u => u && u !== here); }""")


def test_image_and_text_answers_replays_and_its_link_reopens(page, opened) -> None:  # noqa: F811
    open_tab(page, "Image + text")
    panel = _panel(page)
    panel.get_by_text("scene_008.png").click()
    page.wait_for_timeout(1000)
    panel.get_by_role("button", name="Answer", exact=True).click()
    wait_for_plots(page, 7, timeout=120_000)
    _wait_for_title(page, lambda t: "→ image" in t and t.startswith("the position choosing"))
    assert any(t.startswith("Relevance of") for t in titles(page))
    assert any(t.startswith("Logit lens on the image tokens") for t in titles(page))
    # replay: the second generated word (the number box of the slider), redrawn from the kept answer
    before = plot_signature(page)
    box = panel.get_by_label("number input for generated word (replay: move to see each in turn)")
    box.fill("2")
    box.press("Enter")
    wait_for_change(page, before)
    # a click on the image the model saw: the tower's attention from that patch (64 pixels, 8×8 patches)
    page.locator("#describe-seen").scroll_into_view_if_needed()  # its <img> loads lazily, once near the view
    seen = page.locator("#describe-seen img")
    seen.wait_for(timeout=30_000)
    size = seen.bounding_box()
    seen.click(position={"x": size["width"] * 0.1, "y": size["height"] * 0.9})
    _wait_for_title(page, lambda t: "patch r7c0 → patches" in t)
    screenshot(page, "image-and-text")
    # issue 75, item 4: at 1400 px the logit lens grid (638 px) and the tower's patch map (620 px) scrolled sideways
    # in their 600 px half columns
    page.wait_for_timeout(500)
    assert sideways_figures(page) == []
    assert _stale_urls(page) == []
    url = _link(page, "tab=describe", "image=scene_008", "step=2", "patch=7%2C0")
    expected = figures(page)

    again = opened(url)
    _expect_tab(again, "Image + text")
    assert_linked_view_first(again, expected)
    assert page.js_errors == [] and again.js_errors == []
