"""models/interfaces.py: the project's models provide what the tabs rely on, method by method."""

from __future__ import annotations

import inspect
import typing

from models.families.gpt import GPT, GPTConfig
from models.interfaces import Decoder, DecoderConfig

TINY = GPTConfig(vocab_size=32, max_len=16, d_model=16, n_layers=1, n_heads=2)


def mismatches(protocol: type, cls: type) -> list[str]:
    """The protocol's methods that ``cls`` lacks or takes other parameters for (names, order, kinds, defaults):
    a call written against the interface must work on the model."""
    def params(f) -> list[tuple]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]

    methods = [n for n, v in vars(protocol).items() if not n.startswith("_") and callable(v)]
    return [n for n in methods if not callable(getattr(cls, n, None)) or params(getattr(protocol, n)) !=
            params(getattr(cls, n))]


def test_gpt_is_a_decoder() -> None:
    model = GPT(TINY)
    assert isinstance(model, Decoder)
    assert mismatches(Decoder, GPT) == []
    for field in typing.get_type_hints(DecoderConfig):
        assert isinstance(getattr(model.config, field), int), field


def test_a_decoder_that_drifts_from_the_interface_is_caught() -> None:
    class Drifted(GPT):
        def generate(self, prompt, max_new_tokens=20, strategy="greedy", temperature=1.0, top_k=0, top_p=1.0,
                     seed=0):  # the first parameter renamed: generate(text=...) would fail
            return super().generate(prompt, max_new_tokens, strategy, temperature, top_k, top_p, seed)

        logit_lens = None  # gone

    assert mismatches(Decoder, Drifted) == ["generate", "logit_lens"]


def test_mamba_is_a_decoder() -> None:
    """Mamba (no attention) provides the interface's methods but ``forward``, whose KV caches, head masks and edits are
    attention's (the tabs that call it, patching and sink ablation, refuse Mamba in words: tabs.why.require_heads);
    the head-role scores refuse in words."""
    import pytest

    from models.families.mamba import Mamba, MambaConfig

    model = Mamba(MambaConfig(vocab_size=32, d_model=16, n_layers=1, d_state=4))
    assert isinstance(model, Decoder)
    assert mismatches(Decoder, Mamba) == ["forward"]
    for field in typing.get_type_hints(DecoderConfig):
        assert isinstance(getattr(model.config, field), int), field
    ids = model.repeated_tokens(5, seed=1)
    assert len(ids) == 11 and ids[1:6] == ids[6:]
    with pytest.raises(ValueError, match="no attention heads"):
        model.head_role_scores(5)
