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


@pytest.fixture(autouse=True)
def close_the_servers_classes():
    """A class a test opens through the server holds its step's answer on every page of that server, later tests'
    included (tabs/course/course.py, `guarded`: lesson 1 step 1 is refused while it is open): each test ends with
    every class closed, in the store the server shares with this process (ATLAS_DATA, tests/conftest.py)."""
    yield
    from serving.classroom import classes, get_store

    with get_store().engine.begin() as conn:
        conn.execute(classes.update().values(closed=True))


def _new_page(browser, url: str, width: int = 1300):
    context = browser.new_context(viewport={"width": width, "height": 1000})
    page = context.new_page()
    page.js_errors = []
    page.on("pageerror", lambda exc: page.js_errors.append(str(exc)))
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector("button[role=tab]", timeout=60_000)
    return context, page


def _open_class(teacher):
    """Open a class from the teacher's page: (the teacher's info, the join code)."""
    teacher.get_by_text("A class at once: teach a class").click()
    teacher.get_by_role("button", name="Open a class on the step shown below").click()
    info = teacher.locator("#class-teacher-info")
    expect(info).to_contain_text("Join code", timeout=30_000)
    return info, re.search(r"Join code: ([A-Z0-9]{6})", info.inner_text()).group(1)


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
        info, code = _open_class(teacher)
        teacher.wait_for_function("() => location.search.includes('teacher=')", timeout=30_000)  # the teacher link
        assert f"class={code}" in teacher.url

        students = []
        for i, pick in enumerate(picks):
            ctx, page = _new_page(browser, f"{app_url}?tab=lessons&class={code}")
            contexts.append(ctx)
            nickname = page.get_by_label("your nickname (only the teacher sees it)")
            expect(nickname).to_be_visible(timeout=30_000)  # the link opened the join box
            expect(page.get_by_label("join code")).to_have_value(code)
            expect(page.get_by_role("button", name="Open a class on the step shown below")).to_be_hidden()
            nickname.fill(f"<i>student {i}</i>")
            page.get_by_role("button", name="Join the class").click()
            mine = page.locator("#class-student-info")
            expect(mine).to_contain_text(f"as <i>student {i}</i>", timeout=30_000)  # escaped: shown as typed
            expect(page.get_by_role("button", name="Check my prediction")).to_be_hidden()
            expect(page.get_by_role("button", name="Start the lesson")).to_be_hidden()  # the class drives the page
            page.get_by_label(pick, exact=True).check()
            send = page.get_by_role("button", name="Send my prediction to the class")
            send.click()
            expect(mine).to_contain_text(f"your prediction {pick} is in", timeout=30_000)
            expect(send).to_be_disabled()
            other = next(c for c in q.choices if c != pick)
            page.get_by_label(other, exact=True).click()  # a second pick is said, and the first one shown again
            expect(mine).to_contain_text("is the one recorded", timeout=30_000)
            expect(page.get_by_label(pick, exact=True)).to_be_checked()
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
            expect(page.get_by_text(f"your score {int(pick == q.answer)} of 3").first).to_be_visible()
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


def test_a_phone_joins_with_mistakes_said_on_the_page(browser, app_url: str) -> None:
    """At 390 px a class link shows the join box first and no teacher control; a wrong code, an empty nickname and a
    wrong teacher link are said on the page (class events skip the queue, where a raised error left the page blank);
    the presenter view's address holds no teacher token (issue 61, items 1 and 3)."""
    contexts = []
    try:
        ctx, teacher = _new_page(browser, f"{app_url}?tab=lessons")
        contexts.append(ctx)
        info, code = _open_class(teacher)
        teacher.wait_for_function("() => location.search.includes('teacher=')", timeout=30_000)
        teacher.get_by_label("presenter view (large type for a projector)").check()
        teacher.wait_for_function(
            "() => location.search.includes('present=1') && !location.search.includes('teacher=')", timeout=30_000)
        assert f"class={code}" in teacher.url

        ctx, page = _new_page(browser, f"{app_url}?tab=lessons&class={code}", width=390)
        contexts.append(ctx)
        box = page.locator("#class-join")
        nickname = page.get_by_label("your nickname (only the teacher sees it)")
        expect(nickname).to_be_visible(timeout=30_000)
        intro = page.locator("div.block.intro").filter(has_text="Predict, then reveal")
        assert box.bounding_box()["y"] < intro.bounding_box()["y"]  # the join box before anything else of the tab
        assert box.bounding_box()["y"] < 700  # on the first screen of a phone
        expect(page.get_by_role("button", name="Open a class on the step shown below")).to_be_hidden()
        mine = page.locator("#class-student-info")
        page.get_by_role("button", name="Join the class").click()  # no nickname
        expect(mine).to_contain_text("Type a nickname", timeout=30_000)
        page.get_by_label("join code").fill("ZZZZZZ" if code != "ZZZZZZ" else "YYYYYY")
        nickname.fill("ann")
        page.get_by_role("button", name="Join the class").click()
        expect(mine).to_contain_text("No class has this join code", timeout=30_000)
        page.get_by_label("join code").fill(code)
        page.get_by_role("button", name="Join the class").click()
        expect(mine).to_contain_text("as ann", timeout=30_000)

        ctx, forged = _new_page(browser, f"{app_url}?tab=lessons&class={code}&teacher={'x' * 43}")
        contexts.append(ctx)
        expect(forged.get_by_text("This teacher link is not valid").first).to_be_visible(timeout=30_000)
        expect(forged.get_by_role("button", name="Reveal to the class")).to_be_hidden()
        for p in (teacher, page, forged):
            assert p.js_errors == []
    finally:
        for ctx in contexts:
            ctx.close()


def test_the_projected_screen_and_the_teachers_new_tools(browser, app_url: str) -> None:
    """Issue 61, item 11: the projected screen shows a QR code of the join link and the join code in very large type;
    the teacher's own screen (not the presenter view) names who has not answered; a step asked again lets a student
    answer anew; the summary per question is shown and downloaded."""
    from tests.test_classroom_tab import _decode_qr

    q = lessons.question(1, 1, "")
    contexts = []
    try:
        ctx, teacher = _new_page(browser, f"{app_url}?tab=lessons")
        contexts.append(ctx)
        info, code = _open_class(teacher)
        room = teacher.locator("#class-room")
        expect(room.locator(".atlas-join-code")).to_have_text(code, timeout=30_000)
        qr_svg = room.locator(".atlas-join-qr svg").evaluate("(e) => e.outerHTML")
        assert _decode_qr(qr_svg) == f"{app_url}?tab=lessons&class={code}"

        pages = []
        for name in ("ann", "bob"):
            ctx, page = _new_page(browser, f"{app_url}?tab=lessons&class={code}", width=390)
            contexts.append(ctx)
            page.get_by_label("your nickname (only the teacher sees it)").fill(name)
            page.get_by_role("button", name="Join the class").click()
            expect(page.locator("#class-student-info")).to_contain_text(f"as {name}", timeout=30_000)
            pages.append(page)
        missing = teacher.locator("#class-missing")
        expect(missing).to_contain_text("Not answered yet (2 of 2): ann, bob", timeout=30_000)
        wrong = next(c for c in q.choices if c != q.answer)
        pages[0].get_by_label(wrong, exact=True).check()
        pages[0].get_by_role("button", name="Send my prediction to the class").click()
        expect(missing).to_contain_text("Not answered yet (1 of 2): bob", timeout=30_000)

        teacher.get_by_label("presenter view (large type for a projector)").check()
        teacher.wait_for_function("() => document.body.classList.contains('atlas-present')", timeout=30_000)
        expect(missing).to_be_hidden()  # nicknames stay off the projected screen
        size = teacher.evaluate(
            "() => parseFloat(getComputedStyle(document.querySelector('.atlas-join-code')).fontSize)")
        assert size >= 64, size  # very large: read from the back of the room
        qr = room.locator(".atlas-join-qr svg").bounding_box()
        assert qr["width"] >= 200 and qr["height"] >= 200, qr

        teacher.get_by_role("button", name="Reveal to the class").click()
        expect(pages[0].get_by_text("not quite").first).to_be_visible(timeout=30_000)
        teacher.get_by_role("button", name="Ask this step again").click()
        expect(info).to_contain_text("Asked again", timeout=30_000)
        expect(pages[0].locator("#class-student-info")).to_contain_text("asks this step again", timeout=30_000)
        pages[0].get_by_label(q.answer, exact=True).check()
        send = pages[0].get_by_role("button", name="Send my prediction to the class")
        expect(send).to_be_enabled()
        send.click()
        expect(pages[0].locator("#class-student-info")).to_contain_text(f"your prediction {q.answer} is in",
                                                                        timeout=30_000)
        teacher.get_by_label("presenter view (large type for a projector)").uncheck()
        teacher.get_by_role("button", name="Download the answers and the summary (CSV)").click()
        summary = teacher.locator("#class-summary")
        expect(summary).to_contain_text("1 · 1 (asked 2×)", timeout=30_000)
        expect(summary).to_contain_text(f"{q.answer}: 1")
        for p in (teacher, *pages):
            assert p.js_errors == []
    finally:
        for ctx in contexts:
            ctx.close()


def test_the_presenter_link_survives_a_reload_and_opens_on_a_projector(browser, app_url: str) -> None:
    """Issue 75, item 2: with the presenter view on, the teacher's address is the class's presenter link (no
    teacher token); a reload of the teacher's page keeps the teacher's controls, and the same address opened in
    another browser (a projector) is the read-only presenter page: the join code, the room's counts as a student
    answers, the reveal when the teacher reveals, and no join box, teacher button or nickname."""
    q = lessons.question(1, 1, "")
    contexts = []
    try:
        ctx, teacher = _new_page(browser, f"{app_url}?tab=lessons")
        contexts.append(ctx)
        info, code = _open_class(teacher)
        expect(teacher.locator("#class-presenter-link")).to_contain_text("presenter=", timeout=30_000)
        teacher.get_by_label("presenter view (large type for a projector)").check()
        teacher.wait_for_function(
            "() => location.search.includes('presenter=') && !location.search.includes('teacher=')",
            timeout=30_000)
        link = teacher.url
        assert f"class={code}" in link and "present=1" in link

        teacher.reload(wait_until="domcontentloaded")
        reveal = teacher.get_by_role("button", name="Reveal to the class")
        expect(reveal).to_be_visible(timeout=60_000)  # the teacher's own browser: still the teacher
        teacher.wait_for_function("() => document.body.classList.contains('atlas-present')", timeout=30_000)

        ctx, screen = _new_page(browser, link)  # the projector: another browser, no teacher link kept
        contexts.append(ctx)
        expect(screen.locator("#class-room .atlas-join-code")).to_have_text(code, timeout=60_000)
        expect(screen.locator("#class-teacher-info")).to_contain_text("presenter screen")
        for hidden in ("Reveal to the class", "Next step for the class →", "Close the class",
                       "Open a class on the step shown below", "Join the class", "Check my prediction"):
            expect(screen.get_by_role("button", name=hidden)).to_be_hidden()
        screen.wait_for_function("() => document.body.classList.contains('atlas-present')", timeout=30_000)

        ctx, student = _new_page(browser, f"{app_url}?tab=lessons&class={code}", width=390)
        contexts.append(ctx)
        student.get_by_label("your nickname (only the teacher sees it)").fill("ann")
        student.get_by_role("button", name="Join the class").click()
        expect(student.locator("#class-student-info")).to_contain_text("as ann", timeout=30_000)
        student.get_by_label(q.choices[0], exact=True).check()
        student.get_by_role("button", name="Send my prediction to the class").click()
        screen.wait_for_function(
            """() => { const e = document.querySelector('#class-counts .js-plotly-plot');
              return !!e && !!e._fullData && Array.from(e._fullData[0].x).reduce((a, b) => a + b, 0) === 1; }""",
            timeout=30_000)
        expect(screen.locator("#class-teacher-info")).to_contain_text("1 answered")

        reveal.click()
        expect(screen.get_by_text("The numbers say").first).to_be_visible(timeout=30_000)
        assert "ann" not in screen.locator("body").inner_text()
        for p in (teacher, screen, student):
            assert p.js_errors == []
    finally:
        for ctx in contexts:
            ctx.close()
