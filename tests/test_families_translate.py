"""Marian (opus-mt) folders read into the Translator (models/io/hf_translators.py): their tokens, searches and attention
against transformers are tests/test_parity.py's (the folders: tests/parity_folders.py, shared and untied tables).
Here: the Translate tab names an unknown model and the choices."""

from __future__ import annotations

import pytest


def test_translate_tab_refuses_an_unknown_model_by_name() -> None:
    """The function behind /translate names an unknown model and the choices, whatever called it."""
    from tabs import translate
    from tabs.common import Error

    assert translate.translator_models()[:2] == ["translator-en-de", "Helsinki-NLP/opus-mt-en-de"]
    with pytest.raises(Error, match="no-such-model.*translator-en-de"):
        translate._model("no-such-model")

