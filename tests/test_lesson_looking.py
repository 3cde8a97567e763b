"""Lesson 10 (tabs/course/looking.py) on the shipped vlm-fashion and its ten example scenes: every step reads the
same numbers the same way (issue 75, item 3: step 2 called the top relevance patch "a patch of the sandal" while step
3 scored the same patch "out"), the relevance figure draws the patch its verdict names, and no question quotes its
own answer (step 1 quoted the caption, whose place words are step 1's answer)."""

from __future__ import annotations

import re

import numpy as np

from tabs.course import course, looking


def _words(text: str) -> str:
    return re.sub(r"[*“”‹›]", " ", text).lower()


def test_steps_agree_and_questions_hold_no_answers() -> None:
    for scene in range(len(looking._scenes())):
        inp = str(scene)
        q1, q2, q3 = (course.question(10, s, inp) for s in (1, 2, 3))
        # step 1: none of the nine places is written in the question (the caption's place phrases are hidden)
        for place in looking.PLACES:
            assert not re.search(rf"\b{place}\b", _words(q1.text)), (scene, place, q1.text)
        # step 2's verdict and step 3's "in"/"out" for the same word: one reading of the same argmax patch
        r, _, found, position, boxes, others, _ = looking._setup(inp)
        word = r.tokens[position]
        rel = looking.get_model(looking.MODEL).image_relevance(r, [position - 1])[0]
        top = int(np.argmax(rel))
        x0, y0, x1, y1 = r.image_boxes[top] / looking._scale(r)
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2  # the pointing game's test, computed here from the boxes
        own = any(b[0] <= cx < b[2] and b[1] <= cy < b[3] for b in boxes)
        other = any(b[0] <= cx < b[2] and b[1] <= cy < b[3] for b in others)
        expect = q2.choices[[c.startswith(f"inside the {word}") for c in q2.choices].index(True)] if own else next(
            c for c in q2.choices if c.startswith("inside another" if other else "outside"))
        assert q2.answer == expect, (scene, q2.answer, q2.fact)
        said = re.search(rf"{re.escape(word)}: attention (in|out), relevance (in|out)", q3.fact)
        assert said and (said.group(2) == "in") == own, (scene, q2.fact, q3.fact)
        # the figure draws the patch the verdict names, and says its value
        name = r.tokens[int(r.image_positions[top])].replace("<", "‹").replace(">", "›")
        assert name in q2.fact and f"{rel[top]:+.3g}" in q2.fact
        fig = q2.reveal(None)
        boxes_drawn = [s.path for s in fig.layout.shapes]
        px0, py0, px1, py1 = (float(v) for v in r.image_boxes[top])  # in the pixels of the image drawn
        assert looking.vd.rect_path(px0 - 0.5, py0 - 0.5, px1 - 0.5, py1 - 0.5) in boxes_drawn, (scene, boxes_drawn)
        assert name in fig.layout.title.text and any(s.name == f"largest relevance: {name}" for s in fig.layout.shapes)
        # every step's question holds none of its own choices' texts as the answer
        for q in (q1, q2, q3):
            assert q.answer.lower() not in _words(q.text), (scene, q.answer)
