"""What the text tabs' shared sections need of a model (docs/ARCHITECTURE.md §2): a text model by name (any model
of Generate, Classify or Translate, from the serving catalogue) and a text's ids and tokens exactly as that model
reads them."""

from __future__ import annotations

from models import registry
from serving import catalogue
from tabs.common import Error, get_model

MAX_PATCH_CHARS = 4000  # each patching input; the model's token cap applies after


def text_model(name: str):
    """A text model by name: any model of Generate, Classify or Translate (``serving.catalogue.text_models``)."""
    names = catalogue.text_models()
    if name not in names:
        raise Error(f"Unknown model {name!r}; choose one of {', '.join(names)}.")
    return get_model(name)


def require_heads(net, view: str) -> None:
    """A view built on attention heads refuses, in words, a model that has none (Mamba: its implicit attention is
    read from a state-space scan, with no query, key or head to split, switch off or patch)."""
    if not registry.family_of(net).heads:
        from models.families.mamba import NOT_APPLICABLE

        # a family that says its own reason (Qwen3-Next's one map per layer) has it on the model
        raise Error(f"{view} does not apply to this model. {getattr(net, 'NOT_APPLICABLE', NOT_APPLICABLE)}")


def encode(net, text: str) -> tuple[list[int], list[str], str]:
    """Ids and tokens of a text exactly as the model reads it (specials included), capped at its limit."""
    if registry.family_of(net).causal_lm:  # a decoder reads its prompt as Generate encodes it
        ids, tokens = net.encode_prompt(text)
        limit = net.context_limit()
        if not ids:
            raise Error("The text has no tokens.")
        if len(ids) > limit:  # keep the start: BOS and the first tokens, as a reader would
            return ids[:limit], tokens[:limit], f"Input shortened to its first {limit} tokens (it had {len(ids)})."
        return ids, tokens, ""
    from models.inputs.tokenizer import encode_input

    ids, tokens, notice = encode_input(net.tokenizer, text, net.config.max_len, type(net).__name__)
    return list(ids), list(tokens), notice
