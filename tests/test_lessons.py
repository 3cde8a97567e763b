"""The Lessons tab (tabs/lessons.py) over the tiny checkpoints: every step offers 3–4 predictions of which exactly
one is judged correct, the correct one follows the model's numbers (checked here against numbers computed
independently) and changes with the input when the numbers do; progress keeps first answers; a lesson exports as
one self-contained page; the API serves the same steps."""

from __future__ import annotations

import math
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


def test_eight_lessons_of_three_to_six_steps() -> None:
    assert len(lessons.LESSONS) >= 8
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
    assert figure["data"] and explanation.count(".") >= 2  # a figure, and two sentences


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
    from models.inspect.analysis import induction_score, previous_token_score

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
        assert lessons.question(4, step, "3").answer == f"layer {layer} head {head}"
    # lesson 7, step 3: the bottom-right window of an 8 × 8 grid, window 4, shift 2, built by the paper's slices
    region = np.zeros((8, 8), dtype=int)
    cuts = (slice(0, -4), slice(-4, -2), slice(-2, None))
    for i, (a, b) in enumerate((a, b) for a in cuts for b in cuts):
        region[a, b] = i
    assert lessons.question(7, 3).answer == str(len(np.unique(region[4:, 4:])))


def test_hostile_lesson_calls_answer_in_words(tiny) -> None:
    for number, step, message in ((0, 1, "There are 8 lessons"), (9, 1, "There are 8 lessons"),
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
    assert page.count("<section>") == 3 and "src=\"http" not in page and "Plotly.newPlot" in page
    assert len(page) > 1_000_000  # plotly.js inline


def test_api_lesson_endpoints(client) -> None:
    text, before, choices = client.predict(4, 2, "1", api_name="/lesson")
    assert "induction" in text and 3 <= len(choices) <= 4
    results = [client.predict(4, 2, c, "1", api_name="/lesson_answer")[0] for c in choices]
    assert sum(r.startswith("correct") for r in results) == 1


@pytest.fixture(scope="module")
def client(app_url: str):
    from gradio_client import Client

    return Client(app_url, verbose=False)
