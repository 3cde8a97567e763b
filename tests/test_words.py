"""Issue 75, item 7: words and settings. The teacher's text names the students' section as the page labels it; a
person's new lesson keeps the model chosen where the lesson offers it; lesson 5's verdict names the first token once
when it is the one attended to; whitespace candidates are not blank cells; a new prompt or chat setting empties the
old continuation (a run it refuses left it under the new prompt). (The Ollama name in Generate's notice:
tests/test_gguf.py::test_ollama_store.)"""

from __future__ import annotations

import types

import gradio as gr
import numpy as np


def _labels(blocks) -> set[str]:
    return {getattr(b, "label", None) for b in blocks.blocks.values()} - {None}


def test_the_teacher_text_names_the_students_section() -> None:
    from tabs import classroom, lessons

    with gr.Blocks() as demo:
        lessons.build()
    state = types.SimpleNamespace(code="ABC123", students=3, revealed=False, lesson=4, step=1, answered=2)
    said = classroom._teacher_text(state)
    named = said.split("Lessons → *", 1)[1].split("*", 1)[0]
    assert named in _labels(demo), (named, sorted(x for x in _labels(demo) if "class" in x.lower()))


def test_a_new_lesson_keeps_the_model_chosen() -> None:
    from tabs import lessons
    from tabs.course.engine import model_key

    four, five, one = lessons.LESSONS[3], lessons.LESSONS[4], lessons.LESSONS[0]
    assert four.models and five.models and not one.models
    text = lessons.lesson_chosen(five.title, "smollm2")[0]
    assert model_key(five, text) == "smollm2"  # the radio follows the input (text.change)
    assert lessons.lesson_chosen(five.title, "gpt-tiny")[0] == ""
    assert lessons.lesson_chosen(one.title, "smollm2")[0] == ""  # a lesson without models: the input as usual


def test_lesson_five_names_the_first_token_once_when_it_wins(monkeypatch) -> None:
    from tabs.course import sinks

    real = sinks.lm_run

    def planted(name, ids):
        losses, w = real(name, ids)
        w = np.array(w, copy=True)
        w[-1, :, -1, :] = 0.0
        w[-1, :, -1, 0] = 0.7  # the last row of the last layer: most on the first token
        w[-1, :, -1, 1:] = 0.3 / (w.shape[-1] - 1)
        return losses, w

    monkeypatch.setattr(sinks, "lm_run", planted)
    q = sinks.l5_target("")
    first = q.answer
    assert first.startswith("0 · ")
    assert q.fact.count(first) == 1 and "0.70" in q.fact and "the first token gets" not in q.fact, q.fact


def test_whitespace_candidates_are_not_blank() -> None:
    from viz import generate as vg

    fig = vg.step_candidates([["▁", "↵", "a", " ", "\t"]], np.array([[0.4, 0.3, 0.1, 0.1, 0.1]]), ["▁"])
    cells = [row[0] for row in fig.data[0].text]
    assert all(c.strip() for c in cells), cells
    assert cells[0] == "▁" and cells[2] == "a" and cells[1] == "↵"


def test_a_new_prompt_or_chat_setting_empties_the_old_continuation() -> None:
    from tabs import generate as tab

    with gr.Blocks() as demo:
        tab.build()
    ids = {b.label: k for k, b in demo.blocks.items() if getattr(b, "label", None)}
    cleared = [d for d in demo.fns.values() if d.fn is tab.cleared_view]
    triggers = {(t[0], t[1]) for d in cleared for t in d.targets}
    chat = next(k for label, k in ids.items() if label.startswith("as a chat"))
    assert (ids["prompt"], "input") in triggers and (chat, "input") in triggers
    outputs = {o._id for d in cleared for o in d.outputs}
    assert ids["continuation"] in outputs and ids["next-token candidates of each step"] in outputs
    assert tab.cleared_view()[0] == "" and tab.cleared_view()[5] is None
