"""The app's nnsight traces (models/io/nnsight_backend.py) run three ways, by hand (bench/ndif_smoke.sh step 5):
``remote=False`` (here), ``remote="local"`` (nnsight serialises the request as for NDIF and rebuilds it here with the
project's modules hidden: no server) and, with ``--remote``, ``remote=True`` against NDIF_HOST (a self-hosted ndif,
or the public cluster with NDIF_API_KEY) for ``--model`` (a Hub id the server can load).

    python bench/ndif_trace.py                                    # random GPT-2 and LLaMA folders, no server
    NDIF_HOST=http://localhost:8001 python bench/ndif_trace.py --remote --model openai-community/gpt2
    NDIF_API_KEY=… python bench/ndif_trace.py --remote --model meta-llama/Llama-3.1-70B

Per run: ``seconds``, ``bytes_back`` and ``identical`` (every tile, statistic and row equal to ``remote=False``'s,
where the model also loads here). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _same(a, b) -> bool:
    import numpy as np

    return (all(np.array_equal(a.tiles[h][i], b.tiles[h][i]) for h in a.tiles for i in a.tiles[h])
            and all(np.array_equal(a.stats[k], b.stats[k]) for k in a.stats)
            and all(np.array_equal(a.rows[k], b.rows[k]) for k in a.rows))


def run(lm, ids: list[int], how) -> dict:
    from models.io import nnsight_backend as nb

    v = nb.trace_views(lm, ids, rows=[(0, 0, len(ids) - 1)], lens_last=16, remote=how)
    return {"views": v, "seconds": round(v.seconds, 3), "bytes_back": v.bytes_back, "where": v.where}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--remote", action="store_true", help="also remote=True against NDIF_HOST")
    ap.add_argument("--model", default="openai-community/gpt2", help="the Hub id traced with --remote")
    args = ap.parse_args()
    from models.io import nnsight_backend as nb
    from tests import tiny

    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, write in (("gpt2", lambda f: tiny.tiny_gpt2_folder(f, std=0.1)), ("llama", tiny.tiny_llama_folder)):
            folder = Path(tmp) / name
            write(folder)
            lm = nb.open_model(folder)
            ids = list(range(3, 40))
            here, shipped = run(lm, ids, False), run(lm, ids, "local")
            out[name] = {"remote=False": {k: v for k, v in here.items() if k != "views"},
                         "remote='local'": {k: v for k, v in shipped.items() if k != "views"},
                         "identical": _same(here["views"], shipped["views"])}
    if args.remote:
        host = os.environ.get("NDIF_HOST", "https://api.ndif.us")
        entry: dict = {"model": args.model, "host": host}
        try:
            lm = nb.open_model(args.model, remote=True)
            ids = [int(i) for i in lm.tokenizer("The Eiffel Tower is in the city of Paris, and")["input_ids"]]
            far = run(lm, ids, True)
            entry.update({k: v for k, v in far.items() if k != "views"})
            try:
                here = run(nb.open_model(args.model), ids, False)
                entry["identical_to_remote_false"] = _same(far["views"], here["views"])
            except Exception as err:  # the weights are not here (offline): remote numbers alone
                entry["local_comparison"] = f"not run: {type(err).__name__}: {str(err)[:200]}"
        except Exception as err:
            entry["error"] = f"{type(err).__name__}: {str(err)[:400]}"
        out["remote=True"] = entry
    for key, row in out.items():
        print(key, json.dumps(row))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
