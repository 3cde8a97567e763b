"""Models added by configuration (`--model`, ATLAS_MODELS), picked in each of their three tabs in the browser."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from .helpers import figures, open_tab, screenshot, wait_for_plots
from .test_tabs import _panel

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def app_url(configured_app) -> str:
    """The page fixture opens the app started with configured models (tests/conftest.py)."""
    return configured_app[0]


def _names(page) -> set[str]:
    """Every category label and trace name of the drawn figures."""
    out: set[str] = set()
    for fig in figures(page):
        for t in fig:
            for axis in ("x", "y"):
                out.update(v for v in (t[axis] or []) if isinstance(v, str))
    return out


def test_configured_models_in_classify_generate_and_vision(page, tmp_path) -> None:
    from tests.test_vit_hf import photo

    open_tab(page, "Classify")
    _panel(page).get_by_label("my-bert").check()
    _panel(page).get_by_label("text", exact=True).fill("the film is warm and funny .")
    _panel(page).get_by_role("button", name="Classify", exact=True).click()
    # the server's first request: the folder is loaded (and the start-up check of every configured folder may still
    # be reading their headers beside it), so it gets longer than a warm one
    wait_for_plots(page, 3, timeout=180_000)
    expect(page.locator(".atlas-highlight")).to_contain_text("[SEP]", timeout=30_000)
    page.wait_for_function("() => document.body.innerText.includes('neutral')", timeout=30_000)
    assert {"negative", "neutral", "positive"} <= _names(page)  # the folder's own id2label

    open_tab(page, "Generate")
    _panel(page).get_by_role("combobox", name="model").click()
    page.get_by_role("option", name="atlas-test/hub-gpt2", exact=True).click()  # a Hub entry, from the cache
    _panel(page).get_by_label("prompt").fill("the cat sat on")
    _panel(page).get_by_role("button", name="Generate", exact=True).click()
    expect(_panel(page)).to_contain_text("20 new tokens", timeout=30_000)
    wait_for_plots(page, 3)

    path = tmp_path / "photo.png"
    photo(2).save(path)
    open_tab(page, "Vision")
    _panel(page).locator("input[type=file]").set_input_files(str(path))
    page.wait_for_timeout(1000)
    _panel(page).get_by_label("my-vit").check()
    _panel(page).get_by_role("button", name="Classify image", exact=True).click()
    wait_for_plots(page, 5)
    page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')].some(e => e._fullData"
                           " && JSON.stringify(e._fullData.map(t => t.y)).includes('fish'))", timeout=30_000)
    assert {"cat", "dog", "bird", "fish"} & _names(page)
    screenshot(page, "vision-configured")
    assert page.js_errors == []
