"""Qwen3-Next (models/families/qwen3_next.py): the Gated DeltaNet layers' implicit attention against their recurrence
and against transformers' own chunked delta rule, the softmax layers' maps against transformers' attention, each
layer's map side by side with its kind, the cached steps, the refusals, and a configured folder in the Generate tab.
The random-weight folders are tests/parity_folders.py's (their logits, hidden states and greedy ids against
transformers' Qwen3NextForCausalLM are tests/test_parity.py's)."""

from __future__ import annotations

import json
import shutil
import typing
from pathlib import Path

import numpy as np
import pytest
import torch

from models.families.qwen3_next import KIND_NAMES, Qwen3Next, heatmap, implicit_attention

IDS = [5, 17, 33, 2, 40, 41, 7, 9, 11, 12, 13, 14]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def pair(hf_folders):
    """transformers' Qwen3NextForCausalLM and ours, read from the parity folder."""
    built = hf_folders.get("qwen3_next")
    return built.ref.model, built.model


def _traces(model: Qwen3Next, ids: list[int]) -> list:
    with torch.no_grad():
        return [t for t in model(torch.tensor([ids]), keep_trace=True).traces if t is not None]


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_next-interval"])
def test_implicit_attention_reproduces_the_recurrence(hf_folders, name: str) -> None:
    """Σ_s A[t, s] v_s equals the recurrent delta rule's output o_t within 1e-5, every DeltaNet layer, value head,
    position and channel; A is causal (zero above the diagonal) and not trivially diagonal."""
    model = hf_folders.get(name).model
    traces = _traces(model, IDS)
    assert len(traces) == model.config.kinds.count("linear") > 0
    for tr in traces:
        a = implicit_attention(tr)
        assert a.shape == (model.config.linear_v_heads, len(IDS), len(IDS))
        torch.testing.assert_close(torch.einsum("hts,shd->thd", a, tr.v), tr.o, atol=1e-5, rtol=0)
        assert a.triu(1).abs().max() == 0
        assert a.tril(-1).abs().max() > 1e-3 and tr.o.abs().max() > 1e-2  # earlier tokens count; a real signal


def test_implicit_attention_is_the_product_of_transitions(pair) -> None:
    """Every A[t, s] equals β_s k_sᵀ (T_{s+1}⋯T_t) q_t with each T_j = exp(g_j)(I − β_j k_j k_jᵀ) built as a matrix
    and multiplied out (float64): the sweep folds in the gates and transitions exactly."""
    _, ours = pair
    tr = _traces(ours, IDS[:8])[1]
    a = implicit_attention(tr).double()
    q, k, beta, g = (x.double() for x in (tr.q, tr.k, tr.beta, tr.g))
    dk = q.size(-1)
    for h in range(q.size(1)):
        trans = [g[j, h].exp() * (torch.eye(dk, dtype=torch.float64) - beta[j, h] * torch.outer(k[j, h], k[j, h]))
                 for j in range(len(q))]
        for t in range(len(q)):
            for s in range(t + 1):
                m = torch.eye(dk, dtype=torch.float64)
                for j in range(s + 1, t + 1):
                    m = m @ trans[j]
                want = beta[s, h] * k[s, h] @ m @ q[t, h]
                assert abs(float(a[h, t, s]) - float(want)) < 1e-6, (h, t, s)


def test_recurrence_equals_transformers_chunked_delta_rule(pair) -> None:
    """Our recurrence and A·V both equal transformers' chunked gated delta rule (its torch path, chunks of 4 so that
    the 12 positions cross chunks) on the same q, k, v, g and β, within 1e-5."""
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    _, ours = pair
    for tr in _traces(ours, IDS):
        dk = tr.q.size(-1)
        ref, _ = torch_chunk_gated_delta_rule(tr.q[None] * dk ** 0.5, tr.k[None], tr.v[None], g=tr.g[None],
                                              beta=tr.beta[None], chunk_size=4, use_qk_l2norm_in_kernel=False)
        torch.testing.assert_close(tr.o, ref[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.einsum("hts,shd->thd", implicit_attention(tr), tr.v), ref[0], atol=1e-5,
                                   rtol=0)


def test_every_layer_side_by_side_with_its_kind(pair) -> None:
    """``layer_maps``: each layer's kind (the folder's layer_types) and its maps head by head: a softmax layer's
    attention equal to transformers' (every head, 1e-4, rows summing to 1), a DeltaNet layer's implicit attention per
    value head; ``layer_kinds`` says each in words."""
    hf, ours = pair
    with torch.no_grad():
        ref = hf(torch.tensor([IDS]), output_attentions=True).attentions
    maps = ours.layer_maps(IDS)
    assert [k for k, _ in maps] == ["linear", "full", "linear", "linear", "full"]
    assert ours.layer_kinds() == [KIND_NAMES[k] for k, _ in maps]
    softmax = [m for k, m in maps if k == "full"]
    for mine, theirs in zip(softmax, ref, strict=True):
        assert mine.shape == (6, len(IDS), len(IDS))
        np.testing.assert_allclose(mine, theirs[0].numpy(), atol=1e-4)
        np.testing.assert_allclose(mine.sum(-1), 1.0, atol=1e-5)
    traces = _traces(ours, IDS)
    for (_kind, mine), tr in zip([m for m in maps if m[0] == "linear"], traces, strict=True):
        assert mine.shape == (4, len(IDS), len(IDS))
        np.testing.assert_allclose(mine, implicit_attention(tr).numpy(), atol=1e-6)  # fused vs explicit softmax


def test_generate_draws_one_map_per_layer(pair) -> None:
    """Generate's maps are (L, 1, T, T), causal, rows summing to 1: a softmax layer's is transformers' attention
    averaged over heads, a DeltaNet layer's the row-normalised |A| averaged over value heads."""
    hf, ours = pair
    result = ours.generate(IDS, max_new_tokens=4)
    maps = result.attention["decoder"].weights
    t = len(result.ids)
    assert maps.shape == (5, 1, t, t) and t == len(IDS) + 4
    np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-5)
    assert np.abs(np.triu(maps[:, 0], 1)).max() == 0
    with torch.no_grad():
        ref = hf(torch.tensor([result.ids]), output_attentions=True).attentions
    np.testing.assert_allclose(maps[1, 0], ref[0][0].mean(0).numpy(), atol=1e-4)
    np.testing.assert_allclose(maps[4, 0], ref[1][0].mean(0).numpy(), atol=1e-4)
    np.testing.assert_allclose(maps[2, 0], heatmap(implicit_attention(_traces(ours, result.ids)[1])).numpy(),
                               atol=1e-6)
    np.testing.assert_allclose(ours.implicit_attention(result.ids), maps, atol=1e-6)


def test_cached_steps_equal_one_pass(pair) -> None:
    """The prompt read at once and then one token per step (softmax KV caches, DeltaNet convolution inputs and
    delta-rule states, RoPE from the cached length) gives the logits of one pass over everything, within 1e-5."""
    from models.families.qwen3_next import HybridState  # noqa: F401 (the state the steps carry)

    _, ours = pair
    with torch.no_grad():
        whole = ours(torch.tensor([IDS])).logits[0]
        state = ours._new_state()
        steps = [ours(torch.tensor([IDS[:5]]), state).logits[0]]
        steps += [ours(torch.tensor([[i]]), state).logits[0] for i in IDS[5:]]
    assert state.seen == len(IDS)
    torch.testing.assert_close(torch.cat(steps), whole, atol=1e-5, rtol=0)


def test_refusals(pair, hf_folders) -> None:
    """A head mask and head roles are refused in words; the reader refuses what the class does not compute, by name:
    another activation, RoPE scaling, a rotary width that is odd, layer types it does not know."""
    from safetensors.torch import load_file

    from models.io.checkpoint import CheckpointError
    from models.io.hf_qwen3_next import qwen3_next_from_state

    _, ours = pair
    with pytest.raises(ValueError, match="do not apply"):
        ours.next_token_probs(IDS, head_mask=torch.ones(5, 6))
    with pytest.raises(ValueError, match="do not apply"):
        ours.head_role_scores(5)
    folder = hf_folders.get("qwen3_next").path
    hf = json.loads((folder / "config.json").read_text())
    state = load_file(str(folder / "model.safetensors"))
    assert isinstance(qwen3_next_from_state(hf, state), Qwen3Next)
    rope = hf["rope_parameters"]
    for change, words in (({"hidden_act": "gelu"}, "activation 'gelu'"),
                          ({"rope_parameters": {**rope, "rope_type": "linear", "factor": 2.0}}, "RoPE scaling"),
                          ({"rope_parameters": {**rope, "partial_rotary_factor": 0.1875}}, "turns 3 of 16"),
                          ({"layer_types": ["linear_attention", "sliding_attention"] + hf["layer_types"][2:]},
                           "sliding_attention")):
        with pytest.raises(CheckpointError, match=words):
            qwen3_next_from_state({**hf, **change}, state)


def test_fused_experts_read_as_the_hub_layout(pair, hf_folders) -> None:
    """transformers' own state dict holds the experts fused (``experts.gate_up_proj`` (E, 2F, D), ``down_proj``);
    the folder it wrote holds them one by one: both read into the same model (the logits equal)."""
    from models.io.hf_qwen3_next import qwen3_next_from_state

    hf_model, ours = pair
    state = hf_model.state_dict()
    assert "model.layers.1.mlp.experts.gate_up_proj" in state
    hf = json.loads((hf_folders.get("qwen3_next").path / "config.json").read_text())
    fused = qwen3_next_from_state(hf, state).eval()
    with torch.no_grad():
        torch.testing.assert_close(fused(torch.tensor([IDS])).logits, ours(torch.tensor([IDS])).logits, atol=1e-6,
                                   rtol=0)


def test_qwen3_next_is_a_decoder() -> None:
    """The Generate tab's interface, method by method, but ``forward`` (whose KV caches, head masks and edits are
    GPT's: the views that call it refuse the family in words)."""
    from models.families.qwen3_next import Qwen3NextConfig
    from models.interfaces import Decoder, DecoderConfig
    from tests.test_interfaces import mismatches

    model = Qwen3Next(Qwen3NextConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, d_head=8,
                                      rotary_dim=4, ff_width=16, linear_k_heads=1, linear_v_heads=2, linear_k_dim=4,
                                      linear_v_dim=4, n_experts=0, layer_types=("linear", "full")))
    assert isinstance(model, Decoder)
    assert mismatches(Decoder, Qwen3Next) == ["forward"]
    for field in typing.get_type_hints(DecoderConfig):
        assert isinstance(getattr(model.config, field), int), field


def test_a_configured_folder_in_generate(hf_folders, tmp_path: Path, monkeypatch, tiny_checkpoints: Path) -> None:
    """A Qwen3-Next folder named by the configuration (ATLAS_MODELS / --model) is offered by Generate, passes the
    start-up check, generates, and each layer's map names its kind: the heatmap's title, the model view's rows; the
    head views refuse it in its own words."""
    from serving import catalogue, store
    from tabs import generate as tab
    from tabs.common import Error

    folder = tmp_path / "my-qwen3-next"
    shutil.copytree(hf_folders.get("qwen3_next").path, folder)
    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(catalogue, "CONFIGURED", {})
    monkeypatch.setattr(catalogue, "CONFIG_PROBLEMS", [])
    monkeypatch.setattr(catalogue, "CHECK_PROBLEMS", [])
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    catalogue.configure([str(folder)])
    assert catalogue.configured("generate") == ["my-qwen3-next"] and catalogue.check_configured() == []
    assert "my-qwen3-next" in tab.decoder_models() and catalogue.attention_shape("my-qwen3-next") is None
    _text, notice, _html, _cand, attn, lens, state, npz, *_ = tab.generate("the cat sat", 5, "my-qwen3-next")
    assert "Gated DeltaNet" in notice and "layers 0, 2, 3" in notice and "layers 1, 4" in notice
    assert state["kinds"] == [KIND_NAMES[k] for k in ("linear", "full", "linear", "linear", "full")]
    assert state["result"].attention["decoder"].weights.shape[:2] == (5, 1) and lens is not None
    assert "layer 4 is gated softmax attention" in attn.layout.title.text  # Generate shows the last layer first
    for layer, words in ((0, "Gated DeltaNet (implicit attention)"), (1, "gated softmax attention")):
        fig = tab.draw_generation(state, 0, layer, "mean", "heatmap")[2]
        assert f"layer {layer} is {words}" in fig.layout.title.text
    rows = tab.draw_generation(state, 0, 0, "mean", "model view")[2].layout.yaxis.ticktext
    assert list(rows) == [f"L{i} {k}" for i, k in enumerate(state["kinds"])]
    with np.load(npz) as arrays:
        assert "scores" not in arrays and arrays["attention"].shape[:2] == (5, 1)
    for call in (lambda: tab.head_roles("my-qwen3-next", 5, 0), lambda: tab.ablate_head_fn(state, 0, 0, 0)):
        with pytest.raises(Error, match="does not apply to this model. Qwen3-Next"):
            call()
