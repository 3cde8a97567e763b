"""Every registered model family (models/registry.py), as timm's tests run over ``list_models()``: a tiny model of it
loads through ``models.load`` into its own class, runs its tab's entry point with every attention row summing to 1,
round-trips a checkpoint with the same answer, offers its registered explanation methods, and its walk (if any)
covers every layer. A family registered without a tiny model here fails ``test_every_family_has_a_tiny_model``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from models import registry

# family -> its tiny checkpoint among tests/tiny.py's (None: built here)
TINY = {"translator": "translator-en-de", "classifier": "sst2", "bert": "minilm-sst2", "gpt": "gpt-tiny",
        "vit": "vit-fashion", "swin": "swin-fashion", "deit": None, "deberta": None, "mamba": None, "t5": None,
        "vlm": None, "llava": None, "idefics3": None, "qwen2_5_vl": None, "paligemma": None,
        "qwen3_next": None}


def tiny_deit(folder: Path) -> Path:
    import torch

    from models.families.deit import DeiT, DeiTConfig
    from models.io.checkpoint import save_checkpoint
    from tests.tiny import FASHION

    torch.manual_seed(0)
    model = DeiT(DeiTConfig(dim=32, depth=2, heads=4, mlp_dim=64, dropout=0.0))
    return save_checkpoint(folder, model, labels=FASHION, text={})


def tiny_mamba(folder: Path) -> Path:
    """A random Mamba (models/families/mamba.py) in the project's checkpoint format, with tests/tiny.py's tokenizer."""
    import sentencepiece as spmlib
    import torch

    from models.families.mamba import Mamba, MambaConfig
    from models.io.checkpoint import save_checkpoint
    from tests.tiny import train_sentencepiece

    sp = train_sentencepiece(folder.parent / "_spm")
    vocab = spmlib.SentencePieceProcessor(model_file=str(sp)).get_piece_size()
    torch.manual_seed(0)
    model = Mamba(MambaConfig(vocab_size=vocab, d_model=32, n_layers=2, d_state=4, bos_id=1, eos_id=2, pad_id=0))
    return save_checkpoint(folder, model, labels=[], text={"lowercase": False}, extra_files={"tokenizer.model": sp})



def tiny_deberta(folder: Path) -> Path:
    """A tiny random DebertaClassifier checkpoint (log buckets reached: k = 8) with the tiny WordPiece tokenizer."""
    import torch

    from models.families.deberta import DebertaClassifier, DebertaConfig
    from models.io.checkpoint import save_checkpoint
    from tests.tiny import WORDS, tiny_wordpiece

    tok = tiny_wordpiece(folder.parent / "_deberta_tok")
    torch.manual_seed(0)
    model = DebertaClassifier(DebertaConfig(vocab_size=5 + len(WORDS), d_model=32, n_layers=2, n_heads=4, d_ff=64,
                                            max_positions=64, max_len=16, dropout=0.0, attention_dropout=0.0,
                                            pooling="pooler", position_buckets=8, max_relative_positions=32))
    return save_checkpoint(folder, model, labels=["negative", "positive"], text={"lowercase": True},
                           extra_files={"tokenizer.json": tok})


def tiny_t5(folder: Path) -> Path:
    """A random T5 Hugging Face folder (tests/families.py; T5 has no checkpoint format of the project's own)."""
    from tests.families import t5_folder

    t5_folder(folder)
    return folder


def tiny_vlm(folder: Path) -> Path:
    """A random VLM (models/families/vlm.py) with the scenes' word-level tokenizer."""
    import torch

    from models.families.vlm import VLM, VLMConfig
    from models.io.checkpoint import save_checkpoint
    from train.scenes import TEXT, VOCAB, write_tokenizer

    tok = write_tokenizer(folder.parent / "_vlm_tok" / "tokenizer.json")
    torch.manual_seed(0)
    model = VLM(VLMConfig(image_size=32, vision_dim=16, vision_depth=1, vision_heads=2, vision_mlp=32,
                          vocab_size=len(VOCAB), max_len=48, d_model=32, n_layers=2, n_heads=2))
    return save_checkpoint(folder, model, labels=[], text=TEXT, extra_files={"tokenizer.json": tok})


def tiny_llava(folder: Path) -> Path:
    """A random LLaVA Hugging Face folder written by transformers (tests/vlm_folders.py)."""
    from tests.vlm_folders import llava_folder

    llava_folder(folder)
    return folder


def tiny_idefics3(folder: Path) -> Path:
    """A random Idefics3 (SmolVLM) Hugging Face folder written by transformers (tests/vlm_folders.py)."""
    from tests.vlm_folders import idefics3_folder

    idefics3_folder(folder)
    return folder


def tiny_qwen2_5_vl(folder: Path) -> Path:
    """A random Qwen2.5-VL Hugging Face folder written by transformers (tests/vlm_folders.py)."""
    from tests.vlm_folders import qwen2_5_vl_folder

    qwen2_5_vl_folder(folder)
    return folder


def tiny_paligemma(folder: Path) -> Path:
    """A random PaliGemma Hugging Face folder written by transformers (tests/vlm_folders.py)."""
    from tests.vlm_folders import paligemma_folder

    paligemma_folder(folder)
    return folder


def tiny_qwen3_next(folder: Path) -> Path:
    """A random Qwen3-Next Hugging Face folder written by transformers (tests/tiny_families.py)."""
    from tests.tiny_families import qwen3_next_folder

    qwen3_next_folder(folder)
    return folder


# families whose tiny model is built here
BUILT = {"deit": tiny_deit, "deberta": tiny_deberta, "mamba": tiny_mamba, "t5": tiny_t5, "vlm": tiny_vlm,
         "llava": tiny_llava, "idefics3": tiny_idefics3, "qwen2_5_vl": tiny_qwen2_5_vl, "paligemma": tiny_paligemma,
         "qwen3_next": tiny_qwen3_next}


def entry_point(model, tab: str):
    """The tab's entry point on a small input."""
    from tabs.common import EXAMPLE_IMAGES

    if tab == "translate":
        return model.translate("A dog runs in the park.", beam_size=2)
    if tab == "classify":
        return model.classify("a warm and funny film")
    if tab == "generate":
        return model.generate("the cat sat", max_new_tokens=3)
    if tab == "describe":
        return model.describe(EXAMPLE_IMAGES[0], "what is at the top left ?", max_new_tokens=3)
    return model.classify(EXAMPLE_IMAGES[0])


def answer(result) -> object:
    """What must survive a checkpoint round trip: the text, or the class probabilities."""
    return result.text if hasattr(result, "text") else np.round(result.probs, 5).tolist()


def tiny_rwkv(folder: Path) -> Path:
    """A random RWKV-4 Hugging Face folder written by transformers (tests/tiny_families.py)."""
    from tests.tiny_families import rwkv_folder

    rwkv_folder(folder)
    return folder


TINY["rwkv"], BUILT["rwkv"] = None, tiny_rwkv  # RWKV-4: no tiny checkpoint, a folder built here


def test_every_family_has_a_tiny_model() -> None:
    assert set(TINY) == set(registry.FAMILIES)
    for family in registry.FAMILIES.values():
        assert family.tabs and set(family.tabs) <= set(registry.TABS)


def test_lookups() -> None:
    assert registry.by_model_name("GPT").name == "gpt" and registry.by_model_type("llama").name == "gpt"
    assert registry.by_model_type("deit").name == "deit" and registry.by_model_name("nope") is None
    assert [f.name for f in registry.by_tab("vision")] == ["vit", "deit", "swin"]
    assert registry.tab_of({"model_type": "bert"}) == "classify" and registry.tab_of({"model": "Translator"}) == \
        "translate" and registry.tab_of({"model_type": "t5"}) == "translate"
    assert registry.tab_of({"model_type": "reformer"}) is None
    with pytest.raises(ValueError, match="clashes"):
        registry.register(registry.Family("gpt-again", "m", "C", "Cfg", ("GPT",)))
    with pytest.raises(TypeError, match="not a registered model family"):
        registry.family_of(object())


@pytest.mark.parametrize("name", sorted(TINY))
def test_every_family_loads_runs_and_round_trips(name: str, tiny_checkpoints: Path, tmp_path: Path) -> None:
    import models
    from models.inspect.attribution import methods_for
    from models.inspect.walk import plan
    from models.io.checkpoint import save_checkpoint

    family = registry.FAMILIES[name]
    folder = tiny_checkpoints / TINY[name] if TINY[name] else BUILT[name](tmp_path / "tiny")
    model = models.load(folder)
    assert registry.family_of(model) is family and type(model) is family.classes()[0]
    c = model.config  # one config vocabulary across families
    assert all(isinstance(getattr(c, k), int) and getattr(c, k) > 0 for k in ("d_model", "n_layers", "n_heads"))
    result = entry_point(model, family.tabs[0])
    attention = getattr(result, "attention", {})
    maps = [a.weights for a in attention.values()] if isinstance(attention, dict) else \
        [attention, result.vision_attention]  # a DescribeResult: the decoder's and the tower's arrays
    maps += [w.weights for w in getattr(result, "windows", [])]
    assert maps
    for weights in maps:
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-4)
    if family.model_names:  # a family with checkpoints of the project's own format round-trips through one
        kept = {p.name: p for p in folder.iterdir() if p.name not in ("config.json", "manifest.json", "metrics.json")
                and not p.name.endswith(".safetensors")}
        save_checkpoint(tmp_path / "again", model, labels=model.labels, text=model.text, extra_files=kept)
        assert answer(entry_point(models.load(tmp_path / "again"), family.tabs[0])) == answer(result)
    if family.methods:
        assert methods_for(model) == family.methods
    if family.walk:
        ids = model.tokenizer.encode("a warm film").ids if hasattr(model.tokenizer, "encode") else None
        ids = ids or [1, 5, 6, 2]
        assert len(plan(model, ids).layers) == c.n_layers == len(next(iter(result.attention.values())).weights)
