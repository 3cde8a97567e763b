"""CPU time of the main actions' handlers, called in-process (no server, no HTTP), for this checkout and, with
``--against DIR``, another checkout of the app, in turns (ABAB: one fresh process per arm and turn).

On a shared machine wall-clock latency (bench/latency.py) moves with the other jobs; the CPU seconds a handler spends
(``time.process_time``, every thread of the process, one torch thread) move much less, so this is the check that a
change did not make the code paths themselves dearer. Actions: classify_image (vit-fashion, an example image),
classify (sst2), translate (20 words, beam 5), generate (gpt-tiny, 20 new tokens), head_roles (gpt-tiny, N = 50).
Each: 2 warm-up calls, then ``--repeats`` timed calls; the median per arm and turn, then the median over turns.

Run: ``python bench/handler_cpu.py [--against ../before] [--turns 3] [--repeats 15]``. The last line is one JSON
object: ``{"after": {action: ms}, "before": {...}, "ratio": {action: after / before}}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time
sys.path.insert(0, '.')
import torch
torch.set_num_threads(1)
from tabs import classify, generate, translate, vision
from tabs.common import EXAMPLE_IMAGES
image = str(EXAMPLE_IMAGES[0])
actions = {
    "classify_image": lambda: vision.classify_image(image, "vit-fashion"),
    "classify": lambda: classify.classify("a warm , funny and deeply moving film .", "SST-2 sentiment"),
    "translate": lambda: translate.translate("A man in a blue shirt is riding a bicycle down a busy street while "
                                             "two children watch from the side of the road .", 5),
    "generate": lambda: generate.generate("The cat sat on the", 20, progress=None),
    "head_roles": lambda: generate.head_roles("gpt-tiny", 50, 0, progress=None),
}
out = {}
for name, call in actions.items():
    call(); call()
    times = []
    for _ in range(REPEATS):
        t0 = time.process_time(); call(); times.append(time.process_time() - t0)
    times.sort()
    out[name] = times[len(times) // 2] * 1000
print(json.dumps(out))
"""


def run(root: Path, repeats: int) -> dict[str, float]:
    env = {"ATLAS_BATCH": "0", "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False",
           "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    done = subprocess.run([sys.executable, "-c", CHILD.replace("REPEATS", str(repeats))], cwd=root, env=env,
                          capture_output=True, text=True, check=True, timeout=1200)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", type=Path, default=None, help="another checkout: the 'before' arm")
    ap.add_argument("--turns", type=int, default=3, help="fresh processes per arm, taken in turns")
    ap.add_argument("--repeats", type=int, default=15, help="timed calls per action and process")
    args = ap.parse_args(argv)
    arms = {"after": ROOT} | ({"before": args.against.resolve()} if args.against else {})
    got: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
    for turn in range(args.turns):
        for arm in (list(arms) if turn % 2 == 0 else list(arms)[::-1]):
            got[arm].append(run(arms[arm], args.repeats))
            print(f"turn {turn} {arm}: {json.dumps({k: round(v, 1) for k, v in got[arm][-1].items()})}",
                  file=sys.stderr)
    report: dict[str, dict[str, float]] = {arm: {k: round(statistics.median(r[k] for r in runs), 2)
                                                 for k in runs[0]} for arm, runs in got.items()}
    if "before" in report:
        report["ratio"] = {k: round(report["after"][k] / report["before"][k], 3) for k in report["after"]}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
