"""Random-weight Hugging Face folders of the families models/io/hf_encoders.py, the translators (hf_translators.py)
and the vision readers (DeiT, Swin) read, written by transformers itself (test-only), with tokenizers transformers
builds and saves offline from tiny vocabularies, and unusual but valid configs (three layers, nine-wide heads,
factorised embeddings narrower than the model, encoder and decoder feed-forwards of different widths, Swin grids that
are not a multiple of the window). tests/parity_folders.py names the folder of every model_type the registry reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.tiny import SENTENCES, WORDS, train_sentencepiece

LABELS = ("negative", "neutral", "positive")
EOS_BIAS = 4.0
SHAPE = dict(hidden_size=36, num_hidden_layers=3, num_attention_heads=4, intermediate_size=52)  # d_head 9


def _bpe(vocab_size: int = 300) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A byte-level BPE (GPT-2 / RoBERTa style) trained on the tiny sentences, RoBERTa's specials at ids 0-4."""
    import json

    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(SENTENCES, vocab_size=vocab_size, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    merges = json.loads(bpe._tokenizer.to_str())["model"]["merges"]
    return bpe.get_vocab(), [tuple(m) for m in merges]


def unigram_pieces(folder: Path, specials: tuple[str, ...]) -> list[tuple[str, float]]:
    """SentencePiece unigram pieces trained on the tiny sentences, ``specials`` first (ALBERT's, DeBERTa's ids)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(train_sentencepiece(folder / "spm")))
    return [(s, 0.0) for s in specials] + [(sp.id_to_piece(i), sp.get_score(i)) for i in range(4, sp.get_piece_size())]


def tokenizer_for(family: str, folder: Path) -> Any:
    """The family's transformers tokenizer over a tiny vocabulary, saved into ``folder`` (tokenizer.json and all)."""
    import transformers as t

    wordpiece = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    if family == "roberta":
        vocab, merges = _bpe()
        tok = t.RobertaTokenizer(vocab=vocab, merges=merges)
    elif family == "distilbert":
        tok = t.DistilBertTokenizer(vocab=wordpiece)
    elif family == "electra":
        tok = t.ElectraTokenizer(vocab=wordpiece)
    elif family == "albert":
        tok = t.AlbertTokenizer(vocab=unigram_pieces(folder, ("<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]")))
    elif family == "deberta-v2":
        tok = t.DebertaV2Tokenizer(vocab=unigram_pieces(folder, ("[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]")),
                                   unk_id=3)
    else:
        raise ValueError(family)
    tok.save_pretrained(folder)
    return tok


def classifier_folder(family: str, folder: Path) -> tuple[Any, Any]:
    """A random ``*ForSequenceClassification`` of ``family`` with its tokenizer, saved (safetensors) into ``folder``;
    every LayerNorm moved off 1/0 and the head scaled so probabilities are far from uniform. Returns (model, tok)."""
    import torch
    import transformers as t

    folder.mkdir(parents=True, exist_ok=True)
    tok = tokenizer_for(family, folder)
    n = len(tok)
    labels = dict(id2label=dict(enumerate(LABELS)), label2id={k: i for i, k in enumerate(LABELS)})
    if family == "roberta":
        cfg = t.RobertaConfig(vocab_size=n, max_position_embeddings=42, type_vocab_size=1, pad_token_id=1, **SHAPE,
                              **labels)
        cls = t.RobertaForSequenceClassification
    elif family == "distilbert":
        cfg = t.DistilBertConfig(vocab_size=n, dim=36, n_layers=3, n_heads=4, hidden_dim=52,
                                 max_position_embeddings=40, **labels)
        cls = t.DistilBertForSequenceClassification
    elif family == "electra":
        cfg = t.ElectraConfig(vocab_size=n, embedding_size=20, max_position_embeddings=40, **SHAPE, **labels)
        cls = t.ElectraForSequenceClassification
    elif family == "albert":
        cfg = t.AlbertConfig(vocab_size=n, embedding_size=20, max_position_embeddings=40, **SHAPE, **labels)
        cls = t.AlbertForSequenceClassification
    elif family == "deberta-v2":
        cfg = t.DebertaV2Config(vocab_size=n, max_position_embeddings=40, relative_attention=True,
                                position_buckets=8, max_relative_positions=40, pos_att_type=["p2c", "c2p"],
                                position_biased_input=False, share_att_key=True, norm_rel_ebd="layer_norm",
                                type_vocab_size=0, pad_token_id=0, **SHAPE, **labels)
        cls = t.DebertaV2ForSequenceClassification
    else:
        raise ValueError(family)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.2)
        head = next(m for name, m in reversed(list(model.named_modules()))
                    if isinstance(m, torch.nn.Linear))  # the last linear layer: the classifier
        head.weight.mul_(100.0 if family in ("distilbert", "deberta-v2") else 30.0)  # ReLU, GELU damp it
    model.save_pretrained(folder)
    return model, tok


def marian_folder(folder: Path, shared: bool = True, beams: int = 5, ffn: tuple[int, int] = (52, 52)
                  ) -> tuple[Any, Any]:
    """A random ``MarianMTModel`` (swish, scaled embeddings, 3 encoder and 2 decoder layers, nine-wide heads) with a
    MarianTokenizer over a tiny joint SentencePiece model (opus-mt's layout: ``</s>`` 0, ``<unk>`` 1, ``<pad>``
    last), saved into ``folder``; ``shared=False``: separate source and target tables and an untied output matrix;
    ``ffn``: the encoder's and the decoder's feed-forward widths. eos is made likely enough that searches finish before
    their limit. Returns (model, tokenizer)."""
    import json

    import sentencepiece as spm
    import torch
    import transformers as t

    folder.mkdir(parents=True, exist_ok=True)
    sp_path = train_sentencepiece(folder / "spm", vocab=150)
    sp = spm.SentencePieceProcessor(model_file=str(sp_path))
    pieces = ["</s>", "<unk>", *[sp.id_to_piece(i) for i in range(4, sp.get_piece_size())], "<pad>"]
    vocab = {p: i for i, p in enumerate(pieces)}
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    tok = t.MarianTokenizer(str(sp_path), str(sp_path), str(folder / "vocab.json"))
    tok.save_pretrained(folder)
    pad = vocab["<pad>"]
    cfg = t.MarianConfig(vocab_size=len(vocab), decoder_vocab_size=len(vocab), d_model=36, encoder_layers=3,
                         decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=ffn[0],
                         decoder_ffn_dim=ffn[1], activation_function="swish", scale_embedding=True,
                         max_position_embeddings=64, pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0,
                         forced_eos_token_id=0, share_encoder_decoder_embeddings=shared, tie_word_embeddings=shared,
                         dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    cfg._attn_implementation = "eager"
    torch.manual_seed(1)
    model = t.MarianMTModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.2)
        last = model.model.decoder.layers[-1].final_layer_norm  # peaked next-token distributions that depend on
        last.weight.mul_(40.0)  # the decoder state (tiny tied embeddings would leave only the logits bias)
        last.bias.mul_(40.0)
        for layer in model.model.decoder.layers:  # the source matters: cross-attention writes strongly
            layer.encoder_attn.out_proj.weight.mul_(25.0)
            layer.encoder_attn.q_proj.weight.mul_(5.0)
        model.final_logits_bias.normal_(0.0, 0.1)
        model.final_logits_bias[0, 0] += EOS_BIAS  # eos: hypotheses end within the limit
    model.generation_config.bad_words_ids = [[pad]]
    model.generation_config.num_beams = beams
    model.save_pretrained(folder)
    return model, tok


def t5_folder(folder: Path, feed_forward: str = "gated-gelu", tied: bool = False, layers: tuple[int, int] = (3, 2),
              prefix: str = "translate English to German: ") -> tuple[Any, Any]:
    """A random ``T5ForConditionalGeneration`` with a T5 tokenizer (tokenizer.json, a unigram model over the tiny
    sentences, T5's ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2 and three ``<extra_id_N>``), saved into ``folder``. Unusual
    but valid: encoder and decoder of different depths (``layers``), five heads of 8 = 40 wide over d_model 36,
    8 buckets reaching 20 positions (sentences longer than that share the last bucket). ``feed_forward``: "relu"
    (T5) or "gated-gelu" (v1.1, Flan); ``tied=False``: an output matrix of its own, stored as ``lm_head.weight``,
    without the d_model^-0.5 rescale (v1.1); True: the shared table with it (T5). The config carries the task
    prefix as t5-small's does. Returns (model, tokenizer)."""
    import json

    import torch
    import transformers as t
    from safetensors.torch import load_file, save_file

    folder.mkdir(parents=True, exist_ok=True)
    tok = t.T5Tokenizer(vocab=unigram_pieces(folder, ("<pad>", "</s>", "<unk>")), extra_ids=3)
    tok.save_pretrained(folder)
    cfg = t.T5Config(vocab_size=len(tok), d_model=36, d_kv=8, num_heads=5, d_ff=52, num_layers=layers[0],
                     num_decoder_layers=layers[1], relative_attention_num_buckets=8,
                     relative_attention_max_distance=20, feed_forward_proj=feed_forward, dropout_rate=0.0,
                     decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
                     task_specific_params={"translation_en_to_de": {"prefix": prefix}})
    cfg._attn_implementation = "eager"
    torch.manual_seed(2)
    model = t.T5ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
            if "relative_attention_bias" in name:
                p.normal_(0.0, 2.0)  # positions matter: the bias moves the attention visibly
        model.shared.weight.mul_(0.2)  # layer outputs, not the input token's own row, decide the next token
        for layer in model.decoder.block:  # the source matters: cross-attention and the feed-forward write strongly
            layer.layer[1].EncDecAttention.o.weight.mul_(5.0)
            layer.layer[2].DenseReluDense.wo.weight.mul_(3.0)
        model.decoder.final_layer_norm.weight.mul_(8.0)  # peaked next-token distributions
        if not tied:  # transformers 5 ties T5's head always: untie it by hand, as v1.1 checkpoints are stored
            model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight) * 0.5)
        model.config.scale_decoder_outputs = tied
        # eos likely at some steps only: its output row along the decoder's mean output, scaled so that its logit
        # is about the best one of a middling step
        enc = tok([prefix + s for s in SENTENCES[:4]], return_tensors="pt", padding=True)
        start = torch.zeros((enc["input_ids"].size(0), 1), dtype=torch.long)
        out = model.generate(**enc, max_new_tokens=12, do_sample=False, decoder_start_token_id=0)
        h = model(**enc, decoder_input_ids=torch.cat([start, out[:, 1:]], 1), output_hidden_states=True
                  ).decoder_hidden_states[-1]  # (B, T, D) after the final norm
        h = h * (36 ** -0.5 if tied else 1.0)
        logits = h @ model.lm_head.weight.T
        mean = h.reshape(-1, 36).mean(0)
        want = logits.max(-1).values.quantile(0.4 if tied else 0.5)
        model.lm_head.weight[1] = mean / mean.dot(mean) * want
    model.save_pretrained(folder)
    saved = json.loads((folder / "config.json").read_text())
    saved["tie_word_embeddings"] = tied
    saved["scale_decoder_outputs"] = tied
    (folder / "config.json").write_text(json.dumps(saved))
    if not tied:
        state = load_file(str(folder / "model.safetensors"))
        state["lm_head.weight"] = model.lm_head.weight.detach().clone()
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return model, tok


# ------------------------------------------------------------------------------------------------------- vision
VISION_LABELS = ("cat", "dog", "bird", "fish", "frog")


def photo(seed: int = 0) -> Any:
    """A non-square RGB 'photo' with structure (a gradient, a disc and noise), larger than the models' inputs."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    h, w = 90, 130
    y, x = np.mgrid[:h, :w]
    img = np.stack([x * 255 / w, y * 255 / h, 128 + 100 * (((x - 60) ** 2 + (y - 40) ** 2) < 600)], -1)
    return Image.fromarray(np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8))


def noise(seed: int = 0) -> Any:
    """A 50 × 70 RGB image of uniform noise."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (50, 70, 3)).astype(np.uint8))


def deit_folder(folder: Path, distilled: bool) -> Any:
    """A small random DeiT classifier saved by transformers (safetensors) with its preprocessor_config.json (resize to
    36, crop to 32); its heads, tokens and positions drawn wide so each counts and the probabilities are far from
    uniform. Returns the model (eval)."""
    import torch
    from transformers import (
        DeiTConfig,
        DeiTForImageClassification,
        DeiTForImageClassificationWithTeacher,
        DeiTImageProcessor,
    )

    torch.manual_seed(1 if distilled else 2)
    cfg = DeiTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=3,
                     num_attention_heads=4, intermediate_size=64, num_labels=len(VISION_LABELS),
                     id2label=dict(enumerate(VISION_LABELS)), label2id={n: i for i, n in enumerate(VISION_LABELS)})
    cfg._attn_implementation = "eager"
    cls = DeiTForImageClassificationWithTeacher if distilled else DeiTForImageClassification
    hf = cls(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "classifier" in name or "token" in name or "position" in name:
                p.normal_(0, 0.5)  # transformers initialises these to zeros or small values: make each count
    hf.save_pretrained(folder, safe_serialization=True)
    DeiTImageProcessor(size={"height": 36, "width": 36}, crop_size={"height": 32, "width": 32},
                       image_mean=[0.5, 0.4, 0.3], image_std=[0.2, 0.25, 0.3]).save_pretrained(folder)
    return hf


def swin_folder(folder: Path, image_size: int = 32, patch: int = 2, window: int = 4,
                depths: tuple[int, ...] = (3, 1, 1), heads: tuple[int, ...] = (3, 2, 4), labels: int = 3,
                head_scale: float = 40.0) -> Any:
    """A random ``SwinForImageClassification`` (embed_dim 12) with a ViTImageProcessor resizing to ``image_size``,
    saved into ``folder``: LayerNorms off 1/0 and bias tables that shape attention, the head scaled so probabilities
    are far from uniform. The default's 16 × 16 grid in 4 × 4 windows gives regular, shifted and whole-grid windows;
    a grid that is not a multiple of the window (36 / 2 = 18 in windows of 5, then 9, then 5) is padded by the model.
    Returns the model (eval)."""
    import torch
    from transformers import SwinConfig, SwinForImageClassification, ViTImageProcessor

    names = VISION_LABELS[:labels]
    cfg = SwinConfig(image_size=image_size, patch_size=patch, num_channels=3, embed_dim=12, depths=list(depths),
                     num_heads=list(heads), window_size=window, drop_path_rate=0.0, num_labels=labels,
                     id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)})
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = SwinForImageClassification(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or "relative_position_bias_table" in name or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.3)  # LayerNorms off 1/0, bias tables that shape attention
        hf.classifier.weight.mul_(head_scale)
    hf.save_pretrained(folder)
    ViTImageProcessor(size={"height": image_size, "width": image_size}, image_mean=[0.5, 0.4, 0.3],
                      image_std=[0.2, 0.25, 0.3]).save_pretrained(folder)
    return hf
