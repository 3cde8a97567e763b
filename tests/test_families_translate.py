"""Marian (opus-mt) folders read into the Translator (models/io/hf_translators.py): their tokens, searches and attention
against transformers are tests/test_parity.py's (the folders: tests/parity_folders.py, shared and untied tables, encoder
and decoder feed-forwards of different widths). Here: the Translate tab names an unknown model and the choices; a Marian
folder with encoder and decoder of different head counts is refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import models
from models.io.checkpoint import CheckpointError


def test_translate_tab_refuses_an_unknown_model_by_name() -> None:
    """The function behind /translate names an unknown model and the choices, whatever called it."""
    from tabs import translate
    from tabs.common import Error

    assert translate.translator_models()[:2] == ["translator-en-de", "Helsinki-NLP/opus-mt-en-de"]
    with pytest.raises(Error, match="no-such-model.*translator-en-de"):
        translate._model("no-such-model")


def test_different_head_counts_are_refused(hf_folders, tmp_path: Path) -> None:
    """Different feed-forward widths read (tests/test_parity.py's marian-ffn); different head counts are refused."""
    where = hf_folders.get("marian").path
    bad = Path(shutil.copytree(where, tmp_path / "bad"))
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "decoder_attention_heads": 2}))
    with pytest.raises(CheckpointError, match="different head counts"):
        models.load(str(bad))
