"""Checkpoint folders: round trip, sharding, verification errors naming the file, models.load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import models
from models.families.classifier import ClassifierConfig, TextClassifier
from models.families.translator import Translator, TranslatorConfig
from models.inputs.tokenizer import MAX_TOKENS_SCRATCH, SentencePieceTokenizer, normalize_text
from models.io.checkpoint import CheckpointError, config_from_dict, load_checkpoint, save_checkpoint

torch.set_num_threads(1)
LINES = ["a man is running in the park .", "ein mann läuft im park .", "two dogs play with a ball",
         "zwei hunde spielen mit einem ball", "it 's a charming film", "is n't it great ?"] * 30


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import sentencepiece as spm

    prefix = tmp_path_factory.mktemp("spm") / "tiny"
    spm.SentencePieceTrainer.train(sentence_iterator=iter(LINES), model_prefix=str(prefix), vocab_size=40,
                                   pad_id=0, bos_id=1, eos_id=2, unk_id=3, minloglevel=2)
    return prefix.with_suffix(".model")


def tiny_translator(vocab: int = 48, d: int = 16, tie: bool = True) -> Translator:
    torch.manual_seed(0)
    cfg = TranslatorConfig(vocab_size=vocab, d_model=d, n_heads=2, n_enc_layers=1, n_dec_layers=1,
                           d_ff=32, dropout=0.0, tie_embeddings=tie)
    return Translator(cfg)


def test_round_trip_fp16_and_tokenizer(tmp_path: Path, spm_model: Path) -> None:
    model = tiny_translator()
    folder = save_checkpoint(tmp_path / "tr", model, labels=[], text={"lowercase": True},
                             extra_files={"tokenizer.model": spm_model}, metrics={"bleu": 1.0})
    manifest = json.loads((folder / "manifest.json").read_text())
    assert set(manifest["files"]) == {"config.json", "model.safetensors", "tokenizer.model"}
    meta, state = load_checkpoint(folder)
    assert meta["model"] == "Translator" and meta["text"] == {"lowercase": True}
    assert all(t.dtype == torch.float32 for t in state.values())
    loaded = models.load(folder)
    assert isinstance(loaded, Translator) and not loaded.training
    assert loaded.generator.weight is loaded.src_embed.weight  # tying survives the alias
    for name, p in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], p.half().float())
    res = loaded.translate("A man is running.", beam_size=2, max_len=6)
    assert res.source_tokens[0] == "<s>" and res.source_tokens[-1] == "</s>"
    assert res.attention["cross"].weights.shape[-1] == len(res.source_tokens)


def test_sharding_stays_under_limit(tmp_path: Path) -> None:
    model = tiny_translator(vocab=600, d=32, tie=False)
    folder = save_checkpoint(tmp_path / "sh", model, fp16=False, max_shard_bytes=100_000)
    shards = sorted(folder.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and not (folder / "model.safetensors").exists()
    assert all(p.stat().st_size <= 100_000 + 10_000 for p in shards)  # + the JSON header
    _, state = load_checkpoint(folder)
    for name, p in model.state_dict().items():
        torch.testing.assert_close(state[name], p)


def test_hash_mismatch_names_file(tmp_path: Path) -> None:
    folder = save_checkpoint(tmp_path / "c", tiny_translator())
    path = folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*sha256"):
        load_checkpoint(folder)


def test_missing_file_names_file(tmp_path: Path, spm_model: Path) -> None:
    folder = save_checkpoint(tmp_path / "c", tiny_translator(), extra_files={"tokenizer.model": spm_model})
    (folder / "tokenizer.model").unlink()
    with pytest.raises(CheckpointError, match=r"tokenizer\.model.*missing"):
        load_checkpoint(folder)
    (folder / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match=r"manifest\.json"):
        load_checkpoint(folder)


def test_truncated_safetensors_names_file(tmp_path: Path) -> None:
    folder = save_checkpoint(tmp_path / "c", tiny_translator())
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*truncated"):
        load_checkpoint(folder)
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*not a readable safetensors"):
        load_checkpoint(folder, verify_hashes=False)  # the reader itself also refuses it


@pytest.mark.parametrize("change", ["unknown", "missing", "no_model", "bad_json"])
def test_bad_config_names_file(tmp_path: Path, change: str) -> None:
    folder = save_checkpoint(tmp_path / "c", tiny_translator())
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if change == "unknown":
        cfg["config"]["n_layer"] = 3
    elif change == "missing":
        del cfg["config"]["d_ff"]
    elif change == "no_model":
        del cfg["model"]
    text = "{not json" if change == "bad_json" else json.dumps(cfg)
    cfg_path.write_text(text)
    with pytest.raises(CheckpointError, match=r"config\.json"):
        models.load(folder, verify=False)


def test_config_from_dict_lists_keys() -> None:
    with pytest.raises(CheckpointError, match=r"unknown keys \['colour'\].*missing keys"):
        config_from_dict(ClassifierConfig, {"colour": 1})


def test_names_resolve_under_checkpoints_and_refuse_traversal() -> None:
    assert models.resolve("sst2-scratch") == models.CHECKPOINTS / "sst2-scratch"
    for bad in ("..", "..x", ".hidden", "a b", "", "../x", "checkpoints/../../etc", "..\\x"):
        with pytest.raises(ValueError):
            models.resolve(bad)
    assert models.resolve("checkpoints/sst2") == Path("checkpoints/sst2")  # a string path
    assert models.resolve(Path("../x")) == Path("../x")  # a Path from code is taken as given
    assert models.resolve(Path("sst2-scratch")) == models.CHECKPOINTS / "sst2-scratch"  # CLI name
    with pytest.raises(CheckpointError, match="not found"):
        models.load("no-such-checkpoint")


def test_classifier_round_trip_with_labels(tmp_path: Path, spm_model: Path) -> None:
    torch.manual_seed(0)
    model = TextClassifier(ClassifierConfig(vocab_size=48, n_classes=2, d_model=16, n_heads=2, n_layers=1,
                                            d_ff=32, dropout=0.0))
    folder = save_checkpoint(tmp_path / "cls", model, labels=["negative", "positive"],
                             text={"lowercase": True, "split_punct": True},
                             extra_files={"tokenizer.model": spm_model})
    loaded = models.load(folder)
    res = loaded.classify("It's a charming film!")
    assert res.labels == ["negative", "positive"]
    assert res.tokens[0] == "<s>" and res.attention["encoder"].weights.shape[-1] == len(res.tokens)
    assert abs(float(res.probs.sum()) - 1) < 1e-5


def test_tokenizer_caps_and_normalises(spm_model: Path) -> None:
    tok = SentencePieceTokenizer(spm_model, {"lowercase": True})
    enc = tok.encode("A MAN is running.")
    assert enc.ids[0] == tok.bos_id and enc.ids[-1] == tok.eos_id and enc.notice == ""
    assert tok.decode(enc.ids) == "a man is running."
    long = tok.encode("a man " * 200)
    assert len(long.ids) == MAX_TOKENS_SCRATCH and long.ids[-1] == tok.eos_id and "truncated" in long.notice
    assert normalize_text("It's good, isn't it?", {"lowercase": True, "split_punct": True}) == \
        "it 's good , is n't it ?"
    with pytest.raises(ValueError, match="unknown text settings"):
        normalize_text("x", {"lowercas": True})


def test_json_tokenizer_wordpiece(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    from models.inputs.tokenizer import MAX_TOKENS_MINILM, load_tokenizer

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "a": 4, "man": 5, "is": 6, "run": 7,
             "##ning": 8, ".": 9}
    tk = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                      special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tk.decoder = decoders.WordPiece()
    tk.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(tmp_path, {"lowercase": True})
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.vocab_size) == (0, 1, 2, 3, 10)
    enc = tok.encode("A man is running.")
    assert enc.pieces == ["[CLS]", "a", "man", "is", "run", "##ning", ".", "[SEP]"]
    assert enc.ids == [2, 4, 5, 6, 7, 8, 9, 3]
    assert tok.decode(enc.ids) == "a man is running."
    long = tok.encode("a man " * 200)
    assert len(long.ids) == tok.max_tokens == MAX_TOKENS_MINILM and long.ids[-1] == tok.sep_id and long.notice


def test_canonical_header_sorts_metadata_and_keeps_the_data(tmp_path: Path) -> None:
    import json
    import struct

    from safetensors.torch import load_file, save_file

    from models.io.checkpoint import _canonical_header

    w = {"w": torch.arange(12, dtype=torch.float16).reshape(3, 4)}
    path = tmp_path / "a.safetensors"
    save_file(w, str(path), metadata={"zeta": "1", "alpha": "2", "mid": "3"})
    before = path.read_bytes()
    _canonical_header(path)
    after = path.read_bytes()
    size = struct.unpack("<Q", after[:8])[0]
    assert len(after) == len(before) and after[8 + size:] == before[8 + size:]  # the data is untouched
    assert list(json.loads(after[8:8 + size])["__metadata__"]) == ["alpha", "mid", "zeta"]
    assert torch.equal(load_file(str(path))["w"], w["w"])
