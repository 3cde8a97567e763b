"""The class mode of the Lessons tab (issue 51) drawn: the room's answers to one lesson step as a bar chart (one bar
per choice, how many students chose it; once revealed, the right choice in green and the others grey), the join
screen a projector shows (the join code in very large type and a QR code of the join address, issue 61 item 11) and
the per-question summary after class. Pure: counts and texts in, a figure or HTML out (no models, no gradio, no
store); the QR code is drawn here by the ``qrcode`` package as an inline SVG (no network, no image file)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from viz.common import Fig, base_layout, esc, shorten

URL = re.compile(r"https?://[^\s\"'<>`]{1,300}")  # the join address a QR code may hold

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


def qr_svg(text: str) -> str:
    """``text`` as a QR code, an inline SVG (one path; medium error correction, as a projector's glare needs; the
    four-module quiet zone the standard asks for) that scales to its box."""
    import qrcode
    import qrcode.image.svg

    code = qrcode.QRCode(error_correction=qrcode.constants.ERROR_CORRECT_M, border=4,
                         image_factory=qrcode.image.svg.SvgPathImage)
    code.add_data(text)
    code.make(fit=True)
    svg = code.make_image().to_string(encoding="unicode")
    svg = re.sub(r"<\?xml[^>]*>", "", svg)  # inline in the page: no XML declaration
    return svg.replace("<svg ", '<svg role="img" aria-label="QR code of the join address" ', 1)


def join_screen(code: str, address: str = "") -> str:
    """What a projector shows so the room can join: the join code in very large type, and, when the page's address
    is known (``address``: the app's own, from the teacher's browser), a QR code of the join link (the app opened on
    the Lessons tab with the code filled in) with the address written under it. HTML; every text escaped."""
    link = f"{address}?tab=lessons&class={code}" if URL.fullmatch(address or "") else ""
    qr = f'<div class="atlas-join-qr">{qr_svg(link)}</div>' if link else ""
    under = (f'<div class="atlas-join-link">or open <b>{esc(link)}</b></div>' if link else
             '<div class="atlas-join-link">open this app, <b>Lessons → Join a class</b></div>')
    return (f'<div class="atlas-join">{qr}<div class="atlas-join-text"><div class="atlas-join-label">join code</div>'
            f'<div class="atlas-join-code">{esc(code)}</div>{under}</div></div>')


def summary_table(steps: Sequence[object]) -> str:
    """The per-question summary as a Markdown table: per step asked (``StepSummary``-like: lesson, step, choices,
    answer, answered, correct, counts, asks), how many answered and were right, and how many chose each choice (the
    right one in bold)."""
    if not steps:
        return "No step has been asked yet."
    rows = ["| lesson · step | answered | correct | choices (how many chose each; the right one in bold) |",
            "| --- | ---: | ---: | --- |"]
    for q in steps:
        share = f" ({q.correct / q.answered:.0%})" if q.answered else ""
        picks = " · ".join((f"**{esc(shorten(c, 40))}: {q.counts.get(c, 0)}**" if c == q.answer else
                            f"{esc(shorten(c, 40))}: {q.counts.get(c, 0)}").replace("|", "\\|") for c in q.choices)
        again = f" (asked {q.asks}×)" if getattr(q, "asks", 1) > 1 else ""
        rows.append(f"| {q.lesson} · {q.step}{again} | {q.answered} | {q.correct}{share} | {picks} |")
    return "\n".join(rows)
