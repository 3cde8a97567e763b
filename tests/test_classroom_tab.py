"""The Lessons tab's class mode (tabs/classroom.py) through its handlers, over a store in a temporary folder: a class
from open to reveal as the pages see it, and the rules the pages add to the store's (escaped nicknames, no other
student's nickname on any page, a forged teacher link refused)."""

from __future__ import annotations

import json

import gradio as gr
import pytest

from serving import classroom as cr
from tabs import classroom as tc
from tabs import lessons
from tabs.common import Error

TITLE = lessons.LESSONS[0].title  # lesson 1 draws without a trained model


@pytest.fixture(autouse=True)
def store(tmp_path, monkeypatch) -> cr.ClassStore:
    store = cr.open_store(f"sqlite:///{tmp_path / 'atlas.sqlite3'}")
    monkeypatch.setattr(cr, "_store", store)
    return store


def _counts(plot) -> dict[str, int]:
    """The bars of a counts chart, returned as a figure or as a gr.Plot update holding one."""
    spec = plot.value["plot"] if isinstance(plot, gr.Plot) else plot.to_json()
    data = json.loads(spec)["data"][0]
    return dict(zip(data["y"], data["x"], strict=True))


def _texts(outputs) -> str:
    """Everything a handler sends to the page, as text (figures as their JSON)."""
    return " ".join(o.to_json() if hasattr(o, "to_json") else json.dumps(o, default=str) for o in outputs)


def test_a_class_from_open_to_reveal_through_the_handlers() -> None:
    opened = tc.open_class(TITLE, 1, "")
    teacher, token, code = opened[0], opened[1], opened[2]
    assert "Join code" in opened[3] and code in opened[3] and token not in opened[3]
    q = lessons.question(1, 1, "")
    assert _counts(opened[5]) == {esc_c: 0 for esc_c in q.choices}

    picks = [q.choices[0], q.choices[0], q.choices[1]]
    students = []
    for i, pick in enumerate(picks):
        joined = tc.join_class(code.lower(), f"student {i}", None)
        me = joined[0]
        assert joined[2].visible is False and joined[3].visible is True  # "Check" hidden, "Send" shown
        assert joined[11]["choices"] == q.choices  # the page shows the class's step (the lesson view: 5..14)
        assert joined[15].visible is False  # the teacher's section goes from a student's page
        sent = tc.send_answer(me, pick)
        assert f"as **student {i}**" in sent[0] and sent[1]["answer"] == pick
        assert sent[2].interactive is False  # sent: the button is done for this step
        students.append(sent[1])

    polled = tc.teacher_tick(teacher)
    assert _counts(polled[1]) == {c: picks.count(c) for c in q.choices}
    assert "3 answered" in polled[2] and "not revealed" in polled[2]
    assert all(f"student {i}" not in _texts(polled[1:3]) for i in range(3))  # counts, never names
    assert tc.teacher_tick(polled[0])[1] == tc.gr.skip()  # nothing new: nothing redrawn
    # a student's tick before the reveal changes nothing on their page
    assert all(o == tc.gr.skip() for o in tc.student_tick(students[2], None))

    revealed = tc.reveal_class(teacher)
    assert q.answer in revealed[3] and revealed[4] is not None
    for me, pick in zip(students, picks, strict=True):
        page = tc.student_tick(me, None)
        assert page[0]["revealed"] is True
        assert page[12] == lessons.verdict(q, pick)[1] and page[14] == q.explanation
        assert page[13] is not None  # the revealed figure
        # the score line counts the class answer (issue 61, item 6): 1 of 3 when right, 0 of 3 when not
        right = pick == q.answer
        assert page[15] == {"1": {"1": right}} and f"your score {int(right)} of 3" in page[8]
    # the teacher moves on: a student's next tick follows to step 2, the reveal cleared
    moved = tc.next_step(teacher, TITLE, 1, "")
    assert moved[3] == 2
    page = tc.student_tick(students[0], None)
    q2 = lessons.question(1, 2, "")
    assert page[0]["step"] == 2 and page[7]["value"] == 2 and page[9] == q2.text and page[13] is None


def test_nicknames_are_escaped_and_never_shown_to_other_students() -> None:
    opened = tc.open_class(TITLE, 1, "")
    code = opened[2]
    nasty = "<img src=x onerror=alert(1)>"[:32]
    me = tc.join_class(code, nasty, None)
    assert "<img" not in me[1] and "&lt;img" in me[1]
    other = tc.join_class(code, "Quiet Quentin", None)
    q = lessons.question(1, 1, "")
    said = tc.send_answer(other[0], q.choices[0])[0]
    assert "Quiet Quentin" in said and "&lt;img" not in said
    tc.reveal_class(opened[0])
    assert "img" not in _texts(tc.student_tick(other[0], None))
    assert "Quiet" not in _texts(tc.student_tick(me[0], None))


def test_the_pages_say_what_the_store_refuses() -> None:
    """Class events skip Gradio's queue, where a raised error leaves the page blank (HTTP 500): every refusal is said
    in the page itself (issue 61, item 1), and nothing else changes."""
    opened = tc.open_class(TITLE, 1, "")
    code, token = opened[2], opened[1]
    bad = tc.resume_class(code, token[:-2] + "xx")
    assert tc.NOT_TEACHER in bad[1] and tc.NOT_TEACHER in bad[6] and bad[0] == gr.skip()
    assert bad[5].visible is False and bad[7].open is True  # a student's page: the join box, no teacher section
    said = tc.reveal_class({"code": code, "token": "forged"})
    assert "Only the teacher link" in said[2] and said[0] == gr.skip()
    assert "Open a class first" in tc.next_step(None, TITLE, 1, "")[2]
    assert "Open a class first" in tc.export_class(None)[1]
    assert "Open a class first" in tc.close_class(None)[2]
    for nickname, words in (("n" * 10_000, "at most 32"), ("", "Type a nickname"), ("  ", "Type a nickname")):
        page = tc.join_class(code, nickname, None)
        assert words in page[1] and page[0] == gr.skip() and page[15] == gr.skip()
    wrong = tc.join_class("ZZZZZZ" if code != "ZZZZZZ" else "YYYYYY", "ann", None)
    assert "No class has this join code" in wrong[1] and wrong[0] == gr.skip()
    assert "A join code is 6" in tc.join_class("K7Q", "ann", None)[1]
    assert "Join a class first" in tc.send_answer(None, "t0")[0]
    me = tc.join_class(code, "ann", None)[0]
    q = lessons.question(1, 1, "")
    assert "Pick a prediction first" in tc.send_answer(me, None)[0]
    me = tc.send_answer(me, q.choices[0])[1]
    again = tc.send_answer(me, q.choices[1])  # a second answer: said, and the radio goes back to the first
    assert "first answer" in again[0] and again[3]["value"] == q.choices[0] and again[2].interactive is False
    changed = tc.choice_changed(me, q.choices[1])  # a new pick after sending is said at once
    assert "is the one recorded" in changed[0] and q.choices[0] in changed[0] and changed[1]["value"] == q.choices[0]
    assert tc.choice_changed(me, q.choices[0]) == (gr.skip(), gr.skip())
    resumed = tc.resume_class(code, token)  # the real link takes the class back
    assert resumed[0]["code"] == code and _counts(resumed[3])[q.choices[0]] == 1
    late = tc.join_class(code, "late", None)[0]
    tc.reveal_class(resumed[0])
    late = tc.student_tick(late, None)[0]
    assert "revealed this step" in tc.choice_changed(late, q.choices[1])[0]  # a change after the reveal
    assert "revealed this step" in tc.send_answer(late, q.choices[1])[0]
    tc.close_class(resumed[0])
    page = tc.student_tick(me, None)
    assert "closed" in page[1] and page[0] is None and page[4].active is False


def test_a_student_page_is_a_join_box_without_teacher_controls() -> None:
    """A link with a class code and no teacher token opens the join box and takes the teacher's section away; the
    teacher's own browser (which kept the link) takes the class back instead; joining hides the lesson's choosers,
    steps and export, which the class drives (issue 61, item 3)."""
    opened = tc.open_class(TITLE, 1, "")
    code, token, kept = opened[2], opened[1], opened[7]
    assert kept == {"code": code, "token": token} and opened[8].visible is False  # the teacher needs no join box
    box, teach, tok = tc.code_given(code.lower(), "", {})
    assert box.open is True and teach.visible is False and tok == gr.skip()
    assert tc.code_given(code, "", kept) == (gr.skip(), gr.skip(), token)  # the teacher's browser: its token
    assert tc.code_given(code, token, {}) == (gr.skip(),) * 3  # a teacher link: resume decides
    assert tc.code_given("K7", "", {}) == (gr.skip(),) * 3  # still being typed
    joined = tc.join_class(code, "ann", None, navigation=3)
    assert joined[2].visible is False and joined[15].visible is False
    assert [u["visible"] for u in joined[16:]] == [False, False, False]


def test_the_presenter_view_keeps_the_teacher_token_out_of_the_address() -> None:
    from tabs import permalink as pl

    link = lessons_link()
    controls = {**link.fields, **link.after}
    values = {name: pl.component_of(c).value for name, c in controls.items()}
    values.update({"class": "K7QX3M", "teacher": "a" * 43})
    assert "teacher=" + "a" * 43 in pl.write_query("lessons", link, list(values.values()))
    values["present"] = True
    query = pl.write_query("lessons", link, list(values.values()))
    assert "teacher" not in query and "a" * 43 not in query and "class=K7QX3M" in query and "present=1" in query


def test_the_answer_key_stays_private_while_a_class_answers() -> None:
    """While a class is open and unrevealed on a step, the public endpoints (the page's Check, /lesson_answer, the
    export) refuse that step's answer, for its input and any input that asks the same question (issue 61, item 2);
    other steps answer; after the reveal, or once the class moved on or closed, the step answers again."""
    q = lessons.question(1, 1, "")
    opened = tc.open_class(TITLE, 1, "")
    for text in ("", "0", "00", " 0 "):  # the default seed, written four ways: the same question
        with pytest.raises(Error, match="A class is answering this step"):
            lessons.lesson_answer_api(1, 1, q.answer, text)
        with pytest.raises(Error, match="A class is answering this step"):
            lessons.answer_step(TITLE, 1, text, q.answer, {})
    with pytest.raises(Error, match="A class is answering this step"):
        lessons.export_lesson(TITLE, "", {})
    assert lessons.lesson_answer_api(1, 2, lessons.question(1, 2, "").answer, "")[0].startswith("correct")
    other = lessons.question(1, 1, "5")
    if frozenset(other.choices) != frozenset(q.choices):  # another seed asks another question: it answers
        assert lessons.lesson_answer_api(1, 1, other.answer, "5")[0].startswith("correct")
    assert lessons.lesson_api(1, 1, "")[2] == q.choices  # the question itself is public
    tc.reveal_class(opened[0])
    assert lessons.lesson_answer_api(1, 1, q.answer, "")[0].startswith("correct")
    tc.next_step(opened[0], TITLE, 1, "")  # step 2 held now, step 1 free
    with pytest.raises(Error, match="A class is answering this step"):
        lessons.lesson_answer_api(1, 2, lessons.question(1, 2, "").answer, "")
    tc.close_class(opened[0])
    assert lessons.lesson_answer_api(1, 2, lessons.question(1, 2, "").answer, "")[0].startswith("correct")


def test_class_links_carry_the_code_the_teacher_token_and_the_presenter_view() -> None:
    """The Lessons tab's link: a student's ?class=CODE, the teacher link (class and teacher token), ?present=1;
    a malformed code is refused with a notice, never passed on."""
    from tabs import permalink as pl

    link = lessons_link()
    links = {"lessons": link}
    controls = {**link.fields, **link.after}
    values = {name: pl.component_of(c).value for name, c in controls.items()}
    values.update({"class": "K7QX3M", "teacher": "a" * 43})
    query = pl.write_query("lessons", link, list(values.values()))
    asked = pl.read_query(dict(pl_parse(query + "&present=1")), links)
    assert asked.values == {"class": "K7QX3M", "teacher": "a" * 43, "present": True}
    assert not asked.refused and not asked.messages
    assert pl.read_query({"tab": "lessons", "class": "k7qx-3m"}, links).values == {"class": "K7QX3M"}
    bad = pl.read_query({"tab": "lessons", "class": "<script>"}, links)
    assert "class" not in bad.values and "join code is not one" in " ".join(bad.messages)
    assert "teacher" in pl.read_query({"tab": "lessons", "teacher": "t" * 65}, links).refused  # too long


def lessons_link():
    import gradio as gr

    with gr.Blocks():
        return lessons.build()


def pl_parse(query: str) -> list[tuple[str, str]]:
    from urllib.parse import parse_qsl

    return parse_qsl(query, keep_blank_values=True)


def test_the_join_limit_counts_the_right_address(monkeypatch) -> None:
    """Direct connections count the peer's address and ignore X-Forwarded-For (anyone can write it); behind one
    trusted proxy (ATLAS_PROXY_HOPS=1) the entry that proxy appended counts, not what the client wrote before it."""
    from types import SimpleNamespace

    request = SimpleNamespace(client=SimpleNamespace(host="10.1.1.1"),
                              headers={"x-forwarded-for": "6.6.6.6, 203.0.113.7"})
    monkeypatch.delenv("ATLAS_PROXY_HOPS", raising=False)
    assert tc._client(request) == "10.1.1.1"
    monkeypatch.setenv("ATLAS_PROXY_HOPS", "1")
    assert tc._client(request) == "203.0.113.7"
    assert tc._client(SimpleNamespace(client=SimpleNamespace(host="10.1.1.1"), headers={})) == "10.1.1.1"
    assert tc._client(None) == ""


# ------------------------------------------------------------------------- what teachers asked for (issue 61, 11)
def _decode_qr(svg: str) -> str:
    """The text of an inline SVG QR code, read back by OpenCV's QR decoder (a reference implementation): the SVG's
    module squares rasterised at 8 px a module, then decoded."""
    import re

    import cv2
    import numpy as np

    side = int(re.search(r'viewBox="0 0 (\d+) (\d+)"', svg).group(1))
    scale = 8
    image = np.full((side * scale, side * scale), 255, np.uint8)
    for x0, y0, x1, y1 in re.findall(r"M(\d+),(\d+)H(\d+)V(\d+)H\d+z", svg):
        image[int(y0) * scale:int(y1) * scale, int(x0) * scale:int(x1) * scale] = 0
    text, _, _ = cv2.QRCodeDetector().detectAndDecode(image)
    return text


def test_the_projected_screen_has_a_qr_code_and_a_very_large_join_code() -> None:
    opened = tc.open_class(TITLE, 1, "", "http://127.0.0.1:7860/")
    code, room = opened[2], opened[9]
    assert f'<div class="atlas-join-code">{code}</div>' in room
    assert _decode_qr(room) == f"http://127.0.0.1:7860/?tab=lessons&class={code}"
    assert opened[1] not in room  # the teacher's token is never in what the room sees
    resumed = tc.resume_class(code, opened[1], "https://atlas.example.org/app/")
    assert _decode_qr(resumed[18]) == f"https://atlas.example.org/app/?tab=lessons&class={code}"
    # an address that is not the app's own http(s) page gets no QR code, only the code and where to type it
    for address in ("", "javascript:alert(1)", "http://x/\"><script>", "file:///etc/passwd"):
        room = tc.open_class(TITLE, 1, "", address)[9]
        assert "<svg" not in room and "<script" not in room and "Join a class" in room
    assert "font-size: clamp(4rem" in tc.PRESENT_CSS  # very large in the presenter view


def test_the_teacher_sees_who_has_not_answered_and_the_room_does_not() -> None:
    opened = tc.open_class(TITLE, 1, "")
    teacher, code = opened[0], opened[2]
    q = lessons.question(1, 1, "")
    pages = [tc.join_class(code, name, None)[0] for name in ("ann", "<b>bob</b>", "cy")]
    polled = tc.teacher_tick(teacher)
    assert "Not answered yet (3 of 3):** ann, &lt;b&gt;bob&lt;/b&gt;, cy" in polled[4]
    tc.send_answer(pages[1], q.choices[0])
    polled = tc.teacher_tick(polled[0])
    assert "Not answered yet (2 of 3):** ann, cy" in polled[4]
    for me in (pages[0], pages[2]):
        tc.send_answer(me, q.choices[1])
    polled = tc.teacher_tick(polled[0])
    assert "Everybody has answered" in polled[4]
    assert "ann" not in _texts(tc.student_tick(pages[2], None))  # a student's page never names another
    assert "#class-missing {display: none" in tc.PRESENT_CSS  # nor does the projected presenter view
    moved = tc.next_step(teacher, TITLE, 1, "")
    assert "Not answered yet (3 of 3)" in moved[4]  # a new step: nobody has answered it


def test_a_step_asked_again_lets_the_room_answer_anew() -> None:
    opened = tc.open_class(TITLE, 1, "")
    teacher, code = opened[0], opened[2]
    q = lessons.question(1, 1, "")
    me = tc.send_answer(tc.join_class(code, "ann", None)[0], q.choices[0])[1]
    tc.reveal_class(teacher)
    me = tc.student_tick(me, None)[0]
    assert me["revealed"] is True
    again = tc.reask_class(teacher)
    assert _counts(again[1]) == {c: 0 for c in q.choices} and "Asked again" in again[2]
    assert again[3:6] == ("", None, "") and "Not answered yet (1 of 1)" in again[6]  # the teacher's reveal cleared
    page = tc.student_tick(me, None)
    assert page[0]["revealed"] is False and page[0]["answer"] is None and page[3].interactive is True
    assert "asks this step again" in page[1] and page[13] is None and page[11]["value"] is None
    sent = tc.send_answer(page[0], q.choices[1])
    assert sent[1]["answer"] == q.choices[1]  # a new answer is taken (a second one was refused before)
    assert "Only the teacher link" in tc.reask_class({"code": code, "token": "forged"})[2]


def test_the_summary_per_question_in_the_teacher_view_and_the_csv() -> None:
    import csv
    from pathlib import Path

    opened = tc.open_class(TITLE, 1, "")
    teacher, code = opened[0], opened[2]
    q1, q2 = lessons.question(1, 1, ""), lessons.question(1, 2, "")
    pages = [tc.join_class(code, name, None)[0] for name in ("ann", "bob", "cy")]
    wrong1 = next(c for c in q1.choices if c != q1.answer)
    for me, pick in zip(pages, [q1.answer, q1.answer, wrong1], strict=True):
        tc.send_answer(me, pick)
    tc.next_step(teacher, TITLE, 1, "")
    tc.send_answer(tc.student_tick(pages[0], None)[0], q2.answer)
    exported = tc.export_class(teacher)
    rows = list(csv.reader(Path(exported[2].value["path"]).open(encoding="utf-8")))
    assert rows[0] == ["lesson", "step", "choice", "right", "chosen_by", "answered", "correct", "asked"]
    step1 = {r[2]: r for r in rows[1:] if r[:2] == ["1", "1"]}
    assert set(step1) == set(q1.choices)
    assert step1[q1.answer][3:7] == ["1", "2", "3", "2"] and step1[wrong1][3:5] == ["0", "1"]
    assert [r[5:7] for r in rows[1:] if r[:2] == ["1", "2"]][0] == ["1", "1"]
    table = exported[3]
    assert "| 1 · 1 | 3 | 2 (67%) |" in table and "| 1 · 2 | 1 | 1 (100%) |" in table
    closed = tc.close_class(teacher)
    assert closed[7] == table  # the summary stays on the page once the class is closed


def test_a_presenter_link_follows_the_class_read_only() -> None:
    """Issue 75, item 2: the teacher's page gets the class's presenter link; opened on another screen (no teacher
    token kept there) it is a read-only presenter page: no join box, no teacher buttons, no "Check", the lesson's
    choosers hidden, the live counts and the join screen shown; its tick follows the class's step, the counts and
    the reveal, never naming a student; a forged token is said in the join box; the teacher's own browser, which
    kept the teacher link, stays the teacher's."""
    opened = tc.open_class(TITLE, 1, "")
    teacher, code, token, kept = opened[0], opened[2], opened[1], opened[7]
    presenter, said = tc.presenter_link(teacher, "https://atlas.example/")
    assert len(presenter) == 32 and token not in said
    assert f"https://atlas.example/?tab=lessons&amp;class={code}&amp;presenter={presenter}&amp;present=1" in said \
        or f"https://atlas.example/?tab=lessons&class={code}&presenter={presenter}&present=1" in said
    assert tc.code_given(code, "", {}, presenter) == (gr.skip(),) * 3  # not a student's join box
    assert tc.code_given(code, "", kept, presenter) == (gr.skip(), gr.skip(), token)  # the teacher's browser
    assert all(o == gr.skip() for o in tc.presenter_open(code, presenter, "", kept, navigation=2))
    assert all(o == gr.skip() for o in tc.presenter_open(code, presenter, token, {}, navigation=2))

    page = tc.presenter_open(code.lower(), presenter, "", {}, "https://atlas.example/", navigation=2)
    assert len(page) == tc.PRESENTER_OUTPUTS + 2
    mine = page[0]
    assert mine["code"] == code and page[2].visible is True and page[4].active is True
    assert page[5].visible is True and "presenter screen" in page[5].label
    assert page[6].visible is False and page[7].visible is False  # "open a class" and the teacher's buttons
    assert page[9].visible is False and page[10].visible is False  # the join box, "Check"
    q = lessons.question(1, 1, "")
    assert page[17]["choices"] == q.choices and page[15] == q.text  # the class's step (the lesson view: 11..20)
    assert f'<div class="atlas-join-code">{code}</div>' in page[21] and "svg" in page[21]
    assert [u["visible"] for u in page[22:]] == [False, False]
    assert _counts(page[3]) == {c: 0 for c in q.choices}

    ann = tc.join_class(code, "ann", None)[0]
    tc.send_answer(ann, q.choices[1])
    tick = tc.presenter_tick(mine)
    assert _counts(tick[1]) == {c: int(c == q.choices[1]) for c in q.choices}
    assert "1 student joined" in tick[2] and "1 answered" in tick[2] and "ann" not in _texts(tick)
    mine = tick[0]
    assert all(o == gr.skip() for o in tc.presenter_tick(mine))  # nothing new: nothing redrawn
    tc.reveal_class(teacher)
    tick = tc.presenter_tick(mine)
    assert q.answer in tick[11] and tick[12] is not None and tick[13] == q.explanation
    mine = tick[0]
    assert mine["revealed"] is True
    tc.next_step(teacher, TITLE, 1, "")
    tick = tc.presenter_tick(mine)
    q2 = lessons.question(1, 2, "")
    assert tick[0]["step"] == 2 and tick[6]["value"] == 2 and tick[8] == q2.text and tick[12] is None
    tc.close_class(teacher)
    tick = tc.presenter_tick(tick[0])
    assert "closed" in tick[2] and tick[0] is None and tick[3].active is False

    again = tc.open_class(TITLE, 1, "")
    forged = tc.presenter_open(again[2], presenter, "", {}, navigation=2)  # another class's token
    assert "presenter link is not the class's" in forged[8] and forged[0] == gr.skip()
    assert forged[5].visible is False and forged[9].open is True  # a student's page: the join box


def test_the_presenter_views_address_is_the_presenter_link() -> None:
    """With the presenter view on, the Lessons tab's address holds the class and the presenter token, not the
    teacher token: a reload, or the address opened on a projector, is the presenter page (issue 75, item 2);
    without it the address is the teacher link and holds no presenter token."""
    from tabs import permalink as pl

    link = lessons_link()
    controls = {**link.fields, **link.after}
    values = {name: pl.component_of(c).value for name, c in controls.items()}
    values.update({"class": "K7QX3M", "teacher": "a" * 43, "presenter": "b" * 32})
    query = pl.write_query("lessons", link, list(values.values()))
    assert "teacher=" + "a" * 43 in query and "presenter" not in query
    values["present"] = True
    query = pl.write_query("lessons", link, list(values.values()))
    assert "teacher" not in query and "presenter=" + "b" * 32 in query and "present=1" in query
    asked = pl.read_query(dict(pl_parse(query)), {"lessons": link})
    assert asked.values == {"class": "K7QX3M", "presenter": "b" * 32, "present": True}
