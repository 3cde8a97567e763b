"""The course: the nine lessons in order and how a lesson and a step are looked up by number or title, what the
Lessons tab and its class mode (tabs/classroom.py) both read, so neither imports the other's page."""

from __future__ import annotations

from tabs.common import Error
from tabs.course import (
    attention,
    explanation,
    induction,
    looking,
    mamba,
    masks,
    positions,
    sinks,
    translation,
    vision,
)
from tabs.course.engine import Lesson, Question, shuffled, split_model
from viz.common import esc

LESSONS = [attention.LESSON, masks.LESSON, positions.LESSON, induction.LESSON, sinks.LESSON, translation.LESSON,
           vision.LESSON, explanation.LESSON, mamba.LESSON, looking.LESSON]


def _number(title: str) -> int:
    titles = [lesson.title for lesson in LESSONS]
    return titles.index(title) + 1 if title in titles else 1


def _where(number: int, step: int, progress: dict | None) -> str:
    lesson = LESSONS[number - 1]
    got = (progress or {}).get(str(number), {})
    score = sum(1 for v in got.values() if v)
    marks = " ".join("✓" if got.get(str(i)) else "✗" if str(i) in got else "·"
                     for i in range(1, len(lesson.steps) + 1))
    return (f"**{esc(lesson.title)}** · step {step} of {len(lesson.steps)} · your score {score} of "
            f"{len(lesson.steps)} (first answers: {marks})")


def _lesson(number) -> Lesson:
    try:
        n = int(number)
    except (TypeError, ValueError, OverflowError):
        raise Error(f"The lesson must be a number from 1 to {len(LESSONS)}, got {str(number)[:40]!r}.") from None
    if not 1 <= n <= len(LESSONS):
        raise Error(f"There are {len(LESSONS)} lessons (1–{len(LESSONS)}); got {n}.")
    return LESSONS[n - 1]


HELD = ("A class is answering this step right now, so its answer is not given here until the teacher reveals it. "
        "Try another step, or come back after the reveal.")


def guarded(number, step, text: str = "") -> Question:
    """`question`, refused while a class answers the same step (its question has the same choices: the same input,
    or another that asks the same thing, such as a seed written "00" for "0"), so that no student of the class can
    read the answer off the public lesson endpoints (the page's Check, /lesson_answer, the export) before the
    teacher reveals it. A store that cannot be opened holds no classes."""
    from serving.classroom import ClassError, get_store

    q = question(number, step, text)
    try:
        held = get_store().open_choices(int(number), int(step))
    except ClassError:
        return q
    if frozenset(q.choices) in held:
        raise Error(HELD)
    return q


def question(number, step, text: str = "") -> Question:
    """Step ``step`` (1-based) of lesson ``number`` (1-based) on the lesson's input (empty: its default)."""
    lesson = _lesson(number)
    try:
        s = int(step)
    except (TypeError, ValueError, OverflowError):
        raise Error(f"The step must be a number, got {str(step)[:40]!r}.") from None
    if not 1 <= s <= len(lesson.steps):
        raise Error(f"Lesson {number} has {len(lesson.steps)} steps (1–{len(lesson.steps)}); got {s}.")
    inp = lesson.default if text is None or not str(text).strip() else str(text)[:2000]
    name, rest = split_model(lesson, inp)
    try:
        if name is None:
            return shuffled(lesson.steps[s - 1](inp), int(number), s, inp)
        return shuffled(lesson.steps[s - 1](rest or lesson.default, name=name), int(number), s, inp)
    except ValueError as err:
        raise Error(f"This input does not work for the step: {err}") from None
