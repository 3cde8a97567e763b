"""Every model tab in a real browser, as a new user would use it: type or upload, run, change views."""

from __future__ import annotations

import re
import time

import pytest
from PIL import Image, ImageDraw
from playwright.sync_api import expect

from serving import catalogue, store

from .helpers import (
    click_cell,
    clipped_figures,
    cut_titles,
    figures,
    generate_in_tab,
    open_tab,
    overlapping_labels,
    plot_signature,
    screenshot,
    sideways_figures,
    titles,
    visible_plots,
    wait_for_change,
    wait_for_plots,
    wait_for_title,
)

pytestmark = pytest.mark.e2e


def _panel(page):
    return page.locator("div[role=tabpanel]:visible")


def _set_number(page, label: str, value: int) -> None:
    box = _panel(page).get_by_label(f"number input for {label}")
    box.fill(str(value))
    box.press("Enter")


def _pick(page, label: str, option: str) -> None:
    _panel(page).get_by_label(label).click()
    page.get_by_role("option", name=option, exact=True).click()


def test_translate_tab(page) -> None:
    open_tab(page, "Translate")
    box = _panel(page).get_by_label("English sentence")
    box.fill("Two dogs are running on the beach.")
    _panel(page).get_by_role("button", name="Translate", exact=True).click()
    wait_for_plots(page, 4)
    out = _panel(page).get_by_label("German translation")
    page.wait_for_function("(el) => el.value.length > 0", arg=out.element_handle(), timeout=30_000)
    expect(_panel(page)).to_contain_text("Beam size 5", timeout=30_000)
    before = plot_signature(page)
    _panel(page).get_by_label("encoder", exact=True).check()
    wait_for_change(page, before)
    before = plot_signature(page)
    _panel(page).get_by_label("model view").check()
    wait_for_change(page, before)
    wait_for_title(page, lambda t: t.startswith("Encoder self-attention"))
    screenshot(page, "translate")
    page.set_viewport_size({"width": 700, "height": 1000})  # a narrow window: wide figures scroll, never clip
    page.wait_for_timeout(500)
    assert clipped_figures(page) == []
    assert page.js_errors == []


def test_classify_tab_renders_html_as_text(page) -> None:
    open_tab(page, "Classify")
    box = _panel(page).get_by_label("text", exact=True)
    box.fill("<img src=x onerror=alert(1)> a warm , funny film .")
    _panel(page).get_by_role("button", name="Classify", exact=True).click()
    wait_for_plots(page, 3)
    panel_text = _panel(page).inner_text()
    assert "positive" in panel_text or "negative" in panel_text
    # The HTML-like input is shown as text in the highlight, never turned into an element.
    assert page.locator("img[src=x]").count() == 0
    shown = re.sub(r"\s|▁", "", page.locator(".atlas-highlight").inner_text())
    assert "onerror" in shown and "<unk>" in shown  # tokens, angle brackets included, shown as text
    before = plot_signature(page)
    _pick(page, "head (or fusion of heads)", "1")
    wait_for_change(page, before)
    # The deletion curve follows the answer: every explanation a line, and a random order.
    wait_for_title(page, lambda t: t.startswith("Deletion curve"), timeout=60)
    curve = next(f for f in figures(page) if any((t["name"] or "").startswith("random order") for t in f))
    assert len(curve) == 6 and all(max(t["x"]) == 1 for t in curve)
    # Another explanation recolours the text (signed: integrated gradients can speak against the class).
    colours = page.locator(".atlas-highlight").inner_html()
    _pick(page, "explanation (colours the text)", "Integrated gradients")
    expect(page.locator(".atlas-highlight")).to_contain_text("Integrated gradients toward", timeout=30_000)
    assert page.locator(".atlas-highlight").inner_html() != colours
    screenshot(page, "classify")
    # The pretrained encoder: same figures, WordPiece tokens with [CLS] and [SEP].
    _panel(page).get_by_label("MiniLM (pretrained, fine-tuned)").check()
    box.fill("the film is warm and funny .")
    before = plot_signature(page)
    _panel(page).get_by_role("button", name="Classify", exact=True).click()
    wait_for_change(page, before)
    expect(page.locator(".atlas-highlight")).to_contain_text("[SEP]", timeout=30_000)
    page.set_viewport_size({"width": 700, "height": 1000})
    page.wait_for_timeout(500)
    assert clipped_figures(page) == []
    assert page.js_errors == []


def test_vision_tab_with_a_photo(page, tmp_path) -> None:
    # An ordinary photo-sized RGB image: a dark shoe-like shape on a light background.
    photo = tmp_path / "photo.jpg"
    img = Image.new("RGB", (1600, 1200), (235, 230, 220))
    draw = ImageDraw.Draw(img)
    draw.polygon([(300, 800), (1300, 800), (1300, 650), (900, 600), (700, 350), (350, 400)], fill=(60, 40, 30))
    img.save(photo, quality=90)
    open_tab(page, "Vision")
    _panel(page).locator("input[type=file]").set_input_files(str(photo))
    page.wait_for_timeout(1000)
    _panel(page).get_by_role("button", name="Classify image", exact=True).click()
    wait_for_plots(page, 5)
    seen = page.locator("#seen-image img")
    seen.wait_for(timeout=30_000)
    page.wait_for_timeout(500)
    box = seen.bounding_box()
    seen.click(position={"x": box["width"] * 0.2, "y": box["height"] * 0.8})
    # 28×28 input, 4-pixel patches: the click lands on patch row 5, column 1.
    wait_for_title(page, lambda t: t.startswith("Patch r5c1"))
    before = plot_signature(page)
    _panel(page).get_by_label("rollout").check()
    wait_for_change(page, before)
    wait_for_title(page, lambda t: t.startswith("Deletion curve"), timeout=60)
    wait_for_title(page, lambda t: t.startswith("Attention rollout · same for all classes"))
    before = plot_signature(page)
    _pick(page, "explanation", "Gradient × input")
    wait_for_change(page, before)
    wait_for_title(page, lambda t: t.startswith("Gradient × input toward"))
    screenshot(page, "vision-vit")
    _panel(page).get_by_label("swin-fashion").check()
    before = plot_signature(page)
    _panel(page).get_by_role("button", name="Classify image", exact=True).click()
    wait_for_change(page, before)
    screenshot(page, "vision-swin")
    assert page.js_errors == []


def test_swin_windows_tab(page) -> None:
    open_tab(page, "Swin windows")
    wait_for_plots(page, 5)
    before = plot_signature(page)
    _set_number(page, "window size", 2)
    wait_for_change(page, before)
    expect(_panel(page)).to_contain_text("16 windows of 2×2", timeout=30_000)
    _panel(page).get_by_role("button", name="Show the trained Swin").click()
    wait_for_plots(page, 7)
    screenshot(page, "swin-windows")
    assert page.js_errors == []


def test_positional_tab(page) -> None:
    open_tab(page, "Positional encoding")
    wait_for_plots(page, 5)
    heat = next(f for f in figures(page) if f[0]["type"] == "heatmap")
    assert len(heat[0]["z"]) == 64
    before = plot_signature(page)
    _set_number(page, "positions", 32)
    wait_for_change(page, before)
    _panel(page).get_by_role("button", name="Show the ViT's position embeddings").click()
    wait_for_plots(page, 6)
    assert visible_plots(page) >= 6
    screenshot(page, "positional")
    assert page.js_errors == []


def test_generate_tab(page) -> None:
    open_tab(page, "Generate")
    _panel(page).get_by_label("prompt").fill("Two dogs are running on the")
    _panel(page).get_by_role("button", name="Generate", exact=True).click()
    wait_for_plots(page, 3)
    expect(_panel(page)).to_contain_text("20 new tokens", timeout=30_000)
    assert page.locator(".atlas-generation").count() == 1
    before = plot_signature(page)
    _pick(page, "head (or fusion of heads)", "1")
    wait_for_change(page, before)
    before = plot_signature(page)
    _panel(page).get_by_label("model view").check()
    wait_for_change(page, before)
    before = plot_signature(page)
    _set_number(page, "replay: show the tokens up to generated token (0 = all)", 3)
    wait_for_change(page, before)
    wait_for_title(page, lambda t: "up to token" in t)
    _panel(page).get_by_role("button", name="Switch the head off").click()
    expect(_panel(page)).to_contain_text("switched off", timeout=30_000)
    before = plot_signature(page)
    _panel(page).get_by_role("button", name="Repeated random tokens").click()
    wait_for_change(page, before)
    expect(_panel(page)).to_contain_text("strongest induction", timeout=30_000)
    wait_for_title(page, lambda t: t.startswith("Head roles"))
    screenshot(page, "generate")
    page.set_viewport_size({"width": 700, "height": 1000})
    page.wait_for_timeout(500)
    assert clipped_figures(page) == []
    assert page.js_errors == []


def test_why_a_head_attends_patching_and_compare(page) -> None:
    """Generate, then: click a cell of one head's heatmap and see its score split (the terms sum to the score in
    the title, the row's softmax is the clicked row); run the patching sweep and click a head; compare two inputs."""
    generate_in_tab(page)
    panel = _panel(page)
    before = plot_signature(page)
    _pick(page, "head (or fusion of heads)", "1")
    wait_for_change(page, before)
    attention = next(f for f, t in zip(figures(page), titles(page)) if t.startswith("Decoder self-attention"))
    n = len(attention[0]["z"])
    click_cell(page, "generate-attention", n - 1, 2)
    wait_for_title(page, lambda t: t.startswith("Why layer"))
    expect(panel).to_contain_text(f"query {n - 1}", timeout=30_000)
    expect(panel).to_contain_text("→ key 2", timeout=30_000)
    split = next(f for f, t in zip(figures(page), titles(page)) if t.startswith("Why layer"))
    terms = sum(sum(row) for row in split[0]["z"])
    shown_row = attention[0]["z"][n - 1]
    bars = next(t for t in split if t["type"] == "bar")["y"]
    assert abs(sum(bars) - 1) < 1e-3 and max(abs(a - b) for a, b in zip(bars, shown_row)) < 1e-3
    summary = panel.inner_text()
    score = float(re.search(r"Score (-?[0-9.]+)", summary).group(1))
    assert abs(terms - score) < 2e-3, (terms, score)
    panel.get_by_role("button", name="Ablate the sink (this head may not attend to the first token)").click()
    expect(panel).to_contain_text("forbidden its first token", timeout=30_000)

    panel.get_by_role("button", name="Induction example: first copy replaced").click()
    wait_for_title(page, lambda t: t.startswith("Activation patching"))
    sweep = next(f for f, t in zip(figures(page), titles(page)) if t.startswith("Activation patching"))
    layers = len(sweep[0]["z"])
    click_cell(page, "generate-patch", layers - 1, 1)
    wait_for_title(page, lambda t: t.startswith(f"Clean input · layer {layers - 1} · head 1"))

    panel.get_by_label("compare with a second input (B)").check()
    panel.get_by_label("input B", exact=True).fill("Two cats are running on the")
    panel.get_by_role("button", name="Compare", exact=True).click()
    wait_for_title(page, lambda t: t.startswith("B − A"))
    expect(panel).to_contain_text("tokens of B are shared with A", timeout=30_000)
    screenshot(page, "generate-why")
    assert page.js_errors == []


def test_lessons_walk_start_to_end(page, tiny_checkpoints, monkeypatch) -> None:
    """Every lesson from its first step to its last, as a student: one right and one wrong prediction in each,
    the verdict checked against the answer and the numbers the model gives (computed here over the same tiny
    checkpoints), the figure revealed only after the prediction, progress counted."""
    from serving import classroom
    from tabs import lessons

    # a class left open by an earlier browser test holds its step's answer from every page (tabs/course/course.py,
    # `guarded`): this walk is a student working alone, so no class is open
    with classroom.get_store().engine.begin() as conn:
        conn.execute(classroom.classes.update().values(closed=True))
    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    open_tab(page, "Lessons")
    panel = _panel(page)
    for number, lesson in enumerate(lessons.LESSONS, 1):
        _pick(page, "lesson", lesson.title)
        panel.get_by_role("button", name="Start the lesson").click()
        for step in range(1, len(lesson.steps) + 1):
            q = lessons.question(number, step, lesson.default)
            # (lesson 6 step 4 transcribes three clips with the real Whisper on its first call: more room)
            expect(panel).to_contain_text(f"step {step} of {len(lesson.steps)}", timeout=120_000)
            assert not [t for t in titles(page) if "your prediction" in t]  # nothing revealed before predicting
            wrong = next(c for c in q.choices if c != q.answer)
            guess = wrong if step == 2 else q.answer
            panel.get_by_label(guess, exact=True).check()
            panel.get_by_role("button", name="Check my prediction").click()
            expect(panel).to_contain_text("not quite" if guess == wrong else "correct", timeout=30_000)
            expect(panel).to_contain_text(q.fact, timeout=30_000)
            wait_for_title(page, lambda t, g=guess: "your prediction" in t and g.split(" · ")[-1][:6] in t)
            if step < len(lesson.steps):
                panel.get_by_role("button", name="next step →").click()
        expect(panel).to_contain_text(f"your score {len(lesson.steps) - 1} of {len(lesson.steps)}", timeout=30_000)
    assert page.js_errors == []


def test_error_messages_show_angle_brackets_as_text(page) -> None:
    """An error that quotes the input (here an unknown class with markup in it) shows it as text, not HTML."""
    open_tab(page, "Classify")
    panel = _panel(page)
    panel.get_by_label("target (empty: where the predictions differ)").fill("<b>shouty</b> <urlopen error [Errno 111]>")
    panel.get_by_role("button", name="Patch", exact=True).click()
    toast = page.locator(".toast-message-text").filter(has_text="Unknown class")
    expect(toast.first).to_contain_text("<b>shouty</b> <urlopen error [Errno 111]>", timeout=30_000)
    assert page.js_errors == []


def test_long_generation_wraps_and_ablation_measures_a_real_step(page) -> None:
    """A 300-word prompt wraps inside its box (it was one unscrollable line); switching a head off right after
    generating measures the prediction after the prompt, and says so."""
    open_tab(page, "Generate")
    panel = _panel(page)
    panel.get_by_label("prompt").fill("a dog runs on the grass " * 50)
    panel.get_by_role("button", name="Generate", exact=True).click()
    wait_for_plots(page, 3)
    box = page.locator(".atlas-generation").first
    box.wait_for(timeout=30_000)
    width = box.evaluate("e => [e.scrollWidth, e.clientWidth, e.getBoundingClientRect().height]")
    assert width[0] <= width[1] + 8, width  # it was one 6,000-px line
    panel.get_by_role("button", name="Switch the head off").click()
    expect(panel).to_contain_text("after the prompt (the step that chose generated token 1", timeout=30_000)
    assert page.js_errors == []


def test_cross_attention_rows_name_the_token_each_step_produced(page) -> None:
    """Row t of cross-attention is the step that produced German token t + 1: rows are labelled "→ token" (they were
    labelled with the token the decoder had just read, <s> first, against the caption)."""
    open_tab(page, "Translate")
    panel = _panel(page)
    panel.get_by_role("button", name="Translate", exact=True).click()
    wait_for_title(page, lambda t: t.startswith("Cross-attention (target → source)"))
    cross = next(f for f, t in zip(figures(page), titles(page)) if t.startswith("Cross-attention (target → source)"))
    rows = [str(y) for y in cross[0]["y"]]
    assert all("→" in y for y in rows) and "&lt;s&gt;" not in rows[0] and rows[-1].endswith("→ &lt;/s&gt;"), rows
    assert page.js_errors == []


def test_choices_say_what_they_can_do_before_the_button(page) -> None:
    """Choosing a Hub model offline says so at once; the class to explain is a list of the model's own classes that
    follows the task and re-explains when picked (it was free text that ignored Enter)."""
    open_tab(page, "Generate")
    _panel(page).get_by_role("combobox", name="model").click()
    page.get_by_role("option", name="openai-community/gpt2", exact=True).click()
    expect(_panel(page)).to_contain_text("Not available offline", timeout=30_000)
    open_tab(page, "Classify")
    panel = _panel(page)
    panel.get_by_role("button", name="Classify", exact=True).click()
    wait_for_plots(page, 3)
    panel.get_by_label("explain the class").click()
    options = [o.replace("✓", "").strip() for o in page.get_by_role("option").all_inner_texts()]  # ✓: chosen
    assert options == ["the predicted class", "negative", "positive"], options
    page.get_by_role("option", name="negative", exact=True).click()
    expect(panel.locator(".highlight").first).to_contain_text("(p(negative) = ", timeout=30_000)
    panel.get_by_label("AG News topic").check()
    panel.get_by_label("explain the class").click()
    expect(page.get_by_role("option", name="Sci/Tech", exact=True)).to_be_visible(timeout=30_000)
    assert page.js_errors == []


def test_beam_tree_shows_the_slots_it_kept_and_says_what_colours_mean(page) -> None:
    """The slots past the beam width are used where hypotheses finish, and the subtitle says so (they looked like
    empty slots 5–7); colours and squares are explained."""
    open_tab(page, "Translate")
    _panel(page).get_by_role("button", name="Translate", exact=True).click()
    wait_for_title(page, lambda t: t.startswith("Beam search (beam size 5)"))
    y_range, title, slots = page.evaluate("""() => { const el = [...document.querySelectorAll('.js-plotly-plot')]
        .find(e => e.offsetParent && (e._fullLayout.title.text || '').startsWith('Beam search'));
        const nodes = el._fullData.find(t => t.name === 'candidate'), y = el._fullLayout.yaxis;
        return [y.range, el._fullLayout.title.text, Math.max(...nodes.y)]; }""")
    assert max(y_range) == slots + 0.5 and -1 < min(y_range) < 0, (y_range, slots)  # no slot past the last used
    assert slots < 5 or "keeps the beam full" in title, title
    assert "cumulative log-probability" in title and "chosen translation" in title
    assert page.js_errors == []


def test_swin_offers_only_what_applies(page) -> None:
    """Choosing Swin leaves only the gradient explanations and turns the CLS / rollout switch off, saying why (it
    kept a rollout label while drawing gradient × input, and the switch changed nothing)."""
    open_tab(page, "Vision")
    panel = _panel(page)
    panel.get_by_label("swin-fashion").check()
    # the switch and the choices come in one answer to the model's change: wait for it before reading the choices
    expect(panel.get_by_label("rollout", exact=True)).to_be_disabled(timeout=30_000)
    expect(panel).to_contain_text("Swin has no CLS token", timeout=30_000)
    panel.get_by_label("explanation", exact=True).click()
    options = [o.replace("✓", "").strip() for o in page.get_by_role("option").all_inner_texts()]
    assert options == ["Gradient × input", "Integrated gradients"], options
    page.keyboard.press("Escape")
    panel.get_by_label("vit-fashion").check()
    expect(panel.get_by_label("rollout", exact=True)).to_be_enabled(timeout=30_000)
    assert page.js_errors == []


def test_errors_toast_once_without_badges_and_go_when_the_next_request_works(page) -> None:
    """Pressing a button that fails twice shows one toast (they stacked into "Error (2)"), no red "Error" badge sits
    over the outputs, and the toast is gone once a request that works is made."""
    open_tab(page, "Vision")
    panel = _panel(page)
    button = panel.get_by_role("button", name="Classify image", exact=True)
    button.click()
    toast = page.locator(".toast-message-text").filter(has_text="upload an image")
    expect(toast.first).to_be_visible(timeout=30_000)
    button.click()
    page.wait_for_timeout(1500)
    assert toast.count() == 1
    badges = page.locator('[data-testid="status-tracker"] .error')
    assert badges.count() > 0 and all(not b.is_visible() for b in badges.all())  # Gradio marks them; none shows
    panel.get_by_role("button", name="8-bag-t10k-18.png").click()
    button.click()
    wait_for_plots(page, 5)
    expect(toast).to_have_count(0)
    assert page.js_errors == []


def test_long_inputs_translate_by_sentence_and_label_every_token(page) -> None:
    """A text over the translator's 128 positions is translated sentence by sentence, and says so (it was cut
    and translated as garbage); a 128-token heatmap labels in readable type (it labelled every other one in 9 px
    type), as many tokens as fit its column: every other one, 12 px apart (issue 75, item 4: every one of 128 made a
    1,580 px figure that scrolled sideways in a 1,216 px column)."""
    open_tab(page, "Translate")
    panel = _panel(page)
    panel.get_by_label("English sentence").fill("A dog runs on the beach. Two girls play in the park. " * 12)
    panel.get_by_role("button", name="Translate", exact=True).click()
    expect(panel).to_contain_text("sentences was translated on its own", timeout=60_000)
    open_tab(page, "Classify")
    panel = _panel(page)
    panel.get_by_label("text", exact=True).fill("a warm , funny and beautifully acted film . " * 30)
    before = plot_signature(page)
    panel.get_by_role("button", name="Classify", exact=True).click()
    wait_for_change(page, before)
    page.wait_for_timeout(1000)
    ticks = page.evaluate("""() => [...document.querySelectorAll('#classify-attention .js-plotly-plot')]
        .filter(e => e.offsetParent).map(e => [e._fullLayout.xaxis.tickvals.length, e._fullLayout.yaxis.tickvals.length,
                                             e._fullLayout.xaxis.tickfont.size, e._fullData[0].z.length])""")
    assert ticks and ticks[0][3] == 128 and ticks[0][:2] == [64, 64] and ticks[0][2] >= 10, ticks
    assert clipped_figures(page) == [] and sideways_figures(page) == []
    assert page.js_errors == []


def test_positional_says_what_it_ignored_and_no_title_is_cut(page) -> None:
    open_tab(page, "Positional encoding")
    wait_for_plots(page, 5)
    box = _panel(page).get_by_label("dimensions to plot as curves")
    box.fill("0, abc, 500")
    box.press("Enter")
    wait_for_title(page, lambda t: "ignored abc, 500" in t)
    _panel(page).get_by_role("button", name="Show the ViT's position embeddings").click()
    wait_for_title(page, lambda t: "learned position embeddings" in t)
    open_tab(page, "Attention playground")
    wait_for_plots(page, 2)
    assert cut_titles(page) == []
    home = page.url.split("?")[0]
    for width in (1024, 1400):  # a page opened on a laptop's screen and on a wide one
        page.set_viewport_size({"width": width, "height": 1000})
        page.goto(home, wait_until="domcontentloaded")
        page.wait_for_selector("button[role=tab]", timeout=60_000)
        for tab, figures_drawn in (("Positional encoding", 5), ("Attention playground", 2)):
            open_tab(page, tab)
            wait_for_plots(page, figures_drawn, timeout=120_000)
            deadline = time.monotonic() + 15  # Plotly lays a figure out again once its column has its width
            while (found := (cut_titles(page), overlapping_labels(page))) != ([], []) and time.monotonic() < deadline:
                page.wait_for_timeout(250)
            assert found == ([], []), (width, tab, found)
    assert page.js_errors == []


@pytest.mark.parametrize("width", [1400, 1024])
def test_head_roles_and_the_stripe_fit_or_scroll_visibly(page, width: int) -> None:
    """Issue 48, item 6: head roles lost its colour bar at 1400 px and its fourth panel at 1024 px, and the
    induction stripe (1,310 px in a 600 px box) was cut off: the boxes scrolled, with an overlay scrollbar that
    showed nothing. Both now take their box's width (the stripe a row of its own)."""
    page.set_viewport_size({"width": width, "height": 1000})
    open_tab(page, "Generate")
    panel = _panel(page)
    panel.get_by_role("button", name="Repeated random tokens").click()
    wait_for_title(page, lambda t: t.startswith("Induction stripe"), timeout=90)
    wait_for_title(page, lambda t: t.startswith("Head roles"), timeout=30)
    page.wait_for_timeout(1000)
    assert clipped_figures(page) == []
    fits = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].filter(e => e.offsetParent
        && e._fullLayout && /^(Head roles|Induction stripe)/.test(e._fullLayout.title.text || ''))
        .map(e => [e._fullLayout.width, e.parentElement.clientWidth])""")
    assert len(fits) == 2 and all(w <= box + 1 for w, box in fits), fits
    screenshot(page, f"generate-roles-{width}")
    assert page.js_errors == []


def test_a_paragraph_keeps_every_sentence_and_the_picker_draws_each(page) -> None:
    """Issue 48, item 1: a paragraph of short sentences came back as one sentence, silently. Every sentence is
    translated, the figures say which sentence they show, and the picker redraws them for another sentence."""
    open_tab(page, "Translate")
    panel = _panel(page)
    panel.get_by_label("English sentence").fill("A dog runs on the beach. Two girls play in the park. A man sleeps.")
    panel.get_by_role("button", name="Translate", exact=True).click()
    expect(panel).to_contain_text("Each of its 3 sentences was translated on its own", timeout=60_000)
    wait_for_title(page, lambda t: t.startswith("Sentence 1 of 3 · "), timeout=60)
    _pick(page, "sentence the figures show", "2 · Two girls play in the park.")
    wait_for_title(page, lambda t: t.startswith("Sentence 2 of 3 · "), timeout=60)
    expect(panel).to_contain_text("The figures show sentence 2 of 3", timeout=30_000)
    assert not any(t.startswith("Sentence 1 of 3") for t in titles(page))
    assert page.js_errors == []


# The revealed figure of a lesson as drawn: its box, plot area, colour bars and tick labels (a pair of labels of one
# axis drawn over each other counts).
_REVEALED = """() => { const e = document.querySelector('#lessons-revealed .js-plotly-plot');
  const box = e.parentElement.getBoundingClientRect(), fig = e.getBoundingClientRect();
  const bars = [...e.querySelectorAll('.colorbar')].map(c => c.querySelector('.cbfills, rect.cbbg')
    .getBoundingClientRect()).map(r => [r.width, r.height]);
  const areas = [...e.querySelectorAll('.subplot .bg, .nsewdrag')].map(r => r.getBoundingClientRect().width);
  const overlaps = [];
  for (const axis of e.querySelectorAll('.xtick, .ytick').length ? ['xtick', 'ytick'] : []) {
    for (const layer of e.querySelectorAll('.' + axis.slice(0, 1) + 'axislayer-above')) {
      const r = [...layer.querySelectorAll('.' + axis + ' text')].map(t => t.getBoundingClientRect())
        .filter(b => b.width > 0);
      r.forEach((a, i) => r.slice(i + 1).forEach(b => {
        if (a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1)
          overlaps.push(axis); }));
    }
  }
  return {box: box.width, figure: fig.width, widest: Math.max(...areas), bars, overlaps,
          horizontal: e._fullData.filter(t => t.showscale).every(t => t.colorbar.orientation === 'h')}; }"""


@pytest.mark.parametrize("lesson,step,share", [(1, 1, 0.35), (4, 2, 0.6)])  # eight subplots two to a row; one map
def test_a_revealed_figure_is_readable_on_a_phone(page, app_url, tiny_checkpoints, monkeypatch, lesson: int,
                                                  step: int, share: float) -> None:
    """Issue 61, item 6: at 390 px the revealed figure was a postage stamp with overlapping tick labels and a colour
    bar wider than the map. On a phone it now takes the box's width, its colour bars lie under the map (horizontal,
    no wider than the plot), and no two tick labels or titles of it are drawn over each other."""
    from tabs import lessons

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    page.set_viewport_size({"width": 390, "height": 900})
    page.goto(app_url + "?tab=lessons", wait_until="domcontentloaded")  # a phone's tab bar folds the tabs away
    panel = _panel(page)
    _pick(page, "lesson", lessons.LESSONS[lesson - 1].title)
    panel.get_by_role("button", name="Start the lesson").click()
    expect(panel).to_contain_text("step 1 of", timeout=60_000)
    for k in range(2, step + 1):
        panel.get_by_role("button", name="next step →").click()
        expect(panel).to_contain_text(f"step {k} of", timeout=60_000)
    q = lessons.question(lesson, step)
    panel.get_by_role("radio", name=q.choices[0], exact=True).check()
    panel.get_by_role("button", name="Check my prediction").click()
    page.wait_for_function("""() => { const e = document.querySelector('#lessons-revealed .js-plotly-plot');
        return e && e._fullLayout && e._atlasPhoneWidth; }""", timeout=60_000)
    page.wait_for_timeout(1000)
    drawn = page.evaluate(_REVEALED)
    assert drawn["figure"] <= drawn["box"] + 1 and drawn["figure"] >= drawn["box"] - 2, drawn  # the box's width
    assert drawn["widest"] >= share * drawn["box"], drawn  # a plot area, not a postage stamp
    assert drawn["horizontal"] and drawn["bars"], drawn
    assert all(w <= drawn["figure"] and w > h for w, h in drawn["bars"]), drawn
    assert drawn["overlaps"] == [], drawn
    assert overlapping_labels(page) == [] and clipped_figures(page) == []
    width = "() => document.querySelector('#lessons-revealed .js-plotly-plot')._fullLayout.width"
    page.set_viewport_size({"width": 1200, "height": 900})  # turned sideways or a wider window: the figure as sent
    page.wait_for_function(f"() => ({width})() > 600", timeout=10_000)
    page.set_viewport_size({"width": 390, "height": 900})
    page.wait_for_function(f"() => ({width})() < 400", timeout=10_000)
    assert page.evaluate("() => window._atlasPhoned") <= 6  # drawn once per figure and width, never in a loop
    assert page.js_errors == []
