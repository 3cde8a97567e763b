"""Mamba's generation with its implicit attention at mamba-130m's shape (24 layers, d = 768, 1,536 channels, state 16;
random weights): a 122-token prompt and 6 new tokens, MAX_TOKENS in all, the wall time of ``Mamba.generate`` (the scan,
the recurrent steps, then every layer's α over MAP_CHANNELS channels).

    python bench/mamba_map.py

Last stdout line: one JSON object with ``seconds``, the map's shape and the machine.
"""

from __future__ import annotations

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
    from models.families.mamba import MAX_TOKENS, Mamba, MambaConfig

    torch.manual_seed(0)
    model = Mamba(MambaConfig()).eval()
    ids = torch.randint(3, 50_000, (MAX_TOKENS - 6,)).tolist()
    t0 = time.perf_counter()
    result = model.generate(ids, max_new_tokens=6)
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": round(seconds, 1), "map": list(result.attention["decoder"].weights.shape),
                      "threads": torch.get_num_threads(), **machine_info()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
