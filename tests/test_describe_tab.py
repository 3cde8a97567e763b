"""The Image + text tab's handlers on the shipped vlm-fashion (issue 75, item 6): a shorter answer after a longer one
leaves the replay slider a range the page's old value fits (the server refused it: "Value 21 is greater than maximum
value 3"), an upload is previewed at once, and an image unlike the training scenes gets a notice, as the Vision tab's
unusual-input check gives one."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from models.inputs import images
from tabs import describe as tab


def _slider(blocks, label: str):
    return next(b for b in blocks.blocks.values() if getattr(b, "label", None) == label)


def test_a_shorter_answer_after_a_longer_one_keeps_the_old_word_valid() -> None:
    import gradio as gr

    with gr.Blocks() as demo:
        tab.build()
    step = _slider(demo, "generated word (replay: move to see each in turn)")
    scene = tab.EXAMPLE_SCENES[8]
    long = tab.describe(scene, tab.MODEL, "describe the image .", 24)
    n_long = tab._new(long[13]["result"])
    short = tab.describe(scene, tab.MODEL, "what is at the top left ?", 24)
    state, update = short[13], short[14]
    n_short = tab._new(state["result"])
    assert n_short < n_long  # the case: the page still holds the longer answer's last word
    maximum = update.get("maximum", step.maximum)  # what the server checks the next event's value against
    assert step.preprocess(n_long) == n_long and n_long <= maximum  # not refused
    assert 1 <= update["value"] <= n_short and f"{n_short} new tokens" in update["info"]
    # a redraw at that old value draws the answer's last word and sets the slider back to it
    out = tab.redraw_token(state, n_long, "while choosing it", 3, 3, "mean")
    assert out[-1]["value"] == n_short
    word = state["result"].tokens[state["result"].prompt_len + n_short - 1]
    assert f"**[{tab._esc(word)}]**" in out[0]
    assert tab.redraw_token(state, 1, "while choosing it", 3, 3, "mean")[-1] == gr.update()  # in range: untouched


def test_an_upload_is_previewed_and_a_broken_one_said(tmp_path) -> None:
    path = tmp_path / "photo.png"
    pixels = np.random.default_rng(0).integers(0, 256, (90, 120, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    shown, said = tab.preview_image(str(path))
    assert shown["visible"] is True
    np.testing.assert_array_equal(shown["value"], pixels)  # small enough: the pixels as given
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    shown, said = tab.preview_image(str(bad))
    assert shown["visible"] is False and said
    assert tab.preview_image(None)[0]["visible"] is False


def test_the_bounds_are_the_scene_constructions() -> None:
    from train import scenes

    assert images.SCENE_ITEM == scenes.MAX_SIZE and images.SCENE_ITEMS == scenes.MAX_ITEMS
    assert scenes.CANVAS == 64


@pytest.mark.parametrize("kind", ["scene", "noise", "one item"])
def test_an_image_unlike_the_scenes_gets_a_notice(kind, tmp_path) -> None:
    if kind == "scene":
        paths = tab.EXAMPLE_SCENES
    else:
        path = tmp_path / f"{kind}.png"
        if kind == "noise":  # a photo's texture: no black canvas
            Image.fromarray(np.random.default_rng(1).integers(0, 256, (120, 160), dtype=np.uint8)).save(path)
        else:  # one Fashion-MNIST item uploaded alone: fitted to the canvas, three times a scene item's side
            Image.open(sorted((tab.SCENES.parent / "fashion").glob("*.png"))[5]).save(path)
        paths = [str(path)]
    for path in paths:
        out = tab.describe(path, tab.MODEL, "describe the image .", 4)
        warned = "looks unlike the scenes the model was trained on" in out[1]
        assert warned == (kind != "scene"), (path, out[1])
        seen = out[13]["result"].image
        direct = images.scene_notice(seen)
        assert bool(direct) == warned  # the tab says what the check on the pixels the model saw says


def test_the_check_measures_what_it_says() -> None:
    canvas = np.zeros((64, 64), np.uint8)
    canvas[2:30, 2:30] = 200
    canvas[34:62, 34:62] = 200  # two items of 28, apart: a scene
    assert images.scene_notice(canvas) == ""
    canvas[30:34, 2:62] = 200  # joined by a bar: one stretch of ink 60 pixels across
    said = images.scene_notice(canvas)
    assert "60 pixels across" in said
    full = np.full((64, 64), 90, np.uint8)
    assert "100% of it is not black" in images.scene_notice(full)
