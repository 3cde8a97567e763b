"""The Generate tab over the shipped checkpoints (checkpoints/, not the tiny random ones): it opens on
gpt-tiny, and the head roles on repeated random tokens draw the induction stripe, read back from the figure the
browser drew."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pytest
from playwright.sync_api import expect

from tests.conftest import app_env, free_port, serving

from .helpers import figures, open_tab, screenshot, wait_for_plots
from .test_tabs import _panel, _wait_for_title

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
