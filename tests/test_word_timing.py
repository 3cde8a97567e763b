"""Word timings from cross-attention (models/inspect/word_timing.py): the DTW against a brute-force search over every
monotone path, the median filter against scipy.ndimage, words split and punctuation merged, spans planted in an
attention map found again, and the real tiny.en's word starts on the committed clips near the times they were
spoken (known by construction, bench/speech_clips.py)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from models.inspect.word_timing import dtw, median_filter, split_words, word_timings
from models.outputs import AttentionMap, SpeechResult

ROOT = Path(__file__).resolve().parents[1]


def _brute_force(cost: np.ndarray) -> tuple[float, list[tuple[int, int]]]:
    n, m = cost.shape

    @cache
    def best(i: int, j: int) -> tuple[float, tuple[tuple[int, int], ...]]:
        if (i, j) == (0, 0):
            return float(cost[0, 0]), ((0, 0),)
        options = [best(a, b) for a, b in ((i - 1, j - 1), (i - 1, j), (i, j - 1)) if a >= 0 and b >= 0]
        c, path = min(options, key=lambda o: o[0])
        return c + float(cost[i, j]), path + ((i, j),)

    c, path = best(n - 1, m - 1)
    return c, list(path)


def _all_paths_min(cost: np.ndarray) -> float:
    """The cheapest path's cost by enumerating every path (not the recursion above)."""
    n, m = cost.shape
    found = []

    def walk(i: int, j: int, total: float) -> None:
        total += cost[i, j]
        if (i, j) == (n - 1, m - 1):
            found.append(total)
            return
        for a, b in ((i + 1, j + 1), (i + 1, j), (i, j + 1)):
            if a < n and b < m:
                walk(a, b, total)

    walk(0, 0, 0.0)
    return min(found)


@pytest.mark.parametrize("seed", range(12))
def test_dtw_is_the_cheapest_path(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cost = rng.standard_normal((int(rng.integers(1, 5)), int(rng.integers(1, 7))))
    rows, cols = dtw(cost)
    c, path = _brute_force(cost)
    assert list(zip(rows.tolist(), cols.tolist())) == path
    assert np.isclose(cost[rows, cols].sum(), c) and np.isclose(c, _all_paths_min(cost))
    steps = np.diff(np.stack([rows, cols]), axis=1)
    assert ((steps >= 0) & (steps <= 1)).all() and (steps.sum(0) >= 1).all()


def test_median_filter_equals_scipys() -> None:
    from scipy.ndimage import median_filter as scipy_median

    x = np.random.default_rng(0).standard_normal((3, 5, 40))
    np.testing.assert_allclose(median_filter(x, 7), scipy_median(x, size=(1, 1, 7), mode="mirror"))
    np.testing.assert_array_equal(median_filter(x[..., :3], 7), x[..., :3])  # shorter than the padding


VOCAB = {1: " Hello", 2: ",", 3: " wor", 4: "ld", 5: "!", 6: " (", 7: "yes", 8: ")", 9: " \xe2", 10: "\x82\xac"}


def _decode(ids: list[int]) -> str:
    raw = "".join(VOCAB[i] for i in ids).encode("latin-1")
    return raw.decode("utf-8", errors="replace")


def test_words_split_on_spaces_and_punctuation_keep_multibyte_characters() -> None:
    words = split_words([1, 2, 3, 4, 5, 9, 10], _decode, eot=50)
    assert words == [(" Hello", [0]), (",", [1]), (" world", [2, 3]), ("!", [4]), (" €", [5, 6])]


def _planted(spans: list[tuple[int, int]], n_frames: int = 100) -> np.ndarray:
    """Cross-attention (1, 2, T, 1500) where each text token's predicting row attends its planted frames."""
    t = len(spans) + 3  # sot, notimestamps, the tokens, eot
    rng = np.random.default_rng(0)
    w = rng.uniform(0.0, 0.05, (1, 2, t, 1500))
    w[..., n_frames:] *= 5  # attention on the padding after the audio must not matter
    for k, (a, b) in enumerate(spans):
        w[:, :, 1 + k, a:b] += 1.0  # the row before token k predicts it
    w[:, :, 1 + len(spans), spans[-1][1]:n_frames] += 1.0  # the last text row predicts end-of-text
    return (w / w.sum(-1, keepdims=True)).astype(np.float32)


def test_planted_spans_are_found_again() -> None:
    spans = [(5, 30), (30, 42), (42, 70), (70, 88)]
    ids = [100, 102, 1, 3, 4, 2, 101]  # " Hello", " wor" + "ld", ","
    tokens = [str(i) for i in ids]
    frames = [f"{i * 0.02:.2f}s" for i in range(1500)]
    weights = _planted(spans)
    result = SpeechResult(text="Hello world,", ids=ids, tokens=tokens, prompt_len=2,
                          attention={"cross": AttentionMap(weights, tokens, frames)},
                          mel=np.zeros((80, 3000), np.float32), duration_s=2.0, no_speech_prob=0.0,
                          alignment_heads=((0, 0), (0, 1)))
    words = word_timings(result, _decode, eot=101, medfilt=1)
    assert [w.word for w in words] == [" Hello", " world,"]
    assert [(round(w.start, 2), round(w.end, 2)) for w in words] == [(0.0, 0.6), (0.6, 1.4)]
    assert words[1].tokens == (1, 2, 3)
    # one head alone, filtered: the same boundaries within a frame or two
    filtered = word_timings(result, _decode, eot=101, heads=[(0, 1)])
    assert abs(filtered[1].start - 0.6) <= 0.04


def test_real_tiny_en_word_starts_are_near_the_spoken_ones(capsys) -> None:
    from models.inputs.audio import load
    from models.io.hf_whisper import load_packaged

    model = load_packaged()
    errors = []
    for wav in sorted((ROOT / "examples" / "speech").glob("clip*.wav")):
        truth = json.loads(wav.with_suffix(".json").read_text())["words"]
        result = model.transcribe(load(wav.read_bytes()))
        words = word_timings(result, model.tokenizer.decode, model.config.eot_id)
        assert [w.word.strip(" .,?!").lower() for w in words] == [t["word"] for t in truth]
        assert all(a.end == b.start for a, b in zip(words, words[1:]))
        # the first word starts where the path starts (0 s), as in Whisper's own algorithm: the later starts count
        errors += [abs(w.start - t["start"]) for w, t in zip(words[1:], truth[1:])]
    with capsys.disabled():
        print(f"\nword starts after the first: mean error {np.mean(errors) * 1000:.0f} ms, "
              f"max {np.max(errors) * 1000:.0f} ms over {len(errors)} words")
    assert np.mean(errors) < 0.2 and np.max(errors) < 0.35


def test_the_head_that_aligns_is_found() -> None:
    from models.inspect.word_timing import find_heads, score_heads

    spans = [(5, 30), (30, 42), (42, 70), (70, 88)]
    ids = [100, 102, 1, 3, 4, 2, 101]
    tokens, frames = [str(i) for i in ids], [f"{i * 0.02:.2f}s" for i in range(1500)]
    weights = _planted(spans)
    weights[0, 0] = _planted([(60, 80), (10, 20), (80, 90), (20, 40)])[0, 0]  # head 0 follows the words wrongly
    result = SpeechResult(text="", ids=ids, tokens=tokens, prompt_len=2,
                          attention={"cross": AttentionMap(weights, tokens, frames)},
                          mel=np.zeros((80, 3000), np.float32), duration_s=2.0, no_speech_prob=0.0)
    truth = [0.0, 0.6]  # the planted starts of " Hello" and " world,"
    scores = score_heads([(result, truth)], _decode, 101, 1, 2)
    assert scores[0, 1] < 0.01 < scores[0, 0]
    found, _ = find_heads([(result, truth)], _decode, 101, 1, 2)
    assert found == [(0, 1)]
