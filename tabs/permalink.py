"""Permalinks: a tab's current view in the page URL's query string, and that URL opening the same view.

A tab's ``build()`` returns a `Permalink` that says what its link holds (docs/ARCHITECTURE.md §8):

- ``fields``: query key -> control, set from the link before the tab's main action runs. A value is accepted only
  if the control itself would take it (one of its choices, a slider value in its range and on its step, a text
  within its length, a whole-number seed), so a link can say nothing a person could not have picked; a `Field`
  reads and writes a control its own way (Vision's example image by its name: a link never carries a path);
- ``run``: the main action as the steps its button chains, ``(fn, inputs, outputs[, event options])``; it runs
  after the fields are set when the link gives any of the tab's keys (a bare ``?tab=...`` only selects the tab),
  or at every page load (``at_load``: the tabs that draw without a trained model);
- ``after``: the controls whose range comes from the result (layer, head, replay step, clicked patch), set once the
  run is done if ``limits(state)`` (the tab's kept ``state``) allows the value; their change events redraw.

`wire` (called once by app.py) adds the page-load event that reads ``gr.Request.query_params``, selects the tab,
sets its controls and starts its run, and for every tab an event that writes the query string again (only values
that differ from the defaults, never an empty one; no ``tab`` for the first tab, which a query without one means)
whenever a declared control changes or the tab is chosen; a hidden box carries it to ``history.replaceState``.
Anything unknown or not allowed falls back to its default with a notice at the top of the page, never an error; an
empty value is ignored. A link's run draws the linked view first (``preset``, ``finish``). The same page-load event
leaves the configured folders that the start-up check refused out of every model choice (``tabs.common.model_choice``),
and a link cannot name them. The pure functions
(`read_query`, `check_after`, `write_query`, `preset_run`) are tested on their own.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import gradio as gr

from serving import catalogue
from tabs.common import FAST, MAX_SEED, MAX_TEXT_CHARS, MODEL_CHOICE, without_refused

# Gradio's own query keys (?view=api opens the API page, ?__theme=dark): never ours, never "unknown".
GRADIO_KEYS = frozenset({"view", "__theme", "deep_link"})
MAX_KEYS = 40  # more keys than any tab declares: the rest of a longer query is not read
MAX_AFTER_CHARS = 40  # a layer, head, step or patch is short
BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")  # text direction overrides ("Trojan Source")
NUMBER = re.compile(r"-?[0-9]{1,20}(\.[0-9]{1,12})?")  # plain decimals: no exponents, infinities or NaN


@dataclass(frozen=True)
class Field:
    """A control whose link text the tab reads and writes itself. ``read`` raises ValueError when the text is not
    allowed (its message, if any, is the notice); ``write`` returns None to leave the control out of the link."""

    component: Any
    read: Callable[[str], Any]
    write: Callable[[Any], str | None]


@dataclass(frozen=True)
class Permalink:
    """What one tab's link holds, and how opening it reproduces the view (module docstring)."""

    fields: dict[str, Any]  # key -> control (or Field), set before the run
    run: list[tuple] = field(default_factory=list)  # the main action's steps, as its button chains them
    at_load: bool = False  # run at every page load, not only when a link names the tab
    after: dict[str, Any] = field(default_factory=dict)  # key -> control, set after the run within limits(state)
    state: Any = None  # the tab's gr.State that limits() reads
    limits: Callable[[Any], dict[str, Container]] | None = None  # kept state -> the values each after-key may take
    leave_out: Callable[[dict[str, str]], Iterable[str]] | None = None  # a link's keys -> those the address bar must
    # not show (the Lessons tab's teacher token in the presenter view: the projected page's address is public)
    # The linked view is the first one drawn (issue 61, item 5): the after-keys the run's first step can take as its
    # own inputs (key -> that input: the hidden run layer, the head) are handed to it when a link gives them, and
    # ``finish(asked, inputs, outputs)`` (the after-keys' texts, the inputs the step ran with, its outputs) redraws
    # what the run cannot take
    # (Generate's replay step, Vision's clicked patch) before anything is drawn. A value the run refuses falls back
    # to the run with the defaults; the after-keys are then refused with the notice, as before.
    preset: dict[str, Any] = field(default_factory=dict)
    finish: Callable[[dict[str, str], list, tuple], tuple] | None = None
    link_run: list[tuple] | None = None  # the steps a link runs, when they differ from the button's (``run``)


def one_of(control: Any, choices: Callable[[], Iterable[str]]) -> Field:
    """A free-text control whose link text must be empty or one of ``choices()`` (any case): the class to explain,
    checked against the labels the checkpoints list, so a link cannot name a class no model has."""

    def read(text: str) -> str:
        if text and text.lower() not in {str(c).lower() for c in choices()}:
            raise ValueError
        return text

    return Field(control, read, lambda value: value or None)


def chain(trigger: Callable, steps: list[tuple], **first: Any):
    """Wire ``steps`` one after another on ``trigger`` (an event listener such as ``button.click``); ``first`` are
    the first step's event options (its api_name), every later step is UI-only. Returns the last event."""
    event = None
    for i, (fn, inputs, outputs, *options) in enumerate(steps):
        kwargs = {"api_name": False, **(options[0] if options else {}), **(first if i == 0 else {})}
        event = (trigger if event is None else event.then)(fn, inputs, outputs, **kwargs)
    return event


# ------------------------------------------------------------------------------------ values <-> link text
def component_of(control: Any) -> Any:
    return control.component if isinstance(control, Field) else control


def _number(text: str, low: float | None, high: float | None, step: float | None) -> int | float:
    """A plain decimal within [low, high] and on the step's grid from ``low``: an int on a whole-number grid (a
    seed's digits exactly), else the grid's own float (0.7000000001 -> 0.7)."""
    if not NUMBER.fullmatch(text):
        raise ValueError
    value: int | float = int(text) if "." not in text else float(text)
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError
    base, step = low or 0, step or 0
    if float(step or 1).is_integer() and float(base).is_integer():
        if value != int(value) or (step and (int(value) - int(base)) % int(step)):
            raise ValueError
        return int(value)
    k = (value - base) / step if step else 0
    if step and abs(k - round(k)) > 1e-6:
        raise ValueError
    return round(base + round(k) * step, 10) if step else float(value)


def check_text(text: str, limit: int) -> str:
    """A text a link may carry: within the control's length, no control characters (tab and newlines aside) and
    no text-direction overrides, which would make the text read differently from what the model sees."""
    if len(text) > limit or any(ch in BIDI or (unicodedata.category(ch) in ("Cc", "Cs") and ch not in "\t\n\r")
                                for ch in text):
        raise ValueError
    return text


def read_value(control: Any, text: str) -> Any:
    """The value a control takes from its link text; ValueError when the control would not take it."""
    if isinstance(control, Field):
        return control.read(text)
    if isinstance(control, gr.Checkbox):
        flags = {"1": True, "true": True, "0": False, "false": False}
        if text.lower() not in flags:
            raise ValueError
        return flags[text.lower()]
    if isinstance(control, (gr.Radio, gr.Dropdown)):
        if getattr(control, MODEL_CHOICE, False) and text in catalogue.refused():  # left out of the choices
            raise ValueError
        for _, value in control.choices:
            if str(value) == text:
                return value
        raise ValueError
    if isinstance(control, gr.Slider):
        return _number(text, control.minimum, control.maximum, control.step)
    if isinstance(control, gr.Number):  # a seed: a whole number, within the control's bounds when it has them
        low = 0 if control.minimum is None else control.minimum
        return int(_number(text, low, MAX_SEED if control.maximum is None else control.maximum, 1))
    if isinstance(control, gr.Textbox):
        return check_text(text, min(control.max_length or MAX_TEXT_CHARS, LINK_TEXT_CHARS))
    raise ValueError


# the longest text a link carries: a server reads a request's line and headers up to about 16 KB (h11's default,
# under uvicorn), and URL-encoding triples a non-ASCII character; a longer text (a pasted document) is left out
LINK_TEXT_CHARS = 4000


def write_value(control: Any, value: Any) -> str | None:
    """A control's value as link text (None: not expressible, left out; a text over LINK_TEXT_CHARS too)."""
    if isinstance(control, Field):
        return control.write(value)
    if value is None or (isinstance(value, str) and len(value) > LINK_TEXT_CHARS):
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)):
        return str(int(value)) if float(value).is_integer() else f"{value:.10g}"
    return str(value)


def default_text(control: Any) -> str | None:
    """What the control shows when the page opens, as link text: a value equal to it stays out of the link."""
    return write_value(control, component_of(control).value)


# -------------------------------------------------------------------------------------------- reading a link
@dataclass(frozen=True)
class Restored:
    """What a query asks for: the tab, the values to set before its run, the after-keys' texts, and what was not
    allowed (the keys that fell back to their defaults, sentences of their own, how many keys are unknown)."""

    tab: str | None = None
    values: dict[str, Any] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)
    refused: tuple[str, ...] = ()
    messages: tuple[str, ...] = ()
    unknown: int = 0

    @property
    def run(self) -> bool:
        """Whether the link asks for the tab's main action: it gives any of the tab's keys (a bare ?tab=... only
        selects the tab; after a run the layer, the last one, is always in the link)."""
        return bool(self.values or self.pending or self.refused or self.messages)


def notice(refused: tuple[str, ...] | list[str] = (), messages: tuple[str, ...] | list[str] = (),
           unknown: int = 0) -> str:
    """The notice for what a link could not restore. It names only declared keys (never a value from the link)."""
    parts = []
    if refused:
        parts.append(f"{', '.join(f'`{k}`' for k in refused)} {'is' if len(refused) == 1 else 'are'} not allowed "
                     "here, so the default is shown.")
    parts.extend(messages)
    if unknown:
        parts.append(f"{unknown} unknown {'entry was' if unknown == 1 else 'entries were'} ignored.")
    return ("**This link could not be restored completely:** " + " ".join(parts)) if parts else ""


def read_query(query: Mapping[str, str], links: Mapping[str, Permalink | None]) -> Restored:
    """A page's query (``gr.Request.query_params``) read against the tabs' permalinks (tab key -> Permalink, or
    None for a tab whose link holds only the tab; the first tab is the one a query without ``tab`` means).
    Nothing in it is trusted: unknown keys are counted, values the controls would not take are refused, a tab
    that does not exist restores nothing."""
    query = {k: v for k, v in list(query.items())[:MAX_KEYS] if k not in GRADIO_KEYS}
    if not query:
        return Restored()
    tab = query.pop("tab", next(iter(links)))
    if tab not in links:
        return Restored(messages=("It names no tab of this app.",), unknown=len(query))
    link = links[tab] or Permalink({})
    values, pending, refused, messages, unknown = {}, {}, [], [], 0
    for key, text in query.items():
        if text == "" and (key in link.fields or key in link.after):  # an empty value says nothing: ignored
            continue
        if key in link.fields:
            try:
                values[key] = read_value(link.fields[key], text)
            except ValueError as err:  # a Field's own sentence, else the key in the list
                if str(err):
                    messages.append(str(err))
                else:
                    refused.append(key)
        elif key in link.after and len(text) <= MAX_AFTER_CHARS:
            pending[key] = text
        elif key in link.after:
            refused.append(key)
        else:
            unknown += 1
    return Restored(tab, values, pending, tuple(refused), tuple(messages), unknown)


def check_after(link: Permalink, pending: Mapping[str, str], state: Any) -> tuple[dict[str, Any], list[str]]:
    """The after-keys' values that the run's result allows (``link.limits(state)``), and the keys refused."""
    allowed = link.limits(state) if (state is not None and link.limits) else {}
    values, refused = {}, []
    for key, text in pending.items():
        control = component_of(link.after[key])
        value: Any = text
        if isinstance(control, (gr.Slider, gr.Number)):
            value = int(text) if text.isascii() and text.isdigit() else None
        if key in allowed and value in allowed[key]:
            values[key] = value
        else:
            refused.append(key)
    return values, refused


def write_query(tab: str, link: Permalink | None, values: list[Any], first: str | None = None,
                ran: bool = False) -> str:
    """The query string of a view: the tab (left out when it is ``first``, the tab a bare query means), then each
    declared control (fields, then after) whose value differs from its default, in the order declared. Once the tab
    has run (``ran``: its state holds a result) the after-keys are written even at their controls' defaults: their
    default after a run comes from the result (the last layer), so a view of layer 0 must say so."""
    parts = {} if tab == first else {"tab": tab}
    controls = {**link.fields, **link.after} if link else {}
    after = set(link.after) if link and ran else set()
    for (key, control), value in zip(controls.items(), values, strict=True):
        text = write_value(control, value)
        if text and (key in after or text != default_text(control)):  # never an empty value (Vision's `patch=`)
            parts[key] = text
    for key in (link.leave_out(dict(parts)) if link and link.leave_out else ()):
        parts.pop(key, None)
    return urlencode(parts, quote_via=quote)


# ----------------------------------------------------------------------------------------------- the wiring
# Writes the query string a tab's event computed into the address bar (no reload), keeping Gradio's own keys.
REPLACE_URL = """(query) => {
  const now = new URLSearchParams(location.search), next = new URLSearchParams(query || '');
  for (const key of ['__theme', 'view', 'deep_link']) if (now.has(key)) next.set(key, now.get(key));
  const q = next.toString();
  history.replaceState(history.state, '', location.pathname + (q ? '?' + q : '') + location.hash);
}"""


def tab_key(module: Any) -> str:
    """A tab's key in links and its gr.Tab id: its module's name (tabs.translate -> "translate")."""
    return module.__name__.rsplit(".", 1)[-1]


def wire(demo: gr.Blocks, tabs: gr.Tabs, items: dict[str, tuple[gr.Tab, Permalink | None]],
         notice_box: gr.Markdown) -> None:
    """Restore a link at page load and keep the address bar in step (module docstring). ``items``: tab key ->
    (its gr.Tab, its Permalink or None), in the order of the tabs."""
    links = {key: link for key, (_, link) in items.items()}
    first = next(iter(links))
    url = gr.Textbox(elem_id="permalink", elem_classes=["atlas-hidden"], show_label=False, container=False)
    url.change(None, [url], None, js=REPLACE_URL, api_name=False)
    for key, (item, link) in items.items():
        controls = [component_of(c) for c in ({**link.fields, **link.after} if link else {}).values()]
        kept = [link.state] if link and link.after and link.state is not None else []  # whether the tab has run
        gr.on([item.select, *(c.change for c in controls)], _writer(key, link, first, bool(kept)), controls + kept,
              [url], api_name=False, show_progress="hidden", trigger_mode="always_last", **FAST)
    # Each tab whose run waits for a link gets a State that the restore sets; its change runs the tab's steps.
    starts = {key: gr.State() for key, link in links.items() if link and link.run and not link.at_load}
    targets = [(key, name, component_of(c)) for key, link in links.items() if link for name, c in link.fields.items()]
    # the model choices (tabs.common.model_choice): the folders the start-up check refused after the page was built
    # are left out at each page load, with the link's value where the same control takes one
    choices = [b for b in demo.blocks.values() if getattr(b, MODEL_CHOICE, False)]
    others = [c for c in choices if all(c is not t for _, _, t in targets)]

    def restore(request: gr.Request):
        asked = read_query(dict(request.query_params) if request else {}, links)
        # with what the link could not restore, the configured folders refused after start-up (their tabs' notices
        # were written before the check)
        text = "\n\n".join(x for x in (notice(asked.refused, asked.messages, asked.unknown),
                                        catalogue.checked_notice()) if x)
        start = {"pending": asked.pending, "refused": list(asked.refused), "messages": list(asked.messages),
                 "unknown": asked.unknown}
        shown = {id(c): without_refused(c) for c in choices}

        def update(control: Any, value: dict) -> Any:
            both = {**(shown.get(id(control)) or {}), **value}
            return gr.update(**both) if both else gr.skip()

        return (gr.Tabs(selected=asked.tab) if asked.tab else gr.skip(),
                gr.update(value=text, visible=True) if text else gr.skip(),
                *(update(c, {"value": asked.values[name]} if key == asked.tab and name in asked.values else {})
                  for key, name, c in targets),
                *(update(c, {}) for c in others),
                *(start if key == asked.tab and asked.run else gr.skip() for key in starts))

    loaded = demo.load(restore, None, [tabs, notice_box, *(c for _, _, c in targets), *others, *starts.values()],
                       api_name=False, show_progress="hidden", **FAST)
    for key, link in links.items():
        if link and link.at_load:  # drawn at every page load, after the link's values are set
            chain(loaded.then, link.run)
        elif key in starts:
            done = chain(starts[key].change, linked_steps(link, starts[key]))
            if link.after:
                done.then(_after(link), [starts[key], link.state],
                          [*(component_of(c) for c in link.after.values()), notice_box], api_name=False,
                          show_progress="hidden", **FAST)


def linked_steps(link: Permalink, start: Any) -> list[tuple]:
    """The steps a link runs: the tab's own (``link_run`` or ``run``), the first one taking the link's after-keys
    where it can (``preset``, ``finish``), so the first figures drawn are the linked view's."""
    steps = list(link.link_run or link.run)
    if not steps or not (link.preset or link.finish):
        return steps
    fn, inputs, outputs, *options = steps[0]
    if options and options[0].get("batch"):  # a batch function takes lists: left as it is
        return steps
    where = {key: inputs.index(component_of(c)) for key, c in link.preset.items()}
    steps[0] = (preset_run(fn, where, link.finish), [start, *inputs], outputs, *options)
    return steps


def preset_run(fn: Callable, where: dict[str, int], finish: Callable | None = None) -> Callable:
    """``fn`` with a first input more, the link's start (`wire`): its after-keys' texts replace the inputs at
    ``where`` (key -> position; a number when the text is a whole number), then ``finish`` redraws the rest. If the
    run refuses a linked value (a layer the model does not have) it runs again with its own inputs, and the link's
    check after the run refuses the key with the notice."""
    import functools
    import inspect

    def first(start: dict | None, *args: Any) -> Any:
        asked = dict((start or {}).get("pending") or {})
        given = list(args)
        for key, i in where.items():
            text = asked.get(key)
            if text is not None:
                given[i] = int(text) if text.lstrip("-").isdigit() and isinstance(args[i], (int, float)) else text
        try:
            out = fn(*given)
        except gr.Error:
            if given == list(args):
                raise
            given = list(args)
            out = fn(*given)
        if finish is not None and asked:
            try:
                out = finish(asked, given, out)
            except (gr.Error, ValueError, LookupError):  # left to the check after the run (its notice)
                pass
        return out

    signature = inspect.signature(fn)  # Gradio reads it for gr.Progress and gr.Request: kept, one input before
    start = inspect.Parameter("start", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    functools.update_wrapper(first, fn)
    first.__signature__ = signature.replace(parameters=[start, *signature.parameters.values()])
    return first


def _writer(key: str, link: Permalink | None, first: str, stateful: bool = False) -> Callable:
    def write(*values: Any) -> str:
        if stateful:  # the last input is the tab's kept result
            *values, state = values
            return write_query(key, link, list(values), first, ran=state is not None)
        return write_query(key, link, list(values), first)

    return write


def _after(link: Permalink) -> Callable:
    """Set the after-keys the run's result allows; the notice then names every key the link could not restore."""

    def apply(start: dict, state: Any):
        values, refused = check_after(link, start["pending"], state)
        updates = [gr.update(value=values[key]) if key in values else gr.skip() for key in link.after]
        if not refused:
            return *updates, gr.skip()
        text = notice([*start["refused"], *refused], start["messages"], start["unknown"])
        return *updates, gr.update(value=text, visible=True)

    return apply
