"""Audio in (models/inputs/audio.py): WAV of every common width, FLAC and MP3 through soundfile, any plausible rate
resampled to 16 kHz without aliasing, stereo to mono; bad audio (empty, silent, too long, too large, corrupt, a video
file, an impossible rate) refused in words."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest

from models.inputs.audio import AudioError, load, prepare, resample


def _wav(x: np.ndarray, rate: int, width: int = 2, channels: int = 1) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        if width == 1:
            raw = np.round(x * 127 + 128).astype(np.uint8).tobytes()
        elif width == 3:
            v = np.round(x * (2 ** 23 - 1)).astype(np.int32)
            raw = np.stack([v & 255, (v >> 8) & 255, (v >> 16) & 255], axis=-1).astype(np.uint8).tobytes()
        else:
            dt = {2: "<i2", 4: "<i4"}[width]
            raw = np.round(x * (2 ** (8 * width - 1) - 1)).astype(dt).tobytes()
        w.writeframes(raw)
    return buf.getvalue()


def _tone(freq: float, rate: int, seconds: float = 1.0, amp: float = 0.5) -> np.ndarray:
    return (amp * np.sin(2 * np.pi * freq * np.arange(int(rate * seconds)) / rate)).astype(np.float32)


def _peak_hz(x: np.ndarray, rate: int = 16000) -> float:
    spectrum = np.abs(np.fft.rfft(x))
    return float(np.fft.rfftfreq(x.size, 1 / rate)[spectrum.argmax()])


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_wav_widths_read_to_the_same_samples(width: int) -> None:
    x = _tone(440, 16000)
    got = load(_wav(x, 16000, width))
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, x, atol=2.0 / 2 ** (8 * width - 1) + 1e-6)


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000])
def test_other_rates_are_resampled_to_16k(rate: int) -> None:
    got = load(_wav(_tone(440, rate), rate))
    assert abs(got.size - 16000) <= 1
    assert abs(_peak_hz(got) - 440) <= 1.0


def test_resampling_does_not_fold_high_frequencies_back() -> None:
    high = _tone(10_000, 44100)  # above 16 kHz's Nyquist: a naive decimation would alias it to 6 kHz
    kept = _tone(3_000, 44100)
    out = resample(high + kept, 44100)
    spectrum = np.abs(np.fft.rfft(out))
    freqs = np.fft.rfftfreq(out.size, 1 / 16000)
    assert spectrum[np.abs(freqs - 6000) < 50].max() < 1e-3 * spectrum.max()
    assert abs(freqs[spectrum.argmax()] - 3000) <= 1


def test_stereo_is_averaged_and_float_wav_is_read() -> None:
    left, right = _tone(440, 16000), _tone(880, 16000)
    inter = np.stack([left, right], axis=1).reshape(-1)
    got = load(_wav(inter, 16000, channels=2))
    np.testing.assert_allclose(got, (left + right) / 2, atol=1e-4)
    import soundfile

    buf = io.BytesIO()
    soundfile.write(buf, left, 16000, format="WAV", subtype="FLOAT")
    np.testing.assert_allclose(load(buf.getvalue()), left, atol=1e-6)


@pytest.mark.parametrize("fmt", ["FLAC", "MP3"])
def test_flac_and_mp3(fmt: str) -> None:
    import soundfile

    buf = io.BytesIO()
    soundfile.write(buf, _tone(440, 44100, 2.0), 44100, format=fmt)
    got = load(buf.getvalue())
    assert abs(got.size - 32000) < 2000 and abs(_peak_hz(got) - 440) <= 2.0


def test_bad_audio_is_refused_in_words() -> None:
    rng = np.random.default_rng(0)
    mp4 = b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom" + bytes(rng.integers(0, 256, 4000, dtype=np.uint8))
    cases = {
        "empty": b"",
        "recording is empty": _wav(np.zeros(0, np.float32), 16000),
        "silent": _wav(np.zeros(16000, np.float32), 16000),
        "at most 30 s": _wav(_tone(440, 8000, 31.0), 8000),
        "not a readable WAV|truncated": b"RIFF\x10\x00\x00\x00WAVEfmt \x10\x00\x00\x00garbage",
        "not a readable audio file": bytes(rng.integers(0, 256, 5000, dtype=np.uint8)),
        "not a readable audio file ": mp4,
        "at most 20 MB": b"RIFF" + bytes(21 * 1024 * 1024),
        "ms long": _wav(_tone(440, 16000, 0.02), 16000),
    }
    for words, data in cases.items():
        with pytest.raises(AudioError, match=words.strip()):
            load(data)
    with pytest.raises(AudioError, match="cannot be right"):
        prepare(_tone(440, 16000), 1000)
    with pytest.raises(AudioError, match="not numbers"):
        prepare(np.full(16000, np.nan, np.float32), 16000)
    # Gradio's microphone gives int16 (samples, channels): scaled, averaged
    pcm = (np.stack([_tone(440, 16000)] * 2, axis=1) * 32767).astype(np.int16)
    np.testing.assert_allclose(prepare(pcm, 16000), _tone(440, 16000), atol=1e-3)
