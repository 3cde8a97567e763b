"""Server-side cost of each app action, in process: the handler (model + figures) and the JSON
Gradio then makes of its figures, with the app's unvalidated figure build against plotly's validated build
of the same figures, side by side in one run.

The app builds every figure as plain dicts (viz.common.Fig) and skips plotly's property validation, which
gives the same JSON (tests/test_viz_build.py); this measures what that saves per request. Handlers get the
same inputs as bench/latency.py's actions (image files as paths), over the repository's checkpoints
(or ``--checkpoints``).

Run: ``python bench/figures.py [--repeats 15] [--actions translate,classify]``. The last stdout line is one
JSON object: per action ``<action>_handler_ms`` (p50, fast build), ``<action>_validated_ms`` (p50, validated
build), ``<action>_json_ms`` (p50 of ``fig.to_json()`` over the action's figures) and ``<action>_ratio``
(validated / fast).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._server import AGNEWS, EXAMPLES, PROMPT, SENTENCE_20, SST2, machine_info, percentile, rounded  # noqa: E402


def handler_calls() -> dict[str, Any]:
    from tabs.classify import classify
    from tabs.generate import generate, head_roles
    from tabs.playground import playground
    from tabs.positional import positional_encoding
    from tabs.swin import swin_windows
    from tabs.translate import translate
    from tabs.vision import classify_image

    return {
        "translate": lambda: translate(SENTENCE_20, 5),
        "classify_sst2": lambda: classify(SST2, "SST-2 sentiment"),
        "classify_agnews": lambda: classify(AGNEWS, "AG News topic"),
        "classify_image_vit_fashion": lambda: classify_image(str(EXAMPLES[9 % len(EXAMPLES)]), "vit-fashion"),
        "classify_image_swin_fashion": lambda: classify_image(str(EXAMPLES[7 % len(EXAMPLES)]), "swin-fashion"),
        "swin_windows": lambda: swin_windows(8, 4, 2, 3),
        "positional_encoding": lambda: positional_encoding(64, 128),
        "playground": lambda: playground(6, 8, 0, "causal", True),
        "generate": lambda: generate(PROMPT, 20),
        "head_roles": lambda: head_roles("gpt-tiny", 50, 0),
    }


def _ms(f: Any, repeats: int) -> tuple[float, Any]:
    out, times = f(), []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t0)
    return percentile(times, 50) * 1000, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoints", type=Path, default=ROOT / "checkpoints")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--actions", default=None, help="comma-separated subset (prefix match)")
    args = ap.parse_args(argv)
    os.environ["ATLAS_CHECKPOINTS"] = str(args.checkpoints)
    from viz import common

    calls = handler_calls()  # the tab handlers, serving through the app's model store
    if args.actions:
        wanted = [a.strip() for a in args.actions.split(",")]
        calls = {k: v for k, v in calls.items() if any(k.startswith(w) for w in wanted)}
    report: dict[str, Any] = {"machine": machine_info(), "repeats": args.repeats}
    for name, call in calls.items():
        try:
            common.VALIDATE = False
            fast, out = _ms(call, args.repeats)
            common.VALIDATE = True
            checked, _ = _ms(call, args.repeats)
        except Exception as err:  # a missing checkpoint is reported, the other actions still run
            report[f"{name}_error"] = f"{type(err).__name__}: {err}"[:200]
            continue
        finally:
            common.VALIDATE = False
        figs = [o for o in (out if isinstance(out, tuple) else (out,)) if hasattr(o, "to_json")]
        json_ms, _ = _ms(lambda figs=figs: [f.to_json() for f in figs], args.repeats)
        report.update({f"{name}_handler_ms": rounded(fast, 1), f"{name}_validated_ms": rounded(checked, 1),
                       f"{name}_json_ms": rounded(json_ms, 1), f"{name}_ratio": rounded(checked / fast, 2),
                       f"{name}_figures": len(figs)})
        print(f"{name:30s} handler {fast:7.1f} ms  (validated figures {checked:7.1f} ms, ×{checked / fast:.2f})  "
              f"to_json {json_ms:6.1f} ms over {len(figs)} figures", file=sys.stderr)
    try:
        report["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
