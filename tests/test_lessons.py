"""The Lessons tab (tabs/lessons.py, tabs/course/) over the tiny checkpoints: every step offers 3–4 predictions of
which exactly one is judged correct, the correct one follows the model's numbers (checked here against numbers computed
independently) and changes with the input when the numbers do; progress keeps first answers; a lesson exports as
one self-contained page; the API serves the same steps."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import gradio as gr
import numpy as np
import pytest

from serving import catalogue, store
from tabs import lessons


@pytest.fixture()
def tiny(tiny_checkpoints: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    return tiny_checkpoints


STEPS = [(n, s) for n, lesson in enumerate(lessons.LESSONS, 1) for s in range(1, len(lesson.steps) + 1)]


def test_ten_lessons_of_three_to_six_steps() -> None:
    assert len(lessons.LESSONS) >= 10
    assert all(3 <= len(lesson.steps) <= 6 for lesson in lessons.LESSONS)


@pytest.mark.parametrize("number,step", STEPS)
def test_exactly_one_choice_is_correct(tiny, number: int, step: int) -> None:
    q = lessons.question(number, step)
    assert 3 <= len(q.choices) <= 4 and len(set(q.choices)) == len(q.choices)
    verdicts = [lessons.lesson_answer_api(number, step, c)[0] for c in q.choices]
    assert sum(v.startswith("correct") for v in verdicts) == 1
    assert all(v.startswith(("correct", "not quite")) for v in verdicts)
    text, before, choices = lessons.lesson_api(number, step)
    assert choices == q.choices and text == q.text
    _, figure, explanation = lessons.lesson_answer_api(number, step, q.choices[-1])
    assert json.loads(figure)["data"] and explanation.count(".") >= 2  # a figure, and two sentences


def _softmax_argmax_row0(seed: int) -> str:
    """Lesson 1, step 1 written out: the playground's Q and K, softmax(QKᵀ/√d_k), the key query 0 weights most."""
    from viz import playground as pg

    s = pg.compute_steps(seq_len=6, d_k=8, seed=seed, mask="none", scale=True)
    scores = s.q[0] @ s.k.T / math.sqrt(8)
    w = np.exp(scores - scores.max())
    return f"t{int(np.argmax(w / w.sum()))}"


def test_the_answer_follows_the_input(tiny) -> None:
    answers = {}
    for seed in range(12):
        q = lessons.question(1, 1, str(seed))
        assert q.answer == _softmax_argmax_row0(seed)
        answers[seed] = q.answer
    assert len(set(answers.values())) > 1  # different inputs, different right answers


def test_answers_against_independent_numbers(tiny) -> None:
    import models.blocks.positional as mp
    from models.analysis import induction_score, previous_token_score

    # lesson 3, step 2: RoPE scores depend on the offset only; the pair with the offset of (2, 5) scores the same
    assert lessons.question(3, 2, "5").answer == "(10, 13)"
    angles = mp.rope_angles(24, 16)
    rng = np.random.default_rng(0)
    q, k = (mp.torch.tensor(rng.standard_normal(16), dtype=mp.torch.float32) for _ in range(2))
    rot = lambda v, m: mp.apply_rope(v[None], angles[m : m + 1])[0]  # noqa: E731
    assert abs(float(rot(q, 2) @ rot(k, 5)) - float(rot(q, 10) @ rot(k, 13))) < 1e-4
    # lesson 4, steps 1 and 2: the heads with the largest previous-token and induction scores
    net = store.get_model("gpt-tiny")
    n = min(30, (net.context_limit() - 1) // 2)
    _, weights = net.token_losses(net.repeated_tokens(n, seed=3))
    for step, score in ((1, previous_token_score(weights)), (2, induction_score(weights, n))):
        layer, head = np.unravel_index(int(np.argmax(score)), score.shape)
        stands_out = (score <= score.max() - 0.10).sum() >= 2  # two heads at least a margin below the best
        want = f"layer {layer} head {head}" if stands_out else "none stands out"
        assert lessons.question(4, step, "3").answer.startswith(want)
    # lesson 7, step 3: the bottom-right window of an 8 × 8 grid, window 4, shift 2, built by the paper's slices
    region = np.zeros((8, 8), dtype=int)
    cuts = (slice(0, -4), slice(-4, -2), slice(-2, None))
    for i, (a, b) in enumerate((a, b) for a in cuts for b in cuts):
        region[a, b] = i
    assert lessons.question(7, 3).answer == str(len(np.unique(region[4:, 4:])))


def test_hostile_lesson_calls_answer_in_words(tiny) -> None:
    for number, step, message in ((0, 1, "There are 10 lessons"), (11, 1, "There are 10 lessons"),
                                  ("abc", 1, "must be a number"), (1, 99, "has 3 steps"), (1, "x", "must be a number")):
        with pytest.raises(gr.Error, match=message):
            lessons.question(number, step)
    with pytest.raises(gr.Error, match="not one of the choices"):
        lessons.lesson_answer_api(1, 1, "<script>")
    with pytest.raises(gr.Error, match="seed must be a whole number"):
        lessons.question(1, 1, "-5")
    assert lessons.question(5, 1, "é 🙂 " * 5000).choices  # odd and enormous text is capped, not a crash


def test_progress_keeps_first_answers(tiny) -> None:
    title = lessons.LESSONS[0].title
    q = lessons.question(1, 2)
    wrong = next(c for c in q.choices if c != q.answer)
    where, said, fig, explanation, progress = lessons.answer_step(title, 2, "", wrong, {})
    assert said.startswith("**not quite**") and progress == {"1": {"2": False}}
    where, said, *_, progress = lessons.answer_step(title, 2, "", q.answer, progress)
    assert said.startswith("**correct**") and progress == {"1": {"2": False}} and "score 0 of 3" in where
    with pytest.raises(gr.Error, match="Pick a prediction first"):
        lessons.answer_step(title, 1, "", None, progress)


def test_export_is_one_offline_page(tiny) -> None:
    path = Path(lessons.export_lesson(lessons.LESSONS[3].title, "2", {}))
    page = path.read_text(encoding="utf-8")
    assert page.count("<section>") == len(lessons.LESSONS[3].steps) == 4  # one a step
    assert "src=\"http" not in page and "Plotly.newPlot" in page
    assert len(page) > 1_000_000  # plotly.js inline


def test_api_lesson_endpoints(client) -> None:
    text, before, choices = client.predict(4, 2, "1", api_name="/lesson")
    assert "induction" in text and 3 <= len(choices) <= 4
    results = [client.predict(4, 2, c, "1", api_name="/lesson_answer")[0] for c in choices]
    assert sum(r.startswith("correct") for r in results) == 1


def test_every_lesson_step_through_gradio_client(client) -> None:
    """Every api_name of the lessons, every lesson and step, through gradio_client: the client fetches any object
    with a ``path`` key as a file, and the Swin region map's path shapes made lesson 7 step 3 fail for any answer
    (issue 48, item 13). The figures come back as Plotly JSON text with their shapes intact."""
    import plotly.io as pio

    for number, step in STEPS:
        text, before, choices = client.predict(number, step, "", api_name="/lesson")
        assert text and 3 <= len(choices) <= 4
        if before:
            assert pio.from_json(before).data
        verdicts = []
        for choice in choices:
            said, figure, explanation = client.predict(number, step, choice, "", api_name="/lesson_answer")
            verdicts.append(said.startswith("correct"))
            assert pio.from_json(figure).data and explanation
        assert sum(verdicts) == 1, (number, step)
    _, figure, _ = client.predict(7, 3, "4", "", api_name="/lesson_answer")
    assert any(shape.get("path", "").startswith("M") for shape in json.loads(figure)["layout"].get("shapes", []))


INPUTS = {1: ["0", "1", "2", "3", "5", "8"], 2: ["0", "1", "2", "3", "4", "7"],
          3: ["64", "16", "100", "9", "33", "200"],
          4: ["0", "1", "2", "3", "4", "5"], 5: ["", "The old woman sells fresh bread.", "A dog runs.", "Two men talk.",
                                                  "The cat sleeps on the warm mat.", "Children play in the park."],
          6: ["", "A dog runs.", "Two men talk.", "A woman is cooking dinner.", "The cat sleeps.", "A boy swims."],
          7: ["0", "1", "2", "3", "7", "9"], 8: ["", "a warm , funny film .", "the plot is thin .", "bad .",
                                                  "not bad at all .", "a long and dull film ."],
          9: ["", "A dog runs on the beach.", "Two men talk in a small room.", "The cat sleeps on the warm mat.",
              "A woman is cooking dinner in a small kitchen.", "Children play in the park near the old church."],
          10: ["0", "1", "3", "5", "8", "9"]}


def test_where_the_right_answer_stands_varies(tiny) -> None:
    """Issue 48, item 2: the correct choice was listed first in 15 of 24 questions. Over several inputs of each
    lesson, the right answer stands at more than one position and not mostly first; the same input always lists the
    choices the same way."""
    firsts = total = 0
    for number, lesson in enumerate(lessons.LESSONS, 1):
        positions = []
        for inp in INPUTS[number]:
            for step in range(1, len(lesson.steps) + 1):
                q = lessons.question(number, step, inp)
                positions.append(q.choices.index(q.answer))
                assert lessons.question(number, step, inp).choices == q.choices  # seeded: stable per input
        assert len(set(positions)) >= 3, (number, positions)
        firsts, total = firsts + positions.count(0), total + len(positions)
    assert firsts / total < 0.45


def test_no_reveal_gives_a_later_step_away(tiny) -> None:
    """Issue 48, item 2: a reveal shows only what its own question asked. For every lesson and several inputs, no
    earlier step's verdict, explanation or figure contains a later step's specific answer (a token, head, patch or
    position label); and the two leaks found: lesson 4 step 1 drew the induction score (step 2's answer), lesson 8
    step 1 named attention's top token and drew its scores (step 3's question)."""
    for number, lesson in enumerate(lessons.LESSONS, 1):
        for inp in INPUTS[number][:3]:
            qs = [lessons.question(number, s, inp) for s in range(1, len(lesson.steps) + 1)]
            for i, q in enumerate(qs):
                shown = q.fact + q.explanation + json.dumps(json.loads(q.reveal(None).to_json()))
                for later in qs[i + 1:]:
                    specific = any(c in later.answer for c in "·,") or later.answer.startswith("layer ")
                    if specific and later.answer != q.answer and later.answer not in later.text:
                        assert later.answer not in shown, (number, inp, i + 1, later.answer)
    for inp in INPUTS[4][:3]:
        fig = json.loads(lessons.question(4, 1, inp).reveal(None).to_json())
        assert "induction" not in json.dumps(fig).lower()
    for inp in INPUTS[8]:
        q = lessons.question(8, 1, inp)
        fig = q.reveal(None)
        assert "attention" not in q.fact and len(fig.data) == 1 and "attention" not in fig.data[0].hovertemplate


def test_beam_verdict_follows_the_red_path(tiny) -> None:
    """Issue 48, item 3: lesson 6 step 2 said "it led from the first step" while the red path dropped to slot 1.
    The verdict is now read from the path the figure draws: "top slot at every step" exactly when the red trace's
    y values are all 0, "started on top" when only the first is."""
    seen = set()
    for inp in INPUTS[6]:
        q = lessons.question(6, 2, inp)
        red = next(t for t in q.reveal(None).data if t.name == "chosen hypothesis")
        ys = [int(v) for v in red.y]
        expected = 0 if not any(ys) else 1 if ys[0] == 0 else 2
        assert q.answer == ["yes, in the top slot at every step",
                            "no: it started on top and was below it at some later step",
                            "no: it started below the top slot"][expected], (inp, ys, q.answer)
        assert " ".join(map(str, ys)) in q.fact
        seen.add(expected)


def test_lesson_one_scores_are_drawn_as_signed_scores(tiny) -> None:
    """Issue 48, item 7: lesson 1 step 1 drew the scores under an "attention weight 0–1" colour bar, so negative
    scores were invisible. They are signed bars on a score axis, equal to QKᵀ/√d_k written out."""
    from viz import playground as pg

    for seed in range(4):
        q = lessons.question(1, 1, str(seed))
        s = pg.compute_steps(seq_len=6, d_k=8, seed=seed, mask="none", scale=True)
        bars = q.before.data[0]
        assert bars.type == "bar" and np.allclose(bars.y, s.q[0] @ s.k.T / math.sqrt(8), atol=1e-5)
        assert "weight" not in json.dumps(q.before.to_plotly_json()["layout"]).lower()
        assert (np.asarray(bars.y) < 0).any() or seed  # negative scores are drawn, below the zero line


def test_changing_lesson_or_failing_leaves_nothing_stale(tiny) -> None:
    """Issue 48, item 4: switching lesson without Start kept the old intro above the old question, and the export
    box offered the previous lesson's file; a step whose input fails kept the previous question. The view empties."""
    demo = gr.Blocks()
    with demo:
        lessons.build()
    fns = {fn.name: fn for fn in demo.fns.values()}
    title = lessons.LESSONS[0].title
    out = lessons.show_step(title, 1, "-5", {})  # a seed no generator takes
    assert "seed must be a whole number" in out[0] and out[1] == "" and out[5] is None
    assert out[3]["choices"] == []
    wiped = lessons.cleared()
    assert wiped[1] == "" and wiped[5] is None and wiped[3]["choices"] == []
    # the lesson dropdown's and the input's .input events clear the view and the export box
    cleared_outputs = [fn for fn in demo.fns.values() if len(fn.outputs) >= 8 and fn.fn is not None
                       and not fn.inputs]
    assert len(cleared_outputs) == 1, fns.keys()  # the input's; the lesson's takes the model chosen (issue 75)
    chosen = [fn for fn in demo.fns.values() if fn.fn is lessons.lesson_chosen]
    assert len(chosen) == 1 and len(chosen[0].outputs) >= 8
    for values in (cleared_outputs[0].fn(), lessons.lesson_chosen(title, "gpt-tiny")):
        assert values[-1] is None and "" in values


@pytest.fixture(scope="module")
def client(app_url: str):
    from gradio_client import Client

    return Client(app_url, verbose=False)


def test_lesson_eight_example_by_its_stated_criterion(tiny) -> None:
    """Issue 48, item 9: the example "where they disagree most" (rank correlation) showed deletion areas 1.00 / 0.92
    / 1.00, a test that decides nothing. The example is, of the sentences whose two top tokens differ, the one
    whose two deletion areas differ most: recomputed here from models.inspect.attribution directly."""
    from examples import sentences
    from models.inspect.attribution import deletion_curves, explain
    from tabs.course import explanation

    net = store.get_model("sst2")
    scored = {}
    for text in sentences.SENTIMENT:
        att, ig = explain(net, text, "attention"), explain(net, text, "integrated_gradients")
        curves, _ = deletion_curves(net, text, [att, ig])
        top = [int(np.argmax(np.where(a.special, -np.inf, a.values))) for a in (att, ig)]
        scored[text] = (top[0] != top[1], abs(curves[0].auc - curves[1].auc))
    pool = [t for t, (differ, _) in scored.items() if differ] or list(scored)
    assert explanation._most_disagreeing() == max(pool, key=lambda t: scored[t][1])
    assert "deletion" in explanation._most_disagreeing.__doc__


def test_deletion_lines_cannot_hide_each_other(tiny) -> None:
    """Issue 48, item 9: the random order's line lay hidden under a method's. Every line of lesson 8's deletion
    figure has its own dash and marker, the baseline drawn first and widest."""
    fig = lessons.question(8, 2).reveal(None)
    lines = [t for t in fig.data if t.name and "area" in t.name]
    assert len(lines) == 3 and lines[0].name.startswith("random order")
    styles = {(t.line.dash, t.marker.symbol) for t in lines}
    assert len(styles) == 3 and all(t.mode == "lines+markers" for t in lines)
    assert lines[0].line.width > max(t.line.width for t in lines[1:])


def test_no_doubled_stops_in_the_texts(tiny) -> None:
    """Issue 48, item 12: "… entlang.." (a quoted translation's own full stop, then the sentence's) and the sinks
    paragraph's "without it;." in Translate. No step text, verdict or explanation has a stop after a stop."""
    import re

    from tabs.sections import why

    doubled = re.compile(r"[.;!?]\*?\.(?!\.)")
    for number, lesson in enumerate(lessons.LESSONS, 1):
        for inp in INPUTS[number][:3]:
            for step in range(1, len(lesson.steps) + 1):
                q = lessons.question(number, step, inp)
                for text in (q.text, q.fact, q.explanation):
                    assert not doubled.search(text), (number, step, text)
    net = store.get_model("translator-en-de")
    text = "A dog runs on the beach."
    q = lessons.question(6, 1, text)
    if net.translate(text).text.endswith("."):
        assert f"*{lessons.esc(net.translate(text).text)}* At step" in q.text
    assert why.sink_text_without_ablation().endswith("without it.")


# ------------------------------------------------------------------ issue 61, item 4: fair questions (shipped models)
def test_the_right_answer_stands_evenly_on_the_default_input() -> None:
    """With the default inputs one place held the right answer in 14 of 27 questions (place 2 in 8 of the 9 of
    lessons 1–3). Now each place holds about its share (a question of n choices gives each place 1/n), and within a
    lesson the steps with the same number of choices never share a place until every place has been used."""
    from collections import Counter

    got, expected = Counter(), Counter()
    for number, lesson in enumerate(lessons.LESSONS, 1):
        for inp in dict.fromkeys(["", *INPUTS[number][:2]]):
            places: dict[int, list[int]] = {}
            for step in range(1, len(lesson.steps) + 1):
                q = lessons.question(number, step, inp)
                n, at = len(q.choices), q.choices.index(q.answer)
                places.setdefault(n, []).append(at)
                if inp == "":
                    got[at] += 1
                    for place in range(n):
                        expected[place] += 1 / n
            for n, at in places.items():
                assert len(set(at[:n])) == len(at[:n]), (number, inp, n, at)
    total = sum(len(lesson.steps) for lesson in lessons.LESSONS)
    assert sum(got.values()) == total
    for place in expected:
        assert abs(got[place] - expected[place]) <= 2, (got, expected)
    assert max(got.values()) / total < 0.4


@pytest.mark.parametrize("inp", ["", "0", "3"])
def test_head_questions_are_separated_by_a_margin_shown(inp: str) -> None:
    """Lesson 4 steps 1–2 marked a right answer wrong on near-ties (layer 2 head 1 at 0.998 beside layer 2 head 2 at
    0.999; seed 3 the same). Every head offered beside the right one now scores at least MARGIN less, on scores
    computed here from the model; a near-tie is named in the verdict, and the offered heads' maps are shown before
    predicting, so the question is read off the figure rather than guessed."""
    from models.analysis import head_roles
    from tabs.course import induction
    from tabs.course.engine import seed_of

    net = store.get_model("gpt-tiny")
    n = min(30, (net.context_limit() - 1) // 2)
    _, weights = net.token_losses(net.repeated_tokens(n, seed=seed_of(inp)))
    roles = head_roles(weights, n)
    for step, score in ((1, roles["previous"]), (2, roles["induction"])):
        q = lessons.question(4, step, inp)
        heads = {c: tuple(int(v) for v in c.replace("layer ", "").split(" head ")) for c in q.choices}
        best = heads[q.answer]
        assert best == np.unravel_index(int(np.argmax(score)), score.shape)
        for choice, head in heads.items():
            if choice != q.answer:
                assert score[best] - score[head] >= induction.MARGIN, (inp, step, choice)
        ties = [f"layer {a} head {b}" for a, b in zip(*np.nonzero(score > score[best] - induction.MARGIN))
                if (a, b) != best]
        for tie in ties:
            assert tie not in q.choices and tie in q.fact
        assert q.before is not None and len([t for t in q.before.data if t.type == "heatmap"]) == len(q.choices)


def test_the_lottery_steps_ask_what_the_screen_shows() -> None:
    """7·1 asked for one of four patch coordinates with nothing to reason from; it now asks whether CLS reads the
    garment or the background per patch, the garment patches shown before predicting, judged here from the image the
    model saw."""
    from tabs.common import EXAMPLE_IMAGES
    from tabs.course import vision

    for inp in ("", "0", "3"):
        q = lessons.question(7, 1, inp)
        index = int(inp or 7)
        r = store.get_model("vit-fashion").classify(str(EXAMPLE_IMAGES[index]))
        last = r.attention["encoder"].weights[-1].mean(0)[0, r.prefix_tokens:]
        img = r.image.astype(float) / 255
        rows, cols = r.grid
        on = np.array([img[i * 4:(i + 1) * 4, j * 4:(j + 1) * 4].mean() > vision.INK
                       for i in range(rows) for j in range(cols)])
        g, b = last[on].mean(), last[~on].mean()
        want = 2 if min(g, b) >= vision.CLOSE * max(g, b) else 0 if g > b else 1
        assert q.answer == ["a patch on the garment", "a patch of plain background",
                            "about the same (within 20 %)"][want]
        assert q.before is not None and f"{g:.4f}" in q.fact


def test_the_ambiguous_and_throwaway_steps() -> None:
    """5·3 rested on +0.061 against 0.05: it now forbids every head the sink, a change far beyond its 0.5 nats;
    6·3's throwaway "no translation at all" is now "a different one the model scores higher", judged by the two
    results' scores; 8·1 asks for the top token's share of the evidence, not a word's meaning; 9·3 leaves the first
    token (step 1's sink) out."""
    from models.inspect.patching import sink_ablation
    from tabs.course import explanation, mamba, sinks, translation

    q = lessons.question(5, 3, "")
    net, ids, *_rest, layer, head = sinks._sink_setup("")
    r = sink_ablation(net, ids, layer, head, everywhere=True)
    change = r.loss_after - r.loss_before
    assert abs(abs(change) - sinks.SHIFT) > 0.2  # far from the line on the default sentence
    assert q.answer.startswith("rises" if change > sinks.SHIFT else "falls" if change < -sinks.SHIFT else "changes")

    q = lessons.question(6, 3, "")
    assert "no translation at all" not in q.choices
    default = lessons.LESSONS[5].default
    beam, greedy = translation._translation(default, 5), translation._translation(default, 1)
    assert (greedy.text == beam.text) == (q.answer == "the same translation")
    if greedy.text != beam.text:
        assert ("higher" in q.answer) == (greedy.score > beam.score)

    q = lessons.question(8, 1, "the plot is thin .")
    _, ig, *_ = explanation._explained("the plot is thin .")
    v = np.where(ig.special, 0, ig.values)
    share = v.max() / v[v > 0].sum()
    assert q.answer == ("more than half" if share > 0.5 else "between a third and a half" if share >= 1 / 3
                        else "less than a third")
    words = {w.lower() for c in q.choices for w in c.split()}  # no choice names a word of the input (whole words: a
    # piece such as "h" of a tiny model's tokenizer is in "half" without naming anything)
    assert not {t.strip("▁").lower() for t in ig.tokens if len(t.strip("▁")) > 1 and t.strip("▁").isalpha()} & words

    tokens, m, g = mamba._setup("")
    for rows in (m.mean(0), g.mean(0)):
        rest = mamba.without_first(rows)
        np.testing.assert_allclose(rest[1:].sum(-1)[1:], 1.0)
        assert (rest[:, 0] == 0).all()
    q = lessons.question(9, 3, "")
    assert "without the first token" in q.fact


# ---------------------------------------------------------------------------------- lessons 4 and 5 on a real LM
def test_the_model_choice_travels_in_the_input() -> None:
    from tabs.course import induction, sinks
    from tabs.course.engine import model_key, split_model, with_model

    lesson = induction.LESSON
    assert split_model(lesson, "smollm2: 3") == (catalogue.REAL_LM, "3")
    assert split_model(lesson, " SmolLM2 :  ") == (catalogue.REAL_LM, "")
    assert split_model(lesson, "3") == (catalogue.GPT_TINY, "3")
    assert split_model(lesson, "other: 3") == (catalogue.GPT_TINY, "other: 3")  # not a model key: all input
    assert with_model(lesson, "smollm2", "3") == "smollm2: 3" and with_model(lesson, "gpt-tiny", "smollm2: 3") == "3"
    assert model_key(sinks.LESSON, "smollm2: A dog runs.") == "smollm2" and model_key(lessons.LESSONS[0], "x") is None
    assert split_model(lessons.LESSONS[0], "smollm2: 3") == (None, "smollm2: 3")  # a lesson without models


@pytest.fixture(scope="module")
def real_lm(tmp_path_factory: pytest.TempPathFactory):
    """The store with SmolLM2 read from its package (the parsed file cached in a temporary folder)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("ATLAS_CACHE", str(tmp_path_factory.mktemp("atlas-cache")))
    mp.setattr(store, "MODELS", store.ModelStore())
    yield store.get_model(catalogue.REAL_LM)
    mp.undo()


def test_lesson_four_on_the_real_model_finds_its_heads(real_lm) -> None:
    """On SmolLM2's repeated random tokens the questions' answers are its textbook heads, from its own scores
    (previous-token layer 16 head 0, induction layer 18 head 6, the loss falling on the second copy), checked
    against head_roles computed here; the texts name the model."""
    from models.analysis import head_roles

    n = min(30, (real_lm.context_limit() - 1) // 2)
    _, weights = real_lm.token_losses(real_lm.repeated_tokens(n, seed=0))
    roles = head_roles(weights, n)
    prev, ind, loss = (lessons.question(4, s, "smollm2: 0") for s in (1, 2, 3))
    for q, score in ((prev, roles["previous"]), (ind, roles["induction"])):
        best = tuple(int(v) for v in np.unravel_index(int(np.argmax(score)), score.shape))
        assert q.answer == f"layer {best[0]} head {best[1]}"
    assert prev.answer == "layer 16 head 0" and ind.answer == "layer 18 head 6"
    assert loss.answer == "on the second copy" and "SmolLM2" in loss.text
    assert lessons.question(4, 1, "0").answer != prev.answer  # gpt-tiny's own head, not SmolLM2's


def test_lesson_five_on_the_real_model(real_lm) -> None:
    """Lesson 5's three steps run on SmolLM2, their verdicts from its numbers: the first token takes a large share."""
    for step in (1, 2, 3):
        q = lessons.question(5, step, "smollm2:")
        assert q.answer in q.choices and "SmolLM2" in q.text + q.fact or step == 2
        # issue 61, item 7: SmolLM2's byte-level pieces are shown decoded ("▁dog", never "Ġdog") in the words and
        # figures a student sees
        fig = q.reveal(None).to_plotly_json()
        ticks = [str(t) for k, axis in fig["layout"].items() if k.startswith(("xaxis", "yaxis"))
                 for t in (axis.get("ticktext") or [])]
        shown = " ".join([q.text, q.fact, q.explanation, *q.choices, *ticks])
        assert "Ġ" not in shown and (step == 2 or "▁" in " ".join(ticks))  # step 2 draws no token axis
    ids, _ = real_lm.encode_prompt(lessons.LESSONS[4].default)
    _, weights = real_lm.token_losses(ids)
    assert weights[:, :, 1:, 0].mean() > 0.3  # most heads park much of their attention on the first token


def test_the_garment_question_stands_clear_of_its_line() -> None:
    """7·1's verdict compares CLS's share per garment patch with its share per background patch against "about the
    same (within 20 %)". The retrained vit-fashion put examples 5 and 8 at ratios 0.75 and 0.77, a hair from the
    0.8 line, where two answers are fair. On every example the question now asks about an image whose ratio stands
    at least BAND from the line (the next example when the asked one does not), says so, and rollout's step shows
    the same image."""
    from tabs.common import EXAMPLE_IMAGES
    from tabs.course import vision

    net = store.get_model("vit-fashion")
    for asked in range(len(EXAMPLE_IMAGES)):
        q = lessons.question(7, 1, str(asked))
        shown = int(re.search(r"sees example image (\d)", q.text).group(1))
        r = net.classify(str(EXAMPLE_IMAGES[shown]))
        last = r.attention["encoder"].weights[-1].mean(0)[0, r.prefix_tokens:]
        on, g, b = vision.shares(r, last)
        assert abs(min(g, b) / max(g, b) - vision.CLOSE) >= vision.BAND, asked
        assert f"{g:.4f}" in q.fact and f"{b:.4f}" in q.fact
        assert (shown == asked) == ("near-tie" not in q.text), asked
        roll = lessons.question(7, 2, str(asked))
        assert roll.fact == lessons.question(7, 2, str(shown)).fact  # the same image in both steps


def _step_four_directly(net, inp: str):
    """Lesson 5·4 written out: the same haystack cut by SnapKV through compress.compare, each group's kept share."""
    from models.decoding import compress as C
    from models.inspect import retrieval
    from tabs.course import sinks

    q = lessons.question(5, 4, inp)
    length = min(sinks.FORGET_TOKENS, net.context_limit() - sinks.FORGET_NEW - 8)
    hay = retrieval.haystack(net, length, 0.5, seed=0, **retrieval.SHORT)
    cmp = C.compare(net, hay.ids, (), C.Press("snapkv", sinks.FORGET_RATIO, window=sinks.FORGET_WINDOW),
                    max_new_tokens=sinks.FORGET_NEW)
    mask = cmp.kept.mask
    book = [j for j in range(max(1, hay.context_span[0]), hay.context_span[1])
            if not hay.needle_span[0] <= j < hay.needle_span[1]]
    shares = {sinks.GROUPS[0]: mask[:, :, 0].mean(),
              sinks.GROUPS[1]: mask[:, :, hay.answer_span[0]:hay.answer_span[1]].mean()}
    if book:
        shares[sinks.GROUPS[2]] = mask[:, :, book].mean()
    ranked = sorted(shares, key=lambda g: -shares[g])
    want = sinks.TIE if shares[ranked[0]] - shares[ranked[1]] < sinks.MARGIN else ranked[0]
    assert q.answer == want and sorted(q.choices) == sorted([*shares, sinks.TIE])
    assert f"the first token in {shares[sinks.GROUPS[0]]:.0%}" in q.fact
    assert f"the password's tokens in {shares[sinks.GROUPS[1]]:.0%}" in q.fact
    assert (f"the book's other tokens in {shares[sinks.GROUPS[2]]:.0%}" if book else "no other tokens") in q.fact
    assert "  " not in q.fact and "\n" not in q.fact and "`" not in q.fact  # the page shows the line as written
    assert retrieval.found_in(cmp.full.text, hay.answer) == ("(the password), the cut" in q.fact)
    return q, hay, cmp, shares


def test_lesson_five_step_four_reads_its_verdict_from_the_cut_cache(tiny, monkeypatch) -> None:
    """5·4 ("which tokens do the most heads keep?"): the answer is the group of tokens (the first token, the
    password's tokens, the book's others) that the most (layer, key-value head) pairs keep under SnapKV, computed here
    from a compression made directly (compress.compare on the same haystack); a planted kept mask moves it. The tiny
    model reads the needle and the question alone (no book): that group is then not offered."""
    import dataclasses

    from models.decoding import compress as C
    from tabs.course import sinks

    q, hay, cmp, shares = _step_four_directly(store.get_model(catalogue.GPT_TINY), "")
    t = cmp.kept.mask.shape[-1]
    assert t > 12
    mid = t // 2  # a planted book: positions 1..t−1, the needle at mid..mid+4, the password its middle two
    hay = dataclasses.replace(hay, context_span=(1, t), needle_span=(mid, mid + 4), answer_span=(mid + 1, mid + 3))
    book = [j for j in range(1, t) if not mid <= j < mid + 4]

    def planted(keep_sink: bool, keep_password: bool, keep_book: float):
        m = np.zeros_like(cmp.kept.mask)
        m[:, :, 0] = keep_sink
        m[:, :, mid + 1:mid + 3] = keep_password
        m[:, :, book[: int(len(book) * keep_book)]] = True
        kept = C.Kept(cmp.kept.press, m, cmp.kept.scores)
        return lambda name: (hay, dataclasses.replace(cmp, kept=kept))

    for args, answer in (((False, True, 0.5), sinks.GROUPS[1]), ((True, False, 0.5), sinks.GROUPS[0]),
                         ((False, False, 0.5), sinks.GROUPS[2]), ((True, True, 0.0), sinks.TIE),
                         ((False, False, 0.05), sinks.TIE)):
        monkeypatch.setattr(sinks, "_forget", planted(*args))
        got = lessons.question(5, 4, "")
        assert got.answer == answer and len(got.choices) == 4, args
        assert got.reveal(got.answer).to_plotly_json()["data"][0]["type"] == "heatmap"


def test_lesson_five_step_four_on_the_real_model(real_lm) -> None:
    """5·4 on SmolLM2 (a 256-token book): its verdict from the cut cache, computed directly."""
    q, hay, cmp, shares = _step_four_directly(real_lm, "smollm2:")
    assert len(hay.ids) > 200 and len(q.choices) == 4 and "SmolLM2" in q.text
