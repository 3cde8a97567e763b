"""RWKV-4's generation with its implicit attention at rwkv-4-169m-pile's shape (12 layers, d = 768, vocabulary 50,277;
random weights): a prompt and 6 new tokens, MAX_TOKENS in all, the wall time of ``Rwkv.generate`` (the WKV recurrence
over the prompt, the recurrent steps, then every layer's α averaged over all 768 channels); then the maps alone
(``Rwkv.implicit_attention``) over ``--map-tokens`` ids, which may be more than MAX_TOKENS (the cost of a longer cap).

    python bench/rwkv_map.py [--map-tokens 256]

Last stdout line: one JSON object with ``seconds`` (generate), ``map_seconds``, the shapes and the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._server import machine_info  # noqa: E402


def main() -> int:
    from models.families.rwkv import MAX_TOKENS, Rwkv, RwkvConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--map-tokens", type=int, default=2 * MAX_TOKENS, help="ids of the maps-alone measurement")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Rwkv(RwkvConfig()).eval()
    ids = torch.randint(3, 50_000, (MAX_TOKENS - 6,)).tolist()
    t0 = time.perf_counter()
    result = model.generate(ids, max_new_tokens=6)
    seconds = time.perf_counter() - t0
    long = torch.randint(3, 50_000, (max(2, args.map_tokens),)).tolist()
    t0 = time.perf_counter()
    maps = model.implicit_attention(long)
    map_seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": round(seconds, 2), "map": list(result.attention["decoder"].weights.shape),
                      "map_seconds": round(map_seconds, 2), "map_tokens": len(long), "long_map": list(maps.shape),
                      "threads": torch.get_num_threads(), **machine_info()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
