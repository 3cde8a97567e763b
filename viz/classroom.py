"""The room's answers to one lesson step as a bar chart (the class mode of the Lessons tab, issue 51): one bar per
choice, how many students chose it; once revealed, the right choice in green and the others grey. Pure: counts
in, a figure out (no models, no gradio, no store)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from viz.common import Fig, base_layout, esc, shorten

WAITING = "#6baed6"  # before the reveal every bar looks the same: the colours must not give the answer away
RIGHT, WRONG = "#2ca02c", "#bdbdbd"


def class_counts(choices: Sequence[str], counts: Mapping[str, int], *, answer: str | None = None,
                 students: int | None = None, title: str = "The room's predictions", large: bool = False) -> go.Figure:
    """Horizontal bars, the choices top to bottom in their offered order. ``answer`` (only once revealed) colours
    the right one; ``students`` adds "n of m answered" to the title; ``large`` sets projector-size type."""
    labels = [esc(shorten(c, 40)) for c in choices]
    values = [int(counts.get(c, 0)) for c in choices]
    total = sum(values)
    colors = [WAITING if answer is None else RIGHT if c == answer else WRONG for c in choices]
    text = [f"{v} ({v / total:.0%})" if total else "0" for v in values]
    fig = Fig(dict(type="bar", orientation="h", x=values, y=labels, marker=dict(color=colors), text=text,
                   textposition="outside", cliponaxis=False, hovertemplate="%{y}: %{x}<extra></extra>"))
    said = f"{total} of {students} answered" if students is not None else f"{total} answered"
    size = 22 if large else 14
    base_layout(fig, f"{esc(title)} · {said}", height=max(220, (70 if large else 46) * len(choices) + 120))
    fig.update_layout(font=dict(size=size), title=dict(font=dict(size=size + 4)), bargap=0.3,
                      margin=dict(l=20, r=60, t=70, b=40))
    fig.update_xaxes(title=dict(text="students"), rangemode="tozero", dtick=max(1, (max(values + [1]) + 4) // 5),
                     range=[0, max(values + [1]) * 1.25])
    fig.update_yaxes(autorange="reversed", type="category")
    return fig.build()
