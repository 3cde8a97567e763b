"""The Listen tab's handlers (tabs/listen.py) on the real tiny.en: an example clip transcribed, its word timings and
figures; other heads redrawn from the kept result; bad audio refused in words, the way a person gives it."""

from __future__ import annotations

import io
import json
import wave
from pathlib import Path

import numpy as np
import pytest

from tabs import listen as ls
from tabs.common import Error


def _figure_mb(fig) -> float:
    return len(fig.to_json().encode("utf-8")) / 1e6


def test_an_example_clip_is_transcribed_timed_and_drawn() -> None:
    clip = ls.EXAMPLE_CLIPS[1]
    spoken = json.loads(Path(clip).with_suffix(".json").read_text())
    state, summary, fig, table, aligned, words, selfs, sound = ls.listen(clip, None, ls.HEADS[0], 3, 0)
    assert "Where is the train station?" in summary
    assert [row[0].strip("?").lower() for row in table] == [w["word"] for w in spoken["words"]]
    assert all(a[2] == b[1] for a, b in zip(table, table[1:]))  # each word ends where the next begins
    assert [c[1] for c in words["choices"]] == [str(k) for k in range(len(table))]
    assert fig.data[0].type == "heatmap" and fig.data[1].type == "scatter"
    assert len(fig.layout.shapes) == 2 * len(table)
    assert aligned.data[1].name == "DTW path"
    assert max(_figure_mb(fig), _figure_mb(aligned)) < 2.0
    # one head of layer 0, the last word: redrawn from the kept result, its attention over time is another curve
    fig2, table2, _, words2, _, sound2 = ls.redraw(state, ls.HEADS[1], 0, 0, "4")
    assert words2["value"] == "4" and "layer 0, head 0" in fig2.layout.title.text
    assert not np.allclose(np.asarray(fig2.data[1].y), np.asarray(fig.data[1].y))
    assert ls.chosen_heads(state["config"], ls.HEADS[2], 9, 0) == [(3, h) for h in range(6)]
    # the picked word's span, to play: exactly the recording's samples between its start and end
    audio = state["audio"]
    for (rate, samples), row in ((sound, table[0]), (sound2, table2[4])):
        a, b = round(row[1] * 16000), round(row[2] * 16000)
        assert rate == 16000 and abs(len(samples) - (b - a)) <= 160
        np.testing.assert_allclose(samples[:100] / 32767, audio[a:a + 100], atol=2e-4)
    assert "encoder self-attention, layer 3, head 0" in selfs.layout.title.text


def test_self_attention_views_equal_the_model_s_own_maps() -> None:
    """The encoder view is the model's encoder attention over the audio's frames (a short clip: no blocks), the
    padding's share in its last column; the decoder view is the kept decoder self-attention of the chosen head."""
    import torch

    from models.families.whisper import log_mel
    from models.io.hf_whisper import load_packaged

    clip = ls.EXAMPLE_CLIPS[0]
    state = ls.listen(clip, None, ls.HEADS[0], 1, 2)[0]
    model = load_packaged()
    mel = torch.from_numpy(log_mel(state["audio"]))[None]
    with torch.no_grad():
        full = model.encode(mel, weights=True).attention[1][0, 2].numpy()  # layer 1, head 2: (1500, 1500)
    n = state["encoder"].shape[2]
    assert n == int(np.ceil(len(state["audio"]) / 320)) and state["block"] == 1
    fig = ls.self_attention(state, 1, 2, ls.SHOW[0])
    z = np.asarray(fig.data[0].z, dtype=np.float64)
    np.testing.assert_allclose(z[:, :n], full[:n, :n], atol=1e-5)
    np.testing.assert_allclose(z[:, n], full[:n, n:].sum(-1), atol=1e-4)
    np.testing.assert_allclose(z.sum(-1), 1.0, atol=1e-4)
    dec = ls.self_attention(state, 2, 5, ls.SHOW[1])
    np.testing.assert_allclose(np.asarray(dec.data[0].z, dtype=np.float64),
                               state["result"].attention["decoder"].weights[2, 5], atol=1e-6)
    assert "decoder self-attention, layer 2, head 5" in dec.layout.title.text


def test_pooled_encoder_blocks_keep_rows_summing_to_one() -> None:
    rng = np.random.default_rng(0)
    w = rng.random((2, 3, 7, 9))
    w /= w.sum(-1, keepdims=True)  # 7 frames of audio + 2 keys of padding
    full = np.concatenate([w[..., :7], w[..., 7:].sum(-1, keepdims=True)], -1)
    pooled, labels = ls.pooled_encoder(full, 7, cap=3)  # blocks of 3 frames: [0, 3), [3, 6), [6, 7)
    assert labels == ["0.00s", "0.06s", "0.12s"] and pooled.shape == (2, 3, 3, 4)
    np.testing.assert_allclose(pooled[0, 1, 0, 1], full[0, 1, 0:3, 3:6].sum(-1).mean(), rtol=1e-6)
    padding = np.stack([full[..., a:b, 7].mean(-1) for a, b in ((0, 3), (3, 6), (6, 7))], -1)
    np.testing.assert_allclose(pooled[..., 3], padding, rtol=1e-6)
    np.testing.assert_allclose(pooled.sum(-1), 1.0, rtol=1e-6)


def test_beam_and_timestamps_from_the_tab() -> None:
    """The tab's beam size and timestamp tokens reach the model: its summary names the search and lists the
    segments, which are the model's own transcribe(beam_size=3, timestamps=True)."""
    from models.inputs.audio import load
    from models.io.hf_whisper import load_packaged

    clip = ls.EXAMPLE_CLIPS[2]
    state, summary = ls.listen(clip, None, ls.HEADS[0], 3, 0, 3, True)[:2]
    direct = load_packaged().transcribe(load(Path(clip).read_bytes()), beam_size=3, timestamps=True)
    assert state["result"].segments == direct.segments and "beam 3, timestamps" in summary
    for a, b, text in direct.segments:
        assert f"[{a:.2f} s → {b:.2f} s] {text}" in summary
    for bad in (0, 9, "x"):
        with pytest.raises(Error, match="beam size"):
            ls.listen(clip, None, ls.HEADS[0], 3, 0, bad)


def test_a_link_carries_an_example_clip_never_an_upload(tmp_path: Path) -> None:
    assert ls.clip_name(ls.EXAMPLE_CLIPS[1]) == "clip2" and ls.clip_path("clip2") == ls.EXAMPLE_CLIPS[1]
    assert ls.clip_name({"path": "/tmp/gradio/abc/clip3.wav"}) == "clip3"
    assert ls.clip_name(str(tmp_path / "mine.wav")) == "upload" and ls.clip_name(None) is None
    with pytest.raises(ValueError, match="cannot carry"):
        ls.clip_path("upload")
    for bad in ("../etc/passwd", "/examples/speech/clip1.wav", "clip9"):
        with pytest.raises(ValueError):
            ls.clip_path(bad)


def _wav_file(tmp_path: Path, name: str, samples: np.ndarray, rate: int = 16000) -> str:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((samples * 32767).astype("<i2").tobytes())
    path = tmp_path / name
    path.write_bytes(buf.getvalue())
    return str(path)


def test_bad_audio_is_refused_in_words(tmp_path: Path) -> None:
    (tmp_path / "film.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(100))
    (tmp_path / "broken.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")
    (tmp_path / "empty.mp3").write_bytes(b"")
    cases = {
        str(tmp_path / "film.mp4"): "not audio this tab reads",
        str(tmp_path / "broken.wav"): "cannot be heard",
        str(tmp_path / "empty.mp3"): "empty",
        _wav_file(tmp_path, "silent.wav", np.zeros(16000)): "silent",
        _wav_file(tmp_path, "long.wav", 0.3 * np.sin(np.arange(8000 * 600) / 3), 8000): "at most 30 s",
    }
    for path, words in cases.items():
        with pytest.raises(Error, match=words):
            ls.listen(path, None)
    with pytest.raises(Error, match="Upload a WAV"):
        ls.listen(None, None)
    with pytest.raises(Error, match="sample rate"):
        ls.listen(None, (50, np.ones(1000, np.int16)))
    assert ls.redraw(None)[0] is not None  # nothing kept: nothing redrawn, no error


def test_the_api_transcribes_an_uploaded_clip(app_url: str) -> None:
    """/listen through gradio_client against the launched app: the transcript and the word timings."""
    from gradio_client import Client, handle_file

    client = Client(app_url, verbose=False)
    clip = ls.EXAMPLE_CLIPS[2]
    summary, _, table = client.predict(handle_file(clip), None, "alignment heads", 3, 0, api_name="/listen")[:3]
    assert "I like to read books" in summary
    rows = table["data"] if isinstance(table, dict) else table
    assert [r[0].strip(".").lower() for r in rows] == ["i", "like", "to", "read", "books"]


# ------------------------------------------------------------------------- lesson 6, step 4: which head knows when
def test_lesson_step_which_head_knows_when_a_word_was_said() -> None:
    """The verdict is the head whose own DTW timings, computed here head by head from the committed clips and their
    known word starts, have the smallest mean error; every other choice is at least the margin worse; the fact line
    states those numbers."""
    from models.inputs.audio import load
    from models.inspect.word_timing import word_timings
    from models.io.hf_whisper import load_packaged
    from tabs import lessons
    from tabs.course import translation as tr

    model = load_packaged()
    c = model.config
    clips = []
    for path in ls.EXAMPLE_CLIPS:
        truth = [w["start"] for w in json.loads(Path(path).with_suffix(".json").read_text())["words"]]
        clips.append((model.transcribe(load(Path(path).read_bytes())), truth))
    errors = np.zeros((c.n_dec_layers, c.n_dec_heads))
    for layer in range(c.n_dec_layers):
        for head in range(c.n_dec_heads):
            diffs = []
            for result, truth in clips:
                words = word_timings(result, model.tokenizer.decode, c.eot_id, [(layer, head)])
                assert len(words) == len(truth)
                diffs += [abs(w.start - t) for w, t in zip(words[1:], truth[1:])]
            errors[layer, head] = np.mean(diffs)
    q = lessons.question(6, 4, "")
    best = np.unravel_index(np.argmin(errors), errors.shape)
    assert q.answer == f"layer {best[0]} · head {best[1]}" and q.answer in q.choices and len(q.choices) >= 3
    for choice in q.choices:
        layer, head = tr.head_of(choice)
        if choice != q.answer:
            assert errors[layer, head] >= errors[best] + tr.SPEECH_MARGIN_S
        assert f"{choice}{': ' if choice == q.answer else ' '}{1000 * errors[layer, head]:.0f} ms" in q.fact
    fig = q.reveal(q.choices[-1])
    np.testing.assert_allclose(np.asarray(fig.data[0].z, dtype=np.float64), 1000 * errors, atol=0.01)
    assert "your prediction: " + q.choices[-1] in fig.layout.title.text
    assert len(fig.layout.shapes) == len(c.alignment_heads)


def test_the_speech_step_refuses_a_question_without_a_clear_answer() -> None:
    from tabs.course import translation as tr

    close = np.full((2, 3), 0.10)
    close[0, 0] = 0.08  # every other head within 50 ms of the best
    with pytest.raises(ValueError, match="no clear question"):
        tr.speech_choices(close)
    spread = np.array([[0.30, 0.08, 0.50], [0.20, 0.12, 0.90]])
    choices, answer = tr.speech_choices(spread)
    assert answer == "layer 0 · head 1" and "layer 1 · head 1" not in choices  # 40 ms worse: too close to offer
    assert set(choices) == {"layer 0 · head 1", "layer 1 · head 0", "layer 0 · head 2", "layer 1 · head 2"}
