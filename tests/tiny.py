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


WORDS = ["the", "film", "is", "a", "warm", "funny", "and", "beautifully", "acted", "plot", "thin", "jokes",
         "fall", "flat", "bank", "raised", "rates", "striker", "scored", "twice", "##s", "##ly", "##ed", ".", ","]


def tiny_wordpiece(folder: Path) -> Path:
    """A small uncased WordPiece tokenizer.json with BERT's specials at BERT's ids ([PAD] 0 ... [MASK] 4)."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def tiny_bert_checkpoint(folder: Path, labels: list[str] | None = None) -> Path:
    """A tiny random BertClassifier checkpoint in the real format (for app and API tests)."""
    import torch

    from models.families.bert import BertClassifier, BertConfig
    from models.io.checkpoint import save_checkpoint

    labels = labels or ["negative", "positive"]
    tok = tiny_wordpiece(folder.parent / f"_{folder.name}_tok")
    torch.manual_seed(0)
    model = BertClassifier(BertConfig(vocab_size=5 + len(WORDS), d_model=32, n_layers=2, n_heads=4, d_ff=64,
                                      max_positions=64, max_len=16, dropout=0.0, attention_dropout=0.0,
                                      n_classes=len(labels), origin="random weights (tests)"))
    return save_checkpoint(folder, model, labels=labels, text={"lowercase": True},
                           extra_files={"tokenizer.json": tok})


def make_checkpoints(root: Path, names: tuple[str, ...] = ("translator-en-de", "sst2", "agnews", "vit-fashion",
                                                           "swin-fashion", "minilm-sst2",
                                                           "minilm-agnews", "gpt-tiny", "mamba-tiny",
                                                           "vlm-fashion")) -> Path:
    import torch

    from models.families.classifier import ClassifierConfig, TextClassifier
    from models.families.gpt import GPT, GPTConfig
    from models.families.mamba import Mamba, MambaConfig
    from models.families.swin import Swin, SwinConfig
    from models.families.translator import Translator, TranslatorConfig
    from models.families.vit import ViT, ViTConfig
    from models.io.checkpoint import save_checkpoint

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
        elif name.startswith("minilm-"):
            labels = ["negative", "positive"] if name.endswith("sst2") else ["World", "Sports", "Business", "Sci/Tech"]
            tiny_bert_checkpoint(root / name, labels)
        elif name == "swin-fashion":
            model = Swin(SwinConfig(embed_dim=24, depths=(2, 2), heads=(2, 4), drop_path=0.0))
            save_checkpoint(root / name, model, labels=FASHION, text={})
        elif name == "gpt-tiny":  # as the shipped one: the LLaMA recipe, grouped-query heads, qkv biases; 128 positions
            model = GPT(GPTConfig(vocab_size=vocab, max_len=128, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                  qkv_bias=True))
            save_checkpoint(root / name, model, labels=[], text={"lowercase": False}, extra_files=tok)
        elif name == "mamba-tiny":  # as the shipped one: gpt-tiny's tokenizer, tied embeddings; small and random
            model = Mamba(MambaConfig(vocab_size=vocab, d_model=16, n_layers=2, d_state=4, expand=2, max_len=128))
            save_checkpoint(root / name, model, labels=[], text={"lowercase": False}, extra_files=tok)
        elif name == "vlm-fashion":  # as the shipped one: 64×64 scenes, its word vocabulary; small and random
            from models.families.vlm import VLM, VLMConfig
            from train import scenes

            model = VLM(VLMConfig(vocab_size=len(scenes.VOCAB), vision_dim=16, vision_depth=2, vision_heads=2,
                                  vision_mlp=32, d_model=32, n_layers=2, n_heads=2))
            words = scenes.write_tokenizer(root / "_vlm" / "tokenizer.json")
            save_checkpoint(root / name, model, labels=list(FASHION), text=scenes.TEXT,
                            extra_files={"tokenizer.json": words})
    return root


def tiny_gpt2_folder(folder: Path, std: float | None = None):
    """A small random GPT-2 written by transformers (config.json, model.safetensors) with a byte-level BPE
    tokenizer.json: a Hugging Face folder as a user would bring one. Returns the transformers model. ``std``: the
    initialiser's spread (transformers' 0.02 by default; 0.1 gives random logits clear winners, so greedy generation
    does not settle on one token)."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel

    folder.mkdir(parents=True, exist_ok=True)
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(["the cat sat on the mat", "a dog ran in the park", "hello world, again"] * 10,
                            vocab_size=300, special_tokens=["<|endoftext|>"])
    tok.save(str(folder / "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=32, n_layer=3, n_head=4,
                     bos_token_id=eot, eos_token_id=eot, **({} if std is None else {"initializer_range": std}))
    cfg._attn_implementation = "eager"
    hf = GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(folder)
    return hf


def tiny_llama_folder(folder: Path):
    """A small random LLaMA (grouped-query attention, rotate-half RoPE, untied output) written by transformers into
    ``folder``, with a borrowed byte-level tokenizer.json (the tokens do not matter); returns transformers' model."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    borrowed = folder.parent / f"{folder.name}-tokenizer"
    tiny_gpt2_folder(borrowed)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_bytes((borrowed / "tokenizer.json").read_bytes())
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64, rope_theta=500.0,
                      bos_token_id=0, eos_token_id=0, tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(folder)
    return model


def tiny_bert_classifier_folder(folder: Path, labels: tuple[str, ...] = ("negative", "neutral", "positive")):
    """A small random BertForSequenceClassification written by transformers with the tiny WordPiece
    tokenizer.json, its head scaled so the probabilities are far from uniform. Returns the model."""
    import torch
    from transformers import BertConfig as HFBertConfig
    from transformers import BertForSequenceClassification

    tok = tiny_wordpiece(folder)
    torch.manual_seed(0)
    cfg = HFBertConfig(vocab_size=5 + len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, max_position_embeddings=64, num_labels=len(labels),
                       id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
    cfg._attn_implementation = "eager"
    hf = BertForSequenceClassification(cfg).eval()
    with torch.no_grad():
        hf.classifier.weight.mul_(40.0)
    hf.save_pretrained(folder)
    assert tok.is_file()
    return hf


def tiny_vit_classifier_folder(folder: Path, labels: tuple[str, ...] = ("cat", "dog", "bird", "fish")):
    """A small random ViTForImageClassification written by transformers, with a preprocessor_config.json
    (resize to 32×32, ImageNet-style normalisation), its head scaled so the probabilities are far from
    uniform. Returns the model."""
    import torch
    from transformers import ViTConfig as HFViTConfig
    from transformers import ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(0)
    cfg = HFViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=4, intermediate_size=64, num_labels=len(labels),
                      id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
    cfg._attn_implementation = "eager"
    hf = ViTForImageClassification(cfg).eval()
    with torch.no_grad():
        hf.classifier.weight.mul_(40.0)
    hf.save_pretrained(folder)
    ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5, 0.4, 0.3],
                      image_std=[0.2, 0.25, 0.3]).save_pretrained(folder)
    return hf


def place_in_hub_cache(folder: Path, cache: Path, repo: str, commit: str = "0123456789abcdef" * 2 + "01234567") -> Path:
    """Copy a model folder into a huggingface_hub cache as the snapshot of ``repo`` at ``main`` (the layout
    huggingface_hub writes: models--OWNER--NAME/snapshots/COMMIT/..., refs/main). Returns the snapshot folder."""
    import shutil

    root = cache / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / commit
    shutil.copytree(folder, snapshot)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    return snapshot
