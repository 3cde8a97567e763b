"""Drive the running app in headless Chromium and save one screenshot per tab for the README.

    python docs/screenshots.py                # over checkpoints/, 1400 px wide: docs/screenshots/*.png
    python docs/screenshots.py --width 1024   # a laptop's width: docs/screenshots/1024px/*.png (each tab once,
                                              # Generate's model view, the Heads tab and lesson 4)
    python docs/screenshots.py --width 390    # a phone: docs/screenshots/390px/*.png, the same set, each shot from
                                              # the tab's first figure down
    python docs/screenshots.py --families     # DeBERTa's disentangled split on a DeBERTa-v3-base-shaped folder
    python docs/screenshots.py --only lessons # the lessons' three screenshots (induction, sink, Mamba)
    python docs/screenshots.py --only heads   # the Heads tab: gpt-tiny's grid and a head card, vit-fashion by layer
    python docs/screenshots.py --only tokens  # Generate, real SmolLM2: byte-level tokens decoded, the piece on hover
    python docs/screenshots.py --only describe  # Image + text: vlm-fashion on an example scene
    python docs/screenshots.py --only vision  # Vision (a photograph, an example), Swin windows, Positional encoding
    python docs/screenshots.py --only class   # a class: the student's join and answer, the teacher's screen, the
                                              # presenter view with its QR code, the reveal (with --width 1024, 390)
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tabs import lessons  # noqa: E402
from tests.conftest import app_env, free_port, wait_until_serving  # noqa: E402
from tests.e2e.conftest import CHROMIUM, FLAGS  # noqa: E402
from tests.e2e.helpers import click_cell, wait_for_plots  # noqa: E402

OUT = ROOT / "docs" / "screenshots"
PHONE_SHOT = 1600  # px: the most a phone screenshot shows (two or three figures)


def describe_shots(page, panel, tab, shot) -> None:
    """Image + text: vlm-fashion asked where the sandal is in an example scene."""
    tab("Image + text")
    panel().get_by_role("button", name="scene_009.png").click()
    page.wait_for_timeout(800)
    panel().get_by_label("question").fill("where is the sandal ?")
    panel().get_by_role("button", name="Answer", exact=True).click()
    wait_for_plots(page, 7, timeout=120_000)
    shot("image-and-text", 2700)


def generate_shots(page, panel, tab, shot) -> None:
    """The Generate tab: a continuation, then the head roles on repeated random tokens."""
    tab("Generate")
    panel().get_by_role("button", name="Generate", exact=True).click()
    wait_for_plots(page, 3, timeout=120_000)
    shot("generate", 2300)
    panel().get_by_role("button", name="Repeated random tokens").click()
    wait_for_plots(page, 6, timeout=120_000)  # the three of the continuation, then roles, stripe and losses
    panel().get_by_text("strongest previous token").wait_for(timeout=120_000)  # the summary line
    heading = panel().get_by_text("Head roles on repeated random tokens")
    top = heading.bounding_box()["y"] + page.evaluate("window.scrollY")
    shot("generate-head-roles", 1500, y=top - 20)
    why_shots(page, panel, shot)


def _top(page, locator) -> float:
    return locator.bounding_box()["y"] + page.evaluate("window.scrollY")


def why_shots(page, panel, shot) -> None:
    """Why gpt-tiny's induction head attends (patching finds it; click it; its score split), and the sink."""
    panel().get_by_role("button", name="Induction example: first copy replaced").click()
    strongest = panel().get_by_text("The strongest single patch")
    strongest.wait_for(timeout=120_000)
    page.wait_for_timeout(1000)
    # the head that restores the most (the induction head), as the notice names it: "... is layer L head H, ..."
    found = re.search(r"strongest single patch is layer (\d+) head (\d+)", strongest.inner_text())
    layer, head = int(found[1]), int(found[2])
    click_cell(page, "generate-patch", layer, head)
    panel().get_by_text(f"Layer {layer}, head {head}: query").first.wait_for(timeout=120_000)
    shot("generate-patching", 2300, y=_top(page, panel().get_by_text("Does it matter? Activation patching")) - 20)
    panel().get_by_role("button", name="Split this score").click()
    page.wait_for_timeout(3000)
    shot("generate-why", 1900, y=_top(page, panel().get_by_text("Why does this head attend there?")) - 20)
    qk_shot(page, panel, shot, layer, head)


def qk_shot(page, panel, shot, layer: int, head: int) -> None:
    """The queries and keys of that head over the generated text (tabs/sections/qk.py), its last query ringed."""
    section = page.locator("#generate-qk-section")
    section.get_by_text("Queries and keys of one head (Q/K scatter)").click()
    for label, value in (("layer", layer), ("head", head)):
        section.get_by_label(re.compile(f"^{label}")).fill(str(value))
        page.wait_for_timeout(1500)
    page.wait_for_function("(t) => [...document.querySelectorAll('#generate-qk .js-plotly-plot')].some(e => "
                           "e._fullLayout && (e._fullLayout.title.text || '').startsWith(t))",
                           arg=f"Queries and keys · layer {layer} · head {head}", timeout=120_000)
    shot("generate-qk", 1150, y=_top(page, panel().get_by_text("Queries and keys of one head").first) - 20)


def tokens_shots(page, panel, tab, shot) -> None:
    """Generate with the real SmolLM2 (byte-level BPE, GGUF): "Café 😀 old" as people read it, in the coloured text,
    the candidates and the heatmap's axes, and a cell's hover naming the pieces ("▁old (piece Ġold)")."""
    from serving.catalogue import REAL_LM

    tab("Generate")
    panel().get_by_role("combobox", name="model").click()
    page.get_by_role("option", name=REAL_LM, exact=True).click()
    panel().get_by_label("prompt").fill("Café 😀 old friends meet at the")
    page.get_by_label("new tokens").last.fill("6")
    panel().get_by_role("button", name="Generate", exact=True).click()
    panel().get_by_text("6 new tokens").first.wait_for(timeout=180_000)
    wait_for_plots(page, 3, timeout=180_000)
    page.wait_for_timeout(3000)  # 30 layers' figures: let Chromium draw the heatmaps' images before the capture
    shot("generate-tokens", 2300, y=_top(page, panel().get_by_text("6 new tokens").first) - 20)
    heatmap = page.locator("#generate-attention .js-plotly-plot").first
    heatmap.scroll_into_view_if_needed()
    x, y = page.evaluate("""() => {
        const el = document.querySelector('#generate-attention .js-plotly-plot');
        const xa = el._fullLayout.xaxis, ya = el._fullLayout.yaxis, box = el.getBoundingClientRect();
        const q = ya._categories.findIndex(c => c.includes('old')), k = q - 1;
        return [box.left + xa._offset + xa.l2p(k), box.top + ya._offset + ya.l2p(q)]; }""")
    page.mouse.move(x, y)
    page.wait_for_timeout(800)
    box = heatmap.bounding_box()
    page.screenshot(path=str(OUT / "generate-tokens-hover.png"),
                    clip={"x": 0, "y": box["y"], "width": page.viewport_size["width"], "height": box["height"]})


def _figures_span(page) -> tuple[float, int]:
    """On a phone, where the visible tab's figures are: from a little above the first one to the end of the last,
    at most PHONE_SHOT px (the first two or three figures), in page coordinates."""
    top, bottom = page.evaluate("""() => { const r = [...document.querySelectorAll(
        'div[role=tabpanel] .js-plotly-plot')].filter(e => e.offsetParent !== null && e._fullLayout)
        .map(e => e.getBoundingClientRect());
      return r.length ? [Math.min(...r.map(b => b.top)) + window.scrollY, Math.max(...r.map(b => b.bottom))
        + window.scrollY] : [0, 0]; }""")
    y = max(0.0, top - 80)
    return y, int(min(max(bottom + 60 - y, 400), PHONE_SHOT))


def model_view_shot(page, panel, shot) -> None:
    """Generate's model view (every layer × head of gpt-tiny) as the tab shows it after a generation."""
    panel().get_by_label("model view").check()
    page.wait_for_function("() => { const e = document.querySelector('#generate-attention .js-plotly-plot'); "
                           "return e && e._fullData && e._fullData[0].meta && e._fullData[0].meta.thumbnails; }",
                           timeout=60_000)
    box = page.locator("#generate-attention")
    box.scroll_into_view_if_needed()
    shot("generate-model-view", int(box.bounding_box()["height"]) + 40, y=_top(page, box) - 20)
    panel().get_by_label("heatmap").check()


def lesson_shots(page, panel, tab, shot, only: int | None = None) -> None:
    """Three lessons: induction heads (a right prediction revealed), attention sinks (a wrong one) and Mamba's
    hidden attention beside gpt-tiny's (the side-by-side step, a right prediction); ``only``: the first few."""
    tab("Lessons")
    for title, step, pick_answer, name, height in (
            ("4 · Previous-token and induction heads", 2, True, "lesson-induction", 1500),
            ("5 · Attention sinks", 2, False, "lesson-sink", 1500),
            ("9 · Mamba's hidden attention", 3, True, "lesson-mamba", 1900))[:only]:  # two heatmaps under the verdict
        panel().get_by_label("lesson").click()
        page.get_by_role("option", name=title, exact=True).click()
        panel().get_by_role("button", name="Start the lesson").click()
        panel().get_by_text("step 1 of").wait_for(timeout=60_000)
        for k in range(2, step + 1):  # one step at a time: a second click before the first's answer is lost
            panel().get_by_role("button", name="next step →").click()
            panel().get_by_text(f"step {k} of").wait_for(timeout=60_000)
        # the right answer or a wrong one, whichever the screenshot shows, from the lesson's own question
        q = lessons.question(int(title.split(" ")[0]), step)
        pick = q.answer if pick_answer else next(c for c in q.choices if c != q.answer)
        panel().get_by_role("radio", name=pick, exact=True).check()
        panel().get_by_role("button", name="Check my prediction").click()
        page.wait_for_timeout(3000)
        shot(name, height)


def class_shots(browser, url: str, width: int, shot) -> None:
    """A class at once as a student sees it (issue 61, item 3): a teacher's page opens a class; the student's page
    opens the class link (the join box first, no teacher controls), joins, and sends a prediction."""
    import re

    teacher = browser.new_page(viewport={"width": 1400, "height": 1000})
    teacher.goto(url + "?tab=lessons")
    teacher.get_by_text("A class at once: teach a class").click()
    teacher.get_by_role("button", name="Open a class on the step shown below").click()
    info = teacher.locator("#class-teacher-info")
    info.get_by_text("Join code").wait_for(timeout=60_000)
    code = re.search(r"Join code: ([A-Z0-9]{6})", info.inner_text()).group(1)
    page = browser.new_page(viewport={"width": width, "height": 1000})
    page.goto(url + f"?tab=lessons&class={code}")
    nickname = page.get_by_label("your nickname (only the teacher sees it)")
    nickname.wait_for(timeout=60_000)
    page.wait_for_timeout(1500)
    shot("class-student-join", 1000, page=page, whole=True)
    nickname.fill("Ada")
    page.get_by_role("button", name="Join the class").click()
    page.locator("#class-student-info").get_by_text("as Ada").wait_for(timeout=60_000)
    q = lessons.question(1, 1)
    page.get_by_label(q.choices[0], exact=True).check()
    page.get_by_role("button", name="Send my prediction to the class").click()
    page.locator("#class-student-info").get_by_text("is in").wait_for(timeout=60_000)
    shot("class-student", 1800, page=page, whole=True)
    # the teacher's screen: who has not answered (a second student joined), then the presenter view with the QR code
    other = browser.new_page(viewport={"width": 390, "height": 1000})
    other.goto(url + f"?tab=lessons&class={code}")
    other.get_by_label("your nickname (only the teacher sees it)").fill("Grace")
    other.get_by_role("button", name="Join the class").click()
    other.locator("#class-student-info").get_by_text("as Grace").wait_for(timeout=60_000)
    teacher.set_viewport_size({"width": width, "height": 1000})
    teacher.locator("#class-missing").get_by_text("Grace").wait_for(timeout=60_000)
    shot("class-teacher", 1500, y=_top(teacher, teacher.locator("#class-teach")) - 10, page=teacher)
    teacher.get_by_label("presenter view (large type for a projector)").check()
    teacher.wait_for_function("() => document.body.classList.contains('atlas-present')")
    shot("class-presenter", 1300 if width > 500 else 1700, y=_top(teacher, teacher.locator("#class-teach")) - 10,
         page=teacher)
    # the reveal on the student's page (on a phone: the figure laid out for the width)
    teacher.get_by_role("button", name="Reveal to the class").click()
    page.locator("#lessons-revealed .js-plotly-plot .main-svg").first.wait_for(timeout=60_000)
    page.wait_for_timeout(2000)
    shot("lesson-reveal", 1450, y=_top(page, page.locator("#lessons-revealed")) - 110, page=page)
    teacher.get_by_label("presenter view (large type for a projector)").uncheck()
    teacher.get_by_role("button", name="Close the class").click()  # an open class holds its step's answer


def heads_shots(page, panel, tab, shot) -> None:
    """The Heads tab: gpt-tiny's previous-token grid with the finder, the induction head's card, and vit-fashion's
    mean attention distance by layer."""
    tab("Heads")
    panel().get_by_role("button", name="Score every head").click()
    wait_for_plots(page, 5, timeout=300_000)
    panel().get_by_text("layers × 8 heads").first.wait_for(timeout=300_000)
    shot("heads-grid", 1250)
    panel().get_by_label("metric").click()
    page.get_by_role("option", name="induction", exact=True).click()
    page.wait_for_timeout(2000)
    for label, value in (("layer", 3), ("head", 0)):
        box = panel().get_by_label(f"number input for {label}", exact=True)
        box.fill(str(value))
        box.press("Enter")
        page.wait_for_timeout(1500)
    page.locator("#heads-card").get_by_text("layer 3 · head 0").wait_for(timeout=120_000)
    page.wait_for_timeout(2000)
    card = panel().get_by_text("Head card", exact=True)
    shot("heads-card", 1500, y=_top(page, card) - 20)
    panel().get_by_label("model", exact=True).click()
    page.get_by_role("option", name="vit-fashion", exact=True).click()
    panel().get_by_label("metric").click()
    page.get_by_role("option", name="mean attention distance in pixels", exact=True).click()
    panel().get_by_role("button", name="Score every head").click()
    panel().get_by_text("vit-fashion (vit)").wait_for(timeout=300_000)
    page.wait_for_timeout(3000)
    shot("heads-vit-distance", 1450, y=_top(page, panel().get_by_role("button", name="Score every head")) - 10)


def deberta_shot(page, panel, tab, shot) -> None:
    """DeBERTa's "why" split (content→content, content→position, position→content) on the configured
    DeBERTa-v3-base-shaped folder (random weights of the real shape: bench/_family_models.py)."""
    tab("Classify")
    panel().get_by_label("deberta-v3-base-shaped").check()
    panel().get_by_label("text", exact=True).fill("a warm , funny and beautifully acted film , if too long .")
    panel().get_by_role("button", name="Classify", exact=True).click()
    wait_for_plots(page, 3, timeout=300_000)
    section = panel().get_by_text("Why does this head attend there?")
    section.scroll_into_view_if_needed()
    for label, value in (("query position (−1: the last)", 0), ("key position", 3)):
        panel().get_by_label(label).fill(str(value))
    panel().get_by_role("button", name="Split this score").click()
    panel().get_by_text("content → position").first.wait_for(timeout=300_000)
    shot("classify-deberta-why", 1300, y=_top(page, section) - 20)


def vision_shots(page, panel, tab, shot) -> None:
    """The image models: Vision on a photograph (its unusual-input notice) and on an example, then the trained Swin's
    windows and the trained ViT's learned positions."""
    import skimage  # a real photograph that a package ships: the unusual-input notice, calibrated bars

    tab("Vision")
    panel().locator("input[type=file]").set_input_files(str(Path(skimage.__file__).parent / "data/chelsea.png"))
    page.wait_for_timeout(800)
    panel().get_by_role("button", name="Classify image", exact=True).click()
    panel().get_by_text("This image looks unlike Fashion-MNIST").wait_for(timeout=120_000)
    shot("vision-photo", 1300)
    panel().get_by_role("button", name="7-sneaker-t10k-9.png").click()
    page.wait_for_timeout(800)
    panel().get_by_role("button", name="Classify image", exact=True).click()
    panel().get_by_text("This image looks unlike Fashion-MNIST").wait_for(state="detached", timeout=120_000)
    wait_for_plots(page, 7, timeout=120_000)  # with the explanation and the deletion curve
    page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')].some(e => e._fullLayout"
                           " && (e._fullLayout.title.text || '').startsWith('Deletion curve: P(Sneaker)'))",
                           timeout=120_000)  # the sneaker's curve, not the photo's before it
    shot("vision", 2300)

    tab("Swin windows")
    wait_for_plots(page, 5, timeout=60_000)
    panel().get_by_role("button", name="Show the trained Swin").click()
    wait_for_plots(page, 7, timeout=120_000)
    shot("swin-windows", 2200)

    tab("Positional encoding")
    wait_for_plots(page, 5, timeout=60_000)
    shot("positional-encoding", 1700)


def main(argv: list[str] | None = None) -> None:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description="Retake the README's screenshots from the running app.")
    ap.add_argument("--width", type=int, default=1400, help="browser width in pixels (1400: the README's set)")
    ap.add_argument("--only", choices=["lessons", "class", "heads", "tokens", "describe", "vision"], default=None,
                    help="retake only these screenshots")
    ap.add_argument("--families", action="store_true",
                    help="only the families' screenshots, over random folders of real shapes in runs/families")
    args = ap.parse_args(argv)
    width = args.width
    out = OUT if width == 1400 else OUT / f"{width}px"
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = app_env(port)
    if args.families:
        from bench._family_models import ensure

        root = ROOT / "runs" / "families"
        env["ATLAS_MODELS"] = ",".join(str(root / name) for name in ensure(root, ("deberta-v3-base-shaped",)))
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_until_serving(url, proc)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
            page = browser.new_page(viewport={"width": width, "height": 1000})
            page.goto(url)
            page.wait_for_selector("button[role=tab]")
            panel = lambda: page.locator("div[role=tabpanel]:visible")  # noqa: E731

            def tab(name: str) -> None:
                page.get_by_role("tab", name=name, exact=True).click()
                page.wait_for_timeout(500)

            def shot(name: str, height: int = 2200, y: float = 0, page=page, whole: bool = False) -> None:
                page.wait_for_timeout(1500)
                if width < 600 and y == 0 and not whole:  # a phone: the tab's figures, not the intro above them
                    y, height = _figures_span(page)
                # Chromium decodes a heatmap's image (a data URL) below the fold only during a first full-page
                # capture, which then shows the axes without cells: the second capture is the one kept
                page.screenshot(full_page=True)
                page.wait_for_timeout(300)
                page.screenshot(path=str(out / f"{name}.png"), full_page=True,
                                clip={"x": 0, "y": y, "width": width, "height": height})

            if args.only == "lessons":
                lesson_shots(page, panel, tab, shot)
                return browser.close()
            if args.only == "class":
                class_shots(browser, url, width, shot)
                return browser.close()
            if args.only == "heads":
                heads_shots(page, panel, tab, shot)
                return browser.close()
            if args.only == "tokens":
                tokens_shots(page, panel, tab, shot)
                return browser.close()
            if args.only == "vision":
                vision_shots(page, panel, tab, shot)
                return browser.close()
            if args.only == "describe":
                describe_shots(page, panel, tab, shot)
                return browser.close()
            if args.families:
                deberta_shot(page, panel, tab, shot)
                return browser.close()

            tab("Translate")
            panel().get_by_role("button", name="Translate", exact=True).click()
            wait_for_plots(page, 4, timeout=120_000)
            shot("translate", 2000)

            tab("Classify")
            panel().get_by_label("MiniLM (pretrained, fine-tuned)").check()
            panel().get_by_label("text", exact=True).fill("a warm , funny and beautifully acted film , if too long .")
            panel().get_by_role("button", name="Classify", exact=True).click()
            wait_for_plots(page, 4, timeout=120_000)  # the deletion curve comes after the answer
            panel().get_by_label("explanation (colours the text)").click()
            page.get_by_role("option", name="Integrated gradients", exact=True).click()
            page.wait_for_function("() => document.body.innerText.includes('Integrated gradients toward')",
                                   timeout=120_000)
            shot("classify", 2300)

            if width != 1400:  # the narrow set: each tab once, and the model view
                tab("Generate")
                panel().get_by_role("button", name="Generate", exact=True).click()
                wait_for_plots(page, 3, timeout=120_000)
                shot("generate", 2300)
                model_view_shot(page, panel, shot)
            elif (ROOT / "checkpoints" / "gpt-tiny").is_dir():  # the Generate tab's model ships with its issue
                generate_shots(page, panel, tab, shot)

            vision_shots(page, panel, tab, shot)
            describe_shots(page, panel, tab, shot)

            tab("Attention playground")
            wait_for_plots(page, 2, timeout=60_000)
            shot("attention-playground", 1500)
            heads_shots(page, panel, tab, shot)
            if width == 1400:
                lesson_shots(page, panel, tab, shot)
            else:  # the narrow set: one lesson, its figure revealed
                lesson_shots(page, panel, tab, shot, only=1)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    print(f"wrote {len(list(out.glob('*.png')))} screenshots to {out}")


if __name__ == "__main__":
    main()
