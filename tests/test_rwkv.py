"""RWKV-4 (models/families/rwkv.py): its implicit attention against the WKV recurrence it is read from and against
transformers' own WKV on the random-weight folder whose parity with RwkvForCausalLM (logits, every block's hidden
state, greedy ids) is tests/test_parity.py's; the reader's refusals; and the model configured as a folder in the
Generate tab, the Heads tab and lesson 9."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from models.families.rwkv import Rwkv, heatmap, implicit_attention, wkv_scan

IDS = [5, 17, 33, 2, 40, 41, 7, 9, 11, 12, 13, 14, 5, 17]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def built(hf_folders):
    """tests/parity_folders.py's "rwkv" folder: transformers' RwkvForCausalLM and ours read from it."""
    return hf_folders.get("rwkv")


@pytest.fixture(scope="module")
def pair(built):
    return built.ref.model, built.model


def test_implicit_attention_reproduces_the_wkv(pair) -> None:
    """α[c] @ v[:, c] equals the recurrence's WKV output within 1e-5, every layer, channel and position; every row is a
    causal distribution (zero above the diagonal, never negative, sums to 1); one channel alone is that
    channel's slice, and chunks that do not divide the channels change nothing."""
    _, ours = pair
    with torch.no_grad():
        out = ours(torch.tensor([IDS]), keep_trace=True)
        assert len(out.traces) == 5
        for layer, trace in enumerate(out.traces):
            mix = ours.blocks[layer].attention
            alpha = implicit_attention(trace, mix.time_decay, mix.time_first, chunk=7)  # (A, T, T)
            assert alpha.shape == (32, len(IDS), len(IDS))
            torch.testing.assert_close(torch.einsum("ctj,jc->tc", alpha, trace.v), trace.wkv, atol=1e-5, rtol=0)
            assert alpha.triu(1).abs().max() == 0 and alpha.min() >= 0
            torch.testing.assert_close(alpha.sum(-1), torch.ones(32, len(IDS)), atol=1e-6, rtol=0)
            torch.testing.assert_close(implicit_attention(trace, mix.time_decay, mix.time_first), alpha, atol=1e-7,
                                       rtol=0)
            one = implicit_attention(trace, mix.time_decay, mix.time_first, channel=9)
            torch.testing.assert_close(one[0], alpha[9], atol=1e-7, rtol=0)
            assert trace.wkv.std() > 0.1  # a real signal, not constants agreeing


def test_implicit_attention_matches_transformers_wkv(pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' own WKV (its ``rwkv_linear_attention``, recorded as its model runs): our keys and values equal its
    within 1e-4, and the attention matrix built from *its* keys and decay times *its* values equals *its* output within
    1e-5, every layer; our WKV equals its output within 1e-4."""
    from transformers.models.rwkv import modeling_rwkv

    hf, ours = pair
    seen = []
    original = modeling_rwkv.rwkv_linear_attention

    def record(time_decay, time_first, key, value, state=None, return_state=False):
        out, after = original(time_decay, time_first, key, value, state=state, return_state=return_state)
        seen.append((time_decay.detach(), time_first.detach(), key[0].detach(), value[0].detach(), out[0].detach()))
        return out, after

    monkeypatch.setattr(modeling_rwkv, "rwkv_linear_attention", record)
    with torch.no_grad():
        hf(torch.tensor([IDS]), use_cache=False)
        traces = ours(torch.tensor([IDS]), keep_trace=True).traces
    assert len(seen) == len(traces) == 5
    for (decay, first, key, value, wkv), trace in zip(seen, traces, strict=True):
        torch.testing.assert_close(trace.k, key, atol=1e-4, rtol=0)
        torch.testing.assert_close(trace.v, value, atol=1e-4, rtol=0)
        theirs = type(trace)(key, value, trace.r, wkv)
        alpha = implicit_attention(theirs, decay, first)
        torch.testing.assert_close(torch.einsum("ctj,jc->tc", alpha, value), wkv, atol=1e-5, rtol=0)
        torch.testing.assert_close(trace.wkv, wkv, atol=1e-4, rtol=0)


def test_the_scan_continues_its_state() -> None:
    """The prompt read at once equals it read in two pieces through the state (generation's path)."""
    torch.manual_seed(0)
    decay, first = torch.randn(6), torch.randn(6)
    k, v = torch.randn(1, 9, 6) * 3, torch.randn(1, 9, 6)
    whole, _ = wkv_scan(decay, first, k, v)
    a, state = wkv_scan(decay, first, k[:, :4], v[:, :4])
    b, _ = wkv_scan(decay, first, k[:, 4:], v[:, 4:], state)
    torch.testing.assert_close(torch.cat([a, b], 1), whole, atol=1e-6, rtol=0)


def test_the_rescaling_is_read(pair, built) -> None:
    """The folder's rescale_every (2) is what makes our hidden states transformers': the same weights read with the
    rescaling off give a stream 4× as large after block 4, and logits off by more than the parity's 1e-4."""
    import models

    hf, ours = pair
    plain = models.load(str(built.path))
    for block in plain.blocks:
        block.scale = 1.0
    plain.config.rescale_every = 0
    with torch.no_grad():
        ref = hf(torch.tensor([IDS]), output_hidden_states=True)
        got, off = ours(torch.tensor([IDS]), keep_hidden=True), plain(torch.tensor([IDS]), keep_hidden=True)
    torch.testing.assert_close(got.hidden[-1], ref.hidden_states[-2], atol=1e-4, rtol=0)
    ratio = (off.hidden[-1].norm() / got.hidden[-1].norm()).item()
    assert ratio == pytest.approx(4.0, rel=0.02)  # not exactly: the LayerNorms' ε (1e-3) sees the scale
    assert (off.logits - ref.logits).abs().max() > 1e-3  # so an unscaled run is not transformers' model


def test_generation_and_its_maps(pair) -> None:
    """Greedy generation through the recurrent state is transformers' (and not one token repeated); Generate's maps
    are (L, 1, T, T): per layer α averaged over the channels, rows summing to 1, causal; one channel's map differs."""
    hf, ours = pair
    with torch.no_grad():
        want = hf.generate(torch.tensor([IDS]), max_new_tokens=10, min_new_tokens=10, do_sample=False,
                           pad_token_id=0)[0].tolist()
    result = ours.generate(IDS, max_new_tokens=10)
    assert result.ids == want and len(set(result.ids[len(IDS):])) > 1
    maps = result.attention["decoder"].weights
    t = len(result.ids)
    assert maps.shape == (5, 1, t, t)
    np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-5)
    assert np.abs(np.triu(maps[:, 0], 1)).max() == 0
    with torch.no_grad():
        trace = ours(torch.tensor([result.ids]), keep_trace=True).traces[3]
        want_map = heatmap(ours.alpha(trace, 3)).numpy()
    np.testing.assert_allclose(maps[3, 0], want_map, atol=1e-6)
    one = ours.implicit_attention(result.ids, channel=5)
    assert one.shape == maps.shape and not np.allclose(one, maps)
    with pytest.raises(ValueError, match="channel"):
        ours.implicit_attention(IDS, channel=32)
    lens = ours.logit_lens(IDS)  # the last layer's guess is the model's own
    assert lens.top_probs.shape == (5, len(IDS))
    with torch.no_grad():
        final = torch.softmax(ours(torch.tensor([IDS])).logits[0], -1).max(-1).values.numpy()
    np.testing.assert_allclose(lens.top_probs[-1], final, atol=1e-5)


def test_an_rwkv_is_a_decoder_without_heads(pair) -> None:
    """The Decoder interface but ``forward`` (as Mamba); head masks and head roles are refused in words; the context
    is capped at MAX_TOKENS with a notice."""
    from models.families.recurrent import MAX_TOKENS
    from models.interfaces import Decoder
    from tests.test_interfaces import mismatches

    _, ours = pair
    assert isinstance(ours, Decoder) and mismatches(Decoder, Rwkv) == ["forward"]
    with pytest.raises(ValueError, match="no attention heads"):
        ours.next_token_probs(IDS, head_mask=torch.ones(5, 1))
    with pytest.raises(ValueError, match="RWKV has no attention heads"):
        ours.head_role_scores(5)
    assert ours.context_limit() == min(96, MAX_TOKENS)
    ids, new, notice = ours.prepare_prompt(list(range(1, 200)), 5)
    assert len(ids) + new == ours.context_limit() and ids[-1] == 199 and "shortened" in notice


def test_the_reader_refuses_what_is_not_rwkv_4(built) -> None:
    """A tensor RWKV-4 does not have (RWKV-5's per-head bonus ``time_faaaa``), one missing, or a rescale_every that is
    not an integer: a CheckpointError that names it."""
    import json

    from safetensors.torch import load_file

    from models.io.checkpoint import CheckpointError
    from models.io.hf_rwkv import rwkv_from_state

    hf = json.loads((built.path / "config.json").read_text())
    state = load_file(str(built.path / "model.safetensors"))
    assert isinstance(rwkv_from_state(hf, state), Rwkv)
    planted = {**state, "rwkv.blocks.0.attention.time_faaaa": torch.zeros(4, 8)}
    with pytest.raises(CheckpointError, match="time_faaaa"):
        rwkv_from_state(hf, planted)
    missing = {k: v for k, v in state.items() if not k.endswith("blocks.2.attention.time_first")}
    with pytest.raises(CheckpointError, match="blocks.2.attention.time_first"):
        rwkv_from_state(hf, missing)
    with pytest.raises(CheckpointError, match="rescale_every"):
        rwkv_from_state({**hf, "rescale_every": "6"}, state)


# ------------------------------------------------------------------------------ configured, in the tabs
@pytest.fixture()
def configured(built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The folder configured as `--model DIR` / ATLAS_MODELS would (a fresh store, an atlas cache of its own)."""
    from serving import catalogue, store

    shutil.copytree(built.path, tmp_path / "my-rwkv")
    monkeypatch.setattr(catalogue, "CONFIGURED", {})
    monkeypatch.setattr(catalogue, "CONFIG_PROBLEMS", [])
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    monkeypatch.setenv("ATLAS_CACHE", str(tmp_path / "heads"))
    catalogue.configure([str(tmp_path / "my-rwkv")])
    assert catalogue.CONFIG_PROBLEMS == []
    return "my-rwkv"


def test_rwkv_in_generate(configured: str) -> None:
    """Generate offers it, draws its implicit attention (the title and notice say so), the logit lens and the .npz;
    the views built on heads refuse in RWKV's own words."""
    from tabs import generate as tab
    from tabs.common import Error

    assert configured in tab.decoder_models()
    assert tab.offered_for(configured) == {"heads": False, "experts": False}
    text, notice, _html, _cand, attn, lens, state, npz, *_ = tab.generate("the cat sat", 4, configured)
    assert "implicit attention" in notice and "WKV" in notice
    assert state["result"].attention["decoder"].weights.shape[:2] == (5, 1)
    assert "Implicit attention (RWKV" in attn.layout.title.text and lens is not None
    with np.load(npz) as arrays:
        assert "scores" not in arrays and arrays["attention"].shape[1] == 1
    for call in (lambda: tab.head_roles(configured, 5, 0), lambda: tab.ablate_head_fn(state, 0, 0, 0)):
        with pytest.raises(Error, match="RWKV has no attention heads"):
            call()


def test_rwkv_in_the_heads_tab(configured: str, tmp_path: Path) -> None:
    """The Heads tab scores its one map per layer over a corpus (the metrics a recurrence has, no position share),
    and its card draws an example's implicit attention, rows summing to 1, equal to the model's own map."""
    from models.inspect.atlas import example_map
    from serving import heads as atlas_store
    from tabs import heads
    from tabs.common import get_model

    assert configured in atlas_store.model_names()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat .\na dog ran in the park .\nthe cat saw the dog .\n", encoding="utf-8")
    *_figs, text, _metric, _layer, _head, info = heads.heads_grid(configured, "previous", str(corpus))
    assert info == {"layers": 5, "heads": 1, "model": configured}
    assert "RWKV" in text and "position share" not in text.split("Its metrics:")[1]
    net = get_model(configured)
    ex = example_map(net, "the cat saw the dog .", 2)
    assert ex.kind == "Implicit attention"
    ids = net.encode_prompt("the cat saw the dog .")[0]
    np.testing.assert_allclose(ex.weights, net.implicit_attention(ids)[2], atol=1e-6)
    np.testing.assert_allclose(ex.weights.sum(-1), 1.0, atol=1e-5)


def test_rwkv_in_lesson_9(configured: str) -> None:
    """Lesson 9 with "my-rwkv: …": the configured RWKV takes mamba-tiny's place on its own tokens, its numbers are its
    Generate map's (first-token share and thirds computed here from ``implicit_attention`` and gpt-tiny's softmax
    rows), the verdicts follow them, and step 3 draws mamba-tiny beside both. Without the prefix, mamba-tiny."""
    import json

    from tabs import lessons
    from tabs.common import get_model
    from tabs.course import mamba as l9

    sentence = "A man in a blue shirt is riding a bicycle down the street."
    inp = f"{configured}: {sentence}"
    assert l9.recurrent_choice(inp)[0] == configured and l9.recurrent_choice(sentence)[0] == l9.MAMBA
    assert l9.recurrent_choice(f"gpt-tiny: {sentence}")[0] == l9.MAMBA  # a Transformer is no recurrent model
    net, gpt = get_model(configured), get_model("gpt-tiny")
    rows = net.implicit_attention(net.encode_prompt(sentence)[0][: net.context_limit()])[:, 0].astype(np.float64)
    g_ids = gpt.encode_prompt(sentence)[0]
    g_rows = gpt.token_losses(g_ids)[1].astype(np.float64).mean(1)
    m, g = rows[:, 1:, 0].mean(), g_rows[:, 1:, 0].mean()
    q1 = lessons.question(9, 1, inp)
    assert f"{g:.1%} (gpt-tiny) against {m:.1%} ({configured})" in q1.fact and "WKV" in q1.fact
    assert q1.answer == l9._compare(g, m, [c for c in q1.choices if "gpt-tiny's" in c] +
                                    [c for c in q1.choices if configured in c] +
                                    [c for c in q1.choices if "about the same" in c])
    near, far = l9.thirds(rows.mean(0))
    q2 = lessons.question(9, 2, inp)
    assert f"nearest third {near:.2f} against farthest third {far:.2f}" in q2.fact
    q3 = lessons.question(9, 3, inp)
    verdict, figure, _ = lessons.lesson_answer_api(9, 3, q3.answer, inp)
    assert verdict.startswith("correct") and configured in q3.fact
    heatmaps = [t for t in json.loads(figure)["data"] if t["type"] == "heatmap"]
    assert len(heatmaps) == 3  # the RWKV, mamba-tiny and gpt-tiny
    assert "mamba-tiny" in lessons.question(9, 1, sentence).fact


def test_the_channel_mean_in_chunks(pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """The averaged map summed a few channels at a time (chunks of 5 that do not divide 32) equals the mean of every
    channel's α at once."""
    from models.families import rwkv

    _, ours = pair
    with torch.no_grad():
        trace = ours(torch.tensor([IDS]), keep_trace=True).traces[1]
        mix = ours.blocks[1].attention
        whole = heatmap(implicit_attention(trace, mix.time_decay, mix.time_first))
        monkeypatch.setattr(rwkv, "ALPHA_FLOATS", 5 * len(IDS) ** 2)
        torch.testing.assert_close(rwkv.mean_attention(trace, mix.time_decay, mix.time_first), whole, atol=1e-6,
                                   rtol=0)
