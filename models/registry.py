"""What each model family *is*, said once (docs/ARCHITECTURE.md §1, §7).

A ``Family`` names its module, model class and config class; the ``config.json`` "model" names (the project's
checkpoints) and Hugging Face ``model_type``s it reads; the tabs it appears in; the explanation methods it
supports; its *walk* (a function of ``models.inspect.walk``: how its residual stream is built, which the
score split reads); and what it can do, which decides what the tabs offer: whether it has heads, its score split,
whether its maps are implicit attention, how its requests batch, its notice, its view in the Positional tab.
``models.load``, ``models.io.hf``, the serving catalogue, the tabs and train/ look families up here (by config name,
model_type, tab or model) instead of keeping tables of their own or checking family names: no module outside this
one tests a family by its name (tests/test_structure.py).

Importing this module costs little (numpy, no torch): the app reads it at start-up to sort configured folders into tabs.
The classes are imported on first use (``Family.classes``), so a broken vision file never stops the text models.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from models.outputs import GRADIENT_METHODS, METHODS

ALL_METHODS = tuple(METHODS)  # every explanation method (models/inspect/attribution.py), in the UI's order
TABS = ("translate", "classify", "generate", "vision", "describe")  # "describe": Image + text (issue 63)
SPLITS = ("walk", "disentangled", "relative_bias")  # how "why a head attends" splits a score (Family.split)
BATCHES = ("alone", "lockstep")  # how a family's generation requests are served together (serving/runs.py)


@dataclass(frozen=True)
class Family:
    """One model family: one file under models/families/ and this one registration."""

    name: str  # short id ("gpt"), also the tests' parameter id
    module: str  # where the classes live
    model_class: str  # the nn.Module
    config_class: str  # its @dataclass config
    model_names: tuple[str, ...]  # config.json "model" values of the project's checkpoint folders
    # Hugging Face config.json "model_type" -> "module:function(hf_config, state, where) -> model" that reads such a
    # folder's weights into the family's class (models.io.hf calls it, then attaches the tokenizer or preprocessing)
    hf: tuple[tuple[str, str], ...] = ()
    tabs: tuple[str, ...] = ()  # the tabs that show it (a configured folder of this family goes to tabs[0])
    methods: tuple[str, ...] = ()  # explanation methods (models.inspect.attribution): () where none
    walk: str | None = None  # function of models.inspect.walk: the score split and its tests; None: no walk
    text: bool = False  # a tokenizer is attached on load (models.inputs.tokenizer)
    # what it can do (the tabs show what applies, from these; never from the family's name)
    heads: bool = True  # attention heads to pick, switch off, patch, split (False: Mamba's implicit attention)
    implicit: bool = False  # its maps are implicit attention read from a recurrence (Mamba's scan, RWKV's WKV)
    split: str | None = None  # the score split of "why a head attends" (SPLITS): "walk" (parts of the residual
    # stream, through ``walk``), "disentangled" (DeBERTa's content and position terms), "relative_bias" (T5's content
    # plus the bias of the offset's bucket); None: none
    causal_lm: bool = False  # reads a prompt and predicts the next token (Generate's decoders): patching targets
    # are tokens, not classes
    ablation: bool = False  # sink ablation and activation patching apply (a decoder's or a classifier's output)
    batch: str = "alone"  # how its generation requests are served together (BATCHES)
    notice: str | None = None  # "module:function(model) -> str": what the family changes in the views, in words
    positional: str | None = None  # its own view in the Positional tab ("relative_bias": T5's learned buckets)
    # the config keys that count a model's experts (config.json's, top level or under "config", and the loaded
    # model's config): a model with one above 0 has a mixture-of-experts feed-forward (Generate's Experts view);
    # () where the family has none
    experts: tuple[str, ...] = ()

    @property
    def hf_types(self) -> tuple[str, ...]:
        """The Hugging Face model_types this family reads."""
        return tuple(t for t, _ in self.hf)

    def hf_reader(self, model_type: str) -> Any:
        """The function that reads a Hugging Face folder of ``model_type`` into this family's class."""
        module, _, name = dict(self.hf)[model_type].partition(":")
        return getattr(importlib.import_module(module), name)

    def notice_of(self, model: Any) -> str:
        """The family's notice for ``model`` (its ``notice`` function), or ""."""
        if not self.notice:
            return ""
        module, _, name = self.notice.partition(":")
        return getattr(importlib.import_module(module), name)(model)

    def has_experts(self, config: Any) -> bool:
        """Whether a model of this family with ``config`` (a config.json already read, or a loaded model's config
        object) has a mixture of experts: one of the ``experts`` keys above 0."""
        if isinstance(config, dict):
            inner = config.get("config")
            found = [config.get(k) for k in self.experts] + (
                [inner.get(k) for k in self.experts] if isinstance(inner, dict) else [])
        else:
            found = [getattr(config, k, None) for k in self.experts]
        return any(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in found)

    def classes(self) -> tuple[type, type]:
        """(model class, config class), imported now."""
        module = importlib.import_module(self.module)
        return getattr(module, self.model_class), getattr(module, self.config_class)


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add a family; a name, config name or model_type that another family already claims is an error."""
    for other in FAMILIES.values():
        taken = (set(other.model_names) & set(family.model_names)) | (set(other.hf_types) & set(family.hf_types))
        if other.name == family.name or taken:
            raise ValueError(f"family {family.name!r} clashes with {other.name!r}: {sorted(taken) or family.name}")
    unknown = set(family.methods) - set(ALL_METHODS) | set(family.tabs) - set(TABS)
    unknown |= ({family.split} - {None, *SPLITS}) | ({family.batch} - set(BATCHES))
    if family.split == "walk" and family.walk is None:
        unknown.add("split 'walk' without a walk")
    if unknown:
        raise ValueError(f"family {family.name!r}: unknown methods or tabs {sorted(unknown)}")
    FAMILIES[family.name] = family
    return family


register(Family("translator", "models.families.translator", "Translator", "TranslatorConfig", ("Translator",),
                (("marian", "models.io.hf_translators:marian_from_state"),),
                tabs=("translate",), walk="translator", text=True, split="walk"))
# T5: a Translator subclass with its own attention (models/families/t5.py); its "why" split and scores are its own
# (content + relative position bias), not the walk's
register(Family("t5", "models.families.t5", "T5", "T5Config", (), (("t5", "models.io.hf_translators:t5_from_state"),),
                tabs=("translate",), text=True, split="relative_bias", positional="relative_bias"))
register(Family("classifier", "models.families.classifier", "TextClassifier", "ClassifierConfig",
                ("TextClassifier",), tabs=("classify",), methods=ALL_METHODS, walk="text_classifier", text=True,
                split="walk", ablation=True))
register(Family("bert", "models.families.bert", "BertClassifier", "BertConfig", ("BertClassifier",),
                (("bert", "models.io.hf:bert_classifier_from_state"),
                 ("roberta", "models.io.hf_encoders:roberta_classifier_from_state"),
                 ("distilbert", "models.io.hf_encoders:distilbert_classifier_from_state"),
                 ("electra", "models.io.hf_encoders:electra_classifier_from_state"),
                 ("albert", "models.io.hf_encoders:albert_classifier_from_state")),
                tabs=("classify",), methods=ALL_METHODS, walk="bert", text=True, split="walk", ablation=True))
register(Family("deberta", "models.families.deberta", "DebertaClassifier", "DebertaConfig", ("DebertaClassifier",),
                (("deberta-v2", "models.io.hf_encoders:deberta_v2_classifier_from_state"),),
                tabs=("classify",), methods=ALL_METHODS, text=True, split="disentangled", ablation=True))
register(Family("gpt", "models.families.gpt", "GPT", "GPTConfig", ("GPT",),
                (("gpt2", "models.io.hf:gpt2_from_state"), ("llama", "models.io.hf:llama_from_state"),
                 # the later decoders: LLaMA's block with GPTConfig's switches (models/io/hf_decoders.py)
                 ("qwen2", "models.io.hf_decoders:qwen2_from_state"),
                 ("qwen3", "models.io.hf_decoders:qwen3_from_state"),
                 ("mistral", "models.io.hf_decoders:mistral_from_state"),
                 ("phi3", "models.io.hf_decoders:phi3_from_state"),
                 ("gemma", "models.io.hf_decoders:gemma_from_state"),
                 ("gemma2", "models.io.hf_decoders:gemma2_from_state"),
                 ("gemma3_text", "models.io.hf_decoders:gemma3_from_state"),
                 ("mixtral", "models.io.hf_decoders:mixtral_from_state"),
                 ("gpt_neox", "models.io.hf_decoders:gpt_neox_from_state")),
                tabs=("generate",), walk="gpt", text=True, split="walk", causal_lm=True, ablation=True,
                batch="lockstep", notice="models.families.gpt:notice",
                experts=("n_experts", "num_local_experts")))  # GPTConfig's, a Mixtral config.json's
# RWKV-4: its WKV recurrence is a causal softmax per channel with a decay linear in the distance, drawn as such
register(Family("rwkv", "models.families.rwkv", "Rwkv", "RwkvConfig", (),
                (("rwkv", "models.io.hf_rwkv:rwkv_from_state"),), tabs=("generate",), text=True,
                heads=False, implicit=True, causal_lm=True, notice="models.families.rwkv:notice"))
register(Family("mamba", "models.families.mamba", "Mamba", "MambaConfig", ("Mamba",),
                (("mamba", "models.io.hf_decoders:mamba_from_state"),), tabs=("generate",), text=True,
                heads=False, implicit=True, causal_lm=True, notice="models.families.mamba:notice"))
# Qwen3-Next: Gated DeltaNet and gated softmax layers interleaved, experts with a shared one; one map per layer, each
# layer's kind in its title (models/families/qwen3_next.py)
register(Family("qwen3_next", "models.families.qwen3_next", "Qwen3Next", "Qwen3NextConfig", (),
                (("qwen3_next", "models.io.hf_qwen3_next:qwen3_next_from_state"),), tabs=("generate",), text=True,
                heads=False, implicit=True, causal_lm=True, notice="models.families.qwen3_next:notice"))
register(Family("vit", "models.families.vit", "ViT", "ViTConfig", ("ViT",),
                (("vit", "models.io.hf:vit_classifier_from_state"),), tabs=("vision",), methods=ALL_METHODS))
register(Family("deit", "models.families.deit", "DeiT", "DeiTConfig", ("DeiT",),
                (("deit", "models.io.hf_vision:deit_from_state"),), tabs=("vision",), methods=ALL_METHODS))
register(Family("swin", "models.families.swin", "Swin", "SwinConfig", ("Swin",),
                (("swin", "models.io.hf_vision:swin_from_state"),), tabs=("vision",),
                methods=GRADIENT_METHODS))  # attention local to windows: nothing global to roll out or trace back
# vision-language models: describe(image, text, max_new_tokens) -> models.outputs.DescribeResult (issue 63)
register(Family("vlm", "models.families.vlm", "VLM", "VLMConfig", ("VLM",), tabs=("describe",), text=True))
# Hugging Face vision-language folders: a CLIP/SigLIP tower, a projector and gpt.py's GPT (models/families/hf_vlm.py)
register(Family("llava", "models.families.hf_vlm", "Llava", "HFVLMConfig", (),
                (("llava", "models.io.hf_vlm:llava_from_state"),), tabs=("describe",), text=True))
register(Family("idefics3", "models.families.hf_vlm", "Idefics3", "HFVLMConfig", (),
                (("idefics3", "models.io.hf_vlm:idefics3_from_state"),), tabs=("describe",), text=True))
# Qwen2.5-VL: its own tower (window attention, 2D rotary, the 2 × 2 merger) and a Qwen2 LM with M-RoPE
register(Family("qwen2_5_vl", "models.families.hf_vlm", "Qwen25VL", "HFVLMConfig", (),
                (("qwen2_5_vl", "models.io.hf_vlm:qwen2_5_vl_from_state"),), tabs=("describe",), text=True))
register(Family("paligemma", "models.families.hf_vlm", "PaliGemma", "HFVLMConfig", (),
                (("paligemma", "models.io.hf_vlm:paligemma_from_state"),), tabs=("describe",), text=True))


def by_model_name(name: str) -> Family | None:
    """The family whose checkpoints say ``"model": name`` in config.json."""
    return next((f for f in FAMILIES.values() if name in f.model_names), None)


def by_model_type(model_type: str) -> Family | None:
    """The family that reads Hugging Face folders of this ``model_type``."""
    return next((f for f in FAMILIES.values() if model_type in f.hf_types), None)


def by_tab(tab: str) -> list[Family]:
    """The families a tab shows, in registration order."""
    return [f for f in FAMILIES.values() if tab in f.tabs]


def tab_of(meta: dict[str, Any]) -> str | None:
    """The tab a folder's config.json (already read) belongs to: its "model_type" (Hugging Face) or "model"."""
    model_type, name = meta.get("model_type"), meta.get("model")
    family = (by_model_type(model_type) if isinstance(model_type, str) else None) or (
        by_model_name(name) if isinstance(name, str) else None)
    return family.tabs[0] if family and family.tabs else None


def hf_types() -> list[str]:
    """Every Hugging Face model_type some family reads (for messages)."""
    return [t for f in FAMILIES.values() for t in f.hf_types]


def family_of(model: Any) -> Family:
    """The family of a model object: its class or the nearest registered base class (a subclass of a family's
    class belongs to it unless registered itself). Raises TypeError for an unregistered model."""
    for cls in type(model).__mro__:
        for f in FAMILIES.values():
            if cls.__name__ == f.model_class and cls.__module__ == f.module:
                return f
    raise TypeError(f"{type(model).__name__} is not a registered model family ({', '.join(FAMILIES)})")


def is_family(model: Any, *names: str) -> bool:
    """Whether ``model`` belongs to one of the named families (instead of checking its class name)."""
    try:
        return family_of(model).name in names
    except TypeError:
        return False
