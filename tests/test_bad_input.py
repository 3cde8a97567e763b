"""Bad input end to end through the app's handlers: a readable message or a normal answer, never a crash."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from serving import catalogue
from tabs import common
from tabs.classify import TASKS, classify
from tabs.translate import translate
from tabs.vision import classify_image


@pytest.fixture(autouse=True)
def tiny_app(tiny_checkpoints: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width × height pixels, with almost no pixel data (a decompression bomb)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def _encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _valid_png() -> bytes:
    return _encode(Image.new("RGB", (64, 48), (200, 30, 30)), "PNG")


BROKEN = {
    "zero-byte.png": (b"", "empty"),
    "truncated.png": (_valid_png()[:60], "truncated or corrupt"),
    "not-an-image.png": (b"%PDF-1.4 this is not an image at all" * 10, "not an image"),
    "bomb-20000x20000.png": (_png_header_only(20_000, 20_000), "too large"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
@pytest.mark.parametrize("model", ["vit-fashion", "swin-fashion"])
def test_broken_images_get_a_clear_message(name: str, model: str, tmp_path: Path) -> None:
    data, message = BROKEN[name]
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(gr.Error, match=message):
        classify_image(str(path), model)


def _gif() -> bytes:
    frames = [Image.new("P", (40, 40), i) for i in (10, 200)]
    return _encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)


ODD = {
    "cmyk.jpg": lambda: _encode(Image.new("CMYK", (50, 40), (0, 200, 200, 0)), "JPEG"),
    "16bit.png": lambda: _encode(Image.fromarray((np.arange(48 * 64).reshape(48, 64) * 20).astype(np.uint16)), "PNG"),
    "rgba.png": lambda: _encode(Image.new("RGBA", (30, 60), (0, 0, 0, 0)), "PNG"),
    "palette.png": lambda: _encode(
        Image.new("RGB", (40, 40), (10, 90, 200)).convert("P", palette=Image.ADAPTIVE), "PNG"),
    "animated.gif": _gif,
    "one-pixel.png": lambda: _encode(Image.new("L", (1, 1), 255), "PNG"),
    "grey.png": lambda: _encode(Image.new("L", (300, 200), 30), "PNG"),
}


@pytest.mark.parametrize("name", sorted(ODD))
def test_unusual_but_valid_images_are_classified(name: str, tmp_path: Path) -> None:
    path = tmp_path / name
    path.write_bytes(ODD[name]())
    probs_fig, overlay, *_rest = classify_image(str(path), "vit-fashion")
    seen = _rest[3]
    assert seen.ndim == 2 and seen.shape[0] == seen.shape[1]  # the grey 28×28 input, enlarged for clicking
    assert overlay is not None and len(probs_fig.data[0].y) == 5


def test_no_image_is_refused_politely() -> None:
    with pytest.raises(gr.Error, match="upload an image"):
        classify_image(None)


TRICKY = [
    "👩‍👩‍👧‍👦 family 🏳️‍🌈 flags",  # ZWJ sequences
    "مرحبا بالعالم هذا نص",  # right-to-left
    "a\u200bb\u200cc\u200dd\ufeffe",  # zero-width characters
    "bell\x07 null\x00 escape\x1b[31m red",  # control characters
    "日本語 and English und Deutsch ελληνικά",  # mixed scripts
    "<img src=x onerror=alert(1)> <script>alert(1)</script>",
    "word " * 10_000,  # 10,000 words
    "x" * 1_000_000,  # a 1 MB paste
]


@pytest.mark.parametrize("text", TRICKY, ids=range(len(TRICKY)))
def test_tricky_text_through_every_text_model(text: str) -> None:
    verdict, _probs, html, *_ = classify(text)
    assert "<script>" not in html and "<img" not in html  # shown as text, never markup
    translation = translate(text, 1)
    assert isinstance(translation[0], str)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=200))
def test_any_unicode_gives_a_result_or_the_documented_message(text: str) -> None:
    for task in TASKS:
        try:
            _verdict, _probs, html, attn, *_ = classify(text, task)
        except gr.Error as err:
            assert "type some text" in str(err) and not text.strip()
            continue
        assert attn is not None and "<script" not in html.lower()


def test_bad_input_writes_nothing_outside_gradio_temp_folder(tmp_path: Path, monkeypatch) -> None:
    """Handlers write only their .npz downloads, and only under Gradio's temporary folder."""
    import tempfile

    root = common.ROOT
    system_tmp = Path(tempfile.gettempdir())

    def snapshot() -> set[Path]:
        found = {p for p in root.rglob("*") if ".git" not in p.parts and "__pycache__" not in p.parts
                 and ".pytest_cache" not in p.parts and "shots" not in p.parts}
        return found | {p for p in system_tmp.iterdir() if p.name != "gradio" and not p.name.startswith("pytest")}

    before = snapshot()
    for name, (data, _message) in BROKEN.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(gr.Error):
            classify_image(str(path), "vit-fashion")
    for text in TRICKY[:6]:
        classify(text)
    created = snapshot() - before
    assert {p for p in created if not p.is_relative_to(tmp_path)} == set()
    assert all(Path(p).is_relative_to(common.DOWNLOADS.parent) for p in [classify("ok")[-3]])


def test_an_unknown_classify_model_or_task_is_refused_by_name() -> None:
    """tabs.classify.checkpoint_name names each known pair's checkpoint and refuses anything else in words (it
    used to turn any unknown model or task into sst2, whose answer then came back as if asked for)."""
    from tabs.classify import CHECKPOINTS, TEXT_MODELS, checkpoint_name

    assert {checkpoint_name(task, model) for task in TASKS for model in TEXT_MODELS} == set(CHECKPOINTS)
    assert checkpoint_name("AG News topic", "MiniLM (pretrained, fine-tuned)") == "minilm-agnews"
    assert checkpoint_name("SST-2 sentiment", "trained from scratch") == "sst2"
    with pytest.raises(gr.Error, match="Unknown model 'gpt-tiny'"):
        checkpoint_name("SST-2 sentiment", "gpt-tiny")
    with pytest.raises(gr.Error, match="Unknown task 'IMDB'"):
        checkpoint_name("IMDB", "trained from scratch")
    with pytest.raises(gr.Error, match="Unknown task"):
        classify("a fine film", "imdb", next(iter(TEXT_MODELS)))


def test_one_checker_for_a_layer_head_or_position() -> None:
    """tabs.common.index / head_index: what every handler uses for a layer, head or position from the UI, the API or
    a link: empty is the last (or the given default), −k counts from the end, anything else is refused in words."""
    from tabs.common import head_index, index

    assert index(None, 4, "layer") == index("", 4, "layer") == index(-1, 4, "layer") == index(3.0, 4, "layer") == 3
    assert index(0, 4, "layer") == 0 and index(-4, 4, "layer") == 0 and index("", 9, "query", default=2) == 2
    for bad, message in ((4, "layer 4 is outside 0 … 3"), (-5, "layer -5 is outside"), ("1.5", "whole number"),
                         ("x", "whole number"), (float("nan"), "whole number")):
        with pytest.raises(gr.Error, match=message):
            index(bad, 4, "layer")
    assert head_index("mean", 4) == "mean" and head_index("", 4) == "mean" and head_index("max", 4) == "max"
    assert head_index("2", 4) == 2 and head_index(-1, 4) == 3
    with pytest.raises(gr.Error, match="head 9 is outside"):
        head_index("9", 4)


def test_redraws_bring_a_stale_slider_inside_through_the_same_checker() -> None:
    """A redraw from the app's own slider (``fit``) may still carry the previous model's range (layer 11 of GPT-2
    while gpt-tiny's 4-layer answer is drawn): the value is brought inside, never refused or out of bounds, and
    anything that is not a whole number is still refused in words."""
    from models.outputs import AttentionMap
    from tabs.common import attention_figure, head_index, index

    assert index(11, 4, "layer", fit=True) == 3 and index(-9, 4, "layer", fit=True) == 0
    assert head_index(7, 2, fit=True) == 1 and head_index("max", 2, fit=True) == "max"
    with pytest.raises(gr.Error, match="whole number"):
        index("x", 4, "layer", fit=True)
    rng = np.random.default_rng(0)
    weights = rng.dirichlet(np.ones(3), size=(4, 2, 3)).astype(np.float32)  # (L, H, T, T)
    amap = AttentionMap(weights, ["a", "b", "c"], ["a", "b", "c"])
    fig = attention_figure(amap, "encoder", 11, 7, "heatmap")  # stale layer and head: the last of each
    drawn = np.asarray(fig.data[0].z, dtype=np.float32)
    np.testing.assert_allclose(drawn, weights[3, 1], atol=1e-6)
