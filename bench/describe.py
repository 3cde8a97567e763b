"""The Image + text tab's latency and figure sizes (issue 63: the own VLM answers and draws in ≤ 1 s, no figure over
2 MB): the tab's handler, in process, on each example scene and question: the answer, the attention and relevance
maps, the text, the logit lens, the sinks and the tower's figures, and the .npz; then a replayed word and a patch of
the tower (redraws from the kept answer).

    python bench/describe.py [--model vlm-fashion] [--repeat 3]

Last stdout line: {"model", "runs", "answer_draw_p50_s", "answer_draw_max_s", "redraw_p50_s", "largest_figure_kb"}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="vlm-fashion")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    from tabs import describe as tab

    tab.describe(tab.EXAMPLE_SCENES[0], a.model, tab.PROMPTS[0], 24)  # the model loaded, Plotly warm
    full, redraw, largest = [], [], 0
    for _ in range(a.repeat):
        for scene in tab.EXAMPLE_SCENES:
            for prompt in tab.PROMPTS[:3]:
                t = time.perf_counter()
                out = tab.describe(scene, a.model, prompt, 24)
                full.append(time.perf_counter() - t)
                largest = max([largest] + [len(o.to_json()) for o in out if hasattr(o, "to_json")])
                t = time.perf_counter()
                tab.redraw_token(out[13], 1, "the word itself", 0, 0, "max")
                tab.redraw_tower(out[13], 0, "1,1")
                redraw.append(time.perf_counter() - t)
    print(json.dumps({"model": a.model, "runs": len(full), "answer_draw_p50_s": round(statistics.median(full), 4),
                      "answer_draw_max_s": round(max(full), 4), "redraw_p50_s": round(statistics.median(redraw), 4),
                      "largest_figure_kb": round(largest / 1024, 1)}))


if __name__ == "__main__":
    main()
