"""Lessons: predict, then reveal. Ten short lessons over the real models and the existing figures; every
question makes the student commit to a prediction before the figure appears, and every verdict is computed from
the model's numbers on the lesson's current input (change the input and the answer follows).

A lesson is a title, an intro, an input (a seed, a sentence or an example image) and 3–6 steps; a step is a
function of that input returning a `Question`: the text, 3–4 choices, the one the numbers make correct, and the
figure to reveal with the prediction marked on it. Progress (each step's first answer) is kept in the browser
(`gr.BrowserState`); a lesson exports as one self-contained HTML page. `/lesson` and `/lesson_answer` serve the
same steps to the API, so the lessons are testable end to end."""

from __future__ import annotations

import html
import re
import uuid

import gradio as gr
import numpy as np
import plotly.graph_objects as go

from tabs import classroom
from tabs.common import DOWNLOADS, Error, Plot
from tabs.course.course import LESSONS, _number, _where, guarded, question
from tabs.course.engine import model_key, verdict, with_model
from tabs.permalink import Permalink, chain
from viz.common import esc

TITLE = "Lessons"
MODEL_CHOICES = ["gpt-tiny", "smollm2"]  # the keys of the lessons' `models` (tabs/course/induction.py: MODELS)
INTRO = """**Predict, then reveal.** Each lesson walks through one idea in a few steps over the app's real models.
Every question asks you to commit to a guess first; only then does the figure appear, with your guess marked, a
verdict computed from the model's actual numbers on this input, and a short explanation. Change the lesson's
input and the right answer can change with it. Your score is kept in this browser; a lesson exports as one HTML
page that works offline, for a handout."""


def build() -> Permalink:
    joining = classroom.join_layout()  # a student's join box first (a phone shows it before anything else)
    gr.Markdown(INTRO, elem_classes=["intro"])
    titles = [lesson.title for lesson in LESSONS]
    with gr.Row() as choosing:
        chosen = gr.Dropdown(titles, value=titles[0], label="lesson", scale=2)
        text = gr.Textbox("", label=LESSONS[0].input_label, placeholder=LESSONS[0].default, scale=2,
                          max_length=2000, info="empty: the example shown in grey")
        # lessons 4 and 5 run on gpt-tiny or a real pretrained LM; the choice is written into the input ("smollm2:
        # 3"), so a class, a link, the export and the API carry it with the input
        model = gr.Radio(MODEL_CHOICES, value=MODEL_CHOICES[0], label="model", scale=1,
                         visible=bool(LESSONS[0].models), info="smollm2: SmolLM2-135M-Instruct, real, 4-bit")
        start = gr.Button("Start the lesson", variant="primary", scale=1)
    about = gr.Markdown(LESSONS[0].intro)
    # --- class mode (tabs/classroom.py, issue 51): its section here, its send button by "Check", wired at the end
    class_section = classroom.layout(joining)
    current = gr.State()  # the lesson number shown, for the link's step
    progress = gr.BrowserState({}, storage_key="atlas-lessons")
    where = gr.Markdown()
    with gr.Row() as stepping:
        back = gr.Button("← previous step", scale=1)
        step = gr.Slider(1, max(len(lesson.steps) for lesson in LESSONS), value=1, step=1, label="step", scale=2)
        forward = gr.Button("next step →", scale=1)
    prompt = gr.Markdown()
    before = Plot(label="before you predict", visible=False)
    choices = gr.Radio([], label="your prediction")
    check = gr.Button("Check my prediction", variant="primary")
    classroom.below_choices(class_section)  # class mode: the student's send button, the teacher's live chart
    said = gr.Markdown()
    shown = Plot(label="revealed")
    explanation = gr.Markdown()
    with gr.Row() as exporting:
        export = gr.Button("Export this lesson as an HTML page")
        handout = gr.File(label="the lesson, one page (works offline)")

    view = [where, prompt, before, choices, said, shown, explanation]
    # the label and intro follow any change of lesson (a link's too); only a person's choice clears the input
    chosen.change(describe, [chosen], [text, about, model], api_name=False, show_progress="hidden")
    text.change(lambda c, t: gr.update(value=model_key(LESSONS[_number(c) - 1], t) or MODEL_CHOICES[0]),
                [chosen, text], [model], api_name=False, show_progress="hidden")
    model.input(lambda c, m, t: (with_model(LESSONS[_number(c) - 1], m, t),
                                 *cleared("The model changed: press **Start the lesson** to ask on it."), None),
                [chosen, model, text], [text, *view, handout], api_name=False, show_progress="hidden")
    # a person's new lesson or input empties every output of the old one: no intro above another lesson's question,
    # no export of the previous lesson, no choices that the new input's question would refuse
    chosen.input(lesson_chosen, [chosen, model], [text, *view, handout], api_name=False, show_progress="hidden")
    text.input(lambda: (*cleared("The input changed: press **Start the lesson** to ask on it."), None), None,
               [*view, handout], api_name=False, show_progress="hidden")
    steps = [(lambda c, t, pr: show_step(c, 1, t, pr), [chosen, text, progress], [*view, step, current])]
    chain(start.click, steps)
    step.change(show_step, [chosen, step, text, progress], [*view, step, current], api_name=False)
    back.click(lambda s: max(1, int(s) - 1), [step], [step], api_name=False, show_progress="hidden")
    forward.click(lambda c, s: min(len(LESSONS[_number(c) - 1].steps), int(s) + 1), [chosen, step], [step],
                  api_name=False, show_progress="hidden")
    # the question asked ("" or None on the page before the lesson starts) tells Check whether it has started
    check.click(lambda c, s, t, a, p, asked: answer_step(c, s, t, a, p, asked or ""),
                [chosen, step, text, choices, progress, prompt], [where, said, shown, explanation, progress],
                api_name=False)
    export.click(export_lesson, [chosen, text, progress], [handout], api_name=False)
    gr.api(lesson_api, api_name="lesson")
    gr.api(lesson_answer_api, api_name="lesson_answer")
    class_fields = classroom.wire(  # class mode: the section follows and drives this lesson's controls
        class_section, chosen=chosen, text=text, step=step, progress=progress, where=where, prompt=prompt,
        before=before, choices=choices, check=check, said=said, shown=shown, explanation=explanation,
        navigation=[choosing, stepping, exporting])
    # a link's run shows the linked step first (its step handed to it: `Permalink.preset`), not step 1's question and
    # figure before the check after the run sets the step
    return Permalink({"lesson": chosen, "input": text, **class_fields}, steps, after={"step": step}, state=current,
                     limits=lambda n: {"step": range(1, len(LESSONS[n - 1].steps) + 1)},
                     leave_out=classroom.leave_out, preset={"step": step},
                     link_run=[(linked_step, [chosen, step, text, progress], [*view, step, current])])


def describe(title: str):
    """The input's label and example, the intro of the chosen lesson, and its model choice where it has one."""
    lesson = LESSONS[_number(title) - 1]
    return (gr.update(label=lesson.input_label, placeholder=lesson.default), lesson.intro,
            gr.update(visible=bool(lesson.models)))


def lesson_chosen(title: str, model: str | None = None) -> tuple:
    """A person's new lesson: the input emptied, but the model chosen kept where the new lesson offers it (issue 75,
    item 7: lesson 4 on smollm2, then lesson 5, was back on gpt-tiny), written in front of the input as a link and
    the API carry it ("smollm2: "); the step view and the export emptied."""
    lesson = LESSONS[_number(title) - 1]
    keep = lesson.models and model in dict(lesson.models) and model != lesson.models[0][0]
    return (with_model(lesson, model, "") if keep else "", *cleared(), None)


def cleared(where: str = "") -> tuple:
    """The step view emptied (``where`` says why): the outputs of `show_step` before its step and lesson number."""
    return where, "", gr.update(value=None, visible=False), gr.update(choices=[], value=None), "", None, ""


def show_step(title: str, step: int, text: str, progress: dict | None):
    """A step before the prediction: its question and choices; the reveal is cleared. An input the step cannot
    take empties the view and says why (a gr.Error would leave the previous question standing)."""
    number = _number(title)
    step = int(np.clip(int(step or 1), 1, len(LESSONS[number - 1].steps)))
    try:
        q = question(number, step, text)
    except Error as err:
        return (*cleared(f"**{esc(LESSONS[number - 1].title)}** · step {step}: {err.message}"),
                gr.update(value=step, maximum=len(LESSONS[number - 1].steps)), number)
    before = gr.update(value=q.before, visible=q.before is not None)
    return (_where(number, step, progress), q.text, before,
            gr.update(choices=q.choices, value=None), "", None, "",
            gr.update(value=step, maximum=len(LESSONS[number - 1].steps)), number)


def linked_step(title: str, step, text: str, progress: dict | None):
    """A link's run: `show_step` at the link's step (the step slider's own value, 1 as the page opens, when the link
    gives none). A step the lesson does not have is refused, so the run shows step 1 and the check after it names
    the key in the notice (`show_step` would bring it inside the lesson's range)."""
    count = len(LESSONS[_number(title) - 1].steps)
    if isinstance(step, bool) or not isinstance(step, (int, float)) or step != int(step) or not 1 <= step <= count:
        raise Error(f"This lesson has steps 1 to {count}.")
    return show_step(title, int(step), text, progress)


def answer_step(title: str, step: int, text: str, answer: str | None, progress: dict | None, asked: str | None = None):
    """Judge the prediction by the numbers, reveal the figure with it marked, and keep the first answer. ``asked``:
    the question on the page ("" before the lesson starts, or after its lesson or input changed)."""
    if not answer and asked is not None and not asked.strip():
        raise Error("Start the lesson first (\"Start the lesson\" above): its first question and the predictions to "
                    "pick from appear there.")
    if not answer:
        raise Error("Pick a prediction first: the figure is revealed after you commit to one.")
    number = _number(title)
    q = guarded(number, step, text)
    right, words = verdict(q, answer)
    progress = dict(progress or {})
    got = dict(progress.get(str(number), {}))
    got.setdefault(str(step), right)  # the first answer counts
    progress[str(number)] = got
    return _where(number, int(step), progress), words, q.reveal(answer), q.explanation, progress


def export_lesson(title: str, text: str, progress: dict | None) -> str:
    """The whole lesson as one HTML page: every step's question, the answer the numbers give and the figure,
    with plotly.js inline so that it works offline."""
    from plotly.offline import get_plotlyjs

    number = _number(title)
    lesson = LESSONS[number - 1]
    parts = []
    for i in range(1, len(lesson.steps) + 1):
        q = guarded(number, i, text)
        listed = "".join(f"<li>{html.escape(c)}</li>" for c in q.choices)
        figure = q.reveal(None).to_html(include_plotlyjs=False, full_html=False)
        parts.append(f"<section><h2>Step {i}</h2><p>{_md(q.text)}</p><ol type='a'>{listed}</ol>"
                     f"<details><summary>Answer</summary><p><b>{html.escape(q.answer)}</b> — {html.escape(q.fact)}."
                     f"</p><p>{html.escape(q.explanation)}</p>{figure}</details></section>")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(lesson.title)}</title>"
            f"<script>{get_plotlyjs()}</script><style>body{{font-family:sans-serif;max-width:1100px;margin:auto}}"
            f"section{{border-top:1px solid #ccc;padding:1em 0}}</style></head><body><h1>{html.escape(lesson.title)}"
            f"</h1><p>{html.escape(lesson.intro)}</p><p>Input: {html.escape(text or lesson.default)}</p>"
            + "".join(parts) + "</body></html>")
    DOWNLOADS.mkdir(parents=True, exist_ok=True)
    path = DOWNLOADS / f"lesson-{number}-{uuid.uuid4().hex[:8]}.html"
    path.write_text(page, encoding="utf-8")
    return str(path)


def _md(text: str) -> str:
    """The little Markdown the step texts use (**bold**, *italic*, `code`) as HTML (what came from the input is
    escaped where the text is made)."""
    out = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)  # the step texts escape what came from the input
    out = re.sub(r"\*(.+?)\*", r"<i>\1</i>", out)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", out)


def lesson_api(number: int = 1, step: int = 1, input: str = "") -> tuple[str, str, list[str]]:
    """One lesson step: (text, the figure shown before predicting as Plotly JSON text ("" when there is none;
    `plotly.io.from_json` reads it), the choices)."""
    q = question(number, step, input)
    return q.text, "" if q.before is None else figure_text(q.before), q.choices


def lesson_answer_api(number: int = 1, step: int = 1, answer: str = "", input: str = "") -> tuple[str, str, str]:
    """A prediction judged by the model's numbers: (verdict "correct" | "not quite" and the numbers, the revealed
    figure with the prediction marked as Plotly JSON text, the explanation)."""
    q = guarded(number, step, input)
    right, _ = verdict(q, answer)
    return ("correct" if right else "not quite") + " — " + q.fact, figure_text(q.reveal(answer)), q.explanation


def figure_text(fig: go.Figure) -> str:
    """A figure for the API as Plotly's JSON *text*, not a JSON object: gradio_client fetches any object with a
    ``path`` key as a file, and Plotly's path shapes (the Swin region map's) have one."""
    return fig.to_json()
