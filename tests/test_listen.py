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
    state, summary, fig, table, aligned, words = ls.listen(clip, None, ls.HEADS[0], 3, 0)
    assert "Where is the train station?" in summary
    assert [row[0].strip("?").lower() for row in table] == [w["word"] for w in spoken["words"]]
    assert all(a[2] == b[1] for a, b in zip(table, table[1:]))  # each word ends where the next begins
    assert [c[1] for c in words["choices"]] == [str(k) for k in range(len(table))]
    assert fig.data[0].type == "heatmap" and fig.data[1].type == "scatter"
    assert len(fig.layout.shapes) == 2 * len(table)
    assert aligned.data[1].name == "DTW path"
    assert max(_figure_mb(fig), _figure_mb(aligned)) < 2.0
    # one head of layer 0, the last word: redrawn from the kept result, its attention over time is another curve
    fig2, table2, _, words2 = ls.redraw(state, ls.HEADS[1], 0, 0, "4")
    assert words2["value"] == "4" and "layer 0, head 0" in fig2.layout.title.text
    assert not np.allclose(np.asarray(fig2.data[1].y), np.asarray(fig.data[1].y))
    assert ls.chosen_heads(state["config"], ls.HEADS[2], 9, 0) == [(3, h) for h in range(6)]


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
