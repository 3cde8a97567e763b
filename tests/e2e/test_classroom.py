"""A class at once in a real browser (issue 51): a teacher page and three student pages in one Chromium. The teacher
opens a class; each student opens the class link, types a nickname, joins and sends a prediction; the teacher's
live chart shows 3 answers with the right count per choice; the teacher reveals, and every student page shows the
reveal with its own verdict."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tabs import lessons

from .helpers import open_tab

pytestmark = pytest.mark.e2e


def _new_page(browser, url: str):
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    page = context.new_page()
    page.js_errors = []
    page.on("pageerror", lambda exc: page.js_errors.append(str(exc)))
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector("button[role=tab]", timeout=60_000)
    return context, page


def _counts(page) -> dict[str, int]:
    """The bars the teacher's chart drew (Plotly's own record of them)."""
    return page.evaluate("""() => { const e = document.querySelector('#class-counts .js-plotly-plot');
      if (!e || !e._fullData) return {};
      const t = e._fullData[0]; const out = {};
      Array.from(t.y).forEach((label, i) => { out[label] = t.x[i]; }); return out; }""")


def test_a_teacher_and_three_students(browser, app_url: str) -> None:
    q = lessons.question(1, 1, "")  # lesson 1, step 1 (no trained model needed)
    picks = [q.choices[0], q.choices[0], q.choices[1]]
    contexts = []
    try:
        ctx, teacher = _new_page(browser, app_url)
        contexts.append(ctx)
        open_tab(teacher, "Lessons")
        teacher.get_by_text("A class at once: the room predicts together").click()
        teacher.get_by_role("button", name="Open a class on the step shown below").click()
        info = teacher.locator("#class-teacher-info")
        expect(info).to_contain_text("Join code", timeout=30_000)
        code = re.search(r"Join code: ([A-Z0-9]{6})", info.inner_text()).group(1)
        teacher.wait_for_function("() => location.search.includes('teacher=')", timeout=30_000)  # the teacher link
        assert f"class={code}" in teacher.url

        students = []
        for i, pick in enumerate(picks):
            ctx, page = _new_page(browser, f"{app_url}?tab=lessons&class={code}")
            contexts.append(ctx)
            nickname = page.get_by_label("your nickname (only the teacher sees it)")
            expect(nickname).to_be_visible(timeout=30_000)  # the link opened the class section
            expect(page.get_by_label("join code")).to_have_value(code)
            nickname.fill(f"<i>student {i}</i>")
            page.get_by_role("button", name="Join the class").click()
            mine = page.locator("#class-student-info")
            expect(mine).to_contain_text(f"as <i>student {i}</i>", timeout=30_000)  # escaped: shown as typed
            expect(page.get_by_role("button", name="Check my prediction")).to_be_hidden()
            page.get_by_label(pick, exact=True).check()
            page.get_by_role("button", name="Send my prediction to the class").click()
            expect(mine).to_contain_text(f"your prediction {pick} is in", timeout=30_000)
            students.append(page)

        want = {c: picks.count(c) for c in q.choices}
        teacher.wait_for_function("""(want) => { const e = document.querySelector('#class-counts .js-plotly-plot');
          if (!e || !e._fullData) return false; const t = e._fullData[0];
          return Array.from(t.y).every((label, i) => t.x[i] === want[label]); }""", arg=want, timeout=30_000)
        assert _counts(teacher) == want
        expect(info).to_contain_text("3 students joined", timeout=10_000)
        expect(info).to_contain_text("3 answered")
        for i in range(3):  # counts on the teacher's page, never a name
            assert f"student {i}" not in teacher.locator("#class-counts").inner_text()

        teacher.get_by_role("button", name="Reveal to the class").click()
        expect(teacher.get_by_text(f"The numbers say {q.answer}")).to_be_visible(timeout=30_000)
        for page, pick in zip(students, picks, strict=True):
            verdict = "correct" if pick == q.answer else "not quite"
            expect(page.locator("#class-student-info")).to_contain_text("revealed", timeout=30_000)
            expect(page.get_by_text(verdict).first).to_be_visible(timeout=30_000)
            expect(page.get_by_text(q.fact).first).to_be_visible()
            for other in range(3):  # no other student's nickname anywhere on a student's page
                if page is not students[other]:
                    assert f"student {other}</i>" not in page.content()
        for page in [teacher, *students]:
            assert page.js_errors == []
    finally:
        for ctx in contexts:
            ctx.close()


def test_presenter_view_from_the_link_and_the_toggle(browser, app_url: str) -> None:
    """?present=1 opens the presenter view (large type, intros folded, one figure per step); the toggle turns it
    off and the link follows."""
    ctx, page = _new_page(browser, f"{app_url}?tab=lessons&present=1")
    try:
        toggle = page.get_by_label("presenter view (large type for a projector)")
        expect(toggle).to_be_checked(timeout=30_000)
        page.wait_for_function("() => document.body.classList.contains('atlas-present')", timeout=30_000)
        intro = page.locator("div.block.intro").filter(has_text="Predict, then reveal")
        expect(intro).to_be_hidden()
        size = page.evaluate("() => parseFloat(getComputedStyle(document.querySelector('.prose')).fontSize)")
        assert size >= 22  # 1.45rem
        # one figure per step: the scores shown before predicting, then only the revealed figure
        q = lessons.question(1, 1, "")
        page.get_by_role("button", name="Start the lesson").click()
        before = page.locator("#lessons-before .js-plotly-plot")
        expect(before).to_be_visible(timeout=30_000)
        page.get_by_label(q.answer, exact=True).check()
        page.get_by_role("button", name="Check my prediction").click()
        expect(page.locator("#lessons-revealed .js-plotly-plot")).to_be_visible(timeout=30_000)
        expect(before).to_be_hidden()
        toggle.uncheck()
        page.wait_for_function("() => !document.body.classList.contains('atlas-present')", timeout=30_000)
        expect(intro).to_be_visible()
        expect(before).to_be_visible()  # both figures again outside the presenter view
        page.wait_for_function("() => !location.search.includes('present=')", timeout=30_000)
        assert page.js_errors == []
    finally:
        ctx.close()
