"""Hugging Face folders without a tokenizer.json: BERT's vocab.txt and GPT-2's vocab.json + merges.txt give
the same ids as transformers' own tokenizers read from the same files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

TEXTS = ["The film is warm and funny.", "naïve Café résumé — ok?", "un-believable!!! [CLS] 42", "  spaced   out  ",
         "中文 and emoji 🎬", "", "the cat sat on the mat , the cat sat"]


def test_bert_vocab_txt_encodes_as_transformers(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    import models
    from tests.tiny import tiny_bert_classifier_folder

    folder = tmp_path / "bert"
    tiny_bert_classifier_folder(folder)
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    (folder / "vocab.txt").write_text("\n".join(sorted(vocab, key=vocab.get)) + "\n", encoding="utf-8")
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True,
                                                             "tokenizer_class": "BertTokenizer"}))
    theirs = AutoTokenizer.from_pretrained(folder)
    ours = models.load(folder).tokenizer
    for text in TEXTS:
        assert ours.encode_prompt(text)[0] == theirs(text)["input_ids"], text


def test_gpt2_vocab_and_merges_encode_as_transformers(tmp_path: Path) -> None:
    from transformers import GPT2Tokenizer

    import models
    from tests.tiny import tiny_gpt2_folder

    folder = tmp_path / "gpt2"
    tiny_gpt2_folder(folder)
    spec = json.loads((folder / "tokenizer.json").read_text())["model"]
    (folder / "vocab.json").write_text(json.dumps(spec["vocab"]), encoding="utf-8")
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["merges"]]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    (folder / "tokenizer.json").unlink()
    theirs = GPT2Tokenizer(vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"))
    ours = models.load(folder).tokenizer
    for text in TEXTS:
        assert ours.encode_prompt(text)[0] == theirs(text)["input_ids"], text
    assert ours.decode(ours.encode_prompt(TEXTS[0])[0]) == TEXTS[0]


def test_roberta_vocab_and_merges_classify_as_transformers(tmp_path: Path) -> None:
    """A RoBERTa classifier published with vocab.json + merges.txt and no tokenizer.json (as
    cardiffnlp/twitter-roberta-base-sentiment-latest, the Classify tab's Hub RoBERTa): transformers' ids,
    <s> … </s> included, and its probabilities."""
    import torch
    from transformers import AutoTokenizer, RobertaForSequenceClassification

    import models
    from tests.families import classifier_folder

    folder = tmp_path / "roberta"
    classifier_folder("roberta", folder)
    spec = json.loads((folder / "tokenizer.json").read_text())["model"]
    (folder / "vocab.json").write_text(json.dumps(spec["vocab"]), encoding="utf-8")
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["merges"]]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink(missing_ok=True)
    theirs = AutoTokenizer.from_pretrained(folder)  # from the two files, as transformers reads such a repository
    hf = RobertaForSequenceClassification.from_pretrained(folder).eval()
    ours = models.load(folder)
    for text in TEXTS:
        want = theirs(text)["input_ids"]
        assert want[0] == theirs.bos_token_id and want[-1] == theirs.eos_token_id
        assert ours.tokenizer.encode_prompt(text)[0] == want, text
        if text.strip():  # Classify refuses a blank text; it reads the ids its tokenizer makes of the rest
            with torch.no_grad():
                probs = torch.softmax(hf(torch.tensor([ours.tokenizer.encode(text).ids])).logits[0], -1).numpy()
            assert abs(ours.classify(text).probs - probs).max() < 1e-4, text


def test_folder_without_any_tokenizer_is_refused(tmp_path: Path) -> None:
    import models
    from models.io.checkpoint import CheckpointError
    from tests.tiny import tiny_gpt2_folder

    tiny_gpt2_folder(tmp_path / "gpt2")
    (tmp_path / "gpt2" / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"no tokenizer.json \(nor vocab.json and merges.txt\)"):
        models.load(tmp_path / "gpt2")
