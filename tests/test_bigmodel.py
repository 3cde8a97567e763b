"""models/io/bigmodel.py: accelerate's big-model inference onto the project's GPT. A forced device map across the CPU
and disk offload gives the undivided model's logits and attention within 1e-5, and generation, the on-device
attention path, the score split, patching and the logit lens work across the split (issue 52)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import models
from models.decoding import ondevice
from models.inspect.decompose import decompose_score
from models.inspect.patching import patch_sweep, repeated_pair, sink_ablation
from models.io.bigmodel import load_gpt, max_memory

TOL = 1e-5


def _maps(n_layers: int) -> dict[str, dict[str, str]]:
    """A tied model keeps its output projection with the embedding; every other block alternates CPU and disk."""
    blocks = {f"blocks.{i}": "disk" if i % 2 else "cpu" for i in range(n_layers)}
    return {"tied": {"embed": "cpu", **blocks, "norm": "disk", "lm_head": "cpu"},
            "untied": {"embed": "cpu", **blocks, "norm": "cpu", "lm_head": "disk"}}


def _same(whole, split, ids: list[int]) -> None:
    with torch.no_grad():
        a, b = whole(torch.tensor([ids]), need_weights=True), split(torch.tensor([ids]), need_weights=True)
    assert float((a.logits - b.logits).abs().max()) <= TOL
    for x, y in zip(a.attention, b.attention, strict=True):
        assert float((x - y).abs().max()) <= TOL
    g, h = whole.generate(ids[:4], 5), split.generate(ids[:4], 5)
    assert g.ids == h.ids and g.text == h.text
    np.testing.assert_allclose(h.attention["decoder"].weights, g.attention["decoder"].weights, atol=TOL)
    o = ondevice.generate(split, ids[:4], 5).result()
    assert o.ids == g.ids
    np.testing.assert_allclose(o.attention["decoder"].weights, g.attention["decoder"].weights, atol=TOL)
    c = whole.config
    s, t = decompose_score(whole, ids, c.n_layers - 1, 1, len(ids) - 1, 2), \
        decompose_score(split, ids, c.n_layers - 1, 1, len(ids) - 1, 2)
    assert s.parts == t.parts
    np.testing.assert_allclose(t.table, s.table, atol=TOL)
    clean, corrupted = repeated_pair(whole, 5)
    for sweep in ("heads", "positions"):
        np.testing.assert_allclose(patch_sweep(split, clean, corrupted, sweep).restored,
                                   patch_sweep(whole, clean, corrupted, sweep).restored, atol=1e-4)
    np.testing.assert_allclose(sink_ablation(split, ids, 0, 1).attention_after,
                               sink_ablation(whole, ids, 0, 1).attention_after, atol=TOL)
    np.testing.assert_allclose(split.logit_lens(ids).top_probs, whole.logit_lens(ids).top_probs, atol=TOL)


def test_gpt_tiny_split_across_cpu_and_disk(tiny_checkpoints: Path, tmp_path: Path) -> None:
    whole = models.load(tiny_checkpoints / "gpt-tiny")  # tied embeddings, grouped-query heads, qkv biases
    assert whole.config.tie_embeddings
    split = load_gpt(tiny_checkpoints / "gpt-tiny", _maps(whole.config.n_layers)["tied"], tmp_path / "offload")
    assert any(p.device.type == "meta" for p in split.parameters())  # some weights really are on disk
    assert (tmp_path / "offload" / "index.json").is_file()
    ids, _ = whole.encode_prompt("Two young girls are playing with a dog in the park.")
    _same(whole, split, ids)


def test_llama_folder_split_and_auto_map(tmp_path: Path) -> None:
    from tests.tiny import tiny_llama_folder

    tiny_llama_folder(tmp_path / "llama")  # written by transformers: its names, untied output projection
    whole = models.load(tmp_path / "llama")
    split = load_gpt(tmp_path / "llama", _maps(whole.config.n_layers)["untied"], tmp_path / "offload")
    ids = [0, *range(5, 25)]
    _same(whole, split, ids)
    # "auto" within ATLAS_MAX_MEMORY: a CPU allowance smaller than the model sends the rest to disk
    auto = load_gpt(tmp_path / "llama", "auto", tmp_path / "offload-auto", memory=max_memory("cpu=60KB"))
    assert any(p.device.type == "meta" for p in auto.parameters())
    with torch.no_grad():
        a, b = whole(torch.tensor([ids])), auto(torch.tensor([ids]))
    assert float((a.logits - b.logits).abs().max()) <= TOL


def test_max_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATLAS_MAX_MEMORY", raising=False)
    assert max_memory() is None
    monkeypatch.setenv("ATLAS_MAX_MEMORY", "0=70GiB, 1=70GiB,cpu=200GiB")
    assert max_memory() == {0: "70GiB", 1: "70GiB", "cpu": "200GiB"}
    with pytest.raises(ValueError, match="DEVICE=SIZE"):
        max_memory("gpu0=1GiB")
