"""Every input limit of the app, in one place (imported without torch, so the UI can show them).

The models trained from scratch have positions up to 128 (docs/ARCHITECTURE.md §4); MiniLM was trained
with 512 but is capped at 256 here to keep figures light. Images are refused above MAX_IMAGE_PIXELS before
they are fully decoded (Pillow's decompression-bomb guard is set to the same number).
"""

MAX_TOKENS_SCRATCH = 128  # subword tokens, specials included, for the models trained from scratch
MAX_TOKENS_MINILM = 256  # subword tokens for the pretrained MiniLM encoder
MAX_LM_TOKENS = 256  # prompt + generated tokens of a language model (fewer where its positions are fewer)
MAX_NEW_TOKENS = 64  # tokens one generation may add
MAX_TEXT_CHARS = 20_000  # characters kept from a pasted text before tokenising (then the token cap applies)
MAX_IMAGE_PIXELS = 40_000_000  # width × height of an uploaded image (e.g. 8000 × 5000)
MAX_UPLOAD_MB = 20  # size of one uploaded file
IMAGE_TYPES = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".tif", ".tiff")


def describe() -> str:
    """The limits as a short Markdown list for the UI and the README."""
    return (
        f"- Text: up to {MAX_TEXT_CHARS:,} characters are read; models trained from scratch see the first "
        f"{MAX_TOKENS_SCRATCH} subword tokens, MiniLM the first {MAX_TOKENS_MINILM} (longer input is truncated "
        "with a notice).\n"
        f"- Generation: prompt and continuation together up to {MAX_LM_TOKENS} tokens, at most {MAX_NEW_TOKENS} "
        "new ones; a longer prompt keeps its last tokens, with a notice.\n"
        f"- Images: {', '.join(t.lstrip('.').upper() for t in IMAGE_TYPES)}; up to {MAX_UPLOAD_MB} MB per file and "
        f"{MAX_IMAGE_PIXELS / 1e6:.0f} megapixels. Animated images use their first frame.\n"
        "- Uploads stay in Gradio's temporary folder; nothing you send is stored elsewhere."
    )
