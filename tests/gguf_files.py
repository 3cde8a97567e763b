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
    # per-head q/k norms, a head_dim of its own (128: transformers' GGUF reader does not read key_length for qwen3)
    "qwen3": ("qwen3", "Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=96, intermediate_size=112, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=128, rope_theta=5000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)),
    # head_dim 40 from qwen3.attention.key_length, which transformers' GGUF reader does not read (it keeps 128)
    "qwen3-head40": ("qwen3", "Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=40, rope_theta=7000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)),
    # seven layers: five local (window 4), one global, one local; head_dim 256, so llama.cpp's query scale rule and
    # transformers' default query_pre_attn_scalar (256) agree; a SentencePiece vocabulary spelled as Gemma's
    "gemma3": ("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=7, num_attention_heads=2, num_key_value_heads=1,
        head_dim=256, query_pre_attn_scalar=256, sliding_window=4, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 20000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
    # head_dim 48: llama.cpp's rule scales queries by 48^-1/2, which transformers' GGUF reader (always 256) does not
    "gemma3-head48": ("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2,
        head_dim=48, query_pre_attn_scalar=48, sliding_window=3, rms_norm_eps=1e-6, tie_word_embeddings=True,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 30000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 500.0}})),
    # fused q/k/v (attn_qkv) and gate/up (ffn_up holds [gate | up]), 6 query over 2 key/value heads
    "phi3": ("phi3", "Phi3Config", "Phi3ForCausalLM", dict(
        hidden_size=96, intermediate_size=128, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2,
        rope_theta=2000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, pad_token_id=0)),
    # RoPE over 8 of each head's 16 dimensions (as Phi-4-mini turns 96 of 128), which transformers' GGUF reader does not
    # read (rope.dimension_count is ignored for phi3)
    "phi3-partial": ("phi3", "Phi3Config", "Phi3ForCausalLM", dict(
        hidden_size=96, intermediate_size=128, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3,
        rope_theta=300.0, partial_rotary_factor=0.5, rms_norm_eps=1e-5, tie_word_embeddings=True, pad_token_id=0)),
    # Phi-3 with phi3.attention.sliding_window (4), applied as the Hugging Face model applies it (transformers' GGUF
    # reader, like llama.cpp, leaves it off)
    "phi3-window": ("phi3", "Phi3Config", "Phi3ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        rope_theta=1500.0, sliding_window=4, rms_norm_eps=1e-5, tie_word_embeddings=False, pad_token_id=0)),
    # Mistral as llama.cpp writes it: architecture llama (q/k rows permuted), "mistral" in the name, a window of 5
    "mistral": ("llama", "MistralConfig", "MistralForCausalLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        sliding_window=5, rope_theta=900.0, rms_norm_eps=1e-5, tie_word_embeddings=False)),
}
# the vocabulary each file gets: byte-level BPE ("gpt2"), or SentencePiece ("llama") as LLaMA 2, Gemma or Phi-3 spell it
VOCABULARY = {"mistral": "sentencepiece", "gemma3": "gemma", "gemma3-head48": "gemma", "phi3": "phi3",
              "phi3-partial": "phi3", "phi3-window": "phi3"}
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
          "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "self_attn.qkv_proj": "attn_qkv",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.gate_up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down"}
# Gemma 3's four norms per layer, as llama.cpp's converter names them
_GEMMA = {**_LAYER, "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
          "post_feedforward_layernorm": "post_ffw_norm"}


def gguf_name(hf: str, arch: str = "llama") -> str | None:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    parts = hf.split(".")  # model.layers.N.<module...>.<weight|bias>
    module = ".".join(parts[3:-1])
    table = _GEMMA if arch == "gemma3" else _LAYER
    return f"blk.{parts[2]}.{table[module]}.{parts[-1]}" if module in table else None


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


def gemma_vocab(folder: Path) -> tuple[list[str], list[float], list[int]]:
    """A Gemma-shaped SentencePiece BPE: <pad> <eos> <bos> <unk> first, no dummy prefix, byte fallback, whitespace-only
    pieces ("▁▁", "▁▁▁"), which the file spells with real spaces as Gemma's files do, a user-defined
    <start_of_turn> and a control <end_of_turn>; no merges in the file (they are recovered from the token order)."""
    import sentencepiece as spm

    folder.mkdir(parents=True, exist_ok=True)
    lines = SENTENCES + ["    indented  code   here", "a  b   c    d", "tabs\tand\nnew lines", "x = [1,  2,   3]"] * 4
    (folder / "corpus.txt").write_text("\n".join(lines), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(folder / "corpus.txt"), model_prefix=str(folder / "sp"), vocab_size=380,
                                   model_type="bpe", byte_fallback=True, pad_id=0, eos_id=1, bos_id=2, unk_id=3,
                                   pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
                                   add_dummy_prefix=False, remove_extra_whitespaces=False,
                                   allow_whitespace_only_pieces=True, split_by_whitespace=False,
                                   user_defined_symbols=["<start_of_turn>"], control_symbols=["<end_of_turn>"],
                                   character_coverage=1.0, hard_vocab_limit=False, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(folder / "sp.model"))
    pieces, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        if len(piece) > 1 and set(piece) == {"▁"}:
            piece = " " * len(piece)  # Gemma's files store runs of spaces as spaces
        pieces.append(piece)
        scores.append(sp.get_score(i))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
                     else 4 if piece == "<start_of_turn>" else 1)
    return pieces, scores, types


def phi3_vocab(folder: Path) -> tuple[list[str], list[float], list[int]]:
    """LLaMA 2's kind of vocabulary (``sentencepiece_vocab``) with Phi-3's chat tokens appended: <|user|>,
    <|assistant|>, <|end|> control, <|placeholder1|> user-defined."""
    pieces, scores, types = sentencepiece_vocab(folder)
    extra = [("<|user|>", 3), ("<|assistant|>", 3), ("<|end|>", 3), ("<|placeholder1|>", 4)]
    return pieces + [t for t, _ in extra], scores + [0.0] * len(extra), types + [k for _, k in extra]


def write_model(folder: Path, name: str, seed: int = 0, types: dict[str, str] | None = None,
                arch_override: str | None = None, extra: dict[str, Any] | None = None,
                file: str = "model.gguf", all_f32: bool = False, sentencepiece: bool = False,
                tokenizer_model: str | None = None) -> tuple[Path, Any]:
    """A random transformers ``name`` model (MODELS) written as a GGUF file ``folder/file``; returns (path, the
    transformers model it came from). ``types``: tensor type per GGUF name (default: Q8_0 for attention and the
    embedding, F16 for the feed-forward and output, F32 for norms and biases); ``"llama-types"`` cycles through
    every supported type; ``all_f32``: every tensor F32 (exact). ``arch_override``: write another
    general.architecture (the refusal tests). ``sentencepiece``: a ``llama`` (SentencePiece) vocabulary instead of
    the byte-level BPE. ``tokenizer_model``: another tokenizer.ggml.model (the refusal tests)."""
    import gguf
    import torch
    import transformers

    arch, config_name, model_name, settings = MODELS[name]
    vocabulary = "sentencepiece" if sentencepiece else VOCABULARY.get(name, "gpt2")
    scores: list[float] = []
    merges: list[str] = []
    if vocabulary == "sentencepiece":
        tokens, scores, token_types = sentencepiece_vocab(folder / "_sp")
    elif vocabulary == "gemma":
        tokens, scores, token_types = gemma_vocab(folder / "_sp")
    elif vocabulary == "phi3":
        tokens, scores, token_types = phi3_vocab(folder / "_sp")
    else:
        tokens, merges, token_types = byte_bpe()
    ids = dict(pad_token_id=0, eos_token_id=1, bos_token_id=2) if vocabulary == "gemma" else \
        dict(bos_token_id=1, eos_token_id=2)
    cfg = getattr(transformers, config_name)(vocab_size=len(tokens), max_position_embeddings=128,
                                             initializer_range=0.1, **{**ids, **settings})
    torch.manual_seed(seed)
    hf = getattr(transformers, model_name)(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 1:  # norms start at 1 (Gemma's at 0), biases at 0: move them so a misread one shows
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
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = rope["full_attention"]["rope_theta"] if "full_attention" in rope else \
        rope["rope_theta"] if rope else cfg.rope_theta
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(len(tokens))
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if arch in ("llama", "phi3"):
        w.add_rope_dimension_count(int(head_dim * getattr(cfg, "partial_rotary_factor", 1.0) or head_dim))
    if arch in ("qwen3", "gemma3"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch == "gemma3" or name in ("mistral", "phi3-window"):
        w.add_sliding_window(cfg.sliding_window)
    if name == "gemma3-head48":  # what llama.cpp assumes for Gemma 3 (every 6th layer global, local base 10 000),
        # said otherwise by the keys GGUF has for it
        w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg.layer_types])
        w.add_rope_freq_base_swa(float(cfg.rope_parameters["sliding_attention"]["rope_theta"]))
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    if tokenizer_model is not None:
        w.add_tokenizer_model(tokenizer_model)
    if vocabulary == "gpt2":
        if tokenizer_model is None:
            w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2" if arch in ("qwen2", "qwen3") else "smollm")
        w.add_token_merges(merges)
        w.add_add_bos_token(arch == "llama")  # the llama file puts BOS first, the qwen2/qwen3 ones do not
    else:
        if tokenizer_model is None:
            w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_scores(scores)
        if vocabulary == "gemma":
            w.add_add_bos_token(True)
            w.add_pad_token_id(0)
        elif vocabulary == "phi3":
            w.add_add_bos_token(False)  # said by the file: no BOS
            w.add_pad_token_id(0)
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)
    if vocabulary != "gpt2":
        w.add_unk_token_id(3 if vocabulary == "gemma" else 0)
    w.add_chat_template(TEMPLATE)
    for key, value in (extra or {}).items():
        w.add_key_value(key, *value)
    rng = np.random.default_rng(seed)
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    matrices = 0  # "llama-types": the i-th matrix gets the i-th type
    for hf_name, tensor in hf.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        g = gguf_name(hf_name, arch)
        if g is None:
            continue
        a = tensor.detach().float().numpy()
        if arch == "llama" and g.endswith("attn_q.weight"):
            a = permute(a, heads)
        elif arch == "llama" and g.endswith("attn_k.weight"):
            a = permute(a, kv)
        if arch == "gemma3" and g.endswith("norm.weight"):
            a = a + 1.0  # llama.cpp stores Gemma's norms as 1 + w
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


def reference_from_config(path: Path, config: Any) -> Any:
    """transformers' model class of ``config`` (a Hugging Face config equivalent to the file's metadata) holding the
    tensors transformers' own GGUF code dequantises and processes from ``path`` (``load_gguf_checkpoint``, mapped onto
    that model): the reference where transformers' GGUF reader leaves a setting the file states at a default (a
    Mistral-shaped llama's window, Gemma 3's query scale, pattern and local base, Phi-3's partial rotary, Qwen3's
    head_dim)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    if config.model_type == "mistral":  # gguf-py knows no mistral layout: the reader's llama model, same names
        weights = reference(path).state_dict()
    else:
        weights = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if "lm_head.weight" in missing:
        model.tie_weights()
    return model.eval()
