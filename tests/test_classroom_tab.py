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
        assert joined[-4]["choices"] == q.choices  # the page shows the class's step
        assert f"as **student {i}**" in tc.send_answer(me, pick)
        students.append(me)

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
    said = tc.send_answer(other[0], q.choices[0])
    assert "Quiet Quentin" in said and "&lt;img" not in said
    tc.reveal_class(opened[0])
    assert "img" not in _texts(tc.student_tick(other[0], None))
    assert "Quiet" not in _texts(tc.student_tick(me[0], None))


def test_the_pages_refuse_what_the_store_refuses() -> None:
    opened = tc.open_class(TITLE, 1, "")
    code, token = opened[2], opened[1]
    with pytest.raises(Error, match="Only the teacher link"):
        tc.resume_class(code, token[:-2] + "xx")
    with pytest.raises(Error, match="Only the teacher link"):
        tc.reveal_class({"code": code, "token": "forged"})
    with pytest.raises(Error, match="at most 32"):
        tc.join_class(code, "n" * 10_000, None)
    with pytest.raises(Error, match="No class"):
        tc.join_class("ZZZZZZ" if code != "ZZZZZZ" else "YYYYYY", "ann", None)
    with pytest.raises(Error, match="Join a class first"):
        tc.send_answer(None, "t0")
    me = tc.join_class(code, "ann", None)[0]
    q = lessons.question(1, 1, "")
    tc.send_answer(me, q.choices[0])
    with pytest.raises(Error, match="first answer"):
        tc.send_answer(me, q.choices[1])
    resumed = tc.resume_class(code, token)  # the real link takes the class back
    assert resumed[0]["code"] == code and _counts(resumed[3])[q.choices[0]] == 1
    tc.close_class(resumed[0])
    page = tc.student_tick(me, None)
    assert "closed" in page[1] and page[0] is None and page[4].active is False


def test_class_links_carry_the_code_the_teacher_token_and_the_presenter_view() -> None:
    """The Lessons tab's link: a student's ?class=CODE, the teacher link (class and teacher token), ?present=1;
    a malformed code is refused with a notice, never passed on."""
    from tabs import permalink as pl

    link = lessons_link()
    links = {"lessons": link}
    controls = {**link.fields, **link.after}
    values = {name: pl.component_of(c).value for name, c in controls.items()}
    values.update({"class": "K7QX3M", "teacher": "a" * 43, "present": True})
    query = pl.write_query("lessons", link, list(values.values()))
    asked = pl.read_query(dict(pl_parse(query)), links)
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
