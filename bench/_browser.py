"""What a person waits for in the page, timed in headless Chromium (bench/latency.py --browser; issue 48 item 11).

Every time is taken inside the page with performance.now(), polled every 10 ms: from the click (or the file
handed to the upload input) to

- ``text``: the answer's text changed (Translate's German translation, Generate's coloured continuation);
- ``figures``: every figure the request draws is drawn anew (its traces' shapes differ from before the click: the
  inputs are chosen so that every repeat has another length);
- ``upload``: the file component shows the uploaded file (Gradio's own upload: the floor), and ``preview``: the
  upload preview's picture is shown (our work on top of it);
- ``classify``: Vision's figures are drawn after "Classify image".

Needs Playwright and Chromium (/usr/bin/chromium, as the browser tests).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--no-first-run", "--disable-dev-shm-usage"]

# The drawn, visible figures of the open tab and a signature of each: title, every trace's type and shape, and the
# sum of its z values (a figure whose shape does not depend on the input, as Translate's entropy per head, still
# changes with it).
_SIGNATURES = """() => [...document.querySelectorAll('div[role=tabpanel] .js-plotly-plot')]
  .filter(e => e.offsetParent !== null && e._fullData && e.querySelector('.main-svg .subplot, .main-svg .trace'))
  .map(e => JSON.stringify([(e._fullLayout.title || {}).text || '', e._fullData.map(t => [t.type,
    t.x ? t.x.length : 0, t.y ? t.y.length : 0, t.z ? t.z.length : 0, t.z && t.z[0] ? t.z[0].length : 0,
    t.z ? Array.from(t.z, r => r && r.length !== undefined ? Array.from(r) : [r]).flat()
            .reduce((a, v) => a + (Number.isFinite(+v) ? +v : 0), 0).toFixed(6) : ''])]))"""

# Click `button`, then poll: when the text of `text` (a selector; none: no text) changed and when `n` figures are new.
_CLICK_AND_WATCH = """async ({button, text, n, timeout}) => {
  const signatures = SIGNATURES;
  const read = () => {
    const el = text && document.querySelector(text);
    return el ? (el.value ?? el.innerText) : '';
  };
  const oldText = read(), oldFigures = new Set(signatures());
  const t0 = performance.now();
  button.click();
  return await new Promise((resolve) => {
    let tText = null;
    const timer = setInterval(() => {
      const now = performance.now() - t0;
      const value = read();
      if (tText === null && (!text || (value && value !== oldText))) tText = text ? now : 0;
      const fresh = signatures().filter(s => !oldFigures.has(s)).length;
      if ((tText !== null && fresh >= n) || now > timeout) {
        clearInterval(timer);
        resolve({text: tText === null ? null : tText / 1000, figures: now > timeout ? null : now / 1000});
      }
    }, 10);
  });
}""".replace("SIGNATURES", _SIGNATURES)


class Chrome:
    """Headless Chromium, started once (use as a context manager); ``page(url)`` opens a fresh page."""

    def __enter__(self) -> Chrome:
        from playwright.sync_api import sync_playwright

        self._pw = sync_playwright().start()
        self.browser = self._pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.browser.close()
        self._pw.stop()

    def page(self, url: str, width: int = 1400) -> Page:
        return Page(self.browser, url, width)


class Page:
    """One page (its own browser context) on the app at ``url``; use as a context manager."""

    def __init__(self, browser: Any, url: str, width: int = 1400) -> None:
        self.context = browser.new_context(viewport={"width": width, "height": 1000})
        self.page = self.context.new_page()
        self.page.goto(url, wait_until="domcontentloaded")
        self.page.wait_for_selector("button[role=tab]", timeout=120_000)

    def __enter__(self) -> Page:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.context.close()

    def panel(self):
        return self.page.locator("div[role=tabpanel]:visible")

    def open_tab(self, name: str) -> None:
        self.page.get_by_role("tab", name=name, exact=True).click()
        self.page.wait_for_timeout(300)

    def _press(self, button_name: str, text_selector: str | None, figures: int, timeout_s: float
               ) -> dict[str, float | None]:
        button = self.panel().get_by_role("button", name=button_name, exact=True).element_handle()
        out = self.page.evaluate(_CLICK_AND_WATCH, {"button": button, "text": text_selector, "n": figures,
                                                    "timeout": timeout_s * 1000})
        if text_selector is None:
            return {"figures": out["figures"]}
        out["figures_after_text"] = (out["figures"] - out["text"]) if None not in (out["figures"], out["text"]) \
            else None
        return out

    def translate(self, sentence: str, timeout_s: float = 120) -> dict[str, float | None]:
        """Translate ``sentence``: seconds to the translation's text and to its four figures."""
        self.open_tab("Translate")
        box = self.panel().get_by_label("German translation")
        box.evaluate("(el) => el.setAttribute('data-bench', 'translate-text')")
        self.panel().get_by_label("English sentence").fill(sentence)
        return self._press("Translate", "[data-bench=translate-text]", 4, timeout_s)

    def generate(self, prompt: str, timeout_s: float = 120) -> dict[str, float | None]:
        """Generate from ``prompt``: seconds to the coloured continuation and to its three figures."""
        self.open_tab("Generate")
        self.panel().get_by_label("prompt").fill(prompt)
        return self._press("Generate", "div[role=tabpanel] .atlas-generation", 3, timeout_s)

    def upload(self, path: Path, timeout_s: float = 120) -> dict[str, float | None]:
        """Hand ``path`` to Vision's upload (on a page where none was uploaded yet: the file component then hides
        its input): seconds until the file component shows it (Gradio's upload, the floor) and until the preview
        shows the picture."""
        self.open_tab("Vision")
        self.page.evaluate("""() => { window._benchOld = [...document.querySelectorAll('#vision-upload img')]
                                        .map(i => i.src).join(); window._benchT0 = performance.now(); }""")
        self.panel().locator("input[type=file]").set_input_files(str(path))
        shown = self.page.wait_for_function(
            """(name) => { const f = [...document.querySelectorAll('div[role=tabpanel] tr.file')]
                 .some(r => r.offsetParent !== null && r.querySelector(`td.filename[aria-label="${name}"]`)
                            && r.querySelector('a[data-testid=download-link][href*="/file="]'));
               if (f && window._benchFile === undefined) window._benchFile = performance.now() - window._benchT0;
               const src = [...document.querySelectorAll('#vision-upload img')].map(i => i.src).join();
               return src && src !== window._benchOld
                 ? [window._benchFile ?? null, performance.now() - window._benchT0] : null; }""",
            arg=path.name, polling=10, timeout=timeout_s * 1000).json_value()
        return {"upload": None if shown[0] is None else shown[0] / 1000, "preview": shown[1] / 1000}

    def classify(self, timeout_s: float = 180) -> dict[str, float | None]:
        """Press "Classify image" on the uploaded image: seconds until its figures are drawn anew (5: classes,
        overlay, every head, the clicked patch, distance)."""
        self.open_tab("Vision")
        return self._press("Classify image", None, 5, timeout_s)


def settle(max_load: float, timeout_s: float = 300.0, poll_s: float = 5.0) -> float:
    """Wait until the 1-minute load average is at most ``max_load`` (or ``timeout_s`` passed); returns it."""
    import os

    deadline = time.monotonic() + timeout_s
    load = os.getloadavg()[0]
    while load > max_load and time.monotonic() < deadline:
        time.sleep(poll_s)
        load = os.getloadavg()[0]
    return load
