"""Whisper (Radford et al. 2022, "Robust Speech Recognition via Large-Scale Weak Supervision"), in the project's own
code: the log-mel front end, the convolution stem, the audio encoder and the text decoder with cross-attention, and
greedy decoding with Whisper's rules. Every layer's self- and cross-attention comes back as weights.

- Front end (§2.2): 16 kHz mono audio, padded with zeros (or cut) to 30 s; a short-time Fourier transform with a
  25 ms periodic Hann window (n_fft 400) every 10 ms (hop 160), centred with reflection padding, the last frame
  dropped (3,000 frames); the power spectrum through 80 (or 128) Slaney-normalised mel filters (``mel_filters``,
  computed here as Slaney's Auditory Toolbox defines them: linear below 1 kHz, logarithmic above, each triangle scaled
  to unit area); log10 of it clamped at 1e-10, then at 8 below its maximum, and mapped by (x + 4) / 4.
- Encoder (§2.2): two 1-D convolutions of width 3 (the second with stride 2: 3,000 frames -> 1,500 positions),
  each followed by GELU; sinusoidal positions; pre-norm Transformer blocks (LayerNorm before self-attention and the
  GELU feed-forward), one LayerNorm after the stack.
- Decoder: token embeddings plus learned positions, pre-norm blocks of causal self-attention, cross-attention over
  the encoder output and the feed-forward, one LayerNorm after the stack; the output projection is the embedding
  table (tied). Keys have no bias (Whisper's key projections have none); queries are scaled by d_head^-0.5.
- Decoding (the released ``decoding.py`` rules): the prompt ``<|startoftranscript|>`` [language, task]
  ``<|notimestamps|>``; at every step the config's suppressed ids get −∞, at the first step also the "begin"
  ids (a leading space and end-of-text); greedy until end-of-text or ``max_new_tokens``. The no-speech probability
  is the softmax of ``<|nospeech|>`` (``<|nocaptions|>`` in the English-only vocabulary) at the prompt's first
  position, as the paper's voice-activity rule reads it.

Attention is explicit (softmax of scaled scores, float32) only when weights are asked for; otherwise
``scaled_dot_product_attention``. Readers: ``models.io.hf_whisper`` (Hugging Face folders, CTranslate2 files).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.outputs import AttentionMap, SpeechResult

SAMPLE_RATE = 16_000  # Hz: what every Whisper model hears
N_FFT = 400  # 25 ms window
HOP = 160  # 10 ms between frames
CHUNK_S = 30  # seconds in one window: every input is padded (or cut) to this
N_SAMPLES = SAMPLE_RATE * CHUNK_S  # 480,000
N_FRAMES = N_SAMPLES // HOP  # 3,000 mel frames -> 1,500 encoder positions
FRAME_S = 2 * HOP / SAMPLE_RATE  # seconds per encoder position (0.02)


# ------------------------------------------------------------------------------------------------------ front end
def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear (3 per 200 Hz) below 1 kHz, logarithmic (27 steps per factor 6.4) above."""
    f = np.asarray(f, dtype=np.float64)
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, math.log(6.4) / 27.0
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, f / f_sp)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, math.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)


def mel_filters(n_mels: int = 80, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT) -> np.ndarray:
    """(n_mels, n_fft // 2 + 1) float32: triangular filters with centres evenly spaced on Slaney's mel scale from 0
    to the Nyquist frequency, each normalised to unit area (2 / its width in Hz)."""
    fft_hz = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(sample_rate / 2), n_mels + 2))
    widths = np.diff(edges)
    ramps = edges[:, None] - fft_hz[None, :]
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))
    weights *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return weights.astype(np.float32)


def pad_or_trim(audio: np.ndarray, length: int = N_SAMPLES) -> np.ndarray:
    """The audio cut or zero-padded to ``length`` samples (Whisper's 30 s window)."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if audio.size >= length:
        return audio[:length]
    return np.pad(audio, (0, length - audio.size))


def log_mel(audio: np.ndarray, n_mels: int = 80, filters: np.ndarray | None = None) -> np.ndarray:
    """(n_mels, 3000) float32: Whisper's log-mel spectrogram of 16 kHz mono ``audio`` padded or cut to 30 s."""
    x = torch.from_numpy(pad_or_trim(audio)).double()
    window = torch.hann_window(N_FFT, periodic=True, dtype=torch.float64)
    stft = torch.stft(x, N_FFT, HOP, window=window, center=True, pad_mode="reflect", return_complex=True)
    power = stft[..., :-1].abs() ** 2  # (n_fft // 2 + 1, 3000): the last frame dropped
    fb = torch.from_numpy(filters if filters is not None else mel_filters(n_mels)).double()
    logs = torch.clamp(fb @ power, min=1e-10).log10()
    logs = torch.maximum(logs, logs.max() - 8.0)
    return ((logs + 4.0) / 4.0).float().numpy()


# ------------------------------------------------------------------------------------------------------- the model
@dataclass
class WhisperConfig:
    n_mels: int = 80  # mel bins of the front end (80; 128 for large-v3)
    d_model: int = 384  # width of every layer (tiny: 384)
    n_enc_layers: int = 4  # encoder blocks
    n_dec_layers: int = 4  # decoder blocks
    n_enc_heads: int = 6  # encoder self-attention heads
    n_dec_heads: int = 6  # decoder self- and cross-attention heads
    d_ff: int = 1536  # encoder feed-forward width
    d_ff_dec: int = 1536  # decoder feed-forward width
    n_audio_ctx: int = 1500  # encoder positions (30 s at 20 ms each)
    n_text_ctx: int = 448  # decoder positions
    vocab_size: int = 51864  # 51,864 English-only, 51,865 multilingual
    eot_id: int = 50256  # <|endoftext|>
    prompt: tuple[int, ...] = (50257, 50362)  # <|startoftranscript|> [<|en|> <|transcribe|>] <|notimestamps|>
    no_speech_id: int | None = 50361  # <|nospeech|> / <|nocaptions|>: its probability at the first step
    suppress: tuple[int, ...] = ()  # ids never produced
    suppress_begin: tuple[int, ...] = (220, 50256)  # ids not produced first (a bare space, end-of-text)
    alignment_heads: tuple[tuple[int, int], ...] = ()  # (decoder layer, head) pairs whose cross-attention aligns
    no_timestamps_id: int | None = 50362  # <|notimestamps|>; the timestamp tokens <|0.00|>… follow it
    languages: tuple[tuple[str, int], ...] = ()  # multilingual: (code, <|code|> id) of each language; () English-only
    translate_id: int | None = None  # multilingual: <|translate|> (the config's prompt holds <|transcribe|>)
    ln_eps: float = 1e-5  # every LayerNorm's epsilon

    @property
    def n_layers(self) -> int:
        """The decoder's layer count (the project's one config vocabulary: the text side's layers)."""
        return self.n_dec_layers

    @property
    def n_heads(self) -> int:
        return self.n_dec_heads


def sinusoids(length: int, channels: int, max_timescale: float = 10_000.0) -> Tensor:
    """(length, channels): Whisper's encoder positions, sines of every timescale then cosines (Vaswani et al. 2017,
    §3.5, with log-spaced timescales from 1 to ``max_timescale``)."""
    half = channels // 2
    step = math.log(max_timescale) / (half - 1)
    inv = torch.exp(-step * torch.arange(half, dtype=torch.float32))
    t = torch.arange(length, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


class Attention(nn.Module):
    """Multi-head attention with Whisper's projections (no key bias); returns (output, weights or None)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not a multiple of {n_heads} heads")
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model, bias=False)
        self.v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def split(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, H, T, d)
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_head).transpose(1, 2)

    def keys_values(self, source: Tensor) -> tuple[Tensor, Tensor]:
        return self.split(self.k(source)), self.split(self.v(source))

    def forward(self, x: Tensor, kv: tuple[Tensor, Tensor] | None = None, causal: bool = False,
                weights: bool = False) -> tuple[Tensor, Tensor | None]:
        q = self.split(self.q(x))
        k, v = kv if kv is not None else self.keys_values(x)
        b, _, t, _ = q.shape
        if not weights:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal and t > 1)
            p = None
        else:
            scores = (q.float() @ k.float().transpose(-1, -2)) * self.d_head ** -0.5  # (B, H, T, S)
            if causal:
                s = k.shape[-2]
                mask = torch.ones(t, s, dtype=torch.bool, device=x.device).tril(s - t)
                scores = scores.masked_fill(~mask, float("-inf"))
            p = scores.softmax(-1)
            out = (p.to(v.dtype) @ v)
        out = out.transpose(1, 2).reshape(b, t, -1)
        return self.out(out), p


class Block(nn.Module):
    """A pre-norm block: self-attention, cross-attention (decoder only), the GELU feed-forward."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, cross: bool, eps: float) -> None:
        super().__init__()
        self.attn, self.attn_ln = Attention(d_model, n_heads), nn.LayerNorm(d_model, eps=eps)
        self.cross = Attention(d_model, n_heads) if cross else None
        self.cross_ln = nn.LayerNorm(d_model, eps=eps) if cross else None
        self.fc1, self.fc2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.mlp_ln = nn.LayerNorm(d_model, eps=eps)

    def forward(self, x: Tensor, cross_kv: tuple[Tensor, Tensor] | None = None, causal: bool = False,
                weights: bool = False) -> tuple[Tensor, Tensor | None, Tensor | None]:
        h, self_p = self.attn(self.attn_ln(x), causal=causal, weights=weights)
        x = x + h
        cross_p = None
        if self.cross is not None:
            h, cross_p = self.cross(self.cross_ln(x), kv=cross_kv, weights=weights)
            x = x + h
        x = x + self.fc2(F.gelu(self.fc1(self.mlp_ln(x))))
        return x, self_p, cross_p


@dataclass
class Encoded:
    """The encoder's output for one window and, when asked, its self-attention."""

    states: Tensor  # (B, S, D)
    attention: list[Tensor] = field(default_factory=list)  # per layer (B, H, S, S)


class Whisper(nn.Module):
    """Whisper's encoder-decoder; ``transcribe(audio)`` gives a ``SpeechResult``."""

    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        c = self.config = config
        self.conv1 = nn.Conv1d(c.n_mels, c.d_model, 3, padding=1)
        self.conv2 = nn.Conv1d(c.d_model, c.d_model, 3, stride=2, padding=1)
        self.register_buffer("enc_pos", sinusoids(c.n_audio_ctx, c.d_model))
        self.encoder = nn.ModuleList(Block(c.d_model, c.n_enc_heads, c.d_ff, False, c.ln_eps)
                                     for _ in range(c.n_enc_layers))
        self.enc_ln = nn.LayerNorm(c.d_model, eps=c.ln_eps)
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.dec_pos = nn.Parameter(torch.zeros(c.n_text_ctx, c.d_model))
        self.decoder = nn.ModuleList(Block(c.d_model, c.n_dec_heads, c.d_ff_dec, True, c.ln_eps)
                                     for _ in range(c.n_dec_layers))
        self.dec_ln = nn.LayerNorm(c.d_model, eps=c.ln_eps)
        self.tokenizer: Any = None  # a tokenizers.Tokenizer (the reader attaches it)
        self.filters: np.ndarray | None = None  # the mel filters (computed from the config when None)

    # -------------------------------------------------------------------------------------------- the two stacks
    def encode(self, mel: Tensor, weights: bool = False) -> Encoded:
        """(B, n_mels, F) log-mel frames -> the encoder states (B, F / 2, D) and, with ``weights``, every layer's
        self-attention."""
        if mel.ndim != 3 or mel.shape[1] != self.config.n_mels:
            raise ValueError(f"expected (batch, {self.config.n_mels} mel bins, frames), got {tuple(mel.shape)}")
        x = F.gelu(self.conv1(mel))
        x = F.gelu(self.conv2(x)).transpose(1, 2)  # (B, S, D)
        if x.shape[1] > self.config.n_audio_ctx:
            raise ValueError(f"{mel.shape[-1]} frames are more than the encoder's {self.config.n_audio_ctx} "
                             "positions hold")
        x = x + self.enc_pos[: x.shape[1]].to(x.dtype)
        maps = []
        for block in self.encoder:
            x, p, _ = block(x, weights=weights)
            if p is not None:
                maps.append(p)
        return Encoded(self.enc_ln(x), maps)

    def cross_kv(self, states: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Each decoder layer's cross-attention keys and values over the encoder states (computed once)."""
        return [block.cross.keys_values(states) for block in self.decoder]

    def decode(self, ids: Tensor, kv: list[tuple[Tensor, Tensor]], weights: bool = False
               ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """(B, T) ids -> logits (B, T, V), and with ``weights`` every layer's self- (B, H, T, T) and cross-attention
        (B, H, T, S)."""
        t = ids.shape[1]
        if t > self.config.n_text_ctx:
            raise ValueError(f"{t} tokens are more than the decoder's {self.config.n_text_ctx} positions")
        x = self.embed(ids) + self.dec_pos[:t]
        selfs, crosses = [], []
        for block, layer_kv in zip(self.decoder, kv, strict=True):
            x, sp, cp = block(x, cross_kv=layer_kv, causal=True, weights=weights)
            if weights:
                selfs.append(sp)
                crosses.append(cp)
        x = self.dec_ln(x)
        return x @ self.embed.weight.T, selfs, crosses

    # ------------------------------------------------------------------------------------------------- decoding
    def suppressed_logits(self, logits: Tensor, first: bool) -> Tensor:
        """(B, V) logits with Whisper's suppressed ids at −∞ (and the begin ids at the first step)."""
        logits = logits.clone()
        v = logits.shape[-1]
        ids = [i for i in self.config.suppress if 0 <= i < v]
        if first:
            ids += [i for i in self.config.suppress_begin if 0 <= i < v]
        if ids:
            logits[:, ids] = float("-inf")
        return logits

    def rules(self) -> Any:
        """The ids Whisper's decoding rules need (models/families/whisper_search.py)."""
        from models.families.whisper_search import Rules

        c = self.config
        return Rules(eot=c.eot_id, suppress=tuple(c.suppress), suppress_begin=tuple(c.suppress_begin),
                     no_timestamps=c.no_timestamps_id, n_text_ctx=c.n_text_ctx, n_audio_ctx=c.n_audio_ctx)

    def prompt_for(self, timestamps: bool, language: str | None = None, task: str = "transcribe"
                   ) -> tuple[int, ...]:
        """The decoder's prompt: the config's (<|startoftranscript|> [<|en|> <|transcribe|>] <|notimestamps|>), for a
        multilingual model with ``language``'s token and ``task``'s ("transcribe" or "translate": into English);
        with timestamps, less its <|notimestamps|>."""
        c = self.config
        p = tuple(c.prompt)
        if task not in ("transcribe", "translate"):
            raise ValueError(f"task {task!r}: transcribe or translate")
        if c.languages and len(p) >= 3:
            codes = dict(c.languages)
            if language is not None and language not in codes:
                raise ValueError(f"language {language!r} is not one of this model's {len(codes)}")
            lang = codes[language] if language is not None else p[1]
            task_id = c.translate_id if task == "translate" else p[2]
            if task_id is None:
                raise ValueError("this checkpoint has no <|translate|> token")
            p = (p[0], lang, task_id, *p[3:])
        elif language not in (None, "en") or task != "transcribe":
            raise ValueError("an English-only Whisper transcribes English only (no language or translate task)")
        if not timestamps:
            return p
        if self.config.no_timestamps_id is None:
            raise ValueError("this checkpoint has no <|notimestamps|> token, so no timestamp tokens")
        return tuple(i for i in p if i != self.config.no_timestamps_id)

    @torch.no_grad()
    def detect_language(self, states: Tensor) -> tuple[str, dict[str, float]]:
        """The likeliest language of one window's encoder states (1, S, D), as openai-whisper's ``detect_language``:
        the logits after <|startoftranscript|> over the language tokens alone; (its code, every code's probability)."""
        c = self.config
        if not c.languages:
            raise ValueError("an English-only Whisper has no language tokens")
        logits = self.decode(torch.tensor([[c.prompt[0]]], device=states.device), self.cross_kv(states))[0][0, 0]
        ids = torch.tensor([i for _, i in c.languages], device=states.device)
        probs = logits.float()[ids].softmax(-1)
        return c.languages[int(probs.argmax())][0], {code: float(p) for (code, _), p in zip(c.languages, probs)}

    @torch.no_grad()
    def decode_mel(self, mel: Tensor, options: Any = None, states: Tensor | None = None,
                   language: str | None = None, task: str = "transcribe") -> Any:
        """Decode one window's mel (1, n_mels, F) with Whisper's rules (greedy, or beam search; with or without
        timestamps): a ``models.families.whisper_search.Decoded``. ``states``: the encoder's output for that mel,
        when already computed."""
        from models.families.whisper_search import SearchOptions, search

        options = options or SearchOptions()
        kv = self.cross_kv(self.encode(mel).states if states is None else states)

        def logits_fn(ids: Tensor) -> Tensor:
            b = ids.shape[0]
            expanded = [(k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1)) for k, v in kv]
            return self.decode(ids, expanded)[0]

        prompt = self.prompt_for(options.timestamps, language, task)
        return search(logits_fn, prompt, self.rules(), options, self.config.no_speech_id, 0, mel.device)

    @torch.no_grad()
    def greedy(self, mel: Tensor, max_new_tokens: int | None = None) -> tuple[list[int], float]:
        """Greedy decoding of one window's mel (1, n_mels, F): (the prompt and the new ids, end-of-text included
        when produced; the no-speech probability, or nan when the config has no such token)."""
        from models.families.whisper_search import SearchOptions

        out = self.decode_mel(mel, SearchOptions(sample_len=max_new_tokens))
        return out.ids, out.no_speech_prob

    def text_of(self, ids: list[int]) -> str:
        """The text of the generated ids (specials and timestamps, everything from end-of-text up, left out)."""
        words = [i for i in ids[len(self.config.prompt):] if i < self.config.eot_id]
        return self.tokenizer.decode(words).strip() if self.tokenizer is not None else " ".join(map(str, words))

    def token_labels(self, ids: list[int]) -> list[str]:
        """Each id as the model saw it: its token text with GPT-2's byte markers turned back into spaces."""
        if self.tokenizer is None:
            return [str(i) for i in ids]
        out = []
        for i in ids:
            if i >= self.config.eot_id:
                out.append(self.tokenizer.id_to_token(i) or f"<|{(i - self.config.prompt[-1] - 1) * 0.02:.2f}|>")
            else:
                out.append(self.tokenizer.decode([i]))
        return out

    @torch.no_grad()
    def transcribe(self, audio: np.ndarray, max_new_tokens: int | None = None, encoder_attention: bool = False,
                   beam_size: int | None = None, patience: float | None = None,
                   length_penalty: float | None = None, timestamps: bool = False, language: str | None = None,
                   task: str = "transcribe") -> SpeechResult:
        """Transcribe up to 30 s of 16 kHz mono float audio (``models.inputs.audio`` reads files into that): the
        text, the ids, and the attention of the chosen sequence (decoder self-, cross-; the encoder's on ask, over
        the frames that hold audio, the padding's share in one last key column).

        Greedy unless ``beam_size`` (then ``patience`` and ``length_penalty`` as openai-whisper reads them); with
        ``timestamps`` the decoder also writes <|t|> tokens, read into ``segments``. The attention is then that of
        the text tokens decoded again after <|notimestamps|>, as openai-whisper's word timing reads it. A multilingual
        model hears ``language`` (None: the one it detects) and transcribes, or translates into English."""
        from models.families.whisper_search import SearchOptions, segments

        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if audio.size > N_SAMPLES:
            raise ValueError(f"{audio.size / SAMPLE_RATE:.1f} s of audio is more than Whisper's {CHUNK_S} s window")
        mel_np = log_mel(audio, self.config.n_mels, self.filters)
        p = next(self.parameters())
        mel = torch.from_numpy(mel_np)[None].to(p.device, p.dtype)
        options = SearchOptions(beam_size=beam_size, patience=patience, length_penalty=length_penalty,
                                timestamps=timestamps, sample_len=max_new_tokens)
        plain = None if encoder_attention else self.encode(mel)  # one encoder pass when no weights are asked
        self.prompt_for(False, language, task)  # refuses what the model cannot do, before any decoding
        if self.config.languages and language is None:
            language, _ = self.detect_language(plain.states if plain is not None else self.encode(mel).states)
        out = self.decode_mel(mel, options, None if plain is None else plain.states, language, task)
        decoded, no_speech = out.ids, out.no_speech_prob
        spans: list[tuple[float, float, str]] = []
        ids = decoded
        if timestamps:
            c = self.config
            tb = c.no_timestamps_id + 1
            new = decoded[len(self.prompt_for(True, language, task)):]
            for start, end, toks in segments(new, tb, c.eot_id, audio.size / SAMPLE_RATE,
                                             CHUNK_S / c.n_audio_ctx):
                spans.append((start, end, self.tokenizer.decode(toks).strip() if self.tokenizer is not None
                              else " ".join(map(str, toks))))
            ids = list(self.prompt_for(False, language, task)) + [t for t in new if t < c.eot_id] + [c.eot_id]
        enc = plain if plain is not None else self.encode(mel, weights=True)
        _, selfs, crosses = self.decode(torch.tensor([ids], device=p.device), self.cross_kv(enc.states),
                                        weights=True)
        labels = self.token_labels(ids)
        frames = [f"{i * FRAME_S:.2f}s" for i in range(enc.states.shape[1])]
        attention = {"decoder": AttentionMap(torch.stack(selfs)[:, 0].float().cpu().numpy(), labels, labels),
                     "cross": AttentionMap(torch.stack(crosses)[:, 0].float().cpu().numpy(), labels, frames)}
        if encoder_attention:
            n = max(1, min(len(frames), int(math.ceil(audio.size / SAMPLE_RATE / FRAME_S))))
            full = torch.stack(enc.attention)[:, 0].float()  # (L, H, S, S)
            kept = full[:, :, :n, :n]
            rest = full[:, :, :n, n:].sum(-1, keepdim=True)  # the padding's share of each row
            attention["encoder"] = AttentionMap(torch.cat([kept, rest], -1).cpu().numpy(), frames[:n],
                                                [*frames[:n], "padding"])
        search = "greedy" if beam_size is None else (
            f"beam {beam_size}" + (f", patience {patience:g}" if patience is not None else "")
            + (f", length penalty {length_penalty:g}" if length_penalty is not None else ""))
        return SpeechResult(text=self.text_of(ids), ids=ids, tokens=labels, prompt_len=len(self.config.prompt),
                            attention=attention, mel=mel_np, duration_s=audio.size / SAMPLE_RATE,
                            no_speech_prob=no_speech, alignment_heads=tuple(self.config.alignment_heads),
                            decoded=decoded, segments=spans, search=search + (", timestamps" if timestamps else ""),
                            avg_logprob=out.avg_logprob, language=language or "en", task=task)
