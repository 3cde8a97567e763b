"""Permalinks and figure export in a real browser. A view built by clicking writes itself into the URL; that URL,
opened in a fresh page as someone the link was sent to would, shows the same figures (the traces Plotly drew, read
back from both pages), and no other view before them (``assert_linked_view_first``, every tab's link test). A
hostile URL shows the defaults and a notice; every figure downloads as SVG and PNG.

The server runs the tiny test checkpoints (tests/conftest.py's app_url): their decoder has 2 layers of 4 heads, so
"Generate at layer 3, head 7" of the shipped gpt-tiny (4 layers × 8 heads) becomes its last layer (1) and last
head (3) here, the same view of a smaller model."""

from __future__ import annotations

import re
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest
from playwright.sync_api import expect

from serving import catalogue, store
from tabs.generate import PROMPTS

from .helpers import figures, generate_in_tab, open_tab, plot_signature, titles, wait_for_plots

pytestmark = pytest.mark.e2e


def _panel(page):
    return page.locator("div[role=tabpanel]:visible")


def _pick(page, label: str, option: str) -> None:
    _panel(page).get_by_label(label).click()
    page.get_by_role("option", name=option, exact=True).click()


def _wait_for_title(page, prefix: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not any(t.startswith(prefix) for t in titles(page)) and time.monotonic() < deadline:
        page.wait_for_timeout(250)
    assert any(t.startswith(prefix) for t in titles(page)), titles(page)


def _link(page, *parts: str, timeout: float = 30) -> str:
    """The page's URL once it holds every part (the query is written by an event after each change), and the
    figures have stopped changing."""
    page.wait_for_function("(parts) => parts.every(p => location.search.includes(p))", arg=list(parts),
                           timeout=timeout * 1000)
    before = ""
    while before != (now := plot_signature(page)):
        before = now
        page.wait_for_timeout(1000)
    return page.url


# Records, from the page's first script on, each drawn figure's titles as they change (figure number -> titles in
# the order drawn; a figure's title is its layout title, else its first annotation, as ``helpers.titles`` reads it),
# so a test can tell whether the linked view was the first one drawn (issue 61, item 5). ``__atlasNow`` reads the
# titles the page's figures show at the moment it is called, by the same rule.
RECORDER = """(() => {
  const ids = new WeakMap(); let next = 0; window.__atlasDrawn = {};
  const drawn = () => [...document.querySelectorAll('div[role=tabpanel] .js-plotly-plot')].filter(e =>
    e.offsetParent !== null && e._fullLayout && e.querySelector('.main-svg .subplot, .main-svg .trace'));
  const title = (e) => (e._fullLayout.title && e._fullLayout.title.text)
    || ((e._fullLayout.annotations || [])[0] || {}).text || '';
  window.__atlasNow = () => drawn().map(title);
  setInterval(() => {
    for (const e of drawn()) {
      if (!ids.has(e)) ids.set(e, next++);
      const seen = (window.__atlasDrawn[ids.get(e)] ||= []);
      const t = title(e);
      if (seen[seen.length - 1] !== t) seen.push(t);
    }
  }, 20);
})();"""


def drawn_so_far(page) -> tuple[dict[str, list[str]], list[str]]:
    """What the recorder saw up to this moment (figure number -> its titles in the order drawn) and the titles the
    page's figures show now, read in one go."""
    return page.evaluate("() => [window.__atlasDrawn || {}, window.__atlasNow ? window.__atlasNow() : []]")


def stray_views(record: tuple[dict[str, list[str]], list[str]]) -> list[str]:
    """The titles a figure of the page showed before the one it shows now: the views drawn before the linked one."""
    drawn, _ = record
    return [t for shown in drawn.values() for t in shown[:-1]]


def gone_views(record: tuple[dict[str, list[str]], list[str]]) -> list[str]:
    """The titles drawn at some moment that no figure shows now: a view drawn before the linked one in a figure that
    Gradio then replaced with a new element (the Heads card's example and offsets are), which ``stray_views``, reading
    each element's own history, does not see."""
    drawn, now = record
    showing = set(now)
    return [t for shown in drawn.values() for t in shown if t and t not in showing]


def assert_linked_view_first(page, expected: list) -> None:
    """The linked page draws ``expected`` (the figures of the page the link was copied from) and, up to the moment it
    does, no other view: no figure showed another title first (``stray_views``) and no title was drawn that the
    linked view does not show (``gone_views``: a figure replaced by a new element). The record is read once, when
    the linked view is complete, so what a test clicks afterwards is not counted."""
    _same_figures(page, expected)
    record = drawn_so_far(page)
    drawn_first = {"stray": stray_views(record), "gone": gone_views(record)}
    deadline = time.monotonic() + 20
    while drawn_first["gone"] and not drawn_first["stray"] and time.monotonic() < deadline:
        # a linked view redrawn as it is (the link's controls set after the run): read again once it is drawn; a
        # view drawn before the linked one stays gone
        page.wait_for_timeout(500)
        _same_figures(page, expected)
        record = drawn_so_far(page)
        drawn_first = {"stray": stray_views(record), "gone": gone_views(record)}
    assert drawn_first == {"stray": [], "gone": []}, record


@pytest.fixture()
def opened(browser):
    """Open a URL in a fresh browser context (nothing shared with the page that made the link), recording what each
    figure draws from the first moment (``assert_linked_view_first`` reads it)."""
    contexts = []

    def open_url(url: str):
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.add_init_script(RECORDER)
        contexts.append(context)
        page = context.new_page()
        page.js_errors = []
        page.on("pageerror", lambda exc: page.js_errors.append(str(exc)))
        page.goto(url, wait_until="domcontentloaded")
        page.wait_for_selector("button[role=tab]", timeout=60_000)
        return page

    yield open_url
    for context in contexts:
        context.close()


def _same_figures(page, expected: list, timeout: float = 90) -> None:
    """Wait until the page's drawn figures are exactly ``expected`` (they land one event at a time)."""
    deadline = time.monotonic() + timeout
    while figures(page) != expected and time.monotonic() < deadline:
        page.wait_for_timeout(300)
    assert titles(page) and figures(page) == expected, titles(page)


def _expect_tab(page, name: str) -> None:
    expect(page.get_by_role("tab", name=name, exact=True)).to_have_attribute("aria-selected", "true", timeout=30_000)


def test_generate_link_restores_layer_head_and_replay_step(page, opened) -> None:
    generate_in_tab(page)
    panel = _panel(page)
    _pick(page, "head (or fusion of heads)", "3")  # the last head of the tiny decoder (see the module docstring)
    box = panel.get_by_label("number input for replay: show the tokens up to generated token (0 = all)")
    box.fill("3")
    box.press("Enter")
    _wait_for_title(page, "Decoder self-attention (causal) · up to token")
    url = _link(page, "tab=generate", "layer=1", "head=3", "step=3", "text=Two")
    expected, shown = figures(page), page.locator(".atlas-generation").inner_text()
    assert any("layer 1 · head 3" in t for t in titles(page)), titles(page)

    again = opened(url)
    _expect_tab(again, "Generate")
    assert_linked_view_first(again, expected)  # the linked layer, head and replay step are the first view drawn
    assert again.locator(".atlas-generation").inner_text() == shown
    assert _panel(again).get_by_label("prompt").input_value() == "Two dogs are running on the"
    # the restored view writes the same link (once the link's controls are set after the run, which drew the view)
    again.wait_for_function("(url) => location.href === url", arg=url, timeout=30_000)
    assert page.js_errors == [] and again.js_errors == []


@pytest.mark.parametrize("tab,button", [("Translate", "Translate"), ("Generate", "Generate")])
def test_a_layer_zero_link_reopens_at_layer_zero(page, opened, tab: str, button: str) -> None:
    """Issue 61, item 5: layer 0 was never written into the address (0 is the slider's default), so a link to a
    layer-0 view reopened at the last layer. The link now says layer=0 and draws the same figures."""
    open_tab(page, tab)
    panel = _panel(page)
    panel.get_by_role("button", name=button, exact=True).click()
    wait_for_plots(page, 2, timeout=120_000)
    _link(page, "layer=1")  # the run shows the last layer of the tiny model
    box = panel.get_by_label("number input for layer (0 = first)").first
    box.fill("0")
    box.press("Enter")
    url = _link(page, "layer=0")
    expected = figures(page)
    assert any("layer 0" in t for t in titles(page)), titles(page)

    again = opened(url)
    _expect_tab(again, tab)
    assert_linked_view_first(again, expected)  # not "layer 1 · mean of heads" first (it was, for about 3 s)
    assert page.js_errors == [] and again.js_errors == []


def test_vision_link_restores_the_example_and_the_clicked_patch(page, opened) -> None:
    open_tab(page, "Vision")
    panel = _panel(page)
    panel.get_by_text("7-sneaker-t10k-9.png").click()  # one of the tab's Fashion-MNIST examples
    # classify once the example is in the upload (its preview shows), with room for a loaded machine
    expect(page.locator("#vision-will-see img")).to_be_visible(timeout=60_000)
    panel.get_by_role("button", name="Classify image", exact=True).click()
    wait_for_plots(page, 5, timeout=120_000)
    seen = page.locator("#seen-image img")
    seen.wait_for(timeout=30_000)
    page.wait_for_timeout(500)
    size = seen.bounding_box()
    seen.click(position={"x": size["width"] * 0.2, "y": size["height"] * 0.8})  # 28×28, 4-pixel patches: r5c1
    _wait_for_title(page, "Patch r5c1")
    _wait_for_title(page, "Deletion curve")
    url = _link(page, "tab=vision", "image=sneaker", "patch=5%2C1")
    expected = figures(page)

    again = opened(url)
    _expect_tab(again, "Vision")
    assert_linked_view_first(again, expected)  # the clicked patch first, not the centre's
    assert any(t.startswith("Patch r5c1") for t in titles(again))
    assert "patch=&" not in url + "&" and "could not be restored" not in again.inner_text("body")
    assert page.js_errors == [] and again.js_errors == []


def test_classify_link_restores_the_explanation(page, opened) -> None:
    open_tab(page, "Classify")
    panel = _panel(page)
    panel.get_by_label("text", exact=True).fill("a warm , funny and beautifully acted film .")
    _pick(page, "explanation (colours the text)", "Integrated gradients")
    panel.get_by_role("button", name="Classify", exact=True).click()
    wait_for_plots(page, 3)
    expect(page.locator(".atlas-highlight")).to_contain_text("Integrated gradients toward", timeout=60_000)
    _wait_for_title(page, "Deletion curve")
    # a view other than the run's own (the last layer, mean of heads): layer 0, head 1
    _pick(page, "head (or fusion of heads)", "1")
    box = panel.get_by_label("number input for layer (0 = first)").first
    box.fill("0")
    box.press("Enter")
    url = _link(page, "tab=classify", "explanation=integrated_gradients", "layer=0", "head=1")
    assert any("layer 0" in t for t in titles(page)), titles(page)
    expected, colours = figures(page), page.locator(".atlas-highlight").inner_html()

    again = opened(url)
    _expect_tab(again, "Classify")
    assert_linked_view_first(again, expected)  # layer 0, head 1 first, not the last layer's mean of heads
    expect(again.locator(".atlas-highlight")).to_contain_text("Integrated gradients toward", timeout=60_000)
    assert again.locator(".atlas-highlight").inner_html() == colours
    assert page.js_errors == [] and again.js_errors == []


def test_a_hostile_link_shows_the_defaults_and_a_notice(app_url: str, opened) -> None:
    query = {"tab": "generate", "layer": "999", "head": "abc", "model": "../../etc/passwd", "seed": "1e999",
             "text": "x" * 4_001, "tokens": "-1", "\u202e<img src=x onerror=alert(1)>": "1"}
    page = opened(app_url + "?" + urlencode(query))
    notice = page.locator(".notice").filter(has_text="This link could not be restored completely")
    expect(notice.first).to_contain_text("layer, head", timeout=60_000)  # said after the run, which checks them
    shown = notice.first.inner_text()
    for key in ("model", "seed", "text", "tokens", "head"):
        assert key in shown
    assert "passwd" not in shown and "onerror" not in shown and "1 unknown entry" in shown
    _expect_tab(page, "Generate")
    panel = _panel(page)
    assert panel.get_by_label("prompt").input_value() == PROMPTS[0]
    assert panel.get_by_role("combobox", name="model").input_value() == "gpt-tiny"
    wait_for_plots(page, 3)  # the tab ran with its defaults
    assert any(re.search(r"layer 1 · mean of heads$", t) for t in titles(page)), titles(page)
    assert page.locator("img[src=x]").count() == 0 and page.locator(".toast-message-text").count() == 0
    assert "Traceback" not in page.inner_text("body")

    nowhere = opened(app_url + "?tab=..%2F..%2Fetc%2Fpasswd&text=%3Cscript%3E")
    expect(nowhere.locator(".notice").filter(has_text="It names no tab").first).to_be_visible(timeout=30_000)
    _expect_tab(nowhere, "Translate")
    assert page.js_errors == [] and nowhere.js_errors == []


def test_every_figure_downloads_as_svg_and_png(page) -> None:
    open_tab(page, "Attention playground")
    wait_for_plots(page, 2)
    bar = _panel(page).locator(".atlas-export").first
    for name, start in (("SVG", b"<svg"), ("PNG", b"\x89PNG")):
        with page.expect_download() as download:
            bar.get_by_role("button", name=name, exact=True).click()
        data = Path(download.value.path()).read_bytes()
        assert data.startswith(start), data[:40]
        assert download.value.suggested_filename.endswith("." + name.lower())
    # every drawn figure of the page has its buttons
    assert page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].filter(e => e._fullLayout)
        .every(e => e.parentElement.querySelector(':scope > .atlas-export'))""")
    assert page.js_errors == []


def test_lesson_link_restores_the_lesson_its_input_and_step(page, opened, tiny_checkpoints, monkeypatch) -> None:
    """A teacher's slide link: lesson 4 with seed 3 at step 2, the same question and choices in a fresh page (the
    choices computed here over the server's tiny checkpoints)."""
    from tabs import lessons

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())

    title = lessons.LESSONS[3].title
    open_tab(page, "Lessons")
    panel = _panel(page)
    _pick(page, "lesson", title)
    panel.get_by_label(lessons.LESSONS[3].input_label).fill("3")
    panel.get_by_role("button", name="Start the lesson").click()
    expect(panel).to_contain_text("step 1 of 4", timeout=30_000)
    panel.get_by_role("button", name="next step →").click()
    expect(panel).to_contain_text("step 2 of 4", timeout=30_000)
    url = _link(page, "tab=lessons", "input=3", "step=2")
    shown, expected = panel.inner_text(), figures(page)  # step 2's figure of the heads offered
    assert expected, titles(page)

    again = opened(url)
    _expect_tab(again, "Lessons")
    expect(_panel(again)).to_contain_text("step 2 of 4", timeout=60_000)
    assert_linked_view_first(again, expected)  # not step 1's figure first
    assert lessons.question(4, 2, "3").text.split("**")[0][:40] in shown
    for choice in lessons.question(4, 2, "3").choices:
        expect(_panel(again)).to_contain_text(choice, timeout=30_000)
    assert again.js_errors == [] and page.js_errors == []


def test_translate_link_restores_the_sentence_the_figures_show(page, opened) -> None:
    """Issue 61, item 5: the sentence picked under a translation of several sentences was not in the link, which
    reopened on the first sentence's figures."""
    open_tab(page, "Translate")
    panel = _panel(page)
    panel.get_by_label("English sentence").fill("A dog runs on the grass . Two men are talking in the street .")
    panel.get_by_role("button", name="Translate", exact=True).click()
    wait_for_plots(page, 2, timeout=120_000)
    _wait_for_title(page, "Sentence 1 of 2")
    _pick(page, "sentence the figures show", "2 · Two men are talking in the street .")
    _wait_for_title(page, "Sentence 2 of 2")
    box = panel.get_by_label("number input for layer (0 = first)").first
    box.fill("0")
    box.press("Enter")
    _wait_for_title(page, "Sentence 2 of 2 · Cross-attention (target → source) · layer 0")
    url = _link(page, "sentence=2", "layer=0")
    expected = figures(page)

    again = opened(url)
    _expect_tab(again, "Translate")
    assert_linked_view_first(again, expected)  # the second sentence at layer 0 is the first view drawn
    expect(_panel(again).get_by_label("sentence the figures show")).to_have_value(
        "2 · Two men are talking in the street .", timeout=30_000)
    assert page.js_errors == [] and again.js_errors == []


@pytest.mark.parametrize("tab,control,value,key", [
    ("Swin windows", "window size", "2", "window=2"),
    ("Attention playground", "sequence length (tokens)", "9", "tokens=9"),
    ("Positional encoding", "RoPE dimension pair", "3", "pair=3"),
])
def test_the_tabs_drawn_at_load_reopen_their_link(page, opened, tab: str, control: str, value: str,
                                                  key: str) -> None:
    """The tabs that draw without a model: a changed control is in the link, and the link draws the same figures."""
    open_tab(page, tab)
    wait_for_plots(page, 2)
    before = figures(page)
    box = _panel(page).get_by_label(f"number input for {control}").first
    box.fill(value)
    box.press("Enter")
    url = _link(page, f"tab={pl_key(tab)}", key)
    expected = figures(page)
    assert expected != before

    again = opened(url)
    _expect_tab(again, tab)
    assert_linked_view_first(again, expected)  # not the defaults' figures first
    assert page.js_errors == [] and again.js_errors == []


def pl_key(tab: str) -> str:
    return {"Swin windows": "swin", "Attention playground": "playground", "Positional encoding": "positional"}[tab]


def test_heads_link_draws_the_linked_head_first(page, opened) -> None:
    """The Heads link drew layer 0 head 0's card (the sliders' values as the page opens) before the link's layer and
    head were set: its run now draws the linked head's card first, the same figures as the page the link was copied
    from (tiny checkpoints: gpt-tiny has 2 layers of 4 heads)."""
    open_tab(page, "Heads")
    panel = _panel(page)
    panel.get_by_role("button", name="Score every head").click()
    wait_for_plots(page, 5, timeout=120_000)  # grid, finder, by layer, the card's example and offsets
    card = page.locator("#heads-card")
    # the card starts on the head the finder ranks first (issue 75, item 5)
    top = page.evaluate("() => document.querySelector('#heads-finder .js-plotly-plot').data[0].customdata[0]")
    expect(card).to_contain_text(f"gpt-tiny · layer {top[0]} · head {top[1]}", timeout=60_000)
    for label, value in (("layer", "1"), ("head", "2")):
        box = panel.get_by_label(f"number input for {label}", exact=True)
        box.fill(value)
        box.press("Enter")
    expect(card).to_contain_text("gpt-tiny · layer 1 · head 2", timeout=60_000)
    _wait_for_title(page, "Mean attention by offset · layer 1 · head 2")
    url = _link(page, "tab=heads", "layer=1", "head=2")
    expected, shown = figures(page), card.inner_text()

    again = opened(url)
    _expect_tab(again, "Heads")
    assert_linked_view_first(again, expected)  # not layer 0 head 0's example and offsets first
    expect(again.locator("#heads-card")).to_have_text(shown, timeout=30_000)
    again.wait_for_function("(url) => location.href === url", arg=url, timeout=30_000)
    assert page.js_errors == [] and again.js_errors == []
