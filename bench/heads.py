"""The head atlas of one model over its built-in corpus (or ``--corpus FILE``), as the Heads tab computes it:

    python bench/heads.py --model gpt-tiny                # a name the app shows (gpt-tiny, sst2, vit-fashion, ...)
    python bench/heads.py --model gpt-tiny --fresh        # ignore the cache (a temporary ATLAS_CACHE)
    python bench/heads.py --random-135m --fresh           # a random SmolLM2-135M-shaped LLaMA folder (runs/)

Names resolve as the app resolves them (``serving.heads.resolve``: the catalogue's names), so a model the catalogue
offers is accepted here as soon as it is offered. ``--random-135m`` writes (once, under runs/bench-heads/) a
Hugging Face LLaMA folder of SmolLM2-135M's shape with random weights (30 layers, 9 query and 3 key-value heads,
d = 576, 49,152 token ids; its tokenizer is trained on the repository's own text) and adds it as the server's
configuration would (``catalogue.configure``).

Per metric the best head is printed to stderr; the last stdout line is one JSON object: ``model``, ``layers``,
``heads``, ``metrics`` (name -> L × H nested list, null where a head has no value), ``seconds`` (the whole call:
loading the model when not cached, and the atlas), ``compute_seconds`` (the atlas itself, when computed),
``cpu_seconds`` (the process's CPU time over all threads in that call: the wall time depends on what else the
machine runs), ``cached``, ``best`` (name -> [layer, head, value]) and ``notes``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RANDOM_135M = ROOT / "runs" / "bench-heads" / "random-135m"


def random_135m(folder: Path) -> Path:
    """A random LLaMA folder of SmolLM2-135M's shape (config.json, model.safetensors, tokenizer.json), written once."""
    if (folder / "model.safetensors").is_file():
        return folder
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    from bench._long_model import corpus_files

    folder.mkdir(parents=True, exist_ok=True)
    tok = ByteLevelBPETokenizer()
    tok.train(corpus_files(), vocab_size=8000, special_tokens=["<|endoftext|>"], show_progress=False)
    tok.save(str(folder / "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048, rope_theta=100000.0,
                      bos_token_id=eot, eos_token_id=eot, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).eval().save_pretrained(folder, safe_serialization=True)
    return folder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a model name the app shows")
    ap.add_argument("--corpus", type=Path, help="a text file, one sentence a line (at most 2,000 lines)")
    ap.add_argument("--fresh", action="store_true", help="compute again: use an empty temporary cache")
    ap.add_argument("--random-135m", action="store_true", help="a random SmolLM2-135M-shaped decoder (see above)")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    if not args.model and not args.random_135m:
        ap.error("give --model NAME or --random-135m")
    if args.fresh:
        os.environ["ATLAS_CACHE"] = tempfile.mkdtemp(prefix="atlas-heads-bench-")
    from serving import catalogue
    from serving import heads as serving_heads
    from serving.errors import ServingError

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    name = args.model
    if args.random_135m:
        folder = random_135m(RANDOM_135M)
        catalogue.configure([str(folder)])
        name = folder.name
    text = None
    if args.corpus:
        try:
            text = args.corpus.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            print(f"cannot read the corpus {args.corpus}: {type(err).__name__}", file=sys.stderr)
            return 2
    start, cpu = time.perf_counter(), time.process_time()
    try:
        atlas, cached = serving_heads.atlas(name, text)
    except ServingError as err:
        print(str(err), file=sys.stderr)
        return 2
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    from models.inspect.heads import rank_heads

    report = atlas.summary()
    report["seconds"] = round(seconds, 3)
    report["compute_seconds"] = None if cached else round(atlas.seconds, 3)
    report["cpu_seconds"] = round(cpu, 3)  # every thread's CPU time: on a shared machine, beside the wall time
    report["cached"] = cached
    report["best"] = {}
    for metric, grid in atlas.metrics.items():
        layer, head, value = rank_heads(grid)[0]
        report["best"][metric] = [layer, head, round(value, 5)]
        print(f"{metric:>16}: best L{layer} H{head} = {value:.3f}", file=sys.stderr)
    report["notes"] = atlas.notes
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
