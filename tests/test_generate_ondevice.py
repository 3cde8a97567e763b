"""The Generate tab drawing from attention kept on the model's device (issue 52, "8 B on one GPU": long prompts move
only what a figure needs). ATLAS_ONDEVICE=1 forces on the CPU the path a CUDA model takes by default: every
figure, replayed step, zoom, head view, model view, comparison and .npz of the same generation must equal the one
drawn from the whole array (ATLAS_ONDEVICE=0), for a short input and for one of 2,048 tokens; the kept state holds
a fraction of the array; the device-side results of all sessions stay under their cap."""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

import gradio as gr
import numpy as np
import pytest

from models import limits
from serving import catalogue, results, store


@pytest.fixture(scope="module")
def tab(tiny_checkpoints: Path, tmp_path_factory):
    """The Generate tab over gpt-tiny and a tiny random LLaMA with 4,096 positions (bench/_long_model.py)."""
    from bench._long_model import long_llama_folder

    root = tmp_path_factory.mktemp("ondevice") / "checkpoints"
    shutil.copytree(tiny_checkpoints / "gpt-tiny", root / "gpt-tiny")
    long_llama_folder(root / "long-llama", layers=2, heads=4, d_model=64, positions=4096, vocab=2000)
    mp = pytest.MonkeyPatch()
    mp.setattr(catalogue, "CHECKPOINTS", root)
    mp.setattr(store, "MODELS", store.ModelStore())
    from tabs import generate

    yield generate
    mp.undo()


def run(tab, monkeypatch, mode: str, prompt: str, model: str, new: int = 4) -> tuple:
    monkeypatch.setenv("ATLAS_ONDEVICE", mode)
    return tab.generate(prompt, new, model, progress=None)


def long_prompt() -> str:
    from bench._long_model import long_prompt as text

    return text(12_000)


CASES = {"short": ("A man in a blue shirt is riding a bicycle down the", "gpt-tiny"), "long": (None, "long-llama")}


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tab) -> tuple[dict, dict]:
    """The same generation kept both ways: (whole array, on the device)."""
    prompt, model = CASES[request.param]
    prompt = prompt or long_prompt()
    mp = pytest.MonkeyPatch()
    try:
        dense, device = (run(tab, mp, mode, prompt, model)[6] for mode in ("0", "1"))
    finally:
        mp.undo()
    return dense, device


def typed(value):
    """A built figure's typed array ({"bdata": base64, "dtype", "shape"}) as numpy; anything else as it is."""
    if isinstance(value, dict) and "bdata" in value:
        a = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        return a.reshape([int(n) for n in str(value.get("shape", a.size)).split(",")])
    return value


def same_head_view(a, b, share: float) -> None:
    """Two head views with the same lines, but for at most ``share`` of them: a weight at the threshold passes on
    one side only when one side's weights are the whole array's float16 (a long input)."""
    from bench.kept import lines

    la, lb = lines(a), lines(b)
    assert la and len(la ^ lb) <= share * len(la), (len(la), len(lb), len(la ^ lb))
    if not share:
        same_figure(a, b)


def same_figure(a, b, atol: float = 1e-5) -> None:
    """Two figures alike: the same layout and traces, their numbers within ``atol`` (the model view's whole
    percents within one, on at most a few cells: a weight at a half percent may round either way)."""
    ja, jb = a.to_plotly_json(), b.to_plotly_json()
    assert ja["layout"] == jb["layout"]
    assert len(ja["data"]) == len(jb["data"])
    for ta, tb in zip(ja["data"], jb["data"]):
        assert set(ta) == set(tb)
        for key in ta:
            va, vb = typed(ta[key]), typed(tb[key])
            if isinstance(va, np.ndarray) and va.dtype.kind in "fiu":
                va, vb = np.asarray(va, np.float64), np.asarray(vb, np.float64)
                assert va.shape == vb.shape
                if key == "z" and ta.get("zmax") == 100:  # the model view: uint8 percents
                    assert np.abs(va - vb).max() <= 1 and (va != vb).mean() < 1e-3
                else:
                    np.testing.assert_allclose(va, vb, atol=atol, equal_nan=True)
            elif isinstance(va, list) and np.asarray(va, dtype=object).size and \
                    all(isinstance(x, float) for x in np.asarray(va, dtype=object).ravel()):
                np.testing.assert_allclose(np.array(va, float), np.array(vb, float), atol=atol)
            elif isinstance(va, float):
                assert va == pytest.approx(vb, abs=atol), key
            else:
                assert va == vb, key


def test_every_view_equals_the_whole_arrays(tab, pair) -> None:
    dense, device = pair
    amap = device["result"].attention["decoder"]
    assert hasattr(amap, "attention") and not hasattr(dense["result"].attention["decoder"], "attention")
    assert device["result"].ids == dense["result"].ids
    np.testing.assert_allclose(device["result"].surprisal, dense["result"].surprisal, atol=1e-4)
    t = len(dense["result"].tokens)
    long = t > limits.LONG_TOKENS  # the whole array is float16 there: weights within 1e-3
    n = len(dense["result"].steps)
    for step in (0, n - 1):
        for view in ("heatmap", "head view", "model view"):
            for head in (["mean", "max", "2"] if view == "heatmap" else ["mean", "1"] if view == "head view" else
                         ["mean"]):
                for pooling in (("max", "mean") if view == "heatmap" and long else ("max",)):
                    a = tab.draw_generation(dense, step, 1, head, view, pooling)[2]
                    b = tab.draw_generation(device, step, 1, head, view, pooling)[2]
                    if view == "head view":
                        same_head_view(a, b, share=0.02 if long else 0)
                    else:
                        same_figure(a, b, atol=1e-3 if long else 1e-5)
    # zoom: a block at full resolution, and one over POOL_ABOVE a side (pooled on the device)
    blocks = [(3, min(40, t - 1), 0, min(30, t - 1))]
    if long:
        blocks.append((100, t - 1, 50, t - 1))
    for q0, q1, k0, k1 in blocks:
        for head in ("max", "3"):
            same_figure(tab.zoom(dense, 0, head, q0, q1, k0, k1, "mean"), tab.zoom(device, 0, head, q0, q1, k0, k1,
                                                                                     "mean"),
                        atol=1e-3 if long else 1e-5)


def test_the_device_path_keeps_a_fraction_and_makes_arrays_on_request(tab, pair) -> None:
    dense, device = pair
    whole = dense["result"].attention["decoder"].weights
    amap = device["result"].attention["decoder"]
    if len(dense["result"].tokens) > limits.LONG_TOKENS:  # q, k and lse against (L, H, T, T) float16
        assert amap.nbytes < whole.nbytes / 20
    path = tab.attention_npz(device)
    with np.load(path) as got:
        np.testing.assert_allclose(got["attention"].astype(np.float32), whole.astype(np.float32), atol=1e-3)
        from models.inputs.tokenizer import raw_piece  # the .npz: the pieces as the tokenizer spells them, and read

        assert list(got["tokens"]) == [raw_piece(t) for t in dense["result"].tokens]
        readable = got["tokens_readable"] if "tokens_readable" in got.files else got["tokens"]  # byte-level only
        assert list(readable) == dense["result"].tokens


def test_the_answer_says_where_the_attention_is_and_writes_no_arrays_unasked(tab, monkeypatch) -> None:
    out = run(tab, monkeypatch, "1", "Two dogs play in the snow .", "gpt-tiny")
    notice, state, npz = out[1], out[6], out[7]
    assert "The attention stays on `cpu`" in notice and npz is None
    assert results.DEVICE_RESULTS.total() >= state["result"].attention["decoder"].nbytes


def test_compare_draws_two_device_maps_without_their_arrays(tab, monkeypatch) -> None:
    from tabs.sections import compare as compare_section

    a = run(tab, monkeypatch, "1", "Two dogs play in the snow .", "gpt-tiny")[6]
    b = run(tab, monkeypatch, "1", "Two dogs play in the water .", "gpt-tiny")[6]
    da = run(tab, monkeypatch, "0", "Two dogs play in the snow .", "gpt-tiny")[6]
    db = run(tab, monkeypatch, "0", "Two dogs play in the water .", "gpt-tiny")[6]
    for view in ("heatmap", "head view"):
        got = compare_section.compared(tab.compare_view, a, b, 2, "mean", view)
        want = compare_section.compared(tab.compare_view, da, db, 2, "mean", view)
        assert got[0] == want[0]
        for x, y in zip(got[1:], want[1:]):
            same_figure(x, y)


def test_device_results_of_all_sessions_stay_under_their_cap(tab, monkeypatch) -> None:
    first = run(tab, monkeypatch, "1", "Two dogs play in the snow .", "gpt-tiny")[6]
    size = first["result"].attention["decoder"].nbytes
    monkeypatch.setattr(results, "DEVICE_RESULTS", results.LongResults(1.5 * size / 2**20))
    states = [run(tab, monkeypatch, "1", "Two dogs play in the snow .", "gpt-tiny")[6] for _ in range(2)]
    assert states[0] == {} and states[1]["result"]
    with pytest.raises(gr.Error, match="Generate a continuation first"):
        tab.zoom(states[0], 0, "mean", 0, 5, 0, 5)
    # the next run of a session lets its own device-side result go first
    again = tab.generate("Two dogs", 2, "gpt-tiny", "greedy", 1.0, 0, 1.0, 0, -1, "mean", "heatmap", "max",
                         states[1], progress=None)[6]
    assert states[1] == {} and again["result"]


def test_bad_settings_and_oversized_arrays_are_refused_in_words(tab, monkeypatch) -> None:
    from models.decoding import ondevice

    monkeypatch.setenv("ATLAS_ONDEVICE", "sometimes")
    with pytest.raises(gr.Error, match="ATLAS_ONDEVICE must be auto, 1 or 0"):
        tab.generate("Two dogs", 2, "gpt-tiny", progress=None)
    state = run(tab, monkeypatch, "1", "Two dogs play in the snow .", "gpt-tiny")[6]
    monkeypatch.setattr(ondevice, "ARRAYS_MAX_MB", 0)
    with pytest.raises(gr.Error, match="over its limit of 0 MB"):
        tab.attention_npz(state)
    # the figures still draw: they never need the whole array
    assert tab.draw_generation(state, 0, 0, "mean", "model view")[2] is not None


def test_auto_keeps_cpu_models_on_the_whole_array_path(tab, monkeypatch) -> None:
    monkeypatch.delenv("ATLAS_ONDEVICE", raising=False)
    state = tab.generate("Two dogs", 2, "gpt-tiny", progress=None)[6]
    assert not hasattr(state["result"].attention["decoder"], "attention")
