"""Random folders shaped like real models of the families issue 49 reads, for `bench/latency.py --families`.

Written by transformers as a user's Hugging Face folder would be (config.json, model.safetensors and the tokenizer
files), like bench/_long_model.py: random weights, real shapes. The tokenizers are SentencePiece models trained on
the repository's own Markdown (no download); the vocabularies are filled up to the real models' sizes with pieces
that never occur, so the embedding tables, and so the parameter counts, are the real ones:

- ``opus-mt-shaped``: Helsinki-NLP/opus-mt-en-de's MarianConfig (d = 512, 6 + 6 layers, 8 heads, FFN 2,048, swish,
  58,101 pieces, tied embeddings): 74 M parameters;
- ``t5-small-shaped``: google-t5/t5-small's T5Config (d = 512, 6 + 6 layers, 8 heads of 64, FFN 2,048, ReLU, 32
  buckets up to 128 positions, tied rescaled head, 32,128 embeddings for 32,000 pieces and 100 sentinels, its
  English → German task prefix): 60.5 M parameters;
- ``deberta-v3-base-shaped``: microsoft/deberta-v3-base's DebertaV2Config (d = 768, 12 layers, 12 heads, FFN 3,072,
  relative attention with 256 log buckets, shared keys, 128,100 pieces) with a 2-class head: 184 M parameters.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pieces(folder: Path, vocab: int) -> list[tuple[str, float]]:
    """A unigram SentencePiece model trained on the repository's Markdown (its pieces, without the 4 specials)."""
    import sentencepiece as spm

    folder.mkdir(parents=True, exist_ok=True)
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(ROOT.rglob("*.md")) if ".git" not in p.parts)
    (folder / "corpus.txt").write_text(text, encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(folder / "corpus.txt"), model_prefix=str(folder / "sp"),
                                   vocab_size=vocab, model_type="unigram", pad_id=0, bos_id=1, eos_id=2, unk_id=3,
                                   character_coverage=1.0, hard_vocab_limit=False, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(folder / "sp.model"))
    return [(sp.id_to_piece(i), sp.get_score(i)) for i in range(4, sp.get_piece_size())]


def marian_folder(folder: Path, vocab: int = 58_101, seed: int = 0) -> dict:
    """opus-mt-en-de's shape with random weights; returns its shape and parameter count."""
    import torch
    import transformers as t

    work = folder / "_spm"
    pieces = [p for p, _ in _pieces(work, 4000)]
    names = ["</s>", "<unk>", *pieces]
    names += [f"▁unused{i}" for i in range(vocab - 1 - len(names))] + ["<pad>"]
    (folder / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(names)}), encoding="utf-8")
    tok = t.MarianTokenizer(str(work / "sp.model"), str(work / "sp.model"), str(folder / "vocab.json"))
    tok.save_pretrained(folder)
    cfg = t.MarianConfig(vocab_size=vocab, decoder_vocab_size=vocab, d_model=512, encoder_layers=6, decoder_layers=6,
                         encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
                         decoder_ffn_dim=2048, activation_function="swish", scale_embedding=True,
                         max_position_embeddings=512, pad_token_id=vocab - 1, decoder_start_token_id=vocab - 1,
                         eos_token_id=0, forced_eos_token_id=0)
    torch.manual_seed(seed)
    model = t.MarianMTModel(cfg).eval()
    model.generation_config.bad_words_ids = [[vocab - 1]]
    model.save_pretrained(folder)
    return {"family": "marian", "d_model": 512, "layers": "6+6", "heads": 8, "vocab": vocab,
            "params": sum(p.numel() for p in model.parameters())}


def deberta_folder(folder: Path, vocab: int = 128_100, seed: int = 0) -> dict:
    """microsoft/deberta-v3-base's shape with random weights and a 2-class head; returns its shape and size."""
    import torch
    import transformers as t

    pieces = _pieces(folder / "_spm", 4000)
    specials = [("[PAD]", 0.0), ("[CLS]", 0.0), ("[SEP]", 0.0), ("[UNK]", 0.0), ("[MASK]", 0.0)]
    fill = [(f"▁unused{i}", -100.0) for i in range(vocab - len(specials) - len(pieces))]
    tok = t.DebertaV2Tokenizer(vocab=specials + pieces + fill, unk_id=3)
    tok.save_pretrained(folder)
    cfg = t.DebertaV2Config(vocab_size=vocab, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                            intermediate_size=3072, max_position_embeddings=512, relative_attention=True,
                            position_buckets=256, max_relative_positions=-1, pos_att_type=["p2c", "c2p"],
                            position_biased_input=False, share_att_key=True, norm_rel_ebd="layer_norm",
                            type_vocab_size=0, layer_norm_eps=1e-7, num_labels=2,
                            id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    torch.manual_seed(seed)
    model = t.DebertaV2ForSequenceClassification(cfg).eval()
    model.save_pretrained(folder)
    return {"family": "deberta-v2", "d_model": 768, "layers": 12, "heads": 12, "vocab": vocab,
            "params": sum(p.numel() for p in model.parameters())}


def t5_folder(folder: Path, vocab: int = 32_128, seed: int = 0) -> dict:
    """google-t5/t5-small's shape with random weights (tokenizer.json with 32,000 pieces + 100 sentinels, as
    t5-small's); returns its shape and parameter count."""
    import torch
    import transformers as t

    pieces = _pieces(folder / "_spm", 4000)
    specials = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    fill = [(f"▁unused{i}", -100.0) for i in range(32_000 - len(specials) - len(pieces))]
    tok = t.T5Tokenizer(vocab=specials + pieces + fill, extra_ids=100)
    tok.save_pretrained(folder)
    cfg = t.T5Config(vocab_size=vocab, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
                     feed_forward_proj="relu", decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
                     task_specific_params={"translation_en_to_de": {"prefix": "translate English to German: "}})
    torch.manual_seed(seed)
    model = t.T5ForConditionalGeneration(cfg).eval()
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["scale_decoder_outputs"] = True  # t5-small: the tied head with the d_model^-0.5 rescale
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return {"family": "t5", "d_model": 512, "layers": "6+6", "heads": 8, "vocab": vocab,
            "params": sum(p.numel() for p in model.parameters())}


FOLDERS = {"opus-mt-shaped": marian_folder, "t5-small-shaped": t5_folder, "deberta-v3-base-shaped": deberta_folder}


def ensure(root: Path, names=tuple(FOLDERS)) -> dict[str, dict]:
    """The named random folders under ``root``, each written once (its ``shape.json`` marks it done): name → shape."""
    import sys

    shapes = {}
    for name in names:
        shape_file = root / name / "shape.json"
        if not shape_file.is_file():
            print(f"writing the random {name} folder into {root / name} ...", file=sys.stderr)
            (root / name).mkdir(parents=True, exist_ok=True)
            shape_file.write_text(json.dumps(FOLDERS[name](root / name)))
        shapes[name] = json.loads(shape_file.read_text())
    return shapes
