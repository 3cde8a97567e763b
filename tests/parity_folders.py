"""The random-weight Hugging Face folder of every model_type the registry reads, for tests/test_parity.py (test-only).

In the manner of transformers' model testers: each ``Case`` names a model_type of ``models.registry.hf_types()``, the
comparison its kind needs (tests/test_parity.py: ``decoder``, ``mamba``, ``hybrid``, ``classifier``, ``translator``,
``vision``, ``vlm``) and the function that writes the folder with transformers itself (the writers live in
tests/tiny.py, tests/tiny_families.py, tests/families.py and tests/vlm_folders.py: small, unusual but valid configs). A
model_type may have several cases (the same family with other switches: tied and untied tables, partial rotary, encoder
and decoder feed-forwards of different widths, a Swin grid that is not a multiple of the window). A registered
model_type without a case fails tests/test_parity.py by name.

Adding a family: write its folder in one of the writer modules and add its ``Case`` here; the parity test then reads
it through ``models.load`` and compares it with transformers. ``Folders`` writes each case's folder on first use and
keeps it for the session (tests/conftest.py's ``hf_folders``), so a family's own test file reads the same folder
instead of writing another.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import families as fam
from tests import tiny, tiny_families, vlm_folders

KINDS = ("decoder", "mamba", "hybrid", "classifier", "translator", "vision", "vlm")


@dataclass
class Ref:
    """What transformers wrote: its model (eval, eager attention) and what reads its inputs."""

    model: Any
    tokenizer: Any = None  # text families: the transformers tokenizer of the folder
    processor: str = ""  # vision families: the transformers image processor class that reads the folder's config
    multimodal: Any = None  # vision-language families: transformers' processor of the folder (image and text)


@dataclass(frozen=True)
class Case:
    name: str  # the test id: the model_type, or "model_type-variant"
    model_type: str  # config.json's model_type: one of models.registry.hf_types()
    kind: str  # the comparison (KINDS)
    write: Callable[[Path], Ref]  # writes the folder, returns transformers' side
    # what the folder must have turned on in our model: an attribute path of the loaded model ("config.kv_heads")
    # -> its value (a switch not read fails here by name, before the numbers do)
    expect: dict[str, Any] = field(default_factory=dict)
    # translators: the folder makes eos likely, so some searches end by choosing it before their limit (an untied
    # random output matrix does not favour eos)
    ends_early: bool = True


def _vlm(writer: Callable[..., tuple[Any, Any]], **kwargs: Any) -> Callable[[Path], Ref]:
    def write(folder: Path) -> Ref:
        model, processor = writer(folder, **kwargs)
        return Ref(model, processor.tokenizer, multimodal=processor)
    return write


def _decoder(name: str) -> Callable[[Path], Ref]:
    return lambda folder: Ref(tiny_families.decoder_folder(folder, name))


def _classifier(family: str) -> Callable[[Path], Ref]:
    def write(folder: Path) -> Ref:
        model, tok = fam.classifier_folder(family, folder)
        return Ref(model, tok)
    return write


def _bert(folder: Path) -> Ref:
    from transformers import PreTrainedTokenizerFast

    model = tiny.tiny_bert_classifier_folder(folder)
    return Ref(model, PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json")))


def _marian(**kwargs: Any) -> Callable[[Path], Ref]:
    def write(folder: Path) -> Ref:
        model, tok = fam.marian_folder(folder, **kwargs)
        return Ref(model, tok)
    return write


def _t5(feed_forward: str, tied: bool, layers: tuple[int, int]) -> Callable[[Path], Ref]:
    def write(folder: Path) -> Ref:
        model, tok = fam.t5_folder(folder, feed_forward, tied, layers)
        return Ref(model, tok)
    return write


PROMPT = "translate English to German: "
CLASSES = ["negative", "neutral", "positive"]
PICTURES = ["cat", "dog", "bird", "fish"]

CASES: tuple[Case, ...] = (
    # decoders: logits, every layer's attention, greedy ids
    Case("gpt2", "gpt2", "decoder", lambda f: Ref(tiny.tiny_gpt2_folder(f, std=0.1)),
         {"config.recipe": "gpt2", "config.n_layers": 3}),
    Case("llama", "llama", "decoder", lambda f: Ref(tiny.tiny_llama_folder(f)),
         {"config.kv_heads": 2, "config.rope_layout": "half", "config.bos_id": 0}),
    *(Case(name, name.split("-")[0], "decoder", _decoder(name)) for name in tiny_families.FAMILIES),
    # RWKV-4 (no attention either): the same comparison as Mamba's (tests/test_parity.py: logits, every block's hidden
    # state, greedy ids through the recurrent state)
    Case("rwkv", "rwkv", "mamba", lambda f: Ref(tiny_families.rwkv_folder(f)),
         {"config.tie_embeddings": False, "config.rescale_every": 2, "config.d_hidden": 72, "config.norm_eps": 1e-3}),
    Case("mamba", "mamba", "mamba", lambda f: Ref(tiny_families.mamba_folder(f)),
         {"config.tie_embeddings": False, "config.d_inner": 120}),
    # hybrids (Qwen3-Next): logits, every hidden state, the softmax layers' attention, greedy ids
    Case("qwen3_next", "qwen3_next", "hybrid", lambda f: Ref(tiny_families.qwen3_next_folder(f)),
         {"config.kinds": ("linear", "full", "linear", "linear", "full"), "config.rotary_dim": 4,
          "config.sparse": (False, True, False, True, False), "config.tie_embeddings": False}),
    # the layer kinds from full_attention_interval, experts on every layer but the dense-only one, the kept experts'
    # probabilities not renormalised, tied tables, one key head per value head
    Case("qwen3_next-interval", "qwen3_next", "hybrid",
         lambda f: Ref(tiny_families.qwen3_next_folder(f, seed=1, layer_types=None, full_attention_interval=2,
                                                       num_hidden_layers=3, decoder_sparse_step=1,
                                                       mlp_only_layers=[2], norm_topk_prob=False,
                                                       linear_num_value_heads=2, tie_word_embeddings=True)),
         {"config.kinds": ("linear", "full", "linear"), "config.sparse": (True, True, False),
          "config.norm_topk": False, "config.tie_embeddings": True}),
    # classifiers: tokens, class probabilities, every layer's attention, a batch as each alone
    Case("bert", "bert", "classifier", _bert, {"labels": CLASSES, "config.pooling": "pooler"}),
    *(Case(f, f, "classifier", _classifier(f), {"labels": list(fam.LABELS), "config.family": f})
      for f in ("roberta", "distilbert", "electra", "albert", "deberta-v2")),
    # translators: source ids, greedy and beam output and text, encoder, decoder and cross-attention
    Case("marian", "marian", "translator", _marian(shared=True),
         {"config.family": "marian", "config.tie_embeddings": True}),
    Case("marian-untied", "marian", "translator", _marian(shared=False),
         {"config.family": "marian", "config.tie_embeddings": False}, ends_early=False),
    # encoder and decoder feed-forwards of different widths (valid in MarianConfig, rare in released models)
    Case("marian-ffn", "marian", "translator", _marian(shared=True, ffn=(60, 44)),
         {"config.d_ff": 60, "config.decoder_ff": 44}, ends_early=False),
    Case("t5", "t5", "translator", _t5("gated-gelu", False, (3, 2)),
         {"config.family": "t5", "config.gated": True, "config.tie_output": False, "config.scale_output": False,
          "config.n_enc_layers": 3, "config.n_dec_layers": 2, "config.prefix": PROMPT, "config.bos_id": 0,
          "config.eos_id": 1}),
    # transformers 5 generates T5 only with decoder depth ≤ encoder depth
    Case("t5-relu-tied", "t5", "translator", _t5("relu", True, (5, 3)),
         {"config.family": "t5", "config.gated": False, "config.tie_output": True, "config.scale_output": True,
          "config.n_enc_layers": 5, "config.n_dec_layers": 3, "config.prefix": PROMPT}),
    # vision: pixels, class probabilities, every layer's (every block's window) attention
    Case("vit", "vit", "vision", lambda f: Ref(tiny.tiny_vit_classifier_folder(f), processor="ViTImageProcessor"),
         {"labels": PICTURES, "config.input": "processor"}),
    Case("deit", "deit", "vision", lambda f: Ref(fam.deit_folder(f, True), processor="DeiTImageProcessor"),
         {"labels": list(fam.VISION_LABELS), "num_prefix_tokens": 2, "config.distilled": True}),
    Case("deit-plain", "deit", "vision", lambda f: Ref(fam.deit_folder(f, False), processor="DeiTImageProcessor"),
         {"num_prefix_tokens": 2, "config.distilled": False}),
    Case("swin", "swin", "vision", lambda f: Ref(fam.swin_folder(f), processor="ViTImageProcessor"),
         {"labels": list(fam.VISION_LABELS[:3]), "config.input": "processor"}),
    # grids that are not a multiple of the window: 18 × 18 tokens in windows of 5 (padded to 20), merged to 9 × 9
    # (padded to 10, and padded to 10 before merging), then 5 × 5, one window, its shift dropped
    Case("swin-padded", "swin", "vision", lambda f: Ref(fam.swin_folder(f, image_size=36, patch=2, window=5,
                                                                        depths=(2, 2, 2), heads=(2, 3, 4),
                                                                        head_scale=8.0),
                                                         processor="ViTImageProcessor"),
         {"config.window": 5, "grid": (18, 18)}),
    # vision-language (tests/vlm_parity.py): pixels, prompt layout, greedy ids, the LM's and the tower's attention
    Case("llava", "llava", "vlm", _vlm(vlm_folders.llava_folder),
         {"config.select": "default", "config.feature_layers": (-2,), "tower.prefix": 1, "lm.config.kv_heads": 3}),
    # SigLIP (no class token), every token kept, two feature layers concatenated, a Qwen2 LM (q/k/v biases)
    Case("llava-siglip-qwen2", "llava", "vlm", _vlm(vlm_folders.llava_folder, text="qwen2", tower="siglip",
                                                    select="full", layer=[-3, -1]),
         {"config.select": "full", "config.feature_layers": (-3, -1), "tower.prefix": 0, "lm.config.qkv_bias": True}),
    # CLIP with its class token kept as an image token, the last block's output, a Mistral LM
    Case("llava-full-mistral", "llava", "vlm", _vlm(vlm_folders.llava_folder, text="mistral", select="full",
                                                    layer=-1),
         {"config.select": "full", "config.feature_layers": (-1,), "tower.prefix": 1}),
    Case("idefics3", "idefics3", "vlm", _vlm(vlm_folders.idefics3_folder),
         {"config.scale_factor": 2, "config.image_seq_len": 16, "splits": True}),
    # no splitting: the global view alone
    Case("idefics3-global", "idefics3", "vlm", _vlm(vlm_folders.idefics3_folder, split=False),
         {"splits": False}),
    # Qwen2.5-VL: dynamic resolution (one image over its pixel budget), window and full attention in the tower, the
    # 2 × 2 merger, M-RoPE over uneven sections, grouped-query heads, untied output
    Case("qwen2_5_vl", "qwen2_5_vl", "vlm", _vlm(vlm_folders.qwen2_5_vl_folder),
         {"config.tower.full_blocks": (1,), "config.tower.window_tokens": 2, "lm.config.mrope_section": (1, 2, 3),
          "lm.config.kv_heads": 2, "lm.config.tie_embeddings": False}),
    # a Gemma prefix LM (the prompt read both ways), SigLIP through its final LayerNorm, one Linear; an untied output
    # (a tied random Gemma repeats its last token: the √d-scaled embedding dominates; tests/test_vlm_families.py
    # checks the tied folder's logits and attention)
    Case("paligemma", "paligemma", "vlm", _vlm(vlm_folders.paligemma_folder, seed=2, tied=False),
         {"config.select": "full", "tower.prefix": 0, "lm.config.prefix_lm": True, "lm.spec.prefix_lm": True,
          "lm.config.tie_embeddings": False, "lm.config.d_head": 16, "lm.config.kv_heads": 3}),
    # PaliGemma 2: Gemma 2 (attention soft-capping, sandwich norms, a 24-token window on layers 0 and 2 shorter than the
    # prompt, which the prefix still reads whole)
    Case("paligemma-gemma2", "paligemma", "vlm", _vlm(vlm_folders.paligemma_folder, seed=2, tied=False, text="gemma2"),
         {"config.text_type": "gemma2", "lm.config.prefix_lm": True, "lm.config.attn_softcap": 3.0,
          "lm.config.sliding_window": 24, "lm.config.layer_types": ("sliding", "full", "sliding"),
          "lm.config.sandwich_norm": True}),
)

WRITERS: dict[str, list[Case]] = {}
for _case in CASES:
    WRITERS.setdefault(_case.model_type, []).append(_case)
BY_NAME: dict[str, Case] = {c.name: c for c in CASES}


@dataclass
class Built:
    """One written folder: where, transformers' side, and our model read from it (``models.load``, once)."""

    case: Case
    path: Path
    ref: Ref
    _model: Any = None

    @property
    def model(self) -> Any:
        if self._model is None:
            import models

            self._model = models.load(str(self.path))
        return self._model


class Folders:
    """Each case's folder, written under ``root`` on first use and kept (tests/conftest.py: one per session)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._built: dict[str, Built] = {}

    def get(self, name: str) -> Built:
        if name not in self._built:
            case = BY_NAME[name]
            path = self.root / name
            self._built[name] = Built(case, path, case.write(path))
        return self._built[name]
