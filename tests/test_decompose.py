"""models/inspect/decompose.py: every attention score split into residual-stream parts sums back to the score, and the
softmax of the walk's row of scores reproduces the attention each model returns, for every text family served
(LLaMA recipe with GQA, RoPE and query/key/value biases; GPT-2; pre- and post-norm classifiers; BERT; the
translator's encoder)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.families.bert import BertClassifier, BertConfig
from models.families.classifier import ClassifierConfig, TextClassifier
from models.families.gpt import GPT, GPTConfig
from models.families.translator import Translator, TranslatorConfig
from models.inspect.decompose import attention_scores, decompose_score

torch.set_num_threads(2)


def _gpt(**kw) -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, max_len=48, d_model=48, n_layers=3, n_heads=6, **kw)).eval()
    with torch.no_grad():  # move every parameter off its start (norm gains 1, biases 0)
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return model


FAMILIES = {
    "llama-gqa": lambda: _gpt(recipe="llama", n_kv_heads=2),
    "llama-half-qkv-bias": lambda: _gpt(recipe="llama", rope_layout="half", qkv_bias=True),
    "llama-gqa-qkv-bias": lambda: _gpt(recipe="llama", n_kv_heads=3, qkv_bias=True),
    "gpt2": lambda: _gpt(recipe="gpt2"),
    "classifier-pre-norm": lambda: _classifier(True, "learned"),
    "classifier-post-norm": lambda: _classifier(False, "sinusoidal"),
    "bert": lambda: _bert(),
    "translator-encoder": lambda: _translator(),
}


def _classifier(norm_first: bool, positions: str) -> TextClassifier:
    torch.manual_seed(1)
    cfg = ClassifierConfig(vocab_size=50, n_classes=3, d_model=32, n_heads=4, n_layers=3, d_ff=64, dropout=0.0,
                           positions=positions, norm_first=norm_first)
    model = TextClassifier(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return model


def _bert() -> BertClassifier:
    torch.manual_seed(2)
    c = BertConfig(vocab_size=60, d_model=32, n_layers=3, n_heads=4, d_ff=64, max_positions=32, max_len=32,
                   dropout=0.0, attention_dropout=0.0)
    model = BertClassifier(c).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return model


def _translator() -> Translator:
    torch.manual_seed(3)
    c = TranslatorConfig(vocab_size=60, d_model=32, n_heads=4, n_enc_layers=3, n_dec_layers=1, d_ff=64, dropout=0.0)
    return Translator(c).eval()


def _attention(model, ids: list[int]) -> np.ndarray:
    """The model's own attention (L, H, T, T) through its public explicit path."""
    x = torch.tensor([ids])
    with torch.no_grad():
        kind = type(model).__name__
        if kind == "GPT":
            return torch.stack(model(x, need_weights=True).attention, 1)[0].numpy()
        if kind == "Translator":
            return torch.stack(model.encode(x, need_weights=True)[2], 1)[0].numpy()
        return model.forward_with_attention(x, torch.zeros_like(x, dtype=torch.bool))[1][0].numpy()


IDS = [1, 17, 5, 33, 8, 17, 5, 40, 9, 12, 5, 21]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_parts_sum_to_the_score_and_softmax_reproduces_attention(family: str) -> None:
    model = FAMILIES[family]()
    weights = _attention(model, IDS)
    causal = isinstance(model, GPT)
    scores = attention_scores(model, IDS)
    assert scores.shape == weights.shape
    for layer in range(weights.shape[0]):
        for head in (0, weights.shape[1] - 1):
            for query, key in [(11, 0), (11, 6), (7, 7), (3, 2)] + ([] if causal else [(2, 9)]):
                d = decompose_score(model, IDS, layer, head, query, key)
                assert abs(d.table.sum() - d.score) < 1e-4, (layer, head, query, key)
                assert abs(sum(c["value"] for c in d.components()) - d.score) < 1e-4
                assert abs(sum(c["value"] for c in d.components(limit=5)) - d.score) < 1e-4
                np.testing.assert_allclose(d.softmax_row, weights[layer, head, query], atol=1e-4)
                np.testing.assert_allclose(d.row, scores[layer, head, query], atol=1e-4)
    if causal:  # masked cells are −inf in the scores and refused by the decomposition
        assert np.isneginf(scores[0, 0, 2, 3]) and np.isfinite(scores[0, 0, 3, 2])
        with pytest.raises(ValueError, match="causal"):
            decompose_score(model, IDS, 0, 0, 2, 3)


def test_parts_name_the_stream() -> None:
    """Layer 2 of a 3-layer GPT-2 reads the token and position embeddings, 2 × 6 heads, 2 MLPs and the biases."""
    d = decompose_score(FAMILIES["gpt2"](), IDS, 2, 1, 9, 4)
    assert d.parts[:3] == ["bias", "token", "position"]
    assert d.parts[3:] == [f"L0H{h}" for h in range(6)] + ["L0 MLP"] + [f"L1H{h}" for h in range(6)] + ["L1 MLP"]
    assert d.table.shape == (len(d.parts), len(d.parts))
    top = d.components()[0]
    assert abs(top["value"]) == np.abs(d.table).max()


def test_rope_content_and_offsets() -> None:
    """With RoPE the score at the true offset is in by_offset[i − j]; content is the score at offset 0."""
    model = FAMILIES["llama-gqa"]()
    d = decompose_score(model, IDS, 1, 2, 10, 4)
    assert d.by_offset is not None and d.content is not None
    assert abs(d.by_offset[10 - 4] - d.score) < 1e-4
    assert abs(d.by_offset[0] - d.content) < 1e-9
    assert decompose_score(FAMILIES["gpt2"](), IDS, 1, 2, 10, 4).by_offset is None


def test_sink_renormalised_row() -> None:
    d = decompose_score(FAMILIES["llama-gqa"](), IDS, 0, 0, 8, 3)
    assert d.sink_renormalised is not None and d.sink_renormalised[0] == 0.0
    np.testing.assert_allclose(d.sink_renormalised[1:], d.softmax_row[1:] / d.softmax_row[1:].sum(), atol=1e-6)
    assert decompose_score(FAMILIES["llama-gqa"](), IDS, 0, 0, 0, 0).sink_renormalised is None  # nothing else


@pytest.mark.parametrize("bad,message", [(dict(layer=3), "layer 3"), (dict(layer=-1), "layer -1"),
                                         (dict(head=6), "head 6"), (dict(query=12), "query 12"),
                                         (dict(key=-2), "key -2")])
def test_out_of_range_is_refused_in_words(bad: dict, message: str) -> None:
    args = dict(layer=0, head=0, query=5, key=2) | bad
    with pytest.raises(ValueError, match=message):
        decompose_score(FAMILIES["gpt2"](), IDS, **args)


def _check_against(model, ids: list[int], reference: np.ndarray) -> None:
    """Every layer's last query on three keys: terms sum to the score, softmax(row) = the reference attention."""
    for layer in range(reference.shape[0]):
        for head in range(0, reference.shape[1], max(1, reference.shape[1] // 3)):
            for key in (0, len(ids) // 2, len(ids) - 1):
                d = decompose_score(model, ids, layer, head, len(ids) - 1, key)
                assert abs(d.table.sum() - d.score) < 1e-4
                np.testing.assert_allclose(d.softmax_row, reference[layer, head, -1], atol=1e-4)


def test_hugging_face_gpt2_and_llama_folders_against_transformers(tmp_path) -> None:
    """Folders written by transformers: the split's softmax row is transformers' own attention."""
    import models
    from tests.tiny import tiny_gpt2_folder, tiny_llama_folder

    ids = [5, 17, 33, 2, 40, 41, 7, 9, 11, 12]
    hf_gpt2, hf_llama = tiny_gpt2_folder(tmp_path / "gpt2"), tiny_llama_folder(tmp_path / "llama")
    for folder, hf in (("gpt2", hf_gpt2), ("llama", hf_llama)):
        with torch.no_grad():
            reference = torch.stack(hf(torch.tensor([ids]), output_attentions=True).attentions, 1)[0].numpy()
        _check_against(models.load(str(tmp_path / folder)), ids, reference)


@pytest.mark.parametrize("name", ["gpt-tiny", "sst2", "minilm-sst2", "translator-en-de"])
def test_shipped_checkpoints(name: str) -> None:
    """The shipped models, fp16-packed as the app serves them: the split holds on a real sentence."""
    import models
    from models.decoding.packed import pack_linears
    from models.inputs.tokenizer import encode_input

    model = models.load(name)
    pack_linears(model)
    text = "a man in a blue shirt is riding a bicycle down the street"
    if isinstance(model, GPT):
        ids = model.encode_prompt(text)[0]
    else:
        ids = encode_input(model.tokenizer, text, model.config.max_len, type(model).__name__)[0]
    _check_against(model, ids, _attention(model, ids))
