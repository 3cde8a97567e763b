"""The later decoder families (models/io/hf_decoders.py) beyond their parity with transformers.

Their folders are tests/parity_folders.py's (written by transformers: unusual valid configs), where
tests/test_parity.py checks the logits, every layer's attention and the greedy ids against transformers. Here: the
switches each folder turns on; the score split (models/inspect/decompose.py) sums to the score and its row's softmax is
the model's attention, through q/k norms (Qwen3, Gemma 3), sliding windows and Gemma's sandwich norms; the mixture of
experts' chosen experts and weights are the top-k of transformers' router logits; fastgen and lockstep serve them.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch

import models
from models.blocks.decoder import BlockSpec
from tests.tiny_families import FAMILIES, decoder_folder

IDS = [5, 17, 33, 2, 40, 41, 7, 9, 11, 12]  # longer than every sliding window of tests/tiny_families.py


@pytest.fixture(scope="module")
def folders(hf_folders) -> dict[str, tuple[object, object]]:
    """name -> (transformers' model, ours): the session's folders (tests/parity_folders.py)."""
    return {name: (hf_folders.get(name).ref.model, hf_folders.get(name).model) for name in FAMILIES}


def test_family_switches_are_read(folders) -> None:
    """Each folder turned on the switches its family needs (a missing one would be caught above too, this names it)."""
    c = {name: folders[name][1].config for name in FAMILIES}
    assert c["qwen2"].qkv_bias and not c["qwen2"].tie_embeddings and c["qwen2"].kv_heads == 3
    tied = folders["qwen2-tied"][1]
    assert c["qwen2-tied"].tie_embeddings and tied.lm_head.weight is tied.embed.weight
    assert c["qwen3"].qk_norm and c["qwen3"].d_head == 16 and c["qwen3"].rope_base == 700.0
    assert c["mistral"].sliding_window == 4 and all(c["mistral"].is_local(i) for i in range(3))
    assert c["phi3"].sliding_window == 5 and c["phi3"].rope_base == 3000.0
    g = c["gemma3_text"]
    assert g.sandwich_norm and g.qk_norm and g.embed_scale == pytest.approx(48 ** 0.5)
    assert [g.is_local(i) for i in range(3)] == [True, False, True] and g.local_rope_base == 800.0
    assert g.rope_base == 50_000.0 and g.attn_scale == pytest.approx(24 ** -0.5) and g.final_softcap == 30.0
    assert [c["gemma3_text-softcap"].is_local(i) for i in range(3)] == [True, False, True]  # sliding_window_pattern 2
    assert c["mixtral"].n_experts == 5 and c["mixtral"].experts_per_token == 2

    def switched(config) -> set[str]:  # the block fields where a config differs from the bare LLaMA recipe
        bare = BlockSpec(rotary_dim=config.d_head, rope_layout="half")
        return {f.name for f in fields(BlockSpec) if getattr(config.block_spec(0), f.name) != getattr(bare, f.name)}

    assert switched(c["qwen2"]) == {"qkv_bias"}
    assert switched(c["qwen3"]) == {"qk_norm"} and "window" in switched(c["mistral"]) | switched(c["phi3"])
    assert {"sandwich", "qk_norm", "ff_act"} <= switched(c["gemma3_text"]) and "ff" in switched(c["mixtral"])


@pytest.mark.parametrize("name", ["mistral", "gemma3_text"])
def test_sliding_window_band(folders, name: str) -> None:
    """A local layer's heatmap is the band i − w < j ≤ i: zero outside it and rows summing to 1 inside it; a
    global layer (Gemma's middle one) reaches back to key 0. Head roles respect it: the induction score (attention
    n − 1 tokens back) of a local layer with a window shorter than n is exactly 0."""
    _, ours = folders[name]
    c = ours.config
    result = ours.generate(IDS, max_new_tokens=6)
    weights = result.attention["decoder"].weights  # (L, H, T, T)
    t = weights.shape[-1]
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    band = (j <= i) & (j > i - c.sliding_window)
    for layer in range(c.n_layers):
        w = weights[layer]
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
        if c.is_local(layer):
            assert np.abs(w[:, ~band]).max() == 0.0
        else:
            assert w[:, -1, 0].min() > 0.0  # the last query still sees the first key
    roles = ours.head_role_scores(n=8)
    for layer in range(c.n_layers):
        if c.is_local(layer):
            assert np.all(roles["induction"][layer] == 0.0)


@pytest.mark.parametrize("name", ["qwen2", "qwen3", "mistral", "phi3", "gemma3_text", "mixtral"])
def test_score_split_sums_to_the_score(folders, name: str) -> None:
    """The score split carries every part through q/k norms (Qwen3, Gemma 3), Gemma's scale and sandwich norms and
    local RoPE base: each table sums to the model's score, and each row's softmax is the model's attention."""
    from models.inspect.decompose import attention_scores, decompose_score

    _, ours = folders[name]
    with torch.no_grad():
        attention = ours(torch.tensor([IDS]), need_weights=True).attention
    scores = attention_scores(ours, IDS)  # (L, H, T, T)
    for layer in range(ours.config.n_layers):
        got = torch.softmax(torch.from_numpy(scores[layer]).double(), -1)
        np.testing.assert_allclose(got.numpy(), attention[layer][0].numpy(), atol=1e-5)
    c = ours.config
    for layer, head, query, key in ((0, 1, 9, 8), (1, 5, 9, 7), (2, 3, 7, 6), (2, 0, 9, 9)):
        d = decompose_score(ours, IDS, layer, head, query, key)
        assert d.table.sum() == pytest.approx(d.score, abs=1e-6)
        assert d.score == pytest.approx(float(scores[layer, head, query, key]), abs=1e-4)
        np.testing.assert_allclose(d.softmax_row, attention[layer][0, head, query].numpy(), atol=1e-5)
        if c.n_experts:  # bias, token, each earlier head and each expert that wrote something
            assert all(p.split()[-1] != "MLP" for p in d.parts)
            if layer:
                assert len(d.parts) > 2 + layer * c.n_heads and any(p.startswith("L0 E") for p in d.parts)
        else:  # bias, token, each earlier head and MLP
            assert len(d.parts) == 2 + layer * (c.n_heads + 1)
        assert np.abs(d.table[1:, 1:]).max() > 0  # the parts carry something, not all in the bias
    if c.sliding_window:
        local = next(i for i in range(c.n_layers) if c.is_local(i))
        with pytest.raises(ValueError, match="sliding window"):
            decompose_score(ours, IDS, local, 0, 9, 9 - c.sliding_window)


def test_qk_norm_split_freezes_the_norm(folders) -> None:
    """Qwen3: the q-norm divides every part by the same per-head RMS (that of the whole query), so the parts'
    queries sum to the model's normed, rotated query: hand-checked against the model's own projection."""
    from models.blocks.positional import apply_rope
    from models.inspect.decompose import decompose_score

    _, ours = folders["qwen3"]
    a, c = ours.blocks[0].attn, ours.config
    with torch.no_grad():
        x = ours.embed(torch.tensor([IDS]))[0]
        h = ours.blocks[0].norm1(x)
        q = a.q_norm(a.q_proj(h).view(len(IDS), c.n_heads, c.d_head).transpose(0, 1))
        k = a.k_norm(a.k_proj(h).view(len(IDS), c.kv_heads, c.d_head).transpose(0, 1))
        q, k = apply_rope(q, ours.angles[: len(IDS)], "half"), apply_rope(k, ours.angles[: len(IDS)], "half")
        want = float(q[4, 6] @ k[4 // 2, 3]) / c.d_head ** 0.5
    d = decompose_score(ours, IDS, 0, 4, 6, 3)
    assert d.parts == ["bias", "token"] and d.table.sum() == pytest.approx(want, abs=1e-5)


def test_mixtral_routes_equal_transformers_router(folders) -> None:
    """Each layer's chosen experts and weights are the top-k of transformers' router logits (softmaxed, the k kept
    renormalised), and the router logits themselves agree within 1e-4."""
    from models.families.moe import expert_routes

    hf, ours = folders["mixtral"]
    with torch.no_grad():
        ref = hf(torch.tensor([IDS]), output_router_logits=True).router_logits  # per layer (T, E)
    routes = expert_routes(ours, IDS)
    assert routes.experts.shape == (3, len(IDS), 2) and routes.tokens == [ours.piece(i) for i in IDS]
    for layer, logits in enumerate(ref):
        np.testing.assert_allclose(routes.logits[layer], logits.numpy(), atol=1e-4)
        top, chosen = torch.topk(torch.softmax(logits.float(), -1), 2)
        np.testing.assert_array_equal(routes.experts[layer], chosen.numpy())
        np.testing.assert_allclose(routes.weights[layer], (top / top.sum(-1, keepdim=True)).numpy(), atol=1e-5)
    np.testing.assert_allclose(routes.load().sum(-1), 1.0, atol=1e-6)
    assert len(np.unique(routes.experts)) > 2  # the tokens do not all go to the same experts


def test_fastgen_serves_every_family(folders) -> None:
    """The serving path (models.decoding.fastgen) gives transformers' greedy ids for each family: Qwen2 (the plain
    LLaMA block with biases), Qwen3 (its q/k norms and head width), Phi-3 with partial rotary and GPT-NeoX (parallel
    residual, partial rotary) through its own loop, the others through model.generate (a switch it does not know)."""
    from models.decoding import fastgen

    for name in ("qwen2", "qwen3", "phi3-partial", "gpt_neox", "gemma3_text", "mixtral"):
        hf, ours = folders[name]
        assert fastgen.supports(ours) == (name in ("qwen2", "qwen3", "phi3-partial", "gpt_neox"))
        with torch.no_grad():
            want = hf.generate(torch.tensor([IDS]), max_new_tokens=8, min_new_tokens=8, do_sample=False,
                               pad_token_id=0)[0].tolist()
        got = fastgen.generate(ours, IDS, max_new_tokens=8)
        assert got.ids == want[: len(got.ids)], name


def test_unsupported_configs_are_refused(tmp_path: Path) -> None:
    """RoPE scaling and partial rotary factors are refused with the reason, not read wrongly."""
    import json

    from models.io.checkpoint import CheckpointError

    decoder_folder(tmp_path / "q", "qwen2")
    meta = json.loads((tmp_path / "q" / "config.json").read_text())
    for bad, why in (({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}, "RoPE"),
                     ({"partial_rotary_factor": 0.5}, "partial rotary")):
        (tmp_path / "q" / "config.json").write_text(json.dumps({**meta, **bad}))
        with pytest.raises(CheckpointError, match=why):
            models.load(str(tmp_path / "q"))


@pytest.mark.parametrize("name", ["mistral", "gemma3_text", "mixtral"])
def test_batched_generation_equals_each_alone(folders, name: str) -> None:
    """The server's lockstep batches (models/decoding/lockstep.py) give each request its own answer for the families
    with windows, local layers and experts: prompts of different lengths, one longer than the window."""
    from models.decoding.lockstep import GenerateRequest, generate_many

    _, ours = folders[name]
    requests = [GenerateRequest(IDS, 6), GenerateRequest(IDS[:4], 6), GenerateRequest(IDS[2:], 6)]
    batch = generate_many(ours, requests)
    for req, got in zip(requests, batch, strict=True):
        alone = ours.generate(list(req.text), max_new_tokens=6)
        assert got.ids == alone.ids
        np.testing.assert_allclose(got.attention["decoder"].weights, alone.attention["decoder"].weights, atol=1e-5)


@pytest.mark.parametrize("reader,name,model_type", [("gemma_from_state", "Gemma", "gemma"),
                                                    ("gemma2_from_state", "Gemma 2", "gemma2"),
                                                    ("gemma3_from_state", "Gemma 3", "gemma3_text")])
def test_gemma_readers_refuse_an_encoder_and_attention_biases(reader: str, name: str, model_type: str) -> None:
    """A bidirectional Gemma (an encoder) and attention biases are refused in words before any weight is read; only
    PaliGemma's prefix LM (Gemma 1 and 2) may read both ways."""
    from models.io import hf_decoders
    from models.paths import CheckpointError

    read = getattr(hf_decoders, reader)
    with pytest.raises(CheckpointError, match=f"bidirectional {name} \\(an encoder\\)"):
        read({"use_bidirectional_attention": True}, {})
    with pytest.raises(CheckpointError, match=f"attention biases are not supported for {model_type}$"):
        read({"attention_bias": True}, {})
    if reader != "gemma3_from_state":  # the prefix LM passes the check (and then needs a config and weights)
        with pytest.raises(KeyError):
            read({"use_bidirectional_attention": True}, {}, prefix_lm=True)
