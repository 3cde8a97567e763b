"""Generation with attention: ours (models/gpt.py as the app serves it) against transformers, same run.

GPT-2 small's shape (12 layers, 12 heads, d=768, 50,257 tokens, 124 M parameters), random weights rounded
to fp16 and given to both sides, a 20-token prompt, exactly 30 new tokens, greedy, attention kept for every
step:
- ours: ``GPT.generate`` (KV cache, fused attention while generating, then one explicit pass over every
  token for the attention, the step candidates and the surprisal), its large linear layers fp16-packed as
  the app's model store packs them (``models.packed``);
- reference: transformers' ``GPT2LMHeadModel`` in float32, ``attn_implementation="eager"``, its KV cache
  and ``generate(output_attentions=True, return_dict_in_generate=True)``.
Warm-up, then the median of ``--repeats`` alternating runs. ``identical``: the same 30 token ids, and every
step's attention rows within 1e-4 of ours.

    python bench/generate.py [--repeats 5] [--threads 0]

Last stdout line: one JSON object with ``speedup`` (reference / ours), ``ours_s``, ``reference_s``,
``identical`` and the machine.
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--layers", type=int, default=12, help="fewer for a quick run (tests)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import GPT2Config, GPT2LMHeadModel

    from models.hf import gpt2_from_state
    from models.packed import pack_linears

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=args.layers, bos_token_id=50256, eos_token_id=50256)
    cfg._attn_implementation = "eager"
    ref = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.half().float())  # weights that fp16 holds exactly, on both sides
    hf = cfg.to_dict()
    hf["eos_token_id"] = -1  # exactly NEW tokens on our side too (the reference blocks eos by min_new_tokens)
    ours = gpt2_from_state(hf, ref.state_dict()).eval()
    packed = pack_linears(ours)
    prompt = torch.randint(0, cfg.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(1))

    def run_ours():
        return ours.generate(prompt[0].tolist(), max_new_tokens=NEW)

    def run_ref():
        with torch.no_grad():
            return ref.generate(prompt, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, use_cache=True,
                                output_attentions=True, return_dict_in_generate=True, pad_token_id=50256)

    a, b = run_ours(), run_ref()  # warm-up, and the comparison
    same_ids = a.ids == b.sequences[0].tolist()
    diff = 0.0
    mine = a.attention["decoder"].weights  # (L, H, T, T)
    for step, layers in enumerate(b.attentions):  # step 0: the prompt (PROMPT queries); then one query each
        for layer, w in enumerate(layers):
            q = w.shape[2]
            rows = slice(0, PROMPT) if step == 0 else slice(PROMPT + step - 1, PROMPT + step)
            s = w.shape[3]
            assert q == rows.stop - rows.start
            diff = max(diff, float((torch.from_numpy(mine[layer, :, rows, :s]) - w[0]).abs().max()))
    times: dict[str, list[float]] = {"ours": [], "reference": []}
    for _ in range(args.repeats):
        for name, fn in (("ours", run_ours), ("reference", run_ref)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    ours_s, ref_s = statistics.median(times["ours"]), statistics.median(times["reference"])
    report = {"speedup": round(ref_s / ours_s, 2), "ours_s": round(ours_s, 3), "reference_s": round(ref_s, 3),
              "identical": bool(same_ids and diff < 1e-4), "same_ids": same_ids, "max_attention_diff": diff,
              "new_tokens": len(a.steps), "prompt_tokens": PROMPT, "layers": args.layers, "packed_layers": packed,
              "parameters": sum(p.numel() for p in ref.parameters()), "repeats": args.repeats,
              "threads": torch.get_num_threads(), **machine_info()}
    print(f"ours {ours_s:.3f} s, transformers {ref_s:.3f} s: ×{ref_s / ours_s:.2f}; same ids {same_ids}, "
          f"attention within {diff:.1e}", file=sys.stderr)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
