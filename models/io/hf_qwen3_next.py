"""A Hugging Face ``qwen3_next`` folder (``Qwen3NextForCausalLM``) read into ``models.families.qwen3_next.Qwen3Next``.

The weight map:

- the zero-centred RMSNorms (input and post-attention norms, the final norm, q/k norms: x̂·(1 + w)) are read as
  w + 1, so the project's RMSNorm computes them (as Gemma's, models/io/hf_decoders.py); the DeltaNet's gated norm is
  a plain x̂·w and is read as it is;
- ``linear_attn.in_proj_qkvz`` holds, per key head g, [q_g | k_g | v of its value heads | z of its value heads]
  (d_k, d_k, r·d_v, r·d_v rows, r = value heads per key head): unfused here into q, k, v, z projections whose rows
  run head by head, the order of the convolution's channels (all q, all k, all v); ``in_proj_ba`` likewise
  [b of the group | a of the group] per key head;
- the experts from either the Hub's per-expert tensors (``mlp.experts.e.gate_proj/up_proj/down_proj``) or fused ones
  (``mlp.experts.gate_up_proj`` (E, 2F, D) and ``down_proj`` (E, D, F)); ``mlp.gate`` is the router.

Settings the class does not compute are refused by name: another activation than SiLU, RoPE scaling (through
``models.io.hf.rope_params``), a partial rotary factor that turns an odd number of dimensions. transformers'
default partial rotary factor for this family is 0.25, and a config without one gets it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from models.io.checkpoint import CheckpointError
from models.io.hf import _token_id, rope_params


def _kinds(hf: dict[str, Any], n: int, where: Path) -> tuple[str, ...]:
    """Each layer's mixer ("linear" / "full") from ``layer_types`` or ``full_attention_interval`` (default 4)."""
    types = hf.get("layer_types")
    if not types:
        every = int(hf.get("full_attention_interval", 4))
        return tuple("linear" if (i + 1) % every else "full" for i in range(n))
    named = {"linear_attention": "linear", "full_attention": "full"}
    unknown = sorted({str(t) for t in types} - set(named))
    if unknown or len(types) != n:
        raise CheckpointError(where, f"layer_types must be {n} of {sorted(named)}, got {unknown or len(types)}")
    return tuple(named[t] for t in types)


def qwen3_next_from_state(hf: dict[str, Any], state: dict[str, Tensor], where: Path | str = "config.json") -> Any:
    """``Qwen3Next`` from a ``qwen3_next`` config dict and ``Qwen3NextForCausalLM`` state dict (``model.`` names)."""
    from models.families.qwen3_next import Qwen3Next, Qwen3NextConfig

    where = Path(where)
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(where, f"activation {hf['hidden_act']!r} is not supported (silu)")
    theta, _ = rope_params(hf, where)
    params = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}
    fraction = float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25)))
    n, d = int(hf["num_hidden_layers"]), int(hf["hidden_size"])
    heads = int(hf["num_attention_heads"])
    d_head = int(hf.get("head_dim") or d // heads)
    rotary = int(d_head * fraction)
    if rotary < 2 or rotary % 2:
        raise CheckpointError(where, f"a partial rotary factor of {fraction} turns {rotary} of {d_head} dimensions "
                                     "(an even number from 2 up is needed)")
    experts = int(hf.get("num_experts", 0))
    step, dense_only = int(hf.get("decoder_sparse_step", 1)), set(hf.get("mlp_only_layers") or [])
    sparse = tuple(i not in dense_only and experts > 0 and (i + 1) % step == 0 for i in range(n))
    try:
        config = Qwen3NextConfig(
            vocab_size=int(hf["vocab_size"]), d_model=d, n_layers=n, n_heads=heads,
            n_kv_heads=int(hf.get("num_key_value_heads", heads)), d_head=d_head, rotary_dim=rotary, rope_base=theta,
            qkv_bias=bool(hf.get("attention_bias", False)), ff_width=int(hf["intermediate_size"]),
            linear_k_heads=int(hf["linear_num_key_heads"]), linear_v_heads=int(hf["linear_num_value_heads"]),
            linear_k_dim=int(hf["linear_key_head_dim"]), linear_v_dim=int(hf["linear_value_head_dim"]),
            conv_kernel=int(hf.get("linear_conv_kernel_dim", 4)), n_experts=experts,
            experts_per_token=int(hf.get("num_experts_per_tok", 1)),
            expert_width=int(hf.get("moe_intermediate_size", 0)),
            shared_width=int(hf.get("shared_expert_intermediate_size", 0)),
            norm_topk=bool(hf.get("norm_topk_prob", True)), layer_types=_kinds(hf, n, where), sparse=sparse,
            norm_eps=float(hf.get("rms_norm_eps", 1e-6)), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_len=int(hf.get("max_position_embeddings", 32768)), bos_id=_token_id(hf, "bos_token_id", 0),
            eos_id=_token_id(hf, "eos_token_id", 0), pad_id=_token_id(hf, "pad_token_id", -1))
    except ValueError as err:
        raise CheckpointError(where, str(err)) from None
    c = config
    s = {k.removeprefix("model."): v for k, v in state.items()}
    ours: dict[str, Tensor] = {"embed.weight": s["embed_tokens.weight"], "norm.weight": s["norm.weight"] + 1}
    hk, hv, dk, dv = c.linear_k_heads, c.linear_v_heads, c.linear_k_dim, c.linear_v_dim
    r = hv // hk
    for i, kind in enumerate(c.kinds):
        h, o = f"layers.{i}.", f"blocks.{i}."
        ours[o + "norm1.weight"] = s[h + "input_layernorm.weight"] + 1
        ours[o + "norm2.weight"] = s[h + "post_attention_layernorm.weight"] + 1
        if kind == "full":
            a = h + "self_attn."
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                ours[o + f"mixer.{name}.weight"] = s[a + f"{name}.weight"]
                if c.qkv_bias:
                    ours[o + f"mixer.{name}.bias"] = s[a + f"{name}.bias"]
            ours[o + "mixer.q_norm.weight"] = s[a + "q_norm.weight"] + 1
            ours[o + "mixer.k_norm.weight"] = s[a + "k_norm.weight"] + 1
        else:
            a = h + "linear_attn."
            qkvz = s[a + "in_proj_qkvz.weight"].reshape(hk, 2 * dk + 2 * r * dv, d)
            q, k, v, z = qkvz.split([dk, dk, r * dv, r * dv], dim=1)
            b, a_ = s[a + "in_proj_ba.weight"].reshape(hk, 2 * r, d).split([r, r], dim=1)
            for name, w in (("q", q), ("k", k), ("v", v), ("z", z), ("b", b), ("a", a_)):
                ours[o + f"mixer.{name}_proj.weight"] = w.reshape(-1, d)
            for name in ("conv1d.weight", "dt_bias", "A_log", "out_proj.weight"):
                ours[o + f"mixer.{name}"] = s[a + name]
            ours[o + "mixer.norm_weight"] = s[a + "norm.weight"]
        m = h + "mlp."
        if c.is_sparse(i):
            ours[o + "ff.router.weight"] = s[m + "gate.weight"]
            ours[o + "ff.shared_gate.weight"] = s[m + "shared_expert_gate.weight"]
            for ours_name, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                ours[o + f"ff.shared.{ours_name}.weight"] = s[m + f"shared_expert.{theirs}.weight"]
            for e in range(c.n_experts):
                x = o + f"ff.experts.{e}."
                if m + f"experts.{e}.gate_proj.weight" in s:  # the Hub's layout
                    for ours_name, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                        ours[x + f"{ours_name}.weight"] = s[m + f"experts.{e}.{theirs}.weight"]
                else:  # fused: gate_up_proj (E, 2F, D) rows [gate | up], down_proj (E, D, F)
                    gate_up = s[m + "experts.gate_up_proj"][e]
                    ours[x + "gate.weight"], ours[x + "up.weight"] = gate_up.chunk(2, dim=0)
                    ours[x + "down.weight"] = s[m + "experts.down_proj"][e]
        else:
            for ours_name, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                ours[o + f"ff.{ours_name}.weight"] = s[m + f"{theirs}.weight"]
    ours["lm_head.weight"] = ours["embed.weight"] if c.tie_embeddings else state["lm_head.weight"]
    model = Qwen3Next(config)
    missing, unexpected = model.load_state_dict({k: v.float().contiguous() for k, v in ours.items()}, strict=False)
    if missing or unexpected:
        raise CheckpointError(where, f"weights do not fit Qwen3Next: missing {missing}, unexpected {unexpected}")
    return model
