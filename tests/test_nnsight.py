"""The nnsight backend (models/io/nnsight_backend.py, issue 73) with ``remote=False`` on random-weight folders written
by transformers (tests/parity_folders.py): GPT-2, LLaMA (RoPE, grouped-query heads), Qwen2 (q/k/v biases) and
Mistral (a sliding window shorter than the input). Every view the trace gives back equals the app's own model path on
the same folder (``models.load``): the long-context store's tiles, statistics and rows (models/decoding/ondevice.py),
the full map (``GPT.forward`` with weights), head roles (``models.analysis.head_roles`` on ``GPT.token_losses``), the
logit lens (``GPT.logit_lens``) and the next-token logits. ``remote="local"``: nnsight serialises the request as for
NDIF and rebuilds it with the project's modules hidden (no server, no mock of NDIF's API): the same numbers. What
the trace does not compute is refused in words."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import models.decoding.ondevice as od
from models import analysis
from models.io import nnsight_backend as nb

CASES = ("gpt2", "llama", "qwen2", "mistral")


@pytest.fixture(scope="module")
def opened(hf_folders):
    cache = {}

    def get(name: str):
        if name not in cache:
            built = hf_folders.get(name)
            cache[name] = (built.model, nb.open_model(built.path))
        return cache[name]
    return get


def _ids(n: int, seed: int, vocab: int = 290) -> list[int]:
    return [int(i) for i in torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed))]


@pytest.mark.parametrize("name", CASES)
def test_every_view_equals_the_apps_own_path(opened, name: str) -> None:
    ours, lm = opened(name)
    assert lm.attn_implementation == "sdpa"  # as NDIF's servers load: the weights are not an output
    ids = _ids(41, 1)
    if name == "mistral":  # its window (4) is shorter than the input: the band is what is checked
        assert set(nb.layout(lm.config).windows) == {4}
    # chunks of 5 rows (a multiple of the tile's 3 rows is rounded to): every chunk boundary crossed
    last, heads = ours.config.n_layers - 1, ours.config.n_heads
    rows = [(0, 0, 0), (1, heads - 1, 40), (last, heads // 2, 17)]
    v = nb.trace_views(lm, ids, cells=14, rows=rows, maps=[1], chunk_bytes=4 * 6 * 41 * 5)
    assert v.where == "here (remote=False)"
    att, logits = od.prefill(ours, ids)
    with torch.no_grad():
        full = np.stack([w[0].float().numpy() for w in ours(torch.tensor([ids]), need_weights=True).attention])
    np.testing.assert_allclose(att.full(), full, atol=1e-6)  # the store is the model's own map
    for layer in range(ours.config.n_layers):
        for how in ("max", "mean"):
            want, edges, _ = att.tiles(layer, None, 14, how)
            np.testing.assert_allclose(v.tiles[how][layer], want, atol=1e-6)
            np.testing.assert_array_equal(v.edges, edges)
    for stat in od.STATS:
        np.testing.assert_allclose(v.stats[stat], att.stats[stat], atol=2e-5, err_msg=stat)
    for layer, head, query in rows:
        np.testing.assert_allclose(v.rows[(layer, head, query)], full[layer, head, query], atol=1e-6)
    np.testing.assert_allclose(v.maps[1], full[1], atol=1e-6)
    np.testing.assert_allclose(v.last_logits, logits.numpy(), atol=1e-4)
    lens = ours.logit_lens(ids)
    assert [[ours.piece(i) for i in row] for row in v.lens["top"]] == lens.top_tokens
    np.testing.assert_allclose(v.lens["top_p"], lens.top_probs, atol=1e-6)
    np.testing.assert_allclose(v.lens["next_p"], lens.target_probs, atol=1e-6)
    # the bytes that came back are those of the reductions, counted in the dtypes they travelled in
    n_layers, heads, t = full.shape[:3]
    sent = (2 * sum(x.size for x in v.tiles["max"].values()) * 4 + n_layers * 4 * heads * 8 + len(rows) * t * 4
            + full[1].size * 4 + v.lens["top"].size * 8 + 2 * v.lens["top_p"].size * 4 + 8 + (t - 1) * 4
            + v.last_logits.size * 4)
    assert v.bytes_back == sent == nb.reply_bytes(nb.layout(lm.config), t, 14, rows=len(rows), maps=1)["total"]
    assert v.full_bytes == full.size * 2  # what did not travel: every weight in float16


@pytest.mark.parametrize("name", ("gpt2", "llama"))
def test_head_roles_and_losses_equal_the_apps(opened, name: str) -> None:
    ours, lm = opened(name)
    n = 7
    ids = ours.repeated_tokens(n, seed=3)
    loss, weights = ours.token_losses(ids)
    want = analysis.head_roles(weights, n)
    v = nb.trace_views(lm, ids, roles_n=n, lens_last=0)
    assert v.bytes_back == nb.reply_bytes(nb.layout(lm.config), len(ids), roles_n=n, lens_last=0)["total"]
    for role in analysis.HEAD_ROLES:
        np.testing.assert_allclose(v.roles[role], want[role], atol=1e-6, err_msg=role)
    np.testing.assert_allclose(v.losses, loss, atol=1e-5)
    assert v.lens == {}


def test_the_lens_over_the_last_positions(opened) -> None:
    ours, lm = opened("qwen2")
    ids = _ids(30, 4)
    v = nb.trace_views(lm, ids, lens_last=9)
    lens = ours.logit_lens(ids, last=9)
    np.testing.assert_allclose(v.lens["top_p"], lens.top_probs, atol=1e-6)
    np.testing.assert_allclose(v.lens["next_p"], lens.target_probs, atol=1e-6)
    assert v.lens["top"].shape == (ours.config.n_layers, 9)


def test_the_request_serialised_as_for_ndif_gives_the_same_numbers(opened) -> None:
    """nnsight's remote="local": the request is built as RemoteBackend builds it and rebuilt with the project's own
    modules hidden, so the trace code must travel by value (nnsight.register): what an NDIF server would run."""
    _, lm = opened("llama")
    ids = _ids(23, 5)
    here = nb.trace_views(lm, ids, cells=6, rows=[(1, 4, 22)])
    shipped = nb.trace_views(lm, ids, cells=6, rows=[(1, 4, 22)], remote="local")
    assert shipped.where.startswith("here (remote='local'")
    for how in ("max", "mean"):
        for layer in range(2):
            np.testing.assert_array_equal(shipped.tiles[how][layer], here.tiles[how][layer])
    np.testing.assert_array_equal(shipped.rows[(1, 4, 22)], here.rows[(1, 4, 22)])
    for stat in nb.STATS:
        np.testing.assert_array_equal(shipped.stats[stat], here.stats[stat])


def test_what_the_trace_does_not_compute_is_refused(hf_folders, tmp_path) -> None:
    """A setting that changes the scores is refused in words, not computed wrongly (the app's own path answers)."""
    gpt2 = json.loads((hf_folders.get("gpt2").path / "config.json").read_text())
    nb.layout(gpt2)
    with pytest.raises(nb.Refused, match="scale_attn_by_inverse_layer_idx"):
        nb.layout({**gpt2, "scale_attn_by_inverse_layer_idx": True})
    with pytest.raises(nb.Refused, match="gemma2"):
        nb.layout({"model_type": "gemma2"})
    llama = json.loads((hf_folders.get("llama").path / "config.json").read_text())
    with pytest.raises(nb.Refused, match="partial rotary"):
        nb.layout({**llama, "partial_rotary_factor": 0.5})
    with pytest.raises(nb.Refused, match="attn_logit_softcapping"):
        nb.layout({**llama, "attn_logit_softcapping": 30.0})
    # a pickle is never read: a folder with pytorch_model.bin and no safetensors is refused before loading
    bad = tmp_path / "pickled"
    bad.mkdir()
    shutil.copy(hf_folders.get("gpt2").path / "config.json", bad / "config.json")
    (bad / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(nb.Refused, match="pickle"):
        nb.open_model(bad)
    with pytest.raises(nb.Refused, match="remote=False"):
        nb.open_model(hf_folders.get("gpt2").path, remote=True)


def test_tiles_of_the_layers_asked_alone(opened) -> None:
    ours, lm = opened("qwen2")
    ids = _ids(33, 6)
    v = nb.trace_views(lm, ids, tile_layers=[1], lens_last=0)
    att, _ = od.prefill(ours, ids)
    assert sorted(v.tiles["max"]) == [1]
    np.testing.assert_allclose(v.tiles["mean"][1], att.tiles(1, None, nb.POOL_CELLS, "mean")[0], atol=1e-6)
    np.testing.assert_allclose(v.stats["entropy"], att.stats["entropy"], atol=2e-5)  # statistics of every layer still
    lay = nb.layout(lm.config)
    assert v.bytes_back == nb.reply_bytes(lay, 33, tile_layers=1, lens_last=0)["total"]
    assert v.bytes_back < nb.reply_bytes(lay, 33, lens_last=0)["total"]


def test_bad_requests_are_refused(opened) -> None:
    _, lm = opened("gpt2")
    with pytest.raises(nb.Refused, match="token ids"):
        nb.trace_views(lm, [1, 2, 10_000])
    with pytest.raises(nb.Refused, match="row"):
        nb.trace_views(lm, [1, 2, 3], rows=[(0, 9, 1)])
    with pytest.raises(nb.Refused, match="head roles"):
        nb.trace_views(lm, [1, 2, 3], roles_n=5)
    with pytest.raises(nb.Refused, match="layer 7"):
        nb.trace_views(lm, [1, 2, 3], tile_layers=[7])
    with pytest.raises(nb.Refused, match="no tokens"):
        nb.trace_views(lm, [])


def test_the_window_is_read_per_layer() -> None:
    cfg = {"model_type": "qwen2", "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
           "hidden_size": 32, "vocab_size": 50, "sliding_window": 6,
           "layer_types": ["full_attention", "sliding_attention", "sliding_attention"]}
    assert nb.layout(cfg).windows == (0, 6, 6)
    with pytest.raises(nb.Refused, match="layer_types"):
        nb.layout({k: v for k, v in cfg.items() if k != "layer_types"})


def test_the_bench_runs_quick() -> None:
    """bench/remote.py --quick: the computed shapes and one measured run (keys and exactness; never times)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "bench/remote.py", "--quick", "--shape-lengths", "1024"], cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    big = out["computed"]["llama-3-405b@1024"]
    assert big["full_attention_fp16_bytes"] == 126 * 128 * 1024 * 1024 * 2
    assert big["reply_one_layer_tiles_bytes"] < big["reply_bytes"] < big["full_attention_fp16_bytes"]
    (run,) = out["measured"].values()
    assert run["predicted_matches"] is True and run["max_diff"] < 1e-6
    assert {"app_s", "trace_s", "shipped_s", "trace_ratio", "bytes_back"} <= set(run)


def test_generates_section_answers_through_its_api_action(hf_folders, monkeypatch) -> None:
    """ATLAS_NNSIGHT names a folder: Generate's section traces it (remote=False) and draws what came back; every number
    drawn is the app's own path's on the same folder. Unset: a message that says how to configure it."""
    import gradio as gr

    from serving import traced
    from tabs.common import Error
    from tabs.sections import traced as section

    built = hf_folders.get("llama")
    with gr.Blocks() as demo:
        section.section(gr.Textbox())
    action = next(f for f in demo.fns.values() if f.api_name == "nnsight_views")
    monkeypatch.delenv("ATLAS_NNSIGHT", raising=False)
    with pytest.raises(Error, match="ATLAS_NNSIGHT"):
        action.fn("the cat sat", 0, 0, "sink share")
    monkeypatch.setenv("ATLAS_NNSIGHT", str(built.path))
    text = "the cat sat on the mat, and a dog ran in the park"
    note, tiles, grid, lens = action.fn(text, 1, 4, "entropy (bits)")
    views, tokens, _ = traced.trace(text, 1, 4)
    assert note.startswith(f"**{built.path.name}** ran here") and str(built.path.parent) not in note
    assert "here (remote=False)" in note and f"over {len(tokens)} tokens" in note and "came back" in note
    att, _ = od.prefill(built.model, views.ids)
    shown = np.asarray(tiles.data[0].z, dtype=np.float32)  # the short input's tiles are its weights
    np.testing.assert_allclose(shown, att.fused(1, 4), atol=1e-6)
    np.testing.assert_allclose(np.asarray(grid.data[0].z, dtype=np.float32), att.stats["entropy"] / np.log(2),
                               atol=2e-5)
    want = built.model.logit_lens(views.ids)
    np.testing.assert_allclose(np.asarray(lens.data[0].z, dtype=np.float32), want.target_probs, atol=1e-6)
    with pytest.raises(Error, match="not in this 2-layer"):
        action.fn(text, 5, 0, "sink share")
    with pytest.raises(Error, match="Unknown statistic"):
        action.fn(text, 0, 0, "beauty")


def test_an_answer_from_ndif_is_read_by_the_restricted_loader(opened) -> None:
    """What NDIF sends back: the result blob (torch.save of the saved values) and a pickled COMPLETED frame (nnsight's
    own ResponseModel.pickle, protocol 4). Both load through ``restricted_load``; a planted answer that names a
    function (os.system through __reduce__) is refused before anything runs."""
    import io
    import os

    from nnsight.schema.response import ResponseModel, Status

    from models.io import nnsight_trace as nt

    _, lm = opened("gpt2")
    x = torch.tensor([[3, 4, 5, 6, 7, 8]])
    lay = nb.layout(lm.config)
    with torch.no_grad(), lm.trace(x):
        saved = nnsight_save(nt.views(lm, lay.as_dict(), x, nb.plan(lay, 6, 4, rows=[(1, 2, 5)])))
    blob = io.BytesIO()
    torch.save({"out": saved}, blob)
    back = nb.restricted_load(blob.getvalue())["out"]
    np.testing.assert_array_equal(back["layers"][1]["max"].numpy(), saved["layers"][1]["max"].numpy())
    assert back["layers"][1]["rows"].keys() == {"2:5"}
    frame = ResponseModel(id="job", status=Status.COMPLETED, description="done", data=blob.getvalue()).pickle()
    backend = nb.safe_remote_backend(lm, host="http://localhost:1", model_key="gpt2-test")
    response = backend.parse(frame)
    assert response.status == Status.COMPLETED and response.data == blob.getvalue()

    class Hostile:
        def __reduce__(self):
            return (os.system, ("echo owned",))

    bad = io.BytesIO()
    torch.save({"out": Hostile()}, bad, pickle_protocol=4)
    with pytest.raises(nb.UnsafeAnswer, match="system"):
        nb.restricted_load(bad.getvalue())
    import pickle

    legacy = pickle.dumps(Hostile(), protocol=2)  # a bare pickle (torch.load's legacy path reads its header first)
    with pytest.raises(nb.UnsafeAnswer, match="system"):
        nb.restricted_load(legacy)
    with pytest.raises(nb.UnsafeAnswer):
        backend.parse(bad.getvalue())
    import zstandard

    def sent(raw: bytes) -> bytes:  # as the server stages a result: zstd-compressed when the client asked for it
        return zstandard.ZstdCompressor().compress(raw) if backend.compress else raw

    np.testing.assert_array_equal(backend.finalize(sent(blob.getvalue()))["out"]["layers"][0]["mean"].numpy(),
                                  saved["layers"][0]["mean"].numpy())
    assert backend.received == len(sent(blob.getvalue()))
    with pytest.raises(nb.UnsafeAnswer):
        backend.finalize(sent(bad.getvalue()))


def nnsight_save(value):
    import nnsight

    return nnsight.save(value)
