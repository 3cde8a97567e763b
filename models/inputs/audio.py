"""Audio in: bytes or an array -> 16 kHz mono float32 in [-1, 1], or an ``AudioError`` that says in words what is
wrong (empty, silent, too long, too large, not audio, a rate or channel layout that cannot be read).

WAV (PCM 8/16/24/32-bit integer, or 32/64-bit float) is read with the standard library's parser (``wave``) and a small
reader of the RIFF chunks for IEEE-float files; FLAC and MP3 are decoded by ``soundfile`` (libsndfile) when it is
installed, and refused in words when not. Any other sample rate is resampled to 16 kHz by band-limited Fourier
resampling (the spectrum cut or zero-padded to the new length, so nothing above the new Nyquist frequency folds back);
channels are averaged to mono. Limits (``models.limits``): ``MAX_AUDIO_S`` seconds (Whisper's 30 s window) and
``MAX_UPLOAD_MB`` per file, checked before the samples are decoded.
"""

from __future__ import annotations

import io
import struct
import wave

import numpy as np

from models.limits import MAX_AUDIO_S, MAX_UPLOAD_MB, MIN_AUDIO_S

TARGET_RATE = 16_000
SILENCE_PEAK = 1e-3  # a clip whose loudest sample is below this (−60 dBFS) is silence
MIN_RATE, MAX_RATE = 4_000, 192_000


class AudioError(ValueError):
    """Audio that cannot be used; the message says why in words."""


def resample(audio: np.ndarray, rate: int, target: int = TARGET_RATE) -> np.ndarray:
    """``audio`` (N,) at ``rate`` -> at ``target``: the real spectrum cut (or padded with zeros) to the new length."""
    audio = np.asarray(audio, dtype=np.float64)
    if rate == target or audio.size == 0:
        return audio.astype(np.float32)
    n_out = max(1, int(round(audio.size * target / rate)))
    spectrum = np.fft.rfft(audio)
    keep = n_out // 2 + 1
    out_spec = np.zeros(keep, dtype=np.complex128)
    m = min(keep, spectrum.size)
    out_spec[:m] = spectrum[:m]
    if n_out % 2 == 0 and m == keep and m < spectrum.size:  # the new Nyquist bin of a real signal is real
        out_spec[keep - 1] = out_spec[keep - 1].real
    return (np.fft.irfft(out_spec, n_out) * (n_out / audio.size)).astype(np.float32)


def _float_wav(data: bytes) -> tuple[np.ndarray, int]:
    """(samples (N, C), rate) of a RIFF WAVE file of IEEE floats (format 3), which ``wave`` does not read."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise AudioError("not a WAV file")
    at, fmt, samples = 12, None, None
    while at + 8 <= len(data):
        cid, size = data[at:at + 4], struct.unpack("<I", data[at + 4:at + 8])[0]
        body = data[at + 8:at + 8 + size]
        if cid == b"fmt " and len(body) >= 16:
            fmt = struct.unpack("<HHIIHH", body[:16])
        elif cid == b"data":
            samples = body
        at += 8 + size + (size & 1)
    if fmt is None or samples is None:
        raise AudioError("a WAV file without its format or data chunk (truncated or corrupt)")
    code, channels, rate, _, _, bits = fmt
    if code not in (3, 0xFFFE) or bits not in (32, 64) or channels < 1:
        raise AudioError(f"a WAV encoding this reader does not know (format {code}, {bits} bits); use PCM or float")
    dtype = "<f4" if bits == 32 else "<f8"
    usable = len(samples) // (bits // 8 * channels) * channels
    return np.frombuffer(samples[: usable * bits // 8], dtype=dtype).reshape(-1, channels).astype(np.float32), rate


def _wav(data: bytes) -> tuple[np.ndarray, int]:
    try:
        with wave.open(io.BytesIO(data)) as w:
            channels, width, rate, n = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            n = min(n, len(data) // max(1, width * channels))  # a streamed header may claim more than is there
            if rate and n / rate > MAX_AUDIO_S + 0.5:
                raise AudioError(f"the recording is {n / rate:.1f} s long; at most {MAX_AUDIO_S:.0f} s can be heard "
                                 "(Whisper's window)")
            raw = w.readframes(n)
    except wave.Error as err:
        if "unknown format: 3" in str(err) or "unknown format: 65534" in str(err):
            return _float_wav(data)
        raise AudioError(f"not a readable WAV file ({err})") from None
    except EOFError:
        raise AudioError("the WAV file is truncated") from None
    frames = len(raw) // (width * channels)
    raw = raw[: frames * width * channels]
    if width == 1:
        x = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        x = np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
    elif width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        x = (np.where(v >= 1 << 23, v - (1 << 24), v)).astype(np.float32) / float(1 << 23)
    elif width == 4:
        x = np.frombuffer(raw, "<i4").astype(np.float32) / float(1 << 31)
    else:
        raise AudioError(f"{8 * width}-bit WAV samples are not supported")
    return x.reshape(-1, channels), rate


def _other(data: bytes) -> tuple[np.ndarray, int]:
    """FLAC, MP3, OGG through libsndfile (``soundfile``), when installed."""
    try:
        import soundfile
    except ImportError:
        raise AudioError("only WAV can be read here (FLAC and MP3 need the soundfile package)") from None
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as f:
            if f.samplerate and f.frames / f.samplerate > MAX_AUDIO_S + 0.5:
                raise AudioError(f"the recording is {f.frames / f.samplerate:.1f} s long; at most {MAX_AUDIO_S:.0f} "
                                 "s can be heard (Whisper's window)")
            x = f.read(dtype="float32", always_2d=True)
            return x, int(f.samplerate)
    except (RuntimeError, soundfile.LibsndfileError, TypeError) as err:
        raise AudioError(f"not a readable audio file (WAV, FLAC or MP3): {err}") from None


def decode(data: bytes) -> tuple[np.ndarray, int]:
    """(samples (N, channels) float32, rate) of an audio file's bytes; refuses too-large files before decoding."""
    if not data:
        raise AudioError("the file is empty")
    if len(data) > MAX_UPLOAD_MB * 1024 * 1024:
        raise AudioError(f"the file is {len(data) / 1e6:.1f} MB; at most {MAX_UPLOAD_MB} MB can be uploaded")
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return _wav(data)
    return _other(data)


def prepare(samples: np.ndarray, rate: int) -> np.ndarray:
    """(N,) or (N, channels) samples at ``rate`` -> 16 kHz mono float32, checked: not empty, not silent, not longer
    than MAX_AUDIO_S, no NaN, a plausible rate. Integer samples are scaled from their type's range."""
    x = np.asarray(samples)
    if not isinstance(rate, (int, np.integer)) or not MIN_RATE <= int(rate) <= MAX_RATE:
        raise AudioError(f"a sample rate of {rate} Hz cannot be right (from {MIN_RATE:,} to {MAX_RATE:,} Hz)")
    if np.issubdtype(x.dtype, np.integer):
        x = x.astype(np.float32) / float(np.iinfo(x.dtype).max + 1)
    x = x.astype(np.float32)
    if x.ndim == 2:
        # Gradio gives (N, channels); a (channels, N) array with few rows is turned the right way
        x = x.T if x.shape[0] <= 8 < x.shape[1] else x
        x = x.mean(axis=1)
    if x.ndim != 1:
        raise AudioError(f"audio must be (samples,) or (samples, channels), got shape {x.shape}")
    if x.size == 0:
        raise AudioError("the recording is empty")
    if not np.isfinite(x).all():
        raise AudioError("the recording holds samples that are not numbers")
    seconds = x.size / int(rate)
    if seconds > MAX_AUDIO_S + 0.5:
        raise AudioError(f"the recording is {seconds:.1f} s long; at most {MAX_AUDIO_S:.0f} s can be heard "
                         "(Whisper's window)")
    if seconds < MIN_AUDIO_S:
        raise AudioError(f"the recording is {seconds * 1000:.0f} ms long; at least {MIN_AUDIO_S * 1000:.0f} ms are "
                         "needed")
    if float(np.abs(x).max()) < SILENCE_PEAK:
        raise AudioError("the recording is silent (its loudest sample is below −60 dBFS)")
    x = resample(x, int(rate))
    return np.clip(x, -1.0, 1.0)[: int(MAX_AUDIO_S * TARGET_RATE)]


def load(data: bytes) -> np.ndarray:
    """An audio file's bytes -> 16 kHz mono float32, checked (``prepare``)."""
    samples, rate = decode(data)
    return prepare(samples, rate)
