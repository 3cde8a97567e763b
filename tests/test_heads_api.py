"""The Heads tab's endpoints through gradio_client against a launched server (the tiny test checkpoints: gpt-tiny
has 2 layers of 4 heads there, mamba-tiny 2 layers of one implicit map)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.test_api import _figure_data


@pytest.fixture(scope="module")
def client(app_url: str):
    from gradio_client import Client

    return Client(app_url, verbose=False)


def test_heads_grid_finder_and_card(client) -> None:
    grid, ranked, by_layer, notice, metric, layer, head = client.predict("gpt-tiny", "previous", None,
                                                                         api_name="/heads")
    z = np.array(_figure_data(grid)[0]["z"], dtype=float)
    assert z.shape == (2, 4) and np.all((z >= 0) & (z <= 1))
    assert "2 layers × 4 heads" in notice and "252 sentences" in notice
    assert _value(metric) == "previous" and "induction" in notice
    assert layer["maximum"] == 1 and head["maximum"] == 3  # the card's sliders narrowed to the model
    bars = _figure_data(ranked)[0]
    np.testing.assert_allclose(np.sort(np.asarray(bars["x"], float))[::-1], np.asarray(bars["x"], float))
    found = client.predict("gpt-tiny", "previous", api_name="/head_finder")
    data = found["heads"]
    values = [float(r[2]) for r in data]
    assert found["model"] == "gpt-tiny" and len(data) == 8 and values == sorted(values, reverse=True)
    best_layer, best_head = int(data[0][0]), int(data[0][1])
    assert z[best_layer, best_head] == pytest.approx(values[0], abs=1e-4)  # the grid and the finder agree
    card, example, offsets = client.predict("gpt-tiny", "previous", best_layer, best_head, "1", None,
                                            api_name="/head_card")
    assert f"layer {best_layer} · head {best_head}" in card and "rank" in card and "What it writes" in card
    assert "| **previous token** |" in card and "1 of 8" in card
    heat = np.array(_figure_data(example)[0]["z"], dtype=float)
    np.testing.assert_allclose(np.nansum(heat, 1), 1, atol=2e-3)  # one head's rows, each summing to 1
    profile = _figure_data(offsets)[0]
    assert list(profile["x"])[:2] == [0, 1]  # a decoder's offsets start at itself


def test_head_card_of_induction_draws_repeated_tokens(client) -> None:
    card, example, _ = client.predict("gpt-tiny", "induction", 1, 0, "1", None, api_name="/head_card")
    assert "repeated random tokens" in card
    assert "repeated random tokens" in _title(example)


def _value(update):
    return update["value"] if isinstance(update, dict) else update


def _title(fig) -> str:
    import json

    plot = fig["plot"] if isinstance(fig, dict) and "plot" in fig else fig
    layout = json.loads(plot)["layout"] if isinstance(plot, str) else plot["layout"]
    return layout["title"]["text"]


def test_heads_of_every_modality(client) -> None:
    for model, metric, shape in (("sst2", "first", (2, 4)), ("translator-en-de", "diagonality", (2, 4)),
                                 ("vit-fashion", "pixel_distance", (2, 4)), ("mamba-tiny", "previous", (2, 1))):
        grid, *_, metric_out, _, _ = client.predict(model, metric, None, api_name="/heads")
        assert _value(metric_out) == metric
        assert np.array(_figure_data(grid)[0]["z"], dtype=float).shape == shape, model


def test_compare_two_models(client) -> None:
    fig, note = client.predict("gpt-tiny", "mamba-tiny", "previous", api_name="/heads_compare")
    traces = _figure_data(fig)
    assert [np.array(t["z"], dtype=float).shape for t in traces] == [(2, 4), (2, 1)]  # shapes differ: no difference
    assert "gpt-tiny best" in note and "mamba-tiny best" in note
    fig, _ = client.predict("sst2", "agnews", "first", api_name="/heads_compare")
    assert len(_figure_data(fig)) == 3  # the same shape: B − A as well


def test_own_corpus_and_refusals(client, tmp_path: Path) -> None:
    from gradio_client import handle_file

    good = tmp_path / "mine.txt"
    good.write_text("The first line.\n\nThe second line, longer than the first.\nA third.\n", encoding="utf-8")
    grid, *_rest = client.predict("gpt-tiny", "previous", handle_file(str(good)), api_name="/heads")
    assert "your corpus: 3 lines" in _rest[2]
    bad = tmp_path / "bad.txt"
    bad.write_text("fine\nbad \x01 line\n", encoding="utf-8")
    with pytest.raises(Exception, match="Line 2 holds a control character"):
        client.predict("gpt-tiny", "previous", handle_file(str(bad)), api_name="/heads")
    with pytest.raises(Exception, match="no-such-model is not in the list of choices"):  # Gradio checks the name
        client.predict("no-such-model", "previous", None, api_name="/heads")
    with pytest.raises(Exception, match="is not in the list of choices"):  # and the metric
        client.predict("gpt-tiny", "no-such-metric", None, api_name="/heads")
    with pytest.raises(Exception, match="has no metric 'cls'"):
        client.predict("gpt-tiny", "cls", api_name="/head_finder")
    found = client.predict("gpt-tiny", "previous", "one line\nand another", api_name="/head_finder")
    assert len(found["heads"]) == 8
    with pytest.raises(Exception, match="greater than maximum value 3|outside 0 … 3"):
        client.predict("gpt-tiny", "previous", 0, 9, "1", None, api_name="/head_card")


def test_retrieval_heads_through_the_api(client) -> None:
    """/retrieval_heads: gpt-tiny's three needles (its short context reads the short needle), the grid's shape and a
    ranking of its heads; a model the store does not compute is refused in words."""
    note, grid, ranked = client.predict("gpt-tiny", 256, api_name="/retrieval_heads")
    assert "gpt-tiny" in note and "depth 0.1" in note and "depth 0.9" in note and "The password is" in note
    assert np.array(_figure_data(grid)[0]["z"], dtype=float).shape == (2, 4)
    assert len(_figure_data(ranked)[0]["y"]) == 8
    with pytest.raises(Exception, match="long-context store"):
        client.predict("mamba-tiny", 256, api_name="/retrieval_heads")
