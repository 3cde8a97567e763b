"""Every analysis on the CPU and on a device, and an 8 B model on one GPU beside transformers, in one call (issue 52).

    python bench/device.py [--device cuda] [--quick] [--checkpoints DIR] [--only gen8b] [--out FILE]

1. ``shipped``: each model under ``--checkpoints`` (default checkpoints/) loaded twice, once on the CPU and once
   on the device (float32 both), every analysis of ``bench/_analyses.py`` run on each (classify / translate /
   generate attention, the score split, patching, sink ablation, attribution incl. integrated gradients, the
   logit lens, head roles, batched generation), and per model the largest |CPU − device| over all of them
   (``agree``: ≤ 1e-4). A MiniLM folder that is not there (the device check's copy of the repository leaves
   them out) is replaced by a random MiniLM of the same shape (``random_weights``: true).
2. ``big``: a LLaMA-3-8B shape (d_model 4096, 32 layers, 32 heads, 8 key/value heads, d_ff 14336, vocab 128256,
   RoPE θ 500000; ``--quick``: a tiny one), random weights written by transformers' ``LlamaForCausalLM`` in
   bfloat16 on the device and shared with ours (``models.io.hf.llama_from_state(keep=True)``: no copy, so one
   model's weights are resident at a time). 30 new tokens with attention after 512 and 4,096 prompt tokens:
   transformers' ``generate(output_attentions=True, return_dict_in_generate=True)`` (eager attention, its KV
   cache) against ``models.decoding.ondevice.generate`` (attention kept on the device as queries, keys and log-sum-exps,
   the pooled tiles computed there; the time includes them), each after one warm-up, each one's peak device
   memory from ``torch.cuda.reset_peak_memory_stats`` before it (weights included). ``same_next_token``: the share
   of the 30 positions where our model, fed transformers' sequence, picks transformers' next token (bfloat16
   rounds differently on the two sides). ``fp32``: greedy ids of both in float32 on a shallower model of the
   same widths (``--fp32-layers``, 4), ``identical`` when every id agrees, and the attention difference. A
   40-token head-patching sweep and one score split, timed, on the bfloat16 model.
3. ``accelerate``: a small GPT saved as a checkpoint and loaded by ``models.io.bigmodel.load_gpt`` across the device,
   the CPU and disk offload (the CPU and disk with ``--device cpu``), against the undivided model: logits,
   attention, the score split, a patching sweep (``agree``: ≤ 1e-5; patching ≤ 1e-4).

Last stdout line: one JSON object with those sections, ``ok`` (every agreement check holds) and ``targets``
(issue 52's speed and memory goals: met or not; never asserted). Imports no gradio; transformers only here.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# the 8 B shape's 4,096-token prompt must not be cut to the app's default context cap (models.limits, 2,048)
os.environ.setdefault("ATLAS_MAX_TOKENS", "8192")

from bench._analyses import max_abs_diff, run_all  # noqa: E402

AGREE = 1e-4  # CPU vs device, float32, every analysis
SPLIT_AGREE = 1e-5  # accelerate split vs the undivided model
NEW = 30
PROMPTS_QUICK = (24, 96)
LLAMA_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                intermediate_size=14336, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192)
LLAMA_TINY = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=512, rope_theta=500000.0, max_position_embeddings=256)


def log(*a: Any) -> None:
    print(*a, file=sys.stderr, flush=True)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def reset_peak(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)


def peak_gb(dev: torch.device) -> float | None:
    return round(torch.cuda.max_memory_allocated(dev) / 1e9, 2) if dev.type == "cuda" else None


def timed(dev: torch.device, fn: Callable[[], Any]) -> tuple[Any, float]:
    sync(dev)
    t0 = time.perf_counter()
    out = fn()
    sync(dev)
    return out, time.perf_counter() - t0


# ------------------------------------------------------------------------------------------ 1. shipped models
def _random_minilm(name: str, folder: Path) -> Path:
    """A MiniLM-shaped BertClassifier (models.families.bert.BertConfig's defaults are MiniLM-L6-H384's) with random
    weights and the tests' small WordPiece tokenizer, in the checkpoint format."""
    from models.families.bert import BertClassifier, BertConfig
    from models.io.checkpoint import save_checkpoint
    from tests.tiny import tiny_wordpiece

    labels = ["negative", "positive"] if name.endswith("sst2") else ["World", "Sports", "Business", "Sci/Tech"]
    torch.manual_seed(0)
    model = BertClassifier(BertConfig(n_classes=len(labels), origin="random weights (bench/device.py)"))
    tok = tiny_wordpiece(folder / f"_{name}_tok")
    return save_checkpoint(folder / name, model, labels=labels, text={"lowercase": True},
                           extra_files={"tokenizer.json": tok})


def shipped(checkpoints: Path, dev: torch.device, scratch: Path) -> dict[str, Any]:
    import models
    from models.io.placement import place

    names = sorted(p.name for p in checkpoints.iterdir() if p.is_dir() and not p.name.startswith("_"))
    for name in ("minilm-sst2", "minilm-agnews"):
        if name not in names and checkpoints.resolve() == (ROOT / "checkpoints").resolve():
            names.append(name)
    out: dict[str, Any] = {}
    for name in names:
        folder = checkpoints / name
        entry: dict[str, Any] = {}
        if not (folder / "config.json").is_file() and name.startswith("minilm-"):
            folder = _random_minilm(name, scratch)
            entry["random_weights"] = True
        try:
            cpu_model = models.load(folder)
            (ref, cpu_s) = timed(torch.device("cpu"), lambda m=cpu_model: run_all(m))
            del cpu_model
            dev_model = place(models.load(folder), dev, torch.float32)
            (got, dev_s) = timed(dev, lambda m=dev_model: run_all(m))
            del dev_model
            diffs = max_abs_diff(ref, got)
            worst = max(diffs, key=diffs.get)
            entry.update(analyses=len(diffs), max_abs_diff=diffs[worst], worst=worst,
                         agree=bool(diffs[worst] <= AGREE), cpu_s=round(cpu_s, 2), device_s=round(dev_s, 2),
                         diffs={k: float(f"{v:.2e}") for k, v in diffs.items()})
        except Exception as err:  # recorded, and ok becomes false
            entry.update(agree=False, error=f"{type(err).__name__}: {err}")
            log(traceback.format_exc())
        log(name, {k: v for k, v in entry.items() if k != "diffs"})
        out[name] = entry
    return out


# ------------------------------------------------------------------------------------------------ 2. 8 B shape
def _hf_llama(shape: dict, dtype: torch.dtype, dev: torch.device, layers: int | None = None):
    from transformers import LlamaConfig, LlamaForCausalLM

    # no end-of-sequence token: exactly NEW tokens on both sides (min_new_tokens would forbid one only there)
    cfg = LlamaConfig(**{**shape, **({"num_hidden_layers": layers} if layers else {})}, bos_token_id=1,
                      eos_token_id=None, tie_word_embeddings=False)
    cfg._attn_implementation = "eager"  # output_attentions needs the explicit softmax
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with dev:
            model = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(old)
    return cfg, model


def _ours(cfg, hf_model):
    from models.io.hf import llama_from_state

    ours = llama_from_state(cfg.to_dict(), hf_model.state_dict(), keep=True).eval()
    ours.config.eos_id = -1  # exactly NEW tokens, as transformers without an end-of-sequence token
    return ours


def _hf_generate(model, ids: list[int], dev: torch.device, new: int = NEW, attentions: bool = True):
    with torch.no_grad():
        return model.generate(torch.tensor([ids], device=dev), max_new_tokens=new, do_sample=False, use_cache=True,
                              output_attentions=attentions, return_dict_in_generate=True, pad_token_id=0)


def _teacher_forced(ours, seq: list[int], prompt: int) -> list[int]:
    """Our greedy next token at each generated position of ``seq`` (transformers' sequence), from the on-device
    path's own prompt pass over the whole sequence."""
    from models.decoding.ondevice import _Run

    with torch.inference_mode():
        run = _Run(ours, len(seq))
        x = run.layers(torch.tensor(seq, device=ours.embed.weight.device), 0)
        return run.logits(x[prompt - 1 : len(seq) - 1]).float().argmax(-1).tolist()


def figure_parts(dev: torch.device, att) -> dict[str, float]:
    """Milliseconds for what the Generate tab asks of a map kept on the device (tabs.common.attention_figure), each
    part moved to the CPU: the last layer's mean-of-heads heatmap (≤ 512 × 512 max-pooled tiles above 512 tokens),
    the head view of its head 0 (lines ≥ max(0.05, 2/T), the strongest 20,000), a 64 × 64 zoom, and a replayed
    step's model-view tiles (every layer and head over T − 1 tokens, at viz.attention.model_view_cells)."""
    layers, heads, t, _ = att.shape
    last = layers - 1
    cells = min(64, max(8, int((1_000_000 / (layers * heads)) ** 0.5)))
    parts = {
        "heatmap_mean": lambda: att.tiles(last, "mean", 512, "max") if t > 512 else att.fused(last, "mean"),
        "head_view": lambda: att.lines(last, [0], max(0.05, 2.0 / t), 20000),
        "zoom_64": lambda: att.fused(last, 0, (max(0, t - 64), t), (max(0, t - 64), t)),
        "replay_model_view": lambda: [att.upto(t - 1).tiles(i, None, cells, "max") for i in range(layers)],
    }
    parts["heatmap_mean"]()  # warm-up
    return {name: round(timed(dev, fn)[1] * 1e3, 1) for name, fn in parts.items()}


def big(dev: torch.device, quick: bool, fp32_layers: int, gen_only: bool = False) -> dict[str, Any]:
    from models.decoding import ondevice
    from models.inspect.decompose import decompose_score
    from models.inspect.patching import patch_sweep, repeated_pair

    shape = LLAMA_TINY if quick else LLAMA_8B
    prompts = PROMPTS_QUICK if quick else (512, 4096)
    gen = torch.Generator().manual_seed(1)
    out: dict[str, Any] = {"shape": {k: v for k, v in shape.items()}, "dtype": "bfloat16", "new_tokens": NEW}
    cfg, hf = _hf_llama(shape, torch.bfloat16, dev)
    out["parameters_b"] = round(sum(p.numel() for p in hf.parameters()) / 1e9, 3)
    ids = {p: torch.randint(3, shape["vocab_size"], (p,), generator=gen).tolist() for p in prompts}
    warm = ids[prompts[0]][: prompts[0] // 2]  # warm-up prompt (both sides): half the shorter prompt, 2 tokens
    _hf_generate(hf, warm, dev, new=2)
    runs: dict[int, dict[str, Any]] = {p: {} for p in prompts}
    hf_seqs = {}
    for p in prompts:
        reset_peak(dev)
        res, secs = timed(dev, lambda p=p: _hf_generate(hf, ids[p], dev))
        runs[p]["transformers_s"], runs[p]["transformers_peak_gb"] = round(secs, 3), peak_gb(dev)
        hf_seqs[p] = res.sequences[0].tolist()
        del res
        log(f"transformers, prompt {p}: {secs:.2f} s, peak {runs[p]['transformers_peak_gb']} GB")
    ours = _ours(cfg, hf)
    hf = None  # our model holds the same tensors: the weights stay resident once
    ondevice.generate(ours, warm, 2)
    for p in prompts:
        reset_peak(dev)
        r = runs[p]
        res, secs = timed(dev, lambda p=p: ondevice.generate(ours, ids[p], NEW))
        if res.prompt_len != p or len(res.ids) != p + NEW:
            raise RuntimeError(f"the {p}-token prompt was cut to {res.prompt_len} ({res.notice})")
        r["ours_s"], r["ours_peak_gb"] = round(secs, 3), peak_gb(dev)
        r["ours_ms"] = getattr(res, "timings", None)  # prompt pass, prompt logits, decoding, tiles (CUDA events)
        r["half_scores"] = getattr(ondevice, "_HALF_SCORES", [])[:1] or None
        r["speedup"] = round(r["transformers_s"] / secs, 2)
        if r["ours_peak_gb"]:
            r["peak_ratio"] = round(r["ours_peak_gb"] / r["transformers_peak_gb"], 3)
        r["decoding"] = res.decoding
        r["same_ids"] = res.ids == hf_seqs[p]
        forced = _teacher_forced(ours, hf_seqs[p], p)
        r["same_next_token"] = round(float(np.mean([a == b for a, b in zip(forced, hf_seqs[p][p:])])), 3)
        r["kept_on_device_mb"] = round(res.attention.nbytes() / 1e6, 1)
        r["pooled_mb"] = round(sum(a.nbytes for a in res.attention.pooled.values()) / 1e6, 2)
        if hasattr(res.attention, "tiles"):  # (an older module, for "before", has none)
            r["figures_ms"] = figure_parts(dev, res.attention)
        del res
        if r["decoding"] != "pass":  # beside it: the new tokens through the growing-shape pass, no graph
            reset_peak(dev)
            res, secs = timed(dev, lambda p=p: ondevice.generate(ours, ids[p], NEW, steps="pass"))
            r["ours_pass_s"], r["ours_pass_peak_gb"] = round(secs, 3), peak_gb(dev)
            del res
        log(f"ours, prompt {p}: {secs:.2f} s, peak {r['ours_peak_gb']} GB; same ids {r['same_ids']}, "
            f"same next token {r['same_next_token']}; {r}")
    out["generate"] = {str(p): r for p, r in runs.items()}

    if gen_only:  # --only gen8b: the generation and the float32 check, no patching or score split
        ours = None
        reset_peak(dev)
        out["fp32"] = _fp32_check(shape, dev, fp32_layers, ids[prompts[0]])
        return out
    clean, corrupted = repeated_pair(ours, 20)  # 40 tokens
    reset_peak(dev)
    try:
        res, secs = timed(dev, lambda: patch_sweep(ours, clean, corrupted, "heads"))
        out["patching"] = {"tokens": len(clean), "s": round(secs, 3), "peak_gb": peak_gb(dev),
                           "finite": bool(np.isfinite(res.restored).all()), "shape": list(res.restored.shape)}
    except ValueError as err:  # the two inputs answer alike on these random weights
        out["patching"] = {"tokens": len(clean), "error": str(err)}
    log("patching", out["patching"])
    layer = ours.config.n_layers - 1
    split, secs = timed(dev, lambda: decompose_score(ours, clean, layer, 0, len(clean) - 1, 1))
    rel = abs(split.table.sum() - split.score) / max(abs(split.score), 1e-12)
    out["split"] = {"s": round(secs, 3), "parts": len(split.parts), "sum_rel_err": float(rel),
                    "agree": bool(rel <= 1e-3)}
    log("split", out["split"])
    ours = split = None
    reset_peak(dev)

    out["fp32"] = _fp32_check(shape, dev, fp32_layers, ids[prompts[0]])
    return out


def _fp32_check(shape: dict, dev: torch.device, fp32_layers: int, prompt_ids: list[int]) -> dict[str, Any]:
    """float32: greedy ids against transformers on a shallower model of the same widths, and the attention."""
    from models.decoding import ondevice

    cfg32, hf32 = _hf_llama(shape, torch.float32, dev, layers=fp32_layers)
    p = len(prompt_ids)
    ref = _hf_generate(hf32, prompt_ids, dev)
    ours32 = _ours(cfg32, hf32)
    del hf32
    mine = ondevice.generate(ours32, prompt_ids, NEW, pool=False)  # CUDA: the new tokens replayed as a CUDA graph
    plain = ours32.generate(prompt_ids, NEW)
    diff = 0.0
    for step, layers in enumerate(ref.attentions):  # step 0: the prompt's rows; then one row each
        for i, w in enumerate(layers):
            rows = slice(0, p) if step == 0 else slice(p + step - 1, p + step)
            got = torch.from_numpy(mine.attention.block(i, rows, slice(0, w.shape[-1])))
            diff = max(diff, float((got - w[0].float().cpu()).abs().max()))
    seq = ref.sequences[0].tolist()
    res = {"layers": fp32_layers, "prompt": p, "decoding": mine.decoding, "identical": mine.ids == seq,
           "plain_identical": plain.ids == seq, "max_attention_diff": diff,
           "agree": bool(mine.ids == seq and diff <= AGREE)}
    log("fp32", res)
    del ours32, ref, mine, plain
    reset_peak(dev)
    return res


# ------------------------------------------------------------------------------------------- 3. accelerate split
def split(dev: torch.device, scratch: Path) -> dict[str, Any]:
    from models.families.gpt import GPT, GPTConfig
    from models.inspect.decompose import decompose_score
    from models.inspect.patching import patch_sweep, repeated_pair
    from models.io.bigmodel import load_gpt
    from models.io.checkpoint import load_checkpoint, save_checkpoint

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=256, max_len=128, d_model=64, n_layers=6, n_heads=4, n_kv_heads=2, qkv_bias=True,
                    tie_embeddings=False)
    save_checkpoint(scratch / "split-gpt", GPT(cfg), labels=[], text={})
    _, state = load_checkpoint(scratch / "split-gpt")
    whole = GPT(cfg).eval()
    whole.load_state_dict({k: v.float() for k, v in state.items()})
    whole.to(dev)
    first = str(dev) if dev.type != "cpu" else "cpu"
    devices = [first, "cpu", "disk"]
    device_map = {"embed": first, **{f"blocks.{i}": devices[i % 3] for i in range(cfg.n_layers)}, "norm": "cpu",
                  "lm_head": "disk"}
    model = load_gpt(scratch / "split-gpt", device_map, scratch / "offload")
    ids = list(range(3, 40))
    out: dict[str, Any] = {"device_map": device_map}
    with torch.no_grad():
        x = torch.tensor([ids], device=dev)
        a, b = whole(x, need_weights=True), model(x, need_weights=True)
    out["logits"] = float((a.logits - b.logits.to(dev)).abs().max())
    out["attention"] = max(float((u - v.to(dev)).abs().max()) for u, v in zip(a.attention, b.attention))
    s, t = decompose_score(whole, ids, 5, 1, 30, 4), decompose_score(model, ids, 5, 1, 30, 4)
    out["split"] = float(np.abs(s.table - t.table).max())
    clean, corrupted = repeated_pair(whole, 8)
    out["patching"] = float(np.abs(patch_sweep(whole, clean, corrupted).restored -
                                   patch_sweep(model, clean, corrupted).restored).max())
    out["agree"] = bool(max(out["logits"], out["attention"], out["split"]) <= SPLIT_AGREE and out["patching"] <= AGREE)
    log("accelerate split", out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (the test's CPU run)")
    ap.add_argument("--checkpoints", type=Path, default=ROOT / "checkpoints")
    ap.add_argument("--fp32-layers", type=int, default=4)
    ap.add_argument("--skip", default="", help="comma-separated sections to leave out: shipped, big, accelerate")
    ap.add_argument("--only", default="", choices=["", "gen8b"],
                    help="gen8b: only the 8 B generation beside transformers and the float32 check (no other section)")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if args.only == "gen8b":
        skip |= {"accelerate", "shipped"}
    report: dict[str, Any] = {"device": str(dev), "quick": args.quick, "torch": torch.__version__}
    if dev.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(dev)
    checks: list[bool] = []
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for name, fn in (("accelerate", lambda: split(dev, scratch)),
                         ("shipped", lambda: shipped(args.checkpoints, dev, scratch)),
                         ("big", lambda: big(dev, args.quick, args.fp32_layers, args.only == "gen8b"))):
            if name in skip:
                continue
            t0 = time.perf_counter()
            try:
                report[name] = fn()
            except Exception as err:
                log(traceback.format_exc())
                report[name] = {"error": f"{type(err).__name__}: {err}"}
            report[f"{name}_wall_s"] = round(time.perf_counter() - t0, 1)
            if args.out:  # what is done so far, should a later section run out of time
                args.out.write_text(json.dumps(report, indent=1))
    if "shipped" in report:
        checks += [m.get("agree", False) for m in report["shipped"].values()] if "error" not in report["shipped"] \
            else [False]
    if "accelerate" in report:
        checks.append(bool(report["accelerate"].get("agree")))
    b = report.get("big")
    targets = {}
    if b is not None:
        checks.append(bool(b.get("fp32", {}).get("agree")))
        if args.only != "gen8b":
            checks.append(bool(b.get("split", {}).get("agree")))
        for p, r in b.get("generate", {}).items():
            targets[f"faster_than_transformers_{p}"] = r["speedup"] >= 1.0
            if r.get("peak_ratio") is not None:
                targets[f"half_peak_memory_{p}"] = r["peak_ratio"] <= 0.5
        if "s" in b.get("patching", {}):
            targets["patching_40_tokens_le_10s"] = b["patching"]["s"] <= 10.0
    report["targets"] = targets
    report["ok"] = bool(checks) and all(checks)
    with contextlib.suppress(Exception):
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
