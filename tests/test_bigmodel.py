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


# ------------------------------------------------------------------ the app's model store loads through accelerate
@pytest.fixture(scope="module")
def big_gpt(tiny_checkpoints: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoints folder holding `big-gpt`: four blocks of about 190 KB each in float32 (800 KB in all), so a
    CPU allowance of a few hundred KB keeps some blocks and sends the rest to disk; gpt-tiny's tokenizer."""
    from models.families.gpt import GPT, GPTConfig
    from models.io.checkpoint import save_checkpoint

    root = tmp_path_factory.mktemp("big")
    tiny = tiny_checkpoints / "gpt-tiny"
    vocab = models.load(tiny).config.vocab_size
    torch.manual_seed(1)
    model = GPT(GPTConfig(vocab_size=vocab, max_len=128, d_model=64, n_layers=4, n_heads=4, n_kv_heads=2,
                          qkv_bias=True))
    save_checkpoint(root / "big-gpt", model, labels=[], text={"lowercase": False},
                    extra_files={"tokenizer.model": tiny / "tokenizer.model"})
    return root


@pytest.fixture
def store_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """The store's catalogue and offload folder in temporary places; ATLAS_MAX_MEMORY and ATLAS_DEVICE unset."""
    from serving import catalogue, store

    monkeypatch.setattr(store, "OFFLOAD", tmp_path / "offload")
    monkeypatch.setattr(catalogue, "CONFIGURED", {})
    for var in ("ATLAS_MAX_MEMORY", "ATLAS_DEVICE", "ATLAS_DTYPE"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch, catalogue, store


def _same_generation(whole, served) -> None:
    """``generate`` and the Generate tab's paths (fastgen, a lockstep batch) give the undivided model's ids and
    attention within TOL."""
    from models.decoding import fastgen
    from models.decoding.lockstep import GenerateRequest, generate_many

    prompt = "Two young girls are playing with a dog."
    g = whole.generate(prompt, 6)
    batch = generate_many(served, [GenerateRequest(prompt, 6), GenerateRequest("A man", 4)])
    for h in (served.generate(prompt, 6), fastgen.generate(served, prompt, 6), batch[0]):
        assert h.ids == g.ids and h.tokens == g.tokens
        np.testing.assert_allclose(h.attention["decoder"].weights, g.attention["decoder"].weights, atol=TOL)
    assert batch[1].ids == whole.generate("A man", 4).ids


def test_store_splits_a_decoder_within_max_memory(big_gpt: Path, store_env, capsys: pytest.CaptureFixture) -> None:
    from models.io.bigmodel import dispatched

    mp, catalogue, store = store_env
    mp.setattr(catalogue, "CHECKPOINTS", big_gpt)
    whole = models.load(big_gpt / "big-gpt")
    mp.setenv("ATLAS_MAX_MEMORY", "cpu=800KB")  # the embedding and two blocks; the rest on disk
    served = store.ModelStore()._load("big-gpt")
    assert dispatched(served) and set(served.hf_device_map.values()) == {"cpu", "disk"}
    assert any(p.device.type == "meta" for p in served.parameters())  # offloaded weights really are on disk
    assert served.device_summary.startswith("4 blocks: ") and " on cpu" in served.device_summary
    assert " on disk" in served.device_summary
    assert served.device_summary in capsys.readouterr().out  # the log line
    offload = list((store.OFFLOAD).iterdir())
    assert len(offload) == 1 and offload[0].name.startswith("big-gpt-") and (offload[0] / "index.json").is_file()
    assert (served.labels, served.text) == (whole.labels, whole.text)
    assert served.tokenizer.encode("A dog.").ids == whole.tokenizer.encode("A dog.").ids
    _same_generation(whole, served)
    # an allowance below the embedding: every block on disk, the embedding kept on the CPU (inputs are made there)
    mp.setenv("ATLAS_MAX_MEMORY", "cpu=1KB")
    low = store.ModelStore()._load("big-gpt")
    assert low.device_summary == "4 blocks: 4 on disk; embedding on cpu, output on cpu"
    assert low.embed.weight.device.type == "cpu"
    _same_generation(whole, low)


def test_store_path_unchanged_without_max_memory(big_gpt: Path, store_env) -> None:
    from models.decoding.packed import pack_linears
    from models.io.placement import place

    mp, catalogue, store = store_env
    mp.setattr(catalogue, "CHECKPOINTS", big_gpt)
    served = store.ModelStore()._load("big-gpt")
    assert not any(hasattr(m, "_hf_hook") for m in served.modules())
    assert not hasattr(served, "hf_device_map") and not hasattr(served, "device_summary")
    assert all(p.device.type == "cpu" for p in served.parameters())
    expected = models.load(big_gpt / "big-gpt")
    pack_linears(expected)
    place(expected, "cpu")
    assert [type(m) for m in served.modules()] == [type(m) for m in expected.modules()]  # packed the same way
    assert not (store.OFFLOAD).exists()
    _same_generation(models.load(big_gpt / "big-gpt"), served)


@pytest.mark.parametrize("value", ["cpu=lots", "gpu0=1GiB", "cpu", "99=1GiB"])
def test_store_bad_max_memory(big_gpt: Path, store_env, value: str) -> None:
    from serving.errors import ModelUnavailable

    mp, catalogue, store = store_env
    mp.setattr(catalogue, "CHECKPOINTS", big_gpt)
    mp.setenv("ATLAS_MAX_MEMORY", value)
    with pytest.raises(ModelUnavailable, match=r"ATLAS_MAX_MEMORY") as err:
        store.ModelStore()._load("big-gpt")
    assert "Traceback" not in str(err.value) and value in str(err.value)


def test_store_other_models_load_as_before_under_max_memory(tiny_checkpoints: Path, store_env, tmp_path: Path) -> None:
    """A classifier, Mamba and a Hugging Face GPT-2 folder (which load_gpt does not read) load the usual way."""
    from models.io.bigmodel import readable
    from tests.tiny import tiny_gpt2_folder

    mp, catalogue, store = store_env
    mp.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    tiny_gpt2_folder(tmp_path / "my-gpt2")
    mp.setitem(catalogue.CONFIGURED, "my-gpt2", catalogue.Configured(tmp_path / "my-gpt2", "generate"))
    mp.setenv("ATLAS_MAX_MEMORY", "cpu=1KB")
    for name in ("sst2", "mamba-tiny", "my-gpt2"):
        folder = tmp_path / "my-gpt2" if name == "my-gpt2" else tiny_checkpoints / name
        assert not readable(folder)
        served = store.ModelStore()._load(name)
        assert not any(hasattr(m, "_hf_hook") for m in served.modules()), name
        assert all(p.device.type == "cpu" for p in served.parameters()), name
    assert served.generate("the cat", 3).ids == models.load(tmp_path / "my-gpt2").generate("the cat", 3).ids
    mp.setenv("ATLAS_MAX_MEMORY", "cpu=lots")  # read for decoders it would split only
    assert store.ModelStore()._load("sst2").classify("a fine film").labels == ["negative", "positive"]
    assert not (store.OFFLOAD).exists()


def test_store_splits_a_configured_llama_folder(store_env, tmp_path: Path) -> None:
    from models.io.bigmodel import dispatched, readable
    from tests.tiny import tiny_llama_folder

    mp, catalogue, store = store_env
    tiny_llama_folder(tmp_path / "llama")
    assert readable(tmp_path / "llama")
    mp.setitem(catalogue.CONFIGURED, "my llama", catalogue.Configured(tmp_path / "llama", "generate"))
    mp.setenv("ATLAS_MAX_MEMORY", "cpu=60KB")
    served = store.ModelStore()._load("my llama")
    whole = models.load(tmp_path / "llama")
    assert dispatched(served) and "disk" in served.hf_device_map.values()
    assert list(store.OFFLOAD.iterdir())[0].name.startswith("my_llama-")  # the display name made a safe folder name
    tok, ref = served.tokenizer, whole.tokenizer  # as models.load gives it: the config's BOS/EOS, the context cut
    assert (tok.bos_id, tok.eos_id, tok.adds_bos, tok.max_tokens) == (ref.bos_id, ref.eos_id, ref.adds_bos,
                                                                      ref.max_tokens)
    assert (served.labels, served.text) == ([], {})
    ids = [0, *range(5, 25)]
    g, h = whole.generate(ids, 5), served.generate(ids, 5)
    assert g.ids == h.ids
    np.testing.assert_allclose(h.attention["decoder"].weights, g.attention["decoder"].weights, atol=TOL)


def test_split_memory_on_a_gpu(big_gpt: Path, store_env) -> None:
    """ATLAS_DEVICE a CUDA device and no ATLAS_MAX_MEMORY: split only when the weights in the run dtype are more than
    the device's free memory less ACTIVATION_MARGIN (torch's and accelerate's memory queries stood in for)."""
    import accelerate.utils

    mp, _, store = store_env
    folder = big_gpt / "big-gpt"
    need = 204_096 * 2  # parameters (safetensors headers) × bfloat16's two bytes
    assert sum(p.numel() for p in models.load(folder).parameters()) == 204_096
    free = {"now": 0}
    mp.setattr(torch.cuda, "mem_get_info", lambda device=None: (free["now"], 80 << 30))
    mp.setattr(accelerate.utils, "get_max_memory", lambda: {0: free["now"], 1: 2 * free["now"], "cpu": 10 ** 9})
    free["now"] = int(need / (1 - store.ACTIVATION_MARGIN)) + 8  # fits with the margin kept
    assert store.split_memory(folder, "cuda:0", torch.bfloat16) is None
    free["now"] = need  # holds the weights but not the margin
    assert store.split_memory(folder, "cuda:0", torch.bfloat16) == {0: int(need * 0.8), 1: int(2 * need * 0.8),
                                                                      "cpu": 10 ** 9}
    assert store.split_memory(folder, "cpu", torch.float32) is None  # the CPU: loaded whole, as before
