"""bench/link_open.py's reading of what a link's page drew (constructed recordings with known answers; the bench
itself runs a browser and is not run here)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.link_open import drawn_first  # noqa: E402


def test_the_linked_view_drawn_first_is_not_wrong() -> None:
    # figures land one after another, each with its final title
    assert drawn_first([[100, [[0, "layer 0 · head 1"]]], [900, [[0, "layer 0 · head 1"], [1, "stats"]]]]) == ([], 0)
    # Gradio draws the same view again in a new element: the same view, not another one
    assert drawn_first([[100, [[0, "layer 0 · head 1"]]], [300, [[1, "layer 0 · head 1"]]]]) == ([], 0)


def test_a_view_drawn_before_the_linked_one_is_counted_with_its_time() -> None:
    # the same figure first showed the default view (``stray_views``)
    wrong, seconds = drawn_first([[100, [[0, "layer 2 · mean of heads"]]], [2100, [[0, "layer 0 · head 1"]]]])
    assert wrong == ["layer 2 · mean of heads"] and abs(seconds - 2.0) < 1e-9
    # a figure replaced by a new element showed another head first (``gone_views``), beside a figure that was right
    wrong, seconds = drawn_first([[0, [[0, "grid"], [1, "head 0 example"]]],
                                  [500, [[0, "grid"], [2, "head 1 example"]]]])
    assert wrong == ["head 0 example"] and abs(seconds - 0.5) < 1e-9
    # an untitled figure in a replaced element says nothing; an untitled first state of a kept figure does
    assert drawn_first([[0, [[0, ""]]], [400, [[1, "A"]]]]) == ([], 0)
    assert drawn_first([[0, [[0, ""]]], [400, [[0, "A"]]]])[0] == [""]
