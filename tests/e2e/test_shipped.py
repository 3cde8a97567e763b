"""The app over the shipped checkpoints (checkpoints/, not the tiny random ones): Generate opens on gpt-tiny and
the head roles on repeated random tokens draw the induction stripe, read back from the figure the browser drew;
Vision says when a real photograph is unlike Fashion-MNIST; the trained Swin names its blocks and heads."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from playwright.sync_api import expect

from tests.conftest import app_env, free_port, serving

from .helpers import cut_titles, figures, open_tab, screenshot, wait_for_plots
from .helpers import wait_for_title as _wait_for_title
from .test_tabs import _panel, _set_number

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def app_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`python app.py` as shipped: every model from checkpoints/."""
    with serving(app_env(free_port()), tmp_path_factory.mktemp("shipped") / "server.log") as url:
        yield url


def test_generate_opens_on_gpt_tiny_and_draws_its_induction_stripe(page) -> None:
    open_tab(page, "Generate")
    assert _panel(page).get_by_role("combobox", name="model").input_value() == "gpt-tiny"
    _panel(page).get_by_role("button", name="Generate", exact=True).click()
    wait_for_plots(page, 3, timeout=120_000)
    # it may stop at </s>, and then says so between the count and the strategy
    ended = re.compile(r"new tokens · (stopped at `?</s>`?, the model's end-of-text token · )?greedy")
    expect(_panel(page)).to_contain_text(ended, timeout=60_000)
    _panel(page).get_by_role("button", name="Repeated random tokens").click()
    expect(_panel(page)).to_contain_text("strongest induction", timeout=120_000)
    _wait_for_title(page, lambda t: t.startswith("Induction stripe"), timeout=60)
    summary = _panel(page).inner_text()
    score = float(re.search(r"strongest induction: layer \d+ head \d+ \(([\d.]+)\)", summary).group(1))
    assert score >= 0.5, summary
    # the stripe as drawn: from each token of the second copy to the one after its first occurrence (N = 50)
    stripes = [f for f in figures(page) if any(t["type"] == "heatmap" and t["z"] and len(t["z"]) == 101 for t in f)]
    z = np.array([t for t in stripes[-1] if t["type"] == "heatmap"][0]["z"], dtype=float)
    n = 50
    i = np.arange(n + 1, 2 * n + 1)
    assert z[i, i - n + 1].mean() >= 0.5 and z[i, i - n + 1].mean() > 5 * z[i, i - n].mean()
    screenshot(page, "generate-gpt-tiny")
    assert page.js_errors == []


def test_vision_shows_the_upload_and_says_when_a_photo_is_unlike_fashion_mnist(page) -> None:
    """A photograph that a package ships (scikit-image's cat), not one the project drew: the upload shows as a
    picture beside what the model will see, the answer comes with the unusual-input notice, and the bars are
    calibrated. A Fashion-MNIST example gets no notice."""
    import skimage

    photo = Path(skimage.__file__).parent / "data" / "chelsea.png"
    open_tab(page, "Vision")
    panel = _panel(page)
    panel.locator("input[type=file]").set_input_files(str(photo))
    expect(page.locator("#vision-upload img")).to_be_visible(timeout=30_000)
    expect(page.locator("#vision-will-see img")).to_be_visible(timeout=30_000)
    panel.get_by_role("button", name="Classify image", exact=True).click()
    expect(panel).to_contain_text("This image looks unlike Fashion-MNIST", timeout=120_000)
    _wait_for_title(page, lambda t: t.startswith("Top classes (calibrated"), timeout=60)
    screenshot(page, "vision-photo")
    cat = page.locator("#vision-will-see img").get_attribute("src")
    panel.get_by_role("button", name="8-bag-t10k-18.png").click()
    page.wait_for_function("(old) => { const img = document.querySelector('#vision-will-see img');"
                           " return img && img.getAttribute('src') !== old; }", arg=cat, timeout=30_000)
    panel.get_by_role("button", name="Classify image", exact=True).click()
    expect(panel).not_to_contain_text("looks unlike Fashion-MNIST", timeout=120_000)
    _wait_for_title(page, lambda t: t.startswith("Deletion curve"), timeout=120)
    page.set_viewport_size({"width": 1024, "height": 1000})  # a laptop: no title runs past its figure
    deadline = time.monotonic() + 15
    while cut_titles(page) and time.monotonic() < deadline:
        page.wait_for_timeout(250)
    assert cut_titles(page) == []
    assert page.js_errors == []


def test_trained_swin_says_why_block_3_does_not_shift_and_offers_its_heads(page) -> None:
    open_tab(page, "Swin windows")
    panel = _panel(page)
    _set_number(page, "block (odd blocks shift, where the grid holds more than one window)", 3)
    panel.get_by_role("button", name="Show the trained Swin").click()
    expect(panel).to_contain_text("fits in one 7×7 window, so there is nothing to shift", timeout=120_000)
    head = panel.get_by_label("number input for head")
    expect(head).to_have_attribute("max", "3")  # block 3 (stage 1) has 4 heads
    _set_number(page, "block (odd blocks shift, where the grid holds more than one window)", 0)
    expect(head).to_have_attribute("max", "1", timeout=30_000)  # block 0 has 2
    assert page.js_errors == []
