"""Tiny, randomly initialised checkpoints of every shipped model, in the real checkpoint format.

The app and API tests point ATLAS_CHECKPOINTS at a folder of these, so they exercise the whole path
(manifest check, load, tokenizer, attention, figures) in seconds and without the trained weights.
"""

from __future__ import annotations

from pathlib import Path

SENTENCES = [
    "A man in a blue shirt is riding a bicycle down the street.",
    "Ein Mann in einem blauen Hemd fährt mit dem Fahrrad die Straße entlang.",
    "Two young girls are playing with a dog in the park.",
    "Zwei junge Mädchen spielen mit einem Hund im Park.",
    "a warm , funny and beautifully acted film .",
    "the plot is thin and the jokes fall flat .",
    "The central bank raised interest rates again on Tuesday.",
    "The striker scored twice as the home side won the cup final.",
] * 4

FASHION = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def train_sentencepiece(folder: Path, vocab: int = 120) -> Path:
    import sentencepiece as spm

    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(folder / "sp"), vocab_size=vocab, model_type="unigram",
        pad_id=0, bos_id=1, eos_id=2, unk_id=3, character_coverage=1.0, hard_vocab_limit=False,
        minloglevel=2,
    )
    return folder / "sp.model"


def make_checkpoints(root: Path, names: tuple[str, ...] = ("translator-en-de", "sst2", "agnews", "vit-fashion",
                                                           "swin-fashion")) -> Path:
    import torch

    from models.checkpoint import save_checkpoint
    from models.classifier import ClassifierConfig, TextClassifier
    from models.swin import Swin, SwinConfig
    from models.transformer import Translator, TranslatorConfig
    from models.vit import ViT, ViTConfig

    torch.manual_seed(0)
    sp = train_sentencepiece(root / "_spm")
    import sentencepiece as spmlib

    vocab = spmlib.SentencePieceProcessor(model_file=str(sp)).get_piece_size()
    tok = {"tokenizer.model": sp}
    for name in names:
        if name == "translator-en-de":
            model = Translator(TranslatorConfig(vocab_size=vocab, d_model=32, n_heads=4, n_enc_layers=2,
                                                n_dec_layers=2, d_ff=64, dropout=0.0))
            save_checkpoint(root / name, model, labels=[], text={"lowercase": False}, extra_files=tok)
        elif name in ("sst2", "agnews"):
            labels = ["negative", "positive"] if name == "sst2" else ["World", "Sports", "Business", "Sci/Tech"]
            model = TextClassifier(ClassifierConfig(vocab_size=vocab, n_classes=len(labels), d_model=32, n_heads=4,
                                                    n_layers=2, d_ff=64, dropout=0.0))
            save_checkpoint(root / name, model, labels=labels, text={"lowercase": name == "sst2"}, extra_files=tok)
        elif name == "vit-fashion":
            model = ViT(ViTConfig(dim=32, depth=2, heads=4, mlp_dim=64, dropout=0.0))
            save_checkpoint(root / name, model, labels=FASHION, text={})
        elif name == "swin-fashion":
            model = Swin(SwinConfig(embed_dim=24, depths=(2, 2), heads=(2, 4), drop_path=0.0))
            save_checkpoint(root / name, model, labels=FASHION, text={})
    return root
