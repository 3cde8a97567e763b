"""Small helpers for driving the Gradio page as a person would."""

from __future__ import annotations

import json
import time
from pathlib import Path

SHOTS = Path(__file__).resolve().parents[2] / "shots"

# Visible Plotly figures that were actually drawn (an SVG with a subplot or a trace), in page order.
_DRAWN = """[...document.querySelectorAll('.js-plotly-plot')].filter(e => e.offsetParent !== null
  && e._fullData && e.querySelector('.main-svg .subplot, .main-svg .trace'))"""

# Plotly keeps what it drew in _fullData, with binary arrays decoded to typed arrays; make them plain.
_PLAIN = """(v) => v == null ? null : (typeof v === 'object' && v.length !== undefined && typeof v !== 'string')
  ? Array.from(v, r => (r && typeof r === 'object' && r.length !== undefined) ? Array.from(r) : r) : v"""


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name, exact=True).click()


def visible_plots(page) -> int:
    return page.evaluate(f"() => {_DRAWN}.length")


def wait_for_plots(page, n: int, timeout: float = 60_000) -> None:
    page.wait_for_function(f"(n) => {_DRAWN}.length >= n", arg=n, timeout=timeout)


def figures(page) -> list[list[dict]]:
    """The traces of every drawn, visible figure: type, name, x, y, z, text as plain JSON."""
    return page.evaluate(
        f"""() => {{ const plain = {_PLAIN};
        return {_DRAWN}.map(e => e._fullData.map(t => ({{type: t.type, name: t.name, x: plain(t.x),
          y: plain(t.y), z: plain(t.z), text: plain(t.text)}}))); }}"""
    )


def plot_signature(page) -> str:
    return json.dumps(figures(page))


def wait_for_change(page, before: str, timeout: float = 60_000) -> None:
    """Wait until the drawn figures differ from `before` (a plot_signature)."""
    page.wait_for_function(
        f"""(old) => {{ const plain = {_PLAIN};
        const now = {_DRAWN}.map(e => e._fullData.map(t => ({{type: t.type, name: t.name, x: plain(t.x),
          y: plain(t.y), z: plain(t.z), text: plain(t.text)}})));
        return JSON.stringify(now) !== old; }}""",
        arg=before, timeout=timeout)


def clipped_figures(page) -> list[str]:
    """Titles of drawn figures that are wider than their box while the box does not scroll sideways."""
    return page.evaluate(
        f"""() => {_DRAWN}.filter(e => e._fullLayout.width > e.parentElement.clientWidth + 1
              && !['auto', 'scroll'].includes(getComputedStyle(e.parentElement).overflowX))
            .map(e => (e._fullLayout.title && e._fullLayout.title.text) || '?')"""
    )


def sideways_figures(page) -> list[str]:
    """Drawn figures whose box scrolls sideways (wider than its column: issue 75, item 4 at 1400 px), each as
    'title: drawn width in box width'."""
    return page.evaluate(
        f"""() => {_DRAWN}.filter(e => e.parentElement.scrollWidth > e.parentElement.clientWidth + 1
                                       || e._fullLayout.width > e.parentElement.clientWidth + 1)
            .map(e => ((e._fullLayout.title && e._fullLayout.title.text) || '?').split('<br>')[0] + ': '
                      + Math.round(e._fullLayout.width) + ' px in ' + e.parentElement.clientWidth)"""
    )


def cut_titles(page) -> list[str]:
    """Titles and axis titles of drawn figures that run past their figure's edges (as drawn, in pixels)."""
    return page.evaluate(
        f"""() => {_DRAWN}.flatMap(e => {{
            const box = (e.querySelector('.main-svg') || e).getBoundingClientRect();  // the figure as drawn: the
            // element spans its column, a figure of its own width can be narrower (a subtitle cut at its edge)
            return [...e.querySelectorAll('.gtitle, .g-xtitle text, .g-ytitle text, .annotation-text')]
              .filter(t => {{ const r = t.getBoundingClientRect();
                return r.width > 0 && (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1); }})
              .map(t => t.textContent); }})"""
    )


def overlapping_labels(page) -> list[list[str]]:
    """Pairs of texts drawn over each other in one figure: titles, axis titles, colour-bar titles, annotations and the
    legend (a colour bar's title across an axis title, a legend over the x-axis title)."""
    return page.evaluate(
        f"""() => {_DRAWN}.flatMap(e => {{
            const items = [...e.querySelectorAll('.gtitle, .g-xtitle text, .g-ytitle text, .cbtitle text, '
                                                 + '.annotation-text, .legend .bg')]
              .map(t => [t.textContent || 'legend', t.getBoundingClientRect()]).filter(([_, r]) => r.width > 0);
            const hit = (a, b) => a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1
                                  && b.top < a.bottom - 1;
            const out = [];
            items.forEach(([ta, a], i) => items.slice(i + 1)
              .forEach(([tb, b]) => {{ if (hit(a, b)) out.push([ta, tb]); }}));
            return out; }})"""
    )


def screenshot(page, name: str) -> None:
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def titles(page) -> list[str]:
    """Title text of every drawn, visible figure (layout title, else its first annotation)."""
    return page.evaluate(
        f"""() => {_DRAWN}.map(e => (e._fullLayout.title && e._fullLayout.title.text)
              || ((e._fullLayout.annotations || [])[0] || {{}}).text || '')"""
    )


def wait_for_title(page, wanted, timeout: float = 30) -> None:
    """Wait until some drawn figure's title satisfies ``wanted`` (figures of one event land one by one)."""
    deadline = time.monotonic() + timeout
    while not any(wanted(t) for t in titles(page)) and time.monotonic() < deadline:
        page.wait_for_timeout(250)
    assert any(wanted(t) for t in titles(page)), titles(page)


def click_cell(page, elem_id: str, row: int, col: int) -> None:
    """Click the centre of cell (row, col) of the heatmap inside #elem_id, placed by Plotly's own axes."""
    from playwright.sync_api import Error as PlaywrightError

    for attempt in range(4):  # a figure that was just replaced (a redraw after the run) settles first
        page.wait_for_timeout(500)
        try:
            page.locator(f"#{elem_id} .js-plotly-plot").first.scroll_into_view_if_needed(timeout=10_000)
            break
        except PlaywrightError as err:  # replaced while it scrolled: "not attached to the DOM"
            if attempt == 3 or "not attached" not in str(err):
                raise
    x, y = page.evaluate("""([id, row, col]) => {
        const el = document.querySelector('#' + id + ' .js-plotly-plot');
        const xa = el._fullLayout.xaxis, ya = el._fullLayout.yaxis, box = el.getBoundingClientRect();
        return [box.left + xa._offset + xa.l2p(col), box.top + ya._offset + ya.l2p(row)]; }""", [elem_id, row, col])
    page.mouse.click(x, y)


def generate_in_tab(page, prompt: str = "Two dogs are running on the") -> None:
    """Open Generate, type a prompt, press Generate and wait for its figures and notice."""
    from playwright.sync_api import expect

    open_tab(page, "Generate")
    panel = page.locator("div[role=tabpanel]:visible")
    panel.get_by_label("prompt").fill(prompt)
    panel.get_by_role("button", name="Generate", exact=True).click()
    wait_for_plots(page, 3)
    expect(panel).to_contain_text("new tokens", timeout=30_000)
