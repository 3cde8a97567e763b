"""A random long-context LLaMA folder for the long-input benchmarks and tests (issue: long contexts).

Written by transformers as a user's Hugging Face folder would be (config.json, model.safetensors, tokenizer.json),
like tests/tiny.py's tiny_llama_folder but of any size: the benchmark's shape is 12 layers × 12 heads, d = 768,
4,096 positions. The byte-level BPE tokenizer is trained on the repository's own .py and .md files (no download),
so its vocabulary is what that text gives (about 11,000 pieces at the default cap).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def corpus_files() -> list[str]:
    """The repository's Python and Markdown files: text to train the tokenizer on and to build long prompts from."""
    skip = {".venv", "runs", ".git", "node_modules"}
    return sorted(str(p) for p in ROOT.rglob("*") if p.suffix in (".py", ".md") and not skip & set(p.parts))


def long_prompt(chars: int = 20_000) -> str:
    """Plain English from the README, repeated up to ``chars`` characters (the app reads at most 20,000)."""
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    return (text * (chars // max(len(text), 1) + 1))[:chars]


def long_llama_folder(folder: Path, layers: int = 12, heads: int = 12, d_model: int = 768, positions: int = 4096,
                      vocab: int = 32_000, seed: int = 0) -> dict:
    """Write a random LLaMA (d_ff = 8/3 · d rounded to 64, as LLaMA) into ``folder``; returns its shape."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tok = ByteLevelBPETokenizer()
    tok.train(corpus_files(), vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False)
    tok.save(str(folder / "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(seed)
    d_ff = (8 * d_model // 3 + 63) // 64 * 64
    cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=d_model, intermediate_size=d_ff,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                      max_position_embeddings=positions, bos_token_id=eot, eos_token_id=eot, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(folder, safe_serialization=True)
    return {"layers": layers, "heads": heads, "d_model": d_model, "positions": positions,
            "vocab": tok.get_vocab_size(), "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1)}
