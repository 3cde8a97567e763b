"""Lesson 6 · Cross-attention in translation."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from examples import sentences
from tabs.common import get_model
from tabs.course.engine import (
    Lesson,
    Question,
    label,
    mark,
    offer,
    sentence,
    stop,
)
from viz.common import esc


@functools.lru_cache(maxsize=16)
def _translate(net, text: str, beam: int):
    return net.translate(text, beam_size=beam)


def _translation(text: str, beam: int):
    return _translate(get_model("translator-en-de"), text, beam)


def l6_align(inp: str) -> Question:
    from viz import text as vt

    text = sentence(inp, sentences.TRANSLATE[0])
    r = _translation(text, 5)
    cross = r.attention["cross"]
    row = min(1, cross.weights.shape[2] - 1)
    w = cross.weights[-1].mean(0)[row]
    best = int(np.argmax(w))
    src = r.source_tokens
    produced = r.target_tokens[row + 1] if row + 1 < len(r.target_tokens) else "</s>"
    order = [label(src, j) for j in np.argsort(-w)]
    return Question(f"The translator turns *{esc(text)}* into *{esc(r.text)}*{stop(r.text)} At step {row} it produces "
                    f"“{esc(produced)}”. **Which English token does that step attend to most (last layer, mean of "
                    "heads)?**", offer(order[:2] + order[-2:], label(src, best)), label(src, best),
                    f"{label(src, best)} gets {w[best]:.2f} of step {row}'s cross-attention",
                    "Cross-attention lets each decoder step read the whole English sentence and pick what it needs. "
                    "In the last layers it often traces a word alignment, though nothing forces it to.",
                    lambda p: mark(vt.cross_alignment(cross.weights, r.target_tokens, src, layer=cross.layers - 1),
                                    p))


def l6_beam(inp: str) -> Question:
    from viz import text as vt

    r = _translation(sentence(inp, sentences.TRANSLATE[0]), 5)
    slots = beam_slots(r)
    choices = BEAM_CHOICES
    answer = choices[0] if not any(slots) else choices[1] if slots[0] == 0 else choices[2]
    lower = [t for t, slot in enumerate(slots) if slot]
    return Question("Beam search keeps the 5 best partial translations at every step, the most likely one in the top "
                    "slot. **Did the translation it finally chose hold the top slot at every step?**", choices,
                    answer, f"the chosen translation's slot at steps 0–{len(slots) - 1}: "
                    + " ".join(str(v) for v in slots)
                    + (f" (below the top at step{'s' if len(lower) > 1 else ''} {', '.join(map(str, lower))})"
                       if lower else ""),
                    "A greedy decoder commits to the best word at every step. Beam search keeps alternatives alive, "
                    "so a hypothesis that is behind for a while can still win on the whole sentence.",
                    lambda p: mark(vt.beam_tree(r.beam, r.chosen, title="Beam search (beam size 5)"), p))


BEAM_CHOICES = ["yes, in the top slot at every step", "no: it started on top and was below it at some later step",
                "no: it started below the top slot"]


def beam_slots(r) -> list[int]:
    """The beam slot of the chosen hypothesis at each step: the red path the beam tree draws (slot 0 is the top)."""
    return [int(c) for c in r.chosen[: len(r.beam)]]


def l6_greedy(inp: str) -> Question:
    from viz import text as vt

    text = sentence(inp, sentences.TRANSLATE[0])
    beam, greedy = _translation(text, 5), _translation(text, 1)
    choices = ["the same translation", "a different one, which the model scores lower (per token)",
               "a different one, which the model scores higher (per token)"]
    answer = choices[0] if greedy.text == beam.text else choices[2] if greedy.score > beam.score else choices[1]
    return Question(f"Beam search (5) gives *{esc(beam.text)}*{stop(beam.text)} **What does greedy search (beam 1) "
                    "give?** (The score is the sentence's log-probability per token, the one beam search ranks by.)",
                    choices, answer, f"greedy: “{greedy.text}”, {greedy.score:.4f} per token; beam search: "
                    f"{beam.score:.4f}",
                    "Greedy search takes the most likely word at every step, and on short captions it often agrees "
                    "with beam search. Beam search is not exhaustive either: it drops all but 5 partial sentences at "
                    "every step, so a path it dropped, greedy's too, can end up scoring higher.",
                    lambda p: mark(vt.cross_alignment(greedy.attention["cross"].weights, greedy.target_tokens,
                                                       greedy.source_tokens, layer=greedy.attention["cross"].layers - 1,
                                                       title="Greedy translation · cross-attention"), p))


SPEECH_CLIPS = Path(__file__).resolve().parents[2] / "examples" / "speech"  # the Listen tab's example clips
SPEECH_MARGIN_S = 0.05  # a head offered beside the best aligns at least this much worse (50 ms): a clear verdict


@functools.lru_cache(maxsize=1)
def speech_scores() -> tuple[np.ndarray, tuple[tuple[int, int], ...], list[str]]:
    """Whisper tiny.en (real, offline) on the committed espeak-ng clips: each decoder head's mean word-start error
    in seconds when its cross-attention alone aligns the words (models.inspect.word_timing.score_heads, the truth
    from each clip's JSON, how bench/speech_clips.py made it), the checkpoint's alignment heads, the transcripts."""
    import json

    from models.inputs.audio import load
    from models.inspect.word_timing import score_heads

    model = get_model_whisper()
    clips, heard = [], []
    for path in sorted(SPEECH_CLIPS.glob("clip*.wav")):
        result = model.transcribe(load(Path(path).read_bytes()))
        truth = [w["start"] for w in json.loads(Path(path).with_suffix(".json").read_text())["words"]]
        clips.append((result, truth))
        heard.append(result.text)
    c = model.config
    scores = score_heads(clips, model.tokenizer.decode, c.eot_id, c.n_dec_layers, c.n_dec_heads)
    return scores, tuple(c.alignment_heads), heard


def get_model_whisper():
    from models.io.hf_whisper import load_packaged

    return load_packaged()


def head_name(layer: int, head: int) -> str:
    return f"layer {layer} · head {head}"


def head_of(name: str) -> tuple[int, int]:
    """(layer, head) of a ``head_name``."""
    layer, head = name.removeprefix("layer ").split(" · head ")
    return int(layer), int(head)


def speech_choices(scores: np.ndarray, margin: float = SPEECH_MARGIN_S) -> tuple[list[str], str]:
    """The best head (lowest error) and up to three others at least ``margin`` worse: the worst, the middle one and
    the best of the rest, so the numbers pick one answer clearly."""
    n_heads = scores.shape[1]
    order = [(int(i // n_heads), int(i % n_heads)) for i in np.argsort(scores, axis=None, kind="stable")]
    best = order[0]
    clear = [h for h in order[1:] if scores[h] >= scores[best] + margin]
    if len(clear) < 2:
        raise ValueError("no two heads align clearly worse than the best: no clear question")
    picks = list(dict.fromkeys([clear[0], clear[len(clear) // 2], clear[-1]]))
    return offer([head_name(*h) for h in picks], head_name(*best)), head_name(*best)


def l6_speech(inp: str) -> Question:
    from viz import speech as vsp

    scores, aligned, heard = speech_scores()
    choices, answer = speech_choices(scores)
    n_heads = scores.shape[1]
    best = divmod(int(np.argmin(scores)), n_heads)
    config_ms = [1000 * scores[h] for h in aligned]
    ms = 1000 * scores
    return Question("Speech has cross-attention too. Whisper tiny.en (real, offline) hears three clips whose word "
                    "starts are known (espeak-ng said each word apart, with gaps: " + "; ".join(
                        f"*{esc(t)}*" for t in heard) + "). Each of its decoder's 24 heads can time the words alone: "
                    "its cross-attention over the 20 ms frames, a dynamic-time-warping path through it, each word "
                    "starting where the path reaches it. **Which head knows best when a word was said (the "
                    "smallest mean error of the word starts)?**", choices, answer,
                    f"{answer}: {ms[best]:.0f} ms mean error over the words after the first; the offered others "
                    + ", ".join(f"{c} {ms[head_of(c)]:.0f} ms" for c in choices if c != answer)
                    + (f"; the checkpoint's {len(aligned)} alignment heads alone: {min(config_ms):.0f}–"
                       f"{max(config_ms):.0f} ms" if aligned else ""),
                    "A few cross-attention heads, mostly in the later layers, follow the words through time; "
                    "OpenAI lists such alignment heads with each checkpoint, and Whisper's word timestamps average "
                    "them. Early heads look at the whole sound at once, so their timings drift.",
                    lambda p: mark(vsp.head_errors_figure(ms, aligned, "each head's word-start error (ms), "
                                                          "alignment heads dotted"),
                                   p, *((f"head {head_of(p)[1]}", f"layer {head_of(p)[0]}") if p in choices
                                        else (None, None))))


LESSON = Lesson(
    "6 · Cross-attention in translation", "How each German word reads the English sentence; the beam tree; and "
    "in speech, which of Whisper's heads knows when a word was said.",
           "English sentence", sentences.TRANSLATE[0], (l6_align, l6_beam, l6_greedy, l6_speech))
