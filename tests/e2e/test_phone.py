"""Every tab at a phone's width (390 px, issue 61 item 6) over the shipped checkpoints: each tab is driven once with
a small input, and every figure it draws must fit its column (no wider than its box, no postage stamp), carry its
colour bars no wider than its map, and draw no tick label over another one, cut off at the figure's edge or in type
too small to read. The model view fits the column too, and a click on one of its thumbnails still opens that head."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.conftest import app_env, free_port, serving

from .helpers import overlapping_labels, screenshot, titles, wait_for_plots

pytestmark = pytest.mark.e2e

WIDTH = 390


@pytest.fixture(scope="module")
def app_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`python app.py` as shipped: every model from checkpoints/."""
    with serving(app_env(free_port()), tmp_path_factory.mktemp("phone") / "server.log") as url:
        yield url


@pytest.fixture()
def phone(browser, app_url: str):
    """A page 390 px wide; ``phone.open(tab)`` loads the app on that tab (the tab bar wraps on a phone)."""
    context = browser.new_context(viewport={"width": WIDTH, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.js_errors = errors

    def open_tab(key: str) -> None:
        pg.goto(f"{app_url}?tab={key}", wait_until="domcontentloaded")
        pg.wait_for_selector("button[role=tab]", timeout=60_000)

    pg.open = open_tab
    yield pg
    context.close()


def _panel(page):
    return page.locator("div[role=tabpanel]:visible")


# Every drawn figure of the visible tab as the browser drew it: its box (the block around it), its own width, the
# union of its plot areas, each colour bar's fill and whole group, whether its title lies under the block's label,
# and its tick labels: pairs of one axis drawn over each other, labels past the figure's left or right edge, and the
# smallest type.
_MEASURE = """() => [...document.querySelectorAll('div[role=tabpanel] .js-plotly-plot')]
  .filter(e => e.offsetParent !== null && e._fullLayout && e.querySelector('.main-svg .subplot, .main-svg .trace'))
  .map(e => {
    const fig = e.getBoundingClientRect(), box = e.parentElement.getBoundingClientRect();
    const areas = [...e.querySelectorAll('.nsewdrag')].map(r => r.getBoundingClientRect()).filter(r => r.width > 0);
    const plot = areas.length ? Math.max(...areas.map(r => r.right)) - Math.min(...areas.map(r => r.left)) : null;
    const bars = [...e.querySelectorAll('.colorbar')].map(c => {
      const fill = c.querySelector('.cbfills').getBoundingClientRect(), all = c.getBoundingClientRect();
      return {fill: fill.width, left: all.left - fig.left, right: all.right - fig.left}; });
    const overlaps = [], outside = [];
    let smallest = 99;
    for (const layer of e.querySelectorAll('.xaxislayer-above, .yaxislayer-above')) {
      const texts = [...layer.querySelectorAll('.xtick text, .ytick text')].filter(t => t.textContent.trim());
      const r = texts.map(t => t.getBoundingClientRect()).filter(b => b.width > 0);
      texts.forEach((t) => { smallest = Math.min(smallest, parseFloat(getComputedStyle(t).fontSize)); });
      r.forEach((a, i) => {
        if (a.left < fig.left - 2 || a.right > fig.right + 2) outside.push(texts[i].textContent);
        r.slice(i + 1).forEach((b, j) => {
          if (a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1)
            overlaps.push(texts[i].textContent + ' / ' + texts[i + 1 + j].textContent); }); });
    }
    const label = e.parentElement.querySelector(':scope > label'), title = e.querySelector('.gtitle');
    const hidden = label && title && title.textContent && label.getBoundingClientRect().height > 0
      && title.getBoundingClientRect().top < label.getBoundingClientRect().bottom - 2;
    return {title: ((e._fullLayout.title || {}).text || '').split('<br>')[0], box: box.width, hidden,
            width: e._fullLayout.width, drawn: fig.width, plot, bars, overlaps, outside, smallest}; })"""

# every figure that carries a phone layout is drawn in it at its box's width (tabs/page.py's script)
_SETTLED = """() => [...document.querySelectorAll('div[role=tabpanel] .js-plotly-plot')]
  .filter(e => e.offsetParent !== null && e._fullLayout)
  .every(e => !(e.layout.meta && e.layout.meta.atlas_phone)
              || Math.abs((e._atlasPhoneWidth || 0) - e.parentElement.clientWidth) < 4)"""


def problems(page) -> list[str]:
    """What is wrong with the visible tab's figures on a phone, one line per fault (empty: all readable)."""
    page.wait_for_function(_SETTLED, timeout=30_000)
    page.wait_for_timeout(500)
    out = []
    for f in page.evaluate(_MEASURE):
        name = f"{f['title'][:60]!r}"
        if f["width"] > f["box"] + 1 or f["drawn"] > f["box"] + 1:
            out.append(f"{name}: {f['width']:.0f} px wide in a {f['box']:.0f} px column")
        if f["plot"] is not None and f["plot"] < 0.5 * f["box"]:
            out.append(f"{name}: a postage stamp ({f['plot']:.0f} px of plot in {f['box']:.0f} px)")
        for bar in f["bars"]:
            if f["plot"] is not None and bar["fill"] > f["plot"] + 1:
                out.append(f"{name}: colour bar {bar['fill']:.0f} px wider than the map's {f['plot']:.0f} px")
            if bar["left"] < -1 or bar["right"] > f["drawn"] + 1:
                out.append(f"{name}: colour bar past the figure's edge")
        if f["hidden"]:
            out.append(f"{name}: its title under the block's label")
        if f["overlaps"]:
            out.append(f"{name}: tick labels drawn over each other: {f['overlaps'][:3]}")
        if f["outside"]:
            out.append(f"{name}: tick labels cut at the figure's edge: {f['outside'][:3]}")
        if f["smallest"] < 8:
            out.append(f"{name}: tick labels in {f['smallest']} px type")
    return out + [f"titles drawn over each other: {pair}" for pair in overlapping_labels(page)]


def _open_thumbnail(page, elem_id: str, layer: int, head: int) -> None:
    """Click the middle of the model view's thumbnail of ``layer``, ``head`` (placed by Plotly's own axes) and wait
    for that head's heatmap."""
    at = page.evaluate("""([id, layer, head]) => { const e = document.querySelector('#' + id + ' .js-plotly-plot');
        const [q, k, gap] = e._fullData[0].meta.thumbnails; const xa = e._fullLayout.xaxis, ya = e._fullLayout.yaxis;
        e.scrollIntoView(); const r = e.getBoundingClientRect();
        const row = layer * (q + gap) + Math.floor(q / 2), col = head * (k + gap) + Math.floor(k / 2);
        return {x: r.left + xa._offset + xa.l2p(col), y: r.top + ya._offset + ya.l2p(row)}; }""",
                         [elem_id, layer, head])
    assert 0 < at["x"] < WIDTH, at  # the thumbnail is on the screen, not beyond its right edge
    page.mouse.click(at["x"], at["y"])
    page.wait_for_function("([id, want]) => ((document.querySelector('#' + id + ' .js-plotly-plot')._fullLayout"
                           ".title || {}).text || '').replace(/<br>/g, ' ').includes(want)",
                           arg=[elem_id, f"layer {layer} · head {head}"], timeout=30_000)


def _model_view(page, elem_id: str) -> list[str]:
    """Switch to the model view, measure it, and open a thumbnail's head from it."""
    _panel(page).get_by_label("model view").check()
    page.wait_for_function("(id) => { const e = document.querySelector('#' + id + ' .js-plotly-plot'); "
                           "return e && e._fullData && e._fullData[0].meta && e._fullData[0].meta.thumbnails; }",
                           arg=elem_id, timeout=30_000)
    found = problems(page)
    _open_thumbnail(page, elem_id, 1, 2)
    return found


def test_translate_at_390px(phone) -> None:
    phone.open("translate")
    _panel(phone).get_by_label("English sentence").fill("Two dogs run on the beach.")
    _panel(phone).get_by_role("button", name="Translate", exact=True).click()
    wait_for_plots(phone, 4, timeout=120_000)
    expect(_panel(phone)).to_contain_text("Beam size", timeout=60_000)
    found = problems(phone)
    found += _model_view(phone, "translate-attention")
    screenshot(phone, "phone-translate")
    assert not found, "\n".join(found)
    assert phone.js_errors == []


def test_classify_at_390px(phone) -> None:
    phone.open("classify")
    _panel(phone).get_by_label("text", exact=True).fill("a warm and funny film .")
    _panel(phone).get_by_role("button", name="Classify", exact=True).click()
    wait_for_plots(phone, 4, timeout=120_000)  # with the deletion curve
    found = problems(phone)
    screenshot(phone, "phone-classify")
    assert not found, "\n".join(found)
    assert phone.js_errors == []


def test_generate_at_390px(phone) -> None:
    phone.open("generate")
    _panel(phone).get_by_label("prompt").fill("Two dogs play in the snow . Two dogs play in the")
    _panel(phone).get_by_label("number input for new tokens").fill("6")
    _panel(phone).get_by_role("button", name="Generate", exact=True).click()
    wait_for_plots(phone, 3, timeout=120_000)
    expect(_panel(phone)).to_contain_text("6 new tokens", timeout=60_000)
    found = problems(phone)
    found += _model_view(phone, "generate-attention")
    _panel(phone).get_by_role("button", name="Repeated random tokens").click()  # the 101-token stripe and the roles
    expect(_panel(phone)).to_contain_text("strongest induction", timeout=120_000)
    phone.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')].some(e => e._fullLayout && "
                            "((e._fullLayout.title || {}).text || '').startsWith('Induction stripe'))", timeout=60_000)
    found += problems(phone)
    screenshot(phone, "phone-generate")
    assert not found, "\n".join(found)
    assert phone.js_errors == []


def test_vision_at_390px(phone) -> None:
    phone.open("vision")
    _panel(phone).get_by_role("button", name="7-sneaker-t10k-9.png").click()
    phone.wait_for_timeout(800)
    _panel(phone).get_by_role("button", name="Classify image", exact=True).click()
    wait_for_plots(phone, 7, timeout=120_000)  # with the explanation and the deletion curve
    found = problems(phone)
    screenshot(phone, "phone-vision")
    assert not found, "\n".join(found)
    assert phone.js_errors == []


def test_image_and_text_at_390px(phone) -> None:
    phone.open("describe")
    _panel(phone).get_by_role("button", name="scene_009.png").click()
    phone.wait_for_timeout(800)
    _panel(phone).get_by_role("button", name="Answer", exact=True).click()
    wait_for_plots(phone, 7, timeout=120_000)
    found = problems(phone)
    screenshot(phone, "phone-describe")
    assert not found, "\n".join(found)
    assert phone.js_errors == []


@pytest.mark.parametrize("key,plots", [("swin", 5), ("positional", 5), ("playground", 2)])
def test_the_tabs_without_a_model_at_390px(phone, key: str, plots: int) -> None:
    """Swin windows (then the trained Swin), Positional encoding and the Attention playground draw at load."""
    phone.open(key)
    wait_for_plots(phone, plots, timeout=60_000)
    if key == "swin":
        _panel(phone).get_by_role("button", name="Show the trained Swin").click()
        wait_for_plots(phone, 7, timeout=120_000)
    found = problems(phone)
    screenshot(phone, f"phone-{key}")
    assert not found, "\n".join(found)
    assert phone.js_errors == []


def test_heads_and_a_lesson_at_390px(phone) -> None:
    """The Heads tab's grid, finder and layers over gpt-tiny, and lesson 1's revealed figure."""
    from tabs import lessons

    phone.open("heads")
    _panel(phone).get_by_role("button", name="Score every head").click()
    wait_for_plots(phone, 4, timeout=300_000)
    expect(_panel(phone)).to_contain_text("layers × 8 heads", timeout=300_000)
    found = problems(phone)
    phone.open("lessons")
    _panel(phone).get_by_role("button", name="Start the lesson").click()
    expect(_panel(phone)).to_contain_text("step 1 of", timeout=60_000)
    _panel(phone).get_by_role("radio", name=lessons.question(1, 1).choices[0], exact=True).check()
    _panel(phone).get_by_role("button", name="Check my prediction").click()
    phone.wait_for_function("() => { const e = document.querySelector('#lessons-revealed .js-plotly-plot');"
                            " return e && e._fullLayout && e._atlasPhoneWidth; }", timeout=60_000)
    found += problems(phone)
    assert titles(phone)
    assert not found, "\n".join(found)
    assert phone.js_errors == []


# each subplot's plot area of the figure inside #id: its width and height, and the rows of the map drawn in it
_MAPS = """(id) => { const e = document.querySelector('#' + id + ' .js-plotly-plot');
  const rows = Math.max(...e._fullData.map(t => (t.z || []).length));
  return [...e.querySelectorAll('.nsewdrag')].map(r => r.getBoundingClientRect()).filter(r => r.width > 0)
    .map(r => ({width: r.width, height: r.height, rows})); }"""


def test_lesson_4s_maps_before_predicting_at_390px(phone) -> None:
    """Issue 75, item 4: lesson 4's four 49-token maps before predicting stood two to a row as 121 × 71 px strips
    (under 1.5 px a row) with each map's labels over its neighbour. Now one to a row: each map as wide as the figure
    allows and at least 4 px a row, and nothing in the figure drawn over anything else."""
    from tabs.course.course import LESSONS

    phone.open("lessons")
    _panel(phone).get_by_label("lesson", exact=True).click()
    phone.get_by_role("option", name=LESSONS[3].title, exact=True).click()
    phone.wait_for_timeout(800)
    _panel(phone).get_by_role("button", name="Start the lesson").click()
    expect(_panel(phone)).to_contain_text("step 1 of", timeout=120_000)
    phone.wait_for_function("() => { const e = document.querySelector('#lessons-before .js-plotly-plot');"
                            " return e && e._fullLayout && e._atlasPhoneWidth; }", timeout=60_000)
    found = problems(phone)
    maps = phone.evaluate(_MAPS, "lessons-before")
    box = phone.evaluate("() => document.querySelector('#lessons-before .js-plotly-plot').parentElement.clientWidth")
    screenshot(phone, "phone-lesson-4")
    assert len(maps) == 4
    for m in maps:
        assert m["height"] / m["rows"] >= 4 and m["width"] >= 0.6 * box, m
    assert not found, "\n".join(found)
    assert phone.js_errors == []
