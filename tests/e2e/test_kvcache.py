"""Generate's "Compress the cache" in the browser (issue 72): a press and a ratio chosen as a person would, both
answers and the kept/evicted mask read from the page and checked against the same compression made here
(models/decoding/compress.py over the same tiny checkpoint), a layer picked, and the measured accuracy-against-ratio
figure drawn from the bench's committed results (docs/kv-compression.json)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from playwright.sync_api import expect

from serving import catalogue, store

from .helpers import open_tab, screenshot, wait_for_title
from .test_tabs import _panel

pytestmark = pytest.mark.e2e
# shorter than the panel's example: the tiny checkpoint's tokenizer spends about 2.5 tokens a word of its 128 positions
CONTEXT = "The secret word is apple. Two dogs play in the snow. A woman is reading a book in the park."


def _figure(page, elem_id: str) -> dict:
    return page.evaluate("""(id) => { const el = document.querySelector('#' + id + ' .js-plotly-plot');
        const d = el._fullData;
        return {title: el._fullLayout.title.text, traces: d.length, names: d.map(t => t.name),
                z: d[0].z ? Array.from(d[0].z, r => Array.from(r)) : null, y: d[0].y ? Array.from(d[0].y) : null}; }""",
                         elem_id)


def test_compress_a_cache_and_read_both_answers_and_the_mask(page, tiny_checkpoints, monkeypatch) -> None:
    from models.decoding import compress as C
    from tabs.sections import kvcache

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    net = store.get_model(catalogue.GPT_TINY)  # the tab's default model, the server's own tiny checkpoint
    want = C.compare(net, CONTEXT, kvcache.EXAMPLE_QUESTION,
                     C.Press("streaming_llm", 0.75, window=8), max_new_tokens=6)

    open_tab(page, "Generate")
    panel = _panel(page)
    panel.get_by_label("number input for new tokens").fill("6")
    panel.get_by_label("number input for new tokens").press("Enter")
    page.get_by_text("Compress the cache (KV-cache presses)").click()
    kv = page.locator("#generate-kv")
    kv.get_by_label("context (compressed)").fill(CONTEXT)
    kv.get_by_role("combobox", name="press").click()
    page.get_by_role("option", name="StreamingLLM (sinks + recent)", exact=True).click()
    ratio = kv.get_by_label("number input for compression ratio (share removed)")
    ratio.fill("0.75")
    ratio.press("Enter")
    kv.get_by_role("button", name="Compress and answer").click()
    note = page.locator("#generate-kv-note")
    expect(note).to_contain_text("StreamingLLM (sinks + recent)", timeout=60_000)
    expect(note).to_contain_text("at ratio 0.75")

    answers = page.locator("#generate-kv-answers")
    full = answers.locator("[data-arm=full]").inner_text()
    cut = answers.locator("[data-arm=compressed]").inner_text()
    n = len(want.full.steps)
    full_new = "".join(want.full.tokens[len(want.full.ids) - n:])
    cut_new = "".join(want.compressed.tokens[len(want.compressed.ids) - len(want.compressed.steps):])
    assert full.startswith("full cache") and cut.startswith("compressed cache")
    assert full.split("\n", 1)[1].strip() == full_new.strip() and cut.split("\n", 1)[1].strip() == cut_new.strip()
    verdict = "the same answer" if want.parted is None else f"they part at step {want.parted}"
    expect(answers).to_contain_text(verdict)

    wait_for_title(page, lambda t: t.startswith("Kept and evicted positions · every layer"))
    mask = _figure(page, "generate-kv-mask")
    np.testing.assert_allclose(np.array(mask["z"]), want.kept.mask.mean(1), atol=1e-6)
    assert mask["y"] == [f"L{i}" for i in range(want.kept.mask.shape[0])]
    kept = want.kept.mask[0, 0]  # StreamingLLM: the 4 sinks and the most recent quarter, the rest evicted
    t = kept.size
    assert kept[:4].all() and kept[-(int(t * 0.25) - 4):].all() and not kept[4:t - int(t * 0.25)].any()
    shaded = page.locator("#generate-kv-text")
    expect(shaded).to_contain_text(f"of {want.kept.mask.shape[0] * want.kept.mask.shape[1]}")

    kv.get_by_role("combobox", name="kept by").click()
    page.get_by_role("option", name="layer 1", exact=True).click()
    wait_for_title(page, lambda t: "layer 1, each key-value head" in t)
    one = _figure(page, "generate-kv-mask")
    np.testing.assert_array_equal(np.array(one["z"]), want.kept.mask[1].astype(float))
    screenshot(page, "generate-kv")

    page.get_by_text("Measured: accuracy against the compression ratio").click()
    results = json.loads(kvcache.MEASURED.read_text(encoding="utf-8"))
    first = next(iter(kvcache.measured()))
    wait_for_title(page, lambda t: t.startswith(f"{first}: accuracy against the compression ratio"))
    curves = _figure(page, "generate-kv-measured-plot")
    entry = results["models"]["smollm2"]["tasks"]["needle"]
    assert curves["traces"] == len({r["kvpress"] for r in entry["rows"]}) == 7
    expect(page.locator("#generate-kv-measured-note")).to_contain_text("python bench/kv_compression.py")
    other = [c for c in kvcache.measured() if c != first][0]
    page.locator("#generate-kv-measured-choice").get_by_label(other).check()
    wait_for_title(page, lambda t: t.startswith(f"{other}: accuracy"))
    screenshot(page, "generate-kv-measured")
    assert page.js_errors == []
