"""Make speech clips whose word boundaries are known by construction: each word is synthesised on its own by Debian's
``espeak-ng`` (``apt-get install -y espeak-ng``), its leading and trailing silence trimmed (samples below −40 dBFS
of the word's peak), resampled to 16 kHz, and the words concatenated with a fixed gap of silence between them.
Each clip is a 16 kHz mono 16-bit WAV and a JSON file beside it: the sentence, the words, each word's start and end
in seconds, the voice, speed and gap, and the espeak-ng version that spoke it.

    python bench/speech_clips.py --out examples/speech            # the committed examples (EXAMPLES below)
    python bench/speech_clips.py --out runs/speech --sentences "one two three" "four five"

The clips in examples/speech were made with the first command (espeak-ng 1.51, voice en-us, speed 130, gap 0.08 s).
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import wave
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.inputs.audio import TARGET_RATE, decode, resample  # noqa: E402

EXAMPLES = ("please open the door", "where is the train station", "i like to read books")
HELD_OUT = ("we went to the market", "thank you very much", "my name is john")  # not committed: the bench's
LEAD_S = 0.3  # silence before the first word and after the last


def speak(word: str, voice: str, speed: int) -> np.ndarray:
    """One word as 16 kHz float32 samples, its silence trimmed."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "word.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(out), word], check=True,
                       capture_output=True)
        wav = out.read_bytes()
    samples, rate = decode(wav)
    x = resample(samples.mean(axis=1), rate, TARGET_RATE)
    loud = np.flatnonzero(np.abs(x) > 0.01 * np.abs(x).max())
    return x[loud[0]: loud[-1] + 1] if loud.size else x[:0]


def make(sentence: str, voice: str = "en-us", speed: int = 130, gap: float = 0.08) -> tuple[np.ndarray, dict]:
    """(samples, the clip's record) of ``sentence`` spoken word by word."""
    words = sentence.split()
    parts, spans, at = [np.zeros(int(LEAD_S * TARGET_RATE), np.float32)], [], LEAD_S
    for i, w in enumerate(words):
        x = speak(w, voice, speed)
        spans.append({"word": w, "start": round(at, 4), "end": round(at + x.size / TARGET_RATE, 4)})
        parts.append(x)
        at += x.size / TARGET_RATE
        silence = gap if i < len(words) - 1 else LEAD_S
        parts.append(np.zeros(int(round(silence * TARGET_RATE)), np.float32))
        at += int(round(silence * TARGET_RATE)) / TARGET_RATE
    audio = np.concatenate(parts)
    audio = 0.8 * audio / max(1e-6, float(np.abs(audio).max()))
    version = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True).stdout
    version = version.split("Data at")[0].strip()
    return audio, {"sentence": sentence, "words": spans, "voice": voice, "speed": speed, "gap_s": gap,
                   "made_by": f"bench/speech_clips.py with {version}"}


def write_wav(path: Path, audio: np.ndarray) -> None:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(TARGET_RATE)
        w.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
    path.write_bytes(buf.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sentences", nargs="*", default=list(EXAMPLES))
    ap.add_argument("--voice", default="en-us")
    ap.add_argument("--speed", type=int, default=130)
    ap.add_argument("--gap", type=float, default=0.08)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    made = []
    for i, sentence in enumerate(args.sentences):
        audio, record = make(sentence, args.voice, args.speed, args.gap)
        name = f"clip{i + 1}"
        write_wav(args.out / f"{name}.wav", audio)
        (args.out / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        made.append({"clip": name, "seconds": round(audio.size / TARGET_RATE, 2), "sentence": sentence})
    print(json.dumps({"clips": made}))


if __name__ == "__main__":
    main()
