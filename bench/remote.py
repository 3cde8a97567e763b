"""What comes back from an nnsight trace (models/io/nnsight_backend.py, issue 73) per view, against the full attention
it replaces, and what the trace costs here.

    python bench/remote.py                       # computed for LLaMA-3-8B and 405B shapes; measured on a random
                                                 # LLaMA-shaped folder at 256 and 1,024 tokens
    python bench/remote.py --quick               # a tiny folder, 64 tokens (the test)
    python bench/remote.py --remote ID           # also trace Hub model ID on NDIF (NDIF_API_KEY; NDIF_HOST for a
                                                 # self-hosted server): remote time and the bytes received

``computed``: per shape and length, ``reply_bytes`` of each view (the pooled tiles, 64 cells a side, max and mean,
of every head of every layer or of one layer; the per-head statistics of every layer; one row; one layer's full map;
the head roles; the logit lens over the last 64 positions), the full (L, H, T, T) attention in float16 and the
long-context store's q, k and lse in bfloat16 (what shipping the store instead would cost), with the ratios of the
full attention to a reply (every layer's tiles, statistics, a row, the lens, the losses and last logits;
``_one_layer``: the same with one layer's tiles). The same function counts what a
measured run saved (``predicted_matches``: equal for every measured length), so the computed figures are the
measured ones' formula at other shapes.

``measured``: a random LLaMA-shaped model written by transformers (6 layers, 8 query heads over 2 key-value heads of
32, RoPE) read twice from the same folder: by the app's own path (``models.load`` + the long-context store,
``ondevice.prefill``, then every layer's tiles, the statistics and a row: ``app_s``) and by nnsight with
``remote=False`` (``trace_s``; ``trace_ratio`` = trace_s / app_s, the same run) and ``remote="local"`` (the request
serialised as for NDIF and rebuilt here: ``shipped_s``); ``bytes_back`` and ``max_diff`` (tiles against the store's).
Medians of ``--repeats`` runs. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SHAPES = {  # config.json fields of the published models (meta-llama/Llama-3.1-8B and -405B)
    "llama-3-8b": dict(model_type="llama", num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       hidden_size=4096, vocab_size=128256),
    "llama-3-405b": dict(model_type="llama", num_hidden_layers=126, num_attention_heads=128, num_key_value_heads=8,
                         hidden_size=16384, vocab_size=128256),
}
LENS_LAST = 64


def computed(lengths: list[int]) -> dict:
    from models.io import nnsight_backend as nb
    from models.io import nnsight_trace as nt

    out = {}
    for name, cfg in SHAPES.items():
        lay = nb.layout(cfg)
        for t in lengths:
            views = nb.reply_bytes(lay, t, rows=1, roles_n=0, lens_last=LENS_LAST)
            one_layer = nb.reply_bytes(lay, t, rows=1, lens_last=LENS_LAST, tile_layers=1)
            one_map = nb.reply_bytes(lay, min(t, nb.FULL_TOKENS), maps=1)["maps"]
            roles = nb.reply_bytes(lay, t, roles_n=2)["roles"]
            full = nt.full_bytes(lay.n_layers, lay.n_heads, t)
            store = lay.n_layers * t * ((lay.n_heads + lay.kv_heads) * lay.d_head * 2 + lay.n_heads * 4)
            out[f"{name}@{t}"] = {
                "full_attention_fp16_bytes": full, "store_qk_lse_bf16_bytes": store,
                "tiles_every_layer_bytes": views["tiles"], "tiles_one_layer_bytes": one_layer["tiles"],
                "stats_bytes": views["stats"], "row_bytes": views["rows"],
                "lens_bytes": views["lens"], "roles_bytes": roles,
                "one_layer_map_bytes": one_map if t <= nb.FULL_TOKENS else None,
                "reply_bytes": views["total"], "full_over_reply": round(full / views["total"], 1),
                "reply_one_layer_tiles_bytes": one_layer["total"],
                "full_over_reply_one_layer": round(full / one_layer["total"], 1)}
    return out


def _folder(root: Path, quick: bool) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.tiny_families import borrowed_tokenizer

    folder = root / "llama"
    borrowed_tokenizer(folder)
    if quick:
        cfg = LlamaConfig(vocab_size=300, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128)
    else:
        cfg = LlamaConfig(vocab_size=300, hidden_size=256, intermediate_size=512, num_hidden_layers=6,
                          num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048, rope_theta=5e5)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).eval().save_pretrained(folder)
    return folder


def _one_length(ours, lm, t: int, repeats: int) -> dict:
    import numpy as np
    import torch

    import models.decoding.ondevice as od
    from models.io import nnsight_backend as nb

    lay = nb.layout(lm.config)
    ids = [int(i) for i in torch.randint(3, 290, (t,), generator=torch.Generator().manual_seed(t))]

    def app() -> dict:
        att, _ = od.prefill(ours, ids)
        tiles = [att.tiles(i, None, nb.POOL_CELLS, "max")[0] for i in range(lay.n_layers)]
        att.row(0, 0, t - 1)
        return {"tiles": tiles, "stats": att.stats}

    def trace(remote: bool | str = False) -> nb.TracedViews:
        return nb.trace_views(lm, ids, rows=[(0, 0, t - 1)], lens_last=min(t, LENS_LAST), remote=remote)

    app(), trace()  # warm-up
    times: dict[str, list[float]] = {"app": [], "trace": [], "shipped": []}
    got: dict = {}
    for _ in range(repeats):
        for key, fn in (("app", app), ("trace", trace), ("shipped", lambda: trace("local"))):
            start = time.perf_counter()
            got[key] = fn()
            times[key].append(time.perf_counter() - start)
    v, want = got["trace"], got["app"]
    diff = max(float(np.abs(v.tiles["max"][i] - want["tiles"][i]).max()) for i in range(lay.n_layers))
    predicted = nb.reply_bytes(lay, t, rows=1, lens_last=min(t, LENS_LAST))["total"]
    med = {k: statistics.median(x) for k, x in times.items()}
    return {"app_s": round(med["app"], 4), "trace_s": round(med["trace"], 4), "shipped_s": round(med["shipped"], 4),
            "trace_ratio": round(med["trace"] / med["app"], 2), "bytes_back": v.bytes_back,
            "predicted_matches": predicted == v.bytes_back, "full_attention_fp16_bytes": v.full_bytes,
            "full_over_reply": round(v.full_bytes / v.bytes_back, 1), "max_diff": diff, "where": v.where}


def measured(lengths: list[int], repeats: int, quick: bool) -> dict:
    import models
    from models.io import nnsight_backend as nb

    with tempfile.TemporaryDirectory() as tmp:
        folder = _folder(Path(tmp), quick)
        ours, lm = models.load(str(folder)), nb.open_model(folder)
        lay = nb.layout(lm.config)
        return {f"llama-{lay.n_layers}x{lay.n_heads}@{t}": _one_length(ours, lm, t, repeats) for t in lengths}


def remote_run(repo: str, t: int) -> dict:
    from models.io import nnsight_backend as nb

    lm = nb.open_model(repo, remote=True)
    ids = lm.tokenizer("The attention of a large model, read where it runs. " * 200)["input_ids"][:t]
    start = time.perf_counter()
    v = nb.trace_views(lm, ids, rows=[(0, 0, len(ids) - 1)], lens_last=LENS_LAST, remote=True)
    return {"model": repo, "tokens": len(ids), "remote_s": round(time.perf_counter() - start, 3),
            "bytes_received": v.bytes_back, "where": v.where}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--lengths", default="256,1024", help="measured lengths")
    ap.add_argument("--shape-lengths", default="1024,4096,32768", help="computed lengths (8B and 405B shapes)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--remote", default="", help="a Hub id to trace on NDIF as well (NDIF_API_KEY)")
    args = ap.parse_args()
    lengths = [64] if args.quick else [int(x) for x in args.lengths.split(",")]
    result = {"computed": computed([int(x) for x in args.shape_lengths.split(",")]),
              "measured": measured(lengths, 1 if args.quick else args.repeats, args.quick)}
    if args.remote:
        result["remote"] = remote_run(args.remote, lengths[-1])
    for key, row in {**result["computed"], **result["measured"]}.items():
        print(key, json.dumps(row))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
