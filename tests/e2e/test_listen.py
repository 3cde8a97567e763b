"""The Listen tab in a real browser: an example clip uploaded, transcribed by the real Whisper tiny.en, its word
timings read from the table, the view switched to one head, redrawn from the kept result, the picked word's span
ready to play, the decoder's self-attention shown instead of the encoder's, and the page's link reopening the same
clip and view in a fresh browser."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import open_tab, plot_signature, screenshot, titles, wait_for_change, wait_for_plots, wait_for_title

pytestmark = pytest.mark.e2e
CLIP = Path(__file__).resolve().parents[2] / "examples" / "speech" / "clip1.wav"


def test_listen_uploads_a_clip_and_reads_its_timings(page) -> None:
    open_tab(page, "Listen")
    panel = page.locator("div[role=tabpanel]:visible")
    panel.locator("#listen-upload input[type=file]").set_input_files(str(CLIP))
    page.wait_for_timeout(1000)
    panel.get_by_role("button", name="Transcribe", exact=True).click()
    wait_for_plots(page, 2, timeout=120_000)
    page.wait_for_function("() => document.querySelector('#listen-transcript').innerText.includes('door')",
                           timeout=60_000)
    assert "Please open the door" in page.locator("#listen-transcript").inner_text()
    page.wait_for_function("() => document.querySelector('#listen-timings').innerText.includes('door')",
                           timeout=30_000)
    text = page.locator("#listen-timings").inner_text()
    cells = [c.strip() for c in text.split("end (s)", 1)[1].splitlines() if c.strip()]  # one cell a line
    assert len(cells) % 3 == 0, cells
    table = [cells[i:i + 3] for i in range(0, len(cells), 3)]
    spoken = json.loads(CLIP.with_suffix(".json").read_text())["words"]
    assert [r[0].strip(".").lower() for r in table] == [w["word"] for w in spoken]
    starts = [float(r[1]) for r in table]
    assert starts == sorted(starts) and all(abs(s - w["start"]) < 0.35 for s, w in zip(starts[1:], spoken[1:]))
    assert any("its cross-attention, the alignment heads" in t for t in titles(page))
    before = plot_signature(page)
    panel.get_by_label("one head").check()
    wait_for_change(page, before)
    wait_for_title(page, lambda t: "layer 3, head 0" in t)
    assert page.locator("#listen-word-audio audio, #listen-word-audio [data-testid=waveform-controls]").count() > 0
    wait_for_title(page, lambda t: t.startswith("encoder self-attention, layer 3, head 0"))
    panel.get_by_label("decoder self-attention (tokens)").check()
    wait_for_title(page, lambda t: t.startswith("decoder self-attention, layer 3, head 0"))
    assert page.js_errors == []
    screenshot(page, "listen")
    page.wait_for_function("() => ['tab=listen', 'clip=clip1', 'show=decoder'].every(p => location.search.includes(p))",
                           timeout=30_000)
    url = page.url
    context = page.context.browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        again = context.new_page()
        again.goto(url, wait_until="domcontentloaded")
        again.wait_for_function("() => (document.querySelector('#listen-transcript') || {innerText: ''})"
                                ".innerText.includes('Please open the door')", timeout=120_000)
        wait_for_title(again, lambda t: t.startswith("decoder self-attention, layer 3, head 0"), timeout=60)
        wait_for_title(again, lambda t: "its cross-attention, layer 3, head 0" in t, timeout=60)
        assert "could not be restored" not in again.inner_text("body")
    finally:
        context.close()
