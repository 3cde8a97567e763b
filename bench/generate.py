"""Generation with attention: ours (models/families/gpt.py as the app serves it) against transformers, same run.

GPT-2 small's shape (12 layers, 12 heads, d=768, 50,257 tokens, 124 M parameters), random weights rounded
to fp16 and given to both sides, a 20-token prompt, exactly 30 new tokens, greedy, attention kept for every
step:
- ours: ``models.decoding.fastgen.generate`` (the serving path: attention weights computed while decoding, a
  preallocated
  KV cache, no second pass), on the model with its large linear layers fp16-packed as the app's model store packs
  them (``models.decoding.packed``); ``GPT.generate``, the readable version it reproduces (KV cache with the fused
  kernel, then one explicit pass over every token), is timed beside it as ``plain``;
- reference: transformers' ``GPT2LMHeadModel`` in float32, ``attn_implementation="eager"``, its KV cache
  and ``generate(output_attentions=True, return_dict_in_generate=True)``.
Warm-up, then the median of ``--repeats`` alternating runs. ``identical``: the same 30 token ids, and every
step's attention rows within 1e-5 of ours.

The bandwidth floor: a decoding step multiplies one row by every weight matrix, so it reads every weight once
(``weight_bytes``: the blocks' and the output projection's weights as stored for the multiply, fp16 where
packed, plus biases and norms; the embedding reads one row). ``copy_gb_s`` is this machine's memory bandwidth,
measured here as a large tensor copy (bytes read + bytes written per second, as STREAM's "copy" counts; the best
of 7 copies, before and after the timed runs).
``floor_ms_per_token`` = weight_bytes / bandwidth; ``ours_ms_per_token`` = ours_s / new tokens (prompt pass
included), and ``ratio_to_floor`` their quotient (1.0 would be the memory-bound limit).

    python bench/generate.py [--repeats 5] [--threads 0]
    python bench/generate.py --family qwen3 [--repeats 1]

``--family qwen3``: Qwen3-0.6B's shape instead (28 layers, 16 query and 8 key/value heads of width 128, d=1024,
151,936 tokens, tied output; 0.6 B parameters), random weights in fp16 on both sides, read through
``models.io.hf_decoders.qwen3_from_state``, against transformers' ``Qwen3ForCausalLM`` (eager). fastgen's plan
carries its per-head q/k norms (before RoPE, keys normalised before they are cached), so ours is fastgen there too.

Last stdout line: one JSON object with ``speedup`` (reference / ours), ``ours_s``, ``reference_s``, ``plain_s``,
``identical``, ``max_attention_diff``, the floor figures above, ``cpu_s`` and ``speedup_cpu`` (the process's CPU
seconds, medians: with ``--threads 1`` a comparison that other work on a busy machine hardly moves) and the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._server import machine_info  # noqa: E402

PROMPT, NEW = 20, 30
TOLERANCE = 1e-5  # attention: ours against transformers'


def copy_bandwidth(mib: int = 256, repeats: int = 7) -> float:
    """This machine's memory bandwidth in bytes/s: a ``mib``-MiB float32 tensor copied into another (far larger
    than any cache), bytes read + written over the best of ``repeats`` times (STREAM's convention)."""
    src = torch.ones(mib << 18)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch of the pages
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return 2 * src.numel() * src.element_size() / min(times)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one decoding step reads: every block's parameters and the final norm and output projection,
    fp16-packed matrices at 2 bytes a weight (models.decoding.packed), the rest as stored; of the embeddings one row
    each."""
    from models.decoding.packed import PackedLinear

    total = 0
    parts = [model.blocks, model.norm, model.lm_head]
    for part in parts:
        for m in part.modules():
            for name, p in m.named_parameters(recurse=False):
                packed = isinstance(m, PackedLinear) and name == "weight"
                total += p.numel() * (2 if packed else p.element_size())
    rows = [model.embed] + ([model.positions] if model.positions is not None else [])
    return total + sum(e.weight[0].numel() * e.weight.element_size() for e in rows)


def build(family: str, layers: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(transformers' model, ours) of ``family``'s shape with the same random weights, rounded to fp16 (both sides
    hold them exactly); our end-of-text id is −1, so both write exactly NEW tokens."""
    from models.io.hf import gpt2_from_state
    from models.io.hf_decoders import qwen3_from_state

    torch.manual_seed(0)
    if family == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM

        cfg = Qwen3Config(vocab_size=151_936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=layers or 28,
                          num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40_960,
                          rope_theta=1_000_000.0, tie_word_embeddings=True, bos_token_id=151_643,
                          eos_token_id=151_645)
        cfg._attn_implementation = "eager"
        ref, read = Qwen3ForCausalLM(cfg).eval(), qwen3_from_state
    else:
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_layer=layers or 12, bos_token_id=50256, eos_token_id=50256)
        cfg._attn_implementation = "eager"
        ref, read = GPT2LMHeadModel(cfg).eval(), gpt2_from_state
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.half().float())  # weights that fp16 holds exactly, on both sides
    hf = cfg.to_dict()
    hf["eos_token_id"] = -1  # exactly NEW tokens on our side too (the reference blocks eos by min_new_tokens)
    return ref, read(hf, ref.state_dict()).eval()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--layers", type=int, default=0, help="fewer for a quick run (tests); 0: the family's own")
    ap.add_argument("--family", choices=("gpt2", "qwen3"), default="gpt2", help="the model's shape (see above)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from models.decoding import fastgen
    from models.decoding.packed import pack_linears

    ref, ours = build(args.family, args.layers)
    cfg = ref.config
    args.layers = cfg.num_hidden_layers
    packed = pack_linears(ours) if fastgen.supports(ours) else 0  # fastgen's fp16 copies: only where it decodes
    prompt = torch.randint(0, cfg.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(1))

    def run_ours():
        return fastgen.generate(ours, prompt[0].tolist(), max_new_tokens=NEW)

    def run_plain():
        return ours.generate(prompt[0].tolist(), max_new_tokens=NEW)

    def run_ref():
        with torch.no_grad():
            return ref.generate(prompt, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, use_cache=True,
                                output_attentions=True, return_dict_in_generate=True, pad_token_id=0)

    a, b, c = run_ours(), run_ref(), run_plain()  # warm-up, and the comparison
    same_ids = a.ids == b.sequences[0].tolist()
    plain_same = a.ids == c.ids
    diff = 0.0
    mine = a.attention["decoder"].weights  # (L, H, T, T)
    for step, layers in enumerate(b.attentions):  # step 0: the prompt (PROMPT queries); then one query each
        for layer, w in enumerate(layers):
            q = w.shape[2]
            rows = slice(0, PROMPT) if step == 0 else slice(PROMPT + step - 1, PROMPT + step)
            s = w.shape[3]
            assert q == rows.stop - rows.start
            diff = max(diff, float((torch.from_numpy(mine[layer, :, rows, :s]) - w[0]).abs().max()))
    plain_diff = float(abs(mine - c.attention["decoder"].weights).max())
    bandwidth = copy_bandwidth()
    times: dict[str, list[float]] = {"ours": [], "reference": [], "plain": []}
    cpu: dict[str, list[float]] = {"ours": [], "reference": [], "plain": []}
    for _ in range(args.repeats):
        for name, fn in (("ours", run_ours), ("reference", run_ref), ("plain", run_plain)):
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    bandwidth = max(bandwidth, copy_bandwidth())  # before and after the timed runs: the better of the two
    ours_s, ref_s = statistics.median(times["ours"]), statistics.median(times["reference"])
    plain_s = statistics.median(times["plain"])
    nbytes = weight_bytes(ours)
    floor_ms = 1e3 * nbytes / bandwidth
    ours_ms = 1e3 * ours_s / len(a.steps)
    report = {"family": args.family, "speedup": round(ref_s / ours_s, 2), "ours_s": round(ours_s, 3),
              "reference_s": round(ref_s, 3),
              "plain_s": round(plain_s, 3), "speedup_plain": round(ref_s / plain_s, 2),
              "identical": bool(same_ids and diff < TOLERANCE), "same_ids": same_ids, "max_attention_diff": diff,
              "plain_same_ids": plain_same, "plain_max_attention_diff": plain_diff,
              "weight_bytes": nbytes, "copy_gb_s": round(bandwidth / 1e9, 2), "floor_ms_per_token": round(floor_ms, 2),
              "ours_ms_per_token": round(ours_ms, 2), "ratio_to_floor": round(ours_ms / floor_ms, 2),
              "reference_ms_per_token": round(1e3 * ref_s / len(a.steps), 2),
              "times": {k: [round(t, 3) for t in v] for k, v in times.items()},
              # CPU seconds of this process: with --threads 1 a measure that other work on the machine hardly moves
              "cpu_s": {k: round(statistics.median(v), 3) for k, v in cpu.items()},
              "speedup_cpu": round(statistics.median(cpu["reference"]) / statistics.median(cpu["ours"]), 2),
              "ratio_to_floor_cpu": round(1e3 * statistics.median(cpu["ours"]) / len(a.steps) / floor_ms, 2),
              "new_tokens": len(a.steps), "prompt_tokens": PROMPT, "layers": args.layers, "packed_layers": packed,
              "parameters": sum(p.numel() for p in ref.parameters()), "repeats": args.repeats,
              "threads": torch.get_num_threads(), **machine_info()}
    print(f"ours {ours_s:.3f} s, transformers {ref_s:.3f} s: ×{ref_s / ours_s:.2f} (GPT.generate {plain_s:.3f} s: "
          f"×{ref_s / plain_s:.2f}); same ids {same_ids}, attention within {diff:.1e}; {ours_ms:.1f} ms/token against "
          f"a floor of {floor_ms:.1f} ({nbytes / 1e6:.0f} MB at {bandwidth / 1e9:.1f} GB/s): ×{ours_ms / floor_ms:.2f}",
          file=sys.stderr)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
