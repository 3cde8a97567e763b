"""A class at once (issue 51): the Lessons tab's class mode. The teacher opens a class on the lesson step they show;
students join with its code and a nickname, follow the teacher's lesson and step, and send their prediction; the
teacher sees the room's counts live (a bar chart polled every `TICK_S`) *before* revealing, and on their own screen
who has not answered yet, reveals to every student's screen at once, may ask a step again, moves the class on,
downloads the answers and a per-question summary as CSV and closes the class (the summary stays on the page). A
presenter view (``?present=1`` or its toggle) sets large type for a projector, folds the intros, shows one figure per
step, the join code in very large type with a QR code of the join link, and leaves the nicknames out.

The store (serving/classroom.py) keeps everything and decides who may do what; this module is the section's layout
and its handlers. The lesson's own controls are passed in by the Lessons tab (`wire`), so the class reads the step
the teacher shows and writes the step students see. Nicknames are shown only to their own student (escaped) and in
the teacher's CSV and the teacher's own (not presented) list of who has not answered; nobody's page shows another
student's nickname."""

from __future__ import annotations

import html
import os
import re
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import gradio as gr

from serving.classroom import ClassError, ClassState, get_store, normalise_code, open_in_background
from tabs.common import DOWNLOADS, Error, Plot
from tabs.course import course, engine  # the lessons, not the Lessons tab (which places this module's section)
from tabs.permalink import Field
from viz.classroom import class_counts, join_screen, summary_table
from viz.common import esc

TICK_S = 1.0  # how often the teacher's page asks for the counts (the issue asks for ≤ 2 s)
FOLLOW_S = 2.0  # how often a student's page asks where the class is (a room of 100: 50 small requests a second)
# The class events skip Gradio's queue: they are small database calls (a lesson step's question is built once per
# class step, `_question`), and a room pressing "Join" or "Send" at the same moment must not be turned away by the
# bounded queue (ATLAS_QUEUE, 64 waiting), which is there for the model requests. The page then POSTs them to
# /gradio_api/run/<api_name> and they run in the server's thread pool.
CLASS_EVENTS = {"queue": False}

INTRO = """**A class at once.** A teacher opens a class on the step shown below and gets a join code; students open
this app, type the code and a nickname (no account; nobody else in the class sees it), and their page follows the
teacher's lesson and step. Each student's first prediction per step is recorded; the teacher sees how the room
voted *before* revealing, then reveals it on every screen at once. The class ends when the teacher closes it, or a
day after it was opened."""

TEACH_LABEL = "A class at once: teach a class"
# The presenter view: a class on <body> set by the toggle (and ?present=1 through the permalink).
PRESENT_JS = "(on) => { document.body.classList.toggle('atlas-present', !!on); }"
PRESENT_CSS = """<style>
body.atlas-present .intro {display: none !important;}
body.atlas-present .prose, body.atlas-present .prose * {font-size: 1.45rem !important; line-height: 1.5 !important;}
body.atlas-present label span, body.atlas-present button {font-size: 1.2rem !important;}
body.atlas-present:has(#lessons-revealed .js-plotly-plot) #lessons-before {display: none !important;}
body.atlas-present #class-missing {display: none !important;}  /* nicknames: the teacher's screen, not the room's */
body.atlas-present #class-presenter-link {display: none !important;}
.atlas-join {display: flex; flex-wrap: wrap; align-items: center; gap: 1.5rem;}
.atlas-join-qr {background: #fff; padding: 6px; width: 180px; max-width: 70vw; line-height: 0;}
.atlas-join-qr svg {width: 100%; height: auto;}
.atlas-join-code {font: 700 3.2rem/1.1 ui-monospace, monospace; letter-spacing: 0.12em;}
.atlas-join-text {flex: 1 1 240px; min-width: 0;}
.atlas-join-label {font-size: 1rem; opacity: 0.8;}
.atlas-join-link {font-size: 0.95rem; word-break: break-all;}
body.atlas-present .atlas-join-qr {width: min(36vh, 80vw);}
body.atlas-present .atlas-join-code {font-size: clamp(4rem, 8vw, 10rem) !important;}
body.atlas-present .atlas-join-label, body.atlas-present .atlas-join-link {font-size: 1.6rem !important;}
</style>"""
# The page's own address (the app's root as the browser sees it): what the join link in the QR code opens.
ADDRESS_JS = "(...args) => [...args.slice(0, -1), location.origin + location.pathname]"


# -------------------------------------------------------------------------------- the lesson, as the class sees it
def _lessons():
    """The course (the lessons, their lookup) with the verdict rule: what the class reads of the Lessons tab."""
    return SimpleNamespace(LESSONS=course.LESSONS, question=course.question, _number=course._number,
                           _where=course._where, verdict=engine.verdict)


_questions: OrderedDict[tuple[int, int, str], Any] = OrderedDict()
_questions_lock = threading.Lock()


def _question(number: int, step: int, text: str):
    """The lesson step's Question, built once for everybody in the class (a room asks for the same step at the same
    moment; a step over a model would otherwise run it once per student). The last 32 steps are kept."""
    key = (int(number), int(step), text or "")
    with _questions_lock:  # one build per step even when a room asks at once
        if key not in _questions:
            _questions[key] = _lessons().question(*key)
            while len(_questions) > 32:
                _questions.popitem(last=False)
        _questions.move_to_end(key)
        return _questions[key]


def _title(number: int) -> str:
    return _lessons().LESSONS[number - 1].title


def _step_of(title: str, step: Any, text: str) -> tuple[int, int, Any]:
    """(lesson number, step, its Question) of the step a page shows."""
    number = _lessons()._number(title)
    s = int(step or 1)
    return number, s, _question(number, s, text)


def _client(request: gr.Request | None) -> str:
    """The address the failed-join limit counts. Behind ``ATLAS_PROXY_HOPS`` trusted reverse proxies (a hosting
    service's front end) the connection comes from the last proxy, so the address is the entry that many places
    from the right of X-Forwarded-For, the one the nearest trusted proxy appended; entries further left come from
    the client and are not trusted. Without proxies (the default, 0) the header is ignored: anyone could write it."""
    if request is None:
        return ""
    hops = int(os.environ.get("ATLAS_PROXY_HOPS", "0") or 0)
    if hops > 0:
        chain = [a.strip() for a in str((request.headers or {}).get("x-forwarded-for", "")).split(",") if a.strip()]
        if len(chain) >= hops:
            return chain[-hops][:64]
    return str(getattr(getattr(request, "client", None), "host", "") or "")


def _error(err: ClassError) -> Error:
    return Error(str(err))


def _store():
    """The class store (opened and migrated at start; a store that cannot be opened is a message, not a trace)."""
    try:
        return get_store()
    except ClassError as err:
        raise _error(err) from None


def _chart(state: ClassState, large: bool = False):
    return class_counts(state.choices, state.counts, answer=state.answer if state.revealed else None,
                        students=state.students, large=large,
                        title=f"Lesson {state.lesson}, step {state.step}: the room's predictions")


def _teacher_text(state: ClassState) -> str:
    said = "revealed" if state.revealed else "not revealed yet"
    return (f"### Join code: `{state.code}`\n{state.students} student{'s' * (state.students != 1)} joined · lesson "
            f"{state.lesson}, step {state.step} · {state.answered} answered · {said}.\n\nStudents open this app, "
            "Lessons → *Join a class (students)*, and type the code (or open this page with "
            f"`?tab=lessons&class={state.code}`). **The address bar now holds your teacher link**: it carries the "
            "secret that reveals, advances, exports and closes the class, so keep it to yourself; open it again to "
            "take the class back (after a restart too).")


# -------------------------------------------------------------------------------------------------- layout
@dataclass
class Section:
    """The class section's controls (made by `join_layout` and `layout`, wired by `wire`)."""

    join_box: gr.Accordion  # the students' part, first on the tab (open when a link gives a class)
    code: gr.Textbox
    nickname: gr.Textbox
    join: gr.Button
    student_info: gr.Markdown
    teach: gr.Accordion  # the teacher's part, above the lesson (hidden on a student's page)
    open: gr.Button
    token: gr.Textbox
    teacher_info: gr.Markdown
    teacher_box: gr.Column
    reveal: gr.Button
    next: gr.Button
    move: gr.Button
    export: gr.Button
    close: gr.Button
    csv: gr.File
    present: gr.Checkbox
    room: gr.HTML  # the join code, very large, and the QR code of the join link (what a projector shows)
    missing: gr.Markdown  # who has not answered yet (the teacher's screen only)
    reask: gr.Button
    summary: gr.Markdown  # the per-question summary, after class
    summary_csv: gr.File
    address: gr.Textbox  # the page's address, from the browser (ADDRESS_JS): the QR code's join link
    presenter: gr.Textbox  # the class's read-only presenter token (a projector's link; `presenter_open`)
    screen: gr.Markdown  # the presenter link, on the teacher's own screen
    controls: gr.Row  # the teacher's buttons (a presenter page has none)
    send: gr.Button | None = None  # these two are placed under the lesson's choices (`below_choices`)
    counts: gr.Plot | None = None


@dataclass
class JoinBox:
    accordion: gr.Accordion
    code: gr.Textbox
    nickname: gr.Textbox
    join: gr.Button
    info: gr.Markdown


def join_layout() -> JoinBox:
    """The students' join box, placed first on the Lessons tab (a phone shows it before anything else); closed
    unless a link gives a class code."""
    with gr.Accordion("Join a class (students)", open=False, elem_id="class-join") as accordion:
        with gr.Row():
            code = gr.Textbox(label="join code", max_length=12, placeholder="e.g. K7QX3M", scale=1, min_width=120)
            nickname = gr.Textbox(label="your nickname (only the teacher sees it)", max_length=32, scale=2,
                                  min_width=160)
        join = gr.Button("Join the class", variant="primary")
        info = gr.Markdown(elem_id="class-student-info")
    return JoinBox(accordion, code, nickname, join, info)


def layout(joining: JoinBox) -> Section:
    """The teacher's section, placed above the lesson (the lesson's controls come later, so they are wired by
    `wire`). The store opens and migrates in the background meanwhile."""
    open_in_background()
    gr.HTML(PRESENT_CSS)
    with gr.Accordion(TEACH_LABEL, open=False, elem_id="class-teach") as teach:
        gr.Markdown(INTRO, elem_classes=["intro"])
        open_ = gr.Button("Open a class on the step shown below")
        token = gr.Textbox(elem_id="class-teacher-token", elem_classes=["atlas-hidden"], max_length=64,
                           show_label=False, container=False)
        teacher_info = gr.Markdown(elem_id="class-teacher-info")
        address = gr.Textbox(elem_classes=["atlas-hidden"], max_length=400, show_label=False, container=False)
        with gr.Column(visible=False) as teacher_box:
            room = gr.HTML(elem_id="class-room")
            with gr.Row() as controls:
                reveal = gr.Button("Reveal to the class", variant="primary")
                reask = gr.Button("Ask this step again")
                next_ = gr.Button("Next step for the class →")
                move = gr.Button("Move the class to the step shown")
                export = gr.Button("Download the answers and the summary (CSV)")
                close = gr.Button("Close the class", variant="stop")
            missing = gr.Markdown(elem_id="class-missing")
            screen = gr.Markdown(elem_id="class-presenter-link")
            with gr.Row():
                csv_file = gr.File(label="the class's answers", visible=False)
                summary_file = gr.File(label="the per-question summary", visible=False)
        summary = gr.Markdown(elem_id="class-summary")
        presenter = gr.Textbox(elem_id="class-presenter-token", elem_classes=["atlas-hidden"], max_length=64,
                               show_label=False, container=False)
    present = gr.Checkbox(False, label="presenter view (large type for a projector)")
    j = joining
    return Section(j.accordion, j.code, j.nickname, j.join, j.info, teach, open_, token, teacher_info, teacher_box,
                   reveal, next_, move, export, close, csv_file, present, room, missing, reask, summary,
                   summary_file, address, presenter, screen, controls)


def below_choices(section: Section) -> None:
    """What the Lessons tab places under the lesson's choices: the student's "send" button (beside the lesson's own
    "Check my prediction", which a class page hides: the reveal comes from the teacher) and the teacher's live chart
    of the room's predictions (under the question, where a projector shows it)."""
    section.send = gr.Button("Send my prediction to the class", variant="primary", visible=False, elem_id="class-send")
    section.counts = Plot(label="the room's predictions (live)", elem_id="class-counts", visible=False)


def wire(section: Section, *, chosen: gr.Dropdown, text: gr.Textbox, step: gr.Slider, progress: Any,
         where: gr.Markdown, prompt: gr.Markdown, before: gr.Plot, choices: gr.Radio, check: gr.Button,
         said: gr.Markdown, shown: gr.Plot, explanation: gr.Markdown, navigation: list[Any]) -> dict[str, Any]:
    """Wire the section to the lesson's controls; returns the permalink fields it adds to the Lessons tab's link
    (``class``: the join code, ``teacher``: the teacher token, ``presenter``: the read-only presenter token,
    ``present``: the presenter view). ``navigation``: the
    lesson's own choosers and buttons (lesson, input, steps, export), which a student's page hides once it has joined:
    the page then follows the teacher."""
    s = section
    send = s.send
    navigation = [*navigation, s.present]  # the presenter view is the teacher's too
    # the presenter view shows one figure per step: the one before predicting, then only the revealed one (CSS above)
    before.elem_id, shown.elem_id = before.elem_id or "lessons-before", shown.elem_id or "lessons-revealed"
    teacher = gr.State()  # {"code", "token", "counts"}: this page is the class's teacher
    student = gr.State()  # {"token", "lesson", "step", "revealed", "answer"}: this page follows a class
    kept = gr.BrowserState({}, storage_key="atlas-class-teacher")  # {"code", "token"}: the teacher link, kept in
    # this browser, so a presenter view (whose address leaves the token out) takes the class back after a reload
    timer = gr.Timer(TICK_S, active=False)  # the teacher's counts
    follow_timer = gr.Timer(FOLLOW_S, active=False)  # a student's page following the class
    presenting = gr.State()  # {"code", "token", "lesson", "step", "revealed", "counts", "students"}: a presenter page
    present_timer = gr.Timer(TICK_S, active=False)  # a presenter page following the class and its counts
    view = [where, prompt, before, choices, said, shown, explanation]
    follow = [chosen, text, step, *view]
    reveal_view = [said, shown, explanation]
    student_page = [s.teach, check, *navigation]  # what a student's page hides

    s.open.click(open_class, [chosen, step, text, s.address],
                 [teacher, s.token, s.code, s.teacher_info, s.teacher_box, s.counts, timer, kept, s.join_box, s.room,
                  s.missing, s.summary], api_name="class_open", js=ADDRESS_JS, **CLASS_EVENTS
                 ).then(presenter_link, [teacher, s.address], [s.presenter, s.screen], js=ADDRESS_JS, api_name=False,
                        **CLASS_EVENTS)
    s.token.change(resume_class, [s.code, s.token, s.address],
                   [teacher, s.teacher_info, s.teacher_box, s.counts, timer, s.teach, s.student_info, s.join_box,
                    *follow, s.room, s.missing], api_name="class_resume", js=ADDRESS_JS, **CLASS_EVENTS
                   ).then(presenter_link, [teacher, s.address], [s.presenter, s.screen], js=ADDRESS_JS,
                          api_name=False, **CLASS_EVENTS
                          ).then(lambda mine: as_teacher(mine, len(navigation) - 1), [teacher],
                                 [s.teach, s.open, s.controls, present_timer, presenting, *navigation[:-1]],
                                 api_name=False, **CLASS_EVENTS)
    # the kept teacher link arrives when the Lessons tab is first drawn, which can be after a link's class code
    # (the tab chosen by ``?tab=lessons``): then it is taken up here
    kept.change(kept_restored, [kept, s.code, s.token], [s.token], api_name=False, show_progress="hidden",
                **CLASS_EVENTS)
    s.code.change(code_given, [s.code, s.token, kept, s.presenter], [s.join_box, s.teach, s.token], api_name=False,
                  show_progress="hidden", **CLASS_EVENTS)
    def present_class(code: str, token: str, teacher_token: str, kept: dict | None, address: str,
                      request: gr.Request = None):
        return presenter_open(code, token, teacher_token, kept, address, request, navigation=len(navigation) - 1)

    s.presenter.change(present_class, [s.code, s.presenter, s.token, kept, s.address],
                       [presenting, s.teacher_info, s.teacher_box, s.counts, present_timer, s.teach, s.open,
                        s.controls, s.student_info, s.join_box, check, *follow, s.room, *navigation[:-1]],
                       api_name="class_present", js=ADDRESS_JS, **CLASS_EVENTS)
    present_timer.tick(presenter_tick, [presenting, s.present],
                       [presenting, s.counts, s.teacher_info, present_timer, *follow],
                       api_name="class_screen", show_progress="hidden", **CLASS_EVENTS)
    def join(code: str, nickname: str, progress: dict | None, request: gr.Request = None):
        return join_class(code, nickname, progress, request, navigation=len(navigation))

    s.join.click(join, [s.code, s.nickname, progress],
                 [student, s.student_info, check, send, follow_timer, *follow, *student_page[:1],
                  *student_page[2:]], api_name="class_join", **CLASS_EVENTS)
    send.click(send_answer, [student, choices], [s.student_info, student, send, choices], api_name="class_answer",
               **CLASS_EVENTS)
    choices.input(choice_changed, [student, choices], [s.student_info, choices], api_name=False,
                  show_progress="hidden", **CLASS_EVENTS)
    timer.tick(teacher_tick, [teacher, s.present], [teacher, s.counts, s.teacher_info, timer, s.missing],
               api_name="class_poll", show_progress="hidden", **CLASS_EVENTS)
    follow_timer.tick(student_tick, [student, progress],
                      [student, s.student_info, check, send, follow_timer, *follow, progress],
                      api_name="class_follow", show_progress="hidden", **CLASS_EVENTS)
    s.reveal.click(reveal_class, [teacher, s.present], [teacher, s.counts, s.teacher_info, *reveal_view],
                   api_name="class_reveal", **CLASS_EVENTS)
    s.reask.click(reask_class, [teacher, s.present], [teacher, s.counts, s.teacher_info, *reveal_view, s.missing],
                  api_name="class_reask", **CLASS_EVENTS)
    s.next.click(next_step, [teacher, chosen, step, text], [teacher, s.counts, s.teacher_info, step, s.missing],
                 api_name="class_next", **CLASS_EVENTS)
    s.move.click(move_class, [teacher, chosen, step, text], [teacher, s.counts, s.teacher_info, s.missing],
                 api_name="class_move", **CLASS_EVENTS)
    s.export.click(export_class, [teacher], [s.csv, s.teacher_info, s.summary_csv, s.summary], api_name="class_export",
                   **CLASS_EVENTS)
    s.close.click(close_class, [teacher], [teacher, s.token, s.teacher_info, s.teacher_box, timer, s.counts, kept,
                                           s.summary], api_name="class_close", **CLASS_EVENTS)
    s.present.change(None, [s.present], None, js=PRESENT_JS, api_name=False)
    return {"class": Field(s.code, _code_in_link, lambda value: value or None), "teacher": s.token,
            "presenter": s.presenter, "present": s.present}


def leave_out(parts: dict[str, str]) -> list[str]:
    """The link keys the address bar must not show: while the presenter view is on, the teacher token (the projected
    page's address is read by the whole room; the teacher's own browser keeps the link, `wire`'s ``kept``), so the
    address is the read-only presenter link, which a reload or a second screen opens; otherwise the presenter token
    (the teacher link says all)."""
    return ["teacher"] if parts.get("present") == "1" else ["presenter"]


def _code_in_link(text: str) -> str:
    """A link's ``class``: empty or a well-formed join code (whether such a class exists is the join's business)."""
    if not text:
        return ""
    try:
        return normalise_code(text)
    except ClassError:
        raise ValueError("The link's join code is not one (6 letters and digits); type the teacher's.") from None


def _kept_token(code: str, kept: dict | None) -> str | None:
    """The teacher token this browser kept for the class ``code`` (its teacher opened or resumed it here), or None."""
    kept = kept or {}
    return kept["token"] if kept.get("token") and kept.get("code") == code else None


def kept_restored(kept: dict | None, code: str, token: str):
    """The teacher link this browser kept, read once the tab is drawn: a page on that class's link without the
    teacher token (the presenter view's address) takes the class back. Output: the token."""
    try:
        code = normalise_code(code) if code and not token else ""
    except ClassError:
        code = ""
    mine = _kept_token(code, kept) if code else None
    return mine or gr.skip()


def as_teacher(mine: dict | None, navigation: int = 0):
    """After the class is resumed on this page: the teacher's controls and the lesson's choosers shown, a presenter
    screen's following stopped (a page that was a presenter screen until the kept teacher link arrived). Outputs:
    the teacher's section, "open a class", the controls, the presenter timer, presenting, then the lesson's
    navigation."""
    if not mine:
        return _skips(5 + navigation)
    return (gr.Accordion(label=TEACH_LABEL), gr.Button(visible=True), gr.Row(visible=True), gr.Timer(active=False),
            None,
            *[gr.update(visible=True)] * navigation)


def code_given(code: str, token: str, kept: dict | None, presenter: str = ""):
    """A join code arrived (a student's link, or the teacher's own class): without a teacher token the page is a
    student's: the join box opens and the teacher's section goes. The teacher's own browser, opening the class's link
    without the token (the presenter view leaves it out of the address), takes the class back with the token it kept.
    A presenter link (``presenter``) is `presenter_open`'s. Outputs: join box, teacher section, token."""
    try:
        code = normalise_code(code) if code and not token else ""
    except ClassError:  # still being typed
        code = ""
    if not code:
        return gr.skip(), gr.skip(), gr.skip()
    if mine := _kept_token(code, kept):
        return gr.skip(), gr.skip(), mine
    if presenter:
        return gr.skip(), gr.skip(), gr.skip()
    return gr.Accordion(open=True), gr.Accordion(visible=False), gr.skip()


# ------------------------------------------------------------------------------------------------ teacher
def _skips(n: int, **at: Any) -> tuple:
    """n outputs left as they are, but for the ones given by index (``at={"i3": value}``)."""
    out: list[Any] = [gr.skip()] * n
    for key, value in at.items():
        out[int(key[1:])] = value
    return tuple(out)


def _message(err: Exception) -> str:
    """A refusal's words as plain text (an `Error` holds them escaped for Gradio's toast)."""
    return html.unescape(str(err.message)) if isinstance(err, Error) else str(err)


def _said(err: Exception) -> str:
    """A refusal as the page shows it: class events skip the queue, where a raised error leaves the page blank (the
    browser gets HTTP 500 and nothing shows), so the message goes into the page itself."""
    return f"**{esc(_message(err))}**"


def _missing(state: ClassState, code: str, token: str) -> str:
    """Who has not answered the current step yet, for the teacher's own screen (the presenter view hides it)."""
    if not state.students:
        return ""
    names = _store().missing(code, token)
    if not names:
        return f"**Everybody has answered** ({state.students} of {state.students})."
    shown = ", ".join(esc(n) for n in names[:60]) + (f" and {len(names) - 60} more" if len(names) > 60 else "")
    return f"**Not answered yet ({len(names)} of {state.students}):** {shown}"


LOOPBACK = re.compile(r"(localhost|127(\.\d{1,3}){3}|0\.0\.0\.0|\[::1?\])(:\d+)?", re.I)
HOST = re.compile(r"[A-Za-z0-9.-]{1,253}(:\d{1,5})?")


def public_address(address: str, request: gr.Request | None = None) -> str:
    """The address students can open: the page's own as the teacher's browser gave it, unless that is empty or a
    loopback or unspecified host (a server reached through a proxy's tunnel, a page opened on the server itself);
    then the one the request came in at, from a reverse proxy's X-Forwarded-Host and X-Forwarded-Proto (a hosting
    front end such as a Space's: https://OWNER-NAME.hf.space) or, without a proxy, its Host header. The path of the
    browser's address is kept (an app mounted under a path)."""
    from urllib.parse import urlsplit

    given = urlsplit(address or "")
    if given.scheme in ("http", "https") and given.netloc and not LOOPBACK.fullmatch(given.netloc):
        return address
    headers = {k.lower(): str(v) for k, v in ((request.headers or {}).items() if request is not None else ())}
    forwarded = headers.get("x-forwarded-host", "").split(",")[0].strip()
    host = forwarded or headers.get("host", "").strip()
    if not HOST.fullmatch(host):
        return address
    proto = headers.get("x-forwarded-proto", "").split(",")[0].strip().lower() if forwarded else given.scheme
    proto = proto if proto in ("http", "https") else "https" if forwarded else "http"
    return f"{proto}://{host}{given.path or '/'}"


def open_class(title: str, step: Any, text: str, address: str = "", request: gr.Request = None):
    """Open a class on the step this page shows; this page becomes its teacher. ``address``: the page's own (from
    the browser), which the QR code's join link opens. Outputs: teacher, token, code, teacher info, teacher box,
    counts, timer, the kept link, the join box, the join screen, who has not answered, the summary (cleared)."""
    try:
        number, s, q = _step_of(title, step, text)
        store = _store()
        opened = store.open(number, s, q.choices, q.answer, text or "")
        state = store.teacher_state(opened.code, opened.token)
    except (ClassError, Error) as err:
        return _skips(12, i3=_said(err))
    mine = {"code": opened.code, "token": opened.token, "counts": dict(state.counts), "students": state.students}
    return (mine, opened.token, opened.code, _teacher_text(state), gr.Column(visible=True),
            gr.Plot(_chart(state), visible=True), gr.Timer(active=True), {"code": opened.code, "token": opened.token},
            gr.Accordion(visible=False), join_screen(opened.code, public_address(address, request)), "", "")


NOT_TEACHER = "This teacher link is not valid"


def resume_class(code: str, token: str, address: str = "", request: gr.Request = None):
    """The teacher link opened again: this page becomes the class's teacher and shows the class's step. A link whose
    token is not the class's says so (in the join box, which a page with a class code opens) and the page stays a
    student's. Outputs: teacher, teacher info, teacher box, counts, timer, teacher section, student info, join box,
    then the lesson view (`_show`), the join screen and who has not answered."""
    if not token:
        return _skips(8 + 10 + 2)
    try:
        state = _store().teacher_state(code, token)
        missing = _missing(state, code, token)
    except (ClassError, Error) as err:
        said = f"**{NOT_TEACHER}** ({esc(_message(err))}). To join this class as a student, type a nickname."
        return _skips(8 + 10 + 2, i1=said, i5=gr.Accordion(visible=False), i6=said, i7=gr.Accordion(open=True))
    mine = {"code": state.code, "token": token, "counts": dict(state.counts), "students": state.students}
    return (mine, _teacher_text(state), gr.Column(visible=True), gr.Plot(_chart(state), visible=True),
            gr.Timer(active=True), gr.Accordion(open=True, visible=True), gr.skip(), gr.Accordion(visible=False),
            *_show(state, None), join_screen(state.code, public_address(address, request)), missing)


def _teacher(mine: dict | None) -> tuple[str, str]:
    if not mine:
        raise ClassError("Open a class first (or open your teacher link).")
    return mine["code"], mine["token"]


def reveal_class(mine: dict | None, large: bool = False):
    """Reveal the step to every student's page (and on this one: the answer, the figure, the explanation)."""
    try:
        code, token = _teacher(mine)
        state = _store().reveal(code, token)
    except (ClassError, Error) as err:
        return _skips(6, i2=_said(err))
    q = _question(state.lesson, state.step, state.input)
    return ({**mine, "counts": dict(state.counts)}, _chart(state, large), _teacher_text(state),
            f"The numbers say **{esc(q.answer)}** — {esc(q.fact)}.", q.reveal(None), q.explanation)


def _advance(mine: dict | None, number: int, s: int, text: str) -> ClassState:
    code, token = _teacher(mine)
    q = _question(number, s, text)
    return _store().advance(code, token, number, s, q.choices, q.answer, text or "")


def next_step(mine: dict | None, title: str, step: Any, text: str):
    """The class and this page move to the lesson's next step (it stays on the last one). Outputs: teacher, counts,
    teacher info, the step, who has not answered."""
    number = _lessons()._number(title)
    s = min(int(step or 1) + 1, len(_lessons().LESSONS[number - 1].steps))
    try:
        state = _advance(mine, number, s, text)
        missing = _missing(state, *_teacher(mine))
    except (ClassError, Error) as err:
        return _skips(5, i2=_said(err))
    return {**mine, "counts": dict(state.counts)}, _chart(state), _teacher_text(state), s, missing


def move_class(mine: dict | None, title: str, step: Any, text: str):
    """The class moves to the lesson and step this page shows. Outputs: teacher, counts, teacher info, who has not
    answered."""
    try:
        number, s, _ = _step_of(title, step, text)
        state = _advance(mine, number, s, text)
        missing = _missing(state, *_teacher(mine))
    except (ClassError, Error) as err:
        return _skips(4, i2=_said(err))
    return {**mine, "counts": dict(state.counts)}, _chart(state), _teacher_text(state), missing


def reask_class(mine: dict | None, large: bool = False):
    """Ask the class's step again: its answers are cleared for the whole class and its reveal undone (students'
    pages show the question again and may send a new prediction), and this page's reveal is cleared. Outputs:
    teacher, counts, teacher info, said, the revealed figure, explanation, who has not answered."""
    try:
        code, token = _teacher(mine)
        state = _store().reask(code, token)
        missing = _missing(state, code, token)
    except (ClassError, Error) as err:
        return _skips(7, i2=_said(err))
    return ({**mine, "counts": dict(state.counts)}, _chart(state, large),
            _teacher_text(state) + "\n\n**Asked again:** the step's answers are cleared; the room answers anew.",
            "", None, "", missing)


def _summary(code: str, token: str) -> str:
    return f"### Per question, class `{esc(code)}`\n\n" + summary_table(_store().summary(code, token))


def export_class(mine: dict | None):
    """Outputs: the answers' CSV file, teacher info (only on a refusal), the per-question summary's CSV file, the
    summary as a table on the page."""
    try:
        code, token = _teacher(mine)
        store = _store()
        answers, summary = store.export_csv(code, token), store.summary_csv(code, token)
        table = _summary(code, token)
    except (ClassError, Error) as err:
        return _skips(4, i1=_said(err))
    DOWNLOADS.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    path, per_question = DOWNLOADS / f"class-{code}-{tag}.csv", DOWNLOADS / f"class-{code}-summary-{tag}.csv"
    path.write_text(answers, encoding="utf-8")
    per_question.write_text(summary, encoding="utf-8")
    return (gr.File(value=str(path), visible=True), gr.skip(), gr.File(value=str(per_question), visible=True),
            table)


def close_class(mine: dict | None):
    """Close the class; its per-question summary stays on this page (the class can no longer be read). Outputs:
    teacher, token, teacher info, teacher box, timer, counts, the kept link, the summary."""
    try:
        code, token = _teacher(mine)
        table = _summary(code, token)
        _store().close(code, token)
    except (ClassError, Error) as err:
        return _skips(8, i2=_said(err))
    said = (f"The class `{code}` is closed: students can no longer join or answer, and its answers are deleted when "
            "the next class is opened. Its summary per question is below (download the CSV before closing to keep "
            "it).")
    return None, "", said, gr.Column(visible=False), gr.Timer(active=False), gr.Plot(visible=False), {}, table


# ------------------------------------------------------------------------------------------ the presenter screen
def presenter_address(address: str, code: str, token: str) -> str:
    """The presenter link of a class: the app's address (`public_address`) with the class, its presenter token and
    the presenter view."""
    return f"{address or ''}?tab=lessons&class={code}&presenter={token}&present=1"


def presenter_link(mine: dict | None, address: str = "", request: gr.Request = None):
    """On the teacher's page once the class is open or resumed: the presenter token (the page's link carries it while
    the presenter view is on, `leave_out`) and the presenter link written out for a projector or a second screen.
    Outputs: presenter token, the link's text."""
    if not mine:
        return gr.skip(), gr.skip()
    try:
        token = _store().presenter_token(mine["code"], mine["token"])
    except (ClassError, Error) as err:
        return gr.skip(), _said(err)
    link = presenter_address(public_address(address, request), mine["code"], token)
    return token, (f"**Presenter link** (read-only, for a projector or a second screen: it follows the class with "
                   f"the room's counts and the reveal, has no controls and shows no nickname; turning the presenter "
                   f"view on puts it in this page's address): `{esc(link)}`")


def _presenter_text(state: ClassState) -> str:
    said = "revealed" if state.revealed else "not revealed yet"
    return (f"### Join code: `{state.code}`\n{state.students} student{'s' * (state.students != 1)} joined · lesson "
            f"{state.lesson}, step {state.step} · {state.answered} answered · {said}.\n\nThe class's presenter "
            "screen: it follows the teacher's lesson and step and shows the room's predictions and the reveal; the "
            "teacher's controls are on the teacher's own page.")


def _revealed(state: ClassState) -> tuple[str, Any, str]:
    """A revealed step as the room sees it: the verdict's words, the revealed figure, the explanation."""
    q = _question(state.lesson, state.step, state.input)
    return f"The numbers say **{esc(q.answer)}** — {esc(q.fact)}.", q.reveal(None), q.explanation


PRESENTER_OUTPUTS = 11 + 10 + 1  # presenting … check; the lesson view; the join screen (then the navigation)


def presenter_open(code: str, token: str, teacher_token: str = "", kept: dict | None = None, address: str = "",
                   request: gr.Request = None, navigation: int = 0):
    """A presenter link opened (``?class=CODE&presenter=TOKEN``): this page becomes the class's presenter screen,
    read-only: the join code and QR code, the room's live counts, the class's lesson step and its reveal, no
    controls (the teacher's buttons, the lesson's choosers and "Check" go) and no join box. The teacher's own page,
    or a browser that kept the teacher link, stays the teacher's (`code_given` takes it back). A token that is not
    the class's is said in the join box, and the page stays a student's. Outputs: presenting, teacher info, teacher
    box, counts, timer, teacher section, "open a class", the controls, student info, join box, check, the lesson
    view (`_show`), the join screen, then the lesson's navigation."""
    hide = [gr.update(visible=False)] * navigation
    try:
        code = normalise_code(code) if code else ""
    except ClassError:
        code = ""
    if not token or not code or teacher_token or _kept_token(code, kept):
        return _skips(PRESENTER_OUTPUTS + navigation)
    try:
        state = _store().presenter_state(code, token)
    except (ClassError, Error) as err:
        said = f"**{esc(_message(err))}** To join this class as a student, type a nickname."
        return _skips(PRESENTER_OUTPUTS + navigation, i5=gr.Accordion(visible=False), i8=said,
                      i9=gr.Accordion(open=True))
    mine = {"code": state.code, "token": token, "lesson": state.lesson, "step": state.step,
            "revealed": state.revealed, "counts": dict(state.counts), "students": state.students}
    view = list(_show(state, None))
    if state.revealed:
        view[7:10] = _revealed(state)
    return (mine, _presenter_text(state), gr.Column(visible=True), gr.Plot(_chart(state, True), visible=True),
            gr.Timer(active=True), gr.Accordion(label=f"Class {state.code}: the presenter screen", open=True,
                                                visible=True),
            gr.Button(visible=False), gr.Row(visible=False), gr.skip(), gr.Accordion(visible=False),
            gr.Button(visible=False), *view, join_screen(state.code, public_address(address, request)), *hide)


def presenter_tick(mine: dict | None, large: bool = True):
    """Every `TICK_S` on a presenter page: follow the class to its step, redraw the counts when they change, show the
    reveal once the teacher reveals and the question afresh when the step is asked again; a class closed or expired
    is said and the timer stops. Outputs: presenting, counts, teacher info, the timer, the lesson view (`_show`)."""
    out: list[Any] = [gr.skip()] * 14
    if not mine:
        out[3] = gr.Timer(active=False)
        return tuple(out)
    try:
        state = _store().presenter_state(mine["code"], mine["token"])
    except (ClassError, Error) as err:
        out[0], out[2], out[3] = None, _said(err), gr.Timer(active=False)
        return tuple(out)
    moved = (state.lesson, state.step) != (mine["lesson"], mine["step"])
    if moved or (mine["revealed"] and not state.revealed):  # the teacher moved on, or asks the step again
        out[4:14] = _show(state, None)
    elif state.revealed and not mine["revealed"]:
        out[11:14] = _revealed(state)
    changed = moved or state.revealed != mine["revealed"] or state.counts != mine["counts"] or \
        state.students != mine["students"]
    if changed:
        out[0] = {**mine, "lesson": state.lesson, "step": state.step, "revealed": state.revealed,
                  "counts": dict(state.counts), "students": state.students}
        out[1], out[2] = _chart(state, large), _presenter_text(state)
    return tuple(out)


# ------------------------------------------------------------------------------------------------ students
def _show(state: ClassState, progress: dict | None) -> tuple:
    """The page's lesson controls set to the class's step, its question shown and the reveal cleared."""
    lessons = _lessons()
    q = _question(state.lesson, state.step, state.input)
    steps = len(lessons.LESSONS[state.lesson - 1].steps)
    return (_title(state.lesson), state.input, gr.update(value=state.step, maximum=steps),
            lessons._where(state.lesson, state.step, progress), q.text,
            gr.update(value=q.before, visible=q.before is not None), gr.update(choices=q.choices, value=None),
            "", None,
            "")


def _student_text(state: ClassState, nickname: str, mine: str | None) -> str:
    said = (f"your prediction *{esc(mine)}* is in (the first one counts)" if mine
            else "pick your prediction below and send it")
    after = ("revealed: see the answer below" if state.revealed else "the teacher reveals it when the room has "
             "answered")
    return (f"You are in class `{state.code}` as **{esc(nickname)}** · lesson {state.lesson}, step {state.step}: "
            f"{said}; {after}.")


JOINED_OUTPUTS = 5 + 10 + 1  # student, info, check, send, timer; the lesson view; the teacher section


def join_class(code: str, nickname: str, progress: dict | None, request: gr.Request = None, navigation: int = 0):
    """Join with the room's code and a nickname: this page then follows the class (the lesson's own "Check" is
    replaced by "Send my prediction to the class", and the lesson's choosers and the teacher's section go). A refusal
    (a wrong code, an empty nickname, too many wrong codes) is said in the join box. Outputs: student, student info,
    check, send, the follow timer, the lesson view (`_show`), the teacher section, then the lesson's navigation."""
    hide = [gr.update(visible=False)] * navigation
    try:
        store = _store()
        joined = store.join(code, nickname, _client(request))
        state, name, mine = store.student_state(joined.token)
    except (ClassError, Error) as err:
        return (*_skips(JOINED_OUTPUTS, i1=_said(err)), *(gr.skip() for _ in hide))
    me = {"token": joined.token, "lesson": state.lesson, "step": state.step, "revealed": state.revealed,
          "answer": mine}
    return (me, _student_text(state, name, mine), gr.Button(visible=False),
            gr.Button(visible=True, interactive=not (mine or state.revealed)), gr.Timer(active=True),
            *_show(state, progress), gr.Accordion(visible=False), *hide)


def send_answer(me: dict | None, choice: str | None):
    """The student's prediction for the step their page shows, recorded once; a second one (or one after the reveal)
    is refused in words and the choice shown goes back to the one recorded. Outputs: student info, student, send,
    choices."""
    if not me:
        return "**Join a class first: its code and a nickname.**", gr.skip(), gr.skip(), gr.skip()
    if not choice:
        return "**Pick a prediction first, then send it.**", gr.skip(), gr.skip(), gr.skip()
    store = None
    try:
        store = _store()
        store.answer(me["token"], me["lesson"], me["step"], choice)
        state, name, mine = store.student_state(me["token"])
    except (ClassError, Error) as err:
        first = me.get("answer")
        if store is not None:
            try:
                first = store.student_state(me["token"])[2]
            except ClassError:
                pass
        return (_said(err), {**me, "answer": first} if first else gr.skip(),
                gr.Button(interactive=False) if first else gr.skip(),
                gr.update(value=first) if first else gr.skip())
    return _student_text(state, name, mine), {**me, "answer": mine}, gr.Button(interactive=False), gr.skip()


def choice_changed(me: dict | None, choice: str | None):
    """A student's page: a new pick after their prediction is in, or after the reveal, changes nothing; say so, and
    show the recorded one again. Outputs: student info, choices."""
    if not me or not choice:
        return gr.skip(), gr.skip()
    first = me.get("answer")
    if first and choice != first:
        return (f"**Your first prediction, *{esc(first)}*, is the one recorded for this step; it counts, not a new "
                "one.**", gr.update(value=first))
    if me.get("revealed") and not first:
        return "**The teacher has revealed this step: answers to it are closed.**", gr.update(value=None)
    return gr.skip(), gr.skip()


def teacher_tick(mine: dict | None, large: bool = False):
    """Every `TICK_S` on the teacher's page: the counts and who has not answered, redrawn only when they changed.
    Outputs: teacher, counts, teacher_info, the timer, who has not answered."""
    if not mine:
        return gr.skip(), gr.skip(), gr.skip(), gr.Timer(active=False), gr.skip()
    try:
        state = _store().teacher_state(mine["code"], mine["token"])
        if state.counts == mine.get("counts") and state.students == mine.get("students"):
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        missing = _missing(state, mine["code"], mine["token"])
    except (ClassError, Error) as err:
        return None, gr.skip(), _said(err), gr.Timer(active=False), gr.skip()
    return ({**mine, "counts": dict(state.counts), "students": state.students}, _chart(state, large),
            _teacher_text(state), gr.skip(), missing)


def scored(progress: dict | None, lesson: int, step: int, right: bool) -> dict:
    """The browser's score with a step's first answer added (a class answer counts as the lesson's own would)."""
    progress = dict(progress or {})
    got = dict(progress.get(str(lesson), {}))
    got.setdefault(str(step), bool(right))
    progress[str(lesson)] = got
    return progress


def student_tick(me: dict | None, progress: dict | None):
    """Every `FOLLOW_S` on a student's page: follow the class to its step; show the reveal once the teacher has
    revealed (with this student's own answer marked, and scored in the page's score line); show the question afresh
    when the teacher asks the step again. Outputs: student,
    student_info, check, send, the timer, then the lesson view (`_show`: lesson, input, step, where, prompt, before,
    choices, said, shown, explanation), then the score kept in the browser."""
    skip = gr.skip()
    out: list[Any] = [skip] * 16
    if not me:
        out[4] = gr.Timer(active=False)
        return tuple(out)
    try:
        state, name, answered = _store().student_state(me["token"])
    except (ClassError, Error) as err:
        out[:5] = None, _said(err), gr.Button(visible=True), gr.Button(visible=False), gr.Timer(active=False)
        return tuple(out)
    if (state.lesson, state.step) != (me["lesson"], me["step"]):  # the teacher moved on: follow
        out[0] = {**me, "lesson": state.lesson, "step": state.step, "revealed": False, "answer": answered}
        out[1] = _student_text(state, name, answered)
        out[3] = gr.Button(interactive=not answered)
        out[5:15] = _show(state, progress)
    elif (me.get("revealed") and not state.revealed) or (me.get("answer") and not answered):  # asked again
        out[0] = {**me, "revealed": False, "answer": None}
        out[1] = (_student_text(state, name, None) + " **The teacher asks this step again:** your earlier answer is "
                  "cleared; send a new prediction.")
        out[3] = gr.Button(interactive=True)
        out[5:15] = _show(state, progress)
    elif state.revealed and not me["revealed"]:  # the teacher revealed: show it with this student's answer
        q = _question(state.lesson, state.step, state.input)
        out[0] = {**me, "revealed": True, "answer": answered}
        out[1] = _student_text(state, name, answered)
        out[3] = gr.Button(interactive=False)
        if answered:
            right, words = _lessons().verdict(q, answered)
            progress = scored(progress, state.lesson, state.step, right)
            out[8] = _lessons()._where(state.lesson, state.step, progress)
            out[15] = progress
        else:
            words = f"You did not send a prediction; the numbers say **{esc(q.answer)}** — {esc(q.fact)}."
        out[12], out[13], out[14] = words, q.reveal(answered), q.explanation
    return tuple(out)
