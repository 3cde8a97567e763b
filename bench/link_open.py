"""Opening a link, timed in headless Chromium (issue 61, item 5): how long until the linked view is drawn, and
whether another view (the tab's default, "layer 2 · mean of heads") is drawn before it.

For each tab's link (the shipped checkpoints; the models loaded once by a first, untimed opening of every link), a
fresh page is opened on the link and a script inside it (added before the page's own scripts) records, every 20 ms
from navigation start, the titles of the drawn, visible figures of the open tab. Reported per link (median over
``--repeats``):

- ``first_s``: seconds from navigation start to the first drawn figure;
- ``final_s``: seconds to the last change of the figures (the linked view, drawn completely);
- ``wrong``: how many openings drew a view other than the link's before it (``drawn_first``: a figure that showed
  another title before its final one, or a title no figure shows at the end, as in a figure Gradio replaced with a
  new element, the Heads card's example and offsets), shown for ``wrong_s`` seconds (median): 0 means the linked
  view is the first one drawn.

``--against DIR`` runs another checkout's app (e.g. ``git archive HEAD~1 | tar -x -C /tmp/before``) in turns with
this one (ABBA), so both arms see the same machine. The last line is one JSON object.

    python bench/link_open.py --repeats 3 --against /tmp/links-before
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._browser import Chrome  # noqa: E402
from bench._server import AppServer, machine_info  # noqa: E402

LINKS = {  # a view of each tab other than its default: layer 0 and a single head where the tab has them (the run's
    # default is the last layer, mean of heads)
    "translate": "?text=Two%20dogs%20are%20running%20on%20the%20beach%20.&layer=0&head=1",
    "translate_sentence": "?text=A%20dog%20runs%20.%20Two%20men%20are%20talking%20.&sentence=2&layer=0&head=1",
    "classify": "?tab=classify&text=a%20warm%20%2C%20funny%20film%20.&layer=0&head=1",
    "generate": "?tab=generate&layer=0&head=2",
    "vision": "?tab=vision&image=sneaker&layer=0&head=1&patch=5%2C1",
    "heads": "?tab=heads&layer=2&head=1",  # the card's default is layer 0 head 0: gpt-tiny's layer 2 head 1
    # Image + text: the second word replayed, head 1, a tower patch (vlm-fashion: 64-pixel scenes, 8-pixel patches)
    "describe": "?tab=describe&image=scene_008&step=2&head=1&patch=7%2C0",
    # Lessons: lesson 4 (gpt-tiny) on seed 3 at step 2, whose figure is the induction heads offered (step 1's is the
    # previous-token heads)
    "lessons": "?tab=lessons&lesson=4%20%C2%B7%20Previous-token%20and%20induction%20heads&input=3&step=2",
    # the tabs drawn at every page load, without a model: one control other than its default
    "swin": "?tab=swin&window=2",
    "positional": "?tab=positional&pair=3",
    "playground": "?tab=playground&tokens=9",
}

# Records (ms since navigation start, [[figure's number, title], ...]) whenever the open tab's drawn figures' titles
# change; a figure's title is its layout title, else its first annotation (as the browser tests read it).
RECORDER = """(() => {
  window.__atlasSeen = [];
  let last = null, next = 0;
  const ids = new WeakMap();  // each figure element its own number: a title is compared with the same figure's
  const read = () => [...document.querySelectorAll('div[role=tabpanel] .js-plotly-plot')]
    .filter(e => e.offsetParent !== null && e._fullLayout && e.querySelector('.main-svg .subplot, .main-svg .trace'))
    .map(e => { if (!ids.has(e)) ids.set(e, next++);
                return [ids.get(e), (e._fullLayout.title && e._fullLayout.title.text)
                        || ((e._fullLayout.annotations || [])[0] || {}).text || '']; });
  setInterval(() => {
    const now = JSON.stringify(read());
    if (now !== last) { last = now; window.__atlasSeen.push([performance.now(), JSON.parse(now)]); }
  }, 20);
})();"""


def drawn_first(changes: list) -> tuple[list[str], float]:
    """The views drawn before the final one, and for how long (seconds), from the recorder's changes
    ``[[ms, [[figure, title], ...]], ...]``: a title a figure showed before the one it shows at the end (the browser
    tests' ``stray_views``), or a title no figure shows at the end (``gone_views``: a figure Gradio replaced with a
    new element). The same title drawn again in a new element is the same view."""
    final = changes[-1][1]
    last = {figure: title for figure, title in final}
    showing = set(last.values())
    wrong_s, wrong = 0.0, []
    for (t, shown), (t_next, _) in zip(changes, [*changes[1:], (changes[-1][0], None)], strict=True):
        stray = [title for figure, title in shown
                 if (figure in last and last[figure] != title) or (title and title not in showing)]
        if stray:
            wrong_s += (t_next - t) / 1000
            wrong += [x for x in stray if x not in wrong]
    return wrong, wrong_s


def open_once(chrome: Chrome, url: str, quiet_s: float = 4.0, timeout_s: float = 120.0) -> dict[str, Any]:
    """Open ``url`` in a fresh context; wait until the figures have not changed for ``quiet_s`` (after at least one
    was drawn); what was seen."""
    context = chrome.browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        context.add_init_script(RECORDER)
        page = context.new_page()
        page.goto(url, wait_until="domcontentloaded")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            page.wait_for_timeout(500)
            seen = page.evaluate("() => [window.__atlasSeen, performance.now()]")
            changes, now = seen
            drawn = [c for c in changes if c[1]]
            if drawn and now - changes[-1][0] > quiet_s * 1000:
                break
        changes = [c for c in changes if c[1]]
        if not changes:
            return {"first_s": None, "final_s": None, "wrong": None, "wrong_s": 0.0, "final": []}
        wrong, wrong_s = drawn_first(changes)
        return {"first_s": changes[0][0] / 1000, "final_s": changes[-1][0] / 1000, "wrong": bool(wrong),
                "wrong_s": wrong_s, "wrong_titles": wrong[:4], "final": [title for _, title in changes[-1][1]]}
    finally:
        context.close()


def run_arm(root: Path | None, repeats: int, names: list[str]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {name: [] for name in names}
    with AppServer(root=root) as server, Chrome() as chrome:
        for name in names:  # models loaded, caches warm: the timed openings measure the link, not a first load
            open_once(chrome, server.url + LINKS[name])
        for _ in range(repeats):
            for name in names:
                out[name].append(open_once(chrome, server.url + LINKS[name]))
    return out


def summary(samples: list[dict]) -> dict[str, Any]:
    ok = [s for s in samples if s["final_s"] is not None]
    med = (lambda k: round(statistics.median(s[k] for s in ok), 2) if ok else None)  # noqa: E731
    return {"first_s": med("first_s"), "final_s": med("final_s"), "wrong": sum(bool(s["wrong"]) for s in samples),
            "wrong_s": med("wrong_s"), "openings": len(samples),
            "wrong_titles": next((s["wrong_titles"] for s in samples if s["wrong"]), []),
            "final": ok[-1]["final"] if ok else []}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--against", type=Path, help="another checkout's root (the 'before' arm)")
    parser.add_argument("--links", nargs="*", default=list(LINKS), choices=list(LINKS))
    args = parser.parse_args()
    arms = {"after": None, **({"before": args.against.resolve()} if args.against else {})}
    samples: dict[str, dict[str, list[dict]]] = {arm: {n: [] for n in args.links} for arm in arms}
    order = list(arms) + list(reversed(arms)) if args.against else list(arms)  # ABBA
    per_turn = max(1, args.repeats // len(order)) if args.against else args.repeats
    for arm in order:
        got = run_arm(arms[arm], per_turn, args.links)
        for name, s in got.items():
            samples[arm][name] += s
        print(json.dumps({arm: {n: summary(s) for n, s in got.items()}}), flush=True)
    report: dict[str, Any] = {"machine": machine_info(), "repeats": args.repeats}
    for arm in arms:
        for name in args.links:
            for key, value in summary(samples[arm][name]).items():
                if key != "final":
                    report[f"{arm}_{name}_{key}"] = value
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
