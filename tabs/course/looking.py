"""Lesson 10 · Where does the model look when it says *sandal*? The built-in vision-language model (vlm-fashion)
describes one of the example scenes; the lesson follows one object word of its own caption: where its attention
goes, where its relevance goes, and over every object word of the caption, which of the two points at the item more
often (the pointing game, measured on held-out scenes in the README)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from tabs.common import get_model
from tabs.course.engine import Lesson, Question, mark, seed_of
from viz import describe as vd
from viz.common import esc

MODEL = "vlm-fashion"
SCENES = Path(__file__).resolve().parents[2] / "examples" / "scenes"
FASHION = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
PROMPT = "describe the image ."
PHRASES = ("at the top left", "at the top", "at the top right", "on the left", "in the middle", "on the right",
           "at the bottom left", "at the bottom", "at the bottom right")  # how the model's captions say the 3×3 places
PLACES = tuple(phrase.split("the ", 1)[1] for phrase in PHRASES)  # "top left", ..., "middle", ...
CLOSE = 0.9  # a place with at least this fraction of the top place's attention is too close to be offered beside it


def _scenes() -> list[dict]:
    return [json.loads(line) for line in (SCENES / "scenes.jsonl").read_text().splitlines() if line.strip()]


def class_word(name: str) -> str:
    """The model's word for a Fashion-MNIST class: "T-shirt/top" -> "t-shirt", "Ankle boot" -> "boot"."""
    return name.lower().split("/")[0].split()[-1]


@functools.lru_cache(maxsize=16)
def _run(index: int):
    """The model reading example scene ``index`` and its caption, teacher-forced (the caption as training wrote it:
    every item, "<place> a <word>" in reading order, joined by "and"): (result, [(position of each object word, its
    item's box)], the other items' boxes by word position)."""
    scene = _scenes()[index]
    items = sorted(scene["items"], key=lambda it: place_of((it["box"][0] + it["box"][2]) / 2,
                                                           (it["box"][1] + it["box"][3]) / 2, 64))
    caption = " and ".join(f"{PHRASES[place_of((b[0] + b[2]) / 2, (b[1] + b[3]) / 2, 64)]} a {class_word(c)}"
                           for c, b in ((it["class"], it["box"]) for it in items))
    r = get_model(MODEL).describe(str(SCENES / scene["image"]), f"{PROMPT} {caption}", max_new_tokens=0)
    start = len(r.image_positions) + 1 + len(PROMPT.split())  # the caption's first word: after <s> and the prompt
    words = [p for p in range(start, len(r.ids)) if r.tokens[p] in {class_word(n) for n in FASHION}]
    if len(words) != len(items):
        raise ValueError(f"the model's vocabulary does not hold this scene's words ({', '.join(r.tokens[start:])})")
    return r, [(p, [it["box"]]) for p, it in zip(words, items)], caption


def _setup(inp: str):
    index = int(np.clip(seed_of(inp), 0, len(_scenes()) - 1)) if (inp or "").strip() else 8
    r, found, caption = _run(index)
    position, boxes = next((w for w in found if r.tokens[w[0]] == "sandal"), found[0])
    return r, index, found, position, boxes, [b for _, bs in found for b in bs if b not in boxes], caption


def _scale(r) -> float:
    return r.image.shape[0] / 64  # the scenes' boxes are on the 64-pixel canvas the model sees


def place_of(x: float, y: float, side: int) -> int:
    """The 3×3 place (row-major) holding the point (x, y) of a side × side image."""
    return 3 * min(int(3 * y / side), 2) + min(int(3 * x / side), 2)


def place_shares(r, values: np.ndarray) -> np.ndarray:
    """(9,): the sum of per-image-token ``values`` in each of the 3×3 places (by the token's centre)."""
    side = r.image.shape[0]
    centres = (r.image_boxes[:, :2] + r.image_boxes[:, 2:]) / 2
    out = np.zeros(9)
    for v, (x, y) in zip(values, centres):
        out[place_of(x, y, side)] += v
    return out


def _touches(r, k: int, boxes) -> bool:
    """Whether image token k's patch overlaps any of ``boxes`` (on the 64-pixel canvas)."""
    x0, y0, x1, y1 = np.asarray(r.image_boxes[k]) / _scale(r)
    return any(x0 < b[2] and b[0] < x1 and y0 < b[3] and b[1] < y1 for b in boxes)


def _inside(r, k: int, boxes) -> bool:
    """Whether image token k's centre lies inside any of ``boxes``: the pointing game's test (bench/grounding.py)."""
    x0, y0, x1, y1 = r.image_boxes[k]
    x, y = (x0 + x1) / 2 / _scale(r), (y0 + y1) / 2 / _scale(r)
    return any(b[0] <= x < b[2] and b[1] <= y < b[3] for b in boxes)


def _attention(r, position: int) -> np.ndarray:
    """The position choosing the word: its attention to the image tokens, last layer, mean of heads (the pointing
    game's choice, made on validation scenes)."""
    return r.attention[-1, :, position - 1][:, r.image_positions].mean(axis=0)


def _grid_marks(side: int, chosen: int | None = None) -> list:
    marks = []
    third = side / 3
    for k in range(9):
        row, col = divmod(k, 3)
        box = (col * third, row * third, (col + 1) * third, (row + 1) * third)
        marks.append((box, "#d62728" if k == chosen else "rgba(255,255,255,0.35)", PLACES[k]))
    return sorted(marks, key=lambda m: m[1] == "#d62728")  # the prediction drawn last, on top


def _caption(r, position: int) -> str:
    """The caption as the model read it, the word followed in bold and every place phrase hidden ("‹place›"): the
    phrases name where each item is, the answer of step 1 (issue 75, item 3: the question quoted its answer)."""
    start = len(r.image_positions) + 1 + len(PROMPT.split())
    words = [esc(t) for t in r.tokens[start:]]
    out, p = [], 0
    phrases = sorted((phrase.split() for phrase in PHRASES), key=len, reverse=True)
    while p < len(words):
        hit = next((len(ph) for ph in phrases if words[p:p + len(ph)] == ph), 0)
        if hit:
            out.append("‹place›")
            p += hit
            continue
        out.append(f"**{words[p]}**" if start + p == position else words[p])
        p += 1
    return " ".join(out)


def l10_attention(inp: str) -> Question:
    r, index, _, position, _, _, caption = _setup(inp)
    word = r.tokens[position]
    att = _attention(r, position)
    shares = place_shares(r, att)
    order = [int(k) for k in np.argsort(-shares)]
    best = order[0]
    offered = [k for k in order[1:] if shares[k] < CLOSE * shares[best]]  # no near-tie beside the answer
    choices = [PLACES[best], *[PLACES[k] for k in offered[:3]]]
    before = vd.image_overlay(r.image, np.zeros(len(r.image_positions)), r.image_boxes, title=f"Scene {index}, as "
                              "the model sees it (64 × 64), in its nine places", marks=_grid_marks(r.image.shape[0]))

    def reveal(p):
        chosen = PLACES.index(p) if p in PLACES else None
        fig = vd.image_overlay(r.image, att, r.image_boxes, title=f"The position choosing “{esc(word)}” → image"
                               "<br><sup>last layer, mean of heads</sup>", marks=_grid_marks(r.image.shape[0], chosen),
                               names=[r.tokens[int(i)] for i in r.image_positions])
        return mark(fig, p)

    return Question(f"The model reads scene {index} and, after *describe the image .*, its caption, word by word: "
                    f"{_caption(r, position)} (the place words hidden here; the model read them). Each of its 64 image "
                    "tokens is an 8 × 8 patch of the scene. **At the "
                    f"position that predicts “{esc(word)}”, which of the nine places gets the most attention** (last "
                    "layer, mean of heads)?", choices, PLACES[best],
                    f"the place {PLACES[best]} takes {shares[best]:.0%} of the image's share"
                    + (f"; the next, {PLACES[order[1]]}, {shares[order[1]]:.0%}" if len(order) > 1 else ""),
                    "To name an object, the model reads the image tokens where the object is: the words it has just "
                    "written (the place) tell the last layer where to look. Raw attention is where the word read "
                    "from, not yet proof of what it depends on (the next step).", reveal, before)


def relevance_place(r, top: int, boxes, others) -> int:
    """Where patch ``top`` counts, by the pointing game's rule (its centre inside an item's box, `_inside`, as step 3
    and bench/grounding.py read it): 0 the word's own item, 1 another item, 2 neither (background or an item's edge).
    Step 2's verdict and step 3's "in"/"out" come from this one reading (issue 75, item 3: step 2 called a patch
    that only touched the sandal "a patch of the sandal" and step 3 called the same patch "out")."""
    return 0 if _inside(r, top, boxes) else 1 if _inside(r, top, others) else 2


def l10_relevance(inp: str) -> Question:
    r, index, found, position, boxes, others, _ = _setup(inp)
    word = r.tokens[position]
    rel = get_model(MODEL).image_relevance(r, [position - 1])[0]
    top, low = int(np.argmax(rel)), int(np.argmin(rel))
    choices = [f"inside the {word}", "inside another item", "outside every item"]
    answer = choices[relevance_place(r, top, boxes, others)]
    where = {0: f"its centre inside the {word}", 1: "its centre inside another item"}.get(
        choices.index(answer), "its centre outside every item")
    name = _tag(r.tokens[int(r.image_positions[top])])
    against = (f"; the strongest patch against it is {_tag(r.tokens[int(r.image_positions[low])])} "
               f"({rel[low]:+.3g})") if rel[low] < 0 and -rel[low] > rel[top] else ""
    scale = _scale(r)
    item_marks = [(tuple(v * scale for v in b), "#1a9850", f"the {word}") for b in boxes]
    top_mark = (tuple(float(v) for v in r.image_boxes[top]), "#111111", f"largest relevance: {name}")

    def reveal(p):
        fig = vd.image_overlay(r.image, rel, r.image_boxes, signed=True, label="relevance (gradient × input)",
                               title=f"Relevance of “{esc(word)}”<br><sup>red for it, blue against; green: the "
                               f"{esc(word)}; black: the largest, {esc(name)} ({rel[top]:+.3g})</sup>",
                               marks=[*item_marks, top_mark], names=[r.tokens[int(i)] for i in r.image_positions])
        return mark(fig, p)

    return Question(f"*Relevance* asks the model instead of watching it: how much does the probability of "
                    f"“{esc(word)}” change with each pixel (gradient × input, summed per patch; a black patch gets 0; "
                    "positive for the word, negative against it)? A patch counts as inside an item when its centre "
                    "lies in the item's box (the pointing game's rule, next step); one on an item's edge may count "
                    f"as outside. **Where is the patch with the largest relevance for “{esc(word)}”?**", choices,
                    answer, f"the most relevant patch is {name} ({rel[top]:+.3g}), {where}{against}",
                    "Gradient × input measures what the word's probability depends on, pixel by pixel, through the "
                    "tower and every layer. On this small model it usually lands on the object's own pixels; where it "
                    "does not, attention and relevance disagree, and relevance is the faithful one.", reveal)


def _tag(token: str) -> str:
    """An image token's label for Markdown text ("‹image r1c2›": a literal "<image …>" would be read as a tag)."""
    return token.replace("<", "‹").replace(">", "›")


def _io(hit: bool) -> str:
    return "in" if hit else "out"


def l10_pointing(inp: str) -> Question:
    r, index, found, *_ = _setup(inp)
    net = get_model(MODEL)
    rel = net.image_relevance(r, [p - 1 for p, _ in found])
    att_hits = [_inside(r, int(np.argmax(_attention(r, p))), b) for p, b in found]
    rel_hits = [_inside(r, int(np.argmax(v)), b) for v, (_, b) in zip(rel, found)]
    a, g = sum(att_hits), sum(rel_hits)
    choices = ["attention hits more often", "relevance hits more often", "both hit equally often"]
    answer = choices[2] if a == g else choices[0] if a > g else choices[1]
    scale = _scale(r)
    marks = [(tuple(v * scale for v in b), "#1a9850", r.tokens[p]) for p, bs in found for b in bs]
    for (p, _), v in zip(found, rel):
        marks.append((tuple(r.image_boxes[int(np.argmax(v))]), "#2166ac", f"relevance of {r.tokens[p]}"))
        marks.append((tuple(r.image_boxes[int(np.argmax(_attention(r, p)))]), "#e66101", f"attention of {r.tokens[p]}"))
    words = ", ".join(f"“{esc(r.tokens[p])}”" for p, _ in found)

    def reveal(p):
        fig = vd.image_overlay(r.image, np.zeros(len(r.image_positions)), r.image_boxes, marks=marks,
                               title=f"The pointing game on scene {index}<br><sup>green: the items; orange: where "
                               "attention points; blue: where relevance points</sup>")
        return mark(fig, p)

    return Question(f"The *pointing game* scores a map by one question: does its largest value fall inside the "
                    f"object named? Play it on every object word of this caption ({words}): **which points inside "
                    "its item more often, attention (last layer, mean of heads) or relevance?**", choices, answer,
                    f"attention hits {a} of {len(found)}, relevance {g} of {len(found)} ("
                    + "; ".join(f"{esc(r.tokens[p])}: attention {_io(x)}, relevance {_io(y)}"
                                for (p, _), x, y in zip(found, att_hits, rel_hits))
                    + "); on 587 items of held-out scenes: attention 0.927, relevance 0.903 (README)",
                    "On this model both are good pointers because it was trained to ground each word, and its tower "
                    "keeps each patch about its own neighbourhood. On large VLMs raw attention is a much weaker "
                    "signal (visual sinks take much of it), which is why the tab shows relevance beside it.", reveal)


LESSON = Lesson(
    "10 · Where does the model look when it says “sandal”?",
    "A vision-language model describes a scene of Fashion-MNIST items: where its words look, and whether the "
    "looking is what they depend on.", "example scene (0–9)", "8", (l10_attention, l10_relevance, l10_pointing))
