"""Every input limit of the app, in one place (imported without torch, so the UI can show them).

The models trained from scratch have positions up to 128 (docs/ARCHITECTURE.md §4); MiniLM was trained
with 512 but is capped at 256 here to keep figures light. A language model takes its own context (its positions),
capped by ATLAS_MAX_TOKENS (default 32,768): gpt-tiny stops at its 256 positions, SmolLM2 at its 8,192, Gemma 3 at
32,768. Over LONG_TOKENS tokens a model the long-context store computes (models/decoding/ondevice.py) keeps each
layer's queries, keys and row normalisers, never the T × T map, and every figure is recomputed exactly from them;
a model it does not compute (Mamba's implicit attention, a vision-language model) keeps the whole map and stops at
MAX_FULL_TOKENS. Attention over more than LONG_TOKENS tokens is drawn from pooled tiles with zoom (viz.attention).
Images are refused above MAX_IMAGE_PIXELS before they are fully decoded (Pillow's decompression-bomb guard is set to
the same number).
"""

import os


def _max_tokens(default: int = 32_768) -> int:
    """ATLAS_MAX_TOKENS: the server's cap on a language model's context (prompt + new tokens), at least 64."""
    raw = os.environ.get("ATLAS_MAX_TOKENS", "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 64:
        raise ValueError(f"ATLAS_MAX_TOKENS must be a whole number of tokens, at least 64; got {raw[:40]!r}")
    return int(raw)


MAX_TOKENS_SCRATCH = 128  # subword tokens, specials included, for the models trained from scratch
MAX_TOKENS_MINILM = 256  # subword tokens for the pretrained MiniLM encoder
MAX_LM_TOKENS = _max_tokens()  # prompt + generated tokens of a language model (fewer where its positions are)
# a model whose whole attention map is kept (one the long-context store does not compute): 12 × 12 heads over 2,048
# tokens are 1.2 GB of float16 already
MAX_FULL_TOKENS = min(2048, MAX_LM_TOKENS)
LONG_TOKENS = 512  # above this many tokens attention figures are pooled tiles (zoom for full resolution)
MAX_TILE_CELLS = 512  # a pooled attention map has at most this many cells a side
MAX_PATCH_TOKENS = 256  # activation patching (a forward per head or per position) reads at most this many tokens
MAX_NEW_TOKENS = 64  # tokens one generation may add
MAX_TEXT_CHARS = 200_000  # characters kept from a pasted text before tokenising (then the token cap applies): a
# 32,768-token document is about 130,000 characters of English
MAX_IMAGE_PIXELS = 40_000_000  # width × height of an uploaded image (e.g. 8000 × 5000)
MAX_UPLOAD_MB = 20  # size of one uploaded file
MAX_AUDIO_S = 30.0  # seconds of speech heard at once (Whisper's window; longer recordings are refused)
MIN_AUDIO_S = 0.1  # shorter than this is no speech at all
AUDIO_TYPES = (".wav", ".flac", ".mp3")  # uploads the Listen tab takes (FLAC and MP3 through soundfile)
IMAGE_TYPES = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".tif", ".tiff")


def describe() -> str:
    """The limits as a short Markdown list for the UI and the README."""
    return (
        f"- Text: up to {MAX_TEXT_CHARS:,} characters are read; models trained from scratch see the first "
        f"{MAX_TOKENS_SCRATCH} subword tokens, MiniLM the first {MAX_TOKENS_MINILM} (longer input is truncated "
        "with a notice).\n"
        f"- Generation: prompt and continuation together up to {MAX_LM_TOKENS:,} tokens or the model's positions, "
        f"whichever is fewer (gpt-tiny: 256; Mamba and the image + text models: {MAX_FULL_TOKENS:,}), at most "
        f"{MAX_NEW_TOKENS} new ones; a longer prompt keeps its last tokens, with a notice. Over {LONG_TOKENS} "
        "tokens the server keeps each layer's queries and keys, never the whole map, refuses in words a text whose "
        "store would not fit in its memory, and computes every figure exactly from them. Attention over more than "
        f"{LONG_TOKENS} tokens is drawn pooled to at most "
        f"{MAX_TILE_CELLS} × {MAX_TILE_CELLS} cells (zoom shows any block at full resolution) and downloaded as "
        f"compressed float16; activation patching reads at most {MAX_PATCH_TOKENS} tokens.\n"
        f"- Images: {', '.join(t.lstrip('.').upper() for t in IMAGE_TYPES)}; up to {MAX_UPLOAD_MB} MB per file and "
        f"{MAX_IMAGE_PIXELS / 1e6:.0f} megapixels. Animated images use their first frame.\n"
        "- Uploads stay in Gradio's temporary folder; nothing you send is stored elsewhere."
    )
