"""The lessons' engine: a lesson is a title, an intro, an input (a seed, a sentence or an example image) and 3–6
steps; a step is a function of that input returning a `Question` (the text, 3–4 choices, the one the numbers make
correct, and the figure to reveal with the prediction marked on it). The helpers every lesson shares, and the
verdict on a prediction."""

from __future__ import annotations

import dataclasses
import functools
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import plotly.graph_objects as go

from tabs.common import Error, get_model, read_seed
from viz.common import esc


@dataclass(frozen=True)
class Question:
    """One step: what the student reads, what they may predict, and what the numbers say."""

    text: str  # Markdown: the context and the question
    choices: list[str]  # 3–4 predictions to pick from
    answer: str  # the one the model's numbers make correct
    fact: str  # the numbers behind the verdict, one line
    explanation: str  # two sentences: why
    reveal: Callable[[str | None], go.Figure]  # the figure, with the prediction (or None) marked on it
    before: go.Figure | None = None  # shown before predicting; never gives the answer away


@dataclass(frozen=True)
class Lesson:
    title: str
    intro: str
    input_label: str
    default: str
    steps: tuple[Callable[..., Question], ...]
    # the models a lesson can run on, (key, the catalogue's name), the first the default; a step then takes
    # ``name=`` and the input may start with "KEY:" (`split_model`), so a class, a link and the API carry the choice
    models: tuple[tuple[str, str], ...] = ()


def split_model(lesson: Lesson, inp: str) -> tuple[str | None, str]:
    """(the catalogue name of the model the input asks for, the rest of the input) for a lesson with ``models``:
    "smollm2: 3" -> (SmolLM2's name, "3"); no known "KEY:" prefix -> (the first model, the input as given). (None,
    input) for a lesson without models."""
    if not lesson.models:
        return None, inp
    key, sep, rest = (inp or "").partition(":")
    known = dict(lesson.models)
    if sep and key.strip().lower() in known:
        return known[key.strip().lower()], rest.strip()
    return lesson.models[0][1], (inp or "").strip()


def with_model(lesson: Lesson, key: str, inp: str) -> str:
    """The input with the model ``key`` written in front ("smollm2: 3"; the default model's key is left out)."""
    _, rest = split_model(lesson, inp)
    known = [k for k, _ in lesson.models]
    return rest if key not in known or key == known[0] else f"{key}: {rest}"


def model_key(lesson: Lesson, inp: str) -> str | None:
    """The key of the model an input asks for (None for a lesson without models)."""
    name, _ = split_model(lesson, inp)
    return next((k for k, n in lesson.models if n == name), None)


def offer(candidates: list[str], answer: str, k: int = 4) -> list[str]:
    """Up to ``k`` distinct choices, the answer always among them (their order is set by `shuffled`)."""
    out = [c for c in dict.fromkeys(candidates) if c != answer][: k - 1]
    return [answer, *out]


def answer_position(number: int, step: int, inp: str, n: int) -> int:
    """Where step ``step``'s right answer stands among its ``n`` choices: the lesson's steps with n choices take their
    places from permutations of 0..n−1 drawn one after another (crc32 of the lesson, n and the input as the seed), so
    within a lesson every place is used before any is used again, and which place a step gets changes with the input
    and says nothing. (A shuffle drawn per step left 14 of 27 default questions' answers at the same place.)"""
    rng = random.Random(zlib.crc32(f"{number}/{n}/{inp}".encode()))
    places: list[int] = []
    while len(places) < step:
        perm = list(range(n))
        rng.shuffle(perm)
        places += perm
    return places[step - 1]


def shuffled(q: Question, number: int, step: int, inp: str) -> Question:
    """The question with its choices in an order drawn from the lesson, step and input: the right answer at
    `answer_position`, the others in a seeded order (the same input always lists them the same way, in the page,
    the API and the export)."""
    others = [c for c in q.choices if c != q.answer]
    random.Random(zlib.crc32(f"{number}/{step}/{inp}".encode())).shuffle(others)
    at = answer_position(number, step, inp, len(others) + 1)
    return dataclasses.replace(q, choices=[*others[:at], q.answer, *others[at:]])


def mark(fig: go.Figure, prediction: str | None, x=None, y=None, *, note: str = "") -> go.Figure:
    """A copy of ``fig`` with the prediction marked: an open red square at (x, y) on the first axes when given,
    and a red line under the title."""
    fig = go.Figure(fig)
    if prediction is None:
        return fig
    if x is not None and y is not None:
        x, y = (esc(v) if isinstance(v, str) else v for v in (x, y))  # as the figures' category labels
        fig.add_trace(go.Scatter(x=[x], y=[y], mode="markers", name="your prediction", hoverinfo="skip",
                                 marker=dict(symbol="square-open", size=24, color="#d62728", line=dict(width=3))))
    said = esc(f"your prediction: {prediction}" + (f" · {note}" if note else ""))
    title = fig.layout.title.text or ""
    fig.update_layout(title=dict(text=f"{title}<br><span style='color:#d62728'>{said}</span>"),
                      margin=dict(t=max(fig.layout.margin.t or 0, 80) + 30))
    return fig


def label(tokens: list[str], i: int) -> str:
    return f"{i} · {tokens[i]}"


def stop(quoted: str) -> str:
    """The full stop after a quoted sentence, unless the sentence ends with its own ("… entlang.." read as a typo)."""
    return "" if quoted.rstrip().endswith((".", "!", "?", "…")) else "."


def seed_of(text: str) -> int:
    return read_seed((text or "0").strip() or "0")


def sentence(text: str, default: str) -> str:
    return (text or "").strip()[:2000] or default


@functools.lru_cache(maxsize=64)
def losses(net, ids: tuple[int, ...]):
    return net.token_losses(list(ids))


def lm_run(name: str, ids: tuple[int, ...]):
    """(losses, attention) of a language model on ids, kept per model object (the steps of a lesson share it)."""
    return losses(get_model(name), ids)


def attention_steps(seed: int, mask: str = "none"):
    from viz import playground as pg

    return pg.compute_steps(seq_len=6, d_k=8, seed=seed, mask=mask, scale=True)


def verdict(q: Question, answer: str) -> tuple[bool, str]:
    if answer not in q.choices:
        raise Error(f"{str(answer)[:60]!r} is not one of the choices: " + "; ".join(q.choices))
    right = answer == q.answer
    said = "**correct**" if right else f"**not quite**: the numbers say *{esc(q.answer)}*"
    return right, f"{said} — {esc(q.fact)}."
