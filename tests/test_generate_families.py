"""The Generate tab with the later families (folders written by transformers, placed in checkpoints/): Mamba shows
generation, its implicit attention, the logit lens and compare, and refuses the head views in words; Gemma 3's
local layers are named; Mixtral's experts view; a gated Hub model without a token says so."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from serving import catalogue, store
from tabs.common import Error
from tests.tiny_families import decoder_folder, mamba_folder


@pytest.fixture(scope="module")
def root(tiny_checkpoints: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ckpt")
    shutil.copytree(tiny_checkpoints / "gpt-tiny", root / "gpt-tiny")
    mamba_folder(root / "my-mamba")
    decoder_folder(root / "my-gemma", "gemma3_text")
    decoder_folder(root / "my-mixtral", "mixtral")
    return root


@pytest.fixture()
def tab(root: Path, monkeypatch):
    from tabs import generate

    monkeypatch.setattr(catalogue, "CHECKPOINTS", root)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    return generate


def test_mamba_in_generate(tab) -> None:
    """Generation with the implicit attention as the heatmap (its title says so), the logit lens, the .npz (no
    pre-softmax scores), compare; head roles, ablation, why, sink ablation and patching refuse in words."""
    from tabs.sections import patching, why

    assert "my-mamba" in tab.decoder_models()
    text, notice, _html, _cand, attn, lens, state, npz, *_ = tab.generate("the cat sat", 5, "my-mamba")
    assert "implicit attention" in notice and "do not apply" in notice
    assert state["implicit"] and state["result"].attention["decoder"].weights.shape[:2] == (3, 1)
    assert "Implicit attention" in attn.layout.title.text and lens is not None
    with np.load(npz) as arrays:
        assert "scores" not in arrays and arrays["attention"].shape[1] == 1
    view = tab.compare_view(state)
    assert view["amap"].weights.shape[1] == 1
    for call in (lambda: tab.head_roles("my-mamba", 5, 0), lambda: tab.ablate_head_fn(state, 0, 0, 0),
                 lambda: why.why(tab._model("my-mamba"), state["result"].ids, state["result"].tokens, 0, 0, 2, 1),
                 lambda: why.ablate_sink(tab.sequence, state, 0, 0),
                 lambda: patching.patch_repeated("my-mamba", "heads", 5, 0)):
        with pytest.raises(Error, match="no attention heads|does not apply"):
            call()


def test_gemma_local_layers_are_marked(tab) -> None:
    """The notice names the local (sliding-window) layers; the heatmap's title says when the layer shown is local."""
    _text, notice, _html, _cand, attn, *_rest = tab.generate("the cat sat on the mat", 8, "my-gemma")
    state = _rest[1]
    assert "Local attention on layers 0, 2" in notice and "window of 4 tokens" in notice
    assert state["local"] == {0: 4, 2: 4}
    assert "layer 2 is local" in attn.layout.title.text  # Generate shows the last layer first: a local one here
    _h, _c, fig0 = tab.draw_generation(state, 0, 0, "mean", "heatmap")
    assert "layer 0 is local: sliding window of 4 tokens" in fig0.layout.title.text
    _h, _c, fig1 = tab.draw_generation(state, 0, 1, "mean", "heatmap")
    assert "local" not in fig1.layout.title.text


def test_mixtral_experts_view(tab) -> None:
    """The experts view names each token's chosen experts and their weights per layer; a dense model is refused."""
    from models.families.moe import expert_routes

    *_, state = tab.generate("the cat sat", 4, "my-mixtral")[:7]
    fig = tab.experts_view(state)
    routes = expert_routes(tab._model("my-mixtral"), state["result"].ids)
    z = np.array(fig.data[0].z, dtype=np.float32)
    np.testing.assert_allclose(z, routes.weights[..., 0], atol=1e-6)
    assert fig.data[0].text[1][0] == "<br>".join(f"E{routes.experts[1, 0, j]} {routes.weights[1, 0, j]:.2f}"
                                                 for j in range(2))
    gpt_state = tab.generate("the cat sat", 2, "gpt-tiny")[6]
    with pytest.raises(Error, match="no experts"):
        tab.experts_view(gpt_state)


def test_gated_model_without_a_token_says_so(tab, monkeypatch) -> None:
    import huggingface_hub

    from models.io import hub

    monkeypatch.setattr(hub, "cached", lambda repo, revision=None: None)
    monkeypatch.setattr(hub, "offline", lambda: False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    assert "Gated" in tab.model_notice("google/gemma-3-270m") and "HF_TOKEN" in tab.model_notice("google/gemma-3-270m")
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_x")
    assert "downloaded from the Hugging Face Hub" in tab.model_notice("google/gemma-3-270m")
    assert "downloaded from the Hugging Face Hub" in tab.model_notice("state-spaces/mamba-130m-hf")


@pytest.mark.parametrize("name", ["my-gemma", "my-mixtral"])
def test_head_views_work_for_attention_families(tab, name: str) -> None:
    """Why (the split sums to the score), sink ablation, patching and head roles run on Gemma 3 (sandwich norms,
    local layers) and Mixtral (experts): the head views work for every attention family."""
    from tabs.sections import patching, why

    state = tab.generate("the cat sat on the mat and the dog", 4, name)[6]
    net = tab._model(name)
    ids, tokens = state["result"].ids, state["result"].tokens
    _summary, _fig, table = why.why(net, ids, tokens, 1, 2, len(ids) - 1, len(ids) - 2)
    assert sum(c["value"] for c in table["components"]) == pytest.approx(table["score"], abs=1e-5)
    words = why.ablate_sink(tab.sequence, state, 1, 0)
    assert "forbidden its first token" in words and "nats" in words
    from models.inspect.patching import sink_ablation

    r = sink_ablation(net, ids, 1, 0)  # layer 1: global in both (Gemma's local layers are 0 and 2)
    assert r.loss_after != pytest.approx(r.loss_before, abs=1e-7)
    note, fig, _kept, *_shown = patching.patch_repeated(name, "heads", 5, 0)
    restored = np.array(fig.data[0].z, dtype=float)
    assert restored.shape == (3, 6) and np.isfinite(restored).all()
    roles = tab.head_roles(name, 6, 0)[0]
    assert [np.array(t.z).shape for t in roles.data] == [(3, 6)] * 4
