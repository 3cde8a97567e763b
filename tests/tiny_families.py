"""Random-weight Hugging Face folders of the later decoder families, written by transformers itself (test-only).

Each config is small and deliberately unusual, so that a weight map or switch that only works for the common case
fails: key/value heads that do not divide evenly into 2 (6 query heads over 3 key/value heads), sliding windows
shorter than the test inputs, untied output projections, RoPE bases other than 10 000, head widths other than
d_model / n_heads. ``decoder_folder`` writes one into a folder (safetensors, with a borrowed byte-level
tokenizer.json: the tokens do not matter) and returns transformers' model, in eval mode, eager attention.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VOCAB = 300  # tests/tiny.py's byte-level tokenizer

COMMON = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=6,
              num_key_value_heads=3, max_position_embeddings=96, bos_token_id=0, eos_token_id=0, pad_token_id=0)

# model_type -> (transformers config class, causal LM class, the config's unusual values)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(rope_theta=500.0, tie_word_embeddings=False)),
    "qwen2-tied": ("Qwen2Config", "Qwen2ForCausalLM", dict(rope_theta=2500.0, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16, rope_theta=700.0, tie_word_embeddings=False)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=4, rope_theta=900.0,
                                                            tie_word_embeddings=False)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(rope_theta=3000.0, tie_word_embeddings=False,
                                                   sliding_window=5, original_max_position_embeddings=96)),
    # Gemma 1 (PaliGemma's language model): heads of 16 over a width of 48, one key/value head per three queries
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(head_dim=16, rope_theta=400.0, tie_word_embeddings=False,
                                                      hidden_act="gelu_pytorch_tanh")),
    # Gemma 2 (PaliGemma 2's): attention soft-capping low enough to bite, a window shorter than the input on layers 0
    # and 2, sandwich norms, query_pre_attn_scalar, final soft-capping
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=16, sliding_window=4, query_pre_attn_scalar=20,
                                                         attn_logit_softcapping=3.0, final_logit_softcapping=20.0,
                                                         rope_theta=600.0, tie_word_embeddings=False)),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        head_dim=16, sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        query_pre_attn_scalar=24, final_logit_softcapping=30.0, attn_logit_softcapping=None,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 50_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 800.0}},
        tie_word_embeddings=True)),
    "gemma3_text-softcap": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        head_dim=16, sliding_window=3, query_pre_attn_scalar=16, attn_logit_softcapping=2.0,
        final_logit_softcapping=None, sliding_window_pattern=2, tie_word_embeddings=False)),
    # Phi-4-mini's partial rotary (0.75 of each 8-wide head: 6 dimensions turn)
    "phi3-partial": ("Phi3Config", "Phi3ForCausalLM", dict(rope_theta=2000.0, tie_word_embeddings=False,
                                                           partial_rotary_factor=0.75)),
    # Pythia's layout: parallel residual, a quarter of each head rotating, biases everywhere, fused per-head qkv
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(rotary_pct=0.25, use_parallel_residual=True,
                                                             rope_theta=600.0, tie_word_embeddings=False)),
    "gpt_neox-sequential": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(rotary_pct=0.5, use_parallel_residual=False,
                                                                        tie_word_embeddings=False)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=5, num_experts_per_tok=2,
                                                            rope_theta=1500.0, tie_word_embeddings=False)),
}


def borrowed_tokenizer(folder: Path) -> None:
    """Copy tests/tiny.py's byte-level tokenizer.json into ``folder``."""
    from tests.tiny import tiny_gpt2_folder

    source = folder.parent / "_tokenizer"
    if not (source / "tokenizer.json").is_file():
        tiny_gpt2_folder(source)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_bytes((source / "tokenizer.json").read_bytes())


def decoder_folder(folder: Path, name: str, seed: int = 0, std: float = 0.1, **overrides: Any) -> Any:
    """Write the random ``name`` model (a FAMILIES key) into ``folder``; returns transformers' model (eval).

    std: the initialiser's spread; 0.1 rather than transformers' 0.02 so that random logits have clear winners
    (greedy ties between near-equal logits would test float rounding, not the model)."""
    import torch
    import transformers

    config_name, model_name, extra = FAMILIES[name]
    borrowed_tokenizer(folder)
    settings = {**COMMON, **extra, **overrides, "initializer_range": std}
    cfg = getattr(transformers, config_name)(**settings)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg).eval()
    with torch.no_grad():  # norm weights start at 1 (Gemma: 0): perturb them, so a norm read wrongly shows
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def rwkv_folder(folder: Path, seed: int = 0, **overrides: Any) -> Any:
    """A random ``RwkvForCausalLM`` (RWKV-4) written by transformers into ``folder`` (unusual sizes: 5 layers rescaled
    every 2, so that blocks 2–4 run halved and quartered, a feed-forward of 72, a LayerNorm ε of 1e-3, untied output);
    returns it (eval). Decays, bonuses, token-shift mixes and norms are perturbed from transformers' structured
    initial values (a swapped w and u, or a mix read as its complement, shows), and the embedding is scaled up from
    its 1e-4 gain so that the first LayerNorm's ε does not flatten the input. Saved before any forward: transformers
    divides its output weights in place when an eval model first runs, and a folder holds them undivided."""
    import torch
    import transformers

    borrowed_tokenizer(folder)
    settings = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=5, intermediate_size=72, context_length=96,
                    layer_norm_epsilon=1e-3, rescale_every=2, tie_word_embeddings=False, bos_token_id=0,
                    eos_token_id=0, pad_token_id=0)
    settings.update(overrides)
    torch.manual_seed(seed)
    model = transformers.RwkvForCausalLM(transformers.RwkvConfig(**settings)).eval()
    with torch.no_grad():
        model.rwkv.embeddings.weight.normal_(0.0, 1.0)
        for name, p in model.named_parameters():
            if "time_decay" in name or "time_first" in name:
                p.add_(torch.randn_like(p) * 0.5)
            elif "time_mix" in name:
                p.copy_((p + torch.randn_like(p) * 0.2).clamp(0.0, 1.0))
            elif p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def mamba_folder(folder: Path, seed: int = 0, **overrides: Any) -> Any:
    """A random ``MambaForCausalLM`` written by transformers into ``folder`` (unusual sizes: state 6, kernel 3,
    expand 3, time-step rank 5, untied output); returns it (eval). D and A_log are perturbed from their constant
    initial values, so a swapped or ignored one shows."""
    import torch
    import transformers

    borrowed_tokenizer(folder)
    settings = dict(vocab_size=VOCAB, hidden_size=40, state_size=6, num_hidden_layers=3, conv_kernel=3, expand=3,
                    time_step_rank=5, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                    use_mambapy=False)
    settings.update(overrides)
    torch.manual_seed(seed)
    model = transformers.MambaForCausalLM(transformers.MambaConfig(**settings)).eval()
    with torch.no_grad():
        for block in model.backbone.layers:
            block.mixer.D.add_(torch.randn_like(block.mixer.D) * 0.3)
            block.mixer.A_log.add_(torch.randn_like(block.mixer.A_log) * 0.3)
            block.norm.weight.add_(torch.randn_like(block.norm.weight) * 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    return model


# Qwen3-Next (models/families/qwen3_next.py): 5 layers, DeltaNet and softmax layers interleaved unevenly, 6 query heads
# over 3 key/value heads of 16 (a quarter rotating: 4 dimensions), DeltaNet value heads in pairs over 2 key heads
# (grouped values) with key and value widths that differ, a convolution of 3, experts on every other layer (5, top 2)
# beside dense ones, an untied output
QWEN3_NEXT = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=5, num_attention_heads=6,
                  num_key_value_heads=3, head_dim=16, max_position_embeddings=96, bos_token_id=0, eos_token_id=0,
                  pad_token_id=0, linear_conv_kernel_dim=3, linear_key_head_dim=8, linear_value_head_dim=12,
                  linear_num_key_heads=2, linear_num_value_heads=4, decoder_sparse_step=2, moe_intermediate_size=20,
                  shared_expert_intermediate_size=24, num_experts_per_tok=2, num_experts=5,
                  layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention",
                               "full_attention"],
                  rope_parameters={"rope_type": "default", "rope_theta": 700.0, "partial_rotary_factor": 0.25},
                  tie_word_embeddings=False)


def qwen3_next_folder(folder: Path, seed: int = 0, std: float = 0.1, **overrides: Any) -> Any:
    """A random ``Qwen3NextForCausalLM`` written by transformers into ``folder`` (``QWEN3_NEXT`` and ``overrides``);
    returns it (eval, eager attention). Every 1-D weight (the zero-centred norms, dt_bias, the gated norm) is
    perturbed from its constant start, so a norm read without its + 1 shows; each DeltaNet's A is drawn from
    U(0.02, 0.3) instead of transformers' U(0.01, 16), whose fast decays forget within a token or two: so the state
    carries over the tests' dozen tokens and the transitions (I − β k kᵀ) between them count."""
    import torch
    import transformers

    borrowed_tokenizer(folder)
    cfg = transformers.Qwen3NextConfig(**{**QWEN3_NEXT, **overrides, "initializer_range": std})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.Qwen3NextForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
        for layer in model.model.layers:
            if hasattr(layer, "linear_attn"):
                layer.linear_attn.A_log.copy_(torch.empty_like(layer.linear_attn.A_log).uniform_(0.02, 0.3).log())
    model.save_pretrained(folder, safe_serialization=True)
    return model
