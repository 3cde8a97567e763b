"""GGUF files the tests write themselves with ``gguf.GGUFWriter`` (test-only): a random Hugging Face decoder made by
transformers, its tensors renamed, permuted and quantised as llama.cpp's convert_hf_to_gguf.py lays them out, a
small byte-level BPE (or SentencePiece) vocabulary in the ``tokenizer.ggml.*`` metadata.

Shapes are unusual on purpose (three or five layers, 6 query heads over 3 key/value heads, untied and tied outputs,
RoPE bases other than 10 000), and tensors mix F32, F16 and Q8_0 (or every supported type), so a name map, a
permutation or a dequantisation that only works for the common case fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

SENTENCES = ["the cat sat on the mat", "a dog ran in the park", "hello world, again", "The capital of France",
             "numbers 12345 and 678", "Once upon a time there was a model"] * 8
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# name -> (architecture, transformers config class, causal LM class, config values)
MODELS: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "llama": ("llama", "LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=96, intermediate_size=160, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=3,
        rope_theta=700.0, rms_norm_eps=1e-5, tie_word_embeddings=False)),
    "qwen2": ("qwen2", "Qwen2Config", "Qwen2ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=5, num_attention_heads=8, num_key_value_heads=2,
        rope_theta=3000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)),
    # every supported tensor type, one per tensor (K-quants need rows of 256)
    "llama-types": ("llama", "LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)),
}
ALL_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def byte_bpe(vocab_size: int = 300) -> tuple[list[str], list[str], list[int]]:
    """(tokens in id order, merges "a b", token types) of a byte-level BPE trained on SENTENCES, SPECIALS first."""
    import json

    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(SENTENCES, vocab_size=vocab_size, min_frequency=1, special_tokens=SPECIALS)
    model = json.loads(bpe._tokenizer.to_str())["model"]
    vocab = model["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    types = [3 if t in SPECIALS else 1 for t in tokens]
    return tokens, merges, types


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's rows (2, half) -> (half, 2), RoPE's adjacent pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
          "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(hf: str) -> str | None:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    parts = hf.split(".")  # model.layers.N.<module...>.<weight|bias>
    module = ".".join(parts[3:-1])
    return f"blk.{parts[2]}.{_LAYER[module]}.{parts[-1]}" if module in _LAYER else None


def k_quant_bytes(rows: int, cols: int, qtype: Any, rng: np.random.Generator) -> np.ndarray:
    """Valid random blocks of a K-quant (gguf can dequantise but not quantise them): random quant bits and scales,
    the float16 super-block scales set to small finite values."""
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[qtype]
    n = rows * cols // block
    raw = rng.integers(0, 256, (n, size), dtype=np.uint8)
    d = (rng.uniform(0.002, 0.02, (n, 2))).astype(np.float16).view(np.uint8).reshape(n, 4)
    name = qtype.name
    if name in ("Q2_K",):  # scales[16] qs[64] d dmin
        raw[:, 80:84] = d
    elif name == "Q3_K":  # hmask[32] qs[64] scales[12] d
        raw[:, 108:110] = d[:, :2]
    elif name in ("Q4_K", "Q5_K"):  # d dmin scales[12] ...
        raw[:, 0:4] = d
    elif name == "Q6_K":  # ql[128] qh[64] scales[16] d
        raw[:, 208:210] = d[:, :2]
    return raw.reshape(rows, cols // block * size)


def sentencepiece_vocab(folder: Path) -> tuple[list[str], list[float], list[int]]:
    """(pieces, scores, token types) of a SentencePiece BPE with byte fallback trained on SENTENCES: <unk> <s> </s>,
    the 256 byte pieces, then the merged pieces (a LLaMA-2-style vocabulary)."""
    import sentencepiece as spm

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corpus.txt").write_text("\n".join(SENTENCES), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(folder / "corpus.txt"), model_prefix=str(folder / "sp"), vocab_size=360,
                                   model_type="bpe", byte_fallback=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                   character_coverage=1.0, hard_vocab_limit=False, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(folder / "sp.model"))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    scores = [sp.get_score(i) for i in range(sp.get_piece_size())]
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1
             for i in range(sp.get_piece_size())]
    return pieces, scores, types


def write_model(folder: Path, name: str, seed: int = 0, types: dict[str, str] | None = None,
                arch_override: str | None = None, extra: dict[str, Any] | None = None,
                file: str = "model.gguf", all_f32: bool = False, sentencepiece: bool = False) -> tuple[Path, Any]:
    """A random transformers ``name`` model (MODELS) written as a GGUF file ``folder/file``; returns (path, the
    transformers model it came from). ``types``: tensor type per GGUF name (default: Q8_0 for attention and the
    embedding, F16 for the feed-forward and output, F32 for norms and biases); ``"llama-types"`` cycles through
    every supported type; ``all_f32``: every tensor F32 (exact). ``arch_override``: write another
    general.architecture (the refusal tests). ``sentencepiece``: a ``llama`` (SentencePiece) vocabulary instead of
    the byte-level BPE."""
    import gguf
    import torch
    import transformers

    arch, config_name, model_name, settings = MODELS[name]
    if sentencepiece:
        tokens, scores, token_types = sentencepiece_vocab(folder / "_sp")
    else:
        tokens, merges, token_types = byte_bpe()
    cfg = getattr(transformers, config_name)(vocab_size=len(tokens), max_position_embeddings=128, bos_token_id=1,
                                             eos_token_id=2, initializer_range=0.1, **settings)
    torch.manual_seed(seed)
    hf = getattr(transformers, model_name)(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 1:  # norms start at 1, biases at 0: move them so a misread one shows
                p.add_(torch.randn_like(p) * 0.1)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file
    w = gguf.GGUFWriter(str(path), arch_override or arch)
    w.add_name(f"tiny {name}")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"] if getattr(cfg, "rope_parameters", None)
                               else cfg.rope_theta))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(len(tokens))
    if arch == "llama":
        w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    if sentencepiece:
        w.add_tokenizer_model("llama")
        w.add_token_scores(scores)
        w.add_unk_token_id(0)
    else:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2" if arch == "qwen2" else "smollm")
        w.add_token_merges(merges)
        w.add_add_bos_token(arch == "llama")  # the llama file puts BOS first, the qwen2 one does not
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(TEMPLATE)
    for key, value in (extra or {}).items():
        w.add_key_value(key, *value)
    rng = np.random.default_rng(seed)
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    matrices = 0  # "llama-types": the i-th matrix gets the i-th type
    for hf_name, tensor in hf.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        g = gguf_name(hf_name)
        if g is None:
            continue
        a = tensor.detach().float().numpy()
        if arch == "llama" and g.endswith("attn_q.weight"):
            a = permute(a, heads)
        elif arch == "llama" and g.endswith("attn_k.weight"):
            a = permute(a, kv)
        if all_f32:
            kind = "F32"
        elif name == "llama-types":
            kind = ALL_TYPES[matrices % len(ALL_TYPES)] if a.ndim == 2 else "F32"
            matrices += a.ndim == 2
        else:
            default = "F32" if a.ndim == 1 else ("Q8_0" if ".attn_" in g or g.startswith("token_embd") else "F16")
            kind = (types or {}).get(g, default)
        qtype = gguf.GGMLQuantizationType[kind]
        if kind == "F32":
            w.add_tensor(g, np.ascontiguousarray(a, dtype=np.float32))
        elif kind == "F16":
            w.add_tensor(g, a.astype(np.float16))
        elif kind.endswith("_K"):
            w.add_tensor(g, k_quant_bytes(*a.shape, qtype, rng), raw_dtype=qtype)
        else:
            w.add_tensor(g, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, hf


def reference(path: Path) -> Any:
    """transformers' own GGUF reader over ``path``: the causal LM (float32, eager attention, eval)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                attn_implementation="eager").eval()


def reference_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
