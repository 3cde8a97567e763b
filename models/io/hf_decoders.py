"""Hugging Face folders of the later decoder families, read into ``models.families.gpt.GPT`` (LLaMA + switches).

Every family here is LLaMA's block (RMSNorm, rotate-half RoPE, gated feed-forward, grouped-query attention) with a
few switches of ``GPTConfig`` turned on, and a weight map; none needs a class of its own:

- ``qwen2`` (Qwen2, Qwen2.5): biases on the query, key and value projections (``qkv_bias``); tied or untied output;
- ``qwen3``: per-head RMSNorm on queries and keys before RoPE (``qk_norm``), and a ``head_dim`` of its own;
- ``mistral``: sliding-window attention (``sliding_window``: query i sees keys i − w < j ≤ i, every layer);
- ``phi3``: q, k and v stored as one ``qkv_proj`` and gate/up as one ``gate_up_proj``, unfused here (rows
  [q | k | v] and [gate | up]); sliding window where the config has one;
- ``mixtral``: a router and ``num_local_experts`` SwiGLU experts per layer (``n_experts``; models/families/moe.py),
  from either the Hub's per-expert tensors (``block_sparse_moe.experts.e.w1/w2/w3``) or fused ones
  (``mlp.experts.gate_up_proj`` (E, 2F, D) and ``down_proj`` (E, D, F));
- ``gemma3_text`` (Gemma 3): embeddings scaled by √d_model, a norm before *and after* the attention and the
  feed-forward (``sandwich_norm``), RMSNorm as x̂·(1 + w) (stored weights + 1 here, so the project's RMSNorm
  computes it), q/k norms, GeGLU (tanh GELU), a score scale of query_pre_attn_scalar^−½, local (sliding) and
  global layers alternating (``layer_types``, or the older ``sliding_window_pattern``), a local RoPE base, and the
  final logit soft-capping where the config sets it. ``attn_logit_softcapping`` is read but not applied: Gemma 3
  replaced Gemma 2's attention soft-capping by the q/k norms (Gemma Team 2025, §2), and transformers' Gemma 3 keeps
  the field without using it, so applying it would differ from the model as trained.

- ``gemma`` (Gemma 1; PaliGemma's language model): embeddings scaled by √d_model, RMSNorm as x̂·(1 + w), GeGLU (tanh
  GELU; the legacy ``hidden_act="gelu"`` means it too, as transformers reads it), a ``head_dim`` of its own, scores
  scaled by head_dim^−½ (the default of a head that wide); no sandwich norms, q/k norms, windows or soft-capping
  (Gemma Team 2024). A config with ``use_bidirectional_attention`` (an encoder) is refused; PaliGemma's reader
  (models/io/hf_vlm.py) turns on the prefix LM its processor asks for instead.
- ``gemma2`` (Gemma 2; PaliGemma 2's language model): Gemma's embeddings, norms and GeGLU, with Gemma 3's sandwich
  norms, query_pre_attn_scalar, local (sliding) and global layers alternating, the final logit soft-capping, and the
  attention soft-capping Gemma 3 dropped: each scaled score z becomes cap·tanh(z/cap) before the mask and softmax
  (``attn_softcap``, on the explicit attention path; the fast runners refuse it).

- ``phi3`` with a ``partial_rotary_factor`` (Phi-4-mini: 0.75): RoPE over the first dimensions of each head only
  (``rotary_dim``);
- ``gpt_neox`` (GPT-NeoX, Pythia): LayerNorm with biases, biases on every projection, q, k and v fused per head
  (``query_key_value`` rows [q_h | k_h | v_h] for each head h), partial rotary (``rotary_pct``), an exact-GELU
  feed-forward, and a parallel residual where ``use_parallel_residual`` says so (``parallel_residual``: the
  feed-forward reads the block's input beside the attention); an untied output projection (``embed_out``).

RoPE scaling variants (linear, dynamic, YaRN, LongRoPE) are refused with the reason; partial rotary factors where
a family above does not read them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from models.io.checkpoint import CheckpointError
from models.io.hf import _token_id, load_gpt, rope_params, rotary_dim


def _rope(hf: dict[str, Any], where: Path, key: str | None = None, default: float = 10000.0) -> float:
    """RoPE θ (``models.io.hf.rope_params``), for a family that rotates every dimension of a head."""
    theta, fraction = rope_params(hf, where, key, default)
    if fraction != 1.0:
        raise CheckpointError(where, "a partial rotary factor is not supported for this family (RoPE over the whole "
                                     "head only)")
    return theta


def _layer_types(hf: dict[str, Any], n: int, kind: str) -> tuple[int, tuple[str, ...]]:
    """(window, per-layer "sliding"/"full") of a config; (0, ()) where no layer slides."""
    window = int(hf.get("sliding_window") or 0)
    if kind in ("qwen2", "qwen3") and not hf.get("use_sliding_window", False):
        window = 0  # Qwen configs carry a window that is switched off
    types = hf.get("layer_types")
    if types:
        named = tuple("sliding" if str(t).startswith("sliding") else "full" for t in types)
    elif kind in ("qwen2", "qwen3"):
        start = int(hf.get("max_window_layers", n))
        named = tuple("sliding" if i >= start else "full" for i in range(n))
    elif kind == "gemma2":  # every other layer local, the first one too
        named = tuple("sliding" if (i + 1) % 2 else "full" for i in range(n))
    elif kind == "gemma3_text":
        pattern = int(hf.get("sliding_window_pattern", 6))
        named = tuple("sliding" if (i + 1) % pattern else "full" for i in range(n))
    else:
        named = ()
    if not window or (named and "sliding" not in named):
        return 0, ()
    return window, named


def _config(hf: dict[str, Any], where: Path, kind: str, tie: bool = False, **switches: Any) -> Any:
    from models.families.gpt import GPTConfig

    d, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    head_dim = int(hf.get("head_dim") or d // heads)
    if hf.get("mlp_bias"):
        raise CheckpointError(where, "feed-forward biases are not supported")
    n = int(hf["num_hidden_layers"])
    window, types = _layer_types(hf, n, kind)
    try:
        return GPTConfig(recipe="llama", vocab_size=int(hf["vocab_size"]),
                         max_len=int(hf.get("max_position_embeddings") or 4096), d_model=d, n_layers=n, n_heads=heads,
                         n_kv_heads=int(hf.get("num_key_value_heads") or heads), d_ff=int(hf["intermediate_size"]),
                         head_dim=head_dim if head_dim != d // heads or d % heads else 0,
                         norm_eps=float(hf.get("rms_norm_eps", 1e-6)), rope_layout="half",
                         tie_embeddings=bool(hf.get("tie_word_embeddings", tie)), sliding_window=window,
                         layer_types=types, bos_id=_token_id(hf, "bos_token_id", 1),
                         eos_id=_token_id(hf, "eos_token_id", 2), pad_id=-1, **switches)
    except ValueError as err:
        raise CheckpointError(where, str(err)) from None


def _act(hf: dict[str, Any], where: Path, allowed: dict[str, str]) -> str:
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "silu"
    if act not in allowed:
        raise CheckpointError(where, f"activation {act!r} is not supported ({', '.join(allowed)})")
    return allowed[act]


def _common(s: dict[str, Tensor], config: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Embedding, final norm and output projection (a tied head is the embedding)."""
    ours = {"embed.weight": s["embed_tokens.weight"], "norm.weight": s["norm.weight"]}
    ours["lm_head.weight"] = ours["embed.weight"] if config.tie_embeddings else state["lm_head.weight"]
    return ours


def _attention(s: dict[str, Tensor], h: str, o: str, ours: dict[str, Tensor], bias: bool, qk_norm: bool) -> None:
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        ours[o + f"attn.{name}.weight"] = s[h + f"self_attn.{name}.weight"]
    if bias:
        for name in ("q_proj", "k_proj", "v_proj"):
            ours[o + f"attn.{name}.bias"] = s[h + f"self_attn.{name}.bias"]
    if qk_norm:
        ours[o + "attn.q_norm.weight"] = s[h + "self_attn.q_norm.weight"]
        ours[o + "attn.k_norm.weight"] = s[h + "self_attn.k_norm.weight"]


def _mlp(s: dict[str, Tensor], h: str, o: str, ours: dict[str, Tensor]) -> None:
    for a, b in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
        ours[o + f"ff.{b}.weight"] = s[h + f"mlp.{a}.weight"]


def _build(config: Any, ours: dict[str, Tensor], where: Path, name: str) -> Any:
    return load_gpt(config, ours, where, name)


def _llama_like(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str, kind: str, name: str,
                **switches: Any) -> Any:
    """qwen2, qwen3 and mistral: LLaMA's tensor names, plus q/k/v biases (qwen2) or q/k norms (qwen3); ``switches``:
    more GPTConfig settings a caller read (Qwen2.5-VL's M-RoPE sections)."""
    where = Path(where)
    bias = kind == "qwen2" or bool(hf.get("attention_bias"))  # Qwen2 always; the others where the config says
    qk_norm = kind == "qwen3"
    config = _config(hf, where, kind, rope_base=_rope(hf, where), qkv_bias=bias, qk_norm=qk_norm,
                     ff_act=_act(hf, where, {"silu": "silu"}), **switches)
    s = {k.removeprefix("model."): v for k, v in state.items()}
    ours = _common(s, config, state)
    for i in range(config.n_layers):
        h, o = f"layers.{i}.", f"blocks.{i}."
        ours[o + "norm1.weight"] = s[h + "input_layernorm.weight"]
        ours[o + "norm2.weight"] = s[h + "post_attention_layernorm.weight"]
        _attention(s, h, o, ours, bias, qk_norm)
        _mlp(s, h, o, ours)
    return _build(config, ours, where, name)


def qwen2_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json") -> Any:
    """Qwen2 / Qwen2.5 causal LM (q/k/v biases)."""
    return _llama_like(hf, state, where, "qwen2", "Qwen2")


def qwen2_mrope_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str,
                           sections: tuple[int, ...]) -> Any:
    """Qwen2.5-VL's language model (models/io/hf_vlm.py): Qwen2 with M-RoPE over ``sections`` of each head's
    frequency pairs (``rope_parameters`` already read to the default rotation there)."""
    return _llama_like(hf, state, where, "qwen2", "Qwen2.5-VL's language model", mrope_section=tuple(sections))


def qwen3_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json") -> Any:
    """Qwen3 causal LM (per-head q/k RMSNorm, its own head_dim)."""
    return _llama_like(hf, state, where, "qwen3", "Qwen3")


def mistral_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json") -> Any:
    """Mistral causal LM (sliding-window attention on every layer)."""
    return _llama_like(hf, state, where, "mistral", "Mistral")


def phi3_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json") -> Any:
    """Phi-3 causal LM: fused qkv_proj rows [q (H·d) | k (Hkv·d) | v (Hkv·d)] and gate_up_proj rows [gate | up];
    RoPE over the first partial_rotary_factor · d_head dimensions of each head."""
    where = Path(where)
    theta, fraction = rope_params(hf, where)
    d_head = int(hf.get("head_dim") or int(hf["hidden_size"]) // int(hf["num_attention_heads"]))
    config = _config(hf, where, "phi3", rope_base=theta, rotary_dim=rotary_dim(fraction, d_head, where),
                     ff_act=_act(hf, where, {"silu": "silu"}))
    s = {k.removeprefix("model."): v for k, v in state.items()}
    ours = _common(s, config, state)
    nq, nkv = config.n_heads * config.d_head, config.kv_heads * config.d_head
    for i in range(config.n_layers):
        h, o = f"layers.{i}.", f"blocks.{i}."
        ours[o + "norm1.weight"] = s[h + "input_layernorm.weight"]
        ours[o + "norm2.weight"] = s[h + "post_attention_layernorm.weight"]
        qkv = s[h + "self_attn.qkv_proj.weight"]
        ours[o + "attn.q_proj.weight"], ours[o + "attn.k_proj.weight"], ours[o + "attn.v_proj.weight"] = (
            qkv[:nq], qkv[nq : nq + nkv], qkv[nq + nkv :])
        ours[o + "attn.o_proj.weight"] = s[h + "self_attn.o_proj.weight"]
        gate, up = s[h + "mlp.gate_up_proj.weight"].chunk(2, 0)
        ours[o + "ff.gate.weight"], ours[o + "ff.up.weight"] = gate, up
        ours[o + "ff.down.weight"] = s[h + "mlp.down_proj.weight"]
    return _build(config, ours, where, "Phi-3")


def mixtral_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json") -> Any:
    """Mixtral causal LM: per layer a router (``gate``) and ``num_local_experts`` SwiGLU experts, top-k routing."""
    where = Path(where)
    config = _config(hf, where, "mixtral", rope_base=_rope(hf, where), ff_act=_act(hf, where, {"silu": "silu"}),
                     n_experts=int(hf["num_local_experts"]), experts_per_token=int(hf.get("num_experts_per_tok", 2)))
    s = {k.removeprefix("model."): v for k, v in state.items()}
    ours = _common(s, config, state)
    f = config.ff_width
    for i in range(config.n_layers):
        h, o = f"layers.{i}.", f"blocks.{i}."
        ours[o + "norm1.weight"] = s[h + "input_layernorm.weight"]
        ours[o + "norm2.weight"] = s[h + "post_attention_layernorm.weight"]
        _attention(s, h, o, ours, False, False)
        hub = h + "block_sparse_moe."
        moe = hub if hub + "gate.weight" in s else h + "mlp."
        router = s.get(moe + "gate.weight", s.get(moe + "gate.router.weight"))
        if router is None:
            raise KeyError(moe + "gate.weight")
        ours[o + "ff.router.weight"] = router
        for e in range(config.n_experts):
            x = o + f"ff.experts.{e}."
            if moe + f"experts.{e}.w1.weight" in s:  # the Hub's layout: w1 gate, w3 up, w2 down
                for a, b in (("w1", "gate"), ("w3", "up"), ("w2", "down")):
                    ours[x + f"{b}.weight"] = s[moe + f"experts.{e}.{a}.weight"]
            else:  # fused: gate_up_proj (E, 2F, D) rows [gate | up], down_proj (E, D, F)
                gate_up = s[moe + "experts.gate_up_proj"][e]
                ours[x + "gate.weight"], ours[x + "up.weight"] = gate_up[:f], gate_up[f:]
                ours[x + "down.weight"] = s[moe + "experts.down_proj"][e]
    return _build(config, ours, where, "Mixtral")


def _plus_one(t: Tensor) -> Tensor:
    """Gemma's RMSNorm computes x̂·(1 + w): the stored w + 1, so the project's RMSNorm (x̂·g) computes it."""
    return t.float() + 1.0


def _refuse_gemma(hf: dict[str, Any], where: Path, name: str, model_type: str, prefix_lm: bool = False) -> None:
    """What the Gemma readers do not read: a bidirectional Gemma (an encoder; PaliGemma's prefix LM aside) and
    attention biases."""
    if hf.get("use_bidirectional_attention") and not prefix_lm:
        raise CheckpointError(where, f"bidirectional {name} (an encoder) is not a causal language model")
    if hf.get("attention_bias"):
        raise CheckpointError(where, f"attention biases are not supported for {model_type}")


def gemma_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json",
                     prefix_lm: bool = False) -> Any:
    """Gemma 1 causal LM (``GemmaForCausalLM``): see the module docstring. ``prefix_lm``: PaliGemma's language model,
    whose prompt attends bidirectionally (``DecoderSpec.prefix_lm``)."""
    import math

    where = Path(where)
    _refuse_gemma(hf, where, "Gemma", "gemma", prefix_lm)
    d, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    head_dim = int(hf.get("head_dim") or d // heads)
    act = hf.get("hidden_act") or hf.get("hidden_activation") or "gelu_pytorch_tanh"
    config = _config({**hf, "head_dim": head_dim, "hidden_act": act}, where, "gemma", tie=True,
                     rope_base=_rope(hf, where), embed_scale=math.sqrt(d),
                     prefix_lm=prefix_lm,
                     ff_act=_act({"hidden_act": act}, where, GEMMA_GELU))
    s = {k.removeprefix("model."): v for k, v in state.items()}
    ours = _common(s, config, state)
    ours["norm.weight"] = _plus_one(ours["norm.weight"])
    for i in range(config.n_layers):
        h, o = f"layers.{i}.", f"blocks.{i}."
        ours[o + "norm1.weight"] = _plus_one(s[h + "input_layernorm.weight"])
        ours[o + "norm2.weight"] = _plus_one(s[h + "post_attention_layernorm.weight"])
        _attention(s, h, o, ours, False, False)
        _mlp(s, h, o, ours)
    return _build(config, ours, where, "Gemma")


# Gemma 1 and 2's "gelu" is the tanh approximation, whatever name the config gives it
GEMMA_GELU = {"gelu": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


def _sandwich_norms(s: dict[str, Tensor], h: str, o: str, ours: dict[str, Tensor]) -> None:
    """Gemma 2 and 3's four norms of a layer (before and after attention and the feed-forward), each weight + 1."""
    for a, b in (("input_layernorm", "norm1"), ("post_attention_layernorm", "post_attn_norm"),
                 ("pre_feedforward_layernorm", "norm2"), ("post_feedforward_layernorm", "post_ff_norm")):
        ours[o + f"{b}.weight"] = _plus_one(s[h + f"{a}.weight"])


def gemma2_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json",
                      prefix_lm: bool = False) -> Any:
    """Gemma 2 causal LM (``Gemma2ForCausalLM``): see the module docstring. ``prefix_lm``: PaliGemma 2's."""
    import math

    where = Path(where)
    _refuse_gemma(hf, where, "Gemma 2", "gemma2", prefix_lm)
    act = hf.get("hidden_act") or hf.get("hidden_activation") or "gelu_pytorch_tanh"
    softcap = hf.get("attn_logit_softcapping", 50.0)  # absent: Gemma2Config's default; null: none
    final = hf.get("final_logit_softcapping", 30.0)
    config = _config({**hf, "sliding_window": hf.get("sliding_window", 4096)}, where, "gemma2", tie=True,
                     rope_base=_rope(hf, where), embed_scale=math.sqrt(int(hf["hidden_size"])), sandwich_norm=True,
                     attn_scale=float(hf.get("query_pre_attn_scalar") or 256) ** -0.5,
                     attn_softcap=float(softcap or 0.0), final_softcap=float(final or 0.0), prefix_lm=prefix_lm,
                     ff_act=_act({"hidden_act": act}, where, GEMMA_GELU))
    s = {k.removeprefix("model."): v for k, v in state.items()}
    ours = _common(s, config, state)
    ours["norm.weight"] = _plus_one(ours["norm.weight"])
    for i in range(config.n_layers):
        h, o = f"layers.{i}.", f"blocks.{i}."
        _sandwich_norms(s, h, o, ours)
        _attention(s, h, o, ours, False, False)
        _mlp(s, h, o, ours)
    return _build(config, ours, where, "Gemma 2")


def gemma3_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json") -> Any:
    """Gemma 3 text model (``Gemma3ForCausalLM``): see the module docstring for what differs from LLaMA."""
    import math

    where = Path(where)
    _refuse_gemma(hf, where, "Gemma 3", "gemma3_text")
    params = hf.get("rope_parameters") or {}
    if isinstance(params.get("full_attention"), dict):  # transformers 5: one RoPE per layer type
        glob = _rope(hf, where, "full_attention", 1_000_000.0)
    else:  # transformers 4: rope_theta (global) and rope_local_base_freq
        glob = _rope(hf, where, None, 1_000_000.0)
    if isinstance(params.get("sliding_attention"), dict):
        local = _rope({k: v for k, v in hf.items() if k != "rope_scaling"}, where, "sliding_attention", 10_000.0)
    else:
        local = float(hf.get("rope_local_base_freq") or 10_000.0)
    config = _config(hf, where, "gemma3_text", tie=True, rope_base=glob, local_rope_base=local, qk_norm=True,
                     embed_scale=math.sqrt(int(hf["hidden_size"])), sandwich_norm=True,
                     attn_scale=float(hf.get("query_pre_attn_scalar") or 256) ** -0.5,
                     final_softcap=float(hf.get("final_logit_softcapping") or 0.0),
                     ff_act=_act(hf, where, {"gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}))
    s = {k.removeprefix("model.").removeprefix("language_model."): v for k, v in state.items()}
    ours = _common(s, config, state)
    ours["norm.weight"] = _plus_one(ours["norm.weight"])
    for i in range(config.n_layers):
        h, o = f"layers.{i}.", f"blocks.{i}."
        _sandwich_norms(s, h, o, ours)
        _attention(s, h, o, ours, False, True)
        ours[o + "attn.q_norm.weight"] = _plus_one(ours[o + "attn.q_norm.weight"])
        ours[o + "attn.k_norm.weight"] = _plus_one(ours[o + "attn.k_norm.weight"])
        _mlp(s, h, o, ours)
    return _build(config, ours, where, "Gemma 3")



def gpt_neox_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json") -> Any:
    """GPT-NeoX causal LM (Pythia): the "neox" recipe of ``models.families.gpt`` with partial rotary and a parallel
    residual where the config says; ``query_key_value`` rows split per head into q, k and v."""
    from models.families.gpt import GPTConfig

    where = Path(where)
    d, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    d_head = d // heads
    theta, fraction = rope_params(hf, where)
    if hf.get("attention_bias", True) is False:
        raise CheckpointError(where, "GPT-NeoX without attention biases is not supported")
    try:
        config = GPTConfig(recipe="neox", vocab_size=int(hf["vocab_size"]),
                           max_len=int(hf.get("max_position_embeddings") or 2048), d_model=d,
                           n_layers=int(hf["num_hidden_layers"]), n_heads=heads, d_ff=int(hf["intermediate_size"]),
                           norm_eps=float(hf.get("layer_norm_eps", 1e-5)), rope_base=theta, rope_layout="half",
                           rotary_dim=rotary_dim(fraction, d_head, where),
                           parallel_residual=bool(hf.get("use_parallel_residual", True)),
                           ff_act=_act(hf, where, {"gelu": "gelu", "gelu_new": "gelu_tanh", "relu": "relu"}),
                           tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
                           bos_id=_token_id(hf, "bos_token_id", 0), eos_id=_token_id(hf, "eos_token_id", 0), pad_id=-1)
    except ValueError as err:
        raise CheckpointError(where, str(err)) from None
    s = {k.removeprefix("gpt_neox."): v for k, v in state.items()}
    ours = {"embed.weight": s["embed_in.weight"], "norm.weight": s["final_layer_norm.weight"],
            "norm.bias": s["final_layer_norm.bias"]}
    ours["lm_head.weight"] = ours["embed.weight"] if config.tie_embeddings else state["embed_out.weight"]
    for i in range(config.n_layers):
        h, o = f"layers.{i}.", f"blocks.{i}."
        for theirs, mine in (("input_layernorm", "norm1"), ("post_attention_layernorm", "norm2"),
                             ("attention.dense", "attn.o_proj"), ("mlp.dense_h_to_4h", "ff.up"),
                             ("mlp.dense_4h_to_h", "ff.down")):
            ours[o + mine + ".weight"], ours[o + mine + ".bias"] = s[h + theirs + ".weight"], s[h + theirs + ".bias"]
        w = s[h + "attention.query_key_value.weight"].view(heads, 3, d_head, d)  # per head: q, k, v rows
        b = s[h + "attention.query_key_value.bias"].view(heads, 3, d_head)
        for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
            ours[o + f"attn.{name}.weight"] = w[:, j].reshape(d, d)
            ours[o + f"attn.{name}.bias"] = b[:, j].reshape(d)
    return _build(config, ours, where, "GPT-NeoX")


def mamba_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json") -> Any:
    """``Mamba`` from a Hugging Face ``mamba`` config dict and ``MambaForCausalLM`` state dict (``backbone.`` names)."""
    from models.families.mamba import Mamba, MambaConfig

    where = Path(where)
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(where, f"activation {hf['hidden_act']!r} is not supported (silu)")
    d = int(hf["hidden_size"])
    rank = hf.get("time_step_rank", "auto")
    config = MambaConfig(vocab_size=int(hf["vocab_size"]), d_model=d, n_layers=int(hf["num_hidden_layers"]),
                         d_state=int(hf.get("state_size", 16)), d_conv=int(hf.get("conv_kernel", 4)),
                         expand=int(hf.get("expand", 2)), dt_rank=0 if rank == "auto" else int(rank),
                         norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
                         conv_bias=bool(hf.get("use_conv_bias", True)), bias=bool(hf.get("use_bias", False)),
                         tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
                         bos_id=_token_id(hf, "bos_token_id", 0), eos_id=_token_id(hf, "eos_token_id", 0))
    s = {k.removeprefix("backbone."): v for k, v in state.items()}
    ours: dict[str, Tensor] = {"embed.weight": s.get("embeddings.weight", s.get("embedding.weight")),
                               "norm.weight": s["norm_f.weight"]}
    if ours["embed.weight"] is None:
        raise KeyError("backbone.embeddings.weight")
    for i in range(config.n_layers):
        h, o = f"layers.{i}.", f"blocks.{i}."
        ours[o + "norm.weight"] = s[h + "norm.weight"]
        for name in ("in_proj", "conv1d", "x_proj", "dt_proj", "out_proj"):
            for kind in ("weight", "bias"):
                if h + f"mixer.{name}.{kind}" in s:
                    ours[o + f"mixer.{name}.{kind}"] = s[h + f"mixer.{name}.{kind}"]
        ours[o + "mixer.A_log"], ours[o + "mixer.D"] = s[h + "mixer.A_log"], s[h + "mixer.D"]
    ours["lm_head.weight"] = ours["embed.weight"] if config.tie_embeddings else state["lm_head.weight"]
    model = Mamba(config)
    missing, unexpected = model.load_state_dict({k: v.float().contiguous() for k, v in ours.items()}, strict=False)
    if missing or unexpected:
        raise CheckpointError(where, f"weights do not fit Mamba: missing {missing}, unexpected {unexpected}")
    return model
